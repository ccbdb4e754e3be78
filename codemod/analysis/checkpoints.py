"""What a checkpoint save in a training loop writes, who uses the file after it, and what
stops it from being written in the background. The one place that answers it for
`torch.save(obj, f)` (and `with open(path, "wb") as f: torch.save(obj, f)`), for a
function of the file that training loops run, and for a checkpoint function of another
module of the project called in the loop.

`checkpoints(context)` (built once per file, FileContext.shared) answers:

- `training_loop(call)`: the outermost loop around `call` in its function, when it trains;
  `loop_sites(function)`: (training loop, calls from it down to `function`) for every way a
  function of the file runs, None unless each of its calls runs in a training loop;
- `plan(call, loop, helper, sites)`: a `Save` (the call, the statement to replace, the path
  written, the statements a flush must go before) for a save that may be written in the
  background; raises `Synchronous` with the true reason it may not (an argument the
  checkpointer does not take, a path that may be an open file, a whole module saved, a small
  checkpoint saved less than every step, a save guarded by `local_rank == 0`, a path named
  per rank, state sharded across ranks, a file used after the save), or `NotACheckpoint` for
  a save that writes no checkpoint file (an `io.BytesIO`) or has nothing to overlap with
  (`ends_after`: a `return` right after it, or the `break` that ends the loop, also a later
  `if last_step: break` on a test the save's test holds only when it holds: the same, a
  conjunct of it, or each disjunct but those certainly false, `Values.truth`);
- `later_use(path, statement, loop)`: a use of the saved file that may run before a
  background write of it is done (after the save, or anywhere in the loop: the next
  iteration); `plan` also counts a use in another function the loop runs (a callback's
  `torch.load(self.path)`, a method of the same class); `flush_points(path, statement,
  loop)`: when every such use comes after the save under an `if` the save is not under,
  the statements to flush before;
- for a project function called in the loop: `path_read_later(call)`,
  `wrapper_flush_points(call, loop)` and `background_problem(call, function)` (why it may
  not run in a background thread on a snapshot of its arguments, or None);
- `is_path(expr)`, `names_file(expr)`, `object_problem(obj)`, `is_accelerator(expr)`,
  `shards_state`, `rank_guard(statement)`, `every_step(call)`, `runs_in_training(call)`;
- `other_saver(call)`: why a saver that is not torch.save (safetensors, `save_pretrained`,
  `accelerator.save`) cannot be written by a background torch.save;
- `in_one_loop(saves)`: a background save to a path a synchronous save of the same loop
  writes stays synchronous;
- `wrapper_plan(call, function)`: the `Save` that runs a project checkpoint function in the
  background, or `Synchronous` with the reason it may not, or `NotACheckpoint` for the final
  save.

Which calls save and which libraries write their own formats are torch facts
(torch_facts: TORCH_SAVES, SAVE_FUNCTIONS, SAVE_METHODS, SHARDED_STATE, ...); what a
project function does to files is the project's answer (project.saver, file_effects).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import Assignment, GlobalScope

from codemod.analysis.bindings import argument_for
from codemod.analysis.distributed import per_node_guard
from codemod.analysis.names import kwarg, positional
from codemod.analysis.project import project_of
from codemod.analysis.sizes import HARDWARE, MIN_SAVE_BYTES, MIN_SAVE_S, save_seconds, shown, sizes_of
from codemod.analysis.torch_facts import (
    BUFFERS,
    CHECKPOINTERS,
    LOGGING_CALLS,
    LOGGING_METHODS,
    PATH_FUNCTIONS,
    PATH_METHODS,
    SAVE_FUNCTIONS,
    SAVE_METHODS,
    SHARDED_STATE,
    TORCH_SAVES,
)
from codemod.analysis.values import Kind, values

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "checkpoints"
MAX_LOGGING_DEPTH = 3  # functions of the file that hand a message on to another, followed

# Objects that the checkpointer would deep-copy whole (and on their device): a module,
# an optimizer or a loader is saved through its state_dict() instead.
DEEP_COPIED_KINDS = {
    Kind.MODULE: "module",
    Kind.OPTIMIZER: "optimizer",
    Kind.LOADER: "DataLoader",
    Kind.DATASET: "dataset",
}
# Names that say a value is a file path and not an open file.
MAX_PATH_DEPTH = 6  # names, attributes and parameters a path is followed through
PATH_NAME = re.compile(r"(^|_)(path|filename|fname|ckpt|checkpoint)$", re.I)
# Names that say a value is a folder that files are written in.
FOLDER_NAME = re.compile(r"(^|_)(dir|folder|directory|root)$", re.I)
RANK_NAME = re.compile(r"rank", re.I)


def checkpoints(context: FileContext) -> Checkpoints:
    return context.shared(KEY, Checkpoints)


@dataclass
class Save:
    """A save that may be written in the background: the statement to edit and how."""

    call: cst.Call
    statement: cst.CSTNode  # the SimpleStatementLine, or the `with open(...)` statement
    path: cst.BaseExpression
    wrapper: str = ""  # `path:line` of the project function run in the background
    flush_before: tuple = ()  # statements in the loop, under an `if`, that use the file


class Synchronous(Exception):
    """Why a save must stay synchronous (the true reason, in words)."""


class NotACheckpoint(Exception):
    """A save that writes no checkpoint file, or has nothing to overlap with."""


class Checkpoints:
    """The checkpoint saves of one file; each look-up computed when asked."""

    def __init__(self, context: FileContext) -> None:
        self.context = context

    @functools.cached_property
    def defines_checkpointer(self) -> bool:
        """Does this file define a class or function named as the checkpointer an import adds?"""
        names = {name.rsplit(".", 1)[1] for name in CHECKPOINTERS}
        return any(d.name.value in names for d in self.context.index.find((cst.ClassDef, cst.FunctionDef)))

    def rank_guard(self, statement: cst.CSTNode) -> cst.If | None:
        """The `if local_rank == 0:` (first process of each node) that `statement` runs under."""
        return per_node_guard(self.context, statement)

    def every_step(self, call: cst.Call) -> bool:
        """Does `call` run on every step of its loop (not under a periodic `if`)?"""
        return sizes_of(self.context).every_step(call)

    def runs_in_training(self, call: cst.Call) -> bool:
        """Does `call` run in a training loop: in one of its function, or in a function of the
        file that only training loops run?"""
        if self.training_loop(call) is not None:
            return True
        helper = self.context.index.first_enclosing(call, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
        return isinstance(helper, cst.FunctionDef) and bool(self.loop_sites(helper))

    def other_saver(self, call: cst.Call) -> str | None:
        """Why `call`, a saver that is not torch.save (safetensors, a library's
        `save_pretrained`, `accelerator.save`), cannot be written by a background torch.save;
        None when it is no such saver."""
        func = call.func
        if self.context.names.of(call) & SAVE_FUNCTIONS:
            return (
                f"`{self._code(func)}` writes its own file format (safetensors), which AsyncCheckpointer, "
                "a background torch.save, does not write"
            )
        if not isinstance(func, cst.Attribute):
            return None
        if (
            func.attr.value in SAVE_METHODS
            and self.context.loops.callee(call) is None
            and (func.attr.value != "save_pretrained" or self.context.training.is_model(func.value))
        ):
            return (
                f"`{func.attr.value}` writes a folder of files (weights, configuration) through its library, "
                "which AsyncCheckpointer does not write"
            )
        if func.attr.value == "save" and self.is_accelerator(func.value):
            return "`accelerator.save` coordinates processes itself; AsyncCheckpointer writes on rank 0 only"
        return None

    def wrapper_plan(self, call: cst.Call, function) -> Save | None:
        """For a checkpoint function of another module of the project (`function`, the
        project's answer for `call`): a `Save` that runs it in the checkpointer's thread on a
        snapshot of its arguments (it only writes files and prints, and nothing uses its files
        before the loop ends, or only under an `if`, after a flush); `Synchronous` raised with
        the reason it may not; `NotACheckpoint` for the final save (`ends_after`); None when no
        training loop of its own function holds the call."""
        loop = self.training_loop(call)
        if loop is not None and self.ends_after(self.context.index.statement_of(call), loop):
            raise NotACheckpoint  # the final save: nothing runs after it to overlap with
        reader = self.path_read_later(call)
        flushes = self.wrapper_flush_points(call, loop) if reader is not None and loop is not None else None
        if reader is not None and not flushes:
            raise Synchronous(
                f"the file is used at line {self.context.line(reader)} (`{self.shown(reader)}`), "
                "which would run before a background write of it is done"
            )
        if loop is None:
            return None
        why = self.background_problem(call, function)
        if why is not None:
            raise Synchronous(why)
        statement = self.context.index.statement_of(call)
        path = next((a.value for a in call.args if not a.star and self.names_file(a.value)), call.func)
        where = project_of(self.context).shown(function)
        return Save(call, statement, path, wrapper=where, flush_before=tuple(flushes or ()))

    def in_one_loop(self, saves: list) -> list:
        """The (call, `Save` or reason) of the saves of one loop, with each `Save` whose path a
        synchronous save of the loop also writes turned into that reason: the background write
        could land after the synchronous one and overwrite it."""
        synchronous = {
            self._code(file_argument(c).value): c for c, p in saves if isinstance(p, str) and file_argument(c)
        }
        settled = []
        for call, plan in saves:
            other = synchronous.get(self._code(plan.path)) if isinstance(plan, Save) else None
            if other is not None:
                plan = f"line {self.context.line(other)} saves to the same path synchronously"
            settled.append((call, plan))
        return settled

    def background_problem(self, call: cst.Call, function) -> str | None:
        """Why the project function `call` calls may not run in the checkpointer's thread on a
        snapshot of its arguments; None when it may."""
        expression = self.context.parents.get(call)
        line = self.context.parents.get(expression)
        if not (isinstance(expression, cst.Expr) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
            return "its result is used, and a background call gives none"
        effects = project_of(self.context).file_effects(function)
        if effects is not None:
            return f"it may do more than write files and print ({effects}), so it must run in the training thread"
        if "chdir" in self.context.code:
            return "the script changes its working folder (`os.chdir`), which a background call would follow"
        if self.defines_checkpointer:
            return "this file defines its own `AsyncCheckpointer`, which the import would shadow"
        if self.shards_state:
            return "this file shards state across ranks, and AsyncCheckpointer writes on rank 0 only"
        statement = self.context.index.statement_of(call)
        if self.rank_guard(statement) is not None:
            return "it runs on the first process of each node, and AsyncCheckpointer writes on global rank 0 only"
        # A rank among the arguments, wherever it is passed, is a certain reason: it comes
        # before what perfmod cannot tell of an argument passed before it.
        for arg in call.args:
            named = [*self.context.index.find(cst.Name, within=arg.value), *([arg.keyword] if arg.keyword else [])]
            rank = next((n for n in named if RANK_NAME.search(n.value)), None)  # `ddp_rank` of `rank=ddp_rank`
            if rank is not None:
                return f"its arguments depend on `{rank.value}`, and AsyncCheckpointer writes on rank 0 only"
        for arg in call.args:
            problem = self.object_problem(arg.value)
            if problem is not None:
                return problem
            if not self.names_file(arg.value) and not self._plain_data(arg.value):
                return (
                    f"perfmod cannot tell whether `{self._code(arg.value)}` names a file the loop uses again, "
                    "or only data to write"
                )
        return None

    def names_file(self, expr: cst.BaseExpression) -> bool:
        """A file path, or a folder named so (`save_dir`, `args.out_dir`)."""
        if self.is_path(expr):
            return True
        last = expr.attr.value if isinstance(expr, cst.Attribute) else expr.value if isinstance(expr, cst.Name) else ""
        return bool(FOLDER_NAME.search(last))

    def _plain_data(self, expr: cst.BaseExpression) -> bool:
        """A value the checkpointer snapshots and that names no file: a literal, a display, a
        `state_dict()`, a Python number (the loop's step counter), or a name bound only to
        those."""
        if isinstance(expr, (cst.Integer, cst.Float, cst.Dict, cst.DictComp, cst.List, cst.Tuple)):
            return True
        if values(self.context).number(expr) is not None:
            return True
        if isinstance(expr, cst.Name):
            if expr.value in ("True", "False", "None"):
                return True
            assigned = [self._assigned_value(a.node) for a in self._bindings(expr)]
            return bool(assigned) and all(v is not None and v is not expr and self._plain_data(v) for v in assigned)
        return (
            isinstance(expr, cst.Call)
            and isinstance(expr.func, cst.Attribute)
            and expr.func.attr.value == "state_dict"
            and not expr.args
        )

    def wrapper_flush_points(self, call: cst.Call, loop: cst.CSTNode) -> list | None:
        """`flush_points` for every file path or folder `call` is given."""
        statement = self.context.index.statement_of(call)
        found = []
        for arg in call.args:
            if not arg.star and self.names_file(arg.value):
                if self.later_use(arg.value, statement, loop) is None:
                    continue
                points = self.flush_points(arg.value, statement, loop)
                if points is None:
                    return None
                found += [line for line in points if all(line is not other for other in found)]
        return found or None

    def path_read_later(self, call: cst.Call) -> cst.CSTNode | None:
        """A use, after `call` or elsewhere in its training loop, of a path `call` is given."""
        statement = self.context.index.statement_of(call)
        loop = self.training_loop(call)
        for arg in call.args:
            if not arg.star and self.names_file(arg.value):
                reader = self.later_use(arg.value, statement, loop)
                if reader is not None:
                    return reader
        return None

    def is_accelerator(self, expr: cst.BaseExpression) -> bool:
        values = self.context.loops.values_of(expr)
        return (
            any(isinstance(v, cst.Call) and self.context.names.startswith(v.func, ("accelerate",)) for v in values)
            or self.context.names.startswith(expr, ("accelerate",)) is not None
        )

    def loop_sites(
        self, function: cst.FunctionDef, depth: int = 0
    ) -> list[tuple[cst.CSTNode, tuple[cst.Call, ...]]] | None:
        """(outermost training loop, calls from it down to `function`) for every way
        `function` runs; None unless each call of it runs inside a training loop
        (directly, or through functions of this file)."""
        steps = self.context.loops
        calls = steps.call_sites(function)
        if not calls or depth > 6:
            return None
        sites = []
        for call in calls:
            loop = self.training_loop(call)
            if loop is not None:
                sites.append((loop, (call,)))
                continue
            caller = self.context.index.first_enclosing(call, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
            above = (
                self.loop_sites(caller, depth + 1)
                if isinstance(caller, cst.FunctionDef) and caller is not function
                else None
            )
            if above is None:
                return None
            sites.extend((outer, (*path, call)) for outer, path in above)
        return sites

    # -- where saves are -----------------------------------------------------------------

    def training_loop(self, call: cst.Call) -> cst.CSTNode | None:
        """The outermost loop around `call` in its function, when it trains (calls
        `.backward()`); the checkpointer lives just outside it."""
        outer = None
        for ancestor in self.context.index.ancestors(call):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                break
            if isinstance(ancestor, (cst.For, cst.While)):
                outer = ancestor
        if outer is None or not self.context.loops.is_training_loop(outer):
            return None
        return outer

    @functools.cached_property
    def shards_state(self) -> bool:
        return SHARDED_STATE.search(self.context.code) is not None

    # -- one save --------------------------------------------------------------------------

    def plan(self, call: cst.Call, loop: cst.CSTNode | None, helper: cst.FunctionDef | None = None, sites=()) -> Save:
        obj_arg, file_arg = self._save_arguments(call)
        line = self._own_line(call)
        if helper is None and self.ends_after(line, loop):
            raise NotACheckpoint  # the final save: nothing runs after it to overlap with
        statement, path = self._written_path(file_arg.value, line)
        self._check_writer_fits(obj_arg.value, statement, path)
        flushes = self._flushes_before_reads(path, statement, loop, helper, sites)
        # Last: a reason that the background write would be wrong comes before one that it
        # would buy nothing.
        self._check_worth_it(call, obj_arg.value)
        return Save(call, statement, path, flush_before=tuple(flushes or ()))

    def _save_arguments(self, call: cst.Call) -> tuple[cst.Arg, cst.Arg]:
        """The object and the file arguments of a save AsyncCheckpointer.save can take."""
        obj_arg = kwarg(call, "obj") or positional(call, 0)
        file_arg = file_argument(call)
        if obj_arg is None or file_arg is None:
            raise Synchronous("the object and the file are not both given")
        if self._is_buffer(file_arg.value):
            raise NotACheckpoint
        extra = [a for a in call.args if a is not obj_arg and a is not file_arg]
        if extra:
            raise Synchronous(
                f"`{self._code(extra[0]).rstrip(', ')}` is an argument AsyncCheckpointer.save does not take"
            )
        return obj_arg, file_arg

    def ends_after(self, statement: cst.CSTNode, loop: cst.CSTNode | None) -> bool:
        """Does the code end right after `statement` (a save: the final one, nothing runs
        after it to overlap with): a `return` follows it in its block, or in a block of an
        `if` around it, or a `break` does that ends `loop` (`if last_step: torch.save(...)`
        then `break`), or a later `if` that breaks out of `loop` on a test of names alone
        that the test of an `if` whose body holds it holds only when it holds
        (`_holds_only_when`: `if last_step: save(...)` or `if master and (last_step or
        (args.save_every > 0 and ...)): save(...)` with the field's default 0, later `if
        last_step: break`), none of that test's names bound again and no `continue` of
        `loop` in between?"""
        parents = self.context.parents
        node, tests, between = statement, [], []
        while True:
            block = parents.get(node)
            if not isinstance(block, cst.IndentedBlock):
                return False
            statements = list(block.body)
            for following in statements[statements.index(node) + 1 :]:
                first = following.body[0] if isinstance(following, cst.SimpleStatementLine) else None
                if isinstance(first, cst.Return):
                    return True
                if isinstance(first, cst.Break):
                    return _innermost_loop(parents, block) is loop  # else it ends another loop
                if isinstance(following, cst.If) and self._breaks_on(following, tests, between, loop):
                    return True
                between.append(following)
            owner = parents.get(block)
            if isinstance(owner, cst.If) and owner.body is block:
                tests.append(owner.test)
            while isinstance(owner, (cst.If, cst.Else)) and not isinstance(parents.get(owner), cst.IndentedBlock):
                owner = parents.get(owner)  # up an `elif` chain to its first `if`
            if not isinstance(owner, cst.If):
                return False
            node = owner

    def _steady_test(self, test: cst.BaseExpression) -> bool:
        """A test of names alone (`last_step`, `step == total`): it holds again as long as
        none of them is bound again."""
        return not self.context.index.find((cst.Call, cst.Attribute, cst.Subscript), within=test)

    def _holds_only_when(self, test: cst.BaseExpression, condition: cst.BaseExpression) -> bool:
        """Does `test` hold only when `condition` does: it is `condition`, or `a and b` with a
        side that holds only when it does, or `a or b` with each side either such or
        certainly false at the values the code fixes (`Values.truth`: `last_step or
        (args.save_every > 0 and ...)` with the field's default 0)?"""
        if _bare(test).deep_equals(_bare(condition)):
            return True
        if not isinstance(test, cst.BooleanOperation):
            return False
        sides = (test.left, test.right)
        if isinstance(test.operator, cst.And):
            return any(self._holds_only_when(side, condition) for side in sides)
        truth = values(self.context).truth
        return all(self._holds_only_when(side, condition) or truth(side) is False for side in sides)

    def _breaks_on(self, statement: cst.If, tests: list, between: list, loop: cst.CSTNode | None) -> bool:
        """Is `statement` an `if` of one of `tests` whose body starts with the `break` of
        `loop`, with nothing in `between` that binds a name of that test or continues `loop`?"""
        first = statement.body.body[0] if isinstance(statement.body, cst.IndentedBlock) else None
        if not (
            isinstance(first, cst.SimpleStatementLine)
            and isinstance(first.body[0], cst.Break)
            and _innermost_loop(self.context.parents, statement) is loop
            and self._steady_test(statement.test)
            and any(self._holds_only_when(test, statement.test) for test in tests)
        ):
            return False
        read = {name.value for name in self.context.index.find(cst.Name, within=statement.test)}
        for passed in between:
            if self.context.bound_in(passed) & read:
                return False
            continues = self.context.index.find(cst.Continue, within=passed)
            if any(_innermost_loop(self.context.parents, node) is loop for node in continues):
                return False
        return True

    def _own_line(self, call: cst.Call) -> cst.SimpleStatementLine:
        """The line of a save that is a statement of its own."""
        expression = self.context.parents.get(call)
        line = self.context.parents.get(expression)
        if not (isinstance(expression, cst.Expr) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
            raise Synchronous("the save is not a statement of its own")
        return line

    def _written_path(self, target: cst.BaseExpression, line: cst.CSTNode) -> tuple[cst.CSTNode, cst.BaseExpression]:
        """(the statement that writes the file, its path): the `with open(path)` around a
        save to an open file, else the save's own line and its target, a path."""
        opened = self._opened_file(target, line)
        if opened is not None:
            return opened
        if not self.is_path(target):
            raise Synchronous(f"perfmod cannot tell that `{self._code(target)}` is a file path and not an open file")
        return line, target

    def _check_writer_fits(self, obj: cst.BaseExpression, statement: cst.CSTNode, path: cst.BaseExpression) -> None:
        """Raise Synchronous when AsyncCheckpointer cannot write this object the way the script
        does: an object it cannot copy, a name it would shadow, state or paths per rank."""
        problem = self.object_problem(obj)
        if problem is not None:
            raise Synchronous(problem)
        if self.defines_checkpointer:
            raise Synchronous("this file defines its own `AsyncCheckpointer`, which the import would shadow")
        if self.shards_state:
            raise Synchronous(
                "this file shards state across ranks (FSDP or torch.distributed.checkpoint), and "
                "AsyncCheckpointer writes on rank 0 only"
            )
        per_node = self.rank_guard(statement)
        if per_node is not None:
            raise Synchronous(
                f"the save runs on the first process of each node (`if {self._code(per_node.test)}:`, line "
                f"{self.context.line(per_node)}), and AsyncCheckpointer writes on global rank 0 only: the other "
                "nodes would have no checkpoint"
            )
        rank = next((n for n in self.context.index.find(cst.Name, within=path) if RANK_NAME.search(n.value)), None)
        if rank is not None:
            raise Synchronous(f"the path depends on `{rank.value}`, and AsyncCheckpointer writes on rank 0 only")

    def _flushes_before_reads(
        self,
        path: cst.BaseExpression,
        statement: cst.CSTNode,
        loop: cst.CSTNode | None,
        helper: cst.FunctionDef | None,
        sites,
    ) -> list | None:
        """Where to wait for the background write before the file is used again (None when
        it is not); raise Synchronous when a use may come before the write is done and no
        flush can be placed in front of it."""
        reader = self.later_use(path, statement, loop)
        if reader is None and helper is not None:
            reader = self._later_use_by_callers(path, helper, sites)
        loops = [loop] if helper is None else [outer for outer, _ in sites]
        # a use in another function the loop runs (a callback reloading the file) is not
        # one a flush in this function can come before
        elsewhere = next(filter(None, (self._use_in_functions_run(path, statement, o) for o in loops if o)), None)
        reader = reader or elsewhere
        flushes = None
        if reader is not None and elsewhere is None and helper is None and loop is not None:
            flushes = self.flush_points(path, statement, loop)
        if reader is not None and not flushes:
            raise Synchronous(
                f"the file is used at line {self.context.line(reader)} (`{self._code(reader)}`), which can run "
                f"before a background write of it is done"
            )
        return flushes

    def _check_worth_it(self, call: cst.Call, obj: cst.BaseExpression) -> None:
        """Raise Synchronous when the checkpoint is too small for a background writer to buy
        anything (unless it is saved every step)."""
        saved = sizes_of(self.context).saved(obj)
        size = saved[0] if saved is not None else None
        if size is None or size >= MIN_SAVE_BYTES or self.every_step(call):
            return
        counted = "the parameters and buffers perfmod counts in the modules it saves"
        if saved[1]:
            counted += ", and the state their optimizer keeps for them"
        millis = save_seconds(size) * 1000
        took = f"about {millis:.0f} ms" if millis >= 1 else "under 1 ms"
        raise Synchronous(
            f"the checkpoint holds about {shown(size)} ({counted}), "
            f"which torch.save writes in {took} at "
            f"{HARDWARE['save_bytes_per_s'] / 1e9:.0f} GB/s; a save under {MIN_SAVE_S * 1000:.0f} ms that does "
            "not run every step is not worth a background writer"
        )

    def _later_use_by_callers(self, path: cst.BaseExpression, helper: cst.FunctionDef, sites) -> cst.CSTNode | None:
        """For a path handed to the helper as a parameter: a use of what each call passes,
        after the call or elsewhere in its training loop."""
        if not isinstance(path, cst.Name):
            return None
        param = next(
            (p for p in (*helper.params.params, *helper.params.kwonly_params) if p.name.value == path.value), None
        )
        if param is None:
            return None
        for loop, calls in sites:
            call = next((c for c in calls if self.context.loops.callee(c) is helper), None)
            if call is None:
                continue
            argument = argument_for(call, helper, param, self.context.kinds.receiver_offset(call, helper))
            if argument is None:
                return call  # not passed where perfmod can see it
            statement = self.context.index.statement_of(call)
            found = self.later_use(argument, statement, loop) if self.is_path(argument) else argument
            if found is not None:
                return found
        return None

    def _use_in_functions_run(
        self, path: cst.BaseExpression, statement: cst.CSTNode, loop: cst.CSTNode
    ) -> cst.CSTNode | None:
        """A use of the saved file in another function of this file that `loop` runs (a
        callback that reloads the best checkpoint): for a path held on the object
        (`self.path`), a method of the same class given it through the same receiver; for a
        path in a module-level name, any such function."""
        root = path
        while isinstance(root, (cst.Attribute, cst.Subscript)):
            root = root.value
        if not isinstance(root, cst.Name):
            return None
        function = self.context.index.first_enclosing(statement, (cst.FunctionDef, cst.Lambda))
        kinds = self.context.kinds
        owner = kinds.class_of(function) if isinstance(function, cst.FunctionDef) else None
        on_object = owner is not None and root is not path and root.value == _receiver(function)
        scope = self.context.scopes.get(root)
        on_module = scope is not None and all(isinstance(a.scope, GlobalScope) for a in scope[root.value])
        if not (on_object or on_module) or not (scope is not None and scope[root.value]):
            return None
        for other in self.context.loops.functions_reached(loop):
            if other is function or (
                on_object and (kinds.class_of(other) is not owner or _receiver(other) != root.value)
            ):
                continue
            found = next(
                self._later_uses(path, statement, lambda node, o=other: self.context.inside(node, o), other), None
            )
            if found is not None:
                return found
        return None

    def _is_buffer(self, target: cst.BaseExpression) -> bool:
        values = [target]
        if isinstance(target, cst.Name):
            values += [self._assigned_value(a.node) for a in self._bindings(target)]
        return any(isinstance(v, cst.Call) and self.context.names.is_(v, *BUFFERS) for v in values)

    def _opened_file(self, target: cst.BaseExpression, line) -> tuple[cst.With, cst.BaseExpression] | None:
        """`(with_statement, path)` for `with open(path, "wb") as f: torch.save(obj, f)`, the
        save being the whole body; raise when `target` is a file opened any other way."""
        if not isinstance(target, cst.Name):
            return None
        bindings = self._bindings(target)
        holders = [_binding_statement(self.context.parents, a.node) for a in bindings]
        opened = [h for h in holders if isinstance(h, (cst.With, cst.Assign)) and self._opens_file(h)]
        if not opened:
            return None
        statement = opened[0]
        if len(holders) != 1 or not isinstance(statement, cst.With) or len(statement.items) != 1:
            raise Synchronous(f"it writes to the open file `{target.value}`")
        body = statement.body
        if not isinstance(body, cst.IndentedBlock) or list(body.body) != [line]:
            raise Synchronous(f"`{target.value}` is written to by more than the save")
        if len(self._accesses(target)) != 1:
            raise Synchronous(f"`{target.value}` is used outside the save")
        call = statement.items[0].item
        mode = kwarg(call, "mode") or positional(call, 1)
        if mode is None or not isinstance(mode.value, cst.SimpleString) or mode.value.evaluated_value != "wb":
            raise Synchronous("the file is not opened with mode 'wb'")
        path = kwarg(call, "file") or positional(call, 0)
        if path is None:
            raise Synchronous("perfmod cannot tell which path the file is opened at")
        return statement, path.value

    def _opens_file(self, statement: cst.CSTNode) -> bool:
        calls = [i.item for i in statement.items] if isinstance(statement, cst.With) else [statement.value]
        return any(isinstance(c, cst.Call) and self.context.names.is_(c, "builtins.open", "io.open") for c in calls)

    def is_path(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        """Is `expr` certainly a path (a string or a Path), not an open file? Names and
        attributes are followed to what they hold (`self.filepath` set from the `filepath`
        every construction passes), else judged by their names (`ckpt_path`)."""
        names = self.context.names
        if depth > MAX_PATH_DEPTH:
            return False
        if isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
            return True
        if isinstance(expr, cst.BinaryOperation):  # "dir/" + name, run_dir / "last.pt", "ckpt_%d.pt" % step
            return self.is_path(expr.left, depth + 1) or self.is_path(expr.right, depth + 1)
        if isinstance(expr, cst.Call):
            if names.of(expr) & PATH_FUNCTIONS:
                return True
            return (
                isinstance(expr.func, cst.Attribute)
                and expr.func.attr.value in PATH_METHODS
                and self.is_path(expr.func.value, depth + 1)
            )
        if isinstance(expr, cst.Attribute):
            if PATH_NAME.search(expr.attr.value):
                return True
            values = self.context.kinds.attribute_values(expr)
            return bool(values) and all(self.is_path(value, depth + 1) for value in values)
        if isinstance(expr, cst.Name):
            bindings = self._bindings(expr)
            values = [self._assigned_value(a.node) for a in bindings]
            parameter = self.context.bindings.param_of(expr)
            if parameter is not None:
                values = self.context.kinds.passed(parameter[1]) or [None]  # what every call passes
            if values and all(v is not None and self.is_path(v, depth + 1) for v in values):
                return True
            holders = [_binding_statement(self.context.parents, a.node) for a in bindings]
            opened = any(isinstance(h, (cst.With, cst.Assign)) and self._opens_file(h) for h in holders)
            return bool(PATH_NAME.search(expr.value)) and not opened
        return False

    def object_problem(self, obj: cst.BaseExpression) -> str | None:
        """Why the saved object should not be snapshotted by the checkpointer, or None."""
        values = [obj]
        if isinstance(obj, cst.Name):
            bindings = self._bindings(obj)
            values += [v for v in (self._assigned_value(a.node) for a in bindings) if isinstance(v, cst.Dict)]
        for value in values:
            for part in _container_parts(value):
                kind = self.context.kinds.fact(part).kind
                if kind not in DEEP_COPIED_KINDS and self.context.training.is_model(part):
                    kind = Kind.MODULE  # a model the program trains (its class in another module)
                if kind in DEEP_COPIED_KINDS:
                    return (
                        f"`{self._code(part)}` is a whole {DEEP_COPIED_KINDS[kind]}, which AsyncCheckpointer would "
                        f"deep-copy on its device; save its state_dict() instead"
                    )
        return None

    def later_use(self, path: cst.BaseExpression, statement: cst.CSTNode, loop: cst.CSTNode) -> cst.CSTNode | None:
        """A use of the saved file that may come after the save: after it in the function, or
        anywhere in the loop (the next iteration): the path variable read (other than to log
        it or to save to it again), or a call that gets the same path expression."""
        index = self.context.index
        after = index.end(statement)
        scope_root = self.context.index.first_enclosing(statement, (cst.FunctionDef, cst.Lambda)) or self.context.module

        loop_end = index.end(loop) if loop is not None else None
        loop_function = (
            self.context.index.first_enclosing(loop, (cst.FunctionDef, cst.Lambda)) if loop is not None else None
        )

        def later(node: cst.CSTNode) -> bool:
            if self.context.inside(node, statement):
                return False  # the save itself (`with open(path, "wb") as f:` around it too)
            if loop is not None and self.context.inside(node, loop):
                return True  # the next iteration
            at = index.order(node)
            if at <= after:
                return False
            # After the loop in its function: the checkpointer is flushed when the loop is left.
            return not (
                loop_end is not None
                and at > loop_end
                and self.context.index.first_enclosing(node, (cst.FunctionDef, cst.Lambda)) is loop_function
            )

        return next(self._later_uses(path, statement, later, scope_root), None)

    def _later_uses(self, path, statement, later, scope_root):
        if isinstance(path, cst.Name):
            for use in self._accesses(path):
                if later(use) and not self._harmless_use(use):
                    yield self._statement_or_call(use)
            return
        text = self._code(path)
        for call in self.context.index.find(cst.Call, within=scope_root):
            if not later(call) or self._logging(call) or self.context.inside(call, statement):
                continue
            if self.context.names.is_(call, *TORCH_SAVES) or self._makes_folder(call):
                continue
            if any(self._names_path(arg.value, text) for arg in call.args) or (
                isinstance(call.func, cst.Attribute) and self._names_path(call.func.value, text)
            ):
                yield call  # given the path, or a method of it (`path.read_bytes()`)

    def flush_points(self, path: cst.BaseExpression, statement: cst.CSTNode, loop: cst.CSTNode) -> list | None:
        """When every use of the saved file in the loop comes after the save in the same
        iteration, under an `if` that the save is not under (`if upload: wandb.save(path)`):
        the statements a flush goes before, so that the save is waited for only when the
        file is used. None when a use is not such."""
        index = self.context.index
        after = index.end(statement)
        scope_root = self.context.index.first_enclosing(statement, (cst.FunctionDef, cst.Lambda)) or self.context.module
        found = []

        def in_loop(node: cst.CSTNode) -> bool:
            return self.context.inside(node, loop) and not self.context.inside(node, statement)

        for use in self._later_uses(path, statement, in_loop, scope_root):
            if (
                index.order(use) <= after
                or (self.context.index.first_enclosing(use, (cst.FunctionDef, cst.Lambda)) or self.context.module)
                is not scope_root
            ):
                return None
            guard = next(
                (
                    a
                    for a in self.context.index.ancestors(use)
                    if (isinstance(a, cst.If) and not self.context.inside(use, a.test))  # in its branches
                    or isinstance(a, (cst.For, cst.While))
                ),
                None,
            )
            if not isinstance(guard, cst.If) or self.context.inside(statement, guard):
                return None
            line = index.statement_of(use)
            if line is None or not self.context.inside(line, guard):
                return None
            if all(line is not other for other in found):
                found.append(line)
        return found or None

    def _makes_folder(self, call: cst.Call) -> bool:
        """`os.makedirs(folder, exist_ok=True)`: touches no file a pending write makes."""
        exist_ok = kwarg(call, "exist_ok")
        return self.context.names.is_(call, "os.makedirs") and exist_ok is not None and _is_true(exist_ok.value)

    def _names_path(self, expr: cst.BaseExpression, text: str) -> bool:
        """Is `expr` the path written `text`, or that path through `str(...)`, `Path(...)`
        or `os.fspath(...)`?"""
        if getattr(expr, "lpar", None) and not isinstance(expr, cst.Tuple):  # `(dir / name)`; `()` keeps its own
            expr = expr.with_changes(lpar=[], rpar=[])
        if self._code(expr) == text:
            return True
        return (
            isinstance(expr, cst.Call)
            and len(expr.args) == 1
            and bool(self.context.names.of(expr) & PATH_FUNCTIONS)
            and self._code(expr.args[0].value) == text
        )

    def _harmless_use(self, use: cst.Name, depth: int = 0) -> bool:
        """A read of the path that does not touch the file: logging it (as it is, or
        formatted into a message), also through a function of this file that only logs
        what it is given (`print0(f"saved {path}")`), or saving to it again."""
        child = use
        for ancestor in self.context.index.ancestors(use):
            if isinstance(ancestor, cst.Call):
                if self._logging(ancestor):
                    return True
                if isinstance(child, cst.Arg) and self._only_logs(ancestor, child, depth):
                    return True
                file_arg = file_argument(ancestor)
                if self.context.names.is_(ancestor, *TORCH_SAVES) and file_arg is not None and file_arg.value is use:
                    return True
            if isinstance(ancestor, cst.BaseStatement):
                return False
            child = ancestor
        return False

    def _only_logs(self, call: cst.Call, arg: cst.Arg, depth: int) -> bool:
        """Is `call` a call of a function of this file that only logs what `arg` passes it:
        every read of its parameter a harmless use?"""
        function = self.context.bindings.local_function(call.func)
        if function is None or arg.star or depth >= MAX_LOGGING_DEPTH:
            return False
        params = function.params
        if arg.keyword is not None:
            named = (*params.posonly_params, *params.params, *params.kwonly_params)
            param = next((p for p in named if p.name.value == arg.keyword.value), None)
        else:
            positional_params = [*params.posonly_params, *params.params]
            index = [a for a in call.args if a.keyword is None].index(arg)
            param = positional_params[index] if index < len(positional_params) else None
        reads = [read for read in self._accesses(param.name) if read is not param.name] if param is not None else []
        return bool(reads) and all(self._harmless_use(read, depth + 1) for read in reads)

    def _logging(self, call: cst.Call) -> bool:
        return bool(self.context.names.of(call) & LOGGING_CALLS) or (
            isinstance(call.func, cst.Attribute) and call.func.attr.value in LOGGING_METHODS
        )

    # -- look-ups --------------------------------------------------------------------------

    def _code(self, node: cst.CSTNode) -> str:
        return self.context.module.code_for_node(node).strip()

    def shown(self, node: cst.CSTNode) -> str:
        """The code of `node` on one line, cut after 80 characters."""
        text = " ".join(self._code(node).split()).replace("( ", "(").replace(" )", ")")
        return text if len(text) <= 80 else text[:77] + "..."

    def _bindings(self, name: cst.Name) -> list[Assignment]:
        scope = self.context.kinds.scopes.get(name)
        return [a for a in scope[name.value] if type(a) is Assignment] if scope is not None else []

    def _accesses(self, name: cst.Name) -> list[cst.Name]:
        scope = self.context.kinds.scopes.get(name)
        if scope is None:
            return []
        found = {id(r.node): r.node for a in scope.assignments[name.value] for r in a.references}
        return sorted(found.values(), key=self.context.index.order)  # in file order: the first use is reported

    def _assigned_value(self, target: cst.CSTNode) -> cst.BaseExpression | None:
        statement = _binding_statement(self.context.parents, target)
        if isinstance(statement, cst.Assign) and len(statement.targets) == 1 and statement.targets[0].target is target:
            return statement.value
        if isinstance(statement, cst.AnnAssign) and statement.target is target:
            return statement.value
        return None

    def _statement_or_call(self, node: cst.CSTNode) -> cst.CSTNode:
        for ancestor in self.context.index.ancestors(node):
            if isinstance(ancestor, (cst.Call, cst.BaseSmallStatement)):
                return ancestor
        return node


def _binding_statement(parents, target: cst.CSTNode) -> cst.CSTNode:
    current = target
    while True:
        parent = parents.get(current)
        if parent is None or not isinstance(
            parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement, cst.AssignTarget, cst.AsName, cst.WithItem)
        ):
            return parent if parent is not None else current
        current = parent


def file_argument(call: cst.Call) -> cst.Arg | None:
    """The `f` argument of `torch.save(obj, f)`."""
    return kwarg(call, "f") or positional(call, 1)


def _innermost_loop(parents, node: cst.CSTNode) -> cst.CSTNode | None:
    while node is not None and not isinstance(node, (cst.For, cst.While, cst.FunctionDef)):
        node = parents.get(node)
    return node if isinstance(node, (cst.For, cst.While)) else None


def _container_parts(value: cst.BaseExpression):
    """`value` and, through dict, list and tuple literals, every element in it."""
    yield value
    if isinstance(value, cst.Dict):
        for element in value.elements:
            if isinstance(element, cst.DictElement):
                yield from _container_parts(element.value)
    elif isinstance(value, (cst.List, cst.Tuple)):
        for element in value.elements:
            yield from _container_parts(element.value)


def _bare(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` without the parentheses around it (`(last_step)` is `last_step`)."""
    return expr.with_changes(lpar=[], rpar=[]) if getattr(expr, "lpar", None) else expr


def _is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def _receiver(function: cst.FunctionDef) -> str | None:
    params = function.params.params
    return params[0].name.value if params else None

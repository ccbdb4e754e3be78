"""What a training script prints, logs and saves, and where: the sites a rule that runs
the script in several processes keeps to one of them (PM601), read once per file.

`output_sites(context)` (built once per file, FileContext.shared) answers:

- `prints`: the calls of the builtin `print`; `progress_bars`: `tqdm(...)` / `trange(...)`
  calls that do not choose `disable=` and pass no `*args`; `log_calls`: `info` / `debug`
  calls on the `logging` module or on a logger every binding of which is
  `logging.getLogger(...)`; `shown`: all of them in code order, each with which it is;
- `saves`: `torch.save` calls; `writes`: every call that writes a checkpoint (torch's
  savers, the other SAVE_FUNCTIONS of torch_facts, `save_pretrained`), in code order;
  `checkpointer_saves`: `.save(obj, path)` of a runtime checkpointer;
- `loads_after(saves)`: the loads (`torch.load`) of a path one of `saves` writes that run
  after that save (later in its function, or in a loop around it), with the path read;
- `reloads(saves)`: those loads, one per statement, with their statements;
  raises NotDistributable for a path that may name another file in each process;
- `opened_for(statement)`: the `with open(path, "wb") as f:` whose whole body is the
  statement (a save through an open file); `own_statement(call)`: the statement that is
  the call and nothing else;
- `alone_if(statement)`: the `if` without `else` around a statement that may run on one
  process alone; `runs_alone(condition)`: whether an `if` may run on one process alone: it calls nothing
  another process would have to join (a model call, a collective, a helper of unknown
  content) and nothing it assigns is read after it or in a loop around it;
- `write_site(call)`: what a guard keeping a checkpoint write to one process holds (that
  `if`, the `with open(...)` or the call's own line), or NotDistributable with why none.

Which calls save, print and log are torch facts (torch_facts, distributed's tables).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.distributed import (
    LOGGING_METHODS,
    PRINT,
    RANK0_SAFE_CALLS,
    RANK0_SAFE_METHODS,
    RANK0_SAFE_PREFIXES,
    TQDM,
    NotDistributable,
)
from codemod.analysis.names import kwarg, method_name, positional
from codemod.analysis.torch_facts import SAVE_FUNCTIONS, TORCH_SAVES

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "output_sites"
LOADS = {"torch.load", "torch.serialization.load"}
OPENS = ("builtins.open", "io.open")


def output_sites(context: FileContext) -> OutputSites:
    return context.shared(KEY, OutputSites)


class OutputSites:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.index = context.index
        self.names = context.names

    # -- printing and logging -----------------------------------------------------------------

    @functools.cached_property
    def prints(self) -> tuple[cst.Call, ...]:
        return tuple(
            call
            for call in self.index.find(cst.Call)
            if isinstance(call.func, cst.Name) and call.func.value == "print" and self.names.is_(call.func, *PRINT)
        )

    @functools.cached_property
    def progress_bars(self) -> tuple[cst.Call, ...]:
        return tuple(
            call
            for call in self.index.find(cst.Call)
            if _called_name(call.func) in ("tqdm", "trange")
            and self.names.is_(call.func, *TQDM)
            and kwarg(call, "disable") is None
            and not any(a.star for a in call.args)
        )

    @functools.cached_property
    def log_calls(self) -> tuple[cst.Call, ...]:
        return tuple(
            call
            for call in self.index.find(cst.Call)
            if method_name(call) in LOGGING_METHODS and self.context.kinds.is_logger(call.func.value)
        )

    @functools.cached_property
    def shown(self) -> tuple[tuple[cst.Call, str], ...]:
        """Every print, progress bar and log call in code order, each with what it is:
        "print", "progress" or "log"."""
        found = [(c, "print") for c in self.prints] + [(c, "progress") for c in self.progress_bars]
        found += [(c, "log") for c in self.log_calls]
        return tuple(sorted(found, key=lambda shown: self.index.order(shown[0])))

    # -- checkpoints ----------------------------------------------------------------------------

    @functools.cached_property
    def saves(self) -> tuple[cst.Call, ...]:
        return tuple(facts.calls_named(self.context, set(TORCH_SAVES)))

    @functools.cached_property
    def writes(self) -> tuple[cst.Call, ...]:
        found = (
            list(self.saves)
            + facts.calls_named(self.context, set(SAVE_FUNCTIONS - TORCH_SAVES))
            + [c for c in self.index.find(cst.Call) if method_name(c) == "save_pretrained"]
        )
        return tuple(sorted(found, key=self.index.order))

    @functools.cached_property
    def checkpointer_saves(self) -> tuple[cst.Call, ...]:
        return tuple(facts.checkpointer_saves(self.context))

    def loads_after(self, saves) -> list[tuple[cst.Call, cst.BaseExpression]]:
        """(load, the path it reads) for each `torch.load` of a path one of `saves` writes,
        that runs after that save; a load of a file there before the run (resuming) is not one."""
        code = self.context.module.code_for_node
        saved: dict[str, list[cst.Call]] = {}
        for call in saves:
            path = kwarg(call, "f") or positional(call, 1)
            if path is not None:
                saved.setdefault(code(path.value), []).append(call)
        if not saved:
            return []
        found = []
        for load in facts.calls_named(self.context, LOADS):
            path = kwarg(load, "f") or positional(load, 0)
            if path is None or code(path.value) not in saved:
                continue
            if any(self.runs_after(load, save) for save in saved[code(path.value)]):
                found.append((load, path.value))
        return found

    def runs_after(self, node: cst.CSTNode, earlier: cst.CSTNode) -> bool:
        """Does `node` run after `earlier` (later in its function, or in a loop around both)?"""
        if facts.function_of(self.context, node) is not facts.function_of(self.context, earlier):
            return False
        return self.index.before(earlier, node) or any(
            self.index.inside(node, loop) for loop in self.index.enclosing_loops(earlier)
        )

    def reloads(self, saves) -> list[tuple[cst.Call, cst.BaseStatement]]:
        """(load, its statement) for each statement that loads a file one of
        `saves` writes, after it is written (its first such load); raises NotDistributable
        where the path may name another file in each process (a temporary folder it makes
        for itself): a file only the process that wrote it has."""
        found, seen = [], set()
        for load, path in self.loads_after(saves):
            unshared = facts.unshared_file(self.context, path)
            if unshared is not None:
                raise NotDistributable(load, unshared)
            statement = self.index.statement_of(load)
            if id(statement) not in seen:
                seen.add(id(statement))
                found.append((load, statement))
        return found

    def opened_for(self, statement: cst.CSTNode) -> cst.With | None:
        """The `with open(path, "wb") as f:` whose whole body is `statement`."""
        block = self.context.parents.get(statement)
        holder = self.context.parents.get(block) if isinstance(block, cst.IndentedBlock) else None
        if (
            isinstance(holder, cst.With)
            and len(block.body) == 1
            and all(isinstance(i.item, cst.Call) and self.names.is_(i.item.func, *OPENS) for i in holder.items)
        ):
            return holder
        return None

    def own_statement(self, call: cst.Call) -> cst.SimpleStatementLine | None:
        """The statement that is `call` and nothing else; None when the call is part of a
        larger statement."""
        statement = self.index.statement_of(call)
        if (
            isinstance(self.context.parents.get(call), cst.Expr)
            and isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
        ):
            return statement
        return None

    # -- what may run on one process alone --------------------------------------------------------

    def write_site(self, call: cst.Call) -> cst.BaseStatement:
        """What a guard that keeps the checkpoint write `call` to one process holds: the
        `if` (no `else`) around it where the whole `if` may run alone, else the statement
        that runs it and nothing else (its own line, or the `with open(path, "wb") as f:`
        whose whole body it is). Raises NotDistributable where there is none."""
        statement = self.opened_for(self.index.statement_of(call)) or self.own_statement(call)
        if statement is not None:
            return self.alone_if(statement) or statement
        saver = self.context.source(call.func)
        if isinstance(self.context.parents.get(self.context.parents.get(call)), cst.SimpleStatementSuite):
            raise NotDistributable(call, f"`{saver}` is on the line of its `if`; put it on a line of its own")
        raise NotDistributable(
            call,
            f"`{saver}` is part of a larger statement; PM601 writes checkpoints on rank 0 only in "
            "statements of their own",
        )

    def alone_if(self, statement: cst.BaseStatement) -> cst.If | None:
        """The `if` (with no `else`) whose block holds `statement`, when the whole `if` may
        run on one process alone."""
        condition = self.context.parents.get(self.context.parents.get(statement))
        if isinstance(condition, cst.If) and condition.orelse is None and self.runs_alone(condition):
            return condition
        return None

    def runs_alone(self, condition: cst.If) -> bool:
        """Can the whole `if` run on one process alone: nothing in it that another process
        must join (a model call, a collective, a helper of unknown content), and nothing it
        assigns is read after it."""
        for call in self.index.find(cst.Call, within=condition.body):
            names = self.names.of(call.func)
            if names & RANK0_SAFE_CALLS or any(n.startswith(RANK0_SAFE_PREFIXES) for n in names):
                continue
            if method_name(call) in RANK0_SAFE_METHODS and not self.context.training.is_model_call(call):
                continue
            return False
        assigned = facts.assigned_names(self.context, condition.body)
        if not assigned:
            return True
        function = facts.function_of(self.context, condition)
        owner = function if function is not None else self.context.module
        loops = self.index.enclosing_loops(condition)
        for name in self.index.find(cst.Name, within=owner):
            if name.value not in assigned or self.index.inside(name, condition.body):
                continue
            # Read after the `if`, or by anything in a loop around it (its own test included):
            # the next iteration on another process would see the old value.
            if self.index.before(condition, name) or any(self.index.inside(name, loop) for loop in loops):
                return False
        return True


def _called_name(func: cst.BaseExpression) -> str | None:
    """The last name of a called expression: `tqdm` of `tqdm.auto.tqdm`."""
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else None

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import Assignment

from codemod.analysis.bindings import argument_for
from codemod.analysis.distributed import per_node_guard
from codemod.analysis.kinds import Kind
from codemod.analysis.names import kwarg, positional
from codemod.analysis.project import project_of
from codemod.analysis.sizes import HARDWARE, MIN_SAVE_BYTES, MIN_SAVE_S, save_seconds, shown, sizes_of
from codemod.analysis.torch_facts import SAVE_FUNCTIONS, SAVE_METHODS, TORCH_SAVES
from codemod.edits import Edit, InsertAfter, InsertBefore, Replace
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.suppression import suppressed_on

BUFFERS = ("io.BytesIO", "io.StringIO")
# Objects that the checkpointer would deep-copy whole (and on their device): a module,
# an optimizer or a loader is saved through its state_dict() instead.
DEEP_COPIED_KINDS = {
    Kind.MODULE: "module",
    Kind.OPTIMIZER: "optimizer",
    Kind.LOADER: "DataLoader",
    Kind.DATASET: "dataset",
}
# Names that say a value is a file path and not an open file.
PATH_NAME = re.compile(r"(^|_)(path|filename|fname|ckpt|checkpoint)$", re.I)
# Names that say a value is a folder that files are written in.
FOLDER_NAME = re.compile(r"(^|_)(dir|folder|directory|root)$", re.I)
PATH_FUNCTIONS = {
    "os.path.join",
    "os.path.abspath",
    "os.path.expanduser",
    "os.fspath",
    "pathlib.Path",
    "pathlib.PurePath",
    "builtins.str",
}
PATH_METHODS = {"joinpath", "with_suffix", "with_name", "format", "replace", "resolve", "absolute"}
LOGGING_CALLS = {"builtins.print"}
LOGGING_METHODS = {"info", "debug", "warning", "log", "write", "set_description", "set_postfix"}
SHARDED_STATE = re.compile(r"FullyShardedDataParallel|\bFSDP\b|fully_shard|torch\.distributed\.checkpoint|DTensor")
RANK_NAME = re.compile(r"rank", re.I)
CHECKPOINTER = "checkpointer"
IMPORT = ("runtime.checkpoint", "AsyncCheckpointer")

IMPORTS = "import torch\n"
SETUP = """\
model = torch.nn.Linear(4096, 4096).cuda()
optimizer = torch.optim.AdamW(model.parameters())
"""
PREAMBLE = IMPORTS + SETUP
# What the fix adds after the file's imports.
ADDED_IMPORT = "from runtime.checkpoint import AsyncCheckpointer\n\n"
LOOP = """\
for epoch in range(10):
    loss = model(torch.randn(4, 4096).cuda()).sum()
    loss.backward()
    optimizer.step()
"""


def _indented(code: str) -> str:
    return "".join("    " + line for line in code.splitlines(True))


@dataclass
class _Save:
    """A torch.save that the checkpointer takes over: the statement to edit and how."""

    call: cst.Call
    statement: cst.CSTNode  # the SimpleStatementLine, or the `with open(...)` statement
    path: cst.BaseExpression
    wrapper: str = ""  # `path:line` of the project function run through `checkpointer.call`
    flush_before: tuple = ()  # statements in the loop, under an `if`, that use the file


class _Unfixable(Exception):
    """Why a save stays synchronous; the message ends up in the finding."""


class _Leave(Exception):
    """A save that is not PM405's business (no finding)."""


class SynchronousCheckpointInLoop(Rule):
    """
    ## What it does
    Finds `torch.save(...)` in a training loop (also as `th.save` or an imported
    `save`, and `with open(path, "wb") as f: torch.save(obj, f)`) and hands the
    write to `runtime.checkpoint.AsyncCheckpointer`: a checkpointer built once
    before the loop, `checkpointer.save(obj, path)` in place of each save, and
    `checkpointer.flush()` after the loop and before any `return` out of it, so
    the last file is on disk before the script goes on or exits.

    A save in a function of the file that training loops call
    (`save_checkpoint(model, optimizer, epoch, path)`, a trainer's method) is
    handed over too, when every call of that function runs in a training
    loop: the checkpointer is built once for the module, after its imports,
    and flushed after each of those loops.

    A checkpoint function of another module of the project, called as a
    statement in the training loop (`save_latest(args.save_dir, artifacts)`,
    which makes the folder, prunes old files and writes each artifact), runs
    in the checkpointer's thread: `checkpointer.call(save_latest, ...)` hands
    it a CPU snapshot of its arguments, as `save()` does. This is done only
    when the function, and every function it calls, does nothing but make,
    write, read or remove files and print: it changes none of its arguments,
    no state of its module, and calls nothing else; when its arguments are
    file paths, folders (`save_dir`) or plain data (a dict of `state_dict()`s);
    and when the loop uses none of those paths again before it ends. Otherwise
    it is reported with the reason: a file used right after the call
    (`wandb.save(str(path))` uploads it), a result that is used, a call that
    may change state.

    Savers it does not stand in for are reported in training loops:
    safetensors' `save_file`, a model's `save_pretrained`, `accelerator.save`.

    ## Why is this bad?
    `torch.save` pickles and writes the whole state (model, optimizer moments:
    three times the parameters for Adam) while training waits: seconds to minutes
    per checkpoint for large models, on a network file system more. The
    checkpointer copies the tensors to CPU memory (fast, and asynchronous from
    pinned memory on CUDA) and writes the file in a background thread while
    training goes on; it also writes to a temporary name and renames, so a crash
    mid-write never leaves a truncated checkpoint, and only rank 0 writes under
    torchrun. Typical gain: the write time of each checkpoint, minus the copy.

    ## Example
    ```python
    for epoch in range(epochs):
        train_one_epoch(model, optimizer, loader)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f"ckpt_{epoch}.pt")
    ```
    Use instead:
    ```python
    from runtime.checkpoint import AsyncCheckpointer

    checkpointer = AsyncCheckpointer()
    for epoch in range(epochs):
        train_one_epoch(model, optimizer, loader)
        checkpointer.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f"ckpt_{epoch}.pt")
    checkpointer.flush()
    ```

    ## Fix safety
    Unsafe: the files hold the same values, but when and how they appear change.
    - The file appears later than before: `save()` returns once the state is
      copied, and the write finishes in the background. A reader racing the
      training loop (an evaluation script polling the folder, a job uploading
      checkpoints) sees the previous file until the rename. Within the script,
      the rule leaves a save alone when its path is used after it or elsewhere
      in the loop (copied, uploaded, loaded, returned, checked for), and
      `flush()` runs before the loop is left.
    - A crash between `save()` and the end of the write loses that checkpoint
      (the previous one stays whole); a clean exit, even by an exception, still
      writes it (the checkpointer flushes at interpreter exit).
    - Memory: one CPU copy of the saved state is held until it is written.
    - Tensors are saved from their CPU copies, so `torch.load(path)` without
      `map_location` gives CPU tensors where it gave CUDA ones;
      `load_state_dict` copies them to the model's and optimizer's devices either way.
    - Only rank 0 writes: files named per rank, or state sharded across ranks
      (FSDP), are left alone.
    - A file read after the loop is read after the flush; one read in the loop
      or right after the save (copied, loaded, checked for) keeps its save
      synchronous, unless every such read comes after the save, under an `if`
      the save is not under (`if args.upload: upload(path)`): then
      `checkpointer.flush()` goes right before each of them, and the save waits
      only when the file is used.
    - A project function run by `checkpointer.call` runs later, in another
      thread: what it prints appears later, its errors are raised by the next
      save or flush, and files it removes (old checkpoints it prunes) go later.

    Left alone as well: saves outside loops and in loops that do not train,
    saves into an in-memory buffer (`io.BytesIO`), saves followed directly by
    `return` (nothing to overlap with), and saves of whole modules or optimizers
    (the checkpointer would deep-copy them on their device; save `state_dict()`),
    which are reported without a fix.

    A checkpoint perfmod can size and finds small is reported without a fix
    too: the `state_dict()` of models built from `torch.nn` layers with known
    arguments (literals, constants, argparse defaults), optimizer state over
    them, and plain numbers. A save to local disk writes about 1 GB/s with
    its sync, so a checkpoint under 20 MB takes under 20 ms; made once per
    epoch or every few steps, that is less than one slow step, and a
    background writer (a thread, a CPU copy of the state, a flush) is not
    worth its lines. A save that runs on every step is fixed whatever its
    size, and one of unknown size is fixed as before.
    """

    CODE = "PM405"
    NAME = "synchronous-checkpoint-in-loop"
    LEVEL = Level.UNSAFE
    REQUIRES = ("backward",)
    MESSAGE = "torch.save in the training loop stops training until the file is written"
    GAIN = "the write time of every checkpoint (seconds for large models) comes off the training time"

    VALID = [
        Valid(PREAMBLE + LOOP + "torch.save(model.state_dict(), 'final.pt')\n", "after the loop"),
        Valid(
            PREAMBLE + "import io\n" + LOOP + "    buffer = io.BytesIO()\n    torch.save(model.state_dict(), buffer)\n",
            "in-memory buffer, not a checkpoint file",
        ),
        Valid(
            PREAMBLE
            + "def train(path):\n"
            + _indented(LOOP)
            + "        if loss < 0.1:\n            torch.save(model.state_dict(), path)\n            return path\n",
            "returns right after the save: nothing to overlap with",
        ),
        Valid(
            PREAMBLE + "for path in ['a.pt', 'b.pt']:\n    torch.save(model.state_dict(), path)\n",
            "not a training loop",
        ),
        Valid(
            PREAMBLE + LOOP + "    torch.save(model.state_dict(), 'last.pt')  # perfmod: ignore[PM405]\n",
            "suppressed on the line of the save",
        ),
        Valid(
            PREAMBLE + LOOP + "    with open('last.pt', 'wb') as f:  # perfmod: ignore\n"
            "        torch.save(model.state_dict(), f)\n",
            "suppressed on the `with` that opens the file",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + LOOP + "    torch.save(model.state_dict(), f'ckpt_{epoch}.pt')\nprint('done')\n",
            IMPORTS
            + ADDED_IMPORT
            + SETUP
            + "checkpointer = AsyncCheckpointer()\n"
            + LOOP
            + "    checkpointer.save(model.state_dict(), f'ckpt_{epoch}.pt')\ncheckpointer.flush()\nprint('done')\n",
            "built before the loop, flushed after it",
        ),
        Invalid(
            "import torch as th\n"
            + PREAMBLE
            + LOOP
            + "    th.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch},\n"
            "            'last.pt')\n",
            IMPORTS
            + ADDED_IMPORT
            + SETUP
            + "checkpointer = AsyncCheckpointer()\n"
            + LOOP
            + "    checkpointer.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch},\n"
            "            'last.pt')\ncheckpointer.flush()\n",
            "alias of torch; optimizer state included",
        ),
        Invalid(
            "from torch import save\n"
            + PREAMBLE
            + "# train\n"
            + LOOP
            + "    if epoch % 5 == 0:\n        with open(f'ckpt_{epoch}.pt', 'wb') as f:\n"
            "            save(model.state_dict(), f)\n",
            IMPORTS
            + ADDED_IMPORT
            + SETUP
            + "checkpointer = AsyncCheckpointer()\n# train\n"
            + LOOP
            + "    if epoch % 5 == 0:\n        checkpointer.save(model.state_dict(), f'ckpt_{epoch}.pt')\n"
            "checkpointer.flush()\n",
            "`with open(p, 'wb') as f: save(obj, f)` becomes one save of the path",
        ),
        Invalid(
            PREAMBLE
            + "def train(max_epochs):\n"
            + _indented(LOOP)
            + "        torch.save(model.state_dict(), 'last.pt')\n        if epoch == max_epochs: return 'last.pt'\n"
            "    return None\n",
            IMPORTS
            + ADDED_IMPORT
            + SETUP
            + "def train(max_epochs):\n    checkpointer = AsyncCheckpointer()\n"
            + _indented(LOOP)
            + "        checkpointer.save(model.state_dict(), 'last.pt')\n        if epoch == max_epochs:\n"
            "            checkpointer.flush()\n            return 'last.pt'\n    checkpointer.flush()\n    return None\n",
            "flushed before a return that leaves the loop",
        ),
        Invalid(
            PREAMBLE
            + "import shutil\nkeep_best = True\n"
            + LOOP
            + "    torch.save(model.state_dict(), f'ckpt_{epoch}.pt')\n"
            "    if keep_best:\n        shutil.copy(f'ckpt_{epoch}.pt', 'best.pt')\n",
            "import torch\n"
            + ADDED_IMPORT
            + SETUP
            + "import shutil\nkeep_best = True\ncheckpointer = AsyncCheckpointer()\n"
            + LOOP
            + "    checkpointer.save(model.state_dict(), f'ckpt_{epoch}.pt')\n"
            "    if keep_best:\n        checkpointer.flush()\n        shutil.copy(f'ckpt_{epoch}.pt', 'best.pt')\n"
            "checkpointer.flush()\n",
            "the file is copied only when asked: flushed right before that",
        ),
        Invalid(
            PREAMBLE + LOOP + "    torch.save(model, 'model.pt')\n",
            None,
            "a whole module would be deep-copied on its device",
        ),
        Invalid(
            PREAMBLE + "rank = 0\n" + LOOP + "    torch.save(model.state_dict(), f'rank{rank}.pt')\n",
            None,
            "files per rank: the checkpointer writes on rank 0 only",
        ),
        Invalid(
            PREAMBLE
            + "import os\nlocal_rank = int(os.environ.get('LOCAL_RANK', 0))\n"
            + LOOP
            + "    if local_rank == 0:\n        torch.save(model.state_dict(), 'ckpt.pt')\n",
            None,
            "a save per node: the checkpointer would write on global rank 0 only",
        ),
        Invalid(
            PREAMBLE
            + "import shutil\n"
            + LOOP
            + "    path = f'ckpt_{epoch}.pt'\n    torch.save(model.state_dict(), path)\n"
            "    shutil.copy(path, 'best.pt')\n",
            None,
            "the file is read right after the save",
        ),
        Invalid(
            PREAMBLE + "import os\n" + LOOP + "    if os.path.exists('last.pt'):\n        print('resumable')\n"
            "    torch.save(model.state_dict(), 'last.pt')\n",
            None,
            "the next iteration looks at the file",
        ),
        Invalid(
            PREAMBLE + LOOP + "    torch.save(model.state_dict(), 'last.pt', pickle_protocol=4)\n",
            None,
            "an argument the checkpointer does not take",
        ),
        Invalid(
            PREAMBLE + "def train(out):\n" + _indented(LOOP) + "        torch.save(model.state_dict(), out)\n",
            None,
            "`out` may be an open file",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        index = self.context.index
        self._defines_checkpointer_class = any(
            d.name.value == IMPORT[1] for d in index.find((cst.ClassDef, cst.FunctionDef))
        )
        self._taken: set[str] = {n.value for n in index.find(cst.Name)}
        names = self.context.names
        project = project_of(self.context)
        imports_project = project.imports_project()
        calls = [call for call in index.find(cst.Call) if imports_project or "save" in _callee_name(call)]
        by_loop: dict[int, tuple[cst.CSTNode, list]] = {}
        by_helper: dict[cst.FunctionDef, tuple[list, list]] = {}
        for call in calls:
            if not names.is_(call, *TORCH_SAVES):
                handled = self._project_saver(call) if imports_project else False
                if isinstance(handled, tuple):
                    by_loop.setdefault(id(handled[0]), (handled[0], []))[1].append((call, handled[1]))
                    continue
                if handled:
                    continue
                if "save" in _callee_name(call):
                    self._other_saver(call)
                continue
            if self._suppressed(call):
                continue
            loop = self._outer_training_loop(call)
            helper = None
            if loop is None:
                helper = self.context.index.first_enclosing(call, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
                sites = self._loop_sites(helper) if isinstance(helper, cst.FunctionDef) else None
                if not sites:
                    continue  # not run by a training loop (or not only by one)
            try:
                found = self._plan(call, loop, helper, sites if helper is not None else ())
            except _Leave:
                continue
            except _Unfixable as why:
                found = str(why)
            if helper is None:
                by_loop.setdefault(id(loop), (loop, []))[1].append((call, found))
            else:
                by_helper.setdefault(helper, (sites, []))[1].append((call, found))
        for loop, saves in by_loop.values():
            self._fix_loop(loop, saves)
        for helper, (sites, saves) in by_helper.items():
            self._fix_helper(helper, sites, saves)

    def _other_saver(self, call: cst.Call) -> None:
        """Savers AsyncCheckpointer does not stand in for, in a training loop or in a
        function one runs: reported with the reason."""
        names = self.context.names
        func = call.func
        if names.of(call) & SAVE_FUNCTIONS:
            why = (
                f"`{self._code(func)}` writes its own file format (safetensors), which AsyncCheckpointer, "
                "a background torch.save, does not write"
            )
        elif (
            isinstance(func, cst.Attribute)
            and func.attr.value in SAVE_METHODS
            and self.context.loops.callee(call) is None
            and (func.attr.value != "save_pretrained" or self.context.training.is_model(func.value))
        ):
            why = (
                f"`{func.attr.value}` writes a folder of files (weights, configuration) through its library, "
                "which AsyncCheckpointer does not write"
            )
        elif isinstance(func, cst.Attribute) and func.attr.value == "save" and self._is_accelerator(func.value):
            why = "`accelerator.save` coordinates processes itself; AsyncCheckpointer writes on rank 0 only"
        else:
            return
        if self._outer_training_loop(call) is None:
            helper = self.context.index.first_enclosing(call, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
            if not (isinstance(helper, cst.FunctionDef) and self._loop_sites(helper)):
                return
        self.report(
            call,
            f"`{self._code(func)}` in the training loop writes the checkpoint while training waits; "
            f"not fixed: {why}; save it in a background thread by hand",
        )

    def _project_saver(self, call: cst.Call) -> bool | tuple[cst.CSTNode, _Save]:
        """A function of another module of the project that writes a checkpoint, called in a
        training loop (or in a function one runs): (loop, plan) when the checkpointer may run
        it in its background thread (`checkpointer.call(save_checkpoint, ...)`: it only writes
        files and prints, on a snapshot of its arguments, and nothing uses its files before the
        loop ends); else reported with the reason, True; False when it is no such call."""
        if self._outer_training_loop(call) is None:
            helper = self.context.index.first_enclosing(call, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
            if not (isinstance(helper, cst.FunctionDef) and self._loop_sites(helper)):
                return False  # not run by a training loop: no finding, whatever it does
        project = project_of(self.context)
        function = project.called(call)
        saver = project.saver(function) if function is not None else None
        if saver is None or self._suppressed(call):
            return saver is not None
        where = project.shown(function)
        reader = self._path_read_later(call)
        loop = self._outer_training_loop(call)
        flushes = self._wrapper_flush_points(call, loop) if reader is not None and loop is not None else None
        if reader is not None and not flushes:
            self.report(
                call,
                f"`{self._code(call.func)}` ({where}) writes a checkpoint with {saver} while training waits; "
                f"not fixed: the file is used at line {self.context.line(reader)} (`{self._shown(reader)}`), "
                "which would run before a background write of it is done",
            )
            return True
        why = self._background_problem(call, function) if loop is not None else None
        if loop is not None and why is None:
            statement = self.context.index.statement_of(call)
            path = next((a.value for a in call.args if not a.star and self._names_file(a.value)), call.func)
            return loop, _Save(call, statement, path, wrapper=where, flush_before=tuple(flushes or ()))
        self.report(
            call,
            f"`{self._code(call.func)}` ({where}) writes a checkpoint with {saver} while training waits; "
            + (
                f"not fixed: {why}"
                if why is not None
                else "not fixed: it is a function of another module, which perfmod does not rewrite; save in the "
                "background there (e.g. with runtime.checkpoint.AsyncCheckpointer, built once and flushed "
                "after the loop) or call torch.save through an AsyncCheckpointer here"
            ),
        )
        return True

    def _background_problem(self, call: cst.Call, function) -> str | None:
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
        if self._defines_checkpointer_class:
            return "this file defines its own `AsyncCheckpointer`, which the import would shadow"
        if self._shards_state:
            return "this file shards state across ranks, and AsyncCheckpointer writes on rank 0 only"
        statement = self.context.index.statement_of(call)
        if per_node_guard(self.context, statement) is not None:
            return "it runs on the first process of each node, and AsyncCheckpointer writes on global rank 0 only"
        for arg in call.args:
            rank = next((n for n in self.context.index.find(cst.Name, within=arg) if RANK_NAME.search(n.value)), None)
            if rank is not None:
                return f"its arguments depend on `{rank.value}`, and AsyncCheckpointer writes on rank 0 only"
            problem = self._object_problem(arg.value)
            if problem is not None:
                return problem
            if not self._names_file(arg.value) and not self._plain_data(arg.value):
                return (
                    f"perfmod cannot tell whether `{self._code(arg.value)}` names a file the loop uses again, "
                    "or only data to write"
                )
        return None

    def _names_file(self, expr: cst.BaseExpression) -> bool:
        """A file path, or a folder named so (`save_dir`, `args.out_dir`)."""
        if self._is_path(expr):
            return True
        last = expr.attr.value if isinstance(expr, cst.Attribute) else expr.value if isinstance(expr, cst.Name) else ""
        return bool(FOLDER_NAME.search(last))

    def _plain_data(self, expr: cst.BaseExpression) -> bool:
        """A value the checkpointer snapshots and that names no file: a literal, a display, a
        `state_dict()`, or a name bound only to those."""
        if isinstance(expr, (cst.Integer, cst.Float, cst.Dict, cst.DictComp, cst.List, cst.Tuple)):
            return True
        if isinstance(expr, cst.Name):
            if expr.value in ("True", "False", "None"):
                return True
            values = [self._assigned_value(a.node) for a in self._bindings(expr)]
            return bool(values) and all(v is not None and v is not expr and self._plain_data(v) for v in values)
        return (
            isinstance(expr, cst.Call)
            and isinstance(expr.func, cst.Attribute)
            and expr.func.attr.value == "state_dict"
            and not expr.args
        )

    def _wrapper_flush_points(self, call: cst.Call, loop: cst.CSTNode) -> list | None:
        """`_flush_points` for every file path or folder `call` is given."""
        statement = self.context.index.statement_of(call)
        found = []
        for arg in call.args:
            if not arg.star and self._names_file(arg.value):
                if self._later_use(arg.value, statement, loop) is None:
                    continue
                points = self._flush_points(arg.value, statement, loop)
                if points is None:
                    return None
                found += [line for line in points if all(line is not other for other in found)]
        return found or None

    def _path_read_later(self, call: cst.Call) -> cst.CSTNode | None:
        """A use, after `call` or elsewhere in its training loop, of a path `call` is given."""
        statement = self.context.index.statement_of(call)
        loop = self._outer_training_loop(call)
        for arg in call.args:
            if not arg.star and self._names_file(arg.value):
                reader = self._later_use(arg.value, statement, loop)
                if reader is not None:
                    return reader
        return None

    def _is_accelerator(self, expr: cst.BaseExpression) -> bool:
        values = self.context.loops.values_of(expr)
        return (
            any(isinstance(v, cst.Call) and self.context.names.startswith(v.func, ("accelerate",)) for v in values)
            or self.context.names.startswith(expr, ("accelerate",)) is not None
        )

    def _loop_sites(
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
            loop = self._outer_training_loop(call)
            if loop is not None:
                sites.append((loop, (call,)))
                continue
            caller = self.context.index.first_enclosing(call, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
            above = (
                self._loop_sites(caller, depth + 1)
                if isinstance(caller, cst.FunctionDef) and caller is not function
                else None
            )
            if above is None:
                return None
            sites.extend((outer, (*path, call)) for outer, path in above)
        return sites

    # -- where saves are -----------------------------------------------------------------

    def _outer_training_loop(self, call: cst.Call) -> cst.CSTNode | None:
        """The outermost loop around `call` in its function, when it trains (calls
        `.backward()`); the checkpointer lives just outside it."""
        outer = None
        for ancestor in _ancestors(self.context.parents, call):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                break
            if isinstance(ancestor, (cst.For, cst.While)):
                outer = ancestor
        if outer is None or not self.context.loops.is_training_loop(outer):
            return None
        return outer

    def _suppressed(self, call: cst.Call) -> bool:
        """`# perfmod: ignore[PM405]` on the save's line, or on the `with open(...)` around it."""
        line = next((a for a in _ancestors(self.context.parents, call) if isinstance(a, cst.SimpleStatementLine)), None)
        return line is not None and (
            suppressed_on(line, self.CODE) or suppressed_on(_enclosing_with(self.context.parents, line), self.CODE)
        )

    @functools.cached_property
    def _shards_state(self) -> bool:
        return SHARDED_STATE.search(self.context.code) is not None

    # -- one save --------------------------------------------------------------------------

    def _plan(self, call: cst.Call, loop: cst.CSTNode | None, helper: cst.FunctionDef | None = None, sites=()) -> _Save:
        parents = self.context.parents
        obj_arg = kwarg(call, "obj") or positional(call, 0)
        file_arg = _file_argument(call)
        if obj_arg is None or file_arg is None:
            raise _Unfixable("the object and the file are not both given")
        target = file_arg.value
        if self._is_buffer(target):
            raise _Leave
        extra = [a for a in call.args if a is not obj_arg and a is not file_arg]
        if extra:
            raise _Unfixable(
                f"`{self._code(extra[0]).rstrip(', ')}` is an argument AsyncCheckpointer.save does not take"
            )
        expression = parents.get(call)
        line = parents.get(expression)
        if not (isinstance(expression, cst.Expr) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
            raise _Unfixable("the save is not a statement of its own")
        if helper is None and _next_statement_returns(parents, line):
            raise _Leave
        statement, path = line, target
        opened = self._opened_file(target, line)
        if opened is not None:
            statement, path = opened
        elif not self._is_path(target):
            raise _Unfixable(f"perfmod cannot tell that `{self._code(target)}` is a file path and not an open file")
        problem = self._object_problem(obj_arg.value)
        if problem is not None:
            raise _Unfixable(problem)
        sizes = sizes_of(self.context)
        size = sizes.saved_bytes(obj_arg.value)
        if size is not None and size < MIN_SAVE_BYTES and not sizes.every_step(call):
            raise _Unfixable(
                f"the checkpoint holds about {shown(size)} (the parameters and buffers perfmod counts in the "
                f"modules it saves), which torch.save writes in about {save_seconds(size) * 1000:.0f} ms at "
                f"{HARDWARE['save_bytes_per_s'] / 1e9:.0f} GB/s; a save under {MIN_SAVE_S * 1000:.0f} ms that does "
                "not run every step is not worth a background writer"
            )
        if self._defines_checkpointer_class:
            raise _Unfixable("this file defines its own `AsyncCheckpointer`, which the import would shadow")
        if self._shards_state:
            raise _Unfixable(
                "this file shards state across ranks (FSDP or torch.distributed.checkpoint), and "
                "AsyncCheckpointer writes on rank 0 only"
            )
        per_node = per_node_guard(self.context, statement)
        if per_node is not None:
            raise _Unfixable(
                f"the save runs on the first process of each node (`if {self._code(per_node.test)}:`, line "
                f"{self.context.line(per_node)}), and AsyncCheckpointer writes on global rank 0 only: the other "
                "nodes would have no checkpoint"
            )
        rank = next((n for n in self.context.index.find(cst.Name, within=path) if RANK_NAME.search(n.value)), None)
        if rank is not None:
            raise _Unfixable(f"the path depends on `{rank.value}`, and AsyncCheckpointer writes on rank 0 only")
        reader = self._later_use(path, statement, loop)
        if reader is None and helper is not None:
            reader = self._later_use_by_callers(path, helper, sites)
        flushes = None
        if reader is not None and helper is None and loop is not None:
            flushes = self._flush_points(path, statement, loop)
        if reader is not None and not flushes:
            raise _Unfixable(
                f"the file is used at line {self.context.line(reader)} (`{self._code(reader)}`), which can run "
                f"before a background write of it is done"
            )
        return _Save(call, statement, path, flush_before=tuple(flushes or ()))

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
            argument = argument_for(call, helper, param)
            if argument is None:
                return call  # not passed where perfmod can see it
            statement = self.context.index.statement_of(call)
            found = self._later_use(argument, statement, loop) if self._is_path(argument) else argument
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
            raise _Unfixable(f"it writes to the open file `{target.value}`")
        body = statement.body
        if not isinstance(body, cst.IndentedBlock) or list(body.body) != [line]:
            raise _Unfixable(f"`{target.value}` is written to by more than the save")
        if len(self._accesses(target)) != 1:
            raise _Unfixable(f"`{target.value}` is used outside the save")
        call = statement.items[0].item
        mode = kwarg(call, "mode") or positional(call, 1)
        if mode is None or not isinstance(mode.value, cst.SimpleString) or mode.value.evaluated_value != "wb":
            raise _Unfixable("the file is not opened with mode 'wb'")
        path = kwarg(call, "file") or positional(call, 0)
        if path is None:
            raise _Unfixable("perfmod cannot tell which path the file is opened at")
        return statement, path.value

    def _opens_file(self, statement: cst.CSTNode) -> bool:
        calls = [i.item for i in statement.items] if isinstance(statement, cst.With) else [statement.value]
        return any(isinstance(c, cst.Call) and self.context.names.is_(c, "builtins.open", "io.open") for c in calls)

    def _is_path(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` certainly a path (a string or a Path), not an open file?"""
        names = self.context.names
        if isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
            return True
        if isinstance(expr, cst.BinaryOperation):  # "dir/" + name, run_dir / "last.pt", "ckpt_%d.pt" % step
            return self._is_path(expr.left) or self._is_path(expr.right)
        if isinstance(expr, cst.Call):
            if names.of(expr) & PATH_FUNCTIONS:
                return True
            return (
                isinstance(expr.func, cst.Attribute)
                and expr.func.attr.value in PATH_METHODS
                and self._is_path(expr.func.value)
            )
        if isinstance(expr, cst.Attribute):
            return bool(PATH_NAME.search(expr.attr.value))
        if isinstance(expr, cst.Name):
            bindings = self._bindings(expr)
            values = [self._assigned_value(a.node) for a in bindings]
            if values and all(v is not None and self._is_path(v) for v in values):
                return True
            holders = [_binding_statement(self.context.parents, a.node) for a in bindings]
            opened = any(isinstance(h, (cst.With, cst.Assign)) and self._opens_file(h) for h in holders)
            return bool(PATH_NAME.search(expr.value)) and not opened
        return False

    def _object_problem(self, obj: cst.BaseExpression) -> str | None:
        """Why the saved object should not be snapshotted by the checkpointer, or None."""
        values = [obj]
        if isinstance(obj, cst.Name):
            bindings = self._bindings(obj)
            values += [v for v in (self._assigned_value(a.node) for a in bindings) if isinstance(v, cst.Dict)]
        for value in values:
            for part in _container_parts(value):
                kind = self.context.kinds.fact(part).kind
                if kind in DEEP_COPIED_KINDS:
                    return (
                        f"`{self._code(part)}` is a whole {DEEP_COPIED_KINDS[kind]}, which AsyncCheckpointer would "
                        f"deep-copy on its device; save its state_dict() instead"
                    )
        return None

    def _later_use(self, path: cst.BaseExpression, statement: cst.CSTNode, loop: cst.CSTNode) -> cst.CSTNode | None:
        """A use of the saved file that may come after the save: after it in the function, or
        anywhere in the loop (the next iteration): the path variable read (other than to log
        it or to save to it again), or a call that gets the same path expression."""
        index = self.context.index
        after = index.end(statement)
        scope_root = _function_of(self.context.parents, statement) or self.context.module

        loop_end = index.end(loop) if loop is not None else None
        loop_function = _function_of(self.context.parents, loop) if loop is not None else None

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
                loop_end is not None and at > loop_end and _function_of(self.context.parents, node) is loop_function
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

    def _flush_points(self, path: cst.BaseExpression, statement: cst.CSTNode, loop: cst.CSTNode) -> list | None:
        """When every use of the saved file in the loop comes after the save in the same
        iteration, under an `if` that the save is not under (`if upload: wandb.save(path)`):
        the statements a flush goes before, so that the save is waited for only when the
        file is used. None when a use is not such."""
        index = self.context.index
        after = index.end(statement)
        scope_root = _function_of(self.context.parents, statement) or self.context.module
        found = []

        def in_loop(node: cst.CSTNode) -> bool:
            return self.context.inside(node, loop) and not self.context.inside(node, statement)

        for use in self._later_uses(path, statement, in_loop, scope_root):
            if (
                index.order(use) <= after
                or (_function_of(self.context.parents, use) or self.context.module) is not scope_root
            ):
                return None
            guard = next(
                (
                    a
                    for a in _ancestors(self.context.parents, use)
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

    def _harmless_use(self, use: cst.Name) -> bool:
        """A read of the path that does not touch the file: logging it, or saving to it again."""
        for ancestor in _ancestors(self.context.parents, use):
            if isinstance(ancestor, cst.Call):
                if self._logging(ancestor):
                    return True
                file_arg = _file_argument(ancestor)
                if self.context.names.is_(ancestor, *TORCH_SAVES) and file_arg is not None and file_arg.value is use:
                    return True
            if isinstance(ancestor, cst.BaseStatement):
                return False
        return False

    def _logging(self, call: cst.Call) -> bool:
        return bool(self.context.names.of(call) & LOGGING_CALLS) or (
            isinstance(call.func, cst.Attribute) and call.func.attr.value in LOGGING_METHODS
        )

    # -- the fix -------------------------------------------------------------------------

    def _fix_loop(self, loop: cst.CSTNode, saves: list) -> None:
        fixable = [(call, plan) for call, plan in saves if isinstance(plan, _Save)]
        # A synchronous save to the same path could be overwritten by a later background write.
        sync_paths = {
            self._code(_file_argument(c).value): c for c, p in saves if isinstance(p, str) and _file_argument(c)
        }
        for call, plan in list(fixable):
            other = sync_paths.get(self._code(plan.path))
            if other is not None:
                fixable.remove((call, plan))
                saves[saves.index((call, plan))] = (
                    call,
                    f"line {self.context.line(other)} saves to the same path synchronously",
                )
        for call, plan in saves:
            if isinstance(plan, str):
                self.report(call, f"`{self._code(call.func)}` in the training loop stays synchronous: {plan}")
        if not fixable:
            return
        name = self._checkpointer_name()
        # One fix for the loop: the checkpointer, its flushes and every save. Each save's
        # finding carries it (the same edits, made once).
        edits: list[Edit] = [_save_edit(plan, name) for _, plan in fixable]
        for leaving in self.context.index.find(cst.Return, within=loop.body):
            if _function_of(self.context.parents, leaving) is _function_of(self.context.parents, loop):
                edits.append(_flush_before(leaving, name, self.context.parents))
        waits = list({id(line): line for _, plan in fixable for line in plan.flush_before}.values())
        edits += [InsertBefore(line, (_flush_line(name),)) for line in waits]
        build = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], cst.Call(cst.Name(IMPORT[1])))])
        edits += [InsertBefore(loop, (build,)), InsertAfter(loop, (_flush_line(name),))]
        for call, plan in fixable:
            waited = (
                f"; `{name}.flush()` before line {', '.join(str(self.context.line(w)) for w in plan.flush_before)}, "
                "which uses the file"
                if plan.flush_before
                else ""
            )
            self.report(
                call,
                f"`{self._code(call.func)}` ({plan.wrapper}) writes files while training waits, and only that; "
                f"run in the background by `{name}` on a copy of its arguments (the files appear later){waited}"
                if plan.wrapper
                else f"`{self._code(call.func)}` writes the checkpoint while training waits; saved in the "
                f"background by `{name}` (the file appears later){waited}",
                edits=edits,
                imports=[IMPORT],
            )

    def _fix_helper(self, helper: cst.FunctionDef, sites, saves: list) -> None:
        """Saves in a function that training loops run (`save_checkpoint(...)`): one
        checkpointer for the module, built after its imports, each save through it, and a
        flush after every training loop that runs the function."""
        for call, plan in saves:
            if isinstance(plan, str):
                self.report(
                    call,
                    f"`{self._code(call.func)}` in `{helper.name.value}`, which the training loop runs, "
                    f"stays synchronous: {plan}",
                )
        fixable = [(call, plan) for call, plan in saves if isinstance(plan, _Save)]
        if not fixable:
            return
        name = self._checkpointer_name()
        edits: list[Edit] = [_save_edit(plan, name) for _, plan in fixable]
        anchor = self._after_imports()
        build = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], cst.Call(cst.Name(IMPORT[1])))])
        edits.append(
            InsertAfter(anchor, (build,)) if anchor is not None else InsertBefore(self.context.module.body[0], (build,))
        )
        loops = list(dict.fromkeys(loop for loop, _ in sites))
        for loop in loops:
            edits.append(InsertAfter(loop, (_flush_line(name),)))
            for leaving in self.context.index.find(cst.Return, within=loop.body):
                if _function_of(self.context.parents, leaving) is _function_of(self.context.parents, loop):
                    edits.append(_flush_before(leaving, name, self.context.parents))
        first = sites[0][1][0]
        for call, _plan in fixable:
            self.report(
                call,
                f"`{self._code(call.func)}` writes the checkpoint while training waits (`{helper.name.value}` "
                f"runs in the training loop at line {self.context.line(sites[0][0])}, through line "
                f"{self.context.line(first)}); saved in the background by `{name}` (the file appears later)",
                edits=edits,
                imports=[IMPORT],
            )

    def _after_imports(self) -> cst.BaseStatement | None:
        """The last top-level import statement before any other code."""
        found = None
        for statement in self.context.module.body:
            if isinstance(statement, cst.SimpleStatementLine) and all(
                isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
            ):
                found = statement
            elif not (
                isinstance(statement, cst.SimpleStatementLine)
                and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr)
                and isinstance(statement.body[0].value, cst.SimpleString)
            ):
                break
        return found

    def _checkpointer_name(self) -> str:
        taken = self._taken
        name, number = CHECKPOINTER, 1
        while name in taken:
            number += 1
            name = f"{CHECKPOINTER}_{number}"
        taken.add(name)  # one name per checkpointer of this file
        return name

    # -- look-ups --------------------------------------------------------------------------

    def _code(self, node: cst.CSTNode) -> str:
        return self.context.module.code_for_node(node).strip()

    def _shown(self, node: cst.CSTNode) -> str:
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
        for ancestor in _ancestors(self.context.parents, node):
            if isinstance(ancestor, (cst.Call, cst.BaseSmallStatement)):
                return ancestor
        return node


def _ancestors(parents, node: cst.CSTNode):
    current = parents.get(node)
    while current is not None:
        yield current
        current = parents.get(current)


def _function_of(parents, node: cst.CSTNode) -> cst.FunctionDef | None:
    return next((a for a in _ancestors(parents, node) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)


def _binding_statement(parents, target: cst.CSTNode) -> cst.CSTNode:
    current = target
    while True:
        parent = parents.get(current)
        if parent is None or not isinstance(
            parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement, cst.AssignTarget, cst.AsName, cst.WithItem)
        ):
            return parent if parent is not None else current
        current = parent


def _file_argument(call: cst.Call) -> cst.Arg | None:
    """The `f` argument of `torch.save(obj, f)`."""
    return kwarg(call, "f") or positional(call, 1)


def _enclosing_with(parents, line: cst.SimpleStatementLine) -> cst.With | None:
    block = parents.get(line)
    holder = parents.get(block) if isinstance(block, cst.IndentedBlock) else None
    return holder if isinstance(holder, cst.With) else None


def _next_statement_returns(parents, line: cst.SimpleStatementLine) -> bool:
    block = parents.get(line)
    if not isinstance(block, cst.IndentedBlock):
        return False
    statements = list(block.body)
    index = statements.index(line)
    following = statements[index + 1] if index + 1 < len(statements) else None
    return isinstance(following, cst.SimpleStatementLine) and isinstance(following.body[0], cst.Return)


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


def _is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def _save_edit(plan: _Save, name: str) -> Edit:
    """`torch.save(obj, path)` -> `name.save(obj, path)`; a `with open(path, "wb") as f:` around
    the save becomes that one line; a project's `save_checkpoint(a, b)` -> `name.call(save_checkpoint, a, b)`."""
    if plan.wrapper:

        def run(call: cst.Call) -> cst.Call:
            first = cst.Arg(call.func, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return call.with_changes(func=cst.Attribute(cst.Name(name), cst.Name("call")), args=[first, *call.args])

        return Replace(plan.call, run)
    func = cst.Attribute(cst.Name(name), cst.Name("save"))
    if isinstance(plan.statement, cst.SimpleStatementLine):

        def edit(call: cst.Call) -> cst.Call:
            args = [
                a.with_changes(keyword=cst.Name("path")) if a.keyword is not None and a.keyword.value == "f" else a
                for a in call.args
            ]
            return call.with_changes(func=func, args=args)

        return Replace(plan.call, edit)
    obj = kwarg(plan.call, "obj") or positional(plan.call, 0)
    saved = plan.statement.body.body[0]
    call = cst.Call(
        func,
        [
            obj.with_changes(
                keyword=None,
                equal=cst.MaybeSentinel.DEFAULT,
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
            ),
            cst.Arg(plan.path),
        ],
    )
    line = cst.SimpleStatementLine(
        [cst.Expr(call)], leading_lines=plan.statement.leading_lines, trailing_whitespace=saved.trailing_whitespace
    )
    return Replace(plan.statement, line)


def _flush_line(name: str) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Expr(cst.Call(cst.Attribute(cst.Name(name), cst.Name("flush"))))])


def _flush_before(leaving: cst.Return, name: str, parents) -> Edit:
    """Flush before a `return` that leaves the loop: the caller may read the file at once."""
    line = parents.get(leaving)
    if isinstance(line, cst.SimpleStatementLine):
        return InsertBefore(line, (_flush_line(name),))
    # `if done: return path` (a one-line suite) becomes a block with the flush first.
    return Replace(
        line,
        lambda updated: cst.IndentedBlock(
            [_flush_line(name), cst.SimpleStatementLine(updated.body)], header=updated.trailing_whitespace
        ),
    )


def _callee_name(call: cst.Call) -> str:
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else ""

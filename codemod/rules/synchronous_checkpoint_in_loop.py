from __future__ import annotations

import libcst as cst

from codemod.analysis.checkpoints import NotACheckpoint, Save, Synchronous, checkpoints
from codemod.analysis.index import TreeIndex
from codemod.analysis.names import kwarg, positional
from codemod.analysis.project import project_of
from codemod.analysis.torch_facts import TORCH_SAVES
from codemod.edits import Edit, InsertAfter, InsertBefore, Replace
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.suppression import suppressed_on

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

FINAL_SAVE = """\
for step in range(101):
    if step == 100:
        torch.save(model.state_dict(), 'final.pt')
        break
    loss = model(torch.randn(4, 4096).cuda()).sum()
    loss.backward()
    optimizer.step()
"""


def _indented(code: str) -> str:
    return "".join("    " + line for line in code.splitlines(True))


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
      in the loop (copied, uploaded, loaded, returned, checked for), or by
      another function the loop runs (a callback that reloads `self.path`,
      in a method of the same class), and `flush()` runs before the loop is
      left.
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
    saves into an in-memory buffer (`io.BytesIO`), the final save, followed in
    its block or an `if` around it by a `return` or by the `break` that ends
    the training loop, or by a later `if` on the test it ran under whose block
    breaks (`if last_step: save(...)`, then `if last_step: break`; also when
    the save's test holds only with that one, its other parts false at the
    values the script fixes: `if master and (last_step or (args.save_every > 0
    and ...))` with a dataclass field `save_every` left at its default 0):
    nothing to overlap with; and saves of whole modules or optimizers
    (the checkpointer would deep-copy them on their device; save `state_dict()`),
    which are reported without a fix.

    A checkpoint perfmod can size and finds small is reported without a fix
    too: the `state_dict()` of models built from `torch.nn` layers with known
    arguments (literals, constants, argparse defaults), the `state_dict()` of
    an optimizer over them (the tensors torch's optimizers keep per parameter:
    none for plain SGD, one with momentum, two for Adam and AdamW, and so on),
    and plain numbers. When the file is also read back before the background
    write could be done, that is the reason given. A save to local disk writes about 1 GB/s with
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
            PREAMBLE + FINAL_SAVE,
            "the save on the last step, then the break that ends training: nothing to overlap with",
        ),
        Valid(
            PREAMBLE + FINAL_SAVE.replace("        break\n", "    if step == 100:\n        break\n"),
            "the save on the last step, then on that step the break that ends training",
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
        self._checkpoints = checkpoints(self.context)
        self._taken: set[str] = set(self.context.index.spelled_names)
        self._imports_project = project_of(self.context).imports_project()
        self._calls: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        if self._imports_project or "save" in _callee_name(node):
            self._calls.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        """Every save of the file, grouped by the training loop or the function that runs it."""
        names = self.context.names
        imports_project = self._imports_project
        calls = self._calls
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
            loop = self._checkpoints.training_loop(call)
            helper = None
            if loop is None:
                helper = self.context.index.first_enclosing(call, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
                sites = self._checkpoints.loop_sites(helper) if isinstance(helper, cst.FunctionDef) else None
                if not sites:
                    continue  # not run by a training loop (or not only by one)
            try:
                found = self._checkpoints.plan(call, loop, helper, sites if helper is not None else ())
            except NotACheckpoint:
                continue
            except Synchronous as why:
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
        why = self._checkpoints.other_saver(call)
        if why is not None and self._checkpoints.runs_in_training(call):
            self.report(
                call,
                f"`{self._code(call.func)}` in the training loop writes the checkpoint while training waits; "
                f"not fixed: {why}; save it in a background thread by hand",
            )

    def _project_saver(self, call: cst.Call) -> bool | tuple[cst.CSTNode, Save]:
        """A function of another module of the project that writes a checkpoint, called in a
        training loop (or in a function one runs): (loop, plan) when the checkpointer may run
        it in its background thread; else reported with the reason, True; False when it is no
        such call."""
        if not self._checkpoints.runs_in_training(call):
            return False  # not run by a training loop: no finding, whatever it does
        project = project_of(self.context)
        function = project.called(call)
        saver = project.saver(function) if function is not None else None
        if saver is None or self._suppressed(call):
            return saver is not None
        try:
            plan = self._checkpoints.wrapper_plan(call, function)
            why = (
                "it is a function of another module, which perfmod does not rewrite; save in the "
                "background there (e.g. with runtime.checkpoint.AsyncCheckpointer, built once and flushed "
                "after the loop) or call torch.save through an AsyncCheckpointer here"
            )
        except NotACheckpoint:
            return True  # the final save: nothing runs after it to overlap with
        except Synchronous as reason:
            plan, why = None, str(reason)
        if plan is not None:
            return self._checkpoints.training_loop(call), plan
        self.report(
            call,
            f"`{self._code(call.func)}` ({project.shown(function)}) writes a checkpoint with {saver} while "
            f"training waits; not fixed: {why}",
        )
        return True

    def _suppressed(self, call: cst.Call) -> bool:
        """`# perfmod: ignore[PM405]` on the save's line, or on the `with open(...)` around it."""
        index = self.context.index
        line = index.statement_of(call)
        if not isinstance(line, cst.SimpleStatementLine):
            return False
        holder = index.block_owner(line)
        return suppressed_on(line, self.CODE) or suppressed_on(
            holder if isinstance(holder, cst.With) else None, self.CODE
        )

    # -- the fix -------------------------------------------------------------------------

    def _fix_loop(self, loop: cst.CSTNode, saves: list) -> None:
        saves = self._checkpoints.in_one_loop(saves)
        fixable = [(call, plan) for call, plan in saves if isinstance(plan, Save)]
        for call, plan in saves:
            if isinstance(plan, str):
                self.report(call, f"`{self._code(call.func)}` in the training loop stays synchronous: {plan}")
        if not fixable:
            return
        name = self._checkpointer_name()
        # One fix for the loop: the checkpointer, its flushes and every save. Each save's
        # finding carries it (the same edits, made once).
        edits: list[Edit] = [_save_edit(plan, name) for _, plan in fixable]
        for leaving in self.context.index.own_returns(loop.body):
            edits.append(_flush_before(leaving, name, self.context.index))
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
        fixable = [(call, plan) for call, plan in saves if isinstance(plan, Save)]
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
            for leaving in self.context.index.own_returns(loop.body):
                edits.append(_flush_before(leaving, name, self.context.index))
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


def _save_edit(plan: Save, name: str) -> Edit:
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


def _flush_before(leaving: cst.Return, name: str, index: TreeIndex) -> Edit:
    """Flush before a `return` that leaves the loop: the caller may read the file at once."""
    line = index.holding_line(leaving)
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

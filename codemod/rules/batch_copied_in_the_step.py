from __future__ import annotations

import libcst as cst

from codemod.analysis.loaders import ENUMERATE, PIN_MEMORY_POSITION
from codemod.analysis.names import kwarg, method_name, positional
from codemod.analysis.project import project_of
from codemod.analysis.sizes import MIN_COPY_BYTES, sizes_of, small_copy
from codemod.analysis.values import PASS_THROUGH_ITERABLES, Place
from codemod.edits import Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid

IMPORT = ("runtime.data", "DevicePrefetcher")
PIN_MEMORY_RULE = "PM102"

PREAMBLE = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(1024, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8192, 1024), torch.randn(8192, 1)), batch_size=512, pin_memory=True)
"""
NOT_PLAIN_COPIES = (
    "the batch is not copied whole by plain `x = x.to(device)` statements at the top of the loop, so perfmod "
    "cannot tell the prefetched batch would be used the same way"
)
STEP = "    loss = torch.nn.functional.mse_loss(model(x), y)\n    loss.backward()\n    opt.step()\n"


def _imported(code: str) -> str:
    """`code` with the import the fix adds, where the engine puts it: sorted into the
    third-party imports, a blank line after them."""
    last = "from torch.utils.data import DataLoader, TensorDataset\n"
    code = code.replace(last, last + "\n", 1)
    return code.replace("import torch\n", "import torch\nfrom runtime.data import DevicePrefetcher\n", 1)


class BatchCopiedInTheStep(Rule):
    """
    ## What it does
    Finds loops over a pinned `torch.utils.data.DataLoader` that copy each
    batch to the device at the top of the step (`x, y = x.to(device),
    y.to(device)`), and iterates over `runtime.data.DevicePrefetcher(loader,
    device)` instead, which hands out batches already on the device; the copy
    statements go.

    ## Why is this bad?
    Even a `non_blocking=True` copy from pinned memory is queued on the same
    stream as the step's kernels: the copy of batch k+1 cannot start before the
    step k that was queued ahead of it has finished, and when the loop
    synchronizes every step (`loss.item()`, logging) the GPU waits for each
    copy. `DevicePrefetcher` queues the copy of the next batch on a side CUDA
    stream while the current step computes, and makes the step's stream wait
    for exactly that copy (an event, plus `record_stream` so the memory is not
    reused early). The gain is the host-to-device copy time of each batch,
    hidden behind the previous step's compute: largest in input-heavy loops
    (large images, long sequences); nothing on the CPU, where the prefetcher is
    plain iteration.

    A hand-written prefetch (`next_batch = next(it).to(device,
    non_blocking=True)` before the step, on the default stream) frees the host
    but does not overlap the copy with compute, because one CUDA stream runs
    its work in order: the copy runs before the forward queued after it.
    Overlap needs the copy on another stream, and then the wait and
    `record_stream` that DevicePrefetcher does. Such loops are reported.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=64, pin_memory=True)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = loss_fn(model(x), y)
    ```
    Use instead:
    ```python
    from runtime.data import DevicePrefetcher

    loader = DataLoader(dataset, batch_size=64, pin_memory=True)
    for x, y in DevicePrefetcher(loader, device):
        loss = loss_fn(model(x), y)
    ```

    Batches perfmod can size (a `TensorDataset` of tensors of known shape,
    made by factories or computed from such tensors by slicing, indexing,
    elementwise arithmetic, reductions over given dims, casts and reshapes,
    or written out in `torch.tensor([[...]])`; a Dataset class whose
    `__getitem__` returns such tensors or windows of a tokenizer's ids,
    `ids[i:i + max_length]`; a torchvision dataset of one image size such
    as MNIST or CIFAR-10 after its transforms, times the batch size) and
    finds small are reported
    without a fix: a host-to-device copy runs at about 25 GB/s from pinned
    memory, so a batch under 1.25 MB copies in under 50 us, the time the host
    takes to launch ten kernels. Hiding that behind the previous step saves
    less than the prefetcher's own stream and event bookkeeping costs; an
    MNIST batch of 64 images (200 KB, 8 us) is such a batch.

    ## Fix safety
    Unsafe. The batches have the same values on the same device (on the CPU
    the prefetcher hands out the loader's own batches; tested on CUDA in
    `tests/runtime/test_data.py`); what changes is when the loader is asked for
    a batch: one batch ahead of the step. A dataset or `collate_fn` that draws
    random numbers in the training process (`num_workers=0`) then draws them
    interleaved differently with the model's dropout; a loop that `break`s
    early has loaded one batch more; the GPU holds one batch more.

    It is fixed only when the rule can prove the rewrite moves the same
    tensors: the loop iterates a DataLoader of this file (directly, through
    `enumerate`, `iter` or `tqdm`), every name the loop binds for the batch is
    copied by a statement `x = x.to(device)` / `x.cuda()` (`non_blocking`
    allowed, nothing else), `batch = [t.to(device) for t in batch]` or
    `batch = {k: v.to(device) for k, v in batch.items()}` of the loop body
    itself, or by a statement that hands the batch to a function or method of
    this file that returns nothing but such a copy of it (`x, y =
    self._to_device(batch)` with `return [t.to(self.device) for t in batch]`,
    which becomes `x, y = batch`), to one device expression bound before the
    loop (the helper's `self.device` is the trainer's, a device parameter the
    argument it is given), and no statement before its copy uses it; the
    loader has the default `collate_fn` (or `default_collate`, `PadCollate`),
    so a batch holds only tensors, mappings
    and sequences; it is pinned (`pin_memory` passed and not `False`, or added
    by PM102 in the same run; without it the copies cannot overlap) and not a
    subclass overriding `__iter__`. A loop whose copies match but whose loader
    is not pinned (PM102 not selected, or unable to pin it) is reported
    without a fix, and so is a training loop that copies the batches of a
    loader built elsewhere (a parameter annotated `DataLoader`, a loader made by
    another module of the project), whose pinning and batches perfmod cannot
    check. A loader handed back by a training engine that puts each batch on
    its device itself (Accelerate's `accelerator.prepare(loader)`, Fabric's
    `fabric.setup_dataloaders(loader)`, their device placement left on) gets no
    finding: its batches are on the device when the step copies them, so that
    copy copies nothing, and a prefetcher would find nothing left to copy.
    """

    CODE = "PM103"
    NAME = "batch-copied-in-the-step"
    LEVEL = Level.UNSAFE
    REQUIRES = ("DataLoader",)
    # PM202 turns hand-made batching into a DataLoader loop, which this rule then
    # prefetches: it runs on PM202's output, so that one run leaves nothing pending.
    AFTER = ("PM202",)
    MESSAGE = (
        "each batch is copied to the device inside the step; prefetch it on a side stream while the previous step runs"
    )
    GAIN = "hides the host-to-device copy of every batch behind the previous step's compute"

    VALID = [
        Valid(
            PREAMBLE.replace('torch.device("cuda" if torch.cuda.is_available() else "cpu")', '"cpu"')
            + "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n"
            + STEP,
            "copies to the CPU: nothing to prefetch",
        ),
        Valid(PREAMBLE + "for x, y in loader:\n    print(x.sum())\n", "no copy"),
        Valid(
            PREAMBLE
            + "from accelerate import Accelerator\naccelerator = Accelerator()\nloader = accelerator.prepare(loader)\n"
            + "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n"
            + STEP,
            "Accelerate puts each batch on the device inside the loader: the copies copy nothing",
        ),
        Valid(
            PREAMBLE + "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n    print(model(x).sum())\n",
            "not a training loop",
        ),
    ]
    INVALID = [
        # Copies in the step that the fix cannot prove it may replace: reported without a fix.
        Invalid(
            PREAMBLE + "for x, y in loader:\n    print(x.shape)\n    x, y = x.to(device), y.to(device)\n" + STEP,
            None,
            "the batch is used before its copy",
        ),
        Invalid(
            PREAMBLE + "for x, y in loader:\n    x = x.to(device)\n" + STEP,
            None,
            "y is not copied: it stays on the host",
        ),
        Invalid(
            PREAMBLE + "for x, y in loader:\n    x, y = x.to(device, torch.float16), y.to(device)\n" + STEP,
            None,
            "a copy that also converts",
        ),
        Invalid(PREAMBLE + "for x, y in loader:\n    x, y = x.cuda(), y.to(device)\n" + STEP, None, "two devices"),
        Invalid(
            PREAMBLE + "import sys\nbatches = loader if sys.argv else [(torch.randn(8, 8), torch.randn(8, 1))]\n"
            "for x, y in batches:\n    x, y = x.to(device), y.to(device)\n" + STEP,
            None,
            "not only a loader",
        ),
        Invalid(
            PREAMBLE + "for batch in loader:\n    batch = [t.to(device) for t in batch if t.dim() > 1]\n"
            "    x, y = batch\n" + STEP,
            None,
            "a comprehension that filters",
        ),
        Invalid(
            PREAMBLE.replace("pin_memory=True", "pin_memory=True, collate_fn=lambda b: b")
            + "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n"
            + STEP,
            None,
            "a custom collate_fn",
        ),
        Invalid(
            PREAMBLE + "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n    device = 'cpu'\n" + STEP,
            None,
            "the device is bound in the loop",
        ),
        Invalid(
            PREAMBLE
            + "def step(batch):\n    x, y = batch\n    x, y = x.to(device), y.to(device)\n"
            + STEP.replace("    ", "    ")
            + "for batch in loader:\n    step(batch)\n",
            None,
            "copied in a function the step calls",
        ),
        Invalid(
            PREAMBLE
            + "def to_device(batch, device):\n    return [t.to(device, non_blocking=True) for t in batch]\n\n"
            + "for batch in loader:\n    x, y = to_device(batch, device)\n"
            + STEP,
            _imported(PREAMBLE + "\nfor batch in DevicePrefetcher(loader, device):\n    x, y = batch\n" + STEP),
            "a helper that returns the batch copied whole: the batch is bound as it comes, and the helper, "
            "used nowhere else, goes",
        ),
        Invalid(
            PREAMBLE + "it = iter(loader)\nnext_x, next_y = next(it)\nfor _ in range(len(loader) - 1):\n"
            "    x, y = next_x.to(device, non_blocking=True), next_y.to(device, non_blocking=True)\n"
            "    next_x, next_y = next(it)\n" + STEP,
            None,
            "a hand-written prefetch: the copy still runs on the step's stream",
        ),
        Invalid(
            PREAMBLE
            + "for x, y in loader:\n    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)\n"
            + STEP,
            _imported(PREAMBLE + "for x, y in DevicePrefetcher(loader, device):\n" + STEP),
        ),
        Invalid(
            PREAMBLE + "for step, (x, y) in enumerate(loader):\n    # a fresh step\n    opt.zero_grad()\n"
            "    # move data to the same device\n    x = x.to(device)\n    y = y.to(device)  # targets too\n"
            "    # forward\n" + STEP,
            _imported(
                PREAMBLE + "for step, (x, y) in enumerate(DevicePrefetcher(loader, device)):\n"
                "    # a fresh step\n    opt.zero_grad()\n    # forward\n" + STEP
            ),
            "through enumerate, copies after a statement that does not touch the batch",
        ),
        Invalid(
            PREAMBLE + "for batch in loader:\n    batch = [t.to(device, non_blocking=True) for t in batch]\n"
            "    x, y = batch\n" + STEP,
            _imported(PREAMBLE + "for batch in DevicePrefetcher(loader, device):\n    x, y = batch\n" + STEP),
            "a list comprehension over the batch",
        ),
        Invalid(
            PREAMBLE + "for x, y in loader:\n    x, y = x.cuda(), y.cuda()\n" + STEP,
            _imported(PREAMBLE + 'for x, y in DevicePrefetcher(loader, "cuda"):\n' + STEP),
            ".cuda() copies",
        ),
        Invalid(
            PREAMBLE.replace(", pin_memory=True", "")
            + "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n"
            + STEP,
            None,
            "an unpinned loader: pin it first (PM102)",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        loaders = self.context.loaders
        if not loaders.feeds:
            return
        done: set[int] = set()
        refused: dict[int, str] = {}  # id(loop) -> why its copies are not rewritten
        for loop in loaders.training_loops if loaders.constructions else ():
            why = self._check(loop)
            if why is None:
                done.add(id(loop))
            else:
                refused[id(loop)] = why
        for feed in loaders.feeds:
            if id(feed.loop) in done or not loaders.trains(feed.loop) or feed.placed is not None:
                continue  # batches the loader puts on the device itself: their copies copy nothing
            copies = loaders.copies_to_device(feed.loop, feed.target)
            if not copies:
                continue
            done.add(id(feed.loop))
            first = copies[0].call
            line = self.context.line(first)
            helper = self.context.index.first_enclosing(first, cst.FunctionDef)
            where: cst.CSTNode = first
            small = self._small_batches(feed.loader)
            if small is not None:
                why = f"{self.MESSAGE} (line {line}); not rewritten: {small}, so prefetching it hides next to nothing"
            elif feed.fetch is not None:
                why = (
                    f"each batch is taken with `next()` and copied to the device in the step (line {line}): on "
                    "the step's stream, so the copy cannot overlap with compute, even when fetched a step ahead; "
                    "iterate over `runtime.data.DevicePrefetcher(loader, device)`, which copies the next batch "
                    "on a side stream"
                )
            elif not loaders.is_construction_here(feed.loader):
                why = (
                    f"{self.MESSAGE} (line {line}); not rewritten: the DataLoader is built elsewhere (passed in, "
                    "or made by another module of the project), where perfmod cannot check that it is pinned and "
                    "yields plain batches of tensors; iterate over `runtime.data.DevicePrefetcher(loader, device)` "
                    "if it does"
                )
            elif helper is not None and not self.context.inside(first, feed.loop):
                where = feed.loop  # the loop the batch is copied in, through a function it calls
                why = (
                    f"each batch is copied to the device inside the step, in `{helper.name.value}` (line {line}); "
                    "prefetch it on a side stream while the previous step runs (`runtime.data.DevicePrefetcher("
                    "loader, device)`); not rewritten: the copies are made in a function the loop calls"
                )
            else:
                why = f"{self.MESSAGE} (line {line}); not rewritten: {refused.get(id(feed.loop), NOT_PLAIN_COPIES)}"
            self.report(where, why)

    def _small_batches(self, loader: cst.BaseExpression) -> str | None:
        """Why prefetching the batches of `loader` hides next to nothing: every loader it may be
        holds batches known to copy faster than ten kernel launches; None otherwise."""
        size = sizes_of(self.context).largest_batch_bytes(loader)
        return small_copy(size) if size is not None and size < MIN_COPY_BYTES else None

    def _check(self, loop: cst.For) -> str | None:
        """Fix the loop, or report why it is not fixed; None when done, else the reason its
        copies are not rewritten, for the report of the loop's copies."""
        loaders = self.context.loaders
        found = self._loader_and_batch(loop.iter, loop.target)
        if found is None:
            return (
                f"the loop iterates `{self.context.source(loop.iter)}`, not one DataLoader of this file (directly, "
                "or through enumerate, iter or tqdm)"
            )
        loader_expr, batch = found
        if loaders.placing_setup(loader_expr) is not None:
            return None  # the loader puts each batch on the device itself: nothing to prefetch
        names = _batch_names(batch)
        if names is None or not isinstance(loop.body, cst.IndentedBlock):
            return NOT_PLAIN_COPIES
        copies = self._copy_statements(loop, names)
        if isinstance(copies, str):
            return copies
        removals, device = copies
        if self.context.kinds.device_place(device) is Place.HOST:
            return None  # copies to the CPU: nothing to prefetch
        sources = loaders.sources(loader_expr, (), 0)
        if not sources:
            return NOT_PLAIN_COPIES
        for loader in sources:
            why = self._not_plain_batches(loader)
            if why is not None:
                return why
        if not all(self._is_pinned(loader) for loader in sources):
            line = self.context.line(sources[0])
            self.report(
                loop,
                self.MESSAGE + f"; the DataLoader on line {line} is not pinned, so the copies could not "
                "overlap: pass pin_memory (PM102) and run again",
            )
            return None

        small = self._small_batches(loader_expr)
        if small is not None:
            self.report(loop, f"{self.MESSAGE}; not rewritten: {small}, so prefetching it hides next to nothing")
            return None

        def prefetched(updated: cst.BaseExpression) -> cst.Call:
            return cst.Call(
                func=cst.Name("DevicePrefetcher"),
                args=[
                    cst.Arg(updated, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    cst.Arg(device.deep_clone()),
                ],
            )

        edits = [Replace(loader_expr, prefetched), *removals]
        self.report(loop, self.MESSAGE, edits=edits, imports=[IMPORT])
        return None

    # -- the loop ----------------------------------------------------------------------------

    def _loader_and_batch(self, iterable: cst.BaseExpression, target: cst.BaseExpression):
        """(the expression of the loader the loop iterates, the part of the target bound to
        its batches), through enumerate, iter and tqdm; None for anything else."""
        names = self.context.names
        if isinstance(iterable, cst.Call):
            args = [a for a in iterable.args if a.keyword is None and not a.star]
            if (
                names.is_(iterable.func, *ENUMERATE)
                and args
                and isinstance(target, cst.Tuple)
                and len(target.elements) == 2
            ):
                return self._loader_and_batch(args[0].value, target.elements[1].value)
            if names.is_(iterable.func, *PASS_THROUGH_ITERABLES) and args:
                return self._loader_and_batch(args[0].value, target)
        if self.context.loaders.only_loaders(iterable, (), 0):
            return iterable, target
        return None

    def _copy_statements(self, loop: cst.For, names: list[str]):
        """(the edits that take the loop body's copies of the batch out, the device expression)
        when every batch name is copied to one device before any other use; else why not. A
        copy statement goes; a batch copied whole by a helper of this file and bound to other
        names (`x, y = self._to_device(batch)`) is bound to them as it comes (`x, y = batch`)."""
        pending, edits, devices, removed = set(names), [], [], 0
        body = loop.body.body
        for statement in body:
            if not pending:
                break
            copied = self._copied_names(statement)
            if copied is not None and set(copied) <= pending:
                pending -= set(copied)
                edits.append(Remove(statement, supersedes=True))
                removed += 1
                devices.extend(copied.values())
                continue
            helped = self._helper_copy(statement, pending)
            if helped is not None:
                name, device, taken_out = helped
                pending.discard(name)
                edits.extend(taken_out)
                removed += isinstance(taken_out[0], Remove)
                devices.append(device)
                continue
            if self.context.index.variable_names(statement) & pending:
                return NOT_PLAIN_COPIES
        if pending or removed == len(body):
            return NOT_PLAIN_COPIES
        codes = list(dict.fromkeys(self.context.source(device) for device in devices))
        if len(codes) != 1:
            return f"the batch is copied to more than one device ({', '.join(f'`{code}`' for code in codes)})"
        device = devices[0]
        if not isinstance(device, cst.SimpleString) and not self.context.training.defined_before(device, loop):
            return (
                f"the device `{codes[0]}` is bound inside the loop, and the prefetcher, built before the loop, "
                "would copy to the one bound before it"
            )
        return edits, device

    def _helper_copy(self, statement: cst.BaseStatement, pending: set[str]):
        """(the batch name, the device, the edits) for `batch = to_device(batch)` or `x, y =
        self._to_device(batch)`, where the function or method of this file returns nothing but
        a whole copy of the parameter it is given the batch in (`return [t.to(self.device) for t
        in batch]`): the device as the loop spells it (the argument given for a parameter,
        `self.device` through the receiver, a string); None for anything else."""
        if not (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign)
            and len(statement.body[0].targets) == 1
            and isinstance(statement.body[0].value, cst.Call)
        ):
            return None
        call, target = statement.body[0].value, statement.body[0].targets[0].target
        kinds = self.context.kinds
        helper = kinds.local_callee(call)
        if helper is None or not isinstance(helper.body, cst.IndentedBlock) or len(helper.body.body) != 1:
            return None
        returned = kinds.returned(helper)
        offset = kinds.receiver_offset(call, helper)
        params = [*helper.params.posonly_params, *helper.params.params, *helper.params.kwonly_params]
        for param in params:
            given = kinds.argument(call, helper, param, offset)
            if not (isinstance(given, cst.Name) and given.value in pending and len(returned) == 1):
                continue
            name = param.name.value
            device = self._copy_device(returned[0], name) or self._comprehension_device(returned[0], name)
            device = self._as_called(device, call, helper, offset) if device is not None else None
            if device is None:
                return None
            if _is_name(target, given.value):
                edit = Remove(statement, supersedes=True)
            else:
                edit = Replace(call, cst.Name(given.value))
            return given.value, device, (edit, *self._unused_after(helper, call))
        return None

    def _unused_after(self, helper: cst.FunctionDef, call: cst.Call) -> tuple[Remove, ...]:
        """The removal of `helper`, a module-level function, when `call` is its one use in this
        project: once the call goes, it would be dead code."""
        module = self.context.index.first_enclosing(helper, (cst.FunctionDef, cst.ClassDef)) is None
        callers = self.context.kinds.callers(helper)
        if not module or callers is None or [c for c, _ in callers] != [call]:
            return ()
        if project_of(self.context).called_from_importers(helper):
            return ()
        return (Remove(helper),)

    def _as_called(self, device: cst.BaseExpression, call: cst.Call, helper: cst.FunctionDef, offset):
        """`device`, as a helper spells it, in the terms of the code that calls it: a string as
        it is, a parameter as the argument `call` gives it, `self.device` through the instance
        the method is called on; None for anything else (a name of the helper's own scope)."""
        if isinstance(device, cst.SimpleString):
            return device
        params = [*helper.params.posonly_params, *helper.params.params, *helper.params.kwonly_params]
        if isinstance(device, cst.Name):
            param = next((p for p in params if p.name.value == device.value), None)
            return self.context.kinds.argument(call, helper, param, offset) if param is not None else None
        if (
            isinstance(device, cst.Attribute)
            and isinstance(device.value, cst.Name)
            and offset == 1
            and params
            and device.value.value == params[0].name.value
            and isinstance(call.func, cst.Attribute)
        ):
            return device.with_changes(value=call.func.value)
        return None

    def _copied_names(self, statement: cst.BaseStatement) -> dict[str, cst.BaseExpression] | None:
        """{name: device} for `x = x.to(device)` and `x, y = x.to(device), y.to(device)`."""
        if not (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign)
            and len(statement.body[0].targets) == 1
        ):
            return None
        assign = statement.body[0]
        target, value = assign.targets[0].target, assign.value
        if isinstance(target, cst.Name):
            pairs = [(target, value)]
        elif (
            isinstance(target, (cst.Tuple, cst.List))
            and isinstance(value, (cst.Tuple, cst.List))
            and len(target.elements) == len(value.elements)
        ):
            pairs = [(t.value, v.value) for t, v in zip(target.elements, value.elements)]
        else:
            return None
        copied = {}
        for name, call in pairs:
            if not isinstance(name, cst.Name) or name.value in copied:
                return None
            device = self._copy_device(call, name.value) or self._comprehension_device(call, name.value)
            if device is None:
                return None
            copied[name.value] = device
        return copied

    def _comprehension_device(self, value: cst.BaseExpression, name: str) -> cst.BaseExpression | None:
        """The device of `[t.to(device) for t in name]` (or `tuple(...)` of the generator) and
        `{k: v.to(device) for k, v in name.items()}`: a batch that is a list or dict of tensors,
        copied whole (a value that is not a tensor would have no `.to`, so every value is one)."""
        built = isinstance(value, cst.Call) and len(value.args) == 1 and not value.args[0].keyword
        if built and self.context.names.is_(value.func, "builtins.list", "builtins.tuple"):
            value = value.args[0].value  # `tuple(t.to(device) for t in batch)`
            if not isinstance(value, cst.GeneratorExp):
                return None
        elif not isinstance(value, (cst.ListComp, cst.DictComp)):
            return None
        loop = value.for_in
        if loop.ifs or loop.inner_for_in is not None or loop.asynchronous is not None:
            return None
        if isinstance(value, (cst.ListComp, cst.GeneratorExp)):
            if not (isinstance(loop.target, cst.Name) and _is_name(loop.iter, name)):
                return None
            return self._copy_device(value.elt, loop.target.value)
        pair = loop.target
        if not (
            isinstance(pair, cst.Tuple)
            and len(pair.elements) == 2
            and all(isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in pair.elements)
        ):
            return None
        items = loop.iter
        if not (
            isinstance(items, cst.Call)
            and not items.args
            and method_name(items) == "items"
            and _is_name(items.func.value, name)
        ):
            return None
        key, item = (element.value.value for element in pair.elements)
        if not _is_name(value.key, key) or key == item:
            return None
        return self._copy_device(value.value, item)

    def _copy_device(self, call: cst.BaseExpression, name: str) -> cst.BaseExpression | None:
        """The device of `name.to(device[, non_blocking=...])` / `name.cuda([non_blocking=...])`."""
        if not (
            isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and _is_name(call.func.value, name)
        ):
            return None
        if any(
            arg.star or (arg.keyword is not None and arg.keyword.value not in ("device", "non_blocking"))
            for arg in call.args
        ):
            return None
        method = method_name(call)
        if method == "cuda":
            return cst.SimpleString('"cuda"') if positional(call, 0) is None else None
        if method != "to" or positional(call, 1) is not None:
            return None
        device = kwarg(call, "device") or positional(call, 0)
        if device is None:
            return None
        copy = self.context.kinds.copy_of(call)
        if copy is not None:
            return device.value if copy.moves_device else None
        return device.value if self.context.loaders.device_copy_place(device.value) is not None else None

    # -- the loader --------------------------------------------------------------------------

    def _not_plain_batches(self, loader: cst.Call) -> str | None:
        """Why the loader's batches may not be what the prefetcher copies (tensors, mappings
        and sequences of them, collated on the host), if they may not."""
        loaders, source = self.context.loaders, self.context.source
        built = f"the DataLoader on line {self.context.line(loader)}"
        if loaders.overridden_subclass(loader):
            return f"{built} is a class of this file that overrides `__init__` or `__iter__`"
        collate = loaders.collate(loader)
        if collate is not None and loaders.collate_moves_to_device(loader):
            return (
                f"the collate_fn `{source(collate)}` of {built} puts each batch on the device itself, inside the "
                "loader, and the prefetcher copies batches from the host: keep the collate_fn's tensors on the host "
                "and the copy can overlap the previous step"
            )
        if collate is not None and not loaders.collates_tensors(collate, 0):
            return (
                f"{built} batches with its own collate_fn `{source(collate)}`, which perfmod cannot tell returns "
                "only tensors and mappings or sequences of them (what the prefetcher copies)"
            )
        if any(arg.star for arg in loader.args):
            literal = loaders.star_kwargs_keys(loader, either=True)
            if literal is None or "collate_fn" in literal:
                return f"{built} takes settings from a `**` dict that may give it a collate_fn"
        if loaders.may_hold_device_data(loaders.dataset(loader), 0):
            return f"the dataset of {built} may hold tensors already on a device, which the prefetcher does not take"
        return None

    def _is_pinned(self, loader: cst.Call) -> bool:
        """Is `pin_memory` passed and not False, or will PM102, selected in this run, pass it?"""
        loaders = self.context.loaders
        pin = kwarg(loader, "pin_memory") or (
            positional(loader, PIN_MEMORY_POSITION) if loaders.is_torch_loader(loader) else None
        )
        if pin is not None:
            return not _is_name(pin.value, "False")
        keys = loaders.star_kwargs_keys(loader, either=True)
        if keys is not None and "pin_memory" in keys:
            return True
        return self.context.settings.enabled(PIN_MEMORY_RULE, self.context.path) and loaders.pinnable(loader)


def _is_name(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _batch_names(target: cst.BaseExpression) -> list[str] | None:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)) and all(
        isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements
    ):
        names = [e.value.value for e in target.elements]
        return names if len(set(names)) == len(names) else None
    return None

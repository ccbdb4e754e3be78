from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from codemod.analysis.kinds import DEVICE_NAME, PASS_THROUGH_ITERABLES
from codemod.analysis.bindings import returned_values
from codemod.analysis.loaders import (
    COLLATE_FN_POSITION,
    DATALOADER,
    MAX_DEPTH,
    PIN_MEMORY_POSITION,
    LoaderLookups,
    memoized,
)
from codemod.analysis.names import kwarg, method_name, names_read, positional
from codemod.rule import Invalid, Level, Rule, Valid

IMPORT = ("runtime.data", "DevicePrefetcher")
# collate_fns whose batches hold only tensors, mappings and sequences (the prefetcher moves
# every tensor in them, as the loop's copies did); a custom one may return objects it cannot see into.
KNOWN_COLLATES = {"torch.utils.data.default_collate", "torch.utils.data.dataloader.default_collate",
                  "runtime.data.PadCollate", "runtime.PadCollate"}
ENUMERATE = ("enumerate", "builtins.enumerate")
PIN_MEMORY_RULE = "PM102"

PREAMBLE = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(8, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8, pin_memory=True)
"""
STEP = "    loss = torch.nn.functional.mse_loss(model(x), y)\n    loss.backward()\n    opt.step()\n"


def _imported(code: str) -> str:
    """`code` with the import the fix adds, where the engine puts it: after the last import."""
    last = "from torch.utils.data import DataLoader, TensorDataset\n"
    return code.replace(last, last + "from runtime.data import DevicePrefetcher\n\n", 1)


class BatchCopiedInTheStep(LoaderLookups, Rule):
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
    reused early). Typical gain: the whole host-to-device copy time per step in
    input-heavy loops (large images, long sequences); nothing on the CPU, where
    the prefetcher is plain iteration.

    Checked against torch 2.13: the seed reports' hand-written prefetch
    (`next_batch = next(it).to(device, non_blocking=True)` before the step,
    on the default stream) frees the host but does not overlap the copy with
    compute, because one CUDA stream runs its work in order: the copy runs
    before the forward queued after it. Overlap needs the copy on another
    stream, and then the wait and `record_stream` that DevicePrefetcher does.

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
    `batch = {k: v.to(device) for k, v in batch.items()}` of the loop body itself, to one device expression
    bound before the loop, and no statement before its copy uses it; the
    loader has the default `collate_fn` (or `default_collate`, `PadCollate`),
    so a batch holds only tensors, mappings and sequences; it is pinned
    (`pin_memory` passed and not `False`, or PM102 selected in the same run,
    which adds it: without it the copies cannot overlap) and not a subclass
    overriding `__iter__`. A loop whose copies match but whose loader is not
    pinned, with PM102 not selected, is reported without a fix: run PM102
    first, since once the copies are gone from the loop PM102 no longer sees
    that the batches go to CUDA.
    """

    CODE = "PM103"
    NAME = "batch-copied-in-the-step"
    LEVEL = Level.UNSAFE
    REQUIRES = ("DataLoader",)
    MESSAGE = "each batch is copied to the device inside the step; prefetch it on a side stream while the previous step runs"
    GAIN = "hides the host-to-device copy of every batch behind the previous step's compute"

    VALID = [
        Valid(PREAMBLE + "for x, y in loader:\n    print(x.sum())\n", "no copy"),
        Valid(PREAMBLE + "for x, y in loader:\n    print(x.shape)\n    x, y = x.to(device), y.to(device)\n" + STEP,
              "the batch is used before its copy"),
        Valid(PREAMBLE + "for x, y in loader:\n    x = x.to(device)\n" + STEP, "y is not copied: it stays on the host"),
        Valid(PREAMBLE + "for x, y in loader:\n    x, y = x.to(device, torch.float16), y.to(device)\n" + STEP,
              "a copy that also converts"),
        Valid(PREAMBLE + "for x, y in loader:\n    x, y = x.cuda(), y.to(device)\n" + STEP, "two devices"),
        Valid(PREAMBLE + "import sys\nbatches = loader if sys.argv else [(torch.randn(8, 8), torch.randn(8, 1))]\n"
              "for x, y in batches:\n    x, y = x.to(device), y.to(device)\n" + STEP, "not only a loader"),
        Valid(PREAMBLE + "for batch in loader:\n    batch = [t.to(device) for t in batch if t.dim() > 1]\n"
              "    x, y = batch\n" + STEP, "a comprehension that filters"),
        Valid(PREAMBLE.replace("pin_memory=True", "pin_memory=True, collate_fn=lambda b: b") +
              "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n" + STEP, "a custom collate_fn"),
        Valid(PREAMBLE + "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n    device = 'cpu'\n" + STEP,
              "the device is bound in the loop"),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + "for x, y in loader:\n    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)\n"
            + STEP,
            _imported(PREAMBLE + "for x, y in DevicePrefetcher(loader, device):\n" + STEP),
        ),
        Invalid(
            PREAMBLE + "for step, (x, y) in enumerate(loader):\n    opt.zero_grad()\n    # to the GPU\n"
            "    x = x.to(device)\n    y = y.to(device)\n" + STEP,
            _imported(PREAMBLE + "for step, (x, y) in enumerate(DevicePrefetcher(loader, device)):\n"
                      "    opt.zero_grad()\n    # to the GPU\n" + STEP),
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
            _imported(PREAMBLE + "for x, y in DevicePrefetcher(loader, \"cuda\"):\n" + STEP),
            ".cuda() copies",
        ),
        Invalid(
            PREAMBLE.replace(", pin_memory=True", "") + "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n"
            + STEP,
            None,
            "an unpinned loader: pin it first (PM102)",
        ),
    ]

    def leave_Module(self, original_node: cst.Module) -> None:
        for loop in self.loops:
            self._check(loop)

    def _check(self, loop: cst.For) -> None:
        found = self._loader_and_batch(loop.iter, loop.target)
        if found is None:
            return
        loader_expr, batch = found
        names = _batch_names(batch)
        if names is None or not isinstance(loop.body, cst.IndentedBlock):
            return
        copies = self._copy_statements(loop, names)
        if copies is None:
            return
        statements, device = copies
        loaders = self._loader_sources(loader_expr, (), 0)
        if not loaders or not all(self._yields_plain_batches(loader) for loader in loaders):
            return
        if not all(self._is_pinned(loader) for loader in loaders):
            line = self.context.positions[loaders[0]].start.line
            self.report(loop, self.MESSAGE + f"; the DataLoader on line {line} is not pinned, so the copies could not "
                        "overlap: pass pin_memory (PM102) and run again")
            return
        self.report(loop, self.MESSAGE, replacement=self._rewritten(loop, loader_expr, device, statements),
                    imports=[IMPORT])

    # -- the loop ----------------------------------------------------------------------------

    def _loader_and_batch(self, iterable: cst.BaseExpression, target: cst.BaseExpression):
        """(the expression of the loader the loop iterates, the part of the target bound to
        its batches), through enumerate, iter and tqdm; None for anything else."""
        names = self.context.names
        if isinstance(iterable, cst.Call):
            args = [a for a in iterable.args if a.keyword is None and not a.star]
            if names.is_(iterable.func, *ENUMERATE) and args and isinstance(target, cst.Tuple) \
                    and len(target.elements) == 2:
                return self._loader_and_batch(args[0].value, target.elements[1].value)
            if names.is_(iterable.func, *PASS_THROUGH_ITERABLES) and args:
                return self._loader_and_batch(args[0].value, target)
        if self._only_loaders(iterable, (), 0):
            return iterable, target
        return None

    @memoized
    def _only_loaders(self, expr: cst.BaseExpression, path: tuple[int, ...], depth: int) -> bool:
        """Is every value `expr` may have a DataLoader construction of this file? (The
        look-up `_loader_sources` finds the loaders among other values; a loop over
        `loader if a else my_batches` must not be rewritten as if it were a loader's.)"""
        if depth > MAX_DEPTH:
            return False
        if isinstance(expr, (cst.Tuple, cst.List)) and path:
            if path[0] >= len(expr.elements) or any(isinstance(e, cst.StarredElement) for e in expr.elements):
                return False
            return self._only_loaders(expr.elements[path[0]].value, path[1:], depth + 1)
        if isinstance(expr, cst.Call):
            if id(expr) in self.loader_ids:
                return not path
            function = self.bindings.local_function(expr.func)
            values = returned_values(function) if function is not None else []
            return bool(values) and all(self._only_loaders(value, path, depth + 1) for value in values)
        if isinstance(expr, cst.Name):
            sources = self._sources(expr)
            return bool(sources) and all(self._only_loaders(source, inner + path, depth + 1)
                                         for source, inner in sources)
        if isinstance(expr, cst.Attribute):
            values = self.bindings.attribute_values(expr) or []
            return bool(values) and all(self._only_loaders(value, path, depth + 1) for value in values)
        if isinstance(expr, cst.IfExp):
            return self._only_loaders(expr.body, path, depth + 1) and self._only_loaders(expr.orelse, path, depth + 1)
        return False

    def _copy_statements(self, loop: cst.For, names: list[str]):
        """(the statements of the loop body that copy the batch, the device expression) when
        every batch name is copied to one device before any other use; else None."""
        pending, statements, devices = set(names), [], []
        body = loop.body.body
        for statement in body:
            if not pending:
                break
            copied = self._copied_names(statement)
            if copied is not None and set(copied) <= pending:
                pending -= set(copied)
                statements.append(statement)
                devices.extend(copied.values())
                continue
            if _mentions(statement, pending):
                return None
        if pending or len(statements) == len(body):
            return None
        codes = {self.context.module.code_for_node(device) for device in devices}
        if len(codes) != 1 or len(devices) != len(names):
            return None
        device = devices[0]
        if not isinstance(device, cst.SimpleString) and not self.context.training.defined_before(device, loop):
            return None
        return statements, device

    def _copied_names(self, statement: cst.BaseStatement) -> dict[str, cst.BaseExpression] | None:
        """{name: device} for `x = x.to(device)` and `x, y = x.to(device), y.to(device)`."""
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1):
            return None
        assign = statement.body[0]
        target, value = assign.targets[0].target, assign.value
        if isinstance(target, cst.Name):
            pairs = [(target, value)]
        elif isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)) \
                and len(target.elements) == len(value.elements):
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
        """The device of `[t.to(device) for t in name]` and `{k: v.to(device) for k, v in
        name.items()}`: a batch that is a list or dict of tensors, copied whole (a value that
        is not a tensor would have no `.to`, so every value is one)."""
        if not isinstance(value, (cst.ListComp, cst.DictComp)):
            return None
        loop = value.for_in
        if loop.ifs or loop.inner_for_in is not None or loop.asynchronous is not None:
            return None
        if isinstance(value, cst.ListComp):
            if not (isinstance(loop.target, cst.Name) and m.matches(loop.iter, m.Name(name))):
                return None
            return self._copy_device(value.elt, loop.target.value)
        if not (m.matches(loop.target, m.Tuple(elements=[m.Element(m.Name()), m.Element(m.Name())]))
                and m.matches(loop.iter, m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name("items")), args=[]))):
            return None
        key, item = (element.value.value for element in loop.target.elements)
        if not m.matches(value.key, m.Name(key)) or key == item:
            return None
        return self._copy_device(value.value, item)

    def _copy_device(self, call: cst.BaseExpression, name: str) -> cst.BaseExpression | None:
        """The device of `name.to(device[, non_blocking=...])` / `name.cuda([non_blocking=...])`."""
        if not (isinstance(call, cst.Call) and m.matches(call.func, m.Attribute(value=m.Name(name)))):
            return None
        if any(arg.star or (arg.keyword is not None and arg.keyword.value not in ("device", "non_blocking"))
               for arg in call.args):
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
        named = device.value.attr.value if isinstance(device.value, cst.Attribute) else getattr(device.value, "value", "")
        return device.value if isinstance(named, str) and DEVICE_NAME.match(named) else None

    # -- the loader --------------------------------------------------------------------------

    def _yields_plain_batches(self, loader: cst.Call) -> bool:
        """Default collation (batches of tensors, mappings, sequences), host data, no own __iter__."""
        is_torch_loader = self.context.names.is_(loader.func, DATALOADER)
        if not is_torch_loader and self._subclass_overrides(self.context.kinds.local_class(loader.func)):
            return False
        collate = kwarg(loader, "collate_fn") or (positional(loader, COLLATE_FN_POSITION) if is_torch_loader else None)
        if collate is not None:
            function = collate.value.func if isinstance(collate.value, cst.Call) else collate.value
            if not self.context.names.is_(function, *KNOWN_COLLATES):
                return False
        if any(arg.star for arg in loader.args):
            literal = self._star_kwargs_keys(loader)
            if literal is None or "collate_fn" in literal:
                return False
        return not self._may_hold_device_data(self._dataset(loader), 0)

    def _is_pinned(self, loader: cst.Call) -> bool:
        """Is `pin_memory` passed and not False, or left to PM102, which runs in this run too
        and pins the loaders whose batches go to CUDA?"""
        pin = kwarg(loader, "pin_memory") or (
            positional(loader, PIN_MEMORY_POSITION) if self.context.names.is_(loader.func, DATALOADER) else None)
        if pin is not None:
            return not m.matches(pin.value, m.Name("False"))
        keys = self._star_kwargs_keys(loader)
        if keys is not None and "pin_memory" in keys:
            return True
        return self.context.settings.enabled(PIN_MEMORY_RULE, self.context.path)

    def _star_kwargs_keys(self, loader: cst.Call) -> set[str] | None:
        """The keys of the one `**dict` the loader is built with, when the rule can see them all."""
        stars = [arg for arg in loader.args if arg.star]
        if len(stars) != 1 or stars[0].star != "**":
            return None
        found = self._kwargs_literal(stars[0].value)
        return found[1] if found is not None and not found[2] else None

    # -- the rewrite -------------------------------------------------------------------------

    def _rewritten(self, loop: cst.For, loader_expr: cst.BaseExpression, device: cst.BaseExpression,
                   copies: list[cst.BaseStatement]) -> cst.For:
        prefetcher = cst.Call(func=cst.Name("DevicePrefetcher"), args=[
            cst.Arg(loader_expr, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            cst.Arg(device.deep_clone())])
        removed = {id(statement) for statement in copies}
        body, carried = [], []
        for statement in loop.body.body:
            if id(statement) in removed:
                carried.extend(statement.leading_lines)  # comments above a removed copy stay
                continue
            if carried:
                statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])
                carried = []
            body.append(statement)
        new_iter = _replace_node(loop.iter, loader_expr, prefetcher)
        return loop.with_changes(iter=new_iter, body=loop.body.with_changes(body=body))


def _batch_names(target: cst.BaseExpression) -> list[str] | None:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)) and all(
            isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements):
        names = [e.value.value for e in target.elements]
        return names if len(set(names)) == len(names) else None
    return None


def _mentions(node: cst.CSTNode, names: set[str]) -> bool:
    """Does `node` read or bind one of `names`?"""
    read = {name.value for name in names_read(node)}
    bound = set()
    for target in m.findall(node, m.AssignTarget() | m.AugAssign() | m.AnnAssign() | m.For() | m.CompFor()
                            | m.NamedExpr() | m.AsName()):
        part = getattr(target, "target", None) or getattr(target, "name", None)
        if part is not None:
            bound |= {n.value for n in m.findall(part, m.Name())}
    return bool((read | bound) & names)


class _Replace(cst.CSTTransformer):
    def __init__(self, old: cst.CSTNode, new: cst.CSTNode) -> None:
        super().__init__()
        self.old, self.new = old, new

    def on_leave(self, original_node, updated_node):
        return self.new if original_node is self.old else updated_node


def _replace_node(tree: cst.CSTNode, old: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode:
    return new if tree is old else tree.visit(_Replace(old, new))

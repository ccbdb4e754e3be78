from __future__ import annotations

import libcst as cst

from codemod.analysis.kinds import Kind, Place
from codemod.edits import AddKeyword
from codemod.rule import Invalid, Level, Rule, Valid

PREAMBLE = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
device = torch.device("cuda")
loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
"""


UNPROVEN_SOURCE = (
    "copy of a tensor that may already be on a device: if it is a host tensor, "
    "pass non_blocking=True (not fixed: it could be a device-to-host copy)"
)


class NonBlockingCopy(Rule):
    """
    ## What it does
    Finds host-to-device copies of host tensors, `x.to(device)` and `x.cuda()`,
    that block the Python thread until the copy is done, and adds
    `non_blocking=True`.

    ## Why is this bad?
    A blocking copy makes the CPU wait for the transfer before it can queue the
    next kernels, so the GPU idles between steps. With `non_blocking=True` the
    copy is queued on the current stream and Python goes on; kernels that use
    the tensor are ordered after the copy by the stream, so results are the same.
    The copy can only overlap with other work when the source is in pinned
    memory (see PM102, `pin_memory=True` on the DataLoader); from pageable
    memory it is staged and is about as slow as before, but never wrong.
    The gain is the host time each copy held Python back: largest in loops
    that copy many small tensors per step and whose GPU work per step is short.

    ## Example
    ```python
    for x, y in loader:
        x, y = x.to(device), y.to(device)
    ```
    Use instead:
    ```python
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    ```

    ## Fix safety
    Safe: the values computed are the same bit for bit. The rule only fixes a
    copy when it can tell that the receiver is a host tensor (built by a torch
    factory without `device=`, `torch.from_numpy`, a DataLoader batch, or
    derived from one) and that the target is a device that is not the CPU, or
    that the target is a CUDA device and the receiver a tensor (host-to-device or
    device-to-device: both are ordered on the stream). A tensor that may already
    be on a device, moved to a device that may be the CPU, is reported without a
    fix.
    Batches are followed into the project's own modules and through type
    annotations: a parameter annotated `DataLoader` holds a loader whose batches
    are host tensors (the default collate builds them on the CPU, as for a
    loader built in the file from a dataset perfmod cannot see), a generator of
    the project that yields a loader's batches (`for b in loader: yield b`)
    yields host batches, and a helper of the project that returns its argument
    or a part of it (`batch["input_ids"]`, `batch[0]`), and neither moves nor
    hands its argument to another function, returns what is where its argument
    is. A helper that moves the batch itself (`return batch.to(device)`) is not
    taken for one.
    It leaves alone modules (`model.to(device)`), dtype-only conversions
    (`x.to(torch.float16)`), device-to-host copies (`.cpu()`, `.to("cpu")`),
    whose result the host could read before the copy lands, calls that already
    pass `non_blocking` (an explicit `False` is respected), and buffers that are
    written in place (`buf.copy_(...)`), since a pinned buffer rewritten by the
    host while an earlier copy from it is still in flight would corrupt it.
    """

    CODE = "PM101"
    NAME = "blocking-host-to-device-copy"
    LEVEL = Level.SAFE
    REQUIRES = (".to", ".cuda")
    MESSAGE = "host-to-device copy blocks the CPU; pass non_blocking=True"
    GAIN = "the host no longer waits for each copy; with pinned memory (PM102) the copy overlaps queued compute"

    VALID = [
        Valid(PREAMBLE + "model = torch.nn.Linear(8, 1).to(device)\n", "modules are not tensors"),
        Valid(PREAMBLE + "x = torch.randn(4).to(torch.float16)\n", "dtype only"),
        Valid(PREAMBLE + "y = torch.randn(4, device=device).cpu()\n", "device to host"),
        Valid(PREAMBLE + 'x = torch.randn(4).to("cpu")\n', "to the host"),
        Valid(PREAMBLE + 'x = torch.randn(4).to(torch.device("cpu"))\n', "to the host"),
        Valid(PREAMBLE + "x = torch.randn(4).to(device, non_blocking=False)\n", "explicit choice kept"),
        Valid(PREAMBLE + "x = torch.randn(4).to(device, torch.float32, True)\n", "non_blocking passed by position"),
        Valid(PREAMBLE + "def f(t):\n    return t.to(device)\n", "unknown receiver"),
        Valid(
            PREAMBLE
            + "buf = torch.empty(8).pin_memory()\nfor x, _ in loader:\n    buf.copy_(x[0])\n    z = buf.to(device)\n",
            "pinned buffer rewritten in place",
        ),
        Valid(PREAMBLE + "class M:\n    def to(self, d):\n        return self\nm = M().to(device)\n", "not a tensor"),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + 'dev = "cuda" if torch.cuda.is_available() else "cpu"\n'
            "x = torch.randn(4)\nfor _ in range(3):\n    x = x.to(dev)\n",
            None,
            "on a device that may be the CPU after the first pass: reported, not fixed",
        ),
        Invalid(
            PREAMBLE + "def f(t: torch.Tensor):\n    return t.cuda()\n",
            PREAMBLE + "def f(t: torch.Tensor):\n    return t.cuda(non_blocking=True)\n",
            "to CUDA from anywhere is never device-to-host",
        ),
        Invalid(
            PREAMBLE + "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n",
            PREAMBLE
            + "for x, y in loader:\n    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)\n",
        ),
        Invalid(
            PREAMBLE + "for x, y in loader:\n    x = x.cuda()\n    y = y.cuda(0)\n",
            PREAMBLE + "for x, y in loader:\n    x = x.cuda(non_blocking=True)\n    y = y.cuda(0, non_blocking=True)\n",
        ),
        Invalid(
            PREAMBLE + "for batch in loader:\n    x = batch[0].to(device, torch.float16)\n",
            PREAMBLE + "for batch in loader:\n    x = batch[0].to(device, torch.float16, non_blocking=True)\n",
        ),
        Invalid(
            PREAMBLE + "for step, (x, y) in enumerate(loader):\n    x = x.to(device=device)\n",
            PREAMBLE + "for step, (x, y) in enumerate(loader):\n    x = x.to(device=device, non_blocking=True)\n",
        ),
        Invalid(
            PREAMBLE + "for batch in loader:\n    batch = [t.to(device) for t in batch]\n",
            PREAMBLE + "for batch in loader:\n    batch = [t.to(device, non_blocking=True) for t in batch]\n",
        ),
        Invalid(
            PREAMBLE + "for batch in loader:\n    batch = {k: v.to(device) for k, v in batch.items()}\n",
            PREAMBLE
            + "for batch in loader:\n    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}\n",
        ),
        Invalid(
            PREAMBLE + "import numpy as np\nx = torch.from_numpy(np.zeros(3)).to(device)\n",
            PREAMBLE + "import numpy as np\nx = torch.from_numpy(np.zeros(3)).to(device, non_blocking=True)\n",
        ),
        Invalid(
            PREAMBLE + "x = torch.randn(4)\ntarget_device = 'cuda:1'\nx = x.float().to(target_device)\n",
            PREAMBLE
            + "x = torch.randn(4)\ntarget_device = 'cuda:1'\nx = x.float().to(target_device, non_blocking=True)\n",
        ),
        Invalid(
            PREAMBLE + "x = torch.randn(4)\ny = x.to(\n    device,\n)\n",
            PREAMBLE + "x = torch.randn(4)\ny = x.to(\n    device,\n    non_blocking=True,\n)\n",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        kinds = self.context.kinds
        copy = kinds.copy_of(node)
        if copy is None or copy.has_non_blocking or not copy.moves_device:
            return
        if copy.target is Place.HOST or copy.receiver.kind is not Kind.TENSOR:
            return
        if copy.receiver.place is not Place.HOST and copy.target is not Place.CUDA:
            # A tensor that may already be on a device, moved to a device that may be
            # the CPU, could be a device-to-host copy: say so, change nothing.
            self.report(node, UNPROVEN_SOURCE)
            return
        root = kinds.storage_root(node.func.value)
        if isinstance(root, cst.Name) and kinds.is_mutated_in_place(root):
            return
        self.report(node, edits=[AddKeyword(node, "non_blocking", cst.Name("True"))])

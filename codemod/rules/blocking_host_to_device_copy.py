from __future__ import annotations

import libcst as cst

from codemod.analysis.sizes import sizes_of
from codemod.analysis.values import Kind, Memory, PassedMemory, Place
from codemod.edits import AddKeyword
from codemod.rule import Invalid, Level, Rule, Valid

PREAMBLE = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
device = torch.device("cuda")
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, pin_memory=True)
"""

# A training loop over the device copy of a whole set (the copies above it run once).
TRAIN = (
    "model = torch.nn.Linear(8, 1).to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for _ in range(10):\n    loss = (model(x) - y).pow(2).mean()\n    loss.backward()\n    opt.step()\n"
)


def _indented(code: str) -> str:
    return "".join("    " + line + "\n" for line in code.splitlines())


class NonBlockingCopy(Rule):
    """
    ## What it does
    Finds host-to-device copies, `x.to(device)` and `x.cuda()`, of tensors in
    pinned (page-locked) memory that block the Python thread until the copy is
    done, and adds `non_blocking=True`.

    ## Why is this bad?
    A blocking copy makes the CPU wait for the transfer before it can queue the
    next kernels, so the GPU idles between steps. From pinned memory, a copy
    with `non_blocking=True` is queued on the current stream and Python goes
    on; kernels that use the tensor are ordered after the copy by the stream,
    so results are the same.
    From pageable memory (a tensor built on the host by `torch.tensor`,
    `torch.zeros`, `torch.from_numpy`, a tokenizer, or the batches of a
    DataLoader without `pin_memory`) the copy is staged through a pinned
    buffer by the host and the host waits for it either way: `non_blocking=True`
    changes nothing there, so the rule leaves such copies alone. Pin the
    loader's batches first (PM102, `pin_memory=True` on the DataLoader): the
    rule then fixes their copies in the same run.
    The gain is the host time each copy held Python back: largest in loops
    that copy large batches, or many tensors, per step. In a program whose
    training loop perfmod sees, a copy that runs once in the whole run (in no
    loop, in module code or in a function the program calls once: a whole
    data set copied to the device before training) is set-up with no later
    step to overlap with, so the rule leaves it alone.

    A copy in a loop whose batches perfmod can size and finds under 1.25 MB,
    and which reads a value to the host every step (`loss.item()`), is left
    alone: the host waits for the device at that read every step anyway, so
    the copy can overlap at most its own transfer, under 50 us at 25 GB/s
    (ten kernel launches). So is a copy, of any size, that runs only every
    few steps (an evaluation under `if step % 500 == 0:`, in the loop or in
    a function called only there), or only outside the training loop (an
    accuracy pass after each epoch or after training), when the host waits
    for the device right after it each time: an evaluation loop that reads
    `loss.item()` every batch, or a validation batch whose loss is printed.
    It could overlap at most the launches of one batch, in a pass that runs
    now and then.

    Nor is a copy of a known batch size in a step whose matrix products alone
    (those of the models perfmod can size, over the rows of the batch) take
    more than 100 times what a blocking copy of that batch can cost, even on
    an A100's bf16 tensor cores: a large language model fed small token
    batches loses under 1% to the copy, so `non_blocking=True` buys nothing
    measurable there.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=64, pin_memory=True)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
    ```
    Use instead:
    ```python
    loader = DataLoader(dataset, batch_size=64, pin_memory=True)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    ```

    ## Fix safety
    Safe: the values computed are the same bit for bit. The rule only fixes a
    copy to a device other than the CPU when it can tell that the tensor copied
    is in pinned memory: a batch (or a part of one, or a view of it) of a
    DataLoader built with `pin_memory=` (anything but a false literal, in its
    call or in the one `**dict` literal of settings it is given), the result of
    `.pin_memory()`, or a tensor made with `pin_memory=True`. Batches are
    followed through the file's own functions, into the project's own modules
    and through `iter`, `enumerate`, `zip` and `next`. A cast or other
    computation on a pinned tensor (`x.float().to(device)`) makes a new
    tensor in pageable memory: its copy is left alone (`x.to(device).float()`
    copies the pinned tensor). A loader passed in as a parameter is followed
    to every call of its function, in the file and in the other modules of
    its package (a call through a `functools.partial` of the function too),
    and to wherever each caller got it (a function of a third module that
    builds it). So is a function passed in as a parameter whose iterator the
    copy's batches come from (`create_iter=lambda: iter(loader)`, handed on
    through other calls): to the loader it iterates. When at least one
    caller passes a loader built pinned, the copy is fixed and its message
    names that call; the batches of the loaders other callers pass (one that
    does not pin, or one perfmod cannot tell) are copied synchronously as
    before, and the message names those calls too. When no caller's loader
    pins, or a call cannot be followed (the function handed on as a value
    where perfmod cannot see it called), the copy is left alone; so is the
    copy of a batch of a loader built with a `collate_fn` and no
    `pin_memory`, whose memory is unknown.
    It leaves alone modules (`model.to(device)`), dtype-only conversions
    (`x.to(torch.float16)`), device-to-host copies (`.cpu()`, `.to("cpu")`),
    whose result the host could read before the copy lands, calls that already
    pass `non_blocking` (an explicit `False` is respected), and pinned buffers
    that are written in place (`buf.copy_(...)`), since a buffer rewritten by
    the host while an earlier copy from it is still in flight would corrupt it.
    """

    CODE = "PM101"
    NAME = "blocking-host-to-device-copy"
    LEVEL = Level.SAFE
    REQUIRES = (".to", ".cuda")
    # PM102 pins the batches of a loader whose copies go to CUDA: their copies are fixed
    # on the file it rewrote.
    AFTER = ("PM102",)
    MESSAGE = "host-to-device copy blocks the CPU; pass non_blocking=True"
    GAIN = "the host no longer waits for each copy of pinned memory: it overlaps queued compute"

    VALID = [
        Valid(PREAMBLE + "model = torch.nn.Linear(8, 1).to(device)\n", "modules are not tensors"),
        Valid(PREAMBLE + "x = torch.randn(4).pin_memory().to(torch.float16)\n", "dtype only"),
        Valid(PREAMBLE + "y = torch.randn(4, device=device).cpu()\n", "device to host"),
        Valid(PREAMBLE + 'x = torch.randn(4).pin_memory().to("cpu")\n', "to the host"),
        Valid(PREAMBLE + 'x = torch.randn(4).pin_memory().to(torch.device("cpu"))\n', "to the host"),
        Valid(PREAMBLE + "for x, y in loader:\n    x = x.to(device, non_blocking=False)\n", "explicit choice kept"),
        Valid(
            PREAMBLE + "for x, y in loader:\n    x = x.to(device, torch.float32, True)\n",
            "non_blocking passed by position",
        ),
        Valid(PREAMBLE + "def f(t):\n    return t.to(device)\n", "unknown receiver"),
        Valid(PREAMBLE + "def f(t: torch.Tensor):\n    return t.cuda()\n", "a tensor of unknown memory"),
        Valid(
            PREAMBLE
            + "buf = torch.empty(8).pin_memory()\nfor x, _ in loader:\n    buf.copy_(x[0])\n    z = buf.to(device)\n",
            "pinned buffer rewritten in place",
        ),
        Valid(PREAMBLE + "class M:\n    def to(self, d):\n        return self\nm = M().to(device)\n", "not a tensor"),
        # Pageable sources: the copy is staged by the host whatever non_blocking says.
        Valid(PREAMBLE + "labels = torch.tensor([1, 2, 3]).to(device)\n", "torch.tensor of a list: pageable"),
        Valid(
            PREAMBLE + "import numpy as np\nx = torch.from_numpy(np.zeros(3)).to(device)\n",
            "numpy's memory: pageable",
        ),
        Valid(
            PREAMBLE
            + "import numpy as np\nrows = [np.zeros(3) for _ in range(4)]\n"
            + "x = torch.stack([torch.from_numpy(r) for r in rows]).to(device)\n",
            "a stack of host arrays: pageable",
        ),
        Valid(
            PREAMBLE
            + "X = torch.randn(64, 8)\nfor i in range(0, 64, 8):\n    xb = torch.stack([X[i], X[i + 1]]).to(device)\n",
            "a stack of slices: pageable",
        ),
        Valid(PREAMBLE + "mask = torch.zeros(8, 8).to(device)\n", "torch.zeros on the host: pageable"),
        Valid(
            PREAMBLE + "from transformers import AutoTokenizer\n"
            'tok = AutoTokenizer.from_pretrained("gpt2")\n'
            'enc = tok(["a b"], return_tensors="pt")\nids = enc["input_ids"].to(device)\n',
            "a tokenizer's output: pageable",
        ),
        Valid(
            PREAMBLE + "plain = DataLoader(data, batch_size=8)\nfor x, y in plain:\n    x = x.to(device)\n",
            "batches of a loader that does not pin (PM102 pins it, then this rule fixes the copy)",
        ),
        Valid(
            PREAMBLE + "for x, y in loader:\n    x = x.float().to(device)\n",
            "a cast of a pinned batch is a new pageable tensor",
        ),
        Valid(
            PREAMBLE + "for x, y in loader:\n    z = x[torch.tensor([0, 1])].to(device)\n",
            "an index tensor gathers the rows into a new pageable tensor",
        ),
        Valid(
            PREAMBLE + 'dev = "cuda" if torch.cuda.is_available() else "cpu"\n'
            "x = torch.randn(4)\nfor _ in range(3):\n    x = x.to(dev)\n",
            "a tensor that may be on the device after the first pass: no pinned source",
        ),
        # Beside a training loop, a copy that runs once is set-up: nothing to overlap with.
        Valid(
            PREAMBLE + "x, y = next(iter(loader))\nx, y = x.to(device), y.to(device)\n" + TRAIN,
            "the whole set copied once before training: nothing to overlap with",
        ),
        Valid(
            PREAMBLE
            + "def main():\n    x, y = next(iter(loader))\n    x = x.to(device)\n"
            + _indented(TRAIN)
            + "if __name__ == '__main__':\n    main()\n",
            "in a function the program calls once",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + "for x, y in loader:\n    for i in range(2):\n        z = x[i].to(device)\n",
            PREAMBLE + "for x, y in loader:\n    for i in range(2):\n        z = x[i].to(device, non_blocking=True)\n",
            "a row of a pinned batch is a view of its pinned memory",
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
            PREAMBLE
            + "import numpy as np\nfor _ in range(3):\n    x = torch.from_numpy(np.zeros(3)).pin_memory().to(device)\n",
            PREAMBLE
            + "import numpy as np\nfor _ in range(3):\n"
            + "    x = torch.from_numpy(np.zeros(3)).pin_memory().to(device, non_blocking=True)\n",
            "pinned by .pin_memory()",
        ),
        Invalid(
            PREAMBLE + "x = torch.empty(4, pin_memory=True)\ntarget_device = 'cuda:1'\n"
            "while True:\n    y = x.to(target_device)\n",
            PREAMBLE + "x = torch.empty(4, pin_memory=True)\ntarget_device = 'cuda:1'\n"
            "while True:\n    y = x.to(target_device, non_blocking=True)\n",
            "made in pinned memory",
        ),
        Invalid(
            PREAMBLE + "def to_device(batch):\n    return [t.to(device) for t in batch]\n"
            "def main():\n    for batch in loader:\n        x, y = to_device(batch)\n"
            "if __name__ == '__main__':\n    main()\n",
            PREAMBLE + "def to_device(batch):\n    return [t.to(device, non_blocking=True) for t in batch]\n"
            "def main():\n    for batch in loader:\n        x, y = to_device(batch)\n"
            "if __name__ == '__main__':\n    main()\n",
            "a helper the loop calls: one copy a step",
        ),
        Invalid(
            PREAMBLE + "for x, y in loader:\n    y = x.to(\n        device,\n    )\n",
            PREAMBLE + "for x, y in loader:\n    y = x.to(\n        device,\n        non_blocking=True,\n    )\n",
        ),
        Invalid(
            PREAMBLE + 'kw = {"batch_size": 8, "pin_memory": device.type == "cuda"}\n'
            "pinned = DataLoader(data, **kw)\nfor x, y in pinned:\n    x = x.view(8, 8).to(device)\n",
            PREAMBLE + 'kw = {"batch_size": 8, "pin_memory": device.type == "cuda"}\n'
            "pinned = DataLoader(data, **kw)\nfor x, y in pinned:\n    x = x.view(8, 8).to(device, non_blocking=True)\n",
            "pinned where it goes to CUDA, through a dict of settings; a view keeps the memory",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        kinds = self.context.kinds
        copy = kinds.copy_of(node)
        if copy is None or copy.has_non_blocking or not copy.moves_device:
            return
        if copy.target is Place.HOST or copy.receiver.kind is not Kind.TENSOR:
            return
        memory = copy.receiver.memory
        if copy.receiver.place is not Place.HOST or not (memory is Memory.PINNED or isinstance(memory, PassedMemory)):
            return  # from pageable memory (or memory perfmod cannot tell) the copy overlaps nothing
        loops = self.context.loops
        if loops.step_loops and loops.runs_once(node):
            return  # set-up beside a training loop (the data set, before training): nothing to overlap with
        sizes = sizes_of(self.context)
        fed = sizes.feeding_batch_bytes(node)
        if fed is not None and sizes.copy_costs_nothing(*fed) is not None:
            return  # a small batch the loop waits for anyway, or a step that computes far longer than a copy
        if sizes.rarely_waited(node) is not None:
            return  # an evaluation every few steps or epoch, the host waiting for the device right after
        root = kinds.storage_root(node.func.value)
        if isinstance(root, cst.Name) and kinds.is_mutated_in_place(root):
            return
        message = None
        if isinstance(memory, PassedMemory):
            message = (
                f"{self.MESSAGE}: the batches of the loader passed at {', '.join(memory.pinned)} are pinned; "
                f"for those of the loader{'s' if len(memory.others) > 1 else ''} passed at "
                f"{', '.join(memory.others)}, not seen to be pinned, "
                "the copy stays synchronous"
            )
        self.report(node, message, edits=[AddKeyword(node, "non_blocking", cst.Name("True"))])

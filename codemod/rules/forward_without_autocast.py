from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.bindings import argument_for
from codemod.analysis.distributed import data_parallel
from codemod.analysis.kinds import Place
from codemod.analysis.lightning import TrainerBuild, lightning_trainers
from codemod.analysis.local_calls import local_calls
from codemod.analysis.names import is_main_guard, kwarg, method_name, positional, sole_definition
from codemod.analysis.project import project_of
from codemod.analysis.sizes import sizes_of, widest_memory_bound
from codemod.analysis.torch_facts import (
    AUTOCAST_FLOAT16,
    AUTOCAST_UNSAFE,
    LIGHTNING_DEFAULT_ACCELERATOR,
    LIGHTNING_FLOAT16_PRECISION,
    LIGHTNING_FULL_PRECISION,
    LIGHTNING_GPU_ACCELERATORS,
    LIGHTNING_MIXED_PRECISION,
    LIGHTNING_PRECISION_KEYWORD,
    MODEL_WRAPPERS,
    PRECISION_OWNERS,
    autocast_float16,
)
from codemod.analysis.training import NO_FORWARD, TrainingLoop
from codemod.edits import AddKeyword, Edit, InsertAfter, InsertBefore, Replace, Wrap
from codemod.rule import Invalid, Level, Rule, Valid

POLICY_NAMES = ("precision", "amp_precision")
SCALER_NAMES = ("scaler", "grad_scaler")
POLICY_IMPORT = ("runtime.amp", "Precision")
FP16 = {"amp": "fp16"}

HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(512, 512).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = [(torch.randn(4, 512), torch.randint(0, 512, (4,))) for _ in range(3)]
"""
ARGS = "args = parser.parse_args()\n"
POLICY_HEAD = HEAD.replace("\ndevice =", "\nfrom runtime.amp import Precision\n\ndevice =")
LOOP = """\
for x, y in data:
    x, y = x.to(device), y.to(device)
    # forward
    logits = model(x)
    loss = F.cross_entropy(logits, y)  # mean over the batch
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""
LOOP_BF16 = """\
precision = Precision.for_device(device)
for x, y in data:
    x, y = x.to(device), y.to(device)
    # forward
    with precision.autocast():
        logits = model(x)
        loss = F.cross_entropy(logits, y)  # mean over the batch
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""
LOOP_FP16 = """\
precision = Precision.for_device(device, prefer="fp16")
scaler = precision.grad_scaler()
for x, y in data:
    x, y = x.to(device), y.to(device)
    # forward
    with precision.autocast():
        logits = model(x)
        loss = F.cross_entropy(logits, y)  # mean over the batch
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""
SCRIPT_DEVICE = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
def train(model, data, device):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in data:
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
if __name__ == "__main__":
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = nn.Linear(512, 512).to(dev)
    train(net, [(torch.randn(4, 512), torch.randint(0, 512, (4,)))], dev)
"""
RNN_MODEL = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(512, 512)
    def forward(self, x):
        return self.head(self.rnn(x.unsqueeze(1))[0][:, -1])
model = Net().to(device)"""
LIGHTNING = """\
import lightning as L
import torch
from torch import nn


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


trainer = L.Trainer(accelerator="gpu", max_epochs=2)
trainer.fit(Net(), loader)
"""
ACCUMULATION = """\
accum = 4
for epoch in range(2):
    for i, (x, y) in enumerate(data):
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss = loss / accum
        loss.backward()
        if (i + 1) % accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
"""
ACCUMULATION_FP16 = """\
accum = 4
precision = Precision.for_device(device, prefer="fp16")
scaler = precision.grad_scaler()
for epoch in range(2):
    for i, (x, y) in enumerate(data):
        with precision.autocast():
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss = loss / accum
        scaler.scale(loss).backward()
        if (i + 1) % accum == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
"""


class ForwardWithoutAutocast(Rule):
    """
    ## What it does
    Finds training loops whose forward pass and loss run in float32 and wraps
    them in autocast: one `with precision.autocast():` block around the
    statements from the first model call to the loss (including an `if`,
    `with` or `try` that finishes it, such as an optional auxiliary term
    added under `if aux_weight > 0:`), with the precision
    policy of `runtime.amp` built once from the script's own device
    expression:

    ```python
    precision = Precision.for_device(device)
    ```

    The policy goes before the loop when the device is defined there; in a
    trainer class whose `__init__` moves the model, right after that move
    (`self.precision = Precision.for_device(device)`, used as
    `self.precision.autocast()`); for a training step in a helper function,
    right after the statement that moves the model. Where the device is
    defined nowhere the forward pass can see, or the model is put on CUDA by a
    `.cuda()` that an `if` may skip (`if args.cuda: model.cuda()`), the policy
    reads the model's own: `Precision.for_device(next(model.parameters()).device)`.

    The default (`amp = "bf16"` in `[tool.perfmod]`) needs nothing else:
    bfloat16 has float32's exponent range, so gradients do not underflow. With
    `amp = "fp16"` the fix also adds a gradient scaler:
    `scaler.scale(loss).backward()`, `scaler.unscale_(optimizer)` before
    gradient clipping, `scaler.step(optimizer)` and `scaler.update()` right
    after it, inside the same `if (i + 1) % accum == 0:` as the step when
    gradients are accumulated, so the scale is updated only on step
    iterations.

    With PyTorch Lightning the Trainer runs the steps, and the fix is its own
    setting, not a with-block in `training_step`: a `Trainer(...)`
    (`L.Trainer`, `lightning.pytorch.Trainer`, `pytorch_lightning.Trainer`)
    with `accelerator="gpu"` or `"cuda"` and no `precision=`, whose `fit(...)`
    trains a LightningModule of the file, gets `precision="bf16-mixed"`
    (`"16-mixed"`, float16 with Lightning's gradient scaler, with
    `amp = "fp16"`). An accelerator option whose default is `"gpu"` gets
    `precision="bf16-mixed" if args.accelerator in ("gpu", "cuda") else
    "32-true"`, so that another accelerator given on the command line keeps
    full precision.

    ## Why is this bad?
    On GPUs with tensor cores, matmuls and convolutions in bfloat16 or float16
    run several times faster than in float32 and move half the bytes;
    autocast runs those ops in the low precision and keeps reductions,
    softmax and losses in float32. On an A100, peak float16 and bfloat16
    matmul throughput is 16 times float32's (8 times TF32's); for whole
    training steps NVIDIA reports up to 3x for math-heavy models, so expect
    1.5-3x on matmul-heavy models on Ampere or newer GPUs, and less
    activation memory.

    A loop whose models perfmod can size (`torch.nn` layers with widths the
    script shows, through the file's own module classes), that convolve
    nothing, and whose every matrix product is bound by memory in float32
    already (a `Linear(20, 1)`: under 12.5 flops per byte it moves, the
    ratio of an A100's float32 arithmetic to its memory bandwidth) is
    reported, not fixed: autocast would add a cast before each product and
    speed up no arithmetic that takes time.

    The policy (`runtime.amp.Precision`) picks what the device supports:
    bf16 on CUDA GPUs that run it natively (Ampere, sm_80, or newer), nothing
    on older ones (fp16 would need the GradScaler that only `amp = "fp16"`
    writes), nothing on the CPU unless asked (CPU autocast pays off only
    with bf16 units): so the rewritten script still runs, unchanged, where it
    ran before. The `PERFMOD_AMP` environment variable (`bf16`, `fp16`,
    `off`) overrides it without editing code. The older spellings
    `torch.cuda.amp.autocast` and `torch.cuda.amp.GradScaler` are deprecated
    in torch 2.13 (FutureWarning) for `torch.amp.autocast(device_type)` and
    `torch.amp.GradScaler(device_type)`, which the policy uses.

    ## Example
    ```python
    for x, y in loader:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ```
    Use instead:
    ```python
    precision = Precision.for_device(device)
    for x, y in loader:
        with precision.autocast():
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ```

    ## Fix safety
    Numeric: the forward pass computes in bf16 (8 significant bits) or fp16
    (11), so losses move away from float32's in the third or fourth digit and
    drift slowly; `perfmod verify` compares them. Measured on the CPU with
    autocast forced (`PERFMOD_AMP=bf16` or `fp16`) on four small training
    scripts (an MLP with accumulation and clipping, a CNN trainer class, a
    small language model, nanoGPT-style micro-steps), the losses stayed
    within 1.1e-3 relative of float32 over 20 steps. With fp16 the scaler skips a
    step whose scaled gradients overflow, by design, and the run then follows
    its own path. With the default `amp = "bf16"`, a GPU older than Ampere
    trains in float32 as before: set `amp = "fp16"` to get fp16 with a
    GradScaler there.

    Not reported where autocast is already on in any form (`torch.autocast`,
    `torch.amp.autocast`, `torch.cuda.amp.autocast`, `torch.cpu.amp.autocast`,
    a `ctx = nullcontext() if ... else autocast(...)` variable, a helper that
    returns one, a policy's `.autocast()`, a context manager imported from
    elsewhere whose name says autocast or amp, autocast inside the model's
    own `forward`), nor for a model that stays on the CPU, nor for a loop
    that runs no model before its loss. Reported without a fix: a loss that
    CUDA autocast refuses (`F.binary_cross_entropy`, `nn.BCELoss`: compute
    it from logits with `BCEWithLogitsLoss` first); with `amp = "bf16"`, a
    forward that runs a cuDNN RNN (`nn.LSTM`, `nn.GRU`, `nn.RNN`: CUDA autocast
    runs them in float16 whatever dtype it is given, so bf16 would train them in
    float16 without a gradient scaler; `amp = "fp16"` fixes it with one), or may
    run one: a model built by the caller of the training function, a model class
    of another module of the project, a layer whose class is picked at run time
    (`getattr(nn, rnn_type)(...)`), and a
    model wrapped in `nn.DataParallel` (its replica threads enter autocast again
    without the dtype: use DistributedDataParallel); a float64 model (`.double()`,
    `.to(torch.float64)`, `torch.set_default_dtype(torch.float64)`), whose
    author asked for more precision, not less; a script that asks for exact
    float32 results (`torch.use_deterministic_algorithms(True)`, TF32 turned
    off, the "highest" matmul precision); a forward pass whose values steer
    what runs next (a sampled action, a value read with `.item()` in an RL
    rollout), which lower precision could change (a value read with `.item()`
    that only sets a Python number, such as a loss weight scaled by a ratio of
    two losses through `if`s whose branches run no device work, or that is
    only tested for NaN or infinity, is not such a decision: the same kernels
    run, and the number moves as the losses do); autocast used elsewhere in the
    file; a GradScaler without autocast; a forward pass that cannot be
    delimited (the loss computed in a nested loop or in the backward call
    itself, the forward split across blocks, an `if` that finishes the loss
    but tests a value the step computed, a block that also runs backward);
    a device that cannot be told or
    is defined only inside the loop; and, for fp16, several optimizers or
    clipping placed where `unscale_` could not go once per step.

    For a Lightning Trainer: not reported when `precision=` is given (any
    value), when the accelerator is the CPU, a TPU or MPS, or when the module
    enters autocast itself. Reported without a fix: the accelerator left at
    `"auto"` (the default), whatever `devices=` says, since `"auto"` picks the
    CPU on a machine without a GPU, where bf16 autocast is rarely faster; an
    accelerator that cannot be told; `plugins=` (a precision plugin there and
    `precision=` together are refused) or `**kwargs`; a Trainer whose trained
    module is not a LightningModule class of the file, or is not trained by a
    `fit(...)` of the file; and, with `amp = "bf16"`, a module that builds a
    cuDNN RNN (use `precision="16-mixed"`). `"bf16-mixed"` runs fast on Ampere
    or newer GPUs; on older ones pass `"16-mixed"` instead (`amp = "fp16"`).
    """

    CODE = "PM301"
    NAME = "forward-without-autocast"
    LEVEL = Level.NUMERIC
    REQUIRES = ("backward", "Trainer")
    AFTER = ("PM502",)  # the batched forward is the region to wrap, not the per-sample loop's body
    MESSAGE = "the forward pass and loss run in float32; run them under autocast"
    GAIN = "1.5-3x step time on Ampere or newer GPUs for matmul-heavy models, and less activation memory"

    VALID = [
        Valid(LIGHTNING.replace('accelerator="gpu"', 'accelerator="gpu", precision="16-mixed"'), "precision chosen"),
        Valid(LIGHTNING.replace('accelerator="gpu"', 'accelerator="cpu"'), "a Trainer on the CPU"),
        Valid(
            HEAD
            + LOOP.replace(
                "    logits = model(x)\n    loss = F.cross_entropy(logits, y)  # mean over the batch\n",
                "    with torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n"
                "        logits = model(x)\n        loss = F.cross_entropy(logits, y)\n",
            ),
            "autocast already there",
        ),
        Valid(POLICY_HEAD + LOOP_BF16, "the fix itself: nothing left to do"),
        Valid(
            "from contextlib import nullcontext\n" + HEAD + "ctx = nullcontext() if device.type == 'cpu' else "
            "torch.amp.autocast(device_type='cuda', dtype=torch.bfloat16)\n"
            + LOOP.replace("    logits = model(x)\n", "    with ctx:\n        logits = model(x)\n"),
            "nanoGPT's context variable",
        ),
        Valid(
            "import contextlib\nimport functools\n" + HEAD + "amp_autocast = functools.partial(torch.autocast, "
            "device_type='cuda', dtype=torch.bfloat16) if device.type == 'cuda' else contextlib.nullcontext\n"
            + LOOP.replace("    logits = model(x)\n", "    with amp_autocast():\n        logits = model(x)\n"),
            "timm's context factory: functools.partial of torch.autocast, or nullcontext by a flag",
        ),
        Valid(
            HEAD
            + "def train(model, optimizer, data, ctx):\n"
            + "".join(
                f"    {line}\n"
                for line in LOOP.replace(
                    "    logits = model(x)\n", "    with ctx:\n        logits = model(x)\n"
                ).splitlines()
            ),
            "a context manager the caller passes in: perhaps autocast, perfmod cannot tell",
        ),
        Valid(
            HEAD.replace('torch.device("cuda" if torch.cuda.is_available() else "cpu")', '"cpu"') + LOOP,
            "a CPU model: autocast rarely pays off there",
        ),
        Valid(
            HEAD + "for x, y in data:\n    with torch.no_grad():\n        print(model(x.to(device)))\n",
            "no training loop",
        ),
    ]
    INVALID = [
        Invalid(HEAD + LOOP, POLICY_HEAD + LOOP_BF16, "bf16: one with-block, comments kept, policy before the loop"),
        Invalid(
            LIGHTNING,
            LIGHTNING.replace("max_epochs=2)", 'max_epochs=2, precision="bf16-mixed")'),
            "a Lightning Trainer on a GPU: the Trainer's precision, not autocast in training_step",
        ),
        Invalid(
            LIGHTNING.replace('accelerator="gpu", ', ""),
            None,
            'the accelerator left at "auto": the CPU where no GPU is present',
        ),
        Invalid(
            HEAD + ACCUMULATION,
            POLICY_HEAD + ACCUMULATION_FP16,
            "fp16: scaler, unscale_ before clipping, update only on step iterations",
            config=FP16,
        ),
        Invalid(
            SCRIPT_DEVICE,
            SCRIPT_DEVICE.replace(
                "import torch.nn.functional as F\n",
                "import torch.nn.functional as F\nfrom runtime.amp import Precision\n\n",
            )
            .replace("    for x, y in data:\n", "    precision = Precision.for_device(device)\n    for x, y in data:\n")
            .replace(
                "        loss = F.cross_entropy(model(x), y)\n",
                "        with precision.autocast():\n            loss = F.cross_entropy(model(x), y)\n",
            ),
            "the device the function is given, not a name bound only when the file runs as a script",
        ),
        Invalid(
            HEAD + "model.double()\n" + LOOP,
            None,
            "float64 model: more precision was asked for, not less",
        ),
        Invalid(
            HEAD.replace(
                "model = nn.Linear(512, 512).to(device)", "model = nn.DataParallel(nn.Linear(512, 512)).to(device)"
            )
            + LOOP,
            None,
            "nn.DataParallel re-enters autocast in each replica's thread without the dtype: not fixed with bf16",
        ),
        Invalid(
            HEAD.replace("model = nn.Linear(512, 512).to(device)", RNN_MODEL) + LOOP,
            None,
            "a cuDNN RNN in the forward: CUDA autocast runs it in float16 whatever dtype, so bf16 is not fixed",
        ),
        Invalid(
            SCRIPT_DEVICE.replace("def train(", RNN_MODEL.rpartition("\n")[0] + "\ndef train(").replace(
                "nn.Linear(512, 512).to(dev)", "Net().to(dev)"
            ),
            None,
            "the RNN model is built by the caller and passed in: the forward is followed into its class",
        ),
        Invalid(
            HEAD.replace(
                "model = nn.Linear(512, 512).to(device)",
                RNN_MODEL.replace("(self):", "(self, cell='GRU'):").replace("nn.GRU(", "getattr(nn, cell)("),
            )
            + LOOP,
            None,
            "a class of torch.nn picked at run time (`getattr(nn, cell)`) may be a cuDNN RNN: not fixed with bf16",
        ),
        Invalid(
            HEAD.replace("model = nn.Linear(512, 512).to(device)", RNN_MODEL) + LOOP,
            POLICY_HEAD.replace("model = nn.Linear(512, 512).to(device)", RNN_MODEL) + LOOP_FP16,
            "with amp = fp16 the RNN's float16 has its gradient scaler",
            config=FP16,
        ),
        Invalid(
            HEAD
            + LOOP.replace(
                "    loss = F.cross_entropy(logits, y)  # mean over the batch\n",
                "    if y.numel() > 2:\n        loss = F.cross_entropy(logits, y)\n"
                "    else:\n        loss = logits.sum()\n",
            ),
            None,
            "the loss is computed in branches",
        ),
        Invalid(
            HEAD
            + "scaler = torch.amp.GradScaler('cuda')\n"
            + LOOP.replace("loss.backward()", "scaler.scale(loss).backward()").replace(
                "optimizer.step()", "scaler.step(optimizer)\n    scaler.update()"
            ),
            None,
            "a GradScaler without autocast",
        ),
        Invalid(
            HEAD.replace("nn.Linear(512, 512).to(device)", "nn.Linear(512, 512).to(args.device)").replace(
                "device = ", ARGS + "device = "
            )
            + LOOP
            + "x = torch.zeros(1).cuda()\n",
            POLICY_HEAD.replace("nn.Linear(512, 512).to(device)", "nn.Linear(512, 512).to(args.device)").replace(
                "device = ", ARGS + "device = "
            )
            + LOOP_BF16.replace("for_device(device)", "for_device(args.device)")
            + "x = torch.zeros(1).cuda()\n",
            "the device expression the script uses, whatever it is",
        ),
        Invalid(
            HEAD.replace("nn.Linear(512, 512).to(device)\n", "nn.Linear(512, 512)\nif use_cuda:\n    model.cuda()\n")
            + LOOP,
            POLICY_HEAD.replace(
                "nn.Linear(512, 512).to(device)\n", "nn.Linear(512, 512)\nif use_cuda:\n    model.cuda()\n"
            )
            + LOOP_BF16.replace("for_device(device)", "for_device(next(model.parameters()).device)"),
            '`.cuda()` only when a flag says so: the device the parameters are on, not "cuda"',
        ),
        Invalid(
            HEAD
            + LOOP.replace(
                "    optimizer.step()\n",
                "    for group in optimizer.param_groups:\n"
                "        torch.nn.utils.clip_grad_norm_(group['params'], 1.0)\n    optimizer.step()\n",
            ),
            None,
            "fp16 with clipping in a loop: unscale_ must run once per step",
            config=FP16,
        ),
        Invalid(
            HEAD
            + "head = nn.Linear(2, 2).to(device)\nopt2 = torch.optim.SGD(head.parameters(), lr=0.1)\n"
            + LOOP.replace("    optimizer.step()\n", "    optimizer.step()\n    opt2.step()\n"),
            None,
            "fp16 with two optimizers: left to a human",
            config=FP16,
        ),
    ]

    def __init__(self, context) -> None:
        super().__init__(context)
        self._taken: set[str] | None = None

    def visit_Module(self, node: cst.Module) -> None:
        for build in lightning_trainers(self.context).builds:
            if build.precision is None:
                self._check_trainer(build)
        if "backward" not in self.context.code:
            return  # no training loop of its own (a file that only builds a Trainer)
        training = self.context.training
        inside_loops = [loop.autocast.node for loop in training.loops if loop.autocast is not None]
        elsewhere = [
            use for use in training.autocast_uses if not any(self.context.inside(use, n) for n in inside_loops)
        ]
        done: set[cst.CSTNode] = set()  # forward regions already handled (a helper several loops call)
        for loop in training.loops:
            key = loop.forward.statements[0] if loop.forward is not None else loop.loop
            if loop.autocast is None and key not in done:
                done.add(key)
                self._check(loop, elsewhere)

    def _check(self, loop: TrainingLoop, elsewhere: list[cst.CSTNode]) -> None:
        training = self.context.training
        if loop.float64 is not None:
            return self._decline(
                loop,
                f"the model is float64 (line {self.context.line(loop.float64)}): "
                "autocast would lower the precision its author chose",
            )
        if training.exact_float32 is not None:
            return self._decline(
                loop,
                f"the script asks for exact float32 results (line "
                f"{self.context.line(training.exact_float32)}); autocast would undo that",
            )
        owner = next((b.owner for b in loop.backwards if b.owner is not None), None)
        if owner is not None:
            keyword = PRECISION_OWNERS[next(n for n in self.context.names.of(owner.func) if n in PRECISION_OWNERS)]
            if kwarg(owner, keyword) is not None or any(arg.star for arg in owner.args):
                return  # the engine is told its precision where it is built
            return self.report(
                self._forward_start(loop),
                f"the training runs through `{training.code(owner.func)}` (line {self.context.line(owner)}), "
                f"which applies the mixed precision it is configured with: pass `{keyword}=` to it (or set "
                "it in the launcher's configuration) rather than wrapping the forward pass in autocast",
            )
        forward_uses = self._autocast_in_forward(loop)
        if forward_uses:
            return  # the model's forward (or a helper it calls) enters autocast itself
        if elsewhere:
            return self._decline(
                loop,
                f"autocast is already used at line {self.context.line(elsewhere[0])}; "
                "check whether it covers this loop's forward pass",
            )
        if loop.scaler is not None:
            return self._decline(
                loop,
                f"`{loop.scaler.expression}` scales the loss but no autocast is on; "
                "add autocast around the forward pass by hand",
            )
        if loop.forward is None:
            if loop.forward_problem and loop.forward_problem.startswith(NO_FORWARD):
                return  # nothing runs a model before the loss: no forward pass to speed up
            return self._decline(loop, loop.forward_problem)
        decision = self._decision_in_forward(loop)
        if decision is not None:
            return self._decline(
                loop,
                f"the forward pass decides what runs next (`{training.code(decision)}`, line "
                f"{self.context.line(decision)}): in lower precision it may decide otherwise, "
                "and the run would take another path",
            )
        unsafe = self._autocast_unsafe(loop)
        if unsafe is not None:
            call, alternative = unsafe
            return self._decline(
                loop,
                f"`{training.code(call.func)}` (line {self.context.line(call)}) raises under "
                f"CUDA autocast; compute the loss from logits with {alternative}, then run "
                "the forward pass under autocast",
            )
        model = next((model for model in loop.models if model.move is not None), None)
        if model is None:
            if training.cuda_use is not None:
                self._decline(loop, "cannot tell which device the model runs on")
            return
        if model.places == {Place.HOST}:
            return  # CPU autocast pays off only on CPUs with bf16 units; the policy leaves it off there
        recurrent = self._autocast_float16(loop)
        if recurrent is not None and self.context.settings.amp != "fp16":
            return self._decline(
                loop,
                f"{recurrent}, which "
                "CUDA autocast runs in float16 whatever dtype it is given: bf16 autocast would train it in "
                'float16 without a gradient scaler; set `amp = "fp16"` (autocast with a GradScaler) to fix it',
            )
        replicated = next(iter(data_parallel(self.context)), None)
        if replicated is not None and self.context.settings.amp != "fp16":
            return self._decline(
                loop,
                f"`{training.code(replicated.func)}` (line {self.context.line(replicated)}) runs each replica in a "
                "thread of its own, where autocast is entered again without the dtype: bf16 autocast would run "
                "the replicas in float16 without a gradient scaler; use DistributedDataParallel (PM601), or set "
                '`amp = "fp16"` (autocast with a GradScaler)',
            )
        fp16 = self.context.settings.amp == "fp16"
        problem = self._fp16_problem(loop) if fp16 else None
        if problem is not None:
            return self._decline(loop, problem)
        narrow = self._narrow_step(loop)
        if narrow is not None:
            return self._decline(loop, narrow)
        taken = self._taken_names()
        policy = next((n for n in POLICY_NAMES if n not in taken), None)
        scaler = next((n for n in SCALER_NAMES if n not in taken), None)
        if policy is None or (fp16 and scaler is None):
            return self._decline(loop, "the names the fix would use are all taken")
        placement = self._placement(loop, model, policy, scaler if fp16 else None)
        if isinstance(placement, str):
            return self._decline(loop, placement)
        region = loop.forward.statements
        item = cst.WithItem(cst.parse_expression(f"{placement.policy}.autocast()"))
        edits: list[Edit] = [*placement.edits, Wrap(region[0], region[-1], (item,))]
        if fp16:
            edits += self._scale_edits(loop, placement.scaler)
        self.report(self._forward_start(loop), edits=edits, imports=[POLICY_IMPORT])

    # -- Lightning's Trainer ------------------------------------------------------------

    def _check_trainer(self, build: TrainerBuild) -> None:
        """A Lightning `Trainer(...)` without `precision=`: on a CUDA GPU it gets the mixed
        precision Lightning applies to every training_step; elsewhere, or where that cannot
        be told, a report that says why."""
        training = self.context.training
        fp16 = self.context.settings.amp == "fp16"
        precision = LIGHTNING_FLOAT16_PRECISION if fp16 else LIGHTNING_MIXED_PRECISION
        wanted = f'{LIGHTNING_PRECISION_KEYWORD}="{precision}"'
        if build.star is not None:
            return self._decline_trainer(
                build, f"`{training.code(build.star)}` may set the precision or the accelerator", wanted
            )
        if build.plugins is not None:
            return self._decline_trainer(
                build, "`plugins=` may hold a precision plugin, which Lightning refuses beside `precision=`", wanted
            )
        gpu = frozenset(LIGHTNING_GPU_ACCELERATORS)
        accelerator = build.accelerator
        if accelerator is None:
            proven = written = frozenset({LIGHTNING_DEFAULT_ACCELERATOR})
        else:
            proven = training.strings(accelerator)
            written = training.strings(accelerator, written=True)
        guarded = False
        if proven is not None and proven <= gpu:
            pass
        elif written is not None and written <= gpu and self._is_plain(accelerator):
            guarded = True  # an option whose default is "gpu": the precision follows the option
        elif written is not None and not written & (gpu | {LIGHTNING_DEFAULT_ACCELERATOR}):
            return  # the CPU, a TPU, MPS...: not a CUDA GPU
        elif written is not None and LIGHTNING_DEFAULT_ACCELERATOR in written:
            if accelerator is None:
                shown = 'the accelerator is "auto", the default,'
            elif isinstance(accelerator, cst.SimpleString):
                shown = 'the accelerator is "auto",'
            else:
                shown = f'the accelerator `{training.code(accelerator)}` is "auto" as the script is written,'
            return self._decline_trainer(
                build,
                f"{shown} which picks the CPU where no GPU is present (and MPS on a Mac), where "
                "bf16 autocast is rarely faster; whatever `devices=` says, it is not known to be a CUDA GPU",
                wanted + ' when it trains on a CUDA GPU (or `accelerator="gpu"`)',
            )
        else:
            return self._decline_trainer(
                build, f"the accelerator `{training.code(accelerator)}` cannot be told", wanted + " for a CUDA GPU"
            )
        if build.modules is None or not build.modules:
            why = (
                "no `fit(...)` of it in this file names the module it trains"
                if build.modules is not None
                else "the module its `fit(...)` trains is not a LightningModule class of this file"
            )
            return self._decline_trainer(
                build, f"{why}, so whether that module already autocasts cannot be told", wanted
            )
        reached = self._module_functions(build.modules)
        if any(self.context.inside(use, node) for use in training.autocast_uses for node in reached):
            return  # the module enters autocast itself
        if not fp16:
            recurrent = self._recurrent_in(build.modules)
            if recurrent is not None:
                return self._decline_trainer(
                    build,
                    f"{recurrent}, which CUDA autocast runs in float16 whatever dtype it is given: "
                    f"bf16 would train it in float16 without a gradient scaler",
                    f'{LIGHTNING_PRECISION_KEYWORD}="{LIGHTNING_FLOAT16_PRECISION}" (float16 with a gradient scaler)',
                )
        value: cst.BaseExpression = cst.SimpleString(f'"{precision}"')
        if guarded:
            choices = ", ".join(f'"{name}"' for name in LIGHTNING_GPU_ACCELERATORS)
            value = cst.parse_expression(
                f'"{precision}" if {training.code(accelerator)} in ({choices}) else "{LIGHTNING_FULL_PRECISION}"'
            )
        self.report(
            build.call,
            f"{self.MESSAGE}: the Trainer runs every training_step in float32 on the GPU; pass {wanted}",
            edits=[AddKeyword(build.call, LIGHTNING_PRECISION_KEYWORD, value)],
        )

    def _decline_trainer(self, build: TrainerBuild, why: str, wanted: str) -> None:
        self.report(
            build.call,
            f"{self.MESSAGE}: the Trainer runs every training_step in float32; pass {wanted} (not fixed: {why})",
        )

    def _module_functions(self, modules: tuple[cst.ClassDef, ...]) -> list[cst.CSTNode]:
        """The classes and the functions of this file their methods call."""
        steps = self.context.loops
        found: list[cst.CSTNode] = list(modules)
        for cls in modules:
            found += [f for f in steps.functions_reached(cls.body) if f not in found]
        return found

    def _recurrent_in(self, modules: tuple[cst.ClassDef, ...]) -> str | None:
        """A cuDNN RNN the modules build (`nn.LSTM(...)`), said as the start of a sentence."""
        names = self.context.names
        for cls in modules:
            for call in self.context.index.find(cst.Call, within=cls):
                if any(autocast_float16(name) for name in names.may_name(call.func)):
                    return f"`{self.context.source(call.func)}` (line {self.context.line(call)}) is a cuDNN RNN"
        return None

    def _taken_names(self) -> set[str]:
        """Every name the file spells, found once for all its loops."""
        if self._taken is None:
            self._taken = {name.value for name in self.context.index.find(cst.Name)}
        return self._taken

    # -- where the policy is built ---------------------------------------------------

    def _placement(self, loop: TrainingLoop, model, policy: str, scaler: str | None) -> _Placement | str:
        """Where the policy (and the fp16 scaler) is built once, and how the forward
        pass spells it: before the outermost loop of the step loop's function when
        the device is defined there; else as an attribute set where a trainer class
        moves its model; else, in a helper, before the helper or at its top."""
        training = self.context.training
        index = self.context.index
        device = model.device
        device_code = training.code(device) if device is not None else '"cuda"'
        if device is not None and not self._is_plain(device):
            return f"the device `{device_code}` is not a plain expression the policy can be built from"
        region = loop.forward.statements[0]
        helper = None if index.inside(region, loop.loop) else index.first_enclosing(region, cst.FunctionDef)
        prefer = ', prefer="fp16"' if scaler is not None else ""

        def build(target: str, device_code: str) -> list[cst.BaseStatement]:
            lines = [cst.parse_statement(f"{target}{policy} = Precision.for_device({device_code}{prefer})\n")]
            if scaler is not None:
                lines.append(cst.parse_statement(f"{target}{scaler} = {target}{policy}.grad_scaler()\n"))
            return lines

        if helper is None and not self._moved_only_sometimes(model, loop):
            outer = self._outermost_loop(loop.loop)
            if device is None or training.visible_at(device, outer):
                return _Placement([InsertBefore(outer, tuple(build("", device_code)))], policy, scaler)
            parameter = self._device_parameter(device, index.first_enclosing(outer, cst.FunctionDef))
            if parameter is not None:  # `train(model, device, ...)`: the function's own name for it
                return _Placement([InsertBefore(outer, tuple(build("", parameter)))], policy, scaler)
        found = self._attribute_placement(loop, model, helper, policy, scaler, build, device_code)
        if found is not None:
            return found
        if helper is not None and device is not None and not self._moved_only_sometimes(model, loop):
            after_move = self._after_move(model, helper)
            if after_move is not None:
                return _Placement([InsertAfter(after_move, tuple(build("", device_code)))], policy, scaler)
            first = _first_statement(helper)
            if scaler is None and first is not None and training.visible_at(device, first):
                return _Placement([InsertBefore(first, tuple(build("", device_code)))], policy, None)
        # The device the model's parameters are on when the loop starts.
        parameters_device = f"next({model.expression}.parameters()).device"
        expression = cst.parse_expression(parameters_device)
        anchor = (
            self._outermost_loop(loop.loop)
            if helper is None
            else (_first_statement(helper) if scaler is None else None)
        )
        if anchor is not None and training.visible_at(expression, anchor):
            return _Placement([InsertBefore(anchor, tuple(build("", parameters_device)))], policy, scaler)
        return f"the device `{device_code}` is not defined where the policy would be built"

    def _moved_only_sometimes(self, model, loop: TrainingLoop) -> bool:
        """Is the model put on CUDA by a `.cuda()` under an `if` that the training loop is
        not in (`if args.cuda: model.cuda()`)? Then it may stay on the CPU, and the policy
        is built from the device its parameters are on, not from "cuda"."""
        if model.device is not None or method_name(model.move) != "cuda":
            return False
        index = self.context.index
        return any(
            not index.inside(loop.loop, block) and not is_main_guard(block.test)
            for block in self.context.kinds.enclosing(model.move, cst.If)
        )

    def _attribute_placement(self, loop, model, helper, policy, scaler, build, device_code) -> _Placement | None:
        """`self.precision = Precision.for_device(device)` right after a trainer class
        moves its model (`self.model = model.to(device)` in `__init__`), for a forward
        pass in a method of that class."""
        index = self.context.index
        function = helper or index.first_enclosing(loop.loop, cst.FunctionDef)
        if model.move is None or function is None or not self._is_method(function):
            return None
        mover = index.first_enclosing(model.move, cst.FunctionDef)
        if mover is None or not self._is_method(mover):
            return None
        cls = self.context.kinds.class_of(function)
        if cls is None or self.context.kinds.class_of(mover) is not cls:
            return None
        statement = index.statement_of(model.move)
        if self._moved_only_sometimes(model, loop):
            # `if self.use_cuda: self.model = self.model.cuda()`: after the `if`, from the
            # device the parameters are on then.
            statement = next(
                (
                    s
                    for s in self.context.kinds.enclosing(model.move, cst.If)
                    if self.context.parents.get(s) is not None
                    and self.context.parents.get(self.context.parents.get(s)) is mover
                ),
                None,
            )
            user_self = function.params.params[0].name.value
            if statement is None or not model.expression.startswith(f"{user_self}."):
                return None
            attribute = model.expression.removeprefix(f"{user_self}.")
            device_code = f"next({mover.params.params[0].name.value}.{attribute}.parameters()).device"
        elif not isinstance(statement, cst.SimpleStatementLine) or not isinstance(
            self.context.parents.get(statement), cst.IndentedBlock
        ):
            return None
        if index.first_enclosing(statement, cst.FunctionDef) is not mover or index.first_enclosing(
            statement, (cst.For, cst.While)
        ):
            return None
        attributes = {a.attr.value for a in index.find(cst.Attribute)}
        if policy in attributes or (scaler is not None and scaler in attributes):
            return None
        mover_self = mover.params.params[0].name.value
        user_self = function.params.params[0].name.value
        return _Placement(
            [InsertAfter(statement, tuple(build(f"{mover_self}.", device_code)))],
            f"{user_self}.{policy}",
            f"{user_self}.{scaler}" if scaler is not None else None,
        )

    def _device_parameter(self, device: cst.BaseExpression, function: cst.FunctionDef | None) -> str | None:
        """The parameter of `function` that every call of it passes `device` to, as the
        callers spell it (`train(args, model, device, loader)`)."""
        if function is None:
            return None
        calls = self.context.loops.call_sites(function)
        if not calls:
            return None
        spelled = self.context.source(device)
        for param in (*function.params.params, *function.params.kwonly_params):
            arguments = [argument_for(call, function, param) for call in calls]
            if all(a is not None and self.context.source(a) == spelled for a in arguments):
                if not any(
                    self.context.inside(b.node, function.body)
                    for b in self.context.bindings.assignments(param.name) or ()
                    if b.node is not param.name
                ):
                    return param.name.value
        return None

    def _after_move(self, model, helper: cst.FunctionDef) -> cst.BaseStatement | None:
        """The statement that moves the model, when the helper sees the names it binds:
        a statement of the module, or of a function around the helper, not in a loop."""
        index = self.context.index
        statement = index.statement_of(model.move)
        block = self.context.parents.get(statement)
        if not isinstance(statement, cst.SimpleStatementLine) or not isinstance(block, (cst.Module, cst.IndentedBlock)):
            return None
        owner = index.first_enclosing(statement, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.For, cst.While))
        if isinstance(owner, (cst.For, cst.While, cst.ClassDef, cst.Lambda)):
            return None
        if owner is not None and not index.inside(helper, owner):
            return None
        return statement

    def _is_method(self, function: cst.FunctionDef) -> bool:
        return (
            self.context.kinds.class_of(function) is not None
            and bool(function.params.params)
            and not any(self.context.source(d.decorator) == "staticmethod" for d in function.decorators)
        )

    # -- autocast already there, or refused --------------------------------------------

    def _autocast_in_forward(self, loop: TrainingLoop) -> list[cst.CSTNode]:
        """Autocast entered by what the forward pass runs: the model's own forward
        method (a class of this file), or a function of this file it calls."""
        if loop.forward is None:
            return []
        functions = self._forward_functions(loop.forward.statements)
        return [
            use for use in self.context.training.autocast_uses if any(self.context.inside(use, f) for f in functions)
        ]

    def _decision_in_forward(self, loop: TrainingLoop) -> cst.Call | None:
        """A call in the forward region whose result steers the program: a value read to
        the host (`.item()`, `.tolist()`) that decides what runs (not one only logged), or
        a sample drawn from the model's output."""
        for statement in loop.forward.statements:
            for call in self.context.loops.own_calls(statement):
                method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
                if method == "sample" and not call.args:
                    return call
                if (
                    method in ("item", "tolist")
                    and not call.args
                    and self.context.training.steers(call, loss=loop.loss) is not None
                ):
                    return call
                if self.context.names.is_(call.func, "torch.multinomial", "torch.bernoulli"):
                    return call
        return None

    def _autocast_unsafe(self, loop: TrainingLoop) -> tuple[cst.Call, str] | None:
        """A call in the forward pass (or in what it runs) that CUDA autocast refuses."""
        for call, name, _ in self._forward_callees(loop):
            if name in AUTOCAST_UNSAFE:
                return call, AUTOCAST_UNSAFE[name]
        return None

    def _autocast_float16(self, loop: TrainingLoop) -> str | None:
        """Why the forward pass (or what it runs) may run a module that CUDA autocast runs
        in float16 whatever its dtype (a cuDNN RNN), said as the start of a sentence."""
        training = self.context.training
        for call, name, built in self._forward_callees(loop):
            if not autocast_float16(name):
                continue
            where = f"`{training.code(call.func)}` (line {self.context.line(call)})"
            if name in AUTOCAST_FLOAT16:
                return f"{where} builds {built}, a cuDNN RNN" if built is not None else f"{where} is a cuDNN RNN"
            return f"{where} builds {built}: the class is picked at run time and may be a cuDNN RNN"
        return None

    def _forward_callees(self, loop: TrainingLoop):
        """(call, qualified name, where it is built) of what the forward pass calls, and of
        the module a call runs where it is a value built here (`criterion(out, y)` with
        `criterion = nn.BCELoss()`, `self.rnn(x)` with `self.rnn = nn.LSTM(...)`), or the
        modules that a model class of another module of the project builds (`model(x)` with
        `model = RNNModel(...)`); the third item says what builds the module, None for the call's own names."""
        names = self.context.names
        steps = self.context.loops
        project = project_of(self.context)
        calls = [c for s in loop.forward.statements for c in steps.own_calls(s)]
        calls += [c for f in self._forward_functions(loop.forward.statements) for c in steps.own_calls(f.body)]
        for call in calls:
            for name in names.may_name(call.func):
                yield call, name, None
            for value in steps.values_of(call.func):
                if isinstance(value, cst.Call):
                    for name in names.may_name(value.func):
                        yield (
                            call,
                            name,
                            None if name in names.of(value.func) else f"`{self.context.source(value.func)}`",
                        )
            for built in self._constructions(call.func) or () if project.imports_project() else ():
                for module in project.modules_built(built.func) or ():
                    text = f"`{module.site.text}`" if module.site.text else f"a module in `{module.site.function}`"
                    yield call, module.name, f"{text} ({project.shown_site(module.site)})"

    def _forward_functions(self, statements) -> list[cst.FunctionDef]:
        """Functions of this file the statements run: helpers they call, and the
        `forward` of model classes of this file they call."""
        steps = self.context.loops
        found: list[cst.FunctionDef] = []
        for statement in statements:
            for call in steps.own_calls(statement):
                targets = [steps.callee(call)]
                cls = self._model_class(call.func)
                if cls is not None:
                    targets.append(local_calls(self.context).method(cls, "forward"))
                for target in targets:
                    if target is not None and target not in found:
                        found.append(target)
                        found.extend(f for f in steps.functions_reached(target.body) if f not in found)
        return found

    def _model_class(self, func: cst.BaseExpression) -> cst.ClassDef | None:
        """The class of this file that `model` in `model(x)` is an instance of."""
        calls = self._constructions(func)
        classes = {sole_definition(self.context.scopes, call.func, cst.ClassDef) for call in calls or ()}
        return classes.pop() if len(classes) == 1 else None

    def _constructions(self, func: cst.BaseExpression, depth: int = 0) -> list[cst.Call] | None:
        """The calls that build the model `model` in `model(x)` is, one per binding (through
        `DistributedDataParallel(model)` and the other wrappers that run its forward, `.to()`,
        and the parameters of a function its callers pass it to); None when a binding is
        something else."""
        steps = self.context.loops
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            func = func.value
        found: list[cst.Call] = []
        for value in steps.values_of(func):
            while (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and value.func.attr.value in ("to", "cuda")
            ):
                value = value.func.value  # `Net().to(device)`
            if isinstance(value, cst.Name) and depth < 4:
                inner = self._constructions(value, depth + 1)  # a parameter: what the caller passes
                if inner is None:
                    return None
                found += inner
                continue
            if not isinstance(value, cst.Call):
                return None
            wrapped = positional(value, 0) if self.context.names.of(value.func) & MODEL_WRAPPERS else None
            if wrapped is not None and wrapped.value.deep_equals(func):
                continue  # `model = DDP(model)`: the model the name's other bindings hold
            if wrapped is not None and depth < 4:
                inner = self._constructions(wrapped.value, depth + 1)
                if inner is None:
                    return None
                found += inner
            else:
                found.append(value)
        return found

    # -- fp16 ----------------------------------------------------------------------

    def _fp16_problem(self, loop: TrainingLoop) -> str | None:
        """Why the GradScaler calls cannot be placed, or None."""
        if len(loop.optimizers) != 1:
            return f"fp16 needs one GradScaler step per optimizer; this loop steps {len(loop.optimizers)}"
        for step in loop.steps:
            if not self._own_line(step.call):
                return "the optimizer step shares a one-line block; `scaler.update()` cannot follow it"
        if loop.clips:
            clip = min(loop.clips, key=self.context.index.order)
            if not self._own_line(clip) or not all(
                self._clips_before_step(c, s) for c in loop.clips for s in loop.steps
            ):
                return (
                    "gradient clipping is not in the optimizer step's block before the step; "
                    "`scaler.unscale_` could not run exactly once per step"
                )
        return None

    def _scale_edits(self, loop: TrainingLoop, scaler: str) -> list[Edit]:
        """`scaler.scale(loss).backward()`, `scaler.step(opt)` then `scaler.update()`, and
        `scaler.unscale_(opt)` before clipping; each a small edit that keeps what other
        fixes do inside it."""
        training = self.context.training
        receiver = cst.parse_expression(scaler)
        backward = loop.backwards[0].call
        edits: list[Edit] = [
            Replace(backward.func.value, lambda loss: _method(receiver, "scale", loss.with_changes(lpar=[], rpar=[])))
        ]
        for step in loop.steps:
            edits.append(Replace(step.call, lambda call: _method(receiver, "step", call.func.value)))
            edits.append(InsertAfter(training.statement_of(step.call), (cst.parse_statement(f"{scaler}.update()\n"),)))
        if loop.clips:
            clip = min(loop.clips, key=self.context.index.order)
            optimizer = training.code(loop.steps[0].optimizer)
            edits.append(
                InsertBefore(training.statement_of(clip), (cst.parse_statement(f"{scaler}.unscale_({optimizer})\n"),))
            )
        return edits

    def _clips_before_step(self, clip: cst.Call, step) -> bool:
        """Is `clip` in the step's block, before it, and not inside a nested loop there?"""
        training = self.context.training
        step_statement = training.statement_of(step.call)
        block = self.context.parents.get(step_statement)
        current = training.statement_of(clip)
        while not isinstance(current, (cst.For, cst.While)):
            parent = self.context.parents.get(current)
            if parent is block:
                return self.context.index.before(current, step_statement)
            if parent is None:
                return False
            current = parent
        return False  # a loop between the clip and the step's block would unscale_ more than once

    def _own_line(self, call: cst.Call) -> bool:
        statement = self.context.training.statement_of(call)
        return isinstance(statement, cst.SimpleStatementLine) and isinstance(
            self.context.parents.get(statement), cst.IndentedBlock
        )

    # -- helpers -------------------------------------------------------------------

    def _narrow_step(self, loop: TrainingLoop) -> str | None:
        """Why 16-bit products buy nothing: every model the step runs is sized, none convolves,
        and each matrix product they make waits for memory in float32 already; None otherwise."""
        work = sizes_of(self.context).step_work(loop.loop)
        if work is None or work.convolves:
            return None
        if not work.products:
            return "the models the step runs make no matrix product or convolution: autocast has nothing to speed up"
        why = widest_memory_bound(work.products)
        return (
            f"every matrix product of the step is bound by memory, not arithmetic: {why}; autocast would "
            "add a cast before each product and speed up nothing"
            if why
            else None
        )

    def _decline(self, loop: TrainingLoop, why: str | None) -> None:
        self.report(self._forward_start(loop), f"{self.MESSAGE} (not fixed: {why})")

    @staticmethod
    def _forward_start(loop: TrainingLoop) -> cst.CSTNode:
        """Where to point the user: the forward pass's first statement, else the loop."""
        return loop.forward.statements[0] if loop.forward is not None and loop.forward.statements else loop.loop

    def _outermost_loop(self, loop: cst.CSTNode) -> cst.CSTNode:
        """The loop to put the policy before: the outermost loop around `loop` in its function."""
        outer = loop
        for current in self.context.index.ancestors(loop):
            if isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if isinstance(current, (cst.For, cst.While)):
                outer = current
        return outer

    def _is_plain(self, expr: cst.BaseExpression) -> bool:
        """A device expression that is safe to evaluate once more, before the loop:
        names, attributes, strings, and `torch.device(...)` of those."""
        if isinstance(expr, (cst.Name, cst.SimpleString, cst.Integer)):
            return True
        if isinstance(expr, cst.Attribute):
            return self._is_plain(expr.value)
        if (
            isinstance(expr, cst.Subscript)
            and len(expr.slice) == 1
            and isinstance(expr.slice[0].slice, cst.Index)
            and isinstance(expr.slice[0].slice.value, (cst.SimpleString, cst.Integer))
        ):
            return self._is_plain(expr.value)  # `cfg["device"]`
        if isinstance(expr, cst.Call) and self.context.names.is_(expr.func, "torch.device"):
            return all(self._is_plain(arg.value) for arg in expr.args)
        return False


@dataclass
class _Placement:
    edits: list[Edit]  # the statements that build the policy (and scaler)
    policy: str  # how the forward pass spells it: `precision`, `self.precision`
    scaler: str | None


def _first_statement(function: cst.FunctionDef) -> cst.BaseStatement | None:
    """The first statement of a function's body after its docstring."""
    body = function.body
    if not isinstance(body, cst.IndentedBlock):
        return None
    statements = list(body.body)
    if statements and m.matches(
        statements[0], m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])
    ):
        statements = statements[1:]
    return statements[0] if statements else None


def _method(receiver: cst.BaseExpression, name: str, argument: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name(name)), args=[cst.Arg(argument)])

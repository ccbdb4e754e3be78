from __future__ import annotations

import libcst as cst

from codemod.analysis.forward_runs import ForwardRuns, forward_runs
from codemod.analysis.lightning import TrainerBuild, lightning_trainers
from codemod.analysis.policy_sites import policy_sites
from codemod.analysis.torch_facts import (
    LIGHTNING_FLOAT16_PRECISION,
    LIGHTNING_FULL_PRECISION,
    LIGHTNING_GPU_ACCELERATORS,
    LIGHTNING_MIXED_PRECISION,
    LIGHTNING_PRECISION_KEYWORD,
)
from codemod.analysis.training import TrainingLoop
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

    A model call is the model's own, or a call of a function of the file that
    runs a model (an `encode(texts)` defined in each branch of an `if` that
    picks the encoder).

    The policy goes before the loop when the device is defined there; in a
    trainer class whose `__init__` moves the model, right after that move
    (`self.precision = Precision.for_device(device)`, used as
    `self.precision.autocast()`); for a training step in a helper function,
    right after the statement that moves the model. Where the device is
    defined nowhere the forward pass can see, or the model is put on CUDA by a
    `.cuda()` that an `if` may skip (`if args.cuda: model.cuda()`), the policy
    reads the model's own: `Precision.for_device(next(model.parameters()).device)`
    (in a trainer class, set once right after the `if` in the method that moves the model;
    in a step helper given the model, at the helper's top, so built again on each call:
    a few microseconds, the device of its first parameter read).

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
    script shows, through the module classes of the file and of the
    project, each built with what its construction passes, a config dict
    included), that convolve
    nothing, and whose every matrix product is bound by memory in float32
    already (a `Linear(20, 1)`: under 12.5 flops per byte it moves, the
    ratio of an A100's float32 arithmetic to its memory bandwidth) is
    reported, not fixed: autocast would add a cast before each product and
    speed up no arithmetic that takes time. So is one whose every product,
    over the rows of the batch the models are called on (a DataLoader's
    `batch_size` and its dataset's items, a tensor made in the step:
    samples, times positions for a batch of token ids), takes less device
    time in float32 than the 5 us the host takes to launch a kernel: the
    GPU already waits for the host, and the casts autocast adds are more
    kernels to launch. A batch perfmod cannot size keeps the fix.

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
    accelerator that cannot be told, or that is a GPU only as the script is
    written through an expression that cannot be evaluated again (the default
    of an environment variable, `os.environ.get("ACCEL", "gpu")`); `plugins=`
    (a precision plugin there and `precision=` together are refused) or
    `**kwargs`; a Trainer whose trained module is not a LightningModule class
    of the file, or is not trained by a `fit(...)` of the file; and, with `amp = "bf16"`, a module that builds a
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
            HEAD.replace(
                "model = nn.Linear(512, 512).to(device)",
                "model = nn.Linear(512, 512)\nmodel.to(device).to(torch.bfloat16)",
            )
            + LOOP,
            "the model is cast to bfloat16: its forward pass does not run in float32",
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
                RNN_MODEL.replace("self.rnn(x.unsqueeze(1))[0][:, -1]", "x")
                + "\nmodel.encoder = nn.GRU(8, 8, batch_first=True).to(device)"
                + "\ndef step_loss(net, x, y):\n    h = net.encoder(x[:, :8].unsqueeze(1))[0][:, -1]"
                + "\n    return F.cross_entropy(net(x) + h.sum(), y)",
            )
            + LOOP.replace("logits = model(x)\n    loss = F.cross_entropy(logits, y)", "loss = step_loss(model, x, y)"),
            None,
            "a helper given the model runs its cuDNN RNN: followed through the parameter, not fixed with bf16",
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

    def visit_Module(self, node: cst.Module) -> None:
        for build in lightning_trainers(self.context).builds:
            if build.precision is None:
                self._check_trainer(build)
        if "backward" not in self.context.code:
            return  # no training loop of its own (a file that only builds a Trainer)
        runs = forward_runs(self.context)
        for loop in runs.unwrapped():
            self._check(loop, runs)

    def _check(self, loop: TrainingLoop, runs: ForwardRuns) -> None:
        if self._precision_set_elsewhere(loop, runs) or self._forward_not_wrapped(loop, runs):
            return
        fp16 = self.context.settings.amp == "fp16"
        problem = runs.lower_precision_problem(loop, fp16)
        if problem is not None:
            return self._decline(loop, problem)
        self._wrap(loop, runs, fp16)

    def _precision_set_elsewhere(self, loop: TrainingLoop, runs: ForwardRuns) -> bool:
        """Is the loop's precision chosen by its author, an engine, or autocast of its own?
        Reports why it is left as it is where the author should look."""
        training = self.context.training
        chosen = runs.precision_chosen(loop)
        if chosen is not None:
            self._decline(loop, chosen)
            return True
        owner = runs.precision_owner(loop)
        if owner is not None:
            if not owner.configured:  # else the engine is told its precision where it is built
                self.report(
                    runs.start(loop),
                    f"the training runs through `{training.code(owner.call.func)}` "
                    f"(line {self.context.line(owner.call)}), which applies the mixed precision it is configured "
                    f"with: pass `{owner.keyword}=` to it (or set it in the launcher's configuration) rather than "
                    "wrapping the forward pass in autocast",
                )
            return True
        if runs.autocast_inside(loop):
            return True  # the model's forward (or a helper it calls) enters autocast itself
        elsewhere = runs.elsewhere()
        if elsewhere:
            self._decline(
                loop,
                f"autocast is already used at line {self.context.line(elsewhere[0])}; "
                "check whether it covers this loop's forward pass",
            )
            return True
        if loop.scaler is not None:
            self._decline(
                loop,
                f"`{loop.scaler.expression}` scales the loss but no autocast is on; "
                "add autocast around the forward pass by hand",
            )
            return True
        return False

    def _forward_not_wrapped(self, loop: TrainingLoop, runs: ForwardRuns) -> bool:
        """Is there no forward pass autocast could speed up (none, an unknown one, one that
        decides what runs next, one on the host or on an unknown device)? Reports those
        the author should look at."""
        if runs.no_model_call(loop):
            return True
        if loop.forward is None:
            self._decline(loop, loop.forward_problem)
            return True
        why = runs.steering(loop)
        if why is None and runs.device_untold(loop):
            why = "cannot tell which device the model runs on"
        if why is not None:
            self._decline(loop, why)
            return True
        return runs.device_model(loop) is None or runs.on_host(loop)

    def _wrap(self, loop: TrainingLoop, runs: ForwardRuns, fp16: bool) -> None:
        """Build the precision policy where the model is moved and wrap the forward pass in
        its autocast (and, for fp16, scale the loss with its GradScaler)."""
        sites = policy_sites(self.context)
        names = sites.free_names(POLICY_NAMES, SCALER_NAMES) if fp16 else sites.free_names(POLICY_NAMES)
        if names is None:
            return self._decline(loop, "the names the fix would use are all taken")
        site = sites.site(loop, runs.device_model(loop), names, stateful=fp16)
        if isinstance(site, str):
            return self._decline(loop, site)
        policy = names[0]
        prefer = ', prefer="fp16"' if fp16 else ""
        built = [cst.parse_statement(f"{site.target}{policy} = Precision.for_device({site.device}{prefer})\n")]
        if fp16:
            built.append(cst.parse_statement(f"{site.target}{names[1]} = {site.target}{policy}.grad_scaler()\n"))
        build = (InsertAfter if site.after else InsertBefore)(site.anchor, tuple(built))
        first, last = runs.wrapped(loop)
        item = cst.WithItem(cst.parse_expression(f"{site.spelled}{policy}.autocast()"))
        edits: list[Edit] = [build, Wrap(first, last, (item,))]
        if fp16:
            edits += self._scale_edits(loop, f"{site.spelled}{names[1]}")
        self.report(runs.start(loop), edits=edits, imports=[POLICY_IMPORT])

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
        where = lightning_trainers(self.context).accelerator(build)
        if where.place == "other":
            return  # the CPU, a TPU, MPS...: not a CUDA GPU
        if where.place == "auto":
            return self._decline_trainer(
                build, where.why, wanted + ' when it trains on a CUDA GPU (or `accelerator="gpu"`)'
            )
        if where.place == "unknown":
            return self._decline_trainer(build, where.why, wanted + " for a CUDA GPU")
        if where.place == "option" and not where.follows:
            why = f"the accelerator `{training.code(build.accelerator)}` is a CUDA GPU only as the script is written"
            return self._decline_trainer(build, f"{why}, and the precision cannot be chosen from it", wanted)
        if not build.modules:
            why = (
                "no `fit(...)` of it in this file names the module it trains"
                if build.modules is not None
                else "the module its `fit(...)` trains is not a LightningModule class of this file"
            )
            return self._decline_trainer(
                build, f"{why}, so whether that module already autocasts cannot be told", wanted
            )
        runs = forward_runs(self.context)
        if runs.autocasts_in(build.modules):
            return  # the module enters autocast itself
        recurrent = None if fp16 else runs.recurrent_in(build.modules)
        if recurrent is not None:
            return self._decline_trainer(
                build,
                f"{recurrent}, which CUDA autocast runs in float16 whatever dtype it is given: "
                f"bf16 would train it in float16 without a gradient scaler",
                f'{LIGHTNING_PRECISION_KEYWORD}="{LIGHTNING_FLOAT16_PRECISION}" (float16 with a gradient scaler)',
            )
        value: cst.BaseExpression = cst.SimpleString(f'"{precision}"')
        if where.place == "option":  # the precision follows the option, which the command line may change
            choices = ", ".join(f'"{name}"' for name in LIGHTNING_GPU_ACCELERATORS)
            accelerator = training.code(build.accelerator)
            if not isinstance(build.accelerator, (cst.Name, cst.Attribute, cst.SimpleString, cst.Subscript)):
                accelerator = f"({accelerator})"  # `"gpu" if a else b` compared as a whole
            value = cst.parse_expression(
                f'"{precision}" if {accelerator} in ({choices}) else "{LIGHTNING_FULL_PRECISION}"'
            )
        self.report(
            build.call,
            f"{self.MESSAGE}: the Trainer runs every training_step in float32 on the GPU; pass {wanted}",
            edits=[AddKeyword(build.call, LIGHTNING_PRECISION_KEYWORD, value)],
        )

    def _decline_trainer(self, build: TrainerBuild, why: str | None, wanted: str) -> None:
        self.report(
            build.call,
            f"{self.MESSAGE}: the Trainer runs every training_step in float32; pass {wanted} (not fixed: {why})",
        )

    # -- fp16 ----------------------------------------------------------------------

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

    # -- helpers -------------------------------------------------------------------

    def _decline(self, loop: TrainingLoop, why: str | None) -> None:
        self.report(forward_runs(self.context).start(loop), f"{self.MESSAGE} (not fixed: {why})")


def _method(receiver: cst.BaseExpression, name: str, argument: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name(name)), args=[cst.Arg(argument)])

from __future__ import annotations

import libcst as cst

from codemod.analysis.names import integer_value, kwarg
from codemod.rule import Invalid, Level, Rule, Valid

PREAMBLE = """\
import argparse
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=1)
args = parser.parse_args()
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(8, 1).to(device)
opt = torch.optim.AdamW(model.parameters())
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
"""
STEP = (
    "    loss = F.mse_loss(model(x.to(device)), y.to(device))\n"
    "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
)
TEXTS = """\
texts = [f"sample {i}" for i in range(64)]
N = len(texts)
for epoch in range(2):
    perm = torch.randperm(N)
    for step in range(N // args.batch_size):
        idx = perm[step * args.batch_size:(step + 1) * args.batch_size]
        batch = [texts[i] for i in idx.tolist()]
        x, y = torch.randn(len(batch), 8), torch.randn(len(batch), 1)
"""


class DefaultBatchSizeOfOne(Rule):
    """
    ## What it does
    Finds a command-line option whose default of 1 is the batch size of a
    training loop that may run on a GPU: the option's value reaches the
    `batch_size` of a DataLoader that feeds a loop that trains, or the width
    of the windows a training loop cuts its batches with
    (`perm[step * args.batch_size:(step + 1) * args.batch_size]`). Options
    read only by evaluation or generation loops, options the user must give,
    and scripts that keep every tensor on the CPU are not reported.

    ## Why is this bad?
    A step over one sample launches the same kernels as a step over many, each
    on a sliver of work: the run is bound by the per-step overhead (Python,
    kernel launches, the optimizer's update of every parameter), not by
    arithmetic, and a GPU sits mostly idle. Measured on a CPU
    (`python -m benchmarks.bench_batch_size`: a two-layer causal transformer,
    d_model 128, sequences of 128 tokens, AdamW; torch 2.13, 2 threads of a
    machine shared with other work, two runs), a training step at batch 8
    processes 2.8 to 4.2 times as many tokens per second as at batch 1, and
    at batch 32 6.1 to 6.5 times as many. On a GPU the gap is expected to be
    wider, since a step at batch 1 leaves most of the device unused
    (`python -m benchmarks.bench_batch_size --device cuda` measures it).

    ## Example
    ```python
    parser.add_argument("--batch_size", type=int, default=1)
    ...
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    ```
    Use instead:
    ```python
    parser.add_argument("--batch_size", type=int, default=32)
    ...
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    ```
    Pick the largest batch that fits in memory; keep the samples per
    optimizer step you need with gradient accumulation, and scale the
    learning rate with the batch size.

    ## Fix safety
    Never fixed: the batch size changes what training computes (the gradient
    of each step, how many steps an epoch has, the learning rate that works,
    the memory a step needs). A batch of 1 may also be deliberate (samples of
    different lengths without padding, a model too large for more).
    """

    CODE = "PM204"
    NAME = "default-batch-size-of-one"
    LEVEL = Level.UNSAFE
    REQUIRES = ("add_argument",)
    MESSAGE = "the training batch size defaults to 1"
    GAIN = (
        "measured on a CPU: about 3x the tokens/s at batch 8 and 6x at batch 32 for a small transformer; "
        "more on a GPU, which batch 1 leaves mostly idle"
    )

    VALID = [
        Valid(
            PREAMBLE.replace("default=1", "default=32")
            + "for x, y in DataLoader(data, batch_size=args.batch_size, shuffle=True):\n"
            + STEP,
            "the default is a real batch",
        ),
        Valid(
            PREAMBLE.replace('"--batch_size", type=int, default=1', '"--batch_size", type=int, required=True')
            + "for x, y in DataLoader(data, batch_size=args.batch_size, shuffle=True):\n"
            + STEP,
            "the user must give the batch size",
        ),
        Valid(
            PREAMBLE.replace("--batch_size", "--eval_batch_size") + "model.eval()\nwith torch.no_grad():\n"
            "    for x, y in DataLoader(data, batch_size=args.eval_batch_size):\n"
            "        print(F.mse_loss(model(x.to(device)), y.to(device)).item())\n",
            "an evaluation loop: no backward",
        ),
        Valid(
            PREAMBLE.replace('torch.device("cuda" if torch.cuda.is_available() else "cpu")', 'torch.device("cpu")')
            + "for x, y in DataLoader(data, batch_size=args.batch_size, shuffle=True):\n"
            + STEP,
            "every tensor stays on the CPU",
        ),
        Valid(
            PREAMBLE.replace("--batch_size", "--grad_accum_steps")
            + "for x, y in DataLoader(data, batch_size=16, shuffle=True):\n"
            + STEP,
            "an option of 1 that is not the batch size",
        ),
        Valid(
            PREAMBLE + "class Trainer:\n    def __init__(self, train_data: DataLoader):\n"
            "        self.train_data = train_data\n\n    def fit(self):\n        for x, y in self.train_data:\n"
            + STEP.replace("    ", "            ")
            + "\n\nTrainer(DataLoader(data, batch_size=32)).fit()\n",
            "a loader handed over as an annotated parameter, built with a batch of 32",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + "for x, y in DataLoader(data, batch_size=args.batch_size, shuffle=True):\n" + STEP,
            None,
            "the default reaches the training DataLoader",
        ),
        Invalid(
            PREAMBLE + "bs = args.batch_size\nloader = DataLoader(data, bs, shuffle=True)\n"
            "for epoch in range(2):\n    for x, y in loader:\n" + STEP.replace("    ", "        "),
            None,
            "through a name, as DataLoader's second argument",
        ),
        Invalid(PREAMBLE + TEXTS + STEP.replace("    ", "        "), None, "the width of the step's batch window"),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        context = self.context
        if context.training.accelerator_use is None:
            return  # every tensor stays on the CPU
        reported: set[int] = set()
        for size, where in context.loaders.training_batch_sizes:
            option = context.loaders.setting_option(size)
            if option is None or id(option.call) in reported or integer_value(option.default) != 1:
                continue
            required = kwarg(option.call, "required")
            if required is not None and not (isinstance(required.value, cst.Name) and required.value.value == "False"):
                continue  # the user must give it: the default never applies
            reported.add(id(option.call))
            self.report(
                option.call,
                f"the batch size of this training loop defaults to 1 (`{context.source(size)}`, used on line "
                f"{context.line(where)}): every step pays the per-step overhead (Python, kernel launches, the "
                "optimizer's update) for one sample, and a GPU sits mostly idle; measured on a CPU, a small "
                "transformer trains about 3x the tokens/s at batch 8 and 6x at batch 32; "
                "default to the largest batch that fits, with gradient accumulation and the learning "
                "rate scaled to match; not changed automatically: the batch size changes what training computes",
            )

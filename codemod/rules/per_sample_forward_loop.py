from __future__ import annotations

import libcst as cst

from codemod.analysis.loop_edits import unwrap
from codemod.analysis.sample_loops import NotBatchable, sample_loops
from codemod.edits import Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid

PREAMBLE = """\
import torch
import torch.nn.functional as F
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
    def forward(self, x):
        return self.fc(x)
model = Net()
x, y = torch.randn(8, 4), torch.randint(3, (8,))
total = 0.0
"""


class PerSampleForwardLoop(Rule):
    """
    ## What it does
    Finds a loop over the samples of a batch that runs the model on one
    sample at a time and calls `backward()` per sample,

        for i in range(x.size(0)):          # or range(batch_size), zip(x, y), enumerate(x), x.split(1)
            out = model(x[i:i+1])           # or x[i].unsqueeze(0), x[i][None], xi.view(1, -1)
            loss = F.cross_entropy(out, y[i:i+1])
            loss.backward()
            total += loss.item()

    (or that appends each sample's loss to a list that is stacked after the
    loop), and replaces it with one forward and one backward over the whole
    batch. The per-sample backward calls add their gradients up, so the
    batched loss must be the sum of the per-sample losses. A
    `reduction="sum"` loss, or a loss built from sums, is kept as it is. An
    element-wise mean (`mse_loss`, `.mean()` of an element-wise expression)
    is multiplied by the batch size: every sample has as many elements. A
    `cross_entropy` or `nll_loss` mean divides each sample by its own count
    of targets that are not `ignore_index`, which differ between padded
    sequences, so the fix keeps those per-sample means: `reduction="none"`,
    summed per sample, divided by the sample's count, and added up. With one
    class target a sample (a target batch `y` of shape (B,)), each sample's
    mean is its loss, so the fix writes torch's own `reduction="sum"` (its
    mean, for a loop that divides each loss by the batch size); a target
    equal to `ignore_index` then adds nothing, where the loop's mean over no
    target was NaN. A
    `loss / len(x)` the loop applied to each sample turns the sum into a
    mean. A loss computed by a function of the same file is followed into
    it: a sum or an element-wise mean keeps the call, a token mean is
    written out with the per-sample means, and a function that sums over
    its batch of one (`.sum(0)`: a loss over positions written for one
    batch, averaged per position) is written out for the batch without that
    sum; one that would then compute a value twice is called per sample on
    the batched output instead. What the loop adds up per sample
    (`total += loss.item()`, `correct += (pred == y).sum()`, `tokens +=
    targets.numel()`) is therefore the same number.

    The samples may be taken apart and reshaped on the way (`seq =
    batch[i]; inputs = seq[:-1].unsqueeze(0); targets = seq[1:]`,
    `logits.squeeze(0)`, `logits.view(-1, V)`): the fix rewrites each step for
    the batch (`batch[:, :-1]`, and the per-sample targets flattened as the
    logits are), and several model calls per sample (a pair of inputs) each
    become one batched call. A loop over `range(BATCH)` visits the samples
    when the batch it indexes was built with `BATCH` rows (`batch =
    torch.randint(0, V, (BATCH, T))`).

    A sample given to the model without a batch dimension (`for seq in
    batch: logits = model(seq[:-1])`) becomes the batch (`batch[:, :-1]`)
    when every layer of the model acts on the last dimensions (`nn.Linear`,
    `nn.Embedding`, `nn.LayerNorm`, activations) and its `forward` counts
    every dim it names from the end (`x.size(-2)`, `softmax(dim=-1)`,
    `x[..., 0]`): then each row of the batch gets what the sample got
    alone, and the per-position loss is taken over the flattened positions,
    per sample. The model may be a parameter of the function that holds
    the loop (`def train_epoch(model, loader, optimizer)`) when every call
    of that function passes a model built in this file. The forward and the
    backward may sit in a function of this file the loop calls once per
    sample (`total += train_step(model, x[i:i+1], y[i:i+1])`): when the loop
    is its only caller, the function is batched where it is and the loop
    calls it once with the whole batch.

    Reported without a fix: the model has a BatchNorm layer (in training mode
    it normalises each sample with the batch's statistics, so batching changes
    the model's output), the model's class is not defined in this file (the
    rule cannot see whether it mixes samples), the loop uses per-sample
    functional parameters (`torch.func.functional_call`, MAML-style inner
    loops), branches on the values of a sample, iterates over a Python list
    of examples (they may differ in shape), runs the model on a sample
    without its batch dimension while a layer or the `forward` reads a dim
    counted from the front (`x.size(0)`, `x.view(1, -1)`, `x.mean(0)`, an
    `nn.GRU`, whose unbatched input is `(T, H)`), runs its step in a
    function that is called elsewhere too, or keeps its result per sample
    (`metrics[i] = train_step(...)`), or does anything else with a sample
    than feed it to the model and the loss. A loop that also steps the
    optimizer per sample is training with batch size 1, another algorithm,
    and is left alone, as are loops without `backward()` (metrics).

    ## Why is this bad?
    A batch of B samples run one at a time costs B forward and B backward
    passes of matrix-vector work, each with its own kernel launches and
    Python overhead, instead of one pass of matrix-matrix work: on a GPU the
    per-sample loop leaves most of the device idle between small kernels.
    Measured on a CPU (torch 2.13, one thread, a 2-layer transformer LM,
    batch 8 x 64 tokens, `python -m benchmarks.bench_batching`): 1.3-2.0x
    tokens/s for the whole training step over five runs on a busy two-core
    machine; the same benchmark takes `--device cuda`.

    The batched loss must be the *sum* of the per-sample losses: B
    `backward()` calls add up B gradients, and a batch-mean loss would give
    1/B of that sum (a learning rate B times too small).

    ## Example
    ```python
    for x, y in loader:
        for i in range(x.size(0)):
            logits = model(x[i:i+1])
            loss = F.cross_entropy(logits.view(-1, vocab), y[i:i+1].view(-1))
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ```
    Use instead:
    ```python
    for x, y in loader:
        logits = model(x)
        loss = (F.cross_entropy(logits.view(-1, vocab), y.view(-1), reduction="none").view(x.size(0), -1).sum(1)
                / (y.view(-1) != -100).view(x.size(0), -1).sum(1)).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ```

    ## Fix safety
    Unsafe: the fix is exact (up to floating-point rounding) only for models
    that treat every sample on its own, and the rule proves that only of the
    layers it can see: the model's class must be defined in this file and use
    no BatchNorm, and each of its submodules must be a `torch.nn` layer or
    another class of this file. It cannot see samples mixed by hand in
    `forward` (`x.mean(0)`, attention across the batch). Dropout draws its
    masks differently for one batch than for B single samples: the same
    distribution, not the same numbers.

    The per-sample means of `cross_entropy`/`nll_loss` assume what a loop
    over `F.cross_entropy(out, y[i:i+1])` implies: the targets are class
    indices, each counted once (probability targets have no `ignore_index`,
    and the count would include their class dimension); the batch must be
    the leading dimension of the model's output. `cross_entropy` with class
    `weight=` and a mean is reported without a fix (each sample divides by
    its own sum of weights), as are loss modules built with arguments that
    are not literals.

    The model's output and the targets must have the same shape, as the
    loss functions ask: a broadcast that works for one sample (an output of
    `(1, 3)` against a target of `(1,)`) fails for a batch, or, when B happens
    to equal the broadcast dimension, means something else.

    Names the loop assigns (the output, the loss, the loop variable) must not
    be read after it: after the fix they hold the batch's values, not the
    last sample's.

    A sample without its batch dimension is batched on what the model's
    code spells: each dim its `forward` names is a literal counted from the
    end, and each layer is one torch documents for any leading dims. An
    index or a shape computed at run time that reaches the input's first
    dim by other means is not seen. A train-step function batched in place
    changes for every caller, so the loop must be its only one, in this
    file and in the modules beside it that import it.
    """

    CODE = "PM502"
    NAME = "per-sample-forward-loop"
    LEVEL = Level.UNSAFE
    REQUIRES = ("backward",)
    AFTER = ("PM503",)  # a loss function's loop over positions, vectorized first, is one it can read
    MESSAGE = "the model runs on one sample at a time, with a backward per sample; run it once on the whole batch"
    GAIN = "B forward/backward passes become one batched pass: 1.3-2.0x per step on a small CPU model (benchmarks/bench_batching.py)"

    VALID = [
        Valid(
            PREAMBLE
            + "for i in range(len(x)):\n    out = model(x[i:i+1])\n    total += F.cross_entropy(out, y[i:i+1]).item()\n",
            "a metric loop: no backward",
        ),
        Valid(
            PREAMBLE.replace("nn.Linear(4, 3)", "nn.GRUCell(4, 3)").replace(
                "def forward(self, x):\n        return self.fc(x)",
                "def forward(self, x, h):\n        return self.fc(x, h)",
            )
            + "h = torch.zeros(1, 3)\nfor i in range(len(x)):\n    h = model(x[i:i+1], h)\n"
            "    loss = F.cross_entropy(h, y[i:i+1])\n    loss.backward(retain_graph=True)\n",
            "state handed from one sample to the next: they run in order",
        ),
        Valid(
            PREAMBLE + "for i in range(len(x)):\n    inner = F.cross_entropy(model(x[i:i+1]), y[i:i+1])\n"
            "    grads = torch.autograd.grad(inner, list(model.parameters()), create_graph=True)\n"
            "    loss = sum((g ** 2).sum() for g in grads)\n    loss.backward()\n",
            "a gradient per sample (a MAML-style inner step): not one batch's",
        ),
        Valid(
            PREAMBLE + "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor i in range(len(x)):\n"
            "    loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1])\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n",
            "SGD with batch size 1: the optimizer steps per sample",
        ),
        Valid(
            PREAMBLE
            + "for i in range(0, len(x), 4):\n    loss = F.cross_entropy(model(x[i:i+4]), y[i:i+4])\n    loss.backward()\n",
            "micro-batches of gradient accumulation, not samples",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE
            + "for i in range(x.size(0)):\n    out = model(x[i:i+1])\n    loss = F.cross_entropy(out, y[i:i+1])\n"
            "    loss.backward()\n    total += loss.item()\n",
            PREAMBLE + 'out = model(x)\nloss = F.cross_entropy(out, y, reduction="sum")\nloss.backward()\n'
            "total += loss.item()\n",
            "one class target a sample (`y` of shape (B,)): each sample's mean is its loss, torch's sum adds them up",
        ),
        Invalid(
            PREAMBLE
            + "for i in range(x.size(0)):\n    loss = F.mse_loss(model(x[i:i+1]), x[i:i+1, :3])\n    loss.backward()\n",
            PREAMBLE + "loss = F.mse_loss(model(x), x[:, :3]) * x.size(0)\nloss.backward()\n",
            "a batch of one with more indices: the same indices on the batch",
        ),
        Invalid(
            PREAMBLE
            + "for i in range(len(x)):\n    loss = F.mse_loss(model(x[i].unsqueeze(0))[:, :1], y[i:i+1, None].float())\n"
            "    loss.backward()\n",
            PREAMBLE + "loss = F.mse_loss(model(x)[:, :1], y[:, None].float()) * len(x)\nloss.backward()\n",
            "`y[i:i+1, None]`: a batch of one with a new axis",
        ),
        Invalid(
            PREAMBLE
            + "for i in range(len(x)):\n    loss = F.mse_loss(model(x[i].unsqueeze(0)), model(x[i:i+1] * 2).detach())\n"
            "    loss.backward()\n",
            PREAMBLE + "loss = F.mse_loss(model(x), model(x * 2).detach()) * len(x)\nloss.backward()\n",
            "two model calls per sample: each batched",
        ),
        Invalid(
            PREAMBLE
            + 'z = torch.randn(8, 3)\nfor i in range(len(x)):\n    loss = F.l1_loss(model(x[i:i+1]), z[i:i+1], reduction="sum")\n'
            "    (loss / len(x)).backward()\n    total += loss.item()\n",
            PREAMBLE + 'z = torch.randn(8, 3)\nloss = F.l1_loss(model(x), z, reduction="sum")\n'
            "(loss / len(x)).backward()\ntotal += loss.item()\n",
            "a scale applied in the backward call stays; the logged value is the undivided sum",
        ),
        Invalid(
            PREAMBLE
            + 'for i in range(len(x)):\n    loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1], reduction="sum")\n'
            "    loss /= len(x)\n    loss.backward()\n",
            PREAMBLE + 'loss = F.cross_entropy(model(x), y, reduction="sum")\nloss /= len(x)\nloss.backward()\n',
            "a summed loss divided by B stays divided",
        ),
        Invalid(
            PREAMBLE
            + "targets = torch.randn(8, 3)\nfor xi, ti in zip(x, targets):\n    loss = F.mse_loss(model(xi[None]), ti[None])\n"
            "    loss.backward()\n",
            PREAMBLE + "targets = torch.randn(8, 3)\nloss = F.mse_loss(model(x), targets) * len(x)\nloss.backward()\n",
            "an element-wise mean: every sample has as many elements, so the batch mean times B",
        ),
        Invalid(
            PREAMBLE
            + "criterion = nn.MSELoss(reduction='sum')\nnoise = torch.randn(8, 3)\nfor xi, ni in zip(x, noise):\n"
            "    loss = criterion(model(xi.unsqueeze(0)), ni[None].float())\n    loss.backward()\n",
            PREAMBLE + "criterion = nn.MSELoss(reduction='sum')\nnoise = torch.randn(8, 3)\n"
            "loss = criterion(model(x), noise.float())\nloss.backward()\n",
            "zip over the batch, a summed loss module",
        ),
        Invalid(
            PREAMBLE
            + "for i in range(len(x)):\n    loss = F.cross_entropy(model(x[i].unsqueeze(0)), y[i:i + 1]) / len(x)\n"
            "    loss.backward()\n    total += loss.item()\n",
            PREAMBLE + "loss = F.cross_entropy(model(x), y)\nloss.backward()\ntotal += loss.item()\n",
            "the per-sample division by the batch size: the mean of the per-sample losses, torch's mean",
        ),
        Invalid(
            PREAMBLE + "def pair_loss(logits, targets):\n    total = 0.0\n    for j in range(2):\n"
            "        total = total + F.cross_entropy(logits, targets[:, j], ignore_index=0)\n    return total / 2\n"
            "pairs = torch.randint(1, 3, (8, 2))\nfor i in range(len(x)):\n    out = model(x[i:i + 1])\n"
            "    loss = pair_loss(out, pairs[i:i + 1])\n    loss.backward()\n    total += loss.item()\n",
            PREAMBLE + "def pair_loss(logits, targets):\n    total = 0.0\n    for j in range(2):\n"
            "        total = total + F.cross_entropy(logits, targets[:, j], ignore_index=0)\n    return total / 2\n"
            "pairs = torch.randint(1, 3, (8, 2))\nout = model(x)\n"
            "loss = sum(pair_loss(out[i : i + 1], pairs[i : i + 1]) for i in range(len(x)))\nloss.backward()\n"
            "total += loss.item()\n",
            "a loss function of the file it cannot read: called per sample on the batched output, summed",
        ),
        Invalid(
            PREAMBLE + "seq, tags = torch.randn(8, 5, 4), torch.randint(1, 3, (8, 5))\n"
            "def position_loss(logits, targets):\n    total = 0.0\n    total = total + (\n"
            '        F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1), reduction="none", ignore_index=0)\n'
            "        .view_as(targets).sum(0)\n        / (targets != 0).sum(0)\n    ).sum()\n"
            "    return total / targets.size(1)\n"
            "for i in range(len(seq)):\n    loss = position_loss(model(seq[i:i + 1]), tags[i:i + 1])\n"
            "    loss.backward()\n    total += loss.item()\n",
            PREAMBLE + "seq, tags = torch.randn(8, 5, 4), torch.randint(1, 3, (8, 5))\n"
            "def position_loss(logits, targets):\n    total = 0.0\n    total = total + (\n"
            '        F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1), reduction="none", ignore_index=0)\n'
            "        .view_as(targets).sum(0)\n        / (targets != 0).sum(0)\n    ).sum()\n"
            "    return total / targets.size(1)\n"
            "loss = (\n    (\n        F.cross_entropy(\n            model(seq).flatten(0, 1),\n"
            '            tags.flatten(0, 1),\n            reduction="none",\n            ignore_index=0,\n'
            "        ).view_as(tags)\n        / (tags != 0)\n    ).sum()\n    / tags.size(1)\n)\n"
            "loss.backward()\ntotal += loss.item()\n",
            "a loss function summing over its batch of one (`.sum(0)`): written out for the batch, without that sum",
        ),
        Invalid(
            PREAMBLE + "seq, tags = torch.randn(8, 5, 4), torch.randint(3, (8, 5))\nfor i in range(len(seq)):\n"
            '    loss = F.cross_entropy(model(seq[i:i + 1])[0], tags[i], reduction="none").sum()\n'
            "    loss.backward()\n",
            None,
            "per-token losses of a sample without its batch dimension: for a batch, the positions would be the classes",
        ),
        Invalid(
            PREAMBLE + "z = torch.randn(8, 3)\ndef squares(out, target):\n"
            '    per = F.mse_loss(out, target, reduction="none").sum(0)\n    return per.sum() + per.pow(2).sum()\n'
            "for i in range(len(x)):\n    out = model(x[i:i + 1])\n    loss = squares(out, z[i:i + 1])\n"
            "    loss.backward()\n    total += loss.item()\n",
            PREAMBLE + "z = torch.randn(8, 3)\ndef squares(out, target):\n"
            '    per = F.mse_loss(out, target, reduction="none").sum(0)\n    return per.sum() + per.pow(2).sum()\n'
            "out = model(x)\nloss = sum(squares(out[i : i + 1], z[i : i + 1]) for i in range(len(x)))\n"
            "loss.backward()\ntotal += loss.item()\n",
            "a loss function that reads a computed value twice: written out, it would compute it twice; called per sample",
        ),
        Invalid(
            PREAMBLE + "z = torch.randn(8, 3)\nfor i in range(len(x)):\n    loss = F.mse_loss(model(x[i]), z[i])\n"
            "    loss.backward()\n    total += loss.item()\n",
            PREAMBLE + "z = torch.randn(8, 3)\nloss = F.mse_loss(model(x), z) * len(x)\nloss.backward()\n"
            "total += loss.item()\n",
            "a sample without its batch dimension, to a model whose layers count dims from the end",
        ),
        Invalid(
            PREAMBLE + "z = torch.randn(8, 3)\ndef train(net):\n    for i in range(len(x)):\n"
            "        loss = F.mse_loss(net(x[i:i+1]), z[i:i+1])\n        loss.backward()\ntrain(model)\n",
            PREAMBLE + "z = torch.randn(8, 3)\ndef train(net):\n    loss = F.mse_loss(net(x), z) * len(x)\n"
            "    loss.backward()\ntrain(model)\n",
            "the model a parameter: every call passes one built in this file",
        ),
        Invalid(
            PREAMBLE + "z = torch.randn(8, 3)\ndef step(net, xs, zs):\n    loss = F.mse_loss(net(xs), zs)\n"
            "    loss.backward()\n    return loss.item()\nfor i in range(len(x)):\n"
            "    total += step(model, x[i:i+1], z[i:i+1])\n",
            PREAMBLE
            + "z = torch.randn(8, 3)\ndef step(net, xs, zs):\n    loss = F.mse_loss(net(xs), zs) * xs.size(0)\n"
            "    loss.backward()\n    return loss.item()\ntotal += step(model, x, z)\n",
            "forward and backward in a helper the loop alone calls: the helper takes the batch",
        ),
        Invalid(
            PREAMBLE.replace("self.fc = nn.Linear(4, 3)", "self.fc = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))")
            + "for i in range(len(x)):\n    loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1])\n    loss.backward()\n",
            None,
            "BatchNorm mixes the samples of a batch",
        ),
        Invalid(
            PREAMBLE
            + "for i in range(len(x)):\n    if y[i] > 0:\n        loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1])\n"
            "        loss.backward()\n",
            None,
            "branches on the values of a sample",
        ),
        Invalid(
            PREAMBLE.replace("model = Net()", "from mylib import Encoder\nmodel = Encoder()")
            + "for i in range(len(x)):\n    loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1])\n    loss.backward()\n",
            None,
            "the model's class is not in this file",
        ),
    ]

    def visit_For(self, node: cst.For) -> None:
        loops = sample_loops(self.context)
        loop = loops.over_samples(node)
        if loop is None:
            return
        if loops.steps_optimizer(node.body):
            # the optimizer steps per sample (SGD with batch size 1, another algorithm), or
            # this is the loop over batches, not over the samples of one
            return
        if loops.sequential(node) is not None:
            return  # each sample needs what the one before it made: nothing to batch
        training = self.context.loops.is_training_loop(node)
        collected = None if training else loops.collected_losses(node)
        if not training and collected is None:
            return  # a metric loop without backward
        try:
            body = loops.batched(node, loop, collected)
        except NotBatchable as reason:
            self.report(node, f"{self.MESSAGE}; not rewritten: {reason}")
            return
        edits = [Replace(r.anchor, r.new) if r.new is not None else Remove(r.anchor) for r in body.rewrites]
        self.report(node, edits=[*edits, unwrap(node)], imports=body.imports)

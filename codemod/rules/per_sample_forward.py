from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment

from codemod.analysis.loop_edits import unwrap
from codemod.analysis.loops import own_nodes
from codemod.analysis.names import kwarg, method_name, names_read
from codemod.analysis.torch_facts import (
    BATCH_MIXING_LAYERS,
    COUNTED_LOSSES,
    FUNCTIONAL,
    FUNCTIONAL_OF,
    FUNCTIONAL_PARAMETERS,
    LOSS_FUNCTIONS,
    LOSS_MODULES,
    functional_alias,
    is_literal,
)
from codemod.edits import Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid

LINE_LENGTH = 100  # a longer batched loss line is split after the per-sample sums
# Methods that give a module back (`Net().to(device)`): the class is the receiver's.
MODULE_RETURNING = {"to", "cuda", "cpu", "double", "float", "half", "bfloat16", "train"}
# Methods a batch-of-one output or target may go through and stay correct for a batch.
BATCH_AGNOSTIC = {"to", "float", "double", "long", "half", "bfloat16", "contiguous", "detach"}
MAX_DEPTH = 6
# Calls of these libraries in a model's class build torch layers or plain values.
KNOWN_LIBRARIES = ("torch.", "builtins.", "math.")

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


@dataclass
class _Loop:
    """What a per-sample loop iterates over."""

    index: str | None  # `i` of `for i in range(len(x))`
    rows: dict[str, cst.BaseExpression] = field(default_factory=dict)  # `xi` -> `x` of `zip(x, y)`
    count: cst.BaseExpression | None = None  # the batch size: `len(x)`, `x.size(0)`
    batches: list[cst.BaseExpression] = field(default_factory=list)  # tensors whose rows the loop visits


@dataclass
class _LossCall:
    """A torch loss call: its reduction and the options it was given."""

    reduction: str  # "mean" or "sum"
    kind: str  # "cross_entropy", "MSELoss", ...
    options: dict[str, str]  # keyword -> source text, of the call or of the module's constructor
    function: str | None  # the functional spelling for a loss module (`F.cross_entropy`)
    imports: list[tuple[str, str | None]]


class _NotBatchable(Exception):
    """Why a per-sample loop cannot be batched: the finding's message."""


class PerSampleForwardLoop(Rule):
    """
    ## What it does
    Finds a training loop over the samples of a batch that runs the model on
    one sample at a time and calls `backward()` per sample,

        for i in range(x.size(0)):          # or range(len(x)), zip(x, y)
            out = model(x[i:i+1])           # or x[i].unsqueeze(0), xi.unsqueeze(0)
            loss = F.cross_entropy(out, y[i:i+1])
            loss.backward()
            total += loss.item()

    and replaces it with one forward and one backward over the whole batch.
    The per-sample backward calls add their gradients up, so the batched loss
    must be the sum of the per-sample losses. A `reduction="sum"` loss is kept
    as it is. An element-wise mean (`mse_loss`, `l1_loss`, ...) is multiplied
    by the batch size: every sample has as many elements. A `cross_entropy` or
    `nll_loss` mean divides each sample by its own count of targets that are
    not `ignore_index` (-100), which differ between padded sequences, so the
    fix keeps those per-sample means: `reduction="none"`, summed per sample,
    divided by the sample's count, and added up. A `loss / len(x)` the loop
    applied to each sample turns the sum into a mean. The value the loop logs
    (`total += loss.item()`) is therefore the same number.

    Reported without a fix: the model has a BatchNorm layer (in training mode
    it normalises each sample with the batch's statistics, so batching changes
    the model's output), the model's class is not defined in this file (the
    rule cannot see whether it mixes samples), the loop uses per-sample
    functional parameters (`torch.func.functional_call`, MAML-style inner
    loops), branches on the values of a sample, or does anything else with a
    sample than feed it to the model and the loss. A loop that also steps the
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
    """

    CODE = "PM502"
    NAME = "per-sample-forward-loop"
    LEVEL = Level.UNSAFE
    REQUIRES = ("backward",)
    MESSAGE = "the model runs on one sample at a time, with a backward per sample; run it once on the whole batch"
    GAIN = "B forward/backward passes become one batched pass: 1.3-2.0x per step on a small CPU model (benchmarks/bench_batching.py)"

    VALID = [
        Valid(PREAMBLE + "for i in range(len(x)):\n    out = model(x[i:i+1])\n    total += F.cross_entropy(out, y[i:i+1]).item()\n",
              "a metric loop: no backward"),
        Valid(PREAMBLE + "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor i in range(len(x)):\n"
              "    loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1])\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n",
              "SGD with batch size 1: the optimizer steps per sample"),
        Valid(PREAMBLE + "for i in range(0, len(x), 4):\n    loss = F.cross_entropy(model(x[i:i+4]), y[i:i+4])\n    loss.backward()\n",
              "micro-batches of gradient accumulation, not samples"),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + "for i in range(x.size(0)):\n    out = model(x[i:i+1])\n    loss = F.cross_entropy(out, y[i:i+1])\n"
            "    loss.backward()\n    total += loss.item()\n",
            PREAMBLE + "out = model(x)\nloss = (F.cross_entropy(out, y, reduction=\"none\").view(x.size(0), -1).sum(1)\n"
            "        / (y != -100).view(x.size(0), -1).sum(1)).sum()\nloss.backward()\ntotal += loss.item()\n",
        ),
        Invalid(
            PREAMBLE + "for i in range(x.size(0)):\n    loss = F.mse_loss(model(x[i:i+1]), x[i:i+1, :3])\n    loss.backward()\n",
            None,
            "`x[i:i+1, :3]` is not a batch of one the rule knows",
        ),
        Invalid(
            PREAMBLE + "for i in range(len(x)):\n    loss = F.mse_loss(model(x[i].unsqueeze(0)), y[i:i+1, None].float())\n    loss.backward()\n",
            None,
            "`y[i:i+1, None]`: another form of indexing",
        ),
        Invalid(
            PREAMBLE + "for i in range(len(x)):\n    loss = F.mse_loss(model(x[i].unsqueeze(0)), model(x[i:i+1]).detach())\n"
            "    loss.backward()\n",
            None,
            "two model calls per sample",
        ),
        Invalid(
            PREAMBLE + "z = torch.randn(8, 3)\nfor i in range(len(x)):\n    loss = F.l1_loss(model(x[i:i+1]), z[i:i+1], reduction=\"sum\")\n"
            "    (loss / len(x)).backward()\n    total += loss.item()\n",
            PREAMBLE + "z = torch.randn(8, 3)\nloss = F.l1_loss(model(x), z, reduction=\"sum\")\n"
            "(loss / len(x)).backward()\ntotal += loss.item()\n",
            "a scale applied in the backward call stays; the logged value is the undivided sum",
        ),
        Invalid(
            PREAMBLE + "for i in range(len(x)):\n    loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1], reduction=\"sum\")\n"
            "    loss /= len(x)\n    loss.backward()\n",
            PREAMBLE + "loss = F.cross_entropy(model(x), y, reduction=\"sum\")\nloss /= len(x)\nloss.backward()\n",
            "a summed loss divided by B stays divided",
        ),
        Invalid(
            PREAMBLE + "targets = torch.randn(8, 3)\nfor xi, ti in zip(x, targets):\n    loss = F.mse_loss(model(xi[None]), ti[None])\n"
            "    loss.backward()\n",
            PREAMBLE + "targets = torch.randn(8, 3)\nloss = F.mse_loss(model(x), targets) * len(x)\nloss.backward()\n",
            "an element-wise mean: every sample has as many elements, so the batch mean times B",
        ),
        Invalid(
            PREAMBLE + "criterion = nn.MSELoss(reduction='sum')\nnoise = torch.randn(8, 3)\nfor xi, ni in zip(x, noise):\n"
            "    loss = criterion(model(xi.unsqueeze(0)), ni[None].float())\n    loss.backward()\n",
            PREAMBLE + "criterion = nn.MSELoss(reduction='sum')\nnoise = torch.randn(8, 3)\n"
            "loss = criterion(model(x), noise.float())\nloss.backward()\n",
            "zip over the batch, a summed loss module",
        ),
        Invalid(
            PREAMBLE + "for i in range(len(x)):\n    loss = F.cross_entropy(model(x[i].unsqueeze(0)), y[i:i + 1]) / len(x)\n"
            "    loss.backward()\n    total += loss.item()\n",
            PREAMBLE + "loss = (F.cross_entropy(model(x), y, reduction=\"none\").view(len(x), -1).sum(1)\n"
            "        / (y != -100).view(len(x), -1).sum(1)).mean()\nloss.backward()\ntotal += loss.item()\n",
            "the per-sample division by the batch size: the mean of the per-sample means",
        ),
        Invalid(
            PREAMBLE.replace("self.fc = nn.Linear(4, 3)", "self.fc = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))")
            + "for i in range(len(x)):\n    loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1])\n    loss.backward()\n",
            None,
            "BatchNorm mixes the samples of a batch",
        ),
        Invalid(
            PREAMBLE + "for i in range(len(x)):\n    if y[i] > 0:\n        loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1])\n"
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
        loop = self._per_sample(node)
        if loop is None or not self.context.loops.is_training_loop(node):
            return  # not over samples, or a metric loop without backward
        calls = own_nodes(self.context.index, cst.Call, node.body)
        if any(method_name(c) in ("step", "zero_grad") for c in calls):
            return  # the optimizer steps per sample: SGD with batch size 1, another algorithm
        try:
            edits, imports = self._batched_body(node, loop)
        except _NotBatchable as reason:
            self.report(node, f"{self.MESSAGE}; not rewritten: {reason}")
            return
        self.report(node, edits=[*edits, unwrap(node)], imports=imports)

    # -- the loop ----------------------------------------------------------------------

    def _per_sample(self, node: cst.For) -> _Loop | None:
        """`for i in range(len(x) | x.size(0) | x.shape[0])` or `for xi, yi in zip(x, y)`."""
        iterable = node.iter
        if node.orelse is not None or not isinstance(iterable, cst.Call) or any(a.keyword or a.star for a in iterable.args):
            return None
        args = [a.value for a in iterable.args]
        names = self.context.names
        if names.is_(iterable.func, "range", "builtins.range") and len(args) == 1 and isinstance(node.target, cst.Name):
            batch = self._batch_of_size(args[0])
            if batch is None:
                return None
            return _Loop(node.target.value, count=args[0], batches=[batch])
        if names.is_(iterable.func, "zip", "builtins.zip") and args:
            targets = node.target.elements if isinstance(node.target, (cst.Tuple, cst.List)) else None
            if targets is None or len(targets) != len(args) or not all(isinstance(t.value, cst.Name) for t in targets):
                return None
            if not all(isinstance(a, (cst.Name, cst.Attribute)) for a in args):
                return None
            rows = {t.value.value: a for t, a in zip(targets, args)}
            count = cst.parse_expression(f"len({self.context.module.code_for_node(args[0])})")
            return _Loop(None, rows, count, list(args))
        return None

    def _batch_of_size(self, expr: cst.BaseExpression) -> cst.BaseExpression | None:
        """`x` for `len(x)`, `x.size(0)`, `x.shape[0]`."""
        if m.matches(expr, m.Call(func=m.Name("len"), args=[m.Arg(keyword=None)])) and self.context.names.is_(expr.func, "len", "builtins.len"):
            batch = expr.args[0].value
        elif m.matches(expr, m.Call(func=m.Attribute(attr=m.Name("size")), args=[m.Arg(value=m.Integer("0"), keyword=None)])):
            batch = expr.func.value
        elif m.matches(expr, m.Subscript(value=m.Attribute(attr=m.Name("shape")),
                                         slice=[m.SubscriptElement(slice=m.Index(value=m.Integer("0")))])):
            batch = expr.value.value
        else:
            return None
        return batch if isinstance(batch, (cst.Name, cst.Attribute)) else None

    def _is_python_sequence(self, batch: cst.BaseExpression) -> bool:
        """Is `batch` visibly built as a list or tuple (`[...]`, a comprehension, `list(...)`)?"""
        values = self._values(batch) or []
        sequences = (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp)
        return any(isinstance(v, sequences) or (isinstance(v, cst.Call) and self.context.names.is_(
            v.func, "list", "builtins.list", "tuple", "builtins.tuple", "sorted", "builtins.sorted")) for v in values)

    def _is_batch_size(self, expr: cst.BaseExpression, loop: _Loop) -> bool:
        """Is `expr` the loop's batch size, spelled any of the ways `_batch_of_size` reads?"""
        code = self.context.module.code_for_node
        batch = self._batch_of_size(expr)
        if batch is not None and code(batch) in {code(b) for b in loop.batches}:
            return True
        return loop.count is not None and code(expr) == code(loop.count)

    # -- the body ----------------------------------------------------------------------

    def _batched_body(self, node: cst.For, loop: _Loop) -> tuple[list[cst.SimpleStatementLine], list]:
        samples = {loop.index} if loop.index else set(loop.rows)
        for call in own_nodes(self.context.index, cst.Call, node.body):
            if self.context.names.startswith(call.func, FUNCTIONAL_PARAMETERS):
                raise _NotBatchable("it runs the model with per-sample functional parameters "
                                    f"(`{self.context.module.code_for_node(call.func)}`, MAML-style)")
        for batch in loop.batches:
            if self._is_python_sequence(batch):
                raise _NotBatchable(f"`{self.context.module.code_for_node(batch)}` is a Python list or tuple: "
                                    "its samples may differ in shape, and the model cannot take it as one batch")
        lines = node.body.body if isinstance(node.body, cst.IndentedBlock) else [node.body]
        for line in lines:
            if not isinstance(line, cst.SimpleStatementLine):
                test = getattr(line, "test", None)
                if test is not None and samples & {n.value for n in names_read(test)}:
                    raise _NotBatchable("it branches on the values of a sample")
                raise _NotBatchable("its body has a compound statement (`if`, `with`, `for`, `try`) the rule does not batch")
            if len(line.body) != 1:
                raise _NotBatchable("several statements on one line")
        statements = [line.body[0] for line in lines]
        # `loss.backward()`, or `(loss / k).backward()`: a scale the rewrite keeps as it is
        backward = m.Expr(value=m.Call(func=m.Attribute(
            value=m.Name() | m.BinaryOperation(left=m.Name(), operator=m.Divide()), attr=m.Name("backward")), args=[]))
        backward_at = [i for i, s in enumerate(statements) if m.matches(s, backward)]
        if len(backward_at) != 1:
            raise _NotBatchable("it does not end each sample with one plain `loss.backward()`")
        backward_of = statements[backward_at[0]].value.func.value
        if isinstance(backward_of, cst.BinaryOperation):
            if samples & {n.value for n in names_read(backward_of.right)}:
                raise _NotBatchable("the loss is divided by something of the sample")
            backward_of = backward_of.left
        loss_name = backward_of.value
        before, after = statements[: backward_at[0]], statements[backward_at[0] + 1:]
        edits, imports = self._forward_and_loss(before, loss_name, loop, samples)
        for statement in after:
            if not self._logs(statement, loss_name):
                raise _NotBatchable(f"`{self.context.module.code_for_node(statement).strip()}` runs once per sample")
        self._check_not_read_after(node, before + statements[backward_at[0]:backward_at[0] + 1], samples)
        return edits, imports

    def _forward_and_loss(self, statements, loss_name: str, loop: _Loop, samples: set[str]):
        """The edits that batch the statements before `backward()` (each batch of one
        becomes the batch; the loss is made the sum of the per-sample losses), and the
        imports the new loss needs."""
        code = self.context.module.code_for_node
        index = self.context.index
        edits: list = []
        model_calls = []
        loss_statement = None
        division = None
        for statement in statements:
            if self._divides_loss(statement, loss_name):
                division = statement
                if samples & {n.value for n in names_read(statement.value)}:
                    raise _NotBatchable("the loss is divided by something of the sample")
                continue
            if not m.matches(statement, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
                raise _NotBatchable(f"`{code(statement).strip()}` runs once per sample")
            target = statement.targets[0].target.value
            replaced = []
            for candidate in index.find((cst.Subscript, cst.Call), within=statement.value):
                if any(index.inside(candidate, done) for done in replaced):
                    continue
                batch = _batch_of_one(candidate, loop)
                if batch is not None:
                    replaced.append(candidate)
                    edits.append(Replace(candidate, batch))
            if any(n.value in samples and not any(index.inside(n, done) for done in replaced)
                   for n in names_read(statement.value)):
                raise _NotBatchable("a sample is used other than as a batch of one (`x[i:i+1]`, `x[i].unsqueeze(0)`)")
            model_calls += [c for c in own_nodes(index, cst.Call, statement.value) if self._may_be_model(c.func)]
            if target == loss_name:
                loss_statement = statement
        if len(model_calls) != 1:
            raise _NotBatchable("it does not call the model exactly once per sample")
        if loss_statement is None or not isinstance(loss_statement, cst.Assign):
            raise _NotBatchable(f"`{loss_name}` is not computed in the loop")
        problem = self._model_problem(model_calls[0].func)
        if problem is not None:
            raise _NotBatchable(problem)
        original = loss_statement.value
        divided = isinstance(original, cst.BinaryOperation) and isinstance(original.operator, cst.Divide)
        call, divisor = (original.left, original.right) if divided else (original, None)
        loss = self._loss_call(call)
        self._check_batch_agnostic(call, loop)
        if division is not None:
            if divisor is not None:
                raise _NotBatchable(f"`{loss_name}` is divided twice")
            divisor = division.value if isinstance(division, cst.AugAssign) else division.value.right
        # A mean per sample divided by B: the batched loss is a mean, not a sum, and needs no division
        cancels = loss.reduction == "mean" and divisor is not None and self._is_batch_size(divisor, loop)
        if cancels and division is not None:
            edits.append(Remove(self.context.parents[division]))
        if loss.reduction == "sum":
            return edits, loss.imports  # the sum over the batch is the sum of the per-sample sums
        count = code(loop.count)
        keep_divisor = divided and not cancels

        def batched(updated: cst.BaseExpression) -> cst.BaseExpression:
            """The loss value, its batches of one already replaced, as the sum of the
            per-sample losses (or their mean, where the loop divides by B)."""
            updated_call = updated.left if divided else updated
            if loss.kind in COUNTED_LOSSES:
                # Each sample's mean divides by its own count of targets that are not ignored:
                # keep those means, and add them up (or average them, for `loss / len(x)`).
                sums, counts = self._per_sample_means(loss, updated_call, count)
                reduce = "mean" if cancels else "sum"
                text = f"{sums} {counts}.{reduce}()"
                if len(text) + len(loss_name) + 3 > LINE_LENGTH:
                    # libcst puts the block's indentation in front of the continuation line itself
                    text = f"{sums}\n{' ' * (len(loss_name) + 4)}{counts}.{reduce}()"
                new = cst.parse_expression(text)
            elif cancels:
                new = updated_call  # the batch mean is the mean of the per-sample means: times B, divided by B
            else:
                new = cst.BinaryOperation(updated_call, cst.Multiply(), cst.parse_expression(count))
            return updated.with_changes(left=new) if keep_divisor else new

        edits.append(Replace(original, batched))
        return edits, loss.imports

    def _per_sample_means(self, loss: "_LossCall", call: cst.Call, batch: str) -> tuple[str, str]:
        """`(f(input, target, reduction="none").view(B, -1).sum(1)` and
        `/ (target != ignore_index).view(B, -1).sum(1))` for the batched `call`."""
        code = cst.Module([]).code_for_node
        positional = [a.value for a in call.args if a.keyword is None]
        named = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        inputs = positional[0] if positional else named["input"]
        target = positional[1] if len(positional) > 1 else named["target"]
        keywords = {"reduction": '"none"', **{k: v for k, v in loss.options.items() if k not in ("reduction", "input", "target")}}
        extra = "".join(f", {k}={v}" for k, v in keywords.items())
        ignore = loss.options.get("ignore_index", "-100")
        function = loss.function if loss.function is not None else code(call.func)
        return (f"({function}({code(inputs)}, {code(target)}{extra}).view({batch}, -1).sum(1)",
                f"/ ({code(target)} != {ignore}).view({batch}, -1).sum(1))")

    def _divides_loss(self, statement, loss_name: str) -> bool:
        """`loss = loss / d` or `loss /= d`."""
        if m.matches(statement, m.AugAssign(target=m.Name(loss_name), operator=m.DivideAssign())):
            return True
        return m.matches(statement, m.Assign(targets=[m.AssignTarget(target=m.Name(loss_name))],
                                             value=m.BinaryOperation(left=m.Name(loss_name), operator=m.Divide())))

    def _loss_call(self, call: cst.BaseExpression) -> "_LossCall":
        """What a known loss call reduces by; raises when it is not one or its options are unclear."""
        code = self.context.module.code_for_node
        if not isinstance(call, cst.Call):
            raise _NotBatchable("the loss is not one call of a torch loss")
        names = self.context.names.of(call.func)
        if names & LOSS_FUNCTIONS:
            options, kind, function = call, min(names & LOSS_FUNCTIONS).rsplit(".", 1)[1], None
            extra_positional = len([a for a in call.args if a.keyword is None]) > 2
        else:
            constructor = self._module_constructor(call.func)
            if constructor is None:
                raise _NotBatchable(f"`{code(call.func)}` is not a torch loss the rule knows the reduction of")
            options, kind = constructor, min(self.context.names.of(constructor.func) & LOSS_MODULES).rsplit(".", 1)[1]
            extra_positional = any(a.keyword is None for a in constructor.args)
            if any(a.keyword is not None for a in call.args):
                raise _NotBatchable("the loss module is called with keyword arguments")
            function = f"{functional_alias(self.context.module) or FUNCTIONAL}.{FUNCTIONAL_OF.get(kind, '')}"
        if extra_positional or any(a.star for a in options.args) or kwarg(options, "size_average") or kwarg(options, "reduce"):
            raise _NotBatchable("the loss's options are passed by position or unpacked")
        reduction = kwarg(options, "reduction")
        value = "mean"
        if reduction is not None:
            if not isinstance(reduction.value, cst.SimpleString) or reduction.value.evaluated_value not in ("mean", "sum"):
                raise _NotBatchable("the loss's reduction is not a literal \"mean\" or \"sum\"")
            value = reduction.value.evaluated_value
        if value == "mean" and kind in COUNTED_LOSSES and kwarg(options, "weight") is not None:
            raise _NotBatchable("with class weights each sample's mean divides by its own sum of weights")
        texts = {a.keyword.value: code(a.value) for a in options.args if a.keyword is not None}
        imports: list[tuple[str, str | None]] = []
        if function is not None and value == "mean" and kind in COUNTED_LOSSES:
            if any(not is_literal(a.value) for a in options.args if a.keyword is not None):
                raise _NotBatchable("the loss module's arguments are not literals, so they cannot be carried over")
            if functional_alias(self.context.module) is None:
                imports.append((FUNCTIONAL, None))
        return _LossCall(value, kind, texts, function, imports)

    def _module_constructor(self, func: cst.BaseExpression) -> cst.Call | None:
        values = self._values(func)
        if values is None or len(values) != 1 or not isinstance(values[0], cst.Call):
            return None
        return values[0] if self.context.names.of(values[0].func) & LOSS_MODULES else None

    def _values(self, expr: cst.BaseExpression) -> list[cst.BaseExpression] | None:
        if isinstance(expr, cst.Name):
            return self.context.bindings.values(expr)
        if isinstance(expr, cst.Attribute):
            return self.context.bindings.attribute_values(expr)
        return None

    def _may_be_model(self, func: cst.BaseExpression) -> bool:
        """A model, or a callable of this file that is not a loss (a model the analysis
        cannot place, `Encoder()` from another package): `_model_problem` says which."""
        if self.context.training.is_model(func):
            return True
        return (isinstance(func, cst.Name) and not self.context.names.of(func)
                and self.context.bindings.local_function(func) is None and self._module_constructor(func) is None)

    def _check_batch_agnostic(self, call: cst.Call, loop: _Loop) -> None:
        """The loss's inputs must mean the same for B samples as for one: the model's
        output or the batch as they are, through `.view(-1, ...)`/`.reshape(-1, ...)`
        and dtype or device conversions; `out[0]` or `out.squeeze(0)` would pick or
        reshape the batch dimension."""
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value not in ("input", "target"):
                continue  # options such as reduction=
            expr = arg.value
            while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
                method = expr.func.attr.value
                first = expr.args[0].value if expr.args else None
                flattens = method in ("view", "reshape") and m.matches(first, m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1")))
                if method not in BATCH_AGNOSTIC and not flattens:
                    break
                expr = expr.func.value
            if isinstance(expr, cst.Call) and self._may_be_model(expr.func):
                continue
            expr = _batch_of_one(expr, loop) or expr  # `y[i:i+1]` -> `y`
            while isinstance(expr, cst.Attribute):
                expr = expr.value  # `out.logits`
            if not isinstance(expr, cst.Name):
                raise _NotBatchable(f"the loss reads `{self.context.module.code_for_node(arg.value)}`, "
                                    "which may mean something else for a batch than for one sample")

    def _logs(self, statement, loss_name: str) -> bool:
        """`total += loss.item()` (or `loss.detach()`, `float(loss)`): one number per batch,
        the same as the per-sample sum because the batched loss is that sum."""
        if isinstance(statement, cst.AugAssign) and isinstance(statement.operator, cst.AddAssign):
            value = statement.value
        elif m.matches(statement, m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.BinaryOperation(operator=m.Add()))) \
                and m.matches(statement.value.left, m.Name(statement.targets[0].target.value)):
            value = statement.value.right
        else:
            return False
        loss = m.Name(loss_name)
        return m.matches(value, m.Call(func=m.Attribute(value=loss, attr=m.Name("item") | m.Name("detach")), args=[])
                         | m.Call(func=m.Attribute(value=m.Call(func=m.Attribute(value=loss, attr=m.Name("detach")), args=[]),
                                                   attr=m.Name("item")), args=[])
                         | m.Call(func=m.Name("float"), args=[m.Arg(value=loss)]))

    def _check_not_read_after(self, node: cst.For, statements, samples: set[str]) -> None:
        """Names the loop binds for each sample must not be read after it."""
        targets = [node.target] if isinstance(node.target, cst.Name) else [e.value for e in node.target.elements]
        for statement in statements:
            if isinstance(statement, cst.Assign):
                targets.append(statement.targets[0].target)
        for target in targets:
            scope = self.context.scopes.get(target)
            if scope is None:
                continue
            for assignment in scope.assignments[target.value]:
                if not isinstance(assignment, Assignment) or assignment.node is not target:
                    continue
                if any(not self.context.inside(access.node, node) for access in assignment.references):
                    raise _NotBatchable(f"`{target.value}` is read after the loop, where it would hold the batch's value")

    # -- the model ---------------------------------------------------------------------

    def _model_problem(self, model: cst.BaseExpression) -> str | None:
        """Why the model may mix the samples of a batch, or None when every layer is per-sample."""
        values = self._values(model)
        code = self.context.module.code_for_node(model)
        if not values or len(values) != 1:
            return f"the model `{code}` is not built once in this file, so the rule cannot see whether it mixes samples"
        return self._construction_problem(values[0], code, 0)

    def _construction_problem(self, expr: cst.BaseExpression, code: str, depth: int) -> str | None:
        while isinstance(expr, cst.Call) and method_name(expr) in MODULE_RETURNING:
            expr = expr.func.value
        if not isinstance(expr, cst.Call) or depth > MAX_DEPTH:
            return f"the model `{code}` is not built by a class call the rule can follow"
        names = self.context.names.of(expr.func)
        if names & BATCH_MIXING_LAYERS:
            return f"the model `{code}` has BatchNorm, which mixes the samples of a batch in training mode"
        if any(n.startswith("torch.nn.") for n in names):
            for arg in expr.args:  # nn.Sequential(nn.Linear(...), nn.BatchNorm1d(...))
                if isinstance(arg.value, cst.Call):
                    problem = self._construction_problem(arg.value, code, depth + 1)
                    if problem is not None:
                        return problem
            return None
        classdef = self.context.kinds.local_class(expr.func)
        if classdef is None:
            return f"the model `{code}` is of a class not defined in this file, so the rule cannot see whether it mixes samples"
        return self._class_problem(classdef, code, depth + 1)

    def _class_problem(self, classdef: cst.ClassDef, code: str, depth: int) -> str | None:
        for base in classdef.bases:
            local = self.context.kinds.local_class(base.value)
            if local is not None:
                problem = self._class_problem(local, code, depth + 1)
                if problem is not None:
                    return problem
        for call in self.context.index.find(cst.Call, within=classdef):
            names = self.context.names.of(call.func)
            if names & BATCH_MIXING_LAYERS:
                return f"the model `{code}` has BatchNorm, which mixes the samples of a batch in training mode"
            if self.context.names.startswith(call.func, FUNCTIONAL_PARAMETERS):
                return f"the model `{code}` calls `{self.context.module.code_for_node(call.func)}`"
            local = self.context.kinds.local_class(call.func)
            if local is not None and local is not classdef:
                problem = self._class_problem(local, code, depth + 1)
                if problem is not None:
                    return problem
            elif self._is_attribute_value(call) and not (names and all(n.startswith(KNOWN_LIBRARIES) for n in names)):
                name = self.context.module.code_for_node(call.func)
                return f"the model `{code}` has a submodule built by `{name}`, which the rule cannot see into"
        return None

    def _is_attribute_value(self, call: cst.Call) -> bool:
        """`self.<attr> = f(...)`: possibly a submodule."""
        statement = self.context.parents.get(call)
        return isinstance(statement, cst.Assign) and any(
            m.matches(t.target, m.Attribute(value=m.Name("self"))) for t in statement.targets)


def _batch_of_one(node: cst.CSTNode, loop: _Loop) -> cst.BaseExpression | None:
    """The batch for a batch of one sample: `x[i:i+1]`, `x[i].unsqueeze(0)`, `x[i][None]`,
    `xi.unsqueeze(0)`, `xi[None]` -> `x` (a fresh copy); None for anything else."""
    index = loop.index
    if isinstance(node, cst.Subscript):
        if index is not None and m.matches(node, m.Subscript(slice=[m.SubscriptElement(slice=m.Slice(
                lower=m.Name(index), upper=m.BinaryOperation(left=m.Name(index), operator=m.Add(), right=m.Integer("1")),
                step=None))])):
            return _fresh(node.value)
        if m.matches(node, m.Subscript(slice=[m.SubscriptElement(slice=m.Index(value=m.Name("None")))])):
            return _batch_of_row(node.value, loop)
    elif m.matches(node, m.Call(func=m.Attribute(attr=m.Name("unsqueeze")),
                                args=[m.Arg(value=m.Integer("0"), keyword=m.DoNotCare())])):
        return _batch_of_row(node.func.value, loop)
    return None


def _batch_of_row(expr: cst.BaseExpression, loop: _Loop) -> cst.BaseExpression | None:
    """`x` for a row `x[i]` or a zip row name."""
    index = loop.index
    if index is not None and m.matches(expr, m.Subscript(slice=[m.SubscriptElement(slice=m.Index(value=m.Name(index)))])):
        return _fresh(expr.value)
    if isinstance(expr, cst.Name) and expr.value in loop.rows:
        return _fresh(loop.rows[expr.value])
    return None


def _fresh(expr: cst.BaseExpression) -> cst.BaseExpression:
    """A copy of `expr` to put somewhere else in the tree (nodes must not be shared)."""
    return cst.parse_expression(cst.Module([]).code_for_node(expr))

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import Assignment

from codemod.analysis import match as m
from codemod.analysis.kinds import Kind
from codemod.analysis.loop_edits import unwrap
from codemod.analysis.loops import own_nodes
from codemod.analysis.loss_calls import LossOptions, loss_calls
from codemod.analysis.names import integer_value, names_read, number_value
from codemod.analysis.position_slices import affine, is_zero, position_slices, wrapped
from codemod.analysis.torch_facts import (
    ALONG_DIM_FUNCTIONS,
    ALONG_DIM_METHODS,
    DTYPE_NAMES,
    FUNCTIONAL,
    LOSS_FUNCTIONS,
    LOSS_MODULES,
    POINTWISE_FUNCTIONS,
    POINTWISE_METHODS,
    functional_alias,
)
from codemod.analysis.torch_ops import Loss, methods, short
from codemod.edits import Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid

DEFAULT_IGNORE_INDEX = "-100"
TORCH_METHODS = methods()  # every tensor method of the torch table
LINE_LENGTH = 100  # a longer rewritten line is split after the per-position sums
FULL_SLICE = m.SubscriptElement(slice=m.Slice(lower=None, upper=None, step=None))
# Calls whose value is the length of a dimension, or a count: never negative.

PREAMBLE = """\
import torch
import torch.nn.functional as F
logits = torch.randn(4, 6, 10, requires_grad=True)
targets = torch.randint(10, (4, 6))
loss = 0.0
"""
PER_POSITION_MEAN = (
    "(\n    F.cross_entropy(\n"
    '        logits[:, :6].flatten(0, 1), targets[:, :6].flatten(0, 1), reduction="none"\n'
    "    )\n    .view_as(targets[:, :6])\n    .sum(0)\n    / (targets[:, :6] != -100).sum(0)\n).sum()"
)


@dataclass
class _Loop:
    """The positions a loop (or comprehension) visits: `t` in `range(start, stop)`,
    or, for `zip(a.unbind(1), b.unbind(1))`, every position of the tensors named in `rows`."""

    var: str | None
    start: cst.BaseExpression | None = None
    stop: cst.BaseExpression | None = None
    rows: dict[str, cst.BaseExpression] = field(default_factory=dict)  # row name -> the tensor


@dataclass
class _Operand:
    """`base[:, sign * t + offset]` (offset: 0, a number, or an expression that does not
    change in the loop), or every position of `base` (`full`)."""

    base: cst.BaseExpression
    sign: int = 1
    offset: int | cst.BaseExpression = 0
    full: bool = False


@dataclass
class _Term:
    """One position's loss: `call`, possibly times or divided by `factor`, as the loop adds it."""

    node: cst.BaseExpression  # what the loop adds (the call, or the call with its factor)
    call: cst.Call
    factor: tuple[str, cst.BaseExpression] | None
    loss: LossOptions
    input: _Operand
    target: _Operand


class _NotRewritten(Exception):
    """Why a per-position loop is reported without a fix: the finding's message."""


class PerPositionLossLoop(Rule):
    """
    ## What it does
    Finds a Python loop over sequence positions that adds up one loss per
    position, cross-entropy (or NLL) first,

        for t in range(T):
            loss += F.cross_entropy(logits[:, t], targets[:, t])

    and replaces it with one call over all the positions at once. The loop
    may be written in many ways: `logits[:, t, :]`; `range(start, T)`,
    `range(T - 1)`; shifted positions such as `targets[:, t + 1]`,
    `logits[:, prefix + t]` or the last K positions (`logits[:, -K + k]`,
    `logits[:, -k]`); the slice first assigned to a name in the loop;
    `loss = loss + ...`; a constant factor (`... / T`); an
    `nn.CrossEntropyLoss` or `nn.NLLLoss` module; `ignore_index=`,
    `label_smoothing=`, or class weights with a summed loss; a loop over
    `zip(logits.unbind(1), labels.unbind(1))`; the per-position losses
    appended to a list that is then `torch.stack`ed or `sum`med; or a
    generator, `sum(F.cross_entropy(logits[:, t], y[:, t]) for t in range(T))`.

    Losses other than cross-entropy are batched the same way: every torch
    loss with one value an element (`F.kl_div`, `F.mse_loss`, `F.l1_loss`,
    `F.smooth_l1_loss`, the binary cross-entropies, and their modules),
    their inputs any pointwise expression of position slices (knowledge
    distillation's `F.log_softmax(student[:, t] / T, -1)` against
    `F.softmax(teacher[:, t] / T, -1)`, through names assigned in the loop).
    So is a masked loss: each position's unreduced loss
    (`reduction="none"`) in a pointwise expression with other position
    slices, summed, `(l * mask[:, t]).sum()`, becomes one unreduced loss
    over all positions times the mask, summed; what the loop's sum is
    divided by after it (`loss / mask.sum()`) is left as written.

    A loop whose positions each run the whole model (teacher forcing,
    `model(x[:, :t])[:, -1]`) is reported with the batched alternative: a
    causal model gives every position's logits in one call, `model(x[:, :-1])`.

    ## Why is this bad?
    Each iteration launches its own softmax, gather and reduction over a
    `(batch, vocab)` slice, plus the autograd nodes for them; with T positions
    that is T times the kernel launches and Python overhead of one call over a
    `(batch, vocab, T)` tensor, and the backward pass replays them one by one.
    Measured on a CPU (torch 2.13, one thread, a 2-layer transformer LM,
    batch 8, a loop over all 64 positions, vocabulary 512, `python -m
    benchmarks.bench_batching`): 1.3-2.1x tokens/s for the whole training
    step over five runs on a busy two-core machine. On a GPU each position's
    three or more kernels are tiny launches, so the gap grows with the
    number of positions. A teacher-forced loop runs the model T times
    instead of once: the cost grows with T.

    The sum over positions of per-position means is not the mean over all
    tokens: with `reduction="mean"` (the default) each position is divided by
    its own count of targets that are not `ignore_index` (-100 by default), so
    `F.cross_entropy(logits.flatten(0, 1), targets.flatten())` would give a
    different loss, and a different gradient scale, unless every position has
    the same count. The fix keeps the per-position means: it computes every
    token's loss with `reduction="none"`, sums over the batch, and divides by
    each position's count of targets that are not ignored. With
    `reduction="sum"` the loop is one summed call over the flattened
    positions. Every token's loss is computed over the flattened positions,
    the classes the last dimension as in the loop, and laid out again as the
    targets (`.view_as`): a softmax over a middle dimension
    (`logits.transpose(1, 2)`) gives the same numbers 1.6-4x slower for the
    loss's forward and backward on a CPU (batch 8 x 128, vocabulary 4,002;
    32 x 128, vocabulary 65).

    ## Example
    ```python
    loss = 0.0
    for t in range(T):
        loss += F.cross_entropy(logits[:, t], targets[:, t])
    ```
    Use instead:
    ```python
    loss = 0.0
    tokens = F.cross_entropy(logits[:, :T].flatten(0, 1), targets[:, :T].flatten(0, 1), reduction="none")
    loss += (tokens.view_as(targets[:, :T]).sum(0) / (targets[:, :T] != -100).sum(0)).sum()
    ```

    ## Fix safety
    Numeric: the same per-position means and their sum, added in another
    order, so the loss and the gradients agree within floating-point rounding
    (the execution tests see 2e-16 relative in float64). The fix assumes
    what the loop's indexing implies: `logits[:, t]` is `(batch, classes)` and
    `targets[:, t]` holds class indices; a `logits[:, t]` with more dimensions
    (K-dimensional cross-entropy), or probability targets, would make the fix
    raise or differ. Names the loop assigns (the loop variable, the slices)
    must not be read after it.

    Positions become a slice where its bounds are known not to wrap around
    (numbers, sizes, lengths); a loop over the last K positions becomes
    `[-K:]` only when K is a positive number, and is counted from the length
    otherwise (`[-0:]` would be every position, while the loop adds nothing).
    Other positions are gathered with the loop's own index arithmetic,
    `logits[:, torch.arange(K, device=logits.device) + prefix - 1]`, which
    wraps negative positions and raises on positions out of range as the
    loop does. A `range` past the sequence end raises `IndexError` in the
    loop; its slice is clipped instead. `zip(a.unbind(1), b.unbind(1))`
    stops at the shorter of the two; the fix needs them to have the same
    number of positions (it raises otherwise).

    For the other losses, each position's reduction is kept: `"sum"` is one
    summed call; `"batchmean"` (KL divergence) divides each position's sum
    by the batch size, `input.size(0)`, so the sum over positions is one
    summed call divided by it; `"mean"` divides by each position's number of
    elements, the same for every position, so the sum over K positions is
    the mean over all of them times K (or, where the loop's range does not
    show K, each position's mean, summed). Every position slice of the term
    becomes the same positions of its tensor; a Python number in the term
    stays as written, and another name is refused, since a tensor could
    broadcast against one position and not against all of them.

    Reported without a fix: `reduction="none"` not summed in the loop (a
    per-sample result the loop combines in its own way), `weight=` together with the mean (each position
    is divided by its own sum of class weights), constructor arguments of the
    loss module that are not literals, `size_average`/`reduce`, a loop that
    does more than add one loss per position, and teacher-forced loops.
    """

    CODE = "PM503"
    NAME = "per-position-loss-loop"
    LEVEL = Level.NUMERIC
    REQUIRES = tuple(sorted(short(LOSS_FUNCTIONS | LOSS_MODULES)))  # every loss of one value an element
    MESSAGE = "cross-entropy computed one sequence position at a time in a Python loop; compute it over all positions in one call"
    GAIN = "T softmax/gather launches and their backward nodes become one call: 1.3-2.1x per step on CPU (T=64, benchmarks/bench_batching.py)"

    VALID = [
        Valid(
            PREAMBLE + "emb, cell, head = torch.nn.Embedding(10, 8), torch.nn.GRUCell(8, 8), torch.nn.Linear(8, 10)\n"
            "h, token = torch.zeros(4, 8), targets[:, 0]\nfor t in range(1, 6):\n    h = cell(emb(token), h)\n"
            "    step_logits = head(h)\n    loss += F.cross_entropy(step_logits, targets[:, t])\n"
            "    token = step_logits.argmax(-1)\n",
            "free-running decoding: each position feeds on the one before",
        ),
        Valid(
            PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[t], targets[t])\n",
            "a loop over samples, not positions",
        ),
        Valid(
            PREAMBLE + "def cross_entropy(a, b):\n    return (a - b).sum()\nfor t in range(6):\n"
            "    loss += cross_entropy(logits[:, t], targets[:, t])\n",
            "a local function of the same name",
        ),
        Valid(
            PREAMBLE + "heads = [logits, logits]\nfor k, head in enumerate(heads):\n"
            "    loss += F.cross_entropy(head[:, : 6 - k].flatten(0, 1), targets[:, k:].flatten())\n",
            "one loss per prediction head, over all positions each",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t])\n",
            PREAMBLE + f"loss += {PER_POSITION_MEAN}\n",
        ),
        Invalid(
            PREAMBLE + "mask = (targets != 0).float()\nfor t in range(6):\n"
            '    l = F.cross_entropy(logits[:, t], targets[:, t], reduction="none")\n'
            "    loss = loss + (l * mask[:, t]).sum()\nloss = loss / mask.sum()\n",
            PREAMBLE + "mask = (targets != 0).float()\nloss = (\n    loss\n    + (\n        F.cross_entropy(\n"
            '            logits[:, :6].flatten(0, 1), targets[:, :6].flatten(0, 1), reduction="none"\n'
            "        ).view_as(targets[:, :6])\n        * mask[:, :6]\n    ).sum()\n)\nloss = loss / mask.sum()\n",
            "a masked loss: each position's unreduced loss times its mask, summed",
        ),
        Invalid(
            PREAMBLE + "teacher = torch.randn(4, 6, 10)\nK, T = 4, 2.0\nfor k in range(K):\n"
            "    loss += F.kl_div(F.log_softmax(logits[:, k] / T, -1), F.softmax(teacher[:, k] / T, -1), "
            'reduction="batchmean") * T**2\n',
            PREAMBLE + "teacher = torch.randn(4, 6, 10)\nK, T = 4, 2.0\nloss += (\n    F.kl_div(\n"
            "        F.log_softmax(logits[:, :K] / T, -1),\n        F.softmax(teacher[:, :K] / T, -1),\n"
            '        reduction="sum",\n    )\n    / logits.size(0)\n    * (T**2)\n)\n',
            "distillation over the first K positions: batchmean is each position's sum over the batch size",
        ),
        Invalid(
            PREAMBLE + "for t in range(6):\n    loss += F.mse_loss(logits[:, t], logits[:, t].detach() * 0.5)\n",
            PREAMBLE + "loss += F.mse_loss(logits[:, :6], logits[:, :6].detach() * 0.5) * 6\n",
            "a mean squared error per position: as many elements each, so the mean times the positions",
        ),
        Invalid(
            PREAMBLE
            + 'for t in range(1, 5):\n    loss = loss + F.cross_entropy(logits[:, t - 1, :], targets[:, t], reduction="sum") / 4\n',
            PREAMBLE + "loss = (\n    loss\n    + F.cross_entropy(\n"
            '        logits[:, :4].flatten(0, 1), targets[:, 1:5].flatten(0, 1), reduction="sum"\n'
            "    )\n    / 4\n)\n",
            "shifted targets, a summed loss and a constant factor",
        ),
        Invalid(
            PREAMBLE + "criterion = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)\n"
            "for t in range(6):\n    loss += criterion(logits[:, t], targets[:, t])\n",
            PREAMBLE + "loss += (\n    F.cross_entropy(\n        logits[:, :6].flatten(0, 1),\n"
            '        targets[:, :6].flatten(0, 1),\n        reduction="none",\n        ignore_index=0,\n'
            "        label_smoothing=0.1,\n    )\n    .view_as(targets[:, :6])\n    .sum(0)\n"
            "    / (targets[:, :6] != 0).sum(0)\n).sum()\n",
            "a loss module: its arguments carried over, the module itself no longer needed",
        ),
        Invalid(
            PREAMBLE + "K = 3\nfor k in range(K):\n    step_logits = logits[:, -K + k, :]\n"
            '    loss += F.cross_entropy(step_logits, targets[:, k], reduction="sum")\n',
            PREAMBLE
            + "K = 3\nloss += F.cross_entropy(\n"
            + '    logits[:, -K:].flatten(0, 1), targets[:, :K].flatten(0, 1), reduction="sum"\n)\n',
            "the last K positions, through a name assigned in the loop",
        ),
        Invalid(
            PREAMBLE + "T = logits.size(1)\nlosses = []\nfor t in range(T):\n"
            "    losses.append(F.cross_entropy(logits[:, t], targets[:, t]))\nloss = torch.stack(losses).mean()\n",
            PREAMBLE
            + "T = logits.size(1)\nlosses = (\n"
            + '    F.cross_entropy(\n        logits.flatten(0, 1), targets[:, :T].flatten(0, 1), reduction="none"\n'
            "    )\n    .view_as(targets[:, :T])\n    .sum(0)\n    / (targets[:, :T] != -100).sum(0)\n)\n"
            "loss = losses.mean()\n",
            "per-position losses collected in a list: one vector of them",
        ),
        Invalid(
            PREAMBLE
            + 'loss = sum(F.cross_entropy(logits[:, t], targets[:, t], reduction="sum") for t in range(6)) / 6\n',
            PREAMBLE
            + "loss = (\n    F.cross_entropy(\n"
            + '        logits[:, :6].flatten(0, 1), targets[:, :6].flatten(0, 1), reduction="sum"\n'
            + "    )\n    / 6\n)\n",
            "a generator summed",
        ),
        Invalid(
            PREAMBLE + "K = 3\nfor k in range(K):\n    step_logits = logits[:, -K + k, :]\n"
            "    loss += F.cross_entropy(step_logits, targets[:, k])\nprint(step_logits)\n",
            None,
            "a name the loop assigns is read after it",
        ),
        Invalid(
            PREAMBLE
            + 'for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t], reduction="none")\n',
            None,
            "a per-sample result",
        ),
        Invalid(
            PREAMBLE
            + "w = torch.ones(10)\nfor t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t], weight=w)\n",
            None,
            "class weights with the mean",
        ),
        Invalid(
            PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t])\nprint(t)\n",
            None,
            "the loop variable is read after the loop",
        ),
        Invalid(
            PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t])\n    print(t)\n",
            None,
            "the loop does more than add losses",
        ),
        Invalid(
            PREAMBLE + "model = torch.nn.Linear(6, 10)\nx = torch.randn(4, 6)\nfor t in range(1, 6):\n"
            "    loss = loss + F.cross_entropy(model(x[:, :t].sum(1, keepdim=True).expand(4, 6)), targets[:, t])\n",
            None,
            "each position runs the model (teacher forcing)",
        ),
    ]

    # -- loops ---------------------------------------------------------------------

    def visit_For(self, node: cst.For) -> None:
        loop = self._for_positions(node)
        if loop is None:
            return
        losses = self._position_losses(node.body, loop)
        if not losses or self._recurrent(node):
            return
        try:
            try:
                edits, imports = self._rewrite_loop(node, loop)
            except _NotRewritten as reason:
                if self._teacher_forced(node.body, loop):
                    raise
                try:
                    edits, imports = self._general_rewrite(node, loop)
                except _NotRewritten as general:
                    cross_entropy = all(self._losses.kind(call) is not None for call in losses)
                    raise (reason if cross_entropy else general) from None
        except _NotRewritten as reason:
            self.report(node, f"{self._message(node.body, loop)}; not rewritten: {reason}")
            return
        self.report(node, self._message(node.body, loop), edits=edits, imports=imports)

    @property
    def _losses(self):
        """Which loss a call computes and its options (the shared analysis)."""
        return loss_calls(self.context)

    @property
    def _slices(self):
        """The positions a loop's indices visit, as slices (the shared analysis)."""
        return position_slices(self.context)

    def _recurrent(self, node: cst.For) -> bool:
        """Does each position run a module on what the one before it made (free-running
        decoding, a hidden state handed on)? Then the loop must stay, and one loss call
        after it would save next to nothing."""
        kinds = self.context.kinds
        return any(
            kinds.fact(call.func).kind is Kind.MODULE and any(kinds.carried_reads(node, arg) for arg in call.args)
            for call in self.context.index.find(cst.Call, within=node.body)
        )

    def _for_positions(self, node: cst.For) -> _Loop | None:
        if node.orelse is not None or node.asynchronous is not None:
            return None
        if isinstance(node.target, cst.Name):
            bounds = self._range_bounds(node.iter)
            return _Loop(node.target.value, *bounds) if bounds is not None else None
        return self._unbound_rows(node.target, node.iter)

    def _range_bounds(self, iterable: cst.BaseExpression):
        """(start, stop) of `range(stop)` / `range(start, stop)`."""
        if not isinstance(iterable, cst.Call) or not self.context.names.is_(iterable.func, "range", "builtins.range"):
            return None
        if any(arg.keyword is not None or arg.star for arg in iterable.args):
            return None
        values = [arg.value for arg in iterable.args]
        if len(values) == 1:
            return None, values[0]
        if len(values) == 2:
            return values[0], values[1]
        return None

    def _unbound_rows(self, target: cst.BaseExpression, iterable: cst.BaseExpression) -> _Loop | None:
        """`for a, b in zip(x.unbind(1), y.unbind(1))` (or `unbind(dim=1)`): a = x[:, t], b = y[:, t]."""
        if not (isinstance(iterable, cst.Call) and self.context.names.is_(iterable.func, "zip", "builtins.zip")):
            return None
        if (
            not isinstance(target, (cst.Tuple, cst.List))
            or len(target.elements) != len(iterable.args)
            or not iterable.args
        ):
            return None
        rows = {}
        for element, arg in zip(target.elements, iterable.args):
            value = arg.value
            if not (
                isinstance(element.value, cst.Name)
                and arg.keyword is None
                and not arg.star
                and m.matches(
                    value, m.Call(func=m.Attribute(attr=m.Name("unbind")), args=[m.Arg(value=m.Integer("1"))])
                )
                and value.args[0].keyword
                in (None,) + tuple(k for k in [value.args[0].keyword] if k and k.value == "dim")
                and isinstance(value.func.value, (cst.Name, cst.Attribute))
            ):
                return None
            rows[element.value.value] = value.func.value
        return _Loop(None, rows=rows)

    def _position_losses(self, body: cst.CSTNode, loop: _Loop) -> list[cst.Call]:
        """The cross-entropy / NLL calls in `body` whose input or target is one position
        of the loop, `x[:, <t>]` (directly or through a name the body assigns)."""
        assigned = None
        found = []
        for call in own_nodes(self.context.index, cst.Call, body):
            if self._losses.kind(call) is None and self._losses.any_loss(call) is None:
                continue
            for arg in call.args[:2]:
                value = arg.value
                if isinstance(value, cst.Name) and value.value not in loop.rows:
                    assigned = self._assigned_in(body) if assigned is None else assigned
                    value = assigned.get(value.value, value)
                assigned = self._assigned_in(body) if assigned is None else assigned
                if self._at_position(value, loop) or self._reads_position(value, loop, assigned):
                    found.append(call)
                    break
        return found

    def _reads_position(self, expr: cst.BaseExpression, loop: _Loop, assigned: dict, depth: int = 0) -> bool:
        """Does `expr` read positions of a tensor, `x[:, t]` or `x[:, :t]`, inside the
        pointwise functions around it or through the names the body assigns?"""
        if loop.var is None or depth > 3:
            return False
        for subscript in _subscripts(expr):
            elements = list(subscript.slice)
            if (
                len(elements) >= 2
                and m.matches(elements[0], FULL_SLICE)
                and loop.var in {n.value for n in names_read(elements[1])}
            ):
                return True
        return any(
            self._reads_position(assigned[name.value], loop, assigned, depth + 1)
            for name in names_read(expr)
            if name.value in assigned and assigned[name.value] is not expr
        )

    def _at_position(self, expr: cst.BaseExpression, loop: _Loop) -> bool:
        """`x[:, <reads t>, ...]` (through calls and attributes of it), or a row of the zip."""
        if isinstance(expr, cst.Name):
            return expr.value in loop.rows
        while isinstance(expr, (cst.Call, cst.Attribute)):
            expr = expr.func if isinstance(expr, cst.Call) else expr.value
        if loop.var is None or not isinstance(expr, cst.Subscript) or len(expr.slice) < 2:
            return False
        first, second = expr.slice[0], expr.slice[1]
        return (
            m.matches(first, FULL_SLICE)
            and isinstance(second.slice, cst.Index)
            and loop.var in {n.value for n in names_read(second.slice.value)}
        )

    def _assigned_in(self, body: cst.CSTNode) -> dict[str, cst.BaseExpression]:
        found = {}
        for assign in own_nodes(self.context.index, cst.Assign, body):
            if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
                found[assign.targets[0].target.value] = assign.value
        return found

    def _message(self, body: cst.CSTNode, loop: _Loop) -> str:
        cross_entropy = all(self._losses.kind(call) is not None for call in self._position_losses(body, loop))
        loss = "cross-entropy" if cross_entropy else "the loss"
        if loop.var is not None and self._teacher_forced(body, loop):
            return (
                f"the model runs its forward once per sequence position (teacher forcing) and {loss} is computed per "
                "position; a causal model gives every position's logits in one call (`logits = model(x[:, :-1])`), "
                f"then one {'cross-entropy' if cross_entropy else 'loss'} over all positions"
            )
        return self.MESSAGE if cross_entropy else self.MESSAGE.replace("cross-entropy", "a loss", 1)

    def _teacher_forced(self, body: cst.CSTNode, loop: _Loop) -> bool:
        """Does the body run the model (or another callable of this program) on something
        that reads the position: `model(x[:, :t])`?"""
        assigned = self._assigned_in(body)
        for call in own_nodes(self.context.index, cst.Call, body):
            if self._losses.kind(call) is not None or self._losses.any_loss(call) is not None:
                continue
            if isinstance(call.func, cst.Attribute) and not (
                self.context.training.is_model(call.func) or self._runs_a_module(call.func)
            ):
                continue  # a method of a tensor or of a library
            names = self.context.names.of(call.func)
            if names and all(n.startswith(("torch.", "builtins.")) for n in names):
                continue
            if any(self._reads_var(arg.value, loop, assigned) for arg in call.args):
                return True
        return False

    def _runs_a_module(self, func: cst.Attribute) -> bool:
        """`llm.model(...)`: an attribute of a value this file cannot type (a parameter)
        called, not a tensor method torch has: it may run a module."""
        kinds = self.context.kinds
        receiver = kinds.fact(func.value).kind
        return (
            func.attr.value not in TORCH_METHODS
            and receiver in (Kind.MODULE, Kind.UNKNOWN)
            and isinstance(func.value, (cst.Name, cst.Attribute))
            and not self.context.names.of(func)
        )

    def _reads_var(self, expr: cst.BaseExpression, loop: _Loop, assigned: dict, depth: int = 0) -> bool:
        """Does `expr` read the loop variable, itself or through the names the body assigns?"""
        reads = names_read(expr)
        if any(n.value == loop.var for n in reads):
            return True
        return depth < 4 and any(
            self._reads_var(assigned[n.value], loop, assigned, depth + 1)
            for n in reads
            if n.value in assigned and assigned[n.value] is not expr
        )

    def _rewrite_loop(self, node: cst.For, loop: _Loop):
        """The edits that turn the loop into one call, or _NotRewritten."""
        if self._teacher_forced(node.body, loop):
            raise _NotRewritten("each position runs the model on its own prefix")
        if not isinstance(node.body, cst.IndentedBlock) or not all(
            isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 for line in node.body.body
        ):
            raise _NotRewritten("the loop does more than add one loss per position")
        *setup, statement = [line.body[0] for line in node.body.body]
        temporaries: dict[str, cst.Assign] = {}
        for assign in setup:
            if not m.matches(assign, m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Subscript())):
                raise _NotRewritten("the loop does more than add one loss per position")
            temporaries[assign.targets[0].target.value] = assign
        accumulated = self._accumulated(statement)
        appended = self._appended(statement) if accumulated is None else None
        if accumulated is None and appended is None:
            raise _NotRewritten("the loop does more than add one loss per position")
        value = accumulated[1] if accumulated is not None else appended[1]
        term = self._term(value, loop, temporaries)
        accumulator = accumulated[0] if accumulated is not None else appended[0]
        reads = [n.value for n in names_read(_inline(value, temporaries))]
        if accumulator.value in reads:
            raise _NotRewritten(f"each term reads `{accumulator.value}`")
        for name, assign in temporaries.items():
            if [n.value for n in names_read(value)].count(name) != 1 or set(temporaries) & {
                n.value for n in names_read(assign.value)
            }:
                raise _NotRewritten(f"`{name}` is not read once by the loss")
        targets = [*(a.targets[0].target for a in temporaries.values())]
        targets += [node.target] if loop.var is not None else [e.value for e in node.target.elements]
        for target in targets:
            if self._read_after(node, target):
                raise _NotRewritten(f"`{target.value}` is read after the loop, and the fix leaves it unbound")
        edits: list = [Remove(self.context.parents[assign]) for assign in temporaries.values()]
        imports = self._imports(term)
        if accumulated is not None:
            head = self.context.source(statement).split(self.context.source(value))[0]  # `loss += `
            indent = self.context.positions[node].start.column
            edits.append(Replace(value, self._expression(term, loop, "total", indent + len(head), indent)))
        else:
            edits += self._list_edits(node, statement, term, loop)
        edits.append(unwrap(node))
        return edits, imports

    # -- any per-element loss, and the loss combined per position ------------------------

    def _general_rewrite(self, node: cst.For, loop: _Loop):
        """The edits that turn `acc += <term of t>` (after assignments of names the term
        reads) into one expression over all positions, for a term that is a loss reduced
        per position (`mean`, `sum`, `batchmean`) times constants, or `.sum()` / `.mean()`
        of a pointwise expression of position slices and unreduced losses (a masked loss)."""
        if loop.var is None or not isinstance(node.body, cst.IndentedBlock):
            raise _NotRewritten("the loop does more than add one loss per position")
        if not all(isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 for line in node.body.body):
            raise _NotRewritten("the loop does more than add one loss per position")
        *setup, statement = [line.body[0] for line in node.body.body]
        temporaries: dict[str, cst.Assign] = {}
        for assign in setup:
            if not m.matches(assign, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
                raise _NotRewritten("the loop does more than add one loss per position")
            name = assign.targets[0].target.value
            if name in temporaries or name == loop.var:
                raise _NotRewritten(f"`{name}` is bound more than once in the loop")
            temporaries[name] = assign
        accumulated = self._accumulated(statement)
        if accumulated is None:
            raise _NotRewritten("the loop does more than add one loss per position")
        accumulator, value = accumulated
        term = value
        for _ in range(len(temporaries) + 1):  # names assigned from names assigned before them
            read = [n.value for n in names_read(term) if n.value in temporaries]
            if not read:
                break
            if any(read.count(name) != 1 for name in read):
                raise _NotRewritten(f"`{read[0]}` is read more than once by the loss")
            term = _inline(term, temporaries)
        else:
            raise _NotRewritten("the names the loop assigns depend on each other")
        used = {n.value for n in names_read(term)}
        if accumulator.value in used:
            raise _NotRewritten(f"each term reads `{accumulator.value}`")
        unused = [name for name in temporaries if not self._reaches(name, value, temporaries)]
        if unused:
            raise _NotRewritten(f"`{unused[0]}` is assigned in the loop but not read by the loss")
        for target in [*(a.targets[0].target for a in temporaries.values()), node.target]:
            if self._read_after(node, target):
                raise _NotRewritten(f"`{target.value}` is read after the loop, and the fix leaves it unbound")
        values = {name: assign.value for name, assign in temporaries.items()}
        batched, imports = _Batched(self, loop, values).total(value)
        edits: list = [Remove(self.context.parents[assign]) for assign in temporaries.values()]
        edits += [Replace(value, cst.parse_expression(batched)), unwrap(node)]
        return edits, imports

    @staticmethod
    def _reaches(name: str, value: cst.BaseExpression, temporaries: dict[str, cst.Assign]) -> bool:
        frontier, seen = [value], set()
        while frontier:
            for read in names_read(frontier.pop()):
                if read.value == name:
                    return True
                if read.value in temporaries and read.value not in seen:
                    seen.add(read.value)
                    frontier.append(temporaries[read.value].value)
        return False

    def _scalar(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        """A Python number the code shows: a literal, arithmetic of them, a name bound only
        to them (also by unpacking a tuple of literals), or a parameter annotated `int` or
        `float` or with a number for its default: the same for every position (a tensor
        could broadcast against one position's slice and not against all of them)."""
        if depth > 4:
            return False
        if number_value(expr) is not None:
            return True
        if isinstance(expr, cst.BinaryOperation):
            return self._scalar(expr.left, depth + 1) and self._scalar(expr.right, depth + 1)
        if isinstance(expr, cst.UnaryOperation):
            return self._scalar(expr.expression, depth + 1)
        if not isinstance(expr, cst.Name):
            return False
        scope = self.context.scopes.get(expr)
        if scope is None or not scope[expr.value]:
            return False
        for assignment in scope[expr.value]:
            node = getattr(assignment, "node", None)
            parent = self.context.parents.get(node) if node is not None else None
            if isinstance(node, cst.Param) or isinstance(parent, cst.Param):
                param = node if isinstance(node, cst.Param) else parent
                annotation = param.annotation.annotation if param.annotation is not None else None
                if not (
                    m.matches(annotation, m.Name("float") | m.Name("int"))
                    or (param.default is not None and number_value(param.default) is not None)
                ):
                    return False
                continue
            if type(assignment) is not Assignment:
                return False
            value = self.context.bindings.assigned_value(assignment)
            if value is None:
                unpacked = self.context.bindings.unpacked(assignment)
                if unpacked is None or not isinstance(unpacked[0], (cst.Tuple, cst.List)):
                    return False
                elements = unpacked[0].elements
                if unpacked[1] >= len(elements):
                    return False
                value = elements[unpacked[1]].value
            if not self._scalar(value, depth + 1):
                return False
        return True

    @staticmethod
    def _accumulated(statement: cst.BaseSmallStatement) -> tuple[cst.Name, cst.BaseExpression] | None:
        """(acc, term) of `acc += term` or `acc = acc + term`."""
        if m.matches(statement, m.AugAssign(target=m.Name(), operator=m.AddAssign())):
            return statement.target, statement.value
        if (
            m.matches(
                statement,
                m.Assign(
                    targets=[m.AssignTarget(target=m.Name())], value=m.BinaryOperation(left=m.Name(), operator=m.Add())
                ),
            )
            and statement.value.left.value == statement.targets[0].target.value
        ):
            return statement.targets[0].target, statement.value.right
        return None

    @staticmethod
    def _appended(statement: cst.BaseSmallStatement) -> tuple[cst.Name, cst.BaseExpression] | None:
        """(L, term) of `L.append(term)`."""
        if m.matches(
            statement,
            m.Expr(
                value=m.Call(
                    func=m.Attribute(value=m.Name(), attr=m.Name("append")), args=[m.Arg(keyword=None, star="")]
                )
            ),
        ):
            call = statement.value
            return call.func.value, call.args[0].value
        return None

    def _list_edits(self, node: cst.For, statement: cst.Expr, term: _Term, loop: _Loop) -> list:
        """`L = []` before the loop, `L.append(term)` in it, and one `torch.stack(L)` or
        `sum(L)` after it: L becomes the vector of per-position losses."""
        name = statement.value.func.value
        scope = self.context.scopes.get(name)
        assignments = [a for a in scope.assignments[name.value]] if scope is not None else []
        if len(assignments) != 1 or not isinstance(assignments[0], Assignment):
            raise _NotRewritten(f"`{name.value}` is bound more than once")
        created = self.context.bindings.statement(assignments[0].node)
        line = self.context.parents.get(created)
        if not (
            isinstance(created, cst.Assign)
            and m.matches(created.value, m.List(elements=[]))
            and self.context.parents.get(line) is self.context.parents.get(node)
            and self.context.index.before(created, node)
        ):
            raise _NotRewritten(f"`{name.value}` is not an empty list made right before the loop")
        uses = [access.node for access in assignments[0].references if not self.context.inside(access.node, node)]
        if len(uses) != 1:
            raise _NotRewritten(f"`{name.value}` is read more than once after the loop")
        use = uses[0]
        arg = self.context.parents.get(use)
        call = self.context.parents.get(arg)
        if not (
            isinstance(arg, cst.Arg)
            and isinstance(call, cst.Call)
            and len(call.args) == 1
            and arg.keyword is None
            and self.context.index.before(node, call)
        ):
            raise _NotRewritten(f"`{name.value}` is used after the loop other than by `torch.stack` or `sum`")
        if self.context.names.is_(call.func, "torch.stack"):
            replacement = cst.Name(name.value)
        elif self.context.names.is_(call.func, "sum", "builtins.sum"):
            replacement = cst.parse_expression(f"{name.value}.sum()")
        else:
            raise _NotRewritten(f"`{name.value}` is used after the loop other than by `torch.stack` or `sum`")
        indent = self.context.positions[node].start.column
        vector = self._expression(term, loop, "vector", indent + len(name.value) + 3, indent)
        assign = cst.Assign(targets=[cst.AssignTarget(cst.Name(name.value))], value=vector)
        return [Remove(line), Replace(statement, assign), Replace(call, replacement)]

    # -- comprehensions ------------------------------------------------------------

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._comprehension(node)

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._comprehension(node)

    def _comprehension(self, node: cst.GeneratorExp | cst.ListComp) -> None:
        """`sum(<loss of t> for t in range(...))` and `torch.stack([<loss of t> for t in ...])`."""
        comp = node.for_in
        if comp.inner_for_in is not None or comp.asynchronous is not None:
            return
        if isinstance(comp.target, cst.Name):
            bounds = self._range_bounds(comp.iter)
            loop = _Loop(comp.target.value, *bounds) if bounds is not None else None
        else:
            loop = self._unbound_rows(comp.target, comp.iter)
        if loop is None or not self._position_losses(node.elt, loop):
            return
        parent = self.context.parents.get(node)
        call = self.context.parents.get(parent) if isinstance(parent, cst.Arg) else parent
        try:
            if comp.ifs:
                raise _NotRewritten("the positions are filtered")
            if not (
                isinstance(call, cst.Call)
                and len(call.args) == 1
                and isinstance(parent, cst.Arg)
                and parent.keyword is None
                and not parent.star
            ):
                raise _NotRewritten("the per-position losses are not summed or stacked")
            if self.context.names.is_(call.func, "sum", "builtins.sum"):
                kind = "total"
            elif self.context.names.is_(call.func, "torch.stack") and isinstance(node, cst.ListComp):
                kind = "vector"
            else:
                raise _NotRewritten("the per-position losses are not summed or stacked")
            term = self._term(node.elt, loop, {})
        except _NotRewritten as reason:
            self.report(node, f"{self.MESSAGE}; not rewritten: {reason}")
            return
        statement = self.context.index.statement_of(call)
        indent = self.context.positions[statement].start.column
        column = self.context.positions[call].start.column
        expression = self._expression(term, loop, kind, column, indent, parenthesize=term.factor is not None)
        self.report(node, edits=[Replace(call, expression)], imports=self._imports(term))

    # -- the loss of one position ------------------------------------------------------

    def _term(self, value: cst.BaseExpression, loop: _Loop, temporaries: dict[str, cst.Assign]) -> _Term:
        call, factor = _split_factor(value)
        loss = self._losses.options(call)
        if loss is None:
            raise _NotRewritten("what the loop adds is not one cross-entropy call (times a constant)")
        if loss.problem is not None:
            raise _NotRewritten(loss.problem)
        if factor is not None and not _is_constant(factor[1], loop):
            raise _NotRewritten("the factor applied to each term is not a plain name or number")
        plain = [arg for arg in call.args if arg.keyword is None]
        named = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
        if loss.module is None:
            inputs = plain[0].value if plain else named.get("input")
            target = plain[1].value if len(plain) > 1 else named.get("target")
        else:
            inputs, target = (plain[0].value, plain[1].value) if len(plain) == 2 else (None, None)
        if inputs is None or target is None:
            raise _NotRewritten("the loss's input and target are not both given")
        input_operand = self._operand(_inline(inputs, temporaries), loop, trailing=True)
        target_operand = self._operand(_inline(target, temporaries), loop, trailing=False)
        if input_operand is None or target_operand is None:
            raise _NotRewritten("the loss does not read `x[:, t]` and `y[:, t]` of the loop's position `t`")
        read = [n.value for n in names_read(_inline(call, temporaries))]
        if loop.var is not None and read.count(loop.var) != 2:
            raise _NotRewritten(f"`{loop.var}` is used for more than indexing the positions")
        return _Term(value, call, factor, loss, input_operand, target_operand)

    def _operand(self, expr: cst.BaseExpression, loop: _Loop, trailing: bool) -> _Operand | None:
        """`base[:, t + offset]` (`base[:, t + offset, :]` for the input), or a row of `zip(... .unbind(1))`."""
        if isinstance(expr, cst.Name) and expr.value in loop.rows:
            return _Operand(loop.rows[expr.value], full=True)
        if (
            loop.var is None
            or not isinstance(expr, cst.Subscript)
            or not isinstance(expr.value, (cst.Name, cst.Attribute))
        ):
            return None
        elements = list(expr.slice)
        if len(elements) == 3 and trailing and m.matches(elements[2], FULL_SLICE):
            elements = elements[:2]
        if len(elements) != 2 or not m.matches(elements[0], FULL_SLICE) or not isinstance(elements[1].slice, cst.Index):
            return None
        index = affine(elements[1].slice.value, loop.var)
        if index is None or loop.var in {n.value for n in names_read(expr.value)}:
            return None
        sign, offset = index
        return _Operand(expr.value, sign, offset)

    # -- the batched expression -----------------------------------------------------

    def _expression(
        self, term: _Term, loop: _Loop, kind: str, column: int, indent: int, parenthesize: bool = False
    ) -> cst.BaseExpression:
        """The loss over all positions: their sum (`kind` "total"), or the vector of
        per-position losses ("vector"), for an expression that starts at `column` of a
        statement indented by `indent`."""
        code = self.context.module.code_for_node
        inputs, targets = self._batched_operands(term, loop)
        loss = term.loss
        alias = functional_alias(self.context.module) or FUNCTIONAL
        function = code(term.call.func) if loss.module is None else f"{alias}.{loss.function}"
        if loss.reduction == "sum" and kind == "total":
            if loss.module is not None:
                text = f"{code(loss.module)}({inputs}.flatten(0, 1), {targets}.flatten(0, 1))"
            else:
                extra = "".join(f", {k}={v}" for k, v in loss.keywords.items())
                text = f"{function}({inputs}.flatten(0, 1), {targets}.flatten(0, 1){extra})"
            lines = [text]
        else:
            keywords = {"reduction": '"none"', **{k: v for k, v in loss.keywords.items() if k != "reduction"}}
            extra = "".join(f", {k}={v}" for k, v in keywords.items())
            # every token's loss over the flattened positions (the classes stay the last,
            # contiguous dimension: a class dimension moved to the middle costs a strided
            # softmax), laid out again as the targets to sum over the batch
            tokens = f"{function}({inputs}.flatten(0, 1), {targets}.flatten(0, 1){extra}).view_as({targets})"
            if loss.reduction == "sum":  # the vector of per-position sums
                lines = [f"{tokens}.sum(0)"]
            else:
                ignore = loss.keywords.get("ignore_index", DEFAULT_IGNORE_INDEX)
                close = ".sum()" if kind == "total" else ""
                lines = [f"({tokens}.sum(0)", f"/ ({targets} != {ignore}).sum(0)){close}"]
        if term.factor is not None:
            operator, operand = term.factor
            lines[-1] = f"{lines[-1]} {operator} {code(operand)}"
        if parenthesize:
            lines[0] = f"({lines[0]}"
            lines[-1] = f"{lines[-1]})"
        text = " ".join(lines)
        if len(lines) > 1 and column + len(text) > LINE_LENGTH:
            # libcst puts the block's indentation in front of the continuation line itself
            text = f"{lines[0]}\n{' ' * (column - indent + 1)}{lines[1]}"
        return cst.parse_expression(text)

    def _batched_operands(self, term: _Term, loop: _Loop) -> tuple[str, str]:
        """The input and the target over every position the loop visits, as text, in the
        same order for both: slices where the positions are one range that does not wrap
        around, else the loop's index arithmetic over `torch.arange`."""
        pair = (term.input, term.target)
        if all(o.full for o in pair):
            return tuple(self.context.module.code_for_node(o.base) for o in pair)
        if any(o.full for o in pair):
            raise _NotRewritten("the positions of the input and the target are not visited the same way")
        sliced = [
            self._slices.sliced(o.base, o.sign, o.offset, loop.start, loop.stop) if o.sign == pair[0].sign else None
            for o in pair
        ]
        if all(s is not None for s in sliced):
            return tuple(sliced)
        # Slices run in ascending positions; `-t` visits them in descending order, which
        # only slices of both keep aligned. Ascending ones may mix slices and gathers.
        return tuple(
            s
            if s is not None and o.sign == 1
            else self._slices.gathered(o.base, o.sign, o.offset, loop.start, loop.stop)
            for s, o in zip(sliced, pair)
        )

    def _imports(self, term: _Term) -> list[tuple[str, str | None]]:
        imports = []
        if term.loss.module is not None and functional_alias(self.context.module) is None:
            imports.append((FUNCTIONAL, None))
        return imports

    # -- facts about numbers ------------------------------------------------------------

    def _read_after(self, node: cst.CSTNode, target: cst.Name) -> bool:
        """May a read outside the loop see the value `target` binds in it? (Flow-sensitive:
        a later `for t in ...` or `t = ...` that rebinds the name first hides it.)"""
        scope = self.context.scopes.get(target)
        if scope is None:
            return True
        binding = [a for a in scope.assignments[target.value] if isinstance(a, Assignment) and a.node is target]
        if not binding:
            return True
        reads = self.context.kinds.reached_reads(binding[0])
        return any(not self.context.inside(read, node) for read in reads)


def _inline(value: cst.BaseExpression, temporaries: dict[str, cst.Assign]) -> cst.BaseExpression:
    """`value` with each read of a temporary replaced by the expression assigned to it."""
    if not temporaries:
        return value
    reads = {id(name) for name in names_read(value) if name.value in temporaries}
    return value.visit(_Inline(reads, temporaries))


class _Inline(cst.CSTTransformer):
    def __init__(self, reads: set[int], temporaries: dict[str, cst.Assign]) -> None:
        super().__init__()
        self.reads = reads
        self.temporaries = temporaries

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if id(original) in self.reads:
            return self.temporaries[original.value].value
        return updated


def _split_factor(value: cst.BaseExpression):
    """(call, (operator, operand)) for `call / k` or `call * k`; (value, None) otherwise."""
    if isinstance(value, cst.BinaryOperation) and isinstance(value.left, cst.Call):
        if isinstance(value.operator, cst.Divide):
            return value.left, ("/", value.right)
        if isinstance(value.operator, cst.Multiply):
            return value.left, ("*", value.right)
    return value, None


def _is_constant(expr: cst.BaseExpression, loop: _Loop) -> bool:
    """A number, or an expression of names and numbers that does not read the position."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    reads = {n.value for n in names_read(expr)}
    if loop.var in reads or reads & set(loop.rows):
        return False
    return isinstance(expr, (cst.Name, cst.Attribute)) or (
        isinstance(expr, cst.BinaryOperation) and _is_constant(expr.left, loop) and _is_constant(expr.right, loop)
    )


def _subscripts(expr: cst.BaseExpression) -> list[cst.Subscript]:
    return list(m.findall(expr, m.Subscript())) if isinstance(expr, cst.CSTNode) else []


class _Batched:
    """One position's term, as text over all the positions a loop visits."""

    def __init__(self, rule: PerPositionLossLoop, loop: _Loop, temporaries: dict[str, cst.BaseExpression]) -> None:
        self.rule = rule
        self.loop = loop
        self.temporaries = temporaries  # names the loop assigns before the term, read once each
        self.reads = {id(n) for v in [*temporaries.values()] for n in names_read(v)}
        self.code = rule.context.module.code_for_node
        self.operands: list[tuple[cst.Subscript, _Operand]] = []
        self.texts: dict[int, str] = {}
        self.imports: list[tuple[str, str | None]] = []

    def total(self, term: cst.BaseExpression) -> tuple[str, list]:
        """The sum over the positions of `term`, and the imports it needs."""
        self.reads |= {id(n) for n in names_read(term)}
        text = self._total(term)
        return text, self.imports

    def _total(self, term: cst.BaseExpression) -> str:
        term = self._value(term)
        if isinstance(term, cst.BinaryOperation) and isinstance(term.operator, (cst.Multiply, cst.Divide)):
            operator = "*" if isinstance(term.operator, cst.Multiply) else "/"
            if self.rule._scalar(term.right) and not self._reads(term.right):
                return f"{self._total(term.left)} {operator} {wrapped(self.code(term.right))}"
            if operator == "*" and self.rule._scalar(term.left) and not self._reads(term.left):
                return f"{wrapped(self.code(term.left))} * {self._total(term.right)}"
        if term.lpar and isinstance(term, cst.BinaryOperation):
            return self._total(term.with_changes(lpar=(), rpar=()))
        if not isinstance(term, cst.Call):
            raise _NotRewritten("what the loop adds is not a loss per position (times a constant)")
        found = self.rule._losses.any_loss(term)
        if found is not None:
            function, facts, constructor = found
            reduction, call = self._loss_call(term, function, facts, constructor)
            if reduction == "none":
                raise _NotRewritten('reduction="none" gives per-sample losses that the loop combines in its own way')
            if facts.class_targets:
                if reduction != "sum":
                    raise _NotRewritten("each position's mean divides by its own count of targets")
                return call("sum")
            if reduction == "sum":
                return call("sum")
            if reduction == "batchmean":  # each position's sum over its batch size: the base's first size
                return f"{call('sum')} / {self.code(self.operands[0][1].base)}.size(0)"
            return self._sum_of_means(call("mean"), call("none"))
        reduced = self._reduction(term)
        if reduced is None:
            raise _NotRewritten("what the loop adds is not a loss per position (times a constant)")
        kind, operand = reduced
        self._pointwise(operand)
        self._align()
        text = wrapped(self._substitute(operand))
        if kind == "sum":
            return f"{text}.sum()"
        return self._sum_of_means(f"{text}.mean()", text)

    def _sum_of_means(self, mean: str, unreduced: str) -> str:
        """The sum over the positions of each position's mean: every position has as many
        elements, so the mean over all of them times the number of positions, where the
        loop's range shows that number; else each position's mean, summed."""
        count = self.rule._slices.count(self.loop.start, self.loop.stop) if self.loop.var is not None else None
        if count is not None and count >= 1:
            start = self.loop.start
            plain = start is None or is_zero(start)
            return f"{mean} * {self.code(self.loop.stop) if plain else count}"
        return f"{unreduced}.transpose(0, 1).flatten(1).mean(1).sum()"

    def _reduction(self, call: cst.Call) -> tuple[str, cst.BaseExpression] | None:
        """("sum" or "mean", what it reduces) for `x.sum()`, `x.mean()`, `torch.sum(x)`."""
        if call.args and isinstance(call.func, cst.Attribute) and call.func.attr.value in ("sum", "mean"):
            return None
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("sum", "mean"):
            names = self.rule.context.names.of(call.func)
            if not names or not any(n.startswith("torch.") for n in names):
                return call.func.attr.value, call.func.value
        if self.rule.context.names.is_(call.func, "torch.sum", "torch.mean") and len(call.args) == 1:
            arg = call.args[0]
            if arg.keyword is None and not arg.star:
                return call.func.attr.value if isinstance(call.func, cst.Attribute) else "sum", arg.value
        return None

    def _loss_call(self, call: cst.Call, function: str, facts: Loss, constructor: cst.Call | None):
        """(its reduction, a function of a reduction giving the call over all positions)."""
        keywords: dict[str, str] = {}
        reduction = facts.reduction
        arguments = constructor.args if constructor is not None else call.args
        if constructor is not None and any(a.keyword is not None for a in call.args):
            raise _NotRewritten("the loss module is called with keyword arguments")
        plain = [a for a in call.args if a.keyword is None and not a.star]
        named = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        if any(a.star for a in [*call.args, *arguments]) or len(plain) > 2:
            raise _NotRewritten("arguments passed by position or unpacked are not followed")
        if constructor is not None and any(a.keyword is None for a in constructor.args):
            raise _NotRewritten("arguments passed by position or unpacked are not followed")
        for arg in arguments:
            if arg.keyword is None or arg.keyword.value in ("input", "target"):
                continue
            key = arg.keyword.value
            if key == "reduction":
                if not isinstance(arg.value, cst.SimpleString):
                    raise _NotRewritten("its reduction is not a literal")
                reduction = arg.value.evaluated_value
                if (
                    reduction == "batchmean"
                    and not facts.batchmean
                    or reduction not in ("mean", "sum", "none", "batchmean")
                ):
                    raise _NotRewritten(f'reduction="{reduction}" is not one of the loss\'s')
            elif key in facts.options and not self._reads(arg.value):
                keywords[key] = self.code(arg.value)
            else:
                raise _NotRewritten(f"`{key}=` is not understood by the fix")
        inputs = plain[0].value if plain else named.get("input")
        target = plain[1].value if len(plain) > 1 else named.get("target")
        if inputs is None or target is None:
            raise _NotRewritten("the loss's input and target are not both given")
        self._pointwise(inputs)
        self._pointwise(target)
        if not self.operands:
            raise _NotRewritten("the loss does not read `x[:, t]` of the loop's position `t`")
        self._align()
        batched_input, batched_target = self._substitute(inputs), self._substitute(target)
        if constructor is not None:
            alias = functional_alias(self.rule.context.module)
            if alias is None:
                self.imports.append((FUNCTIONAL, None))
            name = f"{alias or FUNCTIONAL}.{facts.functional}"
        else:
            name = self.code(call.func)
        extra = "".join(f", {k}={v}" for k, v in keywords.items())

        def over_positions(reduced: str) -> str:
            if facts.class_targets:
                flat = f"{name}({wrapped(batched_input)}.flatten(0, 1), {wrapped(batched_target)}.flatten(0, 1)"
                if reduced == "none":
                    return f'{flat}, reduction="none"{extra}).view_as({batched_target})'
                return f'{flat}, reduction="{reduced}"{extra})'
            chosen = "" if reduced == facts.reduction else f', reduction="{reduced}"'
            return f"{name}({batched_input}, {batched_target}{chosen}{extra})"

        return reduction, over_positions

    # -- pointwise expressions of position slices --------------------------------------

    def _value(self, expr: cst.BaseExpression) -> cst.BaseExpression:
        """What a name the loop assigns holds; `expr` itself otherwise."""
        while isinstance(expr, cst.Name) and expr.value in self.temporaries:
            expr = self.temporaries[expr.value]
        return expr

    def _reads(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        """Does `expr` read the position (itself or through the names the loop assigns)?"""
        reads = names_read(expr)
        if any(n.value == self.loop.var or n.value in self.loop.rows for n in reads):
            return True
        return depth < 8 and any(
            self._reads(self.temporaries[n.value], depth + 1) for n in reads if n.value in self.temporaries
        )

    def _pointwise(self, expr: cst.BaseExpression) -> None:
        expr = self._value(expr)
        self._pointwise_value(expr)

    def _pointwise_value(self, expr: cst.BaseExpression) -> None:
        """Check that `expr` computes each element of one position from the same elements
        of the positions it reads (slices `x[:, t]`, pointwise torch ops, softmaxes along a
        negative dim, unreduced losses, Python numbers); collect its slices."""
        if not self._reads(expr):
            if self.rule._scalar(expr) or self._constant_argument(expr):
                return
            raise _NotRewritten(
                f"`{self.code(expr)}` may be a tensor, which broadcasts against one position "
                "otherwise than against all of them"
            )
        if isinstance(expr, cst.Subscript):
            operand = self.rule._operand(expr, self.loop, trailing=True)
            if operand is None or operand.full:
                raise _NotRewritten(f"`{self.code(expr)}` is not one position `x[:, t]` of a tensor")
            self.operands.append((expr, operand))
            return
        if isinstance(expr, cst.BinaryOperation) and isinstance(
            expr.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.Power)
        ):
            self._pointwise(expr.left)
            self._pointwise(expr.right)
            return
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            self._pointwise(expr.expression)
            return
        if isinstance(expr, cst.Call):
            self._pointwise_call(expr)
            return
        raise _NotRewritten(f"`{self.code(expr)}` is not computed position by position")

    def _constant_argument(self, expr: cst.BaseExpression) -> bool:
        """A dtype or a device (`torch.float32`, `device`): not a tensor."""
        kinds = self.rule.context.kinds
        if isinstance(expr, (cst.SimpleString, cst.Name)) and m.matches(expr, m.Name("None") | m.SimpleString()):
            return True
        if kinds.fact(expr).kind is Kind.DEVICE:
            return True
        names = self.rule.context.names.of(expr)
        return bool(names) and all(n.startswith("torch.") and n.rsplit(".", 1)[1] in DTYPE_NAMES for n in names)

    def _pointwise_call(self, call: cst.Call) -> None:
        names = self.rule.context.names.of(call.func)
        args = [a for a in call.args]
        if any(a.star for a in args):
            raise _NotRewritten(f"`{self.code(call)}` unpacks its arguments")
        found = self.rule._losses.any_loss(call)
        if found is not None:
            function, facts, constructor = found
            reduction, _ = self._loss_call(call, function, facts, constructor)
            if reduction != "none":
                raise _NotRewritten("a reduced loss inside what each position adds")
            return
        if names & POINTWISE_FUNCTIONS:
            for arg in args:
                self._pointwise(arg.value)
            return
        method = isinstance(call.func, cst.Attribute) and not (names and any(n.startswith("torch.") for n in names))
        if method and call.func.attr.value in POINTWISE_METHODS:
            self._pointwise(call.func.value)
            for arg in args:
                self._pointwise(arg.value)
            return
        along = names & ALONG_DIM_FUNCTIONS
        if along or method and call.func.attr.value in ALONG_DIM_METHODS:
            tensor = call.func.value if not along else (args[0].value if args and args[0].keyword is None else None)
            rest = args if not along else args[1:]
            dims = [a.value for a in rest if a.keyword is None or a.keyword.value == "dim"]
            others = [a for a in rest if a.keyword is not None and a.keyword.value != "dim"]
            dim = integer_value(dims[0]) if len(dims) == 1 else None
            if tensor is None or dim is None or dim >= 0 or any(a.keyword.value != "dtype" for a in others):
                raise _NotRewritten(
                    f"`{self.code(call)}` is not taken along a dim counted from the end (`dim=-1`), "
                    "which all the positions at once would keep"
                )
            self._pointwise(tensor)
            for arg in others:
                self._pointwise(arg.value)
            return
        raise _NotRewritten(f"`{self.code(call)}` is not computed position by position")

    def _align(self) -> None:
        """Every slice of the term as the same positions in the same order: slices where all
        of them are one, else the loop's index arithmetic over `torch.arange`."""
        signs = {operand.sign for _, operand in self.operands}
        sliced = [
            self.rule._slices.sliced(o.base, o.sign, o.offset, self.loop.start, self.loop.stop)
            if len(signs) == 1
            else None
            for _, o in self.operands
        ]
        if all(s is not None for s in sliced):
            self.texts = {id(node): text for (node, _), text in zip(self.operands, sliced)}
        else:
            self.texts = {
                id(node): self.rule._slices.gathered(o.base, o.sign, o.offset, self.loop.start, self.loop.stop)
                for node, o in self.operands
            }

    def _substitute(self, expr: cst.BaseExpression) -> str:
        """`expr` with each slice replaced by its slice over all positions, and each
        unreduced loss by the loss over all positions."""
        return self.code(expr.visit(_Substitute(self)))


class _Substitute(cst.CSTTransformer):
    def __init__(self, batched: _Batched) -> None:
        super().__init__()
        self.batched = batched

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) not in self.batched.texts

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):
        if (
            isinstance(original, cst.Name)
            and id(original) in self.batched.reads
            and original.value in self.batched.temporaries
        ):
            value = self.batched._substitute(self.batched.temporaries[original.value])
            return cst.parse_expression(wrapped(value))
        text = self.batched.texts.get(id(original))
        if text is not None:
            return cst.parse_expression(text).with_changes(lpar=original.lpar, rpar=original.rpar)
        if isinstance(original, cst.Call):
            found = self.batched.rule._losses.any_loss(original)
            if found is not None:
                function, facts, constructor = found
                _, over = self.batched._loss_call(original, function, facts, constructor)
                return cst.parse_expression(over("none"))
        return updated

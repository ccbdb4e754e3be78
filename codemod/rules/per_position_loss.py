from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment

from codemod.analysis.loop_edits import unwrap
from codemod.analysis.names import names_read
from codemod.analysis.torch_facts import CROSS_ENTROPY, CROSS_ENTROPY_MODULES, FUNCTIONAL, functional_alias, is_literal
from codemod.edits import Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid

# Keyword arguments of `F.cross_entropy` (and of the module's constructor) the fix understands.
KNOWN_KEYWORDS = {"weight", "ignore_index", "reduction", "label_smoothing"}
DEFAULT_IGNORE_INDEX = "-100"
LINE_LENGTH = 100  # a longer rewritten line is split after the per-position sums
FULL_SLICE = m.SubscriptElement(slice=m.Slice(lower=None, upper=None, step=None))

PREAMBLE = """\
import torch
import torch.nn.functional as F
logits = torch.randn(4, 6, 10, requires_grad=True)
targets = torch.randint(10, (4, 6))
loss = 0.0
"""
PER_POSITION_MEAN = (
    '(F.cross_entropy(logits[:, :6].transpose(1, 2), targets[:, :6], reduction="none").sum(0)\n'
    "         / (targets[:, :6] != -100).sum(0)).sum()"
)


class PerPositionLossLoop(Rule):
    """
    ## What it does
    Finds a Python loop over sequence positions that adds up one
    cross-entropy per position,

        for t in range(T):
            loss += F.cross_entropy(logits[:, t], targets[:, t])

    (also `logits[:, t, :]`, `range(start, T)`, shifted targets such as
    `targets[:, t + 1]`, the last K positions as `logits[:, -K + k]` with
    `k` in `range(K)`, the slice first assigned to a name in the loop,
    `loss = loss + ...`, a constant factor such as `... / T`, and an
    `nn.CrossEntropyLoss` module called instead of `F.cross_entropy`), and
    replaces the loop with one call over all the positions at once.

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
    number of positions.

    The sum over positions of per-position means is not the mean over all
    tokens: with `reduction="mean"` (the default) each position is divided by
    its own count of targets that are not `ignore_index` (-100 by default), so
    `F.cross_entropy(logits.flatten(0, 1), targets.flatten())` would give a
    different loss, and a different gradient scale, unless every position has
    the same count. The fix keeps the per-position means: it computes every
    token's loss with `reduction="none"`, sums over the batch, and divides by
    each position's count of targets that are not ignored. With
    `reduction="sum"` the loop is one summed call over the flattened
    positions.

    ## Example
    ```python
    loss = 0.0
    for t in range(T):
        loss += F.cross_entropy(logits[:, t], targets[:, t])
    ```
    Use instead:
    ```python
    loss = 0.0
    loss += (F.cross_entropy(logits[:, :T].transpose(1, 2), targets[:, :T], reduction="none").sum(0)
             / (targets[:, :T] != -100).sum(0)).sum()
    ```

    ## Fix safety
    Numeric: the same per-position means and their sum, added in another
    order, so the loss and the gradients agree within floating-point rounding
    (the execution tests see 2e-16 relative in float64). The fix assumes
    what the loop's indexing implies: `logits[:, t]` is `(batch, classes)` and
    `targets[:, t]` holds class indices; a `logits[:, t]` with more dimensions
    (K-dimensional cross-entropy), or probability targets, would make the fix
    raise or differ. The loop variable must not be read after the loop, and
    the slice bounds must be in range (a `range` past the sequence end raises
    `IndexError` in the loop but is clipped by a slice; for the last-K form,
    `K` must be at least 1, as `logits[:, -0:]` is every position).

    Reported without a fix: `reduction="none"` (a per-sample result the loop
    adds up element-wise), `weight=` together with the mean (each position
    is divided by its own sum of class weights), constructor arguments of the
    loss module that are not literals, a negative position offset from a start
    the rule cannot see (`targets[:, t - 1]` from `t = 0` reads the last
    position), and `size_average`/`reduce`.
    """

    CODE = "PM503"
    NAME = "per-position-loss-loop"
    LEVEL = Level.NUMERIC
    REQUIRES = ("cross_entropy", "CrossEntropyLoss")
    MESSAGE = "cross-entropy computed one sequence position at a time in a Python loop; compute it over all positions in one call"
    GAIN = "T softmax/gather launches and their backward nodes become one call: 1.3-2.1x per step on CPU (T=64, benchmarks/bench_batching.py)"

    VALID = [
        Valid(PREAMBLE + "for t in range(6):\n    loss += F.mse_loss(logits[:, t], logits[:, t])\n", "not cross-entropy"),
        Valid(PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[t], targets[t])\n", "a loop over samples, not positions"),
        Valid(PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t])\n    print(t)\n",
              "the loop does more than add losses"),
        Valid(PREAMBLE + "def cross_entropy(a, b):\n    return (a - b).sum()\nfor t in range(6):\n"
              "    loss += cross_entropy(logits[:, t], targets[:, t])\n", "a local function of the same name"),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t])\n",
            PREAMBLE + f"loss += {PER_POSITION_MEAN}\n",
        ),
        Invalid(
            PREAMBLE + "for t in range(1, 5):\n    loss = loss + F.cross_entropy(logits[:, t - 1, :], targets[:, t], reduction=\"sum\") / 4\n",
            PREAMBLE + "loss = loss + F.cross_entropy(logits[:, :4].flatten(0, 1), targets[:, 1:5].flatten(0, 1), "
            "reduction=\"sum\") / 4\n",
            "shifted targets, a summed loss and a constant factor",
        ),
        Invalid(
            PREAMBLE + "criterion = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)\n"
            "for t in range(6):\n    loss += criterion(logits[:, t], targets[:, t])\n",
            PREAMBLE + "criterion = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)\n"
            "loss += (F.cross_entropy(logits[:, :6].transpose(1, 2), targets[:, :6], reduction=\"none\", "
            "ignore_index=0, label_smoothing=0.1).sum(0)\n         / (targets[:, :6] != 0).sum(0)).sum()\n",
            "a loss module: its arguments carried over",
        ),
        Invalid(
            PREAMBLE + "K = 3\nfor k in range(K):\n    step_logits = logits[:, -K + k, :]\n"
            "    loss += F.cross_entropy(step_logits, targets[:, k], reduction=\"sum\")\n",
            PREAMBLE + "K = 3\nloss += F.cross_entropy(logits[:, -K:].flatten(0, 1), targets[:, :K].flatten(0, 1), reduction=\"sum\")\n",
            "the last K positions, through a name assigned in the loop",
        ),
        Invalid(
            PREAMBLE + "K = 3\nfor k in range(K):\n    step_logits = logits[:, -K + k, :]\n"
            "    loss += F.cross_entropy(step_logits, targets[:, k])\nprint(step_logits)\n",
            None,
            "a name the loop assigns is read after it",
        ),
        Invalid(
            PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t], reduction=\"none\")\n",
            None,
            "a per-sample result",
        ),
        Invalid(
            PREAMBLE + "w = torch.ones(10)\nfor t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t], weight=w)\n",
            None,
            "class weights with the mean",
        ),
        Invalid(
            PREAMBLE + "for t in range(6):\n    loss += F.cross_entropy(logits[:, t], targets[:, t])\nprint(t)\n",
            None,
            "the loop variable is read after the loop",
        ),
    ]

    def visit_For(self, node: cst.For) -> None:
        loop = self._position_loop(node)
        if loop is None:
            return
        position, start, stop, temporaries, statement, value = loop
        # `step_logits = logits[:, t]` before the loss: read through, as if written in the call
        inlined = _inline(value, temporaries)
        call, factor = _split_factor(value)
        loss = self._cross_entropy(call)
        if loss is None:
            return
        inlined_call, _ = _split_factor(inlined)
        sliced = self._sliced(inlined_call, position)
        if sliced is None:
            return
        (logits, logits_offset), (targets, targets_offset) = sliced
        problem = loss.problem or self._loop_problem(node, position, temporaries, statement, value, inlined, factor)
        code = self.context.module.code_for_node
        count = self._count(start, stop)
        logits_slice = _slice(start, stop, logits_offset, code(logits), count)
        targets_slice = _slice(start, stop, targets_offset, code(targets), count)
        if problem is None and (logits_slice is None or targets_slice is None):
            problem = ("the positions cannot be written as one slice (a negative offset from a start the rule "
                       "cannot see, or positions counted from the end of another length than the loop's)")
        if problem is not None:
            self.report(node, f"{self.MESSAGE}; not rewritten: {problem}")
            return
        logits_all = f"{code(logits)}[:, {logits_slice}]"
        targets_all = f"{code(targets)}[:, {targets_slice}]"
        if loss.reduction == "sum":
            if loss.module is not None:
                summed = f"{code(loss.module)}({logits_all}.flatten(0, 1), {targets_all}.flatten(0, 1))"
            else:
                extra = "".join(f", {k}={v}" for k, v in loss.keywords.items())
                summed = f"{code(call.func)}({logits_all}.flatten(0, 1), {targets_all}.flatten(0, 1){extra})"
            new_value = summed
        else:
            keywords = {"reduction": '"none"', **{k: v for k, v in loss.keywords.items() if k != "reduction"}}
            extra = "".join(f", {k}={v}" for k, v in keywords.items())
            ignore = loss.keywords.get("ignore_index", DEFAULT_IGNORE_INDEX)
            function = code(call.func) if loss.module is None else f"{functional_alias(self.context.module) or FUNCTIONAL}.cross_entropy"
            per_position_sums = f"({function}({logits_all}.transpose(1, 2), {targets_all}{extra}).sum(0)"
            counts = f"/ ({targets_all} != {ignore}).sum(0)).sum()"
            new_value = f"{per_position_sums} {counts}"
            head = code(statement).split(code(value))[0]  # `loss += ` / `loss = loss + `
            column = self.context.positions[node].start.column + len(head)
            if column + len(new_value) > LINE_LENGTH:
                # libcst puts the block's indentation in front of the continuation line itself
                new_value = f"{per_position_sums}\n{' ' * (len(head) + 1)}{counts}"
        if factor is not None:
            operator, operand = factor
            new_value = f"{new_value} {operator} {code(operand)}"
        needs_import = loss.module is not None and loss.reduction == "mean" and functional_alias(self.context.module) is None
        imports = [(FUNCTIONAL, None)] if needs_import else []
        # The slices assigned to names in the loop are read through: their lines go;
        # the loop runs its (remaining) body once.
        edits = [Remove(self.context.parents[assign]) for assign in temporaries.values()]
        edits += [Replace(value, cst.parse_expression(new_value)), unwrap(node)]
        self.report(node, edits=edits, imports=imports)

    # -- matching ------------------------------------------------------------------

    def _position_loop(self, node: cst.For):
        """(t, start, stop, temporaries, statement, added term) of
        `for t in range(...): [name = subscript ...] acc += term`."""
        if not isinstance(node.target, cst.Name) or node.orelse is not None or node.asynchronous is not None:
            return None
        bounds = self._range_bounds(node.iter)
        if bounds is None or not isinstance(node.body, cst.IndentedBlock):
            return None
        lines = node.body.body
        if not all(isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 for line in lines):
            return None
        *setup, statement = [line.body[0] for line in lines]
        temporaries: dict[str, cst.Assign] = {}
        for assign in setup:
            if not m.matches(assign, m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Subscript())):
                return None
            temporaries[assign.targets[0].target.value] = assign
        if m.matches(statement, m.AugAssign(target=m.Name(), operator=m.AddAssign())):
            value = statement.value
        elif m.matches(statement, m.Assign(targets=[m.AssignTarget(target=m.Name())],
                                           value=m.BinaryOperation(left=m.Name(), operator=m.Add()))) \
                and statement.value.left.value == statement.targets[0].target.value:
            value = statement.value.right
        else:
            return None
        return node.target, bounds[0], bounds[1], temporaries, statement, value

    def _range_bounds(self, iterable: cst.BaseExpression):
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

    def _cross_entropy(self, call: cst.BaseExpression) -> "_Loss | None":
        if not isinstance(call, cst.Call):
            return None
        names = self.context.names
        if names.is_(call.func, CROSS_ENTROPY):
            return _loss_arguments(self.context.module, call, first_keyword_position=2)
        constructor = self._module_constructor(call.func)
        if constructor is None:
            return None
        loss = _loss_arguments(self.context.module, constructor, first_keyword_position=0)
        if loss.problem is None and any(not is_literal(v) for v in loss.keyword_nodes.values()):
            loss.problem = "the loss module's arguments are not literals, so they cannot be carried over"
        if loss.problem is None and any(arg.keyword is not None for arg in call.args):
            loss.problem = "the loss module is called with keyword arguments"
        loss.module = call.func
        return loss

    def _module_constructor(self, func: cst.BaseExpression) -> cst.Call | None:
        """The `nn.CrossEntropyLoss(...)` call that `func` (a name or `self.attr`) was built by."""
        if isinstance(func, cst.Name):
            values = self.context.bindings.values(func)
        elif isinstance(func, cst.Attribute):
            values = self.context.bindings.attribute_values(func)
        else:
            return None
        if not values or len(values) != 1 or not isinstance(values[0], cst.Call):
            return None
        constructor = values[0]
        return constructor if self.context.names.of(constructor.func) & CROSS_ENTROPY_MODULES else None

    def _count(self, start: cst.BaseExpression | None, stop: cst.BaseExpression) -> int | None:
        """How many positions `range(start, stop)` visits, when both are numbers the code
        shows (literals, or names bound only to literals)."""
        first = 0 if start is None else self._integer(start)
        last = self._integer(stop)
        return None if first is None or last is None else last - first

    def _integer(self, expr: cst.BaseExpression) -> int | None:
        if isinstance(expr, cst.Integer):
            return int(expr.value, 0)
        if isinstance(expr, cst.Name):
            values = self.context.bindings.values(expr)
            found = {int(v.value, 0) for v in values or () if isinstance(v, cst.Integer)}
            if values and len(found) == 1 and len(values) == len([v for v in values if isinstance(v, cst.Integer)]):
                return found.pop()
        return None

    def _sliced(self, call: cst.Call, position: cst.Name):
        """((logits, offset), (targets, offset)) for `f(logits[:, t + k], targets[:, t + j])`."""
        plain = [arg for arg in call.args if arg.keyword is None]
        named = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
        if len(plain) >= 2:
            logits, targets = plain[0].value, plain[1].value
        else:
            logits = plain[0].value if plain else named.get("input")
            targets = named.get("target")
        if logits is None or targets is None:
            return None
        logits_part = _position_index(logits, position, allow_trailing_slice=True)
        targets_part = _position_index(targets, position, allow_trailing_slice=False)
        if logits_part is None or targets_part is None:
            return None
        return logits_part, targets_part

    def _loop_problem(self, node: cst.For, position: cst.Name, temporaries, statement, value, inlined, factor) -> str | None:
        accumulator = statement.target if isinstance(statement, cst.AugAssign) else statement.targets[0].target
        reads = [n.value for n in names_read(inlined)]
        if reads.count(position.value) != 2:
            return f"`{position.value}` is used for more than indexing the positions"
        if accumulator.value in reads:
            return f"each term reads `{accumulator.value}`"
        if factor is not None and not _is_constant(factor[1]):
            return "the factor applied to each term is not a plain name or number"
        direct_reads = [n.value for n in names_read(value)]
        for name, assign in temporaries.items():
            if direct_reads.count(name) != 1 or set(temporaries) & {n.value for n in names_read(assign.value)}:
                return f"`{name}` is not read once by the loss"
        for target in [position, *(assign.targets[0].target for assign in temporaries.values())]:
            if self._read_after_loop(node, target):
                return f"`{target.value}` is read after the loop, and the fix leaves it unbound"
        return None

    def _read_after_loop(self, node: cst.For, target: cst.Name) -> bool:
        scope = self.context.scopes.get(target)
        if scope is None:
            return True
        binding = [a for a in scope.assignments[target.value] if isinstance(a, Assignment) and a.node is target]
        if not binding:
            return True
        for access in binding[0].references:
            if not self.context.inside(access.node, node):
                return True
        return False

    # -- spelling ------------------------------------------------------------------





class _Loss:
    """What a cross-entropy call (or the module's constructor) says about its reduction."""

    def __init__(self) -> None:
        self.reduction = "mean"
        self.keywords: dict[str, str] = {}  # keyword -> source text, in the call's order
        self.keyword_nodes: dict[str, cst.BaseExpression] = {}
        self.module: cst.BaseExpression | None = None
        self.problem: str | None = None


def _loss_arguments(module: cst.Module, call: cst.Call, first_keyword_position: int) -> _Loss:
    loss = _Loss()
    positional = [arg for arg in call.args if arg.keyword is None]
    if len(positional) > first_keyword_position or any(arg.star for arg in call.args):
        loss.problem = "arguments passed by position or unpacked (weight, ignore_index ...) are not followed"
        return loss
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value in ("input", "target"):
            continue
        name = arg.keyword.value
        if name not in KNOWN_KEYWORDS:
            loss.problem = f"`{name}=` is not understood by the fix"
            return loss
        loss.keywords[name] = module.code_for_node(arg.value)
        loss.keyword_nodes[name] = arg.value
    reduction = loss.keyword_nodes.get("reduction")
    if reduction is not None:
        if not isinstance(reduction, cst.SimpleString) or reduction.evaluated_value not in ("mean", "sum", "none"):
            loss.problem = "its reduction is not a literal"
            return loss
        loss.reduction = reduction.evaluated_value
    if loss.reduction == "none":
        loss.problem = 'reduction="none" adds per-sample losses element-wise'
    elif loss.reduction == "mean" and "weight" in loss.keywords:
        loss.problem = "with class weights each position's mean divides by its own sum of weights"
    return loss


def _position_index(expr: cst.BaseExpression, position: cst.Name, allow_trailing_slice: bool):
    """(base, offset) for `base[:, t + offset]` (and `base[:, t + offset, :]` when allowed)."""
    if not isinstance(expr, cst.Subscript) or not isinstance(expr.value, (cst.Name, cst.Attribute)):
        return None
    elements = list(expr.slice)
    if len(elements) == 3 and allow_trailing_slice and m.matches(elements[2], FULL_SLICE):
        elements = elements[:2]
    if len(elements) != 2 or not m.matches(elements[0], FULL_SLICE) or not isinstance(elements[1].slice, cst.Index):
        return None
    index = elements[1].slice.value
    t = m.Name(position.value)
    length = m.Name() | m.Attribute()
    if m.matches(index, t):
        offset = 0
    elif m.matches(index, m.BinaryOperation(left=t, operator=m.Add() | m.Subtract(), right=m.Integer())):
        offset = int(index.right.value) * (1 if isinstance(index.operator, cst.Add) else -1)
    elif m.matches(index, m.BinaryOperation(left=m.UnaryOperation(operator=m.Minus(), expression=length), operator=m.Add(), right=t)):
        offset = FromEnd(cst.Module([]).code_for_node(index.left.expression))  # `-K + t`
    elif m.matches(index, m.BinaryOperation(left=t, operator=m.Subtract(), right=length)):
        offset = FromEnd(cst.Module([]).code_for_node(index.right))  # `t - K`
    else:
        return None
    if position.value in {n.value for n in names_read(expr.value)}:
        return None
    return expr.value, offset


@dataclass(frozen=True)
class FromEnd:
    """The offset `-K` of `logits[:, t - K]` with `t` in `range(K)`: the last K positions."""

    length: str  # K, as the code spells it


def _slice(start: cst.BaseExpression | None, stop: cst.BaseExpression, offset: "int | FromEnd",
           base: str, count: int | None) -> str | None:
    """`start + offset:stop + offset`, folded where the bounds are literals; None when
    the lower bound could be negative (the loop would index from the end there).
    `count` is the number of positions when the bounds are known numbers."""
    if isinstance(offset, FromEnd):
        # t - K for t in range(s, K): positions s - K ... -1, up to the end of the sequence
        code = cst.Module([]).code_for_node
        if code(stop) != offset.length or not (start is None or isinstance(start, cst.Integer)):
            return None
        first = int(start.value, 0) if start is not None else 0
        if count is not None and count >= 1:
            return f"-{offset.length}:" if first == 0 else f"{first} - {offset.length}:"
        # K may be 0 (or no more than s): the loop adds nothing, while `[-0:]` is every
        # position. Counted from the length, the slice is empty then.
        return f"{base}.size(1) - {offset.length}{f' + {first}' if first else ''}:"
    first = _shifted(start if start is not None else cst.Integer("0"), offset, lower=True)
    if first is None:
        return None
    return f"{'' if first == '0' else first}:{_shifted(stop, offset, lower=False)}"


def _shifted(bound: cst.BaseExpression, offset: int, lower: bool) -> str | None:
    if isinstance(bound, cst.Integer):
        value = int(bound.value, 0) + offset
        return str(value) if value >= 0 or not lower else None
    if offset < 0 and lower:
        return None
    text = cst.Module([]).code_for_node(bound)
    if not isinstance(bound, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        text = f"({text})"
    if offset == 0:
        return text
    return f"{text} + {offset}" if offset > 0 else f"{text} - {-offset}"


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


def _is_constant(expr: cst.BaseExpression) -> bool:
    """A number, or a name or attribute read once: the same in every iteration."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.Name):
        return True
    return isinstance(expr, cst.Attribute) and _is_constant(expr.value)





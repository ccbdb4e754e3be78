"""Loops over the samples of a batch, and what their body computes run once on the batch.

Research code often runs a model on one sample at a time, `for i in range(len(x)):
loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1]); loss.backward()`. This analysis
says which loops do, and reads each statement of such a body as a per-sample value
with a layout:

- INV: the same for every sample (a number, a module, an option);
- ROW: one sample without a batch dimension (`x[i]`, `row[1:]`, `out.squeeze(0)`);
- ONE: one sample with a batch dimension of 1 (`x[i:i+1]`, `x[i].unsqueeze(0)`,
  `row[None]`, the output of a model called on one);
- FLAT: a batch of one flattened into its first dimension (`out.view(-1, V)`);
- SUM, MEAN, COUNTED: a number per sample whose batched value is the sum over the
  samples (`reduction="sum"`, `.sum()`, `.numel()`), the mean of equally sized samples
  (an element-wise mean: the batch's mean times B is the sum), or a cross-entropy mean
  that divides each sample by its own count of targets (kept per sample);
- MODEL_TUPLE: a model's output unpacked into names.

A backward per sample adds B gradients up, so the batched loss must be the sum of the
per-sample losses: the reading follows the loss's reduction (from the torch table),
the scale applied per sample (`loss / len(x)`), what the loop adds up (`total +=
loss.item()`), the functions of the file that compute a loss or run a sample's step,
and whether the model treats every sample on its own (`sample_mixing`).

- `over_samples(loop)`: the SampleLoop a `for` iterates over (`range(len(x))`,
  `range(x.size(0))`, `enumerate(x)`, `zip(x, y)`, `x.split(1)`, a name bound to a
  batch size), or None when it visits something else; `SampleLoop.problem` says why a
  loop over samples can never be batched (a Python list of examples).
- `sequential(loop)`: why the samples must run in order (state one hands the next
  through the model, a gradient taken per sample), or None.
- `steps_optimizer(node)`: does running `node` step an optimizer or reset gradients,
  itself or through the functions of this file it calls?
- `collected_losses(loop)`: a loop that appends each sample's loss to a list stacked
  or summed after it.
- `batched(loop, sample_loop, collected)`: the BatchedBody (rewrites of the body's
  expressions and statements, imports) that make the body compute, once, what the
  loop computed over every sample; raises NotBatchable with the reason otherwise.
- `is_loss(call)`, `loss_call(call)`, `may_be_model(func)`, `batch_of_size(expr, less)`,
  `is_python_sequence(expr)`: the facts the reading rests on.

Built once per file (FileContext.shared).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import takewhile
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import Assignment

from codemod.analysis import match as m
from codemod.analysis.local_calls import local_calls
from codemod.analysis.loop_totals import collected_list
from codemod.analysis.loops import own_nodes
from codemod.analysis.names import atom, integer_value, kwarg, method_name, names_read, number_value
from codemod.analysis.project import project_of
from codemod.analysis.sample_mixing import sample_mixing
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.torch_facts import (
    ALL_LOSS_FUNCTIONS,
    FUNCTIONAL,
    FUNCTIONAL_PARAMETERS,
    LOSS_FUNCTIONS,
    LOSS_MODULES,
    LOSSES,
    ONE_OPERAND_FUNCTIONS,
    ONE_OPERAND_METHODS,
    TOTALS,
    functional_alias,
    is_literal,
)
from codemod.analysis.values import number_is

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "sample_loops"
LINE_LENGTH = 100  # a longer batched loss line is split after the per-sample sums
MAX_DEPTH = 6
# `loss.backward()`, or `(loss / k).backward()`: a scale the rewrite keeps as it is
BACKWARD = m.Expr(
    value=m.Call(
        func=m.Attribute(
            value=m.Name() | m.BinaryOperation(left=m.Name(), operator=m.Divide()), attr=m.Name("backward")
        ),
        args=[],
    )
)
INV, ROW, ONE, FLAT, SUM, MEAN, COUNTED, MODEL_TUPLE = "inv row one flat sum mean counted model-tuple".split()
# (the list, the call that reads it after the loop, the line `L = []`)
Collected = tuple[cst.Name, cst.Call, cst.SimpleStatementLine]


def sample_loops(context: FileContext) -> SampleLoops:
    return context.shared(KEY, SampleLoops)


@dataclass(frozen=True, eq=False)
class Rewrite:
    """`anchor` becomes `new` (a node, or a function of the updated node); the statement
    `anchor` goes when `new` is None."""

    anchor: cst.CSTNode
    new: cst.CSTNode | Callable[[cst.CSTNode], cst.CSTNode] | None

    def replacement(self, updated: cst.CSTNode) -> cst.CSTNode:
        return self.new(updated) if callable(self.new) else self.new


@dataclass
class BatchedBody:
    """What makes a per-sample loop's body compute, once, what it computed for every sample."""

    rewrites: list[Rewrite]  # of nodes of the body (and of the functions it calls, the list it fills)
    imports: list[tuple[str, str | None]]  # (module, name) the rewrites need


@dataclass
class SampleLoop:
    """What a per-sample loop iterates over."""

    index: str | None  # `i` of `for i in range(len(x))` or `enumerate(x)`
    count: str  # the batch size as text: `len(x)`, `x.size(0)`, `batch_size`
    rows: dict[str, tuple[str, str]] = field(default_factory=dict)  # `xi` -> (ROW or ONE, `x`)
    batches: list[cst.BaseExpression] = field(default_factory=list)  # tensors whose samples the loop visits
    problem: str | None = None  # why it is reported without a fix whatever its body


@dataclass
class LossCall:
    """A torch loss call: its reduction and the options it was given."""

    reduction: str  # "mean" or "sum"
    kind: str  # "cross_entropy", "MSELoss", ...
    options: dict[str, str]  # keyword -> source text, of the call or of the module's constructor
    function: str | None  # the functional spelling for a loss module (`F.cross_entropy`)
    imports: list[tuple[str, str | None]]
    counted: bool = False  # a mean over the targets that count (`ignore_index`), per the torch table
    ignore_index: int | None = None  # torch's default for the target that does not count


@dataclass
class PerSample:
    """What an expression of the loop body is for one sample (see _Batcher)."""

    kind: str
    origin: tuple = ()  # where a per-sample tensor comes from: element-wise operations need one origin
    sequence: bool = False  # a row sliced along its first dimension: at least one dimension
    loss: LossCall | None = None  # COUNTED: the loss
    call: cst.Call | None = None  # COUNTED: its call
    inline: tuple | None = None  # COUNTED through a function of this file: (function, the call of it)
    reduced: cst.Call | None = None  # SUM / MEAN: the reduction
    zero: bool = False  # INV: the number 0 (`total = 0.0` of a sum built up in a loss function)
    real: bool = False  # a floating-point tensor (a loss, a quotient): adding 0.0 changes nothing
    batch: cst.BaseExpression | None = None  # ROW / ONE read from a batch tensor (`y[i:i+1]`): that tensor
    single: bool = False  # COUNTED: one class target a sample, so each sample's mean is its loss


class NotBatchable(Exception):
    """Why a per-sample loop cannot be batched: the finding's message."""


class SampleLoops:
    """The loops of one file over the samples of a batch (see the module's docstring)."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        # id of a read -> whether its statement passes it to a model or a loss: the reads of a
        # name rebound in every piece of a long script are asked about from each of its loops
        self._read_feeds: dict[int, bool] = {}

    def batched(self, node: cst.For, loop: SampleLoop, collected: Collected | None = None) -> BatchedBody:
        """What the body of `node`, a loop over the samples `loop` describes, computes run
        once on the whole batch: the rewrites that make it do so. Raises NotBatchable with
        the reason when the batch would compute something else (or the analysis cannot tell)."""
        if loop.problem is not None:
            raise NotBatchable(loop.problem)
        rewrites, imports = _Batcher(self, node, loop, collected).edits()
        return BatchedBody(rewrites, imports)

    def sequential(self, node: cst.For) -> str | None:
        """Why the samples must run one after another, or None: state one sample hands the
        next through the model (`h = cell(x[i], h)`), or gradients taken per sample
        (`autograd.grad`, a MAML-style inner step per task)."""
        kinds, names = self.context.kinds, self.context.names
        code = self.context.module.code_for_node
        for call in self.context.index.find(cst.Call, within=node.body):
            if names.is_(call.func, "torch.autograd.grad"):
                return f"it takes a gradient per sample (`{code(call.func)}`)"
            if self.may_be_model(call.func):
                carried = [read for arg in call.args for read in kinds.carried_reads(node, arg)]
                if carried:
                    return f"`{carried[0].value}` is handed from one sample to the next through `{code(call.func)}`"
        return None

    def steps_optimizer(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """Does running `node` step an optimizer or reset gradients, itself or through the
        functions of this file it calls?"""
        calls = local_calls(self.context)
        for call in own_nodes(self.context.index, cst.Call, node):
            if method_name(call) in ("step", "zero_grad"):
                return True
            function = calls.callee(call) or self.context.kinds.partial_callee(call)
            if (
                function is not None
                and depth < MAX_DEPTH
                and function is not self.context.index.first_enclosing(node, cst.FunctionDef)
                and self.steps_optimizer(function.body, depth + 1)
            ):
                return True
        return False

    def over_samples(self, node: cst.For) -> SampleLoop | None:
        """What the loop iterates over, when it is the samples of a batch:
        `for i in range(len(x) | x.size(0) | x.shape[0] | batch_size)`,
        `for i, row in enumerate(x)`, `for row in x`, `for a, b in zip(x, y)`,
        `for a, b in zip(x.split(1), y.split(1))`."""
        if node.orelse is not None or node.asynchronous is not None:
            return None
        iterable, target = node.iter, node.target
        args = _plain_arguments(iterable)
        if args is not None:
            names = self.context.names
            if names.is_(iterable.func, "range", "builtins.range") and len(args) == 1 and isinstance(target, cst.Name):
                return self._range_loop(node.body, target.value, args[0])
            if names.is_(iterable.func, "enumerate", "builtins.enumerate") and len(args) == 1:
                return self._enumerate_loop(target, args[0])
            if names.is_(iterable.func, "zip", "builtins.zip") and args:
                return self._zip_loop(target, args)
        if isinstance(target, cst.Name) and isinstance(iterable, (cst.Name, cst.Attribute, cst.Call)):
            return self._rows_loop(None, [target], [iterable])
        return self._examples_loop(target, iterable)

    def _range_loop(self, body: cst.BaseSuite, index: str, count: cst.BaseExpression) -> SampleLoop | None:
        """`for i in range(count)`: over the samples when count is a batch's size, or the
        body takes rows by `i` (reported: the count is not visibly the batch's)."""
        code = self.context.module.code_for_node
        batch = self.batch_of_size(count) or self._rows_counted(body, index, count)
        if batch is not None:
            loop = SampleLoop(index, code(count), batches=[batch])
            if self.is_python_sequence(batch):
                loop.problem = _python_list(code(batch))
            return loop
        if self._indexes_rows(body, index):
            return SampleLoop(
                index,
                code(count),
                problem=f"the loop count `{code(count)}` is not visibly the batch size (`len(x)`, `x.size(0)`)",
            )
        return None

    def _enumerate_loop(self, target: cst.BaseAssignTargetExpression, rows: cst.BaseExpression) -> SampleLoop | None:
        """`for i, row in enumerate(x)`."""
        if not (
            isinstance(target, cst.Tuple)
            and len(target.elements) == 2
            and all(isinstance(e.value, cst.Name) for e in target.elements)
        ):
            return None
        index, row = target.elements[0].value.value, target.elements[1].value
        return self._rows_loop(index, [row], [rows])

    def _zip_loop(self, target: cst.BaseAssignTargetExpression, iterables: list) -> SampleLoop | None:
        """`for a, b in zip(x, y)`: one name for each tensor."""
        elements = target.elements if isinstance(target, (cst.Tuple, cst.List)) else None
        if (
            elements is None
            or len(elements) != len(iterables)
            or not all(isinstance(e.value, cst.Name) for e in elements)
        ):
            return None
        return self._rows_loop(None, [e.value for e in elements], iterables)

    def _examples_loop(self, target: cst.BaseAssignTargetExpression, iterable: cst.BaseExpression) -> SampleLoop | None:
        """`for prompt, answer in batch`: examples of a sequence, each unpacked, fed to the
        model (reported: they may differ in shape)."""
        if not (
            isinstance(target, (cst.Tuple, cst.List))
            and isinstance(iterable, (cst.Name, cst.Attribute))
            and all(isinstance(e.value, cst.Name) for e in target.elements)
        ):
            return None
        if not self._feeds_model([e.value for e in target.elements]):
            return None
        code = self.context.module.code_for_node
        kind = "a Python list or tuple" if self.is_python_sequence(iterable) else "a sequence"
        return SampleLoop(
            None,
            f"len({code(iterable)})",
            batches=[iterable],
            problem=(
                f"`{code(iterable)}` is {kind} of examples, each unpacked: they may differ in shape, and the model "
                "cannot take them as one batch; collate them into tensors (padded) first"
            ),
        )

    def _rows_loop(
        self, index: str | None, targets: list[cst.Name], iterables: list[cst.BaseExpression]
    ) -> SampleLoop | None:
        """Rows of tensors (`for a, b in zip(x, y)`), or batches of one (`x.split(1)`)."""
        code = self.context.module.code_for_node
        rows: dict[str, tuple[str, str]] = {}
        batches = []
        for target, iterable in zip(targets, iterables):
            one = _split_of_one(iterable)
            source = one if one is not None else iterable
            if not isinstance(source, (cst.Name, cst.Attribute)):
                return None
            rows[target.value] = (ONE if one is not None else ROW, code(source))
            batches.append(source)
        loop = SampleLoop(index, f"len({code(batches[0])})", rows, batches)
        for batch in batches:
            if self.is_python_sequence(batch):
                loop.problem = _python_list(code(batch))
        if loop.problem is None and not self._feeds_model(targets):
            return None  # a loop over something else (layers, parameters, files)
        return loop

    def _feeds_model(self, targets: list[cst.Name]) -> bool:
        """Does any read of the loop's rows reach a model call (or a loss)?"""
        if any(self._read_feeds_model(read) for target in targets for read in self._reads(target)):
            return True
        return self._later_fed(targets)

    def _read_feeds_model(self, read: cst.Name) -> bool:
        """Is `read` inside a model call (or a loss) of its statement?"""
        found = self._read_feeds.get(id(read))
        if found is None:
            found = self._read_feeds[id(read)] = any(
                isinstance(ancestor, cst.Call) and (self.may_be_model(ancestor.func) or self.is_loss(ancestor))
                for ancestor in takewhile(
                    lambda node: not isinstance(node, cst.BaseStatement), self.context.index.ancestors(read)
                )
            )
        return found

    def _later_fed(self, targets: list[cst.Name]) -> bool:
        """A row passed on through names assigned in the body (`ids, labels = build(prompt)`)."""
        return any(
            isinstance(self.context.index.statement_of(read), cst.SimpleStatementLine)
            and isinstance(self.context.index.statement_of(read).body[0], cst.Assign)
            for target in targets
            for read in self._reads(target)
        )

    def _reads(self, target: cst.Name) -> list[cst.Name]:
        scope = self.context.scopes.get(target)
        if scope is None:
            return []
        return [
            access.node
            for a in scope.assignments[target.value]
            if isinstance(a, Assignment) and a.node is target
            for access in a.references
        ]

    def _rows_counted(self, body: cst.CSTNode, index: str, count: cst.BaseExpression) -> cst.Name | None:
        """The tensor whose rows the body takes by the loop variable (`batch[i]`,
        `x[i:i + 1]`) when the loop counts exactly its rows: `range(BATCH)` over
        `batch = torch.randint(0, V, (BATCH, T))`, the sizes known to be the same."""
        shapes = layouts(self.context)
        for subscript in own_nodes(self.context.index, cst.Subscript, body):
            if not isinstance(subscript.value, cst.Name) or len(subscript.slice) != 1:
                continue
            taken = subscript.slice[0].slice
            if not (
                isinstance(taken, cst.Index)
                and m.matches(taken.value, m.Name(index))
                or isinstance(taken, cst.Slice)
                and m.matches(taken.lower, m.Name(index))
            ):
                continue
            if shapes.same_size(shapes.leading_size(subscript.value), count):
                return subscript.value
        return None

    def _indexes_rows(self, body: cst.CSTNode, index: str) -> bool:
        """Does the body take samples by the loop variable (`x[i]`) and make batches of one
        of them, or run the model with per-sample parameters (MAML)?"""
        index_nodes = own_nodes(self.context.index, cst.Subscript, body)
        indexed = [
            s
            for s in index_nodes
            if isinstance(s.slice[0].slice, cst.Index) and m.matches(s.slice[0].slice.value, m.Name(index))
        ]
        if not indexed:
            return False
        if any(
            self.context.names.startswith(c.func, FUNCTIONAL_PARAMETERS)
            for c in own_nodes(self.context.index, cst.Call, body)
        ):
            return True
        for subscript in indexed:
            parent = self.context.parents.get(subscript)
            outer = self.context.parents.get(parent)
            if (
                isinstance(parent, cst.Attribute)
                and parent.attr.value in ("unsqueeze", "view", "reshape")
                and isinstance(outer, cst.Call)
            ):
                return True
        return any(m.matches(s.slice[0].slice, m.Slice(lower=m.Name(index))) for s in index_nodes)

    def batch_of_size(self, expr: cst.BaseExpression, less: bool = False, depth: int = 0) -> cst.BaseExpression | None:
        """`x` for `len(x)`, `x.size(0)`, `x.shape[0]`, or a name bound only to one of those
        (through a few names); with `less`, also for that size less something (`len(x) - k`,
        the bound of a loop over batches that leaves the last one out)."""
        if depth > 3:
            return None
        if less and isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Subtract):
            return self.batch_of_size(expr.left, less, depth + 1)
        zero = number_is(self.context, 0)
        if (
            isinstance(expr, cst.Call)
            and self.context.names.is_(expr.func, "len", "builtins.len")
            and len(expr.args) == 1
            and expr.args[0].keyword is None
        ):
            batch = expr.args[0].value
        elif m.matches(
            expr,
            m.Call(
                func=m.Attribute(attr=m.Name("size")),
                args=[m.Arg(value=zero, keyword=None) | m.Arg(value=zero, keyword=m.Name("dim"))],
            ),
        ):
            batch = expr.func.value
        elif m.matches(
            expr,
            m.Subscript(value=m.Attribute(attr=m.Name("shape")), slice=[m.SubscriptElement(slice=m.Index(value=zero))]),
        ):
            batch = expr.value.value
        elif isinstance(expr, cst.Name):
            values = self.context.bindings.values(expr)
            return self.batch_of_size(values[0], less, depth + 1) if values and len(values) == 1 else None
        else:
            return None
        return batch if isinstance(batch, (cst.Name, cst.Attribute)) else None

    def is_python_sequence(self, batch: cst.BaseExpression) -> bool:
        """Is `batch` bound to a Python list or tuple held in memory (`[...]`, a comprehension,
        `list(...)`, `random.sample(...)`, a function of this file that returns one: see
        `kinds.in_memory_list`), or to a generator of examples?"""
        values = self.context.kinds.bound_values(batch) or []
        kinds = self.context.kinds
        return any(isinstance(v, cst.GeneratorExp) or kinds.in_memory_list(v) for v in values)

    def collected_losses(self, node: cst.For) -> Collected | None:
        """(L, its use) for a loop without backward that ends `L.append(<loss>)`, with
        `L = []` right before it and `torch.stack(L)` / `sum(L)` its one use after; None
        where autograd records no graph (`@torch.no_grad()`): those losses are scores, and
        no backward runs through them."""
        if not isinstance(node.body, cst.IndentedBlock) or not node.body.body:
            return None
        if self.context.training.records_no_graph(node):
            return None
        last = node.body.body[-1]
        if not (
            isinstance(last, cst.SimpleStatementLine)
            and len(last.body) == 1
            and m.matches(
                last.body[0],
                m.Expr(
                    value=m.Call(
                        func=m.Attribute(value=m.Name(), attr=m.Name("append")), args=[m.Arg(keyword=None, star="")]
                    )
                ),
            )
        ):
            return None
        collected = collected_list(self.context, node, last.body[0].value.func.value)
        if collected.problem is not None:
            return None
        return collected.name, collected.call, collected.line

    # -- what the loop calls -------------------------------------------------------------

    def is_loss(self, call: cst.Call) -> bool:
        return (
            bool(self.context.names.of(call.func) & LOSS_FUNCTIONS) or self._module_constructor(call.func) is not None
        )

    def loss_call(self, call: cst.Call) -> LossCall:
        """What a known loss call reduces by; raises when its options are unclear."""
        code = self.context.module.code_for_node
        names = self.context.names.of(call.func)
        if names & LOSS_FUNCTIONS:
            qualified = min(names & LOSS_FUNCTIONS)
            options, kind, function = call, qualified.rsplit(".", 1)[1], None
            extra_positional = len([a for a in call.args if a.keyword is None]) > 2
        else:
            constructor = self._module_constructor(call.func)
            qualified = min(self.context.names.of(constructor.func) & LOSS_MODULES)
            options, kind = constructor, qualified.rsplit(".", 1)[1]
            extra_positional = any(a.keyword is None for a in constructor.args)
            if any(a.keyword is not None for a in call.args):
                raise NotBatchable("the loss module is called with keyword arguments")
            function = f"{functional_alias(self.context.module) or FUNCTIONAL}.{LOSSES[qualified].functional}"
        if (
            extra_positional
            or any(a.star for a in options.args)
            or kwarg(options, "size_average")
            or kwarg(options, "reduce")
        ):
            raise NotBatchable("the loss's options are passed by position or unpacked")
        reduction = kwarg(options, "reduction")
        value = LOSSES[qualified].reduction  # torch's default
        if reduction is not None:
            if not isinstance(reduction.value, cst.SimpleString) or reduction.value.evaluated_value not in (
                "mean",
                "sum",
                "none",
            ):
                raise NotBatchable('the loss\'s reduction is not a literal "mean", "sum" or "none"')
            value = reduction.value.evaluated_value
        counted = LOSSES[qualified].counted
        if value == "mean" and counted and kwarg(options, "weight") is not None:
            raise NotBatchable("with class weights each sample's mean divides by its own sum of weights")
        texts = {a.keyword.value: code(a.value) for a in options.args if a.keyword is not None}
        imports: list[tuple[str, str | None]] = []
        if function is not None and value == "mean" and counted:
            for keyword, arg in ((a.keyword.value, a.value) for a in options.args if a.keyword is not None):
                if not is_literal(arg):  # read back from the module: `criterion.ignore_index`
                    texts[keyword] = f"{code(call.func)}.{keyword}"
            if functional_alias(self.context.module) is None:
                imports.append((FUNCTIONAL, None))
        return LossCall(value, kind, texts, function, imports, counted, LOSSES[qualified].ignore_index)

    def _module_constructor(self, func: cst.BaseExpression) -> cst.Call | None:
        values = self.context.kinds.bound_values(func)
        if values is None or len(values) != 1 or not isinstance(values[0], cst.Call):
            return None
        return values[0] if self.context.names.of(values[0].func) & LOSS_MODULES else None

    def may_be_model(self, func: cst.BaseExpression) -> bool:
        """A model, or a callable of this file that is not a loss (a model the analysis
        cannot place, `Encoder()` from another package): `sample_mixing` says which."""
        if self.context.training.is_model(func):
            return True
        if isinstance(func, cst.Attribute) and sample_mixing(self.context).builds_module(func):
            return True  # `self.model`, set from a parameter every caller passes a model to
        return (
            isinstance(func, cst.Name)
            and not self.context.names.of(func)
            and self.context.bindings.local_function(func) is None
            and self._module_constructor(func) is None
        )


# -- the batched body --------------------------------------------------------------------


class _Batcher:
    """Works out what each statement of a per-sample loop computes per sample, and
    the edits that make it compute the same for the whole batch.

    Every value has a layout: INV (the same for every sample), ROW (one sample,
    without a batch dimension: `x[i]`), ONE (one sample with a batch dimension
    of 1: `x[i:i+1]`, a model's output), FLAT (a batch of one flattened into its
    first dimension: `out.view(-1, V)`), or a per-sample number: SUM (the batched
    value is the sum over the samples), MEAN (the batched value is the mean of
    equally sized samples) or COUNTED (a cross-entropy mean that divides each
    sample by its own count of targets)."""

    def __init__(self, loops: SampleLoops, node: cst.For, loop: SampleLoop, collected) -> None:
        self.loops = loops
        self.context = loops.context
        self.node = node
        self.loop = loop
        self.collected = collected
        self.env: dict[str, PerSample] = {
            name: PerSample(kind, origin=("data", text)) for name, (kind, text) in loop.rows.items()
        }
        self.list_edits: list = []
        self.found: list = []  # edits
        self.imports: list[tuple[str, str | None]] = []
        self.samples = set(loop.rows) | ({loop.index} if loop.index else set())
        self.model_calls = 0
        self.collect = True
        self.inlining = 0
        self.accumulators: set[str] = set()  # `total` of `total += loss.item()`
        self.function_names: set[str] = set()  # the parameters and locals of a loss function being read
        self.cosmetic: set[int] = set()  # edits that tidy a function written out, needed by no batch
        self.step_helpers = 0  # calls of a function that runs a sample's forward and backward

    def code(self, node: cst.CSTNode) -> str:
        return self.context.module.code_for_node(node)

    def edit(self, node: cst.CSTNode, new) -> None:
        if self.collect:
            self.found.append(Rewrite(node, new))

    def edits(self):
        node, index = self.node, self.context.index
        for call in own_nodes(index, cst.Call, node.body):
            if self.context.names.startswith(call.func, FUNCTIONAL_PARAMETERS):
                raise NotBatchable(
                    f"it runs the model with per-sample functional parameters (`{self.code(call.func)}`, MAML-style)"
                )
        lines = node.body.body if isinstance(node.body, cst.IndentedBlock) else [node.body]
        for line in lines:
            if not isinstance(line, cst.SimpleStatementLine):
                test = getattr(line, "test", None)
                if test is not None and self.samples & {n.value for n in names_read(test)}:
                    raise NotBatchable("it branches on the values of a sample")
                raise NotBatchable(
                    "its body has a compound statement (`if`, `with`, `for`, `try`) the rule does not batch"
                )
            if len(line.body) != 1:
                raise NotBatchable("several statements on one line")
        statements = [line.body[0] for line in lines]
        self._statements(statements, self.collected)
        if self.collected is None and not any(m.matches(s, BACKWARD) for s in statements) and self.step_helpers != 1:
            raise NotBatchable("it does not end each sample with one plain `loss.backward()`")
        if self.model_calls == 0:
            raise NotBatchable("it does not call the model on the sample")
        self._check_not_read_after(statements)
        return [*self.found, *self.list_edits], self.imports

    def _statements(self, statements, collected) -> None:
        """Batch the statements of one sample: of the loop's body, or of a function of
        the file the loop calls per sample that runs the backward itself."""
        backward_at, helper = self._backward_at(statements, collected)
        backward = backward_at[0] if backward_at else None
        loss_name = self._backward_loss_name(statements[backward]) if backward is not None else None
        bound_here = self._bound_names(statements)
        division = self._division(statements, loss_name, backward_at)
        loss_statement = None
        for position, statement in enumerate(statements):
            if position == backward or statement is division or self._accumulates(statement, bound_here):
                continue
            if collected is not None and position == len(statements) - 1:
                self._collect(statement)
                continue
            if helper and self._keeps_helper_result(statement):
                continue
            target = self._assignment_target(statement)
            if loss_name is not None and m.matches(target, m.Name(loss_name)):
                if loss_statement is not None or (backward is not None and position > backward):
                    raise NotBatchable(f"`{self.code(statement).strip()}` runs once per sample")
                loss_statement = statement
                self._loss_statement(statement, division)
                continue
            self._bind(target, self.value(statement.value), statement)
        self._check_loss_computed(loss_name, loss_statement, division)

    def _backward_at(self, statements, collected) -> tuple[list[int], bool]:
        """Where the statements run a plain `loss.backward()`, and whether they run a sample's
        step through a function of the file instead; raises when they do neither (and do not
        collect the losses)."""
        backward_at = [i for i, s in enumerate(statements) if m.matches(s, BACKWARD)]
        helper = collected is None and not backward_at and self._calls_step_helper(statements)
        if collected is None and len(backward_at) != 1 and not helper:
            raise NotBatchable("it does not end each sample with one plain `loss.backward()`")
        return backward_at, helper

    def _check_loss_computed(self, loss_name: str | None, loss_statement, division) -> None:
        """The loss the backward reads is computed in the body, before it is divided."""
        if loss_name is not None and loss_statement is None:
            raise NotBatchable(f"`{loss_name}` is not computed in the loop")
        if division is not None and self.context.index.before(division, loss_statement):
            raise NotBatchable(f"`{self.code(division).strip()}` runs once per sample")

    def _backward_loss_name(self, backward: cst.Expr) -> str:
        """`loss` of `loss.backward()` or `(loss / k).backward()`, k read from no sample."""
        backward_of = backward.value.func.value
        if isinstance(backward_of, cst.BinaryOperation):
            if self.samples & {n.value for n in names_read(backward_of.right)}:
                raise NotBatchable("the loss is divided by something of the sample")
            backward_of = backward_of.left
        return backward_of.value

    def _assignment_target(self, statement) -> cst.BaseAssignTargetExpression:
        """The one target of `statement`, an assignment that reads no value of the sample
        before (raises otherwise)."""
        if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
            raise NotBatchable(f"`{self.code(statement).strip()}` runs once per sample")
        carried = self.context.kinds.carried_reads(self.node, statement.value)
        if carried:  # `ema = 0.9 * ema + model(x[i:i + 1])`: each sample reads the one before
            raise NotBatchable(
                f"`{carried[0].value}` is handed from one sample to the next "
                f"(`{self.code(statement).strip()}`): the samples run in order"
            )
        return statement.targets[0].target

    def _keeps_helper_result(self, statement) -> bool:
        """`train_step(model, x[i:i + 1], y[i:i + 1])` with its result unused: batched, True.
        Raises where the result is kept per sample (`metrics[i] = train_step(...)`,
        `metrics.append(...)`): batched, one call gives one result for the whole batch."""
        calls = [
            call
            for call in own_nodes(self.context.index, cst.Call, statement)
            if (function := local_calls(self.context).callee(call)) is not None and _step_helper_body(function)
        ]
        if not calls or (isinstance(statement, cst.Assign) and m.matches(statement.targets[0].target, m.Name())):
            return False
        if isinstance(statement, cst.Expr) and statement.value is calls[0]:
            if self.value(statement.value).kind in (SUM, INV) and self.step_helpers:
                return True
            raise NotBatchable(f"`{self.code(statement).strip()}` runs once per sample")
        if isinstance(statement, cst.AugAssign):
            return False
        raise NotBatchable(
            f"the result of `{self.code(calls[0].func)}` is kept for each sample (`{self.code(statement).strip()}`): "
            "batched, one call gives one result for the whole batch"
        )

    def _calls_step_helper(self, statements) -> bool:
        return any(
            _step_helper_body(function) is not None
            for statement in statements
            for call in own_nodes(self.context.index, cst.Call, statement)
            if (function := local_calls(self.context).callee(call)) is not None
        )

    # -- statements --------------------------------------------------------------------

    def _bound_names(self, statements) -> dict[str, int]:
        """How many statements of the body bind each name."""
        counts: dict[str, int] = {}
        for statement in statements:
            targets = []
            if isinstance(statement, cst.Assign):
                for target in statement.targets:
                    targets += _names_of(target.target)
            elif isinstance(statement, cst.AugAssign):
                targets += _names_of(statement.target)
            for name in targets:
                counts[name] = counts.get(name, 0) + 1
        return counts

    def _bind(self, target: cst.BaseExpression, value: PerSample, statement) -> None:
        if isinstance(target, cst.Name):
            if target.value in self.samples:
                raise NotBatchable(f"`{target.value}` is rebound in the loop")
            self.env[target.value] = value
            return
        if isinstance(target, (cst.Tuple, cst.List)) and value.kind == MODEL_TUPLE:
            for element in target.elements:
                if not isinstance(element.value, cst.Name):
                    raise NotBatchable(f"`{self.code(statement).strip()}` unpacks into something other than names")
                self.env[element.value.value] = PerSample(ONE, origin=value.origin + (element.value.value,))
            return
        raise NotBatchable(f"`{self.code(statement).strip()}` runs once per sample")

    def _divides_loss(self, statement, loss_name: str) -> bool:
        """`loss = loss / d` or `loss /= d`."""
        if m.matches(statement, m.AugAssign(target=m.Name(loss_name), operator=m.DivideAssign())):
            return True
        return m.matches(
            statement,
            m.Assign(
                targets=[m.AssignTarget(target=m.Name(loss_name))],
                value=m.BinaryOperation(left=m.Name(loss_name), operator=m.Divide()),
            ),
        )

    def _accumulates(self, statement, bound_here: dict[str, int]) -> bool:
        """`total += g` / `total = total + g` with g a per-sample number whose sum over
        the samples is its batched value (the loss itself, a `.sum()`, a `.numel()`)."""
        if isinstance(statement, cst.AugAssign) and isinstance(statement.operator, cst.AddAssign):
            target, added = statement.target, statement.value
        elif m.matches(
            statement, m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.BinaryOperation(operator=m.Add()))
        ) and m.matches(statement.value.left, m.Name(statement.targets[0].target.value)):
            target, added = statement.targets[0].target, statement.value.right
        else:
            return False
        if not isinstance(target, cst.Name) or bound_here.get(target.value, 0) != 1 or target.value in self.env:
            return False
        value = self.value(added)
        if value.kind != SUM:
            raise NotBatchable(f"`{self.code(statement).strip()}` runs once per sample")
        self.accumulators.add(target.value)
        return True

    def _division(self, statements, loss_name: str | None, backward_at: list[int]):
        """The statement `loss /= d` (or `loss = loss / d`) before the backward, if any."""
        if loss_name is None:
            return None
        found = [
            s
            for i, s in enumerate(statements)
            if (not backward_at or i < backward_at[0]) and self._divides_loss(s, loss_name)
        ]
        if len(found) > 1:
            raise NotBatchable(f"`{loss_name}` is divided twice")
        if found and self.samples & {n.value for n in names_read(found[0].value)}:
            raise NotBatchable("the loss is divided by something of the sample")
        return found[0] if found else None

    def _loss_statement(self, statement: cst.Assign, division) -> None:
        """`loss = <value>`: the batched loss is the sum of the per-sample losses."""
        value = self.value(statement.value)
        expr = statement.value
        divided = isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Divide)
        if divided and division is not None:
            raise NotBatchable(f"`{statement.targets[0].target.value}` is divided twice")
        divisor = division.value if isinstance(division, cst.AugAssign) else division.value.right if division else None
        cancels = (divided and self._is_batch_size(expr.right)) or (
            divisor is not None and self._is_batch_size(divisor)
        )
        if value.kind == SUM:
            pass  # the sum over the batch is the sum of the per-sample sums
        elif value.kind == COUNTED:
            # Each sample's mean divides by its own count of targets that are not ignored:
            # keep those means, and add them up (or average them, for `loss / len(x)`).
            self._counted(value, "mean" if cancels else "sum")
            if cancels and divided:
                self.edit(expr, lambda updated: updated.left)
        elif value.kind == MEAN:
            if not cancels:
                # an element-wise mean: every sample has as many elements, so the batch mean times B
                target = expr.left if divided else expr
                count = self.loop.count
                self.edit(
                    target,
                    lambda updated: cst.BinaryOperation(
                        _parenthesized(updated), cst.Multiply(), cst.parse_expression(count)
                    ),
                )
            elif divided:
                self.edit(expr, lambda updated: updated.left)  # the mean of the per-sample means
        else:
            raise NotBatchable("the loss is not a number per sample the rule can add up")
        if cancels and division is not None and value.kind in (COUNTED, MEAN):
            self.found.append(Rewrite(self.context.parents[division], None))
        self.env[statement.targets[0].target.value] = PerSample(SUM, origin=("loss",))

    def _counted(self, value: PerSample, reduce: str, column: int | None = None) -> None:
        """The per-sample means of a cross-entropy (or NLL) mean, summed or averaged."""
        loss = value.loss
        count = self.loop.count
        anchor = value.inline[1] if value.inline is not None else value.call
        if column is None:
            statement = self.context.index.statement_of(anchor)
            column = self.context.positions[anchor].start.column - self.context.positions[statement].start.column

        def means(updated: cst.Call) -> cst.BaseExpression:
            return cst.parse_expression(_per_sample_means(loss, updated, count, reduce, column, value.single))

        if value.inline is not None:
            function = value.inline[0]
            self.edit(anchor, lambda updated: means(cst.parse_expression(self._inlined(function, updated))))
        else:
            self.edit(anchor, means)
        self.imports += loss.imports

    def _collect(self, statement) -> None:
        """`L.append(<loss>)` of a loop without backward: L becomes the vector of the
        per-sample losses, and its `torch.stack(L)` / `sum(L)` after the loop reads it."""
        name, use, line = self.collected
        if not (isinstance(statement, cst.Expr) and self.context.parents.get(statement) is not None):
            raise NotBatchable(f"`{self.code(statement).strip()}` runs once per sample")
        value = self.value(statement.value.args[0].value)
        if value.kind != COUNTED:
            raise NotBatchable("the per-sample losses collected are not cross-entropy means the rule can batch")
        self._counted(value, "none", column=len(name.value) + 3)
        new_use = (
            cst.Name(name.value)
            if self.context.names.is_(use.func, "torch.stack")
            else cst.parse_expression(f"{name.value}.sum()")
        )
        target = name.value
        self.list_edits += [
            Rewrite(line, None),
            Rewrite(
                statement,
                lambda updated: cst.Assign(
                    targets=[cst.AssignTarget(cst.Name(target))], value=updated.value.args[0].value
                ),
            ),
            Rewrite(use, new_use),
        ]

    def _check_not_read_after(self, statements) -> None:
        """Names the loop binds for each sample must not be read after it."""
        node = self.node
        targets = [node.target] if isinstance(node.target, cst.Name) else [e.value for e in node.target.elements]
        for statement in statements:
            if isinstance(statement, cst.Assign):
                for target in statement.targets:
                    targets += [n for n in _name_nodes(target.target) if n.value not in self.accumulators]
        for target in targets:
            scope = self.context.scopes.get(target)
            if scope is None:
                continue
            for assignment in scope.assignments[target.value]:
                if not isinstance(assignment, Assignment) or assignment.node is not target:
                    continue
                if any(not self.context.inside(access.node, node) for access in assignment.references):
                    raise NotBatchable(
                        f"`{target.value}` is read after the loop, where it would hold the batch's value"
                    )

    def _is_batch_size(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` the loop's batch size, spelled any of the ways the loop reads?"""
        batch = self.loops.batch_of_size(expr)
        batches = {self.code(b) for b in self.loop.batches}
        if batch is not None and self.code(batch) in batches:
            return True
        return self.code(expr) == self.loop.count

    # -- expressions -------------------------------------------------------------------

    def value(self, expr: cst.BaseExpression) -> PerSample:
        """What `expr` is per sample; records the edits that batch it."""
        if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString, cst.Imaginary)):
            return PerSample(INV, zero=number_value(expr) == 0 and not isinstance(expr, cst.SimpleString))
        if isinstance(expr, cst.Name):
            return self._name(expr)
        if isinstance(expr, cst.Subscript):
            return self._subscript(expr)
        if isinstance(expr, cst.Attribute):
            return self._attribute(expr)
        if isinstance(expr, cst.Call):
            return self._call(expr)
        if isinstance(expr, cst.BinaryOperation):
            return self._binary(expr)
        if isinstance(expr, cst.UnaryOperation):
            inner = self.value(expr.expression)
            return inner if inner.kind != MODEL_TUPLE else self._reject(expr)
        if isinstance(expr, cst.Comparison):
            values = [self.value(expr.left)] + [self.value(c.comparator) for c in expr.comparisons]
            return self._elementwise(expr, values)
        if self._reads_sample(expr):
            return self._reject(expr)
        return PerSample(INV)

    def _reject(self, expr: cst.BaseExpression) -> PerSample:
        raise NotBatchable(f"`{self.code(expr)}` may mean something else for a batch than for one sample")

    def _reads_sample(self, expr: cst.BaseExpression) -> bool:
        reads = {n.value for n in names_read(expr)}
        return bool(reads & (self.samples | {k for k, v in self.env.items() if v.kind != INV}))

    def _name(self, expr: cst.Name) -> PerSample:
        if expr.value in self.function_names:  # a parameter or local of the loss function read
            return self.env.get(expr.value, PerSample(INV))
        if self.loop.index is not None and expr.value == self.loop.index:
            raise NotBatchable("a sample is used other than as a batch of one (`x[i:i+1]`, `x[i].unsqueeze(0)`)")
        if expr.value in self.loop.rows:
            kind, text = self.loop.rows[expr.value]
            self.edit(expr, cst.parse_expression(text))  # the row's name becomes the batch
            return self.env[expr.value]
        found = self.env.get(expr.value)
        return found if found is not None else PerSample(INV)

    def _attribute(self, expr: cst.Attribute) -> PerSample:
        inner = self.value(expr.value)
        if inner.kind == INV:
            return inner
        if inner.kind == ONE and expr.attr.value not in ("shape", "T", "mT", "data", "grad"):
            return PerSample(ONE, origin=inner.origin + ("." + expr.attr.value,))  # `out.logits`
        return self._reject(expr)

    def _subscript(self, expr: cst.Subscript) -> PerSample:
        elements = list(expr.slice)
        index = self.loop.index
        first = elements[0].slice
        if index is not None and index not in self.function_names and index in {n.value for n in names_read(first)}:
            return self._sample_access(expr, elements)
        for element in elements:
            if self._reads_sample(element):
                return self._reject(expr)
        base = self.value(expr.value)
        if base.kind == INV:
            return base
        origin = base.origin + (self.code(expr)[len(self.code(expr.value)) :],)
        leading = _leading(first)
        if base.kind == ROW:
            if leading == "none":  # `row[None]`, `row[None, 1:]`: a batch of one
                self.edit(expr, _drop_first if len(elements) == 1 else _first_full)
                return PerSample(ONE, origin=origin)
            if leading == "ellipsis":
                return PerSample(ROW, origin=origin, sequence=base.sequence)
            self.edit(expr, _prepend_full)  # `row[1:]` -> `batch[:, 1:]`
            return PerSample(ROW, origin=origin, sequence=base.sequence or leading == "slice")
        if base.kind == ONE:
            if leading in ("full", "ellipsis"):
                return PerSample(ONE, origin=origin)
            if leading == "zero":  # `out[0]`: the sample without its batch dimension
                self.edit(expr, _drop_first if len(elements) == 1 else _first_full)
                return PerSample(ROW, origin=origin)
            return self._reject(expr)
        if base.kind == FLAT and leading == "ellipsis":
            return base
        return self._reject(expr)

    def _sample_access(self, expr: cst.Subscript, elements) -> PerSample:
        """`x[i]` (a row), `x[i:i+1]` / `x[[i]]` (a batch of one), `x[i, ...]`, `x[i:i+1, ...]`."""
        index = self.loop.index
        first = elements[0].slice
        if self._reads_sample(expr.value) or any(self._reads_sample(e) for e in elements[1:]):
            return self._reject(expr)
        if self.loops.is_python_sequence(expr.value):
            raise NotBatchable(_python_list(self.code(expr.value)))
        origin = ("data", self.code(expr.value), len(elements))
        if isinstance(first, cst.Index) and m.matches(first.value, m.Name(index)):
            self.edit(expr, _drop_first if len(elements) == 1 else _first_full)
            return PerSample(ROW, origin=origin, batch=expr.value if len(elements) == 1 else None)
        one = m.matches(
            first,
            m.Slice(
                lower=m.Name(index),
                upper=m.BinaryOperation(left=m.Name(index), operator=m.Add(), right=number_is(self.context, 1)),
                step=None,
            ),
        ) or (
            isinstance(first, cst.Index) and m.matches(first.value, m.List(elements=[m.Element(value=m.Name(index))]))
        )
        if one:
            self.edit(expr, _drop_first if len(elements) == 1 else _first_full)
            return PerSample(ONE, origin=origin, batch=expr.value if len(elements) == 1 else None)
        raise NotBatchable("a sample is used other than as a batch of one (`x[i:i+1]`, `x[i].unsqueeze(0)`)")

    def _call(self, call: cst.Call) -> PerSample:
        names = self.context.names.of(call.func)
        if self.loops.is_loss(call):
            return self._loss(call)
        if names & ONE_OPERAND_FUNCTIONS:
            values = [self.value(a.value) for a in call.args if a.keyword is None]
            if any(self._reads_sample(a.value) for a in call.args if a.keyword is not None):
                return self._reject(call)
            return self._elementwise(call, values)
        if names & TOTALS and len(call.args) == 1 and call.args[0].keyword is None:
            return self._reduced(call, self.value(call.args[0].value), min(names & TOTALS).rsplit(".", 1)[1])
        if names & {"builtins.float"} and len(call.args) == 1:
            inner = self.value(call.args[0].value)
            return inner if inner.kind in (SUM, MEAN, INV) else self._reject(call)
        if self.loops.may_be_model(call.func):
            return self._model_call(call)
        function = local_calls(self.context).callee(call)
        if function is not None and isinstance(call.func, cst.Name):
            return self._local_call(call, function)
        if isinstance(call.func, cst.Attribute):
            receiver = self.value(call.func.value)
            if receiver.kind != INV:
                return self._method(call, receiver)
        if any(self._reads_sample(a.value) for a in call.args) or self._reads_sample(call.func):
            return self._reject(call)
        return PerSample(INV)

    def _method(self, call: cst.Call, receiver: PerSample) -> PerSample:
        method = call.func.attr.value
        args = call.args
        kind = receiver.kind
        if method == "view_as" and len(args) == 1 and args[0].keyword is None and kind in (ROW, ONE, FLAT):
            return self._viewed_as(call, receiver)
        if method in ("sum", "mean") and kind == ONE and _over_first_dimension(args):
            # over a batch of one: the sample itself, without its batch dimension; for the
            # batch, every sample without the sum
            self.edit(call, lambda updated: updated.func.value)
            return PerSample(ROW, origin=receiver.origin, real=receiver.real or method == "mean")
        if any(self.value(arg.value).kind != INV for arg in args):  # `logits.size(-1)` is a number
            return self._reject(call)
        if kind in (SUM, MEAN, COUNTED, MODEL_TUPLE):
            return self._number_method(call, receiver)
        # past here the receiver is a per-sample tensor: ROW, ONE or FLAT
        if method in (ONE_OPERAND_METHODS - {"to", "type"}) or (method == "to" and args):
            origin = receiver.origin + ("." + method,)
            return PerSample(kind, origin=origin, sequence=receiver.sequence, real=receiver.real, batch=receiver.batch)
        layout_of = _LAYOUT_METHODS.get(method)
        return layout_of(self, call, receiver) if layout_of is not None else self._reject(call)

    def _viewed_as(self, call: cst.Call, receiver: PerSample) -> PerSample:
        """`e.view_as(t)`: the sample's elements laid out as another tensor of the sample's; for
        the batch, the batch's elements (in sample order, as every layout keeps them) as that
        tensor's."""
        shape = self.value(call.args[0].value)
        if shape.kind not in (ROW, ONE):
            return self._reject(call)
        return PerSample(shape.kind, origin=shape.origin, sequence=shape.sequence, real=receiver.real)

    def _number_method(self, call: cst.Call, receiver: PerSample) -> PerSample:
        """A method of a per-sample number (SUM, MEAN, COUNTED): a copy, a read or a move of
        it is the same number."""
        method = call.func.attr.value
        if receiver.kind != MODEL_TUPLE and (
            method in ("detach", "item", "float", "double", "cpu", "clone") or (method == "to" and call.args)
        ):
            return receiver
        return self._reject(call)

    def _unsqueezed(self, call: cst.Call, receiver: PerSample) -> PerSample:
        """`row.unsqueeze(0)`: a batch of one; for the batch, the batch."""
        if receiver.kind == ROW and len(call.args) == 1 and integer_value(call.args[0].value) == 0:
            self.edit(call, lambda updated: updated.func.value)
            return PerSample(ONE, origin=receiver.origin)
        return self._reject(call)

    def _squeezed(self, call: cst.Call, receiver: PerSample) -> PerSample:
        """`out.squeeze(0)` of a batch of one: the sample; for the batch, the batch."""
        if receiver.kind == ONE and len(call.args) == 1 and integer_value(call.args[0].value) == 0:
            self.edit(call, lambda updated: updated.func.value)
            return PerSample(ROW, origin=receiver.origin)
        return self._reject(call)

    def _viewed(self, call: cst.Call, receiver: PerSample) -> PerSample:
        """`row.view(1, -1)` (a batch of one: the batch viewed with its own size first), or
        `out.view(-1, V)` (flattened into the first dimension)."""
        args, kind = call.args, receiver.kind
        if not args or any(a.keyword is not None for a in args):
            return self._reject(call)
        leading = integer_value(args[0].value)
        if kind == ROW and leading == 1:  # `row.view(1, -1)` -> `batch.view(batch.size(0), -1)`
            self.edit(call, _view_batch)
            return PerSample(ONE, origin=receiver.origin + (self.code(call)[len(self.code(call.func.value)) :],))
        if leading == -1:
            if kind == ROW and len(args) != 1:
                return self._reject(call)  # `row.view(-1, V)`: the sample's first dimension merged with others
            return PerSample(FLAT, origin=receiver.origin + ("." + call.func.attr.value,))
        return self._reject(call)

    def _flattened(self, call: cst.Call, receiver: PerSample) -> PerSample:
        """`out.flatten()` / `out.flatten(0, 1)`: flattened into the first dimension; a
        flatten of the sample's own dimensions keeps the batch of one."""
        args, kind = call.args, receiver.kind
        if not args or (kind == ONE and [integer_value(a.value) for a in args] == [0, 1]):
            if kind in (ONE, FLAT) or (kind == ROW and not args):
                return PerSample(FLAT, origin=receiver.origin + (".flatten",))
            return self._reject(call)
        return self._own_dimensions_moved(call, receiver)

    def _own_dimensions_moved(self, call: cst.Call, receiver: PerSample) -> PerSample:
        """`out.transpose(1, 2)`, `out.flatten(1)` of a batch of one: dimensions of the sample's own."""
        if receiver.kind == ONE and call.args and _past_first_dimension(call.args):
            return PerSample(ONE, origin=receiver.origin + ("." + call.func.attr.value,), real=receiver.real)
        return self._reject(call)

    def _total(self, call: cst.Call, receiver: PerSample) -> PerSample:
        """`e.sum()` / `e.mean()` over every element of a per-sample tensor."""
        if not call.args:
            return self._reduced(call, receiver, call.func.attr.value)
        return self._reject(call)

    def _counted_elements(self, call: cst.Call, receiver: PerSample) -> PerSample:
        """`e.numel()` of a per-sample tensor: the batch's is the sum of the samples'."""
        if not call.args:
            return PerSample(SUM, origin=receiver.origin + (".numel",))
        return self._reject(call)

    def _sized(self, call: cst.Call, receiver: PerSample) -> PerSample:
        """`e.size(-1)`, or `out.size(1)` of a batch of one: a size other than the batch's."""
        args = call.args
        dim = integer_value(args[0].value) if args else None
        if len(args) == 1 and ((dim or 0) < 0 or (receiver.kind == ONE and (dim or 0) >= 1)):
            return PerSample(INV)
        return self._reject(call)

    def _reduced(self, call: cst.Call, inner: PerSample, how: str) -> PerSample:
        """`e.sum()` / `e.mean()` / `torch.sum(e)` of a per-sample tensor."""
        if inner.kind not in (ROW, ONE, FLAT):
            return self._reject(call)
        return PerSample(SUM if how == "sum" else MEAN, origin=inner.origin + (how,), reduced=call, real=inner.real)

    def _binary(self, expr: cst.BinaryOperation) -> PerSample:
        left, right = self.value(expr.left), self.value(expr.right)
        if left.kind == INV and right.kind == INV:
            return left
        if left.kind in (SUM, MEAN) or right.kind in (SUM, MEAN):
            return self._number_arithmetic(expr, left, right)
        if COUNTED in (left.kind, right.kind):
            return self._scaled_counted(expr, left, right)
        return self._elementwise(expr, [left, right])

    def _number_arithmetic(self, expr: cst.BinaryOperation, left: PerSample, right: PerSample) -> PerSample:
        """A per-sample number (SUM, MEAN) added to one of its kind, added to a starting 0,
        or scaled by a number."""
        operator = expr.operator
        if left.kind == right.kind and isinstance(operator, (cst.Add, cst.Subtract)):
            return PerSample(left.kind, origin=("sum",))
        if isinstance(operator, cst.Add) and {left.kind, right.kind} == {INV, SUM} and (left.zero or right.zero):
            return self._sum_from_zero(expr, left, right)
        if right.kind == INV and isinstance(operator, (cst.Multiply, cst.Divide)) and _is_scalar(expr.right):
            return PerSample(left.kind, origin=left.origin, real=left.real or isinstance(operator, cst.Divide))
        if left.kind == INV and isinstance(operator, cst.Multiply) and _is_scalar(expr.left):
            return right
        return self._reject(expr)

    def _sum_from_zero(self, expr: cst.BinaryOperation, left: PerSample, right: PerSample) -> PerSample:
        """`total = 0.0; total = total + part`: the batch's sum is 0 plus the sum of the parts;
        the 0 goes where adding it changes nothing (to a floating-point loss)."""
        summed = right if left.kind == INV else left
        if summed.real and self.inlining and self.collect:
            # only where the function is written out anyway (see _read_local_loss)
            drop = Rewrite(expr, lambda updated: updated.right if left.kind == INV else updated.left)
            self.found.append(drop)
            self.cosmetic.add(id(drop))
        return PerSample(SUM, origin=("sum",), real=summed.real)

    def _scaled_counted(self, expr: cst.BinaryOperation, left: PerSample, right: PerSample) -> PerSample:
        """A COUNTED loss scaled by a number: `loss * k`, `loss / k`, `k * loss`."""
        operator = expr.operator
        if (
            left.kind == COUNTED
            and right.kind == INV
            and isinstance(operator, (cst.Multiply, cst.Divide))
            and _is_scalar(expr.right)
        ):
            return left
        if right.kind == COUNTED and left.kind == INV and isinstance(operator, cst.Multiply) and _is_scalar(expr.left):
            return right
        return self._reject(expr)

    def _elementwise(self, expr: cst.BaseExpression, values: list[PerSample]) -> PerSample:
        """An element-wise operation: per-sample tensors of one origin (two outputs of
        the same model), with numbers."""
        tensors = [v for v in values if v.kind != INV]
        if not tensors:
            return PerSample(INV)
        kinds = {v.kind for v in tensors}
        if len(kinds) != 1 or kinds & {SUM, MEAN, COUNTED, MODEL_TUPLE}:
            return self._reject(expr)
        origins = {_shape_origin(v.origin) for v in tensors}
        if len(origins) != 1:
            return self._reject(expr)
        for operand in _operands(expr):
            if self.value_kind_is_inv(operand) and not _is_scalar(operand):
                return self._reject(expr)
        real = any(v.real for v in tensors) or (
            isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Divide)
        )
        return PerSample(tensors[0].kind, origin=tensors[0].origin + ("elementwise",), real=real)

    def value_kind_is_inv(self, expr: cst.BaseExpression) -> bool:
        return not self._reads_sample(expr)

    def _model_call(self, call: cst.Call) -> PerSample:
        values = []
        for arg in call.args:
            if arg.star:
                return self._reject(call)
            value = self.value(arg.value)
            if value.kind not in (ONE, ROW, INV):
                return self._reject(call)
            values.append(value)
        kinds = {v.kind for v in values} - {INV}
        if len(kinds) != 1:
            return self._reject(call)
        # A sample without its batch dimension (`model(seq[:-1])`): the batch adds one in
        # front, which gives each row what it gave alone when every layer counts dims from
        # the end; the output is then the sample's without its batch dimension too.
        unbatched = kinds == {ROW}
        parent = self.context.parents.get(call)
        unpacked = isinstance(parent, cst.Assign) and isinstance(parent.targets[0].target, (cst.Tuple, cst.List))
        if unbatched and unpacked:
            return self._reject(call)
        problem = sample_mixing(self.context).problem(call.func, unbatched)
        if problem is not None:
            raise NotBatchable(problem)
        self.model_calls += 1
        origin = ("model", self.code(call.func))
        if unpacked:
            return PerSample(MODEL_TUPLE, origin=origin)
        return PerSample(ROW if unbatched else ONE, origin=origin)

    def _loss(self, call: cst.Call) -> PerSample:
        loss = self.loops.loss_call(call)
        plain = [a for a in call.args if a.keyword is None]
        named = {a.keyword.value: a for a in call.args if a.keyword is not None}
        inputs = plain[0] if plain else named.get("input")
        target = plain[1] if len(plain) > 1 else named.get("target")
        if inputs is None or target is None:
            raise NotBatchable("the loss's input and target are not both given")
        for keyword, arg in named.items():
            if keyword not in ("input", "target") and self._reads_sample(arg.value):
                return self._reject(call)
        first, second = self.value(inputs.value), self.value(target.value)
        pair = (first.kind, second.kind)
        counted = loss.counted
        if loss.reduction == "none":
            # one loss per element of the target, laid out as the target: a tensor of the
            # sample's, as its input and target are (both batches of one, rows or flattened)
            if first.kind != second.kind or first.kind not in (ONE, ROW, FLAT):
                return self._reject(call)
            if counted and first.kind == ROW:
                return self._reject(call)  # a row's first dimension would become the batch's classes
            return PerSample(second.kind, origin=second.origin, sequence=second.sequence, real=True)
        if pair in ((ONE, ONE), (FLAT, FLAT)):
            pass
        elif pair == (FLAT, ROW):
            self.edit(target.value, _flattened)  # the sample's targets, flattened as the logits are
        elif pair == (ROW, ROW) and (second.sequence or not counted):
            if counted:  # `F.cross_entropy(logits.squeeze(0), seq[1:])`: (T, V) and (T,)
                self.edit(inputs.value, _flattened)
                self.edit(target.value, _flattened)
        else:
            return self._reject(call)
        if loss.reduction == "sum":
            return PerSample(SUM, origin=("loss",))
        if counted:
            # A target batch of one dimension (`y` of shape (B,)): one class a sample, whose
            # mean over its targets that count is its loss (a loss torch's sum adds up).
            single = pair == (ONE, ONE) and second.batch is not None and _rank(self.context, second.batch) == 1
            return PerSample(COUNTED, origin=("loss",), loss=loss, call=call, single=single)
        return PerSample(MEAN, origin=("loss",))

    def _local_call(self, call: cst.Call, function: cst.FunctionDef) -> PerSample:
        """A loss computed by a function of this file: what it returns for the sample's
        arguments. A sum or an element-wise mean keeps the call; a counted mean is
        written out (inlined) with its per-sample means. A loss function the batcher
        cannot read (a loop over positions, a mean over the targets that count) is
        called per sample on the batched model's output and the results summed: the
        same calls, on the same values, in the same order."""
        if _step_helper_body(function) is not None:
            return self._step_helper(call, function)
        try:
            return self._read_local_loss(call, function)
        except NotBatchable:
            per_sample = self._per_sample_loss(call, function)
            if per_sample is None:
                raise
            return per_sample

    def _step_helper(self, call: cst.Call, function: cst.FunctionDef) -> PerSample:
        """A function of this file that runs the forward and the backward of the sample it
        is given (`total += train_step(model, x[i:i + 1], y[i:i + 1])`): its statements are
        batched where they are, so that it takes the whole batch, when this loop is the
        only caller (another caller's batch would get the per-sample sum as its loss)."""
        name = self.code(call.func)
        if self.inlining or self.step_helpers or self.loop.index is None and not self.loop.rows:
            return self._reject(call)
        if local_calls(self.context).call_sites(function) != [call] or project_of(self.context).called_from_importers(
            function
        ):
            raise NotBatchable(f"`{name}` is called elsewhere too, where its batches may not be samples")
        statements, returned = _step_helper_body(function)
        mapping = _arguments(call, function)
        if mapping is None:
            return self._reject(call)
        env = {param: self.value(arg) if arg is not None else PerSample(INV) for param, arg in mapping.items()}
        data = [p for p, v in env.items() if v.kind in (ONE, ROW) and v.origin[:1] == ("data",)]
        if not data:
            return self._reject(call)
        local_names = set(mapping) | {
            n for s in statements if isinstance(s, cst.Assign) for t in s.targets for n in _names_of(t.target)
        }
        saved = (self.env, self.function_names, self.loop, self.samples)
        # inside, the batch is the parameter that held a sample
        self.loop = SampleLoop(None, f"{data[0]}.size(0)", batches=[cst.Name(data[0])])
        self.env, self.function_names, self.samples = env, local_names, set()
        try:
            self._statements(statements, None)
            result = self.value(returned) if returned is not None else PerSample(INV)
        finally:
            self.env, self.function_names, self.loop, self.samples = saved
        if result.kind not in (SUM, INV):
            raise NotBatchable(f"`{name}` returns a value the rule cannot add up over the samples")
        self.step_helpers += 1
        return result

    def _per_sample_loss(self, call: cst.Call, function: cst.FunctionDef) -> PerSample | None:
        """`sum(f(out[i : i + 1], y[i : i + 1]) for i in range(B))` for a loss function `f`
        called on one sample's values; None when `f` computes no torch loss, or an
        argument is not one sample's slice of a batched value (or a value of all samples)."""
        names = self.context.names
        if not any(
            names.of(inner.func) & ALL_LOSS_FUNCTIONS for inner in self.context.index.find(cst.Call, within=function)
        ):
            return None
        saved = self.collect
        self.collect = False  # read only for their kinds: the call is written anew
        try:
            kinds = [self.value(arg.value).kind for arg in call.args]
        finally:
            self.collect = saved
        index = self.loop.index
        if index is None or any(kind not in (INV, ONE, ROW) for kind in kinds) or all(k == INV for k in kinds):
            return None
        derived = {name for name, value in self.env.items() if value.kind != INV}
        args = []
        for arg, kind in zip(call.args, kinds):
            reads = {n.value for n in names_read(arg.value)}
            if reads & self.samples and (reads & derived or reads & self.samples != {index}):
                return None
            if kind == INV and index in reads:
                return None  # the generator's index would hide a name the call reads
            # One sample's slice of the data (`y[i : i + 1]`) reads as it did; a value the
            # batched model computed gets its sample's part (`out[i : i + 1]`).
            args.append(
                arg
                if reads & self.samples or kind == INV
                else arg.with_changes(value=_sample_of(arg.value, kind, index))
            )
        count = self.loop.count
        text = cst.Module([]).code_for_node(call.with_changes(args=args))
        self.edit(call, lambda _: cst.parse_expression(f"sum({text} for {index} in range({count}))"))
        return PerSample(SUM, origin=("loss",))

    def _read_local_loss(self, call: cst.Call, function: cst.FunctionDef) -> PerSample:
        returned = _single_return(function)
        if returned is None or self.inlining > 2:
            return self._reject(call)
        mapping = _arguments(call, function)
        if mapping is None:
            return self._reject(call)
        saved = (self.env, self.collect, self.found, self.function_names)
        inner_env = dict(self.env)
        for param, argument in mapping.items():
            inner_env[param] = self.value(argument) if argument is not None else PerSample(INV)
        assignments = _local_assignments(function)
        local_names = set(mapping) | {n for a in assignments for t in a.targets for n in _names_of(t.target)}
        # the edits the function's own expressions need for the batch, kept apart
        self.env, self.collect, self.found = inner_env, saved[1], []
        self.function_names = local_names
        self.inlining += 1
        try:
            for statement in assignments:
                self._bind(statement.targets[0].target, self.value(statement.value), statement)
            found = self.value(returned)
            inner_edits = self.found
        finally:
            self.env, self.collect, self.found, self.function_names = saved
            self.inlining -= 1
        if found.kind == COUNTED:
            if inner_edits or found.call is not returned:
                raise NotBatchable(
                    f"`{self.code(call.func)}` computes a token mean the rule cannot write out for a batch"
                )
            return PerSample(COUNTED, origin=("loss",), loss=found.loss, call=found.call, inline=(function, call))
        if found.kind not in (SUM, MEAN):
            return self._reject(call)
        if any(id(edit) not in self.cosmetic for edit in inner_edits):
            # The function computes something else for a batch (`.sum(0)` over a batch of one):
            # its expression is written out for the batch, each name it reads replaced by the
            # value it holds, so a value read twice must cost nothing to compute twice.
            if not all(m.matches(a.targets[0].target, m.Name()) for a in assignments):
                raise NotBatchable(f"`{self.code(call.func)}` unpacks values the rule cannot write out for a batch")
            for name, value in _read_twice(mapping, assignments, returned):
                if not _cheap(value):
                    raise NotBatchable(
                        f"`{self.code(call.func)}` reads `{name}` more than once: written out for the batch, "
                        f"`{self.code(value)}` would be computed as often"
                    )
            edits = list(inner_edits)
            self.edit(call, lambda updated: cst.parse_expression(self._inlined(function, updated, edits)))
        return PerSample(found.kind, origin=("loss",), real=found.real)

    def _inlined(self, function: cst.FunctionDef, call: cst.Call, edits: list | None = None) -> str:
        """The expression `function` returns, for the (updated) arguments of `call`, with
        `edits` (the batch's) made to the function's own expressions."""
        mapping = _arguments(call, function)
        texts = {param: cst.Module([]).code_for_node(arg) for param, arg in mapping.items() if arg is not None}
        for statement in _local_assignments(function):
            texts[statement.targets[0].target.value] = _substituted(statement.value, texts, edits)
        return _substituted(_single_return(function), texts, edits)


# What the methods that change a per-sample tensor's layout (or read a size of it) make of
# it, by method (the others keep its layout or are not batched).
_LAYOUT_METHODS = {
    "unsqueeze": _Batcher._unsqueezed,
    "squeeze": _Batcher._squeezed,
    "view": _Batcher._viewed,
    "reshape": _Batcher._viewed,
    "flatten": _Batcher._flattened,
    "transpose": _Batcher._own_dimensions_moved,
    "sum": _Batcher._total,
    "mean": _Batcher._total,
    "numel": _Batcher._counted_elements,
    "size": _Batcher._sized,
}


def _python_list(name: str) -> str:
    return (
        f"`{name}` is a Python list or tuple: its examples may differ in shape, and the model cannot take it "
        "as one batch; collate them into tensors (padded) first"
    )


def _leading(element: cst.BaseSlice) -> str:
    """What the first index of a subscript does: "none", "ellipsis", "full", "zero", "slice", "index"."""
    if isinstance(element, cst.Slice):
        return "full" if element.lower is None and element.upper is None and element.step is None else "slice"
    value = element.value
    if m.matches(value, m.Name("None")):
        return "none"
    if isinstance(value, cst.Ellipsis):
        return "ellipsis"
    return "zero" if integer_value(value) == 0 else "index"


def _full_element(comma: bool) -> cst.SubscriptElement:
    return cst.SubscriptElement(
        cst.Slice(lower=None, upper=None),
        comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if comma else cst.MaybeSentinel.DEFAULT,
    )


def _drop_first(updated: cst.Subscript) -> cst.BaseExpression:
    """`x[i]` -> `x`."""
    return updated.value


def _first_full(updated: cst.Subscript) -> cst.Subscript:
    """`x[i, 1:]` -> `x[:, 1:]`."""
    return updated.with_changes(slice=[_full_element(True), *updated.slice[1:]])


def _prepend_full(updated: cst.Subscript) -> cst.Subscript:
    """`row[1:]` -> `batch[:, 1:]`."""
    return updated.with_changes(slice=[_full_element(True), *updated.slice])


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    """`node` as the left operand of `*`: parentheses around lower-precedence operations."""
    if (
        isinstance(node, (cst.BinaryOperation, cst.BooleanOperation, cst.Comparison, cst.IfExp, cst.Lambda))
        and not node.lpar
    ):
        return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return node


def _flattened(updated: cst.BaseExpression) -> cst.Call:
    """`e` -> `e.flatten(0, 1)`: a batch of rows with their sample dimension merged into the next."""
    return cst.parse_expression(f"{cst.Module([]).code_for_node(atom(updated))}.flatten(0, 1)")


def _view_batch(updated: cst.Call) -> cst.Call:
    """`row.view(1, -1)` (receiver already the batch) -> `batch.view(batch.size(0), -1)`."""
    receiver = cst.Module([]).code_for_node(atom(updated.func.value))
    first = updated.args[0].with_changes(value=cst.parse_expression(f"{receiver}.size(0)"))
    return updated.with_changes(args=[first, *updated.args[1:]])


def _plain_arguments(expr: cst.BaseExpression) -> list[cst.BaseExpression] | None:
    """The arguments of a call given by position, none unpacked (`range(n)`, `zip(x, y)`); None
    for anything else."""
    if not isinstance(expr, cst.Call) or any(a.keyword or a.star for a in expr.args):
        return None
    return [a.value for a in expr.args]


def _split_of_one(iterable: cst.BaseExpression) -> cst.BaseExpression | None:
    """`x` for `x.split(1)` / `x.split(1, 0)` / `x.split(1, dim=0)`: batches of one."""
    if (
        m.matches(iterable, m.Call(func=m.Attribute(attr=m.Name("split"))))
        and iterable.args
        and integer_value(iterable.args[0].value) == 1
        and all(integer_value(a.value) == 0 for a in iterable.args[1:])
    ):
        return iterable.func.value
    return None


def _read_twice(mapping: dict, assignments: list[cst.Assign], returned: cst.BaseExpression):
    """(name, value) of each value of a function's parameters and locals (one per binding:
    `total = 0.0; total = total + x` binds two) that the function reads more than once."""
    bound = dict(mapping)
    counts: Counter = Counter()
    values: dict[int, tuple[str, cst.BaseExpression]] = {}

    def count(expr: cst.BaseExpression) -> None:
        for name in names_read(expr):
            value = bound.get(name.value)
            if value is not None:
                counts[id(value)] += 1
                values[id(value)] = (name.value, value)

    for assignment in assignments:
        count(assignment.value)
        bound[assignment.targets[0].target.value] = assignment.value
    count(returned)
    return [values[key] for key, n in counts.items() if n > 1]


def _cheap(expr: cst.BaseExpression) -> bool:
    """A name, a number, a size, or a slice of one: computed again, it costs nothing."""
    if _is_scalar(expr):
        return True
    if isinstance(expr, cst.Subscript):
        parts = []
        for element in expr.slice:
            if isinstance(element.slice, cst.Index):
                parts.append(element.slice.value)
            else:
                parts += [p for p in (element.slice.lower, element.slice.upper, element.slice.step) if p is not None]
        return _cheap(expr.value) and all(_cheap(p) for p in parts)
    return False


def _over_first_dimension(args) -> bool:
    """`(0)` or `(dim=0)`: a reduction over the first dimension only."""
    if len(args) != 1 or (args[0].keyword is not None and args[0].keyword.value != "dim"):
        return False
    return integer_value(args[0].value) == 0


def _past_first_dimension(args) -> bool:
    """Dimension arguments (`flatten(1, 2)`, `transpose(1, 2)`) that are all numbers past the first."""
    values = [integer_value(a.value) for a in args]
    return all(a.keyword is None for a in args) and all(v is not None and v >= 1 for v in values)


def _shape_origin(origin: tuple) -> tuple:
    """Values of one origin have the same shape per sample: the outputs of one model
    (its tuple's elements too), or one access of one batch tensor."""
    if origin and origin[0] == "model":
        return origin[:2]
    return origin[:3]


def _operands(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expr, cst.BinaryOperation):
        return [expr.left, expr.right]
    if isinstance(expr, cst.Comparison):
        return [expr.left, *(c.comparator for c in expr.comparisons)]
    if isinstance(expr, cst.Call):
        return [a.value for a in expr.args]
    return []


def _is_scalar(expr: cst.BaseExpression) -> bool:
    """A number, a size, a length, or a name or attribute (taken as a number)."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.UnaryOperation):
        return _is_scalar(expr.expression)
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return True
    if isinstance(expr, cst.Call):
        return m.matches(expr.func, m.Name("len") | m.Name("float") | m.Name("int")) or method_name(expr) in (
            "size",
            "numel",
        )
    if isinstance(expr, cst.Subscript):
        return m.matches(expr.value, m.Attribute(attr=m.Name("shape")))
    if isinstance(expr, cst.BinaryOperation):
        return _is_scalar(expr.left) and _is_scalar(expr.right)
    return False


def _names_of(target: cst.BaseExpression) -> list[str]:
    return [n.value for n in _name_nodes(target)]


def _name_nodes(target: cst.BaseExpression) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _name_nodes(e.value)]
    return []


def _sample_of(value: cst.BaseExpression, kind: str, index: str) -> cst.BaseExpression:
    """One sample's part of a batched value: `out[i : i + 1]` where each sample had
    a batch dimension of one, `out[i]` where it had none."""
    text = cst.Module([]).code_for_node(value)
    if kind == ONE:
        return cst.parse_expression(
            f"({text})[{index} : {index} + 1]" if _needs_parens(value) else f"{text}[{index} : {index} + 1]"
        )
    if kind == ROW:
        return cst.parse_expression(f"({text})[{index}]" if _needs_parens(value) else f"{text}[{index}]")
    return value


def _needs_parens(value: cst.BaseExpression) -> bool:
    return not isinstance(value, (cst.Name, cst.Attribute, cst.Subscript, cst.Call))


def _single_return(function: cst.FunctionDef) -> cst.BaseExpression | None:
    """The expression a function returns when its body is simple assignments (and a
    docstring) followed by one `return`."""
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else []
    if not body or not isinstance(body[-1], cst.SimpleStatementLine) or not isinstance(body[-1].body[0], cst.Return):
        return None
    for line in body[:-1]:
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return None
        small = line.body[0]
        docstring = isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString))
        if not docstring and not (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, (cst.Name, cst.Tuple))
        ):
            return None
    return body[-1].body[0].value


def _step_helper_body(function: cst.FunctionDef) -> tuple[list, cst.BaseExpression | None] | None:
    """(statements, the value returned) of a function whose body is simple statements with
    a plain `loss.backward()` among them (a docstring and a last `return` aside)."""
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else []
    statements = []
    for line in body:
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return None
        statements.append(line.body[0])
    if statements and isinstance(statements[0], cst.Expr) and isinstance(statements[0].value, cst.SimpleString):
        statements = statements[1:]
    returned = None
    if statements and isinstance(statements[-1], cst.Return):
        returned = statements.pop().value
    if any(isinstance(s, cst.Return) for s in statements) or not any(m.matches(s, BACKWARD) for s in statements):
        return None
    return statements, returned


def _local_assignments(function: cst.FunctionDef) -> list[cst.Assign]:
    return [line.body[0] for line in function.body.body[:-1] if isinstance(line.body[0], cst.Assign)]


def _arguments(call: cst.Call, function: cst.FunctionDef) -> dict[str, cst.BaseExpression | None] | None:
    """Parameter name -> the argument `call` passes (or the default), for a plain
    function; None when `*args`/`**kwargs` hide what goes where."""
    params = function.params
    if (
        params.star_arg is not cst.MaybeSentinel.DEFAULT
        and params.star_arg is not None
        or params.star_kwarg is not None
    ):
        return None
    if any(a.star for a in call.args):
        return None
    positional = [*params.posonly_params, *params.params]
    mapping: dict[str, cst.BaseExpression | None] = {}
    plain = [a.value for a in call.args if a.keyword is None]
    if len(plain) > len(positional):
        return None
    for param, value in zip(positional, plain):
        mapping[param.name.value] = value
    named = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    for param in [*positional, *params.kwonly_params]:
        name = param.name.value
        if name in mapping:
            continue
        if name in named:
            mapping[name] = named.pop(name)
        elif param.default is not None:
            mapping[name] = param.default
        else:
            return None
    return None if named else mapping


def _substituted(expr: cst.BaseExpression, texts: dict[str, str], edits: list | None = None) -> str:
    """The code of `expr` with each name it reads in `texts` replaced by that text, and
    the `edits` (Replace of its nodes) made."""
    reads = {id(n) for n in names_read(expr) if n.value in texts}
    replaced = expr.visit(_Substitute(reads, texts, edits or []))
    return cst.Module([]).code_for_node(replaced)


class _Substitute(cst.CSTTransformer):
    def __init__(self, reads: set[int], texts: dict[str, str], edits: list) -> None:
        super().__init__()
        self.reads, self.texts = reads, texts
        self.edits: dict[int, list] = {}
        for edit in edits:
            self.edits.setdefault(id(edit.anchor), []).append(edit)

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):
        if isinstance(original, cst.Name) and id(original) in self.reads:
            updated = atom(cst.parse_expression(self.texts[original.value]))
        for edit in self.edits.get(id(original), ()):
            updated = edit.replacement(updated)
        return updated


def _rank(context, expr: cst.BaseExpression, depth: int = 0) -> int | None:
    """The rank of the batch tensor `expr` (`Layouts.rank_key`), followed where the layouts
    stop: a name to its value or to what every call of its function passes for it (a
    parameter), a slice or a conversion (`y[b:b + bs].to(device)`) to what it is taken from."""
    key = layouts(context).rank_key(expr) if expr in context.index else None
    if isinstance(key, int) or depth > MAX_DEPTH:
        return key if isinstance(key, int) else None
    if isinstance(expr, cst.Name):
        value = layouts(context).value_of(expr)
        sources = [value] if value is not None else context.kinds.value_sources(expr)
        ranks = {_rank(context, source, depth + 1) if source is not None else None for source in sources}
        return ranks.pop() if len(ranks) == 1 else None
    if isinstance(expr, cst.Subscript) and all(isinstance(e.slice, cst.Slice) for e in expr.slice):
        return _rank(context, expr.value, depth + 1)
    if isinstance(expr, cst.Call) and method_name(expr) in ONE_OPERAND_METHODS:
        return _rank(context, expr.func.value, depth + 1)
    return None


def _per_sample_means(
    loss: LossCall, call: cst.Call, batch: str, reduce: str, indent: int, single: bool = False
) -> str:
    """The per-sample means of a batched cross-entropy (or NLL) `call`:
    `(f(input, target, reduction="none").view(B, -1).sum(1) / (target != ignore).view(B, -1).sum(1))`,
    then `.sum()` or `.mean()` (`reduce` "none": the vector). With one target a sample
    (`single`), each sample's mean is its loss: `f(input, target, reduction="sum")`, torch's
    mean for `.mean()`, `reduction="none"` for the vector."""
    code = cst.Module([]).code_for_node
    positional = [a.value for a in call.args if a.keyword is None]
    named = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    inputs = positional[0] if positional else named["input"]
    target = positional[1] if len(positional) > 1 else named["target"]
    if loss.function is None:  # a function call: its own keywords
        options = {k: code(v) for k, v in named.items() if k not in ("input", "target")}
        function = code(call.func)
    else:
        options = dict(loss.options)
        function = loss.function
    keywords = {
        "reduction": '"none"',
        **{k: v for k, v in options.items() if k not in ("reduction", "input", "target")},
    }
    if single:
        if reduce == "mean":
            del keywords["reduction"]  # torch's default: the mean over the samples
        else:
            keywords["reduction"] = f'"{reduce}"'
    extra = "".join(f", {k}={v}" for k, v in keywords.items())
    if single:
        return f"{function}({code(inputs)}, {code(target)}{extra})"
    ignore = options.get("ignore_index", str(loss.ignore_index))
    target_text = code(target)
    sums = f"({function}({code(inputs)}, {target_text}{extra}).view({batch}, -1).sum(1)"
    counts = f"/ ({target_text} != {ignore}).view({batch}, -1).sum(1))"
    close = "" if reduce == "none" else f".{reduce}()"
    text = f"{sums} {counts}{close}"
    if indent + len(text) > LINE_LENGTH:
        # libcst puts the block's indentation in front of the continuation line itself
        text = f"{sums}\n{' ' * (indent + 1)}{counts}{close}"
    return text

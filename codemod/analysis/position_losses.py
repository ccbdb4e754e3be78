"""Loops over the positions of a sequence that add one loss per position, and each
position's loss as data, written again over all the positions at once.

A per-position loop (`for t in range(T): loss += F.cross_entropy(logits[:, t], y[:, t])`,
or `zip(logits.unbind(1), y.unbind(1))`, or a generator summed) computes the same loss
as one call over every position when each position's term reads only its own slices.
`position_losses(context)` (built once per file, FileContext.shared) answers:

- `loop(node)`: the `PositionLoop` a `for` or a comprehension visits (`t` in
  `range(start, stop)`, or the rows of `zip(a.unbind(1), b.unbind(1))`), or None; its
  positions are along dim 1 (`x[:, t]`), or along dim 0 (`x[t]`) where a tensor the loop
  indexes is time-major (`Layouts.steps_dim`: `nn.LSTM`'s default output, (T, B, H));
- `losses(body, loop)`: the loss calls of `body` that read one position of a tensor
  (`x[:, t]`, a row of the zip), directly or through names the body assigns;
  `cross_entropy(calls)`: are they all cross-entropy or NLL (`loss_calls.kind`)?
- `teacher_forced(body, loop)`: does each position run the model (or another callable of
  the program) on something that reads the position, `model(x[:, :t])`?
  `recurrent(loop_node)`: does each position run a module (or a method of one,
  `decoder.step(tok, h)`) on what the one before made (free-running decoding, a hidden
  state handed on)?
- `term(value, loop, temporaries)`: the `Term` of a cross-entropy or NLL call (times or
  divided by a constant): its `LossOptions` and its input and target as `Operand`s
  (`base[:, sign * t + offset]`); `operands(term, loop)`: the input and the target over
  every position, as text, in the same order (slices, else `torch.arange` gathers);
- `cross_entropy_loop(node, loop)`: a `LoopTerm` for a loop whose body assigns position
  slices to names and then adds (`acc += term`) or appends (`L.append(term)`) one such
  term, with no name of the loop read after it;
- `summed_loop(node, loop)`: a `LoopTerm` for a loop that adds any per-element loss
  reduced per position (`mean`, `sum`, `batchmean`, times constants), or `.sum()` /
  `.mean()` of a pointwise expression of position slices and unreduced losses (a masked
  loss), with its sum over the positions written out (`LoopTerm.batched`, `imports`);
  a loop that ends in several such sums, each into its own total (`kd += ...; ce +=
  ...`), gives the first, the others in `LoopTerm.others`.

Each raises `NotBatched` with the true reason where the loop is not that. The losses'
reductions and options are torch facts (`loss_calls`, the torch table); the numbers the
code shows and the slices of the positions are `position_slices`'; how the loop totals
its terms and which names outlive it are `loop_totals`'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.loop_totals import added, appended, read_after
from codemod.analysis.loops import own_nodes
from codemod.analysis.loss_calls import LossArguments, LossOptions, loss_calls
from codemod.analysis.names import integer_value, names_read
from codemod.analysis.position_slices import affine, is_zero, position_slices, wrapped
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.torch_facts import (
    ALONG_DIM_FUNCTIONS,
    ALONG_DIM_METHODS,
    DTYPE_NAMES,
    FUNCTIONAL,
    POINTWISE_FUNCTIONS,
    POINTWISE_METHODS,
    functional_alias,
)
from codemod.analysis.torch_ops import methods
from codemod.analysis.values import Kind, number_is

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "position_losses"
TORCH_METHODS = methods()  # every tensor method of the torch table
FULL_SLICE = m.SubscriptElement(slice=m.Slice(lower=None, upper=None, step=None))


def position_losses(context: FileContext) -> PositionLosses:
    return context.shared(KEY, PositionLosses)


class NotBatched(Exception):
    """Why a per-position loss loop is not written over all positions at once."""


@dataclass
class PositionLoop:
    """The positions a loop (or comprehension) visits: `t` in `range(start, stop)`,
    or, for `zip(a.unbind(1), b.unbind(1))`, every position of the tensors named in `rows`."""

    var: str | None
    start: cst.BaseExpression | None = None
    stop: cst.BaseExpression | None = None
    rows: dict[str, cst.BaseExpression] = field(default_factory=dict)  # row name -> the tensor
    dim: int = 1  # the dim of the positions: 0 for time-major tensors (`x[t]`)

    @property
    def batch_dim(self) -> int:
        """The dim of a tensor's samples beside its positions: each position's slice's first."""
        return 1 if self.dim == 0 else 0


@dataclass
class Operand:
    """`base[:, sign * t + offset]` (offset: 0, a number, or an expression that does not
    change in the loop), or every position of `base` (`full`)."""

    base: cst.BaseExpression
    sign: int = 1
    offset: int | cst.BaseExpression = 0
    full: bool = False


@dataclass
class Term:
    """One position's loss: `call`, possibly times or divided by `factor`, as the loop adds it."""

    node: cst.BaseExpression  # what the loop adds (the call, or the call with its factor)
    call: cst.Call
    factor: tuple[str, cst.BaseExpression] | None
    loss: LossOptions
    input: Operand
    target: Operand


@dataclass
class LoopTerm:
    """What a per-position loop adds and how: `acc += value` (or `acc = acc + value`) or
    `L.append(value)`, after the assignments `temporaries` of the names the value reads."""

    statement: cst.BaseSmallStatement
    target: cst.Name  # acc, or L
    value: cst.BaseExpression
    appended: bool
    temporaries: dict[str, cst.Assign]
    term: Term | None = None  # a cross-entropy loop's
    batched: str | None = None  # a summed loop's sum over the positions
    imports: list[tuple[str, str | None]] = field(default_factory=list)
    others: list[LoopTerm] = field(default_factory=list)  # a summed loop's further sums, in order


class PositionLosses:
    """The per-position loss loops of one file."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.code = context.module.code_for_node

    @property
    def losses_of(self):
        return loss_calls(self.context)

    @property
    def slices(self):
        return position_slices(self.context)

    # -- the loop ---------------------------------------------------------------------

    def loop(self, node: cst.CSTNode) -> PositionLoop | None:
        """The positions a `for` (or a comprehension's one `for`) visits."""
        if isinstance(node, (cst.GeneratorExp, cst.ListComp)):
            comp = node.for_in
            if comp.inner_for_in is not None or comp.asynchronous is not None:
                return None
            target, iterable = comp.target, comp.iter
        elif isinstance(node, cst.For):
            if node.orelse is not None or node.asynchronous is not None:
                return None
            target, iterable = node.target, node.iter
        else:
            return None
        if isinstance(target, cst.Name):
            bounds = self._range_bounds(iterable)
            if bounds is None:
                return None
            body = node.elt if isinstance(node, (cst.GeneratorExp, cst.ListComp)) else node.body
            return PositionLoop(target.value, *bounds, dim=0 if self._time_major(body, target.value) else 1)
        return self._unbound_rows(target, iterable)

    def _time_major(self, body: cst.CSTNode, var: str) -> bool:
        """Does the body index a tensor whose dim 0 is a sequence's steps by the loop's
        variable, `logits[t]` of an `nn.LSTM`'s output in its default layout?"""
        shapes = layouts(self.context)
        return any(
            isinstance(subscript.slice[0].slice, cst.Index)
            and var in {n.value for n in names_read(subscript.slice[0].slice.value)}
            and shapes.steps_dim(subscript.value) == 0
            for subscript in own_nodes(self.context.index, cst.Subscript, body)
        )

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

    def _unbound_rows(self, target: cst.BaseExpression, iterable: cst.BaseExpression) -> PositionLoop | None:
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
                    value,
                    m.Call(func=m.Attribute(attr=m.Name("unbind")), args=[m.Arg(value=number_is(self.context, 1))]),
                )
                and value.args[0].keyword
                in (None,) + tuple(k for k in [value.args[0].keyword] if k and k.value == "dim")
                and isinstance(value.func.value, (cst.Name, cst.Attribute))
            ):
                return None
            rows[element.value.value] = value.func.value
        return PositionLoop(None, rows=rows)

    # -- the losses a loop computes per position -----------------------------------------

    def losses(self, body: cst.CSTNode, loop: PositionLoop) -> list[cst.Call]:
        """The loss calls in `body` whose input or target is one position of the loop,
        `x[:, <t>]` (directly or through a name the body assigns)."""
        losses = self.losses_of
        assigned = None
        found = []
        for call in own_nodes(self.context.index, cst.Call, body):
            if losses.kind(call) is None and losses.any_loss(call) is None:
                continue
            assigned = self._assigned_in(body) if assigned is None else assigned
            for arg in call.args[:2]:
                value = arg.value
                if isinstance(value, cst.Name) and value.value not in loop.rows:
                    value = assigned.get(value.value, value)
                if self._at_position(value, loop) or self._reads_position(value, loop, assigned):
                    found.append(call)
                    break
        return found

    def cross_entropy(self, calls: list[cst.Call]) -> bool:
        return all(self.losses_of.kind(call) is not None for call in calls)

    def _reads_position(self, expr: cst.BaseExpression, loop: PositionLoop, assigned: dict, depth: int = 0) -> bool:
        """Does `expr` read positions of a tensor, `x[:, t]` or `x[:, :t]`, inside the
        pointwise functions around it or through the names the body assigns?"""
        if loop.var is None or depth > 3:
            return False
        for subscript in m.findall(expr, m.Subscript()) if isinstance(expr, cst.CSTNode) else []:
            elements = list(subscript.slice)
            if (
                len(elements) > loop.dim
                and all(m.matches(e, FULL_SLICE) for e in elements[: loop.dim])
                and loop.var in {n.value for n in names_read(elements[loop.dim])}
            ):
                return True
        return any(
            self._reads_position(assigned[name.value], loop, assigned, depth + 1)
            for name in names_read(expr)
            if name.value in assigned and assigned[name.value] is not expr
        )

    def _at_position(self, expr: cst.BaseExpression, loop: PositionLoop) -> bool:
        """`x[:, <reads t>, ...]` (through calls and attributes of it), or a row of the zip."""
        if isinstance(expr, cst.Name):
            return expr.value in loop.rows
        while isinstance(expr, (cst.Call, cst.Attribute)):
            expr = expr.func if isinstance(expr, cst.Call) else expr.value
        if loop.var is None or not isinstance(expr, cst.Subscript) or len(expr.slice) <= loop.dim:
            return False
        position = expr.slice[loop.dim]
        return (
            all(m.matches(e, FULL_SLICE) for e in expr.slice[: loop.dim])
            and isinstance(position.slice, cst.Index)
            and loop.var in {n.value for n in names_read(position.slice.value)}
        )

    def _assigned_in(self, body: cst.CSTNode) -> dict[str, cst.BaseExpression]:
        found = {}
        for assign in own_nodes(self.context.index, cst.Assign, body):
            if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
                found[assign.targets[0].target.value] = assign.value
        return found

    # -- positions that cannot run at once --------------------------------------------

    def teacher_forced(self, body: cst.CSTNode, loop: PositionLoop) -> bool:
        """Does the body run the model (or another callable of this program) on something
        that reads the position: `model(x[:, :t])`?"""
        if loop.var is None:
            return False
        assigned = self._assigned_in(body)
        for call in own_nodes(self.context.index, cst.Call, body):
            if self.losses_of.kind(call) is not None or self.losses_of.any_loss(call) is not None:
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
        receiver = self.context.kinds.fact(func.value).kind
        return (
            func.attr.value not in TORCH_METHODS
            and receiver in (Kind.MODULE, Kind.UNKNOWN)
            and isinstance(func.value, (cst.Name, cst.Attribute))
            and not self.context.names.of(func)
        )

    def _reads_var(self, expr: cst.BaseExpression, loop: PositionLoop, assigned: dict, depth: int = 0) -> bool:
        """Does `expr` read the loop variable, itself or through the names the body assigns?"""
        reads = names_read(expr)
        if any(n.value == loop.var for n in reads):
            return True
        return depth < 4 and any(
            self._reads_var(assigned[n.value], loop, assigned, depth + 1)
            for n in reads
            if n.value in assigned and assigned[n.value] is not expr
        )

    def recurrent(self, node: cst.For) -> bool:
        """Does each position run a module on what the one before it made? Then the loop
        must stay, and one loss call after it would save next to nothing."""
        kinds = self.context.kinds

        def runs_a_module(call: cst.Call) -> bool:  # `cell(x, h)`, or a method of one: `decoder.step(tok, h)`
            owner = call.func.value if isinstance(call.func, cst.Attribute) else None
            return kinds.fact(call.func).kind is Kind.MODULE or (
                owner is not None and kinds.fact(owner).kind is Kind.MODULE
            )

        return any(
            runs_a_module(call) and any(kinds.carried_reads(node, arg) for arg in call.args)
            for call in self.context.index.find(cst.Call, within=node.body)
        )

    # -- a cross-entropy term ------------------------------------------------------------

    def term(self, value: cst.BaseExpression, loop: PositionLoop, temporaries: dict[str, cst.Assign]) -> Term:
        """The cross-entropy or NLL call `value` is (times or divided by a constant), and its
        input and target as one position each."""
        call, factor = _split_factor(value)
        loss = self.losses_of.options(call)
        if loss is None:
            raise NotBatched("what the loop adds is not one cross-entropy call (times a constant)")
        if loss.problem is not None:
            raise NotBatched(loss.problem)
        if factor is not None and not _is_constant(factor[1], loop):
            raise NotBatched("the factor applied to each term is not a plain name or number")
        plain = [arg for arg in call.args if arg.keyword is None]
        named = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
        if loss.module is None:
            inputs = plain[0].value if plain else named.get("input")
            target = plain[1].value if len(plain) > 1 else named.get("target")
        else:
            inputs, target = (plain[0].value, plain[1].value) if len(plain) == 2 else (None, None)
        if inputs is None or target is None:
            raise NotBatched("the loss's input and target are not both given")
        input_operand = self.operand(_inline(inputs, temporaries), loop, trailing=True)
        target_operand = self.operand(_inline(target, temporaries), loop, trailing=False)
        if input_operand is None or target_operand is None:
            raise NotBatched("the loss does not read `x[:, t]` and `y[:, t]` of the loop's position `t`")
        read = [n.value for n in names_read(_inline(call, temporaries))]
        if loop.var is not None and read.count(loop.var) != 2:
            raise NotBatched(f"`{loop.var}` is used for more than indexing the positions")
        return Term(value, call, factor, loss, input_operand, target_operand)

    def operand(self, expr: cst.BaseExpression, loop: PositionLoop, trailing: bool) -> Operand | None:
        """`base[:, t + offset]` (`base[:, t + offset, :]` where `trailing`), or a row of
        `zip(... .unbind(1))`."""
        if isinstance(expr, cst.Name) and expr.value in loop.rows:
            return Operand(loop.rows[expr.value], full=True)
        if (
            loop.var is None
            or not isinstance(expr, cst.Subscript)
            or not isinstance(expr.value, (cst.Name, cst.Attribute))
        ):
            return None
        elements = list(expr.slice)
        if len(elements) == loop.dim + 2 and trailing and m.matches(elements[-1], FULL_SLICE):
            elements = elements[:-1]
        if (
            len(elements) != loop.dim + 1
            or not all(m.matches(e, FULL_SLICE) for e in elements[: loop.dim])
            or not isinstance(elements[-1].slice, cst.Index)
        ):
            return None
        index = affine(elements[-1].slice.value, loop.var)
        if index is None or loop.var in {n.value for n in names_read(expr.value)}:
            return None
        sign, offset = index
        return Operand(expr.value, sign, offset)

    def operands(self, term: Term, loop: PositionLoop) -> tuple[str, str]:
        """The input and the target over every position the loop visits, as text, in the
        same order for both: slices where the positions are one range that does not wrap
        around, else the loop's index arithmetic over `torch.arange`."""
        pair = (term.input, term.target)
        if all(o.full for o in pair):
            return tuple(self.code(o.base) for o in pair)
        if any(o.full for o in pair):
            raise NotBatched("the positions of the input and the target are not visited the same way")
        sliced = [
            self.slices.sliced(o.base, o.sign, o.offset, loop.start, loop.stop, loop.dim)
            if o.sign == pair[0].sign
            else None
            for o in pair
        ]
        if all(s is not None for s in sliced):
            return tuple(sliced)
        # Slices run in ascending positions; `-t` visits them in descending order, which
        # only slices of both keep aligned. Ascending ones may mix slices and gathers.
        return tuple(
            s
            if s is not None and o.sign == 1
            else self.slices.gathered(o.base, o.sign, o.offset, loop.start, loop.stop, loop.dim)
            for s, o in zip(sliced, pair)
        )

    def cross_entropy_loop(self, node: cst.For, loop: PositionLoop) -> LoopTerm:
        """The one cross-entropy term a loop adds or appends per position, after names
        assigned position slices (each read once by it)."""
        if self.teacher_forced(node.body, loop):
            raise NotBatched("each position runs the model on its own prefix")
        statements = _simple_body(node)
        if statements is None:
            raise NotBatched("the loop does more than add one loss per position")
        *setup, statement = statements
        temporaries: dict[str, cst.Assign] = {}
        for assign in setup:
            if not m.matches(assign, m.Assign(targets=[m.AssignTarget(target=m.Name())], value=m.Subscript())):
                raise NotBatched("the loop does more than add one loss per position")
            temporaries[assign.targets[0].target.value] = assign
        found = added(statement)
        is_appended = found is None
        found = found or appended(statement)
        if found is None:
            raise NotBatched("the loop does more than add one loss per position")
        target, value = found
        term = self.term(value, loop, temporaries)
        if target.value in [n.value for n in names_read(_inline(value, temporaries))]:
            raise NotBatched(f"each term reads `{target.value}`")
        for name, assign in temporaries.items():
            if [n.value for n in names_read(value)].count(name) != 1 or set(temporaries) & {
                n.value for n in names_read(assign.value)
            }:
                raise NotBatched(f"`{name}` is not read once by the loss")
        names = [node.target] if loop.var is not None else [e.value for e in node.target.elements]
        self._not_read_after(node, [*(a.targets[0].target for a in temporaries.values()), *names])
        return LoopTerm(statement, target, value, is_appended, temporaries, term=term)

    def _not_read_after(self, node: cst.For, targets: list[cst.Name]) -> None:
        for target in targets:
            if read_after(self.context, node, target):
                raise NotBatched(f"`{target.value}` is read after the loop, and the fix leaves it unbound")

    # -- any per-element loss, reduced per position ---------------------------------------

    def summed_loop(self, node: cst.For, loop: PositionLoop) -> LoopTerm:
        """`acc += <term of t>` (after assignments of names the term reads), for a term that
        is a loss reduced per position (`mean`, `sum`, `batchmean`) times constants, or
        `.sum()` / `.mean()` of a pointwise expression of position slices and unreduced
        losses (a masked loss), with its sum over the positions written out."""
        statements = _simple_body(node) if loop.var is not None else None
        if statements is None:
            raise NotBatched("the loop does more than add one loss per position")
        setup, sums = _setup_and_sums(statements)
        temporaries = _summed_temporaries(setup, loop.var)
        found = [added(statement) for statement in sums]
        if None in found:
            raise NotBatched("the loop does more than add one loss per position")
        accumulators = [accumulator.value for accumulator, _ in found]
        if len(set(accumulators)) != len(accumulators):
            raise NotBatched(f"`{accumulators[0]}` is added to more than once in the loop")
        for _, value in found:
            carried = [n.value for n in names_read(_inlined_term(value, temporaries)) if n.value in accumulators]
            if carried:
                raise NotBatched(f"each term reads `{carried[0]}`")
        unused = [name for name in temporaries if not any(_reaches(name, value, temporaries) for _, value in found)]
        if unused:
            raise NotBatched(f"`{unused[0]}` is assigned in the loop but read by none of its losses")
        self._not_read_after(node, [*(a.targets[0].target for a in temporaries.values()), node.target])
        values = {name: assign.value for name, assign in temporaries.items()}
        terms = [
            self._summed_term(statement, accumulator, value, loop, temporaries, values)
            for statement, (accumulator, value) in zip(sums, found)
        ]
        terms[0].others = terms[1:]
        return terms[0]

    def _summed_term(
        self, statement, accumulator: cst.Name, value, loop: PositionLoop, temporaries, values
    ) -> LoopTerm:
        """The LoopTerm of one `acc += value`, with its sum over all the positions."""
        batched = _Batched(self, loop, values)
        text = batched.total(value)
        return LoopTerm(statement, accumulator, value, False, temporaries, batched=text, imports=batched.imports)


def _setup_and_sums(statements: list[cst.BaseSmallStatement]) -> tuple[list, list]:
    """The loop body's assignments before its sums, and the sums: the last statement, and
    the ones before it that add too (`kd += ...; ce += ...`, each on its own)."""
    count = len(statements)
    while count > 1 and added(statements[count - 2]) is not None:
        count -= 1
    return statements[: count - 1], statements[count - 1 :]


def _summed_temporaries(setup: list[cst.BaseSmallStatement], var: str) -> dict[str, cst.Assign]:
    """The names the loop assigns before its sums (each once, none the loop variable)."""
    temporaries: dict[str, cst.Assign] = {}
    for assign in setup:
        if not m.matches(assign, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
            raise NotBatched("the loop does more than add one loss per position")
        name = assign.targets[0].target.value
        if name in temporaries or name == var:
            raise NotBatched(f"`{name}` is bound more than once in the loop")
        temporaries[name] = assign
    return temporaries


def _inlined_term(value: cst.BaseExpression, temporaries: dict[str, cst.Assign]) -> cst.BaseExpression:
    """`value` with the temporaries it reads written out, through those they read in turn;
    each may be read once only."""
    term = value
    for _ in range(len(temporaries) + 1):  # names assigned from names assigned before them
        read = [n.value for n in names_read(term) if n.value in temporaries]
        if not read:
            return term
        if any(read.count(name) != 1 for name in read):
            raise NotBatched(f"`{read[0]}` is read more than once by the loss")
        term = _inline(term, temporaries)
    raise NotBatched("the names the loop assigns depend on each other")


def _simple_body(node: cst.For) -> list[cst.BaseSmallStatement] | None:
    """The body's statements, each alone on its line, or None."""
    if not isinstance(node.body, cst.IndentedBlock) or not all(
        isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 for line in node.body.body
    ):
        return None
    return [line.body[0] for line in node.body.body]


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


def _is_constant(expr: cst.BaseExpression, loop: PositionLoop) -> bool:
    """A number, or an expression of names and numbers that does not read the position."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    reads = {n.value for n in names_read(expr)}
    if loop.var in reads or reads & set(loop.rows):
        return False
    return isinstance(expr, (cst.Name, cst.Attribute)) or (
        isinstance(expr, cst.BinaryOperation) and _is_constant(expr.left, loop) and _is_constant(expr.right, loop)
    )


class _Batched:
    """One position's term, as text over all the positions a loop visits."""

    def __init__(self, owner: PositionLosses, loop: PositionLoop, temporaries: dict[str, cst.BaseExpression]) -> None:
        self.owner = owner
        self.context = owner.context
        self.loop = loop
        self.temporaries = temporaries  # names the loop assigns before the term, read once each
        self.reads = {id(n) for v in [*temporaries.values()] for n in names_read(v)}
        self.code = owner.code
        self.operands: list[tuple[cst.Subscript, Operand]] = []
        self.texts: dict[int, str] = {}
        self.imports: list[tuple[str, str | None]] = []

    def total(self, term: cst.BaseExpression) -> str:
        """The sum over the positions of `term`."""
        self.reads |= {id(n) for n in names_read(term)}
        return self._total(term)

    def _total(self, term: cst.BaseExpression) -> str:
        term = self._value(term)
        scalar = self.owner.slices.scalar
        if isinstance(term, cst.BinaryOperation) and isinstance(term.operator, (cst.Multiply, cst.Divide)):
            operator = "*" if isinstance(term.operator, cst.Multiply) else "/"
            if scalar(term.right) and not self._reads(term.right):
                return f"{self._total(term.left)} {operator} {wrapped(self.code(term.right))}"
            if operator == "*" and scalar(term.left) and not self._reads(term.left):
                return f"{wrapped(self.code(term.left))} * {self._total(term.right)}"
        if term.lpar and isinstance(term, cst.BinaryOperation):
            return self._total(term.with_changes(lpar=(), rpar=()))
        if not isinstance(term, cst.Call):
            raise NotBatched("what the loop adds is not a loss per position (times a constant)")
        loss = self.owner.losses_of.arguments(term)
        if loss is not None:
            call = self._loss_call(term, loss)
            if loss.reduction == "none":
                raise NotBatched('reduction="none" gives per-sample losses that the loop combines in its own way')
            if loss.facts.class_targets:  # a mean divides by its own position's count of targets
                if loss.reduction == "mean" and "weight" in loss.keywords:
                    raise NotBatched("with `weight=`, each position's mean divides by its own sum of class weights")
                return f"{call('mean per position')}.sum()" if loss.reduction == "mean" else call("sum")
            if loss.reduction == "sum":
                return call("sum")
            if loss.reduction == "batchmean":  # each position's sum over its batch size: the base's batch dim
                return f"{call('sum')} / {self.code(self.operands[0][1].base)}.size({self.loop.batch_dim})"
            return self._sum_of_means(call("mean"), call("none"))
        reduced = self._reduction(term)
        if reduced is None:
            raise NotBatched("what the loop adds is not a loss per position (times a constant)")
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
        count = self.owner.slices.count(self.loop.start, self.loop.stop) if self.loop.var is not None else None
        if count is not None and count >= 1:
            start = self.loop.start
            plain = start is None or is_zero(start)
            return f"{mean} * {self.code(self.loop.stop) if plain else count}"
        by_position = f"{unreduced}.transpose(0, 1)" if self.loop.dim == 1 else unreduced
        return f"{by_position}.flatten(1).mean(1).sum()"

    def _reduction(self, call: cst.Call) -> tuple[str, cst.BaseExpression] | None:
        """("sum" or "mean", what it reduces) for `x.sum()`, `x.mean()`, `torch.sum(x)`."""
        if call.args and isinstance(call.func, cst.Attribute) and call.func.attr.value in ("sum", "mean"):
            return None
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("sum", "mean"):
            names = self.context.names.of(call.func)
            if not names or not any(n.startswith("torch.") for n in names):
                return call.func.attr.value, call.func.value
        if self.context.names.is_(call.func, "torch.sum", "torch.mean") and len(call.args) == 1:
            arg = call.args[0]
            if arg.keyword is None and not arg.star:
                return call.func.attr.value if isinstance(call.func, cst.Attribute) else "sum", arg.value
        return None

    def _loss_call(self, call: cst.Call, loss: LossArguments):
        """A function of a reduction giving the call over all positions."""
        if loss.problem is not None:
            raise NotBatched(loss.problem)
        for key, value in loss.keywords.items():
            if self._reads(value):
                raise NotBatched(f"`{key}=` is not understood by the fix")
        self._pointwise(loss.input)
        self._pointwise(loss.target)
        if not self.operands:
            raise NotBatched("the loss does not read `x[:, t]` of the loop's position `t`")
        self._align()
        batched_input, batched_target = self._substitute(loss.input), self._substitute(loss.target)
        if loss.constructor is not None:
            alias = functional_alias(self.context.module)
            if alias is None:
                self.imports.append((FUNCTIONAL, None))
            name = f"{alias or FUNCTIONAL}.{loss.facts.functional}"
        else:
            name = self.code(call.func)
        extra = "".join(f", {k}={self.code(v)}" for k, v in loss.keywords.items())
        facts = loss.facts

        def over_positions(reduced: str) -> str:
            if facts.class_targets:
                flat = f"{name}({wrapped(batched_input)}.flatten(0, 1), {wrapped(batched_target)}.flatten(0, 1)"
                if reduced == "mean per position":  # each position's tokens over its count of targets
                    ignored = loss.keywords.get("ignore_index")
                    ignored = self.code(ignored) if ignored is not None else str(facts.ignore_index)
                    tokens = f'{flat}, reduction="none"{extra}).view_as({batched_target})'
                    batch = self.loop.batch_dim
                    return f"({tokens}.sum({batch}) / ({wrapped(batched_target)} != {ignored}).sum({batch}))"
                if reduced == "none":
                    return f'{flat}, reduction="none"{extra}).view_as({batched_target})'
                return f'{flat}, reduction="{reduced}"{extra})'
            chosen = "" if reduced == facts.reduction else f', reduction="{reduced}"'
            return f"{name}({batched_input}, {batched_target}{chosen}{extra})"

        return over_positions

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
        """Check that `expr` computes each element of one position from the same elements
        of the positions it reads (slices `x[:, t]`, pointwise torch ops, softmaxes along a
        negative dim, unreduced losses, Python numbers); collect its slices."""
        expr = self._value(expr)
        if not self._reads(expr):
            if self.owner.slices.scalar(expr) or self._constant_argument(expr):
                return
            raise NotBatched(
                f"`{self.code(expr)}` may be a tensor, which broadcasts against one position "
                "otherwise than against all of them"
            )
        if isinstance(expr, cst.Subscript):
            operand = self.owner.operand(expr, self.loop, trailing=True)
            if operand is None or operand.full:
                raise NotBatched(f"`{self.code(expr)}` is not one position `x[:, t]` of a tensor")
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
        raise NotBatched(f"`{self.code(expr)}` is not computed position by position")

    def _constant_argument(self, expr: cst.BaseExpression) -> bool:
        """A dtype or a device (`torch.float32`, `device`): not a tensor."""
        if isinstance(expr, (cst.SimpleString, cst.Name)) and m.matches(expr, m.Name("None") | m.SimpleString()):
            return True
        if self.context.kinds.fact(expr).kind is Kind.DEVICE:
            return True
        names = self.context.names.of(expr)
        return bool(names) and all(n.startswith("torch.") and n.rsplit(".", 1)[1] in DTYPE_NAMES for n in names)

    def _pointwise_call(self, call: cst.Call) -> None:
        if any(a.star for a in call.args):
            raise NotBatched(f"`{self.code(call)}` unpacks its arguments")
        loss = self.owner.losses_of.arguments(call)
        if loss is not None:
            self._loss_call(call, loss)
            if loss.reduction != "none":
                raise NotBatched("a reduced loss inside what each position adds")
            return
        operands = self._pointwise_operands(call)
        if operands is None:
            raise NotBatched(f"`{self.code(call)}` is not computed position by position")
        for operand in operands:
            self._pointwise(operand)

    def _pointwise_operands(self, call: cst.Call) -> list[cst.BaseExpression] | None:
        """What a call computes from position by position: the operands of a pointwise
        function or method, or of an op along a dim counted from the end; None for another call."""
        names = self.context.names.of(call.func)
        args = list(call.args)
        if names & POINTWISE_FUNCTIONS:
            return [arg.value for arg in args]
        method = isinstance(call.func, cst.Attribute) and not (names and any(n.startswith("torch.") for n in names))
        if method and call.func.attr.value in POINTWISE_METHODS:
            return [call.func.value, *(arg.value for arg in args)]
        if names & ALONG_DIM_FUNCTIONS:
            tensor = args[0].value if args and args[0].keyword is None else None
            return self._along_last_dims(call, tensor, args[1:])
        if method and call.func.attr.value in ALONG_DIM_METHODS:
            return self._along_last_dims(call, call.func.value, args)
        return None

    def _along_last_dims(self, call: cst.Call, tensor: cst.BaseExpression | None, rest) -> list[cst.BaseExpression]:
        """The operands of an op along one dim (`x.softmax(-1)`): the tensor and the keyword
        arguments beside the dim (a `dtype`), where the dim is counted from the end, which
        all the positions at once keep."""
        dims = [a.value for a in rest if a.keyword is None or a.keyword.value == "dim"]
        others = [a for a in rest if a.keyword is not None and a.keyword.value != "dim"]
        dim = integer_value(dims[0]) if len(dims) == 1 else None
        if tensor is None or dim is None or dim >= 0 or any(a.keyword.value != "dtype" for a in others):
            raise NotBatched(
                f"`{self.code(call)}` is not taken along a dim counted from the end (`dim=-1`), "
                "which all the positions at once would keep"
            )
        return [tensor, *(arg.value for arg in others)]

    def _align(self) -> None:
        """Every slice of the term as the same positions in the same order: slices where all
        of them are one, else the loop's index arithmetic over `torch.arange`."""
        slices, loop = self.owner.slices, self.loop
        signs = {operand.sign for _, operand in self.operands}
        sliced = [
            slices.sliced(o.base, o.sign, o.offset, loop.start, loop.stop, loop.dim) if len(signs) == 1 else None
            for _, o in self.operands
        ]
        if all(s is not None for s in sliced):
            self.texts = {id(node): text for (node, _), text in zip(self.operands, sliced)}
        else:
            self.texts = {
                id(node): slices.gathered(o.base, o.sign, o.offset, loop.start, loop.stop, loop.dim)
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
        batched = self.batched
        if isinstance(original, cst.Name) and id(original) in batched.reads and original.value in batched.temporaries:
            value = batched._substitute(batched.temporaries[original.value])
            return cst.parse_expression(wrapped(value))
        text = batched.texts.get(id(original))
        if text is not None:
            return cst.parse_expression(text).with_changes(lpar=original.lpar, rpar=original.rpar)
        if isinstance(original, cst.Call):
            loss = batched.owner.losses_of.arguments(original)
            if loss is not None:
                return cst.parse_expression(batched._loss_call(original, loss)("none"))
        return updated

"""Python loops over time as math: what each step computes, and the same for all steps at once.

A loop `for t in range(T)` (or `reversed(range(T))`, or `for x_t in x.unbind(1)`) is read statement by
statement into *step values*: symbolic expressions of

- time-indexed tensors (`x[:, t]`, `k[:, :, t]`, `x[t]`, `x[..., t]`, `x[:, t:t + 1]`,
  a loop target over `x.unbind(1)`), each a tensor with time at a known dim;
- values that do not change over the loop (`self.decay`, `0.9`, `A`), kept as code;
- the *states*: names bound before the loop, read in it and updated in it, as their
  value before the step's update (`Prev`) or after it (`New`);
- the operations between them: arithmetic with broadcasting, elementwise functions,
  `unsqueeze` / `[..., None]`, sums and means over dims, `transpose` / `.mT`,
  `einsum`, `@`, and modules that act on the last dim (`nn.Linear`).

Each state's update must be affine in it, S = A * S + X (A and X free of S), which is
the linear recurrence the kernels compute; the values the loop collects (`outs.append`,
`out[:, t] = ...`) may be any of these expressions of the states and the inputs. A
state may also live in the slots of a tensor made before the loop: `h[:, t] = h[:, t - 1]
* w + x[:, t]` reads the previous step's slot and writes this step's, so `h` is a state
whose value before the first step is the slot before it, and whose values are written
into the slots the loop runs over.

*Lifting* turns a step value into the tensor of its values at all steps, with time as
one more dim: a time-indexed tensor is itself (sliced to the loop's steps), an op on
lifted values is the same op with its dims shifted past the time dim, a value that does
not change broadcasts over time. Where the lifted dims are known (`Layouts`), the code
keeps the tensors' own layout; where they are not, time is moved next to the dims the
op names (`movedim`), which is exact for any rank. A value whose layout cannot be
proven (a constant that may be a number or a tensor) makes the loop unsupported, with
the reason: rules report such loops instead of rewriting them.

- `time_loops(context)`: the file's TimeLoops, built once per file (FileContext.shared).
- `TimeLoops.candidate(loop)`: does the loop's body update a name, or a tensor's slot,
  that it reads (a state), outside a training loop?
- `TimeLoops.read(loop)`: the TimeLoop (states, outputs, steps) of step values, or None
  for a loop that is not over time; raises Unsupported with what differs.
- `TimeLoops.looks_like_recurrence(loop)`: for a loop `read` could not prove, does it still
  hand a state from one step to the next over a tensor's time dim (`x[:, t]`, or `x[t]`
  of a tensor of known shape or under `range(x.size(0))`), updated from itself
  through math (linear or not: `tanh(W x_t + U h)`), not through an RNN cell and not only
  totalled, worth a report?
- `TimeLoops.order(model)`: the states, each after those its update reads.
- `TimeLoops.stacked_outputs(model)`: for each list the loop appends to, its Stacked
  (the empty list made just before the loop, the one `torch.stack`/`torch.cat` after
  it); raises Unsupported when the list is read otherwise, or a temporary or the step
  index is read after the loop.
- `TimeLoops.read_after(model)`: the states whose value after the loop is read later.
- `TimeLoops.attention(model, state)`: the Attention (decayed linear attention, GLA or
  RWKV form: S = w * S + k^T v read as r S, with its bonus u) a state is, or None.
- `TimeLoops.with_reads(sym, attention)`: `sym` with those read-outs made `Read` values;
  `TimeLoops.uses(...)`: how often each state is read before, after its update, or at the end.
- `TimeLoops.scope_names(loop)`, `bound_names(statement)`: the names a rewrite must
  not take (`names.fresh_name` picks a new one).
- `state_rank(state)`, `strip_unsqueeze(sym, dim)`: a state's rank per step; a value
  without an unsqueeze at `dim`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis.names import (
    atom,
    integer_literal,
    integer_value,
    is_dotted_name,
    kwarg,
    names_read,
    positional,
    separated,
)
from codemod.analysis.tensor_layout import (
    Spec,
    layouts,
    read_names,
)
from codemod.analysis.torch_facts import (
    ELEMENTWISE_MODULES,
    LAST_DIM_FUNCTIONS,
    LAST_DIM_METHODS,
    LAST_DIM_MODULES,
    PRODUCT_FUNCTIONS,
    PRODUCT_METHODS,
    RANDOM_FUNCTIONS,
    RANDOM_METHODS,
    RECURRENCE_FUNCTION_NAMES,
    RECURRENCE_METHODS,
    REORDERING_METHODS,
    RESHAPING_METHODS,
    SAME_SHAPE_MODULES,
    SPLITTING_METHODS,
    SQUEEZING_METHODS,
)
from codemod.analysis.torch_ops import Category, functions, methods

if TYPE_CHECKING:
    from codemod.context import FileContext


class Unsupported(Exception):
    """The loop is not one this analysis can prove; the message says what differs."""


# Elementwise methods of a tensor (their other arguments must not change over time).
# Elementwise in time: each output step from the same input step.
ELEMENTWISE_METHODS = methods(Category.UNARY, Category.CAST, random=False, in_place=False)
ELEMENTWISE_FUNCTIONS = functions(Category.UNARY, random=False)
REDUCTIONS = methods(Category.REDUCTION)
# Matrix products that broadcast their leading dims (`matmul`, not `mm` or `bmm`, which take
# matrices or batches of them only): a step value with a time dim more is still one operand.
BROADCAST_PRODUCT_METHODS = PRODUCT_METHODS & LAST_DIM_METHODS
BROADCAST_PRODUCT_FUNCTIONS = PRODUCT_FUNCTIONS & LAST_DIM_FUNCTIONS
# Methods only tensors have: calling one proves the receiver (and the result) is a tensor.
# A Python number has none of the methods of torch's table; these also return a tensor.
TENSOR_ONLY_METHODS = methods(
    Category.UNARY,
    Category.BINARY,
    Category.CAST,
    Category.VIEW,
    Category.REPEAT,
    Category.ALONG_DIM,
    Category.REDUCTION,
    Category.MATMUL,
    Category.FACTORY,
)


# -- step values ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Sym:
    rank: int | None  # the rank of one step's value, when known


@dataclass(frozen=True, eq=False)
class Const(Sym):
    """A value that does not change over the loop: code evaluated where the loop was."""

    node: cst.BaseExpression = field(repr=False)
    kind: str  # "number", "tensor" or "unknown"


@dataclass(frozen=True, eq=False)
class Timed(Sym):
    """`tensor` indexed by the step at dim `time` (from the left if >= 0, else from the right)."""

    tensor: cst.BaseExpression = field(repr=False)
    time: int
    size: str | None  # the code of the tensor's size at that dim, when known
    key: object = None  # the tensor's rank key (tensor_layout.Layouts.rank_key) when its rank is not known


@dataclass(frozen=True, eq=False)
class Prev(Sym):
    state: str


@dataclass(frozen=True, eq=False)
class New(Sym):
    state: str


@dataclass(frozen=True, eq=False)
class Read(Sym):
    """What a linear-attention kernel computes for `state` at each step: r_t S over the key dim."""

    state: str


@dataclass(frozen=True, eq=False)
class Op(Sym):
    op: str
    args: tuple
    params: tuple = ()
    node: cst.CSTNode | None = field(default=None, repr=False)  # the code it was read from


ONE = Const(None, cst.Integer("1"), "number")


def mentions(sym: Sym, predicate: Callable[[Sym], bool]) -> bool:
    if predicate(sym):
        return True
    return isinstance(sym, Op) and any(mentions(a, predicate) for a in sym.args)


def states_in(sym: Sym) -> set[tuple[str, str]]:
    """(state, "prev" | "new" | "read") pairs a value depends on."""
    found = set()

    def walk(s):
        if isinstance(s, Prev):
            found.add((s.state, "prev"))
        elif isinstance(s, New):
            found.add((s.state, "new"))
        elif isinstance(s, Read):
            found.add((s.state, "read"))
        elif isinstance(s, Op):
            for a in s.args:
                walk(a)

    walk(sym)
    return found


# -- the loop ------------------------------------------------------------------------------


@dataclass
class Output:
    kind: str  # "list" (appended, stacked after the loop) or "slot" (`out[:, t] = ...`)
    name: str
    value: Sym
    statement: cst.CSTNode = field(repr=False)  # the append or the slot assignment in the loop
    slot: cst.Subscript | None = field(default=None, repr=False)  # the target of a slot assignment
    slot_time: int | None = None  # the dim the slot indexes by time


@dataclass
class State:
    name: str
    update: Sym  # its new value in terms of Prev(name) and other step values
    a: Sym | None = None  # S_new = a * S_prev + x (None: 0)
    x: Sym | None = None
    statement: cst.CSTNode | None = field(default=None, repr=False)
    # A state kept in the slots of a tensor (`h[:, t] = h[:, t - 1] * w + ...`): its value
    # before the first step, the slot before it (None: the name's own value).
    initial: cst.BaseExpression | None = field(default=None, repr=False)


@dataclass
class Steps:
    """Which steps the loop runs: `range(stop)`, `range(start, stop)`, or every step of the
    iterated tensors."""

    start: cst.BaseExpression | None
    stop: cst.BaseExpression | None  # None: all of the tensors' time dim
    reverse: bool = False  # `reversed(range(...))`: from the last step to the first


@dataclass
class TimeLoop:
    loop: cst.For
    time: str | None  # the step variable (`t`), if any
    steps: Steps
    states: dict[str, State] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)
    temporaries: set[str] = field(default_factory=set)
    bound: set[str] = field(default_factory=set)  # every name the loop binds


class LoopReader:
    """Reads one `for` loop into a TimeLoop, or raises Unsupported (why), or returns None
    when the loop is not over time at all."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.layouts = layouts(context)
        self.names = context.names
        self.code = context.module.code_for_node
        self.slot_states: dict[str, tuple[cst.BaseExpression, int, cst.BaseExpression]] = {}

    # -- the header ------------------------------------------------------------------

    def header(self, loop: cst.For) -> tuple[str | None, Steps, dict[str, Sym]] | None:
        """(step variable, steps, loop targets bound to time-indexed tensors), or None."""
        target, iterable = loop.target, loop.iter
        reverse = _reversed_range(iterable, self.names)
        if reverse is not None and isinstance(target, cst.Name):
            args = list(reverse.args)
            if any(a.keyword or a.star for a in args) or not 1 <= len(args) <= 2:
                return None
            start, stop = (None, args[0].value) if len(args) == 1 else (args[0].value, args[1].value)
            return target.value, Steps(start, stop, reverse=True), {}
        if (
            isinstance(iterable, cst.Call)
            and self.names.is_(iterable.func, "builtins.range")
            and isinstance(target, cst.Name)
        ):
            args = [a for a in iterable.args]
            if any(a.keyword or a.star for a in args) or not 1 <= len(args) <= 2:
                return None
            if len(args) == 1:
                return target.value, Steps(None, args[0].value), {}
            return target.value, Steps(args[0].value, args[1].value), {}
        time = None
        if (
            isinstance(iterable, cst.Call)
            and self.names.is_(iterable.func, "builtins.enumerate")
            and len(iterable.args) == 1
            and isinstance(target, cst.Tuple)
            and len(target.elements) == 2
            and isinstance(target.elements[0].value, cst.Name)
        ):
            time = target.elements[0].value.value
            target, iterable = target.elements[1].value, iterable.args[0].value
        pairs = self._iterated(target, iterable)
        if pairs is None:
            return None
        bound = {}
        for name, tensor, dim in pairs:
            shape = self.layouts.shape(tensor)
            size = None
            if shape is not None:
                position = dim if dim >= 0 else len(shape) + dim
                size = shape[position] if 0 <= position < len(shape) else None
            rank = None if shape is None else len(shape) - 1
            bound[name] = Timed(rank, tensor, dim, size, None if rank is not None else self.layouts.rank_key(tensor))
        return time, Steps(None, None), bound

    def _iterated(self, target, iterable) -> list[tuple[str, cst.BaseExpression, int]] | None:
        """(name, tensor, time dim) for `x_t in x.unbind(d)` / `x` / `zip(...)` of these."""
        if isinstance(iterable, cst.Call) and self.names.is_(iterable.func, "builtins.zip"):
            if not isinstance(target, cst.Tuple) or len(target.elements) != len(iterable.args):
                return None
            found = []
            for element, arg in zip(target.elements, iterable.args):
                inner = self._iterated(element.value, arg.value)
                if inner is None or arg.keyword or arg.star:
                    return None
                found += inner
            return found
        if not isinstance(target, cst.Name):
            return None
        if (
            isinstance(iterable, cst.Call)
            and isinstance(iterable.func, cst.Attribute)
            and iterable.func.attr.value == "unbind"
            and len(iterable.args) <= 1
        ):
            dim = integer_value(iterable.args[0].value) if iterable.args else 0
            if dim is None or (
                iterable.args and iterable.args[0].keyword not in (None,) and iterable.args[0].keyword.value != "dim"
            ):
                return None
            return [(target.value, iterable.func.value, dim)]
        if isinstance(iterable, cst.Call) and self.names.is_(iterable.func, "torch.unbind"):
            tensor = positional(iterable, 0)
            dim_arg = positional(iterable, 1) or kwarg(iterable, "dim")
            dim = integer_value(dim_arg.value) if dim_arg is not None else 0
            if tensor is None or dim is None:
                return None
            return [(target.value, tensor.value, dim)]
        shape = self.layouts.shape(iterable)
        if shape is not None and len(shape) >= 1:
            return [(target.value, iterable, 0)]  # a tensor iterates over its dim 0
        return None

    # -- the body ----------------------------------------------------------------------

    def read(self, loop: cst.For) -> TimeLoop | None:
        header = self.header(loop)
        if header is None:
            return None
        time, steps, targets = header
        self.time = time
        self.reverse = steps.reverse
        self.loop = loop
        result = TimeLoop(loop, time, steps)
        if loop.orelse is not None:
            raise Unsupported("the loop has an `else` clause")
        if not isinstance(loop.body, cst.IndentedBlock):
            raise Unsupported("the loop body is on the loop's line")
        statements = []
        for line in loop.body.body:
            if not isinstance(line, cst.SimpleStatementLine):
                raise Unsupported(f"the loop body holds a `{type(line).__name__.lower()}` statement")
            statements.extend(line.body)
        assigned = self._assigned(statements)
        result.bound = set(assigned) | set(targets) | ({time} if time else set())
        self.bound = result.bound
        first_read = self._first_reads(statements)
        self.env: dict[str, Sym] = dict(targets)
        states = {name for name in assigned if name in first_read and first_read[name] <= assigned[name][0]}
        self.rank_hints = self._rank_hints(loop)
        for name in states:
            if len(assigned[name]) > 1:
                raise Unsupported(f"the state `{name}` is assigned more than once in a step")
            if not self._bound_before(name, loop):
                raise Unsupported(f"`{name}` is read before it is assigned in the loop and not bound before it")
            self.env[name] = Prev(self._state_rank(name, loop), name)
        result.temporaries = set(assigned) - states
        self.slot_states = self._slot_states(statements, steps)
        for name, (tensor, _dim, _initial) in self.slot_states.items():
            if not self._bound_before(name, loop):
                raise Unsupported(f"`{name}` is read before it is assigned in the loop and not bound before it")
            self.env[name] = Prev(plus(self.layouts.rank(tensor), -1), name)
        for statement in statements:
            self._statement(statement, result, states)
        for state in result.states.values():
            split = affine(state.update, state.name)
            if split is None:
                raise Unsupported(f"the update of `{state.name}` is not linear in it (`{self.code(state.statement)}`)")
            state.a, state.x = split
            if state.a is not None and mentions(
                state.a, lambda s, name=state.name: isinstance(s, (Prev, New)) and s.state == name
            ):
                raise Unsupported(f"the update of `{state.name}` is not linear in it")
        return result

    def _state_rank(self, name: str, loop: cst.For) -> int | None:
        """The rank of a state: from an einsum that reads it, or from its value before the loop."""
        if name in self.rank_hints:
            return self.rank_hints[name]
        block = self.context.parents.get(loop)
        statements = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        position = next((i for i, s in enumerate(statements) if s is loop), 0)
        for statement in reversed(statements[:position]):
            if not isinstance(statement, cst.SimpleStatementLine):
                if name in self.context.bound_in(statement):
                    return None
                continue
            for small in reversed(statement.body):
                if (
                    isinstance(small, cst.Assign)
                    and len(small.targets) == 1
                    and isinstance(small.targets[0].target, cst.Name)
                    and small.targets[0].target.value == name
                ):
                    return self.layouts.rank(small.value)
                if name in self.context.bound_in(small):
                    return None
        return None

    def _rank_hints(self, loop: cst.For) -> dict[str, int]:
        """Ranks the loop's einsums prove: `einsum("bhk,...", r[:, :, t], ...)` makes r 4-dim."""
        hints: dict[str, int] = {}
        for call in self.context.index.find(cst.Call, within=loop.body):
            if (
                not self.names.is_(call.func, "torch.einsum")
                or not call.args
                or not isinstance(call.args[0].value, cst.SimpleString)
            ):
                continue
            spec = Spec.parse(call.args[0].value.evaluated_value)
            if spec is None or len(spec.inputs) != len(call.args) - 1:
                continue
            for letters, arg in zip(spec.inputs, call.args[1:]):
                value = arg.value
                if "." not in letters and isinstance(value, cst.Name):
                    hints[value.value] = len(letters)
                    continue
                if "." in letters or not isinstance(value, cst.Subscript) or self.time is None:
                    continue
                elements = list(value.slice)
                dropped = sum(
                    1
                    for e in elements
                    if _is_step(e, self.time)
                    or (isinstance(e.slice, cst.Index) and integer_value(e.slice.value) is not None)
                )
                added = sum(1 for e in elements if _is_none(e))
                if any(_is_ellipsis(e) for e in elements) or dropped != 1:
                    continue
                hints[self.code(value.value)] = len(letters) + dropped - added
        return hints

    def _assigned(self, statements) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for position, statement in enumerate(statements):
            if isinstance(statement, cst.Assign):
                for target in statement.targets:
                    for name in _target_names(target.target):
                        found.setdefault(name, []).append(position)
            elif isinstance(statement, (cst.AugAssign, cst.AnnAssign)) and isinstance(statement.target, cst.Name):
                found.setdefault(statement.target.value, []).append(position)
        return found

    def _first_reads(self, statements) -> dict[str, int]:
        found: dict[str, int] = {}
        for position, statement in enumerate(statements):
            names = read_names(self.context, statement)
            if isinstance(statement, cst.AugAssign) and isinstance(statement.target, cst.Name):
                names.add(statement.target.value)
            for name in names:
                found.setdefault(name, position)
        return found

    def _bound_before(self, name: str, loop: cst.For) -> bool:
        """Does a value bound before `loop` reach its reads of `name` (`Kinds.reaching`)?"""
        kinds, index = self.context.kinds, self.context.index
        return any(
            not index.inside(binding.node, loop)
            for read in names_read(loop.body)
            if read.value == name
            for binding in kinds.reaching(read)
        )

    def _statement(self, statement, result: TimeLoop, states: set[str]) -> None:
        if isinstance(statement, cst.Assign):
            self._assign(statement, result, states)
        elif isinstance(statement, cst.AugAssign) and isinstance(statement.target, cst.Name):
            self._augmented_assign(statement, result, states)
        elif _appended_value(statement) is not None:
            self._append(statement, result)
        else:
            raise Unsupported(f"the loop body runs `{self.code(statement)}`")

    def _assign(self, statement: cst.Assign, result: TimeLoop, states: set[str]) -> None:
        if len(statement.targets) != 1:
            raise Unsupported("a chained assignment in the loop")
        target = statement.targets[0].target
        if _unpacks_names(target, statement.value):
            values = [self.sym(e.value) for e in statement.value.elements]  # all read before any is bound
            for element, value in zip(target.elements, values):
                if element.value.value in states:
                    raise Unsupported(f"the state `{element.value.value}` is assigned in a tuple")
                self.env[element.value.value] = value
        elif isinstance(target, cst.Name):
            self._bind(target.value, self.sym(statement.value), statement, result, states)
        elif isinstance(target, cst.Subscript):
            self._slot_write(target, statement, result)
        else:
            raise Unsupported(f"the loop assigns `{self.code(target)}`")

    def _augmented_assign(self, statement: cst.AugAssign, result: TimeLoop, states: set[str]) -> None:
        """`h += x` (`-=`, `*=`, `/=`), read as `h = h + x`."""
        operation = _AUGMENTED_OPERATIONS.get(type(statement.operator))
        if operation is None:
            raise Unsupported(f"`{self.code(statement)}` in the loop")
        operator, op = operation
        name = statement.target.value
        node = cst.BinaryOperation(cst.Name(name), operator(), atom(statement.value))
        args = (self.env.get(name) or self.sym(statement.target), self.sym(statement.value))
        self._bind(name, Op(_broadcast_rank(args), op, args, (), node), statement, result, states)

    def _bind(self, name: str, value: Sym, statement, result: TimeLoop, states: set[str]) -> None:
        """`name = value` in the step: a state's update, read after it as the state's new value."""
        if name not in states:
            self.env[name] = value
            return
        result.states[name] = State(name, value, statement=statement)
        prev = self.env[name]
        self.env[name] = New(prev.rank if prev.rank is not None else value.rank, name)

    def _slot_write(self, target: cst.Subscript, statement: cst.Assign, result: TimeLoop) -> None:
        """`out[:, t] = value`: an output written into the step's slot, or the update of a
        state kept in the slots."""
        slot = self._slot(target)
        if slot is None:
            raise Unsupported(f"the loop writes `{self.code(target)}`, not a slot of a tensor at the step")
        name, dim = slot
        value = self.sym(statement.value)
        if name in self.slot_states:
            if name in result.states:
                raise Unsupported(f"the state `{name}` is written more than once in a step")
            initial = self.slot_states[name][2]
            result.states[name] = State(name, value, statement=statement, initial=initial)
            value = New(self.env[name].rank, name)
        result.outputs.append(Output("slot", name, value, statement, target, dim))

    def _append(self, statement: cst.Expr, result: TimeLoop) -> None:
        """`outs.append(value)`: an output collected into a list, once a step."""
        name = statement.value.func.value.value
        if any(o.name == name for o in result.outputs):
            raise Unsupported(f"`{name}` is appended to twice in a step")
        result.outputs.append(Output("list", name, self.sym(_appended_value(statement)), statement))

    def _slot(self, target: cst.Subscript) -> tuple[str, int] | None:
        """(name, dim) for `out[:, t] = ...` / `out[t] = ...` (leading full slices, then the step)."""
        if self.time is None or not isinstance(target.value, cst.Name) or target.value.value in self.bound:
            return None
        elements = list(target.slice)
        for position, element in enumerate(elements):
            if _is_step(element, self.time):
                if all(_is_full(e) for e in elements[:position]) and all(_is_full(e) for e in elements[position + 1 :]):
                    return target.value.value, position
                return None
        return None

    def _slot_states(self, statements, steps: Steps) -> dict[str, tuple[cst.BaseExpression, int, cst.BaseExpression]]:
        """Tensors whose slot at the step is written from their slot at the step before
        (`h[:, t] = h[:, t - 1] * w + x[:, t]`; `h[:, t + 1]` in a loop that runs backwards):
        name -> (the tensor, the slot dim, the slot before the first step, copied so that
        writing the slots leaves it as it was)."""
        found = {}
        for statement in statements:
            if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1):
                continue
            target = statement.targets[0].target
            slot = self._slot(target) if isinstance(target, cst.Subscript) else None
            if slot is None:
                continue
            name, dim = slot
            reads = [
                node
                for node in self.context.index.find(cst.Subscript, within=statement.value)
                if isinstance(node.value, cst.Name) and node.value.value == name
            ]
            if reads and all(self._previous_slot(node, dim, steps.reverse) for node in reads):
                if steps.reverse:  # backwards, the first step is stop - 1: the slot before it is stop's
                    index = steps.stop
                else:
                    start = steps.start if steps.start is not None else cst.Integer("0")
                    before = integer_value(start)
                    index = (
                        integer_literal(before - 1)
                        if before is not None
                        else cst.BinaryOperation(atom(start), cst.Subtract(), cst.Integer("1"))
                    )
                elements = [cst.SubscriptElement(cst.Slice(lower=None, upper=None))] * dim + [
                    cst.SubscriptElement(cst.Index(index))
                ]
                slot_before = method(cst.Subscript(cst.Name(name), separated(elements)), "clone")
                found[name] = (target.value, dim, slot_before)
        return found

    def _previous_slot(self, node: cst.Subscript, dim: int, reverse: bool) -> bool:
        """Is `node` the slot at the step before, `h[:, t - 1]` (`h[:, t + 1]` where the loop
        runs backwards), with time at `dim`?"""
        elements = list(node.slice)
        if len(elements) != dim + 1 or not all(_is_full(e) for e in elements[:dim]):
            return False
        index = elements[dim].slice
        return (
            isinstance(index, cst.Index)
            and isinstance(index.value, cst.BinaryOperation)
            and isinstance(index.value.operator, cst.Add if reverse else cst.Subtract)
            and isinstance(index.value.left, cst.Name)
            and index.value.left.value == self.time
            and integer_value(index.value.right) == 1
        )

    # -- expressions -------------------------------------------------------------------

    def depends(self, node: cst.CSTNode) -> bool:
        return not self.bound.isdisjoint(read_names(self.context, node))

    def sym(self, node: cst.BaseExpression) -> Sym:
        if not self.depends(node):
            return self.constant(node)
        if isinstance(node, cst.Name):
            if node.value == self.time:
                raise Unsupported(f"the step number `{node.value}` is used as a value")
            found = self.env.get(node.value)
            if found is None:
                raise Unsupported(f"`{node.value}` is read before it is assigned in the step")
            return found
        if isinstance(node, cst.BinaryOperation):
            return self._binary(node)
        if isinstance(node, cst.UnaryOperation):
            if isinstance(node.operator, cst.Plus):
                return self.sym(node.expression)
            if isinstance(node.operator, cst.Minus):
                inner = self.sym(node.expression)
                return Op(inner.rank, "neg", (inner,), (), node)
            raise Unsupported(f"`{self.code(node)}`")
        if isinstance(node, cst.Subscript):
            return self._subscript(node)
        if isinstance(node, cst.Attribute):
            if node.attr.value == "mT":
                inner = self.sym(node.value)
                return _transpose(inner, -2, -1, node)
            raise Unsupported(f"`{self.code(node)}` on a step value")
        if isinstance(node, cst.Call):
            return self._call(node)
        raise Unsupported(f"`{self.code(node)}` in the loop")

    def constant(self, node: cst.BaseExpression) -> Const:
        for call in [node] if node not in self.context.index else self.context.index.find(cst.Call, within=node):
            if isinstance(call, cst.Call) and self._random(call):
                raise Unsupported(f"`{self.code(call)}` draws random numbers at each step")
        if self.layouts.is_number(node):
            return Const(0, node, "number")
        shape = self.layouts.shape(node)
        if shape is not None:
            return Const(len(shape), node, "tensor")
        if self._is_tensor(node):
            return Const(None, node, "tensor")
        return Const(None, node, "unknown")

    def _is_tensor(self, node) -> bool:
        from codemod.analysis.values import Kind

        if self.context.kinds.fact(node).kind is Kind.TENSOR:
            return True
        if isinstance(node, cst.Call):
            names = self.names.of(node.func) if is_dotted_name(node.func) else set()
            if any(n.startswith("torch.") and not n.startswith("torch.nn.") for n in names):
                return True
            if isinstance(node.func, cst.Attribute) and node.func.attr.value in TENSOR_ONLY_METHODS:
                return True  # a number has no such method
        if isinstance(node, cst.UnaryOperation):
            return self._is_tensor(node.expression)
        if isinstance(node, cst.BinaryOperation):
            return self._is_tensor(node.left) or self._is_tensor(node.right)
        if isinstance(node, cst.Subscript):
            if any(_is_none(e) or isinstance(e.slice, cst.Slice) for e in node.slice):
                return True  # a number cannot be sliced or given new dims
            return self._is_tensor(node.value)
        if isinstance(node, cst.Name) and node in self.context.index:
            value = self.layouts.value_of(node)
            return value is not None and self._is_tensor(value)
        if isinstance(node, cst.Attribute):
            values = self.context.kinds.attribute_values(node)
            return bool(values) and all(
                isinstance(v, cst.Call)
                and self.names.of(v.func) & {"torch.nn.Parameter", "torch.nn.parameter.Parameter"}
                or self._is_tensor_value(v)
                for v in values
            )
        return False

    def _is_tensor_value(self, value) -> bool:
        return isinstance(value, cst.Call) and any(
            n.startswith("torch.") and not n.startswith("torch.nn.") for n in self.names.of(value.func)
        )

    def _random(self, call: cst.Call) -> bool:
        if self.names.of(call.func) & RANDOM_FUNCTIONS:
            return True
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in RANDOM_METHODS:
            return True
        module = self.context.kinds.attribute_value(call.func) if isinstance(call.func, cst.Attribute) else None
        return isinstance(module, cst.Call) and bool(
            self.names.of(module.func) & {"torch.nn.Dropout", "torch.nn.modules.dropout.Dropout"}
        )

    def _binary(self, node: cst.BinaryOperation) -> Sym:
        ops = {
            cst.Add: "add",
            cst.Subtract: "sub",
            cst.Multiply: "mul",
            cst.Divide: "div",
            cst.MatrixMultiply: "matmul",
        }
        if isinstance(node.operator, cst.Power):
            base = self.sym(node.left)
            if self.depends(node.right) or not self.layouts.is_number(node.right):
                raise Unsupported(f"`{self.code(node)}`: a power whose exponent is not a number")
            return Op(base.rank, "map", (base,), ("left",), node)
        op = ops.get(type(node.operator))
        if op is None:
            raise Unsupported(f"`{self.code(node)}` in the loop")
        left, right = self.sym(node.left), self.sym(node.right)
        if op == "matmul":
            return _matmul(left, right, node)
        return Op(_broadcast_rank((left, right)), op, (left, right), (), node)

    def _subscript(self, node: cst.Subscript) -> Sym:
        elements = list(node.slice)
        if isinstance(node.value, cst.Name) and node.value.value in self.slot_states:
            if not self._previous_slot(node, self.slot_states[node.value.value][1], self.reverse):
                raise Unsupported(f"`{self.code(node)}`: the loop reads its slots other than the step before")
            return self.env[node.value.value]  # the slot before is as it was, written or not
        steps = [i for i, e in enumerate(elements) if self.time is not None and _mentions_step(e, self.time, self.code)]
        if steps:
            if len(steps) != 1 or self.depends(node.value):
                raise Unsupported(f"`{self.code(node)}`: the step indexes a value computed in the loop")
            return self._timed(node, elements, steps[0])
        inner = self.sym(node.value)
        return _index(inner, elements, node, self.code)

    def _timed(self, node: cst.Subscript, elements, at: int) -> Sym:
        tensor = node.value
        element = elements[at]
        keep = not _is_step(element, self.time)
        if keep and not _is_step_slice(element, self.time, self.code):
            raise Unsupported(f"`{self.code(node)}`: the step indexes other than [t] or [t:t + 1]")
        before, after = elements[:at], elements[at + 1 :]
        shape = self.layouts.shape(tensor)
        if all(_is_full(e) for e in before):
            time = at
            rest = [*before, *after]
        elif (
            len(before) >= 1
            and _is_ellipsis(before[0])
            and all(_is_full(e) for e in before[1:])
            and all(_is_full(e) for e in after)
        ):
            time = -1 - len(after)
            rest = []
        else:
            raise Unsupported(f"`{self.code(node)}`: indexes before the step other than `:`")
        size = None
        rank = None
        if shape is None and self.code(tensor) in self.rank_hints:
            shape = (None,) * self.rank_hints[self.code(tensor)]
        if shape is not None:
            position = time if time >= 0 else len(shape) + time
            if not 0 <= position < len(shape):
                raise Unsupported(f"`{self.code(node)}` indexes past the tensor's dims")
            size = shape[position]
            rank = len(shape) - 1
        leaf = Timed(rank, tensor, time, size, None if rank is not None else self.layouts.rank_key(tensor))
        value: Sym = leaf
        if keep:  # x[:, t:t + 1]: the step's value keeps a dim of size 1 where time was
            value = _unsqueeze(leaf, time if time >= 0 else None, node, negative=time if time < 0 else None)
        if rest and not all(_is_full(e) for e in rest):
            value = _index(value, rest, node, self.code)
        return value

    def _call(self, node: cst.Call) -> Sym:
        func = node.func
        names = self.names.of(func) if is_dotted_name(func) else set()
        torch_name = next((n for n in sorted(names) if n.startswith("torch.")), None)
        if self._random(node):
            raise Unsupported(f"`{self.code(node)}` draws random numbers at each step")
        if any(a.star for a in node.args):
            raise Unsupported(f"`{self.code(node)}` passes *args")
        if torch_name is not None:
            return self._torch_call(node, torch_name)
        if isinstance(func, cst.Attribute) and self.depends(func.value):
            return self._method(node, func.attr.value, func.value)
        module = (
            self.context.kinds.attribute_value(func)
            if isinstance(func, cst.Attribute)
            else (self.layouts.value_of(func) if isinstance(func, cst.Name) and func in self.context.index else None)
        )
        if isinstance(module, cst.Call) and len(node.args) == 1 and node.args[0].keyword is None:
            kinds = self.names.of(module.func)
            operand = self.sym(node.args[0].value)
            if kinds & LAST_DIM_MODULES:
                return Op(operand.rank, "last_dim", (operand,), (), node)
            if kinds & ELEMENTWISE_MODULES:
                return Op(operand.rank, "map", (operand,), ("arg0",), node)
        raise Unsupported(f"`{self.code(func)}` is called on a step value")

    def _constant_args(self, node: cst.Call, skip: cst.BaseExpression) -> None:
        for arg in node.args:
            if arg.value is not skip and self.depends(arg.value):
                raise Unsupported(f"`{self.code(node)}`: another argument changes over the loop")

    def _method(self, node: cst.Call, method: str, receiver) -> Sym:
        inner = self.sym(receiver)
        values = [a.value for a in node.args if a.keyword is None]
        if method in ("mul", "add", "sub", "div") and len(node.args) == 1 and node.args[0].keyword is None:
            other = self.sym(values[0])
            return Op(_broadcast_rank((inner, other)), method, (inner, other), (), node)
        if method in BROADCAST_PRODUCT_METHODS and len(values) == 1:
            return _matmul(inner, self.sym(values[0]), node)
        if method in ELEMENTWISE_METHODS:
            self._constant_args(node, receiver)
            if method in ("contiguous", "clone"):
                return inner
            return Op(inner.rank, "map", (inner,), ("receiver",), node)
        if method == "unsqueeze" and len(values) == 1:
            dim = integer_value(values[0])
            if dim is None:
                raise Unsupported(f"`{self.code(node)}`")
            return _unsqueeze(inner, dim if dim >= 0 else None, node, negative=dim if dim < 0 else None)
        if method == "squeeze" and len(values) == 1 and integer_value(values[0]) is not None:
            return Op(plus(inner.rank, -1), "squeeze", (inner,), (integer_value(values[0]),), node)
        if method in ("transpose", "swapaxes", "swapdims") and len(values) == 2:
            a, b = (integer_value(v) for v in values)
            if a is None or b is None:
                raise Unsupported(f"`{self.code(node)}`")
            return _transpose(inner, a, b, node)
        if method in REDUCTIONS:
            return self._reduction(node, inner, method)
        if method in ("softmax", "log_softmax") and len(node.args) == 1:
            dim = integer_value(node.args[0].value)
            if dim is None:
                raise Unsupported(f"`{self.code(node)}`")
            return Op(inner.rank, "dimwise", (inner,), (dim, "receiver"), node)
        if method == "lerp" and len(values) == 2:
            return _lerp(inner, self.sym(values[0]), self.sym(values[1]))
        if method in RESHAPING_METHODS | REORDERING_METHODS | SQUEEZING_METHODS | SPLITTING_METHODS:
            raise Unsupported(f"`{self.code(node)}` reshapes a step value")
        raise Unsupported(f"`.{method}()` on a step value")

    def _reduction(self, node: cst.Call, inner: Sym, method: str, skip_first: bool = False) -> Sym:
        args = list(node.args)[1:] if skip_first else list(node.args)
        dim_arg = next((a for a in args if a.keyword is None), None) or kwarg(node, "dim")
        keep = kwarg(node, "keepdim")
        extra = [a for a in args if a is not dim_arg and a is not keep]
        if dim_arg is None or extra:
            raise Unsupported(f"`{self.code(node)}` reduces over every dim")
        values = (
            [e.value for e in dim_arg.value.elements]
            if isinstance(dim_arg.value, (cst.Tuple, cst.List))
            else [dim_arg.value]
        )
        dims = [integer_value(v) for v in values]
        keepdim = keep is not None and isinstance(keep.value, cst.Name) and keep.value.value == "True"
        if None in dims or (
            keep is not None and not (isinstance(keep.value, cst.Name) and keep.value.value in ("True", "False"))
        ):
            raise Unsupported(f"`{self.code(node)}`")
        rank = inner.rank if keepdim else plus(inner.rank, -len(dims))
        return Op(rank, "reduce", (inner,), (tuple(dims), keepdim, method, skip_first), node)

    def _torch_call(self, node: cst.Call, name: str) -> Sym:
        values = [a.value for a in node.args if a.keyword is None]
        if name == "torch.einsum":
            return self._einsum(node, values)
        if name in BROADCAST_PRODUCT_FUNCTIONS and len(values) == 2 and len(node.args) == 2:
            return _matmul(self.sym(values[0]), self.sym(values[1]), node)
        if name == "torch.outer" and len(values) == 2:
            return self._outer_product(node, values)
        if name in ELEMENTWISE_FUNCTIONS and values:
            inner = self.sym(values[0])
            self._constant_args(node, values[0])
            return Op(inner.rank, "map", (inner,), ("arg0",), node)
        short = name.rsplit(".", 1)[1]
        read = self._TORCH_FUNCTIONS.get(short)
        if read is None or not values:
            raise Unsupported(f"`{self.code(node.func)}` on a step value")
        return read(self, node, short, values)

    def _einsum(self, node: cst.Call, values: list[cst.BaseExpression]) -> Sym:
        if not values or not isinstance(values[0], cst.SimpleString) or len(node.args) != len(values):
            raise Unsupported(f"`{self.code(node)}`: an einsum whose equation is not a string literal")
        spec = Spec.parse(values[0].evaluated_value)
        if spec is None or len(spec.inputs) != len(values) - 1:
            raise Unsupported(f"`{self.code(node)}`: an einsum equation without `->` or with other operands")
        operands = tuple(self.sym(v) for v in values[1:])
        for letters, operand in zip(spec.inputs, operands):
            if "." not in letters and operand.rank is not None and operand.rank != len(letters):
                raise Unsupported(f"`{self.code(node)}`: an operand has another rank than its letters")
        rank = None if spec.has_ellipsis else len(spec.output)
        return Op(rank, "einsum", operands, (spec,), node)

    def _outer_product(self, node: cst.Call, values: list[cst.BaseExpression]) -> Sym:
        """`torch.outer(a, b)` of two vectors: a[:, None] * b[None, :]."""
        left, right = self.sym(values[0]), self.sym(values[1])
        if left.rank not in (1, None) or right.rank not in (1, None):
            raise Unsupported(f"`{self.code(node)}` of values that are not vectors")
        left, right = Op(2, "unsqueeze", (left,), (-1,), None), Op(2, "unsqueeze", (right,), (-2,), None)
        return Op(2, "mul", (left, right), (), None)

    def _reduction_function(self, node: cst.Call, short: str, values: list[cst.BaseExpression]) -> Sym:
        """`torch.sum(x, dim)`: the reduction of its first argument."""
        return self._reduction(node, self.sym(values[0]), short, skip_first=True)

    def _softmax_function(self, node: cst.Call, short: str, values: list[cst.BaseExpression]) -> Sym:
        """`torch.softmax(x, dim)` (`log_softmax`): along one dim of its first argument."""
        inner = self.sym(values[0])
        dim_arg = positional(node, 1) or kwarg(node, "dim")
        dim = integer_value(dim_arg.value) if dim_arg is not None else None
        if dim is None or len(node.args) != 2:
            raise Unsupported(f"`{self.code(node)}`")
        return Op(inner.rank, "dimwise", (inner,), (dim, "arg0"), node)

    def _lerp_function(self, node: cst.Call, short: str, values: list[cst.BaseExpression]) -> Sym:
        if len(values) != 3:
            raise Unsupported(f"`{self.code(node.func)}` on a step value")
        return _lerp(self.sym(values[0]), self.sym(values[1]), self.sym(values[2]))

    def _as_method(self, node: cst.Call, short: str, values: list[cst.BaseExpression]) -> Sym:
        """`torch.unsqueeze(x, d)` read as `x.unsqueeze(d)`."""
        rest = node.with_changes(
            func=cst.Attribute(atom(values[0]), cst.Name(short)),
            args=[a for a in node.args if a.value is not values[0]],
        )
        return self._method(rest, short, values[0])

    # torch functions of a step value by their name without the module, beside the
    # products and elementwise functions
    _TORCH_FUNCTIONS = {
        **dict.fromkeys(REDUCTIONS, _reduction_function),
        "softmax": _softmax_function,
        "log_softmax": _softmax_function,
        "lerp": _lerp_function,
        **dict.fromkeys(("unsqueeze", "transpose", "squeeze"), _as_method),
    }


# -- helpers for reading -------------------------------------------------------------------


# `h += x` as `h = h + x`: the operator and the op it reads as
_AUGMENTED_OPERATIONS = {
    cst.AddAssign: (cst.Add, "add"),
    cst.SubtractAssign: (cst.Subtract, "sub"),
    cst.MultiplyAssign: (cst.Multiply, "mul"),
    cst.DivideAssign: (cst.Divide, "div"),
}


def _unpacks_names(target: cst.BaseAssignTargetExpression, value: cst.BaseExpression) -> bool:
    """`a, b = x, y`: names bound, one from each element of a tuple of the same length."""
    return (
        isinstance(target, (cst.Tuple, cst.List))
        and isinstance(value, (cst.Tuple, cst.List))
        and len(target.elements) == len(value.elements)
        and all(isinstance(e.value, cst.Name) for e in target.elements)
        and not any(isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements))
    )


def _appended_value(statement) -> cst.BaseExpression | None:
    """`value` of a statement `name.append(value)`, else None."""
    call = statement.value if isinstance(statement, cst.Expr) else None
    if (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "append"
        and isinstance(call.func.value, cst.Name)
        and len(call.args) == 1
        and not call.args[0].keyword
    ):
        return call.args[0].value
    return None


def _reversed_range(iterable: cst.BaseExpression, names) -> cst.Call | None:
    """The `range(...)` of `reversed(range(...))`, or None."""
    if not (
        isinstance(iterable, cst.Call)
        and names.is_(iterable.func, "builtins.reversed")
        and len(iterable.args) == 1
        and iterable.args[0].keyword is None
        and not iterable.args[0].star
    ):
        return None
    inner = iterable.args[0].value
    return inner if isinstance(inner, cst.Call) and names.is_(inner.func, "builtins.range") else None


def _target_names(target) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []


def _is_full(element: cst.SubscriptElement) -> bool:
    s = element.slice
    return isinstance(s, cst.Slice) and s.lower is None and s.upper is None and s.step is None


def _is_ellipsis(element: cst.SubscriptElement) -> bool:
    return isinstance(element.slice, cst.Index) and isinstance(element.slice.value, cst.Ellipsis)


def _is_none(element: cst.SubscriptElement) -> bool:
    return (
        isinstance(element.slice, cst.Index)
        and isinstance(element.slice.value, cst.Name)
        and element.slice.value.value == "None"
    )


def _is_step(element: cst.SubscriptElement, time: str) -> bool:
    return (
        isinstance(element.slice, cst.Index)
        and isinstance(element.slice.value, cst.Name)
        and element.slice.value.value == time
    )


def _is_step_slice(element: cst.SubscriptElement, time: str, code) -> bool:
    """`t:t + 1` (any spacing, `1 + t` too)."""
    s = element.slice
    if not isinstance(s, cst.Slice) or s.step is not None or not isinstance(s.lower, cst.Name) or s.lower.value != time:
        return False
    upper = code(s.upper).replace(" ", "") if s.upper is not None else ""
    return upper in (f"{time}+1", f"1+{time}")


def _mentions_step(element: cst.SubscriptElement, time: str, code) -> bool:
    return (
        _is_step(element, time)
        or _is_step_slice(element, time, code)
        or (time in {n.value for n in _names_in(element)})
    )


def _names_in(node) -> list[cst.Name]:
    from codemod.analysis.names import names_read

    return names_read(node)


def plus(rank: int | None, delta: int) -> int | None:
    return None if rank is None else rank + delta


def _broadcast_rank(args) -> int | None:
    ranks = [a.rank for a in args]
    return None if None in ranks else max(ranks)


def _matmul_rank(a: int | None, b: int | None) -> int | None:
    if a is None or b is None:
        return None
    if a == 1 and b == 1:
        return 0
    if a == 1 or b == 1:
        return max(a, b) - 1
    return max(a, b)


def _matmul(left: Sym, right: Sym, node) -> Sym:
    return Op(_matmul_rank(left.rank, right.rank), "matmul", (left, right), (), node)


def _unsqueeze(inner: Sym, dim: int | None, node, negative: int | None = None) -> Sym:
    """`inner.unsqueeze(d)`, d given as a position from the left (`dim`) or the right (`negative`),
    kept as a negative dim when the rank is known."""
    if negative is None and dim is not None and inner.rank is not None:
        negative = dim - (inner.rank + 1)
    if negative is not None:
        return Op(plus(inner.rank, 1), "unsqueeze", (inner,), (negative,), node)
    return Op(plus(inner.rank, 1), "unsqueeze", (inner,), (dim,), node)


def _transpose(inner: Sym, a: int, b: int, node) -> Sym:
    if inner.rank is not None:
        a, b = (d - inner.rank if d >= 0 else d for d in (a, b))
    a, b = sorted((a, b))
    if a == -2 and b == -1 and isinstance(inner, Op) and inner.op == "unsqueeze" and inner.params[0] in (-1, -2):
        # (x.unsqueeze(-2)).mT is x.unsqueeze(-1), and the other way round
        return Op(inner.rank, "unsqueeze", inner.args, (-1 if inner.params[0] == -2 else -2,), node)
    return Op(inner.rank, "transpose", (inner,), (a, b), node)


def _index(inner: Sym, elements, node, code) -> Sym:
    """A step value indexed with `:`, `None`, `...` and slices with constant bounds: as
    unsqueezes and slices of one dim."""
    value = inner
    if any(not (isinstance(e.slice, cst.Slice) or _is_none(e) or _is_ellipsis(e)) for e in elements):
        raise Unsupported(f"`{code(node)}` indexes a step value")
    ellipses = [i for i, e in enumerate(elements) if _is_ellipsis(e)]
    if len(ellipses) > 1:
        raise Unsupported(f"`{code(node)}`")
    head = elements[: ellipses[0]] if ellipses else elements
    tail = elements[ellipses[0] + 1 :] if ellipses else []
    position = 0
    for element in head:
        if _is_none(element):
            value = _unsqueeze(value, position, node)
        elif not _is_full(element):
            value = _slice(value, position, element)
        position += 1
    if not ellipses and value.rank is not None and position > value.rank:
        raise Unsupported(f"`{code(node)}` indexes past the dims")
    if (
        not ellipses
        and isinstance(value, Op)
        and value.op == "unsqueeze"
        and value is not inner
        and value.params[0] >= 0
        and value.rank is None
    ):
        # every element addresses a dim: the value has at least as many dims as there are elements
        value = Op(value.rank, "unsqueeze", value.args, (value.params[0], position), value.node)
    count = 0
    for element in reversed(tail):
        if _is_none(element):
            value = _unsqueeze(value, None, node, negative=-(count + 1))
        elif not _is_full(element):
            value = _slice(value, -(count + 1), element)
        count += 1
    return value


def _slice(inner: Sym, dim: int, element: cst.SubscriptElement) -> Sym:
    if inner.rank is not None and dim >= 0:
        dim = dim - inner.rank
    return Op(inner.rank, "slice", (inner,), (dim, element.slice), None)


def _lerp(start: Sym, end: Sym, weight: Sym) -> Sym:
    """torch.lerp(start, end, weight) = start + weight * (end - start)."""
    diff = Op(_broadcast_rank((end, start)), "sub", (end, start), (), None)
    scaled = Op(_broadcast_rank((weight, diff)), "mul", (weight, diff), (), None)
    return Op(_broadcast_rank((start, scaled)), "add", (start, scaled), (), None)


# -- the affine split ----------------------------------------------------------------------


def affine(sym: Sym, state: str):
    """(a, x) with sym = a * Prev(state) + x, a and x free of the state (None for 0); or None
    when sym is not affine in the state."""

    def has(s):
        return mentions(s, lambda v: isinstance(v, Prev) and v.state == state)

    if isinstance(sym, Prev) and sym.state == state:
        return ONE, None
    if not has(sym):
        return None, sym
    if not isinstance(sym, Op):
        return None
    if sym.op in ("add", "sub"):
        left, right = (affine(a, state) for a in sym.args)
        if left is None or right is None:
            return None
        return _combine(sym, left[0], right[0]), _combine(sym, left[1], right[1])
    if sym.op in ("mul", "div"):
        left, right = sym.args
        if has(left) and not has(right):
            split = affine(left, state)
            if split is None:
                return None
            return tuple(None if part is None else _scaled(sym, part, right, first=True) for part in split)
        if sym.op == "mul" and has(right) and not has(left):
            split = affine(right, state)
            if split is None:
                return None
            return tuple(None if part is None else _scaled(sym, left, part, first=False) for part in split)
        return None
    if sym.op == "neg":
        split = affine(sym.args[0], state)
        if split is None:
            return None
        return tuple(None if part is None else Op(part.rank, "neg", (part,), (), sym.node) for part in split)
    return None


def _combine(sym: Op, left: Sym | None, right: Sym | None) -> Sym | None:
    if right is None:
        return left
    if left is None:
        if sym.op == "add":
            return right
        return Op(right.rank, "neg", (right,), (), None)
    return Op(_broadcast_rank((left, right)), sym.op, (left, right), (), None)


def _scaled(sym: Op, left: Sym, right: Sym, first: bool) -> Sym:
    if left is ONE and sym.op == "mul":
        return right
    if right is ONE:
        return left
    return Op(_broadcast_rank((left, right)), sym.op, (left, right), (), None)


def same(first: Sym | None, second: Sym | None, code) -> bool:
    """Do two step values compute the same thing (same structure, same code at the leaves)?"""
    if first is second:
        return True
    if first is None or second is None or type(first) is not type(second):
        return False
    if isinstance(first, Const):
        return code(first.node) == code(second.node)
    if isinstance(first, Timed):
        return code(first.tensor) == code(second.tensor) and first.time == second.time
    if isinstance(first, (Prev, New, Read)):
        return first.state == second.state
    if isinstance(first, Op):
        if first.op != second.op or len(first.args) != len(second.args):
            return False
        if first.op == "map":
            return code(first.node) == code(second.node)
        if first.params != second.params and first.op != "einsum":
            return False
        if first.op == "einsum" and first.params[0] != second.params[0]:
            return False
        if all(same(a, b, code) for a, b in zip(first.args, second.args)):
            return True
        if first.op in ("add", "mul") and len(first.args) == 2:
            return same(first.args[0], second.args[1], code) and same(first.args[1], second.args[0], code)
    return False


# -- lifting -------------------------------------------------------------------------------


class Lift(NamedTuple):
    """A step value over all steps: `code` is a tensor with time at dim `time` (from the left
    if >= 0, from the right if < 0), or a value that is the same at every step (`time`
    None, `kind` says whether a number or a tensor)."""

    code: cst.BaseExpression
    time: int | None
    rank: int | None  # the rank of one step's value
    kind: str = "tensor"
    key: object = None  # when the rank is not known: a key equal for values of equal rank

    @property
    def constant(self) -> bool:
        return self.time is None


def method(receiver: cst.BaseExpression, name: str, *args: cst.BaseExpression, **keywords) -> cst.Call:
    arguments = [cst.Arg(a) for a in args] + [
        cst.Arg(v, keyword=cst.Name(k), equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
        for k, v in keywords.items()
    ]
    arguments = separated(arguments)
    return cst.Call(cst.Attribute(atom(receiver), cst.Name(name)), arguments)


def moved(lift: Lift, destination: int) -> Lift:
    """`lift` with its time dim moved to `destination` (same sign conventions)."""
    if lift.time == destination:
        return lift
    if lift.rank is not None:
        total = lift.rank + 1
        source, target = lift.time % total, destination % total
        if source == target:
            return Lift(lift.code, destination, lift.rank)
        if abs(source - target) == 1:
            return Lift(
                method(
                    lift.code, "transpose", integer_literal(min(source, target)), integer_literal(max(source, target))
                ),
                destination,
                lift.rank,
            )
        return Lift(
            method(lift.code, "movedim", integer_literal(source), integer_literal(target)), destination, lift.rank
        )
    return Lift(
        method(lift.code, "movedim", integer_literal(lift.time), integer_literal(destination)), destination, lift.rank
    )


def to_right(lift: Lift) -> Lift:
    """Time counted from the right: free when the rank is known, else time moves to the last dim."""
    if lift.constant or lift.time < 0:
        return lift
    if lift.rank is not None:
        return Lift(lift.code, lift.time - (lift.rank + 1), lift.rank)
    return moved(lift, -1)


def to_left(lift: Lift) -> Lift:
    if lift.constant or lift.time >= 0:
        return lift
    if lift.rank is not None:
        return Lift(lift.code, lift.time + lift.rank + 1, lift.rank)
    return moved(lift, 0)


class Lifter:
    """Lifts step values of one loop; `states` gives the lifted Prev / New / Read values."""

    def __init__(
        self, context: FileContext, steps: Steps, time: str | None, states: dict[tuple[str, str], Lift]
    ) -> None:
        self.context = context
        self.code = context.module.code_for_node
        self.layouts = layouts(context)
        self.steps = steps
        self.time = time
        self.states = states
        self.letters_used: set[str] = set()

    def lift(self, sym: Sym) -> Lift:
        if isinstance(sym, Const):
            return Lift(sym.node, None, sym.rank, sym.kind)
        if isinstance(sym, Timed):
            return Lift(self._sliced(sym), sym.time, sym.rank, key=sym.key)
        if isinstance(sym, (Prev, New, Read)):
            key = (sym.state, {Prev: "prev", New: "new", Read: "read"}[type(sym)])
            if key not in self.states:
                raise Unsupported(f"the state `{sym.state}` is read in a way the kernel does not give")
            return self.states[key]
        return getattr(self, f"_lift_{sym.op}")(sym)

    # -- leaves ----------------------------------------------------------------------

    def _sliced(self, sym: Timed) -> cst.BaseExpression:
        """The tensor cut to the loop's steps along its time dim, unless they are all of it."""
        start, stop = self.steps.start, self.steps.stop
        if stop is None or (start is None and self._whole(sym, stop)):
            return sym.tensor
        bound = cst.Slice(lower=start, upper=stop)
        if sym.time >= 0:
            elements = [cst.SubscriptElement(cst.Slice(lower=None, upper=None))] * sym.time + [
                cst.SubscriptElement(bound)
            ]
        else:
            elements = [cst.SubscriptElement(cst.Index(cst.Ellipsis())), cst.SubscriptElement(bound)] + [
                cst.SubscriptElement(cst.Slice(lower=None, upper=None))
            ] * (-1 - sym.time)
        elements = separated(elements)
        return cst.Subscript(atom(sym.tensor), elements)

    def _whole(self, sym: Timed, stop: cst.BaseExpression) -> bool:
        size = sym.size if sym.size is not None else f"{self.code(sym.tensor)}.shape[{sym.time}]"
        return self.layouts.same_size(stop, size)

    # -- broadcasting ------------------------------------------------------------------

    def _align(self, lifts: list[Lift]) -> list[Lift]:
        """Operands of one broadcast with their time dims on the same dim, constants given
        a dim of size 1 there where they reach it."""
        timed = [l for l in lifts if not l.constant]
        if not timed:
            return lifts
        if (
            all(l.time >= 0 for l in timed)
            and len({l.time for l in timed}) == 1
            and len({_rank_of(l) for l in timed}) == 1
            and _rank_of(timed[0]) is not None
            and all(
                c.kind == "number"
                or (c.rank is not None and timed[0].rank is not None and c.rank <= timed[0].rank - timed[0].time)
                for c in lifts
                if c.constant
            )
        ):
            return lifts  # the tensors' own layout: equal ranks, time on the same dim
        rights = {id(l): to_right(l) for l in timed}
        target = max(r.time for r in rights.values())
        if any(c.constant and c.kind != "number" and c.rank is None for c in lifts):
            target = -1  # a constant of unknown rank gets its size-1 time dim last
        aligned = []
        for lift in lifts:
            if not lift.constant:
                aligned.append(moved(rights[id(lift)], target))
            elif lift.kind == "number":
                aligned.append(lift)
            elif lift.kind == "unknown":
                raise Unsupported(
                    f"`{self.code(lift.code)}` may be a number or a tensor: where its dims meet time cannot be told"
                )
            elif lift.rank is not None and lift.rank <= -target - 1:
                aligned.append(lift)
            else:
                aligned.append(
                    Lift(
                        method(lift.code, "unsqueeze", integer_literal(target)),
                        None,
                        None if lift.rank is None else lift.rank + 1,
                        "tensor",
                    )
                )
        return aligned

    def kernel_operands(self, lifts: list[Lift]) -> tuple[list[Lift], int]:
        """Operands for a kernel that takes each operand's step at `dim` of its own dims
        (`linear_recurrence`): their time dims on one dim index, constant tensors with a
        dim of size 1 there. Returns the operands and that dim."""
        timed = [l for l in lifts if not l.constant]
        if not timed:
            raise Unsupported("nothing in the update changes over time")
        times = {l.time for l in timed}
        dim = times.pop() if len(times) == 1 else None
        if dim is None:
            rights = [to_right(l) for l in timed]
            dim = max(r.time for r in rights)
        ready = []
        for lift in lifts:
            if lift.constant:
                if lift.kind == "number" or lift.rank == 0:
                    ready.append(lift)
                    continue
                if lift.kind == "unknown":
                    raise Unsupported(
                        f"`{self.code(lift.code)}` may be a number or a tensor: where its dims meet time cannot be told"
                    )
                fits = lift.rank is not None and (lift.rank >= dim if dim >= 0 else lift.rank >= -dim - 1)
                if not fits and dim != -1:
                    return self.kernel_operands([moved(to_right(l), -1) if not l.constant else l for l in lifts])
                ready.append(
                    Lift(method(lift.code, "unsqueeze", integer_literal(dim)), None, plus(lift.rank, 1), "tensor")
                )
            else:
                ready.append(lift if lift.time == dim else moved(to_right(lift), dim) if dim < 0 else moved(lift, dim))
        return ready, dim

    def _binary(self, sym: Op, left: Lift, right: Lift) -> Lift:
        left, right = self._align([left, right])
        node = sym.node
        rank = _broadcast_rank(sym.args)
        if (
            isinstance(node, cst.BinaryOperation)
            and len(sym.args) == 2
            and {
                "add": cst.Add,
                "sub": cst.Subtract,
                "mul": cst.Multiply,
                "div": cst.Divide,
            }[sym.op]
            is type(node.operator)
        ):
            code = node.with_changes(
                left=left.code if left.code is not node.left else node.left,
                right=right.code if right.code is not node.right else node.right,
            )
            code = code.with_changes(
                left=_operand(code.left, node.operator, "left"), right=_operand(code.right, node.operator, "right")
            )
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == sym.op:
            code = node.with_changes(
                func=node.func.with_changes(value=atom(left.code)), args=[node.args[0].with_changes(value=right.code)]
            )
        else:
            operator = {"add": cst.Add, "sub": cst.Subtract, "mul": cst.Multiply, "div": cst.Divide}[sym.op]()
            code = cst.BinaryOperation(
                _operand(left.code, operator, "left"), operator, _operand(right.code, operator, "right")
            )
            code = code.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        times = {l.time for l in (left, right) if not l.constant}
        time = times.pop() if times else None
        keys = {_rank_of(l) for l in (left, right) if not l.constant}
        key = keys.pop() if len(keys) == 1 and rank is None else None
        return Lift(code, time, rank, key=key)

    def _lift_add(self, sym):
        return self._binary(sym, *(self.lift(a) for a in sym.args))

    _lift_sub = _lift_mul = _lift_div = _lift_add

    def _lift_neg(self, sym):
        inner = self.lift(sym.args[0])
        if isinstance(sym.node, cst.UnaryOperation):
            code = sym.node.with_changes(expression=atom(inner.code))
        else:
            code = cst.UnaryOperation(cst.Minus(), atom(inner.code))
        return Lift(code, inner.time, inner.rank, inner.kind, inner.key)

    def _lift_map(self, sym):
        inner = self.lift(sym.args[0])
        where = sym.params[0]
        node = sym.node
        if where == "receiver":
            code = node.with_changes(func=node.func.with_changes(value=atom(inner.code)))
        elif where == "left":
            code = node.with_changes(left=atom(inner.code))
        else:
            first = positional(node, 0)
            code = node.with_changes(args=[a.with_changes(value=inner.code) if a is first else a for a in node.args])
        return Lift(code, inner.time, inner.rank, inner.kind, inner.key)

    def _lift_last_dim(self, sym):
        inner = self.lift(sym.args[0])
        if inner.constant:
            raise Unsupported("a module applied to a constant in the loop")
        last = inner.time == -1 or (inner.time >= 0 and (inner.rank is None or inner.time >= inner.rank))
        if last:
            inner = moved(inner, 0)
        code = sym.node.with_changes(args=[sym.node.args[0].with_changes(value=inner.code)])
        return Lift(code, inner.time, inner.rank)

    # -- dims --------------------------------------------------------------------------

    def _lift_unsqueeze(self, sym):
        inner = self.lift(sym.args[0])
        d = sym.params[0]
        if inner.constant:
            return Lift(method(inner.code, "unsqueeze", integer_literal(d)), None, plus(inner.rank, 1), inner.kind)
        rank = plus(inner.rank, 1)
        if d < 0:
            inner = to_right(inner)
            after_time, after_new = -inner.time - 1, -d - 1
            if after_new <= after_time:
                return Lift(method(inner.code, "unsqueeze", integer_literal(d)), inner.time - 1, rank)
            return Lift(method(inner.code, "unsqueeze", integer_literal(d - 1)), inner.time, rank)
        inner = to_left(inner)
        if d <= inner.time:
            return Lift(method(inner.code, "unsqueeze", integer_literal(d)), inner.time + 1, rank)
        return Lift(method(inner.code, "unsqueeze", integer_literal(d + 1)), inner.time, rank)

    def _dims(self, inner: Lift, dims: tuple[int, ...], rank: int | None) -> tuple[Lift, list[int], list[bool]]:
        """The lifted dims for step dims `dims`, and for each whether it lies before time."""
        if rank is not None:
            dims = tuple(d - rank if d >= 0 else d for d in dims)
        if all(d < 0 for d in dims):
            inner = to_right(inner)
            after_time = -inner.time - 1
            before = [-d - 1 >= after_time for d in dims]
            return inner, [d - 1 if b else d for d, b in zip(dims, before)], before
        if all(d >= 0 for d in dims):
            inner = to_left(inner)
            before = [d < inner.time for d in dims]
            return inner, [d if b else d + 1 for d, b in zip(dims, before)], before
        raise Unsupported("dims counted from both ends of a value of unknown rank")

    def _lift_reduce(self, sym):
        dims, keepdim, name, skip_first = sym.params
        inner = self.lift(sym.args[0])
        if inner.constant:
            raise Unsupported("a reduction of a constant inside the loop")
        inner, lifted, before = self._dims(inner, dims, sym.args[0].rank)
        dim_code = (
            integer_literal(lifted[0])
            if len(lifted) == 1
            else cst.Tuple([cst.Element(integer_literal(d)) for d in lifted])
        )
        keywords = {"keepdim": cst.Name("True")} if keepdim else {}
        code = method(inner.code, name, dim_code, **keywords)
        time = inner.time
        if not keepdim:
            if time >= 0:
                time -= sum(before)
            else:
                time += sum(not b for b in before)
        return Lift(code, time, sym.rank)

    def _lift_squeeze(self, sym):
        inner = self.lift(sym.args[0])
        inner, lifted, before = self._dims(inner, sym.params, sym.args[0].rank)
        time = inner.time - (1 if before[0] else 0) if inner.time >= 0 else inner.time + (0 if before[0] else 1)
        return Lift(method(inner.code, "squeeze", integer_literal(lifted[0])), time, sym.rank)

    def _lift_slice(self, sym):
        dim, bound = sym.params
        inner = self.lift(sym.args[0])
        if inner.constant:
            raise Unsupported("a slice of a constant inside the loop")
        inner, lifted, _ = self._dims(inner, (dim,), sym.args[0].rank)
        d = lifted[0]
        if d >= 0:
            elements = [cst.SubscriptElement(cst.Slice(lower=None, upper=None))] * d + [cst.SubscriptElement(bound)]
        else:
            elements = [cst.SubscriptElement(cst.Index(cst.Ellipsis())), cst.SubscriptElement(bound)] + [
                cst.SubscriptElement(cst.Slice(lower=None, upper=None))
            ] * (-1 - d)
        elements = separated(elements)
        return Lift(cst.Subscript(atom(inner.code), elements), inner.time, inner.rank, key=inner.key)

    def _lift_transpose(self, sym):
        inner = self.lift(sym.args[0])
        if inner.constant:
            return Lift(
                method(inner.code, "transpose", *(integer_literal(d) for d in sym.params)), None, inner.rank, inner.kind
            )
        inner, lifted, _ = self._dims(inner, sym.params, sym.args[0].rank)
        return Lift(method(inner.code, "transpose", *(integer_literal(d) for d in lifted)), inner.time, sym.rank)

    def _lift_dimwise(self, sym):
        dim, where = sym.params
        inner = self.lift(sym.args[0])
        inner, lifted, _ = self._dims(inner, (dim,), sym.args[0].rank)
        node = sym.node
        if where == "receiver":
            code = node.with_changes(
                func=node.func.with_changes(value=atom(inner.code)),
                args=[node.args[0].with_changes(value=integer_literal(lifted[0]))],
            )
        else:
            first = positional(node, 0)
            args = []
            for arg in node.args:
                if arg is first:
                    args.append(arg.with_changes(value=inner.code))
                elif integer_value(arg.value) == dim:
                    args.append(arg.with_changes(value=integer_literal(lifted[0])))
                else:
                    args.append(arg)
            code = node.with_changes(args=args)
        return Lift(code, inner.time, inner.rank)

    # -- products ----------------------------------------------------------------------

    def _lift_matmul(self, sym):
        left, right = (self.lift(a) for a in sym.args)
        low = [min_rank(a) for a in sym.args]
        if any(r < 2 for r in low):
            raise Unsupported("a matrix product of values that may be vectors")
        timed = [l for l in (left, right) if not l.constant]
        rights = [to_right(l) for l in timed]
        target = min([-3] + [r.time for r in rights])
        operands = []
        for lift, _original in zip((left, right), sym.args):
            if lift.constant:
                if lift.rank is None:
                    raise Unsupported(f"`{self.code(lift.code)}`: a matrix of unknown rank times a step value")
                if lift.rank - 2 > -target - 3:
                    lift = Lift(method(lift.code, "unsqueeze", integer_literal(target)), None, lift.rank + 1)
                operands.append(lift)
            else:
                operands.append(moved(to_right(lift), target))
        node = sym.node
        if isinstance(node, cst.BinaryOperation):
            code = node.with_changes(left=atom(operands[0].code), right=atom(operands[1].code))
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in BROADCAST_PRODUCT_METHODS
        ):
            code = node.with_changes(
                func=node.func.with_changes(value=atom(operands[0].code)),
                args=[node.args[0].with_changes(value=operands[1].code)],
            )
        elif isinstance(node, cst.Call):
            code = node.with_changes(args=[a.with_changes(value=o.code) for a, o in zip(node.args, operands)])
        else:
            code = cst.BinaryOperation(atom(operands[0].code), cst.MatrixMultiply(), atom(operands[1].code))
        return Lift(code, target, sym.rank)

    def _lift_einsum(self, sym):
        spec: Spec = sym.params[0]
        used = {c for term in (*spec.inputs, spec.output) for c in term}
        tau = next(c for c in "tsuzyxwTSUZYXW" + "abcdefghijklmnopqr" if c not in used)
        terms, operands = [], []
        for letters, original in zip(spec.inputs, sym.args):
            lift = self.lift(original)
            if lift.constant:
                terms.append(letters)
                operands.append(lift.code)
                continue
            named = [c for c in letters if c != "."]
            if "." not in letters:
                rank = len(named)
                lift = Lift(lift.code, lift.time, rank)
                lift = to_left(lift)
                term = (*named[: lift.time], tau, *named[lift.time :])
            else:
                lift = to_right(lift)
                after_time = -lift.time - 1
                if after_time > len(named):
                    lift = moved(lift, -1)
                    after_time = 0
                split = len(named) - after_time
                term = (".", *named[:split], tau, *named[split:])
            terms.append(term)
            operands.append(lift.code)
        output = (*spec.output, tau)
        text = Spec(tuple(terms), output).text()
        node = sym.node
        string = node.args[0].value
        quote = string.quote if isinstance(string, cst.SimpleString) else '"'
        args = [node.args[0].with_changes(value=cst.SimpleString(f"{quote}{text}{quote}"))]
        args += [arg.with_changes(value=code) for arg, code in zip(node.args[1:], operands)]
        return Lift(node.with_changes(args=args), -1, sym.rank)


def _rank_of(lift: Lift):
    return lift.rank if lift.rank is not None else lift.key


def _operand(code: cst.BaseExpression, operator, side: str) -> cst.BaseExpression:
    """`code` as an operand of `operator`, parenthesized where Python's precedence needs it."""
    if not isinstance(code, cst.BinaryOperation) or code.lpar:
        return code if not isinstance(code, cst.UnaryOperation) or not isinstance(operator, cst.Power) else atom(code)
    inner, outer = _precedence(code.operator), _precedence(operator)
    if inner < outer or (inner == outer and side == "right" and not isinstance(operator, (cst.Add, cst.Multiply))):
        return atom(code)
    return code


def _precedence(operator) -> int:
    if isinstance(operator, (cst.Add, cst.Subtract)):
        return 1
    if isinstance(operator, (cst.Multiply, cst.Divide, cst.MatrixMultiply, cst.FloorDivide, cst.Modulo)):
        return 2
    if isinstance(operator, cst.Power):
        return 3
    return 0


def min_rank(sym: Sym) -> int:
    """A lower bound of a step value's rank."""
    if sym.rank is not None:
        return sym.rank
    if isinstance(sym, Timed):
        return sym.time if sym.time >= 0 else -sym.time - 1
    if isinstance(sym, Op) and sym.op == "unsqueeze":
        low = min_rank(sym.args[0]) + 1
        if len(sym.params) > 1:
            low = max(low, sym.params[1])
        return max(low, sym.params[0] + 1) if sym.params[0] >= 0 else low
    if isinstance(sym, Op) and sym.op == "slice":
        return max(min_rank(sym.args[0]), sym.params[0] + 1 if sym.params[0] >= 0 else -sym.params[0])
    if isinstance(sym, Op) and sym.op in ("map", "neg", "transpose"):
        return min_rank(sym.args[0])
    if isinstance(sym, Op) and sym.op in ("add", "sub", "mul", "div"):
        return max(min_rank(a) for a in sym.args)
    return 0


# -- recurrences: which loops, their outputs, and the linear-attention form --------------------


class Stacked(NamedTuple):
    """A list a loop appends to: made empty just before it and stacked once after it."""

    init: cst.SimpleStatementLine  # `outs = []`
    stack: cst.Call  # `torch.stack(outs, dim=d)` (or `torch.cat`)
    dim: int
    cat: bool  # torch.cat of values with a dim of size 1 at `dim`
    after: cst.BaseStatement  # the statement holding the stack
    between: list | None  # the statements between the loop and it (None: not in the loop's block)


@dataclass
class Attention:
    """A state that is decayed linear attention: S = w * S + k^T v, read as r S over its key dim."""

    k: Sym
    v: Sym
    w: Sym | None  # the decay vector along the key dim, or a constant; None: no decay
    r: Sym
    mode: str  # "new" (GLA) or "prev" (RWKV)
    u: Sym | None  # the bonus (prev mode), None: none
    key: int  # where the key dim is in the state: -2 for (..., K, V), -1 for (..., V, K)
    x: Sym  # the update's outer product (a bonus multiplies it)
    rank: int | None = None  # the rank of one step's read-out
    state_rank: int | None = None


class TimeLoops:
    """The file's loops over time read as recurrences (see the module docstring)."""

    def __init__(self, context: FileContext) -> None:
        self.context = context

    @cached_property
    def layouts(self):
        return layouts(self.context)

    def read(self, loop: cst.For) -> TimeLoop | None:
        """The loop read as step values (raises Unsupported with the reason)."""
        return LoopReader(self.context).read(loop)

    def candidate(self, loop: cst.For) -> bool:
        """A loop whose body assigns a name, or a slot of a tensor, it reads (a state), and
        that is not a training loop."""
        if not isinstance(loop.body, cst.IndentedBlock) or self.context.loops.is_training_loop(loop):
            return False
        assigned = set()
        for line in loop.body.body:
            if isinstance(line, cst.SimpleStatementLine):
                for small in line.body:
                    if isinstance(small, cst.Assign) and len(small.targets) == 1:
                        target = small.targets[0].target
                        if isinstance(target, cst.Subscript):
                            target = target.value
                        if isinstance(target, cst.Name):
                            assigned.add(target.value)
                    elif isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
                        assigned.add(small.target.value)
        return bool(assigned & read_names(self.context, loop.body))

    def looks_like_recurrence(self, loop: cst.For) -> bool:
        """Worth reporting when not rewritten: a loop over a tensor's time dim (indexed
        `[:, t]`, `[..., t]`, or iterated with `unbind`) of simple statements that hands a
        state from one step to the next (`Kinds.carried_reads`: a read of what an earlier
        step bound) and updates it from itself through math a recurrence is made of
        (arithmetic, torch's elementwise functions and tensor methods, `einsum`, `@`, a
        layer on the last dims such as `nn.Linear`): linear in it or not (`h =
        tanh(W x_t + U h)`). Not an RNN cell or decoder whose state goes through a module
        or function that is not such math (`nn.GRUCell`, `cell(h)`), and not a total the
        state is only added into (`loss = loss + ...`), unless each step's total is read
        in the loop (a running sum)."""
        time = loop.target.value if isinstance(loop.target, cst.Name) else None
        if not isinstance(loop.body, cst.IndentedBlock) or not self._over_time(loop, time):
            return False
        if any(not isinstance(line, cst.SimpleStatementLine) for line in loop.body.body):
            return False
        updates: dict[str, cst.BaseSmallStatement] = {}
        for line in loop.body.body:
            for small in line.body:
                if isinstance(small, cst.Assign) and len(small.targets) == 1:
                    target = small.targets[0].target
                elif isinstance(small, cst.AugAssign):
                    target = small.target
                else:
                    continue
                if isinstance(target, cst.Name):
                    updates.setdefault(target.value, small)
        carried = {read.value for read in self.context.kinds.carried_reads(loop, loop.body)} & set(updates)
        temporaries = {name: small.value for name, small in updates.items() if name not in carried}
        calls = self.context.index.find(cst.Call, within=loop.body)
        for state in sorted(carried):
            update = updates[state]
            added = isinstance(update, cst.AugAssign) and isinstance(
                update.operator, (cst.AddAssign, cst.SubtractAssign)
            )
            if not (isinstance(update, cst.AugAssign) or self._reads_states(update.value, {state}, temporaries)):
                continue  # bound from other values only
            if any(self._feeds_state(call, {state}, temporaries) for call in calls):
                continue  # through a cell: not math the kernels compute
            if isinstance(update, cst.AugAssign) and not added:
                return True  # `h *= a`
            scaled = not self._only_added(update.value, state, temporaries)
            read = any(
                state in read_names(self.context, small)
                for line in loop.body.body
                for small in line.body
                if small is not update
            )
            if scaled or read:
                return True
        return False

    def _only_added(self, expr: cst.BaseExpression, state: str, temporaries: dict, depth: int = 0) -> bool:
        """Is every read of `state` in `expr` (through the loop's temporaries) a term added to
        the rest (`state + f(x_t)`), so that the loop only totals values free of it?"""
        if isinstance(expr, cst.Name) and expr.value == state:
            return True
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
            return self._only_added(expr.left, state, temporaries, depth) and self._only_added(
                expr.right, state, temporaries, depth
            )
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Subtract):
            return self._only_added(expr.left, state, temporaries, depth) and not self._reads_states(
                expr.right, {state}, temporaries
            )
        if isinstance(expr, cst.Name) and expr.value in temporaries and depth < 4:
            return self._only_added(temporaries[expr.value], state, temporaries, depth + 1)
        return not self._reads_states(expr, {state}, temporaries)

    def _reads_states(self, expr, states: set[str], assigned: dict, depth: int = 0) -> bool:
        """Does `expr` read a state, directly or through the loop's temporaries?"""
        names = read_names(self.context, expr) if expr in self.context.index else set()
        if names & states:
            return True
        return depth < 4 and any(
            self._reads_states(assigned[n], states, assigned, depth + 1)
            for n in names
            if n in assigned and n not in states
        )

    def _feeds_state(self, call: cst.Call, states: set[str], assigned: dict) -> bool:
        """Is a state (maybe through temporaries) an argument of a call that is not math a
        recurrence is made of (an elementwise torch function or tensor method, a layer on
        the last dims)?"""
        func = call.func
        names = self.context.names.of(func) if is_dotted_name(func) else set()
        if any(n.startswith("torch.") and n.rsplit(".", 1)[1] in RECURRENCE_FUNCTION_NAMES for n in names):
            return False
        if isinstance(func, cst.Attribute) and not names and func.attr.value in RECURRENCE_METHODS:
            return False
        if isinstance(func, cst.Attribute) and func.attr.value == "append":
            return False
        module = (
            self.context.kinds.attribute_value(func)
            if isinstance(func, cst.Attribute)
            else (self.layouts.value_of(func) if isinstance(func, cst.Name) else None)
        )
        if isinstance(module, cst.Call) and self.context.names.of(module.func) & (
            LAST_DIM_MODULES | SAME_SHAPE_MODULES
        ):
            return False  # `self.wh(h)`: a layer the reader reads as math
        args = [a.value for a in call.args]
        if isinstance(func, cst.Attribute) and not names and not isinstance(func.value, cst.Name):
            args.append(func.value)
        return any(self._reads_states(a, states, assigned) for a in args)

    def _over_time(self, loop: cst.For, time: str | None) -> bool:
        """Does the loop index a tensor by its step (`x[:, t]`, `x[..., t]`, `x[t]` of a tensor),
        or iterate over one with `unbind`?"""
        if "unbind" in self.context.source(loop.iter):
            return True
        if time is None:
            return False
        layout = layouts(self.context)
        for subscript in self.context.index.find(cst.Subscript, within=loop.body):
            for position, element in enumerate(subscript.slice):
                stepped = (
                    isinstance(element.slice, cst.Index)
                    and isinstance(element.slice.value, cst.Name)
                    and element.slice.value.value == time
                    or isinstance(element.slice, cst.Slice)
                    and isinstance(element.slice.lower, cst.Name)
                    and element.slice.lower.value == time
                )
                if stepped and (
                    position > 0
                    or layout.shape(subscript.value) is not None
                    or self._steps_over_first_dim(loop, subscript.value)
                ):
                    return True
        return False

    def _steps_over_first_dim(self, loop: cst.For, tensor: cst.BaseExpression) -> bool:
        """`for t in range(x.size(0))` (or `x.shape[0]`) indexing `x[t]`: the steps of a
        tensor's first dim (a list has no `size()`, a NumPy array's `size` is no method)."""
        iterated = loop.iter
        if not (
            isinstance(iterated, cst.Call)
            and self.context.names.is_(iterated.func, "range", "builtins.range")
            and len(iterated.args) == 1
        ):
            return False
        count, code = iterated.args[0].value, self.context.source
        if isinstance(count, cst.Call) and isinstance(count.func, cst.Attribute) and count.func.attr.value == "size":
            owner, index = count.func.value, positional(count, 0)
            return index is not None and integer_value(index.value) == 0 and code(owner) == code(tensor)
        if isinstance(count, cst.Subscript) and isinstance(count.value, cst.Attribute):
            shape = count.value
            first = len(count.slice) == 1 and isinstance(count.slice[0].slice, cst.Index)
            return (
                shape.attr.value == "shape"
                and first
                and integer_value(count.slice[0].slice.value) == 0
                and code(shape.value) == code(tensor)
            )
        return False

    def order(self, model: TimeLoop) -> list[str]:
        """The states in an order where each comes after those its update reads."""
        needs = {name: {s for s, _ in states_in(state.update)} - {name} for name, state in model.states.items()}
        order: list[str] = []
        while len(order) < len(needs):
            ready = [n for n in sorted(needs) if n not in order and needs[n] <= set(order)]
            if not ready:
                raise Unsupported("the states' updates read each other")
            order.extend(ready)
        return order

    def scope_names(self, loop) -> set[str]:
        """The names bound or read in the scope of `loop` (what a new name must not be)."""
        scope = self.context.scopes.get(loop)
        if scope is None:
            return set()
        return {a.name for a in scope.assignments} | {
            a.node.value for a in scope.accesses if isinstance(a.node, cst.Name)
        }

    def bound_names(self, statement) -> set[str]:
        """The names `statement` binds (assignments and loop targets, at any depth)."""
        found = set()
        for assign in self.context.index.find((cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For), within=statement):
            targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
            for target in targets:
                found |= {n.value for n in self.context.index.find(cst.Name, within=target)}
        return found

    def stacked_outputs(self, model: TimeLoop) -> dict[int, Stacked]:
        """For each list output: (init statement, stack call, stack dim, cat) after the checks."""
        loop = model.loop
        block = self.context.parents.get(loop)
        statements = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        index = next((i for i, s in enumerate(statements) if s is loop), None)
        if index is None:
            raise Unsupported("the loop is not in a block of statements")
        found = {}
        for output in model.outputs:
            if output.kind == "list":
                found[id(output)] = self._stacked(output, loop, statements, index)
        self._check_locals_not_read_after(model)
        return found

    def _stacked(self, output: Output, loop: cst.For, statements: list, index: int) -> Stacked:
        """The list `output` collects: made empty just before the loop (at `index` of
        `statements`), read in it by its append only, and after it by one torch.stack."""
        init = self._empty_list_before(output.name, statements, index)
        reads_in_loop = [
            n
            for n in self.context.index.find(cst.Name, within=loop.body)
            if n.value == output.name and not self.context.inside(n, output.statement)
        ]
        if reads_in_loop:
            raise Unsupported(f"`{output.name}` is read in the loop")
        stack, dim = self._stack_call(self._read_after_loop(output.name, init, loop), output.name)
        cat = self.context.names.is_(stack.func, "torch.cat")
        after = self.context.index.statement_of(stack)
        if self.context.index.order(after) <= self.context.index.end(loop):
            raise Unsupported("the stack is inside the loop")
        return Stacked(init, stack, dim, cat, after, self._between(statements, loop, after))

    def _empty_list_before(self, name: str, statements: list, index: int) -> cst.CSTNode:
        """The statement before `statements[index]` that makes `name` an empty list, with no
        read of it between."""
        for statement in reversed(statements[:index]):
            if name in read_names(self.context, statement):
                raise Unsupported(f"`{name}` is used between its creation and the loop")
            if self._binds(statement, name):
                if _makes_empty_list(statement):
                    return statement
                break
        raise Unsupported(f"`{name}` is not made an empty list just before the loop")

    def _read_after_loop(self, name: str, init: cst.CSTNode, loop: cst.For) -> cst.Name:
        """The one read after the loop of the list `init` binds to `name`."""
        kinds, index = self.context.kinds, self.context.index
        later = sorted(
            (
                read
                for binding in kinds.bindings_in(init, name)
                for read in kinds.reached_reads(binding)
                if index.order(read) > index.end(loop)
            ),
            key=index.order,
        )
        if len(later) != 1:
            raise Unsupported(f"`{name}` is read {'more than once' if later else 'nowhere'} after the loop")
        return later[0]

    def _stack_call(self, read: cst.Name, name: str) -> tuple[cst.Call, int]:
        """(the `torch.stack(name, dim)` or `torch.cat` call that reads the list, its dim)."""
        stack = self.context.parents.get(self.context.parents.get(read))
        if not (
            isinstance(stack, cst.Call)
            and stack.args
            and stack.args[0].value is read
            and self.context.names.is_(stack.func, "torch.stack", "torch.cat")
        ):
            raise Unsupported(f"`{name}` is used after the loop other than by torch.stack")
        dim_arg = stack.args[1] if len(stack.args) > 1 else None
        if len(stack.args) > 2 or (
            dim_arg is not None and dim_arg.keyword is not None and dim_arg.keyword.value != "dim"
        ):
            raise Unsupported("torch.stack with other arguments than the list and dim")
        dim = integer_value(dim_arg.value) if dim_arg is not None else 0
        if dim is None:
            raise Unsupported("the stack's dim is not a number")
        return stack, dim

    def _check_locals_not_read_after(self, model: TimeLoop) -> None:
        """No temporary of the loop, nor its step variable, is read after it (the rewrite
        leaves them unbound)."""
        loop = model.loop
        outputs = {o.name for o in model.outputs}
        for name in model.temporaries | ({model.time} if model.time else set()):
            if name in outputs:
                continue
            for binding in self.context.kinds.bindings_in(loop, name):
                for node in self.context.kinds.reached_reads(binding):
                    if self.context.index.order(node) > self.context.index.end(loop):
                        raise Unsupported(f"`{name}` is read after the loop (line {self.context.line(node)})")

    def _between(self, statements, loop, after) -> list:
        """The statements of the loop's block between the loop and the one holding `after`, or
        None when `after` is not in that block."""
        block_after = after
        while block_after is not None and block_after not in statements:
            block_after = self.context.parents.get(block_after)
        if block_after is None:
            return None
        i, j = statements.index(loop), statements.index(block_after)
        return statements[i + 1 : j]

    def _binds(self, statement, name: str) -> bool:
        for assign in self.context.index.find((cst.Assign, cst.AugAssign, cst.AnnAssign), within=statement):
            targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
            for target in targets:
                if any(n.value == name for n in self.context.index.find(cst.Name, within=target)):
                    return True
        return False

    def read_after(self, model: TimeLoop) -> set[str]:
        """States whose value after the loop is read later (a state kept in a tensor's slots
        has its values there, written by the loop's slot write)."""
        loop, kinds, index = model.loop, self.context.kinds, self.context.index
        return {
            name
            for name, state in model.states.items()
            if state.initial is None
            and any(
                node in index and index.order(node) > index.end(loop)
                for binding in kinds.bindings_in(loop, name)
                for node in kinds.reached_reads(binding)
            )
        }

    def uses(self, model, values, updates, final_reads) -> dict[tuple[str, str], int]:
        count: dict[tuple[str, str], int] = {}

        def walk(sym):
            if sym is None:
                return
            for pair in states_in(sym):
                count[pair] = count.get(pair, 0) + _occurrences(sym, pair)

        for value in values.values():
            walk(value)
        for a, x in updates.values():
            walk(a)
            walk(x)
        for name in final_reads:
            count[(name, "final")] = 1
        return count

    def attention(self, model: TimeLoop, state: State) -> Attention | None:
        """The decayed-linear-attention reading of a state, if every use of it fits."""
        rank = state_rank(state)
        outer = self._outer(state.x, self.context.module.code_for_node, rank) if state.x is not None else None
        if outer is None:
            return None
        first, second = outer  # the vectors along the state's dims -2 and -1
        decay = self._decay(state.a, rank)
        if decay is False:
            return None
        reads: list[tuple] = []
        code = self.context.module.code_for_node
        uses = (
            [o.value for o in model.outputs]
            + [s.a for s in model.states.values() if s is not state and s.a]
            + [s.x for s in model.states.values() if s is not state and s.x]
        )
        for value in uses:
            if not self._collect_reads(value, state, reads, code):
                return None
        if not reads:
            return None
        r, mode, key, u, _ = reads[0]
        if any(
            not (same(r, other[0], code) and mode == other[1] and key == other[2] and same(u, other[3], code))
            for other in reads[1:]
        ):
            return None
        axis, w = decay
        if axis is not None and axis != key:
            return None  # a decay along the value dim is not this kernel's
        k, v = (first, second) if key == -2 else (second, first)
        ranks = {read[4] for read in reads if read[4] is not None}
        rank = ranks.pop() if len(ranks) == 1 else r.rank
        return Attention(k, v, w, r, mode, u, key, state.x, rank, state_rank(state))

    def with_reads(self, sym: Sym | None, attention: dict[str, Attention]) -> Sym | None:
        if sym is None or not attention:
            return sym
        code = self.context.module.code_for_node
        for name, plan in attention.items():
            sym = self._replace_reads(sym, model_state(name), plan, code)
        return sym

    def _unsq(self, sym: Sym, dim: int, rank: int | None = None) -> Sym | None:
        """x for `x.unsqueeze(dim)` (as read: `x[..., None]` too), also of a constant, and through
        an elementwise function (`x[..., None].exp()` is `x.exp()[..., None]`); `rank` is the rank
        the value must have (the state's), which makes an unsqueeze at a dim counted from the
        left one counted from the right."""
        if isinstance(sym, Op):
            return self._unsqueezed_op(sym, dim, rank)
        if isinstance(sym, Const) and sym.kind != "number":
            return self._unsqueezed_constant(sym, dim, rank)
        return None

    def _unsqueezed_op(self, sym: Op, dim: int, rank: int | None) -> Sym | None:
        if sym.op in ("map", "neg") and len(sym.args) == 1:
            inner = self._unsq(sym.args[0], dim, rank)
            return None if inner is None else Op(plus(inner.rank, 0), sym.op, (inner,), sym.params, sym.node)
        if sym.op != "unsqueeze":
            return None
        if sym.params[0] == dim:
            return sym.args[0]
        if (
            sym.params[0] >= 0
            and sym.rank is None
            and rank is not None
            and sym.params[0] - rank == dim
            and min_rank(sym) >= rank
        ):
            return sym.args[0]
        return None

    def _unsqueezed_constant(self, sym: Const, dim: int, rank: int | None) -> Const | None:
        """A constant's code without its new dim at `dim`: `c.unsqueeze(dim)`, `c[..., None]`,
        or a name bound to one of those before the loop."""
        node = sym.node
        if isinstance(node, cst.Name) and node in self.layouts.index:
            value = self.layouts.value_of(node)  # `u = self.bonus.unsqueeze(-1)` before the loop
            if isinstance(value, (cst.Call, cst.Subscript)) and value in self.layouts.index:
                shape = self.layouts.shape(value)
                return self._unsq(Const(len(shape) if shape is not None else sym.rank, value, sym.kind), dim, rank)
            return None
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "unsqueeze"
            and len(node.args) == 1
            and node.args[0].keyword is None
        ):
            d = integer_value(node.args[0].value)
            if d == dim or (d is not None and d >= 0 and sym.rank is not None and d - sym.rank == dim):
                return Const(plus(sym.rank, -1), node.func.value, sym.kind)
            return None
        if isinstance(node, cst.Subscript) and dim in (-1, -2):
            return _without_new_dim(sym, node, dim, rank)
        return None

    def _norm(self, sym: Sym, rank: int | None) -> Sym:
        """`x.unsqueeze(-2).mT` is `x.unsqueeze(-1)` (and the other way round), also for an
        unsqueeze at a dim counted from the left that is that dim in a value of `rank` dims."""
        if isinstance(sym, Op) and sym.op == "transpose" and sym.params == (-2, -1):
            inner = sym.args[0]
            for before, after in ((-2, -1), (-1, -2)):
                x = self._unsq(inner, before, rank)
                if x is not None:
                    return Op(sym.rank, "unsqueeze", (x,), (after,), None)
        return sym

    def _outer(self, sym: Sym, code, rank: int | None = None) -> tuple[Sym, Sym] | None:
        """(vector along dim -2, vector along dim -1) for an outer product of two step vectors."""
        if isinstance(sym, Op) and sym.op in ("mul", "matmul") and len(sym.args) == 2:
            a, b = (self._norm(arg, rank) for arg in sym.args)
            if self._unsq(a, -1, rank) is not None and self._unsq(b, -2, rank) is not None:
                return self._unsq(a, -1, rank), self._unsq(b, -2, rank)
            if sym.op == "mul" and self._unsq(b, -1, rank) is not None and self._unsq(a, -2, rank) is not None:
                return self._unsq(b, -1, rank), self._unsq(a, -2, rank)
        if isinstance(sym, Op) and sym.op == "einsum" and len(sym.args) == 2:
            spec = sym.params[0]
            (x, y), out = spec.inputs, spec.output
            if len(x) < 1 or len(y) < 1 or x[:-1] != y[:-1] or x[-1] == y[-1] or x[-1] in x[:-1] or y[-1] in y[:-1]:
                return None
            batch = x[:-1]
            if out == (*batch, x[-1], y[-1]):
                return sym.args[0], sym.args[1]
            if out == (*batch, y[-1], x[-1]):
                return sym.args[1], sym.args[0]
        return None

    def _decay(self, sym: Sym | None, rank: int | None = None):
        """(axis, w) for a decay that varies along one dim of the state (axis -2 or -1) given
        by w, or (None, w) for one that does not (a constant, None for 1); False otherwise."""
        if sym is None:
            return False  # no state term: not a recurrence this kernel runs
        if sym is ONE:
            return None, None
        if self._unsq(sym, -1, rank) is not None:
            return -2, self._unsq(sym, -1, rank)
        if self._unsq(sym, -2, rank) is not None:
            return -1, self._unsq(sym, -2, rank)
        if isinstance(sym, Const) and (sym.kind == "number" or sym.rank == 0):
            return None, sym
        return False

    def _state_term(self, sym: Sym, state: State, code):
        """("new" | "prev", u) when `sym` is the state after / before its update, the latter
        maybe plus the bonus `u * x` (u along the key dim, x the update's outer product)."""
        if isinstance(sym, New) and sym.state == state.name:
            return "new", None, None
        if isinstance(sym, Prev) and sym.state == state.name:
            return "prev", None, None
        if isinstance(sym, Op) and sym.op == "add":
            for first, second in (sym.args, sym.args[::-1]):
                if (
                    isinstance(first, Prev)
                    and first.state == state.name
                    and isinstance(second, Op)
                    and second.op == "mul"
                ):
                    for u_side, x_side in (second.args, second.args[::-1]):
                        if same(x_side, state.x, code):
                            for axis in (-1, -2):
                                u = self._unsq(u_side, axis, state_rank(state))
                                if u is not None and isinstance(u, Const):
                                    return "prev", u, -2 if axis == -1 else -1
        return None

    def _read_out(self, sym: Sym, state: State, code):
        """(r, mode, key axis, u, wrap) for a read-out of the state by a query r; wrap is the
        unsqueeze (dim) around the result that the form leaves, or None."""
        read = self._READ_OUTS.get(sym.op) if isinstance(sym, Op) else None
        return read(self, sym, state, code) if read is not None else None

    def _einsum_read_out(self, sym: Op, state: State, code):
        """`einsum("bhk,bhkv->bhv", r, S)` (the state's letters last two, the query's last
        one contracted with either)."""
        if len(sym.args) != 2:
            return None
        spec = sym.params[0]
        for s_at in (0, 1):
            term = self._state_term(sym.args[s_at], state, code)
            if term is None:
                continue
            mode, u, u_key = term
            key = _contracted_state_dim(spec.inputs[s_at], spec.inputs[1 - s_at], spec.output)
            if key is None or (u is not None and u_key != key):
                return None
            return sym.args[1 - s_at], mode, key, u, None
        return None

    def _summed_read_out(self, sym: Op, state: State, code):
        """`(r[..., None] * S).sum(-2)` (or `(S * r[..., None, :]).sum(-1)`)."""
        if not (sym.params[0] in ((-2,), (-1,)) and not sym.params[1] and sym.params[2] == "sum"):
            return None
        key = sym.params[0][0]
        inner = sym.args[0]
        if not (isinstance(inner, Op) and inner.op == "mul"):
            return None
        for s_side, r_side in (inner.args, inner.args[::-1]):
            term = self._state_term(s_side, state, code)
            r = self._unsq(r_side, -1 if key == -2 else -2)
            if _reads_along(term, r, key):
                return r, term[0], key, term[1], None
        return None

    def _matmul_read_out(self, sym: Op, state: State, code):
        """`r.unsqueeze(-2) @ S` (key dim -2) or `S @ r.unsqueeze(-1)` (key dim -1)."""
        a, b = (self._norm(arg, state_rank(state)) for arg in sym.args)
        for s_side, r_side, key in ((b, a, -2), (a, b, -1)):
            term = self._state_term(s_side, state, code)
            r = self._unsq(r_side, key)
            if _reads_along(term, r, key):
                return r, term[0], key, term[1], key
        return None

    _READ_OUTS = {"einsum": _einsum_read_out, "reduce": _summed_read_out, "matmul": _matmul_read_out}

    def _collect_reads(self, sym: Sym | None, state: State, found: list, code) -> bool:
        """Collect the read-outs of `state` in `sym`; False if the state is used otherwise."""
        if sym is None:
            return True
        read = self._read_out(sym, state, code)
        if read is not None:
            rank = sym.rank if read[4] is None else plus(sym.rank, -1)
            found.append((*read[:4], rank))
            return self._collect_reads(read[0], state, found, code)
        if isinstance(sym, (Prev, New)) and sym.state == state.name:
            return False
        if isinstance(sym, Op):
            return all(self._collect_reads(a, state, found, code) for a in sym.args)
        return True

    def _replace_reads(self, sym: Sym, name: str, plan: Attention, code) -> Sym:
        if isinstance(sym, Op):
            read = self._read_out(sym, StateView(name, plan), code)
            if read is not None:
                result: Sym = Read(plan.rank, name)
                if read[4] is not None:
                    result = Op(plus(plan.rank, 1), "unsqueeze", (result,), (read[4],), None)
                return result
            args = tuple(self._replace_reads(a, name, plan, code) for a in sym.args)
            if any(n is not o for n, o in zip(args, sym.args)):
                if (
                    sym.op == "squeeze"
                    and isinstance(args[0], Op)
                    and args[0].op == "unsqueeze"
                    and args[0].params[0] == sym.params[0]
                    and isinstance(args[0].args[0], Read)
                ):
                    return args[0].args[0]
                return Op(sym.rank, sym.op, args, sym.params, sym.node)
        return sym


def _makes_empty_list(statement) -> bool:
    """`name = []` alone on its line."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Assign)
        and isinstance(statement.body[0].value, cst.List)
        and not statement.body[0].value.elements
    )


def _without_new_dim(sym: Const, node: cst.Subscript, dim: int, rank: int | None) -> Const | None:
    """The constant `node` (a subscript) without the new dim it makes at `dim` (-1 or -2):
    `c[..., None]`, `c[..., None, :]`, `c[:, None]` in a constant of known rank, or
    `u[None, :, None, :]` in a value of the state's `rank` (its dims are those written)."""
    kinds = [_element_kind(e) for e in node.slice]
    if kinds == (["...", "None"] if dim == -1 else ["...", "None", ":"]) or _only_new_dim_at(kinds, dim, sym.rank):
        return Const(plus(sym.rank, -1), node.value, sym.kind)
    if rank is None or "..." in kinds or not set(kinds) <= {":", "None"} or len(kinds) != rank:
        return None
    position = dim + len(kinds)
    if position < 0 or kinds[position] != "None":
        return None
    rest = [e for i, e in enumerate(node.slice) if i != position]
    inner = node.value if all(_element_kind(e) == ":" for e in rest) else node.with_changes(slice=separated(rest))
    return Const(len(kinds) - 1, inner, sym.kind)


def _only_new_dim_at(kinds: list[str], dim: int, rank: int | None) -> bool:
    """Are `kinds` (of a subscript's elements) `:`s and one `None`, at `dim` counted from
    the right of a value of `rank` dims?"""
    return (
        rank is not None
        and kinds.count("None") == 1
        and set(kinds) <= {":", "None"}
        and len(kinds) <= rank
        and kinds.index("None") - rank == dim
    )


def _contracted_state_dim(
    s_letters: tuple[str, ...], r_letters: tuple[str, ...], output: tuple[str, ...]
) -> int | None:
    """The state's dim (-2 or -1) that an einsum of the state (`s_letters`) and a query
    (`r_letters`) into `output` contracts, the batch dims kept; None for another einsum."""
    if len(s_letters) < 2 or len(r_letters) < 1:
        return None
    batch = s_letters[:-2]
    if r_letters[:-1] != batch or output[:-1] != batch:
        return None
    contracted = r_letters[-1]
    if contracted == s_letters[-2] and output[-1] == s_letters[-1]:
        key = -2
    elif contracted == s_letters[-1] and output[-1] == s_letters[-2]:
        key = -1
    else:
        return None
    if contracted in batch or len(set(s_letters)) != len(s_letters):
        return None
    return key


def _reads_along(term, r: Sym | None, key: int) -> bool:
    """A state term and a query r, the term's bonus (if any) along the `key` dim."""
    return term is not None and r is not None and (term[1] is None or term[2] == key)


def model_state(name: str) -> str:
    return name


def state_rank(state, from_update: bool = True) -> int | None:
    """The rank of the state's values: the rank its Prev reads were given, else (with
    `from_update`) its update's."""
    if isinstance(state, StateView):
        return state.rank
    found = []

    def walk(sym):
        if isinstance(sym, Prev) and sym.state == state.name and sym.rank is not None:
            found.append(sym.rank)
        elif isinstance(sym, Op):
            for a in sym.args:
                walk(a)

    walk(state.update)
    if found:
        return found[0]
    return state.update.rank if from_update else None


def _occurrences(sym: Sym, pair) -> int:
    name, mode = pair
    kind = {"prev": Prev, "new": New, "read": Read}[mode]
    if isinstance(sym, kind) and sym.state == name:
        return 1
    if isinstance(sym, Op):
        return sum(_occurrences(a, pair) for a in sym.args)
    return 0


def _element_kind(element: cst.SubscriptElement) -> str:
    s = element.slice
    if isinstance(s, cst.Index) and isinstance(s.value, cst.Ellipsis):
        return "..."
    if isinstance(s, cst.Index) and isinstance(s.value, cst.Name) and s.value.value == "None":
        return "None"
    if isinstance(s, cst.Slice) and s.lower is None and s.upper is None and s.step is None:
        return ":"
    return "?"


class StateView:
    """What `_read_out` needs of a state: its name, rank and its update's outer product."""

    def __init__(self, name: str, plan: Attention) -> None:
        self.name = name
        self.x = plan.x
        self.update = None
        self.rank = plan.state_rank


def strip_unsqueeze(sym: Sym, dim: int) -> Sym | None:
    if (
        isinstance(sym, Op)
        and sym.op == "unsqueeze"
        and (sym.params[0] == dim or (sym.rank is not None and dim >= 0 and sym.params[0] == dim - sym.rank))
    ):
        return sym.args[0]
    return None


def time_loops(context: FileContext) -> TimeLoops:
    return context.shared("time_loops", TimeLoops)

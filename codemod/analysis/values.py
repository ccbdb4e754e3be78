"""The one value analysis of expressions: what a name or expression holds (`Kinds`), the
dtype of a tensor and whether an expression is a Python number (`Values`).

## Kinds

What a name or expression holds: tensor, batch, module, optimizer, loader,
dataset or device, and for tensors and devices whether they live on the host or
on CUDA. Unknown stays unknown: rules fix only what this analysis can tell. (The
dtype of a tensor is asked of `Values`, below, which reads names through `sources`.)

Values are followed through the file's own code: a call of a function or method
of this file holds what its returns hold; a parameter holds what every call of
its function in this file passes (when the function is only ever called there);
a call of a `functools.partial(f, *args, **keywords)` object is a call of `f`, the
partial's arguments first and the call's keywords over the partial's (`partial_of`,
`Partial`); a call of a parameter gives what the functions its callers pass for it
return (a `def`, a lambda, a function handed on by their own callers: `_called_fact`);
`self.x` and `obj.x` hold what is assigned to the attribute (`attribute_values`, the
one attribute follower: the class's methods, its instances, what the constructions
of a dataclass pass its fields). A tensor computed by a model (or from such a
tensor) lives on the model's device (Place.DEVICE): a copy of it is not a
host-to-device copy.

Names are resolved flow-sensitively enough for training scripts: of the
bindings that come before a use, the latest one that dominates the use (it sits
in a block enclosing the use) hides the ones before it; it and the ones after it
are joined. Bindings later
in an enclosing loop reach the use too (they are carried to the next iteration),
unless the loop re-binds the name before the use (its own target, say). An
augmented assignment (`x += y`) updates the value it reads: `sources`, the one
follower from a read to the bindings whose value it may hold, goes through it to
the bindings it updates, and a tensor so updated keeps its place and memory.

DataLoader batches are taken to be host tensors unless the dataset is built
from device tensors.

A host tensor's memory is pinned (page-locked: a copy of it to CUDA can run
while the host goes on) or pageable (a copy is staged through a pinned buffer
by the host, so it cannot overlap anything). Pinned are the batches of a
DataLoader asked to pin them, `.pin_memory()` results, tensors made with
`pin_memory=True`, and views of these; pageable are tensors a factory, `torch.from_numpy`
or a tokenizer makes on the host, the batches of a DataLoader that does not pin,
and whatever is computed from pageable tensors alone (a new tensor, or one of its
inputs). Anything else is unknown. The batches of a loader a parameter takes are in
the memory of the loaders its callers pass (the calls of the file, and for a
top-level function those of the other modules of its package): pinned when every
caller's are; when only some are, `PassedMemory` names the calls whose loaders pin
and those whose loaders do not (or are not seen to).

## Dtypes and numbers (`Values`)

`Kinds` says what an expression holds and where (`fact`: kind, place, memory) and which
bindings a read may see (`reaching`, `sources`); `Values` asks it, and the training
program above it, for the dtype a tensor holds: as much of it as tells which Python
number `.item()` gives.

    values(context).dtype(expr)      FLOAT, INT64 or BOOL; None when unknown or not a tensor
    values(context).is_tensor(expr)  whether `expr` is a tensor, of any dtype
    values(context).named_dtype(expr)  FLOAT or COMPLEX for an expression that names a
                                     dtype (`torch.bfloat16`, a name bound to one)
    values(context).number(expr)     INT for a certain Python int, NUMBER for a certain
                                     Python number (int or float); None otherwise
    values(context).fixed_number(expr)  the number `expr` certainly holds (a literal, a name
                                     or a never-written field default bound to one), or None
    values(context).truth(test)      True / False when a condition certainly holds / does
                                     not at those numbers (`args.save_every > 0`), else None

The one number question (`number`), asked by every reader that needs to know that an
expression is a Python number and not a tensor (layouts, attention scales, position
bounds, host reads, the training facts): literals; arithmetic on numbers (int by
`+ - * // %` of ints; `/` and `**` give a number); `len(...)`, `int(...)`, `t.numel()`,
`t.dim()`, `t.ndim`, `t.size(0)`, `t.shape[0]`, `t.size()[0]`, `math.floor(...)` give
ints, `float(...)`, `math.*` and `.item()` numbers, `min` / `max` / `abs` / `round` of
numbers; a loop index of `range` / `enumerate`; names through `Kinds.sources` (an
assigned value, the element a tuple unpacks, `B, T, C = x.shape`, a counter `n += 1`, a
parameter annotated `int` or `float`, or whose default and every argument
`Kinds.arguments` gives are numbers, or whose default is one where no call of this file
is seen); `obj.attr` through the training facts' attribute values (`self.attr = 3`, an
argparse option's `choices`, a config field; an argparse option of one value converted
by `type=int` / `type=float`, `CommandLine.option_at`). The value of a literal is read by
`names.number_value`, the one literal parser.

What it reads:

- floating point: a torch loss (a loss function, a loss module `criterion(...)`), a
  gradient norm, a value whose backward runs (autograd differentiates floating point
  only: `loss.backward()`, `accelerator.backward(loss)`, `scaler.scale(loss).backward()`,
  `(loss / n).backward()`), true division, methods torch's table says give floating
  point (`.float()`, `.mean()`, `.norm()`);
- int64 and bool: methods the table says give them (`.argmax()`, `.long()`, `.isnan()`),
  a comparison of tensors, a sum of int64 or bool values, int64 added to, subtracted
  from or multiplied by int64 or bool;
- kept: the dtype of the receiver of `.detach()`, `.clone()`, ... and of `x.data`;
- names through `Kinds.sources` (the bindings a read may see, through `x += y`): an
  assigned value, the element a tuple target unpacks (`a, b = x, y`), what a function
  of this file returns there (`a, b = f(...)`), what every call of this file passes a
  parameter (`Kinds.passed`); a call of a function of this file through its returns.

Built once per file (FileContext.shared).
"""

from __future__ import annotations

import enum
import functools
import operator
import re
from bisect import bisect_left
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import Assignment, ComprehensionScope, QualifiedNameSource

from codemod.analysis import match as m
from codemod.analysis.bindings import Partial, argument_for, passed_by
from codemod.analysis.names import (
    CANONICAL,
    dict_entry,
    is_none,
    kwarg,
    method_name,
    methods_of,
    names_read,
    number_value,
    positional,
    sole_definition,
)
from codemod.analysis.node_types import type_test
from codemod.analysis.scopes import PerBindings, reads_of
from codemod.analysis.torch_facts import (
    ALL_LOSS_FUNCTIONS,
    ARGUMENTS_IN_ORDER_SETUP_METHODS,
    BOOL_RESULT_METHODS,
    COMPLEX_DTYPES,
    DATASET_CLASSES,
    DTYPE_KEEPING_METHODS,
    DTYPE_NAMES,
    FLOAT_DTYPES,
    FLOAT_RESULT_METHODS,
    GRAD_NORMS,
    HOST_ONLY_FACTORIES,
    INT64_DTYPES,
    INT64_RESULT_METHODS,
    INT_MATH_FUNCTIONS,
    INT_TORCH_FUNCTIONS,
    INTEGER_FACTORIES,
    LIKE_FACTORIES,
    LIST_BUILDERS,
    LOGGER_FACTORIES,
    LOSS_MODULES,
    MATH_CONSTANTS,
    MODULE_ATTRIBUTE_SETTERS,
    MODULE_METHODS,
    MODULE_METHODS_IN_PLACE,
    MODULE_TENSOR_METHODS,
    MUTATING_METHODS,
    NOT_SAME_PLACE_METHODS,
    NOT_TENSOR_FUNCTIONS,
    ORDER_ONLY_METHODS,
    PASS_THROUGH_ITERABLES,
    READ_ONLY_FUNCTIONS,
    READ_ONLY_METHODS,
    RETURN_TENSORS,
    SAME_PLACE_METHODS,
    SHAPED_FACTORIES,
    SHARING_ATTRIBUTES,
    STORAGE_VIEW_METHODS,
    STRING_SPLITS,
    SUBMODULE_METHODS,
    TENSOR_ATTRIBUTES,
    TENSOR_FACTORIES,
    TENSOR_FUNCTIONS,
    TENSOR_NAMESPACES,
    TENSOR_RESULT_METHODS,
    TUPLE_BUILDERS,
    VIEW_METHODS,
    chain_of_module_methods,
)

if TYPE_CHECKING:
    from codemod.analysis.command_line import Option
    from codemod.context import FileContext


# Facts computed for one question at most (typical questions need a few dozen).
WORK_PER_QUESTION = 5_000


class Kind(enum.Enum):
    TENSOR = "tensor"
    BATCH = "batch"  # what a DataLoader yields: a tuple/list/dict of tensors
    MODULE = "module"
    OPTIMIZER = "optimizer"
    LOADER = "loader"
    DATASET = "dataset"
    DEVICE = "device"
    UNKNOWN = "unknown"
    BOTTOM = "bottom"  # no value yet: the first guess while resolving a cycle such as `x = x.cuda()` in a loop


class Memory(enum.Enum):
    """What memory a host tensor is in (see the module docstring)."""

    PINNED = "pinned"
    PAGEABLE = "pageable"
    UNKNOWN = "unknown"

    def join(self, other: Memory) -> Memory:
        return self if self is other else Memory.UNKNOWN

    def derived(self, shares: bool) -> Memory:
        """The memory of a tensor computed from a tensor in this memory: a view keeps it;
        other results are new (pageable) memory or the operand itself, pageable from pageable."""
        return self if shares or self is Memory.PAGEABLE else Memory.UNKNOWN


@dataclass(frozen=True)
class PassedMemory:
    """The memory of the batches of a loader a parameter takes, when some of its callers
    pass a loader that pins them and others one that does not (or is not seen to): the
    copy of such a batch overlaps for the first, and stays synchronous for the others."""

    pinned: tuple[str, ...]  # `path:line` of each call that passes a loader that pins its batches
    others: tuple[str, ...]  # ... of each call that passes one that does not, or is not seen to

    def join(self, other: Memory | PassedMemory) -> Memory | PassedMemory:
        return self if self == other else Memory.UNKNOWN

    def derived(self, shares: bool) -> Memory | PassedMemory:
        return self if shares else Memory.UNKNOWN


def passed_memory(callers: list[tuple[str, Memory | PassedMemory]]) -> Memory | PassedMemory:
    """The memory of the batches of the loaders `callers` pass (the call's `path:line`, its
    loader's memory): pinned when every one pins, the join of theirs when none does."""
    pinned: list[str] = []
    others: list[str] = []
    for site, memory in callers:
        if isinstance(memory, PassedMemory):  # a caller that hands on a loader its own callers pass
            pinned += memory.pinned
            others += memory.others
        else:
            (pinned if memory is Memory.PINNED else others).append(site)
    if not others:
        return Memory.PINNED
    if not pinned:
        memories = {memory for _, memory in callers}
        return memories.pop() if len(memories) == 1 else Memory.UNKNOWN
    # each call once: two calls here may hand on the loader of the same call of their caller
    return PassedMemory(tuple(dict.fromkeys(pinned)), tuple(dict.fromkeys(others)))


class Place(enum.Enum):
    HOST = "host"
    CUDA = "cuda"
    DEVICE = "device"  # where the model runs: computed by a model, or from what it computed
    UNKNOWN = "unknown"

    def join(self, other: Place) -> Place:
        return self if self is other else Place.UNKNOWN


@dataclass(frozen=True)
class Fact:
    kind: Kind
    place: Place = Place.UNKNOWN
    single: bool = False  # a loader whose batches are single tensors (its dataset's items are tensors)
    memory: Memory | PassedMemory = Memory.UNKNOWN  # of a host tensor or batch; of a loader: of its batches

    def join(self, other: Fact) -> Fact:
        if self.kind is Kind.BOTTOM:
            return other
        if other.kind is Kind.BOTTOM:
            return self
        if self.kind is not other.kind:
            return UNKNOWN
        return Fact(
            self.kind, self.place.join(other.place), self.single and other.single, self.memory.join(other.memory)
        )

    def with_memory(self, memory: Memory | PassedMemory) -> Fact:
        return Fact(self.kind, self.place, self.single, memory)


UNKNOWN = Fact(Kind.UNKNOWN)
BOTTOM = Fact(Kind.BOTTOM)

# What iterating or unpacking yields: one fact, or a tuple of shapes (enumerate, zip).
Shape = Fact | tuple

# What a value annotated with one of these classes holds (PEP 585 subscripts and unions
# are looked through by Kinds.annotation_fact).
ANNOTATED = {
    "torch.Tensor": Fact(Kind.TENSOR),
    "torch.nn.Parameter": Fact(Kind.TENSOR),
    "torch.nn.parameter.Parameter": Fact(Kind.TENSOR),
    "torch.nn.Module": Fact(Kind.MODULE),
    "torch.utils.data.DataLoader": Fact(Kind.LOADER, Place.HOST),
    "torch.device": Fact(Kind.DEVICE),
    "torch.optim.Optimizer": Fact(Kind.OPTIMIZER),
    "torch.optim.optimizer.Optimizer": Fact(Kind.OPTIMIZER),
}

# Functions whose result is a tensor on the device of their tensor arguments.
# Tensor methods that return a tensor on the receiver's device.
DEVICE_NAME = re.compile(r"^(device|dev|\w+_device|\w+_dev|device_\w+)$")
DTYPE_NAME = re.compile(r"^(dtype|\w+_dtype)$")
DEVICE_STRING = re.compile(r"^(cuda|cpu|mps|xla|xpu|meta|hpu)(:\d+)?$")
ASSIGN_LIKE = (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.NamedExpr)
# The hottest type tests of the bindings' followers (codemod.analysis.node_types says why).
_is_assign_like = type_test(*ASSIGN_LIKE)
_is_target_wrapper = type_test(
    cst.Tuple, cst.List, cst.Element, cst.StarredElement, cst.AssignTarget, cst.AsName, cst.WithItem
)
_is_value_wrapper = type_test(cst.AssignTarget, cst.Element, cst.Tuple, cst.List, cst.AsName)
_is_loop_header, _is_for = type_test(cst.For, cst.CompFor), type_test(cst.For)
_is_for_or_with = type_test(cst.For, cst.With)
_is_definition_part = type_test(cst.FunctionDef, cst.Param, cst.Parameters)
_is_assignment, _is_comprehension_scope = type_test(Assignment), type_test(ComprehensionScope)
_is_name, _is_param, _is_call = type_test(cst.Name), type_test(cst.Param), type_test(cst.Call)
_is_attribute, _is_aug_assign = type_test(cst.Attribute), type_test(cst.AugAssign)
_is_with_item = type_test(cst.WithItem)
LOOPS = (cst.For, cst.While)
OBJECT_COPIES = ("copy.deepcopy", "copy.copy")
PARTIAL = "functools.partial"
MAX_PARTIAL_DEPTH = 3  # a partial of a partial of ..., followed this deep
# What perfmod's torchrun-ready rewrite (PM601) chooses the device with: it returns the device
# it is given (in a launch of several processes, this process's GPU of that type).
RUNTIME_SETUP = "runtime.distributed.setup"
CONTAINERS = (Kind.TENSOR, Kind.BATCH)  # what a list, tuple or dict of them is: a batch
FUNCTIONS = (cst.FunctionDef, cst.Lambda)
STATIC = ("staticmethod", "classmethod")
MAX_NAMESPACE_DEPTH = 4  # names an options namespace or a config object is followed through
MAX_LIST_DEPTH = 8  # names, parameters, attributes and copies a list is followed through
ITEM_COPIES = LIST_BUILDERS | TUPLE_BUILDERS  # `list(x)`, `sorted(x)`, `tuple(x)`: x's items (some of them)
# The methods through which assigning or reading one attribute may run code of the class.
HOOKED_ACCESS = frozenset({"__setattr__", "__getattr__", "__getattribute__", "__delattr__"})


def _leaves(block: cst.BaseSuite) -> bool:
    """Does the block end by leaving it for good (`raise`, `return`, `break`, `continue`)?"""
    last = block.body[-1] if isinstance(block, cst.IndentedBlock) and block.body else None
    if isinstance(block, cst.SimpleStatementSuite) or isinstance(last, cst.SimpleStatementLine):
        small = (block if isinstance(block, cst.SimpleStatementSuite) else last).body
        return bool(small) and isinstance(small[-1], (cst.Raise, cst.Return, cst.Break, cst.Continue))
    return False


MAX_RETURN_DEPTH = 4  # how many calls deep what functions of this file return is followed
# The comparisons `Values.truth` decides between numbers it knows.
NUMBER_COMPARISONS = {
    cst.LessThan: operator.lt,
    cst.LessThanEqual: operator.le,
    cst.GreaterThan: operator.gt,
    cst.GreaterThanEqual: operator.ge,
    cst.Equal: operator.eq,
    cst.NotEqual: operator.ne,
}
# (path, function, parameter) whose callers in other modules are being read: a module that
# passes the loader back to the one asking is not followed around again.
_PACKAGE_PARAMS_ASKED: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class Copy:
    """A `.to(...)` or `.cuda(...)` call, as PM101 and friends need it."""

    call: cst.Call
    method: str  # "to" or "cuda"
    receiver: Fact
    target: Place  # where the result lives
    moves_device: bool  # False for dtype-only `.to(torch.float16)`
    has_non_blocking: bool

    @property
    def uploads_host_tensor(self) -> bool:
        """Does it copy a tensor that lives on the host to the device?"""
        return self.moves_device and self.receiver.kind is Kind.TENSOR and self.receiver.place is Place.HOST


@dataclass(frozen=True)
class _NameBindings:
    ordered: list[Assignment]  # by where each takes effect
    bound_at: list[int]  # ... and those places, for bisection
    local: bool  # all bound in the scope the name is looked up from (not a comprehension)


@dataclass
class _AttributeWrites:
    """What one pass over a file finds setting the attributes of its classes' instances,
    keyed by the class's id."""

    # attribute -> (0 when `__init__` sets it, else 1; the value, None when it cannot be told)
    assigned: dict[int, dict[str, list[tuple[int, cst.BaseExpression | None]]]] = field(default_factory=dict)
    registered: dict[int, set[str]] = field(default_factory=dict)  # attributes a registering method names
    unnamed_registers: set[int] = field(default_factory=set)  # registering under a name made at run time
    unnamed_sets: set[int] = field(default_factory=set)  # `setattr` of a name made at run time

    def record(self, owner: cst.ClassDef, attr: str, value: cst.BaseExpression | None, in_init: bool) -> None:
        self.assigned.setdefault(id(owner), {}).setdefault(attr, []).append((0 if in_init else 1, value))

    def tables(self) -> dict[int, dict[str, list[cst.BaseExpression] | None] | None]:
        """attribute -> its values, `__init__`'s first, per class; None for a class whose
        instances `setattr` a name made at run time, and for an attribute with a value that
        cannot be told."""
        tables: dict[int, dict[str, list[cst.BaseExpression] | None] | None] = {key: None for key in self.unnamed_sets}
        for key, attributes in self.assigned.items():
            if key in self.unnamed_sets:
                continue
            table = tables[key] = {}
            for attr, found in attributes.items():
                values = [value for _, value in sorted(found, key=lambda pair: pair[0])]
                # a buffer registered under a name made at run time may replace one registered
                # by name (registering over an attribute assigned plainly fails)
                hidden = key in self.unnamed_registers and attr in self.registered.get(key, ())
                table[attr] = None if hidden or None in values else values
        return tables


class Kinds:
    """Facts about expressions of one file; computed on demand and cached."""

    def __init__(self, context: FileContext, any_caller: cst.FunctionDef | None = None) -> None:
        """`any_caller`: a function whose parameters hold what any caller may pass, not what
        this file's calls of it pass (what it returns to another module's call)."""
        self.names = context.names
        self.scopes = context.scopes
        self.index = context.index
        self.parents = context.parents
        self._context = context
        self._facts: dict[object, Fact | None] = {}  # id(expr), or ("joined", id(table)) -> fact
        self._guesses: dict[int, Fact] = {}  # expressions being resolved -> current guess
        self._recursive: set[int] = set()  # ... whose guess was used while resolving them
        self._computed: list[int] = []  # cache keys in the order they were filled
        # Facts that depend on themselves across many functions can make the fixpoint
        # recompute the same facts over and over (seen on 7,000-line files): past a
        # budget of computations per question a rule asks, facts not yet known are
        # UNKNOWN, which only makes rules report or leave code alone.
        self._spent = 0
        self._asking = 0
        self._class_kinds: dict[int, Fact] = {}
        self._default_device_changed = "set_default_device" in context.code or "set_default_tensor_type" in context.code
        self._callers: dict[int, list[tuple[cst.Call, int]] | None] = {}
        self._any_caller = any_caller
        self._attributes: dict[str, list[cst.Attribute]] | None = None  # attribute name -> its nodes
        self._class_attributes: dict[int, dict[str, list[cst.BaseExpression] | None]] | None = None
        self._instances = PerBindings()  # the local class bindings hold an instance of
        self._sources_of_bindings: dict[tuple[int, ...], tuple[list, list]] = {}  # see reaching_sources
        self._attribute_instances: dict[int, tuple[cst.Attribute, cst.ClassDef | None]] = {}  # ... and attributes
        # Binding node -> its statement, and where the binding takes effect: a name bound
        # many times is looked up from each of its uses.
        self._binding_statements: dict[int, cst.CSTNode] = {}
        self._bound_ats: dict[int, int] = {}
        self._scope_bindings: dict[int, tuple[object, dict[tuple[str, int], Assignment]]] = {}
        self._shared_sources: dict[int, tuple[_NameBindings, list[Assignment]]] = {}
        self._name_tables: dict[tuple[int, str], _NameBindings | None] = {}
        self._reachings: dict[cst.Name, list[Assignment]] = {}  # a use -> `reaching` (asked by many rules)
        self._shared_tables = PerBindings()  # the table of bindings not local to the scope reading them
        self._staying = PerBindings()  # do the bindings' modules only stay where they are
        self._annotations: dict[int, Fact] = {}  # annotation node -> what it says the value holds
        self._project_modules = None  # the project's own modules (codemod.analysis.project), when first asked
        self._partials_made = "partial" in context.code  # else no call is of a `functools.partial`
        self._partials: dict[int, tuple[cst.BaseExpression, tuple[cst.Call, ...]] | None] = {}
        # Parameters whose callers' functions are being read: a function that passes its
        # parameter to itself (`Tree(block, ...)` inside `Tree.__init__`) is not followed again.
        self._called_params_asked: set[int] = set()

    # -- public API ------------------------------------------------------------

    def fact(self, expr: cst.BaseExpression) -> Fact:
        return self._asked(self._fact, expr)

    def called_fact(self, value: cst.BaseExpression) -> Fact:
        """What a call of the function value `value` gives (`_called_fact`)."""
        return self._asked(self._called_fact, value)

    def _asked(self, compute, expr: cst.BaseExpression) -> Fact:
        """`compute(expr)` for a question a rule (or another module) asks, within the budget."""
        if not self._asking:
            self._spent = 0
        self._asking += 1
        try:
            fact = compute(expr)
        finally:
            self._asking -= 1
        return UNKNOWN if fact.kind is Kind.BOTTOM else fact

    def _fact(self, expr: cst.BaseExpression) -> Fact:
        """Facts of expressions that depend on themselves (`x = x.cuda()` in a loop)
        are found by iterating from BOTTOM until the guess is stable; facts cached
        meanwhile are dropped when the guess changes. The lattice is shallow
        (bottom < place known < place unknown < unknown), so this ends quickly."""
        key = id(expr)
        if key in self._facts:
            return self._facts[key]
        if key in self._guesses:
            self._recursive.add(key)
            return self._guesses[key]
        if self._spent >= WORK_PER_QUESTION:
            return UNKNOWN
        self._guesses[key] = BOTTOM
        while True:
            mark = len(self._computed)
            self._spent += 1
            fact = self._compute(expr)
            if key not in self._recursive or fact == self._guesses[key]:
                break
            self._guesses[key] = fact
            self._recursive.discard(key)
            for stale in self._computed[mark:]:
                self._facts.pop(stale, None)
            del self._computed[mark:]
        del self._guesses[key]
        self._recursive.discard(key)
        self._facts[key] = fact
        self._computed.append(key)
        return fact

    def device_place(self, expr: cst.BaseExpression) -> Place:
        """Where a device expression points: `"cuda:0"`, `torch.device(d)`, `x.device`, ..."""
        if isinstance(expr, cst.SimpleString):
            return _string_place(expr.evaluated_value)
        if values(self._context).is_int(expr):  # a device ordinal: `.to(local_rank)`
            return Place.CUDA
        if isinstance(expr, cst.IfExp):
            return self.device_place(expr.body).join(self.device_place(expr.orelse))
        fact = self.fact(expr)
        if fact.kind is Kind.DEVICE:
            return fact.place
        return Place.UNKNOWN

    def is_device(self, expr: cst.BaseExpression) -> bool:
        """Does this expression certainly name a device (not a dtype or a tensor)?"""
        if isinstance(expr, cst.SimpleString):
            value = expr.evaluated_value
            return isinstance(value, str) and bool(DEVICE_STRING.match(value))
        if isinstance(expr, cst.Integer):
            return True
        if isinstance(expr, cst.FormattedString):
            return expr.start.lower().endswith(("f'", 'f"')) and _fstring_prefix(expr).startswith("cuda")
        if isinstance(expr, cst.IfExp):
            return self.is_device(expr.body) and self.is_device(expr.orelse)
        if self.fact(expr).kind is Kind.DEVICE:
            return True
        named = _device_named(expr)
        return named is not None and bool(DEVICE_NAME.match(named))

    def is_dtype(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.Attribute) and expr.attr.value == "dtype":
            return True
        if isinstance(expr, (cst.Attribute, cst.Name)) and any(
            n.startswith("torch.") and n.rsplit(".", 1)[1] in DTYPE_NAMES for n in self.names.of(expr)
        ):
            return True
        return isinstance(expr, cst.Name) and bool(DTYPE_NAME.match(expr.value))

    def host_uploads(self, node: cst.CSTNode) -> list[cst.Call]:
        """The `.to()` / `.cuda()` calls under `node` that copy a tensor living on the host
        to the device (`Copy.uploads_host_tensor`), in document order."""
        found = []
        for call in self.index.find(cst.Call, within=node):
            copy = self.copy_of(call) if method_name(call) in ("to", "cuda") else None
            if copy is not None and copy.uploads_host_tensor:
                found.append(call)
        return found

    def copy_of(self, call: cst.Call) -> Copy | None:
        """Describe `<receiver>.to(...)` / `<receiver>.cuda(...)`; None when it is neither
        or when the arguments cannot be told apart (device vs dtype)."""
        method = method_name(call)
        if method not in ("to", "cuda") or any(arg.star for arg in call.args):
            return None
        receiver = self.fact(call.func.value)
        non_blocking = kwarg(call, "non_blocking") is not None
        if method == "cuda":
            return Copy(call, "cuda", receiver, Place.CUDA, True, non_blocking or positional(call, 1) is not None)
        device = kwarg(call, "device")
        first, second = positional(call, 0), positional(call, 1)
        if device is not None:
            target = device.value
        elif first is None:
            return Copy(call, "to", receiver, receiver.place, False, non_blocking) if kwarg(call, "dtype") else None
        elif self.is_dtype(first.value):
            return Copy(call, "to", receiver, receiver.place, False, non_blocking or second is not None)
        elif self.is_device(first.value) or (second is not None and self.is_dtype(second.value)):
            target = first.value
            non_blocking = non_blocking or positional(call, 2) is not None
        elif self.fact(first.value).kind is Kind.TENSOR:  # `.to(other)`: device and dtype of other
            other = self.fact(first.value)
            return Copy(call, "to", receiver, other.place, True, non_blocking or second is not None)
        else:
            return None
        return Copy(call, "to", receiver, self.device_place(target), True, non_blocking)

    def reaching(self, use: cst.Name) -> list[Assignment]:
        """The bindings of this file whose value `use` may read (as the module docstring
        describes: those from the latest one before it that dominates it, and later ones
        carried round a loop); empty when one is not an assignment here."""
        found = self._reachings.get(use)
        if found is None:
            scope = self.scopes.get(use)
            table = self._name_table(scope, use.value) if scope is not None else None
            found = self._reachings[use] = [] if table is None else self._reaching(use, table)
        return list(found)

    def sources(self, use: cst.Name) -> list[Assignment]:
        """The bindings whose value `use` may read: those that reach it (`reaching`), and
        for an augmented assignment among them (`x += y` updates the value it reads), the
        bindings that reach its target too, and so on; for a name a binding binds, that
        binding (and what it updates). In the order of the file."""
        found: dict[int, Assignment] = {}
        scope = self.scopes.get(use)
        bound = [self._bound_by(scope).get((use.value, id(use)))] if scope is not None else []
        bound = [b for b in bound if b is not None]
        if bound:  # the name a binding binds: the value it binds
            found[id(bound[0])] = bound[0]
        updates = not bound or isinstance(self.parents.get(use), cst.AugAssign)
        table = self._name_table(scope, use.value) if scope is not None and not bound else None
        if table is not None and not table.local:
            # Read from a scope inside the one that binds it: every read there gets the same
            # answer (computed once per table; a name bound hundreds of times at module level).
            cached = self._shared_sources.get(id(table))
            if cached is None:
                cached = self._shared_sources[id(table)] = (table, self._sources_of(use, found))
            return list(cached[1])
        return self._sources_of(use, found, updates)

    def value_sources(self, name: cst.Name) -> list[cst.BaseExpression | None]:
        """The expressions the value `name` may read comes from: the source of each binding
        that reaches it (`sources`; for `x += y` it is `y`; for a tuple target, the element
        it unpacks where `element` tells it, else the whole value), and for a parameter of
        a function of this file, what every call of that function passes (or its default).
        None entries where that cannot be told."""
        found: list[cst.BaseExpression | None] = []
        for site, source in self.reaching_sources(name):
            if source is None and _is_param(site):
                found.extend(self.passed_to(site))
            else:
                found.append(source)
        return found

    def parameter_read(self, name: cst.Name) -> tuple[cst.FunctionDef, cst.Param] | None:
        """The function and parameter whose value the read `name` takes, where that parameter
        is the one binding that reaches it (`x = x.to(device)` reads the parameter `x`,
        though the function binds `x` again); None otherwise."""
        found = self.sources(name)
        if len(found) != 1 or not _is_param(found[0].node):
            return None
        function = self.parents.get(self.parents.get(found[0].node))
        return (function, found[0].node) if isinstance(function, cst.FunctionDef) else None

    def reaching_sources(self, name: cst.Name) -> list[tuple[cst.CSTNode, cst.BaseExpression | None]]:
        """(binding node, source) of each binding whose value `name` may read (`sources`):
        the expression the binding takes its value from (`binding_source`), for a tuple
        target the element it unpacks where that can be told (`element`)."""
        bindings = self.sources(name)
        key = tuple(map(id, bindings))  # the same bindings for many reads (a module-level name read in functions)
        known = self._sources_of_bindings.get(key)
        if known is None:
            found = []
            for binding in bindings:
                source = self.binding_source(binding.node)
                unpacked = self._context.bindings.unpacked(binding)
                element = self.element(*unpacked) if unpacked is not None else None
                found.append((binding.node, element if element is not None else source))  # `a, b = x, y`: `x` for `a`
            known = self._sources_of_bindings[key] = (bindings, found)  # the bindings are kept: their ids stay unique
        return list(known[1])

    def binding_source(self, target: cst.CSTNode) -> cst.BaseExpression | None:
        """The expression a binding target takes its value from: the value of an
        assignment (the whole value for a target inside a tuple), the iterable of a `for`,
        the item of a `with`; None for other bindings (parameters, imports, definitions)."""
        current = target
        while True:
            parent = self.parents.get(current)
            if _is_value_wrapper(parent):
                current = parent
                continue
            break
        if _is_assign_like(parent):
            return parent.value
        if _is_for(parent) and parent.target is current:
            return parent.iter
        if _is_with_item(parent):
            return parent.item
        return None

    def passed_to(self, param: cst.Param) -> list[cst.BaseExpression | None]:
        """What every call of this file passes to `param` (`arguments`); [None] where that
        cannot be told (`self`, a function called from elsewhere)."""
        if self.self_class(param) is not None:
            return [None]
        found = self.arguments(param)
        return [value for _, value in found] if found else [None]

    def _sources_of(self, use: cst.Name, found: dict[int, Assignment], updates: bool = True) -> list[Assignment]:
        todo = [use] if updates else []
        while todo:
            for binding in self.reaching(todo.pop()):
                if id(binding) in found:
                    continue
                found[id(binding)] = binding
                if _is_name(binding.node) and _is_aug_assign(self.parents.get(binding.node)):
                    todo.append(binding.node)
        return sorted(found.values(), key=lambda b: self.index.order(b.node))

    def _bound_by(self, scope) -> dict[tuple[str, int], Assignment]:
        """(name, id of the node) -> the binding of `scope` that node makes, for every
        binding of the scope, found once (`scope.assignments[name]` copies the name's
        bindings on every look-up: a name bound hundreds of times in one scope)."""
        found = self._scope_bindings.get(id(scope))
        if found is None:
            table = {
                (name, id(binding.node)): binding
                for name, bindings in scope._assignments.items()
                for binding in bindings
            }
            found = self._scope_bindings[id(scope)] = (scope, table)  # the scope is kept: its id stays unique
        return found[1]

    def element(self, value: cst.BaseExpression, index: int, depth: int = 0) -> cst.BaseExpression | None:
        """What `a, b = value` gives its `index`-th name: that element of a tuple or list
        display, or that argument of a set-up call that hands back what it is given, in
        order (`model, opt = accelerator.prepare(model, opt)`), or that element of what a
        function of this file returns where it has one `return` (`g, d = build(device)`);
        None otherwise."""
        if isinstance(value, cst.Call) and depth < MAX_RETURN_DEPTH:
            function = self._runs(value)
            returns, yields = self.exits(function) if function is not None else ((), ())
            if len(returns) == 1 and not yields and returns[0].value is not None:
                return self.element(returns[0].value, index, depth + 1)
        if isinstance(value, (cst.Tuple, cst.List)):
            elements = value.elements
            if index < len(elements) and not any(isinstance(e, cst.StarredElement) for e in elements):
                return elements[index].value
            return None
        if (
            isinstance(value, cst.Call)
            and method_name(value) in ARGUMENTS_IN_ORDER_SETUP_METHODS
            and index < len(value.args)
            and all(a.keyword is None and not a.star for a in value.args)
        ):
            return value.args[index].value
        return None

    def reached_reads(self, binding: Assignment) -> list[cst.Name]:
        """The reads whose value may be this binding's (flow-sensitive in its scope, as
        `reaching`: a read after a later binding that hides this one on every path is not
        among them; a read before it in a loop around both is). Reads in nested scopes
        (closures, comprehensions) that may see it are all among them."""
        scope = binding.scope
        # libcst links a read to the bindings before it, not to one a loop carries round.
        own = [access.node for access in scope.accesses[binding.name] if isinstance(access.node, cst.Name)]
        # `x += 1` reads `x` too, though libcst records its target as a binding only.
        own += [
            other.node
            for other in scope.assignments[binding.name]
            if other is not binding
            and isinstance(other.node, cst.Name)
            and isinstance(self.parents.get(other.node), cst.AugAssign)
        ]
        nested = [
            access.node
            for access in binding.references
            if isinstance(access.node, cst.Name) and access.scope is not scope
        ]
        reached = [read for read in own if binding in self.reaching(read)]
        return sorted(reached + nested, key=self.index.order)

    def carried_reads(self, loop: cst.For | cst.While, within: cst.CSTNode) -> list[cst.Name]:
        """The reads in `within` (a part of `loop`'s body) of a value that an earlier
        iteration of `loop` bound: `h` in `h = cell(x[i], h)`, state one iteration hands to
        the next."""
        positions, found = self._context.positions, []
        for use in names_read(within):
            start = (positions[use].start.line, positions[use].start.column)
            # A binding whose statement ends after the read (later in the body, or the same
            # `h = cell(x, h)`) reaches it only from an earlier iteration.
            ends = (
                positions[self._context.bindings.statement(a.node)].end
                for a in self.reaching(use)
                if self.index.inside(a.node, loop.body)
            )
            if any((end.line, end.column) > start for end in ends):
                found.append(use)
        return found

    def bindings_in(self, node: cst.CSTNode, name: str) -> list[Assignment]:
        """The bindings of `name` made inside `node` (in the scope `node` is in)."""
        scope = self.scopes.get(node)
        if scope is None:
            return []
        return [a for a in scope.assignments[name] if isinstance(a, Assignment) and self.index.inside(a.node, node)]

    def storage_root(self, expr: cst.BaseExpression) -> cst.BaseExpression:
        """The variable whose storage `expr` may share: `buf` for `buf[0].float()`
        (indexing makes views, and a conversion to the same dtype returns self)."""
        while True:
            if isinstance(expr, cst.Subscript) or (
                isinstance(expr, cst.Attribute) and expr.attr.value in TENSOR_ATTRIBUTES
            ):
                expr = expr.value
            elif isinstance(expr, cst.Call) and method_name(expr) in SAME_PLACE_METHODS:
                expr = expr.func.value
            else:
                return expr

    def is_mutated_in_place(self, name: cst.Name) -> bool:
        """Is the variable behind `name` written in place anywhere in its scope
        (`buf.copy_(...)`, `buf[i] = ...`, `buf += ...`, `out=buf`), also through a part or a
        view of its storage (`buf[:n].copy_(a)`, `buf[:, 0] = a`, `buf.narrow(0, 0, n).fill_(0)`,
        `buf.numpy()[:] = a`, `col = buf[:, 0]` then `col.copy_(a)`), or such a view handed to
        a call that may write it (`np.copyto(buf.numpy(), a)`: not `leaves_arguments_alone`)?
        The tensor itself, or an item of it, handed to a call is taken to be left alone here
        (the name may be a device copy by then: `x = x.to(device)`; `normalize(x)`);
        `variance`, which moves code, is stricter."""
        return self._written_in_place(name, set())

    def _written_in_place(self, name: cst.Name, seen: set[str]) -> bool:
        """`is_mutated_in_place`, `seen` the names of views of the storage already asked."""
        scope = self.scopes.get(name)
        if scope is None:
            return True
        seen.add(name.value)
        if any(isinstance(self.parents.get(a.node), cst.AugAssign) for a in scope.assignments[name.value]):
            return True  # `buf += 1` is an in-place add on a tensor
        for access in scope.accesses[name.value]:
            node, parent, viewed_by_call = access.node, self.parents.get(access.node), False
            while True:
                if isinstance(parent, cst.Attribute) and parent.value is node:
                    call = self.parents.get(parent)
                    if isinstance(call, cst.Call) and call.func is parent:
                        if parent.attr.value.endswith("_") and not parent.attr.value.startswith("_"):
                            return True
                        if parent.attr.value not in STORAGE_VIEW_METHODS:
                            break
                        node, viewed_by_call = call, True  # a view of the same storage
                    elif parent.attr.value in SHARING_ATTRIBUTES:
                        node = parent  # `buf.T`, `buf.data`
                    else:
                        break
                elif isinstance(parent, cst.Subscript) and parent.value is node:
                    holder = self.parents.get(parent)
                    if (
                        isinstance(holder, cst.AssignTarget)
                        or isinstance(holder, cst.AugAssign)
                        and holder.target is parent
                    ):
                        return True  # `buf[i] = a`, `buf[:n] += a`
                    node = parent  # an item or slice shares the storage
                else:
                    break
                parent = self.parents.get(node)
            if isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "out":
                return True
            call = self.parents.get(parent)
            if (
                isinstance(parent, cst.Arg)
                and isinstance(call, cst.Call)
                and viewed_by_call  # a view of its storage: `np.copyto(buf.numpy(), a)`
                and not self.leaves_arguments_alone(call)
            ):
                return True
            if node is not access.node and isinstance(parent, cst.Assign) and parent.value is node:
                views = [t.target for t in parent.targets if isinstance(t.target, cst.Name)]
                if any(view.value not in seen and self._written_in_place(view, seen) for view in views):
                    return True  # `col = buf[:, 0]` then `col.copy_(a)`
        return False

    def leaves_arguments_alone(self, call: cst.Call) -> bool:
        """Is `call` known to change none of its arguments: a call of READ_ONLY_FUNCTIONS, a
        model's call (taken not to change its inputs), or a method of a tensor, a container
        or a model (which change their receiver at most)? A function of this file is taken
        to leave them alone too: what it writes is `call_writes`'s question."""
        if self.local_callee(call) is not None or self.names.of(call.func) & READ_ONLY_FUNCTIONS:
            return True
        if self.fact(call.func).kind is Kind.MODULE:
            return True
        method = method_name(call)
        if method is None:
            return False
        receiver = self.fact(call.func.value).kind
        return (
            method in MUTATING_METHODS
            or method in READ_ONLY_METHODS
            or receiver in (Kind.TENSOR, Kind.BATCH)
            or (method in MODULE_METHODS and receiver is Kind.MODULE)
        )

    def class_fact(self, classdef: cst.ClassDef) -> Fact:
        """MODULE / LOADER / DATASET for classes of this file deriving from torch's."""
        key = id(classdef)
        if key not in self._class_kinds:
            self._class_kinds[key] = UNKNOWN
            fact = UNKNOWN
            for base in classdef.bases:
                fact = self._class_ref_fact(base.value)
                if fact.kind is not Kind.UNKNOWN:
                    break
            self._class_kinds[key] = fact
        return self._class_kinds[key]

    def local_class(self, expr: cst.BaseExpression) -> cst.ClassDef | None:
        """The class statement of this file that `expr` (a Name) refers to."""
        return sole_definition(self.scopes, expr, cst.ClassDef)

    def enclosing(self, node: cst.CSTNode, types) -> Iterator[cst.CSTNode]:
        """Ancestors of `node` of the given types, innermost first."""
        return self.index.enclosing(node, types)

    # -- expressions -------------------------------------------------------------

    def _compute(self, expr: cst.BaseExpression) -> Fact:
        if isinstance(expr, cst.Name):
            return self._name_fact(expr)
        if isinstance(expr, cst.Call):
            return self._call_fact(expr)
        if isinstance(expr, cst.Subscript):
            owner = self._fact(expr.value)
            named = _device_named(expr)
            if (
                named is not None
                and DEVICE_NAME.match(named)
                and owner.kind not in (Kind.BATCH, Kind.TENSOR, Kind.BOTTOM)
            ):
                return Fact(Kind.DEVICE)  # `cfg["device"]`
            element = _element(owner)
            if owner.kind is Kind.TENSOR and owner.memory is Memory.PINNED and not self._basic_index(expr):
                # `x[idx]` with an index tensor or list: a copy, in new memory
                return element.with_memory(owner.memory.derived(False))
            return element
        if isinstance(expr, cst.Attribute):
            return self._attribute_fact(expr)
        if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
            if any(isinstance(e, cst.StarredElement) for e in expr.elements):
                return UNKNOWN
            return _container([self._fact(e.value) for e in expr.elements] + self._appended(expr))
        if isinstance(expr, cst.Dict):
            if any(not isinstance(e, cst.DictElement) for e in expr.elements):
                return UNKNOWN
            return _container([self._fact(e.value) for e in expr.elements])
        if isinstance(expr, (cst.ListComp, cst.SetComp, cst.GeneratorExp)):
            return _container([self._fact(expr.elt)])
        if isinstance(expr, cst.DictComp):
            return _container([self._fact(expr.value)])
        if isinstance(expr, cst.BinaryOperation):
            return _tensor_join([self._fact(expr.left), self._fact(expr.right)])
        if isinstance(expr, cst.Comparison):  # `(day >= 5)`: a bool tensor where its operands are
            return _tensor_join([self._fact(expr.left), *(self._fact(c.comparator) for c in expr.comparisons)])
        if isinstance(expr, cst.UnaryOperation):
            operand = self._fact(expr.expression)
            if operand.kind is Kind.TENSOR:
                return operand.with_memory(operand.memory.derived(False))
            return operand if operand.kind is Kind.BOTTOM else UNKNOWN
        if isinstance(expr, cst.IfExp):
            return self._fact(expr.body).join(self._fact(expr.orelse))
        if isinstance(expr, cst.SimpleString) and self.is_device(expr):
            return Fact(Kind.DEVICE, self.device_place(expr))
        return UNKNOWN

    def _basic_index(self, subscript: cst.Subscript) -> bool:
        """Does `subscript` index with slices, integers (literals, counters of a `for` over
        `range(...)`) and `None` only: a view of a tensor, not a copy as an index tensor or
        list gives? A string index is a key of a batch taken for a tensor: the value it holds."""
        for element in subscript.slice:
            if isinstance(element.slice, cst.Slice):
                continue
            value = element.slice.value
            if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
                value = value.expression
            if isinstance(value, (cst.Integer, cst.Ellipsis, cst.SimpleString)):
                continue
            if isinstance(value, cst.Name) and (value.value == "None" or self._range_counter(value)):
                continue
            return False
        return True

    def _range_counter(self, name: cst.Name) -> bool:
        """Is every binding that reaches `name` the target of a `for` over `range(...)`?"""
        bindings = self.reaching(name)
        for binding in bindings:
            statement = self._binding_statement(binding.node) if isinstance(binding.node, cst.Name) else None
            if not (
                isinstance(statement, cst.For)
                and statement.target is binding.node
                and isinstance(statement.iter, cst.Call)
                and self.names.is_(statement.iter.func, "range", "builtins.range")
            ):
                return False
        return bool(bindings)

    def _appended(self, literal: cst.BaseExpression) -> list[Fact]:
        """Facts of what is appended to the list `xs = [...]` later (`xs.append(x)`,
        `xs.extend(more)`), for a list literal bound to a plain name."""
        if not isinstance(literal, cst.List):
            return []
        name = self._bound_to(literal)
        if name is None:
            return []
        scope = self.scopes.get(name)
        assignment = (
            next((a for a in scope.assignments[name.value] if a.node is name), None) if scope is not None else None
        )
        found = []
        for access in assignment.references if assignment is not None else ():
            attribute = self.parents.get(access.node)
            call = self.parents.get(attribute)
            if (
                isinstance(attribute, cst.Attribute)
                and isinstance(call, cst.Call)
                and call.func is attribute
                and call.args
            ):
                if attribute.attr.value in ("append", "insert"):
                    found.append(self._fact(call.args[-1].value))
                elif attribute.attr.value == "extend":
                    found.append(_element(self._fact(call.args[0].value)))
        return found

    def _bound_to(self, value: cst.BaseExpression) -> cst.Name | None:
        """The name `value` is assigned to: `xs = value`, or `xs, ys = value, other`."""
        parent = self.parents.get(value)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            target = parent.targets[0].target
            return target if isinstance(target, cst.Name) else None
        if isinstance(parent, cst.Element):
            container = self.parents.get(parent)
            statement = self.parents.get(container)
            if (
                isinstance(container, cst.Tuple)
                and isinstance(statement, cst.Assign)
                and statement.value is container
                and len(statement.targets) == 1
                and isinstance(statement.targets[0].target, (cst.Tuple, cst.List))
            ):
                targets = statement.targets[0].target.elements
                position = list(container.elements).index(parent)
                if len(targets) == len(container.elements) and isinstance(targets[position].value, cst.Name):
                    return targets[position].value
        return None

    def _attribute_fact(self, expr: cst.Attribute) -> Fact:
        attr = expr.attr.value
        assigned = self.attribute_values(expr)
        if assigned:  # `self.x`, assigned in the methods of its class
            facts = [self._fact(value) for value in assigned]
            result = facts[0]
            for fact in facts[1:]:
                result = result.join(fact)
            if result.kind is Kind.MODULE:
                owner = self._fact(expr.value)
                if owner.kind is Kind.MODULE:  # a submodule moves with its module (`model.to(device)`)
                    result = Fact(Kind.MODULE, result.place.join(owner.place))
            if result.kind is not Kind.UNKNOWN:
                return result
        if attr == "device":
            owner = self._fact(expr.value)
            if owner.kind is Kind.BOTTOM:
                return BOTTOM
            place = owner.place if owner.kind in (Kind.TENSOR, Kind.MODULE) else Place.UNKNOWN
            return Fact(Kind.DEVICE, Place.UNKNOWN if place is Place.DEVICE else place)
        if attr in TENSOR_ATTRIBUTES:
            owner = self._fact(expr.value)
            if owner.kind is not Kind.TENSOR:
                return UNKNOWN
            return owner.with_memory(owner.memory.derived(attr in SHARING_ATTRIBUTES))
        if DEVICE_NAME.match(attr):
            return Fact(Kind.DEVICE)  # `args.device`, `cfg.train_device`
        owner = self._fact(expr.value)
        if owner.kind is Kind.BATCH:  # `encoding.input_ids`, `batch.x`
            return Fact(Kind.TENSOR, owner.place, memory=owner.memory)
        return BOTTOM if owner.kind is Kind.BOTTOM else UNKNOWN

    def _call_fact(self, call: cst.Call) -> Fact:
        for name in sorted(self.names.of(call.func)):
            fact = self._library_call_fact(name, call)
            if fact is not None:
                return fact
        encoded = kwarg(call, RETURN_TENSORS)
        if (
            encoded is not None
            and isinstance(encoded.value, cst.SimpleString)
            and encoded.value.evaluated_value == "pt"
        ):
            return Fact(Kind.BATCH, Place.HOST, memory=Memory.PAGEABLE)  # a Hugging Face BatchEncoding: CPU tensors
        local = self.local_class(call.func)
        if local is not None:
            return self._built_module(self.class_fact(local), call)
        function = self._runs(call)
        if function is not None:
            iterated = self._yielded_argument(call, function)
            return self._fact(iterated) if iterated is not None else self._returns_fact(function)
        imported = self._project_call_fact(call)
        if imported is not None:
            return imported
        loss = self._loss_module_output(call)
        if loss is not None:
            return loss
        if isinstance(call.func, cst.Attribute) and self.attribute_values(call.func):
            callee = self._fact(call.func)  # `self.model(x)`
            if callee.kind is Kind.MODULE:
                return Fact(Kind.TENSOR, _computed_on(callee.place))
        method = method_name(call)
        if method is not None:
            return self._method_fact(call, method)
        callee = self._fact(call.func)
        if callee.kind is Kind.MODULE:  # model(x)
            return Fact(Kind.TENSOR, _computed_on(callee.place))
        if callee.kind is Kind.UNKNOWN and isinstance(call.func, cst.Name):
            return self._called_parameter_fact(call.func)  # `make_batches()` of a function its callers pass
        return BOTTOM if callee.kind is Kind.BOTTOM else UNKNOWN

    def _yielded_argument(self, call: cst.Call, function: cst.FunctionDef) -> cst.BaseExpression | None:
        """The argument of `call` whose items the generator `function` of this file yields:
        `cycle(loader)` iterates the loader's batches, as `iter(loader)` does, whatever
        other calls of `cycle` pass."""
        from codemod.analysis.project import yielded_items_of

        if self.class_of(function) is not None:
            return None
        param = yielded_items_of(self._context, function)
        return passed_by(call, function, param, self.receiver_offset(call, function)) if param is not None else None

    def _loss_module_output(self, call: cst.Call) -> Fact | None:
        """`criterion(out, y)` for `criterion = nn.CrossEntropyLoss()` (or `self.criterion`):
        a loss module holds no parameters, so its output is where its input is."""
        bindings = self._context.bindings
        if isinstance(call.func, cst.Name):
            values = bindings.values(call.func)
        elif isinstance(call.func, cst.Attribute):
            values = self.attribute_values(call.func)
        else:
            return None
        if not values or not all(isinstance(v, cst.Call) and self.names.of(v.func) & LOSS_MODULES for v in values):
            return None
        first = positional(call, 0)
        fact = self._fact(first.value) if first is not None else UNKNOWN
        return Fact(Kind.TENSOR, fact.place) if fact.kind is Kind.TENSOR else None

    def _factory_fact(self, name: str, call: cst.Call) -> Fact:
        """The tensor a factory makes where it is told (`device=`), else where the tensor a
        `_like` factory copies is, else on the default device."""
        memory = self._factory_memory(name, call)
        device, first = kwarg(call, "device"), positional(call, 0)
        if device is not None:  # made where the run computes, when that may be the GPU or the CPU
            place = self.device_place(device.value)
            return Fact(Kind.TENSOR, Place.DEVICE if place is Place.UNKNOWN else place, memory=memory)
        if name in LIKE_FACTORIES and first is not None:
            like = self._fact(first.value)
            return Fact(Kind.TENSOR, like.place if like.kind is Kind.TENSOR else Place.UNKNOWN, memory=memory)
        return Fact(Kind.TENSOR, Place.UNKNOWN if self._default_device_changed else Place.HOST, memory=memory)

    def _library_call_fact(self, name: str, call: cst.Call) -> Fact | None:
        first = positional(call, 0)
        if name in TENSOR_FACTORIES:
            return self._factory_fact(name, call)
        if name in HOST_ONLY_FACTORIES:  # numpy's or a buffer's memory: pageable
            return Fact(Kind.TENSOR, Place.HOST, memory=Memory.PAGEABLE)
        if name in PASS_THROUGH_ITERABLES and first is not None:
            return self._fact(first.value)  # `iter(loader)`, `tqdm(loader)`: iterates the same items
        if name in ("next", "builtins.next") and first is not None:
            return _as_fact(self._item_shape(first.value))
        if name in TENSOR_FUNCTIONS or _in_tensor_namespace(name):
            values = [a.value for a in call.args if a.keyword is None and not a.star]
            if values and isinstance(values[0], (cst.List, cst.Tuple)):  # `torch.stack([x, y])`
                values = [e.value for e in values[0].elements if isinstance(e, cst.Element)] + values[1:]
            return _tensor_join([self._fact(v) for v in values])
        if name in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            return self._fact(first.value) if first else UNKNOWN
        if name in ("torch.device", RUNTIME_SETUP):
            return Fact(Kind.DEVICE, self.device_place(first.value) if first else Place.UNKNOWN)
        if name == "torch.utils.data.DataLoader":
            return Fact(Kind.LOADER, self._loader_place(call), self._single_items(call), self._loader_memory(call))
        if name in DATASET_CLASSES:
            return _tensor_join([self._fact(a.value) for a in call.args], Kind.DATASET, default=Place.HOST)
        if name == "torch.compile":
            return self._fact(first.value) if first else UNKNOWN
        fact = self._class_name_fact(name)
        return self._built_module(fact, call) if fact is not None else None

    def _class_name_fact(self, name: str) -> Fact | None:
        """Kinds of library classes, from their qualified name alone."""
        head, _, last = name.rpartition(".")
        if not last[:1].isupper():
            if name.startswith("transformers.") and last == "from_pretrained":
                owner = head.rsplit(".", 1)[-1]
                if "Model" in owner and "Tokenizer" not in owner and "Config" not in owner:
                    return Fact(Kind.MODULE)
            return None
        if name.startswith("torch.optim.") and ".lr_scheduler" not in name:
            return Fact(Kind.OPTIMIZER)
        if name.startswith("torch.nn.") and not name.startswith(
            ("torch.nn.functional", "torch.nn.parameter", "torch.nn.init", "torch.nn.utils")
        ):
            return Fact(Kind.MODULE)
        return None

    def _built_module(self, fact: Fact, call: cst.Call) -> Fact:
        """A module just built: on the host (or on its `device=`), unless the default device
        was changed; whether it stays there is decided where a name holds it."""
        if fact.kind is not Kind.MODULE or fact.place is not Place.UNKNOWN:
            return fact
        device = kwarg(call, "device")
        if device is not None:
            return Fact(Kind.MODULE, self.device_place(device.value))
        return fact if self._default_device_changed else Fact(Kind.MODULE, Place.HOST)

    def _stays(self, name: cst.Name) -> bool:
        """Is the module `name` holds only called, or asked for its parameters and modes, so
        that nothing can move it in place (`model.to(device)`, `prepare(model)`, `model.fc...`)?"""
        scope = self.scopes.get(name)
        if scope is None:
            return False
        return self._staying.get(scope[name.value], self._bindings_stay)

    def _bindings_stay(self, bindings) -> bool:
        for access in reads_of(bindings):
            parent = self.parents.get(access.node)
            if isinstance(parent, cst.Call) and parent.func is access.node:
                continue
            if (
                isinstance(parent, cst.Attribute)
                and parent.value is access.node
                and parent.attr.value in MODULE_METHODS_IN_PLACE
            ):
                continue
            return False
        return True

    def _class_ref_fact(self, base: cst.BaseExpression) -> Fact:
        """What instances of the class named by `base` are."""
        for name in self.names.of(base):
            if name == "torch.utils.data.DataLoader":
                return Fact(Kind.LOADER, Place.HOST)
            if name in DATASET_CLASSES:
                return Fact(Kind.DATASET, Place.HOST)
            fact = self._class_name_fact(name)
            if fact is not None:
                return fact
        local = self.local_class(base)
        return self.class_fact(local) if local is not None else UNKNOWN

    def _method_fact(self, call: cst.Call, method: str) -> Fact:
        receiver = self._fact(call.func.value)
        if receiver.kind is Kind.BOTTOM:
            return BOTTOM
        if method in ("to", "cuda"):
            copy = self.copy_of(call)
            if copy is None or receiver.kind not in (Kind.TENSOR, Kind.MODULE):
                return UNKNOWN
            if not copy.moves_device:  # a cast: the receiver, or a new tensor where it is
                return Fact(receiver.kind, copy.target, memory=receiver.memory.derived(False))
            return Fact(receiver.kind, copy.target)
        if method == "cpu":
            if receiver.kind not in (Kind.TENSOR, Kind.MODULE):
                return UNKNOWN
            # the receiver itself when it is on the host, else a new pageable tensor
            memory = {Place.HOST: receiver.memory, Place.CUDA: Memory.PAGEABLE, Place.DEVICE: Memory.PAGEABLE}
            return Fact(receiver.kind, Place.HOST, memory=memory.get(receiver.place, Memory.UNKNOWN))
        if method == "pin_memory":
            return Fact(Kind.TENSOR, Place.HOST, memory=Memory.PINNED) if receiver.kind is Kind.TENSOR else UNKNOWN
        if receiver.kind is Kind.TENSOR and (
            method in SAME_PLACE_METHODS or (method not in NOT_SAME_PLACE_METHODS and not method.startswith("is_"))
        ):
            # views keep the receiver's memory, as in-place methods (`x.mul_(2)`) return it
            shares = method in VIEW_METHODS or (method.endswith("_") and not method.startswith("_"))
            return receiver.with_memory(receiver.memory.derived(shares))
        if method in ("get", "pop") and receiver.kind is Kind.BATCH:
            return _element(receiver)  # `batch.get("input_ids")`
        return UNKNOWN

    def _single_items(self, call: cst.Call) -> bool:
        """Does the loader `call` builds batch single tensors: the default collate over a
        dataset class of this file whose `__getitem__` returns a tensor?"""
        if kwarg(call, "collate_fn") is not None or positional(call, 6) is not None or any(a.star for a in call.args):
            return False
        dataset = kwarg(call, "dataset") or positional(call, 0)
        value = dataset.value if dataset is not None else None
        if isinstance(value, cst.Name):
            scope = self.scopes.get(value)
            bindings = list(scope[value.value]) if scope is not None else []
            if len(bindings) != 1 or type(bindings[0]) is not Assignment:
                return False
            statement = self._binding_statement(bindings[0].node)
            value = (
                statement.value
                if isinstance(statement, cst.Assign)
                and len(statement.targets) == 1
                and statement.targets[0].target is bindings[0].node
                else None
            )
        if not isinstance(value, cst.Call):
            return False
        classdef = self.local_class(value.func)
        getitem = methods_of(classdef).get("__getitem__") if classdef is not None else None
        if getitem is None or any(
            isinstance(s, cst.FunctionDef) and s.name.value in ("__getitems__", "__iter__") for s in classdef.body.body
        ):
            return False
        returned = self.returned(getitem)
        return (
            bool(returned)
            and len(returned) == len(self.exits(getitem)[0])
            and all(
                self.fact(v).kind is Kind.TENSOR and not isinstance(v, (cst.Tuple, cst.List, cst.Dict))
                for v in returned
            )
        )

    def _factory_memory(self, name: str, call: cst.Call) -> Memory:
        """The memory a torch factory makes its tensor in: pinned with `pin_memory=True`,
        else new pageable memory (`torch.as_tensor` of a tensor may return that tensor)."""
        pin = kwarg(call, "pin_memory")
        if pin is not None:
            return _flag_memory(pin.value)
        first = positional(call, 0)
        if name == "torch.as_tensor" and first is not None:
            given = self._fact(first.value)
            if given.kind in CONTAINERS:
                return given.memory.derived(False)
        return Memory.PAGEABLE

    def _loader_memory(self, call: cst.Call) -> Memory:
        """The memory of the batches of the DataLoader `call` builds: pinned when it is
        asked to pin them (`pin_memory=` anything but a false literal, in the call or in the
        one `**dict` literal it is given), pageable from the default collate, else unknown."""
        pin = kwarg(call, "pin_memory") or positional(call, 7)
        stars = [arg for arg in call.args if arg.star]
        if pin is None and len(stars) == 1 and stars[0].star == "**":
            value = self._dict_entry(stars[0].value, "pin_memory")
            if value is None:
                return Memory.UNKNOWN  # the dict may get the key elsewhere
        elif pin is None and stars:
            return Memory.UNKNOWN
        else:
            value = pin.value if pin is not None else None
        memory = _flag_memory(value) if value is not None else Memory.PAGEABLE
        custom_collate = kwarg(call, "collate_fn") is not None or positional(call, 6) is not None
        return Memory.UNKNOWN if memory is Memory.PAGEABLE and custom_collate else memory

    def _dict_entry(self, expr: cst.BaseExpression, key: str, depth: int = 0) -> cst.BaseExpression | None:
        """The value of the entry `key` of the dict literal (or `dict(...)` call) the name
        `expr` is bound to once, or of a dict literal it is updated with (`kw.update(more)`),
        if it has one."""
        if not isinstance(expr, cst.Name) or depth > 2:
            return None
        assignments = self._context.bindings.assignments(expr)
        if not assignments or len(assignments) != 1:
            return None
        found = _literal_entry(self._context.bindings.assigned_value(assignments[0]), key, self.names)
        for access in assignments[0].references:
            if found is not None:
                break
            attribute = self.parents.get(access.node)
            call = self.parents.get(attribute)
            if (
                isinstance(attribute, cst.Attribute)
                and attribute.attr.value == "update"
                and isinstance(call, cst.Call)
                and call.func is attribute
                and len(call.args) == 1
            ):
                update = call.args[0].value
                found = _literal_entry(update, key, self.names) or self._dict_entry(update, key, depth + 1)
        return found

    def _loader_place(self, call: cst.Call) -> Place:
        dataset = kwarg(call, "dataset") or positional(call, 0)
        if dataset is None:
            return Place.UNKNOWN
        fact = self._fact(dataset.value)
        return fact.place if fact.kind is Kind.DATASET else Place.HOST

    # -- names ---------------------------------------------------------------------

    def _name_fact(self, name: cst.Name) -> Fact:
        scope = self.scopes.get(name)
        if scope is None:
            return UNKNOWN
        table = self._name_table(scope, name.value)
        if table is None:
            return UNKNOWN  # unbound, or builtins and imports: not values we track
        if table.local:
            result = self._joined(self._reaching(name, table))
        else:  # every binding reaches every use: joined once for all of them, and dropped
            # with the facts it was computed from while a guess changes (see _fact)
            key = ("joined", id(table))
            if key in self._facts:
                result = self._facts[key]
            else:
                result = self._facts[key] = self._joined(table.ordered)
                self._computed.append(key)
        if result is None:
            return UNKNOWN
        if result.kind is Kind.MODULE and result.place is Place.HOST and not self._stays(name):
            return Fact(Kind.MODULE)  # may be moved in place somewhere
        return result

    def _joined(self, bindings: list[Assignment]) -> Fact | None:
        result = None
        for binding in bindings:
            fact = self._binding_fact(binding.node)
            result = fact if result is None else result.join(fact)
        return result

    def _name_table(self, scope, name: str) -> _NameBindings | None:
        """The bindings of `name` seen from `scope`, in the order they take effect (built
        once per scope and name: a name bound many times is looked up from each use)."""
        key = (id(scope), name)
        if key in self._name_tables:
            return self._name_tables[key]
        found = scope[name]
        bindings = list(found)
        table = None
        if bindings and all(_is_assignment(a) for a in bindings):
            local = all(a.scope is scope and not _is_comprehension_scope(a.scope) for a in bindings)
            # The scopes that read a name bound around them (each comprehension and function
            # reading a module-level name) share one table.
            table = self._table(bindings, local) if local else self._shared_tables.get(found, self._table)
        self._name_tables[key] = table
        return table

    def _table(self, bindings: Collection[Assignment], local: bool = False) -> _NameBindings:
        ordered = sorted(bindings, key=lambda a: self._bound_at(a.node))
        return _NameBindings(ordered, [self._bound_at(a.node) for a in ordered], local)

    def _reaching(self, use: cst.Name, table: _NameBindings) -> list[Assignment]:
        if not table.local:
            return table.ordered  # bound in an enclosing scope or a comprehension: no order to use
        use_at = self._start(use)
        split = bisect_left(table.bound_at, use_at)
        # Of the bindings that end before the use, a loop's target read in its own `in`
        # clause binds after it; every other one binds before.
        in_own_loop = any(
            _is_loop_header(ancestor) and self.index.inside(use, ancestor.iter)
            for ancestor in self.index.ancestors(use)
        )
        after = [b for b in table.ordered[:split] if not self._binds_before(b.node, use, use_at)] if in_own_loop else []
        # The latest binding before the use on every path to it hides the earlier ones; so
        # does a `try` that binds the name in its body and in each handler that goes on.
        reaching = []
        hiding = None  # what hides the earlier bindings: a binding, or such a `try`
        for k in range(split - 1, -1, -1):
            binding = table.ordered[k]
            if in_own_loop and not self._binds_before(binding.node, use, use_at):
                continue
            if any(b is binding for b in reaching):
                continue  # (taken with the `try` that hides the earlier ones)
            reaching.append(binding)
            if self._dominates(binding.node, use):
                hiding = binding.node
                break
            covering = self._binding_try(binding.node, use, table)
            if covering is not None:
                reaching.extend(
                    b
                    for b in table.ordered[:split]
                    if self.index.inside(b.node, covering)
                    and all(b is not r for r in reaching)
                    and (not in_own_loop or self._binds_before(b.node, use, use_at))
                )
                hiding = covering
                break
        reaching.sort(key=lambda b: self.index.order(b.node))
        # innermost first; none asked for when no binding comes after the use
        loops = list(self.enclosing(use, LOOPS)) if after or split < len(table.ordered) else []
        if not loops:
            return reaching
        loops_end = self.index.end(loops[-1])
        # (the later bindings are walked, not copied: a name bound hundreds of times)
        for binding in chain(after, islice(table.ordered, split, None)):
            if self._bound_at(binding.node) > loops_end:
                break  # ends past every loop around the use: cannot reach it
            # A later binding reaches the use through the innermost loop around both.
            loop = next((loop for loop in loops if self.index.inside(binding.node, loop)), None)
            if loop is None:
                continue
            if hiding is not None and self.index.inside(hiding, loop):
                continue  # re-bound in every iteration before the use
            reaching.append(binding)
        return reaching

    def _binding_try(self, target: cst.CSTNode, use: cst.Name, table: _NameBindings) -> cst.Try | None:
        """The `try` around the binding `target` that binds its name on every way out of it
        but an exception (a statement of its body binds it, and so does one of each handler
        that does not end by leaving: `raise`, `return`, `break`, `continue`), where the use
        comes after the `try` in the block that holds it; None otherwise."""
        covering = self.index.first_enclosing(target, (cst.Try,))
        if covering is None or self.index.inside(use, covering):
            return None
        block = self._block_of(covering)
        if block is None or not self.index.inside(use, block):
            return None
        bound_in = {  # the blocks a statement of which always binds the name when it runs
            id(self._block_of(statement))
            for statement in map(self._binding_statement, (b.node for b in table.ordered))
            if isinstance(statement, (cst.Assign, cst.AugAssign, cst.With))
            or (isinstance(statement, cst.AnnAssign) and statement.value is not None)
        }
        if id(covering.body) not in bound_in:
            return None
        for handler in covering.handlers:
            if id(handler.body) not in bound_in and not _leaves(handler.body):
                return None
        return covering

    def _binds_before(self, target: cst.CSTNode, use: cst.Name, use_at) -> bool:
        statement = self._binding_statement(target)
        if isinstance(statement, ASSIGN_LIKE):
            return not self.index.inside(use, statement) and self._bound_at(target) < use_at
        if isinstance(statement, (cst.For, cst.CompFor)) and self.index.inside(use, statement.iter):
            return False
        return self._bound_at(target) < use_at

    def _bound_at(self, target: cst.CSTNode) -> int:
        """Where the binding takes effect, in document order: after its whole statement
        for assignments (`x = x + 1` reads the old `x`), after the target otherwise."""
        key = id(target)
        found = self._bound_ats.get(key)
        if found is None:
            statement = self._binding_statement(target)
            found = self._bound_ats[key] = self.index.end(statement if _is_assign_like(statement) else target)
        return found

    def _start(self, node: cst.CSTNode) -> int:
        return self.index.order(node)

    def _dominates(self, target: cst.CSTNode, use: cst.CSTNode) -> bool:
        statement = self._binding_statement(target)
        if _is_for_or_with(statement):
            return self.index.inside(use, statement.body)
        if _is_definition_part(statement):
            return True
        block = self._block_of(statement)
        return block is not None and self.index.inside(use, block)

    def _block_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.index.first_enclosing(node, (cst.IndentedBlock, cst.Module, cst.SimpleStatementSuite))

    def _binding_statement(self, target: cst.CSTNode) -> cst.CSTNode:
        """The Assign / For / CompFor / With / ... that binds `target`."""
        key = id(target)
        found = self._binding_statements.get(key)
        if found is not None:
            return found
        current = target
        while True:
            parent = self.parents.get(current)
            if parent is None or not _is_target_wrapper(parent):
                found = self._binding_statements[key] = parent if parent is not None else current
                return found
            current = parent

    def _binding_fact(self, target: cst.CSTNode) -> Fact:
        if isinstance(target, cst.Param):
            return self._param_fact(target)
        if not isinstance(target, cst.Name):
            return UNKNOWN
        path: list[int] = []
        current: cst.CSTNode = target
        while True:
            parent = self.parents.get(current)
            if isinstance(parent, cst.StarredElement):
                return UNKNOWN
            if isinstance(parent, cst.Element):
                container = self.parents.get(parent)
                path.append(list(container.elements).index(parent))
                current = container
                continue
            break
        path.reverse()
        statement = self._binding_statement(target)
        if isinstance(statement, cst.Assign):
            if not path:
                return self._fact(statement.value)
            return _destructure(self._value_shape(statement.value), path)
        if isinstance(statement, (cst.AnnAssign, cst.NamedExpr)) and statement.value is not None:
            if isinstance(statement, cst.AnnAssign):
                annotated = self.annotation_fact(statement.annotation.annotation)
                if annotated.kind is not Kind.UNKNOWN:
                    value = self._fact(statement.value)
                    return value if value.kind in (annotated.kind, Kind.BOTTOM) else annotated
            if not path:
                return self._fact(statement.value)
            return _destructure(self._value_shape(statement.value), path)
        if isinstance(statement, (cst.For, cst.CompFor)):
            return _destructure(self._item_shape(statement.iter), path)
        if isinstance(statement, cst.AugAssign):
            # `x += y` on a tensor updates it in place: where and in what memory it is
            # stays what it was (the bindings that reach its target, as `sources` reads it)
            updated = self._fact(target)
            return updated if updated.kind in (Kind.TENSOR, Kind.BOTTOM) else UNKNOWN
        return UNKNOWN

    def _param_fact(self, param: cst.Param) -> Fact:
        function = self.parents.get(self.parents.get(param))
        classdef = self.self_class(param)
        if classdef is not None:  # `self` of a model's method is the model
            fact = self.class_fact(classdef)
            if fact.kind is not Kind.UNKNOWN:
                return fact
        passed = self.arguments(param) if not _is_init(function) else None
        if passed and all(value is not None for _, value in passed):  # what every call in this file passes
            result = functools.reduce(Fact.join, (self._fact(value) for _, value in passed), BOTTOM)
            if result.kind is Kind.LOADER:  # and, of a top-level function, the package's calls
                loader = self._passed_loader(function, param, passed)
                return loader if loader.kind is Kind.LOADER else result.with_memory(Memory.UNKNOWN)
            if result.kind is not Kind.UNKNOWN:
                return result
        elif self._unnamed_here(function) and self._iterated_or_handed_on(param):  # a loader other modules pass
            found = self._passed_loader(function, param, [])
            if found.kind is Kind.LOADER:
                return found
        if param.annotation is not None:
            annotated = self.annotation_fact(param.annotation.annotation)
            if annotated.kind is not Kind.UNKNOWN:
                return annotated
        if DEVICE_NAME.match(param.name.value):
            return Fact(Kind.DEVICE)
        return UNKNOWN

    def _unnamed_here(self, function: cst.CSTNode | None) -> bool:
        """Is `function` a plain top-level function of this file that the file never names
        (so that only other modules can call it)?"""
        if not isinstance(function, cst.FunctionDef) or function.decorators or self.class_of(function) is not None:
            return False
        scope = self.scopes.get(function)
        found = list(scope.assignments[function.name.value]) if scope is not None else []
        return len(found) == 1 and found[0].node is function and not found[0].references

    def _iterated_or_handed_on(self, param: cst.Param) -> bool:
        """Is `param` read where a loader it holds would matter: iterated (`for b in p`, a
        comprehension) or handed to a call (`iter(p)`, `next(p)`, a generator over it,
        another function)? Only then is it worth reading what other modules pass to it."""
        if DEVICE_NAME.match(param.name.value):
            return False
        scope = self.scopes.get(param)
        for binding in scope.assignments[param.name.value] if scope is not None else ():
            for access in binding.references if binding.node is param else ():
                parent = self.parents.get(access.node)
                if isinstance(parent, cst.Arg) or (
                    isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is access.node
                ):
                    return True
        return False

    def _passed_loader(
        self,
        function: cst.FunctionDef,
        param: cst.Param,
        here: list[tuple[cst.Call, cst.BaseExpression]],
        called: bool = False,
    ) -> Fact:
        """The loader `param` of `function` takes from the calls `here` (of this file, each
        passing a loader) and, of a top-level function, from the calls of the other modules
        of its package (what one of those passes that cannot be told is what the annotation
        of `param` says). Its batches are in the memory `passed_memory` makes of the
        callers' loaders. UNKNOWN when a call of another module passes no loader or cannot
        be followed; BOTTOM when no call passes one. `called`: `param` takes a function,
        and what a call of it gives is asked of what the callers pass (`_called_fact`)."""
        project = self._project()
        value_fact = self._called_fact if called else self._fact
        callers = [(project.shown_in(self._context, call), value_fact(value)) for call, value in here]
        elsewhere = (
            self._package_arguments(function, param, called)
            if self.parents.get(function) is self._context.module
            else []
        )
        if elsewhere is None:
            return UNKNOWN
        annotated = (
            self.annotation_fact(param.annotation.annotation)
            if param.annotation is not None and not called
            else UNKNOWN
        )
        for site, fact in elsewhere:
            fact = annotated.with_memory(Memory.UNKNOWN) if fact.kind is Kind.UNKNOWN else fact
            callers.append((site, fact))
        callers = [(site, fact) for site, fact in callers if fact.kind is not Kind.BOTTOM]  # passing nothing yet
        loader = functools.reduce(Fact.join, (fact for _, fact in callers), BOTTOM)
        if loader.kind is not Kind.LOADER:
            return loader if loader.kind is Kind.BOTTOM else UNKNOWN
        return loader.with_memory(passed_memory([(site, fact.memory) for site, fact in callers]))

    def _package_arguments(
        self, function: cst.FunctionDef, param: cst.Param, called: bool = False
    ) -> list[tuple[str, Fact]] | None:
        """What each call of `function` in the other modules of the package passes to `param`
        (the call's `path:line`, the fact there; `called`: what a call of the function it
        passes gives); None when a call cannot be followed."""
        key = (self._context.path, function.name.value, param.name.value)
        if key in _PACKAGE_PARAMS_ASKED:  # modules that pass the loader back and forth
            return None
        project = self._project()
        _PACKAGE_PARAMS_ASKED.add(key)
        try:
            found = project.package_arguments(function, param) if project.folder is not None else []
            if found is None:
                return None
            return [
                (project.shown_in(there, call), there.kinds.called_fact(value) if called else there.kinds.fact(value))
                for there, call, value in found
            ]
        finally:
            _PACKAGE_PARAMS_ASKED.discard(key)

    def _called_parameter_fact(self, name: cst.Name) -> Fact:
        """What a call of the parameter `name` gives, when its callers pass it functions
        (`create_iter=make_train_iter`): what those functions return (`_called_fact`), the
        loaders among them in the memory `_passed_loader` makes of theirs; UNKNOWN when a
        caller passes something else or cannot be seen."""
        parameter = self._context.bindings.param_of(name)
        if parameter is None:
            return UNKNOWN
        function, param = parameter
        passed = self.arguments(param)
        if passed is None and not self._unnamed_here(function):
            return UNKNOWN  # called where perfmod cannot see
        if passed and any(value is None for _, value in passed):
            return UNKNOWN
        if id(param) in self._called_params_asked:
            return UNKNOWN
        self._called_params_asked.add(id(param))
        try:
            return self._passed_loader(function, param, passed or [], called=True)
        finally:
            self._called_params_asked.discard(id(param))

    def _called_fact(self, value: cst.BaseExpression) -> Fact:
        """What a call of the function value `value` gives, its parameters holding what any
        caller may pass: a function of this file (a `def` or a lambda, by name or in place),
        a `functools.partial` of one, a parameter its callers pass functions to, or a
        function of another module of the project (`Project.returned`)."""
        wrapped = self.partial_of(value)
        if wrapped is not None:
            value = wrapped[0]
        if isinstance(value, cst.Lambda):
            return self._fact(value.body)
        if isinstance(value, cst.Name):
            function = sole_definition(self.scopes, value, cst.FunctionDef)
            if function is not None:
                return self._returns_fact(function) if self.class_of(function) is None else UNKNOWN
            assigned = self._context.bindings.values(value)
            if assigned is not None:  # `make_iter = lambda: iter(loader)`
                if not all(isinstance(v, cst.Lambda) for v in assigned):
                    return UNKNOWN
                return functools.reduce(Fact.join, (self._fact(v.body) for v in assigned), BOTTOM)
            if self._context.bindings.param_of(value) is not None:
                return self._called_parameter_fact(value)
        project = self._project()  # `data.make_iter` or `make_iter` of another module
        imported = project.function(value) if project.folder is not None else None
        return (project.returned(imported) or UNKNOWN) if imported is not None else UNKNOWN

    def partial_of(self, func: cst.BaseExpression) -> tuple[cst.BaseExpression, tuple[cst.Call, ...]] | None:
        """The function a `functools.partial` object `func` wraps, and the partial
        constructions that bind its first arguments (innermost first, as `Partial.made`):
        `func` is `partial(f, ...)` itself or a name bound once, to one; a partial of a
        partial is followed to the function."""
        if not self._partials_made:
            return None
        key = id(func)
        if key not in self._partials:
            self._partials[key] = None  # a name bound to a partial of itself
            self._partials[key] = self._compute_partial(func, 0)
        return self._partials[key]

    def _compute_partial(
        self, func: cst.BaseExpression, depth: int
    ) -> tuple[cst.BaseExpression, tuple[cst.Call, ...]] | None:
        made = func
        if isinstance(func, cst.Name):
            assigned = self._context.bindings.values(func)
            made = assigned[0] if assigned is not None and len(assigned) == 1 else None
        if not (
            isinstance(made, cst.Call)
            and made.args
            and made.args[0].keyword is None
            and not made.args[0].star
            and self.names.is_(made.func, PARTIAL)
        ):
            return None
        wrapped = made.args[0].value
        inner = self._compute_partial(wrapped, depth + 1) if depth < MAX_PARTIAL_DEPTH else None
        return (inner[0], (*inner[1], made)) if inner is not None else (wrapped, (made,))

    # -- the file's own functions, methods and attributes ------------------------------

    def local_callee(self, call: cst.Call) -> cst.FunctionDef | None:
        """The function or method of this file `call` calls, if perfmod can tell."""
        return self._local_callee(call.func)

    def returns(self, function: cst.FunctionDef) -> Fact:
        """What a call of `function` gives."""
        fact = self._returns_fact(function)
        return UNKNOWN if fact.kind is Kind.BOTTOM else fact

    def in_memory_list(self, expr: cst.BaseExpression, tuples: bool = True, depth: int = 0) -> bool:
        """Is `expr` a Python list (or, unless `tuples` is False, a tuple) the program holds,
        all of it in memory: a list or tuple display or a list comprehension, `list(...)`,
        `sorted(...)`, `random.sample(...)`, `.split()` of a string, a name every binding of
        which is one (`docs = []` filled by `docs.append(...)` counts), or a call of a
        function of this file every `return` of which is one? Not a dataset, a generator or
        a file read lazily."""
        if depth > 4:
            return False
        if isinstance(expr, (cst.List, cst.ListComp)) or (tuples and isinstance(expr, cst.Tuple)):
            return True
        if isinstance(expr, cst.Name):
            values = self._context.bindings.values(expr)
            return bool(values) and all(self.in_memory_list(value, tuples, depth + 1) for value in values)
        if not isinstance(expr, cst.Call):
            return False
        builders = LIST_BUILDERS | TUPLE_BUILDERS if tuples else LIST_BUILDERS
        if self.names.of(expr.func) & builders or method_name(expr) in STRING_SPLITS:
            return True
        callee = self.local_callee(expr)
        if callee is None:
            return False
        returns, yields = self.exits(callee)
        return (
            not yields
            and bool(returns)
            and all(r.value is not None and self.in_memory_list(r.value, tuples, depth + 1) for r in returns)
        )

    def argument(self, call: cst.Call, function: cst.FunctionDef, param: cst.Param, offset: int | Partial):
        """What `call` passes to `param` (None when it cannot be told or is not passed)."""
        return argument_for(call, function, param, offset)

    def partial_callee(self, call: cst.Call) -> cst.FunctionDef | None:
        """The function of this file a call of a `functools.partial` runs (`step =
        partial(train_step, model, opt)`, `step(batch)`), for what running it does; None
        for any other call. Its parameters take the partial's arguments first, which
        `callee`'s readers do not map: they are not handed it."""
        wrapped = self.partial_of(call.func)
        return self._local_callee(wrapped[0]) if wrapped is not None else None

    def returned_closure(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
        """The function nested in a function of this file that `func` holds, where `func` is a
        name bound once, to a call of that function, every `return` of which gives the nested
        function (`def make_step(model): def step(x): ...; return step`, `step =
        make_step(model)`): a call of `func` runs it, its arguments its parameters."""
        values = self._context.bindings.values(func) if isinstance(func, cst.Name) else None
        if not values or len(values) != 1 or not isinstance(values[0], cst.Call):
            return None
        maker = self._local_callee(values[0].func)
        returns = self.exits(maker)[0] if maker is not None else []
        found = {
            sole_definition(self.scopes, r.value, cst.FunctionDef) if isinstance(r.value, cst.Name) else None
            for r in returns
        }
        closure = found.pop() if len(found) == 1 else None
        return closure if closure is not None and self.parents.get(self.parents.get(closure)) is maker else None

    def _runs(self, call: cst.Call) -> cst.FunctionDef | None:
        """The function of this file `call` runs, also through the `functools.partial` it
        calls (`partial_of`), for what the call gives: its arguments are the partial's and
        its own (`receiver_offset`), which `local_callee`'s readers do not map."""
        wrapped = self.partial_of(call.func)
        return self._local_callee(wrapped[0] if wrapped is not None else call.func)

    def _local_callee(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
        """The function of this file a call of `func` calls: `helper(...)` or
        `self.helper(...)` / `obj.helper(...)` on an instance of a class of this file."""
        if isinstance(func, cst.Name):
            found = sole_definition(self.scopes, func, cst.FunctionDef)
            if found is not None:
                return found if self.class_of(found) is None else None
        if isinstance(func, cst.Attribute):
            classdef = self.instance_class(func.value)
            method = methods_of(classdef).get(func.attr.value) if classdef is not None else None
            if method is not None:
                return method
        # `tokenizer(texts)` or `self.tokenizer(texts)` on an instance: its `__call__`
        classdef = self.instance_class(func) if isinstance(func, (cst.Name, cst.Attribute)) else None
        return methods_of(classdef).get("__call__") if classdef is not None else None

    def method(self, classdef: cst.ClassDef, name: str) -> cst.FunctionDef | None:
        """The method `name` the body of `classdef` defines (the last definition wins)."""
        return methods_of(classdef).get(name)

    def is_logger(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` a logger: the `logging` module, or a name every binding of which is
        a logger a factory builds (`logger = logging.getLogger(__name__)`)? A call of
        one of its methods only writes a log."""
        if self.names.is_(expr, "logging"):
            return True
        values = self._context.bindings.values(expr) if isinstance(expr, cst.Name) else None
        return bool(values) and all(
            isinstance(v, cst.Call) and self.names.of(v.func) & LOGGER_FACTORIES for v in values
        )

    def class_of(self, function: cst.FunctionDef) -> cst.ClassDef | None:
        """The class whose body defines `function`, if it is a method."""
        block = self.parents.get(function)
        owner = self.parents.get(block) if isinstance(block, cst.IndentedBlock) else None
        return owner if isinstance(owner, cst.ClassDef) else None

    def instance_class(self, expr: cst.BaseExpression) -> cst.ClassDef | None:
        """The class of this file `expr` is an instance of: the `self` of one of its methods
        (read in the method or in a function nested in it), a name every binding of which
        holds one (a construction of the class, what every call passes a parameter, what a
        function of this file returns), an attribute every value of which does
        (`self.callback` set to the `callback` its constructions pass), or such a call itself."""
        if _is_attribute(expr):
            if id(expr) not in self._attribute_instances:
                self._attribute_instances[id(expr)] = (expr, None)  # (an attribute holding itself: not told)
                values = self.attribute_values(expr)
                self._attribute_instances[id(expr)] = (expr, self._class_of_values(values) if values else None)
            return self._attribute_instances[id(expr)][1]
        if _is_call(expr):  # `Trainer(model).fit(...)`
            return self._class_of_values([expr])
        if not _is_name(expr):
            return None
        scope = self.scopes.get(expr)
        if scope is None:
            return None
        bindings = scope[expr.value]
        if not bindings:
            return None
        if len(bindings) == 1:
            param = getattr(next(iter(bindings)), "node", None)
            owner = self.self_class(param) if isinstance(param, cst.Param) else None
            if owner is not None:
                return owner
        # (a parameter passed on to itself asks about its own bindings: None, not followed)
        return self._instances.get(bindings, self._compute_instance_class)

    def instance_classes(self, expr: cst.BaseExpression, depth: int = 0) -> tuple[cst.ClassDef, ...] | None:
        """The classes of this file `expr` may be an instance of: its `instance_class`, or, for
        a name bound only as the target of loops over lists of instances of several (`for cb
        in self.callbacks:` over `[Checkpoint(path), Janitor()]`, `listed_items`) or as a
        parameter given such instances, each of them. None when one value cannot be told."""
        one = self.instance_class(expr)
        if one is not None:
            return (one,)
        scope = self.scopes.get(expr) if _is_name(expr) and depth <= MAX_LIST_DEPTH else None
        bindings = list(scope[expr.value]) if scope is not None else []
        items = []
        for binding in bindings:  # each loop that binds the name (`for cb in ...:` twice)
            node = binding.node if type(binding) is Assignment else None
            found = self.iterated_items(node) if node is not None else None
            if found is None and isinstance(node, cst.Param):
                found = self.passed(node)
            if found is None:
                return None
            items.extend(found)
        classes = []
        for item in items:
            found = self.instance_classes(item, depth + 1) if _is_name(item) else _one(self._class_of_values([item]))
            if found is None:
                return None
            classes.extend(found)
        return tuple(dict.fromkeys(classes)) or None

    def receiver_offset(self, call: cst.Call, function: cst.FunctionDef) -> int | Partial:
        """How many of `function`'s parameters `call` fills before its own arguments: 1 for
        a method of a class of this file called on an object (`obj.step(x)` fills `self`, as
        `obj(x)` does for its `__call__`), 0 for a function or a static method; for a call of a `functools.partial` of
        `function`, the `Partial` whose arguments come first."""
        wrapped = self.partial_of(call.func)
        func = wrapped[0] if wrapped is not None else call.func
        params = function.params.params
        # `obj.step(x)` fills `self`, and so does `obj(x)` running the class's `__call__`
        bound = isinstance(func, cst.Attribute) or function.name.value == "__call__"
        offset = int(bound and bool(params) and self.self_class(params[0]) is not None)
        return Partial(wrapped[1], offset) if wrapped is not None else offset

    def self_class(self, param: cst.Param) -> cst.ClassDef | None:
        """The class of this file whose instance `param` is as the first parameter of one of
        its methods (`self`; not of a static method)."""
        method = self.parents.get(self.parents.get(param))
        if (
            isinstance(method, cst.FunctionDef)
            and method.params.params
            and method.params.params[0] is param
            and not _decorated(method, STATIC)
        ):
            return self.class_of(method)
        return None

    def _compute_instance_class(self, bindings) -> cst.ClassDef | None:
        if not all(type(a) is Assignment for a in bindings):
            return None
        values = []
        for binding in bindings:
            if isinstance(binding.node, cst.Param):  # `def fit(self, module)`: what every call passes
                passed = self.passed(binding.node)
                if not passed:
                    return None
                values.extend(passed)
                continue
            items = self.iterated_items(binding.node)
            if items is not None:  # `for ctx in contexts:` over a list of constructions
                values.extend(items)
                continue
            statement = self._binding_statement(binding.node)
            if not (
                isinstance(statement, cst.Assign)
                and len(statement.targets) == 1
                and statement.targets[0].target is binding.node
            ):
                return None
            values.append(statement.value)
        return self._class_of_values(values)

    def stores_attributes_plainly(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` an instance of a class of this file that keeps each attribute as it is
        assigned: no property or other decorated method, no class attribute made by a call
        but a dataclass `field(...)` (it may be a descriptor), no `__setattr__`,
        `__getattr__`, `__getattribute__` or `__delattr__`, no method but `__init__` and
        `__post_init__` that assigns anything, and no base but `object` (a plain dataclass
        or config record)? Assigning one of its attributes then changes no other."""
        classdef = self.instance_class(expr)
        if classdef is None or any(
            not (isinstance(base.value, cst.Name) and base.value.value == "object") for base in classdef.bases
        ):
            return False
        for statement in classdef.body.body:
            if isinstance(statement, cst.SimpleStatementLine) and any(
                isinstance(small, (cst.Assign, cst.AnnAssign))
                and isinstance(small.value, cst.Call)
                and not self.names.is_(small.value.func, "dataclasses.field")
                for small in statement.body
            ):
                return False  # a class attribute made by a call may be a descriptor (`width = property(...)`)
            if not isinstance(statement, cst.FunctionDef):
                continue
            if statement.decorators or statement.name.value in HOOKED_ACCESS:
                return False
            if statement.name.value not in ("__init__", "__post_init__") and self.index.find(
                (cst.AssignTarget, cst.AugAssign, cst.Del), within=statement.body
            ):
                return False  # a method that may assign its attributes (conservatively: any assignment)
        return True

    def default_factory_of(self, expr: cst.BaseExpression | None) -> bool:
        """Is `expr` the `default_factory=` of a dataclass field (`field(default_factory=
        DataCfg)`): the field holds what calling it makes, not `expr` itself?"""
        arg = self.parents.get(expr) if expr is not None else None
        call = self.parents.get(arg) if isinstance(arg, cst.Arg) else None
        return (
            isinstance(call, cst.Call)
            and arg.keyword is not None
            and arg.keyword.value == "default_factory"
            and self.names.is_(call.func, "dataclasses.field")
        )

    def _class_of_values(self, values: list[cst.BaseExpression], depth: int = 0) -> cst.ClassDef | None:
        """The one class of this file every value is an instance of, else None."""
        classes = {}
        for value in values:
            value, returning_self = chain_of_module_methods(value)  # `Net().to(device).train()` is the `Net`
            if self.default_factory_of(value):
                classdef = self.local_class(value)  # `field(default_factory=DataCfg)`: a `DataCfg()`
            elif isinstance(value, (cst.Name, cst.Attribute)):  # `train(model)`, `net = model.to(device)`
                classdef = self.instance_class(value)
            elif isinstance(value, cst.Call):
                classdef = self.local_class(value.func)
                function = self._local_callee(value.func) if classdef is None and depth < MAX_RETURN_DEPTH else None
                returns, yields = self.exits(function) if function is not None else ((), ())
                if returns and not yields and all(r.value is not None for r in returns):
                    # `model = build(device)`: what every `return` of `build` gives
                    classdef = self._class_of_values([r.value for r in returns], depth + 1)
            else:
                classdef = None
            if classdef is None or returning_self & _method_names(classdef):
                return None  # (a class of its own `to` may return anything)
            classes[id(classdef)] = classdef
        return next(iter(classes.values())) if len(classes) == 1 else None

    def copies_of(self, classdef: cst.ClassDef) -> list[cst.Call]:
        """The `copy.deepcopy(x)` and `copy.copy(x)` calls of this file that may copy an
        instance of `classdef`: `x` one of its instances, or a name or attribute whose class
        perfmod cannot tell (a copy made from the value a call returns, `model.state_dict()`,
        is not one). A copy shares what the instance's closures captured: a function made
        in `__init__` that reads `self` still reads the original."""
        found = []
        for call in self.index.find(cst.Call):
            if not call.args or not self.names.is_(call.func, *OBJECT_COPIES):
                continue
            copied = call.args[0].value
            if not isinstance(copied, (cst.Name, cst.Attribute)):
                continue
            if self.instance_class(copied) in (classdef, None):
                found.append(call)
        return found

    def bound_values(self, expr: cst.BaseExpression) -> list[cst.BaseExpression] | None:
        """The values a name's bindings assign (`Bindings.values`) or an attribute of a name
        may hold (`attribute_values`); None for any other expression or when not told."""
        if isinstance(expr, cst.Name):
            return self._context.bindings.values(expr)
        if isinstance(expr, cst.Attribute):
            return self.attribute_values(expr)
        return None

    def attribute_values(self, expr: cst.Attribute, written: bool = False) -> list[cst.BaseExpression] | None:
        """The one answer to what an attribute of a name may hold (`self.x`, `obj.x`, `args.x`);
        None when that cannot be told. On an instance of a class of this file: what is assigned
        to the attribute (`class_attribute_values`); for a field no method assigns, of a
        dataclass, NamedTuple or config class without an `__init__`, what each construction
        passes it (by keyword or, for an annotated field, by position), else its default. On
        the namespace of argparse options: the option's `choices`, and with `written` (the
        script as written) its default where it has none. Down a chain (`self.cfg.scale`), the
        same for the object the attribute before it holds."""
        owner = expr.value
        if isinstance(owner, cst.Attribute):
            return self._chained_attribute_values(expr)
        if not isinstance(owner, cst.Name):
            return None
        classdef = self.instance_class(owner)
        if classdef is not None:
            table = self._attribute_table(classdef)
            if table is None:
                return None
            built = self._field_values(owner, classdef, expr.attr.value)
            return _built_or_written(built, table, expr.attr.value)
        option = self._context.command_line.option(expr.attr.value) if self._options_namespace(owner) else None
        if option is None:
            return None
        if option.choices is not None:
            return list(option.choices) or None
        return [option.default] if written and option.default is not None else None

    def _options_namespace(self, name: cst.Name, depth: int = 0) -> bool:
        """Does `name` hold the namespace of argparse options (`command_line.parses`) on
        every binding it may read, followed through parameters to what calls pass?"""
        command_line, bindings = self._context.command_line, self._context.bindings
        sources = self.sources(name)
        for binding in sources:
            if _is_param(binding.node):
                values = self.passed(binding.node) or [None]
            else:
                values = [bindings.assigned_value(binding)]
            for value in values:
                if _is_name(value) and depth < MAX_NAMESPACE_DEPTH:
                    if not self._options_namespace(value, depth + 1):
                        return False
                elif not command_line.parses(value):
                    return False
        return bool(sources)

    def attribute_value(self, expr: cst.Attribute) -> cst.BaseExpression | None:
        """The one value an attribute of a name holds (`attribute_values`), or None."""
        found = self.attribute_values(expr)
        return found[0] if found is not None and len(found) == 1 else None

    def class_attribute_values(self, classdef: cst.ClassDef, attr: str) -> list[cst.BaseExpression] | None:
        """What an instance of `classdef`, a class of this file, holds in `attr`: the values
        assigned to it, in the class's methods (`__init__`'s first) and on its instances
        anywhere in the file (`self.a, self.b = x, y` unpacked; `register_buffer("a", x)`,
        `add_module`, `setattr(self, "a", x)` included). None when it is never assigned, or
        one assignment cannot be followed (`self.a += x`, an unpacking of what cannot be
        told, a buffer or `setattr` under a name made at run time)."""
        table = self._attribute_table(classdef)
        return table.get(attr) if table is not None else None

    def _attribute_table(self, classdef: cst.ClassDef) -> dict[str, list[cst.BaseExpression] | None] | None:
        """attribute -> its values (`class_attribute_values`) for `classdef`; None when any
        attribute may be set under a name made at run time (`setattr(self, key, value)`)."""
        if self._class_attributes is None:
            self._class_attributes = {}  # (an instance followed while this is built: nothing known yet)
            self._class_attributes = self._attribute_tables()
        return self._class_attributes.get(id(classdef), {})

    def _attribute_tables(self) -> dict[int, dict[str, list[cst.BaseExpression] | None] | None]:
        """`_attribute_table` of every class of this file, from one pass over its assignments
        and the calls that set attributes."""
        writes = _AttributeWrites()
        self._record_assigned_attributes(writes)
        self._record_set_attributes(writes)
        return writes.tables()

    def _record_assigned_attributes(self, writes: _AttributeWrites) -> None:
        """Record each `instance.attr = value` of the file (`+=` and unpackings included)."""
        for statement in self.index.find((cst.Assign, cst.AnnAssign, cst.AugAssign)):
            if isinstance(statement, cst.AnnAssign) and statement.value is None:
                continue  # `self.x: int` declares, assigns nothing
            targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
            for target in targets:
                for part, value in self._attribute_parts(target, statement):
                    owner = self.instance_class(part.value)
                    if owner is not None:
                        writes.record(owner, part.attr.value, value, self._in_init(owner, statement))

    def _record_set_attributes(self, writes: _AttributeWrites) -> None:
        """Record each attribute a call sets by name: `self.register_buffer("mask", mask)`,
        `setattr(self, "mask", mask)`; a name made at run time marks its class."""
        for call in self.index.find(cst.Call):
            setter = self._attribute_setter(call)
            if setter is None:
                continue
            instance, name, value, registers = setter
            owner = self.instance_class(instance.value if isinstance(instance, cst.Arg) else instance)
            if owner is None or name is None:
                continue
            if not isinstance(name.value, cst.SimpleString):
                (writes.unnamed_registers if registers else writes.unnamed_sets).add(id(owner))
                continue
            attr = name.value.evaluated_value
            writes.registered.setdefault(id(owner), set()).add(attr)
            writes.record(owner, attr, value.value if value is not None else None, self._in_init(owner, call))

    def _attribute_setter(self, call: cst.Call) -> tuple[cst.CSTNode, cst.Arg | None, cst.Arg | None, bool] | None:
        """(instance, name argument, value argument, whether a module's method registers it)
        of a call that sets an attribute by name; None for any other call."""
        if any(arg.star for arg in call.args):
            return None
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in MODULE_ATTRIBUTE_SETTERS:
            name = positional(call, 0) or kwarg(call, "name")  # `self.register_buffer("mask", mask)`
            value = positional(call, 1) or kwarg(call, MODULE_ATTRIBUTE_SETTERS[func.attr.value])
            return func.value, name, value, True
        if self.names.is_(func, "builtins.setattr") and len(call.args) == 3:
            instance, name, value = call.args  # `setattr(self, "mask", mask)`
            return instance, name, value, False
        return None

    def _in_init(self, owner: cst.ClassDef, at: cst.CSTNode) -> bool:
        """Is `at` in the `__init__` of `owner`?"""
        return self.index.first_enclosing(at, FUNCTIONS) is methods_of(owner).get("__init__")

    def _attribute_parts(
        self, target: cst.BaseExpression, statement: cst.CSTNode
    ) -> list[tuple[cst.Attribute, cst.BaseExpression | None]]:
        """(attribute, the value it gets) for each `name.attr` that `target` of `statement`
        assigns: the value of `name.attr = value`, the element of `a.x, a.y = value` it
        unpacks (`element`); None where that cannot be told (`+=`, a nested or starred
        unpacking, an element that cannot be told)."""
        if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name):
            return [(target, None if isinstance(statement, cst.AugAssign) else statement.value)]
        if not isinstance(target, (cst.Tuple, cst.List)):
            return []
        starred = any(isinstance(e, cst.StarredElement) for e in target.elements)
        found = []
        for position, element in enumerate(target.elements):
            for part in _target_parts(element.value):
                if isinstance(part, cst.Attribute) and isinstance(part.value, cst.Name):
                    plain = part is element.value and not starred
                    found.append((part, self.element(statement.value, position) if plain else None))
        return found

    def _chained_attribute_values(self, expr: cst.Attribute) -> list[cst.BaseExpression] | None:
        """`attribute_values` of `a.b.c`: what the object `a.b` holds, of a class of this file,
        holds in `c` (what is assigned to it, or what the constructions `a.b` holds pass)."""
        classdef = self.instance_class(expr.value)
        if classdef is None:
            return None
        table = self._attribute_table(classdef)
        if table is None:
            return None
        holders = self.attribute_values(expr.value)
        built = self._passed_to_field(holders, classdef, expr.attr.value, 0) if holders else None
        return _built_or_written(built, table, expr.attr.value)

    def _field_values(
        self, owner: cst.Name, classdef: cst.ClassDef, field: str, depth: int = 0
    ) -> list[cst.BaseExpression] | None:
        """The values the calls that build `owner` pass to the field `field` of a class of
        this file without an `__init__` (a dataclass, a NamedTuple, a config class), by
        keyword or by position among its annotated fields, else the field's default
        (`ctx = Context(ids=table)`: `ctx.ids` is `table`), followed through the names and
        parameters it is handed down by (`cfg` of `Block(cfg)` of `cfg = Config()`)."""
        if methods_of(classdef).get("__init__") is not None or depth > MAX_NAMESPACE_DEPTH:
            return None
        scope = self.scopes.get(owner)
        calls = []
        for binding in scope[owner.value] if scope is not None else ():
            if type(binding) is not Assignment:
                return None
            if isinstance(binding.node, cst.Param):
                calls.extend(self.passed(binding.node) or [None])
                continue
            items = self.iterated_items(binding.node)
            if items is not None:
                calls.extend(items)
                continue
            statement = self._binding_statement(binding.node)
            calls.append(statement.value if isinstance(statement, cst.Assign) else None)
        return self._passed_to_field(calls, classdef, field, depth)

    def _passed_to_field(
        self, calls: list[cst.BaseExpression | None], classdef: cst.ClassDef, field: str, depth: int
    ) -> list[cst.BaseExpression] | None:
        """What `calls`, the constructions of `classdef` an object may come from (or names
        that hold one), pass to its field `field`, else its default; None when one cannot
        be told."""
        if methods_of(classdef).get("__init__") is not None:
            return None
        fields = [
            s.body[0].target.value
            for s in classdef.body.body
            if isinstance(s, cst.SimpleStatementLine)
            and len(s.body) == 1
            and isinstance(s.body[0], cst.AnnAssign)
            and isinstance(s.body[0].target, cst.Name)
        ]
        default = _class_default(classdef, field)
        values = []
        for call in calls:
            if isinstance(call, cst.Name) and not self.default_factory_of(call):
                found = self._field_values(call, classdef, field, depth + 1)
                if found is None:
                    return None
                values.extend(found)
                continue
            if self.default_factory_of(call):
                if default is None:
                    return None
                values.append(default)  # built by a dataclass field's factory, with no arguments
                continue
            if not isinstance(call, cst.Call) or any(arg.star for arg in call.args):
                return None
            passed = kwarg(call, field)
            plain = [arg.value for arg in call.args if arg.keyword is None]
            if passed is not None:
                values.append(passed.value)
            elif field in fields and fields.index(field) < len(plain):
                values.append(plain[fields.index(field)])
            elif default is not None:
                values.append(default)
            else:
                return None
        return values or None

    def module_part(self, name: cst.Name) -> tuple[cst.BaseExpression, str] | None:
        """The module whose submodules, parameters or buffers `name` holds, and the module
        method that hands them out: every binding that reaches `name` is the (last) target
        of a `for` over the same `module.<method>()` (`for m in model.modules():`,
        `for key, p in model.named_parameters():`) or is `module.get_submodule(path)`.
        None otherwise."""
        sources = self.sources(name)
        found: set[tuple[str, str]] = set()
        part = None
        for binding in sources:
            statement = self._binding_statement(binding.node)
            if isinstance(statement, cst.For):
                target = statement.target
                last = target.elements[-1].value if isinstance(target, cst.Tuple) and target.elements else target
                source = statement.iter if last is binding.node else None
            else:
                source = self._context.bindings.assigned_value(binding)
            if not (
                isinstance(source, cst.Call)
                and isinstance(source.func, cst.Attribute)
                and source.func.attr.value in SUBMODULE_METHODS | MODULE_TENSOR_METHODS
            ):
                return None
            found.add((self._context.source(source.func.value), source.func.attr.value))
            part = (source.func.value, source.func.attr.value)
        return part if len(found) == 1 else None

    def iterated_items(self, target: cst.CSTNode) -> list[cst.BaseExpression] | None:
        """The items the target of `for item in items:` takes, when `items` holds one list all
        of whose items the code shows (`listed_items`). None for any other binding."""
        statement = self._binding_statement(target)
        if not (_is_for(statement) and statement.target is target):
            return None
        return self.listed_items(statement.iter)

    def listed_items(
        self, expr: cst.BaseExpression, depth: int = 0, held_in: str | None = None
    ) -> list[cst.BaseExpression] | None:
        """Every item of the list (or tuple) `expr` holds, where the code shows them all: a
        display (`[a, b]`, `(a, *rest)`), a copy (`list(x)`, `tuple(x)`, `sorted(x)`), `a + b`,
        `x or []` (None holds none); a name bound once to one, changed only by `append`,
        `extend`, `sort` or `reverse` and otherwise only iterated, indexed, measured, tested,
        stored in attributes or handed to a function or class of this file; a parameter:
        what every call passes; an attribute: what is assigned to it and appended to it on an
        instance of its class (`self.hooks = []`, `self.hooks.append(h)`). None otherwise.
        `held_in`: the attribute being read, whose own appends the caller counts."""
        if depth > MAX_LIST_DEPTH:
            return None
        if isinstance(expr, (cst.List, cst.Tuple)):
            items = []
            for element in expr.elements:
                inner = (
                    self.listed_items(element.value, depth + 1, held_in)
                    if isinstance(element, cst.StarredElement)
                    else [element.value]
                )
                if inner is None:
                    return None
                items += inner
            return items
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
            return self._all_listed([expr.left, expr.right], depth, held_in)
        if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.Or):
            return self._all_listed([expr.left, expr.right], depth, held_in)  # `callbacks or []`
        if isinstance(expr, cst.Call):
            copied = expr.args[0] if expr.args else None
            if copied is None or copied.keyword or copied.star or not self.names.of(expr.func) & ITEM_COPIES:
                return None
            return self.listed_items(copied.value, depth + 1)  # a copy: no longer the attribute's list
        if _is_attribute(expr):
            values = self.attribute_values(expr)
            appended = self._appended_to_attribute(expr)
            items = self._all_listed(values, depth, expr.attr.value) if values and appended is not None else None
            return items + appended if items is not None else None
        if not _is_name(expr):
            return None
        if expr.value == "None":
            return []  # `callbacks or []` with `callbacks=None`: iterating None raises, it runs nothing
        scope = self.scopes.get(expr)
        bindings = list(scope[expr.value]) if scope is not None else []
        if len(bindings) != 1 or type(bindings[0]) is not Assignment:
            return None
        if isinstance(bindings[0].node, cst.Param):
            passed = self.passed(bindings[0].node)
            items = self._all_listed(passed, depth, held_in) if passed else None
        else:
            items = self.listed_items(self._context.bindings.assigned_value(bindings[0]), depth + 1, held_in)
        if items is None:
            return None
        for access in bindings[0].references:
            added = self._listed_use(access.node, depth, held_in)
            if added is None:
                return None
            items += added
        return items

    def _listed_use(
        self, node: cst.BaseExpression, depth: int, held_in: str | None = None
    ) -> list[cst.BaseExpression] | None:
        """The items a use of a list (its name, or an attribute holding it) adds to it
        (`items.append(x)`: `[x]`), `[]` for a use that adds none and removes none; None for
        one that may (`items.pop()`, `items[0] = x`, handed to a call that may change it)."""
        parent = self.parents.get(node)
        holder = self.parents.get(parent)
        if isinstance(parent, cst.Attribute) and parent.value is node:
            method = parent.attr.value
            one = isinstance(holder, cst.Call) and holder.func is parent and len(holder.args) == 1
            if method == "append" and one:
                return [holder.args[0].value]
            if method == "extend" and one:
                return self.listed_items(holder.args[0].value, depth + 1)
            return [] if method in ORDER_ONLY_METHODS and isinstance(holder, cst.Call) else None
        if isinstance(parent, cst.Subscript):
            return None if isinstance(holder, (cst.AssignTarget, cst.Del)) else []
        if isinstance(parent, cst.Arg):
            if not isinstance(holder, cst.Call) or parent.star:
                return None
            if (
                self.names.is_(holder.func, "len", "builtins.len")
                or self.names.of(holder.func) & ITEM_COPIES
                or method_name(holder) == "extend"  # `hooks.extend(items)` copies the items out
            ):
                return []
            return self._handed_on(holder, parent, depth, held_in)
        if isinstance(parent, cst.Assign) and parent.value is node:
            # `self.callbacks = callbacks`, the same list under another name: kept where what is
            # added through that attribute is counted (read through it) or nothing is
            stored = [target.target for target in parent.targets]
            kept = all(
                _is_attribute(t) and (t.attr.value == held_in or self._appended_to_attribute(t) == []) for t in stored
            )
            return [] if kept else None
        kept = (cst.For, cst.CompFor, cst.UnaryOperation, cst.If, cst.BooleanOperation, cst.Comparison)
        return [] if isinstance(parent, kept) else None

    def _handed_on(
        self, call: cst.Call, arg: cst.Arg, depth: int, held_in: str | None
    ) -> list[cst.BaseExpression] | None:
        """What a function or class of this file that `call` hands a list to (as `arg`) adds
        to it, through the uses of the parameter that receives it (`_listed_use`); None where
        that is not a function of this file, or a use may take items out."""
        classdef = self.local_class(call.func) if isinstance(call.func, cst.Name) else None
        function = methods_of(classdef).get("__init__") if classdef is not None else self._local_callee(call.func)
        if function is None or depth > MAX_LIST_DEPTH:
            return None
        offset = 1 if classdef is not None else self.receiver_offset(call, function)
        params = [*function.params.posonly_params, *function.params.params, *function.params.kwonly_params]
        given = (p for p in params if isinstance(offset, int) and argument_for(call, function, p, offset) is arg.value)
        param = next(given, None)
        if param is None:
            return None
        scope = self.scopes.get(param.name)
        bindings = list(scope[param.name.value]) if scope is not None else []
        if len(bindings) != 1:
            return None
        added: list[cst.BaseExpression] = []
        for access in bindings[0].references:
            found = self._listed_use(access.node, depth + 1, held_in)
            if found is None:
                return None
            added += found
        return added

    def _all_listed(
        self, values: list[cst.BaseExpression], depth: int, held_in: str | None = None
    ) -> list[cst.BaseExpression] | None:
        found = []
        for value in values:
            items = self.listed_items(value, depth + 1, held_in)
            if items is None:
                return None
            found.extend(items)
        return found

    def _appended_to_attribute(self, expr: cst.Attribute) -> list[cst.BaseExpression] | None:
        """What the file appends to the list an attribute holds, on any instance of its class
        (`self.hooks.append(h)`, `trainer.callbacks.append(cb)`); None when a call may change
        it otherwise (`pop`, `insert`, `self.hooks[0] = h`), or changes a list in an attribute
        of that name on an object whose class perfmod cannot tell."""
        name, owner = expr.attr.value, self.instance_class(expr.value)
        appended: list[cst.BaseExpression] = []
        for attribute in self._attributes_named(name):
            if attribute is expr:
                continue
            parent = self.parents.get(attribute)
            changes = (isinstance(parent, cst.Attribute) and parent.attr.value in MUTATING_METHODS) or (
                isinstance(parent, cst.Subscript) and isinstance(self.parents.get(parent), (cst.AssignTarget, cst.Del))
            )
            if not changes:
                continue
            held_by = self.instance_class(attribute.value)
            if held_by is not None and held_by is not owner:
                continue  # another class's list of that name
            added = self._listed_use(attribute, 0) if held_by is not None else None
            if added is None:
                return None
            appended += added
        return appended

    def attribute_origins(self, expr: cst.Attribute) -> list[tuple[FileContext, cst.BaseExpression]] | None:
        """What `obj.<attr>` may hold, each value with the file it is written in: the values
        the methods of a class of this file assign (`attribute_values`), or, when `obj`
        holds objects a class of another module of the project builds (`ctx.wrapper` of
        `Context(wrapper=LMWrapper(cfg))`), those its methods assign, read in its module
        (`Project.attribute_values`). An owner that may be None adds nothing: reading an
        attribute of None raises. None when one value cannot be followed."""
        values = self.attribute_values(expr)
        if values is not None:
            return [(self._context, value) for value in values]
        owner = expr.value
        if isinstance(owner, cst.Attribute):
            owners = self.attribute_values(owner)
        elif isinstance(owner, cst.Name):
            owners = [owner]
        else:
            return None
        found: list[tuple[FileContext, cst.BaseExpression]] = []
        for held in owners or ():
            made: list[cst.BaseExpression | None] = [held]
            if isinstance(held, cst.Name):
                sources = self.sources(held)
                made = []
                for source in sources:
                    value = self._context.bindings.assigned_value(source)
                    made.extend([value] if value is not None else self.iterated_items(source.node) or [None])
                if not sources or None in made:
                    return None
            for value in made:
                if isinstance(value, cst.Name) and value.value == "None":
                    continue
                assigned = self._constructed_attribute(value, expr.attr.value)
                if assigned is None:
                    return None
                found.extend(assigned)
        return found or None

    def _constructed_attribute(
        self, value: cst.BaseExpression | None, attribute: str
    ) -> list[tuple[FileContext, cst.BaseExpression]] | None:
        """What the methods of the class `value` constructs (`Wrapper(cfg)`, also
        `Wrapper(cfg).to(device)`) assign to `self.<attribute>`, for a class of this file or
        of another module of the project."""
        value, returning_self = chain_of_module_methods(value)
        if not isinstance(value, cst.Call):
            return None
        local = self.local_class(value.func)
        found = self._project().class_of(value.func) if local is None else (self._context, local)
        if found is None or returning_self & _method_names(found[1]):
            return None  # (a class of its own `to` may return anything)
        if local is not None:
            assigned = self.class_attribute_values(local, attribute)
            return [(self._context, v) for v in assigned] if assigned else None
        return self._project().attribute_values(value.func, attribute)

    def exits(self, function: cst.FunctionDef) -> tuple[list[cst.Return], list[cst.Yield]]:
        """The `return` and `yield` of `function` itself (not of functions nested in it)."""
        returns, yields = [], []
        for node in self.index.find((cst.Return, cst.Yield), within=function.body):
            if self.index.first_enclosing(node, FUNCTIONS) is not function:
                continue
            (yields if isinstance(node, cst.Yield) else returns).append(node)
        return returns, yields

    def returned(self, function: cst.FunctionDef) -> list[cst.BaseExpression]:
        """The expressions `function` returns."""
        return [node.value for node in self.exits(function)[0] if node.value is not None]

    def _returns_fact(self, function: cst.FunctionDef) -> Fact:
        """What a call of `function` gives: the join of what it returns; for a generator,
        a batch of what it yields."""
        returns, yields = self.exits(function)
        if yields:
            if any(y.value is None or isinstance(y.value, cst.From) for y in yields):
                return UNKNOWN
            return _container([self._fact(y.value) for y in yields])
        if not returns or any(r.value is None for r in returns):
            return UNKNOWN
        result = BOTTOM
        for node in returns:
            result = result.join(self._fact(node.value))
        return result

    def arguments(self, param: cst.Param) -> list[tuple[cst.Call, cst.BaseExpression | None]] | None:
        """The one answer to what callers pass a parameter: for each call of this file that
        runs `param`'s function (`callers`: by name, a method on an instance of its class,
        an `__init__` through its class), the call and what `param` holds then (the
        argument, else its default; None where `*args` / `**kwargs` may pass it or there
        is no default). None when the function may be called where this file cannot see
        (passed as a value, never called here) or `param` is `*args` / `**kwargs`."""
        function = self.parents.get(self.parents.get(param))
        if not isinstance(function, cst.FunctionDef) or param.star:
            return None
        callers = self.callers(function)
        if not callers:
            return None
        return [(call, passed_by(call, function, param, offset)) for call, offset in callers]

    def passed(self, param: cst.Param) -> list[cst.BaseExpression] | None:
        """What every call of this file passes to `param` (`arguments`); None when one of
        them cannot be told."""
        found = self.arguments(param)
        values = [value for _, value in found] if found else None
        return values if values is not None and None not in values else None

    def callers(self, function: cst.FunctionDef) -> list[tuple[cst.Call, int | Partial]] | None:
        """The calls of `function` in this file, with how many leading parameters the call
        fills itself (1 for a method called on an instance), or for a call of a
        `functools.partial` of it the `Partial` (`receiver_offset`); None when the function
        is also used otherwise (passed as a value, called on something perfmod cannot see)
        or never called here."""
        key = id(function)
        if function is self._any_caller:
            return None
        if key not in self._callers:
            self._callers[key] = None  # a call of itself while this runs: unknown
            self._callers[key] = self._find_callers(function)
        return self._callers[key]

    def _find_callers(self, function: cst.FunctionDef) -> list[tuple[cst.Call, int]] | None:
        name = function.name.value
        classdef = self.class_of(function)
        if classdef is None:
            found = self._calls_of_sole_binding(function, name)
            if found is None:
                return None  # passed as a value: called where perfmod cannot see
            calls = [(call, self.receiver_offset(call, function) if through else 0) for call, through in found]
            return calls or None
        if name == "__init__" and not function.decorators:
            return self._constructions(classdef)
        if _decorated(function, STATIC) or function.decorators or name.startswith("__"):
            return None
        calls = []
        for attribute in self._attributes_named(name):
            if self.instance_class(attribute.value) is not classdef:
                continue
            call = self.parents.get(attribute)
            if isinstance(call, cst.Call) and call.func is attribute:
                calls.append((call, 1))
                continue
            through = self.partial_calls(attribute)
            if through is None:
                return None  # a bound method passed as a value
            calls += [(call, self.receiver_offset(call, function)) for call in through]
        return calls or None

    def _attributes_named(self, name: str) -> list[cst.Attribute]:
        """The attribute nodes of this file named `name` (`x.name`), looked up in one table."""
        if self._attributes is None:
            self._attributes = {}
            for node in self.index.find(cst.Attribute):
                self._attributes.setdefault(node.attr.value, []).append(node)
        return self._attributes.get(name, [])

    def partial_calls(self, func: cst.BaseExpression, depth: int = 0) -> list[cst.Call] | None:
        """The calls of the `functools.partial` objects that wrap the function `func` names:
        `partial(func, ...)` called in place, or bound once to a name that is only called
        (or wrapped in turn); None when a partial is handed on otherwise."""
        arg = self.parents.get(func)
        made = self.parents.get(arg)
        if not (
            isinstance(made, cst.Call)
            and made.args
            and made.args[0] is arg
            and depth <= MAX_PARTIAL_DEPTH
            and self.partial_of(made) is not None
        ):
            return None
        holder = self.parents.get(made)
        if isinstance(holder, cst.Call) and holder.func is made:
            return [holder]
        target = holder.targets[0].target if isinstance(holder, cst.Assign) and len(holder.targets) == 1 else None
        found = self._calls_of_sole_binding(target, target.value, depth + 1) if isinstance(target, cst.Name) else None
        return [call for call, _ in found] if found is not None else None

    def _calls_of_sole_binding(
        self, node: cst.CSTNode, name: str, depth: int = 0
    ) -> list[tuple[cst.Call, bool]] | None:
        """The calls of what `node` binds to `name`, the only binding of the name in its
        scope, each with whether it calls it through a `functools.partial` of it
        (`partial_calls`); None when the name has other bindings or a use of it is neither
        such a call (handed on as a value)."""
        scope = self.scopes.get(node)
        found = list(scope.assignments[name]) if scope is not None else []
        if len(found) != 1 or found[0].node is not node:
            return None
        calls: list[tuple[cst.Call, bool]] = []
        for access in found[0].references:
            call = self.parents.get(access.node)
            if isinstance(call, cst.Call) and call.func is access.node:
                calls.append((call, False))
                continue
            through = self.partial_calls(access.node, depth)
            if through is None:
                return None
            calls += [(call, True) for call in through]
        return calls

    def _constructions(self, classdef: cst.ClassDef) -> list[tuple[cst.Call, int]] | None:
        """The calls that construct `classdef` (`Trainer(model, device)`), each filling the
        `self` of its `__init__`, when every use of the class's name is such a call (no
        subclass, no factory that hands the class on); None otherwise."""
        scope = self.scopes.get(classdef)
        if scope is None or len(scope.assignments[classdef.name.value]) != 1:
            return None
        calls = []
        (binding,) = scope.assignments[classdef.name.value]
        for access in binding.references:  # in nested scopes (a function that builds it) too
            call = self.parents.get(access.node)
            outer = self.parents.get(call)
            if (
                isinstance(call, cst.Arg)
                and isinstance(outer, cst.Call)
                and self.names.is_(outer.func, "builtins.super")
            ):
                continue  # `super(Net, self).__init__()` in its own methods
            if not isinstance(call, cst.Call) or call.func is not access.node:
                return None
            calls.append((call, 1))
        return sorted(calls, key=lambda found: self.index.order(found[0])) or None

    # -- annotations and the project's own modules --------------------------------------

    def annotation_fact(self, annotation: cst.BaseExpression) -> Fact:
        """What a value annotated `annotation` holds: `Tensor`, `nn.Module`, `DataLoader[...]`,
        `torch.device` (any alias, in quotes too), through `X | None`, `Optional[X]`,
        `Union[X, Y]` (when all agree), `Annotated[X, ...]` and jaxtyping's `Float[Tensor, "b d"]`.
        A DataLoader of unknown dataset yields host tensors (the default collate builds CPU
        tensors), as one built in this file does; anything else is UNKNOWN."""
        key = id(annotation)
        found = self._annotations.get(key)
        if found is None:
            found = self._annotations[key] = self._annotation(annotation, None, 0)
        return found

    def _annotation(self, expr: cst.BaseExpression, quoted: cst.SimpleString | None, depth: int) -> Fact:
        """`quoted`: the string `expr` was parsed from, for an annotation written in quotes."""
        if depth > 8:
            return UNKNOWN
        if isinstance(expr, cst.SimpleString):
            value = expr.evaluated_value
            try:
                parsed = cst.parse_expression(value) if isinstance(value, str) else None
            except cst.ParserSyntaxError:
                parsed = None
            return self._annotation(parsed, quoted or expr, depth + 1) if parsed is not None else UNKNOWN
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.BitOr):
            return _join_annotated([self._annotation(side, quoted, depth + 1) for side in (expr.left, expr.right)])
        if isinstance(expr, cst.Name) and expr.value == "None":
            return BOTTOM
        if isinstance(expr, cst.Subscript):
            names = self._annotation_names(expr.value, quoted)
            parts = [e.slice.value for e in expr.slice if isinstance(e.slice, cst.Index)]
            if names & {"typing.Optional", "typing.Union"}:
                return _join_annotated([self._annotation(part, quoted, depth + 1) for part in parts])
            if names & {"typing.Annotated", "typing_extensions.Annotated"} or any(
                name.startswith("jaxtyping.") for name in names
            ):
                return self._annotation(parts[0], quoted, depth + 1) if parts else UNKNOWN
            expr = expr.value
        for name in sorted(self._annotation_names(expr, quoted)):
            fact = ANNOTATED.get(name)
            if fact is not None:
                return fact
        return UNKNOWN

    def _annotation_names(self, expr: cst.BaseExpression, quoted: cst.SimpleString | None) -> set[str]:
        """Qualified names of an annotation's class; for one written in quotes, looked up by
        its spelling where the string is (imported names only)."""
        if quoted is None:
            return self.names.of(expr)
        dotted = _dotted(expr)
        scope = self.scopes.get(quoted) if dotted else None
        head = dotted.split(".")[0] if dotted else ""
        if scope is None or head not in scope:
            return set()
        found: set[str] = set()
        for binding in scope[head]:
            for name in binding.get_qualified_names_for(dotted):
                if name.source is QualifiedNameSource.LOCAL:
                    return set()
                found.add(CANONICAL.get(name.name, name.name))
        return found

    def _project(self):
        if self._project_modules is None:
            from codemod.analysis.project import project_of

            self._project_modules = project_of(self._context)
        return self._project_modules

    def _project_call_fact(self, call: cst.Call) -> Fact | None:
        """What a call of a class or function of another module of the project gives (a class:
        what Kinds says of it in its module); of a function, its argument's
        place kept when it returns (a part of) its argument, the items of its argument for a
        generator that yields them, else what its module's analysis or its annotation says."""
        project = self._project()
        built = project.class_of(call.func) if project.folder is not None else None
        if built is not None:  # `Net()` of `from models import Net`: a module, if its class derives from one
            module, classdef = built
            return self._built_module(module.kinds.class_fact(classdef), call)
        function = project.called(call) if project.folder is not None else None
        if function is None:
            return None
        through = project.passes_through(function)
        argument = project.argument(call, function, through.param) if through is not None else None
        if argument is not None:
            passed = self._fact(argument)
            if through.whole or passed.kind is Kind.BOTTOM:
                return passed
            annotated = project.annotated(function)
            if annotated is not None and annotated.kind is Kind.TENSOR:
                if passed.kind in CONTAINERS:
                    return Fact(Kind.TENSOR, passed.place, memory=passed.memory)
                return Fact(Kind.TENSOR)
            if through.items and passed.kind in CONTAINERS:
                return _element(passed)
            return annotated
        items = project.yields_items_of(function)
        argument = project.argument(call, function, items) if items is not None else None
        if argument is not None:
            return self._fact(argument)  # `cycle(loader)`: iterates the loader's batches, as `iter(loader)`
        return project.returned(function) or project.annotated(function)

    def _project_call_shape(self, call: cst.Call) -> Shape | None:
        """The tuple a project function returns, element by element."""
        project = self._project()
        function = project.called(call) if project.folder is not None else None
        size = project.arity(function) if function is not None else None
        if not size:
            return None
        return tuple(
            project.returned(function, (k,)) or project.annotated(function, (k,)) or UNKNOWN for k in range(size)
        )

    def _value_shape(self, value: cst.BaseExpression, depth: int = 0) -> Shape:
        if (
            isinstance(value, (cst.Tuple, cst.List))
            and value.elements
            and not any(isinstance(e, cst.StarredElement) for e in value.elements)
        ):
            return tuple(self._value_shape(e.value, depth) for e in value.elements)
        if isinstance(value, cst.Call) and self.names.is_(value.func, "next", "builtins.next"):
            first = positional(value, 0)
            return self._item_shape(first.value) if first else UNKNOWN
        if isinstance(value, cst.Call) and depth < 3:
            function = self._runs(value)
            if function is not None:  # `train_loader, val_loader = build_loaders(cfg)`
                returns, yields = self.exits(function)
                if returns and not yields and all(isinstance(r.value, (cst.Tuple, cst.List)) for r in returns):
                    joined = _joined_tuples([self._value_shape(r.value, depth + 1) for r in returns])
                    if joined is not None:
                        return joined
            shape = self._project_call_shape(value)
            if shape is not None:  # `train_loader, val_loader = data.make_loaders(cfg)`
                return shape
        if isinstance(value, cst.Attribute) and depth < 3:
            # `a, b = self.pair` of `self.pair = (x, y)` in another method; a `None` it is
            # reset to cannot be unpacked, so it is not a value the unpacking reads.
            assigned = [v for v in self.attribute_values(value) or () if not is_none(v)]
            joined = _joined_tuples([self._value_shape(v, depth + 1) for v in assigned])
            if joined is not None:
                return joined
        return self._fact(value)

    def _item_shape(self, iterable: cst.BaseExpression) -> Shape:
        """What one iteration over `iterable` yields."""
        if isinstance(iterable, cst.Call):
            args = [a.value for a in iterable.args if a.keyword is None and not a.star]
            if self.names.is_(iterable.func, "enumerate", "builtins.enumerate") and args:
                return (UNKNOWN, self._item_shape(args[0]))
            if self.names.is_(iterable.func, "zip", "builtins.zip"):
                return tuple(self._item_shape(a) for a in args)
            if self.names.is_(iterable.func, *PASS_THROUGH_ITERABLES) and args:
                return self._item_shape(args[0])
            method = method_name(iterable)
            if method in ("items", "values"):
                element = _element(self._fact(iterable.func.value))
                return (UNKNOWN, element) if method == "items" else element
        fact = self._fact(iterable)
        if fact.kind is Kind.LOADER:
            return Fact(Kind.TENSOR if fact.single else Kind.BATCH, fact.place, memory=fact.memory)
        return _element(fact)


def _join_annotated(facts: list[Fact]) -> Fact:
    """The fact of a union annotation: its members agree (None left out), else UNKNOWN."""
    result = BOTTOM
    for fact in facts:
        result = result.join(fact)
    return UNKNOWN if result.kind is Kind.BOTTOM else result


def _dotted(expr: cst.BaseExpression) -> str | None:
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        owner = _dotted(expr.value)
        return f"{owner}.{expr.attr.value}" if owner else None
    return None


def _device_named(expr: cst.BaseExpression) -> str | None:
    """The name a device expression is spelled with: `device`, `self.device`, `cfg["device"]`."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        return expr.attr.value
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        key = expr.slice[0].slice.value
        if isinstance(key, cst.SimpleString) and isinstance(key.evaluated_value, str):
            return key.evaluated_value
    return None


def _in_tensor_namespace(name: str) -> bool:
    """`torch.cos`, `torch.nn.functional.relu`: a function computing tensors from tensors."""
    head, _, last = name.rpartition(".")
    return (
        head in TENSOR_NAMESPACES
        and last[:1].islower()
        and not last.startswith("_")
        and name not in NOT_TENSOR_FUNCTIONS
    )


def _computed_on(module_place: Place) -> Place:
    """Where a model's outputs live: where it was moved, else on its device."""
    return module_place if module_place in (Place.HOST, Place.CUDA) else Place.DEVICE


def _container(facts: list[Fact]) -> Fact:
    """A list, tuple, dict or generator of tensors (or of such): a batch where they are."""
    if not facts:
        return UNKNOWN
    if all(f.kind is Kind.BOTTOM for f in facts):
        return BOTTOM
    facts = [f for f in facts if f.kind is not Kind.BOTTOM]
    if not all(f.kind in CONTAINERS for f in facts):
        return UNKNOWN
    place, memory = facts[0].place, facts[0].memory
    for fact in facts[1:]:
        place, memory = place.join(fact.place), memory.join(fact.memory)
    return Fact(Kind.BATCH, place, memory=memory)


def _as_fact(shape: Shape) -> Fact:
    """A tuple shape as the batch it is."""
    if isinstance(shape, Fact):
        return shape
    return _container([_as_fact(part) for part in shape])


def _target_parts(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(target, (cst.Tuple, cst.List)):
        return [part for element in target.elements for part in _target_parts(element.value)]
    return [target]


def _class_default(cls: cst.ClassDef, attr: str) -> cst.BaseExpression | None:
    """The default of the field `attr` of a (data)class: `attr = v`, `attr: T = v`,
    `attr: T = field(default=v)` or `field(default_factory=lambda: v)`."""
    for line in cls.body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            value = None
            if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.target.value == attr:
                value = small.value
            elif (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and small.targets[0].target.value == attr
            ):
                value = small.value
            else:
                continue
            if (
                isinstance(value, cst.Call)
                and isinstance(value.func, (cst.Name, cst.Attribute))
                and (value.func.value if isinstance(value.func, cst.Name) else value.func.attr.value) == "field"
            ):
                default = kwarg(value, "default") or kwarg(value, "default_factory")
                return default.value if default is not None else None
            return value
    return None


def _built_or_written(
    built: list[cst.BaseExpression] | None, table: dict[str, list[cst.BaseExpression] | None], attr: str
) -> list[cst.BaseExpression] | None:
    """What an attribute of an instance may hold: what its construction gives the field
    (`built`, for a class without an `__init__`; None when not told) and what is assigned
    to it anywhere (`table`): a dataclass field written after construction holds its
    default or passed value until then."""
    if attr not in table:
        return built
    written = table[attr]
    return [*built, *written] if built is not None and written is not None else written


def _method_names(classdef: cst.ClassDef) -> set[str]:
    return {s.name.value for s in classdef.body.body if isinstance(s, cst.FunctionDef)}


def _is_init(function: cst.CSTNode | None) -> bool:
    return isinstance(function, cst.FunctionDef) and function.name.value == "__init__"


def _one(classdef: cst.ClassDef | None) -> tuple[cst.ClassDef, ...] | None:
    return (classdef,) if classdef is not None else None


def _decorated(function: cst.FunctionDef, names) -> bool:
    for decorator in function.decorators:
        spelled = decorator.decorator
        if isinstance(spelled, cst.Name) and spelled.value in names:
            return True
    return False


def _joined_tuples(shapes: list[Shape]) -> tuple | None:
    """`shapes` joined element-wise when all are tuples of one length (at least one), else None."""
    if shapes and all(isinstance(shape, tuple) for shape in shapes) and len({len(shape) for shape in shapes}) == 1:
        return tuple(_join_shapes([shape[k] for shape in shapes]) for k in range(len(shapes[0])))
    return None


def _join_shapes(shapes: list[Shape]) -> Shape:
    """The shape every one of `shapes` fits: tuples element-wise when they agree, else facts."""
    joined = _joined_tuples(shapes)
    if joined is not None:
        return joined
    result = BOTTOM
    for shape in shapes:
        result = result.join(_as_fact(shape))
    return result


def _element(fact: Fact) -> Fact:
    """An element of a batch or a row of a tensor: a tensor in the same place."""
    if fact.kind is Kind.BOTTOM:
        return BOTTOM
    if fact.kind in (Kind.TENSOR, Kind.BATCH):
        return Fact(Kind.TENSOR, fact.place, memory=fact.memory)
    return UNKNOWN


def _destructure(shape: Shape, path: list[int]) -> Fact:
    for index in path:
        if isinstance(shape, tuple):
            shape = shape[index] if index < len(shape) else UNKNOWN
        else:
            shape = _element(shape)
    return _as_fact(shape)


def _tensor_join(facts: list[Fact], kind: Kind = Kind.TENSOR, default: Place | None = None) -> Fact:
    """A tensor (or `kind`) placed where its tensor operands are; unknown without any."""
    if facts and all(f.kind is Kind.BOTTOM for f in facts):
        return BOTTOM
    operands = [f for f in facts if f.kind in CONTAINERS]
    if not operands:
        return Fact(kind, default) if default is not None else UNKNOWN
    place = operands[0].place
    for other in operands[1:]:
        place = place.join(other.place)
    # computed from pageable tensors alone: new pageable memory, or one of them
    pageable = all(f.memory is Memory.PAGEABLE for f in operands)
    return Fact(kind, place, memory=Memory.PAGEABLE if pageable else Memory.UNKNOWN)


def _literal_entry(literal: cst.BaseExpression | None, key: str, names) -> cst.BaseExpression | None:
    """The value of `key` in a dict literal or a `dict(...)` call with keywords."""
    if isinstance(literal, cst.Dict):
        return dict_entry(literal, key)
    if isinstance(literal, cst.Call) and names.is_(literal.func, "dict", "builtins.dict"):
        found = kwarg(literal, key)
        return found.value if found is not None else None
    return None


def _flag_memory(value: cst.BaseExpression) -> Memory:
    """The memory `pin_memory=value` asks for: pageable for a false literal, else pinned (an
    expression such as `device.type == "cuda"` pins where a copy to CUDA happens)."""
    if isinstance(value, cst.Name) and value.value in ("False", "None"):
        return Memory.PAGEABLE
    if number_value(value) == 0:
        return Memory.PAGEABLE
    return Memory.PINNED


def _string_place(value) -> Place:
    if not isinstance(value, str):
        return Place.UNKNOWN
    if value.startswith("cuda"):
        return Place.CUDA
    if value == "cpu":
        return Place.HOST
    return Place.UNKNOWN


def _fstring_prefix(expr: cst.FormattedString) -> str:
    first = expr.parts[0] if expr.parts else None
    return first.value if isinstance(first, cst.FormattedStringText) else ""


KEY = "values"

# What `number` tells: a certain Python int, or a certain Python number (int or float).
INT, NUMBER = "int", "number"
_INT_OPERATORS = (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide, cst.Modulo)

# The dtypes `dtype` tells apart: enough to know which Python number `.item()` gives.
FLOAT, INT64, BOOL = "float", "int64", "bool"
COMPLEX = "complex"  # of a dtype named (`named_dtype`): fused optimizer kernels take floating point only


def values(context: FileContext) -> Values:
    return context.shared(KEY, Values)


def number_is(context: FileContext, value: int | float) -> m.MatchIfTrue:
    """A pattern of an expression that is the number `value` (`Values.number_value`:
    `0`, `0x0`, `0.` and a name bound only to `0` are each 0)."""
    return m.MatchIfTrue(
        lambda node: isinstance(node, cst.BaseExpression) and values(context).number_value(node) == value
    )


class Values:
    """Dtypes of the tensor expressions of one file; computed on demand and cached."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.kinds = context.kinds
        self.names = context.names
        self._dtypes: dict[int, str | None] = {}
        self._tensors: dict[int, bool] = {}
        self._backward_reads: set[int] | None = None
        self._numbers: dict[int, str | None] = {}
        self._open_numbers: set[int] = set()  # questions being worked out, answered INT meanwhile
        self._guesses_read: list[int] = []  # each read of such an answer, in order
        self._numbers_computed: list[int] = []  # in the order their answers were found

    def dtype(self, expr: cst.BaseExpression) -> str | None:
        """FLOAT, INT64 or BOOL for a tensor of that dtype; None when unknown or not a tensor."""
        key = id(expr)
        if key not in self._dtypes:
            self._dtypes[key] = None  # cycles (`x = x.detach()`) stay unknown
            self._dtypes[key] = self._compute_dtype(expr)
        return self._dtypes[key]

    def is_tensor(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` a tensor: one of known dtype, one Kinds says is a tensor, a tensor
        method's or torch function's result, a model's output?"""
        return self.dtype(expr) is not None or self._tensor_shape(expr)

    def named_dtype(self, expr: cst.BaseExpression, depth: int = 0) -> str | None:
        """FLOAT for an expression that names a floating-point dtype (`torch.float32`,
        `torch.bfloat16`), COMPLEX for a complex one, through the values a name is bound to
        (`Kinds.value_sources`); None when it cannot be told."""
        qualified = self.names.of(expr)
        if qualified & FLOAT_DTYPES:
            return FLOAT
        if qualified & COMPLEX_DTYPES:
            return COMPLEX
        if isinstance(expr, cst.Name) and depth < 3:
            sources = self.context.kinds.value_sources(expr)
            named = {self.named_dtype(s, depth + 1) if s is not None else None for s in sources}
            if sources and len(named) == 1:
                return named.pop()
        return None

    # -- Python numbers -----------------------------------------------------------------------

    def number(self, expr: cst.BaseExpression | None) -> str | None:
        """INT when `expr` is certainly a Python int, NUMBER when certainly a Python int or
        float; None when it cannot be told (see the module docstring)."""
        if expr is None:
            return None
        key = id(expr)
        if key in self._open_numbers:
            self._guesses_read.append(key)
        elif key not in self._numbers:
            self._numbers[key] = INT  # `n = n + 1`: what every other binding gives
            self._open_numbers.add(key)
            mark, read = len(self._numbers_computed), len(self._guesses_read)
            try:
                found = self._numbers[key] = self._compute_number(expr)
            finally:
                self._open_numbers.discard(key)
            if found != INT and key in self._guesses_read[read:]:
                # Answers found meanwhile may rest on the guess that proved wrong: forget them.
                for stale in self._numbers_computed[mark:]:
                    self._numbers.pop(stale, None)
                del self._numbers_computed[mark:]
            self._numbers_computed.append(key)
        return self._numbers[key]

    def is_int(self, expr: cst.BaseExpression) -> bool:
        """Whether `expr` is certainly a Python int, by an answer that rests on no guess of a
        question still open: a question of another analysis asked while a number is being
        worked out (`args.device` is a number? -> the training facts -> the device `args.device`
        names) must not take that number's provisional INT for an answer and keep it."""
        open_before, read = set(self._open_numbers), len(self._guesses_read)
        answer = self.number(expr) == INT
        return answer and not open_before.intersection(self._guesses_read[read:])

    def number_value(self, expr: cst.BaseExpression | None) -> int | float | None:
        """The number `expr` certainly is: a literal in any spelling (`0`, `0x0`, `0.`,
        `(0)`, `-1`, read by `names.number_value`), or a name every binding of which
        assigns one literal of that value (`ZERO = 0`); None otherwise. The question to
        ask of a literal number a pattern needs (`range(0, n)`, `i + 1`, `x.size(0)`)."""
        value = number_value(expr)
        if value is not None or not isinstance(expr, cst.Name):
            return value
        bound = self.context.bindings.values(expr)
        found = {number_value(v) for v in bound or ()}
        return found.pop() if bound and len(found) == 1 and None not in found else None

    def fixed_number(self, expr: cst.BaseExpression | None) -> int | float | None:
        """The number `expr` certainly holds at the values the code fixes: `number_value` (a
        literal, a name every binding of which assigns one literal), or an attribute each
        value of which (`Kinds.attribute_values`) is that number: a field's default on every
        instance built without it and never written (`args.save_every` of `args =
        Hyperparameters()`). Not an argparse option's default: a run may pass another."""
        value = self.number_value(expr)
        if value is not None or not isinstance(expr, cst.Attribute):
            return value
        found = self.kinds.attribute_values(expr)
        numbers = {self.number_value(v) for v in found or ()}
        return numbers.pop() if found and len(numbers) == 1 and None not in numbers else None

    def truth(self, test: cst.BaseExpression) -> bool | None:
        """Whether the condition `test` certainly holds (True) or certainly does not (False) at
        the values the code fixes; None when that cannot be told. A comparison of numbers
        `fixed_number` knows (`args.save_every > 0` with the field's default 0 is False), a
        fixed number (true unless 0), `True`, `False` or a name every binding of which is
        one of them, `not x`, and `a and b` (False when either is), `a or b` (True when
        either is)."""
        if isinstance(test, cst.Name):
            bound = [test] if test.value in ("True", "False") else self.context.bindings.values(test)
            found = {v.value if isinstance(v, cst.Name) and v.value in ("True", "False") else None for v in bound or ()}
            if bound and len(found) == 1 and None not in found:
                return found.pop() == "True"
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            inner = self.truth(test.expression)
            return None if inner is None else not inner
        if isinstance(test, cst.BooleanOperation):
            sides = (self.truth(test.left), self.truth(test.right))
            decides = isinstance(test.operator, cst.Or)  # the side's value that decides the whole
            if decides in sides:
                return decides
            return not decides if sides == (not decides, not decides) else None
        if isinstance(test, cst.Comparison):
            return self._comparison_truth(test)
        number = self.fixed_number(test)
        return None if number is None else number != 0

    def _comparison_truth(self, test: cst.Comparison) -> bool | None:
        """`truth` of `a < b`, `a == b`, ... and of a chain of them (`0 < a <= b`)."""
        found = []
        left = self.fixed_number(test.left)
        for target in test.comparisons:
            compare = NUMBER_COMPARISONS.get(type(target.operator))
            right = self.fixed_number(target.comparator)
            found.append(None if compare is None or left is None or right is None else compare(left, right))
            left = right
        if False in found:
            return False
        return True if all(found) else None

    def _compute_number(self, expr: cst.BaseExpression) -> str | None:
        if isinstance(expr, cst.Integer):
            return INT
        if isinstance(expr, cst.Float):
            return NUMBER
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, (cst.Minus, cst.Plus)):
            return self.number(expr.expression)
        if isinstance(expr, cst.BinaryOperation) and not isinstance(expr.operator, (cst.MatrixMultiply, cst.BitOr)):
            sides = _join_numbers([self.number(expr.left), self.number(expr.right)])
            if sides is None or (sides == INT and isinstance(expr.operator, _INT_OPERATORS)):
                return sides
            return NUMBER  # `/`, `**`: an int may give a float
        if isinstance(expr, cst.Call):
            return self._call_number(expr)
        if isinstance(expr, cst.Subscript):  # `t.shape[1]`, `t.size()[1]`: not a slice of it
            index = len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index)
            return INT if index and _shape_of(expr.value) is not None else None
        if isinstance(expr, cst.Attribute):
            if self.names.of(expr) & MATH_CONSTANTS:
                return NUMBER
            found = self.context.kinds.attribute_values(expr)  # `self.n = 3`, an option's choices
            if found:
                return _join_numbers([self.number(v) for v in found])
            option = self.context.command_line.option_at(expr)
            if option is not None:
                return self._option_number(option)
            return INT if expr.attr.value == "ndim" else None  # a tensor's or an array's rank
        if not isinstance(expr, cst.Name):
            return None
        found = self.kinds.sources(expr)  # the bindings it may read, through `n += 1`
        if not found or not all(type(b) is Assignment for b in found):
            return None
        return _join_numbers([self._bound_number(binding) for binding in found])

    def _option_number(self, option: Option) -> str | None:
        """An argparse option that stores one value converted by `type=int` / `type=float`:
        what a run passes is converted; left out, its default (a string default is
        converted too; none at all is None unless the option is required)."""
        qualified = self.names.of(option.converter) if option.converter is not None else set()
        converted = INT if "builtins.int" in qualified else NUMBER if "builtins.float" in qualified else None
        if converted is None or not option.single:
            return None
        if option.default is None:
            return converted if option.required else None
        if isinstance(option.default, cst.SimpleString):
            return converted
        return _join_numbers([converted, self.number(option.default)])

    def _call_number(self, call: cst.Call) -> str | None:
        qualified = self.names.of(call.func)
        if qualified & {"builtins.len", "builtins.int"} or qualified & (INT_MATH_FUNCTIONS | INT_TORCH_FUNCTIONS):
            return INT
        if qualified & {"builtins.float"} or any(name.startswith("math.") for name in qualified):
            return NUMBER
        if qualified & {"builtins.min", "builtins.max", "builtins.abs"} and call.args:
            return _join_numbers([None if a.star else self.number(a.value) for a in call.args])
        if qualified & {"builtins.round"} and call.args:
            number = self.number(call.args[0].value)
            return (INT if len(call.args) == 1 else number) if number is not None else None
        method = method_name(call)
        if method == "size":
            return INT if call.args else None  # `t.size()` is a torch.Size
        if method in ("numel", "dim") and not call.args:
            return INT
        return NUMBER if method == "item" and not call.args else None

    def _bound_number(self, binding: Assignment) -> str | None:
        node = binding.node
        if isinstance(node, cst.Param):
            return self._param_number(node)
        bindings = self.context.bindings
        statement = bindings.statement(node)
        if isinstance(statement, cst.AugAssign):
            if not isinstance(statement.operator, (cst.AddAssign, cst.SubtractAssign, cst.MultiplyAssign)):
                return None
            return self.number(statement.value)  # what it updates is among the sources
        if isinstance(statement, cst.For):
            return INT if self.loop_index(statement, node) else None
        if isinstance(statement, cst.Assign) and len(statement.targets) > 1:
            # `a = b = 0`: every name gets the same number (an immutable value)
            literal = isinstance(statement.value, (cst.Integer, cst.Float))
            return self.number(statement.value) if literal else None
        value = bindings.assigned_value(binding)
        if value is None:
            unpacked = bindings.unpacked(binding)
            if unpacked is not None and _shape_of(unpacked[0]) is not None:
                return INT  # `B, T, C = x.shape`
            value = self.kinds.element(*unpacked) if unpacked is not None else None  # `a, b = 0, 1.0`
        return self.number(value)

    def _param_number(self, param: cst.Param) -> str | None:
        """A parameter annotated `int` or `float`; else what every call of this file passes
        it (`Kinds.arguments`, the default where a call leaves it); the process index a
        process start passes first (`Loops.gets_process_index`); or, where no call of this
        file is seen, its default."""
        if param.annotation is not None:
            annotated = _annotated_number(param.annotation.annotation)
            if annotated is not None:
                return annotated
        passed = self.kinds.arguments(param)
        if passed is None and self.context.loops.gets_process_index(param):
            return INT  # `mp.spawn(main, ...)` calls `main(i, ...)` in process i
        if passed is None:  # called where this file cannot see: as written, its default
            return self.number(param.default) if param.default is not None else None
        values = [value for _, value in passed]
        if not values or None in values:
            return None
        defaults = [param.default] if param.default is not None else []
        return _join_numbers([self.number(v) for v in [*values, *defaults]])

    def loop_index(self, loop: cst.For, target: cst.CSTNode) -> bool:
        """Is `target` the index of `for i in range(...)` or `for i, x in enumerate(...)`?"""
        iterated = loop.iter
        if not isinstance(iterated, cst.Call):
            return False
        if self.names.is_(iterated.func, "builtins.range"):
            return loop.target is target
        if self.names.is_(iterated.func, "builtins.enumerate"):
            names = loop.target
            return isinstance(names, cst.Tuple) and len(names.elements) == 2 and names.elements[0].value is target
        return False

    # -- dtypes ------------------------------------------------------------------------------

    def _compute_dtype(self, expr: cst.BaseExpression) -> str | None:
        if isinstance(expr, cst.Name):
            return self._name_dtype(expr)
        if isinstance(expr, cst.Attribute):
            return self.dtype(expr.value) if expr.attr.value == "data" else None
        if isinstance(expr, cst.Comparison):
            operands = [expr.left, *(c.comparator for c in expr.comparisons)]
            return BOOL if any(self.is_tensor(o) for o in operands) else None
        if isinstance(expr, cst.BinaryOperation):
            return self._arithmetic_dtype(expr)
        if isinstance(expr, cst.Call):
            return self._call_dtype(expr)
        return None

    def _name_dtype(self, name: cst.Name) -> str | None:
        """A name's dtype: float for a loss a backward pass runs from, else the one dtype
        of every value it may hold."""
        if self._backward_runs(name):
            return FLOAT
        dtypes = {self.dtype(v) if v is not None else None for v in self._values(name)}
        return dtypes.pop() if len(dtypes) == 1 else None

    def _arithmetic_dtype(self, expr: cst.BinaryOperation) -> str | None:
        """The dtype of arithmetic with a tensor operand, by type promotion."""
        (left, left_tensor), (right, right_tensor) = self._operand(expr.left), self._operand(expr.right)
        if not (left_tensor or right_tensor):
            return None
        if isinstance(expr.operator, cst.Divide) or FLOAT in (left, right):
            return FLOAT  # true division of integers gives floating point too
        if (
            isinstance(expr.operator, (cst.Add, cst.Subtract, cst.Multiply))
            and INT64 in (left, right)
            and {left, right} <= {INT64, BOOL}
        ):
            return INT64
        return None

    def _call_dtype(self, call: cst.Call) -> str | None:
        """The dtype of a call's result: a loss or gradient norm, a factory, a function of
        this file, or a tensor method."""
        if self._computes_loss(call) or self.names.of(call) & GRAD_NORMS:
            return FLOAT
        if self.names.of(call.func) & (SHAPED_FACTORIES | INTEGER_FACTORIES):
            return self._made_dtype(call)
        returned = self.context.loops.returned(call)
        if returned is not None:  # a function of this file: what it returns
            dtypes = {self.dtype(value) for value in returned}
            return dtypes.pop() if len(dtypes) == 1 else None
        method = method_name(call)
        if method is None or not self.is_tensor(call.func.value):
            return None
        return self._tensor_method_dtype(call, method)

    def _tensor_method_dtype(self, call: cst.Call, method: str) -> str | None:
        """The dtype of a method called on a tensor."""
        if method in FLOAT_RESULT_METHODS:
            return FLOAT
        if method in INT64_RESULT_METHODS:
            return INT64
        if method in BOOL_RESULT_METHODS:
            return BOOL
        receiver = call.func.value
        if method == "sum" and all(arg.keyword is None or arg.keyword.value in ("dim", "keepdim") for arg in call.args):
            inner = self.dtype(receiver)
            return INT64 if inner in (INT64, BOOL) else inner
        if method in DTYPE_KEEPING_METHODS and not call.args:
            return self.dtype(receiver)
        return None

    def _made_dtype(self, factory: cst.Call) -> str | None:
        """The dtype a factory makes: its `dtype=`, else float32 (int64 for `randint`)."""
        dtype = kwarg(factory, "dtype")
        if dtype is None:
            return INT64 if self.names.of(factory.func) & INTEGER_FACTORIES else FLOAT
        named = self.names.of(dtype.value)
        if named & FLOAT_DTYPES:
            return FLOAT
        if named & INT64_DTYPES:
            return INT64
        return BOOL if "torch.bool" in named else None

    def _operand(self, expr: cst.BaseExpression) -> tuple[str | None, bool]:
        """(dtype, whether it is a tensor) of an arithmetic operand."""
        if isinstance(expr, cst.Float):
            return FLOAT, False
        if isinstance(expr, cst.Integer):
            return INT64, False
        dtype = self.dtype(expr)
        return dtype, dtype is not None or self.is_tensor(expr)

    def _computes_loss(self, call: cst.Call) -> bool:
        """`F.cross_entropy(...)`, or `criterion(...)` of a name whose every binding it may
        read (`Kinds.sources`) is a `torch.nn.*Loss()` instance."""
        if self.names.of(call) & ALL_LOSS_FUNCTIONS:
            return True
        if not isinstance(call.func, cst.Name):
            return False
        found = self.kinds.sources(call.func)
        if not found:
            return False
        built = [self.context.bindings.assigned_value(a) for a in found]
        return all(
            isinstance(v, cst.Call) and any(n.startswith("torch.nn.") and n.endswith("Loss") for n in self.names.of(v))
            for v in built
        )

    def _backward_runs(self, name: cst.Name) -> bool:
        """Does a backward pass run from a value `name` may hold (a read of one of its
        bindings is what `.backward()` differentiates)?"""
        if self._backward_reads is None:
            self._backward_reads = {id(read) for read in self._differentiated()}
        return any(
            id(read) in self._backward_reads
            for binding in self.kinds.sources(name)
            for read in self.kinds.reached_reads(binding)
        )

    def _differentiated(self) -> list[cst.Name]:
        """The names whose values the file's backward calls differentiate: `loss.backward()`,
        or the loss handed over (`accelerator.backward(loss)`, `torch.autograd.backward(loss)`,
        `loss.backward(gradient)`: a gradient has the dtype of its loss), through
        `scaler.scale(loss)` and `(loss / accumulation_steps)`."""
        found = []
        for call in self.context.index.find(cst.Call):
            if method_name(call) != "backward":
                continue
            first = positional(call, 0)
            target = first.value if first is not None else call.func.value
            if isinstance(target, cst.Call) and method_name(target) == "scale" and target.args:
                target = target.args[0].value
            if isinstance(target, cst.BinaryOperation):
                target = target.left
            if isinstance(target, cst.Name):
                found.append(target)
        return found

    # -- tensors -----------------------------------------------------------------------------

    def _tensor_shape(self, expr: cst.BaseExpression) -> bool:
        key = id(expr)
        if key not in self._tensors:
            self._tensors[key] = False  # cycles stay unknown
            self._tensors[key] = self._compute_tensor_shape(expr)
        return self._tensors[key]

    def _compute_tensor_shape(self, expr: cst.BaseExpression) -> bool:
        if self.kinds.fact(expr).kind is Kind.TENSOR:
            return True
        if (
            isinstance(expr, cst.Call)
            and method_name(expr) in TENSOR_RESULT_METHODS
            and isinstance(expr.func, cst.Attribute)
            and self.is_tensor(expr.func.value)
        ):
            return True
        if isinstance(expr, cst.Call) and self.names.of(expr) & TENSOR_FUNCTIONS:
            return True  # `torch.sigmoid(x)`, `torch.stack(...)`
        if isinstance(expr, cst.Attribute) and expr.attr.value in ("data", "grad"):
            return self.is_tensor(expr.value)
        if isinstance(expr, cst.BinaryOperation):  # a tensor combined with anything gives a tensor
            return self.is_tensor(expr.left) or self.is_tensor(expr.right)
        if isinstance(expr, cst.UnaryOperation):
            return self.is_tensor(expr.expression)
        if isinstance(expr, cst.Name):
            found = self._values(expr)
            return bool(found) and all(v is not None and self.is_tensor(v) for v in found)
        if isinstance(expr, cst.Call):
            returned = self.context.loops.returned(expr)
            if returned is not None:
                return bool(returned) and all(self.is_tensor(v) for v in returned)
            return self.context.training.is_model(expr.func)  # `model(x)`: a model's output
        return False

    def _values(self, name: cst.Name) -> list[cst.BaseExpression | None]:
        """What the bindings `name` may read give it (`Kinds.sources`): an assigned value,
        the element `a, b = x, y` unpacks, what a function of this file returns there for
        `a, b = f(...)`, what every call of this file passes a parameter; None for a binding
        whose value cannot be told."""
        found: list[cst.BaseExpression | None] = []
        for binding in self.kinds.sources(name):
            found.extend(self._bound(binding))
        return found

    def _bound(self, binding: Assignment) -> list[cst.BaseExpression | None]:
        bindings = self.context.bindings
        if isinstance(self.context.parents.get(binding.node), cst.AugAssign):
            return []  # `x += y` keeps the dtype of the tensor it updates (among the sources)
        value = bindings.assigned_value(binding)
        if value is not None:
            return [value]
        if isinstance(binding.node, cst.Param):
            passed = self.kinds.passed(binding.node)  # what every call of this file passes
            return list(passed) if passed else [None]
        unpacked = bindings.unpacked(binding)
        if unpacked is None:
            return [None]
        element = self.kinds.element(*unpacked)
        if element is not None:
            return [element]
        returned = self.context.loops.returned(*unpacked) if isinstance(unpacked[0], cst.Call) else None
        return list(returned) if returned is not None else [None]


def _annotated_number(annotation: cst.BaseExpression) -> str | None:
    """INT for `int`, NUMBER for `float`, and so for `Optional[int]` / `float | None` (a None
    that reaches arithmetic fails before it could be a tensor)."""
    if isinstance(annotation, cst.Name) and annotation.value in ("int", "float"):
        return INT if annotation.value == "int" else NUMBER
    if isinstance(annotation, cst.BinaryOperation) and isinstance(annotation.operator, cst.BitOr):
        sides = [annotation.left, annotation.right]
        others = [side for side in sides if not (isinstance(side, cst.Name) and side.value == "None")]
        return _annotated_number(others[0]) if len(others) == 1 else None
    if isinstance(annotation, cst.Subscript) and len(annotation.slice) == 1:
        optional = annotation.value
        named = optional.attr if isinstance(optional, cst.Attribute) else optional  # `typing.Optional`
        named = named.value if isinstance(named, cst.Name) else None
        inner = annotation.slice[0].slice
        if named == "Optional" and isinstance(inner, cst.Index):
            return _annotated_number(inner.value)
    return None


def _shape_of(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """`t` for `t.shape` and `t.size()`: a tuple of ints."""
    if isinstance(expr, cst.Attribute) and expr.attr.value == "shape":
        return expr.value
    if isinstance(expr, cst.Call) and method_name(expr) == "size" and not expr.args:
        return expr.func.value
    return None


def _join_numbers(found: list[str | None]) -> str | None:
    """INT when every part is an int, NUMBER when every part is a number, else None."""
    if not found or None in found:
        return None
    return INT if all(f == INT for f in found) else NUMBER

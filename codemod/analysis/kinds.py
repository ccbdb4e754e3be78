"""What a name or expression holds: tensor, batch, module, optimizer, loader,
dataset or device, and for tensors and devices whether they live on the host or
on CUDA. Unknown stays unknown: rules fix only what this analysis can tell.

Names are resolved flow-sensitively enough for training scripts: of the
bindings that come before a use, the last one wins when it dominates the use
(it sits in a block enclosing the use); otherwise all are joined. Bindings later
in an enclosing loop reach the use too (they are carried to the next iteration),
unless the loop re-binds the name before the use (its own target, say).

DataLoader batches are taken to be host tensors unless the dataset is built
from device tensors.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Union

import libcst as cst
from libcst.metadata import Assignment, ComprehensionScope

from codemod.analysis.torch_facts import (
    DATASET_CLASSES,
    DTYPE_NAMES,
    HOST_ONLY_FACTORIES,
    PASS_THROUGH_ITERABLES,
    SAME_PLACE_METHODS,
    TENSOR_ATTRIBUTES,
    TENSOR_FACTORIES,
    TENSOR_FUNCTIONS,
)
from codemod.analysis.names import kwarg, method_name, positional, sole_definition

if TYPE_CHECKING:
    from codemod.context import FileContext


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


class Place(enum.Enum):
    HOST = "host"
    CUDA = "cuda"
    UNKNOWN = "unknown"

    def join(self, other: "Place") -> "Place":
        return self if self is other else Place.UNKNOWN


@dataclass(frozen=True)
class Fact:
    kind: Kind
    place: Place = Place.UNKNOWN

    def join(self, other: "Fact") -> "Fact":
        if self.kind is Kind.BOTTOM:
            return other
        if other.kind is Kind.BOTTOM:
            return self
        if self.kind is not other.kind:
            return UNKNOWN
        return Fact(self.kind, self.place.join(other.place))

    @property
    def is_host_tensor(self) -> bool:
        return self.kind is Kind.TENSOR and self.place is Place.HOST


UNKNOWN = Fact(Kind.UNKNOWN)
BOTTOM = Fact(Kind.BOTTOM)

# What iterating or unpacking yields: one fact, or a tuple of shapes (enumerate, zip).
Shape = Union[Fact, tuple]

# Functions whose result is a tensor on the device of their tensor arguments.
# Tensor methods that return a tensor on the receiver's device.
DEVICE_NAME = re.compile(r"^(device|dev|\w+_device|\w+_dev|device_\w+)$")
DTYPE_NAME = re.compile(r"^(dtype|\w+_dtype)$")
DEVICE_STRING = re.compile(r"^(cuda|cpu|mps|xla|xpu|meta|hpu)(:\d+)?$")
ASSIGN_LIKE = (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.NamedExpr)
LOOPS = (cst.For, cst.While)


@dataclass(frozen=True)
class Copy:
    """A `.to(...)` or `.cuda(...)` call, as PM101 and friends need it."""

    call: cst.Call
    method: str  # "to" or "cuda"
    receiver: Fact
    target: Place  # where the result lives
    moves_device: bool  # False for dtype-only `.to(torch.float16)`
    has_non_blocking: bool


class Kinds:
    """Facts about expressions of one file; computed on demand and cached."""

    def __init__(self, context: "FileContext") -> None:
        self.names = context.names
        self.scopes = context.scopes
        self.index = context.index
        self.parents = context.parents
        self._facts: dict[int, Fact] = {}
        self._guesses: dict[int, Fact] = {}  # expressions being resolved -> current guess
        self._recursive: set[int] = set()  # ... whose guess was used while resolving them
        self._computed: list[int] = []  # cache keys in the order they were filled
        self._class_kinds: dict[int, Fact] = {}
        self._default_device_changed = "set_default_device" in context.code or "set_default_tensor_type" in context.code

    # -- public API ------------------------------------------------------------

    def fact(self, expr: cst.BaseExpression) -> Fact:
        fact = self._fact(expr)
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
        self._guesses[key] = BOTTOM
        while True:
            mark = len(self._computed)
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
        if isinstance(expr, cst.Integer):
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
        return isinstance(expr, cst.Name) and bool(DEVICE_NAME.match(expr.value))

    def is_dtype(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.Attribute) and expr.attr.value == "dtype":
            return True
        if isinstance(expr, (cst.Attribute, cst.Name)) and any(
            n.startswith("torch.") and n.rsplit(".", 1)[1] in DTYPE_NAMES for n in self.names.of(expr)
        ):
            return True
        return isinstance(expr, cst.Name) and bool(DTYPE_NAME.match(expr.value))

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

    def storage_root(self, expr: cst.BaseExpression) -> cst.BaseExpression:
        """The variable whose storage `expr` may share: `buf` for `buf[0].float()`
        (indexing makes views, and a conversion to the same dtype returns self)."""
        while True:
            if isinstance(expr, cst.Subscript) or (isinstance(expr, cst.Attribute) and expr.attr.value in TENSOR_ATTRIBUTES):
                expr = expr.value
            elif isinstance(expr, cst.Call) and method_name(expr) in SAME_PLACE_METHODS:
                expr = expr.func.value
            else:
                return expr

    def is_mutated_in_place(self, name: cst.Name) -> bool:
        """Is the variable behind `name` written in place anywhere in its scope
        (`buf.copy_(...)`, `buf[i] = ...`, `buf += ...`, `out=buf`)?"""
        scope = self.scopes.get(name)
        if scope is None:
            return True
        if any(isinstance(self.parents.get(a.node), cst.AugAssign) for a in scope.assignments[name.value]):
            return True  # `buf += 1` is an in-place add on a tensor
        for access in scope.accesses[name.value]:
            parent = self.parents.get(access.node)
            if isinstance(parent, cst.Attribute) and parent.value is access.node:
                call = self.parents.get(parent)
                if isinstance(call, cst.Call) and parent.attr.value.endswith("_") and not parent.attr.value.startswith("_"):
                    return True
            if isinstance(parent, cst.Subscript) and isinstance(self.parents.get(parent), cst.AssignTarget):
                return True
            if isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "out":
                return True
        return False

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
            return _element(self._fact(expr.value))
        if isinstance(expr, cst.Attribute):
            return self._attribute_fact(expr)
        if isinstance(expr, cst.BinaryOperation):
            return _tensor_join([self._fact(expr.left), self._fact(expr.right)])
        if isinstance(expr, cst.UnaryOperation):
            operand = self._fact(expr.expression)
            return operand if operand.kind in (Kind.TENSOR, Kind.BOTTOM) else UNKNOWN
        if isinstance(expr, cst.IfExp):
            return self._fact(expr.body).join(self._fact(expr.orelse))
        if isinstance(expr, cst.SimpleString) and self.is_device(expr):
            return Fact(Kind.DEVICE, self.device_place(expr))
        return UNKNOWN

    def _attribute_fact(self, expr: cst.Attribute) -> Fact:
        attr = expr.attr.value
        if attr == "device":
            owner = self._fact(expr.value)
            if owner.kind is Kind.BOTTOM:
                return BOTTOM
            return Fact(Kind.DEVICE, owner.place if owner.kind is Kind.TENSOR else Place.UNKNOWN)
        if attr in TENSOR_ATTRIBUTES:
            owner = self._fact(expr.value)
            return owner if owner.kind is Kind.TENSOR else UNKNOWN
        return UNKNOWN

    def _call_fact(self, call: cst.Call) -> Fact:
        for name in sorted(self.names.of(call.func)):
            fact = self._library_call_fact(name, call)
            if fact is not None:
                return fact
        local = self.local_class(call.func)
        if local is not None:
            return self.class_fact(local)
        method = method_name(call)
        if method is not None:
            return self._method_fact(call, method)
        if self._fact(call.func).kind is Kind.MODULE:  # model(x)
            return Fact(Kind.TENSOR)
        return UNKNOWN

    def _library_call_fact(self, name: str, call: cst.Call) -> Fact | None:
        first = positional(call, 0)
        if name in TENSOR_FACTORIES:
            device = kwarg(call, "device")
            if device is not None:
                return Fact(Kind.TENSOR, self.device_place(device.value))
            return Fact(Kind.TENSOR, Place.UNKNOWN if self._default_device_changed else Place.HOST)
        if name in HOST_ONLY_FACTORIES:
            return Fact(Kind.TENSOR, Place.HOST)
        if name in TENSOR_FUNCTIONS:
            values = [a.value for a in call.args if a.keyword is None and not a.star]
            if values and isinstance(values[0], (cst.List, cst.Tuple)):
                values = [e.value for e in values[0].elements]
            return _tensor_join([self._fact(v) for v in values])
        if name in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            return self._fact(first.value) if first else UNKNOWN
        if name == "torch.device":
            return Fact(Kind.DEVICE, self.device_place(first.value) if first else Place.UNKNOWN)
        if name == "torch.utils.data.DataLoader":
            return Fact(Kind.LOADER, self._loader_place(call))
        if name in DATASET_CLASSES:
            return _tensor_join([self._fact(a.value) for a in call.args], Kind.DATASET, default=Place.HOST)
        if name == "torch.compile":
            return self._fact(first.value) if first else UNKNOWN
        return self._class_name_fact(name)

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
        if name.startswith("torch.nn.") and not name.startswith(("torch.nn.functional", "torch.nn.parameter", "torch.nn.init", "torch.nn.utils")):
            return Fact(Kind.MODULE)
        return None

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
            return Fact(receiver.kind, copy.target)
        if method == "cpu":
            return Fact(receiver.kind, Place.HOST) if receiver.kind in (Kind.TENSOR, Kind.MODULE) else UNKNOWN
        if method == "pin_memory":
            return Fact(Kind.TENSOR, Place.HOST) if receiver.kind is Kind.TENSOR else UNKNOWN
        if method in SAME_PLACE_METHODS and receiver.kind is Kind.TENSOR:
            return receiver
        return UNKNOWN

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
        bindings = [a for a in scope[name.value]]
        if not bindings:
            return UNKNOWN
        if not all(isinstance(a, Assignment) for a in bindings):
            return UNKNOWN  # builtins, imports: not values we track
        facts = [self._binding_fact(a.node) for a in self._reaching(name, bindings)]
        if not facts:
            return UNKNOWN
        result = facts[0]
        for fact in facts[1:]:
            result = result.join(fact)
        return result

    def _reaching(self, use: cst.Name, bindings: list[Assignment]) -> list[Assignment]:
        use_scope = self.scopes.get(use)
        if any(a.scope is not use_scope or isinstance(a.scope, ComprehensionScope) for a in bindings):
            return bindings  # bound in an enclosing scope or a comprehension: no order to use
        use_at = self._start(use)
        before, after = [], []
        for binding in bindings:
            (before if self._binds_before(binding.node, use, use_at) else after).append(binding)
        before.sort(key=lambda a: self._bound_at(a.node))
        last = before[-1] if before else None
        if last is not None and self._dominates(last.node, use):
            reaching = [last]
        else:
            reaching = before
        for binding in after:
            loop = self._shared_loop(binding.node, use)
            if loop is None:
                continue
            if last is not None and reaching == [last] and self.index.inside(last.node, loop):
                continue  # re-bound in every iteration before the use
            reaching.append(binding)
        return reaching

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
        statement = self._binding_statement(target)
        return self.index.end(statement if isinstance(statement, ASSIGN_LIKE) else target)

    def _start(self, node: cst.CSTNode) -> int:
        return self.index.order(node)

    def _dominates(self, target: cst.CSTNode, use: cst.CSTNode) -> bool:
        statement = self._binding_statement(target)
        if isinstance(statement, (cst.For, cst.With)):
            return self.index.inside(use, statement.body)
        if isinstance(statement, (cst.FunctionDef, cst.Param, cst.Parameters)):
            return True
        block = self._block_of(statement)
        return block is not None and self.index.inside(use, block)

    def _shared_loop(self, target: cst.CSTNode, use: cst.CSTNode) -> cst.CSTNode | None:
        for loop in self.enclosing(use, LOOPS):
            if self.index.inside(target, loop):
                return loop
        return None

    def _block_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.index.first_enclosing(node, (cst.IndentedBlock, cst.Module, cst.SimpleStatementSuite))

    def _binding_statement(self, target: cst.CSTNode) -> cst.CSTNode:
        """The Assign / For / CompFor / With / ... that binds `target`."""
        current = target
        while True:
            parent = self.parents.get(current)
            if parent is None or not isinstance(
                parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement, cst.AssignTarget, cst.AsName, cst.WithItem)
            ):
                return parent if parent is not None else current
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
            return _destructure(self._value_shape(statement.value), path)
        if isinstance(statement, (cst.AnnAssign, cst.NamedExpr)) and statement.value is not None:
            if isinstance(statement, cst.AnnAssign) and self._is_tensor_annotation(statement.annotation.annotation):
                value = self._fact(statement.value)
                return value if value.kind is Kind.TENSOR else Fact(Kind.TENSOR)
            return _destructure(self._value_shape(statement.value), path)
        if isinstance(statement, (cst.For, cst.CompFor)):
            return _destructure(self._item_shape(statement.iter), path)
        return UNKNOWN

    def _param_fact(self, param: cst.Param) -> Fact:
        if param.annotation is not None and self._is_tensor_annotation(param.annotation.annotation):
            return Fact(Kind.TENSOR)
        if DEVICE_NAME.match(param.name.value):
            return Fact(Kind.DEVICE)
        return UNKNOWN

    def _is_tensor_annotation(self, annotation: cst.BaseExpression) -> bool:
        return self.names.is_(annotation, "torch.Tensor")

    def _value_shape(self, value: cst.BaseExpression) -> Shape:
        if isinstance(value, (cst.Tuple, cst.List)) and not any(isinstance(e, cst.StarredElement) for e in value.elements):
            return tuple(self._value_shape(e.value) for e in value.elements)
        if isinstance(value, cst.Call) and self.names.is_(value.func, "next", "builtins.next"):
            first = positional(value, 0)
            return self._item_shape(first.value) if first else UNKNOWN
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
            return Fact(Kind.BATCH, fact.place)
        return _element(fact)


def _element(fact: Fact) -> Fact:
    """An element of a batch or a row of a tensor: a tensor in the same place."""
    if fact.kind is Kind.BOTTOM:
        return BOTTOM
    if fact.kind in (Kind.TENSOR, Kind.BATCH):
        return Fact(Kind.TENSOR, fact.place)
    return UNKNOWN


def _destructure(shape: Shape, path: list[int]) -> Fact:
    for index in path:
        if isinstance(shape, tuple):
            shape = shape[index] if index < len(shape) else UNKNOWN
        else:
            shape = _element(shape)
    return shape if isinstance(shape, Fact) else UNKNOWN


def _tensor_join(facts: list[Fact], kind: Kind = Kind.TENSOR, default: Place | None = None) -> Fact:
    """A tensor (or `kind`) placed where its tensor operands are; unknown without any."""
    if facts and all(f.kind is Kind.BOTTOM for f in facts):
        return BOTTOM
    places = [f.place for f in facts if f.kind is Kind.TENSOR]
    if not places:
        return Fact(kind, default) if default is not None else UNKNOWN
    place = places[0]
    for other in places[1:]:
        place = place.join(other)
    return Fact(kind, place)


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

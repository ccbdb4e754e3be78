"""The dtype of a tensor expression, as a question of the one value analysis.

`Kinds` (analysis/kinds.py) says what an expression holds and where (`fact`: kind,
place, memory) and which bindings a read may see (`reaching`, `sources`); this module
asks it, and the training program above it, for the dtype a tensor holds: as much of
it as tells which Python number `.item()` gives.

    values(context).dtype(expr)      FLOAT, INT64 or BOOL; None when unknown or not a tensor
    values(context).is_tensor(expr)  whether `expr` is a tensor, of any dtype
    values(context).named_dtype(expr)  FLOAT or COMPLEX for an expression that names a
                                     dtype (`torch.bfloat16`, a name bound to one)
    values(context).number(expr)     INT for a certain Python int, NUMBER for a certain
                                     Python number (int or float); None otherwise

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
argparse option's `choices`, a config field). The value of a literal is read by
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

from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import Assignment

from codemod.analysis.kinds import Kind
from codemod.analysis.names import method_name, positional
from codemod.analysis.torch_facts import (
    ALL_LOSS_FUNCTIONS,
    BOOL_RESULT_METHODS,
    COMPLEX_DTYPES,
    DTYPE_KEEPING_METHODS,
    FLOAT_DTYPES,
    FLOAT_RESULT_METHODS,
    GRAD_NORMS,
    INT64_RESULT_METHODS,
    INT_MATH_FUNCTIONS,
    MATH_CONSTANTS,
    TENSOR_FUNCTIONS,
    TENSOR_RESULT_METHODS,
)

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "values"

# What `number` tells: a certain Python int, or a certain Python number (int or float).
INT, NUMBER = "int", "number"
_INT_OPERATORS = (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide, cst.Modulo)

# The dtypes `dtype` tells apart: enough to know which Python number `.item()` gives.
FLOAT, INT64, BOOL = "float", "int64", "bool"
COMPLEX = "complex"  # of a dtype named (`named_dtype`): fused optimizer kernels take floating point only


def values(context: FileContext) -> Values:
    return context.shared(KEY, Values)


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
        (`Training.value_sources`); None when it cannot be told."""
        qualified = self.names.of(expr)
        if qualified & FLOAT_DTYPES:
            return FLOAT
        if qualified & COMPLEX_DTYPES:
            return COMPLEX
        if isinstance(expr, cst.Name) and depth < 3:
            sources = self.context.training.value_sources(expr)
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
        if key not in self._numbers:
            self._numbers[key] = INT  # `n = n + 1`: what every other binding gives
            self._numbers[key] = self._compute_number(expr)
        return self._numbers[key]

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
            found = self.context.training.attribute_values(expr)  # `self.n = 3`, an option's choices
            if found:
                return _join_numbers([self.number(v) for v in found])
            return INT if expr.attr.value == "ndim" else None  # a tensor's or an array's rank
        if not isinstance(expr, cst.Name):
            return None
        found = self.kinds.sources(expr)  # the bindings it may read, through `n += 1`
        if not found or not all(type(b) is Assignment for b in found):
            return None
        return _join_numbers([self._bound_number(binding) for binding in found])

    def _call_number(self, call: cst.Call) -> str | None:
        qualified = self.names.of(call.func)
        if qualified & {"builtins.len", "builtins.int"} or qualified & INT_MATH_FUNCTIONS:
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
            return INT if self._loop_index(statement, node) else None
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
        it (`Kinds.arguments`, the default where a call leaves it), or, where no call of this
        file is seen, its default."""
        if param.annotation is not None:
            annotated = _annotated_number(param.annotation.annotation)
            if annotated is not None:
                return annotated
        passed = self.kinds.arguments(param)
        if passed is None:  # called where this file cannot see: as written, its default
            return self.number(param.default) if param.default is not None else None
        values = [value for _, value in passed]
        if not values or None in values:
            return None
        defaults = [param.default] if param.default is not None else []
        return _join_numbers([self.number(v) for v in [*values, *defaults]])

    def _loop_index(self, loop: cst.For, target: cst.CSTNode) -> bool:
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
            if self._backward_runs(expr):
                return FLOAT
            dtypes = {self.dtype(v) if v is not None else None for v in self._values(expr)}
            return dtypes.pop() if len(dtypes) == 1 else None
        if isinstance(expr, cst.Attribute):
            return self.dtype(expr.value) if expr.attr.value == "data" else None
        if isinstance(expr, cst.Comparison):
            operands = [expr.left, *(c.comparator for c in expr.comparisons)]
            return BOOL if any(self.is_tensor(o) for o in operands) else None
        if isinstance(expr, cst.BinaryOperation):
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
        if not isinstance(expr, cst.Call):
            return None
        if self._computes_loss(expr) or self.names.of(expr) & GRAD_NORMS:
            return FLOAT
        returned = self.context.loops.returned(expr)
        if returned is not None:  # a function of this file: what it returns
            dtypes = {self.dtype(value) for value in returned}
            return dtypes.pop() if len(dtypes) == 1 else None
        method = method_name(expr)
        if method is None:
            return None
        receiver = expr.func.value
        if not self.is_tensor(receiver):
            return None
        if method in FLOAT_RESULT_METHODS:
            return FLOAT
        if method in INT64_RESULT_METHODS:
            return INT64
        if method in BOOL_RESULT_METHODS:
            return BOOL
        if method == "sum" and all(arg.keyword is None or arg.keyword.value in ("dim", "keepdim") for arg in expr.args):
            inner = self.dtype(receiver)
            return INT64 if inner in (INT64, BOOL) else inner
        if method in DTYPE_KEEPING_METHODS and not expr.args:
            return self.dtype(receiver)
        return None

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

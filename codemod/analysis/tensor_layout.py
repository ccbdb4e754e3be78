"""Tensor layouts: the shapes the code shows, and the einsum specs it writes.

A *shape* is a tuple with one entry per dim: the code of its size when the code
names it (`"B"`, `"self.n_head"`, `"4"`), or None when only the dim's existence
is known; the shape itself is None when not even the rank is known. Shapes come
from what builds a tensor (`view(B, T, H, K)`, `torch.zeros(B, H, K, V)`,
`x.new_zeros(...)`), what keeps or moves its dims (`transpose`, `permute`,
`unsqueeze`, indexing, elementwise ops, `einsum`, `@`, `nn.Linear`), what takes it
apart (`q, k, v = t.unbind(0)`, `.split`, `.chunk`), and what reads it
(`B, T, C = x.shape` proves x has three dims of those sizes).

Sizes are compared as code: `T` and `x.size(1)` are the same size when `x`'s dim 1
is `T`; a name bound once to `x.shape[1]` is that size too. Codes are only
meaningful inside one function, so a shape taken from another one (an attribute
set in `__init__`) keeps its rank and literal sizes only.

Einsum specs are parsed here too (`Spec`), with `...` as one leading group.

This module also gives the rules a cheap look-up over the shared tree index:
`reads` (the names an expression reads).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst
from libcst.metadata import Assignment

from codemod.analysis import match as m
from codemod.analysis.local_calls import local_calls
from codemod.analysis.names import integer_value, kwarg, names_read, positional
from codemod.analysis.torch_facts import (
    FILLED_FACTORIES,
    FILLED_METHODS,
    JOINING_FUNCTIONS,
    LAST_DIM_FUNCTIONS,
    LAST_DIM_METHODS,
    LAST_DIM_MODULES,
    LIKE_FACTORIES,
    NEW_FACTORY_METHODS,
    NN_LAYER_ARGUMENTS,
    NORM_METHODS,
    NOT_ONE_TENSOR_METHODS,
    PRODUCT_FUNCTIONS,
    PRODUCT_METHODS,
    REDUCTION_METHODS,
    REORDERING_METHODS,
    RESHAPING_METHODS,
    SAME_SHAPE_MODULES,
    SHAPED_FACTORIES,
    SPLITTING_METHODS,
    SQUEEZING_METHODS,
    STACKING_FUNCTIONS,
    chain_of_module_methods,
    module_of_chain,
)
from codemod.analysis.torch_ops import OPS, Category, functions, methods
from codemod.analysis.torch_ops import Shape as ShapeRule
from codemod.analysis.values import values

if TYPE_CHECKING:
    from codemod.context import FileContext

Shape = "tuple[str | None, ...] | None"
MAX_DEPTH = 10

# Calls whose result has the shape of their (first) tensor argument or receiver.
SAME_SHAPE_METHODS = methods(Category.UNARY, Category.BINARY, Category.CAST, Category.ALONG_DIM, Category.REARRANGE)
SAME_SHAPE_FUNCTIONS = functions(Category.UNARY, Category.ALONG_DIM, Category.REARRANGE)
# Calls whose result has the shape the sizes they are given say.
SIZED_FACTORIES = SHAPED_FACTORIES | FILLED_FACTORIES
# Modules whose output has the rank of their input: the same shape, or the last dim's size their own.
RANK_KEEPING_MODULES = SAME_SHAPE_MODULES | LAST_DIM_MODULES
# Layers whose output runs over a sequence's steps at a dim the table names (`nn.LSTM`: 0).
STEPPING_LAYERS = {name: op for name, op in OPS.items() if op.steps_dim is not None}


# Calls whose integer arguments are dims (or sizes, for the reshaping ones): a dim counted
# from the front names another dim once the input has one more leading dim.
_DIM_METHODS = methods(Category.ALONG_DIM, Category.REDUCTION, Category.VIEW, Category.METADATA) | RESHAPING_METHODS
_DIM_FUNCTIONS = functions(Category.ALONG_DIM, Category.REDUCTION, Category.VIEW, Category.JOIN)
# Calls without dims that keep the leading dims of what they are given: elementwise math,
# casts, new tensors from sizes (read by the same walk).
_LEADING_DIM_FUNCTIONS = functions(Category.UNARY, Category.BINARY, Category.CAST, Category.FACTORY)
_LEADING_DIM_METHODS = methods(Category.UNARY, Category.BINARY, Category.CAST)
_BINARY_METHODS = methods(Category.BINARY, in_place=False)  # the result broadcasts receiver and argument
_PLAIN_BUILTINS = {f"{prefix}{name}" for prefix in ("", "builtins.") for name in ("range", "int", "float", "bool")}


def front_dim_read(context: FileContext, function: cst.FunctionDef) -> cst.CSTNode | None:
    """The first expression of a method of a module class that reads a dim of a tensor
    counted from the front, or may (`x.size(1)`, `x[:, 0]`, `x.shape[0]`, `len(x)`,
    `cumsum(dim=1)`, `torch.cat(xs)` along its default dim 0, `x.view(B, T, -1)`, `x.sum()`
    over every dim, `x.T`, `for row in x` over a parameter), or makes a call it does not
    know to keep the leading dims (`x.gather(1, i)`, `torch.einsum`, a function of the file);
    None when every dim it names is a literal counted from the end (`x.size(-2)`,
    `x[..., 0]`, `softmax(dim=-1)`) and every call is elementwise, a cast, a factory, a
    product over the last dims, or a call of `self.<name>` (its submodules and methods,
    which the caller reads in turn): then an input with one more leading dim gives each of
    its rows what that row gave alone. Only the spelling is read; a `torch.arange` built
    inside (one dim, its size read by the same rules) is indexed as it likes."""
    params = function.params.params
    owner = params[0].name.value if params else None
    for node in context.index.find((cst.Call, cst.Subscript, cst.Attribute, cst.For), within=function.body):
        if isinstance(node, cst.For):
            if _loops_over_parameter(context, node):
                return node.iter
        elif isinstance(node, cst.Attribute):
            if node.attr.value == "T":
                return node
        elif isinstance(node, cst.Subscript):
            if not _leaves_front_dims(context, node):
                return node
        elif not _keeps_leading_dims(context, node, owner):
            return node
    return None


def _loops_over_parameter(context: FileContext, loop: cst.For) -> bool:
    """`for row in x` over a parameter: its dim 0, the batch's once it has one more."""
    return isinstance(loop.iter, cst.Name) and context.bindings.param_of(loop.iter) is not None


def _leaves_front_dims(context: FileContext, subscript: cst.Subscript) -> bool:
    """Does `subscript` leave the front dims alone: `x[..., 0]`, `x.shape[-1]`, or an index
    into a `torch.arange` built here (one dim, whatever the input's rank)?"""
    first = subscript.slice[0].slice
    if isinstance(first, cst.Index) and isinstance(first.value, cst.Ellipsis):
        return True
    values = context.bindings.values(subscript.value) if isinstance(subscript.value, cst.Name) else None
    if values and all(isinstance(v, cst.Call) and context.names.is_(v.func, "torch.arange") for v in values):
        return True
    return (
        m.matches(subscript.value, m.Attribute(attr=m.Name("shape")))
        and len(subscript.slice) == 1
        and isinstance(first, cst.Index)
        and (integer_value(first.value) or 0) < 0
    )


def _keeps_leading_dims(context: FileContext, call: cst.Call, owner: str | None) -> bool:
    """Does `call` give each row of an input with one more leading dim what the row gave
    alone: a call of `self.<name>` (read by the caller), `math`, a call on the last dims,
    dims counted from the end, elementwise math, a cast, a factory?"""
    if owner is not None and m.matches(call.func, m.Attribute(value=m.Name(owner))):
        return True  # `self.fc(x)`: a submodule or a method, read by the caller
    qualified = context.names.of(call.func)
    if qualified and all(name.startswith("math.") for name in qualified):
        return True
    # `torch.cat(xs, -1).sum` is named `torch.cat.sum`: a method of a value unless the
    # name is a function this walk knows
    known = qualified & (_DIM_FUNCTIONS | _LEADING_DIM_FUNCTIONS | LAST_DIM_FUNCTIONS | _PLAIN_BUILTINS)
    method = call.func.attr.value if isinstance(call.func, cst.Attribute) and not known else None
    if known & LAST_DIM_FUNCTIONS or method in LAST_DIM_METHODS:
        return True
    if known & _DIM_FUNCTIONS or method in _DIM_METHODS:
        return _dims_from_end(call, known, method)
    return bool(known & (_LEADING_DIM_FUNCTIONS | _PLAIN_BUILTINS)) or method in _LEADING_DIM_METHODS


def _dims_from_end(call: cst.Call, known: set[str], method: str | None) -> bool:
    """Does every dim `call` is given count from the end, as a literal (`softmax(dim=-1)`,
    `x.size(-2)`)? A default dim (0 or every dim) does not."""
    if method in RESHAPING_METHODS or method == "permute" or known & {"torch.reshape", "torch.permute"}:
        return False  # a shape or an order of every dim, the batch's among them
    arguments = _positional_values(call)
    # a function's first argument is its tensor (or tensors); a split's is a size
    skip = 1 if method is None or method in SPLITTING_METHODS else 0
    dims = arguments[skip:] + [
        a.value for a in call.args if a.keyword is not None and a.keyword.value.startswith(("dim", "start", "end"))
    ]
    return bool(dims) and all(integer_value(d) is not None and integer_value(d) < 0 for d in dims)


# -- reading names -------------------------------------------------------------------------

_BINDING_PARENTS = (cst.AssignTarget, cst.AsName, cst.Param)


def reads(context: FileContext, node: cst.CSTNode) -> list[cst.Name]:
    """The names `node` reads (not attribute or keyword names, not assignment targets),
    from the shared index when `node` is in the parsed tree."""
    index = context.index
    if node not in index:
        return names_read(node)
    found = []
    parents = index.parents
    for name in index.find(cst.Name, within=node):
        parent = parents.get(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            continue
        if isinstance(parent, cst.Arg) and parent.keyword is name:
            continue
        if _bound_here(name, node, parents):
            continue
        found.append(name)
    return found


def _bound_here(name: cst.Name, top: cst.CSTNode, parents) -> bool:
    """Is `name` a target of a binding inside `top` (an assignment, a loop target, a parameter)?"""
    current, child = parents.get(name), name
    while current is not None and child is not top:
        if isinstance(current, _BINDING_PARENTS) or isinstance(current, cst.ImportAlias):
            return True
        if isinstance(current, (cst.For, cst.CompFor)) and current.target is child:
            return True
        if isinstance(current, cst.NamedExpr) and current.target is child:
            return True
        if isinstance(current, (cst.AugAssign, cst.AnnAssign)) and current.target is child:
            return True
        if isinstance(current, (cst.Subscript, cst.Attribute, cst.Call, cst.BinaryOperation)):
            return False  # a read inside a target (`x[i] = ...` reads i): not a binding of it
        child, current = current, parents.get(current)
    return False


def read_names(context: FileContext, node: cst.CSTNode) -> set[str]:
    """The names `node` reads (cached per node of the parsed tree)."""
    if node not in context.index:
        return {name.value for name in names_read(node)}
    cache = context.shared("tensor_layout.read_names", lambda _: {})
    found = cache.get(node)
    if found is None:
        found = cache[node] = frozenset(name.value for name in reads(context, node))
    return set(found)


def _is_self(name: cst.Name, method: cst.FunctionDef) -> bool:
    params = method.params.params
    return bool(params) and params[0].name.value == name.value


# -- einsum specs --------------------------------------------------------------------------


class Spec(NamedTuple):
    """An einsum equation: each operand's letters and the output's, `...` as the letter
    '.' (at most once per term, leading)."""

    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Spec | None:
        text = text.replace(" ", "")
        if "->" not in text:
            return None  # the implicit output (sorted letters) is left out
        left, output = text.split("->")
        terms = left.split(",")
        parsed = [_letters(term) for term in [*terms, output]]
        if any(p is None for p in parsed):
            return None
        *inputs, out = parsed
        letters = {c for term in inputs for c in term}
        if any(c not in letters for c in out) or len(set(out)) != len(out):
            return None
        return cls(tuple(inputs), out)

    @property
    def has_ellipsis(self) -> bool:
        return any("." in term for term in (*self.inputs, self.output))

    def text(self) -> str:
        def show(term):
            return "".join("..." if c == "." else c for c in term)

        return ",".join(show(t) for t in self.inputs) + "->" + show(self.output)


def _letters(term: str) -> tuple[str, ...] | None:
    if "..." in term:
        head, _, tail = term.partition("...")
        if head or "." in tail:
            return None  # only a leading ellipsis
        term = "." + tail
    if not re.fullmatch(r"\.?[A-Za-z]*", term):
        return None
    return tuple(term)


# -- shapes --------------------------------------------------------------------------------


def broadcast(first, second):
    """The broadcast of two shapes (right-aligned); None when either rank is unknown."""
    if first is None or second is None:
        return None
    n = max(len(first), len(second))
    a = (None,) * (n - len(first)) + tuple(first) if len(first) < n else tuple(first)
    b = (None,) * (n - len(second)) + tuple(second) if len(second) < n else tuple(second)
    pad_a, pad_b = n - len(first), n - len(second)
    dims = []
    for i, (x, y) in enumerate(zip(a, b)):
        if i < pad_a:
            dims.append(y)
        elif i < pad_b:
            dims.append(x)
        elif x == y or y == "1":
            dims.append(x)
        elif x == "1":
            dims.append(y)
        else:
            dims.append(None)
    return tuple(dims)


def normalize_dim(dim: int, rank: int) -> int | None:
    """`dim` as a position in [0, rank), or None when out of range."""
    if -rank <= dim < rank:
        return dim % rank
    return None


class Layouts:
    """Shapes of expressions in one file, computed on demand and cached."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.index = context.index
        self.names = context.names
        self._cache: dict[int, object] = {}
        self._busy: set[int] = set()

    # -- public ----------------------------------------------------------------------

    def shape(self, expr: cst.BaseExpression, depth: int = 0):
        """The shape of `expr` (see the module docstring), or None."""
        key = id(expr)
        if key in self._cache:
            return self._cache[key]
        if key in self._busy or depth > MAX_DEPTH:
            return None
        self._busy.add(key)
        try:
            found = self._shape(expr, depth + 1)
        finally:
            self._busy.discard(key)
        if expr in self.index:
            self._cache[key] = found
        return found

    def rank(self, expr: cst.BaseExpression) -> int | None:
        shape = self.shape(expr)
        return None if shape is None else len(shape)

    def rank_key(self, expr: cst.BaseExpression, depth: int = 0):
        """The rank of `expr`, or when it is not known, (code, delta): the rank of the
        tensor `code` (a parameter, say) plus delta. Two expressions with equal keys have
        equal ranks; None when neither can be told."""
        rank = self.rank(expr)
        if rank is not None:
            return rank
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.Name):
            return self._name_rank_key(expr, depth)
        if isinstance(expr, cst.Call):
            return self._call_rank_key(expr, depth)
        if isinstance(expr, cst.UnaryOperation):
            return self.rank_key(expr.expression, depth + 1)
        if isinstance(expr, cst.BinaryOperation) and not isinstance(expr.operator, cst.MatrixMultiply):
            return self._elementwise_rank_key(expr, depth)
        if isinstance(expr, cst.Subscript):
            return self._subscript_rank_key(expr, depth)
        return None

    def _name_rank_key(self, name: cst.Name, depth: int):
        """The key of the one value bound to `name`; (name, 0) for a parameter."""
        value = self._single_value(name) if name in self.index else None
        if isinstance(value, cst.BaseExpression):
            return self.rank_key(value, depth + 1)
        if value is None and name in self.index:
            binding = self._reaching(name)
            if binding is not None and isinstance(
                self.context.bindings.statement(binding), (cst.Param, cst.Parameters)
            ):
                return (name.value, 0)
        return None

    def _call_rank_key(self, call: cst.Call, depth: int):
        """The key of what keeps its tensor's rank (elementwise, reordering, a module of the
        same or the last dim's shape), or moves it by one (`unsqueeze`, `squeeze` of a dim)."""
        func = call.func
        names = self.names.of(func)
        values = _positional_values(call)
        if names & SAME_SHAPE_FUNCTIONS and values:
            return self.rank_key(values[0], depth + 1)
        if isinstance(func, cst.Attribute) and not names:
            method = func.attr.value
            if method in SAME_SHAPE_METHODS or method in REORDERING_METHODS:
                return self.rank_key(func.value, depth + 1)
            if method in ("unsqueeze", "squeeze") and len(values) == 1:
                inner = self.rank_key(func.value, depth + 1)
                return _shifted(inner, 1 if method == "unsqueeze" else -1)
        module = self.context.kinds.attribute_value(func) if isinstance(func, cst.Attribute) else None
        if isinstance(module, cst.Call) and len(values) == 1 and self.names.of(module.func) & RANK_KEEPING_MODULES:
            return self.rank_key(values[0], depth + 1)
        return None

    def _elementwise_rank_key(self, operation: cst.BinaryOperation, depth: int):
        """The key of the tensor operand (with a number), or of both when they agree."""
        left, right = self.rank_key(operation.left, depth + 1), self.rank_key(operation.right, depth + 1)
        if self.is_number(operation.left):
            return right
        if self.is_number(operation.right):
            return left
        return left if left == right else None

    def _subscript_rank_key(self, subscript: cst.Subscript, depth: int):
        """`x[i]` takes a dim of x's key away, `x[None]` adds one, a slice keeps its own."""
        inner = self.rank_key(subscript.value, depth + 1)
        if not isinstance(inner, tuple) or any(_is_ellipsis(e) for e in subscript.slice):
            return None
        indexed = [e for e in subscript.slice if isinstance(e.slice, cst.Index)]
        added = sum(1 for e in indexed if _is_none(e))
        return _shifted(inner, added - (len(indexed) - added))

    def steps_dim(self, expr: cst.BaseExpression, depth: int = 0) -> int | None:
        """The dim of `expr` that runs over a sequence's steps, where the code proves which:
        the output of a recurrent layer (`out, h = self.rnn(x)`, `self.rnn(x)[0]`: dim 0 in
        `nn.LSTM`'s default layout (T, B, H), dim 1 with `batch_first=True`), followed through
        names and what keeps the leading dims (a layer on the last dims such as `nn.Linear`,
        elementwise math with numbers, casts, a softmax along a dim, the `forward` of a model
        class of this file, a function or method of this file that returns it); None where
        nothing proves it."""
        if depth > MAX_DEPTH or expr not in self.index:
            return None
        if isinstance(expr, cst.Name):
            value = self._single_value(expr)
            if isinstance(value, tuple) and value[1] == 0 and self._stepping_output(value[0]) is not None:
                return self._stepping_output(value[0])  # `out, h = rnn(x)`
            value = self.value_of(expr)  # also an item of a tuple written out: `a, b = f(x), g(y)`
            return self.steps_dim(value, depth + 1) if value is not None else None
        if isinstance(expr, cst.Subscript):  # `rnn(x)[0]`
            if len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
                if integer_value(expr.slice[0].slice.value) == 0:
                    return self._stepping_output(expr.value)
            return None
        if isinstance(expr, cst.UnaryOperation):
            return self.steps_dim(expr.expression, depth + 1)
        if isinstance(expr, cst.BinaryOperation) and not isinstance(expr.operator, cst.MatrixMultiply):
            if self.is_number(expr.left):
                return self.steps_dim(expr.right, depth + 1)
            if self.is_number(expr.right):
                return self.steps_dim(expr.left, depth + 1)
            left = self.steps_dim(expr.left, depth + 1)
            return left if left is not None and left == self.steps_dim(expr.right, depth + 1) else None
        if isinstance(expr, cst.Call) and not any(a.star for a in expr.args):
            return self._call_steps_dim(expr, depth)
        return None

    def _call_steps_dim(self, call: cst.Call, depth: int) -> int | None:
        func = call.func
        names = self.names.of(func) if _dotted(func) else set()
        first = call.args[0].value if call.args and call.args[0].keyword is None else None
        if names & SAME_SHAPE_FUNCTIONS:
            return self.steps_dim(first, depth + 1) if first is not None else None
        if isinstance(func, cst.Attribute) and not names and func.attr.value in SAME_SHAPE_METHODS:
            if func.attr.value in _BINARY_METHODS and first is not None and not self.is_number(first):
                return None  # `out.mul(w)`: a `w` of more dims would move the steps
            return self.steps_dim(func.value, depth + 1)
        function = self.function_of(call) or self._forward_of(func)
        if function is not None:
            from codemod.analysis.bindings import returned_values

            found = {self.steps_dim(value, depth + 1) for value in returned_values(function)}
            return found.pop() if len(found) == 1 else None
        module = self._module_value(func)
        if (
            isinstance(module, cst.Call)
            and self.names.of(module.func) & RANK_KEEPING_MODULES
            and len(call.args) == 1
            and first is not None
        ):
            return self.steps_dim(first, depth + 1)  # `self.head(out)`: the last dim its own
        return None

    def _stepping_output(self, call: cst.BaseExpression) -> int | None:
        """The dim of the steps of what a recurrent layer's call returns first, or None."""
        module = self._module_value(call.func) if isinstance(call, cst.Call) else None
        names = self.names.of(module.func) if isinstance(module, cst.Call) else set()
        layer = next((STEPPING_LAYERS[n] for n in sorted(names) if n in STEPPING_LAYERS), None)
        if layer is None or any(a.star for a in module.args):
            return None
        keyword = kwarg(module, layer.batch_first)
        layer_name = layer.name.rsplit(".", 1)[1]
        position = [name for name, _ in NN_LAYER_ARGUMENTS[layer_name]].index(layer.batch_first)
        given = keyword.value if keyword is not None else positional(module, position)
        given = given.value if isinstance(given, cst.Arg) else given
        if given is None:
            return layer.steps_dim
        flag = given.value if isinstance(given, cst.Name) and given.value in ("True", "False") else None
        return {"True": 1, "False": layer.steps_dim}.get(flag)

    def _module_value(self, func: cst.BaseExpression) -> cst.BaseExpression | None:
        """What builds the module `func` names, before the module methods that return it
        (`nn.LSTM(8, 8)` of `nn.LSTM(8, 8).to(device)`)."""
        value = self._module_binding(func)
        return module_of_chain(value) if value is not None else None

    def _module_binding(self, func: cst.BaseExpression) -> cst.BaseExpression | None:
        """What is assigned to the module `func` names: `self.rnn` (in `__init__`) or a name."""
        if isinstance(func, cst.Attribute):
            return self.context.kinds.attribute_value(func)
        if isinstance(func, cst.Name) and func in self.index:
            return self.value_of(func)
        return None

    def _forward_of(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
        """The `forward` a call of an instance of a model class of this file runs (`model(x)`
        for `model = Net().to(device)`)."""
        value = self._module_binding(func)
        module, called = chain_of_module_methods(value) if value is not None else (None, frozenset())
        if not isinstance(module, cst.Call) or not isinstance(module.func, cst.Name):
            return None
        classdef = self.context.kinds.local_class(module.func)
        if classdef is None or any(local_calls(self.context).method(classdef, name) for name in called):
            return None  # a class's own `to()` may return something else
        return local_calls(self.context).method(classdef, "forward")

    def size(self, expr: cst.BaseExpression) -> str | None:
        """The canonical code of a size expression: `x.size(1)`, `x.shape[1]` and a
        name bound once to either are the code of x's dim 1 when it is known."""
        return self._size(expr, 0)

    def leading_size(self, expr: cst.BaseExpression):
        """The canonical code of dim 0 of `expr`; for a parameter without a known shape,
        the literal size every call of its function passes (`fit(X)` after
        `X = torch.randn(1000, 48)` gives "1000"), else None."""
        shape = self.shape(expr)
        if shape:
            return shape[0]
        if not isinstance(expr, cst.Name) or expr not in self.index:
            return None
        binding = self._reaching(expr)
        if not isinstance(binding, cst.Param):
            return None
        sizes = set()
        for source in self.context.kinds.value_sources(expr):
            found = _literal_dims(self.shape(source)) if source is not None else None
            if not found or found[0] is None:
                return None
            sizes.add(found[0])
        return sizes.pop() if len(sizes) == 1 else None

    def same_size(self, first: cst.BaseExpression | str | None, second: cst.BaseExpression | str | None) -> bool:
        a = first if isinstance(first, str) or first is None else self.size(first)
        b = second if isinstance(second, str) or second is None else self.size(second)
        return a is not None and a == b

    def is_number(self, expr: cst.BaseExpression) -> bool:
        """Provably a Python int or float (not a tensor): the one number question
        (`Values.number`), or a name the code gives as a size to `view` / `reshape` / a
        factory (which take only ints)."""
        if values(self.context).number(expr) is not None:
            return True
        return isinstance(expr, cst.Name) and expr in self.index and self._used_as_size(expr)

    def _used_as_size(self, name: cst.Name) -> bool:
        """Is the name given, in its scope, as a size to `view` / `reshape` / a factory (which
        take only ints, so the code proves it is one)?"""
        for node in self._same_value_reads(name):
            arg = self.context.parents.get(node)
            call = self.context.parents.get(arg)
            if not (isinstance(arg, cst.Arg) and arg.keyword is None and isinstance(call, cst.Call)):
                continue
            method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
            sized = method in RESHAPING_METHODS | NEW_FACTORY_METHODS - FILLED_METHODS or self.names.is_(
                call.func, *SHAPED_FACTORIES
            )
            if sized:
                return True
        return False

    def _same_value_reads(self, name: cst.Name) -> list[cst.Name]:
        """The reads of the one binding that reaches `name` that only it reaches
        (`Kinds.reached_reads`): the same value under the same name."""
        binding = self._single_binding(name)
        if binding is None:
            return []
        return [
            read
            for read in self.context.kinds.reached_reads(binding)
            if read in self.index and self._reaching(read) is binding.node
        ]

    # -- sizes -----------------------------------------------------------------------

    def _size(self, expr, depth: int) -> str | None:
        code = self.context.module.code_for_node
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.Integer):
            return str(integer_value(expr))  # `0x4` is the size 4
        dim_of = _dim_read(expr)
        if dim_of is not None:
            tensor, dim = dim_of
            shape = self.shape(tensor)
            position = normalize_dim(dim, len(shape)) if shape is not None else None
            if position is not None and shape[position] is not None:
                return shape[position]
            if shape is not None and position is not None:
                return f"{code(tensor)}.shape[{position}]"
            return f"{code(tensor)}.shape[{dim}]"
        if isinstance(expr, cst.Name) and expr in self.index:
            value = self._single_value(expr)
            if value is not None and not isinstance(value, tuple):
                inner = self._size(value, depth + 1)
                if inner is not None:
                    return inner
            unpacked = self._unpacked_size(expr, depth)
            if unpacked is not None:
                return unpacked
        return code(expr) if isinstance(expr, (cst.Name, cst.Attribute, cst.BinaryOperation)) else None

    def _unpacked_size(self, name: cst.Name, depth: int) -> str | None:
        """For `B, T, C = x.shape`: T is x's dim 1."""
        unpacked = self._single_value(name)
        tensor = _shape_read(unpacked[0]) if isinstance(unpacked, tuple) else None
        if tensor is None:
            return None
        position = unpacked[1]
        shape = self.shape(tensor, depth + 1)
        if (
            shape is not None
            and position < len(shape)
            and shape[position] is not None
            and shape[position] != name.value
        ):
            return shape[position]
        return None

    # -- shapes ----------------------------------------------------------------------

    def _shape(self, expr, depth: int):
        if isinstance(expr, (cst.Integer, cst.Float)) or self.is_number(expr):
            return ()
        if isinstance(expr, cst.Name):
            return self._name_shape(expr, depth)
        if isinstance(expr, cst.Attribute):
            return self._attribute_shape(expr, depth)
        if isinstance(expr, cst.Subscript):
            return self._subscript_shape(expr, depth)
        if isinstance(expr, cst.UnaryOperation):
            return self.shape(expr.expression, depth)
        if isinstance(expr, cst.BinaryOperation):
            if isinstance(expr.operator, cst.MatrixMultiply):
                return matmul_shape(self.shape(expr.left, depth), self.shape(expr.right, depth))
            return broadcast(self.shape(expr.left, depth), self.shape(expr.right, depth))
        if isinstance(expr, cst.Call):
            return self._call_shape(expr, depth)
        return None

    def _name_shape(self, name: cst.Name, depth: int):
        if name not in self.index:
            return None
        value = self._single_value(name)
        found = None
        if isinstance(value, tuple):
            found = self._element_shape(*value, depth)
        elif value is not None:
            found = self.shape(value, depth)
            if found is not None and self._other_function(name, value):
                found = _literal_dims(found)
        if found is None:
            found = self._read_shape(name)
        return found

    def _read_shape(self, name: cst.Name):
        """`B, T, C = x.shape` / `x.size()` in the same function proves x's shape."""
        for node in self._same_value_reads(name):
            holder = self.index.first_enclosing(node, cst.Assign)
            if node is name or holder is None or _shape_read(holder.value) is not node:
                continue
            targets = holder.targets[0].target if len(holder.targets) == 1 else None
            if isinstance(targets, (cst.Tuple, cst.List)) and not any(
                isinstance(e, cst.StarredElement) for e in targets.elements
            ):
                return tuple(
                    e.value.value if isinstance(e.value, cst.Name) and e.value.value != "_" else None
                    for e in targets.elements
                )
        return None

    def _attribute_shape(self, expr: cst.Attribute, depth: int):
        attr = expr.attr.value
        if attr in ("mT", "mH"):
            shape = self.shape(expr.value, depth)
            return None if shape is None or len(shape) < 2 else (*shape[:-2], shape[-1], shape[-2])
        if attr in ("T",):
            shape = self.shape(expr.value, depth)
            return None if shape is None else tuple(reversed(shape))
        if attr in ("data", "real"):
            return self.shape(expr.value, depth)
        value = self.context.kinds.attribute_value(expr)
        if value is not None:
            found = self.shape(value, depth)
            return _literal_dims(found) if found is not None else None
        return None

    def _subscript_shape(self, expr: cst.Subscript, depth: int):
        shape = self.shape(expr.value, depth)
        if shape is None:
            return None
        return index_shape(shape, expr.slice, self.context.module.code_for_node)

    def _call_shape(self, call: cst.Call, depth: int):
        if any(a.star for a in call.args):
            return None
        func = call.func
        name = next((q for q in sorted(self.names.of(func)) if q.startswith("torch.")), None) if _dotted(func) else None
        if name is not None:
            return self._torch_shape(call, name, depth)
        if isinstance(func, cst.Attribute):
            found = self._method_shape(call, func.attr.value, func.value, depth)
            if found is not _NOT_A_METHOD:
                return found
        return self._module_call_shape(call, depth)

    def _method_shape(self, call: cst.Call, method: str, receiver, depth: int):
        positional_values = [a.value for a in call.args if a.keyword is None]
        if method in SAME_SHAPE_METHODS:
            shape = self.shape(receiver, depth)
            if method in _BINARY_METHODS and shape is not None and positional_values:
                other = self.shape(positional_values[0], depth) if method != "masked_fill" else ()
                return broadcast(shape, other) if other is not None else (shape if method == "masked_fill" else None)
            return shape
        if method in RESHAPING_METHODS:
            return self._reshaped(method, receiver, positional_values, depth)
        if method in REORDERING_METHODS:
            return self._reordered(method, receiver, positional_values, depth)
        if method in SQUEEZING_METHODS:
            return self._squeezed(method, receiver, positional_values, depth)
        if method in NEW_FACTORY_METHODS:
            return self._factory_dims(positional_values[:1] if method in FILLED_METHODS else positional_values, depth)
        if method in REDUCTION_METHODS | NORM_METHODS:
            return self._reduced(call, receiver, method, depth)
        if method in NOT_ONE_TENSOR_METHODS:
            return None
        if method in PRODUCT_METHODS:
            return (
                matmul_shape(self.shape(receiver, depth), self.shape(positional_values[0], depth))
                if positional_values
                else None
            )
        return _NOT_A_METHOD

    def _reshaped(self, method: str, receiver, positional_values: list, depth: int):
        """`view`, `reshape`, `expand`, `repeat`: the sizes they are given."""
        if len(positional_values) == 1 and isinstance(positional_values[0], (cst.Tuple, cst.List)):
            positional_values = [e.value for e in positional_values[0].elements]
        elif len(positional_values) == 1:
            inner = self._sizes_of(positional_values[0], depth)
            if inner is not None:
                return inner
            if integer_value(positional_values[0]) is None:
                return None
        dims = []
        base = self.shape(receiver, depth) if method in ("expand", "repeat") else None
        for i, value in enumerate(positional_values):
            number = integer_value(value)
            if number == -1:
                if method == "expand" and base is not None and len(base) == len(positional_values):
                    dims.append(base[i])
                else:
                    dims.append(None)
            else:
                dims.append(str(number) if number is not None else self._dim_code(value, depth))
        if method == "repeat":
            base = self.shape(receiver, depth)
            if base is not None and len(base) > len(dims):
                return tuple(None for _ in base)
            if base is None:
                return None
            # a dim repeated once keeps its size (leading new dims take their factor)
            kept = (None,) * (len(dims) - len(base)) + tuple(base)
            return tuple(d if factor == "1" else None for d, factor in zip(kept, dims))
        return tuple(dims)

    def _reordered(self, method: str, receiver, positional_values: list, depth: int):
        """`transpose`, `permute`, `movedim`: the same dims in another order."""
        if method in ("transpose", "swapaxes", "swapdims"):
            shape = self.shape(receiver, depth)
            dims = [integer_value(v) for v in positional_values]
            if shape is None or len(dims) != 2 or None in dims:
                return None
            a, b = (normalize_dim(d, len(shape)) for d in dims)
            if a is None or b is None:
                return None
            new = list(shape)
            new[a], new[b] = new[b], new[a]
            return tuple(new)
        if method == "permute":
            if len(positional_values) == 1 and isinstance(positional_values[0], (cst.Tuple, cst.List)):
                positional_values = [e.value for e in positional_values[0].elements]
            shape = self.shape(receiver, depth)
            dims = [integer_value(v) for v in positional_values]
            if None in dims:
                return None
            if shape is None:
                return tuple(None for _ in dims)
            if len(dims) != len(shape):
                return None
            order = [normalize_dim(d, len(shape)) for d in dims]
            return None if None in order else tuple(shape[i] for i in order)
        # movedim
        shape = self.shape(receiver, depth)
        dims = [integer_value(v) for v in positional_values]
        if shape is None or len(dims) != 2 or None in dims:
            return None
        source, destination = (normalize_dim(d, len(shape)) for d in dims)
        if source is None or destination is None:
            return None
        new = list(shape)
        moved = new.pop(source)
        new.insert(destination, moved)
        return tuple(new)

    def _squeezed(self, method: str, receiver, positional_values: list, depth: int):
        """`unsqueeze`, `squeeze`, `flatten`, `unflatten`: dims of size 1 or merged, added or taken."""
        return _SQUEEZES[method](self, receiver, positional_values, depth)

    def _unsqueezed(self, receiver, positional_values: list, depth: int):
        """`unsqueeze(dim)`: a dim of size 1 inserted."""
        shape = self.shape(receiver, depth)
        dim = integer_value(positional_values[0]) if positional_values else None
        if shape is None or dim is None:
            return None
        position = normalize_dim(dim, len(shape) + 1)
        return None if position is None else (*shape[:position], "1", *shape[position:])

    def _squeezed_dim(self, receiver, positional_values: list, depth: int):
        """`squeeze(dim)`: the dim taken, where it is known to have size 1."""
        shape = self.shape(receiver, depth)
        dim = integer_value(positional_values[0]) if positional_values else None
        if shape is None or dim is None:
            return None
        position = normalize_dim(dim, len(shape))
        if position is None:
            return None
        return (*shape[:position], *shape[position + 1 :]) if shape[position] == "1" else None

    def _flattened(self, receiver, positional_values: list, depth: int):
        """`flatten(start=0, end=-1)`: the dims from start to end merged into one."""
        shape = self.shape(receiver, depth)
        start = integer_value(positional_values[0]) if positional_values else 0
        end = integer_value(positional_values[1]) if len(positional_values) > 1 else -1
        if shape is None or start is None or end is None:
            return None
        a, b = normalize_dim(start, len(shape)) if shape else 0, normalize_dim(end, len(shape)) if shape else 0
        if a is None or b is None or b < a:
            return None
        merged = shape[a] if a == b else None
        return (*shape[:a], merged, *shape[b + 1 :])

    def _unflattened(self, receiver, positional_values: list, depth: int):
        """`unflatten(dim, sizes)`: the dim split into the sizes."""
        shape = self.shape(receiver, depth)
        dim = integer_value(positional_values[0]) if positional_values else None
        sizes = positional_values[1] if len(positional_values) > 1 else None
        if shape is None or dim is None or not isinstance(sizes, (cst.Tuple, cst.List)):
            return None
        position = normalize_dim(dim, len(shape))
        if position is None:
            return None
        new = tuple(None if integer_value(e.value) == -1 else self._dim_code(e.value, depth) for e in sizes.elements)
        return (*shape[:position], *new, *shape[position + 1 :])

    def _reduced(self, call: cst.Call, receiver, method: str, depth: int):
        shape = self.shape(receiver, depth)
        dim_arg = positional(call, 1 if method in NORM_METHODS else 0) or kwarg(call, "dim")
        keep = kwarg(call, "keepdim")
        keepdim = keep is not None and isinstance(keep.value, cst.Name) and keep.value.value == "True"
        if keep is not None and not (isinstance(keep.value, cst.Name) and keep.value.value in ("True", "False")):
            return None
        if shape is None or dim_arg is None:
            return () if shape is not None and dim_arg is None else None
        values = (
            [e.value for e in dim_arg.value.elements]
            if isinstance(dim_arg.value, (cst.Tuple, cst.List))
            else [dim_arg.value]
        )
        dims = [integer_value(v) for v in values]
        if None in dims:
            return None
        positions = {normalize_dim(d, len(shape)) for d in dims}
        if None in positions:
            return None
        if keepdim:
            return tuple("1" if i in positions else d for i, d in enumerate(shape))
        return tuple(d for i, d in enumerate(shape) if i not in positions)

    def _torch_shape(self, call: cst.Call, name: str, depth: int):
        """The shape of what the torch function `name` returns, by the rule its entry in the
        torch table gives (`_TORCH_SHAPES`); None for a function without one."""
        shape_of = _TORCH_SHAPES.get(name)
        return shape_of(self, call, name, depth) if shape_of is not None else None

    def _first_argument_shape(self, call: cst.Call, name: str, depth: int):
        """`torch.exp(x)`, `zeros_like(x)`, `nn.Parameter(x)`: the shape of x."""
        arguments = _positional_values(call)
        return self.shape(arguments[0], depth) if arguments else None

    def _new_shape(self, call: cst.Call, name: str, depth: int):
        """`zeros(B, T)`, `zeros((B, T))`, `zeros(x.shape)`, `zeros(size=(B, T))`."""
        return self._factory_dims(_size_arguments(call, _positional_values(call)), depth)

    def _filled_shape(self, call: cst.Call, name: str, depth: int):
        """`full((B, T), value)`: the sizes first."""
        return self._factory_dims(_size_arguments(call, _positional_values(call)[:1]), depth)

    def _bounded_shape(self, call: cst.Call, name: str, depth: int):
        """`randint(high, size)`, `randint(low, high, size)`: the size is a tuple, last."""
        arguments = _positional_values(call)
        size = kwarg(call, "size")
        value = size.value if size is not None else (arguments[-1] if arguments else None)
        return self._factory_dims([value], depth) if isinstance(value, (cst.Tuple, cst.List)) else None

    def _total_norm_shape(self, call: cst.Call, name: str, depth: int):
        """`clip_grad_norm_(parameters, 1.0)`: the total norm, one number."""
        return ()

    def _functional_loss_shape(self, call: cst.Call, name: str, depth: int):
        """A functional loss reduced to a mean or a sum (the default unless `reduction=`
        says otherwise): one number."""
        reduction = kwarg(call, "reduction")
        if reduction is None:
            return () if OPS[name].loss.reduction != "none" else None
        written = reduction.value
        if isinstance(written, cst.SimpleString) and written.evaluated_value in ("mean", "sum"):
            return ()
        return None

    def _product_shape(self, call: cst.Call, name: str, depth: int):
        """`torch.matmul(a, b)`: a's leading dims (broadcast), a's rows, b's columns."""
        arguments = _positional_values(call)
        if len(arguments) != 2:
            return None
        return matmul_shape(self.shape(arguments[0], depth), self.shape(arguments[1], depth))

    def _method_form_shape(self, call: cst.Call, name: str, depth: int):
        """`torch.transpose(x, 1, 2)`: the shape of `x.transpose(1, 2)`."""
        arguments = _positional_values(call)
        if not arguments:
            return None
        method = name.rsplit(".", 1)[1]
        as_method = call.with_changes(
            func=cst.Attribute(arguments[0], cst.Name(method)),
            args=[a for a in call.args if a.value is not arguments[0]],
        )
        found = self._method_shape(as_method, method, arguments[0], depth)
        return None if found is _NOT_A_METHOD else found

    def _literal_tensor_shape(self, call: cst.Call, name: str, depth: int):
        """`torch.tensor([[1, 2], [3, 4]])`: the nesting of the literal it is given."""
        arguments = _positional_values(call)
        return _literal_shape(arguments[0]) if arguments else None

    def _stacked_call_shape(self, call: cst.Call, name: str, depth: int):
        """`torch.stack([...])` of one comprehension (see `_stacked_shape`)."""
        arguments = _positional_values(call)
        if len(call.args) == 1 and arguments and isinstance(arguments[0], cst.ListComp):
            return self._stacked_shape(arguments[0], depth)
        return None

    def _where_shape(self, call: cst.Call, name: str, depth: int):
        """`torch.where(condition, a, b)`: the three broadcast."""
        shapes = [self.shape(v, depth) for v in _positional_values(call)]
        if len(shapes) != 3:
            return None
        return broadcast(broadcast(shapes[0], shapes[1]), shapes[2])

    def _outer_shape(self, call: cst.Call, name: str, depth: int):
        """`torch.outer(a, b)` of two vectors: (a's size, b's size)."""
        shapes = [self.shape(v, depth) for v in _positional_values(call)]
        if len(shapes) == 2 and all(s is not None and len(s) == 1 for s in shapes):
            return (shapes[0][0], shapes[1][0])
        return None

    def _steps_shape(self, call: cst.Call, name: str, depth: int):
        """`linspace(start, end, steps)`: one dim of `steps`."""
        arguments = _positional_values(call)
        steps = kwarg(call, "steps")
        steps_value = steps.value if steps is not None else (arguments[2] if len(arguments) > 2 else None)
        return (self._dim_code(steps_value, depth),) if steps_value is not None else (None,)

    def _range_shape(self, call: cst.Call, name: str, depth: int):
        """`torch.arange(...)`: one dim."""
        return (None,)

    def _joined_shape(self, call: cst.Call, name: str, depth: int):
        """`torch.cat([a, b], dim)` (see `_concatenated`)."""
        arguments = _positional_values(call)
        return self._concatenated(call, arguments[0], depth) if arguments else None

    def _concatenated(self, call: cst.Call, tensors, depth: int):
        """`torch.cat([a, b], dim=k)`: the operands' dims, but dim k, which sums theirs."""
        if not isinstance(tensors, (cst.List, cst.Tuple)) or not tensors.elements:
            return None
        if any(not isinstance(e, cst.Element) for e in tensors.elements):
            return None
        shapes = [self.shape(e.value, depth) for e in tensors.elements]
        if any(shape is None for shape in shapes) or len({len(shape) for shape in shapes}) != 1 or not shapes[0]:
            return None
        dim_arg = kwarg(call, "dim") or kwarg(call, "axis")
        values = [a.value for a in call.args if a.keyword is None]
        dim = integer_value(dim_arg.value if dim_arg is not None else (values[1] if len(values) > 1 else None))
        position = normalize_dim(dim if dim is not None else 0, len(shapes[0])) if (dim_arg or len(values) > 1) else 0
        if position is None or (dim is None and (dim_arg or len(values) > 1)):
            return None
        dims = []
        for index in range(len(shapes[0])):
            if index == position:
                dims.append(shapes[0][index] if len(shapes) == 1 else None)
                continue
            sizes = {shape[index] for shape in shapes}
            dims.append(sizes.pop() if len(sizes) == 1 else None)
        return tuple(dims)

    def _einsum_shape(self, call: cst.Call, name: str, depth: int):
        """`torch.einsum("bhtd,bhsd->bhts", q, k)`: the sizes of the output's letters."""
        values = [a.value for a in call.args]
        if not values or not isinstance(values[0], cst.SimpleString):
            return None
        spec = Spec.parse(values[0].evaluated_value)
        operands = values[1:]
        if spec is None or len(operands) != len(spec.inputs):
            return None
        sizes: dict[str, str | None] = {}
        batch = None
        for letters, operand in zip(spec.inputs, operands):
            shape = self.shape(operand, depth)
            named = [c for c in letters if c != "."]
            if shape is None:
                continue
            if "." in letters:
                batch = (
                    broadcast(batch, shape[: len(shape) - len(named)])
                    if batch is not None
                    else shape[: len(shape) - len(named)]
                )
                shape = shape[len(shape) - len(named) :]
            elif len(shape) != len(named):
                return None
            for c, d in zip(named, shape):
                if sizes.get(c) is None or d is not None and sizes[c] == "1":
                    sizes[c] = d
        out = []
        for c in spec.output:
            if c == ".":
                if batch is None:
                    return None
                out.extend(batch)
            else:
                out.append(sizes.get(c))
        return tuple(out)

    def _module_call_shape(self, call: cst.Call, depth: int):
        """`self.proj(x)` / `proj(x)` for modules whose effect on the shape is known, and calls of
        this file's functions whose every return has one rank (literal sizes kept)."""
        func = call.func
        function = self.context.bindings.local_function(func) if isinstance(func, cst.Name) else None
        if function is not None:
            from codemod.analysis.bindings import returned_values

            shapes = [self.shape(value, depth) for value in returned_values(function)]
            if shapes and all(s is not None for s in shapes) and len({len(s) for s in shapes}) == 1:
                literal = [_literal_dims(s) for s in shapes]
                return literal[0] if all(s == literal[0] for s in literal) else tuple(None for _ in literal[0])
            return None
        module = (
            self.context.kinds.attribute_value(func)
            if isinstance(func, cst.Attribute)
            else (self._single_value(func) if isinstance(func, cst.Name) else None)
        )
        if not isinstance(module, cst.Call) or len(call.args) != 1 or call.args[0].keyword is not None:
            return None
        kinds = self.names.of(module.func)
        input_shape = self.shape(call.args[0].value, depth)
        if input_shape is None:
            return None
        if kinds & SAME_SHAPE_MODULES:
            return input_shape
        if kinds & LAST_DIM_MODULES:  # `nn.Linear`: the last dim's size its own
            return (*input_shape[:-1], None) if input_shape else None
        if kinds & {"torch.nn.Embedding", "torch.nn.modules.sparse.Embedding"}:
            return (*input_shape, None)
        return None

    def _factory_dims(self, values, depth: int):
        if len(values) == 1:
            sizes = self._sizes_of(values[0], depth)
            if sizes is not None:
                return sizes
            if _shape_read(values[0]) is not None:
                return None  # the sizes of a tensor whose shape is not known: not one dim
            if isinstance(values[0], (cst.Tuple, cst.List)):
                values = [e.value for e in values[0].elements]
        return tuple(self._dim_code(v, depth) for v in values)

    def _sizes_of(self, expr, depth: int):
        """The dims a size argument spells: `x.shape`, `x.size()`, `(B, T)`."""
        tensor = _shape_read(expr)
        if tensor is not None:
            return self.shape(tensor, depth)
        if isinstance(expr, (cst.Tuple, cst.List)):
            return tuple(self._dim_code(e.value, depth) for e in expr.elements)
        return None

    def _stacked_shape(self, items: cst.ListComp, depth: int):
        """`torch.stack([x[i] for i in range(n)])`: n items of the item's shape."""
        loop = items.for_in
        if loop.inner_for_in is not None or loop.ifs or loop.asynchronous is not None:
            return None
        counted = loop.iter
        if not (
            isinstance(counted, cst.Call)
            and self.names.is_(counted.func, "builtins.range", "range")
            and len(counted.args) == 1
            and not counted.args[0].star
        ):
            return None
        item = self.shape(items.elt, depth)
        return None if item is None else (self._dim_code(counted.args[0].value, depth), *item)

    def _dim_code(self, expr, depth: int) -> str | None:
        number = integer_value(expr)
        if number is not None:
            return str(number)
        return self._size(expr, depth + 1)

    def _element_shape(self, value, position: int, how: str, depth: int):
        """The shape of element `position` of `value` taken apart by `how` ("unpack":
        iterating over dim 0, "split"/"chunk" along a dim, "unbind")."""
        if how == "unpack":
            if isinstance(value, cst.Call) and value.func and isinstance(value.func, cst.Attribute):
                method = value.func.attr.value
                receiver = value.func.value
                args = [a.value for a in value.args if a.keyword is None]
                dim_arg = kwarg(value, "dim")
                if method in ("split", "chunk"):
                    dim = integer_value(dim_arg.value if dim_arg else (args[1] if len(args) > 1 else None)) or 0
                    shape = self.shape(receiver, depth)
                    position = normalize_dim(dim, len(shape)) if shape is not None else None
                    if shape is None or position is None:
                        return None
                    return (*shape[:position], None, *shape[position + 1 :])
                if method == "unbind":
                    dim = integer_value(dim_arg.value if dim_arg else (args[0] if args else None)) or 0
                    shape = self.shape(receiver, depth)
                    position = normalize_dim(dim, len(shape)) if shape is not None else None
                    if shape is None or position is None:
                        return None
                    return (*shape[:position], *shape[position + 1 :])
            if isinstance(value, cst.GeneratorExp) or isinstance(value, cst.ListComp):
                return self.shape(value.elt, depth)
            if isinstance(value, (cst.Tuple, cst.List)) and position < len(value.elements):
                return self.shape(value.elements[position].value, depth)
            shape = self.shape(value, depth)
            return None if shape is None or not shape else tuple(shape[1:])
        return None

    # -- bindings --------------------------------------------------------------------

    def _reaching(self, name: cst.Name) -> cst.CSTNode | None:
        """The binding target of the one binding of `name` that reaches this use
        (`Kinds.reaching`); None when more than one may, or none of this file."""
        binding = self._single_binding(name)
        return binding.node if binding is not None else None

    def _single_binding(self, name: cst.Name) -> Assignment | None:
        reaching = self.context.kinds.reaching(name)
        return reaching[0] if len(reaching) == 1 and type(reaching[0]) is Assignment else None

    def _single_value(self, name: cst.Name):
        """The value of the binding that reaches `name` (`Kinds.reaching`, read by
        `Bindings`): an expression, or (value, position, how) for an element of an
        unpacking, or None."""
        binding = self._single_binding(name)
        if binding is None:
            return None
        bindings = self.context.bindings
        value = bindings.assigned_value(binding)
        if value is not None:
            return value
        unpacked = bindings.unpacked(binding)
        return (*unpacked, "unpack") if unpacked is not None else None

    def value_of(self, name: cst.Name) -> cst.BaseExpression | None:
        """The expression the one reaching assignment gives `name`, or None; for an element of
        an unpacking, the element of the tuple (written, or returned by a function or a method
        of this file)."""
        value = self._single_value(name)
        if isinstance(value, tuple):
            return self.element(*value[:2])
        return value if isinstance(value, cst.BaseExpression) else None

    def element(self, value: cst.BaseExpression, position: int, depth: int = 0) -> cst.BaseExpression | None:
        """Element `position` of the tuple `value` is: a tuple display, or the one tuple a local
        function or `self.<method>()` returns."""
        if depth > 3:
            return None
        if isinstance(value, (cst.Tuple, cst.List)) and not any(
            isinstance(e, cst.StarredElement) for e in value.elements
        ):
            return value.elements[position].value if position < len(value.elements) else None
        if isinstance(value, cst.Call):
            function = self.function_of(value)
            if function is not None:
                from codemod.analysis.bindings import returned_values

                returns = returned_values(function)
                if len(returns) == 1:
                    return self.element(returns[0], position, depth + 1)
        return None

    def function_of(self, call: cst.Call) -> cst.FunctionDef | None:
        """The `def` of this file a call runs: a module-level or nested function, or a method
        called on `self` from another method of its class."""
        func = call.func
        if isinstance(func, cst.Name):
            return self.context.bindings.local_function(func)
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func in self.index:
            method = self.index.first_enclosing(func, cst.FunctionDef)
            classdef = self.index.first_enclosing(method, cst.ClassDef) if method is not None else None
            if classdef is None or not _is_self(func.value, method):
                return None
            found = [
                s for s in classdef.body.body if isinstance(s, cst.FunctionDef) and s.name.value == func.attr.value
            ]
            return found[0] if len(found) == 1 and not found[0].decorators else None
        return None

    def _other_function(self, use: cst.CSTNode, value: cst.CSTNode) -> bool:
        first = self.index.first_enclosing(use, (cst.FunctionDef, cst.Lambda))
        second = self.index.first_enclosing(value, (cst.FunctionDef, cst.Lambda)) if value in self.index else None
        return first is not second


_NOT_A_METHOD = object()

# The dims `unsqueeze`, `squeeze`, `flatten` and `unflatten` (the table's SQUEEZED) insert, take or merge.
_SQUEEZES = {
    "unsqueeze": Layouts._unsqueezed,
    "squeeze": Layouts._squeezed_dim,
    "flatten": Layouts._flattened,
    "unflatten": Layouts._unflattened,
}
# How the shape of a torch function's result follows from its call, by the shape rule or the
# category of its entry in the torch table (and, for the functions without such an entry, by name).
_TORCH_SHAPES = {
    **dict.fromkeys(SAME_SHAPE_FUNCTIONS | LIKE_FACTORIES, Layouts._first_argument_shape),
    **dict.fromkeys(("torch.nn.Parameter", "torch.nn.parameter.Parameter"), Layouts._first_argument_shape),
    **dict.fromkeys(SHAPED_FACTORIES, Layouts._new_shape),
    **dict.fromkeys(FILLED_FACTORIES, Layouts._filled_shape),
    **dict.fromkeys(functions(shape=ShapeRule.BOUNDED), Layouts._bounded_shape),
    **dict.fromkeys(functions(shape=ShapeRule.STEPS), Layouts._steps_shape),
    **dict.fromkeys(PRODUCT_FUNCTIONS, Layouts._product_shape),
    **dict.fromkeys(STACKING_FUNCTIONS, Layouts._stacked_call_shape),
    **dict.fromkeys(JOINING_FUNCTIONS, Layouts._joined_shape),
    # the functions read as the method of their first argument
    **dict.fromkeys(
        functions(shape=ShapeRule.SIZES) | functions(shape=ShapeRule.REORDERED) | functions(shape=ShapeRule.SQUEEZED),
        Layouts._method_form_shape,
    ),
    **dict.fromkeys(("torch.movedim", "torch.sum", "torch.mean"), Layouts._method_form_shape),
    # clipping with a norm given returns nothing
    **{
        name: Layouts._total_norm_shape
        for name in functions(Category.GRAD_NORM)
        if not name.endswith("clip_grads_with_norm_")
    },
    **dict.fromkeys(functions(Category.LOSS, module=False), Layouts._functional_loss_shape),
    **dict.fromkeys(("torch.tensor", "torch.as_tensor"), Layouts._literal_tensor_shape),
    "torch.einsum": Layouts._einsum_shape,
    "torch.where": Layouts._where_shape,
    "torch.outer": Layouts._outer_shape,
    "torch.arange": Layouts._range_shape,
}


def layouts(context: FileContext) -> Layouts:
    return context.shared("tensor_layout.layouts", Layouts)


def _dotted(node) -> bool:
    """`a.b.c` or `a`: a name imports may resolve (not a method of a computed value)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _positional_values(call: cst.Call) -> list[cst.BaseExpression]:
    return [a.value for a in call.args if a.keyword is None]


def _size_arguments(call: cst.Call, positional_sizes: list) -> list:
    """The sizes a factory is given: by position, or as `size=`."""
    size = kwarg(call, "size")
    return [size.value] if size is not None else positional_sizes


def _shifted(key, delta: int):
    if key is None:
        return None
    if isinstance(key, int):
        return key + delta
    return (key[0], key[1] + delta)


def matmul_shape(a, b):
    """The shape of `a @ b` (torch.matmul's rules), None when a rank is unknown."""
    if a is None or b is None or not a or not b:
        return None
    if len(a) == 1 and len(b) == 1:
        return ()
    if len(a) == 1:
        return (*b[:-2], b[-1])
    if len(b) == 1:
        return tuple(a[:-1])
    batch = broadcast(a[:-2], b[:-2])
    return (*batch, a[-2], b[-1])


def index_shape(shape, elements: Sequence[cst.SubscriptElement], code) -> tuple | None:
    """The shape of `x[elements]` for x of `shape`: integers drop a dim, slices keep it
    (full ones keep its size), None adds one, `...` stands for the dims not named."""
    named = sum(1 for e in elements if not _is_none(e) and not _is_ellipsis(e))
    if named > len(shape):
        return None
    out: list[str | None] = []
    position = 0
    for element in elements:
        if _is_ellipsis(element):
            skip = len(shape) - named
            out.extend(shape[position : position + skip])
            position += skip
        elif _is_none(element):
            out.append("1")
        elif isinstance(element.slice, cst.Slice):
            full = element.slice.lower is None and element.slice.upper is None and element.slice.step is None
            out.append(shape[position] if full else None)
            position += 1
        else:
            position += 1  # an integer (or tensor) index: drops the dim
    out.extend(shape[position:])
    return tuple(out)


def _is_none(element: cst.SubscriptElement) -> bool:
    return (
        isinstance(element.slice, cst.Index)
        and isinstance(element.slice.value, cst.Name)
        and element.slice.value.value == "None"
    )


def _is_ellipsis(element: cst.SubscriptElement) -> bool:
    return isinstance(element.slice, cst.Index) and isinstance(element.slice.value, cst.Ellipsis)


def _dim_read(expr) -> tuple[cst.BaseExpression, int] | None:
    """(x, i) for `x.size(i)`, `x.shape[i]`, `x.size()[i]`."""
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "size"
        and len(expr.args) == 1
        and expr.args[0].keyword is None
    ):
        dim = integer_value(expr.args[0].value)
        return (expr.func.value, dim) if dim is not None else None
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        dim = integer_value(expr.slice[0].slice.value)
        tensor = _shape_read(expr.value)
        if dim is not None and tensor is not None:
            return tensor, dim
    return None


def _shape_read(expr) -> cst.BaseExpression | None:
    """x for `x.shape` and `x.size()`."""
    if isinstance(expr, cst.Attribute) and expr.attr.value == "shape":
        return expr.value
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "size"
        and not expr.args
    ):
        return expr.func.value
    return None


def _literal_dims(shape):
    """A shape from another function: its rank and literal sizes only."""
    return None if shape is None else tuple(d if d is not None and d.isdigit() else None for d in shape)


def _literal_shape(expr) -> tuple | None:
    if isinstance(expr, (cst.Integer, cst.Float)) or integer_value(expr) is not None:
        return ()
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.expression, (cst.Integer, cst.Float)):
        return ()
    if isinstance(expr, (cst.List, cst.Tuple)):
        inner = [_literal_shape(e.value) for e in expr.elements]
        if inner and all(s == inner[0] for s in inner) and inner[0] is not None:
            return (str(len(inner)), *inner[0])
    return None

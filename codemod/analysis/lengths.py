"""How long the lists a function of the file returns are, when the code fixes it:
the tokenizer idiom that truncates and pads ids to a length it is given,

    ids = [vocab.get(w, 1) for w in text.split()][:max_len]
    return ids + [0] * (max_len - len(ids))

returns lists of exactly `max_len` elements, whatever the text. A rule that
stacks such lists into one tensor (`torch.tensor([encode(t, n) for t in texts])`)
knows from this that every row has the same length.

The forms read: `x[:n]` is at most `n` long; `a + [c] * (n - len(a))` (or the
padding first) is exactly `n` long when `a` is at most `n`; a local name bound
once is its value. `n` is a parameter the function never binds again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import Assignment

if TYPE_CHECKING:
    from codemod.context import FileContext


class Lengths:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self._returned: dict[int, cst.Param | None] = {}

    def returned_length(self, function: cst.FunctionDef) -> cst.Param | None:
        """The parameter whose value is the length of every list `function` returns;
        None when the code does not fix the length to one parameter."""
        key = id(function)
        if key not in self._returned:
            self._returned[key] = self._compute(function)
        return self._returned[key]

    def _compute(self, function: cst.FunctionDef) -> cst.Param | None:
        returns, yields = self.context.kinds.exits(function)
        if yields or not returns or any(r.value is None for r in returns):
            return None
        found = {self._exactly(r.value, function, 0) for r in returns}
        if len(found) != 1:
            return None
        name = found.pop()
        params = {p.name.value: p for p in function.params.params if p.star in ("", cst.MaybeSentinel.DEFAULT)}
        param = params.get(name) if name is not None else None
        if param is None or not self._only_the_parameter(name, function):
            return None
        return param

    def _only_the_parameter(self, name: str, function: cst.FunctionDef) -> bool:
        """Is `name` bound in `function` only as its parameter?"""
        scope = self.context.scopes.get(function.body)
        if scope is None or name not in scope:
            return False
        return all(isinstance(a, Assignment) and isinstance(a.node, cst.Param) for a in scope.assignments[name])

    def _value(self, expr: cst.BaseExpression, function: cst.FunctionDef) -> cst.BaseExpression:
        """A local name bound once in `function` is its value."""
        if isinstance(expr, cst.Name):
            values = self.context.bindings.values(expr)
            if values and len(values) == 1 and self.context.index.inside(values[0], function):
                return values[0]
        return expr

    def _exactly(self, expr: cst.BaseExpression, function: cst.FunctionDef, depth: int) -> str | None:
        """The name `n` when `expr` is a list of exactly `n` elements."""
        if depth > 4:
            return None
        expr = self._value(expr, function)
        if not (isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add)):
            return None
        for body, padding in ((expr.left, expr.right), (expr.right, expr.left)):
            n = _padding_to(padding, body)
            if n is not None and not self.context.names.is_(_padding_len(padding), "builtins.len"):
                n = None
            if n is not None and self._at_most(body, function, depth + 1) == n:
                return n
        return None

    def _at_most(self, expr: cst.BaseExpression, function: cst.FunctionDef, depth: int) -> str | None:
        """The name `n` when `expr` is a list of at most `n` elements (`x[:n]`)."""
        if depth > 4:
            return None
        expr = self._value(expr, function)
        if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
            part = expr.slice[0].slice
            if (
                isinstance(part, cst.Slice)
                and part.lower is None
                and part.step is None
                and isinstance(part.upper, cst.Name)
            ):
                return part.upper.value
        return self._exactly(expr, function, depth + 1)


def _padding_len(padding: cst.BinaryOperation) -> cst.BaseExpression:
    """The `len` of `[c] * (n - len(a))`, either way round (its shape checked by `_padding_to`)."""
    count = padding.right if isinstance(padding.left, cst.List) else padding.left
    return count.right.func


def _padding_to(padding: cst.BaseExpression, body: cst.BaseExpression) -> str | None:
    """`n` when `padding` is `[c] * (n - len(body))` (either way round), `body` a name."""
    if not (
        isinstance(body, cst.Name)
        and isinstance(padding, cst.BinaryOperation)
        and isinstance(padding.operator, cst.Multiply)
    ):
        return None
    for single, count in ((padding.left, padding.right), (padding.right, padding.left)):
        if not (isinstance(single, cst.List) and len(single.elements) == 1):
            continue
        if (
            isinstance(count, cst.BinaryOperation)
            and isinstance(count.operator, cst.Subtract)
            and isinstance(count.left, cst.Name)
            and isinstance(count.right, cst.Call)
            and isinstance(count.right.func, cst.Name)
            and count.right.func.value == "len"
            and len(count.right.args) == 1
            and isinstance(count.right.args[0].value, cst.Name)
            and count.right.args[0].value.value == body.value
        ):
            return count.left.value
    return None

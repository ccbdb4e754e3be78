"""Which positions of a sequence an index of a loop variable visits, and one expression
for all of them: the positions along the sequence's dim (1, or 0 for a time-major tensor)
that a per-position loop (`for t in range(start, stop): ... x[:, t + 1] ...`) reads,
written as one slice or gather (`x[:, 1:stop + 1]`), so the loop's per-position work can
run once over every position. Each answer takes that dim (`dim`, 1 unless given).

- `affine(index, var)`: (sign, offset) for an index `sign * var + offset` whose offset does
  not read `var` (a number, or an expression), or None;
- `position_slices(context)` (built once per file, FileContext.shared) answers:
  - `sliced(base, sign, offset, start, stop)`: `base[:, a:b]` (or `base` itself, every
    position) for the positions `sign * t + offset` of `t` in `range(start, stop)`, in
    ascending order; None where no slice is shown to be those positions (a first position
    that may be negative, a descending index other than `-t` from 1);
  - `gathered(base, sign, offset, start, stop)`: the same positions as an index with
    `torch.arange` (any affine index, in the loop's order);
  - `is_length(stop, base)`: is `stop` the length of `base`'s dim of positions;
  - `count(start, stop)`, `integer(expr)`, `positive(expr)`, `non_negative(expr)`: the
    numbers the code shows (literals, names bound only to them, sizes and lengths);
  - `scalar(expr)`: a Python number the code shows (a literal, arithmetic of them, a
    name bound only to them, a parameter annotated `int` or `float` or with a number for
    its default): the same for every position, never a tensor that could broadcast
    against one position's slice and not against all of them;
- `is_zero(expr)`; `wrapped(text)`: `text` parenthesized unless it is an atom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.names import integer_literal, integer_value, names_read
from codemod.analysis.torch_facts import SIZE_METHODS
from codemod.analysis.values import values

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "position_slices"


def position_slices(context: FileContext) -> PositionSlices:
    return context.shared(KEY, PositionSlices)


def affine(index: cst.BaseExpression, var: str) -> tuple[int, int | cst.BaseExpression] | None:
    """(sign, offset) for an index `sign * t + offset`, where the offset is a number or
    an expression that does not read `t`."""
    if isinstance(index, cst.Name) and index.value == var:
        return 1, 0
    if m.matches(index, m.UnaryOperation(operator=m.Minus(), expression=m.Name(var))):
        return -1, 0
    if not isinstance(index, cst.BinaryOperation) or not isinstance(index.operator, (cst.Add, cst.Subtract)):
        return None
    plus = isinstance(index.operator, cst.Add)
    left_reads = var in {n.value for n in names_read(index.left)}
    right_reads = var in {n.value for n in names_read(index.right)}
    if left_reads == right_reads:
        return None
    if left_reads:  # `t + X`, `t - X`, `(t + a) + b`
        inner = affine(index.left, var)
        other = index.right
        if inner is None:
            return None
        return inner[0], _combine(inner[1], other, plus)
    if not plus:  # `X - t`
        inner = affine(index.right, var)
        if inner is None:
            return None
        return -inner[0], _combine(index.left, inner[1], False)
    inner = affine(index.right, var)  # `X + t`
    if inner is None:
        return None
    return inner[0], _combine(index.left, inner[1], True)


class PositionSlices:
    """The positions an affine index of a loop variable visits, for one file."""

    def __init__(self, context: FileContext) -> None:
        self.context = context

    def sliced(
        self,
        base_node: cst.BaseExpression,
        sign: int,
        offset: int | cst.BaseExpression,
        start: cst.BaseExpression | None,
        stop: cst.BaseExpression,
        dim: int = 1,
    ) -> str | None:
        """`base[:, p]` for every position p = sign * t + offset of `t` in `range(start, stop)`,
        as one slice in ascending order, or None where no slice is shown to be those."""
        base = cst.Module([]).code_for_node(base_node)
        if sign == 1 and offset == 0 and (start is None or is_zero(start)) and self.is_length(stop, base_node, dim):
            return base  # every position
        if sign == -1:
            return self._negated_positions(base, offset, start, stop, dim)
        if isinstance(offset, cst.BaseExpression) and _is_negated_stop(offset, stop):
            return self._positions_to_end(base, start, stop, dim)
        return self._shifted_positions(base, offset, start, stop, dim)

    def _negated_positions(self, base: str, offset, start, stop, dim: int) -> str | None:
        """-t for t in range(1, K + 1) (or range(1, S)): positions -K ... -1."""
        if offset != 0 or start is None or not _is_integer(start, 1):
            return None
        lead = ":, " * dim
        count, count_node = _minus_one(stop)
        if (count_node is not None and self.positive(count_node)) or (integer_value(stop) or 0) >= 2:
            return f"{base}[{lead}-{wrapped(count)}:]"
        return f"{base}[{lead}{base}.size({dim}) - {wrapped(count)}:]"

    def _positions_to_end(self, base: str, start, stop, dim: int) -> str | None:
        """t - K (or -K + t) for t in range(s, K): positions s - K ... -1."""
        first = integer_value(start) if start is not None else 0
        if first is None:
            return None
        lead = ":, " * dim
        length = wrapped(cst.Module([]).code_for_node(stop))
        count = self.count(start, stop)
        if count is not None and count >= 1:
            return f"{base}[{lead}-{length}:]" if first == 0 else f"{base}[{lead}{first} - {length}:]"
        # K may be 0 (or no more than s): the loop adds nothing, while `[-0:]` is every position
        return f"{base}[{lead}{base}.size({dim}) - {length}{f' + {first}' if first else ''}:]"

    def _shifted_positions(self, base: str, offset, start, stop, dim: int) -> str | None:
        """t + offset for t in range(start, stop): `base[:, start + offset:stop + offset]`,
        when its first position is shown not to be negative."""
        lower = _add(start, offset)
        upper = _add(stop, offset)
        if lower is None or upper is None:
            return None
        lower_text, lower_value = lower
        if lower_value is None:
            first_non_negative = self.non_negative(start) and (
                isinstance(offset, int) and offset >= 0 or self.non_negative(offset)
            )
        else:
            first_non_negative = lower_value >= 0
        if not first_non_negative:
            return None
        return f"{base}[{':, ' * dim}{'' if lower_text == '0' else lower_text}:{upper[0]}]"

    def gathered(
        self,
        base_node: cst.BaseExpression,
        sign: int,
        offset: int | cst.BaseExpression,
        start: cst.BaseExpression | None,
        stop: cst.BaseExpression,
        dim: int = 1,
    ) -> str:
        """`base[:, torch.arange(start, stop, device=base.device) + offset]` (or `offset - arange`)."""
        code = cst.Module([]).code_for_node
        base = code(base_node)
        bounds = ([code(start)] if start is not None else []) + [code(stop)]
        positions = f"torch.arange({', '.join(bounds)}, device={base}.device)"
        offset_text = str(offset) if isinstance(offset, int) else code(offset)
        if sign == 1:
            if offset == 0:
                index = positions
            elif isinstance(offset, int) and offset < 0:
                index = f"{positions} - {-offset}"
            else:
                index = f"{positions} + {wrapped(offset_text)}"
        else:
            index = f"-{positions}" if offset == 0 else f"{wrapped(offset_text)} - {positions}"
        return f"{base}[{':, ' * dim}{index}]"

    def is_length(self, stop: cst.BaseExpression, base: cst.BaseExpression, dim: int = 1) -> bool:
        """Is `stop` the length of `base`'s dimension `dim` (`base.size(1)`, `base.shape[1]`,
        `len(base)` for dim 0, a name bound only to one of those or unpacked from `base.shape`)?"""
        code = cst.Module([]).code_for_node
        text = code(base)
        if code(stop) in (f"{text}.size({dim})", f"{text}.shape[{dim}]", *([f"len({text})"] if dim == 0 else [])):
            return True
        if not isinstance(stop, cst.Name):
            return False
        values = self.context.bindings.values(stop)
        if values:
            return len(values) == 1 and self.is_length(values[0], base, dim)
        assignments = self.context.bindings.assignments(stop)
        if not assignments or len(assignments) != 1:
            return False
        unpacked = self.context.bindings.unpacked(assignments[0])
        if unpacked is None:
            return False
        value, position = unpacked
        return position == dim and code(value) in (f"{text}.shape", f"{text}.size()")

    def count(self, start: cst.BaseExpression | None, stop: cst.BaseExpression) -> int | None:
        """How many positions `range(start, stop)` visits, when both are numbers the code
        shows (literals, or names bound only to literals)."""
        first = 0 if start is None else self.integer(start)
        last = self.integer(stop)
        return None if first is None or last is None else last - first

    def integer(self, expr: cst.BaseExpression) -> int | None:
        value = integer_value(expr)
        if value is not None:
            return value
        if isinstance(expr, cst.Name):
            values = self.context.bindings.values(expr)
            found = {integer_value(v) for v in values or ()}
            if values and len(found) == 1 and None not in found:
                return found.pop()
        return None

    def positive(self, expr: cst.BaseExpression) -> bool:
        value = self.integer(expr)
        return value is not None and value >= 1

    def non_negative(self, expr: cst.BaseExpression | None, depth: int = 0) -> bool:
        """Is `expr` a number, size or length that cannot be negative (sums and products
        of those too, and names bound only to them)?"""
        if expr is None:
            return True
        if depth > 4:
            return False
        value = integer_value(expr)
        if value is not None:
            return value >= 0
        if isinstance(expr, cst.Call):
            if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in SIZE_METHODS:
                return True
            return self.context.names.is_(expr.func, "len", "builtins.len")
        if isinstance(expr, cst.Subscript) and m.matches(expr.value, m.Attribute(attr=m.Name("shape"))):
            return True
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Add, cst.Multiply)):
            return self.non_negative(expr.left, depth + 1) and self.non_negative(expr.right, depth + 1)
        if isinstance(expr, cst.Name):
            values = self.context.bindings.values(expr)
            return bool(values) and all(self.non_negative(v, depth + 1) for v in values)
        return False

    def scalar(self, expr: cst.BaseExpression) -> bool:
        """A Python number the code shows (`Values.number`, the one number question): a
        literal, arithmetic of them, a name bound only to them, a parameter annotated `int`
        or `float` or with a number for its default."""
        return values(self.context).number(expr) is not None


def is_zero(expr: cst.BaseExpression) -> bool:
    return integer_value(expr) == 0


def _is_integer(expr: cst.BaseExpression, value: int) -> bool:
    return integer_value(expr) == value


def _combine(left: int | cst.BaseExpression, right: int | cst.BaseExpression, plus: bool) -> int | cst.BaseExpression:
    """`left + right` (or `left - right`) of two offsets, folded where both are numbers."""
    left_value = left if isinstance(left, int) else integer_value(left)
    right_value = right if isinstance(right, int) else integer_value(right)
    if left_value is not None and right_value is not None:
        return left_value + right_value if plus else left_value - right_value
    if right_value == 0:
        return left
    if left_value == 0:
        if plus:
            return right
        return cst.UnaryOperation(cst.Minus(), _node(right))
    return cst.BinaryOperation(_node(left), cst.Add() if plus else cst.Subtract(), _node(right))


def _node(value: int | cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(value, int):
        return integer_literal(value)
    return value


def _is_negated_stop(offset: cst.BaseExpression, stop: cst.BaseExpression | None) -> bool:
    """Is `offset` the negated loop end, `-K` for `range(..., K)`?"""
    code = cst.Module([]).code_for_node
    return (
        stop is not None
        and isinstance(offset, cst.UnaryOperation)
        and isinstance(offset.operator, cst.Minus)
        and isinstance(offset.expression, (cst.Name, cst.Attribute))
        and code(offset.expression) == code(stop)
    )


def _add(bound: cst.BaseExpression | None, offset: int | cst.BaseExpression) -> tuple[str, int | None] | None:
    """The text of `bound + offset` folded where it can be, and its value when it is a number."""
    code = cst.Module([]).code_for_node
    if (
        isinstance(offset, int)
        and offset
        and m.matches(bound, m.BinaryOperation(operator=m.Add() | m.Subtract(), right=m.Integer()))
    ):
        # `T - 1` shifted by 1: `T`
        inner = integer_value(bound.right) * (1 if isinstance(bound.operator, cst.Add) else -1)
        return _add(bound.left, inner + offset)
    bound_value = 0 if bound is None else integer_value(bound)
    offset_value = offset if isinstance(offset, int) else integer_value(offset)
    if bound_value is not None and offset_value is not None:
        value = bound_value + offset_value
        return str(value), value
    if offset_value == 0:
        return code(bound) if bound is not None else "0", bound_value  # alone in a slice: no parentheses
    bound_text = "" if bound_value == 0 else wrapped(code(bound))
    if offset_value is not None:
        return (f"{bound_text} + {offset_value}" if offset_value > 0 else f"{bound_text} - {-offset_value}"), None
    offset_text = code(offset)
    if not bound_text:
        return offset_text, None
    if isinstance(offset, cst.UnaryOperation) and isinstance(offset.operator, cst.Minus):
        return f"{bound_text} - {wrapped(code(offset.expression))}", None
    return f"{bound_text} + {offset_text}", None


def wrapped(text: str) -> str:
    """`text` in parentheses unless it is an atom (a name, attribute, call, subscript, number)."""
    try:
        expr = cst.parse_expression(text)
    except cst.ParserSyntaxError:
        return f"({text})"
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer)) or expr.lpar:
        return text
    return f"({text})"


def _minus_one(stop: cst.BaseExpression) -> tuple[str, cst.BaseExpression | None]:
    """`stop - 1` as text, `K` for a stop written `K + 1` (with the node `K`)."""
    code = cst.Module([]).code_for_node
    value = integer_value(stop)
    if value is not None:
        return str(value - 1), None
    if isinstance(stop, cst.BinaryOperation) and isinstance(stop.operator, cst.Add) and integer_value(stop.right) == 1:
        return code(stop.left), stop.left
    return f"{wrapped(code(stop))} - 1", None

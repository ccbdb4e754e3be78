"""Lines the fixes made longer than the file's line length, wrapped as black and
`ruff format` wrap a call.

Only statements the fixes rewrote or wrote are looked at, and only one-line
statements whose rewrite is longer than the line length and than the statement
was: the user's own lines stay as written, long or not. The split is black's
right-hand split of a call: the last call of the line whose head still fits
opens its brackets; its arguments go on one indented line when they fit there,
else one a line with a trailing comma (the "magic trailing comma" that keeps
them so), and an argument still too long is split the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

DEFAULT_LINE_LENGTH = 88  # black's and ruff's default


def wrapped(
    module: cst.Module,
    changed: Callable[[cst.CSTNode], bool],
    width_before: Callable[[cst.SimpleStatementLine], int | None],
    line_length: int = DEFAULT_LINE_LENGTH,
) -> cst.Module:
    """`module` with the long one-line statements that `changed` says the fixes wrote
    split at a call. `width_before(statement)`: the widest line of the statement it was
    rewritten from (None for a statement the fixes wrote anew)."""
    unit = module.default_indent
    if "\t" in unit or not unit:
        return module
    return module.visit(_Wrap(changed, width_before, line_length, unit))


class _Wrap(cst.CSTTransformer):
    def __init__(self, changed, width_before, line_length: int, unit: str) -> None:
        super().__init__()
        self.changed, self.width_before = changed, width_before
        self.line_length, self.unit = line_length, unit
        self.depth = 0
        self.render = cst.Module([], default_indent=unit).code_for_node

    def on_visit(self, node: cst.CSTNode) -> bool:
        if not self.changed(node):
            return False
        if isinstance(node, cst.IndentedBlock):
            self.depth += 1
        return not isinstance(node, cst.SimpleStatementLine)

    def on_leave(self, original_node, updated_node):
        if isinstance(original_node, cst.IndentedBlock) and self.changed(original_node):
            self.depth -= 1
        return super().on_leave(original_node, updated_node)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if len(updated_node.body) != 1 or not self.changed(original_node) or not self.changed(original_node.body[0]):
            return updated_node
        margin = len(self.unit) * self.depth
        width = margin + self._widest(updated_node)
        before = self.width_before(updated_node)
        if width <= self.line_length or (before is not None and width <= before) or self._lines(updated_node) > 1:
            return updated_node
        value = _value(updated_node.body[0])
        if value is None:
            return updated_node
        new = self._split(updated_node, value, 1, margin)
        return new if new is not None else updated_node

    # -- measuring -----------------------------------------------------------------------

    def _text(self, statement: cst.SimpleStatementLine) -> str:
        return self.render(statement.with_changes(leading_lines=[]))

    def _widest(self, statement: cst.SimpleStatementLine) -> int:
        return max(len(line) for line in self._text(statement).splitlines())

    def _lines(self, statement: cst.SimpleStatementLine) -> int:
        return len(self._text(statement).splitlines())

    def _fits(self, statement: cst.SimpleStatementLine, margin: int) -> list[bool]:
        return [margin + len(line) <= self.line_length for line in self._text(statement).splitlines()]

    # -- splitting -----------------------------------------------------------------------

    def _split(
        self, statement: cst.SimpleStatementLine, value: cst.BaseExpression, level: int, margin: int, head: int = 0
    ) -> cst.SimpleStatementLine | None:
        """`statement` with a call of the trailers ending `value` (which starts on line
        `head` of the statement) split, its arguments `level` indents below the
        statement; None when `value` ends in no call with arguments."""
        calls = [call for call in _trailing_calls(value) if call.args and "\n" not in self.render(call)]
        if not calls:
            return None
        chosen = next(  # the last call whose head fits, as black's right-hand split
            (c for c in calls if self._fits(statement.deep_replace(c, _hugged(c, level, self.unit)), margin)[head]),
            calls[0],
        )
        hugged = statement.deep_replace(chosen, _hugged(chosen, level, self.unit))
        if all(self._fits(hugged, margin)):
            return hugged
        if len(chosen.args) == 1:  # no comma to split at: the argument is split in turn
            return self._split(hugged, chosen.args[0].value, level + 1, margin, head + 1) or hugged
        exploded = _exploded(chosen, level, self.unit)
        result = statement.deep_replace(chosen, exploded)
        for arg in exploded.args:  # an argument still too long: split it in turn
            line = self._arg_line(result, arg)
            if line is not None and not self._fits(result, margin)[line]:
                result = self._split(result, arg.value, level + 1, margin, line) or result
        return result

    def _arg_line(self, statement: cst.SimpleStatementLine, arg: cst.Arg) -> int | None:
        """The line of `statement` an argument of an exploded call sits on."""
        arg_text = self.render(
            arg.with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=cst.SimpleWhitespace(""))
        )
        if "\n" in arg_text:
            return None
        for number, line in enumerate(self._text(statement).splitlines()):
            if line.strip().rstrip(",") == arg_text.strip():
                return number
        return None


def _value(small: cst.BaseSmallStatement) -> cst.BaseExpression | None:
    if isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Expr, cst.Return)):
        return small.value
    return None


def _trailing_calls(value: cst.BaseExpression | None) -> list[cst.Call]:
    """The calls whose closing bracket ends `value`, last first: `a(x).b(y)` gives
    `....b(y)` then `a(x)`."""
    calls = []
    node = value
    while node is not None and not node.lpar:
        if isinstance(node, cst.Call):
            calls.append(node)
            node = node.func
        elif isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
        else:
            break
    return calls


def _newline(level: int, unit: str) -> cst.ParenthesizedWhitespace:
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(), empty_lines=[], indent=True, last_line=cst.SimpleWhitespace(unit * level)
    )


def _hugged(call: cst.Call, level: int, unit: str) -> cst.Call:
    """`f(\\n    a, b\\n)`: the arguments on one line of their own."""
    args = list(call.args)
    args = [arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for arg in args[:-1]] + [
        args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=_newline(level - 1, unit))
    ]
    return call.with_changes(whitespace_before_args=_newline(level, unit), args=args)


def _exploded(call: cst.Call, level: int, unit: str) -> cst.Call:
    """`f(\\n    a,\\n    b,\\n)`: one argument a line, with a trailing comma."""
    args = list(call.args)
    args = [arg.with_changes(comma=cst.Comma(whitespace_after=_newline(level, unit))) for arg in args[:-1]] + [
        args[-1].with_changes(
            comma=cst.Comma(whitespace_after=_newline(level - 1, unit)), whitespace_after_arg=cst.SimpleWhitespace("")
        )
    ]
    return call.with_changes(whitespace_before_args=_newline(level, unit), args=args)

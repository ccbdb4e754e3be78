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

from codemod.analysis.index import children_of
from codemod.analysis.positions import statement_starts
from codemod.config import DEFAULT_LINE_LENGTH


def file_line_length(code: str) -> int:
    """The line length a file keeps where its project configures no formatter: black's 88,
    or its own widest line of plain code (no comment, no string: what a formatter splits)
    where that is wider. A file written to 120 columns is not rewrapped at 88."""
    plain = (line for line in code.splitlines() if "#" not in line and '"' not in line and "'" not in line)
    return max(DEFAULT_LINE_LENGTH, max((len(line.rstrip()) for line in plain), default=0))


def wrapped(
    module: cst.Module,
    changed: Callable[[cst.CSTNode], bool],
    width_before: Callable[[cst.SimpleStatementLine], tuple[int | None, int]],
    line_length: int = DEFAULT_LINE_LENGTH,
) -> cst.Module:
    """`module` with the statements that `changed` says the fixes wrote split where their
    line is longer than `line_length`. `width_before(statement)`: the widest line of the
    statement it was rewritten from and its number of lines ((None, 1) for a statement
    the fixes wrote anew): a statement no wider than it was stays as it is, and one the
    user laid out on several lines keeps that layout."""
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
        self._last: tuple[cst.CSTNode, str] | None = None  # the statement _text measured last, its text

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
        return self._formatted(
            updated_node, _value(updated_node.body[0]), top=isinstance(updated_node.body[0], cst.Expr)
        )

    def leave_With(self, original_node, updated_node):
        if (
            not self.changed(original_node)
            or len(updated_node.items) != 1
            or not self.changed(original_node.items[0])
            or updated_node.items[0].asname
        ):
            return updated_node
        header = updated_node.with_changes(body=cst.IndentedBlock([cst.SimpleStatementLine([cst.Pass()])]))
        formatted = self._formatted(header, updated_node.items[0].item, top=False)
        return updated_node if formatted is header else updated_node.with_changes(items=formatted.items)

    def _formatted(self, statement, value: cst.BaseExpression | None, top: bool):
        """`statement` (a line, or a `with` header) split where its one line is too long;
        `top`: its value is a whole expression statement (no parentheses to add). Layout
        is no reason to lose a fix: where it fails, the statement stays on its line."""
        try:
            return self._split_statement(statement, value, top)
        except (KeyError, ValueError, TypeError, AttributeError, IndexError, cst.CSTValidationError):
            return statement

    def _split_statement(self, statement, value: cst.BaseExpression | None, top: bool):
        if value is None:
            return statement
        before, lines = self.width_before(statement) if isinstance(statement, cst.SimpleStatementLine) else (None, 1)
        # (a statement without a colon holds no slice: nothing to space)
        slices = _Slices(self.changed)
        spaced = statement.visit(slices) if ":" in self._text(statement) else statement
        if slices.respaced and self.render(spaced) != self.render(statement):
            statement = spaced
            value = (
                _value(statement.body[0]) if isinstance(statement, cst.SimpleStatementLine) else statement.items[0].item
            )
        if self._lines(statement) > 1:
            if lines > 1 or "#" in self._text(statement):
                return statement  # laid out by the user (or a fix that keeps their layout)
            statement = _joined(statement)  # a new statement: its own line breaks go
            value = (
                _value(statement.body[0]) if isinstance(statement, cst.SimpleStatementLine) else statement.items[0].item
            )
        margin = len(self.unit) * self.depth
        width = margin + self._widest(statement)
        if width <= self.line_length or (before is not None and width <= before):
            return statement
        self.margin = margin
        if _delimited(value) and not top and not self._omits_parentheses(statement, value):
            wrapped = value.with_changes(
                lpar=[cst.LeftParen(whitespace_after=_newline(1, self.unit))],
                rpar=[cst.RightParen(whitespace_before=_newline(0, self.unit))],
            )
            statement = _replaced(statement, value, wrapped)
            if self._fits_line(statement, self._line_of(statement, wrapped) + 1):
                return statement
            return self._body_in_parens(statement, wrapped, 1)
        return self._trailer(statement, value, 0) or statement

    # -- measuring -----------------------------------------------------------------------

    def _text(self, statement) -> str:
        # (asked for again of the same statement while it is measured: kept with it)
        if self._last is None or self._last[0] is not statement:
            self._last = (statement, self.render(statement.with_changes(leading_lines=[])))
        return self._last[1]

    def _widest(self, statement) -> int:
        lines = self._text(statement).splitlines()
        return max(len(line) for line in (lines[:-1] if isinstance(statement, cst.With) else lines))

    def _lines(self, statement) -> int:
        text = self._text(statement)
        if isinstance(statement, cst.With):
            return len(text.splitlines()) - 1  # the header, without its body
        return len(text.splitlines())

    def _fits_line(self, statement, line: int) -> bool:
        lines = self._text(statement).splitlines()
        return line >= len(lines) or self.margin + len(lines[line]) <= self.line_length

    def _line_of(self, statement, node: cst.CSTNode) -> int:
        """The line of `statement` (0 first) on which `node` starts."""
        if getattr(node, "lpar", None):
            node = node.lpar[0]  # a position leaves out the node's parentheses
        return statement_starts(statement.with_changes(leading_lines=[]))[node][0] - 1

    def _omits_parentheses(self, statement, value: cst.BaseExpression) -> bool:
        """Black's choice not to wrap a value in parentheses: one operator, and a last
        operand that ends in a call whose head fits (the call splits instead)."""
        if _delimiters(value) != 1:
            return False
        calls = [c for c in _trailing_calls(_last_operand(value)) if c.args]
        return any(self._fits_line(_replaced(statement, c, _hugged(c, 1, self.unit)), 0) for c in calls)

    # -- splitting -----------------------------------------------------------------------

    def _body(self, statement, value: cst.BaseExpression, indent: int):
        """`statement` with `value`, the content of brackets on lines at `indent`, split
        at its operators (each operator leads a line) and the operands still too long
        split at their brackets."""
        if not _delimited(value):
            return self._operand(statement, value, indent)
        split = _at_operators(value, indent, self.unit)
        statement = _replaced(statement, value, split)
        for operand in _operands(split):
            line = self._line_of(statement, operand)
            if not self._fits_line(statement, line):
                statement = self._operand(statement, operand, indent)
        return statement

    def _operand(self, statement, value: cst.BaseExpression, indent: int):
        """`statement` with `value`, a line of its own inside brackets at `indent`, split:
        a chain of two or more method calls before each of them (black's fluent style),
        else at its last brackets."""
        if _delimited(value):  # operators of a higher priority than the line's own
            return self._body(statement, value, indent)
        if _chained_dots(value) < 2:
            return self._trailer(statement, value, indent) or statement
        fluent, first = _fluent(value, indent, self.unit)
        statement = _replaced(statement, value, fluent)
        if first is not None and not self._fits_line(statement, self._line_of(statement, first)):
            statement = self._trailer(statement, first, indent) or statement
        return statement

    def _trailer(self, statement, value: cst.BaseExpression, indent: int):
        """`statement` with the brackets ending `value` (which starts on a line at `indent`)
        split, as black's right-hand split; None when `value` ends in none."""
        head = self._line_of(statement, value)
        brackets = [b for b in _trailing_brackets(value) if "\n" not in self.render(b)]
        if not brackets:
            return None
        chosen = next(  # the last bracket whose head fits
            (b for b in brackets if self._fits_line(_replaced(statement, b, _hug(b, indent + 1, self.unit)), head)),
            brackets[0],
        )
        hugged_node = _hug(chosen, indent + 1, self.unit)
        hugged = _replaced(statement, chosen, hugged_node)
        if self._fits_line(hugged, head + 1):
            return hugged
        if isinstance(chosen, cst.Call) and len(chosen.args) > 1:
            exploded = _exploded(chosen, indent + 1, self.unit)
            result = _replaced(statement, chosen, exploded)
            for arg in exploded.args:  # an argument still too long: split it in turn
                if not self._fits_line(result, self._line_of(result, arg)):
                    result = self._body(result, arg.value, indent + 1)
            return result
        if isinstance(chosen, cst.Call):  # one argument: split it in turn
            return self._body(hugged, hugged_node.args[0].value, indent + 1)
        return self._body_in_parens(hugged, hugged_node, indent + 1)

    def _body_in_parens(self, statement, node: cst.BaseExpression, indent: int):
        """`node` is parenthesized, its content on lines at `indent`: split the content
        at its operators (the brackets stay node's)."""
        if not _delimited(node.with_changes(lpar=[], rpar=[])):
            return self._trailer(statement, node.with_changes(lpar=[], rpar=[]), indent) or statement
        split = _at_operators(node, indent, self.unit)
        statement = _replaced(statement, node, split)
        for operand in _operands(split):
            if not self._fits_line(statement, self._line_of(statement, operand)):
                statement = self._operand(statement, operand, indent)
        return statement


def _value(small: cst.BaseSmallStatement) -> cst.BaseExpression | None:
    if isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Expr, cst.Return)):
        return small.value
    return None


DELIMITED = (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp, cst.Comparison)


def _delimited(value: cst.BaseExpression | None) -> bool:
    """An expression with operators at its top (not parenthesized)."""
    return isinstance(value, DELIMITED) and not value.lpar


def _chain(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The operations of one priority along the left of `value`: `a + b - c` gives the
    `... - c` operation then `a + b`."""
    chain = [value]
    node = value
    while isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)) and _delimited(node.left):
        left = node.left
        if type(left) is not type(node) or _priority(left) != _priority(node):
            break
        chain.append(left)
        node = left
    return chain


def _priority(node: cst.BaseExpression) -> int:
    operator = getattr(node, "operator", None)
    for rank, kinds in enumerate(PRIORITIES):
        if isinstance(operator, kinds):
            return rank
    return -1


PRIORITIES = (
    (cst.Or,),
    (cst.And,),
    (cst.BitOr,),
    (cst.BitXor,),
    (cst.BitAnd,),
    (cst.LeftShift, cst.RightShift),
    (cst.Add, cst.Subtract),
    (cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.MatrixMultiply),
    (cst.Power,),
)


def _delimiters(value: cst.BaseExpression) -> int:
    if isinstance(value, cst.IfExp):
        return 2
    if isinstance(value, cst.Comparison):
        return len(value.comparisons)
    return len(_chain(value))


def _last_operand(value: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(value, cst.IfExp):
        return value.orelse
    if isinstance(value, cst.Comparison):
        return value.comparisons[-1].comparator
    return value.right


def _at_operators(value: cst.BaseExpression, indent: int, unit: str) -> cst.BaseExpression:
    """`value` with a line break before each operator of its top (black's delimiter split)."""
    if isinstance(value, cst.IfExp):
        return value.with_changes(
            whitespace_before_if=_newline(indent, unit), whitespace_before_else=_newline(indent, unit)
        )
    if isinstance(value, cst.Comparison):
        return value.with_changes(
            comparisons=[
                target.with_changes(operator=target.operator.with_changes(whitespace_before=_newline(indent, unit)))
                for target in value.comparisons
            ]
        )
    chain = _chain(value)
    node = chain[-1]
    node = node.with_changes(operator=node.operator.with_changes(whitespace_before=_newline(indent, unit)))
    for operation in reversed(chain[:-1]):
        node = operation.with_changes(
            left=node, operator=operation.operator.with_changes(whitespace_before=_newline(indent, unit))
        )
    return node


def _operands(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(value, cst.IfExp):
        return [value.body, value.test, value.orelse]
    if isinstance(value, cst.Comparison):
        return [value.left, *(target.comparator for target in value.comparisons)]
    chain = _chain(value)
    return [chain[-1].left, *(operation.right for operation in reversed(chain))]


def _trailing_brackets(value: cst.BaseExpression | None) -> list[cst.BaseExpression]:
    """The brackets that end `value`, last first: calls with arguments and parenthesized
    expressions. `a(x).b(y)` gives `....b(y)` then `a(x)`; `(a / b).sum()` gives `(a / b)`."""
    found = []
    node = value
    while node is not None:
        if node.lpar:
            found.append(node)
            break
        if isinstance(node, cst.Call):
            if node.args:
                found.append(node)
            node = node.func
        elif isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
        else:
            break
    return found


def _trailing_calls(value: cst.BaseExpression | None) -> list[cst.Call]:
    return [b for b in _trailing_brackets(value) if isinstance(b, cst.Call)]


def _hug(node: cst.BaseExpression, level: int, unit: str) -> cst.BaseExpression:
    """The content of `node`'s brackets on a line of its own at `level`."""
    if isinstance(node, cst.Call) and not node.lpar:
        return _hugged(node, level, unit)
    return node.with_changes(
        lpar=[node.lpar[0].with_changes(whitespace_after=_newline(level, unit)), *node.lpar[1:]],
        rpar=[*node.rpar[:-1], node.rpar[-1].with_changes(whitespace_before=_newline(level - 1, unit))],
    )


class _Join(cst.CSTTransformer):
    """Every line break inside brackets made a space (none after an opening bracket,
    before a closing one or a trailing comma's bracket)."""

    def leave_ParenthesizedWhitespace(self, original_node, updated_node):
        return cst.SimpleWhitespace(" ")

    def leave_Dot(self, original_node, updated_node):
        # a method chain written one call a line: `(...)\n.sum(0)` joins as `(...).sum(0)`
        none = cst.SimpleWhitespace("")
        return updated_node.with_changes(whitespace_before=none, whitespace_after=none)

    def on_leave(self, original_node, updated_node):
        updated_node = super().on_leave(original_node, updated_node)
        none = cst.SimpleWhitespace("")
        if isinstance(updated_node, (cst.LeftParen, cst.LeftSquareBracket, cst.LeftCurlyBrace)):
            return updated_node.with_changes(whitespace_after=none)
        if isinstance(updated_node, (cst.RightParen, cst.RightSquareBracket, cst.RightCurlyBrace)):
            return updated_node.with_changes(whitespace_before=none)
        if isinstance(updated_node, cst.Call):
            args = list(updated_node.args)
            if args:
                args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=none)
            return updated_node.with_changes(whitespace_before_args=none, args=args)
        return updated_node


def _joined(statement):
    return statement.visit(_Join())


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


def _replaced(root, old: cst.CSTNode, new: cst.CSTNode):
    """`root` with `old` replaced by `new`, every other node kept as it is (libcst's
    deep_replace rebuilds them all, and the layout finds nodes by identity)."""
    path: set[int] = set()
    stack: list[tuple[cst.CSTNode, tuple[int, ...]]] = [(root, ())]
    while stack:
        node, above = stack.pop()
        if node is old:
            path = {*above, id(node)}
            break
        stack.extend((child, (*above, id(node))) for child in children_of(node))
    if not path:
        return root
    return root.visit(_Swap(path, old, new))


class _Swap(cst.CSTTransformer):
    def __init__(self, path: set[int], old: cst.CSTNode, new: cst.CSTNode) -> None:
        super().__init__()
        self.path, self.old, self.new = path, old, new

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) in self.path and node is not self.old

    def on_leave(self, original_node, updated_node):
        return self.new if original_node is self.old else updated_node


SIMPLE = (cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString)


class _Slices(cst.CSTTransformer):
    """The slices the fixes wrote spaced as black spaces them: a colon next to a part that
    is more than a name or a number reads as an operator (`x[: n - 1]`, `x[a.b :]`)."""

    def __init__(self, changed) -> None:
        super().__init__()
        self.changed = changed
        self.respaced = False  # whether a slice was spaced anew (else the code is as it was)

    def leave_Slice(self, original_node, updated_node):
        parts = (updated_node.lower, updated_node.upper, updated_node.step)
        if not self.changed(original_node) or all(part is None or _simple(part) for part in parts):
            return updated_node
        self.respaced = True

        def space(present) -> cst.SimpleWhitespace:
            return cst.SimpleWhitespace(" " if present is not None else "")

        lower, upper, step = parts
        first = updated_node.first_colon.with_changes(whitespace_before=space(lower), whitespace_after=space(upper))
        second = updated_node.second_colon
        if step is not None and not isinstance(second, cst.Colon):
            second = cst.Colon()
        if isinstance(second, cst.Colon):
            second = second.with_changes(whitespace_before=space(upper), whitespace_after=space(step))
        return updated_node.with_changes(first_colon=first, second_colon=second)


def _simple(part: cst.BaseExpression) -> bool:
    if isinstance(part, cst.UnaryOperation):
        return _simple(part.expression)
    return isinstance(part, SIMPLE) and not part.lpar


def _after_bracket(node: cst.BaseExpression) -> bool:
    """Does `node` end in a closing bracket (a call, a subscript, parentheses)?"""
    return bool(node.rpar) or isinstance(node, (cst.Call, cst.Subscript))


def _chained_dots(value: cst.BaseExpression) -> int:
    """The `.name` links of a chain that follow a closing bracket: `f(x).a(y).b` has two."""
    count, node = 0, value
    while not node.lpar and isinstance(node, (cst.Call, cst.Subscript, cst.Attribute)):
        if isinstance(node, cst.Attribute):
            count += _after_bracket(node.value)
        node = node.func if isinstance(node, cst.Call) else node.value
    return count


def _fluent(value: cst.BaseExpression, indent: int, unit: str) -> tuple[cst.BaseExpression, cst.BaseExpression | None]:
    """`value` with a line break before each `.name` that follows a closing bracket, and
    the part of the chain left on the first line (None where no break was made)."""
    if value.lpar or not isinstance(value, (cst.Call, cst.Subscript, cst.Attribute)):
        return value, None
    if isinstance(value, cst.Call):
        inner, first = _fluent(value.func, indent, unit)
        return value.with_changes(func=inner), first
    inner, first = _fluent(value.value, indent, unit)
    if isinstance(value, cst.Attribute) and _after_bracket(value.value):
        dot = value.dot.with_changes(whitespace_before=_newline(indent, unit))
        return value.with_changes(value=inner, dot=dot), first if first is not None else inner
    return value.with_changes(value=inner), first

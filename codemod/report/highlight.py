"""Python syntax highlighting without a dependency: the `tokenize` module's
tokens become (css class, text) spans, line by line, so that a diff can show
any line of the file on its own. Text between tokens (spaces, the rest of a
line the tokenizer gave up on) is a span with no class."""

from __future__ import annotations

import io
import keyword
import token
import tokenize

Span = tuple[str, str]  # (css class or "", text)

KEYWORD, BUILTIN_CONSTANT, STRING, NUMBER, COMMENT, OPERATOR, DEFINED, DECORATOR = (
    "kw",
    "const",
    "str",
    "num",
    "com",
    "op",
    "def",
    "deco",
)
CONSTANTS = {"True", "False", "None"}
# f-strings are three or more tokens since Python 3.12; one string class covers them all.
STRING_TYPES = {token.STRING} | {
    getattr(token, name) for name in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END") if hasattr(token, name)
}


def highlight_lines(text: str) -> list[list[Span]]:
    """One list of spans per line of `text`, as str.splitlines() splits it (the
    diff's lines), line ends dropped."""
    regions = list(_classified_regions(text))
    highlighted, index, offset = [], 0, 0
    for line in text.splitlines(keepends=True):
        body_end = offset + len(line.rstrip("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"))
        spans: list[Span] = []
        position = offset
        while index < len(regions) and regions[index][0] < body_end:
            start, end, css = regions[index]
            _add(spans, "", text[position : max(position, start)])
            position = max(position, start)
            _add(spans, css, text[position : min(end, body_end)])
            position = min(end, body_end)
            if end > body_end:  # a token over several lines (a docstring) goes on with the next
                break
            index += 1
        _add(spans, "", text[position:body_end])
        highlighted.append(spans)
        offset += len(line)
    return highlighted


def _add(line: list[Span], css: str, text: str) -> None:
    if not text:
        return
    if line and line[-1][0] == css:  # neighbours of one class become one span
        line[-1] = (css, line[-1][1] + text)
    else:
        line.append((css, text))


def _classified_regions(text: str):
    """(start, end, css class) of the tokens worth a colour, as offsets into
    `text`, in order; stops quietly where the tokenizer fails (the rest stays plain)."""
    row_starts, offset = [0], 0
    for row in text.split("\n"):  # the tokenizer's rows: io.StringIO splits on "\n" alone
        offset += len(row) + 1
        row_starts.append(offset)
    previous = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            css = _css_class(tok, previous)
            if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT):
                previous = tok
            if css and tok.start[0] <= len(row_starts) - 1:
                yield row_starts[tok.start[0] - 1] + tok.start[1], row_starts[tok.end[0] - 1] + tok.end[1], css
    except (tokenize.TokenError, SyntaxError):
        return


def _css_class(tok: tokenize.TokenInfo, previous: tokenize.TokenInfo | None) -> str:
    if tok.type in STRING_TYPES:
        return STRING
    if tok.type == tokenize.NUMBER:
        return NUMBER
    if tok.type == tokenize.COMMENT:
        return COMMENT
    if tok.type == tokenize.OP:
        return DECORATOR if tok.string == "@" and _starts_line(tok) else OPERATOR
    if tok.type == tokenize.NAME:
        if tok.string in CONSTANTS:
            return BUILTIN_CONSTANT
        if keyword.iskeyword(tok.string):
            return KEYWORD
        if previous is not None and previous.type == tokenize.NAME and previous.string in ("def", "class"):
            return DEFINED
        if previous is not None and previous.string == "@" and _starts_line(previous):
            return DECORATOR
    return ""


def _starts_line(tok: tokenize.TokenInfo) -> bool:
    return not tok.line[: tok.start[1]].strip()

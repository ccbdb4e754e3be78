"""`# perfmod: ignore` and `# perfmod: ignore[PM101,PM301]` comments.

A leaf module: the engine reads the comments of a file once; rules that anchor a
finding away from the statement the user sees as its cause ask `suppressed_on`.
"""

from __future__ import annotations

import io
import re
import tokenize

import libcst as cst

SUPPRESSION = re.compile(r"#\s*perfmod:\s*ignore(?:\[(?P<codes>[A-Z0-9,\s]+)\])?", re.I)

# Line -> the codes suppressed there (None: every code).
Suppressions = dict[int, "set[str] | None"]


def _codes(match: re.Match) -> set[str] | None:
    codes = match.group("codes")
    return {c.strip().upper() for c in codes.split(",") if c.strip()} if codes else None


def suppressions(code: str) -> Suppressions:
    """Line -> suppressed codes (None: all) from the comments of `code`."""
    found: Suppressions = {}
    if "perfmod" not in code:
        return found
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return found
    for token in tokens:
        if token.type == tokenize.COMMENT:
            match = SUPPRESSION.search(token.string)
            if match:
                found[token.start[0]] = _codes(match)
    return found


def is_suppressed(found: Suppressions, line: int, code: str) -> bool:
    if line not in found:
        return False
    codes = found[line]
    return codes is None or code in codes


def suppressed_on(statement: cst.CSTNode | None, code: str) -> bool:
    """Does `statement` carry `# perfmod: ignore` or `# perfmod: ignore[..., code]`? For a
    compound statement, the comment after its header (`with ...:  # perfmod: ignore`)."""
    comment = None
    if isinstance(statement, cst.SimpleStatementLine):
        comment = statement.trailing_whitespace.comment
    elif isinstance(statement, cst.BaseCompoundStatement) and isinstance(statement.body, cst.IndentedBlock):
        comment = statement.body.header.comment
    match = SUPPRESSION.search(comment.value) if comment is not None else None
    if match is None:
        return False
    codes = _codes(match)
    return codes is None or code in codes

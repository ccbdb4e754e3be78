"""`# perfmod: ignore` and `# perfmod: ignore[PM101,PM301]` comments.

A leaf module: the engine reads the comments of a file once; rules that anchor a
finding away from the statement the user sees as its cause ask `suppressed_on`.

Forms read:

    # perfmod: ignore                  every rule on the line
    # perfmod: ignore[PM101, PM301]    these codes
    # perfmod: ignore PM101            these codes too (ruff's `# noqa: X` habit),
    # perfmod: ignore: PM101, PM301    never "every rule"

`suppression_warnings` lists what such a comment gets wrong (a code that is no
rule, a prefix, empty brackets, a misspelt directive) for the command line to
print with the file and line.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable
from typing import NamedTuple

import libcst as cst

DIRECTIVE = re.compile(r"#\s*perfmod\s*:\s*(?P<word>[\w-]*)(?P<rest>.*)", re.I)
BRACKETS = re.compile(r"\[(?P<codes>[^\]]*)(?P<close>\]?)")
CODE_LIST = re.compile(r"[:=]?\s*(?P<codes>[A-Za-z]{1,4}\d{1,4}(?:\s*[,\s]\s*[A-Za-z]{1,4}\d{1,4})*)\b")
CODE = re.compile(r"^[A-Z]{1,4}\d{1,4}$")

# Line -> the codes suppressed there (None: every code).
Suppressions = dict[int, "set[str] | None"]


class Directive(NamedTuple):
    codes: set[str] | None  # None: every code; empty: nothing
    problems: list[str]  # what the comment gets wrong, before any catalogue check


def parse(comment: str) -> Directive | None:
    """The `# perfmod: ...` directive in a comment, or None when there is none."""
    match = DIRECTIVE.search(comment)
    if match is None:
        return None
    word, rest = match.group("word").lower(), match.group("rest")
    if word != "ignore":
        return Directive(
            set(),
            [
                f"`# perfmod: {match.group('word')}` is not a perfmod directive; "
                "write `# perfmod: ignore` or `# perfmod: ignore[CODE]`"
            ],
        )
    if rest.startswith("["):
        brackets = BRACKETS.match(rest)
        codes = _split(brackets.group("codes"))
        problems = [] if brackets.group("close") else ["`# perfmod: ignore[` has no closing `]`"]
        if not codes:
            problems.append(
                "`# perfmod: ignore[]` names no code and suppresses nothing; name the codes, "
                "or write `# perfmod: ignore` to suppress every rule on the line"
            )
        return Directive(codes, problems)
    listed = CODE_LIST.match(rest.lstrip()) if rest[:1] in ("", " ", "\t", ":", "=") else None
    if listed:
        return Directive(_split(listed.group("codes")), [])
    return Directive(None, [])


def _split(text: str) -> set[str]:
    return {code.upper() for code in re.split(r"[\s,]+", text) if code}


def _comments(source: str | bytes) -> list[tuple[int, str]]:
    """(line, text) of every comment; none when the source does not tokenize."""
    try:
        if isinstance(source, bytes):
            tokens = list(tokenize.tokenize(io.BytesIO(source).readline))
        else:
            tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError, LookupError):
        return []
    return [(token.start[0], token.string) for token in tokens if token.type == tokenize.COMMENT]


def suppressions(code: str) -> Suppressions:
    """Line -> suppressed codes (None: all) from the comments of `code`."""
    found: Suppressions = {}
    if DIRECTIVE.search(code) is None:  # no comment can hold a directive: skip tokenizing the file
        return found
    for line, comment in _comments(code):
        directive = parse(comment)
        if directive is not None:
            found[line] = directive.codes
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
    directive = parse(comment.value) if comment is not None else None
    if directive is None:
        return False
    return directive.codes is None or code in directive.codes


def suppression_warnings(source: str | bytes, known: Iterable[str]) -> list[tuple[int, str]]:
    """(line, message) for each suppression comment that does not do what it
    seems to: a misspelt directive, empty or unclosed brackets, a code of no
    rule in `known` (the catalogue's codes), a prefix instead of a code."""
    if (b"perfmod" if isinstance(source, bytes) else "perfmod") not in source:
        return []
    known = sorted(known)
    warnings = []
    for line, comment in _comments(source):
        directive = parse(comment)
        if directive is None:
            continue
        warnings += [(line, problem) for problem in directive.problems]
        for code in sorted(directive.codes or ()):
            if code in known:
                continue
            if CODE.match(code) and any(rule.startswith(code) for rule in known):
                warnings.append(
                    (
                        line,
                        f"`{code}` in `# perfmod: ignore` is a prefix, and suppression names "
                        f"codes in full: write {', '.join(r for r in known if r.startswith(code))}",
                    )
                )
            else:
                close = [rule for rule in known if _close(code, rule)]
                hint = f"; did you mean {', '.join(close)}?" if close else "; `perfmod rules` lists the codes"
                warnings.append(
                    (line, f"`{code}` in `# perfmod: ignore` is no perfmod rule, so it suppresses nothing{hint}")
                )
    return warnings


def _close(code: str, rule: str) -> bool:
    """One edit apart (a typo or a transposition), for a "did you mean"."""
    if len(code) == len(rule):
        diff = [i for i, (a, b) in enumerate(zip(code, rule)) if a != b]
        return len(diff) == 1 or (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and code[diff[0]] == rule[diff[1]]
            and code[diff[1]] == rule[diff[0]]
        )
    short, long = sorted((code, rule), key=len)
    return len(long) - len(short) == 1 and any(long[:i] + long[i + 1 :] == short for i in range(len(long)))

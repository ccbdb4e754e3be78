"""`# perfmod: ignore`, `# perfmod: ignore[PM101,PM301]` and `# noqa: PM101` comments.

A leaf module: the engine reads the comments of a file once; rules that anchor a
finding away from the statement the user sees as its cause ask `suppressed_on`.

Forms read:

    # perfmod: ignore                  every rule on the line
    # perfmod: ignore[PM101, PM301]    these codes
    # perfmod: ignore PM101            these codes too (ruff's `# noqa: X` habit),
    # perfmod: ignore: PM101, PM301    never "every rule"
    # noqa: PM101, E501                the PM codes listed, as ruff reads `# noqa`:
    # noqa                             every rule on the line (so is `# noqa PM101`,
                                       without the colon, in ruff as here)

`# noqa` is read as ruff reads it: anywhere in the comment (`# type: ignore  #
noqa: PM101`), `noqa` in any case, codes upper case and separated by commas or
spaces, the first word that is no code ending the list (`# noqa: PM101 reason`).
Codes of other tools (E501, F401) suppress nothing here. A comment may hold a
`# perfmod: ignore` and a `# noqa` both: what either suppresses is suppressed.

`suppression_warnings` lists what such a comment gets wrong (a code that is no
rule, a prefix, empty brackets, a misspelt directive, a `# noqa PM101` that
suppresses every rule) for the command line to print with the file and line.
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
NOQA = re.compile(r"#\s*noqa(?P<rest>.*)", re.I)
NOQA_CODE = re.compile(r"[\s,]*(?P<code>[A-Z]+[0-9]+)")  # as ruff lexes them: upper case, then digits
NOQA_WORD = re.compile(r"\s+(?P<code>[A-Z]+[0-9]+)\b")
PERFMOD_CODE = re.compile(r"(?<![A-Za-z0-9])PM\d+(?![A-Za-z0-9])", re.I)
# Can the text hold a directive at all? Files where it cannot are not tokenized.
ANY_DIRECTIVE = re.compile(r"#\s*(?:perfmod\s*:|noqa)", re.I)
ANY_DIRECTIVE_BYTES = re.compile(ANY_DIRECTIVE.pattern.encode(), re.I)

# Line -> the codes suppressed there (None: every code).
Suppressions = dict[int, "set[str] | None"]


class Directive(NamedTuple):
    codes: set[str] | None  # None: every code; empty: nothing
    problems: list[str]  # what the comment gets wrong, before any catalogue check
    name: str = "# perfmod: ignore"  # the directive as warnings name it


def parse(comment: str) -> Directive | None:
    """What a comment's `# perfmod: ...` and `# noqa` directives suppress together,
    or None when it has neither."""
    found = directives(comment)
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    codes = None if any(d.codes is None for d in found) else set().union(*(d.codes for d in found))
    return Directive(codes, [problem for d in found for problem in d.problems])


def directives(comment: str) -> list[Directive]:
    """The comment's `# perfmod: ...` directive and its `# noqa`, those it has."""
    return [d for d in (_perfmod(comment), _noqa(comment)) if d is not None]


def _perfmod(comment: str) -> Directive | None:
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


def _noqa(comment: str) -> Directive | None:
    """`# noqa` as ruff reads it (ruff_linter's noqa lexer): `# noqa`, `# noqa reason`
    and `# noqa PM101` are every rule; `# noqa: CODES` those codes, of which the PM
    ones are perfmod's; anything else after `noqa` (`# noqa; PM101`) is no directive."""
    match = NOQA.search(comment)
    if match is None:
        return None
    rest = match.group("rest")
    own = rest.split("#", 1)[0]  # the text up to the next comment, which is not this directive's
    if rest[:1] in ("", "#") or (rest[:1].isspace() and not own.lstrip().startswith(":")):
        word = NOQA_WORD.match(own)
        problems = []
        if word:
            code = word.group("code")
            problems.append(
                f"`# noqa {code}` (no colon) suppresses every rule on the line, perfmod's too, as in "
                f"ruff; write `# noqa: {code}` to suppress {code} alone"
            )
        return Directive(None, problems, "# noqa")
    codes = _noqa_codes(own.lstrip()[1:]) if own.lstrip().startswith(":") else []
    problems = [
        f"`{text}` in `# noqa` is not read as a code, so it suppresses nothing; write `# noqa: "
        f"{text.upper()}` (codes in upper case right after `noqa:`, before any other word)"
        for text in dict.fromkeys(m.group() for m in PERFMOD_CODE.finditer(own))
        if text not in codes
    ]
    return Directive({code for code in codes if PERFMOD_CODE.fullmatch(code)}, problems, "# noqa")


def _noqa_codes(text: str) -> list[str]:
    """The codes after `# noqa:`, up to the first word that is none (`# noqa: PM101 reason`);
    none when a code runs into other text (`PM101abc`), which ruff rejects."""
    codes, position = [], 0
    while match := NOQA_CODE.match(text, position):
        codes.append(match.group("code"))
        position = match.end()
        after = text[position : position + 1]
        if after and not (after == "," or after.isspace() or after.isupper()):
            return []
    return codes


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


def _may_hold_directive(source: str | bytes) -> bool:
    pattern = ANY_DIRECTIVE_BYTES if isinstance(source, bytes) else ANY_DIRECTIVE
    return pattern.search(source) is not None


def suppressions(code: str) -> Suppressions:
    """Line -> suppressed codes (None: all) from the comments of `code`."""
    found: Suppressions = {}
    if not _may_hold_directive(code):  # no comment can hold a directive: skip tokenizing the file
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
    """Does `statement` carry `# perfmod: ignore` or `# perfmod: ignore[..., code]` (or a
    `# noqa` that names `code` or none)? For a compound statement, the comment after
    its header (`with ...:  # perfmod: ignore`)."""
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
    rule in `known` (the catalogue's codes), a prefix instead of a code, a
    `# noqa` that reads differently from what it seems to say."""
    if not _may_hold_directive(source):
        return []
    known = sorted(known)
    warnings = []
    for line, comment in _comments(source):
        for directive in directives(comment):
            warnings += [(line, problem) for problem in directive.problems]
            warnings += [(line, problem) for problem in _catalogue_problems(directive, known)]
    return warnings


def _catalogue_problems(directive: Directive, known: list[str]) -> list[str]:
    problems = []
    for code in sorted(directive.codes or ()):
        if code in known:
            continue
        if CODE.match(code) and any(rule.startswith(code) for rule in known):
            problems.append(
                f"`{code}` in `{directive.name}` is a prefix, and suppression names "
                f"codes in full: write {', '.join(r for r in known if r.startswith(code))}"
            )
        else:
            close = [rule for rule in known if _close(code, rule)]
            hint = f"; did you mean {', '.join(close)}?" if close else "; `perfmod rules` lists the codes"
            problems.append(f"`{code}` in `{directive.name}` is no perfmod rule, so it suppresses nothing{hint}")
    return problems


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

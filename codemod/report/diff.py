"""Unified diffs of a file's bytes before and after, over decoded text."""

from __future__ import annotations

import difflib
import io
import os
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

import click

from codemod.result import FileResult

NO_NEWLINE = "\\ No newline at end of file\n"


def decode(data: bytes) -> str:
    """The text of Python source bytes, by its BOM or coding cookie as Python reads it."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return data.decode("utf-8", errors="replace")


def unified_diff(path: str, before: bytes, after: bytes) -> str:
    """`--- a/path` / `+++ b/path` diff, as `git apply` and `patch -p1` take it;
    empty when nothing changed. Line endings are kept as they are in the file."""
    old_name, new_name = _headers(path)
    lines = difflib.unified_diff(
        decode(before).splitlines(keepends=True),
        decode(after).splitlines(keepends=True),
        fromfile=old_name,
        tofile=new_name,
    )
    return "".join(line if line.endswith("\n") else line + "\n" + NO_NEWLINE for line in lines)


def _headers(path: str) -> tuple[str, str]:
    if os.path.isabs(path):
        return path, path  # a prefix would name another file for `patch -p1`
    posix = PurePath(os.path.normpath(path)).as_posix()
    return f"a/{posix}", f"b/{posix}"


DIFF_STYLES = (
    ("+++", {"bold": True}),
    ("---", {"bold": True}),
    ("@@", {"fg": "cyan"}),
    ("+", {"fg": "green"}),
    ("-", {"fg": "red"}),
)


def colorize(diff: str) -> str:
    """The diff with ANSI colours: headers bold, hunks cyan, additions green, removals red."""
    out = []
    for line in diff.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        ending = line[len(body) :]
        style = next((s for prefix, s in DIFF_STYLES if body.startswith(prefix)), None)
        out.append((click.style(body, **style) if style else body) + ending)
    return "".join(out)


@dataclass(frozen=True)
class Change:
    """Lines of the original file a fix replaces, and what it writes there."""

    first: int  # first line replaced (1-based); for an insertion, the line it goes before
    last: int  # last line replaced; first - 1 for an insertion
    text: str  # the new lines, with their line endings
    offset: int  # characters before `first` in the original text
    length: int  # characters of the lines replaced


def fix_changes(result: FileResult) -> list[list[Change]]:
    """For each finding of `result`, in order, the changes its applied fix made
    (none for a finding whose fix was not applied): the diff's changes that
    meet the lines the engine says the fix rewrites."""
    per_finding: list[list[Change]] = [[] for _ in result.findings]
    if not result.changed or result.error is not None:
        return per_finding
    old = decode(result.source).splitlines(keepends=True)
    new = decode(result.new_source).splitlines(keepends=True)
    starts = [0]
    for line in old:
        starts.append(starts[-1] + len(line))
    opcodes = [op for op in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if op[0] != "equal"]
    for number, finding in enumerate(result.findings):
        if not finding.applied:
            continue
        for _, i1, i2, j1, j2 in opcodes:
            if any(meets((i1, i2), span) for span in finding.fix_lines):
                per_finding[number].append(Change(i1 + 1, i2, "".join(new[j1:j2]), starts[i1], starts[i2] - starts[i1]))
    return per_finding


def unattributed_changes(result: FileResult) -> list[str]:
    """The diff's changes that lie in no applied finding's fix lines ("old lines
    i1:i2 -> new text"); empty when every change is some finding's."""
    if not result.changed or result.error is not None:
        return []
    old = decode(result.source).splitlines(keepends=True)
    new = decode(result.new_source).splitlines(keepends=True)
    spans = [span for finding in result.findings if finding.applied for span in finding.fix_lines]
    return [
        f"lines {i1 + 1}-{i2}: {''.join(new[j1:j2])!r}"
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
        if tag != "equal" and not any(meets((i1, i2), span) for span in spans)
    ]


def meets(lines: tuple[int, int], span: Sequence[int]) -> bool:
    """Do original lines [i1, i2) (0-based; i1 == i2: the point before line i1 + 1)
    meet a fix's span (first, last), 1-based and inclusive? An insertion meets the
    span it is next to; an empty span (first == last + 1: an insertion before line
    `first`) meets the changes that reach the point where it goes."""
    (i1, i2), (first, last) = lines, span
    if first > last:
        return i1 <= first - 1 <= i2
    if i1 == i2:
        return first - 1 <= i1 <= last
    return i1 < last and first - 1 < i2

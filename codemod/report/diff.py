"""Unified diffs of a file's bytes before and after, over decoded text."""

from __future__ import annotations

import difflib
import io
import os
import tokenize
from pathlib import PurePath

import click

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


DIFF_STYLES = (("+++", {"bold": True}), ("---", {"bold": True}), ("@@", {"fg": "cyan"}),
               ("+", {"fg": "green"}), ("-", {"fg": "red"}))


def colorize(diff: str) -> str:
    """The diff with ANSI colours: headers bold, hunks cyan, additions green, removals red."""
    out = []
    for line in diff.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        ending = line[len(body):]
        style = next((s for prefix, s in DIFF_STYLES if body.startswith(prefix)), None)
        out.append((click.style(body, **style) if style else body) + ending)
    return "".join(out)

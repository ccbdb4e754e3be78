"""What processing a file produces: levels, findings and the file's result.

A leaf module: the engine, the rules, the reports and the command line all
import it, and it imports none of them.
"""

from __future__ import annotations

import enum
import os
import sys
from typing import NamedTuple

# SHA-256 without `import hashlib`, which loads OpenSSL: a tenth of a cached run's own start-up.
# CPython's built-in SHA-256 module gives the same digests; hashlib where it is absent.
try:
    if sys.version_info >= (3, 12):
        from _sha2 import sha256
    else:
        from _sha256 import sha256
except ImportError:  # pragma: no cover - a Python without them
    from hashlib import sha256


def digest(data: bytes) -> str:
    """The SHA-256 of `data`, in hex (as hashlib.sha256(data).hexdigest())."""
    return sha256(data).hexdigest()


class Level(enum.IntEnum):
    """How far a fix may change results; `--level` applies fixes up to this one."""

    SAFE = 0  # same results bit for bit; only timing changes
    NUMERIC = 1  # same computation in other floating point: within tolerance
    UNSAFE = 2  # may change behaviour in cases the analysis cannot rule out

    @classmethod
    def parse(cls, text: str) -> Level:
        try:
            return cls[text.strip().upper()]
        except (KeyError, AttributeError):
            names = ", ".join(level.label for level in cls)
            raise ValueError(f"unknown level {text!r}; expected one of: {names}") from None

    @property
    def label(self) -> str:
        return self.name.lower()


class Finding(NamedTuple):  # a named tuple: a tenth of a frozen dataclass's cost to define
    """One place a rule reports, with or without a fix (`finding._replace(...)` for
    a changed copy)."""

    path: str
    line: int
    column: int  # 1-based, as editors and SARIF count
    code: str
    name: str
    message: str
    level: Level  # the level its fix needs (the rule's level unless the site asks for more)
    fixable: bool
    applied: bool = False
    end_line: int = 0  # last line of the offending code (0: same as `line`)
    end_column: int = 0  # 1-based, exclusive
    # Spans of lines (first, last) of the original file that the applied fix rewrites,
    # or next to which it inserts lines (an import goes after the imports at the top).
    fix_lines: tuple[tuple[int, int], ...] = ()
    # The code of the rule whose fix replaces this finding's code and does its work
    # (applied by that fix, not by one of its own); empty otherwise.
    fixed_by: str = ""

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


class Stamp(NamedTuple):
    """What a cached result read from a project file: its path, size, time and hash."""

    path: str
    size: int
    mtime_ns: int
    digest: str

    def fresh(self) -> bool:
        """Does the file still hold what it held (same size and time, or same bytes)?"""
        try:
            info = os.stat(self.path)
        except OSError:
            return False
        if info.st_size == self.size and info.st_mtime_ns == self.mtime_ns:
            return True
        if info.st_size != self.size:
            return False
        try:
            with open(self.path, "rb") as handle:
                return digest(handle.read()) == self.digest
        except OSError:
            return False


class FileResult:
    """One file's findings and new source, or why it could not be processed. A plain
    class: a dataclass takes about half a millisecond to define, which every run pays."""

    __slots__ = ("path", "source", "new_source", "findings", "error", "dependencies")

    def __init__(
        self,
        path: str,
        source: bytes,
        new_source: bytes | None = None,
        findings: list[Finding] | None = None,
        error: str | None = None,
        dependencies: tuple = (),
    ) -> None:
        self.path, self.source, self.new_source = path, source, new_source
        self.findings: list[Finding] = [] if findings is None else findings
        self.error = error  # "path:line:col: error: ..." when the file could not be processed
        # Other files of the project the findings were computed from (Stamp):
        # a cached result is stale when one of them changed.
        self.dependencies = dependencies

    def __repr__(self) -> str:
        return f"FileResult({self.path!r}, {len(self.findings)} findings, error={self.error!r})"

    @property
    def changed(self) -> bool:
        return self.new_source is not None and self.new_source != self.source

    @property
    def pending(self) -> list[Finding]:
        """Findings whose fix applies at the chosen level."""
        return [f for f in self.findings if f.applied]


class SourceError(Exception):
    """A file that cannot be decoded or parsed; `str()` is `line:col: message`."""

    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__(f"{line}:{column}: {message}")
        self.line, self.column, self.message = line, column, message

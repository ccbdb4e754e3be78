"""One file's analysis as the command line needs it: the engine's result, the
warnings about its suppression comments, and what CPython thinks of it.

Deep but valid code (a 500-term `a + b + ...`, 150 nested calls) is deeper
than Python's default recursion limit lets libcst walk, so the engine runs in
a thread with a large stack and a raised limit, as other libcst tools do.
Code that is still too deep gets a note and is left alone (not an error).
Code that CPython itself rejects (it does not compile at Python's default
limit, or a rule of the compiler rather than the grammar: `return` outside a
function, too many nested blocks) is an error, never "no findings"; the error
names the Python that rejects it. A file that uses syntax newer than the
running Python (codemod/syntax.py: PEP 695 type parameters, PEP 701 f-strings
under Python 3.11) is judged by libcst's grammar, which has that syntax: the
running compiler cannot read it, so its check is skipped rather than taken for
a verdict.

The engine (libcst and the rules) is imported when the first file is analysed,
not with this module: a run whose every result is in the cache never needs it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

from codemod.result import FileResult

if TYPE_CHECKING:
    from codemod.config import Settings

STACK_SIZE = 512 * 1024 * 1024  # bytes; reserved, not used, until the recursion needs it
RECURSION_LIMIT = 100_000


class Outcome(NamedTuple):  # a named tuple: a tenth of a dataclass's cost to define, which a cached run pays
    result: FileResult
    warnings: Sequence[str] = ()  # "path:line: warning: ..." (suppression comments)
    note: str | None = None  # "path:1:1: note: ..." when the file was left alone but that is no error


def analyse(data: bytes, path: str, settings: Settings, known: Sequence[str]) -> Outcome:
    """The engine's result for one file's bytes, checked against CPython, with
    the suppression warnings; in this thread, whatever its stack."""
    from codemod.suppression import suppression_warnings
    from codemod.syntax import TOO_DEEP, compile_error, newer_syntax_of, running_python

    process_source = load_engine()
    rejected = compile_error(data)
    if rejected is not None and rejected[2] == TOO_DEEP:  # nor could libcst: do not try for minutes
        error = f"{path}:1:1: error: {running_python()} rejects this file: {TOO_DEEP}"
        return Outcome(FileResult(path=path, source=data, error=error))
    try:
        result = process_source(data, path, settings)
    except RecursionError:
        result = FileResult(path=path, source=data, error=f"{path}:1:1: error: internal error (RecursionError)")
    outcome = Outcome(
        result, [f"{path}:{line}: warning: {message}" for line, message in suppression_warnings(data, known)]
    )
    if result.error is not None and "RecursionError" in result.error and "internal error" in result.error:
        if rejected is None:
            result.error, result.findings, result.new_source = None, [], data
            return outcome._replace(
                note=f"{path}:1:1: note: too deep to analyse (nested deeper than perfmod's recursion "
                f"limit of {sys.getrecursionlimit()}); left unchanged"
            )
    if rejected is not None and (result.error is None or "internal error" in result.error):
        if newer_syntax_of(data) is not None:
            return outcome  # the running Python cannot read it: libcst's grammar, which can, has judged
        line, column, message = rejected
        result.error, result.findings, result.new_source = (
            f"{path}:{line}:{column}: error: {running_python()} rejects this file: {message}",
            [],
            None,
        )
    return outcome


def load_engine():
    """The engine's entry point (`process_source`), imported on first use: it
    imports libcst and every rule."""
    return globals().get("process_source") or __getattr__("process_source")


def __getattr__(name: str):
    """`process_source`, the engine's entry point, imported when first asked for
    (PEP 562), by `analyse` or by a test that replaces it."""
    if name == "process_source":
        from codemod.engine import process_source

        globals()[name] = process_source
        return process_source
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextmanager
def deep_recursion() -> Iterator[None]:
    """Python's recursion limit raised to RECURSION_LIMIT (it is process-wide),
    for DeepThreads; put back afterwards."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, RECURSION_LIMIT))
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


def analyse_deep(data: bytes, path: str, settings: Settings, known: Sequence[str]) -> Outcome:
    """`analyse` in a new thread with a large stack; call it under deep_recursion()."""
    thread = DeepThread(data, path, settings, known)
    thread.start()
    thread.join()
    return thread.outcome()


class DeepThread(threading.Thread):
    """A daemon thread that analyses one file with a large stack (under
    deep_recursion()); `join` it, with a timeout to stay responsive, then read
    `outcome()`. A daemon, so that an interrupted run need not wait for it."""

    _lock = threading.Lock()

    def __init__(self, data: bytes, path: str, settings: Settings, known: Sequence[str]) -> None:
        super().__init__(daemon=True, name=f"perfmod {path}")
        self.args_ = (data, path, settings, known)
        self._outcome: Outcome | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        with DeepThread._lock:  # stack_size is process-wide: set it for this thread only
            previous = threading.stack_size(STACK_SIZE)
            try:
                super().start()
            finally:
                threading.stack_size(previous)

    def run(self) -> None:
        try:
            self._outcome = analyse(*self.args_)
        except BaseException as error:  # handed to the thread that waits
            self._error = error

    def outcome(self) -> Outcome:
        if self._error is not None:
            raise self._error
        assert self._outcome is not None, "outcome() before the thread finished"
        return self._outcome

"""Which Python a file is written for, and what the running interpreter can say about it.

perfmod reads files with libcst's parser, whose grammar is the newest Python's
it knows, whatever Python perfmod runs on: libcst 1.1 and later read PEP 695
type parameters and `type` aliases and PEP 701 f-strings (Python 3.12) under
Python 3.10 and 3.11 too. The running interpreter's compiler is asked only what
the grammar does not say: code nested too deeply for Python to compile, and
the compiler's own rules (`return` outside a function, too many nested
blocks). It can answer only for files it can read: on a file that uses syntax
newer than the running Python (`newer_syntax`) it fails on that syntax first.
Such a file is then judged by libcst's grammar alone; what only the compiler
checks is left to the Python the file is written for (run perfmod under that
Python for those checks too).

`compile_error` is the compiler's verdict, at Python's default recursion limit
(what `python script.py` compiles at); `newer_syntax` names the newest syntax a
module uses that the running Python lacks.
"""

from __future__ import annotations

import ast
import sys
import warnings
from dataclasses import dataclass

import libcst as cst

RUNNING = sys.version_info[:2]
PYTHON_RECURSION_LIMIT = 1000  # CPython's default: `python script.py` compiles at this limit
TOO_DEEP = "nested too deeply for Python to compile (RecursionError at its default recursion limit)"


def running_python() -> str:
    return f"Python {RUNNING[0]}.{RUNNING[1]}"


def compile_error(data: bytes | str) -> tuple[int, int, str] | None:
    """Where and why the running Python refuses to compile `data` at its default
    recursion limit, as (line, column, message); None when it compiles."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(PYTHON_RECURSION_LIMIT)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like are not ours to report
            compile(data, "<perfmod>", "exec", dont_inherit=True)
    except SyntaxError as error:
        return error.lineno or 1, error.offset or 1, error.msg
    except (RecursionError, MemoryError):
        return 1, 1, TOO_DEEP
    except ValueError as error:  # null bytes
        return 1, 1, str(error)
    finally:
        sys.setrecursionlimit(limit)
    return None


@dataclass(frozen=True)
class Newer:
    """Syntax of a Python newer than the running one."""

    version: tuple[int, int]
    what: str

    @property
    def python(self) -> str:
        return f"Python {self.version[0]}.{self.version[1]}"

    def __str__(self) -> str:
        return f"{self.what} ({self.python})"


def newer_syntax(module: cst.Module) -> Newer | None:
    """The syntax of the newest Python that `module` uses, where that Python is
    newer than the running one (the first such construct of that version); None
    when the running Python has all the syntax the module uses."""
    finder = _NewerSyntax()
    module.visit(finder)
    return finder.newest


def newer_syntax_of(data: bytes) -> Newer | None:
    """`newer_syntax` of the file's bytes; None also where libcst cannot read them
    (then nothing says that they are written for a newer Python)."""
    try:
        module = cst.parse_module(data)
    except (cst.ParserSyntaxError, SyntaxError, UnicodeDecodeError, LookupError, RecursionError, MemoryError):
        return None
    try:
        return newer_syntax(module)
    except RecursionError:
        return None


class _NewerSyntax(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.newest: Newer | None = None

    def _found(self, version: tuple[int, int], what: str) -> None:
        if version > RUNNING and (self.newest is None or version > self.newest.version):
            self.newest = Newer(version, what)

    def visit_TryStar(self, node: cst.TryStar) -> None:
        self._found((3, 11), "`except*` (PEP 654)")

    def visit_TypeAlias(self, node: cst.TypeAlias) -> None:
        self._found((3, 12), "a `type` alias (PEP 695)")

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.type_parameters is not None:
            self._found((3, 12), f"type parameters of `{node.name.value}` (PEP 695)")

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if node.type_parameters is not None:
            self._found((3, 12), f"type parameters of `{node.name.value}` (PEP 695)")

    def visit_TypeParam(self, node: cst.TypeParam) -> None:
        if getattr(node, "default", None) is not None:  # libcst 1.4 and later
            self._found((3, 13), "a type parameter default (PEP 696)")

    def visit_TemplatedString(self, node: cst.CSTNode) -> None:  # libcst 1.8 and later
        self._found((3, 14), "a template string (PEP 750)")

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if isinstance(node.type, cst.Tuple) and not node.type.lpar:
            self._found((3, 14), "`except` with exception types not in parentheses (PEP 758)")

    def visit_ExceptStarHandler(self, node: cst.ExceptStarHandler) -> None:
        if isinstance(node.type, cst.Tuple) and not node.type.lpar:
            self._found((3, 14), "`except*` with exception types not in parentheses (PEP 758)")

    def visit_FormattedString(self, node: cst.FormattedString) -> bool:
        # PEP 701 (3.12) lets an f-string's replacement fields hold its own quotes, backslashes,
        # comments and line breaks, and nest without limit. Whether the running Python reads
        # this one is what its own parser says of the f-string alone.
        if RUNNING < (3, 12) and _unreadable(cst.Module([]).code_for_node(node)):
            self._found(
                (3, 12),
                "an f-string that reuses its quotes, or holds a backslash, a comment or a line break, "
                "inside its braces (PEP 701)",
            )
        return False  # the f-strings inside were read with this one


def _unreadable(expression: str) -> bool:
    """Whether the running Python's parser refuses the f-string `expression` on its
    own, for what PEP 701 allows (not for a limit that Python 3.12 keeps too)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(f"(\n{expression}\n)", "<perfmod>", "eval", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as error:
        return "nested too deeply" not in (error.msg or "")
    except (ValueError, RecursionError, MemoryError):
        return False
    return False

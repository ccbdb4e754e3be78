"""Files -> parse once -> run the selected rules -> findings + new source.

The engine is the only code that reads and writes files. Each pass runs every
selected rule in one batched traversal, applies the fixes allowed at the chosen
level that do not overlap, and repeats on the new tree until no fix is left, so
that a second run of perfmod finds nothing to change.
"""

from __future__ import annotations

import ast
import io
import os
import re
import stat
import tempfile
import tokenize
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import MetadataWrapper

from codemod.config import Settings
from codemod.context import FileContext
from codemod.rule import Finding, Report, Rule
from codemod.rules import ALL_RULES

MAX_PASSES = 5
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".tox", ".nox", "build", "dist",
             "node_modules", ".mypy_cache", ".pytest_cache", ".eggs", "site-packages"}
SUPPRESSION = re.compile(r"#\s*perfmod:\s*ignore(?:\[(?P<codes>[A-Z0-9,\s]+)\])?", re.I)


@dataclass
class FileResult:
    path: str
    source: bytes
    new_source: bytes | None = None
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None  # "path:line:col: error: ..." when the file could not be processed

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


# -- one source ----------------------------------------------------------------------


def parse(data: bytes) -> cst.Module:
    try:
        return cst.parse_module(data)
    except cst.ParserSyntaxError as error:
        line, column, message = _python_syntax_error(data) or (error.editor_line, error.editor_column, error.message)
        raise SourceError(line, column, f"syntax error: {message}") from None
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        line, column = _decode_error_position(data)
        raise SourceError(line, column, f"cannot decode: {error}") from None


def _python_syntax_error(data: bytes) -> tuple[int, int, str] | None:
    """Where CPython's parser places the error, with its message: libcst reports
    tokenizer errors (an unclosed bracket, a stray character) at 1:1 and gives
    no column at all. None when CPython accepts what libcst does not."""
    try:
        compile(data, "<perfmod>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as error:
        if error.lineno:
            return error.lineno, error.offset or 1, error.msg
    except ValueError:  # null bytes: libcst's own report stands
        pass
    return None


def _decode_error_position(data: bytes) -> tuple[int, int]:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        data.decode(encoding)
    except UnicodeDecodeError as error:
        before = data[: error.start]
        return before.count(b"\n") + 1, len(before) - (before.rfind(b"\n") + 1) + 1
    except (SyntaxError, LookupError):
        pass
    return 1, 1


def selected_rules(settings: Settings, path: str, rules: Sequence[type[Rule]] | None = None) -> list[type[Rule]]:
    return [rule for rule in (rules if rules is not None else ALL_RULES) if settings.enabled(rule.CODE, path, opt_in=rule.OPT_IN)]


def process_source(
    data: bytes, path: str, settings: Settings, rules: Sequence[type[Rule]] | None = None
) -> FileResult:
    """Analyse and fix one file's bytes; never raises for bad input."""
    result = FileResult(path=path, source=data)
    try:
        module = parse(data)
    except SourceError as error:
        result.error = f"{path}:{error.line}:{error.column}: error: {error.message}"
        return result
    active = selected_rules(settings, path, rules)
    if not active:
        result.new_source = data
        return result
    parsed, changed = module, False
    try:
        for number in range(MAX_PASSES):
            code = module.code
            # Comments move with the code, so suppressions are read again on every pass.
            suppressed = _suppressions(code) if "perfmod" in code else {}
            candidates = [rule for rule in active if not rule.REQUIRES or any(text in code for text in rule.REQUIRES)]
            module, findings, applied = _run_pass(module, code, path, settings, candidates, suppressed,
                                                  fresh=number == 0)
            if number == 0:
                result.findings = findings  # later passes only finish fixes deferred by overlaps
            if not applied:
                break
            changed = True
        else:
            codes = sorted({f.code for f in findings if f.applied})
            raise RuntimeError(f"fixes of {', '.join(codes)} keep rewriting after {MAX_PASSES} passes")
        if not changed:
            result.new_source = data  # libcst does not give back every file byte for byte
            return result
        if parsed.bytes != data:
            result.findings = []
            result.error = (f"{path}:1:1: error: libcst cannot write this file back byte for byte (typically "
                            "whitespace after the last newline), so its fixes are not applied and it is left unchanged; "
                            "end the file with a newline and run perfmod again")
            return result
        result.new_source = module.bytes
    except Exception as error:  # a bug in a rule must not cost the user their file
        result.findings, result.new_source = [], None
        result.error = (f"{path}:1:1: error: internal error, file left unchanged ({type(error).__name__}: {error}); "
                        "please report it with this file, or skip it with --ignore or `exclude`")
    return result


def _run_pass(module, code, path, settings, rules, suppressed, fresh: bool) -> tuple[cst.Module, list[Finding], bool]:
    if not rules:
        return module, [], False
    # A freshly parsed tree has unique nodes; a rewritten one may share some, so copy it.
    wrapper = MetadataWrapper(module, unsafe_skip_copy=fresh)
    module = wrapper.module
    context = FileContext(wrapper, path, settings, code)
    instances = [rule(context) for rule in rules]
    wrapper.visit_batched(instances)
    reports = [r for rule in instances for r in rule.reports]
    positions = context.positions
    findings, fixes = [], []
    for report in reports:
        start = positions[report.location].start
        if _is_suppressed(suppressed, start.line, report.code):
            continue
        applies = report.replacement is not None and report.level <= settings.level
        findings.append(
            Finding(path, start.line, start.column + 1, report.code, report.name, report.message,
                    report.level, report.replacement is not None, applies)
        )
        if applies:
            fixes.append(report)
    findings.sort(key=lambda f: (f.line, f.column, f.code))
    accepted = _without_overlaps(fixes, context.parents)
    if not accepted:
        return module, findings, False
    new_module = module.visit(_Replace({id(r.node): r.replacement for r in accepted}))
    imports = {item for r in accepted for item in r.imports}
    if imports:
        codemod_context = CodemodContext()
        for module_name, obj in sorted(imports, key=lambda i: (i[0], i[1] or "")):
            AddImportsVisitor.add_needed_import(codemod_context, module_name, obj)
        new_module = AddImportsVisitor(codemod_context).transform_module(new_module)
    return _without_released_imports(new_module, wrapper, accepted), findings, True


def _without_released_imports(new_module: cst.Module, wrapper: MetadataWrapper, fixes: list[Report]) -> cst.Module:
    """Remove the imports that the replaced code used and nothing uses any more
    (`import gc` after the last `gc.collect()` goes); imports the user still
    uses, or never used, stay."""
    context = CodemodContext(wrapper=wrapper)
    for report in fixes:
        try:
            RemoveImportsVisitor.remove_unused_import_by_node(context, report.node)
        except ValueError:  # a relative import: its absolute module is unknown, so leave it
            continue
    if not context.scratch.get(RemoveImportsVisitor.CONTEXT_KEY):
        return new_module
    return RemoveImportsVisitor(context).transform_module(new_module)


def _without_overlaps(fixes: list[Report], parents) -> list[Report]:
    """Keep fixes whose nodes neither contain nor sit inside another kept fix;
    deeper nodes first. The rest wait for the next pass, on the updated tree."""

    def ancestors(node):
        node = parents.get(node)
        while node is not None:
            yield node
            node = parents.get(node)

    chains = {id(r.node): [id(a) for a in ancestors(r.node)] for r in fixes}
    kept: list[Report] = []
    kept_ids: set[int] = set()
    kept_ancestors: set[int] = set()
    for report in sorted(fixes, key=lambda r: -len(chains[id(r.node)])):
        chain = chains[id(report.node)]
        if id(report.node) in kept_ids or id(report.node) in kept_ancestors or kept_ids.intersection(chain):
            continue
        kept.append(report)
        kept_ids.add(id(report.node))
        kept_ancestors.update(chain)
    return kept


class _Replace(cst.CSTTransformer):
    def __init__(self, replacements: dict) -> None:
        super().__init__()
        self.replacements = replacements

    def on_leave(self, original_node, updated_node):
        return self.replacements.get(id(original_node), updated_node)


def _suppressions(code: str) -> dict[int, set[str] | None]:
    """Line -> suppressed codes (None: all) from `# perfmod: ignore[...]` comments."""
    found: dict[int, set[str] | None] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return found
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        match = SUPPRESSION.search(token.string)
        if match:
            codes = match.group("codes")
            found[token.start[0]] = {c.strip().upper() for c in codes.split(",") if c.strip()} if codes else None
    return found


def _is_suppressed(suppressed: dict, line: int, code: str) -> bool:
    if line not in suppressed:
        return False
    codes = suppressed[line]
    return codes is None or code in codes


# -- files ------------------------------------------------------------------------------


def discover(paths: Iterable[Path], settings: Settings) -> Iterator[Path]:
    """Python files under `paths`, skipping VCS folders, virtual environments,
    build output and the configured `exclude` patterns. Files named directly are
    always taken, as ruff does."""
    for path in paths:
        if path.is_dir():
            yield from _walk(path, settings)
        else:
            yield path


def _walk(folder: Path, settings: Settings) -> Iterator[Path]:
    for root, dirs, files in os.walk(folder):
        root_path = Path(root)
        dirs[:] = sorted(
            d for d in dirs
            if d not in SKIP_DIRS and not d.endswith(".egg-info")
            and not (root_path / d / "pyvenv.cfg").exists()
            and not settings.excluded(root_path / d)
        )
        for name in sorted(files):
            if name.endswith(".py") and not settings.excluded(root_path / name):
                yield root_path / name


def process_file(path: Path, settings: Settings, write: bool) -> FileResult:
    try:
        data = path.read_bytes()
    except OSError as error:
        return FileResult(path=str(path), source=b"", error=f"{path}:1:1: error: cannot read: {error.strerror or error}")
    result = process_source(data, str(path), settings)
    if result.error is None and write and result.changed:
        try:
            atomic_write(path, result.new_source)
        except OSError as error:
            result.error = f"{path}:1:1: error: cannot write: {error.strerror or error}"
    return result


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename over the original,
    keeping its permission bits (a new file gets open()'s): a crash leaves the old
    file or the new, never half.
    A symbolic link is followed, so the link stays and its target gets the new text."""
    path = Path(os.path.realpath(path))
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else _new_file_mode()
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".perfmod", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def _new_file_mode() -> int:
    """The permission bits open() would give a new file (0o666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def process_files(
    paths: Sequence[Path],
    settings: Settings,
    write: bool,
    jobs: int = 1,
    on_result: Callable[[FileResult], None] | None = None,
) -> list[FileResult]:
    """Process files, in parallel when `jobs > 1`; results come back in input order."""
    if jobs <= 1 or len(paths) < 2:
        results = []
        for path in paths:
            results.append(process_file(path, settings, write))
            if on_result:
                on_result(results[-1])
        return results
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = []
        chunk = max(1, min(32, len(paths) // (jobs * 4)))
        for result in pool.map(process_file, paths, [settings] * len(paths), [write] * len(paths), chunksize=chunk):
            results.append(result)
            if on_result:
                on_result(result)
        return results

"""Files -> parse once -> run the selected rules -> findings + new source.

The engine is the only code that reads and writes files. Each pass runs every
selected rule in one batched traversal, applies the fixes allowed at the chosen
level that do not overlap, and repeats on the new tree until no fix is left, so
that a second run of perfmod finds nothing to change.
"""

from __future__ import annotations

import ast
import io
import tokenize
from typing import Sequence

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import MetadataWrapper

from codemod.config import Settings
from codemod.context import FileContext
from codemod.result import FileResult, Finding, SourceError
from codemod.rule import Report, Rule
from codemod.suppression import is_suppressed as _is_suppressed, suppressions as _suppressions
from codemod.rules import ALL_RULES

MAX_PASSES = 5




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

"""One file's bytes -> findings and the rewritten bytes.

    parse once -> FileContext (lazy analyses) -> every selected rule visits the
    tree in one shared walk -> each finding carries its edits -> the scope guard
    and the conflict plan keep the fixes that can be applied together -> one
    transform applies them -> imports added and released -> new bytes, which must
    compile (with the running Python where it reads the file, else by libcst's
    grammar, codemod/syntax.py), or the file is left unchanged with an error

A rule that must see another rule's fixes applied declares it (`Rule.AFTER`).
Every rule runs in the first pass; where a rule it waits for has a fix there,
its findings of that pass are dropped and it runs again on the rewritten file.
Those passes make a round; a round whose fixes changed the file is followed by
another round of every rule on the result, until the file stops changing (at
most MAX_ROUNDS), so that one run does what a second `perfmod apply` would. A
file without fixes takes one pass. With `Settings.fixed_point` off (`perfmod check`,
as ruff's check) the first round is the last: its findings and exit status, no
second round. The engine never writes files (codemod.files does).
"""

from __future__ import annotations

import ast
import difflib
import gc
import io
import re
import tokenize
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import chain
from pathlib import Path

import libcst as cst

from codemod import edits as edit_model
from codemod import guard, layout
from codemod import imports as import_edits
from codemod.analysis.index import TreeIndex
from codemod.analysis.project import project_dependencies
from codemod.analysis.visits import read_only_visits
from codemod.config import Settings
from codemod.context import FileContext
from codemod.edits import Fix, InsertAfter, InsertBefore, Wrap
from codemod.result import FileResult, Finding, SourceError
from codemod.rule import Report, Rule
from codemod.rules import ALL_RULES
from codemod.suppression import is_suppressed, suppressions
from codemod.syntax import compile_error, running_python
from codemod.writeback import written

NUMBER = re.compile(r"\d+")
LIBCST_ERROR_AT = re.compile(r"\berror at (\d+):(\d+)")
# "line 12", "lines 4-6", "lines 3, 5 and 9" in a message: lines of the file it is about.
LINE_REFERENCE = re.compile(r"\blines? \d+(?:(?:-|, | and )\d+)*\b")
RUNTIME_PACKAGE = "runtime"
# perfmod's runtime says so in its docstring; a project's own `runtime` does not.
RUNTIME_MARK = "What rewritten training code calls"
# Rounds of every rule until the file stops changing: the last one only reports what it
# would still fix (ruff's --fix makes rounds the same way).
MAX_ROUNDS = 5
# A rewritten line maps to the original line it is most like, in a changed run of at most
# SIMILAR_RUN lines, when at least this like it (difflib's ratio).
SIMILAR, SIMILAR_RUN = 0.4, 200
# Stretches between anchors longer than this are anchored within themselves before difflib
# compares them (`_runs`).
LONG_STRETCH = 400
# Where no line anchors such a stretch, the lines in step are followed, and where they
# differ, the nearest place within this many lines where SAME_RUN lines agree again.
RESYNC_WINDOW, SAME_RUN = 400, 3

# -- parsing ------------------------------------------------------------------------------


def parse(data: bytes) -> cst.Module:
    try:
        return cst.parse_module(data)
    except cst.ParserSyntaxError as error:
        line, column, message = _python_syntax_error(data, error) or (*_libcst_position(error), error.message)
        raise SourceError(line, column, f"syntax error: {message}") from None
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        line, column = _decode_error_position(data)
        raise SourceError(line, column, f"cannot decode: {error}") from None


def _python_syntax_error(data: bytes, error: cst.ParserSyntaxError) -> tuple[int, int, str] | None:
    """Where CPython's parser places the error, with its message: libcst reports
    tokenizer errors (an unclosed bracket, a stray character) at 1:1 and gives
    no column at all. None when CPython accepts what libcst does not, and where
    CPython stops on a line before libcst's error in code that libcst reads: syntax
    newer than the running Python (codemod/syntax.py), which is no error."""
    try:
        compile(data, "<perfmod>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as python:
        if not python.lineno:
            return None
        line = _libcst_position(error)[0]
        if python.lineno < line and _reads_lines(data, line - 1):
            return None
        return python.lineno, python.offset or 1, python.msg
    except ValueError:  # null bytes: libcst's own report stands
        pass
    return None


def _libcst_position(error: cst.ParserSyntaxError) -> tuple[int, int]:
    """Where libcst's parser failed, as its message says ("error at LINE:COLUMN"); the
    line it gives apart can be that of the next token."""
    at = LIBCST_ERROR_AT.search(error.message)
    return (int(at[1]), max(int(at[2]), 1)) if at else (error.editor_line, error.editor_column)


def _reads_lines(data: bytes, count: int) -> bool:
    """Whether libcst reads the first `count` lines of the file."""
    try:
        cst.parse_module(b"".join(data.splitlines(keepends=True)[:count]))
    except (cst.ParserSyntaxError, SyntaxError, UnicodeDecodeError, LookupError):
        return False
    return True


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


# -- rules --------------------------------------------------------------------------------


def selected_rules(settings: Settings, path: str, rules: Sequence[type[Rule]] | None = None) -> list[type[Rule]]:
    return [
        rule
        for rule in (rules if rules is not None else ALL_RULES)
        if settings.enabled(rule.CODE, path, opt_in=rule.OPT_IN)
    ]


def passes(rules: Sequence[type[Rule]]) -> list[list[type[Rule]]]:
    """The rules grouped by the last pass they can run in (each one pass after the
    latest of the selected rules it names in `AFTER`): the most passes a file takes,
    when every rule waited for has a fix. ValueError on a cycle of declarations."""
    by_code = {rule.CODE: rule for rule in rules}
    depth: dict[str, int] = {}

    def depth_of(rule: type[Rule], seen: tuple[str, ...] = ()) -> int:
        if rule.CODE in seen:
            raise ValueError(f"rules wait for each other's fixes in a cycle: {' -> '.join([*seen, rule.CODE])}")
        if rule.CODE not in depth:
            earlier = [by_code[code] for code in rule.AFTER if code in by_code]
            depth[rule.CODE] = 1 + max((depth_of(r, (*seen, rule.CODE)) for r in earlier), default=-1)
        return depth[rule.CODE]

    groups: dict[int, list[type[Rule]]] = {}
    for rule in rules:
        groups.setdefault(depth_of(rule), []).append(rule)
    return [groups[number] for number in sorted(groups)]


def _dispatch(index: TreeIndex, instances: Sequence[Rule]) -> None:
    """Call every rule's visit_/leave_ methods in one walk, in document order
    (a node is left after everything inside it)."""
    visits: dict[type, list] = {}
    leaves: dict[type, list] = {}
    for instance in instances:
        rule_visits, rule_leaves = type(instance).hooks()
        for node_type, name in rule_visits.items():
            visits.setdefault(node_type, []).append(getattr(instance, name))
        for node_type, name in rule_leaves.items():
            leaves.setdefault(node_type, []).append(getattr(instance, name))
    if not leaves:
        for node in index.find(tuple(visits)) if visits else ():
            for hook in visits[type(node)]:
                hook(node)
        return
    wanted = tuple({*visits, *leaves})
    open_nodes: list[tuple[int, cst.CSTNode]] = []  # (last descendant, node) of nodes to leave
    for node in index.find(wanted):
        at = index.order(node)
        while open_nodes and open_nodes[-1][0] < at:
            _leave(open_nodes.pop()[1], leaves)
        for hook in visits.get(type(node), ()):
            hook(node)
        if type(node) in leaves:
            open_nodes.append((index.end(node), node))
    while open_nodes:
        _leave(open_nodes.pop()[1], leaves)


def _leave(node: cst.CSTNode, leaves: dict[type, list]) -> None:
    for hook in leaves[type(node)]:
        hook(node)


# -- one file -------------------------------------------------------------------------


def process_source(data: bytes, path: str, settings: Settings, rules: Sequence[type[Rule]] | None = None) -> FileResult:
    """Analyse and fix one file's bytes; never raises for bad input."""
    result = FileResult(path=path, source=data)
    collecting = gc.isenabled()
    # The parser and the analyses build millions of objects and no garbage cycles worth
    # a collection mid-file; with collections on, parsing alone takes about twice as long.
    gc.disable()
    try:
        try:
            module = parse(data)
        except SourceError as error:
            result.error = f"{path}:{error.line}:{error.column}: error: {error.message}"
            return result
        active = selected_rules(settings, path, rules)
        dependencies: dict = {}
        try:
            findings, new_code, checked = _run(module, data, path, settings, active, dependencies)
        except Exception as error:  # a bug in a rule must not cost the user their file
            result.error = (
                f"{path}:1:1: error: internal error, file left unchanged ({type(error).__name__}: {error}); "
                "please report it with this file, or skip it with --ignore or `exclude`"
            )
            return result
    finally:
        if collecting:
            gc.enable()
    result.findings = findings
    result.dependencies = tuple(dependencies.values())
    if new_code is None:
        result.new_source = data  # libcst does not give back every file byte for byte
        return result
    if not checked and module.bytes != data:
        result.findings = []
        result.error = (
            f"{path}:1:1: error: libcst cannot write this file back byte for byte (typically "
            "whitespace after the last newline), so its fixes are not applied and it is left unchanged; "
            "end the file with a newline and run perfmod again"
        )
        return result
    new_source = new_code.encode(module.encoding)
    problem = _does_not_compile(data, new_source)
    if problem is not None:
        result.findings = []
        result.error = (
            f"{path}:1:1: error: internal error, file left unchanged (the rewrite would not compile: {problem}); "
            "please report it with this file, or skip it with --ignore or `exclude`"
        )
        return result
    result.new_source = new_source
    return result


def _does_not_compile(data: bytes, rewrite: bytes) -> str | None:
    """Why `rewrite`, perfmod's rewrite of the file `data`, would not compile; None when
    it would. The running Python judges where it compiles the original; where it does
    not (syntax newer than it, codemod/syntax.py, or an error of the file's own that
    codemod.worker reports), libcst's grammar, which reads newer syntax, judges alone."""
    error = compile_error(rewrite)
    if error is None:
        return None
    if compile_error(data) is None:
        line, _, message = error
        return f"{running_python()}: {message} on line {line} of the rewrite"
    try:
        cst.parse_module(rewrite)
    except cst.ParserSyntaxError as parse_error:
        return f"libcst: {parse_error.message} on line {parse_error.editor_line} of the rewrite"
    return None


def _run(
    module: cst.Module,
    data: bytes,
    path: str,
    settings: Settings,
    active: Sequence[type[Rule]],
    dependencies: dict | None = None,
) -> tuple[list[Finding], str | None, bool]:
    """Every pass's findings, the rewritten text (None when nothing changed), and whether
    that text was checked to keep the file's bytes outside what the fixes replaced (see
    codemod.writeback). A later pass analyses the rewritten tree itself; where an edit put one
    node in two places, the statements holding it are cloned first (each place gets a
    node of its own). The project files the analysis read go into `dependencies` (path -> Stamp).

    The rules run in rounds until the file stops changing (a fixed point, as a second
    `perfmod apply` would find it): a round whose fixes changed the file is followed by
    another round of every rule on the rewritten file, at most `MAX_ROUNDS` in all. A
    finding a later round reports again (same rule, same line of the original file) is
    the same finding, counted once: fixed there, it is applied. A file without fixes
    takes one round, and so does every file without `settings.fixed_point`."""
    passes(active)  # a cycle of AFTER declarations is an error before any work
    original = _text(module, data)
    checked = original.encode(module.encoding) == data
    current, code, context = module, original, None
    earlier: FileContext | None = None  # the context of the pass before, until the next one is built
    lines: list[int] = []  # where the statements of `current` start in `code`, when `written` knows it
    ranges: dict = {}  # the ranges and code of the statements `written` generated for `current`
    tally = _Tally()
    for round_number in range(1, (MAX_ROUNDS if settings.fixed_point else 1) + 1):
        final = round_number == MAX_ROUNDS  # its fixes are reported, not made
        start = code
        pending = list(active)
        while pending:
            candidates = [rule for rule in pending if not rule.REQUIRES or any(text in code for text in rule.REQUIRES)]
            if not candidates:
                break
            if context is None:
                context = _context(current, code, module.encoding, path, settings, earlier, lines or None, ranges)
                current, earlier = context.module, None
            outcome = _run_pass(context, candidates, pending)
            if dependencies is not None:
                dependencies.update((stamp.path, stamp) for stamp in outcome.dependencies)
            if code is not original:  # a later pass: its lines are the rewritten file's
                outcome.findings = _map_lines(outcome.findings, code.splitlines(), original.splitlines())
            if final and outcome.module is not current:  # the file did not stop changing
                tally.add(outcome, later=True, unsettled=True)
                break
            tally.add(outcome, later=round_number > 1)
            if outcome.module is not current:
                lines, ranges = [], {}
                # (the positions of the statements it generates, for a pass that runs on it: one
                # code generation instead of two)
                another = bool(outcome.waiting) or settings.fixed_point
                code, verified = written(outcome.module, context, lines, ranges if another else None)
                checked = checked and verified
                current, context, earlier = outcome.module, None, context
            pending = outcome.waiting
        if code is start:
            break
    findings = tally.result()
    findings.sort(key=lambda f: (f.line, f.column, f.code))
    return findings, None if code is original else code, checked


def _context(
    current: cst.Module,
    code: str,
    encoding: str,
    path: str,
    settings: Settings,
    earlier: FileContext | None = None,
    lines: list[int] | None = None,
    ranges: dict | None = None,
) -> FileContext:
    """The analyses of `current`, whose text is `code`; each place of a node gets a node of its own.
    `earlier`: the context of the module `current` rewrites (a later pass), whose work on the
    statements the two share is taken over; `lines`: the line each statement of its body
    starts on in `code`, where that is known (`written`), and `ranges`: the positions and code
    of the statements `written` generated at those lines."""
    reused = earlier.index if earlier is not None else None
    index = TreeIndex(current, reused)
    if not index.unique:
        shared = index.shared_statements()
        body = [s.deep_clone() if k in shared else s for k, s in enumerate(current.body)]
        current = current.with_changes(body=body)
        index = index.with_clones(current)
    if not index.unique:
        current, lines = parse(code.encode(encoding)), None
        index = TreeIndex(current)
    return FileContext(current, path, settings, code, index, earlier, lines, ranges)


def _unsettled(finding: Finding) -> Finding:
    """A fix of the last round the engine allows: the file did not stop changing."""
    why = f"not fixed in this run: the fixes did not settle in {MAX_ROUNDS - 1} rounds; run perfmod again to fix it"
    return finding._replace(applied=False, fix_lines=(), message=f"{finding.message} ({why})")


class _Tally:
    """The findings of every round, each counted once. A finding of a later round that an
    earlier one reported (same rule, and the same original line or the same message but
    for its numbers) updates it: its fix made there. A later round's new finding counts
    only with a fix: without one, it speaks of code perfmod wrote. A fix the conflict plan left for
    another run that no later round makes was made moot by the fix that removed its code:
    it says so."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.deferred: dict[int, tuple[str, str]] = {}  # index -> (rule's message, why it waited)
        self.settled = True  # False: the last round's fixes were left undone

    def add(self, outcome: _Outcome, later: bool, unsettled: bool = False) -> None:
        """The findings of a pass. `unsettled`: the pass of the last round, whose fixes are
        not made (each stays a finding of its own, to fix in another run)."""
        self.settled = self.settled and not unsettled
        unmatched = set(range(len(self.findings))) if later else set()
        per_rule = Counter(finding.code for finding in outcome.findings)
        for k, finding in enumerate(outcome.findings):
            message = outcome.deferred[k][0] if k in outcome.deferred else finding.message
            fixes = finding.applied
            pool = unmatched
            if unsettled and finding.applied:
                pool = {m for m in unmatched if not self.findings[m].applied}
                finding = _unsettled(finding)
            at = self._match(finding, message, pool, alone=per_rule[finding.code] == 1)
            if at is None and later and not fixes:
                # What the first round did not report is in code an earlier fix wrote: a
                # later round adds the fixes that fix made possible, not comments on it.
                continue
            if at is None:
                if k in outcome.deferred:
                    self.deferred[len(self.findings)] = outcome.deferred[k]
                self.findings.append(finding)
                continue
            unmatched.discard(at)
            earlier = self.findings[at]
            if unsettled and not finding.applied and finding.fixable and not earlier.applied:
                self.findings[at] = earlier._replace(message=finding.message, fixable=True)
            else:
                self.findings[at] = _merged(earlier, finding)
            if self.findings[at].applied:
                self.deferred.pop(at, None)

    def _match(self, finding: Finding, message: str, pool: set[int], alone: bool) -> int | None:
        """The earlier finding in `pool` that `finding` (its rule's own message `message`) is.
        `alone`: the only finding of its rule in its round; where the earlier round's was
        the only one too, and not fixed, they are one (a rule of the whole program, as
        PM601, that fixes once an earlier fix removed what kept it from fixing)."""
        same = [m for m in sorted(pool) if self.findings[m].code == finding.code]
        exact = [m for m in same if self.findings[m].line == finding.line]
        if exact:
            return min(exact, key=lambda m: self.findings[m].applied)
        shape = _numberless(message)
        alike = [m for m in same if _numberless(self.deferred.get(m, (self.findings[m].message,))[0]) == shape]
        if alike:
            return min(alike, key=lambda m: abs(self.findings[m].line - finding.line))
        if alone and finding.applied and len(same) == 1 and not self.findings[same[0]].applied:
            return same[0]
        return None

    def result(self) -> list[Finding]:
        if not self.settled:
            return self.findings
        findings = list(self.findings)
        for at, (message, why) in self.deferred.items():
            if not findings[at].applied:
                findings[at] = findings[at]._replace(message=f"{message} (not fixed: {why})")
        return findings


def _numberless(message: str) -> str:
    """A message without its numbers (the lines it names move when the file is rewritten)."""
    return NUMBER.sub("#", message)


def _merged(earlier: Finding, later: Finding) -> Finding:
    """One finding reported by two rounds: the earlier one, which speaks of the original
    file's lines, unless the later one made its fix (then that fix, where the earlier one
    points), and the lines of every fix made for it."""
    if earlier.applied:
        return earlier._replace(fix_lines=tuple(sorted({*earlier.fix_lines, *later.fix_lines})))
    if not later.applied:
        return earlier
    return earlier._replace(
        message=later.message,
        fixable=later.fixable,
        applied=later.applied,
        fix_lines=later.fix_lines,
        fixed_by=later.fixed_by,
        level=later.level,
    )


def _text(module: cst.Module, data: bytes) -> str:
    """The module's text, decoded from its bytes rather than generated again (a file
    libcst cannot write back byte for byte is refused before any fix is written)."""
    try:
        code = data.decode(module.encoding)
    except (UnicodeDecodeError, LookupError):
        return module.code
    return module.code if code.startswith("\ufeff") else code


@dataclass
class _Outcome:
    findings: list[Finding]
    module: cst.Module
    waiting: list[type[Rule]]  # rules to run again on the rewritten module
    dependencies: list = field(default_factory=list)  # project files read (codemod.analysis.project.Stamp)
    # Findings whose fix the conflict plan left for a later round: index -> (message, why)
    deferred: dict[int, tuple[str, str]] = field(default_factory=dict)


def _run_pass(context: FileContext, rules: Sequence[type[Rule]], pending: Sequence[type[Rule]]) -> _Outcome:
    """Run `rules` on the context's module and apply their fixes. Of the `pending` rules,
    those that need the output of a rule with a fix here (`Rule.AFTER`) wait for the next
    pass: their findings here are dropped (a pass whose earlier rules fix nothing is the
    last one)."""
    module, code, path = context.module, context.code, context.path
    suppressed = suppressions(code)
    reports: list[tuple[Report, int]] = []
    with read_only_visits():  # the analysis reads the tree; only `_apply` below rebuilds it
        instances = [rule(context) for rule in rules]
        # The rules run in the order of their declarations, in one walk per step: a rule
        # that waits for a rule with a fix here would have its findings dropped, so it
        # does not run until the next pass.
        of_rule = {type(instance): instance for instance in instances}
        fixing: set[str] = set()
        waiting: set[type[Rule]] = set()
        for step in passes(rules):
            _dispatch(context.index, [of_rule[rule] for rule in step if rule not in waiting])
            fixing |= {
                report.code
                for rule in step
                for report in of_rule[rule].reports
                if report.has_fix and report.level <= context.settings.level
            }
            waiting = _waiting(pending, fixing)
        for instance in instances:
            if type(instance) in waiting:
                continue
            for report in instance.reports:
                line = context.line(report.location)
                if not is_suppressed(suppressed, line, report.code):
                    reports.append((report, line))
        fixes, reasons = _candidate_fixes(reports, context)
    plan = edit_model.plan(fixes, context.index)
    for key, why in plan.reasons.items():
        reasons[key] = f"not fixed in this run: {why}; run perfmod again to fix it"
    new_module, lines_of = _apply(module, plan.kept, context)
    notes = {}
    by_key = {fix.key: fix for fix in fixes}
    for key, superseding in plan.settled.items():
        notes[key] = f"fixed by {superseding.code}'s fix on line {superseding.line}, which replaces this code"
        own = [span for edit in by_key[key].edits for span in _spans(edit, context)]
        # The lines of the replacing fix at this finding's own code, not its imports or other sites.
        lines_of[key] = [span for span in lines_of[superseding.key] if any(_meet(span, mine) for mine in own)] or own
    findings = [
        _finding(path, report, line, key, context, reasons | notes, lines_of)
        for key, (report, line) in enumerate(reports)
    ]
    findings = [
        finding._replace(fixed_by=plan.settled[key].code) if key in plan.settled else finding
        for key, finding in enumerate(findings)
    ]
    deferred = {key: (reports[key][0].message, why) for key, why in plan.reasons.items()}
    waiting_rules = [rule for rule in pending if rule in waiting]
    return _Outcome(findings, new_module, waiting_rules, project_dependencies(context), deferred)


def _waiting(pending: Sequence[type[Rule]], fixing: set[str]) -> set[type[Rule]]:
    """The pending rules that must see the fixes of a rule in `fixing` first, directly or
    through another waiting rule."""
    waiting: set[type[Rule]] = set()
    changed = True
    while changed:
        changed = False
        late = fixing | {rule.CODE for rule in waiting}
        for rule in pending:
            if rule not in waiting and any(code in late for code in rule.AFTER):
                waiting.add(rule)
                changed = True
    return waiting


def _candidate_fixes(reports: list[tuple[Report, int]], context: FileContext) -> tuple[list[Fix], dict[int, str]]:
    """The fixes allowed at the chosen level that can be made where they are anchored,
    and why each fix of the others cannot."""
    fixes: list[Fix] = []
    reasons: dict[int, str] = {}
    module_scope = None
    for key, (report, line) in enumerate(reports):
        if not report.has_fix or report.level > context.settings.level:
            continue
        fix = Fix(key, report.code, int(report.level), line, list(report.edits), list(report.imports))
        problem = next(filter(None, (edit_model.validate(edit, context.index) for edit in fix.edits)), None)
        if problem is None:
            missing = guard.undefined_names(fix, context.scopes, context.index)
            if missing:
                problem = (
                    f"the fix would use {_names(missing)}, not defined where it would go; "
                    "define it there or rewrite by hand"
                )
        if problem is None and fix.imports:
            module_scope = module_scope or context.scopes.get(context.module)
            clashes = guard.import_clashes(fix, module_scope)
            if clashes:
                problem = f"the fix imports {_names(clashes)}, a name this file already uses for something else"
        if problem is None:
            problem = _runtime_shadowed(fix, context)
        if problem is not None:
            reasons[key] = f"not fixed: {problem}"
            continue
        fix.imports = guard.imports_read(fix, context.scopes)
        fixes.append(fix)
    return fixes, reasons


def _runtime_shadowed(fix: Fix, context: FileContext) -> str | None:
    """Rewritten code imports perfmod's `runtime` package; a project's own module of
    that name beside the script (or at the project root) would be imported instead."""
    if not any(item.module.split(".")[0] == RUNTIME_PACKAGE for item in fix.imports):
        return None
    folders = [Path(context.path).resolve().parent] if context.path and not context.path.startswith("<") else []
    if context.settings.root is not None:
        folders.append(Path(context.settings.root).resolve())
    for folder in folders:
        shadow = _foreign_runtime(folder)
        if shadow is not None:
            return (
                f"the fix imports perfmod's `{RUNTIME_PACKAGE}` package, but `{shadow}` would be imported instead; "
                "rename that module to apply this fix"
            )
    return None


@lru_cache(maxsize=256)
def _foreign_runtime(folder: Path) -> str | None:
    """A `runtime` module or package in `folder` that is not perfmod's own."""
    module, package = folder / f"{RUNTIME_PACKAGE}.py", folder / RUNTIME_PACKAGE
    if module.is_file():
        return str(module)
    if package.is_dir():
        init = package / "__init__.py"
        try:
            own = init.is_file() and RUNTIME_MARK in init.read_text(encoding="utf-8", errors="replace")
        except OSError:
            own = False
        if not own:
            return str(package) + "/"
    return None


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def _apply(
    module: cst.Module, accepted: list[Fix], context: FileContext
) -> tuple[cst.Module, dict[int, list[tuple[int, int]]]]:
    """The module with the accepted fixes made, and the original lines each fix changes."""
    if not accepted:
        return module, {}
    index = context.index
    accepted = _with_unread_removed(accepted, context)
    lines_of: dict[int, list[tuple[int, int]]] = {
        fix.key: [span for edit in fix.edits for span in _spans(edit, context)] for fix in accepted
    }
    origins: dict[int, cst.CSTNode] = {}
    new_module = edit_model.apply(module, accepted, index, origins)
    needed = import_edits.missing(module, [item for fix in accepted for item in fix.imports])
    if needed:
        site = import_edits.import_site(module)
        line = context.positions[site.after].end.line if site.after is not None else 1
        merged = _merged_import_spans(module, needed, context)
        placed: dict = {}
        new_module = import_edits.add(new_module, needed, site, _first_party(context), placed)
        for fix in accepted:
            for item in fix.imports:
                around = [_neighbour_lines(s, k, context) for k, s in placed.get(item, ()) if s in context.positions]
                if around:  # sorted in among the imports: the lines around it
                    lines_of[fix.key].extend(around)
                elif item in needed and item not in merged:
                    lines_of[fix.key].append((line, line))
            lines_of[fix.key].extend(merged[item] for item in fix.imports if item in merged)
    released = _imported_names_in_edits(module, accepted, index)
    if released:
        new_module, removed = import_edits.without_unused(new_module, set(released))
        for name in removed:
            for statement in _import_statements(module, name):
                span = _statement_span(statement, context)
                for key in released[name]:
                    lines_of[key].append(span)
    lines = context.code.splitlines()

    def width_before(statement: cst.SimpleStatementLine) -> tuple[int | None, int]:
        """The widest line of the statement `statement` was rewritten from, and its number
        of lines ((None, 1) for a statement the fixes wrote)."""
        origin = origins.get(id(statement.body[0])) if statement.body else None
        if origin is None or origin not in context.positions:
            return None, 1
        position = context.positions[origin]
        span = lines[position.start.line - 1 : position.end.line]
        return max(len(line) for line in span), len(span)

    line_length = context.settings.line_length or layout.file_line_length(context.code)
    new_module = layout.wrapped(new_module, lambda node: node not in index, width_before, line_length)
    return new_module, lines_of


def _bindings_read_only_in_edits(
    fixes: list[Fix], context: FileContext, removed: Sequence[tuple[int, cst.CSTNode]] = ()
) -> dict[cst.SimpleStatementLine, list[int]]:
    """Statements `name = value`, of a value whose computation changes nothing, every read
    of which is in code a fix replaces or removes, or in a statement of `removed` ((fix
    key, statement) pairs that go with the fixes): the fixes may leave them unread (the
    causal mask once SDPA takes is_causal). Statement -> the keys of those fixes."""
    index, kinds = context.index, context.kinds
    anchors = [
        (fix.key, edit.anchor)
        for fix in fixes
        for edit in fix.edits
        if not isinstance(edit, (InsertBefore, InsertAfter, Wrap, edit_model.AddKeyword, edit_model.Move))
    ]
    anchors += removed
    covering = {id(anchor) for _, anchor in anchors}  # a read in one of them: an ancestor of it is one
    found: dict[cst.SimpleStatementLine, list[int]] = {}
    for key, anchor in anchors:
        for name in index.find(cst.Name, within=anchor):
            if not import_edits.is_read(name, index.parents):
                continue
            for binding in kinds.reaching(name):
                line = _plain_assignment_line(binding.node, context)
                if line is None or key in found.get(line, ()):
                    continue
                reads = kinds.reached_reads(binding)
                if context.purity.side_effect_free(line.body[0].value) and all(
                    read in index and _under_any(read, covering, index) for read in reads
                ):
                    found.setdefault(line, []).append(key)
    return found


def _under_any(node: cst.CSTNode, anchors: set[int], index) -> bool:
    """Is `node` one of `anchors` (ids of nodes of the tree) or below one of them?"""
    if id(node) in anchors:
        return True
    return any(id(ancestor) in anchors for ancestor in index.ancestors(node))


def _plain_assignment_line(target: cst.CSTNode, context: FileContext) -> cst.SimpleStatementLine | None:
    """The line `name = value` alone that binds `target`, a Name; None for anything else."""
    assign = context.parents.get(context.parents.get(target))
    line = context.parents.get(assign)
    if (
        isinstance(assign, cst.Assign)
        and len(assign.targets) == 1
        and assign.targets[0].target is target
        and isinstance(line, cst.SimpleStatementLine)
        and len(line.body) == 1
    ):
        return line
    return None


def _with_unread_removed(fixes: list[Fix], context: FileContext) -> list[Fix]:
    """The fixes, each with the removal of the statements it leaves unread: a line of
    `_bindings_read_only_in_edits` whose name the code the fixes write does not read,
    and that no edit touches."""
    candidates = _bindings_read_only_in_edits(fixes, context)
    if not candidates:
        return fixes
    edits = [edit for fix in fixes for edit in fix.edits]
    distinct = {id(e): e for e in edits}.values()
    replaced = Counter(id(e.anchor) for e in distinct if isinstance(e, (edit_model.Replace, edit_model.Remove)))
    read_again = {name.value for edit in edits for name in _surviving_reads(edit, replaced, context)}
    index = context.index
    # (an insertion in front of a loop or after it leaves the statements inside it as they are)
    around = {id(edit.anchor) for edit in edits if not isinstance(edit, (InsertBefore, InsertAfter))}
    starts = sorted(index.order(edit.anchor) for edit in edits if edit.anchor in index)
    removed: list[tuple[int, cst.SimpleStatementLine]] = []  # (fix key, statement), in the order found
    while candidates:
        gone = {line for _, line in removed}
        for line, keys in candidates.items():
            name = line.body[0].targets[0].target.value
            # an edit of the line or of a node around it, or an edit inside it
            touched = line in index and (
                _under_any(line, around, index)
                or bisect_left(starts, index.order(line)) < bisect_right(starts, index.end(line))
            )
            if line not in gone and name not in read_again and not touched:
                removed.append((keys[0], line))
        if len(removed) == len(gone):
            break
        # A statement that goes may hold the last read of another one
        # (`mask = torch.tril(...)` read only by `mask = mask.view(...)`): look again.
        candidates = _bindings_read_only_in_edits(fixes, context, removed)
    removals: dict[int, list[edit_model.Edit]] = {}
    for key, line in removed:
        # (a comment above it described it, and goes too)
        removals.setdefault(key, []).append(edit_model.Remove(line, keep_comments=False))
    return [replace(fix, edits=[*fix.edits, *removals.get(fix.key, [])]) for fix in fixes]


def _surviving_reads(edit: edit_model.Edit, replaced: Counter, context: FileContext) -> list[cst.Name]:
    """The reads in the code `edit` writes that stay in the rewritten file. A replacement
    made from the updated node is made here from the original one: an original name in
    its anchor that an edit nested in that anchor rewrites is that edit's to write or drop
    (its own reads say which), not this one's. `replaced`: how many of the edits replace
    or remove each node (by id)."""
    reads = guard.produced_reads(edit)
    kept = [name for name in reads if name in context.index and context.inside(name, edit.anchor)]
    if not kept:  # (the edit keeps no original node: no other edit's to look for among the others)
        return reads
    own = isinstance(edit, (edit_model.Replace, edit_model.Remove))

    def nested(name: cst.CSTNode) -> bool:
        # the name, or a node around it up to the anchor, replaced or removed by another edit
        for node in chain((name,), context.index.ancestors(name)):
            count = replaced.get(id(node), 0) - (own and node is edit.anchor)
            if count > 0:
                return True
            if node is edit.anchor:
                return False
        return False

    return [
        name for name in reads if not (name in context.index and context.inside(name, edit.anchor) and nested(name))
    ]


def _first_party(context: FileContext):
    """Is a top-level module name one of the project's own (isort's first-party section)?
    The project is the configured root, else the folder of the file; source that is no
    file (`<stdin>`, a path that does not exist) has none."""
    root = context.settings.root
    if root is None and context.path and not context.path.startswith("<") and Path(context.path).is_file():
        root = Path(context.path).absolute().parent
    return import_edits.project_packages(Path(root)) if root is not None else lambda name: False


def _neighbour_lines(statement: cst.BaseStatement, k: int, context: FileContext) -> tuple[int, int]:
    """The lines of an import statement a new import goes next to: the last line of the
    one it follows (k 0); for the one after it (k 1), the comment and blank lines above
    it, which the new import may take over, down to its own first line."""
    first, last = _statement_span(statement, context)
    return (last, last) if k == 0 else (first, context.positions[statement].start.line)


def _merged_import_spans(module: cst.Module, needed: Sequence, context: FileContext) -> dict:
    """The lines of the `from m import ...` statements that new names of `needed` join
    (import_edits.add merges `from m import name` into the first plain one it finds, which
    need not be at the import site), by import."""
    spans = {}
    for item in needed:
        if item.name is None:
            continue
        position = import_edits.from_import(module.body, item.module)
        if position is not None:
            spans[item] = _statement_span(module.body[position[0]], context)
    return spans


def _imported_names_in_edits(module: cst.Module, fixes: list[Fix], index: TreeIndex) -> dict[str, list[int]]:
    """Names bound by top-level imports that the code a fix replaces or removes
    reads: their import may be left unused. Name -> the keys of those fixes."""
    bound = {
        import_edits.bound_name(alias, small)
        for statement in module.body
        if isinstance(statement, cst.SimpleStatementLine)
        for small in statement.body
        if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar)
        for alias in small.names
    }
    found: dict[str, list[int]] = {}
    for fix in fixes:
        for edit in fix.edits:
            if isinstance(edit, (InsertBefore, InsertAfter, Wrap, edit_model.AddKeyword, edit_model.Move)):
                continue
            for name in index.find(cst.Name, within=edit.anchor):
                if (
                    name.value in bound
                    and import_edits.is_read(name, index.parents)
                    and fix.key not in found.setdefault(name.value, [])
                ):
                    found[name.value].append(fix.key)
    return found


def _import_statements(module: cst.Module, name: str) -> list[cst.SimpleStatementLine]:
    return [
        statement
        for statement in module.body
        if isinstance(statement, cst.SimpleStatementLine)
        and any(
            isinstance(small, (cst.Import, cst.ImportFrom))
            and not isinstance(small.names, cst.ImportStar)
            and any(import_edits.bound_name(a, small) == name for a in small.names)
            for small in statement.body
        )
    ]


def _spans(edit, context: FileContext) -> list[tuple[int, int]]:
    """The original lines an edit changes: (first, last), 1-based and inclusive. An
    insertion changes no line: its span is the empty (line, line - 1), the point before
    `line`, so that only the change it makes is tied to it, not every change inside the
    statement it goes next to. A move: the statement and the first line of the one it
    goes in front of."""
    if isinstance(edit, InsertBefore):
        blank, _ = edit_model.split_blank(getattr(edit.anchor, "leading_lines", ()))
        first, _ = _statement_span(edit.anchor, context)
        return [(first + len(blank), first + len(blank) - 1)]  # after the blank lines, as inserted
    if isinstance(edit, InsertAfter):
        _, last = _statement_span(edit.anchor, context)
        return [(last + 1, last)]
    if isinstance(edit, Wrap):
        return [(_statement_span(edit.anchor, context)[0], _statement_span(edit.last, context)[1])]
    if isinstance(edit, edit_model.Move):
        first, _ = _statement_span(edit.to, context)
        return [_statement_span(edit.anchor, context), (first, context.positions[edit.to].start.line)]
    if isinstance(edit.anchor, cst.BaseStatement):
        return [_statement_span(edit.anchor, context)]
    position = context.positions[edit.anchor]
    return [(position.start.line, position.end.line)]


def _meet(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two spans of `_spans` share a line, or an empty one is at the other's edge."""
    reach = 1 if a[0] > a[1] or b[0] > b[1] else 0
    return a[0] <= b[1] + reach and b[0] <= a[1] + reach


def _statement_span(statement: cst.CSTNode, context: FileContext) -> tuple[int, int]:
    """A statement's lines with the comment lines above it (a removal carries them)."""
    position = context.positions[statement]
    decorators = getattr(statement, "decorators", ())
    start = context.positions[decorators[0]].start.line if decorators else position.start.line
    first = start - len(getattr(statement, "leading_lines", ()))
    end = position.end.line
    if isinstance(statement, cst.SimpleStatementLine) or position.end.column == 0:
        end = max(position.start.line, end - (1 if position.end.column == 0 else 0))
    return max(first, 1), end


def _finding(
    path: str,
    report: Report,
    line: int,
    key: int,
    context: FileContext,
    reasons: dict[int, str],
    lines_of: dict[int, list[tuple[int, int]]],
) -> Finding:
    position = context.positions[report.location]
    reason = reasons.get(key)
    message = report.message if reason is None else f"{report.message} ({reason})"
    return Finding(
        path,
        line,
        position.start.column + 1,
        report.code,
        report.name,
        message,
        report.level,
        fixable=report.has_fix and (reason is None or key in lines_of),
        applied=key in lines_of,
        end_line=position.end.line,
        end_column=position.end.column + 1,
        fix_lines=tuple(sorted(set(lines_of.get(key, ())))),
    )


def _runs(a: list[str], b: list[str], top: bool = True) -> list[tuple[int, int, int, int]]:
    """(i1, i2, j1, j2): a[i1:i2] became b[j1:j2], in order, covering both lists (as
    difflib's opcodes). Lines that occur once in each list anchor the alignment, in the
    order both keep them (patience diff); difflib, quadratic in what it compares, only
    compares the stretches between anchors. A long stretch (a file whose pieces repeat
    lines, as a long script does) is aligned the same way within itself first, on the
    lines that occur once in it, with its unchanged first and last lines kept apart."""
    count_a, count_b = Counter(a), Counter(b)
    at_b = {line: j for j, line in enumerate(b) if count_b[line] == 1}
    pairs = [(i, at_b[line]) for i, line in enumerate(a) if count_a[line] == 1 and line in at_b]
    runs: list[tuple[int, int, int, int]] = []
    start_a = start_b = 0
    if not top and not pairs:  # (a long stretch of lines that each occur more than once)
        return _resynchronized(a, b) if min(len(a), len(b)) > LONG_STRETCH else _compared(a, b)
    for i, j in [*_increasing(pairs), (len(a), len(b))]:
        if min(i - start_a, j - start_b) > LONG_STRETCH:
            inner = _stretch_runs(a[start_a:i], b[start_b:j])
        else:
            inner = _compared(a[start_a:i], b[start_b:j])
        runs.extend((start_a + i1, start_a + i2, start_b + j1, start_b + j2) for i1, i2, j1, j2 in inner)
        if i < len(a):
            runs.append((i, i + 1, j, j + 1))
        start_a, start_b = i + 1, j + 1
    return runs


def _compared(a: list[str], b: list[str]) -> list[tuple[int, int, int, int]]:
    """difflib's opcodes of `a` against `b`, as (i1, i2, j1, j2)."""
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [(i1, i2, j1, j2) for _, i1, i2, j1, j2 in matcher.get_opcodes()]


def _resynchronized(a: list[str], b: list[str]) -> list[tuple[int, int, int, int]]:
    """`_runs` of two long lists without lines that anchor them (a file whose pieces
    repeat): the equal lines in step kept as they are, and where they differ, the nearest
    place (within RESYNC_WINDOW lines) where SAME_RUN lines agree again; difflib compares
    only what lies between."""
    at_b: dict[str, list[int]] = {}
    for j, line in enumerate(b):
        at_b.setdefault(line, []).append(j)
    runs: list[tuple[int, int, int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            i0, j0 = i, j
            while i < len(a) and j < len(b) and a[i] == b[j]:
                i, j = i + 1, j + 1
            runs.append((i0, i, j0, j))
            continue
        best = None  # (x + y, x, y): the next agreement at a[i + x], b[j + y]
        for x in range(min(RESYNC_WINDOW, len(a) - i)):
            if best is not None and x >= best[0]:
                break
            places = at_b.get(a[i + x], ())
            for k in range(bisect_left(places, j), len(places)):
                y = places[k] - j
                if y >= RESYNC_WINDOW or (best is not None and x + y >= best[0]):
                    break
                if a[i + x : i + x + SAME_RUN] == b[j + y : j + y + SAME_RUN]:
                    best = (x + y, x, y)
                    break
        if best is None:
            break
        _, x, y = best
        runs.extend((i + i1, i + i2, j + j1, j + j2) for i1, i2, j1, j2 in _compared(a[i : i + x], b[j : j + y]))
        i, j = i + x, j + y
    runs.extend((i + i1, i + i2, j + j1, j + j2) for i1, i2, j1, j2 in _compared(a[i:], b[j:]))
    return runs


def _common_ends(a: Sequence[str], b: Sequence[str]) -> tuple[int, int]:
    """How many first lines, and then how many last lines, `a` and `b` share."""
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    return head, tail


def _stretch_runs(a: list[str], b: list[str]) -> list[tuple[int, int, int, int]]:
    """`_runs` of a long stretch between anchors: its common first and last lines as
    one unchanged run each, the middle anchored on the lines it holds once."""
    head, tail = _common_ends(a, b)
    middle = _runs(a[head : len(a) - tail], b[head : len(b) - tail], top=False)
    runs = [(0, head, 0, head)] if head else []
    runs.extend((head + i1, head + i2, head + j1, head + j2) for i1, i2, j1, j2 in middle)
    if tail:
        runs.append((len(a) - tail, len(a), len(b) - tail, len(b)))
    return runs


def _increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest run of `pairs` (in order of their first item) whose second items increase."""
    tails: list[int] = []  # tails[k]: second item ending the best run of length k + 1 so far
    ends: list[int] = []  # ... and the index in `pairs` of that pair
    before: list[int] = []  # index of the pair ahead of each pair in its run (-1: none)
    for index, (_, j) in enumerate(pairs):
        k = bisect_left(tails, j)
        if k == len(tails):
            tails.append(j)
            ends.append(index)
        else:
            tails[k], ends[k] = j, index
        before.append(ends[k - 1] if k else -1)
    run, index = [], ends[-1] if ends else -1
    while index >= 0:
        run.append(pairs[index])
        index = before[index]
    return run[::-1]


def _likeliest(line: str, run: list[str]) -> int | None:
    """The line of `run` (original lines a change replaced) that `line`, one of the lines
    that replaced them, was most likely rewritten from; None when none is like it."""
    if len(run) > SIMILAR_RUN:
        return None
    text = line.strip()
    # A line the run holds as it is (an unchanged line of a run that changed around it)
    # is the first of its copies there: its ratio, 1, is one no line before it reaches.
    for k, candidate in enumerate(run):
        if candidate.strip() == text:
            return k
    matcher = difflib.SequenceMatcher(None, b=text, autojunk=False)
    best, chosen = SIMILAR, None
    for k, candidate in enumerate(run):
        matcher.set_seq1(candidate.strip())
        if matcher.real_quick_ratio() > best and matcher.quick_ratio() > best:
            ratio = matcher.ratio()
            if ratio > best:
                best, chosen = ratio, k
    return chosen


def _map_lines(findings: list[Finding], rewritten: list[str], original: list[str]) -> list[Finding]:
    """Findings of a later pass, moved from the lines of the rewritten file to the
    original's: an unchanged line maps to itself, a line of a changed run to the line of
    the original run it is most like (`_likeliest`), else to the run's lines in order (its
    last line for lines the change added), an inserted line to the original line after it;
    the lines their messages name alike."""
    # Only the part between the common first and last lines is compared (difflib is
    # quadratic in what it compares; the rest maps to itself).
    head, tail = _common_ends(original, rewritten)
    table: dict[int, int] = {line: line for line in range(1, head + 1)}
    shift = len(original) - len(rewritten)
    table.update((len(rewritten) - k, len(rewritten) - k + shift) for k in range(tail))
    runs = _runs(original[head : len(original) - tail], rewritten[head : len(rewritten) - tail])
    runs = [run for run in runs if run[3] > run[2]]  # (those that replace lines with none map no line)
    starts = [j1 for _, _, j1, _ in runs]
    last = len(original)

    def mapped(line: int) -> int:
        # Only the lines the findings name are mapped (`_likeliest` compares a line with
        # every line of its run: done for every line, that is quadratic in a long run).
        found = table.get(line)
        if found is not None:
            return found
        j = line - 1 - head
        at = bisect_right(starts, j) - 1
        if j < 0 or at < 0 or j >= runs[at][3]:
            return last
        i1, i2, j1, _ = runs[at]
        offset = j - j1
        k = _likeliest(rewritten[head + j], original[head + i1 : head + i2]) if i2 - i1 > 1 else None
        found = table[line] = head + i1 + (min(offset, max(i2 - i1 - 1, 0)) if k is None else k) + 1
        return found

    def moved(line: int) -> int:
        return min(mapped(line), max(last, 1))

    def message(text: str) -> str:
        # The lines a message names are the rewritten file's too.
        return LINE_REFERENCE.sub(lambda m: NUMBER.sub(lambda n: str(moved(int(n.group()))), m.group()), text)

    return [
        f._replace(
            message=message(f.message),
            line=moved(f.line),
            end_line=moved(f.end_line or f.line),
            fix_lines=tuple((moved(a), moved(b)) for a, b in f.fix_lines),
        )
        for f in findings
    ]

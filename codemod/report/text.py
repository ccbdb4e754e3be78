"""Text for people: ruff-style finding lines, run summaries, the rules table
and a rule's explanation."""

from __future__ import annotations

import difflib
import os
import textwrap
from collections import Counter
from typing import Sequence

from codemod.docs import fix_availability, level_label, level_note, page_path
from codemod.result import FileResult
from codemod.report.summary import Summary
from codemod.rule import Finding, Invalid, Level, Rule

FIXABLE_MARK = "[*]"


def finding_line(finding: Finding, hint: bool = True) -> str:
    """`path:line:col: CODE [*] message`, the mark when the fix applies at the
    chosen level; with `hint`, other findings say what would fix them."""
    if finding.applied:
        return f"{finding.location}: {finding.code} {FIXABLE_MARK} {finding.message}"
    line = f"{finding.location}: {finding.code} {finding.message}"
    if not hint:
        return line
    if finding.fixable:
        return f"{line} (fix with --level {finding.level.label})"
    return f"{line} (no automatic fix)"


def check_report(results: Sequence[FileResult], level: Level) -> str:
    summary = Summary.of(results)
    lines = [finding_line(f) for f in summary.findings]
    if not summary.findings:
        lines.append(f"No findings ({_checked(summary)}).")
        return "\n".join(lines)
    with_findings = len({f.path for f in summary.findings})
    lines.append(f"Found {_count(len(summary.findings), 'finding')} in {_count(with_findings, 'file')} "
                 f"({_checked(summary)}).")
    if summary.applied:
        lines.append(f"{FIXABLE_MARK} {len(summary.applied)} fixable at level {level.label} with `perfmod apply`.")
    lines += outstanding(summary, locations=False)
    return "\n".join(lines)


def apply_report(results: Sequence[FileResult], level: Level, dry_run: bool) -> str:
    summary = Summary.of(results)
    lines = []
    if not dry_run:  # with --dry-run the diff shows each file
        for result in results:
            if result.changed and result.error is None:
                fixes = [f for f in result.findings if f.applied]
                lines.append(f"Fixed {result.path}: {_count(len(fixes), 'fix', 'fixes')} ({_codes(fixes)})")
    if summary.applied:
        verb, tail = ("Would apply", "; run without --dry-run to write them") if dry_run else ("Applied", "")
        lines.append(f"{verb} {_count(len(summary.applied), 'fix', 'fixes')} to {_count(len(summary.changed), 'file')} "
                     f"({_checked(summary)}){tail}.")
    else:
        lines.append(f"Nothing to fix at level {level.label} ({_checked(summary)}).")
    lines += outstanding(summary, locations=True)
    return "\n".join(lines)


def outstanding(summary: Summary, locations: bool) -> list[str]:
    """Findings left as they are: each higher level with the flag that applies
    its fixes, then the report-only ones; with `locations`, one line each."""
    groups = [(f"{_count(len(found), 'more fix', 'more fixes')} available with --level {level.label}", found)
              for level, found in summary.higher.items()]
    if summary.report_only:
        count = len(summary.report_only)
        groups.append((f"{count} {'finding has' if count == 1 else 'findings have'} no automatic fix (report only)",
                       summary.report_only))
    lines = []
    for header, found in groups:
        lines.append(header + (":" if locations else "."))
        if locations:
            lines += [f"  {finding_line(f, hint=False)}" for f in found]
    return lines


def _count(number: int, singular: str, plural: str | None = None) -> str:
    return f"{number} {singular if number == 1 else plural or singular + 's'}"


def _checked(summary: Summary) -> str:
    text = f"{_count(summary.checked, 'file')} checked"
    if summary.errors:
        text += f", {_count(len(summary.errors), 'error')}"
    return text


def _codes(findings: Sequence[Finding]) -> str:
    counts = Counter(f.code for f in findings)
    return ", ".join(code if n == 1 else f"{code} x{n}" for code, n in sorted(counts.items()))


# -- the catalogue ---------------------------------------------------------------------


def rules_table(rules: Sequence[type[Rule]], width: int | None = None) -> str:
    """Code, name, level and summary, one rule a line; summaries are shortened
    to fit `width` when one is given (a terminal), whole otherwise."""
    rows = [("CODE", "NAME", "LEVEL", "SUMMARY")] + [(r.CODE, r.NAME, level_label(r), r.summary()) for r in rules]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = []
    for row in rows:
        prefix = "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  "
        summary = row[3]
        if width is not None:
            summary = textwrap.shorten(summary, max(20, width - len(prefix)), placeholder="...")
        lines.append(prefix + summary)
    return "\n".join(lines)


def explain(rule: type[Rule]) -> str:
    lines = [
        f"{rule.CODE} {rule.NAME}",
        f"Level: {level_note(rule)}",
        f"Fix: {fix_availability(rule)}.",
        f"Expected gain: {rule.GAIN}",
        f"Docs: {page_path(rule)}",
        "",
        rule.docs(),
        "",
        "## Examples from the rule's tests",
        *_examples(rule),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _examples(rule: type[Rule]) -> list[str]:
    sources = [case.code for case in (*rule.INVALID, *rule.VALID)]
    setup = shared_setup(sources)
    lines = []
    if setup:
        lines += ["", "Shared set-up of the examples below:", _indent(setup)]
    fixed = [case for case in rule.INVALID if case.expected_replacement is not None]
    reported = [case for case in rule.INVALID if case.expected_replacement is None]
    sections = [
        (f"Fixed at --level {rule.LEVEL.label}:", [(case.note, _fix_diff(case, setup)) for case in fixed]),
        ("Reported without a fix:", [(case.note, case.code[len(setup):]) for case in reported]),
        ("Left alone:", [(case.note, case.code[len(setup):]) for case in rule.VALID]),
    ]
    for title, examples in sections:
        if examples:
            lines += ["", title]
            for note, code in examples:
                lines += ["", *([f"  # {note}"] if note else []), _indent(code)]
    return lines


def shared_setup(sources: Sequence[str]) -> str:
    """The leading lines every example starts with, leaving each at least one line of its own."""
    split = [source.splitlines(keepends=True) for source in sources]
    prefix = list(os.path.commonprefix(split)) if split else []
    while prefix and any(len(lines) <= len(prefix) for lines in split):
        prefix.pop()
    return "".join(prefix)


def _fix_diff(case: Invalid, setup: str) -> str:
    """The example's own lines as a diff; the set-up too where the fix changes it (an import)."""
    before, after = case.code, case.expected_replacement
    if after.startswith(setup):
        before, after = before[len(setup):], after[len(setup):]
    before_lines, after_lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
    context = len(before_lines) + len(after_lines)  # whole example in one hunk
    diff = difflib.unified_diff(before_lines, after_lines, n=context)
    return "".join(line for line in diff if not line.startswith(("---", "+++", "@@")))


def _indent(code: str) -> str:
    return textwrap.indent(code.rstrip("\n"), "    ", lambda line: True)

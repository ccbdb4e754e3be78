"""Text for people: ruff-style finding lines, run summaries, the rules table
and a rule's explanation. Finding lines and summaries need neither libcst nor
the rules (a cached `check` prints them); the catalogue's text imports them."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from codemod.report.summary import Summary
from codemod.result import FileResult, Finding, Level

if TYPE_CHECKING:
    from codemod.rule import Invalid, Rule

FIXABLE_MARK = "[*]"


def finding_line(finding: Finding, hint: bool = True, color: bool = False) -> str:
    """`path:line:col: CODE [*] message`, the mark when the fix applies at the
    chosen level; with `hint`, other findings say what would fix them; with
    `color`, ANSI colours as ruff uses them (bold path, red code, cyan mark)."""
    paint = _paint if color else _plain
    location = f"{paint(finding.path, bold=True)}:{finding.line}:{finding.column}:"
    code = paint(finding.code, fg="red", bold=True)
    if finding.applied:
        return f"{location} {code} {paint(FIXABLE_MARK, fg='cyan')} {finding.message}"
    line = f"{location} {code} {finding.message}"
    if not hint:
        return line
    if finding.fixable:
        return line + paint(f" (fix with --level {finding.level.label})", dim=True)
    return line + paint(" (no automatic fix)", dim=True)


def _paint(text: str, **style) -> str:
    return click.style(text, **style)


def _plain(text: str, **style) -> str:
    return text


def check_report(
    results: Sequence[FileResult], level: Level, *, skipped: int = 0, findings: bool = True, color: bool = False
) -> str:
    """The findings (unless `findings` is false: --statistics shows them) and a summary;
    `skipped`: files left alone as too deep to analyse."""
    summary = Summary.of(results)
    lines = [finding_line(f, color=color) for f in summary.findings] if findings else []
    if not summary.findings:
        if summary.errors:  # a file that could not be read or parsed was not checked: not "no findings"
            lines.append(
                f"No findings in the files that could be checked ({_checked(summary, skipped)}); "
                "fix the errors above and run perfmod again."
            )
        else:
            lines.append(f"No findings ({_checked(summary, skipped)}).")
        return "\n".join(lines)
    with_findings = len({f.path for f in summary.findings})
    lines.append(
        f"Found {_count(len(summary.findings), 'finding')} in {_count(with_findings, 'file')} "
        f"({_checked(summary, skipped)})."
    )
    if summary.applied:
        lines.append(f"{FIXABLE_MARK} {len(summary.applied)} fixable at level {level.label} with `perfmod apply`.")
    lines += outstanding(summary, locations=False)
    return "\n".join(lines)


def apply_report(results: Sequence[FileResult], level: Level, dry_run: bool, *, skipped: int = 0) -> str:
    summary = Summary.of(results)
    lines = []
    if not dry_run:  # with --dry-run the diff shows each file
        for result in results:
            if result.changed and result.error is None:
                fixes = [f for f in result.findings if f.applied and not f.fixed_by]
                settled = [f for f in result.findings if f.applied and f.fixed_by]
                line = f"Fixed {result.path}: {_count(len(fixes), 'fix', 'fixes')} ({_codes(fixes)})"
                if settled:
                    line += f"; they also settle {_count(len(settled), 'finding')} ({_codes(settled)})"
                lines.append(line)
    if summary.applied:
        verb, tail = ("Would apply", "; run without --dry-run to write them") if dry_run else ("Applied", "")
        # A finding another rule's fix settles (its code replaced) is no fix of its own.
        made = [f for f in summary.applied if not f.fixed_by]
        lines.append(
            f"{verb} {_count(len(made), 'fix', 'fixes')} to {_count(len(summary.changed), 'file')} "
            f"({_checked(summary, skipped)}){tail}."
        )
    if summary.unwritten:
        files = len({f.path for f in summary.unwritten})
        lines.append(
            f"{_count(len(summary.unwritten), 'fix', 'fixes')} in {_count(files, 'file')} not written: "
            f"see the errors above ({_checked(summary, skipped)})."
        )
    if not summary.applied and not summary.unwritten:
        lines.append(f"Nothing to fix at level {level.label} ({_checked(summary, skipped)}).")
    lines += outstanding(summary, locations=True)
    return "\n".join(lines)


def outstanding(summary: Summary, locations: bool) -> list[str]:
    """Findings left as they are: each higher level with the flag that applies
    its fixes, then the report-only ones; with `locations`, one line each."""
    groups = [
        (f"{_count(len(found), 'more fix', 'more fixes')} available with --level {level.label}", found)
        for level, found in summary.higher.items()
    ]
    if summary.report_only:
        count = len(summary.report_only)
        groups.append(
            (
                f"{count} {'finding has' if count == 1 else 'findings have'} no automatic fix (report only)",
                summary.report_only,
            )
        )
    lines = []
    for header, found in groups:
        lines.append(header + (":" if locations else "."))
        if locations:
            lines += [f"  {finding_line(f, hint=False)}" for f in found]
    return lines


def statistics(findings: Sequence[Finding]) -> list[dict]:
    """Per rule, most frequent first: code, name, findings, how many are fixed at the chosen level."""
    rows: dict[str, dict] = {}
    for finding in findings:
        row = rows.setdefault(finding.code, {"code": finding.code, "name": finding.name, "count": 0, "fixable": 0})
        row["count"] += 1
        row["fixable"] += finding.applied
    return sorted(rows.values(), key=lambda row: (-row["count"], row["code"]))


def statistics_table(findings: Sequence[Finding]) -> list[str]:
    """`count  CODE  [*] name` per rule, as ruff's --statistics; [*]: some fixable at the level."""
    rows = statistics(findings)
    width = max((len(str(row["count"])) for row in rows), default=1)
    return [
        f"{row['count']:>{width}}  {row['code']}  {FIXABLE_MARK if row['fixable'] else '   '} {row['name']}"
        for row in rows
    ]


def interrupted_report(written: Sequence[str], finished: int, total: int, write: bool) -> str:
    """What a Ctrl-C left behind: the files rewritten before it, and that no other was touched."""
    lines = [f"Interrupted after {finished} of {_count(total, 'file')}."]
    if written:
        lines.append(f"Rewritten before the interrupt ({len(written)}); no other file was changed:")
        lines += [f"  {path}" for path in written]
    elif write:
        lines.append("No file was rewritten.")
    else:
        lines.append("Nothing is written by this command.")
    return "\n".join(lines)


def _count(number: int, singular: str, plural: str | None = None) -> str:
    return f"{number} {singular if number == 1 else plural or singular + 's'}"


def _checked(summary: Summary, skipped: int = 0) -> str:
    text = f"{_count(summary.checked, 'file')} checked"
    if summary.errors:
        text += f", {_count(len(summary.errors), 'error')}"
    if skipped:
        text += f", {skipped} too deep to analyse"
    return text


def _codes(findings: Sequence[Finding]) -> str:
    counts = Counter(f.code for f in findings)
    return ", ".join(code if n == 1 else f"{code} x{n}" for code, n in sorted(counts.items()))


# -- the catalogue ---------------------------------------------------------------------


def rules_table(rules: Sequence[type[Rule]], width: int | None = None) -> str:
    """Code, name, level and summary, one rule a line; on a terminal of `width`
    columns a long summary goes on under its column, whole words and whole
    sentences always (never cut)."""
    from codemod.docs import level_label, summary

    rows = [("CODE", "NAME", "LEVEL", "SUMMARY")] + [(r.CODE, r.NAME, level_label(r), summary(r)) for r in rules]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = []
    for row in rows:
        prefix = "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  "
        if width is None:
            lines.append(prefix + row[3])
            continue
        import textwrap

        wrapped = textwrap.wrap(row[3], max(30, width - len(prefix)), break_on_hyphens=False) or [""]
        lines.append(prefix + wrapped[0])
        lines += [" " * len(prefix) + more for more in wrapped[1:]]
    return "\n".join(lines)


def explain(rule: type[Rule]) -> str:
    from codemod.docs import fix_availability, level_note, page_path

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
        ("Reported without a fix:", [(case.note, case.code[len(setup) :]) for case in reported]),
        ("Left alone:", [(case.note, case.code[len(setup) :]) for case in rule.VALID]),
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
        before, after = before[len(setup) :], after[len(setup) :]
    before_lines, after_lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
    context = len(before_lines) + len(after_lines)  # whole example in one hunk
    import difflib

    diff = difflib.unified_diff(before_lines, after_lines, n=context)
    return "".join(line for line in diff if not line.startswith(("---", "+++", "@@")))


def _indent(code: str) -> str:
    import textwrap

    return textwrap.indent(code.rstrip("\n"), "    ", lambda line: True)

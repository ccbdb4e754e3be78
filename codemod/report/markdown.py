"""`perfmod report --format markdown`: a compact summary for a pull-request
comment. Counts by rule and by file, the verify result in one line, where the
profiled step's time goes (ranked, as `perfmod profile` prints it), and each
file's diff folded in a `<details>` block (GitHub and GitLab render both)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import jinja2

from codemod.report.diff import unified_diff
from codemod.report.review import (
    profile_bars,
    profile_headline,
    profile_segments,
    rule_rows,
    status,
    verify_headline,
    verify_rows,
    verify_slower,
)
from codemod.report.summary import Summary
from codemod.result import FileResult
from codemod.rule import Level, Rule

# GitHub refuses comments over 65,536 characters; the diffs get what the rest leaves.
DIFF_BUDGET = 50_000


def render_markdown(
    results: Sequence[FileResult],
    level: Level,
    rules: Sequence[type[Rule]],
    *,
    verify: dict | None = None,
    profile: dict | None = None,
    diff_budget: int = DIFF_BUDGET,
) -> str:
    """The comment; diffs that would take it past `diff_budget` characters are
    left out (file by file, in order) with a note saying so."""
    summary = Summary.of(results)
    files = []
    spent = 0
    for result in results:
        if not (result.error or result.findings or result.changed):
            continue
        diff = (
            unified_diff(result.path, result.source, result.new_source)
            if result.changed and result.error is None
            else ""
        )
        omitted = bool(diff) and spent + len(diff) > diff_budget
        spent += 0 if omitted else len(diff)
        files.append(
            {
                "path": result.path,
                "error": result.error,
                "fixed": sum(1 for f in result.findings if f.applied) if result.error is None else 0,
                "left": sum(1 for f in result.findings if not f.applied),
                "diff": "" if omitted else diff,
                "omitted": omitted,
                "findings": result.findings,
            }
        )
    context = {
        "level": level.label,
        "summary": summary,
        "rows": rule_rows(summary, rules),
        "files": files,
        "verify": verify,
        "verify_headline": verify_headline(verify) if verify else "",
        "verify_slower": verify_slower(verify) if verify else False,
        "verify_rows": verify_rows(verify) if verify else [],
        "profile": profile,
        "profile_headline": profile_headline(profile) if profile else "",
        "profile_segments": profile_segments(profile) if profile else [],
        "profile_bars": profile_bars(profile) if profile else [],
        "status": status,
    }
    return _environment().get_template("report.md.j2").render(context)


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("codemod.report", "templates"),
        autoescape=False,  # markdown, not HTML; table cells and code are escaped by the filters below
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["cell"] = table_cell
    environment.filters["fence"] = fence
    return environment


def table_cell(text: object) -> str:
    """Text that stays in its table cell and is not read as HTML: `|` escaped,
    `<`, `>` and `&` as entities, line breaks as spaces."""
    text = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return " ".join(text.replace("|", "\\|").split())


def fence(text: str) -> str:
    """A code fence longer than any run of backticks in `text` (CommonMark)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)

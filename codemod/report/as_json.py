"""`--format json`: one document per run, schema version 1.

    {"version": 1, "level": "safe",
     "files":    [{"path", "changed", "error"}],            input order
     "findings": [{"path", "line", "column", "end_line", "end_column", "code",
                   "name", "message", "level", "fixable", "applied",
                   "changes": [{"first", "last", "text"}]}],  file by file, by line
     "summary":  {"files", "changed", "errors", "findings", "applied",
                  "fixable_at_higher_level": {level: n}, "report_only"}}

`changed`: the fixes at the chosen level rewrite the file (`apply` wrote it;
`check` and `--dry-run` did not). `applied`: the finding's fix is within the
chosen level; `changes` are then the lines of the original file it replaces
(`first` to `last`, 1-based; `last` is `first - 1` for an insertion before
`first`) and the text written there, else empty. `error` is the `path:line:col: error: ...` line, or null. Fields
are only ever added; a change to any existing one bumps `version`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from codemod.docs import fix_availability, page_path
from codemod.report.diff import Change, fix_changes
from codemod.report.summary import Summary
from codemod.result import FileResult
from codemod.rule import Finding, Level, Rule

SCHEMA_VERSION = 1


def finding_dict(finding: Finding, changes: Sequence[Change] = ()) -> dict:
    return {
        "path": finding.path,
        "line": finding.line,
        "column": finding.column,
        "end_line": finding.end_line or finding.line,
        "end_column": finding.end_column or finding.column,
        "code": finding.code,
        "name": finding.name,
        "message": finding.message,
        "level": finding.level.label,
        "fixable": finding.fixable,
        "applied": finding.applied,
        "changes": [{"first": c.first, "last": c.last, "text": c.text} for c in changes],
    }


def render_json(results: Sequence[FileResult], level: Level) -> str:
    document = {
        "version": SCHEMA_VERSION,
        "level": level.label,
        "files": [{"path": r.path, "changed": r.changed and r.error is None, "error": r.error} for r in results],
        "findings": [finding_dict(f, c) for r in results for f, c in zip(r.findings, fix_changes(r))],
        "summary": Summary.of(results).as_dict(),
    }
    return json.dumps(document, indent=2)


def rules_json(rules: Sequence[type[Rule]]) -> str:
    """`perfmod rules --format json`: the catalogue, one object per rule."""
    return json.dumps(
        [
            {
                "code": rule.CODE,
                "name": rule.NAME,
                "level": rule.LEVEL.label,
                "opt_in": rule.OPT_IN,
                "summary": rule.summary(),
                "message": rule.MESSAGE,
                "gain": rule.GAIN,
                "fix": fix_availability(rule),
                "docs": page_path(rule),
            }
            for rule in rules
        ],
        indent=2,
    )

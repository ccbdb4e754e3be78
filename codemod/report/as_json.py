"""`--format json`: one document per run, schema version 2 (SCHEMA_VERSION).

The schema, and what `changed`, `applied` and `pending` mean, is documented for
users in docs/json.md; a key added here is added there
(tests/test_json_docs.py checks that every key is).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from codemod.docs import fix_availability, page_path
from codemod.report.diff import Change, fix_changes
from codemod.report.summary import Summary
from codemod.result import FileResult
from codemod.rule import Finding, Level, Rule

SCHEMA_VERSION = 2


def finding_dict(finding: Finding, changes: Sequence[Change] = (), written: bool = False) -> dict:
    """`written`: the fixes of the finding's file were made (see the module's docstring)."""
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
        "applied": finding.applied and written,
        "pending": finding.applied and not written,
        "changes": [{"first": c.first, "last": c.last, "text": c.text} for c in changes],
    }


def render_json(results: Sequence[FileResult], level: Level, written: bool = False) -> str:
    """`written`: the run made its fixes (`apply` without `--dry-run`); a file with an
    error was not written all the same."""
    document = {
        "version": SCHEMA_VERSION,
        "level": level.label,
        "files": [{"path": r.path, "changed": r.changed and r.error is None, "error": r.error} for r in results],
        "findings": [
            finding_dict(f, c, written and r.error is None) for r in results for f, c in zip(r.findings, fix_changes(r))
        ],
        "summary": Summary.of(results).as_dict(written),
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

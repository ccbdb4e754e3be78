"""`--format sarif`: SARIF 2.1.0 for code-scanning tools (GitHub, VS Code's SARIF viewer).

Findings whose fix applies at the chosen level are warnings, with the fix as
`fixes` (character ranges of the original file and the text that replaces
them); the others (a higher level needed, or report only) are notes. Files that
could not be processed are error notifications of the invocation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path, PurePath
from urllib.parse import quote

from codemod.docs import fix_availability, page_path
from codemod.report.diff import Change, fix_changes
from codemod.result import FileResult
from codemod.rule import Finding, Level, Rule

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def render_sarif(
    results: Sequence[FileResult], rules: Sequence[type[Rule]], level: Level, written: bool = False
) -> str:
    """`written`: the run made its fixes (`apply`); the `applied` and `pending`
    properties of a result mean what they mean in `--format json`."""
    index = {rule.CODE: number for number, rule in enumerate(rules)}
    run = {
        "tool": {"driver": {"name": "perfmod", "version": _version(), "rules": [_descriptor(r) for r in rules]}},
        "results": [
            _result(f, index, changes, written and r.error is None)
            for r in results
            for f, changes in zip(r.findings, fix_changes(r))
        ],
        "invocations": [
            {
                "executionSuccessful": not any(r.error for r in results),
                "toolExecutionNotifications": [_notification(r) for r in results if r.error],
            }
        ],
        "properties": {"level": level.label},
    }
    return json.dumps({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2)


def _version() -> str:
    try:
        return version("perfmod")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _descriptor(rule: type[Rule]) -> dict:
    return {
        "id": rule.CODE,
        "name": rule.NAME,
        "shortDescription": {"text": rule.MESSAGE},
        "fullDescription": {"text": rule.summary()},
        # Relative to the repository root: the project publishes no documentation site yet.
        "helpUri": page_path(rule),
        "help": {"text": rule.docs(), "markdown": rule.docs()},
        "properties": {"level": rule.LEVEL.label, "fix": fix_availability(rule), "gain": rule.GAIN},
    }


def _result(finding: Finding, index: dict[str, int], changes: Sequence[Change], written: bool) -> dict:
    result = {
        "ruleId": finding.code,
        "ruleIndex": index[finding.code],
        "level": "warning" if finding.applied else "note",
        "message": {"text": finding.message},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": {"uri": artifact_uri(finding.path)},
                    "region": {
                        "startLine": finding.line,
                        "startColumn": finding.column,
                        "endLine": finding.end_line or finding.line,
                        "endColumn": finding.end_column or finding.column,
                    },
                }
            }
        ],
        "properties": {
            "level": finding.level.label,
            "fixable": finding.fixable,
            "applied": finding.applied and written,
            "pending": finding.applied and not written,
        },
    }
    if changes:
        result["fixes"] = [
            {
                "description": {"text": f"perfmod {finding.code}: {finding.name}"},
                "artifactChanges": [
                    {
                        "artifactLocation": {"uri": artifact_uri(finding.path)},
                        "replacements": [
                            {
                                "deletedRegion": {"charOffset": change.offset, "charLength": change.length},
                                "insertedContent": {"text": change.text},
                            }
                            for change in changes
                        ],
                    }
                ],
            }
        ]
    return result


def _notification(result: FileResult) -> dict:
    return {
        "level": "error",
        "message": {"text": result.error},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": artifact_uri(result.path)}}}],
    }


def artifact_uri(path: str) -> str:
    """A relative path stays relative (code scanning resolves it against the checkout)."""
    if os.path.isabs(path):
        return Path(path).as_uri()
    return quote(PurePath(os.path.normpath(path)).as_posix())

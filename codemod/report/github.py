"""`--format github`: GitHub Actions workflow commands, one line per finding, as ruff's
`--output-format github` writes them:

    ::error title=perfmod (PM101),file=train.py,line=4,col=5,endLine=4,endColumn=17::train.py:4:5: PM101 message

A finding whose fix applies at the chosen level (what makes `check` exit 1) is
an `error`; the others (a higher level needed, or report only) are `warning`s.
A file that could not be processed is an `error` titled `perfmod`. GitHub
shows each line as an annotation on the file and line of the pull request;
`file` is the path as perfmod names it, so run perfmod from the repository
root. Values are escaped as GitHub's toolkit escapes them (`%`, line breaks,
and in properties `:` and `,`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from codemod.result import FileResult, Finding

ERROR_PLACE = re.compile(r"(?P<line>\d+):(?P<column>\d+): ")


def render_github(results: Sequence[FileResult]) -> str:
    """The workflow commands, one line each (each ending in a newline); "" when there is nothing."""
    lines = []
    for result in results:
        if result.error:
            lines.append(_error_line(result))
        lines += [_finding_line(finding) for finding in result.findings]
    return "".join(line + "\n" for line in lines)


def _finding_line(finding: Finding) -> str:
    kind = "error" if finding.applied else "warning"
    properties = _properties(
        title=f"perfmod ({finding.code})",
        file=finding.path,
        line=finding.line,
        col=finding.column,
        endLine=finding.end_line or finding.line,
        endColumn=finding.end_column or finding.column,
    )
    message = f"{finding.path}:{finding.line}:{finding.column}: {finding.code} {finding.message}"
    return f"::{kind} {properties}::{_data(message)}"


def _error_line(result: FileResult) -> str:
    """`result.error` reads `path:line:col: error: ...`; the annotation goes to that place."""
    error = result.error or ""
    place = ERROR_PLACE.match(error, len(result.path) + 1) if error.startswith(f"{result.path}:") else None
    where = {"line": place.group("line"), "col": place.group("column")} if place else {}
    return f"::error {_properties(title='perfmod', file=result.path, **where)}::{_data(error)}"


def _properties(**values) -> str:
    return ",".join(f"{key}={_property(str(value))}" for key, value in values.items())


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")

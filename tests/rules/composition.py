"""Every rule at `--level unsafe` on one program, in one `process_source` call: the
helpers the PM504-PM506 composition tests share."""

from __future__ import annotations

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import FileResult, Level


def apply_every_rule(source: str, opt_in: tuple[str, ...] = ()) -> FileResult:
    """`source` rewritten by the whole catalogue (`--select PM`: every rule but the
    opt-in ones, plus the opt-in rules named) in one run; every fix applied, none left for a second run, the result
    compiles and a second run changes nothing."""
    settings = Settings(level=Level.UNSAFE, select=("PM", *opt_in))
    result = process_source(source.encode(), "program.py", settings)
    assert result.error is None, result.error
    left = [f"{f.line} {f.code} {f.message}" for f in result.findings if "not fixed" in f.message]
    assert not left, left
    new_source = result.new_source.decode()
    compile(new_source, "program.py", "exec")
    again = process_source(result.new_source, "program.py", settings)
    assert again.error is None, again.error
    assert not again.pending and again.new_source == result.new_source, [
        f"{f.line} {f.code} {f.message}" for f in again.pending
    ]
    return result


def applied(result: FileResult) -> dict[str, list[int]]:
    """Code -> the lines of its applied findings."""
    found: dict[str, list[int]] = {}
    for finding in result.findings:
        if finding.applied:
            found.setdefault(finding.code, []).append(finding.line)
    return found

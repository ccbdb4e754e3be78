"""What a run came to, counted once for every output format."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from codemod.result import FileResult, Finding, Level


class Summary(NamedTuple):
    checked: int  # files processed, with or without an error
    errors: tuple[str, ...]  # "path:line:col: error: ..." per file that failed
    changed: tuple[str, ...]  # paths the fixes at the chosen level rewrite
    findings: tuple[Finding, ...]
    applied: tuple[Finding, ...]  # fixed at the chosen level (written, or pending for check / --dry-run)
    higher: dict[Level, tuple[Finding, ...]]  # fixable only at a higher level, by that level
    report_only: tuple[Finding, ...]  # reported without a fix
    # fixes at the chosen level in files that could not be written (read-only, changed meanwhile, ...)
    unwritten: tuple[Finding, ...] = ()

    @classmethod
    def of(cls, results: Sequence[FileResult]) -> Summary:
        # A file whose write failed keeps its findings, but nothing of it was applied.
        findings = tuple(f for r in results for f in r.findings)
        applied = tuple(f for r in results if r.error is None for f in r.findings if f.applied)
        higher: dict[Level, tuple[Finding, ...]] = {}
        for level in Level:
            at_level = tuple(f for f in findings if f.fixable and not f.applied and f.level == level)
            if at_level:
                higher[level] = at_level
        return cls(
            checked=len(results),
            errors=tuple(r.error for r in results if r.error),
            changed=tuple(r.path for r in results if r.changed and r.error is None),
            findings=findings,
            applied=applied,
            higher=higher,
            report_only=tuple(f for f in findings if not f.fixable),
            unwritten=tuple(f for r in results if r.error for f in r.findings if f.applied),
        )

    def as_dict(self, written: bool = False) -> dict:
        """The counts of `--format json`; `written`: the run made its fixes (apply)."""
        return {
            "files": self.checked,
            "changed": len(self.changed),
            "errors": len(self.errors),
            "findings": len(self.findings),
            "applied": len(self.applied) if written else 0,
            "pending": len(self.unwritten) + (0 if written else len(self.applied)),
            "fixable_at_higher_level": {level.label: len(found) for level, found in self.higher.items()},
            "report_only": len(self.report_only),
        }

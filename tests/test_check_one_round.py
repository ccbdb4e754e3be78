"""`perfmod check` runs one round of the rules, as ruff's check does; `apply`, its
--dry-run and `check --diff` run rounds until the file stops changing. What one round
reports differently is a fix that a later round makes once another fix made it
possible (tests/test_fixed_point.py checks this on every program under fixtures/)."""

from __future__ import annotations

from pathlib import Path

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import FileResult, Level
from codemod.rules import ALL_RULES
from tests.cli_support import perfmod

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
DEFAULT = Settings(level=Level.UNSAFE)
EVERY_RULE = Settings(level=Level.UNSAFE, select=tuple(rule.CODE for rule in ALL_RULES))
# PM202 makes its batches a DataLoader in the first round; PM601 splits them over the ranks in the second.
LATER_FIX = FIXTURES / "wild" / "data" / "lr_sweep_spiral_mlp.py"


def _both(path: Path, settings: Settings) -> tuple[FileResult, FileResult]:
    data = path.read_bytes()
    one = process_source(data, str(path), settings._replace(fixed_point=False))
    rounds = process_source(data, str(path), settings)
    return one, rounds


def _shown(result: FileResult) -> list[tuple]:
    return [(f.line, f.column, f.code, f.fixable, f.applied, f.message) for f in result.findings]


def test_what_one_round_misses_with_the_opt_in_rules_is_a_later_rounds_fix():
    one, rounds = _both(LATER_FIX, EVERY_RULE)
    assert one.changed and rounds.changed and one.error is None and rounds.error is None
    only_one = set(_shown(one)) - set(_shown(rounds))
    only_rounds = set(_shown(rounds)) - set(_shown(one))
    assert only_one and only_rounds
    assert all(applied for _, _, _, _, applied, _ in only_rounds)
    # The first round's PM601 refuses: the batches come from a hand-cut range.
    assert [(code, applied) for _, _, code, _, applied, _ in only_one] == [("PM601", False)]
    assert [(code, applied) for _, _, code, _, applied, _ in only_rounds] == [("PM601", True)]


def test_check_reports_one_round_and_its_diff_is_applys():
    args = (LATER_FIX, "--select", "ALL", "--level", "unsafe", "--no-cache")
    checked = perfmod("check", *args)
    assert checked.exit_code == 1
    (pm601,) = [line for line in checked.stdout.splitlines() if " PM601 " in line]
    assert "[*]" not in pm601 and "cannot make it torchrun-ready" in pm601
    diff = perfmod("check", *args, "--diff")
    dry_run = perfmod("apply", *args, "--dry-run")
    assert (diff.exit_code, diff.stdout) == (dry_run.exit_code, dry_run.stdout)
    assert "distributed" in diff.stdout  # PM601's rewrite, made in the second round

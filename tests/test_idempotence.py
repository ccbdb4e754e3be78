"""Every fixture, rewritten with all rules at level `unsafe`: the engine does not
crash, the rewrite compiles, and a second run over it finds nothing to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.robustness import check_file

REPO = Path(__file__).resolve().parents[1]
FIXTURES = sorted((REPO / "fixtures").rglob("*.py"))


def test_fixtures_are_found():
    assert (REPO / "fixtures" / "scripts" / "seed_latentwire.py") in FIXTURES


@pytest.mark.parametrize("path", FIXTURES, ids=[str(p.relative_to(REPO / "fixtures")) for p in FIXTURES])
def test_second_run_changes_nothing(path):
    outcome = check_file(path)
    assert not outcome.failed, f"{outcome.kind}: {outcome.detail}"

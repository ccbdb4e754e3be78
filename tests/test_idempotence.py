"""Every fixture input, rewritten with all rules at level `unsafe`: the engine does
not crash, the rewrite compiles, and a second run over it finds nothing to change.

The expected outputs (`*.out.py`) are left out: each is its input with one rule's
fixes applied, which the whole-catalogue run over that input goes through anyway,
and running them too nearly doubled the cost of the slowest test in the suite.
So are the benchmark's rewrites (fixtures/bench/: `*.rewritten*.py` and
verify_seed's prepared copies), outputs of perfmod at one level each, some below
`unsafe`; their inputs are here."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.robustness import check_file

REPO = Path(__file__).resolve().parents[1]
BENCH_OUTPUTS = REPO / "fixtures" / "bench" / "verify_seed"
FIXTURES = sorted(
    path
    for path in (REPO / "fixtures").rglob("*.py")
    if not path.name.endswith(".out.py") and ".rewritten" not in path.name and BENCH_OUTPUTS not in path.parents
)


def test_fixtures_are_found():
    assert (REPO / "fixtures" / "scripts" / "seed_latentwire.py") in FIXTURES


@pytest.mark.parametrize("path", FIXTURES, ids=[str(p.relative_to(REPO / "fixtures")) for p in FIXTURES])
def test_second_run_changes_nothing(path):
    outcome = check_file(path)
    assert not outcome.failed, f"{outcome.kind}: {outcome.detail}"

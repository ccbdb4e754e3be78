"""One `perfmod apply` reaches what a second one would: for every whole program
under fixtures/ (the acceptance scripts, the scripts, the wild corpus) and every
rule fixture input, all rules together, the opt-in ones too (PM601 rewrites whole
programs), at level unsafe: applying to the rewrite changes nothing, and the first
run left no fix for another run. (tests/test_idempotence.py runs the default
selection over every fixture.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Level
from codemod.rules import ALL_RULES

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
SETTINGS = Settings(level=Level.UNSAFE, select=tuple(rule.CODE for rule in ALL_RULES))
PROGRAMS = sorted(
    {
        *FIXTURES.glob("acceptance/*.py"),
        *FIXTURES.glob("scripts/**/*.py"),
        *FIXTURES.glob("wild/**/*.py"),
        *FIXTURES.glob("rules/*/*.in.py"),
    }
)


def test_the_programs_are_found():
    assert len(PROGRAMS) > 100


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda path: str(path.relative_to(FIXTURES)))
def test_apply_of_the_rewrite_is_the_rewrite(path):
    first = process_source(path.read_bytes(), str(path), SETTINGS)
    assert first.error is None, first.error
    assert not [f"{f.code}:{f.line} {f.message}" for f in first.findings if "run perfmod again" in f.message]
    if not first.changed:
        return
    second = process_source(first.new_source, str(path), SETTINGS)
    assert second.error is None, second.error
    assert [f"{f.code}:{f.line} {f.message}" for f in second.pending] == []
    assert second.new_source == first.new_source


def _findings(relative: str) -> list:
    path = FIXTURES / relative
    result = process_source(path.read_bytes(), str(path), SETTINGS)
    assert result.error is None, result.error
    return result.findings


def test_a_later_round_adds_fixes_not_comments_on_perfmods_own_code():
    """A second round that only reports speaks of what the first round wrote: PM601's DDP
    wrap rebinds `model` (PM506: "bound again after this line") and its rank slice of the
    permutation (PM202: "used in a way the rule does not follow"); neither was there."""
    found = _findings("wild/data/neg_gpu_resident_regression.py")
    assert [f.code for f in found if f.code in ("PM202", "PM506") and not f.applied] == []


def test_a_whole_program_rule_that_fixes_in_a_later_round_is_one_finding():
    """PM601 refused in the first round (its batches came from a hand-cut range) and fixed
    in the second, once PM202 had made them a DataLoader: one finding, fixed."""
    found = [f for f in _findings("wild/data/lr_sweep_spiral_mlp.py") if f.code == "PM601"]
    assert [(f.applied, "cannot" in f.message) for f in found] == [(True, False)]


def test_a_later_round_still_sees_what_an_earlier_fix_wrote_for_the_user():
    """The first round's PM405 makes the save a runtime checkpointer's; the second round's
    PM601 must still see that rank 0 alone saves into a folder of its own that every rank
    then reads: refused, as in the first round, not fixed."""
    found = [f for f in _findings("wild/step/lstm_forecaster_early_stop.py") if f.code == "PM601"]
    assert len(found) == 1 and not found[0].applied and "temporary folder" in found[0].message

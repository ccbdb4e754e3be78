"""One `perfmod apply` reaches what a second one would, and writes only what its fixes
change. For every fixture input (the acceptance scripts, the scripts, the wild corpus,
every rule fixture, the benchmark and verify inputs), all rules together, the opt-in
ones too (PM601 rewrites whole programs), at level unsafe:
- no internal error, and no parse error on code Python compiles;
- the rewrite compiles, and changes no line outside an applied fix;
- the first run leaves no fix for another run, and applying to the rewrite changes
  nothing;
- each rewritten file is copied from the original where its statements are untouched,
  and that text is what libcst writes for the new module (codemod/writeback.py).

The selection is every rule, not the default one: more rules meet in each file, and a
default-selection run is the same engine over fewer of them. The expected outputs
(`*.out.py`) and the benchmark's rewrites are left out: they are perfmod's own outputs
of these inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

import codemod.engine as engine
from benchmarks.robustness import check_result
from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Level
from codemod.rules import ALL_RULES
from codemod.writeback import written

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
SETTINGS = Settings(level=Level.UNSAFE, select=tuple(rule.CODE for rule in ALL_RULES))
BENCH_OUTPUTS = FIXTURES / "bench" / "verify_seed"
PROGRAMS = sorted(
    path
    for path in FIXTURES.rglob("*.py")
    if not path.name.endswith(".out.py") and ".rewritten" not in path.name and BENCH_OUTPUTS not in path.parents
)


def test_the_programs_are_found():
    assert len(PROGRAMS) > 250
    assert {FIXTURES / "scripts" / "seed_latentwire.py", FIXTURES / "acceptance" / "naive_lm.py"} <= set(PROGRAMS)


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda path: str(path.relative_to(FIXTURES)))
def test_apply_of_the_rewrite_is_the_rewrite(path, monkeypatch):
    not_copied = []

    def spied(new, old, lines=None, ranges=None):
        text, checked = written(new, old, lines, ranges)
        if not (checked and text == new.code):
            not_copied.append(old.path)
        return text, checked

    monkeypatch.setattr(engine, "written", spied)
    source = path.read_bytes()
    rounds = process_source(source, str(path), SETTINGS)
    outcome = check_result(rounds, source, str(path), SETTINGS)
    assert not outcome.failed, f"{outcome.kind}: {outcome.detail}"
    assert not_copied == []
    # `perfmod check` runs one round: the same exit status, and the same findings but for
    # fixes that only another fix made possible (a later round's), which it reports unfixed.
    one = process_source(source, str(path), SETTINGS._replace(fixed_point=False))
    assert (one.error, one.changed) == (rounds.error, rounds.changed)
    only_one, only_rounds = _shown(one) - _shown(rounds), _shown(rounds) - _shown(one)
    assert all(applied for _, _, applied in only_rounds), only_rounds
    assert {code for code, _, _ in only_one} <= {code for code, _, _ in only_rounds}, (only_one, only_rounds)


def _shown(result) -> set[tuple[str, str, bool]]:
    return {(f.code, f.message, f.applied) for f in result.findings}


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

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

"""Every before/after pair under fixtures/rules/<CODE>/: `<case>.in.py`, rewritten
by its rule alone, is `<case>.out.py`, and a second run changes nothing.

The rule runs at its own level, or at the level the file name ends in
(`<case>.unsafe.in.py`) for fixes that only apply at a higher one."""

from pathlib import Path

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules import RULES_BY_CODE

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules"
INPUTS = sorted(FIXTURES.glob("*/*.in.py"))


def expected_output(source: Path) -> Path:
    return source.with_name(source.name[: -len(".in.py")] + ".out.py")


def settings_for(source: Path) -> Settings:
    rule = RULES_BY_CODE[source.parent.name]
    case = source.name[: -len(".in.py")]
    level = Level.parse(case.rsplit(".", 1)[1]) if "." in case else rule.LEVEL
    return Settings(select=(rule.CODE,), level=level)


@pytest.mark.parametrize("source", INPUTS, ids=lambda path: f"{path.parent.name}/{path.name[: -len('.in.py')]}")
def test_rewrite_matches_the_expected_output(source):
    settings = settings_for(source)
    result = process_source(source.read_bytes(), str(source), settings)
    assert result.error is None, result.error
    got = result.new_source.decode()
    assert got == expected_output(source).read_text(encoding="utf-8"), (
        f"{source.name}: rewrite differs from the .out.py"
    )
    compile(got, str(expected_output(source)), "exec")
    again = process_source(result.new_source, str(source), settings)
    assert again.error is None and not again.pending and again.new_source == result.new_source, (
        f"{source.name}: not idempotent"
    )


def test_every_input_has_an_output_and_every_output_an_input():
    outputs = sorted(FIXTURES.glob("*/*.out.py"))
    assert INPUTS, "no fixtures found"
    assert sorted(expected_output(source) for source in INPUTS) == outputs
    assert all(path.parent.name in RULES_BY_CODE for path in INPUTS), "a fixture folder is not a rule code"

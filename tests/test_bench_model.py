"""benchmarks/bench_model.py must keep working: the GPU session runs it. A CPU
smoke run at tiny sizes, and a check that each case measures perfmod's own rewrite."""

import pytest

from benchmarks.bench_model import CASES, main
from codemod.config import Settings
from codemod.engine import process_source
from codemod.rules import RULES_BY_CODE


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_rewritten_version_is_what_perfmod_writes(case):
    code = case.original.parent.name
    settings = Settings(select=(code,), level=RULES_BY_CODE[code].LEVEL)
    result = process_source(case.original.read_bytes(), str(case.original), settings)
    assert result.new_source == case.rewritten.read_bytes() != case.original.read_bytes()


def test_cpu_smoke_run_prints_the_table():
    text = main(["--device", "cpu", "--steps", "2", "--warmup", "1", "--repeats", "1",
                 "--batch", "2", "--seq", "8", "--width", "16", "--vocab", "32"])
    assert "Device: CPU; torch " in text and "Command: `python -m benchmarks.bench_model --device cpu" in text
    rows = [line for line in text.splitlines() if line.startswith("| hook_lm |")]
    assert [row.split(" | ")[2] for row in rows] == ["original", "rewritten"]
    assert all(row.endswith("| yes |") for row in rows)  # the rewrite trained the same

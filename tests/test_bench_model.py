"""benchmarks/bench_model.py must keep working: the GPU session runs it. CPU smoke
runs at tiny sizes, and a check that each case measures perfmod's own rewrite."""

import shutil

import pytest

from benchmarks.bench_model import CASES, main
from codemod.config import Settings
from codemod.engine import process_source
from codemod.rules import RULES_BY_CODE

TINY = [
    "--device",
    "cpu",
    "--steps",
    "2",
    "--warmup",
    "1",
    "--repeats",
    "1",
    "--batch",
    "2",
    "--seq",
    "8",
    "--width",
    "16",
    "--vocab",
    "32",
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_rewritten_version_is_what_perfmod_writes(case):
    code = case.original.parent.name
    settings = Settings(select=(code,), level=RULES_BY_CODE[code].LEVEL)
    result = process_source(case.original.read_bytes(), str(case.original), settings)
    assert result.new_source == case.rewritten.read_bytes() != case.original.read_bytes()


def rows(text: str, case: str) -> list[list[str]]:
    return [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith(f"| {case} |")]


def test_cpu_smoke_run_of_the_hook_lm():
    text = main(["--case", "hook_lm", *TINY])
    assert "Device: CPU; torch " in text and "Command: `python -m benchmarks.bench_model --case hook_lm" in text
    original, rewritten = rows(text, "hook_lm")
    assert (original[2], rewritten[2]) == ("original", "rewritten")
    assert original[-1] == rewritten[-1]  # PM501's rewrite trained to the same final loss, bit for bit


@pytest.mark.slow
@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")), reason="inductor needs a C++ compiler")
def test_cpu_smoke_run_of_the_compiled_char_lm():
    text = main(["--case", "char_lm", *TINY])
    original, rewritten = rows(text, "char_lm")
    assert abs(float(original[-1]) - float(rewritten[-1])) < 1e-4 * abs(float(original[-1]))

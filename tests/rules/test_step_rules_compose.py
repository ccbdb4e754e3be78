"""The training-step rules' fixes compose with each other's and with other rules'
in ONE apply: programs where PM301's with-block holds PM101's copies, PM404's
running sum and PM405's save sit in the same step as PM403's clean-up and
PM401's reset, and PM402 / PM302 edit the set-up (fixtures/training/compose/).

Each is rewritten at level unsafe with the whole catalogue in one
`process_source` call: every finding is fixed, the rewrite compiles, a second
run finds nothing to do; and it trains like the original on the CPU (the
programs say `torch.device("cuda")`; both versions run with "cpu" in its
place): the per-step losses within the numeric tolerance (fused AdamW rounds
differently in the last bits), the running losses PM404 keeps on the device
printed exactly, the checkpoints PM405 writes in the background equal to the
synchronous ones."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Level
from tests.rules.scripts import one_thread

COMPOSE = Path(__file__).resolve().parents[2] / "fixtures" / "training" / "compose"
CASES = {
    # program, PM301's precision, the codes whose fixes must all land in it
    "script_every_step_rule": ("bf16", {"PM101", "PM301", "PM302", "PM401", "PM402", "PM403", "PM404", "PM405"}),
    "accumulation_fp16": ("fp16", {"PM101", "PM301", "PM302", "PM401", "PM402", "PM404"}),
}
NUMERIC_RTOL = 1e-5


def apply_all(source: bytes, amp: str):
    settings = Settings(level=Level.UNSAFE, amp=amp)  # every rule but the opt-in ones
    return process_source(source, "compose.py", settings), settings


def run(source: str, folder: Path, monkeypatch) -> tuple[list[float], list[str]]:
    """The losses a program prints at the end, and its other lines, run on the CPU."""
    monkeypatch.setenv("CHECKPOINT_DIR", str(folder))
    monkeypatch.delenv("PERFMOD_AMP", raising=False)
    folder.mkdir()
    out = io.StringIO()
    source = source.replace('torch.device("cuda")', 'torch.device("cpu")')
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<compose>", "exec"), {"__name__": "__main__"})
    lines = out.getvalue().splitlines()
    losses = json.loads(next(line for line in lines if line.startswith("losses")).split(" ", 1)[1])
    return losses, [line for line in lines if not line.startswith("losses")]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    name = request.param
    amp, codes = CASES[name]
    source = (COMPOSE / f"{name}.py").read_bytes()
    result, settings = apply_all(source, amp)
    return name, source.decode(), result, settings, codes


def test_every_fix_lands_in_one_apply_and_a_second_run_finds_nothing(case):
    name, source, result, settings, codes = case
    assert result.error is None, result.error
    assert {f.code for f in result.findings} == codes, name
    assert all(f.applied for f in result.findings), [
        f"{f.code}:{f.line} {f.message}" for f in result.findings if not f.applied
    ]
    compile(result.new_source, name, "exec")
    again = process_source(result.new_source, "compose.py", settings)
    assert again.error is None and not again.pending and again.new_source == result.new_source, again.pending


def test_the_rewrite_trains_like_the_original(case, tmp_path, monkeypatch):
    name, source, result, _, _ = case
    before, printed_before = run(source, tmp_path / "before", monkeypatch)
    after, printed_after = run(result.new_source.decode(), tmp_path / "after", monkeypatch)
    assert len(before) == len(after) > 10
    want, got = torch.tensor(before, dtype=torch.float64), torch.tensor(after, dtype=torch.float64)
    assert torch.allclose(got, want, rtol=NUMERIC_RTOL, atol=0), (got - want).abs().max()
    assert printed_after == printed_before  # PM404's running sums, bit for bit
    saved = sorted(p.name for p in (tmp_path / "before").iterdir())
    assert saved == sorted(p.name for p in (tmp_path / "after").iterdir())
    for file in saved:  # PM405: the background writes hold the state at save time
        first = torch.load(tmp_path / "before" / file, weights_only=True)
        second = torch.load(tmp_path / "after" / file, weights_only=True)
        for key, value in first["model"].items():  # numeric fixes round a few weights apart in the 7th digit
            torch.testing.assert_close(second["model"][key], value, rtol=NUMERIC_RTOL, atol=1e-6)

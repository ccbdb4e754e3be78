"""Whole training scripts under fixtures/training/: what PM301, PM302 and PM402
report on each, and that the PM302 and PM402 rewrites still train the same on
the CPU.

On this CPU (torch 2.13, AVX-512 without TF32 units) `set_float32_matmul_precision
("high")` changes no result (measured: bit for bit), and fused AdamW moves the
fixtures' losses by at most 1.2e-7 relative. TOLERANCE = 1e-3 is what TF32
itself allows on hardware that honours it (10-bit mantissas); the runs here sit
four orders of magnitude inside it.
"""

from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.float32_matmul_without_tf32 import Float32MatmulWithoutTf32
from codemod.rules.forward_without_autocast import ForwardWithoutAutocast
from codemod.rules.unfused_optimizer import UnfusedOptimizer
from tests.rules.scripts import losses, max_relative_difference, rewrite

ROOT = Path(__file__).resolve().parents[2]
TRAINING = ROOT / "fixtures" / "training"
RULES = [ForwardWithoutAutocast, Float32MatmulWithoutTf32, UnfusedOptimizer]
TOLERANCE = 1e-3

# (code, fixable) of every finding, in line order (PM302 is reported at the training loop).
EXPECTED = {
    "accumulation_clipping": [("PM402", True), ("PM302", True), ("PM301", True)],
    "seed_lm": [("PM402", True), ("PM302", True), ("PM301", True)],
    # autocast and scaler already there; TF32 held back: a 128-wide MLP at batch 64 is launch-bound
    "fp16_scaler": [("PM402", True), ("PM302", False)],
    "float64_model": [("PM402", True), ("PM301", False)],  # no TF32 for float64; autocast declined
    "nanogpt_optimised": [],  # already does all three
}


def findings(source: str, **config):
    settings = Settings(level=Level.NUMERIC).with_overrides(**config)
    result = process_source(source.encode(), "<fixture>", settings, RULES)
    assert result.error is None, result.error
    return result


@pytest.fixture
def restore_matmul_precision():
    """PM302's rewrite sets a process-wide flag; other tests must not inherit it."""
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("case", list(EXPECTED))
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_findings_on_each_script(case, amp):
    result = findings((TRAINING / f"{case}.py").read_text(), amp=amp)
    assert [(f.code, f.fixable) for f in result.findings] == EXPECTED[case]
    again = findings(result.new_source.decode(), amp=amp)
    assert again.new_source == result.new_source and not again.pending  # idempotent


def test_float64_model_is_reported_with_the_reason():
    result = findings((TRAINING / "float64_model.py").read_text())
    [autocast] = [f for f in result.findings if f.code == "PM301"]
    assert "not fixed: the model is float64 (line 16)" in autocast.message


@pytest.mark.parametrize("case", ["accumulation_clipping", "seed_lm"])
def test_tf32_and_fused_rewrites_train_within_tolerance(case, restore_matmul_precision):
    source = (TRAINING / f"{case}.py").read_text()
    new_source = rewrite(source, [Float32MatmulWithoutTf32, UnfusedOptimizer])
    assert 'torch.set_float32_matmul_precision("high")' in new_source and "fused=True" in new_source
    before = losses(source)
    after = losses(new_source)
    assert torch.get_float32_matmul_precision() == "high"  # the rewritten script did set it
    assert max_relative_difference(after, before) < TOLERANCE


def test_tf32_pair_in_main_function(restore_matmul_precision):
    pairs = ROOT / "fixtures" / "rules" / "PM302"
    source = (pairs / "cnn_main.in.py").read_text()
    new_source = rewrite(source, [Float32MatmulWithoutTf32])
    assert new_source == (pairs / "cnn_main.out.py").read_text()
    before = losses(source)
    assert max_relative_difference(losses(new_source), before) < TOLERANCE

"""PM301: rewritten training scripts run, and autocast keeps them close to float32.

The scripts train on the CPU here. runtime.amp leaves CPU autocast off unless
asked, so each run forces it with PERFMOD_AMP (bf16 or fp16), the switch the
rewritten code reads through `Precision.for_device`.

Measured over the fixtures' 20 optimizer steps (torch 2.13, AVX-512 CPU), as
the largest relative difference of any printed loss from the float32 run:
bf16 1.1e-3 (accumulation_clipping), 3.1e-4 (trainer_class), 2.5e-4 (seed_lm),
1.4e-4 (micro_steps); fp16 8.6e-5 or less. TOLERANCE = 5e-3 leaves about
five times headroom over the worst of them. The fp16 run of
accumulation_clipping is left out of the tolerance check on purpose: at step 17
its GradScaler finds an overflow and skips that step, as the scaler is meant
to, and float32 does not, so the two runs then follow different paths (1e-1
apart by step 20); its test checks the scaler calls instead.
"""

from pathlib import Path

import pytest
import torch

from codemod.rules.forward_without_autocast import ForwardWithoutAutocast
from tests.rules.scripts import losses, max_relative_difference, rewrite

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {
    "accumulation_clipping": ROOT / "fixtures" / "training" / "accumulation_clipping.py",
    "seed_lm": ROOT / "fixtures" / "training" / "seed_lm.py",
    "trainer_class": ROOT / "fixtures" / "rules" / "PM301" / "trainer_class.in.py",
    "micro_steps": ROOT / "fixtures" / "rules" / "PM301" / "micro_steps.in.py",
    "forward_first_in_step_helper": ROOT / "fixtures" / "rules" / "PM301" / "forward_first_in_step_helper.in.py",
    "trainer_step_called_from_main": ROOT / "fixtures" / "rules" / "PM301" / "trainer_step_called_from_main.in.py",
    "trainer_cuda_behind_a_flag": ROOT / "fixtures" / "rules" / "PM301" / "trainer_cuda_behind_a_flag.in.py",
    "encoder_helper_per_branch": ROOT / "fixtures" / "rules" / "PM301" / "encoder_helper_per_branch.in.py",
}
TOLERANCE = 5e-3
ACCUMULATION_STEPS, OPTIMIZER_STEPS = 4, 20  # accumulation_clipping's ACCUM and STEPS


@pytest.fixture(scope="module")
def float32_losses():
    """Each script's losses as written, computed once."""
    return {name: losses(path.read_text()) for name, path in SCRIPTS.items()}


def test_fp16_rewrite_reads_like_the_expected_hand_edit():
    """The bf16 rewrites of the PM301 pairs are checked by test_fixture_pairs; the
    fp16 one needs `amp = "fp16"`, so its expected output has a name of its own."""
    source = SCRIPTS["micro_steps"].read_text()
    expected = SCRIPTS["micro_steps"].with_name("micro_steps.fp16.expected.py").read_text()
    assert rewrite(source, [ForwardWithoutAutocast], amp="fp16") == expected


@pytest.mark.parametrize("case", list(SCRIPTS))
def test_bf16_autocast_stays_within_tolerance_of_float32(case, float32_losses, monkeypatch):
    monkeypatch.setenv("PERFMOD_AMP", "bf16")
    got = losses(rewrite(SCRIPTS[case].read_text(), [ForwardWithoutAutocast]))
    want = float32_losses[case]
    assert not torch.equal(got, want)  # autocast did run
    assert max_relative_difference(got, want) < TOLERANCE


@pytest.mark.parametrize("case", ["seed_lm", "trainer_class", "micro_steps"])
def test_fp16_autocast_with_scaler_stays_within_tolerance_of_float32(case, float32_losses, monkeypatch):
    monkeypatch.setenv("PERFMOD_AMP", "fp16")
    new_source = rewrite(SCRIPTS[case].read_text(), [ForwardWithoutAutocast], amp="fp16")
    assert ".grad_scaler()" in new_source
    got = losses(new_source)
    assert not torch.equal(got, float32_losses[case])
    assert max_relative_difference(got, float32_losses[case]) < TOLERANCE


def test_policy_switched_off_trains_bit_for_bit_like_the_original(float32_losses, monkeypatch):
    """With autocast off, the rewrite (policy, with-block, scaler calls) changes nothing else."""
    monkeypatch.setenv("PERFMOD_AMP", "off")
    for case, amp in [("accumulation_clipping", "fp16"), ("trainer_class", "bf16")]:
        got = losses(rewrite(SCRIPTS[case].read_text(), [ForwardWithoutAutocast], amp=amp))
        assert torch.equal(got, float32_losses[case]), (case, amp)


def test_fp16_scaler_scales_every_micro_batch_and_steps_once_per_accumulation(monkeypatch):
    """Every backward is scaled; per optimizer step the scaler unscales once before
    clipping, steps, and updates: never on the micro-batches in between."""
    monkeypatch.setenv("PERFMOD_AMP", "fp16")
    events: list[str] = []
    for method in ("scale", "unscale_", "step", "update"):
        original = getattr(torch.amp.GradScaler, method)

        def logged(self, *args, _original=original, _method=method, **kwargs):
            events.append(_method)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.amp.GradScaler, method, logged)
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: events.append("clip") or clip(*a, **k))
    new_source = rewrite(SCRIPTS["accumulation_clipping"].read_text(), [ForwardWithoutAutocast], amp="fp16")
    assert len(losses(new_source)) == ACCUMULATION_STEPS * OPTIMIZER_STEPS
    one_step = ["scale"] * ACCUMULATION_STEPS + ["unscale_", "clip", "step", "update"]
    assert events == one_step * OPTIMIZER_STEPS

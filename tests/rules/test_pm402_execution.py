"""PM402: fused optimizers, run. The fixtures under fixtures/rules/PM402/ train
on CUDA when there is one and on the CPU here; torch 2.13 has fused Adam, AdamW
and SGD on the CPU too, so the rewritten scripts run as they are.

Measured on the CPU (torch 2.13, AVX-512): over 20 steps fused AdamW's
parameters differ from the default implementation's by at most 1.0e-7 (7.5e-8
for the seeds below), the AdamW fixture's losses by less than 2e-7 relative;
SGD with momentum is bit for bit the same. The tolerance below (1e-5) leaves
about two orders of magnitude of headroom and still catches a wrong update:
dropping AdamW's weight decay of 0.01 moves the parameters by 4.5e-4.
"""

import sys
from pathlib import Path

import pytest
import torch

from codemod.rules.fused_optimizer import UnfusedOptimizer
from tests.rules.scripts import losses, max_relative_difference, one_thread, rewrite

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM402"
TOLERANCE = 1e-5


def adamw_parameters(fused: bool, seed: int, weight_decay: float = 0.01) -> torch.Tensor:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=weight_decay, fused=fused)
    data = torch.Generator().manual_seed(seed + 1)
    with one_thread():
        for _ in range(20):
            x, y = torch.randn(16, 32, generator=data), torch.randn(16, 8, generator=data)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("case", ["adamw_decay_groups", "sgd_momentum", "adam_argparse_device"])
def test_rewritten_script_trains_within_tolerance(case, monkeypatch):
    monkeypatch.setattr(sys, "argv", [f"{case}.py"])  # the scripts that parse options take their defaults
    source = (FIXTURES / f"{case}.in.py").read_text()
    new_source = rewrite(source, [UnfusedOptimizer])
    assert new_source == (FIXTURES / f"{case}.out.py").read_text()
    before, after = losses(source), losses(new_source)
    assert len(before) == 20
    assert max_relative_difference(after, before) < TOLERANCE


def test_fused_adamw_on_cpu_stays_within_tolerance_of_the_default():
    differences = [
        (adamw_parameters(True, seed) - adamw_parameters(False, seed)).abs().max().item() for seed in range(3)
    ]
    assert 0 < max(differences) < TOLERANCE  # another kernel (not bit for bit), within tolerance


def test_the_tolerance_is_sharp_enough_to_see_a_wrong_update():
    """The same comparison fails when the update itself differs (no weight decay)."""
    with pytest.raises(AssertionError):
        torch.testing.assert_close(
            adamw_parameters(True, 0, weight_decay=0.0), adamw_parameters(False, 0), rtol=0, atol=TOLERANCE
        )

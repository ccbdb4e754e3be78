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

from codemod.rules.unfused_optimizer import UnfusedOptimizer
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


@pytest.mark.parametrize(
    "case",
    [
        "adamw_decay_groups",
        "sgd_momentum",
        "adam_argparse_device",
        "trainer_self_device",
        "trainer_device_argument",
        "named_optimizer_choices",
        "device_from_helper_through_caller",
    ],
)
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


ENGINE = """\
import torch
from accelerate import Accelerator
from torch import nn

accelerator = Accelerator()
model = nn.Linear(8, 1)
"""
LIT = """\
import lightning as L
import torch
from torch import nn


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 1)

    def configure_optimizers(self):
        decay = [p for p in self.parameters() if p.ndim >= 2]
        rest = [p for p in self.parameters() if p.ndim < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest}], lr=1e-3)
"""
GUARD = 'fused=TYPE in ("cuda", "cpu")'


@pytest.mark.parametrize(
    "source, device_type",
    [
        # the device accelerate picks at launch, through a name, or where `prepare` moves the model
        (
            ENGINE + "device = accelerator.device\nmodel.to(device)\nopt = torch.optim.AdamW(model.parameters())\n",
            "device.type",
        ),
        (
            ENGINE + "opt = torch.optim.AdamW(model.parameters())\nmodel, opt = accelerator.prepare(model, opt)\n",
            "accelerator.device.type",
        ),
        # a LightningModule's parameters in configure_optimizers(), over parameter groups
        (LIT, "self.device.type"),
        (LIT.replace("import lightning as L", "import pytorch_lightning as L"), "self.device.type"),
        (LIT.replace("self.parameters()", "self.net.parameters()"), "self.device.type"),
    ],
)
def test_devices_picked_at_launch_get_a_device_type_guard(source, device_type):
    new_source = rewrite(source, [UnfusedOptimizer])
    assert GUARD.replace("TYPE", device_type) in new_source.replace("\n", " ")
    assert "picks at launch" in process(source)[0].message


def process(source: str):
    from codemod.config import Settings
    from codemod.engine import process_source

    result = process_source(source.encode(), "<t>", Settings(select=("PM402",), level=UnfusedOptimizer.LEVEL))
    assert result.error is None
    return result.findings


@pytest.mark.parametrize(
    "source, reason",
    [
        # a plain class named like Lightning's, or another method: the trainer's placement is not known
        (LIT.replace("(L.LightningModule)", "(nn.Module)").replace("import lightning as L\n", ""), None),
        (LIT.replace("def configure_optimizers(self)", "def build(self)"), None),
        # the optimizer class named on the command line, with only a default
        (
            "import argparse\nimport torch\nap = argparse.ArgumentParser()\nap.add_argument('--optim', default='AdamW')\n"
            "args = ap.parse_args()\nmodel = torch.nn.Linear(8, 1).to('cuda')\n"
            "opt = getattr(torch.optim, args.optim)(model.parameters(), lr=1e-3)\n",
            "`--optim` has no `choices=`: its default AdamW has fused kernels",
        ),
        (
            "import argparse\nimport torch\nap = argparse.ArgumentParser()\n"
            "ap.add_argument('--optim', default='AdamW', choices=['AdamW', 'RMSprop'])\n"
            "args = ap.parse_args()\nmodel = torch.nn.Linear(8, 1).to('cuda')\n"
            "opt = getattr(torch.optim, args.optim)(model.parameters(), lr=1e-3)\n",
            "",
        ),
    ],
)
def test_optimizers_whose_device_or_class_cannot_be_told_are_not_fused(source, reason):
    """None: no fix (no finding, or a report); a reason: reported with it; "": no finding (RMSprop has no fused)."""
    findings = process(source)
    assert not any(f.fixable for f in findings)
    if reason == "":
        assert findings == []
    elif reason is not None:
        assert [reason in f.message for f in findings] == [True]


def test_the_launch_guard_builds_and_steps_on_the_cpu():
    """The guard the rewrite writes, evaluated where the run lands (here the CPU): fused AdamW
    over parameter groups builds and steps."""
    model = torch.nn.Linear(8, 1)
    device = torch.device("cpu")
    groups = [{"params": [model.weight], "weight_decay": 0.1}, {"params": [model.bias]}]
    opt = torch.optim.AdamW(groups, lr=1e-3, fused=device.type in ("cuda", "cpu"))
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    assert opt.param_groups[0]["fused"] is True

"""PM301 and values read to the host in the forward pass (`.item()`): a value that only
sets a Python number (a loss weight) through tests whose branches run no device work, or
that is only tested for NaN or infinity, does not decide what runs, and the forward pass
is wrapped (LatentWire's autoscaled first-token loss, train.py at a688314); a value that
picks device work, jumps or loop bounds still does, and is reported."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.forward_without_autocast import ForwardWithoutAutocast
from tests.rules.scripts import losses, max_relative_difference, rewrite

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM301" / "loss_weight_from_item.in.py"
SOURCE = FIXTURE.read_text()
TOLERANCE = 5e-3  # as in test_pm301_execution: bf16 autocast against float32 over 20 steps
BRANCH = "        if ratio > 1.0:\n            first_weight *= max(min(ratio, 8.0), 1.0)\n"
DECIDES = "the forward pass decides what runs next"


def findings(source: str):
    settings = Settings(select=("PM301",), level=Level.NUMERIC)
    result = process_source(source.encode(), "train.py", settings, [ForwardWithoutAutocast])
    assert result.error is None, result.error
    return result.findings


def test_the_autoscaled_loss_weight_trains_under_bf16_within_tolerance(monkeypatch):
    monkeypatch.setenv("PERFMOD_AMP", "bf16")
    want = losses(SOURCE)
    got = losses(rewrite(SOURCE, [ForwardWithoutAutocast]))
    assert len(want) == 20 and not torch.equal(got, want)  # autocast did run
    assert max_relative_difference(got, want) < TOLERANCE


@pytest.mark.parametrize(
    "branch",
    [
        "        first_weight = 0.5 * min(ratio, 8.0) if ratio > 1.0 else first_weight\n",
        BRANCH + "        elif ratio < 0.5:\n            first_weight = 0.25\n        else:\n            pass\n",
    ],
    ids=["conditional expression", "elif and else"],
)
def test_other_tests_that_only_pick_a_number_are_fixed(branch):
    [finding] = findings(SOURCE.replace(BRANCH, branch))
    assert finding.applied, finding.message


def test_a_nan_guard_on_the_value_read_is_not_a_decision():
    source = SOURCE.replace(
        "    if denom > 0.0:\n", "    if math.isnan(denom):\n        continue\n    if denom > 0.0:\n"
    )
    [finding] = findings("import math\n" + source)
    assert finding.applied, finding.message


@pytest.mark.parametrize(
    "branch",
    [
        "        if ratio > 1.0:\n            loss_first = loss_first + first(hidden).pow(2).mean()\n",
        "        if ratio > 4.0:\n            break\n",
        BRANCH + "    if first_weight > 4.0:\n        continue\n",
        BRANCH + "    for _ in range(int(first_weight)):\n        loss_first = loss_first * 0.9\n",
    ],
    ids=["device work in a branch", "a jump", "a jump on the number set", "a loop bound"],
)
def test_a_value_that_picks_device_work_or_jumps_is_still_reported(branch):
    [finding] = findings(SOURCE.replace(BRANCH, branch))
    assert not finding.applied and DECIDES in finding.message, finding.message

"""PM402 on an optimizer class named on the command line: `getattr(torch.optim,
args.optim)(...)`. With `choices=` that all have fused kernels it is fixed
(fixtures/rules/PM402/named_optimizer_choices); with only a default it is
reported, because torch.optim's other optimizers reject the `fused` keyword
itself, whatever its value, so no `fused=<guard>` can stay valid for them."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from codemod.analysis import torch_facts
from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.unfused_optimizer import UnfusedOptimizer

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM402"


def torch_optimizers_taking_fused() -> set[str]:
    return {
        f"torch.optim.{name}"
        for name, cls in vars(torch.optim).items()
        if isinstance(cls, type)
        and issubclass(cls, torch.optim.Optimizer)
        and "fused" in inspect.signature(cls).parameters
    }


def test_the_optimizers_that_take_fused_are_the_installed_torchs():
    assert set(torch_facts.FUSED_OPTIMIZERS) == torch_optimizers_taking_fused()


def test_an_optimizer_without_fused_kernels_rejects_the_keyword_whatever_its_value():
    params = [torch.nn.Parameter(torch.zeros(2))]
    for value in (True, False, None):
        with pytest.raises(TypeError, match="fused"):
            torch.optim.RMSprop(params, fused=value)


def test_an_option_with_only_a_default_is_reported_with_the_exact_reason():
    source = (FIXTURES / "named_optimizer_default_only.in.py").read_bytes()
    settings = Settings(select=("PM402",), level=Level.NUMERIC)
    result = process_source(source, "train.py", settings, [UnfusedOptimizer])
    assert result.error is None, result.error
    assert result.new_source in (None, source)
    [finding] = result.findings
    assert not finding.applied
    message = finding.message
    assert "`--optim`" in message and "no `choices=`" in message, message
    assert "its default AdamW has fused kernels" in message, message
    # the exact set of torch.optim's optimizers that take the keyword, from the table the test above checks
    assert "Adagrad, Adam, AdamW and SGD" in message, message
    assert "TypeError" in message, message

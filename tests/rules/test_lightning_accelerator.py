"""Where a Lightning Trainer trains is one answer (`lightning_trainers(context).accelerator`)
that PM301 (the Trainer's `precision=`) and PM302 (TF32 at start-up) both ask. They used to
ask two: PM302 took any accelerator whose value as written is a GPU, PM301 only a plain
one, so on `"gpu" if args.gpu else args.accelerator` PM302 enabled TF32 while PM301 said
the accelerator "cannot be told". Each case below runs both rules on the same script.
Lightning is not installed here: the precision a fix writes is evaluated as Python."""

from __future__ import annotations

import argparse

import libcst as cst
import pytest

from codemod.analysis.lightning import lightning_trainers
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.float32_matmul_without_tf32 import Float32MatmulWithoutTf32
from codemod.rules.forward_without_autocast import ForwardWithoutAutocast

SCRIPT = """\
import argparse
import os

import lightning as L
import torch
import torch.nn as nn


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(512, 512)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelerator", default="{default}")
    ap.add_argument("--gpu", action="store_true")
    args = ap.parse_args()
    trainer = L.Trainer(accelerator={accelerator}, max_epochs=2)
    trainer.fit(Net(), [torch.randn(4, 512)])


if __name__ == "__main__":
    main()
"""


def run(rule, source: str):
    settings = Settings(select=(rule.CODE,), level=Level.NUMERIC)
    result = process_source(source.encode(), "train.py", settings, [rule])
    assert result.error is None, result.error
    return result.findings, result.new_source.decode() if result.new_source is not None else source


def place(source: str):
    context = FileContext(cst.parse_module(source), "train.py", Settings(), source)
    trainers = lightning_trainers(context)
    (build,) = trainers.builds
    return trainers.accelerator(build)


def precision_written(new: str, args: argparse.Namespace) -> str:
    """The `precision=` PM301 gave the Trainer, evaluated with the parsed options `args`."""
    call = next(
        node
        for node in cst.parse_module(new).body[-2].body.body
        if isinstance(node, cst.SimpleStatementLine) and "Trainer(" in cst.Module([node]).code
    )
    value = next(a.value for a in call.body[0].value.args if a.keyword and a.keyword.value == "precision")
    code = cst.Module([]).code_for_node(value)  # split over lines as black splits it
    return eval(f"({code})", {"args": args})  # a choice between two strings


# accelerator, the option's default, where it trains, whether both rules fix it
CASES = [
    ("args.accelerator", "gpu", "option", True),
    ('"gpu" if args.gpu else args.accelerator', "cuda", "option", True),
    ('"auto"', "gpu", "auto", False),
    ("args.accelerator", "auto", "auto", False),
    ('os.environ.get("ACCELERATOR")', "gpu", "unknown", False),
    ('"cpu"', "gpu", "other", False),
]


@pytest.mark.parametrize("accelerator, default, where, fixed", CASES)
def test_both_rules_read_the_accelerator_the_same_way(accelerator, default, where, fixed):
    source = SCRIPT.format(accelerator=accelerator, default=default)
    answer = place(source)
    assert answer.place == where
    autocast, with_precision = run(ForwardWithoutAutocast, source)
    tf32, with_tf32 = run(Float32MatmulWithoutTf32, source)
    # PM301 fixes exactly where PM302 does: a CUDA GPU as the script is written
    assert answer.on_cuda is fixed
    assert bool(autocast and autocast[0].applied) is fixed, [f.message for f in autocast]
    assert bool(tf32 and tf32[0].applied) is fixed, [f.message for f in tf32]
    if fixed:
        assert 'torch.set_float32_matmul_precision("high")' in with_tf32
        return
    assert with_precision == source and with_tf32 == source
    assert tf32 == []
    if where == "other":
        assert autocast == []
    else:  # reported with the reason the accelerator is not known to be a CUDA GPU
        assert len(autocast) == 1 and answer.why in autocast[0].message, autocast[0].message


@pytest.mark.parametrize("accelerator, default", [c[:2] for c in CASES if c[3]])
def test_the_precision_follows_the_accelerator_given_on_the_command_line(accelerator, default):
    _, new = run(ForwardWithoutAutocast, SCRIPT.format(accelerator=accelerator, default=default))
    for given, gpu, wanted in [
        (default, False, "bf16-mixed"),
        ("cpu", False, "32-true"),
        ("cpu", True, "bf16-mixed" if "args.gpu" in accelerator else "32-true"),
        ("cuda", False, "bf16-mixed"),
    ]:
        assert precision_written(new, argparse.Namespace(accelerator=given, gpu=gpu)) == wanted, (given, gpu)


@pytest.mark.parametrize(
    "accelerator",
    ['os.environ.get("ACCELERATOR", "gpu")', '"gpu" if torch.cuda.device_count() else args.accelerator'],
)
def test_an_accelerator_that_is_a_gpu_only_as_written_and_cannot_be_evaluated_again(accelerator):
    """An environment variable's default, a call in the test: the place is the same for both
    rules (TF32 is enabled), and PM301 says why it writes no precision that follows it."""
    source = SCRIPT.format(accelerator=accelerator, default="cuda")
    answer = place(source)
    assert answer.place == "option" and answer.on_cuda and not answer.follows
    tf32, _ = run(Float32MatmulWithoutTf32, source)
    assert len(tf32) == 1 and tf32[0].applied
    autocast, new = run(ForwardWithoutAutocast, source)
    assert new == source and len(autocast) == 1 and not autocast[0].applied
    assert "is a CUDA GPU only as the script is written" in autocast[0].message, autocast[0].message

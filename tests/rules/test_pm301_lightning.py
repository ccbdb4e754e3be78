"""PM301 on PyTorch Lightning: a `Trainer` that trains a LightningModule on a CUDA
GPU without `precision=` gets `precision="bf16-mixed"` (Lightning then runs every
training_step under bf16 autocast), not a with-block inside `training_step`.
Lightning is not installed here: these tests are source-level, and the expected
outputs are written as a Lightning user writes them."""

from __future__ import annotations

import textwrap

import pytest

from codemod.analysis import torch_facts
from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.forward_without_autocast import ForwardWithoutAutocast


def check(source: str):
    source = textwrap.dedent(source)
    settings = Settings(select=("PM301",), level=Level.NUMERIC)
    result = process_source(source.encode(), "train.py", settings, [ForwardWithoutAutocast])
    assert result.error is None, result.error
    new = result.new_source.decode() if result.new_source is not None else source
    return result.findings, new


MODULE = """\
import lightning as L
import torch
from torch import nn


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(32, 32)

    def training_step(self, batch, batch_idx):
{step}
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


"""
STEP = "        return self.layer(batch).pow(2).mean()\n"


def script(trainer: str, step: str = STEP, head: str = "") -> str:
    return head + MODULE.format(step=step) + f"trainer = {trainer}\ntrainer.fit(Net(), loader)\n"


@pytest.mark.parametrize(
    "trainer",
    [
        'L.Trainer(accelerator="gpu", devices=1)',
        'L.Trainer(accelerator="cuda")',
        "L.Trainer(accelerator='gpu', devices=[0, 1])",
    ],
)
def test_a_trainer_on_a_cuda_gpu_gets_bf16_mixed_precision(trainer):
    found, new = check(script(trainer))
    assert len(found) == 1 and found[0].applied, found
    fixed = trainer[:-1] + ', precision="bf16-mixed")'
    assert new == script(fixed)
    again, newer = check(new)
    assert again == [] and newer == new


@pytest.mark.parametrize(
    "head, trainer",
    [
        ("from lightning.pytorch import Trainer\n", 'Trainer(accelerator="gpu")'),
        ("import pytorch_lightning as pl\n", 'pl.Trainer(accelerator="gpu")'),
        ("from pytorch_lightning import Trainer as PLTrainer\n", 'PLTrainer(accelerator="gpu")'),
        ("import lightning.pytorch\n", 'lightning.pytorch.Trainer(accelerator="gpu")'),
    ],
)
def test_every_spelling_of_lightnings_trainer(head, trainer):
    found, new = check(script(trainer, head=head))
    assert len(found) == 1 and found[0].applied, found
    assert new == script(trainer[:-1] + ', precision="bf16-mixed")', head=head)


def test_an_accelerator_option_defaulting_to_gpu_gets_the_precision_for_gpus_only():
    head = 'import argparse\nap = argparse.ArgumentParser()\nap.add_argument("--accelerator", default="gpu")\nargs = ap.parse_args()\n'
    found, new = check(script("L.Trainer(accelerator=args.accelerator)", head=head))
    assert len(found) == 1 and found[0].applied, found
    assert 'precision="bf16-mixed" if args.accelerator in ("gpu", "cuda") else "32-true"' in new, new


@pytest.mark.parametrize(
    "trainer, reason",
    [
        ("L.Trainer(max_epochs=3)", 'the accelerator is "auto", the default,'),
        ('L.Trainer(accelerator="auto", devices=2)', 'the accelerator is "auto",'),
        ("L.Trainer(accelerator=args.accelerator)", "`args.accelerator`"),
        ('L.Trainer(accelerator="gpu", plugins=[plugin])', "plugins="),
        ('L.Trainer(accelerator="gpu", **config)', "**config"),
    ],
)
def test_not_provably_a_cuda_gpu_is_reported_with_the_reason(trainer, reason):
    head = 'import argparse\nap = argparse.ArgumentParser()\nap.add_argument("--accelerator")\nargs = ap.parse_args()\n'
    source = script(trainer, head=head)
    found, new = check(source)
    assert new == source
    assert len(found) == 1 and not found[0].applied, found
    assert reason in found[0].message and "bf16-mixed" in found[0].message, found[0].message


def test_auto_is_reported_because_it_may_pick_the_cpu():
    found, _ = check(script("L.Trainer()"))
    assert "picks the CPU where no GPU is present" in found[0].message, found[0].message


@pytest.mark.parametrize(
    "source",
    [
        script('L.Trainer(accelerator="gpu", precision="16-mixed")'),
        script('L.Trainer(accelerator="gpu", precision=32)'),
        script('L.Trainer(accelerator="cpu")'),
        script(
            'L.Trainer(accelerator="gpu")',
            step="        with torch.autocast('cuda', dtype=torch.bfloat16):\n"
            "            return self.layer(batch).pow(2).mean()\n",
        ),
        # a class of the file named Trainer is not Lightning's
        MODULE.format(step=STEP)
        + "class Trainer:\n    def __init__(self, accelerator):\n        pass\n\n    def fit(self, m):\n        pass\n\n\n"
        + 'Trainer(accelerator="gpu").fit(Net())\n',
    ],
    ids=["precision set", "full precision asked for", "cpu", "module autocasts", "own class"],
)
def test_left_alone(source):
    found, new = check(source)
    assert found == [] and new == source


def test_the_precision_written_is_one_lightning_accepts():
    assert torch_facts.LIGHTNING_MIXED_PRECISION in torch_facts.LIGHTNING_PRECISIONS
    assert torch_facts.LIGHTNING_MIXED_PRECISION == "bf16-mixed"


def test_the_module_is_followed_through_a_name_and_a_subclass():
    source = script('L.Trainer(accelerator="gpu")').replace(
        "trainer.fit(Net(), loader)\n",
        "class Deeper(Net):\n    pass\n\n\nmodel = Deeper()\ntrainer.fit(model, loader)\n",
    )
    found, new = check(source)
    assert len(found) == 1 and found[0].applied, found
    assert 'L.Trainer(accelerator="gpu", precision="bf16-mixed")' in new


def test_a_module_that_builds_a_cudnn_rnn_is_reported_and_fixed_with_float16_when_asked():
    source = script('L.Trainer(accelerator="gpu")').replace("nn.Linear(32, 32)", "nn.LSTM(32, 32)")
    found, new = check(source)
    assert new == source and len(found) == 1 and not found[0].applied
    assert "`nn.LSTM` (line 9) is a cuDNN RNN" in found[0].message and 'precision="16-mixed"' in found[0].message
    settings = Settings(select=("PM301",), level=Level.NUMERIC).with_overrides(amp="fp16")
    result = process_source(source.encode(), "train.py", settings, [ForwardWithoutAutocast])
    assert 'L.Trainer(accelerator="gpu", precision="16-mixed")' in result.new_source.decode()


@pytest.mark.parametrize(
    "source, reason",
    [
        (MODULE.format(step=STEP) + 'trainer = L.Trainer(accelerator="gpu")\n', "no `fit(...)` of it in this file"),
        (
            "from models import Net\n"
            + MODULE.format(step=STEP).replace("class Net(", "class Other(")
            + 'L.Trainer(accelerator="gpu").fit(Net())\n',
            "not a LightningModule class of this file",
        ),
    ],
    ids=["no fit", "imported module"],
)
def test_a_module_that_cannot_be_read_is_reported(source, reason):
    found, new = check(source)
    assert new == source and len(found) == 1 and not found[0].applied, found
    assert reason in found[0].message, found[0].message

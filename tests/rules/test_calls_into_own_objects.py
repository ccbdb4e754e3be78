"""Rules see the work a training loop does through calls into the file's own objects: a
step method called on a parameter (`fit(module)` runs `module.training_step(batch)`),
a callback object's method (`self.callback.on_epoch_end(self, val)`), and a model that
a builder of the file returns (`model = build(device)`). Programs of the blind round."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.unfused_optimizer import UnfusedOptimizer
from tests.rules.scripts import losses, max_relative_difference, rewrite

PM402_TOLERANCE = 1e-5  # fused Adam on the CPU: another kernel, within tolerance (test_pm402_execution)


def findings(source: str, codes: str, level: Level = Level.UNSAFE):
    result = process_source(source.encode(), "<t>", Settings(select=tuple(codes.split(",")), level=level))
    assert result.error is None, result.error
    return result


STEP_METHOD = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Lit(nn.Module):
    def __init__(self):
        super().__init__()
        self.net, self.logged = nn.Linear(16, 1), []

    def training_step(self, batch):
        x, y = batch
        loss = (self.net(x) - y).square().mean()
        self.logged.append(loss.item())
        return loss


def fit(module, loader, device):
    module.to(device)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    for batch in loader:
        batch = [t.to(device) for t in batch]
        loss = module.training_step(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
X, Y = torch.randn(64, 16), torch.randn(64, 1)
fit(Lit(), DataLoader(TensorDataset(X, Y), batch_size=8), device)
"""


def test_a_read_in_the_step_method_a_function_calls_on_its_parameter_is_reported_where_it_is():
    result = findings(STEP_METHOD, "PM404")
    (finding,) = result.findings
    assert finding.line == 14 and not finding.fixable
    assert "`module.training_step` runs it on every step of the loop at line 21" in finding.message


def test_small_batches_of_a_loop_that_syncs_in_its_step_method_are_neither_pinned_nor_copied_without_blocking():
    """The loop waits for the device every step, in the method it calls: an overlap of a
    1 KB copy buys nothing (the blind round's #17)."""
    result = findings(STEP_METHOD, "PM101,PM102")
    assert result.new_source.decode() == STEP_METHOD
    (pinned,) = [f for f in result.findings if f.code == "PM102"]
    assert not pinned.fixable and "the loop reads `loss.item()` every step (line 14)" in pinned.message
    assert not [f for f in result.findings if f.code == "PM101" and f.fixable]


BUILDER = """\
import torch
import torch.nn as nn


def build(device):
    return nn.Linear(8, 1).to(device)


torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = build(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(20):
    loss = model(torch.randn(4, 8, device=device)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("loss", loss.item())
"""
TWO_BUILT = """\
import torch
import torch.nn as nn


def build(device):
    g = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    d = nn.Linear(1, 1).to(device)
    return g, d


torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
g, d = build(device)
opt_g = torch.optim.Adam(g.parameters(), lr=1e-2)
opt_d = torch.optim.SGD(d.parameters(), lr=1e-2, momentum=0.9)
for step in range(20):
    loss = d(g(torch.randn(4, 8, device=device))).square().mean()
    opt_g.zero_grad()
    opt_d.zero_grad()
    loss.backward()
    opt_g.step()
    opt_d.step()
    print("loss", loss.item())
"""


def test_a_model_a_builder_of_the_file_returns_is_where_the_builder_moves_it():
    for source, fused in ((BUILDER, 1), (TWO_BUILT, 2)):
        new_source = rewrite(source, [UnfusedOptimizer])
        assert new_source.count("fused=True") == fused
        assert max_relative_difference(losses(new_source), losses(source)) < PM402_TOLERANCE


def test_a_builder_whose_models_are_not_all_moved_to_one_device_is_reported_with_that_reason():
    source = BUILDER.replace(
        "def build(device):\n", "def build(device, big=True):\n    if not big:\n        return nn.Linear(8, 1)\n"
    )
    result = findings(source, "PM402", Level.NUMERIC)
    (finding,) = result.findings
    assert not finding.fixable
    assert "the models `build` returns (lines 7 and 8) are not all moved to one device" in finding.message


CALLBACK = """\
import os
import tempfile

import torch
import torch.nn as nn


class BestCheckpoint:
    def __init__(self, folder):
        self.path = os.path.join(folder, "best.pt")
        self.best = float("inf")

    def on_epoch_end(self, trainer, val_loss):
        if val_loss < self.best:
            self.best = val_loss
            torch.save(trainer.model.state_dict(), self.path)

    def on_plateau(self, trainer):
        trainer.model.load_state_dict(torch.load(self.path))


class Trainer:
    def __init__(self, model, callback):
        self.model = model
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.callback = callback

    def fit(self, epochs):
        for epoch in range(epochs):
            loss = self.model(torch.randn(32, 64)).square().mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.callback.on_epoch_end(self, loss.item())
            if epoch % 2 == 1:
                self.callback.on_plateau(self)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 2048))
Trainer(model, BestCheckpoint(FOLDER)).fit(4)
"""


def test_a_save_in_a_callback_objects_method_whose_file_is_reloaded_is_reported():
    result = findings(CALLBACK, "PM405")
    (finding,) = result.findings
    assert finding.line == 16 and not finding.fixable
    assert "the file is used at line 19 (`torch.load(self.path)`)" in finding.message


def test_a_save_in_a_callback_objects_method_is_written_in_the_background_with_the_same_bytes():
    source = CALLBACK.replace("            if epoch % 2 == 1:\n                self.callback.on_plateau(self)\n", "")
    result = findings(source, "PM405")
    (finding,) = result.findings
    assert finding.fixable
    new_source = result.new_source.decode()
    assert "checkpointer.save(trainer.model.state_dict(), self.path)" in new_source
    saved = []
    for program in (source, new_source):
        with tempfile.TemporaryDirectory() as folder:
            exec(compile(program, "<t>", "exec"), {"__name__": "__main__", "FOLDER": folder})
            saved.append(torch.load(Path(folder) / "best.pt", weights_only=True))
    assert list(saved[0]) == list(saved[1])
    assert all(torch.equal(saved[0][key], saved[1][key]) for key in saved[0])


OTHER_CLASS_MODEL = """\
import torch
import torch.nn as nn


class Lit:
    def __init__(self):
        self.model = nn.Linear(8, 1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def training_step(self, x):
        return self.model(x).square().mean()


class MiniTrainer:
    def fit(self, module, batches):
        opt = module.configure_optimizers()
        for x in batches:
            loss = module.training_step(x)
            opt.zero_grad()
            loss.backward()
            opt.step()


MiniTrainer().fit(Lit(), [torch.randn(4, 8) for _ in range(3)])
"""


def test_a_model_of_another_class_that_the_loop_trains_through_its_methods_gets_that_reason():
    result = findings(OTHER_CLASS_MODEL, "PM601")
    (finding,) = result.findings
    assert "`self.model` is an attribute of `Lit`, whose methods the loop calls from outside the class" in (
        finding.message
    )

"""PM405: the rewritten loop writes the same checkpoints, from the state at save time.

The fixture trains on the CPU and saves inside its loops (every 3 steps and every
epoch); training goes on changing the saved tensors in place right after each
save. The original (synchronous) run and the rewritten (background) run must
leave the same files with the same contents.
"""

import contextlib
import io
import time
from pathlib import Path

import pytest
import torch

import runtime.checkpoint
from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Level
from codemod.rules.synchronous_checkpoint_in_loop import SynchronousCheckpointInLoop

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM405"
SETTINGS = Settings(select=(SynchronousCheckpointInLoop.CODE,), level=SynchronousCheckpointInLoop.LEVEL)


def rewrite(source: str) -> tuple[str, list]:
    result = process_source(source.encode(), "<fixture>", SETTINGS, [SynchronousCheckpointInLoop])
    assert result.error is None, result.error
    return result.new_source.decode(), result.findings


def run(source: str, folder: Path, monkeypatch) -> list[str]:
    """Run a fixture script with its checkpoints going to `folder`; its printed lines."""
    monkeypatch.setenv("CHECKPOINT_DIR", str(folder))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "<fixture>", "exec"), {"__name__": "__main__"})
    return out.getvalue().splitlines()


def assert_same(saved, expected, where: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(saved, torch.Tensor) and saved.dtype == expected.dtype, where
        assert torch.equal(saved, expected), f"{where}: tensor differs"
    elif isinstance(expected, dict):
        assert isinstance(saved, dict) and list(saved) == list(expected), f"{where}: keys differ"
        for key in expected:
            assert_same(saved[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(saved) is type(expected) and len(saved) == len(expected), where
        for index, (a, b) in enumerate(zip(saved, expected)):
            assert_same(a, b, f"{where}[{index}]")
    else:
        assert saved == expected, where


def checkpoint_files(folder: Path) -> dict[str, object]:
    return {path.name: torch.load(path, weights_only=True) for path in sorted(folder.iterdir())}


@pytest.fixture
def training_loop():
    source = (FIXTURES / "save_in_training_loop.in.py").read_text()
    new_source, findings = rewrite(source)
    assert new_source == (FIXTURES / "save_in_training_loop.out.py").read_text()
    assert len(findings) == 2 and all(f.applied for f in findings)
    return source, new_source


def test_background_checkpoints_equal_the_synchronous_ones(training_loop, tmp_path, monkeypatch):
    source, new_source = training_loop
    before = run(source, tmp_path / "before", monkeypatch)
    after = run(new_source, tmp_path / "after", monkeypatch)
    assert after == before
    saved, expected = checkpoint_files(tmp_path / "after"), checkpoint_files(tmp_path / "before")
    assert sorted(saved) == sorted(expected) and len(expected) == 6  # 4 every 3 steps, last.pt, final.pt
    assert not [p for p in (tmp_path / "after").iterdir() if p.name.startswith(".")], "temporary files left"
    for name in expected:
        assert_same(saved[name], expected[name], name)
    assert set(saved["last.pt"]) == {"model", "optimizer", "epoch"} and saved["last.pt"]["optimizer"]["state"]


def test_without_the_snapshot_the_files_would_differ(training_loop, tmp_path, monkeypatch):
    """The comparison above catches a checkpointer that writes the live tensors: with the
    CPU snapshot switched off and the write delayed, training changes them first."""
    _, new_source = training_loop
    write = runtime.checkpoint._write_atomically

    def late_write(snapshot, path):
        time.sleep(0.2)
        write(snapshot, path)

    monkeypatch.setattr(runtime.checkpoint, "_snapshot_to_cpu", lambda obj: obj)
    monkeypatch.setattr(runtime.checkpoint, "_write_atomically", late_write)
    run(new_source, tmp_path / "live", monkeypatch)
    monkeypatch.undo()
    run((FIXTURES / "save_in_training_loop.in.py").read_text(), tmp_path / "before", monkeypatch)
    live, expected = checkpoint_files(tmp_path / "live"), checkpoint_files(tmp_path / "before")
    with pytest.raises(AssertionError):
        for name in expected:
            assert_same(live[name], expected[name], name)


def test_second_run_finds_nothing_to_fix():
    _, findings = rewrite((FIXTURES / "save_in_training_loop.out.py").read_text())
    assert not findings


def test_report_only_saves_say_why():
    source = (FIXTURES / "report_only.in.py").read_text()
    new_source, findings = rewrite(source)
    assert new_source == source == (FIXTURES / "report_only.out.py").read_text()
    assert [f.line for f in findings] == [19, 20, 22] and not any(f.fixable for f in findings)
    assert "whole module" in findings[0].message
    assert "rank 0 only" in findings[1].message
    assert "line 23" in findings[2].message and "before a background write" in findings[2].message


RELOADING_TRAINER = """\
import os
import tempfile

import torch
import torch.nn as nn


class Trainer:
    def __init__(self):
        self.model = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 2048))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.path = os.path.join(tempfile.mkdtemp(), "best.pt")

    def on_epoch_end(self):
        torch.save(self.model.state_dict(), self.path)

    def on_plateau(self):
        self.model.load_state_dict(torch.load(self.path))

    def fit(self, epochs):
        for epoch in range(epochs):
            loss = self.model(torch.randn(32, 64)).square().mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.on_epoch_end()
            if epoch % 2 == 1:
                self.on_plateau()


Trainer().fit(6)
"""


@pytest.mark.parametrize(
    "source",
    [
        RELOADING_TRAINER,
        # the save written in the loop itself, the reload in a method the loop calls
        RELOADING_TRAINER.replace(
            "            self.on_epoch_end()\n", "            torch.save(self.model.state_dict(), self.path)\n"
        ),
    ],
)
def test_a_file_on_the_object_reloaded_by_another_method_the_loop_runs_stays_synchronous(source):
    """`torch.load(self.path)` in `on_plateau`, which the loop calls after the save: a
    background write would let it read the previous file."""
    new, findings = rewrite(source)
    assert new == source
    assert len(findings) == 1 and not findings[0].fixable
    assert "the file is used at line 18 (`torch.load(self.path)`)" in findings[0].message, findings[0].message


def test_a_file_on_the_object_that_no_function_of_the_loop_reads_is_written_in_the_background():
    source = RELOADING_TRAINER.replace("            if epoch % 2 == 1:\n                self.on_plateau()\n", "")
    new, findings = rewrite(source)
    assert len(findings) == 1 and findings[0].fixable
    assert "checkpointer.save(self.model.state_dict(), self.path)" in new


KEEPER = """\
import torch


def save_latest(path, state):
    torch.save(state, path)
"""
LAST_STEP = """\
import torch
from keeper import save_latest

net = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(11):
    last_step = step == 10
    if last_step:
        save_latest("final.pt", net.state_dict())
    if {ends}:
        break
    net(torch.randn(2, 8)).sum().backward()
    opt.step()
"""


def test_a_project_save_on_the_step_that_then_breaks_gets_no_finding(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "keeper.py").write_text(KEEPER)
    findings = {}
    for ends in ("last_step", "step == 5"):
        source = LAST_STEP.format(ends=ends)
        (tmp_path / "train.py").write_text(source)
        result = process_source(source.encode(), str(tmp_path / "train.py"), SETTINGS, [SynchronousCheckpointInLoop])
        assert result.error is None, result.error
        findings[ends] = [f.code for f in result.findings]
    assert findings == {"last_step": [], "step == 5": ["PM405"]}


MODDED_NANOGPT = """\
import os
from dataclasses import dataclass

import torch


@dataclass
class Hyperparameters:
    num_iterations: int = 100
    save_every: int = {default}  # every how many steps to save? 0 for only at the end


args = Hyperparameters()
master_process = int(os.environ.get("RANK", 0)) == 0
net = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(args.num_iterations + 1):
    last_step = step == args.num_iterations
    if master_process and (last_step or (args.save_every > 0 and step % args.save_every == 0)):
        log = dict(step=step, model=net.state_dict(), optimizer=opt.state_dict())
        torch.save(log, "state_step%06d.pt" % step)
    if last_step:
        break
    net(torch.randn(2, 8)).sum().backward()
    opt.step()
"""


def test_the_save_a_save_every_default_of_0_leaves_to_the_last_step_is_left_alone():
    """modded-nanogpt's records: `args.save_every > 0` is false at the field's default, so
    the save runs only right before `if last_step: break`; with 100 it is periodic."""
    source = MODDED_NANOGPT.format(default=0)
    new_source, findings = rewrite(source)
    assert (new_source, findings) == (source, [])
    new_source, findings = rewrite(MODDED_NANOGPT.format(default=100))
    assert [f.code for f in findings] == ["PM405"] and "checkpointer" in new_source


SAVED_BY_A_METHOD = """\
import os
import tempfile

import torch
import torch.nn as nn


class Trainer:
    def __init__(self, width, out_dir):
        self.model = nn.Linear(width, width)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.out_dir = out_dir

    def save_checkpoint(self, path):
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, path)

    def fit(self, epochs):
        for epoch in range(epochs):
            loss = self.model(torch.randn(4, self.model.in_features)).square().mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.save_checkpoint(os.path.join(self.out_dir, f"epoch_{epoch}.pt"))


Trainer(int(os.environ.get("WIDTH", "8")), tempfile.mkdtemp()).fit(2)
"""


def test_a_path_a_method_is_given_is_read_from_the_argument_after_self():
    result = process_source(SAVED_BY_A_METHOD.encode(), "train.py", Settings(select=("PM405",), level=Level.UNSAFE))
    [finding] = [f for f in result.findings if f.code == "PM405"]
    assert finding.applied, finding.message
    assert "is used at line" not in finding.message

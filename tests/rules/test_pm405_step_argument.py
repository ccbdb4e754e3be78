"""PM405 and a checkpoint helper of another module given the loop's step counter: a
Python int is data the checkpointer copies, not a file the loop uses again, so the
helper runs in the background, and writes the same files."""

import glob
import os
import sys

import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.synchronous_checkpoint_in_loop import SynchronousCheckpointInLoop

CKPT = """\
import os

import torch


def save_latest(save_dir, state, step):
    os.makedirs(save_dir, exist_ok=True)
    torch.save(state, os.path.join(save_dir, f"step_{step}.pt"))
"""
TRAIN = """\
import torch
import torch.nn.functional as F

from pm405_steppkg.ckpt import save_latest


def main(save_dir):
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    for step in range(3):
        x = torch.randn(8, 512)
        loss = F.mse_loss(model(x), x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        save_latest(save_dir, {"model": model.state_dict(), "opt": opt.state_dict()}, step)
"""


def _saved(package_root, module: str, out) -> dict[str, float]:
    sys.path.insert(0, str(package_root))
    try:
        namespace: dict = {"__name__": module}
        exec(compile((package_root / "pm405_steppkg" / "train.py").read_text(), module, "exec"), namespace)
        namespace["main"](str(out))
    finally:
        sys.path.remove(str(package_root))
        for name in [n for n in sys.modules if n.startswith("pm405_steppkg")]:
            del sys.modules[name]
    return {
        os.path.basename(f): float(torch.load(f)["model"]["weight"].sum()) for f in sorted(glob.glob(f"{out}/*.pt"))
    }


def test_the_step_counter_given_to_a_checkpoint_helper_is_data(tmp_path):
    package = tmp_path / "pm405_steppkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ckpt.py").write_text(CKPT)
    train = package / "train.py"
    train.write_text(TRAIN)
    settings = Settings(select=("PM405",), level=Level.UNSAFE, root=tmp_path)
    result = process_source(TRAIN.encode(), str(train), settings, [SynchronousCheckpointInLoop])
    assert [(f.code, f.applied) for f in result.findings] == [("PM405", True)], result.findings
    before = _saved(tmp_path, "pm405_steppkg.train", tmp_path / "before")
    train.write_text(result.new_source.decode())
    after = _saved(tmp_path, "pm405_steppkg.train", tmp_path / "after")
    assert list(before) == ["step_0.pt", "step_1.pt", "step_2.pt"] and after == before

"""PM601's fixture pairs (fixtures/rules/PM601/*.out.py) run, on the CPU:

- with plain `python`, each rewrite prints exactly what its original prints and writes
  the same checkpoints, bit for bit: alone, nothing of the rewrite is active;
- under `torchrun --nproc_per_node=2` (gloo), each rewrite trains to the end, rank 0
  alone prints (as many lines as the single process) and writes each checkpoint once,
  with the single-process keys (a whole model saved is the model, not its DDP wrapper).

A stand-in `tqdm` (the fixtures' progress bars; tqdm is not a test dependency) passes
its iterable through.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "rules" / "PM601"
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TQDM = "def tqdm(iterable=None, *args, **kwargs):\n    return iterable\n"
# Arguments that keep each run to a few seconds of CPU.
CASES = {
    "eval_sum_loss": (),
    "helper_loader": ("--epochs", "2"),
    "logged_means": (),
    "main_block": (),
    "micro_batches": (),
    "moved_copy": (),
    "randperm_batches": (),
    "seeded_sampling": ("--steps", "51"),
    "trainer_class": (),
    "tutorial_trainer": ("2", "1"),  # total_epochs, save_every
    "whole_model_save": (),
}


def environment(stand_ins: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(stand_ins)]),
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    for name in TORCHRUN_VARS:
        env.pop(name, None)
    return env


def start(script: Path, folder: Path, args, stand_ins: Path, nproc: int | None = None) -> subprocess.Popen:
    folder.mkdir(parents=True)
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc else []
    return subprocess.Popen(
        [sys.executable, *launcher, str(script), *args],
        cwd=folder,
        env=environment(stand_ins),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> str:
    try:
        stdout, stderr = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == 0, stderr[-3000:]
    assert "terminate called" not in stderr
    return stdout


def checkpoints(folder: Path) -> dict[str, dict]:
    found = {}
    for path in sorted(folder.glob("*.pt")):
        state = torch.load(path, weights_only=False)
        if isinstance(state, torch.nn.Module):  # a whole model saved: its own class, not a wrapper's
            assert type(state).__module__.startswith("torch.nn.modules"), type(state)
            state = state.state_dict()
        found[path.name] = state.get("model", state) if isinstance(state, dict) else state
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_rewrite_runs_alone_exactly_as_before_and_under_torchrun_on_rank_0(case, tmp_path):
    stand_ins = tmp_path / "stand_ins"
    stand_ins.mkdir()
    (stand_ins / "tqdm.py").write_text(TQDM)
    args = CASES[case]
    original, rewrite = FIXTURES / f"{case}.in.py", FIXTURES / f"{case}.out.py"
    runs = {
        "original": start(original, tmp_path / "original", args, stand_ins),
        "rewritten": start(rewrite, tmp_path / "rewritten", args, stand_ins),
    }
    printed = {name: finish(process) for name, process in runs.items()}
    assert printed["original"] and printed["rewritten"] == printed["original"]
    before, after = checkpoints(tmp_path / "original"), checkpoints(tmp_path / "rewritten")
    assert before.keys() == after.keys()
    for name, state in before.items():
        assert list(after[name]) == list(state)
        assert all(torch.equal(after[name][key], value) for key, value in state.items())

    distributed = finish(start(rewrite, tmp_path / "torchrun", args, stand_ins, nproc=2))
    assert len(distributed.splitlines()) == len(printed["original"].splitlines())  # rank 0 alone prints
    saved = checkpoints(tmp_path / "torchrun")
    assert saved.keys() == before.keys()
    for name, state in saved.items():
        assert list(state) == list(before[name])  # no "module." prefix: loads into the plain model

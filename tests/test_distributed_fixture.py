"""The evidence PM601 must reproduce: fixtures/distributed/train_ddp_candidate.py and its
torchrun-ready version, written by hand, run three ways on the CPU (gloo):

- plain `python`: the torchrun-ready version is the original, bit for bit;
- `torchrun --nproc_per_node=2`: one log line per step, each checkpoint written once,
  unwrapped; a dataset that does not split evenly over the ranks does not hang, a
  batch that does not split fails on every rank at once;
- `perfmod verify --nproc 2`: the two ranks train like the single process at the same
  global batch (the per-rank batch is the original's / 2), and a rewrite that forgets
  `sampler.set_epoch(epoch)` is caught.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from codemod.rule import Level
from codemod.verify import verify
from codemod.verify_run import render_text

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "fixtures" / "distributed"
ORIGINAL, TORCHRUN = FOLDER / "train_ddp_candidate.py", FOLDER / "train_ddp_candidate.torchrun.py"
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def environment() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    for name in TORCHRUN_VARS:
        env.pop(name, None)
    return env


def launch(script: Path, out: Path, *args: str, nproc: int | None = None) -> subprocess.Popen:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc else []
    return subprocess.Popen(
        [sys.executable, *launcher, str(script), "--out", str(out), *args],
        cwd=out.parent,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return process.returncode, stdout, stderr


def log_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("epoch ")]


def test_plain_python_runs_the_torchrun_version_exactly_like_the_original(tmp_path):
    args = ("--samples", "256", "--epochs", "2", "--save-every", "4")
    original = launch(ORIGINAL, tmp_path / "original", *args)
    rewritten = launch(TORCHRUN, tmp_path / "rewritten", *args)
    (status, before, error), (status_after, after, error_after) = finish(original), finish(rewritten)
    assert status == 0, error
    assert status_after == 0, error_after
    assert len(log_lines(before)) == 8 and log_lines(after) == log_lines(before)  # 8 batches of 32 / 2 per step
    for name in ("step4.pt", "step8.pt"):  # the whole training state, bit for bit
        want, got = torch.load(tmp_path / "original" / name), torch.load(tmp_path / "rewritten" / name)
        assert (
            list(got["model"])
            == list(want["model"])
            == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
        )
        assert all(torch.equal(got["model"][key], want["model"][key]) for key in want["model"])
        assert got["optimizer"]["state"].keys() == want["optimizer"]["state"].keys()
        for index, state in want["optimizer"]["state"].items():
            assert all(torch.equal(got["optimizer"]["state"][index][k], v) for k, v in state.items())
    assert sorted(p.name for p in (tmp_path / "rewritten").iterdir()) == ["step4.pt", "step8.pt"]


def test_two_ranks_log_once_per_step_and_write_each_checkpoint_once(tmp_path):
    """250 samples: 125 per rank (DistributedSampler pads one), 7 batches of 16 each per
    epoch, so 3 optimizer steps and a micro-batch whose gradient is carried into the next
    epoch, as in the original. Both ranks make the same steps: none waits forever."""
    status, stdout, stderr = finish(
        launch(TORCHRUN, tmp_path / "out", "--samples", "250", "--epochs", "2", "--save-every", "2", nproc=2)
    )
    assert status == 0, stderr
    steps = [int(line.split()[3]) for line in log_lines(stdout)]
    assert steps == [1, 2, 3, 4, 5, 6]  # one line a step, from rank 0 alone
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["step2.pt", "step4.pt", "step6.pt"]
    state = torch.load(tmp_path / "out" / "step6.pt")
    assert state["step"] == 6 and not any(key.startswith("module.") for key in state["model"])
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)
    )
    model.load_state_dict(state["model"])  # the single-process model loads it as is
    assert "terminate called" not in stderr


def test_a_batch_that_does_not_split_over_the_ranks_fails_on_every_rank_without_hanging(tmp_path):
    status, stdout, stderr = finish(launch(TORCHRUN, tmp_path / "out", "--batch-size", "33", nproc=2), timeout=120)
    assert status != 0 and log_lines(stdout) == []
    assert stderr.count("ValueError: a global batch of 33 does not split evenly over 2 processes") == 2


# -- perfmod verify --nproc 2 ----------------------------------------------------------------------------

ARGS = ["--samples", "256", "--epochs", "3"]  # 4 optimizer steps per epoch: 10 steps reach the third
STEPS = 10


def verify_two_ranks(rewritten: Path):
    return verify(
        ORIGINAL,
        ARGS,
        steps=STEPS,
        warmup=2,
        level=Level.UNSAFE,
        nproc=2,
        rewritten=rewritten,
        env=environment(),
        timeout=300,
        rounds=1,  # the losses are what these tests check; a second round would double the torchrun runs
    )


def test_two_ranks_train_like_one_process_at_the_same_global_batch():
    result = verify_two_ranks(TORCHRUN)
    assert result.exit_code == 0 and result.agree, render_text(result)
    before, after = result.original.trace, result.rewritten.trace
    assert len(before["losses"]) == len(after["losses"]) == 2 * STEPS  # a loss per micro-batch
    # Float reordering only: the mean of two means of 16 is the mean of 32, the averaged gradient the same.
    assert result.comparison["max_rel_deviation"] < 1e-5
    assert before["samples_per_step"] == after["samples_per_step"] == [64] * STEPS
    ranks = after["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["samples_per_step"] == [32] * STEPS for r in ranks)
    assert all(r["process_group"] == {"initialized": True, "world_size": 2, "backend": "gloo"} for r in ranks)
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank its own half of every batch
    assert result.rewritten.sites == result.original.sites == {"loss": 1, "stepped": 1, "batch": 1}
    assert after["samples_per_s"] == pytest.approx(64 * after["steps_per_s"], rel=0.35)  # ranks' windows differ a bit


def test_a_rewrite_that_forgets_set_epoch_is_caught_from_the_second_epoch(tmp_path):
    source = TORCHRUN.read_text()
    forgetful = source.replace("        if sampler is not None:\n            sampler.set_epoch(epoch)\n", "")
    assert forgetful != source
    (tmp_path / "forgetful.py").write_text(forgetful)
    result = verify_two_ranks(tmp_path / "forgetful.py")
    assert result.exit_code == 1 and result.agree is False, render_text(result)
    losses = zip(result.original.trace["losses"], result.rewritten.trace["losses"])
    deviations = [abs(a - b) / abs(a) for a, b in losses]
    assert max(deviations[:8]) < 1e-5  # epoch 0 (4 steps of 2 micro-batches): the same samples
    assert max(deviations[8:]) > 1e-2  # epoch 1 repeats epoch 0's order in the rewrite


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_train_like_one_with_nccl():
    result = verify_two_ranks(TORCHRUN)
    assert result.exit_code == 0 and result.agree, render_text(result)
    ranks = result.rewritten.trace["ranks"]
    assert all(r["process_group"]["backend"] == "nccl" and r["device"].startswith("cuda") for r in ranks)
    assert result.comparison["max_rel_deviation"] < 1e-3  # cuBLAS may sum in another order than on one GPU

"""PM601 on fixtures/distributed/train_ddp_candidate.py, the evidence the rule owes:

- its rewrite is the torchrun-ready target, train_ddp_candidate.torchrun.py (all but
  the module docstring), and a second run leaves it alone;
- with every other rule selected as well, at level unsafe, everything applies in one
  run and a second check finds nothing;
- the rewrite, written by the rule, runs three ways on the CPU (gloo): plain `python`
  exactly like the original (log lines and checkpoints bit for bit); `torchrun
  --nproc_per_node=2` with one log line per step, each checkpoint written once, and the
  loss at the same global batch within float rounding of the single-process run; and
  `perfmod verify --nproc 2` (rewriting with PM601 itself) finds the two in agreement.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from subprocess import PIPE

import libcst as cst
import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules import ALL_RULES
from codemod.verify import verify
from codemod.verify_run import render_text

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "fixtures" / "distributed"
ORIGINAL, TARGET = FOLDER / "train_ddp_candidate.py", FOLDER / "train_ddp_candidate.torchrun.py"
PM601 = Settings(select=("PM601",), level=Level.UNSAFE)
EVERY_RULE = Settings(select=tuple(rule.CODE for rule in ALL_RULES), level=Level.UNSAFE)
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Both runs draw each epoch's order as a DistributedSampler seeded with 0 does
# (runtime.trace.pin_shuffle), so that the same samples make up each global batch.
PINNED = """\
import runpy, sys
from runtime.trace import pin_shuffle
pin_shuffle(0)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def rewritten(settings: Settings = PM601) -> str:
    result = process_source(ORIGINAL.read_bytes(), str(ORIGINAL), settings)
    assert result.error is None, result.error
    return result.new_source.decode()


def without_docstring(source: str) -> str:
    module = cst.parse_module(source)
    return module.with_changes(body=module.body[1:]).code


def environment() -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    for name in TORCHRUN_VARS:
        env.pop(name, None)
    return env


def launch(script: Path, out: Path, *args: str, launcher: Sequence[str] = (), pinned: bool = False) -> subprocess.Popen:
    """`script` started in `out` (with torchrun's `launcher` options, if any)."""
    out.mkdir(parents=True)
    command = [sys.executable]
    if launcher:
        command += ["-m", "torch.distributed.run", *launcher]
    if pinned:
        wrapper = out.parent / "pinned.py"
        wrapper.write_text(PINNED)
        command.append(str(wrapper))
    command += [str(script), "--out", str(out), *args]
    return subprocess.Popen(command, cwd=out, env=environment(), stdout=PIPE, stderr=PIPE, text=True)


def finished(process: subprocess.Popen) -> tuple[str, str]:
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr[-3000:]
    assert "terminate called" not in stderr
    return stdout, stderr


def run(script: Path, out: Path, *args: str, nproc: int | None = None, pinned: bool = False) -> tuple[str, str]:
    launcher = ["--standalone", f"--nproc_per_node={nproc}"] if nproc else []
    return finished(launch(script, out, *args, launcher=launcher, pinned=pinned))


def log_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("epoch ")]


def losses(stdout: str) -> dict[int, float]:
    return {int(line.split()[3]): float(line.split()[5]) for line in log_lines(stdout)}


@pytest.fixture(scope="module")
def rewrite(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pm601") / "train_ddp_candidate.py"
    path.write_text(rewritten())
    return path


def test_the_rewrite_is_the_torchrun_target_and_stays_as_it_is():
    source = rewritten()
    assert without_docstring(source) == without_docstring(TARGET.read_text())
    again = process_source(source.encode(), str(ORIGINAL), PM601)
    assert again.findings == [] and again.new_source.decode() == source


def converges_with_every_rule(path: Path):
    """All rules and PM601 at level unsafe: one run applies everything, a second finds nothing."""
    data = path.read_bytes()
    first = process_source(data, str(path), EVERY_RULE)
    assert first.error is None, first.error
    assert not [f.message for f in first.findings if "run perfmod again" in f.message]
    compile(first.new_source, "rewritten.py", "exec")
    second = process_source(first.new_source, str(path), EVERY_RULE)
    assert second.error is None and second.pending == [] and second.new_source == first.new_source
    return first


def test_with_every_rule_selected_everything_applies_in_one_run():
    first = converges_with_every_rule(ORIGINAL)
    assert [f.code for f in first.findings if f.applied].count("PM601") == 1


@pytest.mark.parametrize(
    "source",
    sorted((ROOT / "fixtures" / "rules" / "PM601").glob("*.in.py")),
    ids=lambda path: path.name[: -len(".in.py")],
)
def test_every_fixture_with_every_rule_applies_in_one_run(source):
    converges_with_every_rule(source)


def test_plain_python_runs_the_rewrite_exactly_like_the_original(tmp_path, rewrite):
    args = ("--samples", "256", "--epochs", "2", "--save-every", "4")
    before, _ = run(ORIGINAL, tmp_path / "original", *args)
    after, _ = run(rewrite, tmp_path / "rewritten", *args)
    assert len(log_lines(before)) == 8 and log_lines(after) == log_lines(before)
    for name in ("step4.pt", "step8.pt"):
        want, got = torch.load(tmp_path / "original" / name), torch.load(tmp_path / "rewritten" / name)
        assert list(got["model"]) == list(want["model"])
        assert all(torch.equal(got["model"][key], want["model"][key]) for key in want["model"])
        for index, state in want["optimizer"]["state"].items():
            assert all(torch.equal(got["optimizer"]["state"][index][k], v) for k, v in state.items())


def test_two_processes_log_each_step_once_save_once_and_train_like_one(tmp_path, rewrite):
    args = ("--samples", "256", "--epochs", "2", "--save-every", "4")
    single, _ = run(ORIGINAL, tmp_path / "single", *args, pinned=True)
    double, _ = run(rewrite, tmp_path / "double", *args, nproc=2, pinned=True)
    steps = [int(line.split()[3]) for line in log_lines(double)]
    assert steps == list(range(1, 9))  # one line a step: rank 0 alone prints
    assert sorted(p.name for p in (tmp_path / "double").iterdir()) == ["step4.pt", "step8.pt"]
    state = torch.load(tmp_path / "double" / "step8.pt")
    assert not any(key.startswith("module.") for key in state["model"])  # unwrapped
    want, got = losses(single), losses(double)
    assert want.keys() == got.keys()
    # The same 64 samples a step: the mean of the ranks' means is the mean, summed in another order.
    assert all(abs(got[step] - want[step]) <= 1e-5 * abs(want[step]) + 2e-6 for step in want), (want, got)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def test_two_nodes_of_one_process_each_log_and_save_once_and_train_like_one(tmp_path, rewrite):
    """Multi-node as on a cluster: two torchrun launchers (two "nodes" on this machine, one
    process each) meet at a c10d rendezvous; the global rank 0 alone logs and saves, on
    its own node, and the two train at the global batch like one process."""
    args = ("--samples", "256", "--epochs", "2", "--save-every", "4")
    single, _ = run(ORIGINAL, tmp_path / "single", *args, pinned=True)
    launcher = ["--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=localhost:{free_port()}"]
    launcher.append("--rdzv-id=pm601-two-nodes")
    nodes = {node: launch(rewrite, tmp_path / node, *args, launcher=launcher, pinned=True) for node in ("a", "b")}
    outputs = {node: finished(process)[0] for node, process in nodes.items()}
    logging = [node for node, stdout in outputs.items() if log_lines(stdout)]
    assert len(logging) == 1  # the node of global rank 0
    saved = {node: sorted(p.name for p in (tmp_path / node).iterdir()) for node in nodes}
    assert saved[logging[0]] == ["step4.pt", "step8.pt"] and [n for n in nodes if saved[n]] == logging
    want, got = losses(single), losses(outputs[logging[0]])
    assert sorted(got) == list(range(1, 9)) and want.keys() == got.keys()
    assert all(abs(got[step] - want[step]) <= 1e-5 * abs(want[step]) + 2e-6 for step in want), (want, got)


def test_verify_nproc_2_rewrites_with_pm601_and_finds_agreement():
    result = verify(
        ORIGINAL,
        ["--samples", "256", "--epochs", "2"],
        steps=8,
        warmup=2,
        settings=PM601,
        nproc=2,
        env=environment(),
        timeout=300,
        rounds=1,  # the losses are what this checks: two ranks on a 2-core CPU are slower than one process
    )
    assert result.exit_code == 0 and result.agree, render_text(result)
    assert [fix["code"] for fix in result.fixes] == ["PM601"]
    assert result.comparison["max_rel_deviation"] < 1e-5
    ranks = result.rewritten.trace["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["process_group"] == {"initialized": True, "world_size": 2, "backend": "gloo"} for r in ranks)
    assert result.original.trace["samples_per_step"] == result.rewritten.trace["samples_per_step"] == [64] * 8

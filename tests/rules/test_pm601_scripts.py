"""PM601 on fixtures/distributed/scripts/: single-process training programs written, in the
styles people use, by an author who had not read the rule (see that folder's README).

- PM601 rewrites the programs of REWRITTEN and refuses those of REFUSED with the reason
  checked by hand (BENCHMARKS.md lists them);
- every rewrite, run as plain `python`, prints the per-step losses of its original bit for
  bit (all of them in one interpreter: one process start for the lot);
- under `torchrun --nproc_per_node 2` (gloo, CPU), through `perfmod verify --nproc 2`,
  each rewrite trains at the original's global batch: its loss per step (the mean over
  the ranks) within verify's tolerance for the unsafe level (rtol 1e-2) where the ranks
  draw nothing at random, and, where they do (dropout masks, batches drawn per rank) or
  other samples make up each batch, the mean of the last 8 losses within 10% (the wild
  corpus's bound for unsafe rewrites, on a mean rather than one noisy batch). By default
  only `single_gpu.py`, the DDP tutorial's starting point, runs under torchrun (each run
  costs 15-35 s of a 2-core machine); PERFMOD_PM601_MATRIX=1 runs every one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.verify import verify
from codemod.verify_run import render_text

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "fixtures" / "distributed" / "scripts"
PM601 = Settings(select=("PM601",), level=Level.UNSAFE)
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MATRIX = os.environ.get("PERFMOD_PM601_MATRIX") == "1"

STEPS, FINAL = "each step", "last losses"
LAST = 8
# program -> (optimizer steps verify runs: past the first epoch, so that a missing
# set_epoch shows; how the 2-rank losses compare with the single process's).
REWRITTEN = {
    "plain_loader_classifier.py": (16, STEPS),
    "trainer_class_attrs.py": (20, FINAL),  # dropout: the ranks draw other masks than the one process
    "factory_loader.py": (20, STEPS),
    "main_built_model.py": (20, STEPS),
    "model_to_device_alias.py": (20, STEPS),
    "random_sampler_replacement.py": (20, FINAL),  # each rank draws its share of the indices
    "randint_batches.py": (20, FINAL),  # each rank draws its own windows
    "grad_accum.py": (20, STEPS),
    "formatted_loss_log.py": (24, STEPS),
    "epoch_checkpoint.py": (24, STEPS),
    # the tutorial's batch-size peek, `next(iter(loader))`, starts a pass of its own: alone it
    # draws a permutation, under torchrun the sampler's epoch stays; other samples per batch
    "single_gpu.py": (68, FINAL),
    "kwargs_loader.py": (24, STEPS),
    # `while True` over next(iter(loader)), restarted on StopIteration: the sampler's order
    "infinite_loader.py": (20, FINAL),
}
REFUSED = {
    # the construction in the other module, its path relative to the project root
    "tabular_project/train.py": "come from a DataLoader that another module of the project builds "
    "(fixtures/distributed/scripts/tabular_project/data.py:23)",
}
BY_DEFAULT = ("single_gpu.py",)

# Runs each program given as (key, path) in this one interpreter, as `python path` would
# (its folder first on sys.path, its modules forgotten after it), and prints what each printed.
RUN_ALL = """\
import contextlib, io, json, os, runpy, sys
printed = {}
for key, path in json.loads(sys.argv[1]):
    folder = os.path.dirname(path)
    before, saved_path = set(sys.modules), list(sys.path)
    sys.path.insert(0, folder)
    sys.argv = [path]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(path, run_name="__main__")
    sys.path[:] = saved_path
    for name in set(sys.modules) - before:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(folder + os.sep):
            del sys.modules[name]
    printed[key] = out.getvalue()
print(json.dumps(printed))
"""


def environment(tmp: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "TMPDIR": str(tmp),  # the programs' checkpoint folders (tempfile.mkdtemp)
    }
    for name in TORCHRUN_VARS:
        env.pop(name, None)
    return env


def wild_losses(printed: str) -> list[float]:
    lines = [line for line in printed.splitlines() if line.startswith("WILD_LOSSES ")]
    assert len(lines) == 1, printed[-2000:]
    return json.loads(lines[0].split(" ", 1)[1])


@pytest.fixture(scope="module")
def rewrites(tmp_path_factory) -> Path:
    """A copy of the scripts folder, each program of REWRITTEN replaced by its rewrite."""
    folder = tmp_path_factory.mktemp("pm601-scripts") / "scripts"
    shutil.copytree(SCRIPTS, folder)
    for name in REWRITTEN:
        path = SCRIPTS / name
        result = process_source(path.read_bytes(), str(path), PM601)
        assert result.error is None, result.error
        assert [f.code for f in result.findings if f.applied] == ["PM601"], [f.message for f in result.findings]
        (folder / name).write_bytes(result.new_source)
    return folder


def test_pm601_rewrites_the_programs_it_can_and_says_why_not_for_the_others(rewrites):
    assert len(REWRITTEN) >= 10 and len(REWRITTEN) + len(REFUSED) == len(
        [p for p in SCRIPTS.rglob("*.py") if "WILD_LOSSES" in p.read_text()]
    )
    for name, reason in REFUSED.items():
        path = SCRIPTS / name
        result = process_source(path.read_bytes(), str(path), PM601)
        assert result.new_source == path.read_bytes()
        assert [f.code for f in result.findings] == ["PM601"]
        assert reason in result.findings[0].message, result.findings[0].message
    for name in REWRITTEN:  # a second run finds nothing more to do
        path = rewrites / name
        again = process_source(path.read_bytes(), str(SCRIPTS / name), PM601)
        assert again.findings == [] and again.new_source == path.read_bytes()


def test_as_plain_python_every_rewrite_trains_bit_for_bit_like_its_original(rewrites, tmp_path):
    runs = [
        (f"{kind}:{name}", str(folder / name))
        for name in REWRITTEN
        for kind, folder in [("original", SCRIPTS), ("rewritten", rewrites)]
    ]
    done = subprocess.run(
        [sys.executable, "-c", RUN_ALL, json.dumps(runs)],
        cwd=tmp_path,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.splitlines()[-1])
    temporary = re.compile(re.escape(str(tmp_path)) + r"\S*")
    for name in REWRITTEN:
        before, after = printed[f"original:{name}"], printed[f"rewritten:{name}"]
        assert wild_losses(after) == wild_losses(before), name
        assert temporary.sub("<tmp>", after) == temporary.sub("<tmp>", before), name


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in REWRITTEN if MATRIX or n in BY_DEFAULT])
def test_under_torchrun_two_ranks_train_like_one_process_at_the_same_global_batch(name, tmp_path):
    steps, compared = REWRITTEN[name]
    result = verify(
        SCRIPTS / name,
        [],
        steps=steps,
        warmup=2,
        settings=PM601,
        nproc=2,
        env=environment(tmp_path),
        timeout=300,
        rounds=1,  # the losses are what this checks, not the speed of 2 ranks on a 2-core CPU
    )
    report = render_text(result)
    assert result.error is None, report
    assert [fix["code"] for fix in result.fixes] == ["PM601"], report
    ranks = result.rewritten.trace["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1], report
    assert all(r["process_group"] == {"initialized": True, "world_size": 2, "backend": "gloo"} for r in ranks)
    per_step = result.original.trace["samples_per_step"]
    assert len(per_step) == steps and result.rewritten.trace["samples_per_step"] == per_step, report
    if compared == STEPS:
        assert result.exit_code == 0 and result.agree, report
    else:  # other samples: the mean of the last LAST losses, one batch's noise averaged out
        want, got = (sum(run.trace["losses"][-LAST:]) / LAST for run in (result.original, result.rewritten))
        assert abs(got - want) <= 0.1 * abs(want), report

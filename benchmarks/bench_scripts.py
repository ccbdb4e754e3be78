"""Whole training scripts, side by side: as written, as `perfmod apply` rewrites
them, and as an expert would write them by hand. One markdown table: tokens/s,
speed-ups, peak memory, final losses and whether the losses agree.

    python -m benchmarks.bench_scripts --device cpu                  # the CPU table of BENCHMARKS.md
    python -m benchmarks.bench_scripts --device cuda --levels safe numeric unsafe
    python -m benchmarks.bench_scripts --device cpu --quick          # smoke run: tiny sizes, 2 steps
    python -m benchmarks.bench_scripts --device cpu --steps 20 --repeats 5   # longer timed windows
    python -m benchmarks.bench_scripts prepare                       # rewrite them again (needs libcst)

The scripts are in fixtures/bench/, each in these versions:

- `<name>.py`, the original, written with a seed report's habits:
  `gpt_seed000` (report 000, LatentWire: tokenizing in the loader and the
  loop, blocking copies, fp32, per-step syncs, gc and empty_cache, a
  per-position loss loop, hand-written attention, checkpoints in the loop),
  `rwkv_lm` (report 003: RWKV-style time mixing as a Python loop over time),
  `per_sample_trainer` (report 004: forward and backward one sequence at a time);
- `<name>.rewritten.py`: `perfmod apply --level unsafe` of the original, and
  `<name>.rewritten-safe.py`, `<name>.rewritten-numeric.py` at the lower levels.
  They are committed because the GPU machine has torch but not libcst;
  `prepare` writes them again, with `rewrites.json` (the fixes applied, and the
  findings left without a fix, per script and level), and verify_seed's
  prepared copies (verify_seed/). tests/test_bench_scripts.py keeps them equal
  to what perfmod writes now;
- `<name>.optimized.py`: the same model, data, seed and hyper-parameters,
  optimized by hand (see each file's docstring).

The acceptance scripts (fixtures/acceptance/, written independently of perfmod;
ACCEPTANCE below) go through the same machinery: `naive_lm` against its expert
version `expert_lm.py`, `naive_rwkv` against `expert_rwkv.py`. Their rewrites
are committed in fixtures/bench/acceptance/ (same names, with its own
rewrites.json), and `python -m benchmarks.acceptance` runs them at every level.
They print `FINAL ... tok_per_s=X loss=L` instead of a `tokens/s X` line.

Each version runs in a fresh interpreter, from a scratch working directory,
with the repository on PYTHONPATH (rewrites import `runtime`). A small launcher
runs the script and, at exit, reports peak memory: the training process's
peak RSS on the CPU, torch.cuda.max_memory_allocated on CUDA. The script prints
`step N loss L` (for every step, or every few) and `tokens/s X` or a `FINAL
... tok_per_s=X ...` line (the steps after its warm-up).
The versions alternate (original, rewrites, hand-optimized, original, ...) so
that drift of clocks and load hits them alike; the table gives the median
tokens/s over the repeats and the largest peak memory. Losses are compared with
perfmod verify's rule (codemod/verify_run.py): bit for bit when only safe fixes
were applied, else within rtol 1e-2 at every step that both versions print; the
hand-optimized version is held to rtol 1e-2.

The goal (issue 12): the unsafe rewrite at no less than 0.9x the hand-optimized
version's tokens/s. Below the table, each script's line names what the
hand-optimized version does that the rewrite did not, and why perfmod left it
(its finding's reason, or "not reported").
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "bench"
REWRITES = FIXTURES / "rewrites.json"
VERIFY_PREPARED = FIXTURES / "verify_seed"  # benchmarks.verify_seed --prepared, for machines without libcst
LEVELS = ("safe", "numeric", "unsafe")
GOAL = 0.9  # issue 12: the rewrite at >= 0.9x the hand-optimized tokens/s
ORIGINAL, OPTIMIZED = "original", "hand-optimized"
ACCEPTANCE_FOLDER = ROOT / "fixtures" / "acceptance"  # copies of the acceptance scripts, as written
ACCEPTANCE_PREPARED = FIXTURES / "acceptance"  # their committed rewrites and rewrites.json
STEP_LOSS = re.compile(r"^step (\d+) loss (\S+)$", re.M)
TOKENS = re.compile(r"^tokens/s\s+([0-9.eE+-]+)\s*$", re.M)
FINAL_TOKENS = re.compile(r"^FINAL .*\btok_per_s=([0-9.eE+-]+)", re.M)  # the acceptance scripts' last line
PEAK = re.compile(r"^BENCH_SCRIPTS_PEAK (.*)$", re.M)

# Runs the script as `python script.py args` would, then reports its peak memory at exit.
LAUNCHER = """\
import atexit, json, os, resource, runpy, sys
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(script))

def report():
    torch = sys.modules.get("torch")
    cuda = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
    print("BENCH_SCRIPTS_PEAK " + json.dumps({
        "cuda": torch.cuda.max_memory_allocated() if cuda else None,
        "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }), flush=True)

atexit.register(report)
runpy.run_path(script, run_name="__main__")
"""


@dataclass(frozen=True)
class Script:
    name: str
    what: str
    sizes: dict[str, list[str]]  # tier (cuda, cpu, quick) -> the script's arguments
    # what the hand-optimized version does, by the rule whose fix would do it; "PM101/PM103": either rule
    by_hand: dict[str, str]
    folder: Path = FIXTURES  # the original, `<name>.py`, and the hand-optimized version
    prepared: Path = FIXTURES  # the committed rewrites and their rewrites.json
    optimized: str = ""  # the hand-optimized version's file name; "" for `<name>.optimized.py`


SCRIPTS = [
    Script(
        "gpt_seed000",
        "small GPT on chat transcripts, seed-000 habits",
        {
            "cuda": [
                "--steps",
                "40",
                "--warmup",
                "5",
                "--batch-size",
                "32",
                "--seq-len",
                "512",
                "--d-model",
                "512",
                "--n-heads",
                "8",
                "--n-layers",
                "6",
                "--samples",
                "2048",
                "--save-every",
                "20",
            ],
            "cpu": [
                "--steps",
                "12",
                "--warmup",
                "2",
                "--batch-size",
                "8",
                "--seq-len",
                "128",
                "--d-model",
                "128",
                "--n-heads",
                "4",
                "--n-layers",
                "2",
                "--samples",
                "256",
                "--save-every",
                "5",
            ],
            "quick": [
                "--steps",
                "2",
                "--warmup",
                "1",
                "--batch-size",
                "2",
                "--seq-len",
                "16",
                "--d-model",
                "16",
                "--n-heads",
                "2",
                "--n-layers",
                "1",
                "--samples",
                "8",
                "--save-every",
                "1",
            ],
        },
        {
            "PM101/PM103": "non_blocking copies",
            "PM102": "pinned batches",
            "PM203": "the system prompt tokenized once",
            "PM201/PM203": "the corpus tokenized before training (loader workers would take it off the training process)",
            "PM301": "bf16 autocast",
            "PM302": "TF32",
            "PM401": "set_to_none gradients",
            "PM402": "fused AdamW",
            "PM403": "no gc.collect()/empty_cache() in the loop",
            "PM404": "losses read once, after the loop",
            "PM405": "checkpoints written in the background",
            "PM503": "one cross_entropy over all positions",
            "PM504": "scaled_dot_product_attention",
        },
    ),
    Script(
        "rwkv_lm",
        "RWKV-6-style LM, time mixing as a Python loop over time (seed 003)",
        {
            "cuda": [
                "--steps",
                "20",
                "--warmup",
                "3",
                "--batch-size",
                "16",
                "--seq-len",
                "512",
                "--d-model",
                "512",
                "--n-head",
                "8",
                "--n-layer",
                "4",
                "--corpus-chars",
                "1000000",
            ],
            "cpu": [
                "--steps",
                "12",
                "--warmup",
                "2",
                "--batch-size",
                "8",
                "--seq-len",
                "128",
                "--d-model",
                "128",
                "--n-head",
                "4",
                "--n-layer",
                "2",
                "--corpus-chars",
                "100000",
            ],
            "quick": [
                "--steps",
                "2",
                "--warmup",
                "1",
                "--batch-size",
                "2",
                "--seq-len",
                "16",
                "--d-model",
                "16",
                "--n-head",
                "2",
                "--n-layer",
                "1",
                "--corpus-chars",
                "2000",
            ],
        },
        {
            "PM101/PM103": "non_blocking copies",
            "PM102": "pinned batches",
            "PM301": "bf16 autocast",
            "PM302": "TF32",
            "PM402": "fused AdamW",
            "PM404": "losses read once, after the loop",
            "PM505": "chunked linear attention (runtime.kernels)",
        },
    ),
    Script(
        "per_sample_trainer",
        "transformer LM trained one sequence at a time (seed 004)",
        {
            "cuda": [
                "--steps",
                "30",
                "--warmup",
                "3",
                "--batch-size",
                "32",
                "--seq-len",
                "256",
                "--d-model",
                "512",
                "--n-heads",
                "8",
                "--n-layers",
                "4",
                "--vocab-size",
                "2048",
                "--corpus-tokens",
                "400000",
            ],
            "cpu": [
                "--steps",
                "12",
                "--warmup",
                "2",
                "--batch-size",
                "8",
                "--seq-len",
                "64",
                "--d-model",
                "128",
                "--n-heads",
                "4",
                "--n-layers",
                "2",
                "--vocab-size",
                "512",
                "--corpus-tokens",
                "20000",
            ],
            "quick": [
                "--steps",
                "2",
                "--warmup",
                "1",
                "--batch-size",
                "2",
                "--seq-len",
                "8",
                "--d-model",
                "16",
                "--n-heads",
                "2",
                "--n-layers",
                "1",
                "--vocab-size",
                "32",
                "--corpus-tokens",
                "200",
            ],
        },
        {
            "PM101/PM103": "non_blocking copies",
            "PM102": "pinned batches",
            "PM301": "bf16 autocast",
            "PM302": "TF32",
            "PM402": "fused AdamW",
            "PM404": "losses read once, after the loop",
            "PM502": "one batched forward and backward",
        },
    ),
]
# The acceptance scripts (fixtures/acceptance/README.md): `cpu` is the README's small settings.
# Each script times the steps after its second and has no --warmup option; its
# --device default is CUDA where there is one (run_script hides CUDA for CPU runs).
ACCEPTANCE = [
    Script(
        "naive_lm",
        "research-style LM: tokenizing and a per-sample forward in the step, per-call hooks",
        {
            "cuda": ["--out", "checkpoints"],  # the script's own defaults: 30 steps, batch 16 x 128, d 256, 4 layers
            "cpu": [
                *("--steps", "6", "--batch_size", "8", "--seq", "128", "--d", "128", "--layers", "2"),
                *("--heads", "4", "--docs", "400", "--save_every", "100", "--out", "checkpoints"),
            ],
            "quick": [
                *("--steps", "3", "--batch_size", "2", "--seq", "16", "--d", "16", "--layers", "1"),
                *("--heads", "2", "--docs", "8", "--save_every", "100", "--out", "checkpoints"),
            ],
        },
        {
            "PM101/PM103": "non_blocking copies",
            "PM203": "the corpus tokenized once before training, the chat template once",
            "PM301": "bf16 autocast",
            "PM302": "TF32",
            "PM402": "fused AdamW",
            "PM403": "no gc.collect()/empty_cache() in the loop",
            "PM404": "losses read every 10 steps",
            "PM405": "checkpoints written in a background thread",
            "PM501": "hooks registered once, in __init__",
            "PM502": "one batched forward and backward",
            "PM503": "one cross_entropy over all positions",
            "PM504": "scaled_dot_product_attention",
        },
        ACCEPTANCE_FOLDER,
        ACCEPTANCE_PREPARED,
        "expert_lm.py",
    ),
    Script(
        "naive_rwkv",
        "RWKV-style LM, time mixing as a Python loop over time, (B, T, H, K) layout",
        {
            "cuda": ["--steps", "20", "--batch_size", "8", "--seq", "512", "--d", "256"],
            "cpu": [
                *("--steps", "4", "--batch_size", "4", "--seq", "256", "--d", "128", "--heads", "4"),
                *("--layers", "2", "--vocab", "512"),
            ],
            "quick": [
                *("--steps", "3", "--batch_size", "2", "--seq", "16", "--d", "16", "--heads", "2"),
                *("--layers", "1", "--vocab", "32"),
            ],
        },
        {"PM505": "the recurrence in a chunked parallel form"},
        ACCEPTANCE_FOLDER,
        ACCEPTANCE_PREPARED,
        "expert_rwkv.py",
    ),
]
SCRIPTS_BY_NAME = {script.name: script for script in SCRIPTS + ACCEPTANCE}


def original_path(name: str) -> Path:
    return SCRIPTS_BY_NAME[name].folder / f"{name}.py"


def rewritten_path(name: str, level: str) -> Path:
    file = f"{name}.rewritten.py" if level == "unsafe" else f"{name}.rewritten-{level}.py"
    return SCRIPTS_BY_NAME[name].prepared / file


def optimized_path(name: str) -> Path:
    script = SCRIPTS_BY_NAME[name]
    return script.folder / (script.optimized or f"{name}.optimized.py")


def rewrites_path(name: str) -> Path:
    """The rewrites.json that says what the committed rewrites of `name` applied and left."""
    return SCRIPTS_BY_NAME[name].prepared / REWRITES.name


def rewritten_label(level: str) -> str:
    return f"rewritten ({level})"


# -- prepare (needs libcst) ---------------------------------------------------------------


def rewrite(original: Path, level: str, select: tuple[str, ...] | None = None):
    """`perfmod apply --level LEVEL [--select CODES]` of `original`, as the command line
    runs it (the nearest pyproject.toml, then the options): the engine's result
    (new_source, findings)."""
    sys.path.insert(0, str(ROOT))
    from codemod.config import load_settings
    from codemod.engine import process_source
    from codemod.rule import Level

    settings = load_settings(original).with_overrides(level=Level.parse(level))
    if select is not None:  # as on the command line: a selection starts afresh
        settings = settings.with_overrides(select=select, ignore=())
    result = process_source(original.read_bytes(), original.relative_to(ROOT).as_posix(), settings)
    if result.error:
        raise SystemExit(result.error)
    return result


def rewrites() -> dict[Path, bytes]:
    """Every committed file that perfmod writes, as it writes it now: each script
    (the acceptance scripts too) rewritten at each level, a rewrites.json per folder
    of rewrites, and verify_seed's prepared copies."""
    sys.path.insert(0, str(ROOT))
    from codemod.rule import Level

    files: dict[Path, bytes] = {}
    summaries: dict[Path, dict[str, dict]] = {}
    for script in SCRIPTS + ACCEPTANCE:
        summary = summaries.setdefault(rewrites_path(script.name), {})
        summary[script.name] = {}
        for level in LEVELS:
            result = rewrite(original_path(script.name), level)
            files[rewritten_path(script.name, level)] = result.new_source
            applied = [f for f in result.findings if f.applied]
            summary[script.name][level] = {
                "file": rewritten_path(script.name, level).name,
                "applied_level": max((f.level for f in applied), default=Level.SAFE).label,
                "applied": sorted({f.code for f in applied}),
                "not_applied": [
                    {"code": f.code, "line": f.line, "level": f.level.label, "fixable": f.fixable, "message": f.message}
                    for f in result.findings
                    if not f.applied
                ],
            }
    for path, summary in summaries.items():
        files[path] = (json.dumps(summary, indent=2) + "\n").encode()
    files.update(verify_seed_copies())
    return files


def verify_seed_copies() -> dict[Path, bytes]:
    """benchmarks.verify_seed's prepared copies (level numeric, its GPU arguments), with
    the script's path in the manifest made relative to the repository."""
    from benchmarks import verify_seed

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / "prepared"
        verify_seed.prepare(verify_seed.SCRIPT, folder, "numeric", verify_seed.GPU_ARGS)
        manifest = folder / "perfmod-verify.json"
        data = json.loads(manifest.read_text())
        data["script"] = Path(data["script"]).relative_to(ROOT).as_posix()
        manifest.write_text(json.dumps(data, indent=2) + "\n")
        return {
            VERIFY_PREPARED / path.relative_to(folder): path.read_bytes()
            for path in sorted(folder.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts
        }


def prepare() -> list[Path]:
    files = rewrites()
    shutil.rmtree(VERIFY_PREPARED, ignore_errors=True)
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return sorted(files)


# -- run (torch only) ---------------------------------------------------------------------


@dataclass
class Run:
    tokens_per_s: float | None = None
    peak: dict = field(default_factory=dict)
    losses: list[float | None] = field(default_factory=list)
    error: str | None = None
    steps: list[int] = field(default_factory=list)  # the step of each loss
    output: str = ""  # what the script printed


def script_env(device: str, threads: int | None = None) -> dict[str, str]:
    """The environment the versions run in: the repository importable (rewrites import
    `runtime`), no bytecode written, CUDA hidden for CPU runs, OMP_NUM_THREADS=threads."""
    env = dict(
        os.environ,
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the scripts pick CUDA when they see it
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_script(path: Path, args: list[str], device: str, timeout: float, threads: int | None = None) -> Run:
    """One run of one version in a fresh interpreter and a scratch folder (its working
    directory: relative paths in `args` land there)."""
    env = script_env(device, threads)
    with tempfile.TemporaryDirectory(prefix="bench-scripts-") as workdir:
        code, out, err = run_command([sys.executable, "-c", LAUNCHER, str(path), *args], timeout, env, Path(workdir))
    if code is None:
        return Run(error=f"timed out after {timeout:.0f} s", output=out)
    if code != 0:
        last = (err.strip().splitlines() or ["(no output)"])[-1]
        return Run(error=f"exit status {code}: {last}", output=out)
    tokens, peak = TOKENS.findall(out) or FINAL_TOKENS.findall(out), PEAK.findall(out)
    if not tokens or not peak:
        return Run(error="no `tokens/s` or `FINAL` line or no peak memory in its output", output=out)
    losses = sorted((int(step), _number(value)) for step, value in STEP_LOSS.findall(out))
    return Run(
        float(tokens[-1]),
        json.loads(peak[-1]),
        [v if v is not None and math.isfinite(v) else None for _, v in losses],
        steps=[step for step, _ in losses],
        output=out,
    )


def run_command(argv: list[str], timeout: float, env: dict, cwd: Path) -> tuple[int | None, str, str]:
    """(exit status, or None when it timed out; stdout; stderr). At the timeout the whole
    process group is killed: DataLoader workers and compile workers too."""
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = process.communicate(timeout=timeout)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        return None, out, err


def _number(text: str) -> float | None:
    """A printed loss: decimal, or hexadecimal (`float.hex`, bit for bit); None if neither."""
    for parse in (float, float.fromhex):
        try:
            return parse(text)
        except ValueError:
            pass
    return None


def versions(name: str, levels: list[str]) -> dict[str, Path]:
    return {
        ORIGINAL: original_path(name),
        **{rewritten_label(level): rewritten_path(name, level) for level in levels},
        OPTIMIZED: optimized_path(name),
    }


def measure(
    scripts: list[Script],
    tier: str,
    levels: list[str],
    repeats: int,
    device: str,
    deadline: float,
    timeout: float,
    threads: int | None,
) -> dict[str, dict[str, list[Run]]]:
    """Every version of every script `repeats` times, alternating, the repeats outermost
    (so that a budget spent early still leaves every script measured). A version that
    failed is not run again; none is started once the deadline has passed."""
    runs = {script.name: {label: [] for label in versions(script.name, levels)} for script in scripts}
    for _ in range(repeats):
        for script in scripts:
            for label, path in versions(script.name, levels).items():
                done = runs[script.name][label]
                if any(run.error for run in done):
                    continue
                left = deadline - time.monotonic()
                if left < 1:
                    if not done:
                        done.append(Run(error="not run: the time budget was spent"))
                    continue
                done.append(run_script(path, script.sizes[tier], device, min(timeout, left), threads))
    return runs


@dataclass
class Row:
    """One version's summary: median tokens/s, largest peak, the first good run's losses."""

    tokens_per_s: float | None
    peak_mib: float | None
    losses: list[float | None]
    error: str | None
    steps: list[int] = field(default_factory=list)
    runs: list[float] = field(default_factory=list)  # tokens/s of each good run, in the order they ran


def summarize(runs: list[Run], memory: str) -> Row:
    good = [run for run in runs if run.error is None]
    if not good:
        return Row(None, None, [], runs[0].error if runs else "not run")
    peaks = [run.peak.get(memory) for run in good if run.peak.get(memory) is not None]
    return Row(
        statistics.median(run.tokens_per_s for run in good),
        max(peaks) / 2**20 if peaks else None,
        good[0].losses,
        None,
        good[0].steps,
        [run.tokens_per_s for run in good],
    )


def agreement(original: Row, row: Row, level: str) -> str:
    from codemod.verify_run import Tolerance, compare

    if not original.losses or not row.losses:
        return "n/a"
    tolerance = Tolerance.for_level(level)
    theirs, ours, where = original.losses, row.losses, ""
    if original.steps and row.steps and original.steps != row.steps:
        # a version that prints every few steps: the steps both print
        common = sorted(set(original.steps) & set(row.steps))
        if common:
            theirs = [original.losses[original.steps.index(step)] for step in common]
            ours = [row.losses[row.steps.index(step)] for step in common]
            where = f"; at steps {', '.join(map(str, common))}"
    result = compare(theirs, ours, tolerance)
    bound = "bit for bit" if tolerance.exact else f"rtol {tolerance.rtol:g}"
    if result["max_rel_deviation"] is None:
        return f"differ ({len(row.losses)} steps against {len(original.losses)})"
    deviation = f"max rel {result['max_rel_deviation']:.1e}"
    return f"{'agree' if result['agree'] else 'differ'} ({bound}; {deviation}{where})"


def short_reason(finding: dict, level: str) -> str:
    """Why a finding was left without a fix, in a few words."""
    message = finding["message"]
    if finding["fixable"] and LEVELS.index(finding["level"]) > LEVELS.index(level):
        return f"fixed only at --level {finding['level']}"
    if "not fixed in this run:" in message:
        blocker = re.search(r"not fixed in this run: (\S+)'s fix", message)
        return f"blocked in the same run by {blocker.group(1) if blocker else 'another'}'s fix"
    if "not rewritten:" in message:
        return "not rewritten: " + message.split("not rewritten:", 1)[1].split(";")[0].strip()
    if "cannot prove" in message:
        return "reported only: " + message[message.index("cannot prove") :].split(";")[0]
    return "reported without a fix"


def missing_lines(summary: dict, tokens: dict[str, dict[str, Row]], level: str) -> list[str]:
    """One line per script: the rewrite against the hand-optimized version, and what the rewrite lacks."""
    lines = []
    for name, rows in tokens.items():
        script = SCRIPTS_BY_NAME[name]
        rewrite, optimized = rows.get(rewritten_label(level)), rows.get(OPTIMIZED)
        facts = summary.get(script.name, {}).get(level, {})
        applied = set(facts.get("applied", []))
        reasons = {}
        for finding in facts.get("not_applied", []):
            reasons.setdefault(finding["code"], short_reason(finding, level))
        lacking = [
            f"{codes} ({what}): "
            + "; ".join(f"{code} {reasons.get(code, 'not reported')}" for code in codes.split("/"))
            for codes, what in script.by_hand.items()
            if not applied & set(codes.split("/"))
        ]
        if rewrite and optimized and rewrite.tokens_per_s and optimized.tokens_per_s:
            ratio = rewrite.tokens_per_s / optimized.tokens_per_s
            verdict = (
                f"{ratio:.2f}x the hand-optimized tokens/s (goal >= {GOAL}x: {'met' if ratio >= GOAL else 'not met'})"
            )
            # the runs alternate, so the k-th run of each ran under the same load: their ratios' spread
            pairs = [a / b for a, b in zip(rewrite.runs, optimized.runs)]
            if len(pairs) > 1:
                verdict += f"; run by run {min(pairs):.2f}x to {max(pairs):.2f}x"
        else:
            verdict = "not measured"
        lines.append(
            f"- `{script.name}` at `{level}`: {verdict}. Applied: {', '.join(sorted(applied)) or 'none'}. "
            f"Missing against the hand-optimized version: {'; '.join(lacking) or 'nothing'}."
        )
    return lines


def table(
    results: dict[str, dict[str, Row]],
    levels: list[str],
    device: str,
    threads: int | None,
    repeats: int,
    tier: str,
    argv: list[str],
    program: str = "benchmarks.bench_scripts",
    arguments: dict[str, list[str]] | None = None,
) -> str:
    import torch

    arguments = arguments or {}

    if device == "cpu":
        name = f"CPU ({platform.processor() or platform.machine()}, {threads or torch.get_num_threads()} torch threads)"
        memory = "peak RSS (MiB)"
    else:
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CUDA (not available)"
        memory = "peak CUDA memory (MiB)"
    summary = {}
    for path in {rewrites_path(name) for name in results}:
        summary.update(json.loads(path.read_text()) if path.exists() else {})
    lines = [
        f"Device: {name}; torch {torch.__version__}; Python {platform.python_version()}; "
        f"date {datetime.date.today().isoformat()}",
        f"Command: `python -m {program} {shlex.join(argv)}`; median of {repeats} alternating runs; "
        f"sizes: the `{tier}` arguments in benchmarks/bench_scripts.py",
        "",
        f"| script | version | tokens/s | vs original | vs hand-optimized | {memory} | final loss | losses vs original |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for script_name, rows in results.items():
        base, best = rows[ORIGINAL].tokens_per_s, rows[OPTIMIZED].tokens_per_s
        for label, row in rows.items():
            if row.error:
                lines.append(f"| {script_name} | {label} | error | | | | | {row.error} |")
                continue
            if label == ORIGINAL:
                agree = "-"
            elif label == OPTIMIZED:
                agree = agreement(rows[ORIGINAL], row, "numeric")
            else:
                level = label[len("rewritten (") : -1]
                agree = agreement(
                    rows[ORIGINAL], row, summary.get(script_name, {}).get(level, {}).get("applied_level", level)
                )
            final = row.losses[-1] if row.losses else None
            lines.append(
                f"| {script_name} | {label} | {row.tokens_per_s:,.0f} | {_ratio(row.tokens_per_s, base)} | "
                f"{_ratio(row.tokens_per_s, best)} | {'-' if row.peak_mib is None else f'{row.peak_mib:,.0f}'} | "
                f"{'n/a' if final is None else f'{final:.4f}'} | {agree} |"
            )
    top = levels[-1]
    lines += ["", f"The rewrite at `{top}` against the hand-optimized version (what the rewrite lacks, and why):", ""]
    lines += missing_lines(summary, results, top)
    lines += [
        "",
        "Arguments per script (`"
        + tier
        + "`): "
        + "; ".join(f"`{name}` {' '.join(arguments.get(name, SCRIPTS_BY_NAME[name].sizes[tier]))}" for name in results),
    ]
    return "\n".join(lines)


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value and base else "-"


def run(options: argparse.Namespace, argv: list[str], program: str = "benchmarks.bench_scripts") -> str:
    device = "cuda" if options.device.startswith("cuda") else "cpu"
    tier = "quick" if options.quick else device
    memory = "cuda" if device == "cuda" else "rss"
    deadline = time.monotonic() + options.budget
    scripts = [SCRIPTS_BY_NAME[name] for name in options.scripts]
    if options.steps:
        scripts = [replace(s, sizes={**s.sizes, tier: with_steps(s.sizes[tier], options.steps)}) for s in scripts]
    runs = measure(scripts, tier, options.levels, options.repeats, device, deadline, options.timeout, options.threads)
    results = {
        name: {label: summarize(version_runs, memory) for label, version_runs in by_label.items()}
        for name, by_label in runs.items()
    }
    arguments = {script.name: script.sizes[tier] for script in scripts}
    return table(results, options.levels, device, options.threads, options.repeats, tier, argv, program, arguments)


def with_steps(args: list[str], steps: int) -> list[str]:
    """A script's arguments with `--steps` set to `steps` (added when they do not set it)."""
    args = list(args)
    if "--steps" in args:
        args[args.index("--steps") + 1] = str(steps)
        return args
    return [*args, "--steps", str(steps)]


def main(
    argv: list[str] | None = None,
    *,
    program: str = "benchmarks.bench_scripts",
    description: str = __doc__.splitlines()[0],
    scripts: list[Script] = SCRIPTS,
    levels: tuple[str, ...] = ("unsafe",),
) -> int:
    """The command line; `python -m benchmarks.acceptance` is this one with the acceptance
    scripts and every level as defaults (`program` names the command in the table)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=f"python -m {program}", description=description)
    parser.add_argument(
        "command",
        nargs="?",
        choices=["run", "prepare"],
        default="run",
        help="run (default): measure and print the table; prepare: write the rewrites again",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 steps, one run each: a smoke test")
    parser.add_argument(
        "--levels",
        nargs="+",
        choices=LEVELS,
        default=list(levels),
        help=f"the rewrites to run (default: {' '.join(levels)})",
    )
    parser.add_argument(
        "--scripts", nargs="+", choices=list(SCRIPTS_BY_NAME), default=[script.name for script in scripts]
    )
    parser.add_argument("--repeats", type=int, help="runs of each version (default 3, quick 1)")
    parser.add_argument(
        "--steps",
        type=int,
        help="the scripts' --steps instead of the sizes' own: a longer timed window (each script times the steps "
        "after its warm-up), so that a ratio is not the noise of a few steps",
    )
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the runs (default: torch's choice)")
    parser.add_argument(
        "--budget",
        type=float,
        default=3600.0,
        help="seconds for the whole benchmark; no run starts after them (default 3600)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for one run (default 900)")
    parser.add_argument("--output", type=Path, help="also write the table to this file")
    options = parser.parse_args(argv)
    if options.command == "prepare":
        for path in prepare():
            print(path.relative_to(ROOT))
        return 0
    options.levels = [level for level in LEVELS if level in options.levels]
    options.repeats = options.repeats or (1 if options.quick else 3)
    text = run(options, argv, program)
    print(text)
    if options.output:
        options.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

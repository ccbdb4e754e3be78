"""Run the two prepared copies of `perfmod verify` and compare them.

This half of verify imports neither libcst nor torch (the scripts import torch
in their own processes), so a machine that has only torch can run copies that
`perfmod verify --keep FOLDER` (or `codemod.verify.prepare`) made elsewhere:

    python -m codemod.verify_run FOLDER [--steps N] [--warmup W] [--format json] [-- ARGS]

FOLDER holds `original/` and `rewritten/` (mirrors of the script's folder, with
the instrumented copies; see codemod/verify.py) and `perfmod-verify.json`, the manifest: the script's
entry file, its arguments, the fixes applied and the tolerance.

Runs. The two go one after the other, each with its own folder as working
directory, with the script's interpreter (`python`, default
`sys.executable`), the same arguments and the same environment plus
PYTHONHASHSEED (0 unless set), PYTHONDONTWRITEBYTECODE=1, the folder holding
`runtime` appended to PYTHONPATH and the tracer's settings (runtime/trace.py).
`runtime.trace.install()` seeds `random`, torch and numpy with `seed` before
the script's code runs. Each run stops cleanly after `steps` optimizer steps.
A run is its own session (process group): at the timeout it is killed whole,
DataLoader workers and torchrun's processes included.

Rounds (`rounds`, `perfmod verify --rounds N`, DEFAULT_ROUNDS = 3): both copies
run N times, in alternating order (round 1 the original first, round 2 the
rewrite first, ...), so that a machine that drifts during the runs (another
process, heat, caches) favours neither. Each round pairs a run of each; its
ratio is the rewrite's steps/s over the original's. The speed-up is the
geometric mean of the ratios, with a 95% range from Student's t over their
logarithms (`Speed`), and a verdict: "faster" or "slower" when the whole range
lies above or below 1.0 by more than NEGLIGIBLE (2%), "no measurable
difference" when it holds 1.0 or lies within 2% of it, "unknown" with one
round (no spread). The same script run twice on a CPU differs by several per
cent (a no-op rewrite gave 1.08x, 0.98x and 0.95x in three single runs): one
ratio is no result. Each version's steps/s, samples/s, tokens/s and elapsed
time are the geometric means over its rounds; its losses, peak memory and
ranks are those of its first round, and the losses compared are the first
round's. A version whose losses differ between its rounds gets a note (the
script is not deterministic). A run that fails in any round fails the verify.

Distributed (`nproc`, `perfmod verify --nproc N`): the original runs as one
process as always; the rewrite runs under `python -m torch.distributed.run
--standalone --nproc_per_node N` (torchrun; gloo on the CPU, NCCL on GPUs, as
the script's runtime.distributed.setup() picks), with the same arguments. The
two are compared at the same global batch: a torchrun-ready script splits each
batch of the original over the ranks (runtime.distributed.local_batch_size), so
the N ranks together step on the samples one original step did, and DDP's
averaged gradient is the single-process one. Each rank writes its own trace
(runtime/trace.py); verify combines them:
- losses: at each backward(), the mean of the ranks' losses, which is the loss
  of the whole global batch when each rank's loss is the mean over its equal
  share (what runtime.distributed.all_reduce_mean would log). Computed from the
  traces after the run: no collective is added to the step;
- steps/s: the optimizer steps timed over the slowest rank's window (DDP keeps
  the ranks in step); samples/s and tokens/s: the ranks' samples (tokens) in
  their windows, summed, over that window; peak memory: the largest rank's;
- per rank: each rank's own steps/s, samples/s, peak memory and losses.
Both runs get PERFMOD_TRACE_PIN_SHUFFLE=1 (runtime/trace.py): a shuffling
DataLoader in the original and the rewrite's DistributedSampler then draw the
same permutation each epoch, so the same samples make up each global batch and
the per-step losses are comparable (a rewrite that forgets `set_epoch` is seen
from the second epoch on). The rewrite fails the run (exit 2) when a rank had
not joined a process group of N processes by its first optimizer step (the
script is not torchrun-ready: each process would train alone), and disagrees
(exit 1) when the global batch differs from the original's (samples per
optimizer step, summed over the ranks). torchrun sets OMP_NUM_THREADS=1 in
its processes when it is not set: on the CPU set it for both runs to compare
speeds fairly.

Tolerance, by the highest level of the fixes applied (not of `--level`):
- safe: exact, every loss bit for bit equal (rtol = atol = 0);
- numeric: |rewritten - original| <= atol + rtol * |original|, rtol =
  DEFAULT_RTOL (1e-2), atol = 0. Measured on fixtures/verify/numeric_lm.py
  (PM301 bf16 autocast, PM302, PM402; CPU, PERFMOD_AMP=bf16): largest relative
  deviation 1.7e-3 over 50 steps; fixtures/scripts/seed_latentwire.py (the
  same rules plus PM101-PM403) 3.1e-4 over 20 steps; PM301's own tests saw at
  most 1.1e-3 over 20 steps of its fixtures. 1e-2 leaves about six times
  headroom. A small change of the math can stay within it over few steps: at
  this level verify checks that the rewrite trains alike, not that it computes
  the same.
- unsafe: as numeric. When the losses differ, verify still exits 1 (it cannot
  tell a legitimate difference from a bug) and notes that unsafe fixes (sample
  order, worker processes, checkpoint timing) may change losses legitimately:
  review the diff.
`rtol` and `atol` override the defaults at any level.

Nondeterministic kernels (on CUDA: atomics in index_add, scatter, some
backward passes) make two runs of the same script differ; with
`deterministic=True` both runs call `torch.use_deterministic_algorithms(True,
warn_only=True)` (and get CUBLAS_WORKSPACE_CONFIG=:4096:8), which makes "exact"
meaningful on a GPU, at a cost in speed that both runs pay. An op that has no
deterministic kernel only warns, on the run's stderr (run the copies kept with
`--keep` by hand to read it): if the losses still differ, it is the first suspect.

Result (`VerifyResult.as_json()`, `perfmod verify --format json`), schema 2:
documented for users in docs/json.md, which names every key (tests/test_json_docs.py).

`exit_code`: 0 the losses agree (and the rewrite is not measurably slower), 1
they do not, 2 a run failed (or verify could not start one: no training loop,
a file perfmod cannot parse), or a run changed a file of the script's folder
through a link of its mirror (the manifest's "linked" files and folders,
compared before and after the runs by (size, mtime_ns); codemod/verify.py says
what is linked): then a note names the files and "error" is {"run": null,
"message": ...}; 3 the losses agree but the rewrite is measurably slower (speed
verdict "slower"; the text says so in a WARNING line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = 2
DEFAULT_RTOL = 1e-2
DEFAULT_ROUNDS = 3  # timed rounds, each a run of the original and one of the rewrite
EXIT_AGREE, EXIT_DISAGREE, EXIT_FAILED, EXIT_SLOWER = 0, 1, 2, 3
CONFIDENCE = 0.95  # of the speed-up's range
NEGLIGIBLE = 0.02  # a speed-up whose whole range lies within 2% of 1.0 is no measurable difference
# Student's t, two-sided 95%, by degrees of freedom (rounds - 1), 1 to 15; past the table T_95_ABOVE.
T_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
T_95_ABOVE = 2.0  # df 16 to 60 lie between 2.12 and 2.00: a little wide rather than too narrow
FASTER, SLOWER, NO_DIFFERENCE, UNKNOWN = "faster", "slower", "no measurable difference", "unknown"
MANIFEST = "perfmod-verify.json"
RUNS = ("original", "rewritten")
TRACE_FILE = ".perfmod-trace.json"  # rank r of a torchrun run: ".perfmod-trace.rank<r>.json" (runtime/trace.py)
LAUNCHER = ("-m", "torch.distributed.run", "--standalone")  # torchrun, with the script's interpreter
STDERR_TAIL = 4000  # characters of a failed run's stderr that are kept
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # holds `codemod` and `runtime`
UNSAFE_NOTE = (
    "unsafe fixes were applied: they may change losses legitimately (sample order, worker "
    "processes, checkpoint timing); review the diff before trusting or dismissing a difference"
)


MODIFIED_MESSAGE = (
    "a run wrote into files of the script's folder (named in the notes above): verify must not change your files, "
    "so this verification failed. Files bigger than 1 MiB are linked, not copied, into the runs' folders; make the "
    "script write its outputs elsewhere, e.g. pass an output directory argument (`perfmod verify train.py -- "
    "--out /tmp/x`), and check those files"
)


class VerifyError(Exception):
    """verify could not run: the message says why and what to do (exit status 2)."""


@dataclass(frozen=True)
class Tolerance:
    level: str
    rtol: float
    atol: float

    @classmethod
    def for_level(cls, level: str, rtol: float | None = None, atol: float | None = None) -> Tolerance:
        default = 0.0 if level == "safe" else DEFAULT_RTOL
        return cls(level, default if rtol is None else rtol, 0.0 if atol is None else atol)

    @property
    def exact(self) -> bool:
        return self.rtol == 0 and self.atol == 0

    def as_json(self) -> dict:
        return {"level": self.level, "rtol": self.rtol, "atol": self.atol, "exact": self.exact}


@dataclass
class RunResult:
    """One version's runs: the first round's trace, as runtime.trace wrote it, and how
    that process ended; the traces of every round for the timing."""

    returncode: int
    trace: dict  # of a torchrun run: the ranks' traces combined (`combine`), theirs under "ranks"
    sites: dict[str, int]
    rounds: list[dict] = field(default_factory=list)  # each round's trace, the first's included; [] as [trace]

    @property
    def nproc(self) -> int | None:
        return self.trace.get("nproc")

    @property
    def traces(self) -> list[dict]:
        return self.rounds or [self.trace]

    def timed(self, key: str) -> float | None:
        """A rate or time of the runs (steps_per_s, samples_per_s, tokens_per_s, elapsed_s):
        the geometric mean over the rounds, None unless every round has it."""
        return geometric_mean([trace.get(key) for trace in self.traces])

    def as_json(self) -> dict:
        keys = ("peak_memory_bytes", "peak_memory_kind", "losses")
        ranks = self.trace.get("ranks")
        return {
            **{key: self.timed(key) for key in TIMED_KEYS},
            **{key: self.trace.get(key) for key in keys},
            "steps_per_s_rounds": [trace.get("steps_per_s") for trace in self.traces],
            "returncode": self.returncode,
            "sites": self.sites,
            "nproc": self.nproc,
            "ranks": None
            if ranks is None
            else [{"rank": t.get("rank"), **{key: t.get(key) for key in RANK_KEYS}} for t in ranks],
        }


RANK_KEYS = ("steps_per_s", "samples_per_s", "tokens_per_s", "peak_memory_bytes", "elapsed_s", "losses")
TIMED_KEYS = ("steps_per_s", "samples_per_s", "tokens_per_s", "elapsed_s")


def geometric_mean(values: Sequence[float | None]) -> float | None:
    if not values or any(value is None or not value > 0 for value in values):
        return None
    return math.exp(sum(math.log(value) for value in values) / len(values))


@dataclass(frozen=True)
class Speed:
    """The rewrite's steps/s over the original's, paired by round (each round runs both,
    in alternating order): the geometric mean of the rounds' ratios, its CONFIDENCE range
    (Student's t over the ratios' logarithms; None for one round) and the verdict: FASTER
    or SLOWER when the range lies above or below 1.0 by more than NEGLIGIBLE, NO_DIFFERENCE
    when it holds 1.0 or lies within NEGLIGIBLE of it, UNKNOWN without a range."""

    ratios: tuple[float, ...]
    ratio: float
    low: float | None
    high: float | None

    @classmethod
    def of(cls, ratios: Sequence[float | None]) -> Speed | None:
        """None unless every round has a ratio."""
        if not ratios or any(r is None or not r > 0 for r in ratios):
            return None
        logs = [math.log(r) for r in ratios]
        mean = sum(logs) / len(logs)
        if len(logs) < 2:
            return cls(tuple(ratios), math.exp(mean), None, None)
        spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
        t = T_95[len(logs) - 2] if len(logs) - 2 < len(T_95) else T_95_ABOVE
        margin = t * spread / math.sqrt(len(logs))
        return cls(tuple(ratios), math.exp(mean), math.exp(mean - margin), math.exp(mean + margin))

    @property
    def verdict(self) -> str:
        if self.low is None or self.high is None:
            return UNKNOWN
        if self.low > 1 + NEGLIGIBLE:
            return FASTER
        if self.high < 1 / (1 + NEGLIGIBLE):
            return SLOWER
        return NO_DIFFERENCE

    def as_json(self) -> dict:
        return {
            "rounds": len(self.ratios),
            "ratio": self.ratio,
            "low": self.low,
            "high": self.high,
            "confidence": CONFIDENCE,
            "ratios": list(self.ratios),
            "min": min(self.ratios),
            "max": max(self.ratios),
            "verdict": self.verdict,
        }


@dataclass
class VerifyResult:
    script: str
    args: list[str]
    level: str
    steps: int
    warmup: int
    seed: int
    fixes: list[dict]
    tolerance: Tolerance
    original: RunResult | None = None
    rewritten: RunResult | None = None
    notes: list[str] = field(default_factory=list)
    error: dict | None = None
    nproc: int | None = None  # the rewrite ran under torchrun with this many processes
    rounds: int = 1  # timed rounds asked for (each a run of both versions)
    profiles: dict | None = None  # `verify --profile`: {run: the profile's JSON, codemod/profile.py}

    @property
    def agree(self) -> bool | None:
        if self.error is not None or self.original is None or self.rewritten is None:
            return None
        return self.comparison["agree"] and self.global_batches is None

    @property
    def global_batches(self) -> tuple[int, int] | None:
        """(original, rewrite) samples per optimizer step where a --nproc rewrite's ranks
        together step on another number than the original did; None where they agree or
        cannot be told (samples unknown)."""
        if self.nproc is None or self.original is None or self.rewritten is None:
            return None
        pairs = zip(
            self.original.trace.get("samples_per_step") or [], self.rewritten.trace.get("samples_per_step") or []
        )
        for before, after in pairs:
            if before is not None and after is not None and before != after:
                return before, after
        return None

    @property
    def exit_code(self) -> int:
        """EXIT_FAILED when a run failed, EXIT_DISAGREE when the losses differ, EXIT_SLOWER
        when they agree but the rewrite is measurably slower, else EXIT_AGREE."""
        agree = self.agree
        if agree and self.speed is not None and self.speed.verdict == SLOWER:
            return EXIT_SLOWER
        return {True: EXIT_AGREE, False: EXIT_DISAGREE, None: EXIT_FAILED}[agree]

    @property
    def comparison(self) -> dict:
        if self.original is None or self.rewritten is None:
            return {"agree": None, "max_abs_deviation": None, "max_rel_deviation": None, "worst_step": None}
        return compare(self.original.trace["losses"], self.rewritten.trace["losses"], self.tolerance)

    @property
    def speed(self) -> Speed | None:
        """The rewrite's speed against the original's over the rounds both completed;
        None when a run failed or was not timed."""
        if self.error is not None or self.original is None or self.rewritten is None:
            return None
        before, after = self.original.traces, self.rewritten.traces
        if len(before) != len(after):
            return None
        return Speed.of(
            [
                a["steps_per_s"] / b["steps_per_s"] if b.get("steps_per_s") and a.get("steps_per_s") else None
                for b, a in zip(before, after)
            ]
        )

    @property
    def speedup(self) -> float | None:
        """The rewrite's steps/s over the original's: over the rounds, Speed.ratio (the
        geometric means' ratio); of a run that failed, its first round's."""
        speed = self.speed
        if speed is not None:
            return speed.ratio
        if self.original is None or self.rewritten is None:
            return None
        before, after = self.original.trace.get("steps_per_s"), self.rewritten.trace.get("steps_per_s")
        return after / before if before and after else None

    def as_json(self) -> dict:
        comparison = self.comparison
        first = self.original or self.rewritten
        return {
            "schema": SCHEMA,
            "script": self.script,
            "args": self.args,
            "level": self.level,
            "applied_level": self.tolerance.level,
            "steps": self.steps,
            "warmup": self.warmup,
            "seed": self.seed,
            "device": first.trace.get("device") if first else None,
            "torch": first.trace.get("torch") if first else None,
            "nproc": self.nproc,
            "fixes": self.fixes,
            "original": self.original.as_json() if self.original else None,
            "rewritten": self.rewritten.as_json() if self.rewritten else None,
            "speedup": self.speedup,
            "rounds": self.rounds,
            "speed": self.speed.as_json() if self.speed is not None else None,
            "max_abs_deviation": _finite_or_none(comparison["max_abs_deviation"]),
            "max_rel_deviation": _finite_or_none(comparison["max_rel_deviation"]),
            "worst_step": comparison["worst_step"],
            "tolerance": self.tolerance.as_json(),
            "agree": self.agree,
            "notes": self.notes,
            "error": self.error,
            **({"profile": self.profiles} if self.profiles is not None else {}),
        }


def _finite_or_none(value: float | None) -> float | None:
    """JSON has no infinity: a NaN against a number, or a deviation from a zero loss, is null."""
    return value if value is not None and math.isfinite(value) else None


# -- runs ------------------------------------------------------------------------------------------


def run_prepared(
    folder: str | Path,
    *,
    steps: int = 20,
    warmup: int = 2,
    args: Sequence[str] | None = None,
    python: str | None = None,
    seed: int = 0,
    deterministic: bool = False,
    timeout: float | None = 900.0,
    env: Mapping[str, str] | None = None,
    nproc: int | None = None,
    rounds: int = DEFAULT_ROUNDS,
) -> VerifyResult:
    """Run both copies in `folder` (see the module docstring) and compare them.
    `args` replaces the arguments the manifest recorded; `nproc` runs the rewrite
    under torchrun with that many processes; `rounds` runs each copy that many times,
    alternating, for the spread of the speed-up."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as error:
        raise VerifyError(f"{folder}: not a folder prepared by perfmod verify ({MANIFEST}: {error})") from None
    if not 1 <= warmup < steps:
        raise VerifyError(
            f"--warmup {warmup} with --steps {steps}: need 1 <= warmup < steps, so that some "
            "steps are timed after the first (which pays for start-up)"
        )
    if nproc is not None and nproc < 1:
        raise VerifyError(f"--nproc {nproc}: need at least one process")
    if rounds < 1:
        raise VerifyError(f"--rounds {rounds}: need at least one round")
    args = list(manifest["args"] if args is None else args)
    tolerance = Tolerance.for_level(manifest["applied_level"], manifest.get("rtol"), manifest.get("atol"))
    result = VerifyResult(
        manifest["script"],
        args,
        manifest["level"],
        steps,
        warmup,
        seed,
        manifest["fixes"],
        tolerance,
        notes=list(manifest["notes"]),
        nproc=nproc,
        rounds=rounds,
    )
    watched = _watch(folder / RUNS[0], manifest.get("linked", {}))
    for number in range(rounds):
        for run in RUNS if number % 2 == 0 else RUNS[::-1]:  # alternating: neither always goes first
            run_folder = folder / run
            launch = nproc if run == "rewritten" else None
            returncode, trace, stderr = _run(
                run_folder / manifest["entry"],
                args,
                run_folder,
                python,
                steps,
                warmup,
                seed,
                deterministic,
                timeout,
                env,
                launch,
                nproc is not None,
            )
            failure = _failure(returncode, trace, steps, launch)
            if trace is not None:
                if getattr(result, run) is None:
                    setattr(result, run, RunResult(returncode, trace, manifest["sites"][run], [trace]))
                elif failure is None:
                    getattr(result, run).rounds.append(trace)
            if failure is not None:
                where = f" (round {number + 1} of {rounds})" if number else ""
                result.error = {"run": run, "message": failure + where, "stderr": stderr[-STDERR_TAIL:]}
                break
        if result.error is not None:
            break
    for run in RUNS:
        _note_varying_losses(result, run)
    changed = sorted(name for name, (path, before) in watched.items() if _stat(path) != before)
    if changed:
        result.notes.append(
            f"a run changed files of the script's folder through the links verify made: {', '.join(changed)}"
        )
        if result.error is None:
            result.error = {"run": None, "message": MODIFIED_MESSAGE, "stderr": ""}
    if result.global_batches is not None and result.error is None:
        before, after = result.global_batches
        result.notes.append(
            f"the global batch differs: {after} samples per optimizer step over the {nproc} ranks of "
            f"the rewrite, {before} in the original; a torchrun-ready script splits each batch over "
            "the ranks (runtime.distributed.local_batch_size) so that they step on the same samples"
        )
    if result.agree is False and tolerance.level == "unsafe":
        result.notes.append("the losses differ; with unsafe fixes that may be expected (see above)")
    return result


def run_copy(
    folder: str | Path,
    run: str,
    *,
    steps: int,
    warmup: int,
    args: Sequence[str] | None = None,
    python: str | None = None,
    seed: int = 0,
    timeout: float | None = 900.0,
    env: Mapping[str, str] | None = None,
) -> tuple[int, dict | None, str, str | None]:
    """One run of the copy `run` ("original" or "rewritten") that `folder` holds, as a
    round of `run_prepared` runs it: (exit status, trace, stderr, why it failed or None).
    `perfmod profile` runs the original this way, with the profiler's settings in `env`."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as error:
        raise VerifyError(f"{folder}: not a folder prepared by perfmod verify ({MANIFEST}: {error})") from None
    arguments = list(manifest["args"] if args is None else args)
    returncode, trace, stderr = _run(
        folder / run / manifest["entry"], arguments, folder / run, python, steps, warmup, seed, False, timeout, env
    )
    return returncode, trace, stderr, _failure(returncode, trace, steps)


def _note_varying_losses(result: VerifyResult, run: str) -> None:
    """A note where one version's losses differ between its rounds: the comparison (of the
    first round's) then also holds noise of the script's own."""
    runs = getattr(result, run)
    if runs is None or len(runs.traces) < 2:
        return
    first = runs.traces[0].get("losses")
    if any(trace.get("losses") != first for trace in runs.traces[1:]):
        result.notes.append(
            f"the {run} run's losses differ between its rounds, with the same seed: the script is not "
            "deterministic (kernels, or randomness that verify does not seed); losses are compared in the "
            "first round" + ("; try --deterministic" if run == "original" else "")
        )


def _watch(run_folder: Path, linked: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, tuple | None]]:
    """What the links of a run's folder lead to, with its (size, mtime_ns) now: the files
    linked and the folders linked whole (their listings' mtime)."""
    watched = {}
    for kind in ("files", "folders"):
        for name in linked.get(kind, ()):
            path = os.path.realpath(run_folder / name)
            watched[name + ("/" if kind == "folders" else "")] = (path, _stat(path))
    return watched


def _stat(path: str) -> tuple | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_size, status.st_mtime_ns


def compare(original: Sequence[float | None], rewritten: Sequence[float | None], tolerance: Tolerance) -> dict:
    """Step-by-step agreement; NaN and inf arrive as None and agree only with None."""
    if len(original) != len(rewritten):
        return {"agree": False, "max_abs_deviation": None, "max_rel_deviation": None, "worst_step": None}
    agree, worst, max_abs, max_rel = True, None, 0.0, 0.0
    for index, (want, got) in enumerate(zip(original, rewritten), start=1):
        if want is None or got is None:
            if want is not got:
                agree, worst, max_abs, max_rel = False, index, math.inf, math.inf
            continue
        deviation = abs(got - want)
        relative = deviation / abs(want) if want else (math.inf if deviation else 0.0)
        if deviation > tolerance.atol + tolerance.rtol * abs(want):
            agree = False
        if deviation > max_abs:
            worst = index
        max_abs, max_rel = max(max_abs, deviation), max(max_rel, relative)
    return {"agree": agree, "max_abs_deviation": max_abs, "max_rel_deviation": max_rel, "worst_step": worst}


def _run(
    script: Path,
    args: list[str],
    cwd: Path,
    python: str | None,
    steps: int,
    warmup: int,
    seed: int,
    deterministic: bool,
    timeout: float | None,
    env: Mapping[str, str] | None,
    nproc: int | None = None,
    pin_shuffle: bool = False,
) -> tuple[int, dict | None, str]:
    """Run one instrumented copy, under torchrun with `nproc` processes when given;
    (exit status, its trace (the ranks' combined) or None, its stderr)."""
    out = cwd / TRACE_FILE
    for stale in [out, *cwd.glob(".perfmod-trace.rank*.json")]:  # from an earlier run of a kept folder
        stale.unlink(missing_ok=True)
    environment = dict(os.environ if env is None else env)
    environment.setdefault("PYTHONHASHSEED", "0")
    environment["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the linked folders
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (environment.get("PYTHONPATH"), str(PACKAGE_ROOT)) if p)
    environment.update(
        {
            "PERFMOD_TRACE_OUT": str(out),
            "PERFMOD_TRACE_STEPS": str(steps),
            "PERFMOD_TRACE_WARMUP": str(warmup),
            "PERFMOD_TRACE_SEED": str(seed),
        }
    )
    if pin_shuffle:
        environment["PERFMOD_TRACE_PIN_SHUFFLE"] = "1"
    if deterministic:
        environment.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        environment["PERFMOD_TRACE_DETERMINISTIC"] = "1"
    launcher = [*LAUNCHER, f"--nproc_per_node={nproc}"] if nproc is not None else []
    command = [python or sys.executable, *launcher, str(script), *args]
    try:
        # A session of its own, so that a timeout ends the run's whole process group.
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as error:
        return -1, None, f"cannot start {command[0]}: {error}"
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(process)
        _, stderr = process.communicate()
        stderr = (stderr or "") + f"\n(perfmod verify: killed after {timeout:g} s; see --timeout)"
        return -1, _read_traces(out, nproc), stderr
    return process.returncode, _read_traces(out, nproc), stderr


def _kill(process: subprocess.Popen) -> None:
    """End the run's session: SIGTERM, then after 5 s SIGKILL to what is left of it
    (torchrun's processes and DataLoader workers outlive a killed launcher)."""
    if not hasattr(os, "killpg"):  # Windows: the process itself
        process.kill()
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _read_traces(out: Path, nproc: int | None) -> dict | None:
    """The run's trace: the one file of a plain run, the ranks' files combined under torchrun."""
    if nproc is None:
        return _read_trace(out)
    traces = [_read_trace(out.with_name(f"{out.stem}.rank{rank}{out.suffix}")) for rank in range(nproc)]
    if nproc == 1 and traces[0] is None:  # torchrun with one process: WORLD_SIZE 1, the plain file
        traces = [_read_trace(out)]
    return combine(traces) if any(t is not None for t in traces) else None


def combine(traces: Sequence[dict | None]) -> dict:
    """One trace for the ranks of a torchrun run (see the module docstring); ranks that
    wrote none are listed under "missing_ranks", and the run is then not complete."""
    present = [t for t in traces if t is not None]
    missing = [rank for rank, t in enumerate(traces) if t is None]
    steps = min(t["steps"] for t in present)
    timed = min(t.get("timed_steps") or 0 for t in present)
    elapsed = [t.get("elapsed_s") for t in present]
    window = max(elapsed) if timed and all(e is not None for e in elapsed) else None
    warmup = present[0].get("warmup", 0)
    combined = {
        "completed": not missing and all(t["completed"] for t in present),
        "steps": steps,
        "warmup": warmup,
        "timed_steps": timed,
        "elapsed_s": window,
        "steps_per_s": timed / window if window else None,
        "samples_per_step": _sum_by_step([t.get("samples_per_step") or [] for t in present]),
        "samples_per_s": _summed_rate(present, "samples_per_step", warmup, steps, window),
        "tokens_per_s": _summed_rate(present, "tokens_per_step", warmup, steps, window),
        "losses": _mean_by_step([t["losses"] for t in present]),
        "peak_memory_bytes": max((t.get("peak_memory_bytes") or 0 for t in present), default=None) or None,
        "peak_memory_kind": present[0].get("peak_memory_kind"),
        "device": present[0].get("device"),
        "torch": present[0].get("torch"),
        "nproc": len(traces),
        "ranks": present,
    }
    if missing:
        combined["missing_ranks"] = missing
    return combined


def _sum_by_step(series: list[list]) -> list:
    length = min(map(len, series), default=0)
    return [None if any(s[i] is None for s in series) else sum(s[i] for s in series) for i in range(length)]


def _mean_by_step(series: list[list]) -> list:
    # Over the steps every rank has: a rank with more backward() calls leaves the lengths unequal to the original's.
    length = min(map(len, series), default=0)
    return [
        None if any(s[i] is None for s in series) else sum(s[i] for s in series) / len(series) for i in range(length)
    ]


def _summed_rate(traces: list[dict], key: str, warmup: int, steps: int, window: float | None) -> float | None:
    counts = [c for t in traces for c in (t.get(key) or [None])[warmup:steps]]
    if not window or not counts or any(c is None for c in counts):
        return None
    return sum(counts) / window


def _read_trace(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _failure(returncode: int, trace: dict | None, steps: int, nproc: int | None = None) -> str | None:
    launched = f" under torchrun with {nproc} processes" if nproc is not None else ""
    if returncode != 0:
        return f"the script failed{launched} (exit status {returncode})"
    if trace is None:
        return "the script ended without a trace (did it run the training loop in this process?)"
    if trace.get("missing_ranks"):
        ranks = ", ".join(map(str, trace["missing_ranks"]))
        return f"rank {ranks} of the {nproc} processes ended without a trace (did every rank run the training loop?)"
    if not trace["completed"]:
        return (
            f"the script ended after {trace['steps']} of {steps} optimizer steps: lower --steps or pass "
            "arguments that train longer"
        )
    if nproc is not None and nproc > 1:
        for rank in trace["ranks"]:
            group = rank.get("process_group") or {}
            if not group.get("initialized") or group.get("world_size") != nproc:
                joined = f"a process group of {group['world_size']}" if group.get("initialized") else "no process group"
                return (
                    f"rank {rank.get('rank')} had joined {joined} by its first optimizer step, not one of the "
                    f"{nproc} processes torchrun started: each process trained alone. The script is not "
                    "torchrun-ready: call runtime.distributed.setup() (or init_process_group) and wrap the model "
                    "in DistributedDataParallel"
                )
    return None


# -- output ----------------------------------------------------------------------------------


def render_json(result: VerifyResult) -> str:
    return json.dumps(result.as_json(), indent=2)


def error_json(script: str | Path, message: str) -> str:
    """The JSON of a verify that could not run a script: the schema's keys, nothing measured."""
    return json.dumps(
        {
            "schema": SCHEMA,
            "script": str(script),
            "agree": None,
            "original": None,
            "rewritten": None,
            "error": {"run": None, "message": message, "stderr": ""},
        },
        indent=2,
    )


MAX_LOSS_ROWS = 12  # the first and last steps, and the worst one, beyond this many


def render_text(result: VerifyResult) -> str:
    lines = [f"perfmod verify {result.script}"]
    data = result.as_json()
    lines.append(
        f"level {data['level']} (highest applied: {data['applied_level']}); {result.steps} steps, "
        f"{result.warmup} warm-up not timed; seed {result.seed}; device {data['device']}; "
        f"torch {data['torch']}"
    )
    if result.nproc is not None:
        lines.append(
            f"rewritten run: torchrun, {result.nproc} process{'es' if result.nproc > 1 else ''}, against the "
            "original in one; its loss per step is the mean over the ranks, its samples/s and tokens/s the "
            "sum, its peak memory the largest rank's"
        )
    if result.fixes:
        lines.append("fixes applied:")
        lines += [f"  {f['path']}:{f['line']}: {f['code']} ({f['level']}) {f['message']}" for f in result.fixes]
    if result.original and result.rewritten:
        lines += ["", *_speed_table(result)]
        speed = speed_line(result)
        if speed:
            lines.append(speed)
        if result.rewritten.trace.get("ranks"):
            lines += ["", *_rank_table(result.rewritten.trace["ranks"])]
        lines += ["", *_loss_table(result)]
    comparison = result.comparison
    tolerance = result.tolerance
    rule = "exact (bit for bit)" if tolerance.exact else f"rtol {tolerance.rtol:g}, atol {tolerance.atol:g}"
    if comparison["max_abs_deviation"] is not None:
        lines.append(
            f"largest deviation: abs {comparison['max_abs_deviation']:.3g}, "
            f"rel {comparison['max_rel_deviation']:.3g}"
            + (f" (step {comparison['worst_step']})" if comparison["worst_step"] else "")
        )
    lines.append(f"tolerance ({tolerance.level}): {rule}")
    lines += [f"note: {note}" for note in result.notes]
    for run, profile in (result.profiles or {}).items():
        lines += ["", *profile_lines(run, profile)]
    if result.error is not None:
        run = f"{result.error['run']} run: " if result.error["run"] else ""
        lines += ["", f"FAILED: {run}{result.error['message']}"]
        if result.error["stderr"].strip():
            lines += ["--- stderr (last lines) ---", result.error["stderr"].rstrip()]
    elif result.agree:
        if result.exit_code == EXIT_SLOWER:
            lines.append(slower_warning(result.speed))
            lines.append(f"result: losses agree, but the rewrite is SLOWER ({result.speed.ratio:.2f}x steps/s)")
        else:
            lines.append("result: losses agree")
    else:
        lines.append("result: losses DISAGREE")
    return "\n".join(lines) + "\n"


def profile_lines(run: str, profile: dict, top: int = 5) -> list[str]:
    """A `verify --profile` run's profile in short: the step by category, the top findings."""
    if profile.get("error"):
        return [f"profile of the {run} run: failed: {profile['error']['message']}"]
    step = profile["step_ms"] or 1.0
    parts = ", ".join(f"{name} {ms / step:.0%}" for name, ms in profile["categories"].items() if ms > 0)
    lines = [f"profile of the {run} run: {step:.1f} ms per step: {parts}"]
    for row in profile["findings"][:top]:
        saving = f"saves up to {row['saving_ms']:.1f} ms" if row["saving_ms"] is not None else row["saving"]
        lines.append(f"  {row['code']} {row['path']}:{row['line']}: {row['share']:.0%} of the step; {saving}")
    lines.append(f"  not covered by any finding: {profile['uncovered']['share']:.0%}")
    return lines


def speed_line(result: VerifyResult) -> str | None:
    """The speed-up with its spread over the rounds and what it says; None when the
    runs were not timed."""
    speed = result.speed
    if speed is None:
        return None
    each = ", ".join(f"{r:.2f}x" for r in speed.ratios)
    if speed.verdict == UNKNOWN:
        return (
            f"speed: {speed.ratio:.2f}x steps/s from one round: no spread to tell it from noise "
            f"(--rounds {DEFAULT_ROUNDS} or more measure one)"
        )
    verdict = {FASTER: "faster", SLOWER: "SLOWER", NO_DIFFERENCE: "no measurable difference"}[speed.verdict]
    if speed.verdict == NO_DIFFERENCE and (min(speed.ratios) > 1 + NEGLIGIBLE or max(speed.ratios) < 1 - NEGLIGIBLE):
        way = "faster" if speed.ratio > 1 else "slower"
        verdict += (
            f"; every round was {way}, but the rounds vary too much for the range to leave out 1.0 "
            f"(a busy machine?): more --rounds narrow it"
        )
    return (
        f"speed: {speed.ratio:.2f}x steps/s, {CONFIDENCE:.0%} range {speed.low:.2f}x-{speed.high:.2f}x over "
        f"{len(speed.ratios)} rounds (each: {each}): {verdict}"
    )


def slower_warning(speed: Speed) -> str:
    return (
        f"WARNING: the rewrite is measurably slower than the original: {speed.ratio:.2f}x steps/s "
        f"({speed.low:.2f}x-{speed.high:.2f}x); on this machine it costs time (exit status {EXIT_SLOWER})"
    )


def _speed_table(result: VerifyResult) -> list[str]:
    original, rewritten = result.original, result.rewritten
    before, after = original.trace, rewritten.trace
    rows = [("steps/s", original.timed("steps_per_s"), rewritten.timed("steps_per_s"), _ratio)]
    for key, label in (("samples_per_s", "samples/s"), ("tokens_per_s", "tokens/s")):
        if before.get(key) is not None or after.get(key) is not None:
            rows.append((label, original.timed(key), rewritten.timed(key), _ratio))
    kind = before.get("peak_memory_kind")
    rows.append(
        (
            f"peak memory ({'CUDA allocated' if kind == 'cuda' else 'process RSS'})",
            before.get("peak_memory_bytes"),
            after.get("peak_memory_bytes"),
            _memory_change,
        )
    )
    lines = [
        f"| {'':<28} | {'original':>12} | {'rewritten':>12} | {'change':>8} |",
        f"|{'-' * 30}|{'-' * 14}|{'-' * 14}|{'-' * 10}|",
    ]
    for label, a, b, change in rows:
        memory = label.startswith("peak")
        lines.append(f"| {label:<28} | {_quantity(a, memory):>12} | {_quantity(b, memory):>12} | {change(a, b):>8} |")
    return lines


def _rank_table(ranks: list[dict]) -> list[str]:
    kind = ranks[0].get("peak_memory_kind")
    lines = [
        f"| {'rewritten, rank':<16} | {'steps/s':>10} | {'samples/s':>10} | {'tokens/s':>10} | "
        f"{'peak ' + ('CUDA' if kind == 'cuda' else 'RSS'):>12} | {'last loss':>12} |",
        f"|{'-' * 18}|{'-' * 12}|{'-' * 12}|{'-' * 12}|{'-' * 14}|{'-' * 14}|",
    ]
    for trace in ranks:
        losses = trace.get("losses") or []
        last = f"{losses[-1]:.6g}" if losses and losses[-1] is not None else "-"
        lines.append(
            f"| {trace.get('rank', '?'):<16} | {_quantity(trace.get('steps_per_s'), False):>10} | "
            f"{_quantity(trace.get('samples_per_s'), False):>10} | "
            f"{_quantity(trace.get('tokens_per_s'), False):>10} | "
            f"{_quantity(trace.get('peak_memory_bytes'), True):>12} | {last:>12} |"
        )
    return lines


def _loss_table(result: VerifyResult) -> list[str]:
    before, after = result.original.trace["losses"], result.rewritten.trace["losses"]
    count = max(len(before), len(after))
    worst = result.comparison["worst_step"]
    shown = list(range(1, count + 1))
    if count > MAX_LOSS_ROWS:
        half = MAX_LOSS_ROWS // 2
        shown = sorted({*range(1, half + 1), *range(count - half + 1, count + 1), *([worst] if worst else [])})
    lines = [
        f"| {'loss #':>6} | {'original':>22} | {'rewritten':>22} | {'abs diff':>9} |",
        f"|{'-' * 8}|{'-' * 24}|{'-' * 24}|{'-' * 11}|",
    ]
    previous = 0
    for index in shown:
        if index != previous + 1:
            lines.append(f"| {'...':>6} | {'':>22} | {'':>22} | {'':>9} |")
        a = before[index - 1] if index <= len(before) else None
        b = after[index - 1] if index <= len(after) else None
        diff = f"{abs(a - b):.2e}" if a is not None and b is not None else "-"
        mark = " <" if index == worst else ""
        lines.append(f"| {index:>6} | {_loss(a):>22} | {_loss(b):>22} | {diff:>9} |{mark}")
        previous = index
    return lines


def _loss(value: float | None) -> str:
    return "nan/inf/missing" if value is None else repr(value)


def _quantity(value: float | None, memory: bool) -> str:
    if value is None:
        return "-"
    if memory:
        return f"{value / 2**20:.1f} MiB"
    return f"{value:.4g}"


def _ratio(before: float | None, after: float | None) -> str:
    return f"{after / before:.2f}x" if before and after else "-"


def _memory_change(before: float | None, after: float | None) -> str:
    return f"{(after - before) / before:+.1%}" if before and after is not None else "-"


# -- command line (for a machine without libcst) -------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codemod.verify_run",
        description="Run the copies `perfmod verify --keep FOLDER` prepared; compare.",
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--python")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--nproc", type=int, help="run the rewrite under torchrun with this many processes")
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help=f"timed rounds, each a run of both copies in alternating order (default {DEFAULT_ROUNDS})",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.epilog = "Arguments after `--` replace the script's arguments recorded when the copies were prepared."
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    options, args = parser.parse_args(argv[:split]), argv[split + 1 :]
    try:
        result = run_prepared(
            options.folder,
            steps=options.steps,
            warmup=options.warmup,
            args=args or None,
            python=options.python,
            seed=options.seed,
            deterministic=options.deterministic,
            timeout=options.timeout,
            nproc=options.nproc,
            rounds=options.rounds,
        )
    except VerifyError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    if options.format == "json":
        print(render_json(result))
    else:
        print(render_text(result), end="")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())

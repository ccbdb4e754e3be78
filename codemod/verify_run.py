"""Run the two prepared copies of `perfmod verify` and compare them.

This half of verify imports neither libcst nor torch (the scripts import torch
in their own processes), so a machine that has only torch can run copies that
`perfmod verify --keep FOLDER` (or `codemod.verify.prepare`) made elsewhere:

    python -m codemod.verify_run FOLDER [--steps N] [--warmup W] [--format json] [-- ARGS]

FOLDER holds `original/` and `rewritten/` (mirrors of the script's folder, with
the instrumented copies; see codemod/verify.py) and `perfmod-verify.json`, the manifest: the script's
entry file, its arguments, the fixes applied and the tolerance.

Runs. The two go one after the other, the original first, each with its own
folder as working directory, with the script's interpreter (`python`, default
`sys.executable`), the same arguments and the same environment plus
PYTHONHASHSEED (0 unless set), PYTHONDONTWRITEBYTECODE=1, the folder holding
`runtime` appended to PYTHONPATH and the tracer's settings (runtime/trace.py).
`runtime.trace.install()` seeds `random`, torch and numpy with `seed` before
the script's code runs. Each run stops cleanly after `steps` optimizer steps.

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

Result (`VerifyResult.as_json()`, `perfmod verify --format json`), schema 1:

    {"schema": 1,
     "script": str, "args": [str], "level": "safe"|"numeric"|"unsafe" (--level),
     "applied_level": str (highest level among the applied fixes; "safe" if none),
     "steps": int, "warmup": int, "seed": int, "device": str|null, "torch": str|null,
     "fixes": [{"path": str (relative to the script's folder), "line": int,
                "code": str, "level": str, "message": str}],
     "original" / "rewritten": null (not run) | {
        "steps_per_s": float|null, "samples_per_s": float|null, "tokens_per_s": float|null,
        "peak_memory_bytes": int, "peak_memory_kind": "cuda"|"rss",
        "losses": [float|null],   (one per backward(); null for NaN or inf)
        "elapsed_s": float|null, "returncode": int,
        "sites": {"loss": int, "stepped": int, "batch": int}},   (hooks instrumented)
     "speedup": float|null (rewritten steps/s over original steps/s),
     "max_abs_deviation": float|null, "max_rel_deviation": float|null, (null: not finite)
     "worst_step": int|null (1-based index into losses),
     "tolerance": {"level": str, "rtol": float, "atol": float, "exact": bool},
     "agree": bool|null (null when a run failed),
     "notes": [str],
     "error": null | {"run": "original"|"rewritten"|null, "message": str, "stderr": str}}

A verify that could not start a run prints the same object with only
"schema", "script", "agree" (null), "original", "rewritten" (null) and "error".

`exit_code`: 0 the losses agree, 1 they do not, 2 a run failed (or verify
could not start one: no training loop, a file perfmod cannot parse), or a run
changed a file of the script's folder through a link of its mirror (the
manifest's "linked" files and folders, compared before and after the runs by
(size, mtime_ns); codemod/verify.py says what is linked): then a note names the
files and "error" is {"run": null, "message": ...}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

SCHEMA = 1
DEFAULT_RTOL = 1e-2
EXIT_AGREE, EXIT_DISAGREE, EXIT_FAILED = 0, 1, 2
MANIFEST = "perfmod-verify.json"
RUNS = ("original", "rewritten")
TRACE_FILE = ".perfmod-trace.json"
STDERR_TAIL = 4000  # characters of a failed run's stderr that are kept
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # holds `codemod` and `runtime`
UNSAFE_NOTE = ("unsafe fixes were applied: they may change losses legitimately (sample order, worker "
               "processes, checkpoint timing); review the diff before trusting or dismissing a difference")


MODIFIED_MESSAGE = (
    "a run wrote into files of the script's folder (named in the notes above): verify must not change your files, "
    "so this verification failed. Files bigger than 1 MiB are linked, not copied, into the runs' folders; make the "
    "script write its outputs elsewhere, e.g. pass an output directory argument (`perfmod verify train.py -- "
    "--out /tmp/x`), and check those files")


class VerifyError(Exception):
    """verify could not run: the message says why and what to do (exit status 2)."""


@dataclass(frozen=True)
class Tolerance:
    level: str
    rtol: float
    atol: float

    @classmethod
    def for_level(cls, level: str, rtol: float | None = None, atol: float | None = None) -> "Tolerance":
        default = 0.0 if level == "safe" else DEFAULT_RTOL
        return cls(level, default if rtol is None else rtol, 0.0 if atol is None else atol)

    @property
    def exact(self) -> bool:
        return self.rtol == 0 and self.atol == 0

    def as_json(self) -> dict:
        return {"level": self.level, "rtol": self.rtol, "atol": self.atol, "exact": self.exact}


@dataclass
class RunResult:
    """One run's trace, as runtime.trace wrote it, and how the process ended."""

    returncode: int
    trace: dict
    sites: dict[str, int]

    def as_json(self) -> dict:
        keys = ("steps_per_s", "samples_per_s", "tokens_per_s", "peak_memory_bytes", "peak_memory_kind",
                "losses", "elapsed_s")
        return {**{key: self.trace.get(key) for key in keys}, "returncode": self.returncode, "sites": self.sites}


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

    @property
    def agree(self) -> bool | None:
        if self.error is not None or self.original is None or self.rewritten is None:
            return None
        return self.comparison["agree"]

    @property
    def exit_code(self) -> int:
        return {True: EXIT_AGREE, False: EXIT_DISAGREE, None: EXIT_FAILED}[self.agree]

    @property
    def comparison(self) -> dict:
        if self.original is None or self.rewritten is None:
            return {"agree": None, "max_abs_deviation": None, "max_rel_deviation": None, "worst_step": None}
        return compare(self.original.trace["losses"], self.rewritten.trace["losses"], self.tolerance)

    @property
    def speedup(self) -> float | None:
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
            "fixes": self.fixes,
            "original": self.original.as_json() if self.original else None,
            "rewritten": self.rewritten.as_json() if self.rewritten else None,
            "speedup": self.speedup,
            "max_abs_deviation": _finite_or_none(comparison["max_abs_deviation"]),
            "max_rel_deviation": _finite_or_none(comparison["max_rel_deviation"]),
            "worst_step": comparison["worst_step"],
            "tolerance": self.tolerance.as_json(),
            "agree": self.agree,
            "notes": self.notes,
            "error": self.error,
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
) -> VerifyResult:
    """Run both copies in `folder` (see the module docstring) and compare them.
    `args` replaces the arguments the manifest recorded."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as error:
        raise VerifyError(f"{folder}: not a folder prepared by perfmod verify ({MANIFEST}: {error})") from None
    if not 1 <= warmup < steps:
        raise VerifyError(f"--warmup {warmup} with --steps {steps}: need 1 <= warmup < steps, so that some "
                          "steps are timed after the first (which pays for start-up)")
    args = list(manifest["args"] if args is None else args)
    tolerance = Tolerance.for_level(manifest["applied_level"], manifest.get("rtol"), manifest.get("atol"))
    result = VerifyResult(manifest["script"], args, manifest["level"], steps, warmup, seed, manifest["fixes"],
                          tolerance, notes=list(manifest["notes"]))
    watched = _watch(folder / RUNS[0], manifest.get("linked", {}))
    for run in RUNS:
        run_folder = folder / run
        returncode, trace, stderr = _run(run_folder / manifest["entry"], args, run_folder, python, steps, warmup,
                                         seed, deterministic, timeout, env)
        failure = _failure(returncode, trace, steps)
        if trace is not None:
            setattr(result, run, RunResult(returncode, trace, manifest["sites"][run]))
        if failure is not None:
            result.error = {"run": run, "message": failure, "stderr": stderr[-STDERR_TAIL:]}
            break
    changed = sorted(name for name, (path, before) in watched.items() if _stat(path) != before)
    if changed:
        result.notes.append(f"a run changed files of the script's folder through the links verify made: "
                            f"{', '.join(changed)}")
        if result.error is None:
            result.error = {"run": None, "message": MODIFIED_MESSAGE, "stderr": ""}
    if result.agree is False and tolerance.level == "unsafe":
        result.notes.append("the losses differ; with unsafe fixes that may be expected (see above)")
    return result


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


def _run(script: Path, args: list[str], cwd: Path, python: str | None, steps: int, warmup: int, seed: int,
         deterministic: bool, timeout: float | None, env: Mapping[str, str] | None) -> tuple[int, dict | None, str]:
    """Run one instrumented copy; (exit status, its trace or None, its stderr)."""
    out = cwd / TRACE_FILE
    out.unlink(missing_ok=True)  # from an earlier run of a kept folder
    environment = dict(os.environ if env is None else env)
    environment.setdefault("PYTHONHASHSEED", "0")
    environment["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the linked folders
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (environment.get("PYTHONPATH"), str(PACKAGE_ROOT)) if p)
    environment.update({"PERFMOD_TRACE_OUT": str(out), "PERFMOD_TRACE_STEPS": str(steps),
                        "PERFMOD_TRACE_WARMUP": str(warmup), "PERFMOD_TRACE_SEED": str(seed)})
    if deterministic:
        environment.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        environment["PERFMOD_TRACE_DETERMINISTIC"] = "1"
    command = [python or sys.executable, str(script), *args]
    try:
        process = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True,
                                 errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else expired.stderr or ""
        return -1, _read_trace(out), stderr + f"\n(perfmod verify: killed after {timeout:g} s; see --timeout)"
    except OSError as error:
        return -1, None, f"cannot start {command[0]}: {error}"
    return process.returncode, _read_trace(out), process.stderr


def _read_trace(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _failure(returncode: int, trace: dict | None, steps: int) -> str | None:
    if returncode != 0:
        return f"the script failed (exit status {returncode})"
    if trace is None:
        return "the script ended without a trace (did it run the training loop in this process?)"
    if not trace["completed"]:
        return (f"the script ended after {trace['steps']} of {steps} optimizer steps: lower --steps or pass "
                "arguments that train longer")
    return None


# -- output ----------------------------------------------------------------------------------


def render_json(result: VerifyResult) -> str:
    return json.dumps(result.as_json(), indent=2)


def error_json(script: str | Path, message: str) -> str:
    """The JSON of a verify that could not run a script: the schema's keys, nothing measured."""
    return json.dumps({"schema": SCHEMA, "script": str(script), "agree": None, "original": None, "rewritten": None,
                       "error": {"run": None, "message": message, "stderr": ""}}, indent=2)


MAX_LOSS_ROWS = 12  # the first and last steps, and the worst one, beyond this many


def render_text(result: VerifyResult) -> str:
    lines = [f"perfmod verify {result.script}"]
    data = result.as_json()
    lines.append(f"level {data['level']} (highest applied: {data['applied_level']}); {result.steps} steps, "
                 f"{result.warmup} warm-up not timed; seed {result.seed}; device {data['device']}; "
                 f"torch {data['torch']}")
    if result.fixes:
        lines.append("fixes applied:")
        lines += [f"  {f['path']}:{f['line']}: {f['code']} ({f['level']}) {f['message']}" for f in result.fixes]
    if result.original and result.rewritten:
        lines += ["", *_speed_table(result)]
        lines += ["", *_loss_table(result)]
    comparison = result.comparison
    tolerance = result.tolerance
    rule = "exact (bit for bit)" if tolerance.exact else f"rtol {tolerance.rtol:g}, atol {tolerance.atol:g}"
    if comparison["max_abs_deviation"] is not None:
        lines.append(f"largest deviation: abs {comparison['max_abs_deviation']:.3g}, "
                     f"rel {comparison['max_rel_deviation']:.3g}"
                     + (f" (step {comparison['worst_step']})" if comparison["worst_step"] else ""))
    lines.append(f"tolerance ({tolerance.level}): {rule}")
    lines += [f"note: {note}" for note in result.notes]
    if result.error is not None:
        run = f"{result.error['run']} run: " if result.error["run"] else ""
        lines += ["", f"FAILED: {run}{result.error['message']}"]
        if result.error["stderr"].strip():
            lines += ["--- stderr (last lines) ---", result.error["stderr"].rstrip()]
    elif result.agree:
        lines.append("result: losses agree")
    else:
        lines.append("result: losses DISAGREE")
    return "\n".join(lines) + "\n"


def _speed_table(result: VerifyResult) -> list[str]:
    before, after = result.original.trace, result.rewritten.trace
    rows = [("steps/s", before.get("steps_per_s"), after.get("steps_per_s"), _ratio)]
    for key, label in (("samples_per_s", "samples/s"), ("tokens_per_s", "tokens/s")):
        if before.get(key) is not None or after.get(key) is not None:
            rows.append((label, before.get(key), after.get(key), _ratio))
    kind = before.get("peak_memory_kind")
    rows.append((f"peak memory ({'CUDA allocated' if kind == 'cuda' else 'process RSS'})",
                 before.get("peak_memory_bytes"), after.get("peak_memory_bytes"), _memory_change))
    lines = [f"| {'':<28} | {'original':>12} | {'rewritten':>12} | {'change':>8} |",
             f"|{'-' * 30}|{'-' * 14}|{'-' * 14}|{'-' * 10}|"]
    for label, a, b, change in rows:
        memory = label.startswith("peak")
        lines.append(f"| {label:<28} | {_quantity(a, memory):>12} | {_quantity(b, memory):>12} | {change(a, b):>8} |")
    return lines


def _loss_table(result: VerifyResult) -> list[str]:
    before, after = result.original.trace["losses"], result.rewritten.trace["losses"]
    count = max(len(before), len(after))
    worst = result.comparison["worst_step"]
    shown = list(range(1, count + 1))
    if count > MAX_LOSS_ROWS:
        half = MAX_LOSS_ROWS // 2
        shown = sorted({*range(1, half + 1), *range(count - half + 1, count + 1), *([worst] if worst else [])})
    lines = [f"| {'loss #':>6} | {'original':>22} | {'rewritten':>22} | {'abs diff':>9} |",
             f"|{'-' * 8}|{'-' * 24}|{'-' * 24}|{'-' * 11}|"]
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
    parser = argparse.ArgumentParser(prog="python -m codemod.verify_run",
                                     description="Run the copies `perfmod verify --keep FOLDER` prepared; compare.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--python")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.epilog = "Arguments after `--` replace the script's arguments recorded when the copies were prepared."
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    options, args = parser.parse_args(argv[:split]), argv[split + 1:]
    try:
        result = run_prepared(options.folder, steps=options.steps, warmup=options.warmup, args=args or None,
                              python=options.python, seed=options.seed, deterministic=options.deterministic,
                              timeout=options.timeout)
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

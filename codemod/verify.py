"""`perfmod verify`: run a training script before and after its rewrite, compare.

How it works:

1. The script and the local modules it imports (resolved from its import
   statements, relative to the script's folder, recursively) are rewritten
   through the engine at the chosen level, in memory: nothing beside the
   script is written.
2. Both versions are instrumented the same way (codemod/instrument.py): a
   `runtime.trace` header at the top, hooks on the loss of every backward(),
   the first optimizer step and the first model input of each training loop.
3. Each version runs in its own temporary folder, a mirror of the script's
   folder: the Python files above are copies; every other entry is a symbolic
   link to the original, so data files read relative to the script or to the
   working directory are found. The working directory is that folder, so files
   a run creates stay in it (a run writing *into* a linked folder writes into
   the original). The two runs go one after the other, the original first, with
   the script's interpreter (`python`, default `sys.executable`), the same
   arguments and the same environment plus PYTHONHASHSEED (0 unless set),
   PYTHONDONTWRITEBYTECODE=1 and the tracer's settings. `runtime.trace.install()`
   seeds `random`, torch and numpy with `seed` before the script's code runs.
   Each run stops cleanly after `steps` optimizer steps.
4. The losses are compared step by step against a tolerance that depends on the
   highest level of the fixes applied (not of `--level`):
   - safe: exact, every loss bit for bit equal (rtol = atol = 0);
   - numeric: |rewritten - original| <= atol + rtol * |original| with
     rtol = DEFAULT_RTOL (1e-2) and atol = 0. On the fixtures, bf16 autocast
     (PM301) moved the loss of a small LM by at most 2.5e-3 relative over 20
     steps, fp16 far less; 1e-2 leaves four times headroom while a changed
     learning rate or loss scale (1e-1 and more) still fails.
   - unsafe: as numeric; a disagreement notes that unsafe fixes (sample
     order, worker processes) may change losses legitimately: review the diff.
   `rtol` and `atol` override the defaults at any level.

Nondeterministic kernels (on CUDA: atomics in index_add, scatter, some
backward passes) make two runs of the same script differ; with
`deterministic=True` both runs call `torch.use_deterministic_algorithms(True)`
(and set CUBLAS_WORKSPACE_CONFIG), which makes "exact" meaningful on a GPU at
some cost in speed, paid by both runs.

The loss reads and the timing are described in runtime/trace.py: losses are
read back after the run; CUDA is synchronised only at both ends of the timed
window (the steps after `warmup`), so the measurement adds no per-step sync.

Results (`VerifyResult.as_json()`, `perfmod verify --format json`), schema 1:

    {"schema": 1,
     "script": str, "args": [str], "level": "safe"|"numeric"|"unsafe" (--level),
     "applied_level": str (highest level among the applied fixes; "safe" if none),
     "steps": int, "warmup": int, "seed": int, "device": str, "torch": str,
     "fixes": [{"path": str (relative to the script's folder), "line": int,
                "code": str, "level": str, "message": str}],
     "original" / "rewritten": {
        "steps_per_s": float|null, "samples_per_s": float|null, "tokens_per_s": float|null,
        "peak_memory_bytes": int, "peak_memory_kind": "cuda"|"rss",
        "losses": [float|null],   (one per backward(); null for NaN or inf)
        "elapsed_s": float|null, "returncode": int, "sites": {"loss": int, "stepped": int, "batch": int}},
     "speedup": float|null (rewritten steps/s over original steps/s),
     "max_abs_deviation": float|null, "max_rel_deviation": float|null,
     "worst_step": int|null (1-based index into losses),
     "tolerance": {"level": str, "rtol": float, "atol": float, "exact": bool},
     "agree": bool|null (null when a run failed),
     "notes": [str],
     "error": null | {"run": "original"|"rewritten"|null, "message": str, "stderr": str}}

`exit_code`: 0 the losses agree, 1 they do not, 2 a run failed (or verify
could not start one: no training loop, a file perfmod cannot parse).
"""

from __future__ import annotations

import ast
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from codemod.config import ConfigError, Settings, load_settings
from codemod.engine import process_source
from codemod.instrument import Instrumented, instrument
from codemod.rule import Level, Rule

SCHEMA = 1
DEFAULT_RTOL = 1e-2
EXIT_AGREE, EXIT_DISAGREE, EXIT_FAILED = 0, 1, 2
STDERR_TAIL = 4000  # characters of a failed run's stderr that are kept
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # holds `codemod` and `runtime`
UNSAFE_NOTE = ("unsafe fixes were applied: they may change losses legitimately (sample order, worker "
               "processes, checkpoint timing); review the diff before trusting or dismissing the difference")


class VerifyError(Exception):
    """verify could not run: the message says why and what to do (exit status 2)."""


@dataclass(frozen=True)
class Tolerance:
    level: Level
    rtol: float
    atol: float

    @classmethod
    def for_level(cls, level: Level, rtol: float | None = None, atol: float | None = None) -> "Tolerance":
        default = 0.0 if level is Level.SAFE else DEFAULT_RTOL
        return cls(level, default if rtol is None else rtol, 0.0 if atol is None else atol)

    @property
    def exact(self) -> bool:
        return self.rtol == 0 and self.atol == 0

    def as_json(self) -> dict:
        return {"level": self.level.label, "rtol": self.rtol, "atol": self.atol, "exact": self.exact}


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
    level: Level
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
            "level": self.level.label,
            "applied_level": self.tolerance.level.label,
            "steps": self.steps,
            "warmup": self.warmup,
            "seed": self.seed,
            "device": first.trace.get("device") if first else None,
            "torch": first.trace.get("torch") if first else None,
            "fixes": self.fixes,
            "original": self.original.as_json() if self.original else None,
            "rewritten": self.rewritten.as_json() if self.rewritten else None,
            "speedup": self.speedup,
            "max_abs_deviation": comparison["max_abs_deviation"],
            "max_rel_deviation": comparison["max_rel_deviation"],
            "worst_step": comparison["worst_step"],
            "tolerance": self.tolerance.as_json(),
            "agree": self.agree,
            "notes": self.notes,
            "error": self.error,
        }


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
        if deviation > max_abs or (worst is None and deviation > 0):
            worst = index
        max_abs, max_rel = max(max_abs, deviation), max(max_rel, relative)
    return {"agree": agree, "max_abs_deviation": max_abs, "max_rel_deviation": max_rel, "worst_step": worst}


# -- the run -----------------------------------------------------------------------------


def verify(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    steps: int = 20,
    warmup: int = 2,
    level: Level | None = None,
    settings: Settings | None = None,
    rules: Sequence[type[Rule]] | None = None,
    python: str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    deterministic: bool = False,
    timeout: float | None = 900.0,
    env: Mapping[str, str] | None = None,
    keep: str | Path | None = None,
) -> VerifyResult:
    """Rewrite, instrument, run both versions and compare; see the module docstring.

    `rules` replaces the catalogue (tests inject rules that break the math);
    `keep` names a folder to leave the instrumented copies in instead of a
    temporary one. Raises VerifyError when nothing could be run.
    """
    script = Path(script).resolve()
    if not script.is_file():
        raise VerifyError(f"{script}: no such file")
    if not 1 <= warmup < steps:
        raise VerifyError(f"--warmup {warmup} with --steps {steps}: need 1 <= warmup < steps, so that some "
                          "steps are timed after the first (which pays for start-up)")
    settings = _settings(script, settings, level)
    folder = script.parent
    files = [script, *local_modules(script)]
    originals, rewrites, fixes = {}, {}, []
    for path in files:
        relative = path.relative_to(folder)
        data = path.read_bytes()
        result = process_source(data, str(path), settings, rules)
        if result.error is not None:
            raise VerifyError(result.error)
        originals[relative], rewrites[relative] = data.decode(), result.new_source.decode()
        fixes += [{"path": relative.as_posix(), "line": f.line, "code": f.code, "level": f.level.label,
                   "message": f.message} for f in result.findings if f.applied]
    applied = max((Level.parse(f["level"]) for f in fixes), default=Level.SAFE)
    tolerance = Tolerance.for_level(applied, rtol, atol)
    result = VerifyResult(str(script), list(args), settings.level, steps, warmup, seed, fixes, tolerance)
    if not fixes:
        result.notes.append(f"no fix applies at level {settings.level.label}: the rewrite is the original")
    if applied is Level.UNSAFE:
        result.notes.append(UNSAFE_NOTE)

    instrumented = {
        "original": {path: instrument(text, str(folder / path), settings) for path, text in originals.items()},
        "rewritten": {path: instrument(text, str(folder / path), settings) for path, text in rewrites.items()},
    }
    sites = {run: _total_sites(copies) for run, copies in instrumented.items()}
    if sites["original"]["stepped"] == 0:
        names = ", ".join(str(path) for path in originals)
        raise VerifyError(
            f"no training loop found in {names}: verify instruments a for/while loop that calls "
            "<loss>.backward() and <optimizer>.step() (or scaler.step(optimizer)) in the script or in a module "
            "of its folder that it imports. Point verify at the script that runs that loop.")
    if sites["original"] != sites["rewritten"]:
        result.notes.append(f"the rewrite was instrumented at other places than the original ({sites['rewritten']} "
                            f"vs {sites['original']}): compare with care")

    base = Path(keep) if keep is not None else Path(tempfile.mkdtemp(prefix="perfmod-verify-"))
    try:
        for run in ("original", "rewritten"):
            run_folder = base / run
            _mirror(folder, run_folder, instrumented[run])
            returncode, trace, stderr = _run(run_folder / script.name, list(args), run_folder, python, steps,
                                             warmup, seed, deterministic, timeout, env)
            failure = _failure(returncode, trace, steps, stderr)
            if trace is not None:
                setattr(result, run, RunResult(returncode, trace, sites[run]))
            if failure is not None:
                result.error = {"run": run, "message": failure, "stderr": stderr[-STDERR_TAIL:]}
                break
    finally:
        if keep is None:
            shutil.rmtree(base, ignore_errors=True)
    if result.agree is False and applied is Level.UNSAFE:
        result.notes.append("the losses differ; with unsafe fixes that may be expected (see above)")
    return result


def _settings(script: Path, settings: Settings | None, level: Level | None) -> Settings:
    if settings is None:
        try:
            settings = load_settings(script, None)
        except ConfigError as error:
            raise VerifyError(str(error)) from None
    return settings.with_overrides(level=level)


def _total_sites(copies: Mapping[Path, Instrumented]) -> dict[str, int]:
    total = {"loss": 0, "stepped": 0, "batch": 0}
    for copy in copies.values():
        for key, count in copy.sites.items():
            total[key] += count
    return total


def _run(script: Path, args: list[str], cwd: Path, python: str | None, steps: int, warmup: int, seed: int,
         deterministic: bool, timeout: float | None, env: Mapping[str, str] | None) -> tuple[int, dict | None, str]:
    """Run one instrumented copy; (exit status, its trace or None, its stderr)."""
    out = cwd / ".perfmod-trace.json"
    environment = dict(os.environ if env is None else env)
    environment.setdefault("PYTHONHASHSEED", "0")
    environment["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ in the linked folders
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (environment.get("PYTHONPATH"), str(PACKAGE_ROOT)) if p)
    environment.update({"PERFMOD_TRACE_OUT": str(out), "PERFMOD_TRACE_STEPS": str(steps),
                        "PERFMOD_TRACE_WARMUP": str(warmup), "PERFMOD_TRACE_SEED": str(seed)})
    command = [python or sys.executable]
    if deterministic:
        environment.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        environment["PERFMOD_TRACE_DETERMINISTIC"] = "1"
    command += [str(script), *args]
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


def _failure(returncode: int, trace: dict | None, steps: int, stderr: str) -> str | None:
    if returncode != 0:
        return f"the script failed (exit status {returncode})"
    if trace is None:
        return "the script ended without a trace (did it run the training loop in this process?)"
    if not trace["completed"]:
        return (f"the script ended after {trace['steps']} of {steps} optimizer steps: lower --steps or pass "
                "arguments that train longer")
    return None


# -- the copies ----------------------------------------------------------------------------


def _mirror(source: Path, target: Path, copies: Mapping[Path, Instrumented]) -> None:
    """`target` as a mirror of the folder `source`: the instrumented copies as files,
    every other entry a symbolic link to the original. Folders holding a copy are
    made for real, their other entries linked in turn."""
    target.mkdir(parents=True, exist_ok=True)
    for relative, copy in copies.items():
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).write_text(copy.source)
    real_folders = {parent for relative in copies for parent in relative.parents}
    for folder in sorted(real_folders):
        for entry in (source / folder).iterdir():
            relative = entry.relative_to(source)
            if relative in copies or relative in real_folders or entry.name == "__pycache__":
                continue
            (target / relative).symlink_to(entry, target_is_directory=entry.is_dir())


def local_modules(script: Path) -> list[Path]:
    """The .py files in the script's folder that it imports, directly or through
    each other (packages' `__init__.py` included), in the order found."""
    root = script.parent
    found: list[Path] = []
    pending = [script]
    seen = {script}
    while pending:
        path = pending.pop(0)
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue  # the engine reports it
        for name in _imported_names(tree, path, root):
            for candidate in _module_files(root, name):
                if candidate not in seen:
                    seen.add(candidate)
                    found.append(candidate)
                    pending.append(candidate)
    return found


def _imported_names(tree: ast.AST, path: Path, root: Path) -> list[str]:
    """Dotted module names an import statement may load: `from a import b` may load `a.b`."""
    names = []
    package = path.parent.relative_to(root).parts  # () for a file at the top of the folder
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 > len(package):
                    continue
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                module = node.module or ""
            if module:
                names.append(module)
            names += [f"{module}.{alias.name}" if module else alias.name for alias in node.names if alias.name != "*"]
    return names


def _module_files(root: Path, name: str) -> list[Path]:
    """Files under `root` that importing `name` runs: each package's __init__.py, then the module."""
    files = []
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:depth])
        if (base / "__init__.py").is_file():
            files.append(base / "__init__.py")
        elif base.with_suffix(".py").is_file() and depth == len(parts):
            files.append(base.with_suffix(".py"))
        elif not base.is_dir():
            break
    return files


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
    lines.append(f"tolerance ({tolerance.level.label}): {rule}")
    lines += [f"note: {note}" for note in result.notes]
    if result.error is not None:
        lines += ["", f"FAILED: {result.error['run']} run: {result.error['message']}"]
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

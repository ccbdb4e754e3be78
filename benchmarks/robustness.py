"""Robustness over real code: run the engine (all rules, level `unsafe`, in
memory, never writing) over every .py file of the installed torch package and
check each file:

- no crash: an engine error is fine only where Python's own `compile` rejects
  the file too; an internal error, or a parse error on valid Python, is a failure;
- the rewrite compiles;
- every line the rewrite changes lies in the lines of an applied finding's fix;
- no fix is left for another run, and a second run over the rewrite changes
  nothing and has nothing left to fix.

    python -m benchmarks.robustness                       # all of torch, 2 jobs
    python -m benchmarks.robustness --sample 150 --seed 0

Prints a summary (files, changed, errors by kind, seconds, the slowest files)
and exits 1 on any failure. torch is located with importlib, never imported.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from codemod.config import Settings
from codemod.engine import process_source
from codemod.report.diff import unattributed_changes
from codemod.result import FileResult
from codemod.rule import Level
from codemod.rules import ALL_RULES

SETTINGS = Settings(level=Level.UNSAFE)
PROGRESS_EVERY = 100  # files between progress lines on stderr
SLOWEST_SHOWN = 5

# Outcome kinds: the first two are fine, the others are failures.
CLEAN = "processed"
REJECTED_BY_BOTH = "unparsable, and Python rejects it too"
INTERNAL_ERROR = "internal error"
VALID_PYTHON_REJECTED = "engine error on code Python compiles"
REWRITE_DOES_NOT_COMPILE = "rewrite does not compile"
CHANGE_OUTSIDE_FIXES = "a change outside every finding's fix"
LEFT_FOR_ANOTHER_RUN = "a fix left for another run"
SECOND_RUN_ERROR = "second run errors"
SECOND_RUN_CHANGES = "second run changes the rewrite"
FINE = (CLEAN, REJECTED_BY_BOTH)


@dataclass(frozen=True)
class Outcome:
    path: str
    kind: str
    changed: bool = False
    detail: str = ""
    seconds: float = 0.0  # CPU time of the check

    @property
    def failed(self) -> bool:
        return self.kind not in FINE


def compile_error(source: bytes, path: str) -> str | None:
    """Why Python refuses to compile `source`, or None when it compiles."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences and the like
        try:
            compile(source, path, "exec")
        except (SyntaxError, ValueError) as error:
            return f"{type(error).__name__}: {error}"
    return None


def check_source(source: bytes, path: str, settings: Settings = SETTINGS) -> Outcome:
    return check_result(process_source(source, path, settings), source, path, settings)


def check_result(first: FileResult, source: bytes, path: str, settings: Settings = SETTINGS) -> Outcome:
    """The outcome of `first`, the engine's result for `source` with `settings`."""
    if first.error is not None:
        if "internal error" in first.error:
            return Outcome(path, INTERNAL_ERROR, detail=first.error)
        if compile_error(source, path) is None:
            return Outcome(path, VALID_PYTHON_REJECTED, detail=first.error)
        return Outcome(path, REJECTED_BY_BOTH, detail=first.error)
    postponed = [f"{f.code}:{f.line}" for f in first.findings if "run perfmod again" in f.message]
    if postponed:
        return Outcome(path, LEFT_FOR_ANOTHER_RUN, changed=first.changed, detail=", ".join(postponed))
    if not first.changed:
        # process_source depends on its inputs alone: a second run over the same bytes is this run.
        return Outcome(path, CLEAN)
    why = compile_error(first.new_source, path)
    if why is not None:
        return Outcome(path, REWRITE_DOES_NOT_COMPILE, changed=True, detail=why)
    stray = unattributed_changes(first)
    if stray:
        return Outcome(path, CHANGE_OUTSIDE_FIXES, changed=True, detail="; ".join(stray))
    second = process_source(first.new_source, path, settings)
    if second.error is not None:
        return Outcome(path, SECOND_RUN_ERROR, changed=True, detail=second.error)
    if second.changed or second.pending:
        codes = sorted({f.code for f in second.pending})
        return Outcome(path, SECOND_RUN_CHANGES, changed=True, detail=f"pending after the rewrite: {codes}")
    return Outcome(path, CLEAN, changed=True)


def check_file(path: Path) -> Outcome:
    start = time.process_time()
    outcome = check_source(path.read_bytes(), str(path))
    return replace(outcome, seconds=time.process_time() - start)


def check_files(paths: Sequence[Path], jobs: int) -> Iterator[Outcome]:
    """Outcomes in the order of `paths`, each as soon as it and those before it are done."""
    if jobs <= 1:
        yield from map(check_file, paths)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(check_file, paths)


def torch_files() -> list[Path]:
    """Every .py file of the installed torch package, sorted by path."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed in this environment")
    return sorted(path for folder in spec.submodule_search_locations for path in Path(folder).rglob("*.py"))


def select(files: Sequence[Path], sample: int | None, seed: int, max_bytes: int | None) -> list[Path]:
    """A reproducible subset: files up to `max_bytes`, then `sample` of them drawn with `seed`."""
    chosen = [path for path in files if max_bytes is None or path.stat().st_size <= max_bytes]
    if sample is not None and sample < len(chosen):
        chosen = sorted(random.Random(seed).sample(chosen, sample))
    return chosen


def summary(outcomes: Sequence[Outcome], seconds: float) -> str:
    kinds = Counter(outcome.kind for outcome in outcomes)
    lines = [
        f"rules: {' '.join(rule.CODE for rule in ALL_RULES)} (level {SETTINGS.level.label})",
        f"files: {len(outcomes)}",
        f"changed: {sum(outcome.changed for outcome in outcomes)}",
        "errors by kind:",
    ]
    lines += [
        f"  {kind}: {kinds[kind]}"
        for kind in (
            REJECTED_BY_BOTH,
            INTERNAL_ERROR,
            VALID_PYTHON_REJECTED,
            REWRITE_DOES_NOT_COMPILE,
            CHANGE_OUTSIDE_FIXES,
            LEFT_FOR_ANOTHER_RUN,
            SECOND_RUN_ERROR,
            SECOND_RUN_CHANGES,
        )
    ]
    lines += [
        f"failures: {sum(outcome.failed for outcome in outcomes)}",
        f"seconds: {seconds:.1f}",
        "slowest files (CPU seconds of their check):",
    ]
    slowest = sorted(outcomes, key=lambda outcome: outcome.seconds, reverse=True)[:SLOWEST_SHOWN]
    lines += [f"  {outcome.seconds:.1f} {outcome.path}" for outcome in slowest]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, help="check this many files drawn at random (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--max-bytes", type=int, help="only files up to this size")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="worker processes")
    args = parser.parse_args(argv)

    paths = select(torch_files(), args.sample, args.seed, args.max_bytes)
    start = time.perf_counter()
    outcomes = []
    for number, outcome in enumerate(check_files(paths, args.jobs), 1):
        outcomes.append(outcome)
        if outcome.kind != CLEAN:
            print(f"{outcome.path}: {outcome.kind}: {outcome.detail}", flush=True)
        if number % PROGRESS_EVERY == 0:
            print(f"checked {number}/{len(paths)} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(summary(outcomes, time.perf_counter() - start))
    return 1 if any(outcome.failed for outcome in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

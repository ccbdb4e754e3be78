"""`perfmod profile` of the seed-style LM, before and after its rewrite: where a step goes.

    python -m benchmarks.profile_seed --device cuda                      # 30 steps, 10 not recorded
    python -m benchmarks.profile_seed --device cpu --steps 3 --warmup 1 -- --samples 16 --batch-size 4

Runs the copies `perfmod verify` prepared of fixtures/scripts/seed_latentwire.py
(fixtures/bench/verify_seed/: the original and its rewrite at level numeric,
instrumented) once each with the profiler on (runtime/profile.py), and prints a
markdown table: per version the step's wall time and its parts (host Python,
torch operators, host-device syncs, data wait, a loader's worker hand-off), on
CUDA the kernel time and the GPU's idle share, and the lines of the script that take the most time.

It needs torch, not libcst: the GPU machine has no libcst, so the findings are
not joined here (`perfmod profile` does that where perfmod is installed); the
categories and lines are what the profiler measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.verify_seed import device_env, parse_with_script_args

ROOT = Path(__file__).resolve().parent.parent
PREPARED = ROOT / "fixtures" / "bench" / "verify_seed"
CATEGORIES = ("python", "ops", "sync", "data", "handoff", "untraced")  # as codemod/profile.py (no libcst here)
PROFILE_FILE = ".perfmod-profile.json"


def summary(measured: dict, trace: dict) -> dict:
    """Per step: wall time, time by category, kernel and idle time (CUDA), and the top lines."""
    steps = max(1, measured.get("steps") or 1)
    per_step = 1e-6 / steps
    categories = dict.fromkeys(CATEGORIES, 0.0)
    lines: dict[str, float] = {}
    for entry in measured["entries"]:
        categories[entry["category"]] = categories.get(entry["category"], 0.0) + entry["ns"] * per_step
        where = ":".join(map(str, entry["stack"][-1])) if entry["stack"] else "(outside the script)"
        lines[where] = lines.get(where, 0.0) + entry["ns"] * per_step
    kernel = sum(k["ns"] for k in measured.get("kernels") or []) * per_step
    idle = measured["gpu_idle_ns"] * per_step if measured.get("gpu_idle_ns") is not None else None
    return {
        "step_ms": measured["window_ns"] * per_step,
        "steps_per_s": trace.get("steps_per_s"),
        "categories": categories,
        "kernel_ms": kernel if idle is not None else None,
        "idle_ms": idle,
        "top": sorted(lines.items(), key=lambda item: -item[1])[:5],
    }


def table(results: dict[str, dict]) -> list[str]:
    runs = list(results)
    lines = [
        "| per step | " + " | ".join(runs) + " |",
        "|---|" + "---:|" * len(runs),
    ]

    def row(label, value):
        lines.append(f"| {label} | " + " | ".join(value(results[run]) for run in runs) + " |")

    row("wall time (ms)", lambda r: f"{r['step_ms']:.2f}")
    row("steps/s, profiler on", lambda r: f"{r['steps_per_s']:.3g}" if r["steps_per_s"] else "-")
    for name in CATEGORIES:
        row(
            f"{name} (ms, share)",
            lambda r, n=name: f"{r['categories'][n]:.2f} ({r['categories'][n] / r['step_ms']:.0%})",
        )
    row("GPU kernels (ms)", lambda r: f"{r['kernel_ms']:.2f}" if r["kernel_ms"] is not None else "-")
    row(
        "GPU idle (ms, share)",
        lambda r: f"{r['idle_ms']:.2f} ({r['idle_ms'] / r['step_ms']:.0%})" if r["idle_ms"] is not None else "-",
    )
    for run in runs:
        top = ", ".join(f"{where} {ms:.2f} ms" for where, ms in results[run]["top"])
        lines.append(f"\n{run}: the lines that take the most time per step: {top}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--prepared", type=Path, default=PREPARED, help="copies prepared by perfmod verify")
    parser.epilog = "Arguments after `--` go to the script."
    argv = list(sys.argv[1:] if argv is None else argv)
    options, script_args = parse_with_script_args(parser, argv)

    import torch

    from codemod.verify_run import MANIFEST, RUNS, run_copy

    chosen = device_env(options.device)
    if chosen is None:
        print("error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    env, device = chosen
    scratch = Path(tempfile.mkdtemp(prefix="perfmod-profile-bench-"))
    folder = scratch / "prepared"
    results, failed = {}, []
    try:
        shutil.copytree(options.prepared, folder, symlinks=True)  # the runs write into their folders
        entry = json.loads((folder / MANIFEST).read_text())["entry"]
        for run in RUNS:
            out = folder / run / PROFILE_FILE
            run_env = dict(env, PERFMOD_PROFILE_OUT=str(out), PERFMOD_PROFILE_FILES=entry)
            _, trace, stderr, failure = run_copy(
                folder, run, steps=options.steps, warmup=options.warmup, args=script_args, env=run_env
            )
            measured = json.loads(out.read_text()) if out.exists() else {"error": "no profile written"}
            if failure or measured.get("error"):
                failed.append(f"{run}: {failure or measured['error']}\n{stderr[-2000:]}")
                continue
            results[run] = summary(measured, trace or {})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"Device: {device}; torch {torch.__version__}; date {datetime.date.today().isoformat()}")
    print(f"Command: `python -m benchmarks.profile_seed {shlex.join(argv)}`")
    print(
        f"Script: `{entry}` {shlex.join(script_args)}; {options.steps} steps, the first {options.warmup} not recorded\n"
    )
    if results:
        print("\n".join(table(results)))
    for message in failed:
        print(f"error: {message}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

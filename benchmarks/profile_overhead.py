"""What `perfmod profile` costs: a script's steps/s with the profiler on and off.

    python -m benchmarks.profile_overhead SCRIPT STEPS WARMUP [--rounds N] -- ARGS

Prepares the script as `perfmod profile` does (codemod/verify.py), then runs
its copy N times each way (3 by default), alternating, with one torch thread:
plain (runtime/trace.py only) and profiled (runtime/profile.py on). Prints each
run's steps/s over the timed steps (after WARMUP) and the ratio of the medians,
plain over profiled: 1.5 or less is the goal (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", type=Path)
    parser.add_argument("steps", type=int)
    parser.add_argument("warmup", type=int)
    parser.add_argument("--rounds", type=int, default=3)
    options, args = parser.parse_args(argv[:split]), argv[split + 1 :]

    from codemod.verify import prepare, script_settings
    from codemod.verify_run import run_copy

    script = options.script.resolve()
    folder = Path(tempfile.mkdtemp(prefix="perfmod-profile-overhead-"))
    rates: dict[str, list[float]] = {"plain": [], "profiled": []}
    try:
        prepare(script, folder, args, settings=script_settings(script, None), rewritten=script, tool="profile")
        base = {**os.environ, "OMP_NUM_THREADS": "1"}
        for number in range(options.rounds):
            kinds = ("plain", "profiled") if number % 2 == 0 else ("profiled", "plain")
            for kind in kinds:
                env = dict(base)
                if kind == "profiled":
                    env["PERFMOD_PROFILE_OUT"] = str(folder / "profile.json")
                    env["PERFMOD_PROFILE_FILES"] = script.name
                _, trace, stderr, failure = run_copy(
                    folder, "original", steps=options.steps, warmup=options.warmup, env=env
                )
                if failure is not None:
                    print(f"error: {failure}\n{stderr[-2000:]}", file=sys.stderr)
                    return 1
                rates[kind].append(trace["steps_per_s"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    plain, profiled = statistics.median(rates["plain"]), statistics.median(rates["profiled"])
    each = {kind: ", ".join(f"{rate:.3g}" for rate in values) for kind, values in rates.items()}
    print(
        f"{script.name}: steps/s plain {each['plain']}; profiled {each['profiled']}; "
        f"plain/profiled (medians) {plain / profiled:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

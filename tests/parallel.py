"""Run the suite in several pytest processes at once, as `make test` does (one per core
of a 2-core machine): every process collects the whole suite, then goes through it in
order and runs each test it is the first to claim (a module whose tests share a module-
or class-scoped fixture is claimed whole, so that fixture is set up once), so each test
runs once, and a process that finishes early takes the next one. The first process
prints as it goes; the others' output follows when they end. Each process, and what it
starts, gets its share of the cores as torch's thread count (OMP_NUM_THREADS). With
`--cov`, the processes' coverage is combined into one report. The tests that
tests/durations.json says would end after the others are claimed earlier;
`--record-durations` rewrites that file from this run (`make durations`).

    python -m tests.parallel [-n PROCESSES] [--record-durations] [PYTEST_ARGS...]

Exit status: 0 when every process passed, else the first failing process's status.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# How many pytest processes share the suite, in each one's environment (tests/conftest.py
# spreads the long tests over the run by it).
PROCESSES_VARIABLE = "PERFMOD_TEST_PROCESSES"
DURATIONS = REPO / "tests" / "durations.json"
# Units shorter than this are left out of the file: their order hardly changes when the run ends.
LISTED_SECONDS = 1.0


def pytest_command(claims: Path, work: Path, k: int, pytest_args: list[str]) -> list[str]:
    # `--claims=DIR` in one word: pytest reads its options before it loads tests/conftest.py,
    # which defines this one, and would take a DIR on its own for a path of tests.
    command = [sys.executable, "-m", "pytest", f"--claims={claims}", f"--basetemp={work / f'tmp{k}'}"]
    if any(arg.startswith("--cov") for arg in pytest_args):
        command.append("--cov-report=")  # one combined report at the end, not one per process
    return command + pytest_args


def record_durations(folder: Path) -> None:
    """Write the seconds of the units the processes recorded in `folder` into
    tests/durations.json: a unit run now replaces its entry, kept when it took at least
    LISTED_SECONDS; the units not run (a run of part of the suite) keep theirs. Sorted by
    name, so its diffs read."""
    run: dict[str, float] = {}
    for part in folder.glob("*.json"):
        run.update(json.loads(part.read_text()))
    kept = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    seconds = {key: value for key, value in kept.items() if key not in run}
    seconds.update((key, round(value, 1)) for key, value in run.items() if value >= LISTED_SECONDS)
    DURATIONS.write_text(json.dumps(dict(sorted(seconds.items())), indent=0) + "\n")
    print(f"wrote {DURATIONS.relative_to(REPO)}: {len(seconds)} units of at least {LISTED_SECONDS:.0f} s", flush=True)


def combined_coverage(work: Path, processes: int) -> int:
    """Combine the processes' coverage data and print its report; the report's status."""
    files = [str(work / f".coverage.{k}") for k in range(processes) if (work / f".coverage.{k}").exists()]
    if not files:
        return 0
    data = str(work / ".coverage")
    env = dict(os.environ, COVERAGE_FILE=data)
    subprocess.run([sys.executable, "-m", "coverage", "combine", "-q", *files], cwd=REPO, env=env, check=False)
    return subprocess.run([sys.executable, "-m", "coverage", "report"], cwd=REPO, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # every other option is pytest's
    )
    parser.add_argument(
        "-n", "--processes", type=int, default=2, help="pytest processes to run at once (default: %(default)s)"
    )
    parser.add_argument(
        "--record-durations",
        action="store_true",
        help="rewrite tests/durations.json from this run: what the longer units take",
    )
    args, pytest_args = parser.parse_known_args(argv)
    processes = max(1, args.processes)
    # The cores shared out: torch's thread pools in several processes on the same cores spin
    # against each other (a tiny model's twelve steps on a busy 2-core machine took 15 s of CPU
    # with two threads, 6 s with one). An OMP_NUM_THREADS already set wins.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // processes)
    work = Path(tempfile.mkdtemp(prefix="perfmod-tests-"))
    claims = work / "claims"
    claims.mkdir()
    durations = work / "durations"
    durations.mkdir()
    if args.record_durations:
        pytest_args = [f"--record-durations={durations}", *pytest_args]
    running: list[tuple[subprocess.Popen, Path | None]] = []
    try:
        for k in range(processes):
            # unbuffered: the first process's progress shows as it goes, also when written to a file
            env = dict(os.environ, COVERAGE_FILE=str(work / f".coverage.{k}"), PYTHONUNBUFFERED="1")
            env[PROCESSES_VARIABLE] = str(processes)
            env.setdefault("OMP_NUM_THREADS", str(threads))
            log = None if k == 0 else work / f"process{k}.log"
            command = pytest_command(claims, work, k, pytest_args)
            if log is None:
                running.append((subprocess.Popen(command, cwd=REPO, env=env), None))
                continue
            with log.open("w") as output:  # the child holds its own copy
                running.append((subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=output), log))
        statuses = [process.wait() for process, _ in running]
        for k, (_, log) in enumerate(running[1:], start=1):
            print(f"\n==== tests run in process {k + 1} of {processes} (exit status {statuses[k]}) ====", flush=True)
            sys.stdout.write(log.read_text())
        report = combined_coverage(work, processes)
        if args.record_durations and all(status == 0 for status in statuses):
            record_durations(durations)
    except KeyboardInterrupt:
        for process, _ in running:
            process.terminate()
        return 2
    finally:
        for process, _ in running:
            process.wait()
        shutil.rmtree(work, ignore_errors=True)
    failed = [status for status in statuses if status != 0]
    print(
        f"\n{processes} pytest processes: "
        + ("all passed" if not failed else f"{len(failed)} failed (statuses {statuses})"),
        flush=True,
    )
    return failed[0] if failed else report


if __name__ == "__main__":
    sys.exit(main())

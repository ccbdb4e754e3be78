"""Tool speed: files per second of `perfmod check` (all rules) and of TorchFix
over the same files of the installed torch package, with 1 and 2 jobs.

    python -m benchmarks.tool_speed                  # 300 files, -j 1 and -j 2, 2 rounds
    python -m benchmarks.tool_speed --files 1500 --rounds 1

TorchFix pins an older libcst, so it lives in its own virtual environment,
.venv-torchfix, which this script creates on first use (`pip install torchfix`;
TorchFix does not need torch). Both tools are timed as the command a user runs,
start-up included: wall time, and the CPU time of the whole process tree (the
fairer comparison on a shared machine). Each configuration runs `--rounds`
times, interleaved with the others, and the fastest round is reported.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.robustness import torch_files

REPO = Path(__file__).resolve().parents[1]
TORCHFIX_VENV = REPO / ".venv-torchfix"
PERFMOD = Path(sys.executable).parent / "perfmod"
TORCHFIX = TORCHFIX_VENV / "bin" / "torchfix"
# Exit statuses that mean the tool ran through: perfmod check exits 1 when fixes are pending.
RAN_THROUGH = {"perfmod": {0, 1}, "torchfix": {0}}


@dataclass(frozen=True)
class Timing:
    tool: str
    jobs: int
    files: int
    wall: float
    cpu: float  # user + system seconds of the tool and all its worker processes
    returncode: int

    @property
    def files_per_second(self) -> float:
        return self.files / self.wall

    @property
    def files_per_cpu_second(self) -> float:
        return self.files / self.cpu


def ensure_torchfix() -> None:
    if TORCHFIX.exists():
        return
    subprocess.run([sys.executable, "-m", "venv", str(TORCHFIX_VENV)], check=True)
    subprocess.run([str(TORCHFIX_VENV / "bin" / "python"), "-m", "pip", "install", "-q", "torchfix"], check=True)


def tool_version(python: Path, package: str) -> str:
    command = [str(python), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def command_for(tool: str, jobs: int, files: Sequence[Path]) -> list[str]:
    paths = [str(path) for path in files]
    if tool == "perfmod":
        # --no-cache: every round does the work (a warm cache would answer from disk). PM: every
        # rule but the opt-in ones, what `--select ALL` meant when BENCHMARKS.md's numbers were taken
        return [str(PERFMOD), "check", "-j", str(jobs), "--select", "PM", "--level", "unsafe", "--no-cache", *paths]
    return [str(TORCHFIX), "-j", str(jobs), "--select", "ALL", *paths]


def measure(tool: str, jobs: int, files: Sequence[Path]) -> Timing:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.run(
        command_for(tool, jobs, files), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if process.returncode not in RAN_THROUGH[tool]:
        sys.stderr.write(f"{tool} -j {jobs} exited with {process.returncode}:\n{process.stderr[-2000:]}\n")
    return Timing(tool, jobs, len(files), wall, cpu, process.returncode)


def spread(files: Sequence[Path], count: int) -> list[Path]:
    """`count` files taken at even steps through the sorted list, so the subset spans the package."""
    if count >= len(files):
        return list(files)
    return [files[i * len(files) // count] for i in range(count)]


def perfmod_revision() -> str:
    """The commit perfmod runs from, and whether codemod/ differs from it."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "codemod"], cwd=REPO, capture_output=True, text=True).stdout
    return f"{commit or 'unknown'}{' with uncommitted changes in codemod/' if dirty else ''}"


def cpu_model() -> str:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    match = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    return match.group(1).strip() if match else platform.processor()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300, help="files spread evenly over the torch package")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    ensure_torchfix()
    files = spread(torch_files(), args.files)
    print(f"machine: {os.cpu_count()} cores, {cpu_model()}; load average {os.getloadavg()[0]:.2f} at start")
    print(f"perfmod at {perfmod_revision()}")
    print(
        f"python {platform.python_version()}; libcst {tool_version(Path(sys.executable), 'libcst')} (perfmod); "
        f"torchfix {tool_version(TORCHFIX_VENV / 'bin' / 'python', 'torchfix')} with libcst "
        f"{tool_version(TORCHFIX_VENV / 'bin' / 'python', 'libcst')}"
    )
    print(
        f"files: {len(files)} ({sum(path.stat().st_size for path in files)} bytes) from {files[0].parents[0]}; "
        f"{sum(b'torch' in path.read_bytes() for path in files)} name torch (TorchFix parses only those)"
    )
    print("commands:")
    for jobs in args.jobs:
        for tool in ("perfmod", "torchfix"):
            print("  " + " ".join(command_for(tool, jobs, [Path("<files>")])))

    best: dict[tuple[str, int], Timing] = {}
    for round_number in range(args.rounds):
        for jobs in args.jobs:
            for tool in ("perfmod", "torchfix"):
                timing = measure(tool, jobs, files)
                print(
                    f"round {round_number + 1}: {tool} -j {jobs}: wall {timing.wall:.1f} s, cpu {timing.cpu:.1f} s, "
                    f"exit {timing.returncode}",
                    flush=True,
                )
                key = (tool, jobs)
                if key not in best or timing.wall < best[key].wall:
                    best[key] = timing
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    print("| tool | jobs | files | wall s | files/s | cpu s | files per cpu-s |")
    print("|---|---|---|---|---|---|---|")
    for (tool, jobs), timing in sorted(best.items()):
        print(
            f"| {tool} | {jobs} | {timing.files} | {timing.wall:.1f} | {timing.files_per_second:.2f} | "
            f"{timing.cpu:.1f} | {timing.files_per_cpu_second:.2f} |"
        )
    failed = [t for t in best.values() if t.returncode not in RAN_THROUGH[t.tool]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

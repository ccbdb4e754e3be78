"""How long perfmod takes to start, as ratios measured side by side in one run.

    python -m benchmarks.startup                  # 15 rounds
    python -m benchmarks.startup --rounds 30 --markdown

Whole processes, wall time as a pre-commit hook pays it, and CPU time (user +
system of the process and its children), which other work on a shared machine
moves less:

  import click     `python -c "import click"`: the floor of any click CLI
  --version        `perfmod --version`
  --help           `perfmod --help`
  check --help     `perfmod check --help`
  warm check       `perfmod check train.py`, its result already in the cache
  bare parse       `python -c "import libcst; libcst.parse_module(<train.py>)"`
  cold check       `perfmod check --no-cache train.py`

train.py is a training file of about 2,000 lines built from the fixtures'
training code (benchmarks.engine_speed.training_file), in a folder with a
pyproject.toml that has a [tool.perfmod] table, as a project's has. Each command runs once
untimed (bytecode, the cache entry), then every round runs each
command once, in an order rotated from round to round, so that a machine that
slows down favours none. A ratio is taken within each round (command /
reference of the same round) and reported as the median with the lowest and
highest round (the CPU ratio: the median of the rounds'); the goals (issue 24)
are judged on the median wall ratio:

  --version, --help, check --help  within 3x `import click`
  warm check                       within 1.5x `import click`
  cold check                       within 2x a bare libcst parse (whole processes)

With --baseline COMMIT, the perfmod commands of that commit (a temporary git
worktree of this repository) run in the same rounds, beside this checkout's, and
each ratio of this checkout is given against the baseline's too; both then run as
`python -c "from codemod.entry import main; main()"` from their own tree.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from benchmarks.engine_speed import REPO, training_file

PERFMOD = Path(sys.executable).parent / "perfmod"
PARSE = "import sys, libcst; libcst.parse_module(open(sys.argv[1], 'rb').read())"


@dataclass(frozen=True)
class Command:
    label: str
    argv: tuple[str, ...]
    reference: str | None  # label of the command its ratio is taken against
    goal: float | None  # the ratio it should stay within


# perfmod from the tree in argv[1], as the console script runs it.
FROM_TREE = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'perfmod'; from codemod.entry import main; main()"
)


def _perfmod(tree: Path | None) -> tuple[str, ...]:
    """The command that runs perfmod: from `tree`, or as installed."""
    if tree is not None:
        return (sys.executable, "-c", FROM_TREE, str(tree))
    return (str(PERFMOD),) if PERFMOD.exists() else (sys.executable, "-c", "from codemod.entry import main; main()")


def commands(train: Path, cache: Path, baseline: Path | None = None) -> list[Command]:
    """The commands of one round; with `baseline` (a tree of another commit), its perfmod
    commands too, labelled with the tree's name, and both checkouts run from their tree."""
    trees: dict[str, Path | None] = {"": None} if baseline is None else {"": REPO, f" ({baseline.name})": baseline}
    listed = [Command("import click", (sys.executable, "-c", "import click"), None, None)]
    for suffix, tree in trees.items():
        perfmod = _perfmod(tree)
        listed += [
            Command(f"perfmod --version{suffix}", (*perfmod, "--version"), "import click", 3.0),
            Command(f"perfmod --help{suffix}", (*perfmod, "--help"), "import click", 3.0),
            Command(f"perfmod check --help{suffix}", (*perfmod, "check", "--help"), "import click", 3.0),
            Command(
                f"warm check{suffix}",  # a cache of its own: the entries of one checkout are misses for the other
                (*perfmod, "check", str(train), "--cache-dir", str(cache) + suffix.strip(" ()")),
                "import click",
                1.5,
            ),
        ]
    listed.append(Command("bare libcst parse", (sys.executable, "-c", PARSE, str(train)), None, None))
    for suffix, tree in trees.items():
        listed.append(
            Command(
                f"cold check{suffix}", (*_perfmod(tree), "check", str(train), "--no-cache"), "bare libcst parse", 2.0
            )
        )
    return listed


def environment() -> dict[str, str]:
    """This environment without coverage's subprocess hooks (they measure themselves)."""
    skip = ("COV_CORE", "PYTHONDONTWRITEBYTECODE", "PERFMOD_CACHE_DIR")
    return {key: value for key, value in os.environ.items() if not key.startswith(skip)}


def timed(argv: tuple[str, ...], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, of the process and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):  # check exits 1 when fixes are pending
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode(errors='replace')}")
    return seconds, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def measure(
    rounds: int, lines: int, folder: Path, baseline: Path | None = None
) -> tuple[list[Command], dict[str, list[float]], dict[str, list[float]], int]:
    """The commands, and per command its wall seconds and CPU seconds of each round."""
    train = training_file(lines, folder)
    (folder / "pyproject.toml").write_text('[project]\nname = "bench"\n\n[tool.perfmod]\nlevel = "safe"\n')
    count = train.read_text(encoding="utf-8").count("\n")
    cache = folder / "cache"
    env = environment()
    listed = commands(train, cache, baseline)
    for command in listed:  # untimed: bytecode, the cache entry
        timed(command.argv, folder, env)
    seconds: dict[str, list[float]] = {command.label: [] for command in listed}
    cpu: dict[str, list[float]] = {command.label: [] for command in listed}
    for number in range(rounds):
        shift = number % len(listed)
        for command in listed[shift:] + listed[:shift]:
            wall, used = timed(command.argv, folder, env)
            seconds[command.label].append(wall)
            cpu[command.label].append(used)
    return listed, seconds, cpu, count


def table(listed: list[Command], seconds: dict[str, list[float]], cpu: dict[str, list[float]]) -> list[str]:
    """Wall time (what a user waits; the goal is judged on it) and CPU time (user + system:
    less moved by other work on a shared machine), each ratio taken within a round."""
    rows = [
        "| command | wall median (ms) | wall ratio: median of rounds | min-max | CPU median (ms) | CPU ratio "
        "| goal | met (wall) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for command in listed:
        own, used = seconds[command.label], cpu[command.label]
        cells = [command.label, f"{statistics.median(own) * 1000:.0f}"]
        if command.reference is None:
            cells += ["reference", "", f"{statistics.median(used) * 1000:.0f}", "reference", "", ""]
        else:
            ratios = [a / b for a, b in zip(own, seconds[command.reference])]
            cpu_ratios = [a / b for a, b in zip(used, cpu[command.reference]) if b > 0]
            median = statistics.median(ratios)
            cells += [
                f"{median:.2f}x {command.reference}",
                f"{min(ratios):.2f}-{max(ratios):.2f}",
                f"{statistics.median(used) * 1000:.0f}",
                f"{statistics.median(cpu_ratios):.2f}x" if cpu_ratios else "-",
                f"<= {command.goal}x",
                "yes" if median <= command.goal else "no",
            ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> str:
    from importlib.metadata import version

    return f"Python {platform.python_version()}, click {version('click')}, libcst {version('libcst')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds of every command (default 15)")
    parser.add_argument("--lines", type=int, default=2_000, help="lines of the training file (default 2000)")
    parser.add_argument("--markdown", action="store_true", help="print the BENCHMARKS.md section's header too")
    parser.add_argument("--baseline", help="a commit whose perfmod commands run in the same rounds")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="perfmod-startup-"))
    baseline = folder / args.baseline if args.baseline else None
    try:
        if baseline is not None:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "--detach", str(baseline), args.baseline],
                check=True,
                capture_output=True,
            )
        load = os.getloadavg()[0]
        listed, seconds, cpu, count = measure(args.rounds, args.lines, folder, baseline)
        end_load = os.getloadavg()[0]
    finally:
        if baseline is not None:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)], capture_output=True
            )
        shutil.rmtree(folder, ignore_errors=True)
    if args.markdown:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        print(f"- Date: {date.today().isoformat()}. Machine: {os.cpu_count()} cores ({cpu_model()}), load average")
        print(f"  {load:.2f} at the start, {end_load:.2f} at the end. {versions()}.")
        print(f"- perfmod at {revision}; training file of {count:,} lines; {args.rounds} rounds.")
        baseline_option = f" --baseline {args.baseline}" if args.baseline else ""
        print(f"- Command: `python -m benchmarks.startup --rounds {args.rounds}{baseline_option}`.")
        print()
    else:
        print(f"{versions()}; {count:,}-line training file; {args.rounds} rounds; load {load:.2f} -> {end_load:.2f}")
    print("\n".join(table(listed, seconds, cpu)))
    if baseline is not None:
        print(f"\nThis checkout against {args.baseline}, each ratio taken within a round (median, lowest-highest):\n")
        print("| command | wall | min-max | CPU |")
        print("|---|---|---|---|")
        for command in listed:
            theirs = f"{command.label} ({baseline.name})"
            if theirs in seconds:
                wall = [a / b for a, b in zip(seconds[command.label], seconds[theirs])]
                used = [a / b for a, b in zip(cpu[command.label], cpu[theirs]) if b > 0]
                print(
                    f"| {command.label} | {statistics.median(wall):.2f}x | {min(wall):.2f}-{max(wall):.2f} "
                    f"| {statistics.median(used):.2f}x |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How long perfmod takes to start, as ratios measured side by side in one run.

    python -m benchmarks.startup                  # 15 rounds
    python -m benchmarks.startup --rounds 30 --markdown

Whole processes, wall time, as a pre-commit hook pays them:

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
untimed (bytecode, the cache, the catalogue memo), then every round runs each
command once, in an order rotated from round to round, so that a machine that
slows down favours none. A ratio is taken within each round (command /
reference of the same round) and reported as the median with the lowest and
highest round; the goals (issue 24) are judged on the median:

  --version, --help, check --help  within 3x `import click`
  warm check                       within 1.5x `import click`
  cold check                       within 2x a bare libcst parse (whole processes)
"""

from __future__ import annotations

import argparse
import os
import platform
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


def commands(train: Path, cache: Path) -> list[Command]:
    perfmod = (str(PERFMOD),) if PERFMOD.exists() else (sys.executable, "-c", "from codemod.entry import main; main()")
    return [
        Command("import click", (sys.executable, "-c", "import click"), None, None),
        Command("perfmod --version", (*perfmod, "--version"), "import click", 3.0),
        Command("perfmod --help", (*perfmod, "--help"), "import click", 3.0),
        Command("perfmod check --help", (*perfmod, "check", "--help"), "import click", 3.0),
        Command("warm check", (*perfmod, "check", str(train), "--cache-dir", str(cache)), "import click", 1.5),
        Command("bare libcst parse", (sys.executable, "-c", PARSE, str(train)), None, None),
        Command("cold check", (*perfmod, "check", str(train), "--no-cache"), "bare libcst parse", 2.0),
    ]


def environment() -> dict[str, str]:
    """This environment without coverage's subprocess hooks (they measure themselves)."""
    skip = ("COV_CORE", "PYTHONDONTWRITEBYTECODE", "PERFMOD_CACHE_DIR")
    return {key: value for key, value in os.environ.items() if not key.startswith(skip)}


def timed(argv: tuple[str, ...], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):  # check exits 1 when fixes are pending
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode(errors='replace')}")
    return seconds


def measure(rounds: int, lines: int, folder: Path) -> tuple[list[Command], dict[str, list[float]], int]:
    train = training_file(lines, folder)
    (folder / "pyproject.toml").write_text('[project]\nname = "bench"\n\n[tool.perfmod]\nlevel = "safe"\n')
    count = train.read_text(encoding="utf-8").count("\n")
    cache = folder / "cache"
    env = environment()
    listed = commands(train, cache)
    for command in listed:  # untimed: bytecode, the cache entry, the catalogue memo
        timed(command.argv, folder, env)
    seconds: dict[str, list[float]] = {command.label: [] for command in listed}
    for number in range(rounds):
        shift = number % len(listed)
        for command in listed[shift:] + listed[:shift]:
            seconds[command.label].append(timed(command.argv, folder, env))
    return listed, seconds, count


def table(listed: list[Command], seconds: dict[str, list[float]]) -> list[str]:
    rows = [
        "| command | median (ms) | min-max (ms) | ratio (median of rounds) | ratio min-max | goal | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for command in listed:
        own = seconds[command.label]
        cells = [command.label, f"{statistics.median(own) * 1000:.0f}", f"{min(own) * 1000:.0f}-{max(own) * 1000:.0f}"]
        if command.reference is None:
            cells += ["reference", "", "", ""]
        else:
            ratios = [a / b for a, b in zip(own, seconds[command.reference])]
            median = statistics.median(ratios)
            cells += [
                f"{median:.2f}x {command.reference}",
                f"{min(ratios):.2f}-{max(ratios):.2f}",
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
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="perfmod-startup-"))
    try:
        load = os.getloadavg()[0]
        listed, seconds, count = measure(args.rounds, args.lines, folder)
        end_load = os.getloadavg()[0]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.markdown:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        print(f"- Date: {date.today().isoformat()}. Machine: {os.cpu_count()} cores ({cpu_model()}), load average")
        print(f"  {load:.2f} at the start, {end_load:.2f} at the end. {versions()}.")
        print(f"- perfmod at {revision}; training file of {count:,} lines; {args.rounds} rounds.")
        print(f"- Command: `python -m benchmarks.startup --rounds {args.rounds}`.")
        print()
    else:
        print(f"{versions()}; {count:,}-line training file; {args.rounds} rounds; load {load:.2f} -> {end_load:.2f}")
    print("\n".join(table(listed, seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How fast the whole catalogue runs, and how its cost grows with file size.

    python -m benchmarks.engine_speed                      # this checkout
    python -m benchmarks.engine_speed --baseline af55e8e   # and an older commit, side by side

1. `perfmod check --level unsafe` on the bundled seed script, as a user runs it
   (a fresh process: start-up included; the script copied to a folder of its own);
   the fastest of --repeats runs, CPU and wall time, the checkouts alternating.
2. Training files of about 2,000, 10,000 and 50,000 lines, built from the
   training code under fixtures/ (rule fixture inputs and scripts, in turn, until
   the size is reached), laid out at module level or each piece in a function of
   its own, processed in a fresh process with every rule at level unsafe as `check`
   processes a file (one round of the rules; a checkout from before `check` ran one
   round processes it as `apply` did then), or with --apply as `apply` does
   (rounds until the file stops changing): CPU seconds of the process
   (fastest of --repeats runs; one run once a run takes over 30 s), seconds
   per 10,000 lines (constant when the cost is linear), and the same file's bare
   `libcst.parse_module` timed in the same process after it (CPU seconds, the
   collector on, as any caller has it), with the ratio of the two (the engine's
   cost in parses: constant when the engine grows as the parser does). CPU time,
   not wall time: the machine these run on is shared, and other work stretches
   wall time more than it does a process's CPU time.
3. What libcst itself costs on the same files, as multiples of a bare parse (the
   floor under any libcst tool's cost): a parse and one visit that does nothing,
   a parse and libcst's ScopeProvider, a parse and its PositionProvider.
4. A warm-cache re-run: `perfmod check` over 500 unchanged files (copies of the
   fixtures' training code), once to fill the result cache, then timed.

Child processes may write bytecode (as an installed package has it) and run
once before they are timed; the seed check runs with `--no-cache` where the
checkout has a cache.

With --baseline, the same runs use a checkout of that commit (a temporary git
worktree of this repository), in the same session, so the ratio is measured
side by side.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "fixtures" / "scripts" / "seed_latentwire.py"
SIZES = (2_000, 10_000, 50_000)
LAYOUTS = ("module level", "functions")  # how the pieces of a large file are laid out (training_file)

# Run in a child process against a checkout: process one file (argv[2]: "check" or
# "apply"), print CPU seconds, those of a bare parse, the findings and any error.
TIME_FILE = """
import dataclasses, sys, time
from pathlib import Path
import libcst
from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Level
data = Path(sys.argv[1]).read_bytes()
settings = Settings(level=Level.UNSAFE)
named = hasattr(Settings, "_fields")  # a named tuple now, a dataclass in older checkouts
fields = Settings._fields if named else [f.name for f in dataclasses.fields(Settings)]
if sys.argv[2] == "check" and "fixed_point" in fields:
    settings = settings._replace(fixed_point=False) if named else dataclasses.replace(settings, fixed_point=False)
start = time.process_time()
result = process_source(data, sys.argv[1], settings)
seconds = time.process_time() - start
start = time.process_time()
libcst.parse_module(data)
print(seconds, time.process_time() - start, len(result.findings), result.error or "")
"""

# Run in a child process: what libcst's own passes cost on one file (argv[1]), as
# CPU seconds, the fastest of argv[2] runs each.
TIME_FLOOR = """
import sys, time
import libcst
from libcst.metadata import MetadataWrapper, PositionProvider, ScopeProvider
data = open(sys.argv[1], "rb").read()
def best(work):
    times = []
    for _ in range(int(sys.argv[2])):
        start = time.process_time()
        work()
        times.append(time.process_time() - start)
    return min(times)
print(
    best(lambda: libcst.parse_module(data)),
    best(lambda: libcst.parse_module(data).visit(libcst.CSTVisitor())),
    best(lambda: MetadataWrapper(libcst.parse_module(data)).resolve(ScopeProvider)),
    best(lambda: MetadataWrapper(libcst.parse_module(data)).resolve(PositionProvider)),
)
"""

FLOOR_PASSES = ("parse + no-op visit", "parse + ScopeProvider", "parse + PositionProvider")


def libcst_floor(python: str, path: Path, repeats: int) -> tuple[float, ...]:
    """CPU seconds of a bare parse of `path`, then of each of FLOOR_PASSES."""
    done = subprocess.run(
        [python, "-c", TIME_FLOOR, str(path), str(repeats)], capture_output=True, text=True, check=True
    )
    return tuple(float(part) for part in done.stdout.split())


def training_file(lines: int, folder: Path, in_functions: bool = False) -> Path:
    """A file of at least `lines` lines of training code from fixtures/. Pieces follow
    one another at module level (so each rebinds the module-level names of the ones
    before it: `model`, `loader`, ... bound hundreds of times in one scope), or, with
    `in_functions`, each in a function of its own, as a large file is organised."""
    pieces = sorted((REPO / "fixtures" / "rules").rglob("*.in.py")) + sorted(
        (REPO / "fixtures" / "scripts").glob("*.py")
    )
    texts = [p.read_text(encoding="utf-8") for p in pieces]
    out, count, index = [], 0, 0
    while count < lines:
        text = texts[index % len(texts)]
        text = text if text.endswith("\n") else text + "\n"
        if in_functions:
            text = _as_function(text, f"part_{index}")
        out.append(text)
        count += text.count("\n")
        index += 1
    path = folder / f"train_{lines}{'_functions' if in_functions else ''}.py"
    path.write_text("".join(out), encoding="utf-8")
    return path


def _as_function(text: str, name: str) -> str:
    """`text` as the body of `def name():` (without its `from __future__` imports, which
    only a module's first statements may hold)."""
    body = [line for line in text.splitlines() if not line.startswith("from __future__ import")]
    indented = ["    " + line if line.strip() else "" for line in body]
    return f"def {name}():\n" + "\n".join(indented) + "\n    pass\n\n\n"


def child_env(checkout: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(checkout)}


def perfmod(python: str, *args: str) -> list[str]:
    return [python, "-c", "from codemod.cli import main; main()", *args]


def check_seconds(checkouts: dict[str, Path], python: str, repeats: int) -> dict[str, tuple[float, float]]:
    """(CPU, wall) seconds of `perfmod check --level unsafe` on the seed script for each
    checkout, the fastest of `repeats` runs each, the checkouts alternating run by run
    (after one untimed run of each that writes its bytecode). CPU time is the child's
    user + system time, which other work on the machine moves less than wall time. The
    script is checked from a folder of its own, as a user's script is: inside this
    repository, the `runtime` its fixes import would be read as a module of the
    script's project."""
    best = {name: (float("inf"), float("inf")) for name in checkouts}
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / SEED.name
        shutil.copyfile(SEED, script)
        for attempt in range(repeats + 1):
            for name, checkout in checkouts.items():
                no_cache = ["--no-cache"] if (checkout / "codemod" / "cache.py").exists() else []
                command = perfmod(python, "check", str(script), "--level", "unsafe", *no_cache)
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.perf_counter()
                subprocess.run(command, cwd=checkout, env=child_env(checkout), capture_output=True)
                wall = time.perf_counter() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                if attempt:
                    best[name] = (min(best[name][0], cpu), min(best[name][1], wall))
    return best


def warm_cache_seconds(checkout: Path, python: str, folder: Path, count: int = 500) -> tuple[float, float]:
    """`perfmod check` over `count` copies of fixture files: the first run (fills the
    cache) and the second (every file unchanged), wall seconds each."""
    sources = sorted(p for p in (REPO / "fixtures").rglob("*.py") if ".out." not in p.name)
    tree = folder / "warm"
    for index in range(count):
        target = tree / f"package_{index // 50}" / f"module_{index}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sources[index % len(sources)], target)
    command = perfmod(python, "check", str(tree), "--level", "unsafe", "--cache-dir", str(folder / "cache"))
    runs = []
    for _ in range(2):
        start = time.perf_counter()
        subprocess.run(command, cwd=folder, env=child_env(checkout), capture_output=True)
        runs.append(time.perf_counter() - start)
    return runs[0], runs[1]


def file_seconds(
    checkout: Path, python: str, path: Path, repeats: int = 1, command: str = "check"
) -> tuple[float, float, str]:
    """CPU seconds to process `path` in a fresh process as `command` ("check" or
    "apply") processes it, and of a bare parse of it, fastest of `repeats` runs each
    (one run only once a run takes over 30 s)."""
    env = child_env(checkout)
    best, parse, note = float("inf"), float("inf"), ""
    for _ in range(repeats):
        done = subprocess.run(
            [python, "-c", TIME_FILE, str(path), command], cwd=checkout, env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            failed = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
            return float("nan"), float("nan"), failed
        seconds, parsed, findings, error = (done.stdout.strip().split(" ", 3) + ["", ""])[:4]
        best, parse = min(best, float(seconds)), min(parse, float(parsed))
        note = f"{findings} findings" + (f", error: {error}" if error else "")
        if float(seconds) > 30:
            break
    return best, parse, note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="a commit to time side by side (a temporary worktree)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each timing; the fastest counts")
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES), help="lines of the generated files")
    parser.add_argument("--apply", action="store_true", help="time the files as `apply` processes them, not `check`")
    parser.add_argument("--layouts", nargs="*", default=list(LAYOUTS), choices=LAYOUTS, help="layouts of the files")
    parser.add_argument("--no-seed", action="store_true", help="skip the seed script's whole-process check")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-cache re-run")
    args = parser.parse_args(argv)
    python = sys.executable
    checkouts = {"this checkout": REPO}
    scratch = Path(tempfile.mkdtemp(prefix="perfmod-speed-"))
    try:
        if args.baseline:
            tree = scratch / "baseline"
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), args.baseline],
                check=True,
                capture_output=True,
            )
            checkouts[f"commit {args.baseline}"] = tree
        files = [
            (layout, training_file(lines, scratch, layout == "functions"))
            for layout in args.layouts
            for lines in args.sizes
        ]
        command = "apply" if args.apply else "check"
        print(
            f"date {date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f}"
        )
        if not args.no_seed:
            print()
            print("| checkout | `perfmod check --level unsafe` seed script: CPU s (start-up included) | wall s |")
            print("|---|---|---|")
            seed = check_seconds(checkouts, python, args.repeats)
            for name, (cpu, wall) in seed.items():
                print(f"| {name} | {cpu:.2f} | {wall:.2f} |")
            if len(seed) == 2:
                ours, base = seed["this checkout"][0], seed[f"commit {args.baseline}"][0]
                print(f"\nspeed-up on the seed script (CPU): {base / ours:.2f}x")
        print(f"\nFiles processed as `{command}` processes them; CPU seconds.\n")
        print("| checkout | pieces | lines | seconds | seconds per 10,000 lines | bare parse (s) | / parse | result |")
        print("|---|---|---|---|---|---|---|---|")
        # Checkouts alternate, file by file and round by round, so that a change of load
        # during the run weighs on both; the fastest round counts.
        timed: dict[tuple[str, Path], tuple[float, float, str]] = {}
        for _ in range(args.repeats):
            for _, path in files:
                for name, tree in checkouts.items():
                    seconds, parse, note = file_seconds(tree, python, path, command=command)
                    if (name, path) not in timed:
                        timed[name, path] = seconds, parse, note
                    else:
                        best = timed[name, path]
                        timed[name, path] = min(seconds, best[0]), min(parse, best[1]), note
        for name in checkouts:
            for layout, path in files:
                lines = path.read_text(encoding="utf-8").count("\n")
                seconds, parse, note = timed[name, path]
                print(
                    f"| {name} | {layout} | {lines:,} | {seconds:.2f} | {seconds / lines * 10_000:.2f} "
                    f"| {parse:.2f} | {seconds / parse:.1f}x | {note} |"
                )
        print("\nWhat libcst itself costs on the same files (CPU seconds, and as multiples of a bare parse):\n")
        print(f"| pieces | lines | bare parse (s) | {' | '.join(FLOOR_PASSES)} |")
        print(f"|---|---|---|{'---|' * len(FLOOR_PASSES)}")
        for layout, path in files:
            parse, *passes = libcst_floor(python, path, args.repeats)
            lines = path.read_text(encoding="utf-8").count("\n")
            cells = " | ".join(f"{seconds:.2f} ({seconds / parse:.1f}x)" for seconds in passes)
            print(f"| {layout} | {lines:,} | {parse:.2f} | {cells} |")
        if (REPO / "codemod" / "cache.py").exists() and not args.no_warm:
            first, again = warm_cache_seconds(REPO, python, scratch)
            print(
                f"\n`perfmod check` over 500 files (this checkout): {first:.1f} s filling the cache, "
                f"{again:.2f} s re-run with every file unchanged"
            )
    finally:
        if args.baseline:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(scratch / "baseline")],
                capture_output=True,
            )
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Original vs rewritten training script: tokens/s and peak memory, in one run.

Two steps, because the GPU machine has torch but not libcst:

    # here: rewrite with perfmod (needs libcst), keep both copies side by side
    python -m benchmarks.bench_rewrite prepare fixtures/scripts/seed_latentwire.py \\
        --level unsafe --out benchmarks/prepared/seed_latentwire

    # on the GPU machine: run both, alternating, and print a markdown table
    python -m benchmarks.bench_rewrite run benchmarks/prepared/seed_latentwire \\
        --repeats 3 -- --steps 300 --batch-size 64

`run` starts each script in a fresh interpreter through bench_scripts' launcher,
which reads torch's peak memory at exit, so the scripts need no change; the script
itself must print a line `tokens/s <number>` (the fixtures do). Runs alternate
(original, rewrite, original, ...) so that drift in clocks or temperature hits
both alike; the table reports the median of the repeats.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import shutil
import statistics
import sys
from pathlib import Path

from benchmarks.bench_scripts import run_script

ROOT = Path(__file__).resolve().parent.parent


def prepare(script: Path, level: str, out: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from codemod.config import Settings
    from codemod.engine import process_source
    from codemod.rule import Level

    result = process_source(script.read_bytes(), str(script), Settings(level=Level.parse(level)))
    if result.error:
        raise SystemExit(result.error)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(script, out / "original.py")
    (out / "rewritten.py").write_bytes(result.new_source)
    applied = sorted({f.code for f in result.findings if f.applied})
    meta = {"script": str(script), "level": level, "applied": applied}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def run_once(script: Path, args: list[str]) -> tuple[float, int | None]:
    """(tokens/s, peak CUDA bytes or None) of one run in a fresh interpreter, through
    bench_scripts' launcher (it reads torch's peak memory at exit)."""
    result = run_script(script, args, device="cuda", timeout=3600)  # "cuda": CUDA where the machine has it
    if result.error:
        raise SystemExit(f"{script}: {result.error}")
    return result.tokens_per_s, result.peak.get("cuda")


def run(prepared: Path, repeats: int, args: list[str]) -> str:
    import torch

    meta = json.loads((prepared / "meta.json").read_text())
    measured: dict[str, list[tuple[float, int | None]]] = {"original": [], "rewritten": []}
    for _ in range(repeats):
        for name in measured:
            measured[name].append(run_once((prepared / f"{name}.py").resolve(), args))
    rows = {
        name: (statistics.median(t for t, _ in runs), max((p or 0) for _, p in runs)) for name, runs in measured.items()
    }
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    command = "python -m benchmarks.bench_rewrite run " + shlex.join(
        [str(prepared), "--repeats", str(repeats), "--", *args]
    )
    speedup = rows["rewritten"][0] / rows["original"][0]
    lines = [
        f"Device: {device}; torch {torch.__version__}; date {datetime.date.today().isoformat()}",
        f"Script: `{meta['script']}` rewritten at level `{meta['level']}` (rules applied: {', '.join(meta['applied'])})",
        f"Command: `{command}`; median of {repeats} alternating runs",
        "",
        "| version | tokens/s | peak memory (MiB) |",
        "|---|---|---|",
    ]
    for name, (tokens, peak) in rows.items():
        memory = f"{peak / 2**20:.1f}" if peak else "n/a (CPU)"
        lines.append(f"| {name} | {tokens:,.0f} | {memory} |")
    lines.append(f"\nSpeed-up: {speedup:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="rewrite SCRIPT with perfmod next to a copy of the original")
    prep.add_argument("script", type=Path)
    prep.add_argument("--level", default="unsafe")
    prep.add_argument("--out", type=Path, required=True)
    bench = commands.add_parser("run", help="run original and rewrite alternately; print a markdown table")
    bench.add_argument("prepared", type=Path)
    bench.add_argument("--repeats", type=int, default=3)
    argv = sys.argv[1:] if argv is None else argv
    script_args = argv[argv.index("--") + 1 :] if "--" in argv else []  # after --: for both scripts
    options = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if options.command == "prepare":
        print(json.dumps(prepare(options.script, options.level, options.out)))
    else:
        print(run(options.prepared, options.repeats, script_args))


if __name__ == "__main__":
    main()

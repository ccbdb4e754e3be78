"""`perfmod verify` on a seed-style script: original vs rewrite, speed, memory, losses.

    python -m benchmarks.verify_seed --device cuda                     # level numeric, 200 steps
    python -m benchmarks.verify_seed --device cuda --level safe --deterministic
    python -m benchmarks.verify_seed --device cpu --steps 3 --warmup 1 -- --samples 32 --batch-size 4

Prints a markdown table (device, torch version, command, date; steps/s,
samples/s, tokens/s and peak memory of both versions; the losses' largest
deviation against the level's tolerance). One run each of the original and
the rewrite by default (`--rounds 1`, to keep within the GPU time of
benchmarks/bench_gpu.py); `perfmod verify` makes three rounds, and `--rounds 3`
here prints the speed-up's spread as it does.

Preparing the copies needs libcst; running them needs only torch. On a machine
without libcst, prepare here and run there:

    python -m benchmarks.verify_seed --prepare-only benchmarks/prepared/verify_seed --level numeric
    python -m benchmarks.verify_seed --device cuda --prepared benchmarks/prepared/verify_seed

The script's own arguments go after `--`; the default, for a GPU, is
`--batch-size 64 --samples 4096 --save-every 100000` (a bigger batch than the
script's default, and no checkpoint inside the timed steps).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "scripts" / "seed_latentwire.py"
GPU_ARGS = ["--batch-size", "64", "--samples", "4096", "--save-every", "100000"]


def prepare(script: Path, out: Path, level: str, args: list[str]) -> dict:
    sys.path.insert(0, str(ROOT))
    from codemod.rule import Level
    from codemod.verify import prepare as prepare_copies

    return prepare_copies(script, out, args, level=Level.parse(level))


def parse_with_script_args(parser: argparse.ArgumentParser, argv: list[str]):
    """The options before `--` and the script's arguments after it (the seed's GPU
    sizes on CUDA when none are given)."""
    split = argv.index("--") if "--" in argv else len(argv)
    options, script_args = parser.parse_args(argv[:split]), argv[split + 1 :]
    if not script_args and options.device == "cuda":
        script_args = GPU_ARGS
    return options, script_args


def device_env(device: str) -> tuple[dict, str] | None:
    """The environment that makes the script run on `device` and the device's name;
    None for CUDA where torch sees none."""
    import torch

    env = dict(os.environ)
    if device == "cuda":
        if not torch.cuda.is_available():
            return None
        return env, f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    env["CUDA_VISIBLE_DEVICES"] = ""  # the script picks the CPU
    return env, "CPU"


def markdown(result, device: str, command: str) -> str:
    import torch

    from codemod.verify_run import render_text

    data = result.as_json()
    fixes = ", ".join(sorted({f["code"] for f in result.fixes})) or "none"
    lines = [
        f"Device: {device}; torch {torch.__version__}; date {datetime.date.today().isoformat()}",
        f"Command: `{command}`",
        f"Script: `{Path(result.script).name}` {shlex.join(result.args)}; level `{data['level']}` "
        f"(fixes: {fixes}); {result.steps} steps, {result.warmup} warm-up steps not timed",
        "",
    ]
    # verify's own text from the speed table on: the table, the losses, the verdict.
    text = render_text(result).splitlines()
    start = next((i for i, line in enumerate(text) if line.startswith("|")), len(text))
    lines += text[start:]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--script", type=Path, default=SCRIPT)
    parser.add_argument("--level", choices=("safe", "numeric", "unsafe"), default="numeric")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--deterministic", action="store_true", help="deterministic kernels in both runs")
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs of each version, alternating (perfmod verify --rounds)"
    )
    parser.add_argument("--prepared", type=Path, help="run copies prepared earlier (no libcst needed)")
    parser.add_argument("--prepare-only", type=Path, metavar="DIR", help="prepare the copies in DIR and stop")
    parser.epilog = "Arguments after `--` go to the script."
    argv = list(sys.argv[1:] if argv is None else argv)
    options, script_args = parse_with_script_args(parser, argv)
    if options.prepare_only:
        prepare(options.script.resolve(), options.prepare_only, options.level, script_args)
        print(f"prepared in {options.prepare_only}; run with --prepared {options.prepare_only}")
        return 0

    from codemod.verify_run import run_prepared

    chosen = device_env(options.device)
    if chosen is None:
        print("error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    env, device = chosen
    # The runs write into their copies' folders (traces, checkpoints): prepared copies are
    # run from a scratch copy, so that a committed folder stays as it is.
    scratch = Path(tempfile.mkdtemp(prefix="perfmod-verify-bench-"))
    folder = scratch / "prepared"
    try:
        if options.prepared is None:
            prepare(options.script.resolve(), folder, options.level, script_args)
        else:
            shutil.copytree(options.prepared, folder, symlinks=True)
        result = run_prepared(
            folder,
            steps=options.steps,
            warmup=options.warmup,
            args=script_args,
            env=env,
            deterministic=options.deterministic,
            rounds=options.rounds,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    command = "python -m benchmarks.verify_seed " + shlex.join(argv)
    print(markdown(result, device, command), end="")
    if result.error:
        print(
            f"error ({result.error['run'] or 'after the runs'}): {result.error['message']}\n{result.error['stderr']}",
            file=sys.stderr,
        )
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())

"""Every GPU benchmark perfmod owes, in one command and one markdown document.

    make bench-gpu                                   # = python3 -m benchmarks.bench_gpu --device cuda
    python3 -m benchmarks.bench_gpu --device cuda --only acceptance           # one part
    python3 -m benchmarks.bench_gpu --device cuda --only scripts rwkv --budget 480   # parts past the default budget
    make bench-cpu                                   # = python -m benchmarks.bench_gpu --device cpu: small sizes
    python -m benchmarks.bench_gpu --device cpu --quick --budget 120      # dry run: every part starts (tests)

The GPU machine this project is lent is one NVIDIA H200 for 15 minutes in all,
machine start included, one command at most 10 minutes, with torch and triton
but no libcst and no network. So the default budget is 480 s (8 minutes) and
PARTS is in priority order: the acceptance scripts (original, rewrite, expert),
the recurrence kernels against their Python loops, SDPA, the data pipeline,
`perfmod verify` of the seed-style LM, `perfmod profile` of it; then the parts that do not fit the
default budget (scripts, rwkv, batching, optimizer, model, tokenize), which
run with --only or a larger --budget. Each priority part is sized (steps,
sizes, repeats) so that its estimate (Part.estimate, seconds on an H200,
process start-up and torch.compile included) is what it should take there;
together they plan 415 s of the 480.

It runs each part as its own process, one after the other, and prints one
document: a heading with the device (torch.cuda.get_device_name()), torch,
command and date, a table with one row per part (what it shows, its status,
its seconds beside the estimate), then each part's own tables. Nothing it
needs comes from libcst: the rewrites are committed (fixtures/bench/,
fixtures/bench/acceptance/ and verify_seed's prepared copies in
fixtures/bench/verify_seed/), so it does useful work seconds after it starts.

Fail soft: a part that exits with an error, or runs past its time, gets its
row (the status says what happened, the stderr's end follows its heading) and
the next part starts. Time: --budget seconds for the whole run; a part gets at
most its cap and what is left of the budget. On CUDA a part is started only
when its estimate fits in what is left (else "skipped" in its row, and the
next, smaller part may still fit); on the CPU tiers, only when MIN_START
seconds are left. The acceptance and scripts parts get their share as a budget
of their own, so that they stop starting runs and print what they measured.
With the OUT environment variable set (or --output), the document is written
to $OUT/bench_gpu.md after every part, so a run cut short still leaves what it
did.

Sizes: `--device cuda` runs each part at its `cuda` arguments; `--device cpu`
at small sizes, a few minutes in all (`make bench-cpu`); `--quick` at the
smallest (the dry run of tests/test_bench_gpu.py). The estimates are worked
out for an H200 from each part's work (kernel launches of the Python loops,
FLOPs, process start-up, torch.compile time), not measured; the table prints
the measured seconds beside them, and says when the device found is not an
H200 (the estimates are then not its own).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_scripts import run_command

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BUDGET = 480.0  # seconds: one command on the lent H200 (10 minutes at most, 15 minutes of machine in all)
MIN_START = 5.0  # seconds: a part is not started with less of the budget left (CPU tiers)
ESTIMATED_FOR = "H200"  # the device the estimates are worked out for: the one this project is lent
SCRIPTS_MARGIN = 30.0  # seconds the scripts and acceptance parts keep from their share to print the table
OUT_NAME = "bench_gpu.md"
PREPARED = "fixtures/bench/verify_seed"


@dataclass(frozen=True)
class Part:
    name: str
    shows: str  # what its table shows, for the summary row and BENCHMARKS.md
    module: str
    runs: dict[str, list[list[str]]]  # tier (cuda, cpu, quick) -> argument lists, one process each
    estimate: float  # seconds on an H200 (cuda tier), start-up and compiling included
    cap: float  # seconds at most (cuda tier); the cpu and quick tiers get half
    budgeted: bool = False  # takes --budget (bench_scripts' option): stops starting runs in time


PARTS = [
    # -- in priority order, sized to fit DEFAULT_BUDGET on an H200 (375 s of 480 planned) --
    Part(
        "acceptance",
        "the acceptance scripts (fixtures/acceptance/) naive_lm and naive_rwkv: original, perfmod's rewrite "
        "(unsafe) and the expert's version; tokens/s, rewrite/expert (goal >= 0.9x), peak CUDA memory, losses",
        "benchmarks.acceptance",
        {
            # six runs, one of each version: naive_lm at its defaults (30 steps, batch 16 x 128, d 256,
            # 4 layers; ~20 s for the original: 2,000 documents made and tokenized in Python, ~30k kernel
            # launches a step in its per-sample and per-position loops), naive_rwkv 20 steps of 8 x 512
            # (~15 s for the loop over time; its rewrite compiles the chunked scan, ~40 s)
            "cuda": [["--device", "cuda", "--levels", "unsafe", "--repeats", "1", "--timeout", "150"]],
            "cpu": [["--device", "cpu", "--quick"]],
            "quick": [["--device", "cpu", "--quick", "--scripts", "naive_rwkv", "--levels", "unsafe"]],
        },
        120,
        200,
        budgeted=True,
    ),
    Part(
        "recurrence",
        "linear attention (GLA/RWKV) and linear scan, forward + backward in bf16: Python loop vs "
        "runtime.kernels at T = 512/2048/8192 (issue 5's 20x goal at T = 2048). No flash-linear-attention "
        "row: fla is not installed on the lent H200 and cannot be fetched there (no network)",
        "benchmarks.bench_kernels",
        {
            # one warm-up (it compiles: six torch.compile graphs of the chunked scan, ~20 s each, most of
            # the estimate), one timed run of each loop (~1.5 s at T = 8192), ten of each kernel
            "cuda": [
                [
                    *("--device", "cuda", "--ops", "linear_attention", "scan"),
                    *("--warmup", "1", "--reps", "10", "--loop-reps", "1"),
                ]
            ],
            "cpu": [["--device", "cpu", "--quick", "--ops", "linear_attention", "scan"]],
            "quick": [
                ["--device", "cpu", "--quick", "--ops", "linear_attention", "scan", "--reps", "1", "--loop-reps", "1"]
            ],
        },
        130,
        200,
    ),
    Part(
        "sdpa",
        "hand-written softmax(QK^T/sqrt(d))V vs F.scaled_dot_product_attention, causal, forward + backward "
        "in bf16, B 4 x H 8 x d 64 at T = 512/2048/8192",
        "benchmarks.bench_kernels",
        {
            "cuda": [["--device", "cuda", "--ops", "attention", "--warmup", "2", "--reps", "10"]],
            "cpu": [["--device", "cpu", "--quick", "--ops", "attention"]],
            "quick": [["--device", "cpu", "--quick", "--ops", "attention", "--reps", "1"]],
        },
        20,
        60,
    ),
    Part(
        "data",
        "a data-bound loop before/after PM102 + PM201 + PM103: tokens/s, data wait, GPU busy "
        "(with per-item host work, and with none: the copy overlap alone)",
        "benchmarks.bench_data",
        {
            # two runs of each version, 80 steps of 64 x 256 tokens: the original tokenizes ~0.1 s a batch
            # in the training process (~9 s a run), the rewrite in workers (~3 s with their start);
            # with --work 0 about 2 s a run; two processes' start-up
            "cuda": [
                ["--device", "cuda", "--steps", "80", "--repeats", "2"],
                ["--device", "cuda", "--work", "0", "--steps", "80", "--repeats", "2"],
            ],
            "cpu": [
                [
                    "--device",
                    "cpu",
                    "--steps",
                    "8",
                    "--batch-size",
                    "8",
                    "--seq-len",
                    "32",
                    "--work",
                    "2",
                    "--repeats",
                    "1",
                ]
            ],
            "quick": [
                [
                    "--device",
                    "cpu",
                    "--steps",
                    "5",
                    "--batch-size",
                    "2",
                    "--seq-len",
                    "8",
                    "--work",
                    "1",
                    "--repeats",
                    "1",
                ]
            ],
        },
        60,
        120,
    ),
    Part(
        "verify",
        "perfmod verify on the seed script at level numeric: steps/s, tokens/s, peak memory, "
        "loss agreement (the README's verify table)",
        "benchmarks.verify_seed",
        {
            # 200 steps of batch 64 (20 not timed), original and rewrite: ~10 ms a step (launch-bound,
            # a per-position loss loop), the rest two processes' start-up and verify's comparison
            "cuda": [["--device", "cuda", "--prepared", PREPARED]],
            "cpu": [
                [
                    "--device",
                    "cpu",
                    "--prepared",
                    PREPARED,
                    "--steps",
                    "4",
                    "--warmup",
                    "1",
                    "--",
                    "--samples",
                    "64",
                    "--batch-size",
                    "8",
                ]
            ],
            "quick": [
                [
                    "--device",
                    "cpu",
                    "--prepared",
                    PREPARED,
                    "--steps",
                    "2",
                    "--warmup",
                    "1",
                    "--",
                    "--samples",
                    "16",
                    "--batch-size",
                    "4",
                ]
            ],
        },
        45,
        120,
    ),
    Part(
        "profile",
        "perfmod profile of the seed script before and after its rewrite: the step by host Python, torch "
        "operators, syncs and data wait, kernel time and the GPU's idle share, the lines that take the most",
        "benchmarks.profile_seed",
        {
            # 30 steps (10 not recorded) of each version, launch-bound at ~10 ms a step before the
            # rewrite; the profiler's Python tracer and the attribution after the run dominate
            "cuda": [["--device", "cuda"]],
            "cpu": [["--device", "cpu", "--steps", "3", "--warmup", "1", "--", "--samples", "32", "--batch-size", "4"]],
            "quick": [
                ["--device", "cpu", "--steps", "2", "--warmup", "1", "--", "--samples", "8", "--batch-size", "2"]
            ],
        },
        40,
        160,
    ),
    # -- past the default budget: --only or a larger --budget --
    Part(
        "scripts",
        "three seed-style scripts: original, perfmod's rewrite at safe/numeric/unsafe and "
        "hand-optimized; tokens/s, speed-ups, rewrite/hand-optimized (goal >= 0.9x), peak memory, losses",
        "benchmarks.bench_scripts",
        {
            "cuda": [["--device", "cuda", "--levels", "safe", "numeric", "unsafe", "--repeats", "3"]],
            "cpu": [["--device", "cpu", "--quick", "--levels", "safe", "numeric", "unsafe"]],
            "quick": [["--device", "cpu", "--quick", "--scripts", "gpt_seed000"]],
        },
        460,
        570,
        budgeted=True,
    ),
    Part(
        "rwkv",
        "the RWKV-style fixture before/after PM505 (Python time loop vs runtime.kernels.linear_attention), "
        "T = 1024 and T = 2048",
        "benchmarks.bench_rwkv",
        {
            "cuda": [["--device", "cuda"], ["--device", "cuda", "--seq-len", "2048", "--batch", "4"]],
            "cpu": [["--device", "cpu", "--quick"]],
            "quick": [["--device", "cpu", "--quick"]],
        },
        150,
        300,
    ),
    Part(
        "batching",
        "per-sample forward/backward loop vs PM502's batched pass; per-position loss loop vs PM503",
        "benchmarks.bench_batching",
        {
            "cuda": [["--device", "cuda"]],
            "cpu": [["--device", "cpu", "--quick"]],
            "quick": [["--device", "cpu", "--quick"]],
        },
        40,
        180,
    ),
    Part(
        "optimizer",
        "optimizer step of Adam, AdamW and SGD: torch's default vs foreach=True vs PM402's fused=True",
        "benchmarks.optimizer_step",
        {
            "cuda": [["--device", "cuda"]],
            "cpu": [["--device", "cpu", "--steps", "10"]],
            "quick": [["--device", "cpu", "--quick"]],
        },
        20,
        120,
    ),
    Part(
        "model",
        "hooks registered per call vs once, in __init__ (PM501); eager vs PM506's model.compile()",
        "benchmarks.bench_model",
        {
            "cuda": [["--device", "cuda"]],
            "cpu": [
                [
                    "--device",
                    "cpu",
                    "--case",
                    "hook_lm",
                    "--steps",
                    "4",
                    "--warmup",
                    "1",
                    "--repeats",
                    "1",
                    "--batch",
                    "4",
                    "--seq",
                    "32",
                    "--width",
                    "64",
                    "--vocab",
                    "256",
                ]
            ],
            "quick": [
                [
                    "--device",
                    "cpu",
                    "--case",
                    "hook_lm",
                    "--steps",
                    "2",
                    "--warmup",
                    "1",
                    "--repeats",
                    "1",
                    "--batch",
                    "2",
                    "--seq",
                    "8",
                    "--width",
                    "16",
                    "--vocab",
                    "32",
                ]
            ],
        },
        150,
        300,
    ),
    Part(
        "tokenize",
        "tokenizing in the step (seed) vs PM203's hoisted scaffold vs pretokenized; "
        "sliced batches vs PM202's DataLoader, with workers",
        "benchmarks.bench_tokenize",
        {
            "cuda": [["--device", "cuda"]],
            "cpu": [["--device", "cpu", "--quick"]],
            "quick": [["--device", "cpu", "--quick", "--steps", "2"]],
        },
        60,
        180,
    ),
]
PARTS_BY_NAME = {part.name: part for part in PARTS}


@dataclass
class Outcome:
    status: str  # ok, error: ..., timed out ..., skipped: ...
    seconds: float | None
    body: str  # the part's output (and the stderr's end when it failed)


def run_part(part: Part, tier: str, seconds: float, env: dict) -> Outcome:
    """All of a part's commands within `seconds`; stops at the first that fails."""
    start = time.monotonic()
    bodies = []
    for args in part.runs[tier]:
        left = seconds - (time.monotonic() - start)
        if left <= 0:
            return Outcome(
                f"timed out: no time left for `{shlex.join(args)}`", time.monotonic() - start, "\n\n".join(bodies)
            )
        if part.budgeted:  # its own budget: it stops starting runs and prints its table in time
            args = [*args, "--budget", f"{max(left - SCRIPTS_MARGIN, 1):.0f}"]
        argv = [sys.executable, "-m", part.module, *args]
        code, out, err = run_command(argv, left, env, ROOT)
        bodies.append(f"`{shlex.join(['python', '-m', part.module, *args])}`\n\n{demote(out.strip())}")
        if code != 0:
            tail = "\n".join(err.strip().splitlines()[-15:])
            bodies.append(f"stderr (end):\n\n```\n{tail}\n```" if tail else "")
            last = err.strip().splitlines()[-1] if err.strip() else ""
            status = (
                f"timed out after {left:.0f} s"
                if code is None
                else f"error: exit status {code}" + (f": {last}" if last else "")
            )
            return Outcome(status, time.monotonic() - start, "\n\n".join(bodies))
    return Outcome("ok", time.monotonic() - start, "\n\n".join(bodies))


def demote(text: str) -> str:
    """A part's markdown headings one level down, under this document's part headings."""
    return "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines())


def probe(env: dict, device: str) -> dict:
    """torch's version and the device: on CUDA from a child process (this one keeps no CUDA
    context), on the CPU from the installed package's metadata (no torch import)."""
    if device == "cpu":
        from importlib import metadata

        try:
            version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            version = "not installed"
        return {"torch": version, "python": platform.python_version(), "cuda": None, "device": None}
    code = (
        "import json, platform, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__,"
        " 'python': platform.python_version(), 'cuda': torch.version.cuda,"
        " 'device': torch.cuda.get_device_name() if c else None}))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"torch": "not importable", "python": sys.version.split()[0], "cuda": None, "device": None}
    return json.loads(done.stdout)


def document(
    facts: dict,
    device: str,
    command: str,
    budget: float,
    outcomes: dict[str, Outcome],
    tier: str,
    elapsed: float,
    parts: list[Part],
) -> str:
    where = (
        f"{facts['device']} (CUDA {facts['cuda']})"
        if device == "cuda" and facts["device"]
        else "CPU"
        if device == "cpu"
        else "CUDA requested, but torch sees no GPU"
    )
    lines = [
        f"## GPU benchmarks: {where}" if device == "cuda" else f"## Benchmarks on the CPU ({tier} sizes)",
        "",
        f"Device: {where}; torch {facts['torch']}; Python {facts['python']}; "
        f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"Command: `{command}`; budget {budget:.0f} s; {elapsed:.0f} s so far",
        "",
        *estimate_note(facts, device),
        f"| # | part | what it shows | status | seconds | {estimate_header(facts, device)} |",
        "|---|---|---|---|---:|---:|",
    ]
    for number, part in enumerate(parts, 1):
        outcome = outcomes.get(part.name, Outcome("not started yet", None, ""))
        seconds = "-" if outcome.seconds is None else f"{outcome.seconds:.0f}"
        status = outcome.status.replace("|", "\\|")
        lines.append(f"| {number} | {part.name} | {part.shows} | {status} | {seconds} | {part.estimate:.0f} |")
    for number, part in enumerate(parts, 1):
        outcome = outcomes.get(part.name)
        if outcome is None or not outcome.body:
            continue
        lines += ["", f"### {number}. {part.name}", "", outcome.body]
    return "\n".join(lines) + "\n"


def estimate_header(facts: dict, device: str) -> str:
    """The estimate column's heading: the estimates are for an H200, so they are the device's
    own only when the device found (torch.cuda.get_device_name()) is one."""
    found = facts.get("device") or ""
    if device == "cuda" and ESTIMATED_FOR.lower() in found.lower():
        return f"estimate for this {found} (s)"
    return f"{ESTIMATED_FOR} estimate (s)"


def estimate_note(facts: dict, device: str) -> list[str]:
    """A line under the heading when the estimates are not the device's own."""
    found = facts.get("device") or ""
    if device == "cuda" and found and ESTIMATED_FOR.lower() not in found.lower():
        return [f"The estimates are worked out for an {ESTIMATED_FOR}, not for this {found}.", ""]
    if device == "cpu":
        return [f"The estimates are for the GPU sizes on an {ESTIMATED_FOR}, not for these CPU runs.", ""]
    return []


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="the smallest sizes (tests)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="seconds for the whole run")
    parser.add_argument("--only", nargs="+", choices=list(PARTS_BY_NAME), help="run only these parts")
    parser.add_argument("--output", type=Path, help=f"also write the document here (default: $OUT/{OUT_NAME})")
    options = parser.parse_args(argv)
    tier = "quick" if options.quick else options.device
    parts = [part for part in PARTS if not options.only or part.name in options.only]
    output = options.output or (Path(os.environ["OUT"]) / OUT_NAME if os.environ.get("OUT") else None)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if options.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # benchmarks that default to CUDA take the CPU
    command = "python -m benchmarks.bench_gpu " + shlex.join(argv)
    start = time.monotonic()
    facts = probe(env, options.device)
    outcomes: dict[str, Outcome] = {}

    def write() -> str:
        text = document(facts, options.device, command, options.budget, outcomes, tier, time.monotonic() - start, parts)
        if output:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text)
        return text

    for part in parts:
        left = options.budget - (time.monotonic() - start)
        cap = part.cap if tier == "cuda" else part.cap / 2
        if left < MIN_START:
            outcomes[part.name] = Outcome(f"skipped: the budget was spent ({max(left, 0):.0f} s left)", None, "")
        elif tier == "cuda" and left < part.estimate:  # it would not fit: the time goes to the next parts
            outcomes[part.name] = Outcome(
                f"skipped: needs about {part.estimate:.0f} s, {left:.0f} s of the budget left", None, ""
            )
        else:
            print(f"[bench_gpu] {part.name}: up to {min(cap, left):.0f} s", file=sys.stderr, flush=True)
            outcomes[part.name] = run_part(part, tier, min(cap, left), env)
        write()
    print(write(), end="")
    return 0 if all(o.status == "ok" or o.status.startswith("skipped") for o in outcomes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Model rewrites, original vs rewritten: tokens/s and peak memory in one run.

    python -m benchmarks.bench_model --device cuda
    python -m benchmarks.bench_model --device cuda --case hook_lm --width 1024 --steps 200

Each case names a fixture before and after its rewrite (the `.out.py` is what
perfmod writes, checked by tests/rules/test_fixture_pairs.py, so the machine that
runs this needs torch but not libcst) and a function that trains the model the
fixture defines for a number of steps on the device. The two versions run in this
process, alternating (original, rewritten, original, ...) so that clock and
temperature drift hit both, each from the same seed; the table gives the median
tokens/s, the larger peak memory of the repeats (CUDA only), and the final loss of
each version (equal bit for bit for PM501; within rounding for PM506, whose compiled
kernels round differently).

Add a case: append a Case(name, original fixture, rewritten fixture, train) to CASES;
`train(namespace, device, options)` gets the fixture's globals (run as a module,
not as __main__), trains, and returns (tokens in the timed steps, final loss,
seconds those steps took, synchronized).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "rules"


@dataclass(frozen=True)
class Case:
    name: str
    original: Path
    rewritten: Path
    train: Callable[[dict, torch.device, argparse.Namespace], tuple[int, float, float]]
    what: str  # one line for the table: the rewrite measured


def train_hook_lm(namespace: dict, device: torch.device, options: argparse.Namespace) -> tuple[int, float, float]:
    """The hooked LM: its forward registers and removes a hook per block on every call
    (PM501 registers them once, in __init__)."""
    namespace.update(VOCAB=options.vocab, WIDTH=options.width, SEQ=options.seq, BATCH=options.batch)
    torch.manual_seed(0)
    model = namespace["HookedLM"](layers=4).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, options.vocab, (options.batch, options.seq + 1), generator=generator).to(device)

    def step() -> torch.Tensor:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, options.vocab), tokens[:, 1:].reshape(-1))
        loss = loss + 1e-3 * sum(model.captured.values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(options.warmup):
        step()
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(options.steps):
        loss = step()
    _synchronize(device)
    elapsed = time.perf_counter() - start
    return options.steps * options.batch * options.seq, loss.item(), elapsed


def train_char_lm(namespace: dict, device: torch.device, options: argparse.Namespace) -> tuple[int, float, float]:
    """The character LM of PM506's fixture: its own main() trains and times the steps
    after the warm-up, so the rewritten version's compile time is not counted."""
    with contextlib.redirect_stdout(io.StringIO()):
        model, _, elapsed = namespace["main"](
            steps=options.steps,
            warmup=max(options.warmup, 1),
            batch=options.batch,
            seq=options.seq,
            width=options.width,
            vocab=options.vocab,
            device=str(device),
        )
    tokens = torch.randint(0, options.vocab, (options.batch, options.seq), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():  # the final loss of the trained weights, one eager forward
        loss = F.cross_entropy(model(tokens.to(device)).reshape(-1, options.vocab), tokens.to(device).reshape(-1))
    return options.steps * options.batch * options.seq, loss.item(), elapsed


CASES = [
    Case(
        "hook_lm",
        FIXTURES / "PM501" / "register_once.in.py",
        FIXTURES / "PM501" / "register_once.out.py",
        train_hook_lm,
        "PM501: 4 forward hooks registered per call -> registered once, in __init__",
    ),
    Case(
        "char_lm",
        FIXTURES / "PM506" / "train_lm.in.py",
        FIXTURES / "PM506" / "train_lm.out.py",
        train_char_lm,
        "PM506: model.compile() (inductor)",
    ),
]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_version(path: Path, case: Case, device: torch.device, options: argparse.Namespace):
    """(tokens/s, peak bytes or None, final loss) of one version."""
    namespace = {"__name__": f"bench_{case.name}", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    tokens, loss, elapsed = case.train(namespace, device, options)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return tokens / elapsed, peak, loss


def measure(
    case: Case, device: torch.device, options: argparse.Namespace
) -> dict[str, tuple[float, int | None, float]]:
    runs: dict[str, list] = {"original": [], "rewritten": []}
    for _ in range(options.repeats):
        for version, path in (("original", case.original), ("rewritten", case.rewritten)):
            runs[version].append(run_version(path, case, device, options))
    return {
        version: (statistics.median(r[0] for r in results), max((r[1] or 0) for r in results) or None, results[-1][2])
        for version, results in runs.items()
    }


def table(results: dict[str, dict], device: torch.device, argv: list[str]) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    lines = [
        f"Device: {name}; torch {torch.__version__}; date {datetime.date.today().isoformat()}",
        f"Command: `python -m benchmarks.bench_model {shlex.join(argv)}`",
        "",
        "| case | rewrite | version | tokens/s | peak memory (MiB) | speed-up | final loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for case_name, rows in results.items():
        what = next(case.what for case in CASES if case.name == case_name)
        base = rows["original"][0]
        for version, (rate, peak, loss) in rows.items():
            memory = f"{peak / 2**20:.1f}" if peak else "n/a (CPU)"
            lines.append(
                f"| {case_name} | {what} | {version} | {rate:,.0f} | {memory} | {rate / base:.2f}x | {loss!r} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--case", action="append", choices=[case.name for case in CASES], help="run only these cases (default: all)"
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    options = parser.parse_args(argv)
    if options.threads:
        torch.set_num_threads(options.threads)
    device = torch.device(options.device)
    results = {
        case.name: measure(case, device, options) for case in CASES if options.case is None or case.name in options.case
    }
    text = table(results, device, argv)
    print(text)
    return text


if __name__ == "__main__":
    main()

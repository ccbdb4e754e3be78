"""Batched forward (PM502) and vectorized per-position loss (PM503): a seed-style
training step before and after perfmod's rewrite, tokens/s and peak memory.

On the GPU machine, from the repository root (prints a markdown table for BENCHMARKS.md):

    python -m benchmarks.bench_batching --device cuda

CPU smoke run (tests/test_bench_batching.py runs it; CPU numbers are no GPU claim):

    python -m benchmarks.bench_batching --device cpu --quick

Each workload is a small training script (a seed-style causal transformer LM,
`nn.TransformerEncoderLayer` blocks, AdamW, fp32): ORIGINAL_* as a user would
write it, REWRITTEN_* as perfmod rewrites it with that rule alone at
`--level unsafe` (tests/test_bench_batching.py checks that the two stay in
sync, so this file runs where libcst is not installed). PM502's original runs
the model one sequence at a time with a backward per sequence (report 004);
PM503's runs the batch at once but scores the positions in a Python loop (the
LatentWire report's K-token loss, here over every position). Both versions run
in one process, the same seeds and data, one after the other: --warmup steps
untimed, then --steps timed steps (synchronized before and after). The table
gives tokens/s (batch x sequence length per step), the peak CUDA memory of each
run (torch.cuda.max_memory_allocated, reset before it), and the last step's
loss of each, which must agree to float32 rounding.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys

import torch

MODEL = """\
import time

import torch
import torch.nn.functional as F
from torch import nn


class SeedLM(nn.Module):
    def __init__(self, vocab, width, layers, heads, max_len):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        length = tokens.size(1)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        h = self.embed(tokens) + self.position(torch.arange(length, device=tokens.device))
        for block in self.blocks:
            h = block(h, src_mask=mask, is_causal=True)
        return self.head(h)


def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


"""

ORIGINAL_PER_SAMPLE = (
    MODEL
    + """\
def main(device, steps, warmup, batch_size, seq_len, vocab, width, layers, heads):
    torch.manual_seed(0)
    model = SeedLM(vocab, width, layers, heads, seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(vocab, (warmup + steps, batch_size, seq_len + 1), device=device)
    for step in range(warmup + steps):
        if step == warmup:
            synchronize(device)
            start = time.perf_counter()
        inputs, targets = data[step, :, :-1], data[step, :, 1:]
        optimizer.zero_grad()
        running = 0.0
        for i in range(inputs.size(0)):
            logits = model(inputs[i:i + 1])
            loss = F.cross_entropy(logits.view(-1, vocab), targets[i:i + 1].reshape(-1))
            loss.backward()
            running += loss.item()
        optimizer.step()
    synchronize(device)
    return steps * batch_size * seq_len / (time.perf_counter() - start), running
"""
)

REWRITTEN_PER_SAMPLE = (
    MODEL
    + """\
def main(device, steps, warmup, batch_size, seq_len, vocab, width, layers, heads):
    torch.manual_seed(0)
    model = SeedLM(vocab, width, layers, heads, seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(vocab, (warmup + steps, batch_size, seq_len + 1), device=device)
    for step in range(warmup + steps):
        if step == warmup:
            synchronize(device)
            start = time.perf_counter()
        inputs, targets = data[step, :, :-1], data[step, :, 1:]
        optimizer.zero_grad()
        running = 0.0
        logits = model(inputs)
        loss = (
            F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1), reduction="none")
            .view(inputs.size(0), -1)
            .sum(1)
            / (targets.reshape(-1) != -100).view(inputs.size(0), -1).sum(1)
        ).sum()
        loss.backward()
        running += loss.item()
        optimizer.step()
    synchronize(device)
    return steps * batch_size * seq_len / (time.perf_counter() - start), running
"""
)

ORIGINAL_PER_POSITION = (
    MODEL
    + """\
def main(device, steps, warmup, batch_size, seq_len, vocab, width, layers, heads):
    torch.manual_seed(0)
    model = SeedLM(vocab, width, layers, heads, seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(vocab, (warmup + steps, batch_size, seq_len + 1), device=device)
    for step in range(warmup + steps):
        if step == warmup:
            synchronize(device)
            start = time.perf_counter()
        inputs, targets = data[step, :, :-1], data[step, :, 1:]
        optimizer.zero_grad()
        logits = model(inputs)
        loss = 0.0
        for t in range(seq_len):
            loss += F.cross_entropy(logits[:, t], targets[:, t])
        (loss / seq_len).backward()
        optimizer.step()
    synchronize(device)
    return steps * batch_size * seq_len / (time.perf_counter() - start), loss.item()
"""
)

REWRITTEN_PER_POSITION = (
    MODEL
    + """\
def main(device, steps, warmup, batch_size, seq_len, vocab, width, layers, heads):
    torch.manual_seed(0)
    model = SeedLM(vocab, width, layers, heads, seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(vocab, (warmup + steps, batch_size, seq_len + 1), device=device)
    for step in range(warmup + steps):
        if step == warmup:
            synchronize(device)
            start = time.perf_counter()
        inputs, targets = data[step, :, :-1], data[step, :, 1:]
        optimizer.zero_grad()
        logits = model(inputs)
        loss = 0.0
        loss += (
            F.cross_entropy(
                logits[:, :seq_len].flatten(0, 1), targets[:, :seq_len].flatten(0, 1), reduction="none"
            )
            .view_as(targets[:, :seq_len])
            .sum(0)
            / (targets[:, :seq_len] != -100).sum(0)
        ).sum()
        (loss / seq_len).backward()
        optimizer.step()
    synchronize(device)
    return steps * batch_size * seq_len / (time.perf_counter() - start), loss.item()
"""
)

# workload -> (rule, original script, rewritten script)
WORKLOADS = {
    "per-sample forward": ("PM502", ORIGINAL_PER_SAMPLE, REWRITTEN_PER_SAMPLE),
    "per-position loss": ("PM503", ORIGINAL_PER_POSITION, REWRITTEN_PER_POSITION),
}
SIZES = ("batch_size", "seq_len", "vocab", "width", "layers", "heads")
DEFAULTS = {
    "batch_size": 32,
    "seq_len": 256,
    "vocab": 8192,
    "width": 512,
    "layers": 4,
    "heads": 8,
    "steps": 10,
    "warmup": 2,
}
QUICK = {"batch_size": 2, "seq_len": 8, "vocab": 32, "width": 16, "layers": 1, "heads": 2, "steps": 2, "warmup": 1}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a smoke test")
    for name in (*SIZES, "steps", "warmup"):
        parser.add_argument(
            "--" + name.replace("_", "-"), type=int, help=f"default {DEFAULTS[name]} (quick {QUICK[name]})"
        )
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def run_script(source: str, args) -> tuple[float, float, int | None]:
    """(tokens/s, last loss, peak CUDA bytes) of one script's `main`."""
    namespace = {"__name__": "bench_batching_workload"}
    exec(compile(source, "<workload>", "exec"), namespace)
    cuda = torch.device(args.device).type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    tokens_per_s, loss = namespace["main"](args.device, args.steps, args.warmup, **{n: getattr(args, n) for n in SIZES})
    return tokens_per_s, loss, torch.cuda.max_memory_allocated() if cuda else None


def run(args, argv: list[str]) -> str:
    device = torch.cuda.get_device_name(args.device) if torch.device(args.device).type == "cuda" else "CPU"
    command = "python -m benchmarks.bench_batching " + shlex.join(argv)
    sizes = ", ".join(f"{n}={getattr(args, n)}" for n in (*SIZES, "steps", "warmup"))
    lines = [
        f"Device: {device}; torch {torch.__version__}; date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"Command: `{command}`; {sizes}; fp32",
        "",
        "| workload | rule | version | tokens/s | peak memory (MiB) | last loss | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for workload, (rule, original, rewritten) in WORKLOADS.items():
        before = run_script(original, args)
        after = run_script(rewritten, args)
        for version, (tokens, loss, peak) in (("original", before), ("rewritten", after)):
            memory = f"{peak / 2**20:,.1f}" if peak is not None else "n/a (CPU)"
            speedup = f"{tokens / before[0]:.2f}x" if version == "rewritten" else ""
            lines.append(f"| {workload} | {rule} | {version} | {tokens:,.0f} | {memory} | {loss:.6f} | {speedup} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    print(run(parse_args(argv), argv))


if __name__ == "__main__":
    main()

"""A data-bound training loop, as written and as perfmod rewrites it with PM102 + PM201 +
PM103: tokens/s, the share of wall time the loop spends getting its next batch, and
peak memory, both versions in one run.

    python -m benchmarks.bench_data --device cuda
    python -m benchmarks.bench_data --device cuda --steps 300 --work 40 --repeats 3

The loop is seed-style: a map-style dataset whose `__getitem__` does Python work per
token (what decoding and tokenizing a text is to a real dataset) and returns a float
feature block too (a few MB per batch to copy), loaded in the training process, every
batch copied to the GPU at the top of the step, `loss.item()` every step. The
rewrite (REWRITTEN below, checked against perfmod's output by tests/test_bench_data.py)
loads in `default_num_workers()` worker processes, pins the batches, and copies the
next batch on a side stream while the current step runs.

Measured per step (after the script's WARMUP_STEPS): the host time from the end of one step to the
moment its next batch is on the device and ready to use (waiting for the loader plus,
in the original, the blocking copies), and, on CUDA, the GPU time of the step's
forward/backward/optimizer between two CUDA events. data wait = host wait / wall;
GPU busy = GPU step time / wall.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import shlex
import statistics
import sys

ORIGINAL = '''\
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

WARMUP_STEPS = 3  # steps left out of the measurement: CUDA start-up, first worker batches


class SyntheticText(Dataset):
    """Item i: seq_len + 1 token ids made by a Python loop (`work` passes per token, as a
    tokenizer would), and a (seq_len, features) float block from them."""

    def __init__(self, size, seq_len, vocab, features, work):
        self.size, self.seq_len, self.vocab, self.features, self.work = size, seq_len, vocab, features, work

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        ids = [0] * (self.seq_len + 1)
        for _ in range(self.work):
            for k in range(self.seq_len + 1):
                ids[k] = (i * 2654435761 + k * 40503 + ids[k - 1]) % self.vocab
        tokens = torch.tensor(ids)
        block = torch.arange(self.features, dtype=torch.float32) * 1e-3 + tokens[:-1, None].float() / self.vocab
        return tokens[:-1], block, tokens[1:]


class TinyLM(torch.nn.Module):
    def __init__(self, vocab, features, width):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.project = torch.nn.Linear(features, width)
        layer = torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, num_layers=2)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids, block):
        return self.head(self.body(self.embed(ids) + self.project(block)))


def train(device_name, steps, batch_size, seq_len, work, vocab=512, features=64, width=128):
    """Train for `steps` steps; return tokens/s, data wait and GPU busy shares, peak memory."""
    torch.manual_seed(0)
    device = torch.device(device_name)
    dataset = SyntheticText(steps * batch_size, seq_len, vocab, features, work)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    model = TinyLM(vocab, features, width).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    timed = device.type == "cuda"
    waited, busy, losses = 0.0, 0.0, []
    step_done = time.perf_counter()
    for step, (ids, block, targets) in enumerate(loader):
        ids, block, targets = ids.to(device), block.to(device), targets.to(device)
        ready = time.perf_counter()
        if step == WARMUP_STEPS:
            start, waited, busy = step_done, 0.0, 0.0
            if timed:
                torch.cuda.reset_peak_memory_stats(device)
        waited += ready - step_done
        if timed:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        logits = model(ids, block)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if timed:
            end.record()
        losses.append(loss.item())
        if timed:
            busy += begin.elapsed_time(end) / 1e3
        step_done = time.perf_counter()
    wall = step_done - start
    measured = steps - WARMUP_STEPS
    return {
        "tokens/s": measured * batch_size * seq_len / wall,
        "data wait": waited / wall,
        "GPU busy": busy / wall if timed else None,
        "peak MiB": torch.cuda.max_memory_allocated(device) / 2**20 if timed else None,
        "losses": losses,
    }


if __name__ == "__main__":
    print(train("cuda" if torch.cuda.is_available() else "cpu", steps=50, batch_size=32, seq_len=128, work=10))
'''

# perfmod's rewrite of ORIGINAL with PM102, PM201 and PM103 at level unsafe
# (tests/test_bench_data.py checks that it still is).
REWRITTEN = '''\
import time

import torch
import torch.nn.functional as F
from runtime.data import DevicePrefetcher, default_num_workers
from torch.utils.data import DataLoader, Dataset

WARMUP_STEPS = 3  # steps left out of the measurement: CUDA start-up, first worker batches


class SyntheticText(Dataset):
    """Item i: seq_len + 1 token ids made by a Python loop (`work` passes per token, as a
    tokenizer would), and a (seq_len, features) float block from them."""

    def __init__(self, size, seq_len, vocab, features, work):
        self.size, self.seq_len, self.vocab, self.features, self.work = size, seq_len, vocab, features, work

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        ids = [0] * (self.seq_len + 1)
        for _ in range(self.work):
            for k in range(self.seq_len + 1):
                ids[k] = (i * 2654435761 + k * 40503 + ids[k - 1]) % self.vocab
        tokens = torch.tensor(ids)
        block = torch.arange(self.features, dtype=torch.float32) * 1e-3 + tokens[:-1, None].float() / self.vocab
        return tokens[:-1], block, tokens[1:]


class TinyLM(torch.nn.Module):
    def __init__(self, vocab, features, width):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.project = torch.nn.Linear(features, width)
        layer = torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, num_layers=2)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids, block):
        return self.head(self.body(self.embed(ids) + self.project(block)))


def train(device_name, steps, batch_size, seq_len, work, vocab=512, features=64, width=128):
    """Train for `steps` steps; return tokens/s, data wait and GPU busy shares, peak memory."""
    torch.manual_seed(0)
    device = torch.device(device_name)
    dataset = SyntheticText(steps * batch_size, seq_len, vocab, features, work)
    num_workers = default_num_workers()
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        pin_memory=device.type == "cuda",
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )
    model = TinyLM(vocab, features, width).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    timed = device.type == "cuda"
    waited, busy, losses = 0.0, 0.0, []
    step_done = time.perf_counter()
    for step, (ids, block, targets) in enumerate(DevicePrefetcher(loader, device)):
        ready = time.perf_counter()
        if step == WARMUP_STEPS:
            start, waited, busy = step_done, 0.0, 0.0
            if timed:
                torch.cuda.reset_peak_memory_stats(device)
        waited += ready - step_done
        if timed:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        logits = model(ids, block)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if timed:
            end.record()
        losses.append(loss.item())
        if timed:
            busy += begin.elapsed_time(end) / 1e3
        step_done = time.perf_counter()
    wall = step_done - start
    measured = steps - WARMUP_STEPS
    return {
        "tokens/s": measured * batch_size * seq_len / wall,
        "data wait": waited / wall,
        "GPU busy": busy / wall if timed else None,
        "peak MiB": torch.cuda.max_memory_allocated(device) / 2**20 if timed else None,
        "losses": losses,
    }


if __name__ == "__main__":
    print(train("cuda" if torch.cuda.is_available() else "cpu", steps=50, batch_size=32, seq_len=128, work=10))
'''


def script(source: str) -> dict:
    """The names the script defines (its `__main__` block does not run)."""
    namespace = {"__name__": "bench_data_script"}
    exec(compile(source, "<bench_data>", "exec"), namespace)
    return namespace


def run(device: str, steps: int, batch_size: int, seq_len: int, work: int, repeats: int) -> dict[str, list[dict]]:
    """Both versions, alternating (original, rewritten, original, ...) so that drift hits both."""
    versions = {"original": script(ORIGINAL)["train"], "rewritten": script(REWRITTEN)["train"]}
    results: dict[str, list[dict]] = {name: [] for name in versions}
    for _ in range(repeats):
        for name, train in versions.items():
            results[name].append(train(device, steps, batch_size, seq_len, work))
            gc.collect()  # the rewritten loader's persistent workers end with it
    return results


def table(results: dict[str, list[dict]], command: str, device: str) -> str:
    import torch

    name = torch.cuda.get_device_name() if device.startswith("cuda") else "CPU"
    from runtime.data import default_num_workers

    def median(runs, key):
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None

    def share(value):
        return "n/a" if value is None else f"{100 * value:.0f}%"

    lines = [
        f"Device: {name}; torch {torch.__version__}; date {datetime.date.today().isoformat()}; "
        f"rewritten loader workers: {default_num_workers()}",
        f"Command: `{command}`; median of {len(results['original'])} alternating runs",
        "",
        "| version | tokens/s | data wait | GPU busy | peak memory (MiB) |",
        "|---|---|---|---|---|",
    ]
    for version, runs in results.items():
        peak = median(runs, "peak MiB")
        lines.append(
            f"| {version} | {median(runs, 'tokens/s'):,.0f} | {share(median(runs, 'data wait'))} | "
            f"{share(median(runs, 'GPU busy'))} | {'n/a (CPU)' if peak is None else f'{peak:.1f}'} |"
        )
    speedup = median(results["rewritten"], "tokens/s") / median(results["original"], "tokens/s")
    same = all(a["losses"] == b["losses"] for a, b in zip(results["original"], results["rewritten"]))
    lines.append(f"\nSpeed-up: {speedup:.2f}x; losses bit-identical: {'yes' if same else 'no'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--work", type=int, default=20, help="Python passes per token in __getitem__")
    parser.add_argument("--repeats", type=int, default=3)
    argv = sys.argv[1:] if argv is None else argv
    options = parser.parse_args(argv)
    warmup = script(ORIGINAL)["WARMUP_STEPS"]
    if options.steps <= warmup:
        parser.error(f"--steps must be more than the {warmup} warm-up steps")
    results = run(options.device, options.steps, options.batch_size, options.seq_len, options.work, options.repeats)
    print(table(results, "python -m benchmarks.bench_data " + shlex.join(argv), options.device))


if __name__ == "__main__":
    main()

"""Data-bound training steps: tokenizing in the loop (the LatentWire seed) against
what PM203 and PM202 make of it, in one run, as a markdown table.

On the GPU machine, from the repository root (numbers for BENCHMARKS.md):

    python -m benchmarks.bench_tokenize --device cuda
    python -m benchmarks.bench_tokenize --device cuda --batch-size 256 --workers 4

CPU smoke run (tests/rules/test_pm203_bench.py runs it; CPU numbers are no GPU claim):

    python -m benchmarks.bench_tokenize --device cpu --quick

Tokenization (seed-style step: a chat scaffold rebuilt and tokenized every step,
random indices into a list of question texts, the batch tokenized with padding,
every tensor copied with `.to(device)`), three ways:

- "per-step tokenization (seed)": as written;
- "scaffold hoisted (PM203 fix)": the scaffold tokenized once, the batch still per step;
- "pretokenized, DataLoader (PM203 report, by hand)": questions tokenized once
  (runtime.data.PretokenizedDataset), batches padded by PadCollate in --workers
  DataLoader workers, pinned and copied with non_blocking=True on CUDA.

Batching of in-memory tensors (PM202): slices `X[i:i + bs]` against a
DataLoader over TensorDataset, without and with workers (pinned on CUDA).

The tokenizer is fixtures/scripts/toy_transformers' word-level tokenizer (pure
Python, like a "slow" Hugging Face tokenizer; the Rust "fast" ones cost less per
text), or a local Hugging Face tokenizer with --hf-tokenizer PATH where
transformers is installed. The model is a small Transformer encoder (--d-model,
--layers), small enough that the host's work shows. Each step ends with
`loss.item()` (the seed prints it), so step time includes the GPU's work. "host
share" is the time from the start of a step until its batch is on the device,
over the step time. Peak memory is torch.cuda.max_memory_allocated per row.
"""

import argparse
import datetime
import importlib.util
import platform
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, StackDataset, TensorDataset

from runtime.data import PadCollate, PretokenizedDataset

ROOT = Path(__file__).resolve().parent.parent
TOY_TRANSFORMERS = ROOT / "fixtures" / "scripts" / "toy_transformers" / "transformers.py"
SYSTEM = (
    "You are a careful assistant. Read the question, think about the numbers it names, "
    "and answer with the number only, without words, units or punctuation. "
) * 3
WORDS = (
    "what is the sum of and plus minus times apples pears left over after giving away "
    "each basket holds how many in total remain"
).split()
CLASSES = 32


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a few steps: a smoke test")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--steps", type=int, help="timed steps per row (default 200, quick 4)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 20, quick 1)")
    parser.add_argument("--texts", type=int, help="corpus size (default 4096, quick 64)")
    parser.add_argument("--d-model", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers in the rows that use them")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's on CUDA, 1 on the CPU)")
    parser.add_argument("--hf-tokenizer", help="path of a local Hugging Face tokenizer (needs transformers)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.batch_size = args.batch_size or (8 if quick else 64)
    args.steps = args.steps or (4 if quick else 200)
    args.warmup = args.warmup if args.warmup is not None else (1 if quick else 20)
    args.texts = args.texts or (64 if quick else 4096)
    args.d_model = args.d_model or (32 if quick else 256)
    args.layers = args.layers or (1 if quick else 2)
    return args


def load_tokenizer(args):
    if args.hf_tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.hf_tokenizer)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer, "transformers " + args.hf_tokenizer
    spec = importlib.util.spec_from_file_location("toy_transformers", TOY_TRANSFORMERS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AutoTokenizer.from_pretrained("toy"), "toy word-level (pure Python)"


def make_corpus(n, seed=0):
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(16, 48))) + "?" for _ in range(n)]
    return texts, [rng.randrange(CLASSES) for _ in range(n)]


class Reader(nn.Module):
    """[scaffold; question] -> Transformer encoder -> mean over the question -> class."""

    def __init__(self, vocab, d_model, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=4 * d_model, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, scaffold_ids, ids, mask):
        batch = ids.size(0)
        x = torch.cat([self.embed(scaffold_ids).expand(batch, -1, -1), self.embed(ids)], dim=1)
        pad = torch.cat([torch.zeros(batch, scaffold_ids.size(1), dtype=torch.bool, device=ids.device), mask == 0], 1)
        h = self.encoder(x, src_key_padding_mask=pad)[:, scaffold_ids.size(1) :]
        return self.head((h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True))


def scaffold_ids_of(tokenizer, device):
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, return_tensors="pt")["input_ids"].to(device)


def seed_batches(tokenizer, texts, labels, args, device, hoisted):
    """The seed's step: random indices into the texts, tokenized (and the scaffold too) every step."""
    rng = random.Random(1)
    scaffold = scaffold_ids_of(tokenizer, device) if hoisted else None
    while True:
        idx = rng.sample(range(len(texts)), args.batch_size)
        scaffold_ids = scaffold if hoisted else scaffold_ids_of(tokenizer, device)
        encoded = tokenizer([texts[i] for i in idx], padding=True, return_tensors="pt")
        yield (
            scaffold_ids,
            encoded["input_ids"].to(device),
            encoded["attention_mask"].to(device),
            torch.tensor([labels[i] for i in idx]).to(device),
        )


def pretokenized_batches(tokenizer, texts, labels, args, device):
    """Tokenizes the corpus now (the row's setup time), then yields batches."""
    cuda = device.type == "cuda"
    dataset = StackDataset(PretokenizedDataset(texts, tokenizer), torch.tensor(labels))
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        collate_fn=PadCollate.for_tokenizer(tokenizer),
        num_workers=args.workers,
        pin_memory=cuda,
        persistent_workers=args.workers > 0,
    )
    scaffold = scaffold_ids_of(tokenizer, device)

    def batches():
        while True:
            for encoded, target in loader:
                yield (
                    scaffold,
                    encoded["input_ids"].to(device, non_blocking=True),
                    encoded["attention_mask"].to(device, non_blocking=True),
                    target.to(device, non_blocking=True),
                )

    return batches()


def sliced_batches(X, Y, args, device):
    while True:
        for i in range(0, len(X) - args.batch_size + 1, args.batch_size):
            yield X[i : i + args.batch_size].to(device), Y[i : i + args.batch_size].to(device)


def loader_batches(X, Y, args, device, workers):
    cuda = device.type == "cuda"
    loader = DataLoader(
        TensorDataset(X, Y),
        batch_size=args.batch_size,
        shuffle=False,
        drop_last=True,
        num_workers=workers,
        pin_memory=cuda and workers > 0,
        persistent_workers=workers > 0,
    )
    while True:
        for xb, yb in loader:
            yield xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)


def timed(step, batches, args, device, tokens_of):
    """Run warmup + timed steps; (tokens/s, ms/step, host share, peak bytes)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step(next(batches))
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    host, total, tokens = [], [], 0
    for _ in range(args.steps):
        start = time.perf_counter()
        batch = next(batches)
        fetched = time.perf_counter()
        step(batch)  # ends with loss.item(): the GPU's work is in the step time
        end = time.perf_counter()
        host.append(fetched - start)
        total.append(end - start)
        tokens += tokens_of(batch)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return tokens / sum(total), 1e3 * statistics.median(total), sum(host) / sum(total), peak


def tokenization_rows(args, device):
    tokenizer, tokenizer_name = load_tokenizer(args)
    texts, labels = make_corpus(args.texts)
    rows = []
    variants = [
        ("per-step tokenization (seed)", lambda: seed_batches(tokenizer, texts, labels, args, device, hoisted=False)),
        ("scaffold hoisted (PM203 fix)", lambda: seed_batches(tokenizer, texts, labels, args, device, hoisted=True)),
        (
            f"pretokenized, DataLoader {args.workers} workers (PM203 report, by hand)",
            lambda: pretokenized_batches(tokenizer, texts, labels, args, device),
        ),
    ]
    for name, make in variants:
        torch.manual_seed(0)
        model = Reader(tokenizer.vocab_size, args.d_model, args.layers).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(batch):
            scaffold_ids, ids, mask, target = batch
            loss = F.cross_entropy(model(scaffold_ids, ids, mask), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()

        def tokens_of(batch):
            scaffold_ids, ids, mask, _ = batch
            return int(mask.sum()) + scaffold_ids.numel() * ids.size(0)

        start = time.perf_counter()
        batches = make()  # the pretokenized row tokenizes its corpus here, once: reported apart
        setup = time.perf_counter() - start
        result = timed(step, batches, args, device, tokens_of)
        batches.close()
        rows.append(("tokenization", name, *result, setup))
    return rows, tokenizer_name


def batching_rows(args, device):
    torch.manual_seed(0)
    n, width = max(args.texts, 4 * args.batch_size), args.d_model
    X, Y = torch.randn(n, width), torch.randint(0, CLASSES, (n,))
    rows = []
    variants = [
        ("slices X[i:i + bs] (seed)", lambda: sliced_batches(X, Y, args, device)),
        ("DataLoader(TensorDataset) (PM202 fix)", lambda: loader_batches(X, Y, args, device, 0)),
        (
            f"DataLoader, {args.workers} workers{', pinned' if device.type == 'cuda' else ''} (+ PM201/PM102)",
            lambda: loader_batches(X, Y, args, device, args.workers),
        ),
    ]
    for name, make in variants:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, CLASSES)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(batch):
            xb, yb = batch
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()

        batches = make()
        result = timed(step, batches, args, device, lambda batch: batch[0].size(0))
        batches.close()
        rows.append(("batching", name, *result, None))
    return rows


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    threads = args.threads or (1 if device.type == "cpu" else None)
    if threads:  # on the CPU, one thread: the model is small and the machine may be shared
        torch.set_num_threads(threads)
    token_rows, tokenizer_name = tokenization_rows(args, device)
    rows = token_rows + batching_rows(args, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"device: {device.type} ({name}); torch {torch.__version__}; python {platform.python_version()}")
    print(f"command: python -m benchmarks.bench_tokenize {shlex.join(sys.argv[1:] if argv is None else argv)}")
    print(
        f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; tokenizer: {tokenizer_name}; "
        f"batch {args.batch_size}, {args.steps} timed steps after {args.warmup}, d_model {args.d_model}, "
        f"{args.layers} layers, {args.texts} texts, {torch.get_num_threads()} torch threads"
    )
    print()
    print(
        "| part | loop | tokens/s (samples/s for batching) | ms/step (median) | host share | peak memory (MiB) | setup (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for part, loop, rate, ms, share, peak, setup in rows:
        peak_text = f"{peak / 2**20:.1f}" if peak is not None else "n/a"
        setup_text = f"{setup:.2f}" if setup is not None else "n/a"
        print(f"| {part} | {loop} | {rate:.0f} | {ms:.2f} | {share:.0%} | {peak_text} | {setup_text} |")


if __name__ == "__main__":
    main()

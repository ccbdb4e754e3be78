"""Training throughput of one small language model at batch sizes 1, 8 and 32, side by
side in one run: what a default `--batch_size` of 1 costs (PM204).

    python -m benchmarks.bench_batch_size                 # CPU
    python -m benchmarks.bench_batch_size --device cuda   # a GPU

Each batch size trains a fresh copy of the same model (a two-layer causal transformer,
AdamW) on random tokens: a few warm-up steps, then timed steps, and prints tokens per
second and the ratio to batch size 1 as a markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH_SIZES = (1, 8, 32)


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, 4, 4 * d_model, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.size(1)
        x = self.embed(ids) + self.pos[:t]
        return self.head(self.blocks(x, mask=self.mask[:t, :t], is_causal=True))


def tokens_per_second(batch_size: int, device: torch.device, args: argparse.Namespace) -> tuple[float, float]:
    """(tokens/s, last loss) of `args.steps` timed steps at `batch_size`."""
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.d_model, args.layers, args.seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, args.vocab, (batch_size * (args.steps + args.warmup), args.seq_len + 1), device=device)

    def step(i: int) -> torch.Tensor:
        batch = data[i * batch_size : (i + 1) * batch_size]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    for i in range(args.warmup):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        loss = step(i)
    last = loss.item()  # waits for the device
    elapsed = time.perf_counter() - start
    return batch_size * args.seq_len * args.steps / elapsed, last


def main(argv: list[str] | None = None) -> list[tuple[int, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--quick", action="store_true", help="a few steps of a smaller model (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.seq_len, args.d_model, args.vocab = 2, 1, 16, 32, 64
    device = torch.device(args.device)
    command = " ".join(["python -m benchmarks.bench_batch_size", *(argv if argv is not None else sys.argv[1:])])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"Device: {name}; torch {torch.__version__}; {torch.get_num_threads()} threads; "
        f"date {datetime.date.today().isoformat()}"
    )
    print(f"Command: `{command}`")
    print(f"Model: {args.layers}-layer causal transformer, d_model {args.d_model}, sequence {args.seq_len}, AdamW\n")
    print("| batch size | tokens/s | vs batch 1 | last loss |")
    print("|---|---|---|---|")
    rows = []
    for batch_size in BATCH_SIZES:
        rate, loss = tokens_per_second(batch_size, device, args)
        rows.append((batch_size, rate))
        print(f"| {batch_size} | {rate:,.0f} | {rate / rows[0][1]:.1f}x | {loss:.4f} |")
    return rows


if __name__ == "__main__":
    main()

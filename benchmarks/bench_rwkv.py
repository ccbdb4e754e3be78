"""The RWKV-style training script before and after PM505: tokens/s and peak memory in one run.

The model is fixtures/rules/PM505/rwkv_time_mix.in.py (RWKV-6-style time mixing written as a
Python loop over the sequence); "rewritten" is rwkv_time_mix.out.py, the same file after
`perfmod apply --select PM505 --level numeric` (its loop becomes runtime.kernels.linear_attention):
tests/rules/test_fixture_pairs.py keeps it equal to perfmod's output, so the two cannot drift
apart, and this file needs torch but not libcst (the GPU machine has no libcst). Both train the same model from the same seed
and batches for --steps AdamW steps (forward, backward, step) after --warmup untimed ones.

On the GPU machine, from the repository root (prints a markdown table for BENCHMARKS.md):

    python -m benchmarks.bench_rwkv --device cuda
    python -m benchmarks.bench_rwkv --device cuda --seq-len 2048 --batch 4

CPU smoke run (tests/runtime/test_bench_kernels.py runs it; CPU numbers are no GPU claim):

    python -m benchmarks.bench_rwkv --device cpu --quick

Peak memory is torch.cuda.max_memory_allocated over the timed steps (reset between the two
scripts); on CPU it is not measured ("-"). "loss diff" is the largest relative difference of
the rewritten script's per-step losses from the original's (numeric level: float sums reordered).
"""

import argparse
import datetime
import pathlib
import platform
import shlex
import sys
import time

import torch
import torch.nn.functional as F

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "rules" / "PM505" / "rwkv_time_mix.in.py"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, two steps: a smoke test")
    parser.add_argument("--batch", type=int, help="default 8, quick 2")
    parser.add_argument("--seq-len", type=int, help="default 1024, quick 40")
    parser.add_argument("--d-model", type=int, help="default 512, quick 32")
    parser.add_argument("--heads", type=int, help="default 8 (head size 64), quick 4")
    parser.add_argument("--layers", type=int, help="default 4, quick 2")
    parser.add_argument("--steps", type=int, help="timed steps (default 10, quick 2)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 2, quick 1)")
    args = parser.parse_args(argv)
    for name, full, quick in [
        ("batch", 8, 2),
        ("seq_len", 1024, 40),
        ("d_model", 512, 32),
        ("heads", 8, 4),
        ("layers", 4, 2),
        ("steps", 10, 2),
        ("warmup", 2, 1),
    ]:
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


def scripts() -> dict[str, str]:
    """The fixture as written and as PM505 rewrites it."""
    rewritten = FIXTURE.with_name(FIXTURE.name.replace(".in.py", ".out.py"))
    return {
        "original (Python time loop)": FIXTURE.read_text(),
        "rewritten (runtime.kernels.linear_attention)": rewritten.read_text(),
    }


def run(source: str, args, device: torch.device) -> tuple[float, str, list[float]]:
    """(tokens/s, peak memory, losses) of --warmup + --steps training steps of the script's Model."""
    namespace = {"__name__": "bench_rwkv"}
    exec(compile(source, str(FIXTURE), "exec"), namespace)
    torch.manual_seed(0)
    vocab = 256
    model = namespace["Model"](vocab_size=vocab, d_model=args.d_model, n_head=args.heads, n_layer=args.layers).to(
        device
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, vocab, (args.batch, args.seq_len + 1), generator=gen).to(device)
        for _ in range(args.warmup + args.steps)
    ]
    losses = []

    def step(data):
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    for data in batches[: args.warmup]:
        step(data)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for data in batches[args.warmup :]:
        step(data)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    peak = f"{torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB" if device.type == "cuda" else "-"
    return args.steps * args.batch * args.seq_len / seconds, peak, [loss.item() for loss in losses]


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    results = {name: run(source, args, device) for name, source in scripts().items()}
    ((base_rate, _, base_losses),) = [results[n] for n in results if n.startswith("original")]

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    command = " ".join(shlex.quote(a) for a in ["python", "-m", "benchmarks.bench_rwkv", *sys.argv[1:]])
    print(f"### RWKV-style training script before/after PM505: {name}, float32\n")
    print(
        f"torch {torch.__version__}, {datetime.date.today()}; B={args.batch}, T={args.seq_len}, "
        f"d_model={args.d_model}, heads={args.heads}, layers={args.layers}; "
        f"{args.steps} timed AdamW steps after {args.warmup} warm-up\n"
    )
    print(f"    {command}\n")
    print("| script | tokens/s | speed-up | peak memory | loss diff |")
    print("|---|---:|---:|---:|---:|")
    for script, (rate, peak, losses) in results.items():
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, base_losses))
        print(f"| {script} | {rate:,.0f} | {rate / base_rate:.1f}x | {peak} | {diff:.1e} |")


if __name__ == "__main__":
    main()

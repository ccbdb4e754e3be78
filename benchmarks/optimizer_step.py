"""Optimizer step time: torch's default implementation, `foreach=True` and `fused=True`
(PM402's fix), for Adam, AdamW and SGD with momentum, side by side in one process.

    python -m benchmarks.optimizer_step                  # the CPU
    python -m benchmarks.optimizer_step --device cuda    # a GPU (bench_gpu runs this)
    python -m benchmarks.optimizer_step --quick          # smallest sizes (tests)

Each parameter set has gradients filled once; each optimizer steps --warmup
times, then five runs of --steps steps are timed (synchronised on CUDA) and the
mean step of the fastest run is printed, so that other work on a shared machine
counts as little as it can, with the ratio default/fused. The default
implementation is what torch picks without `foreach` or `fused` (foreach on
CUDA, a loop over the tensors on the CPU). The optimizers of one row start from
the same parameters, and the table's last column is the largest difference
between the default's and the fused one's parameters after the timed steps (the
fused kernel rounds in another order).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time

import torch

OPTIMIZERS = {
    "Adam": (torch.optim.Adam, {"lr": 1e-3}),
    "AdamW": (torch.optim.AdamW, {"lr": 1e-3}),
    "SGD momentum": (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}),
}
# (label, shapes): a small policy network (4 -> 128 -> 2 actions and 1 value, as reinforcement
# learning examples train on the CPU), many small tensors (launch-bound), a transformer-block-like
# mix, a few large ones.
PARAMETER_SETS = [
    ("policy MLP, 6 tensors, 1,027 elements", [(128, 4), (128,), (2, 128), (2,), (1, 128), (1,)]),
    ("50 x (64, 64)", [(64, 64)] * 50),
    ("MLP block, 8 x (512, 512) + biases", [(512, 512)] * 8 + [(512,)] * 8),
    ("4 x (4096, 1024)", [(4096, 1024)] * 4),
]
QUICK_SETS = [("10 x (32, 32)", [(32, 32)] * 10)]


IMPLEMENTATIONS = ({}, {"foreach": True}, {"fused": True})  # default, foreach, fused
RUNS = 5  # timed runs per optimizer; the fastest counts


def step_seconds(optimizer, steps: int, warmup: int, device: str) -> float:
    for _ in range(warmup):
        optimizer.step()
    fastest = float("inf")
    for _ in range(RUNS):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        fastest = min(fastest, (time.perf_counter() - start) / steps)
    return fastest


def measure(shapes, name: str, device: str, steps: int, warmup: int) -> tuple[float, float, float, float]:
    """(default, foreach and fused seconds per step, max parameter difference of default and fused)."""
    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(*shape, generator=generator) for shape in shapes]
    grads = [torch.randn(*shape, generator=generator) for shape in shapes]
    cls, options = OPTIMIZERS[name]
    results = []
    for implementation in IMPLEMENTATIONS:
        parameters = [torch.nn.Parameter(t.clone().to(device)) for t in start]
        for parameter, grad in zip(parameters, grads):
            parameter.grad = grad.to(device)
        optimizer = cls(parameters, **options, **implementation)
        results.append((step_seconds(optimizer, steps, warmup, device), parameters))
    (default, plain), (foreach, _), (fused, fast) = results
    difference = max((a - b).abs().max().item() for a, b in zip(plain, fast))
    return default, foreach, fused, difference


def table(device: str, sets, steps: int, warmup: int) -> str:
    lines = [
        "| parameters | optimizer | default ms/step | foreach ms/step | fused ms/step | default/fused | max param diff |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for label, shapes in sets:
        for name in OPTIMIZERS:
            default, foreach, fused, difference = measure(shapes, name, device, steps, warmup)
            lines.append(
                f"| {label} | {name} | {default * 1e3:.3f} | {foreach * 1e3:.3f} | {fused * 1e3:.3f} | "
                f"{default / fused:.2f}x | {difference:.1e} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=50, help="timed steps per optimizer (default 50)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one small parameter set, 5 steps")
    options = parser.parse_args(argv)
    if options.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    sets, steps = (QUICK_SETS, 5) if options.quick else (PARAMETER_SETS, options.steps)
    where = torch.cuda.get_device_name() if options.device == "cuda" else f"{platform.processor() or 'CPU'}"
    print(
        f"Optimizer step, default vs foreach=True vs fused=True: {where}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}, Python {platform.python_version()}, {datetime.date.today()}\n"
        f"`python -m benchmarks.optimizer_step {' '.join(argv if argv is not None else sys.argv[1:])}`\n"
    )
    print(table(options.device, sets, steps, options.warmup))
    return 0


if __name__ == "__main__":
    sys.exit(main())

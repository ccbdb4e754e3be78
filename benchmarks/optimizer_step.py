"""Optimizer step time: torch's default implementation against `fused=True` (PM402's fix),
for Adam, AdamW and SGD with momentum, side by side in one process.

    python -m benchmarks.optimizer_step                  # the CPU
    python -m benchmarks.optimizer_step --device cuda    # a GPU (bench_gpu runs this)
    python -m benchmarks.optimizer_step --quick          # smallest sizes (tests)

Each parameter set has gradients filled once; each optimizer steps --warmup
times, then --steps steps are timed (synchronised on CUDA) and the mean step is
printed with the ratio default/fused. The default implementation is what torch
picks without `foreach` or `fused` (foreach on CUDA and, for these tensors, on
the CPU). The two optimizers of one row start from the same parameters, and the
table's last column is the largest difference between their parameters after
the timed steps (the fused kernel rounds in another order).
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
# (label, shapes): many small tensors (launch-bound), a transformer-block-like mix, a few large ones.
PARAMETER_SETS = [
    ("50 x (64, 64)", [(64, 64)] * 50),
    ("MLP block, 8 x (512, 512) + biases", [(512, 512)] * 8 + [(512,)] * 8),
    ("4 x (4096, 1024)", [(4096, 1024)] * 4),
]
QUICK_SETS = [("10 x (32, 32)", [(32, 32)] * 10)]


def step_seconds(parameters: list[torch.Tensor], optimizer, steps: int, warmup: int, device: str) -> float:
    for _ in range(warmup):
        optimizer.step()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def measure(shapes, name: str, device: str, steps: int, warmup: int) -> tuple[float, float, float]:
    """(default seconds per step, fused seconds per step, max parameter difference)."""
    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(*shape, generator=generator) for shape in shapes]
    grads = [torch.randn(*shape, generator=generator) for shape in shapes]
    cls, options = OPTIMIZERS[name]
    results = []
    for fused in (False, True):
        parameters = [torch.nn.Parameter(t.clone().to(device)) for t in start]
        for parameter, grad in zip(parameters, grads):
            parameter.grad = grad.to(device)
        optimizer = cls(parameters, **options, **({"fused": True} if fused else {}))
        results.append((step_seconds(parameters, optimizer, steps, warmup, device), parameters))
    (default, plain), (fused, fast) = results
    difference = max((a - b).abs().max().item() for a, b in zip(plain, fast))
    return default, fused, difference


def table(device: str, sets, steps: int, warmup: int) -> str:
    lines = [
        "| parameters | optimizer | default ms/step | fused ms/step | default/fused | max param diff |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for label, shapes in sets:
        for name in OPTIMIZERS:
            default, fused, difference = measure(shapes, name, device, steps, warmup)
            lines.append(
                f"| {label} | {name} | {default * 1e3:.3f} | {fused * 1e3:.3f} | "
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
        f"Optimizer step, default vs fused=True: {where}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}, Python {platform.python_version()}, {datetime.date.today()}\n"
        f"`python -m benchmarks.optimizer_step {' '.join(argv if argv is not None else sys.argv[1:])}`\n"
    )
    print(table(options.device, sets, steps, options.warmup))
    return 0


if __name__ == "__main__":
    sys.exit(main())

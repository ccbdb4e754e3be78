"""Kernel timings, forward + backward: Python time loops against runtime.kernels' fast paths
(and flash-linear-attention's Triton kernel where `fla` is installed), and hand-written
softmax(QK^T/sqrt(d))V attention against F.scaled_dot_product_attention.

On the GPU machine, from the repository root (prints a markdown table for BENCHMARKS.md):

    python -m benchmarks.bench_kernels --device cuda
    python -m benchmarks.bench_kernels --device cuda --chunk-sizes 8 16 32   # pick linear_attention's C
    PERFMOD_KERNELS_COMPILE=0 python -m benchmarks.bench_kernels --device cuda   # scans without torch.compile
    python -m benchmarks.bench_kernels --device cuda --ops linear_attention scan   # the recurrences only
    python -m benchmarks.bench_kernels --device cuda --ops attention               # SDPA only

The last lines print issue 5's goals for linear attention at T = 2048 on an H100: at least 20x
faster than the Python loop, at most 1.5x flash-linear-attention's time ("vs fla" column), met or
not. fla is imported only if installed (`pip install flash-linear-attention` on the GPU machine);
without it the table says so and the fla row and ratio are left out.

CPU smoke run (tests/runtime/test_bench_kernels.py runs it; CPU numbers are no GPU claim):

    python -m benchmarks.bench_kernels --device cpu --quick

Sizes: T = 512, 2048, 8192; linear attention (GLA form) B=4, H=8, K=V=64; scan B=4, D=1024;
attention B=4, H=8, d=64, causal. Inputs in --dtype (bf16 on CUDA, fp32 on CPU by default),
decays in [0.9, 1). Each implementation runs --warmup times (compiling there), then
--reps times (the loops --loop-reps times), timed with CUDA events (perf_counter on CPU);
the table gives the median. "rel err" is max |o - o_ref| / max |o_ref| of the forward
output against the reference loop (the manual attention) run in float32. fla's chunk_gla
gets its native input, the log-decay, and its (B, T, H, K) layout, both made outside the
timing; runtime.kernels.linear_attention gets the decay w.
"""

import argparse
import datetime
import inspect
import math
import os
import platform
import shlex
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from runtime.kernels import linear_attention, linear_attention_reference, linear_scan, linear_scan_reference


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="default: bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a few reps: a smoke test")
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[8], help="linear_attention chunk sizes")
    parser.add_argument("--reps", type=int, help="timed runs of each fast path (default 20, quick 3)")
    parser.add_argument("--loop-reps", type=int, help="timed runs of each Python loop (default 3, quick 2)")
    parser.add_argument("--warmup", type=int, help="untimed runs first (default 3, quick 1)")
    parser.add_argument(
        "--ops",
        nargs="+",
        choices=list(OPS),
        default=list(OPS),
        help="the cases to time (default: all): linear_attention and scan against their Python loops, "
        "attention (manual softmax against F.scaled_dot_product_attention)",
    )
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    args.reps = args.reps or (3 if args.quick else 20)
    args.loop_reps = args.loop_reps or (2 if args.quick else 3)
    args.warmup = args.warmup or (1 if args.quick else 3)
    return args


LINEAR_ATTENTION = "linear attention (GLA)"
FLA = "fla.ops.gla.chunk_gla"
GOAL_T = 2048  # issue 5: >= 20x the loop and <= 1.5x flash-linear-attention's time there, on an H100
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def median_ms(fn, warmup, reps, device):
    """Median wall time of fn() in milliseconds, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


OPS = ("linear_attention", "scan", "attention")


def forward_backward(fn, inputs):
    """A closure running fn(*inputs) and backward from random output gradients (made once)."""
    leaves = [t for t in inputs if t is not None and t.requires_grad]
    grads = None

    def run():
        nonlocal grads
        for t in leaves:
            t.grad = None
        out = fn(*inputs)
        out = out if isinstance(out, tuple) else (out,)
        grads = grads or [torch.randn_like(o) for o in out]
        torch.autograd.backward(out, grads)

    return run


def rel_err(got, want):
    return ((got.float() - want).abs().max() / want.abs().max()).item()


def bench(op, T, impls, inputs, reference, args, device):
    """Rows (op, T, impl, ms, rel err) for impls {name: (fn, inputs or None for the shared ones, reps)}."""
    with torch.no_grad():
        want = reference(*[None if t is None else t.detach().float() for t in inputs])
        want = want[0] if isinstance(want, tuple) else want
    rows = []
    for name, (fn, own_inputs, reps) in impls.items():
        run_inputs = own_inputs or inputs
        with torch.no_grad():
            out = fn(*run_inputs)
        out = out[0] if isinstance(out, tuple) else out
        err = rel_err(out, want)
        ms = median_ms(forward_backward(fn, run_inputs), args.warmup, reps, device)
        rows.append((op, T, name, ms, err))
        print(f"  {op} T={T} {name}: {ms:.3f} ms", file=sys.stderr)
    return rows


def leaf(*shape, device, dtype, low=None):
    """A random leaf tensor; with `low`, uniform in [low, 1) (decays), else standard normal."""
    t = torch.rand(*shape, device=device) * (1 - low) + low if low is not None else torch.randn(*shape, device=device)
    return t.to(dtype).requires_grad_()


def fla_chunk_gla():
    """fla's chunk_gla as f(q, k, v, g, state) -> (o (B, H, T, V), final state) for (B, T, H, *) inputs,
    or None and the reason it is missing."""
    try:
        from fla.ops.gla import chunk_gla
    except ImportError as err:  # also when triton is missing
        return None, f"flash-linear-attention not importable: {err}"
    layout = {"head_first": False} if "head_first" in inspect.signature(chunk_gla).parameters else {}

    def run(q, k, v, g, state):
        o, final = chunk_gla(q, k, v, g, scale=1.0, initial_state=state, output_final_state=True, **layout)
        return o.transpose(1, 2), final

    return run, None


def linear_attention_rows(T, args, device, dtype, notes):
    B, H, K = (1, 2, 16) if args.quick else (4, 8, 64)
    q, k, v = (leaf(B, H, T, K, device=device, dtype=dtype) for _ in range(3))
    w = leaf(B, H, T, K, device=device, dtype=dtype, low=0.9)
    state = leaf(B, H, K, K, device=device, dtype=dtype)
    inputs = [q, k, v, w, None, state]
    impls = {"Python loop (reference)": (linear_attention_reference, None, args.loop_reps)}
    for C in args.chunk_sizes:
        impls[f"runtime.kernels.linear_attention C={C}"] = (
            lambda *a, C=C: linear_attention(*a, chunk_size=C),
            None,
            args.reps,
        )
    fla, why = fla_chunk_gla() if device.type == "cuda" else (None, "flash-linear-attention needs CUDA")
    if fla is None:
        notes.add(f"fla row skipped: {why}")
    else:
        own = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
        own += [w.detach().float().log().transpose(1, 2).contiguous().requires_grad_(), state]
        impls[FLA] = (fla, own, args.reps)
    return bench(LINEAR_ATTENTION, T, impls, inputs, linear_attention_reference, args, device)


def slot_scan_loop(a, x, h0):
    """The same recurrence as a loop that writes each state into a preallocated tensor
    (`h[:, t] = a[:, t - 1] * h[:, t - 1] + x[:, t - 1]`), which autograd records as one
    in-place copy per step. Its decays must not need a gradient: the product saves the
    slot it reads, which the next step's write changes (backward fails)."""
    h = torch.empty(x.shape[0], x.shape[1] + 1, *x.shape[2:], device=x.device, dtype=x.dtype)
    h[:, 0] = h0
    for t in range(1, x.shape[1] + 1):
        h[:, t] = a[:, t - 1] * h[:, t - 1] + x[:, t - 1]
    return h[:, 1:]


def scan_rows(T, args, device, dtype):
    B, D = (2, 32) if args.quick else (4, 1024)
    inputs = [
        leaf(B, T, D, device=device, dtype=dtype, low=0.9),
        leaf(B, T, D, device=device, dtype=dtype),
        leaf(B, D, device=device, dtype=dtype),
    ]
    impls = {
        "Python loop (reference)": (linear_scan_reference, None, args.loop_reps),
        "Python loop into a preallocated tensor, fixed decays": (
            slot_scan_loop,
            [inputs[0].detach(), *inputs[1:]],
            args.loop_reps,
        ),
        "runtime.kernels.linear_scan": (linear_scan, None, args.reps),
    }
    return bench("linear scan", T, impls, inputs, linear_scan_reference, args, device)


def manual_attention(q, k, v):
    """softmax(QK^T / sqrt(d) + causal mask) V, the way training scripts write it: (B, H, T, d)."""
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def attention_rows(T, args, device, dtype):
    B, H, d = (1, 2, 16) if args.quick else (4, 8, 64)
    inputs = [leaf(B, H, T, d, device=device, dtype=dtype) for _ in range(3)]
    impls = {
        "manual softmax(QK^T/sqrt(d))V": (manual_attention, None, args.reps),
        "F.scaled_dot_product_attention": (sdpa, None, args.reps),
    }
    return bench("causal attention", T, impls, inputs, manual_attention, args, device)


def main(argv=None):
    args = parse_args(argv)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if device.type == "cuda":  # one compiled scan per shape: more shapes than dynamo's default limit of 8
        torch._dynamo.config.recompile_limit = 64
    torch.manual_seed(0)
    notes = set()
    rows = []
    for T in (64, 256) if args.quick else (512, 2048, 8192):
        if "linear_attention" in args.ops:
            rows += linear_attention_rows(T, args, device, dtype, notes)
        if "scan" in args.ops:
            rows += scan_rows(T, args, device, dtype)
        if "attention" in args.ops:
            rows += attention_rows(T, args, device, dtype)

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    command = " ".join(shlex.quote(a) for a in ["python", "-m", "benchmarks.bench_kernels", *sys.argv[1:]])
    compile_env = os.environ.get("PERFMOD_KERNELS_COMPILE", "unset")
    print(f"### Kernels: {name}, {args.dtype}, forward + backward ({', '.join(args.ops)})\n")
    print(
        f"torch {torch.__version__}, {datetime.date.today()}, PERFMOD_KERNELS_COMPILE={compile_env}; "
        f"median of {args.reps} runs ({args.loop_reps} for the loops) after {args.warmup} warm-up\n"
    )
    print(f"    {command}\n")
    print("| op | T | implementation | ms | speed-up | vs fla | rel err |")
    print("|---|---:|---|---:|---:|---:|---:|")
    base, fla = {}, {(op, T): ms for op, T, impl, ms, _ in rows if impl == FLA}
    for op, T, impl, ms, err in rows:
        base.setdefault((op, T), ms)  # the first implementation of each case is the baseline
        vs_fla = f"{ms / fla[op, T]:.2f}x" if (op, T) in fla else "-"
        print(f"| {op} | {T} | {impl} | {ms:.3f} | {base[op, T] / ms:.1f}x | {vs_fla} | {err:.1e} |")
    print()
    print(
        "speed-up: the first row of the case (the loop, the manual attention) over this one; "
        "vs fla: this one's time over fla.ops.gla.chunk_gla's (1.00x = as fast)"
    )
    for line in goal_lines(rows, base, fla):
        print(f"\n{line}")
    for note in sorted(notes):
        print(f"\n{note}")


def goal_lines(rows, base, fla):
    """Issue 5's goals for linear attention on an H100 at T = 2048: at least 20x the loop's speed,
    at most 1.5x fla's time; one line per runtime.kernels row at that T, or at the largest T run."""
    cases = [T for op, T, *_ in rows if op == LINEAR_ATTENTION]
    if not cases:  # --ops without linear_attention
        return []
    T_goal = GOAL_T if GOAL_T in cases else max(cases)
    lines = []
    for op, T, impl, ms, _ in rows:
        if op != LINEAR_ATTENTION or T != T_goal or not impl.startswith("runtime.kernels"):
            continue
        speedup = base[op, T] / ms
        line = (
            f"goal at T={T}: {impl} is {speedup:.1f}x faster than the loop (goal >= 20x: "
            f"{'met' if speedup >= 20 else 'not met'})"
        )
        if (op, T) in fla:
            ratio = ms / fla[op, T]
            line += f", {ratio:.2f}x fla's time (goal <= 1.5x: {'met' if ratio <= 1.5 else 'not met'})"
        else:
            line += ", fla not measured"
        lines.append(line + ("" if T == GOAL_T else f"; the goal is set for T={GOAL_T}"))
    return lines


if __name__ == "__main__":
    main()

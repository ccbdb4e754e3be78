"""Step tracer for `perfmod verify`: runs inside the training script's process.

`perfmod verify` copies the script (original and rewrite), and its
instrumentation (codemod/instrument.py) adds the same calls to both copies:

    import runtime.trace as _perfmod_trace
    _perfmod_trace.install()                      # top of the script: seeds, reads the settings
    ...
    _perfmod_trace.loss(loss).backward()          # records the loss each backward() differentiates
    logits = model(_perfmod_trace.batch(inputs))  # records samples (and tokens) per step
    _perfmod_trace.stepped(optimizer.step())      # counts optimizer steps; stops after N

Settings come from the environment, so that both runs get the same ones:
PERFMOD_TRACE_OUT (where the JSON result goes), PERFMOD_TRACE_STEPS (N),
PERFMOD_TRACE_WARMUP (steps left out of the timing), PERFMOD_TRACE_SEED,
PERFMOD_TRACE_DETERMINISTIC ("1": deterministic kernels only) and
PERFMOD_TRACE_PIN_SHUFFLE ("1": the sample order pinned, below).

Under torchrun (WORLD_SIZE > 1) every process traces itself: rank r writes to
PERFMOD_TRACE_OUT with `.rank<r>` before its suffix (`trace.json` ->
`trace.rank1.json`; `rank_path`), and its result says its rank, the world size
torchrun gave it, and whether it had joined a process group of that size by its
first optimizer step. Nothing is reduced across ranks in the process: `perfmod
verify --nproc` combines the ranks' files afterwards, so tracing adds no
collective to the step.

Pinned shuffle (`perfmod verify --nproc`): a single-process script shuffles with
a DataLoader's RandomSampler, which seeds each pass from torch's global
generator (or the loader's own); its torchrun-ready rewrite shuffles with a
DistributedSampler, which seeds epoch e's permutation with `seed + e` and deals
it out to the ranks. So that the same samples make up each global batch in both
runs, a RandomSampler (without replacement, over the whole dataset) draws the
permutation of its k-th pass as a DistributedSampler draws that of epoch k,
`torch.randperm(n)` from a generator seeded with PERFMOD_TRACE_SEED + k, and a
DistributedSampler's seed is set to PERFMOD_TRACE_SEED. Its `set_epoch` is left
alone: a rewrite that does not call it every epoch repeats the first epoch's
order, and verify sees it.

What it measures, and what it does not disturb:
- Losses are kept as detached tensors and read back (`.item()`) once, after the
  last step: a per-step `.item()` would add a host sync per step, and hide the
  gains of the rewrites that remove syncs or overlap copies (PM101, PM404).
- Time: `torch.cuda.synchronize()` only at the two ends of the timed window,
  the end of warm-up step W and the end of step N; steps/s = (N - W) / elapsed.
- Samples per step: dim 0 of the first tensor the model is called with, summed
  over the micro-batches of a step; tokens when that tensor holds integer ids
  of two or more dimensions (B, T, ...): its element count.
- Peak memory: `torch.cuda.max_memory_allocated()` when the script used CUDA,
  else the process's peak resident set size (`ru_maxrss`), labelled "rss".

After step N the tracer writes its result and raises `TraceStop`, a
`SystemExit` with status 0: `finally` blocks and `atexit` handlers run (DataLoader
workers shut down cleanly) and `except Exception` does not catch it. A script
that swallows it anyway and steps again is ended with `os._exit(0)`. A script
that ends before N steps writes what it has, marked `"completed": false`. Only
the training process writes: not DataLoader workers, forked or spawned.

Seeding: `install()` seeds `random`, torch (all devices) and numpy (when it is
installed) with PERFMOD_TRACE_SEED before the script's own code runs, the same
for both runs; a script that seeds itself re-seeds over it.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import platform
import random
import sys
import time
from dataclasses import dataclass, field

import torch

from runtime import profile

OUT_VAR, STEPS_VAR, WARMUP_VAR, SEED_VAR = (
    "PERFMOD_TRACE_OUT",
    "PERFMOD_TRACE_STEPS",
    "PERFMOD_TRACE_WARMUP",
    "PERFMOD_TRACE_SEED",
)
DETERMINISTIC_VAR = "PERFMOD_TRACE_DETERMINISTIC"  # "1": deterministic kernels where torch has them
PIN_SHUFFLE_VAR = "PERFMOD_TRACE_PIN_SHUFFLE"  # "1": RandomSampler and DistributedSampler draw alike


class TraceStop(SystemExit):
    """Ends the script after the traced steps, with exit status 0."""

    def __init__(self) -> None:
        super().__init__(0)


@dataclass
class Tracer:
    """Counts optimizer steps, keeps the losses, times the steps after warm-up."""

    out: str
    steps: int
    warmup: int
    losses: list = field(default_factory=list)  # detached loss tensors, one per backward()
    samples: list = field(default_factory=list)  # per optimizer step: samples, or None when unknown
    tokens: list = field(default_factory=list)
    done: int = 0  # optimizer steps so far
    rank: int = 0  # torchrun's RANK and WORLD_SIZE; 0 and 1 for a plain run
    world_size: int = 1
    process_group: dict | None = None  # at the first optimizer step: {"initialized", "world_size", "backend"}
    window_start: float | None = None
    window_end: float | None = None
    written: bool = False
    pid: int = field(default_factory=os.getpid)  # only this process writes (not forked workers)
    profiler: object | None = None  # runtime.profile.Profiler under `perfmod profile`
    _samples: int | None = None  # of the step under way
    _tokens: int | None = None

    def loss(self, value):
        if isinstance(value, torch.Tensor):
            self.losses.append(value.detach().clone())
        else:
            self.losses.append(torch.tensor(float(value), dtype=torch.float64))
        return value

    def batch(self, value):
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            self._samples = (self._samples or 0) + value.shape[0]
            if value.dim() >= 2 and not value.is_floating_point() and not value.is_complex():
                self._tokens = (self._tokens or 0) + value.numel()
        return value

    def stepped(self, value=None):
        if self.written:  # the script caught TraceStop and trained on
            os._exit(0)
        self.done += 1
        if self.process_group is None:
            self.process_group = _process_group()
        self.samples.append(self._samples)
        self.tokens.append(self._tokens)
        self._samples = self._tokens = None
        if self.done >= self.steps:
            self.window_end = _synchronized_time()
            if self.profiler is not None:
                self.profiler.step()  # the last: attributes the profiled steps and writes them
            self.write(completed=True)
            raise TraceStop()
        if self.profiler is not None:
            self.profiler.step()
        if self.done == self.warmup:
            # After the profiler's step, which starts its recording: that is paid once, not per step.
            self.window_start = _synchronized_time()
        return value

    def result(self, completed: bool) -> dict:
        timed = self.done - self.warmup if self.window_start is not None and self.window_end is not None else 0
        elapsed = self.window_end - self.window_start if timed else None
        window = slice(self.warmup, self.done)
        return {
            "completed": completed,
            "steps": self.done,
            "warmup": self.warmup,
            "timed_steps": timed,
            "elapsed_s": elapsed,
            "steps_per_s": timed / elapsed if timed and elapsed > 0 else None,
            "samples_per_s": _rate(self.samples[window], elapsed) if timed else None,
            "tokens_per_s": _rate(self.tokens[window], elapsed) if timed else None,
            "samples_per_step": self.samples,
            "tokens_per_step": self.tokens,
            "losses": [_finite_or_none(v) for v in _read_back(self.losses)],
            **peak_memory(),
            "device": device_name(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "rank": self.rank,
            "world_size": self.world_size,
            "process_group": self.process_group,
        }

    def write(self, completed: bool) -> None:
        if self.written or os.getpid() != self.pid:
            return
        self.written = True
        sys.stdout.flush()
        sys.stderr.flush()
        temporary = self.out + ".part"
        with open(temporary, "w") as handle:
            json.dump(self.result(completed), handle)
        os.replace(temporary, self.out)


_tracer: Tracer | None = None


def install() -> Tracer:
    """Read the settings, seed every generator, and write a partial result if
    the script ends early. Called at the top of every instrumented file; only
    the first call does anything."""
    global _tracer
    if _tracer is not None:
        return _tracer
    missing = [name for name in (OUT_VAR, STEPS_VAR) if not os.environ.get(name)]
    if missing:
        raise RuntimeError(
            f"runtime.trace: {', '.join(missing)} not set; this copy is meant to be run by `perfmod verify`"
        )
    rank, world_size = int(os.environ.get("RANK") or 0), int(os.environ.get("WORLD_SIZE") or 1)
    out = os.environ[OUT_VAR] if world_size == 1 else rank_path(os.environ[OUT_VAR], rank)
    _tracer = Tracer(
        out=out,
        steps=int(os.environ[STEPS_VAR]),
        warmup=int(os.environ.get(WARMUP_VAR, "1")),
        rank=rank,
        world_size=world_size,
    )
    seed(int(os.environ.get(SEED_VAR, "0")))
    if os.environ.get(PIN_SHUFFLE_VAR) == "1":
        pin_shuffle(int(os.environ.get(SEED_VAR, "0")))
    if os.environ.get(DETERMINISTIC_VAR) == "1":
        # warn_only: an op without a deterministic kernel warns instead of ending the run.
        torch.use_deterministic_algorithms(True, warn_only=True)
    # A worker started with spawn or forkserver imports the script again (as __mp_main__);
    # it must not write its empty trace over the training process's.
    if multiprocessing.parent_process() is None:
        atexit.register(_tracer.write, completed=False)
        if profile.enabled():
            _tracer.profiler = profile.Profiler(os.environ[profile.OUT_VAR], _tracer.steps, _tracer.warmup)
            atexit.register(_tracer.profiler.stop)
    else:
        _tracer.pid = -1
    return _tracer


def seed(value: int) -> None:
    random.seed(value)
    torch.manual_seed(value)  # every device's generator
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(value)


def rank_path(out: str, rank: int) -> str:
    """Where rank `rank` writes its trace: `.rank<r>` before the suffix of `out`."""
    stem, suffix = os.path.splitext(out)
    return f"{stem}.rank{rank}{suffix}"


def pin_shuffle(seed: int) -> None:
    """Make a shuffling DataLoader draw its k-th pass as a DistributedSampler with `seed`
    draws epoch k (see the module docstring), for this process."""
    from torch.utils.data import DistributedSampler, RandomSampler

    if getattr(RandomSampler.__iter__, "_perfmod_pinned", False):
        return
    shuffled, initialised = RandomSampler.__iter__, DistributedSampler.__init__

    def pinned_iter(self):
        if self.replacement or self.num_samples != len(self.data_source):
            return shuffled(self)  # not one permutation of the dataset: as the script wrote it
        passes = getattr(self, "_perfmod_passes", 0)
        self._perfmod_passes = passes + 1
        generator = torch.Generator()
        generator.manual_seed(seed + passes)
        return iter(torch.randperm(len(self.data_source), generator=generator).tolist())

    def pinned_init(self, *args, **kwargs):
        initialised(self, *args, **kwargs)
        self.seed = seed

    pinned_iter._perfmod_pinned = True
    RandomSampler.__iter__, DistributedSampler.__init__ = pinned_iter, pinned_init


def _process_group() -> dict:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return {"initialized": False, "world_size": None, "backend": None}
    return {"initialized": True, "world_size": dist.get_world_size(), "backend": str(dist.get_backend())}


def loss(value):
    """Record the loss `backward()` is called on; returns it unchanged."""
    return install().loss(value)


def batch(value):
    """Record the size of a batch the model is called with; returns it unchanged."""
    return install().batch(value)


def stepped(value=None):
    """Count an optimizer step (its return value passes through); stop after N."""
    return install().stepped(value)


def peak_memory() -> dict:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return {"peak_memory_bytes": int(torch.cuda.max_memory_allocated()), "peak_memory_kind": "cuda"}
    try:
        import resource
    except ImportError:  # Windows
        return {"peak_memory_bytes": None, "peak_memory_kind": "rss"}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux counts kilobytes, macOS bytes.
    return {"peak_memory_bytes": int(peak if sys.platform == "darwin" else peak * 1024), "peak_memory_kind": "rss"}


def device_name() -> str:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return f"cuda ({torch.cuda.get_device_name()})"
    threads = torch.get_num_threads()
    return f"cpu ({platform.machine()}, {threads} torch thread{'s' if threads > 1 else ''})"


def _synchronized_time() -> float:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def _read_back(values: list) -> list[float]:
    # float64 holds every float32, bf16 and fp16 value exactly; a non-scalar loss is summed.
    return [(v.reshape(()) if v.numel() == 1 else v.sum()).to("cpu", torch.float64).item() for v in values]


def _rate(counts: list, elapsed: float | None) -> float | None:
    if not counts or elapsed is None or elapsed <= 0 or any(c is None for c in counts):
        return None
    return sum(counts) / elapsed


def _finite_or_none(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None

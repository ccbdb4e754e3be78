"""One training script for one process or many: what torchrun-ready code calls.

    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler
    from runtime import distributed

    def main():
        device = distributed.setup()        # cuda:LOCAL_RANK under torchrun; else cuda or cpu
        world = distributed.world()
        sampler = DistributedSampler(dataset) if world.distributed else None
        loader = DataLoader(dataset, batch_size=distributed.local_batch_size(64),
                            shuffle=sampler is None, sampler=sampler)
        model = Net().to(device)
        if world.distributed:
            model = DDP(model)
        for epoch in range(epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            ...
            distributed.print0(f"loss {distributed.all_reduce_mean(loss.detach()).item():.4f}")
            if distributed.is_main():
                torch.save(distributed.unwrap(model).state_dict(), "last.pt")

    if __name__ == "__main__":
        try:
            main()
        finally:
            distributed.cleanup()           # also on error: checkpoint writes end, the group is left

`python train.py` runs it as one process, exactly as the script without these lines
(no process group, identity reductions); `torchrun --nproc_per_node=N train.py` runs N.
Plain torch keeps what it has one idiom for (DistributedSampler, set_epoch, DDP(model),
model.no_sync()); this module holds what a script would otherwise get subtly wrong:
which device and backend, rank-0-only output, means for logging, the batch split,
checkpoint writes finished before the group is destroyed, unwrapping for state_dict().
`DDP(model)` needs no device_ids: the model is on one device, this process's, whose
batches the script moves there itself (device_ids would only make DDP move them too).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DataParallel, DistributedDataParallel
from torch.utils.data import DistributedSampler

from runtime import checkpoint


@dataclass(frozen=True)
class World:
    """Where this process stands among the training processes."""

    rank: int = 0  # 0 .. size - 1 over all machines
    local_rank: int = 0  # on this machine: which GPU is this process's
    size: int = 1  # processes in all

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def world() -> World:
    """This process's World: from the process group once setup() joined it, else from the
    variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE); a plain `python` run is rank 0 of 1."""
    local_rank = _env_int("LOCAL_RANK", 0)
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), local_rank, dist.get_world_size())
    return World(_env_int("RANK", 0), local_rank, _env_int("WORLD_SIZE", 1))


def setup(device: str | torch.device | None = None) -> torch.device:
    """Join the processes torchrun started, when it started more than one; return this
    process's device.

    `device` is what the script uses when it runs alone (default: "cuda" when available,
    else "cpu"). With WORLD_SIZE > 1, a CUDA device becomes this process's GPU
    (local_device), made current, and the process group uses NCCL; another device (the
    CPU) uses gloo.
    Alone (plain `python`, or torchrun with one process) it returns `device` and makes no
    process group: nothing to synchronise with, and the script runs as it did before.
    A second call returns the device without joining again.
    """
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    if not world().distributed:
        return device
    if device.type == "cuda":
        device = local_device(device)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if device.type == "cuda":  # device_id binds the group to this GPU: no guessing in barrier()
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return device


def local_device(device: str | torch.device = "cuda") -> torch.device:
    """`device` with this process's GPU index when it names none: under torchrun the GPU of
    LOCAL_RANK where the process sees several (one process per GPU), else the current GPU
    (alone, or a launcher that shows each process only its own GPU). Other devices as given."""
    device = torch.device(device)
    if device.type != "cuda" or device.index is not None:
        return device
    if "LOCAL_RANK" in os.environ and torch.cuda.device_count() > 1:
        return torch.device("cuda", _env_int("LOCAL_RANK", 0))
    return torch.device("cuda", torch.cuda.current_device())


def is_main() -> bool:
    """Rank 0: the process that prints, logs and writes files for all of them."""
    return world().main


def print0(*args, **kwargs) -> None:
    """print() on rank 0 only: one log line per step, not one per process. Its arguments
    are evaluated on every rank, so an all_reduce_mean among them runs everywhere, as a
    collective must."""
    if is_main():
        print(*args, **kwargs)


def barrier() -> None:
    """Wait until every process gets here, each after its own checkpoint writes in flight
    (runtime.checkpoint) are done: after it, any rank can read what rank 0 saved.
    Alone, it only waits for the writes."""
    checkpoint.wait_for_writes()
    if world().distributed:
        dist.barrier()


def all_reduce_mean(value):
    """The mean of `value` over the processes, for logging: each rank's loss is the mean
    over its part of the global batch, and the mean of those is the loss over the whole
    batch when the parts are equal (local_batch_size). A collective: call it on every rank,
    then print on one (print0). A tensor comes back as a new detached tensor on its
    device, a number as a float. Alone it returns `value` itself.
    """
    size = world().size
    if size == 1:
        return value
    if isinstance(value, torch.Tensor):
        total = value.detach().clone()
    else:  # NCCL reduces CUDA tensors only
        on = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        total = torch.tensor(float(value), dtype=torch.float64, device=on)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)  # ReduceOp.AVG is NCCL-only
    mean = total / size
    return mean if isinstance(value, torch.Tensor) else mean.item()


def local_batch_size(global_batch_size: int) -> int:
    """This process's share of the global batch, global / world size: N processes then
    step on as many samples as the single-process script, with the same learning rate,
    because DDP averages the gradients of the ranks' mean losses. Raises ValueError, on
    every rank alike (none is left waiting in a collective), when the batch does not split
    evenly: a rounded share would change the global batch and the math."""
    size = world().size
    if global_batch_size % size:
        raise ValueError(
            f"a global batch of {global_batch_size} does not split evenly over {size} processes; "
            f"use a multiple of {size}"
        )
    return global_batch_size // size


def loader_options(dataset, options: Mapping[str, Any], seed: int = 0) -> dict[str, Any]:
    """The keyword arguments of `DataLoader(dataset, **options)` for this process, where the
    script keeps a loader's settings in a dict: alone, `options` as they are; among N
    processes, the batch size is this process's share (local_batch_size) and a
    DistributedSampler (seeded with `seed`, shuffling where `options` shuffle) deals it its
    part of the dataset; tell it each epoch with `loader.sampler.set_epoch(epoch)`. Raises
    ValueError, on every rank alike, where the options cannot be split: a sampler of their
    own, or one sample a batch."""
    options = dict(options)
    here = world()
    if not here.distributed:
        return options
    for own in ("sampler", "batch_sampler"):
        if options.get(own) is not None:
            raise ValueError(
                f"the DataLoader's options give it a {own} of its own; split it over the processes by hand"
            )
    batch = options.get("batch_size", 1)
    if batch is None or batch == 1:
        raise ValueError("the DataLoader yields one sample a step, which cannot be split over the processes")
    options["batch_size"] = local_batch_size(batch)
    shuffle = bool(options.pop("shuffle", False))
    options["sampler"] = DistributedSampler(dataset, num_replicas=here.size, rank=here.rank, shuffle=shuffle, seed=seed)
    return options


def seed_offset() -> int:
    """The rank, to add to the seed where each process must draw its own randomness: a
    script that samples its own batches (nanoGPT's `torch.randint` over a token array) or
    augments them. Seed with it after everything that must be equal on every rank
    (synthetic data, a random split): DDP makes the parameters equal, nothing else. A
    DataLoader with a DistributedSampler needs none: the sampler deals each rank its share."""
    return world().rank


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under DDP, DataParallel and torch.compile wrappers, in any nesting: its
    state_dict() has the keys of the single-process model (no "module." or "_orig_mod."
    prefix), so a checkpoint loads the same with or without torchrun."""
    while True:
        if isinstance(model, (DistributedDataParallel, DataParallel)):
            model = model.module
        elif _compiled(model):
            model = model._orig_mod
        else:
            return model


def cleanup() -> None:
    """The end of a run, also on error (`try: main() finally: cleanup()`): wait for this
    process's checkpoint writes in flight, so that a run ends with its last checkpoint
    complete (and a failed write raises here, not at interpreter exit), then leave the
    process group (destroy_process_group). Safe without setup(), and twice."""
    try:
        checkpoint.wait_for_writes()
    finally:
        if dist.is_available() and dist.is_initialized():
            gloo = dist.get_backend() == "gloo"
            dist.destroy_process_group()
            if gloo:
                _let_gloo_threads_finish()


def _let_gloo_threads_finish() -> None:
    # Gloo's worker threads free each finished collective's tensors right after it, and that
    # takes the GIL. One still doing so when the interpreter starts shutting down aborts the
    # process ("terminate called without an active exception", SIGABRT; pytorch/pytorch#190489,
    # torch 2.13 on CPU: about 1 run in 5 of a 2-process DDP script). Freeing the group now
    # joins its threads where nothing else holds it; where DDP still does, a moment without
    # the GIL lets them finish.
    gc.collect()
    time.sleep(0.05)


def _compiled(model) -> bool:
    # A compiled module is an OptimizedModule; torch._dynamo is loaded once anything was compiled.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and isinstance(model, eval_frame.OptimizedModule)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default

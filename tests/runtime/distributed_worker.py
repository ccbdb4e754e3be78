"""One rank of tests/runtime/test_distributed.py's torchrun run (2 processes, gloo).

    python -m torch.distributed.run --standalone --nproc_per_node=2 distributed_worker.py OUT

Each rank writes what it saw to OUT/rank<r>.json, then ends as rewritten scripts do:
`try: main() finally: distributed.cleanup()`. Rank 0 ends with an error while a slow
checkpoint write is in flight: cleanup must wait for the write before the process
group goes, and the error must still end the run (no hang).
"""

import atexit
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from runtime import distributed
from runtime.checkpoint import AsyncCheckpointer
from runtime.data import DevicePrefetcher

OUT = sys.argv[1]
results: dict = {}


def record() -> None:
    with open(os.path.join(OUT, f"rank{distributed.world().rank}.json"), "w") as handle:
        json.dump(results, handle)


def slow_torch_save(seconds: float):
    real_save = torch.save

    def save(obj, f):
        time.sleep(seconds)
        real_save(obj, f)

    return save


def main() -> None:
    device = distributed.setup()
    world = distributed.world()
    results.update(
        device=str(device),
        world=[world.rank, world.local_rank, world.size],
        initialized=dist.is_initialized(),
        backend=dist.get_backend(),
        is_main=distributed.is_main(),
        seed_offset=distributed.seed_offset(),
        local_batch=distributed.local_batch_size(32),
    )
    try:
        distributed.local_batch_size(33)
    except ValueError as error:
        results["uneven"] = str(error)

    mine = torch.tensor([1.0, 2.0]) * (world.rank + 1)  # rank 0: [1, 2]; rank 1: [2, 4]
    mean = distributed.all_reduce_mean(mine)
    results.update(
        mean=mean.tolist(),
        mine_after=mine.tolist(),
        mean_is_new=mean is not mine,
        mean_float=distributed.all_reduce_mean(float(world.rank)),
    )
    distributed.print0(f"printed by rank {world.rank}", flush=True)

    torch.manual_seed(world.rank)  # different weights on each rank until DDP broadcasts rank 0's
    model = torch.nn.Linear(4, 2)
    ddp = DDP(model)
    ddp(torch.ones(3, 4)).sum().backward()
    results.update(
        unwrapped_is_model=distributed.unwrap(ddp) is model,
        keys=list(distributed.unwrap(ddp).state_dict()),
        weight=model.weight.flatten().tolist(),
        grad=model.weight.grad.flatten().tolist(),
    )

    # Both ranks save; rank 0 alone writes, slowly; the barrier waits for that write.
    torch.save = slow_torch_save(0.5)
    ckpt = AsyncCheckpointer()
    path = os.path.join(OUT, "shared.pt")
    ckpt.save({"rank": world.rank, "weight": model.weight}, path)
    distributed.barrier()
    results.update(
        exists_after_barrier=os.path.exists(path),
        saved_by=torch.load(path)["rank"] if os.path.exists(path) else None,
        prefetch_device=str(DevicePrefetcher([torch.ones(2)], device).device),
    )
    atexit.register(lambda: (results.update(initialized_at_exit=dist.is_initialized()), record()))
    record()
    distributed.barrier()  # both have recorded: rank 0 may now fail

    if world.main:
        torch.save = slow_torch_save(1.0)
        ckpt.save({"step": "last"}, os.path.join(OUT, "last.pt"))
        raise RuntimeError("training failed on rank 0")


if __name__ == "__main__":
    try:
        main()
    finally:
        distributed.cleanup()

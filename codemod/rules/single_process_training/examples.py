"""PM601's examples, whole scripts: single-process ones as the rule finds them, and the
torchrun-ready ones it writes for them (its VALID and INVALID cases)."""

SCRIPT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    model = torch.nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
        torch.save(model.state_dict(), "last.pt")


if __name__ == "__main__":
    main()
"""

SCRIPT_TORCHRUN = """\
import torch
from runtime import distributed
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    device = distributed.setup("cuda" if torch.cuda.is_available() else "cpu")
    world = distributed.world()
    dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    sampler = DistributedSampler(dataset) if world.distributed else None
    loader = DataLoader(
        dataset,
        batch_size=distributed.local_batch_size(32),
        shuffle=sampler is None,
        sampler=sampler,
    )
    model = torch.nn.Linear(8, 1).to(device)
    if world.distributed:
        model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        distributed.print0(
            f"epoch {epoch} loss {distributed.all_reduce_mean(loss).item():.4f}"
        )
        if distributed.is_main():
            torch.save(distributed.unwrap(model).state_dict(), "last.pt")


if __name__ == "__main__":
    try:
        main()
    finally:
        distributed.cleanup()
"""

LOOP = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

ACCUMULATION = """\
import torch
from torch.utils.data import DataLoader

model = torch.nn.Linear(8, 1).cuda()
opt = torch.optim.AdamW(model.parameters())
data = torch.randn(512, 8)
loader = DataLoader(data, batch_size=64)
for i, x in enumerate(loader):
    x = x.cuda()
    loss = model(x).pow(2).mean() / 4
    loss.backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
"""

SAVE_WHOLE = """


def checkpoint(path):
    torch.save({"model": model, "steps": i}, path)
    torch.save(model, path)
    state = {"model": model}
    torch.save(state, path)
    models = [model]
    print(len(models))


checkpoint("model.pt")
"""

SAVE_WHOLE_TORCHRUN = """


def checkpoint(path):
    if distributed.is_main():
        torch.save({"model": distributed.unwrap(model), "steps": i}, path)
    if distributed.is_main():
        torch.save(distributed.unwrap(model), path)
    state = {"model": distributed.unwrap(model)}
    if distributed.is_main():
        torch.save(state, path)
    models = [model]
    distributed.print0(len(models))


checkpoint("model.pt")
"""

ACCUMULATION_TORCHRUN = """\
import atexit
import contextlib

import torch
from runtime import distributed
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

distributed.setup("cuda")
world = distributed.world()
atexit.register(distributed.cleanup)
model = torch.nn.Linear(8, 1).cuda()
if world.distributed:
    model = DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters())
data = torch.randn(512, 8)
sampler = DistributedSampler(data, shuffle=False) if world.distributed else None
loader = DataLoader(data, batch_size=distributed.local_batch_size(64), sampler=sampler)
for i, x in enumerate(loader):
    x = x.cuda()
    accumulating = (i + 1) % 4 != 0
    with (
        model.no_sync()
        if world.distributed and accumulating
        else contextlib.nullcontext()
    ):
        loss = model(x).pow(2).mean() / 4
        loss.backward()
    if not accumulating:
        opt.step()
        opt.zero_grad()
"""

WHILE_STEPS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step, max_steps = 0, 20
batches = iter(loader)
while step < max_steps:
    try:
        x, y = next(batches)
    except StopIteration:
        batches = iter(loader)
        x, y = next(batches)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
"""

WHILE_STEPS_TORCHRUN = """\
import atexit

import torch
from runtime import distributed
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.manual_seed(0)
dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
distributed.setup("cpu")
world = distributed.world()
atexit.register(distributed.cleanup)
sampler = DistributedSampler(dataset, seed=0) if world.distributed else None
loader = DataLoader(
    dataset,
    batch_size=distributed.local_batch_size(32),
    shuffle=sampler is None,
    sampler=sampler,
)
model = torch.nn.Linear(8, 1)
if world.distributed:
    model = DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step, max_steps = 0, 20
batches = iter(loader)
while step < max_steps:
    try:
        x, y = next(batches)
    except StopIteration:
        if sampler is not None:
            sampler.set_epoch(sampler.epoch + 1)
        batches = iter(loader)
        x, y = next(batches)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
"""

WRAPPED_IN_DDP = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(8, 1)
model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

READS_LOCAL_RANK = """\
import os
import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(8, 1)
rank = int(os.environ.get('LOCAL_RANK', 0))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

BATCH_NORM = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

GENERATOR_CHANGES_BATCHES = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def forever(loader):
    while True:
        for x, y in loader:
            yield x, 2 * y


step, max_steps = 0, 20
batches = forever(loader)
while step < max_steps:
    try:
        x, y = next(batches)
    except StopIteration:
        batches = forever(loader)
        x, y = next(batches)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
"""

WHILE_OWN_LOSS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step, max_steps = 0, 20
batches = iter(loader)
loss_value = 1.0
while step < max_steps and loss_value > 0.01:
    try:
        x, y = next(batches)
    except StopIteration:
        batches = iter(loader)
        x, y = next(batches)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    loss_value = loss.item()
"""

DATA_PARALLEL = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(8, 1)
model = torch.nn.DataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

ONE_SAMPLE_PER_STEP = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, shuffle=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

FIXED_GPU = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(8, 1).to("cuda:0")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

FORWARD_THROUGH_METHOD = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

SUMMED_LOSS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum")
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

TWO_MODELS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(8, 1)
head = torch.nn.Linear(1, 1)
opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
for epoch in range(3):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(head(model(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

READ_BACK = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    model = torch.nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
        torch.save(model.state_dict(), "last.pt")
    model.load_state_dict(torch.load("last.pt"))


if __name__ == "__main__":
    main()
"""

READ_BACK_TORCHRUN = """\
import torch
from runtime import distributed
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    device = distributed.setup("cuda" if torch.cuda.is_available() else "cpu")
    world = distributed.world()
    dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    sampler = DistributedSampler(dataset) if world.distributed else None
    loader = DataLoader(
        dataset,
        batch_size=distributed.local_batch_size(32),
        shuffle=sampler is None,
        sampler=sampler,
    )
    model = torch.nn.Linear(8, 1).to(device)
    if world.distributed:
        model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        distributed.print0(
            f"epoch {epoch} loss {distributed.all_reduce_mean(loss).item():.4f}"
        )
        if distributed.is_main():
            torch.save(distributed.unwrap(model).state_dict(), "last.pt")
    distributed.barrier()
    distributed.unwrap(model).load_state_dict(torch.load("last.pt"))


if __name__ == "__main__":
    try:
        main()
    finally:
        distributed.cleanup()
"""

TEMPORARY_CHECKPOINT = """\
import tempfile
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    path = tempfile.mktemp()
    model = torch.nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
        torch.save(model.state_dict(), path)
    model.load_state_dict(torch.load(path))


if __name__ == "__main__":
    main()
"""

TEMPORARY_CHECKPOINTER = """\
import tempfile
from runtime.checkpoint import AsyncCheckpointer
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    path = tempfile.mktemp()
    checkpointer = AsyncCheckpointer()
    model = torch.nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
        checkpointer.save(model.state_dict(), path)
    checkpointer.flush()
    model.load_state_dict(torch.load(path))


if __name__ == "__main__":
    main()
"""

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

# The cases below are the scripts above with the one change each is about.
WRAPPED_IN_DDP = LOOP.replace("opt = ", "model = torch.nn.parallel.DistributedDataParallel(model)\nopt = ")
READS_LOCAL_RANK = "import os\n" + LOOP.replace("opt = ", "rank = int(os.environ.get('LOCAL_RANK', 0))\nopt = ")
BATCH_NORM = LOOP.replace(
    "torch.nn.Linear(8, 1)",
    "torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))",
)
GENERATOR_CHANGES_BATCHES = WHILE_STEPS.replace("batches = iter(loader)", "batches = forever(loader)").replace(
    "step, max_steps",
    "def forever(loader):\n    while True:\n        for x, y in loader:\n            yield x, 2 * y\n\n\nstep, max_steps",
)
WHILE_OWN_LOSS = (
    WHILE_STEPS.replace("while step < max_steps:", "while step < max_steps and loss_value > 0.01:")
    .replace("batches = iter(loader)\nwhile", "batches = iter(loader)\nloss_value = 1.0\nwhile")
    .replace("    step += 1\n", "    step += 1\n    loss_value = loss.item()\n")
)
DATA_PARALLEL = LOOP.replace("opt = ", "model = torch.nn.DataParallel(model)\nopt = ")
ONE_SAMPLE_PER_STEP = LOOP.replace("batch_size=32, ", "")
FIXED_GPU = LOOP.replace("torch.nn.Linear(8, 1)", 'torch.nn.Linear(8, 1).to("cuda:0")')
FORWARD_THROUGH_METHOD = LOOP.replace("torch.nn.functional.mse_loss(model(x), y)", "model.loss(x, y)")
SUMMED_LOSS = LOOP.replace("mse_loss(model(x), y)", 'mse_loss(model(x), y, reduction="sum")')
TWO_MODELS = LOOP.replace(
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)",
    "head = torch.nn.Linear(1, 1)\nopt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)",
).replace("mse_loss(model(x), y)", "mse_loss(head(model(x)), y)")
SAVE = '        torch.save(model.state_dict(), "last.pt")\n'
READ_BACK = SCRIPT.replace(SAVE, SAVE + '    model.load_state_dict(torch.load("last.pt"))\n')
SAVE_TORCHRUN = '            torch.save(distributed.unwrap(model).state_dict(), "last.pt")\n'
READ_BACK_TORCHRUN = SCRIPT_TORCHRUN.replace(
    SAVE_TORCHRUN,
    SAVE_TORCHRUN + '    distributed.barrier()\n    distributed.unwrap(model).load_state_dict(torch.load("last.pt"))\n',
)
IN_TEMPORARY_FOLDER = SCRIPT.replace('"last.pt"', "path")
TEMPORARY_CHECKPOINT = "import tempfile\n" + IN_TEMPORARY_FOLDER.replace(
    "    model = torch.nn", "    path = tempfile.mktemp()\n    model = torch.nn"
).replace(
    "        torch.save(model.state_dict(), path)\n",
    "        torch.save(model.state_dict(), path)\n    model.load_state_dict(torch.load(path))\n",
)
TEMPORARY_CHECKPOINTER = (
    "import tempfile\nfrom runtime.checkpoint import AsyncCheckpointer\n"
    + IN_TEMPORARY_FOLDER.replace(
        "    model = torch.nn",
        "    path = tempfile.mktemp()\n    checkpointer = AsyncCheckpointer()\n    model = torch.nn",
    ).replace(
        "        torch.save(model.state_dict(), path)\n",
        "        checkpointer.save(model.state_dict(), path)\n    checkpointer.flush()\n    model.load_state_dict(torch.load(path))\n",
    )
)

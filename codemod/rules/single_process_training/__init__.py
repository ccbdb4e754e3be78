"""PM601 (single-process-training): the rule, and the order in which its fix producers
(the model, the data, setup, gradient accumulation, the outputs) build one plan."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.model_sites import model_sites
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.rules.single_process_training.accumulation import GradientAccumulation
from codemod.rules.single_process_training.data import DataSharding
from codemod.rules.single_process_training.model import ModelWrap
from codemod.rules.single_process_training.outputs import RankZeroOutputs
from codemod.rules.single_process_training.plan import (
    IMPORT_ATEXIT,
    IMPORT_CONTEXTLIB,
    IMPORT_DDP,
    IMPORT_DISTRIBUTED,
    IMPORT_SAMPLER,
    Blocked,
    Plan,
)
from codemod.rules.single_process_training.setup import ProcessGroupSetup

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


class SingleProcessTraining(Rule):
    """
    ## What it does
    Makes a single-process training script ready for `torchrun`, so that the same
    file trains on one GPU with `python train.py` and on N with
    `torchrun --nproc_per_node=N train.py`, using PyTorch's own data-parallel
    engine, DistributedDataParallel (DDP):

    - `device = distributed.setup(...)` (`runtime.distributed`) where the script
      picks its device: under torchrun it joins the process group (NCCL on CUDA,
      gloo on the CPU) and returns this process's GPU (`LOCAL_RANK`); alone it
      returns the device as before and starts nothing. GPU 0 written as an index
      (`device = 0`, as PyTorch's DDP tutorial writes it) becomes `"cuda"`, the
      same GPU alone and each process's own under torchrun;
    - the DataLoader that feeds the training loop gets a `DistributedSampler`
      (the loader's `shuffle` moves into it, with the script's seed) and a batch
      of `distributed.local_batch_size(batch_size)`, so that N processes step on
      the same global batch as one; `sampler.set_epoch(epoch)` reshuffles every
      epoch. A `while` loop that takes its batches with `next(it)` of
      `it = iter(loader)` (`while step < max_steps:`) gets the same sampler,
      told each new epoch where the loop starts a new pass (`it = iter(loader)`
      on `StopIteration`), or, for a generator of the file that cycles the
      loader (`def cycle(dl): while True: for b in dl: yield b`), at the end
      of each of its passes, inside it. A loader whose settings are a dict (`DataLoader(dataset,
      **options)`) gets `distributed.loader_options(dataset, options)`: the
      same share and sampler, whatever the dict holds. A sampler that draws
      `num_samples` with replacement (`RandomSampler(..., replacement=True)`,
      `WeightedRandomSampler`) draws each rank's share of them, from torch's
      generator reseeded per rank (below). Manual batching over a
      `torch.randperm` permutation takes each rank's share of every batch
      instead;
    - the model is wrapped in `DistributedDataParallel` after it is built,
      moved and compiled (the model itself is compiled, then wrapped, as PM506
      does; DDP still hands the compiler its gradient buckets); with gradient
      accumulation the micro-steps that do not step run under
      `model.no_sync()`;
    - `print` becomes `distributed.print0` (rank 0 prints, losses averaged over
      the ranks with `distributed.all_reduce_mean`), `tqdm` bars and
      `logging.info` run on rank 0, `torch.save` only on rank 0, and
      `model.state_dict()` (and any other attribute DDP does not answer) reads
      `distributed.unwrap(model)`, so checkpoints keep the single-process keys;
      a whole model saved (`torch.save(model, path)`, `{"model": model}` saved
      there or bound to a name that is saved, in a function that reads the
      script's `model` too) saves
      `distributed.unwrap(model)`, the model and not its DDP wrapper; a
      checkpoint that every rank reads back after rank 0 saved it waits for a
      `distributed.barrier()`, when its path is the same in every process
      (built from literals, options, config values or environment variables;
      not from `tempfile`, `uuid`, a clock, a random draw or a process id);
    - where the loop draws random numbers itself (nanoGPT's `torch.randint`
      batches, noise) from a global generator the script seeds, each rank
      reseeds it with `seed + distributed.seed_offset()` before training (an
      unseeded one starts from the OS's entropy, per process already), and
      draws `local_batch_size(batch_size)` samples;
    - `distributed.cleanup()` at exit, on error too: checkpoint writes finish and
      `destroy_process_group()` runs.

    It follows the model and the loader into trainer classes (`self.model`
    built in `__init__`, or given to the constructor and moved there, as in
    PyTorch's DDP tutorial), helpers that build the loader, a device passed
    down from where it is chosen, the one call of a
    training function that is given them or reads them as globals built in the
    `__main__` block, and a model moved under a second name (`m =
    model.to(device)`: DDP wraps the name the loop runs). Logged losses are
    averaged as numbers: the operands of `"..." % (...)`, `"...".format(...)`
    and f-strings, never the message itself; losses kept in a list
    (`losses.append(loss.detach())`) are averaged where they are printed,
    before `.item()` or `.tolist()` (`all_reduce_mean(losses[-1]).item()`).

    Files that already run distributed (`torch.distributed`, DDP, FSDP,
    `DistributedSampler`, Accelerate, Lightning, DeepSpeed, Horovod, torchrun's
    environment variables) are left alone. What the rule cannot make safe is
    reported without a fix: BatchNorm layers (each rank would normalise over its
    own share of the batch), a batch that cannot be split over the ranks (the
    global batch would change), random draws in the loop from a generator object
    the script seeds (every rank would draw the same, and reseeding it could
    change what else it draws), `DataParallel`, an `IterableDataset` or a
    sampler of the script's own other than the above, a DataLoader built in
    another module of the project (the rule rewrites the file that trains and
    names where the loader is built), a `while` loop whose batches come from an
    iterator that starts the loader's passes itself, other than a generator
    of the file that only cycles it (`while True: for b in loader: yield b`,
    or `yield from loader`, whose sampler is told each new pass inside it), a training loss with
    `reduction="sum"` (DDP averages the
    gradients; a summed evaluation loss is fine), embeddings with
    `sparse=True` (sparse gradients), epochs run in a comprehension,
    batches that come from somewhere the rule cannot follow, a training
    forward through a method other than `model(...)`, and steps skipped or loops
    left on values each rank computes from its own data (the ranks would fall
    out of step and wait forever).

    ## Why is this bad?
    One process drives one GPU. DDP runs one process per GPU, each on its share
    of every batch, and averages the gradients with an all-reduce that overlaps
    the backward pass: the DDP paper (Li et al., "PyTorch Distributed:
    Experiences on Accelerating Data Parallel Training", VLDB 2020,
    arXiv:2006.15704) reports near-linear scaling to 256 GPUs. On the CPU,
    `perfmod verify --nproc 2` on a small MLP classifier (gloo, a shared
    2-core machine) measured 0.99-1.60x the samples per second
    of one process at a global batch of 1024 and 0.36-0.51x at 32, where
    exchanging gradients costs more than computing them: measure on GPUs.

    Rewriting a script by hand is where it goes wrong: a sampler whose
    `set_epoch` is never called repeats one order every epoch, every rank prints
    and overwrites the same checkpoint, `state_dict()` keys gain a `module.`
    prefix, gradient accumulation all-reduces on every micro-step, and a rank
    that leaves the loop early hangs the others.

    ## Example
    ```python
    def main():
        device = "cuda" if torch.cuda.is_available() else "cpu"
        loader = DataLoader(dataset, batch_size=64, shuffle=True)
        model = Net().to(device)
        for epoch in range(epochs):
            for x, y in loader:
                loss = F.cross_entropy(model(x.to(device)), y.to(device))
                ...
            print(f"epoch {epoch} loss {loss.item():.4f}")
            torch.save(model.state_dict(), "last.pt")

    if __name__ == "__main__":
        main()
    ```
    Use instead:
    ```python
    def main():
        device = distributed.setup("cuda" if torch.cuda.is_available() else "cpu")
        world = distributed.world()
        sampler = DistributedSampler(dataset) if world.distributed else None
        loader = DataLoader(dataset, batch_size=distributed.local_batch_size(64), shuffle=sampler is None, sampler=sampler)
        model = Net().to(device)
        if world.distributed:
            model = DistributedDataParallel(model)
        for epoch in range(epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            for x, y in loader:
                ...
            distributed.print0(f"epoch {epoch} loss {distributed.all_reduce_mean(loss).item():.4f}")
            if distributed.is_main():
                torch.save(distributed.unwrap(model).state_dict(), "last.pt")

    if __name__ == "__main__":
        try:
            main()
        finally:
            distributed.cleanup()
    ```

    ## Options
    Opt-in: the rule runs only when selected by its code
    (`perfmod apply --select PM601 --level unsafe`, or `select = [..., "PM601"]`
    in `[tool.perfmod]`); `PM` and `PM6` do not select it; `ALL` does.

    ## Fix safety
    Unsafe. `python train.py` still trains exactly as before: the process group,
    the sampler and the DDP wrapper exist only when torchrun starts more than one
    process, and `local_batch_size`, `print0`, `all_reduce_mean` and `unwrap`
    are the identity alone (the rule's tests compare the losses and checkpoints
    bit for bit). Under torchrun the results are those of the same global batch
    within floating-point tolerance, with these differences:
    - the sample order is the DistributedSampler's, not the DataLoader's
      (seeded with the script's seed); when the dataset does not split evenly
      the sampler repeats a few samples so that every rank steps equally often;
    - `--batch-size` is the global batch: `local_batch_size` fails on every rank
      when it does not divide by the number of processes; with manual batching
      an uneven last batch is split unevenly;
    - logged losses are means over the ranks; other logged values (accuracy
      counts, sums) are rank 0's own;
    - evaluation loops keep their DataLoaders: every rank evaluates the whole
      set (correct, not faster), and prints on rank 0;
    - in a seeded script, dropout and other draws inside the model draw alike
      on every rank unless the loop draws its own batches (then it reseeds);
    - a sampler drawing with replacement draws other indices than the single
      process (each rank from its own seed): the same distribution, not the
      same batches, so only the trend of the losses compares;
    - files other than `torch.save` checkpoints (JSON, CSV, TensorBoard) are
      written by every rank; guard them with `distributed.is_main()`;
    - `logging.info` calls run on rank 0 with rank 0's values (a mean over
      the ranks would need a collective on every rank);
    - a loss summed over the batch by hand (`.sum()`) is averaged by DDP over
      the ranks, which shrinks its gradient by their number (`reduction="sum"`
      is reported);
    - data the script makes at random without a seed differs between ranks.
    The rewrite does not choose FSDP sharding, tensor or pipeline parallelism:
    models that do not fit one GPU need `torch.distributed.fsdp.fully_shard`
    (FSDP2) or `torch.distributed.tensor.parallel`, set up by hand. Check the
    rewrite with `perfmod verify train.py --nproc 2`.
    """

    CODE = "PM601"
    NAME = "single-process-training"
    LEVEL = Level.UNSAFE
    OPT_IN = True
    REQUIRES = ("backward",)
    MESSAGE = (
        "training runs in one process; make the script torchrun-ready (distributed.setup(), "
        "DistributedDataParallel, each rank its share of every batch, output and checkpoints on rank 0)"
    )
    GAIN = (
        "up to N times the samples per second on N GPUs: near-linear to 256 GPUs in the DDP paper (Li et al., "
        "VLDB 2020, arXiv:2006.15704); on 2 CPU processes (gloo, a shared 2-core box) `perfmod verify --nproc 2` "
        "measured 0.99-1.60x at a batch of 1024 and 0.36-0.51x at 32 on a small MLP classifier"
    )

    VALID = [
        Valid("import torch.distributed as dist\n" + LOOP, "already distributed: torch.distributed"),
        Valid(
            LOOP.replace("opt = ", "model = torch.nn.parallel.DistributedDataParallel(model)\nopt = "),
            "already distributed: DDP",
        ),
        Valid(
            "import os\n" + LOOP.replace("opt = ", "rank = int(os.environ.get('LOCAL_RANK', 0))\nopt = "),
            "reads torchrun's variables",
        ),
        Valid("from accelerate import Accelerator\n" + LOOP, "Accelerate runs the processes"),
        Valid(SCRIPT_TORCHRUN, "the rewrite: runtime.distributed"),
        Valid("import torch\nmodel = torch.nn.Linear(8, 1)\nprint(model(torch.randn(2, 8)))\n", "no training loop"),
    ]
    INVALID = [
        Invalid(SCRIPT, SCRIPT_TORCHRUN, "setup at the device, sampler, DDP, print0, rank-0 save, cleanup"),
        Invalid(
            ACCUMULATION,
            ACCUMULATION_TORCHRUN,
            "module level, `.cuda()`: setup() of its own and atexit; accumulation under no_sync()",
        ),
        Invalid(
            ACCUMULATION + SAVE_WHOLE,
            ACCUMULATION_TORCHRUN + SAVE_WHOLE_TORCHRUN,
            "a function that saves the whole model object the script wrapped (as it is, in a dict, in a dict "
            "bound to a name): the module, not the DDP wrapper; a list of it that is not saved keeps the wrapper",
        ),
        Invalid(
            LOOP.replace(
                "torch.nn.Linear(8, 1)",
                "torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))",
            ),
            None,
            "BatchNorm: SyncBatchNorm is the author's call",
        ),
        Invalid(
            WHILE_STEPS,
            WHILE_STEPS_TORCHRUN,
            "a `while` loop over next(iter(loader)): the sampler is told each new pass",
        ),
        Invalid(
            WHILE_STEPS.replace("batches = iter(loader)", "batches = forever(loader)").replace(
                "step, max_steps",
                "def forever(loader):\n    while True:\n        for x, y in loader:\n            yield x, 2 * y\n\n\n"
                "step, max_steps",
            ),
            None,
            "a generator of the file that changes the batches starts the loader's passes: PM601 does not "
            "rewrite it to tell the sampler the epoch",
        ),
        Invalid(
            WHILE_STEPS.replace("while step < max_steps:", "while step < max_steps and loss_value > 0.01:")
            .replace("batches = iter(loader)\nwhile", "batches = iter(loader)\nloss_value = 1.0\nwhile")
            .replace("    step += 1\n", "    step += 1\n    loss_value = loss.item()\n"),
            None,
            "a `while` loop that ends on each rank's own loss",
        ),
        Invalid(LOOP.replace("opt = ", "model = torch.nn.DataParallel(model)\nopt = "), None, "DataParallel"),
        Invalid(LOOP.replace("batch_size=32, ", ""), None, "one sample per step: the global batch would change"),
        Invalid(
            LOOP.replace("torch.nn.Linear(8, 1)", 'torch.nn.Linear(8, 1).to("cuda:0")'),
            None,
            "a fixed GPU for every rank",
        ),
        Invalid(
            LOOP.replace("torch.nn.functional.mse_loss(model(x), y)", "model.loss(x, y)"),
            None,
            "a forward DDP does not see",
        ),
        Invalid(
            LOOP + "        if loss.item() < 1e-3:\n            break\n", None, "a rank would leave the loop alone"
        ),
        Invalid(
            LOOP + "for x, y in loader:\n    model(x).sum().backward()\n    opt.step()\n", None, "two training loops"
        ),
        Invalid(
            LOOP.replace("mse_loss(model(x), y)", 'mse_loss(model(x), y, reduction="sum")'),
            None,
            "a summed loss: DDP's average would shrink its gradient",
        ),
        Invalid(
            LOOP.replace(
                "opt = torch.optim.SGD(model.parameters(), lr=0.1)",
                "head = torch.nn.Linear(1, 1)\n"
                "opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)",
            ).replace("mse_loss(model(x), y)", "mse_loss(head(model(x)), y)"),
            None,
            "two trained models: each needs its own wrap",
        ),
        Invalid(
            SCRIPT.replace(
                '        torch.save(model.state_dict(), "last.pt")\n',
                '        torch.save(model.state_dict(), "last.pt")\n    model.load_state_dict(torch.load("last.pt"))\n',
            ),
            SCRIPT_TORCHRUN.replace(
                '            torch.save(distributed.unwrap(model).state_dict(), "last.pt")\n',
                '            torch.save(distributed.unwrap(model).state_dict(), "last.pt")\n'
                "    distributed.barrier()\n"
                '    distributed.unwrap(model).load_state_dict(torch.load("last.pt"))\n',
            ),
            "read back what rank 0 saved: a barrier first",
        ),
        Invalid(
            "import tempfile\n"
            + SCRIPT.replace('"last.pt"', "path")
            .replace("    model = torch.nn", "    path = tempfile.mktemp()\n    model = torch.nn")
            .replace(
                "        torch.save(model.state_dict(), path)\n",
                "        torch.save(model.state_dict(), path)\n    model.load_state_dict(torch.load(path))\n",
            ),
            None,
            "a checkpoint in each process's own temporary folder, read back by every rank",
        ),
        Invalid(
            "import tempfile\nfrom runtime.checkpoint import AsyncCheckpointer\n"
            + SCRIPT.replace('"last.pt"', "path")
            .replace(
                "    model = torch.nn",
                "    path = tempfile.mktemp()\n    checkpointer = AsyncCheckpointer()\n    model = torch.nn",
            )
            .replace(
                "        torch.save(model.state_dict(), path)\n",
                "        checkpointer.save(model.state_dict(), path)\n"
                "    checkpointer.flush()\n    model.load_state_dict(torch.load(path))\n",
            ),
            None,
            "the same, saved by a runtime checkpointer (as an earlier fix writes it)",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        plan = Plan(self.context)
        try:
            result = build(plan)
        except Blocked as blocked:
            self.report(
                blocked.node,
                f"training runs in one process, and PM601 cannot make it torchrun-ready: {blocked.message}",
            )
            return
        if result is None:
            return
        message = self.MESSAGE
        if plan.notes:
            message += "; " + "; ".join(plan.notes)
        self.report(result, message, edits=plan.edits, imports=plan.imports)


def build(plan: Plan) -> cst.CSTNode | None:
    """The node the finding goes to when the file is rewritten (edits in `plan.edits`), None
    when the rule has nothing to say; raises Blocked for the first reason not to rewrite."""
    context = plan.context
    if facts.distributed_use(context) is not None or not context.training.loops:
        return None
    blocked = facts.obstacle(context)
    if blocked is not None:
        raise blocked
    loop = plan.loop = context.training.loops[0]
    plan.origin = model_sites(context).site(loop)
    plan.loader = plan.batches.loader(loop.loop)
    setup = ProcessGroupSetup(plan)
    plan.setup = setup.site()
    plan.world_name = plan.fresh("world")
    data, model, outputs = DataSharding(plan), ModelWrap(plan), RankZeroOutputs(plan)
    permutation = data.batches(loop)
    model.wrap()
    GradientAccumulation(plan).no_sync()
    data.seeds(permutation)
    outputs.control_flow()
    outputs.saves()
    outputs.outputs()
    model.unwrap()
    setup.write(setup.cleanup())
    plan.imports.append(IMPORT_DISTRIBUTED)
    order = [IMPORT_CONTEXTLIB, IMPORT_ATEXIT, IMPORT_DDP, IMPORT_SAMPLER, IMPORT_DISTRIBUTED]
    plan.imports = sorted(set(plan.imports), key=order.index)
    return loop.loop

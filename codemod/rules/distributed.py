from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.bindings import argument_for, returned_values
from codemod.analysis.loaders import ENUMERATE, LOOKS_THROUGH, RANDOM, SAME, StepData
from codemod.analysis.loops import own_nodes
from codemod.analysis.names import compound_keyword, integer_value, kwarg, method_name, names_read, positional
from codemod.analysis.periodic import periodic
from codemod.analysis.project import project_of
from codemod.analysis.torch_facts import SAVE_FUNCTIONS, TORCH_SAVES
from codemod.edits import AddKeyword, Edit, InsertAfter, InsertBefore, Replace, Wrap
from codemod.rule import Invalid, Level, Rule, Valid

DATALOADER = "torch.utils.data.DataLoader"
PRINT = ("builtins.print", "print")
TQDM = ("tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "tqdm.trange", "tqdm.auto.trange")
LOGGING_METHODS = {"info", "debug"}
# `DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...)`
BATCH_SIZE_AT, SHUFFLE_AT, SAMPLER_AT, BATCH_SAMPLER_AT = 1, 2, 3, 4
# Datasets cheap and pure to build twice (the sampler needs only their length).
REBUILDABLE_DATASETS = {
    "torch.utils.data.TensorDataset",
    "torch.utils.data.Subset",
    "torch.utils.data.dataset.Subset",
    "torch.utils.data.dataset.TensorDataset",
}
# What DistributedDataParallel answers like the module it wraps; any other attribute of
# the wrapped model is read through distributed.unwrap(model).
DDP_ANSWERS = {
    "parameters",
    "train",
    "eval",
    "zero_grad",
    "to",
    "cuda",
    "cpu",
    "modules",
    "children",
    "buffers",
    "requires_grad_",
    "apply",
    "training",
    "no_sync",
    "forward",
    "half",
    "float",
    "double",
    "bfloat16",
    "type",
}
# Methods that run outside the model's forward pass; a training forward through any
# other method skips DDP's gradient synchronisation.
NOT_FORWARD = DDP_ANSWERS | {
    "state_dict",
    "load_state_dict",
    "named_parameters",
    "named_modules",
    "named_buffers",
    "named_children",
    "get_submodule",
    "get_parameter",
    "get_buffer",
    "register_buffer",
    "save_pretrained",
    "compile",
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
}
# Calls an `if` that saves a checkpoint may make and still run on rank 0 alone:
# no model call, no collective, nothing another rank waits for.
RANK0_SAFE_CALLS = {
    "builtins.print",
    "builtins.str",
    "builtins.len",
    "builtins.dict",
    "builtins.list",
    "builtins.int",
    "builtins.float",
    "builtins.round",
    "builtins.min",
    "builtins.max",
    "builtins.open",
    "copy.deepcopy",
    *SAVE_FUNCTIONS,
    "json.dump",
    "json.dumps",
}
RANK0_SAFE_METHODS = {
    "state_dict",
    "cpu",
    "detach",
    "clone",
    "item",
    "format",
    "join",
    "write",
    "items",
    "keys",
    "values",
    "copy",
    "tolist",
    "numpy",
    "with_suffix",
    "joinpath",
    "replace",
    "unwrap",
    "save_pretrained",
}
RANK0_SAFE_PREFIXES = ("os.", "pathlib.", "shutil.", "logging.")

# Methods that set a model up in place: the DDP wrap goes after the last of them.
CONFIGURES = {
    "to",
    "cuda",
    "compile",
    "load_state_dict",
    "apply",
    "half",
    "float",
    "double",
    "bfloat16",
    "requires_grad_",
    "init_weights",
    "reset_parameters",
    "tie_weights",
}

IMPORT_DISTRIBUTED = ("runtime", "distributed")
IMPORT_SAMPLER = ("torch.utils.data", "DistributedSampler")
IMPORT_DDP = ("torch.nn.parallel", "DistributedDataParallel")
IMPORT_CONTEXTLIB = ("contextlib", None)
IMPORT_ATEXIT = ("atexit", None)


def _expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def _call(func: str, *args: cst.BaseExpression) -> cst.Call:
    return cst.Call(_expr(func), [cst.Arg(a) for a in args])


def _line(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _parenthesized(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` as an operand of `and` / `not`: in parentheses unless it binds tighter."""
    if (
        isinstance(expr, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr, cst.UnaryOperation))
        and not expr.lpar
    ):
        return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return expr


def _and(left: cst.BaseExpression, right: cst.BaseExpression) -> cst.BooleanOperation:
    if isinstance(left, cst.BooleanOperation) and isinstance(left.operator, cst.And) and not left.lpar:
        pass  # `a and b and c` needs no parentheses
    else:
        left = _parenthesized(left)
    return cst.BooleanOperation(left, cst.And(), _parenthesized(right))


def _negated(test: cst.BaseExpression) -> cst.BaseExpression:
    """`not test`, written as a reader would: `a == b` -> `a != b`."""
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        target = test.comparisons[0]
        swap = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}.get(type(target.operator))
        if swap is not None:
            operator = swap(
                whitespace_before=target.operator.whitespace_before, whitespace_after=target.operator.whitespace_after
            )
            return test.with_changes(comparisons=[target.with_changes(operator=operator)])
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return test.expression
    return cst.UnaryOperation(cst.Not(), _parenthesized(test))


class _Blocked(Exception):
    """What keeps the rewrite from being made; reported, without a fix, at `node`."""

    def __init__(self, node: cst.CSTNode, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.message = message


@dataclass
class _Origin:
    """Where the trained model is built: the scope and its spelling there, the last
    statement that builds or moves it (the DDP wrap goes after it), and the spellings
    under which code of other functions sees it."""

    scope: cst.CSTNode  # FunctionDef, ClassDef (for `self.x`) or Module
    code: str
    anchor: cst.SimpleStatementLine
    setup: list[cst.SimpleStatementLine]
    handles: list[tuple[cst.CSTNode, str, cst.CSTNode | None]] = field(default_factory=list)  # (scope, code, after)


@dataclass
class _Setup:
    """Where runtime.distributed.setup() goes."""

    statement: cst.BaseStatement  # the device assignment, or the statement the call goes before
    function: cst.FunctionDef | None
    value: cst.BaseExpression | None  # the device value wrapped in setup(...); None: a statement of its own
    device: cst.BaseExpression | None  # what a statement of its own passes


@dataclass
class _Loader:
    call: cst.Call
    statement: cst.BaseStatement  # the statement that builds it
    function: cst.FunctionDef | None
    handles: dict[int, cst.BaseExpression]  # id(scope) -> how that scope spells the loader
    shared: bool  # built by a helper also used elsewhere


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
      epoch. A loader whose settings are a dict (`DataLoader(dataset,
      **options)`) gets `distributed.loader_options(dataset, options)`: the
      same share and sampler, whatever the dict holds. A sampler that draws
      `num_samples` with replacement (`RandomSampler(..., replacement=True)`,
      `WeightedRandomSampler`) draws each rank's share of them, from torch's
      generator reseeded per rank (below). Manual batching over a
      `torch.randperm` permutation takes each rank's share of every batch
      instead;
    - the model is wrapped in `DistributedDataParallel` after it is built and
      moved (and before `torch.compile`); with gradient accumulation the
      micro-steps that do not step run under `model.no_sync()`;
    - `print` becomes `distributed.print0` (rank 0 prints, losses averaged over
      the ranks with `distributed.all_reduce_mean`), `tqdm` bars and
      `logging.info` run on rank 0, `torch.save` only on rank 0, and
      `model.state_dict()` (and any other attribute DDP does not answer) reads
      `distributed.unwrap(model)`, so checkpoints keep the single-process keys;
      a whole model saved (`torch.save(model, path)`, `{"model": model}` saved
      there or bound to a name that is saved, in a function that reads the
      script's `model` too) saves
      `distributed.unwrap(model)`, the model and not its DDP wrapper;
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
    names where the loader is built), a `while` training loop, a training loss with `reduction="sum"` (DDP averages the
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
    `perfmod verify --nproc 2` on `fixtures/distributed/train_ddp_candidate.py`
    (gloo, a shared 2-core machine) measured 0.99-1.60x the samples per second
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
        "measured 0.99-1.60x at a batch of 1024 and 0.36-0.51x at 32 on fixtures/distributed/train_ddp_candidate.py"
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
        plan = _Planner(self.context)
        try:
            result = plan.build()
        except _Blocked as blocked:
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


class _Planner:
    """Everything PM601 changes in one file, or why it changes nothing."""

    def __init__(self, context) -> None:
        self.context = context
        self.index = context.index
        self.parents = context.parents
        self.edits: list[Edit] = []
        self.imports: list[tuple[str, str | None]] = []
        self.notes: list[str] = []
        self._taken: set[str] | None = None
        self.rank0: list[cst.CSTNode] = []  # code that only rank 0 runs after the rewrite
        self.world_uses: list[cst.CSTNode] = []  # where the `world` variable is read
        self.local_batch: cst.CSTNode | None = None  # the permutation slice each rank takes its share of
        self.batch_statement: cst.CSTNode | None = None  # the statement that draws a random batch
        self.sampler_draws: cst.Call | None = None  # a sampler drawing with replacement, per rank
        self.cuda_for_zero = False  # the device chosen is GPU 0, written `0`: setup() gets "cuda"

    def _calls_of(self, function: cst.FunctionDef) -> list[cst.Call]:
        """facts.calls_of, once per function."""
        if not hasattr(self, "_calls_cache"):
            self._calls_cache: dict[int, list[cst.Call]] = {}
        found = self._calls_cache.get(id(function))
        if found is None:
            found = self._calls_cache[id(function)] = facts.calls_of(self.context, function)
        return found

    @property
    def names(self):
        return self.context.names

    @property
    def scopes(self):
        return self.context.scopes

    @property
    def bindings(self):
        return self.context.bindings

    # -- the plan ------------------------------------------------------------------------------

    def build(self) -> cst.CSTNode | None:
        """The node the finding goes to when the file is rewritten (edits in self.edits), None
        when the rule has nothing to say; raises _Blocked for the first reason not to rewrite."""
        context = self.context
        if facts.distributed_use(context) is not None:
            return None
        loops = context.training.loops
        if not loops:
            return None
        for call in facts.data_parallel(context):
            raise _Blocked(
                call,
                "it uses DataParallel (one process, several GPUs); replace it with "
                "DistributedDataParallel by hand, or remove it and run PM601 again",
            )
        if len(loops) > 1:
            raise _Blocked(loops[1].loop, f"the file has {len(loops)} training loops; PM601 rewrites scripts with one")
        loop = self.loop = loops[0]
        self.step_function = facts.function_of(context, loop.loop)
        for call in facts.batch_norms(context):
            raise _Blocked(
                call,
                f"`{self._src(call.func)}` holds BatchNorm, which would normalise over each rank's "
                "share of the batch instead of the whole batch; on GPUs convert the model with "
                "`torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)` before wrapping it in DDP",
            )
        for call in facts.sparse_embeddings(context):
            raise _Blocked(
                call,
                f"`{self._src(call.func)}(..., sparse=True)` gives the model sparse gradients, which "
                "DistributedDataParallel all-reduces on the gloo backend but not on every NCCL build "
                "(the backend PM601 sets up on GPUs); make the embedding dense or wrap the model by hand",
            )
        for call in context.training.loss_calls(loop):
            reduction = kwarg(call, "reduction")
            if (
                reduction is not None
                and isinstance(reduction.value, cst.SimpleString)
                and reduction.value.evaluated_value == "sum"
                and self.names.startswith(call.func, ("torch.nn",))
            ):
                raise _Blocked(
                    call,
                    'the loss is summed over the batch (reduction="sum"); DDP averages the ranks\' '
                    "gradients, so each step would move by 1/N of the single-process step: use the "
                    "mean, or scale the loss by the number of processes",
                )
        try:
            self.origin = self._model_origin(loop)
        except _Blocked as blocked:
            statement = loop.loop
            library = self.context.loaders.library_iterable(statement.iter) if isinstance(statement, cst.For) else None
            if library is not None:
                raise _Blocked(
                    blocked.node,
                    f"{blocked.message}; and the batches come from `{library}`, not from a DataLoader, "
                    "which PM601 would need to split them over the ranks",
                ) from None
            raise
        self.loader = self._find_loader(loop)
        self.setup = self._setup_site()
        self.setup_scope = self.setup.function
        self.world_name = self._fresh("world")
        permutation = self._batches(loop)
        self._wrap_model()
        self._no_sync()
        self._seeds(permutation)
        self._control_flow()
        self._saves()
        self._outputs()
        self._unwrap()
        hook = self._cleanup()
        self._setup_edits(hook)
        self.imports.append(IMPORT_DISTRIBUTED)
        order = [IMPORT_CONTEXTLIB, IMPORT_ATEXIT, IMPORT_DDP, IMPORT_SAMPLER, IMPORT_DISTRIBUTED]
        self.imports = sorted(set(self.imports), key=order.index)
        return loop.loop

    # -- names -----------------------------------------------------------------------------------

    def _src(self, node: cst.CSTNode) -> str:
        return self.context.module.code_for_node(node).strip()

    def _fresh(self, base: str) -> str:
        if self._taken is None:
            self._taken = {n.value for n in self.index.find(cst.Name)}
        name, number = base, 1
        while name in self._taken:
            number += 1
            name = f"{base}_{number}"
        self._taken.add(name)
        return name

    def _world_check(self, at: cst.CSTNode) -> cst.BaseExpression:
        """`world.distributed` where the `world` variable is visible at `at`, else
        `distributed.world().distributed`."""
        if self._sees_world(at):
            self.world_uses.append(at)
            return _expr(f"{self.world_name}.distributed")
        return _expr("distributed.world().distributed")

    def _sees_world(self, at: cst.CSTNode) -> bool:
        """Is the `world` variable, set right after setup(), bound where `at` runs?"""
        if self.setup_scope is None:
            return True  # a module-level variable: every function reads it
        return facts.function_of(self.context, at) is self.setup_scope and self._follows_setup(at, self.setup)

    def _follows_setup(self, node: cst.CSTNode, setup: _Setup) -> bool:
        """Does `node`, in the function of setup(), run after it?"""
        start = setup.statement
        if not self.index.inside(node, self.parents.get(start)):
            return False
        if setup.value is None:  # setup() goes right before `start`
            return self.index.inside(node, start) or self.index.before(start, node)
        return self.index.before(start, node) and not self.index.inside(node, start)

    def _visible(self, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Can `expr` be evaluated at `at` (every name it reads bound there before it)?"""
        scope = self.scopes.get(at)
        if scope is None:
            return False
        for name in names_read(expr):
            found = scope[name.value]
            if not found:
                return False
            if not any(
                a.scope is not scope
                or not isinstance(getattr(a, "node", None), cst.CSTNode)
                or a.node not in self.index
                or self.index.before(a.node, at)
                for a in found
            ):
                return False
        return True

    def _enclosing_loops(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """Loops around `node` in its function, innermost first."""
        found = []
        for ancestor in self.index.ancestors(node):
            if isinstance(ancestor, facts.SCOPES):
                break
            if isinstance(ancestor, (cst.For, cst.While)):
                found.append(ancestor)
        return found

    # -- the model -------------------------------------------------------------------------------

    def _model_origin(self, loop) -> _Origin:
        """Where the trained model is built, following the one call of a training function
        that is given it."""
        code = self._trained_model(loop)
        handles: list[tuple[cst.CSTNode, str, cst.CSTNode | None]] = []
        scope: cst.FunctionDef | None = self.step_function
        limit: cst.CSTNode = loop.loop
        for _ in range(4):
            if code.startswith("self.") and code[5:].isidentifier():
                return self._attribute_origin(code, scope, handles)
            if not code.isidentifier():
                raise _Blocked(
                    loop.loop, f"the model is `{code}`; PM601 wraps models held in a variable or `self.` attribute"
                )
            setup = self._setup_statements(code, limit)
            forward = [a for a, _ in self._second_names(setup, code) if self._forwards_through(a) is not None]
            if len(forward) == 1 and self._forwards_through(code) is None:
                # `m = model.to(device)`, the optimizer given `model`'s parameters and the loop
                # running `m`: one module under two names; DDP wraps the name the loop runs.
                code = forward[0]
                setup = self._setup_statements(code, limit)
            if any(self._binds(s, code) for s in setup):
                anchor = self._anchor(setup, code)
                self._check_not_rebound(code, anchor, scope)
                self._check_second_names(setup, code)
                handles.insert(0, (scope if scope is not None else self.context.module, code, anchor))
                return _Origin(scope or self.context.module, code, anchor, setup, handles)
            params = {p.name.value: p for p in scope.params.params} if isinstance(scope, cst.FunctionDef) else {}
            outer = self._outer_binding(scope, code) if code not in params else None
            if outer is not None:  # a global (or a closure's variable) set where the function is called
                handles.insert(0, (scope, code, None))
                limit, scope = outer
                continue
            if code not in params:
                built = self.context.bound_in_compound(code, limit)
                if built is not None:
                    raise _Blocked(
                        loop.loop,
                        f"`{code}` is built inside the `{compound_keyword(built)}` statement at line "
                        f"{self.context.line(built)}, not by one statement PM601 can wrap after; wrap it in "
                        f"DistributedDataParallel after that statement",
                    )
                raise _Blocked(
                    loop.loop,
                    f"`{code}` is not built in the function that trains it, nor passed to it; "
                    "wrap it in DistributedDataParallel where it is built",
                )
            calls = self._calls_of(scope)
            if len(calls) != 1:
                raise _Blocked(
                    loop.loop,
                    f"`{scope.name.value}` trains the model it is given and is called "
                    f"{len(calls)} times; PM601 follows one call",
                )
            argument = argument_for(calls[0], scope, params[code])
            if argument is None:
                raise _Blocked(calls[0], f"it cannot tell which model this call passes as `{code}`")
            handles.insert(0, (scope, code, None))
            code = self._src(argument)
            limit = self.index.statement_of(calls[0])
            scope = facts.function_of(self.context, calls[0])
        raise _Blocked(loop.loop, "the model is passed through too many functions")

    def _outer_binding(self, scope, code: str) -> tuple[cst.CSTNode, cst.FunctionDef | None] | None:
        """For a function that reads `code` without binding it: the statement of its one
        call and the scope around it, when that scope is where `code` lives (the module,
        for a global set in the `__main__` block; the enclosing function, for a closure)."""
        if (
            not isinstance(scope, cst.FunctionDef)
            or facts.class_of(self.context, scope) is not None
            or code in facts.assigned_names(self.context, scope)
        ):
            return None
        calls = self._calls_of(scope)
        if len(calls) != 1:
            return None
        caller = facts.function_of(self.context, calls[0])
        if caller is not facts.function_of(self.context, scope):
            return None  # called from somewhere other than where it is defined
        return self.index.statement_of(calls[0]), caller

    def _trained_model(self, loop) -> str:
        """How the loop spells the one model its optimizers train (not a frozen teacher
        it also calls); raises when they train several (a GAN) or it cannot tell."""
        training = self.context.training
        trained: list[str] = []
        unknown = False
        for optimizer in loop.optimizers:
            found = training.parameter_models(optimizer.params) if optimizer.params is not None else None
            if found is None:
                unknown = True
                continue
            for model in found:
                if self._src(model) not in trained:
                    trained.append(self._src(model))
        if len(trained) > 1:
            raise _Blocked(
                loop.loop,
                f"the loop trains several models ({', '.join(f'`{t}`' for t in trained)}); wrap "
                "each in DistributedDataParallel by hand (two forwards of one DDP model per "
                "step need `static_graph` or separate wrappers)",
            )
        if len(trained) == 1 and not unknown:
            return trained[0]
        models = [m.expression for m in loop.models]
        if len(models) == 1 or (trained and models and models[0] == trained[0]):
            return models[0]
        raise _Blocked(
            loop.loop,
            "it cannot tell which model this loop trains"
            if not models
            else f"it cannot tell which of {', '.join(f'`{m}`' for m in models)} the optimizer trains",
        )

    def _attribute_origin(self, code: str, scope, handles) -> _Origin:
        classdef = facts.class_of(self.context, scope)
        if classdef is None:
            raise _Blocked(self.loop.loop, f"`{code}` is not an attribute of a class this file defines")
        owners: dict[int, tuple[cst.FunctionDef, list]] = {}
        for method in classdef.body.body:
            if not isinstance(method, cst.FunctionDef):
                continue
            for statement in method.body.body:
                if isinstance(statement, cst.SimpleStatementLine) and any(
                    self._sets_up(s, code) for s in statement.body
                ):
                    owners.setdefault(id(method), (method, []))[1].append(statement)
        building = [(m, s) for m, s in owners.values() if any(self._binds(x, code) for x in s)]
        if len(building) != 1 or len(owners) != 1:
            raise _Blocked(
                self.loop.loop,
                f"`{code}` is built or moved in {len(owners) or 'no'} methods; PM601 wraps a model built in one",
            )
        method, setup = building[0]
        anchor = self._anchor(setup, code)
        handles.insert(0, (classdef, code, anchor))
        return _Origin(classdef, code, anchor, setup, handles)

    @staticmethod
    def _sets_up(small: cst.BaseSmallStatement, code: str) -> bool:
        """`code = ...`, `code: T = ...`, or `code.method(...)` that moves or loads it (`.to(device)`,
        `.cuda()`, `.load_state_dict(...)`)."""
        if isinstance(small, cst.Assign):
            return any(_code(t.target) == code for t in small.targets) or _Planner._moved_copy(small, code)
        if isinstance(small, cst.AnnAssign):
            return (_code(small.target) == code and small.value is not None) or _Planner._moved_copy(small, code)
        return (
            isinstance(small, cst.Expr)
            and isinstance(small.value, cst.Call)
            and isinstance(small.value.func, cst.Attribute)
            and _code(small.value.func.value) == code
            and small.value.func.attr.value in CONFIGURES
        )

    @staticmethod
    def _moved_copy(small: cst.Assign | cst.AnnAssign, code: str) -> bool:
        """`m = code.to(device)` / `m = code.cuda()`: a module moves in place, so this moves
        `code` and gives it a second name."""
        value = small.value
        return (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("to", "cuda")
            and _code(value.func.value) == code
        )

    @staticmethod
    def _binds(statement: cst.SimpleStatementLine, code: str) -> bool:
        for small in statement.body:
            if isinstance(small, cst.Assign) and any(_code(t.target) == code for t in small.targets):
                return True
            if isinstance(small, cst.AnnAssign) and _code(small.target) == code and small.value is not None:
                return True
        return False

    def _second_names(self, setup: list, code: str) -> list[tuple[str, cst.CSTNode]]:
        """The other names that `m = code.to(device)` statements among `setup` give the model."""
        found = []
        for statement in setup:
            for small in statement.body:
                if isinstance(small, (cst.Assign, cst.AnnAssign)) and self._moved_copy(small, code):
                    targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                    found.extend((_code(t), small) for t in targets if _code(t) != code and _code(t).isidentifier())
        return found

    def _forwards_through(self, name: str) -> cst.Call | None:
        """A call of the model under `name` (`name(x)`, `name.forward(x)`) in the step loop."""
        for call in self.index.find(cst.Call, within=self.loop.loop):
            func = call.func.value if method_name(call) == "forward" else call.func
            if isinstance(func, cst.Name) and func.value == name:
                return call
        return None

    def _check_second_names(self, setup: list, code: str) -> None:
        """`m = model.to(device)` before the wrap of `model`: `m` stays the bare module, so a
        training forward through `m` would skip DDP's gradient synchronisation."""
        for alias, small in self._second_names(setup, code):
            call = self._forwards_through(alias)
            if call is not None:
                raise _Blocked(
                    call,
                    f"`{alias} = {_code(small.value)}` gives the model a second name, and the loop runs "
                    f"it as both `{code}` and `{alias}`; the DDP wrap would rebind only one: use one name",
                )

    def _setup_statements(self, code: str, limit: cst.CSTNode) -> list[cst.SimpleStatementLine]:
        """Statements before `limit`, in the blocks around it up to its function, that build
        or move the model `code`, in code order."""
        found = []
        child, parent = limit, self.parents.get(limit)
        while parent is not None:
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                for statement in parent.body:
                    if statement is child:
                        break
                    if isinstance(statement, cst.SimpleStatementLine) and any(
                        self._sets_up(s, code) for s in statement.body
                    ):
                        found.append(statement)
            if isinstance(parent, facts.SCOPES):
                break
            child, parent = parent, self.parents.get(parent)
        return sorted(found, key=self.index.order)

    def _is_compile(self, statement: cst.SimpleStatementLine, code: str) -> bool:
        for small in statement.body:
            value = small.value if isinstance(small, (cst.Assign, cst.AnnAssign, cst.Expr)) else None
            if isinstance(value, cst.Call) and (
                self.names.is_(value.func, "torch.compile")
                or (method_name(value) == "compile" and _code(value.func.value) == code)
            ):
                return True
        return False

    def _anchor(self, setup: list, code: str) -> cst.SimpleStatementLine:
        """The last statement that builds or moves the model before it is compiled."""
        kept = [s for s in setup if not self._is_compile(s, code)]
        if not kept:
            raise _Blocked(
                setup[-1],
                f"`{code}` is compiled where it is built; wrap it in DistributedDataParallel "
                "before torch.compile by hand",
            )
        compiles = [s for s in setup if self._is_compile(s, code)]
        if compiles and self.index.before(compiles[0], kept[-1]):
            raise _Blocked(compiles[0], f"`{code}` is compiled before it is moved; DDP goes between the two")
        return kept[-1]

    def _check_not_rebound(self, code: str, anchor: cst.SimpleStatementLine, scope) -> None:
        owner = scope if scope is not None else self.context.module
        for name in self.index.find(cst.Name, within=owner):
            if name.value != code or not self.index.before(anchor, name) or self.index.inside(name, anchor):
                continue
            if facts.function_of(self.context, name) is not scope:
                continue
            parent = self.parents.get(name)
            if isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For)) and parent.target is name:
                statement = self.index.statement_of(name)
                if not (isinstance(statement, cst.SimpleStatementLine) and self._is_compile(statement, code)):
                    raise _Blocked(
                        statement,
                        f"`{code}` is bound again after line {self.context.line(anchor)}; "
                        "the DDP wrap would not be the model trained",
                    )

    def _wrap_model(self) -> None:
        origin = self.origin
        check = self._world_check(origin.anchor)
        wrap = cst.If(check, cst.IndentedBlock([_line(f"{origin.code} = DistributedDataParallel({origin.code})\n")]))
        # The anchor becomes [anchor, wrap] rather than getting the wrap inserted after it: what
        # other rules insert after the anchor (PM506's `model.compile()`) then follows the wrap,
        # and DDP is compiled whole (DDPOptimizer splits its graph at the gradient buckets).
        self.edits.append(Replace(origin.anchor, lambda updated: cst.FlattenSentinel([updated, wrap])))
        self.imports.append(IMPORT_DDP)

    # -- setup() -------------------------------------------------------------------------------

    def _needs(self) -> list[tuple[cst.CSTNode, str]]:
        """Code that needs the process group (or the `world` variable), with what it does."""
        needs = [(self.origin.anchor, "the model is wrapped in DistributedDataParallel")]
        if self.loader is not None:
            needs.append((self.loader.statement, "the DistributedSampler is built"))
        loop = self.loop.loop
        needs.append(([loop, *self._enclosing_loops(loop)][-1], "training starts"))
        return needs

    def _setup_site(self) -> _Setup:
        """Where the device is chosen: that value becomes `distributed.setup(value)`; where it
        is chosen too late (after the loader or the model), or nowhere, `distributed.setup(...)`
        goes before the first statement that needs it."""
        origin = self.origin
        device = self._model_device()
        needs = self._needs()
        device = self._passed_device(device)
        if device is not None and isinstance(device, (cst.Name, cst.Attribute)):
            statement, value = (
                self._single_assignment(device) if isinstance(device, cst.Name) else self._attribute_assignment(device)
            )
            if statement is not None:
                zeros = self._check_device_index(value, chosen=True)
                setup = _Setup(statement, facts.function_of(self.context, statement), value, None)
                if all(self._after_setup(node, setup) for node, _ in needs):
                    self.cuda_for_zero = value in zeros  # `device = 0`: the value itself
                    self.edits.extend(Replace(zero, _expr('"cuda"')) for zero in zeros if zero is not value)
                    return setup
                self._check_device_index(value)
                device = value  # chosen too late: setup() goes earlier, with the same value
        first = origin.setup[0]
        if (
            self.loader is not None
            and facts.function_of(self.context, self.loader.statement) is facts.function_of(self.context, first)
            and self.index.before(self.loader.statement, first)
            and self.index.inside(first, self.parents.get(self.loader.statement))
        ):
            first = self.loader.statement
        if device is None:
            device = _expr('"cpu"')
        if not self._visible(device, first):
            raise _Blocked(
                first,
                f"the device (`{self._src(device)}`) is chosen after the code that needs the process "
                "group; choose it before the DataLoader and the model are built",
            )
        setup = _Setup(first, facts.function_of(self.context, first), None, device)
        for node, what in needs:
            if not self._after_setup(node, setup):
                raise _Blocked(
                    node,
                    f"{what} at line {self.context.line(node)}, in code that may run before the "
                    f"device is chosen (line {self.context.line(first)}); PM601 puts "
                    "distributed.setup() where the device is chosen",
                )
        return setup

    def _passed_device(self, device: cst.BaseExpression | None) -> cst.BaseExpression | None:
        """The device as the code chooses it: a parameter (`self.gpu_id = gpu_id` in `__init__`,
        `main(device, ...)`) followed to what the one call of its function passes."""
        for _ in range(6):
            if isinstance(device, cst.Attribute):
                values = self.bindings.attribute_values(device)
                if not values or len(values) != 1 or not isinstance(values[0], cst.Name):
                    return device
                if self.bindings.param_of(values[0]) is None:
                    return device
                device = values[0]
            if not isinstance(device, cst.Name):
                return device
            parameter = self.bindings.param_of(device)
            if parameter is None:
                return device
            function, param = parameter
            calls = self._calls_of(function)
            passed = facts.argument_of(self.context, calls[0], function, param) if len(calls) == 1 else None
            if passed is None:
                return device
            device = passed
        return device

    def _model_device(self) -> cst.BaseExpression | None:
        """The device the model's last move puts it on (`"cuda"` for `.cuda()`), None when
        it is not moved (a CPU script); raises for a fixed GPU or a move it cannot read."""
        moves = [
            call
            for statement in self.origin.setup
            for call in self.index.find(cst.Call, within=statement)
            if method_name(call) in ("to", "cuda")
        ]
        for call in reversed(moves):
            if method_name(call) == "cuda":
                if call.args:
                    raise _Blocked(call, "the model is placed on a fixed GPU (`.cuda(N)`); every rank would use it")
                return _expr('"cuda"')
            found = kwarg(call, "device") or positional(call, 0)
            if found is not None and not self.context.kinds.is_dtype(found.value):
                self._check_device_index(found.value)
                return found.value
        if self.context.training.cuda_use is not None:
            raise _Blocked(self.origin.anchor, "it cannot tell which device the model is moved to")
        return None

    def _check_device_index(self, value: cst.BaseExpression, chosen: bool = False) -> list[cst.Integer]:
        """Raises for a fixed GPU, which every rank would use. GPU 0 where the script chooses
        its one device (`chosen`: the value setup() gets, which every use reads) is the GPU a
        single process uses by default; those indices come back, to become "cuda", which
        setup() makes each process's own GPU and which, alone, is still GPU 0."""
        zeros = []
        for string in self.index.find(cst.SimpleString, within=value):
            text = string.evaluated_value
            if isinstance(text, str) and text.startswith("cuda:"):
                raise _Blocked(
                    string,
                    f'the device is the fixed GPU {text!r}; every rank would use it (write "cuda": '
                    "setup() gives each process its own)",
                )
        if isinstance(value, cst.Call) and self.names.is_(value.func, "torch.device") and len(value.args) > 1:
            raise _Blocked(value, "the device is a fixed GPU; every rank would use it")
        branches = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
        for branch in branches:
            if isinstance(branch, cst.Integer) and chosen and integer_value(branch) == 0:
                zeros.append(branch)
            elif isinstance(branch, cst.Integer):
                raise _Blocked(
                    branch,
                    f"the device is GPU {branch.value} (an index is a CUDA device); every rank would use it "
                    '(write "cuda": setup() gives each process its own)',
                )
        return zeros

    def _single_assignment(self, name: cst.Name):
        """(statement, value) of the one plain `name = value` line that binds `name`."""
        found = facts.bindings_of(self.context, name)
        if len(found) != 1:
            return None, None
        value = self.bindings.assigned_value(found[0])
        statement = self.index.statement_of(found[0].node)
        if (
            value is None
            or not isinstance(statement, cst.SimpleStatementLine)
            or len(statement.body) != 1
            or not isinstance(self.parents.get(statement), (cst.IndentedBlock, cst.Module))
        ):
            return None, None
        return statement, value

    def _attribute_assignment(self, attribute: cst.Attribute):
        """(statement, value) of the one `self.device = value` line of the class."""
        if not (isinstance(attribute.value, cst.Name) and attribute.value.value == "self"):
            return None, None
        classdef = self.index.first_enclosing(attribute, cst.ClassDef)
        if classdef is None:
            return None, None
        code = _code(attribute)
        found = [
            a
            for a in self.index.find(cst.Assign, within=classdef)
            if len(a.targets) == 1 and _code(a.targets[0].target) == code
        ]
        if len(found) != 1:
            return None, None
        statement = self.index.statement_of(found[0])
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None, None
        return statement, found[0].value

    def _after_setup(self, node: cst.CSTNode, setup: _Setup) -> bool:
        """Does `node` run after setup() (in its function, below it; in another function,
        one called from there after it, or a method of the object `__init__` set up)?"""
        function = facts.function_of(self.context, node)
        if function is setup.function:
            return self._follows_setup(node, setup)
        if setup.function is None:
            return True  # a function of the module, called after its top-level code ran
        seen: set[int] = set()
        init_class = facts.class_of(self.context, setup.function) if setup.function.name.value == "__init__" else None
        while function is not None and id(function) not in seen:
            seen.add(id(function))
            if init_class is not None and facts.class_of(self.context, function) is init_class:
                return True
            calls = self._calls_of(function)
            if len(calls) != 1:
                return False
            caller = facts.function_of(self.context, calls[0])
            if caller is setup.function:
                return self._follows_setup(calls[0], setup)
            function = caller
        return False

    def _setup_edits(self, hook: cst.BaseStatement | None) -> None:
        """setup() and the `world` variable first among the edits (statements inserted at the
        same place go in the order of their edits), with the atexit hook when there is one."""
        setup = self.setup
        lines: list[cst.BaseStatement] = []
        edits: list[Edit] = []
        if setup.value is not None:
            chosen = _expr('"cuda"') if self.cuda_for_zero else None
            edits.append(Replace(setup.value, lambda value: _call("distributed.setup", chosen or value)))
        else:
            lines.append(cst.SimpleStatementLine([cst.Expr(_call("distributed.setup", setup.device))]))
        if self.world_uses:
            lines.append(_line(f"{self.world_name} = distributed.world()\n"))
        if hook is not None:
            lines.append(hook)
        if lines:
            edits.append(
                InsertBefore(setup.statement, tuple(lines))
                if setup.value is None
                else InsertAfter(setup.statement, tuple(lines))
            )
        self.edits[:0] = edits

    # -- batches -------------------------------------------------------------------------------

    def _find_loader(self, loop) -> _Loader | None:
        statement = loop.loop
        if not isinstance(statement, cst.For):
            raise _Blocked(
                statement,
                "the training loop is a `while` loop; PM601 splits the batches of a `for` loop "
                "over a DataLoader or over a permutation",
            )
        found = self.context.loaders.iterated(statement.iter, statement.target)
        return self._loader(found[0][0] if len(found) == 1 else statement.iter)

    def _batches(self, loop) -> cst.Call | None:
        """Split the batches of the training loop over the ranks: a DistributedSampler for its
        DataLoader, or each rank's share of a manual permutation batch. Returns the call drawing
        a shared permutation (which must not be reseeded per rank), if any."""
        statement = loop.loop
        if self.loader is not None:
            self._shard_loader(self.loader, statement)
            return None
        permutation = self._manual_batches(statement)
        if permutation is not None:
            return permutation
        if self._random_batches(statement):
            return None
        data = self.context.loaders.step_data(statement)
        if data is not None:
            raise _Blocked(statement.iter, self._step_data_reason(statement, data))
        elsewhere = self._built_elsewhere(statement)
        if elsewhere is not None:
            raise _Blocked(
                statement.iter,
                f"the batches of `{self._src(statement.iter)}` come from a DataLoader that another module "
                f"of the project builds ({elsewhere}); PM601 rewrites only the file that trains: give that "
                "DataLoader a DistributedSampler and the per-rank batch size there",
            )
        raise _Blocked(
            statement.iter,
            f"it cannot tell where the batches of `{self._src(statement.iter)}` come from, "
            "so it cannot split them over the ranks; use a DataLoader",
        )

    def _built_elsewhere(self, loop: cst.For) -> str | None:
        """`path:line` of the DataLoader construction in another module of the project that
        the loop's batches come from (`train, val = get_loaders()` of `from data import ...`)."""
        loaders = self.context.loaders
        found = loaders.iterated(loop.iter, loop.target)
        if len(found) != 1:
            return None
        for source in loaders.sources(found[0][0], (), 0):
            external = loaders.external.get(id(source))
            if external is not None:
                _, function, _ = external
                return project_of(self.context).shown(function, source)
        return None

    def _step_data_reason(self, loop: cst.For, data: StepData) -> str:
        """Why PM601 does not split the steps of `loop` over ranks: what its data is (RANDOM, SAME, OUTSIDE)."""
        if data.how == RANDOM:
            return (
                f"each step draws its batch at random (`{self._src(data.at)}`, line {self.context.line(data.at)}), "
                "in a way PM601 does not split (one draw in the loop whose first dimension is the batch size); "
                "give each rank its own seed so that the ranks draw different batches"
            )
        if data.how == SAME:
            return (
                f"every step trains on the same data (full-batch training: `{self._src(loop.iter)}` "
                "counts the steps and the loop draws no batch), so there are no batches to split over the "
                "ranks; training on several GPUs needs the data itself split, a part per rank"
            )
        return (
            f"each step's data comes from `{self._src(data.at)}` (line {self.context.line(data.at)}), "
            "not from a dataset, so there are no batches to split over the ranks; each rank would need "
            "its own source (its own seed, its own environment)"
        )

    def _loader(self, expr: cst.BaseExpression) -> _Loader | None:
        """The DataLoader construction `expr` evaluates to, through variables, `self.`
        attributes, a helper that returns it and a parameter of the training function."""
        handles: dict[int, cst.BaseExpression] = {}
        shared = False
        for _ in range(8):
            scope = facts.function_of(self.context, expr)
            if isinstance(expr, (cst.Name, cst.Attribute)):
                handles.setdefault(id(scope), expr)
            if isinstance(expr, cst.Call):
                if self.names.is_(expr.func, DATALOADER) and not self.names.local(expr.func):
                    statement = self.index.statement_of(expr)
                    return _Loader(expr, statement, facts.function_of(self.context, expr), handles, shared)
                helper = self.bindings.local_function(expr.func)
                if helper is None:
                    return None
                values = returned_values(helper)
                if len(values) != 1:
                    return None
                shared = shared or len(self._calls_of(helper)) != 1
                expr = values[0]
                continue
            if isinstance(expr, cst.Name):
                parameter = self.bindings.param_of(expr)
                if parameter is not None:
                    function, param = parameter
                    calls = self._calls_of(function)
                    if len(calls) != 1:
                        return None
                    expr = facts.argument_of(self.context, calls[0], function, param)
                    if expr is None:
                        return None
                    continue
                values = self.bindings.values(expr)
                if not values or len(values) != 1:
                    return None
                expr = values[0]
                continue
            if isinstance(expr, cst.Attribute):
                values = self.bindings.attribute_values(expr)
                if not values or len(values) != 1:
                    return None
                expr = values[0]
                continue
            return None
        return None

    def _shard_loader(self, loader: _Loader, loop: cst.For) -> None:
        call, statement = loader.call, loader.statement
        if loader.shared:
            raise _Blocked(
                call,
                "the helper that builds this DataLoader builds others too (evaluation?); give the "
                "training loader a DistributedSampler by hand",
            )
        if any(a.star for a in call.args):
            self._share_options(loader, loop)
            return
        own_sampler = kwarg(call, "sampler") or positional(call, SAMPLER_AT)
        if (kwarg(call, "batch_sampler") or positional(call, BATCH_SAMPLER_AT)) is not None:
            raise _Blocked(call, "the DataLoader has its own `batch_sampler`; split it over the ranks by hand")
        if not isinstance(self.parents.get(statement), (cst.IndentedBlock, cst.Module)):
            raise _Blocked(call, "the DataLoader is not built in a statement of its own")
        if self.index.inside(statement, loop) or any(
            self.index.inside(statement, outer) for outer in self._enclosing_loops(loop)
        ):
            raise _Blocked(call, "a new DataLoader is built every epoch; build it once, before the loop")
        dataset = kwarg(call, "dataset") or positional(call, 0)
        if dataset is None:
            raise _Blocked(call, "the DataLoader has no dataset argument PM601 can read")
        self._check_dataset(dataset.value)
        size = kwarg(call, "batch_size") or positional(call, BATCH_SIZE_AT)
        if size is None or integer_value(size.value) == 1:
            raise _Blocked(
                call,
                "the DataLoader yields one sample per step, which cannot be split over the ranks "
                "(the global batch would grow with their number); give it a batch_size",
            )
        if isinstance(size.value, cst.Name) and size.value.value == "None":
            raise _Blocked(call, "the DataLoader does not batch (batch_size=None); split its batches by hand")
        if own_sampler is not None:
            self._share_draws(own_sampler.value, call)
            self.edits.append(Replace(size.value, lambda value: _call("distributed.local_batch_size", value)))
            return
        sampler_name = self._fresh("sampler")
        check = self._world_check(statement)
        shuffle = kwarg(call, "shuffle") or positional(call, SHUFFLE_AT)
        literal = shuffle.value.value if shuffle is not None and isinstance(shuffle.value, cst.Name) else None
        shuffled = shuffle is not None and literal != "False"
        arguments = [cst.Arg(dataset.value)]
        if not shuffled:
            arguments.append(cst.Arg(_expr("False"), keyword=cst.Name("shuffle")))
        elif literal != "True":
            arguments.append(cst.Arg(shuffle.value, keyword=cst.Name("shuffle")))
        seed = self._sampler_seed(call, statement) if shuffled else None
        if seed is not None:
            arguments.append(cst.Arg(seed, keyword=cst.Name("seed")))
        space = cst.SimpleWhitespace(" ")
        arguments = [a.with_changes(comma=cst.Comma(whitespace_after=space)) for a in arguments[:-1]] + arguments[-1:]
        arguments = [
            a.with_changes(equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
            if a.keyword is not None
            else a
            for a in arguments
        ]
        sampler = cst.IfExp(test=check, body=cst.Call(cst.Name("DistributedSampler"), arguments), orelse=_expr("None"))
        self.edits.append(
            InsertBefore(
                statement, (cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(sampler_name))], sampler)]),)
            )
        )
        self.edits.append(Replace(size.value, lambda value: _call("distributed.local_batch_size", value)))
        if shuffled:
            absent = _expr(f"{sampler_name} is None")
            if literal == "True":
                self.edits.append(Replace(shuffle.value, absent))
            else:
                self.edits.append(Replace(shuffle.value, lambda value: _and(value, absent)))
        self.edits.append(AddKeyword(call, "sampler", cst.Name(sampler_name)))
        self.imports.append(IMPORT_SAMPLER)
        self._set_epoch(loader, loop, sampler_name)

    def _share_options(self, loader: _Loader, loop: cst.For) -> None:
        """`DataLoader(dataset, **options)`: the options this process needs, from
        `distributed.loader_options(dataset, options)` (its share of the batch, a
        DistributedSampler), whatever the dict holds; its sampler told each epoch."""
        call = loader.call
        stars = [a for a in call.args if a.star]
        plain = [a for a in call.args if not a.star and a.keyword is None]
        named = {a.keyword.value for a in call.args if a.keyword is not None}
        if (
            [a.star for a in stars] != ["**"]
            or len(plain) != 1
            or named
            & {
                "dataset",
                "batch_size",
                "shuffle",
                "sampler",
                "batch_sampler",
            }
        ):
            raise _Blocked(
                call,
                "the DataLoader takes `*args`/`**kwargs` beside its own batch or sampler arguments; "
                "PM601 cannot see which of them it uses",
            )
        dataset = plain[0].value
        self._check_dataset(dataset)  # a dataset built in the call is one cheap to build twice
        options = stars[0].value
        arguments = [cst.Arg(dataset), cst.Arg(options)]
        seed = self._sampler_seed(call, loader.statement)
        if seed is not None:
            tight = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
            arguments.append(cst.Arg(seed, keyword=cst.Name("seed"), equal=tight))
        self.edits.append(Replace(options, cst.Call(_expr("distributed.loader_options"), arguments)))
        self.imports.append(IMPORT_SAMPLER)
        self._set_epoch(loader, loop, None)

    def _share_draws(self, sampler: cst.BaseExpression, call: cst.Call) -> None:
        """A sampler that draws `num_samples` indices with replacement from torch's global
        generator: each rank draws its share of them (`local_batch_size(num_samples)`),
        from that generator reseeded per rank (see _seeds). Together the ranks draw as
        many indices an epoch as the one process, each at random: the same distribution,
        other indices. Any other sampler of the script's own is left to the user."""
        reason = f"the DataLoader has its own `sampler` (`{self._src(sampler)}`); split it over the ranks by hand"
        value = sampler
        if isinstance(value, cst.Name):
            values = self.bindings.values(value) or []
            value = values[0] if len(values) == 1 else None
        if not isinstance(value, cst.Call) or any(a.star for a in value.args):
            raise _Blocked(call, reason)
        qualified = next((n for n in self.names.of(value.func) if n in facts.REPLACEMENT_SAMPLERS), None)
        if qualified is None:
            raise _Blocked(call, reason)
        replacement = kwarg(value, "replacement") or positional(
            value, 1 if qualified not in facts.WEIGHTED_SAMPLERS else 2
        )
        drawn = _code(replacement.value) if replacement is not None else None
        if drawn != "True" and not (drawn is None and qualified in facts.WEIGHTED_SAMPLERS):
            raise _Blocked(
                call,
                f"{reason}: without replacement it draws a permutation, which the ranks would have to share",
            )
        if kwarg(value, "generator") is not None:
            raise _Blocked(
                call,
                f"{reason}: it draws from a generator of its own, seeded alike on every rank",
            )
        count = kwarg(value, "num_samples") or positional(value, facts.REPLACEMENT_SAMPLERS[qualified])
        if count is None:
            raise _Blocked(
                call,
                f"{reason}: it draws len(dataset) indices an epoch; give it `num_samples`, which PM601 "
                "splits over the ranks",
            )
        self.edits.append(Replace(count.value, lambda value: _call("distributed.local_batch_size", value)))
        self.sampler_draws = value

    def _check_dataset(self, dataset: cst.BaseExpression) -> None:
        if isinstance(dataset, cst.Call):
            if not self.names.is_(dataset.func, *REBUILDABLE_DATASETS) or not all(
                isinstance(a.value, (cst.Name, cst.Attribute, cst.Integer)) for a in dataset.args
            ):
                raise _Blocked(
                    dataset,
                    "the dataset is built inside the DataLoader call; build it in a variable "
                    "first, so that its sampler can be given the same dataset",
                )
            return
        if not isinstance(dataset, (cst.Name, cst.Attribute)):
            raise _Blocked(dataset, "the DataLoader's dataset is an expression PM601 would evaluate twice")
        values = (
            self.bindings.values(dataset) if isinstance(dataset, cst.Name) else self.bindings.attribute_values(dataset)
        ) or []
        for value in values:
            if not isinstance(value, cst.Call):
                continue
            classdef = self.context.kinds.local_class(value.func)
            bases = [value.func]
            for _ in range(8):
                if any(
                    self.names.is_(b, "torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset")
                    for b in bases
                ):
                    raise _Blocked(
                        dataset,
                        "the dataset is an IterableDataset, which a DistributedSampler cannot "
                        "split; shard it per rank by hand",
                    )
                if classdef is None:
                    break
                bases = [b.value for b in classdef.bases]
                classdef = next((c for c in (self.context.kinds.local_class(b) for b in bases) if c), None)

    def _sampler_seed(self, call: cst.Call, statement: cst.CSTNode) -> cst.BaseExpression | None:
        """The seed of the DataLoader's order: its generator's, or the global torch seed."""
        generator = kwarg(call, "generator")
        if generator is not None:
            value = generator.value
            if isinstance(value, cst.Name):
                values = self.bindings.values(value) or []
                value = values[0] if len(values) == 1 else None
            if isinstance(value, cst.Call) and method_name(value) == "manual_seed" and value.args:
                seed = value.args[0].value
                return seed if self._visible(seed, statement) else None
            if isinstance(generator.value, cst.Name):  # `g = torch.Generator(); g.manual_seed(s)`
                for seeded in self.index.find(cst.Call):
                    if (
                        method_name(seeded) == "manual_seed"
                        and _code(seeded.func.value) == generator.value.value
                        and seeded.args
                        and self._visible(seeded.args[0].value, statement)
                    ):
                        return seeded.args[0].value
            return None
        same = facts.function_of(self.context, statement)
        for seeded in reversed(facts.seed_calls(self.context, "torch")):
            if facts.function_of(self.context, seeded) is same and not self.index.before(seeded, statement):
                continue  # seeded after the loader is built
            if seeded.args and self._visible(seeded.args[0].value, statement):
                return seeded.args[0].value
        return None

    def _epoch_loop(self, loop: cst.For) -> tuple[cst.CSTNode | None, cst.FunctionDef | None]:
        """The loop around the training loop that runs once per epoch, in the training
        function or around its one call."""
        node: cst.CSTNode = loop
        for _ in range(4):
            for ancestor in self.index.ancestors(node):
                if isinstance(ancestor, facts.SCOPES):
                    break
                if isinstance(ancestor, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
                    raise _Blocked(
                        ancestor,
                        "the epochs run in a comprehension; PM601 tells the sampler each epoch "
                        "(set_epoch) at the top of a `for` loop: write the epochs as one",
                    )
            outer = self._enclosing_loops(node)
            if outer:
                return outer[0], facts.function_of(self.context, outer[0])
            function = facts.function_of(self.context, node)
            if function is None:
                return None, None
            calls = self._calls_of(function)
            if len(calls) != 1:
                return None, None
            node = calls[0]
        return None, None

    def _set_epoch(self, loader: _Loader, loop: cst.For, sampler: str | None) -> None:
        """`sampler.set_epoch(epoch)` at the top of each epoch: a new order every epoch
        (`loader.sampler` where the sampler has no name of its own)."""
        epoch_loop, function = self._epoch_loop(loop)
        if epoch_loop is None:
            return  # one pass over the data: epoch 0's order
        if sampler is not None and function is loader.function and self.index.before(loader.statement, epoch_loop):
            handle: cst.BaseExpression = cst.Name(sampler)
            guard: cst.BaseExpression = _expr(f"{sampler} is not None")
        else:
            spelled = loader.handles.get(id(function)) or self._self_handle(loader, function)
            if spelled is None or not self._visible(spelled, epoch_loop):
                raise _Blocked(
                    epoch_loop,
                    "the DataLoader is not visible in the epoch loop, where its sampler must be "
                    "told the epoch (set_epoch)",
                )
            handle = cst.Attribute(spelled, cst.Name("sampler"))
            guard = cst.Call(
                cst.Name("isinstance"),
                [
                    cst.Arg(handle, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    cst.Arg(cst.Name("DistributedSampler")),
                ],
            )
        body = epoch_loop.body
        if not isinstance(body, cst.IndentedBlock):
            raise _Blocked(epoch_loop, "the epoch loop is written on one line")
        if isinstance(epoch_loop, cst.For) and isinstance(epoch_loop.target, cst.Name):
            call = cst.Call(cst.Attribute(handle, cst.Name("set_epoch")), [cst.Arg(epoch_loop.target)])
            statement = cst.If(guard, cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(call)])]))
            self.edits.append(InsertBefore(body.body[0], (statement,)))
            return
        # No epoch number to read: count the passes on the sampler, after each one.
        step = cst.BinaryOperation(cst.Attribute(handle, cst.Name("epoch")), cst.Add(), cst.Integer("1"))
        call = cst.Call(cst.Attribute(handle, cst.Name("set_epoch")), [cst.Arg(step)])
        statement = cst.If(guard, cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(call)])]))
        holder = next((s for s in body.body if self.index.inside(loop, s)), None)
        if holder is None:
            raise _Blocked(epoch_loop, "it cannot tell where an epoch ends")
        self.edits.append(InsertAfter(holder, (statement,)))

    def _self_handle(self, loader: _Loader, function) -> cst.BaseExpression | None:
        """`self.loader` in a method of the class another method of which reads the loader
        as `self.loader`."""
        owner = facts.class_of(self.context, function)
        if owner is None:
            return None
        for scope_id, handle in loader.handles.items():
            method = next((f for f in self.index.find(cst.FunctionDef, within=owner) if id(f) == scope_id), None)
            if (
                method is not None
                and facts.class_of(self.context, method) is owner
                and isinstance(handle, cst.Attribute)
                and isinstance(handle.value, cst.Name)
                and handle.value.value == "self"
            ):
                return handle
        return None

    def _manual_batches(self, loop: cst.For) -> cst.Call | None:
        """`for i in range(...)` over slices of a `torch.randperm` permutation: each rank
        takes every N-th index of each batch (`perm[i:i + b][world.rank::world.size]`)."""
        if not isinstance(loop.target, cst.Name):
            return None
        index_name = loop.target.value
        found = []
        for subscript in own_nodes(self.index, cst.Subscript, loop.body):
            if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Slice):
                continue
            part = subscript.slice[0].slice
            if not any(
                n.value == index_name
                for bound in (part.lower, part.upper)
                if bound is not None
                for n in names_read(bound)
            ):
                continue
            if not isinstance(subscript.value, cst.Name):
                continue
            values = self.bindings.values(subscript.value) or []
            permutations = [
                v for v in values if isinstance(v, cst.Call) and self.names.is_(v.func, *facts.PERMUTATIONS)
            ]
            if permutations and len(permutations) == len(values):
                found.append((subscript, permutations[0]))
        if len(found) != 1:
            return None
        subscript, permutation = found[0]
        if not self._sees_world(subscript):
            raise _Blocked(
                subscript,
                "the batches are sliced in another function than the one that chooses the "
                "device; split them over the ranks by hand",
            )
        self.world_uses.append(subscript)
        world = self.world_name
        share = cst.SubscriptElement(cst.Slice(lower=_expr(f"{world}.rank"), upper=None, step=_expr(f"{world}.size")))
        self.edits.append(Replace(subscript, lambda updated: cst.Subscript(updated, [share])))
        self.local_batch = subscript
        return permutation

    def _random_batches(self, loop: cst.For) -> bool:
        """Batches drawn at random every step (`torch.randint(n, (batch_size,))`,
        `torch.randn(batch_size, d)`, in the loop or in a helper only it calls): each rank
        draws its share, `local_batch_size(batch_size)`, in every draw that batch size
        sizes, from its own reseeded generator (see _seeds)."""
        places: list[tuple[cst.CSTNode, cst.Call | None]] = [(loop.body, None)]
        for call in own_nodes(self.index, cst.Call, loop.body):
            helper = self.bindings.local_function(call.func) if isinstance(call.func, cst.Name) else None
            if helper is not None and len(self._calls_of(helper)) == 1:
                places.append((helper.body, call))
        found = []
        for body, call in places:
            for draw in own_nodes(self.index, cst.Call, body):
                size = self._first_dimension(draw)
                if size is not None:
                    found.append((body, call, draw, size))
        if not found:
            return False
        bodies = {id(body) for body, _, _, _ in found}
        spelled = {_code(size) for _, _, _, size in found}
        if len(bodies) != 1 or len(spelled) != 1:
            raise _Blocked(
                found[0][2],
                "the step draws its batches at random in several places or with several sizes; "
                "PM601 cannot tell which to split over the ranks",
            )
        body, call, draw, batch = found[0]
        if integer_value(batch) == 1:
            raise _Blocked(draw, "the loop draws one sample per step, which cannot be split over the ranks")
        # The draws must be all the batch size sizes: `x = sample(B)` beside `t = randint(T, (B,))`
        # would keep B rows where the draw makes B / N.
        sizes = {id(size) for _, _, _, size in found}
        code = _code(batch)
        others = [
            n
            for n in own_nodes(self.index, (cst.Name, cst.Attribute), body)
            if _code(n) == code and id(n) not in sizes and not isinstance(self.parents.get(n), cst.Attribute)
        ]
        if others:
            raise _Blocked(
                others[0],
                f"`{code}` sizes more than the random draws of each step (line "
                f"{self.context.line(others[0])}); PM601 cannot tell which sizes are per sample, "
                "to split them over the ranks",
            )
        for _, _, _, size in found:
            self.edits.append(Replace(size, lambda value: _call("distributed.local_batch_size", value)))
        self.batch_statement = self.index.statement_of(call if call is not None else draw)
        return True

    def _first_dimension(self, draw: cst.Call) -> cst.BaseExpression | None:
        """The first size of a torch random draw: `n` of `torch.randn(n, d)`,
        `torch.rand((n, d))`, `torch.randint(lo, hi, (n,))`, `size=(n, ...)`."""
        names = self.names.of(draw.func)
        if not names & facts.TORCH_DRAWS or names & {"torch.randperm"} or any(a.star for a in draw.args):
            return None
        if any(a.keyword is not None and a.keyword.value == "generator" for a in draw.args):
            return None
        size = kwarg(draw, "size")
        plain = [a.value for a in draw.args if a.keyword is None]
        if size is None and names & {"torch.randint"}:
            size = cst.Arg(plain[-1]) if len(plain) in (2, 3) else None
        if size is None and names & {"torch.rand", "torch.randn"} and plain:
            size = (
                cst.Arg(plain[0])
                if isinstance(plain[0], (cst.Tuple, cst.List))
                else cst.Arg(cst.Tuple([cst.Element(plain[0])]))
            )
        if size is None or not isinstance(size.value, (cst.Tuple, cst.List)) or not size.value.elements:
            return None
        first = size.value.elements[0].value
        return first if isinstance(first, (cst.Name, cst.Attribute, cst.Integer, cst.Subscript)) else None

    # -- no_sync -------------------------------------------------------------------------------

    def _no_sync(self) -> None:
        """With gradient accumulation, the micro-steps that do not step skip DDP's all-reduce."""
        loop = self.loop
        step_guard = self._step_guard()
        micro = loop.accumulation.micro_loop if loop.accumulation is not None else None
        region = loop.forward
        continue_guard = self._continue_guard(region) if region is not None else None
        if step_guard is None and micro is None and continue_guard is None:
            return  # no accumulation: every backward steps
        if region is None:
            self.notes.append(
                f"gradients are averaged over the ranks on every micro-batch ({loop.forward_problem}; "
                "add `model.no_sync()` by hand)"
            )
            return
        model = self._handle_in(facts.function_of(self.context, loop.loop))
        if model is None:
            return
        statements = list(region.block.body)
        first, last = region.first, region.last
        backward = self.index.statement_of(loop.backwards[0].call)
        if backward in statements and statements.index(backward) > last:
            last = statements.index(backward)
        accumulating, guard, negated = None, None, False
        if region.block is loop.loop.body:
            for candidate, negate in ((continue_guard, False), (step_guard, True)):
                if candidate is None or candidate not in statements or statements.index(candidate) <= last:
                    continue
                if self._rebound_between(candidate.test, statements[first : statements.index(candidate)]):
                    continue
                accumulating, guard, negated = (
                    (_negated(candidate.test) if negate else candidate.test),
                    candidate,
                    negate,
                )
                break
        if accumulating is None and micro is not None and self.index.inside(region.block, micro):
            accumulating = self._micro_condition(micro)
        if accumulating is None:
            self.notes.append(
                "gradients are averaged over the ranks on every micro-batch (PM601 cannot tell which "
                "micro-steps step; add `model.no_sync()` by hand)"
            )
            return
        if guard is not None and first > 0:
            name = self._fresh("accumulating")
            self.edits.append(
                InsertAfter(
                    statements[first - 1],
                    (cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], accumulating)]),),
                )
            )
            self.edits.append(Replace(guard.test, _expr(f"not {name}" if negated else name)))
            condition: cst.BaseExpression = cst.Name(name)
        else:
            condition = accumulating
        check = self._world_check(statements[first])
        item = cst.IfExp(
            test=_and(check, condition),
            body=cst.Call(cst.Attribute(_expr(model), cst.Name("no_sync"))),
            orelse=_call("contextlib.nullcontext"),
        )
        self.edits.append(Wrap(statements[first], statements[last], (cst.WithItem(item),)))
        self.imports.append(IMPORT_CONTEXTLIB)

    def _step_guard(self) -> cst.If | None:
        """`if (i + 1) % accum == 0:` around the optimizer step."""
        loop = self.loop
        for step in loop.steps:
            for node in self.index.ancestors(step.call):
                if node is loop.loop:
                    break
                if isinstance(node, cst.If) and node.orelse is None and self._is_modulo(node.test):
                    return node
        return None

    def _continue_guard(self, region) -> cst.If | None:
        """`if (i + 1) % accum != 0: continue` after the forward, before the step."""
        if region.block is not self.loop.loop.body:
            return None
        for statement in list(region.block.body)[region.last + 1 :]:
            if isinstance(statement, cst.If) and statement.orelse is None and self._is_modulo(statement.test):
                body = list(statement.body.body)
                only = body[0] if len(body) == 1 else None
                small = only.body[0] if isinstance(only, cst.SimpleStatementLine) and len(only.body) == 1 else only
                if isinstance(small, cst.Continue):
                    return statement
        return None

    def _is_modulo(self, test: cst.BaseExpression) -> bool:
        return periodic(self.context).is_periodic(test, self.loop.loop)

    def _rebound_between(self, test: cst.BaseExpression, statements) -> bool:
        read = {n.value for n in names_read(test)}
        return any(read & facts.assigned_names(self.context, s) for s in statements)

    def _micro_condition(self, micro: cst.CSTNode) -> cst.BaseExpression | None:
        """`i < n - 1` for `for i in range(n)`: every micro-step but the last."""
        if not (isinstance(micro, cst.For) and isinstance(micro.target, cst.Name)):
            return None
        iterable = micro.iter
        if not (isinstance(iterable, cst.Call) and self.names.is_(iterable.func, "range", "builtins.range")):
            return None
        args = [a.value for a in iterable.args]
        if len(args) == 2 and integer_value(args[0]) == 0:
            args = args[1:]
        if len(args) != 1 or self._rebound_between(args[0], [micro.body]):
            return None
        count = _code(args[0])
        if not isinstance(args[0], (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)):
            count = f"({count})"
        return _expr(f"{micro.target.value} < {count} - 1")

    def _handle_in(self, function) -> str | None:
        """How `function` spells the wrapped model."""
        for scope, code, _ in self.origin.handles:
            if scope is function:
                return code
            if isinstance(scope, cst.ClassDef) and function is not None and self.index.inside(function, scope):
                return code
            if isinstance(scope, cst.Module) and function is None:
                return code
        return None

    # -- random draws --------------------------------------------------------------------------

    def _seeds(self, permutation: cst.Call | None) -> None:
        """Where the loop draws random numbers itself (nanoGPT's `torch.randint` batches,
        noise, augmentation) from a global generator the script seeds, each rank reseeds it
        with its own offset before training: seeded alike, the ranks would draw alike.
        Unseeded global generators start from the OS's entropy, per process already;
        draws from generator objects the script seeds are reported."""
        loop = self.loop.loop
        calls = list(own_nodes(self.index, cst.Call, loop.body))
        for call in list(calls):
            helper = self.bindings.local_function(call.func) if isinstance(call.func, cst.Name) else None
            if helper is not None:
                calls.extend(own_nodes(self.index, cst.Call, helper.body))
        draws: dict[str, cst.Call] = {}
        for call in calls:
            if call is permutation:
                continue
            owned = self._seeded_generator(call)
            if owned is not None:
                raise _Blocked(
                    call,
                    f"the loop draws from `{owned}`, a generator seeded alike on every rank, which "
                    "PM601 cannot reseed per rank without changing what else it draws; seed it with "
                    "`seed + distributed.seed_offset()` by hand",
                )
            generator = facts.generator_of(self.context, call)
            if generator is not None:
                draws.setdefault(generator, call)
        if self.sampler_draws is not None:
            draws.setdefault("torch", self.sampler_draws)
        outer = [loop, *self._enclosing_loops(loop)][-1]
        lines = []
        for generator, draw in draws.items():
            seeds = [s for s in facts.seed_calls(self.context, generator) if s.args]
            seeds = [
                s
                for s in seeds
                if facts.function_of(self.context, s) is not facts.function_of(self.context, outer)
                or self.index.before(s, outer)
            ]
            if not seeds:
                continue  # never seeded: each process starts from the OS's entropy
            seed = seeds[-1]
            if not self._visible(seed.args[0].value, outer):
                raise _Blocked(
                    draw,
                    f"`{self._src(draw.func)}` draws from a generator seeded alike on every rank "
                    f"(line {self.context.line(seed)}), and that seed is out of reach of the loop; "
                    "reseed it with `seed + distributed.seed_offset()` by hand",
                )
            if permutation is not None:
                raise _Blocked(
                    draw,
                    "the loop draws random numbers besides the batch permutation, which must be the "
                    "same on every rank; give one of them a generator of its own",
                )
            value = cst.BinaryOperation(_parenthesized(seed.args[0].value), cst.Add(), _call("distributed.seed_offset"))
            lines.append(cst.SimpleStatementLine([cst.Expr(cst.Call(seed.func, [cst.Arg(value)]))]))
        if lines:
            self.edits.append(InsertBefore(outer, (cst.If(self._world_check(outer), cst.IndentedBlock(lines)),)))

    def _seeded_generator(self, call: cst.Call) -> str | None:
        """The generator object a draw uses (`generator=g`, `rng.integers(...)`), when the
        script builds it with a seed."""
        candidates = []
        generator = kwarg(call, "generator")
        if generator is not None:
            candidates.append(generator.value)
        if isinstance(call.func, cst.Attribute):
            candidates.append(call.func.value)
        for candidate in candidates:
            if not isinstance(candidate, cst.Name):
                continue
            values = self.bindings.values(candidate) or []
            if any(self._is_seeded_generator(value) for value in values):
                return candidate.value
            if any(self._is_generator(value) for value in values) and any(  # `g = Generator(); g.manual_seed(s)`
                method_name(other) in ("manual_seed", "seed")
                and other.args
                and _code(other.func.value) == candidate.value
                for other in self.index.find(cst.Call)
            ):
                return candidate.value
        return None

    def _is_generator(self, value: cst.BaseExpression) -> bool:
        return isinstance(value, cst.Call) and self.names.is_(
            value.func,
            "torch.Generator",
            "numpy.random.default_rng",
            "numpy.random.RandomState",
            "numpy.random.Generator",
            "random.Random",
        )

    def _is_seeded_generator(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.Call) and method_name(value) == "manual_seed" and value.args:
            return self._is_generator(value.func.value)
        return self._is_generator(value) and bool(value.args)

    # -- control flow ----------------------------------------------------------------------------

    def _control_flow(self) -> None:
        """A rank that skips a step or leaves the loop on its own data leaves the others
        waiting in the next all-reduce."""
        local = self.local = self._rank_local()
        for node in own_nodes(self.index, (cst.If, cst.While), self.loop.loop.body):
            if not local.reads(node.test):
                continue
            exits = own_nodes(self.index, (cst.Break, cst.Continue, cst.Return), node)
            steps = [c for c in own_nodes(self.index, cst.Call, node) if method_name(c) in ("backward", "step")]
            if exits or steps:
                raise _Blocked(
                    node.test,
                    f"`{self._src(node.test)}` depends on each rank's own batch and decides "
                    "whether a step runs or the loop goes on; ranks would fall out of step",
                )

    def _rank_local(self) -> facts.RankLocal:
        loop = self.loop.loop
        seeds: set[str] = set()
        target, iterable = loop.target, loop.iter
        while (
            isinstance(iterable, cst.Call)
            and self.names.is_(iterable.func, *ENUMERATE, *LOOKS_THROUGH)
            and positional(iterable, 0) is not None
        ):
            if self.names.is_(iterable.func, *ENUMERATE):
                if not (isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2):
                    break
                target = target.elements[1].value  # the index is the same on every rank
            iterable = positional(iterable, 0).value
        if self.local_batch is not None:
            seeds |= facts.assigned_names(self.context, self.index.statement_of(self.local_batch))
        elif self.batch_statement is not None:
            seeds |= facts.assigned_names(self.context, self.batch_statement)
        elif not (isinstance(iterable, cst.Call) and self.names.is_(iterable.func, "range", "builtins.range")):
            seeds |= {n.value for n in facts.target_names(target)}
        losses = {b.loss.value for b in self.loop.backwards if isinstance(b.loss, cst.Name)}
        body = self.step_function.body if self.step_function is not None else self.context.module
        model_calls = [c for c in self.index.find(cst.Call, within=loop) if self.context.training.is_model_call(c)]
        local = facts.rank_local(self.context, body, seeds | losses, losses, model_calls)
        if self.step_function is not None:  # what the training function returns, where it is called
            for call in self._calls_of(self.step_function):
                statement = self.index.statement_of(call)
                if isinstance(statement, cst.SimpleStatementLine):
                    bound = facts.assigned_names(self.context, statement)
                    local.names |= bound
                    local.loss_names |= bound
        return local

    # -- checkpoints on rank 0 -------------------------------------------------------------------

    def _saves(self) -> None:
        saves = facts.calls_named(self.context, set(TORCH_SAVES))
        writes = (
            saves
            + facts.calls_named(self.context, set(SAVE_FUNCTIONS - TORCH_SAVES))
            + [c for c in self.index.find(cst.Call) if method_name(c) == "save_pretrained"]
        )
        for call in sorted(writes, key=self.index.order):
            self._save_on_main(call)
        # A runtime checkpointer writes on rank 0 itself; what every rank then loads is as torch.save's.
        self._loads_after(saves + facts.checkpointer_saves(self.context))

    def _loads_after(self, saves: list[cst.Call]) -> None:
        """A file rank 0 saves and every rank then loads (the best model, restored after
        training): `distributed.barrier()` before the load, so that no rank reads before the
        write is done. A path in a temporary folder each process makes for itself is a file
        only rank 0 has: reported."""
        saved = {}
        for call in saves:
            path = kwarg(call, "f") or positional(call, 1)
            if path is not None:
                saved.setdefault(_code(path.value), []).append(call)
        if not saved:
            return
        barriers: set[int] = set()
        for load in facts.calls_named(self.context, {"torch.load", "torch.serialization.load"}):
            path = kwarg(load, "f") or positional(load, 0)
            if path is None or _code(path.value) not in saved:
                continue
            if not any(self._runs_after(load, save) for save in saved[_code(path.value)]):
                continue  # a file that is there before the run (resuming)
            if self._per_process_path(path.value):
                raise _Blocked(
                    load,
                    f"`{self._src(path.value)}` is in a temporary folder each process makes for "
                    "itself; rank 0 alone saves the checkpoint there, and the other ranks would read "
                    "from theirs: save to a path all ranks share",
                )
            statement = self.index.statement_of(load)
            if id(statement) in barriers or not isinstance(
                self.parents.get(statement), (cst.IndentedBlock, cst.Module)
            ):
                continue
            if any(self.index.inside(load, region) for region in self.rank0):
                continue
            barriers.add(id(statement))
            self.edits.append(InsertBefore(statement, (_line("distributed.barrier()\n"),)))

    def _runs_after(self, node: cst.CSTNode, earlier: cst.CSTNode) -> bool:
        """Does `node` run after `earlier` (later in its function, or in a loop around both)?"""
        if facts.function_of(self.context, node) is not facts.function_of(self.context, earlier):
            return False
        return self.index.before(earlier, node) or any(
            self.index.inside(node, loop) for loop in self._enclosing_loops(earlier)
        )

    def _per_process_path(self, path: cst.BaseExpression) -> bool:
        """Is the path made from `tempfile` (a folder or name of each process's own)?"""
        expressions = [path]
        for name in names_read(path):
            expressions.extend(self.bindings.values(name) or [])
        return any(
            self.names.startswith(call.func, ("tempfile",))
            for expression in expressions
            for call in self.index.find(cst.Call, within=expression)
        )

    def _save_on_main(self, call: cst.Call) -> None:
        if any(self.index.inside(call, region) for region in self.rank0):
            return
        statement = self.index.statement_of(call)
        small = self.parents.get(call)
        opened = self._opened_for(statement)
        if opened is not None:
            statement = opened
        elif not (
            isinstance(small, cst.Expr) and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
        ):
            raise _Blocked(
                call,
                f"`{self._src(call.func)}` is part of a larger statement; PM601 writes checkpoints "
                "on rank 0 only in statements of their own",
            )
        holder = self.parents.get(statement)
        if not isinstance(holder, (cst.IndentedBlock, cst.Module)):
            raise _Blocked(call, f"`{self._src(call.func)}` is on the line of its `if`; put it on a line of its own")
        condition = self.parents.get(holder)
        if isinstance(condition, cst.If) and condition.orelse is None and self._rank0_safe(condition):
            self.rank0.append(condition)
            self.edits.append(Replace(condition.test, lambda test: _and(test, _expr("distributed.is_main()"))))
            return
        self.rank0.append(statement)
        self.edits.append(Replace(statement, _only_on_main))

    def _opened_for(self, statement: cst.CSTNode) -> cst.With | None:
        """The `with open(path, "wb") as f:` whose whole body is the save."""
        block = self.parents.get(statement)
        holder = self.parents.get(block) if isinstance(block, cst.IndentedBlock) else None
        if (
            isinstance(holder, cst.With)
            and len(block.body) == 1
            and all(
                isinstance(i.item, cst.Call) and self.names.is_(i.item.func, "builtins.open", "io.open")
                for i in holder.items
            )
        ):
            return holder
        return None

    def _rank0_safe(self, condition: cst.If) -> bool:
        """Can the whole `if` run on rank 0 alone: nothing in it that another rank must join
        (a model call, a collective, a helper of unknown content), and nothing it assigns is
        read after it."""
        for call in self.index.find(cst.Call, within=condition.body):
            names = self.names.of(call.func)
            if names & RANK0_SAFE_CALLS or any(n.startswith(RANK0_SAFE_PREFIXES) for n in names):
                continue
            if method_name(call) in RANK0_SAFE_METHODS and not self.context.training.is_model_call(call):
                continue
            return False
        assigned = facts.assigned_names(self.context, condition.body)
        if not assigned:
            return True
        function = facts.function_of(self.context, condition)
        owner = function if function is not None else self.context.module
        loops = self._enclosing_loops(condition)
        for name in self.index.find(cst.Name, within=owner):
            if name.value not in assigned or self.index.inside(name, condition.body):
                continue
            # Read after the `if`, or by anything in a loop around it (its own test included):
            # the next iteration on another rank would see the old value.
            if self.index.before(condition, name) or any(self.index.inside(name, loop) for loop in loops):
                return False
        return True

    # -- output on rank 0 ------------------------------------------------------------------------

    def _outputs(self) -> None:
        for call in self.index.find(cst.Call):
            if any(self.index.inside(call, region) for region in self.rank0):
                continue
            if isinstance(call.func, cst.Name) and call.func.value == "print" and self.names.is_(call.func, *PRINT):
                self.edits.append(Replace(call.func, _expr("distributed.print0")))
                self._reduce(call)
            elif (
                _spelled(call.func) in ("tqdm", "trange")
                and self.names.is_(call.func, *TQDM)
                and kwarg(call, "disable") is None
                and not any(a.star for a in call.args)
            ):
                self.edits.append(AddKeyword(call, "disable", _expr("not distributed.is_main()")))
            elif method_name(call) in LOGGING_METHODS and self._is_logger(call.func.value):
                self._rank0_statement(call)

    def _is_logger(self, receiver: cst.BaseExpression) -> bool:
        if self.names.is_(receiver, "logging"):
            return True
        if isinstance(receiver, cst.Name):
            values = self.bindings.values(receiver) or []
            return bool(values) and all(
                isinstance(v, cst.Call) and self.names.is_(v.func, "logging.getLogger") for v in values
            )
        return False

    def _rank0_statement(self, call: cst.Call) -> None:
        statement = self.index.statement_of(call)
        if not (
            isinstance(self.parents.get(call), cst.Expr)
            and isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(self.parents.get(statement), (cst.IndentedBlock, cst.Module))
        ):
            return  # part of a larger statement: left on every rank
        self.rank0.append(statement)
        self.edits.append(Replace(statement, _only_on_main))

    def _reduce(self, call: cst.Call) -> None:
        """Losses in a print become their mean over the ranks: a collective, so only where
        every rank prints, under conditions that are the same on every rank."""
        local = self.local
        function = facts.function_of(self.context, call)
        if function is not self.step_function and not self._caller_of_step(function):
            return
        for ancestor in self.index.ancestors(call):
            if isinstance(ancestor, facts.SCOPES):
                break
            if isinstance(ancestor, (cst.If, cst.While)) and local.reads(ancestor.test):
                return
        parts = [
            value
            for arg in call.args
            if arg.keyword is None and not arg.star
            for value in facts.message_values(self.context, arg.value)
        ]
        for part in parts:
            if not local.reads_loss(part):
                continue
            if isinstance(part, cst.Call) and self.names.is_(part.func, "builtins.len"):
                continue  # how many losses, the same on every rank
            items = [
                c
                for c in self.index.find(cst.Call, within=part)
                if method_name(c) in facts.TO_HOST_METHODS and not c.args and local.reads_loss(c.func.value)
            ]
            for target in [item.func.value for item in items] or [part]:
                self.edits.append(Replace(target, lambda value: _call("distributed.all_reduce_mean", value)))

    def _caller_of_step(self, function) -> bool:
        if self.step_function is None:
            return False
        return any(facts.function_of(self.context, c) is function for c in self._calls_of(self.step_function))

    # -- reads of the wrapped model --------------------------------------------------------------

    def _unwrap(self) -> None:
        """Reads of the model that DDP does not answer as the module would go through
        `distributed.unwrap(model)`; a forward through another method cannot be synchronised."""
        step_loop = self.loop.loop
        for scope, code, after in self._all_handles():
            for use in self._uses(scope, code):
                if after is not None and not self._after_anchor(use, after):
                    continue
                parent = self.parents.get(use)
                if isinstance(parent, cst.Attribute) and parent.value is use:
                    attribute = parent.attr.value
                    if attribute in DDP_ANSWERS:
                        continue
                    call = self.parents.get(parent)
                    if (
                        self.index.inside(use, step_loop)
                        and attribute not in NOT_FORWARD
                        and isinstance(call, cst.Call)
                        and call.func is parent
                    ):
                        raise _Blocked(
                            call,
                            f"the training forward runs through `{code}.{attribute}(...)`; DDP "
                            f"synchronises gradients only for calls of `{code}(...)` itself",
                        )
                    self.edits.append(Replace(use, lambda value: _call("distributed.unwrap", value)))
                elif self._saved_whole(use):
                    self.edits.append(Replace(use, lambda value: _call("distributed.unwrap", value)))

    def _saved_whole(self, use: cst.CSTNode, container: bool = True) -> bool:
        """Is the model object itself what `torch.save` pickles (`torch.save(model, path)`,
        `torch.save({"model": model}, path)`, or such a container bound to a name that is
        saved: `state = {"model": model}` then `torch.save(state, path)`)? After the wrap
        that would be the DDP wrapper."""
        current, parent = use, self.parents.get(use)
        while container and isinstance(parent, (cst.Element, cst.DictElement, cst.List, cst.Tuple, cst.Dict)):
            if isinstance(parent, cst.DictElement) and parent.value is not current:
                return False  # a key
            current, parent = parent, self.parents.get(parent)
        if current is not use and isinstance(parent, cst.Assign) and parent.value is current:
            # `state = {"model": model, ...}` and then `torch.save(state, path)`
            targets = [t.target for t in parent.targets]
            if len(targets) != 1 or not isinstance(targets[0], cst.Name):
                return False
            scope = self.context.scopes.get(targets[0])
            bindings = [a for a in (scope.assignments[targets[0].value] if scope else ()) if a.node is targets[0]]
            return any(
                self._saved_whole(read, container=False)
                for b in bindings
                for read in self.context.kinds.reached_reads(b)
            )
        call = self.parents.get(parent) if isinstance(parent, cst.Arg) and parent.value is current else None
        return isinstance(call, cst.Call) and self.names.is_(call.func, *TORCH_SAVES)

    def _after_anchor(self, use: cst.CSTNode, anchor: cst.CSTNode) -> bool:
        """Does `use` see the wrapped model: after the DDP wrap in its function, or in another method."""
        method = facts.function_of(self.context, anchor)
        if facts.function_of(self.context, use) is not method:
            return True
        return self.index.before(anchor, use) and not self.index.inside(use, anchor)

    def _all_handles(self):
        """The model's spellings, with the functions of this file it is passed to (one level)."""
        handles = list(self.origin.handles)
        for scope, code, _ in list(handles):
            for use in self._uses(scope, code):
                parent = self.parents.get(use)
                call = self.parents.get(parent) if isinstance(parent, cst.Arg) else None
                if not isinstance(call, cst.Call) or parent.value is not use:
                    continue
                helper = self.bindings.local_function(call.func) if isinstance(call.func, cst.Name) else None
                if helper is None or any(h[0] is helper for h in handles):
                    continue
                for param in helper.params.params:
                    if argument_for(call, helper, param) is use:
                        handles.append((helper, param.name.value, None))
        return handles

    def _uses(self, scope: cst.CSTNode, code: str) -> list[cst.CSTNode]:
        """Reads of `code` (a name or `self.x`) in `scope`."""
        found = []
        if code.startswith("self."):
            attribute = code[5:]
            for node in self.index.find(cst.Attribute, within=scope):
                if (
                    node.attr.value == attribute
                    and isinstance(node.value, cst.Name)
                    and node.value.value == "self"
                    and not self._is_target(node)
                ):
                    found.append(node)
            return found
        function = scope if isinstance(scope, cst.FunctionDef) else None
        for node in self.index.find(cst.Name, within=scope):
            if node.value != code:
                continue
            if facts.function_of(self.context, node) is not function and not (
                function is None and facts.reads_module_binding(self.context, node)
            ):
                continue  # another function's own `code`
            parent = self.parents.get(node)
            if isinstance(parent, cst.Attribute) and parent.attr is node:
                continue
            if isinstance(parent, (cst.Arg, cst.Param)) and getattr(parent, "keyword", None) is node:
                continue
            if isinstance(parent, cst.Param) or self._is_target(node):
                continue
            found.append(node)
        return found

    def _is_target(self, node: cst.CSTNode) -> bool:
        parent = self.parents.get(node)
        return isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)) and parent.target is node

    # -- exit ------------------------------------------------------------------------------------

    def _cleanup(self) -> cst.BaseStatement | None:
        """`try: main() finally: distributed.cleanup()` around the call that runs the
        function holding setup(); at module level, an atexit hook to put after setup()
        (returned)."""
        statement = None
        if self.setup_scope is not None:
            outer: cst.CSTNode = self.setup_scope
            while True:
                enclosing = self.index.first_enclosing(outer, (cst.FunctionDef, cst.ClassDef))
                if enclosing is None:
                    break
                outer = enclosing
            statement = self._entry_statement(outer)
        if statement is not None:
            finally_ = cst.Finally(cst.IndentedBlock([_line("distributed.cleanup()\n")]))

            def protected(updated: cst.SimpleStatementLine) -> cst.Try:
                return cst.Try(
                    cst.IndentedBlock([updated.with_changes(leading_lines=[])]),
                    finalbody=finally_,
                    leading_lines=updated.leading_lines,
                )

            self.edits.append(Replace(statement, protected))
            return None
        self.imports.append(IMPORT_ATEXIT)
        return _line("atexit.register(distributed.cleanup)\n")

    def _entry_statement(self, outer: cst.FunctionDef | cst.ClassDef) -> cst.SimpleStatementLine | None:
        """The one module-level statement (or one under `if __name__ == "__main__":`) that
        calls `outer` (a function, or a class whose object it makes)."""
        name = outer.name.value
        found = []
        for call in self.index.find(cst.Call):
            func = call.func
            while isinstance(func, (cst.Attribute, cst.Call)):
                func = func.value if isinstance(func, cst.Attribute) else func.func
            if not (isinstance(func, cst.Name) and func.value == name) or facts.function_of(self.context, call):
                continue
            statement = self.index.statement_of(call)
            block = self.parents.get(statement)
            holder = self.parents.get(block)
            if (
                isinstance(statement, cst.SimpleStatementLine)
                and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr)
                and (isinstance(block, cst.Module) or (isinstance(holder, cst.If) and "__name__" in _code(holder.test)))
            ):
                if statement not in found:
                    found.append(statement)
                continue
            return None
        return found[0] if len(found) == 1 else None


def _spelled(func: cst.BaseExpression) -> str | None:
    """The last name of a called expression: `tqdm` of `tqdm.auto.tqdm`."""
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else None


def _only_on_main(updated: cst.BaseStatement) -> cst.If:
    """`if distributed.is_main():` around a statement, its comments above the `if`."""
    inner = updated.with_changes(leading_lines=[])
    return cst.If(_expr("distributed.is_main()"), cst.IndentedBlock([inner]), leading_lines=updated.leading_lines)

"""What a training script already does about running in several processes, and the
facts PM601 needs to make a single-process one torchrun-ready: whether anything
distributed is there already, layers and calls that behave differently per rank (and
`obstacle`: the first reason a file cannot train data-parallel as it is written;
`single_process_loop`: the step loop of a file that trains in one process),
random draws and the seeds behind them, where a value is the same on every rank
and where it is each rank's own (`differs_per_process`; `unshared_file`: why a path
rank 0 writes and every rank reads may not be one file), where a function of this file is called (`calls_of`), the function and class
around a node (`function_of`, `class_of`; the loops around it are the tree index's
`enclosing_loops`).

Everything here reads the shared index, names and scopes of FileContext; nothing
walks the tree on its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst
from libcst.metadata import Assignment, GlobalScope

from codemod.analysis.bindings import argument_for, returned_values
from codemod.analysis.loss_calls import loss_calls
from codemod.analysis.names import kwarg, names_read, sole_definition
from codemod.analysis.project import project_of
from codemod.analysis.torch_facts import (
    CHECKPOINTERS,
    MODEL_ZOOS,
    MODULE_METHOD_FACTS,
    PER_PROCESS_ENVIRONMENT,
    PER_PROCESS_MODULES,
    PER_PROCESS_SOURCES,
    PER_RANK_BATCH_NORMS,
    SAVE_FUNCTIONS,
    TORCH_DRAWS,
    ZOO_MODELS_WITHOUT_BATCH_NORM,
)
from codemod.analysis.torch_ops import LEGACY_REDUCTION_KEYWORDS, Category, methods

if TYPE_CHECKING:
    from codemod.context import FileContext

# What a script prints and logs with (PM601 keeps it to rank 0).
PRINT = ("builtins.print", "print")
TQDM = ("tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "tqdm.trange", "tqdm.auto.trange")
LOGGING_METHODS = {"info", "debug"}
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

# A file that names any of these runs in several processes already, or leaves that to a
# framework: PM601 leaves it alone.
DISTRIBUTED_NAMES = (
    "torch.distributed",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed",
    "torch.utils.data.DistributedSampler",
    "torch.utils.data.distributed",
    "torch.multiprocessing.spawn",
    "accelerate",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "deepspeed",
    "horovod",
    "torch_xla",
    "colossalai",
    "runtime.distributed",
)
# Text without which none of the above can be in a file (a cheap first look).
DISTRIBUTED_TEXT = (
    "distributed",
    "Distributed",
    "accelerate",
    "Accelerator",
    "lightning",
    "Lightning",
    "deepspeed",
    "horovod",
    "torch_xla",
    "colossalai",
    "RANK",
    "WORLD_SIZE",
    "fully_shard",
    "FullySharded",
    "spawn",
)
# Variables a launcher sets; a script that reads them handles its ranks itself.
LOCAL_RANK = re.compile(r"local_?rank", re.IGNORECASE)  # `local_rank`, `args.localrank`, "LOCAL_RANK"
LAUNCHER_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
DATA_PARALLEL = {
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
}

# Random draws, by the generator they draw from.
SEEDS = {
    "torch": {"torch.manual_seed", "torch.random.manual_seed"},
    "numpy": {"numpy.random.seed"},
    "random": {"random.seed"},
}
# Samplers that draw with replacement from torch's global generator (unless given one of
# their own), and the position of their `num_samples`: each rank can draw its share.
REPLACEMENT_SAMPLERS = {
    "torch.utils.data.RandomSampler": 2,
    "torch.utils.data.sampler.RandomSampler": 2,
    "torch.utils.data.WeightedRandomSampler": 1,
    "torch.utils.data.sampler.WeightedRandomSampler": 1,
}
WEIGHTED_SAMPLERS = {"torch.utils.data.WeightedRandomSampler", "torch.utils.data.sampler.WeightedRandomSampler"}
SPARSE_EMBEDDINGS = {
    "torch.nn.Embedding",
    "torch.nn.EmbeddingBag",
    "torch.nn.modules.sparse.Embedding",
    "torch.nn.modules.sparse.EmbeddingBag",
    "torch.nn.functional.embedding",
    "torch.nn.functional.embedding_bag",
}

FUNCTIONS = (cst.FunctionDef, cst.Lambda)
SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


class NotDistributable(Exception):
    """Why a training program cannot be made to run in several processes as it is written
    (the true reason, in words), at `node`: raised by the analyses of its sites
    (step_batches, model_sites) and by the rule that rewrites it."""

    def __init__(self, node: cst.CSTNode, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.message = message


# -- what no rewrite can keep -----------------------------------------------------------------


def single_process_loop(context: FileContext):
    """The step loop (a `TrainingLoop`) of a file that trains in one process: None where
    nothing trains or the file runs in several processes already (`distributed_use`);
    raises the `obstacle` where it cannot train data-parallel as it is written."""
    loops = context.training.loops
    if not loops or distributed_use(context) is not None:
        return None
    blocked = obstacle(context)
    if blocked is not None:
        raise blocked
    return loops[0]


def obstacle(context: FileContext) -> NotDistributable | None:
    """The first reason the file's one training program cannot run data-parallel as it is
    written, whatever the rewrite does: DataParallel, several training loops, BatchNorm
    (statistics of each rank's share), sparse embeddings (gradients NCCL may not reduce), a
    training loss of torch summed over the batch (DDP averages the ranks' gradients)."""
    loops = context.training.loops
    for call in data_parallel(context):
        return NotDistributable(
            call,
            "it uses DataParallel (one process, several GPUs); replace it with "
            "DistributedDataParallel by hand, or remove it and run PM601 again",
        )
    if len(loops) > 1:
        return NotDistributable(
            loops[1].loop, f"the file has {len(loops)} training loops; PM601 rewrites scripts with one"
        )
    for call in batch_norms(context):
        return NotDistributable(
            call,
            f"`{context.source(call.func).strip()}` holds BatchNorm, which would normalise over each rank's "
            "share of the batch instead of the whole batch; on GPUs convert the model with "
            "`torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)` before wrapping it in DDP",
        )
    for call in sparse_embeddings(context):
        return NotDistributable(
            call,
            f"`{context.source(call.func).strip()}(..., sparse=True)` gives the model sparse gradients, which "
            "DistributedDataParallel all-reduces on the gloo backend but not on every NCCL build "
            "(the backend PM601 sets up on GPUs); make the embedding dense or wrap the model by hand",
        )
    losses = loss_calls(context)
    for call in context.training.loss_calls(loops[0]) if loops else ():
        if losses.reduction(call) == "sum":
            legacy = [
                arg for arg in call.args if arg.keyword is not None and arg.keyword.value in LEGACY_REDUCTION_KEYWORDS
            ]
            written = ", ".join(context.source(arg) for arg in legacy) or 'reduction="sum"'
            return NotDistributable(
                call,
                f"the loss is summed over the batch ({written}); DDP averages the ranks' "
                "gradients, so each step would move by 1/N of the single-process step: use the "
                "mean, or scale the loss by the number of processes",
            )
    return None


# -- already distributed -------------------------------------------------------------------


def distributed_use(context: FileContext) -> cst.CSTNode | None:
    """The first import, name or launcher variable that shows the file runs in several
    processes already (or through a framework that does), or a function of it that trains
    and that a module beside it starts in several processes (`mp.Process(target=train)` in
    `main.py`: Hogwild), or None."""
    code = context.code
    if not any(text in code for text in DISTRIBUTED_TEXT):
        return _started_elsewhere(context)
    names, index = context.names, context.index
    for statement in index.find((cst.Import, cst.ImportFrom)):
        for full in _imported(statement):
            if _under(full, DISTRIBUTED_NAMES):
                return statement
    for node in index.find(cst.Attribute):
        if node.attr.value in (
            "distributed",
            "DistributedDataParallel",
            "DistributedSampler",
            "spawn",
        ) and names.startswith(node, DISTRIBUTED_NAMES):
            return node
    for string in index.find(cst.SimpleString):
        if string.evaluated_value in LAUNCHER_VARIABLES:
            return string
    return _started_elsewhere(context)


def _started_elsewhere(context: FileContext) -> cst.FunctionDef | None:
    """A top-level function that runs a training loop of this file, itself or through the
    functions it calls, and that another module of the project runs in new processes."""
    holders = {context.index.first_enclosing(loop.loop, FUNCTIONS) for loop in context.training.loops}
    holders.discard(None)
    if not holders:
        return None
    steps = context.loops
    for statement in context.module.body:
        if (
            isinstance(statement, cst.FunctionDef)
            and (statement in holders or holders & set(steps.functions_reached(statement.body)))
            and project_of(context).started_in_processes(statement)
        ):
            return statement
    return None


def _imported(statement: cst.Import | cst.ImportFrom) -> Iterator[str]:
    if isinstance(statement, cst.Import):
        for alias in statement.names:
            yield _dotted(alias.name)
        return
    if statement.relative or statement.module is None:
        return
    module = _dotted(statement.module)
    yield module
    if not isinstance(statement.names, cst.ImportStar):
        for alias in statement.names:
            yield f"{module}.{_dotted(alias.name)}"


def _under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _dotted(node: cst.CSTNode) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


def checkpointer_saves(context: FileContext) -> list[cst.Call]:
    """`checkpointer.save(obj, path)` calls on a name every binding of which builds a
    runtime checkpointer: saves of `obj` to `path`, as torch.save's."""
    found = []
    for call in context.index.find(cst.Call):
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "save" and isinstance(func.value, cst.Name)):
            continue
        values = context.bindings.values(func.value)
        if values and all(isinstance(v, cst.Call) and context.names.is_(v, *CHECKPOINTERS) for v in values):
            found.append(call)
    return found


def calls_named(context: FileContext, qualified: set[str], prefixes: tuple[str, ...] = ()) -> list[cst.Call]:
    """Calls of the file to any of `qualified` (aliases resolved) or under `prefixes`."""
    last = {name.rsplit(".", 1)[-1] for name in qualified}
    found = []
    for call in context.index.find(cst.Call):
        func = call.func
        spelled = (
            func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        )
        if spelled is None:
            continue
        if spelled in last and context.names.is_(func, *qualified):
            found.append(call)
        elif prefixes and context.names.startswith(func, prefixes):
            found.append(call)
    return found


def batch_norms(context: FileContext) -> list[cst.Call]:
    """BatchNorm layers the file builds, and models of zoos that may hold them (all but
    those known to hold none: `torchvision.models.vgg19`)."""
    if "BatchNorm" not in context.code and not any(zoo.split(".")[0] in context.code for zoo in MODEL_ZOOS):
        return []
    found = calls_named(context, PER_RANK_BATCH_NORMS, MODEL_ZOOS)
    return [
        call
        for call in found
        if not context.names.is_(call.func, *ZOO_MODELS_WITHOUT_BATCH_NORM) and not _held_in_eval_mode(context, call)
    ]


def _held_in_eval_mode(context: FileContext, call: cst.Call) -> bool:
    """Is `call` part of a network bound to a name (`encoder = nn.Sequential(..., nn.BatchNorm2d(32),
    ...).to(device)`) that the file puts in eval mode, never back in training mode, and hands
    to nothing else (it only runs it and calls its methods that leave its submodules to it):
    a frozen encoder. In eval mode BatchNorm normalises with its running statistics, the
    same on every rank."""
    target = None
    for ancestor in context.index.ancestors(call):
        if isinstance(ancestor, (cst.Call, cst.Arg, cst.Attribute)):
            continue
        if isinstance(ancestor, cst.Assign) and len(ancestor.targets) == 1:
            target = ancestor.targets[0].target
        break
    reads = context.bindings.reads(target) if isinstance(target, cst.Name) else None
    if not reads:
        return False
    modes = set()
    for read in reads:
        parent = context.parents.get(read)
        if isinstance(parent, cst.Call) and parent.func is read:
            continue  # its forward
        facts = MODULE_METHOD_FACTS.get(parent.attr.value) if isinstance(parent, cst.Attribute) else None
        method_call = context.parents.get(parent)
        if facts is None or facts.submodules or not (isinstance(method_call, cst.Call) and method_call.func is parent):
            return False
        if facts.mode is not None:
            modes.add(facts.mode)
    return modes == {"eval"}


def sparse_embeddings(context: FileContext) -> list[cst.Call]:
    """Embeddings the file builds or calls with `sparse=True`: their gradients are sparse."""
    if "sparse" not in context.code:
        return []
    found = []
    for call in calls_named(context, SPARSE_EMBEDDINGS):
        sparse = kwarg(call, "sparse")
        if sparse is not None and not (isinstance(sparse.value, cst.Name) and sparse.value.value == "False"):
            found.append(call)
    return found


def per_node_guard(context: FileContext, node: cst.CSTNode) -> cst.If | None:
    """The `if` around `node`, in its function, whose test reads a node-local rank
    (`local_rank == 0`, `args.local_rank`, `os.environ["LOCAL_RANK"]`): what it guards
    runs once per node, not once per job."""
    for ancestor in context.index.ancestors(node):
        if isinstance(ancestor, SCOPES):
            return None
        if (
            isinstance(ancestor, cst.If)
            and not context.inside(node, ancestor.test)
            and _reads_local_rank(context, ancestor.test)
        ):
            return ancestor
    return None


def _reads_local_rank(context: FileContext, test: cst.BaseExpression) -> bool:
    index = context.index
    spelled = [n.value for n in names_read(test)]
    spelled += [a.attr.value for a in index.find(cst.Attribute, within=test)]
    spelled += [s.evaluated_value for s in index.find(cst.SimpleString, within=test)]
    return any(isinstance(text, str) and LOCAL_RANK.fullmatch(text) for text in spelled)


def data_parallel(context: FileContext) -> list[cst.Call]:
    if "DataParallel" not in context.code:
        return []
    return calls_named(context, DATA_PARALLEL)


# -- random draws and seeds ---------------------------------------------------------------------


def generator_of(context: FileContext, call: cst.Call) -> str | None:
    """ "torch", "numpy" or "random": the global generator a call draws from; None
    when it draws from none (or from a generator object of its own)."""
    names = context.names
    for name in names.of(call.func):
        if name in TORCH_DRAWS:
            if any(a.keyword is not None and a.keyword.value == "generator" for a in call.args):
                return None
            return "torch"
        if (
            name.startswith("numpy.random.")
            and name not in SEEDS["numpy"]
            and not name.endswith(("default_rng", "RandomState", "Generator", "SeedSequence"))
        ):
            return "numpy"
        if (
            name.startswith("random.")
            and name not in SEEDS["random"]
            and name not in ("random.Random", "random.SystemRandom")
        ):
            return "random"
    return None


def seed_calls(context: FileContext, generator: str) -> list[cst.Call]:
    """The calls that seed a global generator ("torch", "numpy", "random"), in code order."""
    if "seed" not in context.code:
        return []
    return calls_named(context, SEEDS[generator])


# -- where code runs -------------------------------------------------------------------------


def function_of(context: FileContext, node: cst.CSTNode) -> cst.FunctionDef | None:
    """The function whose body holds `node` (None: module level)."""
    found = context.index.first_enclosing(node, FUNCTIONS)
    return found if isinstance(found, cst.FunctionDef) else None


def reads_module_binding(context: FileContext, name: cst.Name) -> bool:
    """Does `name`, read inside a function, read the module's own binding of it (the
    function binds no such name: `torch.save(model, path)` in `def checkpoint(epoch):`
    reads the script's `model`)?"""
    scope = context.scopes.get(name)
    if scope is None or function_of(context, name) is None:
        return False
    found = list(scope[name.value])
    return bool(found) and all(isinstance(a.scope, GlobalScope) for a in found)


def argument_of(context: FileContext, call: cst.Call, function: cst.FunctionDef, param: cst.Param):
    """What `call` (one of `calls_of(function)`) passes as `param`: for a method, the call
    itself fills `self`."""
    return argument_for(call, function, param, 1 if class_of(context, function) is not None else 0)


def class_of(context: FileContext, function: cst.FunctionDef | None) -> cst.ClassDef | None:
    """The class `function` is a method of."""
    if function is None:
        return None
    parent = context.parents.get(function)
    holder = context.parents.get(parent) if isinstance(parent, cst.IndentedBlock) else None
    return holder if isinstance(holder, cst.ClassDef) else None


def calls_of(context: FileContext, function: cst.FunctionDef) -> list[cst.Call]:
    """Calls of this file to `function` by its name (`train(...)`, `self.train(...)` for a
    method; `Trainer(...)` for the `__init__` of a class `Trainer`)."""
    name = function.name.value
    owner = class_of(context, function)
    method = owner is not None
    if owner is not None and name == "__init__":
        return [
            call
            for call in context.index.find(cst.Call)
            if isinstance(call.func, cst.Name)
            and call.func.value == owner.name.value
            and sole_definition(context.scopes, call.func, cst.ClassDef) is owner
        ]
    found = []
    for call in context.index.find(cst.Call):
        func = call.func
        if method:
            if isinstance(func, cst.Attribute) and func.attr.value == name:
                found.append(call)
        elif isinstance(func, cst.Name) and func.value == name:
            if context.bindings.local_function(func) is function:
                found.append(call)
    return found


# -- values each rank has for itself -------------------------------------------------------


@dataclass
class RankLocal:
    """Names of one function whose values differ between ranks: what a rank computes
    from its own batches (its share of the data) and the loss."""

    names: set[str]  # data- or loss-derived
    loss_names: set[str]  # derived from the loss (what logging averages over the ranks)

    def reads(self, node: cst.CSTNode) -> bool:
        return any(name.value in self.names for name in names_read(node))

    def reads_loss(self, node: cst.CSTNode) -> bool:
        return any(name.value in self.loss_names for name in names_read(node))


# A list's methods that put values in it: the list then holds what they read.
GROWS = frozenset({"append", "extend", "insert"})
# Tensor methods that hand the values to Python (a number, a list, an array): a mean over
# the ranks is taken of the tensor before them.
TO_HOST_METHODS = methods(Category.TO_HOST)


def rank_local(
    context: FileContext,
    function_body: cst.CSTNode,
    seeds: set[str],
    loss_seeds: set[str],
    sources: Iterable[cst.Call] = (),
    loss_sources: Iterable[cst.Call] = (),
) -> RankLocal:
    """Names bound in `function_body` from `seeds` (a batch, the loss) or from calls to
    `sources` (the model) or `loss_sources` (a step function that returns its loss),
    followed through assignments to a fixed point."""
    loss_ids = {id(call) for call in loss_sources}
    source_ids = {id(call) for call in sources} | loss_ids
    bindings = []
    for call in context.index.find(cst.Call, within=function_body):  # `losses.append(loss.detach())`
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in GROWS and isinstance(func.value, cst.Name):
            read = {n.value for a in call.args for n in names_read(a.value)}
            inner = context.index.find(cst.Call, within=call)
            calls = any(id(c) in source_ids for c in inner)
            bound = {func.value.value}
            bindings.append(
                (bound, read, calls, bound, _loss_reads(context, call), any(id(c) in loss_ids for c in inner))
            )
    for statement in context.index.find((cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For), within=function_body):
        if isinstance(statement, cst.For):
            targets, value = [statement.target], statement.iter
        elif isinstance(statement, cst.Assign):
            targets, value = [t.target for t in statement.targets], statement.value
        else:
            targets, value = [statement.target], statement.value
        if value is None:
            continue
        bound = {n.value for t in targets for n in _target_names(t)}
        read = {n.value for n in names_read(value)}
        loss_bound, loss_read = bound, _loss_reads(context, value)
        if isinstance(statement, cst.For) and _enumerates(context, statement):  # the count is no loss
            loss_bound = {n.value for n in _target_names(statement.target.elements[1].value)}
        if isinstance(statement, cst.AugAssign):
            read |= bound
            loss_read |= bound
        inner = context.index.find(cst.Call, within=value)
        calls = any(id(c) in source_ids for c in inner)
        bindings.append((bound, read, calls, loss_bound, loss_read, any(id(c) in loss_ids for c in inner)))
    local, loss = set(seeds), set(loss_seeds)
    changed = True
    while changed:
        changed = False
        for bound, read, calls, loss_bound, loss_read, loss_call in bindings:
            if (read & local or calls) and not bound <= local:
                local |= bound
                changed = True
            if (loss_read & loss or loss_call) and not loss_bound <= loss:
                loss |= loss_bound
                changed = True
    return RankLocal(local, loss)


def _loss_reads(context: FileContext, node: cst.CSTNode) -> set[str]:
    """The names `node` reads, but for those it reads only to count them (`len(losses)`:
    as many on every rank)."""
    counted = {
        id(name)
        for call in context.index.find(cst.Call, within=node)
        if context.names.is_(call.func, "builtins.len")
        for name in names_read(call)
    }
    return {name.value for name in names_read(node) if id(name) not in counted}


def _enumerates(context: FileContext, loop: cst.For) -> bool:
    """`for i, item in enumerate(...)`."""
    return (
        isinstance(loop.iter, cst.Call)
        and context.names.is_(loop.iter.func, "builtins.enumerate")
        and isinstance(loop.target, (cst.Tuple, cst.List))
        and len(loop.target.elements) == 2
    )


def _target_names(target: cst.CSTNode) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []


def target_names(target: cst.CSTNode) -> list[cst.Name]:
    """The names a `for` / assignment target binds, through tuples and lists."""
    return _target_names(target)


def assigned_names(context: FileContext, node: cst.CSTNode) -> set[str]:
    """Names assigned anywhere under `node`."""
    found: set[str] = set()
    for statement in context.index.find(
        (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr, cst.WithItem), within=node
    ):
        if isinstance(statement, cst.WithItem):
            target = statement.asname.name if statement.asname else None
        else:
            target = statement.target
        if target is not None:
            found.update(n.value for n in _target_names(target))
    return found


def bindings_of(context: FileContext, name: cst.Name) -> list[Assignment]:
    scope = context.scopes.get(name)
    if scope is None:
        return []
    return [a for a in scope[name.value] if type(a) is Assignment]


# -- the numbers a message formats ---------------------------------------------------------

TEXT_CALLS = {"builtins.str", "builtins.repr", "builtins.format"}


def message_values(context: FileContext, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values that the message `expr` (an argument of `print`) formats: the
    expressions of an f-string, the operands of `"..." % (a, b)` and `"...".format(a, b)`,
    what `str(x)` converts, the parts of a `+` between strings; `expr` itself when it
    is not text. A string, and a name bound only to strings, gives nothing: what it
    formats was formatted where it was built, and text is never a value to average."""
    found: list[cst.BaseExpression] = []
    _collect_values(context, expr, found)
    return found


def _collect_values(context: FileContext, expr: cst.BaseExpression, found: list[cst.BaseExpression]) -> None:
    if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString)):
        return
    if isinstance(expr, cst.FormattedString):
        for part in expr.parts:
            if isinstance(part, cst.FormattedStringExpression):
                _collect_values(context, part.expression, found)
        return
    if isinstance(expr, cst.BinaryOperation):
        if isinstance(expr.operator, cst.Modulo) and is_text(context, expr.left):
            operands = expr.right
            items = [e.value for e in operands.elements] if isinstance(operands, cst.Tuple) else [operands]
            for item in items:
                _collect_values(context, item, found)
            return
        if isinstance(expr.operator, cst.Add) and (is_text(context, expr.left) or is_text(context, expr.right)):
            _collect_values(context, expr.left, found)
            _collect_values(context, expr.right, found)
            return
    if isinstance(expr, cst.Call):
        if (
            isinstance(expr.func, cst.Attribute)
            and expr.func.attr.value == "format"
            and is_text(context, expr.func.value)
        ):
            for arg in expr.args:
                if not arg.star:
                    _collect_values(context, arg.value, found)
            return
        if context.names.is_(expr.func, *TEXT_CALLS):
            if expr.args and not expr.args[0].star:
                _collect_values(context, expr.args[0].value, found)
            return
    if is_text(context, expr) or is_container(context, expr):
        return
    found.append(expr)


CONTAINERS = (cst.List, cst.Tuple, cst.Set, cst.Dict, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
CONTAINER_CALLS = {"builtins.list", "builtins.tuple", "builtins.dict", "builtins.set", "builtins.sorted"}


def is_container(context: FileContext, expr: cst.BaseExpression, seen: frozenset[int] = frozenset()) -> bool:
    """Whether `expr` is a list, tuple, dict or set as written (a display, a
    comprehension, `list(...)`), or a name every binding of which is one: never a
    number to average."""
    if isinstance(expr, CONTAINERS):
        return True
    if isinstance(expr, cst.Call):
        return context.names.is_(expr.func, *CONTAINER_CALLS)
    if isinstance(expr, cst.Name) and id(expr) not in seen:
        values = context.bindings.values(expr)
        return bool(values) and all(is_container(context, v, seen | {id(expr)}) for v in values)
    return False


def is_text(context: FileContext, expr: cst.BaseExpression, seen: frozenset[int] = frozenset()) -> bool:
    """Whether `expr` is a string as written: a literal, an f-string, `"..." % x`,
    `"...".format(...)`, `str(x)`, or a name every binding of which is one of those."""
    if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)):
        return True
    if isinstance(expr, cst.BinaryOperation):
        if isinstance(expr.operator, cst.Modulo):
            return is_text(context, expr.left, seen)
        if isinstance(expr.operator, cst.Add):
            return is_text(context, expr.left, seen) or is_text(context, expr.right, seen)
    if isinstance(expr, cst.Call):
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("format", "join"):
            return is_text(context, expr.func.value, seen)
        return context.names.is_(expr.func, *TEXT_CALLS)
    if isinstance(expr, cst.Name) and id(expr) not in seen:
        values = context.bindings.values(expr)
        return bool(values) and all(is_text(context, v, seen | {id(expr)}) for v in values)
    return False


# -- values every process computes alike -----------------------------------------------------


class PerProcess(NamedTuple):
    """Why a value may differ between the processes of one launch. `node` is the call or
    read behind it: a value each process makes for itself (`source`: `tempfile.mkdtemp()`,
    `time.time()`, `os.environ["RANK"]`; `temporary` when it is a temporary file or folder),
    or, when `source` is False, a value this analysis does not follow (a parameter that no
    call of this file fills, a binding it cannot read)."""

    node: cst.CSTNode
    source: bool
    temporary: bool = False


def differs_per_process(context: FileContext, expr: cst.BaseExpression) -> PerProcess | None:
    """None when `expr` is provably the same in every process of a launch: built from
    literals, imported names, calls that are not per-process sources (torch_facts'
    PER_PROCESS_SOURCES and PER_PROCESS_MODULES: argparse options, config values, paths
    joined from them all qualify), environment variables other than the rank's, and names
    whose every binding is such a value (an assignment, a loop over such values, what each
    call of this file passes to a parameter, what a function of this file returns);
    otherwise what makes it differ, or what is not followed."""
    return _differs(context, expr, set())


def unshared_file(context: FileContext, path: cst.BaseExpression) -> str | None:
    """Why the file rank 0 saves at `path` may not be the one every rank then reads back
    (a path that differs per process, or one this analysis does not follow); None when the
    path is the same on every rank."""
    differs = differs_per_process(context, path)
    if differs is None:
        return None
    shown, culprit = context.source(path).strip(), context.source(differs.node).strip()
    if differs.temporary:
        where = f"`{shown}` is in a temporary folder each process makes for itself (`{culprit}`)"
    elif differs.source:
        where = f"`{shown}` is built from `{culprit}`, which differs in every process"
    else:
        where = f"PM601 cannot tell that `{shown}` is the same path on every rank (`{culprit}` is not followed)"
    return (
        f"{where}; rank 0 alone saves the checkpoint there and every rank reads it back: "
        "build the path from values all ranks share (literals, options, config values)"
    )


def _differs(context: FileContext, expr: cst.BaseExpression, seen: set[int]) -> PerProcess | None:
    if id(expr) in seen:
        return None
    seen.add(id(expr))
    names = context.names
    for call in context.index.find(cst.Call, within=expr):
        if names.of(call.func) & PER_PROCESS_SOURCES or names.startswith(call.func, PER_PROCESS_MODULES):
            return PerProcess(call, True, bool(names.startswith(call.func, ("tempfile",))))
        if names.of(call.func) & {"os.getenv", "os.environ.get"} and _rank_variable(call.args[:1]):
            return PerProcess(call, True)
        function = context.bindings.local_function(call.func)
        if function is not None:
            for value in returned_values(function):
                found = _differs(context, value, seen)
                if found is not None:
                    return found
    for read in context.index.find(cst.Subscript, within=expr):
        if names.of(read.value) & {"os.environ"} and _rank_variable(read.slice):
            return PerProcess(read, True)
    for name in names_read(expr):
        found = _name_differs(context, name, seen)
        if found is not None:
            return found
    return None


def _rank_variable(arguments) -> bool:
    """Do `arguments` (call arguments or subscript elements) name a rank's own variable?"""
    for argument in arguments:
        value = getattr(argument, "value", None)
        value = getattr(value, "value", value)  # SubscriptElement -> Index -> expression
        if isinstance(value, cst.SimpleString) and value.evaluated_value in PER_PROCESS_ENVIRONMENT:
            return True
    return False


def _name_differs(context: FileContext, name: cst.Name, seen: set[int]) -> PerProcess | None:
    scope = context.scopes.get(name)
    if scope is None:
        return PerProcess(name, False)
    for assignment in scope[name.value]:
        if type(assignment) is not Assignment:
            continue  # an import or a builtin: its calls are judged where they are made
        node = assignment.node
        if isinstance(node, cst.Param):
            found = _param_differs(context, name, node, seen)
        else:
            found = _binding_differs(context, name, context.bindings.statement(node), seen)
        if found is not None:
            return found
    return None


def _binding_differs(context: FileContext, name: cst.Name, statement, seen: set[int]) -> PerProcess | None:
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return None  # a definition: the same code in every process
    if isinstance(statement, (cst.Assign, cst.AugAssign, cst.NamedExpr)) or (
        isinstance(statement, cst.AnnAssign) and statement.value is not None
    ):
        return _differs(context, statement.value, seen)
    if isinstance(statement, (cst.For, cst.CompFor)):
        return _differs(context, statement.iter, seen)
    if isinstance(statement, cst.With):
        for item in statement.items:
            found = _differs(context, item.item, seen)
            if found is not None:
                return found
        return None
    return PerProcess(name, False)


def _param_differs(context: FileContext, name: cst.Name, param: cst.Param, seen: set[int]) -> PerProcess | None:
    function = context.parents.get(context.parents.get(param))
    if not isinstance(function, cst.FunctionDef):
        return PerProcess(name, False)
    calls = calls_of(context, function)
    if not calls:
        return PerProcess(name, False)
    for call in calls:
        value = argument_of(context, call, function, param)
        if value is None and param.default is None:
            return PerProcess(name, False)
        found = _differs(context, value if value is not None else param.default, seen)
        if found is not None:
            return found
    return None

from __future__ import annotations

import libcst as cst

from codemod.analysis.loader_workers import Blocker, loader_workers
from codemod.analysis.loaders import Returned
from codemod.analysis.names import number_value
from codemod.analysis.project import project_of
from codemod.edits import AddKeyword, Replace, bound_before
from codemod.rule import Invalid, Level, Rule, Valid

IMPORT = ("runtime.data", "default_num_workers")

BATCH_SAMPLER = (
    "; to load faster, index whole batches: a `BatchSampler` as `sampler=` with `batch_size=None` gives the "
    "TensorDataset a batch's indices at once"
)
# Why a loader is left without workers, by the kind of blocker loader_workers finds
# (`source` and `line`: the node it names; `what`: the dataset).
BLOCKERS = {
    "hidden": "; `**{source}` cannot be seen whole here, so num_workers is not added",
    "indexes": "; left without workers: {named} only indexes tensors the training process already holds, so "
    "workers would do the same indexing in other processes and send every batch back, which costs about what the "
    "indexing does",
    "explicit": "; give it worker processes (e.g. `runtime.data.default_num_workers()`) unless the dataset must "
    "load in the main process",
    "star_args": "; `*args` may already pass num_workers, so it is not added",
    "changed": "; the training loop changes its dataset (`{source}`, line {line}), which worker processes, holding "
    "their own copy, would not see: make that change inside the workers (in `__getitem__` from the epoch, or a "
    "shared value), then set num_workers",
    "unsharded": "; its IterableDataset does not shard by torch.utils.data.get_worker_info() in __iter__, so each "
    "worker would yield every item: shard it, then set num_workers",
    "style": "; the rule cannot see whether `{what}` is map-style (an IterableDataset that does not shard would "
    "yield every item once per worker): check it, then set num_workers",
    "draw": "; not fixed: `{source}` (line {line}) draws from a generator the dataset holds, and every worker "
    "process would get a copy of it in the same state and draw the same numbers as the others: seed it in each "
    "worker (from `torch.utils.data.get_worker_info()`, or in a `worker_init_fn`), then set num_workers",
    "unpicklable": "; not fixed: the loader or its dataset holds a lambda or a function or class defined inside a "
    "function, which workers started by spawn (macOS, Windows) cannot receive, a reason to load in the training "
    "process",
}
PREAMBLE = """\
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
class Waves(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        t = torch.linspace(0, 1, 8)
        return torch.sin(t * (1 + i % 4)), torch.ones(1) * (i % 4)
dataset = Waves()
"""
# A dataset whose items are rows of tensors the process holds: workers have nothing to do.
ROWS = "rows = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))\n"
WINDOWS = (
    "class Windows(Dataset):\n    def __init__(self, data, n):\n        self.data = data\n        self.n = n\n"
    "    def __len__(self):\n        return self.data.size(0) // self.n\n"
    "    def __getitem__(self, i):\n        start = torch.randint(0, self.data.size(0) - self.n - 1, (1,)).item()\n"
    "        full = self.data[start : start + self.n + 1].clone().float()\n        return full[:-1], full[-1:]\n"
    "windows = Windows(torch.randn(640), 8)\n"
)
STEP = (
    "    loss = torch.nn.functional.mse_loss(model(x), y)\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n"
)
GUARDED_STEP = "        loss = torch.nn.functional.mse_loss(model(x), y)\n        loss.backward()\n        opt.step()\n"
# What the fix writes: the count bound once, then passed (one argument a line where the
# call no longer fits on one, as black and ruff format it).
COUNT = "num_workers = default_num_workers()\n"
FORK_COUNT = "num_workers = default_num_workers(fork_only=True)\n"
WORKERS = "num_workers=num_workers, persistent_workers=num_workers > 0"


def _imported(code: str) -> str:
    """`code` with the import the fix adds, where the engine puts it: sorted into the
    third-party imports, a blank line after them."""
    last = "from torch.utils.data import DataLoader, Dataset, TensorDataset\n"
    code = code.replace(last, last + "\n", 1)
    return code.replace("import torch\n", "import torch\nfrom runtime.data import default_num_workers\n", 1)


def _guarded(body: str) -> str:
    return (
        "def main():\n"
        + "".join("    " + line + "\n" for line in body.splitlines())
        + '\nif __name__ == "__main__":\n    main()\n'
    )


class SingleProcessLoaderInTrainingLoop(Rule):
    """
    ## What it does
    Finds `torch.utils.data.DataLoader`s that feed a training loop (the loop
    that calls `backward()` and steps an optimizer iterates over them, also
    through `enumerate`, `tqdm`, `zip` and helper functions that build and
    return the loader) and load their batches in the training process (no
    `num_workers`, or `num_workers=0` written out over a dataset that works for
    each item), and gives them worker processes: the count
    `num_workers = default_num_workers()` (`runtime.data`: one per usable core,
    one core left to training, at most 8, `PERFMOD_NUM_WORKERS` overrides),
    computed once before the loader, then `num_workers=num_workers` and
    `persistent_workers=num_workers > 0`. A loader built anew on each pass of
    a loop around the training loop (one loader per epoch) gets
    `num_workers=default_num_workers()` alone: its workers would not outlive
    the pass, so there is nothing for them to persist for.

    ## Why is this bad?
    With `num_workers=0` every `__getitem__`, transform and collate runs in the
    training process between two steps: the GPU (or the CPU's compute threads)
    waits while the next batch is decoded, augmented and stacked. Worker
    processes load the next batches while the current step runs (each keeps
    `prefetch_factor=2` batches ready). `persistent_workers` keeps them alive
    between epochs instead of starting them, and copying the dataset to them,
    every epoch. A loop that waits for its data then waits at most for the
    slowest of the workers, up to the number of workers times less. The count
    is chosen when the script runs, not written in: a literal suits one
    machine, oversubscribes a smaller one and under-uses a larger one.
    `persistent_workers` is
    written as a comparison because torch 2.13 raises
    `ValueError: persistent_workers option needs num_workers > 0` when it is
    `True` and the machine gives no worker. `prefetch_factor` is left at
    torch's default (2 batches per worker): giving it with 0 workers raises
    too.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=64, shuffle=True)
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    ```
    Use instead:
    ```python
    from runtime.data import default_num_workers

    num_workers = default_num_workers()
    loader = DataLoader(
        dataset,
        batch_size=64,
        shuffle=True,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )
    ```

    ## Fix safety
    Unsafe. For a map-style dataset the sampler still runs in the training
    process, and the batches come back in the sampler's order with the same
    values (tested, torch 2.13, `shuffle=True`); what can change:

    - Randomness inside `__getitem__`, transforms or `collate_fn`: each worker
      seeds torch, `random` (and NumPy) from the loader's base seed plus its id,
      so random augmentations differ from a single-process run, and they no
      longer draw from the training process's generator (dropout then differs).
    - From the second epoch on: a persistent iterator draws the loader's base
      seed once, not once per epoch, so the global generator (or the loader's
      `generator=`) is one draw behind the original's in every later epoch: a
      different shuffle order and different dropout, equally random (tested).
    - Memory: each worker holds a copy of the dataset object.
    - Datasets whose `__getitem__` has side effects on the training process
      (counters, caches) see them happen in the workers.

    A loader whose batches are only rows of tensors the training process
    already holds (torch's `TensorDataset`, subsets, concatenations and splits
    of one, a dataset class whose `__getitem__` only indexes or slices tensors,
    lists or a pandas table it was given or built in `__init__` (texts
    tokenized and padded there), converts them or makes tensors of them
    (`torch.tensor(self.ids[i])`) and draws a random index; torch's own collate) is reported, not fixed: a worker would do the
    same indexing in another process and send each batch back through shared
    memory, which costs about what the indexing does (more, for small
    batches). For a `TensorDataset` the report gives what does load faster:
    a `BatchSampler` passed as `sampler=` with `batch_size=None`, so that each
    batch is one indexing of the tensors instead of one per sample.

    `num_workers=0` written out (in the call or its `**kwargs` dict) is fixed
    like a loader without it when the dataset does work for each item
    (`__getitem__` calls something other than indexing: a decoder, a
    tokenizer, a file read, a transform, torch math; or loops) or the loader
    has a `collate_fn` of its own, unless the loader or its dataset holds a
    lambda or a nested function or class (spawned workers could not receive
    it: perhaps why it is 0; reported). A 0 that comes from a setting
    (`args.workers`, a configuration dict) or by position, or over a dataset
    the rule cannot see into, is reported: the choice is the configuration's.

    A dataset that draws random numbers for its items from a generator object
    it holds (`torch.randn(shape, generator=self.gen)` in `__getitem__`) is
    reported, not fixed: each worker process gets a copy of that generator in
    the same state (torch reseeds only its global generators in workers), so
    the workers would draw the same numbers as one another.

    It is never fixed when the workers would be wrong or pointless: an
    `IterableDataset` whose `__iter__` does not shard by
    `torch.utils.data.get_worker_info()` (every worker would yield every item:
    reported without a fix), a dataset the rule cannot see the class of
    (reported without a fix, for the same reason), data already on the GPU
    (`TensorDataset(x.cuda())`, a dataset class or `collate_fn` that moves to a
    device: CUDA cannot be used in forked workers), a DataLoader subclass of
    this file that overrides `__init__` or `__iter__`, a dataset the training
    loop changes (`dataset.set_epoch(epoch)`: each worker keeps its own copy
    and would not see it; reported without a fix), a loader that already
    passes `num_workers`, `persistent_workers`, `prefetch_factor` or
    `multiprocessing_context` (in its call or its `**kwargs` dict), `*args`.
    A loader that a function of this file builds and returns
    (`def make_loader(cfg): ... return DataLoader(...)`) is fixed here, where
    it is built, when a module of the same package that calls the function
    trains on its batches (its training loop iterates the loader, itself or
    in a function of the project it hands the loader to): the modules of the
    package that import this one are read to find those calls. When a caller
    changes the loader's dataset between epochs
    (`dl.dataset.set_epoch(epoch)`), the fix gives workers without
    `persistent_workers`: workers started for each epoch copy the changed
    dataset, persistent ones would keep their first copy. Those callers'
    files then report nothing for the loader. A loader built by a function of
    another module of the project (`data.make_loaders(cfg)`) whose module does
    not see this file's training loop among its callers (this file is in
    another package, or perfmod cannot match the call) is reported at that
    call, with the file and line of the DataLoader: perfmod does not edit
    another file, and does not look at that loader's dataset.
    A loader (built here, or by such a factory) that this file passes to a
    function of another module whose training loop copies its batches to a
    device is reported at its construction (or the factory call), never
    fixed: the loop, and what it does to the dataset between epochs, are in
    another file. When a function on the way changes the loader's dataset
    (`dl.dataset.set_epoch(epoch)`), the message says so and advises workers
    without `persistent_workers`: workers started for each epoch take the
    changed dataset, persistent ones keep their first copy.

    Start methods: under `spawn` and `forkserver` (macOS, Windows, Linux from
    Python 3.14) workers receive the dataset and `collate_fn` by pickle and
    re-import the main script. When the loader's arguments or dataset hold a
    lambda or a nested function or class, or when the training loop runs in
    module code outside an `if __name__ == "__main__":` guard, the fix writes
    `default_num_workers(fork_only=True)`, which gives 0 workers (the
    original's behaviour) unless workers start by `fork`.
    """

    CODE = "PM201"
    NAME = "single-process-loader-in-training-loop"
    LEVEL = Level.UNSAFE
    # "import": a loader handed to a function of another module of the project needs no mention here.
    REQUIRES = ("DataLoader", "import")
    # PM202 turns hand-made batching into a DataLoader, which this rule then configures:
    # it runs on PM202's output, so that one run leaves nothing pending.
    AFTER = ("PM202",)
    MESSAGE = "this DataLoader feeds the training loop and loads every batch in the training process; give it worker processes"
    GAIN = "data-bound loops: loading overlaps with the step, up to num_workers times faster loading"

    VALID = [
        Valid(
            PREAMBLE + "loader = DataLoader(dataset, batch_size=8, num_workers=2)\nfor x, y in loader:\n" + STEP,
            "an explicit worker count is kept",
        ),
        Valid(
            PREAMBLE + "kwargs = {'num_workers': 1, 'pin_memory': True} if torch.cuda.is_available() else {}\n"
            "loader = DataLoader(dataset, batch_size=8, **kwargs)\nfor x, y in loader:\n" + STEP,
            "a worker count chosen by device, through a dict",
        ),
        Valid(
            PREAMBLE + "loader = DataLoader(dataset, 8, False, None, None, 2)\nfor x, y in loader:\n" + STEP,
            "num_workers passed by position",
        ),
        Valid(
            PREAMBLE + "import argparse\nparser = argparse.ArgumentParser()\n"
            "parser.add_argument('--workers', type=int, default=4)\nargs = parser.parse_args()\n"
            "loader = DataLoader(dataset, batch_size=8, num_workers=args.workers)\nfor x, y in loader:\n" + STEP,
            "a configured worker count that is not 0",
        ),
        Valid(
            PREAMBLE + "loader = DataLoader(dataset)\nfor x, y in loader:\n    print(model(x).sum())\n",
            "not a training loop",
        ),
        Valid(
            PREAMBLE + "cuda_set = TensorDataset(torch.randn(64, 8).cuda(), torch.randn(64, 1).cuda())\n"
            "loader = DataLoader(cuda_set)\nfor x, y in loader:\n" + STEP,
            "data already on the GPU",
        ),
        Valid(
            PREAMBLE + "class Prefetching(DataLoader):\n    def __iter__(self):\n        return super().__iter__()\n"
            "loader = Prefetching(dataset)\nfor x, y in loader:\n" + STEP,
            "a subclass that overrides __iter__",
        ),
        Valid(
            PREAMBLE + "class OnDevice(torch.utils.data.Dataset):\n    def __len__(self):\n        return 64\n"
            "    def __getitem__(self, i):\n        return torch.randn(8, device='cuda'), torch.randn(1, device='cuda')\n"
            "loader = DataLoader(OnDevice(), batch_size=8)\nfor x, y in loader:\n" + STEP,
            "__getitem__ makes CUDA tensors: CUDA cannot run in forked workers",
        ),
        Valid(
            PREAMBLE + "kwargs = {'batch_size': 8, 'num_workers': 2}\n"
            "loader = DataLoader(dataset, **kwargs)\nfor x, y in loader:\n" + STEP,
            "the kwargs dict sets num_workers",
        ),
    ]
    INVALID = [
        # An explicit num_workers=0 (written, or the default of the script's configuration)
        # feeding a training loop: reported, the choice left to the user.
        Invalid(
            PREAMBLE + "loader = DataLoader(dataset, batch_size=8, num_workers=0)\nfor x, y in loader:\n" + STEP,
            _imported(
                PREAMBLE
                + FORK_COUNT
                + f"loader = DataLoader(\n    dataset, batch_size=8, {WORKERS}\n)\nfor x, y in loader:\n"
                + STEP
            ),
            "num_workers=0 written out, over a dataset that computes every item: fixed like the default",
        ),
        Invalid(
            PREAMBLE
            + ROWS
            + _guarded("loader = DataLoader(rows, batch_size=8, num_workers=0)\nfor x, y in loader:\n" + STEP),
            None,
            "num_workers=0 over rows of tensors in memory: right as written",
        ),
        Invalid(
            PREAMBLE + ROWS + _guarded("loader = DataLoader(rows, batch_size=8)\nfor x, y in loader:\n" + STEP),
            None,
            "a TensorDataset: each item is an index into memory the process holds",
        ),
        Invalid(
            PREAMBLE + WINDOWS + _guarded("loader = DataLoader(windows, batch_size=8)\nfor x, y in loader:\n" + STEP),
            None,
            "__getitem__ slices a tensor it was given: nothing for workers to take off the training process",
        ),
        Invalid(
            PREAMBLE + "class Noisy(Dataset):\n    def __init__(self):\n        self.clean = torch.rand(64, 8)\n"
            "        self.gen = torch.Generator().manual_seed(0)\n    def __len__(self):\n        return 64\n"
            "    def __getitem__(self, i):\n"
            "        return self.clean[i] + torch.randn(8, generator=self.gen), self.clean[i, :1]\n"
            + _guarded("loader = DataLoader(Noisy(), batch_size=8)\nfor x, y in loader:\n" + STEP),
            None,
            "noise drawn from a generator the dataset holds: each worker's copy would draw the same numbers",
        ),
        Invalid(
            PREAMBLE
            + _guarded(
                "loader = DataLoader(dataset, batch_size=8, num_workers=0, collate_fn=lambda b: b)\n"
                "for x, y in loader:\n" + STEP
            ),
            None,
            "num_workers=0 beside a lambda spawned workers could not receive: perhaps why it is 0",
        ),
        Invalid(
            PREAMBLE + "loader = DataLoader(dataset, 8, False, None, None, 0)\nfor x, y in loader:\n" + STEP,
            None,
            "num_workers=0 passed by position",
        ),
        Invalid(
            PREAMBLE + "import argparse\nparser = argparse.ArgumentParser()\n"
            "parser.add_argument('--num-workers', type=int, default=0)\nargs = parser.parse_args()\n"
            "loader = DataLoader(dataset, batch_size=8, num_workers=args.num_workers)\nfor x, y in loader:\n" + STEP,
            None,
            "an argparse option whose default is 0",
        ),
        Invalid(
            PREAMBLE + "cfg = {'loader': {'num_workers': 0}}\n"
            "loader = DataLoader(dataset, batch_size=8, num_workers=cfg['loader']['num_workers'])\n"
            "for x, y in loader:\n" + STEP,
            None,
            "a configuration dict",
        ),
        Invalid(
            PREAMBLE
            + _guarded(
                "kwargs = {'batch_size': 8, 'num_workers': 0}\nloader = DataLoader(dataset, **kwargs)\n"
                "for x, y in loader:\n" + STEP
            ),
            _imported(
                PREAMBLE
                + _guarded(
                    COUNT + "kwargs = {'batch_size': 8, 'num_workers': num_workers, "
                    "'persistent_workers': num_workers > 0}\nloader = DataLoader(dataset, **kwargs)\n"
                    "for x, y in loader:\n" + STEP
                )
            ),
            "num_workers=0 in the kwargs dict",
        ),
        Invalid(
            PREAMBLE + _guarded("loader = DataLoader(dataset, batch_size=8)\nfor x, y in loader:\n" + STEP),
            _imported(
                PREAMBLE
                + _guarded(
                    COUNT + "loader = DataLoader(\n    dataset,\n    batch_size=8,\n    num_workers=num_workers,\n"
                    "    persistent_workers=num_workers > 0,\n)\nfor x, y in loader:\n" + STEP
                )
            ),
        ),
        Invalid(
            PREAMBLE + "loader = DataLoader(dataset, batch_size=8)\nfor x, y in loader:\n" + STEP,
            _imported(
                PREAMBLE
                + FORK_COUNT
                + f"loader = DataLoader(\n    dataset, batch_size=8, {WORKERS}\n)\nfor x, y in loader:\n"
                + STEP
            ),
            "no __main__ guard: workers only where they start by fork",
        ),
        Invalid(
            PREAMBLE
            + _guarded(
                "loader = DataLoader(dataset, collate_fn=lambda b: torch.utils.data.default_collate(b))\n"
                "for x, y in loader:\n" + STEP
            ),
            _imported(
                PREAMBLE
                + _guarded(
                    FORK_COUNT + "loader = DataLoader(\n    dataset,\n    collate_fn=lambda b: torch.utils.data."
                    "default_collate(b),\n    num_workers=num_workers,\n    persistent_workers=num_workers > 0,\n)\n"
                    "for x, y in loader:\n" + STEP
                )
            ),
            "a lambda cannot be pickled for spawned workers",
        ),
        Invalid(
            PREAMBLE
            + _guarded(
                "train_kwargs = {'batch_size': 8, 'shuffle': True}\n"
                "loader = DataLoader(dataset, **train_kwargs)\nfor x, y in loader:\n" + STEP
            ),
            _imported(
                PREAMBLE
                + _guarded(
                    COUNT + "train_kwargs = {'batch_size': 8, 'shuffle': True, 'num_workers': num_workers, "
                    "'persistent_workers': num_workers > 0}\n"
                    "loader = DataLoader(dataset, **train_kwargs)\nfor x, y in loader:\n" + STEP
                )
            ),
            "the entries go in the kwargs dict",
        ),
        Invalid(
            PREAMBLE + "class Stream(torch.utils.data.IterableDataset):\n    def __iter__(self):\n"
            "        yield from zip(torch.randn(64, 8), torch.randn(64, 1))\n"
            "loader = DataLoader(Stream(), batch_size=8)\nfor x, y in loader:\n" + STEP,
            None,
            "an IterableDataset that does not shard: each worker would yield every item",
        ),
        Invalid(
            PREAMBLE + "class Stream(torch.utils.data.IterableDataset):\n    def __iter__(self):\n"
            "        yield from zip(torch.randn(64, 8), torch.randn(64, 1))\n"
            "def datasets():\n    return Stream(), dataset\n"
            "stream, table = datasets()\nloader = DataLoader(stream)\nfor x, y in loader:\n" + STEP,
            None,
            "the IterableDataset of the tuple a helper returns",
        ),
        Invalid(
            "import torch\nfrom torch.utils.data import DataLoader, Dataset\n"
            "class Views(Dataset):\n    def __init__(self):\n        self.epoch = 0\n"
            "    def set_epoch(self, epoch):\n        self.epoch = epoch\n"
            "    def __len__(self):\n        return 64\n"
            "    def __getitem__(self, i):\n        return torch.randn(8) * self.epoch, torch.randn(1)\n"
            "model = torch.nn.Linear(8, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "dataset = Views()\nloader = DataLoader(dataset, batch_size=8)\nfor epoch in range(3):\n"
            "    dataset.set_epoch(epoch)\n    for x, y in loader:\n"
            + "".join("    " + line + "\n" for line in STEP.splitlines()),
            None,
            "the epoch loop changes the dataset, which workers would not see",
        ),
        Invalid(
            PREAMBLE
            + "def train(data):\n    loader = DataLoader(data)\n    for x, y in loader:\n"
            + "".join("    " + line + "\n" for line in STEP.splitlines()),
            None,
            "a dataset the rule cannot see",
        ),
    ]

    def __init__(self, context) -> None:
        super().__init__(context)
        self._names: dict = {}  # function -> the names the fixes bind worker counts to there

    def visit_Module(self, node: cst.Module) -> None:
        loaders, workers = self.context.loaders, loader_workers(self.context)
        if not loaders.constructions and not loaders.feeds:  # feeds find the loaders of other modules
            if loaders.handoffs:
                self._check_handoffs({})
            return
        feeds, first = workers.training_feeds()
        for loader in loaders.constructions:
            if id(loader) in feeds:
                self._check(loader, feeds[id(loader)])
            elif id(loader) in loaders.returned and loaders.returned[id(loader)].trainer is not None:
                self._check(loader, None, loaders.returned[id(loader)])
        for loader, function, call in loaders.external.values():
            if id(loader) in feeds and not workers.chosen_elsewhere(loader, function):
                call = loaders.factory_call_of(first[id(loader)]) or call  # the call that made this loop's loader
                self._check_elsewhere(loader, function, call, feeds[id(loader)])
        self._check_handoffs(feeds)

    def _check_handoffs(self, feeds: dict[int, cst.CSTNode]) -> None:
        """Loaders (built here, or by a factory of another module) that this file passes to a
        project function whose training loop copies their batches to a device: reported at the
        construction, or at the factory call, never fixed: the loop, and what it does to the
        dataset between epochs, are in another file."""
        project = project_of(self.context)
        for handoff, here, external in loader_workers(self.context).handoffs(feeds):
            change, trainer = handoff.use.dataset_change, self._trainer(handoff.use.loop, handoff.function)
            fed = f"feeds the training loop of {trainer} and loads every batch in the training process"
            persistent = f"not persistent_workers: {self._changed(change)}" if change else "and persistent_workers=True"
            caveat = (
                f"({persistent}), once its dataset is known to be map-style or an IterableDataset that shards by worker"
            )
            if here:
                self.report(
                    handoff.loader,
                    f"this DataLoader {fed}; not fixed: the loop, and what it does to the dataset, are in another "
                    f"module: pass num_workers {caveat}",
                )
            else:
                factory, call = external[1], handoff.factory or external[2]
                self.report(
                    call,
                    f"the DataLoader built by `{factory.qualified}` ({project.shown(factory, handoff.loader)}) {fed}; "
                    f"not fixed: it is built in another module, which perfmod does not edit: pass num_workers there "
                    f"{caveat}",
                )

    def _check_elsewhere(self, loader: cst.Call, function, call: cst.Call, loop: cst.CSTNode) -> None:
        """A DataLoader built in another module of the project (`loader`, by `function`, called
        here as `call`) that feeds a training loop of this file: reported here; the worker
        count belongs in that module, which this rule does not edit."""
        project = project_of(self.context)
        self.report(
            call,
            f"the DataLoader built by `{function.qualified}` ({project.shown(function, loader)}) feeds the training "
            f"loop on line {self.context.line(loop)} and loads every batch in the training process; not fixed: it is "
            "built in another module, which perfmod does not edit: pass num_workers there (and "
            "persistent_workers=True), once its dataset is known to be map-style or an IterableDataset that shards "
            "by worker, and nothing changes the dataset between epochs",
        )

    # -- the decision ------------------------------------------------------------------------

    def _check(self, loader: cst.Call, loop: cst.CSTNode | None, returned: Returned | None = None) -> None:
        """`loop`: the training loop of this file it feeds; or None, and `returned`: the loader
        is returned to callers in other modules of the package, one of which trains on it."""
        workers = loader_workers(self.context)
        count = workers.count(loader)
        if count is None:
            return
        dataset = self.context.loaders.dataset(loader)
        line = self.context.line(loop) if loop is not None else None
        message = (
            f"this DataLoader feeds the training loop on line {line} and loads every batch in the training process"
            if returned is None
            else self._returned_message(returned)
        )
        zero = count.zero
        if zero is not None:
            spelled = self.context.source(zero)
            message = (
                (f"this DataLoader feeds the training loop on line {line}" if returned is None else message)
                + " with num_workers=0"
                + ("" if number_value(zero) == 0 else f" (`{spelled}` is 0 unless the run changes it)")
                + ", so every batch is loaded in the training process between steps"
            )
        blocker = Blocker("hidden", count.hidden) if count.hidden is not None else workers.blocker(loader, count, loop)
        if blocker is None:
            self._fix(loader, loop, returned, count, message)
            return
        node, what = blocker.node, self.context.source(dataset) if dataset is not None else "its dataset"
        source, at = (self.context.source(node), self.context.line(node)) if node is not None else ("", 0)
        named = f"`{what}`" if dataset is not None else what
        reason = BLOCKERS[blocker.kind].format(source=source, line=at, what=what, named=named)
        if blocker.kind == "indexes" and self.context.loaders.rows_of_tensors(dataset):
            reason += BATCH_SAMPLER
        self.report(loader, message + reason)

    def _fix(self, loader: cst.Call, loop, returned: Returned | None, count, message: str) -> None:
        zero, anchor = count.zero, count.anchor
        guarded = self.context.loops.guarded_from_import(loop) if loop is not None else returned.guarded
        fork_only = loader_workers(self.context).unpicklable(loader) or not guarded
        value = cst.parse_expression("default_num_workers(fork_only=True)" if fork_only else "default_num_workers()")
        rebuilt = self.context.loaders.built_each_pass(loader, loop)
        if rebuilt is not None or (returned is not None and returned.dataset_change is not None):
            why = (
                f" (it is built anew on each pass of the loop on line {self.context.line(rebuilt)}, so its workers "
                "would not outlive the pass)"
                if rebuilt is not None
                else ""
            )
            self.report(
                loader,
                message + "; give it worker processes, not persistent ones" + why,
                edits=[Replace(zero, value) if zero is not None else AddKeyword(anchor, "num_workers", value)],
                imports=[IMPORT],
            )
            return
        # The count is read twice (workers, and whether they persist): computed once, before.
        binding, count_name = bound_before(anchor, value, "num_workers", self.context.index, self._names)
        persistent = cst.parse_expression(f"{count_name.value} > 0")
        where = "" if anchor is loader else " (in the kwargs dict)"
        workers = Replace(zero, count_name) if zero is not None else AddKeyword(anchor, "num_workers", count_name)
        self.report(
            loader,
            message + "; give it worker processes" + where,
            edits=[binding, workers, AddKeyword(anchor, "persistent_workers", persistent)],
            imports=[IMPORT],
        )

    def _returned_message(self, returned: Returned) -> str:
        """What a loader returned to callers elsewhere feeds: the first training loop among them."""
        caller, change = returned.trainer, returned.dataset_change
        return (
            f"this DataLoader, returned on line {self.context.line(returned.exit)} to "
            f"{project_of(self.context).shown_site(caller.call)}, feeds the training loop of "
            f"{self._trainer(caller.use.loop, caller.function)} and loads every batch in the training process"
            + (f" ({self._changed(change)})" if change is not None else "")
        )

    def _trainer(self, loop, function) -> str:
        """`name` (path:line[, reached through `function`]) of a training loop of another module."""
        where = f"`{loop.function}` ({project_of(self.context).shown_site(loop)}"
        if loop.function != function.node.name.value:
            where += f", reached through `{function.qualified}`"
        return where + ")"

    def _changed(self, change) -> str:
        """Why workers must not persist: the change of the dataset between epochs, and where."""
        text = f"`{change.text}`" if change.text else "a change of its dataset"
        return (
            f"{text} in `{change.function}` ({project_of(self.context).shown_site(change)}) changes the dataset "
            "between epochs in the training process; workers started for each epoch copy it then, persistent "
            "workers would keep their first copy"
        )

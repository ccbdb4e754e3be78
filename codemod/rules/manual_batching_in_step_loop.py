from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import Assignment, ImportAssignment

from codemod.analysis import match as m
from codemod.analysis.kinds import Kind, Place
from codemod.analysis.loaders import ListBatch
from codemod.analysis.names import integer_value, kwarg, names_read, number_value, positional
from codemod.analysis.project import project_of
from codemod.analysis.sample_loops import sample_loops
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.tensor_splits import bound_in, tensor_splits
from codemod.edits import Edit, InsertBefore, Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.suppression import suppressed_on

IMPORTS = [("torch.utils.data", "DataLoader"), ("torch.utils.data", "TensorDataset")]
RANGE = ("range", "builtins.range")
# Per-step random batches: qualified name -> how the message spells it.
RANDOM_BATCHES = {
    "torch.randint": "torch.randint",
    "random.sample": "random.sample",
    "random.choices": "random.choices",
    "numpy.random.randint": "np.random.randint",
    "numpy.random.choice": "np.random.choice",
}
# Methods of random generator objects that draw a batch: name -> {family: the function it works as}.
GENERATOR_METHODS = {
    "sample": {"random": "random.sample"},
    "choices": {"random": "random.choices"},
    "choice": {"numpy": "numpy.random.choice"},
    "integers": {"numpy": "numpy.random.randint"},
    "randint": {"numpy": "numpy.random.randint"},
}
GENERATORS = {
    "random": ("random.Random",),
    "numpy": ("numpy.random.default_rng", "numpy.random.RandomState", "numpy.random.Generator"),
}
NEXT = ("next", "builtins.next")
MAX_HELPER_DEPTH = 2  # how many calls away from the step loop a batch helper may be
RANDOM_WHY = (
    "(samples repeat and others are skipped within an epoch), gathered in the training process between "
    "steps; not rewritten: a DataLoader(..., shuffle=True) would visit every sample once per epoch instead, a "
    "different sampling scheme. Gathering a few dozen slices of in-memory or memory-mapped data takes under a "
    "millisecond; when building a sample costs more (reading files, decoding, augmenting, tokenizing), move that "
    "into a Dataset read by DataLoader workers, sampled with replacement (RandomSampler(replacement=True)) to keep "
    "the scheme"
)
LOADER_NAMES = ("loader", "train_loader", "batches")

PREAMBLE = """\
import torch
X, Y = torch.randn(100, 8), torch.randn(100, 1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
bs = 16
"""
STEP = (
    "    loss = torch.nn.functional.mse_loss(model(xb), yb)\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n"
)
FIXED_PREAMBLE = PREAMBLE.replace(
    "import torch\n", "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n", 1
)


@dataclass
class _Window:
    """How the loop variable `i` of `for i in range(...)` picks one batch."""

    n: cst.BaseExpression  # the number of samples the loop covers
    drop_last: bool  # the last partial batch is skipped
    matches: m.BaseMatcher  # the slice `[i:i + bs]` (or `[i * bs:(i + 1) * bs]`)
    exact: m.BaseMatcher  # its upper bound when the window is exactly one step wide


@dataclass
class _Plan:
    loop: cst.For
    batch_size: cst.BaseExpression
    window: _Window
    counter: cst.Call  # the `range(...)` the loop (or a wrapper such as enumerate) iterates
    index: cst.Name  # the name its items bind
    tensors: list[str] = field(default_factory=list)  # dataset tensors, in order of first use
    uses: dict[int, str] = field(default_factory=dict)  # id(Subscript) -> tensor it batches
    permutation: str | None = None  # `perm` of `perm = torch.randperm(n)`: shuffled batches
    permutation_reads: set[int] = field(default_factory=set)  # id(Name) of `perm` in the windows
    dimension: tuple[cst.Subscript, int] | None = None  # a window along another dimension than the first
    shorter: cst.Subscript | None = None  # a window `i:i + w` whose width is at most the step
    index_array: str | None = None  # `order` of `X[order[i:i + bs]]` when it is no per-epoch randperm
    windows: list[cst.Subscript] = field(default_factory=list)  # every window of the loop's counter


class ManualBatchingInStepLoop(Rule):
    """
    ## What it does
    Finds training loops that cut batches out of in-memory tensors by hand,
    `for i in range(0, n, bs): xb = X[i:i + bs]`, also through a permutation
    drawn each epoch (`perm = torch.randperm(n)`, `X[perm[i:i + bs]]`), and
    rewrites them to iterate over a `DataLoader(TensorDataset(X, Y),
    batch_size=bs, shuffle=...)` built once before the loop (`for step, i in
    enumerate(range(...))` becomes `for step, (xb, yb) in enumerate(loader)`).
    Batches cut with `split` (`for xb, yb in zip(X.split(bs), Y.split(bs))`,
    `torch.split(X, bs)`) become the same loader with `shuffle=False`.

    It follows the batch to where the file makes it: a generator the training
    loop iterates (`for xb, yb in batches(X, Y, bs)`, `self._batches()`), a
    helper, method or closure it calls every step (`xb, yb = get_batch()`), an
    iterator it takes `next()` from. These are reported without a fix, as are
    batches drawn afresh at random every step (`torch.randint`,
    `random.sample`, also through a generator object such as
    `random.Random(0)` or `np.random.default_rng()`) and windows whose order
    matters (a truncated-BPTT hidden state carried from one to the next). A
    random draw is reported where it is drawn, a generator's windows at the
    loop that iterates it.

    Batches of a Python list cut from a permutation and looked up item by item
    (`idx = perm[step * bs:(step + 1) * bs]`, `batch = [texts[i] for i in
    idx.tolist()]`), then tokenized or otherwise processed in the step, get
    the DataLoader an expert writes instead: over the list, shuffled, with a
    collate_fn that does that work (in worker processes, which PM201 adds,
    while the model trains). When the step's only work on them is one call
    of a pure function of the module given the batch alone (`ids =
    encode(batch)`), the loop becomes `for ids in DataLoader(texts,
    batch_size=bs, shuffle=True, collate_fn=encode)`; otherwise the finding
    says why not.

    ## Why is this bad?
    Batching by hand keeps the data pipeline in the training process: the
    next batch is only cut, gathered and copied once the previous step is
    done, and none of the DataLoader's machinery applies: worker processes
    for per-sample work, pinned memory and copies that overlap compute
    (PM102, PM103 and PM201 add those to a DataLoader, never to hand-written
    indexing). On its own the change is not a speed-up: for tensors that are
    already in memory, a DataLoader fetches samples one by one and stacks them,
    which costs more host time per batch than one slice. Measured on the CPU
    (torch 2.13, `benchmarks/bench_tokenize.py`, batch 64, a small MLP): 0.8
    ms per step with slices, 1.8 ms with `DataLoader(TensorDataset)`, the
    loader's fetch then 31% of the step. The gain comes from what it makes
    possible: per-sample host work (texts, augmentation) moved into workers,
    and for tensors, pinned memory and copies overlapped on a GPU (PM102,
    PM103; PM201 gives no workers to rows of tensors already in memory,
    where they would only move the indexing).
    Random crops are cheap too: 12 crops of 1,024 tokens from a memory-mapped
    file took 0.24 ms per batch, 64 crops of 256 from an in-memory tensor 0.6
    ms (CPU, page cache warm). There the finding is about the sampling (with
    replacement, where a DataLoader with `shuffle=True` visits every sample
    once per epoch); a DataLoader with workers pays off once building a sample
    costs more: reading files, decoding, augmenting, tokenizing.

    ## Example
    ```python
    for epoch in range(epochs):
        for i in range(0, len(X), bs):
            xb, yb = X[i:i + bs], Y[i:i + bs]
            loss = F.mse_loss(model(xb), yb)
            ...
    ```
    Use instead:
    ```python
    loader = DataLoader(TensorDataset(X, Y), batch_size=bs, shuffle=False)
    for epoch in range(epochs):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            ...
    ```

    ## Fix safety
    Unsafe. For contiguous slices without a permutation, the DataLoader
    (`shuffle=False`) yields the same batches in the same order, values equal
    bit for bit, and the last partial batch is kept or dropped as the
    original's `range` did (`drop_last=True` for `range(0, n - bs + 1, bs)`
    and `range(n // bs)`). The losses are the same bit for bit unless the step
    draws from torch's global random generator (dropout, sampling): each pass
    over a DataLoader draws one number from it to seed its workers, so later
    random draws differ from the original's. The batches
    are new tensors, no longer views of `X`: a loop that writes into its
    batch in place (which would have changed `X`) is reported without a fix.
    With a per-epoch `torch.randperm`, the DataLoader (`shuffle=True`) still
    visits every sample once per epoch in batches of `bs`, but draws its
    permutation from another random stream: batches, and every random number
    drawn after them (dropout, initialisation), differ from the original's.
    The rule fixes only tensors it knows are on the host and a range it can
    tell covers them (`len(X)`, `X.size(0)`, `X.shape[0]`, or the size `X`
    was built with: `n = 100`, `X = torch.randn(n, 7)`); split tensors must
    have lengths it can tell are equal (`zip` stops at the shortest, a
    `TensorDataset` requires equal ones) and one batch size; tensors on the GPU
    are left alone (a slice of a GPU tensor is already the fastest batch).
    Batches made by a helper or generator are not rewritten: other code may
    call it, and its windows are bound to its parameters; the report names the
    DataLoader that would replace it when the data are host tensors. Windows
    along a later dimension (`X[:, t:t + n]`), of a width that varies
    (`X[i:i + min(bs, ...)]`) or picked through an index array other than a
    per-epoch `torch.randperm` (a shuffled `np.arange`) are reported with the
    reason. Batches of a Python list become a DataLoader only when the
    permutation is a fresh `torch.randperm(len(texts))` each epoch (its own
    seeded `generator=` is kept: reported), the loop counts exactly the batches
    of the list (`range(n // bs)`: `drop_last=True`; `range((n + bs - 1) //
    bs)` or `range(0, n, bs)`: the shorter last batch kept), the indices are
    used for nothing else, and the work is one call of a module-level function
    that reads only its argument (a worker process started earlier would see
    a module variable as it was then): the batches then hold the same values
    the step computed, from another shuffle, as for tensors above. A tokenizer
    held by an object of another module or a library cannot be followed and
    is reported. A look-up with no work on the items is not reported: a
    DataLoader would only move it.
    """

    CODE = "PM202"
    NAME = "manual-batching-in-step-loop"
    LEVEL = Level.UNSAFE
    REQUIRES = ("range", "randint", "sample", "choice")
    MESSAGE = "batches are cut from in-memory tensors by hand in the training loop; iterate over a DataLoader"
    GAIN = (
        "none by itself on in-memory tensors; enables workers, pinned memory and overlapped copies (PM102/PM103/PM201)"
    )

    VALID = [
        Valid(
            PREAMBLE + "X, Y = X.cuda(), Y.cuda()\nfor i in range(0, len(X), bs):\n"
            "    xb, yb = X[i:i + bs], Y[i:i + bs]\n" + STEP,
            "tensors on the GPU: a slice is the fastest batch",
        ),
        Valid(
            PREAMBLE + "for i in range(0, len(X), bs):\n    xb, yb = X[i:i + bs], Y[i:i + bs]\n", "not a training loop"
        ),
        Valid(
            PREAMBLE + "from torch.utils.data import DataLoader, TensorDataset\n"
            "for xb, yb in DataLoader(TensorDataset(X, Y), batch_size=bs):\n" + STEP,
            "already a DataLoader",
        ),
        Valid(
            PREAMBLE + "for i in range(0, len(X), bs):\n    xb, yb = X[i:i + 2 * bs], Y[i:i + 2 * bs]\n" + STEP,
            "overlapping windows are not batches",
        ),
        Valid(
            PREAMBLE + "def get_batch():\n    idx = torch.randint(0, len(X), (bs,))\n    return X[idx], Y[idx]\n\n\n"
            "xb, yb = get_batch()\nfor step in range(100):\n" + STEP,
            "one batch drawn before the loop and trained on again and again",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + "for epoch in range(3):\n    for i in range(0, len(X), bs):\n"
            "        xb = X[i:i + bs]\n        yb = Y[i:i + bs]\n" + STEP.replace("    ", "        "),
            FIXED_PREAMBLE + "loader = DataLoader(TensorDataset(X, Y), batch_size=bs, shuffle=False)\n"
            "for epoch in range(3):\n    for xb, yb in loader:\n" + STEP.replace("    ", "        "),
            "contiguous slices: the same batches in the same order",
        ),
        Invalid(
            PREAMBLE.replace(
                "X, Y = torch.randn(100, 8), torch.randn(100, 1)",
                "n = 100\nX, Y = torch.randn(n, 8), torch.randn(n, 1)",
            )
            + "for i in range(0, n, bs):\n    xb, yb = X[i:i + bs], Y[i:i + bs]\n"
            + STEP,
            FIXED_PREAMBLE.replace(
                "X, Y = torch.randn(100, 8), torch.randn(100, 1)",
                "n = 100\nX, Y = torch.randn(n, 8), torch.randn(n, 1)",
            )
            + "loader = DataLoader(TensorDataset(X, Y), batch_size=bs, shuffle=False)\nfor xb, yb in loader:\n"
            + STEP,
            "the range is the size the tensors were made with",
        ),
        Invalid(
            PREAMBLE + "for i in range(len(X) // bs):\n    xb = X[i * bs:(i + 1) * bs].float()\n"
            "    yb = Y[i * bs:(i + 1) * bs]\n" + STEP,
            FIXED_PREAMBLE + "loader = DataLoader(TensorDataset(X, Y), batch_size=bs, shuffle=False, drop_last=True)\n"
            "for xb, yb in loader:\n    xb = xb.float()\n" + STEP,
            "counted batches drop the last partial one; a batch converted into its own name",
        ),
        Invalid(
            PREAMBLE + "for epoch in range(3):\n    perm = torch.randperm(X.size(0))\n"
            "    for i in range(0, X.size(0), bs):\n        idx = perm[i:i + bs]\n        xb, yb = X[idx], Y[idx]\n"
            + STEP.replace("    ", "        "),
            FIXED_PREAMBLE + "loader = DataLoader(TensorDataset(X, Y), batch_size=bs, shuffle=True)\n"
            "for epoch in range(3):\n    for xb, yb in loader:\n" + STEP.replace("    ", "        "),
            "a permutation per epoch: shuffle=True",
        ),
        Invalid(
            PREAMBLE + "perm = torch.randperm(len(X))\nfor epoch in range(3):\n"
            "    for i in range(0, len(X), bs):\n        xb, yb = X[perm[i:i + bs]], Y[perm[i:i + bs]]\n"
            + STEP.replace("    ", "        "),
            None,
            "one permutation for all epochs: shuffle=True would reshuffle",
        ),
        Invalid(
            PREAMBLE + "h = torch.zeros(1, 8)\nfor i in range(0, len(X), bs):\n    xb, yb = X[i:i + bs], Y[i:i + bs]\n"
            "    h = (h + xb.mean(0)).detach()\n" + STEP.replace("model(xb)", "model(xb + h)"),
            None,
            "state carried from window to window: order matters",
        ),
        Invalid(
            PREAMBLE
            + "for step in range(100):\n    idx = torch.randint(0, len(X), (bs,))\n    xb, yb = X[idx], Y[idx]\n"
            + STEP,
            None,
            "a random batch every step, with replacement across steps",
        ),
        Invalid(
            PREAMBLE + "import random\ntexts = ['a', 'b', 'c']\nfor step in range(100):\n"
            "    idx = random.sample(range(len(texts)), 2)\n    batch = [texts[i] for i in idx]\n"
            "    xb, yb = X[:2], Y[:2]\n" + STEP,
            None,
            "random indices into a list of texts (LatentWire)",
        ),
        Invalid(
            PREAMBLE + "texts = [str(i) for i in range(100)]\n\n\ndef encode(batch):\n"
            "    return torch.tensor([[float(t)] * 8 for t in batch])\n\n\nfor epoch in range(3):\n"
            "    perm = torch.randperm(len(texts))\n    for step in range(len(texts) // bs):\n"
            "        idx = perm[step * bs:(step + 1) * bs]\n        batch = [texts[i] for i in idx.tolist()]\n"
            "        xb, yb = encode(batch), Y[:bs]\n" + STEP.replace("    ", "        "),
            None,
            "texts of a list looked up through a permutation and turned into tensors in the step (LatentWire)",
        ),
        Invalid(
            PREAMBLE + "for i in range(0, len(X), bs):\n    xb, yb = X[i:i + bs], Y[i:i + bs]\n    print(i)\n" + STEP,
            None,
            "the index is used for more than slicing",
        ),
        Invalid(
            PREAMBLE + "def get_batch():\n    idx = torch.randint(0, len(X), (bs,))\n    return X[idx], Y[idx]\n\n\n"
            "for step in range(100):\n    xb, yb = get_batch()\n" + STEP,
            None,
            "a helper draws the batch of every step: reported where it draws",
        ),
        Invalid(
            PREAMBLE
            + "def batches():\n    for i in range(0, len(X), bs):\n        yield X[i:i + bs], Y[i:i + bs]\n\n\n"
            "for epoch in range(3):\n    for xb, yb in batches():\n" + STEP.replace("    ", "        "),
            None,
            "a generator cuts the batches: reported at the loop that iterates it",
        ),
    ]

    def __init__(self, context) -> None:
        super().__init__(context)
        self._step_loops: set[int] | None = None
        self._sites: dict[tuple[int, int], list[cst.CSTNode]] = {}

    def _in_step_loops(self, loop: cst.CSTNode) -> bool:
        if self._step_loops is None:
            self._step_loops = {id(loop) for loop in self.context.loops.step_loops}
        return id(loop) in self._step_loops

    # -- per-step random batches: reported --------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        key = self._draw(node)
        if key is None:
            return
        data, direct = self._sampled_data(node, key)
        if not data:
            return
        spelled = self.context.source(node.func) if self._method_draw(node) else RANDOM_BATCHES[key]
        loop = self.context.loops.step_loop_of(node)
        if loop is not None:
            if direct or self._indexes(node, data, loop.body):
                self.report(node, f"`{spelled}` draws a new random batch on every training step {RANDOM_WHY}")
            return
        function = self.context.index.first_enclosing(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef))
        if not isinstance(function, cst.FunctionDef) or not (direct or self._indexes(node, data, function.body)):
            return
        sites = self._per_step_sites(function)
        if sites:
            lines = ", ".join(str(self.context.line(site)) for site in sites)
            self.report(
                node,
                f"`{function.name.value}()`, called by the training loop on line{'s' if len(sites) > 1 else ''} "
                f"{lines}, draws a new random batch on every training step with `{spelled}` {RANDOM_WHY}",
            )

    def _draw(self, call: cst.Call) -> str | None:
        """The key of RANDOM_BATCHES that `call` is: a function of `random`, numpy or torch,
        or a method of a generator object (`rng = random.Random(0)`; `rng.sample(...)`)."""
        key = self._method_draw(call)
        if key is not None:
            return key
        names = self.context.names.of(call.func) & RANDOM_BATCHES.keys()
        return min(names) if names else None

    def _method_draw(self, call: cst.Call) -> str | None:
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in GENERATOR_METHODS):
            return None
        family = self._generator_family(func.value, 0)
        return GENERATOR_METHODS[func.attr.value].get(family) if family is not None else None

    def _generator_family(self, expr: cst.BaseExpression, depth: int) -> str | None:
        """The family of the random generator object `expr` is ("random", "numpy"): bound to
        `random.Random(...)` / `np.random.default_rng(...)` / `np.random.RandomState(...)`,
        through names, `self.` attributes and the arguments of this file's calls."""
        if depth > 3:
            return None
        if isinstance(expr, cst.Call):
            for family, constructors in GENERATORS.items():
                if self.context.names.is_(expr.func, *constructors):
                    return family
            return None
        values: list[cst.BaseExpression] = []
        if isinstance(expr, cst.Name):
            parameter = self.context.bindings.param_of(expr)
            if parameter is not None:
                function, param = parameter
                for call, offset in self.context.kinds.callers(function) or ():
                    passed = self.context.kinds.argument(call, function, param, offset)
                    if passed is None:
                        return None
                    values.append(passed)
            else:
                values = self.context.bindings.values(expr) or []
        elif isinstance(expr, cst.Attribute):
            values = self.context.kinds.self_attribute_values(expr) or []
        families = {self._generator_family(value, depth + 1) for value in values}
        return families.pop() if len(families) == 1 else None

    def _per_step_sites(self, function: cst.FunctionDef, depth: int = 0) -> list[cst.CSTNode]:
        """Where a training loop runs `function` once per step: its calls in the body of a
        step loop, or outside loops in a function run that way; for a generator, the step loops that
        iterate it and the `next(it)` calls of a step loop on it."""
        key = (id(function), depth)
        if key in self._sites:
            return self._sites[key]
        self._sites[key] = []  # recursion: not through this path
        sites: list[cst.CSTNode] = []
        generator = bool(self.context.kinds.exits(function)[1])
        index, loops = self.context.index, self.context.loops
        for call, _ in self.context.kinds.callers(function) or ():
            if generator:
                sites.extend(self._consumers(call))
            elif loops.step_loop_of(call) is not None:
                sites.append(call)
            elif depth < MAX_HELPER_DEPTH:
                # a call in a function that runs once per step (`train_step()`), not in a loop
                # of its own there (`estimate_loss()` draws its evaluation batches in one)
                outer = index.first_enclosing(call, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ClassDef))
                if isinstance(outer, cst.FunctionDef) and self._per_step_sites(outer, depth + 1):
                    sites.append(call)
        self._sites[key] = sites
        return sites

    def _consumers(self, call: cst.Call) -> list[cst.CSTNode]:
        """The step loops that iterate the generator `call` makes (`for b in batches(...)`,
        through enumerate/zip/tqdm), or the `next(it)` calls of step loops on it (`it =
        batches(...)`)."""
        loaders, parents = self.context.loaders, self.context.parents
        loop = self.context.index.first_enclosing(call, (cst.For, cst.FunctionDef, cst.Lambda, cst.ClassDef))
        if isinstance(loop, cst.For) and self.context.inside(call, loop.iter):
            iterated = any(iterable is call for iterable, _ in loaders.iterated(loop.iter, loop.target))
            return [loop] if iterated and self._in_step_loops(loop) else []
        statement = parents.get(call)
        if not (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0].target, cst.Name)
        ):
            return []
        scope = self.context.scopes.get(statement.targets[0].target)
        assignments = (
            [a for a in scope.assignments[statement.targets[0].target.value] if a.node is statement.targets[0].target]
            if scope is not None
            else []
        )
        found: list[cst.CSTNode] = []
        for assignment in assignments:
            for access in assignment.references:
                user = parents.get(parents.get(access.node))
                if (
                    isinstance(user, cst.Call)
                    and self.context.names.is_(user.func, *NEXT)
                    and self.context.loops.step_loop_of(user) is not None
                ):
                    found.append(user)
                loop = parents.get(access.node)
                if isinstance(loop, cst.For) and loop.iter is access.node and self._in_step_loops(loop):
                    found.append(loop)
        return found

    def _sampled_data(self, call: cst.Call, key: str) -> tuple[set[str], bool]:
        """(the names of the data `call` draws sample indices for, whether it draws the samples
        themselves): `torch.randint(0, len(X), ...)`, `random.sample(range(len(texts)), k)`,
        `random.sample(texts, k)`, `np.random.choice(len(X), k)`; empty when the range is not
        the length of something (`torch.randint(0, T, ...)`: timesteps, not samples)."""
        names = self.context.names
        args = [a.value for a in call.args if a.keyword is None and not a.star]
        if key in ("random.sample", "random.choices", "numpy.random.choice"):
            population = args[0] if args else None
            if population is None:
                return set(), False
            if isinstance(population, cst.Call) and names.is_(population.func, *RANGE):
                bound = [a.value for a in population.args]
                return (self._lengths_of(bound[-1] if len(bound) <= 1 else bound[1]) if bound else set()), False
            if isinstance(population, cst.Name):
                lengths = self._lengths_of(population)  # `np.random.choice(n, k)`, n = len(X)
                if lengths:
                    return lengths, False
                return {population.value}, True
            if isinstance(population, cst.Attribute) and isinstance(population.value, cst.Name):
                return {self.context.source(population)}, True  # `rng.sample(self.examples, k)`
            return self._lengths_of(population), False
        high = kwarg(call, "high")
        if high is not None:
            bound = high.value
        elif len(args) >= 3 or (key == "numpy.random.randint" and len(args) >= 2 and kwarg(call, "size") is not None):
            bound = args[1]
        elif args:
            bound = args[0]
        else:
            return set(), False
        return self._lengths_of(bound), False

    def _lengths_of(self, bound: cst.BaseExpression) -> set[str]:
        """The names whose length `bound` is: `len(X)`, `X.shape[0]`, `X.size(0)`, `len(X) - k`,
        `n` where `n = len(X)`."""
        owner = sample_loops(self.context).batch_of_size(bound, less=True)
        return {owner.value} if isinstance(owner, cst.Name) else set()

    def _indexes(self, call: cst.Call, data: set[str], region: cst.CSTNode) -> bool:
        """Do the indices `call` draws pick samples of `data` in `region`: `X[idx]`, or
        `X[i]` / `X[i:i + n]` for each `i` of them (in a loop or a comprehension)?"""
        parent = self.context.parents.get(call)
        if isinstance(parent, cst.Index):  # `X[torch.randint(...)]`
            subscript = self.context.index.first_enclosing(call, cst.Subscript)
            return subscript is not None and _is_data(subscript.value, data)
        if not (
            isinstance(parent, cst.Assign)
            and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)
        ):
            return False
        index = parent.targets[0].target.value
        if self._subscripted_by(region, index, data, slices=False):
            return True
        for each in self.context.index.find((cst.CompFor, cst.For), within=region):
            if (
                _is_name(each.iter, index)
                and isinstance(each.target, cst.Name)
                and self._subscripted_by(
                    self.context.parents.get(each) if isinstance(each, cst.CompFor) else each,
                    each.target.value,
                    data,
                    slices=True,
                )
            ):
                return True
        return False

    def _subscripted_by(self, node: cst.CSTNode, name: str, data: set[str], slices: bool) -> bool:
        """Is one of `data` subscripted under `node` by `name` (`X[name]`), or, with `slices`,
        by a slice that starts from it (`X[name:name + n]`, `X[name + 1:...]`)?"""
        for subscript in self.context.index.find(cst.Subscript, within=node):
            if len(subscript.slice) != 1 or not _is_data(subscript.value, data):
                continue
            part = subscript.slice[0].slice
            if isinstance(part, cst.Index) and _is_name(part.value, name):
                return True
            if (
                slices
                and isinstance(part, cst.Slice)
                and part.lower is not None
                and any(n.value == name for n in self.context.index.find(cst.Name, within=part.lower))
            ):
                return True
        return False

    # -- manual slicing: fixed ----------------------------------------------------

    def visit_For(self, node: cst.For) -> None:
        if not self._in_step_loops(node):
            return
        texts = [batch for batch in self.context.loaders.list_batches if batch.loop is node]
        if texts:
            if not suppressed_on(node, self.CODE):
                for batch in texts:
                    self._report_list_batch(batch)
            return
        counter = self._counter(node)
        if counter is None:
            self._check_splits(node)
            return
        plan = self._plan(node, *counter)
        if plan is None:
            return
        problem = self._find_batches(plan)
        if problem is None:
            problem = self._check(plan)
        if problem == "" or suppressed_on(node, self.CODE):
            return  # not manual batching, or batches of GPU tensors (already the fastest)
        if problem is not None:
            self.report(
                node,
                f"batches are cut from in-memory data by hand in this training loop; not rewritten "
                f"to a DataLoader because {problem}",
            )
            return
        self._fix(plan)

    # -- batches looked up in a Python list through a permutation: reported ---------------

    def _report_list_batch(self, batch: ListBatch) -> None:
        """`idx = perm[step * bs:(step + 1) * bs]`, `texts_b = [texts[i] for i in idx.tolist()]`
        and work on the items in the step (tokenizing): the expert's DataLoader tokenizes in
        its collate_fn, in worker processes, while the model trains."""
        if not batch.work:
            return  # the items go to the model as they are: a DataLoader would only move a list look-up
        source, line = self.context.source, self.context.line
        corpus = source(batch.corpus)
        opaque = next((call for call in batch.work if not self._followed(call)), None)
        named = list(dict.fromkeys(source(call.func) for call in batch.work))[:3]
        work = ", ".join(f"`{name}(...)`" for name in named)
        if opaque is not None:
            why = (
                f"`{source(opaque.func)}` (line {line(opaque)}) is not a function perfmod can follow (an object "
                "of another module or a library reached through attributes), so it cannot tell that the call is "
                "pure and that a worker process may run it"
            )
        else:
            fix = self._list_batch_fix(batch)
            if not isinstance(fix, str):
                return
            why = fix
        carried = ""
        if batch.other_reads:
            read = batch.other_reads[0]
            used = self.context.index.first_enclosing(read, (cst.Subscript, cst.Call)) or read
            carried = (
                f", its items also carrying what the indices pick elsewhere (`{source(used)}`, line {line(read)}),"
            )
        self.report(
            batch.loop,
            f"each step cuts its batch of `{corpus}`, a Python list, from a permutation by hand "
            f"(`{source(batch.window.subscript)}`, line {line(batch.window.subscript)}), looks the items up one "
            f"by one and runs {work} (from line {line(batch.work[0])}) on them in the training process, "
            f"between steps; a DataLoader over `{corpus}` (shuffle=True, a seeded `generator=` to keep the order "
            f"reproducible){carried} whose collate_fn does that work in `num_workers` worker processes would "
            f"prepare the next batch while the model trains; not rewritten because {why}",
        )

    def _list_batch_fix(self, batch: ListBatch) -> str | None:
        """Rewrite the loop to iterate a DataLoader over the list whose collate_fn is the
        step's work (`ids = encode(batch)`, a pure function of this module): None when
        rewritten, else why not."""
        loop, source, values = batch.loop, self.context.source, self.context.bindings.values
        if batch.other_reads:
            return "the indices are also used besides looking the items up"
        loops = (cst.For, cst.While)
        if not batch.per_epoch or self.context.index.first_enclosing(
            batch.permutation, loops
        ) is not self.context.index.first_enclosing(self.context.parents.get(loop), loops):
            return "the permutation is not drawn anew for each pass of the loop (a DataLoader would draw one per pass)"
        if self.context.kinds.is_mutated_in_place(batch.corpus):
            return f"`{self.context.source(batch.corpus)}` is changed in place"
        n = positional(batch.permutation, 0)
        if n is None or len(batch.permutation.args) != 1:
            return "the permutation is drawn with its own generator, and a DataLoader would draw its order from another"
        n = n.value
        length = _single_value(n, values)
        if not (
            isinstance(batch.corpus, cst.Name)
            and isinstance(length, cst.Call)
            and self.context.names.is_(length.func, "len", "builtins.len")
            and len(length.args) == 1
            and _same(length.args[0].value, batch.corpus)
        ):
            return f"perfmod cannot tell that `{source(n)}` is the length of `{source(batch.corpus)}`"
        counter = self._counter(loop)
        if counter is None or loop.iter is not counter[0]:
            return "the loop's counter is not a plain `range(...)`"
        drop_last = self._drops_last(counter[0], n, batch.window.width, values)
        if drop_last is None:
            return f"perfmod cannot tell that `{source(counter[0])}` counts the batches of `{source(batch.corpus)}`"
        (work,) = batch.work if len(batch.work) == 1 else (None,)
        function = self.context.kinds.local_callee(work) if work is not None else None
        if (
            work is None
            or not isinstance(work.func, cst.Name)
            or len(work.args) != 1
            or not _is_name(work.args[0].value, batch.batch.value)
            or function is None
            or not isinstance(self.context.parents.get(function), cst.Module)
        ):
            return "perfmod moves into a collate_fn only one call of a function of this module given the batch alone"
        if not self.context.purity.is_pure(function):
            return f"perfmod cannot tell that `{function.name.value}` is pure"
        target = _name_bound_to(work, self.context.parents)
        lines = [self.context.parents.get(self.context.parents.get(node)) for node in (batch.picks, work)]
        holder = _name_bound_to(batch.window.subscript, self.context.parents)
        if holder is not None:
            lines.append(self.context.parents.get(self.context.parents.get(batch.window.subscript)))
        body = _lines(loop.body)
        if target is None or not all(
            isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and line in body for line in lines
        ):
            return "the look-up and the work on the batch are not statements of their own in the loop"
        reads = names_read(loop.body)
        if sum(read.value == batch.batch.value for read in reads) != 1:
            return f"`{batch.batch.value}` is used for more than `{source(work)}`"
        step = counter[1]
        counted = [
            read for read in reads if read.value == step.value and not self.context.inside(read, batch.window.subscript)
        ]
        if counted and len(counter[0].args) != 1:
            return f"`{step.value}` is used for more than cutting the batch"
        if not self._free_or_torch("DataLoader"):
            return "the name `DataLoader` means something else in this file"
        needed = {batch.corpus.value, function.name.value} | {name.value for name in names_read(batch.window.width)}
        anchor = self._anchor_for(loop, needed)
        taken = set(re.findall(r"\w+", self.context.code))
        loader = _fresh(next((n for n in LOADER_NAMES if n not in taken), LOADER_NAMES[0]), taken)
        build = cst.parse_statement(
            f"{loader} = DataLoader({batch.corpus.value}, batch_size={source(batch.window.width)}, shuffle=True"
            f"{', drop_last=True' if drop_last else ''}, collate_fn={function.name.value})\n"
        )
        if counted:
            header = Replace(
                loop,
                lambda updated: updated.with_changes(
                    target=cst.Tuple(
                        [cst.Element(cst.Name(step.value)), cst.Element(cst.Name(target.value))], lpar=[], rpar=[]
                    ),
                    iter=cst.parse_expression(f"enumerate({loader})"),
                ),
            )
        else:
            header = Replace(
                loop, lambda updated: updated.with_changes(target=cst.Name(target.value), iter=cst.Name(loader))
            )
        removed = list(lines)
        perm_line = self._permutation_line(batch, anchor)
        if perm_line is not None:
            removed.append(perm_line)
        self.report(
            loop,
            f"each step cuts its batch of `{source(batch.corpus)}`, a Python list, from a permutation by hand "
            f"(line {self.context.line(batch.window.subscript)}) and runs `{function.name.value}` on it between steps; "
            f"iterate over a DataLoader over `{source(batch.corpus)}`, shuffled each epoch as the permutation was, whose "
            f"collate_fn `{function.name.value}` makes each batch (in worker processes once it has them: PM201)",
            edits=[InsertBefore(anchor, (build,)), header, *(Remove(line) for line in removed)],
            imports=IMPORTS[:1],
        )
        return None

    def _drops_last(self, counter: cst.Call, n: cst.BaseExpression, width: cst.BaseExpression, values) -> bool | None:
        """Whether the loop `counter` counts the full batches only (`range(n // bs)`), or
        every batch with a shorter last one (`range((n + bs - 1) // bs)`, `range(0, n, bs)`);
        None when it counts something else."""
        args = [a.value for a in counter.args]
        if len(args) == 3:
            return False if integer_value(args[0]) == 0 and _same(args[1], n) and _same(args[2], width) else None
        if len(args) != 1:
            return None
        count = _single_value(args[0], values)
        if not (isinstance(count, cst.BinaryOperation) and isinstance(count.operator, cst.FloorDivide)):
            return None
        if not _same(count.right, width):
            return None
        top = count.left
        if _same(top, n):
            return True
        ceiling = _normalized(f"({self.context.source(n)}+{self.context.source(width)}-1)")
        return (
            False
            if _normalized(self.context.source(top.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])))
            == ceiling
            else None
        )

    def _permutation_line(self, batch: ListBatch, anchor: cst.CSTNode) -> cst.CSTNode | None:
        """The line `perm = torch.randperm(n)` when the window was its only read and it runs
        inside the rewritten code; None to keep it."""
        name = _name_bound_to(batch.permutation, self.context.parents)
        line = self.context.parents.get(self.context.parents.get(batch.permutation))
        if name is None or not (
            isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and self.context.inside(line, anchor)
        ):
            return None
        reads = [read for read in names_read(anchor) if read.value == name.value]
        return line if len(reads) == 1 and reads[0] is batch.window.sequence else None

    def _followed(self, call: cst.Call) -> bool:
        """Is `call` a call of a function or method of this file, or of the project?"""
        if self.context.kinds.local_callee(call) is not None:
            return True
        return project_of(self.context).called(call) is not None

    # -- batches cut by `zip(X.split(bs), Y.split(bs))` --------------------------------

    def _check_splits(self, loop: cst.For) -> None:
        """`for xb, yb in zip(X.split(bs), Y.split(bs))`: the same batches, in the same
        order, as `DataLoader(TensorDataset(X, Y), batch_size=bs, shuffle=False)` gives."""
        split = tensor_splits(self.context).of(loop)
        if split is None:
            return
        problem = split.problem if split.problem is not None else self._loader_blocked(split.targets)
        if problem == "" or suppressed_on(loop, self.CODE):
            return
        if problem is not None:
            self.report(
                loop,
                "batches are cut from in-memory data by hand in this training loop; not rewritten "
                f"to a DataLoader because {problem}",
            )
            return
        tensors = [tensor.value for tensor in split.tensors]
        batch_size = split.batch_size
        taken = set(re.findall(r"\w+", self.context.code))
        loader = _fresh(next((n for n in LOADER_NAMES if n not in taken), LOADER_NAMES[0]), taken)
        build = cst.parse_statement(
            f"{loader} = DataLoader(TensorDataset({', '.join(tensors)}), "
            f"batch_size={self.context.source(batch_size)}, shuffle=False)\n"
        )
        anchor = self._anchor_for(loop, set(tensors) | {n.value for n in names_read(batch_size)})
        if len(tensors) == 1:
            target = cst.Tuple([cst.Element(loop.target, comma=cst.Comma())])
            header: Edit = Replace(loop, lambda updated: updated.with_changes(target=target, iter=cst.Name(loader)))
        else:
            header = Replace(split.iterable, cst.Name(loader))
        self.report(
            loop,
            f"batches are cut from in-memory tensors by hand (line {self.context.line(loop)}); iterate over "
            f"a DataLoader built once, batches of `{self.context.source(batch_size)}` in the same order",
            edits=[InsertBefore(anchor, (build,)), header],
            imports=IMPORTS,
        )

    # -- batches cut by a generator the step loop iterates: reported ---------------

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        _, yields = self.context.kinds.exits(node)
        if not yields:
            return
        loops = []
        for found in yields:
            loop = self.context.index.first_enclosing(found, (cst.For, cst.FunctionDef, cst.Lambda, cst.ClassDef))
            if isinstance(loop, cst.For) and loop not in loops:
                loops.append(loop)
        for loop in loops:
            counter = self._counter(loop)
            plan = self._plan(loop, *counter) if counter is not None else None
            if plan is None:
                continue
            problem = self._find_batches(plan, attributes=True)
            if problem is None:
                problem = self._check(plan)
            if problem == "":
                continue  # no windows, or windows of tensors on the device
            sites = self._per_step_sites(node)
            if not sites:
                return
            window = plan.windows[0]
            cut = (
                f"`{node.name.value}()` cuts the batches of this training loop by hand "
                f"(`{self.context.source(window)}`, line {self.context.line(window)}), in the training process "
                "between steps"
            )
            if problem is None:
                advice = (
                    f"; build a DataLoader(TensorDataset({', '.join(plan.tensors)})) with the same batch size once "
                    "and iterate over it instead (perfmod rewrites only batches cut in the training loop itself)"
                )
            else:
                advice = (
                    f"; not rewritten to a DataLoader because {problem}; a Dataset read by DataLoader workers "
                    "(with a collate_fn for batches that are not tensors) would build them while the model trains"
                )
            for site in sites:
                self.report(site, cut + advice)
            return

    def _counter(self, loop: cst.For) -> tuple[cst.Call, cst.Name] | None:
        """`range(...)` and the name its items bind: `for i in range(...)`, also through
        `enumerate`, `tqdm`, `zip`."""
        found = [
            (iterable, target)
            for iterable, target in self.context.loaders.iterated(loop.iter, loop.target)
            if isinstance(iterable, cst.Call) and self.context.names.is_(iterable.func, *RANGE)
        ]
        if len(found) != 1 or not isinstance(found[0][1], cst.Name):
            return None
        return found[0]

    def _plan(self, loop: cst.For, counter: cst.Call, index: cst.Name) -> _Plan | None:
        batch_size, window = self._window(counter, index.value)
        if window is None:
            return None
        return _Plan(loop, batch_size, window, counter, index)

    def _window(self, call: cst.Call, i: str) -> tuple[cst.BaseExpression | None, _Window | None]:
        if any(a.keyword is not None or a.star for a in call.args):
            return None, None
        args = [a.value for a in call.args]
        if len(args) == 3 and m.matches(args[0], m.Integer("0")):
            n, bs = args[1], args[2]
            drop_last = False
            # range(0, n - bs + 1, bs): only full batches
            if m.matches(
                n,
                m.BinaryOperation(
                    left=m.BinaryOperation(operator=m.Subtract()), operator=m.Add(), right=m.Integer("1")
                ),
            ) and _same(n.left.right, bs):
                n, drop_last = n.left.left, True
            exact = m.BinaryOperation(left=m.Name(i), operator=m.Add(), right=_equal_to(bs)) | m.BinaryOperation(
                left=_equal_to(bs), operator=m.Add(), right=m.Name(i)
            )
            # `i:i + w` with `w = min(bs, ...)`: windows no longer than the step (a shorter last one)
            shorter = m.BinaryOperation(
                left=m.Name(i), operator=m.Add(), right=m.MatchIfTrue(lambda w: self._at_most(w, bs))
            )
            return bs, _Window(n, drop_last, m.Slice(lower=m.Name(i), upper=exact | shorter, step=None), exact)
        if len(args) == 1 and m.matches(args[0], m.BinaryOperation(operator=m.FloorDivide())):
            n, bs = args[0].left, args[0].right
            lower = m.BinaryOperation(left=m.Name(i), operator=m.Multiply(), right=_equal_to(bs))
            upper = m.BinaryOperation(
                left=m.BinaryOperation(left=m.Name(i), operator=m.Add(), right=m.Integer("1")),
                operator=m.Multiply(),
                right=_equal_to(bs),
            )
            return bs, _Window(n, True, m.Slice(lower=lower, upper=upper, step=None), upper)
        return None, None

    def _at_most(self, width: cst.CSTNode, step: cst.BaseExpression, depth: int = 0) -> bool:
        """Is `width` never more than `step`: `min(step, ...)`, or a name bound only to that?"""
        if isinstance(width, cst.Call) and self.context.names.is_(width.func, "min", "builtins.min"):
            return any(_same(arg.value, step) for arg in width.args if arg.keyword is None and not arg.star)
        if isinstance(width, cst.Name) and depth < 2:
            values = self.context.bindings.values(width)
            return bool(values) and all(self._at_most(value, step, depth + 1) for value in values)
        return False

    def _find_batches(self, plan: _Plan, attributes: bool = False) -> str | None:
        """Fill plan.tensors/uses; "" when the loop does not batch by hand, a reason when it
        does but cannot be rewritten, None when every use of `i` is understood. With
        `attributes`, windows of `self.X` count too (reported, never rewritten)."""
        loop, i = plan.loop, plan.index.value
        index = self.context.index
        windows = []
        for s in index.find(cst.Subscript, within=loop.body):
            if isinstance(s.value, cst.Name) or (attributes and isinstance(s.value, cst.Attribute)):
                dimension = self._window_dimension(s, plan.window)
                if dimension is not None:
                    windows.append(s)
                    plan.windows.append(s)
                    if dimension:
                        plan.dimension = plan.dimension or (s, dimension)
        if not windows:
            return ""
        understood: set[int] = set()
        for window in windows:
            understood.update(id(n) for n in self._names(window, i) if not self.context.inside(n, window.value))
            source = self.context.source(window.value)
            if not m.matches(self._window_part(window).slice, m.Slice(upper=plan.window.exact)):
                plan.shorter = plan.shorter or window
            permutation = self._permutation(source, loop) if isinstance(window.value, cst.Name) else None
            if permutation is None and self._selects_rows(plan, window):
                plan.index_array = source  # `order[i:i + bs]` picks rows of the data: not a randperm
            elif permutation is None:
                plan.uses[id(window)] = source
                _append_once(plan.tensors, source)
                continue
            plan.permutation = permutation
            plan.permutation_reads.add(id(window.value))
            problem = self._permuted_uses(plan, window)
            if problem is not None:
                return problem
        if any(self._on_device(plan, name) for name in plan.tensors):
            return ""  # batches of tensors already on the device: a slice is the fastest batch
        if any(self._loop_item(self._a_use(plan, name).value, 0) for name in plan.tensors):
            return ""  # micro-batches of a batch that an outer loop takes (gradient accumulation)
        carried = self._carried_state(plan)
        if carried is not None:
            return (
                f"`{carried}` is carried from one batch to the next (state such as a truncated-BPTT "
                "hidden state), so the order of the windows matters"
            )
        unlike = self._unlike_a_loader(plan)
        if unlike is not None:
            return unlike
        others = [n for n in self._names(loop.body, i) if id(n) not in understood]
        if others:
            return f"`{i}` is used for more than slicing (line {self.context.line(others[0])})"
        return None

    def _selects_rows(self, plan: _Plan, window: cst.Subscript) -> bool:
        """Does the window pick rows of other data: `X[order[i:i + bs]]`, or `idx = order[i:i + bs]`
        and then `X[idx]`?"""
        parents = self.context.parents
        if isinstance(parents.get(parents.get(window)), cst.SubscriptElement):
            return True
        target = _name_bound_to(window, parents)
        if target is None:
            return False
        return any(
            isinstance(parents.get(read), cst.Index)
            for read in self._names(plan.loop.body, target.value)
            if read is not target
        )

    def _unlike_a_loader(self, plan: _Plan) -> str | None:
        """Why the windows are not what a DataLoader over the data gives, if they are not."""
        source = self.context.source
        if plan.dimension is not None:
            subscript, dimension = plan.dimension
            return (
                f"`{source(subscript)}` cuts windows along dimension {dimension}, not batches of samples "
                "along the first"
            )
        if plan.index_array is not None:
            return (
                f"the rows of {' / '.join(f'`{t}`' for t in plan.tensors)} are picked through `{plan.index_array}`, "
                "which perfmod cannot tell is a fresh `torch.randperm(n)` each epoch (the order a "
                "DataLoader(shuffle=True) gives)"
            )
        if plan.shorter is not None:
            return (
                f"the windows `{source(plan.shorter)}` are not all `{source(plan.batch_size)}` long, "
                "unlike a DataLoader's batches"
            )
        return None

    def _loop_item(self, expr: cst.BaseExpression, depth: int) -> bool:
        """Is `expr` one item of something a loop walks (`for xb, yb in loader`, `xb, yb =
        next(it)`, `x = batch[0]`), so that slicing it cuts a batch, not a dataset? A
        generator's parameter is one when every call passes one."""
        if not isinstance(expr, cst.Name) or depth > 3:
            return False
        parameter = self.context.bindings.param_of(expr)
        if parameter is not None:
            function, param = parameter
            callers = self.context.kinds.callers(function) or ()
            passed = [self.context.kinds.argument(call, function, param, offset) for call, offset in callers]
            return bool(passed) and all(p is not None and self._loop_item(p, depth + 1) for p in passed)
        assignments = self.context.bindings.assignments(expr)
        if not assignments:
            return False
        for assignment in assignments:
            if isinstance(self.context.bindings.statement(assignment.node), (cst.For, cst.CompFor)):
                continue
            value = self.context.bindings.assigned_value(assignment)
            if value is None:
                unpacked = self.context.bindings.unpacked(assignment)
                value = unpacked[0] if unpacked is not None else None
            if isinstance(value, cst.Subscript):
                value = value.value
            if isinstance(value, cst.Call) and self.context.names.is_(value.func, *NEXT):
                continue
            if not self._loop_item(value, depth + 1):
                return False
        return True

    def _window_dimension(self, subscript: cst.Subscript, window: _Window) -> int | None:
        """The dimension `subscript` cuts a window along (`X[i:i + bs]`: 0, `X[:, i:i + n]`:
        1), the other dimensions taken whole; None when it is no window."""
        found = None
        for position, element in enumerate(subscript.slice):
            part = element.slice
            if m.matches(part, window.matches):
                if found is not None:
                    return None
                found = position
            elif not (isinstance(part, cst.Slice) and part.lower is None and part.upper is None and part.step is None):
                return None
        return found

    def _window_part(self, subscript: cst.Subscript) -> cst.SubscriptElement:
        return next(e for e in subscript.slice if not (isinstance(e.slice, cst.Slice) and e.slice.lower is None))

    def _permutation(self, name: str, loop: cst.For) -> str | None:
        """`name` when it is bound once, by `torch.randperm(n)`, before the step loop."""
        values = self._values(name, loop)
        if values is None or len(values) != 1:
            return None
        value = values[0]
        if isinstance(value, cst.Call) and self.context.names.is_(value.func, "torch.randperm"):
            return name
        return None

    def _permuted_uses(self, plan: _Plan, window: cst.Subscript) -> str | None:
        """`X[perm[i:i + bs]]`, or `idx = perm[i:i + bs]` and then only `X[idx]`."""
        parents = self.context.parents
        element = parents.get(parents.get(window))
        holder = parents.get(element) if isinstance(element, cst.SubscriptElement) else None
        if isinstance(holder, cst.Subscript) and isinstance(holder.value, cst.Name) and len(holder.slice) == 1:
            plan.uses[id(holder)] = holder.value.value
            _append_once(plan.tensors, holder.value.value)
            return None
        target = _name_bound_to(window, parents)
        if target is None:
            return "a slice of the permutation is used in a way the rule does not follow"
        statement = parents[window]
        if not (isinstance(parents.get(statement), cst.SimpleStatementLine) and len(parents.get(statement).body) == 1):
            return "the permutation is sliced on a line that does more"
        index = target.value
        plan.uses[id(statement)] = ""  # the `idx = perm[...]` statement goes
        for read in self._names(plan.loop.body, index):
            if read is target:
                continue
            element = parents.get(parents.get(read))
            holder = parents.get(element) if isinstance(element, cst.SubscriptElement) else None
            if not (
                isinstance(holder, cst.Subscript) and isinstance(holder.value, cst.Name) and len(holder.slice) == 1
            ):
                return f"the batch indices `{index}` are used for more than indexing (line {self.context.line(read)})"
            plan.uses[id(holder)] = holder.value.value
            _append_once(plan.tensors, holder.value.value)
        return None

    def _on_device(self, plan: _Plan, name: str) -> bool:
        fact = self.context.kinds.fact(self._a_use(plan, name).value)
        return fact.kind is Kind.TENSOR and fact.place in (Place.CUDA, Place.DEVICE)

    def _check(self, plan: _Plan) -> str | None:
        kinds = self.context.kinds
        for name in plan.tensors:
            if self._on_device(plan, name):
                return ""
        for name in plan.tensors:
            use = self._a_use(plan, name)
            fact = kinds.fact(use.value)
            if fact.kind is not Kind.TENSOR or fact.place is not Place.HOST:
                return f"`{name}` is not known to be a tensor in host memory"
            if not isinstance(use.value, cst.Name):
                continue  # `self.X` in a generator: reported, never rewritten
            if bound_in(self.context, name, plan.loop):
                return f"`{name}` is re-bound inside the loop"
            if kinds.is_mutated_in_place(use.value):
                return f"`{name}` is written in place, and its batches would no longer be views of it"
        if plan.permutation is not None and not self._drawn_per_epoch(plan):
            return (
                "the permutation is drawn once and reused in every epoch, and a DataLoader with shuffle=True "
                "would draw a new one each epoch"
            )
        if not self._covers(plan):
            return (
                f"the range `{self.context.source(plan.window.n)}` is not the length of "
                f"{' / '.join(f'`{t}`' for t in plan.tensors)}, so the batches may not cover the data"
            )
        targets = [statement.targets[0].target for statement in self._batch_statements(plan).values()]
        for line in _lines(plan.loop.body):
            if _unpacks_only_batches(line, plan.uses):
                targets += [element.value for element in line.body[0].targets[0].target.elements]
        return self._loader_blocked(targets)

    def _loader_blocked(self, targets: list[cst.Name]) -> str | None:
        """Why batches bound to `targets` cannot come from a DataLoader over a TensorDataset:
        one is written in place (a view of the data), or a name the fix uses is taken."""
        for target in targets:
            if self.context.kinds.is_mutated_in_place(target):
                return f"the batch `{target.value}` is written in place, which changes the data it is a view of"
        for name in ("DataLoader", "TensorDataset"):
            if not self._free_or_torch(name):
                return f"the name `{name}` means something else in this file"
        return None

    def _drawn_per_epoch(self, plan: _Plan) -> bool:
        """Is `perm = torch.randperm(n)` inside a loop around the step loop (a new one per epoch)?"""
        scope = self.context.scopes.get(plan.loop)
        binding = next(iter(scope.assignments[plan.permutation])).node
        for current in self.context.index.ancestors(plan.loop):
            if isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if isinstance(current, (cst.For, cst.While)) and self.context.inside(binding, current):
                return True
        return False

    def _a_use(self, plan: _Plan, name: str) -> cst.Subscript:
        for node in self.context.index.find(cst.Subscript, within=plan.loop.body):
            if plan.uses.get(id(node)) == name:
                return node
        raise AssertionError(name)

    def _covers(self, plan: _Plan) -> bool:
        """Is n the length of one of the tensors: spelled so (directly or through one name),
        or the size the tensor was made with?"""
        n = plan.window.n
        candidates = [n]
        if isinstance(n, cst.Name):
            values = self._values(n.value, plan.loop)
            if values is not None and len(values) == 1:
                candidates.append(values[0])
        if plan.permutation is not None:
            perm_n = positional(self._values(plan.permutation, plan.loop)[0], 0)
            if perm_n is None or not _same(perm_n.value, n):
                return False
        lengths = (
            {f"len({t})" for t in plan.tensors}
            | {f"{t}.size(0)" for t in plan.tensors}
            | {f"{t}.shape[0]" for t in plan.tensors}
        )
        if any(_normalized(self.context.source(c)) in lengths for c in candidates):
            return True
        shapes = layouts(self.context)
        for tensor in plan.tensors:  # `n = 100` and `X = torch.randn(n, 7)`: n is X's length
            shape = shapes.shape(self._a_use(plan, tensor).value)
            if shape and shapes.same_size(n, shape[0]):
                return True
        # `X = T[:n]` holds the first n rows when n is at most len(T): `n = int(0.9 * len(T))`, `len(T) - k`
        spelled = {_normalized(self.context.source(c)) for c in candidates}
        for tensor in plan.tensors:
            values = self._values(tensor, plan.loop)
            value = values[0] if values is not None and len(values) == 1 else None
            if not (
                isinstance(value, cst.Subscript)
                and len(value.slice) == 1
                and isinstance(value.slice[0].slice, cst.Slice)
            ):
                continue
            part = value.slice[0].slice
            if part.lower is not None and integer_value(part.lower) != 0:
                continue
            if (
                part.upper is None
                or part.step is not None
                or _normalized(self.context.source(part.upper)) not in spelled
            ):
                continue
            if any(self._at_most_length(c, value.value) for c in candidates):
                return True
        return False

    def _at_most_length(self, n: cst.BaseExpression, owner: cst.BaseExpression) -> bool:
        """Is `n` at most the length of `owner`: `int(0.9 * len(T))`, `len(T) - k`, `len(T) // 2`?"""
        length = {
            f"len({self.context.source(owner)})",
            f"{self.context.source(owner)}.size(0)",
            f"{self.context.source(owner)}.shape[0]",
        }
        length = {_normalized(x) for x in length}
        if isinstance(n, cst.Call) and self.context.names.is_(n.func, "int", "builtins.int") and len(n.args) == 1:
            n = n.args[0].value
        if isinstance(n, cst.BinaryOperation):
            left, right = _normalized(self.context.source(n.left)), _normalized(self.context.source(n.right))
            if isinstance(n.operator, cst.Multiply):
                factor = n.left if right in length else n.right if left in length else None
                fraction = number_value(factor)
                return fraction is not None and 0 <= fraction <= 1
            if isinstance(n.operator, cst.Subtract):
                return left in length and isinstance(n.right, cst.Integer)
            if isinstance(n.operator, cst.FloorDivide):
                return left in length and (integer_value(n.right) or 0) >= 1
        return False

    def _carried_state(self, plan: _Plan) -> str | None:
        """A value carried from the previous iteration (read before the body binds it,
        or computed from such a value) that meets this batch in one statement:
        `hidden = hidden.detach(); out, hidden = model(xb, hidden)`. Counters and
        running sums (`total = total + loss.item()`) never meet the batch itself."""
        lines = _flat(_lines(plan.loop.body))
        batch_names = {s.targets[0].target.value for s in self._batch_statements(plan).values()}
        for line in lines:
            if _unpacks_only_batches(line, plan.uses):
                batch_names |= {e.value.value for e in line.body[0].targets[0].target.elements}
            elif self._copies_a_batch(line, plan):  # `data = X[:, i:i + n].to(device)`
                batch_names.add(line.body[0].targets[0].target.value)
        bound_in_body = set().union(*(self._bound_names(line) for line in lines))
        bound_so_far: set[str] = _target_names(plan.loop.target)
        carried: set[str] = set()
        for line in lines:
            reads = {n.value for n in names_read(line)}
            carried |= (reads - bound_so_far) & bound_in_body - batch_names
            binds = self._bound_names(line)
            hit = reads & carried
            if hit and (
                reads & batch_names
                or any(id(n) in plan.uses for n in self.context.index.find(cst.Subscript, within=line))
            ):
                return sorted(hit)[0]
            carried = carried | binds if hit else carried - binds
            bound_so_far |= binds
        return None

    def _copies_a_batch(self, line: cst.CSTNode, plan: _Plan) -> bool:
        """`name = X[i:i + bs]` followed by method calls only (`.to(device)`, `.float()`)."""
        if not (
            isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and isinstance(line.body[0], cst.Assign)
            and len(line.body[0].targets) == 1
            and isinstance(line.body[0].targets[0].target, cst.Name)
        ):
            return False
        value = line.body[0].value
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            value = value.func.value
        return id(value) in plan.uses

    def _batch_statements(self, plan: _Plan) -> dict[str, cst.Assign]:
        """tensor -> `xb = X[...]` statement whose value is exactly one use (its name becomes the loop variable)."""
        found: dict[str, cst.Assign] = {}
        for node in self.context.index.find(cst.Subscript, within=plan.loop.body):
            tensor = plan.uses.get(id(node))
            if not tensor or tensor in found:
                continue
            statement = self.context.parents.get(node)
            if (
                isinstance(statement, cst.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0].target, cst.Name)
                and isinstance(self.context.parents.get(statement), cst.SimpleStatementLine)
                and len(self.context.parents.get(statement).body) == 1
                and self.context.parents.get(self.context.parents.get(statement)) is plan.loop.body
            ):
                found[tensor] = statement
        return found

    def _copied_batches(self, plan: _Plan, variables: dict[str, str]) -> dict[str, str]:
        """tensor -> `xb` for a tensor used once, in `xb = X[...].to(device)` or
        `xb, yb = X[...].to(device), Y[...].to(device)` (method calls only) on the body's
        own level, where `xb` is not read before: the loop binds the batch to `xb` and the
        line copies it in place, as a prefetcher expects."""
        found: dict[str, str] = {}
        once = {t for t in plan.tensors if sum(1 for u in plan.uses.values() if u == t) == 1}
        read_before: set[str] = set()
        for line in _lines(plan.loop.body):
            for target, value in _assigned_pairs(line):
                while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
                    value = value.func.value
                tensor = plan.uses.get(id(value))
                name = target.value
                taken = name in variables.values() or name in found.values() or name in read_before
                if tensor in once and tensor not in variables and tensor not in found and not taken:
                    found[tensor] = name
            read_before |= {n.value for n in names_read(line)}
        return found

    def _fix(self, plan: _Plan) -> None:
        loop, parents = plan.loop, self.context.parents
        taken = set(re.findall(r"\w+", self.context.code))
        # Loop variables: the names the batches were assigned to, where a statement did
        # only that (it goes); a new name where a batch was used inside an expression.
        variables: dict[str, str] = {}
        removed: list[cst.CSTNode] = []
        for tensor, statement in self._batch_statements(plan).items():
            variables[tensor] = statement.targets[0].target.value
            removed.append(parents.get(statement))
        for line in _lines(loop.body):
            if _unpacks_only_batches(line, plan.uses):
                for element, value in zip(line.body[0].targets[0].target.elements, line.body[0].value.elements):
                    variables.setdefault(plan.uses[id(value.value)], element.value.value)
                removed.append(line)
        for tensor, name in self._copied_batches(plan, variables).items():
            variables[tensor] = name  # `xb = X[idx].to(device)`: `for xb, ... in loader: xb = xb.to(device)`
        for tensor in plan.tensors:
            if tensor not in variables:
                variables[tensor] = _fresh(f"{tensor}_batch", taken)
        replaced: list[Edit] = []
        index = self.context.index
        for node in index.find((cst.Subscript, cst.Assign), within=loop.body):
            tensor = plan.uses.get(id(node))
            if tensor == "":  # `idx = perm[i:i + bs]`
                removed.append(parents.get(node))
            elif tensor is not None and not any(index.inside(node, line) for line in removed):
                replaced.append(Replace(node, cst.Name(variables[tensor])))
        anchor = self._anchor(plan)
        if plan.permutation is not None:
            perm_line = self._unused_permutation(plan, anchor)
            if perm_line is not None:
                removed.append(perm_line)
        loader = _fresh(next((n for n in LOADER_NAMES if n not in taken), LOADER_NAMES[0]), taken)
        names = [variables[t] for t in plan.tensors]
        if len(names) == 1:  # TensorDataset items are tuples, of one tensor here: `for (xb,) in loader`
            target = cst.Tuple([cst.Element(cst.Name(names[0]), comma=cst.Comma())])
        else:
            target = cst.Tuple([cst.Element(cst.Name(n)) for n in names], lpar=[], rpar=[])
        shuffle = "True" if plan.permutation else "False"
        drop_last = ", drop_last=True" if plan.window.drop_last else ""
        build = cst.parse_statement(
            f"{loader} = DataLoader(TensorDataset({', '.join(plan.tensors)}), "
            f"batch_size={self.context.source(plan.batch_size)}, shuffle={shuffle}{drop_last})\n"
        )
        if loop.iter is plan.counter:
            # the header as a function of the loop, so that edits inside its body compose
            header: list[Edit] = [
                Replace(loop, lambda updated: updated.with_changes(target=target, iter=cst.Name(loader)))
            ]
        else:  # `for step, i in enumerate(range(...))`: `for step, (xb, yb) in enumerate(loader)`
            nested = target.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            header = [Replace(plan.counter, cst.Name(loader)), Replace(plan.index, nested)]
        edits: list[Edit] = [
            InsertBefore(anchor, (build,)),
            *header,
            *replaced,
            *(Remove(line) for line in removed),
        ]
        order = "shuffled each epoch, as the permutation did" if plan.permutation else "in the same order"
        self.report(
            loop,
            f"batches are cut from in-memory tensors by hand (line {self.context.line(loop)}); iterate over "
            f"a DataLoader built once, batches of `{self.context.source(plan.batch_size)}` {order}",
            edits=edits,
            imports=IMPORTS,
        )

    def _unused_permutation(self, plan: _Plan, anchor: cst.CSTNode) -> cst.CSTNode | None:
        """The line `perm = torch.randperm(n)` when the rewritten windows were its only
        reads and it sits inside the rewritten code; None to keep it."""
        scope = self.context.scopes.get(plan.loop)
        assignments = list(scope.assignments[plan.permutation])
        line = self.context.parents.get(self.context.parents.get(self.context.parents.get(assignments[0].node)))
        if not (
            isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and self.context.inside(line, anchor)
        ):
            return None
        reads = {id(access.node) for access in scope.accesses[plan.permutation]}
        return line if reads <= plan.permutation_reads else None

    def _anchor(self, plan: _Plan) -> cst.CSTNode:
        return self._anchor_for(plan.loop, set(plan.tensors) | {n.value for n in names_read(plan.batch_size)})

    def _anchor_for(self, loop: cst.For, needed: set[str]) -> cst.CSTNode:
        """The outermost loop around the step loop (same function) in which none of the
        names `needed` (the tensors, the batch size) is re-bound: the DataLoader is built before it."""
        anchor: cst.CSTNode = loop
        for current in self.context.index.ancestors(loop):
            if isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if isinstance(current, (cst.For, cst.While)):
                if any(bound_in(self.context, name, current) for name in needed):
                    break
                anchor = current
        return anchor

    # -- helpers -----------------------------------------------------------------

    def _names(self, node: cst.CSTNode, name: str) -> list[cst.Name]:
        """The Name nodes spelled `name` under `node`."""
        return [n for n in self.context.index.find(cst.Name, within=node) if n.value == name]

    def _bound_names(self, line: cst.CSTNode) -> set[str]:
        """Names that the assignments of `line` bind (`a.b = ...` and `a[i] = ...` bind none)."""
        names: set[str] = set()
        for statement in self.context.index.find((cst.AssignTarget, cst.AugAssign, cst.AnnAssign), within=line):
            names |= _target_names(statement.target)
        return names

    def _values(self, name: str, loop: cst.CSTNode) -> list[cst.BaseExpression] | None:
        """The values of every plain assignment to `name` in the scope of `loop`."""
        scope = self.context.scopes.get(loop)
        if scope is None or name not in scope:
            return None
        values = []
        bindings = self.context.bindings
        for assignment in scope.assignments[name]:
            if type(assignment) is not Assignment:
                return None
            value = bindings.assigned_value(assignment)
            if value is None:  # `a, b = x, y`: the element of the literal
                unpacked = bindings.unpacked(assignment)
                if (
                    unpacked is None
                    or not isinstance(unpacked[0], (cst.Tuple, cst.List))
                    or unpacked[1] >= len(unpacked[0].elements)
                ):
                    return None
                element = unpacked[0].elements[unpacked[1]]
                if not isinstance(element, cst.Element):
                    return None
                value = element.value
            values.append(value)
        return values

    def _free_or_torch(self, name: str) -> bool:
        """Is `name` unbound in the module, or bound only by an import of torch's class of that name?"""
        scope = self.context.scopes.get(self.context.module.body[0]) if self.context.module.body else None
        if scope is None or name not in scope.globals:
            return True
        for assignment in scope.globals.assignments[name]:
            if not isinstance(assignment, ImportAssignment):
                return False
            if not any(
                q.name
                in (
                    f"torch.utils.data.{name}",
                    f"torch.utils.data.dataloader.{name}",
                    f"torch.utils.data.dataset.{name}",
                )
                for q in assignment.get_qualified_names_for(name)
            ):
                return False
        return True


def _single_value(expr: cst.BaseExpression, values) -> cst.BaseExpression:
    """The value a name is bound to when it is bound once, else the expression itself."""
    if isinstance(expr, cst.Name):
        bound = values(expr)
        if bound is not None and len(bound) == 1:
            return bound[0]
    return expr


def _is_data(expr: cst.BaseExpression, data: set[str]) -> bool:
    return isinstance(expr, cst.Name) and expr.value in data


def _is_name(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _same(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return a.deep_equals(b)


def _equal_to(expr: cst.BaseExpression) -> m.BaseMatcher:
    return m.MatchIfTrue(lambda node: node.deep_equals(expr))


def _normalized(code: str) -> str:
    return re.sub(r"\s+", "", code)


def _append_once(items: list[str], item: str) -> None:
    if item not in items:
        items.append(item)


def _fresh(name: str, taken: set[str]) -> str:
    candidate, k = name, 2
    while candidate in taken:
        candidate, k = f"{name}_{k}", k + 1
    taken.add(candidate)
    return candidate


def _flat(lines: list[cst.CSTNode]) -> list[cst.CSTNode]:
    """The statements of `lines` in the order they run, `with` blocks opened (their body
    runs once, in order); other compound statements stay whole."""
    flat = []
    for line in lines:
        if isinstance(line, cst.With) and isinstance(line.body, cst.IndentedBlock):
            flat.extend(_flat(list(line.body.body)))
        else:
            flat.append(line)
    return flat


def _lines(block: cst.BaseSuite) -> list[cst.CSTNode]:
    return list(block.body) if isinstance(block, cst.IndentedBlock) else [block]


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_target_names(element.value) for element in target.elements))
    return set()


def _unpacks_only_batches(line: cst.CSTNode, uses: dict[int, str]) -> bool:
    """`xb, yb = X[i:i + bs], Y[i:i + bs]`: a tuple of names from a tuple of batch uses."""
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Assign)):
        return False
    assign = line.body[0]
    if len(assign.targets) != 1:
        return False
    target, value = assign.targets[0].target, assign.value
    if not (
        isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and len(target.elements) == len(value.elements)
    ):
        return False
    return all(isinstance(t.value, cst.Name) and uses.get(id(v.value)) for t, v in zip(target.elements, value.elements))


def _name_bound_to(value: cst.CSTNode, parents) -> cst.Name | None:
    """`name` of a plain `name = value` statement whose value is `value`."""
    statement = parents.get(value)
    if (
        isinstance(statement, cst.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Name)
    ):
        return statement.targets[0].target
    return None


def _assigned_pairs(line: cst.CSTNode) -> list[tuple[cst.Name, cst.BaseExpression]]:
    """(name, value) of `a = v` and `a, b = v, w`: one target, names only, no starred items."""
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 and isinstance(line.body[0], cst.Assign)):
        return []
    assign = line.body[0]
    if len(assign.targets) != 1:
        return []
    target, value = assign.targets[0].target, assign.value
    if isinstance(target, cst.Name):
        return [(target, value)]
    if not (isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List))):
        return []
    if len(target.elements) != len(value.elements):
        return []
    pairs = []
    for t, v in zip(target.elements, value.elements):
        if not isinstance(t, cst.Element) or not isinstance(v, cst.Element) or not isinstance(t.value, cst.Name):
            return []
        pairs.append((t.value, v.value))
    return pairs

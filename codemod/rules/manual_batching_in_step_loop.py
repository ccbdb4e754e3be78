from __future__ import annotations

import libcst as cst

from codemod.analysis.batch_draws import batch_draws
from codemod.analysis.batch_windows import WindowPlan, batch_windows, names_in
from codemod.analysis.loaders import ListBatch
from codemod.analysis.names import fresh_name, names_read
from codemod.analysis.tensor_splits import tensor_splits
from codemod.edits import Edit, InsertBefore, Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.suppression import suppressed_on

IMPORTS = [("torch.utils.data", "DataLoader"), ("torch.utils.data", "TensorDataset")]
RANDOM_WHY = (
    "(samples repeat and others are skipped within an epoch), gathered in the training process between "
    "steps; not rewritten: a DataLoader(..., shuffle=True) would visit every sample once per epoch instead, a "
    "different sampling scheme. Gathering a few dozen slices of in-memory or memory-mapped data takes under a "
    "millisecond; when building a sample costs more (reading files, decoding, augmenting, tokenizing), move that "
    "into a Dataset read by DataLoader workers, sampled with replacement (RandomSampler(replacement=True)) to keep "
    "the scheme"
)
LOADER_NAMES = ("loader", "train_loader", "batches")

# Rows of 20,000 features: a batch of 16 holds 1.3 MB, large enough for a DataLoader to pay.
PREAMBLE = """\
import torch
X, Y = torch.randn(100, 20000), torch.randn(100, 1)
model = torch.nn.Linear(20000, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
bs = 16
"""
STEP = (
    "    loss = torch.nn.functional.mse_loss(model(xb), yb)\n    loss.backward()\n    opt.step()\n    opt.zero_grad()\n"
)
FIXED_PREAMBLE = PREAMBLE.replace(
    "import torch\n", "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n", 1
)


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
    `random.Random(0)` or `np.random.default_rng()`). A random draw is
    reported where it is drawn, a generator's windows at the loop that
    iterates it. Windows that carry state from one to the next (a
    truncated-BPTT hidden state) are left alone: they are the consecutive
    pieces of one stream and must stay in order, not samples for a
    DataLoader to batch or shuffle.

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
    So batches of tensors perfmod can size (tensors of known shape, a batch
    size it can read) and finds under 1.25 MB are reported without a fix: such
    a batch copies to the GPU in under 50 us even from pinned memory (the time
    the host takes to launch ten kernels; PM103 does not prefetch it either),
    so the DataLoader would only add its per-row fetching to every step.
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
    reason, as are two windows of one tensor at different offsets (`data[i:i +
    50]` and its next-token targets `data[i + 1:i + 51]`), which no
    TensorDataset of rows gives. Batches of a Python list become a DataLoader only when the
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
        Valid(
            PREAMBLE + "h = torch.zeros(1, 8)\nfor i in range(0, len(X), bs):\n    xb, yb = X[i:i + bs], Y[i:i + bs]\n"
            "    h = (h + xb.mean(0)).detach()\n" + STEP.replace("model(xb)", "model(xb + h)"),
            "state carried from window to window (truncated BPTT): the windows stay in order",
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
                "X, Y = torch.randn(100, 20000), torch.randn(100, 1)",
                "n = 100\nX, Y = torch.randn(n, 20000), torch.randn(n, 1)",
            )
            + "for i in range(0, n, bs):\n    xb, yb = X[i:i + bs], Y[i:i + bs]\n"
            + STEP,
            FIXED_PREAMBLE.replace(
                "X, Y = torch.randn(100, 20000), torch.randn(100, 1)",
                "n = 100\nX, Y = torch.randn(n, 20000), torch.randn(n, 1)",
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
            PREAMBLE.replace("20000", "8")
            + "for i in range(0, len(X), bs):\n    xb, yb = X[i:i + bs], Y[i:i + bs]\n"
            + STEP,
            None,
            "batches of 576 bytes: a DataLoader over tensors in memory would cost more than it hides",
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

    # -- per-step random batches: reported --------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        draw = batch_draws(self.context).of(node)
        if draw is None:
            return
        if draw.function is None:
            self.report(node, f"`{draw.spelled}` draws a new random batch on every training step {RANDOM_WHY}")
            return
        lines = ", ".join(str(self.context.line(site)) for site in draw.sites)
        self.report(
            node,
            f"`{draw.function.name.value}()`, called by the training loop on line{'s' if len(draw.sites) > 1 else ''} "
            f"{lines}, draws a new random batch on every training step with `{draw.spelled}` {RANDOM_WHY}",
        )

    # -- manual slicing: fixed ----------------------------------------------------

    def visit_For(self, node: cst.For) -> None:
        if node not in self.context.loops.step_loops:
            return
        texts = [batch for batch in self.context.loaders.list_batches if batch.loop is node]
        if texts:
            if not suppressed_on(node, self.CODE):
                for batch in texts:
                    self._report_list_batch(batch)
            return
        windows = batch_windows(self.context)
        if windows.counter(node) is None:
            self._check_splits(node)
            return
        plan = windows.of(node)
        if plan is None or plan.problem == "" or suppressed_on(node, self.CODE):
            return  # not manual batching, or batches that are not to be changed
        problem = plan.problem
        if problem is None:
            problem = windows.loader_gains_nothing(windows.tensors_read(plan), plan.batch_size)
        if problem is not None:
            self.report(
                node,
                f"batches are cut from in-memory data by hand in this training loop; not rewritten "
                f"to a DataLoader because {problem}",
            )
            return
        self._fix(plan)

    # -- batches looked up in a Python list through a permutation ---------------------

    def _report_list_batch(self, batch: ListBatch) -> None:
        """`idx = perm[step * bs:(step + 1) * bs]`, `texts_b = [texts[i] for i in idx.tolist()]`
        and work on the items in the step (tokenizing): the expert's DataLoader tokenizes in
        its collate_fn, in worker processes, while the model trains."""
        if not batch.work:
            return  # the items go to the model as they are: a DataLoader would only move a list look-up
        source, line, windows = self.context.source, self.context.line, batch_windows(self.context)
        corpus = source(batch.corpus)
        opaque = windows.opaque_work(batch)
        named = list(dict.fromkeys(source(call.func) for call in batch.work))[:3]
        work = ", ".join(f"`{name}(...)`" for name in named)
        if opaque is not None:
            why = (
                f"`{source(opaque.func)}` (line {line(opaque)}) is not one function of this file or of the project "
                "that perfmod can follow, nor a known tokenizer, so it cannot tell that the call is pure and that a "
                "worker process may run it"
            )
        else:
            plan = windows.list_batch(batch)
            if not isinstance(plan, str):
                self._fix_list_batch(batch, plan)
                return
            why = plan
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

    def _fix_list_batch(self, batch: ListBatch, plan) -> None:
        """The loop iterates a DataLoader over the list whose collate_fn is the step's work."""
        loop, source = batch.loop, self.context.source
        loader = self._loader_name(names_in(self.context.code))
        build = cst.parse_statement(
            f"{loader} = DataLoader({plan.corpus}, batch_size={source(plan.width)}, shuffle=True"
            f"{', drop_last=True' if plan.drop_last else ''}, collate_fn={plan.work})\n"
        )
        if plan.step is not None:
            target = cst.Tuple([cst.Element(cst.Name(plan.step)), cst.Element(cst.Name(plan.target))], lpar=[], rpar=[])
            iterated = cst.parse_expression(f"enumerate({loader})")
        else:
            target, iterated = cst.Name(plan.target), cst.Name(loader)
        header = Replace(loop, lambda updated: updated.with_changes(target=target, iter=iterated))
        self.report(
            loop,
            f"each step cuts its batch of `{plan.corpus}`, a Python list, from a permutation by hand "
            f"(line {self.context.line(batch.window.subscript)}) and runs `{plan.work}` on it between steps; "
            f"iterate over a DataLoader over `{plan.corpus}`, shuffled each epoch as the permutation was, whose "
            f"collate_fn `{plan.work}` makes each batch (in worker processes once it has them: PM201)",
            edits=[InsertBefore(plan.anchor, (build,)), header, *(Remove(line) for line in plan.removed)],
            imports=IMPORTS[:1],
        )

    # -- batches cut by `zip(X.split(bs), Y.split(bs))` --------------------------------

    def _check_splits(self, loop: cst.For) -> None:
        """`for xb, yb in zip(X.split(bs), Y.split(bs))`: the same batches, in the same
        order, as `DataLoader(TensorDataset(X, Y), batch_size=bs, shuffle=False)` gives."""
        split = tensor_splits(self.context).of(loop)
        if split is None:
            return
        windows = batch_windows(self.context)
        problem = split.problem if split.problem is not None else windows.loader_blocked(split.targets)
        if problem is None:
            problem = windows.loader_gains_nothing(split.tensors, split.batch_size)
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
        header = (cst.Tuple([cst.Element(loop.target, comma=cst.Comma())]), None)  # `for (xb,) in loader`
        if len(tensors) > 1:
            header = (None, split.iterable)
        self._rewrite(loop, tensors, split.batch_size, header, [], [], names_in(self.context.code))

    # -- batches cut by a generator the step loop iterates: reported ---------------

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if not self.context.kinds.exits(node)[1]:
            return
        found = batch_windows(self.context).in_generator(node)
        if found is None:
            return
        plan, sites = found
        window = plan.windows[0]
        cut = (
            f"`{node.name.value}()` cuts the batches of this training loop by hand "
            f"(`{self.context.source(window)}`, line {self.context.line(window)}), in the training process "
            "between steps"
        )
        if plan.problem is None:
            advice = (
                f"; build a DataLoader(TensorDataset({', '.join(plan.tensors)})) with the same batch size once "
                "and iterate over it instead (perfmod rewrites only batches cut in the training loop itself)"
            )
        else:
            advice = (
                f"; not rewritten to a DataLoader because {plan.problem}; a Dataset read by DataLoader workers "
                "(with a collate_fn for batches that are not tensors) would build them while the model trains"
            )
        for site in sites:
            self.report(site, cut + advice)

    # -- the fix -------------------------------------------------------------------

    def _fix(self, plan: WindowPlan) -> None:
        windows = batch_windows(self.context)
        taken = names_in(self.context.code)
        rebinding = windows.rebinding(plan, taken)
        names = [rebinding.variables[t] for t in plan.tensors]
        if len(names) == 1:  # TensorDataset items are tuples, of one tensor here: `for (xb,) in loader`
            target = cst.Tuple([cst.Element(cst.Name(names[0]), comma=cst.Comma())])
        else:
            target = cst.Tuple([cst.Element(cst.Name(n)) for n in names], lpar=[], rpar=[])
        edits: list[Edit] = [Replace(node, cst.Name(name)) for node, name in rebinding.replaced]
        iterable = None
        if plan.loop.iter is not plan.counter:
            # `for step, i in enumerate(range(...))`: `for step, (xb, yb) in enumerate(loader)`
            edits.append(Replace(plan.index, target.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])))
            target, iterable = None, plan.counter
        self._rewrite(
            plan.loop, plan.tensors, plan.batch_size, (target, iterable), edits, rebinding.removed, taken, plan
        )

    def _rewrite(self, loop, tensors, batch_size, header_parts, edits, removed, taken, plan=None) -> None:
        """Build `DataLoader(TensorDataset(tensors), batch_size=..., shuffle=...)` before the
        outermost loop that keeps its names, and iterate it: the loop's header takes the
        target of `header_parts` and the loader, or the loader replaces its iterable. With
        the `plan` of windows, shuffled as its permutation was and dropping the last batch
        as its range did; without, the batches of a split in order."""
        shuffle = "True" if plan is not None and plan.permutation is not None else "False"
        windows, source = batch_windows(self.context), self.context.source
        anchor = windows.anchor_for(loop, set(tensors) | {n.value for n in names_read(batch_size)})
        removed = list(removed)
        if plan is not None and plan.permutation is not None:
            line = windows.unused_permutation(plan, anchor)
            if line is not None:
                removed.append(line)
        target, iterable = header_parts
        loader = self._loader_name(taken)
        drop_last = ", drop_last=True" if plan is not None and plan.window.drop_last else ""
        build = cst.parse_statement(
            f"{loader} = DataLoader(TensorDataset({', '.join(tensors)}), "
            f"batch_size={source(batch_size)}, shuffle={shuffle}{drop_last})\n"
        )
        if iterable is not None:
            header: Edit = Replace(iterable, cst.Name(loader))
        else:  # the header as a function of the loop, so that edits inside its body compose
            header = Replace(loop, lambda updated: updated.with_changes(target=target, iter=cst.Name(loader)))
        order = "shuffled each epoch, as the permutation did" if shuffle == "True" else "in the same order"
        self.report(
            loop,
            f"batches are cut from in-memory tensors by hand (line {self.context.line(loop)}); iterate over "
            f"a DataLoader built once, batches of `{source(batch_size)}` {order}",
            edits=[InsertBefore(anchor, (build,)), header, *edits, *(Remove(line) for line in removed)],
            imports=IMPORTS,
        )

    def _loader_name(self, taken: set[str]) -> str:
        return fresh_name(next((n for n in LOADER_NAMES if n not in taken), LOADER_NAMES[0]), taken)

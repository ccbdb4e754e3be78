"""Where the batches of a step loop come from, and what splitting them over processes
would have to keep: the facts that give each rank its share of every batch (PM601), read
from the training program (the step loop of `context.training`, the loaders of
`context.loaders`, the seeds of `distributed`).

`step_batches(context)` (built once per file, FileContext.shared) answers:

- `loader(loop)`: the `LoaderSite` of the DataLoader construction that feeds a step loop:
  a `for` over it, or, in a `while` loop, `next(it)` of an iterator made by `iter(loader)`
  or `itertools.cycle(loader)` (`fetches`, the statements that bind the batch; `restarts`, the statements in the loop
  that start a new pass, where an epoch ends); followed through names, `self.` attributes,
  a helper that returns it and a parameter of the training function, with how each
  function spells it (`handles`) and whether its helper builds other loaders too
  (`shared`). None when it is no DataLoader of this file;
- `fetched_draw(loop)`: for a `while` loop over `next(it)` of a generator of the file that
  draws its batches at random, that draw (as `loaders.step_data` gives it for a `for` loop);
- `built_elsewhere(loop)`: `path:line` of the construction in another module of the
  project that the loop's batches come from;
- `split_obstacle(loop)`: why the batches of a step loop no DataLoader of this file feeds
  (and no permutation slice, no random draw sized by the batch) cannot be split over the
  ranks, as a `NotDistributable`;
- `epoch_loop(loop)`: the loop around a step loop that runs once per epoch, in the
  training function or around its one call, with that function; `spelled_in(site,
  function)`: how a function spells the loader (a method reading `self.loader`);
- `epoch_site(site, loop, named)`: where the loader's sampler is told each new epoch
  (`EpochSite`: the epoch loop, how it spells the loader, its epoch variable, and the
  statements the call goes before (the epoch loop's first) or, with no variable, where an
  epoch ends: after the statement holding the step loop, or before each `iter(loader)`
  of `restarts`);
- `order_seed(loader, at)`: the seed of a loader's order (its generator's, or torch's
  global seed) readable at `at`;
- `loader_arguments(site, loop)`: what a sampler per rank needs of the loader's call (its
  dataset, batch size, shuffle and own sampler, or its `**options` dict; whether it
  shuffles, and the seed of its order; the arguments of a DistributedSampler that orders
  the dataset as it does, `sampler_arguments`), or why it cannot
  have one (a helper that builds other loaders too, a `batch_sampler`, a loader built per
  epoch or in a larger statement, one sample per step, `*args`);
- `dataset_obstacle(dataset)`: why a sampler cannot be given the same dataset (built in
  the call, an IterableDataset, an expression evaluated twice);
- `replacement_draws(sampler)`: a sampler that draws `num_samples` indices with
  replacement from torch's global generator, and that argument;
- `permutation_slice(loop)`: the slice of a `torch.randperm` permutation a `for i in
  range(...)` loop takes its batch from, and the permutation;
- `random_batches(loop)`: batches drawn at random in each step (`torch.randint(n, (b,))`,
  `torch.randn(b, d)`, in the loop or in a helper only it calls): the draws and the
  batch size that sizes them; `first_dimension(draw)`;
- `reseeds(loop, permutation, sampler)`: the seeds of the global generators the loop
  draws from that each rank must offset (seeded alike before training), or why not;
- `global_draws(loop)`: the global generators ("torch", "numpy", "random") the loop draws
  from, with a draw of each; `seeded_generator(call)`: a generator object, seeded by the
  script, that a draw uses;
- `visible(expr, at)`, `calls_of(function)` (cached).

A fact that cannot be had raises `NotDistributable` with the node and the true reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis import match as m
from codemod.analysis.bindings import argument_for, returned_values
from codemod.analysis.distributed import NotDistributable
from codemod.analysis.loaders import (
    BATCH_SAMPLER_POSITION,
    BATCH_SIZE_POSITION,
    DATALOADER,
    RANDOM,
    SAME,
    SAMPLER_POSITION,
    SHUFFLE_POSITION,
    StepData,
)
from codemod.analysis.loops import own_nodes
from codemod.analysis.names import code_of, integer_value, kwarg, method_name, names_read, positional
from codemod.analysis.project import project_of
from codemod.analysis.torch_facts import PASS_THROUGH_ITERABLES, PERMUTATIONS, REBUILDABLE_DATASETS

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "step_batches"
MAX_DEPTH = 8  # how many names, helpers and parameters a look-up follows
ITERABLE_DATASETS = ("torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset")
GENERATORS = (
    "torch.Generator",
    "numpy.random.default_rng",
    "numpy.random.RandomState",
    "numpy.random.Generator",
    "random.Random",
)
ITER = ("iter", "builtins.iter")
NEXT = ("next", "builtins.next")
REPLAYS = ("itertools.cycle",)  # iterates once, then replays what it saved: one pass of the loader
LOADER_OWN_ARGUMENTS = frozenset({"dataset", "batch_size", "shuffle", "sampler", "batch_sampler"})
COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def step_batches(context: FileContext) -> StepBatches:
    return context.shared(KEY, StepBatches)


@dataclass
class LoaderSite:
    """A DataLoader construction that feeds a step loop."""

    call: cst.Call
    statement: cst.BaseStatement  # the statement that builds it
    function: cst.FunctionDef | None
    handles: dict[int, cst.BaseExpression]  # id(scope) -> how that scope spells the loader
    shared: bool  # built by a helper also used elsewhere
    fetches: tuple[cst.CSTNode, ...] = ()  # `while` loops: the statements that bind `next(it)`
    restarts: tuple[cst.SimpleStatementLine, ...] = field(default=())  # `it = iter(loader)` in the loop
    cycled: tuple[cst.Name, cst.BaseStatement] | None = None  # a generator's parameter, its pass over it


class RandomBatches(NamedTuple):
    """Batches drawn at random in each step: the draws, the size that sizes each, where."""

    body: cst.CSTNode  # the loop's body, or the helper's it calls
    call: cst.Call | None  # the call of that helper in the loop
    sizes: tuple[cst.BaseExpression, ...]  # the first dimension of each draw
    statement: cst.CSTNode  # the statement of the loop that draws the batch


class EpochSite(NamedTuple):
    """Where a loader's sampler is told each new epoch."""

    loop: cst.For | cst.While  # the loop that runs once per epoch (a `while` over `next(it)`: itself)
    handle: cst.BaseExpression | None  # how the epoch loop spells the loader; None: the sampler's name is seen
    number: cst.Name | None  # the epoch loop's variable (`for epoch in ...`): the epoch to tell
    after: cst.CSTNode | None  # no number and no restart: the statement an epoch ends after
    before: tuple[cst.CSTNode, ...] = ()  # the statements it goes before: the epoch loop's first, or each restart


class LoaderArguments(NamedTuple):
    """What a sampler per rank needs of the DataLoader call that feeds the step loop."""

    dataset: cst.BaseExpression
    size: cst.Arg | None = None  # its batch_size (None with `**options`)
    shuffle: cst.Arg | None = None
    sampler: cst.Arg | None = None  # a sampler of the script's own
    options: cst.BaseExpression | None = None  # `DataLoader(dataset, **options)`: the dict
    shuffled: bool = False  # it shuffles: a `shuffle` that is not literally False
    seed: cst.BaseExpression | None = None  # the seed of its order (shuffled, or with `**options`)

    @property
    def always_shuffled(self) -> bool:
        """It shuffles on every run: `shuffle=True` as such, not a condition."""
        return self.shuffled and isinstance(self.shuffle.value, cst.Name) and self.shuffle.value.value == "True"

    @property
    def sampler_arguments(self) -> list[str]:
        """The code of the arguments of a DistributedSampler that orders the dataset as the
        loader does: the dataset, whether it shuffles (or on which condition) and the
        seed of its order."""
        arguments = [code_of(self.dataset)]
        if not self.shuffled:
            arguments.append("shuffle=False")
        elif not self.always_shuffled:
            arguments.append(f"shuffle={code_of(self.shuffle.value)}")
        if self.seed is not None:
            arguments.append(f"seed={code_of(self.seed)}")
        return arguments


class StepBatches:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.index = context.index
        self.names = context.names
        self.bindings = context.bindings
        self._calls: dict[int, tuple[cst.Call, ...]] = {}

    # -- the program's places ---------------------------------------------------------------

    def calls_of(self, function: cst.FunctionDef) -> tuple[cst.Call, ...]:
        """distributed.calls_of, once per function."""
        found = self._calls.get(id(function))
        if found is None:
            found = self._calls[id(function)] = tuple(facts.calls_of(self.context, function))
        return found

    def visible(self, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Can `expr` be evaluated at `at` (every name it reads bound there before it)?"""
        scope = self.context.scopes.get(at)
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

    # -- the loader ----------------------------------------------------------------------

    def loader(self, loop: cst.For | cst.While) -> LoaderSite | None:
        if isinstance(loop, cst.For):
            found = self.context.loaders.iterated(loop.iter, loop.target)
            return self._site(found[0][0] if len(found) == 1 else loop.iter) or self._cycled(loop)
        return self._fetched(loop)

    def _fetched(self, loop: cst.While) -> LoaderSite | None:
        """A `while` step loop over `next(it)`: the loader `it = iter(loader)` iterates,
        the statements that fetch the batch, and those that start a new pass in the loop."""
        fetches = [f.fetch for f in self.context.loaders.feeds if f.loop is loop and f.fetch is not None]
        cycled = self._cycled(loop)
        if cycled is not None:
            return cycled
        if not fetches:
            self._check_passes(loop)
            return None
        iterators = {self.context.module.code_for_node(f.args[0].value) for f in fetches}
        first = fetches[0].args[0].value
        if len(iterators) != 1 or not isinstance(first, cst.Name):
            raise NotDistributable(
                fetches[0],
                "the loop takes its batches with `next()` of more than one iterator, or of one it "
                "cannot name; PM601 gives one DataLoader a sampler",
            )
        sites, restarts = [], []
        for value in self.bindings.values(first) or []:
            if not (
                isinstance(value, cst.Call)
                and self.names.is_(value.func, *ITER, *REPLAYS)
                and positional(value, 0) is not None
            ):
                raise NotDistributable(value, self._passes_reason(value))
            statement = self.index.statement_of(value)
            if self.index.inside(value, loop) and not self.names.is_(value.func, *REPLAYS):
                if not isinstance(statement, cst.SimpleStatementLine) or not isinstance(
                    self.context.parents.get(statement), cst.IndentedBlock
                ):
                    raise NotDistributable(value, "a new pass over the DataLoader starts on a line of its own block")
                restarts.append(statement)
            sites.append(self._site(positional(value, 0).value))
        if not sites or any(s is None for s in sites) or len({id(s.call) for s in sites}) != 1:
            return None
        site = sites[0]
        site.fetches = tuple(self.index.statement_of(f) for f in fetches)
        site.restarts = tuple(restarts)
        return site

    def _cycled(self, loop: cst.For | cst.While) -> LoaderSite | None:
        """`next(it)` of `it = cycle(loader)`, where `cycle` is a generator of this file that
        passes over its parameter again and again (`while True:` around `for b in dl:
        yield b`, or `yield from dl`): the loader, with the generator's pass (`cycled`),
        after which an epoch ends."""
        calls = self._next_of_names(loop)
        values = {id(v): v for c in calls for v in self.bindings.values(c.args[0].value) or []}
        if not calls or len(values) != 1 or len({c.args[0].value.value for c in calls}) != 1:
            return None
        (value,) = values.values()
        helper = self.bindings.local_function(value.func) if isinstance(value, cst.Call) else None
        one_pass = _pass_repeated_forever(helper) if helper is not None else None
        if one_pass is None or self.index.inside(value, loop):
            return None
        iterated = _passed_over(one_pass)
        params = [p for p in helper.params.params if isinstance(iterated, cst.Name) and p.name.value == iterated.value]
        passed = argument_for(value, helper, params[0]) if len(params) == 1 else None
        site = self._site(passed) if passed is not None else None
        if site is None:
            return None
        site.fetches = tuple(self.index.statement_of(c) for c in calls)
        site.cycled = (iterated, one_pass)
        return site

    def _next_of_names(self, loop: cst.For | cst.While) -> list[cst.Call]:
        """The `next(it)` calls of the loop's own body, each given a name."""
        return [
            c
            for c in own_nodes(self.index, cst.Call, loop.body)
            if isinstance(c.func, cst.Name)
            and self.names.is_(c.func, *NEXT)
            and c.args
            and isinstance(c.args[0].value, cst.Name)
        ]

    def _check_passes(self, loop: cst.While) -> None:
        """Raises NotDistributable for a `next(it)` of the loop whose iterator is made by a call
        given a DataLoader (a generator of the file that re-iterates it) that the loaders
        cannot see through."""
        loaders = self.context.loaders
        for call in own_nodes(self.index, cst.Call, loop.body):
            first = positional(call, 0)
            if not (self.names.is_(call.func, *NEXT) and first is not None and isinstance(first.value, cst.Name)):
                continue
            for value in self.bindings.values(first.value) or []:
                if isinstance(value, cst.Call) and any(
                    loaders.sources(a.value, (), 0) for a in value.args if not a.star and a.keyword is None
                ):
                    raise NotDistributable(value, self._passes_reason(value))

    def fetched_draw(self, loop: cst.While) -> StepData | None:
        """For a `while` loop that takes its batches with `next(it)` of a generator of this
        file (`it = cycle(...)`) that draws them at random: StepData(RANDOM, the draw)."""
        kinds = self.context.kinds
        for call in own_nodes(self.index, cst.Call, loop.body):
            first = positional(call, 0)
            if not (self.names.is_(call.func, *NEXT) and first is not None and isinstance(first.value, cst.Name)):
                continue
            for value in self.bindings.values(first.value) or []:
                generator = kinds.local_callee(value) if isinstance(value, cst.Call) else None
                if generator is None or not kinds.exits(generator)[1]:
                    continue
                for draw in own_nodes(self.index, cst.Call, generator.body):
                    if self.names.is_(draw.func, *facts.TORCH_DRAWS):
                        return StepData(RANDOM, draw)
        return None

    def _passes_reason(self, value: cst.BaseExpression) -> str:
        return (
            f"the batches come from `{self.context.module.code_for_node(value)}`, which starts the "
            "DataLoader's passes itself: PM601 cannot tell its sampler each new epoch (set_epoch) "
            "there; iterate with `iter(loader)` and start a new pass on StopIteration"
        )

    def _site(self, expr: cst.BaseExpression) -> LoaderSite | None:
        """The DataLoader construction `expr` evaluates to, through variables, `self.`
        attributes, a helper that returns it and a parameter of the training function."""
        handles: dict[int, cst.BaseExpression] = {}
        shared = False
        for _ in range(MAX_DEPTH):
            scope = facts.function_of(self.context, expr)
            if isinstance(expr, (cst.Name, cst.Attribute)):
                handles.setdefault(id(scope), expr)
            if isinstance(expr, cst.Call):
                if self.names.is_(expr.func, DATALOADER) and not self.names.local(expr.func):
                    statement = self.index.statement_of(expr)
                    return LoaderSite(expr, statement, facts.function_of(self.context, expr), handles, shared)
                helper = self.bindings.local_function(expr.func)
                if helper is None:
                    return None
                values = returned_values(helper)
                if len(values) != 1:
                    return None
                shared = shared or len(self.calls_of(helper)) != 1
                expr = values[0]
                continue
            if isinstance(expr, cst.Name):
                parameter = self.bindings.param_of(expr)
                if parameter is not None:
                    function, param = parameter
                    calls = self.calls_of(function)
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
                values = self.context.kinds.attribute_values(expr)
                if not values or len(values) != 1:
                    return None
                expr = values[0]
                continue
            return None
        return None

    def built_elsewhere(self, loop: cst.For | cst.While) -> str | None:
        """`path:line` of the DataLoader construction in another module of the project that
        the loop's batches come from (`train, val = get_loaders()` of `from data import ...`)."""
        if not isinstance(loop, cst.For):
            return None
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

    def rebuilt_per_pass(self, loop: cst.For | cst.While) -> cst.CSTNode | None:
        """The statement, in a loop around `loop`, that binds what `loop` iterates: its
        batches come from an iterable made anew on each pass of that outer loop (loaders
        built per file of a folder, per epoch), also where `loop` iterates a parameter and
        the loop is around the call that passes it (`train(model, loader)` in a loop over a
        grid of settings that builds the loader); None when none is."""
        if not isinstance(loop, cst.For):
            return None
        outer = self.index.enclosing_loops(loop)
        todo = [(iterable, outer) for iterable, _ in self.context.loaders.iterated(loop.iter, loop.target)]
        seen: set[int] = set()
        while todo:
            iterable, around = todo.pop()
            if not isinstance(iterable, cst.Name) or id(iterable) in seen:
                continue
            seen.add(id(iterable))
            for binding in self.context.kinds.sources(iterable):
                if isinstance(binding.node, cst.Param):
                    passed = self.context.kinds.arguments(binding.node) or ()
                    todo += [(value, self.index.enclosing_loops(call)) for call, value in passed if value is not None]
                    continue
                if not any(self.index.inside(binding.node, each) for each in around):
                    continue
                statement = self.index.statement_of(binding.node)
                value = statement.body[0].value if isinstance(statement, cst.SimpleStatementLine) else None
                first = positional(value, 0) if isinstance(value, cst.Call) else None
                if first is not None and self.names.is_(value.func, *PASS_THROUGH_ITERABLES):
                    todo.append((first.value, around))  # `pbar = tqdm(loader)` each epoch: the loader's
                elif isinstance(value, cst.Call):
                    return statement
        return None

    def split_obstacle(self, loop: cst.For | cst.While) -> NotDistributable:
        """Why the batches of a step loop that no DataLoader of this file feeds cannot be
        split over the ranks: drawn at random in a way no share is taken of, the same data
        every step, data from outside a dataset, a loader another module builds or one built
        anew on each pass, batches a `for` loop over a counter takes with `next()` of a
        DataLoader, or a source this analysis does not follow."""
        shown = self.context.source(getattr(loop, "iter", loop)).strip()
        data = self.fetched_draw(loop) if isinstance(loop, cst.While) else self.context.loaders.step_data(loop)
        if data is not None:
            return NotDistributable(getattr(loop, "iter", loop), self._step_data_reason(shown, data))
        elsewhere = self.built_elsewhere(loop)
        if elsewhere is not None:
            return NotDistributable(
                loop.iter,
                f"the batches of `{shown}` come from a DataLoader that another module of the project builds "
                f"({elsewhere}); PM601 rewrites only the file that trains: give that DataLoader a "
                "DistributedSampler and the per-rank batch size there",
            )
        rebuilt = self.rebuilt_per_pass(loop)
        if rebuilt is not None:
            return NotDistributable(
                loop.iter,
                f"the batches of `{shown}` come from what line {self.context.line(rebuilt)} builds anew on "
                "each pass of the loop around it; PM601 splits the batches of one DataLoader built once: "
                "build it before that loop",
            )
        fetched = next((f for f in self.context.loaders.feeds if f.loop is loop and f.fetch is not None), None)
        if fetched is not None and isinstance(loop, cst.For):
            return NotDistributable(
                loop.iter,
                f"the batches come from `{self.context.source(fetched.fetch)}` of a DataLoader, taken by hand in "
                f"a loop over `{shown}`; PM601 splits the batches of a `for` loop over the DataLoader, of "
                "`next(it)` of `it = iter(loader)` in a `while` loop, or of `next()` of a generator of this file "
                "that yields the loader's batches whole (`while True: for batch in loader: yield batch`): loop "
                "over the DataLoader itself",
            )
        if isinstance(loop, cst.While):
            return NotDistributable(
                loop,
                "it cannot tell where the batches of this `while` loop come from, so it cannot split "
                "them over the ranks; take them with `next(it)` of `it = iter(loader)` from a DataLoader",
            )
        return NotDistributable(
            loop.iter,
            f"it cannot tell where the batches of `{shown}` come from, so it cannot split them over "
            "the ranks; PM601 splits the batches of a DataLoader it can follow to where this file "
            "builds it, which the loop iterates or takes with `next()` of its iterator",
        )

    def _step_data_reason(self, shown: str, data: StepData) -> str:
        """Why the steps' data (RANDOM, SAME, OUTSIDE) is no batch to split; `shown`: what the loop iterates."""
        if data.how == RANDOM:
            return (
                f"each step draws its batch at random (`{self.context.source(data.at).strip()}`, line "
                f"{self.context.line(data.at)}), in a way PM601 does not split (one draw in the loop whose "
                "first dimension is the batch size); give each rank its own seed so that the ranks draw "
                "different batches"
            )
        if data.how == SAME:
            return (
                f"every step trains on the same data (full-batch training: `{shown}` counts the steps and "
                "the loop draws no batch), so there are no batches to split over the ranks; training on "
                "several GPUs needs the data itself split, a part per rank"
            )
        return (
            f"each step's data comes from `{self.context.source(data.at).strip()}` (line "
            f"{self.context.line(data.at)}), not from a dataset, so there are no batches to split over "
            "the ranks; each rank would need its own source (its own seed, its own environment)"
        )

    def spelled_in(self, site: LoaderSite, function: cst.FunctionDef | None) -> cst.BaseExpression | None:
        """How `function` spells the loader: a name it reads it by, or `self.loader` in a
        method of the class another method of which reads it as `self.loader`."""
        spelled = site.handles.get(id(function))
        if spelled is not None:
            return spelled
        owner = facts.class_of(self.context, function)
        if owner is None:
            return None
        for scope_id, handle in site.handles.items():
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

    def epoch_site(self, site: LoaderSite, loop: cst.CSTNode, named: bool) -> EpochSite | None:
        """Where the sampler of the loader `site` feeding the step loop `loop` is told the
        epoch (None: one pass over the data); `named`: a sampler is bound to a name right
        before the loader, readable where the loader's function runs the epoch loop. Raises
        NotDistributable where the epoch loop cannot reach the loader or its end is unknown."""
        if site.cycled is not None:  # a generator's pass over the loader ends an epoch
            return EpochSite(loop, site.cycled[0], None, site.cycled[1], site.restarts)
        if site.restarts:  # `it = iter(loader)` on StopIteration: a new pass starts there
            epoch_loop, function = loop, facts.function_of(self.context, loop)
        else:
            epoch_loop, function = self.epoch_loop(loop)
        if epoch_loop is None:
            return None  # one pass over the data: epoch 0's order
        handle = None
        if not (named and function is site.function and self.index.before(site.statement, epoch_loop)):
            handle = self.spelled_in(site, function)
            if handle is None or not self.visible(handle, epoch_loop):
                raise NotDistributable(
                    epoch_loop,
                    "the DataLoader is not visible in the epoch loop, where its sampler must be "
                    "told the epoch (set_epoch)",
                )
        body = epoch_loop.body
        if not isinstance(body, cst.IndentedBlock):
            raise NotDistributable(epoch_loop, "the epoch loop is written on one line")
        if isinstance(epoch_loop, cst.For) and isinstance(epoch_loop.target, cst.Name):
            return EpochSite(epoch_loop, handle, epoch_loop.target, None, (body.body[0],))
        if site.restarts:
            return EpochSite(epoch_loop, handle, None, None, site.restarts)
        holder = next((s for s in body.body if self.index.inside(loop, s)), None)
        if holder is None:
            raise NotDistributable(epoch_loop, "it cannot tell where an epoch ends")
        return EpochSite(epoch_loop, handle, None, holder)

    def epoch_loop(self, loop: cst.CSTNode) -> tuple[cst.CSTNode | None, cst.FunctionDef | None]:
        """The loop around the step loop that runs once per epoch, in the training function
        or around its one call, with the function it is in; (None, None) for one pass."""
        node: cst.CSTNode = loop
        for _ in range(4):
            for ancestor in self.index.ancestors(node):
                if isinstance(ancestor, facts.SCOPES):
                    break
                if isinstance(ancestor, COMPREHENSIONS):
                    raise NotDistributable(
                        ancestor,
                        "the epochs run in a comprehension; PM601 tells the sampler each epoch "
                        "(set_epoch) at the top of a `for` loop: write the epochs as one",
                    )
            outer = self.index.enclosing_loops(node)
            if outer:
                return outer[0], facts.function_of(self.context, outer[0])
            function = facts.function_of(self.context, node)
            if function is None:
                return None, None
            calls = self.calls_of(function)
            if len(calls) != 1:
                return None, None
            node = calls[0]
        return None, None

    def order_seed(self, call: cst.Call, at: cst.CSTNode) -> cst.BaseExpression | None:
        """The seed of a DataLoader's order, readable at `at`: its generator's
        (`generator=torch.Generator().manual_seed(s)`), or torch's global seed set before it."""
        generator = kwarg(call, "generator")
        if generator is not None:
            value = generator.value
            if isinstance(value, cst.Name):
                values = self.bindings.values(value) or []
                value = values[0] if len(values) == 1 else None
            if isinstance(value, cst.Call) and method_name(value) == "manual_seed" and value.args:
                seed = value.args[0].value
                return seed if self.visible(seed, at) else None
            if isinstance(generator.value, cst.Name):  # `g = torch.Generator(); g.manual_seed(s)`
                for seeded in self._seeds_of(generator.value.value, ("manual_seed",)):
                    if self.visible(seeded.args[0].value, at):
                        return seeded.args[0].value
            return None
        same = facts.function_of(self.context, at)
        for seeded in reversed(facts.seed_calls(self.context, "torch")):
            if facts.function_of(self.context, seeded) is same and not self.index.before(seeded, at):
                continue  # seeded after the loader is built
            if seeded.args and self.visible(seeded.args[0].value, at):
                return seeded.args[0].value
        return None

    def _seeds_of(self, name: str, methods: tuple[str, ...] = ("manual_seed", "seed")) -> list[cst.Call]:
        """`name.manual_seed(s)` (or another of `methods`) calls of the file, with their seed."""
        return [
            call
            for call in self.index.find(cst.Call)
            if method_name(call) in methods
            and call.args
            and isinstance(call.func.value, cst.Name)
            and call.func.value.value == name
        ]

    # -- the dataset and the sampler ------------------------------------------------------

    def loader_arguments(self, site: LoaderSite, loop: cst.CSTNode) -> LoaderArguments:
        """The DataLoader's dataset, batch size, shuffle and sampler, or its options dict;
        raises NotDistributable where a sampler per rank cannot be given to it."""
        call = site.call
        if site.shared:
            raise NotDistributable(
                call,
                "the helper that builds this DataLoader builds others too (evaluation?); give the "
                "training loader a DistributedSampler by hand",
            )
        if any(a.star for a in call.args):
            return self._options_arguments(site)
        sampler = kwarg(call, "sampler") or positional(call, SAMPLER_POSITION)
        if (kwarg(call, "batch_sampler") or positional(call, BATCH_SAMPLER_POSITION)) is not None:
            raise NotDistributable(call, "the DataLoader has its own `batch_sampler`; split it over the ranks by hand")
        self._check_built_once(site, loop)
        dataset = kwarg(call, "dataset") or positional(call, 0)
        if dataset is None:
            raise NotDistributable(call, "the DataLoader has no dataset argument PM601 can read")
        self._check_dataset(dataset.value)
        size = _batch_size_argument(call)
        shuffle = kwarg(call, "shuffle") or positional(call, SHUFFLE_POSITION)
        shuffled = shuffle is not None and not (isinstance(shuffle.value, cst.Name) and shuffle.value.value == "False")
        seed = self.order_seed(call, site.statement) if shuffled else None
        return LoaderArguments(dataset.value, size, shuffle, sampler, shuffled=shuffled, seed=seed)

    def _options_arguments(self, site: LoaderSite) -> LoaderArguments:
        """`DataLoader(dataset, **options)`: the dataset and the options dict, when the call
        passes nothing else the sampler depends on."""
        call = site.call
        stars = [a for a in call.args if a.star]
        plain = [a for a in call.args if not a.star and a.keyword is None]
        named = {a.keyword.value for a in call.args if a.keyword is not None}
        if [a.star for a in stars] != ["**"] or len(plain) != 1 or named & LOADER_OWN_ARGUMENTS:
            raise NotDistributable(
                call,
                "the DataLoader takes `*args`/`**kwargs` beside its own batch or sampler arguments; "
                "PM601 cannot see which of them it uses",
            )
        self._check_dataset(plain[0].value)  # a dataset built in the call is one cheap to build twice
        seed = self.order_seed(call, site.statement)
        return LoaderArguments(plain[0].value, options=stars[0].value, seed=seed)

    def _check_built_once(self, site: LoaderSite, loop: cst.CSTNode) -> None:
        """Raises NotDistributable unless the DataLoader is built in a statement of its own,
        outside the training loop."""
        index = self.index
        if not isinstance(self.context.parents.get(site.statement), (cst.IndentedBlock, cst.Module)):
            raise NotDistributable(site.call, "the DataLoader is not built in a statement of its own")
        if index.inside(site.statement, index.outermost_loop(loop)):
            raise NotDistributable(site.call, "a new DataLoader is built every epoch; build it once, before the loop")

    def _check_dataset(self, dataset: cst.BaseExpression) -> None:
        obstacle = self.dataset_obstacle(dataset)
        if obstacle is not None:
            raise NotDistributable(*obstacle)

    def dataset_obstacle(self, dataset: cst.BaseExpression) -> tuple[cst.CSTNode, str] | None:
        """Why a DistributedSampler cannot be given the DataLoader's dataset, or None."""
        if isinstance(dataset, cst.Call):
            if not self.names.is_(dataset.func, *REBUILDABLE_DATASETS) or not all(
                isinstance(a.value, (cst.Name, cst.Attribute, cst.Integer)) for a in dataset.args
            ):
                return dataset, (
                    "the dataset is built inside the DataLoader call; build it in a variable "
                    "first, so that its sampler can be given the same dataset"
                )
            return None
        if not isinstance(dataset, (cst.Name, cst.Attribute)):
            return dataset, "the DataLoader's dataset is an expression PM601 would evaluate twice"
        values = (
            self.bindings.values(dataset)
            if isinstance(dataset, cst.Name)
            else self.context.kinds.attribute_values(dataset)
        ) or []
        kinds = self.context.kinds
        for value in values:
            if not isinstance(value, cst.Call):
                continue
            classdef = kinds.local_class(value.func)
            bases = [value.func]
            for _ in range(MAX_DEPTH):
                if any(self.names.is_(b, *ITERABLE_DATASETS) for b in bases):
                    return dataset, (
                        "the dataset is an IterableDataset, which a DistributedSampler cannot "
                        "split; shard it per rank by hand"
                    )
                if classdef is None:
                    break
                bases = [b.value for b in classdef.bases]
                classdef = next((c for c in (kinds.local_class(b) for b in bases) if c), None)
        return None

    def replacement_draws(self, sampler: cst.BaseExpression, loader: cst.Call) -> tuple[cst.Call, cst.Arg]:
        """A sampler of the script's own that draws `num_samples` indices with replacement
        from torch's global generator: its construction and that argument (each rank can
        draw its share of them). Raises NotDistributable for any other sampler."""
        reason = (
            f"the DataLoader has its own `sampler` (`{self.context.module.code_for_node(sampler).strip()}`); "
            "split it over the ranks by hand"
        )
        value = sampler
        if isinstance(value, cst.Name):
            values = self.bindings.values(value) or []
            value = values[0] if len(values) == 1 else None
        if not isinstance(value, cst.Call) or any(a.star for a in value.args):
            raise NotDistributable(loader, reason)
        qualified = next((n for n in self.names.of(value.func) if n in facts.REPLACEMENT_SAMPLERS), None)
        if qualified is None:
            raise NotDistributable(loader, reason)
        weighted = qualified in facts.WEIGHTED_SAMPLERS
        replacement = kwarg(value, "replacement") or positional(value, 2 if weighted else 1)
        drawn = self.context.module.code_for_node(replacement.value) if replacement is not None else None
        if drawn != "True" and not (drawn is None and weighted):
            raise NotDistributable(
                loader, f"{reason}: without replacement it draws a permutation, which the ranks would have to share"
            )
        if kwarg(value, "generator") is not None:
            raise NotDistributable(
                loader, f"{reason}: it draws from a generator of its own, seeded alike on every rank"
            )
        count = kwarg(value, "num_samples") or positional(value, facts.REPLACEMENT_SAMPLERS[qualified])
        if count is None:
            raise NotDistributable(
                loader,
                f"{reason}: it draws len(dataset) indices an epoch; give it `num_samples`, which PM601 "
                "splits over the ranks",
            )
        return value, count

    # -- batches made by hand ---------------------------------------------------------------

    def permutation_slice(self, loop: cst.For | cst.While) -> tuple[cst.Subscript, cst.Call] | None:
        """`for i in range(...)` over slices of a `torch.randperm` permutation (`perm[i:i + b]`):
        the one slice, and the permutation it is cut from."""
        if not isinstance(loop, cst.For) or not isinstance(loop.target, cst.Name):
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
            permutations = [v for v in values if isinstance(v, cst.Call) and self.names.is_(v.func, *PERMUTATIONS)]
            if permutations and len(permutations) == len(values):
                found.append((subscript, permutations[0]))
        return found[0] if len(found) == 1 else None

    def random_batches(self, loop: cst.For | cst.While) -> RandomBatches | None:
        """Batches drawn at random every step (`torch.randint(n, (batch_size,))`,
        `torch.randn(batch_size, d)`, in the loop or in a helper only it calls), when one
        batch size sizes every draw of one body and nothing else there."""
        places: list[tuple[cst.CSTNode, cst.Call | None]] = [(loop.body, None)]
        for call in own_nodes(self.index, cst.Call, loop.body):
            helper = self.bindings.local_function(call.func) if isinstance(call.func, cst.Name) else None
            if helper is not None and len(self.calls_of(helper)) == 1:
                places.append((helper.body, call))
        found = []
        for body, call in places:
            for draw in own_nodes(self.index, cst.Call, body):
                size = self.first_dimension(draw)
                if size is not None and not self._repeated_in(draw, body):
                    found.append((body, call, draw, size))
        if not found:
            return None
        code = self.context.module.code_for_node
        if len({id(body) for body, _, _, _ in found}) != 1 or len({code(size) for _, _, _, size in found}) != 1:
            raise NotDistributable(
                found[0][2],
                "the step draws its batches at random in several places or with several sizes; "
                "PM601 cannot tell which to split over the ranks",
            )
        body, call, draw, batch = found[0]
        if integer_value(batch) == 1:
            raise NotDistributable(draw, "the loop draws one sample per step, which cannot be split over the ranks")
        # The draws must be all the batch size sizes: `x = sample(B)` beside `t = randint(T, (B,))`
        # would keep B rows where the draw makes B / N.
        sizes = {id(size) for _, _, _, size in found}
        spelled = code(batch)
        others = [
            n
            for n in own_nodes(self.index, (cst.Name, cst.Attribute), body)
            if code(n) == spelled and id(n) not in sizes and not isinstance(self.context.parents.get(n), cst.Attribute)
        ]
        if others:
            raise NotDistributable(
                others[0],
                f"`{spelled}` sizes more than the random draws of each step (line "
                f"{self.context.line(others[0])}); PM601 cannot tell which sizes are per sample, "
                "to split them over the ranks",
            )
        statement = self.index.statement_of(call if call is not None else draw)
        return RandomBatches(body, call, tuple(size for _, _, _, size in found), statement)

    def _repeated_in(self, node: cst.CSTNode, body: cst.CSTNode) -> bool:
        """Does `node` run several times per run of `body`: in a loop or comprehension inside it
        (a draw per sample, `for i in range(len(x)): dy, dx = torch.randint(0, 9, (2,))`, is
        no batch)?"""
        repeating = (cst.For, cst.While, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
        return any(
            isinstance(ancestor, repeating) and self.index.inside(ancestor, body)
            for ancestor in self.index.ancestors(node)
            if ancestor is not body
        )

    def first_dimension(self, draw: cst.Call) -> cst.BaseExpression | None:
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

    # -- random draws and their seeds ---------------------------------------------------------

    def global_draws(self, loop: cst.CSTNode, skip: cst.Call | None = None) -> dict[str, cst.Call]:
        """The global generators the loop draws from (itself and in the helpers of the file
        it calls), with the first draw of each; `skip` is not counted. Raises NotDistributable
        for a draw from a generator object the script seeds."""
        calls = list(own_nodes(self.index, cst.Call, loop.body))
        for call in list(calls):
            helper = self.bindings.local_function(call.func) if isinstance(call.func, cst.Name) else None
            if helper is not None:
                calls.extend(own_nodes(self.index, cst.Call, helper.body))
        draws: dict[str, cst.Call] = {}
        for call in calls:
            if call is skip:
                continue
            owned = self.seeded_generator(call)
            if owned is not None:
                raise NotDistributable(
                    call,
                    f"the loop draws from `{owned}`, a generator seeded alike on every rank, which "
                    "PM601 cannot reseed per rank without changing what else it draws; seed it with "
                    "`seed + distributed.seed_offset()` by hand",
                )
            generator = facts.generator_of(self.context, call)
            if generator is not None:
                draws.setdefault(generator, call)
        return draws

    def reseeds(self, loop: cst.CSTNode, permutation: cst.Call | None, sampler: cst.Call | None) -> list[cst.Call]:
        """The seed calls of the global generators the loop draws from (besides the shared
        `permutation`; `sampler`: a sampler drawing from torch's), each seeded alike on every
        rank before training, that each rank must reseed with its own offset; a generator
        never seeded starts from the OS's entropy, per process already. Raises
        NotDistributable where the seed is out of the loop's reach, or the loop draws besides
        a permutation every rank must draw alike."""
        draws = self.global_draws(loop, skip=permutation)
        if sampler is not None:
            draws.setdefault("torch", sampler)
        outer = self.index.outermost_loop(loop)
        found = []
        for generator, draw in draws.items():
            seed = self.seed_before(generator, outer)
            if seed is None:
                continue  # never seeded: each process starts from the OS's entropy
            if not self.visible(seed.args[0].value, outer):
                raise NotDistributable(
                    draw,
                    f"`{self.context.source(draw.func).strip()}` draws from a generator seeded alike on every "
                    f"rank (line {self.context.line(seed)}), and that seed is out of reach of the loop; "
                    "reseed it with `seed + distributed.seed_offset()` by hand",
                )
            if permutation is not None:
                raise NotDistributable(
                    draw,
                    "the loop draws random numbers besides the batch permutation, which must be the "
                    "same on every rank; give one of them a generator of its own",
                )
            found.append(seed)
        return found

    def seed_before(self, generator: str, outer: cst.CSTNode) -> cst.Call | None:
        """The last call that seeds a global generator with a value before `outer` runs."""
        function = facts.function_of(self.context, outer)
        seeds = [
            s
            for s in facts.seed_calls(self.context, generator)
            if s.args and (facts.function_of(self.context, s) is not function or self.index.before(s, outer))
        ]
        return seeds[-1] if seeds else None

    def seeded_generator(self, call: cst.Call) -> str | None:
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
            if any(self._is_generator(value) for value in values) and self._seeds_of(candidate.value):
                return candidate.value  # `g = Generator(); g.manual_seed(s)`
        return None

    def _is_generator(self, value: cst.BaseExpression) -> bool:
        return isinstance(value, cst.Call) and self.names.is_(value.func, *GENERATORS)

    def _is_seeded_generator(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.Call) and method_name(value) == "manual_seed" and value.args:
            return self._is_generator(value.func.value)
        return self._is_generator(value) and bool(value.args)


def _batch_size_argument(call: cst.Call) -> cst.Arg:
    """The DataLoader's batch size argument; raises NotDistributable where it yields single
    samples or does not batch."""
    size = kwarg(call, "batch_size") or positional(call, BATCH_SIZE_POSITION)
    if size is None or integer_value(size.value) == 1:
        raise NotDistributable(
            call,
            "the DataLoader yields one sample per step, which cannot be split over the ranks "
            "(the global batch would grow with their number); give it a batch_size",
        )
    if isinstance(size.value, cst.Name) and size.value.value == "None":
        raise NotDistributable(call, "the DataLoader does not batch (batch_size=None); split its batches by hand")
    return size


def _pass_repeated_forever(function: cst.FunctionDef) -> cst.BaseStatement | None:
    """The one statement of a `while True:` that is the whole body of `function`."""
    body = function.body.body if isinstance(function.body, cst.IndentedBlock) else ()
    forever = body[0] if len(body) == 1 else None
    if not (
        isinstance(forever, cst.While)
        and isinstance(forever.test, cst.Name)
        and forever.test.value == "True"
        and isinstance(forever.body, cst.IndentedBlock)
        and len(forever.body.body) == 1
    ):
        return None
    return forever.body.body[0]


def _passed_over(one_pass: cst.BaseStatement) -> cst.BaseExpression | None:
    """What a generator's pass yields the items of: `dl` of `for b in dl: yield b` or of
    `yield from dl`."""
    if isinstance(one_pass, cst.For) and isinstance(one_pass.target, cst.Name):
        lines = one_pass.body.body if isinstance(one_pass.body, cst.IndentedBlock) else ()
        yields = m.SimpleStatementLine([m.Expr(m.Yield(m.Name(one_pass.target.value)))])
        return one_pass.iter if len(lines) == 1 and m.matches(lines[0], yields) else None
    small = one_pass.body[0] if isinstance(one_pass, cst.SimpleStatementLine) else None
    yields = small.value if isinstance(small, cst.Expr) and isinstance(small.value, cst.Yield) else None
    return yields.value.item if yields is not None and isinstance(yields.value, cst.From) else None

"""Which DataLoaders a file builds and which loops they feed: the look-ups PM102, PM201
and PM103 share, built once per file (`context.loaders`).

It finds every DataLoader construction (torch's, under any alias, and subclasses of
this file) and answers: which constructions an expression may evaluate to (through
names, parameters, helper functions that build and return the loader, `self.`
attributes set in another method, enumerate/zip/tqdm/iter), which loops each loader
feeds (iterating it, or taking `next(it)` from it), which copies to a device a loop
makes of its batches (also in the functions and methods of this file it hands the
batch to), whether a loop trains (calls `backward()`, itself or through those
functions), whether the dataset may hold CUDA data, where the collate_fn leaves the
batches, and what a `**kwargs` dict holds.

The other way round (`returned`): for a DataLoader that a function of this file builds
and returns, the calls of that function in the other modules of the file's package and
what each does with the batches, asked of those modules' own analyses, so that the
loader is fixed where it is built.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis.bindings import argument_for
from codemod.analysis.command_line import Option
from codemod.analysis.loops import own_nodes
from codemod.analysis.names import is_none, kwarg, method_name, methods_of, names_read, number_value, positional
from codemod.analysis.project import BatchUse, Function, Site, project_of
from codemod.analysis.torch_facts import (
    ARGUMENTS_IN_ORDER_SETUP_METHODS,
    BATCH_PLACING_ENGINES,
    DATASETS_OF_DATASETS,
    DEFAULT_COLLATES,
    GET_WORKER_INFO,
    IN_MEMORY_TABLES,
    INDEX_BUILTINS,
    INDEX_DRAWS,
    INDEXING_METHODS,
    ITEM_FACTORIES,
    ITERABLE_DATASET,
    MAP_STYLE_DATASETS,
    MAP_STYLE_PREFIXES,
    NOT_TENSOR_FUNCTIONS,
    OPS,
    PERMUTATIONS,
    SPLIT_DATASETS,
    TABLE_INDEXERS,
    TENSOR_COLLATES,
    TENSOR_FUNCTIONS,
    TENSOR_NAMESPACES,
    TENSOR_ROW_DATASETS,
    TORCH_DRAWS,
)
from codemod.analysis.values import DEVICE_NAME, PASS_THROUGH_ITERABLES, Kind, Place
from codemod.analysis.variance import variance

if TYPE_CHECKING:
    from codemod.context import FileContext

DATALOADER = "torch.utils.data.DataLoader"
# `DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, ...)`
BATCH_SIZE_POSITION, SHUFFLE_POSITION, SAMPLER_POSITION, BATCH_SAMPLER_POSITION = 1, 2, 3, 4
NUM_WORKERS_POSITION, COLLATE_FN_POSITION, PIN_MEMORY_POSITION = 5, 6, 7
# Iterables whose items are their first argument's (PM103 writes DevicePrefetcher(loader, device)).
LOOKS_THROUGH = {
    "itertools.islice",
    "runtime.data.DevicePrefetcher",
    "runtime.DevicePrefetcher",
    *PASS_THROUGH_ITERABLES,
}
MAX_DEPTH = 8  # how many assignments and helper calls a look-up follows
ENUMERATE = ("enumerate", "builtins.enumerate")
COUNTERS = ("builtins.range", "itertools.count")  # iterables of step numbers, not of data
ZIP = ("zip", "builtins.zip")
NEXT = ("next", "builtins.next")
LOOPS = (cst.For, cst.While)
SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
BACKWARD_METHODS = frozenset({"backward"})
COPY_METHODS = frozenset({"to", "cuda"})  # the methods `copies_to_device` looks for
COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
RANGE = ("range", "builtins.range")
COLLECTING_METHODS = frozenset({"append", "extend", "insert", "add", "update"})  # gathering results, not work
# What loading one item of a dataset takes (`Loaders.item_cost`):
INDEXES = "indexes"  # an index into tensors the training process already holds, nothing more
COMPUTES = "computes"  # work per item: calls that are not indexing (decoding, tokenizing, reading), loops
UNKNOWN = "unknown"  # perfmod cannot see it


def memoized(method):
    """Cache a recursive look-up, keyed by node identity: without it, a name with many
    bindings makes the walk exponential in MAX_DEPTH."""

    @functools.wraps(method)
    def cached(self, *args):
        key = (method.__name__, *(_key(a) for a in args))
        if key not in self._memo:
            result = method(self, *args)
            if isinstance(result, list):  # the same node found along many paths: keep it once
                result = list({_identity(item): item for item in result}.values())
            self._memo[key] = result
        return self._memo[key]

    return cached


def _identity(item) -> object:
    """A found node's identity, or a tuple's of nodes (a loader with its set-up call)."""
    return tuple(map(id, item)) if isinstance(item, tuple) else id(item)


def _key(argument):
    """Nodes live as long as the tree the rules visit, so their identity is a key;
    a set of node ids is keyed by its contents (a freed set's id can be reused)."""
    if isinstance(argument, (set, frozenset)):
        return frozenset(argument)
    if isinstance(argument, (int, tuple, type(None))):
        return argument
    return id(argument)


class Feed(NamedTuple):
    """A loop that gets its batches from a DataLoader construction: a `for` over (something
    built from) it, or a loop that takes `next(it)` of an iterator over it."""

    loader: cst.Call
    loop: cst.CSTNode  # a For, a While, or a comprehension (`[step(b) for b in loader]`)
    target: (
        cst.BaseExpression
    )  # what binds the loader's batches: (part of) the loop target, or `x, y` of `x, y = next(it)`
    fetch: cst.Call | None = None  # the `next(it)` call, for a loop that fetches its batches
    # The set-up call on the way from the loader to the loop that puts each batch on the
    # device inside `next()` (`dl = accelerator.prepare(dl)`; `placing_setup`), if any.
    placed: cst.Call | None = None


class DeviceCopy(NamedTuple):
    """A copy of a loop's batch to a device: `x.to(device)`, `x.cuda()`."""

    call: cst.Call
    place: Place
    device: cst.BaseExpression | None  # None for `.cuda()`


class Handoff(NamedTuple):
    """A DataLoader (built in this file, or by a project factory this file calls) that this
    file passes to a function of another module of the project, whose loop copies its
    batches to a device."""

    loader: cst.Call  # the construction (here, or in the factory's module)
    call: cst.Call  # the call of this file that passes it
    function: Function  # the project function called
    param: cst.Param  # the parameter of `function` it is passed to
    use: BatchUse  # where its batches are copied
    factory: cst.Call | None = None  # the call of this file to the project factory that built it, if not here


class Caller(NamedTuple):
    """A call, in another module of this file's package, of a function of this file that
    returns one of its DataLoaders, and what that module does with the loader's batches."""

    call: Site  # the call there
    function: Function  # the function around the call there (module code: its module's name, the function called)
    use: BatchUse | None  # the loop that copies its batches to a device (or trains on them); None: none seen
    host: Site | None  # a loop over its batches there that copies none of them to a device
    guarded: bool  # the call runs only when its module runs as a script (spawned workers import it)


class Returned(NamedTuple):
    """A DataLoader construction of this file that a top-level function of it returns, with
    the calls of that function in the other modules of the file's package."""

    loader: cst.Call
    exit: cst.Return  # the `return` that gives it
    callers: tuple[Caller, ...]

    @property
    def kept_on_host(self) -> Caller | None:
        """The first caller with a loop over the batches that copies none of them to a device
        (a caller whose use of them perfmod cannot follow is not one)."""
        return next((c for c in self.callers if c.host is not None), None)

    @property
    def copier(self) -> Caller | None:
        """The first caller that copies the batches to a device, a training one first."""
        copying = [c for c in self.callers if c.use is not None and c.use.copy is not None]
        return next((c for c in copying if c.use.trains), copying[0] if copying else None)

    @property
    def copied_to_cuda(self) -> bool:
        """Do the copies of every caller that copies the batches provably go to CUDA?"""
        return all(c.use.cuda for c in self.callers if c.use is not None and c.use.copy is not None)

    @property
    def trainer(self) -> Caller | None:
        """The first caller whose loop trains on the batches."""
        return next((c for c in self.callers if c.use is not None and c.use.trains), None)

    @property
    def dataset_change(self) -> Site | None:
        """A change of the loader's dataset (`dl.dataset.set_epoch(epoch)`) on a caller's way."""
        return next((c.use.dataset_change for c in self.callers if c.use is not None and c.use.dataset_change), None)

    @property
    def guarded(self) -> bool:
        """Does every call run only when its module runs as a script (spawned workers import it)?"""
        return all(c.guarded for c in self.callers)


class StepData(NamedTuple):
    """Where the data of a loop that iterates no DataLoader comes from."""

    how: str  # RANDOM, SAME or OUTSIDE (below)
    at: cst.CSTNode | None = None  # the draw, or the call that gives the data


class BatchWindow(NamedTuple):
    """`seq[step * bs:(step + 1) * bs]` (or `seq[i:i + bs]` for `i` stepping by `bs`) in a
    loop over a counter: one batch of `bs` items of `seq`, the next one each iteration."""

    subscript: cst.Subscript
    sequence: cst.BaseExpression  # `seq`
    width: cst.BaseExpression  # `bs`


class ListBatch(NamedTuple):
    """A step's batch cut from a permutation of a Python list held in memory and looked up
    item by item: `perm = torch.randperm(N)`, `idx = perm[step * bs:(step + 1) * bs]`,
    `batch = [texts[i] for i in idx.tolist()]`."""

    loop: cst.For  # the step loop
    window: BatchWindow  # the slice of the permutation
    permutation: cst.Call  # `torch.randperm(N, generator=g)`
    corpus: cst.BaseExpression  # `texts`
    picks: cst.BaseExpression  # the comprehension that looks the items up
    batch: cst.Name | None  # the name it is bound to
    per_epoch: bool  # the permutation is drawn again in a loop around the step loop
    work: tuple[cst.Call, ...]  # what the step calls on the items, other than the model (tokenizing)
    other_reads: tuple[cst.Name, ...]  # reads of the indices (`idx`) other than the look-up


RANDOM = "random"  # drawn at random in the step, in the loop or a function of the file it calls
SAME = "same"  # every step trains on the same data (full-batch training)
OUTSIDE = "outside"  # each step's data comes from a call of an object outside the program (an environment)


class Loaders:
    """DataLoader constructions of one file and the loops they feed."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.index = context.index
        self.names = context.names
        self.kinds = context.kinds
        self.bindings = context.bindings
        self._memo: dict[tuple, object] = {}
        # Every spelling of torch's DataLoader (an alias, a subclass) names it somewhere in the
        # file; without it, skip resolving the qualified name of every call.
        self.constructions: list[cst.Call] = []
        if "DataLoader" in context.code:
            spellings = {"DataLoader"} | {c.name.value for c in self.index.find(cst.ClassDef)}
            aliases = {
                a.asname.name.value
                for a in self.index.find(cst.ImportAlias)
                if a.asname is not None and isinstance(a.asname.name, cst.Name)
            }
            spellings |= aliases
            self.constructions = [
                call
                for call in self.index.find(cst.Call)
                if _last_name(call.func) in spellings and self.is_construction(call)
            ]
        self._ids = {id(call) for call in self.constructions}
        # DataLoaders built in another module of the project, by a function this file calls:
        # id of the construction there -> (construction, the function, the call here).
        self.external: dict[int, tuple[cst.Call, object, cst.Call]] = {}

    # -- what a loader is ------------------------------------------------------------------

    def is_construction(self, call: cst.Call) -> bool:
        """`DataLoader(...)` of torch (any alias, also as a subscripted generic:
        `DataLoader[Dataset](...)`), or of a subclass of it defined in this file."""
        func = class_of_call(call)
        if self.names.is_(func, DATALOADER):
            return not self.names.local(func)  # a class of this file shadowing the import is not torch's
        classdef = self.kinds.local_class(func)
        return classdef is not None and self.kinds.class_fact(classdef).kind is Kind.LOADER

    def is_torch_loader(self, call: cst.Call) -> bool:
        return self.names.is_(class_of_call(call), DATALOADER)

    def built_each_pass(self, loader: cst.Call, loop: cst.CSTNode | None) -> cst.CSTNode | None:
        """The loop around `loop`, the loop `loader` feeds, that builds the loader anew on each
        of its passes (a loader made per epoch): the construction is in it, or `loop`
        iterates a call made there of the function that builds it (`for batch in
        module.train_dataloader():` inside the epoch loop), directly or through a name bound
        there. Its iterator, and the workers of it, last one pass. None when it is built once."""
        if not isinstance(loop, cst.For):
            return None
        around = self.index.enclosing_loops(loop)
        inline = next((outer for outer in self.index.enclosing_loops(loader) if self.index.inside(loop, outer)), None)
        builder = self.index.first_enclosing(loader, cst.FunctionDef)
        if inline is not None or not around or builder is None:
            return inline
        for iterable, _ in self.iterated(loop.iter, loop.target):
            values = [iterable]
            if isinstance(iterable, cst.Name):
                values = [
                    self.context.bindings.assigned_value(binding)
                    for binding in self.kinds.sources(iterable)
                    if any(self.index.inside(binding.node, outer) for outer in around)
                ]
            for value in values:
                if isinstance(value, cst.Call) and self.kinds.local_callee(value) is builder:
                    return next((outer for outer in around if self.index.inside(value, outer)), None)
        return None

    def dataset(self, loader: cst.Call) -> cst.BaseExpression | None:
        arg = kwarg(loader, "dataset") or positional(loader, 0)
        return arg.value if arg is not None else None

    # -- which loaders feed which loops -------------------------------------------------

    @functools.cached_property
    def feeds(self) -> list[Feed]:
        """Every loop over a loader, with the loader and what binds its batches."""
        found: list[Feed] = []
        if not self.constructions and not self._may_feed_from_elsewhere():
            return found
        for loop in self.index.find((cst.For, cst.CompFor)):
            fed = (
                loop
                if isinstance(loop, cst.For)
                else self.index.first_enclosing(loop, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp))
            )
            if not self._may_use_batches(fed):
                continue
            for iterable, target in self.iterated(loop.iter, loop.target):
                for loader, placed in self._placed_sources(iterable, (), 0):
                    found.append(Feed(loader, fed, target, placed=placed))
        for call in self.index.find(cst.Call):
            if not (
                isinstance(call.func, cst.Name)
                and call.func.value == "next"
                and call.args
                and self.names.is_(call.func, *NEXT)
            ):
                continue
            loop = self.index.first_enclosing(call, (*LOOPS, *SCOPES))
            if not isinstance(loop, LOOPS) or not self._may_use_batches(loop):
                continue
            statement = self.context.parents.get(call)
            assigned = isinstance(statement, cst.Assign) and statement.value is call and len(statement.targets) == 1
            for loader, placed in self._placed_sources(call.args[0].value, (), 0):
                target = statement.targets[0].target if assigned else call
                found.append(Feed(loader, loop, target, call, placed))
        return found

    @functools.cached_property
    def host_loops(self) -> list[Feed]:
        """The `for` loops over a loader that `feeds` leaves out: they neither train nor copy
        anything to a device, so their batches stay on the host. Asked only of the modules
        that call a function of another module that returns its loader."""
        found = []
        for loop in self.index.find(cst.For):
            if self._may_use_batches(loop):
                continue
            for iterable, target in self.iterated(loop.iter, loop.target):
                found.extend(Feed(loader, loop, target) for loader in self.sources(iterable, (), 0))
        return found

    def _may_use_batches(self, loop: cst.CSTNode) -> bool:
        """Could the rules use what `loop` iterates over: does it train, or copy anything to a
        device (`copies_to_device`'s calls)? Others are not followed to their loaders, which
        may be in another module."""
        return self.trains(loop) or self._calls_method(body(loop), COPY_METHODS, 0)

    def trains(self, loop: cst.CSTNode) -> bool:
        """Does the loop's body call `backward()`, itself or in a function or method of this
        file it calls (followed a few calls deep)?"""
        return self._calls_method(body(loop), BACKWARD_METHODS, 0)

    @functools.cached_property
    def training_loops(self) -> list[cst.For]:
        """The `for` loops of the file that train (`trains`), in the order they are written."""
        return [loop for loop in self.index.find(cst.For) if self.trains(loop)]

    @memoized
    def _calls_method(self, region: cst.CSTNode, methods: frozenset[str], depth: int) -> bool:
        """Does `region` call one of `methods`, itself or in the functions and methods of this
        file it calls (as deep as `_copies_in` looks)?"""
        if depth > 3:
            return False
        calls = own_nodes(self.index, cst.Call, region)
        if any(method_name(call) in methods for call in calls):
            return True
        return any(
            (callee := self.kinds.local_callee(call) or self.kinds.partial_callee(call)) is not None
            and self._calls_method(callee.body, methods, depth + 1)
            for call in calls
        )

    def iterated(self, iterable: cst.BaseExpression, target: cst.BaseExpression):
        """(iterable, the part of the loop target its items bind) through enumerate, zip, tqdm, iter."""
        if isinstance(iterable, cst.Call):
            args = [a.value for a in iterable.args if a.keyword is None and not a.star]
            if self.names.is_(iterable.func, *ENUMERATE) and args:
                inner = target.elements[1].value if _is_tuple_of(target, 2) else target
                return self.iterated(args[0], inner)
            if self.names.is_(iterable.func, *ZIP):
                found = []
                for index, arg in enumerate(args):
                    inner = target.elements[index].value if _is_tuple_of(target, len(args)) else target
                    found.extend(self.iterated(arg, inner))
                return found
            if self.names.is_(iterable.func, *LOOKS_THROUGH) and args:
                return self.iterated(args[0], target)
        return [(iterable, target)]

    @memoized
    def step_data(self, loop: cst.For | cst.While) -> StepData | None:
        """For a loop over a counter (a `range`, an `itertools.count`): where each
        step's data comes from. RANDOM when it takes its batches from a generator of this
        file that draws tensors at random (`torch.randint`, `torch.randn`); SAME when the loop binds
        no name but its counter, or when every model call of its body is given values that
        are the same on every iteration (`inputs = torch.from_numpy(x_train)`, then
        `model(inputs)`), so each step sees the data the previous one did; OUTSIDE
        when a value the loop binds comes from a method of an object that is neither torch's,
        a model, nor of this program (`state, _ = env.reset()`). None when it is none of these
        (a helper of the file that slices a tensor, a project function)."""
        if not self.iterates_counter(loop):
            return None
        steps = self.context.loops
        calls = steps.own_calls(loop.body)
        for call in calls:
            helper = steps.callee(call)
            if helper is None or self.kinds.class_of(helper) is not None or not self.index.find(cst.Yield, helper):
                continue  # the batches of a generator of the file (`next(batches())`)
            for draw in steps.own_calls(helper.body):
                if self.names.is_(draw.func, *TORCH_DRAWS):
                    return StepData(RANDOM, draw)
        bound = self.context.bound_in(loop.body) - self.context.bound_in(loop.target)
        if not bound or self._models_given_the_same(loop):
            return StepData(SAME)
        training = self.context.training
        for call in calls:
            if not isinstance(self.context.parents.get(call), (cst.Assign, cst.Tuple, cst.Element)):
                continue
            func = call.func  # the first call whose value the loop binds
            if (
                isinstance(func, cst.Attribute)
                and isinstance(func.value, cst.Name)
                and func.value.value not in bound
                and not self.names.of(func)  # a method of an object, not a module's function
                and f"Tensor.{func.attr.value}" not in OPS
                and isinstance(self.context.parents.get(call), (cst.Assign, cst.Tuple, cst.Element))
                and steps.callee(call) is None
                and not self.names.startswith(func, ("torch", "builtins"))
                and self.kinds.fact(func.value).kind is Kind.UNKNOWN
                and not training.is_model(func.value)
                and not project_of(self.context).function(func)
            ):
                return StepData(OUTSIDE, call)
            return None
        return None

    def _models_given_the_same(self, loop: cst.For) -> bool:
        """Is every model call of the loop's own body (one at least) given values that are
        the same on every iteration (`variance`), each as written or, for a name the loop
        binds anew, as every binding that reaches it gives it?"""
        same = variance(self.context)
        calls = [c for c in self.context.loops.own_calls(loop.body) if self.context.training.is_model(c.func)]
        for call in calls:
            for arg in call.args:
                if same.of(arg.value, loop) is None:
                    continue
                if not isinstance(arg.value, cst.Name) or same.of_bound_anew(arg.value, loop) is not None:
                    return False
        return bool(calls)

    def library_iterable(self, expr: cst.BaseExpression) -> str | None:
        """The qualified name of the library call (not torch's, not the project's) that every
        value of the iterable `expr` comes from, seen through `enumerate`, `tqdm` and other
        iterables that pass items through (`train_iter` of `train_iter, dev_iter =
        data.BucketIterator.splits(...)`); None when it may be anything else."""
        expr = self.passed_through(expr)
        if not isinstance(expr, cst.Name):
            return None
        sources = self.context.kinds.value_sources(expr)
        names = set()
        for source in sources:
            qualified = sorted(self.names.of(source.func)) if isinstance(source, cst.Call) else []
            if not qualified or any(n.startswith(("torch.", "builtins.", ".")) for n in qualified):
                return None
            names.add(qualified[0])
        return names.pop() if len(names) == 1 else None

    def iterates_counter(self, loop: cst.For | cst.While) -> bool:
        """Is `loop` a `for` over a counter (`range(n)`, `itertools.count()`), seen through
        `enumerate`, `tqdm` and the other iterables that pass items through?"""
        if not isinstance(loop, cst.For):
            return False
        iterable = self.passed_through(loop.iter)
        return isinstance(iterable, cst.Call) and self.names.is_(iterable.func, *COUNTERS)

    def passed_through(self, expr: cst.BaseExpression) -> cst.BaseExpression | None:
        """The iterable whose items `expr` passes on, through `enumerate`, `tqdm` and the
        other iterables that pass items through; None when one of them is given no iterable."""
        while isinstance(expr, cst.Call) and self.names.is_(expr.func, *ENUMERATE, *LOOKS_THROUGH):
            first = positional(expr, 0)
            if first is None:
                return None
            expr = first.value
        return expr

    @memoized
    def sources(self, expr: cst.BaseExpression, path: tuple[int, ...], depth: int) -> list[cst.Call]:
        """The DataLoader constructions `expr` may evaluate to; `path` indexes into
        tuples on the way (`train, val = make_loaders()` takes element 0 or 1)."""
        return [loader for loader, _ in self._placed_sources(expr, path, depth)]

    def placing_setup(self, expr: cst.BaseExpression) -> cst.Call | None:
        """The set-up call that puts each batch of `expr` on the device inside `next()`, on
        every way from `expr` to the loaders it may be (`loader = accelerator.prepare(dl)`,
        `places_batches`): a copy of its batches to the device copies nothing. None when a
        way has none, or no loader is found."""
        found = self._placed_sources(expr, (), 0)
        placed = [setup for _, setup in found]
        return placed[0] if placed and all(setup is not None for setup in placed) else None

    @memoized
    def _placed_sources(
        self, expr: cst.BaseExpression, path: tuple[int, ...], depth: int
    ) -> list[tuple[cst.Call, cst.Call | None]]:
        """`sources`, each with the set-up call on the way that places its batches on the
        device (`places_batches`), or None."""
        if depth > MAX_DEPTH:
            return []
        if isinstance(expr, (cst.Tuple, cst.List)) and path:
            if path[0] >= len(expr.elements) or any(isinstance(e, cst.StarredElement) for e in expr.elements):
                return []
            return self._placed_sources(expr.elements[path[0]].value, path[1:], depth + 1)
        if isinstance(expr, cst.Call):
            if id(expr) in self._ids:
                return [] if path else [(expr, None)]
            through = self._looked_through(expr)
            if through is not None:
                return self._placed_sources(through, path, depth + 1)
            handed, inner = self._handed_back(expr, path)
            if handed is not None:
                found = self._placed_sources(handed, inner, depth + 1)
                return [(loader, expr) for loader, _ in found] if self.places_batches(expr) else found
            function = self.kinds.local_callee(expr)
            if function is None:
                return [(loader, None) for loader in self._project_sources(expr, path, depth)]
            return [
                found
                for value in self.kinds.returned(function)
                for found in self._placed_sources(value, path, depth + 1)
            ]
        if isinstance(expr, cst.Name):
            bound = self.bound_values(expr)
            if not bound and not path:
                return [(loader, None) for loader in self._annotated_loader(expr)]
            return [found for source, inner in bound for found in self._placed_sources(source, inner + path, depth + 1)]
        if isinstance(expr, cst.Attribute):  # `self.train_loader`, assigned in another method
            values = self.kinds.attribute_values(expr) or []
            return [found for value in values for found in self._placed_sources(value, path, depth + 1)]
        if isinstance(expr, cst.IfExp):
            return self._placed_sources(expr.body, path, depth + 1) + self._placed_sources(expr.orelse, path, depth + 1)
        return []

    def places_batches(self, call: cst.Call) -> bool:
        """Does the set-up call `call` hand back loaders that put each batch on the engine's
        device inside `next()` (torch_facts.BATCH_PLACING_ENGINES): `accelerator.prepare(dl)`
        of every Accelerator `accelerator` may be, its `device_placement` not passed, or
        passed `True`; Fabric's `fabric.setup_dataloaders(dl)`? (The loaders such a call
        hands back are followed only where it passes no keyword, which could turn the
        placement off: `move_to_device=False`.)"""
        if not isinstance(call.func, cst.Attribute):
            return False
        engines = self.kinds.bound_values(call.func.value) or []
        for engine in engines:
            known = self.names.of(engine.func) & BATCH_PLACING_ENGINES.keys() if isinstance(engine, cst.Call) else set()
            placement = BATCH_PLACING_ENGINES[min(known)] if known else None
            if placement is None or placement.method != call.func.attr.value:
                return False
            if placement.engine_keyword is None:
                continue
            passed = kwarg(engine, placement.engine_keyword)
            if passed is not None and not (isinstance(passed.value, cst.Name) and passed.value.value == "True"):
                return False
            if passed is None and any(arg.star == "**" for arg in engine.args):
                return False
        return bool(engines)

    def _may_feed_from_elsewhere(self) -> bool:
        """Can a loop of this file get its batches from a loader built elsewhere: a parameter
        annotated `DataLoader`, or a function of another module of the project?"""
        return "DataLoader" in self.context.code or project_of(self.context).imports_project()

    def _project_sources(self, call: cst.Call, path: tuple[int, ...], depth: int) -> list:
        """The loaders a call of a function of another module of the project gives: the
        constructions it returns there, or, for a generator of its argument's items, the
        argument's loaders."""
        project = project_of(self.context)
        if not project.imports_project() or not project.may_give_loaders(call):
            return []
        function = project.called(call)
        if function is None:
            return []
        items = project.yields_items_of(function)
        argument = project.argument(call, function, items) if items is not None else None
        if argument is not None:
            return self.sources(argument, path, depth + 1)
        made = project.loaders_made(function, path)
        for loader in made:
            self.external.setdefault(id(loader), (loader, function, call))
        return made

    def _annotated_loader(self, name: cst.Name) -> list:
        """The parameter `name` is bound to, when it is annotated `DataLoader` and no call of
        its function in this file says which loader it gets: a loader built elsewhere."""
        parameter = self.bindings.param_of(name)
        if parameter is None or parameter[1].annotation is None:
            return []
        fact = self.kinds.annotation_fact(parameter[1].annotation.annotation)
        return [parameter[1]] if fact.kind is Kind.LOADER else []

    def is_construction_here(self, loader: cst.CSTNode) -> bool:
        """Is `loader` (a source of a feed) a DataLoader construction of this file, rather than
        one of another module or a parameter?"""
        return id(loader) in self._ids

    @memoized
    def only_loaders(self, expr: cst.BaseExpression, path: tuple[int, ...], depth: int) -> bool:
        """Is every value `expr` may have a DataLoader construction of this file? (`sources`
        finds the loaders among other values; a loop over `loader if a else my_batches`
        must not be rewritten as if it were a loader's.)"""
        if depth > MAX_DEPTH:
            return False
        if isinstance(expr, (cst.Tuple, cst.List)) and path:
            if path[0] >= len(expr.elements) or any(isinstance(e, cst.StarredElement) for e in expr.elements):
                return False
            return self.only_loaders(expr.elements[path[0]].value, path[1:], depth + 1)
        if isinstance(expr, cst.Call):
            if id(expr) in self._ids:
                return not path
            through = self._looked_through(expr)
            if through is not None:
                return self.only_loaders(through, path, depth + 1)
            handed, path = self._handed_back(expr, path)
            if handed is not None:
                return self.only_loaders(handed, path, depth + 1)
            function = self.kinds.local_callee(expr)
            values = self.kinds.returned(function) if function is not None else []
            return bool(values) and all(self.only_loaders(value, path, depth + 1) for value in values)
        if isinstance(expr, cst.Name):
            sources = self.bound_values(expr)
            return bool(sources) and all(
                self.only_loaders(source, inner + path, depth + 1) for source, inner in sources
            )
        if isinstance(expr, cst.Attribute):
            values = self.kinds.attribute_values(expr) or []
            return bool(values) and all(self.only_loaders(value, path, depth + 1) for value in values)
        if isinstance(expr, cst.IfExp):
            return self.only_loaders(expr.body, path, depth + 1) and self.only_loaders(expr.orelse, path, depth + 1)
        return False

    def local_function(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
        return self.bindings.local_function(func)

    def _handed_back(self, call: cst.Call, path: tuple[int, ...]) -> tuple[cst.BaseExpression | None, tuple[int, ...]]:
        """The argument a set-up call that hands back what it is given, in order
        (`accelerator.prepare(model, opt, loader)`), gives at `path`'s first index (or its
        only argument), with the rest of the path; None where it is no such call."""
        if path:
            element = self.kinds.element(call, path[0])
            return (element, path[1:]) if element is not None else (None, path)
        if method_name(call) in ARGUMENTS_IN_ORDER_SETUP_METHODS and len(call.args) == 1:
            only = call.args[0]
            return (only.value, path) if only.keyword is None and not only.star else (None, path)
        return None, path

    def _looked_through(self, call: cst.Call) -> cst.BaseExpression | None:
        """`loader` of `tqdm(loader)` / `iter(loader)` held in a variable, or of a generator of
        this file that yields the batches of its parameter (`def cycle(dl): while True:
        for batch in dl: yield batch`, also unpacked and packed again: `for x, y in dl:
        yield x, y`): the same batches."""
        if (
            call.args
            and call.args[0].keyword is None
            and not call.args[0].star
            and self.names.is_(call.func, *LOOKS_THROUGH)
        ):
            return call.args[0].value
        callee = self.kinds.local_callee(call)
        if callee is None:
            return None
        returns, yields = self.kinds.exits(callee)
        if returns or not yields:
            return None
        sources = set()
        for node in yields:
            loop = self.index.first_enclosing(node, (cst.For, cst.FunctionDef))
            if not (
                isinstance(loop, cst.For)
                and node.value is not None
                and _repacked(node.value, loop.target)
                and isinstance(loop.iter, cst.Name)
            ):
                return None
            parameter = self.bindings.param_of(loop.iter)
            if parameter is None or parameter[0] is not callee:
                return None
            sources.add(parameter[1])
        if len(sources) != 1:
            return None
        offset = self.kinds.receiver_offset(call, callee)
        return self.kinds.argument(call, callee, sources.pop(), offset)

    @memoized
    def bound_values(self, name: cst.Name) -> list[tuple[cst.BaseExpression, tuple[int, ...]]]:
        """What `name` is bound to where it is read: each assigned value that may reach it
        (`Kinds.sources`: through `x += noise`, which updates the value it reads; with the
        index `a, b = value` unpacks), each element of a literal it loops over,
        or, for a parameter, the argument every call of its function passes."""
        parameter = self.bindings.param_of(name)
        if parameter is not None:
            passed = self.kinds.passed(parameter[1])  # every call's argument, or the default it leaves
            return [(argument, ()) for argument in passed or ()]
        found = []
        for assignment in self.kinds.sources(name):
            value = self.bindings.assigned_value(assignment)
            unpacked = self.bindings.unpacked(assignment) if value is None else None
            statement = self.bindings.statement(assignment.node)
            if value is not None:
                found.append((value, ()))
            elif unpacked is not None:
                found.append((unpacked[0], (unpacked[1],)))
            elif (
                isinstance(statement, cst.For)
                and statement.target is assignment.node
                and isinstance(statement.iter, (cst.Tuple, cst.List))
            ):
                found.extend((element.value, ()) for element in statement.iter.elements)  # `for loader in (a, b):`
        return found

    @memoized
    def attribute_values(self, expr: cst.Attribute) -> list[tuple[cst.BaseExpression, tuple[int, ...]]]:
        """What `self.<attr>` (or `obj.<attr>` on an instance of a class of this file) is
        bound to by the class's methods, with the index a tuple assignment unpacks
        (`self.train_set, self.val_set = random_split(...)`); empty when not all can be seen."""
        values = self.kinds.attribute_values(expr)
        if values is not None:
            return [(value, ()) for value in values]
        classdef = self.kinds.instance_class(expr.value) if isinstance(expr.value, cst.Name) else None
        if classdef is None:
            return []
        found: list[tuple[cst.BaseExpression, tuple[int, ...]]] = []
        for statement in self.index.find((cst.Assign, cst.AugAssign, cst.AnnAssign), within=classdef):
            method = self.index.first_enclosing(statement, cst.FunctionDef)
            if method is None or not method.params.params:
                continue
            owner = method.params.params[0].name.value
            targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
            for target in targets:
                parts = [(target, ())]
                if isinstance(target, (cst.Tuple, cst.List)):
                    parts = [(element.value, (k,)) for k, element in enumerate(target.elements)]
                for part, path in parts:
                    if not (
                        isinstance(part, cst.Attribute)
                        and part.attr.value == expr.attr.value
                        and isinstance(part.value, cst.Name)
                        and part.value.value == owner
                    ):
                        continue
                    if not isinstance(statement, cst.Assign) or len(statement.targets) != 1:
                        return []
                    if isinstance(target, (cst.Tuple, cst.List)) and any(
                        isinstance(e, cst.StarredElement) for e in target.elements
                    ):
                        return []
                    found.append((statement.value, path))
        return found

    # -- loaders passed to a function: what it does with their batches ----------------------

    @memoized
    def param_roots(self, expr: cst.BaseExpression, depth: int) -> list[cst.Param]:
        """The parameters whose loader `expr` iterates the batches of: the parameter itself,
        a name bound to it, `iter(p)` / `tqdm(p)`, a generator (of this file or the project)
        that yields the items of its argument. The callers of the function are not followed:
        this asks what a function does with whatever loader it is given."""
        if depth > MAX_DEPTH:
            return []
        if isinstance(expr, cst.Name):
            parameter = self.bindings.param_of(expr)
            if parameter is not None:
                return [parameter[1]]
            return [
                p for value, path in self.bound_values(expr) if not path for p in self.param_roots(value, depth + 1)
            ]
        if isinstance(expr, cst.Call):
            through = self._looked_through(expr)
            if through is not None:
                return self.param_roots(through, depth + 1)
            project = project_of(self.context)
            if self.kinds.local_callee(expr) is not None or not project.imports_project():
                return []
            function = project.called(expr)
            items = project.yields_items_of(function) if function is not None else None
            argument = project.argument(expr, function, items) if items is not None else None
            return self.param_roots(argument, depth + 1) if argument is not None else []
        if isinstance(expr, cst.IfExp):
            return self.param_roots(expr.body, depth + 1) + self.param_roots(expr.orelse, depth + 1)
        return []

    def _from_param(self, expr: cst.BaseExpression, param: cst.Param) -> bool:
        return any(found is param for found in self.param_roots(expr, 0))

    def param_feeds(self, function: cst.FunctionDef, param: cst.Param) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
        """(loop, what binds its batches) for each loop of `function` fed by the loader passed
        to `param`: a `for` over it (through enumerate, zip, tqdm, iter, generators), or a
        loop that takes `next(it)` of an iterator over it."""
        found = []
        for loop in self.index.find((cst.For, cst.CompFor), within=function.body):
            for iterable, target in self.iterated(loop.iter, loop.target):
                if self._from_param(iterable, param):
                    fed = (
                        loop
                        if isinstance(loop, cst.For)
                        else self.index.first_enclosing(
                            loop, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
                        )
                    )
                    found.append((fed, target))
        for call in self.index.find(cst.Call, within=function.body):
            if not (isinstance(call.func, cst.Name) and call.func.value == "next" and call.args):
                continue
            if not self.names.is_(call.func, *NEXT):
                continue
            loop = self.index.first_enclosing(call, (*LOOPS, *SCOPES))
            if not isinstance(loop, LOOPS) or not self._from_param(call.args[0].value, param):
                continue
            statement = self.context.parents.get(call)
            assigned = isinstance(statement, cst.Assign) and statement.value is call and len(statement.targets) == 1
            found.append((loop, statement.targets[0].target if assigned else call))
        return found

    def param_handoffs(
        self, function: cst.FunctionDef, param: cst.Param
    ) -> list[tuple[cst.Call, cst.FunctionDef | Function, cst.Param]]:
        """(call, callee, its parameter) for each call in `function` that passes the loader
        given to `param` on: to a function or method of this file (callee: its FunctionDef)
        or of another module of the project (callee: a project Function)."""
        project = project_of(self.context)
        found = []
        for call in self.index.find(cst.Call, within=function.body):
            if not call.args or not any(self._from_param(arg.value, param) for arg in call.args if not arg.star):
                continue
            callee = self.kinds.local_callee(call)
            if callee is not None:
                offset = self.kinds.receiver_offset(call, callee)
                for inner in _all_params(callee):
                    argument = self.kinds.argument(call, callee, inner, offset)
                    if argument is not None and self._from_param(argument, param):
                        found.append((call, callee, inner))
                continue
            other = project.called(call) if project.imports_project() else None
            if other is None:
                continue
            for inner in _all_params(other.node):
                argument = project.argument(call, other, inner)
                if argument is not None and self._from_param(argument, param):
                    found.append((call, other, inner))
        return found

    def dataset_change(self, function: cst.FunctionDef, param: cst.Param) -> cst.CSTNode | None:
        """A call of a method of the dataset of the loader given to `param`
        (`dl.dataset.set_epoch(epoch)`), or an assignment to one of its attributes, in `function`."""
        for node in self.index.find((cst.Call, cst.AssignTarget, cst.AugAssign), within=function.body):
            target = node.func if isinstance(node, cst.Call) else node.target
            while isinstance(target, (cst.Attribute, cst.Subscript)):
                owner = target.value
                if (
                    isinstance(owner, cst.Attribute)
                    and owner.attr.value == "dataset"
                    and target is not owner
                    and self._from_param(owner.value, param)
                ):
                    return node
                target = owner
        return None

    @functools.cached_property
    def handoffs(self) -> list[Handoff]:
        """The loaders this file builds, or gets from a project factory, and passes to a function
        of another module of the project that copies their batches to a device."""
        project = project_of(self.context)
        if not project.imports_project():
            return []
        found = []
        for call in self.index.find(cst.Call):
            if not call.args or id(call) in self._ids:
                continue
            if not any(isinstance(loader, cst.Call) for arg in call.args for loader in self.sources(arg.value, (), 0)):
                continue  # no loader passed: the callee's module need not be read
            function = project.called(call)
            if function is None:
                continue
            for param in _all_params(function.node):
                argument = project.argument(call, function, param)
                if argument is None:
                    continue
                made = [loader for loader in self.sources(argument, (), 0) if isinstance(loader, cst.Call)]
                if not made:
                    continue
                use = project.batches_copied(function, param)
                if use is None or use.copy is None:
                    continue
                for loader in made:
                    factory = None if id(loader) in self._ids else self._factory_call(argument, loader, (), 0)
                    found.append(Handoff(loader, call, function, param, use, factory))
        return found

    def _factory_call(
        self, expr: cst.BaseExpression, loader: cst.Call, path: tuple[int, ...], depth: int
    ) -> cst.Call | None:
        """The call of this file to a project factory that gives `expr` the `loader` it builds
        (`train, _ = make_loaders()`): of two loaders built by one construction there, the one
        this argument holds."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.Name):
            for value, inner in self.bound_values(expr):
                found = self._factory_call(value, loader, inner + path, depth + 1)
                if found is not None:
                    return found
            return None
        if isinstance(expr, cst.Call):
            through = self._looked_through(expr)
            if through is not None:
                return self._factory_call(through, loader, path, depth + 1)
            project = project_of(self.context)
            function = project.called(expr) if self.kinds.local_callee(expr) is None else None
            if function is None:
                return None
            if any(made is loader for made in project.loaders_made(function, path)):
                return expr
            items = project.yields_items_of(function)
            argument = project.argument(expr, function, items) if items is not None else None
            return self._factory_call(argument, loader, path, depth + 1) if argument is not None else None
        return None

    def factory_call_of(self, feed: Feed) -> cst.Call | None:
        """The call of this file to the project factory that built the loader `feed` iterates:
        of two loaders one construction there builds (`train, _ = make(a)`, `val, _ = make(b)`),
        the one this loop gets its batches from."""
        expr = feed.fetch.args[0].value if feed.fetch is not None else getattr(feed.loop, "iter", None)
        if expr is None:
            return None
        for iterable, _ in self.iterated(expr, cst.Name("_")):
            found = self._factory_call(iterable, feed.loader, (), 0)
            if found is not None:
                return found
        return None

    # -- loaders this file returns to other modules of its package -------------------------

    @functools.cached_property
    def returned(self) -> dict[int, Returned]:
        """id of a DataLoader construction of this file -> the calls, in the other modules of
        the file's package, of the top-level functions of this file that return it, each with
        what its module does with the loader's batches. Asked of those modules' own analyses;
        the package is read as text first (`Project.package_calls`)."""
        found: dict[int, Returned] = {}
        if not self.constructions or not project_of(self.context).folder:
            return found
        project = project_of(self.context)
        for function, made in self._returning_functions:
            calls = project.package_calls(function)
            for loader, path, exit in made:
                callers = tuple(
                    caller
                    for module, call in calls
                    if (caller := self._caller(module, call, loader, path, function)) is not None
                )
                if callers:
                    known = found.get(id(loader))
                    callers = (known.callers if known is not None else ()) + callers
                    found[id(loader)] = Returned(loader, known.exit if known else exit, callers)
        return found

    @functools.cached_property
    def _returning_functions(self) -> list[tuple[cst.FunctionDef, list]]:
        """The top-level functions of this file that return DataLoaders it builds, with those."""
        if not self.constructions:
            return []
        found = []
        for function in self.context.module.body:
            if isinstance(function, cst.FunctionDef):
                made = self._made_and_returned(function)
                if made:
                    found.append((function, made))
        return found

    def returned_to(self, loader: cst.Call, path: str) -> bool:
        """Is `loader`, a construction of this file, returned by a top-level function of it, and
        is the file `path` a module of this file's package that imports it: does this file's
        analysis (`returned`) see the calls `path` makes of that function? Read from the
        package's text, so that a file that uses the loader can ask it without the analysis of
        every other caller."""
        if id(loader) not in self._ids:
            return False
        if not any(made is loader for _, found in self._returning_functions for made, _, _ in found):
            return False
        own = os.path.abspath(path)
        return any(module.path == own for module in project_of(self.context).package_importers())

    def trained_where_built(self, loader: cst.Call) -> bool:
        """Is `loader`, a construction of this file, returned to callers in other modules of
        the package one of which trains on its batches: its worker count is decided here."""
        returned = self.returned.get(id(loader))
        return returned is not None and returned.trainer is not None

    def pinned_where_built(self, loader: cst.Call) -> bool:
        """Is `loader`, a construction of this file, returned to callers in other modules of
        the package one of which copies its batches to a device: its pin_memory is decided
        (fixed, or reported) here."""
        returned = self.returned.get(id(loader))
        return returned is not None and returned.copier is not None

    def _made_and_returned(self, function: cst.FunctionDef) -> list[tuple[cst.Call, tuple[int, ...], cst.Return]]:
        """(construction, where in the returned tuple, the `return`) for each DataLoader of
        this file that every `return` of `function` gives at that place."""
        returns, yields = self.kinds.exits(function)
        if yields or not returns or any(r.value is None for r in returns):
            return []
        widths = {len(r.value.elements) for r in returns if isinstance(r.value, (cst.Tuple, cst.List))}
        paths = [()] + [(k,) for k in range(max(widths, default=0))]
        found = []
        for path in paths:
            if not all(self.only_loaders(r.value, path, 0) for r in returns):
                continue
            for exit in returns:
                for loader in self.sources(exit.value, path, 0):
                    if id(loader) in self._ids:
                        found.append((loader, path, exit))
        return list({id(item[0]): item for item in found}.values())

    def _caller(
        self, module, call: cst.Call, loader: cst.Call, path: tuple[int, ...], function: cst.FunctionDef
    ) -> Caller | None:
        """What `module` (a module of the package that calls `function` of this file with
        `call`) does with the batches of `loader`, one of the loaders the call gives."""
        context = module.context
        mirror = self._mirror_there(module.project, call, loader, path)
        if mirror is None:
            return None
        name, caller_function = _calling_function(module, call, function)
        site = Site(name, module.path, context.line(call), context.source(call.func))
        use, host = self._feeds_use(module, call, mirror, name)
        for handoff in context.loaders.handoffs:
            if handoff.loader is mirror and handoff.factory is call and _outranks(handoff.use.trains, use):
                use = handoff.use
        change = self._dataset_changed_near(module, call, mirror)
        if use is not None and change is not None and use.dataset_change is None:
            use = BatchUse(use.copy, use.loop, use.trains, use.cuda, change)
        return Caller(site, caller_function, use, host, context.loops.guarded_from_import(call))

    def _mirror_there(self, project, call: cst.Call, loader: cst.Call, path: tuple[int, ...]) -> cst.Call | None:
        """`loader` as the module of `call` reads this file, when `call` gives it."""
        called = project.function(call.func)
        if called is None:
            return None
        there = called.context.loaders
        if len(there.constructions) != len(self.constructions):
            return None  # this file changed since it was read there: its loaders cannot be matched
        mirror = there.constructions[self.constructions.index(loader)]
        return mirror if any(made is mirror for made in project.loaders_made(called, path)) else None

    @staticmethod
    def _feeds_use(module, call: cst.Call, mirror: cst.Call, name: str) -> tuple[BatchUse | None, Site | None]:
        """(use, host) of the loops of `module` over the batches of `mirror` that `call` gives:
        the loop that copies them to a device (one that trains first), and a loop that copies
        none of them."""
        context, loaders = module.context, module.context.loaders
        use: BatchUse | None = None
        host: Site | None = None
        for feed in loaders.feeds:
            if feed.loader is not mirror or loaders.factory_call_of(feed) is not call:
                continue
            copies = loaders.copies_to_device(feed.loop, feed.target)
            loop = Site(name, module.path, context.line(feed.loop))
            trains = loaders.trains(feed.loop)
            if not copies:
                host = host or loop
                if use is None and trains:
                    use = BatchUse(None, loop, True, False, None)
            elif _outranks(trains, use):
                first = copies[0].call
                text = context.source(first)
                copy = Site(name, module.path, context.line(first), text if len(text) <= 80 else "")
                use = BatchUse(copy, loop, trains, all(c.place is Place.CUDA for c in copies), None)
        for feed in loaders.host_loops:
            if host is None and feed.loader is mirror and loaders.factory_call_of(feed) is call:
                host = Site(name, module.path, context.line(feed.loop))
        return use, host

    @staticmethod
    def _dataset_changed_near(module, call: cst.Call, loader: cst.Call) -> Site | None:
        """A change of a loader's dataset (`loader.dataset.set_epoch(epoch)`, an attribute of it
        assigned) in the function (or module code) around `call` (perhaps of another loader),
        or in a function of the project it hands `loader` to there (`forever(loader)`)."""
        context, project = module.context, module.project
        scope = context.index.first_enclosing(call, (cst.FunctionDef,)) or context.module
        for passing in context.index.find(cst.Call, within=scope):
            other = project.called(passing) if passing.args else None
            for param in _all_params(other.node) if other is not None else ():
                argument = project.argument(passing, other, param)
                if argument is None or not any(found is loader for found in context.loaders.sources(argument, (), 0)):
                    continue
                use = project.batches_copied(other, param)
                if use is not None and use.dataset_change is not None:
                    return use.dataset_change
        for node in context.index.find((cst.Call, cst.AssignTarget, cst.AugAssign), within=scope):
            target = node.func if isinstance(node, cst.Call) else node.target
            while isinstance(target, (cst.Attribute, cst.Subscript)):
                owner = target.value
                if isinstance(owner, cst.Attribute) and owner.attr.value == "dataset" and target is not owner:
                    text = context.source(node)
                    name = scope.name.value if isinstance(scope, cst.FunctionDef) else "<module>"
                    return Site(name, context.path, context.line(node), text if len(text) <= 80 else "")
                target = owner
        return None

    # -- what a loop does with its batches -------------------------------------------------

    def copies_to_device(self, loop: cst.CSTNode, target: cst.BaseExpression) -> list[DeviceCopy]:
        """Each copy of the batch (bound to `target`) to a device in the loop body, or in
        the functions and methods of this file the loop hands (a part of) the batch to."""
        bound = frozenset({id(target), *(id(node) for node in self.index.find(cst.Name, within=target))})
        return self._copies_in(body(loop), bound, 0)

    @memoized
    def _copies_in(self, region: cst.CSTNode, bound: frozenset, depth: int) -> list[DeviceCopy]:
        found = []
        for call in own_nodes(self.index, cst.Call, region):
            method = method_name(call)
            if method not in ("to", "cuda"):
                found.extend(self._copies_in_callee(call, bound, region, depth))
                continue
            if not self.derives_from(call.func.value, bound, region, 0):
                continue
            if method == "cuda":
                found.append(DeviceCopy(call, Place.CUDA, None))
                continue
            copy = self.kinds.copy_of(call)
            device = kwarg(call, "device") or positional(call, 0)
            if copy is not None and copy.moves_device and copy.target is not Place.HOST:
                found.append(DeviceCopy(call, copy.target, device.value if device is not None else None))
            elif copy is None and device is not None:
                place = self.device_copy_place(device.value)
                if place is not None:
                    found.append(DeviceCopy(call, place, device.value))
        return found

    def device_copy_place(self, device: cst.BaseExpression) -> Place | None:
        """Where `.to(device)` copies to, for a `device` the value kinds cannot tell from a
        dtype: a name the training analysis follows to device strings (`DEVICE = get_device()`,
        a project function returning `"cuda"` or `"cpu"`), or an attribute named like a device
        (`cfg.train_device`); None when it is not a copy to an accelerator."""
        types = self.context.training.device_types(device)
        if types:
            return None if types == {"cpu"} else Place.CUDA if types == {"cuda"} else Place.UNKNOWN
        if isinstance(device, cst.Attribute) and DEVICE_NAME.match(device.attr.value):
            return Place.UNKNOWN
        return None

    def _copies_in_callee(self, call: cst.Call, bound: frozenset, region: cst.CSTNode, depth: int) -> list[DeviceCopy]:
        """The copies a function or method of this file makes of the parameters `call`
        passes (a part of) the batch to: `x = to_device(batch)`, `self.train_step(batch)`,
        `step(batch)` of `step = partial(train_step, model)`."""
        if depth >= 3:
            return []
        callee = self.kinds.local_callee(call) or self.kinds.partial_callee(call)
        if callee is None:
            return []
        offset = self.kinds.receiver_offset(call, callee)
        params = [*callee.params.posonly_params, *callee.params.params, *callee.params.kwonly_params]
        passed = frozenset(
            id(param)
            for param in params
            if (value := self.kinds.argument(call, callee, param, offset)) is not None
            and self.derives_from(value, bound, region, 0)
        )
        return self._copies_in(callee.body, passed, depth + 1) if passed else []

    @memoized
    def derives_from(self, expr: cst.BaseExpression, bound: frozenset, region: cst.CSTNode, depth: int) -> bool:
        """Is `expr` (a part of) what `bound` (ids of the names or parameters that bind the
        batch) holds, directly or through assignments and comprehensions in `region`?"""
        if depth > MAX_DEPTH:
            return False
        return any(
            id(root) in bound or (isinstance(root, cst.Name) and self._name_derives_from(root, bound, region, depth))
            for root in self._roots(expr)
        )

    def _roots(self, expr: cst.BaseExpression) -> list[cst.CSTNode]:
        """The names (or `next(it)` calls) whose value `expr` is (a part of)."""
        expr = self.kinds.storage_root(expr)
        if isinstance(expr, cst.Name) or (
            isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "next"
        ):
            return [expr]
        if isinstance(expr, (cst.Tuple, cst.List)):
            return [root for element in expr.elements for root in self._roots(element.value)]
        if isinstance(expr, cst.Call):
            copy = self.kinds.copy_of(expr)
            if method_name(expr) in ("items", "values") or (copy is not None and not copy.moves_device):
                return self._roots(expr.func.value)  # the batch's values, or its data in another dtype
            if self.names.is_(expr.func, *ZIP, *ENUMERATE, "list", "builtins.list", "tuple", "builtins.tuple"):
                return [root for arg in expr.args for root in self._roots(arg.value)]
            return self._roots_through_call(expr)
        return []

    def _roots_through_call(self, call: cst.Call) -> list[cst.CSTNode]:
        """The roots of the arguments a function of this file returns (a part of):
        `extract(batch)` where `def extract(b): return b["x"]`."""
        callee = self.kinds.local_callee(call)
        if callee is None:
            return self._roots_through_project(call)
        offset = self.kinds.receiver_offset(call, callee)
        params = {
            param.name.value: param
            for param in (*callee.params.posonly_params, *callee.params.params, *callee.params.kwonly_params)
        }
        roots = []
        values = list(self.kinds.returned(callee))
        while any(isinstance(v, cst.IfExp) for v in values):
            values = [part for v in values for part in ((v.body, v.orelse) if isinstance(v, cst.IfExp) else (v,))]
        for value in values:
            root = self.kinds.storage_root(value)
            param = params.get(root.value) if isinstance(root, cst.Name) else None
            if param is not None and self.bindings.param_of(root) is not None:
                argument = self.kinds.argument(call, callee, param, offset)
                if argument is not None:
                    roots.extend(self._roots(argument))
        return roots

    def _roots_through_project(self, call: cst.Call) -> list[cst.CSTNode]:
        """The roots of the argument a function of another module of the project returns (a
        part of): `extract(next(it))` where `extract` returns an item of its argument."""
        project = project_of(self.context)
        if not project.imports_project():
            return []
        function = project.called(call)
        through = project.passes_through(function) if function is not None else None
        argument = project.argument(call, function, through.param) if through is not None else None
        return self._roots(argument) if argument is not None else []

    def _name_derives_from(self, name: cst.Name, bound: frozenset, region: cst.CSTNode, depth: int) -> bool:
        for assignment in self.bindings.assignments(name) or ():
            if id(assignment.node) in bound:
                return True
            statement = self.bindings.statement(assignment.node)
            if not self.index.inside(statement, region):
                continue
            if isinstance(statement, (cst.Assign, cst.AnnAssign)) and statement.value is not None:
                source = statement.value
            elif isinstance(statement, (cst.CompFor, cst.For)):
                source = statement.iter
            else:
                continue
            if self.derives_from(source, bound, region, depth + 1):
                return True
        return False

    @functools.cached_property
    def device_copies(self) -> dict[int, list[DeviceCopy]]:
        """id of a loader -> the copies to a device its batches get in the loops it feeds."""
        found: dict[int, list[DeviceCopy]] = {}
        for feed in self.feeds:
            copies = self.copies_to_device(feed.loop, feed.target)
            if copies:
                found.setdefault(id(feed.loader), []).extend(copies)
        return found

    def pinnable(self, loader: cst.Call) -> bool:
        """Should, and can, the loader get `pin_memory` (PM102's fix): its batches go to a
        device, it does not choose pin_memory (in its call or its visible `**kwargs` dict),
        and pinning is possible (host data, a collate_fn seen to stay on the host, no
        subclass that overrides `__init__` / `__iter__`, no `*args`)?"""
        if not self.device_copies.get(id(loader)) or kwarg(loader, "pin_memory") is not None:
            return False
        if self.is_torch_loader(loader) and positional(loader, PIN_MEMORY_POSITION) is not None:
            return False
        if self.overridden_subclass(loader) or any(arg.star == "*" for arg in loader.args):
            return False
        if self.may_hold_device_data(self.dataset(loader), 0) or self.collate_place(loader) is not Place.HOST:
            return False
        stars = [arg for arg in loader.args if arg.star == "**"]
        if stars:
            found = self.kwargs_literal(stars[0].value) if len(stars) == 1 else None
            return found is not None and not found[2] and "pin_memory" not in found[1]
        return True

    # -- the data -------------------------------------------------------------------------

    def subclass_overrides(self, classdef: cst.ClassDef | None) -> bool:
        """Does a DataLoader subclass of this file (or a local base of it) define its own
        `__init__` (arguments unknown) or `__iter__` (batches unknown)?"""
        seen = 0
        while classdef is not None and seen < MAX_DEPTH:
            for statement in classdef.body.body:
                if isinstance(statement, cst.FunctionDef) and statement.name.value in ("__init__", "__iter__"):
                    return True
            bases = [self.kinds.local_class(base.value) for base in classdef.bases]
            classdef = next((base for base in bases if base is not None), None)
            seen += 1
        return False

    def passes_option(self, loader: cst.Call, names: tuple[str, ...], position: int) -> bool:
        """Is one of the keywords `names` given to `loader`, by name, at its place among
        torch DataLoader's positional parameters, or perhaps through `*args` / `**kwargs`?"""
        return (
            any(kwarg(loader, name) is not None for name in names)
            or any(arg.star for arg in loader.args)
            or (self.is_torch_loader(loader) and positional(loader, position) is not None)
        )

    def may_not_batch_on_host(self, loader: cst.Call) -> bool:
        """Might `loader` hand out batches that are not host tensors of its dataset: a
        subclass that overrides iteration, device data in its dataset, or a collate_fn
        that moves batches to a device?"""
        return (
            self.overridden_subclass(loader)
            or self.may_hold_device_data(self.dataset(loader), 0)
            or self.collate_moves_to_device(loader)
        )

    def overridden_subclass(self, loader: cst.Call) -> bool:
        """Is `loader` built from a subclass of this file that overrides `__init__` or `__iter__`?"""
        return not self.is_torch_loader(loader) and self.subclass_overrides(
            self.kinds.local_class(class_of_call(loader))
        )

    @memoized
    def may_hold_device_data(self, expr: cst.BaseExpression | None, depth: int) -> bool:
        """Could the dataset `expr` yield CUDA tensors, which pinning cannot take?"""
        if expr is None or depth > MAX_DEPTH:
            return False
        fact = self.kinds.fact(expr)
        if fact.kind in (Kind.TENSOR, Kind.DATASET, Kind.BATCH) and fact.place is not Place.HOST:
            return True
        if isinstance(expr, cst.Name):
            # A value unpacked from a tuple is judged by the whole tuple: cautious, and simple.
            return any(self.may_hold_device_data(source, depth + 1) for source, _ in self.bound_values(expr))
        if isinstance(expr, (cst.Tuple, cst.List)):
            return any(self.may_hold_device_data(e.value, depth + 1) for e in expr.elements)
        if isinstance(expr, cst.Call):
            if (
                self.names.is_(expr.func, "torch.load")
                and kwarg(expr, "map_location") is None
                and positional(expr, 1) is None
            ):
                return True
            classdef = self.kinds.local_class(expr.func)
            if classdef is not None and self.moves_to_device(classdef):
                return True
            return any(self.may_hold_device_data(a.value, depth + 1) for a in expr.args)
        return False

    @memoized
    def moves_to_device(self, node: cst.CSTNode) -> bool:
        """Does code under `node` copy to a device, or make tensors on one?"""
        for call in self.index.find(cst.Call, within=node):
            method = method_name(call)
            if method == "cuda":
                return True
            if method == "to":
                copy = self.kinds.copy_of(call)
                if copy is None or (copy.moves_device and copy.target is not Place.HOST):
                    return True
            device = kwarg(call, "device")
            if device is not None and self.kinds.device_place(device.value) is not Place.HOST:
                return True
        return False

    def collate(self, loader: cst.Call) -> cst.BaseExpression | None:
        """The `collate_fn` the loader is built with, if any."""
        arg = kwarg(loader, "collate_fn") or (
            positional(loader, COLLATE_FN_POSITION) if self.is_torch_loader(loader) else None
        )
        return arg.value if arg is not None else None

    @memoized
    def collates_tensors(self, collate: cst.BaseExpression, depth: int) -> bool:
        """Does the collate function `collate` build batches of tensors only (tensors, and
        tuples, lists and dicts of them)? torch's and Hugging Face's collators, and functions
        of this file that return such values."""
        if depth > MAX_DEPTH:
            return False
        if isinstance(collate, cst.Call):
            if self.names.is_(collate.func, "functools.partial"):
                first = positional(collate, 0)
                return first is not None and self.collates_tensors(first.value, depth + 1)
            collate_class = collate.func  # an instance: `DataCollatorWithPadding(tokenizer)`, `PadCollate(0)`
            return self._is_tensor_collate(collate_class)
        if self._is_tensor_collate(collate):
            return True
        if isinstance(collate, cst.Name):
            function = self.local_function(collate)
            if function is not None:
                returned = self.kinds.returned(function)
                return bool(returned) and all(self._is_tensors(value, 0) for value in returned)
            values = self.bound_values(collate)
            return bool(values) and all(self.collates_tensors(value, depth + 1) for value, _ in values)
        return False

    def _is_tensor_collate(self, expr: cst.BaseExpression) -> bool:
        for name in self.names.of(expr):
            last = name.rsplit(".", 1)[-1]
            if name in TENSOR_COLLATES or (name.startswith("transformers.") and last.startswith("DataCollator")):
                return True
        return False

    def _is_tensors(self, expr: cst.BaseExpression, depth: int) -> bool:
        """Is `expr` a tensor, or a tuple, list or dict of tensors?"""
        if depth > MAX_DEPTH:
            return False
        if isinstance(expr, (cst.Tuple, cst.List)):
            return bool(expr.elements) and all(
                not isinstance(e, cst.StarredElement) and self._is_tensors(e.value, depth + 1) for e in expr.elements
            )
        if isinstance(expr, cst.Dict):
            return bool(expr.elements) and all(
                isinstance(e, cst.DictElement) and self._is_tensors(e.value, depth + 1) for e in expr.elements
            )
        if isinstance(expr, cst.Call) and any(_in_namespace(name) for name in self.names.of(expr.func)):
            return True
        return self.kinds.fact(expr).kind in (Kind.TENSOR, Kind.BATCH)

    def collate_moves_to_device(self, loader: cst.Call) -> bool:
        """Does the loader's collate_fn put its batches on a device (or may it, to a device
        perfmod cannot tell)?"""
        place = self.collate_place(loader)
        return place is not None and place is not Place.HOST

    def collate_unread(self, loader: cst.Call) -> bool:
        """Is the loader given a collate_fn whose batches' place perfmod cannot read?"""
        return self.collate_place(loader) is None

    @memoized
    def collate_place(self, loader: cst.Call) -> Place | None:
        """Where the loader's batches are once collated: HOST without a collate_fn (torch's
        default collate), from torch's and Hugging Face's collators, and from a function (of
        this file or of the project, a lambda, a `functools.partial` of one) that makes no
        tensor on a device when the loader calls it with a batch alone, its other parameters
        at their defaults or bound by the partial; CUDA, or UNKNOWN (a device it cannot
        tell), when it moves them; None when the collate_fn cannot be read."""
        collate = self.collate(loader)
        return Place.HOST if collate is None else self._collate_place(collate, None, 0)

    def _collate_place(self, collate: cst.BaseExpression, bound: cst.Call | None, depth: int) -> Place | None:
        """`bound`: the call of `collate` with the arguments a `functools.partial` binds."""
        if depth > MAX_DEPTH:
            return None
        if is_none(collate) or self.names.is_(collate, *DEFAULT_COLLATES) or self._is_tensor_collate(collate):
            return Place.HOST
        if isinstance(collate, cst.Lambda):
            return Place.UNKNOWN if self.moves_to_device(collate.body) else Place.HOST
        if isinstance(collate, cst.Call):
            wrapped = self.kinds.partial_of(collate)
            if wrapped is not None:
                function, (made, *outer) = wrapped
                if outer or bound is not None:
                    return None  # a partial of a partial: the arguments of both are not joined
                return self._collate_place(function, made.with_changes(func=function, args=made.args[1:]), depth + 1)
            if self._is_tensor_collate(collate.func):  # an instance: `DataCollatorWithPadding(tokenizer)`
                return Place.HOST
            classdef = self.kinds.local_class(collate.func)  # an instance of a class of this file
            if classdef is None:
                return None
            return Place.UNKNOWN if self.moves_to_device(classdef) else Place.HOST
        function = self.local_function(collate)
        if function is not None:
            return self.called_place(function, bound, self)
        classdef = self.kinds.local_class(collate)  # `collate_fn=Batch`: the loader runs its `__init__`
        if classdef is not None:
            init = methods_of(classdef).get("__init__")
            return self.called_place(init, bound, self) if init is not None else Place.HOST
        project = project_of(self.context)
        found = project.function(collate) if project.imports_project() else None
        if found is not None:
            return found.context.loaders.called_place(found.node, bound, self)
        if isinstance(collate, cst.Name):
            values = self.bound_values(collate)
        else:  # `self.data_collator`: what the object's methods assign to it
            values = self.attribute_values(collate) if isinstance(collate, cst.Attribute) else []
        if not values or any(path for _, path in values):
            return None
        places = [self._collate_place(value, bound, depth + 1) for value, _ in values]
        return None if None in places else functools.reduce(Place.join, places)

    def called_place(self, function: cst.FunctionDef, bound: cst.Call | None, caller: Loaders) -> Place:
        """Where the tensors `function` copies or makes on a device land when it is called
        with `bound`'s arguments (read in `caller`'s file; None: none) and one more, the
        batch: HOST when none goes to a device."""
        moved = []
        for call in self.index.find(cst.Call, within=function):
            if method_name(call) == "cuda":
                moved.append(Place.CUDA)
                continue
            device = kwarg(call, "device")
            if method_name(call) == "to":
                copy = self.kinds.copy_of(call)
                if copy is None:
                    moved.append(Place.UNKNOWN)
                    continue
                if not copy.moves_device:
                    continue
                device = device or positional(call, 0)
                place = self._parameter_place(device.value, function, bound, caller) if device else None
                moved.append(copy.target if place is None else place)
            elif device is not None:
                place = self._parameter_place(device.value, function, bound, caller)
                moved.append(self.kinds.device_place(device.value) if place is None else place)
        moved = [place for place in moved if place is not Place.HOST]
        return functools.reduce(Place.join, moved) if moved else Place.HOST

    def _parameter_place(
        self, device: cst.BaseExpression, function: cst.FunctionDef, bound: cst.Call | None, caller: Loaders
    ) -> Place | None:
        """The place a device parameter of `function` names in a call with `bound`'s
        arguments: the one bound, else its default; None when `device` is not one."""
        parameter = self.bindings.param_of(device) if isinstance(device, cst.Name) else None
        if parameter is None or parameter[0] is not function:
            return None
        argument = argument_for(bound, function, parameter[1]) if bound is not None else None
        if argument is not None:
            return caller.kinds.device_place(argument)
        if bound is not None and any(arg.star for arg in bound.args):
            return Place.UNKNOWN
        default = parameter[1].default
        return self.kinds.device_place(default) if default is not None else Place.UNKNOWN

    # -- datasets: their style, and what an item costs ------------------------------------------

    @memoized
    def dataset_style(self, dataset: cst.BaseExpression | None, path: tuple[int, ...], depth: int) -> str:
        """ "map" (indexed by the sampler), "sharded" (an IterableDataset that splits its items
        among workers), "unsharded" (one that does not) or "unknown"; `path` indexes into the
        tuple `dataset` evaluates to (`train_set, val_set = ...` takes element 0 or 1)."""
        if dataset is None or depth > MAX_DEPTH:
            return UNKNOWN
        if isinstance(dataset, (cst.List, cst.Tuple)) and path:
            if path[0] >= len(dataset.elements) or any(isinstance(e, cst.StarredElement) for e in dataset.elements):
                return UNKNOWN
            return self.dataset_style(dataset.elements[path[0]].value, path[1:], depth + 1)
        if isinstance(dataset, (cst.Name, cst.Attribute)):
            sources = self.bound_values(dataset) if isinstance(dataset, cst.Name) else self.attribute_values(dataset)
            styles = {self.dataset_style(source, inner + path, depth + 1) for source, inner in sources}
            return styles.pop() if len(styles) == 1 else UNKNOWN
        if isinstance(dataset, (cst.List, cst.Tuple, cst.ListComp)):
            return "map"  # a sequence of samples
        if not isinstance(dataset, cst.Call):
            return UNKNOWN
        if self.names.is_(dataset.func, *SPLIT_DATASETS):
            return "map"  # Subsets, whichever is taken
        function = self.bindings.local_function(dataset.func)
        if function is not None:  # a helper of this file that builds and returns the dataset
            styles = {self.dataset_style(value, path, depth + 1) for value in self.kinds.returned(function)}
            return styles.pop() if len(styles) == 1 else UNKNOWN
        if path:
            return UNKNOWN
        if self.names.is_(dataset.func, *MAP_STYLE_DATASETS) or self.names.startswith(dataset.func, MAP_STYLE_PREFIXES):
            return "map"
        classdef = self.kinds.local_class(dataset.func)
        return self._class_style(classdef, 0) if classdef is not None else UNKNOWN

    def _class_style(self, classdef: cst.ClassDef, depth: int) -> str:
        """The style of instances of a dataset class of this file: its own `__iter__` /
        `__getitem__`, else its bases'."""
        methods = methods_of(classdef)
        iterable = any(self.names.is_(base.value, ITERABLE_DATASET) for base in classdef.bases)
        if "__iter__" in methods and (iterable or "__getitem__" not in methods):
            shards = any(
                self.names.is_(call.func, *GET_WORKER_INFO)
                for call in self.index.find(cst.Call, within=methods["__iter__"])
            )
            return "sharded" if shards else "unsharded"
        if "__getitem__" in methods:
            return "map"
        if iterable or depth > MAX_DEPTH:
            return "unsharded" if iterable else UNKNOWN  # an IterableDataset without its own __iter__ raises
        for base in classdef.bases:
            local = self.kinds.local_class(base.value)
            if local is not None:
                return self._class_style(local, depth + 1)
        return UNKNOWN

    @memoized
    def item_cost(self, dataset: cst.BaseExpression | None, path: tuple[int, ...], depth: int) -> str:
        """What loading one item of `dataset` takes: INDEXES when every item is an index into
        tensors the training process already holds (torch's `TensorDataset`; subsets,
        concatenations and splits of such datasets; a dataset class of this file whose
        `__getitem__` only indexes or slices tensors, lists or a pandas table it was given or
        built when it was made, converts them or makes tensors of them, and draws a random
        index; read in its module for a class of another module of the project), COMPUTES
        when `__getitem__` does work per item (calls anything else: a decoder, a tokenizer,
        a file read, a transform, torch math; or loops), else UNKNOWN. `path` as for
        `dataset_style`."""
        if dataset is None or depth > MAX_DEPTH:
            return UNKNOWN
        if isinstance(dataset, (cst.List, cst.Tuple)) and path:
            if path[0] >= len(dataset.elements) or any(isinstance(e, cst.StarredElement) for e in dataset.elements):
                return UNKNOWN
            return self.item_cost(dataset.elements[path[0]].value, path[1:], depth + 1)
        if isinstance(dataset, (cst.Name, cst.Attribute)):
            sources = self.bound_values(dataset) if isinstance(dataset, cst.Name) else self.attribute_values(dataset)
            # `None` is no dataset a loader could iterate: `data = None`, then `if data is None: data = ...`
            sources = [(source, inner) for source, inner in sources if not is_none(source)] or sources
            return _joined(self.item_cost(source, inner + path, depth + 1) for source, inner in sources)
        if not isinstance(dataset, cst.Call):
            return UNKNOWN
        if self.names.is_(dataset.func, *SPLIT_DATASETS):  # `train, val = random_split(data, ...)`
            first = kwarg(dataset, "dataset") or positional(dataset, 0)
            return self.item_cost(first.value, (), depth + 1) if first is not None else UNKNOWN
        function = self.bindings.local_function(dataset.func)
        if function is not None:
            return _joined(self.item_cost(value, path, depth + 1) for value in self.kinds.returned(function))
        if path:
            return UNKNOWN
        if self.names.is_(dataset.func, *TENSOR_ROW_DATASETS):
            return INDEXES
        if self.names.is_(dataset.func, *DATASETS_OF_DATASETS):
            parts: list[cst.BaseExpression] = []
            for arg in dataset.args:
                if arg.star:
                    return UNKNOWN
                if isinstance(arg.value, (cst.List, cst.Tuple)):  # ConcatDataset([a, b])
                    parts.extend(e.value for e in arg.value.elements)
                elif arg.keyword is None or arg.keyword.value != "indices":
                    parts.append(arg.value)
                if self.names.is_(dataset.func, "torch.utils.data.Subset"):
                    break  # its indices are not a dataset
            return _joined(self.item_cost(part, (), depth + 1) for part in parts)
        classdef = self.kinds.local_class(dataset.func)
        if classdef is not None:
            return self._class_cost(classdef, dataset, depth, self)
        project = project_of(self.context)
        found = project.class_of(dataset.func) if project.imports_project() else None
        if found is None:
            return UNKNOWN
        there, classdef = found  # read in its module; what this file passes to it, here
        return there.loaders._class_cost(classdef, dataset, depth, self)

    def dataset_changed_in(self, dataset: cst.BaseExpression | None, loop: cst.CSTNode) -> cst.CSTNode | None:
        """A call of a method of the dataset (`dataset.set_epoch(epoch)`) or an assignment to
        one of its attributes in the loop the batches feed or a loop around it: the change
        happens in the training process, after worker processes took their copy."""
        if not isinstance(dataset, cst.Name):
            return None
        outer = [node for node in (loop, *self.index.ancestors(loop)) if isinstance(node, LOOPS)]
        for region in outer[-1:]:  # the outermost loop holds every inner one
            for node in self.index.find((cst.Call, cst.AssignTarget, cst.AugAssign), within=region):
                target = node.func if isinstance(node, cst.Call) else node.target
                while isinstance(target, (cst.Attribute, cst.Subscript)):
                    owner = target.value
                    if isinstance(owner, cst.Name) and owner.value == dataset.value:
                        return node
                    if isinstance(owner, cst.Attribute) and owner.attr.value == "dataset":
                        return node
                    target = owner
        return None

    @memoized
    def holds_unpicklable(self, expr: cst.CSTNode, depth: int) -> bool:
        """Does `expr` (a loader or dataset expression) hold a lambda or a function or class
        defined inside a function, directly or in a variable passed as an argument? Pickle
        finds functions and classes by their module-level name, which those have not: worker
        processes started by spawn cannot receive them."""
        if depth > MAX_DEPTH:
            return True  # too deep to tell: assume it might
        if self.index.find(cst.Lambda, within=expr):
            return True
        for name in self.index.find(cst.Name, within=expr):
            local = self.bindings.local_function(name) or self.kinds.local_class(name)
            if local is not None and self.index.first_enclosing(local, (cst.FunctionDef, cst.ClassDef)) is not None:
                return True
        if isinstance(expr, cst.Name):
            return any(self.holds_unpicklable(source, depth + 1) for source, _ in self.bound_values(expr))
        if isinstance(expr, cst.Call):  # `collate_fn=collate` where `collate = lambda ...`
            return any(
                self.holds_unpicklable(arg.value, depth + 1) for arg in expr.args if isinstance(arg.value, cst.Name)
            )
        return False

    @memoized
    def generator_draw(self, dataset: cst.BaseExpression | None, depth: int) -> cst.Call | None:
        """A draw, in a method of the dataset's class other than `__init__`, from a generator
        object the dataset holds (`torch.randn(shape, generator=self.gen)`): every worker
        process gets a copy of that generator in the same state, so the workers would draw
        the same numbers."""
        if dataset is None or depth > MAX_DEPTH:
            return None
        if isinstance(dataset, (cst.Name, cst.Attribute)):
            sources = self.bound_values(dataset) if isinstance(dataset, cst.Name) else self.attribute_values(dataset)
            return self._first_generator_draw((source for source, _ in sources), depth)
        if not isinstance(dataset, cst.Call):
            return None
        function = self.bindings.local_function(dataset.func)
        if function is not None:
            return self._first_generator_draw(self.kinds.returned(function), depth)
        if self.names.is_(dataset.func, *SPLIT_DATASETS, *DATASETS_OF_DATASETS):
            return self._first_generator_draw(_dataset_parts(dataset), depth)
        classdef = self.kinds.local_class(dataset.func)
        return self._held_generator_draw(classdef) if classdef is not None else None

    def _first_generator_draw(self, datasets, depth: int) -> cst.Call | None:
        """The first `generator_draw` of `datasets` (what a dataset is built from)."""
        draws = (self.generator_draw(dataset, depth + 1) for dataset in datasets)
        return next((draw for draw in draws if draw is not None), None)

    def _held_generator_draw(self, classdef: cst.ClassDef) -> cst.Call | None:
        """A draw, in a method of `classdef` other than `__init__`, from a generator held by
        the instance (`generator=self.gen`)."""
        for call in self.index.find(cst.Call, within=classdef):
            arg = kwarg(call, "generator")
            if arg is None or not (isinstance(arg.value, cst.Attribute) and isinstance(arg.value.value, cst.Name)):
                continue
            method = self.index.first_enclosing(call, cst.FunctionDef)
            if method is not None and method.name.value != "__init__" and _first_param_is(method, arg.value.value):
                return call
        return None

    def rows_of_tensors(self, dataset: cst.BaseExpression | None) -> bool:
        """Is `dataset` torch's `TensorDataset` (every binding of the name, if a name), whose
        `__getitem__` takes a list of indices as well as one?"""
        if isinstance(dataset, cst.Name):
            values = self.bound_values(dataset)
            return bool(values) and all(not path and self.rows_of_tensors(value) for value, path in values)
        return isinstance(dataset, cst.Call) and self.names.is_(dataset.func, *TENSOR_ROW_DATASETS)

    def batch_cost(self, loader: cst.Call) -> str:
        """What building one batch of `loader` takes, in whichever process loads it: its
        dataset's `item_cost`, or COMPUTES when it is given a `collate_fn` other than torch's
        stacking one (padding, masking, tokenizing a batch is work a worker takes off)."""
        collate = self.collate(loader)
        if collate is not None and not (
            self.names.is_(collate, *DEFAULT_COLLATES) or isinstance(collate, cst.Name) and collate.value == "None"
        ):
            return COMPUTES
        return self.item_cost(self.dataset(loader), (), 0)

    def _class_cost(self, classdef: cst.ClassDef, call: cst.Call, depth: int, caller: Loaders) -> str:
        """`item_cost` of `call`, an instance of the dataset class `classdef` of this file,
        made in `caller`'s file (this one, or a module that imports the class)."""
        getitem, owner = None, classdef
        while owner is not None and depth <= MAX_DEPTH:
            methods = methods_of(owner)
            if "__iter__" in methods or "__getitems__" in methods:
                return UNKNOWN  # loads otherwise than item by item
            if "__getitem__" in methods:
                getitem = methods["__getitem__"]
                break
            bases = [self.kinds.local_class(base.value) for base in owner.bases]
            owner, depth = next((base for base in bases if base is not None), None), depth + 1
        if getitem is None or not getitem.params.params:
            return UNKNOWN
        if self.index.find((cst.For, cst.While, *COMPREHENSIONS, cst.With), within=getitem.body):
            return COMPUTES  # a Python loop per item (or a file opened)
        for inner in self.index.find(cst.Call, within=getitem.body):
            if not self._indexing_call(inner):
                return COMPUTES
        me = getitem.params.params[0].name.value
        for subscript in self.index.find(cst.Subscript, within=getitem.body):
            value = subscript.value
            if isinstance(value, cst.Subscript):
                continue  # its root is checked
            if isinstance(value, cst.Attribute) and value.attr.value in TABLE_INDEXERS:
                value = value.value  # `self.frame.iloc[i]`: the table is the root
            if isinstance(value, cst.Name):
                continue  # a local value, computed by the calls above, or a parameter
            if not (isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and value.value.value == me):
                return UNKNOWN
            values = self.kinds.attribute_values(value)
            values = [held for held in values if not is_none(held)] or values  # indexing None raises: not read
            if not values or not all(self._held_in_memory(held, classdef, call, depth + 1, caller) for held in values):
                return UNKNOWN
        return INDEXES

    def _indexing_call(self, call: cst.Call) -> bool:
        """Is `call` one a `__getitem__` that only indexes may make: a tensor method that reads
        a size or converts what was indexed, a tensor made of it or of sizes
        (`torch.tensor(row)`, `torch.ones(n)`), a builtin of index arithmetic, a random index?"""
        if any(arg.star for arg in call.args):
            return False
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in INDEXING_METHODS:
            receiver = func.value  # a value (`self.data[i].long()`, `torch.randint(...).item()`), not a module
            return (
                not isinstance(receiver, (cst.Name, cst.Attribute))
                or not self.names.of(receiver)
                or (self.names.local(receiver))
            )
        return bool(self.names.of(func) & (INDEX_BUILTINS | INDEX_DRAWS | ITEM_FACTORIES))

    def _held_in_memory(
        self, value: cst.BaseExpression, classdef: cst.ClassDef, call: cst.Call, depth: int, caller: Loaders
    ) -> bool:
        """Is `value`, assigned to an attribute by a method of `classdef`, a tensor (or a list
        of values, or a pandas table read whole) held in memory? A parameter of `__init__` is
        what `call` passes to it, read in `caller`'s file."""
        if depth > MAX_DEPTH:
            return False
        if isinstance(value, cst.Name):
            parameter = self.bindings.param_of(value)
            if parameter is not None:
                function, param = parameter
                if function.name.value != "__init__" or self.kinds.class_of(function) is not classdef:
                    return False
                passed = argument_for(call, function, param, 1)
                return passed is not None and caller._held_in_memory(passed, classdef, call, depth + 1, caller)
        if self.kinds.in_memory_list(value):
            return True
        if isinstance(value, cst.Call) and self.names.of(value.func) & IN_MEMORY_TABLES:
            return True  # a table read whole: `pd.read_csv(path)`
        fact = self.kinds.fact(value)
        return fact.kind is Kind.TENSOR and fact.place is Place.HOST

    # -- batches cut by hand ------------------------------------------------------------------

    @memoized
    def batch_windows(self, loop: cst.For) -> tuple[BatchWindow, ...]:
        """The windows of a loop over a counter that cut one batch per iteration:
        `seq[step * bs:(step + 1) * bs]` for `for step in range(...)`, and `seq[i:i + bs]`
        for `for i in range(0, n, bs)` (through enumerate, zip, tqdm)."""
        counters = [
            (iterable, target)
            for iterable, target in self.iterated(loop.iter, loop.target)
            if isinstance(iterable, cst.Call)
            and self.names.is_(iterable.func, *RANGE)
            and isinstance(target, cst.Name)
            and not any(a.keyword is not None or a.star for a in iterable.args)
        ]
        if len(counters) != 1:
            return ()
        counter, target = counters[0]
        stride = counter.args[2].value if len(counter.args) == 3 else None
        found = []
        for subscript in own_nodes(self.index, cst.Subscript, loop.body):
            if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Slice):
                continue
            part = subscript.slice[0].slice
            if part.lower is None or part.upper is None or part.step is not None:
                continue
            width = _window_width(part.lower, part.upper, target.value, stride)
            if width is not None:
                found.append(BatchWindow(subscript, subscript.value, width))
        return tuple(found)

    @functools.cached_property
    def list_batches(self) -> tuple[ListBatch, ...]:
        """The batches of the step loops that are cut from a permutation of a Python list
        held in memory and looked up item by item: `perm = torch.randperm(N)`, `idx =
        perm[step * bs:(step + 1) * bs]`, `batch = [texts[i] for i in idx.tolist()]`."""
        if not any(word in self.context.code for word in ("randperm", "permutation")):
            return ()
        found = []
        for loop in self.context.loops.step_loops:
            if not isinstance(loop, cst.For):
                continue
            for window in self.batch_windows(loop):
                permutation = self._permutation_call(window.sequence)
                if permutation is None:
                    continue
                for picks, corpus in self._picks(loop, window):
                    batch = _bound_name(picks, self.context.parents)
                    found.append(
                        ListBatch(
                            loop,
                            window,
                            permutation,
                            corpus,
                            picks,
                            batch,
                            per_epoch=any(
                                self.index.inside(permutation, outer) for outer in self.context.loops.epoch_loops(loop)
                            ),
                            work=self._item_work(loop, batch) if batch is not None else (),
                            other_reads=self._index_reads(loop, window, picks),
                        )
                    )
        return tuple(found)

    def _permutation_call(self, expr: cst.BaseExpression) -> cst.Call | None:
        """The `torch.randperm(n)` (or `np.random.permutation(n)`) every binding of the name
        `expr` gives."""
        if not isinstance(expr, cst.Name):
            return None
        values = self.bindings.values(expr) or []
        calls = [v for v in values if isinstance(v, cst.Call) and self.names.is_(v.func, *PERMUTATIONS)]
        return calls[0] if len(calls) == 1 and len(values) == 1 else None

    def _picks(self, loop: cst.For, window: BatchWindow) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
        """(comprehension, list) for each `[texts[i] for i in idx.tolist()]` of the loop body
        that looks up the items of a Python list held in memory at the indices the window
        gives (`idx = perm[...]`, or the window itself)."""
        indices: set[int] = {id(window.subscript)}
        holder = _bound_name(window.subscript, self.context.parents)
        if holder is not None:
            indices |= {
                id(read)
                for read in own_nodes(self.index, cst.Name, loop.body)
                if read.value == holder.value and read is not holder
            }
        found = []
        for comprehension in own_nodes(self.index, (cst.ListComp, cst.GeneratorExp), loop.body):
            fors = comprehension.for_in
            if fors.inner_for_in is not None or not isinstance(fors.target, cst.Name):
                continue
            source = fors.iter
            while isinstance(source, cst.Call) and (
                method_name(source) == "tolist" or self.names.is_(source.func, "list", "builtins.list")
            ):
                source = source.func.value if method_name(source) == "tolist" else source.args[0].value
            element = comprehension.elt
            if (
                id(source) in indices
                and isinstance(element, cst.Subscript)
                and len(element.slice) == 1
                and isinstance(element.slice[0].slice, cst.Index)
                and isinstance(element.slice[0].slice.value, cst.Name)
                and element.slice[0].slice.value.value == fors.target.value
                and self.kinds.in_memory_list(element.value)
            ):
                found.append((comprehension, element.value))
        return found

    def _index_reads(self, loop: cst.For, window: BatchWindow, picks: cst.CSTNode) -> tuple[cst.Name, ...]:
        """The reads of the name the window is bound to (`idx`) in the loop body, other than
        in the look-up `picks`."""
        holder = _bound_name(window.subscript, self.context.parents)
        if holder is None:
            return ()
        return tuple(
            read for read in names_read(loop.body) if read.value == holder.value and not self.index.inside(read, picks)
        )

    def _item_work(self, loop: cst.For, batch: cst.Name) -> tuple[cst.Call, ...]:
        """The calls the step loop makes on the items of its batch `batch`, or on what it
        computes from them in the loop (assignments, loops and comprehensions over them),
        other than the model's, torch's, Python's builtins and methods of the items
        themselves: the per-batch work a DataLoader's collate_fn could do (tokenizing,
        templating)."""
        derived = {batch.value}
        nodes = [
            node
            for node in own_nodes(self.index, (cst.Assign, cst.For, cst.CompFor), loop.body)
            if self.index.order(node) > self.index.order(batch)
        ]
        for _ in range(3):  # a comprehension's element comes before its `for`: until nothing is added
            before = len(derived)
            for node in nodes:
                source, targets = (
                    (node.value, [t.target for t in node.targets])
                    if isinstance(node, cst.Assign)
                    else (node.iter, [node.target])
                )
                if _reads(source, derived):
                    derived |= {name for target in targets for name in _target_names(target)}
            if len(derived) == before:
                break
        work = []
        for node in own_nodes(self.index, cst.Call, loop.body):
            if (
                self.index.order(node) > self.index.order(batch)
                and any(_reads(a.value, derived) for a in node.args)
                and not _reads(node.func, derived)
                and method_name(node) not in COLLECTING_METHODS
                and not self.names.startswith(node.func, ("torch", "builtins"))
                and not self._model_work(node)
            ):
                work.append(node)
        return tuple(work)

    def _model_work(self, call: cst.Call) -> bool:
        """Is `call` the model's computation: the model called, a function given the model,
        or a method of a module class of this file? (`model.tokenizer(...)`, an object the
        model holds, is not.)"""
        training = self.context.training
        if training.is_model(call.func) or any(training.is_model(arg.value) for arg in call.args):
            return True
        callee = self.kinds.local_callee(call)
        owner = self.kinds.class_of(callee) if callee is not None else None
        return owner is not None and self.kinds.class_fact(owner).kind is Kind.MODULE

    @functools.cached_property
    def training_batch_sizes(self) -> tuple[tuple[cst.BaseExpression, cst.CSTNode], ...]:
        """(the batch size, where it is given) of every batch a training loop takes: the
        `batch_size` of a DataLoader that feeds a loop that trains, and the width of the windows
        a step loop cuts its batches with (`perm[step * bs:(step + 1) * bs]`)."""
        found: list[tuple[cst.BaseExpression, cst.CSTNode]] = []
        seen: set[int] = set()
        for feed in self.feeds:
            if not isinstance(feed.loader, cst.Call) or id(feed.loader) in seen or not self.trains(feed.loop):
                continue  # a loader that is a parameter (`train_data: DataLoader`) is built elsewhere
            seen.add(id(feed.loader))
            size = kwarg(feed.loader, "batch_size") or positional(feed.loader, 1)
            if size is not None and kwarg(feed.loader, "batch_sampler") is None:
                found.append((size.value, feed.loader))
        for loop in self.context.loops.step_loops:
            if isinstance(loop, cst.For):
                found.extend((window.width, window.subscript) for window in self.batch_windows(loop))
        return tuple(found)

    def setting_option(self, expr: cst.BaseExpression, depth: int = 0) -> Option | None:
        """The argparse option whose `default=` a setting takes when the script runs as
        written: `args.batch_size`, or a name every binding of which is that."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.Attribute):
            return self.context.command_line.option(expr.attr.value) if self._parsed_arguments(expr.value) else None
        if isinstance(expr, cst.Name):
            values = [value for value, path in self.bound_values(expr) if not path]
            options = [self.setting_option(value, depth + 1) for value in values]
            if options and all(o is not None and o.call is options[0].call for o in options):
                return options[0]
        return None

    # -- settings -------------------------------------------------------------------------------

    @memoized
    def setting(self, expr: cst.BaseExpression, depth: int) -> cst.BaseExpression | None:
        """The literal a setting evaluates to when the script runs as written: `0`, a name
        bound to it, `args.workers` (the `default=` of its `add_argument`), `cfg["workers"]`
        (a dict literal), `cfg.workers` (a dataclass default, a SimpleNamespace keyword);
        None when it cannot be told."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)) or (
            isinstance(expr, cst.Name) and expr.value in ("True", "False", "None")
        ):
            return expr
        if isinstance(expr, cst.Name):
            values = [value for value, path in self.bound_values(expr) if not path]
            found = {
                self.context.source(v) for v in (self.setting(value, depth + 1) for value in values) if v is not None
            }
            if values and len(found) == 1 and all(self.setting(value, depth + 1) is not None for value in values):
                return self.setting(values[0], depth + 1)
            return None
        if isinstance(expr, cst.Attribute):
            option = self.context.command_line.option(expr.attr.value) if self._parsed_arguments(expr.value) else None
            default = option.default if option is not None else None
            if default is not None:
                return self.setting(default, depth + 1)
            values = self.kinds.attribute_values(expr) or []
            if len(values) == 1:
                return self.setting(values[0], depth + 1)
            owner = self.setting_owner(expr.value, depth + 1)
            if isinstance(owner, cst.Call):  # SimpleNamespace(workers=0)
                passed = kwarg(owner, expr.attr.value)
                return self.setting(passed.value, depth + 1) if passed is not None else None
            return None
        if isinstance(expr, cst.Subscript):
            entry = self._entry(expr, depth + 1)
            return self.setting(entry, depth + 1) if entry is not None else None
        return None

    def _entry(self, expr: cst.Subscript, depth: int) -> cst.BaseExpression | None:
        """The value a dict literal holds under the key of `cfg["key"]`."""
        if len(expr.slice) != 1 or not isinstance(expr.slice[0].slice, cst.Index):
            return None
        key = expr.slice[0].slice.value
        owner = self.setting_owner(expr.value, depth + 1)
        if isinstance(owner, cst.Dict) and isinstance(key, cst.SimpleString):
            for element in owner.elements:
                if (
                    isinstance(element, cst.DictElement)
                    and isinstance(element.key, cst.SimpleString)
                    and element.key.evaluated_value == key.evaluated_value
                ):
                    return element.value
        return None

    def setting_owner(self, expr: cst.BaseExpression, depth: int) -> cst.BaseExpression | None:
        """The dict literal or call a configuration object is built by."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, (cst.Dict, cst.Call)):
            return expr
        if isinstance(expr, cst.Subscript):
            entry = self._entry(expr, depth + 1)
            return self.setting_owner(entry, depth + 1) if entry is not None else None
        if isinstance(expr, cst.Name):
            values = [value for value, path in self.bound_values(expr) if not path]
            return self.setting_owner(values[0], depth + 1) if len(values) == 1 else None
        return None

    def _parsed_arguments(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` the namespace `parser.parse_args()` returns (directly, or through the
        parameters it is passed to)?"""
        if not isinstance(expr, cst.Name):
            return False
        values = [value for value, _ in self.bound_values(expr)]
        return bool(values) and all(
            self.context.command_line.parses(v) or (isinstance(v, cst.Name) and self._parsed_arguments(v))
            for v in values
        )

    # -- what a **kwargs dict holds ----------------------------------------------------------

    @memoized
    def kwargs_literal(
        self, expr: cst.BaseExpression, either: bool = False
    ) -> tuple[cst.CSTNode | None, set[str], bool] | None:
        """(the dict literal or `dict(...)` behind `**expr`, its keys, whether other code may
        add keys or see the dict), or None when there is no single literal to look at.
        A choice of literals (`{"pin_memory": True} if cuda else {}`) has the keys of
        either, and counts as seen by other code (no fix can add to both) unless `either`:
        then its keys are what one of the literals chosen may hold. A parameter's dict comes
        from the modules that import this file and pass it (`train(..., loader_kwargs)` in
        `main.py`): the keys any of them may hold, with no literal here to edit."""
        if not isinstance(expr, cst.Name):
            return None
        param = self.bindings.param_of(expr)
        if param is not None:
            return self._kwargs_from_importers(*param)
        assignments = self.bindings.assignments(expr)
        if assignments is None or len(assignments) != 1:
            return None
        literal = self.bindings.assigned_value(assignments[0])
        keys = self._literal_keys(literal)
        if keys is None:
            return None
        opaque = isinstance(literal, cst.IfExp) and not either
        for access in assignments[0].references:
            added = self._keys_added_by(access.node)
            if added is None:
                opaque = True
            else:
                keys |= added
        return literal, keys, opaque

    def _kwargs_from_importers(self, function: cst.FunctionDef, param: cst.Param) -> tuple[None, set[str], bool] | None:
        passed = project_of(self.context).importer_arguments(function, param)
        if passed is None:
            return None
        keys: set[str] = set()
        for context, value in passed:
            found = context.loaders.kwargs_literal(value, True)  # memoized: positional only
            if found is None:
                return None
            keys |= found[1]
        return None, keys, True

    def keywords_passed(self, loader: cst.Call, anchor: cst.CSTNode) -> set[str] | None:
        """The keywords `loader` passes, in its call and in its `**` dict (`anchor`, the
        literal, with the keys other code adds to it); None when they cannot all be seen."""
        if any(arg.star == "*" for arg in loader.args):
            return None
        found = {arg.keyword.value for arg in loader.args if arg.keyword is not None}
        stars = [arg for arg in loader.args if arg.star == "**"]
        if not stars:
            return found
        literal = self.kwargs_literal(stars[0].value) if len(stars) == 1 else None
        if literal is None or literal[2] or literal[0] is not anchor:
            return None
        return found | literal[1]

    def star_kwargs_keys(self, loader: cst.Call, either: bool = False) -> set[str] | None:
        """The keys of the one `**dict` the loader is built with, when they can all be seen;
        `either`: those of a choice of literals too (`{"pin_memory": True} if cuda else {}`),
        each key passed in one of the choices."""
        stars = [arg for arg in loader.args if arg.star]
        if len(stars) != 1 or stars[0].star != "**":
            return None
        found = self.kwargs_literal(stars[0].value, either)
        return found[1] if found is not None and not found[2] else None

    def _literal_keys(self, literal) -> set[str] | None:
        if isinstance(literal, cst.IfExp):
            chosen = [self._literal_keys(literal.body), self._literal_keys(literal.orelse)]
            return None if None in chosen else chosen[0] | chosen[1]
        if isinstance(literal, cst.Dict):
            keys = set()
            for element in literal.elements:
                if not (isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)):
                    return None
                keys.add(element.key.evaluated_value)
            return keys
        if isinstance(literal, cst.Call) and self.names.is_(literal.func, "dict", "builtins.dict"):
            if any(arg.keyword is None for arg in literal.args):
                return None
            return {arg.keyword.value for arg in literal.args}
        return None

    def _keys_added_by(self, use: cst.CSTNode) -> set[str] | None:
        """Keys a use of the kwargs dict adds (empty when it only reads it for a
        DataLoader); None when it may add unknown keys or hand the dict to other code."""
        parents = self.context.parents
        parent = parents.get(use)
        if isinstance(parent, cst.Arg) and parent.star == "**":
            call = parents.get(parent)
            return set() if isinstance(call, cst.Call) and self.is_construction(call) else None
        if isinstance(parent, cst.Attribute) and parent.value is use:
            call = parents.get(parent)
            if not (isinstance(call, cst.Call) and call.func is parent):
                return None
            if parent.attr.value == "update":
                keys: set[str] = set()
                for arg in call.args:
                    if arg.keyword is not None:
                        keys.add(arg.keyword.value)
                        continue
                    literal = arg.value
                    if isinstance(literal, cst.Name):
                        values = self.bindings.values(literal)
                        literal = values[0] if values and len(values) == 1 else None
                    found = self._literal_keys(literal)
                    if found is None:
                        return None
                    keys |= found
                return keys
            if parent.attr.value in ("setdefault", "get", "pop") and call.args:
                key = call.args[0].value
                if not isinstance(key, cst.SimpleString):
                    return None
                return {key.evaluated_value} if parent.attr.value == "setdefault" else set()
            return None
        if isinstance(parent, cst.Subscript) and parent.value is use:
            key = parent.slice[0].slice.value if isinstance(parent.slice[0].slice, cst.Index) else None
            if not isinstance(key, cst.SimpleString):
                return None
            written = isinstance(parents.get(parent), (cst.AssignTarget, cst.AugAssign))
            return {key.evaluated_value} if written else set()
        return None


def _window_width(
    lower: cst.BaseExpression, upper: cst.BaseExpression, counter: str, stride: cst.BaseExpression | None
) -> cst.BaseExpression | None:
    """`w` of the window `c * w:(c + 1) * w` of the counter `c`, or of `c:c + w` when the
    counter steps by `w`; None for any other slice."""
    if isinstance(lower, cst.BinaryOperation) and isinstance(lower.operator, cst.Multiply):
        width = lower.right if _is_name(lower.left, counter) else lower.left if _is_name(lower.right, counter) else None
        if width is None or not (isinstance(upper, cst.BinaryOperation) and isinstance(upper.operator, cst.Multiply)):
            return None
        for next_index, other in ((upper.left, upper.right), (upper.right, upper.left)):
            if (
                other.deep_equals(width)
                and isinstance(next_index, cst.BinaryOperation)
                and isinstance(next_index.operator, cst.Add)
                and {
                    "counter" if _is_name(side, counter) else number_value(side)
                    for side in (next_index.left, next_index.right)
                }
                == {"counter", 1}
            ):
                return width
        return None
    if _is_name(lower, counter) and isinstance(upper, cst.BinaryOperation) and isinstance(upper.operator, cst.Add):
        width = upper.right if _is_name(upper.left, counter) else upper.left if _is_name(upper.right, counter) else None
        return width if width is not None and stride is not None and stride.deep_equals(width) else None
    return None


def _is_name(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _bound_name(value: cst.CSTNode, parents) -> cst.Name | None:
    """`name` of a plain `name = value` statement."""
    statement = parents.get(value)
    if (
        isinstance(statement, cst.Assign)
        and statement.value is value
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Name)
    ):
        return statement.targets[0].target
    return None


def _reads(expr: cst.CSTNode, names: set[str]) -> bool:
    return any(name.value in names for name in names_read(expr))


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return {name for element in target.elements for name in _target_names(element.value)}
    return set()


def _in_namespace(name: str) -> bool:
    head, _, last = name.rpartition(".")
    return name in TENSOR_FUNCTIONS or (
        head in TENSOR_NAMESPACES and last[:1].islower() and name not in NOT_TENSOR_FUNCTIONS
    )


def _joined(costs) -> str:
    """The cost of a dataset that may be any of several: COMPUTES if one computes, INDEXES
    if all index, else UNKNOWN."""
    found = set(costs)
    if COMPUTES in found:
        return COMPUTES
    return INDEXES if found == {INDEXES} else UNKNOWN


def body(loop: cst.CSTNode) -> cst.CSTNode:
    """What runs on every iteration: a loop's body, a comprehension's element (all of it)."""
    return loop.body if isinstance(loop, LOOPS) else loop


def _is_tuple_of(target: cst.BaseExpression, length: int) -> bool:
    return (
        isinstance(target, (cst.Tuple, cst.List))
        and len(target.elements) == length
        and not any(isinstance(e, cst.StarredElement) for e in target.elements)
    )


def _dataset_parts(dataset: cst.Call) -> list[cst.BaseExpression]:
    """The datasets a split or a dataset of datasets is built from: the elements of its list
    and tuple arguments, then its other arguments."""
    listed = (arg.value for arg in dataset.args if isinstance(arg.value, (cst.List, cst.Tuple)))
    parts = [e.value for value in listed for e in value.elements]
    return parts + [arg.value for arg in dataset.args if not isinstance(arg.value, (cst.List, cst.Tuple))]


def _first_param_is(method: cst.FunctionDef, name: cst.Name) -> bool:
    """Is `name` the first parameter of `method` (its `self`)?"""
    return bool(method.params.params) and method.params.params[0].name.value == name.value


def _calling_function(module, call: cst.Call, function: cst.FunctionDef) -> tuple[str, Function]:
    """(name, function) of the code of `module` around `call` (which calls `function` of this
    file). Module code is named by its module; its sites then name the function it calls, so
    that a message says "copied by `pkg.train` (pkg/train.py:9)", not "reached through" it."""
    scope = module.context.index.first_enclosing(call, (cst.FunctionDef,))
    here = module.project.dotted(module.path)
    if scope is None:
        return function.name.value, Function(module, function, here)
    return scope.name.value, Function(module, scope, f"{here}.{scope.name.value}")


def _outranks(trains: bool, use: BatchUse | None) -> bool:
    """Does a loop (that `trains` or not) copying batches to a device tell more than `use`:
    there is none yet, it copies nothing, or only the loop trains?"""
    return use is None or use.copy is None or (trains and not use.trains)


def _all_params(function: cst.FunctionDef) -> list[cst.Param]:
    params = function.params
    return [*params.posonly_params, *params.params, *params.kwonly_params]


def class_of_call(call: cst.Call) -> cst.BaseExpression:
    """The class a call builds an instance of: `DataLoader` of `DataLoader(...)` and of the
    subscripted generic `DataLoader[Dataset](...)`."""
    func = call.func
    while isinstance(func, cst.Subscript):
        func = func.value
    return func


def _last_name(func: cst.BaseExpression) -> str | None:
    while isinstance(func, cst.Subscript):
        func = func.value
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def _repacked(value: cst.BaseExpression, target: cst.BaseExpression) -> bool:
    """Is `value` what the loop target `target` bound, as it was: the same name, or a tuple
    or list of the same names in the same places (`for x, y in dl: yield x, y`)?"""
    if isinstance(value, cst.Name) and isinstance(target, cst.Name):
        return value.value == target.value
    if isinstance(value, (cst.Tuple, cst.List)) and isinstance(target, (cst.Tuple, cst.List)):
        return len(value.elements) == len(target.elements) and all(
            not isinstance(v, cst.StarredElement)
            and not isinstance(t, cst.StarredElement)
            and _repacked(v.value, t.value)
            for v, t in zip(value.elements, target.elements)
        )
    return False

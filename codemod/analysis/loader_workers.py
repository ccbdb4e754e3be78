"""Whether a DataLoader that feeds a training loop may load its batches in worker
processes, where its worker count is written, and what stops it from getting workers.
The one place that answers it for the loaders a file builds, the loaders another module
of the project builds for this file's loops, and the loaders this file hands to a
project function that trains on them.

`loader_workers(context)` (built once per file, FileContext.shared) answers:

- `training_feeds()`: (loader, the first training loop of the file it feeds) for every
  loader, built here or by another module, that a training loop iterates over;
- `handoffs(feeds)`: the `Handoff`s to report: loaders that this file passes to a project
  function whose loop trains on them, whose worker count is not chosen (also not through
  `*args` / `**kwargs`) and that batch on the host, each once, with the loaders of the
  module that builds it (`there`);
- `chosen_elsewhere(loader, function)`: for a loader built by a project `function`: its
  worker count is chosen there, it may not batch on the host, or it is reported there;
- `count(loader)`: the `Count` the loader's worker count is written as (nothing, an
  explicit 0, a `**kwargs` dict literal), or None when the loader loads where it must or
  as it is told (another worker option is set, a count that is not 0, a subclass that
  overrides loading, a dataset or collate function that holds device tensors);
- `blocker(loader, count, loop)`: the first reason, as a `Blocker`, why worker
  processes would not load the same batches or would not be faster (the count stays as
  written, the dataset only indexes tensors in memory, `*args` may pass the count, the
  loop changes the dataset, an IterableDataset that does not shard or may not be
  map-style, a generator the dataset holds, a spawn-unpicklable loader); None when workers
  may be given;
- `unpicklable(loader)`: the loader or its dataset holds a lambda, or a function or class
  defined inside a function (workers only by fork).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis.loaders import COMPUTES, INDEXES, NUM_WORKERS_POSITION
from codemod.analysis.names import dict_entry, kwarg, number_value, positional
from codemod.analysis.torch_facts import WORKER_OPTIONS

if TYPE_CHECKING:
    from codemod.analysis.loaders import Handoff, Loaders
    from codemod.context import FileContext

KEY = "loader_workers"


def loader_workers(context: FileContext) -> LoaderWorkers:
    return context.shared(KEY, LoaderWorkers)


class Count(NamedTuple):
    """Where a loader's worker count is written."""

    zero: cst.BaseExpression | None  # the count written out, whose setting is 0; None: not written
    anchor: cst.CSTNode  # where keywords go: the call, or the `**kwargs` dict literal
    hidden: cst.BaseExpression | None = None  # `**kwargs` that cannot be seen whole: nothing may be added
    written: bool = False  # a literal `0`, the only worker option, that the count may replace


class Blocker(NamedTuple):
    """Why a loader is not given workers: `kind` is one of "hidden" (`node`: a `**kwargs`
    that cannot be seen whole, from `Count.hidden`), "explicit" (an explicit count
    stays as written), "indexes" (the dataset only indexes tensors in memory), "star_args",
    "changed" (`node`: the change in the loop), "unsharded", "style" (may not be
    map-style), "draw" (`node`: the draw), "unpicklable"."""

    kind: str
    node: cst.CSTNode | None = None


class LoaderWorkers:
    """The worker counts of one file's training loaders; each look-up computed when asked."""

    def __init__(self, context: FileContext) -> None:
        self.context = context

    def training_feeds(self) -> tuple[dict[int, cst.CSTNode], dict[int, object]]:
        """(id(loader) -> the first training loop it feeds, id(loader) -> that feed)."""
        loaders = self.context.loaders
        feeds: dict[int, cst.CSTNode] = {}
        first: dict[int, object] = {}
        for feed in loaders.feeds:
            if loaders.trains(feed.loop):
                feeds.setdefault(id(feed.loader), feed.loop)
                first.setdefault(id(feed.loader), feed)
        return feeds, first

    def chosen_elsewhere(self, loader: cst.Call, function) -> bool:
        """For a loader built by the project `function`: its count is chosen there, it may
        not batch on the host, or it is reported there (where its callers are seen)."""
        there = function.context.loaders
        return (
            there.passes_option(loader, WORKER_OPTIONS, NUM_WORKERS_POSITION)
            or there.may_not_batch_on_host(loader)
            or there.returned_to(loader, self.context.path)
        )

    def handoffs(self, feeds: dict[int, cst.CSTNode]) -> list[tuple[Handoff, bool, tuple | None]]:
        """(handoff, built here, (loader, function, call) of the module that builds it) for
        each loader passed to a project function that trains on it, to report."""
        loaders = self.context.loaders
        seen: set[tuple[int, int]] = set()  # one construction there, called twice here: two loaders
        found = []
        for handoff in loaders.handoffs:
            loader, use = handoff.loader, handoff.use
            key = (id(loader), id(handoff.factory))
            if key in seen or id(loader) in feeds or not use.trains:
                continue
            seen.add(key)
            here = loaders.is_construction_here(loader)
            external = None if here else loaders.external.get(id(loader))
            if not here and external is None:
                continue
            there: Loaders = loaders if here else external[1].context.loaders
            if not here and there.returned_to(loader, self.context.path):
                continue  # reported where it is built, which sees this file's training loop among its callers'
            if there.passes_option(loader, WORKER_OPTIONS, NUM_WORKERS_POSITION) or there.may_not_batch_on_host(loader):
                continue  # chosen (perhaps through `*args` / `**kwargs`), or not batched on the host
            found.append((handoff, here, external))
        return found

    def count(self, loader: cst.Call) -> Count | None:
        """Where the worker count of `loader` is written; None when the loader is left as it is."""
        loaders = self.context.loaders
        count = kwarg(loader, "num_workers") or (
            positional(loader, NUM_WORKERS_POSITION) if loaders.is_torch_loader(loader) else None
        )
        if self._loads_as_told(loader, count):
            return None
        stars = [arg for arg in loader.args if arg.star == "**"]
        if count is not None:
            return self._explicit_count(loader, count, count.value, loader)
        return self._count_in_kwargs(loader, stars) if stars else Count(None, loader)

    def _loads_as_told(self, loader: cst.Call, count: cst.Arg | None) -> bool:
        """Does `loader` load where it must or as it is told: another worker option set beside
        no count, a subclass that overrides loading, device tensors in its dataset or collate?"""
        loaders = self.context.loaders
        if count is None and any(kwarg(loader, option) is not None for option in WORKER_OPTIONS):
            return True
        if loaders.overridden_subclass(loader):
            return True
        # CUDA cannot be used in forked workers: the loader stays in the training process
        return loaders.may_hold_device_data(loaders.dataset(loader), 0) or loaders.collate_moves_to_device(loader)

    def _count_in_kwargs(self, loader: cst.Call, stars: list[cst.Arg]) -> Count | None:
        """The count of a loader given `**kwargs` and no count of its own: in the dict literal
        behind them, or to be added to it; hidden where that dict cannot be seen whole."""
        found = self.context.loaders.kwargs_literal(stars[0].value) if len(stars) == 1 else None
        if found is not None and "num_workers" in found[1] and isinstance(found[0], cst.Dict):
            zero = dict_entry(found[0], "num_workers")
            return self._explicit_count(loader, None, zero, found[0]) if zero is not None else None
        if found is not None and any(option in found[1] for option in WORKER_OPTIONS):
            return None
        if found is None or found[2]:
            return Count(None, loader, hidden=stars[0].value)
        return Count(None, found[0])

    def _explicit_count(
        self, loader: cst.Call, count: cst.Arg | None, zero: cst.BaseExpression, anchor: cst.CSTNode
    ) -> Count | None:
        """The count `zero` written out (as the argument `count`, or in the dict `anchor`),
        when its setting is 0; None for another count."""
        loaders = self.context.loaders
        if number_value(loaders.setting(zero, 0)) != 0:
            return None
        options = loaders.keywords_passed(loader, anchor)
        written = (  # a literal 0, replaced by the count: it is the only worker option
            number_value(zero) == 0
            and (count is None or count.keyword is not None)
            and options is not None
            and not options & (set(WORKER_OPTIONS) - {"num_workers"})
        )
        return Count(zero, anchor, written=written)

    def unpicklable(self, loader: cst.Call) -> bool:
        loaders = self.context.loaders
        dataset = loaders.dataset(loader)
        return loaders.holds_unpicklable(loader, 0) or (dataset is not None and loaders.holds_unpicklable(dataset, 0))

    def blocker(self, loader: cst.Call, count: Count, loop: cst.CSTNode | None) -> Blocker | None:
        """Why `loader` (whose count is written as `count`, feeding `loop` of this file or
        returned to one elsewhere: None) is not given workers; None when it may be."""
        loaders = self.context.loaders
        dataset = loaders.dataset(loader)
        cost = loaders.batch_cost(loader)
        if cost == INDEXES:
            return Blocker("indexes")
        if count.zero is not None and (cost != COMPUTES or not count.written):
            return Blocker("explicit")
        if any(arg.star == "*" for arg in loader.args):
            return Blocker("star_args")
        changed = loaders.dataset_changed_in(dataset, loop) if loop is not None else None
        if changed is not None:
            return Blocker("changed", changed)
        style = loaders.dataset_style(dataset, (), 0)
        if style == "unsharded":
            return Blocker("unsharded")
        if style not in ("map", "sharded"):
            return Blocker("style")
        draw = loaders.generator_draw(dataset, 0)
        if draw is not None:
            return Blocker("draw", draw)
        if count.zero is not None and self.unpicklable(loader):
            return Blocker("unpicklable")
        return None

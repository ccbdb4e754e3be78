from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment, ScopeProvider

from codemod.analysis.bindings import Bindings, argument_for, returned_values
from codemod.analysis.kinds import DEVICE_NAME, PASS_THROUGH_ITERABLES, Kind, Place
from codemod.analysis.loops import calls_in
from codemod.analysis.names import has_star_kwargs, kwarg, method_name, positional, with_kwarg
from codemod.rule import Invalid, Level, Rule, Valid

DATALOADER = "torch.utils.data.DataLoader"
# `DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, ...)`
COLLATE_FN_POSITION, PIN_MEMORY_POSITION = 6, 7
LOOKS_THROUGH = {"itertools.islice", *PASS_THROUGH_ITERABLES}
MAX_DEPTH = 8  # how many assignments and helper calls a look-up follows


def _memoized(method):
    """Cache a recursive look-up per rule instance, keyed by node identity: without
    it, a name with many bindings makes the walk exponential in MAX_DEPTH."""

    @functools.wraps(method)
    def cached(self, *args):
        key = (method.__name__, *(_key(a) for a in args))
        if key not in self._memo:
            result = method(self, *args)
            if isinstance(result, list):  # the same node found along many paths: keep it once
                result = list({id(item): item for item in result}.values())
            self._memo[key] = result
        return self._memo[key]

    return cached


def _key(argument):
    """Nodes live as long as the tree the rule visits, so their identity is a key;
    a set of node ids is keyed by its contents (a freed set's id can be reused)."""
    if isinstance(argument, (set, frozenset)):
        return frozenset(argument)
    if isinstance(argument, (int, tuple, type(None))):
        return argument
    return id(argument)

PREAMBLE = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
"""


@dataclass
class _Feeds:
    """What the rule learned about one DataLoader construction."""

    copies: list[cst.Call] = field(default_factory=list)  # the `.to(...)` / `.cuda()` calls of its batches
    places: list[Place] = field(default_factory=list)  # where its batches are copied to
    devices: list[cst.BaseExpression] = field(default_factory=list)  # the device expressions of those copies


class UnpinnedLoaderToCuda(Rule):
    """
    ## What it does
    Finds `torch.utils.data.DataLoader`s whose batches the script copies to a
    CUDA device (`for x, y in loader: x = x.to(device)`, also through
    `enumerate`, `tqdm` and `zip`, and through helper functions that build and
    return the loader) and that do not pass `pin_memory`, and adds it.

    ## Why is this bad?
    A batch in ordinary (pageable) host memory cannot be copied to the GPU by
    DMA directly: the driver first copies it into a pinned staging buffer, and
    the copy blocks the host even with `non_blocking=True`. With
    `pin_memory=True` the loader puts each batch in page-locked memory (in a
    background thread when `num_workers > 0`), the host-to-device copy runs at
    full PCIe/NVLink bandwidth, and with PM101's `non_blocking=True` it
    overlaps with the compute already queued. Pinning pays off together with
    those non-blocking copies; on its own it mostly saves the staging copy.
    Typical gain: a few percent of step time in input-bound loops, up to 2x
    faster host-to-device copies.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=64, shuffle=True)
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    ```
    Use instead:
    ```python
    loader = DataLoader(dataset, batch_size=64, shuffle=True, pin_memory=True)
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    ```

    ## Fix safety
    Safe: pinning copies each batch into page-locked memory; the values are
    the same bit for bit. The value written follows where the batches go:
    `True` when every copy provably targets CUDA (`.cuda()`, `"cuda:0"`,
    `torch.device("cuda")`); `device.type == "cuda"` when they go to a
    `device = torch.device(...)` that may be the CPU and that is defined before
    the loader, so a CPU run neither pins for nothing nor warns; otherwise
    `torch.cuda.is_available()`, which pins whenever a GPU is present (on a
    machine with a GPU and a run forced onto the CPU that pins for nothing,
    harmlessly). Loaders built with `**loader_kwargs` get the entry in that
    dict when it is a literal (or `dict(...)`) of this file used only for
    DataLoaders; otherwise the loader is reported without a fix.

    Left alone: calls that already pass `pin_memory` (any value), loaders whose
    batches are never copied to a device, datasets that hold CUDA tensors
    (`TensorDataset(x.cuda())`, `torch.load` without `map_location`) or whose
    class in this file moves data to a device, and `collate_fn`s that do
    (pinning a CUDA tensor raises), and DataLoader subclasses that override
    `__init__` or `__iter__`. A local class merely named `DataLoader` is not
    torch's.
    """

    CODE = "PM102"
    NAME = "unpinned-loader-batches-to-cuda"
    LEVEL = Level.SAFE
    REQUIRES = ("DataLoader",)
    MESSAGE = "DataLoader batches are copied to CUDA from pageable memory; pass pin_memory so the copies can be asynchronous"
    GAIN = "up to 2x faster host-to-device copies; overlap with compute together with PM101's non_blocking copies"

    VALID = [
        Valid(PREAMBLE + "loader = DataLoader(dataset, pin_memory=False)\nfor x, y in loader:\n    x = x.cuda()\n",
              "an explicit choice is kept"),
        Valid(PREAMBLE + "loader = DataLoader(dataset)\nfor x, y in loader:\n    print(x.sum())\n", "batches stay on the host"),
        Valid(PREAMBLE + "loader = DataLoader(dataset)\nfor x, y in loader:\n    x = x.to(torch.float16)\n", "dtype only"),
        Valid(
            PREAMBLE + "cuda_set = TensorDataset(torch.randn(64, 8).cuda())\nloader = DataLoader(cuda_set)\n"
            "for (x,) in loader:\n    x = x.cuda()\n",
            "pinning a CUDA tensor raises",
        ),
        Valid(
            PREAMBLE + "class DataLoader:\n    def __init__(self, ds):\n        self.ds = ds\n    def __iter__(self):\n"
            "        return iter(self.ds)\nloader = DataLoader(dataset)\nfor x, y in loader:\n    x = x.cuda()\n",
            "a local class named DataLoader",
        ),
        Valid(
            PREAMBLE + "class Prefetching(DataLoader):\n    def __iter__(self):\n        return super().__iter__()\n"
            "loader = Prefetching(dataset)\nfor x, y in loader:\n    x = x.cuda()\n",
            "a subclass that overrides __iter__",
        ),
        Valid(
            PREAMBLE + "class OnDevice(torch.utils.data.Dataset):\n    def __len__(self):\n        return 8\n"
            "    def __getitem__(self, i):\n        return torch.randn(8).to('cuda')\n"
            "loader = DataLoader(OnDevice())\nfor x in loader:\n    x = x.cuda()\n",
            "the dataset moves data to the device",
        ),
        Valid(
            PREAMBLE + "device = torch.device('cuda')\n"
            "loader = DataLoader(dataset, collate_fn=lambda b: [t.to(device) for t in torch.utils.data.default_collate(b)])\n"
            "for x, y in loader:\n    x = x.to(device)\n",
            "the collate_fn moves batches to the device",
        ),
        Valid(
            PREAMBLE + "kwargs = {'batch_size': 8}\nkwargs.update({'pin_memory': False})\n"
            "loader = DataLoader(dataset, **kwargs)\nfor x, y in loader:\n    x = x.cuda()\n",
            "the kwargs dict sets pin_memory",
        ),
        Valid(
            PREAMBLE + "kwargs = {'batch_size': 8}\nkwargs['pin_memory'] = True\n"
            "loader = DataLoader(dataset, **kwargs)\nfor x, y in loader:\n    x = x.cuda()\n",
            "the kwargs dict sets pin_memory by subscript",
        ),
        Valid(
            PREAMBLE + "loader = DataLoader(dataset, 8, True, None, None, 0, None, False)\n"
            "for x, y in loader:\n    x = x.cuda()\n",
            "pin_memory passed by position",
        ),
        Valid(
            PREAMBLE + "def make_loader(ds):\n    return DataLoader(ds, batch_size=8)\n"
            "on_gpu = TensorDataset(torch.randn(64, 8, device='cuda'))\n"
            "for (x,) in make_loader(on_gpu):\n    x = x.cuda()\n",
            "a helper given a CUDA dataset",
        ),
        Valid(
            PREAMBLE + "full = TensorDataset(torch.randn(64, 8).cuda())\n"
            "train_set, val_set = torch.utils.data.random_split(full, [48, 16])\n"
            "loader = DataLoader(train_set)\nfor (x,) in loader:\n    x = x.cuda()\n",
            "a split of a CUDA dataset",
        ),
        Valid(
            PREAMBLE + "saved = TensorDataset(*torch.load('features.pt'))\n"
            "loader = DataLoader(saved)\nfor x, y in loader:\n    x = x.cuda()\n",
            "torch.load without map_location may give CUDA tensors",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + "loader = DataLoader(dataset, batch_size=8)\nfor x, y in loader:\n    x, y = x.cuda(), y.cuda()\n",
            PREAMBLE + "loader = DataLoader(dataset, batch_size=8, pin_memory=True)\nfor x, y in loader:\n"
            "    x, y = x.cuda(), y.cuda()\n",
        ),
        Invalid(
            PREAMBLE.replace("from torch.utils.data import DataLoader, TensorDataset", "import torch.utils.data as tud\n"
                             "from torch.utils.data import TensorDataset")
            + "device = torch.device('cuda:0')\nloader = tud.DataLoader(dataset)\n"
            "for step, (x, y) in enumerate(loader):\n    x = x.to(device)\n",
            PREAMBLE.replace("from torch.utils.data import DataLoader, TensorDataset", "import torch.utils.data as tud\n"
                             "from torch.utils.data import TensorDataset")
            + "device = torch.device('cuda:0')\nloader = tud.DataLoader(dataset, pin_memory=True)\n"
            "for step, (x, y) in enumerate(loader):\n    x = x.to(device)\n",
            "a module alias, through enumerate",
        ),
        Invalid(
            PREAMBLE + "from torch.utils.data import DataLoader as DL\n"
            "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            "loader = DL(dataset)\nfor batch in loader:\n    batch = [t.to(device) for t in batch]\n",
            PREAMBLE + "from torch.utils.data import DataLoader as DL\n"
            "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            "loader = DL(dataset, pin_memory=device.type == \"cuda\")\nfor batch in loader:\n"
            "    batch = [t.to(device) for t in batch]\n",
            "a device that may be the CPU",
        ),
        Invalid(
            PREAMBLE + "def train(device):\n    loader = torch.utils.data.DataLoader(dataset)\n"
            "    for x, y in loader:\n        x = x.to(device)\n",
            PREAMBLE + "def train(device):\n    loader = torch.utils.data.DataLoader(dataset, pin_memory=torch.cuda.is_available())\n"
            "    for x, y in loader:\n        x = x.to(device)\n",
            "a device the rule cannot place",
        ),
        Invalid(
            PREAMBLE + "train_kwargs = {'batch_size': 8, 'shuffle': True}\nloader = DataLoader(dataset, **train_kwargs)\n"
            "for x, y in loader:\n    x = x.cuda()\n",
            PREAMBLE + "train_kwargs = {'batch_size': 8, 'shuffle': True, 'pin_memory': True}\n"
            "loader = DataLoader(dataset, **train_kwargs)\nfor x, y in loader:\n    x = x.cuda()\n",
            "the entry goes in the kwargs dict",
        ),
        Invalid(
            PREAMBLE + "loader_kwargs = dict(batch_size=8)\nloader = DataLoader(dataset, **loader_kwargs)\n"
            "for x, y in loader:\n    x = x.cuda()\n",
            PREAMBLE + "loader_kwargs = dict(batch_size=8, pin_memory=True)\nloader = DataLoader(dataset, **loader_kwargs)\n"
            "for x, y in loader:\n    x = x.cuda()\n",
        ),
        Invalid(
            PREAMBLE + "def make_loader(**kwargs):\n    return DataLoader(dataset, **kwargs)\n"
            "for x, y in make_loader(batch_size=8):\n    x = x.cuda()\n",
            None,
            "kwargs the rule cannot see",
        ),
        Invalid(
            PREAMBLE + "def make_loader(ds, bs):\n    return DataLoader(ds, batch_size=bs)\n"
            "train_loader = make_loader(dataset, 8)\nfor x, y in train_loader:\n    x = x.cuda()\n",
            PREAMBLE + "def make_loader(ds, bs):\n    return DataLoader(ds, batch_size=bs, pin_memory=True)\n"
            "train_loader = make_loader(dataset, 8)\nfor x, y in train_loader:\n    x = x.cuda()\n",
            "built in a helper function",
        ),
        Invalid(
            PREAMBLE + "import argparse\nargs = argparse.Namespace(device='cuda')\n"
            "loader = DataLoader(dataset)\nfor x, y in loader:\n    x = x.to(args.device)\n",
            PREAMBLE + "import argparse\nargs = argparse.Namespace(device='cuda')\n"
            "loader = DataLoader(dataset, pin_memory=torch.cuda.is_available())\nfor x, y in loader:\n"
            "    x = x.to(args.device)\n",
            "a device attribute",
        ),
        Invalid(
            PREAMBLE + "import types\ncfg = types.SimpleNamespace(train_device='cuda:1')\n"
            "loader = DataLoader(dataset)\nfor x, y in loader:\n    x = x.to(cfg.train_device)\n",
            PREAMBLE + "import types\ncfg = types.SimpleNamespace(train_device='cuda:1')\n"
            "loader = DataLoader(dataset, pin_memory=torch.cuda.is_available())\nfor x, y in loader:\n"
            "    x = x.to(cfg.train_device)\n",
            "an attribute named like a device",
        ),
        Invalid(
            PREAMBLE + "class Loader(DataLoader):\n    def steps(self):\n        return len(self)\n"
            "loader = Loader(dataset)\nfor x, y in loader:\n    x = x.cuda()\n",
            PREAMBLE + "class Loader(DataLoader):\n    def steps(self):\n        return len(self)\n"
            "loader = Loader(dataset, pin_memory=True)\nfor x, y in loader:\n    x = x.cuda()\n",
            "a subclass that keeps DataLoader's __init__ and __iter__",
        ),
        Invalid(
            PREAMBLE + "base = {'batch_size': 8}\nkwargs = {**base, 'shuffle': True}\n"
            "loader = DataLoader(dataset, **kwargs)\nfor x, y in loader:\n    x = x.cuda()\n",
            None,
            "a dict with contents the rule cannot see",
        ),
        Invalid(
            PREAMBLE + "kwargs = {'batch_size': 8}\nprint(kwargs)\n"
            "loader = DataLoader(dataset, **kwargs)\nfor x, y in loader:\n    x = x.cuda()\n",
            None,
            "a dict other code sees too",
        ),
        Invalid(
            PREAMBLE + "options = (8, True)\nloader = DataLoader(dataset, *options)\nfor x, y in loader:\n    x = x.cuda()\n",
            None,
            "*args may pass pin_memory",
        ),
        Invalid(
            PREAMBLE + "other = DataLoader(dataset)\nloader = DataLoader(dataset)\n"
            "for (x, y), (u, v) in zip(loader, other):\n    x = x.cuda()\n",
            PREAMBLE + "other = DataLoader(dataset)\nloader = DataLoader(dataset, pin_memory=True)\n"
            "for (x, y), (u, v) in zip(loader, other):\n    x = x.cuda()\n",
            "only the zipped loader whose batches move",
        ),
    ]

    def __init__(self, context) -> None:
        super().__init__(context)
        self.scopes = context.wrapper.resolve(ScopeProvider)
        self.bindings = Bindings(self.scopes, context.parents)
        self.loaders: list[cst.Call] = []
        self.loader_ids: set[int] = set()
        self._memo: dict[tuple, object] = {}
        self.loops: list[cst.For] = []
        self.calls_of: dict[int, list[cst.Call]] = defaultdict(list)  # function of this file -> its calls
        # Every spelling of torch's DataLoader (an alias, a subclass) names it somewhere
        # in the file; without it, skip resolving the qualified name of every call.
        self.enabled = "DataLoader" in context.code

    def visit_Call(self, node: cst.Call) -> None:
        if not self.enabled:
            return
        if self._is_loader_construction(node):
            self.loaders.append(node)
            self.loader_ids.add(id(node))
        function = self.bindings.local_function(node.func)
        if function is not None:
            self.calls_of[id(function)].append(node)

    def visit_For(self, node: cst.For) -> None:
        if self.enabled:
            self.loops.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        feeds: dict[int, _Feeds] = defaultdict(_Feeds)
        for loop in self.loops:
            for iterable, target in self._iterated(loop.iter, loop.target):
                for loader in self._loader_sources(iterable, (), 0):
                    feed = feeds[id(loader)]
                    for copy, place, device in self._copies_to_device(loop, target):
                        feed.copies.append(copy)
                        feed.places.append(place)
                        feed.devices.append(device)
        for loader in self.loaders:
            feed = feeds.get(id(loader))
            if feed is not None and feed.places:
                self._check(loader, feed)

    # -- which loaders feed which loops -------------------------------------------------

    def _is_loader_construction(self, call: cst.Call) -> bool:
        names = self.context.names
        if names.is_(call.func, DATALOADER):
            return not names.local(call.func)  # a class of this file shadowing the import is not torch's
        classdef = self.context.kinds.local_class(call.func)
        return classdef is not None and self.context.kinds.class_fact(classdef).kind is Kind.LOADER

    def _iterated(self, iterable: cst.BaseExpression, target: cst.BaseExpression):
        """(iterable, the part of the loop target its items bind) through enumerate, zip, tqdm, iter."""
        if isinstance(iterable, cst.Call):
            names = self.context.names
            args = [a.value for a in iterable.args if a.keyword is None and not a.star]
            if names.is_(iterable.func, "enumerate", "builtins.enumerate") and args:
                inner = target.elements[1].value if _is_pair(target, 2) else target
                return self._iterated(args[0], inner)
            if names.is_(iterable.func, "zip", "builtins.zip"):
                found = []
                for index, arg in enumerate(args):
                    inner = target.elements[index].value if _is_pair(target, len(args)) else target
                    found.extend(self._iterated(arg, inner))
                return found
            if names.is_(iterable.func, *LOOKS_THROUGH) and args:
                return self._iterated(args[0], target)
        return [(iterable, target)]

    @_memoized
    def _loader_sources(self, expr: cst.BaseExpression, path: tuple[int, ...], depth: int) -> list[cst.Call]:
        """The DataLoader constructions `expr` may evaluate to; `path` indexes into
        tuples on the way (`train, val = make_loaders()` takes element 0 or 1)."""
        if depth > MAX_DEPTH:
            return []
        if isinstance(expr, (cst.Tuple, cst.List)) and path:
            if path[0] >= len(expr.elements) or any(isinstance(e, cst.StarredElement) for e in expr.elements):
                return []
            return self._loader_sources(expr.elements[path[0]].value, path[1:], depth + 1)
        if isinstance(expr, cst.Call):
            if id(expr) in self.loader_ids:
                return [] if path else [expr]
            function = self.bindings.local_function(expr.func)
            if function is None:
                return []
            return [found for value in returned_values(function) for found in self._loader_sources(value, path, depth + 1)]
        if isinstance(expr, cst.Name):
            return [found for source, inner in self._sources(expr)
                    for found in self._loader_sources(source, inner + path, depth + 1)]
        if isinstance(expr, cst.Attribute):  # `self.train_loader`, assigned in another method
            values = self.bindings.attribute_values(expr) or []
            return [found for value in values for found in self._loader_sources(value, path, depth + 1)]
        if isinstance(expr, cst.IfExp):
            return self._loader_sources(expr.body, path, depth + 1) + self._loader_sources(expr.orelse, path, depth + 1)
        return []

    def _sources(self, name: cst.Name) -> list[tuple[cst.BaseExpression, tuple[int, ...]]]:
        """What `name` is bound to: each assigned value (with the index `a, b = value`
        unpacks), each element of a literal it loops over, or, for a parameter, the
        argument every call of its function passes."""
        parameter = self.bindings.param_of(name)
        if parameter is not None:
            function, param = parameter
            passed = [argument_for(call, function, param) for call in self.calls_of.get(id(function), [])]
            return [(argument, ()) for argument in passed if argument is not None]
        found = []
        for assignment in self.bindings.assignments(name) or ():
            value = self.bindings.assigned_value(assignment)
            unpacked = self.bindings.unpacked(assignment) if value is None else None
            statement = self.bindings.statement(assignment.node)
            if value is not None:
                found.append((value, ()))
            elif unpacked is not None:
                found.append((unpacked[0], (unpacked[1],)))
            elif isinstance(statement, cst.For) and statement.target is assignment.node \
                    and isinstance(statement.iter, (cst.Tuple, cst.List)):
                found.extend((element.value, ()) for element in statement.iter.elements)  # `for loader in (a, b):`
        return found

    def _copies_to_device(self, loop: cst.For, target: cst.BaseExpression):
        """(call, place, device expression) of each copy of the batch to a device in the loop body."""
        bound = {id(node) for node in m.findall(target, m.Name())}
        kinds = self.context.kinds
        for call in calls_in(loop.body):
            method = method_name(call)
            if method not in ("to", "cuda"):
                continue
            if not self._derives_from(call.func.value, bound, loop, 0):
                continue
            if method == "cuda":
                yield call, Place.CUDA, None
                continue
            copy = kinds.copy_of(call)
            device = kwarg(call, "device") or positional(call, 0)
            if copy is not None and copy.moves_device and copy.target is not Place.HOST:
                yield call, copy.target, device.value if device is not None else None
            elif copy is None and device is not None and m.matches(device.value, m.Attribute()) \
                    and DEVICE_NAME.match(device.value.attr.value):
                yield call, Place.UNKNOWN, device.value  # `cfg.train_device`: named like a device

    @_memoized
    def _derives_from(self, expr: cst.BaseExpression, bound: set[int], loop: cst.For, depth: int) -> bool:
        """Is `expr` (a part of) what the loop target `bound` holds, directly or through
        assignments and comprehensions inside the loop?"""
        if depth > MAX_DEPTH:
            return False
        return any(self._name_derives_from(name, bound, loop, depth) for name in self._roots(expr))

    def _roots(self, expr: cst.BaseExpression) -> list[cst.Name]:
        expr = self.context.kinds.storage_root(expr)
        if isinstance(expr, cst.Name):
            return [expr]
        if isinstance(expr, (cst.Tuple, cst.List)):
            return [root for element in expr.elements for root in self._roots(element.value)]
        if isinstance(expr, cst.Call):
            if method_name(expr) in ("items", "values"):
                return self._roots(expr.func.value)
            if self.context.names.is_(expr.func, "zip", "builtins.zip", "enumerate", "builtins.enumerate", "list",
                                      "builtins.list", "tuple", "builtins.tuple"):
                return [root for arg in expr.args for root in self._roots(arg.value)]
        return []

    def _name_derives_from(self, name: cst.Name, bound: set[int], loop: cst.For, depth: int) -> bool:
        for assignment in self.bindings.assignments(name) or ():
            if id(assignment.node) in bound:
                return True
            statement = self.bindings.statement(assignment.node)
            if not _inside(statement, loop.body, self.context.parents):
                continue
            if isinstance(statement, (cst.Assign, cst.AnnAssign)) and statement.value is not None:
                source = statement.value
            elif isinstance(statement, (cst.CompFor, cst.For)):
                source = statement.iter
            else:
                continue
            if self._derives_from(source, bound, loop, depth + 1):
                return True
        return False

    # -- the decision ------------------------------------------------------------------------

    def _check(self, loader: cst.Call, feed: _Feeds) -> None:
        is_torch_loader = self.context.names.is_(loader.func, DATALOADER)
        if kwarg(loader, "pin_memory") is not None:
            return
        if is_torch_loader and positional(loader, PIN_MEMORY_POSITION) is not None:
            return
        if not is_torch_loader and self._subclass_overrides(self.context.kinds.local_class(loader.func)):
            return
        if self._may_hold_device_data(self._dataset(loader), 0):
            return
        if self._collate_moves_to_device(loader, is_torch_loader):
            return
        if any(arg.star == "*" for arg in loader.args):
            self.report(loader, self.MESSAGE + "; `*args` may already pass pin_memory, so it is not added")
            return
        line = self.context.positions[feed.copies[0]].start.line
        message = f"this DataLoader's batches are copied to the GPU from pageable memory (line {line}); pass pin_memory"
        if has_star_kwargs(loader):
            self._fix_through_kwargs(loader, feed, message)
            return
        value, imports = self._pin_value(feed, loader)
        self.report(loader, message, replacement=with_kwarg(loader, "pin_memory", value), imports=imports)

    def _dataset(self, loader: cst.Call) -> cst.BaseExpression | None:
        arg = kwarg(loader, "dataset") or positional(loader, 0)
        return arg.value if arg is not None else None

    def _subclass_overrides(self, classdef: cst.ClassDef | None) -> bool:
        """Does a DataLoader subclass of this file (or a local base of it) define its own
        `__init__` (arguments unknown) or `__iter__` (batches unknown)?"""
        seen = 0
        while classdef is not None and seen < MAX_DEPTH:
            for statement in classdef.body.body:
                if isinstance(statement, cst.FunctionDef) and statement.name.value in ("__init__", "__iter__"):
                    return True
            bases = [self.context.kinds.local_class(base.value) for base in classdef.bases]
            classdef = next((base for base in bases if base is not None), None)
            seen += 1
        return False

    @_memoized
    def _may_hold_device_data(self, expr: cst.BaseExpression | None, depth: int) -> bool:
        """Could the dataset `expr` yield CUDA tensors, which pinning cannot take?"""
        if expr is None or depth > MAX_DEPTH:
            return False
        kinds = self.context.kinds
        fact = kinds.fact(expr)
        if fact.kind in (Kind.TENSOR, Kind.DATASET, Kind.BATCH) and fact.place is not Place.HOST:
            return True
        if isinstance(expr, cst.Name):
            # A value unpacked from a tuple is judged by the whole tuple: cautious, and simple.
            return any(self._may_hold_device_data(source, depth + 1) for source, _ in self._sources(expr))
        if isinstance(expr, (cst.Tuple, cst.List)):
            return any(self._may_hold_device_data(e.value, depth + 1) for e in expr.elements)
        if isinstance(expr, cst.Call):
            if self.context.names.is_(expr.func, "torch.load") and kwarg(expr, "map_location") is None \
                    and positional(expr, 1) is None:
                return True
            classdef = kinds.local_class(expr.func)
            if classdef is not None and self._moves_to_device(classdef):
                return True
            return any(self._may_hold_device_data(a.value, depth + 1) for a in expr.args)
        return False

    def _moves_to_device(self, node: cst.CSTNode) -> bool:
        """Does code under `node` copy to a device, or make tensors on one?"""
        kinds = self.context.kinds
        for call in m.findall(node, m.Call()):
            method = method_name(call)
            if method == "cuda":
                return True
            if method == "to":
                copy = kinds.copy_of(call)
                if copy is None or (copy.moves_device and copy.target is not Place.HOST):
                    return True
            device = kwarg(call, "device")
            if device is not None and kinds.device_place(device.value) is not Place.HOST:
                return True
        return False

    def _collate_moves_to_device(self, loader: cst.Call, is_torch_loader: bool) -> bool:
        arg = kwarg(loader, "collate_fn") or (positional(loader, COLLATE_FN_POSITION) if is_torch_loader else None)
        if arg is None:
            return False
        function = arg.value
        if isinstance(function, cst.Call) and self.context.names.is_(function.func, "functools.partial"):
            first = positional(function, 0)
            function = first.value if first is not None else function
        if isinstance(function, cst.Lambda):
            return self._moves_to_device(function.body)
        local = self.bindings.local_function(function) or self.context.kinds.local_class(function)
        return local is not None and self._moves_to_device(local)

    # -- what to write -------------------------------------------------------------------------

    def _pin_value(self, feed: _Feeds, at: cst.CSTNode) -> tuple[cst.BaseExpression, list[tuple[str, str | None]]]:
        """`True` for CUDA; `device.type == "cuda"` for a torch.device visible at `at`;
        else `torch.cuda.is_available()`."""
        if all(place is Place.CUDA for place in feed.places):
            return cst.Name("True"), []
        device = self._shared_device_name(feed.devices, at)
        if device is not None:
            return cst.Comparison(
                left=cst.Attribute(value=cst.Name(device), attr=cst.Name("type")),
                comparisons=[cst.ComparisonTarget(operator=cst.Equal(), comparator=cst.SimpleString('"cuda"'))],
            ), []
        return cst.parse_expression("torch.cuda.is_available()"), [("torch", None)]

    def _shared_device_name(self, devices: list, at: cst.CSTNode) -> str | None:
        """The name of the `torch.device(...)` every copy targets, when one assignment
        binds it, before `at` and visible there (followed through function parameters)."""
        names = [name for device in devices for name in self._device_names(device, 0)]
        if not names or any(name is None for name in names):
            return None
        assignments = [self.bindings.assignments(name) for name in names]
        if any(found is None or len(found) != 1 for found in assignments):
            return None
        assignment: Assignment = assignments[0][0]
        if any(found[0] is not assignment for found in assignments):
            return None
        value = self.bindings.assigned_value(assignment)
        if not (isinstance(value, cst.Call) and self.context.names.is_(value.func, "torch.device")):
            return None
        scope = self.scopes.get(at)
        name = names[0].value
        if scope is None or list(scope[name]) != [assignment]:
            return None
        positions = self.context.positions
        bound_at = positions[self.bindings.statement(assignment.node)].end
        used_at = positions[at].start
        return name if (bound_at.line, bound_at.column) <= (used_at.line, used_at.column) else None

    @_memoized
    def _device_names(self, device: cst.BaseExpression | None, depth: int) -> list[cst.Name | None]:
        """The names a device expression comes from, through parameters to the arguments
        of every call; None for anything else."""
        if not isinstance(device, cst.Name) or depth > MAX_DEPTH:
            return [None]
        if self.bindings.param_of(device) is None:
            return [device]
        passed = self._sources(device)
        if not passed:
            return [None]
        return [name for argument, _ in passed for name in self._device_names(argument, depth + 1)]

    def _fix_through_kwargs(self, loader: cst.Call, feed: _Feeds, message: str) -> None:
        stars = [arg for arg in loader.args if arg.star == "**"]
        literals = [self._kwargs_literal(arg.value) for arg in stars]
        if any(literal is not None and "pin_memory" in literal[1] for literal in literals):
            return  # already set through the dict
        if len(stars) != 1 or literals[0] is None or literals[0][2]:
            name = self.context.module.code_for_node(stars[0].value)
            self.report(loader, message + f"; `**{name}` cannot be seen whole here, so it is not changed")
            return
        literal, _, _ = literals[0]
        value, imports = self._pin_value(feed, literal)
        if isinstance(literal, cst.Dict):
            replacement = _with_dict_entry(literal, "pin_memory", value)
        else:
            replacement = with_kwarg(literal, "pin_memory", value)
        self.report(literal, message + " (added to the kwargs dict)", replacement=replacement, imports=imports)

    def _kwargs_literal(self, expr: cst.BaseExpression) -> tuple[cst.CSTNode, set[str], bool] | None:
        """(the dict literal or `dict(...)` behind `**expr`, its keys, whether other code may
        add keys or see the dict), or None when there is no single literal to look at."""
        if not isinstance(expr, cst.Name):
            return None
        assignments = self.bindings.assignments(expr)
        if assignments is None or len(assignments) != 1:
            return None
        literal = self.bindings.assigned_value(assignments[0])
        keys = self._literal_keys(literal)
        if keys is None:
            return None
        opaque = False
        for access in assignments[0].references:
            added = self._keys_added_by(access.node)
            if added is None:
                opaque = True
            else:
                keys |= added
        return literal, keys, opaque

    def _literal_keys(self, literal) -> set[str] | None:
        if isinstance(literal, cst.Dict):
            keys = set()
            for element in literal.elements:
                if not (isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString)):
                    return None
                keys.add(element.key.evaluated_value)
            return keys
        if isinstance(literal, cst.Call) and self.context.names.is_(literal.func, "dict", "builtins.dict"):
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
            return set() if isinstance(call, cst.Call) and self._is_loader_construction(call) else None
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


def _is_pair(target: cst.BaseExpression, length: int) -> bool:
    return isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == length and not any(
        isinstance(e, cst.StarredElement) for e in target.elements
    )


def _inside(node: cst.CSTNode, ancestor: cst.CSTNode, parents) -> bool:
    current = node
    while current is not None:
        if current is ancestor:
            return True
        current = parents.get(current)
    return False


def _with_dict_entry(literal: cst.Dict, key: str, value: cst.BaseExpression) -> cst.Dict:
    """`literal` with `key: value` appended, in the quotes of its other keys and the
    layout of its entries (a trailing comma puts the entry on a line of its own)."""
    elements = list(literal.elements)
    quote = "'" if elements and elements[0].key.value.startswith("'") else '"'
    entry = cst.DictElement(key=cst.SimpleString(f"{quote}{key}{quote}"), value=value)
    if not elements:
        return literal.with_changes(elements=[entry])
    last = elements[-1]
    if last.comma is cst.MaybeSentinel.DEFAULT or last.comma is None:
        elements[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        elements.append(entry)
    else:
        entry = entry.with_changes(comma=last.comma)
        if not isinstance(last.comma.whitespace_after, cst.ParenthesizedWhitespace):
            between = cst.SimpleWhitespace(" ")
        elif len(elements) >= 2:
            between = elements[-2].comma.whitespace_after
        else:
            between = literal.lbrace.whitespace_after
        elements[-1] = last.with_changes(comma=cst.Comma(whitespace_after=between))
        elements.append(entry)
    return literal.with_changes(elements=elements)

"""Which DataLoaders a file builds and which loops they feed: the look-ups PM102, PM201
and PM103 share, built once per file (`context.loaders`).

It finds every DataLoader construction (torch's, under any alias, and subclasses of
this file) and answers: which constructions an expression may evaluate to (through
names, helper functions that build and return the loader, `self.` attributes set in
another method, enumerate/zip/tqdm/iter), which loops each loader feeds, which copies
to a device a loop makes of its batches, whether the dataset may hold CUDA data, and
what a `**kwargs` dict holds.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis.bindings import argument_for, returned_values
from codemod.analysis.kinds import DEVICE_NAME, PASS_THROUGH_ITERABLES, Kind, Place
from codemod.analysis.loops import own_nodes
from codemod.analysis.names import kwarg, method_name, positional

if TYPE_CHECKING:
    from codemod.context import FileContext

DATALOADER = "torch.utils.data.DataLoader"
# `DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, ...)`
NUM_WORKERS_POSITION, COLLATE_FN_POSITION, PIN_MEMORY_POSITION = 5, 6, 7
# Iterables whose items are their first argument's (PM103 writes DevicePrefetcher(loader, device)).
LOOKS_THROUGH = {"itertools.islice", "runtime.data.DevicePrefetcher", "runtime.DevicePrefetcher", *PASS_THROUGH_ITERABLES}
MAX_DEPTH = 8  # how many assignments and helper calls a look-up follows
ENUMERATE = ("enumerate", "builtins.enumerate")
ZIP = ("zip", "builtins.zip")


def memoized(method):
    """Cache a recursive look-up, keyed by node identity: without it, a name with many
    bindings makes the walk exponential in MAX_DEPTH."""

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
    """Nodes live as long as the tree the rules visit, so their identity is a key;
    a set of node ids is keyed by its contents (a freed set's id can be reused)."""
    if isinstance(argument, (set, frozenset)):
        return frozenset(argument)
    if isinstance(argument, (int, tuple, type(None))):
        return argument
    return id(argument)


@dataclass(frozen=True)
class Feed:
    """A `for` loop over (something built from) a DataLoader construction."""

    loader: cst.Call
    loop: cst.For
    target: cst.BaseExpression  # the part of the loop target bound to the loader's batches


@dataclass(frozen=True)
class DeviceCopy:
    """A copy of a loop's batch to a device: `x.to(device)`, `x.cuda()`."""

    call: cst.Call
    place: Place
    device: cst.BaseExpression | None  # None for `.cuda()`


class Loaders:
    """DataLoader constructions of one file and the loops they feed."""

    def __init__(self, context: "FileContext") -> None:
        self.context = context
        self.index = context.index
        self.names = context.names
        self.kinds = context.kinds
        self.bindings = context.bindings
        self._memo: dict[tuple, object] = {}
        self._calls_of: dict[int, list[cst.Call]] | None = None
        # Every spelling of torch's DataLoader (an alias, a subclass) names it somewhere in the
        # file; without it, skip resolving the qualified name of every call.
        self.constructions: list[cst.Call] = []
        if "DataLoader" in context.code:
            spellings = {"DataLoader"} | {c.name.value for c in self.index.find(cst.ClassDef)}
            aliases = {a.asname.name.value for a in self.index.find(cst.ImportAlias)
                       if a.asname is not None and isinstance(a.asname.name, cst.Name)}
            spellings |= aliases
            self.constructions = [call for call in self.index.find(cst.Call)
                                  if _last_name(call.func) in spellings and self.is_construction(call)]
        self._ids = {id(call) for call in self.constructions}

    # -- what a loader is ------------------------------------------------------------------

    def is_construction(self, call: cst.Call) -> bool:
        """`DataLoader(...)` of torch (any alias), or of a subclass of it defined in this file."""
        if self.names.is_(call.func, DATALOADER):
            return not self.names.local(call.func)  # a class of this file shadowing the import is not torch's
        classdef = self.kinds.local_class(call.func)
        return classdef is not None and self.kinds.class_fact(classdef).kind is Kind.LOADER

    def is_torch_loader(self, call: cst.Call) -> bool:
        return self.names.is_(call.func, DATALOADER)

    def dataset(self, loader: cst.Call) -> cst.BaseExpression | None:
        arg = kwarg(loader, "dataset") or positional(loader, 0)
        return arg.value if arg is not None else None

    # -- which loaders feed which loops -------------------------------------------------

    @functools.cached_property
    def feeds(self) -> list[Feed]:
        """Every `for` loop over a loader, with the loader and the target its batches bind."""
        found: list[Feed] = []
        if not self.constructions:
            return found
        for loop in self.index.find(cst.For):
            for iterable, target in self.iterated(loop.iter, loop.target):
                for loader in self.sources(iterable, (), 0):
                    found.append(Feed(loader, loop, target))
        return found

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
    def sources(self, expr: cst.BaseExpression, path: tuple[int, ...], depth: int) -> list[cst.Call]:
        """The DataLoader constructions `expr` may evaluate to; `path` indexes into
        tuples on the way (`train, val = make_loaders()` takes element 0 or 1)."""
        if depth > MAX_DEPTH:
            return []
        if isinstance(expr, (cst.Tuple, cst.List)) and path:
            if path[0] >= len(expr.elements) or any(isinstance(e, cst.StarredElement) for e in expr.elements):
                return []
            return self.sources(expr.elements[path[0]].value, path[1:], depth + 1)
        if isinstance(expr, cst.Call):
            if id(expr) in self._ids:
                return [] if path else [expr]
            function = self.local_function(expr.func)
            if function is None:
                return []
            return [found for value in returned_values(function) for found in self.sources(value, path, depth + 1)]
        if isinstance(expr, cst.Name):
            return [found for source, inner in self.bound_values(expr)
                    for found in self.sources(source, inner + path, depth + 1)]
        if isinstance(expr, cst.Attribute):  # `self.train_loader`, assigned in another method
            values = self.bindings.attribute_values(expr) or []
            return [found for value in values for found in self.sources(value, path, depth + 1)]
        if isinstance(expr, cst.IfExp):
            return self.sources(expr.body, path, depth + 1) + self.sources(expr.orelse, path, depth + 1)
        return []

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
            function = self.local_function(expr.func)
            values = returned_values(function) if function is not None else []
            return bool(values) and all(self.only_loaders(value, path, depth + 1) for value in values)
        if isinstance(expr, cst.Name):
            sources = self.bound_values(expr)
            return bool(sources) and all(self.only_loaders(source, inner + path, depth + 1) for source, inner in sources)
        if isinstance(expr, cst.Attribute):
            values = self.bindings.attribute_values(expr) or []
            return bool(values) and all(self.only_loaders(value, path, depth + 1) for value in values)
        if isinstance(expr, cst.IfExp):
            return self.only_loaders(expr.body, path, depth + 1) and self.only_loaders(expr.orelse, path, depth + 1)
        return False

    def local_function(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
        return self.bindings.local_function(func)

    @memoized
    def bound_values(self, name: cst.Name) -> list[tuple[cst.BaseExpression, tuple[int, ...]]]:
        """What `name` is bound to: each assigned value (with the index `a, b = value`
        unpacks), each element of a literal it loops over, or, for a parameter, the
        argument every call of its function passes."""
        parameter = self.bindings.param_of(name)
        if parameter is not None:
            function, param = parameter
            passed = [argument_for(call, function, param) for call in self.calls_of(function)]
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

    def calls_of(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The calls of this file to `function` (by its name)."""
        if self._calls_of is None:
            defined = {f.name.value for f in self.index.find(cst.FunctionDef)}
            self._calls_of = {}
            for call in self.index.find(cst.Call):
                if isinstance(call.func, cst.Name) and call.func.value in defined:
                    target = self.local_function(call.func)
                    if target is not None:
                        self._calls_of.setdefault(id(target), []).append(call)
        return self._calls_of.get(id(function), [])

    # -- what a loop does with its batches -------------------------------------------------

    def copies_to_device(self, loop: cst.For, target: cst.BaseExpression) -> list[DeviceCopy]:
        """Each copy of the batch (bound to `target`) to a device in the loop body."""
        bound = frozenset(id(node) for node in self.index.find(cst.Name, within=target))
        found = []
        for call in own_nodes(self.index, cst.Call, loop.body):
            method = method_name(call)
            if method not in ("to", "cuda"):
                continue
            if not self.derives_from(call.func.value, bound, loop, 0):
                continue
            if method == "cuda":
                found.append(DeviceCopy(call, Place.CUDA, None))
                continue
            copy = self.kinds.copy_of(call)
            device = kwarg(call, "device") or positional(call, 0)
            if copy is not None and copy.moves_device and copy.target is not Place.HOST:
                found.append(DeviceCopy(call, copy.target, device.value if device is not None else None))
            elif copy is None and device is not None and isinstance(device.value, cst.Attribute) \
                    and DEVICE_NAME.match(device.value.attr.value):
                found.append(DeviceCopy(call, Place.UNKNOWN, device.value))  # `cfg.train_device`: named like a device
        return found

    @memoized
    def derives_from(self, expr: cst.BaseExpression, bound: frozenset, loop: cst.For, depth: int) -> bool:
        """Is `expr` (a part of) what the loop target `bound` (ids of its names) holds,
        directly or through assignments and comprehensions inside the loop?"""
        if depth > MAX_DEPTH:
            return False
        return any(self._name_derives_from(name, bound, loop, depth) for name in self._roots(expr))

    def _roots(self, expr: cst.BaseExpression) -> list[cst.Name]:
        expr = self.kinds.storage_root(expr)
        if isinstance(expr, cst.Name):
            return [expr]
        if isinstance(expr, (cst.Tuple, cst.List)):
            return [root for element in expr.elements for root in self._roots(element.value)]
        if isinstance(expr, cst.Call):
            if method_name(expr) in ("items", "values"):
                return self._roots(expr.func.value)
            if self.names.is_(expr.func, *ZIP, *ENUMERATE, "list", "builtins.list", "tuple", "builtins.tuple"):
                return [root for arg in expr.args for root in self._roots(arg.value)]
        return []

    def _name_derives_from(self, name: cst.Name, bound: frozenset, loop: cst.For, depth: int) -> bool:
        for assignment in self.bindings.assignments(name) or ():
            if id(assignment.node) in bound:
                return True
            statement = self.bindings.statement(assignment.node)
            if not self.index.inside(statement, loop.body):
                continue
            if isinstance(statement, (cst.Assign, cst.AnnAssign)) and statement.value is not None:
                source = statement.value
            elif isinstance(statement, (cst.CompFor, cst.For)):
                source = statement.iter
            else:
                continue
            if self.derives_from(source, bound, loop, depth + 1):
                return True
        return False

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

    def overridden_subclass(self, loader: cst.Call) -> bool:
        """Is `loader` built from a subclass of this file that overrides `__init__` or `__iter__`?"""
        return not self.is_torch_loader(loader) and self.subclass_overrides(self.kinds.local_class(loader.func))

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
            if self.names.is_(expr.func, "torch.load") and kwarg(expr, "map_location") is None \
                    and positional(expr, 1) is None:
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

    def collate_moves_to_device(self, loader: cst.Call) -> bool:
        arg = kwarg(loader, "collate_fn") or (
            positional(loader, COLLATE_FN_POSITION) if self.is_torch_loader(loader) else None)
        if arg is None:
            return False
        function = arg.value
        if isinstance(function, cst.Call) and self.names.is_(function.func, "functools.partial"):
            first = positional(function, 0)
            function = first.value if first is not None else function
        if isinstance(function, cst.Lambda):
            return self.moves_to_device(function.body)
        local = self.local_function(function) or self.kinds.local_class(function)
        return local is not None and self.moves_to_device(local)

    # -- what a **kwargs dict holds ----------------------------------------------------------

    @memoized
    def kwargs_literal(self, expr: cst.BaseExpression) -> tuple[cst.CSTNode, set[str], bool] | None:
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

    def star_kwargs_keys(self, loader: cst.Call) -> set[str] | None:
        """The keys of the one `**dict` the loader is built with, when they can all be seen."""
        stars = [arg for arg in loader.args if arg.star]
        if len(stars) != 1 or stars[0].star != "**":
            return None
        found = self.kwargs_literal(stars[0].value)
        return found[1] if found is not None and not found[2] else None

    def _literal_keys(self, literal) -> set[str] | None:
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


def _is_tuple_of(target: cst.BaseExpression, length: int) -> bool:
    return isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == length and not any(
        isinstance(e, cst.StarredElement) for e in target.elements
    )


def _last_name(func: cst.BaseExpression) -> str | None:
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None

"""Which DataLoaders a file builds and which loops they feed: the look-ups PM102, PM201
and PM103 share.

`LoaderLookups` is a mixin for rules: it collects, in the rule's own traversal, every
DataLoader construction (torch's, under any alias, and subclasses of this file), every
`for` loop and every call of a function of this file; a rule then asks, at
`leave_Module`, which constructions a loop's iterable may evaluate to (through names,
helper functions that build and return the loader, `self.` attributes, enumerate/zip/
tqdm), whether the dataset may hold CUDA data, and what a `**kwargs` dict holds.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from codemod.analysis.bindings import Bindings, argument_for, returned_values
from codemod.analysis.kinds import DEVICE_NAME, PASS_THROUGH_ITERABLES, Kind, Place
from codemod.analysis.loops import calls_in
from codemod.analysis.names import appended, kwarg, method_name, positional
from codemod.analysis.tree import is_inside

DATALOADER = "torch.utils.data.DataLoader"
# `DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, ...)`
NUM_WORKERS_POSITION, COLLATE_FN_POSITION, PIN_MEMORY_POSITION = 5, 6, 7
# Iterables whose items are their first argument's (PM103 writes DevicePrefetcher(loader, device)).
LOOKS_THROUGH = {"itertools.islice", "runtime.data.DevicePrefetcher", "runtime.DevicePrefetcher", *PASS_THROUGH_ITERABLES}
MAX_DEPTH = 8  # how many assignments and helper calls a look-up follows


def memoized(method):
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


class LoaderLookups:
    """Mixin for a Rule (list it before Rule): collects loaders, loops and calls while the
    rule visits, and answers the look-ups below."""

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

    @memoized
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

    @memoized
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
            if not is_inside(statement, loop.body, self.context.parents):
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

    @memoized
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

    # -- what a **kwargs dict holds ----------------------------------------------------------

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


def with_dict_entry(literal: cst.Dict, key: str, value: cst.BaseExpression) -> cst.Dict:
    """`literal` with `key: value` appended, in the quotes of its other keys and the
    layout of its entries (a trailing comma puts the entry on a line of its own)."""
    elements = literal.elements
    quote = "'" if elements and elements[0].key.value.startswith("'") else '"'
    entry = cst.DictElement(key=cst.SimpleString(f"{quote}{key}{quote}"), value=value)
    return literal.with_changes(elements=appended(elements, entry, literal.lbrace.whitespace_after))

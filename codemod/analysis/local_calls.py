"""Calls between the functions of one file, and which functions run once per call.

Training code splits a step into helpers: `collect_acts(models, ids)` registers
hooks around a forward, `loss_fn(logits, y)` computes the loss of one sample,
`self._attach_hooks(...)` is a context manager a `forward` enters. A rule that
must know how often a statement runs, or what a helper returns, follows these
calls:

- `callee(call)`: the `def` of this file a call runs (`helper(...)`,
  `self.method(...)`, `obj.method(...)` for an `obj` that holds an instance of
  one class of this file, `Kinds.instance_class`; `LocalClass(...)` runs its
  `__init__`);
- `call_sites(function)`: the calls of this file that run a function;
- `runs_per_call(function)`: the function runs again and again, once per call
  of something that repeats: it is a module's `forward`/`__call__`, or some
  call site of it sits in a loop (a comprehension too) or in such a function.

Built once per file (FileContext.shared) from the tree index: one pass over the
calls whose callee name is the name of a function of this file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis.names import sole_definition

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "local_calls"
REPEATING = (cst.For, cst.While, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
PER_CALL_METHODS = ("forward", "__call__")
MAX_DEPTH = 8


def local_calls(context: FileContext) -> LocalCalls:
    return context.shared(KEY, LocalCalls)


class LocalCalls:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.index = context.index
        self._names = {f.name.value for f in self.index.find(cst.FunctionDef)}
        self._callees: dict[cst.Call, cst.FunctionDef | None] = {}
        self._sites: dict[cst.FunctionDef, list[cst.Call]] | None = None
        self._per_call: dict[cst.FunctionDef, bool] = {}

    # -- calls ---------------------------------------------------------------------------

    def callee(self, call: cst.Call) -> cst.FunctionDef | None:
        """The function of this file that `call` runs, when the code shows which."""
        if call in self._callees:
            return self._callees[call]
        found = None
        func = call.func
        if isinstance(func, cst.Name):
            if func.value in self._names:
                found = sole_definition(self.context.scopes, func, cst.FunctionDef)
            if found is None and "__init__" in self._names:
                cls = sole_definition(self.context.scopes, func, cst.ClassDef)
                found = self.method(cls, "__init__") if cls is not None else None
        elif isinstance(func, cst.Attribute) and func.attr.value in self._names:
            cls = self.context.kinds.instance_class(func.value)
            found = self.method(cls, func.attr.value) if cls is not None else None
        self._callees[call] = found
        return found

    def method(self, cls: cst.ClassDef, name: str, depth: int = 0) -> cst.FunctionDef | None:
        """The method `name` of `cls`, or of its first base class of this file that defines it."""
        if depth > MAX_DEPTH:
            return None
        for statement in cls.body.body:  # a one-line class body holds no `def`
            if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
                return statement
        for base in cls.bases:
            parent = sole_definition(self.context.scopes, base.value, cst.ClassDef)
            found = self.method(parent, name, depth + 1) if parent is not None else None
            if found is not None:
                return found
        return None

    def call_sites(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The calls of this file that run `function`."""
        if self._sites is None:
            self._sites = {}
            for call in self.index.find(cst.Call):
                func = call.func
                name = (
                    func.value
                    if isinstance(func, cst.Name)
                    else func.attr.value
                    if isinstance(func, cst.Attribute)
                    else None
                )
                if name is None:
                    continue
                target = self.callee(call)
                if target is not None:
                    self._sites.setdefault(target, []).append(call)
        return self._sites.get(function, [])

    # -- how often code runs ---------------------------------------------------------------

    def runs_per_call(self, function: cst.FunctionDef) -> bool:
        """Does `function` run once per call of something that repeats?"""
        if function in self._per_call:
            return self._per_call[function]
        self._per_call[function] = False  # recursion: not through this path
        found = function.name.value in PER_CALL_METHODS and self._is_method(function)
        if not found:
            found = any(self.repeats(site) for site in self.call_sites(function))
        self._per_call[function] = found
        return found

    def repeats(self, node: cst.CSTNode) -> bool:
        """Does `node` run again and again: in a loop or comprehension of its function,
        or in a function that runs per call?"""
        child = node
        for ancestor in self.index.ancestors(node):
            if isinstance(ancestor, REPEATING) and _repeated_part(ancestor, child):
                return True
            child = ancestor
            if isinstance(ancestor, cst.FunctionDef):
                return self.runs_per_call(ancestor)
            if isinstance(ancestor, (cst.Lambda, cst.ClassDef)):
                return False
        return False

    def _is_method(self, function: cst.FunctionDef) -> bool:
        return isinstance(self.index.parents.get(self.index.parents.get(function)), cst.ClassDef)


def _repeated_part(loop: cst.CSTNode, child: cst.CSTNode) -> bool:
    """Is `child` (a direct child of `loop`) a part that runs once per iteration?"""
    if isinstance(loop, cst.For):
        return child is loop.body
    if isinstance(loop, cst.While):
        return child is loop.body or child is loop.test
    return child is not loop.for_in  # a comprehension: all but its first iterable's `for ... in`

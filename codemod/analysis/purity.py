"""Which functions and methods of this file, and functions of the project's other
modules, are pure: a call's result depends on its arguments alone, and the call
changes nothing another statement can see. Such a call may be made once instead of
once per step, or in another order.

A function is pure when its body:
- reads its parameters, its own locals, builtins, and module-level functions,
  classes and imports; through `self`, only attributes that nothing assigns or
  changes outside `__init__` (anywhere in the file, under any owner: a change
  `obj.vocab[w] = 1` to another object of the class counts too);
- calls pure builtins, read-only methods of Python's strings and containers,
  torch's functions and tensor methods that draw no random number and write
  nothing in place (`torch.eye`, `x.sum(dim=1).pow(-0.5)`), pure functions of
  this file or of the project's other modules, and pure methods of its own class;
- changes only containers it made itself (`ids = []; ids.append(...)`);
- has no `global`, `nonlocal`, `yield`, `await`, `try`, `with`, `raise`, `del`,
  nested `def`, `class` or `lambda`.
Anything else (a call perfmod cannot follow, printing, randomness) makes it impure.
A function that calls itself is taken as impure (the answer is not assumed).

A function of another module of the project (`from pkg.utils import split_prompt`)
is pure when the same rules hold in its own module, read by that module's own
analysis; its module's functions are followed a few modules deep (`project`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import Assignment, BuiltinAssignment, ImportAssignment

from codemod.analysis.names import method_name
from codemod.analysis.project import project_of
from codemod.analysis.torch_facts import (
    ITERATOR_BUILTINS,
    MUTATING_METHODS,
    PURE_BUILTINS,
    PURE_TENSOR_METHODS,
    PURE_TORCH_FUNCTIONS,
    READ_ONLY_METHODS,
)

if TYPE_CHECKING:
    from codemod.context import FileContext

FORBIDDEN = (
    cst.Global,
    cst.Nonlocal,
    cst.Yield,
    cst.Await,
    cst.Try,
    cst.With,
    cst.Raise,
    cst.Del,
    cst.FunctionDef,
    cst.ClassDef,
    cst.Lambda,
)
FRESH = (cst.List, cst.Dict, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp)  # a container the code makes


class Purity:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self._pure: dict[int, bool] = {}
        self._changed: set[str] | None = None

    def is_pure(self, function: cst.FunctionDef) -> bool:
        key = id(function)
        if key not in self._pure:
            self._pure[key] = False  # while it is worked out: a call of itself is not assumed pure
            self._pure[key] = self._compute(function)
        return self._pure[key]

    def pure_call(self, call: cst.Call) -> bool:
        """Does `call` compute from its arguments alone and change nothing (a pure builtin,
        or a pure function or method of this file or function of the project)? Its
        arguments are not looked at."""
        if self.context.names.of(call.func) & (PURE_BUILTINS | ITERATOR_BUILTINS):
            return True
        return self.pure_callee(call)

    def pure_callee(self, call: cst.Call) -> bool:
        """Is the callee of `call` a pure function or method of this file, or a pure
        function of another module of the project?"""
        callee = self.context.kinds.local_callee(call)
        if callee is not None:
            return self.is_pure(callee)
        return project_of(self.context).pure(call.func)

    def side_effect_free(self, expr: cst.BaseExpression) -> bool:
        """Does evaluating `expr` change nothing and draw no random numbers, so that code
        whose value nobody reads may go? Its calls are pure ones, torch operations that
        neither draw from the RNG nor write in place, and read-only methods."""
        if self.context.index.find((cst.NamedExpr, cst.Yield, cst.Await), within=expr):
            return False
        return all(self._side_effect_free_call(call) for call in self.context.index.find(cst.Call, within=expr))

    def _side_effect_free_call(self, call: cst.Call) -> bool:
        if self.pure_call(call) or self.context.names.of(call.func) & PURE_TORCH_FUNCTIONS:
            return True
        method = method_name(call)
        return method is not None and (method in PURE_TENSOR_METHODS or method in READ_ONLY_METHODS)

    def _compute(self, function: cst.FunctionDef) -> bool:
        index = self.context.index
        body = function.body
        if index.find(FORBIDDEN, within=body) or function.asynchronous is not None:
            return False
        scope = self.context.scopes.get(body)
        if scope is None:
            return False
        owner = _owner(function, self.context)
        fresh = self._fresh_locals(function, scope)
        for name in index.find(cst.Name, within=body):
            if not self._readable(name, function, owner):
                return False
        for call in index.find(cst.Call, within=body):
            if not self._allowed_call(call, owner, fresh):
                return False
        for target in _assignment_targets(index, body):
            if not (isinstance(target, cst.Name) or _root_name(target) in fresh):
                return False
        return True

    def _readable(self, name: cst.Name, function: cst.FunctionDef, owner: str | None) -> bool:
        parent = self.context.parents.get(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            if isinstance(parent.value, cst.Name) and parent.value.value == owner:
                return name.value not in self._changed_attributes()
            return True  # an attribute of something else: its owner is what is checked
        if isinstance(parent, cst.Arg) and parent.keyword is name:
            return True
        scope = self.context.scopes.get(name)
        found = scope[name.value] if scope is not None and name.value in scope else set()
        if not found:
            return name.value in ("True", "False", "None")
        for binding in found:
            if isinstance(binding, (BuiltinAssignment, ImportAssignment)):
                continue
            if not isinstance(binding, Assignment):
                return False
            if self.context.index.inside(binding.node, function):
                continue  # a parameter, a local, a comprehension's variable
            if not isinstance(binding.node, (cst.FunctionDef, cst.ClassDef)):
                return False  # a module-level variable: it may change between calls
        return True

    def _allowed_call(self, call: cst.Call, owner: str | None, fresh: set[str]) -> bool:
        if self.pure_call(call) or self.context.names.of(call.func) & PURE_TORCH_FUNCTIONS:
            return True  # (torch's functions that draw no random number and write nothing in place)
        method = method_name(call)
        if method is None:
            return False
        receiver = call.func.value
        if isinstance(receiver, cst.Name) and receiver.value == owner:
            return False  # a method of its own class that is not pure (pure ones are taken above)
        if method in READ_ONLY_METHODS or method in PURE_TENSOR_METHODS:
            return True
        return method in MUTATING_METHODS and _root_name(receiver) in fresh

    def _fresh_locals(self, function: cst.FunctionDef, scope) -> set[str]:
        """Locals every binding of which makes a new container here."""
        bindings = self.context.bindings
        fresh: dict[str, bool] = {}
        for assignment in scope.assignments:
            if isinstance(assignment, Assignment) and assignment.scope is scope:
                value = bindings.assigned_value(assignment)
                made = isinstance(value, FRESH) or (
                    isinstance(value, cst.Call) and bool(self.context.names.of(value.func) & PURE_BUILTINS)
                )
                fresh[assignment.name] = fresh.get(assignment.name, True) and made
        return {name for name, made in fresh.items() if made}

    def _changed_attributes(self) -> set[str]:
        """Attribute names assigned, deleted or changed in place anywhere in the file
        outside an `__init__`."""
        if self._changed is None:
            index = self.context.index
            changed = set()
            for target in _assignment_targets(index, self.context.module):
                attribute = _attribute_under(target)
                if attribute is not None and not _in_init(index, target):
                    changed.add(attribute)
            for delete in index.find(cst.Del, within=self.context.module):
                attribute = _attribute_under(delete.target)
                if attribute is not None:
                    changed.add(attribute)
            for call in index.find(cst.Call, within=self.context.module):
                method = method_name(call)
                if method is None or not (method in MUTATING_METHODS or method.endswith("_")):
                    continue
                attribute = _attribute_under(call.func.value)
                if attribute is not None and not _in_init(index, call):
                    changed.add(attribute)
            self._changed = changed
        return self._changed


def _owner(function: cst.FunctionDef, context: FileContext) -> str | None:
    """The name of `self` when `function` is a method (not a static or class method)."""
    block = context.parents.get(function)
    classdef = context.parents.get(block) if isinstance(block, cst.IndentedBlock) else None
    if not isinstance(classdef, cst.ClassDef) or not function.params.params:
        return None
    if any(
        isinstance(d.decorator, cst.Name) and d.decorator.value in ("staticmethod", "classmethod")
        for d in function.decorators
    ):
        return None
    return function.params.params[0].name.value


def _assignment_targets(index, within: cst.CSTNode) -> list[cst.BaseExpression]:
    """What the assignments and loops within `within` bind, tuples unpacked (`i, c` of
    `for i, c in ...` gives `i` and `c`)."""
    pending: list[cst.BaseExpression] = []
    for statement in index.find((cst.Assign, cst.AugAssign, cst.AnnAssign, cst.NamedExpr), within=within):
        if isinstance(statement, cst.Assign):
            pending.extend(t.target for t in statement.targets)
        else:
            pending.append(statement.target)
    pending.extend(loop.target for loop in index.find((cst.For, cst.CompFor), within=within))
    targets: list[cst.BaseExpression] = []
    while pending:
        target = pending.pop()
        if isinstance(target, (cst.Tuple, cst.List)):
            pending.extend(e.value for e in target.elements)
        elif isinstance(target, cst.StarredElement):
            pending.append(target.value)
        else:
            targets.append(target)
    return targets


def _root_name(expr: cst.BaseExpression) -> str | None:
    """`ids` for `ids`, `ids[0]`, `ids.data[1:]`."""
    while isinstance(expr, (cst.Subscript, cst.Attribute)):
        expr = expr.value
    return expr.value if isinstance(expr, cst.Name) else None


def _attribute_under(expr: cst.BaseExpression) -> str | None:
    """The outermost attribute name an assignment or change to `expr` goes through:
    `vocab` for `self.vocab`, `obj.vocab[w]`, `self.vocab.data`."""
    found = None
    while isinstance(expr, (cst.Subscript, cst.Attribute)):
        if isinstance(expr, cst.Attribute):
            found = expr.attr.value
        expr = expr.value
    return found


def _in_init(index, node: cst.CSTNode) -> bool:
    function = index.first_enclosing(node, (cst.FunctionDef, cst.Lambda))
    return isinstance(function, cst.FunctionDef) and function.name.value == "__init__"

"""Where a name gets its value: the assignments, functions and returns behind a
use, for rules that must look at the expression a variable was built from
(the dict behind `**loader_kwargs`, the DataLoader a helper returns, the
parameter groups an optimizer is built from).

Unlike `Kinds`, which summarises an expression as a fact, these helpers hand
back the syntax itself, so a rule can inspect or rewrite it.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import Assignment

from codemod.analysis.index import TreeIndex
from codemod.analysis.names import names_read, sole_definition
from codemod.analysis.node_types import type_test
from codemod.analysis.scopes import PerBindings, binding_prefix, reads_of

# Nodes between a bound Name and the statement that binds it, and the other type tests
# every binding look-up makes (codemod.analysis.node_types says why they are not isinstance).
_is_target_wrapper = type_test(
    cst.Tuple, cst.List, cst.Element, cst.StarredElement, cst.AssignTarget, cst.AsName, cst.WithItem
)
_is_assignment = type_test(Assignment)
_is_assign, _is_assign_target = type_test(cst.Assign), type_test(cst.AssignTarget)
_is_ann_assign = type_test(cst.AnnAssign)


class Bindings:
    """Binding look-ups for one file, on the metadata the rules already have."""

    def __init__(self, scopes, index: TreeIndex) -> None:
        self.scopes = scopes
        self.index = index
        self.parents = index.parents
        self._values = PerBindings()  # the values a name's bindings assign

    def assignments(self, name: cst.Name) -> list[Assignment] | None:
        """The bindings of `name` visible where it is used; None when there are none
        or when one is not an assignment in this file (an import, a builtin)."""
        scope = self.scopes.get(name)
        if scope is None:
            return None
        found = list(scope[name.value])
        if not found or not all(type(a) is Assignment for a in found):
            return None
        return found

    def statement(self, target: cst.CSTNode) -> cst.CSTNode:
        """The Assign / For / CompFor / With / FunctionDef ... that binds `target`."""
        current = target
        while True:
            parent = self.parents.get(current)
            if parent is None or not _is_target_wrapper(parent):
                return parent if parent is not None else current
            current = parent

    def assigned_value(self, assignment: Assignment) -> cst.BaseExpression | None:
        """`value` of a plain `name = value` (or `name: T = value`) binding; see
        `unpacked` for `a, b = value`."""
        target = assignment.node
        statement = self.statement(target)
        if _is_assign(statement):
            single = _is_assign_target(self.parents.get(target)) and len(statement.targets) == 1
            return statement.value if single else None
        if _is_ann_assign(statement) and statement.target is target:
            return statement.value
        return None

    def unpacked(self, assignment: Assignment) -> tuple[cst.BaseExpression, int] | None:
        """(value, index) for a name bound by one level of unpacking, `a, b = value`."""
        element = self.parents.get(assignment.node)
        if not isinstance(element, cst.Element):
            return None
        container = self.parents.get(element)
        target = self.parents.get(container)
        statement = self.parents.get(target)
        if not (
            isinstance(container, (cst.Tuple, cst.List))
            and isinstance(target, cst.AssignTarget)
            and isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
        ):
            return None
        if any(isinstance(e, cst.StarredElement) for e in container.elements):
            return None
        return statement.value, list(container.elements).index(element)

    def values(self, name: cst.Name) -> list[cst.BaseExpression] | None:
        """The values every binding of `name` assigns; None unless all are plain assignments."""
        scope = self.scopes.get(name)
        if scope is None:
            return None

        def compute(_) -> list[cst.BaseExpression] | None:
            found = self.assignments(name)
            values = None if found is None else [self.assigned_value(a) for a in found]
            return None if values is None or any(v is None for v in values) else values

        known = self._values.get(scope[name.value], compute)  # a name bound N times costs N once
        return list(known) if known is not None else None

    def local_function(self, expr: cst.BaseExpression) -> cst.FunctionDef | None:
        """The `def` of this file that `expr` (a Name) calls, when it is the only binding."""
        return sole_definition(self.scopes, expr, cst.FunctionDef)

    def parameters_reached(self, node: cst.CSTNode, function: cst.FunctionDef) -> list[str]:
        """The parameters of `function` whose values `node` reads, sorted: directly, or
        through the names bound in `function` that it reads, by the values and loop
        iterables that bind them (`for name, hook in hooks.items():` reads `hooks`)."""
        params = {p.name.value for p in (*function.params.params, *function.params.kwonly_params)}
        found: set[str] = set()
        todo, seen = list(names_read(node)), set()
        while todo:
            name = todo.pop()
            if name.value in seen:
                continue
            seen.add(name.value)
            if name.value in params:
                found.add(name.value)
                continue
            scope = self.scopes.get(name)
            if scope is None or name.value not in scope.assignments:
                continue
            for assignment in scope.assignments[name.value]:
                target = assignment.node
                if not isinstance(target, cst.Name) or not self._inside(target, function):
                    continue
                holder = self.statement(target)
                if isinstance(holder, cst.For):
                    todo += names_read(holder.iter)
                elif isinstance(holder, (cst.Assign, cst.AnnAssign)) and holder.value is not None:
                    todo += names_read(holder.value)
        return sorted(found)

    def _inside(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        while node is not None and node is not ancestor:
            node = self.parents.get(node)
        return node is ancestor

    def bound_once_where(self, name: cst.Name, at: cst.CSTNode) -> bool:
        """Is `name` bound once, in the scope `at` is in too, so that it means the same
        there (not another function's name, nor one bound again)?"""
        scope = self.scopes.get(name)
        return scope is not None and scope is self.scopes.get(at) and len(scope[name.value]) == 1

    def prefix_binding(self, statements: list[cst.BaseStatement], names: list[str]) -> int:
        """How many of `statements`, a block, must run before new code at its top can read
        `names`: through the last one that binds one of them in the block's own scope (a
        function's own `import torch` makes `torch` local to it); 0 when none does."""
        scope = self.scopes.get(statements[0])
        return binding_prefix(statements, names, scope, self.index) if scope is not None else 0

    def attribute_assignments(self, attribute: cst.Attribute) -> list[cst.BaseExpression]:
        """The values every `x.attr = value` of the file assigns to an attribute spelled as
        `attribute` is (`args.cuda = torch.cuda.is_available()` for `args.cuda`)."""
        code = self.index.module.code_for_node(attribute)
        return [
            assign.value
            for assign in self.index.find(cst.Assign)
            if len(assign.targets) == 1 and self.index.module.code_for_node(assign.targets[0].target) == code
        ]

    def variable(self, name: cst.Name) -> tuple:
        """The variable `name` names, as a key: the same for every binding and read of it
        (its scope and spelling), to remember which variables are being followed."""
        return (self.scopes.get(name), name.value)

    def name_bindings(self, name: cst.Name) -> list[Assignment] | None:
        """The bindings of the variable `name` in the scope it is used in (not an enclosing
        one's), each of a plain name (`x = ...`, `for x in ...`, `with ... as x`); None when
        it is not resolved, or one binds it otherwise (a parameter, an import, a `def`)."""
        scope = self.scopes.get(name)
        if scope is None:
            return None
        found = list(scope.assignments[name.value])
        return found if all(isinstance(a.node, cst.Name) for a in found) else None

    def reads(self, name: cst.Name) -> list[cst.CSTNode] | None:
        """Every read of the variable `name` that one of its `name_bindings` may reach, each
        once; None when `name_bindings` is None."""
        found = self.name_bindings(name)
        return None if found is None else [access.node for access in reads_of(found)]

    def param_of(self, name: cst.Name) -> tuple[cst.FunctionDef, cst.Param] | None:
        """The function and parameter `name` is bound to, when that is its only binding."""
        scope = self.scopes.get(name)
        if scope is None:
            return None
        found = [a.node for a in scope[name.value] if _is_assignment(a)]
        if len(found) != 1 or not isinstance(found[0], cst.Param):
            return None
        function = self.parents.get(self.parents.get(found[0]))
        return (function, found[0]) if isinstance(function, cst.FunctionDef) else None


def returned_values(function: cst.FunctionDef) -> list[cst.BaseExpression]:
    """The expressions `function` returns (not those of functions nested in it)."""
    collector = _ReturnCollector()
    function.body.visit(collector)
    return collector.values


@dataclass(frozen=True)
class Partial:
    """How a call of a `functools.partial(function, *args, **keywords)` object calls
    `function`: the partial's arguments come before the call's own, and a keyword the
    call passes replaces the one the partial binds (`made`: the partial constructions,
    innermost first for a partial of a partial); `offset`: the parameters the function's
    receiver fills (1 for `partial(self.step, ...)`)."""

    made: tuple[cst.Call, ...]
    offset: int = 0

    def arguments(self, call: cst.Call) -> list[cst.Arg]:
        return [arg for made in self.made for arg in made.args[1:]] + list(call.args)


def argument_for(
    call: cst.Call, function: cst.FunctionDef, param: cst.Param, offset: int | Partial = 0
) -> cst.BaseExpression | None:
    """What `call` passes to `param` of `function`: by keyword, or by position, the
    first `offset` parameters being filled by the call itself (`self` of a method), or
    after the arguments of the partial it calls (`Partial`); None when `*args`/`**kwargs`
    at the call hide it, or when it is not passed."""
    args = call.args
    if isinstance(offset, Partial):
        args, offset = offset.arguments(call), offset.offset
    for arg in reversed(args):  # the last keyword of a name: the call's over its partial's
        if arg.keyword is not None and arg.keyword.value == param.name.value:
            return arg.value
    positional_params = [*function.params.posonly_params, *function.params.params][offset:]
    if param not in positional_params:
        return None
    index = positional_params.index(param)
    plain = []
    for arg in args:
        if arg.star:
            return None
        if arg.keyword is None:
            plain.append(arg.value)
    return plain[index] if index < len(plain) else None


def passed_by(
    call: cst.Call, function: cst.FunctionDef, param: cst.Param, offset: int | Partial = 0
) -> cst.BaseExpression | None:
    """What `param` of `function` holds when `call` runs it: the argument the call passes
    (`argument_for`), else the parameter's default; None where a `*args` / `**kwargs` of
    the call (or of its partial) may pass it or it has no default."""
    argument = argument_for(call, function, param, offset)
    if argument is not None:
        return argument
    args = offset.arguments(call) if isinstance(offset, Partial) else call.args
    if param.default is None or any(arg.star for arg in args):
        return None
    return param.default


class _ReturnCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.values: list[cst.BaseExpression] = []

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            self.values.append(node.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

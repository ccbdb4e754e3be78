"""The tables of small networks a model class holds and its methods call: `self.ci_fns`,
a dict (or `nn.ModuleDict`, a list, an `nn.ModuleList`) that `__init__` fills once with
instances of network classes, indexed and called by a method the training step calls
(`ci_fn = self.ci_fns[name]; ci_fn(x)`), and whether each network can be compiled in
place (`net.compile()`, which keeps the object, its class and its state_dict keys).

The class, the function that builds the table and the network classes are read in the
module that defines them, followed into the project's modules (`project.class_of`).
A table is compilable when:
- `__init__` is the only place that assigns `self.<table>` and nothing stores into it
  after (a network put there later would run in eager mode, or replace a compiled one);
- what it holds can be told: each member is built by a class of the project (through
  the helpers that build the table and its members), not something perfmod cannot read;
- no hook reaches it: no registration in its module whose module cannot be followed,
  on the table, or inside a network class;
- the forward of each network, and of the networks it builds, compiles to one reused
  graph (`compilability.forward_of`: no branch on a tensor's values, no `.item()`, no
  write to the module's own state) and draws no random numbers (compiled code draws
  other ones).

It also reads, for a model the step runs, the networks its `__init__` builds that a
compile in place can reach (`model_parts`), and for a table built in the training file
whether it holds networks (`holds_networks`), is only indexed and called (`held_only`) and
whether the file stores into it or hooks it (`table_touched`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.compilability import forward_of
from codemod.analysis.hook_sites import hook_sites
from codemod.analysis.names import is_self, method_name, methods_of, sole_definition
from codemod.analysis.torch_facts import (
    HOOK_REGISTRATIONS,
    MODULE_CONTAINERS,
    MODULE_METHODS,
    MODULE_TABLES,
    SEQUENTIAL_MODULES,
)

if TYPE_CHECKING:
    from codemod.context import FileContext

MAX_DEPTH = 4  # helpers followed from the table's assignment to the classes of its members


class NetworkTable(NamedTuple):
    attribute: str  # `ci_fns`: the attribute of the model that holds the table
    kind: str  # "dict" (its networks are its `.values()`) or "list"
    caller: str  # the method of the model that calls its networks
    networks: tuple[str, ...]  # the classes of its networks
    obstacle: str | None  # why its networks are not compiled in place; None: they can be


def called_tables(context: FileContext, classdef: cst.ClassDef, methods: list[str]) -> list[NetworkTable]:
    """The network tables of `classdef` (a class of `context`'s module) that `methods`, or the
    methods of the class they call, call the members of."""
    own = methods_of(classdef)
    called: dict[str, str] = {}
    todo, seen = [name for name in methods if name in own], set()
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        for call in context.index.find(cst.Call, within=own[name]):
            func = call.func
            if is_self(func.value if isinstance(func, cst.Attribute) else None) and func.attr.value in own:
                todo.append(func.attr.value)
            attribute = _table_read(context, func)
            if attribute is not None:
                called.setdefault(attribute, name)
    return [_table(context, classdef, own, attribute, caller) for attribute, caller in called.items()]


def _self_attribute(expr: cst.BaseExpression) -> str | None:
    """`x` for `self.x`."""
    if isinstance(expr, cst.Attribute) and is_self(expr.value):
        return expr.attr.value
    return None


def _table_read(context: FileContext, func: cst.BaseExpression) -> str | None:
    """The attribute `self.<attribute>[k]` that the callee `func` is a member of, directly or
    through a local name every binding of which reads one."""
    if isinstance(func, cst.Subscript):
        return _self_attribute(func.value)
    if isinstance(func, cst.Name):
        values = context.bindings.values(func) or []
        found = {_self_attribute(v.value) if isinstance(v, cst.Subscript) else None for v in values}
        if len(found) == 1 and None not in found:
            return found.pop()
    return None


def _table(context, classdef, own, attribute: str, caller: str) -> NetworkTable:
    def table(kind: str = "dict", networks: tuple[str, ...] = (), obstacle: str | None = None) -> NetworkTable:
        return NetworkTable(attribute, kind, caller, networks, obstacle)

    init = own.get("__init__")
    assigned, stored = [], []
    for node in context.index.find((cst.Assign, cst.AugAssign, cst.AnnAssign), within=classdef):
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        for target in targets:
            if _self_attribute(target) == attribute:
                assigned.append(node)
            elif isinstance(target, cst.Subscript) and _self_attribute(target.value) == attribute:
                stored.append(node)
    if len(assigned) != 1 or init is None or not context.index.inside(assigned[0], init):
        where = next((a for a in assigned if init is None or not context.index.inside(a, init)), None)
        return table(
            obstacle=f"`self.{attribute}` is assigned again ({_at(context, where)})"
            if where is not None
            else f"`self.{attribute}` is not assigned once in `__init__`"
        )
    if stored:
        return table(
            obstacle=f"a network is stored into `self.{attribute}` after it is built ({_at(context, stored[0])})"
        )
    for call in context.index.find(cst.Call, within=classdef):
        if method_name(call) in ("update", "append", "extend", "insert", "setdefault", "pop", "clear") and (
            _self_attribute(call.func.value) == attribute
        ):
            return table(obstacle=f"`self.{attribute}` is changed after it is built ({_at(context, call)})")
    members = _members(context, classdef, assigned[0].value, 0)
    if members is None:
        return table(obstacle=f"perfmod cannot tell which networks `self.{attribute}` holds")
    kind, classes = members
    names = tuple(sorted({c.name.value if isinstance(c, cst.ClassDef) else context.source(c.func) for _, c in classes}))
    for site in hook_sites(context):
        if site.root is None:
            return table(
                kind, names, f"a hook is registered on a module perfmod cannot follow ({_at(context, site.call)})"
            )
        if site.root == "self" and site.owner is classdef and site.path[:1] == (attribute,):
            return table(kind, names, f"a hook is registered on its networks ({_at(context, site.call)})")
    for module_context, network in classes:
        reason = forward_of(module_context, network).first
        if reason is not None:
            return table(kind, names, reason)
    return table(kind, names)


def _members(context, classdef, value, depth) -> tuple[str, list] | None:
    """("dict" or "list", [(context, class)] of the networks) that `value`, the table's value,
    holds; None when one member cannot be told."""
    if depth > MAX_DEPTH or value is None:
        return None
    if isinstance(value, cst.Dict):
        items = [e.value for e in value.elements if isinstance(e, cst.DictElement)]
        return _classes_of("dict", context, classdef, items, depth) if len(items) == len(value.elements) else None
    if isinstance(value, cst.DictComp):
        return _classes_of("dict", context, classdef, [value.value], depth)
    if isinstance(value, cst.List):
        return _classes_of("list", context, classdef, [e.value for e in value.elements], depth)
    if isinstance(value, cst.ListComp):
        return _classes_of("list", context, classdef, [value.elt], depth)
    if isinstance(value, cst.Name):
        return _name_members(context, classdef, value, depth)
    if isinstance(value, cst.Call):
        return _call_members(context, classdef, value, depth)
    return None


def _name_members(context, classdef, name: cst.Name, depth) -> tuple[str, list] | None:
    """`_members` of a name bound once: those of its value, and those the function that made
    it stores into it (`tables[k] = Net(...)`, `tables.append(Net(...))`)."""
    values = context.bindings.values(name)
    if not values or len(values) != 1:
        return None
    found = _members(context, classdef, values[0], depth + 1)
    if found is None:
        return None
    kind, classes = found
    more = _classes_of(kind, context, classdef, _stored_into(context, name), depth)
    return None if more is None else (kind, classes + more[1])


def _stored_into(context, name: cst.Name) -> list[cst.BaseExpression]:
    """The values the function that binds `name` stores into it: `name[k] = value`,
    `name.append(value)`."""
    function = context.index.first_enclosing(name, cst.FunctionDef)
    items = [
        node.value
        for node in context.index.find(cst.Assign, within=function)
        if any(isinstance(t.target, cst.Subscript) and _is_name(t.target.value, name.value) for t in node.targets)
    ]
    appended = [
        call.args[0].value
        for call in context.index.find(cst.Call, within=function)
        if method_name(call) == "append" and _is_name(call.func.value, name.value) and call.args
    ]
    return items + appended


def _call_members(context, classdef, call: cst.Call, depth) -> tuple[str, list] | None:
    """`_members` of a call: a module table built from a value (`nn.ModuleDict(tables)`), or a
    helper of the class or module whose every return holds the same kind of table."""
    table = next((MODULE_TABLES[n] for n in context.names.of(call.func) if n in MODULE_TABLES), None)
    if table is not None:
        if not call.args:
            return (table, [])
        inner = _members(context, classdef, call.args[0].value, depth + 1)
        return None if inner is None else (table, inner[1])
    function = _function(context, classdef, call.func)
    returns = [r.value for r in context.index.find(cst.Return, within=function)] if function is not None else []
    if not returns:
        return None
    kinds, classes = set(), []
    for returned in returns:
        found = _members(context, classdef, returned, depth + 1)
        if found is None:
            return None
        kinds.add(found[0])
        classes += found[1]
    return (kinds.pop(), classes) if len(kinds) == 1 else None


def _is_name(expr: cst.BaseExpression, name: str) -> bool:
    return isinstance(expr, cst.Name) and expr.value == name


def _classes_of(kind, context, classdef, items, depth) -> tuple[str, list] | None:
    """The network classes that each of `items` (a member's value) builds: a class of the
    project, or what a helper of the class or module returns."""
    classes = []
    for item in items:
        if not isinstance(item, cst.Call):
            return None
        if context.names.of(item.func) & SEQUENTIAL_MODULES:  # `nn.Sequential(nn.Linear(...), nn.GELU(), ...)`
            classes.append((context, item))
            continue
        found = _class(context, item.func)
        if found is not None:
            classes.append(found)
            continue
        function = _function(context, classdef, item.func)
        if function is None or depth > MAX_DEPTH:
            return None
        for returned in context.index.find(cst.Return, within=function):
            inner = _classes_of(kind, context, classdef, [returned.value], depth + 1)
            if inner is None:
                return None
            classes += inner[1]
    return kind, classes


def _class(context, func) -> tuple[FileContext, cst.ClassDef] | None:
    local = sole_definition(context.scopes, func, cst.ClassDef)
    if local is not None:
        return context, local
    from codemod.analysis.project import project_of

    return project_of(context).class_of(func)


def _function(context, classdef, func) -> cst.FunctionDef | None:
    """The helper `func` names: a method of the class (`self._make`, `Model._make`) or a
    function of the module."""
    if isinstance(func, cst.Attribute) and (
        is_self(func.value) or sole_definition(context.scopes, func.value, cst.ClassDef) is classdef
    ):
        return methods_of(classdef).get(func.attr.value)
    return sole_definition(context.scopes, func, cst.FunctionDef)


def _at(context, node: cst.CSTNode) -> str:
    """`path:line` of `node`, the path relative to the project's root."""
    from codemod.analysis.project import project_of

    return project_of(context).shown_in(context, node)


# -- the networks a model holds, read where the step runs it ----------------------------------


def holds_networks(context, table: cst.Call) -> bool:
    """Does the `nn.ModuleDict` / `nn.ModuleList` call `table` hold networks of several
    layers (`nn.Sequential(...)`, a class of this file), not single torch layers, whose
    compile would fuse nothing?"""
    networks = [
        call
        for call in context.index.find(cst.Call, within=table)
        if call is not table
        and (context.names.of(call.func) & MODULE_CONTAINERS or context.kinds.local_class(call.func) is not None)
    ]
    return bool(networks)


def table_obstacle(context, table: cst.Call) -> str | None:
    """Why the networks of classes of this file that the `nn.ModuleDict` / `nn.ModuleList`
    call `table` holds do not each compile to one reused graph without a random draw
    (`compilability.forward_of`); None when they do."""
    for call in context.index.find(cst.Call, within=table):
        network = context.kinds.local_class(call.func)
        if network is not None:
            reason = forward_of(context, network).first
            if reason is not None:
                return reason
    return None


def held_only(context, name: cst.Name) -> bool:
    """Is the table `name` only indexed and called (`name[k](x)`) or asked for what a module
    has (`name.parameters()`, `name.to(device)`)? Then no code can reach its networks to hook
    them but through those reads."""
    assignments = context.bindings.assignments(name)
    if not assignments or len(assignments) != 1:
        return False
    parents = context.parents
    for access in assignments[0].references:
        node = access.node
        parent = parents.get(node)
        if isinstance(parent, cst.Subscript) and parent.value is node:
            call = parents.get(parent)
            if not (isinstance(call, cst.Call) and call.func is parent):
                return False
        elif not (
            isinstance(parent, cst.Attribute)
            and parent.value is node
            and parent.attr.value in MODULE_METHODS
            and parent.attr.value not in HOOK_REGISTRATIONS
            and parent.attr.value not in ("modules", "children", "named_modules", "named_children", "apply")
        ):
            return False
    return True


def model_parts(context, cls: cst.ClassDef) -> list[tuple[str, cst.Call, str]]:
    """(attribute, its value, "module" / "dict" / "list") for each network that the
    class's `__init__` builds into `self.<attribute>` (an `nn.Sequential`, a class of
    this file, an `nn.ModuleDict` or `nn.ModuleList`) and its other methods read."""
    methods = methods_of(cls)
    init = methods.get("__init__")
    if init is None or "forward" not in methods:
        return []
    index, names = context.index, context.names
    read = {  # read by a method other than `__init__`: the forward, or what the step calls besides
        a.attr.value
        for method in methods.values()
        if method is not init
        for a in index.find(cst.Attribute, within=method)
        if m.matches(a.value, m.Name("self"))
    }
    found, assigned = [], {}
    for assign in index.find(cst.Assign, within=cls):
        for target in assign.targets:
            if m.matches(target.target, m.Attribute(value=m.Name("self"))):
                key = target.target.attr.value
                assigned[key] = assigned.get(key, 0) + 1
    for assign in index.find(cst.Assign, within=init):
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        value = assign.value
        if not (m.matches(target, m.Attribute(value=m.Name("self"))) and isinstance(value, cst.Call)):
            continue
        attribute = target.attr.value
        if attribute not in read or assigned.get(attribute) != 1:
            continue
        qualified = names.of(value.func)
        kind = next((MODULE_TABLES[q] for q in sorted(qualified) if q in MODULE_TABLES), None)
        if kind is None and (qualified & MODULE_CONTAINERS or context.kinds.local_class(value.func) is not None):
            kind = "module"
        if kind is None:
            continue
        found.append((attribute, value, kind))
    return found


def table_touched(context, name: str, attribute: str) -> str | None:
    """Why this file keeps the networks of `name.attribute` from being compiled: it stores
    into the table or registers hooks that may reach it."""
    prefix = f"{name}.{attribute}"
    for node in context.index.find((cst.Assign, cst.AugAssign)):
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        if any(re.match(re.escape(prefix) + r"\b(?!\s*\()", context.source(t)) for t in targets):
            return f"this file stores into `{prefix}` (line {context.line(node)})"
    for site in hook_sites(context):
        if site.root is None or site.root == name and site.path[:1] == (attribute,):
            return f"this file registers a hook that may reach them (line {context.line(site.call)})"
    return None

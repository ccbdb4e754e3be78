"""Which modules a file's hook registrations attach to.

`model.probe.register_forward_hook(f)` hooks the `probe` part of `model`;
`self.target.get_submodule(name).register_forward_hook(f)` in a method of a
class hooks (some module under) its `target` part, and so does
`getattr(self.target, name).register_forward_hook(f)`; a hook on a name bound to a
module built on its own (`target = nn.Linear(...)`) hooks that module. A
registration whose module cannot be followed to a name and a path of
attributes (`for m in model.modules(): m.register_forward_hook(f)`, a
parameter) may hook anything: its root is None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis.names import method_name
from codemod.analysis.torch_facts import HOOK_REGISTRATIONS

if TYPE_CHECKING:
    from codemod.context import FileContext

# Calls that return a part of the module they are called on.
_PART_METHODS = ("get_submodule",)


class HookSite(NamedTuple):
    call: cst.Call  # the registration
    root: str | None  # the name the hooked module is reached from (`model`, `self`); None: unknown
    path: tuple[str, ...]  # the attributes from the root to the hooked module (`("probe",)`)
    owner: cst.ClassDef | None  # for the root `self`: the class whose method registers it


def hook_sites(context: FileContext) -> list[HookSite]:
    """Every hook registration of the file, with the module it hooks."""
    sites = []
    for call in context.index.find(cst.Call):
        if method_name(call) not in HOOK_REGISTRATIONS or not isinstance(call.func, cst.Attribute):
            continue
        found = _path(context, call.func.value, 0)
        root, path = found if found is not None else (None, ())
        owner = None
        if root == "self":
            function = context.index.first_enclosing(call, cst.FunctionDef)
            owner = context.kinds.class_of(function) if function is not None else None
            if owner is None:
                root = None
        sites.append(HookSite(call, root, path, owner))
    return sites


def _path(context: FileContext, expr: cst.BaseExpression, depth: int) -> tuple[str, tuple[str, ...]] | None:
    if depth > 6:
        return None
    if isinstance(expr, cst.Name):
        if expr.value == "self":
            return "self", ()
        values = context.bindings.values(expr)
        if not values or len(values) != 1:
            return None
        value = values[0]
        if isinstance(value, cst.Call) and not (
            isinstance(value.func, cst.Attribute) and value.func.attr.value in _PART_METHODS
        ):
            return expr.value, ()  # a module built on its own
        return _path(context, value, depth + 1)
    if isinstance(expr, cst.Attribute):
        found = _path(context, expr.value, depth + 1)
        return None if found is None else (found[0], (*found[1], expr.attr.value))
    if isinstance(expr, cst.Subscript):
        return _path(context, expr.value, depth + 1)  # a member of a container part: the part
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _PART_METHODS:
        return _path(context, expr.func.value, depth + 1)
    if (
        isinstance(expr, cst.Call)
        and len(expr.args) == 2
        and all(arg.keyword is None and not arg.star for arg in expr.args)
        and context.names.is_(expr.func, "builtins.getattr")
    ):
        return _path(context, expr.args[0].value, depth + 1)  # an attribute named at run time: under its object
    return None

"""The scope guard: every name a fix's new code reads must be defined where it goes.

A fix that inserts `Precision.for_device(device)` into a method where `device`
is not defined would crash the rewritten script on its first step. Before any
fix is applied, the names its edits introduce (names the new code reads that
the code it replaces did not) are looked up in the scope at the edit's anchor;
names the fix itself binds (its inserted assignments, its imports) and
builtins pass, and so do names the user's code reads in that same scope
without a binding perfmod can see (a star import). A name the scope binds
itself must be bound before the new code runs: a function's own `import torch`
makes `torch` local to it, so a line inserted above that import reads it
unbound (an import the fix adds at the top of the module does not help). A fix
with a name that does not resolve is dropped and reported.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable

import libcst as cst
from libcst.metadata import ClassScope, GlobalScope

from codemod.analysis.index import TreeIndex
from codemod.analysis.names import names_read
from codemod.edits import AddKeyword, Fix, InsertAfter, InsertBefore, Replace, Wrap
from codemod.imports import bound_name, dotted

BUILTINS = frozenset(dir(builtins))


class _Bound(cst.CSTVisitor):
    """Names a piece of new code binds: assignment, loop, `with` and comprehension
    targets, walrus targets, parameters, definitions and imports."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def _targets(self, node: cst.CSTNode | None) -> None:
        if node is None:
            return
        if isinstance(node, cst.Name):
            self.names.add(node.value)
        elif isinstance(node, (cst.Tuple, cst.List)):
            for element in node.elements:
                self._targets(element.value)
        elif isinstance(node, cst.StarredElement):
            self._targets(node.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._targets(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._targets(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._targets(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._targets(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._targets(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._targets(node.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._targets(node.target)

    def visit_Param(self, node: cst.Param) -> None:
        self.names.add(node.name.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.names.add(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.names.add(node.name.value)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        if node.asname is None:
            name = node.name
            while isinstance(name, cst.Attribute):
                name = name.value
            self._targets(name)


def _produced(edit) -> list[cst.CSTNode]:
    """The new code an edit writes, made on the original anchor."""
    if isinstance(edit, Replace):
        result = edit.replacement(edit.anchor)
        if isinstance(result, cst.FlattenSentinel):
            return list(result.nodes)
        return [] if isinstance(result, cst.RemovalSentinel) else [result]
    if isinstance(edit, (InsertBefore, InsertAfter)):
        return list(edit.statements)
    if isinstance(edit, Wrap):
        return list(edit.items)
    if isinstance(edit, AddKeyword):
        return [edit.value]
    return []


def _reads(nodes: Iterable[cst.CSTNode]) -> set[str]:
    return {name.value for node in nodes for name in names_read(node)}


def produced_reads(edit) -> list[cst.Name]:
    """The names the new code an edit writes reads (its replacement made on the original
    anchor, the statements it inserts, the items it wraps with, the keyword value it
    adds): original nodes where the new code keeps or moves them. `x += 1` reads `x`."""
    produced = _produced(edit)
    updated = [n.target for node in produced for n in _augmented(node) if isinstance(n.target, cst.Name)]
    return [name for node in produced for name in names_read(node)] + updated


def _augmented(node: cst.CSTNode) -> list[cst.AugAssign]:
    found = [node] if isinstance(node, cst.AugAssign) else []
    for child in node.children:
        found += _augmented(child)
    return found


def undefined_names(fix: Fix, scopes, index: TreeIndex) -> list[str]:
    """Names `fix` would read where they are not defined (empty: the fix may be applied)."""
    produced = {id(edit): _produced(edit) for edit in fix.edits}
    binder = _Bound()
    for edit, nodes in ((edit, produced[id(edit)]) for edit in fix.edits):
        for node in nodes:
            if _binding_target(edit.anchor, index):  # `for step, i in ...` -> `for step, (xb, yb) in ...`
                binder._targets(node)
            node.visit(binder)
    own = binder.names | BUILTINS
    imported = {item.bound for item in fix.imports}
    missing: list[str] = []
    for edit in fix.edits:
        new = _reads(produced[id(edit)])
        if isinstance(edit, Replace):
            new -= _reads([edit.anchor])
        scope = scopes.get(edit.anchor)
        for name in sorted(new - own):
            # Imported by the fix, defined in reach, or read by the user's own code in the
            # same scope without a binding perfmod can see (a star import, a name injected
            # at run time); in every case not a name the scope binds only further down.
            defined = name in imported or (scope is not None and (scope[name] or scope.accesses[name]))
            later = scope is not None and _bound_only_later(name, scope, edit, index)
            if (not defined or later) and name not in missing:
                missing.append(name)
    return missing


def _binding_target(anchor: cst.CSTNode, index: TreeIndex) -> bool:
    """Is `anchor` the target of a loop, an assignment or a `with` item, or a name unpacked
    there (`i` of `for step, i in ...`): new code in its place binds the names it holds, it
    does not read them."""
    parent = index.parents.get(anchor)
    while isinstance(parent, (cst.Element, cst.Tuple, cst.List, cst.StarredElement)):
        anchor, parent = parent, index.parents.get(parent)
    return (
        (isinstance(parent, (cst.For, cst.CompFor)) and parent.target is anchor)
        or isinstance(parent, cst.AssignTarget)
        or (isinstance(parent, cst.AsName) and parent.name is anchor)
    )


def _bound_only_later(name: str, scope, edit, index: TreeIndex) -> bool:
    """Does the scope of `edit`'s anchor bind `name` itself, but only after the new code
    runs? (In a loop, a binding further down has not run on the first pass either.)"""
    local = [a.node for a in scope.assignments[name] if getattr(a, "node", None) in index]
    runs_at = index.end(edit.anchor) if isinstance(edit, InsertAfter) else index.order(edit.anchor)
    return bool(local) and all(index.order(node) > runs_at for node in local)


def imports_read(fix: Fix, scopes) -> list:
    """The imports of `fix` that its new code may read from the module: an import of a
    name that every edit reading it finds bound in its own function (`import torch`
    inside `main()`) would be a line nothing uses."""
    reads = [(name, scopes.get(edit.anchor)) for edit in fix.edits for name in _reads(_produced(edit))]
    return [
        item
        for item in fix.imports
        if not any(n == item.bound for n, _ in reads) or any(n == item.bound and not _local(n, s) for n, s in reads)
    ]


def _local(name: str, scope) -> bool:
    """Does `scope`, or a function around it, bind `name`? (A class body's names are not
    seen from its methods.)"""
    inner = scope
    while scope is not None and not isinstance(scope, GlobalScope):
        if scope.assignments[name] and (scope is inner or not isinstance(scope, ClassScope)):
            return True
        scope = scope.parent
    return False


def import_clashes(fix: Fix, module_scope) -> list[str]:
    """Names the fix imports that the file already binds to something else."""
    clashes = []
    for item in fix.imports:
        for assignment in module_scope[item.bound] if module_scope is not None else ():
            node = getattr(assignment, "node", None)
            if isinstance(node, (cst.Import, cst.ImportFrom)) and _imports(node, item):
                continue
            clashes.append(item.bound)
            break
    return clashes


def _imports(statement: cst.Import | cst.ImportFrom, item) -> bool:
    """Does `statement` bind `item.bound` to what `item` imports?"""
    for alias in statement.names if not isinstance(statement.names, cst.ImportStar) else ():
        if bound_name(alias, statement) != item.bound:
            continue
        if isinstance(statement, cst.ImportFrom):
            return (
                dotted(statement.module) == item.module and not statement.relative and dotted(alias.name) == item.name
            )
        return (
            item.name is None and dotted(alias.name).split(".")[0] == item.module.split(".")[0] and alias.asname is None
        )
    return False

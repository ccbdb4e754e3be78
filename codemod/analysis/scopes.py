"""libcst's scopes (ScopeProvider's answer), with three of libcst's costs taken out.

ScopeVisitor asks ExpressionContextProvider one question, whether a name is
stored to; that provider, and the MetadataWrapper that runs it, each walk the
whole tree. Here the stored names are read off the assignment targets of the
tree index, and the visitor runs on its own.

While it builds scopes, ScopeVisitor asks for the qualified names of every
call's callee, to find `typing.cast(...)`, `TypeVar(...)` and `NewType(...)`,
whose string arguments are type annotations. That look-up goes through every
binding of the callee's first name (each `import torch` of a long file). A
qualified name of a callee ends in `cast`, `TypeVar` or `NewType` only when the
dotted callee does, or when the callee is an import's `as` alias (`from typing
import cast as c`); every other call skips the look-up.

libcst then links every read of a name to every earlier binding of it in the
same scope (`Access.referents`) and every binding to every later read
(`BaseAssignment.references`), as sets built one by one: for a name bound n
times and read m times in one scope (`loss = ...` in a long notebook-style
script) that is n * m set entries, and the cost grows with the square of the
file. Here both are views of a list of the scope's bindings (or reads) in
order: the referents of a read are a prefix of the bindings, the references of
a binding a suffix of the reads, built in time linear in the file.

tests/analysis/test_scopes.py compares the scopes, every read's referents and
every binding's references with libcst's own.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from itertools import chain, islice

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import ExpressionContext, ExpressionContextProvider, Scope
from libcst.metadata.scope_provider import _ASSIGNMENT_LIKE_NODES, ScopeVisitor, _gen_dotted_names

from codemod.analysis.index import TreeIndex

# The last part of the qualified names ScopeVisitor.visit_Call looks for.
TYPING_CALLS = frozenset({"cast", "TypeVar", "NewType"})


class Ordered:
    """Bindings or reads of one name in one scope, in the order libcst numbers them."""

    __slots__ = ("items", "_positions")

    def __init__(self, items: Sequence) -> None:
        self.items = items
        self._positions: dict[int, int] | None = None

    def position(self, item) -> int | None:
        if self._positions is None:
            self._positions = {id(x): k for k, x in enumerate(self.items)}
        return self._positions.get(id(item))


class Span(Collection):
    """The items `start:stop` of an `Ordered` list, as a read-only set."""

    __slots__ = ("ordered", "start", "stop")

    def __init__(self, ordered: Ordered, start: int, stop: int) -> None:
        self.ordered, self.start, self.stop = ordered, start, stop

    def __iter__(self) -> Iterator:
        return islice(self.ordered.items, self.start, self.stop)

    def __len__(self) -> int:
        return self.stop - self.start

    def __contains__(self, item) -> bool:
        at = self.ordered.position(item)
        return at is not None and self.start <= at < self.stop


class Spans(Collection):
    """Several disjoint spans as one read-only set."""

    __slots__ = ("spans",)

    def __init__(self, spans: list[Span]) -> None:
        self.spans = spans

    def __iter__(self) -> Iterator:
        return chain.from_iterable(self.spans)

    def __len__(self) -> int:
        return sum(len(span) for span in self.spans)

    def __contains__(self, item) -> bool:
        return any(item in span for span in self.spans)


class PerBindings:
    """Answers kept per set of bindings. libcst hands out one set of a scope's bindings of a
    name to every read of it (a module-level `model` asked about from each of its uses), so
    an answer computed from the bindings alone is computed once. Each set is kept with its
    answer, so that its id is not reused meanwhile; a computation that asks about its own
    set again gets None."""

    def __init__(self) -> None:
        self._answers: dict[int, tuple[Collection, object]] = {}

    def get(self, bindings: Collection, compute: Callable[[Collection], object]):
        found = self._answers.get(id(bindings))
        if found is None:
            self._answers[id(bindings)] = (bindings, None)
            found = self._answers[id(bindings)] = (bindings, compute(bindings))
        return found[1]


def reads_of(bindings: Collection) -> list:
    """The reads that may read any of `bindings`: their references united, each read
    once (a read is in the references of every earlier binding it may read)."""
    spans: dict[int, tuple[Ordered, list[tuple[int, int]]]] = {}
    others: dict[int, object] = {}
    for binding in bindings:
        references = binding.references
        parts = references.spans if isinstance(references, Spans) else [references]
        for part in parts:
            if isinstance(part, Span):
                spans.setdefault(id(part.ordered), (part.ordered, []))[1].append((part.start, part.stop))
            else:
                others.update((id(read), read) for read in part)
    found = list(others.values())
    for ordered, ranges in spans.values():
        end = 0
        for start, stop in sorted(ranges):
            found.extend(ordered.items[max(start, end) : stop])
            end = max(end, stop)
    return found


def _hook(name: str):
    """ScopeVisitor's method `name` (a function of the class), None where it has none or
    only libcst's no-op stub (which returns None, as no method does)."""
    found = getattr(_ScopeVisitor, name, None)
    return None if found is None or getattr(found, "_is_no_op", False) else found


class _ScopeVisitor(ScopeVisitor):
    """ScopeVisitor as it is, but for its dispatch: CSTVisitor finds the method for each
    node and field it passes by formatting its name and looking it up (over 100,000 times
    in a 2,000-line file), and ScopeVisitor.on_leave tests every node against its
    assignment types through abstract base classes. Here each answer is looked up once
    per node type (and field) and kept."""

    # node type -> (visit, leave, counts as an assignment); (node type, field) -> (visit, leave)
    _NODE_HOOKS: dict[type, tuple] = {}
    _FIELD_HOOKS: dict[tuple[type, str], tuple] = {}

    def __init__(self, recorder: _Recorder, aliases: Collection[str]) -> None:
        super().__init__(recorder)  # type: ignore[arg-type]
        self._aliases = aliases

    def _node_hooks(self, kind: type) -> tuple:
        hooks = self._NODE_HOOKS.get(kind)
        if hooks is None:
            name = kind.__name__
            assigns = issubclass(kind, _ASSIGNMENT_LIKE_NODES)
            hooks = self._NODE_HOOKS[kind] = (_hook(f"visit_{name}"), _hook(f"leave_{name}"), assigns)
        return hooks

    def on_visit(self, node: cst.CSTNode) -> bool:
        visit = self._node_hooks(type(node))[0]
        return visit is None or visit(self, node) is not False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        _, leave, assigns = self._node_hooks(type(original_node))
        self.provider.set_metadata(original_node, self.scope)
        if assigns:
            self.scope._assignment_count += 1
        if leave is not None:
            leave(self, original_node)

    def _field_hooks(self, node: cst.CSTNode, attribute: str) -> tuple:
        key = (type(node), attribute)
        hooks = self._FIELD_HOOKS.get(key)
        if hooks is None:
            name = f"{type(node).__name__}_{attribute}"
            hooks = self._FIELD_HOOKS[key] = (_hook(f"visit_{name}"), _hook(f"leave_{name}"))
        return hooks

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        visit = self._field_hooks(node, attribute)[0]
        if visit is not None:
            visit(self, node)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        leave = self._field_hooks(original_node, attribute)[1]
        if leave is not None:
            leave(self, original_node)

    def visit_Call(self, node: cst.Call) -> bool | None:
        callee = get_full_name_for_node(node)
        if callee is not None and (callee.rpartition(".")[2] in TYPING_CALLS or callee in self._aliases):
            return super().visit_Call(node)
        # What ScopeVisitor.visit_Call does for a call that is none of those (leave_Call pops both).
        self._ScopeVisitor__top_level_attribute_stack.append(None)
        self._ScopeVisitor__in_type_hint_stack.append(False)
        return True

    def infer_accesses(self) -> None:
        """ScopeVisitor.infer_accesses, with referents and references as spans."""
        groups: dict[tuple, list] = {}
        for deferred in self._ScopeVisitor__deferred_accesses:
            access = deferred.access
            name = access.node.value
            if deferred.enclosing_attribute is not None:
                for attr_name, node in _gen_dotted_names(deferred.enclosing_attribute):
                    if attr_name in access.scope:
                        access.node = node
                        name = attr_name
                        break
            if deferred.enclosing_string_annotation is not None:
                access.node = deferred.enclosing_string_annotation
            groups.setdefault((access.scope, name), []).append(access)
            access.scope.record_access(name, access)
        self._ScopeVisitor__deferred_accesses = []
        references: dict = {}  # binding -> the spans of reads it reaches
        for (scope, name), accesses in groups.items():
            _link(scope, name, accesses, references)
        for binding, spans in references.items():
            binding._BaseAssignment__accesses = spans[0] if len(spans) == 1 else Spans(spans)


def _link(scope, name: str, accesses: list, references: dict) -> None:
    """Set the referents of the reads of `name` in `scope`, and add them to the references
    of the bindings they reach, as libcst's Access.record_assignments and
    BaseAssignment.record_accesses do."""
    bindings = scope._resolve_scope_for_access(name, scope)
    reads = Ordered(sorted(accesses, key=lambda access: access._index))
    every_read = Span(reads, 0, len(accesses))
    # The bindings libcst resolves a name to are one scope's, all of that scope.
    own = sorted(bindings, key=lambda b: b._index) if any(b.scope is scope for b in bindings) else []
    if not own:  # bound in an enclosing scope (or nowhere): every read may read every binding
        for access in accesses:
            access._Access__assignments = bindings
        for binding in bindings:
            references.setdefault(binding, []).append(every_read)
        return
    # Bound in this scope: a read reaches the bindings numbered before it, or when there is
    # none, the enclosing scope's (a read before the first binding).
    ordered = Ordered(own)
    numbers = [binding._index for binding in own]
    enclosing = scope.parent._resolve_scope_for_access(name, scope) if scope.parent is not scope else None
    for access in accesses:
        before = bisect_left(numbers, access._index)
        if before:
            access._Access__assignments = Span(ordered, 0, before)
        elif enclosing is not None:
            access._Access__assignments = enclosing
    read_numbers = [access._index for access in reads.items]
    earliest = 0  # the reads not after some binding here: libcst gives them to the enclosing bindings
    for binding in own:
        first_after = bisect_right(read_numbers, binding._index)
        if first_after < len(read_numbers):
            references.setdefault(binding, []).append(Span(reads, first_after, len(read_numbers)))
        earliest = max(earliest, first_after)
    if earliest and scope.parent is not scope:
        for shadowed in scope.parent[name]:
            references.setdefault(shadowed, []).append(Span(reads, 0, earliest))


# Where ExpressionContextProvider's visitor starts a STORE context, and what it visits with it.
_TARGETS = {
    cst.Assign: lambda node: [target.target for target in node.targets],
    cst.AnnAssign: lambda node: [node.target],
    cst.AugAssign: lambda node: [node.target],
    cst.NamedExpr: lambda node: [node.target],
    cst.AsName: lambda node: [node.name],
    cst.CompFor: lambda node: [node.target],
    cst.For: lambda node: [node.target],
    cst.ClassDef: lambda node: [node.name],
    cst.FunctionDef: lambda node: [node.name],
    cst.Param: lambda node: [node.name],
}


def stored_names(index: TreeIndex) -> set[int]:
    """The ids of the Names libcst's ExpressionContextProvider marks STORE: the names a
    target binds, down through tuples, lists and starred elements but not into the
    value or index of an attribute or subscript (those are read). ScopeVisitor asks
    the provider about names only, and only whether one is stored; reading that off
    the targets saves a walk of the whole tree."""
    stored: set[int] = set()
    pending = [target for node in index.find(tuple(_TARGETS)) for target in _TARGETS[type(node)](node)]
    while pending:
        node = pending.pop()
        if isinstance(node, cst.Name):
            stored.add(id(node))
        elif not isinstance(node, (cst.Attribute, cst.Subscript)):
            pending.extend(node.children)
    return stored


class _Recorder:
    """What ScopeVisitor asks of its provider: to record the scope of each node, and
    whether a name is stored to."""

    def __init__(self, index: TreeIndex) -> None:
        self.index = index
        self.scopes: dict[cst.CSTNode, Scope] = {}
        self._stored: set[int] | None = None

    def set_metadata(self, node: cst.CSTNode, scope: Scope) -> None:
        self.scopes[node] = scope

    def get_metadata(self, key, node: cst.CSTNode, default=None):
        if key is not ExpressionContextProvider:
            raise KeyError(key)
        if self._stored is None:
            self._stored = stored_names(self.index)
        return ExpressionContext.STORE if id(node) in self._stored else default


def file_scopes(index: TreeIndex) -> Mapping[cst.CSTNode, Scope]:
    """node -> its Scope for the module of `index`, as libcst's ScopeProvider gives them
    (without the MetadataWrapper, whose batched walk of the whole tree has nothing left
    to do here). Call it inside `read_only_visits()`."""
    aliases = frozenset(alias.evaluated_alias for alias in index.find(cst.ImportAlias) if alias.asname is not None)
    recorder = _Recorder(index)
    visitor = _ScopeVisitor(recorder, aliases)
    index.module.visit(visitor)
    visitor.infer_accesses()
    return recorder.scopes


def binding_prefix(
    statements: Sequence[cst.BaseStatement], names: Collection[str], scope: Scope, index: TreeIndex
) -> int:
    """How many of `statements`, a block of `scope`, must run before new code there can
    read `names`: through the last one that binds one of them in `scope` itself (a
    function's own `import torch` makes `torch` local to it), 0 when none does."""
    bindings = [a.node for name in names for a in scope.assignments[name] if getattr(a, "node", None) in index]
    return max((k + 1 for k, s in enumerate(statements) if any(index.inside(b, s) for b in bindings)), default=0)

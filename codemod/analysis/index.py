"""One walk over a parsed file: parents, document order and the nodes of each type.

Every rule asks where a node sits (its parent, the loop or function around it,
whether it is inside another node) and for the nodes of a type under a node
(the calls in a loop body). libcst answers the first with a metadata provider
and the second with `matchers.findall`, each a full traversal through its
visitor machinery; a file with twenty rules paid for dozens of them. This
index walks the tree once, reading each node's fields directly, and answers
both from tables: `inside` is an interval check on preorder numbers, `find` a
bisection in a per-type list.

Whitespace, comments, brackets, commas and operators are not indexed: no rule
asks about them, and they are half the nodes of a file.
"""

from __future__ import annotations

import dataclasses
import functools
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import TypeVar

import libcst as cst

from codemod.analysis.node_types import type_test_of

NodeT = TypeVar("NodeT", bound=cst.CSTNode)

# Fields that hold only layout (whitespace, brackets, separators).
_LAYOUT_FIELDS = frozenset(
    "lpar rpar leading_lines lines_after_decorators trailing_whitespace header footer comma dot equal "
    "colon semicolon indent star whitespace operator asynchronous default_indent default_newline encoding "
    "has_trailing_newline lbracket rbracket lbrace rbrace first_colon second_colon leading_whitespace".split()
)
_LAYOUT_TYPES = (
    cst.BaseParenthesizableWhitespace,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Comment,
    cst.Newline,
)

# Types whose fields are declared in another order than the code reads.
_DOCUMENT_ORDER = {
    cst.FunctionDef: ("decorators", "name", "type_parameters", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    cst.IfExp: ("body", "test", "orelse"),
    cst.Arg: ("keyword", "value"),
    cst.ImportFrom: ("relative", "module", "names"),
    cst.Parameters: ("posonly_params", "posonly_ind", "params", "star_arg", "kwonly_params", "star_kwarg"),
    cst.MatchCase: ("pattern", "guard", "body"),
    cst.ExceptHandler: ("type", "name", "body"),
    cst.ExceptStarHandler: ("type", "name", "body"),
}
_FIELDS: dict[type, tuple[str, ...]] = {}


def node_fields(kind: type) -> tuple[str, ...]:
    """The fields of a node type that can hold indexed children, in document order."""
    names = _FIELDS.get(kind)
    if names is None:
        names = _DOCUMENT_ORDER.get(kind) or tuple(
            f.name
            for f in dataclasses.fields(kind)
            if f.name not in _LAYOUT_FIELDS and not f.name.startswith("whitespace")
        )
        _FIELDS[kind] = names
    return names


# What a field value of each type is: _INDEXED (a node the index walks), _SEQUENCE (a
# list or tuple of values), or neither. libcst's node classes are abstract base classes,
# whose isinstance checks run Python code; the answer for a type is read once.
_INDEXED, _SEQUENCE, _OTHER = 1, 2, 0
_VALUE_KINDS: dict[type, int] = {}


def _value_kind(kind: type) -> int:
    if issubclass(kind, cst.CSTNode):
        found = _OTHER if issubclass(kind, _LAYOUT_TYPES) else _INDEXED
    else:
        found = _SEQUENCE if issubclass(kind, (list, tuple)) else _OTHER
    _VALUE_KINDS[kind] = found
    return found


def children_of(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The children of `node` the index walks (no whitespace or punctuation nodes), in
    document order: a cheaper walk than libcst's `children` for a tree without an index."""
    children = []
    kinds = _VALUE_KINDS
    for name in node_fields(type(node)):
        value = getattr(node, name)
        kind = kinds.get(type(value))
        if kind is None:
            kind = _value_kind(type(value))
        if kind == _INDEXED:
            children.append(value)
        elif kind == _SEQUENCE:
            for item in value:
                item_kind = kinds.get(type(item))
                if item_kind is None:
                    item_kind = _value_kind(type(item))
                if item_kind == _INDEXED:
                    children.append(item)
    return children


def _walk(root: cst.CSTNode, tables: tuple) -> None:
    """Append `root` and every node below it to the tables of an index being built:
    parents, preorder numbers, the nodes in preorder, the number of the last node below
    each, and the nodes of each type."""
    parents, order, nodes, ends, by_type = tables
    # Iterative preorder walk; an int entry closes the subtree opened at that index.
    stack: list = [root]
    while stack:
        node = stack.pop()
        if type(node) is int:
            ends[node] = len(nodes) - 1
            continue
        index = len(nodes)
        order[node] = index
        nodes.append(node)
        ends.append(index)
        kind = type(node)
        bucket = by_type.get(kind)
        if bucket is None:
            bucket = by_type[kind] = []
        bucket.append(node)
        stack.append(index)
        children = children_of(node)
        for child in children:
            parents[child] = node
        stack.extend(reversed(children))


class TreeIndex:
    """Parents, preorder numbers and per-type node lists of one module."""

    def __init__(self, module: cst.Module, earlier: TreeIndex | None = None) -> None:
        """`earlier`: the index of a module this one rewrites, whose tables for the
        top-level statements the two share are copied rather than walked again."""
        self.module = module
        parents: dict[cst.CSTNode, cst.CSTNode] = {}
        order: dict[cst.CSTNode, int] = {}
        nodes: list[cst.CSTNode] = []
        ends: list[int] = []
        by_type: dict[type, list[cst.CSTNode]] = {}
        tables = (parents, order, nodes, ends, by_type)
        shared = earlier._statements() if earlier is not None and earlier.unique else {}
        if shared:
            order[module] = 0
            nodes.append(module)
            ends.append(0)
            by_type[type(module)] = [module]
            for statement in children_of(module):
                parents[statement] = module
                if statement in shared:
                    earlier._copy(statement, tables)
                else:
                    _walk(statement, tables)
            ends[0] = len(nodes) - 1
        else:
            _walk(module, tables)
        self._keep(tables)

    def _keep(self, tables: tuple) -> None:
        parents, order, nodes, ends, by_type = tables
        self.parents: Mapping[cst.CSTNode, cst.CSTNode] = parents
        self.unique = len(order) == len(nodes)  # False when a node object sits in two places
        self._order = order
        self._nodes = nodes
        self._ends = ends
        self._by_type = by_type
        self._type_orders: dict[type, list[int]] = {}
        self._types_of: dict[tuple[type, ...], list[type]] = {}
        self._tops: list[int] | None = None  # where each statement of the module's body starts

    def _statements(self) -> dict[cst.CSTNode, int]:
        """The module's top-level statements (the children of the module), by their number."""
        return {statement: self._order[statement] for statement in children_of(self.module)}

    def _copy(self, statement: cst.CSTNode, tables: tuple) -> None:
        """Append the tables of `statement`, one of the module's top-level statements, to
        those of an index being built (whose parent entry for it is set)."""
        parents, order, nodes, ends, by_type = tables
        start = self._order[statement]
        end = self._ends[start]
        inside = self._nodes[start : end + 1]
        at = len(nodes)
        nodes.extend(inside)
        order.update(zip(inside, range(at, at + len(inside))))
        shift = at - start
        ends.extend([last + shift for last in self._ends[start : end + 1]])
        below = inside[1:]
        parents.update(zip(below, map(self.parents.__getitem__, below)))
        for node in inside:
            bucket = by_type.get(type(node))
            if bucket is None:
                bucket = by_type[type(node)] = []
            bucket.append(node)

    def with_clones(self, module: cst.Module) -> TreeIndex:
        """The index of `module`: this index's module with some statements of its body
        replaced by their deep clones (`shared_statements`, cloned so that each place of a
        node gets a node of its own), made from this one's tables: a clone has the shape,
        and so the preorder numbers, of the statement it replaces. None of the replaced
        statements' nodes stays in the tree (each place of them is cloned)."""
        if len(module.body) != len(self.module.body):
            return TreeIndex(module)
        parents, order = dict(self.parents), dict(self._order)
        nodes = list(self._nodes)
        del order[self.module]
        order[module] = 0
        nodes[0] = module
        at = 1
        for old, new in zip(self.module.body, module.body):
            parents[new] = module
            end = self._ends[at]
            if new is not old:
                clone: tuple = ({}, {}, [], [], {})
                _walk(new, clone)
                if len(clone[2]) != end - at + 1:
                    return TreeIndex(module)  # (not the shape of a deep clone)
                for node in nodes[at : end + 1]:
                    order.pop(node, None)
                    parents.pop(node, None)
                nodes[at : end + 1] = clone[2]
                order.update(zip(clone[2], range(at, end + 1)))
                parents.update(clone[0])
            at = end + 1
        by_type: dict[type, list[cst.CSTNode]] = {}
        for node in nodes:
            bucket = by_type.get(type(node))
            if bucket is None:
                bucket = by_type[type(node)] = []
            bucket.append(node)
        index = TreeIndex.__new__(TreeIndex)
        index.module = module
        index._keep((parents, order, nodes, list(self._ends), by_type))
        return index

    def shared_statements(self) -> set[int]:
        """Where in the module's body the statements are that hold a node also found
        somewhere else in the tree (an edit that put one node in two places)."""
        if self.unique:
            return set()
        counts = Counter(map(id, self._nodes))
        starts, positions = [], []  # first index of each child of the module, its place in the body
        body = {id(statement): k for k, statement in enumerate(self.module.body)}
        at = 1
        for child in children_of(self.module):
            starts.append(at)
            positions.append(body.get(id(child)))
            at = self._ends[at] + 1
        found = set()
        for at, node in enumerate(self._nodes):
            if counts[id(node)] > 1 and at:
                position = positions[bisect_right(starts, at) - 1]
                if position is not None:
                    found.add(position)
        return found

    # -- where a node sits ---------------------------------------------------------

    def __contains__(self, node: cst.CSTNode) -> bool:
        return node in self._order

    def order(self, node: cst.CSTNode) -> int:
        """The node's place in document order (preorder)."""
        return self._order[node]

    def end(self, node: cst.CSTNode) -> int:
        """The document-order number of the last node below `node` (its own if none)."""
        return self._ends[self._order[node]]

    def inside(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        """Is `node` the node `ancestor` or somewhere below it?"""
        at = self._order.get(node)
        start = self._order.get(ancestor)
        if at is None or start is None:
            return False
        return start <= at <= self._ends[start]

    def top_level(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement of the module's body that holds `node` (the module, for nodes
        outside every statement)."""
        if self._tops is None:
            self._tops = [self._order[statement] for statement in self.module.body]
        at = self._order[node]
        k = bisect_right(self._tops, at) - 1
        if k >= 0 and at <= self._ends[self._tops[k]]:
            return self.module.body[k]
        return self.module

    def before(self, first: cst.CSTNode, second: cst.CSTNode) -> bool:
        """Does `first` start before `second` in the code?"""
        return self._order[first] < self._order[second]

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """The nodes around `node`, innermost first."""
        parent = self.parents.get(node)
        while parent is not None:
            yield parent
            parent = self.parents.get(parent)

    def enclosing(self, node: cst.CSTNode, types) -> Iterator[cst.CSTNode]:
        """Ancestors of `node` of the given types, innermost first."""
        is_wanted = type_test_of(types)
        for ancestor in self.ancestors(node):
            if is_wanted(ancestor):
                yield ancestor

    def first_enclosing(self, node: cst.CSTNode, types) -> cst.CSTNode | None:
        return next(self.enclosing(node, types), None)

    def enclosing_loops(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """The `for` and `while` loops around `node` in its function, innermost first."""
        found = []
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if isinstance(ancestor, (cst.For, cst.While)):
                found.append(ancestor)
        return found

    def outermost_enclosing(self, node: cst.CSTNode, types) -> cst.CSTNode | None:
        """The outermost ancestor of `node` of the given types (the function that holds
        `node` through nested ones), or None."""
        outermost = None
        for ancestor in self.enclosing(node, types):
            outermost = ancestor
        return outermost

    def outermost_loop(self, loop: cst.CSTNode) -> cst.CSTNode:
        """The outermost loop of its function around `loop`, or `loop` itself."""
        return [loop, *self.enclosing_loops(loop)][-1]

    def conditions_within(self, node: cst.CSTNode, stop: cst.CSTNode) -> list[cst.If] | None:
        """The `if` statements between `node` and `stop` whose branches hold `node` (not
        their tests), innermost first; None when an `except` handler is on the way (code
        that runs after an error)."""
        found: list[cst.If] = []
        for ancestor in self.ancestors(node):
            if ancestor is stop:
                break
            if isinstance(ancestor, cst.ExceptHandler):
                return None
            if isinstance(ancestor, cst.If) and not self.inside(node, ancestor.test):
                found.append(ancestor)
        return found

    def statement_of(self, node: cst.CSTNode) -> cst.BaseStatement | None:
        """The statement (simple line or compound) that holds `node`, or `node` itself."""
        current: cst.CSTNode | None = node
        while current is not None and not isinstance(current, cst.BaseStatement):
            current = self.parents.get(current)
        return current

    def statement_in(self, node: cst.CSTNode, block: cst.CSTNode) -> cst.CSTNode:
        """The statement of `block` (a function's or a loop's body, the module) that holds
        `node`; `node` itself when no statement of `block` holds it."""
        statement = node
        for ancestor in self.ancestors(node):
            if ancestor is block:
                return statement
            statement = ancestor
        return statement

    def block_statements(self, statement: cst.CSTNode) -> list[cst.CSTNode]:
        """The statements of the block (an indented block, the module's body) that holds
        `statement`, in order; `[statement]` for a statement of a one-line suite."""
        block = self.parents.get(statement)
        return list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else [statement]

    def holding_line(self, small: cst.BaseSmallStatement) -> cst.CSTNode | None:
        """The line that holds a small statement: its simple statement line, or the one-line
        suite of a compound statement (`if done: return path`)."""
        return self.parents.get(small)

    def expression_statement(self, node: cst.CSTNode) -> cst.Expr | None:
        """The statement that is `node` alone (`f(x)`, whose value nothing reads); None when
        `node` is part of a larger statement."""
        statement = self.parents.get(node)
        return statement if isinstance(statement, cst.Expr) else None

    def argument_of(self, node: cst.CSTNode) -> tuple[cst.Call, cst.Arg] | None:
        """The call `node` is an argument of, with the argument (`sum(gen)` for the
        generator `gen`); None when `node` is not a call's argument."""
        argument = self.parents.get(node)
        call = self.parents.get(argument) if isinstance(argument, cst.Arg) else None
        return (call, argument) if isinstance(call, cst.Call) else None

    def block_owner(self, statement: cst.CSTNode) -> cst.CSTNode | None:
        """The `if`, `else`, `with`, `for`, `def`... whose indented block holds `statement`;
        None for a statement of the module or of a one-line suite."""
        block = self.parents.get(statement)
        return self.parents.get(block) if isinstance(block, cst.IndentedBlock) else None

    def own_returns(self, node: cst.CSTNode) -> list[cst.Return]:
        """The `return` statements in `node` that leave the function holding `node` (not
        those of functions or lambdas defined in it)."""
        function = self.first_enclosing(node, (cst.FunctionDef, cst.Lambda))
        return [
            leaving
            for leaving in self.find(cst.Return, within=node)
            if self.first_enclosing(leaving, (cst.FunctionDef, cst.Lambda)) is function
        ]

    # -- nodes of a type -------------------------------------------------------------

    @functools.cached_property
    def spelled_names(self) -> frozenset[str]:
        """Every name the file spells (variables, attributes, keywords): what a name a
        rewrite introduces must differ from."""
        return frozenset(name.value for name in self.find(cst.Name))

    @functools.cached_property
    def plain_imports(self) -> frozenset[str]:
        """The modules the file imports under their own one-word name, anywhere in it
        (`import torch`; not `import torch as th`, nor `import torch.nn`)."""
        return frozenset(
            alias.name.value
            for statement in self.find(cst.Import)
            for alias in statement.names
            if isinstance(alias.name, cst.Name) and alias.asname is None
        )

    def variable_names(self, node: cst.CSTNode) -> set[str]:
        """The names `node` spells as variables, read or bound: not the name of an attribute
        after its dot, nor that of a keyword argument."""
        found = set()
        for name in self.find(cst.Name, within=node):
            parent = self.parents.get(name)
            if isinstance(parent, cst.Attribute) and parent.attr is name:
                continue
            if isinstance(parent, cst.Arg) and parent.keyword is name:
                continue
            found.add(name.value)
        return found

    def find(self, types: type[NodeT] | tuple[type, ...], within: cst.CSTNode | None = None) -> list[NodeT]:
        """Nodes of `types` (exact classes, or base classes) in document order,
        below `within` (itself included) when given."""
        kinds = self._types(types if isinstance(types, tuple) else (types,))
        if within is None:
            if len(kinds) == 1:
                return list(self._by_type.get(kinds[0], ()))
            found = [node for kind in kinds for node in self._by_type.get(kind, ())]
            found.sort(key=self._order.__getitem__)
            return found
        start = self._order.get(within)
        if start is None:
            return []
        end = self._ends[start]
        found = []
        for kind in kinds:
            orders = self._orders_of(kind)
            nodes = self._by_type[kind]
            found.extend(nodes[bisect_left(orders, start) : bisect_right(orders, end)])
        if len(kinds) > 1:
            found.sort(key=self._order.__getitem__)
        return found

    def _types(self, wanted: tuple[type, ...]) -> list[type]:
        """Concrete node classes present in the file that are (subclasses of) `wanted`."""
        found = self._types_of.get(wanted)
        if found is None:
            found = self._types_of[wanted] = [kind for kind in self._by_type if issubclass(kind, wanted)]
        return found

    def _orders_of(self, kind: type) -> list[int]:
        orders = self._type_orders.get(kind)
        if orders is None:
            orders = self._type_orders[kind] = [self._order[n] for n in self._by_type[kind]]
        return orders

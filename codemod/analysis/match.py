"""Structural patterns over libcst nodes, spelled like `libcst.matchers`
(`m.Call(func=m.Name("len"), args=[m.Arg(keyword=None)])`, `m.Is() | m.IsNot()`,
`m.MatchIfTrue(...)`, `m.matches`, `m.findall`) for the subset perfmod uses.

`libcst.matchers` builds a dataclass for every node type when imported, which is a
third of a pre-commit run's start-up; a pattern here is a node type and the fields
it constrains, checked on demand. A field's pattern is another pattern, a literal
(compared with `==`, `None` included), or a list matched element by element."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import libcst as cst

from codemod.analysis.index import children_of


class BaseMatcher:
    def matches(self, node: object) -> bool:
        raise NotImplementedError

    def __or__(self, other: BaseMatcher) -> BaseMatcher:
        return OneOf(self, other)


class OneOf(BaseMatcher):
    def __init__(self, *options: BaseMatcher) -> None:
        self.options = options

    def matches(self, node: object) -> bool:
        return any(_field_matches(node, option) for option in self.options)


class MatchIfTrue(BaseMatcher):
    def __init__(self, predicate: Callable[[object], bool]) -> None:
        self.predicate = predicate

    def matches(self, node: object) -> bool:
        return bool(self.predicate(node))


class NodePattern(BaseMatcher):
    """A node of `node_type` whose named fields match their patterns; positional
    arguments name the node's fields in declaration order, as in libcst."""

    def __init__(self, node_type: type[cst.CSTNode], *args: object, **fields: object) -> None:
        if args:
            names = [f.name for f in dataclasses.fields(node_type)]
            fields = {**dict(zip(names, args)), **fields}
        self.node_type = node_type
        self.fields = fields

    def matches(self, node: object) -> bool:
        return isinstance(node, self.node_type) and all(
            _field_matches(getattr(node, name), pattern) for name, pattern in self.fields.items()
        )


def _field_matches(value: object, pattern: object) -> bool:
    if isinstance(pattern, BaseMatcher):
        return pattern.matches(value)
    if isinstance(pattern, (list, tuple)):
        return (
            isinstance(value, Sequence)
            and len(value) == len(pattern)
            and all(_field_matches(v, p) for v, p in zip(value, pattern))
        )
    return value == pattern


def matches(node: object, pattern: BaseMatcher) -> bool:
    return pattern.matches(node)


def findall(tree: cst.CSTNode, pattern: BaseMatcher) -> list[cst.CSTNode]:
    """The nodes of `tree` (itself included, whitespace and punctuation left out) that
    match, in document order."""
    found = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if pattern.matches(node):
            found.append(node)
        stack.extend(reversed(children_of(node)))
    return found


def __getattr__(name: str) -> Callable[..., NodePattern]:
    node_type = getattr(cst, name, None)
    if not (isinstance(node_type, type) and issubclass(node_type, cst.CSTNode)):
        raise AttributeError(f"no pattern for {name!r}: libcst has no node of that name")
    return lambda *args, **fields: NodePattern(node_type, *args, **fields)

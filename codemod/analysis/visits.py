"""Read-only visits that do not rebuild the tree.

`CSTNode.visit` rebuilds every node it passes (`_visit_and_replace_children`
constructs a new node from the visited children) even for a read-only
visitor, which throws the copy away. libcst's ScopeProvider and the
ExpressionContextProvider it needs walk the tree that way, and on a training
file that walk was most of perfmod's time. Inside `read_only_visits()`,
read-only visitors (`CSTVisitor`s) on this thread walk the fields of each node
instead: the same callbacks in the same order for every node that holds code
(whitespace, brackets and commas, which hold no names, are not visited), no
copies. Scopes come out the same (tests/analysis/test_visits.py compares them
on every fixture); transformers and other threads are not affected.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import libcst as cst

from codemod.analysis.index import node_fields

_state = threading.local()
_ORIGINAL_VISIT = cst.CSTNode.visit
_READ_ONLY: dict[type, bool] = {}  # visitor class -> is it a read-only CSTVisitor?
_IS_NODE: dict[type, bool] = {}


def _is_node(value) -> bool:
    kind = type(value)
    known = _IS_NODE.get(kind)
    if known is None:
        known = _IS_NODE[kind] = issubclass(kind, cst.CSTNode)
    return known


def _visit(self: cst.CSTNode, visitor):
    if not getattr(_state, "read_only", False):
        return _ORIGINAL_VISIT(self, visitor)
    kind = type(visitor)
    read_only = _READ_ONLY.get(kind)
    if read_only is None:
        read_only = _READ_ONLY[kind] = issubclass(kind, cst.CSTVisitor)
    if not read_only:
        return _ORIGINAL_VISIT(self, visitor)
    if visitor.on_visit(self):
        # Fields that hold code only: whitespace, brackets and commas hold no names.
        for name in node_fields(type(self)):
            value = getattr(self, name)
            if type(value) in (list, tuple):
                if value and _is_node(value[0]):
                    visitor.on_visit_attribute(self, name)
                    for item in value:
                        item.visit(visitor)
                    visitor.on_leave_attribute(self, name)
            elif _is_node(value):
                visitor.on_visit_attribute(self, name)
                value.visit(visitor)
                visitor.on_leave_attribute(self, name)
    visitor.on_leave(self)
    return self


cst.CSTNode.visit = _visit  # Module.visit calls it through super(); behaviour changes only inside `_read_only`


@contextmanager
def read_only_visits() -> Iterator[None]:
    previous = getattr(_state, "read_only", False)
    _state.read_only = True
    try:
        yield
    finally:
        _state.read_only = previous

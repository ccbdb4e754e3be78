"""`isinstance` against libcst's classes, answered once per type; nodes hashed in C.

libcst's nodes, scopes and assignments are abstract base classes. `isinstance(x, T)`
for an `x` that is no `T` runs ABCMeta's `__instancecheck__`, Python code: about
0.3 µs a class, 1.5 µs for a tuple of five. The analyses ask that millions of times
a large file (is this parent a target wrapper, is this binding an `Assignment`), and
on a 10,000-line file it cost about a second of CPU time, in every pass.

A test made by `type_test` keeps its answer per type of the value asked about: the
answer is `issubclass(type(x), T)`, which depends on the type alone (libcst
registers no virtual subclass after import and none of its objects fakes its
`__class__`), so it stays valid for the life of the process.

Every table of the analyses is keyed by nodes (parents, preorder numbers, positions,
scopes), and libcst hashes a node by a Python method, `return id(self)`, which it
copies into every node class: about 3 million calls on that file, in every pass.
Node equality is identity (libcst's `__eq__` is `self is other`), so `object`'s own
hash, also by identity and computed in C, gives every set and dict the same answers;
every node class takes it when this module is imported, before any node is hashed
(each module of the analyses imports it through codemod.analysis.index).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import libcst as cst


def type_test(*types: type) -> Callable[[object], bool]:
    """A function of one value, the same as `isinstance(value, types)`."""
    answers: dict[type, bool] = {}

    def test(value: object) -> bool:
        kind = type(value)
        found = answers.get(kind)
        if found is None:
            found = answers[kind] = issubclass(kind, types)
        return found

    return test


_TESTS: dict[tuple[type, ...], Callable[[object], bool]] = {}


def type_test_of(types: type | tuple[type, ...]) -> Callable[[object], bool]:
    """The test of `types` (a class or a tuple of classes) for callers handed the types
    as an argument (`TreeIndex.enclosing`): one test per distinct tuple, made on first use."""
    key = types if isinstance(types, tuple) else (types,)
    found = _TESTS.get(key)
    if found is None:
        found = _TESTS[key] = type_test(*key)
    return found


def _node_classes(root: type) -> Iterator[type]:
    yield root
    for subclass in root.__subclasses__():
        yield from _node_classes(subclass)


def _hash_nodes_by_identity_in_c() -> None:
    libcst_hash = cst.CSTNode.__dict__["__hash__"]
    for kind in set(_node_classes(cst.CSTNode)):
        if kind.__dict__.get("__hash__") is libcst_hash:
            kind.__hash__ = object.__hash__


_hash_nodes_by_identity_in_c()

"""perfmod's scopes (no expression-context walk, no qualified-name look-up for most calls, linked reads and bindings as spans) are libcst's own."""

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ScopeProvider

from codemod.analysis.index import TreeIndex
from codemod.analysis.scopes import file_scopes, reads_of
from codemod.analysis.visits import read_only_visits
from tests.analysis.test_visits import FILES, REPO, facts

# String annotations that only the typing calls make visible, under every spelling.
TYPING = """
import typing
import typing as t
from typing import NewType, TypeVar, cast
from typing import cast as convert, TypeVar as TV, NewType as NT
import torch

class Model: ...
class Batch: ...

A = typing.cast("Model", None)
B = t.cast("Batch", None)
C = cast("Model", None)
D = convert("Batch", None)
T = TypeVar("T", "Model", "Batch")
U = TV("U", bound="Model")
Id = NewType("Id", "Batch")
Key = NT("Key", "Model")
E = torch.tensor([1.0]).cast("Model") if False else None
def f(x: "Model") -> "Batch":
    return cast("Batch", x)
"""


def scopes_both_ways(source: str):
    expected = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True).resolve(ScopeProvider)
    module = cst.parse_module(source)
    with read_only_visits():
        fast = file_scopes(TreeIndex(module))
    return facts(fast), facts(expected)


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(REPO)) for p in FILES])
def test_scopes_are_libcsts_own(path):
    fast, expected = scopes_both_ways(path.read_text(encoding="utf-8"))
    assert fast == expected


def test_typing_calls_keep_their_string_annotations():
    fast, expected = scopes_both_ways(TYPING)
    assert fast == expected
    module = cst.parse_module(TYPING)
    with read_only_visits():
        scopes = file_scopes(TreeIndex(module))
    module_scope = scopes[module.body[0]]
    # The strings are read as names, the aliased `convert("Batch", None)` included.
    assert (len(module_scope.accesses["Model"]), len(module_scope.accesses["Batch"])) == (6, 5)


# Reads before, between and after bindings, in every kind of scope: what libcst links
# one by one, the spans must hold exactly.
REBOUND = """
import os, os.path
import torch.nn as nn
from typing import List
x = 1
print(x)
x = x + 1
def f(y):
    print(x, y)
    y = y * 2
    z = [y for y in range(y) if y]
    w = (lambda y: y + x)(y)
    global g
    g = y
    return y, z, w
def outer():
    v = 1
    def inner():
        nonlocal v
        print(v)
        v = 2
        return v
    class C:
        v = v + 1
        def m(self, v=v) -> "List[int]":
            return v
    print(v)
    v = 3
    return inner, C
for x in range(3):
    x += 1
    print(x, os.path.join("a", "b"), nn.Linear)
print(g, x, len)
if (n := len([1])) > 0:
    print(n)
class D:
    x = x
    y: "nn.Module"
    def h(self):
        return x, D
try:
    import json
except ImportError:
    json = None
print(json)
"""


def links(scopes, module: cst.Module):
    """Every read with its referents, and every binding with its references, named
    by where their nodes are in the tree (so that two parses can be compared)."""
    order = {id(node): k for k, node in enumerate(TreeIndex(module).find(cst.CSTNode))}

    def where(node):
        return order.get(id(node), type(node).__name__)

    def binding(b):
        return (type(b).__name__, b.name, where(getattr(b, "node", None)))

    reads, bindings = {}, {}
    for scope in {id(s): s for s in scopes.values() if s is not None}.values():
        for access in scope.accesses:
            reads[(where(access.node), binding_scope(scope))] = sorted(map(binding, access.referents))
            for referent in access.referents:
                bindings[binding(referent)] = sorted((where(a.node), len(a.referents)) for a in referent.references)
        for assignment in scope.assignments:
            bindings[binding(assignment)] = sorted((where(a.node), len(a.referents)) for a in assignment.references)
    return reads, bindings


def binding_scope(scope):
    return (type(scope).__name__, getattr(scope, "name", None))


def links_both_ways(source: str):
    expected_module = cst.parse_module(source)
    expected = MetadataWrapper(expected_module, unsafe_skip_copy=True).resolve(ScopeProvider)
    module = cst.parse_module(source)
    with read_only_visits():
        fast = file_scopes(TreeIndex(module))
    return links(fast, module), links(expected, expected_module)


@pytest.mark.parametrize("path", FILES[::3], ids=[str(p.relative_to(REPO)) for p in FILES[::3]])
def test_reads_and_bindings_are_linked_as_libcst_links_them(path):
    fast, expected = links_both_ways(path.read_text(encoding="utf-8"))
    assert fast == expected


def test_rebound_names_in_every_kind_of_scope_are_linked_as_libcst_links_them():
    (fast_reads, fast_bindings), (reads, bindings) = links_both_ways(REBOUND)
    assert fast_reads == reads
    assert fast_bindings == bindings
    assert sum(len(referents) for referents in reads.values()) > 60  # the example reads many bindings


def test_referents_and_references_are_sets():
    module = cst.parse_module("x = 1\nx = 2\nprint(x)\nx = 3\nprint(x, x)\n")
    with read_only_visits():
        scopes = file_scopes(TreeIndex(module))
    scope = scopes[module.body[0]]
    first, second, third = sorted(scope.assignments["x"], key=lambda a: a._index)
    last_read = max(scope.accesses["x"], key=lambda a: a._index)
    assert len(last_read.referents) == 3 and third in last_read.referents and first in last_read.referents
    assert len(first.references) == 3 and last_read in first.references
    assert len(third.references) == 2 and last_read in third.references
    assert not any(a in third.references for a in scope.accesses["x"] if a._index < third._index)


def test_reads_of_bindings_are_their_references_united_each_once():
    module = cst.parse_module(REBOUND)
    with read_only_visits():
        scopes = file_scopes(TreeIndex(module))
    checked = 0
    for scope in {id(s): s for s in scopes.values() if s is not None}.values():
        for name in {a.name for a in scope.assignments}:
            bindings = scope[name]
            united = {id(read): read for binding in bindings for read in binding.references}
            found = reads_of(bindings)
            assert len(found) == len(united) and {id(read) for read in found} == set(united)
            checked += len(found)
    assert checked > 30

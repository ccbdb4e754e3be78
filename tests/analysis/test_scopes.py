"""perfmod's ScopeProvider (no qualified-name look-up for most calls) gives libcst's own scopes."""

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ScopeProvider

from codemod.analysis.index import TreeIndex
from codemod.analysis.scopes import scope_provider
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
        fast = MetadataWrapper(module, unsafe_skip_copy=True).resolve(scope_provider(TreeIndex(module)))
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
        scopes = MetadataWrapper(module, unsafe_skip_copy=True).resolve(scope_provider(TreeIndex(module)))
    module_scope = scopes[module.body[0]]
    # The strings are read as names, the aliased `convert("Batch", None)` included.
    assert (len(module_scope.accesses["Model"]), len(module_scope.accesses["Batch"])) == (6, 5)

"""Type tests answered once per type (codemod.analysis.node_types): the same answers as
`isinstance`, without ABCMeta's check on the paths every binding look-up takes."""

import abc
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import Assignment, ComprehensionScope

from codemod.analysis.node_types import type_test, type_test_of
from codemod.config import Settings
from codemod.context import FileContext

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "seed_latentwire.py"

TYPE_SETS = [
    (cst.Name,),
    (cst.Call, cst.Attribute),
    (cst.Tuple, cst.List, cst.Element, cst.StarredElement, cst.AssignTarget, cst.AsName, cst.WithItem),
    (cst.BaseExpression,),  # an abstract class: every expression's type is a subclass
    (cst.BaseCompoundStatement, cst.SimpleStatementLine),
]


@pytest.mark.parametrize("types", TYPE_SETS)
def test_answers_as_isinstance_does_for_every_node_of_a_script(types):
    context = FileContext.of_source(SCRIPT.read_text(encoding="utf-8"))
    test = type_test(*types)
    for node in context.index.find(cst.CSTNode):
        assert test(node) is isinstance(node, types)
        assert test(node) is isinstance(node, types)  # the kept answer, asked again
    assert test(None) is False


def test_answers_for_scopes_and_assignments_as_isinstance_does():
    context = FileContext.of_source("import torch\nx = [y for y in range(3)]\nprint(x, torch)\n")
    is_assignment, is_comprehension = type_test(Assignment), type_test(ComprehensionScope)
    scopes = set(context.scopes.values())
    assert any(is_comprehension(scope) for scope in scopes)
    for scope in scopes:
        assert is_comprehension(scope) is isinstance(scope, ComprehensionScope)
        for binding in scope.assignments:
            assert is_assignment(binding) is isinstance(binding, Assignment)


def test_one_test_per_tuple_of_types():
    assert type_test_of((cst.For, cst.While)) is type_test_of((cst.For, cst.While))
    assert type_test_of(cst.For) is type_test_of((cst.For,))
    assert type_test_of((cst.For, cst.While)) is not type_test_of((cst.While, cst.For))


def test_following_bindings_asks_no_abstract_class_check(monkeypatch):
    """The binding look-ups test the parents of every target on the way to its statement;
    through `isinstance` each parent that is none of seven node classes cost seven of
    ABCMeta's Python-level checks (a second of a 10,000-line file)."""
    context = FileContext.of_source(
        "a, (b, c) = f()\nwith open(p) as g:\n    pass\nfor i, j in pairs:\n    h = i + j\nh += 1\nprint(a, b, c, g, h)\n"
    )
    bindings, kinds = context.bindings, context.kinds
    targets = [a.node for scope in set(context.scopes.values()) for a in scope.assignments if type(a) is Assignment]
    reads = [name for name in context.index.find(cst.Name) if name.value in {"a", "b", "c", "g", "h"}]
    checks = []
    original = abc.ABCMeta.__instancecheck__

    def counted(cls, instance):
        checks.append(cls)
        return original(cls, instance)

    monkeypatch.setattr(abc.ABCMeta, "__instancecheck__", counted)
    for target in targets:
        bindings.statement(target)
        kinds.binding_source(target)
    for read in reads:
        kinds.reaching(read)
    assert checks == []


def test_every_node_class_hashes_by_identity_in_c():
    """Every table of the analyses is keyed by nodes; libcst's `__hash__` is a Python
    method on every node class (about 3 million calls a 10,000-line file)."""
    module = cst.parse_module(SCRIPT.read_text(encoding="utf-8"))
    nodes = FileContext(module, "<string>", Settings(), module.code).index.find(cst.CSTNode)
    assert {type(node).__hash__ for node in nodes} == {object.__hash__}
    twin = module.body[0].deep_clone()  # equal in value, another node
    table = {node: k for k, node in enumerate(nodes)}
    assert all(table[node] == k for k, node in enumerate(nodes))
    assert twin not in table and twin != module.body[0] and twin == twin

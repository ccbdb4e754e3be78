"""The one reader of literal numbers: every spelling Python accepts reads as Python reads it;
qualified names as libcst gives them."""

import libcst as cst
import pytest
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, ScopeProvider

from codemod.analysis.index import TreeIndex
from codemod.analysis.names import (
    Names,
    code_of,
    conjunction,
    integer_value,
    is_dotted_name,
    negation,
    number_value,
    plain_code,
    stored_targets,
    with_kwarg,
)
from codemod.analysis.scopes import file_scopes
from codemod.analysis.visits import read_only_visits
from codemod.context import FileContext


@pytest.mark.parametrize(
    "text, value",
    [("3", 3), ("-3", -3), ("+3", 3), ("0x4", 4), ("0o17", 15), ("0b101", 5), ("1_000", 1000), ("0", 0)],
)
def test_integer_spellings(text, value):
    assert integer_value(cst.parse_expression(text)) == value
    assert number_value(cst.parse_expression(text)) == value


@pytest.mark.parametrize("text, value", [("0.5", 0.5), ("-1e-3", -1e-3), ("1_0.2_5", 10.25), (".5", 0.5)])
def test_float_spellings(text, value):
    assert number_value(cst.parse_expression(text)) == value
    assert integer_value(cst.parse_expression(text)) is None


@pytest.mark.parametrize("text", ["n", "'3'", "3j", "-n", "~3", "(1 + 2)", "True"])
def test_anything_else_is_not_a_literal_number(text):
    assert number_value(cst.parse_expression(text)) is None
    assert integer_value(cst.parse_expression(text)) is None


def test_getattr_with_a_literal_name_names_the_attribute():
    context = FileContext.of_source(
        "import torch\nfrom torch import optim\nname = 'SGD'\n"
        "a = getattr(torch.optim, 'AdamW')(params)\n"
        "b = getattr(optim, 'SGD')\n"
        "c = getattr(torch.optim, name)(params)\n"
        "d = make_optimizer()(params)\n"
        "e = getattr(torch.optim, 'not a name')\n"
    )
    values = {
        statement.body[0].targets[0].target.value: statement.body[0].value for statement in context.module.body[3:]
    }
    names = context.names
    assert names.of(values["a"]) == names.of(values["a"].func) == {"torch.optim.AdamW"}
    assert names.of(values["b"]) == {"torch.optim.SGD"}
    assert names.of(values["b"].func) == {"builtins.getattr"}  # the callee of the getattr call itself
    assert names.of(values["c"]) == set()  # a name chosen at run time
    assert names.of(values["d"]) == set()  # what a call returns
    assert names.of(values["e"]) == {"builtins.getattr"}


@pytest.mark.parametrize(
    "code, plain",
    [
        ("model", "model"),
        ("self.opt.param_groups", "self.opt.param_groups"),
        ("(model)", None),
        ("(self).opt", None),
        ("self . opt", None),
        ("self.\\\nopt", None),
        ("(self.opt)", None),
        ("x[0].y", None),
        ("f().y", None),
    ],
)
def test_plain_code_reads_names_and_dotted_names_as_libcst_writes_them(code, plain):
    expr = cst.parse_expression(code)
    assert plain_code(expr) == plain
    if plain is not None:
        assert cst.Module([]).code_for_node(expr) == plain


def test_a_keyword_added_to_a_call_closed_on_its_own_line_goes_before_that_line_break():
    call = cst.parse_expression("torch.optim.AdamW(\n    params, lr=1e-3\n)")
    new = with_kwarg(call, "fused", cst.Name("True"))
    assert cst.Module([]).code_for_node(new) == "torch.optim.AdamW(\n    params, lr=1e-3, fused=True\n)"
    one_line = with_kwarg(cst.parse_expression("f(a, b=1)"), "c", cst.Name("True"))
    assert cst.Module([]).code_for_node(one_line) == "f(a, b=1, c=True)"


def test_a_keyword_added_to_a_call_laid_out_one_argument_a_line_gets_a_line_of_its_own():
    # Hand-aligned arguments, the last closing the call: the new one is aligned under them.
    aligned = "DataLoader(dataset=mnist,\n           batch_size=100,  # small\n           shuffle=True)"
    new = with_kwarg(cst.parse_expression(aligned), "pin_memory", cst.Name("True"))
    assert cst.Module([]).code_for_node(new) == aligned.replace("True)", "True,\n           pin_memory=True)")
    mixed = "f(a, b,\n  c)"  # not one a line: appended on the last line
    new = with_kwarg(cst.parse_expression(mixed), "d", cst.Name("True"))
    assert cst.Module([]).code_for_node(new) == "f(a, b,\n  c, d=True)"


REPEATED_IMPORTS = """
import torch
import torch.nn as tnn
from torch import nn, optim as o
from torch.utils import data
from . import helpers
from .helpers import load as fetch
x = torch.zeros(3).cuda()
import torch
import torch.nn as tnn
from torch import nn
from . import helpers
layer = nn.Linear(2, 2)
def step():
    y = torch.cuda.synchronize()
    return tnn.functional.relu(y), o.AdamW, data.DataLoader, helpers.run(), fetch()
import numpy as torch
z = torch.cuda.synchronize()
"""


def test_dotted_names_read_through_an_import_made_many_times_are_libcsts():
    module = cst.parse_module(REPEATED_IMPORTS)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ScopeProvider)
    with read_only_visits():
        names = Names(file_scopes(TreeIndex(module)))
    asked = []
    for node, scope in expected.items():
        # (an attribute of a computed value, `torch.zeros(2).cuda`, names nothing: see below)
        if isinstance(node, (cst.Attribute, cst.Name)) and scope is not None and is_dotted_name(node):
            assert names._qualified(node) == scope.get_qualified_names_for(node), get_full_name_for_node(node)
            asked.append(get_full_name_for_node(node))
    assert {"torch.cuda.synchronize", "tnn.functional.relu", "helpers.run", "data.DataLoader"} <= set(asked)


@pytest.mark.parametrize(
    "test, negated",
    [
        ("i % 4 == 0", "i % 4 != 0"),
        ("i % 4 != 0", "i % 4 == 0"),
        ("not done", "done"),
        ("a or b", "not (a or b)"),
        ("i < n", "not i < n"),
        ("(i == 0)", "not (i == 0)"),
    ],
)
def test_a_negated_test_reads_as_a_reader_would_write_it(test, negated):
    assert code_of(negation(cst.parse_expression(test))) == negated


@pytest.mark.parametrize(
    "left, right, both",
    [
        ("a", "b", "a and b"),
        ("a and b", "c", "a and b and c"),
        ("a or b", "c", "(a or b) and c"),
        ("a", "b if c else d", "a and (b if c else d)"),
        ("i < n", "not x", "i < n and (not x)"),
    ],
)
def test_a_conjunction_parenthesizes_only_the_operands_that_bind_looser(left, right, both):
    assert code_of(conjunction(cst.parse_expression(left), cst.parse_expression(right))) == both


def test_what_assignment_targets_store_to_through_tuples_lists_and_stars():
    module = cst.parse_module("a.x, (b[i], *c), [d] = v\n")
    targets = [t.target for t in module.body[0].body[0].targets]
    stored = stored_targets(targets)
    assert sorted(module.code_for_node(target) for target in stored) == ["a.x", "b[i]", "c", "d"]


def test_an_attribute_of_a_computed_value_names_nothing():
    """`torch.randn(3).T` is an attribute of a tensor made at run time, not a name the
    imports give ("torch.randn.T"); `(a + b).data` no more than `None.data`."""
    context = FileContext.of_source(
        "import torch\nx = torch.randn(3)\n"
        "a = torch.randn(3).T\nb = (x + x).data\nc = x[0].data\nd = torch.nn.functional.relu\n"
    )
    values = [statement.body[0].value for statement in context.module.body[2:]]
    assert [context.names.of(value) for value in values] == [set(), set(), set(), {"torch.nn.functional.relu"}]

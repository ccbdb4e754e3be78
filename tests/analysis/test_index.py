"""TreeIndex: the statement of the module's body that holds a node."""

import libcst as cst

from codemod.analysis.index import TreeIndex


def test_top_level_is_the_module_statement_around_a_node():
    module = cst.parse_module("import os\n\ndef f(x):\n    return g(x)\n\ny = f(1)\n")
    index = TreeIndex(module)
    call = index.find(cst.Call)[0]  # g(x), inside f
    assert index.top_level(call) is module.body[1]
    assert index.top_level(module.body[2]) is module.body[2]
    assert index.top_level(index.find(cst.Call)[1]) is module.body[2]
    assert index.top_level(module) is module
    assert index.unique


def test_the_statements_that_share_a_node_are_found():
    module = cst.parse_module("a = f(x)\nb = 1\nc = 2\n")
    shared_call = module.body[0].body[0].value
    body = list(module.body)
    body[2] = body[2].with_changes(body=[body[2].body[0].with_changes(value=shared_call)])
    twice = module.with_changes(body=body)
    index = TreeIndex(twice)
    assert not index.unique and index.shared_statements() == {0, 2}
    assert TreeIndex(module).shared_statements() == set()

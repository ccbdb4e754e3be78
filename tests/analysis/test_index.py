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


def _tables(index: TreeIndex) -> tuple:
    return (
        dict(index.parents),
        dict(index._order),
        list(index._nodes),
        list(index._ends),
        {kind: list(nodes) for kind, nodes in index._by_type.items()},
        index.unique,
    )


def test_an_index_of_a_rewrite_copies_the_shared_statements_and_equals_a_fresh_walk(monkeypatch):
    module = cst.parse_module("import os\n\ndef f(x):\n    return g(x)\n\ny = f(1)\nz = [y for y in range(3)]\n")
    earlier = TreeIndex(module)
    body = list(module.body)
    new = module.with_changes(body=[cst.parse_statement("w = h(2)\n"), body[1], body[3], body[2]])
    walked = _tables(TreeIndex(new))
    copied = []
    monkeypatch.setattr(TreeIndex, "_copy", lambda self, s, tables: (copied.append(s), copy(self, s, tables)))
    index = TreeIndex(new, earlier)
    assert copied == [body[1], body[3], body[2]]
    assert _tables(index) == walked
    assert index.find(cst.Call, within=body[2]) == [c for c in index.find(cst.Call) if index.inside(c, body[2])]
    # A statement the rewrite holds twice is found, as by a fresh walk.
    twice = module.with_changes(body=[body[1], body[1]])
    assert _tables(TreeIndex(twice, earlier)) == _tables(TreeIndex(twice))
    assert not TreeIndex(twice, earlier).unique
    assert TreeIndex(twice, earlier).shared_statements() == TreeIndex(twice).shared_statements()


copy = TreeIndex._copy


def test_the_names_a_file_spells_are_its_variables_attributes_and_keywords():
    index = TreeIndex(cst.parse_module("import torch\nloader = DataLoader(data, sampler=s)\nx = loader.batch_size\n"))
    assert index.spelled_names == {"torch", "loader", "DataLoader", "data", "sampler", "s", "x", "batch_size"}

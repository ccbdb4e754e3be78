"""TreeIndex: where a node sits (the statement, block, call, function and conditions around
it) and the nodes of a type under it."""

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


def test_the_index_of_the_module_with_its_shared_statements_cloned_is_made_from_the_tables_before():
    module = cst.parse_module("def f(x):\n    return g(x)\n\na = h(x)[:, 1:]\nb = 1\nc = 2\n")
    subscript = module.body[1].body[0].value
    body = list(module.body)
    body[3] = body[3].with_changes(body=[body[3].body[0].with_changes(value=subscript)])
    twice = module.with_changes(body=body)
    index = TreeIndex(twice)
    shared = index.shared_statements()
    assert not index.unique and shared == {1, 3}
    cloned = twice.with_changes(body=[s.deep_clone() if k in shared else s for k, s in enumerate(twice.body)])
    made = index.with_clones(cloned)
    assert made.unique and _tables(made) == _tables(TreeIndex(cloned))
    assert made.find(cst.Subscript, within=cloned.body[3]) == [cloned.body[3].body[0].value]
    assert made.parents[cloned.body[0]] is cloned and made.top_level(cloned.body[1].body[0]) is cloned.body[1]


def test_the_names_a_file_spells_are_its_variables_attributes_and_keywords():
    index = TreeIndex(cst.parse_module("import torch\nloader = DataLoader(data, sampler=s)\nx = loader.batch_size\n"))
    assert index.spelled_names == {"torch", "loader", "DataLoader", "data", "sampler", "s", "x", "batch_size"}


def _index(code: str) -> tuple[TreeIndex, cst.Module]:
    module = cst.parse_module(code)
    return TreeIndex(module), module


def _code(module: cst.Module, node) -> str | None:
    return module.code_for_node(node) if node is not None else None


def test_the_outermost_function_around_a_node():
    index, module = _index("def outer():\n    def inner():\n        return g(1)\n    return inner\nh(2)\n")
    g, h = index.find(cst.Call)
    assert index.outermost_enclosing(g, cst.FunctionDef) is module.body[0]
    assert index.first_enclosing(g, cst.FunctionDef) is not module.body[0]
    assert index.outermost_enclosing(h, cst.FunctionDef) is None


def test_the_statements_of_the_block_that_holds_a_statement():
    index, module = _index("a = 1\nfor x in y:\n    b = 2\n    c = 3\nif d: e = 4\n")
    loop = module.body[1]
    assert index.block_statements(loop) == list(module.body)
    assert index.block_statements(loop.body.body[1]) == list(loop.body.body)
    one_line = module.body[2].body.body[0]  # `e = 4` in a one-line suite
    assert index.block_statements(one_line) == [one_line]


def test_the_line_that_holds_a_small_statement():
    index, module = _index("def f():\n    return 1\n    if done: return 2\n")
    first, second = index.find(cst.Return)
    assert isinstance(index.holding_line(first), cst.SimpleStatementLine)
    assert isinstance(index.holding_line(second), cst.SimpleStatementSuite)


def test_a_call_alone_on_its_line_is_an_expression_statement():
    index, module = _index("torch.cuda.empty_cache()\nfreed = gc.collect()\nprint(gc.collect())\n")
    alone, assigned, _, passed = index.find(cst.Call)  # `print(...)` comes before the call it is passed
    assert index.expression_statement(alone) is module.body[0].body[0]
    assert index.expression_statement(assigned) is None
    assert index.expression_statement(passed) is None


def test_the_call_a_node_is_an_argument_of():
    index, module = _index(
        "total = sum(f(t) for t in ts)\nv = torch.stack(xs=[g(t) for t in ts])\nw = (h(t) for t in ts)\n"
    )
    summed, stacked, alone = index.find((cst.GeneratorExp, cst.ListComp))
    call, argument = index.argument_of(summed)
    assert _code(module, call.func) == "sum" and argument.value is summed
    call, argument = index.argument_of(stacked)
    assert _code(module, call.func) == "torch.stack" and argument.keyword.value == "xs"
    assert index.argument_of(alone) is None
    assert index.argument_of(module.body[0]) is None


def test_the_conditions_between_a_node_and_a_block_around_it():
    code = (
        "for batch in loader:\n"
        "    if cuda:\n"
        "        if step % 10 == 0:\n"
        "            torch.cuda.empty_cache()\n"
        "    if torch.cuda.memory_allocated() > limit:\n"
        "        pass\n"
        "    try:\n"
        "        step()\n"
        "    except RuntimeError:\n"
        "        if retry:\n"
        "            gc.collect()\n"
    )
    index, module = _index(code)
    loop = module.body[0]
    calls = {_code(module, call.func): call for call in index.find(cst.Call)}
    outer, inner = loop.body.body[0], loop.body.body[0].body.body[0]
    assert index.conditions_within(calls["torch.cuda.empty_cache"], loop) == [inner, outer]
    assert index.conditions_within(calls["torch.cuda.empty_cache"], outer) == [inner]
    assert index.conditions_within(calls["torch.cuda.memory_allocated"], loop) == []  # in the test, not a branch
    assert index.conditions_within(calls["gc.collect"], loop) is None  # after an error


def test_the_modules_a_file_imports_under_their_own_name():
    index, _ = _index("import os, numpy as np\nimport torch.nn\ndef f():\n    import json\nfrom torch import nn\n")
    assert index.plain_imports == {"os", "json"}


def test_the_variables_a_node_spells():
    index, module = _index("x = model(data, device=dev).logits\nfor i, (a, b) in enumerate(pairs):\n    pass\n")
    assert index.variable_names(module.body[0]) == {"x", "model", "data", "dev"}
    assert index.variable_names(module.body[1]) == {"i", "a", "b", "enumerate", "pairs"}

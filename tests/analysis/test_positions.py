"""Positions are libcst's own (PositionProvider), computed one top-level statement
at a time from start lines that Python's `ast` gives without generating code."""

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from codemod.analysis import positions as positions_module
from codemod.analysis.index import TreeIndex
from codemod.analysis.positions import Positions, statement_starts

SOURCES = {
    "decorators_and_comments": "x = 1\n\n(\n  a\n).b = 2\n# c\n\n@d\n# between\n@e(\n 1)\ndef f():\n    pass\n\n\n"
    "class C: pass\na = 1; b = 2\nif x:\n    y = 1  # note\nelse:\n    pass\n\n\n# tail\n",
    "header_and_strings": "#!/usr/bin/env python\n# header\n\nimport os\n'''doc\nstring'''\nx = '\\d'\n"
    "async def g():\n    await h(\n        1)\n",
    "bare_continuation": "x = [\n1,\n2]\n\\\n\ny = 3\n",
    "crlf": "x = 1\r\ny = 2\r\n",
}


@pytest.mark.parametrize("name", SOURCES)
def test_every_node_has_libcsts_position(name):
    code = SOURCES[name]
    module = cst.parse_module(code)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    positions = Positions(module, TreeIndex(module).parents, code)
    for node in TreeIndex(module).find(cst.CSTNode):
        if node is not module and node in expected:
            assert positions[node] == expected[node], module.code_for_node(node)


def test_every_node_of_a_whole_script_has_libcsts_position():
    """Every node, whitespace and punctuation too, over a whole training script."""
    code = (Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "seed_latentwire.py").read_text()
    module = cst.parse_module(code)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    positions = Positions(module, _all_parents(module), code)
    assert len(expected) > 5000
    for node, where in expected.items():
        if node is not module:
            assert positions[node] == where, module.code_for_node(node)


def _all_parents(module: cst.Module) -> dict:
    parents = {}

    def walk(node):
        for child in node.children:
            parents[child] = node
            walk(child)

    walk(module)
    return parents


def test_start_lines_come_from_ast_where_it_lines_up_and_from_code_elsewhere():
    code = SOURCES["decorators_and_comments"]
    module = cst.parse_module(code)
    positions = Positions(module, {}, code)
    assert positions._lines_from_ast() == positions._lines_from_code()
    assert Positions(module, {}, SOURCES["bare_continuation"])._lines_from_ast() is None


@pytest.mark.parametrize("name", SOURCES)
def test_the_code_generated_for_positions_is_the_statements_code(name):
    code = SOURCES[name]
    module = cst.parse_module(code)
    positions = Positions(module, TreeIndex(module).parents, code)
    for statement in module.body:
        positions[statement]  # generates the statement's code once, keeping it
        assert statement in positions._texts
        assert positions.text(statement) == module.code_for_node(statement)


@pytest.mark.parametrize("name", SOURCES)
def test_a_rewrite_takes_the_ranges_of_the_statements_it_shares_moved_to_their_new_lines(name, monkeypatch):
    code = SOURCES[name]
    module = cst.parse_module(code)
    earlier = Positions(module, TreeIndex(module).parents, code)
    for node in TreeIndex(module).find(cst.CSTNode):
        earlier[node]
    # Two lines more at the top, and the last statement rewritten.
    body = [cst.parse_statement("import sys\n"), cst.parse_statement("z = 0\n"), *module.body[:-1]]
    new = module.with_changes(body=[*body, cst.parse_statement("w = (1,\n  2)\n")])
    generated = []
    monkeypatch.setattr(Positions, "_compute", lambda self, s: (generated.append(s), compute(self, s)))
    positions = Positions(new, TreeIndex(new).parents, new.code, earlier)
    expected = MetadataWrapper(new, unsafe_skip_copy=True).resolve(PositionProvider)
    for node in TreeIndex(new).find(cst.CSTNode):
        if node is not new and node in expected:
            assert positions[node] == expected[node], new.code_for_node(node)
    assert generated == [*body[:2], new.body[-1]]  # the shared statements took their ranges
    assert all(positions.text(s) == new.code_for_node(s) for s in new.body)


compute = Positions._compute


@pytest.mark.parametrize("name", ["decorators_and_comments", "header_and_strings"])
def test_a_statement_alone_has_the_starts_libcst_gives_it_in_a_module_of_its_own(name):
    for statement in cst.parse_module(SOURCES[name]).body:
        alone = statement.with_changes(leading_lines=[])
        module = cst.Module([alone])
        expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        starts = statement_starts(alone)
        assert len(starts) == len(expected) - 1  # every node but the module
        for node, where in expected.items():
            if node is not module:
                assert starts[node] == (where.start.line, where.start.column)


NESTED = (
    "import torch\n\n\n@decorate\nclass Trainer:\n    # the model\n    def fit(self, loader):\n"
    "        for x, y in loader:\n\n            # one step\n            with torch.autocast('cuda'):\n"
    "                loss = self.model(x).sum(\n                    1)\n            if loss > 0: skip()\n"
    "            a = 1; b = (2,\n  3)\n        else:\n            done()\n        while True:\n"
    "              break\n        try:\n            pass\n        except E:\n            pass\n"
)


@pytest.mark.parametrize(
    "code",
    [NESTED, (Path(__file__).resolve().parents[2] / "fixtures" / "scripts" / "seed_latentwire.py").read_text()],
)
def test_a_node_in_a_block_takes_the_ranges_of_its_innermost_statement_generated_alone(code, monkeypatch):
    """Asked first for a node inside a function, a class or a loop, positions generate
    the innermost statement of a block holding it, at its line with the blocks'
    indentation, not the whole top-level statement: the same ranges as libcst's."""
    module = cst.parse_module(code)
    index = TreeIndex(module)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    generate = positions_module.generated
    made = []
    monkeypatch.setattr(
        positions_module, "generated", lambda statement, *rest: (made.append(statement), generate(statement, *rest))[1]
    )
    nested = 0
    every = 1 if code is NESTED else 9  # (a sample of a whole script's nodes: each asks `ast` again)
    for node in index.find(cst.CSTNode)[::every]:
        if node is module or node not in expected:
            continue
        made.clear()
        positions = Positions(module, index.parents, code)  # nothing generated yet
        assert positions[node] == expected[node], module.code_for_node(node)
        top = next(s for s in module.body if index.inside(node, s))
        if made[0] is not top:
            nested += 1
            assert index.inside(node, made[0])  # (the node's own statement, or one around it)
    assert nested > 20

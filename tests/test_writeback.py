"""The rewritten text: untouched statements copied from the file, replaced ones generated
and checked, and the whole equal to what libcst writes for the new module."""

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

import codemod.engine as engine
from codemod import layout
from codemod.analysis.index import TreeIndex
from codemod.analysis.positions import Positions
from codemod.config import Settings
from codemod.context import FileContext
from codemod.rule import Level
from codemod.rules import ALL_RULES
from codemod.writeback import written

REPO = Path(__file__).resolve().parents[1]
SOURCE = '#!/usr/bin/env python\n"""Doc."""\n\nimport torch  # model\n\n\n# the loop\nfor x in data:\n    step(x)\ny  =  2\n# end\n'


def context(module: cst.Module, code: str) -> FileContext:
    return FileContext(module, "t.py", Settings(), code)


def replaced(module: cst.Module, k: int, statement: str) -> cst.Module:
    body = list(module.body)
    body[k] = cst.parse_statement(statement)
    return module.with_changes(body=body)


def test_the_text_is_libcsts_own_for_the_new_module():
    module = cst.parse_module(SOURCE)
    new = replaced(module, 2, "for x in data:\n    step(x, non_blocking=True)\n")
    text, checked = written(new, context(module, SOURCE))
    assert checked and text == new.code
    assert text.startswith('#!/usr/bin/env python\n"""Doc."""\n\nimport torch  # model\n')
    assert text.endswith("y  =  2\n# end\n")


def test_added_and_removed_statements():
    module = cst.parse_module(SOURCE)
    body = [module.body[0], cst.parse_statement("import os\n"), module.body[1], *module.body[3:]]
    new = module.with_changes(body=body)
    text, checked = written(new, context(module, SOURCE))
    assert (
        checked and text == new.code and "for x" not in text and "import os\n\nimport torch  # model\ny  =  2\n" in text
    )


def test_untouched_statements_are_copied_as_written():
    # A text whose second statement libcst would write differently: it is copied as it is.
    module = cst.parse_module("x = 1\ny = 2\n")
    new = replaced(module, 0, "x = 3\n")
    text, checked = written(new, context(module, "x = 1\ny   =   2\n"))
    assert checked and text == "x = 3\ny   =   2\n"


def test_a_replaced_statement_libcst_would_not_write_back_is_not_checked():
    module = cst.parse_module("x = 1\ny = 2\n")
    new = replaced(module, 1, "y = 3\n")
    text, checked = written(new, context(module, "x = 1\ny   =   2\n"))
    assert not checked and text == new.code  # the engine then compares the whole file


def test_lines_after_the_last_statement_are_copied_when_a_transform_rebuilt_them():
    # The engine's layout pass, a transform of the module, builds the blank and comment
    # lines after the last statement (the module's footer) again: equal lines, new nodes.
    source = "x = 1\ny = 2\n\n\n# end\n"
    module = cst.parse_module(source)
    index = TreeIndex(module)
    new = replaced(module, 0, "x = 3\n")
    new = layout.wrapped(new, lambda node: node not in index, lambda statement: (None, 1))
    assert new.footer and not any(a is b for a, b in zip(new.footer, module.footer))
    text, checked = written(new, context(module, source))
    assert checked and text == new.code == "x = 3\ny = 2\n\n\n# end\n"


def test_the_lines_of_the_statements_are_those_ast_reads_from_the_text():
    # The engine's next pass takes them instead of reading the text with `ast` again.
    module = cst.parse_module(SOURCE)
    added = cst.parse_statement("import os\n")
    new = replaced(module, 2, "# a loop no more\nz = [step(x) for x in data]\n")
    new = new.with_changes(body=[new.body[0], added, *new.body[1:]])
    lines: list[int] = []
    text, checked = written(new, context(module, SOURCE), lines)
    read = context(new, text).positions.statement_lines()
    assert checked and lines == [read[statement] for statement in new.body]
    assert [text.splitlines()[line - 1] for line in lines] == [
        '"""Doc."""',
        "import os",
        "",
        "# a loop no more",
        "y  =  2",
    ]


@pytest.mark.parametrize(
    "source",
    [
        "x = 1",  # no newline at the end
        "\x0cx = 1\n",  # a form feed: ast and libcst count lines differently
        "x = 1\r\ny = 2\r\n",
        "x = (1,\n\\\n 2)\n",  # a line that is only a backslash
    ],
)
def test_texts_that_cannot_be_cut_into_statements_are_generated_whole(source):
    module = cst.parse_module(source)
    new = replaced(module, 0, "x = 2\n")
    text, checked = written(new, context(module, source))
    assert not checked and text == new.code


# PM202 rewrites the batching of the first, so PM102, PM103 and PM201 run a second pass;
# PM505's fix of the second puts one node in two places.
TWO_PASSES = [("PM202/randperm_epochs.in.py", "PM505/read_orders_and_layouts.in.py")]


def parses(monkeypatch, first: str, second: str) -> tuple[int, int]:
    """(parses, passes) of the engine on the two rule fixtures in one file."""
    counts = {"parse": 0, "pass": 0}
    original_parse, original_pass = engine.parse, engine._run_pass

    def parse(data):
        counts["parse"] += 1
        return original_parse(data)

    def run_pass(*args):
        counts["pass"] += 1
        return original_pass(*args)

    monkeypatch.setattr(engine, "parse", parse)
    monkeypatch.setattr(engine, "_run_pass", run_pass)
    rules = REPO / "fixtures" / "rules"
    code = (rules / first).read_text() + "\n\n" + (rules / second).read_text()
    settings = Settings(level=Level.UNSAFE, select=tuple(rule.CODE for rule in ALL_RULES))
    result = engine.process_source(code.encode(), "t.py", settings, ALL_RULES)
    assert result.error is None and result.changed
    compile(result.new_source, "t.py", "exec")
    return counts["parse"], counts["pass"]


@pytest.mark.parametrize("first, second", TWO_PASSES)
def test_a_later_pass_does_not_parse_the_rewritten_text_again(monkeypatch, first, second):
    parsed, passes = parses(monkeypatch, first, second)
    assert parsed == 1 and passes >= 2


@pytest.mark.parametrize("first, second", TWO_PASSES)
def test_without_the_clones_the_later_pass_would_parse_again(monkeypatch, first, second):
    monkeypatch.setattr(TreeIndex, "shared_statements", lambda self: set())
    parsed, passes = parses(monkeypatch, first, second)
    assert passes >= 2 and 1 < parsed <= passes  # later passes parse again


def test_the_statements_it_generates_come_with_their_ranges_for_the_next_pass(monkeypatch):
    module = cst.parse_module(SOURCE)
    new = replaced(module, 2, "for x in data:\n    step(\n        x, non_blocking=True)\n")
    new = new.with_changes(body=[cst.parse_statement("import os\n"), *new.body])
    lines: list[int] = []
    ranges: dict = {}
    text, checked = written(new, context(module, SOURCE), lines, ranges)
    assert checked and text == new.code and set(ranges) == {new.body[0], new.body[3]}
    generated = []
    monkeypatch.setattr(Positions, "_compute", lambda self, s: generated.append(s))
    positions = Positions(new, TreeIndex(new).parents, text, None, lines, ranges)
    expected = MetadataWrapper(new, unsafe_skip_copy=True).resolve(PositionProvider)
    for statement in ranges:
        for node in TreeIndex(new).find(cst.CSTNode, within=statement):
            assert positions[node] == expected[node], new.code_for_node(node)
        assert positions.text(statement) == new.code_for_node(statement)
    assert generated == []  # generated once, by `written`


def test_a_pass_that_did_not_ask_hands_the_ranges_written_for_it_on(monkeypatch):
    module = cst.parse_module(SOURCE)
    new = replaced(module, 2, "for x in data:\n    step(x, non_blocking=True)\n")
    lines: list[int] = []
    ranges: dict = {}
    text, _ = written(new, context(module, SOURCE), lines, ranges)
    between = Positions(new, TreeIndex(new).parents, text, None, lines, ranges)  # asked nothing
    again = new.with_changes(body=[cst.parse_statement("import os\n"), *new.body])
    generated = []
    monkeypatch.setattr(Positions, "_compute", lambda self, s: (generated.append(s), compute(self, s)))
    positions = Positions(again, TreeIndex(again).parents, again.code, between)
    expected = MetadataWrapper(again, unsafe_skip_copy=True).resolve(PositionProvider)
    for node in TreeIndex(again).find(cst.CSTNode, within=new.body[2]):
        assert positions[node] == expected[node], again.code_for_node(node)
    assert generated == []  # moved down a line from the ranges `written` gave the pass between


compute = Positions._compute


@pytest.mark.parametrize("first, second", TWO_PASSES)
def test_a_later_pass_generates_no_statement_the_text_was_written_from(monkeypatch, first, second):
    handed: list = []  # the statements `written` generated, with their ranges
    generated: list = []  # the statements the positions of a pass generated
    original_written = engine.written

    def recording_written(new, old, lines=None, ranges=None):
        result = original_written(new, old, lines, ranges)
        handed.extend(ranges or ())
        return result

    monkeypatch.setattr(engine, "written", recording_written)
    monkeypatch.setattr(Positions, "_compute", lambda self, s: (generated.append(s), compute(self, s)))
    parses(monkeypatch, first, second)
    assert handed and not {id(s) for s in handed} & {id(s) for s in generated}


@pytest.mark.parametrize("first, second", TWO_PASSES)
def test_a_pass_on_a_rewrite_that_puts_a_node_in_two_places_walks_the_tree_once(monkeypatch, first, second):
    built = []  # the modules the engine built an index for by walking them

    class Walked(TreeIndex):
        def __init__(self, module, earlier=None):
            built.append(module)
            super().__init__(module, earlier)

    contexts = []  # the modules the passes ran on
    original_context = engine._context

    def context(*args):
        made = original_context(*args)
        contexts.append(made.module)
        return made

    monkeypatch.setattr(engine, "TreeIndex", Walked)
    monkeypatch.setattr(engine, "_context", context)
    parses(monkeypatch, first, second)
    assert 1 < len(contexts) == len(built)  # the clones' index is made from the tables of the first

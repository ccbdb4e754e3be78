"""The engine's own contract, with small test-only rules."""

import libcst as cst
from libcst.metadata import ParentNodeProvider

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level, Rule


class RenameCallsToSnake(Rule):
    """Test rule: `f(...)` -> `snake(...)` for any call of a bare name `f`."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM901", "test-rename", Level.SAFE, "rename", ""

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "f":
            self.report(node, replacement=node.with_changes(func=cst.Name("snake")))


class WrapInList(Rule):
    """Test rule at level numeric: `g(x)` -> `[g(x)]` (once), adding `import json`."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM902", "test-wrap", Level.NUMERIC, "wrap", ""

    def visit_Call(self, node):
        wrapped = isinstance(self.get_metadata(ParentNodeProvider, node), cst.Element)
        if isinstance(node.func, cst.Name) and node.func.value == "g" and not wrapped:
            self.report(node, replacement=cst.List([cst.Element(node)]), imports=[("json", None)])


class Crashes(Rule):
    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM903", "test-crash", Level.SAFE, "boom", ""

    def visit_Call(self, node):
        raise RuntimeError("rule bug")


class DropStatementsCallingDrop(Rule):
    """Test rule: removes every statement `<anything>.drop(...)` or `drop(...)`."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM904", "test-drop", Level.SAFE, "drop", ""

    def visit_Expr(self, node):
        call = node.value
        if isinstance(call, cst.Call):
            name = call.func.attr.value if isinstance(call.func, cst.Attribute) else getattr(call.func, "value", None)
            if name == "drop":
                self.report(node, replacement=cst.RemovalSentinel.REMOVE)


TEST_RULES = [RenameCallsToSnake, WrapInList]


def run(source: str, level=Level.UNSAFE, rules=TEST_RULES, **settings):
    return process_source(source.encode(), "t.py", Settings(level=level, **settings), rules)


def test_nested_fixes_from_different_rules_all_apply_over_passes():
    # f(...) sits inside g(...): both replacements cannot be applied in one pass.
    result = run("y = g(f(1))\n")
    assert result.new_source.decode() == "import json\n\ny = [g(snake(1))]\n"
    assert [f.code for f in result.findings] == ["PM902", "PM901"]
    assert all(f.applied for f in result.findings)


def test_level_gates_fixes_but_keeps_findings():
    result = run("y = g(f(1))\n", level=Level.SAFE)
    assert result.new_source.decode() == "y = g(snake(1))\n"
    applied = {f.code: f.applied for f in result.findings}
    assert applied == {"PM901": True, "PM902": False}


def test_second_run_changes_nothing():
    first = run("a = f(g(f(2)))  # keep this comment\n")
    second = process_source(first.new_source, "t.py", Settings(level=Level.UNSAFE), TEST_RULES)
    assert second.new_source == first.new_source and not second.pending
    assert b"# keep this comment" in first.new_source


def test_import_is_added_once_for_many_fixes():
    result = run("import json\na = g(1)\nb = g(2)\n")
    assert result.new_source.decode().count("import json") == 1


def test_an_import_the_fix_made_unused_is_removed_and_others_stay():
    source = ("import gc\nimport os.path as g2\nfrom shelf import drop\nimport kept\nimport never_used\n"
              "gc.drop()\ng2.drop()\ndrop()\nkept.drop()\nkept.other()\nx = 1\n")
    result = run(source, rules=[DropStatementsCallingDrop])
    assert result.new_source.decode() == "import kept\nimport never_used\nkept.other()\nx = 1\n"


def test_an_import_still_used_elsewhere_stays():
    result = run("import gc\ngc.drop()\nprint(gc.isenabled())\n", rules=[DropStatementsCallingDrop])
    assert result.new_source.decode() == "import gc\nprint(gc.isenabled())\n"


def test_a_relative_import_is_left_alone():
    result = run("from . import gc\ngc.drop()\nx = 1\n", rules=[DropStatementsCallingDrop])
    assert result.error is None
    assert result.new_source.decode() == "from . import gc\nx = 1\n"


def test_suppression_comment_blocks_one_code_only():
    result = run("y = f(1)  # perfmod: ignore[PM902]\nz = f(2)  # perfmod: ignore\n")
    assert result.new_source.decode() == "y = snake(1)  # perfmod: ignore[PM902]\nz = f(2)  # perfmod: ignore\n"


def test_suppression_holds_in_later_passes():
    # The outer fix forces a second pass; the suppressed inner call must stay.
    result = run("y = g(f(1))  # perfmod: ignore[PM901]\n")
    assert "f(1)" in result.new_source.decode() and "snake" not in result.new_source.decode()


def test_a_crashing_rule_leaves_the_file_untouched_and_says_so():
    result = run("f(1)\n", rules=[RenameCallsToSnake, Crashes])
    assert result.new_source is None and not result.changed
    assert result.error.startswith("t.py:1:1: error: internal error")
    assert "RuntimeError: rule bug" in result.error


class NeverSettles(Rule):
    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM904", "test-loop", Level.SAFE, "grow", ""

    def visit_Integer(self, node):
        self.report(node, replacement=cst.Integer(str(int(node.value) + 1)))


def test_a_rule_that_never_settles_is_an_error_not_a_silent_half_fix():
    result = run("x = 1\n", rules=[NeverSettles])
    assert result.new_source is None
    assert "PM904 keep rewriting" in result.error


def test_unparsable_source_reports_line_and_column():
    result = run("x = 1\ny = (\n")
    assert result.error is not None and result.error.startswith("t.py:")
    assert ": error: syntax error" in result.error
    assert result.new_source is None


def test_deselected_rules_do_not_run():
    result = run("y = g(f(1))\n", select=("PM901",))
    assert [f.code for f in result.findings] == ["PM901"]


class NeedsMarker(RenameCallsToSnake):
    CODE, NAME = "PM905", "test-requires"
    REQUIRES = ("marker",)


def test_rules_skip_files_without_their_required_text():
    assert not run("f(1)\n", rules=[NeedsMarker]).findings
    assert [f.code for f in run("marker = f(1)\n", rules=[NeedsMarker]).findings] == ["PM905"]


# libcst does not give back every file byte for byte: whitespace after the last newline is
# partly dropped (seen in pytorch/examples). Such a file must never change for nothing.
NOT_ROUND_TRIPPED = "y = f(1)\n   \n   "


def test_libcst_really_drops_whitespace_after_the_last_newline():
    assert cst.parse_module(NOT_ROUND_TRIPPED).code != NOT_ROUND_TRIPPED  # else the tests below test nothing


def test_a_file_without_fixes_is_given_back_byte_for_byte_even_where_libcst_would_not():
    result = run(NOT_ROUND_TRIPPED.replace("f(1)", "h(1)"))
    assert result.error is None and not result.changed
    assert result.new_source == NOT_ROUND_TRIPPED.replace("f(1)", "h(1)").encode()


def test_fixes_to_a_file_libcst_cannot_write_back_are_an_error_and_the_file_stays():
    result = run(NOT_ROUND_TRIPPED)
    assert not result.changed and result.findings == []
    assert result.error.startswith("t.py:1:1: error: libcst cannot write this file back byte for byte")
    assert "end the file with a newline" in result.error

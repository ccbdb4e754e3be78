"""What a rewrite looks like: the lines perfmod writes are laid out as the user's
formatter would leave them (no stray blank line where statements went), and the
user's own lines stay as written."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from codemod.config import Settings
from codemod.edits import Remove
from codemod.engine import process_source
from codemod.report.text import apply_report
from codemod.rule import Level, Rule


class DropCallsOfDrop(Rule):
    """Removes every statement that calls `drop()`."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM921", "test-drop-format", Level.SAFE, "drop", ""

    def visit_SimpleStatementLine(self, node):
        if "drop()" in self.context.source(node):
            self.report(node, edits=[Remove(node)])


def rewrite(source: str, rules) -> str:
    result = process_source(source.encode(), "t.py", Settings(level=Level.UNSAFE), rules)
    assert result.error is None, result.error
    return result.new_source.decode()


def test_removing_the_first_statements_of_a_block_leaves_no_blank_line_at_its_top():
    source = "for x in y:\n    drop()\n    drop()\n\n    a = x\n    b = a\n"
    assert rewrite(source, [DropCallsOfDrop]) == "for x in y:\n    a = x\n    b = a\n"


def test_a_comment_above_the_new_first_statement_stays():
    source = "for x in y:\n    drop()\n\n    # keep this\n    a = x\n"
    assert rewrite(source, [DropCallsOfDrop]) == "for x in y:\n    # keep this\n    a = x\n"


def test_the_users_blank_line_at_the_top_of_a_block_stays_when_its_first_statement_does():
    source = "for x in y:\n\n    a = x\n    drop()\n    b = a\n"
    assert rewrite(source, [DropCallsOfDrop]) == "for x in y:\n\n    a = x\n    b = a\n"


def test_the_blank_line_that_separated_a_removed_statement_stays_above_the_next():
    source = "def f(x):\n    a = x\n\n    drop()\n    b = a\n    return b\n"
    assert rewrite(source, [DropCallsOfDrop]) == "def f(x):\n    a = x\n\n    b = a\n    return b\n"


def test_a_removed_statement_between_two_blank_lines_leaves_one():
    source = "a = 1\n\ndrop()\n\nb = 2\n"
    assert rewrite(source, [DropCallsOfDrop]) == "a = 1\n\nb = 2\n"
    source = "for x in y:\n    a = x\n\n    drop()\n\n    b = a\n"
    assert rewrite(source, [DropCallsOfDrop]) == "for x in y:\n    a = x\n\n    b = a\n"


def test_a_block_emptied_by_the_fix_gets_pass():
    assert rewrite("if x:\n    drop()\nz = 1\n", [DropCallsOfDrop]) == "if x:\n    pass\nz = 1\n"
    assert cst.parse_module(rewrite("if x:\n    drop()\n", [DropCallsOfDrop]))


# -- what the summary counts ----------------------------------------------------------------

SEED = Path(__file__).resolve().parent.parent / "fixtures" / "scripts" / "seed_latentwire.py"


def test_the_summary_counts_each_rules_own_fixes_and_those_another_fix_settles_apart():
    """PM103's prefetcher replaces two copies PM101 would make non-blocking: those two
    findings are settled by PM103's fix, and are no PM101 fixes in the diff."""
    result = process_source(SEED.read_bytes(), "train.py", Settings(level=Level.UNSAFE, root=SEED.parent))
    assert result.error is None
    settled = [f for f in result.findings if f.fixed_by]
    assert [(f.code, f.fixed_by) for f in settled] == [("PM101", "PM103"), ("PM101", "PM103")]
    own = [f for f in result.findings if f.applied and not f.fixed_by]
    report = apply_report([result], Level.UNSAFE, dry_run=False).splitlines()
    assert report[0].startswith(f"Fixed train.py: {len(own)} fixes (PM101, PM102, PM103, ")
    assert report[0].endswith("; they also settle 2 findings (PM101 x2)")
    assert report[1] == f"Applied {len(own)} fixes to 1 file (1 file checked)."


def test_a_value_the_fix_reads_twice_is_computed_once():
    """PM201 reads the worker count twice (workers, and whether they persist): one call of
    default_num_workers(), bound before the loader."""
    result = process_source(SEED.read_bytes(), "train.py", Settings(level=Level.UNSAFE, root=SEED.parent))
    rewritten = result.new_source.decode()
    assert rewritten.count("default_num_workers()") == 1
    assert "    num_workers = default_num_workers()\n    loader = DataLoader(\n" in rewritten
    assert "        num_workers=num_workers,\n        persistent_workers=num_workers > 0,\n" in rewritten

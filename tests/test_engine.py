"""The engine's own contract, with small test-only rules: edits compose in one
pass, conflicts are settled and reported, the scope guard drops fixes that would
read undefined names, imports come and go, later passes run only on request."""

import libcst as cst
import pytest

from codemod.config import Settings
from codemod.edits import AddKeyword, InsertBefore, Move, Remove, Replace, Wrap
from codemod.engine import passes, process_source
from codemod.report.diff import unattributed_changes
from codemod.rule import Level, Rule


class RenameCallsToSnake(Rule):
    """`f(...)` -> `snake(...)`: a fixed replacement of the callee name, which is imported."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM901", "test-rename", Level.SAFE, "rename", ""

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "f":
            self.report(node, edits=[Replace(node.func, cst.Name("snake"))], imports=[("snakes", "snake")])


class WrapInList(Rule):
    """`g(x)` -> `[g(x)]` at level numeric, built from the updated call, adding `import json`."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM902", "test-wrap", Level.NUMERIC, "wrap", ""

    def visit_Call(self, node):
        wrapped = isinstance(self.context.parents.get(node), cst.Element)
        if isinstance(node.func, cst.Name) and node.func.value == "g" and not wrapped:
            self.report(
                node, edits=[Replace(node, lambda updated: cst.List([cst.Element(updated)]))], imports=[("json", None)]
            )


class ReplaceWholeStatementOfH(Rule):
    """A statement calling `h(...)` becomes `done = True`: it discards what was inside."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM906", "test-discard", Level.UNSAFE, "discard", ""

    def visit_SimpleStatementLine(self, node):
        if "h(" in self.context.source(node):
            self.report(node, replacement=cst.parse_statement("done = True\n"))


class Crashes(Rule):
    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM903", "test-crash", Level.SAFE, "boom", ""

    def visit_Call(self, node):
        raise RuntimeError("rule bug")


class DropStatementsCallingDrop(Rule):
    """Removes every statement `<anything>.drop(...)` or `drop(...)`."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM904", "test-drop", Level.SAFE, "drop", ""

    def visit_SimpleStatementLine(self, node):
        call = node.body[0].value if isinstance(node.body[0], cst.Expr) else None
        if isinstance(call, cst.Call):
            name = call.func.attr.value if isinstance(call.func, cst.Attribute) else getattr(call.func, "value", None)
            if name == "drop":
                self.report(node, edits=[Remove(node)])


class QuietCalls(Rule):
    """`run(...)` gets `quiet=True`."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM907", "test-keyword", Level.SAFE, "quiet", ""

    def visit_Call(self, node):
        if is_unquiet_run(node):
            self.report(node, edits=[AddKeyword(node, "quiet", cst.Name("True"))])


def is_unquiet_run(node: cst.Call) -> bool:
    named = isinstance(node.func, cst.Name) and node.func.value == "run"
    return named and not any(a.keyword and a.keyword.value == "quiet" for a in node.args)


class GuardLoops(Rule):
    """The body of every `for` loop goes under `with contextlib.nullcontext(limit):`,
    and `limit = 3` is set before the loop."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM908", "test-wrap-run", Level.SAFE, "guard", ""

    def visit_For(self, node):
        body = node.body.body
        if len(body) == 1 and "nullcontext(limit)" in self.context.source(body[0]).splitlines()[0]:
            return  # guarded already
        self.report(
            node,
            edits=[
                InsertBefore(node, (cst.parse_statement("limit = 3\n"),)),
                Wrap(body[0], body[-1], (cst.WithItem(cst.parse_expression("contextlib.nullcontext(limit)")),)),
            ],
            imports=[("contextlib", None)],
        )


class UsesDevice(Rule):
    """Inserts `policy = str(device)` before each `step()` statement: it reads `device`."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM909", "test-guard", Level.SAFE, "policy", ""

    def visit_SimpleStatementLine(self, node):
        block = self.context.parents[node].body
        before = [s for s in block[: block.index(node)] if "policy = " in self.context.source(s)]
        if self.context.source(node).strip() == "step()" and not before:
            self.report(node, edits=[InsertBefore(node, (cst.parse_statement("policy = str(device)\n"),))])


class ImportsPrecision(Rule):
    """`mixed()` -> `Precision.on()`, importing Precision from runtime.amp."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM910", "test-import", Level.SAFE, "precision", ""

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "mixed":
            self.report(
                node,
                edits=[Replace(node, cst.parse_expression("Precision.on()"))],
                imports=[("runtime.amp", "Precision")],
            )


class SeesSnakes(Rule):
    """Reports `snake(...)` calls, which only exist after PM901's fixes: it runs after PM901."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM911", "test-after", Level.SAFE, "snake seen", ""
    AFTER = ("PM901",)

    def visit_Call(self, node):
        if (
            isinstance(node.func, cst.Name)
            and node.func.value == "snake"
            and not any(a.keyword and a.keyword.value == "seen" for a in node.args)
        ):
            self.report(node, edits=[AddKeyword(node, "seen", cst.Name("True"))])


class HoistConstants(Rule):
    """Moves `k = const(...)` out of the `for` loop around it, in front of that loop."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM912", "test-move", Level.SAFE, "hoist", ""

    def visit_SimpleStatementLine(self, node):
        if not self.context.source(node.body[0]).startswith("k = const("):
            return
        loop = self.context.index.first_enclosing(node, cst.For)
        if loop is not None:
            self.report(node, edits=[Move(node, loop)])


class PrefetchCopies(Rule):
    """Removes `x = copy(x)` statements, doing their work elsewhere (it supersedes them)."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM913", "test-supersede", Level.UNSAFE, "prefetch", ""

    def visit_SimpleStatementLine(self, node):
        if self.context.source(node).strip().startswith("x = copy("):
            self.report(node, edits=[Remove(node, supersedes=True)])


TEST_RULES = [RenameCallsToSnake, WrapInList]


def run(source: str, level=Level.UNSAFE, rules=TEST_RULES, **settings):
    return process_source(source.encode(), "t.py", Settings(level=level, **settings), rules)


def changed_lines_outside_fixes(result) -> list[str]:
    return unattributed_changes(result)


# -- composition ------------------------------------------------------------------------


def test_nested_fixes_from_different_rules_compose_in_one_pass():
    result = run("y = g(f(1))\n")
    assert result.new_source.decode() == "import json\nfrom snakes import snake\n\ny = [g(snake(1))]\n"
    assert [f.code for f in result.findings] == ["PM902", "PM901"]
    assert all(f.applied for f in result.findings)
    assert changed_lines_outside_fixes(result) == []


def test_a_wrap_composes_with_a_keyword_and_a_removal_inside_it():
    source = "for i in range(2):\n    run(i)\n    drop()\n    x = i\n"
    result = run(source, rules=[GuardLoops, QuietCalls, DropStatementsCallingDrop])
    assert result.new_source.decode() == (
        "import contextlib\n\nlimit = 3\nfor i in range(2):\n    with contextlib.nullcontext(limit):\n        run(i, quiet=True)\n        x = i\n"
    )
    assert all(f.applied for f in result.findings)
    assert changed_lines_outside_fixes(result) == []


def test_inserted_statements_take_the_blank_lines_and_leave_the_comment_on_its_statement():
    source = "x = 1\n\n# the loop\nfor i in range(2):\n    pass\n"
    result = run(source, rules=[GuardLoops])
    assert result.new_source.decode() == (
        "import contextlib\n\nx = 1\n\nlimit = 3\n# the loop\nfor i in range(2):\n    with contextlib.nullcontext(limit):\n        pass\n"
    )


def test_a_removed_statement_takes_its_own_comments_and_an_emptied_block_gets_pass():
    source = "if ok:\n    # tidy up\n    drop()  # now\nx = 1\n"
    result = run(source, rules=[DropStatementsCallingDrop])
    assert result.new_source.decode() == "if ok:\n    pass\nx = 1\n"


BRANCH_LEFT_EMPTY = [
    ("if ok:\n        drop()\n    else:\n        x = 1\n", "if not ok:\n        x = 1\n"),
    ("if not ok:\n        drop()\n    else:\n        x = 1\n", "if ok:\n        x = 1\n"),
    ("if a == b:\n        drop()\n    else:\n        x = 1\n", "if a != b:\n        x = 1\n"),
    ("if a is not b:\n        drop()\n    else:\n        x = 1\n", "if a is b:\n        x = 1\n"),
    ("if a in (b,):\n        drop()\n    else:\n        x = 1\n", "if a not in (b,):\n        x = 1\n"),
    ("if a and b:\n        drop()\n    else:\n        x = 1\n", "if not (a and b):\n        x = 1\n"),
    ("if a < b:\n        drop()\n    else:\n        x = 1\n", "if not a < b:\n        x = 1\n"),
    ("if ok:\n        x = 1\n    else:\n        drop()\n", "if ok:\n        x = 1\n"),
    # an `elif` tests something else, and a comment above `else:` would be lost
    ("if a:\n        drop()\n    elif b:\n        x = 1\n", "if a:\n        pass\n    elif b:\n        x = 1\n"),
    (
        "if ok:\n        drop()\n    # else\n    else:\n        x = 1\n",
        "if ok:\n        pass\n    # else\n    else:\n        x = 1\n",
    ),
]


@pytest.mark.parametrize(("branches", "expected"), BRANCH_LEFT_EMPTY)
def test_an_if_whose_body_the_fixes_empty_takes_its_else_under_the_negated_test(branches, expected):
    source = f"def f(ok, a, b):\n    x = 0\n    {branches}    return x\n"
    result = run(source, rules=[DropStatementsCallingDrop])
    new = result.new_source.decode()
    assert new == f"def f(ok, a, b):\n    x = 0\n    {expected}    return x\n"
    before, after = {"drop": lambda: None}, {}
    exec(source, before)
    exec(new, after)
    for ok in (True, False, 0, 1):
        for a, b in ((1, 1), (1, 2), (float("nan"), float("nan")), (None, None)):
            if a is None and "<" in branches:
                continue
            assert before["f"](ok, a, b) == after["f"](ok, a, b)


def test_comments_set_apart_from_a_removed_statement_and_above_statements_that_stay_stay():
    source = (
        "setup()\n# -- the loop --\n\n# free memory\ngc.drop()\n# the step\nstep()  # one step\n"
        "# clean up again\ndrop()\n\n# report\nreport()\n"
    )
    result = run(source, rules=[DropStatementsCallingDrop])
    assert (
        result.new_source.decode()
        == "setup()\n# -- the loop --\n\n# the step\nstep()  # one step\n\n# report\nreport()\n"
    )
    assert changed_lines_outside_fixes(result) == []


class ReplaceSoftmaxRun(Rule):
    """`a = scores(q)` then `a = norm(a)` then `y = a @ v`: the first two go and the last
    becomes `y = attend(q, v)`, one fix that replaces the run."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM918", "test-run", Level.SAFE, "attend", ""

    def visit_IndentedBlock(self, node):
        body = list(node.body)
        texts = [self.context.source(s.body[0]) if isinstance(s, cst.SimpleStatementLine) else "" for s in body]
        for k in range(len(body) - 2):
            if texts[k : k + 3] == ["a = scores(q)", "a = norm(a)", "y = a @ v"]:
                product = body[k + 2].body[0].value
                self.report(
                    product,
                    edits=[
                        Remove(body[k]),
                        Remove(body[k + 1]),
                        Replace(product, cst.parse_expression("attend(q, v)")),
                    ],
                )


class DropIndexLine(Rule):
    """`idx = pick(b)` goes and `x[idx]` in the next line becomes `x_batch`: that line is
    edited in part, and keeps its comments."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM919", "test-part", Level.SAFE, "index", ""

    def visit_Subscript(self, node):
        line = self.context.index.statement_of(node)
        block = list(self.context.parents[line].body)
        at = block.index(line)
        if at and self.context.source(block[at - 1].body[0]) == "idx = pick(b)":
            self.report(node, edits=[Remove(block[at - 1]), Replace(node, cst.Name("x_batch"))])


def test_a_line_a_fix_edits_in_part_next_to_what_it_removes_keeps_its_comments():
    source = (
        "for b in range(2):\n    # the rows\n    idx = pick(b)\n    # to the GPU\n    u = x[idx].cuda()  # a copy\n"
    )
    result = run(source.replace("for b", "x_batch = 1\nfor b"), rules=[DropIndexLine])
    assert (
        result.new_source.decode()
        == "x_batch = 1\nfor b in range(2):\n    # to the GPU\n    u = x_batch.cuda()  # a copy\n"
    )


def test_a_replaced_run_of_statements_takes_the_comments_inside_it_and_on_its_last_line():
    source = (
        "from lib import attend, norm, scores\n\n\ndef f(q, v):\n    # the heads\n    q = q.view(2)  # (B, nh, T, hs)\n\n"
        "    # attention: (B, nh, T, T)\n    a = scores(q)\n    # masked\n    a = norm(a)\n"
        "    y = a @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)\n"
        "    # back to (B, T, C)\n    return y.view(3)  # re-assemble\n"
    )
    result = run(source, rules=[ReplaceSoftmaxRun])
    assert result.new_source.decode() == (
        "from lib import attend\n\n\ndef f(q, v):\n    # the heads\n    q = q.view(2)  # (B, nh, T, hs)\n\n"
        "    y = attend(q, v)\n"
        "    # back to (B, T, C)\n    return y.view(3)  # re-assemble\n"
    )
    assert changed_lines_outside_fixes(result) == []


def test_level_gates_fixes_but_keeps_findings():
    result = run("y = g(f(1))\n", level=Level.SAFE)
    assert result.new_source.decode() == "from snakes import snake\n\ny = g(snake(1))\n"
    applied = {f.code: f.applied for f in result.findings}
    assert applied == {"PM901": True, "PM902": False}


def test_second_run_changes_nothing():
    first = run("a = f(g(f(2)))  # keep this comment\n")
    second = process_source(first.new_source, "t.py", Settings(level=Level.UNSAFE), TEST_RULES)
    assert second.new_source == first.new_source and not second.pending
    assert b"# keep this comment" in first.new_source


# -- conflicts ----------------------------------------------------------------------------


def test_a_fix_that_discards_code_wins_over_fixes_inside_it_and_they_say_why():
    result = run("value = h(f(1))\nother = f(2)\n", rules=[RenameCallsToSnake, ReplaceWholeStatementOfH])
    assert result.new_source.decode() == "from snakes import snake\n\ndone = True\nother = snake(2)\n"
    inner = next(f for f in result.findings if f.code == "PM901" and f.line == 1)
    assert not inner.applied and not inner.fixable
    # The next round, on the rewritten file, no longer has the code: no run fixes it.
    assert inner.message == "rename (not fixed: PM906's fix on line 1 removes or rewrites this code)"
    assert all(f.applied for f in result.findings if f is not inner)


def test_overlapping_wraps_of_one_block_conflict_and_nested_ones_compose():
    class WrapFirstTwo(Rule):
        CODE, NAME, LEVEL, MESSAGE, GAIN = "PM912", "test-first-two", Level.SAFE, "two", ""

        def visit_For(self, node):
            body = node.body.body
            if not isinstance(body[0], cst.With) and len(body) > 2:
                self.report(node, edits=[Wrap(body[0], body[1], (cst.WithItem(cst.parse_expression("open(i)")),))])

    class WrapLastTwo(WrapFirstTwo):
        CODE, NAME = "PM913", "test-last-two"

        def visit_For(self, node):
            body = node.body.body
            if not isinstance(body[0], cst.With) and len(body) > 2:
                self.report(node, edits=[Wrap(body[1], body[2], (cst.WithItem(cst.parse_expression("len(i)")),))])

    source = "for i in x:\n    p()\n    q()\n    r()\n"
    result = run(source, rules=[WrapFirstTwo, WrapLastTwo])
    assert result.new_source.decode() == "for i in x:\n    with open(i):\n        p()\n        q()\n    r()\n"
    loser = next(f for f in result.findings if f.code == "PM913")
    assert "wraps an overlapping run of statements" in loser.message and not loser.applied
    nested = run(source, rules=[WrapFirstTwo, GuardLoops])
    assert nested.new_source.decode() == (
        "import contextlib\n\nlimit = 3\nfor i in x:\n    with contextlib.nullcontext(limit):\n        with open(i):\n            p()\n            q()\n        r()\n"
    )


def test_two_rules_passing_the_same_keyword_differently_conflict():
    class Loud(QuietCalls):
        CODE, NAME = "PM914", "test-loud"

        def visit_Call(self, node):
            if is_unquiet_run(node):
                self.report(node, edits=[AddKeyword(node, "quiet", cst.Name("False"))])

    result = run("run(1)\n", rules=[QuietCalls, Loud])
    assert result.new_source.decode() == "run(1, quiet=True)\n"
    assert "passes `quiet` differently" in next(f for f in result.findings if f.code == "PM914").message


# -- scope guard --------------------------------------------------------------------------


def test_a_fix_reading_a_name_not_defined_where_it_goes_is_dropped_and_says_why():
    source = (
        "device = 'cuda'\n\nclass Trainer:\n    def __init__(self):\n        self.device = device\n\n"
        "    def train(self):\n        step()\n\ndef main(device):\n    step()\n"
    )
    result = run(source.replace("device = 'cuda'\n\n", ""), rules=[UsesDevice])
    method, function = sorted(result.findings, key=lambda f: f.line)
    assert not method.applied and "the fix would use `device`, not defined where it would go" in method.message
    assert function.applied
    assert result.new_source.decode().count("policy = str(device)") == 1
    with_global = run(source, rules=[UsesDevice])
    assert all(f.applied for f in with_global.findings)


def test_a_fix_importing_a_name_the_file_uses_for_something_else_is_dropped():
    result = run("class Precision:\n    pass\nx = mixed()\n", rules=[ImportsPrecision])
    assert not result.changed
    assert "imports `Precision`, a name this file already uses" in result.findings[0].message


# -- imports ---------------------------------------------------------------------------------


def test_imports_go_after_the_docstring_and_the_imports_at_the_top_once():
    source = '"""Doc."""\nimport os\nfrom runtime.amp import other\n\nx = mixed()\ny = mixed()\n'
    result = run(source, rules=[ImportsPrecision])
    assert result.new_source.decode() == (
        '"""Doc."""\nimport os\nfrom runtime.amp import Precision, other\n\nx = Precision.on()\ny = Precision.on()\n'
    )
    assert changed_lines_outside_fixes(result) == []


def test_an_import_is_added_once_for_many_fixes():
    result = run("import json\na = g(1)\nb = g(2)\n")
    assert result.new_source.decode().count("import json") == 1


def test_an_import_the_fix_made_unused_is_removed_and_others_stay():
    source = (
        "import gc\nimport os.path as g2\nfrom shelf import drop\nimport kept\nimport never_used\n"
        "gc.drop()\ng2.drop()\ndrop()\nkept.drop()\nkept.other()\nx = 1\n"
    )
    result = run(source, rules=[DropStatementsCallingDrop])
    assert result.new_source.decode() == "import kept\nimport never_used\nkept.other()\nx = 1\n"
    assert changed_lines_outside_fixes(result) == []


def test_an_import_still_used_elsewhere_stays():
    result = run("import gc\ngc.drop()\nprint(gc.isenabled())\n", rules=[DropStatementsCallingDrop])
    assert result.new_source.decode() == "import gc\nprint(gc.isenabled())\n"


def test_a_relative_import_made_unused_goes_too():
    result = run("from . import gc\ngc.drop()\nx = 1\n", rules=[DropStatementsCallingDrop])
    assert result.error is None
    assert result.new_source.decode() == "x = 1\n"


# -- passes ----------------------------------------------------------------------------------


def test_a_rule_that_needs_another_rules_output_runs_after_it_with_original_lines():
    result = run("import os\n\nx = f(1)\n", rules=[SeesSnakes, RenameCallsToSnake])
    assert result.new_source.decode() == "import os\n\nfrom snakes import snake\n\nx = snake(1, seen=True)\n"
    seen = next(f for f in result.findings if f.code == "PM911")
    assert seen.applied and seen.line == 3
    again = process_source(result.new_source, "t.py", Settings(level=Level.UNSAFE), [SeesSnakes, RenameCallsToSnake])
    assert not again.pending


def test_passes_follow_the_declared_order_and_a_cycle_is_an_error():
    assert [[r.CODE for r in group] for group in passes([SeesSnakes, RenameCallsToSnake])] == [["PM901"], ["PM911"]]
    assert [[r.CODE for r in group] for group in passes([SeesSnakes])] == [["PM911"]]

    class First(RenameCallsToSnake):
        CODE, AFTER = "PM915", ("PM916",)

    class Second(RenameCallsToSnake):
        CODE, AFTER = "PM916", ("PM915",)

    with pytest.raises(ValueError, match="cycle"):
        passes([First, Second])


def test_rules_without_declared_order_need_one_pass_however_many_fixes_nest():
    assert len(passes([RenameCallsToSnake, WrapInList, GuardLoops, QuietCalls, DropStatementsCallingDrop])) == 1


def test_a_later_pass_runs_only_where_the_rule_it_waits_for_has_a_fix(monkeypatch):
    from codemod import engine

    calls = []
    original = engine._run_pass
    monkeypatch.setattr(engine, "_run_pass", lambda *a: calls.append(1) or original(*a))
    result = run("x = snake(1)\n", rules=[SeesSnakes, RenameCallsToSnake])  # PM901 fixes nothing
    # one pass, and one more round on the rewritten file, which finds nothing left
    assert len(calls) == 2 and [f.code for f in result.findings] == ["PM911"] and result.findings[0].applied
    calls.clear()
    result = run("x = snake(1)\ny = f(2)\n", rules=[SeesSnakes, RenameCallsToSnake])
    assert len(calls) == 3
    assert (
        result.new_source.decode() == "from snakes import snake\n\nx = snake(1, seen=True)\ny = snake(2, seen=True)\n"
    )
    assert sorted((f.line, f.code) for f in result.findings) == [(1, "PM911"), (2, "PM901"), (2, "PM911")]


def test_a_later_pass_reads_a_rewritten_tree_that_holds_one_node_twice_from_clones(monkeypatch):
    from codemod import engine

    parsed = []
    parse = engine.parse
    monkeypatch.setattr(engine, "parse", lambda data: parsed.append(data) or parse(data))
    run("x = f(1)\ny = f(2)\n", rules=[SeesSnakes, RenameCallsToSnake])
    assert len(parsed) == 1  # the later pass analyses the rewritten tree itself
    parsed.clear()
    shared = cst.Name("snake")

    class RenameToOneSharedNode(RenameCallsToSnake):
        def visit_Call(self, node):
            if isinstance(node.func, cst.Name) and node.func.value == "f":
                self.report(node, edits=[Replace(node.func, shared)], imports=[("snakes", "snake")])

    result = run("x = f(1)\ny = f(2)\n", rules=[SeesSnakes, RenameToOneSharedNode])
    assert (
        result.new_source.decode() == "from snakes import snake\n\nx = snake(1, seen=True)\ny = snake(2, seen=True)\n"
    )
    assert all(f.applied for f in result.findings) and len(result.findings) == 4
    assert len(parsed) == 1  # the statements holding `shared` were cloned, not parsed again


# -- moves and superseding removals ------------------------------------------------------------


def test_a_moved_statement_carries_the_edits_inside_it_and_its_comments():
    source = "for i in range(2):\n    # the table\n    k = const(run(1))\n    run(i)\n"
    result = run(source, rules=[HoistConstants, QuietCalls])
    assert result.new_source.decode() == (
        "# the table\nk = const(run(1, quiet=True))\nfor i in range(2):\n    run(i, quiet=True)\n"
    )
    assert all(f.applied for f in result.findings)
    assert changed_lines_outside_fixes(result) == []
    assert not run(result.new_source.decode(), rules=[HoistConstants]).findings


def test_a_move_out_of_nested_loops_and_a_block_left_empty():
    source = "def main():\n    for e in range(2):\n        for i in range(3):\n            k = const(2)\n"

    class HoistOutOfAll(HoistConstants):
        def visit_SimpleStatementLine(self, node):
            loops = list(self.context.index.enclosing(node, cst.For))
            if loops and self.context.source(node).strip().startswith("k = const("):
                self.report(node, edits=[Move(node, loops[-1])])

    result = run(source, rules=[HoistOutOfAll])
    assert result.new_source.decode() == (
        "def main():\n    k = const(2)\n    for e in range(2):\n        for i in range(3):\n            pass\n"
    )


def test_a_move_conflicts_with_a_removal_of_the_same_statement_and_is_validated():
    class DropHoisted(DropStatementsCallingDrop):
        def visit_SimpleStatementLine(self, node):
            if self.context.source(node).strip().startswith("k = const("):
                self.report(node, edits=[Remove(node)])

    result = run("for i in range(2):\n    k = const(1)\n", rules=[HoistConstants, DropHoisted])
    assert [f.applied for f in result.findings].count(True) == 1
    assert any("moves or removes the same statement" in f.message for f in result.findings)

    class MovesIntoAnotherFunction(HoistConstants):
        def visit_SimpleStatementLine(self, node):
            if self.context.source(node).strip().startswith("k = const("):
                self.report(node, edits=[Move(node, self.context.module.body[0])])

    result = run("def f():\n    pass\ndef g():\n    k = const(1)\n", rules=[MovesIntoAnotherFunction])
    assert not result.changed
    assert "moves a statement out of its function" in result.findings[0].message

    class MovesIntoTheOtherBranch(HoistConstants):
        def visit_SimpleStatementLine(self, node):
            if self.context.source(node.body[0]).startswith("k = const("):
                branch = self.context.module.body[0].body.body[0]
                self.report(node, edits=[Move(node, branch)])

    result = run("if c:\n    pass\nelse:\n    k = const(1)\n", rules=[MovesIntoTheOtherBranch])
    assert not result.changed
    assert "moves a statement to a block that does not contain it" in result.findings[0].message


def test_a_fix_inside_a_statement_that_another_fix_supersedes_is_settled_by_it():
    source = "for b in data:\n    x = copy(run(b))\n    use(x)\n"
    result = run(source, rules=[PrefetchCopies, QuietCalls])
    assert result.new_source.decode() == "for b in data:\n    use(x)\n"
    quiet = next(f for f in result.findings if f.code == "PM907")
    assert quiet.applied and quiet.fixable and "fixed by PM913's fix on line 2" in quiet.message
    # a plain removal does not settle it: the keyword's fix is left for the next run
    result = run(source, rules=[DropStatementsCallingDrop, QuietCalls])
    assert all(f.applied for f in result.findings)


# -- findings ----------------------------------------------------------------------------------


def test_findings_carry_their_range():
    result = run("y = (\n    f(1,\n      2)\n)\n", rules=[RenameCallsToSnake])
    finding = result.findings[0]
    assert (finding.line, finding.column, finding.end_line, finding.end_column) == (2, 5, 3, 9)
    assert finding.fix_lines == ((1, 1), (2, 2))  # the import goes before line 1


def test_suppression_comment_blocks_one_code_only():
    result = run("y = f(1)  # perfmod: ignore[PM902]\nz = f(2)  # perfmod: ignore\n")
    assert (
        result.new_source.decode()
        == "from snakes import snake\n\ny = snake(1)  # perfmod: ignore[PM902]\nz = f(2)  # perfmod: ignore\n"
    )


def test_suppression_holds_for_a_later_pass():
    result = run("x = f(1)  # perfmod: ignore[PM911]\n", rules=[SeesSnakes, RenameCallsToSnake])
    assert result.new_source.decode() == "from snakes import snake\n\nx = snake(1)  # perfmod: ignore[PM911]\n"


def test_a_crashing_rule_leaves_the_file_untouched_and_says_so():
    result = run("f(1)\n", rules=[RenameCallsToSnake, Crashes])
    assert result.new_source is None and not result.changed
    assert result.error.startswith("t.py:1:1: error: internal error")
    assert "RuntimeError: rule bug" in result.error


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


def test_the_changes_of_all_fixes_rebuild_the_rewritten_file():
    from codemod.report.diff import fix_changes

    source = '"""Doc."""\nimport os\n\nfor i in range(2):\n    run(i)\n    drop()\n    x = mixed()\n'
    result = run(source, rules=[GuardLoops, QuietCalls, DropStatementsCallingDrop, ImportsPrecision])
    assert all(f.applied for f in result.findings)
    changes = {(c.offset, c.length): c for per_finding in fix_changes(result) for c in per_finding}
    text = source
    for change in sorted(changes.values(), key=lambda c: c.offset, reverse=True):
        text = text[: change.offset] + change.text + text[change.offset + change.length :]
    assert text == result.new_source.decode()


class ImportsPrefetcher(Rule):
    """`batches()` -> `DevicePrefetcher(batches())`, importing it from perfmod's runtime."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM917", "test-runtime", Level.SAFE, "prefetch", ""

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "batches":
            self.report(
                node,
                edits=[Replace(node, lambda updated: cst.Call(cst.Name("DevicePrefetcher"), [cst.Arg(updated)]))],
                imports=[("runtime.data", "DevicePrefetcher")],
            )


@pytest.mark.parametrize("shadow", ["runtime.py", "runtime/__init__.py", "runtime/helpers.py"])
def test_a_projects_own_runtime_module_blocks_fixes_that_import_perfmods(tmp_path, shadow):
    (tmp_path / shadow).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / shadow).write_text("SEED = 1\n")
    script = tmp_path / "train.py"
    result = process_source(b"for b in batches():\n    pass\n", str(script), Settings(), [ImportsPrefetcher])
    (finding,) = result.findings
    assert not result.changed and not finding.applied
    assert f"`{tmp_path / shadow.split('/')[0]}" in finding.message and "rename that module" in finding.message


def test_perfmods_own_runtime_beside_a_script_is_no_shadow(tmp_path):
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "__init__.py").write_text('"""What rewritten training code calls; usable on its own."""\n')
    result = process_source(
        b"for b in batches():\n    pass\n", str(tmp_path / "train.py"), Settings(), [ImportsPrefetcher]
    )
    assert result.changed and "DevicePrefetcher(batches())" in result.new_source.decode()


@pytest.mark.parametrize("source", ["x = 1\n", "x = (\n"], ids=["parses", "syntax-error"])
def test_collections_are_off_while_a_file_is_parsed_and_on_again_after(monkeypatch, source):
    import gc

    from codemod import engine

    seen = []
    real_parse = engine.parse

    def parse(data):
        seen.append(gc.isenabled())
        return real_parse(data)

    monkeypatch.setattr(engine, "parse", parse)
    assert gc.isenabled()
    result = process_source(source.encode(), "f.py", Settings(), [])
    assert seen == [False] and gc.isenabled()
    assert (result.error is None) == (source == "x = 1\n")


# -- what the fixes leave unread ----------------------------------------------------------


class KeepFirstArgumentOfUse(Rule):
    """`y = use(a, ...)` -> `y = a`: the other arguments are no longer read there."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM909", "test-keep-first", Level.SAFE, "keep the first", ""

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "use" and node.args:
            self.report(node, edits=[Replace(node, node.args[0].value)])


UNREAD = """\
import torch


def f(t, x):
    first = x * 2

    # the causal mask
    mask = torch.tril(torch.ones(t, t)).bool()
    noise = torch.randn(t)
    total = 0.0
    total += x
    y = use(first, mask, noise, total)
    return y
"""


def test_a_side_effect_free_assignment_the_fixes_leave_unread_goes_with_its_comment():
    result = run(UNREAD, rules=[KeepFirstArgumentOfUse])
    # (the blank line above it stays, between the statements it separated)
    assert result.new_source.decode() == UNREAD.replace(
        "    # the causal mask\n    mask = torch.tril(torch.ones(t, t)).bool()\n", ""
    ).replace("use(first, mask, noise, total)", "first")
    # `first` is read by the replacement, `noise` drew random numbers, `total` is read by `+=`
    finding = result.findings[0]
    assert (6, 8) in finding.fix_lines  # the removed lines (with those above them) are part of the fix


def test_an_assignment_read_elsewhere_too_stays():
    source = UNREAD.replace("    return y\n", "    return y, mask\n")
    result = run(source, rules=[KeepFirstArgumentOfUse])
    assert "mask = torch.tril" in result.new_source.decode()


@pytest.mark.parametrize(
    "reader",
    [
        "    z = [mask[i] for i in range(t)]\n",  # a comprehension is a scope of its own
        "    g = lambda: mask\n",  # a closure
        "    for i in range(t):\n        print(mask)\n        mask = torch.ones(t)\n",  # carried round a loop
    ],
)
def test_an_assignment_read_in_a_nested_scope_or_round_a_loop_stays(reader):
    source = UNREAD.replace("    return y\n", reader + "    return y\n")
    result = run(source, rules=[KeepFirstArgumentOfUse])
    assert "mask = torch.tril" in result.new_source.decode()


CHAINED = """\
import torch


def f(t, x):
    mask = torch.tril(torch.ones(t, t))
    mask = mask.view(1, 1, t, t)
    y = use(x, mask)
    return y
"""


def test_a_chain_of_assignments_the_fixes_leave_unread_goes_whole():
    """`mask = mask.view(...)` goes with the fix, and with it the only read of the mask it
    reshaped: that one goes too (and the import no code reads any more)."""
    result = run(CHAINED, rules=[KeepFirstArgumentOfUse])
    assert result.new_source.decode() == "\n\ndef f(t, x):\n    y = x\n    return y\n"


def test_a_chain_of_assignments_read_again_further_down_stays_whole():
    source = CHAINED.replace("    return y\n", "    return y, mask\n")
    result = run(source, rules=[KeepFirstArgumentOfUse])
    assert "mask = torch.tril" in result.new_source.decode() and "mask = mask.view" in result.new_source.decode()


# -- a fixed point in one run -------------------------------------------------------------


class FastRuns(Rule):
    """`run(x)` -> `run(x, fast=True)`, a new call in place of the old one: it discards
    the code inside (QuietCalls' keyword waits for the next round)."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM915", "test-fast", Level.SAFE, "fast", ""

    def visit_Call(self, node):
        fast = any(a.keyword and a.keyword.value == "fast" for a in node.args)
        if isinstance(node.func, cst.Name) and node.func.value == "run" and not fast:
            self.report(
                node,
                edits=[
                    Replace(node, node.with_changes(args=[*node.args, cst.parse_expression("g(fast=True)").args[0]]))
                ],
            )


class SnakesSeen(SeesSnakes):
    """SeesSnakes without `AFTER`: PM901's snakes are its findings only in the next round."""

    CODE, NAME, AFTER = "PM916", "test-seen", ()


def test_one_run_reaches_the_fixed_point_a_second_run_would_reach():
    source = "run(1)\nx = f(2)\n"
    result = run(source, rules=[FastRuns, QuietCalls, RenameCallsToSnake, SnakesSeen])
    assert (
        result.new_source.decode()
        == "from snakes import snake\n\nrun(1, fast=True, quiet=True)\nx = snake(2, seen=True)\n"
    )
    # each finding once, each applied, none left for another run; the changes are theirs
    assert sorted((f.line, f.code) for f in result.findings) == [(1, "PM907"), (1, "PM915"), (2, "PM901"), (2, "PM916")]
    assert all(f.applied and "run perfmod again" not in f.message for f in result.findings)
    assert changed_lines_outside_fixes(result) == []
    again = process_source(result.new_source, "t.py", Settings(level=Level.UNSAFE), [FastRuns, QuietCalls])
    assert not again.findings and again.new_source == result.new_source


def test_a_file_without_fixes_takes_one_pass(monkeypatch):
    from codemod import engine

    calls = []
    original = engine._run_pass
    monkeypatch.setattr(engine, "_run_pass", lambda *a: calls.append(1) or original(*a))
    result = run("x = snake(1, seen=True)\nrun(2, quiet=True)\n", rules=[SnakesSeen, QuietCalls])
    assert len(calls) == 1 and result.findings == [] and not result.changed


def test_fixes_that_never_settle_stop_after_the_last_round_and_say_so():
    class Grows(Rule):
        """`x = N` -> `x = N + 1`, every time: no fixed point."""

        CODE, NAME, LEVEL, MESSAGE, GAIN = "PM917", "test-grows", Level.SAFE, "grow", ""

        def visit_Integer(self, node):
            self.report(node, edits=[Replace(node, cst.Integer(str(int(node.value) + 1)))])

    from codemod.engine import MAX_ROUNDS

    result = run("x = 1\n", rules=[Grows])
    assert result.new_source.decode() == f"x = {MAX_ROUNDS}\n"  # MAX_ROUNDS - 1 rounds made their fix
    applied, left = sorted(result.findings, key=lambda f: f.applied)[::-1]
    assert applied.applied and applied.message == "grow"
    assert not left.applied and left.fixable
    assert f"the fixes did not settle in {MAX_ROUNDS - 1} rounds; run perfmod again" in left.message


def test_a_value_bound_before_its_statement_takes_a_name_no_variable_of_the_file_has():
    from codemod.analysis.index import TreeIndex
    from codemod.edits import bound_before

    module = cst.parse_module(
        "def f(loader_args, cfg):\n"
        "    workers = cfg.workers  # a variable: taken\n"
        "    a = DataLoader(x, num_workers=cfg.workers_2)  # a keyword and an attribute: free\n"
        "    b = DataLoader(y)\n"
    )
    index = TreeIndex(module)
    first, second = index.find(cst.Call)[0], index.find(cst.Call)[1]
    taken: dict = {}
    names = [bound_before(call, cst.Integer("2"), "workers", index, taken)[1].value for call in (first, second)]
    assert names == ["workers_2", "workers_3"]  # the second fix in the function does not reuse the first's name
    other = TreeIndex(cst.parse_module("workers_2 = 1\nDataLoader(z)\n"))
    assert bound_before(other.find(cst.Call)[0], cst.Integer("2"), "workers", other, {})[1].value == "workers"


def test_a_rule_waiting_for_a_fix_of_this_pass_does_not_run_in_it(monkeypatch):
    visited = []
    visit = SeesSnakes.visit_Call
    monkeypatch.setattr(SeesSnakes, "visit_Call", lambda self, node: visited.append(node) or visit(self, node))
    # PM901 fixes nothing: PM911 runs with it (one call), and in the round after its own fix
    run("x = snake(1)\n", rules=[SeesSnakes, RenameCallsToSnake])
    assert len(visited) == 2
    visited.clear()
    # PM901 renames f: PM911 runs on its output (two calls), not on the file before it (two
    # calls whose findings would be dropped), and in the round after (two calls)
    result = run("x = snake(1)\ny = f(2)\n", rules=[SeesSnakes, RenameCallsToSnake])
    assert len(visited) == 4 and sorted(f.code for f in result.findings) == ["PM901", "PM911", "PM911"]


def test_what_is_inserted_before_a_wrapped_run_goes_before_its_with():
    """The `with` takes the place of the run's first statement: a statement inserted before
    that one (the value the `with` line reads) comes before the `with`, not inside it."""

    class BuildThenWrap(Rule):
        CODE, NAME, LEVEL, MESSAGE, GAIN = "PM915", "test-build-then-wrap", Level.SAFE, "wrap", ""

        def visit_FunctionDef(self, node):
            body = node.body.body
            if "limit" in self.context.source(node):
                return  # done
            build = cst.parse_statement("limit = open(x)\n")
            item = cst.WithItem(cst.parse_expression("limit"))
            self.report(node, edits=[InsertBefore(body[0], (build,)), Wrap(body[0], body[1], (item,))])

    source = "def step(x):\n    # the forward\n    y = f(x)\n    z = g(y)\n    return z\n"
    result = run(source, rules=[BuildThenWrap])
    assert result.new_source.decode() == (
        "def step(x):\n    limit = open(x)\n    # the forward\n    with limit:\n"
        "        y = f(x)\n        z = g(y)\n    return z\n"
    )


def test_a_fix_reading_a_name_its_function_binds_only_further_down_is_dropped():
    """`device` assigned later in the same function is local there: read above that
    assignment it is unbound (UnboundLocalError), whatever the module defines."""
    source = "device = 'cuda'\n\ndef main():\n    step()\n    device = 'cpu'\n"
    result = run(source, rules=[UsesDevice])
    assert not result.findings[0].applied
    assert "the fix would use `device`, not defined where it would go" in result.findings[0].message
    bound_first = run(
        source.replace("    step()\n    device = 'cpu'\n", "    device = 'cpu'\n    step()\n"), rules=[UsesDevice]
    )
    assert bound_first.findings[0].applied

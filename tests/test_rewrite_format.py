"""What a rewrite looks like: the lines perfmod writes are laid out as the user's
formatter would leave them (no stray blank line where statements went), and the
user's own lines stay as written."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest

from codemod.config import Settings, load_settings
from codemod.edits import Remove, Replace
from codemod.engine import process_source
from codemod.report.text import apply_report
from codemod.rule import Level, Rule
from codemod.rules import RULES_BY_CODE
from codemod.rules.unfused_optimizer import UnfusedOptimizer


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


class RenameDrop(Rule):
    """`drop()` -> `dropped()`."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM923", "test-rename-drop", Level.SAFE, "rename", ""

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "drop":
            self.report(node, edits=[Replace(node.func, cst.Name("dropped"))])


class RemoveDropSuperseding(Rule):
    """Removes every statement that calls `drop()`, doing the work of any edit inside it."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM924", "test-remove-drop", Level.SAFE, "remove", ""

    def visit_SimpleStatementLine(self, node):
        if "drop()" in self.context.source(node):
            self.report(node, edits=[Remove(node, supersedes=True)])


def test_the_summary_counts_each_rules_own_fixes_and_those_another_fix_settles_apart():
    """A removal that supersedes the code another rule's fix would change settles that
    finding: it is no fix of its own in the summary, and is counted apart."""
    source = "def drop():\n    pass\n\n\ndef dropped():\n    pass\n\n\nfor i in range(3):\n    drop()\n    print(i)\n"
    result = process_source(source.encode(), "t.py", Settings(level=Level.UNSAFE), [RenameDrop, RemoveDropSuperseding])
    assert result.error is None
    assert [(f.code, f.fixed_by) for f in result.findings if f.fixed_by] == [("PM923", "PM924")]
    report = apply_report([result], Level.UNSAFE, dry_run=False).splitlines()
    assert report[0] == "Fixed t.py: 1 fix (PM924); they also settle 1 finding (PM923)"
    assert report[1] == "Applied 1 fix to 1 file (1 file checked)."


def test_a_value_the_fix_reads_twice_is_computed_once():
    """PM201 reads the worker count twice (workers, and whether they persist): one call of
    default_num_workers(), bound before the loader."""
    script = Path(__file__).resolve().parent.parent / "fixtures" / "rules" / "PM201" / "explicit_zero.in.py"
    result = process_source(script.read_bytes(), "train.py", Settings(level=Level.UNSAFE, root=script.parent))
    rewritten = result.new_source.decode()
    assert rewritten.count("default_num_workers()") == 1
    assert "    num_workers = default_num_workers()\n    loader = DataLoader(\n" in rewritten
    assert "        num_workers=num_workers,\n" in rewritten
    assert "        persistent_workers=num_workers > 0,\n" in rewritten


# -- the user's formatter -------------------------------------------------------------------

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "rules"


def ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed")
    return found


def ruff_says(folder: Path, *args: str, source: str) -> bool:
    """Does ruff, with its defaults (no project's settings), accept `source`?"""
    done = subprocess.run(
        [ruff(), *args, "--isolated", "--stdin-filename", "train.py", "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=folder,
    )
    return done.returncode == 0


def fixture_rewrite(source: Path) -> str:
    rule = RULES_BY_CODE[source.parent.name]
    case = source.name[: -len(".in.py")]
    level = Level.parse(case.rsplit(".", 1)[1]) if "." in case else rule.LEVEL
    result = process_source(source.read_bytes(), str(source), Settings(select=(rule.CODE,), level=level))
    assert result.error is None, result.error
    return result.new_source.decode()


def test_rewrites_of_ruff_formatted_fixtures_stay_ruff_formatted_and_sorted(tmp_path):
    """Every fixture whose original passes `ruff format --check` (and `ruff check --select I`)
    still does once its rule rewrote it: new imports sorted in, long calls wrapped."""
    checked = []
    for source in sorted(FIXTURES.glob("*/*.in.py")):
        original = source.read_text(encoding="utf-8")
        if not ruff_says(tmp_path, "format", "--check", source=original):
            continue
        rewrite = fixture_rewrite(source)
        assert ruff_says(tmp_path, "format", "--check", source=rewrite), f"{source.name}: rewrite not ruff-formatted"
        if ruff_says(tmp_path, "check", "--select", "I", source=original):
            assert ruff_says(tmp_path, "check", "--select", "I", source=rewrite), f"{source.name}: imports unsorted"
        if rewrite != original:
            checked.append(f"{source.parent.name}/{source.name}")
    # The rewrites that wrap and sort are among them (the test sees real changes).
    assert {"PM201/sharded_unguarded.in.py", "PM503/k_token_loss.in.py", "PM601/micro_batches.in.py"} <= set(checked)


def test_a_loader_call_the_fixes_lengthen_is_wrapped_as_black_wraps_it(tmp_path):
    source = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "from torchvision.datasets import ImageFolder\n\n"
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
        "model = torch.nn.Linear(8, 1).to(device)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        'dataset = ImageFolder("data/train")\n'
        "loader = DataLoader(dataset, batch_size=8, shuffle=True)\n"
        "for x, y in loader:\n"
        "    x, y = x.to(device), y.to(device)\n"
        "    loss = torch.nn.functional.mse_loss(model(x), y)\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
    )
    assert ruff_says(tmp_path, "format", "--check", source=source)
    result = process_source(source.encode(), "t.py", Settings(level=Level.UNSAFE, select=("PM102", "PM201")))
    rewritten = result.new_source.decode()
    assert (
        "num_workers = default_num_workers(fork_only=True)\n"
        "loader = DataLoader(\n"
        "    dataset,\n"
        "    batch_size=8,\n"
        "    shuffle=True,\n"
        '    pin_memory=device.type == "cuda",\n'
        "    num_workers=num_workers,\n"
        "    persistent_workers=num_workers > 0,\n"
        ")\n"
    ) in rewritten
    assert ruff_says(tmp_path, "format", "--check", source=rewritten)
    assert ruff_says(tmp_path, "check", "--select", "I", source=rewritten)


def test_arguments_that_fit_on_one_indented_line_go_there_without_a_trailing_comma():
    source = "import torch\nmodel = torch.nn.Linear(8, 1).cuda()\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))\n"
    got = rewrite(source.replace("betas=(0.9, 0.95)", "eps=1e-8"), [UnfusedOptimizer])
    assert (
        "opt = torch.optim.AdamW(\n    model.parameters(), lr=1e-3, weight_decay=0.1, eps=1e-8, fused=True\n)\n" in got
    )


def test_the_users_long_lines_stay_as_written():
    """A line the fixes do not lengthen is the user's, however long; so is one that was
    already longer than the rewrite."""
    long_line = "x = some_function(argument_number_one, argument_number_two, argument_number_three, four)\n"
    source = "import gc\n" + long_line + "for i in range(3):\n    drop()\n"
    assert long_line in rewrite(source, [DropCallsOfDrop])
    source = "short = max\nvalue = a_rather_long_function_name(first_argument, second_argument, third_argument, 4)\n"
    assert rewrite(source, [ShortenTheCallee]) == source.replace("a_rather_long_function_name", "short")


def test_the_users_long_lines_stay_as_written_when_a_fix_removes_an_import():
    """The import the removed statement read goes too; the statements around it are
    the user's still."""
    long_line = 'labels = torch.randint(0, 10, (options.steps, options.batch_size), pin_memory=device == "cuda")\n'
    new = rewrite("import gc\n" + long_line + "for i in range(3):\n    gc.drop()\n", [DropCallsOfDrop])
    assert "import gc" not in new and long_line in new


class ShortenTheCallee(Rule):
    """`a_rather_long_function_name(...)` -> `short(...)`: a rewrite that shortens its line."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM922", "test-shorten", Level.SAFE, "shorten", ""

    def visit_Call(self, node):
        if isinstance(node.func, cst.Name) and node.func.value == "a_rather_long_function_name":
            self.report(node, edits=[Replace(node.func, cst.Name("short"))])


def test_the_line_length_is_the_projects(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 120\n")
    (tmp_path / "src").mkdir()
    assert load_settings(tmp_path / "src" / "train.py").line_length == 120
    (tmp_path / "src" / "ruff.toml").write_text("line-length = 100\n")
    assert load_settings(tmp_path / "src" / "train.py").line_length == 100
    (tmp_path / "pyproject.toml").write_text("[tool.black]\nline-length = 79\n")
    (tmp_path / "src" / "ruff.toml").unlink()
    assert load_settings(tmp_path / "src" / "train.py").line_length == 79
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert load_settings(tmp_path / "src" / "train.py").line_length is None  # no formatter: the file says
    source = "import torch\nmodel = torch.nn.Linear(8, 1).cuda()\nopt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, eps=1e-8)\n"
    wide = process_source(
        source.encode(), "t.py", Settings(line_length=120, level=Level.NUMERIC), [UnfusedOptimizer]
    ).new_source.decode()
    assert "eps=1e-8, fused=True)\n" in wide


def test_a_file_without_a_formatter_keeps_its_own_width():
    """No formatter configured: black's 88 for a file whose code keeps to it, but a file
    whose own code runs to 93 columns is not rewrapped below that (the fixed line is 92)."""
    call = "opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)\n"
    narrow = "import torch\nmodel = torch.nn.Linear(8, 1).cuda()\n" + call.replace("0.1)", "0.1, eps=1e-8)")
    wide = narrow + "total = model.weight.sum() + model.bias.sum() + model.weight.mean() + model.bias.mean() + 0.0\n"
    for source, wrapped in ((narrow, True), (wide, False)):
        new = process_source(source.encode(), "t.py", Settings(level=Level.NUMERIC), [UnfusedOptimizer]).new_source
        assert ("eps=1e-8, fused=True)\n" not in new.decode()) is wrapped

"""What users of ruff expect from the command line: `.` by default, --quiet,
--statistics, --exit-zero, --output-file, `check --fix`, `--diff`,
--force-exclude, colours (NO_COLOR / FORCE_COLOR), the progress display, and
the rules table on a terminal."""

import json

import pytest

from codemod.config import Settings
from codemod.docs import summary
from codemod.report.text import rules_table
from tests.cli_support import (  # noqa: F401 (catalogue is a fixture)
    CLEAN,
    FINDING_MESSAGE,
    FIXABLE,
    FIXED,
    UNPARSABLE,
    catalogue,
    perfmod,
    write,
)
from tests.test_cli import DIFF, _many_files, _run_on_terminal

pytestmark = pytest.mark.usefixtures("catalogue")

SCRIPT = FIXABLE + "slow(1)\nslow(2)\nlook(3)\n"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("NO_COLOR", "FORCE_COLOR", "PERFMOD_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_the_working_folder_is_the_default_path(tmp_path):
    write(tmp_path / "src" / "t.py", FIXABLE)
    result = perfmod("check")
    assert result.exit_code == 1 and result.stdout.startswith(f"src/t.py:4:5: {FINDING_MESSAGE}\n")
    assert perfmod("check").stdout == perfmod("check", ".").stdout
    assert perfmod("apply").stdout == "Fixed src/t.py: 1 fix (PM101)\nApplied 1 fix to 1 file (1 file checked).\n"


def test_quiet_prints_findings_and_errors_only(tmp_path):
    write(tmp_path / "a.py", SCRIPT)
    write(tmp_path / "b.py", UNPARSABLE)
    result = perfmod("check", ".", "-q")
    assert result.exit_code == 2
    assert result.stdout.splitlines() == [
        f"a.py:4:5: {FINDING_MESSAGE}",
        "a.py:5:1: PM991 slow() is slow (fix with --level numeric)",
        "a.py:6:1: PM991 slow() is slow (fix with --level numeric)",
        "a.py:7:1: PM993 look() has no fix (no automatic fix)",
    ]
    assert result.stderr.startswith("b.py:4:5: error: syntax error") and result.stderr.count("\n") == 1
    applied = perfmod("apply", "a.py", "--quiet")
    assert applied.exit_code == 0 and applied.stdout == "" and applied.stderr == ""
    assert (tmp_path / "a.py").read_text().startswith(FIXED)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert perfmod("check", "empty", "-q").stderr == ""  # no "no Python files" warning either


def test_statistics_counts_findings_per_rule(tmp_path):
    write(tmp_path / "a.py", SCRIPT)
    write(tmp_path / "b.py", FIXABLE)
    result = perfmod("check", ".", "--statistics")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        "2  PM101  [*] blocking-host-to-device-copy",
        "2  PM991      test-slow-call",
        "1  PM993      test-look-call",
        "Found 5 findings in 2 files (2 files checked).",
        "[*] 2 fixable at level safe with `perfmod apply`.",
        "2 more fixes available with --level numeric.",
        "1 finding has no automatic fix (report only).",
    ]
    assert json.loads(perfmod("check", ".", "--statistics", "--format", "json").stdout) == [
        {"code": "PM101", "name": "blocking-host-to-device-copy", "count": 2, "fixable": 2},
        {"code": "PM991", "name": "test-slow-call", "count": 2, "fixable": 0},
        {"code": "PM993", "name": "test-look-call", "count": 1, "fixable": 0},
    ]
    assert perfmod("check", ".", "--statistics", "-q").stdout.splitlines() == result.stdout.splitlines()[:3]
    applied = perfmod("apply", "b.py", "--statistics")
    assert applied.stdout.endswith(
        "Applied 1 fix to 1 file (1 file checked).\n1  PM101  [*] blocking-host-to-device-copy\n"
    )
    sarif = perfmod("check", ".", "--statistics", "--format", "sarif")
    assert sarif.exit_code == 2 and "--statistics is text or json" in sarif.stderr


def test_exit_zero_turns_pending_fixes_into_0_but_not_errors(tmp_path):
    write(tmp_path / "t.py", FIXABLE)
    assert perfmod("check", "t.py", "--exit-zero").exit_code == 0
    assert perfmod("apply", "t.py", "--dry-run", "--exit-zero").exit_code == 0
    write(tmp_path / "bad.py", UNPARSABLE)
    assert perfmod("check", ".", "--exit-zero").exit_code == 2


@pytest.mark.parametrize(
    "args",
    [
        ["check", "t.py"],
        ["check", "t.py", "--format", "sarif"],
        ["apply", "t.py", "--dry-run"],
        ["check", "t.py", "--diff"],
    ],
)
def test_output_file_gets_what_stdout_would(tmp_path, args):
    write(tmp_path / "t.py", FIXABLE)
    expected = perfmod(*args, "--no-cache")
    (tmp_path / "out").mkdir()
    result = perfmod(*args, "--output-file", "out/report.txt", "--color")
    assert result.exit_code == expected.exit_code and result.stdout == "" and result.stderr == expected.stderr
    assert (tmp_path / "out" / "report.txt").read_text() == expected.stdout  # never coloured
    assert (tmp_path / "t.py").read_text() == FIXABLE


def test_output_file_that_cannot_be_written_exits_2(tmp_path):
    write(tmp_path / "t.py", CLEAN)
    result = perfmod("check", "t.py", "-o", tmp_path / "missing" / "out.txt")
    assert result.exit_code == 2 and "cannot write --output-file" in result.stderr


def test_check_fix_is_apply_and_diff_is_a_dry_run(tmp_path):
    write(tmp_path / "t.py", FIXABLE)
    for args in (["check", "--diff"], ["apply", "--diff"], ["check", "--fix", "--diff"]):
        result = perfmod(*args, "t.py")
        assert (result.exit_code, result.stdout) == (1, DIFF), args
        assert "Would apply 1 fix" in result.stderr
    assert (tmp_path / "t.py").read_text() == FIXABLE
    fixed = perfmod("check", "--fix", "t.py")
    assert (
        fixed.exit_code == 0
        and fixed.stdout == "Fixed t.py: 1 fix (PM101)\nApplied 1 fix to 1 file (1 file checked).\n"
    )
    assert (tmp_path / "t.py").read_text() == FIXED


def test_force_exclude_applies_exclude_to_named_files(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.perfmod]\nexclude = ["legacy/"]\n')
    write(tmp_path / "legacy" / "old.py", FIXABLE)
    write(tmp_path / "new.py", FIXABLE)
    assert perfmod("check", "legacy/old.py", "new.py").stdout.count("PM101") == 2  # named: taken
    forced = perfmod("check", "legacy/old.py", "new.py", "--force-exclude")
    assert forced.stdout.count("PM101") == 1 and "legacy" not in forced.stdout
    write(tmp_path / "pyproject.toml", '[tool.perfmod]\nexclude = ["legacy/"]\nforce-exclude = true\n')
    alone = perfmod("check", "legacy/old.py")
    assert alone.exit_code == 0 and "no Python files found" in alone.stderr
    assert perfmod("check", "legacy/old.py", "--no-force-exclude").exit_code == 1


# -- colour -------------------------------------------------------------------------------

BOLD_PATH = "\x1b[1mt.py\x1b[0m:4:5:"
RED_CODE = "\x1b[31m\x1b[1mPM101\x1b[0m"


def test_findings_are_coloured_when_asked_and_plain_otherwise(tmp_path, monkeypatch):
    write(tmp_path / "t.py", FIXABLE)
    coloured = perfmod("check", "t.py", "--color").stdout
    assert coloured.startswith(f"{BOLD_PATH} {RED_CODE} \x1b[36m[*]\x1b[0m host-to-device")
    assert "\x1b[" not in perfmod("check", "t.py").stdout  # not a terminal
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert RED_CODE in perfmod("check", "t.py").stdout
    assert "\x1b[" not in perfmod("check", "t.py", "--no-color").stdout
    monkeypatch.setenv("FORCE_COLOR", "0")
    assert "\x1b[" not in perfmod("check", "t.py").stdout


def test_findings_are_coloured_on_a_terminal(tmp_path):
    """NO_COLOR on a terminal: test_cli's diff test; the environment variables: above."""
    write(tmp_path / "t.py", FIXABLE)
    _, coloured = _run_on_terminal(["check", "t.py"], "stdout")
    assert RED_CODE in coloured


# -- progress -----------------------------------------------------------------------------


def test_progress_shows_files_and_rate_on_a_terminal_and_nothing_with_quiet(tmp_path):
    _many_files(tmp_path, count=21)
    status, terminal = _run_on_terminal(["check", "."], "stderr")
    assert status == 0
    assert "perfmod check: 0/21 files (0%)" in terminal and "perfmod check: 21/21 files (100%), " in terminal
    assert " files/s" in terminal
    assert terminal.endswith("\r")  # the line is cleared at the end
    _, quiet = _run_on_terminal(["check", ".", "-q"], "stderr")
    assert quiet == ""


def test_progress_line():
    from codemod.progress import Progress

    clock = iter([0.0, 2.0, 2.0, 2.0]).__next__
    shown = []
    progress = Progress(100, "perfmod check", stream=None, enabled=False, clock=clock)
    progress.done = 25
    shown.append(progress.line())
    assert shown == ["perfmod check: 25/100 files (25%), 12 files/s, 6s left"]


def test_progress_line_shows_the_worker_processes_and_the_help_says_what_j_does(tmp_path):
    from codemod.progress import Progress

    progress = Progress(100, "perfmod check", stream=None, enabled=False, clock=iter([0.0, 2.0]).__next__)
    progress.set_workers(2)
    assert progress.line() == "perfmod check: 0/100 files (0%), 2 workers"
    told = []
    _many_files(tmp_path, count=3)
    from codemod.runner import run

    run(sorted(tmp_path.rglob("*.py")), Settings(), write=False, known=(), jobs=2, on_workers=told.append)
    assert told == [2]
    text = " ".join(perfmod("check", "--help").stdout.split())
    assert (
        "Workers share the free cores: with fewer free cores than N, a run takes as long as with that many jobs" in text
    )


# -- the rules table ------------------------------------------------------------------------


@pytest.mark.parametrize("width", [60, 100, 200])
def test_rules_on_a_terminal_wrap_summaries_whole(width, monkeypatch):
    from codemod.rules import ALL_RULES as catalogue_now  # the test catalogue: PM101 and the test rules

    lines = rules_table(catalogue_now, width).splitlines()
    column = lines[0].index("SUMMARY")
    assert all(len(line) <= max(width, column + 30) for line in lines[1:])
    text = " ".join(line[column:] for line in lines[1:])
    for rule in catalogue_now:
        assert summary(rule) in text  # nothing cut, nothing shortened with "..."

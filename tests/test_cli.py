"""The `perfmod` command: options, outputs, exit codes."""

import json
import os
import pty
import select
import subprocess
from importlib.metadata import entry_points, version

import click
import pytest

from codemod.cli import main
from codemod.rules import ALL_RULES
from tests.cli_support import (  # noqa: F401 (catalogue is a fixture)
    CLEAN,
    FINDING_MESSAGE,
    FIXABLE,
    FIXED,
    PERFMOD,
    UNPARSABLE,
    catalogue,
    perfmod,
    process_env,
    write,
)

pytestmark = pytest.mark.usefixtures("catalogue")

DIFF = """\
--- a/t.py
+++ b/t.py
@@ -1,4 +1,4 @@
 import torch
 device = torch.device("cuda")
 x = torch.randn(4, pin_memory=True)
-y = x.to(device)
+y = x.to(device, non_blocking=True)
"""


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NO_COLOR", raising=False)


# -- apply ------------------------------------------------------------------------------


def test_dry_run_prints_the_diff_writes_nothing_and_exits_1(tmp_path):
    script = write(tmp_path / "t.py", FIXABLE)
    before = script.stat().st_mtime_ns
    result = perfmod("apply", "t.py", "--dry-run")
    assert result.exit_code == 1
    assert result.stdout == DIFF  # the diff alone, ready for `git apply`
    assert "Would apply 1 fix to 1 file (1 file checked)" in result.stderr
    assert script.read_text() == FIXABLE and script.stat().st_mtime_ns == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".perfmod_cache", "t.py"]  # the cache, nothing else


def test_dry_run_with_nothing_to_change_exits_0(tmp_path):
    write(tmp_path / "t.py", CLEAN)
    result = perfmod("apply", "t.py", "--dry-run")
    assert result.exit_code == 0 and result.stdout == ""
    assert "Nothing to fix at level safe (1 file checked)." in result.stderr


def test_the_diff_applies_with_git_apply(tmp_path):
    write(tmp_path / "t.py", FIXABLE)
    diff = perfmod("apply", "t.py", "--dry-run").stdout
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run(["git", "apply"], input=diff.encode(), check=True)
    assert (tmp_path / "t.py").read_text() == FIXED


def test_apply_writes_the_fix_and_a_second_run_finds_nothing(tmp_path):
    script = write(tmp_path / "t.py", FIXABLE)
    result = perfmod("apply", "t.py")
    assert result.exit_code == 0
    assert script.read_text() == FIXED
    assert result.stdout == "Fixed t.py: 1 fix (PM101)\nApplied 1 fix to 1 file (1 file checked).\n"
    again = perfmod("apply", "t.py")
    assert again.exit_code == 0 and script.read_text() == FIXED
    assert again.stdout == "Nothing to fix at level safe (1 file checked).\n"


def test_apply_exits_2_on_an_unparsable_file_and_still_fixes_the_others(tmp_path):
    bad = write(tmp_path / "a_bad.py", UNPARSABLE)
    good = write(tmp_path / "b_good.py", FIXABLE)
    result = perfmod("apply", ".")
    assert result.exit_code == 2
    assert "a_bad.py:4:5: error: syntax error: closing parenthesis ']'" in result.stderr
    assert bad.read_text() == UNPARSABLE and good.read_text() == FIXED


def test_higher_level_fixes_are_listed_with_the_flag_that_applies_them(tmp_path):
    write(tmp_path / "t.py", FIXABLE + "slow(1)\nrisky(2)\nrisky(3)\nlook(4)\n")
    result = perfmod("apply", "t.py", "--dry-run")
    assert result.exit_code == 1
    assert "+y = x.to(device, non_blocking=True)" in result.stdout and "fast(" not in result.stdout
    assert result.stderr.splitlines() == [
        "Would apply 1 fix to 1 file (1 file checked); run without --dry-run to write them.",
        "1 more fix available with --level numeric:",
        "  t.py:5:1: PM991 slow() is slow",
        "2 more fixes available with --level unsafe:",
        "  t.py:6:1: PM992 risky() could be bold",
        "  t.py:7:1: PM992 risky() could be bold",
        "1 finding has no automatic fix (report only):",
        "  t.py:8:1: PM993 look() has no fix",
    ]
    numeric = perfmod("apply", "t.py", "--dry-run", "--level", "numeric")
    assert "+fast(1)" in numeric.stdout and "bold(" not in numeric.stdout
    assert "--level numeric" not in numeric.stderr and "2 more fixes available with --level unsafe:" in numeric.stderr
    unsafe = perfmod("apply", "t.py", "--level", "UNSAFE")
    assert "more fix" not in unsafe.stdout and "1 finding has no automatic fix" in unsafe.stdout
    fixed = FIXED.replace("import torch\n", "import torch\nfrom speedups import bold, fast\n\n")
    assert (tmp_path / "t.py").read_text() == fixed + "fast(1)\nbold(2)\nbold(3)\nlook(4)\n"


def test_color_is_forced_by_flag_and_off_when_piped(tmp_path):
    write(tmp_path / "t.py", FIXABLE)
    coloured = perfmod("apply", "t.py", "--dry-run", "--color").stdout
    assert "\x1b[31m-y = x.to(device)\x1b[0m" in coloured and "\x1b[32m+y" in coloured
    assert "\x1b[" not in perfmod("apply", "t.py", "--dry-run").stdout


# -- stdin ------------------------------------------------------------------------------


def test_apply_stdin_writes_the_new_source_to_stdout_and_findings_to_stderr():
    result = perfmod("apply", "-", input=FIXABLE.encode())
    assert result.exit_code == 0
    assert result.stdout_bytes == FIXED.encode()
    assert result.stderr == f"-:4:5: {FINDING_MESSAGE}\n"


def test_stdin_filename_names_the_source_and_picks_its_configuration(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.perfmod]\nper-file-ignores = { "legacy/*" = ["PM101"] }\n')
    kept = perfmod("apply", "-", "--stdin-filename", "legacy/old.py", input=FIXABLE.encode())
    assert kept.exit_code == 0 and kept.stdout == FIXABLE and kept.stderr == ""
    fixed = perfmod("apply", "-", "--stdin-filename", "new.py", input=FIXABLE.encode())
    assert fixed.stdout == FIXED and fixed.stderr.startswith("new.py:4:5: PM101")


def test_apply_stdin_dry_run_prints_the_diff_and_exits_1():
    result = perfmod("apply", "-", "--stdin-filename", "t.py", "--dry-run", input=FIXABLE.encode())
    assert result.exit_code == 1 and result.stdout == DIFF


def test_apply_stdin_unparsable_echoes_the_source_and_exits_2():
    result = perfmod("apply", "-", input=UNPARSABLE.encode())
    assert result.exit_code == 2
    assert result.stdout == UNPARSABLE
    assert result.stderr.startswith("-:4:5: error: syntax error")


def test_apply_stdin_json_report_goes_to_stderr():
    result = perfmod("apply", "-", "--format", "json", input=FIXABLE.encode())
    assert result.stdout == FIXED
    assert json.loads(result.stderr)["findings"][0]["path"] == "-"


def test_check_reads_stdin_too():
    result = perfmod("check", "-", "--stdin-filename", "t.py", input=FIXABLE.encode())
    assert result.exit_code == 1 and result.stdout.startswith(f"t.py:4:5: {FINDING_MESSAGE}\n")


def test_stdin_cannot_be_mixed_with_paths(tmp_path):
    write(tmp_path / "t.py", CLEAN)
    result = perfmod("check", "-", "t.py", input=b"")
    assert result.exit_code == 2 and "cannot be combined" in result.stderr


# -- check ------------------------------------------------------------------------------


def test_check_exits_0_when_nothing_is_pending(tmp_path):
    write(tmp_path / "t.py", CLEAN)
    result = perfmod("check", "t.py")
    assert result.exit_code == 0 and result.stdout == "No findings (1 file checked).\n"


def test_check_exits_1_with_ruff_style_lines_and_never_writes(tmp_path):
    script = write(tmp_path / "t.py", FIXABLE)
    result = perfmod("check", "t.py")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"t.py:4:5: {FINDING_MESSAGE}",
        "Found 1 finding in 1 file (1 file checked).",
        "[*] 1 fixable at level safe with `perfmod apply`.",
    ]
    assert script.read_text() == FIXABLE


def test_check_exits_2_on_an_unparsable_file_and_reports_the_others(tmp_path):
    write(tmp_path / "a.py", UNPARSABLE)
    write(tmp_path / "b.py", FIXABLE)
    result = perfmod("check", ".")
    assert result.exit_code == 2
    assert result.stderr.startswith("a.py:4:5: error: syntax error:")
    assert f"b.py:4:5: {FINDING_MESSAGE}" in result.stdout
    assert "(2 files checked, 1 error)" in result.stdout


def test_check_exits_2_on_a_missing_file(tmp_path):
    write(tmp_path / "t.py", FIXABLE)
    result = perfmod("check", "t.py", "missing.py")
    assert result.exit_code == 2
    assert "missing.py:1:1: error: cannot read: No such file or directory" in result.stderr
    assert f"t.py:4:5: {FINDING_MESSAGE}" in result.stdout


def test_check_does_not_fail_on_fixes_above_the_level(tmp_path):
    write(tmp_path / "t.py", "slow(1)\nrisky(2)\nlook(3)\n")
    result = perfmod("check", "t.py")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "t.py:1:1: PM991 slow() is slow (fix with --level numeric)",
        "t.py:2:1: PM992 risky() could be bold (fix with --level unsafe)",
        "t.py:3:1: PM993 look() has no fix (no automatic fix)",
        "Found 3 findings in 1 file (1 file checked).",
        "1 more fix available with --level numeric.",
        "1 more fix available with --level unsafe.",
        "1 finding has no automatic fix (report only).",
    ]
    assert perfmod("check", "t.py", "--level", "numeric").exit_code == 1


def test_a_folder_without_python_files_is_not_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    result = perfmod("check", "empty")
    assert result.exit_code == 0
    assert "no Python files found" in result.stderr


# -- machine formats ----------------------------------------------------------------------


def test_json_schema(tmp_path):
    write(tmp_path / "a.py", FIXABLE + "risky(1)\nlook(2)\n")
    write(tmp_path / "b.py", UNPARSABLE)
    result = perfmod("check", "a.py", "b.py", "--format", "json")
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert document["version"] == 2 and document["level"] == "safe"
    assert document["files"] == [
        {"path": "a.py", "changed": True, "error": None},
        {
            "path": "b.py",
            "changed": False,
            "error": "b.py:4:5: error: syntax error: closing parenthesis ']' "
            "does not match opening parenthesis '(' on line 2",
        },
    ]
    assert document["findings"][0] == {
        "path": "a.py",
        "line": 4,
        "column": 5,
        "code": "PM101",
        "name": "blocking-host-to-device-copy",
        "message": "host-to-device copy blocks the CPU; pass non_blocking=True",
        "level": "safe",
        "fixable": True,
        "applied": False,  # check never writes: the fix is pending
        "pending": True,
        "end_line": 4,
        "end_column": 17,
        "changes": [{"first": 4, "last": 4, "text": "y = x.to(device, non_blocking=True)\n"}],
    }
    assert [(f["code"], f["level"], f["fixable"], f["applied"], f["pending"]) for f in document["findings"][1:]] == [
        ("PM992", "unsafe", True, False, False),
        ("PM993", "safe", False, False, False),
    ]
    assert document["summary"] == {
        "files": 2,
        "changed": 1,
        "errors": 1,
        "findings": 3,
        "applied": 0,
        "pending": 1,
        "fixable_at_higher_level": {"unsafe": 1},
        "report_only": 1,
    }


def test_json_after_apply_reports_the_written_files_and_fixes(tmp_path):
    write(tmp_path / "t.py", FIXABLE + "risky(1)\n")
    document = json.loads(perfmod("apply", "t.py", "--format", "json").stdout)
    assert document["files"] == [{"path": "t.py", "changed": True, "error": None}]
    assert (tmp_path / "t.py").read_text() == FIXED + "risky(1)\n"
    assert [(f["code"], f["applied"], f["pending"]) for f in document["findings"]] == [
        ("PM101", True, False),
        ("PM992", False, False),  # fixed only at level unsafe
    ]
    assert (document["summary"]["applied"], document["summary"]["pending"]) == (1, 0)


@pytest.mark.parametrize("command", [["apply", "--dry-run"], ["apply", "--diff"], ["check"]])
def test_json_of_a_run_that_writes_nothing_applies_nothing(tmp_path, command):
    write(tmp_path / "t.py", FIXABLE)
    document = json.loads(perfmod(*command, "t.py", "--format", "json").stdout)
    assert [(f["code"], f["applied"], f["pending"]) for f in document["findings"]] == [("PM101", False, True)]
    assert (document["summary"]["applied"], document["summary"]["pending"]) == (0, 1)
    sarif = json.loads(perfmod(*command, "t.py", "--format", "sarif").stdout)
    (finding,) = sarif["runs"][0]["results"]
    assert (finding["properties"]["applied"], finding["properties"]["pending"]) == (False, True)
    assert (tmp_path / "t.py").read_text() == FIXABLE


def test_json_of_apply_leaves_the_fixes_of_a_file_it_could_not_write_pending(tmp_path):
    script = write(tmp_path / "t.py", FIXABLE)
    script.chmod(0o444)
    document = json.loads(perfmod("apply", "t.py", "--format", "json").stdout)
    assert document["files"][0]["error"].startswith("t.py:1:1: error: read-only file")
    assert [(f["code"], f["applied"], f["pending"]) for f in document["findings"]] == [("PM101", False, True)]
    assert (document["summary"]["applied"], document["summary"]["pending"]) == (0, 1)


def test_json_of_apply_on_stdin_applies_the_fixes_it_prints(tmp_path):
    result = perfmod("apply", "-", "--format", "json", input=FIXABLE.encode())
    assert result.stdout == FIXED
    assert [(f["applied"], f["pending"]) for f in json.loads(result.stderr)["findings"]] == [(True, False)]


def test_sarif_schema(tmp_path):
    write(tmp_path / "src" / "a.py", FIXABLE + "risky(1)\n")
    write(tmp_path / "src" / "b.py", UNPARSABLE)
    result = perfmod("check", "src", "--format", "sarif")
    assert result.exit_code == 2
    sarif = json.loads(result.stdout)
    assert sarif["version"] == "2.1.0" and sarif["$schema"].endswith("sarif-2.1.0.json")
    (run,) = sarif["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == [r.CODE for r in ALL_RULES]
    pm101 = rules[0]
    assert pm101["name"] == "blocking-host-to-device-copy"
    assert pm101["helpUri"] == (
        f"https://github.com/perfmod/perfmod/blob/v{version('perfmod')}/docs/rules/blocking-host-to-device-copy.md"
    )
    assert "## What it does" in pm101["help"]["markdown"]
    warning, note = run["results"]
    assert warning["ruleId"] == "PM101" and warning["level"] == "warning"
    assert rules[warning["ruleIndex"]]["id"] == "PM101"
    assert warning["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "src/a.py"},
        "region": {"startLine": 4, "startColumn": 5, "endLine": 4, "endColumn": 17},
    }
    (fix,) = warning["fixes"]
    (change,) = fix["artifactChanges"]
    (replacement,) = change["replacements"]
    original = FIXABLE + "risky(1)\n"
    region = replacement["deletedRegion"]
    start, length = region["charOffset"], region["charLength"]
    assert change["artifactLocation"] == {"uri": "src/a.py"}
    assert (
        original[:start] + replacement["insertedContent"]["text"] + original[start + length :] == FIXED + "risky(1)\n"
    )
    assert note["ruleId"] == "PM992" and note["level"] == "note" and "fixes" not in note
    (invocation,) = run["invocations"]
    assert invocation["executionSuccessful"] is False
    (notification,) = invocation["toolExecutionNotifications"]
    assert notification["level"] == "error" and notification["message"]["text"].startswith("src/b.py:4:5: error:")


def test_github_annotations(tmp_path):
    write(tmp_path / "src" / "a.py", FIXABLE + "risky(1)\nlook(2)\n")
    write(tmp_path / "src" / "b.py", UNPARSABLE)
    result = perfmod("check", "src", "--output-format", "github")
    assert result.exit_code == 2
    assert result.stdout.splitlines() == [
        "::error title=perfmod (PM101),file=src/a.py,line=4,col=5,endLine=4,endColumn=17::"
        "src/a.py:4:5: PM101 host-to-device copy blocks the CPU; pass non_blocking=True",
        "::warning title=perfmod (PM992),file=src/a.py,line=5,col=1,endLine=5,endColumn=9::"
        "src/a.py:5:1: PM992 risky() could be bold",
        "::warning title=perfmod (PM993),file=src/a.py,line=6,col=1,endLine=6,endColumn=8::"
        "src/a.py:6:1: PM993 look() has no fix",
        "::error title=perfmod,file=src/b.py,line=4,col=5::src/b.py:4:5: error: syntax error: "
        "closing parenthesis ']' does not match opening parenthesis '(' on line 2",
    ]
    assert result.stdout.endswith("]' does not match opening parenthesis '(' on line 2\n")
    assert perfmod("check", "src/a.py", "--format", "github").stdout == result.stdout.split("::error title=perfmod,")[0]


def test_github_annotations_escape_what_would_end_a_value(tmp_path):
    from codemod.report.github import render_github
    from codemod.result import FileResult, Finding, Level

    finding = Finding("a,b:c.py", 2, 3, "PM101", "name", "50% of\nit", Level.SAFE, fixable=True)
    assert render_github([FileResult("a,b:c.py", b"", findings=[finding])]) == (
        "::warning title=perfmod (PM101),file=a%2Cb%3Ac.py,line=2,col=3,endLine=2,endColumn=3::"
        "a,b:c.py:2:3: PM101 50%25 of%0Ait\n"
    )
    assert render_github([]) == ""


def test_a_clean_run_in_github_format_prints_nothing(tmp_path):
    write(tmp_path / "t.py", CLEAN)
    result = perfmod("check", "t.py", "--format", "github")
    assert (result.exit_code, result.stdout) == (0, "")
    refused = perfmod("check", "t.py", "--format", "github", "--statistics")
    assert refused.exit_code == 2
    assert "github output has no place for it: drop --statistics, or pass --format json" in refused.stderr


# -- options and configuration --------------------------------------------------------------


@pytest.mark.parametrize("option", ["--select", "--ignore"])
def test_a_code_that_matches_no_rule_is_an_error_with_a_hint(tmp_path, option):
    write(tmp_path / "t.py", FIXABLE)
    result = perfmod("check", "t.py", option, "PM10,PM1011")
    assert result.exit_code == 2
    assert "PM1011 matches no rule" in result.stderr and "Did you mean PM101?" in result.stderr
    assert "is not a perfmod code" in perfmod("check", "t.py", option, "E501").stderr


def test_bad_level_exits_2(tmp_path):
    write(tmp_path / "t.py", FIXABLE)
    result = perfmod("check", "t.py", "--level", "reckless")
    assert result.exit_code == 2 and "'reckless' is not one of" in result.stderr


def test_jobs_0_uses_every_cpu_and_gives_the_same_output(tmp_path):
    for name in "abc":
        write(tmp_path / f"{name}.py", FIXABLE)
    assert perfmod("check", ".", "-j", "0").stdout == perfmod("check", ".").stdout
    assert perfmod("check", ".", "-j", "-1").exit_code == 2


# -- catalogue ------------------------------------------------------------------------------


def test_rules_table_lists_every_rule():
    result = perfmod("rules")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["CODE", "NAME", "LEVEL", "SUMMARY"]
    for rule, line in zip(ALL_RULES, lines[1:], strict=True):
        assert line.split()[:3] == [rule.CODE, rule.NAME, rule.LEVEL.label]
        assert (line.split()[3] == "(opt-in)") == rule.OPT_IN
        assert line.endswith(rule.summary())  # whole when piped


def test_rules_json():
    rules = json.loads(perfmod("rules", "--format", "json").stdout)
    assert [r["code"] for r in rules] == [r.CODE for r in ALL_RULES]
    assert set(rules[0]) == {"code", "name", "level", "opt_in", "summary", "message", "gain", "fix", "docs"}
    assert {r["code"] for r in rules if r["opt_in"]} == {r.CODE for r in ALL_RULES if r.OPT_IN}


@pytest.mark.parametrize("spelling", ["PM101", "pm101", "blocking-host-to-device-copy"])
def test_explain_prints_docs_level_gain_and_examples(spelling):
    from codemod.rules.blocking_host_to_device_copy import NonBlockingCopy as rule

    result = perfmod("explain", spelling)
    assert result.exit_code == 0
    text = result.stdout
    assert text.startswith("PM101 blocking-host-to-device-copy\nLevel: safe, applied by default")
    assert f"Expected gain: {rule.GAIN}\n" in text
    assert rule.docs() in text
    assert "Fixed at --level safe:" in text and "Left alone:" in text
    assert "    -    x, y = x.to(device), y.to(device)\n" in text  # an INVALID case, as a diff
    assert "  # modules are not tensors\n    model = torch.nn.Linear(8, 1).to(device)\n" in text


def test_explain_unknown_code_exits_2_with_close_codes():
    close = perfmod("explain", "PM10")
    assert close.exit_code == 2 and "no rule 'PM10'. Did you mean PM101?" in close.stderr
    far = perfmod("explain", "XYZ")
    assert far.exit_code == 2 and "Known codes: PM101" in far.stderr


# -- help, version, entry point -------------------------------------------------------------


@pytest.mark.parametrize("command", ["apply", "check", "rules", "explain"])
def test_every_command_has_examples_in_its_help(command):
    result = perfmod(command, "--help")
    assert result.exit_code == 0 and f"perfmod {command}" in result.stdout and "Examples:" in result.stdout


@pytest.mark.parametrize("command", ["apply", "check"])
def test_help_documents_the_exit_codes(command):
    text = perfmod(command, "--help").stdout
    assert "Exit status:" in text and all(f"  {code}  " in text for code in (0, 1, 2, 130))


@pytest.mark.parametrize("command", ["apply", "check", "report", "rules", "verify"])
def test_every_option_has_help(command):
    """Each option's --help line says what it does (click shows options without help as bare flags)."""
    group = main.commands[command]
    for param in group.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.help, f"{command} {param.opts} has no help"
    text = perfmod(command, "--help").stdout
    for param in group.params:
        if isinstance(param, click.Option):
            assert param.opts[-1] in text


def test_version_is_the_one_in_pyproject():
    import re

    from tests.cli_support import REPO

    declared = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert perfmod("--version").stdout == f"perfmod, version {declared}\n"


def test_console_script_runs_the_click_group(monkeypatch):
    (script,) = entry_points(group="console_scripts", name="perfmod")
    called = []
    monkeypatch.setattr("codemod.cli.main", lambda: called.append(True))
    script.load()()
    assert called == [True]


# -- real processes: terminals and pipes ----------------------------------------------------


def _run_on_terminal(args, stream: str, env=None) -> tuple[int, str]:
    """Run perfmod with `stream` ("stdout" or "stderr") on a pseudo-terminal;
    returns its exit status and what it wrote there."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        PERFMOD + args,
        stdin=subprocess.DEVNULL,
        env=env or process_env(),
        stdout=terminal if stream == "stdout" else subprocess.DEVNULL,
        stderr=terminal if stream == "stderr" else subprocess.DEVNULL,
    )
    os.close(terminal)
    chunks = []
    while True:
        ready, _, _ = select.select([controller], [], [], 30)
        try:
            chunk = os.read(controller, 65536) if ready else b""
        except OSError:  # EIO: the process closed the terminal
            chunk = b""
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    return process.wait(timeout=30), b"".join(chunks).decode()


def _many_files(folder, count=21):
    for number in range(count):
        write(folder / f"m{number:02}.py", CLEAN)


def test_progress_shows_on_a_terminal_and_not_when_piped(tmp_path):
    _many_files(tmp_path)
    status, terminal = _run_on_terminal(["check", "."], "stderr")
    assert status == 0 and "perfmod check" in terminal and "100%" in terminal
    piped = subprocess.run(PERFMOD + ["check", "."], capture_output=True, text=True, env=process_env())
    assert piped.returncode == 0
    assert piped.stderr == "" and piped.stdout == "No findings (21 files checked).\n"


def test_no_progress_for_a_few_files_on_a_terminal(tmp_path):
    _many_files(tmp_path, count=20)
    status, terminal = _run_on_terminal(["check", "."], "stderr")
    assert status == 0 and terminal == ""


def test_diff_is_coloured_on_a_terminal_unless_no_color(tmp_path):
    write(tmp_path / "t.py", FIXABLE)
    _, coloured = _run_on_terminal(["apply", "t.py", "--dry-run"], "stdout")
    assert "\x1b[32m+y = x.to(device, non_blocking=True)" in coloured
    _, plain = _run_on_terminal(["apply", "t.py", "--dry-run"], "stdout", env=process_env(NO_COLOR="1"))
    assert "\x1b[" not in plain and "+y = x.to(device, non_blocking=True)" in plain

"""[tool.perfmod] settings, where they are found, how options override them,
and suppression comments."""

import json

import pytest

from tests.cli_support import (  # noqa: F401 (catalogue is a fixture)
    FIXABLE,
    FIXED,
    catalogue,
    perfmod,
    write,
)

pytestmark = pytest.mark.usefixtures("catalogue")

# PM101 (safe, fixed), PM991 (numeric), PM992 (unsafe), PM993 (report only).
SCRIPT = FIXABLE + "slow(1)\nrisky(2)\nlook(3)\n"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def project(folder, table: str, files=("t.py",)):
    write(folder / "pyproject.toml", "[project]\nname = 'demo'\n\n[tool.perfmod]\n" + table)
    for name in files:
        write(folder / name, SCRIPT)


def codes(*args) -> list[str]:
    """The codes `perfmod check` reports, in order."""
    result = perfmod("check", *args, "--format", "json")
    assert result.exit_code in (0, 1), result.stderr
    return [finding["code"] for finding in json.loads(result.stdout)["findings"]]


def applied(*args) -> list[str]:
    """The codes whose fixes `perfmod apply` would make (`check`: pending)."""
    result = perfmod("check", *args, "--format", "json")
    return [finding["code"] for finding in json.loads(result.stdout)["findings"] if finding["pending"]]


def test_defaults_without_configuration(tmp_path):
    write(tmp_path / "t.py", SCRIPT)
    assert codes("t.py") == ["PM101", "PM991", "PM992", "PM993"]
    assert applied("t.py") == ["PM101"]


def test_select_and_ignore(tmp_path):
    project(tmp_path, 'select = ["PM99"]\nignore = ["PM993"]\n')
    assert codes("t.py") == ["PM991", "PM992"]


def test_level(tmp_path):
    project(tmp_path, 'level = "numeric"\n')
    assert applied("t.py") == ["PM101", "PM991"]


def test_exclude_prunes_folders_and_files(tmp_path):
    project(tmp_path, 'exclude = ["scripts", "*_old.py"]\n', files=("src/a.py", "src/a_old.py", "scripts/b.py"))
    assert [entry["path"] for entry in json.loads(perfmod("check", ".", "--format", "json").stdout)["files"]] == [
        "src/a.py"
    ]


def test_per_file_ignores_match_from_the_project_root_wherever_perfmod_runs(tmp_path, monkeypatch):
    project(
        tmp_path,
        '[tool.perfmod.per-file-ignores]\n"scripts/*" = ["PM101", "PM99"]\n',
        files=("scripts/a.py", "src/b.py"),
    )
    assert codes("scripts/a.py") == []
    assert codes("src/b.py") == ["PM101", "PM991", "PM992", "PM993"]
    monkeypatch.chdir(tmp_path / "src")
    assert codes("../scripts/a.py") == []


def test_the_nearest_pyproject_above_the_first_path_wins(tmp_path):
    project(tmp_path, 'ignore = ["PM101"]\n', files=("top.py",))
    project(tmp_path / "inner", 'select = ["PM993"]\n', files=("inner.py",))
    assert codes("top.py") == ["PM991", "PM992", "PM993"]
    assert codes("inner/inner.py") == ["PM993"]
    assert codes("inner") == ["PM993"]


def test_a_pyproject_without_a_perfmod_table_does_not_hide_the_parents(tmp_path):
    project(tmp_path, 'select = ["PM993"]\n', files=("inner/inner.py",))
    write(tmp_path / "inner" / "pyproject.toml", '[project]\nname = "inner"\n')
    assert codes("inner/inner.py") == ["PM993"]


def test_stdin_uses_the_pyproject_above_the_working_folder(tmp_path, monkeypatch):
    project(tmp_path, 'select = ["PM101"]\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    result = perfmod("check", "-", "--format", "json", input=SCRIPT.encode())
    assert [f["code"] for f in json.loads(result.stdout)["findings"]] == ["PM101"]


def test_config_option_names_the_file(tmp_path):
    project(tmp_path, 'select = ["PM101"]\n')
    write(tmp_path / "other.toml", '[tool.perfmod]\nselect = ["PM993"]\n')
    assert codes("t.py", "--config", "other.toml") == ["PM993"]


def test_level_option_overrides_the_configured_level(tmp_path):
    project(tmp_path, 'level = "unsafe"\n')
    assert applied("t.py") == ["PM101", "PM991", "PM992"]
    assert applied("t.py", "--level", "safe") == ["PM101"]
    result = perfmod("apply", "t.py", "--level", "safe")
    assert (tmp_path / "t.py").read_text() == FIXED + "slow(1)\nrisky(2)\nlook(3)\n"
    assert "1 more fix available with --level numeric:" in result.stdout


def test_select_option_replaces_the_configured_select_and_ignore(tmp_path):
    project(tmp_path, 'select = ["PM99"]\nignore = ["PM101", "PM992"]\n')
    assert codes("t.py") == ["PM991", "PM993"]
    assert codes("t.py", "--select", "PM101,PM992") == ["PM101", "PM992"]
    assert codes("t.py", "--select", "ALL", "--ignore", "PM99") == ["PM101"]


def test_ignore_option_adds_to_the_configured_ignore(tmp_path):
    project(tmp_path, 'ignore = ["PM992"]\n')
    assert codes("t.py", "--ignore", "pm991") == ["PM101", "PM993"]


EXPECT_LEVEL = 'level: expected one of "safe", "numeric", "unsafe"'
EXPECT_CODES = "select: expected a list of rule codes or prefixes"


@pytest.mark.parametrize(
    "table, message",
    [
        ("level = 3\n", f"{EXPECT_LEVEL}; got 3 (an integer)"),
        ('level = ["safe"]\n', f'{EXPECT_LEVEL}; got ["safe"] (an array)'),
        ('level = "reckless"\n', f'{EXPECT_LEVEL}; got "reckless" (a string)'),
        (
            'select = "PM101,PM993"\n',
            f'{EXPECT_CODES}, e.g. ["PM1", "PM401"]; got the string "PM101,PM993" (a string); '
            'write a list: ["PM101", "PM993"]',
        ),
        (
            'select = ["PM101,PM993"]\n',
            '\'PM101,PM993\' holds several codes; give each its own string: ["PM101", "PM993"]',
        ),
        ('select = ["PM999"]\n', "PM999 matches no rule. Did you mean PM991, PM992, PM993?"),
        ('select = ["E501"]\n', "'E501' is not a perfmod code (PMnnn, a prefix such as PM1, or ALL)"),
        ("select = [101]\n", f'{EXPECT_CODES}, e.g. ["PM1", "PM401"]; got [101] (an array)'),
        ("select = PM101\n", "cannot read configuration: Invalid value"),
        ('ignore = "PM101"\n', 'ignore: expected a list of rule codes or prefixes, e.g. ["PM403"]; got the string'),
        (
            'ignore = ["PM1011"]\n',
            'ignore: expected a list of rule codes or prefixes, e.g. ["PM403"]; PM1011 matches no rule. '
            "Did you mean PM101?",
        ),
        (
            'exclude = "legacy"\n',
            'exclude: expected a list of glob patterns, e.g. ["legacy/", "*_pb2.py"]; got "legacy" (a string)',
        ),
        ("exclude = [1, 2]\n", "exclude: expected a list of glob patterns"),
        (
            'per-file-ignores = ["x"]\n',
            "per-file-ignores: expected a table of glob pattern = list of codes, "
            'e.g. { "scripts/*" = ["PM101"] }; got ["x"] (an array)',
        ),
        (
            'per-file-ignores = { "a/*" = "PM101" }\n',
            'per-file-ignores."a/*": expected a list of rule codes or prefixes',
        ),
        (
            'per-file-ignores = { "a/*" = ["PM99x"] }\n',
            'per-file-ignores."a/*": expected a list of rule codes or prefixes, '
            "e.g. [\"PM403\"]; 'PM99x' is not a perfmod code",
        ),
        ("amp = 16\n", 'amp: expected one of "bf16", "fp16"; got 16 (an integer)'),
        ('respect-gitignore = "yes"\n', 'respect-gitignore: expected true or false; got "yes" (a string)'),
        ("force-exclude = 1\n", "force-exclude: expected true or false; got 1 (an integer)"),
        ('selct = ["PM1"]\n', "unknown key 'selct'; did you mean 'select'? known keys: level, select, ignore,"),
    ],
)
def test_a_bad_configuration_exits_2_with_one_line_naming_the_file_key_and_expectation(tmp_path, table, message):
    project(tmp_path, table)
    for command in ("check", "apply"):
        result = perfmod(command, "t.py")
        assert result.exit_code == 2, result.stderr
        assert result.stdout == ""
        (line,) = result.stderr.splitlines()  # one line, no traceback
        assert line.startswith(f"Error: {tmp_path / 'pyproject.toml'}: "), line
        assert message in line, line
    assert (tmp_path / "t.py").read_text() == SCRIPT


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "[tool]\nperfmod = 3\n",
            '[tool.perfmod] must be a table of settings (level = "safe", ...), got 3 (an integer)',
        ),
        (
            '[tool]\nperfmod = "safe"\n',
            '[tool.perfmod] must be a table of settings (level = "safe", ...), got "safe" (a string)',
        ),
        ("tool = 3\n", "`tool` must be a table ([tool.perfmod]), got 3 (an integer)"),
    ],
)
def test_a_perfmod_table_of_the_wrong_type_exits_2(tmp_path, text, message):
    write(tmp_path / "pyproject.toml", text)
    write(tmp_path / "t.py", SCRIPT)
    args = ("--config", tmp_path / "pyproject.toml") if text.startswith("tool") else ()
    result = perfmod("check", "t.py", *args)
    assert result.exit_code == 2
    assert result.stderr == f"Error: {tmp_path / 'pyproject.toml'}: {message}\n"


def test_a_pyproject_whose_tool_is_no_table_does_not_hide_the_parents(tmp_path):
    project(tmp_path, 'select = ["PM993"]\n', files=("inner/t.py",))
    write(tmp_path / "inner" / "pyproject.toml", "tool = 3\n")
    assert codes("inner/t.py") == ["PM993"]


def test_unknown_codes_in_the_real_catalogue_are_rejected_too(tmp_path, monkeypatch):
    """Without the test catalogue: PM999 is no rule of perfmod's either."""
    from codemod import rules

    monkeypatch.setattr("tests.cli_support.ALL_RULES", rules.ALL_RULES)
    write(tmp_path / "pyproject.toml", '[tool.perfmod]\nselect = ["PM999"]\n')
    write(tmp_path / "t.py", SCRIPT)
    result = perfmod("check", "t.py")
    assert result.exit_code == 2 and "PM999 matches no rule." in result.stderr


def test_codes_may_be_written_in_lower_case_and_bools_and_levels_are_read(tmp_path):
    project(
        tmp_path, 'select = ["pm101", "pm99"]\nlevel = "Numeric"\nrespect-gitignore = false\nforce-exclude = true\n'
    )
    assert applied("t.py") == ["PM101", "PM991"]


def test_suppression_comments(tmp_path):
    source = (
        "import torch\n"
        'device = torch.device("cuda")\n'
        "x = torch.randn(4, pin_memory=True)\n"
        "a = x.to(device)  # perfmod: ignore\n"
        "b = x.to(device)  # perfmod: ignore[PM101]\n"
        "c = x.to(device)  # perfmod: ignore[PM991, PM993]\n"
        "d = slow(x.to(device))  # perfmod: ignore[PM991]\n"
    )
    script = write(tmp_path / "t.py", source)
    result = perfmod("apply", "t.py", "--level", "numeric")
    assert result.exit_code == 0
    assert script.read_text() == (
        source.replace("c = x.to(device)", "c = x.to(device, non_blocking=True)").replace(
            "slow(x.to(device))", "slow(x.to(device, non_blocking=True))"
        )
    )
    assert result.stdout.startswith("Fixed t.py: 2 fixes (PM101 x2)\n")


SUPPRESSED = (
    "import torch\n"
    'device = torch.device("cuda")\n'
    "x = torch.randn(4, pin_memory=True)\n"
    "a = slow(x.to(device))  # perfmod: ignore PM101\n"  # the colon habit of ruff's noqa comments: these codes only
    "b = slow(x.to(device))  # perfmod: ignore: PM991, PM101\n"
    "c = slow(x.to(device))  # perfmod: ignore[PM999]\n"
    "d = slow(x.to(device))  # perfmod: ignore PM1011\n"
    "e = slow(x.to(device))  # perfmod: ignore[PM1]\n"
    "f = slow(x.to(device))  # perfmod: ignore[]\n"
    "g = slow(x.to(device))  # perfmod: ingore\n"
    "h = slow(x.to(device))  # perfmod: ignore  because it is legacy code\n"
)


def test_a_bare_code_after_ignore_is_a_code_list_never_everything(tmp_path):
    write(tmp_path / "t.py", SUPPRESSED)
    found = [
        (f["line"], f["code"]) for f in json.loads(perfmod("check", "t.py", "--format", "json").stdout)["findings"]
    ]
    assert [code for line, code in found if line == 4] == ["PM991"]  # PM101 suppressed, PM991 not
    assert [code for line, code in found if line == 5] == []
    for line in (6, 7, 8, 9, 10):  # bad codes, prefixes, empty brackets, a misspelt directive: nothing suppressed
        assert sorted(code for at, code in found if at == line) == ["PM101", "PM991"], line
    assert [code for line, code in found if line == 11] == []  # `ignore` and a reason: every rule


def test_suppression_comments_that_do_nothing_are_warned_about_with_path_and_line(tmp_path):
    write(tmp_path / "t.py", SUPPRESSED)
    result = perfmod("check", "t.py")
    warnings = [line for line in result.stderr.splitlines() if ": warning: " in line]
    assert warnings == [
        "t.py:6: warning: `PM999` in `# perfmod: ignore` is no perfmod rule, so it suppresses nothing; "
        "did you mean PM991, PM992, PM993?",
        "t.py:7: warning: `PM1011` in `# perfmod: ignore` is no perfmod rule, so it suppresses nothing; "
        "did you mean PM101?",
        "t.py:8: warning: `PM1` in `# perfmod: ignore` is a prefix, and suppression names codes in full: write PM101",
        "t.py:9: warning: `# perfmod: ignore[]` names no code and suppresses nothing; name the codes, "
        "or write `# perfmod: ignore` to suppress every rule on the line",
        "t.py:10: warning: `# perfmod: ingore` is not a perfmod directive; write `# perfmod: ignore` or "
        "`# perfmod: ignore[CODE]`",
    ]
    assert result.stdout.startswith("t.py:4:5: PM991")  # warnings stay out of the findings
    assert perfmod("check", "t.py").stderr == result.stderr  # from the cache: the same warnings
    assert perfmod("check", "t.py", "-q").stderr == ""


NOQA = (
    "import torch\n"
    'device = torch.device("cuda")\n'
    "x = torch.randn(4, pin_memory=True)\n"
    "a = slow(x.to(device))  # noqa: PM101\n"
    "b = slow(x.to(device))  # noqa\n"  # every rule, as in ruff
    "c = slow(x.to(device))  # noqa: E501, PM991\n"  # another tool's code beside ours
    "d = slow(x.to(device))  # noqa: E501\n"  # only another tool's: nothing of ours
    "e = slow(x.to(device))  # type: ignore  # NOQA:PM101,PM991\n"
    "f = slow(x.to(device))  # noqa PM101\n"  # no colon: every rule, in ruff as here
    "g = slow(x.to(device))  # noqa: pm101\n"  # lower case: ruff reads no code
    "h = slow(x.to(device))  # noqa: PM101 because PM991 is wanted\n"
    "i = slow(x.to(device))  # noqa: PM999\n"
    "j = slow(x.to(device))  # noqa: E501  # perfmod: ignore[PM991]\n"
    "k = slow(x.to(device))  # ruff: noqa\n"  # ruff's own, for the whole file: not perfmod's
)


def test_noqa_comments_suppress_as_ruff_reads_them(tmp_path):
    write(tmp_path / "t.py", NOQA)
    found = [
        (f["line"], f["code"]) for f in json.loads(perfmod("check", "t.py", "--format", "json").stdout)["findings"]
    ]
    left = {line: sorted(code for at, code in found if at == line) for line in range(4, 15)}
    assert left == {
        4: ["PM991"],
        5: [],
        6: ["PM101"],
        7: ["PM101", "PM991"],
        8: [],
        9: [],
        10: ["PM101", "PM991"],
        11: ["PM991"],
        12: ["PM101", "PM991"],
        13: ["PM101"],
        14: ["PM101", "PM991"],
    }


def test_rules_that_ask_about_a_statement_see_noqa_too():
    import libcst as cst

    from codemod.suppression import suppressed_on

    def statement(text: str) -> cst.CSTNode:
        return cst.parse_module(text).body[0]

    assert suppressed_on(statement("x = f()  # noqa: PM202\n"), "PM202")
    assert not suppressed_on(statement("x = f()  # noqa: PM202\n"), "PM101")
    assert suppressed_on(statement("for a in b:  # noqa\n    pass\n"), "PM202")
    assert not suppressed_on(statement("x = f()  # noqa: E501\n"), "PM202")


def test_noqa_comments_that_do_not_do_what_they_seem_to_are_warned_about(tmp_path):
    write(tmp_path / "t.py", NOQA)
    warnings = [line for line in perfmod("check", "t.py").stderr.splitlines() if ": warning: " in line]
    assert warnings == [
        "t.py:9: warning: `# noqa PM101` (no colon) suppresses every rule on the line, perfmod's too, as in "
        "ruff; write `# noqa: PM101` to suppress PM101 alone",
        "t.py:10: warning: `pm101` in `# noqa` is not read as a code, so it suppresses nothing; write "
        "`# noqa: PM101` (codes in upper case right after `noqa:`, before any other word)",
        "t.py:11: warning: `PM991` in `# noqa` is not read as a code, so it suppresses nothing; write "
        "`# noqa: PM991` (codes in upper case right after `noqa:`, before any other word)",
        "t.py:12: warning: `PM999` in `# noqa` is no perfmod rule, so it suppresses nothing; "
        "did you mean PM991, PM992, PM993?",
    ]


def test_suppression_warnings_come_from_worker_processes_too(tmp_path):
    write(tmp_path / "a.py", SUPPRESSED)
    write(tmp_path / "b.py", "x = 1  # perfmod: ignore[PM999]\n")
    result = perfmod("check", ".", "-j", "2", "--no-cache")
    assert [line.split(": warning")[0] for line in result.stderr.splitlines() if "warning" in line] == [
        "a.py:6",
        "a.py:7",
        "a.py:8",
        "a.py:9",
        "a.py:10",
        "b.py:1",
    ]

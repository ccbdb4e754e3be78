"""[tool.perfmod] settings, where they are found, how options override them,
and suppression comments."""

import json

import pytest

from tests.cli_support import (  # noqa: F401 (catalogue is a fixture)
    FIXABLE, FIXED, catalogue, perfmod, write,
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
    result = perfmod("check", *args, "--format", "json")
    return [finding["code"] for finding in json.loads(result.stdout)["findings"] if finding["applied"]]


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
        "src/a.py"]


def test_per_file_ignores_match_from_the_project_root_wherever_perfmod_runs(tmp_path, monkeypatch):
    project(tmp_path, '[tool.perfmod.per-file-ignores]\n"scripts/*" = ["PM101", "PM99"]\n',
            files=("scripts/a.py", "src/b.py"))
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


@pytest.mark.parametrize("table, message", [
    ('level = "reckless"\n', "unknown level 'reckless'"),
    ('colour = "red"\n', "unknown key(s) in [tool.perfmod]: colour"),
    ('select = ["E501"]\n', "select: 'E501' is not a perfmod code"),
    ("select = PM101\n", "cannot read configuration"),
])
def test_a_bad_configuration_exits_2_with_the_reason(tmp_path, table, message):
    project(tmp_path, table)
    for command in ("check", "apply"):
        result = perfmod(command, "t.py")
        assert result.exit_code == 2
        assert message in result.stderr and str(tmp_path / "pyproject.toml") in result.stderr
    assert (tmp_path / "t.py").read_text() == SCRIPT


def test_suppression_comments(tmp_path):
    source = (
        "import torch\n"
        'device = torch.device("cuda")\n'
        "x = torch.randn(4)\n"
        "a = x.to(device)  # perfmod: ignore\n"
        "b = x.to(device)  # perfmod: ignore[PM101]\n"
        "c = x.to(device)  # perfmod: ignore[PM991, PM993]\n"
        "d = slow(x.to(device))  # perfmod: ignore[PM991]\n"
    )
    script = write(tmp_path / "t.py", source)
    result = perfmod("apply", "t.py", "--level", "numeric")
    assert result.exit_code == 0
    assert script.read_text() == (
        source.replace("c = x.to(device)", "c = x.to(device, non_blocking=True)")
        .replace("slow(x.to(device))", "slow(x.to(device, non_blocking=True))")
    )
    assert result.stdout.startswith("Fixed t.py: 2 fixes (PM101 x2)\n")

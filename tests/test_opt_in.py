"""Opt-in rules (Rule.OPT_IN, such as PM506) run only when `select` names their code or
is ALL (every rule, as in ruff): prefixes, the default `PM` included, leave them out;
other rules are unchanged."""

import json

import pytest

from codemod.config import Settings, settings_from_table
from codemod.engine import process_source, selected_rules
from codemod.rules import ALL_RULES, RULES_BY_CODE
from tests.cli_support import perfmod, write

COMPILE = RULES_BY_CODE["PM506"]
SCRIPT = RULES_BY_CODE["PM506"].INVALID[0].code  # a training script PM506 would fix


def test_pm506_is_opt_in_and_the_other_rules_are_not():
    assert COMPILE.OPT_IN
    assert [rule.CODE for rule in ALL_RULES if rule.OPT_IN] == ["PM506", "PM601"]


@pytest.mark.parametrize("select", [("PM",), ("PM5",), ("PM50",), ("PM501",)])
def test_prefixes_leave_an_opt_in_rule_out(select):
    settings = Settings(select=select)
    assert not settings.enabled("PM506", opt_in=True)
    assert COMPILE not in selected_rules(settings, "train.py")


@pytest.mark.parametrize("select", [("PM506",), ("PM", "PM506"), ("PM1", "PM506"), ("ALL",), ("PM1", "ALL")])
def test_naming_the_code_or_all_selects_it(select):
    settings = Settings(select=select)
    assert settings.enabled("PM506", opt_in=True)
    assert COMPILE in selected_rules(settings, "train.py")


def test_all_selects_every_rule_of_the_catalogue():
    assert selected_rules(Settings(select=("ALL",)), "train.py") == list(ALL_RULES)


def test_ignore_and_per_file_ignores_still_win():
    assert not Settings(select=("PM506",), ignore=("PM5",)).enabled("PM506", opt_in=True)
    assert not Settings(select=("ALL",), ignore=("PM506",)).enabled("PM506", opt_in=True)
    settings = Settings(select=("PM506",), per_file_ignores={"scripts/*": ("PM506",)})
    assert not settings.enabled("PM506", "scripts/train.py", opt_in=True)
    assert settings.enabled("PM506", "train.py", opt_in=True)


def test_rules_that_are_not_opt_in_are_selected_as_before():
    default = selected_rules(Settings(), "train.py")
    assert default == [rule for rule in ALL_RULES if not rule.OPT_IN]
    assert Settings(select=("PM4",)).enabled("PM401") and not Settings(select=("PM4",)).enabled("PM101")


def test_the_default_run_does_not_compile_and_a_named_one_does():
    plain = process_source(SCRIPT.encode(), "train.py", Settings(level=COMPILE.LEVEL))
    assert all(f.code != "PM506" for f in plain.findings) and b".compile()" not in plain.new_source
    named = process_source(
        SCRIPT.encode(), "train.py", settings_from_table({"select": ["PM", "PM506"], "level": "numeric"})
    )
    assert [f.code for f in named.findings if f.applied].count("PM506") == 1
    assert b"model.compile()" in named.new_source


def test_the_command_line_selects_it_by_code(tmp_path):
    script = write(tmp_path / "train.py", SCRIPT)
    plain = json.loads(perfmod("check", script, "--level", "numeric", "--format", "json").stdout)
    assert "PM506" not in {f["code"] for f in plain["findings"]}
    named = json.loads(perfmod("check", script, "--select", "PM506", "--level", "numeric", "--format", "json").stdout)
    assert {f["code"] for f in named["findings"]} == {"PM506"}


def test_select_all_on_the_command_line_runs_the_opt_in_rules(tmp_path):
    script = write(tmp_path / "train.py", SCRIPT)
    every = json.loads(perfmod("check", script, "--select", "ALL", "--level", "numeric", "--format", "json").stdout)
    assert "PM506" in {f["code"] for f in every["findings"]}

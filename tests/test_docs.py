"""The generated rule pages, and the catalogue as `perfmod rules` and
`perfmod explain` show it: every rule in ALL_RULES, as it is at test time."""

import json

import pytest

from codemod import docs
from codemod.rule import Invalid, Level, Rule
from codemod.rules import ALL_RULES
from tests.cli_support import REPO, perfmod

DOCS = REPO / docs.DOCS_FOLDER
STALE = "out of date: run `make docs` (python -m codemod.docs docs/rules) and commit docs/rules/"


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda rule: rule.CODE)
def test_the_committed_page_of_every_rule_is_current(rule):
    page = DOCS / docs.page_name(rule)
    assert page.is_file(), f"{page} is missing; {STALE}"
    assert page.read_text(encoding="utf-8") == docs.rule_page(rule), f"{page} is {STALE}"


def test_the_committed_index_is_current_and_nothing_is_stale():
    index = DOCS / docs.INDEX
    assert index.read_text(encoding="utf-8") == docs.index_page(ALL_RULES), f"{index} is {STALE}"
    assert docs.stale_pages(DOCS, docs.pages()) == [], f"pages of rules that are gone; {STALE}"


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda rule: rule.CODE)
def test_page_layout(rule):
    page = docs.rule_page(rule)
    lines = page.splitlines()
    assert lines[0] == f"# {rule.NAME} ({rule.CODE})"
    assert f"Generated from `{docs.source_path(rule)}`" in lines[2] and "DO NOT EDIT" in lines[2]
    assert (REPO / docs.source_path(rule)).is_file()
    assert f"**Level:** {rule.LEVEL.label}, " in page and "**Fix:** " in page and rule.GAIN in page
    assert page.endswith(rule.docs() + "\n")
    index = docs.index_page(ALL_RULES)
    level = f"{rule.LEVEL.label} (opt-in)" if rule.OPT_IN else rule.LEVEL.label
    assert f"| {rule.CODE} | [{rule.NAME}]({rule.NAME}.md) | {level} |" in index
    assert (f"opt-in: runs only when selected by its code (`--select {rule.CODE}`) or by `ALL`" in page) == rule.OPT_IN


def test_generation_writes_pages_removes_stale_ones_and_keeps_hand_written_ones(tmp_path, capsys):
    (tmp_path / "gone-rule.md").write_text(f"# gone-rule (PM999)\n\n_{docs.DO_NOT_EDIT}._\n")
    (tmp_path / "guide.md").write_text("# Written by hand\n")
    assert docs.main([str(tmp_path)]) == 0
    expected = docs.pages()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*expected, "guide.md"])
    for name, content in expected.items():
        assert (tmp_path / name).read_text(encoding="utf-8") == content
    output = capsys.readouterr().out
    assert f"removed {tmp_path / 'gone-rule.md'}" in output and f"wrote {tmp_path / docs.INDEX}" in output
    assert docs.write_pages(tmp_path) == []  # current pages are left as they are


def test_generator_usage_error(capsys):
    assert docs.main([]) == 2
    assert "usage: python -m codemod.docs FOLDER" in capsys.readouterr().err


class _Example(Rule):
    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM990", "test-example", Level.SAFE, "m", "g"


@pytest.mark.parametrize(
    "replacements, text",
    [
        (["fixed\n", "fixed\n"], "always available"),
        (["fixed\n", None], "sometimes available"),
        ([None], "none, report only"),
        ([], "none, report only"),
    ],
)
def test_fix_availability_follows_the_invalid_examples(replacements, text):
    rule = type("Example", (_Example,), {"INVALID": [Invalid("code\n", r) for r in replacements]})
    assert docs.fix_availability(rule) == text


# -- the whole catalogue through the CLI --------------------------------------------------


def test_rules_lists_the_whole_catalogue():
    table = perfmod("rules").stdout.splitlines()[1:]
    assert [line.split()[:3] for line in table] == [[r.CODE, r.NAME, r.LEVEL.label] for r in ALL_RULES]
    listed = json.loads(perfmod("rules", "--format", "json").stdout)
    assert [(r["code"], r["docs"]) for r in listed] == [(r.CODE, docs.page_path(r)) for r in ALL_RULES]
    assert all(
        r["docs"].endswith("/" + docs.page_file(rule)) and (REPO / docs.page_file(rule)).is_file()
        for r, rule in zip(listed, ALL_RULES)
    )


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda rule: rule.CODE)
def test_explain_every_rule(rule):
    result = perfmod("explain", rule.CODE)
    assert result.exit_code == 0
    assert result.stdout.startswith(f"{rule.CODE} {rule.NAME}\nLevel: {rule.LEVEL.label}, ")
    assert rule.docs() in result.stdout and f"Expected gain: {rule.GAIN}" in result.stdout
    assert "## Examples from the rule's tests" in result.stdout


def test_rule_links_are_absolute_at_the_release_tag():
    """SARIF helpUri, the review page's links and `explain` work outside a checkout:
    the page as committed at the tag of the installed version."""
    from importlib.metadata import version

    rule = ALL_RULES[0]
    url = docs.page_path(rule)
    assert url == f"https://github.com/perfmod/perfmod/blob/v{version('perfmod')}/docs/rules/{rule.NAME}.md"
    assert (REPO / docs.page_file(rule)).is_file()
    assert f"Docs: {url}\n" in perfmod("explain", rule.CODE).stdout
    metadata = (REPO / "pyproject.toml").read_text()
    assert f'/blob/v{version("perfmod")}/docs/rules/README.md"' in metadata  # [project.urls] names the same tag

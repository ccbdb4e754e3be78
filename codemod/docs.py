"""Rule pages generated from the rules themselves, as ruff's generate_docs does.

    python -m codemod.docs docs/rules      (or: make docs)

writes docs/rules/<name>.md for every rule in the catalogue and
docs/rules/README.md with the table, and removes generated pages whose rule is
gone. The heading, level and fix availability come from the rule's metadata,
the body is its docstring; tests/test_docs.py fails when a page is stale.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from codemod.rule import Level, Rule
from codemod.rules import ALL_RULES

DOCS_FOLDER = "docs/rules"  # where the pages live, relative to the repository root
# Where a rule's page is read outside a checkout (SARIF helpUri, the review page, `explain`):
# the page as committed at the release tag of the installed perfmod, so a link
# always shows the docs of the version that reported the finding.
RULE_PAGE_URL = "https://github.com/perfmod/perfmod/blob/{ref}/docs/rules/{page}"
INDEX = "README.md"
DO_NOT_EDIT = "DO NOT EDIT"
COMMAND = "python -m codemod.docs docs/rules"

LEVEL_NOTES = {
    Level.SAFE: "applied by default (`--level safe`)",
    Level.NUMERIC: "applied with `--level numeric` or `--level unsafe`",
    Level.UNSAFE: "applied only with `--level unsafe`",
}


def page_name(rule: type[Rule]) -> str:
    return f"{rule.NAME}.md"


def page_path(rule: type[Rule]) -> str:
    """The page's absolute address, as links, SARIF and `explain` name it."""
    return RULE_PAGE_URL.format(ref=release_ref(), page=page_name(rule))


def page_file(rule: type[Rule]) -> str:
    """The page's path from the repository root."""
    return f"{DOCS_FOLDER}/{page_name(rule)}"


def release_ref() -> str:
    """The git tag of the installed release (`v0.2.0`); `main` where perfmod runs
    from a source tree that was never installed."""
    try:
        return f"v{version('perfmod')}"
    except PackageNotFoundError:
        return "main"


SENTENCE_END = re.compile(r"[.!?][)\"'`]*$")


def summary(rule: type[Rule]) -> str:
    """What the rule does, in whole sentences, on one line: the first paragraph
    under '## What it does', continued past an example (a code block) when the
    paragraph stops mid-sentence, and closed with a full stop where it ends in a
    colon that introduces the example."""
    section = re.search(r"## What it does\s*\n(.*?)(?=\n##|\Z)", rule.docs(), re.S)
    if section is None:
        return " ".join(rule.MESSAGE.split())
    text = ""
    for paragraph in _prose(section.group(1)):
        if text:  # a sentence that goes on after the example: up to its first full stop
            end = re.search(r"[.!?](?=\s+[A-Z(`])", paragraph)
            text = f"{text} {paragraph[: end.end()] if end else paragraph}"
        else:
            text = paragraph
        if SENTENCE_END.search(text):
            return text
        if text.endswith(":"):
            return text[:-1] + "."
    return text.rstrip(",;:") + "." if text else " ".join(rule.MESSAGE.split())


def _prose(section: str) -> list[str]:
    """The paragraphs of a markdown section that are text, each on one line;
    fenced and indented code blocks left out."""
    paragraphs, fenced = [], False
    for block in re.split(r"\n\s*\n", section.strip("\n")):
        lines = block.splitlines()
        fences = sum(1 for line in lines if line.lstrip().startswith("```"))
        if fenced or (lines and lines[0].lstrip().startswith("```")):
            fenced = fenced != (fences % 2 == 1)
            continue
        if lines and all(line.startswith(("    ", "\t")) or not line.strip() for line in lines):
            continue
        paragraphs.append(" ".join(block.split()))
    return paragraphs


def source_path(rule: type[Rule]) -> str:
    """The rule's file: its module, or the `__init__.py` of its package."""
    module = sys.modules[rule.__module__]
    return rule.__module__.replace(".", "/") + ("/__init__.py" if hasattr(module, "__path__") else ".py")


def fix_availability(rule: type[Rule]) -> str:
    """What the rule's own INVALID examples show: every one fixed, some, or none."""
    fixed = [case.expected_replacement is not None for case in rule.INVALID]
    if fixed and all(fixed):
        return "always available"
    if any(fixed):
        return "sometimes available"
    return "none, report only"


def level_note(rule: type[Rule]) -> str:
    note = f"{rule.LEVEL.label}, {LEVEL_NOTES[rule.LEVEL]}"
    if rule.OPT_IN:
        note += f"; opt-in: runs only when selected by its code (`--select {rule.CODE}`) or by `ALL`"
    return note


def level_label(rule: type[Rule]) -> str:
    """The level as a table shows it, marking opt-in rules."""
    return f"{rule.LEVEL.label} (opt-in)" if rule.OPT_IN else rule.LEVEL.label


def rule_page(rule: type[Rule]) -> str:
    return "\n".join(
        [
            f"# {rule.NAME} ({rule.CODE})",
            "",
            f"_Generated from `{source_path(rule)}` by `{COMMAND}`; {DO_NOT_EDIT}._",
            "",
            f"**Level:** {level_note(rule)}.",
            "",
            f"**Fix:** {fix_availability(rule)}.",
            "",
            f"**Expected gain:** {rule.GAIN}",
            "",
            rule.docs(),
            "",
        ]
    )


def index_page(rules: Sequence[type[Rule]]) -> str:
    rows = [
        f"| {rule.CODE} | [{rule.NAME}]({page_name(rule)}) | {level_label(rule)} | "
        f"{fix_availability(rule)} | {_cell(summary(rule))} |"
        for rule in rules
    ]
    return "\n".join(
        [
            "# Rules",
            "",
            f"_Generated from `codemod/rules/` by `{COMMAND}`; {DO_NOT_EDIT}._",
            "",
            "`--level` picks the highest level applied (default `safe`); `perfmod explain CODE`",
            "prints a page in the terminal.",
            "",
            "| Code | Name | Level | Fix | What it does |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def pages(rules: Sequence[type[Rule]] = ALL_RULES) -> dict[str, str]:
    """File name -> content of every generated page."""
    generated = {page_name(rule): rule_page(rule) for rule in rules}
    generated[INDEX] = index_page(rules)
    return generated


def stale_pages(folder: Path, expected: dict[str, str]) -> list[Path]:
    """Generated pages in `folder` that no rule generates any more."""
    return sorted(
        path
        for path in folder.glob("*.md")
        if path.name not in expected and DO_NOT_EDIT in path.read_text(encoding="utf-8")
    )


def write_pages(folder: Path, rules: Sequence[type[Rule]] = ALL_RULES) -> list[Path]:
    """Write every page that differs and remove stale ones; returns the paths touched."""
    folder.mkdir(parents=True, exist_ok=True)
    expected = pages(rules)
    touched = []
    for name, content in expected.items():
        path = folder / name
        if not path.exists() or path.read_text(encoding="utf-8") != content:
            path.write_text(content, encoding="utf-8", newline="\n")
            touched.append(path)
    for path in stale_pages(folder, expected):
        path.unlink()
        touched.append(path)
    return touched


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1 or args[0].startswith("-"):
        print(f"usage: {COMMAND.replace('docs/rules', 'FOLDER')}", file=sys.stderr)
        return 2
    for path in write_pages(Path(args[0])):
        print(f"{'wrote' if path.exists() else 'removed'} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every rule's VALID and INVALID examples run as tests (Fixit style)."""

import pytest

from codemod.rules import ALL_RULES
from codemod.testing import check_invalid, check_valid

VALID = [(rule, case) for rule in ALL_RULES for case in rule.VALID]
INVALID = [(rule, case) for rule in ALL_RULES for case in rule.INVALID]


@pytest.mark.parametrize("rule,case", VALID, ids=[f"{r.CODE}-valid-{i}" for i, (r, _) in enumerate(VALID)])
def test_valid(rule, case):
    check_valid(rule, case)


@pytest.mark.parametrize("rule,case", INVALID, ids=[f"{r.CODE}-invalid-{i}" for i, (r, _) in enumerate(INVALID)])
def test_invalid(rule, case):
    check_invalid(rule, case)


def test_every_rule_has_examples_and_docs():
    for rule in ALL_RULES:
        assert rule.VALID and rule.INVALID, rule.CODE
        for section in ("## What it does", "## Why is this bad?", "## Example", "## Fix safety"):
            assert section in rule.docs(), f"{rule.CODE} docs lack {section}"


def test_codes_and_names_are_unique():
    codes = [r.CODE for r in ALL_RULES]
    names = [r.NAME for r in ALL_RULES]
    assert len(codes) == len(set(codes)) and len(names) == len(set(names))

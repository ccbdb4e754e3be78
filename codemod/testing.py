"""Run a rule's own VALID / INVALID examples (Fixit style); used by the tests
and by `perfmod explain` users who want to check a rule on their snippet."""

from __future__ import annotations

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Invalid, Rule, Valid


def check_valid(rule: type[Rule], case: Valid) -> None:
    result = process_source(case.code.encode(), "<valid>", Settings(select=(rule.CODE,)), [rule])
    assert result.error is None, result.error
    found = [f for f in result.findings if f.code == rule.CODE]
    assert not found, f"{rule.CODE} should not report ({case.note}):\n{case.code}\nbut found: {found}"


def check_invalid(rule: type[Rule], case: Invalid) -> None:
    settings = Settings(select=(rule.CODE,), level=rule.LEVEL).with_overrides(**case.config)
    result = process_source(case.code.encode(), "<invalid>", settings, [rule])
    assert result.error is None, result.error
    found = [f for f in result.findings if f.code == rule.CODE]
    assert found, f"{rule.CODE} should report ({case.note}):\n{case.code}"
    output = result.new_source.decode()
    if case.expected_replacement is None:
        assert not any(f.fixable for f in found), f"{rule.CODE} should report without a fix:\n{case.code}"
        assert output == case.code
        return
    assert output == case.expected_replacement, (
        f"{rule.CODE} fix differs.\n--- got\n{output}\n--- want\n{case.expected_replacement}"
    )
    again = process_source(result.new_source, "<invalid>", settings, [rule])
    assert not again.pending and again.new_source == result.new_source, f"{rule.CODE} is not idempotent:\n{output}"

"""The rule model: levels, findings, and the base class every rule extends.

A rule is a libcst batchable visitor (all rules share one traversal per file,
as in Fixit). It detects and fixes in the same visit: ``self.report(node,
replacement=new)`` records a finding with its fix, ``self.report(node)`` one
without. Rules never print, never touch files and never import click.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Sequence, Union

import libcst as cst
from libcst.metadata import (
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from codemod.result import Finding, Level  # noqa: F401  (re-exported: rules import them from here)

if TYPE_CHECKING:
    from codemod.context import FileContext




Replacement = Union[cst.CSTNode, cst.RemovalSentinel, cst.FlattenSentinel]




@dataclass(frozen=True)
class Valid:
    """Code the rule must leave alone (no finding at all)."""

    code: str
    note: str = ""


@dataclass(frozen=True)
class Invalid:
    """Code the rule must report; ``expected_replacement`` is the whole fixed
    module at the rule's own level, or None when the rule reports without a fix."""

    code: str
    expected_replacement: str | None = None
    note: str = ""
    config: dict = field(default_factory=dict)


@dataclass
class Report:
    """What a rule hands the engine: the node, why, and the optional fix."""

    node: cst.CSTNode  # what the fix replaces
    location: cst.CSTNode  # where the finding is reported (and suppressed): the offending code
    code: str
    name: str
    message: str
    level: Level
    replacement: Replacement | None
    imports: tuple[tuple[str, str | None], ...]  # (module, obj) pairs the fix needs


class Rule(cst.BatchableCSTVisitor):
    """Base class: subclasses set the ClassVars and implement visit_* methods.

    The class docstring is the rule's documentation page, in ruff's sections:
    ``## What it does``, ``## Why is this bad?``, ``## Example``, ``## Fix safety``.
    """

    CODE: ClassVar[str]
    NAME: ClassVar[str]  # kebab-case name of the pattern, not of the fix
    LEVEL: ClassVar[Level]
    MESSAGE: ClassVar[str]
    GAIN: ClassVar[str]  # one line: the expected gain, where it shows
    VALID: ClassVar[Sequence[Valid]] = ()
    INVALID: ClassVar[Sequence[Invalid]] = ()
    # Text without which the rule cannot match (any one of these must occur in
    # the file); the engine skips the rule, and the analyses it would build,
    # for files without it. Empty: always run.
    REQUIRES: ClassVar[tuple[str, ...]] = ()
    # Opt-in rules run only when `select` names their code exactly (`--select PM506`):
    # prefixes (`PM`, `PM5`) and `ALL` leave them out, so the default run never has them.
    OPT_IN: ClassVar[bool] = False

    METADATA_DEPENDENCIES = (
        PositionProvider,
        QualifiedNameProvider,
        ScopeProvider,
        ParentNodeProvider,
    )

    def __init__(self, context: "FileContext") -> None:
        super().__init__()
        self.context = context
        self.reports: list[Report] = []

    def report(
        self,
        node: cst.CSTNode,
        message: str | None = None,
        *,
        replacement: Replacement | None = None,
        level: Level | None = None,
        imports: Sequence[tuple[str, str | None]] = (),
        at: cst.CSTNode | None = None,
    ) -> None:
        """Report `node` (replaced by `replacement` when given); `at` is where to
        point the user when the fix replaces a larger node (a whole loop) than
        the offending code."""
        self.reports.append(
            Report(
                node=node,
                location=at if at is not None else node,
                code=self.CODE,
                name=self.NAME,
                message=message or self.MESSAGE,
                level=max(level, self.LEVEL) if level is not None else self.LEVEL,
                replacement=replacement,
                imports=tuple(imports),
            )
        )

    # -- documentation -----------------------------------------------------

    @classmethod
    def docs(cls) -> str:
        return textwrap.dedent(inspect.getdoc(cls) or "").strip()

    @classmethod
    def summary(cls) -> str:
        """The first paragraph under '## What it does', on one line."""
        match = re.search(r"## What it does\s*\n(.*?)(\n\s*\n|\n##|$)", cls.docs(), re.S)
        text = match.group(1) if match else cls.MESSAGE
        return " ".join(text.split())

"""The rule model: the base class every rule extends, and its examples.

A rule defines `visit_<Node>` / `leave_<Node>` methods, as a libcst visitor
does; the engine calls them for every node of those types in one walk shared
by all rules (as in Fixit). A rule detects and fixes in the same visit:
``self.report(node, edits=[...])`` records a finding with its fix (see
codemod.edits), ``self.report(node)`` one without. Rules read what they need
from `self.context` (codemod.context.FileContext) and never print, never touch
files and never import click.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import libcst as cst

from codemod.analysis.torchscript import torchscript
from codemod.edits import AddImport, Edit, Replace
from codemod.result import Finding, Level  # noqa: F401  (re-exported: rules import them from here)

if TYPE_CHECKING:
    from codemod.context import FileContext


Replacement = cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel
_HOOK = re.compile(r"^(visit|leave)_([A-Z]\w*)$")


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
    """What a rule hands the engine: where, why, and the edits of its fix (none: report only)."""

    location: cst.CSTNode  # where the finding is reported (and suppressed): the offending code
    code: str
    name: str
    message: str
    level: Level
    edits: tuple[Edit, ...]
    imports: tuple[AddImport, ...]

    @property
    def has_fix(self) -> bool:
        return bool(self.edits or self.imports)


class Rule:
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
    # Codes of rules whose fixes this rule must see applied: the engine runs it on
    # their output, in a later pass. Only for rules that rewrite code other rules
    # edit inside (a per-sample loop, an attention chain): most rules need none.
    AFTER: ClassVar[tuple[str, ...]] = ()

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.reports: list[Report] = []

    @classmethod
    def hooks(cls) -> tuple[dict[type, str], dict[type, str]]:
        """The node types this rule visits and leaves, with the method for each."""
        found = cls.__dict__.get("_hooks")
        if found is None:
            visits: dict[type, str] = {}
            leaves: dict[type, str] = {}
            for name in dir(cls):
                match = _HOOK.match(name)
                node_type = getattr(cst, match.group(2), None) if match else None
                if isinstance(node_type, type) and issubclass(node_type, cst.CSTNode):
                    (visits if match.group(1) == "visit" else leaves)[node_type] = name
            found = (visits, leaves)
            cls._hooks = found
        return found

    def report(
        self,
        node: cst.CSTNode,
        message: str | None = None,
        *,
        edits: Sequence[Edit] = (),
        replacement: Replacement | None = None,
        level: Level | None = None,
        imports: Sequence[tuple[str, str | None]] = (),
        at: cst.CSTNode | None = None,
    ) -> None:
        """Report `node`, fixed by `edits` when given. `replacement` is the edit
        `Replace(node, replacement)`; `imports` are (module, name) pairs the fix
        needs (name None for `import module`); `at` is where to point the user
        when that is not `node` (a fix that rewrites a loop, found at its forward pass)."""
        if self.context.loops.in_test(at if at is not None else node):
            return  # a pytest test trains to check numbers: no speed rewrite is worth changing them
        edits = list(edits)
        if replacement is not None:
            edits.append(Replace(node, replacement))
        if edits and any(module == "runtime" or module.startswith("runtime.") for module, _ in imports):
            compiled = self._compiled(node, edits)
            if compiled is not None:
                message = (
                    f"{message or self.MESSAGE}; not fixed: {compiled}, and the fix calls `runtime`, which "
                    "TorchScript cannot compile (and a trace would keep only one run of it)"
                )
                edits, imports = [], ()
        self.reports.append(
            Report(
                location=at if at is not None else node,
                code=self.CODE,
                name=self.NAME,
                message=message or self.MESSAGE,
                level=max(level, self.LEVEL) if level is not None else self.LEVEL,
                edits=tuple(edits),
                imports=tuple(AddImport(module, name) for module, name in imports) if edits or imports else (),
            )
        )

    def _compiled(self, node: cst.CSTNode, edits: Sequence[Edit]) -> str | None:
        """Why `node` or an edit's code is compiled by TorchScript (or recorded by
        torch.jit.trace), where no fix may write a call into `runtime`; None otherwise."""
        scripted = torchscript(self.context)
        return next(
            (why for anchor in (node, *(e.anchor for e in edits)) if (why := scripted.compiled(anchor)) is not None),
            None,
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

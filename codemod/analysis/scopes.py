"""libcst's ScopeProvider without its qualified-name look-up at every call.

While it builds scopes, libcst's ScopeVisitor asks for the qualified names of
every call's callee, to find `typing.cast(...)`, `TypeVar(...)` and
`NewType(...)`, whose string arguments are type annotations. That look-up
goes through every binding of the callee's first name (each `import torch` of
a long file) and took a quarter of the time to build scopes. A qualified name
of a callee ends in `cast`, `TypeVar` or `NewType` only when the dotted callee
does, or when the callee is an import's `as` alias (`from typing import cast
as c`); every other call skips the look-up, and the scopes come out the same
(tests/analysis/test_scopes.py compares them with libcst's own).
"""

from __future__ import annotations

from collections.abc import Collection

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import ScopeProvider
from libcst.metadata.scope_provider import ScopeVisitor

from codemod.analysis.index import TreeIndex

# The last part of the qualified names ScopeVisitor.visit_Call looks for.
TYPING_CALLS = frozenset({"cast", "TypeVar", "NewType"})


class _ScopeVisitor(ScopeVisitor):
    def __init__(self, provider: ScopeProvider, aliases: Collection[str]) -> None:
        super().__init__(provider)
        self._aliases = aliases

    def visit_Call(self, node: cst.Call) -> bool | None:
        callee = get_full_name_for_node(node)
        if callee is not None and (callee.rpartition(".")[2] in TYPING_CALLS or callee in self._aliases):
            return super().visit_Call(node)
        # What ScopeVisitor.visit_Call does for a call that is none of those (leave_Call pops both).
        self._ScopeVisitor__top_level_attribute_stack.append(None)
        self._ScopeVisitor__in_type_hint_stack.append(False)
        return True


def scope_provider(index: TreeIndex) -> type[ScopeProvider]:
    """A ScopeProvider for the module of `index` (which names the file's import aliases)."""
    aliases = frozenset(alias.evaluated_alias for alias in index.find(cst.ImportAlias) if alias.asname is not None)

    class FileScopeProvider(ScopeProvider):
        def get_visitors(self):
            # Its one visitor method, without the inspect.getmembers scan libcst makes of
            # every provider instance (about a tenth of the scope time of a small file).
            return {"visit_Module": self.visit_Module}

        def visit_Module(self, node: cst.Module) -> bool | None:
            visitor = _ScopeVisitor(self, aliases)
            node.visit(visitor)
            visitor.infer_accesses()
            return None

    return FileScopeProvider

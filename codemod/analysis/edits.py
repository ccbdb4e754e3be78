"""Fixes that edit several statements at once.

The engine replaces one node per fix, by identity. A fix that must touch several
statements (remove one, insert into another, add a line before a loop and one
after it) replaces a statement that contains them all with a copy carrying every
edit, so that the edits land together or not at all: two separate fixes could be
split by the engine (one deferred to the next pass for overlapping another rule's
fix, or one suppressed) and leave broken code.

The finding then sits on the containing statement. `suppressed_on` lets a rule
honour a `# perfmod: ignore[CODE]` comment on the statement the user sees as the
cause, which the engine (checking the finding's line) would not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import libcst as cst

Edit = Callable[[cst.CSTNode], "cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel"]


class EditsByIdentity(cst.CSTTransformer):
    """Apply edits keyed by `id()` of original nodes. Each edit receives the updated node,
    so edits of a node and of nodes inside it compose."""

    def __init__(self, edits: dict[int, Edit]) -> None:
        super().__init__()
        self.edits = edits

    def on_leave(self, original_node, updated_node):
        edit = self.edits.get(id(original_node))
        return edit(updated_node) if edit is not None else updated_node


def innermost_statement(nodes: Iterable[cst.CSTNode], parents) -> cst.CSTNode:
    """The innermost statement (or the module) that contains all `nodes`."""
    chains = []
    for node in nodes:
        chain = [node]
        while parents.get(chain[-1]) is not None:
            chain.append(parents[chain[-1]])
        chains.append(chain)
    shared = {id(n) for n in chains[0]}
    for chain in chains[1:]:
        shared &= {id(n) for n in chain}
    for node in chains[0]:
        if id(node) in shared and isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.Module)):
            return node
    raise ValueError("the nodes are not in one module")


from codemod.suppression import suppressed_on  # noqa: E402,F401  (rules import it from here)

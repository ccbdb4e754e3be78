"""Where a node sits in the tree: the one walk up the parents every rule needs."""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst


def is_inside(node: cst.CSTNode, ancestor: cst.CSTNode, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> bool:
    """Is `node` the node `ancestor` or somewhere below it?"""
    current: cst.CSTNode | None = node
    while current is not None:
        if current is ancestor:
            return True
        current = parents.get(current)
    return False

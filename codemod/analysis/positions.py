"""Line and column of nodes, computed one top-level statement at a time.

libcst's PositionProvider generates the code of the whole module while
recording every node's range; most files need the position of a handful of
nodes (the findings), so this computes the ranges of the top-level statement
that holds the node asked for, starting at that statement's line.
"""

from __future__ import annotations

from typing import Mapping

import libcst as cst
from libcst._position import CodePosition, CodeRange
from libcst.metadata.position_provider import PositionProvidingCodegenState


class _Collector:
    """The provider interface the codegen state records into."""

    def __init__(self) -> None:
        self._computed: dict[cst.CSTNode, CodeRange] = {}


class Positions(Mapping):
    """node -> CodeRange, like libcst's PositionProvider (syntactic positions:
    1-based lines, 0-based columns)."""

    def __init__(self, module: cst.Module, parents: Mapping[cst.CSTNode, cst.CSTNode]) -> None:
        self.module = module
        self.parents = parents
        self._ranges: dict[cst.CSTNode, CodeRange] = {}
        self._starts: dict[cst.CSTNode, int] | None = None  # top-level statement -> its first line
        self._done: set[cst.CSTNode] = set()

    def _statement_lines(self) -> dict[cst.CSTNode, int]:
        if self._starts is None:
            line = 1 + sum(self._lines(empty) for empty in self.module.header)
            starts = {}
            for statement in self.module.body:
                starts[statement] = line
                line += self.module.code_for_node(statement).count("\n")
            self._starts = starts
        return self._starts

    @staticmethod
    def _lines(empty: cst.EmptyLine) -> int:
        return 1

    def _top(self, node: cst.CSTNode) -> cst.CSTNode:
        current = node
        while True:
            parent = self.parents.get(current)
            if parent is None or parent is self.module:
                return current
            current = parent

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        found = self._ranges.get(node)
        if found is not None:
            return found
        if node is self.module:
            end = self.module.code.count("\n") + 1
            return CodeRange(CodePosition(1, 0), CodePosition(end, 0))
        top = self._top(node)
        if top in self._done or top not in self._statement_lines():
            raise KeyError(node)
        self._compute(top)
        return self._ranges[node]

    def _compute(self, statement: cst.CSTNode) -> None:
        collector = _Collector()
        state = PositionProvidingCodegenState(
            default_indent=self.module.default_indent,
            default_newline=self.module.default_newline,
            provider=collector,  # type: ignore[arg-type]
        )
        state.line = self._statement_lines()[statement]
        statement._codegen(state)
        self._ranges.update(collector._computed)
        self._done.add(statement)

    def __iter__(self):
        raise TypeError("positions are computed on demand; ask for a node")

    def __len__(self) -> int:
        raise TypeError("positions are computed on demand; ask for a node")

    def __contains__(self, node) -> bool:
        try:
            self[node]
        except KeyError:
            return False
        return True

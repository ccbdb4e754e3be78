"""Everything a rule may ask about the file it visits, computed once per parse."""

from __future__ import annotations

from functools import cached_property

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from codemod.analysis.kinds import Kinds
from codemod.analysis.loops import TrainingLoops
from codemod.analysis.names import Names
from codemod.analysis.training import Training
from codemod.analysis.tree import is_inside
from codemod.config import Settings


class FileContext:
    def __init__(self, wrapper: MetadataWrapper, path: str, settings: Settings, code: str) -> None:
        self.wrapper = wrapper
        self.module = wrapper.module
        self.code = code  # the module's source text, generated once per pass
        self.path = path
        self.settings = settings

    @cached_property
    def names(self) -> Names:
        return Names(self.wrapper)

    @cached_property
    def kinds(self) -> Kinds:
        return Kinds(self.wrapper, self.names, self.code)

    @cached_property
    def loops(self) -> TrainingLoops:
        return TrainingLoops(self.module, self.parents)

    @cached_property
    def training(self) -> Training:
        return Training(self.module, self.kinds)

    @cached_property
    def parents(self):
        return self.wrapper.resolve(ParentNodeProvider)

    @cached_property
    def positions(self):
        return self.wrapper.resolve(PositionProvider)

    def inside(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        """Is `node` the node `ancestor` or somewhere below it?"""
        return is_inside(node, ancestor, self.parents)

    def line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def source(self, node: cst.CSTNode) -> str:
        """The code of `node` as written."""
        return self.module.code_for_node(node)

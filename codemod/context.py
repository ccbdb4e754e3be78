"""Everything a rule may ask about the file it visits, computed once per parse and
only when first asked: the tree index, scopes, qualified names, positions, what
expressions hold (Kinds), bindings, the training program and the loaders."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property

import libcst as cst
from libcst.metadata import Scope

from codemod.analysis.bindings import Bindings
from codemod.analysis.command_line import CommandLine
from codemod.analysis.index import TreeIndex
from codemod.analysis.loaders import Loaders
from codemod.analysis.loops import TrainingLoops
from codemod.analysis.names import Names
from codemod.analysis.positions import Positions
from codemod.analysis.purity import Purity
from codemod.analysis.scopes import file_scopes, stored_names
from codemod.analysis.training import Training
from codemod.analysis.values import Kinds
from codemod.analysis.visits import read_only_visits
from codemod.config import Settings


class FileContext:
    def __init__(
        self,
        module: cst.Module,
        path: str,
        settings: Settings,
        code: str,
        index: TreeIndex | None = None,
        earlier: FileContext | None = None,
        statement_lines: list[int] | None = None,
        written: Mapping[cst.CSTNode, tuple[dict, str]] | None = None,
    ) -> None:
        """`earlier`: the context of the module this one rewrites (the engine's previous
        pass), whose work on the statements the two share is taken over where it holds;
        `statement_lines`: the line each statement of the module's body starts on, where
        the caller knows it (Positions.statement_lines); `written`: the ranges and code of
        the statements the caller generated at those lines (codemod.writeback)."""
        self.module = module
        self.code = code  # the module's source text
        self.path = path
        self.settings = settings
        self.index = index if index is not None else TreeIndex(module)
        self.parents = self.index.parents
        self._shared: dict = {}
        # (only what the earlier context computed; positions are all it offers so far)
        self._earlier_positions: Positions | None = earlier.__dict__.get("positions") if earlier is not None else None
        self._statement_lines = statement_lines
        self._written = written

    @classmethod
    def of_source(cls, code: str, path: str = "<string>", settings: Settings | None = None) -> FileContext:
        """A context for source text (tests, tools): parsed here."""
        module = cst.parse_module(code)
        return cls(module, path, settings or Settings(), module.code)

    @cached_property
    def scopes(self) -> Mapping[cst.CSTNode, Scope]:
        with read_only_visits():
            return file_scopes(self.index)

    @cached_property
    def positions(self) -> Positions:
        return Positions(
            self.module, self.parents, self.code, self._earlier_positions, self._statement_lines, self._written
        )

    @cached_property
    def names(self) -> Names:
        return Names(self.scopes, self._star_member)

    def _star_member(self, module: str, name: str) -> str | None:
        from codemod.analysis.project import project_of

        return project_of(self).star_member(module, name)

    @cached_property
    def kinds(self) -> Kinds:
        return Kinds(self)

    @cached_property
    def bindings(self) -> Bindings:
        return Bindings(self.scopes, self.index)

    @cached_property
    def loops(self) -> TrainingLoops:
        return TrainingLoops(self)

    @cached_property
    def training(self) -> Training:
        return Training(self)

    @cached_property
    def loaders(self) -> Loaders:
        return Loaders(self)

    def shared(self, key: str, build):
        """The analysis `build(self)` made once for this file and shared by every rule
        that asks for `key` (for analyses kept in their own modules)."""
        found = self._shared.get(key)
        if found is None:
            found = self._shared[key] = build(self)
        return found

    @cached_property
    def purity(self) -> Purity:
        return Purity(self)

    @cached_property
    def command_line(self) -> CommandLine:
        return CommandLine(self)

    @cached_property
    def _stored(self) -> set[int]:
        return stored_names(self.index)

    def bound_in(self, node: cst.CSTNode) -> set[str]:
        """The names `node` binds anywhere in it (assignment, loop, comprehension and
        `as` targets, definitions, parameters), nested blocks included."""
        return {name.value for name in self.index.find(cst.Name, within=node) if id(name) in self._stored}

    def bound_in_compound(self, name: str, before: cst.CSTNode) -> cst.BaseCompoundStatement | None:
        """The last `if`, `try` or `with` statement before `before`, in a block around it up
        to its function (or the module), that binds `name` in its body: where a value is
        built in branches (`if resume: model = load(...) else: model = Net()`) rather than
        by one statement of the block."""
        child, parent = before, self.parents.get(before)
        while parent is not None:
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                body = list(parent.body)
                for statement in reversed(body[: body.index(child)] if child in body else []):
                    if isinstance(statement, (cst.If, cst.Try, cst.With)) and name in self.bound_in(statement):
                        return statement
            if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            child, parent = parent, self.parents.get(parent)
        return None

    def inside(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        """Is `node` the node `ancestor` or somewhere below it?"""
        return self.index.inside(node, ancestor)

    def line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def source(self, node: cst.CSTNode) -> str:
        """The code of `node` as written."""
        return self.module.code_for_node(node)

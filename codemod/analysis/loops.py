"""Training-loop detection: which `for`/`while` loops run optimisation steps.

A *step loop* is the innermost loop whose body (not counting nested function
definitions) calls `.backward()`; the loops around it (epochs) are *outer
training loops*. Work placed in a step loop runs once per step; work in an outer
loop runs once per epoch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
import libcst.matchers as m

if TYPE_CHECKING:
    from codemod.analysis.index import TreeIndex
    from codemod.context import FileContext

# `loss.backward()`, `scaler.scale(loss).backward()`, `torch.autograd.backward(loss)`
BACKWARD = m.Call(func=m.Attribute(attr=m.Name("backward")))


class _OwnCode(cst.CSTVisitor):
    """Calls and loops under a node that run when it runs: nested function,
    lambda and class bodies run elsewhere, so they are skipped."""

    def __init__(self) -> None:
        self.calls: list[cst.Call] = []
        self.loops: list[cst.CSTNode] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_For(self, node: cst.For) -> None:
        self.loops.append(node)

    def visit_While(self, node: cst.While) -> None:
        self.loops.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Calls under `node` that run when it runs (not in nested def, lambda or class bodies)."""
    walker = _OwnCode()
    node.visit(walker)
    return walker.calls


def loops_in(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`for`/`while` loops under `node` that run when it runs."""
    walker = _OwnCode()
    node.visit(walker)
    return walker.loops


class TrainingLoops:
    """Step loops of one module, found once and shared by the rules."""

    def __init__(self, context: "FileContext") -> None:
        index = self._index = context.index
        self._parents = context.parents
        self._backward_loops: set[int] = set()
        self.step_loops: list[cst.CSTNode] = []
        loops = index.find((cst.For, cst.While))
        for loop in loops:
            if any(m.matches(call, BACKWARD) for call in own_nodes(index, cst.Call, loop.body)):
                self._backward_loops.add(id(loop))
        for loop in loops:
            if id(loop) in self._backward_loops and not any(
                id(inner) in self._backward_loops for inner in own_nodes(index, (cst.For, cst.While), loop.body)
            ):
                self.step_loops.append(loop)
        self._step_ids = {id(loop) for loop in self.step_loops}

    def step_loop_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The step loop whose body contains `node`, if any (stopping at function bodies)."""
        current = self._parents.get(node)
        child = node
        while current is not None:
            if isinstance(current, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if id(current) in self._step_ids and child is current.body:
                return current
            child, current = current, self._parents.get(current)
        return None

    def is_training_loop(self, loop: cst.CSTNode) -> bool:
        return id(loop) in self._backward_loops


SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


def own_nodes(index: "TreeIndex", types, node: cst.CSTNode) -> list:
    """Nodes of `types` under `node` that run when it runs: not those in nested
    function, lambda or class bodies."""
    found = index.find(types, within=node)
    nested = [n for n in index.find(SCOPES, within=node) if n is not node]
    if not nested:
        return found
    return [f for f in found if not any(f is not scope and index.inside(f, scope) for scope in nested)]

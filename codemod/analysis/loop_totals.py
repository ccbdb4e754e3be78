"""How a loop totals one value per iteration, and which of its names outlive it.

A loop that adds one value per iteration writes it in a few ways, read here once for
every rule that turns such a loop into one computation over all its iterations:

- `added(statement)`: (acc, term) of `acc += term` or `acc = acc + term`, else None;
- `appended(statement)`: (L, term) of `L.append(term)`, else None;
- `collected_list(context, loop, name)`: for a list `name` the loop appends to, whether
  it is the loop's vector of values: bound once, to an empty list made right before the
  loop (in the same block), read once after the loop, as the one argument of
  `torch.stack(L)` or `sum(L)`. A `Collected`, whose `problem` says why not;
- `read_after(context, loop, target)`: may a read outside `loop` see the value that
  `target` binds in it? (Flow-sensitive, `kinds.reached_reads`: a later binding that
  hides it on every path, `for t in ...` again, is not a read of it.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import Assignment

from codemod.analysis import match as m

if TYPE_CHECKING:
    from codemod.context import FileContext


def added(statement: cst.CSTNode) -> tuple[cst.Name, cst.BaseExpression] | None:
    """(acc, term) of `acc += term` or `acc = acc + term`."""
    if m.matches(statement, m.AugAssign(target=m.Name(), operator=m.AddAssign())):
        return statement.target, statement.value
    if (
        m.matches(
            statement,
            m.Assign(
                targets=[m.AssignTarget(target=m.Name())], value=m.BinaryOperation(left=m.Name(), operator=m.Add())
            ),
        )
        and statement.value.left.value == statement.targets[0].target.value
    ):
        return statement.targets[0].target, statement.value.right
    return None


def appended(statement: cst.CSTNode) -> tuple[cst.Name, cst.BaseExpression] | None:
    """(L, term) of `L.append(term)`."""
    if m.matches(
        statement,
        m.Expr(
            value=m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("append")), args=[m.Arg(keyword=None, star="")])
        ),
    ):
        call = statement.value
        return call.func.value, call.args[0].value
    return None


@dataclass
class Collected:
    """A list a loop appends to: the statement that makes it, the call after the loop that
    reads it (`torch.stack(L)` or `sum(L)`), or `problem`, why it is not the loop's vector."""

    name: cst.Name
    line: cst.SimpleStatementLine | None = None
    call: cst.Call | None = None
    stacked: bool = False  # `torch.stack(L)`; `sum(L)` otherwise
    problem: str | None = None


def collected_list(context: FileContext, loop: cst.For, name: cst.Name) -> Collected:
    """Is the list `name` that `loop` appends to an empty list made right before the loop
    and read once after it, by `torch.stack` or `sum`?"""
    scope = context.scopes.get(name)
    assignments = list(scope.assignments[name.value]) if scope is not None else []
    if len(assignments) != 1 or not isinstance(assignments[0], Assignment):
        return Collected(name, problem=f"`{name.value}` is bound more than once")
    created = context.bindings.statement(assignments[0].node)
    line = context.parents.get(created)
    if not (
        isinstance(created, cst.Assign)
        and m.matches(created.value, m.List(elements=[]))
        and context.parents.get(line) is context.parents.get(loop)
        and context.index.before(created, loop)
    ):
        return Collected(name, problem=f"`{name.value}` is not an empty list made right before the loop")
    uses = [access.node for access in assignments[0].references if not context.inside(access.node, loop)]
    if len(uses) != 1:
        return Collected(name, problem=f"`{name.value}` is read more than once after the loop")
    arg = context.parents.get(uses[0])
    call = context.parents.get(arg)
    other = f"`{name.value}` is used after the loop other than by `torch.stack` or `sum`"
    if not (
        isinstance(arg, cst.Arg)
        and isinstance(call, cst.Call)
        and len(call.args) == 1
        and arg.keyword is None
        and context.index.before(loop, call)
    ):
        return Collected(name, problem=other)
    if context.names.is_(call.func, "torch.stack"):
        return Collected(name, line, call, stacked=True)
    if context.names.is_(call.func, "sum", "builtins.sum"):
        return Collected(name, line, call)
    return Collected(name, problem=other)


def read_after(context: FileContext, loop: cst.CSTNode, target: cst.Name) -> bool:
    """May a read outside `loop` see the value `target` binds in it?"""
    scope = context.scopes.get(target)
    if scope is None:
        return True
    binding = [a for a in scope.assignments[target.value] if isinstance(a, Assignment) and a.node is target]
    if not binding:
        return True
    return any(not context.inside(read, loop) for read in context.kinds.reached_reads(binding[0]))

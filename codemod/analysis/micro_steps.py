"""Gradient accumulation read as micro-steps: which statements of a step loop run the
forward and backward of every micro-batch, and what tells, on an iteration, that the
optimizer does not step after them (DDP's `no_sync()` skips the all-reduce there).

- `micro_steps(context, loop)`, for a `TrainingLoop` of `context.training`: None when every
  backward steps (no step guard, no `continue` guard, no micro loop); else `MicroSteps`:
  the forward region (None, with the loop's `forward_problem`, when it is unknown), the
  statements from the forward to the backward (`first`, `last` in `statements`), and either
  the `if` whose test says it (`guard`: `if (i + 1) % k == 0:` around the step, `negated`;
  or `if (i + 1) % k != 0: continue` after the backward) or the micro loop `for t in
  range(n)` around them (`micro`: its variable and `n`, every micro-step but the last
  accumulates); neither when the code does not show which micro-steps step. `accumulating`
  is the test, written for the code, that holds on the micro-steps that do not step.

The tests are those `periodic` reads on the step loop's counter; a guard whose names are
bound again between the forward and the guard, or a count the micro loop binds, is not
taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.names import atom, code_of, integer_value, names_read, negation
from codemod.analysis.periodic import periodic

if TYPE_CHECKING:
    from codemod.context import FileContext


class MicroSteps(NamedTuple):
    forward_problem: str | None  # why the forward region is unknown (then nothing else is set)
    statements: tuple[cst.BaseStatement, ...] = ()  # the block of the forward region
    first: int = 0  # the forward's first statement
    last: int = 0  # the last statement of the forward or the backward
    guard: cst.If | None = None  # the `if` whose test tells the stepping iterations
    negated: bool = False  # its test holds when the optimizer steps (around the step)
    micro: tuple[cst.Name, cst.BaseExpression] | None = None  # `for t in range(n)`: (t, n)

    @property
    def accumulating(self) -> cst.BaseExpression | None:
        """A test that holds on the micro-steps the optimizer does not step after: the
        guard's test (negated where it guards the step), or `t < n - 1` in the micro
        loop; None when the code does not show which."""
        if self.guard is not None:
            return negation(self.guard.test) if self.negated else self.guard.test
        if self.micro is None:
            return None
        target, count = self.micro
        return cst.parse_expression(f"{target.value} < {code_of(atom(count))} - 1")


def micro_steps(context: FileContext, loop) -> MicroSteps | None:
    step_guard = _step_guard(context, loop)
    micro = loop.accumulation.micro_loop if loop.accumulation is not None else None
    region = loop.forward
    continue_guard = _continue_guard(context, loop, region) if region is not None else None
    if step_guard is None and micro is None and continue_guard is None:
        return None  # no accumulation: every backward steps
    if region is None:
        return MicroSteps(loop.forward_problem)
    statements = tuple(region.block.body)
    first, last = region.first, region.last
    backward = context.index.statement_of(loop.backwards[0].call)
    if backward in statements and statements.index(backward) > last:
        last = statements.index(backward)
    if region.block is loop.loop.body:
        for candidate, negated in ((continue_guard, False), (step_guard, True)):
            if candidate is None or candidate not in statements or statements.index(candidate) <= last:
                continue
            if _rebound_between(context, candidate.test, statements[first : statements.index(candidate)]):
                continue
            return MicroSteps(None, statements, first, last, candidate, negated)
    counted = None
    if micro is not None and context.index.inside(region.block, micro):
        counted = _micro_count(context, micro)
    return MicroSteps(None, statements, first, last, micro=counted)


def _step_guard(context: FileContext, loop) -> cst.If | None:
    """`if (i + 1) % accum == 0:` around the optimizer step."""
    for step in loop.steps:
        for node in context.index.ancestors(step.call):
            if node is loop.loop:
                break
            if isinstance(node, cst.If) and node.orelse is None and _is_modulo(context, loop, node.test):
                return node
    return None


def _continue_guard(context: FileContext, loop, region) -> cst.If | None:
    """`if (i + 1) % accum != 0: continue` after the forward, before the step."""
    if region.block is not loop.loop.body:
        return None
    for statement in list(region.block.body)[region.last + 1 :]:
        if isinstance(statement, cst.If) and statement.orelse is None and _is_modulo(context, loop, statement.test):
            body = list(statement.body.body)
            only = body[0] if len(body) == 1 else None
            small = only.body[0] if isinstance(only, cst.SimpleStatementLine) and len(only.body) == 1 else only
            if isinstance(small, cst.Continue):
                return statement
    return None


def _is_modulo(context: FileContext, loop, test: cst.BaseExpression) -> bool:
    return periodic(context).is_periodic(test, loop.loop)


def _rebound_between(context: FileContext, test: cst.BaseExpression, statements) -> bool:
    read = {n.value for n in names_read(test)}
    return any(read & facts.assigned_names(context, s) for s in statements)


def _micro_count(context: FileContext, micro: cst.CSTNode) -> tuple[cst.Name, cst.BaseExpression] | None:
    """(t, n) of `for t in range(n)` (or `range(0, n)`), `n` not bound in the loop."""
    if not (isinstance(micro, cst.For) and isinstance(micro.target, cst.Name)):
        return None
    iterable = micro.iter
    if not (isinstance(iterable, cst.Call) and context.names.is_(iterable.func, "range", "builtins.range")):
        return None
    args = [a.value for a in iterable.args]
    if len(args) == 2 and integer_value(args[0]) == 0:
        args = args[1:]
    if len(args) != 1 or _rebound_between(context, args[0], [micro.body]):
        return None
    return micro.target, args[0]

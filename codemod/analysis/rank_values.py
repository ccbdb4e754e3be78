"""What each rank of a data-parallel run computes for itself in a step loop, read on the
single-process script: the values of its own share of the batch and of the loss (PM601).

- `step_rank_local(context, loop, fetches, share)`: the `RankLocal` names of the function
  that runs `loop` (a `TrainingLoop`): those bound from the batch (the loop's target, past
  `enumerate`'s count; the statements that fetch a `while` loop's batch, `fetches`; or the
  statement that takes each rank's share, `share`), from the loss and from the model's
  calls, and what the training function returns where it is called;
- `divergence(context, loop, local)`: the first test of the loop that reads such a value
  and decides whether the loop goes on or a step runs (`while` test, an `if` around a
  `break`, `continue`, `return`, `backward()` or `step()`), as the `NotDistributable`
  reason that the ranks would fall out of step on it;
- `unshared_rows(context, loop, local)`: a join along the rows in the loop (`torch.cat([xb,
  hard])`) of a value of each rank's share of the batch with rows that are not (fixed hard
  negatives, a draw of its own), as the `NotDistributable` reason that every rank would add
  all of those: the global batch would hold them once per rank;
- `averaged_values(context, call, local, loop)`: in a `print` of the training function (or
  of its caller), under tests every rank takes alike, the loss values its message shows
  (`loss.item()`: the tensor before the host read; a number computed from the loss), each
  to be averaged over the ranks; `len(losses)` is the same on every rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.loaders import ENUMERATE, LOOKS_THROUGH
from codemod.analysis.loops import own_nodes
from codemod.analysis.names import integer_value, kwarg, method_name, names_read, positional
from codemod.analysis.step_batches import step_batches
from codemod.analysis.torch_facts import JOINING_FUNCTIONS

if TYPE_CHECKING:
    from codemod.context import FileContext


def step_rank_local(context: FileContext, loop, fetches, share: cst.CSTNode | None) -> facts.RankLocal:
    statement = loop.loop
    seeds: set[str] = set()
    for fetch in fetches:  # the batch `next(it)` binds
        seeds |= facts.assigned_names(context, fetch)
    if isinstance(statement, cst.While):
        target, iterable = cst.Tuple([]), cst.Tuple([])
    else:
        target, iterable = statement.target, statement.iter
    names = context.names
    while (
        isinstance(iterable, cst.Call)
        and names.is_(iterable.func, *ENUMERATE, *LOOKS_THROUGH)
        and positional(iterable, 0) is not None
    ):
        if names.is_(iterable.func, *ENUMERATE):
            if not (isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2):
                break
            target = target.elements[1].value  # the index is the same on every rank
        iterable = positional(iterable, 0).value
    if share is not None:
        seeds |= facts.assigned_names(context, share)
    elif not (isinstance(iterable, cst.Call) and names.is_(iterable.func, "range", "builtins.range")):
        seeds |= {n.value for n in facts.target_names(target)}
    losses = {b.loss.value for b in loop.backwards if isinstance(b.loss, cst.Name)}
    function = facts.function_of(context, statement)
    body = function.body if function is not None else context.module
    model_calls = [c for c in context.index.find(cst.Call, within=statement) if context.training.is_model_call(c)]
    local = facts.rank_local(context, body, seeds | losses, losses, model_calls, _loss_returns(context, loop))
    if function is not None:  # what the training function returns, where it is called
        for call in step_batches(context).calls_of(function):
            line = context.index.statement_of(call)
            if isinstance(line, cst.SimpleStatementLine):
                bound = facts.assigned_names(context, line)
                local.names |= bound
                local.loss_names |= bound
    return local


def _loss_returns(context: FileContext, loop) -> list[cst.Call]:
    """The calls in the loop of a function of the file that runs its backward and returns
    (what it computes from) its loss (`return loss.detach()`): what they give is the loss."""
    found = []
    for call in own_nodes(context.index, cst.Call, loop.loop.body):
        function = context.loops.runs(call)
        losses = (
            {b.loss.value for b in loop.backwards if isinstance(b.loss, cst.Name) and context.inside(b.loss, function)}
            if function is not None
            else set()
        )
        if losses and any(n.value in losses for r in context.kinds.returned(function) for n in names_read(r)):
            found.append(call)
    return found


def divergence(context: FileContext, loop, local: facts.RankLocal) -> facts.NotDistributable | None:
    """The first test of the loop that reads a value of `local` and decides whether the loop
    goes on or a step runs, with why the ranks would fall out of step on it."""
    test = _diverging_test(context, loop, local)
    if test is None:
        return None
    decides = (
        "whether the loop goes on"
        if test is getattr(loop.loop, "test", None)
        else "whether a step runs or the loop goes on"
    )
    return facts.NotDistributable(
        test,
        f"`{context.source(test).strip()}` depends on each rank's own batch and decides {decides}; "
        "ranks would fall out of step",
    )


def _diverging_test(context: FileContext, loop, local: facts.RankLocal) -> cst.BaseExpression | None:
    statement = loop.loop
    if isinstance(statement, cst.While) and local.reads(statement.test):
        return statement.test
    index = context.index
    for node in own_nodes(index, (cst.If, cst.While), statement.body):
        if not local.reads(node.test):
            continue
        exits = own_nodes(index, (cst.Break, cst.Continue, cst.Return), node)
        steps = [c for c in own_nodes(index, cst.Call, node) if method_name(c) in ("backward", "step")]
        if exits or steps:
            return node.test
    return None


def unshared_rows(context: FileContext, loop, local: facts.RankLocal) -> facts.NotDistributable | None:
    """The first join along the rows in the loop of rows of each rank's share of the batch
    with rows that are not, with why splitting the share alone would change the batches."""
    for call in own_nodes(context.index, cst.Call, loop.loop.body):
        parts = positional(call, 0) or kwarg(call, "tensors")
        if not (
            context.names.of(call.func) & JOINING_FUNCTIONS and parts and isinstance(parts.value, (cst.List, cst.Tuple))
        ):
            continue
        along = kwarg(call, "dim") or positional(call, 1)
        if along is not None and integer_value(along.value) not in (0, None):
            continue  # along the features: each row stays one row of the batch
        values = [element.value for element in parts.value.elements]
        if not any(local.reads(value) for value in values):
            continue
        other = next((value for value in values if not local.reads(value)), None)
        if other is not None:
            return facts.NotDistributable(
                other,
                f"`{context.source(call).strip()}` adds `{context.source(other).strip()}`, which is not part of each "
                "rank's share of the batch, to the rows of that share: every rank would add all of it, so the "
                "batches of all the ranks together would hold it once per rank and weigh it more in the averaged "
                "gradient; split it over the ranks by hand",
            )
    return None


def averaged_values(context: FileContext, call: cst.Call, local: facts.RankLocal, loop) -> list[cst.BaseExpression]:
    step_function = facts.function_of(context, loop.loop)
    function = facts.function_of(context, call)
    if function is not step_function and not (
        step_function is not None
        and any(facts.function_of(context, c) is function for c in step_batches(context).calls_of(step_function))
    ):
        return []
    for ancestor in context.index.ancestors(call):
        if isinstance(ancestor, facts.SCOPES):
            break
        if isinstance(ancestor, (cst.If, cst.While)) and local.reads(ancestor.test):
            return []  # a collective every rank may not reach
    parts = [
        value
        for arg in call.args
        if arg.keyword is None and not arg.star
        for value in facts.message_values(context, arg.value)
    ]
    found = []
    for part in parts:
        if not local.reads_loss(part):
            continue
        if isinstance(part, cst.Call) and context.names.is_(part.func, "builtins.len"):
            continue  # how many losses, the same on every rank
        items = [
            c
            for c in context.index.find(cst.Call, within=part)
            if method_name(c) in facts.TO_HOST_METHODS and not c.args and local.reads_loss(c.func.value)
        ]
        found.extend([item.func.value for item in items] or [part])
    return found

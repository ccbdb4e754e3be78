"""Where a single-process script can start its process group: the statement where it
chooses its device (PM601 makes that value `distributed.setup(value)`), or the statement
before which a call of its own goes, and what runs after it.

- `setup_site(context, site, loader, loop)`: the `SetupSite` of a script that trains the
  model of `site` (a `model_sites` ModelSite) in `loop`, fed by the DataLoader built in
  the statement `loader` (or None): the device assignment when everything that needs the
  process group (the model's wrap, the sampler, the training loop) runs after it; else the
  first of those statements, with the device it is given; raises NotDistributable with the
  true reason (a fixed GPU, a device chosen after the code that needs it);
- `follows(context, node, setup)`: does `node`, in the function of setup(), run after it;
  `runs_after(context, node, setup)`: also in another function whose every call runs
  after it, or a method of the object whose `__init__` holds it; `sees(context, at, setup)`:
  is a variable bound right after setup() visible at `at`;
- `entry_statement(context, function)`: the one module-level statement (or one under
  `if __name__ == "__main__":`) that calls the outermost function or class around
  `function`, the call a `try: ... finally:` can hold; None when there is not one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.distributed import NotDistributable
from codemod.analysis.model_sites import ModelSite, model_sites
from codemod.analysis.step_batches import step_batches

if TYPE_CHECKING:
    from codemod.context import FileContext


@dataclass
class SetupSite:
    """Where runtime.distributed.setup() goes."""

    statement: cst.BaseStatement  # the device assignment, or the statement the call goes before
    function: cst.FunctionDef | None
    value: cst.BaseExpression | None  # the device value wrapped in setup(...); None: a statement of its own
    device: cst.BaseExpression | None  # what a statement of its own passes
    cuda_for_zero: bool = False  # the device chosen is GPU 0 written `0`: setup() gets "cuda"
    zeros: list[cst.Integer] = field(default_factory=list)  # other `0`s of that value, "cuda" alike


def _needs(context: FileContext, site: ModelSite, loader: cst.CSTNode | None, loop: cst.CSTNode):
    """Code that needs the process group, with what it does."""
    needs = [(site.anchor, "the model is wrapped in DistributedDataParallel")]
    if loader is not None:
        needs.append((loader, "the DistributedSampler is built"))
    needs.append((context.index.outermost_loop(loop), "training starts"))
    return needs


def setup_site(context: FileContext, site: ModelSite, loader: cst.CSTNode | None, loop: cst.CSTNode) -> SetupSite:
    """Where the device is chosen: that value becomes `distributed.setup(value)`; where it is
    chosen too late (after the loader or the model), or nowhere, `distributed.setup(...)`
    goes before the first statement that needs it."""
    sites, index = model_sites(context), context.index
    needs = _needs(context, site, loader, loop)
    device = sites.chosen_device(sites.moved_to(site))
    if device is not None and isinstance(device, (cst.Name, cst.Attribute)):
        statement, value = sites.device_assignment(device)
        if statement is not None:
            zeros = sites.fixed_gpu(value, chosen=True)
            setup = SetupSite(statement, facts.function_of(context, statement), value, None)
            if all(runs_after(context, node, setup) for node, _ in needs):
                setup.cuda_for_zero = value in zeros  # `device = 0`: the value itself
                setup.zeros = [zero for zero in zeros if zero is not value]
                return setup
            sites.fixed_gpu(value)
            device = value  # chosen too late: setup() goes earlier, with the same value
    first = site.setup[0]
    if (
        loader is not None
        and facts.function_of(context, loader) is facts.function_of(context, first)
        and index.before(loader, first)
        and index.inside(first, context.parents.get(loader))
    ):
        first = loader
    if device is None:
        device = cst.SimpleString('"cpu"')
    if not step_batches(context).visible(device, first):
        raise NotDistributable(
            first,
            f"the device (`{context.source(device)}`) is chosen after the code that needs the process "
            "group; choose it before the DataLoader and the model are built",
        )
    setup = SetupSite(first, facts.function_of(context, first), None, device)
    for node, what in needs:
        if not runs_after(context, node, setup):
            raise NotDistributable(
                node,
                f"{what} at line {context.line(node)}, in code that may run before the "
                f"device is chosen (line {context.line(first)}); PM601 puts "
                "distributed.setup() where the device is chosen",
            )
    return setup


def follows(context: FileContext, node: cst.CSTNode, setup: SetupSite) -> bool:
    """Does `node`, in the function of setup(), run after it?"""
    index, start = context.index, setup.statement
    if not index.inside(node, context.parents.get(start)):
        return False
    if setup.value is None:  # setup() goes right before `start`
        return index.inside(node, start) or index.before(start, node)
    return index.before(start, node) and not index.inside(node, start)


def sees(context: FileContext, at: cst.CSTNode, setup: SetupSite) -> bool:
    """Is a variable bound right after setup() visible where `at` runs?"""
    if setup.function is None:
        return True  # a module-level variable: every function reads it
    return facts.function_of(context, at) is setup.function and follows(context, at, setup)


def runs_after(context: FileContext, node: cst.CSTNode, setup: SetupSite, path: frozenset[int] = frozenset()) -> bool:
    """Does `node` run after setup() (in its function, below it; in another function,
    one each of whose calls runs after it, or a method of the object `__init__` set up)?"""
    function = facts.function_of(context, node)
    if function is setup.function:
        return follows(context, node, setup)
    if setup.function is None:
        return True  # a function of the module, called after its top-level code ran
    if function is None or id(function) in path:
        return False  # module-level code, or a recursion
    if setup.function.name.value == "__init__" and facts.class_of(context, function) is facts.class_of(
        context, setup.function
    ):
        return True
    calls = step_batches(context).calls_of(function)
    return bool(calls) and all(runs_after(context, call, setup, path | {id(function)}) for call in calls)


def entry_statement(context: FileContext, function: cst.FunctionDef) -> cst.SimpleStatementLine | None:
    """The one module-level statement (or one under `if __name__ == "__main__":`) that
    calls the outermost function or class around `function` (itself included)."""
    index, parents = context.index, context.parents
    outer: cst.CSTNode = function
    while (enclosing := index.first_enclosing(outer, (cst.FunctionDef, cst.ClassDef))) is not None:
        outer = enclosing
    name = outer.name.value
    found = []
    for call in index.find(cst.Call):
        func = call.func
        while isinstance(func, (cst.Attribute, cst.Call)):
            func = func.value if isinstance(func, cst.Attribute) else func.func
        if not (isinstance(func, cst.Name) and func.value == name) or facts.function_of(context, call):
            continue
        statement = index.statement_of(call)
        block = parents.get(statement)
        holder = parents.get(block)
        if (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and (
                isinstance(block, cst.Module)
                or (isinstance(holder, cst.If) and "__name__" in context.source(holder.test))
            )
        ):
            if statement not in found:
                found.append(statement)
            continue
        return None
    return found[0] if len(found) == 1 else None

"""Instrument a copy of a training script with `runtime.trace`, for `perfmod verify`.

The same source rewrite is applied to the original and to the rewritten copy,
at the places the training-loop analysis (codemod.analysis.training) finds in
each, so that both runs measure the same things:

    import runtime.trace as _perfmod_trace         # after the docstring and __future__ imports
    _perfmod_trace.install()
    ...
    logits = model(_perfmod_trace.batch(inputs))   # the loop's first model call
    _perfmod_trace.loss(loss).backward()           # every backward() of a training loop
    _perfmod_trace.stepped(optimizer.step())       # the loop's first optimizer step

Each hook returns its argument, so wrapping an expression changes nothing the
script computes. The name has one leading underscore: two would be mangled
inside class bodies (`Trainer.fit` loops).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from codemod.analysis.loops import calls_in
from codemod.analysis.names import positional
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import parse

TRACE = "_perfmod_trace"
HEADER = f"import runtime.trace as {TRACE}\n{TRACE}.install()\n"


@dataclass(frozen=True)
class Instrumented:
    source: str
    losses: int  # backward() calls whose loss is recorded
    steps: int  # optimizer steps counted
    batches: int  # model calls whose input is measured

    @property
    def sites(self) -> dict[str, int]:
        return {"loss": self.losses, "stepped": self.steps, "batch": self.batches}


def instrument(source: str, path: str, settings: Settings, entry: bool = True) -> Instrumented:
    """`source` with a hook around each site of its training loops, and the trace
    header when it has hooks or is the `entry` script (whose header seeds the run
    before any of its code, imports included, runs)."""
    module = parse(source.encode())
    training = FileContext(module, path, settings, module.code).training
    hooks: dict[int, str] = {}
    for loop in training.loops:
        for backward in loop.backwards:
            hooks[id(backward.loss)] = "loss"
        if loop.steps:
            hooks[id(loop.steps[0].call)] = "stepped"
        model_input = _first_model_input(training, loop)
        if model_input is not None:
            hooks.setdefault(id(model_input), "batch")
    counts = {name: list(hooks.values()).count(name) for name in ("loss", "stepped", "batch")}
    if hooks:
        module = module.visit(_Wrap(hooks))
    if hooks or entry:
        module = _with_header(module)
    return Instrumented(module.code, counts["loss"], counts["stepped"], counts["batch"])


def _first_model_input(training, loop) -> cst.BaseExpression | None:
    """The first positional argument of the loop's first model call with arguments.
    Not taken from the forward region: a rewrite that wraps the forward in `with
    autocast` has none, and both copies must be measured alike. Calls without
    any are passed over: `with model.no_sync():` (DDP) around the forward reads
    as a model call too."""
    for call in calls_in(loop.loop.body):
        if call.args and training.is_model_call(call):
            first = positional(call, 0)
            return first.value if first is not None else None
    return None


class _Wrap(cst.CSTTransformer):
    """`expr` -> `_perfmod_trace.<hook>(expr)` for the nodes picked, by identity."""

    def __init__(self, hooks: dict[int, str]) -> None:
        super().__init__()
        self.hooks = hooks

    def on_leave(self, original_node, updated_node):
        hook = self.hooks.get(id(original_node))
        if hook is None:
            return updated_node
        return cst.Call(func=cst.Attribute(cst.Name(TRACE), cst.Name(hook)), args=[cst.Arg(updated_node)])


def _with_header(module: cst.Module) -> cst.Module:
    """The header after the module docstring and `from __future__` imports, which must come first."""
    body = list(module.body)
    index = 0
    if body and _is_docstring(body[0]):
        index = 1
    while index < len(body) and _is_future_import(body[index]):
        index += 1
    header = list(cst.parse_module(HEADER).body)
    return module.with_changes(body=body[:index] + header + body[index:])


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _is_future_import(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(s, cst.ImportFrom) and isinstance(s.module, cst.Name) and s.module.value == "__future__"
        for s in statement.body
    )

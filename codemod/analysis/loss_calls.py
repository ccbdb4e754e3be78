"""Which torch loss a call computes (a loss function, or a loss module built once:
`criterion = nn.CrossEntropyLoss(ignore_index=0)`), and the options it runs with, for
rules that rewrite a loop of loss calls into one call over all their inputs.

`loss_calls(context)` (built once per file, FileContext.shared) answers:

- `kind(call)`: "cross_entropy" or "nll_loss" for a call of either (the function, or a
  module built once), else None;
- `options(call)`: a `LossOptions` for such a call: its reduction, its keyword arguments
  as text (a module's non-literal ones read back from it, `criterion.ignore_index`), the
  module called, and `problem`, the true reason its options cannot be followed (passed by
  position or unpacked, an unknown keyword, a reduction that is not a literal, per-sample
  losses, class weights with the mean);
- `constructor(func)`: the `nn.CrossEntropyLoss(...)` / `nn.NLLLoss(...)` call a name or
  `self.attr` was built by;
- `any_loss(call)`: (qualified function, its torch facts, the module's constructor or
  None) for any per-element torch loss, called or built once;
- `reduction(call)`: the reduction a call of any torch loss, or the construction of a
  loss module, sets: `reduction=`, or the legacy `size_average=` / `reduce=` read as
  torch reads them (the torch table's `legacy_reduction`);
- `arguments(call)`: a `LossArguments` for such a call: its input and target, its
  reduction (the call's or its module's, legacy keywords read, checked against the loss's own: `"batchmean"`
  only where torch takes it), the keywords that change each element's loss (`options`
  of the torch table: `ignore_index`, `label_smoothing`, `weight`, `log_target`, ...),
  and `problem`, the first reason they cannot be followed.

Which names are losses and their defaults are torch facts (torch_facts, torch_ops).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis.torch_facts import (
    CROSS_ENTROPY,
    CROSS_ENTROPY_MODULES,
    FUNCTIONAL,
    LOSS_KEYWORDS,
    NLL_LOSS,
    NLL_LOSS_MODULES,
    is_literal,
    loss_of,
)
from codemod.analysis.torch_ops import LEGACY_REDUCTION_KEYWORDS, Loss, legacy_reduction

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "loss_calls"


def loss_calls(context: FileContext) -> LossCalls:
    return context.shared(KEY, LossCalls)


@dataclass
class LossOptions:
    """What a cross-entropy or NLL call (or its module's constructor) says about its reduction."""

    function: str  # "cross_entropy" or "nll_loss"
    reduction: str = "mean"
    keywords: dict[str, str] = field(default_factory=dict)  # keyword -> source text, in the call's order
    keyword_nodes: dict[str, cst.BaseExpression] = field(default_factory=dict)
    module: cst.BaseExpression | None = None
    problem: str | None = None

    @property
    def ignore_index(self) -> str:
        """The target value it ignores, as text: its `ignore_index=`, or torch's default."""
        found = loss_of({f"{FUNCTIONAL}.{self.function}"})
        return self.keywords.get("ignore_index") or str(found[1].ignore_index if found else None)


REDUCTIONS = ("mean", "sum", "none", "batchmean")
FLAGS = {"True": True, "False": False, "None": None}  # the literals the legacy keywords take


def written_reduction(arguments: Sequence[cst.Arg], default: str) -> str | None:
    """The reduction a torch loss called (or a loss module built) with `arguments` runs
    with: what torch makes of the legacy `size_average=` / `reduce=` where either is given
    (they override `reduction=`), else `reduction=`, else `default`, the loss's own; None
    where the one that decides is not a literal."""
    legacy = {
        arg.keyword.value: arg.value
        for arg in arguments
        if arg.keyword is not None and arg.keyword.value in LEGACY_REDUCTION_KEYWORDS
    }
    if legacy:
        if not all(isinstance(value, cst.Name) and value.value in FLAGS for value in legacy.values()):
            return None
        flags = {keyword: FLAGS[value.value] for keyword, value in legacy.items()}
        return legacy_reduction(flags.get("size_average"), flags.get("reduce"))
    for arg in arguments:
        if arg.keyword is not None and arg.keyword.value == "reduction":
            return arg.value.evaluated_value if isinstance(arg.value, cst.SimpleString) else None
    return default


@dataclass
class LossArguments:
    """What a call of a per-element torch loss (or of its module) computes, as written."""

    function: str  # qualified functional name
    facts: Loss
    constructor: cst.Call | None  # the module's, for a loss module
    reduction: str = "mean"
    keywords: dict[str, cst.BaseExpression] = field(default_factory=dict)  # element options, in order
    input: cst.BaseExpression | None = None
    target: cst.BaseExpression | None = None
    problem: str | None = None


class LossCalls:
    """The loss calls of one file."""

    def __init__(self, context: FileContext) -> None:
        self.context = context

    def any_loss(self, call: cst.Call) -> tuple[str, Loss, cst.Call | None] | None:
        """(qualified function, its facts, the module's constructor or None) for a call of a
        torch loss function or of a loss module built once (`criterion = nn.MSELoss()`)."""
        functional = {n for n in self.context.names.of(call.func) if n.startswith(f"{FUNCTIONAL}.")}
        found = loss_of(functional)
        if found is not None:
            return (*found, None) if found[1].per_element else None
        if isinstance(call.func, cst.Name):
            values = self.context.bindings.values(call.func)
        elif isinstance(call.func, cst.Attribute):
            values = self.context.kinds.attribute_values(call.func)
        else:
            return None
        if not values or len(values) != 1 or not isinstance(values[0], cst.Call):
            return None
        found = loss_of(self.context.names.of(values[0].func))
        if found is None or not found[1].per_element:
            return None
        return (*found, values[0])

    def reduction(self, call: cst.Call) -> str | None:
        """The reduction a call of a torch loss function, or the construction of a loss
        module (`nn.BCELoss(size_average=False)`), sets (`written_reduction`); None for
        other calls, and where it cannot be read."""
        found = loss_of(self.context.names.of(call.func))
        if found is None or any(arg.star for arg in call.args):
            return None
        return written_reduction(call.args, found[1].reduction)

    def arguments(self, call: cst.Call) -> LossArguments | None:
        """The input, target, reduction and element options of a call of a per-element loss
        (`any_loss`), and the first reason they cannot be followed; None for other calls."""
        found = self.any_loss(call)
        if found is None:
            return None
        function, facts, constructor = found
        loss = LossArguments(function, facts, constructor, facts.reduction)
        arguments = constructor.args if constructor is not None else call.args
        plain = [a for a in call.args if a.keyword is None and not a.star]
        named = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        if constructor is not None and named:
            loss.problem = "the loss module is called with keyword arguments"
        elif any(a.star for a in [*call.args, *arguments]) or len(plain) > 2:
            loss.problem = "arguments passed by position or unpacked are not followed"
        elif constructor is not None and any(a.keyword is None for a in constructor.args):
            loss.problem = "arguments passed by position or unpacked are not followed"
        if loss.problem is not None:
            return loss
        for arg in arguments:
            if arg.keyword is None or arg.keyword.value in ("input", "target"):
                continue
            key = arg.keyword.value
            if key == "reduction" or key in LEGACY_REDUCTION_KEYWORDS:
                reduction = written_reduction(arguments, facts.reduction)
                if reduction is None:
                    loss.problem = "its reduction is not a literal"
                    return loss
                loss.reduction = reduction
                if loss.reduction == "batchmean" and not facts.batchmean or loss.reduction not in REDUCTIONS:
                    loss.problem = f'reduction="{loss.reduction}" is not one of the loss\'s'
                    return loss
            elif key in facts.options:
                loss.keywords[key] = arg.value
            else:
                loss.problem = f"`{key}=` is not understood by the fix"
                return loss
        loss.input = plain[0].value if plain else named.get("input")
        loss.target = plain[1].value if len(plain) > 1 else named.get("target")
        if loss.input is None or loss.target is None:
            loss.problem = "the loss's input and target are not both given"
        return loss

    def kind(self, call: cst.Call) -> str | None:
        names = self.context.names.of(call.func)
        if CROSS_ENTROPY in names:
            return "cross_entropy"
        if NLL_LOSS in names:
            return "nll_loss"
        constructor = self.constructor(call.func)
        if constructor is None:
            return None
        return "cross_entropy" if self.context.names.of(constructor.func) & CROSS_ENTROPY_MODULES else "nll_loss"

    def options(self, call: cst.BaseExpression) -> LossOptions | None:
        if not isinstance(call, cst.Call):
            return None
        kind = self.kind(call)
        if kind is None:
            return None
        if self.context.names.of(call.func) & {CROSS_ENTROPY, NLL_LOSS}:
            return _loss_arguments(self.context.module, call, kind, first_keyword_position=2)
        constructor = self.constructor(call.func)
        loss = _loss_arguments(self.context.module, constructor, kind, first_keyword_position=0)
        for keyword, value in loss.keyword_nodes.items():
            if not is_literal(value):  # read back from the module: `criterion.ignore_index`
                loss.keywords[keyword] = f"{self.context.module.code_for_node(call.func)}.{keyword}"
        if loss.problem is None and any(arg.keyword is not None for arg in call.args):
            loss.problem = "the loss module is called with keyword arguments"
        loss.module = call.func
        return loss

    def constructor(self, func: cst.BaseExpression) -> cst.Call | None:
        """The `nn.CrossEntropyLoss(...)` / `nn.NLLLoss(...)` call that `func` (a name or
        `self.attr`) was built by."""
        if isinstance(func, cst.Name):
            values = self.context.bindings.values(func)
        elif isinstance(func, cst.Attribute):
            values = self.context.kinds.attribute_values(func)
        else:
            return None
        if not values or len(values) != 1 or not isinstance(values[0], cst.Call):
            return None
        constructor = values[0]
        names = self.context.names.of(constructor.func)
        return constructor if names & (CROSS_ENTROPY_MODULES | NLL_LOSS_MODULES) else None


def _loss_arguments(module: cst.Module, call: cst.Call, function: str, first_keyword_position: int) -> LossOptions:
    loss = LossOptions(function)
    positional = [arg for arg in call.args if arg.keyword is None]
    if len(positional) > first_keyword_position or any(arg.star for arg in call.args):
        loss.problem = "arguments passed by position or unpacked (weight, ignore_index ...) are not followed"
        return loss
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value in ("input", "target"):
            continue
        name = arg.keyword.value
        if name not in LOSS_KEYWORDS:
            loss.problem = f"`{name}=` is not understood by the fix"
            return loss
        loss.keywords[name] = module.code_for_node(arg.value)
        loss.keyword_nodes[name] = arg.value
    reduction = loss.keyword_nodes.get("reduction")
    if reduction is not None:
        if not isinstance(reduction, cst.SimpleString) or reduction.evaluated_value not in ("mean", "sum", "none"):
            loss.problem = "its reduction is not a literal"
            return loss
        loss.reduction = reduction.evaluated_value
    if loss.reduction == "none":
        loss.problem = 'reduction="none" gives per-sample losses that the loop combines in its own way'
    elif loss.reduction == "mean" and "weight" in loss.keywords:
        loss.problem = "with class weights each position's mean divides by its own sum of weights"
    return loss

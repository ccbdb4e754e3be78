"""Lightning's Trainer as a training program: the `Trainer(...)` constructions of a file,
the accelerator and precision each is given, and the LightningModule classes of the file
that its `fit(...)` trains.

    trainers = lightning_trainers(context)
    for build in trainers.builds:
        build.accelerator   # the `accelerator=` value, None when left at "auto"
        build.modules       # the classes `trainer.fit(Net(), ...)` trains; None: cannot be told
        where = trainers.accelerator(build)  # an Accelerator: where it trains
        where.place     # "gpu", "option", "other", "auto" or "unknown"
        where.on_cuda   # trains on a CUDA GPU as the script is written
        where.follows   # a precision may be chosen from the expression again
        where.why       # "auto", "unknown": why it is not known to be a CUDA GPU
"""

from __future__ import annotations

from typing import NamedTuple

import libcst as cst

from codemod.analysis.names import kwarg, positional, sole_definition
from codemod.analysis.policy_sites import policy_sites
from codemod.analysis.torch_facts import (
    LIGHTNING_DEFAULT_ACCELERATOR,
    LIGHTNING_GPU_ACCELERATORS,
    LIGHTNING_PRECISION_KEYWORD,
    LIGHTNING_TRAINERS,
    TRAINER_PLACED_MODULES,
)

KEY = "lightning"


class TrainerBuild(NamedTuple):
    call: cst.Call  # `L.Trainer(...)`
    accelerator: cst.BaseExpression | None  # its `accelerator=`; None: the default, "auto"
    precision: cst.BaseExpression | None  # its `precision=`; None: the default, full precision
    plugins: cst.BaseExpression | None  # its `plugins=`, which may hold a precision plugin
    star: cst.Arg | None  # a `**kwargs` (or `*args`) that may set any of them
    # The LightningModule classes of this file that its `fit(...)` calls train; empty when
    # nothing of this file calls its `fit`; None when one of them cannot be told.
    modules: tuple[cst.ClassDef, ...] | None


class Accelerator(NamedTuple):
    """Where a Trainer trains, told from its `accelerator=`: one answer for every rule."""

    # "gpu": every value it may hold is a CUDA GPU; "option": a CUDA GPU as the script is
    # written (an option's default), which the command line may change; "other": the CPU,
    # a TPU, MPS...; "auto": it may be "auto", the default, which picks the CPU where no GPU
    # is present; "unknown": it cannot be told.
    place: str
    # "option": the expression may be evaluated again to choose a precision from it
    # (names, attributes, strings, conditionals of those).
    follows: bool = False
    why: str | None = None  # "auto", "unknown": why it is not known to be a CUDA GPU

    @property
    def on_cuda(self) -> bool:
        """Trains on a CUDA GPU as the script is written."""
        return self.place in ("gpu", "option")


def lightning_trainers(context) -> LightningTrainers:
    return context.shared(KEY, LightningTrainers)


class LightningTrainers:
    def __init__(self, context) -> None:
        self.context = context
        self.builds: tuple[TrainerBuild, ...] = ()
        self._sources: dict[cst.Name, list[cst.BaseExpression | None]] = {}
        if "Trainer" not in context.code:
            return
        names = context.names
        calls = list(context.index.find(cst.Call))
        trainers = [c for c in calls if names.is_(c.func, *LIGHTNING_TRAINERS)]
        if not trainers:
            return
        fits = [c for c in calls if isinstance(c.func, cst.Attribute) and c.func.attr.value == "fit"]
        self.builds = tuple(self._describe(trainer, fits) for trainer in trainers)

    def accelerator(self, build: TrainerBuild) -> Accelerator:
        """Where `build` trains, told from its `accelerator=` as `training.strings` follows
        it: every value it may hold (an option's choices), and the value as the script is
        written (an option's default)."""
        training = self.context.training
        gpu = frozenset(LIGHTNING_GPU_ACCELERATORS)
        expr = build.accelerator
        if expr is None:
            if build.star is not None:
                return Accelerator("unknown", why=f"`{training.code(build.star)}` may set the accelerator")
            proven = written = frozenset({LIGHTNING_DEFAULT_ACCELERATOR})
        else:
            proven, written = training.strings(expr), training.strings(expr, written=True)
        if proven is not None and proven <= gpu:
            return Accelerator("gpu")
        if written is not None and written <= gpu:
            return Accelerator("option", follows=self._repeatable(expr))
        if written is not None and not written & (gpu | {LIGHTNING_DEFAULT_ACCELERATOR}):
            return Accelerator("other")
        if written is None or LIGHTNING_DEFAULT_ACCELERATOR not in written:
            return Accelerator("unknown", why=f"the accelerator `{training.code(expr)}` cannot be told")
        if expr is None:
            shown = 'the accelerator is "auto", the default,'
        elif isinstance(expr, cst.SimpleString):
            shown = 'the accelerator is "auto",'
        else:
            shown = f'the accelerator `{training.code(expr)}` is "auto" as the script is written,'
        return Accelerator(
            "auto",
            why=f"{shown} which picks the CPU where no GPU is present (and MPS on a Mac), where bf16 autocast "
            "is rarely faster; whatever `devices=` says, it is not known to be a CUDA GPU",
        )

    def _repeatable(self, expr: cst.BaseExpression) -> bool:
        """May `expr` be evaluated once more, to the same value: a plain expression (names,
        attributes, strings), or a conditional, comparison or `not` of such."""
        if isinstance(expr, cst.IfExp):
            return all(self._repeatable(part) for part in (expr.test, expr.body, expr.orelse))
        if isinstance(expr, cst.Comparison):
            return self._repeatable(expr.left) and all(self._repeatable(c.comparator) for c in expr.comparisons)
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
            return self._repeatable(expr.expression)
        return policy_sites(self.context).plain(expr)

    def _describe(self, trainer: cst.Call, fits: list[cst.Call]) -> TrainerBuild:
        accelerator = kwarg(trainer, "accelerator")
        precision = kwarg(trainer, LIGHTNING_PRECISION_KEYWORD)
        plugins = kwarg(trainer, "plugins")
        star = next((arg for arg in trainer.args if arg.star), None)
        modules: list[cst.ClassDef] = []
        for fit in fits:
            if not self._fits_with(fit, trainer):
                continue
            argument = kwarg(fit, "model") or positional(fit, 0)
            classes = self._classes(argument.value) if argument is not None else None
            if classes is None:
                return TrainerBuild(trainer, _value(accelerator), _value(precision), _value(plugins), star, None)
            modules += [cls for cls in classes if cls not in modules]
        return TrainerBuild(trainer, _value(accelerator), _value(precision), _value(plugins), star, tuple(modules))

    def _fits_with(self, fit: cst.Call, trainer: cst.Call) -> bool:
        """Is `fit` the `fit` method of what `trainer` builds (`trainer.fit(...)` with
        `trainer = L.Trainer(...)`, or `L.Trainer(...).fit(...)`)?"""
        receiver = fit.func.value
        if receiver is trainer:
            return True
        if isinstance(receiver, cst.Name):
            sources = self._sources.get(receiver)
            if sources is None:  # asked for every trainer of the file: followed once
                sources = self._sources[receiver] = self.context.kinds.value_sources(receiver)
            return any(source is trainer for source in sources)
        return False

    def _classes(self, expr: cst.BaseExpression) -> list[cst.ClassDef] | None:
        """The LightningModule classes of this file that `expr` (`Net()`, or a name bound
        to one) is an instance of; None when one of its values is something else."""
        values = self.context.kinds.value_sources(expr) if isinstance(expr, cst.Name) else [expr]
        found: list[cst.ClassDef] = []
        for value in values:
            if not isinstance(value, cst.Call):
                return None
            cls = sole_definition(self.context.scopes, value.func, cst.ClassDef)
            if cls is None or not self._is_lightning_module(cls):
                return None
            found.append(cls)
        return found or None

    def _is_lightning_module(self, cls: cst.ClassDef, depth: int = 0) -> bool:
        """Does `cls` extend Lightning's LightningModule, directly or through classes of this file?"""
        for base in cls.bases:
            if self.context.names.of(base.value) & TRAINER_PLACED_MODULES:
                return True
            parent = sole_definition(self.context.scopes, base.value, cst.ClassDef)
            if parent is not None and depth < 4 and self._is_lightning_module(parent, depth + 1):
                return True
        return False


def _value(arg: cst.Arg | None) -> cst.BaseExpression | None:
    return arg.value if arg is not None else None

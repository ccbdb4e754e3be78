"""Lightning's Trainer as a training program: the `Trainer(...)` constructions of a file,
the accelerator and precision each is given, and the LightningModule classes of the file
that its `fit(...)` trains.

    trainers = lightning_trainers(context)
    for build in trainers.builds:
        build.accelerator   # the `accelerator=` value, None when left at "auto"
        build.modules       # the classes `trainer.fit(Net(), ...)` trains; None: cannot be told
        trainers.accelerator_place(build)  # "gpu", "option", "other", "auto" or "unknown"
        trainers.on_cuda(build)  # trains on a CUDA GPU as the script is written
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class TrainerBuild:
    call: cst.Call  # `L.Trainer(...)`
    accelerator: cst.BaseExpression | None  # its `accelerator=`; None: the default, "auto"
    precision: cst.BaseExpression | None  # its `precision=`; None: the default, full precision
    plugins: cst.BaseExpression | None  # its `plugins=`, which may hold a precision plugin
    star: cst.Arg | None  # a `**kwargs` (or `*args`) that may set any of them
    # The LightningModule classes of this file that its `fit(...)` calls train; empty when
    # nothing of this file calls its `fit`; None when one of them cannot be told.
    modules: tuple[cst.ClassDef, ...] | None


def lightning_trainers(context) -> LightningTrainers:
    return context.shared(KEY, LightningTrainers)


class LightningTrainers:
    def __init__(self, context) -> None:
        self.context = context
        self.builds: tuple[TrainerBuild, ...] = ()
        if "Trainer" not in context.code:
            return
        names = context.names
        calls = list(context.index.find(cst.Call))
        trainers = [c for c in calls if names.is_(c.func, *LIGHTNING_TRAINERS)]
        if not trainers:
            return
        fits = [c for c in calls if isinstance(c.func, cst.Attribute) and c.func.attr.value == "fit"]
        self.builds = tuple(self._describe(trainer, fits) for trainer in trainers)

    def accelerator_place(self, build: TrainerBuild) -> str:
        """Where the Trainer trains, told from its `accelerator=`: "gpu" (every value it
        may hold is a CUDA GPU), "option" (a plain option whose value as the script is
        written is a CUDA GPU, which the command line may change), "other" (the CPU, a TPU,
        MPS...), "auto" (it may be "auto", the default, which picks the CPU where no GPU is
        present) or "unknown"."""
        training = self.context.training
        gpu = frozenset(LIGHTNING_GPU_ACCELERATORS)
        accelerator = build.accelerator
        if accelerator is None:
            proven = written = frozenset({LIGHTNING_DEFAULT_ACCELERATOR})
        else:
            proven = training.strings(accelerator)
            written = training.strings(accelerator, written=True)
        if proven is not None and proven <= gpu:
            return "gpu"
        if written is None:
            return "unknown"
        if written <= gpu and policy_sites(self.context).plain(accelerator):
            return "option"
        if not written & (gpu | {LIGHTNING_DEFAULT_ACCELERATOR}):
            return "other"
        return "auto" if LIGHTNING_DEFAULT_ACCELERATOR in written else "unknown"

    def on_cuda(self, build: TrainerBuild) -> bool:
        """Does `build` train on a CUDA GPU as the script is written: `accelerator="gpu"`
        (or `"cuda"`), or an option or name whose value as written is one? False for
        "auto" (the default, which picks the CPU where no GPU is present), for a
        `**kwargs` that may set it, and where the accelerator cannot be told."""
        if build.star is not None or build.accelerator is None:
            return False
        written = self.context.training.strings(build.accelerator, written=True)
        return written is not None and written <= frozenset(LIGHTNING_GPU_ACCELERATORS)

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
            return any(source is trainer for source in self.context.training.value_sources(receiver))
        return False

    def _classes(self, expr: cst.BaseExpression) -> list[cst.ClassDef] | None:
        """The LightningModule classes of this file that `expr` (`Net()`, or a name bound
        to one) is an instance of; None when one of its values is something else."""
        values = self.context.training.value_sources(expr) if isinstance(expr, cst.Name) else [expr]
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

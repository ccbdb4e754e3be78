"""Whether a model treats every sample of a batch on its own.

A loop that runs a model on one sample at a time may run it once on the whole batch
only when no layer mixes the samples (BatchNorm in training mode normalises each
sample with the batch's statistics), and, for a sample given without its batch
dimension, when every layer and the `forward` count the dims they read from the end.
The analysis reads what it can see: the model's one construction in this file (or the
construction every caller passes for a parameter `model`, in this file and in the
modules beside it that import it), its `torch.nn` layers, the classes of this file it
is built from and their methods.

- `problem(model, unbatched=False)`: why the model `model` (a callee expression,
  `model`, `self.net`) may mix the samples of a batch, or give a sample without its
  batch dimension other values than its row of a batch (`unbatched`); None when
  every layer it is built from acts on each sample alone.
- `builds_module(func)`: whether every value `self.<name>` is bound to, through the
  parameters its callers pass, is a torch layer or a class of this file.

Built once per file (FileContext.shared).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.bindings import argument_for
from codemod.analysis.local_calls import local_calls
from codemod.analysis.project import project_of
from codemod.analysis.tensor_layout import front_dim_read
from codemod.analysis.torch_facts import (
    BATCH_MIXING_LAYERS,
    FUNCTIONAL_PARAMETERS,
    LAYER_LIBRARIES,
    LEADING_DIM_LAYERS,
    module_of_chain,
)

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "sample_mixing"
MAX_DEPTH = 6


def sample_mixing(context: FileContext) -> SampleMixing:
    return context.shared(KEY, SampleMixing)


class SampleMixing:
    """What the models of one file do with the samples of a batch (see the module's docstring)."""

    def __init__(self, context: FileContext) -> None:
        self.context = context

    def builds_module(self, func: cst.Attribute) -> bool:
        """Is every value `func` (`self.model`) is bound to, through parameters, a torch layer or
        a class of this file?"""
        values = self._model_values(func, 0) or []
        return bool(values) and all(
            isinstance(v, cst.Call)
            and (
                self.context.kinds.local_class(v.func) is not None
                or any(n.startswith("torch.nn.") for n in self.context.names.of(v.func))
            )
            for v in values
        )

    def problem(self, model: cst.BaseExpression, unbatched: bool = False) -> str | None:
        """Why the model may mix the samples of a batch, or None when every layer is per-sample;
        `unbatched`: also why a sample without its batch dimension may give other values
        than its row of a batch."""
        code = self.context.module.code_for_node(model)
        values = self._model_values(model, 0)
        if not values:
            return f"the model `{code}` is not built once in this file, so the rule cannot see whether it mixes samples"
        for value in values:
            problem = self._construction_problem(value, code, 0, unbatched)
            if problem is not None:
                return problem
        return None

    def _model_values(self, expr: cst.BaseExpression, depth: int) -> list[cst.BaseExpression] | None:
        """What builds the model `expr`: its one assignment, followed through a parameter
        (`self.model = model` in `__init__`, `def train_epoch(model, loader)`) to what every
        call of the function passes."""
        values = self.context.kinds.bound_values(expr)
        if not values and isinstance(expr, cst.Name) and self.context.bindings.param_of(expr) is not None:
            function, param = self.context.bindings.param_of(expr)
            local = self._passed_values(self.context.kinds.value_sources(expr), depth)
            if local is None and not local_calls(self.context).call_sites(function):
                local = []  # called only from the modules beside this file, if at all
            imported = self._imported_values(function, param)
            if local is None or imported is None or not local + imported:
                return None
            return local + imported
        if not values or len(values) != 1:
            return None
        value = values[0]
        if isinstance(value, cst.Name) and depth < MAX_DEPTH:
            found = self.context.bindings.param_of(value)
            if found is not None:
                function, param = found
                sites = local_calls(self.context).call_sites(function)
                method = isinstance(self.context.parents.get(self.context.parents.get(function)), cst.ClassDef)
                passed = [_passed(site, function, param, method) for site in sites]
                if not sites or any(p is None for p in passed):
                    return None
                result = []
                for argument in passed:
                    inner = (
                        self._model_values(argument, depth + 1)
                        if isinstance(argument, (cst.Name, cst.Attribute))
                        else [argument]
                    )
                    if not inner:
                        return None
                    result += inner
                return result
            return self._model_values(value, depth + 1)
        return [value]

    def _passed_values(self, sources: list[cst.BaseExpression | None], depth: int) -> list[cst.BaseExpression] | None:
        """What builds each model a parameter receives (None entries: a call the analysis
        cannot read, or one from elsewhere)."""
        if not sources or any(source is None for source in sources) or depth >= MAX_DEPTH:
            return None
        result = []
        for source in sources:
            inner = self._model_values(source, depth + 1) if isinstance(source, (cst.Name, cst.Attribute)) else [source]
            if not inner:
                return None
            result += inner
        return result

    def _imported_values(self, function: cst.FunctionDef, param: cst.Param) -> list[cst.ClassDef] | None:
        """For a parameter of a function of this file that the modules beside it call
        (`from train import Net, train_epoch; train_epoch(Net(), loader)`): the classes of
        this file each of their calls' argument is built from (none when no module beside it
        calls it); None when one is built otherwise."""
        project = project_of(self.context)
        if not project.called_from_importers(function):
            return []
        passed = project.importer_arguments(function, param)
        if not passed:
            return None
        stem = Path(self.context.path).stem if self.context.path else None
        found = []
        for other, value in passed:
            if isinstance(value, cst.Name):
                values = other.bindings.values(value)
                value = values[0] if values and len(values) == 1 else None
            value = module_of_chain(value)
            if not isinstance(value, cst.Call):
                return None
            classdef = next(
                (
                    statement
                    for name in sorted(other.names.of(value.func))
                    if name.rpartition(".")[0].rpartition(".")[2] == stem
                    for statement in self.context.module.body
                    if isinstance(statement, cst.ClassDef) and statement.name.value == name.rpartition(".")[2]
                ),
                None,
            )
            if classdef is None:
                return None
            found.append(classdef)
        return found

    def _construction_problem(
        self, expr: cst.BaseExpression, code: str, depth: int, unbatched: bool = False
    ) -> str | None:
        if isinstance(expr, cst.ClassDef):  # a class of this file, built by a module that imports it
            return self._class_problem(expr, code, depth + 1, unbatched)
        expr = module_of_chain(expr)
        if not isinstance(expr, cst.Call) or depth > MAX_DEPTH:
            return f"the model `{code}` is not built by a class call the rule can follow"
        names = self.context.names.of(expr.func)
        if names & BATCH_MIXING_LAYERS:
            return f"the model `{code}` has BatchNorm, which mixes the samples of a batch in training mode"
        if any(n.startswith("torch.nn.") for n in names):
            if unbatched and not names & LEADING_DIM_LAYERS:
                return _unbatched_layer(code, self.context.module.code_for_node(expr.func))
            for arg in expr.args:  # nn.Sequential(nn.Linear(...), nn.BatchNorm1d(...))
                if isinstance(arg.value, cst.Call):
                    problem = self._construction_problem(arg.value, code, depth + 1, unbatched)
                    if problem is not None:
                        return problem
            return None
        classdef = self.context.kinds.local_class(expr.func)
        if classdef is None:
            return f"the model `{code}` is of a class not defined in this file, so the rule cannot see whether it mixes samples"
        return self._class_problem(classdef, code, depth + 1, unbatched)

    def _class_problem(self, classdef: cst.ClassDef, code: str, depth: int, unbatched: bool = False) -> str | None:
        for base in classdef.bases:
            local = self.context.kinds.local_class(base.value)
            if local is not None:
                problem = self._class_problem(local, code, depth + 1, unbatched)
                if problem is not None:
                    return problem
        for call in self.context.index.find(cst.Call, within=classdef):
            names = self.context.names.of(call.func)
            if (
                unbatched
                and any(n.startswith("torch.nn.") and n.rsplit(".", 1)[1][:1].isupper() for n in names)
                and not names & LEADING_DIM_LAYERS
            ):
                return _unbatched_layer(code, self.context.module.code_for_node(call.func))
            if names & BATCH_MIXING_LAYERS:
                return f"the model `{code}` has BatchNorm, which mixes the samples of a batch in training mode"
            if self.context.names.startswith(call.func, FUNCTIONAL_PARAMETERS):
                return f"the model `{code}` calls `{self.context.module.code_for_node(call.func)}`"
            local = self.context.kinds.local_class(call.func)
            if local is not None and local is not classdef:
                problem = self._class_problem(local, code, depth + 1, unbatched)
                if problem is not None:
                    return problem
            elif self._is_attribute_value(call) and not (names and all(n.startswith(LAYER_LIBRARIES) for n in names)):
                name = self.context.module.code_for_node(call.func)
                return f"the model `{code}` has a submodule built by `{name}`, which the rule cannot see into"
        if unbatched:
            for method in classdef.body.body:
                if isinstance(method, cst.FunctionDef) and method.name.value != "__init__":
                    read = front_dim_read(self.context, method)
                    if read is not None:
                        text = self.context.module.code_for_node(read)
                        where = f"`{classdef.name.value}.{method.name.value}`"
                        what = (
                            f"calls `{text}`, which the rule does not read"
                            if isinstance(read, cst.Call) and self.context.bindings.local_function(read.func)
                            else f"reads `{text}`, which counts a dim from the front: with a batch dimension "
                            "it may read another one"
                        )
                        return f"the model `{code}` runs on a sample without its batch dimension, and {where} {what}"
        return None

    def _is_attribute_value(self, call: cst.Call) -> bool:
        """`self.<attr> = f(...)`: possibly a submodule."""
        statement = self.context.parents.get(call)
        return isinstance(statement, cst.Assign) and any(
            m.matches(t.target, m.Attribute(value=m.Name("self"))) for t in statement.targets
        )


def _unbatched_layer(code: str, layer: str) -> str:
    return (
        f"the model `{code}` runs on a sample without its batch dimension, and `{layer}` is not a layer known "
        "to act on the last dimensions only (a batch dimension may change what it reads)"
    )


def _passed(call: cst.Call, function: cst.FunctionDef, param: cst.Param, method: bool) -> cst.BaseExpression | None:
    """What `call` passes to `param` (`self` filled by the call of a method), or its default."""
    found = argument_for(call, function, param, offset=1 if method else 0)
    return found if found is not None else param.default

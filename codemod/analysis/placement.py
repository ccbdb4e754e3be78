"""Where the parameters an optimizer is built over live: one inference of placement.

Asked about the first argument of an optimizer, it says for each part (a model's
`parameters()`, a tensor made to be trained) where it is when the optimizer is built:

- a model is where its last visible move before that point puts it
  (`Training.model`), or, for another name of it (`net = model`,
  `copy.deepcopy(model)`, `DistributedDataParallel(model)` and its `.module`,
  `torch.compile(model)`), where the model it names is;
- a tensor made to be trained (`requires_grad=True`, `requires_grad_()`,
  `nn.Parameter(...)`) is where its factory's `device=` or its last
  `.to(device)` / `.cuda()` puts it, on the host without either; followed through
  names, `self.` attributes, methods that keep the device, arithmetic, what
  functions of the file return and what every call of a function passes to its
  parameter (callers that disagree leave it unknown, and say so);
- the device an expression names is `Training.device_types`: followed through
  names, attributes, config fields, argparse options, f-strings starting with
  "cuda", and what functions of this file and of the project's modules return;
  `untold_device` says why it cannot be told when the reason is a parameter of a
  function the file never calls;
- a training engine's `prepare(...)` (Accelerate, Fabric, DeepSpeed style) that is
  handed the optimizer picks the device (`prepared_by`); `sparse=True` anywhere in
  the file means sparse gradients, which fused SGD rejects (`sparse_gradients`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.local_calls import local_calls
from codemod.analysis.names import kwarg, method_name, positional
from codemod.analysis.project import project_of
from codemod.analysis.torch_facts import (
    DEVICE_AND_DTYPE_KEEPING_METHODS,
    DEVICE_CHOOSING_SETUP_METHODS,
    SAME_DEVICE_MODEL_WRAPPERS,
    TENSOR_FACTORIES,
)
from codemod.analysis.training import Model
from codemod.analysis.values import COMPLEX, FLOAT, Kind, Place, values

if TYPE_CHECKING:
    from codemod.context import FileContext

MAX_DEPTH = 8  # how many bindings, wrappers and calls one look-up follows


@dataclass
class Parameters:
    """Where the parts of an optimizer's parameters are (`Placement.parameters`)."""

    sites: list[tuple[cst.BaseExpression, cst.CSTNode | None]] | None  # each part and where it counts
    placed: list[Model | None]  # per part: its move, None when nothing moves it before it counts
    complex: bool = False  # some part is a complex tensor
    untold: cst.BaseExpression | None = None  # the innermost part whose origin or device cannot be told
    why: str | None = None  # why, when a reason is known
    tensors: dict[cst.CSTNode, Model | str] = field(default_factory=dict)  # parts that are tensors


class Placement:
    """Placement queries of one file; built once, through `Training.placement`."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.training = context.training
        self._why: str | None = None

    # -- the parameters of an optimizer ---------------------------------------------

    def parameters(self, params: cst.BaseExpression, at: cst.CSTNode) -> Parameters:
        """Where each part of `params` (an optimizer's first argument, built at `at`) is."""
        found = Parameters(None, [])
        self._why = None

        def tensor_sites(expr: cst.BaseExpression, where: cst.CSTNode | None):
            if isinstance(expr, cst.Attribute) and self.training.is_model(expr.value):
                return [(expr, where)]  # `model.weight`: where the model is
            place = self._tensor(expr, 0, set())
            if place is None or place == ():
                if found.untold is None or not self.context.inside(found.untold, expr):
                    found.untold = expr  # the innermost part that cannot be told
                return None
            found.tensors[expr] = place
            return [(expr, where)]

        found.sites = self.training.parameter_model_sites(params, at, tensors=tensor_sites)
        if found.sites is None:
            found.why = self._why
            return found
        found.complex = any(found.tensors.get(part) == COMPLEX for part, _ in found.sites)
        for part, where in found.sites:
            if part in found.tensors:
                place = found.tensors[part]
                found.placed.append(place if isinstance(place, Model) and place.move is not None else None)
            else:
                self._why = None
                model = self.model(part, where)
                if model is None and self._why is not None and found.untold is None:
                    found.untold, found.why = part, self._why  # a builder's models on different devices
                found.placed.append(model)
        return found

    def stays_on_host(self, parameters: Parameters, part: cst.BaseExpression) -> bool:
        """Whether a part that no call moves before the optimizer is built is on the CPU for
        good: a tensor made on the host, or a model built here on the host (by torch.nn, a
        class of this file, or a function of this file that returns one) that no call of
        the file moves to a device, before or after."""
        if part in parameters.tensors:
            return True  # found made on the host
        if self._default_device_set:
            return False
        return self._built_on_host(part, 0)

    def trains_on_host(self, loop: cst.CSTNode) -> bool:
        """Whether every model the training loop `loop` runs was built on the host and is
        moved by no call of the file (nor the default device set, nor an engine's
        `prepare(...)` or `setup(...)` that picks the device): its matrix products run on
        the CPU, whatever device the script may name."""
        if self._default_device_set or self._prepare_calls:
            return False
        calls = [c for c in self.context.loops.reached_calls(loop) if self.training.is_model(c.func)]
        return bool(calls) and all(self._built_on_host(call.func, 0) for call in calls)

    def untold_device(self, expr: cst.BaseExpression | None, depth: int = 0) -> str | None:
        """Why the device `expr` names cannot be told, when the reason is that it comes from
        a parameter of a function that no call of this file makes (its callers are
        elsewhere): followed through names, `torch.device(...)`, conditionals and what
        every call of a function passes; None when that is not the reason."""
        if expr is None or depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.Call) and self.context.names.is_(expr.func, "torch.device"):
            first = positional(expr, 0) or kwarg(expr, "type")
            return self.untold_device(first.value if first is not None else None, depth + 1)
        if isinstance(expr, cst.IfExp):
            return self.untold_device(expr.body, depth + 1) or self.untold_device(expr.orelse, depth + 1)
        if not isinstance(expr, cst.Name):
            return None
        found = self.context.bindings.param_of(expr)
        if found is not None and self.context.kinds.class_of(found[0]) is None:
            function = found[0]
            if not self.context.loops.call_sites(function):
                return self._passed_from_elsewhere(expr.value, function, found[1])
            values = self.context.kinds.passed(found[1]) or []
        else:
            values = [v for v in self.context.kinds.value_sources(expr) if v is not None]
        return next((why for why in (self.untold_device(v, depth + 1) for v in values) if why), None)

    def _passed_from_elsewhere(self, name: str, function: cst.FunctionDef, param: cst.Param) -> str | None:
        """Why `param` of `function`, which this file never calls, names no known device: no
        module of the package calls it either, or the first call there whose argument
        cannot be told."""
        project = project_of(self.context)
        passed = self.training.package_arguments(function, param)
        where = f"`{name}` is a parameter of `{function.name.value}`"
        if not passed:
            return f"{where}, which this file never calls"
        for module, call, argument in passed:
            if argument is None or module.context.training.device_types(argument) is None:
                return f"{where}, and the call at {project.shown_in(module.context, call)} passes a device that cannot be told"
        return None  # every caller's device is known: the reason is another

    def shared_device_name(self, devices: list, at: cst.CSTNode) -> str | None:
        """The name of the `torch.device(...)` every one of `devices` (device expressions,
        None where unknown) names, when one assignment binds it, before `at` and visible
        there (followed through function parameters to what every call passes): a value
        `at` can be given in terms of (`pin_memory=device.type == "cuda"`)."""
        bindings = self.context.bindings
        names = [name for device in devices for name in self._device_names(device, 0)]
        if not names or any(name is None for name in names):
            return None
        assignments = [bindings.assignments(name) for name in names]
        if any(found is None or len(found) != 1 for found in assignments):
            return None
        assignment = assignments[0][0]
        if any(found[0] is not assignment for found in assignments):
            return None
        value = bindings.assigned_value(assignment)
        if not (isinstance(value, cst.Call) and self.context.names.is_(value.func, "torch.device")):
            return None
        scope = self.context.scopes.get(at)
        name = names[0].value
        if scope is None or list(scope[name]) != [assignment]:
            return None
        statement = bindings.statement(assignment.node)
        index = self.context.index
        return name if index.end(statement) < index.order(at) else None

    def _device_names(self, device: cst.BaseExpression | None, depth: int) -> list[cst.Name | None]:
        """The names a device expression comes from, through parameters to the arguments
        of every call; None for anything else."""
        if not isinstance(device, cst.Name) or depth > MAX_DEPTH:
            return [None]
        if self.context.bindings.param_of(device) is None:
            return [device]
        passed = self.context.loaders.bound_values(device)
        if not passed:
            return [None]
        return [name for argument, _ in passed for name in self._device_names(argument, depth + 1)]

    def prepared_by(self, optimizer: cst.Call) -> cst.Call | None:
        """`accelerator.prepare(model, optimizer, ...)` (Accelerate, Fabric, DeepSpeed
        style) that is handed the optimizer this call builds: it picks the device."""
        statement = self.context.parents.get(optimizer)
        if not (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0].target, cst.Name)
        ):
            return None
        name = statement.targets[0].target.value
        for call in self._prepare_calls:
            if any(isinstance(a.value, cst.Name) and a.value.value == name for a in call.args) and (
                self.context.index.before(optimizer, call)
            ):
                return call
        return None

    @functools.cached_property
    def _prepare_calls(self) -> list[cst.Call]:
        """The `x.prepare(...)`, `x.setup(...)`, `x.initialize(...)` calls of the file."""
        return [
            call
            for call in self.context.index.find(cst.Call)
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in DEVICE_CHOOSING_SETUP_METHODS
        ]

    @functools.cached_property
    def sparse_gradients(self) -> bool:
        """`nn.Embedding(..., sparse=True)` (or any `sparse=True`) somewhere in the file."""
        if "sparse" not in self.context.code:
            return False
        return any(
            arg.keyword is not None and arg.keyword.value == "sparse" and m.matches(arg.value, m.Name("True"))
            for arg in self.context.index.find(cst.Arg)
        )

    # -- models -------------------------------------------------------------------

    def model(self, expr: cst.BaseExpression, at: cst.CSTNode | None, depth: int = 0) -> Model | None:
        """The model (`model` for `model[0]` or `model.head`) that is moved before `at`;
        for another name of it, the model it names, when every binding names the same
        placed model. None when nothing moves it."""
        training = self.training
        current = expr
        while True:
            if isinstance(current, cst.Call) and depth < MAX_DEPTH:
                wrapped = training.wrapped_model(current, SAME_DEVICE_MODEL_WRAPPERS)
                if wrapped is not None:
                    return self.model(wrapped, at, depth + 1)
                moved = training.moved_by(current)
                if moved is not None:
                    return moved
                # `model = build(device)`: where every `return` of the builder puts its model
                returned = self.context.loops.returned(current)
                return self._returned_model(current, returned, depth) if returned else None
            if isinstance(current, cst.IfExp) and depth < MAX_DEPTH:
                return self._same_model([self.model(v, at, depth + 1) for v in (current.body, current.orelse)])
            if isinstance(current, (cst.Name, cst.Attribute)):
                model = training.model(current, at)
                if model.move is not None:
                    return model
                if depth < MAX_DEPTH:
                    aliased = self._aliased(current, at, depth)
                    if aliased is not None:
                        return aliased
            if not isinstance(current, (cst.Attribute, cst.Subscript)):
                return None
            current = current.value

    def _returned_model(self, call: cst.Call, returned: list[cst.BaseExpression], depth: int) -> Model | None:
        """The placed model every `return` of the builder `call` runs gives; where some are
        moved and the others are not, or are moved to other devices, None with the reason."""
        models = [self.model(value, value, depth + 1) for value in returned]
        placed = self._same_model(models)
        if placed is None and any(model is not None for model in models) and self._why is None:
            lines = " and ".join(str(self.context.line(value)) for value in returned[:2])
            builder = self.context.source(call.func)
            self._why = f"the models `{builder}` returns (lines {lines}) are not all moved to one device"
        return placed

    def _aliased(self, expr: cst.BaseExpression, at: cst.CSTNode | None, depth: int) -> Model | None:
        """The placed model every binding of `expr` names (all on one device), else None."""
        if isinstance(expr, cst.Name):  # (`g, d = build(device)`: the element `g` is given)
            values = self.context.kinds.value_sources(expr)
        else:
            values = self.context.loops.values_of(expr)
        if not values or any(v is None or v is expr for v in values):
            return None
        found = []
        for value in values:  # (one binding that is not a placed model settles it)
            model = self.model(value, at, depth + 1)
            if model is None:
                return None
            found.append(model)
        return self._same_model(found)

    def _same_model(self, found: list[Model | None]) -> Model | None:
        if not found or any(model is None for model in found):
            return None
        code = self.training.code
        keys = {(code(m.device) if m.device is not None else None, m.places, m.split) for m in found}
        return found[0] if len(keys) == 1 else None

    @property
    def _default_device_set(self) -> bool:
        code = self.context.code
        return "set_default_device" in code or "set_default_tensor_type" in code

    def _built_on_host(self, expr: cst.BaseExpression, depth: int) -> bool:
        if depth > MAX_DEPTH:
            return False
        training = self.training
        if isinstance(expr, cst.Call):
            if method_name(expr) in ("to", "cuda"):
                return False  # `nn.Linear(8, 1).to(device)`: moved where it is built
            wrapped = training.wrapped_model(expr, SAME_DEVICE_MODEL_WRAPPERS)
            if wrapped is not None:
                return self._built_on_host(wrapped, depth + 1)
            if kwarg(expr, "device") is not None or kwarg(expr, "device_map") is not None:
                return False
            returned = self.context.loops.returned(expr)
            if returned:
                return all(self._built_on_host(value, depth + 1) for value in returned)
            classdef = self.context.kinds.local_class(expr.func)
            if classdef is not None:
                return not self._places_itself(classdef)
            return self.context.names.startswith(expr.func, ("torch.nn",)) is not None
        if isinstance(expr, (cst.Subscript, cst.Attribute)) and training.is_model(expr.value):
            return self._built_on_host(expr.value, depth + 1)  # `model[0]`, `model.head`
        if not isinstance(expr, (cst.Name, cst.Attribute)) or training.moved_anywhere(training.code(expr)):
            return False
        sources = (
            self.context.kinds.value_sources(expr) if isinstance(expr, cst.Name) else self.context.loops.values_of(expr)
        )
        return bool(sources) and all(s is not None and self._built_on_host(s, depth + 1) for s in sources)

    def _places_itself(self, classdef: cst.ClassDef) -> bool:
        """A module class whose constructor may put its weights on a device: its `__init__`
        (or that of a base class of this file it inherits) calls `.to(...)` / `.cuda()` or
        passes `device=` to what it builds."""
        init = local_calls(self.context).method(classdef, "__init__")
        if init is None:
            return False
        return any(
            method_name(call) in ("to", "cuda") or kwarg(call, "device") is not None
            for call in self.context.index.find(cst.Call, within=init)
        )

    # -- tensors made to be trained ---------------------------------------------------

    def tensor(self, expr: cst.BaseExpression) -> Model | str | tuple | None:
        """Where the tensor `expr` is made: a Model whose `move` is the call that puts it
        on a device (None: the host), COMPLEX for a complex tensor, None when it cannot be
        told (`why` says why, when a reason is known)."""
        self._why = None
        return self._tensor(expr, 0, set())

    @property
    def why(self) -> str | None:
        """Why the last `tensor` query could not tell, when a reason is known."""
        return self._why

    def _tensor(self, expr: cst.BaseExpression, depth: int, seen: set) -> Model | str | tuple | None:
        if depth > MAX_DEPTH:
            return None
        training = self.training
        if isinstance(expr, (cst.Name, cst.Attribute)):
            key = (id(self.context.scopes.get(expr)), training.code(expr))
            if key in seen:
                return ()  # a binding that refers to itself (`w = nn.Parameter(w)`): adds nothing
            seen = seen | {key}
            passed = self._passed(expr) if isinstance(expr, cst.Name) else None
            if passed is not None:
                return self._from_callers(expr, passed, depth, seen)
            sources = (
                self.context.kinds.value_sources(expr)
                if isinstance(expr, cst.Name)
                else self.context.loops.values_of(expr)
            )
            if not sources or any(source is None for source in sources):
                return None
            return self._join([self._tensor(source, depth + 1, seen) for source in sources])
        if isinstance(expr, cst.Call):
            return self._made_by(expr, depth, seen)
        if isinstance(expr, cst.BinaryOperation):
            sides = [side for side in (expr.left, expr.right) if self.context.kinds.fact(side).kind is Kind.TENSOR]
            return self._join([self._tensor(side, depth + 1, seen) for side in sides]) if sides else None
        if isinstance(expr, cst.UnaryOperation):
            return self._tensor(expr.expression, depth + 1, seen)
        if isinstance(expr, cst.IfExp):
            return self._join([self._tensor(v, depth + 1, seen) for v in (expr.body, expr.orelse)])
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp)) and expr.for_in.inner_for_in is None:
            return self._tensor(expr.elt, depth + 1, seen)
        return None

    def _passed(self, name: cst.Name) -> list[tuple[cst.Call, cst.BaseExpression | None]] | None:
        """For a parameter of a plain function of this file (its only binding): (call, what
        it passes) for every call of the function; None for anything else."""
        found = self.context.bindings.param_of(name)
        if found is None:
            return None
        passed = self.context.kinds.arguments(found[1])
        if not passed or any(value is None for _, value in passed):
            return None
        return passed

    def _from_callers(self, name: cst.Name, passed, depth: int, seen: set) -> Model | str | tuple | None:
        """A parameter is where every call puts what it passes; callers that disagree, or
        one whose tensor cannot be told, leave it unknown with the reason."""
        places = [self._tensor(value, depth + 1, seen) if value is not None else None for _, value in passed]
        joined = self._join(places)
        if joined is None and self._why is None:
            line = self.context.line
            untold = [call for (call, _), place in zip(passed, places) if place is None]
            if untold:
                self._why = f"the call on line {line(untold[0])} passes a tensor whose device cannot be told"
            else:
                lines = " and ".join(str(line(call)) for call, _ in passed[:2])
                self._why = f"the calls on lines {lines} pass `{name.value}` on different devices"
        return joined

    def _made_by(self, call: cst.Call, depth: int, seen: set) -> Model | str | tuple | None:
        training = self.training
        names = self.context.names
        code = training.code(call)
        first = positional(call, 0)
        if names.is_(call.func, "torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            data = first or kwarg(call, "data")
            return self._tensor(data.value, depth + 1, seen) if data is not None else None
        if names.startswith(call.func, ("torch.nn.init.",)):
            return self._tensor(first.value, depth + 1, seen) if first is not None else None
        factory = next((n for n in names.of(call.func) if n in TENSOR_FACTORIES), None)
        if factory is not None:
            dtype = self.dtype(kwarg(call, "dtype"))
            if dtype != FLOAT:
                return dtype
            device = kwarg(call, "device")
            if device is not None:
                return self._on(call, device.value)
            if factory.endswith("_like"):
                return self._tensor(first.value, depth + 1, seen) if first is not None else None
            if self._default_device_set:
                return None
            return Model(code, None, None, frozenset(), False, None)  # made on the host
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        if receiver is not None and not isinstance(receiver, cst.Call) and names.startswith(receiver, ("torch",)):
            receiver = None  # `torch.sigmoid(...)`, `torch.nn.init.normal_(...)`: a function, no method
        method = method_name(call) if receiver is not None else None
        if receiver is None and names.startswith(call.func, ("torch",)):
            return None
        if method in DEVICE_AND_DTYPE_KEEPING_METHODS:
            return self._tensor(receiver, depth + 1, seen)
        if method in ("cfloat", "cdouble", "chalf"):
            return COMPLEX
        if method == "cpu":
            return Model(code, None, None, frozenset(), False, None)
        if method == "cuda":
            index = first or kwarg(call, "device")
            if index is not None:
                return self._on(call, index.value)
            return Model(code, call, None, frozenset({Place.CUDA}), False, None)
        if method == "to":
            return self._moved(call, receiver, depth, seen)
        returned = self.context.loops.returned(call)
        if returned:
            return self._join([self._tensor(v, depth + 1, seen) for v in returned])
        return None

    def _on(self, call: cst.Call, device: cst.BaseExpression) -> Model:
        """Made or moved by `call` onto `device`."""
        training = self.training
        return Model(training.code(call), call, device, training.device_places(device), False, None)

    def _moved(self, call: cst.Call, receiver: cst.BaseExpression, depth: int, seen: set) -> Model | str | None:
        """`x.to(device)`, `x.to(device, dtype)`, `x.to(dtype=...)`."""
        kinds = self.context.kinds
        if any(arg.star for arg in call.args):
            return None
        device = kwarg(call, "device")
        dtype = kwarg(call, "dtype")
        for arg in call.args:
            if arg.keyword is not None:
                continue
            if kinds.is_dtype(arg.value) and dtype is None:
                dtype = arg
            elif kinds.is_device(arg.value) and device is None:
                device = arg
            else:
                return None  # `.to(other)` or an argument that cannot be told
        kind = self.dtype(dtype)
        if kind != FLOAT:
            return kind
        if device is None:
            return self._tensor(receiver, depth + 1, seen)
        return self._on(call, device.value)

    def dtype(self, arg: cst.Arg | None) -> str | None:
        """FLOAT for no dtype or a floating one, COMPLEX for a complex one (`Values.named_dtype`),
        None when it cannot be told."""
        return FLOAT if arg is None else values(self.context).named_dtype(arg.value)

    def _join(self, found: list) -> Model | str | tuple | None:
        """One placement for several possible ones: all the same, else None (cannot be told).
        `()` stands for a binding that adds nothing."""
        found = [f for f in found if f != ()]
        if not found:
            return ()
        if any(f is None for f in found):
            return None
        if COMPLEX in found:
            return COMPLEX
        code = self.training.code
        keys = {(m.move is None, code(m.device) if m.device is not None else None, m.places) for m in found}
        return found[0] if len(keys) == 1 else None

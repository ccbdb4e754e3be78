"""Where a value built once from the device a training loop's model is on (a mixed
precision policy, a gradient scaler) can be built, and how the forward pass then spells it.

`policy_sites(context)` (built once per file, FileContext.shared) answers:

- `site(loop, model, names, stateful)`: a `Site`, or why there is none as a sentence.
  In order of preference: before the outermost loop of the training loop's function when
  the device is defined there (or is a parameter every caller passes it to); right after
  a trainer class moves its model in a method (`self.model = model.to(device)` in
  `__init__`; after the `if` for a `.cuda()` behind a flag), as attributes `names` of
  that class that the file does not use yet, for a forward pass in a method of the class;
  for a forward pass in a helper function, after the statement that moves the model or,
  unless the value must keep its state across steps (`stateful`, a GradScaler), at the
  helper's top; else from the device the model's parameters are on
  (`next(model.parameters()).device`) where the model is visible;
- `plain(expr)`: a device expression that is safe to evaluate once more (names,
  attributes, strings, `cfg["device"]`, `torch.device(...)` of those);
- `outermost_loop(loop)`: the outermost loop around `loop` in its function;
- `free_names(*choices)`: for each tuple of candidate names, the first that the file
  never spells (the names a fix's new values may take), or None when one has none;
- `scaler_problem(loop)`: why a GradScaler's calls cannot be placed in the loop (several
  optimizers, a step sharing a one-line block with other statements, clipping where
  `scaler.unscale_` could not run exactly once per step), or None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.bindings import argument_for
from codemod.analysis.names import is_main_guard, method_name

if TYPE_CHECKING:
    from codemod.analysis.training import Model, TrainingLoop
    from codemod.context import FileContext

KEY = "policy_sites"


def policy_sites(context: FileContext) -> PolicySites:
    return context.shared(KEY, PolicySites)


class Site(NamedTuple):
    """Build the value next to `anchor` (after it when `after`), as `{target}name =
    ...({device})`; the forward pass reads it as `{spelled}name`."""

    anchor: cst.CSTNode
    after: bool
    target: str  # "" or the receiver the building method names its instance by: "self."
    spelled: str  # "" or the receiver the forward pass's method names it by
    device: str  # the device expression, as code


class PolicySites:
    def __init__(self, context: FileContext) -> None:
        self.context = context

    def free_names(self, *choices: tuple[str, ...]) -> tuple[str, ...] | None:
        """The first name of each of `choices` that the file does not spell; None when
        every name of one of them is taken."""
        taken = self.context.index.spelled_names
        found = tuple(next((n for n in names if n not in taken), None) for names in choices)
        return None if None in found else found

    def site(self, loop: TrainingLoop, model: Model, names: tuple[str, ...], stateful: bool) -> Site | str:
        """Where the policy (and the fp16 scaler) is built once, and how the forward
        pass spells it: before the outermost loop of the step loop's function when
        the device is defined there; else as an attribute set where a trainer class
        moves its model; else, in a helper, before the helper or at its top."""
        training = self.context.training
        index = self.context.index
        device = model.device
        device_code = training.code(device) if device is not None else '"cuda"'
        if device is not None and not self.plain(device):
            return f"the device `{device_code}` is not a plain expression the policy can be built from"
        region = loop.forward.statements[0]
        helper = None if index.inside(region, loop.loop) else index.first_enclosing(region, cst.FunctionDef)
        if helper is None and not self._moved_only_sometimes(model, loop):
            outer = self.outermost_loop(loop.loop)
            if device is None or training.visible_at(device, outer):
                return Site(outer, False, "", "", device_code)
            parameter = self._device_parameter(device, index.first_enclosing(outer, cst.FunctionDef))
            if parameter is not None:  # `train(model, device, ...)`: the function's own name for it
                return Site(outer, False, "", "", parameter)
        found = self._attribute_site(loop, model, helper, names, device_code)
        if found is not None:
            return found
        if helper is not None and device is not None and not self._moved_only_sometimes(model, loop):
            after_move = self._after_move(model, helper)
            if after_move is not None:
                return Site(after_move, True, "", "", device_code)
            first = _first_statement(helper)
            if not stateful and first is not None and training.visible_at(device, first):
                return Site(first, False, "", "", device_code)
        # The device the model's parameters are on when the loop starts.
        parameters_device = f"next({model.expression}.parameters()).device"
        expression = cst.parse_expression(parameters_device)
        anchor = (
            self.outermost_loop(loop.loop) if helper is None else (_first_statement(helper) if not stateful else None)
        )
        if anchor is not None and training.visible_at(expression, anchor):
            return Site(anchor, False, "", "", parameters_device)
        return f"the device `{device_code}` is not defined where the policy would be built"

    def _moved_only_sometimes(self, model, loop: TrainingLoop) -> bool:
        """Is the model put on CUDA by a `.cuda()` under an `if` that the training loop is
        not in (`if args.cuda: model.cuda()`)? Then it may stay on the CPU, and the policy
        is built from the device its parameters are on, not from "cuda"."""
        if model.device is not None or method_name(model.move) != "cuda":
            return False
        index = self.context.index
        return any(
            not index.inside(loop.loop, block) and not is_main_guard(block.test)
            for block in self.context.kinds.enclosing(model.move, cst.If)
        )

    def _attribute_site(self, loop, model, helper, names, device_code) -> Site | None:
        """`self.precision = Precision.for_device(device)` right after a trainer class
        moves its model (`self.model = model.to(device)` in `__init__`), for a forward
        pass in a method of that class."""
        index = self.context.index
        function = helper or index.first_enclosing(loop.loop, cst.FunctionDef)
        if model.move is None or function is None or not self._is_method(function):
            return None
        mover = index.first_enclosing(model.move, cst.FunctionDef)
        if mover is None or not self._is_method(mover):
            return None
        cls = self.context.kinds.class_of(function)
        if cls is None or self.context.kinds.class_of(mover) is not cls:
            return None
        statement = index.statement_of(model.move)
        if self._moved_only_sometimes(model, loop):
            # `if self.use_cuda: self.model = self.model.cuda()`: after the `if`, from the
            # device the parameters are on then.
            statement = next(
                (
                    s
                    for s in self.context.kinds.enclosing(model.move, cst.If)
                    if self.context.parents.get(s) is not None
                    and self.context.parents.get(self.context.parents.get(s)) is mover
                ),
                None,
            )
            user_self = function.params.params[0].name.value
            if statement is None or not model.expression.startswith(f"{user_self}."):
                return None
            attribute = model.expression.removeprefix(f"{user_self}.")
            device_code = f"next({mover.params.params[0].name.value}.{attribute}.parameters()).device"
        elif not isinstance(statement, cst.SimpleStatementLine) or not isinstance(
            self.context.parents.get(statement), cst.IndentedBlock
        ):
            return None
        if index.first_enclosing(statement, cst.FunctionDef) is not mover or index.first_enclosing(
            statement, (cst.For, cst.While)
        ):
            return None
        attributes = {a.attr.value for a in index.find(cst.Attribute)}
        if attributes & set(names):
            return None
        mover_self = mover.params.params[0].name.value
        user_self = function.params.params[0].name.value
        return Site(statement, True, f"{mover_self}.", f"{user_self}.", device_code)

    def _device_parameter(self, device: cst.BaseExpression, function: cst.FunctionDef | None) -> str | None:
        """The parameter of `function` that every call of it passes `device` to, as the
        callers spell it (`train(args, model, device, loader)`)."""
        if function is None:
            return None
        calls = self.context.loops.call_sites(function)
        if not calls:
            return None
        spelled = self.context.source(device)
        for param in (*function.params.params, *function.params.kwonly_params):
            arguments = [argument_for(call, function, param) for call in calls]
            if all(a is not None and self.context.source(a) == spelled for a in arguments):
                if not any(
                    self.context.inside(b.node, function.body)
                    for b in self.context.bindings.assignments(param.name) or ()
                    if b.node is not param.name
                ):
                    return param.name.value
        return None

    def _after_move(self, model, helper: cst.FunctionDef) -> cst.BaseStatement | None:
        """The statement that moves the model, when the helper sees the names it binds:
        a statement of the module, or of a function around the helper, not in a loop."""
        index = self.context.index
        statement = index.statement_of(model.move)
        block = self.context.parents.get(statement)
        if not isinstance(statement, cst.SimpleStatementLine) or not isinstance(block, (cst.Module, cst.IndentedBlock)):
            return None
        owner = index.first_enclosing(statement, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.For, cst.While))
        if isinstance(owner, (cst.For, cst.While, cst.ClassDef, cst.Lambda)):
            return None
        if owner is not None and not index.inside(helper, owner):
            return None
        return statement

    def _is_method(self, function: cst.FunctionDef) -> bool:
        return (
            self.context.kinds.class_of(function) is not None
            and bool(function.params.params)
            and not any(self.context.source(d.decorator) == "staticmethod" for d in function.decorators)
        )

    def outermost_loop(self, loop: cst.CSTNode) -> cst.CSTNode:
        """The loop to put the policy before: the outermost loop around `loop` in its function."""
        outer = loop
        for current in self.context.index.ancestors(loop):
            if isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if isinstance(current, (cst.For, cst.While)):
                outer = current
        return outer

    def plain(self, expr: cst.BaseExpression) -> bool:
        """A device expression that is safe to evaluate once more, before the loop:
        names, attributes, strings, and `torch.device(...)` of those."""
        if isinstance(expr, (cst.Name, cst.SimpleString, cst.Integer)):
            return True
        if isinstance(expr, cst.Attribute):
            return self.plain(expr.value)
        if (
            isinstance(expr, cst.Subscript)
            and len(expr.slice) == 1
            and isinstance(expr.slice[0].slice, cst.Index)
            and isinstance(expr.slice[0].slice.value, (cst.SimpleString, cst.Integer))
        ):
            return self.plain(expr.value)  # `cfg["device"]`
        if isinstance(expr, cst.Call) and self.context.names.is_(expr.func, "torch.device"):
            return all(self.plain(arg.value) for arg in expr.args)
        return False

    def scaler_problem(self, loop: TrainingLoop) -> str | None:
        """Why the GradScaler calls cannot be placed, or None."""
        if len(loop.optimizers) != 1:
            return f"fp16 needs one GradScaler step per optimizer; this loop steps {len(loop.optimizers)}"
        for step in loop.steps:
            if not self._own_line(step.call):
                return "the optimizer step shares a one-line block; `scaler.update()` cannot follow it"
        if loop.clips:
            clip = min(loop.clips, key=self.context.index.order)
            if not self._own_line(clip) or not all(
                self._clips_before_step(c, s) for c in loop.clips for s in loop.steps
            ):
                return (
                    "gradient clipping is not in the optimizer step's block before the step; "
                    "`scaler.unscale_` could not run exactly once per step"
                )
        return None

    def _clips_before_step(self, clip: cst.Call, step) -> bool:
        """Is `clip` in the step's block, before it, and not inside a nested loop there?"""
        training = self.context.training
        step_statement = training.statement_of(step.call)
        block = self.context.parents.get(step_statement)
        current = training.statement_of(clip)
        while not isinstance(current, (cst.For, cst.While)):
            parent = self.context.parents.get(current)
            if parent is block:
                return self.context.index.before(current, step_statement)
            if parent is None:
                return False
            current = parent
        return False  # a loop between the clip and the step's block would unscale_ more than once

    def _own_line(self, call: cst.Call) -> bool:
        statement = self.context.training.statement_of(call)
        return isinstance(statement, cst.SimpleStatementLine) and isinstance(
            self.context.parents.get(statement), cst.IndentedBlock
        )


def _first_statement(function: cst.FunctionDef) -> cst.BaseStatement | None:
    """The first statement of a function's body after its docstring."""
    body = function.body
    if not isinstance(body, cst.IndentedBlock):
        return None
    statements = list(body.body)
    if statements and m.matches(
        statements[0], m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])
    ):
        statements = statements[1:]
    return statements[0] if statements else None

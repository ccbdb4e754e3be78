"""The models whose forward a training step runs, and where each is built: what a compile
of the model covers and the statement it goes after.

- `called_models`: the models of a step loop whose forward runs in it, called directly, given
  to a function of the file that calls them, or called through another name (`net = model`,
  `DistributedDataParallel(model)` and its `.module`); `runs` follows such a name to its model,
  `calls_model` a call to the model it runs;
- `step_methods`: what else of a model the step calls besides its forward (`model.encode(x)`),
  which a compile of `model(...)` leaves in eager mode; `class_elsewhere`: the class of another
  module of the project that a model is built from;
- `anchor`: the last statement before the loop, in a block around it that runs once, that
  builds or moves the model (`sets_up`), and the class of the file it is an instance of
  (`built_class`); `bound_again`: whether the name is bound again
  before the loop ends; where a model is built when the training code does not build it:
  in the caller that passes it (`caller_site`; `caller_anchor` when a compile there covers
  what the loop trains: one caller, nothing binding it again), at module level
  (`global_site`), in the class that assigns `self.model` (`attribute_site`), anew in an
  outer loop (`built_in_outer_loop`), and why no one statement builds it (`unbuilt_reason`,
  a reason to show the user).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.local_calls import local_calls
from codemod.analysis.loops import own_nodes
from codemod.analysis.names import compound_keyword, method_name, methods_of
from codemod.analysis.project import project_of
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.torch_facts import ALL_LOSS_MODULES, MODEL_WRAPPERS, MODULE_METHODS, MODULE_SET_UP_METHODS


def own_calls(context, node: cst.CSTNode) -> list[cst.Call]:
    """Calls under `node` that run when it runs (not in nested functions, lambdas, classes)."""
    return own_nodes(context.index, cst.Call, node)


def called_models(context, loop) -> list[str]:
    """The models of the loop whose forward runs in it: called (`model(x)`, `model.forward`),
    or given to a function of this file that calls them, or called through another name
    (`ddp = DistributedDataParallel(model)`, `net = model if ... else ddp`). An
    optimizer's parameter tables (`nn.ParameterDict`) and modules only read for their
    weights are not called."""
    found = []
    calls = own_calls(context, loop.loop)
    candidates = [model.expression for model in loop.models] + _passed_modules(context, loop.loop, calls)
    reached = context.loops.reached_calls(loop.loop)  # (a loss module a method of the trainer calls)
    for name in candidates:
        if name in found or _loss_module(context, reached, name):
            continue
        if any(calls_model(context, call, name) for call in calls):
            node = next((c.func for c in calls if m.matches(c.func, m.Name(name))), None)
            wrapped = runs(context, node) if node is not None else None
            found.append(wrapped if wrapped is not None and wrapped not in found else name)
    for call in calls:
        func = call.func.value if m.matches(call.func, m.Attribute(attr=m.Name("forward"))) else call.func
        if isinstance(func, cst.Name) and func.value not in found:
            model = runs(context, func)
            if model is not None and model != func.value and model not in found:
                found.append(model)
    return found


def _loss_module(context, calls, name: str) -> bool:
    """Is what the loop calls as `name` a loss module of torch, every value of it built by
    `nn.SmoothL1Loss()` and the like (no parameters: nothing of a model to compile)?"""
    func = next(
        (c.func for c in calls if isinstance(c.func, (cst.Name, cst.Attribute)) and context.source(c.func) == name),
        None,
    )
    if isinstance(func, cst.Name):
        values = context.bindings.values(func)
    elif isinstance(func, cst.Attribute):
        values = context.kinds.attribute_values(func)
    else:
        return False
    for value in values or [None]:
        while isinstance(value, cst.Call) and method_name(value) in MODULE_SET_UP_METHODS:
            value = value.func.value  # `nn.MSELoss().to(device)`
        if not isinstance(value, cst.Call) or not context.names.of(value.func) & ALL_LOSS_MODULES:
            return False
    return True


def runs(context, expr: cst.BaseExpression, depth: int = 0) -> str | None:
    """The name of the model `expr` runs when called: a model's own name, or the model
    every binding of another name wraps or names (`DistributedDataParallel(model)`,
    `DataParallel(model)`, its `.module`, `a if c else b`)."""
    if depth > 6:
        return None
    if isinstance(expr, cst.Name):
        # Names of this scope only: a parameter is the function's own name of what it is given.
        values = context.bindings.values(expr) or []
        found = {runs(context, value, depth + 1) for value in values}
        if values and len(found) == 1 and None not in found and expr.value not in found:
            return found.pop()  # another name of one model
        return expr.value if context.training.is_model(expr) else None
    if isinstance(expr, cst.Attribute) and expr.attr.value == "module":
        return runs(context, expr.value, depth + 1)
    if isinstance(expr, cst.IfExp):
        found = {runs(context, expr.body, depth + 1), runs(context, expr.orelse, depth + 1)}
        return found.pop() if len(found) == 1 else None
    if isinstance(expr, cst.Call) and context.names.is_(expr.func, *MODEL_WRAPPERS):
        first = expr.args[0] if expr.args and expr.args[0].keyword is None else None
        return runs(context, first.value, depth + 1) if first is not None else None
    return None


def class_elsewhere(context, anchor: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """The class of the model `name` when it is built in this file from a class of
    another module of the user's code (`model = ComponentModel(...)`); None for classes
    of this file and of torch."""
    index = context.index
    scope = index.first_enclosing(anchor, cst.FunctionDef) or context.module
    target = next(
        (
            node
            for node in index.find(cst.Name, within=scope)
            if node.value == name and isinstance(context.parents.get(node), cst.AssignTarget)
        ),
        None,
    )
    values = context.loops.values_of(target) if target is not None else []
    classes = set()
    for value in values:
        while isinstance(value, cst.Call) and method_name(value) in MODULE_SET_UP_METHODS:
            value = value.func.value  # `Net(...).to(device)`
        if not isinstance(value, cst.Call) or not isinstance(value.func, (cst.Name, cst.Attribute)):
            return None
        if context.kinds.local_class(value.func) is not None:
            return None
        qualified = context.names.of(value.func)
        if not qualified or any(q.startswith(("torch.", "transformers.", "timm.")) for q in qualified):
            return None
        classes.add(value.func)
    return classes.pop() if len({context.source(c) for c in classes}) == 1 else None


def step_methods(context, loop, name: str) -> list[str]:
    """What the loop calls every step on the model `name` (under any of its names)
    besides its forward (`model.encode(x)`, `model.head(x)`): `model.compile()`
    compiles `model(...)` only and leaves those in eager mode."""
    found: list[str] = []
    for call in own_calls(context, loop.loop):
        func = call.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value not in MODULE_METHODS
            and func.attr.value not in ("forward", "compile")
            and isinstance(func.value, cst.Name)
            and func.attr.value not in found
            and runs(context, func.value) == name
        ):
            found.append(func.attr.value)
    return found


def calls_model(context, call: cst.Call, name: str, depth: int = 0) -> bool:
    code = context.source
    func = call.func
    if (
        code(func) == name
        or isinstance(func, cst.Attribute)
        and func.attr.value == "forward"
        and code(func.value) == name
    ):
        return True
    if isinstance(func, cst.Attribute) and code(func.value) == name and _method_runs_forward(context, func):
        return True  # `module.training_step(batch)`, whose method calls `self(x)`
    if depth > 1:
        return False
    kinds = context.kinds
    for function in context.loops.callees(call) or filter(None, [layouts(context).function_of(call)]):
        # the names the function knows the model by: the parameter it is passed in, and for
        # `self.train_step(batch)` whose method calls `self.model(x)`, the receiver's attribute
        offset = kinds.receiver_offset(call, function)
        params = [*function.params.posonly_params, *function.params.params, *function.params.kwonly_params]
        inner = [p.name.value for p in params if _is_code(context, kinds.argument(call, function, p, offset), name)]
        if offset and params and isinstance(func, cst.Attribute) and name.startswith(code(func.value) + "."):
            inner.append(params[0].name.value + name[len(code(func.value)) :])
        calls = own_calls(context, function.body)
        if any(calls_model(context, c, each, depth + 1) for each in inner for c in calls):
            return True
    return False


def _is_code(context, expr: cst.BaseExpression | None, code: str) -> bool:
    return expr is not None and context.source(expr) == code


def _method_runs_forward(context, method: cst.Attribute) -> bool:
    """Is `method` (`module.training_step`) a method of the file's class of its receiver
    that runs the module's forward itself: `self(x)` or `self.forward(x)` in its body?"""
    classdef = context.kinds.instance_class(method.value)
    function = methods_of(classdef).get(method.attr.value) if classdef is not None else None
    if function is None or not function.params.params:
        return False
    me = function.params.params[0].name.value
    return any(
        m.matches(call.func, m.Name(me) | m.Attribute(value=m.Name(me), attr=m.Name("forward")))
        for call in own_calls(context, function.body)
    )


def anchor(context, loop: cst.CSTNode, name: str) -> cst.SimpleStatementLine | None:
    """The last statement before the loop, in a block around it that runs once (not the
    body of an epoch loop), that builds or moves the model."""
    for block, index in _blocks_out(context, loop):
        if context.index.first_enclosing(block, (cst.For, cst.While, cst.FunctionDef)) is not None and isinstance(
            context.index.first_enclosing(block, (cst.For, cst.While, cst.FunctionDef)), (cst.For, cst.While)
        ):
            continue
        for statement in reversed(list(block.body)[:index]):
            if isinstance(statement, cst.SimpleStatementLine) and any(sets_up(small, name) for small in statement.body):
                return statement
    return None


def built_class(context, anchor: cst.SimpleStatementLine, name: str) -> cst.ClassDef | None:
    """The class of this file whose instance the model `name` is, where `anchor` (its
    `anchor`) builds or moves it."""
    spelled = next((n for n in context.index.find(cst.Name, within=anchor) if n.value == name), None)
    return context.kinds.instance_class(spelled) if spelled is not None else None


def bound_again(context, anchor: cst.SimpleStatementLine, loop: cst.CSTNode, name: str) -> bool:
    """Is `name` bound between the anchor and the end of the loop (the compiled
    module would not be the one trained)?"""
    scope = context.scopes.get(anchor.body[0])
    if scope is None:
        return True
    index = context.index
    after, end = index.end(anchor), index.end(loop)
    return any(
        a.node in index and after < index.order(a.node) <= end
        for a in scope.assignments[name]
        if isinstance(a.node, cst.CSTNode)
    )


def caller_site(context, loop: cst.CSTNode, name: str) -> cst.CSTNode | None:
    """For a model that is a parameter of the training function: where the caller builds
    or moves what it passes (one call of the function in this file)."""
    function = context.index.first_enclosing(loop, cst.FunctionDef)
    if function is None:
        return None
    params = [*function.params.posonly_params, *function.params.params]
    position = next((i for i, p in enumerate(params) if p.name.value == name), None)
    if position is None:
        return None
    for call in context.index.find(cst.Call):
        if (
            not (isinstance(call.func, cst.Name) and call.func.value == function.name.value)
            or layouts(context).function_of(call) is not function
        ):
            continue
        args = [a for a in call.args if a.keyword is None and not a.star]
        keyword = next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)
        arg = keyword or (args[position] if position < len(args) else None)
        if arg is not None and isinstance(arg.value, cst.Name):
            statement = context.index.statement_of(call)
            site = anchor(context, statement, arg.value.value)
            if site is not None:
                return site
    return None


class CallerAnchor(NamedTuple):
    """Where the one caller of a training function builds the model it gives it."""

    anchor: cst.SimpleStatementLine  # the statement a compile goes after
    name: str  # the caller's name of the model
    call: cst.Call  # the call that gives it to the training function


def caller_anchor(context, loop: cst.CSTNode, name: str) -> CallerAnchor | None:
    """For a model that is a parameter `name` of the function that trains it in `loop`:
    the statement of its one caller in this file (no module of the package calls it) that
    builds or moves the variable it passes, when nothing binds that variable again between
    there and the call, so that a compile there compiles the module the loop trains."""
    function = context.index.first_enclosing(loop, cst.FunctionDef)
    if function is None or context.kinds.class_of(function) is not None:
        return None
    params = [*function.params.posonly_params, *function.params.params]
    position = next((i for i, p in enumerate(params) if p.name.value == name), None)
    sites = local_calls(context).call_sites(function)
    if position is None or len(sites) != 1 or project_of(context).called_from_importers(function):
        return None
    (call,) = sites
    args = [a for a in call.args if a.keyword is None and not a.star]
    keyword = next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)
    arg = keyword or (args[position] if position < len(args) else None)
    if arg is None or not isinstance(arg.value, cst.Name) or any(a.star for a in call.args):
        return None
    statement = context.index.statement_of(call)
    found = anchor(context, statement, arg.value.value)
    if found is None:
        return None
    # up to the end of the statement of the anchor's block that holds the call (an epoch loop)
    block = context.parents.get(found)
    holder = next((a for a in context.index.ancestors(call) if context.parents.get(a) is block), statement)
    if bound_again(context, found, holder, arg.value.value):
        return None
    return CallerAnchor(found, arg.value.value, call)


def constructions(context, loop: cst.CSTNode, name: str) -> list[tuple[cst.Call, cst.BaseExpression | None]]:
    """The constructions of this file that give the class around `loop` the model it holds as
    `self.model` (`self.model = model` in `__init__`, `Trainer(model, ...)`), each with what it
    passes; empty when the attribute may hold anything else."""
    node = _attribute_read(context, loop, name)
    param = context.training.init_parameter(node) if node is not None else None
    return (context.kinds.arguments(param) or []) if param is not None else []


def construction_anchor(context, loop: cst.CSTNode, name: str) -> CallerAnchor | None:
    """For a model `self.model` that a class holds as its constructor is given it (`self.model =
    model` in `__init__`): the statement that builds or moves the variable its one construction
    in this file passes (`Trainer(model, ...)`), when nothing binds that variable again between
    there and the construction, so that a compile there compiles the module the loop trains."""
    passed = constructions(context, loop, name)
    if len(passed) != 1 or not isinstance(passed[0][1], cst.Name):
        return None
    ((call, argument),) = passed
    statement = context.index.statement_of(call)
    found = anchor(context, statement, argument.value)
    if found is None or bound_again(context, found, statement, argument.value):
        return None
    return CallerAnchor(found, argument.value, call)


def global_site(context, loop: cst.CSTNode, name: str) -> cst.CSTNode | None:
    """For a model the training function reads as a module-level name: the last module-level
    statement (or one in an `if` there) that builds or moves it."""
    function = context.index.first_enclosing(loop, cst.FunctionDef)
    if function is None:
        return None
    scope = context.scopes.get(context.module)
    if scope is None or not scope[name]:
        return None
    found = None
    for statement in context.module.body:
        candidates = [statement]
        if isinstance(statement, cst.If):
            candidates = list(statement.body.body) if isinstance(statement.body, cst.IndentedBlock) else []
        for candidate in candidates:
            if isinstance(candidate, cst.SimpleStatementLine) and any(sets_up(s, name) for s in candidate.body):
                found = candidate
    return found


def attribute_site(context, loop: cst.CSTNode, expression: str) -> cst.CSTNode | None:
    """For `self.model`: the statement of the class that assigns it, as the loop or a method
    of the class around it reads it."""
    node = _attribute_read(context, loop, expression)
    values = context.kinds.attribute_values(node) if node is not None else None
    return context.index.statement_of(values[-1]) if values else None


def _attribute_read(context, loop: cst.CSTNode, expression: str) -> cst.Attribute | None:
    """A read of the attribute `self.model` in the class around `loop` whose values can be told."""
    classdef = context.index.first_enclosing(loop, cst.ClassDef)
    return next(
        (
            node
            for node in context.index.find(cst.Attribute, within=classdef or loop)
            if context.source(node) == expression and context.kinds.attribute_values(node)
        ),
        None,
    )


def built_in_outer_loop(context, loop: cst.CSTNode, name: str) -> cst.CSTNode | None:
    """The loop around `loop` (in its function) whose body binds `name` before it."""
    child = loop
    for ancestor in context.index.ancestors(loop):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(ancestor, cst.IndentedBlock):
            owner = context.parents.get(ancestor)
            if isinstance(owner, (cst.For, cst.While)):
                body = list(ancestor.body)
                if any(name in context.bound_in(s) for s in body[: body.index(child)]):
                    return owner
        child = ancestor
    return None


def unbuilt_reason(context, loop: cst.CSTNode, name: str) -> str:
    """Why the model `name` has no statement before the loop to compile it after, from
    where the training code's scope finds it (what follows "`model` could be compiled, but")."""
    function = context.index.first_enclosing(loop, cst.FunctionDef)
    params = [] if function is None else [*function.params.posonly_params, *function.params.params]
    position = next((i for i, p in enumerate(params) if p.name.value == name), None)
    if position == 0 and context.kinds.class_of(function) is not None:
        direct = any(
            m.matches(call.func, m.Attribute(value=m.Name(name), attr=m.Name("forward")))
            for call in own_calls(context, loop)
        )
        return (
            f"`{function.name.value}` trains the module it is a method of; add `.compile()` where each "
            "instance is built"
            + (f", and call `{name}(...)`: a call of `.forward` bypasses the compiled module" if direct else "")
        )
    if position is not None:
        how = "is given it"
    elif function is not None and name not in context.bound_in(function.body):
        how = "reads it as a global"
    else:
        again = built_in_outer_loop(context, loop, name)
        if again is not None:
            return (
                f"it is built anew on every pass of the loop at line {context.line(again)}: each new module "
                "would be compiled again"
            )
        built = context.bound_in_compound(name, loop)
        if built is None:
            return (
                "perfmod finds no one statement before the loop that builds it; add "
                f"`{name}.compile()` where it is built and moved"
            )
        return (
            f"it is built inside the `{compound_keyword(built)}` statement at line {context.line(built)}, "
            "not by a statement of its own before the loop; add "
            f"`{name}.compile()` after that statement"
        )
    return (
        f"it is built outside the function that trains it (which {how}); add `{name}.compile()` where "
        "it is built and moved"
    )


def _passed_modules(context, loop: cst.CSTNode, calls) -> list[str]:
    """Parameters of the training function called in the loop that a caller in this file
    gives a model (`train(net, opt)` with `net = nn.Linear(...)`; not a loss module)."""
    function = context.index.first_enclosing(loop, cst.FunctionDef)
    if function is None:
        return []
    params = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
    called = {call.func.value for call in calls if isinstance(call.func, cst.Name)} & set(params)
    found = []
    for call in context.index.find(cst.Call):
        if not (isinstance(call.func, cst.Name) and call.func.value == function.name.value):
            continue
        args = [a for a in call.args if a.keyword is None and not a.star]
        for position, name in enumerate(params):
            if (
                name in called
                and position < len(args)
                and context.training.is_model(args[position].value)
                and name not in found
            ):
                found.append(name)
    return found


def _blocks_out(context, node: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, int]]:
    """(block, index of the statement holding `node`) for each block around `node`,
    innermost first, up to the function or module."""
    parents = context.parents
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, (cst.IndentedBlock, cst.Module)):
            yield parent, list(parent.body).index(child)
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return
        child, parent = parent, parents.get(parent)


def sets_up(small: cst.BaseSmallStatement, name: str) -> bool:
    """`name = ...`, `name: T = ...`, or `name.method(...)` that moves or loads it (`.to(device)`,
    `.cuda()`, `.load_state_dict(...)`); not a mode switch (`.train()`, `.eval()`)."""
    if isinstance(small, cst.Assign):
        return any(_binds(t.target, name) for t in small.targets)
    if isinstance(small, cst.AnnAssign):
        return m.matches(small.target, m.Name(name)) and small.value is not None
    return (
        isinstance(small, cst.Expr)
        and m.matches(small.value, m.Call(func=m.Attribute(value=m.Name(name))))
        and small.value.func.attr.value in MODULE_SET_UP_METHODS
    )


def _binds(target: cst.BaseExpression, name: str) -> bool:
    if isinstance(target, cst.Name):
        return target.value == name
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(_binds(e.value, name) for e in target.elements)
    return False

"""Does a forward compile to one reused graph? The one place that answers it, for a
network class (`forward_of`), a function or method and the helpers of its file it calls,
an `nn.Sequential(...)` of layers, the calls a training step runs a model's forward
through (`compile_break`), and the file around them (`file_obstacles`).

A forward compiles to one graph that torch.compile reuses on every call when dynamo
reads it whole and nothing in it changes from one call to the next:
- no graph break: no recurrent layer or sparse tensor (torch's table, `COMPILE_BREAKS`),
  no value read to the host (`.item()`, `.tolist()`), no Python branch on a tensor's
  values (`if x.sum() > 0:`), no hook registered in it;
- no recompile: no write to the module's own state (`self.calls += 1`, an in-place update
  of a buffer), which changes what the graph was specialised on.

A random draw (dropout, `torch.randn_like`, `bernoulli`) compiles, but the compiled code
draws its own numbers, equally random and not the eager ones: it is a separate fact
(`Forward.draws`), an obstacle only where the same numbers are owed (a network compiled
in place behind the user's back). Double backward (`create_graph=True`) is not supported
by torch.compile at all; it is a fact of the file (`file_obstacles`).

Where the model cannot be compiled, what else may be: the functions of the file that
compute a step's loss (`computes_loss`, `loss_functions`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis.hook_sites import hook_sites
from codemod.analysis.loops import own_nodes
from codemod.analysis.names import is_self, kwarg, method_name, methods_of, positional, sole_definition
from codemod.analysis.sizes import sizes_of
from codemod.analysis.step_models import calls_model, own_calls
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.torch_facts import (
    COMPILE_BREAK_FUNCTIONS,
    COMPILE_BREAK_METHODS,
    COMPILE_BREAKS,
    DROP_PROBABILITY,
    FORWARD_DRAW_METHODS,
    FORWARD_DRAWS,
    GRAD_FREE_CONTEXTS,
    HOOK_REGISTRATIONS,
    METADATA_ATTRIBUTES,
    METADATA_METHODS,
    MODULE_CONTAINERS,
    MODULE_SET_UP_METHODS,
    ONE_OPERATOR_LAYERS,
    RANDOM_FUNCTIONS,
    RANDOM_METHODS,
    RANDOM_MODULES,
    REDUCING_FUNCTIONS,
    REDUCING_METHODS,
    SYNC_METHODS,
    TORCH_COMPILERS,
)
from codemod.analysis.torch_ops import METHOD, OPS, Category

# Matrix products and convolutions: compiled, each stays one cuBLAS or cuDNN call, and
# torch.compile fuses nothing into it (recurrent layers are left to eager mode altogether).
LIBRARY_PRODUCTS = (Category.MATMUL, Category.CONVOLUTION)

if TYPE_CHECKING:
    from codemod.context import FileContext

MAX_DEPTH = 4  # network classes followed into the networks they build
# What a branch test may read without reading a tensor's values: its metadata (torch_facts),
# a module's mode, and Python's questions about a value's length and type.
_SHAPE_ATTRIBUTES = METADATA_ATTRIBUTES | {"training"}
_SHAPE_FUNCTIONS = {"len", "isinstance", "hasattr", "callable", "type"}


class Forward(NamedTuple):
    """What torch.compile makes of a forward."""

    obstacle: str | None  # why it does not compile to one reused graph; None: it does
    first: str | None  # the first obstacle or random draw, in the order the code is read

    @property
    def draws(self) -> str | None:
        """The random draw of a forward that compiles: compiled code draws other numbers."""
        return self.first if self.obstacle is None else None


def forward_of(context: FileContext, network: cst.ClassDef | cst.FunctionDef | cst.Call) -> Forward:
    """Does the forward of `network` compile to one reused graph: a class of `context`'s
    module (its `forward`, the methods it calls, the helper functions of the file they
    call, the network classes of the project it builds), a function (with its helpers), a
    method (with the methods of its class and the helpers it calls), or an
    `nn.Sequential(...)` call of torch layers and project classes?"""
    first = _obstacle(context, network, True)
    # The walk that counts random draws sees everything the other does: without one, neither finds any.
    return Forward(_obstacle(context, network, False) if first is not None else None, first)


def _obstacle(context, network, random: bool) -> str | None:
    if isinstance(network, cst.FunctionDef):  # a method reads the methods of its class it calls
        owner = context.kinds.class_of(network)
        own = methods_of(owner) if owner is not None else {}
        name = owner.name.value if owner is not None else network.name.value
        return _functions_obstacle(context, name, own, [network], random, set())
    return _forward_obstacle(context, network, set(), 0, random)


def _forward_obstacle(context, network, seen: set[int], depth: int, random: bool) -> str | None:
    if id(network) in seen:
        return None
    seen.add(id(network))
    if isinstance(network, cst.Call):
        return _layers_obstacle(context, network, seen, depth, random)
    name = network.name.value
    own = methods_of(network)
    if "forward" not in own:
        return f"`{name}` has no forward perfmod can read"
    for site in hook_sites(context):
        if site.owner is network:
            return f"`{name}` registers hooks ({_at(context, site.call)})"
    reason = _functions_obstacle(context, name, own, [own["forward"]], random, set())
    if reason is not None:
        return reason
    if depth >= MAX_DEPTH:
        return f"`{name}` builds networks deeper than perfmod follows"
    for call in context.index.find(cst.Call, within=network):
        names = context.names.of(call.func)
        if names & MODULE_CONTAINERS or any(n.startswith("torch.") for n in names):
            continue
        found = _class(context, call.func)
        if found is not None:
            reason = _forward_obstacle(found[0], found[1], seen, depth + 1, random)
            if reason is not None:
                return reason
    return None


def _functions_obstacle(context, name: str, own: dict, todo: list, random: bool, done: set[int]) -> str | None:
    """The first obstacle in the functions `todo` and in what they call: the methods of the
    class (`own`) through `self`, the functions of the file by name."""
    while todo:
        function = todo.pop()
        if id(function) in done:
            continue
        done.add(id(function))
        method = own.get(function.name.value) is function
        where = f"`{name}.{function.name.value}`" if method else f"`{function.name.value}`"
        reason = _code_obstacle(context, where, function, random)
        if reason is not None:
            return reason
        for call in context.index.find(cst.Call, within=function):
            func = call.func
            if isinstance(func, cst.Attribute) and is_self(func.value) and func.attr.value in own:
                todo.append(own[func.attr.value])
            helper = sole_definition(context.scopes, func, cst.FunctionDef)
            if helper is not None and context.index.first_enclosing(helper, cst.ClassDef) is None:
                todo.append(helper)  # a function of the module, read where it is defined
    return None


def _layers_obstacle(context, sequential: cst.Call, seen: set[int], depth: int, random: bool) -> str | None:
    """Why the layers of `nn.Sequential(...)` (torch layers, or classes of the project) do not
    compile to one reused graph; None when they do."""
    for call in context.index.find(cst.Call, within=sequential):
        if call is sequential:
            continue
        names = context.names.of(call.func)
        if random and (names & RANDOM_MODULES or names & RANDOM_FUNCTIONS):
            return f"`{context.source(call.func)}` draws random numbers ({_at(context, call)}), which compiled code draws differently"
        if names & COMPILE_BREAK_FUNCTIONS:
            return f"the graph breaks at `{context.source(call.func)}` ({_at(context, call)})"
        if any(n.startswith("torch.") for n in names):
            continue
        found = _class(context, call.func)
        if found is None:
            if context.index.first_enclosing(call, cst.Call) is sequential:
                return f"perfmod cannot read the layer `{context.source(call.func)}` ({_at(context, call)})"
            continue  # an argument of a torch layer (`int(d)`)
        reason = _forward_obstacle(found[0], found[1], seen, depth + 1, random)
        if reason is not None:
            return reason
    return None


def _code_obstacle(context, where: str, function: cst.FunctionDef, random: bool) -> str | None:
    for call in context.index.find(cst.Call, within=function):
        names = context.names.of(call.func)
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        torch_method = method is not None and not any(not n.startswith("torch.") for n in names)
        if random and (names & RANDOM_FUNCTIONS or torch_method and method in RANDOM_METHODS):
            return f"{where} draws random numbers ({_at(context, call)}), which compiled code draws differently"
        if (
            method in SYNC_METHODS
            and method not in ("cpu", "to")
            or names & COMPILE_BREAK_FUNCTIONS
            or method in COMPILE_BREAK_METHODS
        ):
            return f"{where} breaks the graph at `{context.source(call.func)}` ({_at(context, call)})"
        if method in HOOK_REGISTRATIONS:
            return f"{where} registers hooks ({_at(context, call)})"
        if (
            method is not None
            and method.endswith("_")
            and not method.startswith("_")
            and _rooted_at_self(call.func.value)
        ):
            return f"{where} changes the module's state in place ({_at(context, call)}): it recompiles"
    for node in context.index.find((cst.Assign, cst.AugAssign, cst.AnnAssign), within=function):
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        if any(_rooted_at_self(t) for t in targets):
            return f"{where} writes the module's state ({_at(context, node)}): it recompiles for every new value"
    for node in context.index.find((cst.If, cst.While, cst.IfExp, cst.Assert), within=function):
        if _reads_values(context, node.test, function):
            return (
                f"{where} branches on a tensor's values ({_at(context, node)}): dynamo breaks "
                "the graph there and runs the rest in eager mode"
            )
    return None


def _reads_values(context, test: cst.BaseExpression, function: cst.FunctionDef) -> bool:
    """Does the branch test `test` read a value the function computes or is given (not
    `self.<flag>`, a constant, or what a tensor's shape, dtype or device says)?"""
    params = [*function.params.posonly_params, *function.params.params]
    if params and params[0].name.value in ("self", "cls"):
        params = params[1:]
    locals_ = {p.name.value for p in params} | {
        t.target.value
        for node in context.index.find(cst.Assign, within=function)
        for t in node.targets
        if isinstance(t.target, cst.Name)
    }

    def reads(expr: cst.CSTNode) -> bool:
        if isinstance(expr, cst.Name):
            return expr.value in locals_
        if isinstance(expr, cst.Attribute):
            return expr.attr.value not in _SHAPE_ATTRIBUTES and reads(expr.value)
        if isinstance(expr, cst.Call):
            func = expr.func
            if isinstance(func, cst.Attribute) and func.attr.value in METADATA_METHODS:
                return False
            if isinstance(func, cst.Name) and func.value in _SHAPE_FUNCTIONS:
                return False
        if isinstance(expr, cst.Comparison) and all(
            isinstance(c.operator, (cst.Is, cst.IsNot)) for c in expr.comparisons
        ):
            return False
        return any(reads(child) for child in expr.children)

    return reads(test)


# -- a model's forward as a training step runs it ------------------------------------------


def compile_break(context: FileContext, calls) -> tuple[cst.Call, str] | None:
    """A call that `calls` run (read as `Training.multiplies_matrices` reads a step, into the
    models' classes and the functions of this file) where torch.compile breaks its graph and
    runs eager code (a recurrent layer, a sparse tensor), and why; None when none is seen.
    Ask it with the calls that run one model's forward to learn about that model."""
    call = context.training.first_run(calls, COMPILE_BREAK_FUNCTIONS, COMPILE_BREAK_METHODS)
    if call is None:
        return None
    names = context.names.of(call.func)
    reason = next((COMPILE_BREAKS[n] for n in sorted(names) if n in COMPILE_BREAKS), None)
    if reason is None and isinstance(call.func, cst.Attribute):
        reason = COMPILE_BREAKS.get(f"Tensor.{call.func.attr.value}")
    return (call, reason) if reason is not None else None


def model_break(context: FileContext, loop, name: str) -> tuple[cst.Call, str] | None:
    """Where the forward of the model `name`, as the training loop `loop` calls it, breaks
    torch.compile's graph (`compile_break`)."""
    calls = own_calls(context, loop.loop)
    return compile_break(context, [c for c in calls if calls_model(context, c, name)])


def _builds(context: FileContext, anchor: cst.CSTNode, name: str) -> list[cst.Call] | None:
    """The calls that build the model `name` at the statement `anchor` (where it is built or
    moved), through `.to(device)` and DDP wrappers; None when it may hold anything else."""
    named = [n for n in context.index.find((cst.Name, cst.Attribute), within=anchor) if context.source(n) == name]
    built = sizes_of(context).values(named[0]) if named else None
    if not built or not all(isinstance(value, cst.Call) for value in built):
        return None
    return built


def lone_layer(context: FileContext, anchor: cst.CSTNode, name: str) -> str | None:
    """The `torch.nn` layer the model `name` holds at the statement `anchor` (where it is
    built or moved), when it is one whose forward is a single operator of torch
    (`nn.Linear`, a convolution, `nn.EmbeddingBag`), through `.to(device)` and DDP wrappers:
    compiled alone, it has nothing to fuse; None when it may hold anything else."""
    built = _builds(context, anchor, name)
    if built is None:
        return None
    layers = set()
    for value in built:
        found = context.names.of(value.func) & ONE_OPERATOR_LAYERS
        if not found:
            return None
        layers |= found
    return min(layers).removeprefix("torch.nn.")


def layer_chain(context: FileContext, anchor: cst.CSTNode, name: str) -> str | None:
    """The torch layers of the model `name` (built or moved at the statement `anchor`), as a
    message names them, when its forward leaves torch.compile nothing to fuse: it runs
    torch operations one after another (the layers of an `nn.Sequential`, or a class of
    this file whose `forward` only assigns and returns calls of its layers and of torch
    functions), and of any two that meet, one is a matrix product or convolution that stays
    a cuBLAS or cuDNN call when compiled (`LIBRARY_PRODUCTS`; views between them are free).
    Compiled, such a model runs the same kernels. None when it may run anything else."""
    built = _builds(context, anchor, name)
    if built is None:
        return None
    chain = _Chain(context)
    if any(chain.network(value, fusible=False) is None for value in built):
        return None
    layers = [f"`nn.{layer.removeprefix('torch.nn.')}`" for layer in dict.fromkeys(chain.layers)]
    if not layers or not chain.products:
        return None  # no product: a lone norm, or activations only, is another story
    return layers[0] if len(layers) == 1 else f"{', '.join(layers[:-1])} and {layers[-1]}"


class _Chain:
    """Follows a value through a forward: `True` where the last operation that made it is
    one torch.compile could fuse with the next (elementwise math, a norm, pooling, a
    dropout), `False` where it is a library product (or the forward's input), None where
    the forward does something this reading does not follow."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.layers: list[str] = []  # the `torch.nn` layers met, in order
        self.products = 0  # how many library products it runs

    def network(self, call: cst.Call, fusible: bool) -> bool | None:
        names = self.context.names.of(call.func)
        if "torch.nn.Sequential" in names:
            for arg in call.args:
                if arg.keyword is not None or arg.star or not isinstance(arg.value, cst.Call):
                    return None
                fusible = self.network(arg.value, fusible)
                if fusible is None:
                    return None
            return fusible
        classdef = self.context.kinds.local_class(call.func)
        if classdef is not None:
            return self._forward(classdef, fusible)
        layer = next((n for n in sorted(names) if n.startswith("torch.nn.") and n in OPS), None)
        if layer is not None:
            self.layers.append(layer)
        return self._operation(layer, fusible)

    def _operation(self, qualified: str | None, fusible: bool) -> bool | None:
        op = OPS.get(qualified) if qualified is not None else None
        if op is None or op.category is Category.RECURRENT or op.compile_breaks:
            return None
        if op.category in LIBRARY_PRODUCTS:
            self.products += 1
            return False
        if op.category in (Category.VIEW, Category.METADATA):
            return fusible
        return None if fusible else True  # two operations compile would fuse into one kernel

    def _forward(self, classdef: cst.ClassDef, fusible: bool) -> bool | None:
        forward = methods_of(classdef).get("forward")
        if forward is None or not all(self.context.names.is_(b.value, "torch.nn.Module") for b in classdef.bases):
            return None
        params = forward.params
        if params.star_arg is not cst.MaybeSentinel.DEFAULT or params.star_kwarg is not None:
            return None
        held = {param.name.value: fusible for param in params.params[1:]}
        body = forward.body.body
        for position, statement in enumerate(body):
            if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                return None
            small = statement.body[0]
            if position == 0 and isinstance(small, cst.Expr) and isinstance(small.value, cst.SimpleString):
                continue  # the docstring
            if isinstance(small, cst.Return) and small.value is not None and position == len(body) - 1:
                return self._value(small.value, held)
            if not (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
            ):
                return None
            value = self._value(small.value, held)
            if value is None:
                return None
            held[small.targets[0].target.value] = value
        return None

    def _value(self, expr: cst.BaseExpression, held: dict[str, bool]) -> bool | None:
        if isinstance(expr, cst.Name):
            return held.get(expr.value)
        if isinstance(expr, (cst.Integer, cst.Float)):
            return False
        if isinstance(expr, cst.BinaryOperation) and not isinstance(expr.operator, cst.MatrixMultiply):
            operands = [self._value(expr.left, held), self._value(expr.right, held)]
            return None if None in operands or any(operands) else True
        if not isinstance(expr, cst.Call) or any(arg.star for arg in expr.args):
            return None
        func = expr.func
        if isinstance(func, cst.Attribute) and is_self(func.value):
            return self._submodule_call(expr, held)
        qualified = next((n for n in sorted(self.context.names.of(func)) if n in OPS), None)
        if qualified is not None:
            return self._function_call(expr, qualified, held)
        if isinstance(func, cst.Attribute) and METHOD + func.attr.value in OPS:
            return self._method_call(expr, held)
        return None

    def _submodule_call(self, call: cst.Call, held: dict[str, bool]) -> bool | None:
        """`self.fc1(x)`: the network `__init__` assigned to the attribute, given `x`."""
        if len(call.args) != 1 or call.args[0].keyword is not None:
            return None
        parts = sizes_of(self.context).values(call.func)
        given = self._value(call.args[0].value, held)
        if given is None or not parts or len(parts) != 1 or not isinstance(parts[0], cst.Call):
            return None
        return self.network(parts[0], given)

    def _function_call(self, call: cst.Call, qualified: str, held: dict[str, bool]) -> bool | None:
        """`F.relu(x)`, `torch.flatten(x, 1)`: its tensors are its positional arguments, its
        keywords settings written out."""
        if not all(_literal(arg.value) for arg in call.args if arg.keyword is not None):
            return None
        given = [self._value(arg.value, held) for arg in call.args if arg.keyword is None]
        if not given or None in given:
            return None
        return self._operation(qualified, any(given))

    def _method_call(self, call: cst.Call, held: dict[str, bool]) -> bool | None:
        """`x.relu()`, `x.view(x.size(0), -1)`: a tensor's method, given sizes only."""
        op = OPS[METHOD + call.func.attr.value]
        given = self._value(call.func.value, held)
        if given is None or op.category is Category.METADATA:
            return None
        if not all(self._shape_argument(arg.value, held) for arg in call.args):
            return None
        return self._operation(op.name, given)

    def _shape_argument(self, expr: cst.BaseExpression, held: dict[str, bool]) -> bool:
        """A size a view is given: a number, or a size of a tensor of the forward (`x.size(0)`)."""
        if _literal(expr):
            return True
        if isinstance(expr, cst.UnaryOperation):
            return _literal(expr.expression)
        if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
            return False
        op = OPS.get(METHOD + expr.func.attr.value)
        return op is not None and op.category is Category.METADATA and self._value(expr.func.value, held) is not None


def _literal(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)) or (
        isinstance(expr, cst.Name) and expr.value in ("True", "False", "None")
    )


class Draw(NamedTuple):
    """Why compiling a model would draw other random numbers than eager mode."""

    what: str  # the draw, as the message names it: `Dropout`, or the class that may run one
    known: bool = True  # False: a class of another module that perfmod could not read whole


def model_draw(context: FileContext, loop, name: str) -> Draw | None:
    """The random draw that compiling the model `name` would make draw other numbers: the
    first one its forward runs as the training loop `loop` calls it (read as `model_break`
    reads it), also in a class of another module of the project it is built from (read
    there); where a part of the forward cannot be read: that class, or else the first draw
    of the file outside the training loops' own code (that part may run it). A draw the
    loop makes itself (noise added to the data) runs in eager mode, compiled model or not;
    a dropout whose probability is zero draws nothing."""
    calls = [c for c in own_calls(context, loop.loop) if calls_model(context, c, name)]
    verdict, found = context.training.run_verdict(
        calls, FORWARD_DRAWS, FORWARD_DRAW_METHODS, lambda c: _draws(context, c)
    )
    if found is not None or verdict is False and calls:
        return _named(context, found) if found is not None else None  # every part of the forward was read
    elsewhere = _project_class(context, loop, name)
    if elsewhere is not None:
        other, classdef = elsewhere
        verdict, found = other.training.run_in(
            classdef, FORWARD_DRAWS, FORWARD_DRAW_METHODS, lambda c: _draws(other, c)
        )
        if found is not None:
            return _named(other, found)
        if verdict is False:
            return None  # read whole where it is defined: no draw
        return Draw(classdef.name.value, known=False)
    eager = {id(call) for training in context.training.loops for call in own_calls(context, training.loop)}
    draw = next((call for call in file_obstacles(context).draws if id(call) not in eager), None)
    return _named(context, draw) if draw is not None else None


def _named(context, call: cst.Call) -> Draw:
    return Draw(context.source(call.func).rsplit(".", 1)[-1])


def _project_class(context, loop, name: str) -> tuple[FileContext, cst.ClassDef] | None:
    """The class of another module of the project that the model `name` is built from, and
    the context of its module."""
    from codemod.analysis.project import project_of
    from codemod.analysis.step_models import caller_anchor

    function = context.index.first_enclosing(loop.loop, cst.FunctionDef)
    scope = function if function is not None else context.module
    given = caller_anchor(context, loop.loop, name)
    if given is not None:
        scope, name = given.anchor, given.name
    for node in context.index.find(cst.Name, within=scope):
        if node.value != name or not isinstance(context.parents.get(node), cst.AssignTarget):
            continue
        for value in context.loops.values_of(node) or ():
            while isinstance(value, cst.Call) and method_name(value) in MODULE_SET_UP_METHODS:
                value = value.func.value
            found = project_of(context).class_of(value.func) if isinstance(value, cst.Call) else None
            if found is not None:
                return found
    return None


# -- the file around the forward -------------------------------------------------------------


class FileObstacles(NamedTuple):
    """What a file does that bears on compiling a model it trains."""

    compiled: bool  # it compiles something already (`torch.compile`, any alias; `.compile()` of a module)
    hook: cst.Call | None  # a module hook registration (dynamo traces it, and recompiles when it changes)
    double_backward: cst.Call | None  # a call with `create_graph=True`: torch.compile cannot differentiate twice
    draw: cst.Call | None  # a random draw of the kind a forward makes (dropout, `bernoulli`, `randn_like`)
    draws: tuple[cst.Call, ...] = ()  # every such draw, in the order of the file


def file_obstacles(context: FileContext) -> FileObstacles:
    """What the file of `context` does that bears on compiling a model it trains (built once)."""
    return context.shared("compilability.file", _file_obstacles)


def _file_obstacles(context) -> FileObstacles:
    calls = context.index.find(cst.Call)
    draws = tuple(c for c in calls if _draws(context, c))
    return FileObstacles(
        _compiled_already(context),
        next((c for c in calls if method_name(c) in HOOK_REGISTRATIONS), None),
        next((c for c in calls if any(_creates_graph(a) for a in c.args)), None),
        draws[0] if draws else None,
        draws,
    )


def _creates_graph(arg: cst.Arg) -> bool:
    return (
        arg.keyword is not None
        and arg.keyword.value == "create_graph"
        and isinstance(arg.value, cst.Name)
        and arg.value.value == "True"
    )


def _draws(context, call: cst.Call) -> bool:
    names = context.names.of(call.func)
    if names & FORWARD_DRAWS:
        return not _drops_nothing(context, call, names)
    return method_name(call) in FORWARD_DRAW_METHODS and not context.names.startswith(call.func, ("numpy", "random"))


def _drops_nothing(context, call: cst.Call, names: set[str]) -> bool:
    """A dropout whose probability is zero (`nn.Dropout(0.0)`, `F.dropout(x, p=0.0)`, a config
    field whose every value is 0): torch returns its input and draws nothing."""
    where = next((DROP_PROBABILITY[n] for n in sorted(names) if n in DROP_PROBABILITY), None)
    if where is None:
        return False
    position, keyword = where
    arg = kwarg(call, keyword) or positional(call, position)
    if arg is None:
        return False  # torch's default, 0.5
    return context.training.numbers(arg.value) == frozenset({0.0})


def _compiled_already(context) -> bool:
    names, index, module = context.names, context.index, context.module
    # torch.compile is spelled `torch.compile` (any alias of torch) or imported by name
    # (`from torch import compile as jit`): only those nodes need a qualified-name look-up.
    for node in index.find(cst.ImportFrom):
        if (
            node.module is not None
            and not node.relative
            and module.code_for_node(node.module) == "torch"
            and not isinstance(node.names, cst.ImportStar)
            and any(_last_name(alias.name) == "compile" for alias in node.names)
        ):
            return True
    for node in index.find(cst.Attribute):
        if node.attr.value == "compile" and names.is_(node, *TORCH_COMPILERS):
            return True
    models = {model.expression for loop in context.training.loops for model in loop.models}
    return any(
        method_name(call) == "compile"
        and (
            module.code_for_node(call.func.value) in models
            # a module compiled in place (`model.encoder.compile()`, `net.compile()`), not `re.compile`
            or not call.args
            and all(n.startswith("torch.") for n in names.of(call.func))
        )
        for call in index.find(cst.Call)
        if isinstance(call.func, cst.Attribute)
    )


# -- a loss function, compiled on its own -----------------------------------------------------


def computes_loss(context: FileContext, function: cst.FunctionDef) -> bool:
    """Does `function` compute a loss value: call a torch loss or reduction (`F.kl_div`,
    `.mean()`, `torch.sum`) outside `torch.no_grad()`, and run no model (whose compile
    covers it) and no double backward?"""
    calls = own_nodes(context.index, cst.Call, function.body)
    training = context.training
    if any(training.is_model_call(c) for c in calls if not context.names.startswith(c.func, ("torch",))):
        return False
    if any(_creates_graph(a) for c in context.index.find(cst.Call, within=function) for a in c.args):
        return False
    for call in calls:
        names = context.names.of(call.func)
        reduces = bool(names & REDUCING_FUNCTIONS) or (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value in REDUCING_METHODS
            and not any(n.startswith(("torch.", "numpy.", "builtins.")) for n in names)
        )
        if reduces and not _without_grad(context, call, function):
            return True
    return False


def loss_functions(context: FileContext, loss: cst.BaseExpression) -> list[cst.FunctionDef]:
    """The functions of this file, other than a `forward`, that compute `loss`
    (`computes_loss`): called in its expression, or in the values its names hold, two
    assignments back (`loss = criterion(out, y)` with `out = head(h)`), in that order."""
    index = context.index
    sources = [loss]
    frontier = list(sources)
    for _ in range(2):  # the loss, and the values its names hold, two steps back
        found = []
        for source in frontier:
            names = (
                [source]
                if isinstance(source, cst.Name)
                else (index.find(cst.Name, within=source) if source in index else [])
            )
            for name in names:
                value = layouts(context).value_of(name) if name in index else None
                if value is not None and value not in sources:
                    sources.append(value)
                    found.append(value)
        frontier = found
    functions: list[cst.FunctionDef] = []
    for source in sources[:12]:
        for call in index.find(cst.Call, within=source) if source in index else ():
            function = layouts(context).function_of(call)
            if function is None or function in functions or function.name.value == "forward":
                continue
            if computes_loss(context, function):
                functions.append(function)
    return functions


def _without_grad(context, node: cst.CSTNode, function: cst.FunctionDef) -> bool:
    for ancestor in context.index.ancestors(node):
        if ancestor is function:
            return False
        if isinstance(ancestor, cst.With) and any(
            isinstance(item.item, cst.Call) and context.names.is_(item.item.func, *GRAD_FREE_CONTEXTS)
            for item in ancestor.items
        ):
            return True
    return False


# -- helpers ----------------------------------------------------------------------------------


def _rooted_at_self(expr: cst.BaseExpression) -> bool:
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    return is_self(expr)


def _class(context, func) -> tuple[FileContext, cst.ClassDef] | None:
    local = sole_definition(context.scopes, func, cst.ClassDef)
    if local is not None:
        return context, local
    from codemod.analysis.project import project_of

    return project_of(context).class_of(func)


def _at(context, node: cst.CSTNode) -> str:
    """`path:line` of `node`, the path relative to the project's root."""
    from codemod.analysis.project import project_of

    return project_of(context).shown_in(context, node)


def _last_name(node: cst.CSTNode) -> str | None:
    """`c` for `a.b.c` and for `c`."""
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return node.value if isinstance(node, cst.Name) else None

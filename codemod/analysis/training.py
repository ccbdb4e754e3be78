"""Training loops and what they already do: the facts PM301, PM302 and PM402 need.

A *training loop* is the innermost `for` / `while` whose body (not counting
nested function bodies) calls `<loss>.backward()` (or `scaler.scale(loss)
.backward()`) and steps an optimizer (`opt.step()` or `scaler.step(opt)`).
For each one this module finds:

- the optimizers it steps and the calls that build them;
- its backward calls and the loss each one differentiates;
- the *forward region*: the contiguous statements of the block that calls
  `backward()`, from the first statement that runs the model up to and
  including the last one that binds the loss, or why there is none;
- gradient accumulation (a division of the loss, a `% accum` guard around the
  step, or an inner micro-step loop) and gradient clipping calls;
- what is already there: autocast in any spelling, a GradScaler, a model made
  float64;
- the models it trains and the device expression each is moved to.

What counts as a model: a name whose Kinds fact is MODULE, and any expression
whose `.parameters()` / `.named_parameters()` the file reads or that it moves
with a bare `x.to(device)` / `x.cuda()` statement (only modules move in place;
a tensor's `.to` returns a copy). That covers `self.model` in trainer classes
and models imported from the user's own packages, which Kinds cannot see into.
"""

from __future__ import annotations

import builtins
import enum
import functools
import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst
from libcst.metadata import Assignment

from codemod.analysis.bindings import passed_by
from codemod.analysis.names import (
    dict_entry,
    is_main_guard,
    is_self,
    kwarg,
    method_name,
    names_read,
    number_value,
    positional,
)
from codemod.analysis.periodic import periodic
from codemod.analysis.project import project_of
from codemod.analysis.torch_facts import (
    ACCELERATOR_METHODS,
    ACCELERATOR_NAMESPACES,
    ACCELERATOR_WORDS,
    AUTOCAST_NAMES,
    CLIP_NAMES,
    CUDA_PROBES,
    DEVICE_KEYWORDS,
    DEVICE_SYNCHRONIZES,
    DOUBLE_TENSOR_TYPES,
    DTYPE_NAMES,
    ENVIRONMENT_READS,
    FINITENESS_METHODS,
    FINITENESS_TESTS,
    FLOAT16_NAMES,
    FLOAT32_MATMULS,
    FLOAT64_NAMES,
    GRAD_FREE_CONTEXTS,
    GRAD_SCALER_NAMES,
    HALF_NAMES,
    HOST_NUMBER_FUNCTIONS,
    HOST_NUMBER_MODULES,
    HOST_ONLY_MODULES,
    MATMUL_PRECISION_SETTINGS,
    MATRIX_PRODUCT_METHODS,
    MATRIX_PRODUCTS,
    MODEL_LOADERS,
    MODEL_WRAPPERS,
    MODULE_CONTAINERS,
    MODULE_METHODS,
    NO_TORCH_MODULES,
    PRECISION_OWNERS,
    REPLACING_ATTRIBUTES,
    RUNTIME_WITHOUT_PRODUCTS,
    SUBMODULE_METHODS,
    SYNC_METHODS,
    TRAINER_PLACED_MODULES,
    module_of_chain,
)
from codemod.analysis.values import DEVICE_STRING, Kind, Place, number_is

if TYPE_CHECKING:
    from codemod.analysis.placement import Placement
    from codemod.context import FileContext

# torch.cuda functions that only ask whether CUDA is there; calling them uses nothing.
# Methods of a module that are not its forward pass.
BUILTIN_NAMES = set(dir(builtins))
SCOPE_BOUNDARIES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
MAX_DEPTH = 6  # how many bindings and wrappers a look-up follows
NO_FORWARD = "no model call before the loss in the block that computes it"
# What a call of a model's method may be known to hand back that no forward pass returns.
NOT_FORWARD_RESULTS = frozenset({Kind.LOADER, Kind.DATASET, Kind.OPTIMIZER, Kind.DEVICE})
MAX_PRODUCT_DEPTH = 24  # classes and functions nested in one search for matrix products
# What `parameter_model_sites` asks about a part that is not a model's parameters.
TensorSites = Callable[
    [cst.BaseExpression, "cst.CSTNode | None"], "list[tuple[cst.BaseExpression, cst.CSTNode | None]] | None"
]


# -- facts -------------------------------------------------------------------------


class _Steering(enum.Enum):
    """What `Training.steers` finds at a node besides where a value steers (a node) or that
    it steers nothing (None): the value passes on, undecided, to the node around it."""

    FLOWS_ON = enum.auto()


class OptimizerBuild(NamedTuple):
    """An optimizer a loop steps, and the call that built it."""

    expression: str  # as the loop spells it: "optimizer", "self.opt"
    call: cst.Call | None  # None when no assignment of this file builds it from a call
    qualified_name: str | None  # "torch.optim.AdamW", aliases resolved; None for other builders
    params: cst.BaseExpression | None  # the first argument (or `params=`) of a torch.optim class


class Backward(NamedTuple):
    call: cst.Call  # the `.backward()` call
    loss: cst.BaseExpression  # what is differentiated, without `scaler.scale(...)` and `/ accum`
    scaled: bool  # through `scaler.scale(...)`
    divisor: cst.BaseExpression | None  # `accum` of `(loss / accum).backward()`
    # The engine whose `.backward(loss)` runs it (`accelerator.backward(loss)`): its
    # construction, which sets the precision of the training (see `precision_owner`).
    owner: cst.Call | None = None


class Step(NamedTuple):
    call: cst.Call  # `opt.step()` or `scaler.step(opt)`
    optimizer: cst.BaseExpression
    scaled: bool  # through `scaler.step(...)`


class Accumulation(NamedTuple):
    """Gradient accumulation: several backward passes per optimizer step."""

    steps: cst.BaseExpression | None  # the count as written (`accum`), where one is visible
    division: cst.CSTNode | None  # `loss = loss / accum`, `loss /= accum` or the `/` in the backward
    step_guard: cst.If | None  # `if (i + 1) % accum == 0:` around the step
    micro_loop: cst.For | cst.While | None  # an inner loop of backward passes before one step


class ForwardRegion(NamedTuple):
    """Statements `block.body[first:last + 1]`: from the first model call to the loss."""

    block: cst.IndentedBlock
    first: int
    last: int

    @property
    def statements(self) -> Sequence[cst.BaseStatement]:
        return self.block.body[self.first : self.last + 1]


class Autocast(NamedTuple):
    node: cst.CSTNode  # the `with` statement or decorator that enables it
    form: str  # "call", "context variable", "helper", "imported" or "context passed in"


class Scaler(NamedTuple):
    expression: str  # "scaler"
    call: cst.Call | None  # the constructor call, when this file has one
    qualified_name: str | None  # "torch.amp.GradScaler", ...
    # The script's own compute dtype, when the scaler is built only where it is float16
    # (`GradScaler() if COMPUTE_DTYPE == torch.float16 else None`): the model casts to it.
    compute_dtype: cst.BaseExpression | None = None


class Model(NamedTuple):
    expression: str  # as the code spells it: "model", "self.net"
    move: cst.Call | None  # the last `.to(device)` / `.cuda()` placing it before the loop
    device: cst.BaseExpression | None  # the device argument of `move` (None for `.cuda()` or no move)
    places: frozenset[Place]  # where `move` may put it; empty when it is not moved
    split: bool  # some of its submodules are moved on their own
    float64: cst.CSTNode | None  # what makes its weights float64, if anything visibly does
    half: cst.CSTNode | None = None  # what makes its weights float16 or bfloat16, if anything visibly does
    owner: cst.ClassDef | None = None  # the class on whose `self` a method reads it (`self.net`), if so


class Problem(NamedTuple):
    """Why a fact is missing: a sentence whose line numbers (`{}` in `text`, for
    `nodes`) are looked up only when it is read."""

    text: str
    nodes: tuple[cst.CSTNode, ...] = ()
    line: Callable[[cst.CSTNode], int] | None = None

    def __str__(self) -> str:
        if not self.nodes or self.line is None:
            return self.text
        return self.text.format(*(self.line(node) for node in self.nodes))


class TrainingLoop(NamedTuple):
    loop: cst.For | cst.While
    backwards: tuple[Backward, ...]
    steps: tuple[Step, ...]
    optimizers: tuple[OptimizerBuild, ...]
    forward: ForwardRegion | None
    forward_why: Problem | None  # why `forward` is None
    accumulation: Accumulation | None
    clips: tuple[cst.Call, ...]  # clip_grad_norm_ / clip_grad_value_ calls
    autocast: Autocast | None
    scaler: Scaler | None
    models: tuple[Model, ...]  # those the forward calls first, then those the optimizers train
    float64: cst.CSTNode | None  # a model (or the default dtype) is visibly float64
    half: cst.CSTNode | None = None  # every model it trains is visibly float16 or bfloat16

    @property
    def loss(self) -> cst.BaseExpression:
        return self.backwards[0].loss

    @property
    def forward_problem(self) -> str | None:
        """Why `forward` is None, as a sentence."""
        return str(self.forward_why) if self.forward_why is not None else None

    @property
    def device(self) -> cst.BaseExpression | None:
        """The device expression the first model that is moved is moved to."""
        return next((model.device for model in self.models if model.device is not None), None)


# -- analysis ------------------------------------------------------------------------


class Training:
    """Training loops of one file, with the facts above; computed once."""

    def __init__(self, context: FileContext) -> None:
        self.module = context.module
        self.context = context
        self.kinds = context.kinds
        self.names = context.names
        self.index = context.index
        self.parents = context.parents
        self.steps = context.loops
        self._calls: list[cst.Call] = self.index.find(cst.Call)
        self._device_types: dict[tuple[cst.CSTNode, int, bool], frozenset[str] | None] = {}
        self._float64_constructions: dict[str, cst.CSTNode | None] = {}
        self._products: dict[cst.CSTNode, bool | None] = {}
        self._matmuls: dict[cst.CSTNode, bool | None] = {}
        self._half_calls: dict[str, list[cst.Call]] | None = None
        self._half_builds: dict[str, cst.Call | None] = {}
        self._under: dict[str, tuple[list[cst.Call], dict[cst.Call, str]]] = {}
        self._visibility: dict[tuple[int, bool], tuple[Sequence[cst.Call], dict]] = {}
        self._sites_of_bindings: dict[int, tuple[object, list[tuple[cst.CSTNode, cst.BaseExpression | None]]]] = {}
        self._assignments = self._index_assignments()
        self._model_expressions = self._find_model_expressions()
        self.autocast_uses: list[cst.CSTNode] = [c for c in self._calls if self._is_autocast_call(c)]
        if "set_autocast_enabled" in context.code:
            self.autocast_uses += [
                n
                for n in self.index.find((cst.Name, cst.Attribute))
                if self.names.startswith(n, ("torch.set_autocast_enabled",))
            ]
        self.cuda_use: cst.CSTNode | None = self._first_cuda_use()
        self.default_float64: cst.CSTNode | None = self._default_float64()
        self.exact_float32: cst.CSTNode | None = self._exact_float32()

    @functools.cached_property
    def loops(self) -> list[TrainingLoop]:
        """The training loops of the file, described; worked out when first asked (a pass
        of rules that only ask whether an expression is a model does not need them)."""
        return [self._describe(loop) for loop in self._find_loops()]

    # -- public helpers ------------------------------------------------------------

    @functools.cached_property
    def placement(self) -> Placement:
        """Where an optimizer's parameters live (codemod/analysis/placement.py)."""
        from codemod.analysis.placement import Placement

        return Placement(self.context)

    def code(self, node: cst.CSTNode) -> str:
        return self.steps.code(node)

    def loss_calls(self, loop: TrainingLoop) -> list[cst.Call]:
        """The calls the loss that `loop` differentiates is computed from: the calls in
        its expression and in the values of the bindings that reach it (flow-sensitive,
        so an evaluation loss bound elsewhere is not one of them), through the returns
        of this file's helpers (`loss = compute_loss(model, batch)`), and the
        constructors of the callables it calls (`loss_fn = nn.CrossEntropyLoss(...)`)."""
        found: list[cst.Call] = []
        seen: set[int] = set()
        todo: list[cst.BaseExpression] = [b.loss for b in loop.backwards]
        while todo and len(seen) < 200:
            expr = todo.pop()
            if id(expr) in seen:
                continue
            seen.add(id(expr))
            for call in self.index.find(cst.Call, within=expr):
                found.append(call)
                if self.steps.callee(call) is not None:
                    todo.extend(self.steps.returned(call) or [])
                if isinstance(call.func, cst.Name):
                    todo.extend(self.context.bindings.values(call.func) or [])
                elif isinstance(call.func, cst.Attribute):
                    todo.extend(self.steps.values_of(call.func) or [])
            for name in names_read(expr):
                for assignment in self.kinds.reaching(name):
                    value = self.context.bindings.assigned_value(assignment)
                    unpacked = self.context.bindings.unpacked(assignment) if value is None else None
                    if value is not None or unpacked is not None:
                        todo.append(value if value is not None else unpacked[0])  # all of `a, b = f(...)`
                    statement = self.context.bindings.statement(assignment.node)
                    if isinstance(statement, cst.AugAssign):  # `total += criterion(...)`
                        todo.append(statement.value)
        return found

    def loop_of(self, node: cst.CSTNode) -> TrainingLoop | None:
        """The training loop whose statement is `node` or contains it, else the one
        `node` runs in through calls (a helper the step loop calls)."""
        by_loop = {loop.loop: loop for loop in self.loops}
        for ancestor in [node, *self._ancestors(node)]:
            if ancestor in by_loop:
                return by_loop[ancestor]
        for site in self.steps.runs_in(node):
            if site.loop in by_loop:
                return by_loop[site.loop]
        return None

    def visible_at(self, expr: cst.BaseExpression, statement: cst.CSTNode) -> bool:
        """Can `expr`, written elsewhere, be evaluated right before `statement` with the
        value it has where it is written? Every name it reads must be bound where
        `statement` is: in the same scope, before `statement` and not re-bound
        inside it (and to the same binding as where `expr` is written), or in an
        enclosing scope (a module-level name read in a function, unless it is bound
        only under `if __name__ == "__main__":`, which an import of the module skips)."""
        scopes = self.context.scopes
        here = scopes.get(statement)
        if here is None:
            return False
        for name in names_read(expr):
            visible = set(here[name.value])
            if not visible:
                return False
            if here is not self._module_scope and self._only_under_main_guard(visible):
                return False
            there = scopes.get(name)
            if (
                there is not None
                and visible != set(there[name.value])
                and not self._same_self(visible, set(there[name.value]))
            ):
                return False  # another variable of the same name
            local = [a for a in visible if type(a) is Assignment and a.scope is here]
            if local:
                if any(self.index.inside(a.node, statement) for a in local):
                    return False
                if not any(self._start(a.node) < self._start(statement) for a in local):
                    return False
        return True

    @functools.cached_property
    def _module_scope(self):
        return self.context.scopes.get(self.module.body[0]) if self.module.body else None

    def _only_under_main_guard(self, bindings) -> bool:
        """Are these module-level bindings all made under `if __name__ == "__main__":`?"""
        found = [a for a in bindings if type(a) is Assignment and a.scope is self._module_scope]
        return (
            bool(found)
            and len(found) == len(bindings)
            and all(any(is_main_guard(block.test) for block in self.index.enclosing(a.node, cst.If)) for a in found)
        )

    def defined_before(self, expr: cst.BaseExpression, statement: cst.CSTNode) -> bool:
        """Can `expr` be evaluated right before `statement` with the value it has
        inside it: every variable it reads is bound before `statement`, and none
        is re-bound inside it? (Attributes such as `self.device` are taken as set.)"""
        start = self._start(statement)
        for name in names_read(expr):
            sites = self._every_binding(name)
            if any(self.index.inside(site, statement) for site, _ in sites):
                return False
            if sites and not any(self._start(site) < start for site, _ in sites):
                return False
        return True

    def _same_self(self, first, second) -> bool:
        """Are both bindings the `self` of methods of one class (the same instance)?"""
        classes = set()
        for assignments in (first, second):
            if len(assignments) != 1:
                return False
            node = next(iter(assignments)).node
            params = self.parents.get(node)
            function = self.parents.get(params) if isinstance(params, cst.Parameters) else None
            if (
                not isinstance(node, cst.Param)
                or not isinstance(function, cst.FunctionDef)
                or not params.params
                or params.params[0] is not node
            ):
                return False
            owner = self.parents.get(self.parents.get(function))
            if not isinstance(owner, cst.ClassDef):
                return False
            classes.add(owner)
        return len(classes) == 1

    def is_model(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        """A module with weights to train; loss modules (`nn.CrossEntropyLoss()`) are
        modules to Kinds but hold no parameters, so they are not models here. A
        `self.` attribute assigned a model (`self.model = model`) is one, and so is
        what a module's `.to(device)` / `.cuda()` returns (the module itself), and a wrapper of
        a model (`DistributedDataParallel(self.model)`, `torch.compile(model)`)."""
        if isinstance(expr, cst.Call) and method_name(expr) in ("to", "cuda") and depth < 3:
            return self.is_model(expr.func.value, depth + 1)
        wrapped = self.wrapped_model(expr)
        if wrapped is not None and depth < 3:
            return self.is_model(wrapped, depth + 1)
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return False
        if self.code(expr) in self._model_expressions:
            return True
        if self.kinds.fact(expr).kind is not Kind.MODULE:
            read = self.kinds.parameter_read(expr) if isinstance(expr, cst.Name) and depth < 3 else None
            if read is not None:  # a parameter: what every call of its function (or class) passes
                passed = self.kinds.passed(read[1])
                return bool(passed) and all(self.is_model(value, depth + 1) for value in passed)
            if isinstance(expr, cst.Attribute) and depth < 3:
                others = self._unwrapped(self.steps.values_of(expr), expr)
                return bool(others) and all(self.is_model(v, depth + 1) for v in others)
            return False
        source = self._last_source(expr) if isinstance(expr, cst.Name) else None
        if isinstance(source, cst.Call) and self._is_loss_module(source):
            return False
        return not (isinstance(expr, cst.Name) and self._holds_loss_module(expr))

    def wrapped_model(self, expr: cst.BaseExpression, wrappers: frozenset[str] = MODEL_WRAPPERS):
        """The module a model wrapper of `wrappers` wraps (`DistributedDataParallel(model)`,
        `torch.compile(m)`); None when `expr` is no such call."""
        if not (isinstance(expr, cst.Call) and self.names.of(expr.func) & wrappers):
            return None
        wrapped = kwarg(expr, "module") or kwarg(expr, "model") or positional(expr, 0)
        return wrapped.value if wrapped is not None else None

    def _unwrapped(self, values, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
        """`values` of `expr` but those that wrap `expr` itself (`self.model = DDP(self.model)`
        holds what the other values hold, wrapped)."""
        code = self.code(expr)
        return [v for v in values or () if (wrapped := self.wrapped_model(v)) is None or self.code(wrapped) != code]

    def given_values(self, expr: cst.Attribute) -> list[cst.BaseExpression]:
        """What the attribute `self.model` may hold (`Kinds.attribute_values`), wrappers of itself left out."""
        return self._unwrapped(self.kinds.attribute_values(expr), expr) if isinstance(expr.value, cst.Name) else []

    def init_parameter(self, expr: cst.Attribute) -> cst.Param | None:
        """The parameter of its class's `__init__` whose value the attribute `self.model` holds
        (`self.model = model`), when it holds nothing else (a DDP wrapper of itself aside)."""
        values = self.given_values(expr)
        reads = {self.kinds.parameter_read(v) if isinstance(v, cst.Name) else None for v in values}
        if len(reads) != 1 or None in reads:
            return None
        ((function, param),) = reads
        return param if function.name.value == "__init__" else None

    def _holds_loss_module(self, name: cst.Name, depth: int = 0) -> bool:
        """Does every value `name` may hold come from a loss module's construction (a
        parameter followed to what every call of its function passes; `.to(device)` and
        `.cuda()` return the module itself)?"""
        sources = self.kinds.value_sources(name)
        if not sources or depth > 3:
            return False
        for source in sources:
            while isinstance(source, cst.Call) and method_name(source) in ("to", "cuda"):
                source = source.func.value
            if isinstance(source, cst.Call) and self._is_loss_module(source):
                continue
            if not (isinstance(source, cst.Name) and self._holds_loss_module(source, depth + 1)):
                return False
        return True

    def _is_loss_module(self, call: cst.Call) -> bool:
        return any(n.startswith("torch.nn.") and n.endswith("Loss") for n in self.names.of(call.func))

    def is_model_call(self, call: cst.Call) -> bool:
        """`model(x)`, `model.forward(x)`, `model.loss(x)` (not a method known to return a
        loader, dataset, optimizer or device), or a helper of this file or the user's
        packages that is given the model (`compute_loss(model, b)`)."""
        func = call.func
        if self.is_model(func):
            return True
        if isinstance(func, cst.Attribute) and func.attr.value not in MODULE_METHODS and self.is_model(func.value):
            # a method of the model that hands back something else (`module.train_dataloader()`)
            return self.kinds.fact(call).kind not in NOT_FORWARD_RESULTS
        if self.names.startswith(func, ("torch",)) or self._is_builtin(func):
            return False
        return any(self.is_model(arg.value) for arg in call.args) or self._runs_model(call)

    def _runs_model(self, call: cst.Call, depth: int = 0) -> bool:
        """Does every function of this file `call` may run run a model it reads from an
        enclosing scope or `self` (`encode_fn(texts)` with `def encode_fn(texts): return
        encoder(texts)`, defined once in each branch of an `if`; `self.training_step(batch)`
        whose method calls `self.model(...)`; each callback's method an event runs,
        `TrainingLoops.callees`), recording gradients (not under `@torch.no_grad()` or in a
        `with torch.no_grad():`)?"""
        if depth > 1:
            return False
        if isinstance(call.func, cst.Name):
            functions = [site for site, _ in self._every_binding(call.func)]
        else:
            functions = list(self.steps.callees(call))
        return bool(functions) and all(self._forward_helper(function, depth) for function in functions)

    def _forward_helper(self, function: cst.CSTNode, depth: int) -> bool:
        if not isinstance(function, cst.FunctionDef) or any(self._grad_free(d.decorator) for d in function.decorators):
            return False
        for call in self.steps.own_calls(function.body):
            func = call.func
            runs = self.is_model(func) or self._runs_model(call, depth + 1)
            runs = runs or (
                isinstance(func, cst.Attribute) and func.attr.value not in MODULE_METHODS and self.is_model(func.value)
            )
            if runs and not any(
                isinstance(around, cst.With) and any(self._grad_free(item.item) for item in around.items)
                for around in self.index.enclosing(call, cst.With)
                if self.index.inside(around, function)
            ):
                return True
        return False

    def records_no_graph(self, node: cst.CSTNode) -> bool:
        """Does `node` run where autograd records no graph: in a `with torch.no_grad():` (or
        `torch.inference_mode()`) block, or in a function decorated with one, looked for up
        to the innermost function around it?"""
        for ancestor in self.index.ancestors(node):
            if isinstance(ancestor, cst.With) and any(self._grad_free(item.item) for item in ancestor.items):
                return True
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                decorators = ancestor.decorators if isinstance(ancestor, cst.FunctionDef) else ()
                return any(self._grad_free(d.decorator) for d in decorators)
        return False

    def _grad_free(self, expr: cst.BaseExpression) -> bool:
        """`torch.no_grad()`, `torch.inference_mode()` (or the bare decorator)."""
        return self.names.is_(expr.func if isinstance(expr, cst.Call) else expr, *GRAD_FREE_CONTEXTS)

    def model(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> Model:
        """Where the model `expr` is placed when the code reaches `at` (a loop, an
        optimizer construction), and its dtype. Only calls that `at` can see count:
        those at module level or in a function around it, and for `self.x`
        anywhere in the class. A model that is a parameter of the function around
        `at` is where every call of that function passes it from (`train(model,
        device, loader)` with `model = Net().to(device)` at the call), and the `self` of a
        method is where every call of it on an instance finds that instance
        (`module.configure_optimizers()` after `module = LitLM().to(device)`). A construction
        (`Net()`) is a model of its own: only a move of that very call places it."""
        if isinstance(expr, cst.Call) and (
            self.kinds.local_class(expr.func) is not None or self.names.startswith(expr.func, ("torch.nn.",))
        ):
            return self.moved_by(expr) or Model(self.code(expr), None, None, frozenset(), False, None)
        found = self._model_here(expr, at)
        if found.move is None and isinstance(expr, cst.Name) and depth < MAX_DEPTH:
            passed = self._passed_model(expr, depth)
            if passed is not None:
                return passed
        if found.move is None and isinstance(expr, cst.Attribute) and depth < MAX_DEPTH:
            called = self._model_where_called(expr, at, depth) or self._model_given(expr, depth)
            if called is not None:
                return called
        return found

    def _model_given(self, expr: cst.Attribute, depth: int) -> Model | None:
        """`self.model` that holds only what its class's construction is given (`self.model =
        model` in `__init__`, `Trainer(model, ...)`): the model every construction passes, as
        it is placed there."""
        values = self.given_values(expr)  # (a DDP wrapper of itself leaves it where it was)
        if not values or not all(isinstance(value, cst.Name) for value in values):
            return None
        models = [self._passed_model(value, depth) for value in values]
        if None in models:
            return None
        return self._one_placement(self.code(expr), models)

    def _model_where_called(self, expr: cst.Attribute, at: cst.CSTNode, depth: int) -> Model | None:
        """`self.model` in a method that moves it nowhere before `at`, where every call of the
        method, on `self` in another method of its class, comes after a move of it there
        (`self.model.to(device)`, then `self.create_optimizer()`): the model those moves place,
        when all place it alike."""
        root = expr
        while isinstance(root, cst.Attribute):
            root = root.value
        method = self.index.first_enclosing(at, cst.FunctionDef)
        first = method.params.params[0] if method is not None and method.params.params else None
        if not (isinstance(root, cst.Name) and first is not None and first.name.value == root.value):
            return None
        receivers = self._receivers(first) if self.kinds.self_class(first) is not None else None
        models = []
        for call, receiver in receivers or ():
            caller = self.index.first_enclosing(call, cst.FunctionDef)
            params = caller.params.params if caller is not None else ()
            if not (isinstance(receiver, cst.Name) and params and params[0].name.value == receiver.value):
                return None  # called on another object, or from outside the class
            if self.kinds.self_class(params[0]) is not self.kinds.self_class(first):
                return None
            models.append(self.model(expr, call, depth + 1))
        return self._one_placement(self.code(expr), models)

    def _one_placement(self, code: str, models: list[Model]) -> Model | None:
        """`code`'s model as every one of `models` (what each caller passes or has moved)
        places it, when all place it alike; None otherwise."""
        if not models or any(m.move is None for m in models):
            return None
        devices = {self.code(m.device) if m.device is not None else None for m in models}
        if len(devices) != 1 or len({m.places for m in models}) != 1:
            return None  # placed differently by different callers
        first = models[0]
        return Model(
            code,
            first.move,
            first.device,
            first.places,
            any(m.split for m in models),
            next((m.float64 for m in models if m.float64 is not None), None),
            models[0].half if all(m.half is not None for m in models) else None,
        )

    def _passed_model(self, name: cst.Name, depth: int) -> Model | None:
        sites = [(site, source) for site, source in self._every_binding(name)]
        if len(sites) != 1 or not isinstance(sites[0][0], cst.Param):
            return None
        models = []
        for call, argument in self._receivers(sites[0][0]) or self.kinds.arguments(sites[0][0]) or ():
            if argument is None:
                return None
            models.append(self.model(argument, call, depth + 1))
        return self._one_placement(self.code(name), models)

    def _receivers(self, param: cst.Param) -> list[tuple[cst.Call, cst.BaseExpression | None]] | None:
        """For the first parameter of a method (`self`), each call of the method in this file
        and the instance it is called on (`module` of `module.configure_optimizers()`); None
        for another parameter, or when a call is not on an instance (`Class.method(obj)`)."""
        parameters = self.parents.get(param)
        function = self.parents.get(parameters)
        if not (
            isinstance(parameters, cst.Parameters)
            and isinstance(function, cst.FunctionDef)
            and parameters.params
            and parameters.params[0] is param
            and self.kinds.class_of(function) is not None
            and function.name.value != "__init__"
        ):
            return None
        callers = self.kinds.callers(function)
        if not callers or any(offset != 1 or not isinstance(call.func, cst.Attribute) for call, offset in callers):
            return None
        return [(call, call.func.value) for call, _ in callers]

    def _model_here(self, expr: cst.BaseExpression, at: cst.CSTNode) -> Model:
        code = self.code(expr)
        limit = self._start(at)
        float64 = self._float64_construction(code)
        half = self._half(code, expr, at)
        split = False
        placements = self._placements()
        if code not in self._under:
            found = list(placements.under(code))
            self._under[code] = ([call for call, _ in found], dict(found))
        under, receivers = self._under[code]
        for call in self._visible_calls(under, at, expr):
            receiver = receivers[call]
            if self._moves_device(call):
                # `model.head.to("cuda:1")` moves a submodule in place; `model.pos.to(d)` in an
                # expression copies a tensor attribute and moves nothing.
                statement = self.parents.get(call)
                if isinstance(statement, cst.Expr) or (
                    isinstance(statement, cst.Assign)
                    and any(self.code(t.target) == receiver for t in statement.targets)
                ):
                    split = True
                    break
        for call in self._visible_calls(placements.float64_on.get(code, ()), at, expr):
            float64 = float64 or call
            break
        # The last visible move before `at`; only its device is followed. Of a chain
        # (`Net().to(d).cuda()`, its calls start together) the outer call, listed first.
        acting = placements.acting_on.get(code, ())
        before = bisect_left(placements.starts.get(code, ()), limit)
        call = None
        for candidate in self._visible_calls(acting, at, expr, before, last_first=True):
            if call is not None and self._start(candidate) < self._start(call):
                break
            if self._moves_device(candidate):
                call = candidate
        if call is None:
            return Model(code, None, None, frozenset(), split, float64, half)
        return self._moved_by(call, code, split, float64, half)

    def moved_by(self, call: cst.Call) -> Model | None:
        """The model a move puts where it is made (`nn.Linear(8, 1).to(device)`, a `return
        Net().cuda()` of a builder): placed by `call`, its last link; None when `call` moves
        no module to a device."""
        if not self._moves_device(call):
            return None
        return self._moved_by(call, self.code(call), False, None, None)

    def _moved_by(self, call: cst.Call, code: str, split: bool, float64, half) -> Model:
        method = method_name(call)
        if method == "cuda":
            return Model(code, call, None, frozenset({Place.CUDA}), split, float64, half)
        if method == "cpu":
            return Model(code, call, None, frozenset({Place.HOST}), split, float64, half)
        device = self._device_argument(call)
        return Model(code, call, device, self.device_places(device), split, float64, half)

    def moved_anywhere(self, code: str) -> bool:
        """Whether any call of the file, wherever it runs, moves the model `code` or a
        part of it to a device (`.to(device)`, `.cuda()`, `.cpu()`)."""
        placements = self._placements()
        calls = [*placements.acting_on.get(code, ()), *(call for call, _ in placements.under(code))]
        return any(self._moves_device(call) for call in calls)

    def _placements(self) -> _Placements:
        """The `.to(...)`, `.cuda()`, `.cpu()`, `.double()` and `.type(...)` calls of the
        file, found once: every model query looks through them."""
        found = getattr(self, "_placement_table", None)
        if found is None:
            calls = [c for c in self._calls if method_name(c) in ("to", "cuda", "cpu", "double", "type")]
            acting_on: dict[str, list[cst.Call]] = {}
            for call in calls:  # in the order of the file
                for code in self._acted_on(call):
                    acting_on.setdefault(code, []).append(call)
            receivers = sorted((self.code(c.func.value), self._start(c), c) for c in calls)
            found = self._placement_table = _Placements(
                [r for r, _, _ in receivers],
                [(c, r) for r, _, c in receivers],
                acting_on,
                {code: [self._start(c) for c in on] for code, on in acting_on.items()},
                {code: [c for c in on if self._makes_float64(c)] for code, on in acting_on.items()},
            )
        return found

    def device_types(
        self, expr: cst.BaseExpression | None, depth: int = 0, written: bool = False
    ) -> frozenset[str] | None:
        """The device types (`"cuda"`, `"cpu"`, `"mps"`, ...) a device expression may
        name, followed through names, `self.` attributes, attributes of config objects
        of this file (dataclass defaults included), argparse options limited by
        `choices`, and what functions of this file return; None when it may be
        anything (a parameter, an argparse option without choices, `x.device`).
        `written`: those of the script run as written, where an argparse option
        without choices takes its default."""
        if expr is None or depth > MAX_DEPTH:
            return None
        key = (expr, depth, written)  # the depth matters only where the look-up is cut off
        if key not in self._device_types:
            self._device_types[key] = self._compute_device_types(expr, depth, written)
        return self._device_types[key]

    def _compute_device_types(self, expr: cst.BaseExpression, depth: int, written: bool) -> frozenset[str] | None:
        if isinstance(expr, cst.SimpleString):
            value = expr.evaluated_value
            match = DEVICE_STRING.match(value) if isinstance(value, str) else None
            return frozenset({value.split(":")[0]}) if match else None
        if self.is_int(expr):
            return frozenset({"cuda"})  # `.to(0)`, `.to(rank % torch.cuda.device_count())`: a device ordinal
        if isinstance(expr, cst.FormattedString):
            return frozenset({"cuda"}) if self.kinds.is_device(expr) else None
        if isinstance(expr, cst.IfExp):
            return self._device_types_of([expr.body, expr.orelse], depth, written)
        if isinstance(expr, cst.Call):
            return self._call_device_types(expr, depth, written)
        if isinstance(expr, cst.Lambda):
            return self.device_types(expr.body, depth + 1, written)
        if isinstance(expr, cst.Subscript):
            return self._item_device_types(expr, depth, written)
        if isinstance(expr, cst.Name):
            return self._name_device_types(expr, depth, written)
        if isinstance(expr, cst.Attribute):
            values = self.kinds.attribute_values(expr, written)
            return self._device_types_of(values, depth, written) if values else None
        return None

    def _device_types_of(
        self, values: Iterable[cst.BaseExpression | None], depth: int, written: bool
    ) -> frozenset[str] | None:
        """The device types any of `values` may name; None when there are none."""
        return _union(*(self.device_types(value, depth + 1, written) for value in values))

    def _call_device_types(self, call: cst.Call, depth: int, written: bool) -> frozenset[str] | None:
        """Those of `torch.device(type)`, or of what a function of this file or of its
        package returns."""
        if self.names.is_(call.func, "torch.device"):
            first = positional(call, 0) or kwarg(call, "type")
            return self.device_types(first.value if first else None, depth + 1, written)
        returned = self.steps.returned(call)
        if returned is not None:
            return self._device_types_of(returned, depth, written)
        project = project_of(self.context)
        function = project.function(call.func)
        return project.device_types(function, written) if function is not None else None

    def _item_device_types(self, item: cst.Subscript, depth: int, written: bool) -> frozenset[str] | None:
        """Those of `cfg["device"]`, an item of a dict literal (or of names bound to one)."""
        if not (
            isinstance(item.value, cst.Name)
            and len(item.slice) == 1
            and isinstance(item.slice[0].slice, cst.Index)
            and isinstance(item.slice[0].slice.value, cst.SimpleString)
        ):
            return None
        key = item.slice[0].slice.value.evaluated_value
        values = []
        for source in self.kinds.value_sources(item.value):
            found = _dict_value(source, key, self) if source is not None else None
            if found is None:
                return None
            values.append(found)
        return self._device_types_of(values, depth, written)

    def _name_device_types(self, name: cst.Name, depth: int, written: bool) -> frozenset[str] | None:
        """Those of a name: what the package passes to it where it is only a parameter,
        else those of every value it may read."""
        sites = self._every_binding(name)
        if len(sites) == 1 and isinstance(sites[0][0], cst.Param):
            passed = self._package_argument_types(sites[0][0], depth, written)
            if passed is not None:
                return passed
        return self._device_types_of(self.kinds.value_sources(name), depth, written)

    def _package_argument_types(self, param: cst.Param, depth: int, written: bool) -> frozenset[str] | None:
        """The device types every caller in the package passes to `param`, a parameter of a
        top-level function this file never calls (`run_experiment(config, device)` called by
        the experiments' scripts): each caller's own analysis tells its argument. None when
        this file calls the function, when no module of the package does, or when one
        caller's argument cannot be told."""
        function = self.parents.get(self.parents.get(param))
        if not isinstance(function, cst.FunctionDef) or self.steps.call_sites(function):
            return None
        found = []
        for module, _, argument in self.package_arguments(function, param):
            types = module.context.training.device_types(argument, depth + 1, written) if argument else None
            if types is None:
                return None
            found.append(types)
        return _union(*found) if found else None

    def package_arguments(self, function: cst.FunctionDef, param: cst.Param) -> list:
        """(module, call, argument) for each call of `function`, a top-level function of this
        file, in the other modules of its package: what the call passes to `param` (its
        default where it passes nothing; None where that cannot be told)."""
        return [
            (module, call, passed_by(call, function, param))
            for module, call in project_of(self.context).package_calls(function)
        ]

    def trainer_placed(self, expr: cst.BaseExpression, at: cst.CSTNode) -> cst.ClassDef | None:
        """The class when `expr` is `self` in its `configure_optimizers()` and the class is a
        LightningModule (torch_facts.TRAINER_PLACED_MODULES): the trainer moves the module to
        the device it picks before it calls that method, so `self.device` there is where the
        parameters train (a submodule's too: `self.encoder`). None otherwise."""
        while isinstance(expr, cst.Attribute):
            expr = expr.value
        if not (isinstance(expr, cst.Name) and expr.value == "self"):
            return None
        method = self.context.index.first_enclosing(at, cst.FunctionDef)
        if method is None or method.name.value != "configure_optimizers":
            return None
        cls = self.context.index.first_enclosing(method, cst.ClassDef)
        if cls is None or self.context.parents.get(self.context.parents.get(method)) is not cls:
            return None
        if not any(self.names.of(base.value) & TRAINER_PLACED_MODULES for base in cls.bases):
            return None
        return cls

    def callee_names(self, call: cst.Call, written: bool = False) -> frozenset[str] | None:
        """The qualified names of what `call` calls: its callee's (`torch.optim.AdamW`,
        `getattr(torch.optim, "AdamW")`), or for `getattr(torch.optim, name)` each attribute
        `name` may name: strings followed through names, `self.` attributes, config fields
        and argparse options limited by `choices` (with `written`, an option's default as
        the script is written). None when one of them cannot be told."""
        named = self.names.of(call)
        if named:
            return frozenset(named)
        if isinstance(call.func, cst.Name):  # `opt_cls = getattr(torch.optim, name)`, then `opt_cls(...)`
            sources = self.kinds.value_sources(call.func)
            found = [self._got_attributes(s, written) if isinstance(s, cst.Call) else None for s in sources]
            return frozenset().union(*found) if found and all(f is not None for f in found) else None
        return self._got_attributes(call.func, written)

    def _got_attributes(self, func: cst.BaseExpression, written: bool) -> frozenset[str] | None:
        """For `getattr(torch.optim, name)`: each qualified name the attribute may name."""
        if not (
            isinstance(func, cst.Call)
            and self.names.is_(func.func, "builtins.getattr")
            and len(func.args) == 2
            and not any(arg.keyword is not None or arg.star for arg in func.args)
        ):
            return None
        owners = self.names.of(func.args[0].value)
        attributes = self.strings(func.args[1].value, written=written)
        if not owners or not attributes or not all(a.isidentifier() for a in attributes):
            return None
        return frozenset(f"{owner}.{attribute}" for owner in owners for attribute in attributes)

    def strings(self, expr: cst.BaseExpression | None, depth: int = 0, written: bool = False) -> frozenset[str] | None:
        """The strings `expr` may hold, followed as `device_types` follows a device; None
        when one of them cannot be told. `written`: as the script is written, an option's
        default and an environment variable's (`os.environ.get("ACCEL", "gpu")`)."""
        if expr is None or depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.SimpleString):
            value = expr.evaluated_value
            return frozenset({value}) if isinstance(value, str) else None
        if isinstance(expr, cst.IfExp):
            return _union(self.strings(expr.body, depth + 1, written), self.strings(expr.orelse, depth + 1, written))
        if isinstance(expr, cst.Name):
            sources = self.kinds.value_sources(expr)
            return _union(*(self.strings(s, depth + 1, written) for s in sources)) if sources else None
        if isinstance(expr, cst.Attribute):
            values = self.kinds.attribute_values(expr, written)
            return _union(*(self.strings(v, depth + 1, written) for v in values)) if values else None
        if (
            written
            and isinstance(expr, cst.Call)
            and self.names.of(expr.func) & ENVIRONMENT_READS
            and len(expr.args) == 2
            and not any(arg.keyword is not None or arg.star for arg in expr.args)
        ):
            return self.strings(expr.args[1].value, depth + 1, written)  # its default, as an option's
        return None

    def numbers(self, expr: cst.BaseExpression | None, depth: int = 0) -> frozenset[float] | None:
        """The numbers `expr` may hold, followed as `strings` follows a string (an option by
        its `choices` only: the command line may give any other); None when one of them
        cannot be told (a dropout's probability, asked by `compilability`)."""
        if expr is None or depth > MAX_DEPTH:
            return None
        value = number_value(expr)
        if value is not None:
            return frozenset({float(value)})
        if isinstance(expr, cst.IfExp):
            return _union(self.numbers(expr.body, depth + 1), self.numbers(expr.orelse, depth + 1))
        if isinstance(expr, cst.Name):
            sources = self.kinds.value_sources(expr)
            return _union(*(self.numbers(s, depth + 1) for s in sources)) if sources else None
        if isinstance(expr, cst.Attribute):
            values = self.kinds.attribute_values(expr)
            return _union(*(self.numbers(v, depth + 1) for v in values)) if values else None
        return None

    def is_int(self, expr: cst.BaseExpression | None) -> bool:
        """Is `expr` provably a Python int (`Values.is_int`: the one number question)?"""
        from codemod.analysis.values import values  # values asks these facts: lazily

        return expr is not None and values(self.context).is_int(expr)

    def device_places(self, expr: cst.BaseExpression | None, depth: int = 0) -> frozenset[Place]:
        """Every place a device expression may point to: `"cuda" if ok else "cpu"`
        gives {CUDA, HOST} (Kinds joins that to UNKNOWN)."""
        if expr is None or depth > MAX_DEPTH:
            return frozenset({Place.UNKNOWN})
        types = self.device_types(expr)
        if types is not None:
            return frozenset(Place.CUDA if t == "cuda" else Place.HOST if t == "cpu" else Place.UNKNOWN for t in types)
        if isinstance(expr, cst.IfExp):
            return self.device_places(expr.body, depth + 1) | self.device_places(expr.orelse, depth + 1)
        if isinstance(expr, cst.Call) and self.names.is_(expr.func, "torch.device"):
            first = positional(expr, 0) or kwarg(expr, "type")
            return self.device_places(first.value if first else None, depth + 1)
        if isinstance(expr, cst.Name):
            sources = self._binding_sources(expr)
            if sources:
                places: frozenset[Place] = frozenset()
                for source in sources:
                    places |= self.device_places(source, depth + 1) if source is not None else {Place.UNKNOWN}
                return places
        if isinstance(expr, cst.FormattedString) and self.kinds.is_device(expr):
            return frozenset({Place.CUDA})
        return frozenset({self.kinds.device_place(expr)})

    # -- matrix products ---------------------------------------------------------------

    def multiplies_matrices(self, loop: TrainingLoop) -> bool | None:
        """Does a step of `loop` multiply matrices (matmul, `@`, einsum, linear, attention,
        recurrent or convolution layers)? Read from the code the loop's body runs (with the
        functions of this file it calls) and from the modules and functions it calls,
        followed to where they are built: classes of this file (every method, and the
        modules their `__init__` builds), functions of this file that build them, torch's
        layers. True as soon as one product is seen; False when all of it was read and
        none was; None when some of it cannot be read here (a model or function of another
        library or of a project module, a module passed in from elsewhere, a loaded one)."""
        if loop.loop not in self._products:
            self._products[loop.loop] = _MatrixProducts(self).in_code(loop.loop.body)
        return self._products[loop.loop]

    def runs_float32_matmuls(self, loop: TrainingLoop) -> bool | None:
        """`multiplies_matrices` for the products cuBLAS runs (matmul, `@`, einsum, linear
        and attention layers), whose float32 precision TF32's matmul setting governs; not
        cuDNN's convolutions and recurrent layers, which run in TF32 by default."""
        if loop.loop not in self._matmuls:
            self._matmuls[loop.loop] = _Float32Matmuls(self).in_code(loop.loop.body)
        return self._matmuls[loop.loop]

    def first_run(
        self,
        calls: Iterable[cst.Call],
        functions: frozenset[str],
        methods: frozenset[str],
        keep: Callable[[cst.Call], bool] | None = None,
    ) -> cst.Call | None:
        """The first call that `calls` run (read as `multiplies_matrices` reads a step, into the
        models' classes and the functions of this file) of one of torch's `functions` (or
        classes) or tensor `methods`, that `keep` keeps; None when none is seen
        (`compilability.compile_break` asks it for where torch.compile breaks a model's
        graph, `compilability.model_draw` for the random numbers a model's forward draws)."""
        verdict, found = self.run_verdict(calls, functions, methods, keep)
        return found if verdict else None

    def run_verdict(
        self,
        calls: Iterable[cst.Call],
        functions: frozenset[str],
        methods: frozenset[str],
        keep: Callable[[cst.Call], bool] | None = None,
    ) -> tuple[bool | None, cst.Call | None]:
        """`first_run` with its verdict: (True, the call) when one is seen, (False, None) when
        everything `calls` run was read and none is, (None, None) when some of it could not be
        read (a class of another library or of another module of the project)."""
        search = _CallSearch(self, functions, methods, keep)
        verdict = _first_true(search.in_call(call) for call in calls)
        return verdict, search.found if verdict else None

    def run_in(
        self,
        node: cst.ClassDef | cst.FunctionDef,
        functions: frozenset[str],
        methods: frozenset[str],
        keep: Callable[[cst.Call], bool] | None = None,
    ) -> tuple[bool | None, cst.Call | None]:
        """`run_verdict` for what calling `node`, a class or function of this file, runs
        (asked by the files that import it, as `matrix_products_in`)."""
        search = _CallSearch(self, functions, methods, keep)
        verdict = search.in_class(node) if isinstance(node, cst.ClassDef) else search.in_code(node)
        return verdict, search.found if verdict else None

    def matrix_products_in(self, node: cst.ClassDef | cst.FunctionDef, only_matmuls: bool = False) -> bool | None:
        """Does calling `node`, a class or function of this file, multiply matrices (as
        `multiplies_matrices`; with `only_matmuls`, as `runs_float32_matmuls`)? Asked by the
        files that import it."""
        search = _Float32Matmuls(self) if only_matmuls else _MatrixProducts(self)
        return search.in_class(node) if isinstance(node, cst.ClassDef) else search.in_code(node)

    @functools.cached_property
    def matmul_precision_chosen(self) -> bool:
        """Does the program choose the precision of float32 matrix products (TF32) itself, on
        or off: this file spells one of torch's settings of it, or a project module it imports
        does?"""
        if any(name.value in MATMUL_PRECISION_SETTINGS for name in self.index.find(cst.Name)):
            return True
        settings = (setting.encode() for setting in MATMUL_PRECISION_SETTINGS)
        return project_of(self.context).imported_module_mentioning(*settings) is not None

    def reduced_precision(self, loop: TrainingLoop) -> cst.CSTNode | None:
        """What visibly runs the step's matrix products in float16 or bfloat16: every model
        the loop trains made so (`.half()`, `.bfloat16()`, `dtype=torch.bfloat16`), or a
        CUDA autocast to a 16-bit dtype, on whatever the options (no `enabled=`), around the
        loop or around its whole forward region. None when nothing visibly does."""
        if loop.half is not None:
            return loop.half
        autocast = loop.autocast
        if autocast is None or not isinstance(autocast.node, cst.With):
            return None
        around_loop = self.index.inside(loop.loop, autocast.node)
        forward = loop.forward.statements if loop.forward is not None else ()
        if not around_loop and not (forward and all(self.index.inside(s, autocast.node) for s in forward)):
            return None  # autocast around a part of the step only
        for item in autocast.node.items:
            if isinstance(item.item, cst.Call) and self._always_half_on_cuda(item.item):
                return autocast.node
        return None

    def _always_half_on_cuda(self, call: cst.Call) -> bool:
        """`torch.autocast("cuda", dtype=torch.bfloat16)`, `torch.cuda.amp.autocast()`: on,
        for CUDA, in a 16-bit dtype, whatever the options the script is run with."""
        names = self.names.of(call.func)
        if not names & AUTOCAST_NAMES:
            return False
        cuda_only = any(n.startswith("torch.cuda.") for n in names)  # `torch.cuda.amp.autocast(enabled=True, ...)`
        enabled = kwarg(call, "enabled") or (positional(call, 0) if cuda_only else None)
        if enabled is not None and not _is_true(enabled.value):
            return False
        dtype = kwarg(call, "dtype")
        if dtype is not None and not self.names.is_(dtype.value, *HALF_NAMES):
            return False
        if cuda_only:
            return True
        device = kwarg(call, "device_type") or positional(call, 0)
        return (
            device is not None and isinstance(device.value, cst.SimpleString) and device.value.evaluated_value == "cuda"
        )

    # -- loops -----------------------------------------------------------------------

    def _find_loops(self) -> list[cst.For | cst.While]:
        """The step loops (codemod.analysis.loops) that visibly run backward and step."""
        chosen = []
        for loop in self.steps.step_loops:
            calls = self.steps.reached_calls(loop.body)
            if any(self._backward(c) for c in calls) and any(self._step(c, loop) for c in calls):
                chosen.append(loop)
        return chosen

    def _describe(self, loop: cst.For | cst.While) -> TrainingLoop:
        calls = self.steps.reached_calls(loop.body)
        backwards = tuple(b for b in (self._backward(c) for c in calls) if b is not None)
        steps = tuple(s for s in (self._step(c, loop) for c in calls) if s is not None)
        stepped = {self.code(s.optimizer): s.optimizer for s in steps}  # one entry per optimizer, in order
        optimizers = tuple(self._optimizer_build(expr, loop) for expr in stepped.values())
        models = self._loop_models(loop, calls, optimizers)
        if len(backwards) == 1:
            forward, problem = self._forward(loop, backwards[0])
        else:
            forward, problem = None, Problem(f"the loop calls backward() {len(backwards)} times")
        float64 = self.default_float64 or next((mdl.float64 for mdl in models if mdl.float64 is not None), None)
        half = models[0].half if models and all(mdl.half is not None for mdl in models) else None
        return TrainingLoop(
            loop=loop,
            backwards=backwards,
            steps=steps,
            optimizers=optimizers,
            forward=forward,
            forward_why=problem,
            accumulation=self._accumulation(loop, backwards, steps),
            clips=tuple(c for c in calls if self.names.is_(c.func, *CLIP_NAMES)),
            autocast=self._loop_autocast(loop),
            scaler=self._loop_scaler(backwards, steps),
            models=models,
            float64=float64,
            half=half,
        )

    def _backward(self, call: cst.Call) -> Backward | None:
        if method_name(call) != "backward":
            return None
        loss, scaled, divisor = call.func.value, False, None
        owner = self.precision_owner(loss)
        if owner is not None:
            first = positional(call, 0) or kwarg(call, "loss")
            if first is None:
                return None
            loss = first.value
        if isinstance(loss, cst.Call) and method_name(loss) == "scale" and positional(loss, 0) is not None:
            loss, scaled = positional(loss, 0).value, True
        if isinstance(loss, cst.BinaryOperation) and isinstance(loss.operator, cst.Divide):
            loss, divisor = loss.left, loss.right
        return Backward(call, loss, scaled, divisor, owner)

    def precision_owner(self, expr: cst.BaseExpression) -> cst.Call | None:
        """The construction of the training engine `expr` holds (`Accelerator(...)`, Lightning's
        `Fabric(...)`): an object whose `.backward(loss)` runs the backward pass and whose
        constructor's keyword (torch_facts.PRECISION_OWNERS) sets the mixed precision of
        the forward passes it prepares. None when `expr` is not one."""
        if not isinstance(expr, cst.Name):
            return None
        sources = self.kinds.value_sources(expr)
        if not sources or not all(
            isinstance(s, cst.Call) and self.names.is_(s.func, *PRECISION_OWNERS) for s in sources
        ):
            return None
        return sources[-1]

    def _step(self, call: cst.Call, loop: cst.CSTNode) -> Step | None:
        found = self.steps.step_of(call)
        return Step(call, found[0], found[1]) if found is not None else None

    def _optimizer_build(self, expr: cst.BaseExpression, loop: cst.CSTNode) -> OptimizerBuild:
        source = self._last_source(expr, before=loop)
        if source is None and isinstance(expr, cst.Name):
            # A parameter (`train_one_epoch(model, loader, optimizer)`): what every call passes.
            passed = [s for s in self.kinds.value_sources(expr)]
            followed = [self._last_source(s) if isinstance(s, cst.Name) else s for s in passed]
            calls = {self.code(s.func) for s in followed if isinstance(s, cst.Call)}
            if followed and len(calls) == 1 and all(isinstance(s, cst.Call) for s in followed):
                source = followed[0]
        if not isinstance(source, cst.Call):
            return OptimizerBuild(self.code(expr), None, None, None)
        names = sorted(self.names.of(source.func))
        torch_optimizer = next((n for n in names if n.startswith("torch.optim.")), None)
        if torch_optimizer is None:  # `model.configure_optimizers(...)`: its arguments are not parameters
            return OptimizerBuild(self.code(expr), source, names[0] if names else None, None)
        params = kwarg(source, "params") or positional(source, 0)
        return OptimizerBuild(self.code(expr), source, torch_optimizer, params.value if params else None)

    def _loop_models(self, loop, calls, optimizers) -> tuple[Model, ...]:
        found: list[str] = []
        expressions: list[cst.BaseExpression] = []
        candidates: list[cst.BaseExpression] = []
        for call in calls:
            func = call.func
            if self.is_model(func):
                candidates.append(func)
            elif (
                isinstance(func, cst.Attribute) and self.is_model(func.value) and func.attr.value not in MODULE_METHODS
            ):
                candidates.append(func.value)
        built_at: dict[int, cst.CSTNode] = {}  # a model of an optimizer's, where the optimizer is built
        for optimizer in optimizers:
            if optimizer.params is not None:
                for model in self.parameter_models(optimizer.params) or ():
                    candidates.append(model)
                    if optimizer.call is not None:
                        built_at.setdefault(id(model), optimizer.call)
        # `self` and `self.net` in a method the loop runs on `module` (`module.training_step(x)`)
        # are that model and a part of it, not other models.
        run_on = {
            id(c) for c in (self.kinds.instance_class(e) for e in candidates if self.self_class_of(e) is None) if c
        }
        for expr in candidates:
            owner = self.self_class_of(expr)
            if owner is not None and id(owner) in run_on:
                continue
            code = self.code(expr)
            if code not in found:
                found.append(code)
                expressions.append(expr)
        return tuple(
            self._loop_model(expr, loop, built_at.get(id(expr)))._replace(owner=self.self_class_of(expr))
            for expr in expressions
        )

    def _loop_model(self, expr: cst.BaseExpression, loop, built_at: cst.CSTNode | None) -> Model:
        """Where the model `expr` is when `loop` runs; for a model of an optimizer the loop's
        function is handed, spelled where the optimizer is built (`opt = AdamW(model.
        parameters())` in the `__main__` block, after `model.to(device)`), where it is then:
        a move after the loop's function is defined is none the loop can see."""
        found = self.model(expr, loop)
        function = self.index.first_enclosing(loop, cst.FunctionDef)
        if found.move is not None or built_at is None or function is None or self.index.inside(expr, function):
            return found
        moved = self.model(expr, built_at)
        return moved if moved.move is not None else found

    def self_class_of(self, expr: cst.BaseExpression) -> cst.ClassDef | None:
        """The class whose method `expr` is read in as its `self` or a part of it (`self`,
        `self.net`, `self.layers[0]`), else None."""
        while isinstance(expr, (cst.Attribute, cst.Subscript)):
            expr = expr.value
        found = self.context.bindings.param_of(expr) if isinstance(expr, cst.Name) else None
        return self.kinds.self_class(found[1]) if found is not None else None

    def parameter_models(self, params: cst.BaseExpression, depth: int = 0) -> list[cst.BaseExpression] | None:
        """The modules whose parameters `params` (an optimizer's first argument) is
        made of: `model.parameters()`, param groups, comprehensions and filters over
        `parameters()` / `named_parameters()` (and dicts built from those), lists built
        by appending those, either branch of a conditional, names bound to any of these, and parameters of a function
        of this file followed to what its calls pass. None when it may hold anything else."""
        found = self.parameter_model_sites(params, None, depth)
        return [model for model, _ in found] if found is not None else None

    def parameter_model_sites(
        self,
        params: cst.BaseExpression,
        at: cst.CSTNode | None,
        depth: int = 0,
        tensors: TensorSites | None = None,
    ) -> list[tuple[cst.BaseExpression, cst.CSTNode | None]] | None:
        """`parameter_models`, each model with the node where its placement counts:
        `at` (the optimizer's construction), or the call that passes it to a function
        that builds the optimizer (`build_optimizer(cfg, model.parameters())`).

        `tensors`, when given, is asked about the parts that are not parameters of a
        model (a name first, anything else when it is no container of parameters): it
        returns the sites it stands for (a tensor made to be trained, `nn.Parameter(...)`),
        or None when it cannot tell; the lists, sums and appends around them are followed here."""
        if depth > 2 * MAX_DEPTH:  # each container, comprehension and name is a level
            return None
        if tensors is not None and isinstance(params, cst.Name):
            own = tensors(params, at)
            if own is not None:
                return own
        found = self._parameter_sites(params, at, depth, tensors)
        if found is None and tensors is not None and not isinstance(params, cst.Name):
            return tensors(params, at)
        return found

    def _parameter_sites(self, params: cst.BaseExpression, at, depth: int, tensors: TensorSites | None):
        if isinstance(params, cst.Call):
            return self._parameter_call_models(params, at, depth, tensors)
        if isinstance(params, (cst.List, cst.Tuple)):
            return self._all_models([e.value for e in params.elements], at, depth, tensors)
        if isinstance(params, cst.Dict):  # a param group: only its "params" hold tensors
            group = [
                e.value
                for e in params.elements
                if isinstance(e, cst.DictElement)
                and isinstance(e.key, cst.SimpleString)
                and e.key.evaluated_value == "params"
            ]
            return self._all_models(group, at, depth, tensors) if len(group) == 1 else None
        if isinstance(params, (cst.ListComp, cst.GeneratorExp, cst.DictComp)):
            loop = params.for_in
            element = params.value if isinstance(params, cst.DictComp) else params.elt
            if loop.inner_for_in is not None or not isinstance(element, cst.Name):
                return None
            if element.value not in {t.value for t in _bound_targets(loop.target) if isinstance(t, cst.Name)}:
                return None
            return self.parameter_model_sites(loop.iter, at, depth + 1, tensors)
        if isinstance(params, cst.BinaryOperation) and isinstance(params.operator, cst.Add):
            return self._all_models([params.left, params.right], at, depth, tensors)
        if isinstance(params, cst.IfExp):  # `[p for p in m.parameters()] if m is not None else []`
            return self._all_models([params.body, params.orelse], at, depth, tensors)
        if isinstance(params, cst.Name):
            return self._parameter_name_models(params, at, depth, tensors)
        return None

    def _parameter_call_models(self, call: cst.Call, at, depth: int, tensors: TensorSites | None):
        if method_name(call) in ("parameters", "named_parameters"):
            return [(call.func.value, at)]
        if method_name(call) == "values" and not call.args:  # `{n: p for n, p in m.named_parameters()}.values()`
            return self.parameter_model_sites(call.func.value, at, depth + 1, tensors)
        values = [a.value for a in call.args if a.keyword is None and not a.star]
        if self.names.is_(call.func, "list", "tuple", "builtins.list", "builtins.tuple") and len(values) == 1:
            return self.parameter_model_sites(values[0], at, depth + 1, tensors)
        if self.names.is_(call.func, "filter", "builtins.filter") and len(values) == 2:
            return self.parameter_model_sites(values[1], at, depth + 1, tensors)
        if self.names.is_(call.func, "itertools.chain") and values:
            return self._all_models(values, at, depth, tensors)
        function = self.steps.callee(call)  # `param_groups(model, wd)`: what a function of the file returns
        if function is None:
            return None
        returns, yields = self.kinds.exits(function)
        if yields or not returns or any(r.value is None for r in returns):
            return None
        return self._all_models([r.value for r in returns], at, depth, tensors)

    def _parameter_name_models(self, name: cst.Name, at, depth: int, tensors: TensorSites | None):
        """A list variable: what it is bound to, and what `.append`/`.extend`/`+=` add
        (also through `(a if c else b).append(p)`); a parameter: what its calls pass."""
        sources: list[tuple[cst.BaseExpression, cst.CSTNode | None]] = []
        for site, source in self._every_binding(name):
            if source is None and isinstance(site, cst.Param):
                passed = self.kinds.arguments(site)  # each call and what it passes
                if not passed or any(argument is None for _, argument in passed):
                    return None
                sources.extend((argument, call) for call, argument in passed)
                continue
            if source is None:
                source = self._unpacked_literal(site)
                if source is None:
                    return None
            if not (isinstance(source, (cst.List, cst.Tuple)) and not source.elements):
                sources.append((source, at))  # `decay = []` adds nothing
        scope = self.kinds.scopes.get(name)
        for access in scope.accesses[name.value] if scope is not None else ():
            receiver: cst.CSTNode = access.node
            parent = self.parents.get(receiver)
            if isinstance(parent, cst.IfExp) and parent.test is not receiver:
                receiver, parent = parent, self.parents.get(parent)  # `(a if c else b).append(p)`
            call = self.parents.get(parent)
            if (
                isinstance(parent, cst.Attribute)
                and parent.value is receiver
                and isinstance(call, cst.Call)
                and call.func is parent
            ):
                added = positional(call, 0)
                if parent.attr.value not in ("append", "extend") or added is None:
                    continue
                sources.append((added.value, at))  # an appended loop variable stands for its iterable
            elif isinstance(parent, cst.AugAssign) and parent.target is access.node:
                sources.append((parent.value, at))
        if not sources:
            return None
        models = []
        for source, where in sources:
            found = self.parameter_model_sites(source, where, depth + 1, tensors)
            if found is None:
                return None
            models.extend(found)
        return models

    def _unpacked_literal(self, target: cst.CSTNode) -> cst.BaseExpression | None:
        """The value `target` gets from `a, b = [], []` (one for one)."""
        element = self.parents.get(target)
        names = self.parents.get(element)
        holder = self.parents.get(names)
        statement = self.parents.get(holder)
        if not (
            isinstance(element, cst.Element)
            and isinstance(names, (cst.Tuple, cst.List))
            and isinstance(holder, cst.AssignTarget)
            and isinstance(statement, cst.Assign)
            and isinstance(statement.value, (cst.Tuple, cst.List))
            and len(statement.value.elements) == len(names.elements)
        ):
            return None
        return statement.value.elements[list(names.elements).index(element)].value

    def _all_models(self, parts: Sequence[cst.BaseExpression], at, depth: int, tensors: TensorSites | None):
        models = []
        for part in parts:
            found = self.parameter_model_sites(part, at, depth + 1, tensors)
            if found is None:
                return None
            models.extend(found)
        return models

    # -- forward region ------------------------------------------------------------

    def _forward(self, loop: cst.CSTNode, backward: Backward) -> tuple[ForwardRegion | None, str | None]:
        statement = self.statement_of(backward.call)
        block = self.parents.get(statement)
        if not isinstance(block, cst.IndentedBlock):
            return None, Problem("backward() is not in a block of its own lines")
        body = list(block.body)
        index = _index(body, statement)
        codes = self._loss_codes(backward.loss)
        if codes is None:
            return None, Problem("the loss is computed in the backward() statement itself")
        binders = [i for i in range(index) if self._bound_codes(body[i]) & codes]
        if not binders:
            return None, Problem(f"`{self.code(backward.loss)}` is computed outside the block that calls backward()")
        last = binders[-1]
        if not isinstance(body[last], cst.SimpleStatementLine):
            nested = self._nested_loss_problem(body, last)
            if nested is not None:
                return None, nested
        first = next((i for i in range(last + 1) if self._has_model_call(body[i])), None)
        outside = self._model_result_outside(loop, body[last if first is None else first : last + 1])
        if outside is not None:
            return None, Problem(
                f"the forward spans blocks: `{self.code(outside)}` comes from a model call at line "
                "{}, outside the block that computes the loss",
                (outside,),
                self.context.line,
            )
        if first is None:
            return None, Problem(NO_FORWARD)
        region = ForwardRegion(block, first, last)
        # A generator suspended inside autocast would leak it into its consumer's code.
        if any(self.index.find((cst.Yield, cst.Await), within=stmt) for stmt in region.statements):
            return None, Problem("the forward region yields or awaits")
        return region, None

    def _nested_loss_problem(self, body: list, last: int) -> Problem | None:
        """Why the compound statement `body[last]`, which computes the loss last, cannot
        end the forward region; None for an `if`, `with` or `try` that only computes
        values (the region then ends with it): not a loop (the loss may be
        accumulated over passes of its own), no backward or optimizer step inside, and
        no `if` that tests a value the step computed before it (in lower precision the
        test could come out otherwise)."""
        statement = body[last]
        line = self.context.line
        if not isinstance(statement, (cst.If, cst.With, cst.Try)):
            return Problem(
                "the loss is computed inside a nested loop (line {}); wrap the forward pass and that "
                "loop in autocast by hand",
                (statement,),
                line,
            )
        for call in self.steps.reached_calls(statement):
            if self.steps.is_backward(call) or self.steps.step_of(call) is not None:
                return Problem(
                    "the block that computes the loss (line {}) also runs backward() or an optimizer "
                    "step (line {}); wrap only the forward pass in autocast by hand",
                    (statement, call),
                    line,
                )
        earlier: set[str] = set()
        for before in body[:last]:
            earlier |= self._bound_codes(before)
        branch: cst.CSTNode | None = statement
        while isinstance(branch, cst.If):
            read = next((n for n in names_read(branch.test) if n.value in earlier), None)
            if read is not None:
                return Problem(
                    f"the `if` that computes the loss (line {{}}) tests `{read.value}`, which the step "
                    "computes before it: in lower precision the test may come out otherwise; wrap the "
                    "forward pass in autocast by hand if the branch taken does not depend on its precision",
                    (branch,),
                    line,
                )
            branch = branch.orelse
        return None

    def _bound_codes(self, statement: cst.CSTNode) -> set[str]:
        """Every expression `statement` assigns: `loss`, `out.loss`, both of `a, b = ...`."""
        kinds = (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.WithItem, cst.NamedExpr)
        codes = set()
        for node in self.index.find(kinds, within=statement):
            if isinstance(node, cst.WithItem):
                bound = node.asname.name if node.asname else None
            else:
                bound = node.target
            if bound is not None:
                codes.update(self.code(t) for t in _bound_targets(bound))
        return codes

    def _has_model_call(self, statement: cst.CSTNode) -> bool:
        return any(self.is_model_call(c) for c in self.steps.own_calls(statement))

    def _model_result_outside(self, loop: cst.CSTNode, statements: Sequence[cst.CSTNode]) -> cst.CSTNode | None:
        """Where the loop binds, from a model call and outside `statements`, a name
        that they read before binding it themselves: the forward starts elsewhere."""
        bound_here: set[str] = set()
        for stmt in statements:
            for name in names_read(stmt):
                if name.value in bound_here:
                    continue
                for site, source in self._every_binding(name):
                    if source is None or not self.index.inside(site, loop):
                        continue
                    if any(self.index.inside(site, s) for s in statements):
                        continue
                    if self._has_model_call(source):
                        return site
            bound_here |= self._bound_codes(stmt)
        return None

    def _loss_codes(self, loss: cst.BaseExpression) -> set[str] | None:
        """`{"out.loss", "out"}` for `out.loss`: assigning either computes the loss;
        None when the loss is not a variable (`model(x).sum().backward()`)."""
        codes = set()
        while isinstance(loss, (cst.Attribute, cst.Subscript)):
            codes.add(self.code(loss))
            loss = loss.value
        if not isinstance(loss, cst.Name):
            return None
        codes.add(loss.value)
        return codes

    # -- accumulation ----------------------------------------------------------------

    def _accumulation(self, loop, backwards: Sequence[Backward], steps: Sequence[Step]) -> Accumulation | None:
        guard, modulus = None, None
        for step in steps:
            for node in self._ancestors(step.call):
                if node is loop:
                    break
                if isinstance(node, cst.If):
                    found = periodic(self.context).period(node.test, loop)
                    if found is not None:
                        guard, modulus = node, found
                        break
        micro_loop = None
        for backward in backwards:
            inner = next((n for n in self._ancestors(backward.call) if isinstance(n, (cst.For, cst.While))), None)
            if inner is not None and inner is not loop and not any(self.index.inside(s.call, inner) for s in steps):
                micro_loop = inner
        micro_count = self._range_count(micro_loop.iter) if isinstance(micro_loop, cst.For) else None
        counts = [c for c in (modulus, micro_count) if c is not None]
        division, divisor = self._loss_division(loop, backwards, counts)
        if division is None and guard is None and micro_loop is None:
            return None
        return Accumulation(divisor or modulus or micro_count, division, guard, micro_loop)

    def _range_count(self, iterable: cst.BaseExpression) -> cst.BaseExpression | None:
        """`n` of `range(n)` / `range(0, n)`."""
        if not (isinstance(iterable, cst.Call) and self.names.is_(iterable.func, "range", "builtins.range")):
            return None
        args = [a.value for a in iterable.args]
        if len(args) == 1:
            return args[0]
        if len(args) == 2 and number_is(self.context, 0).matches(args[0]):
            return args[1]
        return None

    def _loss_division(
        self, loop, backwards: Sequence[Backward], counts
    ) -> tuple[cst.CSTNode | None, cst.BaseExpression | None]:
        for backward in backwards:
            if backward.divisor is not None:
                return self.parents.get(backward.loss), backward.divisor
        roots = {b.loss.value for b in backwards if isinstance(b.loss, cst.Name)}
        count_codes = {self.code(c) for c in counts}
        for statement in self.index.find(cst.SimpleStatementLine, within=loop.body):
            for small in statement.body:
                if isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.DivideAssign):
                    if isinstance(small.target, cst.Name) and small.target.value in roots:
                        return statement, small.value
                if isinstance(small, cst.Assign) and len(small.targets) == 1:
                    target, value = small.targets[0].target, small.value
                    if not (isinstance(target, cst.Name) and target.value in roots):
                        continue
                    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Divide)):
                        continue
                    # `loss = loss / accum`; `loss = f(...) / x` only when x is the accumulation count.
                    own = isinstance(value.left, cst.Name) and value.left.value == target.value
                    if own or self.code(value.right) in count_codes:
                        return statement, value.right
        return None, None

    # -- autocast, scaler, dtype -----------------------------------------------------

    def _is_autocast_call(self, call: cst.Call) -> bool:
        func = call.func
        name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
        if name == "autocast":
            return True  # `torch.autocast`, `amp.autocast`, a policy's or an accelerator's `.autocast()`
        return "autocast" in name and self.names.is_(func, *AUTOCAST_NAMES)

    def _enables_autocast(self, expr: cst.BaseExpression, depth: int = 0) -> str | None:
        """How `expr` (a `with` item, a decorator) turns autocast on, or None."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.Call):
            if self._is_autocast_call(expr):
                return "call"
            if self.names.is_(expr.func, "functools.partial") and expr.args:  # partial(torch.autocast, ...)
                return "call" if self.names.is_(expr.args[0].value, *AUTOCAST_NAMES) else None
            if isinstance(expr.func, cst.Name) and self.names.local(expr.func):  # `amp_ctx = partial(...)`
                form = self._enables_autocast(expr.func, depth + 1)
                if form is not None:
                    return form
            function = self._local_function(expr.func)
            if function is not None and any(
                self._enables_autocast(c, depth + 1) for c in self.steps.own_calls(function.body)
            ):
                return "helper"
            if function is None and self._imported_precision_context(expr.func):
                return "imported"
            return None
        if isinstance(expr, (cst.Name, cst.Attribute)):
            if isinstance(expr, cst.Name) and self._passed_in_from_elsewhere(expr):
                return "context passed in"  # `with ctx:`, ctx a caller's: perhaps autocast
            sources = self._binding_sources(expr) if isinstance(expr, cst.Name) else self._attribute_sources(expr)
            for source in sources:
                if source is not None and any(
                    self._enables_autocast(c, depth + 1) for c in self.index.find(cst.Call, within=source)
                ):
                    return "context variable"
            if not [s for s in sources if s is not None] and self._imported_precision_context(expr):
                return "imported"
        return None

    def _passed_in_from_elsewhere(self, name: cst.Name) -> bool:
        """Is `name` a parameter (not `self`) whose value no call of this file tells?"""
        sites = self._every_binding(name)
        return (
            len(sites) == 1
            and isinstance(sites[0][0], cst.Param)
            and sites[0][0].default is None
            and self.kinds.passed_to(sites[0][0]) == [None]
        )

    def _imported_precision_context(self, expr: cst.BaseExpression) -> bool:
        """A context manager defined outside this file (imported from the user's own
        package, or an attribute of an object built elsewhere) whose name says it is
        about mixed precision: `amp_autocast()`, `self.autocast_ctx`, `mixed_precision()`."""
        name = expr.attr.value if isinstance(expr, cst.Attribute) else expr.value if isinstance(expr, cst.Name) else ""
        words = set(name.lower().split("_"))
        if "autocast" not in name.lower() and not words & {"amp", "precision", "fp16", "bf16", "half"}:
            return False
        if isinstance(expr, cst.Name):
            return not self.names.local(expr)  # imported, not a function or variable of this file
        return True

    def _loop_autocast(self, loop: cst.CSTNode) -> Autocast | None:
        inside = [w for w in self.index.find(cst.With, within=loop.body) if not self._crosses_scope(w, loop)]
        enclosing = [a for a in self._ancestors_in_scope(loop) if isinstance(a, cst.With)]
        for statement in inside + enclosing:
            for item in statement.items:
                form = self._enables_autocast(item.item)
                if form is not None:
                    return Autocast(statement, form)
        for function in (a for a in self._ancestors(loop) if isinstance(a, cst.FunctionDef)):
            for decorator in function.decorators:
                form = self._enables_autocast(decorator.decorator)
                if form is not None:
                    return Autocast(decorator, form)
        return None

    def _loop_scaler(self, backwards: Sequence[Backward], steps: Sequence[Step]) -> Scaler | None:
        receivers = [b.call.func.value.func.value for b in backwards if b.scaled]
        receivers += [s.call.func.value for s in steps if s.scaled]
        if not receivers:
            return None
        receiver = receivers[0]
        source = self._last_source(receiver)
        compute_dtype = None
        if isinstance(source, cst.IfExp) and isinstance(source.body, cst.Call):
            compute_dtype = self._compared_with_float16(source.test)
            source = source.body
        if isinstance(source, cst.Call):
            names = sorted(self.names.of(source.func))
            qualified = next((n for n in names if n in GRAD_SCALER_NAMES), names[0] if names else None)
            return Scaler(self.code(receiver), source, qualified, compute_dtype)
        return Scaler(self.code(receiver), None, None)

    def _compared_with_float16(self, test: cst.BaseExpression) -> cst.BaseExpression | None:
        """`D` of a test `D == torch.float16` (either side): a dtype the script holds."""
        if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1):
            return None
        target = test.comparisons[0]
        if not isinstance(target.operator, (cst.Equal, cst.Is)):
            return None
        for dtype, other in ((test.left, target.comparator), (target.comparator, test.left)):
            if self.names.is_(other, *FLOAT16_NAMES) and not any(n.startswith("torch.") for n in self.names.of(dtype)):
                return dtype
        return None

    def _default_float64(self) -> cst.CSTNode | None:
        for call in self._calls:
            first = positional(call, 0)
            if first is None:
                continue
            if self.names.is_(call.func, "torch.set_default_dtype") and self._is_float64(first.value):
                return call
            if self.names.is_(call.func, "torch.set_default_tensor_type") and (
                self.names.is_(first.value, *DOUBLE_TENSOR_TYPES)
                or (isinstance(first.value, cst.SimpleString) and first.value.evaluated_value in DOUBLE_TENSOR_TYPES)
            ):
                return call
        return None

    def _exact_float32(self) -> cst.CSTNode | None:
        """Where the script asks for exact, reproducible float32 results: deterministic
        algorithms, TF32 turned off, or the "highest" matmul precision. Numeric
        rewrites (autocast, fused optimizers) would undo what it asked for."""
        code = self.context.code
        if not any(
            word in code for word in ("use_deterministic_algorithms", "allow_tf32", "fp32_precision", "highest")
        ):
            return None
        for call in self._calls:
            first = positional(call, 0)
            if first is None:
                continue
            if self.names.is_(call.func, "torch.use_deterministic_algorithms") and _is_true(first.value):
                return call
            if (
                self.names.is_(call.func, "torch.set_float32_matmul_precision")
                and isinstance(first.value, cst.SimpleString)
                and first.value.evaluated_value == "highest"
            ):
                return call
        for assign in self.index.find(cst.Assign):
            target = assign.targets[0].target if len(assign.targets) == 1 else None
            if not isinstance(target, cst.Attribute):
                continue
            if (
                target.attr.value == "allow_tf32"
                and isinstance(assign.value, cst.Name)
                and assign.value.value == "False"
            ):
                return assign
            if (
                target.attr.value == "fp32_precision"
                and isinstance(assign.value, cst.SimpleString)
                and assign.value.evaluated_value == "ieee"
            ):
                return assign
        return None

    def _float64_construction(self, code: str) -> cst.CSTNode | None:
        """`model = nn.Linear(4, 1, dtype=torch.float64)`."""
        if code not in self._float64_constructions:  # asked by every query about the model `code`
            self._float64_constructions[code] = self._find_float64_construction(code)
        return self._float64_constructions[code]

    def _find_float64_construction(self, code: str) -> cst.CSTNode | None:
        for _, source in self._assignments.get(code, ()):
            for call in self.index.find(cst.Call, within=source) if source is not None else ():
                dtype = kwarg(call, "dtype")
                if dtype is not None and self._is_float64(dtype.value):
                    return call
        return None

    def _half(self, code: str, expr: cst.BaseExpression, at: cst.CSTNode) -> cst.CSTNode | None:
        """What makes the model `code` float16 or bfloat16 before `at`: `.half()`,
        `.bfloat16()`, `.to(torch.bfloat16)` applied to it where `at` sees it, or a
        `dtype=torch.bfloat16` where it is built."""
        if self._half_calls is None:
            self._half_calls = {}
            for call in self._calls:
                if method_name(call) in ("half", "bfloat16", "to", "type") and self._makes_half(call):
                    cast = self._acted_on(call)
                    tree = self._tree_cast_by(call)
                    if tree is not None:
                        cast.append(self.code(tree))
                    for acted in cast:
                        self._half_calls.setdefault(acted, []).append(call)
        for call in self._visible_calls(self._half_calls.get(code, ()), at, expr):
            return call
        if code not in self._half_builds:  # the same for every question about `code`
            self._half_builds[code] = next(
                (
                    call
                    for _, source in self._assignments.get(code, ())
                    for call in (self.index.find(cst.Call, within=source) if source is not None else ())
                    if (dtype := kwarg(call, "dtype")) is not None and self.names.is_(dtype.value, *HALF_NAMES)
                ),
                None,
            )
        return self._half_builds[code]

    def _tree_cast_by(self, call: cst.Call) -> cst.BaseExpression | None:
        """The model whose parts a loop over them casts by `call`, a cast: a submodule cast
        in place (`for m in model.modules(): m.bfloat16()`), or a tensor of a submodule or a
        parameter replaced by its cast (`p.data = p.data.half()` over `model.parameters()`,
        `m.weight.data = m.weight.data.bfloat16()`). A loop that casts only the parts it
        picks (`if isinstance(m, nn.Linear):`) counts too: the program sets each part's
        precision itself. None for any other cast."""
        receiver = module_of_chain(call.func.value)
        part = self.kinds.module_part(receiver) if isinstance(receiver, cst.Name) else None
        if part is not None and part[1] in SUBMODULE_METHODS:
            return part[0]
        assign = self.parents.get(call)
        if not (isinstance(assign, cst.Assign) and assign.value is call):
            return None
        for target in assign.targets:
            replaced = target.target
            if isinstance(replaced, cst.Attribute) and replaced.attr.value in REPLACING_ATTRIBUTES:
                root = replaced.value  # `m` of `m.weight.data`
                while isinstance(root, cst.Attribute):
                    root = root.value
                part = self.kinds.module_part(root) if isinstance(root, cst.Name) else None
                if part is not None:
                    return part[0]
        return None

    def _makes_half(self, call: cst.Call) -> bool:
        if method_name(call) in ("half", "bfloat16"):
            return not call.args
        values = [a.value for a in call.args if a.keyword is None or a.keyword.value == "dtype"]
        return any(self.names.is_(v, *HALF_NAMES) for v in values)

    def _makes_float64(self, call: cst.Call) -> bool:
        method = method_name(call)
        if method == "double":
            return True
        if method == "type":
            first = positional(call, 0)
            return first is not None and (
                self._is_float64(first.value) or self.names.is_(first.value, *DOUBLE_TENSOR_TYPES)
            )
        if method == "to":
            values = [a.value for a in call.args if a.keyword is None or a.keyword.value == "dtype"]
            return any(self._is_float64(v) for v in values)
        return False

    def _is_float64(self, expr: cst.BaseExpression) -> bool:
        return self.names.is_(expr, *FLOAT64_NAMES)

    # -- CUDA --------------------------------------------------------------------------

    def _first_cuda_use(self) -> cst.CSTNode | None:
        if "cuda" not in self.context.code:
            return None
        imported = "from torch.cuda" in self.context.code or "from torch import cuda" in self.context.code
        found: list[cst.CSTNode] = []
        for string in self.index.find(cst.SimpleString):
            value = string.evaluated_value
            if isinstance(value, str) and DEVICE_STRING.match(value) and value.startswith("cuda"):
                found.append(string)
        for string in self.index.find(cst.FormattedString):
            if self.kinds.is_device(string):
                found.append(string)
        for call in self._calls:
            if method_name(call) == "cuda":
                found.append(call)
            elif (
                _mentions(call.func, "cuda", imported)
                and self.names.startswith(call.func, ("torch.cuda",))
                and not self.names.is_(call.func, *CUDA_PROBES)
            ):
                found.append(call)
        return min(found, key=self._start) if found else None

    @functools.cached_property
    def accelerator_use(self) -> cst.CSTNode | None:
        """The first node of the file that may put a tensor on an accelerator (a CUDA use,
        a device string or `torch.device` of another type than the CPU, `.cuda()`, a
        `.to(...)` whose argument is not a dtype or a CPU device, a `device=` or
        `map_location=` that may name one, a model loaded without `map_location`, a call
        of torch's accelerator, data-parallel or process-group API), or the module when a
        project module it imports may do so; None when the program keeps every tensor on
        the host: then nothing it does waits for a GPU."""
        if self.cuda_use is not None:
            return self.cuda_use
        found: list[cst.CSTNode] = []
        for string in self.index.find(cst.SimpleString):
            value = string.evaluated_value
            if isinstance(value, str) and DEVICE_STRING.match(value) and not value.startswith("cpu"):
                found.append(string)
        for call in self._calls:
            if self._may_place_on_accelerator(call):
                found.append(call)
        if found:
            return min(found, key=self._start)
        if project_of(self.context).imported_module_mentioning(*ACCELERATOR_WORDS) is not None:
            return self.module
        return None

    def synchronized_before(self, node: cst.CSTNode, loop: cst.For | cst.While) -> cst.Call | None:
        """The `torch.cuda.synchronize()` (or another device's) that runs in `loop`'s body
        on every step on a device before `node`, with no device work queued between them
        (only host calls and reads of values to the host): at `node` the device has
        nothing left to run, so reading a tensor there waits for nothing. None when there
        is no such call. A synchronize under an `if` counts when the `if` tests the device
        (`if device_type == "cuda":`): where it is false there is no such device to wait for."""
        if any(isinstance(a, (cst.For, cst.While)) for a in self._ancestors_until(node, loop)):
            return None  # in a loop of the step: its later passes queue work the first did not wait for
        start = self._start(node)
        calls = [c for c in self.steps.own_calls(loop.body) if self.names.is_(c.func, *DEVICE_SYNCHRONIZES)]
        for sync in sorted(calls, key=self._start, reverse=True):
            if self._start(sync) >= start or not self._every_step_on_device(sync, loop):
                continue
            end = self.index.end(self.statement_of(sync))
            between = [c for c in self.steps.own_calls(loop.body) if end < self._start(c) < start]
            return None if any(self._queues_device_work(c) for c in between) else sync
        return None

    def synchronizes_every_step(self, loop: cst.For | cst.While) -> cst.Call | None:
        """The `torch.cuda.synchronize()` (or another device's, or a call of a name bound to
        it on that device: `_synchronizes`) that `loop`'s body runs on every step on a device
        (timing code often does): each step then waits for the device whatever else it
        reads. None when there is none."""
        calls = [c for c in self.steps.own_calls(loop.body) if self._synchronizes(c)]
        waits = [sync for sync in calls if self._every_step_on_device(sync, loop)]
        # CUDA's first where one branch per device waits (`if device == "mps": ... elif ...`)
        return min(waits, key=lambda sync: not self.names.is_(sync.func, "torch.cuda.synchronize"), default=None)

    def _synchronizes(self, call: cst.Call) -> bool:
        """Does `call` wait for a device: a synchronize of torch's, or a call of a name bound
        only to one where the program runs on that device (`synchronize =
        torch.cuda.synchronize if device_type == "cuda" else lambda: None`)?"""
        if self.names.is_(call.func, *DEVICE_SYNCHRONIZES):
            return True
        sources = self.kinds.value_sources(call.func) if isinstance(call.func, cst.Name) else []
        return bool(sources) and all(
            isinstance(value, cst.IfExp)
            and self._device_test(value.test)
            and (self.names.is_(value.body, *DEVICE_SYNCHRONIZES) or self.names.is_(value.orelse, *DEVICE_SYNCHRONIZES))
            or value is not None
            and self.names.is_(value, *DEVICE_SYNCHRONIZES)
            for value in sources
        )

    def _ancestors_until(self, node: cst.CSTNode, stop: cst.CSTNode) -> Iterator[cst.CSTNode]:
        for ancestor in self.index.ancestors(node):
            if ancestor is stop:
                return
            yield ancestor

    def _every_step_on_device(self, node: cst.CSTNode, loop: cst.CSTNode) -> bool:
        for ancestor in self.index.ancestors(node):
            if ancestor is loop:
                return True
            if isinstance(ancestor, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.Try, cst.Else)):
                return False
            if isinstance(ancestor, cst.If) and not self._device_test(ancestor.test):
                return False
        return False

    def _device_test(self, test: cst.BaseExpression) -> bool:
        """`device_type == "cuda"`, `torch.cuda.is_available()`, `device.type != "cpu"`."""
        if isinstance(test, cst.Call):
            return self.names.is_(test.func, *CUDA_PROBES)
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            sides = (test.left, test.comparisons[0].comparator)
            return any(
                isinstance(side, cst.SimpleString)
                and isinstance(side.evaluated_value, str)
                and DEVICE_STRING.match(side.evaluated_value) is not None
                for side in sides
            )
        return False

    def _queues_device_work(self, call: cst.Call) -> bool:
        """May `call` put work on the device? Not a read to the host (`.item()`), a function
        of Python's host-only modules (`time.time()`, `print`), a method of a string
        (`"...".format`) or the writing of a file `open` gave; anything else may."""
        method = method_name(call)
        if method in SYNC_METHODS or self.names.startswith(call.func, HOST_ONLY_MODULES):
            return False
        if not isinstance(call.func, cst.Attribute):
            return True
        receiver = call.func.value
        if isinstance(receiver, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
            return False
        if isinstance(receiver, cst.Name) and method in ("write", "flush"):
            sources = self.kinds.value_sources(receiver)
            return not sources or not all(
                isinstance(s, cst.Call) and self.names.is_(s.func, "builtins.open") for s in sources
            )
        return True

    def steers(
        self, expr: cst.BaseExpression, depth: int = 0, loss: cst.BaseExpression | None = None
    ) -> cst.CSTNode | None:
        """Where the value of `expr` decides what the program runs: the test of an `if`,
        `while` or conditional expression, an `assert`, an index, a `range(...)` bound, a
        `return` (what the caller does with it is not followed), followed through the
        names it is assigned to (and added to) and the reads those reach. Text made from
        it (an f-string, `.format`, `str`) names or logs it and is not followed. None when
        it steers nothing: it is only logged, stored or accumulated for a log.

        A test that only picks between Python numbers does not decide what runs: a
        conditional expression of two numbers (`w = hi if r > 1 else lo`), an `if` whose
        branches only assign numbers computed on the host (`if r > 1.0: w *= max(min(r,
        8.0), 1.0)`: Python arithmetic, min, max, math). The same device work runs
        either way; the names those branches assign are followed instead. Nor does a
        test for NaN or infinity (`torch.isfinite(loss)`), a guard against a broken step.
        `loss`: the loss a training step backpropagates (`loss` in `loss.backward()`): a
        value that reaches it is not followed further, since what the step does with its
        loss is the step's, whatever went into it."""
        if loss is not None and expr is loss:
            return None
        if depth > MAX_DEPTH:
            return expr
        child = expr
        for ancestor in self._ancestors(expr):
            found = self._steering_by(ancestor, child, depth, loss)
            if found is not _Steering.FLOWS_ON:
                return found
            child = ancestor
        return None

    def _steering_by(
        self, ancestor: cst.CSTNode, child: cst.CSTNode, depth: int, loss: cst.BaseExpression | None
    ) -> cst.CSTNode | None | _Steering:
        """What `ancestor` does with a value that reaches it through `child` (`steers`):
        where the value steers, None when it steers nothing, FLOWS_ON when it passes on to
        the next enclosing node."""
        if isinstance(ancestor, (cst.If, cst.While, cst.IfExp)) and self.index.inside(child, ancestor.test):
            return self._steering_by_test(ancestor, depth, loss)
        if isinstance(ancestor, (cst.Assert, cst.Return, cst.Yield, cst.SubscriptElement)):
            return ancestor
        if isinstance(ancestor, (cst.FormattedString, cst.FunctionDef, cst.Lambda)):
            return None
        if isinstance(ancestor, cst.Call):
            return self._steering_by_call(ancestor)
        if isinstance(ancestor, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            return self._steering_by_assignment(ancestor, depth, loss)
        if isinstance(ancestor, cst.BaseStatement):
            return None
        return _Steering.FLOWS_ON

    def _steering_by_test(
        self, branch: cst.If | cst.While | cst.IfExp, depth: int, loss: cst.BaseExpression | None
    ) -> cst.CSTNode | None | _Steering:
        """A value in the test of `branch`: the test steers, unless it only picks between
        Python numbers (those are followed instead)."""
        if isinstance(branch, cst.IfExp) and self._host_number(branch.body) and self._host_number(branch.orelse):
            return _Steering.FLOWS_ON  # it picks one of two numbers, which flows on
        if isinstance(branch, cst.If) and self._sets_host_numbers(branch):
            return self._steered_by_branches(branch, depth, loss)
        return branch.test

    def _steering_by_call(self, call: cst.Call) -> cst.CSTNode | None | _Steering:
        """A value in the arguments of `call`: a `range(...)` bound steers; a test for NaN or
        infinity and text made from it (`str`, `.format`) steer nothing."""
        if self.names.is_(call.func, *FINITENESS_TESTS) or method_name(call) in FINITENESS_METHODS:
            return None  # tested for NaN or infinity: a guard against a broken step
        if self.names.is_(call.func, "builtins.range"):
            return call
        if self.names.is_(call.func, "builtins.str") or method_name(call) == "format":
            return None
        return _Steering.FLOWS_ON

    def _steering_by_assignment(
        self, assignment: cst.Assign | cst.AugAssign | cst.AnnAssign, depth: int, loss: cst.BaseExpression | None
    ) -> cst.CSTNode | None:
        """A value assigned: where the reads of the names it is assigned to steer."""
        for target in _statement_targets(assignment):
            if not isinstance(target, cst.Name):
                return assignment  # an attribute or an item: where it is read is not followed
            binding = self._own_binding(target)
            if binding is None:
                return assignment
            found = self._steered_by_reads(binding, assignment, depth, loss)
            if found is not None:
                return found
        return None

    def _steered_by_branches(self, node: cst.If, depth: int, loss: cst.BaseExpression | None) -> cst.CSTNode | None:
        """Where the numbers the branches of `node` assign decide what runs, read after it."""
        for assign in self.index.find((cst.Assign, cst.AugAssign, cst.AnnAssign), within=node):
            for target in _statement_targets(assign):
                binding = self._own_binding(target)
                if binding is None:
                    return node.test
                found = self._steered_by_reads(binding, node, depth, loss)
                if found is not None:
                    return found
        return None

    def _own_binding(self, target: cst.Name) -> Assignment | None:
        """The binding an assignment's target makes; None when its scope is not known."""
        scope = self.kinds.scopes.get(target)
        bindings = [b for b in scope.assignments[target.value] if b.node is target] if scope else []
        return bindings[0] if bindings else None

    def _steered_by_reads(
        self, binding: Assignment, outside: cst.CSTNode, depth: int, loss: cst.BaseExpression | None
    ) -> cst.CSTNode | None:
        """Where the first read `binding` reaches outside `outside` that steers does."""
        for read in self.kinds.reached_reads(binding):
            if self.index.inside(read, outside):
                continue
            found = self.steers(read, depth + 1, loss)
            if found is not None:
                return found
        return None

    def _sets_host_numbers(self, node: cst.If) -> bool:
        """Do the branches of `node` (its `elif`s and `else` too) only assign Python numbers
        computed on the host to plain names, with no call but Python's number functions?"""
        body = node.body
        statements = [body] if isinstance(body, cst.SimpleStatementSuite) else list(body.body)
        for statement in statements:
            if isinstance(statement, cst.If):
                if not (self._host_number(statement.test) and self._sets_host_numbers(statement)):
                    return False
                continue
            if not isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                return False
            for small in statement.body:
                if isinstance(small, cst.Pass):
                    continue
                if isinstance(small, cst.Assign):
                    targets = [t.target for t in small.targets]
                elif isinstance(small, (cst.AugAssign, cst.AnnAssign)) and small.value is not None:
                    targets = [small.target]
                else:
                    return False
                if not all(isinstance(t, cst.Name) and self._host_number(t) for t in targets):
                    return False
                if not self._host_number(small.value):
                    return False
        orelse = node.orelse
        if isinstance(orelse, cst.If):
            return self._host_number(orelse.test) and self._sets_host_numbers(orelse)
        if isinstance(orelse, cst.Else):
            return self._sets_host_numbers(cst.If(test=cst.Name("True"), body=orelse.body))
        return True

    def _host_number(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` Python arithmetic on names that hold no tensor, module or batch as far
        as seen, and literals, with no call but Python's number functions (min, max, math)?"""
        if isinstance(expr, (cst.Integer, cst.Float)):
            return True
        if isinstance(expr, cst.Name):
            return self.kinds.fact(expr).kind in (Kind.UNKNOWN, Kind.BOTTOM)
        if isinstance(expr, cst.UnaryOperation):
            return self._host_number(expr.expression)
        if isinstance(expr, (cst.BinaryOperation, cst.BooleanOperation)):
            return self._host_number(expr.left) and self._host_number(expr.right)
        if isinstance(expr, cst.Comparison):
            return self._host_number(expr.left) and all(self._host_number(c.comparator) for c in expr.comparisons)
        if isinstance(expr, cst.IfExp):
            return all(self._host_number(e) for e in (expr.test, expr.body, expr.orelse))
        if isinstance(expr, cst.Call):
            return (
                (
                    self.names.is_(expr.func, *HOST_NUMBER_FUNCTIONS)
                    or self.names.startswith(expr.func, HOST_NUMBER_MODULES)
                )
                and not any(arg.star or arg.keyword is not None for arg in expr.args)
                and all(self._host_number(arg.value) for arg in expr.args)
            )
        return False

    def _may_place_on_accelerator(self, call: cst.Call) -> bool:
        method = method_name(call)
        if method in ACCELERATOR_METHODS or self.names.startswith(call.func, ACCELERATOR_NAMESPACES):
            return True
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value in DEVICE_KEYWORDS and not self._cpu_only(arg.value):
                return True
        if self.names.startswith(call.func, MODEL_LOADERS) and kwarg(call, "map_location") is None:
            return True
        if self.names.is_(call.func, "torch.device"):
            return not self._cpu_only(call)
        if method == "to":
            return any(arg.keyword is None and not self._dtype_or_cpu(arg.value) for arg in call.args) or any(
                arg.keyword is not None and arg.keyword.value == "device" and not self._cpu_only(arg.value)
                for arg in call.args
            )
        return False

    def _dtype_or_cpu(self, expr: cst.BaseExpression) -> bool:
        return self.names.is_(expr, *(f"torch.{name}" for name in DTYPE_NAMES)) or self._cpu_only(expr)

    def _cpu_only(self, expr: cst.BaseExpression) -> bool:
        return self.device_types(expr) == frozenset({"cpu"})

    # -- models and devices ------------------------------------------------------------

    def _find_model_expressions(self) -> set[str]:
        found = set()
        for call in self._calls:
            method = method_name(call)
            if method in ("parameters", "named_parameters"):
                found.add(self.code(call.func.value))
            elif method in ("to", "cuda") and isinstance(self.parents.get(call), cst.Expr):
                found.add(self.code(call.func.value))  # a bare `x.to(device)` only makes sense for modules
        return found

    def _acted_on(self, call: cst.Call) -> list[str]:
        """The models (as code) `call` is a method applied to: `model.to(d)` acts on
        `model`; a link of a chain acts on what the chain is assigned to as well
        (`model = torch.compile(Net().cuda().double())`), and a link after another that
        returns the module acts on its receiver (`model.to(device).to(torch.bfloat16)`
        casts `model`)."""
        found = [self.code(call.func.value), self.code(module_of_chain(call.func.value))]
        current: cst.CSTNode = call
        while True:
            parent = self.parents.get(current)
            if isinstance(parent, cst.Attribute) and parent.value is current:
                current = self.parents.get(parent)
                if not isinstance(current, cst.Call):
                    return found
                continue
            if isinstance(parent, cst.Arg) and isinstance(self.parents.get(parent), cst.Call):
                outer = self.parents.get(parent)
                if self.names.is_(outer.func, "torch.compile") and positional(outer, 0) is parent:
                    current = outer
                    continue
            break
        assign = self.parents.get(current)
        if isinstance(assign, cst.Assign) and assign.value is current:
            found += [self.code(t.target) for t in assign.targets]
        elif isinstance(assign, cst.AnnAssign) and assign.value is current:
            found.append(self.code(assign.target))
        return list(dict.fromkeys(found))

    def _visible_calls(
        self,
        calls: Sequence[cst.Call],
        at: cst.CSTNode,
        model: cst.BaseExpression,
        before: int | None = None,
        last_first: bool = False,
    ) -> Iterator[cst.Call]:
        """The calls of `calls` (of its first `before`) that `_visible` keeps, in their
        order (`last_first`: the other way round): those of the functions and classes
        around `at` (and, for `self.x`, around the model) and those at module level,
        looked up by where each call is instead of asking of every call of the file (a
        name such as `model` that each function of a long file places)."""
        if not calls:
            return iter(())
        attribute = isinstance(model, cst.Attribute)
        key = (id(calls), attribute)
        entry = self._visibility.get(key)
        if entry is None:
            table: dict[cst.CSTNode | None, list[int]] = {}
            for position, call in enumerate(calls):
                table.setdefault(self._visibility_key(call, attribute), []).append(position)
            entry = self._visibility[key] = (calls, table)  # the list is kept: its id stays unique
        table = entry[1]
        keys = {None: None}
        for node in chain((at,), self._ancestors(at)):
            if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                keys[node] = None
        if attribute:
            for node in chain((model,), self._ancestors(model)):
                if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                    keys[node] = None
        limit = len(calls) if before is None else before
        groups = [group for group in (table.get(k) for k in keys) if group]
        if last_first:
            runs = [reversed(group[: bisect_left(group, limit)]) for group in groups]
            return (calls[p] for p in heapq.merge(*runs, reverse=True))
        return (calls[p] for p in heapq.merge(*groups) if p < limit)

    def _visibility_key(self, call: cst.Call, attribute: bool) -> cst.CSTNode | None:
        """The function or class a loop must be in to see `call` (`_visible`); None: every loop."""
        owner = next((a for a in self._ancestors(call) if isinstance(a, (cst.FunctionDef, cst.ClassDef))), None)
        if owner is None or not attribute:
            return owner
        return next((a for a in self._ancestors(owner) if isinstance(a, cst.ClassDef)), owner)

    def _visible(self, call: cst.Call, loop: cst.CSTNode, model: cst.BaseExpression) -> bool:
        owner = next((a for a in self._ancestors(call) if isinstance(a, (cst.FunctionDef, cst.ClassDef))), None)
        if owner is None:
            return True
        if isinstance(model, cst.Attribute):
            # `self.model` moved in the class: seen by a loop in the class, and by the
            # class's own methods that a loop elsewhere calls (`trainer.step(x)`).
            cls = next((a for a in self._ancestors(owner) if isinstance(a, cst.ClassDef)), owner)
            return self.index.inside(loop, cls) or self.index.inside(model, cls)
        return self.index.inside(loop, owner)

    def _moves_device(self, call: cst.Call) -> bool:
        method = method_name(call)
        if method in ("cuda", "cpu"):
            return True
        return method == "to" and self._device_argument(call) is not None

    def _device_argument(self, call: cst.Call) -> cst.BaseExpression | None:
        """The device of a module's `.to(...)`: Module.to takes (device, dtype), (dtype) or (tensor)."""
        device = kwarg(call, "device")
        if device is not None:
            return device.value
        first = positional(call, 0)
        if first is None or self.kinds.is_dtype(first.value):
            return None
        if self.kinds.fact(first.value).kind is Kind.TENSOR:
            return None
        return first.value

    # -- bindings ------------------------------------------------------------------------

    def _index_assignments(self) -> dict[str, list[tuple[cst.CSTNode, cst.BaseExpression | None]]]:
        """Target code -> (target, value) of every plain assignment in the file."""
        index: dict[str, list[tuple[cst.CSTNode, cst.BaseExpression | None]]] = {}
        for assign in self.index.find((cst.Assign, cst.AnnAssign)):
            for target in _statement_targets(assign):
                index.setdefault(self.code(target), []).append((target, assign.value))
        return index

    def _every_binding(self, name: cst.Name) -> list[tuple[cst.CSTNode, cst.BaseExpression | None]]:
        """(binding node, the expression it takes its value from) for EVERY binding of `name`
        in its scope, wherever it is: the value of an assignment, the iterable of a `for`,
        the item of a `with`; None as the expression where it cannot be told (parameters,
        unpacking). For structural questions only, which must see every binding whether or
        not it reaches a read: is a name re-bound inside a statement or bound before it
        (`defined_before`), where a loop binds it (`_model_result_outside`), is a parameter its
        only binding (`_passed_model`, `device_types`, `_passed_in_from_elsewhere`), does
        every definition of a function run a model (`_runs_model`), what every binding
        and `.append` of a list adds (`_parameter_name_models`). What a read may hold is
        `Kinds.value_sources` / `_last_source` (`Kinds.sources`)."""
        scope = self.kinds.scopes.get(name)
        if scope is None:
            return []
        assignments = scope[name.value]
        # libcst shares one set of bindings between the scopes that see them: a name bound
        # many times at module level is asked about from each of its uses.
        key = id(assignments)
        if key not in self._sites_of_bindings:
            sites = [(a.node, self.kinds.binding_source(a.node)) for a in assignments if isinstance(a, Assignment)]
            self._sites_of_bindings[key] = (assignments, sites)  # the set is kept: its id stays unique
        return list(self._sites_of_bindings[key][1])

    def _binding_sources(self, name: cst.Name) -> list[cst.BaseExpression | None]:
        return [source for _, source in self.kinds.reaching_sources(name)]

    def _attribute_sources(self, expr: cst.Attribute) -> list[cst.BaseExpression | None]:
        return [value for _, value in self._assignments.get(self.code(expr), ())]

    def _last_source(self, expr: cst.BaseExpression, before: cst.CSTNode | None = None) -> cst.BaseExpression | None:
        """The value of the last binding whose value `expr` may hold (before `before`, when
        given): for a name, of the bindings that reach it (`Kinds.sources`, flow-sensitive);
        for `self.x`, of the assignments to it anywhere in the file."""
        if isinstance(expr, cst.Name):
            reaching = [(b.node, self.kinds.binding_source(b.node)) for b in self.kinds.sources(expr)]
            sites = [(n, s) for n, s in reaching if s is not None]
        elif isinstance(expr, cst.Attribute):
            sites = [(n, s) for n, s in self._assignments.get(self.code(expr), ()) if s is not None]
        else:
            return None
        if before is not None:
            limit = self._start(before)
            earlier = [(n, s) for n, s in sites if self._start(n) < limit]
            sites = earlier or sites
        if not sites:
            return None
        return max(sites, key=lambda site: self._start(site[0]))[1]

    def _local_function(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
        if not isinstance(func, cst.Name):
            return None
        scope = self.kinds.scopes.get(func)
        if scope is None:
            return None
        found = [a.node for a in scope[func.value] if isinstance(a, Assignment)]
        return found[0] if len(found) == 1 and isinstance(found[0], cst.FunctionDef) else None

    def _is_builtin(self, func: cst.BaseExpression) -> bool:
        return isinstance(func, cst.Name) and func.value in BUILTIN_NAMES and not self.names.local(func)

    # -- tree helpers ----------------------------------------------------------------------

    def _ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self.parents.get(node)
        while current is not None:
            yield current
            current = self.parents.get(current)

    def _ancestors_in_scope(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        for ancestor in self._ancestors(node):
            if isinstance(ancestor, SCOPE_BOUNDARIES):
                return
            yield ancestor

    def _crosses_scope(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        for current in self._ancestors(node):
            if current is ancestor:
                return False
            if isinstance(current, SCOPE_BOUNDARIES):
                return True
        return True

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement of a block (or of the module) that contains `node`."""
        current = node
        for parent in self._ancestors(node):
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                return current
            current = parent
        return current

    def _start(self, node: cst.CSTNode) -> int:
        return self.index.order(node)


# -- module-level helpers ------------------------------------------------------------------


# Calls of these run no matrix product but those the table lists (torch), or none (Python, numpy).
_NO_PRODUCT_MODULES = ("torch", *NO_TORCH_MODULES, *RUNTIME_WITHOUT_PRODUCTS)


def _without_products(name: str) -> bool:
    return any(name == module or name.startswith(module + ".") for module in _NO_PRODUCT_MODULES)


class _MatrixProducts:
    """One search for matrix products from the body of a training loop
    (`Training.multiplies_matrices`); each class, function and value is read once."""

    FUNCTIONS = MATRIX_PRODUCTS  # what is searched for: torch's functions and classes
    METHODS = MATRIX_PRODUCT_METHODS  # and tensor methods

    def __init__(self, training: Training) -> None:
        self.training = training
        self.found: cst.Call | None = None  # the first call found
        self.seen: set[cst.CSTNode] = set()
        self.fields: set[tuple[cst.ClassDef, str]] = set()  # attributes of instances read already
        self.depth = 0  # code being read, nested
        self.built: set[cst.BaseExpression] = set()  # values followed already

    def in_code(self, node: cst.CSTNode) -> bool | None:
        """Products in the code under `node` (a block, a function, a class) and in what it calls."""
        if node in self.seen:
            return False  # read already: its products are counted where it was first met
        if self.depth >= MAX_PRODUCT_DEPTH:
            return None  # too deep a chain of calls and classes to follow
        self.seen.add(node)
        self.depth += 1
        try:
            return self._in_code(node)
        finally:
            self.depth -= 1

    def _in_code(self, node: cst.CSTNode) -> bool | None:
        index = self.training.index
        if any(isinstance(b.operator, cst.MatrixMultiply) for b in index.find(cst.BinaryOperation, within=node)):
            return True
        if any(isinstance(a.operator, cst.MatrixMultiplyAssign) for a in index.find(cst.AugAssign, within=node)):
            return True
        return _first_true(self.in_call(call) for call in index.find(cst.Call, within=node))

    def in_call(self, call: cst.Call) -> bool | None:
        training = self.training
        func = call.func
        names = training.names.of(func)
        if (
            names & self.FUNCTIONS
            or (
                isinstance(func, cst.Attribute)
                and func.attr.value in self.METHODS
                and not self._of_instance(func)  # `self.inner(x)` calls a field of the class
            )
        ) and self.keeps(call):
            self.found = self.found or call
            return True
        if names:
            if any(n == p or n.startswith(p + ".") for n in names for p in MODEL_LOADERS):
                return None  # a model read from a file or a hub
            if all(_without_products(n) for n in names):
                # torch's other operations and classes, builtins; the modules they are given run
                # (`torch.func.functional_call(model, params, x)`, `checkpoint(block, x)`).
                return _first_true(
                    self.in_value(arg.value)
                    for arg in call.args
                    if isinstance(arg.value, (cst.Name, cst.Attribute)) and training.is_model(arg.value)
                )
            # A class or function of a project module, read there; another library's: unknown.
            return self.in_project(func)
        cls = training.kinds.local_class(func) if isinstance(func, cst.Name) else None
        if cls is not None:
            return self.in_class(cls)
        function = training.steps.callee(call)
        if function is not None:
            return self.in_code(function)
        if isinstance(func, cst.Attribute) and method_name(call) in MODULE_METHODS:
            return False  # `.to(device)`, `.parameters()`: the module's own methods
        return self.in_value(func)

    def keeps(self, call: cst.Call) -> bool:
        return True

    def in_project(self, func: cst.BaseExpression) -> bool | None:
        return project_of(self.training.context).matrix_products(func)

    def in_class(self, cls: cst.ClassDef) -> bool | None:
        """Products in the methods of a class of this file and in the modules it builds;
        its bases of this file too, torch's classes as the table says, others unknown."""
        if cls in self.seen:
            return False
        training = self.training
        verdicts: list[bool | None] = []
        for base in cls.bases:
            local = training.kinds.local_class(base.value)
            names = training.names.of(base.value)
            if local is not None:
                verdicts.append(self.in_class(local))
            elif names & self.FUNCTIONS:
                return True  # a subclass of nn.Linear, nn.Conv2d, ...
            elif not names or not all(_without_products(n) for n in names):
                # A base of a project module, read there; another library's may run anything.
                verdicts.append(self.in_project(base.value) if names else None)
        verdicts.append(self.in_code(cls))
        return _first_true(verdicts)

    def in_value(self, func: cst.BaseExpression) -> bool | None:
        """Products of calling a value: a module or function bound to a name or to an
        attribute of `self`, followed to where it is built. A method of a value that is not
        a module (`x.view`, `opt.step`) multiplies nothing the table does not list."""
        training = self.training
        if isinstance(func, cst.Attribute):
            receiver = func.value
            if self._of_instance(func):
                field = (training.kinds.instance_class(receiver), func.attr.value)
                if field in self.fields:
                    return False  # read already (`self.model = DDP(self.model)`)
                self.fields.add(field)
                values = training.steps.values_of(func)
                if not values:
                    return False  # a method it inherits from torch's nn.Module (its bases are read)
                return _first_true(self.in_built(v) for v in values)
            if training.kinds.fact(receiver).kind is Kind.MODULE or training.is_model(receiver):
                return self.in_value(receiver)  # `model.encode(x)`, `self.encoder.embed(x)`
            return False
        if isinstance(func, cst.Name):
            if func in self.seen:
                return False
            self.seen.add(func)
            function = training.context.bindings.local_function(func)
            if function is not None:
                return self.in_code(function)  # `fn = dice if binary else multiclass_dice`, then `fn(x, y)`
            bound = training.context.bindings.param_of(func)
            if bound is not None and bound[0].params.params and bound[0].params.params[0] is bound[1]:
                owner = training.kinds.class_of(bound[0])  # a method's `self` (`self(x)`, `super(Net, self)`)
                if owner is not None:
                    return self.in_class(owner)  # its class (once)
            sources = training.kinds.value_sources(func)
            if not sources or any(s is None for s in sources):
                return None  # a parameter passed from elsewhere, an unpacked value
            return _first_true(self.in_built(s) for s in sources)
        if isinstance(func, cst.Subscript):
            return self.in_value(func.value)  # `self.layers[i](x)`, `heads[name](x)`
        return None  # the result of a call called (`getattr(self, name)(x)`), a lambda

    def _of_instance(self, func: cst.Attribute) -> bool:
        """`self.x`, `obj.x`: an attribute of an instance of a class of this file."""
        receiver = func.value
        return isinstance(receiver, cst.Name) and self.training.kinds.instance_class(receiver) is not None

    def in_built(self, expr: cst.BaseExpression) -> bool | None:
        """Products of what `expr` (the value a module or function was given) builds and runs."""
        if expr in self.seen or expr in self.built:
            return False
        self.built.add(expr)
        training = self.training
        if isinstance(expr, cst.Name):
            return self.in_value(expr)
        if isinstance(expr, cst.Attribute):
            return self.in_value(expr) if _is_self_field(expr) else None
        if isinstance(expr, cst.Subscript):
            return self.in_built(expr.value)  # `models[name]`, `self.heads[0]`
        if isinstance(expr, cst.IfExp):
            return _first_true((self.in_built(expr.body), self.in_built(expr.orelse)))
        if isinstance(expr, (cst.List, cst.Tuple, cst.Dict, cst.ListComp, cst.DictComp)):
            # A list of modules may be filled after it is made (`layers.append(...)`): all of
            # the function that makes it is read.
            function = training.index.first_enclosing(expr, cst.FunctionDef)
            return self.in_code(function) if function is not None else None
        if not isinstance(expr, cst.Call):
            return self.in_code(expr)
        names = training.names.of(expr.func)
        if isinstance(expr.func, cst.Attribute) and method_name(expr) in MODULE_METHODS:
            return self.in_built(expr.func.value)  # `Net().to(device)`: the module itself
        if names & MODEL_WRAPPERS:
            wrapped = positional(expr, 0)
            return self.in_built(wrapped.value) if wrapped is not None else None  # `DDP(model)`
        verdicts = [self.in_code(expr)]
        if names & MODULE_CONTAINERS:  # `nn.Sequential(encoder, head)`, `nn.ModuleList(layers)`: what it holds
            verdicts.extend(self.in_built(a.value) for a in expr.args if not isinstance(a.value, cst.Call))
        return _first_true(verdicts)


class _Float32Matmuls(_MatrixProducts):
    """The same search, for the products cuBLAS runs (`runs_float32_matmuls`)."""

    FUNCTIONS = FLOAT32_MATMULS

    def in_project(self, func: cst.BaseExpression) -> bool | None:
        return project_of(self.training.context).matrix_products(func, only_matmuls=True)


class _CallSearch(_MatrixProducts):
    """The same search, for calls of other functions and methods (`first_run`)."""

    def __init__(self, training: Training, functions: frozenset[str], methods: frozenset[str], keep=None) -> None:
        super().__init__(training)
        self.FUNCTIONS, self.METHODS, self.keep = functions, methods, keep

    def keeps(self, call: cst.Call) -> bool:
        return self.keep is None or self.keep(call)

    def in_project(self, func: cst.BaseExpression) -> bool | None:
        return None  # the project's summaries answer for matrix products only: not read here

    def _in_code(self, node: cst.CSTNode) -> bool | None:
        index = self.training.index
        return _first_true(self.in_call(call) for call in index.find(cst.Call, within=node))


def _first_true(verdicts) -> bool | None:
    """True as soon as one verdict is; else None when one is; else False."""
    unknown = False
    for verdict in verdicts:
        if verdict:
            return True
        unknown = unknown or verdict is None
    return None if unknown else False


def _is_self_field(expr: cst.Attribute) -> bool:
    return is_self(expr.value)


def _statement_targets(assignment: cst.Assign | cst.AugAssign | cst.AnnAssign) -> list[cst.BaseExpression]:
    """The targets of an assignment statement (each of `a = b = value`)."""
    return [t.target for t in assignment.targets] if isinstance(assignment, cst.Assign) else [assignment.target]


def _bound_targets(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The assigned expressions of a target, through tuple and list unpacking."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [t for e in target.elements for t in _bound_targets(e.value)]
    if isinstance(target, cst.StarredElement):
        return _bound_targets(target.value)
    return [target]


def _is_true(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "True"


class _Placements(NamedTuple):
    receivers: list[str]  # the code of each placement call's receiver, sorted
    calls: list[tuple[cst.Call, str]]  # (call, receiver), in the order of `receivers`
    acting_on: dict[str, list[cst.Call]]  # model code -> the placement calls applied to it (Training._acted_on)
    starts: dict[str, list[int]]  # model code -> where each of its `acting_on` calls starts, in order
    float64_on: dict[str, list[cst.Call]]  # model code -> those of its calls that make it float64

    def under(self, code: str) -> Iterator[tuple[cst.Call, str]]:
        """(call, receiver) of the calls on a part of `code`: `code.head.to(d)`, `code[0].cuda()`."""
        for prefix in (code + ".", code + "["):
            # The receivers that start with `prefix` sort together, before `prefix` with its last character bumped.
            end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            yield from self.calls[bisect_left(self.receivers, prefix) : bisect_left(self.receivers, end)]


def _union(*parts: frozenset[str] | None) -> frozenset[str] | None:
    """The union of device-type sets; None (anything) when one of them is."""
    if not parts or any(part is None for part in parts):
        return None
    return frozenset().union(*parts)


def _dict_value(source: cst.BaseExpression, key: str, training: Training, depth: int = 0) -> cst.BaseExpression | None:
    """The value a dict literal (or a name bound only to one) holds under `key`."""
    if isinstance(source, cst.Name) and depth < MAX_DEPTH:
        sources = training.kinds.value_sources(source)
        found = [_dict_value(s, key, training, depth + 1) if s is not None else None for s in sources]
        return found[0] if len(found) == 1 else None
    if not isinstance(source, cst.Dict):
        return None
    return dict_entry(source, key)


def _mentions(func: cst.BaseExpression, name: str, imported: bool) -> bool:
    """Can the dotted callee `func` be in the module `name`: does it spell `name`
    (`torch.cuda.synchronize`), or is it a bare name while the file imports
    from that module (`synchronize` from `from torch.cuda import synchronize`)?"""
    while isinstance(func, cst.Attribute):
        if func.attr.value == name:
            return True
        func = func.value
    return imported and isinstance(func, cst.Name)


def _index(body: list, statement: cst.CSTNode) -> int:
    return next(i for i, s in enumerate(body) if s is statement)

"""What a training loop's forward pass runs, for deciding whether autocast may wrap it.
The one place that follows the forward region into what it calls: helpers of the file,
the `forward` of the file's model classes, the modules a call runs where they are built,
and the modules a model class of another module of the project builds.

`forward_runs(context)` (built once per file, FileContext.shared) answers, for a
`TrainingLoop` whose `forward` is known:

- `start(loop)`: where the forward pass starts (where a report points);
  `wrapped(loop)`: the first and the last statement autocast wraps;
- `functions(statements)`: the functions of this file the statements run (helpers they
  call, the `forward` of model classes of this file, and what those reach);
- `autocast_inside(loop)`: autocast entered by what the forward pass runs;
- `decision(loop)`: a call whose result steers the program (a value read to the host that
  decides what runs, a sample drawn from the model's output), which lower precision could
  change;
- `autocast_unsafe(loop)`: (call, alternative) for a call CUDA autocast refuses;
- `float16_only(loop)`: why the forward may run a module CUDA autocast runs in float16
  whatever its dtype (a cuDNN RNN), said as the start of a sentence;
- `callees(loop)`: (call, qualified name, what builds the module or None) of what it runs;
- `model_class(func)`, `constructions(func)`: the class of this file a model called as
  `func` is an instance of, and the calls that build it;
- for Lightning modules: `module_functions(modules)` (the classes and the functions of
  the file their methods call), `autocasts_in(modules)` (they enter autocast themselves)
  and `recurrent_in(modules)` (a cuDNN RNN they build).

For the training loops of the file as a whole, and for one loop:

- `unwrapped()`: the training loops whose forward pass is not under autocast and whose
  models are not cast to 16 bits already (`.bfloat16()`, `.to(torch.half)`), one per
  forward region (a helper several loops call is one region); `elsewhere()`: autocast
  entered outside every training loop's own;
- `precision_owner(loop)`: an `Owner` (the engine whose `backward(loss)` the loop calls
  and that applies a mixed precision itself, `accelerate.Accelerator`, Fabric; the
  keyword that sets it; whether its construction sets it or may through `**kwargs`);
- `precision_chosen(loop)`: why the author asked for float32 or more (a float64 model,
  exact float32 results), as a sentence, or None;
- `steering(loop)`: why the forward pass may not run in lower precision at all (it
  decides what runs next, it calls an op CUDA autocast refuses), or None;
- `no_model_call(loop)`: nothing runs a model before the loss (no forward pass to speed up);
- `device_model(loop)`: the model of the loop that is moved to a device, whose device
  the policy is built from, or None; `device_untold(loop)`: no model is moved, yet the
  script may train on CUDA; `on_host(loop)`: the model is moved only to the host;
- `lower_precision_problem(loop, fp16)`: why the policy would not train as wanted, or
  not faster (a cuDNN RNN or `nn.DataParallel` under bf16, a GradScaler's calls that
  cannot be placed, every matrix product bound by memory), or None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from codemod.analysis.distributed import data_parallel
from codemod.analysis.local_calls import local_calls
from codemod.analysis.names import kwarg, positional, sole_definition
from codemod.analysis.policy_sites import policy_sites
from codemod.analysis.project import project_of
from codemod.analysis.sizes import launch_bound, sizes_of, widest_memory_bound
from codemod.analysis.torch_facts import (
    AUTOCAST_FLOAT16,
    AUTOCAST_UNSAFE,
    MODEL_WRAPPERS,
    PRECISION_OWNERS,
    autocast_float16,
)
from codemod.analysis.training import NO_FORWARD
from codemod.analysis.values import Place

if TYPE_CHECKING:
    from codemod.analysis.training import Model, TrainingLoop
    from codemod.context import FileContext

KEY = "forward_runs"


def forward_runs(context: FileContext) -> ForwardRuns:
    return context.shared(KEY, ForwardRuns)


class Owner(NamedTuple):
    """An engine that runs the backward pass and applies a mixed precision of its own."""

    call: cst.Call  # its construction, `Accelerator(...)`
    keyword: str  # the keyword that sets its precision, `mixed_precision`
    configured: bool  # the construction passes it, or may through `*args` / `**kwargs`


class ForwardRuns:
    def __init__(self, context: FileContext) -> None:
        self.context = context

    # -- the loops of the file ---------------------------------------------------------

    def unwrapped(self) -> list[TrainingLoop]:
        """The training loops whose forward pass is not under autocast and whose models
        are not 16-bit already, nor run in a compute dtype of the script's own (a GradScaler
        built only when it is float16), the first of each forward region (a helper several
        loops call is wrapped once)."""
        found, regions = [], set()
        for loop in self.context.training.loops:
            key = loop.forward.statements[0] if loop.forward is not None else loop.loop
            own_dtype = loop.scaler is not None and loop.scaler.compute_dtype is not None
            if loop.autocast is None and loop.half is None and not own_dtype and key not in regions:
                regions.add(key)
                found.append(loop)
        return found

    def elsewhere(self) -> list[cst.CSTNode]:
        """Autocast entered outside the autocast of every training loop."""
        training = self.context.training
        inside = [loop.autocast.node for loop in training.loops if loop.autocast is not None]
        return [use for use in training.autocast_uses if not any(self.context.inside(use, n) for n in inside)]

    # -- the forward region ----------------------------------------------------------

    def start(self, loop: TrainingLoop) -> cst.CSTNode:
        """Where the forward pass starts, to point a report at: its first statement, else the loop."""
        return loop.forward.statements[0] if loop.forward is not None and loop.forward.statements else loop.loop

    def wrapped(self, loop: TrainingLoop) -> tuple[cst.BaseStatement, cst.BaseStatement]:
        """The first and the last statement autocast wraps: the forward region, from the
        first model call to the loss (of a loop whose forward region is known)."""
        statements = loop.forward.statements
        return statements[0], statements[-1]

    def no_model_call(self, loop: TrainingLoop) -> bool:
        """Does nothing run a model before the loss: no forward pass to speed up?"""
        problem = loop.forward_problem
        return loop.forward is None and bool(problem) and problem.startswith(NO_FORWARD)

    def device_untold(self, loop: TrainingLoop) -> bool:
        """Is the device the forward pass runs on unknown: no model of the loop is moved,
        yet the script uses CUDA and does not visibly train on the host?"""
        training = self.context.training
        if self.device_model(loop) is not None or training.cuda_use is None:
            return False
        return not training.placement.trains_on_host(loop.loop)

    def on_host(self, loop: TrainingLoop) -> bool:
        """Is the model moved only ever to the host (where CPU autocast pays off only on
        CPUs with bf16 units)?"""
        model = self.device_model(loop)
        return model is not None and model.places == {Place.HOST}

    # -- what decides the precision --------------------------------------------------

    def precision_owner(self, loop: TrainingLoop) -> Owner | None:
        owner = next((b.owner for b in loop.backwards if b.owner is not None), None)
        if owner is None:
            return None
        keyword = PRECISION_OWNERS[next(n for n in self.context.names.of(owner.func) if n in PRECISION_OWNERS)]
        return Owner(owner, keyword, kwarg(owner, keyword) is not None or any(arg.star for arg in owner.args))

    def precision_chosen(self, loop: TrainingLoop) -> str | None:
        """Why the author asked for float32 or more, which autocast would undo."""
        line = self.context.line
        if loop.float64 is not None:
            return (
                f"the model is float64 (line {line(loop.float64)}): autocast would lower the precision its author chose"
            )
        exact = self.context.training.exact_float32
        if exact is not None:
            return f"the script asks for exact float32 results (line {line(exact)}); autocast would undo that"
        return None

    def steering(self, loop: TrainingLoop) -> str | None:
        """Why the forward pass may not run under autocast at all: its values decide what
        runs next, or it calls an op CUDA autocast refuses."""
        training, line = self.context.training, self.context.line
        decision = self.decision(loop)
        if decision is not None:
            return (
                f"the forward pass decides what runs next (`{training.code(decision)}`, line {line(decision)}): "
                "in lower precision it may decide otherwise, and the run would take another path"
            )
        unsafe = self.autocast_unsafe(loop)
        if unsafe is not None:
            call, alternative = unsafe
            return (
                f"`{training.code(call.func)}` (line {line(call)}) raises under CUDA autocast; compute the loss "
                f"from logits with {alternative}, then run the forward pass under autocast"
            )
        return None

    def device_model(self, loop: TrainingLoop) -> Model | None:
        """The first model of the loop that is moved to a device."""
        return next((model for model in loop.models if model.move is not None), None)

    def lower_precision_problem(self, loop: TrainingLoop, fp16: bool) -> str | None:
        """Why autocast with the policy would not train as wanted, or not faster."""
        training = self.context.training
        recurrent = None if fp16 else self.float16_only(loop)
        if recurrent is not None:
            return (
                f"{recurrent}, which CUDA autocast runs in float16 whatever dtype it is given: bf16 autocast would "
                'train it in float16 without a gradient scaler; set `amp = "fp16"` (autocast with a GradScaler) '
                "to fix it"
            )
        replicated = None if fp16 else next(iter(data_parallel(self.context)), None)
        if replicated is not None:
            return (
                f"`{training.code(replicated.func)}` (line {self.context.line(replicated)}) runs each replica in a "
                "thread of its own, where autocast is entered again without the dtype: bf16 autocast would run "
                "the replicas in float16 without a gradient scaler; use DistributedDataParallel (PM601), or set "
                '`amp = "fp16"` (autocast with a GradScaler)'
            )
        problem = policy_sites(self.context).scaler_problem(loop) if fp16 else None
        return problem if problem is not None else self.narrow_step(loop)

    def narrow_step(self, loop: TrainingLoop) -> str | None:
        """Why 16-bit products buy nothing: every model the step runs is sized, none convolves,
        and each matrix product they make waits for memory in float32 already, or, over the rows
        of the step's batch, takes less device time than its launch; None otherwise."""
        work = sizes_of(self.context).step_work(loop.loop)
        if work is None or work.convolves:
            return None
        if not work.products:
            return "the models the step runs make no matrix product or convolution: autocast has nothing to speed up"
        why = widest_memory_bound(work.products)
        if why:
            return (
                f"every matrix product of the step is bound by memory, not arithmetic: {why}; autocast would "
                "add a cast before each product and speed up nothing"
            )
        launched = launch_bound(work.products, sizes_of(self.context).step_rows(loop.loop))
        if launched:
            return (
                f"every matrix product of the step is too short to keep the device busy: {launched}; autocast "
                "would add a cast kernel before each product and save no time"
            )
        return None

    # -- Lightning modules -----------------------------------------------------------

    def autocasts_in(self, modules: tuple[cst.ClassDef, ...]) -> bool:
        """Do the modules (or the functions of the file their methods call) enter autocast?"""
        reached = self.module_functions(modules)
        return any(self.context.inside(use, node) for use in self.context.training.autocast_uses for node in reached)

    def module_functions(self, modules: tuple[cst.ClassDef, ...]) -> list[cst.CSTNode]:
        """The classes and the functions of this file their methods call."""
        steps = self.context.loops
        found: list[cst.CSTNode] = list(modules)
        for cls in modules:
            found += [f for f in steps.functions_reached(cls.body) if f not in found]
        return found

    def recurrent_in(self, modules: tuple[cst.ClassDef, ...]) -> str | None:
        """A cuDNN RNN the modules build (`nn.LSTM(...)`), said as the start of a sentence."""
        names = self.context.names
        for cls in modules:
            for call in self.context.index.find(cst.Call, within=cls):
                if any(autocast_float16(name) for name in names.may_name(call.func)):
                    return f"`{self.context.source(call.func)}` (line {self.context.line(call)}) is a cuDNN RNN"
        return None

    # -- autocast already there, or refused --------------------------------------------

    def autocast_inside(self, loop: TrainingLoop) -> list[cst.CSTNode]:
        """Autocast entered by what the forward pass runs: the model's own forward
        method (a class of this file), or a function of this file it calls."""
        if loop.forward is None:
            return []
        functions = self.functions(loop.forward.statements)
        return [
            use for use in self.context.training.autocast_uses if any(self.context.inside(use, f) for f in functions)
        ]

    def decision(self, loop: TrainingLoop) -> cst.Call | None:
        """A call in the forward region whose result steers the program: a value read to
        the host (`.item()`, `.tolist()`) that decides what runs (not one only logged), or
        a sample drawn from the model's output."""
        for statement in loop.forward.statements:
            for call in self.context.loops.own_calls(statement):
                method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
                if method == "sample" and not call.args:
                    return call
                if (
                    method in ("item", "tolist")
                    and not call.args
                    and self.context.training.steers(call, loss=loop.loss) is not None
                ):
                    return call
                if self.context.names.is_(call.func, "torch.multinomial", "torch.bernoulli"):
                    return call
        return None

    def autocast_unsafe(self, loop: TrainingLoop) -> tuple[cst.Call, str] | None:
        """A call in the forward pass (or in what it runs) that CUDA autocast refuses."""
        for call, name, _ in self.callees(loop):
            if name in AUTOCAST_UNSAFE:
                return call, AUTOCAST_UNSAFE[name]
        return None

    def float16_only(self, loop: TrainingLoop) -> str | None:
        """Why the forward pass (or what it runs) may run a module that CUDA autocast runs
        in float16 whatever its dtype (a cuDNN RNN), said as the start of a sentence."""
        training = self.context.training
        for call, name, built in self.callees(loop):
            if not autocast_float16(name):
                continue
            where = f"`{training.code(call.func)}` (line {self.context.line(call)})"
            if name in AUTOCAST_FLOAT16:
                return f"{where} builds {built}, a cuDNN RNN" if built is not None else f"{where} is a cuDNN RNN"
            return f"{where} builds {built}: the class is picked at run time and may be a cuDNN RNN"
        # What the forward runs, followed as its matrix products are: into the models' classes,
        # through the parameters of helpers (`seq2seq_loss(model, ...)` running `model.encoder`).
        built = training.first_run(self._forward_calls(loop), AUTOCAST_FLOAT16, frozenset())
        if built is not None:
            return f"`{training.code(built.func)}` (line {self.context.line(built)}), which the forward pass runs, is a cuDNN RNN"
        return None

    def callees(self, loop: TrainingLoop):
        """(call, qualified name, where it is built) of what the forward pass calls, and of
        the module a call runs where it is a value built here (`criterion(out, y)` with
        `criterion = nn.BCELoss()`, `self.rnn(x)` with `self.rnn = nn.LSTM(...)`), or the
        modules that a model class of another module of the project builds (`model(x)` with
        `model = RNNModel(...)`); the third item says what builds the module, None for the call's own names."""
        names = self.context.names
        steps = self.context.loops
        project = project_of(self.context)
        calls = self._forward_calls(loop)
        calls += [c for f in self.functions(loop.forward.statements) for c in steps.own_calls(f.body)]
        for call in calls:
            for name in names.may_name(call.func):
                yield call, name, None
            for value in steps.values_of(call.func):
                if isinstance(value, cst.Call):
                    for name in names.may_name(value.func):
                        yield (
                            call,
                            name,
                            None if name in names.of(value.func) else f"`{self.context.source(value.func)}`",
                        )
            for built in self.constructions(call.func) or () if project.imports_project() else ():
                for module in project.modules_built(built.func) or ():
                    text = f"`{module.site.text}`" if module.site.text else f"a module in `{module.site.function}`"
                    yield call, module.name, f"{text} ({project.shown_site(module.site)})"

    def _forward_calls(self, loop: TrainingLoop) -> list[cst.Call]:
        """The calls the forward pass's own statements make."""
        return [c for s in loop.forward.statements for c in self.context.loops.own_calls(s)]

    def functions(self, statements) -> list[cst.FunctionDef]:
        """Functions of this file the statements run: helpers they call, and the
        `forward` of model classes of this file they call."""
        steps = self.context.loops
        found: list[cst.FunctionDef] = []
        for statement in statements:
            for call in steps.own_calls(statement):
                targets = [steps.callee(call)]
                cls = self.model_class(call.func)
                if cls is not None:
                    targets.append(local_calls(self.context).method(cls, "forward"))
                for target in targets:
                    if target is not None and target not in found:
                        found.append(target)
                        found.extend(f for f in steps.functions_reached(target.body) if f not in found)
        return found

    def model_class(self, func: cst.BaseExpression) -> cst.ClassDef | None:
        """The class of this file that `model` in `model(x)` is an instance of."""
        calls = self.constructions(func)
        classes = {sole_definition(self.context.scopes, call.func, cst.ClassDef) for call in calls or ()}
        return classes.pop() if len(classes) == 1 else None

    def constructions(self, func: cst.BaseExpression, depth: int = 0) -> list[cst.Call] | None:
        """The calls that build the model `model` in `model(x)` is, one per binding (through
        `DistributedDataParallel(model)` and the other wrappers that run its forward, `.to()`,
        and the parameters of a function its callers pass it to); None when a binding is
        something else."""
        steps = self.context.loops
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            func = func.value
        found: list[cst.Call] = []
        for value in steps.values_of(func):
            while (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Attribute)
                and value.func.attr.value in ("to", "cuda")
            ):
                value = value.func.value  # `Net().to(device)`
            if isinstance(value, cst.Name) and depth < 4:
                inner = self.constructions(value, depth + 1)  # a parameter: what the caller passes
                if inner is None:
                    return None
                found += inner
                continue
            if not isinstance(value, cst.Call):
                return None
            wrapped = positional(value, 0) if self.context.names.of(value.func) & MODEL_WRAPPERS else None
            if wrapped is not None and wrapped.value.deep_equals(func):
                continue  # `model = DDP(model)`: the model the name's other bindings hold
            if wrapped is not None and depth < 4:
                inner = self.constructions(wrapped.value, depth + 1)
                if inner is None:
                    return None
                found += inner
            else:
                found.append(value)
        return found

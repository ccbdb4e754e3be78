from __future__ import annotations

import libcst as cst

from codemod.analysis import step_models as sites
from codemod.analysis.compilability import (
    compile_break,
    file_obstacles,
    layer_chain,
    lone_layer,
    loss_functions,
    model_break,
    model_draw,
)
from codemod.analysis.hook_sites import hook_sites
from codemod.analysis.network_tables import held_only, holds_networks, model_parts, table_obstacle, table_touched
from codemod.analysis.project import project_of
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.torch_facts import MODULE_TABLES
from codemod.analysis.variance import variance
from codemod.edits import InsertAfter
from codemod.rule import Invalid, Level, Rule, Valid

SETUP = """\
import torch
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
model = model.to(device)
"""
LOOP = """\
opt = torch.optim.AdamW(model.parameters())
for step in range(10):
    x = torch.randn(4, 8, device=device)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.save(model.state_dict(), "model.pt")
"""
TRAINER_GIVEN = (
    "import torch\n\nclass Trainer:\n    def __init__(self, model, opt):\n"
    "        self.model = model\n        self.opt = opt\n\n"
    "    def fit(self, batches):\n        for x in batches:\n            self.model(x).sum().backward()\n"
    "            self.opt.step()\n            self.opt.zero_grad()\n\n"
    "net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU()).cuda()\n"
)


class UncompiledModel(Rule):
    """
    ## What it does
    Finds a model trained in eager mode and compiles it once, right after the
    last statement that builds or moves it before the training loop (not after
    a `.train()` in the epoch loop), with `model.compile()`. What is compiled is
    what runs the forward on every step: a model called in the loop, directly,
    through a helper it is given to, or through another name
    (`DistributedDataParallel(model)` and its `.module`, `net = model`): then
    the model itself is compiled, before it is wrapped. A model given to the
    function that trains it (`train_one_epoch(model, opt)`) is compiled where
    the one caller of that function in the file builds and moves it, and a
    model a trainer class holds as its constructor is given it (`self.model =
    model` in `__init__`, `Trainer(model, opt).fit()`) where the one
    construction in the file builds and moves it: `model.compile()` compiles
    the module in place, so the trainer's `self.model` is the compiled one. An
    optimizer's parameter table (`nn.ParameterDict`), a module read only for
    its weights, and a loss module of torch (`nn.SmoothL1Loss()`, which holds
    no weights) are not.

    Where module hooks sit on some parts of the model (`model.probe`, or a
    `target` module the model's forward hooks), the model is not compiled
    whole; the parts its forward runs every step that no hook reaches are
    compiled in place instead: a network its `__init__` builds
    (`model.backbone.compile()`), and each network of an `nn.ModuleDict` or
    `nn.ModuleList` (`for net in model.gates.values(): net.compile()`). A
    table of small networks built outside a model and called every step is
    compiled the same way when no hook reaches it and the forward of each of
    its networks compiles to one graph that is reused (otherwise the finding
    says why not: `.item()`, a branch on a tensor's values, a write to the
    module's state, in the forward or a helper it calls).

    Where the model's class is defined in another module of your code and the
    step calls its methods besides the forward (`model.calc_importances(acts)`),
    `model.compile()` would leave those methods in eager mode. perfmod reads the
    class where it is defined: a table of small networks (a dict, `nn.ModuleDict`,
    list or `nn.ModuleList` that `__init__` fills once, through helpers if need be)
    whose networks those methods call is compiled in place after the model is
    built (`for ci_fn in model.ci_fns.values(): ci_fn.compile()`), when nothing
    stores into the table after it is built, no hook reaches it, and each
    network's forward compiles to one graph that is reused: no branch on a
    tensor's values (`if x.sum() > 0:`), no `.item()`, no random op, no write to
    the module's own state. The networks stay the same objects of the same class
    (`isinstance` checks still pass) with the same state_dict keys, which
    `net = torch.compile(net)` would change.

    Where the model cannot be compiled in place, the finding points to where it
    is built: in the caller that passes it to the training function (when
    another caller passes it too, or it may be bound again before the call), at the
    module-level lines that build and move a global model, at the `self.model =
    ...` of a trainer class. When module hooks block the model's compile, the
    rule also reports what else runs every step and could be compiled: the
    loss function (`@torch.compile`) and an `nn.ModuleDict` / `nn.ModuleList`
    of small networks called every step. A loss function is reported, never
    compiled by the fix: compiled on its own it is a second graph after the
    model's, whose gain is fusing a few pointwise operations, and it compiles
    again for every new shape or Python value it reads (another batch size at
    evaluation, a temperature changed per step), falling back to eager mode
    after eight; whether it pays is for `perfmod verify` to measure.

    A model that is a single `torch.nn` layer whose forward is one operator
    (`nn.Linear`, `nn.Conv1d`/`2d`/`3d`, `nn.Embedding`, `nn.EmbeddingBag`,
    `nn.LayerNorm`, `nn.GroupNorm`) is reported, not compiled: its forward
    and backward are that operator's kernels, and there is nothing to fuse.
    So is a model whose forward runs torch layers one after another (an
    `nn.Sequential`, or a class whose `forward` only assigns and returns what
    its layers and torch functions give) with a matrix product or convolution
    between any two other operations: `Linear, ReLU, Linear, ReLU, Linear`.
    torch.compile leaves each product a cuBLAS or cuDNN call and fuses nothing
    into it, so the compiled model runs the same kernels, saving only torch's
    overhead per operation against a compile of seconds. Two operations side
    by side (`BatchNorm2d` then `ReLU`, a `Dropout` after an activation, an
    elementwise reparameterisation) are what it fuses: those models are fixed.
    A model whose step runs a recurrent layer (`nn.LSTM`, `nn.GRU`, `nn.RNN`)
    or sparse tensors (`torch.spmm`, `.to_sparse()`) is reported, not
    compiled: dynamo (torch 2.13) breaks the graph at an RNN module unless
    `torch._dynamo.config.allow_rnn` is set (it is False by default) and at
    every sparse tensor, and runs that code in eager mode, so compiling pays
    the compile time for little of the step.

    ## Why is this bad?
    In eager mode every operation is a separate kernel launched from Python, and
    every intermediate result goes through memory. `torch.compile` traces the
    forward (and, through AOTAutograd, the backward) into graphs whose
    pointwise operations are fused into generated kernels, which saves memory
    traffic and launch overhead; PyTorch's own benchmarks (the PyTorch 2.0
    release, over 163 open-source models) report 1.3-2x for training steps on
    A100s, less for models dominated by large matmuls;
    `python -m benchmarks.bench_model --case char_lm` measures it on your
    device. The first steps pay for compilation (seconds to minutes).

    `model.compile()` (`nn.Module.compile`, torch 2.2 and later) compiles the
    module's `__call__` in place. Unlike `model = torch.compile(model)`, which
    returns an `OptimizedModule` wrapper whose `state_dict()` keys gain an
    `_orig_mod.` prefix (so checkpoints no longer load into an uncompiled
    model), it keeps the same object, its attributes and its `state_dict()`
    keys, and `torch.save(model)` still works (checked with torch 2.13), so
    this rule writes the in-place form.

    Left alone: files that already use `torch.compile` (any alias, a decorator)
    or call `.compile()` on the model. Reported without a fix: files that
    register module hooks (dynamo traces hooks into the graph, and hooks
    registered per call with Python state, PM501's pattern, can make it
    specialize and recompile: fix PM501, then compile by hand and check the
    compile with `perfmod verify`), a model that is
    rebound after the place where the compile would go, a model one of whose
    attributes, or a submodule's, the training loop assigns (`model.drop.p = p`,
    `m.p = p` for `m` in `model.modules()`: dynamo guards on them and would
    recompile for every new value), a model that is
    not built in the function (or module) that trains it nor by the one
    caller that gives it to that function, a model held in
    an attribute that its class builds itself (`self.model = Net()`: the
    message names where to add `self.model.compile()`, or why compiling it
    gains nothing), and a model of a class from another module
    of your code whose step also calls into it besides its forward
    (`model.calc_importances(...)`): `model.compile()` compiles `model(...)`
    only; the message names those calls, the module hooks the class registers
    when it does, and why a table of networks they call is not compiled.

    ## Options
    Opt-in: the rule runs only when selected by its code
    (`perfmod apply --select PM506 --level numeric`, or `select = [..., "PM506"]`);
    `PM` and `PM5` do not select it; `ALL` does.

    ## Example
    ```python
    model = Net().to(device)
    opt = torch.optim.AdamW(model.parameters())
    for x, y in loader:
        ...
    ```
    Use instead:
    ```python
    model = Net().to(device)
    model.compile()
    opt = torch.optim.AdamW(model.parameters())
    for x, y in loader:
        ...
    ```

    ## Fix safety
    Numeric: the compiled graphs compute the same operations, but fused
    kernels may order floating-point reductions differently, so losses agree
    within tolerance, not bit for bit (the rule's CPU test compares a few
    steps). Unsafe where the model's forward draws random numbers (dropout,
    `torch.randn_like`, `bernoulli`, `multinomial`, read in the model's class,
    also where another module of your code defines it; where perfmod cannot
    read the forward, such a draw anywhere in the file outside the training
    loop):
    compiled code draws its own random numbers, equally random but not the
    eager ones, so losses differ by more than rounding. Noise the loop adds to
    the data itself (`x + 0.1 * torch.randn_like(x)`) stays in eager mode and
    draws the same numbers, and a dropout whose probability is 0
    (`nn.Dropout(cfg.dropout)` with a config default of 0.0) draws none. Not fixed
    where the file differentiates through gradients (`create_graph=True`):
    torch.compile does not support double backward. Compilation can also fail on
    code dynamo does not support, graph breaks can make it slower than eager,
    and models called with changing shapes recompile; run `perfmod verify`
    before keeping it.
    """

    CODE = "PM506"
    NAME = "uncompiled-model"
    LEVEL = Level.NUMERIC
    OPT_IN = True
    REQUIRES = ("backward",)
    MESSAGE = "model trained in eager mode; compile it once with `model.compile()` (keeps its state_dict keys)"
    GAIN = "1.3-2x per training step on GPUs in PyTorch 2.0's benchmarks, after a compile of seconds to minutes"

    VALID = [
        Valid(SETUP + "model = torch.compile(model)\n" + LOOP, "already compiled"),
        Valid(
            SETUP.replace("import torch\n", "import torch\nfrom torch import compile as jit\n")
            + "model = jit(model)\n"
            + LOOP,
            "already compiled, through an alias",
        ),
        Valid(SETUP + "model.compile()\n" + LOOP, "already compiled in place"),
        Valid(
            SETUP + "@torch.compile\ndef loss_of(x):\n    return model(x).pow(2).mean()\n" + LOOP,
            "the user compiles what they chose",
        ),
        Valid(SETUP + "for x in [torch.randn(2, 8)]:\n    model(x)\n", "no training loop"),
    ]
    INVALID = [
        Invalid(SETUP + LOOP, SETUP + "model.compile()\n" + LOOP),
        Invalid(
            TRAINER_GIVEN + "Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1)).fit([torch.randn(4, 8).cuda()])\n",
            TRAINER_GIVEN
            + "net.compile()\nTrainer(net, torch.optim.SGD(net.parameters(), lr=0.1)).fit([torch.randn(4, 8).cuda()])\n",
            "a model a trainer class is constructed with: compiled in place where the one construction builds it",
        ),
        Invalid(
            "import torch\n\ndef main():\n    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU())\n"
            "    net.cuda()\n"
            "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n    for epoch in range(2):\n"
            "        for x in [torch.randn(4, 8).cuda()]:\n            net(x).sum().backward()\n            opt.step()\n",
            "import torch\n\ndef main():\n    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU())\n"
            "    net.cuda()\n    net.compile()\n"
            "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n    for epoch in range(2):\n"
            "        for x in [torch.randn(4, 8).cuda()]:\n            net(x).sum().backward()\n            opt.step()\n",
            "inside a function, after an in-place move, outside the epoch loop",
        ),
        Invalid(
            SETUP + "h = model[0].register_forward_hook(lambda m, a, o: None)\n" + LOOP,
            None,
            "hooks: reported without a fix",
        ),
        Invalid(
            SETUP
            + LOOP.replace(
                "    loss = model(x).pow(2).mean()\n",
                "    y = model(x)\n    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)\n"
                "    loss = g.pow(2).mean()\n",
            ),
            None,
            "double backward, which torch.compile does not support",
        ),
        Invalid(
            SETUP.replace("torch.nn.ReLU(), ", "torch.nn.ReLU(), torch.nn.Dropout(0.1), ") + LOOP,
            SETUP.replace("torch.nn.ReLU(), ", "torch.nn.ReLU(), torch.nn.Dropout(0.1), ") + "model.compile()\n" + LOOP,
            "random ops in the model's forward: fixed at level unsafe",
            config={"level": Level.UNSAFE},
        ),
        Invalid(
            SETUP + LOOP.replace("    opt.step()\n", "    opt.step()\n    model = model.to(device)\n"),
            None,
            "rebound in the loop",
        ),
        Invalid(
            SETUP.replace("torch.nn.ReLU(), ", "torch.nn.ReLU(), torch.nn.Dropout(0.1), ")
            + LOOP.replace("    opt.step()\n", "    opt.step()\n    model[2].p = 0.1 * (1 - step / 10)\n"),
            None,
            "an attribute of a submodule assigned every step: dynamo would recompile for each value",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        facts = file_obstacles(self.context)
        if facts.compiled:
            return
        hook = facts.hook
        seen: set[int] = set()
        for loop in self.context.training.loops:
            called = sites.called_models(self.context, loop)
            for name in called:
                if "." in name and name.partition(".")[0] in called:
                    continue  # a part of a model the step also calls (`model.enc(x)`): settled with it
                self._model(loop, name, hook, seen)
            if hook is not None or not called:  # the model's forward cannot be compiled: what else runs every step
                self._loss_functions(loop, seen)
            self._module_tables(loop, seen)

    def _model(self, loop, name: str, hook, seen: set[int]) -> None:
        """Compile (or report) the model `name` whose forward runs in `loop`."""
        if name.isidentifier():
            anchor, built, given = sites.anchor(self.context, loop.loop, name), name, None
            if anchor is None and (caller := sites.caller_anchor(self.context, loop.loop, name)) is not None:
                anchor, built, given = caller.anchor, caller.name, caller.call  # the one caller builds it
        elif (constructed := sites.construction_anchor(self.context, loop.loop, name)) is not None:
            anchor, built, given = constructed.anchor, constructed.name, constructed.call  # the class is given it
        else:
            self._attribute_model(loop, name, seen)
            return
        if anchor is None:
            site = sites.caller_site(self.context, loop.loop, name) or sites.global_site(self.context, loop.loop, name)
            where = site or loop.loop
            if id(where) not in seen:
                seen.add(id(where))
                self.report(
                    where, f"`{name}` could be compiled, but {sites.unbuilt_reason(self.context, loop.loop, name)}"
                )
            return
        if id(anchor) in seen:
            return
        seen.add(id(anchor))
        if hook is not None:
            if given is None and self._compile_parts(anchor, loop, name, hook):
                return
            self.report(
                anchor,
                f"`{built}` could be compiled, but this file registers module hooks "
                f"(line {self.context.line(hook)}), which dynamo traces and "
                "may recompile for; fix PM501, then compile by hand and check with perfmod verify",
            )
        elif given is None and sites.bound_again(self.context, anchor, loop.loop, name):
            self.report(
                anchor,
                f"`{name}` could be compiled, but it is bound again after this line; "
                f"add `{name}.compile()` after its last binding",
            )
        elif (elsewhere := sites.class_elsewhere(self.context, anchor, built)) and (
            methods := sites.step_methods(self.context, loop, name)
        ):
            self._class_of_another_module(anchor, built, elsewhere, methods)
        elif (double := file_obstacles(self.context).double_backward) is not None:
            line = self.context.line(double)
            self.report(
                anchor,
                f"`{built}` could be compiled, but this file differentiates through gradients "
                f"(`create_graph=True`, line {line}): torch.compile does not support double backward",
            )
        elif (assigned := self._attribute_assigned(loop, name)) is not None:
            self.report(
                anchor,
                f"`{built}` could be compiled, but {assigned}: dynamo guards on the module's attributes "
                "and would recompile whenever one changes; not fixed",
            )
        elif (nothing := self._gains_nothing(anchor, loop, name, built)) is not None:
            self.report(anchor, nothing)
        else:
            compile_line = cst.parse_statement(f"{built}.compile()\n")
            message = self.MESSAGE
            if given is not None:
                message += (
                    f"; `{self.context.source(given.func)}` trains it, given it at line {self.context.line(given)}"
                )
            random = self._draw(loop, name)
            if random is None:
                self.report(anchor, message, edits=[InsertAfter(anchor, (compile_line,))])
            else:  # inductor draws its own random numbers: equally random, not the eager ones
                self.report(
                    anchor,
                    message + f"; unsafe: {random} draw other "
                    "numbers when compiled, so losses differ from eager ones by more than rounding",
                    edits=[InsertAfter(anchor, (compile_line,))],
                    level=Level.UNSAFE,
                )

    def _attribute_model(self, loop, name: str, seen: set[int]) -> None:
        """Report the model `self.model` that no one construction gives its class: where the
        class builds it, with why compiling it gains nothing, when it does not."""
        where = sites.attribute_site(self.context, loop.loop, name)
        if id(where or loop.loop) in seen:
            return
        seen.add(id(where or loop.loop))
        self.report(
            where or loop.loop,
            (self._gains_nothing(where, loop, name, name) if where is not None else None)
            or self._given_by_several(loop, name)
            or f"`{name}` is trained in eager mode; PM506 compiles only models held "
            f"in a variable: add `{name}.compile()` where it is built",
        )

    def _given_by_several(self, loop, name: str) -> str | None:
        """Why a model its class is constructed with is not compiled where it is built: more than
        one construction gives the class a model."""
        calls = [call for call, _ in sites.constructions(self.context, loop.loop, name)]
        if len(calls) < 2:
            return None
        lines = ", ".join(str(self.context.line(call)) for call in calls)
        return (
            f"`{name}` is trained in eager mode; it is the model each of {len(calls)} constructions of "
            f"`{self.context.source(calls[0].func)}` gives it (lines {lines}): compile each where it is built "
            "(`model.compile()` compiles it in place), and check with perfmod verify"
        )

    def _gains_nothing(self, anchor: cst.CSTNode, loop, name: str, built: str) -> str | None:
        """Why compiling the model `name` (built as `built` at `anchor`) gains nothing: a lone
        one-operator layer, a chain of library products, a graph break in its forward."""
        if (layer := lone_layer(self.context, anchor, built)) is not None:
            return (
                f"`{built}` is trained in eager mode, but it is a single `nn.{layer}`, one operator of torch "
                "forward and backward: compiling it has nothing to fuse; not fixed"
            )
        if (layers := layer_chain(self.context, anchor, built)) is not None:
            return (
                f"`{built}` is trained in eager mode, but its forward runs {layers} layers with a matrix "
                "product or convolution between any two other operations: torch.compile has nothing to fuse "
                "and would run the same kernels, saving only torch's overhead per operation (microseconds "
                "a step) for a compile of seconds; not fixed"
            )
        if (broken := model_break(self.context, loop, name)) is not None:
            call, reason = broken
            return (
                f"`{built}` is trained in eager mode, but compiling it would gain little: {reason} "
                f"(`{self.context.source(call.func)}`, line {self.context.line(call)}); not fixed"
            )
        return None

    def _attribute_assigned(self, loop, name: str) -> str | None:
        """Why an attribute of the model `name`, or of one of its submodules, is assigned in
        the training loops around its step (`model.drop.p = p`), or None."""
        outermost = [loop.loop, *self.context.index.enclosing_loops(loop.loop)][-1]
        return variance(self.context).attribute_changed_within(cst.parse_expression(name), outermost)

    def _draw(self, loop, name: str) -> str | None:
        """The random ops that compiling the model `name` covers (`its random ops (`Dropout`)`),
        which draw other numbers compiled; None when there are none."""
        draw = model_draw(self.context, loop, name)
        if draw is None:
            return None
        if not draw.known:  # a class of another module of the project, not read whole
            return f"the random ops that `{draw.what}`, a class of another module, may run"
        return f"its random ops (`{draw.what}`)"

    # -- the parts of a model that others' hooks leave free ---------------------------------

    def _compile_parts(self, anchor: cst.SimpleStatementLine, loop, name: str, hook: cst.Call) -> bool:
        """For a model whose hooks are on some of its parts (`model.probe`, `self.target`):
        compile in place the parts its forward runs that no hook reaches (a network built
        in `__init__`, each network of an `nn.ModuleDict` / `nn.ModuleList`). True when
        reported with that fix."""
        model_class = sites.built_class(self.context, anchor, name)
        if model_class is None or file_obstacles(self.context).double_backward is not None:
            return False
        parts = model_parts(self.context, model_class)
        classes = {}
        for attribute, value, _ in parts:
            part_class = self.context.kinds.local_class(value.func)
            if part_class is not None:
                classes[part_class] = attribute
        hooked: set[str] = set()
        for site in hook_sites(self.context):
            if site.root is None:
                return False  # a hook on a module perfmod cannot follow: it may be any part
            if site.root == "self" and site.owner is model_class or site.root == name:
                if not site.path:
                    return False  # on the model itself
                hooked.add(site.path[0])
            elif site.root == "self" and site.owner in classes:
                hooked.add(classes[site.owner])
            elif site.root == "self":
                return False  # another class's: it may hold the model
        free = [(attribute, kind) for attribute, _, kind in parts if attribute not in hooked]
        if not free or not hooked or model_break(self.context, loop, name) is not None:
            return False
        taken = self.context.index.spelled_names
        variable = next((v for v in ("net", "network", "part_module") if v not in taken), None)
        if variable is None:
            return False
        statements = []
        for attribute, kind in free:
            part = f"{name}.{attribute}"
            if kind == "module":
                statements.append(cst.parse_statement(f"{part}.compile()\n"))
            else:
                members = f"{part}.values()" if kind == "dict" else part
                statements.append(cst.parse_statement(f"for {variable} in {members}:\n    {variable}.compile()\n"))
        listed = ", ".join(f"`{name}.{attribute}`" for attribute, _ in free)
        message = (
            f"`{name}` has module hooks on some of its parts (line {self.context.line(hook)}), so it is "
            f"not compiled whole; the parts of it that run every step and that no hook reaches are: {listed}; "
            "compile them in place"
        )
        random = self._draw(loop, name)
        if random is None:
            self.report(anchor, message, edits=[InsertAfter(anchor, tuple(statements))])
        else:
            self.report(
                anchor,
                message + f"; unsafe: {random} draw other numbers when compiled",
                edits=[InsertAfter(anchor, tuple(statements))],
                level=Level.UNSAFE,
            )
        return True

    # -- a model of a class of another module ----------------------------------------------

    def _class_of_another_module(self, anchor, name: str, func: cst.BaseExpression, methods: list[str]) -> None:
        """The model `name` is built from the class `func` of another module, and the step calls
        `methods` of it besides its forward: `name.compile()` would leave those in eager mode.
        The tables of small networks those methods call (`self.ci_fns`), read where the class
        is defined, are compiled in place when nothing keeps them from it."""
        unseen = self.context.source(func)
        listed = ", ".join(f"`{name}.{method}`" for method in methods)
        project = project_of(self.context)
        found = project.class_of(func)
        hooks = []
        if found is not None:
            context, classdef = found
            hooks = [site for site in hook_sites(context) if site.owner is classdef]
        if hooks:
            where = project.shown_in(found[0], hooks[0].call)
            whole = (
                f"`{unseen}` registers module hooks ({where}), which dynamo traces and may recompile "
                f"for, so `{name}` is not compiled whole"
            )
        elif found is not None:
            whole = f"add `{name}.compile()` after this line if its forward compiles, and check with perfmod verify"
        else:
            whole = (
                f"`{unseen}` is defined in another module, where perfmod cannot check its forward for hooks "
                "registered per call (dynamo breaks the graph and recompiles for them): compile what those "
                f"calls run where `{unseen}` is defined, add `{name}.compile()` after this line if its "
                "forward registers no hooks per call, and check with perfmod verify"
            )
        head = (
            f"`{name}` is trained in eager mode, and the step also calls {listed}, which "
            f"`{name}.compile()` would leave in eager mode (it compiles `{name}(...)` only)"
        )
        tables = project.network_tables(func, tuple(methods)) or []
        free, blocked = [], []
        for table in tables:
            reason = (
                table.obstacle
                or table_touched(self.context, name, table.attribute)
                or (
                    "this file differentiates through gradients (`create_graph=True`)"
                    if file_obstacles(self.context).double_backward is not None
                    else None
                )
            )
            (blocked if reason else free).append((table, reason))
        taken = set(self.context.index.spelled_names)
        statements = []
        for table, _ in free:
            singular = table.attribute.rstrip("s").lstrip("_")
            variable = next(
                (
                    v
                    for v in (singular, "net", "network")
                    if v.isidentifier() and v != table.attribute and v not in taken
                ),
                None,
            )
            if variable is None:
                continue
            taken.add(variable)
            members = f"{name}.{table.attribute}" + (".values()" if table.kind == "dict" else "")
            statements.append(cst.parse_statement(f"for {variable} in {members}:\n    {variable}.compile()\n"))
        notes = "".join(
            f"; the networks of `{name}.{table.attribute}` that `{name}.{table.caller}` calls are not "
            f"compiled: {reason}"
            for table, reason in blocked
        )
        if not statements:
            self.report(anchor, f"{head}{notes}; not fixed: {whole}")
            return
        compiled = ", ".join(f"`{name}.{table.attribute}`" for table, _ in free)
        networks = ", ".join(sorted({n for table, _ in free for n in table.networks}))
        self.report(
            anchor,
            f"{head}; the networks of {compiled} ({networks}), called on every step by "
            f"{', '.join(sorted({f'`{name}.{table.caller}`' for table, _ in free}))}, compile to one graph each "
            f"and no hook reaches them: compiled each in place; {whole}{notes}",
            edits=[InsertAfter(anchor, tuple(statements))],
        )

    # -- other things that run every step ----------------------------------------------------

    def _loss_functions(self, loop, seen: set[int]) -> None:
        """A function of this file that computes the loss every step: worth compiling on its own."""
        if not loop.backwards:
            return
        for function in loss_functions(self.context, loop.backwards[0].loss):
            if id(function) in seen:
                continue
            seen.add(id(function))
            # Reported, not fixed: compiled on its own, the function is a second graph after
            # the model's, whose gain is fusing a few pointwise operations; it recompiles for
            # every new shape and Python value it reads (another batch size at evaluation, a
            # temperature changed per step) and falls back to eager after eight: whether it
            # pays is a measurement, not a fact of the code.
            self.report(
                function,
                f"`{function.name.value}` computes the loss on every step in eager mode; "
                f"decorate it with `@torch.compile` to fuse its operations (check the "
                "result with perfmod verify)",
            )

    def _module_tables(self, loop, seen: set[int]) -> None:
        """An `nn.ModuleDict` / `nn.ModuleList` of small networks, each called every step."""
        for call in sites.own_calls(self.context, loop.loop):
            func = call.func
            if not isinstance(func, cst.Subscript) or not isinstance(func.value, cst.Name):
                continue
            value = layouts(self.context).value_of(func.value) if func.value in self.context.index else None
            names = self.context.names.of(value.func) if isinstance(value, cst.Call) else set()
            kind = next((MODULE_TABLES[q] for q in sorted(names) if q in MODULE_TABLES), None)
            if kind is None:
                continue
            site = self.context.index.statement_of(value)
            if site is None or id(site) in seen:
                continue
            seen.add(id(site))
            name = func.value.value
            hooks = hook_sites(self.context)
            members = f"{name}.values()" if kind == "dict" else name
            taken = self.context.index.spelled_names
            variable = next((v for v in ("net", "network", "part_module") if v not in taken), None)
            unknown = any(s.root is None or s.root == "self" for s in hooks)
            obstacle = table_obstacle(self.context, value)
            if (
                obstacle is not None
                or any(s.root == name for s in hooks)
                or unknown
                and not held_only(self.context, func.value)
                or not holds_networks(self.context, value)
                or variable is None
                or not isinstance(site, cst.SimpleStatementLine)
                or file_obstacles(self.context).double_backward is not None
                or file_obstacles(self.context).draw is not None
                or compile_break(self.context, [c for c in sites.own_calls(self.context, loop.loop) if c.func is func])
                is not None
            ):
                self.report(
                    site,
                    f"the networks of `{name}` are called on every step in eager mode; "
                    + (
                        f"not compiled: {obstacle}"
                        if obstacle
                        else f"compile each (`for net in {members}: net.compile()`) and check with perfmod verify"
                    ),
                )
                continue
            self.report(
                site,
                f"the networks of `{name}` are called on every step in eager mode, and no hook reaches "
                "them: compile each in place",
                edits=[
                    InsertAfter(
                        site, (cst.parse_statement(f"for {variable} in {members}:\n    {variable}.compile()\n"),)
                    )
                ],
            )

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.hook_sites import hook_sites
from codemod.analysis.names import compound_keyword, method_name
from codemod.analysis.project import project_of
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.torch_facts import (
    HOOK_REGISTRATIONS,
    MODULE_CONTAINERS,
    MODULE_METHODS,
    REDUCING_FUNCTIONS,
    REDUCING_METHODS,
)
from codemod.edits import InsertAfter
from codemod.rule import Invalid, Level, Rule, Valid

COMPILERS = ("torch.compile",)
# Wrappers that run the model they are given (their `.module`).
DATA_PARALLEL = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
)
# What a model is set up with before training (the compile goes after the last of these).
SET_UP_METHODS = frozenset(
    "to cuda cpu half float double bfloat16 type apply load_state_dict requires_grad_ to_empty share_memory".split()
)
MODULE_TABLES = {
    "torch.nn.ModuleDict",
    "torch.nn.ModuleList",
    "torch.nn.modules.container.ModuleDict",
    "torch.nn.modules.container.ModuleList",
}

SETUP = """\
import torch
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
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

# Random ops in a model's code: compiled, they draw other numbers than in eager mode.
RANDOM_OPS = re.compile(r"\b(Dropout\w*|dropout\w*|rand(?:n|int)?_like|bernoulli_?|multinomial)\s*\(")
DOUBLE_BACKWARD = re.compile(r"\bcreate_graph\s*=\s*True")


class UncompiledModel(Rule):
    """
    ## What it does
    Finds a model trained in eager mode and compiles it once, right after the
    last statement that builds or moves it before the training loop (not after
    a `.train()` in the epoch loop), with `model.compile()`. What is compiled is
    what runs the forward on every step: a model called in the loop, directly,
    through a helper it is given to, or through another name
    (`DistributedDataParallel(model)` and its `.module`, `net = model`): then
    the model itself is compiled, before it is wrapped. An optimizer's
    parameter table (`nn.ParameterDict`) or a module read only for its weights
    is not.

    Where module hooks sit on some parts of the model (`model.probe`, or a
    `target` module the model's forward hooks), the model is not compiled
    whole; the parts its forward runs every step that no hook reaches are
    compiled in place instead: a network its `__init__` builds
    (`model.backbone.compile()`), and each network of an `nn.ModuleDict` or
    `nn.ModuleList` (`for net in model.gates.values(): net.compile()`). A
    table of small networks built outside a model and called every step is
    compiled the same way when no hook reaches it.

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
    is built: in the caller that passes it to the training function, at the
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
    rebound after the place where the compile would go, a model that is
    not built in the function (or module) that trains it, a model held in
    an attribute (`self.model`), and a model of a class from another module
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
    steps). Unsafe where the file uses random ops (dropout, `torch.rand*`,
    `bernoulli`): compiled code draws its own random numbers, equally random
    but not the eager ones, so losses differ by more than rounding. Not fixed
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
            "import torch\n\ndef main():\n    net = torch.nn.Linear(8, 1)\n    net.cuda()\n"
            "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n    for epoch in range(2):\n"
            "        for x in [torch.randn(4, 8).cuda()]:\n            net(x).sum().backward()\n            opt.step()\n",
            "import torch\n\ndef main():\n    net = torch.nn.Linear(8, 1)\n    net.cuda()\n    net.compile()\n"
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
            SETUP
            + LOOP.replace(
                "    loss = model(x).pow(2).mean()\n",
                "    loss = torch.nn.functional.dropout(model(x), 0.1).pow(2).mean()\n",
            ),
            SETUP
            + "model.compile()\n"
            + LOOP.replace(
                "    loss = model(x).pow(2).mean()\n",
                "    loss = torch.nn.functional.dropout(model(x), 0.1).pow(2).mean()\n",
            ),
            "random ops: fixed at level unsafe",
            config={"level": Level.UNSAFE},
        ),
        Invalid(
            SETUP + LOOP.replace("    opt.step()\n", "    opt.step()\n    model = model.to(device)\n"),
            None,
            "rebound in the loop",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        if self._compiled_already(node):
            return
        hook = self._hook_registration(node)
        seen: set[int] = set()
        for loop in self.context.training.loops:
            called = self._called_models(loop)
            for name in called:
                self._model(loop, name, hook, seen)
            if hook is not None or not called:  # the model's forward cannot be compiled: what else runs every step
                self._loss_functions(loop, seen)
            self._module_tables(loop, seen)

    def _model(self, loop, name: str, hook, seen: set[int]) -> None:
        """Compile (or report) the model `name` whose forward runs in `loop`."""
        if not name.isidentifier():
            where = self._attribute_site(loop.loop, name) or loop.loop
            if id(where) not in seen:
                seen.add(id(where))
                self.report(
                    where,
                    f"`{name}` is trained in eager mode; PM506 compiles only models held "
                    f"in a variable: add `{name}.compile()` where it is built",
                )
            return
        anchor = self._anchor(loop.loop, name)
        if anchor is None:
            site = self._caller_site(loop.loop, name) or self._global_site(loop.loop, name)
            where = site or loop.loop
            if id(where) not in seen:
                seen.add(id(where))
                self.report(where, self._unanchored(loop.loop, name))
            return
        if id(anchor) in seen:
            return
        seen.add(id(anchor))
        if hook is not None:
            if self._compile_parts(anchor, loop, name, hook):
                return
            self.report(
                anchor,
                f"`{name}` could be compiled, but this file registers module hooks "
                f"(line {self.context.line(hook)}), which dynamo traces and "
                "may recompile for; fix PM501, then compile by hand and check with perfmod verify",
            )
        elif self._bound_again(anchor, loop.loop, name):
            self.report(
                anchor,
                f"`{name}` could be compiled, but it is bound again after this line; "
                f"add `{name}.compile()` after its last binding",
            )
        elif (elsewhere := self._class_elsewhere(anchor, name)) and (methods := self._step_methods(loop, name)):
            self._class_of_another_module(anchor, name, elsewhere, methods)
        elif (double := DOUBLE_BACKWARD.search(self.context.code)) is not None:
            line = self.context.code.count("\n", 0, double.start()) + 1
            self.report(
                anchor,
                f"`{name}` could be compiled, but this file differentiates through gradients "
                f"(`create_graph=True`, line {line}): torch.compile does not support double backward",
            )
        elif (broken := self._compile_break(loop, name)) is not None:
            call, reason = broken
            self.report(
                anchor,
                f"`{name}` is trained in eager mode, but compiling it would gain little: {reason} "
                f"(`{self.context.source(call.func)}`, line {self.context.line(call)}); not fixed",
            )
        else:
            compile_line = cst.parse_statement(f"{name}.compile()\n")
            random = RANDOM_OPS.search(self.context.code)
            if random is None:
                self.report(anchor, edits=[InsertAfter(anchor, (compile_line,))])
            else:  # inductor draws its own random numbers: equally random, not the eager ones
                self.report(
                    anchor,
                    self.MESSAGE + f"; unsafe: its random ops (`{random.group(1)}`) draw other "
                    "numbers when compiled, so losses differ from eager ones by more than rounding",
                    edits=[InsertAfter(anchor, (compile_line,))],
                    level=Level.UNSAFE,
                )

    def _networks(self, table: cst.Call) -> bool:
        """Does the `nn.ModuleDict` / `nn.ModuleList` call `table` hold networks of several
        layers (`nn.Sequential(...)`, a class of this file), not single torch layers, whose
        compile would fuse nothing?"""
        networks = [
            call
            for call in self.context.index.find(cst.Call, within=table)
            if call is not table
            and (
                self.context.names.of(call.func) & MODULE_CONTAINERS
                or self.context.kinds.local_class(call.func) is not None
            )
        ]
        return bool(networks)

    def _held_only(self, name: cst.Name) -> bool:
        """Is the table `name` only indexed and called (`name[k](x)`) or asked for what a module
        has (`name.parameters()`, `name.to(device)`)? Then no code can reach its networks to hook
        them but through those reads."""
        assignments = self.context.bindings.assignments(name)
        if not assignments or len(assignments) != 1:
            return False
        parents = self.context.parents
        for access in assignments[0].references:
            node = access.node
            parent = parents.get(node)
            if isinstance(parent, cst.Subscript) and parent.value is node:
                call = parents.get(parent)
                if not (isinstance(call, cst.Call) and call.func is parent):
                    return False
            elif not (
                isinstance(parent, cst.Attribute)
                and parent.value is node
                and parent.attr.value in MODULE_METHODS
                and parent.attr.value not in HOOK_REGISTRATIONS
                and parent.attr.value not in ("modules", "children", "named_modules", "named_children", "apply")
            ):
                return False
        return True

    def _compile_break(self, loop, name: str) -> tuple[cst.Call, str] | None:
        """Where the forward of the model `name`, as the loop calls it, breaks torch.compile's graph."""
        calls = [call for call in own_calls(self.context, loop.loop) if self._calls_model(call, name)]
        return self.context.training.compile_break(calls)

    # -- the parts of a model that others' hooks leave free ---------------------------------

    def _compile_parts(self, anchor: cst.SimpleStatementLine, loop, name: str, hook: cst.Call) -> bool:
        """For a model whose hooks are on some of its parts (`model.probe`, `self.target`):
        compile in place the parts its forward runs that no hook reaches (a network built
        in `__init__`, each network of an `nn.ModuleDict` / `nn.ModuleList`). True when
        reported with that fix."""
        node = next((n for n in self.context.index.find(cst.Name, within=anchor) if n.value == name), None)
        model_class = self.context.kinds.instance_class(node) if node is not None else None
        if model_class is None or DOUBLE_BACKWARD.search(self.context.code):
            return False
        parts = self._parts(model_class)
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
        if not free or not hooked or self._compile_break(loop, name) is not None:
            return False
        taken = {n.value for n in self.context.index.find(cst.Name)}
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
        random = RANDOM_OPS.search(self.context.code)
        if random is None:
            self.report(anchor, message, edits=[InsertAfter(anchor, tuple(statements))])
        else:
            self.report(
                anchor,
                message + f"; unsafe: its random ops (`{random.group(1)}`) draw other numbers when compiled",
                edits=[InsertAfter(anchor, tuple(statements))],
                level=Level.UNSAFE,
            )
        return True

    def _parts(self, cls: cst.ClassDef) -> list[tuple[str, cst.Call, str]]:
        """(attribute, its value, "module" / "dict" / "list") for each network that the
        class's `__init__` builds into `self.<attribute>` (an `nn.Sequential`, a class of
        this file, an `nn.ModuleDict` or `nn.ModuleList`) and its other methods read."""
        methods = (
            {f.name.value: f for f in cls.body.body if isinstance(f, cst.FunctionDef)}
            if isinstance(cls.body, cst.IndentedBlock)
            else {}
        )
        init = methods.get("__init__")
        if init is None or "forward" not in methods:
            return []
        index, names = self.context.index, self.context.names
        read = {  # read by a method other than `__init__`: the forward, or what the step calls besides
            a.attr.value
            for method in methods.values()
            if method is not init
            for a in index.find(cst.Attribute, within=method)
            if m.matches(a.value, m.Name("self"))
        }
        found, assigned = [], {}
        for assign in index.find(cst.Assign, within=cls):
            for target in assign.targets:
                if m.matches(target.target, m.Attribute(value=m.Name("self"))):
                    key = target.target.attr.value
                    assigned[key] = assigned.get(key, 0) + 1
        for assign in index.find(cst.Assign, within=init):
            target = assign.targets[0].target if len(assign.targets) == 1 else None
            value = assign.value
            if not (m.matches(target, m.Attribute(value=m.Name("self"))) and isinstance(value, cst.Call)):
                continue
            attribute = target.attr.value
            if attribute not in read or assigned.get(attribute) != 1:
                continue
            qualified = names.of(value.func)
            if qualified & MODULE_TABLES:
                kind = "dict" if any(q.endswith("ModuleDict") for q in qualified) else "list"
            elif qualified & MODULE_CONTAINERS or self.context.kinds.local_class(value.func) is not None:
                kind = "module"
            else:
                continue
            found.append((attribute, value, kind))
        return found

    # -- what runs the forward -------------------------------------------------------------

    def _called_models(self, loop) -> list[str]:
        """The models of the loop whose forward runs in it: called (`model(x)`, `model.forward`),
        or given to a function of this file that calls them, or called through another name
        (`ddp = DistributedDataParallel(model)`, `net = model if ... else ddp`). An
        optimizer's parameter tables (`nn.ParameterDict`) and modules only read for their
        weights are not called."""
        found = []
        calls = own_calls(self.context, loop.loop)
        candidates = [model.expression for model in loop.models] + self._passed_modules(loop.loop, calls)
        for name in candidates:
            if name in found:
                continue
            if any(self._calls_model(call, name) for call in calls):
                node = next((c.func for c in calls if m.matches(c.func, m.Name(name))), None)
                wrapped = self._runs(node) if node is not None else None
                found.append(wrapped if wrapped is not None and wrapped not in found else name)
        for call in calls:
            func = call.func.value if m.matches(call.func, m.Attribute(attr=m.Name("forward"))) else call.func
            if isinstance(func, cst.Name) and func.value not in found:
                model = self._runs(func)
                if model is not None and model != func.value and model not in found:
                    found.append(model)
        return found

    def _runs(self, expr: cst.BaseExpression, depth: int = 0) -> str | None:
        """The name of the model `expr` runs when called: a model's own name, or the model
        every binding of another name wraps or names (`DistributedDataParallel(model)`,
        `DataParallel(model)`, its `.module`, `a if c else b`)."""
        if depth > 6:
            return None
        if isinstance(expr, cst.Name):
            # Names of this scope only: a parameter is the function's own name of what it is given.
            values = self.context.bindings.values(expr) or []
            found = {self._runs(value, depth + 1) for value in values}
            if values and len(found) == 1 and None not in found and expr.value not in found:
                return found.pop()  # another name of one model
            return expr.value if self.context.training.is_model(expr) else None
        if isinstance(expr, cst.Attribute) and expr.attr.value == "module":
            return self._runs(expr.value, depth + 1)
        if isinstance(expr, cst.IfExp):
            found = {self._runs(expr.body, depth + 1), self._runs(expr.orelse, depth + 1)}
            return found.pop() if len(found) == 1 else None
        if isinstance(expr, cst.Call) and self.context.names.is_(expr.func, *DATA_PARALLEL):
            first = expr.args[0] if expr.args and expr.args[0].keyword is None else None
            return self._runs(first.value, depth + 1) if first is not None else None
        return None

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
                or self._table_touched(name, table.attribute)
                or (
                    "this file differentiates through gradients (`create_graph=True`)"
                    if DOUBLE_BACKWARD.search(self.context.code)
                    else None
                )
            )
            (blocked if reason else free).append((table, reason))
        taken = {n.value for n in self.context.index.find(cst.Name)}
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

    def _table_touched(self, name: str, attribute: str) -> str | None:
        """Why this file keeps the networks of `name.attribute` from being compiled: it stores
        into the table or registers hooks that may reach it."""
        prefix = f"{name}.{attribute}"
        for node in self.context.index.find((cst.Assign, cst.AugAssign)):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            if any(re.match(re.escape(prefix) + r"\b(?!\s*\()", self.context.source(t)) for t in targets):
                return f"this file stores into `{prefix}` (line {self.context.line(node)})"
        for site in hook_sites(self.context):
            if site.root is None or site.root == name and site.path[:1] == (attribute,):
                return f"this file registers a hook that may reach them (line {self.context.line(site.call)})"
        return None

    def _class_elsewhere(self, anchor: cst.CSTNode, name: str) -> cst.BaseExpression | None:
        """The class of the model `name` when it is built in this file from a class of
        another module of the user's code (`model = ComponentModel(...)`); None for classes
        of this file and of torch."""
        index = self.context.index
        scope = index.first_enclosing(anchor, cst.FunctionDef) or self.context.module
        target = next(
            (
                node
                for node in index.find(cst.Name, within=scope)
                if node.value == name and isinstance(self.context.parents.get(node), cst.AssignTarget)
            ),
            None,
        )
        values = self.context.loops.values_of(target) if target is not None else []
        classes = set()
        for value in values:
            while isinstance(value, cst.Call) and method_name(value) in SET_UP_METHODS:
                value = value.func.value  # `Net(...).to(device)`
            if not isinstance(value, cst.Call) or not isinstance(value.func, (cst.Name, cst.Attribute)):
                return None
            if self.context.kinds.local_class(value.func) is not None:
                return None
            qualified = self.context.names.of(value.func)
            if not qualified or any(q.startswith(("torch.", "transformers.", "timm.")) for q in qualified):
                return None
            classes.add(value.func)
        return classes.pop() if len({self.context.source(c) for c in classes}) == 1 else None

    def _step_methods(self, loop, name: str) -> list[str]:
        """What the loop calls every step on the model `name` (under any of its names)
        besides its forward (`model.encode(x)`, `model.head(x)`): `model.compile()`
        compiles `model(...)` only and leaves those in eager mode."""
        found: list[str] = []
        for call in own_calls(self.context, loop.loop):
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value not in MODULE_METHODS
                and func.attr.value not in ("forward", "compile")
                and isinstance(func.value, cst.Name)
                and func.attr.value not in found
                and self._runs(func.value) == name
            ):
                found.append(func.attr.value)
        return found

    def _passed_modules(self, loop: cst.CSTNode, calls) -> list[str]:
        """Parameters of the training function called in the loop that a caller in this file
        gives a model (`train(net, opt)` with `net = nn.Linear(...)`; not a loss module)."""
        function = self.context.index.first_enclosing(loop, cst.FunctionDef)
        if function is None:
            return []
        params = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
        called = {call.func.value for call in calls if isinstance(call.func, cst.Name)} & set(params)
        found = []
        for call in self.context.index.find(cst.Call):
            if not (isinstance(call.func, cst.Name) and call.func.value == function.name.value):
                continue
            args = [a for a in call.args if a.keyword is None and not a.star]
            for position, name in enumerate(params):
                if (
                    name in called
                    and position < len(args)
                    and self.context.training.is_model(args[position].value)
                    and name not in found
                ):
                    found.append(name)
        return found

    def _calls_model(self, call: cst.Call, name: str, depth: int = 0) -> bool:
        code = self.context.source
        func = call.func
        if (
            code(func) == name
            or isinstance(func, cst.Attribute)
            and func.attr.value == "forward"
            and code(func.value) == name
        ):
            return True
        if depth > 1:
            return False
        function = layouts(self.context).function_of(call)
        if function is None:
            return False
        params = [*function.params.posonly_params, *function.params.params]
        for arg, param in zip([a for a in call.args if a.keyword is None and not a.star], params):
            if code(arg.value) == name:
                inner = param.name.value
                if any(self._calls_model(c, inner, depth + 1) for c in own_calls(self.context, function.body)):
                    return True
        return False

    # -- other things that run every step ----------------------------------------------------

    def _loss_functions(self, loop, seen: set[int]) -> None:
        """A function of this file that computes the loss every step: worth compiling on its own."""
        if not loop.backwards:
            return
        sources = [loop.backwards[0].loss]
        frontier = list(sources)
        for _ in range(2):  # the loss, and the values its names hold, two steps back
            found = []
            for source in frontier:
                names = (
                    [source]
                    if isinstance(source, cst.Name)
                    else (self.context.index.find(cst.Name, within=source) if source in self.context.index else [])
                )
                for name in names:
                    value = layouts(self.context).value_of(name) if name in self.context.index else None
                    if value is not None and value not in sources:
                        sources.append(value)
                        found.append(value)
            frontier = found
        for source in sources[:12]:
            for call in self.context.index.find(cst.Call, within=source) if source in self.context.index else ():
                function = layouts(self.context).function_of(call)
                if function is None or id(function) in seen or function.name.value in ("forward",):
                    continue
                if self._calls_a_model(function):
                    continue  # it runs the model: compiling the model covers it
                if not self._reduces(function):
                    continue  # it moves or gathers values (`_to_device`): it computes no loss
                if DOUBLE_BACKWARD.search(self.context.source(function)):
                    continue  # it differentiates through gradients: torch.compile does not support double backward
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

    def _reduces(self, function: cst.FunctionDef) -> bool:
        """Does `function` compute a loss value: call a torch loss or reduction (`F.kl_div`,
        `.mean()`, `torch.sum`) outside `torch.no_grad()`?"""
        for call in own_calls(self.context, function.body):
            names = self.context.names.of(call.func)
            reduces = bool(names & REDUCING_FUNCTIONS) or (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value in REDUCING_METHODS
                and not any(n.startswith(("torch.", "numpy.", "builtins.")) for n in names)
            )
            if reduces and not self._without_grad(call, function):
                return True
        return False

    def _without_grad(self, node: cst.CSTNode, function: cst.FunctionDef) -> bool:
        for ancestor in self.context.index.ancestors(node):
            if ancestor is function:
                return False
            if isinstance(ancestor, cst.With) and any(
                isinstance(item.item, cst.Call)
                and self.context.names.is_(item.item.func, "torch.no_grad", "torch.inference_mode")
                for item in ancestor.items
            ):
                return True
        return False

    def _calls_a_model(self, function: cst.FunctionDef) -> bool:
        training = self.context.training
        return any(
            training.is_model_call(call)
            for call in own_calls(self.context, function.body)
            if not self.context.names.startswith(call.func, ("torch",))
        )

    def _module_tables(self, loop, seen: set[int]) -> None:
        """An `nn.ModuleDict` / `nn.ModuleList` of small networks, each called every step."""
        for call in own_calls(self.context, loop.loop):
            func = call.func
            if not isinstance(func, cst.Subscript) or not isinstance(func.value, cst.Name):
                continue
            value = layouts(self.context).value_of(func.value) if func.value in self.context.index else None
            if not (isinstance(value, cst.Call) and self.context.names.of(value.func) & MODULE_TABLES):
                continue
            site = self.context.index.statement_of(value)
            if site is None or id(site) in seen:
                continue
            seen.add(id(site))
            name = func.value.value
            sites = hook_sites(self.context)
            dictionary = any(q.endswith("ModuleDict") for q in self.context.names.of(value.func))
            members = f"{name}.values()" if dictionary else name
            taken = {n.value for n in self.context.index.find(cst.Name)}
            variable = next((v for v in ("net", "network", "part_module") if v not in taken), None)
            unknown = any(s.root is None or s.root == "self" for s in sites)
            if (
                any(s.root == name for s in sites)
                or unknown
                and not self._held_only(func.value)
                or not self._networks(value)
                or variable is None
                or not isinstance(site, cst.SimpleStatementLine)
                or DOUBLE_BACKWARD.search(self.context.code)
                or RANDOM_OPS.search(self.context.code)
                or self.context.training.compile_break(c for c in own_calls(self.context, loop.loop) if c.func is func)
                is not None
            ):
                self.report(
                    site,
                    f"the networks of `{name}` are called on every step in eager mode; compile each "
                    f"(`for net in {members}: net.compile()`) and check with perfmod verify",
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

    # -- where a model given to the training function is built ------------------------------

    def _unanchored(self, loop: cst.CSTNode, name: str) -> str:
        """Why the model `name` has no statement before the loop to compile it after, from
        where the training code's scope finds it."""
        function = self.context.index.first_enclosing(loop, cst.FunctionDef)
        params = [] if function is None else [*function.params.posonly_params, *function.params.params]
        position = next((i for i, p in enumerate(params) if p.name.value == name), None)
        if position == 0 and self.context.kinds.class_of(function) is not None:
            direct = any(
                m.matches(call.func, m.Attribute(value=m.Name(name), attr=m.Name("forward")))
                for call in own_calls(self.context, loop)
            )
            return (
                f"`{name}` could be compiled, but `{function.name.value}` trains the module it is a "
                f"method of; add `.compile()` where each instance is built"
                + (f", and call `{name}(...)`: a call of `.forward` bypasses the compiled module" if direct else "")
            )
        if position is not None:
            how = "is given it"
        elif function is not None and name not in self.context.bound_in(function.body):
            how = "reads it as a global"
        else:
            again = self._built_in_outer_loop(loop, name)
            if again is not None:
                return (
                    f"`{name}` could be compiled, but it is built anew on every pass of the loop at line "
                    f"{self.context.line(again)}: each new module would be compiled again"
                )
            built = self.context.bound_in_compound(name, loop)
            if built is None:
                return (
                    f"`{name}` could be compiled, but perfmod finds no one statement before the loop "
                    f"that builds it; add `{name}.compile()` where it is built and moved"
                )
            return (
                f"`{name}` could be compiled, but it is built inside the `{compound_keyword(built)}` statement "
                f"at line {self.context.line(built)}, not by a statement of its own before the loop; add "
                f"`{name}.compile()` after that statement"
            )
        return (
            f"`{name}` could be compiled, but it is built outside the function that trains "
            f"it (which {how}); add `{name}.compile()` where it is built and moved"
        )

    def _built_in_outer_loop(self, loop: cst.CSTNode, name: str) -> cst.CSTNode | None:
        """The loop around `loop` (in its function) whose body binds `name` before it."""
        child = loop
        for ancestor in self.context.index.ancestors(loop):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            if isinstance(ancestor, cst.IndentedBlock):
                owner = self.context.parents.get(ancestor)
                if isinstance(owner, (cst.For, cst.While)):
                    body = list(ancestor.body)
                    if any(name in self.context.bound_in(s) for s in body[: body.index(child)]):
                        return owner
            child = ancestor
        return None

    def _caller_site(self, loop: cst.CSTNode, name: str) -> cst.CSTNode | None:
        """For a model that is a parameter of the training function: where the caller builds
        or moves what it passes (one call of the function in this file)."""
        function = self.context.index.first_enclosing(loop, cst.FunctionDef)
        if function is None:
            return None
        params = [*function.params.posonly_params, *function.params.params]
        position = next((i for i, p in enumerate(params) if p.name.value == name), None)
        if position is None:
            return None
        for call in self.context.index.find(cst.Call):
            if (
                not (isinstance(call.func, cst.Name) and call.func.value == function.name.value)
                or layouts(self.context).function_of(call) is not function
            ):
                continue
            args = [a for a in call.args if a.keyword is None and not a.star]
            keyword = next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)
            arg = keyword or (args[position] if position < len(args) else None)
            if arg is not None and isinstance(arg.value, cst.Name):
                statement = self.context.index.statement_of(call)
                site = self._anchor(statement, arg.value.value)
                if site is not None:
                    return site
        return None

    def _global_site(self, loop: cst.CSTNode, name: str) -> cst.CSTNode | None:
        """For a model the training function reads as a module-level name: the last module-level
        statement (or one in an `if` there) that builds or moves it."""
        function = self.context.index.first_enclosing(loop, cst.FunctionDef)
        if function is None:
            return None
        scope = self.context.scopes.get(self.context.module)
        if scope is None or not scope[name]:
            return None
        found = None
        for statement in self.context.module.body:
            candidates = [statement]
            if isinstance(statement, cst.If):
                candidates = list(statement.body.body) if isinstance(statement.body, cst.IndentedBlock) else []
            for candidate in candidates:
                if isinstance(candidate, cst.SimpleStatementLine) and any(
                    self._sets_up(s, name) for s in candidate.body
                ):
                    found = candidate
        return found

    def _attribute_site(self, loop: cst.CSTNode, expression: str) -> cst.CSTNode | None:
        """For `self.model`: the statement of the class that assigns it."""
        for call in own_calls(self.context, loop):
            for node in [call.func, *(a.value for a in call.args)]:
                if isinstance(node, cst.Attribute) and self.context.source(node) == expression:
                    values = layouts(self.context).attributes.values(node)
                    if values:
                        return self.context.index.statement_of(values[-1])
        return None

    # -- what the file does already ------------------------------------------------------

    def _compiled_already(self, module: cst.Module) -> bool:
        names, index = self.context.names, self.context.index
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
            if node.attr.value == "compile" and names.is_(node, *COMPILERS):
                return True
        models = {model.expression for loop in self.context.training.loops for model in loop.models}
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

    def _hook_registration(self, module: cst.Module) -> cst.Call | None:
        for call in self.context.index.find(cst.Call):
            if method_name(call) in HOOK_REGISTRATIONS:  # hooks that change per call recompile (PM501 first)
                return call
        return None

    # -- where the compile goes --------------------------------------------------------

    def _blocks_out(self, node: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, int]]:
        """(block, index of the statement holding `node`) for each block around `node`,
        innermost first, up to the function or module."""
        parents = self.context.parents
        child, parent = node, parents.get(node)
        while parent is not None:
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                yield parent, list(parent.body).index(child)
            if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return
            child, parent = parent, parents.get(parent)

    def _anchor(self, loop: cst.CSTNode, name: str) -> cst.SimpleStatementLine | None:
        """The last statement before the loop, in a block around it that runs once (not the
        body of an epoch loop), that builds or moves the model."""
        for block, index in self._blocks_out(loop):
            if self.context.index.first_enclosing(
                block, (cst.For, cst.While, cst.FunctionDef)
            ) is not None and isinstance(
                self.context.index.first_enclosing(block, (cst.For, cst.While, cst.FunctionDef)), (cst.For, cst.While)
            ):
                continue
            for statement in reversed(list(block.body)[:index]):
                if isinstance(statement, cst.SimpleStatementLine) and any(
                    self._sets_up(small, name) for small in statement.body
                ):
                    return statement
        return None

    @staticmethod
    def _sets_up(small: cst.BaseSmallStatement, name: str) -> bool:
        """`name = ...`, `name: T = ...`, or `name.method(...)` that moves or loads it (`.to(device)`,
        `.cuda()`, `.load_state_dict(...)`); not a mode switch (`.train()`, `.eval()`)."""
        if isinstance(small, cst.Assign):
            return any(_binds(t.target, name) for t in small.targets)
        if isinstance(small, cst.AnnAssign):
            return m.matches(small.target, m.Name(name)) and small.value is not None
        return (
            isinstance(small, cst.Expr)
            and m.matches(small.value, m.Call(func=m.Attribute(value=m.Name(name))))
            and small.value.func.attr.value in SET_UP_METHODS
        )

    def _bound_again(self, anchor: cst.SimpleStatementLine, loop: cst.CSTNode, name: str) -> bool:
        """Is `name` bound between the anchor and the end of the loop (the compiled
        module would not be the one trained)?"""
        scope = self.context.scopes.get(anchor.body[0])
        if scope is None:
            return True
        index = self.context.index
        after, end = index.end(anchor), index.end(loop)
        return any(
            a.node in index and after < index.order(a.node) <= end
            for a in scope.assignments[name]
            if isinstance(a.node, cst.CSTNode)
        )


def _binds(target: cst.BaseExpression, name: str) -> bool:
    if isinstance(target, cst.Name):
        return target.value == name
    if isinstance(target, (cst.Tuple, cst.List)):
        return any(_binds(e.value, name) for e in target.elements)
    return False


def own_calls(context, node: cst.CSTNode) -> list[cst.Call]:
    """Calls under `node` that run when it runs (not in nested functions, lambdas, classes)."""
    from codemod.analysis.loops import own_nodes

    return own_nodes(context.index, cst.Call, node)


def _last_name(node: cst.CSTNode) -> str | None:
    """`c` for `a.b.c` and for `c`."""
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return node.value if isinstance(node, cst.Name) else None

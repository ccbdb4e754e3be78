from __future__ import annotations

from typing import Iterator

import libcst as cst
import libcst.matchers as m

from codemod.analysis.names import method_name
from codemod.edits import InsertAfter
from codemod.rule import Invalid, Level, Rule, Valid

COMPILERS = ("torch.compile",)
# Hook registrations: a model whose hooks change per call recompiles (PM501 first).
HOOK_METHODS = {
    "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
    "register_full_backward_pre_hook", "register_backward_hook",
}
PER_CALL_HOOKS = ("runtime.hooks.per_call_forward_hook", "runtime.hooks.per_call_forward_pre_hook")

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


class UncompiledModel(Rule):
    """
    ## What it does
    Finds a model trained in eager mode and compiles it once, right after the
    last statement that builds or moves it before the training loop, with
    `model.compile()`.

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
    not built in the function (or module) that trains it, and a model held in
    an attribute (`self.model`).

    ## Options
    Opt-in: the rule runs only when selected by its code
    (`perfmod apply --select PM506 --level numeric`, or `select = [..., "PM506"]`);
    `PM`, `PM5` and `ALL` do not select it.

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
    steps). Compilation can also fail on code dynamo does not support, graph
    breaks can make it slower than eager, and models called with changing
    shapes recompile; run `perfmod verify` before keeping it.
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
        Valid(SETUP.replace("import torch\n", "import torch\nfrom torch import compile as jit\n")
              + "model = jit(model)\n" + LOOP, "already compiled, through an alias"),
        Valid(SETUP + "model.compile()\n" + LOOP, "already compiled in place"),
        Valid(SETUP + "@torch.compile\ndef loss_of(x):\n    return model(x).pow(2).mean()\n" + LOOP,
              "the user compiles what they chose"),
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
        Invalid(SETUP + "h = model[0].register_forward_hook(lambda m, a, o: None)\n" + LOOP, None,
                "hooks: reported without a fix"),
        Invalid(SETUP + LOOP.replace("    opt.step()\n", "    opt.step()\n    model = model.to(device)\n"), None,
                "rebound in the loop"),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        if self._compiled_already(node):
            return
        hook = self._hook_registration(node)
        seen: set[int] = set()
        for loop in self.context.training.loops:
            if not loop.models:
                continue
            name = loop.models[0].expression
            if not name.isidentifier():
                if id(loop.loop) not in seen:
                    seen.add(id(loop.loop))
                    self.report(loop.loop, f"`{name}` is trained in eager mode; PM506 compiles only models held "
                                           f"in a variable: add `{name}.compile()` where it is built")
                continue
            anchor = self._anchor(loop.loop, name)
            key = id(anchor) if anchor is not None else id(loop.loop)
            if key in seen:
                continue
            seen.add(key)
            where = anchor or loop.loop
            if hook is not None:
                self.report(where, f"`{name}` could be compiled, but this file registers module hooks "
                                   f"(line {self.context.positions[hook].start.line}), which dynamo traces and "
                                   "may recompile for; fix PM501, then compile by hand and check with perfmod verify")
            elif anchor is None:
                self.report(where, f"`{name}` could be compiled, but it is not built or moved in the function "
                                   f"that trains it; add `{name}.compile()` where it is built")
            elif self._bound_again(anchor, loop.loop, name):
                self.report(where, f"`{name}` could be compiled, but it is bound again after this line; "
                                   f"add `{name}.compile()` after its last binding")
            else:
                compile_line = cst.parse_statement(f"{name}.compile()\n")
                self.report(anchor, edits=[InsertAfter(anchor, (compile_line,))])

    # -- what the file does already ------------------------------------------------------

    def _compiled_already(self, module: cst.Module) -> bool:
        names, index = self.context.names, self.context.index
        # torch.compile is spelled `torch.compile` (any alias of torch) or imported by name
        # (`from torch import compile as jit`): only those nodes need a qualified-name look-up.
        for node in index.find(cst.ImportFrom):
            if node.module is not None and not node.relative and module.code_for_node(node.module) == "torch" \
                    and not isinstance(node.names, cst.ImportStar) \
                    and any(_last_name(alias.name) == "compile" for alias in node.names):
                return True
        for node in index.find(cst.Attribute):
            if node.attr.value == "compile" and names.is_(node, *COMPILERS):
                return True
        models = {model.expression for loop in self.context.training.loops for model in loop.models}
        return any(method_name(call) == "compile" and module.code_for_node(call.func.value) in models
                   for call in index.find(cst.Call) if isinstance(call.func, cst.Attribute))

    def _hook_registration(self, module: cst.Module) -> cst.Call | None:
        per_call = {name.rsplit(".", 1)[1] for name in PER_CALL_HOOKS}
        for call in self.context.index.find(cst.Call):
            if method_name(call) in HOOK_METHODS:
                return call
            if _last_name(call.func) in per_call and self.context.names.is_(call, *PER_CALL_HOOKS):
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
        """The last statement before the loop, in a block around it, that builds or moves the model."""
        for block, index in self._blocks_out(loop):
            for statement in reversed(list(block.body)[:index]):
                if isinstance(statement, cst.SimpleStatementLine) and any(
                        self._sets_up(small, name) for small in statement.body):
                    return statement
        return None

    @staticmethod
    def _sets_up(small: cst.BaseSmallStatement, name: str) -> bool:
        """`name = ...`, `name: T = ...`, or `name.method(...)` (`.to(device)`, `.cuda()`)."""
        if isinstance(small, cst.Assign):
            return any(m.matches(t.target, m.Name(name)) for t in small.targets)
        if isinstance(small, cst.AnnAssign):
            return m.matches(small.target, m.Name(name)) and small.value is not None
        return isinstance(small, cst.Expr) and m.matches(small.value, m.Call(func=m.Attribute(value=m.Name(name))))

    def _bound_again(self, anchor: cst.SimpleStatementLine, loop: cst.CSTNode, name: str) -> bool:
        """Is `name` bound between the anchor and the end of the loop (the compiled
        module would not be the one trained)?"""
        scope = self.context.scopes.get(anchor.body[0])
        if scope is None:
            return True
        index = self.context.index
        after, end = index.end(anchor), index.end(loop)
        return any(a.node in index and after < index.order(a.node) <= end
                   for a in scope.assignments[name] if isinstance(a.node, cst.CSTNode))


def _last_name(node: cst.CSTNode) -> str | None:
    """`c` for `a.b.c` and for `c`."""
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return node.value if isinstance(node, cst.Name) else None

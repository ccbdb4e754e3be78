from __future__ import annotations

import libcst as cst

from codemod.analysis.hook_handles import hook_handles
from codemod.analysis.registrations import OnceInInit, registrations
from codemod.analysis.torch_facts import FORWARD_HOOK_REGISTRATIONS
from codemod.edits import InsertAfter, Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid

LEFT_AS_WRITTEN = (
    "left as written: a registration costs a few microseconds, which shows only in small models with "
    "many hooked layers (runtime.hooks.PersistentHooks passes per-call values to hooks registered once)"
)

PREAMBLE = """\
import functools
import torch
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [torch.randn(2, 4) for _ in range(3)]
acts = {}
def keep(module, args, output, name):
    acts[name] = output
"""

PROBE = """\
import torch


class Probe(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(2))
        self.norms = {}
"""


def _loop_with(body: str) -> str:
    return PREAMBLE + "for x in data:\n" + body + "    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"


class PerCallHookRegistration(Rule):
    """
    ## What it does
    Finds forward hooks and forward pre-hooks that are registered and removed
    again on every call: in a module's `forward`, in a `@contextmanager` helper,
    or in a loop that removes them in the same iteration (`try`/`finally` around
    the forward). Where `forward` registers the same hooks on every call and
    removes them in the `finally` of a `try` around the rest of its body, the
    registration moves to the end of `__init__`, and the handles and the
    `try`/`finally` go: the hooks are registered once, in plain torch.

    ## Why is this bad?
    A registration inside `forward` stops `torch.compile`: dynamo cannot trace
    the creation of torch's `RemovableHandle` (it sets a class attribute), and
    when that happens in a loop over the layers it gives up on the whole
    `forward`, which then runs eagerly (for a 2-block LM that registers a hook
    per block: 3 graphs and 2 graph breaks, against 1 graph and none once the
    hooks are registered in `__init__`; torch 2.13). In eager mode each
    registration and removal costs a few microseconds of Python (6.2-6.5 us for
    a `functools.partial` hook, best of 7 x 500 calls of 16 hooks, one CPU
    thread), which shows only for small models with many hooked layers.

    Hooks that carry values of the call (a cache dict made per call, a mask
    passed to `forward`), and registrations in a loop or a `@contextmanager`
    helper, are reported and left as written: registering them once needs their
    values passed another way (`runtime.hooks.PersistentHooks` registers hooks
    once and hands them per-call values in `with hooks.active(state=...)`),
    which is worth it only where the registrations show in a profile.

    A handle counts as removed in the same call when the code calls
    `handle.remove()` (directly, or for each handle of a list built in the
    function with `[...]`, `.append` or `+=`), uses it as a context manager,
    or enters it into a `contextlib.ExitStack` used for nothing else, inside
    the loop or `forward` that registers it. Registrations that run once
    (outside any loop and any `forward`) or only every few steps (a capture
    entered under `if step % 100 == 0:`), hooks whose handles are never removed
    in the same call, and functions that may run only once are left alone.

    ## Example
    ```python
    class LM(nn.Module):
        def __init__(self, blocks):
            super().__init__()
            self.blocks = nn.ModuleList(blocks)
            self.norms = {}

        def forward(self, x):
            handles = []
            for i, block in enumerate(self.blocks):
                def keep(module, args, out, i=i):
                    self.norms[i] = out.detach().norm()
                handles.append(block.register_forward_hook(keep))
            try:
                for block in self.blocks:
                    x = block(x)
                return x
            finally:
                for handle in handles:
                    handle.remove()
    ```
    Use instead:
    ```python
    class LM(nn.Module):
        def __init__(self, blocks):
            super().__init__()
            self.blocks = nn.ModuleList(blocks)
            self.norms = {}
            for i, block in enumerate(self.blocks):
                def keep(module, args, out, i=i):
                    self.norms[i] = out.detach().norm()
                block.register_forward_hook(keep)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x
    ```

    ## Fix safety
    Unsafe: the hooks now stay on their modules between calls of `forward`.
    The fix is made only where the registration reads nothing of the call: the
    names it reads are `self`, names it binds itself, and the module's functions,
    classes and imports; the attributes of `self` it reads are assigned in
    `__init__` alone; its other calls change nothing; and the hooks are removed
    only in the `finally` of a `try` that holds the rest of `forward`. Inside
    `forward` the model then runs the same hooks, in the same order, with the
    same arguments, and gives the same outputs and gradients bit for bit (the
    rule's tests check it on CPU). What changes: a hooked submodule called on its
    own, outside the model's `forward`, now runs the hook too; a hook that other
    code registers on the same module after `__init__` runs after this one
    instead of before it; and a hook defined inside `__init__` is a local
    function, so `torch.save(model)` of the whole module object cannot pickle it
    (state_dict checkpoints are not affected).

    Reported without a fix: hooks that depend on values of the call, hooks
    that read `self` (a lambda or a nested function) in a file that copies
    the model (`copy.deepcopy(model)`, an EMA teacher: the copy would share
    the closure made in `__init__`, and its hook would write to the
    original; a bound method `self._hook` is rebound to the copy), an
    attribute the hooks are registered on that the script assigns again
    on an instance (`model.head = nn.Linear(...)`), hooks
    registered in a loop, a `@contextmanager` helper or another function, and
    handles the rule cannot follow to their removal (stored on `self`, in a
    dict, returned, or read other than by `.remove()`) in a `forward`, a
    `@contextmanager` helper or a training loop.
    """

    CODE = "PM501"
    NAME = "per-call-hook-registration"
    LEVEL = Level.UNSAFE
    REQUIRES = FORWARD_HOOK_REGISTRATIONS
    MESSAGE = (
        "hook registered and removed on every call of forward, the same hook each time: registered once, "
        "in __init__ (torch.compile then traces forward without a graph break)"
    )
    GAIN = "forward compiles without a graph break; a few microseconds of Python per hook per call"

    VALID = [
        Valid(
            PREAMBLE + "handle = model[0].register_forward_hook(functools.partial(keep, name=0))\n"
            "for x in data:\n    model(x).sum().backward()\n    opt.step()\nhandle.remove()\n",
            "one-shot hook outside loops",
        ),
        Valid(
            PREAMBLE + "handles = []\nfor i, layer in enumerate(model):\n"
            "    handles.append(layer.register_forward_hook(functools.partial(keep, name=i)))\n"
            "for x in data:\n    model(x).sum().backward()\nfor h in handles:\n    h.remove()\n",
            "registered in a loop over layers, removed after training: once",
        ),
        Valid(
            PREAMBLE + "def attach():\n    h = model[0].register_forward_hook(functools.partial(keep, name=0))\n"
            "    model(data[0])\n    h.remove()\n",
            "a plain function may run once",
        ),
        Valid(
            _loop_with(
                "    if step % 10 == 0:\n"
                "        h = model[0].register_forward_hook(functools.partial(keep, name=0))\n"
                "        model(x)\n        h.remove()\n"
            ).replace("for x in data:", "for step, x in enumerate(data):"),
            "registered and removed only every ten steps",
        ),
        Valid(
            PREAMBLE + "class Hooker:\n    def register_forward_hook(self, fn):\n        return fn\n"
            "hooker = Hooker()\nfor x in data:\n    hooker.register_forward_hook(print)\n",
            "the result is never removed: not a per-call pair",
        ),
    ]
    INVALID = [
        Invalid(
            PROBE
            + "\n    def forward(self, x):\n        handles = []\n        for i, layer in enumerate(self.layers):\n"
            "            def norm(module, args, out, i=i):\n                self.norms[i] = out.norm()\n"
            "            handles.append(layer.register_forward_hook(norm))\n"
            "        try:\n            for layer in self.layers:\n                x = layer(x)\n            return x\n"
            "        finally:\n            for handle in handles:\n                handle.remove()\n",
            PROBE + "        for i, layer in enumerate(self.layers):\n"
            "            def norm(module, args, out, i=i):\n                self.norms[i] = out.norm()\n"
            "            layer.register_forward_hook(norm)\n"
            "\n    def forward(self, x):\n        for layer in self.layers:\n            x = layer(x)\n        return x\n",
            "the same hooks on every call of forward: registered once, in __init__",
        ),
        Invalid(
            PROBE
            + "\n    def forward(self, x):\n        h = self.layers[0].register_forward_pre_hook(lambda m, args: (args[0] * 2,))\n"
            "        try:\n            return self.layers[1](self.layers[0](x))\n        finally:\n            h.remove()\n",
            PROBE + "        self.layers[0].register_forward_pre_hook(lambda m, args: (args[0] * 2,))\n"
            "\n    def forward(self, x):\n        return self.layers[1](self.layers[0](x))\n",
            "one pre-hook held by a name",
        ),
        Invalid(
            PROBE
            + "\n    def forward(self, x, scale):\n        h = self.layers[0].register_forward_hook(lambda m, a, out: out * scale)\n"
            "        try:\n            return self.layers[1](self.layers[0](x))\n        finally:\n            h.remove()\n",
            None,
            "the hook reads an argument of forward: reported without a fix",
        ),
        Invalid(
            "from contextlib import contextmanager\n" + PREAMBLE + "@contextmanager\ndef attached(hooks: dict):\n"
            "    handles: list = []\n    for name, hook in hooks.items():\n"
            "        handle = model.get_submodule(name).register_forward_hook(hook, with_kwargs=True)\n"
            "        handles.append(handle)\n    try:\n        yield\n    finally:\n"
            "        for handle in handles:\n            handle.remove()\n",
            None,
            "handles in an annotated list, through a local name: reported as registered per call",
        ),
        Invalid(
            _loop_with(
                "    h = model[0].register_forward_hook(functools.partial(keep, name=0))\n"
                "    try:\n        out = model(x)\n    finally:\n        h.remove()\n"
            ),
            None,
            "try/finally in the training loop: reported",
        ),
        Invalid(
            PREAMBLE + "class Probe(torch.nn.Module):\n    def __init__(self, net):\n        super().__init__()\n"
            "        self.net = net\n        self.handles = []\n    def forward(self, x):\n"
            "        self.handles.append(self.net[0].register_forward_hook(functools.partial(keep, name=0)))\n"
            "        out = self.net(x)\n        for h in self.handles:\n            h.remove()\n"
            "        return out\n",
            None,
            "the handle is kept on self: reported without a fix",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not isinstance(node.func, cst.Attribute) or node.func.attr.value not in FORWARD_HOOK_REGISTRATIONS:
            return
        found = registrations(self.context)
        per_call = found.per_call(node)
        if per_call is None:
            return
        removals = hook_handles(self.context).removals(node)
        if removals is None:
            # The handle goes somewhere the rule cannot follow: report only where the
            # code visibly runs per call.
            if per_call != "loop" or found.in_training_loop(node):
                self.report(
                    node,
                    "hook registered on every call, but its handle is stored or used other than by "
                    f"`.remove()` (on self, in a dict, returned); {LEFT_AS_WRITTEN}",
                )
            return
        if not removals or not found.removed_in_same_call(node, removals):
            return  # never removed, or removed elsewhere: registered once, or unknown how often
        once = found.once_in_init(node, removals)
        if isinstance(once, str):
            self.report(node, f"hook registered and removed on every call, but {once}; {LEFT_AS_WRITTEN}")
        else:
            self.report(node, edits=_moved_to_init(once))


def _moved_to_init(once: OnceInInit) -> list:
    """The registration goes to the end of `__init__`; the handles and the `try`/`finally`
    that removed them go."""
    statement, holder, container_line = once.statement, once.holder, once.container_line
    if isinstance(holder, cst.ListComp):
        moved = _registering_loop(holder, statement)
    else:
        moved = statement.deep_replace(holder, once.call) if holder is not once.call else statement
    if isinstance(moved, cst.SimpleStatementLine) and isinstance(moved.body[0], cst.Assign):
        moved = moved.with_changes(body=[cst.Expr(moved.body[0].value)])  # `h = register(...)`
    lines = [*(container_line.leading_lines if container_line is not None else ()), *statement.leading_lines]
    comments = [line for line in lines if line.comment is not None]  # they go along
    edits = [
        Remove(statement, keep_comments=False),
        InsertAfter(once.init.body.body[-1], (moved.with_changes(leading_lines=comments),)),
        Replace(once.removing, _unwrapped),
        # `def forward` itself stays, but a diff of the file shows it moved below the
        # statement that now ends __init__: its line is part of this fix
        Replace(once.forward.name, lambda updated: updated),
    ]
    if container_line is not None:
        edits.append(Remove(container_line, keep_comments=False))
    return edits


def _registering_loop(comprehension: cst.ListComp, statement: cst.SimpleStatementLine) -> cst.For:
    """`handles = [m.register_forward_hook(f) for m in ms]` -> `for m in ms:` registering
    on each (the handles are no longer kept; a comment after the line goes along)."""
    for_in = comprehension.for_in
    registration = cst.SimpleStatementLine(
        [cst.Expr(comprehension.elt)], trailing_whitespace=statement.trailing_whitespace
    )
    return cst.For(target=for_in.target, iter=for_in.iter, body=cst.IndentedBlock([registration]))


def _unwrapped(updated: cst.Try) -> cst.FlattenSentinel:
    """`try: body finally: <removals>` -> body, the lines above the `try` above it."""
    first, *rest = updated.body.body
    lines = [*updated.leading_lines, *first.leading_lines]
    return cst.FlattenSentinel([first.with_changes(leading_lines=lines), *rest])

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst
from libcst.metadata import BuiltinAssignment, GlobalScope, ImportAssignment

from codemod.analysis import match as m
from codemod.analysis.hook_handles import hook_handles
from codemod.analysis.local_calls import local_calls
from codemod.analysis.names import names_read
from codemod.analysis.torch_facts import CONTEXT_MANAGER_DECORATORS, FORWARD_HOOK_REGISTRATIONS
from codemod.edits import InsertAfter, Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid

# Functions that run once per model call.
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
    (outside any loop and any `forward`), hooks whose handles are never removed
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
        per_call = self._per_call_region(node)
        if per_call is None:
            return
        removals = hook_handles(self.context).removals(node)
        if removals is None:
            # The handle goes somewhere the rule cannot follow: report only where the
            # code visibly runs per call.
            if per_call != "loop" or self._in_training_loop(node):
                self.report(
                    node,
                    "hook registered on every call, but its handle is stored or used other than by "
                    f"`.remove()` (on self, in a dict, returned); {LEFT_AS_WRITTEN}",
                )
            return
        if not removals or not self._removed_in_same_call(node, removals):
            return  # never removed, or removed elsewhere: registered once, or unknown how often
        once = self._register_once(node, removals)
        if isinstance(once, str):
            self.report(node, f"hook registered and removed on every call, but {once}; {LEFT_AS_WRITTEN}")
        else:
            self.report(node, edits=once)

    # -- where it runs -----------------------------------------------------------------

    def _regions(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """Loops and per-call functions around `node`, innermost first, up to the
        enclosing function: a `forward`, a `@contextmanager`, or a function some call
        of which runs in a loop or in such a function (`collect(model, x)` called in
        the training loop). A lambda or a function that runs once ends the search."""
        calls = local_calls(self.context)
        for ancestor in self.context.index.ancestors(node):
            if isinstance(ancestor, (cst.For, cst.While)):
                yield ancestor
            elif isinstance(ancestor, cst.FunctionDef):
                if self._is_context_manager(ancestor) or calls.runs_per_call(ancestor):
                    yield ancestor
                return
            elif isinstance(ancestor, (cst.Lambda, cst.ClassDef)):
                return

    def _per_call_region(self, node: cst.CSTNode) -> str | None:
        """`"function"` inside a per-call function, `"loop"` inside a loop, else None."""
        kinds = ["function" if isinstance(r, cst.FunctionDef) else "loop" for r in self._regions(node)]
        return "function" if "function" in kinds else (kinds[0] if kinds else None)

    def _is_context_manager(self, function: cst.FunctionDef) -> bool:
        return any(self.context.names.is_(d.decorator, *CONTEXT_MANAGER_DECORATORS) for d in function.decorators)

    def _in_training_loop(self, node: cst.CSTNode) -> bool:
        return any(
            isinstance(r, (cst.For, cst.While)) and self.context.loops.is_training_loop(r) for r in self._regions(node)
        )

    def _removed_in_same_call(self, node: cst.Call, removals: list[cst.CSTNode]) -> bool:
        """Is there a loop or per-call function around the registration that also holds a removal?"""
        for region in self._regions(node):
            if any(self.context.inside(removal, region) for removal in removals):
                return True
        return False

    # -- registered once, in __init__ --------------------------------------------------
    #
    # `forward` registers hooks that are the same on every call (they read only `self`,
    # attributes `__init__` sets, and the module's functions and imports) and removes
    # them in the `finally` of a `try` around the rest of its body: the registration goes
    # to the end of `__init__`, the handles and the `try`/`finally` go.

    def _register_once(self, call: cst.Call, removals: list[cst.CSTNode]) -> list | str:
        """The edits that register the hook of `call` once, in `__init__`, or why not."""
        found = self._module_forward(call)
        if isinstance(found, str):
            return found
        forward, init, receiver = found
        statement = self._top_statement(call, forward)
        held = self._handle_holder(call, statement)
        removing = self._removing_try(forward, statement, removals)
        if held is None or removing is None:
            return "its handles are not removed by the `finally` of one `try` around the rest of `forward`"
        holder, container_line = held
        if not self._only_registers_then_runs(forward, statement, removing, container_line):
            # other code before the hooks are registered, or after they are removed, runs without them
            return "`forward` runs other code before registering it or after removing it"
        why = self._differs_between_calls(statement, forward, init, receiver, call, holder)
        if why is not None:
            return why
        moved = statement.deep_replace(holder, call) if holder is not call else statement
        if isinstance(moved, cst.SimpleStatementLine) and isinstance(moved.body[0], cst.Assign):
            moved = moved.with_changes(body=[cst.Expr(moved.body[0].value)])  # `h = register(...)`
        lines = [*(container_line.leading_lines if container_line is not None else ()), *statement.leading_lines]
        comments = [line for line in lines if line.comment is not None]  # they go along
        edits = [
            Remove(statement, keep_comments=False),
            InsertAfter(init.body.body[-1], (moved.with_changes(leading_lines=comments),)),
            Replace(removing, _unwrapped),
            # `def forward` itself stays, but a diff of the file shows it moved below the
            # statement that now ends __init__: its line is part of this fix
            Replace(forward.name, lambda updated: updated),
        ]
        if container_line is not None:
            edits.append(Remove(container_line, keep_comments=False))
        return edits

    def _module_forward(self, call: cst.Call) -> tuple[cst.FunctionDef, cst.FunctionDef, str] | str:
        """(`forward`, `__init__`, their receiver) of the module class whose `forward`
        registers `call`, or why the registration is somewhere else."""
        forward = self.context.index.first_enclosing(call, cst.FunctionDef)
        owner = self.context.parents.get(self.context.parents.get(forward)) if forward is not None else None
        if forward is not None and self._is_context_manager(forward):
            given = self._parameters_read(call, forward)
            if given:
                return (
                    f"it is registered in the `@contextmanager` helper `{forward.name.value}`, and what it registers "
                    f"comes from each call (`{'`, `'.join(given)}`, given by the caller)"
                )
        if forward is None or forward.name.value != "forward" or not isinstance(owner, cst.ClassDef):
            return "it is registered in a loop, a context manager or a helper, not in a module's `forward`"
        init = next((s for s in owner.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        receiver = _first_param(forward)
        if init is None or receiver is None or receiver != _first_param(init) or not init.body.body:
            return "its class has no `__init__` of its own to register it in"
        return forward, init, receiver

    def _removing_try(
        self, forward: cst.FunctionDef, statement: cst.BaseStatement, removals: list[cst.CSTNode]
    ) -> cst.Try | None:
        """The one `try`/`finally` after `statement` in `forward` whose `finally` holds
        every removal and no other call; None when there is not exactly one such."""
        body = list(forward.body.body)
        tries = [
            s
            for s in body[body.index(statement) + 1 :]
            if isinstance(s, cst.Try) and not s.handlers and s.orelse is None and s.finalbody is not None
        ]
        if len(tries) != 1:
            return None
        final = tries[0].finalbody
        if not all(self.context.inside(r, final) for r in removals) or any(
            c not in removals for c in self.context.index.find(cst.Call, within=final)
        ):
            return None
        return tries[0]

    @staticmethod
    def _only_registers_then_runs(
        forward: cst.FunctionDef,
        statement: cst.BaseStatement,
        removing: cst.Try,
        container_line: cst.CSTNode | None,
    ) -> bool:
        """Does `forward` hold only the registration (with the handles' list), a docstring,
        and, last, the `try` that removes the hooks?"""
        body = list(forward.body.body)
        others = [
            s
            for s in body
            if s not in (statement, removing, container_line)
            and not m.matches(s, m.SimpleStatementLine(body=[m.Expr(m.SimpleString())]))  # a docstring
        ]
        return not others and body[-1] is removing

    def _parameters_read(self, call: cst.Call, function: cst.FunctionDef) -> list[str]:
        """The parameters of `function` (other than its receiver) that the registration
        `call` reads, directly or through the local names it reads (`for name, hook in
        hooks.items():`, `module = self.model.get_submodule(name)`)."""
        params = [p.name.value for p in (*function.params.params, *function.params.kwonly_params)]
        owner = self.context.parents.get(self.context.parents.get(function))
        receiver = _first_param(function) if isinstance(owner, cst.ClassDef) else None
        wanted = {p for p in params if p != receiver}
        found: list[str] = []
        todo, seen = list(names_read(call)), set()
        while todo:
            name = todo.pop()
            if name.value in seen:
                continue
            seen.add(name.value)
            if name.value in wanted:
                found.append(name.value)
                continue
            scope = self.context.scopes.get(name)
            if scope is None or name.value not in scope.assignments:
                continue
            for assignment in scope.assignments[name.value]:
                node = assignment.node
                if not isinstance(node, cst.Name) or not self.context.inside(node, function):
                    continue
                holder = self.context.bindings.statement(node)
                if isinstance(holder, cst.For):
                    todo += names_read(holder.iter)
                elif isinstance(holder, (cst.Assign, cst.AnnAssign)) and holder.value is not None:
                    todo += names_read(holder.value)
        return sorted(found)

    def _top_statement(self, node: cst.CSTNode, function: cst.FunctionDef) -> cst.BaseStatement:
        """The statement of `function`'s own body that holds `node`."""
        statement = node
        for ancestor in self.context.index.ancestors(node):
            if ancestor is function.body:
                return statement
            statement = ancestor
        return statement

    def _handle_holder(self, call: cst.Call, statement: cst.CSTNode) -> tuple[cst.CSTNode, cst.CSTNode | None] | None:
        """(the expression that keeps the handle, the `handles = []` line of its list):
        `handles.append(<call>)` (a statement) with `handles = []` alone in the same
        block, or `h = <call>` as the statement itself; None for any other shape."""
        parents, bindings = self.context.parents, self.context.bindings
        arg = parents.get(call)
        append = parents.get(arg)
        if isinstance(arg, cst.Arg) and m.matches(
            append, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("append")))
        ):
            found = bindings.assignments(append.func.value) or []
            values = [bindings.assigned_value(a) for a in found]
            if (
                not isinstance(parents.get(append), cst.Expr)
                or len(found) != 1
                or not m.matches(values[0], m.List(elements=[]))
            ):
                return None
            line = self.context.index.statement_of(found[0].node)
            if not isinstance(line, cst.SimpleStatementLine) or parents.get(line) is not parents.get(statement):
                return None
            return append, line
        assign = parents.get(call)
        if isinstance(assign, cst.Assign) and parents.get(assign) is statement and len(statement.body) == 1:
            return call, None
        return None

    def _differs_between_calls(
        self,
        statement: cst.CSTNode,
        forward: cst.FunctionDef,
        init: cst.FunctionDef,
        receiver: str,
        call: cst.Call,
        holder: cst.CSTNode,
    ) -> str | None:
        """Why `statement` may register other hooks, or on other modules, from one call to
        the next, or do something that moving it to the end of `__init__` would change;
        None when it does neither. It may read names it binds, `self` and the module's
        functions, classes and imports; `self.<attr>` where only `__init__` assigns it (or
        no method does); its calls must change nothing (the hooks' bodies run when the
        hooks run, either way); the names it binds must be new to `__init__`."""
        hooks = self.context.index.find((cst.FunctionDef, cst.Lambda), within=statement)
        return (
            self._leaves_forward(statement, hooks)
            or self._reads_call_values(statement, forward, receiver, call, holder)
            or self._reads_attributes_set_later(statement, init, receiver, hooks)
            or self._hook_of_copied_model(init, receiver, hooks)
            or self._side_effects(statement, call, hooks)
            or self._assigns_other_than_names(statement, hooks)
            or self._rebinds_names_init_reads(statement, init, hooks)
        )

    def _runs_in_hook(self, node: cst.CSTNode, hooks: list[cst.CSTNode]) -> bool:
        """Is `node` in the body of a function the statement defines: it runs when the hook runs."""
        return any(self.context.index.inside(node, hook.body) for hook in hooks)

    def _leaves_forward(self, statement: cst.CSTNode, hooks: list[cst.CSTNode]) -> str | None:
        """Does the statement return, yield, raise or change names outside itself?"""
        exits = (cst.Return, cst.Yield, cst.Await, cst.Raise, cst.Global, cst.Nonlocal, cst.AugAssign, cst.AnnAssign)
        if any(not self._runs_in_hook(n, hooks) for n in self.context.index.find(exits, within=statement)):
            return "moving it to `__init__` would change what `forward` does"
        return None

    def _reads_call_values(
        self, statement: cst.CSTNode, forward: cst.FunctionDef, receiver: str, call: cst.Call, holder: cst.CSTNode
    ) -> str | None:
        """A name the statement reads whose binding may differ between calls of `forward`
        (not in `handles.append(...)` around the call, which goes)."""
        index, scopes = self.context.index, self.context.scopes
        for name in names_read(statement):
            if holder is not call and index.inside(name, holder) and not index.inside(name, call):
                continue
            scope = scopes.get(name)
            # the bindings this read may see (a later `for blk in ...` of forward is not one)
            bindings = (self.context.kinds.reaching(name) or scope[name.value]) if scope is not None else [None]
            if not all(self._same_binding(binding, statement, forward, receiver) for binding in bindings):
                return f"it depends on `{name.value}`, a value of the call"
        return None

    def _reads_attributes_set_later(
        self, statement: cst.CSTNode, init: cst.FunctionDef, receiver: str, hooks: list[cst.CSTNode]
    ) -> str | None:
        """`self.<attr>`, read outside the hooks, that code other than `__init__` assigns."""
        index = self.context.index
        for attribute in index.find(cst.Attribute, within=statement):
            if self._runs_in_hook(attribute, hooks) or not m.matches(attribute.value, m.Name(receiver)):
                continue
            values = self.context.kinds.attribute_values(attribute)
            if values is not None and not all(index.inside(v, init) for v in values):
                return f"`{receiver}.{attribute.attr.value}` is assigned outside `__init__`"
        return None

    def _hook_of_copied_model(self, init: cst.FunctionDef, receiver: str, hooks: list[cst.CSTNode]) -> str | None:
        """A hook that reads `self`, in a file that copies the model: the copy's hook would
        be the closure made in the original's `__init__`."""
        kinds = self.context.kinds
        closures = [hook for hook in hooks if any(r.value == receiver for r in names_read(hook))]
        copies = kinds.copies_of(kinds.class_of(init)) if closures else []
        if not copies:
            return None
        copied = self.context.module.code_for_node(copies[0])
        return (
            f"the file copies the model (`{copied}`): a hook made in `__init__` that reads `{receiver}` "
            "would, in the copy, still read and write the original"
        )

    def _side_effects(self, statement: cst.CSTNode, call: cst.Call, hooks: list[cst.CSTNode]) -> str | None:
        """A call of the statement, other than the registration and outside the hooks, that
        may change something."""
        index = self.context.index
        for inner in index.find(cst.Call, within=statement):
            if (
                self._runs_in_hook(inner, hooks)
                or inner is call
                or index.inside(call, inner)
                or index.inside(inner, call)
            ):
                continue
            if not self.context.purity.side_effect_free(inner):
                return f"`{self.context.module.code_for_node(inner)}` may have side effects"
        return None

    def _assigns_other_than_names(self, statement: cst.CSTNode, hooks: list[cst.CSTNode]) -> str | None:
        """An assignment, outside the hooks, to an attribute or an item."""
        for assign in self.context.index.find(cst.Assign, within=statement):
            if not self._runs_in_hook(assign, hooks) and not all(
                isinstance(t.target, cst.Name) for t in assign.targets
            ):
                return "moving it to `__init__` would change what `forward` does"
        return None

    def _rebinds_names_init_reads(
        self, statement: cst.CSTNode, init: cst.FunctionDef, hooks: list[cst.CSTNode]
    ) -> str | None:
        """At the end of `__init__` the statement may rebind `__init__`'s own names, unless
        a function defined in `__init__` reads them later."""
        index = self.context.index
        bound = [
            n
            for n in index.find(cst.Name, within=statement)
            if not self._runs_in_hook(n, hooks)
            and isinstance(self.context.parents.get(n), (cst.AssignTarget, cst.For, cst.FunctionDef, cst.Element))
        ]
        late = {n.value for f in index.find((cst.FunctionDef, cst.Lambda), within=init.body) for n in names_read(f)}
        if self.context.scopes.get(init.body) is None or any(n.value in late for n in bound):
            return "a name it binds is read by a function defined in `__init__`"
        return None

    def _same_binding(self, binding, statement: cst.CSTNode, forward: cst.FunctionDef, receiver: str) -> bool:
        """Is `binding` the same on every call of `forward`: made by `statement` itself,
        `forward`'s receiver, a builtin, an import, or a module-level def or class?"""
        if isinstance(binding, (BuiltinAssignment, ImportAssignment)):
            return True
        node = getattr(binding, "node", None)
        if node is None:
            return False
        if self.context.index.inside(node, statement):
            return True
        if isinstance(node, cst.Param) and node.name.value == receiver:
            return binding.scope is self.context.scopes.get(forward.body)
        return isinstance(binding.scope, GlobalScope) and isinstance(node, (cst.FunctionDef, cst.ClassDef))


def _first_param(function: cst.FunctionDef) -> str | None:
    params = function.params.params
    return params[0].name.value if params else None


def _unwrapped(updated: cst.Try) -> cst.FlattenSentinel:
    """`try: body finally: <removals>` -> body, the lines above the `try` above it."""
    first, *rest = updated.body.body
    lines = [*updated.leading_lines, *first.leading_lines]
    return cst.FlattenSentinel([first.with_changes(leading_lines=lines), *rest])

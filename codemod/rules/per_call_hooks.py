from __future__ import annotations

from collections.abc import Iterator

import libcst as cst
from libcst.metadata import BuiltinAssignment, GlobalScope, ImportAssignment

from codemod.analysis import match as m
from codemod.analysis.local_calls import local_calls
from codemod.analysis.names import kwarg, names_read, positional
from codemod.edits import InsertAfter, Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid

# torch's method -> the runtime function that takes its place
TORCH_TO_RUNTIME = {
    "register_forward_hook": "per_call_forward_hook",
    "register_forward_pre_hook": "per_call_forward_pre_hook",
}
RUNTIME_MODULE = "runtime.hooks"
# Functions that run once per model call.
PER_CALL_FUNCTIONS = ("forward", "__call__")
CONTEXT_MANAGERS = ("contextlib.contextmanager", "contextlib.asynccontextmanager")
REGISTER_ONCE = (
    "hook registered and removed on every call of forward, the same hook each time: register it once, "
    "in __init__ (torch.compile then traces forward without a graph break)"
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


def _imported(code: str, function: str = "per_call_forward_hook") -> str:
    """`code` (which starts with PREAMBLE) with the import the fix adds."""
    return code.replace("import torch\n", f"import torch\nfrom runtime.hooks import {function}\n\n", 1)


def _loop_with(body: str) -> str:
    return PREAMBLE + "for x in data:\n" + body + "    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"


class PerCallHookRegistration(Rule):
    """
    ## What it does
    Finds forward hooks and forward pre-hooks that are registered and removed
    again on every call: in a module's `forward`, in a `@contextmanager` helper,
    or in a loop that removes them in the same iteration (`try`/`finally` around
    the forward). Each `module.register_forward_hook(fn)` there becomes
    `per_call_forward_hook(module, fn)` from `runtime.hooks`; the code around it
    (the handles, the `finally` that removes them) stays as written.

    ## Why is this bad?
    Every registration goes through torch's hook bookkeeping: a new
    `RemovableHandle` (with weak references to the hook dicts), entries in up
    to three dicts, and the same again to remove it. The runtime registers one
    dispatcher hook per module with torch, once; a call then only appends its
    hook to the dispatcher's list, and `handle.remove()` takes it off again.
    The gain is that Python overhead: creating, registering and removing a
    `functools.partial` hook took 6.2-6.5 us with torch and 3.3-3.7 us with
    the runtime (best of 7 x 500 calls of 16 hooks, one CPU thread, torch
    2.13, on a shared machine). It shows for small models with many hooked
    layers (1.02x tokens/s for a 16-wide, 4-hook LM on one CPU thread) and
    disappears in large ones; `benchmarks/bench_model.py` measures a hooked LM
    end to end.

    Per-call registration does not stop `torch.compile` on torch 2.13: dynamo
    traces the hooks of a compiled module, and a module whose hook is
    registered and removed around each of 8 calls compiled to the same 2
    graphs as the same module using this rule's dispatcher (backend "eager",
    hook state passed as a tensor). Hook state kept in a Python number makes
    dynamo specialize on the first values it sees, with or without this rule.

    A handle counts as removed in the same call when the code calls
    `handle.remove()` (directly, or for each handle of a list built in the
    function with `[...]`, `.append` or `+=`), uses it as a context manager,
    or enters it into a `contextlib.ExitStack` used for nothing else, inside
    the loop or `forward` that registers it.

    Registrations that run once (outside any loop and any `forward`), hooks
    whose handles are never removed in the same call, and functions that may
    run only once are left alone.

    ## Example
    ```python
    for x in data:
        handles = [layer.register_forward_hook(functools.partial(keep, name=i))
                   for i, layer in enumerate(model)]
        try:
            loss = model(x).sum()
        finally:
            for handle in handles:
                handle.remove()
        loss.backward()
    ```
    Use instead:
    ```python
    from runtime.hooks import per_call_forward_hook

    for x in data:
        handles = [per_call_forward_hook(layer, functools.partial(keep, name=i))
                   for i, layer in enumerate(model)]
        try:
            loss = model(x).sum()
        finally:
            for handle in handles:
                handle.remove()
        loss.backward()
    ```

    ## Fix safety
    Unsafe by the catalogue's scheme (PM501 changes how the model's hooks are
    held), but the rewritten code gives the same outputs and gradients bit for
    bit, which the rule's tests check on CPU: the dispatcher calls each hook
    with torch's arguments (`with_kwargs=True` hooks get the keyword arguments)
    and uses what it returns as torch does (a replacement output; replacement
    args, or `(args, kwargs)`); with no hook listed it returns at once, so
    removed hooks have no effect; and the hooks run in torch's order: a hook
    registered per call runs after every hook already on the module, so when
    other code registered a hook after the dispatcher, the dispatcher moves
    itself behind it, or, while it holds hooks of the running call, the new hook
    is registered with torch as before. Removal stays where the code has it, so
    a `finally` still removes the hooks after an exception, and nested or
    re-entrant calls add and remove their own entries. One case differs: torch
    fixes the hooks it will run when it starts running a module's hooks, the
    dispatcher when it is reached, so a hook that itself registers per-call
    hooks on the module whose hooks are running sees them run in the same pass.
    Objects that are not `nn.Module`s (and TorchScript modules) are registered
    with their own method, unchanged. What does change: a hooked module keeps
    the (inert) dispatcher between calls, so it runs torch's hook path instead
    of its no-hook fast path (same results), and `torch.save(model)` of the
    whole module object pickles the dispatcher, so loading that file needs
    `runtime` importable (state_dict checkpoints are not affected).

    Reported without a fix: `prepend=True` and `always_call=True` hooks (the
    dispatcher runs last and only after a forward that returned), `*args` /
    `**kwargs` in the call, and handles the rule cannot follow to their removal
    (stored on `self`, in a dict, returned, or read other than by
    `.remove()`) in a `forward`, a `@contextmanager` helper or a training loop.
    """

    CODE = "PM501"
    NAME = "per-call-hook-registration"
    LEVEL = Level.UNSAFE
    REQUIRES = tuple(TORCH_TO_RUNTIME)
    MESSAGE = (
        "hook registered and removed on every call; register it once "
        "(runtime.hooks.per_call_forward_hook keeps one dispatcher per module)"
    )
    GAIN = "about 3 us of Python per hook per call: shows only in small models with many hooked layers"

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
            _loop_with(
                "    h = model[0].register_forward_hook(functools.partial(keep, name=0))\n"
                "    try:\n        out = model(x)\n    finally:\n        h.remove()\n"
            ),
            _imported(
                _loop_with(
                    "    h = per_call_forward_hook(model[0], functools.partial(keep, name=0))\n"
                    "    try:\n        out = model(x)\n    finally:\n        h.remove()\n"
                )
            ),
            "try/finally in the training loop",
        ),
        Invalid(
            _loop_with(
                "    h = None\n    try:\n        h = model[2].register_forward_hook(lambda m, a, o: o * 2)\n"
                "        out = model(x)\n    finally:\n        if h is not None:\n            h.remove()\n"
            ),
            _imported(
                _loop_with(
                    "    h = None\n    try:\n        h = per_call_forward_hook(model[2], lambda m, a, o: o * 2)\n"
                    "        out = model(x)\n    finally:\n        if h is not None:\n"
                    "            h.remove()\n"
                )
            ),
            "a handle compared with None before removal",
        ),
        Invalid(
            PREAMBLE + "class Probe(torch.nn.Module):\n    def __init__(self, net):\n        super().__init__()\n"
            "        self.net = net\n    def forward(self, x, shift):\n"
            "        with self.net[0].register_forward_pre_hook(lambda m, args: (args[0] + shift,)):\n"
            "            return self.net(x)\n",
            _imported(
                PREAMBLE + "class Probe(torch.nn.Module):\n    def __init__(self, net):\n        super().__init__()\n"
                "        self.net = net\n    def forward(self, x, shift):\n"
                "        with per_call_forward_pre_hook(self.net[0], lambda m, args: (args[0] + shift,)):\n"
                "            return self.net(x)\n",
                "per_call_forward_pre_hook",
            ),
            "a pre-hook in forward, removed by `with`",
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
        Invalid(
            _loop_with(
                "    h = model[0].register_forward_hook(functools.partial(keep, name=0), prepend=True)\n"
                "    try:\n        out = model(x)\n    finally:\n        h.remove()\n"
            ),
            None,
            "prepend=True: reported without a fix",
        ),
    ]

    def __init__(self, context) -> None:
        super().__init__(context)
        self._following: set[tuple] = set()  # (scope, name) of handles and containers being followed

    def visit_Call(self, node: cst.Call) -> None:
        if not isinstance(node.func, cst.Attribute) or node.func.attr.value not in TORCH_TO_RUNTIME:
            return
        per_call = self._per_call_region(node)
        if per_call is None:
            return
        removals = self._removals(node)
        if removals is None:
            # The handle goes somewhere the rule cannot follow: report only where the
            # code visibly runs per call.
            if per_call != "loop" or self._in_training_loop(node):
                self.report(
                    node,
                    "hook registered on every call, but its handle is stored or used other than by "
                    "`.remove()` (on self, in a dict, returned); register it once by hand, e.g. with "
                    "runtime.hooks.PersistentHooks",
                )
            return
        if not removals or not self._removed_in_same_call(node, removals):
            return  # never removed, or removed elsewhere: registered once, or unknown how often
        once = self._register_once(node, removals)
        if once is not None:
            self.report(node, REGISTER_ONCE, edits=once)
            return
        problem = self._argument_problem(node)
        if problem is not None:
            self.report(node, f"hook registered and removed on every call, but {problem}; left as written")
            return
        function = TORCH_TO_RUNTIME[node.func.attr.value]
        if self._name_taken(node, function):
            self.report(
                node,
                f"hook registered and removed on every call, but this file binds `{function}` "
                "to something else; rename it to apply the fix",
            )
            return
        self.report(
            node,
            edits=[Replace(node, lambda updated: _per_call(updated, function))],
            imports=[(RUNTIME_MODULE, function)],
        )

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
        return any(self.context.names.is_(d.decorator, *CONTEXT_MANAGERS) for d in function.decorators)

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

    # -- where the handle goes ---------------------------------------------------------
    #
    # The handle may go to a name, into a list or a dict (built in the function, by
    # `[...]`, `{}`, `.append`, `+=`, `d[k] = ...`), or into a `with`; it counts as
    # removed by `h.remove()`, `with h:`, a loop over the container that removes each
    # (`for h in hs:`, `for h in hs.values():`, `for k, h in hs.items():`, `[h.remove()
    # for h in hs]`), `hs.pop().remove()` (in `while hs:` too) or `hs[k].remove()`.
    # Any other use (stored on self, returned, passed on) is not followed.

    def _removals(self, call: cst.Call) -> list[cst.CSTNode] | None:
        """The nodes that remove the handle `call` returns ([] when none does), or None
        when the handle is used in a way the rule does not follow."""
        parent = self.context.parents.get(call)
        if isinstance(parent, cst.WithItem) and parent.asname is None:
            return [parent]
        if isinstance(parent, cst.Expr):
            return []  # the handle is dropped: the hook stays
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            target = parent.targets[0].target
            if isinstance(target, cst.Name):
                return self._handle_removals(target)
            if isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name):
                return self._container_removals(target.value)  # `handles[name] = ...`
            return None
        if isinstance(parent, cst.Arg):
            return self._passed_removals(parent)
        # `handles = [m.register_...(f)]`, `handles += [... for ...]`
        display = self.context.parents.get(parent) if isinstance(parent, cst.Element) else parent
        if isinstance(display, cst.List) or (isinstance(display, cst.ListComp) and call is display.elt):
            target = self._list_target(self.context.parents.get(display))
            return self._container_removals(target) if target is not None else None
        return None

    def _passed_removals(self, arg: cst.Arg) -> list[cst.CSTNode] | None:
        """`handles.append(<handle>)` or `stack.enter_context(<handle>)`."""
        outer = self.context.parents.get(arg)
        if not (
            isinstance(outer, cst.Call)
            and len(outer.args) == 1
            and arg.keyword is None
            and not arg.star
            and m.matches(outer.func, m.Attribute(value=m.Name()))
        ):
            return None
        if outer.func.attr.value == "append":
            return self._container_removals(outer.func.value)
        if outer.func.attr.value == "enter_context":
            return self._exit_stack_removals(outer.func.value)
        return None

    @staticmethod
    def _list_target(statement: cst.CSTNode | None) -> cst.Name | None:
        """`L` of `L = [...]` or `L += [...]`."""
        if isinstance(statement, cst.Assign) and len(statement.targets) == 1:
            target = statement.targets[0].target
        elif isinstance(statement, cst.AugAssign) and isinstance(statement.operator, cst.AddAssign):
            target = statement.target
        else:
            return None
        return (
            target if isinstance(target, cst.Name) and isinstance(statement.value, (cst.List, cst.ListComp)) else None
        )

    def _references(self, name: cst.Name) -> list[cst.Name] | None:
        """Every read of the variable `name` in its scope, or None when it is bound
        by something other than a plain assignment or a `for` target."""
        scope = self.context.scopes.get(name)
        if scope is None:
            return None
        reads = []
        for assignment in scope.assignments[name.value]:
            if not isinstance(assignment.node, cst.Name):
                return None  # a parameter, an import, a global: bound elsewhere
            reads += [access.node for access in assignment.references]
        return reads

    def _is_remove(self, read: cst.CSTNode) -> cst.Call | None:
        """The call `read.remove()`, if that is what `read` is the receiver of."""
        attribute = self.context.parents.get(read)
        call = self.context.parents.get(attribute)
        if (
            isinstance(attribute, cst.Attribute)
            and attribute.value is read
            and attribute.attr.value == "remove"
            and isinstance(call, cst.Call)
            and call.func is attribute
            and not call.args
        ):
            return call
        return None

    def _handle_removals(self, name: cst.Name) -> list[cst.CSTNode] | None:
        """Removals of the handle held by `name`: `name.remove()` or `with name:`, or
        those of the list or dict it is put in; it may also be compared with None.
        Any other read: None."""
        key = self._following_key(name)
        if key in self._following:
            return []  # followed already, further up: its reads are being checked there
        reads = self._references(name)
        if reads is None:
            return None
        self._following.add(key)
        try:
            return self._handle_reads(reads)
        finally:
            self._following.discard(key)

    def _following_key(self, name: cst.Name) -> tuple:
        return (self.context.scopes.get(name), name.value)

    def _handle_reads(self, reads: list[cst.Name]) -> list[cst.CSTNode] | None:
        removals = []
        for read in reads:
            parent = self.context.parents.get(read)
            if isinstance(parent, cst.WithItem) and parent.asname is None:
                removals.append(parent)
            elif (removal := self._is_remove(read)) is not None:
                removals.append(removal)
            elif isinstance(parent, cst.Arg):
                found = self._passed_removals(parent)
                if found is None:
                    return None
                removals += found
            elif (
                isinstance(parent, cst.Assign)
                and parent.value is read
                and len(parent.targets) == 1
                and m.matches(parent.targets[0].target, m.Subscript(value=m.Name()))
            ):
                found = self._container_removals(parent.targets[0].target.value)  # `handles[k] = h`
                if found is None:
                    return None
                removals += found
            elif not m.matches(
                parent,
                m.Comparison(
                    left=m.Name(),
                    comparisons=[m.ComparisonTarget(operator=m.Is() | m.IsNot(), comparator=m.Name("None"))],
                ),
            ):
                return None  # `if h is not None:` reads it the same way for either handle
        return removals

    def _exit_stack_removals(self, name: cst.Name) -> list[cst.CSTNode] | None:
        """`with contextlib.ExitStack() as stack:` ... `stack.enter_context(handle)`: the
        `with` removes the handles, if `stack` is used for nothing but enter_context."""
        reads = self._references(name)
        if reads is None:
            return None
        for read in reads:
            if not m.matches(self.context.parents.get(read), m.Attribute(attr=m.Name("enter_context"))):
                return None
        scope = self.context.scopes.get(name)
        removals = []
        for assignment in scope.assignments[name.value]:
            as_name = self.context.parents.get(assignment.node)
            item = self.context.parents.get(as_name)
            if not (
                isinstance(as_name, cst.AsName)
                and isinstance(item, cst.WithItem)
                and self.context.names.is_(item.item, "contextlib.ExitStack")
            ):
                return None
            removals.append(self.context.parents.get(item))
        return removals

    def _container_removals(self, name: cst.Name) -> list[cst.CSTNode] | None:
        """Removals of the handles kept in the list or dict `name`: it must be built here
        (`[...]`, `{}`, a comprehension, `list()`, `dict()`), and only be filled,
        cleared, measured, or emptied by removing each handle."""
        scope = self.context.scopes.get(name)
        if scope is None:
            return None
        key = self._following_key(name)
        if key in self._following:
            return []
        for assignment in scope.assignments[name.value]:
            if not isinstance(assignment.node, cst.Name):
                return None
            parent = self.context.parents.get(assignment.node)
            statement = self.context.parents.get(parent) if isinstance(parent, cst.AssignTarget) else parent
            if self._list_target(statement) is None and not self._empty_container(statement):
                return None
        reads = self._references(name)
        if reads is None:
            return None
        self._following.add(key)
        try:
            removals = []
            for read in reads:
                found = self._container_read(read)
                if found is None:
                    return None
                removals += found
            return removals
        finally:
            self._following.discard(key)

    def _empty_container(self, statement: cst.CSTNode | None) -> bool:
        """`d = {}`, `d = dict()`, `l = list()`."""
        if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1):
            return False
        value = statement.value
        if isinstance(value, cst.Dict):
            return not value.elements
        return (
            isinstance(value, cst.Call)
            and not value.args
            and self.context.names.is_(value.func, "dict", "builtins.dict", "list", "builtins.list")
        )

    def _container_read(self, read: cst.Name) -> list[cst.CSTNode] | None:
        """What one read of a handle container does: the removals it makes ([] for a read
        that adds, clears or measures), or None for a use the rule does not follow."""
        parents = self.context.parents
        parent = parents.get(read)
        if isinstance(parent, cst.Attribute) and parent.value is read:
            call = parents.get(parent)
            method = parent.attr.value
            if not (isinstance(call, cst.Call) and call.func is parent):
                return None
            if method in ("append", "clear", "extend"):
                return []
            if method == "pop":  # `hs.pop().remove()`
                removal = self._is_remove(call)
                return [removal] if removal is not None else None
            if method in ("values", "items") and not call.args:
                return self._iteration_removals(call, pairs=method == "items")
            return None
        if isinstance(parent, cst.AugAssign) and parent.target is read:
            return []  # `hs += [...]`, checked with the assignments
        if isinstance(parent, cst.SubscriptElement) or isinstance(parent, cst.Subscript):
            subscript = parent if isinstance(parent, cst.Subscript) else None
            if subscript is None or subscript.value is not read:
                return None
            holder = parents.get(subscript)
            if isinstance(holder, cst.AssignTarget):
                return []  # `hs[k] = handle`
            removal = self._is_remove(subscript)  # `hs[k].remove()`
            return [removal] if removal is not None else None
        if isinstance(parent, cst.While) and parent.test is read:
            return []  # `while hs: hs.pop().remove()`
        if isinstance(parent, cst.Arg) and m.matches(
            parents.get(parent), m.Call(func=m.Name("len") | m.Name("reversed"))
        ):
            call = parents.get(parent)
            if call.func.value == "len":
                return []
            return self._iteration_removals(call, pairs=False)
        return self._iteration_removals(read, pairs=False)

    def _iteration_removals(self, iterable: cst.CSTNode, pairs: bool) -> list[cst.CSTNode] | None:
        """`for h in <iterable>: h.remove()` (`for k, h in ...` when `pairs`), or
        `[h.remove() for h in <iterable>]`: the removals; None for any other use."""
        parent = self.context.parents.get(iterable)
        if not isinstance(parent, (cst.For, cst.CompFor)) or parent.iter is not iterable:
            return None
        target = parent.target
        if pairs:
            if not (isinstance(target, cst.Tuple) and len(target.elements) == 2):
                return None
            target = target.elements[1].value
        if not isinstance(target, cst.Name):
            return None
        if self._following_key(target) in self._following:
            return []  # `h = register(...); hs.append(h)` ... `for h in hs:`: the same name, checked already
        if isinstance(parent, cst.CompFor):
            found = (
                self._handle_removals(target) if isinstance(self.context.parents.get(parent), cst.ListComp) else None
            )
        else:
            found = self._handle_removals(target)
        return found or None

    # -- registered once, in __init__ --------------------------------------------------
    #
    # `forward` registers hooks that are the same on every call (they read only `self`,
    # attributes `__init__` sets, and the module's functions and imports) and removes
    # them in the `finally` of a `try` around the rest of its body: the registration goes
    # to the end of `__init__`, the handles and the `try`/`finally` go.

    def _register_once(self, call: cst.Call, removals: list[cst.CSTNode]) -> list | None:
        """The edits that register the hook of `call` once, in `__init__`; None when the
        code is not of that shape or the hook may differ from one call to the next."""
        forward = self.context.index.first_enclosing(call, cst.FunctionDef)
        owner = self.context.parents.get(self.context.parents.get(forward)) if forward is not None else None
        if forward is None or forward.name.value != "forward" or not isinstance(owner, cst.ClassDef):
            return None
        init = next((s for s in owner.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        receiver = _first_param(forward)
        if init is None or receiver is None or receiver != _first_param(init) or not init.body.body:
            return None
        body = list(forward.body.body)
        statement = self._top_statement(call, forward)
        handles = self._handle_holder(call, statement)
        if handles is None:
            return None
        holder, container_line = handles
        tries = [
            s
            for s in body[body.index(statement) + 1 :]
            if isinstance(s, cst.Try) and not s.handlers and s.orelse is None and s.finalbody is not None
        ]
        if len(tries) != 1 or not all(self.context.inside(r, tries[0].finalbody) for r in removals):
            return None
        cleanup = tries[0]
        if not all(
            self._is_removal_call(c, removals) for c in self.context.index.find(cst.Call, within=cleanup.finalbody)
        ):
            return None
        if not self._same_on_every_call(statement, forward, init, receiver, call, holder):
            return None
        moved = statement.deep_replace(holder, call) if holder is not call else statement
        if isinstance(moved, cst.SimpleStatementLine) and isinstance(moved.body[0], cst.Assign):
            moved = moved.with_changes(body=[cst.Expr(moved.body[0].value)])  # `h = register(...)`
        edits = [
            Remove(statement, keep_comments=False),
            InsertAfter(init.body.body[-1], (moved.with_changes(leading_lines=()),)),
            Replace(cleanup, _unwrapped),
        ]
        if container_line is not None:
            edits.append(Remove(container_line, keep_comments=False))
        return edits

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
        `handles.append(<call>)` (a statement) with `handles = []` alone before it, or
        `h = <call>` as the statement itself; None for any other shape."""
        parents = self.context.parents
        arg = parents.get(call)
        append = parents.get(arg)
        if isinstance(arg, cst.Arg) and m.matches(
            append, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("append")))
        ):
            if not isinstance(parents.get(append), cst.Expr):
                return None
            found = self.context.bindings.assignments(append.func.value)
            values = [self.context.bindings.assigned_value(a) for a in found or ()]
            if len(values) != 1 or not m.matches(values[0], m.List(elements=[])):
                return None
            line = parents.get(parents.get(parents.get(found[0].node)))
            if not isinstance(line, cst.SimpleStatementLine) or parents.get(line) is not parents.get(statement):
                return None
            return append, line
        assign = parents.get(call)
        if isinstance(assign, cst.Assign) and parents.get(assign) is statement and len(statement.body) == 1:
            return call, None
        return None

    def _is_removal_call(self, call: cst.Call, removals: list[cst.CSTNode]) -> bool:
        return any(call is r for r in removals)

    def _same_on_every_call(
        self,
        statement: cst.CSTNode,
        forward: cst.FunctionDef,
        init: cst.FunctionDef,
        receiver: str,
        call: cst.Call,
        holder: cst.CSTNode,
    ) -> bool:
        """Does `statement` register the same hooks on the same modules on every call, and
        do nothing else that moving it to the end of `__init__` would change? It reads
        only names it binds, `self` and the module's functions, classes and imports;
        `self.<attr>` only where `__init__` alone assigns it (or no method does); its
        calls change nothing (the hooks' bodies run later either way); it binds plain
        names that `__init__` does not use."""
        index, scopes = self.context.index, self.context.scopes
        skipped = (call, holder)
        nested = [n for n in index.find((cst.FunctionDef, cst.Lambda), within=statement)]

        def deferred(node: cst.CSTNode) -> bool:  # runs when the hook runs
            return any(index.inside(node, n.body) for n in nested)

        if any(
            not deferred(n)
            for n in index.find(
                (cst.Return, cst.Yield, cst.Await, cst.Raise, cst.Global, cst.Nonlocal), within=statement
            )
        ):
            return False
        for name in names_read(statement):
            if any(index.inside(name, n) for n in skipped) and not index.inside(name, call):
                continue  # `handles` of `handles.append(...)`, which goes
            scope = scopes.get(name)
            if scope is None:
                return False
            # the bindings this read may see (a later `for blk in ...` of forward is not one)
            for binding in self.context.kinds.reaching(name) or scope[name.value]:
                if isinstance(binding, (BuiltinAssignment, ImportAssignment)):
                    continue
                node = getattr(binding, "node", None)
                if node is None:
                    return False
                if index.inside(node, statement):
                    continue
                if (
                    isinstance(node, cst.Param)
                    and node.name.value == receiver
                    and binding.scope is scopes.get(forward.body)
                ):
                    continue
                if isinstance(binding.scope, GlobalScope) and isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                    continue
                return False
        for attribute in index.find(cst.Attribute, within=statement):
            if deferred(attribute) or not m.matches(attribute.value, m.Name(receiver)):
                continue
            values = self.context.bindings.attribute_values(attribute)
            if values is not None and not all(index.inside(v, init) for v in values):
                return False
        for inner in index.find(cst.Call, within=statement):
            if deferred(inner) or inner in skipped or any(index.inside(s, inner) for s in skipped):
                continue
            if not self.context.purity.side_effect_free(inner):
                return False
        init_scope = scopes.get(init.body)
        for target in index.find(cst.Name, within=statement):
            parent = self.context.parents.get(target)
            binds = isinstance(
                parent, (cst.AssignTarget, cst.For, cst.FunctionDef, cst.ClassDef, cst.Element, cst.Tuple)
            )
            if deferred(target) or not binds:
                continue
            if init_scope is None or init_scope.assignments[target.value] or init_scope.accesses[target.value]:
                return False
        return all(
            isinstance(t, cst.Name) or deferred(t)
            for a in index.find(cst.Assign, within=statement)
            for t in (at.target for at in a.targets)
        ) and not [a for a in index.find((cst.AugAssign, cst.AnnAssign), within=statement) if not deferred(a)]

    # -- the call itself ---------------------------------------------------------------

    def _argument_problem(self, call: cst.Call) -> str | None:
        if any(arg.star for arg in call.args):
            return "its arguments are passed with * or **"
        for name in ("prepend", "always_call"):
            if kwarg(call, name) is not None:
                return (
                    f"it passes `{name}=`: the runtime's dispatcher runs after the module's other hooks"
                    " and only after a forward that returned"
                )
        known = {"hook", "with_kwargs"}
        if any(arg.keyword is not None and arg.keyword.value not in known for arg in call.args):
            return "it passes an argument the runtime does not take"
        if positional(call, 1) is not None:
            return "it passes more than the hook positionally"
        if positional(call, 0) is None and kwarg(call, "hook") is None:
            return "it passes no hook"
        return None

    def _name_taken(self, node: cst.CSTNode, function: str) -> bool:
        scope = self.context.scopes.get(node)
        if scope is None:
            return False
        for assignment in scope[function]:
            statement = getattr(assignment, "node", None)
            if not (
                isinstance(statement, cst.ImportFrom)
                and isinstance(statement.module, (cst.Attribute, cst.Name))
                and self.context.module.code_for_node(statement.module) == RUNTIME_MODULE
            ):
                return True
        return False


def _per_call(call: cst.Call, function: str) -> cst.Call:
    """`module.register_forward_hook(fn, ...)` -> `function(module, fn, ...)`, from the
    call as other fixes left it (an edit inside its arguments is kept)."""
    return call.with_changes(
        func=cst.Name(function),
        args=[cst.Arg(call.func.value, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), *call.args],
    )


def _first_param(function: cst.FunctionDef) -> str | None:
    params = function.params.params
    return params[0].name.value if params else None


def _unwrapped(updated: cst.Try) -> cst.FlattenSentinel:
    """`try: body finally: <removals>` -> body, the lines above the `try` above it."""
    first, *rest = updated.body.body
    lines = [*updated.leading_lines, *first.leading_lines]
    return cst.FlattenSentinel([first.with_changes(leading_lines=lines), *rest])

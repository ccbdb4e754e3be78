"""Where a hook registration runs, and whether it may run once instead. The one place
that asks how often `m.register_forward_hook(f)` runs and what moving it to `__init__`
would change; `hook_handles` says where its handle is removed.

`registrations(context)` (built once per file, FileContext.shared) answers, for a call
that registers a hook:

- `per_call(call)`: "function" when a per-call function runs it (a `forward`, a
  `@contextmanager` helper, a function that a loop or such a function calls), "loop" when
  only a loop around it repeats it, None when it runs once or only every few iterations
  (behind a periodic test, `periodic.sometimes`).
- `in_training_loop(call)`, `removed_in_same_call(call, removals)`.
- `once_in_init(call, removals)`: where `forward` registers the same hooks on every call
  and removes them in the `finally` of a `try` around the rest of its body, what moving the
  registration to the end of `__init__` takes (`OnceInInit`); else why it cannot move.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import BuiltinAssignment, GlobalScope, ImportAssignment

from codemod.analysis import match as m
from codemod.analysis.local_calls import local_calls
from codemod.analysis.names import names_read
from codemod.analysis.periodic import periodic
from codemod.analysis.torch_facts import CONTEXT_MANAGER_DECORATORS

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "registrations"


def registrations(context: FileContext) -> Registrations:
    return context.shared(KEY, Registrations)


@dataclasses.dataclass(frozen=True)
class OnceInInit:
    """A registration of `forward` that may run once, at the end of `__init__`."""

    call: cst.Call
    forward: cst.FunctionDef
    init: cst.FunctionDef
    statement: cst.BaseStatement  # the statement of forward's body that registers the hooks
    # what keeps the handle: `handles.append(<call>)`, `[<call> for m in ms]`, or the call itself (`h = <call>`)
    holder: cst.CSTNode
    container_line: cst.SimpleStatementLine | None  # `handles = []`
    removing: cst.Try  # the `try` whose `finally` removes the hooks


class Registrations:
    """How often the hook registrations of one file run; each look-up computed when asked."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.index = context.index

    # -- where it runs -----------------------------------------------------------------

    def _regions(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """Loops and per-call functions around `node`, innermost first, up to the
        enclosing function: a `forward`, a `@contextmanager`, or a function some call
        of which runs in a loop or in such a function (`collect(model, x)` called in
        the training loop). A lambda or a function that runs once ends the search."""
        calls = local_calls(self.context)
        for ancestor in self.index.ancestors(node):
            if isinstance(ancestor, (cst.For, cst.While)):
                yield ancestor
            elif isinstance(ancestor, cst.FunctionDef):
                if self._is_context_manager(ancestor) or calls.runs_per_call(ancestor):
                    yield ancestor
                return
            elif isinstance(ancestor, (cst.Lambda, cst.ClassDef)):
                return

    def per_call(self, node: cst.CSTNode) -> str | None:
        """`"function"` inside a per-call function, `"loop"` inside a loop, else None: also
        where every way to it passes a periodic test (`periodic.sometimes`: a capture entered
        under `if step % 10 == 9:`), which runs it every few steps, not on every call."""
        if periodic(self.context).sometimes(node) is not None:
            return None
        kinds = ["function" if isinstance(r, cst.FunctionDef) else "loop" for r in self._regions(node)]
        return "function" if "function" in kinds else (kinds[0] if kinds else None)

    def in_training_loop(self, node: cst.CSTNode) -> bool:
        """Is a loop around `node`, up to its function, a training loop?"""
        return any(
            isinstance(r, (cst.For, cst.While)) and self.context.loops.is_training_loop(r) for r in self._regions(node)
        )

    def removed_in_same_call(self, call: cst.Call, removals: list[cst.CSTNode]) -> bool:
        """Is there a loop or per-call function around the registration that also holds a removal?"""
        return any(any(self.index.inside(r, region) for r in removals) for region in self._regions(call))

    def _is_context_manager(self, function: cst.FunctionDef) -> bool:
        return any(self.context.names.is_(d.decorator, *CONTEXT_MANAGER_DECORATORS) for d in function.decorators)

    # -- registered once, in __init__ --------------------------------------------------

    def once_in_init(self, call: cst.Call, removals: list[cst.CSTNode]) -> OnceInInit | str:
        """What registering the hook of `call` once, at the end of `__init__`, takes, or why
        it may not move: `forward` must register the same hooks on every call (reading only
        `self`, attributes `__init__` sets, and the module's functions and imports), do
        nothing else before, and remove them in the `finally` of a `try` around the rest."""
        found = self._module_forward(call)
        if isinstance(found, str):
            return found
        forward, init, receiver = found
        statement = self.index.statement_in(call, forward.body)
        held = self._handle_holder(call, statement)
        removing = self._removing_try(forward, statement, removals)
        if removing is None:
            return "its handles are not removed by the `finally` of one `try` around the rest of `forward`"
        if held is None:
            return (
                "its handles are kept other than by `h = ...`, `handles.append(...)` or a list comprehension "
                "with one `for` and no `if`, the forms perfmod moves into `__init__`"
            )
        holder, container_line = held
        if not _only_registers_then_runs(forward, statement, removing, container_line):
            # other code before the hooks are registered, or after they are removed, runs without them
            return "`forward` runs other code before registering it or after removing it"
        why = self._differs_between_calls(statement, forward, init, receiver, call, holder)
        if why is not None:
            return why
        return OnceInInit(call, forward, init, statement, holder, container_line, removing)

    def _module_forward(self, call: cst.Call) -> tuple[cst.FunctionDef, cst.FunctionDef, str] | str:
        """(`forward`, `__init__`, their receiver) of the module class whose `forward`
        registers `call`, or why the registration is somewhere else."""
        kinds = self.context.kinds
        forward = self.index.first_enclosing(call, cst.FunctionDef)
        if forward is not None and self._is_context_manager(forward):
            given = [
                p for p in self.context.bindings.parameters_reached(call, forward) if p != _receiver(forward, kinds)
            ]
            if given:
                return (
                    f"it is registered in the `@contextmanager` helper `{forward.name.value}`, and what it registers "
                    f"comes from each call (`{'`, `'.join(given)}`, given by the caller)"
                )
        owner = kinds.class_of(forward) if forward is not None else None
        if forward is None or forward.name.value != "forward" or owner is None:
            return "it is registered in a loop, a context manager or a helper, not in a module's `forward`"
        init = kinds.method(owner, "__init__")
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
        if not all(self.index.inside(r, final) for r in removals) or any(
            c not in removals for c in self.index.find(cst.Call, within=final)
        ):
            return None
        return tries[0]

    def _handle_holder(
        self, call: cst.Call, statement: cst.CSTNode
    ) -> tuple[cst.CSTNode, cst.SimpleStatementLine | None] | None:
        """(the expression that keeps the handle, the `handles = []` line of its list):
        `handles.append(<call>)` (a statement) with `handles = []` alone in the same
        block, `handles = [<call> for m in ms]` (one `for`, no `if`) or `h = <call>` as the
        statement itself; None for any other shape."""
        parents, bindings = self.context.parents, self.context.bindings
        comprehension = parents.get(call)
        if (
            isinstance(comprehension, cst.ListComp)
            and comprehension.elt is call
            and comprehension.for_in.inner_for_in is None
            and not comprehension.for_in.ifs
            and comprehension.for_in.asynchronous is None
        ):
            assign = parents.get(comprehension)
            single = isinstance(assign, cst.Assign) and len(assign.targets) == 1
            return (comprehension, None) if single and parents.get(assign) is statement else None
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
            line = self.index.statement_of(found[0].node)
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
        hooks = self.index.find((cst.FunctionDef, cst.Lambda), within=statement)
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
        return any(self.index.inside(node, hook.body) for hook in hooks)

    def _leaves_forward(self, statement: cst.CSTNode, hooks: list[cst.CSTNode]) -> str | None:
        """Does the statement return, yield, raise or change names outside itself?"""
        exits = (cst.Return, cst.Yield, cst.Await, cst.Raise, cst.Global, cst.Nonlocal, cst.AugAssign, cst.AnnAssign)
        if any(not self._runs_in_hook(n, hooks) for n in self.index.find(exits, within=statement)):
            return "moving it to `__init__` would change what `forward` does"
        return None

    def _reads_call_values(
        self, statement: cst.CSTNode, forward: cst.FunctionDef, receiver: str, call: cst.Call, holder: cst.CSTNode
    ) -> str | None:
        """A name the statement reads whose binding may differ between calls of `forward`
        (not in `handles.append(...)` around the call, which goes)."""
        index, scopes = self.index, self.context.scopes
        for name in names_read(statement):
            if holder is not call and index.inside(name, holder) and not index.inside(name, call):
                continue
            scope = scopes.get(name)
            # the bindings this read may see (a later `for blk in ...` of forward is not one)
            bindings = (self.context.kinds.reaching(name) or scope[name.value]) if scope is not None else [None]
            if not all(self._same_binding(binding, statement, forward, receiver) for binding in bindings):
                return f"it depends on `{name.value}`, a value of the call"
        return None

    def _same_binding(self, binding, statement: cst.CSTNode, forward: cst.FunctionDef, receiver: str) -> bool:
        """Is `binding` the same on every call of `forward`: made by `statement` itself,
        `forward`'s receiver, a builtin, an import, or a module-level def or class?"""
        if isinstance(binding, (BuiltinAssignment, ImportAssignment)):
            return True
        node = getattr(binding, "node", None)
        if node is None:
            return False
        if self.index.inside(node, statement):
            return True
        if isinstance(node, cst.Param) and node.name.value == receiver:
            return binding.scope is self.context.scopes.get(forward.body)
        return isinstance(binding.scope, GlobalScope) and isinstance(node, (cst.FunctionDef, cst.ClassDef))

    def _reads_attributes_set_later(
        self, statement: cst.CSTNode, init: cst.FunctionDef, receiver: str, hooks: list[cst.CSTNode]
    ) -> str | None:
        """`self.<attr>`, read outside the hooks, that code other than `__init__` assigns."""
        for attribute in self.index.find(cst.Attribute, within=statement):
            if self._runs_in_hook(attribute, hooks) or not m.matches(attribute.value, m.Name(receiver)):
                continue
            values = self.context.kinds.attribute_values(attribute)
            if values is not None and not all(self.index.inside(v, init) for v in values):
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
        index = self.index
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
        for assign in self.index.find(cst.Assign, within=statement):
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
        index = self.index
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


def _first_param(function: cst.FunctionDef) -> str | None:
    params = function.params.params
    return params[0].name.value if params else None


def _receiver(function: cst.FunctionDef, kinds) -> str | None:
    """The name a method's first parameter gives its instance; None for a plain function."""
    return _first_param(function) if kinds.class_of(function) is not None else None

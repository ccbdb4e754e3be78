"""Where the handle of a hook registration is removed. The one place that follows a
`RemovableHandle` from the call that returns it to the calls that remove it.

`hook_handles(context)` (built once per file, FileContext.shared) answers:

- `removals(call)`: for a registration `m.register_forward_hook(f)`, the nodes that remove
  the handle it returns (`h.remove()` calls, the `with` statements that hold it), [] when
  nothing removes it (the handle is dropped, or only kept in a container that is never
  emptied), or None when the handle goes somewhere this module does not follow (stored on
  `self`, returned, passed to another function, read other than by `.remove()`).

The handle may go to a name, into a list or a dict built in the function (`[...]`, `{}`,
`list()`, `dict()`, a comprehension, `.append`, `+=`, `d[k] = ...`), into a `with`, or into
a `contextlib.ExitStack` used for nothing else; it counts as removed by `h.remove()`,
`with h:`, the `with` of the stack, a loop over the container that removes each (`for h in
hs:`, `for h in hs.values():`, `for k, h in hs.items():`, `[h.remove() for h in hs]`),
`hs.pop().remove()` (in `while hs:` too) or `hs[k].remove()`. It may be compared with None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis import match as m

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "hook_handles"


def hook_handles(context: FileContext) -> HookHandles:
    return context.shared(KEY, HookHandles)


class HookHandles:
    """Where the hook handles of one file are removed; each look-up computed when asked."""

    def __init__(self, context: FileContext) -> None:
        self.context = context
        self._following: set[tuple] = set()  # the variables (`Bindings.variable`) being followed
        self._found: dict[cst.Call, list[cst.CSTNode] | None] = {}

    def removals(self, call: cst.Call) -> list[cst.CSTNode] | None:
        """The nodes that remove the handle `call` returns ([] when none does), or None
        when the handle is used in a way this module does not follow."""
        if call not in self._found:
            self._found[call] = self._removals(call)
        return self._found[call]

    def _removals(self, call: cst.Call) -> list[cst.CSTNode] | None:
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
        key = self.context.bindings.variable(name)
        if key in self._following:
            return []  # followed already, further up: its reads are being checked there
        reads = self.context.bindings.reads(name)
        if reads is None:
            return None
        self._following.add(key)
        try:
            return self._handle_reads(reads)
        finally:
            self._following.discard(key)

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
        reads = self.context.bindings.reads(name)
        if reads is None:
            return None
        for read in reads:
            if not m.matches(self.context.parents.get(read), m.Attribute(attr=m.Name("enter_context"))):
                return None
        removals = []
        for assignment in self.context.bindings.name_bindings(name):
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
        bindings = self.context.bindings.name_bindings(name)
        if bindings is None:
            return None
        key = self.context.bindings.variable(name)
        if key in self._following:
            return []
        for assignment in bindings:
            value = self.context.bindings.assigned_value(assignment)  # `hs = []`, `hs: list[H] = []`
            statement = self.context.bindings.statement(assignment.node)
            if not self._new_container(value) and self._list_target(statement) is None:
                return None  # (`hs += [...]` is checked by _list_target)
        reads = self.context.bindings.reads(name)
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

    def _new_container(self, value: cst.BaseExpression | None) -> bool:
        """`[...]`, a list comprehension, `{}`, `dict()` or `list()`."""
        if isinstance(value, (cst.List, cst.ListComp)):
            return True
        if isinstance(value, cst.Dict):
            return not value.elements
        return (
            isinstance(value, cst.Call)
            and not value.args
            and self.context.names.is_(value.func, "dict", "builtins.dict", "list", "builtins.list")
        )

    def _container_read(self, read: cst.Name) -> list[cst.CSTNode] | None:
        """What one read of a handle container does: the removals it makes ([] for a read
        that adds, clears or measures), or None for a use this module does not follow."""
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
        if self.context.bindings.variable(target) in self._following:
            return []  # `h = register(...); hs.append(h)` ... `for h in hs:`: the same name, checked already
        if isinstance(parent, cst.CompFor):
            found = (
                self._handle_removals(target) if isinstance(self.context.parents.get(parent), cst.ListComp) else None
            )
        else:
            found = self._handle_removals(target)
        return found or None

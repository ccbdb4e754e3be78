"""What the calls a loop makes may write: the file's own functions and methods that a
loop calls can re-bind a module's name (`global SEQ_LEN`), change a module's list in
place (`CLASS_WEIGHTS[c] = w`), change an argument in place (`update(weights)` doing
`weights[c] = w`) or assign an attribute of their receiver or of an argument
(`self.on_step_end()` doing `self.seq_len += 4`). A value that reads one of them is not
the same on every iteration, although nothing in the loop's own text writes it.

`call_writes(context)` (built once per file, FileContext.shared) answers:

- `name_written(name, region)`: why the calls of the loop `region` may change what the
  Name `name` holds (a module name they re-bind or change in place, or an object handed
  to a parameter they change or assign attributes of; for the receiver of `name.attr`,
  only what changes it in place, the attribute being `attribute_written`'s), or None;
- `attribute_written(attribute, region)`: the same for `receiver.attr`, where a call of
  `region` may assign `attr` of `receiver` (or change `receiver` in place).
- `changes(call)`: what one call of a function of the file changes that its caller sees
  (`tok.vocab` for `tok.encode(text)` whose method grows `self.vocab`), or None.

Only the file's own functions and methods are followed (`kinds.local_callee`, and the
`forward` a call of a model of the file's own class runs), through the calls they make in
turn, MAX_DEPTH deep; a call of something else is taken to write none of these (what a
library call may change of the arguments it is handed is `variance`'s question).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import GlobalScope

from codemod.analysis.bindings import argument_for
from codemod.analysis.torch_facts import MUTATING_METHODS
from codemod.analysis.values import Kind

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "call_writes"
MAX_DEPTH = 4


@dataclass
class Writes:
    """What calling one function may write, by the names its caller sees."""

    module_names: dict[str, str] = field(default_factory=dict)  # re-bound or changed in place -> how
    params: dict[str, str] = field(default_factory=dict)  # parameter changed in place -> how
    attributes: dict[tuple[str, str], str] = field(default_factory=dict)  # (parameter, attr) assigned -> how


def call_writes(context: FileContext) -> CallWrites:
    return context.shared(KEY, CallWrites)


class CallWrites:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self._functions: dict[cst.FunctionDef, Writes | None] = {}
        self._regions: dict[int, list[tuple[cst.Call, cst.FunctionDef, Writes]]] = {}

    # -- questions ------------------------------------------------------------------------

    def name_written(self, name: cst.Name, region: cst.CSTNode) -> str | None:
        module_level = self._is_module_name(name)
        parent = self.context.parents.get(name)
        whole = not (isinstance(parent, cst.Attribute) and parent.value is name)  # `name.attr`: asked of the attribute
        for call, function, writes in self._calls(region):
            if module_level and name.value in writes.module_names:
                return self._why(call, f"{writes.module_names[name.value]} `{name.value}`")
            attributes = ((p, h) for (p, _), h in writes.attributes.items()) if whole else ()
            for param, how in (*writes.params.items(), *attributes):
                argument = self._argument(call, function, param)
                if isinstance(argument, cst.Name) and argument.value == name.value:
                    return self._why(call, f"{how} `{name.value}`")
        return None

    def attribute_written(self, attribute: cst.Attribute, region: cst.CSTNode) -> str | None:
        receiver = self.context.source(attribute.value)
        for call, function, writes in self._calls(region):
            for (param, attr), how in writes.attributes.items():
                argument = self._argument(call, function, param)
                if attr == attribute.attr.value and argument is not None and self.context.source(argument) == receiver:
                    return self._why(call, f"{how} `{receiver}.{attr}`")
            for param, how in writes.params.items():
                argument = self._argument(call, function, param)
                if argument is not None and self.context.source(argument) == receiver:
                    return self._why(call, f"{how} `{receiver}`")
        return None

    def changes(self, call: cst.Call) -> str | None:
        """What a call of a function of this file changes that its caller sees, spelled as
        the caller sees it (`tok.vocab` for `tok.encode(text)` whose method grows
        `self.vocab`), or None: it changes none of these, or it is not followed."""
        function = self._callee(call)
        writes = self._writes(function, 0) if function is not None else None
        if writes is None:
            return None
        for (param, attr), _ in writes.attributes.items():
            argument = self._argument(call, function, param)
            if argument is not None:
                return f"`{self.context.source(argument)}.{attr}`"
        for param in writes.params:
            argument = self._argument(call, function, param)
            if argument is not None:
                return f"`{self.context.source(argument)}`"
        return next((f"`{name}`" for name in writes.module_names), None)

    def _why(self, call: cst.Call, what: str) -> str:
        return f"`{self.context.source(call.func)}(...)` (line {self.context.line(call)}), called in the loop, {what}"

    # -- the calls of a region and what they write ----------------------------------------

    def _calls(self, region: cst.CSTNode) -> list[tuple[cst.Call, cst.FunctionDef, Writes]]:
        found = self._regions.get(id(region))
        if found is None:
            found = []
            for call in self.context.index.find(cst.Call, within=region):
                function = self._callee(call)
                writes = self._writes(function, 0) if function is not None else None
                if writes is not None and (writes.module_names or writes.params or writes.attributes):
                    found.append((call, function, writes))
            self._regions[id(region)] = found
        return found

    def _callee(self, call: cst.Call) -> cst.FunctionDef | None:
        """The function of this file `call` runs: `kinds.local_callee`, or the `forward` of
        a model whose class the file defines (`model(x, mem)`)."""
        kinds = self.context.kinds
        function = kinds.local_callee(call)
        if function is None and kinds.fact(call.func).kind is Kind.MODULE:
            classdef = kinds.instance_class(call.func)
            function = kinds.method(classdef, "forward") if classdef is not None else None
        return function

    def _argument(self, call: cst.Call, function: cst.FunctionDef, param: str) -> cst.BaseExpression | None:
        """What `call` hands to the parameter `param` of `function` (a method's first
        parameter is the receiver of `obj.method(...)`, or the instance called, `model(...)`)."""
        positional = [*function.params.posonly_params, *function.params.params]
        bound = self._bound(call, function)
        if bound and positional and positional[0].name.value == param:
            return call.func.value if isinstance(call.func, cst.Attribute) else call.func
        found = next((p for p in (*positional, *function.params.kwonly_params) if p.name.value == param), None)
        return argument_for(call, function, found, 1 if bound else 0) if found is not None else None

    def _bound(self, call: cst.Call, function: cst.FunctionDef) -> bool:
        """Is `call` a method call that binds its receiver (or the instance called) to the first parameter?"""
        if self.context.kinds.class_of(function) is None:
            return False
        return not any(
            isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in function.decorators
        )

    def _writes(self, function: cst.FunctionDef, depth: int) -> Writes | None:
        if function in self._functions:
            return self._functions[function]
        if depth > MAX_DEPTH:
            return None
        self._functions[function] = None  # a cycle reads as writing nothing more
        writes = Writes()
        params = {p.name.value for p in (*function.params.posonly_params, *function.params.params)}
        declared = {
            n.name.value
            for g in self.context.index.find(cst.Global, within=function.body)
            for n in g.names
            if isinstance(n.name, cst.Name)
        }
        for target in self.context.index.find(cst.AssignTarget, within=function.body):
            for name in self.context.index.find(cst.Name, within=target.target):
                if name.value in declared and name is target.target:
                    writes.module_names[name.value] = "re-binds"
        for aug in self.context.index.find(cst.AugAssign, within=function.body):
            if isinstance(aug.target, cst.Name) and aug.target.value in declared:
                writes.module_names[aug.target.value] = "re-binds"
        for name in self.context.index.find(cst.Name, within=function.body):
            written = self._changed(name)
            if written is None:
                continue
            root, attr = written
            if root in params and attr is not None:
                writes.attributes[(root, attr)] = "assigns"
            elif root in params:
                writes.params[root] = "changes in place"
            elif self._is_module_name(name):
                writes.module_names[root] = "changes in place"
        for call in self.context.index.find(cst.Call, within=function.body):
            callee = self._callee(call)
            inner = self._writes(callee, depth + 1) if callee is not None and callee is not function else None
            if inner is None:
                continue
            writes.module_names.update(inner.module_names)
            for param, how in inner.params.items():
                argument = self._argument(call, callee, param)
                if isinstance(argument, cst.Name) and argument.value in params:
                    writes.params[argument.value] = how
            for (param, attr), how in inner.attributes.items():
                argument = self._argument(call, callee, param)
                if isinstance(argument, cst.Name) and argument.value in params:
                    writes.attributes[(argument.value, attr)] = how
        self._functions[function] = writes
        return writes

    def _changed(self, name: cst.Name) -> tuple[str, str | None] | None:
        """(name, None) when the object `name` holds is changed in place here (`x[0] = y`,
        `x.append(y)`, `x += y`), (name, attr) when `name.attr` is assigned or changed in
        place (`self.n = 1`, `self.w[0] = 1`); None otherwise."""
        parents = self.context.parents
        node, parent, attr = name, parents.get(name), None
        while True:
            if isinstance(parent, cst.Attribute) and parent.value is node:
                call = parents.get(parent)
                method = parent.attr.value
                if isinstance(call, cst.Call) and call.func is parent:
                    if node is not name and (method in MUTATING_METHODS or _in_place(method)):
                        return name.value, attr
                    if node is name and (method in MUTATING_METHODS or _in_place(method)):
                        return name.value, None
                    return None
                if attr is None and node is name:
                    attr = method
                node, parent = parent, parents.get(parent)
            elif isinstance(parent, cst.Subscript) and parent.value is node:
                if node is name:
                    attr = None
                node, parent = parent, parents.get(parent)
            else:
                break
        if node is name:
            if isinstance(parent, cst.AugAssign) and parent.target is node:
                return name.value, None
            return None
        if isinstance(parent, (cst.AssignTarget, cst.Del)) or (
            isinstance(parent, cst.AugAssign) and parent.target is node
        ):
            return name.value, attr
        return None

    def _is_module_name(self, name: cst.Name) -> bool:
        """Does `name` read (or write) a name of the module's own scope?"""
        scope = self.context.scopes.get(name)
        if scope is None:
            return False
        if isinstance(scope, GlobalScope):
            return True
        try:
            assignments = scope[name.value]
        except KeyError:
            return False
        return any(isinstance(getattr(a, "scope", None), GlobalScope) for a in assignments)


def _in_place(method: str) -> bool:
    return method.endswith("_") and not method.startswith("_")

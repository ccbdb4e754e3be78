"""Code that TorchScript compiles, or that `torch.jit.trace` records: where no rule
writes a call into `runtime`.

TorchScript compiles the source of a function with its own compiler, which reads
a subset of Python: `runtime`'s helpers use what it rejects (`try`, keyword-only
arguments, Python objects), so a call into them inside compiled code fails when
the code is scripted (at import, for a decorated function). A traced function
runs once in Python and keeps the tensor operations it saw: a `runtime` call
there is frozen to the shapes and branches of that one run. Both are left alone.

`compiled(node)` says why the code around `node` is compiled, or None. This file
shows it by:

- a decorator: `@torch.jit.script`, `@torch.jit.script_method`,
  `@torch.jit.export`, `@torch.jit.interface` (on the function or its class);
- a call: a function or class of this file passed to `torch.jit.script(...)`,
  `torch.jit.trace(...)`, `torch.jit.trace_module(...)`, by name, or an
  instance of a class of this file (`torch.jit.script(model)` where `model =
  Net(...)`, or `torch.jit.script(Net(...))`): then every method of the class;
- a base class: `torch.jit.ScriptModule`;
- a call from compiled code to a function of this file (TorchScript compiles
  what a scripted function calls, recursively).

Methods marked `@torch.jit.ignore` or `@torch.jit.unused` run in Python and are
not compiled. Code nested in a compiled function is compiled with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis.local_calls import local_calls
from codemod.analysis.names import sole_definition

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "torchscript"
DECORATORS = ("torch.jit.script", "torch.jit.script_method", "torch.jit.export", "torch.jit.interface")
NOT_COMPILED = ("torch.jit.ignore", "torch.jit.unused")
COMPILERS = ("torch.jit.script", "torch.jit.trace", "torch.jit.trace_module")
SCRIPT_MODULE = ("torch.jit.ScriptModule",)
MAX_DEPTH = 8


def torchscript(context: FileContext) -> TorchScript:
    return context.shared(KEY, TorchScript)


class TorchScript:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self.index = context.index
        self.names = context.names
        self._why: dict[cst.CSTNode, str] = {}  # compiled function or class -> why
        self._find()

    def compiled(self, node: cst.CSTNode) -> str | None:
        """Why the code around `node` (a node itself a function or class included) is
        compiled by TorchScript or recorded by `torch.jit.trace`; None when this file
        shows neither."""
        for scope in (node, *self.index.enclosing(node, (cst.FunctionDef, cst.ClassDef))):
            if isinstance(scope, cst.FunctionDef) and self._decorated(scope, NOT_COMPILED):
                return None
            why = self._why.get(scope)
            if why is not None:
                return why
        return None

    # -- what this file compiles -----------------------------------------------------------

    def _find(self) -> None:
        if "jit" not in self.context.code:
            return
        for function in self.index.find(cst.FunctionDef):
            if self._decorated(function, DECORATORS):
                self._mark(function, f"`{function.name.value}` is compiled by TorchScript (its decorator)")
        for cls in self.index.find(cst.ClassDef):
            if self._decorated(cls, DECORATORS):
                self._mark(cls, f"class `{cls.name.value}` is compiled by TorchScript (its decorator)")
            elif any(self.names.is_(base.value, *SCRIPT_MODULE) for base in cls.bases):
                self._mark(cls, f"`{cls.name.value}` is a torch.jit.ScriptModule")
        for call in self.index.find(cst.Call):
            func = call.func
            last = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
            if last not in ("script", "trace", "trace_module") or not self.names.is_(func, *COMPILERS):
                continue
            if not call.args or call.args[0].keyword is not None:
                continue
            compiler = self.names.of(func)
            how = "traced" if any(name.startswith("torch.jit.trace") for name in compiler) else "scripted"
            line = self.context.line(call)
            for target in self._targets(call.args[0].value):
                self._mark(target, f"`{target.name.value}` is {how} by torch.jit (line {line})")
        for compiled in list(self._why):
            if isinstance(compiled, cst.FunctionDef):
                self._callees(compiled, self._why[compiled], 0)
            else:
                for function in self.index.find(cst.FunctionDef, within=compiled):
                    self._callees(function, self._why[compiled], 0)

    def _targets(self, value: cst.BaseExpression) -> list[cst.CSTNode]:
        """The function or class of this file that `torch.jit.script(value)` compiles."""
        scopes = self.context.scopes
        if isinstance(value, cst.Call):  # torch.jit.script(Net(...))
            cls = sole_definition(scopes, value.func, cst.ClassDef)
            return [cls] if cls is not None else []
        if not isinstance(value, cst.Name):
            return []
        found = sole_definition(scopes, value, cst.FunctionDef) or sole_definition(scopes, value, cst.ClassDef)
        if found is None:
            found = self.context.kinds.instance_class(value)
        return [found] if found is not None else []

    def _mark(self, node: cst.CSTNode, why: str) -> None:
        self._why.setdefault(node, why)

    def _callees(self, function: cst.FunctionDef, why: str, depth: int) -> None:
        """TorchScript compiles what compiled code calls: the functions of this file too."""
        if depth > MAX_DEPTH:
            return
        calls = local_calls(self.context)
        for call in self.index.find(cst.Call, within=function):
            callee = calls.callee(call)
            if callee is None or callee in self._why or self._decorated(callee, NOT_COMPILED):
                continue
            self._why[callee] = f"`{callee.name.value}` is called from compiled code ({why})"
            self._callees(callee, why, depth + 1)

    def _decorated(self, node: cst.FunctionDef | cst.ClassDef, names: tuple[str, ...]) -> bool:
        for decorator in node.decorators:
            expr = decorator.decorator
            if isinstance(expr, cst.Call):
                expr = expr.func
            if self.names.is_(expr, *names):
                return True
        return False

"""Where a value read from the device to the host goes, and whether the read can wait
until the value is used.

`.item()`, `.tolist()`, `.cpu()`, `float(t)` and `int(t)` of a device tensor make the
host wait for every kernel queued before them. In a training step loop, a value read
every step is often used only every few steps, or only after the loop:

    v = loss.item()                         # used only under `if step % N == 0:` (MOVED)
    losses.append(loss.item())              # a list read after the loop (LISTED)
    history["loss"].append(loss.item())     # the same, in a dict of lists
    running += loss.item()                  # a running sum read at log time (SUMMED)
    n = mask.sum().item(); total += n       # a count only added to sums (CARRIED)
    running += self._step(batch)            # a function that returns a read (RETURNED)
    if loss.item() < best: ...              # a decision every step: the read stays

`host_reads(context).loop(loop, kept)` answers for one step loop (`kept(statement)`:
does the user keep the reads of that statement where they are, with a suppression
comment? The running sums they add to stay too):

- `reads()`: the reads that run every step (not under a periodic `if`, the outermost
  call of a chain such as `x.cpu().item()`); `read_kind(call)`: "item", "tolist",
  "cpu", "float" or "int" when `call` reads a device value to the host;
- `dtype(expr)`: FLOAT, INT64 or BOOL for a tensor of that dtype (what `.item()` of it
  gives), None when unknown; `is_tensor(expr)`;
- `defer(read)`: the `Deferral`s that make the read wait until its value is used (one
  for each read of a group of running sums that change together), or `Kept` raised
  with the true reason it must stay (it decides control flow, it is stored or printed
  every step, it is used after the loop, ...);
- `returning_calls()` and `defer_returned(call)`: calls of a function of the file
  whose every `return` is a read, added to a running sum; `returned_kept(call)`: why
  such a sum stays (`Kept`'s reason), or None;
- `log_branch(node, within)`: the periodic `if` that holds `node` (analysis/periodic.py).

`host_reads(context).in_functions(loop)`: the reads in functions of the file that the
loop runs on every step, each with the call in the loop that runs it.

A Deferral says what changes as data (expressions to rewrite, statements to move, the
statement after which a list becomes numbers); the rule turns it into edits.

Built once per file (FileContext.shared); each loop's answers once per call of `loop`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import Assignment, ComprehensionScope

from codemod.analysis import match as m
from codemod.analysis.names import integer_value, method_name, names_read, number_value, subscript_parts
from codemod.analysis.periodic import periodic
from codemod.analysis.project import project_of
from codemod.analysis.scopes import reads_of
from codemod.analysis.sizes import sizes_of
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.torch_facts import (
    HOST_READ_BUILTINS,
    NON_MUTATING_CALLS,
    PURE_BUILTINS,
    PURE_TENSOR_METHODS,
    PURE_TORCH_FUNCTIONS,
    SCALER_METHODS_RETURNING_NEW,
    SHARING_METHODS,
    SYNC_METHODS,
)
from codemod.analysis.values import FLOAT, INT64, Kind, Place, values

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "host_reads"


def host_reads(context: FileContext) -> HostReads:
    return context.shared(KEY, HostReads)


STRINGS = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)
FLOAT_PRESENTATION = tuple("eEfFgG%")
# float64 is not available on these devices, so the float64 device accumulator is not either.
NO_FLOAT64_DEVICE = re.compile(r"\bmps\b|\bxla\b|torch_xla")

# How a read waits (Deferral.way).
MOVED = "moved"  # `v = x.item()` moves into the log branches that read `v`
LISTED = "listed"  # a list keeps the tensor and becomes numbers after the loop
SUMMED = "summed"  # a running sum stays on the device
CARRIED = "carried"  # a name only added to running sums keeps the tensor
RETURNED = "returned"  # a function returns the tensor to a running sum
# What an expression becomes (Deferral.changes).
AS_TENSOR = "tensor"  # the tensor the read reads, detached, in float64: `loss.detach().double()`
AS_COUNT = "count"  # the tensor the read reads, as it is: an int64 count
AS_DOUBLE = "double"  # an int64 count added to a float64 sum: converted first, as Python does
AS_DETACHED = "detached"  # the tensor the read reads, detached: what a list keeps
AS_FLOAT, AS_INT = "float", "int"  # a read of a sum kept on the device gives the Python number back


@dataclass
class Deferral:
    """How one read waits until its value is used, as data for the rule's edits."""

    way: str  # MOVED, LISTED, SUMMED, CARRIED or RETURNED
    read: cst.Call  # the read this is about
    changes: list[tuple[cst.CSTNode, str]] = field(default_factory=list)  # (expression, AS_...)
    moves: list[tuple[cst.If, cst.SimpleStatementLine]] = field(default_factory=list)  # (log branch, statement)
    holder: str = ""  # what holds the value: `v`, `losses`, `total`, `stats['reg']`
    int_sum: bool = False  # kept as an int64 tensor, not in float64
    places: tuple[str, ...] = ()  # where a sum is read: "at log time", "outside the loop"
    sums: tuple[str, ...] = ()  # CARRIED: the sums the name is added to
    after: cst.CSTNode | None = None  # LISTED: the statement after which the list becomes numbers
    scalar: bool = True  # LISTED: the tensors kept have no dims
    call: cst.Call | None = None  # RETURNED: the call in the loop
    function: cst.FunctionDef | None = None  # RETURNED: the function that now returns a tensor
    exported: bool = False  # RETURNED: code in other files may call it


# What an accumulation adds to: a variable, the items of a dict, or (for a group of
# sums) a name that carries a synced value into them.
VAR, ITEMS, CARRIER = "variable", "items", "carrier"
SYNC_OPERAND, CARRIED_OPERAND = "sync", "carried"


@dataclass
class _Sum:
    """A running sum of synced values: a variable, or an item of a dict with a constant key."""

    label: str  # how messages name it: `total`, `stats['reg']`
    var: str  # the variable that holds it
    scope: object
    literals: list  # (node, number literal) it starts from or is reset to
    accumulations: list  # the statements in the step loop that add to it
    reads: list  # the expressions whose value is the sum (each gets `float(...)`)
    allow_self: bool = True  # `x = 0.9 * x + ...` (variables only)
    key: tuple | None = None  # the key of a dict item


@dataclass
class _Carrier:
    """A name bound in the step to a sync and read only where running sums add it
    (`n = mask.sum().item()`, then `tokens += n`): it can keep the tensor instead."""

    target: cst.Name
    sync: cst.Call
    line: cst.SimpleStatementLine
    uses: list


# Calls that only write a value out (a log line, a progress bar's text): a read made for
# them can wait for log time.
LOG_METHODS = frozenset({"log", "info", "debug", "set_postfix", "set_description", "write", "print0"})
LOG_FUNCTIONS = frozenset({"print", "wandb.log"})


class Kept(Exception):
    """Why a read stays where it is: the true reason, for the finding."""


def _keeps_nothing(statement: cst.CSTNode | None) -> bool:
    return False


class HostReads:
    """The file-wide look-ups; `loop` gives one step loop's reads."""

    def __init__(self, context: FileContext) -> None:
        self.file = _FileAnalysis(context)

    def loop(self, loop: cst.CSTNode, kept: Callable[[cst.CSTNode | None], bool] = _keeps_nothing) -> StepReads:
        """The reads of `loop`. `kept(statement)`: does the user keep the reads of this
        statement where they are (a suppression comment)? The sums they add to stay too."""
        return StepReads(self.file, loop, self.file.context.loops.own_calls(loop.body), kept)

    def needed_where_read(self, read: cst.Call) -> str | None:
        """Why a read in a function the step calls cannot wait for log time, from how that
        function uses it: its value decides the function's control flow, or is handed to
        a call that is not logging (`env.step(action.item())`: host code that runs on it
        now). None when neither shows."""
        analysis = self.file
        parent = analysis.parents.get(read)
        line = analysis.line(read)
        for ancestor in analysis.ancestors(read):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                return None
            if isinstance(ancestor, (cst.If, cst.While)) and analysis.inside(read, ancestor.test):
                return f"its value decides control flow there (line {line})"
            if (
                isinstance(parent, cst.Arg)
                and ancestor is analysis.parents.get(parent)
                and isinstance(ancestor, cst.Call)
            ):
                callee = analysis.code(ancestor.func)
                if method_name(ancestor) in LOG_METHODS or callee in LOG_FUNCTIONS:
                    return None
                return f"its value is handed to `{callee}` (line {line}), host code that needs it on every call"
        return None

    def in_functions(
        self, loop: cst.CSTNode, kept: Callable[[cst.CSTNode | None], bool] = _keeps_nothing
    ) -> list[tuple[cst.Call, cst.Call]]:
        """(read, call) for each read in a function of the file (or project) that `loop`
        runs on every step (an evaluation helper, a step method), with the first call on
        the way from the loop; a function called only under a periodic `if`, or a read
        under one in its function, runs at log time and is left out, and so is the inner
        call of `x.cpu().item()`."""
        steps = self.file.context.loops
        scan = StepReads(self.file, loop, [], kept)
        found = []
        for function in steps.functions_reached(loop.body):
            for read in steps.own_calls(function.body):
                if scan.read_kind(read) is None or id(read) in scan.suppressed_in(read):
                    continue
                if any(isinstance(o, cst.Call) and scan.read_kind(o) is not None for o in scan.chain_above(read)):
                    continue  # the outer call of `x.cpu().item()` is the one reported
                if scan.log_branch(read, function) is not None:
                    continue  # the function reads it only at log time (`if step % every == 0:` in it)
                sites = [site for site in steps.runs_in(read) if site.loop is loop and scan.every_step(site)]
                if sites:
                    found.append((read, sites[0].calls[0]))
        return found


class _FileAnalysis:
    """Look-ups over one file's metadata that PM404 needs in every loop."""

    def __init__(self, context) -> None:
        self.context = context
        self.names = context.names
        self.kinds = context.kinds
        self.parents = context.parents
        self.index = context.index
        self.scopes = context.kinds.scopes
        self.no_float64 = bool(NO_FLOAT64_DEVICE.search(context.code))

    def code(self, node: cst.CSTNode) -> str:
        return self.context.loops.code(node).strip()

    def line(self, node: cst.CSTNode) -> int:
        return self.context.line(node)

    def start(self, node: cst.CSTNode) -> int:
        """The node's place in document order."""
        return self.index.order(node)

    def end(self, node: cst.CSTNode) -> int:
        """The place of the last node inside `node` in document order."""
        return self.index.end(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        return self.index.ancestors(node)

    def inside(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        return self.index.inside(node, ancestor)

    def is_written(self, node: cst.CSTNode) -> bool:
        """Is `node` (a name, attribute or subscript) assigned, augmented or deleted
        rather than read?"""
        current = node
        while True:
            parent = self.parents.get(current)
            if isinstance(parent, (cst.Element, cst.StarredElement, cst.Tuple, cst.List)):
                current = parent
                continue
            if isinstance(parent, (cst.AssignTarget, cst.Del)):
                return True
            if isinstance(parent, (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr)):
                return parent.target is current
            if isinstance(parent, cst.AsName):
                return parent.name is current
            return False

    def statement_line(self, node: cst.CSTNode) -> cst.SimpleStatementLine | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.SimpleStatementLine):
                return ancestor
            if isinstance(ancestor, cst.BaseCompoundStatement):
                return None
        return None

    # -- bindings --------------------------------------------------------------------

    def bindings(self, name: cst.Name) -> list[Assignment] | None:
        return self.context.bindings.assignments(name)

    def is_import_or_builtin(self, name: cst.Name) -> bool:
        scope = self.scopes.get(name)
        found = list(scope[name.value]) if scope is not None else []
        return bool(found) and all(type(a) is not Assignment for a in found)

    def binding_statement(self, target: cst.CSTNode) -> cst.CSTNode:
        return self.context.bindings.statement(target)

    def assigned_value(self, target: cst.CSTNode) -> cst.BaseExpression | None:
        """`value` of a plain `name = value` / `name: T = value` binding of `target`, or
        its element in `a, b = 0.0, 0` (a tuple of values unpacked one for one)."""
        statement = self.binding_statement(target)
        if isinstance(statement, cst.Assign):
            if len(statement.targets) != 1:
                # `a = b = 0`: every name gets the same number (an immutable value; a
                # chained assignment of anything else makes aliases)
                chained = any(t.target is target for t in statement.targets)
                return statement.value if chained and isinstance(statement.value, (cst.Integer, cst.Float)) else None
            if statement.targets[0].target is target:
                return statement.value
            element = self.parents.get(target)
            names, values = statement.targets[0].target, statement.value
            if (
                isinstance(element, cst.Element)
                and self.parents.get(element) is names
                and isinstance(names, (cst.Tuple, cst.List))
                and isinstance(values, (cst.Tuple, cst.List))
                and len(names.elements) == len(values.elements)
                and not any(isinstance(e, cst.StarredElement) for e in (*names.elements, *values.elements))
            ):
                return values.elements[list(names.elements).index(element)].value
            return None
        if isinstance(statement, cst.AnnAssign) and statement.target is target:
            return statement.value
        return None

    def unpacked_call(self, target: cst.CSTNode) -> tuple[cst.Call, int] | None:
        """(call, index) for a name bound by `a, b = f(...)`."""
        statement = self.binding_statement(target)
        element = self.parents.get(target)
        if not (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.value, cst.Call)
            and isinstance(element, cst.Element)
        ):
            return None
        names = statement.targets[0].target
        if (
            self.parents.get(element) is not names
            or not isinstance(names, (cst.Tuple, cst.List))
            or any(isinstance(e, cst.StarredElement) for e in names.elements)
        ):
            return None
        return statement.value, list(names.elements).index(element)

    def accesses(self, target: cst.Name) -> list[cst.Name]:
        """Every read of the variable that `target` binds, in its scope and nested ones."""
        return self.accesses_in(self.scopes.get(target), target.value)

    def reached_reads(self, target: cst.Name) -> list[cst.Name]:
        """The reads that may see the value `target` binds (flow-sensitive: not a read in
        another branch, nor one after a later binding that hides it on every path)."""
        scope = self.scopes.get(target)
        binding = next((b for b in scope.assignments[target.value] if b.node is target), None)
        if binding is None:
            return self.accesses(target)
        return self.kinds.reached_reads(binding)

    def accesses_in(self, scope, name: str) -> list[cst.Name]:
        """Every read of the variable `name` of `scope`, there and in nested scopes, in the
        order of the file (libcst keeps them in sets, whose order changes from run to run)."""
        seen = {id(access.node): access.node for access in reads_of(scope.assignments[name])}
        return sorted(seen.values(), key=self.index.order)

    def in_own_scope(self, node: cst.CSTNode, scope) -> bool:
        """Is `node` evaluated in `scope` (comprehensions included), not in a nested function?"""
        current = self.scopes.get(node)
        while isinstance(current, ComprehensionScope) and current is not scope:
            current = current.parent
        return current is scope

    # -- values ----------------------------------------------------------------------------


class StepReads:
    """The syncs of one step loop and what can be done about each."""

    def __init__(self, analysis: _FileAnalysis, loop: cst.CSTNode, calls: list[cst.Call], kept) -> None:
        self.a = analysis
        self.kept = kept
        self.loop = loop
        self.calls = calls
        self.values = values(analysis.context)
        self._dtypes: dict[int, str | None] = {}
        self._fresh: dict[int, bool] = {}
        # Accumulator -> why it stays (None once planned): all its syncs get one answer.
        self._accumulators: dict[tuple, str | None] = {}
        self._syncs: list[cst.Call] | None = None
        self._returning: dict[int, tuple[cst.Call, list[cst.Call]]] | None = None
        self._returned_kept: dict[int, str] = {}
        self.suppressed = {id(sync) for sync in self.reads() if kept(analysis.statement_line(sync))}

    # -- finding syncs ----------------------------------------------------------------

    def read_kind(self, call: cst.Call) -> str | None:
        """ "item", "tolist", "cpu", "float" or "int" when `call` copies a device value to the host."""
        method = method_name(call)
        if method in SYNC_METHODS and not call.args:
            receiver = call.func.value
            fact = self.a.kinds.fact(receiver)
            if fact.kind is Kind.TENSOR and fact.place is Place.HOST:
                return None
            if method == "cpu" and not self.is_tensor(receiver):
                return None  # `.cpu()` of a module, or of something unknown
            if fact.kind not in (Kind.TENSOR, Kind.UNKNOWN):
                return None
            return method
        for name, builtin in HOST_READ_BUILTINS.items():
            if self.a.names.is_(call.func, name) and len(call.args) == 1 and call.args[0].keyword is None:
                value = call.args[0].value
                fact = self.a.kinds.fact(value)
                if self.is_tensor(value) and not (fact.kind is Kind.TENSOR and fact.place is Place.HOST):
                    return builtin
        return None

    def reads(self) -> list[cst.Call]:
        """Syncs that run every step: not under a log condition, not in a block that ends
        the loop by raising (`last_pass`), and not the inner part of a chain such as
        `x.cpu().item()` (the outermost call is the one reported)."""
        if self._syncs is None:
            found = [call for call in self.calls if self.read_kind(call) is not None]
            ids = {id(call) for call in found}
            self._syncs = [
                call
                for call in found
                if not self.in_log_branch(call)
                and periodic(self.a.context).last_pass(call, self.loop) is None
                and not any(id(outer) in ids for outer in self.chain_above(call))
            ]
        return self._syncs

    def chain_above(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """Calls that consume `node` directly: `node.m(...)` and `float(node)`."""
        current = node
        while True:
            parent = self.a.parents.get(current)
            if isinstance(parent, cst.Attribute) and parent.value is current:
                call = self.a.parents.get(parent)
                if not (isinstance(call, cst.Call) and call.func is parent):
                    return
                current = call
            elif isinstance(parent, cst.Arg) and isinstance(self.a.parents.get(parent), cst.Call):
                call = self.a.parents.get(parent)
                if self.read_kind(call) not in ("float", "int"):
                    return
                current = call
            else:
                return
            yield current

    def every_step(self, site) -> bool:
        """Does every call on the way from the step loop to `site` (a `StepSite`) run on
        every step (none under a periodic `if`)?"""
        return all(self.log_branch(call, site.loop if n == 0 else None) is None for n, call in enumerate(site.calls))

    def log_branch(self, node: cst.CSTNode, within: cst.CSTNode | None = None) -> cst.If | None:
        """The outermost `if` inside `within` (the step loop by default) whose body holds
        `node` and whose test is periodic (`step % N == 0`)."""
        return periodic(self.a.context).guard(node, within if within is not None else self.loop)

    def suppressed_in(self, sync: cst.Call) -> set[int]:
        """{id(sync)} when `# perfmod: ignore[PM404]` is on its line."""
        return {id(sync)} if self.kept(self.a.statement_line(sync)) else set()

    def in_log_branch(self, node: cst.CSTNode) -> bool:
        return self.log_branch(node) is not None

    # -- what values are ------------------------------------------------------------------

    def is_tensor(self, expr: cst.BaseExpression) -> bool:
        return self.values.is_tensor(expr)

    def dtype(self, expr: cst.BaseExpression) -> str | None:
        """FLOAT, INT64 or BOOL for a tensor of that dtype; None when unknown or not a tensor."""
        return self.values.dtype(expr)

    def is_number(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` certainly a Python number (`Values.number`: the one number question)?"""
        return self.values.number(expr) is not None

    def is_nonzero_number(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` a Python number that cannot be zero: a non-zero literal, or a name
        (a parameter too) whose every binding it may read (`Kinds.sources`) gives a
        non-zero number literal?"""
        values = self._literal_values(expr, set())
        return values is not None and all(number_value(v) != 0 for v in values)

    def _literal_values(self, expr: cst.BaseExpression, seen: set) -> list | None:
        if isinstance(expr, (cst.Integer, cst.Float)):
            return [expr]
        if not isinstance(expr, cst.Name) or id(expr) in seen:
            return None
        seen.add(id(expr))
        found = self.a.kinds.sources(expr)
        if not found or not all(type(b) is Assignment for b in found):
            return None
        values = []
        for binding in found:
            if isinstance(binding.node, cst.Param):
                parts: list = []
                if not self._number_param(binding.node, lambda v, parts=parts: self._collect(v, seen, parts)):
                    return None
            else:
                value = self.a.assigned_value(binding.node)
                parts = self._literal_values(value, seen) if value is not None else None
                if parts is None:
                    return None
            values.extend(parts)
        return values

    def _collect(self, value: cst.BaseExpression, seen: set, into: list) -> bool:
        found = self._literal_values(value, seen)
        if found is None:
            return False
        into.extend(found)
        return True

    def _number_param(self, param: cst.Param, check) -> bool:
        """Does `check` hold for the default of `param` and for what every call of its
        function in this file passes (a plain function, only ever called by name)?"""
        found = self.a.kinds.arguments(param)  # what every call passes, or its default
        if not found or any(passed is None or not check(passed) for _, passed in found):
            return False
        return param.default is None or check(param.default)

    def fresh(self, expr: cst.BaseExpression) -> bool:
        """Is the value of `expr` computed in this step, sharing no storage with state that
        lives across steps (parameters, gradients, optimizer state, buffers)? Calls of
        functions and modules are taken to return new values; views and `.detach()` share
        the storage of their receiver."""
        key = id(expr)
        if key not in self._fresh:
            self._fresh[key] = True  # a cycle adds no binding from outside: fresh if the rest are
            self._fresh[key] = self._compute_fresh(expr)
        return self._fresh[key]

    def _compute_fresh(self, expr: cst.BaseExpression) -> bool:
        if isinstance(
            expr,
            (
                cst.BinaryOperation,
                cst.UnaryOperation,
                cst.Comparison,
                cst.BooleanOperation,
                cst.Integer,
                cst.Float,
                *STRINGS,
            ),
        ):
            return True
        if isinstance(expr, (cst.Attribute, cst.Subscript)):
            return self.fresh(expr.value)
        if isinstance(expr, cst.Call):
            if method_name(expr) in SHARING_METHODS:
                return self.fresh(expr.func.value)
            return True
        if isinstance(expr, cst.Name):
            if expr.value in ("None", "True", "False"):
                return True
            found = self.a.bindings(expr)
            if not found:
                return False
            in_loop = False
            for binding in found:
                statement = self.a.binding_statement(binding.node)
                if statement is self.loop:
                    in_loop = True  # the loop's own target: this step's batch
                    continue
                value = self.a.assigned_value(binding.node)
                if value is None and self.a.unpacked_call(binding.node) is not None:
                    value = self.a.unpacked_call(binding.node)[0]  # `a, b = f(...)`: what a call returns is new
                if not self.a.inside(statement, self.loop.body):
                    if not _constant(value):
                        return False  # state from before the loop
                    continue
                in_loop = True
                if value is None or not self.fresh(value):
                    return False
            return in_loop
        return False

    # -- planning ---------------------------------------------------------------------

    def defer(self, sync: cst.Call) -> list[Deferral]:
        """The fixes for `sync` (several when an accumulator holds more than one sync);
        raises Kept with the reason when the sync must stay."""
        waits = self.a.context.training.synchronizes_every_step(self.loop)
        if waits is not None:  # timing code: reading the value later would not let the step run ahead
            raise Kept(
                f"the loop waits for the device on every step anyway (`{self.a.code(waits)}`, line "
                f"{self.a.line(waits)}), so reading the value later would not let the step run ahead"
            )
        line = self.a.statement_line(sync)
        small = _small_statement_of(self.a, sync, line)
        if isinstance(small, cst.AugAssign) or (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
            and _reads_name(small.value, small.targets[0].target.value)
        ):
            return self.plan_accumulation(small)
        if isinstance(small, cst.Assign):
            carrier = self._carried_only(sync, small)
            if carrier is not None:
                return self._plan_group((CARRIER, None, carrier))
            return [self._plan_move(sync, line, small)]
        if (
            isinstance(small, cst.Expr)
            and isinstance(small.value, cst.Call)
            and method_name(small.value) == "append"
            and len(small.value.args) == 1
            and small.value.args[0].value is sync
            and small.value.args[0].keyword is None
        ):
            return [self._plan_append(sync, small.value)]
        raise Kept(self._use_reason(sync))

    def waits_every_step(self, kept: list[cst.Call]) -> cst.Call | None:
        """The first of `kept` (reads that stay where they are) that the loop makes on every
        pass, under no condition: the host waits for the device there every step, so reading
        another value of the step later would not let the step run ahead."""
        every = sizes_of(self.a.context).every_step
        return next((read for read in sorted(kept, key=self.a.start) if every(read, self.loop)), None)

    def _use_reason(self, node: cst.CSTNode, subject: str = "its value") -> str:
        """Why a use of a synced value forces the sync to stay, from where the use is."""
        line = self.a.line(node)
        if not self.a.inside(node, self.loop):
            return f"{subject} is read outside the loop (line {line})"
        for ancestor in self.a.ancestors(node):
            if ancestor is self.loop:
                break
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                return f"{subject} is read in a nested function (line {line})"
            if isinstance(ancestor, (cst.If, cst.While)) and self.a.inside(node, ancestor.test):
                return f"{subject} decides control flow every step (line {line}), e.g. early stopping or a NaN check"
            if isinstance(ancestor, cst.Assert):
                return f"{subject} is checked every step (line {line})"
            if isinstance(ancestor, cst.Call):
                method = method_name(ancestor)
                callee = self.a.code(ancestor.func)
                if method in ("append", "extend", "add", "put"):
                    return f"{subject} is stored every step (`{callee}`, line {line})"
                if method in LOG_METHODS or callee in LOG_FUNCTIONS:
                    return f"{subject} is logged every step (`{callee}`, line {line}); log it under `if step % N == 0:`"
        return f"{subject} is used every step (line {line})"

    # -- keeping appended values on the device -------------------------------------------

    def _plan_append(self, sync: cst.Call, append: cst.Call) -> Deferral:
        """`values.append(x.item())` or `history["loss"].append(x.item())`: the list keeps
        the tensor, and becomes numbers once, right after the loop that fills it (one wait
        for the device instead of one a step). Fixed when the list starts empty before
        that loop and nothing else reads it until the loop ends."""
        holder = append.func.value
        label = self.a.code(holder)
        stored = self._use_reason(sync)
        if self.read_kind(sync) != "item":
            raise Kept(f"{stored}; only `.item()` values are kept as tensors")
        if isinstance(holder, cst.Name):
            name, key = holder, None
        elif isinstance(holder, cst.Subscript) and isinstance(holder.value, cst.Name) and _constant_key(holder):
            name, key = holder.value, _constant_key(holder)
        else:
            raise Kept(f"{stored}; perfmod does not follow `{label}`")
        reaching = self.a.kinds.reaching(name)
        if len(reaching) != 1 or not isinstance(reaching[0].node, cst.Name):
            raise Kept(f"{stored}; `{name.value}` may come from more than one assignment")
        binding = reaching[0]
        if not _starts_empty(self.a.assigned_value(binding.node), key):
            raise Kept(
                f"{stored}; `{label}` does not start as an empty list literal (line {self.a.line(binding.node)})"
            )
        filled = self._filling_statement(binding.node)
        if filled is None:
            raise Kept(
                f"{stored}; `{name.value}` is not bound in the block of the loop that fills it "
                f"(line {self.a.line(binding.node)})"
            )
        for read in self.a.kinds.reached_reads(binding):
            if read is name:
                continue
            where = self.a.line(read)
            if not self.a.in_own_scope(read, binding.scope):
                raise Kept(f"{stored}; `{name.value}` is read in a nested function (line {where})")
            if key is not None and _other_key(self.a, read, key):
                continue  # another list of the same dict
            if self.a.start(read) <= self.a.end(filled):
                raise Kept(
                    f"{stored}; `{label}` is read before the loop ends (line {where}), where it would hold tensors"
                )
            for ancestor in self.a.ancestors(filled):
                if isinstance(ancestor, (cst.Try, cst.TryStar)) and any(
                    self.a.inside(read, part) for part in (*ancestor.handlers, ancestor.finalbody) if part is not None
                ):
                    raise Kept(
                        f"{stored}; `{label}` is read where an exception lands (line {where}), which may run "
                        "before it becomes numbers"
                    )
        # `.item()` takes any one-element tensor; stacked, those of rank one or more would
        # give nested lists, so they are flattened first.
        scalar = layouts(self.a.context).rank(read_tensor(sync)) == 0
        return Deferral(LISTED, sync, changes=[(sync, AS_DETACHED)], holder=label, after=filled, scalar=scalar)

    def _filling_statement(self, target: cst.Name) -> cst.CSTNode | None:
        """The statement after `target`'s assignment, in its block, that holds this step
        loop: the loop itself, or an epoch loop (or `with`, `try`) around it."""
        line = self.a.statement_line(target)
        block = self.a.parents.get(line) if line is not None else None
        if block is None:
            return None
        for ancestor in (self.loop, *self.a.ancestors(self.loop)):
            if self.a.parents.get(ancestor) is block:
                return ancestor if self.a.start(ancestor) > self.a.start(line) else None
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
        return None

    # -- moving `v = x.item()` under the log condition ------------------------------------

    def _plan_move(self, sync: cst.Call, line: cst.SimpleStatementLine, assign: cst.Assign) -> Deferral:
        if len(line.body) != 1:
            raise Kept("the statement shares its line with others")
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
            raise Kept("only `name = ...` assignments are moved")
        target = assign.targets[0].target
        block = self.a.parents.get(line)
        if not isinstance(block, cst.IndentedBlock):
            raise Kept("the statement is not in an indented block")
        scope = self.a.scopes.get(target)
        branches: dict[int, cst.If] = {}
        for use in self.a.reached_reads(target):
            branch = self._branch_after(line, block, use)
            if branch is None or not self.a.in_own_scope(use, scope):
                if self.in_log_branch(use):
                    raise Kept(
                        f"`{target.value}` is read in a log branch (line {self.a.line(use)}) that is "
                        f"not reached from the assignment's block through `if` statements only"
                    )
                raise Kept(self._use_reason(use, f"`{target.value}`"))
            branches[id(branch)] = branch
        if not branches:
            raise Kept(f"`{target.value}` is never read; perfmod leaves dead code to you")
        for binding in scope.assignments[target.value]:
            if binding.node is not target and (
                self.a.inside(binding.node, self.loop) or not self.a.in_own_scope(binding.node, scope)
            ):
                raise Kept(f"`{target.value}` is also assigned at line {self.a.line(binding.node)}")
        # only where every read would allow the move: a read each step is the truer reason
        impure = _impure_part(self, assign.value)
        if impure is not None:
            raise Kept(f"`{self.a.code(impure)}` may have side effects, so the statement cannot move")
        first_body = min((b.body for b in branches.values()), key=self.a.start)
        self._check_stable(assign.value, after=line, before=first_body)
        return Deferral(MOVED, sync, moves=[(branch, line) for branch in branches.values()], holder=target.value)

    def _branch_after(self, line: cst.SimpleStatementLine, block: cst.IndentedBlock, use: cst.CSTNode) -> cst.If | None:
        """The log branch to move `line` into for `use`: an `if` with a periodic test that
        holds `use` in its body, reached from a later statement of `block` through `if`
        statements only (so the moved statement runs in the same step, before the use)."""
        path = []
        for ancestor in self.a.ancestors(use):
            if ancestor is block:
                break
            path.append(ancestor)
        else:
            return None
        statement = path[-1] if path else None
        if statement is None or list(block.body).index(statement) <= list(block.body).index(line):
            return None
        for node in reversed(path):
            if (
                isinstance(node, cst.If)
                and periodic(self.a.context).is_periodic(node.test, self.loop)
                and self.a.inside(use, node.body)
            ):
                return node
            if not isinstance(node, (cst.If, cst.Else, cst.IndentedBlock, cst.SimpleStatementSuite)):
                return None
        return None

    def _check_stable(self, value: cst.BaseExpression, after: cst.CSTNode, before: cst.CSTNode) -> None:
        """Raise unless every variable `value` reads holds the same value at `before` as
        right `after` the original statement."""
        start, end = self.a.end(after), self.a.start(before)
        for name in names_read(value):
            if self.a.is_import_or_builtin(name):
                continue
            if not self.fresh(name):
                raise Kept(
                    f"`{name.value}` is not computed in this step (parameters and other state may "
                    f"change before the log branch)"
                )
            for binding in self.a.scopes.get(name).assignments[name.value]:
                if start < self.a.start(binding.node) < end:
                    raise Kept(
                        f"`{name.value}` is assigned again before the log branch (line {self.a.line(binding.node)})"
                    )
            for use in self.a.accesses(name):
                if not self.a.inside(use, self.loop):
                    continue
                changes, anywhere = self._changes(use)
                # A call may change what it is handed only while it runs; an in-place
                # write or a second name may act on the value from anywhere in the step.
                if changes is not None and (anywhere or start < self.a.start(use) < end):
                    raise Kept(f"`{name.value}` {changes} (line {self.a.line(use)})")

    def _changes(self, use: cst.Name) -> tuple[str | None, bool]:
        """How a read of a variable may change its value or let something else change it,
        and whether that can reach the value from anywhere in the step (in-place writes,
        second names) or only where it happens (a call that receives it)."""
        chain, shares_storage = use, True  # does `chain` still share the variable's storage?
        while True:
            parent = self.a.parents.get(chain)
            if isinstance(parent, cst.Attribute) and parent.value is chain:
                call = self.a.parents.get(parent)
                if isinstance(call, cst.Call) and call.func is parent:
                    attr = parent.attr.value
                    if attr.endswith("_") and not attr.startswith("_"):
                        return "is changed in place", True
                    chain, shares_storage = call, shares_storage and attr in SHARING_METHODS
                else:
                    chain = parent
            elif isinstance(parent, cst.Subscript) and parent.value is chain:
                chain = parent
            else:
                break
        if chain is not use and self.a.is_written(chain):
            return "is changed in place", True
        if not shares_storage:
            return None, False
        if isinstance(parent, cst.Arg):
            call = self.a.parents.get(parent)
            if self.a.names.of(call.func) & NON_MUTATING_CALLS or method_name(call) in SCALER_METHODS_RETURNING_NEW:
                return None, False
            return f"is passed to `{self.a.code(call.func)}()`, which may change it,", False
        if isinstance(parent, (cst.Assign, cst.AnnAssign, cst.AugAssign)) and parent.value is chain:
            targets = parent.targets if isinstance(parent, cst.Assign) else [parent]
            if not all(isinstance(t.target, cst.Name) and t.target.value == use.value for t in targets):
                return "gets a second name that may change it", True  # `x = x.to(device)` only re-binds
        return None, False

    # -- running sums kept on the device ---------------------------------------------------

    def plan_accumulation(self, statement: cst.AugAssign | cst.Assign) -> list[Deferral]:
        """The fixes for the running sums `statement` adds to (with every sync they hold)."""
        target = statement.target if isinstance(statement, cst.AugAssign) else statement.targets[0].target
        holder = self._holder(target)
        if isinstance(statement, cst.AugAssign) and not isinstance(statement.operator, cst.AddAssign):
            raise Kept("only `+=` and `x = <expression of x>` accumulations are rewritten")
        return self._plan_group(holder)

    def defer_returned(self, call: cst.Call) -> list[Deferral]:
        """The deferrals for a call of `returning_calls` added to a running sum (none when
        it is not added to one, or the sum stays: then its reads are reported where they
        are)."""
        small = _small_statement_of(self.a, call, self.a.statement_line(call))
        if not _accumulates(self.a, small, call):
            return []
        try:
            return self.plan_accumulation(small)
        except Kept as why:
            self._returned_kept[id(call)] = str(why)
            return []

    def returned_kept(self, call: cst.Call) -> str | None:
        """Why the sum `defer_returned(call)` planned for stays, or None."""
        return self._returned_kept.get(id(call))

    def returning_calls(self) -> list[tuple[cst.Call, list[cst.Call]]]:
        """Calls in the step of a function of this file whose every `return` is a sync
        (`return loss.item()` of a step method), called there and nowhere else."""
        if self._returning is None:
            self._returning = {}
            for call in self.calls:
                if self.in_log_branch(call):
                    continue  # runs at log time
                returned = self._returned_syncs(call)
                if returned:
                    self._returning[id(call)] = (call, returned)
        return list(self._returning.values())

    def _returned_syncs(self, call: cst.Call) -> list[cst.Call] | None:
        loops = self.a.context.loops
        function = loops.callee(call)
        if (
            function is None
            or function.decorators
            or function.asynchronous is not None
            or loops.call_sites(function) != [call]
            or loops.own((cst.Yield, cst.Await), function.body)
        ):
            return None
        values = [r.value for r in loops.own(cst.Return, function.body)]
        if not values or not all(isinstance(v, cst.Call) and self.read_kind(v) in ("item", "float") for v in values):
            return None
        if any(id(v) in self.suppressed_in(v) for v in values):
            return None
        # Its name appears nowhere else (no other caller, no override, not handed on).
        name = function.name.value
        callee = call.func.attr if isinstance(call.func, cst.Attribute) else call.func
        if any(n.value == name and n is not callee and n is not function.name for n in self.a.index.find(cst.Name)):
            return None
        return values

    def _returned_by(self, term: cst.CSTNode) -> list[cst.Call] | None:
        if self._returning is None:
            self.returning_calls()
        found = self._returning.get(id(term))
        return found[1] if found is not None else None

    def _holder(self, target: cst.BaseExpression) -> tuple:
        """What an accumulation adds to: (VAR, scope, name) for a variable, (ITEMS, scope,
        name) for an item of a dict with a constant key (the dict's sums go together)."""
        if isinstance(target, cst.Name):
            return (VAR, self.a.scopes.get(target), target.value)
        if isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name):
            if _constant_key(target) is None:
                raise Kept(f"it is added to `{self.a.code(target)}`, whose key is not a constant")
            return (ITEMS, self.a.scopes.get(target.value), target.value.value)
        raise Kept(f"it is added to `{self.a.code(target)}`, which perfmod does not follow")

    def _plan_group(self, seed: tuple) -> list[Deferral]:
        """Plan the running sums that must change together: the sums `seed` names, the
        names of synced values they add (`n = mask.sum().item()`), and every other sum
        those names are added to. One answer for all: each of their syncs gets a fix with
        all their edits, or the same reason why none is made."""
        key = _key(seed)
        if key in self._accumulators:
            if self._accumulators[key] is not None:
                raise Kept(self._accumulators[key])
            return []  # planned with an earlier sync of the same group
        members: list[tuple] = []
        try:
            fixes = self._plan_members(seed, members)
        except Kept as why:
            for member in members:
                self._accumulators[member] = str(why)
            raise
        for member in members:
            self._accumulators[member] = None
        return fixes

    def _plan_members(self, seed: tuple, members: list[tuple]) -> list[Deferral]:
        sums: list[_Sum] = []
        carriers: dict[int, _Carrier] = {}  # id of each read of a carrier -> the carrier
        whole: dict[str, tuple[list[_Sum], set, cst.CSTNode]] = {}  # dict read whole -> its sums, keys, read
        pending = [seed]
        while pending:
            holder = pending.pop()
            key = _key(holder)
            if key in members:
                continue
            members.append(key)
            if self._accumulators.get(key) is not None:
                raise Kept(self._accumulators[key])
            kind, scope, name = holder
            if kind == CARRIER:
                carrier = name
                for use in carrier.uses:
                    carriers[id(use)] = carrier
                    pending.append(self._holder_of_carried(carrier, use))
                continue
            if kind == VAR:
                found = [self._var_sum(scope, name)]
            else:
                found, keys, whole_read = self._dict_sums(scope, name)
                if whole_read is not None:
                    whole[name] = (found, keys, whole_read)
            for total in found:
                for accumulation in total.accumulations:
                    for read in names_read(accumulation.value):
                        carrier = self._carrier_of(read)
                        if carrier is not None:
                            pending.append((CARRIER, None, carrier))
            sums.extend(found)
        replaces: dict[int, tuple[cst.CSTNode, str]] = {}
        deferrals: list[Deferral] = []
        wrappers: dict[int, str] = {}
        for total in sums:
            wrappers[id(total)] = self._plan_sum(total, carriers, replaces, deferrals)
        for name, (found, keys, read) in whole.items():
            converted = {total.key for total in found}
            missing = sorted(keys - converted, key=repr)
            if missing:
                raise Kept(
                    f"`{name}` is read whole at line {self.a.line(read)}, and `{name}[{missing[0]!r}]` is not a "
                    f"running sum of synced values"
                )
            if len({wrappers[id(total)] for total in found}) > 1:
                raise Kept(f"`{name}` is read whole at line {self.a.line(read)}, and holds ints and floats")
        for carrier in {id(c): c for c in carriers.values()}.values():
            deferrals.append(self._plan_carrier(carrier, replaces))
        for deferral in deferrals:
            deferral.changes = list(replaces.values())
        return deferrals

    # -- what a running sum is ------------------------------------------------------------

    def _var_sum(self, scope, name: str) -> _Sum:
        accumulations, literals = [], []
        for binding in scope.assignments[name]:
            node = binding.node
            if not self.a.in_own_scope(node, scope):
                raise Kept(
                    f"`{name}` is also bound in another function (line {self.a.line(node)}), "
                    f"which may run between a step and the read"
                )
            bound_by = self.a.binding_statement(node)
            value = self.a.assigned_value(node) if not isinstance(bound_by, cst.AugAssign) else None
            if isinstance(value, (cst.Integer, cst.Float)):
                literals.append((node, value))
            elif isinstance(bound_by, (cst.AugAssign, cst.Assign)) and self.a.inside(bound_by, self.loop.body):
                accumulations.append(bound_by)
            else:
                raise Kept(f"`{name}` is also bound at line {self.a.line(node)}, not to a number literal")
        reads = [
            use for use in self.a.accesses_in(scope, name) if not any(self.a.inside(use, a) for a in accumulations)
        ]
        return _Sum(f"`{name}`", name, scope, literals, accumulations, reads)

    def _dict_sums(self, scope, name: str) -> tuple[list[_Sum], set, cst.CSTNode | None]:
        """The running sums in the items of the dict `name` (a local literal with constant
        keys and number values, or a `defaultdict(float)`): one per key that a step adds
        synced values to, all its keys, and where it is read whole (`.items()`), if it is.
        Raises unless every use of the dict is an item with a constant key or such a read."""
        literals, defaults, keys = self._dict_starts(scope, name)
        accumulations: dict[tuple, list] = {}
        reads: dict[tuple, list] = {}
        whole: list[cst.BaseExpression] = []
        whole_read = None
        for use in self.a.accesses_in(scope, name):
            if not self.a.in_own_scope(use, scope):
                raise Kept(f"`{name}` is used in a nested function (line {self.a.line(use)})")
            parent = self.a.parents.get(use)
            item_key = _constant_key(parent) if isinstance(parent, cst.Subscript) and parent.value is use else None
            if item_key is not None:
                keys.add(item_key)
                self._dict_item_use(parent, item_key, literals, accumulations, reads)
                continue
            values = self._whole_read(use)
            if values is None:
                raise Kept(
                    f"`{name}` is used at line {self.a.line(use)} (`{self.a.code(self.a.statement_line(use) or use)}`) "
                    f"other than through constant keys; perfmod does not follow the dict there"
                )
            whole.extend(values)
            whole_read = whole_read or use
        sums = []
        for item_key, added in accumulations.items():
            if not any(self._adds_synced(statement) for statement in added):
                continue  # a plain Python count kept beside the sums
            label = f"`{name}[{item_key[1]!r}]`"
            total = _Sum(
                label, name, scope, literals.get(item_key, []) + defaults, added, reads.get(item_key, []) + whole
            )
            total.allow_self, total.key = False, item_key
            sums.append(total)
        return sums, keys, whole_read

    def _dict_starts(self, scope, name: str) -> tuple[dict[tuple, list], list, set]:
        """What the dict `name` starts as, at each of its bindings: the number literal of each
        key (by key), the number every key of a `defaultdict` starts at, and the keys written.
        Raises for a binding to anything else."""
        literals: dict[tuple, list] = {}
        defaults: list = []
        keys: set = set()
        for binding in scope.assignments[name]:
            node = binding.node
            statement = self.a.binding_statement(node)
            value = self.a.assigned_value(node)
            single = isinstance(statement, cst.AnnAssign) or (
                isinstance(statement, cst.Assign) and len(statement.targets) == 1
            )
            if not self.a.in_own_scope(node, scope) or not single or value is None:
                raise Kept(f"`{name}` is also bound at line {self.a.line(node)}, not to a dict literal")
            if isinstance(value, cst.Dict):
                for item_key, number in self._dict_literal_items(name, node, value):
                    keys.add(item_key)
                    literals.setdefault(item_key, []).append((number, number))
                continue
            default = self._defaultdict_start(value)
            if default is None:
                raise Kept(f"`{name}` is bound at line {self.a.line(node)} to something other than a dict literal")
            defaults.append((value, default))
        return literals, defaults, keys

    def _dict_literal_items(self, name: str, node: cst.CSTNode, value: cst.Dict) -> list[tuple]:
        """(key, number) of each item of the dict literal `name` is bound to at `node`; raises
        for an item that is not a constant key with a number value."""
        items = []
        for element in value.elements:
            item_key = _literal_key(element.key) if isinstance(element, cst.DictElement) else None
            if item_key is None or not isinstance(element.value, (cst.Integer, cst.Float)):
                raise Kept(
                    f"`{name}` starts at line {self.a.line(node)} with items that are not constant keys "
                    f"with number values"
                )
            items.append((item_key, element.value))
        return items

    def _dict_item_use(self, item: cst.Subscript, item_key: tuple, literals: dict, accumulations: dict, reads: dict):
        """Record a use of the item `d[key]`: a read, an addition in the step (`+=`), or a
        number literal set; raises for any other change of it."""
        if not self.a.is_written(item):
            reads.setdefault(item_key, []).append(item)
            return
        statement = self.a.binding_statement(item)
        if (
            isinstance(statement, cst.AugAssign)
            and isinstance(statement.operator, cst.AddAssign)
            and self.a.inside(statement, self.loop.body)
        ):
            accumulations.setdefault(item_key, []).append(statement)
        elif (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.value, (cst.Integer, cst.Float))
        ):
            literals.setdefault(item_key, []).append((statement.value, statement.value))
        else:
            raise Kept(f"`{self.a.code(item)}` is also changed at line {self.a.line(item)}")

    def _defaultdict_start(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
        """The number every key of `defaultdict(float)` / `defaultdict(int)` starts at."""
        if not (
            isinstance(value, cst.Call)
            and self.a.names.is_(value.func, "collections.defaultdict")
            and len(value.args) == 1
            and value.args[0].keyword is None
            and not value.args[0].star
        ):
            return None
        factory = value.args[0].value
        if self.a.names.is_(factory, "builtins.float"):
            return cst.Float("0.0")
        if self.a.names.is_(factory, "builtins.int"):
            return cst.Integer("0")
        return None

    def _whole_read(self, use: cst.Name) -> list[cst.Name] | None:
        """The reads of the value name of `for k, v in d.items()` / `for v in d.values()`
        (a loop or a comprehension), where `use` is `d`; None for any other use."""
        attribute = self.a.parents.get(use)
        call = self.a.parents.get(attribute)
        loop = self.a.parents.get(call)
        if not (
            isinstance(attribute, cst.Attribute)
            and attribute.attr.value in ("items", "values")
            and isinstance(call, cst.Call)
            and call.func is attribute
            and not call.args
            and isinstance(loop, (cst.For, cst.CompFor))
            and loop.iter is call
        ):
            return None
        target = loop.target
        if attribute.attr.value == "items":
            if not (isinstance(target, cst.Tuple) and len(target.elements) == 2):
                return None
            target = target.elements[1].value
        if not isinstance(target, cst.Name):
            return None
        scope = self.a.scopes.get(target)
        if scope is None or len(scope.assignments[target.value]) != 1:
            return None
        return self.a.accesses_in(scope, target.value)

    def _adds_synced(self, statement: cst.CSTNode) -> bool:
        ids = {id(s) for s in self.reads()}
        return any(id(call) in ids or self._returned_by(call) for call in m.findall(statement, m.Call())) or any(
            self._carrier_of(read) is not None for read in names_read(statement.value)
        )

    # -- names that carry a synced value into running sums ------------------------------------

    def _carrier_of(self, read: cst.Name) -> _Carrier | None:
        """The carrier `read` reads: a name bound once, in the step, to a sync (`n =
        mask.sum().item()`), and read only after that, in the step."""
        key = ("carrier", id(read))
        if key in self._dtypes:
            return self._dtypes[key]
        self._dtypes[key] = None
        found = self.a.bindings(read)
        if not found or len(found) != 1 or not self.a.inside(found[0].node, self.loop.body):
            return None
        target = found[0].node
        statement = self.a.binding_statement(target)
        if not (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and statement.targets[0].target is target
            and isinstance(statement.value, cst.Call)
            and any(statement.value is s for s in self.reads())
            and id(statement.value) not in self.suppressed
        ):
            return None
        line = self.a.statement_line(statement)
        scope = self.a.scopes.get(target)
        uses = self.a.accesses(target)
        if not all(
            self.a.in_own_scope(u, scope) and self.a.inside(u, self.loop.body) and self.a.start(u) > self.a.end(line)
            for u in uses
        ):
            return None
        carrier = _Carrier(target, statement.value, line, uses)
        self._dtypes[key] = carrier
        return carrier

    def _carried_only(self, sync: cst.Call, assign: cst.Assign) -> _Carrier | None:
        """The carrier `assign` binds, when every read of it is in a running sum."""
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        if not isinstance(target, cst.Name) or assign.value is not sync:
            return None
        uses = self.a.accesses(target)
        carrier = self._carrier_of(uses[0]) if uses else None
        if carrier is None:
            return None
        other = [
            u for u in uses if not _accumulates(self.a, _small_statement_of(self.a, u, self.a.statement_line(u)), u)
        ]
        if other and len(other) < len(uses):  # added to sums, and needed as a number elsewhere
            raise Kept(self._use_reason(other[0], f"`{target.value}`"))
        return None if other else carrier

    def _holder_of_carried(self, carrier: _Carrier, use: cst.Name) -> tuple:
        small = _small_statement_of(self.a, use, self.a.statement_line(use))
        if not _accumulates(self.a, small, use):
            raise Kept(self._use_reason(use, f"`{carrier.target.value}`"))
        if isinstance(small, cst.AugAssign) and not isinstance(small.operator, cst.AddAssign):
            raise Kept("only `+=` and `x = <expression of x>` accumulations are rewritten")
        return self._holder(small.target if isinstance(small, cst.AugAssign) else small.targets[0].target)

    def _plan_carrier(self, carrier: _Carrier, replaces: dict) -> Deferral:
        """The carrier keeps the tensor: int64 counts as they are, floating point in float64."""
        dtype = self._term_dtype(carrier.sync)
        if dtype not in (FLOAT, INT64):
            raise Kept(
                f"perfmod cannot tell whether `{self.a.code(carrier.sync)}` gives an int or a float, "
                f"so `{carrier.target.value}` stays a Python number"
            )
        tensor = read_tensor(carrier.sync)
        if not _new_tensor(tensor):
            for use in carrier.uses:  # the tensor must be what it was at the binding when the sum reads it
                self._check_stable(tensor, after=carrier.line, before=self.a.statement_line(use))
        keep_int = dtype == INT64
        replaces[id(carrier.sync)] = (carrier.sync, AS_COUNT if keep_int else AS_TENSOR)
        sums = tuple(sorted({self.a.code(_accumulated(self.a, u)) for u in carrier.uses}))
        return Deferral(CARRIED, carrier.sync, holder=carrier.target.value, int_sum=keep_int, sums=sums)

    # -- one running sum ----------------------------------------------------------------------

    def _plan_sum(self, total: _Sum, carriers: dict[int, _Carrier], replaces: dict, deferrals: list) -> str:
        """Check one running sum and add its edits; returns the wrapper its reads get."""
        terms = self._sum_terms(total, carriers)
        int_sum = self._is_int_sum(total, terms, carriers)
        if not int_sum:
            self._check_float_sum(total, terms, carriers)
        for use in total.reads:
            self._check_read(use, total, int_sum)
        self._replace_terms(terms, carriers, replaces, int_sum)
        wrapper = AS_INT if int_sum else AS_FLOAT
        for use in total.reads:
            replaces[id(use)] = (use, wrapper)
        deferrals.extend(self._sum_deferrals(total, terms, carriers, int_sum))
        return wrapper

    def _sum_terms(self, total: _Sum, carriers: dict[int, _Carrier]) -> list[tuple[cst.CSTNode, bool]]:
        """(term, bare) for each sync, carrier read or call of a function that returns a sync
        the sum's accumulations add (bare when it is the whole added value); raises where an
        accumulation adds none, or the fix cannot change what a term's function returns."""
        syncs = self.reads()
        terms = []
        for accumulation in total.accumulations:
            found = [s for s in syncs if self.a.inside(s, accumulation)]
            carried = [read for read in names_read(accumulation.value) if id(read) in carriers]
            carried += [c for c in self.calls if self._returned_by(c) and self.a.inside(c, accumulation.value)]
            if not found and not carried:
                raise Kept(f"{total.label} is also changed at line {self.a.line(accumulation)}")
            if any(id(s) in self.suppressed for s in found):
                raise Kept(f"a sync added to {total.label} is suppressed at line {self.a.line(accumulation)}")
            terms.extend(self._terms(accumulation, total, found, carried))
        for term, _ in terms:
            elsewhere = self._called_elsewhere(term)
            if elsewhere is not None:
                raise Kept(elsewhere)
        return terms

    def _term_sync(self, term: cst.CSTNode, carriers: dict[int, _Carrier]) -> cst.Call:
        """The sync a term adds: itself, its carrier's, or the first its function returns."""
        if id(term) in carriers:
            return carriers[id(term)].sync
        return (self._returned_by(term) or [term])[0]

    def _added_dtype(self, term: cst.CSTNode, carriers: dict[int, _Carrier]) -> str | None:
        """The dtype of what a term adds (FLOAT, INT64), or None when it is not known."""
        returned = self._returned_by(term)
        if returned is not None:
            found = {self._term_dtype(s) for s in returned}
            return found.pop() if len(found) == 1 else None
        return self._term_dtype(self._term_sync(term, carriers))

    def _is_int_sum(self, total: _Sum, terms: list, carriers: dict[int, _Carrier]) -> bool:
        """Does the sum stay an int in Python: int64 terms added whole, to int literals? It
        is then kept as an int64 count on the device."""
        literal_kinds = {type(v) for _, v in total.literals}
        term_dtypes = {self._added_dtype(t, carriers) for t, _ in terms}
        return term_dtypes == {INT64} and literal_kinds <= {cst.Integer} and all(bare for _, bare in terms)

    def _check_float_sum(self, total: _Sum, terms: list, carriers: dict[int, _Carrier]) -> None:
        """A sum kept on the device in float64 gives what Python's float sum gives: raises
        where perfmod cannot tell it would."""
        if self.a.no_float64:
            raise Kept("this file may run on MPS or XLA, which have no float64 for the running sum")
        syncs = [self._term_sync(t, carriers) for t, _ in terms]
        unknown = [sync for sync in syncs if not self.is_tensor(read_tensor(sync))]
        if unknown:
            raise Kept(f"perfmod cannot tell that `{self.a.code(unknown[0])}` reads a tensor")
        self._check_int_start(total, terms, carriers)
        # A term of known dtype enters the float64 sum through `.double()`: `+ - * /` with
        # Python numbers then round as Python's do (its integers are exact doubles below 2**53).
        unknown = next(
            (sync for sync, (t, bare) in zip(syncs, terms) if not bare and self._added_dtype(t, carriers) is None), None
        )
        if unknown is not None:
            raise Kept(f"perfmod cannot tell whether `{self.a.code(unknown)}` gives an int or a float")

    def _check_int_start(self, total: _Sum, terms: list, carriers: dict[int, _Carrier]) -> None:
        """A sum that starts as an int becomes a float only where a float is added: raises
        unless every term is one."""
        dtypes = [self._added_dtype(t, carriers) for t, _ in terms]
        if not any(isinstance(v, cst.Integer) for _, v in total.literals) or set(dtypes) == {FLOAT}:
            return
        syncs = [self._term_sync(t, carriers) for t, _ in terms]
        unknown = next((sync for sync, dtype in zip(syncs, dtypes) if dtype is None), None)
        if unknown is None:
            integer = next(sync for sync, dtype in zip(syncs, dtypes) if dtype != FLOAT)
            raise Kept(
                f"{total.label} starts as an int, and whether it stays one depends on the arithmetic on "
                f"`{self.a.code(integer)}` (an integer), while a sum kept on the device is float64"
            )
        raise Kept(
            f"{total.label} starts as an int and perfmod cannot tell whether "
            f"`{self.a.code(unknown)}` gives an int or a float"
        )

    def _replace_terms(self, terms: list, carriers: dict[int, _Carrier], replaces: dict, int_sum: bool) -> None:
        """What each term becomes: the tensor it reads (an int64 count for an int sum), in
        the function that returns it; a carrier's int64 count converted for a float sum."""
        device = AS_COUNT if int_sum else AS_TENSOR
        for term, _ in terms:
            returned = self._returned_by(term)
            if returned is not None:
                for sync in returned:  # the function returns the tensor
                    replaces[id(sync)] = (sync, device)
            elif id(term) in carriers:
                if not int_sum and self._term_dtype(self._term_sync(term, carriers)) != FLOAT:
                    # an int64 count added to a float64 sum: as Python does, in double
                    replaces[id(term)] = (term, AS_DOUBLE)
            else:
                replaces[id(term)] = (term, device)

    def _sum_deferrals(self, total: _Sum, terms: list, carriers: dict[int, _Carrier], int_sum: bool) -> list:
        """The deferral of each term: a sync summed on the device, or returned by a function
        as a tensor (a carrier's is its own)."""
        inside = [self.a.inside(r, self.loop) for r in total.reads]
        places = tuple(
            place for place, found in (("at log time", any(inside)), ("outside the loop", not all(inside))) if found
        )
        holder = total.label.strip("`")
        deferrals = []
        for term, _ in terms:
            returned = self._returned_by(term)
            if returned is not None:
                function = self.a.context.loops.callee(term)
                exported = not function.name.value.startswith("_") and not any(
                    isinstance(a, cst.FunctionDef) for a in self.a.ancestors(function)
                )
                deferrals += [
                    Deferral(
                        RETURNED,
                        sync,
                        holder=holder,
                        int_sum=int_sum,
                        places=places,
                        call=term,
                        function=function,
                        exported=exported,
                    )
                    for sync in returned
                ]
            elif id(term) not in carriers:
                deferrals.append(Deferral(SUMMED, term, holder=holder, int_sum=int_sum, places=places))
        return deferrals

    def _called_elsewhere(self, term: cst.CSTNode) -> str | None:
        """Where another module of the project calls the function whose returned sync
        `term` adds (the fix makes it return a tensor), private name or not."""
        function = self.a.context.loops.callee(term) if self._returned_by(term) is not None else None
        if function is None:
            return None
        project, name = project_of(self.a.context), function.name.value
        for module, call in project.package_calls(function):
            return (
                f"`{name}` returns it, and {project.shown_in(module.context, call)} calls "
                "it too, where a tensor would arrive instead of a number"
            )
        if self.a.context.kinds.class_of(function) is not None:  # a method: named as `.name` where it is called
            for module in project.package_importers():
                if module.mentions(f".{name}(".encode()):
                    return (
                        f"`{name}` returns it, and `{project.dotted(module.path)}`, which imports this module, "
                        f"calls a `.{name}(...)` too, where a tensor would arrive instead of a number"
                    )
        return None

    def _terms(self, accumulation, total: _Sum, syncs: list[cst.Call], carried: list[cst.Name]) -> list:
        """The syncs and carriers an accumulation adds, checked to be combined with the
        accumulator and Python numbers by `+ - * /` only (the operations whose double results
        are the same on the device as in Python)."""
        if isinstance(accumulation, cst.AugAssign):
            value, bare = accumulation.value, [accumulation.value]
        else:
            value = accumulation.value
            bare = (
                [value.left, value.right]
                if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add)
                else []
            )
        if isinstance(accumulation, cst.Assign) and any(value is t for t in [*syncs, *carried]):
            # `x = n` would make the sum the very tensor `n` holds, which `x += ...` then changes
            if any(value is c for c in carried) or not _new_tensor(read_tensor(value)):
                raise Kept(
                    f"{total.label} is set to `{self.a.code(value)}` at line {self.a.line(accumulation)}, and a "
                    f"sum kept on the device would share its tensor"
                )
        operands = {id(s): SYNC_OPERAND for s in syncs} | {id(c): CARRIED_OPERAND for c in carried}
        accumulator = total.var if total.allow_self else None
        problem = _arithmetic_problem(
            self, value, accumulator, operands, allow_accumulator=isinstance(accumulation, cst.Assign)
        )
        if problem is not None:
            raise Kept(problem)
        return [(t, any(t is b for b in bare)) for t in [*syncs, *carried]]

    def _term_dtype(self, sync: cst.Call) -> str | None:
        if self.read_kind(sync) == "float":
            return FLOAT  # float(t) is a Python float whatever the dtype of t
        if self.read_kind(sync) != "item":
            return None
        return self.dtype(read_tensor(sync))

    def _check_read(self, use: cst.CSTNode, total: _Sum, int_sum: bool) -> None:
        subject, accumulations, literals = total.label, total.accumulations, total.literals
        if not self.a.in_own_scope(use, total.scope):
            raise Kept(f"{subject} is read in a nested function (line {self.a.line(use)})")
        if self.a.is_written(use):
            raise Kept(f"{subject} is written at line {self.a.line(use)}")
        parent = self.a.parents.get(use)
        if isinstance(parent, cst.FormattedStringExpression) and parent.equal is not None:
            raise Kept(
                f"{subject} is printed with `=` in an f-string (line {self.a.line(use)}), which shows "
                f"the expression's text"
            )
        if self.a.inside(use, self.loop):
            branch = self.log_branch(use)
            if branch is None or _reads_name(branch.test, total.var):
                raise Kept(self._use_reason(use, subject))
        elif (
            self.a.context.loops.step_loop_of(use) is not None
            and self.log_branch(use, self.a.context.loops.step_loop_of(use)) is None
        ):
            raise Kept(f"{subject} is read every step of another loop (line {self.a.line(use)})")
        if int_sum or not any(isinstance(v, cst.Integer) for _, v in literals):
            return
        # The sum may still be the int it started as: `float()` would print 0 as 0.0
        # unless the read is a division or a float format, or a step has added to it.
        if _float_context(self.a, use) or self._after_accumulation(use, accumulations, literals):
            return
        start = next(v for _, v in literals if isinstance(v, cst.Integer))
        raise Kept(
            f"{subject} starts as the int {start.value} and is read at line {self.a.line(use)}, where no "
            f"step may have added to it yet (it would print as {start.value}.0); start it at "
            f"{start.value}.0"
        )

    def _after_accumulation(self, use: cst.Name, accumulations, literals) -> bool:
        """Does an accumulation run before `use` in every step that reaches it, with no
        reset between?"""
        for accumulation in accumulations:
            line = self.a.parents.get(accumulation)
            block = self.a.parents.get(line)
            if not isinstance(block, cst.IndentedBlock) or not self.a.inside(use, block):
                continue
            holder = next(s for s in block.body if self.a.inside(use, s))
            if list(block.body).index(holder) <= list(block.body).index(line):
                continue
            between = (self.a.end(line), self.a.start(use))
            if not any(between[0] < self.a.start(node) < between[1] for node, _ in literals):
                return True
        return False


def _key(holder: tuple) -> tuple:
    kind, scope, name = holder
    return (kind, id(name.target)) if kind == CARRIER else (kind, id(scope), name)


def _literal_key(expr: cst.BaseExpression | None) -> tuple | None:
    """A dict key written as a constant: a string or an integer literal."""
    if isinstance(expr, cst.SimpleString):
        return ("str", expr.evaluated_value)
    number = integer_value(expr)  # `1`, `0x1` and `-1` are keys too
    return ("int", number) if number is not None else None


def _constant_key(subscript: cst.Subscript) -> tuple | None:
    """The key of `d["name"]` / `d[0]`, or None for any other subscript."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    index = subscript.slice[0].slice
    return _literal_key(index.value) if index.star is None else None


def _starts_empty(value: cst.BaseExpression | None, key: tuple | None) -> bool:
    """Is `value` `[]`, or (for a key) a dict display whose only entry for `key` is `[]`?"""
    if key is None:
        return isinstance(value, cst.List) and not value.elements
    if not isinstance(value, cst.Dict) or any(not isinstance(e, cst.DictElement) for e in value.elements):
        return False
    entries = [e.value for e in value.elements if _literal_key(e.key) == key]
    return len(entries) == 1 and isinstance(entries[0], cst.List) and not entries[0].elements


def _other_key(analysis: _FileAnalysis, read: cst.Name, key: tuple) -> bool:
    """Is `read` the dict of `d["other"]`, an item with another constant key?"""
    parent = analysis.parents.get(read)
    if not isinstance(parent, cst.Subscript) or parent.value is not read:
        return False
    other = _constant_key(parent)
    return other is not None and other != key


def _accumulates(analysis: _FileAnalysis, small: cst.CSTNode | None, use: cst.CSTNode) -> bool:
    """Is `small` a statement that adds to a running sum (`x += ...`, `x = ...x...`), with
    `use` in the value it adds?"""
    if isinstance(small, cst.AugAssign):
        return analysis.inside(use, small.value)
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        return _reads_name(small.value, small.targets[0].target.value) and analysis.inside(use, small.value)
    return False


def _accumulated(analysis: _FileAnalysis, use: cst.Name) -> cst.CSTNode:
    """The target of the accumulation that reads `use`."""
    small = _small_statement_of(analysis, use, analysis.statement_line(use))
    return small.target if isinstance(small, cst.AugAssign) else small.targets[0].target


def _new_tensor(tensor: cst.BaseExpression) -> bool:
    """Does `tensor` compute a new tensor (a call that is not a view or the receiver)?"""
    if not isinstance(tensor, cst.Call):
        return False
    method = method_name(tensor)
    return method is None or method not in SHARING_METHODS


def _constant(value: cst.BaseExpression | None) -> bool:
    """A number literal or None: a placeholder that no step can change in place."""
    return isinstance(value, (cst.Integer, cst.Float)) or (isinstance(value, cst.Name) and value.value == "None")


def _reads_name(expr: cst.CSTNode, name: str) -> bool:
    return bool(m.findall(expr, m.Name(name)))


def _small_statement_of(analysis: _FileAnalysis, node: cst.CSTNode, line) -> cst.BaseSmallStatement | None:
    if line is None:
        return None
    for ancestor in analysis.ancestors(node):
        if isinstance(ancestor, cst.BaseSmallStatement):
            return ancestor
    return None


def _impure_part(loop: StepReads, expr: cst.BaseExpression) -> cst.CSTNode | None:
    """The first part of `expr` that may have a side effect, or None."""
    if isinstance(expr, (cst.Name, cst.Integer, cst.Float, cst.SimpleString)):
        return None
    if isinstance(expr, cst.Call):
        return _impure_call(loop, expr)
    parts_of = _PARTS.get(type(expr))
    return _first_impure(loop, parts_of(expr)) if parts_of is not None else expr


def _impure_call(loop: StepReads, call: cst.Call) -> cst.CSTNode | None:
    """`call` itself unless it is a pure tensor method, builtin or torch function; else the
    first impure part of its receiver and arguments."""
    if any(arg.star for arg in call.args):
        return call
    method = method_name(call)
    if method is not None:
        if method not in PURE_TENSOR_METHODS:
            return call
        receiver = [call.func.value]
    elif loop.a.names.of(call.func) & (PURE_BUILTINS | PURE_TORCH_FUNCTIONS):
        receiver = []
    else:
        return call
    return _first_impure(loop, [*receiver, *(arg.value for arg in call.args)])


def _first_impure(loop: StepReads, parts) -> cst.CSTNode | None:
    return next((bad for bad in (_impure_part(loop, part) for part in parts) if bad is not None), None)


# What runs when an expression of these types does, by its type: it has no side effect beyond
# its parts' (a call's parts are its receiver and arguments, see `_impure_call`).
_PARTS = {
    cst.Attribute: lambda expr: [expr.value],
    cst.Subscript: subscript_parts,
    cst.BinaryOperation: lambda expr: [expr.left, expr.right],
    cst.BooleanOperation: lambda expr: [expr.left, expr.right],
    cst.Comparison: lambda expr: [expr.left, *(c.comparator for c in expr.comparisons)],
    cst.UnaryOperation: lambda expr: [expr.expression],
    cst.Tuple: lambda expr: [e.value for e in expr.elements],
    cst.List: lambda expr: [e.value for e in expr.elements],
    # every `{...}`, those nested in format specs (`{x:{width}}`) too
    cst.FormattedString: lambda expr: [p.expression for p in m.findall(expr, m.FormattedStringExpression())],
}


def _scalar_problem(loop: StepReads, expr: cst.BaseExpression) -> str | None:
    """None when `expr` is certainly a Python number (see `StepReads.is_number`)."""
    if loop.is_number(expr):
        return None
    if isinstance(expr, cst.Call) and method_name(expr) == "size" and not expr.args:
        return f"`{loop.a.code(expr)}` is a torch.Size, not a number"
    return f"perfmod cannot tell that `{loop.a.code(expr)}` is a Python number"


def _arithmetic_problem(
    loop: StepReads, expr, accumulator: str | None, operands: dict[int, str], allow_accumulator: bool
) -> str | None:
    """Why `expr` is not `+ - * /` over syncs, carriers, the accumulator and Python numbers,
    with divisions only by Python numbers that cannot be zero; None when it is."""
    if operands.get(id(expr)) == CARRIED_OPERAND:
        return None
    if id(expr) in operands:
        kind = loop.read_kind(expr)
        return None if kind in ("item", "float") else f"`{loop.a.code(expr)}` values are not summed on the device"
    if isinstance(expr, cst.Name) and expr.value == accumulator:
        return None if allow_accumulator else f"`{accumulator}` is read while it is added to"
    if isinstance(expr, cst.BinaryOperation):
        if not isinstance(expr.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)):
            return f"`{loop.a.code(expr.operator).strip()}` may round differently on the device"
        if isinstance(expr.operator, cst.Divide) and not loop.is_nonzero_number(expr.right):
            return (
                f"it is divided by `{loop.a.code(expr.right)}`, which perfmod cannot prove is a non-zero "
                "Python number (a tensor divided by zero gives inf where Python raises)"
            )
        return _arithmetic_problem(loop, expr.left, accumulator, operands, allow_accumulator) or _arithmetic_problem(
            loop, expr.right, accumulator, operands, allow_accumulator
        )
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        return _arithmetic_problem(loop, expr.expression, accumulator, operands, allow_accumulator)
    return _scalar_problem(loop, expr)


def read_tensor(sync: cst.Call) -> cst.BaseExpression:
    """The tensor a sync reads: `loss` for `loss.item()`, `loss.cpu().item()` and `float(loss)`."""
    value = sync.func.value if method_name(sync) is not None else sync.args[0].value
    while isinstance(value, cst.Call) and method_name(value) == "cpu" and not value.args:
        value = value.func.value  # the copy to the host goes: the sum stays where the tensor is
    return value


def detached(tensor: cst.BaseExpression) -> bool:
    """Is `tensor` out of the autograd graph already (a `.detach()` or `.data` in its chain)?"""
    while True:
        if isinstance(tensor, cst.Call) and method_name(tensor) is not None:
            if method_name(tensor) == "detach":
                return True
            tensor = tensor.func.value
        elif isinstance(tensor, cst.Attribute):
            if tensor.attr.value == "data":
                return True
            tensor = tensor.value
        else:
            return False


def _float_context(analysis: _FileAnalysis, use: cst.Name) -> bool:
    """Is `use` the dividend of `/` or formatted with a float presentation (`:.4f`)? There an
    int and the equal float print the same."""
    parent = analysis.parents.get(use)
    if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Divide) and parent.left is use:
        return True
    if isinstance(parent, cst.FormattedStringExpression) and parent.format_spec:
        parts = parent.format_spec
        return all(isinstance(p, cst.FormattedStringText) for p in parts) and "".join(p.value for p in parts).endswith(
            FLOAT_PRESENTATION
        )
    return False

"""Whether a value is the same on every iteration of a loop, and what a loop changes in
place: what may be computed once before the loop instead of once per iteration.

- `of(expr, region, hoisted=NO_HOISTS)`: None when `expr` gives the same value on every
  iteration of the loop `region`; else why not: a string, or (call, message) when only
  a callee perfmod cannot prove pure stands in the way (a tokenizer of a class it does
  not know, a function of the file given the same arguments). Invariant are literals,
  names not re-bound, changed in place or trained in the loop, calls of deterministic
  torch factories, pure builtins, known tokenizers (`tokenizers`), pure functions of
  the file and of the project's modules (`purity`), and conversions of tensors, of invariant parts. `hoisted` maps
  names already moved out of a loop to the loop they now sit in front of.
- `of_all(exprs, region, hoisted)`, `of_name(name, region, hoisted)`: the same for
  several expressions, and for a name; `of_bound_anew(name, region)`: for a name the loop
  binds anew each iteration, to values the same every time and not changed in place.
- `aliases(name, region)`: `name` and the names bound in `region` that may share the
  object it holds (`b = a[0]`, `b = a.view(-1)`, `b = [a]`), transitively, followed
  from its bindings through the reads they reach (`Kinds.sources`, `reached_reads`).
- `changed_in_place(name, region)`: is the object `name` holds changed in place in
  `region` (`x.add_(1)`, `x.append(y)`, `x[0] = y`, `x += y`, `f(out=x)`)?
- `attribute_changed_within(expr, region)`: why an attribute of the object `expr` holds, or of
  one it holds down a chain, is assigned there (`model.drop.p = v`), with the line.
- `attributes_assigned(receiver, region)`: is `receiver.attr = ...` (a name's, or a chain's:
  `a.b.attr = ...`) assigned there (`+=`, `del` and `setattr` too)? `attribute_assigned(attribute,
  region)`: is `a.b.attr` itself? `changed_through(expr, region)`: is the object `expr` holds
  changed through itself there (`a.b.c = v`, `a.b[i] = v`, `a.b.append(v)` change `a.b`)?
- `replaced(chain, region, ahead)`: why the object a chain reads (`self.tok`) may be another
  one, or changed, on some iteration, whatever the loop does to what holds it.
- `trained(name)`: does `name` hold a model, a parameter, or a tensor that requires
  grad (which an optimizer or autograd changes every step)?
- `makes_tensor(expr)`: is `expr` a tensor (or a tokenizer's BatchEncoding), so that
  `.to(device)` and `.long()` of it are conversions?
- `draws_or_trains(function, args)`: does a function of the file draw random numbers,
  or is it handed a model, an optimizer or parameters?
- `step_lines(loop)`: the statements of the loop's body that run once per iteration, in
  order, the blocks of `with torch.no_grad():` and autocast opened (they change how ops
  compute, not what a factory or a tokenizer gives, so a statement may leave them).
- `outermost_region(statement, line, loop, hoisted)`: the outermost loop (`loop` or one
  around it in the same function) in front of which `name = value` can run once: its
  value invariant there, the name bound nowhere else in it (or by a chain moved with it,
  `s = f(...)` then `s = s.to(device)`), read only after it, and its object (or a view
  of it, or what its attributes hold: `enc.input_ids[:, 0] += 1`) never changed in place
  there; else (None, (call, message)) when only a callee not proven pure stands in the
  way, (None, reason) or (None, None).
- `hoists(loop, skip)`: Hoists: the lines of the step that may run once, each in front of
  its outermost loop, in order; the calls only a callee not proven pure keeps in; and
  why the other invariant values do not move (`why_not(node, context)`).
- `doing_work(plan)`: the moves of a Hoists worth making, those that call something that
  does work (not only views made in constant time, `torch.from_numpy(a)`), and the values
  those read.
- `single_assignment(line)`: the `name = value` alone on `line`, or None.
- `names_in(region, name)`: the Name nodes spelled `name` in `region`.

Built once per file (FileContext.shared).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import Assignment

from codemod.analysis.call_writes import call_writes
from codemod.analysis.names import kwarg, method_name, names_read, stored_targets, subscript_parts
from codemod.analysis.scopes import PerBindings, reads_of
from codemod.analysis.tokenizers import tokenizers
from codemod.analysis.torch_facts import (
    DETERMINISTIC_FACTORIES,
    DETERMINISTIC_FUNCTIONS,
    DETERMINISTIC_TENSOR_METHODS,
    MUTATING_METHODS,
    NO_COPY_FUNCTIONS,
    NO_COPY_METHODS,
    NOT_SAME_PLACE_METHODS,
    PURE_BUILTINS,
    RANDOM_FUNCTIONS,
    RANDOM_METHODS,
    SAME_PLACE_METHODS,
    SHARING_ATTRIBUTES,
    SHARING_CALLS,
    SUBMODULE_METHODS,
    TENSOR_ATTRIBUTES,
    TRANSPARENT_BLOCKS,
)
from codemod.analysis.values import Kind

if TYPE_CHECKING:
    from codemod.context import FileContext

KEY = "variance"
NO_HOISTS: Mapping[str, cst.CSTNode] = MappingProxyType({})
LITERALS = (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString)
ANY_ATTRIBUTE = "*"  # the attribute `setattr(obj, key, v)` assigns, its name made at run time


@dataclass
class _Change:
    """An object a loop changes through itself: `changed.attribute = v` (`attribute` its
    name, ANY_ATTRIBUTE for one made at run time), or an item or method of it (None)."""

    changed: cst.BaseExpression
    attribute: str | None = None
    where: cst.CSTNode | None = None  # the target, call or `out=` that changes it (its line)


@dataclass
class Hoist:
    line: cst.SimpleStatementLine  # `name = value` alone on its line
    name: str
    region: cst.CSTNode  # the outermost loop it may run once in front of
    value: cst.BaseExpression


@dataclass
class Hoists:
    """What of a loop's step may run once in front of it (see `Variance.hoists`)."""

    moves: list[Hoist] = field(default_factory=list)  # in the order of the step
    unproven: list[tuple[cst.Call, str]] = field(default_factory=list)  # only a callee not proven pure in the way
    blocked: dict[int, str] = field(default_factory=dict)  # id(line) -> why its invariant value cannot move
    lines: list[cst.CSTNode] = field(default_factory=list)  # the step's lines

    def why_not(self, node: cst.CSTNode, context: FileContext) -> str:
        """Why the line `node` is in does not move, its value being invariant."""
        line = next((line for line in self.lines if context.inside(node, line)), None)
        return self.blocked.get(id(line), "it is part of a larger statement or a condition") if line else ""


def variance(context: FileContext) -> Variance:
    return context.shared(KEY, Variance)


class Variance:
    def __init__(self, context: FileContext) -> None:
        self.context = context
        self._scopes = context.scopes
        self._bindings = context.bindings
        self._index = context.index
        self._tokenizers = tokenizers(context)
        self._names_in: dict[int, dict[str, list[cst.Name]]] = {}  # region -> its Name nodes by spelling
        self._changes_in: dict[int, list[_Change]] = {}  # region -> what it changes through attributes, items, methods
        self._trained_by_bindings = PerBindings()

    def of(self, expr: cst.BaseExpression, region: cst.CSTNode, hoisted: Mapping[str, cst.CSTNode] = NO_HOISTS):
        """None when `expr` gives the same value on every iteration of `region`; else a
        reason: a string, or (call, message) when only an unproven callee stands in the way."""
        if isinstance(expr, LITERALS) or (isinstance(expr, cst.Name) and expr.value in ("True", "False", "None")):
            return None
        operands = _OPERANDS.get(type(expr))
        if operands is not None:
            return self.of_all(operands(expr), region, hoisted)
        if isinstance(expr, cst.Name):
            return self.of_name(expr, region, hoisted)
        if isinstance(expr, cst.Attribute):
            return self._of_attribute(expr, region, hoisted)
        if isinstance(expr, cst.Dict):
            parts = []
            for element in expr.elements:
                if not isinstance(element, cst.DictElement):
                    return "a dict built with **"
                parts += [element.key, element.value]
            return self.of_all(parts, region, hoisted)
        if isinstance(expr, cst.Call):
            return self._of_call(expr, region, hoisted)
        if isinstance(expr, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
            return self._of_comprehension(expr, region, hoisted)
        return f"`{self.context.source(expr)}` is not an expression perfmod follows"

    def _of_attribute(self, expr: cst.Attribute, region, hoisted):
        """`of` an attribute: a module attribute is invariant; one of a model, one whose
        receiver has attributes assigned in the loop, one whose object the loop changes (its
        attributes or items assigned, a changing method called on it), or one written by a call
        of the loop, is not; else it is where what it is read from is."""
        if self.context.names.of(expr):
            return None  # `torch.long`: a module attribute
        if self.context.kinds.fact(expr.value).kind is Kind.MODULE and not self._tokenizers.is_known(expr):
            # (a known tokenizer a model holds, `ctx.wrapper.tokenizer`, is none of its parameters)
            return f"`{self.context.source(expr.value)}` is a model: its parameters change every step"
        if self.context.kinds.stores_attributes_plainly(expr.value):
            return self._of_record_field(expr, region, hoisted)
        if self.attributes_assigned(expr.value, region):
            return f"`{self.context.source(expr.value)}` has attributes assigned in the loop"
        if self.changed_through(expr, region):
            return f"`{self.context.source(expr)}` is changed in place in the loop"
        written = call_writes(self.context).attribute_written(expr, region)
        if written is not None:
            return written
        return self.of(expr.value, region, hoisted)

    def _of_record_field(self, expr: cst.Attribute, region, hoisted):
        """`of` a field of a plain record (`cfg.data.prompt_len`, `stores_attributes_plainly`),
        whose other fields the loop may change: no attribute of its name, or of the name of a
        record above it, is assigned in the loop, on any object (an alias of the record
        counts); what it holds is not changed in place; no record of its chain is handed on
        in the loop; and its root name is not re-bound there."""
        context = self.context
        chain = [expr]
        while isinstance(chain[-1].value, cst.Attribute):
            chain.append(chain[-1].value)
        if not all(context.kinds.stores_attributes_plainly(link.value) for link in chain[1:]):
            return f"`{context.source(chain[-1])}` may not keep its attributes as assigned"
        for change in self._changes(region):
            if change.attribute == ANY_ATTRIBUTE or any(change.attribute == link.attr.value for link in chain):
                assigned = (
                    f"`{change.attribute}`" if change.attribute != ANY_ATTRIBUTE else "an attribute named at run time"
                )
                return f"{assigned} of `{context.source(change.changed)}` is assigned in the loop (line {context.line(change.where)})"
        if self.changed_through(expr, region):
            return f"`{context.source(expr)}` is changed in place in the loop"
        written = call_writes(context).attribute_written(expr, region)
        if written is not None:
            return written
        root = chain[-1].value
        if not isinstance(root, cst.Name) or root.value in hoisted:
            return self.of(root, region, hoisted)
        rebound = self._rebound(root, region)
        if rebound is not None:
            return rebound
        for record in [root, *reversed(chain[1:])]:
            escaped = self._handed_on(record, root, region)
            if escaped is not None:
                return escaped
        return None

    def _handed_on(self, record: cst.BaseExpression, root: cst.Name, region) -> str | None:
        """Why the object `record` (`cfg`, `cfg.data`) may be changed by code the loop hands it
        to: a read of it in `region` that is neither an attribute of it nor `getattr`'s or
        `setattr`'s first argument."""
        parents = self.context.parents
        for use in self.names_in(region, root.value):
            node = use
            while not node.deep_equals(record) and isinstance(parents.get(node), cst.Attribute):
                node = parents.get(node)
            parent = parents.get(node)
            if not node.deep_equals(record) or isinstance(parent, (cst.Attribute, cst.AssignTarget)):
                continue  # a field of it read or assigned, or (the root) bound anew: counted apart
            call = parents.get(parent) if isinstance(parent, cst.Arg) else None
            if (
                isinstance(call, cst.Call)
                and call.args[0] is parent
                and self.context.names.is_(call.func, "builtins.getattr", "builtins.setattr", "builtins.hasattr")
            ):
                continue
            return f"`{self.context.source(record)}` is handed on in the loop (line {self.context.line(node)})"
        return None

    def _rebound(self, name: cst.Name, region) -> str | None:
        """Why `name` may hold another object on some iteration of `region`: it is bound there."""
        scope = self._scopes.get(name)
        if scope is None:
            return f"`{name.value}` is not resolved"
        for assignment in scope[name.value]:
            if isinstance(assignment, Assignment) and isinstance(assignment.node, cst.CSTNode):
                if self.context.inside(assignment.node, region):
                    return f"`{name.value}` is re-bound in the loop"
        return None

    def _of_comprehension(self, expr: cst.BaseExpression, region, hoisted):
        """`of` a comprehension: invariant where the names it reads from outside are."""
        own = {
            n.value
            for f in self._index.find(cst.CompFor, within=expr)
            for n in self._index.find(cst.Name, within=f.target)
        }
        varying = self.of_all([n for n in names_read(expr) if n.value not in own], region, hoisted)
        return varying or "a comprehension (its calls are not followed)"

    def of_all(self, exprs, region, hoisted=NO_HOISTS):
        for expr in exprs:
            problem = self.of(expr, region, hoisted)
            if problem is not None:
                return problem
        return None

    def _of_call(self, call: cst.Call, region, hoisted):
        args = [a.value for a in call.args]
        if any(a.star for a in call.args):
            return "a call with *args or **kwargs"
        names = self.context.names.of(call.func)
        if names & DETERMINISTIC_FACTORIES and kwarg(call, "requires_grad") is not None:
            return "a tensor that requires grad collects gradients: made once, they would pile up across steps"
        if names & (DETERMINISTIC_FUNCTIONS | PURE_BUILTINS):
            # a factory, or a computation (`torch.tril(x)`) that is invariant where its operands are
            return self.of_all(args, region, hoisted)
        known, receiver = self._tokenizers.tokenizer_call(call)
        if known:
            return self._tokenizers.changed_in(receiver, region) or self.of_all([receiver, *args], region, hoisted)
        callee = self.context.kinds.local_callee(call)
        if self.context.purity.pure_callee(call):
            # a pure function or method of this file or of the project's modules: invariant where
            # its receiver and arguments are
            receiver = call.func.value if isinstance(call.func, cst.Attribute) else call.func
            return self.of_all([receiver, *args], region, hoisted)
        method = method_name(call)
        if (
            method is not None
            and (
                method in DETERMINISTIC_TENSOR_METHODS
                or (
                    not method.endswith("_")
                    and method not in RANDOM_METHODS
                    and method not in NOT_SAME_PLACE_METHODS
                    and not method.startswith("_")
                )
            )
            and self.makes_tensor(call.func.value)
        ):
            return self.of_all([call.func.value, *args], region, hoisted)
        changes = call_writes(self.context).changes(call) if callee is not None else None
        if changes is not None:
            return f"each call of `{self.context.source(call.func)}` may change {changes}, so it is not pure"
        if receiver is not None and self.of_all([*args], region, hoisted) is None:
            # a tokenizer-shaped call with invariant arguments on a receiver perfmod cannot vouch for
            return (
                call,
                f"`{self.context.source(call.func)}` gets the same arguments on every training step, but perfmod "
                f"cannot prove `{self.context.source(receiver)}` is a known tokenizer (and so pure); if it is, "
                "move the call before the loop",
            )
        callee = self.context.kinds.local_callee(call)
        if (
            callee is not None
            and isinstance(call.func, cst.Name)
            and self.of_all([*args], region, hoisted) is None
            and not self.draws_or_trains(callee, args)
        ):
            # a function of this file given the same arguments every step
            return (
                call,
                f"`{self.context.source(call.func)}(...)` gets the same arguments on every training step, but "
                f"perfmod cannot prove `{call.func.value}` is pure (no side effects, no randomness); if it is, "
                "compute it once before the loop",
            )
        return f"`{self.context.source(call.func)}` is not known to be pure"

    def draws_or_trains(self, function: cst.FunctionDef, args: list[cst.BaseExpression]) -> bool:
        """Does `function` draw random numbers (a new batch each call), or is it handed a
        model, an optimizer or a model's parameters (whose values and gradients the steps
        change)?"""
        kinds = self.context.kinds
        if any(kinds.fact(arg).kind in (Kind.MODULE, Kind.OPTIMIZER) for arg in args):
            return True
        if any(self.context.training.parameter_models(arg) for arg in args):
            return True
        for call in self._index.find(cst.Call, within=function.body):
            for name in self.context.names.of(call.func):
                if name.startswith(("random.", "numpy.random.")) or name in RANDOM_FUNCTIONS or "Generator" in name:
                    return True
            if kinds.fact(call.func).kind is Kind.MODULE:
                return True
        return False

    def doing_work(self, plan: Hoists) -> list[Hoist]:
        """The moves of `plan` worth making: those that call something that does work (a
        tokenizer, a tensor factory, a conversion; not only views made in constant time,
        `torch.from_numpy(a)`, `x.unsqueeze(1)`), and the values such a move reads."""
        kept: list[Hoist] = []
        read: set[str] = set()
        for hoist in reversed(plan.moves):
            if hoist.name in read or any(self._works(call) for call in self._index.find(cst.Call, within=hoist.value)):
                kept.append(hoist)
                read |= {n.value for n in names_read(hoist.value)}
        return kept[::-1]

    def _works(self, call: cst.Call) -> bool:
        """Does `call` do work that grows with its data: anything but a view a torch function
        or a tensor's method makes in constant time?"""
        names = self.context.names.of(call.func)
        if names:
            return not names <= NO_COPY_FUNCTIONS
        return method_name(call) not in NO_COPY_METHODS or not self.makes_tensor(call.func.value)

    def makes_tensor(self, expr: cst.BaseExpression) -> bool:
        """Is `expr` a tensor (or a tokenizer's BatchEncoding), so `.to(device)`, `.long()` ... are conversions?"""
        if self.context.kinds.fact(expr).kind is Kind.TENSOR:
            return True
        while isinstance(expr, cst.Subscript):
            expr = expr.value
        if self.context.kinds.fact(expr).kind is Kind.TENSOR:
            return True
        if isinstance(expr, cst.Call):
            names = self.context.names.of(expr.func)
            return (
                bool(names & DETERMINISTIC_FACTORIES)
                or self._tokenizers.tokenizer_call(expr)[0]
                or (method_name(expr) in DETERMINISTIC_TENSOR_METHODS and self.makes_tensor(expr.func.value))
            )
        return False

    def of_name(self, name: cst.Name, region, hoisted=NO_HOISTS):
        if name.value in hoisted:
            hoisted_at = hoisted[name.value]
            return (
                None
                if self.context.inside(region, hoisted_at)
                else f"`{name.value}` is hoisted only out of an inner loop"
            )
        rebound = self._rebound(name, region)
        if rebound is not None:
            return rebound
        changed = self.in_place_change(name.value, region)
        if changed is not None:
            return changed
        written = call_writes(self.context).name_written(name, region)
        if written is not None:
            return written
        if self.trained(name):
            return f"`{name.value}` is trained: the optimizer changes it in place every step"
        return None

    def of_bound_anew(self, name: cst.Name, region: cst.CSTNode) -> str | None:
        """`of_name` for a name the loop `region` binds anew before it reads it: None when
        every binding that reaches the read is in the loop and gives a value the same on
        every iteration (`inputs = torch.from_numpy(x_train)`), and nothing there changes
        that object in place (`prompt = [text]`, then `prompt.append(...)`, is not the same);
        else why not."""
        sources = self.context.kinds.value_sources(name)
        for value in sources:
            if value is None or not self.context.inside(value, region):
                return f"`{name.value}` is not bound anew in the loop"
            varying = self.of(value, region)
            if varying is not None:
                return varying
        if not sources:
            return f"`{name.value}` is not resolved"
        return self.in_place_change(name.value, region)

    def replaced(self, chain: cst.BaseExpression, region: cst.CSTNode, ahead: cst.For | None = None) -> str | None:
        """Why the object the chain `chain` reads (`self.tok`, `ctx.wrapper.tokenizer`) may be
        another one, or changed, on some iteration of `region`: changed through itself there
        (`changed_through`), a link of the chain assigned (`attribute_assigned`, or by a call
        of the file: `call_writes`), its root name re-bound (a root that is not a name: where
        it varies, `of`). None when it is the same object, whatever else the loop does to
        what holds it (the optimizer changes a model's parameters, not the tokenizer it
        keeps). The target of `ahead`, a loop inside `region`, is bound in front of the
        chain on each of its passes (`for ctx in contexts:`)."""
        if self.changed_through(chain, region):
            return f"`{self.context.source(chain)}` is changed in place in the loop"
        node = chain
        while isinstance(node, cst.Attribute):
            if self.attribute_assigned(node, region):
                return f"`{self.context.source(node)}` is assigned in the loop"
            written = call_writes(self.context).attribute_written(node, region)
            if written is not None:
                return written
            node = node.value
        if not isinstance(node, cst.Name):
            return self.of(node, region)
        if ahead is not None and isinstance(ahead.target, cst.Name) and node.value == ahead.target.value:
            return None
        if self.context.kinds.bindings_in(region, node.value):
            return f"`{node.value}` is re-bound in the loop"
        return None

    def trained(self, name: cst.Name) -> bool:
        """Does `name` hold a model, a parameter, or a tensor that requires grad, which the
        optimizer changes in place (or autograd would see used in two steps)?"""
        if self.context.kinds.fact(name).kind is Kind.MODULE:
            return True
        scope = self._scopes.get(name)
        return scope is not None and self._trained_bindings(scope[name.value])

    def _trained_bindings(self, assignments) -> bool:
        """`_trained` for what the bindings (a scope's set of them for one name) hold."""
        return self._trained_by_bindings.get(assignments, self._compute_trained_bindings)

    def _compute_trained_bindings(self, assignments) -> bool:
        kinds = self.context.kinds
        for assignment in assignments:
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.CSTNode):
                statement = self._bindings.statement(node)
                value = getattr(statement, "value", None)
                if isinstance(value, cst.Call) and (
                    self.context.names.is_(value.func, "torch.nn.Parameter", "torch.nn.parameter.Parameter")
                    or kwarg(value, "requires_grad") is not None
                ):
                    return True
        for access in reads_of(assignments):
            parent = self.context.parents.get(access.node)
            if isinstance(parent, cst.Attribute) and parent.attr.value == "requires_grad_":
                return True
            for ancestor in self._index.ancestors(access.node):
                if isinstance(ancestor, cst.Call) and kinds.fact(ancestor).kind is Kind.OPTIMIZER:
                    params = kwarg(ancestor, "params") or (ancestor.args[0] if ancestor.args else None)
                    if params is not None and self._index.inside(access.node, params):
                        return True  # `torch.optim.Adam([x], ...)`
                if isinstance(ancestor, (cst.BaseStatement, cst.Lambda)):
                    break
        return False

    def aliases(self, name: cst.Name, region: cst.CSTNode) -> set[str]:
        """`name` and the names bound in `region` to values that may share the object or
        storage `name` holds there (`b = a`, `b = a[0]`, `b = a.view(-1)`, `b = a.to(device)`,
        `b = [a]`), transitively: from the bindings `name` may hold (`Kinds.sources`), through
        the reads in `region` each reaches (`Kinds.reached_reads`). A result that is a new
        object (`a.clone()`, `a + 1`, `model(a)`, `a.item()`) is not one."""
        kinds = self.context.kinds
        found = {id(b): b for b in kinds.sources(name)}
        todo = list(found.values())
        while todo:
            for read in kinds.reached_reads(todo.pop()):
                if not self._index.inside(read, region):
                    continue
                for target in self._sharing_targets(read):
                    for binding in kinds.sources(target):
                        if id(binding) not in found:
                            found[id(binding)] = binding
                            todo.append(binding)
        return {name.value} | {binding.name for binding in found.values()}

    def _sharing_targets(self, read: cst.Name) -> list[cst.Name]:
        """The names an assignment binds to a value that may be (a part or view of) the
        object `read` holds: `b = read[0]`, `b = [read]`, `a, b = read, c` gives `a`."""
        parents = self.context.parents
        node, parent = read, parents.get(read)
        while True:
            if isinstance(parent, cst.Attribute) and parent.value is node:
                call = parents.get(parent)
                if parent.attr.value in SHARING_ATTRIBUTES:
                    node = parent
                elif parent.attr.value in SHARING_CALLS and isinstance(call, cst.Call) and call.func is parent:
                    node = call
                else:
                    return []
            elif _holds(parent, node):
                node = parent
            else:
                break
            parent = parents.get(node)
        if not (isinstance(parent, cst.Assign) and parent.value is node):
            return []
        return [
            target
            for assign_target in parent.targets
            for target, value in _assigned_pairs(assign_target.target, node)
            if self._index.inside(read, value)
        ]

    def changed_in_place(self, name: str, region: cst.CSTNode) -> bool:
        """Is the object `name` holds changed in place in `region`: `x.add_(1)`, `x.append(y)`,
        `x[0] = y`, `x.attr = y`, `x += y`, `del x[0]`, `f(out=x)`, also through `x[...]` and views
        (`x.numpy()[:] = y`), or may it be: handed to a library call not known to leave its
        arguments alone (`random.shuffle(x)`)?"""
        return self.in_place_change(name, region) is not None

    def in_place_change(self, name: str, region: cst.CSTNode) -> str | None:
        """Why the object `name` holds may change in place in `region` (`changed_in_place`),
        as a sentence: changed there, handed to a call that may change it, or changed by a
        function of the file the loop calls (`call_writes`); None when it does not."""
        uses = self.names_in(region, name)
        for use in uses:
            changed = self._change_through(use, name)
            if changed is not None:
                return changed
        whole = [u for u in uses if not (isinstance(self.context.parents.get(u), cst.Attribute))]
        return call_writes(self.context).name_written(whole[0], region) if whole else None

    def _change_through(self, use: cst.Name, name: str) -> str | None:
        """Why the object `name` holds may change in place through `use`, one of its reads
        in the loop: changed there, or handed to a call that may change it."""
        climbed = self._climb_memory(use)
        if climbed is None:
            return f"`{name}` is changed in place in the loop"
        node, parent, shared = climbed
        if _changed_at(use, node, parent):
            return f"`{name}` is changed in place in the loop"
        call = self.context.parents.get(parent)
        if (
            shared
            and self.context.kinds.fact(use).kind is not Kind.DEVICE  # a device is never changed
            and isinstance(parent, cst.Arg)
            and isinstance(call, cst.Call)
            and not self._leaves_arguments_alone(call)
        ):
            return (
                f"`{name}` is handed to `{self.context.source(call.func)}` in the loop (line "
                f"{self.context.line(call)}), which perfmod does not know to leave its arguments unchanged"
            )
        return None

    def _climb_memory(self, use: cst.Name) -> tuple[cst.CSTNode, cst.CSTNode | None, bool] | None:
        """From `use` up through the expressions that still share the memory of the object
        it holds (items, views, `.numpy()`, casts): the last of them, its parent, and whether
        it may hold (part of) the object itself rather than a new value computed from it.
        None when a method or an attribute assignment on the way changes it (`x.add_(1)`,
        `x[0].append(y)`, `x.attr = y`)."""
        node, parent, shared = use, self.context.parents.get(use), True
        while True:
            if isinstance(parent, cst.Attribute) and parent.value is node and self._changes_object(parent):
                return None
            step = self._memory_step(node, parent)
            if step is None:
                return node, parent, shared
            node, still_shared = step
            shared = shared and still_shared
            parent = self.context.parents.get(node)

    def _changes_object(self, attribute: cst.Attribute) -> bool:
        """Does `attribute` change the object it is read from: a call of an in-place method
        (`x.add_(1)`, `x.append(y)`) or an assignment to it (`x.attr = y`)?"""
        parent = self.context.parents.get(attribute)
        if isinstance(parent, cst.Call) and parent.func is attribute:
            return _mutating(attribute.attr.value)
        # (`y += x.attr` reads the attribute: only `x.attr += y` is written to)
        return isinstance(parent, cst.AssignTarget) or isinstance(parent, cst.AugAssign) and parent.target is attribute

    def _memory_step(self, node: cst.CSTNode, parent: cst.CSTNode | None) -> tuple[cst.CSTNode, bool] | None:
        """`parent` of `node` when it still shares the memory of the object `node` holds: an
        item of it (`node[i]`), a view attribute (`node.data`, `node.T`), or a call of a view
        or cast method on it, with whether it is (part of) the object itself rather than a
        copy (`SHARING_CALLS`); None otherwise."""
        if isinstance(parent, cst.Subscript) and parent.value is node:
            return parent, True
        if not (isinstance(parent, cst.Attribute) and parent.value is node):
            return None
        if parent.attr.value in SHARING_ATTRIBUTES:
            return parent, True
        call, method = self.context.parents.get(parent), parent.attr.value
        if (
            isinstance(call, cst.Call)
            and call.func is parent
            and (method in SAME_PLACE_METHODS or method in SHARING_CALLS)
        ):
            return call, method in SHARING_CALLS  # views, `.numpy()`, casts
        return None

    def _leaves_arguments_alone(self, call: cst.Call) -> bool:
        """Is `call` known to change none of its arguments (`Kinds.leaves_arguments_alone`,
        a known tokenizer, a pure function of the project's modules, a method of a tensor
        `makes_tensor` sees)? A function of this file, and the forward of a model of its own
        class, are followed by `call_writes`."""
        if self.context.kinds.leaves_arguments_alone(call) or self._tokenizers.tokenizer_call(call)[0]:
            return True
        if self.context.purity.pure_call(call):
            return True
        return method_name(call) is not None and self.makes_tensor(call.func.value)

    def attributes_assigned(self, receiver: cst.BaseExpression, region: cst.CSTNode) -> bool:
        """Is an attribute of the object `receiver` (a name, or a chain `a.b`) assigned in
        `region`: `receiver.attr = v`, `receiver.attr += v`, `del receiver.attr`, or
        `setattr(receiver, ...)`?"""
        return any(
            change.attribute is not None and change.changed.deep_equals(receiver) for change in self._changes(region)
        )

    def attribute_assigned(self, attribute: cst.Attribute, region: cst.CSTNode) -> bool:
        """Is `attribute` (`a.b.c`) itself assigned in `region` (`attributes_assigned`, under
        its name or a name made at run time: `setattr(a.b, key, v)`)?"""
        return any(
            change.attribute in (attribute.attr.value, ANY_ATTRIBUTE) and change.changed.deep_equals(attribute.value)
            for change in self._changes(region)
        )

    def attribute_changed_within(self, expr: cst.BaseExpression, region: cst.CSTNode) -> str | None:
        """Why an attribute of the object `expr` holds (a name, or a chain `a.b`), or of an
        object it holds down a chain of attributes and items, may be assigned in `region`:
        `model.drop.p = v`, `model.blocks[0].scale = v`, `setattr(model.head, key, v)`,
        `del model.cache`, `m.p = v` for `m` in `model.modules()` there; None when none is. Writes into what it holds
        (`model.weight.data.mul_(0.9)`, `model.mask[0] = 1`, `model.fc.weight.grad = None`)
        are not attribute assignments."""
        for change in self._changes(region):
            if change.attribute is None or change.attribute in TENSOR_ATTRIBUTES:
                continue  # `model.fc.weight.grad = None` writes what a parameter holds
            node = _down_to(change.changed, expr)
            if node.deep_equals(expr) or isinstance(node, cst.Name) and self._submodule_of(node, expr):
                assigned = (
                    f"`{self.context.source(change.changed)}.{change.attribute}`"
                    if change.attribute != ANY_ATTRIBUTE
                    else f"an attribute of `{self.context.source(change.changed)}`"
                )
                return f"{assigned} is assigned in the loop (line {self.context.line(change.where)})"
        return None

    def _submodule_of(self, name: cst.Name, module: cst.BaseExpression) -> bool:
        """Is `name` bound to a submodule of `module` (a module's tree): the target of a loop
        over `module.modules()` (`for key, m in module.named_children():`), or
        `module.get_submodule(path)`?"""
        part = self.context.kinds.module_part(name)
        return part is not None and part[1] in SUBMODULE_METHODS and part[0].deep_equals(module)

    def changed_through(self, expr: cst.BaseExpression, region: cst.CSTNode) -> bool:
        """Is the object `expr` holds (a name, or a chain `a.b`) changed in `region` through
        itself: an attribute or item of it assigned or deleted, a changing method called on
        it or handed it as `out=`, and so on down what it holds (`a.b.c.d = v`,
        `a.b.c[i] = v`, `a.b.c.append(v)` all change `a.b`)?"""
        return any(_down_to(change.changed, expr).deep_equals(expr) for change in self._changes(region))

    def _changes(self, region: cst.CSTNode) -> list[_Change]:
        """The objects `region` changes through an attribute, item or method of them, in its
        own text (one list per region)."""
        found = self._changes_in.get(id(region))
        if found is None:
            found = self._changes_in[id(region)] = self._find_changes(region)
        return found

    def _find_changes(self, region: cst.CSTNode) -> list[_Change]:
        index, found = self._index, []
        targets = [t.target for t in index.find(cst.AssignTarget, within=region)]
        targets += [s.target for s in index.find((cst.AugAssign, cst.AnnAssign, cst.Del), within=region)]
        for target in stored_targets(targets):
            if isinstance(target, cst.Attribute):
                found.append(_Change(target.value, target.attr.value, target))
            elif isinstance(target, cst.Subscript):
                found.append(_Change(target.value, where=target))
        for call in index.find(cst.Call, within=region):
            if isinstance(call.func, cst.Attribute) and _mutating(call.func.attr.value):
                found.append(_Change(call.func.value, where=call))
            elif self.context.names.is_(call.func, "builtins.setattr", "builtins.delattr") and len(call.args) >= 2:
                name = call.args[1].value
                attribute = name.evaluated_value if isinstance(name, cst.SimpleString) else ANY_ATTRIBUTE
                found.append(_Change(call.args[0].value, attribute, call))
            out = kwarg(call, "out")
            if out is not None:
                found.append(_Change(out.value, where=out))
        return found

    def names_in(self, region: cst.CSTNode, name: str) -> list[cst.Name]:
        """The Name nodes spelled `name` in `region` (one table per region)."""
        table = self._names_in.get(id(region))
        if table is None:
            table = self._names_in[id(region)] = defaultdict(list)
            for node in self._index.find(cst.Name, within=region):
                table[node.value].append(node)
        return table.get(name, [])

    def hoists(self, loop: cst.CSTNode, skip: Callable[[cst.CSTNode], bool]) -> Hoists:
        """The step lines of `loop` (not `skip`ped) that are `name = value` and may run once,
        each in front of the outermost loop `outermost_region` gives, in order (a line may
        read the names the ones before it moved); and why the others do not."""
        found = Hoists(lines=self.step_lines(loop))
        hoisted: dict[str, cst.CSTNode] = {}  # moved name -> loop it now sits in front of
        for line in found.lines:
            statement = single_assignment(line)
            if statement is None or skip(line):
                continue
            name = statement.targets[0].target.value
            region, obstacle = self.outermost_region(statement, line, loop, hoisted)
            if region is not None:
                hoisted[name] = region
                found.moves.append(Hoist(line, name, region, statement.value))
            elif isinstance(obstacle, tuple):
                found.unproven.append(obstacle)
            elif obstacle is not None:
                found.blocked[id(line)] = obstacle
        return found

    def step_lines(self, loop: cst.CSTNode) -> list[cst.CSTNode]:
        """The statements of the loop body that run once per step, in order, the blocks of
        `with torch.no_grad():` / autocast opened (a statement may leave them)."""
        found = []

        def walk(lines):
            for line in lines:
                if (
                    isinstance(line, cst.With)
                    and isinstance(line.body, cst.IndentedBlock)
                    and all(
                        isinstance(item.item, cst.Call)
                        and (
                            self.context.names.of(item.item.func) & TRANSPARENT_BLOCKS
                            or method_name(item.item) == "autocast"
                        )
                        for item in line.items
                    )
                ):
                    walk(line.body.body)
                else:
                    found.append(line)

        walk(_lines(loop.body))
        return found

    def outermost_region(
        self, statement: cst.Assign, line: cst.CSTNode, loop: cst.CSTNode, hoisted: dict[str, cst.CSTNode]
    ):
        """The outermost loop (the step loop or one around it, same function) out of which
        `statement` can move; else (None, (node, message)) when a report is due, or (None, None)."""
        name = statement.targets[0].target.value
        best, obstacle = None, None
        for region in [loop, *self._index.enclosing_loops(loop)]:
            problem = self.of(statement.value, region, hoisted)
            if problem is not None:
                if best is None and isinstance(problem, tuple):
                    obstacle = problem
                break
            problem = self._target_problem(name, statement, line, region, hoisted)
            if problem is not None:
                if best is None:
                    obstacle = problem
                break
            best = region
        if best is None:
            return None, obstacle
        return best, None

    def _target_problem(self, name: str, statement: cst.Assign, line: cst.CSTNode, region: cst.CSTNode, hoisted: dict):
        """Can `name = value` run once before `region`: bound nowhere else in it (or only by
        a chain hoisted with it, `s = f(...)` then `s = s.to(device)`), read in it only after
        those statements, and its value (or what its attributes hold) never changed in place
        there?"""
        scope = self._scopes.get(statement)
        others = [a for a in self.context.kinds.bindings_in(region, name) if a.node is not statement.targets[0].target]
        chain = [statement]
        if others:
            chain = self._rebinding_chain(name, statement, region, hoisted)
            if chain is None:
                return f"`{name}` is bound more than once in the loop"
        last = self._bindings.statement(chain[-1]) if len(chain) > 1 else line
        end = self.context.positions[self.context.parents.get(last) if isinstance(last, cst.Assign) else last].end
        for access in scope.accesses[name]:
            # Only the reads in the loop are placed: the position of a read elsewhere in the
            # scope (a module-level name is read all over the file) would generate its code.
            if not self.context.inside(access.node, region):
                continue
            if any(self.context.inside(access.node, member.value) for member in chain[1:]):
                continue  # the chain's next statement reading the one before
            start = self.context.positions[access.node].start
            if (start.line, start.column) < (end.line, end.column):
                return f"`{name}` is read in the loop before it is bound"
        for alias in sorted(self.aliases(statement.targets[0].target, region)):
            changed = self.in_place_change(alias, region)
            if changed is None and self.changed_through(cst.Name(alias), region):
                # (what it holds changed: `enc.input_ids[:, 0] = bos` changes `enc` too)
                changed = f"`{alias}` is changed in place in the loop"
            if changed is not None and alias == name:
                return f"{changed}, and hoisted it would carry the change to the next step"
            if changed is not None:
                return f"`{alias}`, computed from `{name}` (possibly a view of it), may change: {changed}"
        return None

    def _rebinding_chain(
        self, name: str, statement: cst.Assign, region: cst.CSTNode, hoisted: dict
    ) -> list[cst.Assign] | None:
        """The statements binding `name` in `region`, in order, when they are one chain an
        expert moves out together: `name = value` alone on lines of one block, each after
        the first computed from invariants and the one before (`s = s.to(device)`); the
        first is `statement`, or was moved out already. None otherwise."""
        members = []
        for assignment in self.context.kinds.bindings_in(region, name):
            node = assignment.node
            target, assign = self.context.parents.get(node), None
            if isinstance(target, cst.AssignTarget):
                assign = self.context.parents.get(target)
            line = self.context.parents.get(assign) if isinstance(assign, cst.Assign) else None
            if line is None or single_assignment(line) is not assign:
                return None
            members.append((self.context.index.order(line), line, assign))
        members.sort(key=lambda member: member[0])  # document order: the order of their lines
        if len({id(self.context.parents.get(line)) for _, line, _ in members}) != 1:
            return None  # not one block: a branch may skip one of them
        chain = [assign for _, _, assign in members]
        if chain[0] is not statement and name not in hoisted:
            return None
        with_name = {**hoisted, name: region}
        if any(self.of(assign.value, region, with_name) is not None for assign in chain[1:]):
            return None
        return chain


def _mutating(method: str) -> bool:
    """Does a method named `method` change its receiver (`append`, `add_`)?"""
    return method in MUTATING_METHODS or (method.endswith("_") and not method.startswith("_"))


def _lines(block: cst.BaseSuite) -> list[cst.CSTNode]:
    return list(block.body) if isinstance(block, cst.IndentedBlock) else []


def single_assignment(line: cst.CSTNode) -> cst.Assign | None:
    """`name = value` alone on its line."""
    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
        return None
    statement = line.body[0]
    if (
        isinstance(statement, cst.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Name)
    ):
        return statement
    return None


def _changed_at(use: cst.Name, node: cst.CSTNode, parent: cst.CSTNode | None) -> bool:
    """Is the object `use` holds changed where `node` (`use`, or an item or view of it)
    sits in `parent`: an item assigned (`x[0] = y`), augmented (`x += y`), deleted
    (`del x[0]`), or the `out=` of a call?"""
    if isinstance(parent, cst.AssignTarget) and node is not use:
        return True  # `x[0] = y`
    if isinstance(parent, cst.AugAssign) and parent.target is node:
        return True
    return isinstance(parent, cst.Del) or (
        isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "out"
    )


def _formatted_parts(expr: cst.FormattedString) -> list[cst.BaseExpression]:
    return [p.expression for p in expr.parts if isinstance(p, cst.FormattedStringExpression)]


# The parts the value of a compound expression is computed from, by its type: it is
# invariant where they all are.
_OPERANDS: dict[type, Callable[[cst.BaseExpression], list[cst.BaseExpression]]] = {
    cst.ConcatenatedString: lambda e: [e.left, e.right],
    cst.FormattedString: _formatted_parts,
    cst.Subscript: subscript_parts,
    cst.List: lambda e: [element.value for element in e.elements],
    cst.Tuple: lambda e: [element.value for element in e.elements],
    cst.Set: lambda e: [element.value for element in e.elements],
    cst.BinaryOperation: lambda e: [e.left, e.right],
    cst.UnaryOperation: lambda e: [e.expression],
    cst.BooleanOperation: lambda e: [e.left, e.right],
    cst.Comparison: lambda e: [e.left, *(target.comparator for target in e.comparisons)],
    cst.IfExp: lambda e: [e.test, e.body, e.orelse],
}


def _holds(parent: cst.CSTNode | None, node: cst.CSTNode) -> bool:
    """Does `parent`'s value hold `node`'s object (a part, an element, a branch of it)?"""
    if isinstance(parent, (cst.Subscript, cst.Element, cst.StarredElement, cst.DictElement)):
        return parent.value is node
    if isinstance(parent, cst.IfExp):
        return node is not parent.test
    if isinstance(parent, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
        return parent.elt is node or parent.for_in is node
    if isinstance(parent, cst.DictComp):
        return parent.value is node or parent.for_in is node
    if isinstance(parent, cst.CompFor):
        return parent.iter is node or parent.inner_for_in is node  # `[y for x in read for y in x]`
    return isinstance(parent, (cst.List, cst.Tuple, cst.Set, cst.Dict))


def _assigned_pairs(target: cst.BaseExpression, value: cst.BaseExpression) -> list[tuple[cst.Name, cst.BaseExpression]]:
    """(name, the value it gets) for `target = value`; pairwise through a tuple of both,
    every name with the whole value otherwise."""
    if isinstance(target, cst.Name):
        return [(target, value)]
    if isinstance(target, (cst.Tuple, cst.List)):
        if (
            isinstance(value, (cst.Tuple, cst.List))
            and len(value.elements) == len(target.elements)
            and not any(isinstance(e, cst.StarredElement) for e in (*value.elements, *target.elements))
        ):
            return [pair for t, v in zip(target.elements, value.elements) for pair in _assigned_pairs(t.value, v.value)]
        return [pair for t in target.elements for pair in _assigned_pairs(t.value, value)]
    return []


def _down_to(node: cst.BaseExpression, expr: cst.BaseExpression) -> cst.BaseExpression:
    """Down the chain of attributes and items `node` is (`a.b[i].c`), the link spelled as
    `expr` (`a.b`), else the chain's base (`a`)."""
    while isinstance(node, (cst.Attribute, cst.Subscript)) and not node.deep_equals(expr):
        node = node.value
    return node

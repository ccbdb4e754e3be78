"""Which code resets the gradients of a model's parameters by hand, and what in a file
tells a zero `.grad` from a missing one. The one place that answers it for
`zero_grad(set_to_none=False)` and the loops and comprehensions that zero-fill `.grad`.

`grad_resets(context)` (built once per file, FileContext.shared) answers:

- `reset_loop_receiver(loop)`: `model` for `for p in model.parameters(): p.grad.zero_()`
  (also `named_parameters()`), `opt` for the same over `opt.param_groups`; None when the
  loop does anything else or its variable is read after it;
- `resets(block, parameter)`: does `block` only reset `<parameter>.grad` in place, zeroing
  it at least once (`.zero_()`, `.fill_(0)`, `= torch.zeros_like(p)`, under `if p.grad is
  not None:` or after `if p.grad is None: continue`)?
- `grad_reads(node)`: the `.grad` attributes under `node` that are read;
  `read_before_backward(site, region, backwards)`: one read between a reset and the next
  backward (the region read as a cycle), where a `.grad` set to None would be read;
- `step_without_none_check(optimizer)`: an optimizer class of the file whose `step()` reads
  `.grad` without checking it for None;
- `zero_step_changes_nothing(optimizers, site)`: stepping a zero gradient leaves every
  parameter and state as it is (plain SGD, no momentum or weight decay in any group), and
  nothing else in the file reads `.grad` or takes a norm over the gradients;
  `zero_step_differs(optimizers, site)` says why not (None when it changes nothing):
  also an optimizer configured after it is built (`configured_after`), and a `.grad`
  read in a function of the project that the file calls (Project.grad_reader);
- `configured_after(optimizer)`: a place after its construction where an optimizer's
  groups may get momentum or weight decay: a write to a key of `opt.param_groups[...]`
  other than the learning rate, `opt.add_param_group({... "momentum": 0.9})`,
  `opt.load_state_dict(...)`, `opt.defaults`, the optimizer handed to a call (other than
  a learning-rate-only scheduler, torch_facts.LR_ONLY_SCHEDULERS, or a GradScaler's
  `step`/`unscale_`) or bound to another name.

Module functions: `is_not_none_check(test, p)` (`p.grad is not None`), `is_plain_reference(expr)`
(`model`, `self.model`: the same when evaluated twice), `assigns_grads(loop)`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.names import kwarg, method_name, number_value, positional
from codemod.analysis.project import project_of
from codemod.analysis.torch_facts import (
    GRAD_NORMS,
    GRAD_RESET_METHODS,
    GRAD_SCALER_NAMES,
    GRAD_ZEROING_METHODS,
    LR_GROUP_KEYS,
    LR_ONLY_SCHEDULERS,
)
from codemod.analysis.values import Kind, values

if TYPE_CHECKING:
    from codemod.analysis.training import OptimizerBuild
    from codemod.context import FileContext

KEY = "grad_resets"
OPTIMIZER_MOVES = (
    "a parameter that gets no gradient in some step is then skipped by the optimizer "
    "instead of stepped with a zero gradient (which momentum, Adam's moments and weight decay move)"
)
MISSING_GRAD = "a parameter that gets no gradient in some step has None for its `.grad`, which is read"
GRAD = m.Attribute(attr=m.Name("grad"))


def grad_resets(context: FileContext) -> GradResets:
    return context.shared(KEY, GradResets)


class GradResets:
    """The gradient resets of one file; each look-up computed when asked."""

    def __init__(self, context: FileContext) -> None:
        self.context = context

    def resets(self, block: cst.BaseSuite, parameter: str) -> bool:
        """Does `block` only reset `<parameter>.grad` in place, zeroing it at least once?"""
        return _only_resets(block, parameter, self._zeros_like)

    def reset_loop_receiver(self, loop: cst.For) -> cst.BaseExpression | None:
        """`model` for `for p in model.parameters(): p.grad.zero_()`, `opt` for the
        same over `opt.param_groups`; None when the loop does anything else."""
        if loop.orelse is not None or loop.asynchronous is not None:
            return None
        kinds = self.context.kinds
        iterable = loop.iter
        if isinstance(iterable, cst.Attribute) and iterable.attr.value == "param_groups":
            inner = _only_statement(loop.body)
            if not (isinstance(loop.target, cst.Name) and isinstance(inner, cst.For) and inner.orelse is None):
                return None
            if not m.matches(
                inner.iter,
                m.Subscript(
                    value=m.Name(loop.target.value),
                    slice=[
                        m.SubscriptElement(slice=m.Index(value=m.SimpleString("'params'") | m.SimpleString('"params"')))
                    ],
                ),
            ):
                return None
            receiver, parameter, body = iterable.value, inner.target, inner.body
            allowed = (Kind.OPTIMIZER, Kind.UNKNOWN)
        elif (
            isinstance(iterable, cst.Call)
            and method_name(iterable) in ("parameters", "named_parameters")
            and not iterable.args
        ):
            receiver, parameter, body = iterable.func.value, loop.target, loop.body
            if method_name(iterable) == "named_parameters":
                if not (isinstance(parameter, cst.Tuple) and len(parameter.elements) == 2):
                    return None
                parameter = parameter.elements[1].value
            allowed = (Kind.MODULE, Kind.UNKNOWN)
        else:
            return None
        if not isinstance(parameter, cst.Name) or not is_plain_reference(receiver):
            return None
        if kinds.fact(receiver).kind not in allowed or not self.resets(body, parameter.value):
            return None
        if self._used_after(loop, parameter):
            return None
        return receiver

    def _zeros_like(self, value: cst.BaseExpression, parameter: str) -> bool:
        """`torch.zeros_like(p)` (or `p.new_zeros(p.shape)` / `torch.zeros_like(p.data)`)."""
        if not isinstance(value, cst.Call) or not value.args:
            return False
        first = value.args[0].value
        if m.matches(first, m.Attribute(value=m.Name(parameter), attr=m.Name("data"))):
            first = first.value
        if self.context.names.is_(value.func, "torch.zeros_like"):
            return m.matches(first, m.Name(parameter)) and len(value.args) == 1
        return (
            method_name(value) == "new_zeros"
            and m.matches(value.func.value, m.Name(parameter))
            and m.matches(first, m.Attribute(value=m.Name(parameter), attr=m.Name("shape")))
        )

    def _used_after(self, loop: cst.For, parameter: cst.Name) -> bool:
        """Is the loop variable read after the loop (it keeps the last parameter)?"""
        assignments = self.context.bindings.assignments(parameter) or ()
        others = [a.node for a in assignments if a.node is not parameter]
        for assignment in assignments:
            if assignment.node is not parameter:
                continue
            return any(
                not self.context.inside(access.node, loop) and not self._rebound_around(access.node, others)
                for access in assignment.references
            )
        return False

    def _rebound_around(self, read: cst.CSTNode, others: list[cst.CSTNode]) -> bool:
        """Is `read` inside a loop or comprehension that binds the name again
        (`for p in other.parameters(): ... p ...`)? It then reads that binding."""
        index = self.context.index
        for other in others:
            holder = self.context.parents.get(other)
            while isinstance(holder, (cst.Element, cst.Tuple, cst.List, cst.StarredElement)):
                holder = self.context.parents.get(holder)
            if (
                isinstance(holder, (cst.For, cst.CompFor))
                and index.inside(read, holder)
                and not index.inside(read, holder.iter)
            ):
                return True
        return False

    def read_before_backward(self, site, region, backwards) -> cst.Attribute | None:
        """A `.grad` read between the reset and the next backward, the region read as
        a cycle (a reset at the end of a loop body is followed by its beginning)."""
        index = self.context.index
        start = index.end(site)
        after = [index.order(b) for b in backwards if index.order(b) > start]
        reads = [(index.order(r), r) for r in self.grad_reads(region) if not index.inside(r, site)]
        if after:
            window = [r for at, r in reads if start < at < min(after)]
        else:
            first = min(index.order(b) for b in backwards)
            window = [r for at, r in reads if at > start or at < first]
        return window[0] if window else None

    def grad_reads(self, node: cst.CSTNode) -> Iterator[cst.Attribute]:
        """`.grad` attributes under `node` that are read, not assigned or deleted
        (`torch.autograd.grad`, a function, is not a tensor's `.grad`)."""
        for attribute in self.context.index.find(cst.Attribute, within=node):
            if attribute.attr.value != "grad":
                continue
            parent = self.context.parents.get(attribute)
            if isinstance(parent, (cst.AssignTarget, cst.Del)) or self.context.names.of(attribute):
                continue
            yield attribute

    def step_without_none_check(self, optimizer: OptimizerBuild) -> bool:
        classdef = self.context.kinds.local_class(optimizer.call.func) if optimizer.call is not None else None
        if classdef is None:
            return False
        for statement in classdef.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "step":
                reads_grad = any(True for _ in self.grad_reads(statement))
                checks_none = any(
                    m.matches(
                        c,
                        m.Comparison(
                            left=GRAD,
                            comparisons=[m.ComparisonTarget(operator=m.Is() | m.IsNot(), comparator=m.Name("None"))],
                        ),
                    )
                    for c in self.context.index.find(cst.Comparison, within=statement)
                )
                return reads_grad and not checks_none
        return False

    def zero_step_changes_nothing(self, optimizers: tuple[OptimizerBuild, ...], site: cst.CSTNode) -> bool:
        """Would stepping a zero gradient leave parameters and state as they are, and
        nothing else in the file tell a zero `.grad` from a missing one?"""
        return self.zero_step_differs(optimizers, site) is None

    def zero_step_differs(self, optimizers: tuple[OptimizerBuild, ...], site: cst.CSTNode) -> str | None:
        """Why a step with a zero gradient may differ from one without it (the optimizer
        moves it, or code tells a zero `.grad` from a missing one); None when it cannot."""
        if not optimizers or not all(self._is_plain_sgd(o.call) for o in optimizers):
            return OPTIMIZER_MOVES
        for optimizer in optimizers:
            where = self.configured_after(optimizer)
            if where is not None:
                return (
                    f"`{optimizer.expression}` may get momentum or weight decay after it is built "
                    f"(line {self.context.line(where)}), and then a parameter that gets no gradient in some step "
                    "is skipped instead of stepped with a zero gradient"
                )
        module = self.context.module
        read = next((r for r in self.grad_reads(module) if not self.context.inside(r, site)), None)
        if read is not None:
            return f"{MISSING_GRAD} at line {self.context.line(read)}"
        norm = next((c for c in self.context.index.find(cst.Call) if self.context.names.of(c.func) & GRAD_NORMS), None)
        if norm is not None:
            return (
                "a parameter that gets no gradient in some step is left out of the gradient norm "
                f"(line {self.context.line(norm)}) instead of counted as zero, which may round differently"
            )
        where = self._project_grad_reader()
        if where is not None:
            return f"{MISSING_GRAD} in `{where[0]}` ({where[1]})"
        return None

    def _project_grad_reader(self) -> tuple[str, str] | None:
        """A function of the project's other modules, called in this file, that reads
        `.grad` (itself or through what it calls): its name and where it reads."""
        project = project_of(self.context)
        if not project.imports_project():
            return None
        for call in self.context.index.find(cst.Call):
            function = project.called(call)
            where = project.grad_reader(function) if function is not None else None
            if where is not None:
                return function.node.name.value, where
        return None

    def configured_after(self, optimizer: OptimizerBuild) -> cst.CSTNode | None:
        """A place where the optimizer's groups may get momentum or weight decay after it
        is built (see the module docstring); None when there is none in the file."""
        if optimizer.call is None:
            return None
        code = self.context.module.code_for_node
        spelled = optimizer.expression
        for node in self.context.index.find((cst.Name, cst.Attribute)):
            # A node's code holds its last name: tested first, the code of every name and
            # attribute of the file is not generated.
            last = node.value if isinstance(node, cst.Name) else node.attr.value
            if last not in spelled or node is optimizer.call or self.context.inside(node, optimizer.call):
                continue
            if code(node) != spelled:
                continue
            parent = self.context.parents.get(node)
            if isinstance(parent, cst.Attribute) and parent.value is node:
                if self._configures(parent):
                    return parent
            elif isinstance(parent, cst.Arg) and parent.value is node:
                call = self.context.parents.get(parent)
                if isinstance(call, cst.Call) and not self._reads_groups_only(call):
                    return call
            elif isinstance(parent, (cst.Assign, cst.AnnAssign, cst.Return, cst.Element, cst.NamedExpr)):
                if not (isinstance(parent, cst.Assign) and parent.value is not node):
                    return parent  # an alias or a container the optimizer leaves in
        return None

    def _configures(self, attribute: cst.Attribute) -> bool:
        """`opt.<attr>` used in a way that may set momentum or weight decay."""
        name = attribute.attr.value
        parent = self.context.parents.get(attribute)
        if name == "add_param_group":
            if not (isinstance(parent, cst.Call) and len(parent.args) == 1 and not parent.args[0].star):
                return True
            return not self._groups_are_plain(cst.List([cst.Element(parent.args[0].value)]))
        if name in ("load_state_dict", "defaults", "__setstate__"):
            return True
        if name != "param_groups":
            return False
        if isinstance(parent, cst.For) and parent.iter is attribute:
            return not (isinstance(parent.target, cst.Name) and self._group_uses_are_reads(parent.target, parent.body))
        if isinstance(parent, cst.Subscript) and parent.value is attribute:
            return not self._group_use_is_read(parent)
        return True

    def _group_uses_are_reads(self, group: cst.Name, body: cst.BaseSuite) -> bool:
        for name in self.context.index.find(cst.Name, within=body):
            if name.value != group.value:
                continue
            parent = self.context.parents.get(name)
            if not (isinstance(parent, cst.Subscript) and parent.value is name and self._group_key_use_is_read(parent)):
                return False
        return True

    def _group_use_is_read(self, group: cst.Subscript) -> bool:
        """`opt.param_groups[0]` followed by a read (or a learning-rate write) of one key."""
        parent = self.context.parents.get(group)
        return isinstance(parent, cst.Subscript) and parent.value is group and self._group_key_use_is_read(parent)

    def _group_key_use_is_read(self, entry: cst.Subscript) -> bool:
        """`group["lr"] = ...`, `group["weight_decay"]` read: no momentum or weight decay set."""
        if len(entry.slice) != 1 or not isinstance(entry.slice[0].slice, cst.Index):
            return False
        key = entry.slice[0].slice.value
        if not isinstance(key, cst.SimpleString):
            return False
        parent = self.context.parents.get(entry)
        written = isinstance(parent, (cst.AssignTarget, cst.Del)) or (
            isinstance(parent, cst.AugAssign) and parent.target is entry
        )
        return not written or key.evaluated_value in LR_GROUP_KEYS

    def _reads_groups_only(self, call: cst.Call) -> bool:
        """A call the optimizer is handed to that writes no momentum or weight decay: a
        learning-rate-only scheduler, a GradScaler's `step(opt)` / `unscale_(opt)`."""
        if self.context.names.of(call.func) & LR_ONLY_SCHEDULERS:
            return True
        if method_name(call) not in ("step", "unscale_") or not isinstance(call.func.value, cst.Name):
            return False
        values = self.context.bindings.values(call.func.value) or []
        return bool(values) and all(
            isinstance(v, cst.Call) and self.context.names.is_(v.func, *GRAD_SCALER_NAMES) for v in values
        )

    def _is_plain_sgd(self, constructor: cst.Call | None) -> bool:
        """`torch.optim.SGD` without momentum or weight decay: p -= lr * 0 is p."""
        if constructor is None or not self.context.names.is_(constructor.func, "torch.optim.SGD"):
            return False
        if any(arg.star for arg in constructor.args):
            return False
        for index, name in ((2, "momentum"), (4, "weight_decay")):
            arg = kwarg(constructor, name) or positional(constructor, index)
            if arg is not None and values(self.context).number_value(arg.value) != 0:
                return False
        params = kwarg(constructor, "params") or positional(constructor, 0)
        return params is not None and self._groups_are_plain(params.value)

    def _groups_are_plain(self, params: cst.BaseExpression) -> bool:
        """Parameter groups that do not set their own momentum or weight decay."""
        if isinstance(params, cst.Name):
            bound = self.context.bindings.values(params)
            return bool(bound) and all(self._groups_are_plain(v) for v in bound)
        if isinstance(params, (cst.List, cst.Tuple)):
            numbers = values(self.context)
            for element in params.elements:
                if not isinstance(element.value, cst.Dict):
                    continue
                for entry in element.value.elements:
                    if not isinstance(entry, cst.DictElement) or not isinstance(entry.key, cst.SimpleString):
                        return False
                    if (
                        entry.key.evaluated_value in ("momentum", "weight_decay")
                        and numbers.number_value(entry.value) != 0
                    ):
                        return False
            return True
        return isinstance(params, cst.Call) and method_name(params) in ("parameters", "named_parameters")


def assigns_grads(loop: cst.For) -> bool:
    return any(isinstance(small, cst.Assign) for line in _lines(loop.body) for small in getattr(line, "body", ()))


def _lines(block: cst.BaseSuite):
    for line in block.body if isinstance(block, cst.IndentedBlock) else [block]:
        if isinstance(line, (cst.For, cst.If)):
            yield from _lines(line.body)
        else:
            yield line


def is_not_none_check(test: cst.BaseExpression, parameter: str) -> bool:
    """`p.grad is not None`."""
    return m.matches(
        test,
        m.Comparison(
            left=m.Attribute(value=m.Name(parameter), attr=m.Name("grad")),
            comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None"))],
        ),
    )


def _is_zero(expr: cst.BaseExpression) -> bool:
    return number_value(expr) == 0


def is_plain_reference(expr: cst.BaseExpression) -> bool:
    """`model` or `self.model`: evaluating it twice is the same as once."""
    while isinstance(expr, cst.Attribute):
        expr = expr.value
    return isinstance(expr, cst.Name)


def _only_statement(block: cst.BaseSuite) -> cst.CSTNode | None:
    if isinstance(block, cst.IndentedBlock) and len(block.body) == 1:
        return block.body[0]
    return None


def _only_resets(block: cst.BaseSuite, parameter: str, zeros_like=lambda value, parameter: False) -> bool:
    """Does `block` only reset `<parameter>.grad` in place, zeroing it at least once?
    Allowed: `p.grad[.data].zero_()`, `.fill_(0)`, `.detach_()`, `.requires_grad_(False)`,
    under `if p.grad is not None:` or after `if p.grad is None: continue`."""
    grad = m.Attribute(value=m.Name(parameter), attr=m.Name("grad"))
    is_none = m.Comparison(left=grad, comparisons=[m.ComparisonTarget(operator=m.Is(), comparator=m.Name("None"))])
    is_not_none = m.Comparison(
        left=grad, comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None"))]
    )
    zeroes = False

    def reset(statement: cst.BaseSmallStatement) -> bool:
        nonlocal zeroes
        if (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and m.matches(statement.targets[0].target, grad)
            and zeros_like(statement.value, parameter)
        ):
            zeroes = True  # `p.grad = torch.zeros_like(p)`: a new zero buffer every step
            return True
        if not (isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call)):
            return False
        call = statement.value
        method = method_name(call)
        if method not in GRAD_RESET_METHODS:
            return False
        target = call.func.value
        if m.matches(target, m.Attribute(attr=m.Name("data"))):
            target = target.value
        if not m.matches(target, grad):
            return False
        if method == "fill_":
            ok = len(call.args) == 1 and _is_zero(call.args[0].value)
        elif method == "requires_grad_":
            ok = len(call.args) == 1 and m.matches(call.args[0].value, m.Name("False"))
        else:
            ok = not call.args
        zeroes = zeroes or (ok and method in GRAD_ZEROING_METHODS)
        return ok

    def walk(suite: cst.BaseSuite) -> bool:
        lines = suite.body if isinstance(suite, cst.IndentedBlock) else [suite]
        for line in lines:
            if isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                if not all(reset(s) for s in line.body):
                    return False
            elif isinstance(line, cst.If) and line.orelse is None and m.matches(line.test, is_not_none):
                if not walk(line.body):
                    return False
            elif isinstance(line, cst.If) and line.orelse is None and m.matches(line.test, is_none):
                if not _only_continue(line.body):
                    return False
            else:
                return False
        return True

    return walk(block) and zeroes


def _only_continue(suite: cst.BaseSuite) -> bool:
    if isinstance(suite, cst.IndentedBlock):
        if len(suite.body) != 1 or not isinstance(suite.body[0], cst.SimpleStatementLine):
            return False
        suite = suite.body[0]
    return len(suite.body) == 1 and isinstance(suite.body[0], cst.Continue)

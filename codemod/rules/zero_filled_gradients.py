from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from codemod.analysis import match as m
from codemod.analysis.kinds import Kind
from codemod.analysis.names import kwarg, method_name, positional
from codemod.analysis.torch_facts import GRAD_NORMS
from codemod.analysis.training import OptimizerBuild
from codemod.edits import Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid

# Receivers whose `zero_grad(set_to_none=...)` is torch's (or a wrapper of it).
ZEROABLE = (Kind.OPTIMIZER, Kind.MODULE, Kind.UNKNOWN)
# In-place calls on `p.grad` that a manual reset loop may make, and the ones that zero it.
RESET_METHODS = {"zero_", "fill_", "detach_", "requires_grad_"}
ZEROING_METHODS = {"zero_", "fill_"}
# Calls whose result depends on which parameters have a `.grad` (a norm over a
# different list of tensors can round differently in the last bit).
GRAD = m.Attribute(attr=m.Name("grad"))

UNSAFE_WHY = (
    "; unsafe: a parameter that gets no gradient in some step is then skipped by the optimizer "
    "instead of stepped with a zero gradient (which momentum, Adam's moments and weight decay move)"
)

PREAMBLE = """\
import torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(3)]
"""
SGD = PREAMBLE.replace("torch.optim.AdamW(model.parameters(), lr=1e-3)", "torch.optim.SGD(model.parameters(), lr=0.1)")
LOOP = "for x, y in data:\n    loss = torch.nn.functional.mse_loss(model(x), y)\n    loss.backward()\n    opt.step()\n"
UNSAFE = {"level": Level.UNSAFE}


class ZeroFilledGradients(Rule):
    """
    ## What it does
    Finds gradients reset by filling them with zeros every step,
    `zero_grad(set_to_none=False)` or by hand over the parameters (a loop of
    `p.grad.zero_()` / `p.grad.fill_(0)` / `p.grad = torch.zeros_like(p)`, the
    same as a list comprehension, or `torch._foreach_zero_` over a list of the
    gradients), and makes them `zero_grad()`, which sets every `.grad` to
    `None`. Zero buffers set up once before training are not a reset.

    ## Why is this bad?
    Zero-filling launches a fill kernel per parameter (or per group) every step
    and keeps every gradient buffer allocated between steps; the next
    `backward()` then reads the zeros back to add to them. With `None`, the
    reset is free, the memory is released until the next backward, and backward
    writes each gradient instead of accumulating it. A hand-written loop is
    worse still: one Python iteration and one kernel launch per parameter.
    Typical gain: a few percent of step time for models with many small
    parameters, and the gradients' memory between steps.

    A plain `optimizer.zero_grad()` or `model.zero_grad()` is not reported: it
    has set gradients to `None` by default since torch 2.0 (checked against
    torch 2.13: `set_to_none: bool = True` for both).

    ## Example
    ```python
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.zero_()
    ```
    Use instead:
    ```python
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        model.zero_grad()
    ```

    ## Fix safety
    The next backward writes the same values into a `None` gradient as it adds
    to a zero one, so a parameter that gets a gradient in every step ends up
    with the same `.grad` and the same update, bit for bit. What differs is a
    parameter that gets no gradient in some step (a branch not taken, a frozen
    layer, an unused head, experts not routed to): its `.grad` stays `None`
    instead of zeros, and torch's optimizers skip it, where with zeros they
    still step it, so momentum, Adam's moments and weight decay keep moving it.
    A norm over all gradients (`clip_grad_norm_`) also runs over a different
    list and may round differently. The rule cannot prove that every parameter
    gets a gradient in every step, so it offers the fix at level `unsafe`,
    except where a step with zero gradients provably changes nothing: every
    optimizer stepped in the loop is `torch.optim.SGD` without momentum or
    weight decay, and nothing in the file reads `.grad` or a gradient norm.
    There the fix is `safe`.

    Reported without a fix: `.grad` read between the reset and the next
    `backward()` (`p.grad.add_(...)` accumulation, which would fail on `None`),
    an optimizer class of this file whose `step` uses `.grad` without a `None`
    check (also when the optimizer reaches the training function as an
    argument), and a reset whose following `backward()` the rule cannot see. The
    receiver of `zero_grad` and of `.parameters()` is taken to be a torch
    module or optimizer (or a wrapper of one) unless the analysis knows it is
    something else.
    """

    CODE = "PM401"
    NAME = "zero-filled-gradients"
    LEVEL = Level.SAFE
    REQUIRES = ("zero_", "fill_", "zeros_like", "new_zeros")  # zero_grad, p.grad.zero_(), fill_(0), _foreach_zero_
    MESSAGE = "gradients are reset by filling them with zeros; let zero_grad() set them to None"
    GAIN = "a fill kernel per parameter per step saved, and the gradients' memory between steps"

    VALID = [
        Valid(PREAMBLE + LOOP + "    opt.zero_grad()\n", "set-to-none is the default since torch 2.0"),
        Valid(PREAMBLE + LOOP + "    opt.zero_grad(set_to_none=True)\n", "already set to none"),
        Valid(PREAMBLE + "flag = False\n" + LOOP + "    opt.zero_grad(set_to_none=flag)\n", "not a literal False"),
        Valid(
            PREAMBLE + LOOP + "    for p in model.parameters():\n        p.grad.mul_(0.9)\n",
            "scaling, not zeroing (and 0 * nan is nan)",
        ),
        Valid(
            PREAMBLE + LOOP + "    for p in model.parameters():\n        p.grad.zero_()\n        print(p)\n",
            "the loop does more than zeroing",
        ),
        Valid(
            PREAMBLE + LOOP + "    x = torch.randn(3)\n    x.zero_grad(set_to_none=False)\n",
            "a tensor is not a module or optimizer",
        ),
    ]
    INVALID = [
        Invalid(
            PREAMBLE + LOOP + "    opt.zero_grad(set_to_none=False)\n",
            PREAMBLE + LOOP + "    opt.zero_grad()\n",
            "AdamW steps a zero gradient but skips a None one: unsafe",
            config=UNSAFE,
        ),
        Invalid(
            SGD + LOOP + "    opt.zero_grad(set_to_none=False)\n",
            SGD + LOOP + "    opt.zero_grad()\n",
            "plain SGD: a zero-gradient step changes nothing, so the fix is safe",
        ),
        Invalid(
            SGD + LOOP + "    model.zero_grad(False)\n",
            SGD + LOOP + "    model.zero_grad()\n",
            "positional set_to_none",
        ),
        Invalid(
            SGD
            + LOOP
            + "    for p in model.parameters():\n        if p.grad is not None:\n            p.grad.zero_()\n",
            SGD + LOOP + "    model.zero_grad()\n",
        ),
        Invalid(
            PREAMBLE
            + LOOP
            + "    for p in model.parameters():\n        p.grad.detach_()\n        p.grad.data.zero_()\n",
            PREAMBLE + LOOP + "    model.zero_grad()\n",
            config=UNSAFE,
        ),
        Invalid(
            PREAMBLE + LOOP + "    for group in opt.param_groups:\n        for p in group['params']:\n"
            "            if p.grad is None:\n                continue\n            p.grad.fill_(0)\n",
            PREAMBLE + LOOP + "    opt.zero_grad()\n",
            "the optimizer's own parameters",
            config=UNSAFE,
        ),
        Invalid(
            PREAMBLE + "for x, y in data:\n    opt.zero_grad(set_to_none=False)\n    for p in model.parameters():\n"
            "        p.grad.add_(1e-3)\n    loss = torch.nn.functional.mse_loss(model(x), y)\n    loss.backward()\n    opt.step()\n",
            None,
            ".grad read between the reset and backward",
            config=UNSAFE,
        ),
        Invalid(
            SGD
            + LOOP
            + "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    opt.zero_grad(set_to_none=False)\n",
            SGD + LOOP + "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    opt.zero_grad()\n",
            "a gradient norm over a different list may round differently: unsafe",
            config=UNSAFE,
        ),
        Invalid(
            "import torch\ndef reset(opt):\n    opt.zero_grad(set_to_none=False)\n",
            None,
            "no backward in sight",
            config=UNSAFE,
        ),
    ]

    # -- sites ---------------------------------------------------------------------

    def _zero_grad_false(self, node: cst.Call) -> None:
        if method_name(node) != "zero_grad" or not _passes_false(node):
            return
        if self.context.kinds.fact(node.func.value).kind not in ZEROABLE:
            return
        self._decide(node, lambda updated: updated.with_changes(args=[]), manual=False)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        """`[p.grad.zero_() for p in model.parameters() if p.grad is not None]`: the
        same reset loop written as a comprehension statement."""
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Expr):
            return
        comp = node.body[0].value
        if not isinstance(comp, (cst.ListComp, cst.GeneratorExp, cst.SetComp)) or comp.for_in.inner_for_in is not None:
            return
        loop = comp.for_in
        if (
            not isinstance(loop.target, cst.Name)
            or not isinstance(loop.iter, cst.Call)
            or method_name(loop.iter) != "parameters"
            or loop.iter.args
        ):
            return
        receiver, name = loop.iter.func.value, loop.target.value
        checks = cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(comp.elt)])])
        if any(not _is_not_none_check(c.test, name) for c in loop.ifs) or not _only_resets(
            checks, name, self._zeros_like
        ):
            return
        if not _is_plain_reference(receiver) or self.context.kinds.fact(receiver).kind not in (
            Kind.MODULE,
            Kind.UNKNOWN,
        ):
            return
        self._decide(comp, _zero_grad_call(receiver), manual=True)  # the line keeps its comments

    def visit_Call(self, node: cst.Call) -> None:
        if method_name(node) == "zero_grad":
            self._zero_grad_false(node)
        elif _callee(node) == "_foreach_zero_" and self.context.names.is_(node.func, "torch._foreach_zero_"):
            self._foreach_zero(node)

    def _foreach_zero(self, node: cst.Call) -> None:
        """`grads = [p.grad for p in model.parameters() if p.grad is not None]` then
        `torch._foreach_zero_(grads)` (under `if grads:` or not): one kernel launch
        per group instead of per parameter, but still a fill of every buffer."""
        statement = self.context.parents.get(node)
        line = self.context.parents.get(statement)
        if not (
            isinstance(statement, cst.Expr)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and len(node.args) == 1
            and isinstance(node.args[0].value, cst.Name)
        ):
            return
        grads = node.args[0].value
        assignments = self.context.bindings.assignments(grads) or []
        values = self.context.bindings.values(grads) or []
        if len(assignments) != 1 or len(values) != 1:
            return
        comp = values[0]
        if not (
            isinstance(comp, cst.ListComp)
            and comp.for_in.inner_for_in is None
            and isinstance(comp.for_in.target, cst.Name)
            and isinstance(comp.for_in.iter, cst.Call)
            and method_name(comp.for_in.iter) == "parameters"
            and not comp.for_in.iter.args
            and m.matches(comp.elt, m.Attribute(value=m.Name(comp.for_in.target.value), attr=m.Name("grad")))
            and all(_is_not_none_check(c.test, comp.for_in.target.value) for c in comp.for_in.ifs)
        ):
            return
        receiver = comp.for_in.iter.func.value
        if not _is_plain_reference(receiver) or self.context.kinds.fact(receiver).kind not in (
            Kind.MODULE,
            Kind.UNKNOWN,
        ):
            return
        built = self.context.bindings.statement(assignments[0].node)
        built_line = self.context.parents.get(built)
        guard = self.context.parents.get(self.context.parents.get(line))
        uses = [a.node for a in assignments[0].references]
        site: cst.CSTNode = line
        if (
            isinstance(guard, cst.If)
            and guard.orelse is None
            and isinstance(guard.body, cst.IndentedBlock)
            and list(guard.body.body) == [line]
            and isinstance(guard.test, cst.Name)
            and guard.test.value == grads.value
        ):
            site = guard  # `if grads: torch._foreach_zero_(grads)` goes whole
        extra = []
        if (
            all(self.context.inside(use, site) for use in uses)
            and isinstance(built_line, cst.SimpleStatementLine)
            and len(built_line.body) == 1
            and isinstance(self.context.parents.get(built_line), cst.IndentedBlock)
        ):
            extra.append(Remove(built_line))  # the list of gradients is only built for the fill
        elif site is guard:
            site = line
        if site is line:  # the call only: the line keeps its comments
            self._decide(node, _zero_grad_call(receiver), manual=True, extra=extra)
        else:
            self._decide(site, _zero_grad_line(receiver, site), manual=True, extra=extra)

    def visit_For(self, node: cst.For) -> None:
        receiver = self._manual_reset_receiver(node)
        if receiver is None:
            return
        if _assigns_grads(node) and not (self.context.loops.step_loop_of(node) or self.context.loops.runs_in(node)):
            return  # `p.grad = torch.zeros_like(p)` once before training: buffers set up, not reset
        self._decide(node, _zero_grad_line(receiver, node), manual=True)

    def _manual_reset_receiver(self, loop: cst.For) -> cst.BaseExpression | None:
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
        if not isinstance(parameter, cst.Name) or not _is_plain_reference(receiver):
            return None
        if kinds.fact(receiver).kind not in allowed or not _only_resets(body, parameter.value, self._zeros_like):
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

    # -- decision ------------------------------------------------------------------

    def _decide(self, site: cst.CSTNode, replacement, manual: bool, at: cst.CSTNode | None = None, extra=()) -> None:
        message = (
            "a Python loop zero-fills every .grad, one kernel per parameter; call zero_grad(), which sets them to None"
            if manual
            else "zero_grad(set_to_none=False) zero-fills every .grad each step; zero_grad() sets them to None"
        )
        # The loop that steps the optimizer holds the reset and the backward it precedes
        # (with accumulation that is the loop around the micro-steps).
        training_loop = self.context.training.loop_of(site)
        region = (
            (training_loop.loop if training_loop is not None else None)
            or self.context.loops.step_loop_of(site)
            or self._enclosing_body(site)
        )
        steps = self.context.loops
        backwards = [c for c in steps.reached_calls(region) if steps.is_backward(c)]
        if not backwards:
            self.report(
                site, message + "; left as is: no backward() follows it here, so its readers cannot be checked", at=at
            )
            return
        read = self._grad_read_before_backward(site, region, backwards)
        if read is not None:
            line = self.context.line(read)
            self.report(
                site,
                message + f"; left as is: .grad is read at line {line} before the next backward(), "
                "where it would be None",
                at=at,
            )
            return
        optimizers = training_loop.optimizers if training_loop is not None else ()
        if any(self._custom_step_without_none_check(o) for o in optimizers):
            self.report(site, message + "; left as is: the optimizer's step() uses .grad without a None check", at=at)
            return
        edits = [Replace(site, replacement), *extra]
        if self._zero_step_changes_nothing(optimizers, site):
            self.report(site, message, edits=edits, at=at)
        else:
            self.report(site, message + UNSAFE_WHY, edits=edits, level=Level.UNSAFE, at=at)

    def _enclosing_body(self, node: cst.CSTNode) -> cst.CSTNode:
        current = self.context.parents.get(node)
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.Module)):
            current = self.context.parents.get(current)
        return current.body if isinstance(current, cst.FunctionDef) else current

    def _grad_read_before_backward(self, site, region, backwards) -> cst.Attribute | None:
        """A `.grad` read between the reset and the next backward, the region read as
        a cycle (a reset at the end of a loop body is followed by its beginning)."""
        index = self.context.index
        start = index.end(site)
        after = [index.order(b) for b in backwards if index.order(b) > start]
        reads = [(index.order(r), r) for r in self._grad_reads(region) if not index.inside(r, site)]
        if after:
            window = [r for at, r in reads if start < at < min(after)]
        else:
            first = min(index.order(b) for b in backwards)
            window = [r for at, r in reads if at > start or at < first]
        return window[0] if window else None

    def _grad_reads(self, node: cst.CSTNode) -> Iterator[cst.Attribute]:
        """`.grad` attributes under `node` that are read, not assigned or deleted
        (`torch.autograd.grad`, a function, is not a tensor's `.grad`)."""
        for attribute in self.context.index.find(cst.Attribute, within=node):
            if attribute.attr.value != "grad":
                continue
            parent = self.context.parents.get(attribute)
            if isinstance(parent, (cst.AssignTarget, cst.Del)) or self.context.names.of(attribute):
                continue
            yield attribute

    def _custom_step_without_none_check(self, optimizer: OptimizerBuild) -> bool:
        classdef = self.context.kinds.local_class(optimizer.call.func) if optimizer.call is not None else None
        if classdef is None:
            return False
        for statement in classdef.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == "step":
                reads_grad = any(True for _ in self._grad_reads(statement))
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

    def _zero_step_changes_nothing(self, optimizers: tuple[OptimizerBuild, ...], site: cst.CSTNode) -> bool:
        """Would stepping a zero gradient leave parameters and state as they are, and
        nothing else in the file tell a zero `.grad` from a missing one?"""
        if not optimizers or not all(self._is_plain_sgd(o.call) for o in optimizers):
            return False
        module = self.context.module
        if any(not self.context.inside(r, site) for r in self._grad_reads(module)):
            return False
        return not any(self.context.names.of(c.func) & GRAD_NORMS for c in self.context.index.find(cst.Call))

    def _is_plain_sgd(self, constructor: cst.Call | None) -> bool:
        """`torch.optim.SGD` without momentum or weight decay: p -= lr * 0 is p."""
        if constructor is None or not self.context.names.is_(constructor.func, "torch.optim.SGD"):
            return False
        if any(arg.star for arg in constructor.args):
            return False
        for index, name in ((2, "momentum"), (4, "weight_decay")):
            arg = kwarg(constructor, name) or positional(constructor, index)
            if arg is not None and not _is_zero(arg.value):
                return False
        params = kwarg(constructor, "params") or positional(constructor, 0)
        return params is not None and self._groups_are_plain(params.value)

    def _groups_are_plain(self, params: cst.BaseExpression) -> bool:
        """Parameter groups that do not set their own momentum or weight decay."""
        if isinstance(params, cst.Name):
            values = self.context.bindings.values(params)
            return bool(values) and all(self._groups_are_plain(v) for v in values)
        if isinstance(params, (cst.List, cst.Tuple)):
            for element in params.elements:
                if not isinstance(element.value, cst.Dict):
                    continue
                for entry in element.value.elements:
                    if not isinstance(entry, cst.DictElement) or not isinstance(entry.key, cst.SimpleString):
                        return False
                    if entry.key.evaluated_value in ("momentum", "weight_decay") and not _is_zero(entry.value):
                        return False
            return True
        return isinstance(params, cst.Call) and method_name(params) in ("parameters", "named_parameters")


def _callee(call: cst.Call) -> str | None:
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None


def _assigns_grads(loop: cst.For) -> bool:
    return any(isinstance(small, cst.Assign) for line in _lines(loop.body) for small in getattr(line, "body", ()))


def _lines(block: cst.BaseSuite):
    for line in block.body if isinstance(block, cst.IndentedBlock) else [block]:
        if isinstance(line, (cst.For, cst.If)):
            yield from _lines(line.body)
        else:
            yield line


def _zero_grad_call(receiver: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=receiver.deep_clone(), attr=cst.Name("zero_grad")))


def _zero_grad_line(receiver: cst.BaseExpression, site: cst.CSTNode) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(
        body=[cst.Expr(_zero_grad_call(receiver))], leading_lines=getattr(site, "leading_lines", ())
    )


def _is_not_none_check(test: cst.BaseExpression, parameter: str) -> bool:
    """`p.grad is not None`."""
    return m.matches(
        test,
        m.Comparison(
            left=m.Attribute(value=m.Name(parameter), attr=m.Name("grad")),
            comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None"))],
        ),
    )


def _passes_false(call: cst.Call) -> bool:
    arg = kwarg(call, "set_to_none") or positional(call, 0)
    return arg is not None and m.matches(arg.value, m.Name("False"))


def _is_zero(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, (cst.Integer, cst.Float)) and float(expr.evaluated_value) == 0.0


def _is_plain_reference(expr: cst.BaseExpression) -> bool:
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
        if method not in RESET_METHODS:
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
        zeroes = zeroes or (ok and method in ZEROING_METHODS)
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

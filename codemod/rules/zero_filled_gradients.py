from __future__ import annotations

import libcst as cst
from libcst.metadata import Assignment

from codemod.analysis import match as m
from codemod.analysis.grad_resets import assigns_grads, grad_resets, is_not_none_check, is_plain_reference
from codemod.analysis.names import kwarg, method_name, positional
from codemod.analysis.output_sites import output_sites
from codemod.analysis.values import Kind
from codemod.edits import Remove, Replace
from codemod.rule import Invalid, Level, Rule, Valid

# Receivers whose `zero_grad(set_to_none=...)` is torch's (or a wrapper of it).
ZEROABLE = (Kind.OPTIMIZER, Kind.MODULE, Kind.UNKNOWN)

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
    There the fix is `safe`. Momentum or weight decay given after the optimizer
    is built counts too: a write to `opt.param_groups[...]` other than the
    learning rate, `opt.add_param_group({..., "momentum": 0.9})`,
    `opt.load_state_dict(...)`, or the optimizer handed to code that may set
    them (a scheduler that cycles momentum, such as `CyclicLR`, or a function
    perfmod does not follow). So does a `.grad` read or gradient norm in a
    function of another module of the project that the file calls (a
    `grad_norm(model)` helper would fail on `None`): the fix is then `unsafe`,
    with the reason.

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
        receiver = self._parameters_receiver(loop)
        if receiver is None:
            return
        name = loop.target.value
        checks = cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(comp.elt)])])
        if any(not is_not_none_check(c.test, name) for c in loop.ifs) or not grad_resets(self.context).resets(
            checks, name
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
        line = output_sites(self.context).own_statement(node)
        if line is None or len(node.args) != 1 or not isinstance(node.args[0].value, cst.Name):
            return
        grads = node.args[0].value
        assignments = self.context.bindings.assignments(grads) or []
        values = self.context.bindings.values(grads) or []
        if len(assignments) != 1 or len(values) != 1:
            return
        receiver = self._gradients_receiver(values[0])
        if receiver is None:
            return
        site, extra = self._foreach_site(grads, line, assignments[0])
        if site is line:  # the call only: the line keeps its comments
            self._decide(node, _zero_grad_call(receiver), manual=True, extra=extra)
        else:
            self._decide(site, _zero_grad_line(receiver, site), manual=True, extra=extra)

    def _parameters_receiver(self, loop: cst.CompFor) -> cst.BaseExpression | None:
        """`model` of `for p in model.parameters()`, a plain reference to a module (or
        something unknown); None for any other loop."""
        if (
            not isinstance(loop.target, cst.Name)
            or not isinstance(loop.iter, cst.Call)
            or method_name(loop.iter) != "parameters"
            or loop.iter.args
        ):
            return None
        receiver = loop.iter.func.value
        if not is_plain_reference(receiver) or self.context.kinds.fact(receiver).kind not in (
            Kind.MODULE,
            Kind.UNKNOWN,
        ):
            return None
        return receiver

    def _gradients_receiver(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
        """`model` of `[p.grad for p in model.parameters() if p.grad is not None]`; None
        for any other value."""
        if not isinstance(value, cst.ListComp) or value.for_in.inner_for_in is not None:
            return None
        loop = value.for_in
        receiver = self._parameters_receiver(loop)
        if receiver is None:
            return None
        name = loop.target.value
        if not m.matches(value.elt, m.Attribute(value=m.Name(name), attr=m.Name("grad"))):
            return None
        return receiver if all(is_not_none_check(c.test, name) for c in loop.ifs) else None

    def _foreach_site(
        self, grads: cst.Name, line: cst.SimpleStatementLine, assignment: Assignment
    ) -> tuple[cst.CSTNode, list[Remove]]:
        """What the fix replaces (the fill's line, or `if grads:` around it) and the edits
        beside it (removing the line that builds the list of gradients, when that list is
        only built for the fill)."""
        index = self.context.index
        built_line = index.statement_of(assignment.node)
        guard = index.block_owner(line)
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
        if (
            all(self.context.inside(reference.node, site) for reference in assignment.references)
            and isinstance(built_line, cst.SimpleStatementLine)
            and len(built_line.body) == 1
            and index.block_owner(built_line) is not None
        ):
            return site, [Remove(built_line)]  # the list of gradients is only built for the fill
        return line, []

    def visit_For(self, node: cst.For) -> None:
        receiver = grad_resets(self.context).reset_loop_receiver(node)
        if receiver is None:
            return
        if assigns_grads(node) and not (self.context.loops.step_loop_of(node) or self.context.loops.runs_in(node)):
            return  # `p.grad = torch.zeros_like(p)` once before training: buffers set up, not reset
        self._decide(node, _zero_grad_line(receiver, node), manual=True)

    # -- decision ------------------------------------------------------------------

    def _decide(self, site: cst.CSTNode, replacement, manual: bool, at: cst.CSTNode | None = None, extra=()) -> None:
        message = (
            "a Python loop zero-fills every .grad, one kernel per parameter; call zero_grad(), which sets them to None"
            if manual
            else "zero_grad(set_to_none=False) zero-fills every .grad each step; zero_grad() sets them to None"
        )
        # The loop that steps the optimizer holds the reset and the backward it precedes
        # (with accumulation that is the loop around the micro-steps).
        resets = grad_resets(self.context)
        training_loop = self.context.training.loop_of(site)
        region = (
            (training_loop.loop if training_loop is not None else None)
            or self.context.loops.step_loop_of(site)
            or self._function_body(site)
        )
        steps = self.context.loops
        backwards = [c for c in steps.reached_calls(region) if steps.is_backward(c)]
        if not backwards:
            self.report(
                site, message + "; left as is: no backward() follows it here, so its readers cannot be checked", at=at
            )
            return
        read = resets.read_before_backward(site, region, backwards)
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
        if any(resets.step_without_none_check(o) for o in optimizers):
            self.report(site, message + "; left as is: the optimizer's step() uses .grad without a None check", at=at)
            return
        edits = [Replace(site, replacement), *extra]
        why = resets.zero_step_differs(optimizers, site)
        if why is None:
            self.report(site, message, edits=edits, at=at)
        else:
            self.report(site, f"{message}; unsafe: {why}", edits=edits, level=Level.UNSAFE, at=at)

    def _function_body(self, node: cst.CSTNode) -> cst.CSTNode:
        """The body of the function that holds `node`, or the module."""
        function = self.context.index.first_enclosing(node, cst.FunctionDef)
        return function.body if function is not None else self.context.module


def _callee(call: cst.Call) -> str | None:
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None


def _zero_grad_call(receiver: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=receiver.deep_clone(), attr=cst.Name("zero_grad")))


def _zero_grad_line(receiver: cst.BaseExpression, site: cst.CSTNode) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(
        body=[cst.Expr(_zero_grad_call(receiver))], leading_lines=getattr(site, "leading_lines", ())
    )


def _passes_false(call: cst.Call) -> bool:
    arg = kwarg(call, "set_to_none") or positional(call, 0)
    return arg is not None and m.matches(arg.value, m.Name("False"))

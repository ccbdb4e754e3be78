"""PM601's fix producer for gradient accumulation: `GradientAccumulation`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.names import integer_value, names_read
from codemod.analysis.periodic import periodic
from codemod.edits import InsertAfter, Replace, Wrap
from codemod.rules.single_process_training.plan import (
    IMPORT_CONTEXTLIB,
    Producer,
    and_,
    code_of,
    make_call,
    negation,
    parse_expr,
)


class GradientAccumulation(Producer):
    """Gradient accumulation: the micro-steps that do not step skip DDP's all-reduce
    (`no_sync`)."""

    def no_sync(self) -> None:
        """With gradient accumulation, the micro-steps that do not step skip DDP's all-reduce."""
        loop = self.plan.loop
        step_guard = self._step_guard()
        micro = loop.accumulation.micro_loop if loop.accumulation is not None else None
        region = loop.forward
        continue_guard = self._continue_guard(region) if region is not None else None
        if step_guard is None and micro is None and continue_guard is None:
            return  # no accumulation: every backward steps
        if region is None:
            self.notes.append(
                f"gradients are averaged over the ranks on every micro-batch ({loop.forward_problem}; "
                "add `model.no_sync()` by hand)"
            )
            return
        model = self._handle_in(facts.function_of(self.context, loop.loop))
        if model is None:
            return
        statements = list(region.block.body)
        first, last = region.first, region.last
        backward = self.index.statement_of(loop.backwards[0].call)
        if backward in statements and statements.index(backward) > last:
            last = statements.index(backward)
        accumulating, guard, negated = None, None, False
        if region.block is loop.loop.body:
            for candidate, negate in ((continue_guard, False), (step_guard, True)):
                if candidate is None or candidate not in statements or statements.index(candidate) <= last:
                    continue
                if self._rebound_between(candidate.test, statements[first : statements.index(candidate)]):
                    continue
                accumulating, guard, negated = (
                    (negation(candidate.test) if negate else candidate.test),
                    candidate,
                    negate,
                )
                break
        if accumulating is None and micro is not None and self.index.inside(region.block, micro):
            accumulating = self._micro_condition(micro)
        if accumulating is None:
            self.notes.append(
                "gradients are averaged over the ranks on every micro-batch (PM601 cannot tell which "
                "micro-steps step; add `model.no_sync()` by hand)"
            )
            return
        if guard is not None and first > 0:
            name = self.plan.fresh("accumulating")
            self.edits.append(
                InsertAfter(
                    statements[first - 1],
                    (cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], accumulating)]),),
                )
            )
            self.edits.append(Replace(guard.test, parse_expr(f"not {name}" if negated else name)))
            condition: cst.BaseExpression = cst.Name(name)
        else:
            condition = accumulating
        check = self.plan.world_check(statements[first])
        item = cst.IfExp(
            test=and_(check, condition),
            body=cst.Call(cst.Attribute(parse_expr(model), cst.Name("no_sync"))),
            orelse=make_call("contextlib.nullcontext"),
        )
        self.edits.append(Wrap(statements[first], statements[last], (cst.WithItem(item),)))
        self.imports.append(IMPORT_CONTEXTLIB)

    def _step_guard(self) -> cst.If | None:
        """`if (i + 1) % accum == 0:` around the optimizer step."""
        loop = self.plan.loop
        for step in loop.steps:
            for node in self.index.ancestors(step.call):
                if node is loop.loop:
                    break
                if isinstance(node, cst.If) and node.orelse is None and self._is_modulo(node.test):
                    return node
        return None

    def _continue_guard(self, region) -> cst.If | None:
        """`if (i + 1) % accum != 0: continue` after the forward, before the step."""
        if region.block is not self.plan.loop.loop.body:
            return None
        for statement in list(region.block.body)[region.last + 1 :]:
            if isinstance(statement, cst.If) and statement.orelse is None and self._is_modulo(statement.test):
                body = list(statement.body.body)
                only = body[0] if len(body) == 1 else None
                small = only.body[0] if isinstance(only, cst.SimpleStatementLine) and len(only.body) == 1 else only
                if isinstance(small, cst.Continue):
                    return statement
        return None

    def _is_modulo(self, test: cst.BaseExpression) -> bool:
        return periodic(self.context).is_periodic(test, self.plan.loop.loop)

    def _rebound_between(self, test: cst.BaseExpression, statements) -> bool:
        read = {n.value for n in names_read(test)}
        return any(read & facts.assigned_names(self.context, s) for s in statements)

    def _micro_condition(self, micro: cst.CSTNode) -> cst.BaseExpression | None:
        """`i < n - 1` for `for i in range(n)`: every micro-step but the last."""
        if not (isinstance(micro, cst.For) and isinstance(micro.target, cst.Name)):
            return None
        iterable = micro.iter
        if not (isinstance(iterable, cst.Call) and self.names.is_(iterable.func, "range", "builtins.range")):
            return None
        args = [a.value for a in iterable.args]
        if len(args) == 2 and integer_value(args[0]) == 0:
            args = args[1:]
        if len(args) != 1 or self._rebound_between(args[0], [micro.body]):
            return None
        count = code_of(args[0])
        if not isinstance(args[0], (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)):
            count = f"({count})"
        return parse_expr(f"{micro.target.value} < {count} - 1")

    def _handle_in(self, function) -> str | None:
        """How `function` spells the wrapped model."""
        for scope, code, _ in self.plan.origin.handles:
            if scope is function:
                return code
            if isinstance(scope, cst.ClassDef) and function is not None and self.index.inside(function, scope):
                return code
            if isinstance(scope, cst.Module) and function is None:
                return code
        return None

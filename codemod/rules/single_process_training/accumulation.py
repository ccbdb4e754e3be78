"""PM601's fix producer for gradient accumulation: `GradientAccumulation`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.micro_steps import micro_steps
from codemod.analysis.model_sites import model_sites
from codemod.edits import InsertAfter, Replace, Wrap
from codemod.rules.single_process_training.plan import (
    IMPORT_CONTEXTLIB,
    Producer,
    code_of,
    negation,
    parenthesized,
    parse_expr,
    parse_line,
)


class GradientAccumulation(Producer):
    """Gradient accumulation: the micro-steps that do not step skip DDP's all-reduce
    (`no_sync`)."""

    def no_sync(self) -> None:
        """With gradient accumulation, the micro-steps that do not step skip DDP's all-reduce."""
        loop = self.plan.loop
        found = micro_steps(self.context, loop)
        if found is None:
            return  # no accumulation: every backward steps
        if found.forward_problem is not None:
            self._synced(found.forward_problem)
            return
        model = model_sites(self.context).spelled_in(self.plan.origin, facts.function_of(self.context, loop.loop))
        if model is None:
            return
        statements, first, last, guard = found.statements, found.first, found.last, found.guard
        if guard is not None:
            accumulating = negation(guard.test) if found.negated else guard.test
        elif found.micro is not None:
            target, count = found.micro
            shown = code_of(count)
            if not isinstance(count, (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)):
                shown = f"({shown})"
            accumulating = parse_expr(f"{target.value} < {shown} - 1")  # every micro-step but the last
        else:
            self._synced("PM601 cannot tell which micro-steps step")
            return
        if guard is not None and first > 0:
            name = self.plan.fresh("accumulating")
            self.edits.append(InsertAfter(statements[first - 1], (parse_line(f"{name} = {code_of(accumulating)}\n"),)))
            self.edits.append(Replace(guard.test, parse_expr(f"not {name}" if found.negated else name)))
            condition: cst.BaseExpression = cst.Name(name)
        else:
            condition = accumulating
        test = f"{self.plan.world_check(statements[first])} and {code_of(parenthesized(condition))}"
        item = parse_expr(f"{model}.no_sync() if {test} else contextlib.nullcontext()")
        self.edits.append(Wrap(statements[first], statements[last], (cst.WithItem(item),)))
        self.imports.append(IMPORT_CONTEXTLIB)

    def _synced(self, why: str) -> None:
        """The finding says that every micro-batch all-reduces, and why."""
        self.notes.append(
            f"gradients are averaged over the ranks on every micro-batch ({why}; add `model.no_sync()` by hand)"
        )

"""PM601's fix producer for gradient accumulation: `GradientAccumulation`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.micro_steps import micro_steps
from codemod.analysis.model_sites import model_sites
from codemod.analysis.names import code_of, logic_operand
from codemod.edits import InsertAfter, Replace, Wrap
from codemod.rules.single_process_training.plan import Producer


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
        statements, first, guard = found.statements, found.first, found.guard
        accumulating = found.accumulating
        if accumulating is None:
            self._synced("PM601 cannot tell which micro-steps step")
            return
        if guard is not None and first > 0:  # computed once, before the forward: the `with` and the guard read it
            name = self.plan.fresh("accumulating")
            binding = cst.parse_statement(f"{name} = {code_of(accumulating)}\n")
            self.edits.append(InsertAfter(statements[first - 1], (binding,)))
            self.edits.append(Replace(guard.test, cst.parse_expression(f"not {name}" if found.negated else name)))
            accumulating = cst.Name(name)
        test = f"{self.plan.world_check(statements[first])} and {code_of(logic_operand(accumulating))}"
        item = cst.parse_expression(f"{model}.no_sync() if {test} else contextlib.nullcontext()")
        self.edits.append(Wrap(statements[first], statements[found.last], (cst.WithItem(item),)))
        self.imports.append(("contextlib", None))

    def _synced(self, why: str) -> None:
        """The finding says that every micro-batch all-reduces, and why."""
        self.notes.append(
            f"gradients are averaged over the ranks on every micro-batch ({why}; add `model.no_sync()` by hand)"
        )

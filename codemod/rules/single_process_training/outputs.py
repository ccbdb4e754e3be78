"""PM601's fix producer for what only rank 0 does: `RankZeroOutputs`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import rank_values
from codemod.analysis.names import conjunction
from codemod.analysis.output_sites import output_sites
from codemod.edits import AddKeyword, InsertBefore, Replace
from codemod.rules.single_process_training.plan import Producer, around


class RankZeroOutputs(Producer):
    """What the ranks must not all do: saves and prints on rank 0, logged numbers reduced over
    the ranks, reads of a checkpoint after a barrier."""

    def control_flow(self) -> None:
        """A rank that skips a step or leaves the loop on its own data leaves the others
        waiting in the next all-reduce; rows every rank joins to its share of a batch would
        be in the global batch once per rank."""
        plan = self.plan
        fetches = plan.loader.fetches if plan.loader is not None else ()
        plan.local = rank_values.step_rank_local(self.context, plan.loop, fetches, plan.share)
        blocked = rank_values.divergence(self.context, plan.loop, plan.local) or rank_values.unshared_rows(
            self.context, plan.loop, plan.local
        )
        if blocked is not None:
            raise blocked

    def saves(self) -> None:
        sites = output_sites(self.context)
        for call in sites.writes:
            if not self.plan.on_rank0(call):
                self._keep_on_main(sites.write_site(call))
        # A file rank 0 saves and every rank then loads (the best model, restored after training)
        # is read after a barrier. A runtime checkpointer writes on rank 0 itself, as torch.save.
        for load, statement in sites.reloads(sites.saves + sites.checkpointer_saves):
            if not self.plan.on_rank0(load):
                self.edits.append(InsertBefore(statement, (cst.parse_statement("distributed.barrier()\n"),)))

    def _keep_on_main(self, site: cst.BaseStatement) -> None:
        """A save's `write_site` on rank 0 alone: the whole `if` around it, or the statement itself."""
        if isinstance(site, cst.If):
            self.plan.rank0.append(site)
            main = cst.parse_expression("distributed.is_main()")
            self.edits.append(Replace(site.test, lambda test: conjunction(test, main)))
        else:
            self.plan.only_on_main(site)

    def outputs(self) -> None:
        sites = output_sites(self.context)
        for call, how in sites.shown:
            if self.plan.on_rank0(call):
                continue
            if how == "print":
                self.edits.append(Replace(call.func, cst.parse_expression("distributed.print0")))
                self._reduce(call)
            elif how == "progress":
                self.edits.append(AddKeyword(call, "disable", cst.parse_expression("not distributed.is_main()")))
            elif (statement := sites.own_statement(call)) is not None:  # else left on every rank
                self.plan.only_on_main(statement)

    def _reduce(self, call: cst.Call) -> None:
        """Losses in a print become their mean over the ranks: a collective, so only where
        every rank prints, under conditions that are the same on every rank."""
        for target in rank_values.averaged_values(self.context, call, self.plan.local, self.plan.loop):
            self.edits.append(Replace(target, around("distributed.all_reduce_mean")))

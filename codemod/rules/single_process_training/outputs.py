"""PM601's fix producer for what only rank 0 does: `RankZeroOutputs`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis import rank_values
from codemod.analysis.output_sites import output_sites
from codemod.edits import BODY_OWNERS, AddKeyword, InsertBefore, Replace
from codemod.rules.single_process_training.plan import (
    Blocked,
    Producer,
    and_,
    around,
    parse_expr,
    parse_line,
)


class RankZeroOutputs(Producer):
    """What the ranks must not all do: saves and prints on rank 0, logged numbers reduced over
    the ranks, reads of a checkpoint after a barrier."""

    def control_flow(self) -> None:
        """A rank that skips a step or leaves the loop on its own data leaves the others
        waiting in the next all-reduce."""
        plan = self.plan
        fetches = plan.loader.fetches if plan.loader is not None else ()
        plan.local = rank_values.step_rank_local(self.context, plan.loop, fetches, plan.share)
        blocked = rank_values.divergence(self.context, plan.loop, plan.local)
        if blocked is not None:
            raise blocked

    def saves(self) -> None:
        sites = output_sites(self.context)
        for call in sites.writes:
            self._save_on_main(call)
        # A runtime checkpointer writes on rank 0 itself; what every rank then loads is as torch.save's.
        self._loads_after(sites.saves + sites.checkpointer_saves)

    def _loads_after(self, saves) -> None:
        """A file rank 0 saves and every rank then loads (the best model, restored after
        training): `distributed.barrier()` before the load, so that no rank reads before the
        write is done. A path in a temporary folder each process makes for itself is a file
        only rank 0 has: reported."""
        barriers: set[int] = set()
        for load, path in output_sites(self.context).loads_after(saves):
            unshared = facts.unshared_file(self.context, path)
            if unshared is not None:
                raise Blocked(load, unshared)
            statement = self.index.statement_of(load)
            if id(statement) in barriers or not isinstance(self.parents.get(statement), BODY_OWNERS):
                continue
            if self.plan.on_rank0(load):
                continue
            barriers.add(id(statement))
            self.edits.append(InsertBefore(statement, (parse_line("distributed.barrier()\n"),)))

    def _save_on_main(self, call: cst.Call) -> None:
        if self.plan.on_rank0(call):
            return
        sites = output_sites(self.context)
        statement = sites.opened_for(self.index.statement_of(call)) or sites.own_statement(call)
        if statement is None:
            raise Blocked(
                call,
                f"`{self.plan.src(call.func)}` is part of a larger statement; PM601 writes checkpoints "
                "on rank 0 only in statements of their own",
            )
        if not isinstance(self.parents.get(statement), BODY_OWNERS):
            raise Blocked(call, f"`{self.plan.src(call.func)}` is on the line of its `if`; put it on a line of its own")
        condition = sites.alone_if(statement)
        if condition is not None:
            self.plan.rank0.append(condition)
            self.edits.append(Replace(condition.test, lambda test: and_(test, parse_expr("distributed.is_main()"))))
            return
        self.plan.only_on_main(statement)

    def outputs(self) -> None:
        for call, how in output_sites(self.context).shown:
            if self.plan.on_rank0(call):
                continue
            if how == "print":
                self.edits.append(Replace(call.func, parse_expr("distributed.print0")))
                self._reduce(call)
            elif how == "progress":
                self.edits.append(AddKeyword(call, "disable", parse_expr("not distributed.is_main()")))
            else:
                self._rank0_statement(call)

    def _rank0_statement(self, call: cst.Call) -> None:
        statement = output_sites(self.context).own_statement(call)
        if statement is not None and isinstance(self.parents.get(statement), BODY_OWNERS):
            self.plan.only_on_main(statement)  # else part of a larger statement: left on every rank

    def _reduce(self, call: cst.Call) -> None:
        """Losses in a print become their mean over the ranks: a collective, so only where
        every rank prints, under conditions that are the same on every rank."""
        for target in rank_values.averaged_values(self.context, call, self.plan.local, self.plan.loop):
            self.edits.append(Replace(target, around("distributed.all_reduce_mean")))

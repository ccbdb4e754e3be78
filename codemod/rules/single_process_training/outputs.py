"""PM601's fix producer for what only rank 0 does: `RankZeroOutputs`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis import rank_values
from codemod.analysis.output_sites import output_sites
from codemod.edits import AddKeyword, InsertBefore, Replace
from codemod.rules.single_process_training.plan import (
    Blocked,
    Producer,
    and_,
    make_call,
    only_on_main,
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
        share = self.index.statement_of(plan.local_batch) if plan.local_batch is not None else plan.batch_statement
        local = plan.local = rank_values.step_rank_local(self.context, plan.loop, fetches, share)
        test = rank_values.diverging_test(self.context, plan.loop, local)
        if test is None:
            return
        decides = (
            "whether the loop goes on"
            if test is getattr(plan.loop.loop, "test", None)
            else ("whether a step runs or the loop goes on")
        )
        raise Blocked(
            test,
            f"`{plan.src(test)}` depends on each rank's own batch and decides {decides}; ranks would fall out of step",
        )

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
            differs = facts.differs_per_process(self.context, path)
            if differs is not None:
                raise Blocked(load, self._not_shared(path, differs))
            statement = self.index.statement_of(load)
            if id(statement) in barriers or not isinstance(
                self.parents.get(statement), (cst.IndentedBlock, cst.Module)
            ):
                continue
            if any(self.index.inside(load, region) for region in self.plan.rank0):
                continue
            barriers.add(id(statement))
            self.edits.append(InsertBefore(statement, (parse_line("distributed.barrier()\n"),)))

    def _not_shared(self, path: cst.BaseExpression, differs: facts.PerProcess) -> str:
        """Why rank 0's file may not be the one the other ranks read back."""
        shown, culprit = self.plan.src(path), self.plan.src(differs.node)
        if differs.temporary:
            where = f"`{shown}` is in a temporary folder each process makes for itself (`{culprit}`)"
        elif differs.source:
            where = f"`{shown}` is built from `{culprit}`, which differs in every process"
        else:
            where = f"PM601 cannot tell that `{shown}` is the same path on every rank (`{culprit}` is not followed)"
        return (
            f"{where}; rank 0 alone saves the checkpoint there and every rank reads it back: "
            "build the path from values all ranks share (literals, options, config values)"
        )

    def _save_on_main(self, call: cst.Call) -> None:
        if any(self.index.inside(call, region) for region in self.plan.rank0):
            return
        statement = self.index.statement_of(call)
        small = self.parents.get(call)
        opened = output_sites(self.context).opened_for(statement)
        if opened is not None:
            statement = opened
        elif not (
            isinstance(small, cst.Expr) and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
        ):
            raise Blocked(
                call,
                f"`{self.plan.src(call.func)}` is part of a larger statement; PM601 writes checkpoints "
                "on rank 0 only in statements of their own",
            )
        holder = self.parents.get(statement)
        if not isinstance(holder, (cst.IndentedBlock, cst.Module)):
            raise Blocked(call, f"`{self.plan.src(call.func)}` is on the line of its `if`; put it on a line of its own")
        condition = self.parents.get(holder)
        if (
            isinstance(condition, cst.If)
            and condition.orelse is None
            and output_sites(self.context).runs_alone(condition)
        ):
            self.plan.rank0.append(condition)
            self.edits.append(Replace(condition.test, lambda test: and_(test, parse_expr("distributed.is_main()"))))
            return
        self.plan.rank0.append(statement)
        self.edits.append(Replace(statement, only_on_main))

    def outputs(self) -> None:
        sites = output_sites(self.context)
        kinds = {id(c): kind for kind, calls in enumerate((sites.prints, sites.progress_bars)) for c in calls}
        for call in sorted((*sites.prints, *sites.progress_bars, *sites.log_calls), key=self.index.order):
            if any(self.index.inside(call, region) for region in self.plan.rank0):
                continue
            kind = kinds.get(id(call))
            if kind == 0:
                self.edits.append(Replace(call.func, parse_expr("distributed.print0")))
                self._reduce(call)
            elif kind == 1:
                self.edits.append(AddKeyword(call, "disable", parse_expr("not distributed.is_main()")))
            else:
                self._rank0_statement(call)

    def _rank0_statement(self, call: cst.Call) -> None:
        statement = self.index.statement_of(call)
        if not (
            isinstance(self.parents.get(call), cst.Expr)
            and isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(self.parents.get(statement), (cst.IndentedBlock, cst.Module))
        ):
            return  # part of a larger statement: left on every rank
        self.plan.rank0.append(statement)
        self.edits.append(Replace(statement, only_on_main))

    def _reduce(self, call: cst.Call) -> None:
        """Losses in a print become their mean over the ranks: a collective, so only where
        every rank prints, under conditions that are the same on every rank."""
        for target in rank_values.averaged_values(self.context, call, self.plan.local, self.plan.loop):
            self.edits.append(Replace(target, lambda value: make_call("distributed.all_reduce_mean", value)))

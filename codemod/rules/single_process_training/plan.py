"""PM601's plan of one file: what its fix producers share (the training loop, where the
model is built, the loader, where setup() goes, the edits so far) and the edits they write."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import process_group
from codemod.analysis.distributed import RankLocal
from codemod.analysis.names import fresh_name
from codemod.analysis.step_batches import LoaderSite, step_batches
from codemod.edits import Edit, Replace


def around(func: str):
    """What a Replace edit puts in place of a value: `func(value)`."""
    return lambda value: cst.Call(cst.parse_expression(func), [cst.Arg(value)])


def moved_into(compound: str):
    """What a Replace edit puts in place of a statement: the compound statement `compound`
    (its first block a `pass`) holding it in that block, the statement's comments above it."""

    def wrap(updated: cst.BaseStatement) -> cst.BaseStatement:
        outer = cst.parse_statement(compound)
        body = outer.body.with_changes(body=[updated.with_changes(leading_lines=[])])
        return outer.with_changes(body=body, leading_lines=updated.leading_lines)

    return wrap


class Plan:
    """The state of PM601's rewrite of one file, and the look-ups its producers share."""

    def __init__(self, context) -> None:
        self.context = context
        self.edits: list[Edit] = []
        self.imports: list[tuple[str, str | None]] = []
        self.notes: list[str] = []
        self.taken = set(context.index.spelled_names)  # the names a new variable must not take
        self.rank0: list[cst.CSTNode] = []  # code that only rank 0 runs after the rewrite
        self.world_uses: list[cst.CSTNode] = []  # where the `world` variable is read
        self.share: cst.CSTNode | None = None  # the statement that slices or draws each rank's share of the batch
        self.local: RankLocal | None = None  # the values each rank computes for itself in the loop
        self.sampler_draws: cst.Call | None = None  # a sampler drawing with replacement, per rank
        self.batches = step_batches(context)  # where the step loop's batches come from
        self.loader: LoaderSite | None = None

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken)

    def on_rank0(self, node: cst.CSTNode) -> bool:
        """Does `node` run only on rank 0 after the rewrite?"""
        return any(self.context.index.inside(node, region) for region in self.rank0)

    def only_on_main(self, statement: cst.BaseStatement) -> None:
        """`if distributed.is_main():` around `statement`, its comments above the `if`."""
        self.rank0.append(statement)
        self.edits.append(Replace(statement, moved_into("if distributed.is_main():\n    pass\n")))

    def world_check(self, at: cst.CSTNode) -> str:
        """`world.distributed` where the `world` variable is visible at `at`, else
        `distributed.world().distributed`."""
        if self.sees_world(at):
            self.world_uses.append(at)
            return f"{self.world_name}.distributed"
        return "distributed.world().distributed"

    def sees_world(self, at: cst.CSTNode) -> bool:
        """Is the `world` variable, set right after setup(), bound where `at` runs?"""
        return process_group.sees(self.context, at, self.setup)


class Producer:
    """One concern of the rewrite (the model, the data, setup, accumulation, outputs): it
    reads the plan, adds edits to it, and raises NotDistributable where it cannot be made."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.context, self.index = plan.context, plan.context.index
        self.edits, self.imports, self.notes = plan.edits, plan.imports, plan.notes  # the plan's own lists

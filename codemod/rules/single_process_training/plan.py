"""PM601's plan of one file: what its fix producers share (the training loop, where the
model is built, the loader, where setup() goes, the edits so far) and the syntax they write."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import process_group
from codemod.analysis.distributed import NotDistributable, RankLocal
from codemod.analysis.names import fresh_name
from codemod.analysis.step_batches import LoaderSite, step_batches
from codemod.edits import Edit, Replace

IMPORT_DISTRIBUTED = ("runtime", "distributed")
IMPORT_SAMPLER = ("torch.utils.data", "DistributedSampler")
IMPORT_DDP = ("torch.nn.parallel", "DistributedDataParallel")
IMPORT_CONTEXTLIB = ("contextlib", None)
IMPORT_ATEXIT = ("atexit", None)


# What keeps the rewrite from being made: reported, without a fix, at its node.
Blocked = NotDistributable


def parse_expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def make_call(func: str, *args: cst.BaseExpression) -> cst.Call:
    return cst.Call(parse_expr(func), [cst.Arg(a) for a in args])


def around(func: str):
    """What a Replace edit puts in place of a value: `func(value)`."""
    return lambda value: make_call(func, value)


def parse_line(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def code_of(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def parenthesized(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` as an operand of `and` / `not`: in parentheses unless it binds tighter."""
    if (
        isinstance(expr, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr, cst.UnaryOperation))
        and not expr.lpar
    ):
        return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return expr


def and_(left: cst.BaseExpression, right: cst.BaseExpression) -> cst.BooleanOperation:
    if isinstance(left, cst.BooleanOperation) and isinstance(left.operator, cst.And) and not left.lpar:
        pass  # `a and b and c` needs no parentheses
    else:
        left = parenthesized(left)
    return cst.BooleanOperation(left, cst.And(), parenthesized(right))


def negation(test: cst.BaseExpression) -> cst.BaseExpression:
    """`not test`, written as a reader would: `a == b` -> `a != b`."""
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        target = test.comparisons[0]
        swap = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}.get(type(target.operator))
        if swap is not None:
            operator = swap(
                whitespace_before=target.operator.whitespace_before, whitespace_after=target.operator.whitespace_after
            )
            return test.with_changes(comparisons=[target.with_changes(operator=operator)])
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return test.expression
    return cst.UnaryOperation(cst.Not(), parenthesized(test))


def moved_into(compound: str):
    """What a Replace edit puts in place of a statement: the compound statement `compound`
    (its first block a `pass`) holding it in that block, the statement's comments above it."""

    def wrap(updated: cst.BaseStatement) -> cst.BaseStatement:
        outer = parse_line(compound)
        body = outer.body.with_changes(body=[updated.with_changes(leading_lines=[])])
        return outer.with_changes(body=body, leading_lines=updated.leading_lines)

    return wrap


class Plan:
    """The state of PM601's rewrite of one file, and the look-ups its producers share."""

    def __init__(self, context) -> None:
        self.context = context
        self.index = context.index
        self.parents = context.parents
        self.edits: list[Edit] = []
        self.imports: list[tuple[str, str | None]] = []
        self.notes: list[str] = []
        self._taken: set[str] | None = None
        self.rank0: list[cst.CSTNode] = []  # code that only rank 0 runs after the rewrite
        self.world_uses: list[cst.CSTNode] = []  # where the `world` variable is read
        self.share: cst.CSTNode | None = None  # the statement that slices or draws each rank's share of the batch
        self.local: RankLocal | None = None  # the values each rank computes for itself in the loop
        self.sampler_draws: cst.Call | None = None  # a sampler drawing with replacement, per rank
        self.batches = step_batches(context)  # where the step loop's batches come from
        self.loader: LoaderSite | None = None

    def src(self, node: cst.CSTNode) -> str:
        return self.context.module.code_for_node(node).strip()

    def fresh(self, base: str) -> str:
        if self._taken is None:
            self._taken = {n.value for n in self.index.find(cst.Name)}
        return fresh_name(base, self._taken)

    def on_rank0(self, node: cst.CSTNode) -> bool:
        """Does `node` run only on rank 0 after the rewrite?"""
        return any(self.index.inside(node, region) for region in self.rank0)

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
    reads the plan, adds edits to it, and raises Blocked where it cannot be made."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.context, self.index, self.parents = plan.context, plan.index, plan.parents
        self.edits, self.imports, self.notes = plan.edits, plan.imports, plan.notes  # the plan's own lists

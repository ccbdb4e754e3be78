"""PM601's fix producer for the batches: `DataSharding`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis.loaders import (
    RANDOM,
    SAME,
    StepData,
)
from codemod.analysis.step_batches import LoaderSite
from codemod.edits import AddKeyword, InsertAfter, InsertBefore, Replace
from codemod.rules.single_process_training.plan import (
    IMPORT_SAMPLER,
    Blocked,
    Producer,
    and_,
    make_call,
    parenthesized,
    parse_expr,
)


class DataSharding(Producer):
    """The batches: the loader that feeds the step loop gets a DistributedSampler and each
    rank's share of the batch; batches cut or drawn by hand are split or seeded per rank."""

    def find_loader(self, loop) -> LoaderSite | None:
        return self.plan.batches.loader(loop.loop)

    def batches(self, loop) -> cst.Call | None:
        """Split the batches of the training loop over the ranks: a DistributedSampler for its
        DataLoader, or each rank's share of a manual permutation batch. Returns the call drawing
        a shared permutation (which must not be reseeded per rank), if any."""
        statement = loop.loop
        if self.plan.loader is not None:
            self._shard_loader(self.plan.loader, statement)
            return None
        permutation = self._manual_batches(statement)
        if permutation is not None:
            return permutation
        if self._random_batches(statement):
            return None
        data = (
            self.plan.batches.fetched_draw(statement)
            if isinstance(statement, cst.While)
            else self.context.loaders.step_data(statement)
        )
        if data is not None:
            raise Blocked(getattr(statement, "iter", statement), self._step_data_reason(statement, data))
        elsewhere = self.plan.batches.built_elsewhere(statement)
        if elsewhere is not None:
            raise Blocked(
                statement.iter,
                f"the batches of `{self.plan.src(statement.iter)}` come from a DataLoader that another module "
                f"of the project builds ({elsewhere}); PM601 rewrites only the file that trains: give that "
                "DataLoader a DistributedSampler and the per-rank batch size there",
            )
        rebuilt = self.plan.batches.rebuilt_per_pass(statement)
        if rebuilt is not None:
            raise Blocked(
                statement.iter,
                f"the batches of `{self.plan.src(statement.iter)}` come from what line "
                f"{self.context.line(rebuilt)} builds anew on each pass of the loop around it; PM601 splits "
                "the batches of one DataLoader built once: build it before that loop",
            )
        if isinstance(statement, cst.While):
            raise Blocked(
                statement,
                "it cannot tell where the batches of this `while` loop come from, so it cannot split "
                "them over the ranks; take them with `next(it)` of `it = iter(loader)` from a DataLoader",
            )
        raise Blocked(
            statement.iter,
            f"it cannot tell where the batches of `{self.plan.src(statement.iter)}` come from, "
            "so it cannot split them over the ranks; use a DataLoader",
        )

    def _step_data_reason(self, loop: cst.For, data: StepData) -> str:
        """Why PM601 does not split the steps of `loop` over ranks: what its data is (RANDOM, SAME, OUTSIDE)."""
        if data.how == RANDOM:
            return (
                f"each step draws its batch at random (`{self.plan.src(data.at)}`, line {self.context.line(data.at)}), "
                "in a way PM601 does not split (one draw in the loop whose first dimension is the batch size); "
                "give each rank its own seed so that the ranks draw different batches"
            )
        if data.how == SAME:
            return (
                f"every step trains on the same data (full-batch training: `{self.plan.src(loop.iter)}` "
                "counts the steps and the loop draws no batch), so there are no batches to split over the "
                "ranks; training on several GPUs needs the data itself split, a part per rank"
            )
        return (
            f"each step's data comes from `{self.plan.src(data.at)}` (line {self.context.line(data.at)}), "
            "not from a dataset, so there are no batches to split over the ranks; each rank would need "
            "its own source (its own seed, its own environment)"
        )

    def _shard_loader(self, loader: LoaderSite, loop: cst.For) -> None:
        call, statement = loader.call, loader.statement
        found = self.plan.batches.loader_arguments(loader, loop)
        if found.options is not None:
            self._share_options(loader, loop, found)
            return
        dataset, size, shuffle = found.dataset, found.size, found.shuffle
        if found.sampler is not None:
            self._share_draws(found.sampler.value, call)
            self.edits.append(Replace(size.value, lambda value: make_call("distributed.local_batch_size", value)))
            return
        sampler_name = self.plan.fresh("sampler")
        check = self.plan.world_check(statement)
        literal = shuffle.value.value if shuffle is not None and isinstance(shuffle.value, cst.Name) else None
        shuffled = shuffle is not None and literal != "False"
        arguments = [cst.Arg(dataset)]
        if not shuffled:
            arguments.append(cst.Arg(parse_expr("False"), keyword=cst.Name("shuffle")))
        elif literal != "True":
            arguments.append(cst.Arg(shuffle.value, keyword=cst.Name("shuffle")))
        seed = self.plan.batches.order_seed(call, statement) if shuffled else None
        if seed is not None:
            arguments.append(cst.Arg(seed, keyword=cst.Name("seed")))
        space = cst.SimpleWhitespace(" ")
        arguments = [a.with_changes(comma=cst.Comma(whitespace_after=space)) for a in arguments[:-1]] + arguments[-1:]
        arguments = [
            a.with_changes(equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
            if a.keyword is not None
            else a
            for a in arguments
        ]
        sampler = cst.IfExp(
            test=check, body=cst.Call(cst.Name("DistributedSampler"), arguments), orelse=parse_expr("None")
        )
        self.edits.append(
            InsertBefore(
                statement, (cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(sampler_name))], sampler)]),)
            )
        )
        self.edits.append(Replace(size.value, lambda value: make_call("distributed.local_batch_size", value)))
        if shuffled:
            absent = parse_expr(f"{sampler_name} is None")
            if literal == "True":
                self.edits.append(Replace(shuffle.value, absent))
            else:
                self.edits.append(Replace(shuffle.value, lambda value: and_(value, absent)))
        self.edits.append(AddKeyword(call, "sampler", cst.Name(sampler_name)))
        self.imports.append(IMPORT_SAMPLER)
        self._set_epoch(loader, loop, sampler_name)

    def _share_options(self, loader: LoaderSite, loop: cst.For, found) -> None:
        """`DataLoader(dataset, **options)`: the options this process needs, from
        `distributed.loader_options(dataset, options)` (its share of the batch, a
        DistributedSampler), whatever the dict holds; its sampler told each epoch."""
        arguments = [cst.Arg(found.dataset), cst.Arg(found.options)]
        seed = self.plan.batches.order_seed(loader.call, loader.statement)
        if seed is not None:
            tight = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
            arguments.append(cst.Arg(seed, keyword=cst.Name("seed"), equal=tight))
        self.edits.append(Replace(found.options, cst.Call(parse_expr("distributed.loader_options"), arguments)))
        self.imports.append(IMPORT_SAMPLER)
        self._set_epoch(loader, loop, None)

    def _share_draws(self, sampler: cst.BaseExpression, call: cst.Call) -> None:
        """A sampler that draws `num_samples` indices with replacement from torch's global
        generator: each rank draws its share of them (`local_batch_size(num_samples)`),
        from that generator reseeded per rank (see seeds). Together the ranks draw as
        many indices an epoch as the one process, each at random: the same distribution,
        other indices. Any other sampler of the script's own is left to the user."""
        value, count = self.plan.batches.replacement_draws(sampler, call)
        self.edits.append(Replace(count.value, lambda value: make_call("distributed.local_batch_size", value)))
        self.plan.sampler_draws = value

    def _set_epoch(self, loader: LoaderSite, loop, sampler: str | None) -> None:
        """`sampler.set_epoch(epoch)` at the top of each epoch: a new order every epoch
        (`loader.sampler` where the sampler has no name of its own). A `while` loop over
        `next(it)` tells it where it starts a new pass (`it = iter(loader)`)."""
        site = self.plan.batches.epoch_site(loader, loop, sampler is not None)
        if site is None:
            return  # one pass over the data: epoch 0's order
        if site.handle is None:
            handle: cst.BaseExpression = cst.Name(sampler)
            guard: cst.BaseExpression = parse_expr(f"{sampler} is not None")
        else:
            handle = cst.Attribute(site.handle, cst.Name("sampler"))
            guard = cst.Call(
                cst.Name("isinstance"),
                [
                    cst.Arg(handle, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    cst.Arg(cst.Name("DistributedSampler")),
                ],
            )
        # The epoch's number, or (none to read) the passes counted on the sampler, after each one.
        epoch = site.number or cst.BinaryOperation(
            cst.Attribute(handle, cst.Name("epoch")), cst.Add(), cst.Integer("1")
        )
        call = cst.Call(cst.Attribute(handle, cst.Name("set_epoch")), [cst.Arg(epoch)])
        statement = cst.If(guard, cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(call)])]))
        if site.number is not None:
            self.edits.append(InsertBefore(site.loop.body.body[0], (statement,)))
            return
        for restart in loader.restarts:  # before the next pass starts
            self.edits.append(InsertBefore(restart, (statement,)))
        if site.after is not None:
            self.edits.append(InsertAfter(site.after, (statement,)))

    def _manual_batches(self, loop) -> cst.Call | None:
        """`for i in range(...)` over slices of a `torch.randperm` permutation: each rank
        takes every N-th index of each batch (`perm[i:i + b][world.rank::world.size]`)."""
        found = self.plan.batches.permutation_slice(loop)
        if found is None:
            return None
        subscript, permutation = found
        if not self.plan.sees_world(subscript):
            raise Blocked(
                subscript,
                "the batches are sliced in another function than the one that chooses the "
                "device; split them over the ranks by hand",
            )
        self.plan.world_uses.append(subscript)
        world = self.plan.world_name
        share = cst.SubscriptElement(
            cst.Slice(lower=parse_expr(f"{world}.rank"), upper=None, step=parse_expr(f"{world}.size"))
        )
        self.edits.append(Replace(subscript, lambda updated: cst.Subscript(updated, [share])))
        self.plan.local_batch = subscript
        return permutation

    def _random_batches(self, loop) -> bool:
        """Batches drawn at random every step: each rank draws its share,
        `local_batch_size(batch_size)`, in every draw that batch size sizes, from its own
        reseeded generator (see seeds)."""
        found = self.plan.batches.random_batches(loop)
        if found is None:
            return False
        for size in found.sizes:
            self.edits.append(Replace(size, lambda value: make_call("distributed.local_batch_size", value)))
        self.plan.batch_statement = found.statement
        return True

    def seeds(self, permutation: cst.Call | None) -> None:
        """Where the loop draws random numbers itself (nanoGPT's `torch.randint` batches,
        noise, augmentation) from a global generator the script seeds, each rank reseeds it
        with its own offset before training: seeded alike, the ranks would draw alike.
        Unseeded global generators start from the OS's entropy, per process already;
        draws from generator objects the script seeds are reported."""
        loop = self.plan.loop.loop
        outer = self.index.outermost_loop(loop)
        lines = []
        for seed in self.plan.batches.reseeds(loop, permutation, self.plan.sampler_draws):
            value = cst.BinaryOperation(
                parenthesized(seed.args[0].value), cst.Add(), make_call("distributed.seed_offset")
            )
            lines.append(cst.SimpleStatementLine([cst.Expr(cst.Call(seed.func, [cst.Arg(value)]))]))
        if lines:
            self.edits.append(InsertBefore(outer, (cst.If(self.plan.world_check(outer), cst.IndentedBlock(lines)),)))

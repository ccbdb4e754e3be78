"""PM601's fix producer for the batches: `DataSharding`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis.distributed import NotDistributable
from codemod.analysis.names import code_of, conjunction, logic_operand
from codemod.analysis.step_batches import LoaderSite
from codemod.edits import AddKeyword, InsertAfter, InsertBefore, Replace
from codemod.rules.single_process_training.plan import Producer, around

IMPORT_SAMPLER = ("torch.utils.data", "DistributedSampler")


class DataSharding(Producer):
    """The batches: the loader that feeds the step loop gets a DistributedSampler and each
    rank's share of the batch; batches cut or drawn by hand are split or seeded per rank."""

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
        raise self.plan.batches.split_obstacle(statement)

    def _shard_loader(self, loader: LoaderSite, loop: cst.For) -> None:
        call, statement = loader.call, loader.statement
        found = self.plan.batches.loader_arguments(loader, loop)
        if found.options is not None:
            self._share_options(loader, loop, found)
            return
        self.edits.append(Replace(found.size.value, around("distributed.local_batch_size")))
        if found.sampler is not None:
            self._share_draws(found.sampler.value, call)
            return
        sampler_name = self.plan.fresh("sampler")
        check = self.plan.world_check(statement)
        sampler = f"DistributedSampler({', '.join(found.sampler_arguments)}) if {check} else None"
        self.edits.append(InsertBefore(statement, (cst.parse_statement(f"{sampler_name} = {sampler}\n"),)))
        if found.shuffled:
            absent = cst.parse_expression(f"{sampler_name} is None")
            if found.always_shuffled:
                self.edits.append(Replace(found.shuffle.value, absent))
            else:
                self.edits.append(Replace(found.shuffle.value, lambda value: conjunction(value, absent)))
        self.edits.append(AddKeyword(call, "sampler", cst.Name(sampler_name)))
        self.imports.append(IMPORT_SAMPLER)
        self._set_epoch(loader, loop, sampler_name)

    def _share_options(self, loader: LoaderSite, loop: cst.For, found) -> None:
        """`DataLoader(dataset, **options)`: the options this process needs, from
        `distributed.loader_options(dataset, options)` (its share of the batch, a
        DistributedSampler), whatever the dict holds; its sampler told each epoch."""
        arguments = [code_of(found.dataset), code_of(found.options)]
        if found.seed is not None:
            arguments.append(f"seed={code_of(found.seed)}")
        options = cst.parse_expression(f"distributed.loader_options({', '.join(arguments)})")
        self.edits.append(Replace(found.options, options))
        self.imports.append(IMPORT_SAMPLER)
        self._set_epoch(loader, loop, None)

    def _share_draws(self, sampler: cst.BaseExpression, call: cst.Call) -> None:
        """A sampler that draws `num_samples` indices with replacement from torch's global
        generator: each rank draws its share of them (`local_batch_size(num_samples)`),
        from that generator reseeded per rank (see seeds). Together the ranks draw as
        many indices an epoch as the one process, each at random: the same distribution,
        other indices. Any other sampler of the script's own is left to the user."""
        value, count = self.plan.batches.replacement_draws(sampler, call)
        self.edits.append(Replace(count.value, around("distributed.local_batch_size")))
        self.plan.sampler_draws = value

    def _set_epoch(self, loader: LoaderSite, loop, sampler: str | None) -> None:
        """`sampler.set_epoch(epoch)` at the top of each epoch: a new order every epoch
        (`loader.sampler` where the sampler has no name of its own). A `while` loop over
        `next(it)` tells it where it starts a new pass (`it = iter(loader)`)."""
        site = self.plan.batches.epoch_site(loader, loop, sampler is not None)
        if site is None:
            return  # one pass over the data: epoch 0's order
        if site.handle is None:
            handle, guard = sampler, f"{sampler} is not None"
        else:
            handle = f"{code_of(site.handle)}.sampler"
            guard = f"isinstance({handle}, DistributedSampler)"
        # The epoch's number, or (none to read) the passes counted on the sampler, after each one.
        epoch = code_of(site.number) if site.number is not None else f"{handle}.epoch + 1"
        statement = cst.parse_statement(f"if {guard}:\n    {handle}.set_epoch({epoch})\n")
        self.edits.extend(InsertBefore(anchor, (statement,)) for anchor in site.before)
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
            raise NotDistributable(
                subscript,
                "the batches are sliced in another function than the one that chooses the "
                "device; split them over the ranks by hand",
            )
        self.plan.world_uses.append(subscript)
        rank, size = (cst.parse_expression(f"{self.plan.world_name}.{part}") for part in ("rank", "size"))
        share = cst.SubscriptElement(cst.Slice(lower=rank, upper=None, step=size))
        self.edits.append(Replace(subscript, lambda updated: cst.Subscript(updated, [share])))
        self.plan.share = self.index.statement_of(subscript)
        return permutation

    def _random_batches(self, loop) -> bool:
        """Batches drawn at random every step: each rank draws its share,
        `local_batch_size(batch_size)`, in every draw that batch size sizes, from its own
        reseeded generator (see seeds)."""
        found = self.plan.batches.random_batches(loop)
        if found is None:
            return False
        for size in found.sizes:
            self.edits.append(Replace(size, around("distributed.local_batch_size")))
        self.plan.share = found.statement
        return True

    def seeds(self, permutation: cst.Call | None) -> None:
        """Where the loop draws random numbers itself (nanoGPT's `torch.randint` batches,
        noise, augmentation) from a global generator the script seeds, each rank reseeds it
        with its own offset before training: seeded alike, the ranks would draw alike.
        Unseeded global generators start from the OS's entropy, per process already;
        draws from generator objects the script seeds are reported."""
        loop = self.plan.loop.loop
        outer = self.index.outermost_loop(loop)
        lines = "".join(
            f"    {code_of(seed.func)}({code_of(logic_operand(seed.args[0].value))} + distributed.seed_offset())\n"
            for seed in self.plan.batches.reseeds(loop, permutation, self.plan.sampler_draws)
        )
        if lines:
            check = self.plan.world_check(outer)
            self.edits.append(InsertBefore(outer, (cst.parse_statement(f"if {check}:\n{lines}"),)))

"""PM601's fix producer for the batches: `DataSharding`."""

from __future__ import annotations

import libcst as cst

from codemod.analysis import distributed as facts
from codemod.analysis.bindings import returned_values
from codemod.analysis.loaders import (
    BATCH_SAMPLER_POSITION,
    BATCH_SIZE_POSITION,
    DATALOADER,
    RANDOM,
    SAME,
    SAMPLER_POSITION,
    SHUFFLE_POSITION,
    StepData,
)
from codemod.analysis.loops import own_nodes
from codemod.analysis.names import integer_value, kwarg, method_name, names_read, positional
from codemod.analysis.project import project_of
from codemod.analysis.torch_facts import (
    PERMUTATIONS,
    REBUILDABLE_DATASETS,
)
from codemod.edits import AddKeyword, InsertAfter, InsertBefore, Replace
from codemod.rules.single_process_training.plan import (
    IMPORT_SAMPLER,
    Blocked,
    Loader,
    Producer,
    and_,
    code_of,
    make_call,
    parenthesized,
    parse_expr,
)


class DataSharding(Producer):
    """The batches: the loader that feeds the step loop gets a DistributedSampler and each
    rank's share of the batch; batches cut or drawn by hand are split or seeded per rank."""

    def find_loader(self, loop) -> Loader | None:
        statement = loop.loop
        if not isinstance(statement, cst.For):
            raise Blocked(
                statement,
                "the training loop is a `while` loop; PM601 splits the batches of a `for` loop "
                "over a DataLoader or over a permutation",
            )
        found = self.context.loaders.iterated(statement.iter, statement.target)
        return self._loader(found[0][0] if len(found) == 1 else statement.iter)

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
        data = self.context.loaders.step_data(statement)
        if data is not None:
            raise Blocked(statement.iter, self._step_data_reason(statement, data))
        elsewhere = self._built_elsewhere(statement)
        if elsewhere is not None:
            raise Blocked(
                statement.iter,
                f"the batches of `{self.plan.src(statement.iter)}` come from a DataLoader that another module "
                f"of the project builds ({elsewhere}); PM601 rewrites only the file that trains: give that "
                "DataLoader a DistributedSampler and the per-rank batch size there",
            )
        raise Blocked(
            statement.iter,
            f"it cannot tell where the batches of `{self.plan.src(statement.iter)}` come from, "
            "so it cannot split them over the ranks; use a DataLoader",
        )

    def _built_elsewhere(self, loop: cst.For) -> str | None:
        """`path:line` of the DataLoader construction in another module of the project that
        the loop's batches come from (`train, val = get_loaders()` of `from data import ...`)."""
        loaders = self.context.loaders
        found = loaders.iterated(loop.iter, loop.target)
        if len(found) != 1:
            return None
        for source in loaders.sources(found[0][0], (), 0):
            external = loaders.external.get(id(source))
            if external is not None:
                _, function, _ = external
                return project_of(self.context).shown(function, source)
        return None

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

    def _loader(self, expr: cst.BaseExpression) -> Loader | None:
        """The DataLoader construction `expr` evaluates to, through variables, `self.`
        attributes, a helper that returns it and a parameter of the training function."""
        handles: dict[int, cst.BaseExpression] = {}
        shared = False
        for _ in range(8):
            scope = facts.function_of(self.context, expr)
            if isinstance(expr, (cst.Name, cst.Attribute)):
                handles.setdefault(id(scope), expr)
            if isinstance(expr, cst.Call):
                if self.names.is_(expr.func, DATALOADER) and not self.names.local(expr.func):
                    statement = self.index.statement_of(expr)
                    return Loader(expr, statement, facts.function_of(self.context, expr), handles, shared)
                helper = self.bindings.local_function(expr.func)
                if helper is None:
                    return None
                values = returned_values(helper)
                if len(values) != 1:
                    return None
                shared = shared or len(self.plan.calls_of(helper)) != 1
                expr = values[0]
                continue
            if isinstance(expr, cst.Name):
                parameter = self.bindings.param_of(expr)
                if parameter is not None:
                    function, param = parameter
                    calls = self.plan.calls_of(function)
                    if len(calls) != 1:
                        return None
                    expr = facts.argument_of(self.context, calls[0], function, param)
                    if expr is None:
                        return None
                    continue
                values = self.bindings.values(expr)
                if not values or len(values) != 1:
                    return None
                expr = values[0]
                continue
            if isinstance(expr, cst.Attribute):
                values = self.bindings.attribute_values(expr)
                if not values or len(values) != 1:
                    return None
                expr = values[0]
                continue
            return None
        return None

    def _shard_loader(self, loader: Loader, loop: cst.For) -> None:
        call, statement = loader.call, loader.statement
        if loader.shared:
            raise Blocked(
                call,
                "the helper that builds this DataLoader builds others too (evaluation?); give the "
                "training loader a DistributedSampler by hand",
            )
        if any(a.star for a in call.args):
            self._share_options(loader, loop)
            return
        own_sampler = kwarg(call, "sampler") or positional(call, SAMPLER_POSITION)
        if (kwarg(call, "batch_sampler") or positional(call, BATCH_SAMPLER_POSITION)) is not None:
            raise Blocked(call, "the DataLoader has its own `batch_sampler`; split it over the ranks by hand")
        if not isinstance(self.parents.get(statement), (cst.IndentedBlock, cst.Module)):
            raise Blocked(call, "the DataLoader is not built in a statement of its own")
        if self.index.inside(statement, loop) or any(
            self.index.inside(statement, outer) for outer in self.plan.enclosing_loops(loop)
        ):
            raise Blocked(call, "a new DataLoader is built every epoch; build it once, before the loop")
        dataset = kwarg(call, "dataset") or positional(call, 0)
        if dataset is None:
            raise Blocked(call, "the DataLoader has no dataset argument PM601 can read")
        self._check_dataset(dataset.value)
        size = kwarg(call, "batch_size") or positional(call, BATCH_SIZE_POSITION)
        if size is None or integer_value(size.value) == 1:
            raise Blocked(
                call,
                "the DataLoader yields one sample per step, which cannot be split over the ranks "
                "(the global batch would grow with their number); give it a batch_size",
            )
        if isinstance(size.value, cst.Name) and size.value.value == "None":
            raise Blocked(call, "the DataLoader does not batch (batch_size=None); split its batches by hand")
        if own_sampler is not None:
            self._share_draws(own_sampler.value, call)
            self.edits.append(Replace(size.value, lambda value: make_call("distributed.local_batch_size", value)))
            return
        sampler_name = self.plan.fresh("sampler")
        check = self.plan.world_check(statement)
        shuffle = kwarg(call, "shuffle") or positional(call, SHUFFLE_POSITION)
        literal = shuffle.value.value if shuffle is not None and isinstance(shuffle.value, cst.Name) else None
        shuffled = shuffle is not None and literal != "False"
        arguments = [cst.Arg(dataset.value)]
        if not shuffled:
            arguments.append(cst.Arg(parse_expr("False"), keyword=cst.Name("shuffle")))
        elif literal != "True":
            arguments.append(cst.Arg(shuffle.value, keyword=cst.Name("shuffle")))
        seed = self._sampler_seed(call, statement) if shuffled else None
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

    def _share_options(self, loader: Loader, loop: cst.For) -> None:
        """`DataLoader(dataset, **options)`: the options this process needs, from
        `distributed.loader_options(dataset, options)` (its share of the batch, a
        DistributedSampler), whatever the dict holds; its sampler told each epoch."""
        call = loader.call
        stars = [a for a in call.args if a.star]
        plain = [a for a in call.args if not a.star and a.keyword is None]
        named = {a.keyword.value for a in call.args if a.keyword is not None}
        if (
            [a.star for a in stars] != ["**"]
            or len(plain) != 1
            or named
            & {
                "dataset",
                "batch_size",
                "shuffle",
                "sampler",
                "batch_sampler",
            }
        ):
            raise Blocked(
                call,
                "the DataLoader takes `*args`/`**kwargs` beside its own batch or sampler arguments; "
                "PM601 cannot see which of them it uses",
            )
        dataset = plain[0].value
        self._check_dataset(dataset)  # a dataset built in the call is one cheap to build twice
        options = stars[0].value
        arguments = [cst.Arg(dataset), cst.Arg(options)]
        seed = self._sampler_seed(call, loader.statement)
        if seed is not None:
            tight = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
            arguments.append(cst.Arg(seed, keyword=cst.Name("seed"), equal=tight))
        self.edits.append(Replace(options, cst.Call(parse_expr("distributed.loader_options"), arguments)))
        self.imports.append(IMPORT_SAMPLER)
        self._set_epoch(loader, loop, None)

    def _share_draws(self, sampler: cst.BaseExpression, call: cst.Call) -> None:
        """A sampler that draws `num_samples` indices with replacement from torch's global
        generator: each rank draws its share of them (`local_batch_size(num_samples)`),
        from that generator reseeded per rank (see _seeds). Together the ranks draw as
        many indices an epoch as the one process, each at random: the same distribution,
        other indices. Any other sampler of the script's own is left to the user."""
        reason = f"the DataLoader has its own `sampler` (`{self.plan.src(sampler)}`); split it over the ranks by hand"
        value = sampler
        if isinstance(value, cst.Name):
            values = self.bindings.values(value) or []
            value = values[0] if len(values) == 1 else None
        if not isinstance(value, cst.Call) or any(a.star for a in value.args):
            raise Blocked(call, reason)
        qualified = next((n for n in self.names.of(value.func) if n in facts.REPLACEMENT_SAMPLERS), None)
        if qualified is None:
            raise Blocked(call, reason)
        replacement = kwarg(value, "replacement") or positional(
            value, 1 if qualified not in facts.WEIGHTED_SAMPLERS else 2
        )
        drawn = code_of(replacement.value) if replacement is not None else None
        if drawn != "True" and not (drawn is None and qualified in facts.WEIGHTED_SAMPLERS):
            raise Blocked(
                call,
                f"{reason}: without replacement it draws a permutation, which the ranks would have to share",
            )
        if kwarg(value, "generator") is not None:
            raise Blocked(
                call,
                f"{reason}: it draws from a generator of its own, seeded alike on every rank",
            )
        count = kwarg(value, "num_samples") or positional(value, facts.REPLACEMENT_SAMPLERS[qualified])
        if count is None:
            raise Blocked(
                call,
                f"{reason}: it draws len(dataset) indices an epoch; give it `num_samples`, which PM601 "
                "splits over the ranks",
            )
        self.edits.append(Replace(count.value, lambda value: make_call("distributed.local_batch_size", value)))
        self.plan.sampler_draws = value

    def _check_dataset(self, dataset: cst.BaseExpression) -> None:
        if isinstance(dataset, cst.Call):
            if not self.names.is_(dataset.func, *REBUILDABLE_DATASETS) or not all(
                isinstance(a.value, (cst.Name, cst.Attribute, cst.Integer)) for a in dataset.args
            ):
                raise Blocked(
                    dataset,
                    "the dataset is built inside the DataLoader call; build it in a variable "
                    "first, so that its sampler can be given the same dataset",
                )
            return
        if not isinstance(dataset, (cst.Name, cst.Attribute)):
            raise Blocked(dataset, "the DataLoader's dataset is an expression PM601 would evaluate twice")
        values = (
            self.bindings.values(dataset) if isinstance(dataset, cst.Name) else self.bindings.attribute_values(dataset)
        ) or []
        for value in values:
            if not isinstance(value, cst.Call):
                continue
            classdef = self.context.kinds.local_class(value.func)
            bases = [value.func]
            for _ in range(8):
                if any(
                    self.names.is_(b, "torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset")
                    for b in bases
                ):
                    raise Blocked(
                        dataset,
                        "the dataset is an IterableDataset, which a DistributedSampler cannot "
                        "split; shard it per rank by hand",
                    )
                if classdef is None:
                    break
                bases = [b.value for b in classdef.bases]
                classdef = next((c for c in (self.context.kinds.local_class(b) for b in bases) if c), None)

    def _sampler_seed(self, call: cst.Call, statement: cst.CSTNode) -> cst.BaseExpression | None:
        """The seed of the DataLoader's order: its generator's, or the global torch seed."""
        generator = kwarg(call, "generator")
        if generator is not None:
            value = generator.value
            if isinstance(value, cst.Name):
                values = self.bindings.values(value) or []
                value = values[0] if len(values) == 1 else None
            if isinstance(value, cst.Call) and method_name(value) == "manual_seed" and value.args:
                seed = value.args[0].value
                return seed if self.plan.visible(seed, statement) else None
            if isinstance(generator.value, cst.Name):  # `g = torch.Generator(); g.manual_seed(s)`
                for seeded in self.index.find(cst.Call):
                    if (
                        method_name(seeded) == "manual_seed"
                        and code_of(seeded.func.value) == generator.value.value
                        and seeded.args
                        and self.plan.visible(seeded.args[0].value, statement)
                    ):
                        return seeded.args[0].value
            return None
        same = facts.function_of(self.context, statement)
        for seeded in reversed(facts.seed_calls(self.context, "torch")):
            if facts.function_of(self.context, seeded) is same and not self.index.before(seeded, statement):
                continue  # seeded after the loader is built
            if seeded.args and self.plan.visible(seeded.args[0].value, statement):
                return seeded.args[0].value
        return None

    def _epoch_loop(self, loop: cst.For) -> tuple[cst.CSTNode | None, cst.FunctionDef | None]:
        """The loop around the training loop that runs once per epoch, in the training
        function or around its one call."""
        node: cst.CSTNode = loop
        for _ in range(4):
            for ancestor in self.index.ancestors(node):
                if isinstance(ancestor, facts.SCOPES):
                    break
                if isinstance(ancestor, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
                    raise Blocked(
                        ancestor,
                        "the epochs run in a comprehension; PM601 tells the sampler each epoch "
                        "(set_epoch) at the top of a `for` loop: write the epochs as one",
                    )
            outer = self.plan.enclosing_loops(node)
            if outer:
                return outer[0], facts.function_of(self.context, outer[0])
            function = facts.function_of(self.context, node)
            if function is None:
                return None, None
            calls = self.plan.calls_of(function)
            if len(calls) != 1:
                return None, None
            node = calls[0]
        return None, None

    def _set_epoch(self, loader: Loader, loop: cst.For, sampler: str | None) -> None:
        """`sampler.set_epoch(epoch)` at the top of each epoch: a new order every epoch
        (`loader.sampler` where the sampler has no name of its own)."""
        epoch_loop, function = self._epoch_loop(loop)
        if epoch_loop is None:
            return  # one pass over the data: epoch 0's order
        if sampler is not None and function is loader.function and self.index.before(loader.statement, epoch_loop):
            handle: cst.BaseExpression = cst.Name(sampler)
            guard: cst.BaseExpression = parse_expr(f"{sampler} is not None")
        else:
            spelled = loader.handles.get(id(function)) or self._self_handle(loader, function)
            if spelled is None or not self.plan.visible(spelled, epoch_loop):
                raise Blocked(
                    epoch_loop,
                    "the DataLoader is not visible in the epoch loop, where its sampler must be "
                    "told the epoch (set_epoch)",
                )
            handle = cst.Attribute(spelled, cst.Name("sampler"))
            guard = cst.Call(
                cst.Name("isinstance"),
                [
                    cst.Arg(handle, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                    cst.Arg(cst.Name("DistributedSampler")),
                ],
            )
        body = epoch_loop.body
        if not isinstance(body, cst.IndentedBlock):
            raise Blocked(epoch_loop, "the epoch loop is written on one line")
        if isinstance(epoch_loop, cst.For) and isinstance(epoch_loop.target, cst.Name):
            call = cst.Call(cst.Attribute(handle, cst.Name("set_epoch")), [cst.Arg(epoch_loop.target)])
            statement = cst.If(guard, cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(call)])]))
            self.edits.append(InsertBefore(body.body[0], (statement,)))
            return
        # No epoch number to read: count the passes on the sampler, after each one.
        step = cst.BinaryOperation(cst.Attribute(handle, cst.Name("epoch")), cst.Add(), cst.Integer("1"))
        call = cst.Call(cst.Attribute(handle, cst.Name("set_epoch")), [cst.Arg(step)])
        statement = cst.If(guard, cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(call)])]))
        holder = next((s for s in body.body if self.index.inside(loop, s)), None)
        if holder is None:
            raise Blocked(epoch_loop, "it cannot tell where an epoch ends")
        self.edits.append(InsertAfter(holder, (statement,)))

    def _self_handle(self, loader: Loader, function) -> cst.BaseExpression | None:
        """`self.plan.loader` in a method of the class another method of which reads the loader
        as `self.plan.loader`."""
        owner = facts.class_of(self.context, function)
        if owner is None:
            return None
        for scope_id, handle in loader.handles.items():
            method = next((f for f in self.index.find(cst.FunctionDef, within=owner) if id(f) == scope_id), None)
            if (
                method is not None
                and facts.class_of(self.context, method) is owner
                and isinstance(handle, cst.Attribute)
                and isinstance(handle.value, cst.Name)
                and handle.value.value == "self"
            ):
                return handle
        return None

    def _manual_batches(self, loop: cst.For) -> cst.Call | None:
        """`for i in range(...)` over slices of a `torch.randperm` permutation: each rank
        takes every N-th index of each batch (`perm[i:i + b][world.rank::world.size]`)."""
        if not isinstance(loop.target, cst.Name):
            return None
        index_name = loop.target.value
        found = []
        for subscript in own_nodes(self.index, cst.Subscript, loop.body):
            if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Slice):
                continue
            part = subscript.slice[0].slice
            if not any(
                n.value == index_name
                for bound in (part.lower, part.upper)
                if bound is not None
                for n in names_read(bound)
            ):
                continue
            if not isinstance(subscript.value, cst.Name):
                continue
            values = self.bindings.values(subscript.value) or []
            permutations = [v for v in values if isinstance(v, cst.Call) and self.names.is_(v.func, *PERMUTATIONS)]
            if permutations and len(permutations) == len(values):
                found.append((subscript, permutations[0]))
        if len(found) != 1:
            return None
        subscript, permutation = found[0]
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

    def _random_batches(self, loop: cst.For) -> bool:
        """Batches drawn at random every step (`torch.randint(n, (batch_size,))`,
        `torch.randn(batch_size, d)`, in the loop or in a helper only it calls): each rank
        draws its share, `local_batch_size(batch_size)`, in every draw that batch size
        sizes, from its own reseeded generator (see _seeds)."""
        places: list[tuple[cst.CSTNode, cst.Call | None]] = [(loop.body, None)]
        for call in own_nodes(self.index, cst.Call, loop.body):
            helper = self.bindings.local_function(call.func) if isinstance(call.func, cst.Name) else None
            if helper is not None and len(self.plan.calls_of(helper)) == 1:
                places.append((helper.body, call))
        found = []
        for body, call in places:
            for draw in own_nodes(self.index, cst.Call, body):
                size = self._first_dimension(draw)
                if size is not None:
                    found.append((body, call, draw, size))
        if not found:
            return False
        bodies = {id(body) for body, _, _, _ in found}
        spelled = {code_of(size) for _, _, _, size in found}
        if len(bodies) != 1 or len(spelled) != 1:
            raise Blocked(
                found[0][2],
                "the step draws its batches at random in several places or with several sizes; "
                "PM601 cannot tell which to split over the ranks",
            )
        body, call, draw, batch = found[0]
        if integer_value(batch) == 1:
            raise Blocked(draw, "the loop draws one sample per step, which cannot be split over the ranks")
        # The draws must be all the batch size sizes: `x = sample(B)` beside `t = randint(T, (B,))`
        # would keep B rows where the draw makes B / N.
        sizes = {id(size) for _, _, _, size in found}
        code = code_of(batch)
        others = [
            n
            for n in own_nodes(self.index, (cst.Name, cst.Attribute), body)
            if code_of(n) == code and id(n) not in sizes and not isinstance(self.parents.get(n), cst.Attribute)
        ]
        if others:
            raise Blocked(
                others[0],
                f"`{code}` sizes more than the random draws of each step (line "
                f"{self.context.line(others[0])}); PM601 cannot tell which sizes are per sample, "
                "to split them over the ranks",
            )
        for _, _, _, size in found:
            self.edits.append(Replace(size, lambda value: make_call("distributed.local_batch_size", value)))
        self.plan.batch_statement = self.index.statement_of(call if call is not None else draw)
        return True

    def _first_dimension(self, draw: cst.Call) -> cst.BaseExpression | None:
        """The first size of a torch random draw: `n` of `torch.randn(n, d)`,
        `torch.rand((n, d))`, `torch.randint(lo, hi, (n,))`, `size=(n, ...)`."""
        names = self.names.of(draw.func)
        if not names & facts.TORCH_DRAWS or names & {"torch.randperm"} or any(a.star for a in draw.args):
            return None
        if any(a.keyword is not None and a.keyword.value == "generator" for a in draw.args):
            return None
        size = kwarg(draw, "size")
        plain = [a.value for a in draw.args if a.keyword is None]
        if size is None and names & {"torch.randint"}:
            size = cst.Arg(plain[-1]) if len(plain) in (2, 3) else None
        if size is None and names & {"torch.rand", "torch.randn"} and plain:
            size = (
                cst.Arg(plain[0])
                if isinstance(plain[0], (cst.Tuple, cst.List))
                else cst.Arg(cst.Tuple([cst.Element(plain[0])]))
            )
        if size is None or not isinstance(size.value, (cst.Tuple, cst.List)) or not size.value.elements:
            return None
        first = size.value.elements[0].value
        return first if isinstance(first, (cst.Name, cst.Attribute, cst.Integer, cst.Subscript)) else None

    def seeds(self, permutation: cst.Call | None) -> None:
        """Where the loop draws random numbers itself (nanoGPT's `torch.randint` batches,
        noise, augmentation) from a global generator the script seeds, each rank reseeds it
        with its own offset before training: seeded alike, the ranks would draw alike.
        Unseeded global generators start from the OS's entropy, per process already;
        draws from generator objects the script seeds are reported."""
        loop = self.plan.loop.loop
        calls = list(own_nodes(self.index, cst.Call, loop.body))
        for call in list(calls):
            helper = self.bindings.local_function(call.func) if isinstance(call.func, cst.Name) else None
            if helper is not None:
                calls.extend(own_nodes(self.index, cst.Call, helper.body))
        draws: dict[str, cst.Call] = {}
        for call in calls:
            if call is permutation:
                continue
            owned = self._seeded_generator(call)
            if owned is not None:
                raise Blocked(
                    call,
                    f"the loop draws from `{owned}`, a generator seeded alike on every rank, which "
                    "PM601 cannot reseed per rank without changing what else it draws; seed it with "
                    "`seed + distributed.seed_offset()` by hand",
                )
            generator = facts.generator_of(self.context, call)
            if generator is not None:
                draws.setdefault(generator, call)
        if self.plan.sampler_draws is not None:
            draws.setdefault("torch", self.plan.sampler_draws)
        outer = [loop, *self.plan.enclosing_loops(loop)][-1]
        lines = []
        for generator, draw in draws.items():
            seeds = [s for s in facts.seed_calls(self.context, generator) if s.args]
            seeds = [
                s
                for s in seeds
                if facts.function_of(self.context, s) is not facts.function_of(self.context, outer)
                or self.index.before(s, outer)
            ]
            if not seeds:
                continue  # never seeded: each process starts from the OS's entropy
            seed = seeds[-1]
            if not self.plan.visible(seed.args[0].value, outer):
                raise Blocked(
                    draw,
                    f"`{self.plan.src(draw.func)}` draws from a generator seeded alike on every rank "
                    f"(line {self.context.line(seed)}), and that seed is out of reach of the loop; "
                    "reseed it with `seed + distributed.seed_offset()` by hand",
                )
            if permutation is not None:
                raise Blocked(
                    draw,
                    "the loop draws random numbers besides the batch permutation, which must be the "
                    "same on every rank; give one of them a generator of its own",
                )
            value = cst.BinaryOperation(
                parenthesized(seed.args[0].value), cst.Add(), make_call("distributed.seed_offset")
            )
            lines.append(cst.SimpleStatementLine([cst.Expr(cst.Call(seed.func, [cst.Arg(value)]))]))
        if lines:
            self.edits.append(InsertBefore(outer, (cst.If(self.plan.world_check(outer), cst.IndentedBlock(lines)),)))

    def _seeded_generator(self, call: cst.Call) -> str | None:
        """The generator object a draw uses (`generator=g`, `rng.integers(...)`), when the
        script builds it with a seed."""
        candidates = []
        generator = kwarg(call, "generator")
        if generator is not None:
            candidates.append(generator.value)
        if isinstance(call.func, cst.Attribute):
            candidates.append(call.func.value)
        for candidate in candidates:
            if not isinstance(candidate, cst.Name):
                continue
            values = self.bindings.values(candidate) or []
            if any(self._is_seeded_generator(value) for value in values):
                return candidate.value
            if any(self._is_generator(value) for value in values) and any(  # `g = Generator(); g.manual_seed(s)`
                method_name(other) in ("manual_seed", "seed")
                and other.args
                and code_of(other.func.value) == candidate.value
                for other in self.index.find(cst.Call)
            ):
                return candidate.value
        return None

    def _is_generator(self, value: cst.BaseExpression) -> bool:
        return isinstance(value, cst.Call) and self.names.is_(
            value.func,
            "torch.Generator",
            "numpy.random.default_rng",
            "numpy.random.RandomState",
            "numpy.random.Generator",
            "random.Random",
        )

    def _is_seeded_generator(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.Call) and method_name(value) == "manual_seed" and value.args:
            return self._is_generator(value.func.value)
        return self._is_generator(value) and bool(value.args)

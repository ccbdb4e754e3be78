"""PM601 (single-process-training): the rule, and the order in which its fix producers
(the model, the data, setup, gradient accumulation, the outputs) build one plan."""

from __future__ import annotations

import libcst as cst

from codemod.analysis.distributed import NotDistributable, single_process_loop
from codemod.analysis.model_sites import model_sites
from codemod.rule import Invalid, Level, Rule, Valid
from codemod.rules.single_process_training import examples as ex
from codemod.rules.single_process_training.accumulation import GradientAccumulation
from codemod.rules.single_process_training.data import DataSharding
from codemod.rules.single_process_training.model import ModelWrap
from codemod.rules.single_process_training.outputs import RankZeroOutputs
from codemod.rules.single_process_training.plan import Plan
from codemod.rules.single_process_training.setup import ProcessGroupSetup


class SingleProcessTraining(Rule):
    """
    ## What it does
    Makes a single-process training script ready for `torchrun`, so that the same
    file trains on one GPU with `python train.py` and on N with
    `torchrun --nproc_per_node=N train.py`, using PyTorch's own data-parallel
    engine, DistributedDataParallel (DDP):

    - `device = distributed.setup(...)` (`runtime.distributed`) where the script
      picks its device: under torchrun it joins the process group (NCCL on CUDA,
      gloo on the CPU) and returns this process's GPU (`LOCAL_RANK`); alone it
      returns the device as before and starts nothing. GPU 0 written as an index
      (`device = 0`, as PyTorch's DDP tutorial writes it) becomes `"cuda"`, the
      same GPU alone and each process's own under torchrun;
    - the DataLoader that feeds the training loop gets a `DistributedSampler`
      (the loader's `shuffle` moves into it, with the script's seed) and a batch
      of `distributed.local_batch_size(batch_size)`, so that N processes step on
      the same global batch as one; `sampler.set_epoch(epoch)` reshuffles every
      epoch. A `while` loop that takes its batches with `next(it)` of
      `it = iter(loader)` (`while step < max_steps:`) gets the same sampler,
      told each new epoch where the loop starts a new pass (`it = iter(loader)`
      on `StopIteration`), or, for a generator of the file that cycles the
      loader (`def cycle(dl): while True: for b in dl: yield b`), at the end
      of each of its passes, inside it. A loader whose settings are a dict (`DataLoader(dataset,
      **options)`) gets `distributed.loader_options(dataset, options)`: the
      same share and sampler, whatever the dict holds. A sampler that draws
      `num_samples` with replacement (`RandomSampler(..., replacement=True)`,
      `WeightedRandomSampler`) draws each rank's share of them, from torch's
      generator reseeded per rank (below). Manual batching over a
      `torch.randperm` permutation takes each rank's share of every batch
      instead;
    - the model is wrapped in `DistributedDataParallel` after it is built,
      moved and compiled (the model itself is compiled, then wrapped, as PM506
      does; DDP still hands the compiler its gradient buckets); with gradient
      accumulation the micro-steps that do not step run under
      `model.no_sync()`;
    - `print` becomes `distributed.print0` (rank 0 prints, losses averaged over
      the ranks with `distributed.all_reduce_mean`), `tqdm` bars and
      `logging.info` run on rank 0, `torch.save` only on rank 0, and
      `model.state_dict()` (and any other attribute DDP does not answer) reads
      `distributed.unwrap(model)`, so checkpoints keep the single-process keys;
      a whole model saved (`torch.save(model, path)`, `{"model": model}` saved
      there or bound to a name that is saved, in a function that reads the
      script's `model` too) saves
      `distributed.unwrap(model)`, the model and not its DDP wrapper; a
      checkpoint that every rank reads back after rank 0 saved it waits for a
      `distributed.barrier()`, when its path is the same in every process
      (built from literals, options, config values or environment variables;
      not from `tempfile`, `uuid`, a clock, a random draw or a process id);
    - where the loop draws random numbers itself (nanoGPT's `torch.randint`
      batches, noise) from a global generator the script seeds, each rank
      reseeds it with `seed + distributed.seed_offset()` before training (an
      unseeded one starts from the OS's entropy, per process already), and
      draws `local_batch_size(batch_size)` samples;
    - `distributed.cleanup()` at exit, on error too: checkpoint writes finish and
      `destroy_process_group()` runs.

    It follows the model and the loader into trainer classes (`self.model`
    built in `__init__`, or given to the constructor and moved there, as in
    PyTorch's DDP tutorial), helpers that build the loader, a device passed
    down from where it is chosen, the one call of a
    training function that is given them or reads them as globals built in the
    `__main__` block, and a model moved under a second name (`m =
    model.to(device)`: DDP wraps the name the loop runs). Logged losses are
    averaged as numbers: the operands of `"..." % (...)`, `"...".format(...)`
    and f-strings, never the message itself; losses kept in a list
    (`losses.append(loss.detach())`) are averaged where they are printed,
    before `.item()` or `.tolist()` (`all_reduce_mean(losses[-1]).item()`).

    Files that already run distributed (`torch.distributed`, DDP, FSDP,
    `DistributedSampler`, Accelerate, Lightning, DeepSpeed, Horovod, torchrun's
    environment variables) are left alone. What the rule cannot make safe is
    reported without a fix: BatchNorm layers, also in the models of torchvision's
    zoo that hold them (each rank would normalise over its own share of the
    batch), an optimizer of tensors alone (no model for DDP to wrap), a batch that cannot be split over the ranks (the
    global batch would change), random draws in the loop from a generator object
    the script seeds (every rank would draw the same, and reseeding it could
    change what else it draws), `DataParallel`, an `IterableDataset` or a
    sampler of the script's own other than the above, a DataLoader built in
    another module of the project (the rule rewrites the file that trains and
    names where the loader is built), a `while` loop whose batches come from an
    iterator that starts the loader's passes itself, other than a generator
    of the file that only cycles it (`while True: for b in loader: yield b`,
    or `yield from loader`, whose sampler is told each new pass inside it), a training loss with
    `reduction="sum"` (or its older spelling `size_average=False`; DDP averages the
    gradients; a summed evaluation loss is fine), embeddings with
    `sparse=True` (sparse gradients), epochs run in a comprehension,
    batches that come from somewhere the rule cannot follow, a training
    forward through a method other than `model(...)`, steps skipped or loops
    left on values each rank computes from its own data (the ranks would fall
    out of step and wait forever), and rows joined to each batch that are not
    part of it (`torch.cat([x, hard_negatives])`: every rank would add all of
    them, so together the ranks would train on them once per rank).

    ## Why is this bad?
    One process drives one GPU. DDP runs one process per GPU, each on its share
    of every batch, and averages the gradients with an all-reduce that overlaps
    the backward pass: the DDP paper (Li et al., "PyTorch Distributed:
    Experiences on Accelerating Data Parallel Training", VLDB 2020,
    arXiv:2006.15704) reports near-linear scaling to 256 GPUs. On the CPU,
    `perfmod verify --nproc 2` on a small MLP classifier (gloo, a shared
    2-core machine) measured 0.99-1.60x the samples per second
    of one process at a global batch of 1024 and 0.36-0.51x at 32, where
    exchanging gradients costs more than computing them: measure on GPUs.

    Rewriting a script by hand is where it goes wrong: a sampler whose
    `set_epoch` is never called repeats one order every epoch, every rank prints
    and overwrites the same checkpoint, `state_dict()` keys gain a `module.`
    prefix, gradient accumulation all-reduces on every micro-step, and a rank
    that leaves the loop early hangs the others.

    ## Example
    ```python
    def main():
        device = "cuda" if torch.cuda.is_available() else "cpu"
        loader = DataLoader(dataset, batch_size=64, shuffle=True)
        model = Net().to(device)
        for epoch in range(epochs):
            for x, y in loader:
                loss = F.cross_entropy(model(x.to(device)), y.to(device))
                ...
            print(f"epoch {epoch} loss {loss.item():.4f}")
            torch.save(model.state_dict(), "last.pt")

    if __name__ == "__main__":
        main()
    ```
    Use instead:
    ```python
    def main():
        device = distributed.setup("cuda" if torch.cuda.is_available() else "cpu")
        world = distributed.world()
        sampler = DistributedSampler(dataset) if world.distributed else None
        loader = DataLoader(dataset, batch_size=distributed.local_batch_size(64), shuffle=sampler is None, sampler=sampler)
        model = Net().to(device)
        if world.distributed:
            model = DistributedDataParallel(model)
        for epoch in range(epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            for x, y in loader:
                ...
            distributed.print0(f"epoch {epoch} loss {distributed.all_reduce_mean(loss).item():.4f}")
            if distributed.is_main():
                torch.save(distributed.unwrap(model).state_dict(), "last.pt")

    if __name__ == "__main__":
        try:
            main()
        finally:
            distributed.cleanup()
    ```

    ## Options
    Opt-in: the rule runs only when selected by its code
    (`perfmod apply --select PM601 --level unsafe`, or `select = [..., "PM601"]`
    in `[tool.perfmod]`); `PM` and `PM6` do not select it; `ALL` does.

    ## Fix safety
    Unsafe. `python train.py` still trains exactly as before: the process group,
    the sampler and the DDP wrapper exist only when torchrun starts more than one
    process, and `local_batch_size`, `print0`, `all_reduce_mean` and `unwrap`
    are the identity alone (the rule's tests compare the losses and checkpoints
    bit for bit). Under torchrun the results are those of the same global batch
    within floating-point tolerance, with these differences:
    - the sample order is the DistributedSampler's, not the DataLoader's
      (seeded with the script's seed); when the dataset does not split evenly
      the sampler repeats a few samples so that every rank steps equally often;
    - `--batch-size` is the global batch: `local_batch_size` fails on every rank
      when it does not divide by the number of processes; with manual batching
      an uneven last batch is split unevenly;
    - logged losses are means over the ranks; other logged values (accuracy
      counts, sums) are rank 0's own;
    - evaluation loops keep their DataLoaders: every rank evaluates the whole
      set (correct, not faster), and prints on rank 0;
    - in a seeded script, dropout and other draws inside the model draw alike
      on every rank unless the loop draws its own batches (then it reseeds);
    - a sampler drawing with replacement draws other indices than the single
      process (each rank from its own seed): the same distribution, not the
      same batches, so only the trend of the losses compares;
    - files other than `torch.save` checkpoints (JSON, CSV, TensorBoard) are
      written by every rank; guard them with `distributed.is_main()`;
    - `logging.info` calls run on rank 0 with rank 0's values (a mean over
      the ranks would need a collective on every rank);
    - a loss summed over the batch by hand (`.sum()`) is averaged by DDP over
      the ranks, which shrinks its gradient by their number (`reduction="sum"`
      is reported);
    - data the script makes at random without a seed differs between ranks.
    The rewrite does not choose FSDP sharding, tensor or pipeline parallelism:
    models that do not fit one GPU need `torch.distributed.fsdp.fully_shard`
    (FSDP2) or `torch.distributed.tensor.parallel`, set up by hand. Check the
    rewrite with `perfmod verify train.py --nproc 2`.
    """

    CODE = "PM601"
    NAME = "single-process-training"
    LEVEL = Level.UNSAFE
    OPT_IN = True
    REQUIRES = ("backward",)
    MESSAGE = (
        "training runs in one process; make the script torchrun-ready (distributed.setup(), "
        "DistributedDataParallel, each rank its share of every batch, output and checkpoints on rank 0)"
    )
    GAIN = (
        "up to N times the samples per second on N GPUs: near-linear to 256 GPUs in the DDP paper (Li et al., "
        "VLDB 2020, arXiv:2006.15704); on 2 CPU processes (gloo, a shared 2-core box) `perfmod verify --nproc 2` "
        "measured 0.99-1.60x at a batch of 1024 and 0.36-0.51x at 32 on a small MLP classifier"
    )

    VALID = [
        Valid("import torch.distributed as dist\n" + ex.LOOP, "already distributed: torch.distributed"),
        Valid(ex.WRAPPED_IN_DDP, "already distributed: DDP"),
        Valid(ex.READS_LOCAL_RANK, "reads torchrun's variables"),
        Valid("from accelerate import Accelerator\n" + ex.LOOP, "Accelerate runs the processes"),
        Valid(ex.SCRIPT_TORCHRUN, "the rewrite: runtime.distributed"),
        Valid("import torch\nmodel = torch.nn.Linear(8, 1)\nprint(model(torch.randn(2, 8)))\n", "no training loop"),
    ]
    INVALID = [
        Invalid(ex.SCRIPT, ex.SCRIPT_TORCHRUN, "setup at the device, sampler, DDP, print0, rank-0 save, cleanup"),
        Invalid(
            ex.ACCUMULATION,
            ex.ACCUMULATION_TORCHRUN,
            "module level, `.cuda()`: setup() of its own and atexit; accumulation under no_sync()",
        ),
        Invalid(
            ex.ACCUMULATION + ex.SAVE_WHOLE,
            ex.ACCUMULATION_TORCHRUN + ex.SAVE_WHOLE_TORCHRUN,
            "a function that saves the whole model object the script wrapped (as it is, in a dict, in a dict "
            "bound to a name): the module, not the DDP wrapper; a list of it that is not saved keeps the wrapper",
        ),
        Invalid(ex.BATCH_NORM, None, "BatchNorm: SyncBatchNorm is the author's call"),
        Invalid(
            ex.WHILE_STEPS,
            ex.WHILE_STEPS_TORCHRUN,
            "a `while` loop over next(iter(loader)): the sampler is told each new pass",
        ),
        Invalid(
            ex.GENERATOR_CHANGES_BATCHES,
            None,
            "a generator of the file that changes the batches starts the loader's passes: PM601 does not "
            "rewrite it to tell the sampler the epoch",
        ),
        Invalid(ex.WHILE_OWN_LOSS, None, "a `while` loop that ends on each rank's own loss"),
        Invalid(ex.DATA_PARALLEL, None, "DataParallel"),
        Invalid(ex.ONE_SAMPLE_PER_STEP, None, "one sample per step: the global batch would change"),
        Invalid(ex.FIXED_GPU, None, "a fixed GPU for every rank"),
        Invalid(ex.FORWARD_THROUGH_METHOD, None, "a forward DDP does not see"),
        Invalid(
            ex.LOOP + "        if loss.item() < 1e-3:\n            break\n", None, "a rank would leave the loop alone"
        ),
        Invalid(
            ex.LOOP + "for x, y in loader:\n    model(x).sum().backward()\n    opt.step()\n", None, "two training loops"
        ),
        Invalid(ex.SUMMED_LOSS, None, "a summed loss: DDP's average would shrink its gradient"),
        Invalid(ex.TWO_MODELS, None, "two trained models: each needs its own wrap"),
        Invalid(ex.READ_BACK, ex.READ_BACK_TORCHRUN, "read back what rank 0 saved: a barrier first"),
        Invalid(
            ex.TEMPORARY_CHECKPOINT,
            None,
            "a checkpoint in each process's own temporary folder, read back by every rank",
        ),
        Invalid(
            ex.TEMPORARY_CHECKPOINTER,
            None,
            "the same, saved by a runtime checkpointer (as an earlier fix writes it)",
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        plan = Plan(self.context)
        try:
            result = build(plan)
        except NotDistributable as blocked:
            self.report(
                blocked.node,
                f"training runs in one process, and PM601 cannot make it torchrun-ready: {blocked.message}",
            )
            return
        if result is None:
            return
        message = self.MESSAGE
        if plan.notes:
            message += "; " + "; ".join(plan.notes)
        self.report(result, message, edits=plan.edits, imports=plan.imports)


def build(plan: Plan) -> cst.CSTNode | None:
    """The node the finding goes to when the file is rewritten (edits in `plan.edits`), None
    when the rule has nothing to say; raises NotDistributable for the first reason not to rewrite."""
    loop = plan.loop = single_process_loop(plan.context)
    if loop is None:
        return None
    plan.origin = model_sites(plan.context).site(loop)
    plan.loader = plan.batches.loader(loop.loop)
    setup = ProcessGroupSetup(plan)
    plan.setup = setup.site()
    plan.world_name = plan.fresh("world")
    data, model, outputs = DataSharding(plan), ModelWrap(plan), RankZeroOutputs(plan)
    permutation = data.batches(loop)
    model.wrap()
    GradientAccumulation(plan).no_sync()
    data.seeds(permutation)
    outputs.control_flow()
    outputs.saves()
    outputs.outputs()
    model.unwrap()
    setup.write(setup.cleanup())
    plan.imports = list(dict.fromkeys([*plan.imports, ("runtime", "distributed")]))  # each once
    return loop.loop

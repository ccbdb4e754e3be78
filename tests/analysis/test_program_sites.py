"""The training program's sites that data-parallel training needs
(codemod.analysis.step_batches, model_sites, output_sites): the DataLoader that feeds a
step loop (also a `while` loop over `next(it)`, and where it starts a new pass), the epoch
loop around it, what a sampler per rank needs of the loader, where the trained model is
built and the device it is moved to, what the script prints, logs and saves; and the
reasons as data: batches no share can be taken of, a test each rank decides alone
(rank_values), a checkpoint path the ranks do not share (distributed)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from codemod.analysis import rank_values
from codemod.analysis.distributed import NotDistributable, single_process_loop, unshared_file
from codemod.analysis.micro_steps import micro_steps
from codemod.analysis.model_sites import model_sites
from codemod.analysis.output_sites import output_sites
from codemod.analysis.step_batches import step_batches
from codemod.context import FileContext

HEAD = """\
import logging
import torch
from torch.utils.data import DataLoader, TensorDataset

log = logging.getLogger(__name__)
dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = DataLoader(dataset, batch_size=8, shuffle=True)
model = torch.nn.Linear(8, 1).to("cuda")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
WHILE = """\
step = 0
it = iter(loader)
while step < 20:
    try:
        x, y = next(it)
    except StopIteration:
        it = iter(loader)
        x, y = next(it)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
"""


def _context(body: str) -> FileContext:
    return FileContext.of_source(HEAD + textwrap.dedent(body))


def _code(context: FileContext, node: cst.CSTNode) -> str:
    return context.module.code_for_node(node).strip()


def test_a_while_loop_over_next_of_an_iterator_of_the_loader_is_fed_by_it_and_restarts_where_it_iterates_again():
    context = _context(WHILE)
    (loop,) = context.training.loops
    site = step_batches(context).loader(loop.loop)
    assert _code(context, site.statement) == "loader = DataLoader(dataset, batch_size=8, shuffle=True)"
    assert [_code(context, s) for s in site.fetches] == ["x, y = next(it)", "x, y = next(it)"]
    assert [_code(context, s) for s in site.restarts] == ["it = iter(loader)"]  # the one in the loop


ONE_PASS = WHILE.replace(
    "    try:\n        x, y = next(it)\n    except StopIteration:\n        it = iter(loader)\n        x, y = next(it)\n",
    "    x, y = next(it)\n",
)


@pytest.mark.parametrize(
    "body",
    [
        "import itertools\n" + WHILE.replace("iter(loader)", "itertools.cycle(loader)"),  # replays its first pass
        ONE_PASS,  # StopIteration ends the loop
    ],
)
def test_an_iterator_that_replays_or_is_never_started_again_has_no_restart(body):
    context = _context(body)
    (loop,) = context.training.loops
    site = step_batches(context).loader(loop.loop)
    assert site is not None and _code(context, site.call).startswith("DataLoader(") and site.restarts == ()


def test_an_iterator_a_generator_of_the_file_makes_starts_the_passes_itself():
    body = "def forever(dl):\n    while True:\n        yield from dl\n\n\n" + WHILE.replace(
        "iter(loader)", "forever(loader)"
    )
    context = _context(body)
    (loop,) = context.training.loops
    with pytest.raises(NotDistributable, match=r"`forever\(loader\)`, which starts the DataLoader's passes itself"):
        step_batches(context).loader(loop.loop)


def test_the_epoch_loop_of_a_for_step_loop_is_the_loop_around_its_one_call():
    context = _context(
        """
        def train_epoch():
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()


        for epoch in range(3):
            train_epoch()
        """
    )
    (loop,) = context.training.loops
    epoch_loop, function = step_batches(context).epoch_loop(loop.loop)
    assert isinstance(epoch_loop, cst.For) and _code(context, epoch_loop.target) == "epoch" and function is None


def test_the_model_is_wrapped_after_its_last_move_and_its_device_is_read_from_it():
    context = _context(WHILE)
    (loop,) = context.training.loops
    sites = model_sites(context)
    site = sites.site(loop)
    assert site.code == "model" and _code(context, site.anchor) == 'model = torch.nn.Linear(8, 1).to("cuda")'
    assert _code(context, sites.moved_to(site)) == '"cuda"'


@pytest.mark.parametrize("device", ['"cuda:1"', "1"])
def test_a_fixed_gpu_is_refused(device):
    context = _context(WHILE.replace("step = 0\n", f"step = 0\nmodel.to({device})\n"))
    (loop,) = context.training.loops
    sites = model_sites(context)
    with pytest.raises(NotDistributable, match="every rank would use it"):
        sites.moved_to(sites.site(loop))


def test_a_model_bound_again_after_it_is_built_has_no_site():
    context = _context(WHILE + "model = torch.nn.Linear(8, 2)\n")
    (loop,) = context.training.loops
    with pytest.raises(NotDistributable, match="is bound again after line"):
        model_sites(context).site(loop)


def test_what_the_script_prints_logs_and_saves_and_the_load_that_reads_a_save_back():
    context = _context(
        WHILE
        + """
print(step)
log.info("done %d", step)
torch.save(model.state_dict(), "last.pt")
model.load_state_dict(torch.load("last.pt"))
state = torch.load("init.pt")
"""
    )
    sites = output_sites(context)
    assert [_code(context, c) for c in sites.prints] == ["print(step)"]
    assert [_code(context, c) for c in sites.log_calls] == ['log.info("done %d", step)']
    assert [_code(context, c) for c in sites.writes] == ['torch.save(model.state_dict(), "last.pt")']
    (load, path), *others = sites.loads_after(sites.saves)
    assert _code(context, load) == 'torch.load("last.pt")' and _code(context, path) == '"last.pt"' and not others


def test_a_while_loop_over_a_generator_of_the_file_that_draws_its_batches_is_random_data():
    context = _context(
        """
        def batches(n):
            while True:
                yield torch.randn(n, 8), torch.randn(n, 1)


        it = batches(16)
        while True:
            x, y = next(it)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        """
    )
    (loop,) = context.training.loops
    data = step_batches(context).fetched_draw(loop.loop)
    assert data.how == "random" and _code(context, data.at) == "torch.randn(n, 8)"


def test_what_the_script_shows_in_code_order_and_the_statements_an_output_stands_alone_in():
    context = _context(
        WHILE
        + """
if step > 0:
    print(step)
log.info("done %d", step)
ok = print("x") or True
"""
    )
    sites = output_sites(context)
    assert [(_code(context, c), how) for c, how in sites.shown] == [
        ("print(step)", "print"),
        ('log.info("done %d", step)', "log"),
        ('print("x")', "print"),
    ]
    first, log_call, inside = (c for c, _ in sites.shown)
    condition = sites.alone_if(sites.own_statement(first))
    assert _code(context, condition.test) == "step > 0"
    assert sites.alone_if(sites.own_statement(log_call)) is None  # not under an `if`
    assert sites.own_statement(inside) is None  # part of an assignment


def test_what_a_sampler_per_rank_needs_of_the_loader_whether_it_shuffles_and_the_seed_of_its_order():
    seeded = "shuffle=True, generator=torch.Generator().manual_seed(3)"
    for head, seed in ((HEAD, None), (HEAD.replace("shuffle=True", seeded), "3")):
        context = FileContext.of_source(head + WHILE)
        (loop,) = context.training.loops
        batches = step_batches(context)
        found = batches.loader_arguments(batches.loader(loop.loop), loop.loop)
        assert found.shuffled and (found.seed is None if seed is None else _code(context, found.seed) == seed)
    context = FileContext.of_source(HEAD.replace("shuffle=True", "shuffle=False") + WHILE)
    (loop,) = context.training.loops
    batches = step_batches(context)
    assert not batches.loader_arguments(batches.loader(loop.loop), loop.loop).shuffled


def test_why_the_batches_of_a_loop_no_dataloader_feeds_cannot_be_split():
    context = _context(
        """
        x_all = torch.randn(64, 8)
        for step in range(10):
            model(x_all).pow(2).mean().backward()
            opt.step()
        """
    )
    (loop,) = context.training.loops
    reason = step_batches(context).split_obstacle(loop.loop)
    assert reason.node is loop.loop.iter
    assert "every step trains on the same data (full-batch training: `range(10)`" in reason.message


def test_a_test_on_each_rank_s_own_loss_that_decides_a_step_is_the_divergence():
    def divergence(test: str):
        context = _context(WHILE.replace("    opt.step()\n", f"    if {test}:\n        break\n    opt.step()\n"))
        (loop,) = context.training.loops
        site = step_batches(context).loader(loop.loop)
        local = rank_values.step_rank_local(context, loop, site.fetches, None)
        return context, rank_values.divergence(context, loop, local)

    context, reason = divergence("loss.item() < 1e-3")
    assert _code(context, reason.node) == "loss.item() < 1e-3"
    assert "decides whether a step runs or the loop goes on" in reason.message
    assert divergence("step > 100")[1] is None  # the same on every rank


def test_a_checkpoint_path_in_a_temporary_folder_of_each_process_is_no_file_the_ranks_share():
    context = _context('import tempfile\npath = tempfile.mkdtemp() + "/last.pt"\nshared = "last.pt"\n')
    values = {t.targets[0].target.value: t.value for t in context.index.find(cst.Assign)}
    assert "is in a temporary folder each process makes for itself (`tempfile.mkdtemp()`)" in unshared_file(
        context, values["path"]
    )
    assert unshared_file(context, values["shared"]) is None


def test_what_keeps_a_checkpoint_write_to_one_process_and_why_none_does():
    context = _context(
        WHILE
        + """
if step % 10 == 0:
    torch.save(model.state_dict(), "last.pt")
torch.save(model.state_dict(), "final.pt")
with open("model.pt", "wb") as f:
    torch.save(model.state_dict(), f)
saved = [torch.save(model.state_dict(), "list.pt")]
if step: torch.save(model.state_dict(), "line.pt")
with open("opened.pt", "wb") as f:
    if step: torch.save(model.state_dict(), f)
"""
    )
    sites = output_sites(context)
    periodic, final, opened, in_a_list, on_its_line, opened_on_its_line = sites.writes
    assert _code(context, sites.write_site(periodic).test) == "step % 10 == 0"  # the whole `if` runs alone
    assert sites.write_site(final) is sites.own_statement(final)
    assert _code(context, sites.write_site(opened)).startswith('with open("model.pt", "wb") as f:')
    with pytest.raises(NotDistributable, match="is part of a larger statement"):
        sites.write_site(in_a_list)
    with pytest.raises(NotDistributable, match="is on the line of its `if`"):
        sites.write_site(on_its_line)
    assert _code(context, sites.write_site(opened_on_its_line)).startswith('with open("opened.pt", "wb") as f:')


def test_a_checkpoint_read_back_after_it_is_written_once_per_statement_and_not_from_a_temporary_folder():
    context = _context(
        WHILE
        + """
torch.save(model.state_dict(), "last.pt")
model.load_state_dict(torch.load("last.pt"))
other = torch.load("last.pt")
"""
    )
    sites = output_sites(context)
    assert [_code(context, s) for _, s in sites.reloads(sites.saves)] == [
        'model.load_state_dict(torch.load("last.pt"))',
        'other = torch.load("last.pt")',
    ]
    context = _context(
        WHILE
        + """
import tempfile
path = tempfile.mkdtemp() + "/last.pt"
torch.save(model.state_dict(), path)
model.load_state_dict(torch.load(path))
"""
    )
    sites = output_sites(context)
    with pytest.raises(NotDistributable, match="temporary folder"):
        sites.reloads(sites.saves)


@pytest.mark.parametrize(
    "shuffle, arguments",
    [
        ("shuffle=True", ["dataset"]),
        ("shuffle=False", ["dataset", "shuffle=False"]),
        ("shuffle=train", ["dataset", "shuffle=train"]),
        ("shuffle=True, generator=torch.Generator().manual_seed(3)", ["dataset", "seed=3"]),
    ],
)
def test_a_distributed_sampler_is_given_what_orders_the_dataset_as_the_loader_does(shuffle, arguments):
    context = FileContext.of_source("train = True\n" + HEAD.replace("shuffle=True", shuffle) + WHILE)
    (loop,) = context.training.loops
    batches = step_batches(context)
    assert batches.loader_arguments(batches.loader(loop.loop), loop.loop).sampler_arguments == arguments


@pytest.mark.parametrize(
    "loop, accumulating",
    [
        (
            "for i, (x, y) in enumerate(loader):\n    loss = model(x).sum()\n    loss.backward()\n"
            "    if (i + 1) % 4 == 0:\n        opt.step()\n",
            "(i + 1) % 4 != 0",
        ),
        (
            "for i, (x, y) in enumerate(loader):\n    loss = model(x).sum()\n    loss.backward()\n"
            "    if (i + 1) % 4 != 0:\n        continue\n    opt.step()\n",
            "(i + 1) % 4 != 0",
        ),
        (
            "for x, y in loader:\n    for t in range(a + 1):\n        loss = model(x).sum()\n        loss.backward()\n"
            "    opt.step()\n",
            "t < (a + 1) - 1",
        ),
    ],
)
def test_the_micro_steps_the_optimizer_does_not_step_after(loop, accumulating):
    context = _context("a = 3\n" + loop)
    (training_loop,) = context.training.loops
    assert _code(context, micro_steps(context, training_loop).accumulating) == accumulating


def test_the_loop_a_single_process_file_trains_in():
    context = _context(WHILE)
    assert single_process_loop(context) is context.training.loops[0]
    assert single_process_loop(_context("import torch.distributed as dist\n" + WHILE)) is None
    assert single_process_loop(_context("x = 1\n")) is None
    with pytest.raises(NotDistributable, match="2 training loops"):
        single_process_loop(_context(WHILE + WHILE))

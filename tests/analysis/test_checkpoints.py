"""What a checkpoint save in a training loop writes and what keeps it synchronous
(codemod.analysis.checkpoints): a function of the file, or of another module of the project,
that wraps torch.save, a save that runs on the first process of each node, a file loaded
right after its save, and how often a save runs."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from codemod.analysis.checkpoints import NotACheckpoint, Save, Synchronous, checkpoints
from codemod.analysis.project import project_of
from codemod.analysis.torch_facts import TORCH_SAVES
from codemod.context import FileContext

HEAD = """\
import io
import torch

net = build_network()  # of a size perfmod cannot tell
opt = torch.optim.SGD(net.parameters(), lr=0.1)
"""


def _context(body: str, head: str = HEAD) -> FileContext:
    return FileContext.of_source(head + textwrap.dedent(body))


def _saves(context: FileContext) -> list[cst.Call]:
    return [c for c in context.index.find(cst.Call) if context.names.is_(c, *TORCH_SAVES)]


def _plan(context: FileContext, call: cst.Call) -> Save:
    answers = checkpoints(context)
    loop = answers.training_loop(call)
    return answers.plan(call, loop)


def test_a_function_that_wraps_torch_save_is_planned_through_the_loops_that_run_it():
    context = _context(
        """
        def keep(network, ckpt_path):
            torch.save(network.state_dict(), ckpt_path)

        for step in range(100):
            opt.zero_grad()
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
            keep(net, f"weights-{step}.pt")
        """
    )
    answers = checkpoints(context)
    (save,) = _saves(context)
    assert answers.training_loop(save) is None  # not in a loop of its own function
    helper = context.index.first_enclosing(save, cst.FunctionDef)
    sites = answers.loop_sites(helper)
    assert sites is not None and len(sites) == 1
    loop, calls = sites[0]
    assert isinstance(loop, cst.For) and context.source(calls[0]).startswith("keep(")
    plan = answers.plan(save, None, helper, sites)
    assert plan.call is save and context.source(plan.path) == "ckpt_path"


def test_a_wrapper_also_called_outside_training_runs_nowhere_only_in_a_loop():
    context = _context(
        """
        def keep(network, ckpt_path):
            torch.save(network.state_dict(), ckpt_path)

        for step in range(100):
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
            keep(net, "last.pt")
        keep(net, "final.pt")
        """
    )
    (save,) = _saves(context)
    helper = context.index.first_enclosing(save, cst.FunctionDef)
    assert checkpoints(context).loop_sites(helper) is None


def test_a_save_on_the_first_process_of_each_node_stays_synchronous():
    context = _context(
        """
        import os
        local_rank = int(os.environ["LOCAL_RANK"])
        for epoch in range(10):
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
            if local_rank == 0:
                torch.save(net.state_dict(), "node.pt")
        """
    )
    (save,) = _saves(context)
    with pytest.raises(Synchronous, match="first process of each node"):
        _plan(context, save)


def test_a_save_on_global_rank_zero_is_planned():
    context = _context(
        """
        import torch.distributed as dist
        for epoch in range(10):
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
            if dist.get_rank() == 0:
                torch.save(net.state_dict(), "global.pt")
        """
    )
    (save,) = _saves(context)
    assert isinstance(_plan(context, save), Save)


def test_a_file_loaded_right_after_its_save_is_a_later_use():
    context = _context(
        """
        for epoch in range(10):
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
            torch.save(net.state_dict(), "swap.pt")
            net.load_state_dict(torch.load("swap.pt"))
        """
    )
    (save,) = _saves(context)
    answers = checkpoints(context)
    loop = answers.training_loop(save)
    statement = context.index.statement_of(save)
    reader = answers.later_use(save.args[1].value, statement, loop)
    assert reader is not None and context.source(reader) == 'torch.load("swap.pt")'
    assert answers.flush_points(save.args[1].value, statement, loop) is None  # not under an `if`
    with pytest.raises(Synchronous, match=r"the file is used at line 11 \(`torch.load\(\"swap.pt\"\)`\)"):
        answers.plan(save, loop)


def test_a_file_loaded_only_when_asked_gets_a_flush_before_the_load():
    context = _context(
        """
        reload = False
        for epoch in range(10):
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
            path = f"e{epoch}.pt"
            torch.save(net.state_dict(), path)
            if reload:
                net.load_state_dict(torch.load(path))
        """
    )
    (save,) = _saves(context)
    plan = _plan(context, save)
    (before,) = plan.flush_before
    assert context.source(before).strip() == "net.load_state_dict(torch.load(path))"


def test_a_file_only_printed_after_its_save_is_not_used():
    context = _context(
        """
        for epoch in range(10):
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
            path = f"e{epoch}.pt"
            torch.save(net.state_dict(), path)
            print("saved", path)
        """
    )
    (save,) = _saves(context)
    plan = _plan(context, save)
    assert plan.flush_before == () and context.source(plan.path) == "path"


LOGGER = """
def print0(s, console=False):
    with open("run.log", "a") as f:
        if console:
            print(s)
        print(s, file=f)

def upload(p):
    with open(p, "rb") as f:
        send(f.read())

for epoch in range(10):
    net(torch.randn(2, 3)).sum().backward()
    opt.step()
    path = f"e{epoch}.pt"
    torch.save(net.state_dict(), path)
    {after}
"""


def test_a_path_formatted_into_a_message_of_a_logging_function_of_the_file_is_not_a_use():
    """`print0(f"Saved checkpoint to {path}")`: the function only prints the text it is
    given; the file is not opened, so the save is planned in the background."""
    context = _context(LOGGER.replace("{after}", 'print0(f"Saved checkpoint to {path}", console=True)'))
    (save,) = _saves(context)
    assert _plan(context, save).flush_before == ()


def test_a_path_handed_to_a_function_of_the_file_that_opens_it_is_a_use():
    context = _context(LOGGER.replace("{after}", "upload(path)"))
    (save,) = _saves(context)
    with pytest.raises(Synchronous, match=r"the file is used at line \d+ \(`upload\(path\)`\)"):
        _plan(context, save)


SMALL = """\
import torch

net = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
"""


@pytest.mark.parametrize(
    ("save", "every_step"),
    [
        ("if step % 100 == 0:\n        torch.save(net.state_dict(), 'small.pt')", False),
        ("torch.save(net.state_dict(), 'small.pt')", True),
    ],
)
def test_how_often_a_small_save_runs_decides_whether_it_is_worth_a_background_writer(save, every_step):
    body = "for step in range(1000):\n    net(torch.randn(2, 8)).sum().backward()\n    opt.step()\n    " + save + "\n"
    context = _context(body, head=SMALL)
    (save,) = _saves(context)
    assert checkpoints(context).every_step(save) is every_step
    if every_step:
        assert isinstance(_plan(context, save), Save)
    else:
        with pytest.raises(Synchronous, match="not worth a background writer"):
            _plan(context, save)


def test_a_save_into_memory_writes_no_checkpoint():
    context = _context(
        """
        for step in range(10):
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
            buffer = io.BytesIO()
            torch.save(net.state_dict(), buffer)
        """
    )
    (save,) = _saves(context)
    with pytest.raises(NotACheckpoint):
        _plan(context, save)


def test_a_whole_module_saved_is_a_problem_of_the_object():
    context = _context(
        """
        for step in range(10):
            net(torch.randn(2, 8)).sum().backward()
            opt.step()
            torch.save({"net": net}, "whole.pt")
        """,
        head=SMALL,
    )
    (save,) = _saves(context)
    problem = checkpoints(context).object_problem(save.args[0].value)
    assert problem is not None and "`net` is a whole module" in problem


def test_a_background_save_to_a_path_a_synchronous_save_also_writes_stays_synchronous():
    context = _context(
        """
        for step in range(10):
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
            torch.save(net.state_dict(), "last.pt")
            torch.save(opt.state_dict(), "last.pt", pickle_protocol=4)
        """
    )
    answers = checkpoints(context)
    first, second = _saves(context)
    loop = answers.training_loop(first)
    saves = []
    for call in (first, second):
        try:
            saves.append((call, answers.plan(call, loop)))
        except Synchronous as why:
            saves.append((call, str(why)))
    assert isinstance(saves[0][1], Save) and "pickle_protocol" in saves[1][1]
    (_, kept), (_, reason) = answers.in_one_loop(saves)
    assert kept == "line 11 saves to the same path synchronously" and reason == saves[1][1]


KEEPER = """\
import os

import torch


def save_latest(save_dir, state):
    os.makedirs(save_dir, exist_ok=True)
    torch.save(state, os.path.join(save_dir, "latest.pt"))
    print("saved to", save_dir)
"""


def _project_context(tmp_path, step_line: str, after: str = "") -> FileContext:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "keeper.py").write_text(KEEPER)
    train = (
        SMALL
        + "from keeper import save_latest\n\nout_dir = 'runs'\n"
        + "for step in range(10):\n    net(torch.randn(2, 8)).sum().backward()\n    opt.step()\n"
        + f"    {step_line}\n{after}"
    )
    (tmp_path / "train.py").write_text(train)
    return FileContext.of_source(train, str(tmp_path / "train.py"))


def _project_call(context: FileContext) -> cst.Call:
    return next(c for c in context.index.find(cst.Call) if context.source(c.func) == "save_latest")


def test_a_project_function_that_only_writes_files_runs_in_the_background(tmp_path):
    context = _project_context(tmp_path, 'save_latest(out_dir, {"net": net.state_dict()})')
    call = _project_call(context)
    function = project_of(context).called(call)
    assert project_of(context).saver(function) is not None
    answers = checkpoints(context)
    assert answers.runs_in_training(call)
    plan = answers.wrapper_plan(call, function)
    assert plan.call is call and context.source(plan.path) == "out_dir" and plan.wrapper.startswith("keeper.py:")


def test_a_project_function_whose_result_is_used_stays_synchronous(tmp_path):
    context = _project_context(tmp_path, 'done = save_latest(out_dir, {"net": net.state_dict()})')
    call = _project_call(context)
    function = project_of(context).called(call)
    with pytest.raises(Synchronous, match="its result is used"):
        checkpoints(context).wrapper_plan(call, function)


def test_the_save_on_the_last_step_before_the_loop_breaks_is_the_final_save():
    """modded-nanogpt's shape: `if last_step:` saves, then `break`: nothing runs after
    the save to overlap with, so it is not a checkpoint to make asynchronous."""
    context = _context(
        """
        for step in range(101):
            last_step = step == 100
            if last_step:
                if save_checkpoint:
                    torch.save(net.state_dict(), "final.pt")
                break
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
        """
    )
    (save,) = _saves(context)
    with pytest.raises(NotACheckpoint):
        _plan(context, save)


def test_a_break_that_ends_an_inner_loop_leaves_the_save_a_checkpoint():
    context = _context(
        """
        for epoch in range(10):
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
            for attempt in range(3):
                torch.save(net.state_dict(), "epoch.pt")
                break
        """
    )
    (save,) = _saves(context)
    assert isinstance(_plan(context, save), Save)


LATER_BREAK = """
for step in range(101):
    done = step == 100
    net(torch.randn(2, 3)).sum().backward()
    opt.step()
    if done:
        torch.save(net.state_dict(), "final.pt")
{between}    if done:
        break
"""


def test_the_save_under_the_test_of_a_later_break_is_the_final_save():
    context = _context(LATER_BREAK.format(between="    print(step)\n"))
    (save,) = _saves(context)
    with pytest.raises(NotACheckpoint):
        _plan(context, save)


@pytest.mark.parametrize(
    "between",
    [
        "    done = False\n",  # the test's name bound again: the break may not come
        "    if step % 7 == 0:\n        continue\n",  # the iteration cut short before the break
    ],
)
def test_a_later_break_that_may_not_follow_the_save_leaves_it_a_checkpoint(between):
    context = _context(LATER_BREAK.format(between=between))
    (save,) = _saves(context)
    assert isinstance(_plan(context, save), Save)


MODDED_NANOGPT = """
import argparse
from dataclasses import dataclass

@dataclass
class Hyperparameters:
    num_iterations: int = 100
    save_every: int = {default}  # every how many steps to save? 0 for only at the end

{built}
{written}
for step in range(args.num_iterations + 1):
    last_step = (step == args.num_iterations)
    if master_process and (last_step or (args.save_every > 0 and step % args.save_every == 0)):
        log = dict(step=step, model=net.state_dict())
        torch.save(log, "logs/%s/state_step%06d.pt" % (run_id, step))
    if last_step:
        break
    net(torch.randn(2, 3)).sum().backward()
    opt.step()
"""
ARGPARSE = """\
parser = argparse.ArgumentParser()
parser.add_argument("--save_every", type=int, default={default})
parser.add_argument("--num_iterations", type=int, default=100)
args = parser.parse_args()"""


def test_a_save_whose_periodic_part_a_field_default_of_0_turns_off_is_the_final_save():
    """modded-nanogpt's records: `save_every` defaults to 0 on `args = Hyperparameters()`,
    never written, so `args.save_every > 0` is false and the save runs only on the last
    step, right before `if last_step: break`."""
    context = _context(MODDED_NANOGPT.format(default=0, built="args = Hyperparameters()", written=""))
    (save,) = _saves(context)
    with pytest.raises(NotACheckpoint):
        _plan(context, save)


@pytest.mark.parametrize(
    ("default", "built", "written"),
    [
        (100, "args = Hyperparameters()", ""),  # the periodic save runs every 100 steps
        (0, "args = Hyperparameters(save_every=5)", ""),  # the construction turns it on
        (0, "args = Hyperparameters()", "args.save_every = 5"),  # written after construction
        (0, ARGPARSE.format(default=0), ""),  # a run may pass `--save_every 5`
    ],
)
def test_a_save_whose_periodic_part_may_run_stays_a_checkpoint(default, built, written):
    context = _context(MODDED_NANOGPT.format(default=default, built=built, written=written))
    (save,) = _saves(context)
    assert isinstance(_plan(context, save), Save)


@pytest.mark.parametrize(
    "test",
    [
        "master_process and last_step",  # a conjunct is the break's test
        "(last_step)",
        "last_step or False",
        "last_step or (step > 5 and args.save_every < 0)",
    ],
)
def test_a_save_whose_test_holds_only_when_the_break_s_does_is_the_final_save(test):
    source = MODDED_NANOGPT.format(default=0, built="args = Hyperparameters()", written="")
    context = _context(
        source.replace("master_process and (last_step or (args.save_every > 0 and step % args.save_every == 0))", test)
    )
    (save,) = _saves(context)
    with pytest.raises(NotACheckpoint):
        _plan(context, save)


@pytest.mark.parametrize(
    "test",
    [
        "master_process or last_step",  # saves on every step of the master process
        "last_step or step % 10 == 0",
        "not last_step",
    ],
)
def test_a_save_whose_test_may_hold_without_the_break_s_stays_a_checkpoint(test):
    source = MODDED_NANOGPT.format(default=0, built="args = Hyperparameters()", written="")
    context = _context(
        source.replace("master_process and (last_step or (args.save_every > 0 and step % args.save_every == 0))", test)
    )
    (save,) = _saves(context)
    assert isinstance(_plan(context, save), Save)


def test_a_compound_test_s_later_break_that_may_not_follow_the_save_leaves_it_a_checkpoint():
    source = MODDED_NANOGPT.format(default=0, built="args = Hyperparameters()", written="")
    context = _context(
        source.replace("    if last_step:\n        break", "    last_step = False\n    if last_step:\n        break")
    )
    (save,) = _saves(context)
    assert isinstance(_plan(context, save), Save)


def test_a_project_function_called_on_the_last_step_before_a_later_break_is_the_final_save(tmp_path):
    saved = 'if step == 9:\n        save_latest(out_dir, {"net": net.state_dict()})'
    context = _project_context(tmp_path, saved, after="    if step == 9:\n        break\n")
    call = _project_call(context)
    with pytest.raises(NotACheckpoint):
        checkpoints(context).wrapper_plan(call, project_of(context).called(call))


def test_a_rank_among_a_project_function_s_arguments_is_the_reason_it_stays_synchronous(tmp_path):
    context = _project_context(tmp_path, "save_latest(out_dir, resumed_step, rank=ddp_rank)")
    call = _project_call(context)
    with pytest.raises(Synchronous, match="its arguments depend on `ddp_rank`"):
        checkpoints(context).wrapper_plan(call, project_of(context).called(call))

"""Where a training loop's forward pass starts and ends, whether there is one to speed
up, and where it runs: the questions PM301 asks of `forward_runs` before it wraps the
forward pass in autocast. Written from training scripts, not from the implementation."""

from __future__ import annotations

import textwrap

import libcst as cst

from codemod.analysis.forward_runs import forward_runs
from codemod.analysis.training import TrainingLoop
from codemod.config import Settings
from codemod.context import FileContext

HEAD = """\
import torch
import torch.nn as nn
model = nn.Linear(8, 1){move}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(3)]
"""


def context(code: str, move: str = '.to("cuda")') -> FileContext:
    source = HEAD.format(move=move) + textwrap.dedent(code)
    return FileContext(cst.parse_module(source), "<test>", Settings(), source)


def only_loop(ctx: FileContext) -> TrainingLoop:
    [loop] = ctx.training.loops
    return loop


def test_the_forward_pass_runs_from_the_first_model_call_to_the_loss():
    ctx = context(
        """\
        for x, y in data:
            x = x.to("cuda")
            out = model(x)
            loss = nn.functional.mse_loss(out, y.to("cuda"))
            opt.zero_grad()
            loss.backward()
            opt.step()
        """
    )
    runs, loop = forward_runs(ctx), only_loop(ctx)
    first, last = runs.wrapped(loop)
    assert ctx.source(first).strip() == "out = model(x)"
    assert ctx.source(last).strip() == 'loss = nn.functional.mse_loss(out, y.to("cuda"))'
    assert runs.start(loop) is first
    assert not runs.no_model_call(loop)


def test_a_loss_computed_without_a_model_has_no_forward_pass_and_reports_point_at_the_loop():
    ctx = context(
        """\
        w = torch.zeros(8, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        for x, y in data:
            loss = (x @ w).sum()
            loss.backward()
            opt.step()
        """
    )
    runs, loop = forward_runs(ctx), only_loop(ctx)
    assert loop.forward is None
    assert runs.no_model_call(loop)
    assert runs.start(loop) is loop.loop


LOOP = """\
for x, y in data:
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
"""


def test_a_model_moved_to_cuda_runs_on_a_known_device_off_the_host():
    ctx = context(LOOP)
    runs, loop = forward_runs(ctx), only_loop(ctx)
    assert runs.device_model(loop) is not None
    assert not runs.device_untold(loop)
    assert not runs.on_host(loop)


def test_a_model_moved_to_the_cpu_runs_on_the_host():
    ctx = context(LOOP, move='.to("cpu")')
    runs, loop = forward_runs(ctx), only_loop(ctx)
    assert runs.on_host(loop)
    assert not runs.device_untold(loop)


def test_a_model_passed_in_unmoved_in_a_script_that_uses_cuda_runs_on_a_device_that_cannot_be_told():
    ctx = context(
        """\
        device = "cuda"
        def train(net, batches):
            sgd = torch.optim.SGD(net.parameters(), lr=0.1)
            for x, y in batches:
                loss = nn.functional.mse_loss(net(x), y)
                loss.backward()
                sgd.step()
        """,
        move="",
    )
    runs, loop = forward_runs(ctx), only_loop(ctx)
    assert runs.device_model(loop) is None
    assert runs.device_untold(loop)
    assert not runs.on_host(loop)


def test_a_model_built_here_and_never_moved_trains_on_the_host_not_on_an_unknown_device():
    ctx = context('device = "cuda"\n' + LOOP, move="")
    runs, loop = forward_runs(ctx), only_loop(ctx)
    assert runs.device_model(loop) is None
    assert not runs.device_untold(loop)

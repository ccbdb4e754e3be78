"""Code of a loop in a block that ends by raising or by ending the program runs on one
iteration at most (`Periodic.last_pass`): a loss read only to word the error of a
non-finite loss is not read every step, so PM404 does not report it."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from codemod.analysis.periodic import periodic
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.result import Level

LOOP = """\
import sys
import torch

model = torch.nn.Linear(4, 1).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    loss = model(torch.randn(8, 4, device="cuda")).pow(2).mean()
{guard}
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def script(guard: str) -> str:
    return LOOP.replace("{guard}", textwrap.indent(textwrap.dedent(guard), "    "))


def item_call(ctx: FileContext) -> cst.Call:
    return next(c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "loss.item")


ENDING = [
    'if not torch.isfinite(loss):\n    raise RuntimeError(f"non-finite loss {loss.item()}")\n',
    'if not torch.isfinite(loss):\n    print("diverged at", loss.item())\n    sys.exit(1)\n',
    "if not torch.isfinite(loss):\n    value = loss.item()\n    raise ValueError(value)\n",
    'assert torch.isfinite(loss), f"non-finite loss {loss.item()}"\n',
]
EVERY_STEP = [
    "print(loss.item())\n",
    'if not torch.isfinite(loss):\n    print("skipped", loss.item())\n    continue\n',  # skips a step, goes on
    'try:\n    if not torch.isfinite(loss):\n        raise RuntimeError(f"{loss.item()}")\nexcept RuntimeError:\n    pass\n',
    'if loss.item() > 1e6:\n    raise RuntimeError("diverged")\n',  # the test itself runs every step
]


@pytest.mark.parametrize("guard", ENDING)
def test_a_read_in_a_block_that_ends_the_run_is_on_its_last_pass(guard):
    ctx = FileContext.of_source(script(guard), "<string>")
    [loop] = ctx.index.find(cst.For)
    assert periodic(ctx).last_pass(item_call(ctx), loop) is not None


@pytest.mark.parametrize("guard", EVERY_STEP)
def test_a_read_that_may_run_again_is_not(guard):
    ctx = FileContext.of_source(script(guard), "<string>")
    [loop] = ctx.index.find(cst.For)
    assert periodic(ctx).last_pass(item_call(ctx), loop) is None


def pm404(code: str) -> list:
    settings = Settings(select=("PM404",), level=Level.UNSAFE)
    return [f for f in process_source(code.encode(), "<test>", settings).findings if f.code == "PM404"]


def test_pm404_says_nothing_of_a_read_that_only_words_the_error():
    assert pm404(script(ENDING[0])) == []
    assert pm404(script(ENDING[3])) == []


def test_pm404_still_reports_a_read_of_every_step():
    assert len(pm404(script(EVERY_STEP[0]))) == 1
    assert len(pm404(script(EVERY_STEP[2]))) == 1

"""PM402 on an optimizer stepped once in no loop (a tutorial's single step): the few
launches a fused kernel saves are not noticed once, so it is reported, not fixed; the
same optimizer stepped in a loop, or in a function a loop calls, is fused."""

from __future__ import annotations

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level

ONE_STEP = """\
import torch
import torch.nn as nn

model = nn.Linear(8, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8, device="cuda")
loss = model(x).pow(2).mean()
loss.backward()
optimizer.step()
"""


def findings(code: str) -> dict[str, object]:
    result = process_source(code.encode(), "<one-step>", Settings(select=("PM402",), level=Level.UNSAFE))
    assert result.error is None, result.error
    return {finding.code: finding for finding in result.findings}


def test_an_optimizer_stepped_once_in_no_loop_is_not_fused():
    (finding,) = findings(ONE_STEP).values()
    assert not finding.applied and "steps once, line 9, in no loop" in finding.message


def test_an_optimizer_stepped_in_a_loop_or_a_function_called_in_one_is_fused():
    looped = ONE_STEP.replace("loss = ", "for _ in range(10):\n    loss = ").replace("\nloss.", "\n    loss.")
    looped = looped.replace("\noptimizer.step()", "\n    optimizer.step()")
    assert findings(looped)["PM402"].applied
    helper = ONE_STEP.replace(
        "optimizer.step()\n", "def update():\n    optimizer.step()\n\n\nfor _ in range(3):\n    update()\n"
    )
    assert findings(helper)["PM402"].applied

"""PM506's fix lands together with other rules' fixes on the same line and in the
loop: the compile goes after a line that also builds the optimizer (PM402 adds
`fused=True` to it), and the step loop gets PM101's (its data pinned where CUDA is) and PM301's fixes. All are applied
in one run (PM506 selected by its code, as it is opt-in), a second run finds
nothing, and where inductor can compile on this machine the rewrite trains like the
original. The batch (2048 rows through 256 x 256) is large enough for autocast to gain."""

import shutil

import pytest
import torch

from tests.rules.composition import applied, apply_every_rule
from tests.rules.scripts import losses, max_relative_difference

PROGRAM = """\
import torch

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = torch.randn(4, 2048, 256, pin_memory=torch.cuda.is_available())
targets = torch.randn(4, 2048, 1, pin_memory=torch.cuda.is_available())
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256), torch.nn.GELU(), torch.nn.Linear(256, 1)).to(device); opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(4):
    x = data[step].to(device)
    loss = (model(x) - targets[step].to(device)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
"""
HAS_CXX = any(shutil.which(c) for c in ("g++", "c++", "clang++"))


def test_compile_and_the_fixes_on_its_line_and_in_the_loop_apply_in_one_run():
    result = apply_every_rule(PROGRAM, opt_in=("PM506",))
    fixed = applied(result)
    assert fixed["PM506"] == [7] and fixed["PM402"] == [7] and 9 in fixed["PM101"] and "PM301" in fixed
    new = result.new_source.decode()
    assert "opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)\nmodel.compile()\n" in new
    pytest.importorskip("torch._inductor")
    if not HAS_CXX:
        pytest.skip("torch.compile's inductor backend needs a C++ compiler on CPU")
    want = losses(PROGRAM)
    torch._dynamo.reset()
    got = losses(new)
    assert len(got) == len(want) == 4
    assert max_relative_difference(got, want) < 1e-4  # compiled kernels sum in another order (numeric)

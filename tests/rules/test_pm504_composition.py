"""PM504's fix lands together with other rules' fixes in the same loop and statements:
the attention chain sits in the training step, which PM301 wraps in autocast, and its
values, pinned where CUDA is, are copied to the device in the product, which PM101 makes non-blocking. All are applied in one
run, a second run finds nothing, and the rewrite trains like the original."""

from tests.rules.composition import applied, apply_every_rule
from tests.rules.scripts import losses, max_relative_difference

PROGRAM = """\
import math

import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
proj = torch.nn.Linear(16, 48).to(device)
head = torch.nn.Linear(16, 16).to(device)
opt = torch.optim.SGD(list(proj.parameters()) + list(head.parameters()), lr=0.1)
data = torch.randn(6, 4, 10, 16, pin_memory=torch.cuda.is_available())
targets = torch.randn(6, 4, 10, 16, pin_memory=torch.cuda.is_available())
memory = torch.randn(6, 4, 10, 16, pin_memory=torch.cuda.is_available())
for step in range(6):
    x = data[step].to(device)
    q, k, _ = proj(x).chunk(3, dim=-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    weights = F.softmax(scores, dim=-1)
    out = weights @ memory[step].to(device)
    loss = (head(out) - targets[step].to(device)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
"""


def test_attention_and_the_fixes_around_and_inside_it_apply_in_one_run():
    result = apply_every_rule(PROGRAM)
    fixed = applied(result)
    assert fixed["PM504"] == [17] and 19 in fixed["PM101"]  # reported where the chain starts and "PM301" in fixed
    new = result.new_source.decode()
    assert (
        "F.scaled_dot_product_attention(\n            q, k, memory[step].to(device, non_blocking=True)\n        )"
        in new
    )
    assert "softmax" not in new
    want, got = losses(PROGRAM), losses(new)
    assert len(got) == len(want) == 6
    # autocast is off on the CPU, so what differs is SDPA's order of sums (numeric level)
    assert max_relative_difference(got, want) < 1e-5

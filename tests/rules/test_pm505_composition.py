"""PM505's fix lands together with other rules' fixes in the same loop and statements:
the time loop sits in the training step, which PM301 wraps in autocast, and the
statement that stacks its outputs copies a pinned host mask to the device, which PM101 makes
non-blocking. All are applied in one run, a second run finds nothing, and the rewrite
trains like the original. The gate is 64 wide: a narrower one would leave autocast
nothing to speed up (PM301 reports it, before the rewrite as after)."""

from tests.rules.composition import applied, apply_every_rule
from tests.rules.scripts import losses, max_relative_difference

PROGRAM = """\
import torch

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
gate = torch.nn.Linear(64, 64).to(device)
head = torch.nn.Linear(64, 1).to(device)
opt = torch.optim.SGD(list(gate.parameters()) + list(head.parameters()), lr=0.1)
data = torch.randn(5, 4, 12, 64, pin_memory=torch.cuda.is_available())
masks = torch.tensor((torch.rand(5, 4, 12, 1) > 0.2).float().tolist(), pin_memory=torch.cuda.is_available())
targets = torch.randn(5, 4, 12, 1, pin_memory=torch.cuda.is_available())
for step in range(5):
    x = data[step].to(device)
    a = torch.sigmoid(gate(x))
    h = torch.zeros_like(x[:, 0])
    hs = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + (1 - a[:, t]) * x[:, t]
        hs.append(h)
    y = torch.stack(hs, dim=1) * masks[step].to(device)
    loss = (head(y) - targets[step].to(device)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item()!r}")
"""


def test_time_loop_and_the_fixes_around_and_inside_it_apply_in_one_run():
    result = apply_every_rule(PROGRAM)
    fixed = applied(result)
    assert fixed["PM505"] == [16] and 19 in fixed["PM101"] and "PM301" in fixed
    new = result.new_source.decode()
    assert "masks[step].to(device, non_blocking=True)" in new and "for t in range" not in new
    want, got = losses(PROGRAM), losses(new)
    assert len(got) == len(want) == 5
    assert max_relative_difference(got, want) < 1e-5  # the scan sums in another order (numeric level)

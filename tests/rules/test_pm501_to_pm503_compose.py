"""PM501, PM502 and PM503 fixes composed with other rules' fixes in the same loop or statement.

Each program is rewritten with every rule at `--level unsafe` in one
`process_source` call: every finding with a fix is applied, a second run finds
nothing to fix, the rewrite compiles, and it trains like the original on the CPU
(where PM301's precision policy is off and the rewrites of PM101, PM403, PM404
change no number): PM501's fix bit for bit, PM502's and PM503's within float32
rounding of sums taken in another order.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from tests.rules.scripts import one_thread

# PM501 registers the hooks of Probe.forward once, in __init__; PM101 on the batch,
# PM403 and PM404 in the same step.
# The tensors are pinned where CUDA is (PM101 fixes copies of pinned memory only).
PER_CALL_HOOKS = """\
import functools
import gc

import torch


def keep(module, args, output, store):
    store.append(output)


class Probe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        self.store = []

    def forward(self, x):
        handle = self.net[1].register_forward_hook(functools.partial(keep, store=self.store))
        try:
            self.store.clear()
            out = self.net(x)
            return out, self.store[0]
        finally:
            handle.remove()


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Probe().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pinned = torch.cuda.is_available()
    data = [(torch.randn(16, 4, pin_memory=pinned), torch.randn(16, 1, pin_memory=pinned)) for _ in range(5)]
    wild_losses = []
    total = 0.0
    for x, y in data:
        x = x.to(device)
        y = y.to(device)
        out, hidden = model(x)
        loss = torch.nn.functional.mse_loss(out, y) + 0.01 * hidden.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        gc.collect()
        total += loss.item()
        wild_losses.append(loss.detach())
    print("total", total)
    print("WILD_LOSSES", torch.stack(wild_losses).tolist())


if __name__ == "__main__":
    main()
"""

# PM502 batches a per-sample loop in which PM101 makes the copies of the samples
# non-blocking (inside the expressions PM502 replaces), PM301 wraps the forward and
# the loss, and PM404 keeps the logged sum on the device. The batch and the layer are wide
# enough (256 x 512 by 512 x 512) that the batched product outlasts a kernel launch.
PER_SAMPLE = """\
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(512, 512)

    def forward(self, x):
        return self.fc(torch.tanh(x))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pinned = torch.cuda.is_available()
    inputs, labels = torch.randn(4, 256, 512, pin_memory=pinned), torch.randint(512, (4, 256), pin_memory=pinned)
    wild_losses = []
    for step in range(4):
        x, y = inputs[step], labels[step]
        opt.zero_grad()
        total = 0.0
        for i in range(x.size(0)):
            out = model(x[i:i + 1].to(device))
            loss = F.cross_entropy(out, y[i:i + 1].to(device))
            loss.backward()
            total += loss.item()
        opt.step()
        if step % 2 == 1:
            print("total", total)
        wild_losses.append(model.fc.weight.detach().sum())
    print("WILD_LOSSES", torch.stack(wild_losses).tolist())


if __name__ == "__main__":
    main()
"""

# PM503 vectorizes a per-position loop inside the forward region PM301 wraps; PM101
# copies the batch, PM401 resets the gradients, PM403 removes the cache flush. The head
# (256 rows by 256 x 1024) outlasts a kernel launch, so autocast is worth its casts.
PER_POSITION = """\
import torch
import torch.nn.functional as F
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab=1024, width=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = TinyLM().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randint(0, 64, (5, 16, 17), pin_memory=torch.cuda.is_available())
    wild_losses = []
    for step in range(5):
        batch = data[step].to(device)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        logits = model(inputs)
        loss = 0.0
        for t in range(targets.size(1)):
            loss = loss + F.cross_entropy(logits[:, t], targets[:, t], ignore_index=0)
        loss = loss / targets.size(1)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        torch.cuda.empty_cache()
        wild_losses.append(loss.detach())
    print("WILD_LOSSES", torch.stack(wild_losses).tolist())


if __name__ == "__main__":
    main()
"""

# program -> (its source, codes that must be found and fixed in it, exact losses?)
PROGRAMS = {
    "per_call_hooks": (PER_CALL_HOOKS, {"PM501", "PM101", "PM403", "PM404"}, True),
    "per_sample": (PER_SAMPLE, {"PM502", "PM101", "PM301", "PM404"}, False),
    "per_position": (PER_POSITION, {"PM503", "PM101", "PM301", "PM401", "PM403"}, False),
}


def run_all(source: str):
    result = process_source(source.encode(), "<compose>", Settings(level=Level.UNSAFE))
    assert result.error is None, result.error
    return result


def wild_losses(source: str) -> torch.Tensor:
    out = io.StringIO()
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<compose>", "exec"), {"__name__": "__main__"})
    found = re.search(r"WILD_LOSSES (\[.*\])", out.getvalue())
    return torch.tensor(eval(found.group(1)), dtype=torch.float64)


@pytest.mark.parametrize("name", PROGRAMS)
def test_one_run_applies_every_fix_and_trains_the_same(name):
    source, codes, exact = PROGRAMS[name]
    result = run_all(source)
    fixed = {f.code for f in result.findings if f.applied}
    assert codes <= fixed, [f for f in result.findings if f.code in codes - fixed]
    assert all(f.applied for f in result.findings if f.fixable or f.code in codes), [
        f.message for f in result.findings if not f.applied
    ]
    new = result.new_source.decode()
    compile(new, "<rewritten>", "exec")
    again = run_all(new)
    assert not again.pending and again.new_source == result.new_source, [f.message for f in again.findings]
    want, got = wild_losses(source), wild_losses(new)
    if exact:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_per_sample_rewrite_keeps_the_other_fixes_inside_the_loop():
    new = run_all(PER_SAMPLE).new_source.decode()
    assert "for i in range" not in new
    assert "out = model(x.to(device, non_blocking=True))" in new
    assert "y.to(device, non_blocking=True)" in new


def test_the_hooks_go_to_init_and_the_loop_keeps_its_fixes():
    new = run_all(PER_CALL_HOOKS).new_source.decode()
    assert (
        "        self.store = []\n        self.net[1].register_forward_hook(functools.partial(keep, store=self.store))\n"
        in new
    )
    assert "try:" not in new and ".remove()" not in new
    assert "x = x.to(device, non_blocking=True)" in new and "gc.collect()" not in new

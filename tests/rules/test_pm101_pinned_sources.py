"""PM101 fixes only copies of pinned memory (issue 22): from pageable memory the
host stages the copy and waits for it whatever `non_blocking` says, so a fix
there is noise in the diff. Each program runs before and after its rewrite on
the CPU and trains the same, bit for bit (PM101 is safe)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from tests.rules.scripts import one_thread

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM101" / "pinned_and_pageable.in.py"


def losses(source: str) -> list[float]:
    out = io.StringIO()
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<pm101>", "exec"), {"__name__": "__main__"})
    return eval(re.search(r"WILD_LOSSES (\[.*\])", out.getvalue()).group(1))


def rewrite(source: str, *codes: str, level: Level = Level.SAFE):
    result = process_source(source.encode(), "<pm101>", Settings(select=codes or ("PM101",), level=level))
    assert result.error is None, result.error
    return result


def test_the_fixture_fixes_the_pinned_copies_only_and_trains_the_same():
    source = FIXTURE.read_text()
    result = rewrite(source)
    new = result.new_source.decode()
    fixed = [line.strip() for line in new.splitlines() if ".to(" in line and "non_blocking=True" in line]
    assert fixed == [
        "return [t.to(device, non_blocking=True) for t in batch]",
        "x = x.to(device, non_blocking=True)",
        "y = y.to(device, non_blocking=True)",
    ]
    assert [f.line for f in result.findings] == [14, 35, 36]  # no finding for a pageable source
    assert losses(new) == losses(source)


# The sources of the noisy fixes the issue counts: host tensors in pageable memory.
PAGEABLE = {
    "tensor of a list": "t = torch.tensor([1, 2, 3])",
    "from_numpy": "t = torch.from_numpy(np.arange(6, dtype=np.float32))",
    "tokenizer output": 't = tok(["a b"], return_tensors="pt")["input_ids"]',
    "stack of slices": "t = torch.stack([X[i : i + 2] for i in range(0, 8, 2)])",
    "stack of from_numpy": "t = torch.stack([torch.from_numpy(a) for a in arrays])",
    "zeros on the host": "t = torch.zeros(4, 8)",
    "batch of a loader that does not pin": "t = next(iter(DataLoader(TensorDataset(X), batch_size=4)))[0]",
}
PROGRAM = """\
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


def tok(texts, return_tensors):
    return {{"input_ids": torch.tensor([[len(w) for w in text.split()] for text in texts])}}


X = torch.randn(8, 131072)  # batches of 4 rows: 2 MB, a copy worth overlapping
arrays = [np.ones(3, dtype=np.float32) for _ in range(4)]
PIN = torch.cuda.is_available()  # pinned memory needs an accelerator: pinned where the copies go to CUDA
dev = "cuda" if torch.cuda.is_available() else "cpu"
for step in range(3):
    {make}
    moved = t.to(dev)
    print(moved.sum().item())
"""


@pytest.mark.parametrize("name", PAGEABLE)
def test_no_finding_for_a_copy_of_pageable_memory(name):
    source = PROGRAM.format(make=PAGEABLE[name])
    result = rewrite(source, level=Level.UNSAFE)
    assert result.findings == [], name
    with one_thread(), contextlib.redirect_stdout(io.StringIO()):
        exec(compile(source, "<pm101>", "exec"), {"__name__": "__main__"})  # the program itself runs


def test_the_loader_pm102_pins_in_the_same_run_gets_its_copy_fixed():
    source = PROGRAM.format(make=PAGEABLE["batch of a loader that does not pin"])
    new = rewrite(source, "PM101", "PM102").new_source.decode()
    pinned = "DataLoader(TensorDataset(X), batch_size=4, pin_memory=torch.cuda.is_available())"
    assert "".join(pinned.split()) in "".join(new.split())  # as the layout wraps it
    assert "moved = t.to(dev, non_blocking=True)" in new


PINNED = {
    "batch of a pinned loader": "t = next(iter(DataLoader(TensorDataset(X), batch_size=4, pin_memory=PIN)))[0]",
    "made pinned": "t = torch.ones(4, 8, pin_memory=PIN)",
    "a view of a pinned tensor": "t = torch.ones(4, 8, pin_memory=PIN)[1:3].view(-1)",
}


@pytest.mark.parametrize("name", PINNED)
def test_a_copy_of_pinned_memory_is_fixed_and_runs_the_same(name):
    source = PROGRAM.format(make=PINNED[name])
    result = rewrite(source)
    assert [f.message for f in result.findings] == ["host-to-device copy blocks the CPU; pass non_blocking=True"]
    new = result.new_source.decode()
    assert "moved = t.to(dev, non_blocking=True)" in new
    torch.manual_seed(0)
    before = io.StringIO()
    with one_thread(), contextlib.redirect_stdout(before):
        exec(compile(source, "<pm101>", "exec"), {"__name__": "__main__"})
    torch.manual_seed(0)
    after = io.StringIO()
    with one_thread(), contextlib.redirect_stdout(after):
        exec(compile(new, "<pm101>", "exec"), {"__name__": "__main__"})
    assert before.getvalue() == after.getvalue()


def test_host_batches_get_no_device_to_host_reason():
    """The issue's wrong reason: host batches (a stack of numpy arrays, the batches of a
    pinned loader) moved to a device that may be the CPU were reported as possibly
    device-to-host copies. A copy of pageable memory gets no finding; one of pinned
    memory is fixed (from the host, a copy is never device-to-host)."""
    source = """\
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

dev = "cuda" if torch.cuda.is_available() else "cpu"
arrays = [np.ones(3, dtype=np.float32) for _ in range(4)]
loader = DataLoader(TensorDataset(torch.randn(8, 3)), batch_size=4, pin_memory=True)
x = torch.randn(3)
for (batch,) in loader:
    stacked = torch.stack([torch.from_numpy(a) for a in arrays]).to(dev)
    batch = batch.to(dev)
    x = x.to(dev)
"""
    result = rewrite(source, level=Level.UNSAFE)
    assert [(f.line, f.fixable) for f in result.findings] == [(11, True)]
    assert not [f for f in result.findings if "device-to-host" in f.message]


# pytorch/examples mnist_forward_forward/main.py: the whole training set is taken as one
# batch of a pinned loader and copied once, before training; it is used at once.
FORWARD_FORWARD = """
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda")
train_loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=64,
                          pin_memory=True)


def train(net, x, y):
    for _ in range(3):
        for xb, yb in train_loader:
            xb = xb.to(device)
            loss = torch.nn.functional.cross_entropy(net(xb), yb.to(device))
            loss.backward()


if __name__ == "__main__":
    x, y = next(iter(train_loader))
    x, y = x.to(device), y.to(device)
    x_te, y_te = next(iter(train_loader))
    x_te, y_te = x_te.to(device), y_te.to(device)
    train(torch.nn.Linear(8, 2).to(device), x, y)
"""


def test_a_copy_that_runs_once_gets_no_finding_and_the_loop_s_copies_are_fixed():
    result = rewrite(FORWARD_FORWARD)
    fixed = sorted(f.line for f in result.findings if f.applied)
    assert fixed == [13, 14]  # the loop's copies; not the two lines that copy a whole set once
    assert all(f.applied for f in result.findings)
    new = result.new_source.decode()
    assert "x, y = x.to(device), y.to(device)" in new and "x_te.to(device), y_te.to(device)" in new


STAGED = """\
import numpy as np
import torch

dev = "cuda" if torch.cuda.is_available() else "cpu"
buf = torch.empty(4, 131072, pin_memory=torch.cuda.is_available())
for step in range(3):
    {write}
    moved = buf.to(dev)
    print(moved.sum().item())
"""


@pytest.mark.parametrize(
    "write",
    [
        "buf.numpy()[:] = step",
        "np.copyto(buf.numpy(), np.full((4, 131072), step, dtype=np.float32))",
        # A part or view of the buffer shares its memory: writing it writes the buffer.
        "buf[:, 0].copy_(torch.full((4,), float(step)))",
        "buf[:2] = step",
        "buf[1:] += step",
        "buf.narrow(0, 0, 2).copy_(torch.full((2, 131072), float(step)))",
        "buf[step % 4].fill_(step)",
        "buf.T[0].zero_()",
        "buf.view(-1)[:8].copy_(torch.arange(8.0))",
        "row = buf[1]; row.copy_(torch.full((131072,), float(step)))",
    ],
)
def test_a_pinned_buffer_refilled_through_a_view_keeps_its_blocking_copy(write):
    """The host writes the next batch into the buffer's memory through a view of it (its
    numpy view, a slice, an item, a transpose) right after the copy is queued: a copy that did not block would read it half written."""
    assert [f.fixable for f in rewrite(STAGED.format(write="pass")).findings] == [True]  # the buffer, left alone
    assert rewrite(STAGED.format(write=write)).findings == []


# blind11: a pinned staging buffer refilled every step through a view of it, then a view
# of it copied to the device. The unrelated pinned `table` is never written.
REFILLED_VIEW = """\
import torch

torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
stage = torch.empty(64, 131072, pin_memory=torch.cuda.is_available())
table = torch.randn(64, 131072, pin_memory=torch.cuda.is_available())
total = torch.zeros((), device=dev)
for step in range(3):
    y = torch.full((64,), float(step))
    {refill}
    y_dev = stage[: len(y), 0].to(dev)
    t_dev = table.to(dev)
    total += y_dev.sum() + t_dev[:, 0].sum()
print(total.item())
"""


@pytest.mark.parametrize(
    "refill",
    [
        "stage[: len(y), 0].copy_(y)",
        "stage[:, 0] = y",
        "stage.select(1, 0).copy_(y)",
        "stage.narrow(1, 0, 1).copy_(y[:, None])",
    ],
)
def test_a_view_of_a_buffer_refilled_through_a_view_keeps_its_blocking_copy(refill):
    source = REFILLED_VIEW.format(refill=refill)
    result = rewrite(source)
    assert [f.line for f in result.findings] == [12]  # `table`'s copy only
    new = result.new_source.decode()
    assert "y_dev = stage[: len(y), 0].to(dev)\n" in new
    assert "t_dev = table.to(dev, non_blocking=True)" in new
    before, after = io.StringIO(), io.StringIO()
    with one_thread(), contextlib.redirect_stdout(before):
        exec(compile(source, "<pm101>", "exec"), {"__name__": "__main__"})
    with one_thread(), contextlib.redirect_stdout(after):
        exec(compile(new, "<pm101>", "exec"), {"__name__": "__main__"})
    assert before.getvalue() == after.getvalue()


RETRIED_ITERATOR = """\
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def run_training(model, opt, make_iter, steps, device):
    losses = []
    it = make_iter()
    for _ in range(steps):
        try:
            xb, yb = next(it)
        except StopIteration:
            it = make_iter()
            xb, yb = next(it)
        xb = xb.to(device)
        yb = yb.to(device)
        loss = F.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
loader = DataLoader(data, batch_size=8, shuffle=True, pin_memory=torch.cuda.is_available())
model = torch.nn.Linear(8, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
print("WILD_LOSSES", torch.stack(run_training(model, opt, lambda: iter(loader), 6, device)).tolist())
"""


def test_a_batch_taken_again_after_the_iterator_runs_out_is_a_batch_of_the_loader():
    """`try: xb, yb = next(it)` / `except StopIteration:` starting the iterator again binds
    the batch on both ways out of the `try`, so the previous step's `xb = xb.to(device)`
    does not reach the copy: it copies the loader's pinned batch."""
    result = rewrite(RETRIED_ITERATOR)
    new = result.new_source.decode()
    assert [f.line for f in result.findings] == [15, 16]
    assert "xb = xb.to(device, non_blocking=True)" in new
    assert losses(new) == losses(RETRIED_ITERATOR)

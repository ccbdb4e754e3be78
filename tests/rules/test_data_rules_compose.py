"""The data rules' fixes composed with other rules' fixes in the same loop or statement.

Each program below is rewritten with every rule at `--level unsafe` in one
`process_source` call: every finding is applied, a second run finds nothing to
fix, and the rewrite trains like the original on the CPU (loader workers kept at
0 with PERFMOD_NUM_WORKERS, so the batches come in the same order).
"""

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
from runtime import data
from tests.rules.scripts import one_thread

# PM102 + PM201 on the same loader call (a dataset that works for each item), PM103 removing the copies (PM101 waits for
# PM102's pinning and finds them gone), PM403 and PM404 in the same step.
LOADER_LOOP = """\
import gc

import torch
from torch.utils.data import DataLoader, Dataset


class Jittered(Dataset):
    # Rows of two tensors, the first through a sine when it is loaded: work for each
    # item, which worker processes take off the training process (rows only indexed
    # would get no workers).

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i].sin(), self.y[i]


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = Jittered(torch.randn(64, 40000), torch.randn(64, 1))  # batches of 1.3 MB
    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    model = torch.nn.Linear(40000, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    wild_losses = []
    total = 0.0
    for epoch in range(2):
        for x, y in loader:
            x = x.to(device)
            y = y.to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
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

# PM202 rewrites the loop into a DataLoader, PM102 pins it and PM101 makes the copies of
# its batches non-blocking (three passes in one run); PM201 reports the loader (rows of
# tensors in memory: no workers); PM203 hoists a constant whose copy
# (pageable memory) PM101 leaves alone; PM404 sums the losses.
MANUAL_BATCHES = """\
import torch


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    X, Y = torch.randn(100, 20000) / 100, torch.randn(100, 1)  # batches of 1.3 MB: a DataLoader pays
    model = torch.nn.Linear(20000, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bs = 16
    wild_losses = []
    running = 0.0
    for epoch in range(3):
        for i in range(0, len(X), bs):
            xb = X[i:i + bs].to(device)
            yb = Y[i:i + bs].to(device)
            scale = torch.tensor([0.5, 2.0]).to(device)
            loss = torch.nn.functional.mse_loss(model(xb) * scale[0], yb * scale[1])
            opt.zero_grad()
            loss.backward()
            opt.step()
            running = running + loss.item()
            wild_losses.append(loss.detach())
    print("running", running)
    print("WILD_LOSSES", torch.stack(wild_losses).tolist())


if __name__ == "__main__":
    main()
"""

# PM102 and PM201 both add entries to one **kwargs dict; PM103 removes the copies of the
# batches in a comprehension.
KWARGS_DICT = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Jittered(Dataset):
    # Rows of two tensors, the first through a sine when it is loaded: work for each
    # item, which worker processes take off the training process (rows only indexed
    # would get no workers).

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i].sin(), self.y[i]


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = Jittered(torch.randn(48, 60000), torch.randint(0, 3, (48,)))  # batches of 1.4 MB
    train_kwargs = {"batch_size": 6, "shuffle": False}
    loader = DataLoader(dataset, **train_kwargs)
    model = torch.nn.Linear(60000, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)  # fused or not, bit for bit the same
    wild_losses = []
    for batch in loader:
        batch = [t.to(device) for t in batch]
        x, y = batch
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        wild_losses.append(loss.detach())
    print("WILD_LOSSES", torch.stack(wild_losses).tolist())


if __name__ == "__main__":
    main()
"""

PROGRAMS = {"loader_loop": LOADER_LOOP, "manual_batches": MANUAL_BATCHES, "kwargs_dict": KWARGS_DICT}
OURS = {
    "loader_loop": {"PM102", "PM103", "PM201"},
    "manual_batches": {"PM102", "PM103", "PM202", "PM203", "PM201"},
    "kwargs_dict": {"PM102", "PM103", "PM201"},
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
def test_one_run_applies_every_fix_and_a_second_finds_nothing(name):
    source = PROGRAMS[name]
    result = run_all(source)
    codes = {f.code for f in result.findings}
    assert OURS[name] <= codes, codes
    # every fix is applied in this one run (PM103 reports a copy into a new name without fixing it)
    assert all(f.applied for f in result.findings if f.fixable), [
        f for f in result.findings if f.fixable and not f.applied
    ]
    new = result.new_source.decode()
    compile(new, "<rewritten>", "exec")
    again = run_all(new)
    assert not again.pending and again.new_source == result.new_source, again.findings


def test_loader_loop_rewrite_composes_and_trains_the_same(monkeypatch):
    new = run_all(LOADER_LOOP).new_source.decode()
    assert (
        "    num_workers = default_num_workers()\n    loader = DataLoader(\n        dataset,\n        batch_size=8,\n"
        '        shuffle=True,\n        pin_memory=device.type == "cuda",\n        num_workers=num_workers,\n'
    ) in new
    assert "for x, y in DevicePrefetcher(loader, device):" in new
    assert "x = x.to(device" not in new and "gc.collect()" not in new
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "0")
    assert torch.equal(wild_losses(new), wild_losses(LOADER_LOOP))


def test_manual_batches_rewrite_prefetches_the_loaders_batches_and_trains_the_same(monkeypatch):
    # PM202's loader, pinned by PM102, hands its batches of 1.3 MB to PM103's prefetcher: the
    # gain the DataLoader was for, in one run.
    new = run_all(MANUAL_BATCHES).new_source.decode()
    assert "for xb, yb in DevicePrefetcher(loader, device):" in new
    assert "xb = " not in new and "yb = " not in new
    assert 'pin_memory=device.type == "cuda"' in new
    hoisted = "\n    scale = torch.tensor([0.5, 2.0]).to(device)\n"  # out of both loops, pageable: left blocking
    assert hoisted in new and new.index(hoisted) < new.index("for epoch in range(3):")
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "0")
    assert torch.equal(wild_losses(new), wild_losses(MANUAL_BATCHES))


def test_both_loader_rules_write_into_one_kwargs_dict(monkeypatch):
    new = run_all(KWARGS_DICT).new_source.decode()
    assert (
        "    num_workers = default_num_workers()\n"
        '    train_kwargs = {"batch_size": 6, "shuffle": False, "pin_memory": device.type == "cuda", '
        '"num_workers": num_workers, "persistent_workers": num_workers > 0}'
    ) in new
    assert "for batch in DevicePrefetcher(loader, device):" in new
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "0")
    assert torch.equal(wild_losses(new), wild_losses(KWARGS_DICT))


def test_at_level_safe_the_copies_of_the_loader_pm102_pins_become_non_blocking_in_the_same_run():
    result = process_source(LOADER_LOOP.encode(), "<compose>", Settings(level=Level.SAFE))
    assert result.error is None, result.error
    new = result.new_source.decode()
    pinned = 'DataLoader(dataset, batch_size=8, shuffle=True, pin_memory=device.type == "cuda")'
    assert "".join(pinned.split()) in "".join(new.split())  # as the layout wraps it
    assert "x = x.to(device, non_blocking=True)\n            y = y.to(device, non_blocking=True)\n" in new
    applied = sorted((f.code, f.line) for f in result.findings if f.code in ("PM101", "PM102") and f.applied)
    assert applied == [("PM101", 34), ("PM101", 35), ("PM102", 27)]
    again = process_source(result.new_source, "<compose>", Settings(level=Level.SAFE))
    assert not again.pending and again.new_source == result.new_source
    assert torch.equal(wild_losses(new), wild_losses(LOADER_LOOP))


def test_a_pageable_copy_is_left_alone_even_with_pm102_selected():
    # `torch.tensor(list)` and `torch.from_numpy` are pageable: non_blocking=True would overlap nothing
    source = LOADER_LOOP.replace(
        "    for epoch in range(2):\n",
        "    weights = torch.tensor([1.0, 2.0]).to(device)\n    for epoch in range(2):\n",
    )
    result = process_source(source.encode(), "<compose>", Settings(level=Level.SAFE))
    new = result.new_source.decode()
    assert "weights = torch.tensor([1.0, 2.0]).to(device)\n" in new
    assert [f.line for f in result.findings if f.code == "PM101"] == [35, 36]  # the batches' copies only


# Batches from a per-epoch permutation copied into new names: PM202 binds the loop to those
# names, so in the same run PM103 finds `xb = xb.to(device)` and prefetches the pinned loader
# (batches of 256 x 2048 float32, 2.1 MB: large enough for the prefetch to pay).
PERMUTED_SLICES = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
N, D = 1024, 2048
X = torch.randn(N, D)
Y = torch.tanh(X @ torch.randn(D, 8))
model = torch.nn.Sequential(torch.nn.Linear(D, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
batch_size = 256
wild_losses = []
for epoch in range(2):
    perm = torch.randperm(N)
    for i in range(0, N, batch_size):
        idx = perm[i:i + batch_size]
        xb = X[idx].to(device)
        yb = Y[idx].to(device)
        loss = F.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        wild_losses.append(loss.detach())
print("WILD_LOSSES", torch.stack(wild_losses).tolist())
"""


def test_manual_batches_copied_into_new_names_are_prefetched_in_the_same_run(monkeypatch):
    selected = Settings(select=("PM102", "PM103", "PM202"), level=Level.UNSAFE)
    result = process_source(PERMUTED_SLICES.encode(), "<compose>", selected)
    assert result.error is None, result.error
    assert sorted(f.code for f in result.findings if f.applied) == ["PM102", "PM103", "PM202"]
    new = result.new_source.decode()
    assert "for xb, yb in DevicePrefetcher(loader, device):" in new
    assert "perm" not in new and ".to(device)" not in new.split("for epoch")[1]
    # shuffled by the loader's own random stream: the same number of steps, each a finite loss
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "0")
    before, after = wild_losses(PERMUTED_SLICES), wild_losses(new)
    assert after.shape == before.shape == (2 * 4,) and torch.isfinite(after).all()
    assert abs(after[-1] - before[-1]) / before[-1] < 0.05  # measured: 0.25%, after falling 25%


# blind11 (M4): the step runs through `step_fn = functools.partial(train_step, model, opt, device)`,
# and the evaluation through another partial: the loop is the training loop, as with a plain call.
PARTIAL_STEP = Path(__file__).resolve().parents[2] / "fixtures" / "wild" / "blind11" / "partial_step_pinned_loader.py"


def test_a_step_run_through_a_functools_partial_is_the_step_loop_and_its_rewrite_trains_alike(monkeypatch):
    source = PARTIAL_STEP.read_text()
    result = run_all(source)
    found = {(f.code, f.line, f.applied) for f in result.findings}
    assert {("PM201", 51, True), ("PM103", 59, False), ("PM301", 34, True), ("PM302", 59, True)} <= found
    assert {("PM101", 44, True), ("PM102", 52, True)} <= found  # the evaluation's copies, through `evaluate`
    assert not {f.code for f in result.findings} & {"PM502"}  # the loop over batches is no loop over samples
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "0")
    new = result.new_source.decode()
    torch.testing.assert_close(wild_losses(new), wild_losses(source), rtol=2e-2, atol=0)


# blind11 (M8): the loaders come back as a tuple from `get_loaders(cfg)`, and the step takes each
# batch with `next()` from `def cycle(loader): while True: for xb, yb in loader: yield xb, yb`.
FACTORY_CYCLE = PARTIAL_STEP.with_name("generator_over_factory_loaders.py")


def test_batches_a_generator_unpacks_and_yields_again_are_the_loaders_and_the_rewrite_trains_alike(monkeypatch):
    source = FACTORY_CYCLE.read_text()
    result = run_all(source)
    found = {(f.code, f.line, f.applied) for f in result.findings}
    assert {("PM201", 28, True), ("PM103", 51, False)} <= found
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "0")
    torch.testing.assert_close(wild_losses(result.new_source.decode()), wild_losses(source), rtol=2e-2, atol=0)


def test_a_generator_that_yields_its_batches_in_another_order_is_not_the_loader():
    source = FACTORY_CYCLE.read_text().replace("            yield xb, yb\n", "            yield yb, xb\n")
    codes = {f.code for f in run_all(source).findings}
    assert not codes & {"PM201", "PM103"}


# blind11 (M7): the step is a closure `make_step(model, opt, device)` returns, which collects
# garbage every step; the batches are cut by hand, too small for a DataLoader to pay.
CLOSURE_STEP = PARTIAL_STEP.with_name("closure_step_hook_per_forward.py")


def test_a_step_closure_a_function_returns_is_the_step_and_its_rewrite_trains_alike():
    source = CLOSURE_STEP.read_text()
    result = run_all(source)
    found = {(f.code, f.line, f.applied) for f in result.findings}
    assert {("PM403", 55, True), ("PM202", 72, False), ("PM301", 50, True)} <= found
    new = result.new_source.decode()
    assert "gc.collect()" not in new
    torch.testing.assert_close(wild_losses(new), wild_losses(source), rtol=2e-2, atol=0)

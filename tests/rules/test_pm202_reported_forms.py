"""PM202 on forms a blind tester found misread: an argparse `type=int` batch size, step
windows `X[step * B:(step + 1) * B]` over `range(STEPS)`, random batches drawn with the
sample count spelled another way. The rewrites run against the originals on the CPU."""

import sys

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.manual_batching_in_step_loop import ManualBatchingInStepLoop
from tests.rules.scripts import losses

SETTINGS = Settings(select=("PM202",), level=Level.UNSAFE)

ARGPARSE_SPLIT = """\
import argparse
import torch
import torch.nn.functional as F

torch.manual_seed(0)
p = argparse.ArgumentParser()
p.add_argument("--bs", type=int, default=128)
args = p.parse_args()
X = torch.rand(1000, 16)
Y = torch.rand(1000, 1)
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
for epoch in range(2):
    for xb, yb in zip(X.split(args.bs), Y.split(args.bs)):
        loss = F.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("loss", repr(loss.item()))
"""

STEP_WINDOWS = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
STEPS, BATCH = 12, 16
X = torch.randn(STEPS * BATCH, 32)
Y = torch.randn(STEPS * BATCH, 1)
model = torch.nn.Linear(32, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
for step in range(STEPS):
    xb = X[step * BATCH:(step + 1) * BATCH]
    yb = Y[step * BATCH:(step + 1) * BATCH]
    loss = F.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("loss", repr(loss.item()))
"""


def run(code: str):
    result = process_source(code.encode(), "<test>", SETTINGS, [ManualBatchingInStepLoop])
    assert result.error is None, result.error
    return result.findings, result.new_source.decode()


@pytest.fixture
def no_arguments(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py"])


def test_an_argparse_int_batch_size_is_one_batch_size_and_trains_bit_for_bit(no_arguments):
    findings, new = run(ARGPARSE_SPLIT)
    assert [f.applied for f in findings] == [True], findings
    assert "DataLoader(TensorDataset(X, Y), batch_size=args.bs, shuffle=False)" in new
    before, after = losses(ARGPARSE_SPLIT), losses(new)
    assert len(before) == 2 * 8
    assert torch.equal(after, before)


@pytest.mark.parametrize(
    "declared",
    [
        'p.add_argument("--bs", type=int)',  # no default: None when left out
        'p.add_argument("--bs", type=int, nargs="+", default=[128])',  # a list of sizes
        'p.add_argument("--bs", default=128)',  # a string when passed
    ],
)
def test_an_option_that_may_not_be_one_int_is_reported(declared):
    findings, new = run(ARGPARSE_SPLIT.replace('p.add_argument("--bs", type=int, default=128)', declared))
    assert new != ARGPARSE_SPLIT or [f.applied for f in findings] == [False]
    assert "cannot tell that `args.bs` is one batch size" in findings[0].message


def test_step_windows_over_steps_times_batch_rows_become_a_loader_and_train_bit_for_bit():
    findings, new = run(STEP_WINDOWS)
    assert [f.applied for f in findings] == [True], findings
    assert "loader = DataLoader(TensorDataset(X, Y), batch_size=BATCH, shuffle=False)\nfor xb, yb in loader:\n" in new
    before, after = losses(STEP_WINDOWS), losses(new)
    assert len(before) == 12
    assert torch.equal(after, before)


def test_step_windows_that_do_not_cover_the_data_are_reported():
    code = STEP_WINDOWS.replace("range(STEPS)", "range(STEPS - 1)")
    findings, new = run(code)
    assert new == code and [f.applied for f in findings] == [False]
    assert "the range `(STEPS - 1) * BATCH` is not the length of `X` / `Y`" in findings[0].message

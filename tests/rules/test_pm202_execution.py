"""PM202: the rewritten scripts run, and the DataLoader keeps what the hand-made
batches guaranteed.

Contiguous slices become `DataLoader(..., shuffle=False)`: the same batches in
the same order, so the losses are the same bit for bit, with worker processes too
(as PM201 would add them). A per-epoch `torch.randperm` becomes `shuffle=True`:
the permutation comes from another random stream, so the losses differ, but every
epoch still visits each of the 203 samples exactly once, in batches of 32 and a
last one of 11, and the loss curve stays close. Measured on the CPU (torch 2.13):
the epoch-mean losses of epochs 4 to 6 differ from the original's by at most 5.9%
(1.1% in the last epoch) after falling 75-fold from the first epoch; the
tolerances below (15%, 5%) leave about three times headroom.
"""

from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.manual_batching_in_step_loop import ManualBatchingInStepLoop
from tests.rules.scripts import losses, rewrite

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM202"
SAMPLES, BATCH, EPOCHS = 203, 32, 6  # randperm_epochs.in.py
LATE_EPOCHS_TOLERANCE, LAST_EPOCH_TOLERANCE = 0.15, 0.05


def source(case: str) -> str:
    return (FIXTURES / f"{case}.in.py").read_text()


def rewritten(case: str) -> str:
    new_source = rewrite(source(case), [ManualBatchingInStepLoop], level=Level.UNSAFE)
    assert new_source == (FIXTURES / f"{case}.out.py").read_text()
    return new_source


def test_contiguous_slices_train_bit_for_bit_like_the_original():
    before, after = losses(source("minibatch_mlp")), losses(rewritten("minibatch_mlp"))
    assert len(before) == 3 * 7  # 6 full batches and the partial one, three epochs
    assert torch.equal(after, before)


def test_contiguous_slices_with_two_workers_train_bit_for_bit_like_the_original():
    with_workers = rewritten("minibatch_mlp").replace("shuffle=False)", "shuffle=False, num_workers=2, timeout=60)")
    assert "num_workers=2" in with_workers
    assert torch.equal(losses(with_workers), losses(source("minibatch_mlp")))


@pytest.fixture
def fetched(monkeypatch):
    """Indices the rewritten loader fetches, in order."""
    indices: list[int] = []
    getitem = TensorDataset.__getitem__

    def logged(self, index):
        indices.append(int(index))
        return getitem(self, index)

    monkeypatch.setattr(TensorDataset, "__getitem__", logged)
    return indices


def test_shuffled_rewrite_visits_every_sample_once_per_epoch(fetched):
    printed = losses(rewritten("randperm_epochs"))
    assert len(printed) == EPOCHS * 7  # batches per epoch: 6 of 32, 1 of 11, as the slices gave
    assert len(fetched) == EPOCHS * SAMPLES
    epochs = [fetched[e * SAMPLES : (e + 1) * SAMPLES] for e in range(EPOCHS)]
    for order in epochs:
        assert sorted(order) == list(range(SAMPLES))
    assert len({tuple(order) for order in epochs}) == EPOCHS  # reshuffled every epoch
    assert epochs[0] != list(range(SAMPLES))


def test_shuffled_rewrite_keeps_the_loss_curve_within_tolerance():
    before = losses(source("randperm_epochs")).view(EPOCHS, -1).mean(dim=1)
    after = losses(rewritten("randperm_epochs")).view(EPOCHS, -1).mean(dim=1)
    assert not torch.equal(before, after)  # another random stream: other batches
    relative = ((after - before).abs() / before)[3:]
    assert relative.max() < LATE_EPOCHS_TOLERANCE
    assert relative[-1] < LAST_EPOCH_TOLERANCE
    assert before[0] / before[-1] > 20 and after[0] / after[-1] > 20  # both trained


def test_a_random_batch_every_step_is_reported_not_rewritten():
    case = "random_batch_every_step"
    settings = Settings(select=("PM202",), level=Level.UNSAFE)
    result = process_source(source(case).encode(), case, settings, [ManualBatchingInStepLoop])
    assert result.findings and not any(f.fixable for f in result.findings)
    assert all("draws a new random batch on every training step" in f.message for f in result.findings)
    assert result.new_source.decode() == source(case)
    assert len(losses(source(case))) > 0  # the fixture itself runs


def test_truncated_bptt_windows_are_left_alone():
    """Consecutive windows of one stream, the hidden state carried from one to the next:
    they must stay in order, and there is nothing for a DataLoader to batch."""
    case = "bptt_language_model"
    settings = Settings(select=("PM202",), level=Level.UNSAFE)
    result = process_source(source(case).encode(), case, settings, [ManualBatchingInStepLoop])
    assert result.findings == [] and result.new_source.decode() == source(case)
    assert len(losses(source(case))) > 0  # the fixture itself runs


@pytest.mark.parametrize("case", ["zip_split", "sample_count_name"])
def test_split_batches_and_a_named_sample_count_train_bit_for_bit_like_the_original(case):
    """`zip(X.split(bs), Y.split(bs))`, and `range(0, n, bs)` over `X = torch.randn(n, 7)`:
    both are the batches of a DataLoader over the tensors, in order (7 a epoch, the last shorter)."""
    before, after = losses(source(case)), losses(rewritten(case))
    assert len(before) == 3 * 7
    assert torch.equal(after, before)


SPLITS = """\
import torch
import torch.nn.functional as F

device = "cuda" if torch.cuda.is_available() else "cpu"
X = torch.randn(64, 40000)  # batches of 16 rows: 2.6 MB, large enough for a DataLoader to pay
Y = torch.randn(count(), 1)
model = torch.nn.Linear(40000, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for xb, yb in zip(X.split(16), Y.split(16)):
        loss = F.mse_loss(model(xb.to(device)), yb.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


@pytest.mark.parametrize(
    "edit, reason",
    [
        ((), "cannot tell that `X` / `Y` have the same length (zip stops at the shortest"),
        (("Y = torch.randn(count(), 1)", "Y = torch.randn(64, 1)"), None),
        (("zip(X.split(16), Y.split(16))", "zip(X.split(16), Y.split(8))"), "batches of different sizes"),
        (("zip(X.split(16), Y.split(16))", "zip(X.split(16, dim=1), Y.split(16, dim=1))"), ""),
        (("X = torch.randn(64, 40000)", "X = torch.randn(64, 40000, device=device)"), ""),
        (
            (
                "X = torch.randn(64, 40000)  # batches of 16 rows: 2.6 MB, large enough for a DataLoader to pay\nY = torch.randn(count(), 1)",
                "X = torch.randn(64, 4)\nY = torch.randn(64, 1)",
            ),
            "a batch holds about 320 bytes",
        ),
        (("zip(X.split(16), Y.split(16))", "zip(X.split(sizes), Y.split(sizes))"), "cannot tell that `sizes` is one"),
    ],
)
def test_splits_that_a_loader_may_not_reproduce_are_reported_or_left(edit, reason):
    """None: fixed; "": not this rule's (windows along time, tensors already on the device)."""
    code = SPLITS.replace(*edit) if edit else SPLITS
    settings = Settings(select=("PM202",), level=Level.UNSAFE)
    result = process_source(code.encode(), "<splits>", settings, [ManualBatchingInStepLoop])
    assert result.error is None
    if reason is None:
        assert [f.applied for f in result.findings] == [True]
        assert "for xb, yb in loader:" in result.new_source.decode()
    elif reason == "":
        assert result.findings == []
    else:
        assert [f.fixable for f in result.findings] == [False]
        assert reason in result.findings[0].message


ONE_SPLIT = """\
import os

import torch

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
X = torch.randn(100, 4)
model = torch.nn.Linear(4, 4).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for xb in X.split(int(os.environ.get("BATCH_SIZE", 32))):  # a size perfmod cannot tell
        xb = xb.to(device)
        loss = ((model(xb) - xb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} loss {loss.item()!r}")
"""


def test_one_split_tensor_becomes_a_loader_of_one_tuples_bit_for_bit():
    """`for xb in X.split(32)`: a TensorDataset's items are 1-tuples, so the loop unpacks `(xb,)`."""
    new_source = rewrite(ONE_SPLIT, [ManualBatchingInStepLoop], level=Level.UNSAFE)
    assert "for (xb,) in loader:" in new_source
    before, after = losses(ONE_SPLIT), losses(new_source)
    assert len(before) == 2 * 4  # 100 rows: three batches of 32 and one of 4, two epochs
    assert torch.equal(after, before)


TRAINER_SPLITS = """\
import os

import torch
import torch.nn as nn


class Trainer:
    def __init__(self, device, batch_size=48):
        self.device = device
        self.model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.bs = batch_size

    def fit(self, X, Y, epochs=2):
        for ep in range(epochs):
            for xb, yb in zip(X.split(self.bs), Y.split(self.bs)):
                xb, yb = xb.to(self.device), yb.to(self.device)
                loss = nn.functional.smooth_l1_loss(self.model(xb), yb)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
                print(f"loss {loss.item()!r}")


if __name__ == "__main__":
    torch.manual_seed(0)
    series = torch.cumsum(torch.randn(200 + 15), 0) / 10
    X = torch.stack([series[i : i + 12] for i in range(200)])
    Y = torch.stack([series[i + 12 : i + 15] for i in range(200)])
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    trainer = Trainer(dev, int(os.environ.get("BATCH_SIZE", 48)))  # a size perfmod cannot tell
    trainer.fit(X, Y)
"""


def test_a_trainers_int_batch_size_attribute_and_parameters_of_one_length_train_bit_for_bit():
    """`self.bs = batch_size`, an int parameter the only construction gives an int, is
    one batch size; `X` / `Y` are parameters every call fills with
    200 stacked windows: the same batches as a DataLoader's, in order."""
    new_source = rewrite(TRAINER_SPLITS, [ManualBatchingInStepLoop], level=Level.UNSAFE)
    assert "loader = DataLoader(TensorDataset(X, Y), batch_size=self.bs, shuffle=False)" in new_source
    assert "for xb, yb in loader:" in new_source
    before, after = losses(TRAINER_SPLITS), losses(new_source)
    assert len(before) == 2 * 5  # 200 rows: four batches of 48 and one of 8, two epochs
    assert torch.equal(after, before)


@pytest.mark.parametrize(
    "edit, reason",
    [
        (
            ('Trainer(dev, int(os.environ.get("BATCH_SIZE", 48)))', "Trainer(dev, [150, 50])"),
            "cannot tell that `self.bs` is one",
        ),
        (("trainer.fit(X, Y)", "trainer.fit(X, Y[:150])"), "cannot tell that `X` / `Y` have the same length"),
        (("for i in range(200)])\n    dev", "for i in range(199)])\n    dev"), "cannot tell that `X` / `Y` have"),
    ],
)
def test_a_trainers_splits_not_proven_one_size_and_one_length_are_reported(edit, reason):
    code = TRAINER_SPLITS.replace(*edit)
    assert code != TRAINER_SPLITS
    settings = Settings(select=("PM202",), level=Level.UNSAFE)
    result = process_source(code.encode(), "<splits>", settings, [ManualBatchingInStepLoop])
    assert [f.fixable for f in result.findings] == [False]
    assert reason in result.findings[0].message

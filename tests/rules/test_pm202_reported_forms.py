"""PM202 on forms a blind tester found misread: an argparse `type=int` batch size, step
windows `X[step * B:(step + 1) * B]` over `range(STEPS)`, random batches drawn with the
sample count spelled another way. The rewrites run against the originals on the CPU."""

import sys
from pathlib import Path

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
X = torch.rand(1000, 2500) / 50  # batches of 1.3 MB: a DataLoader pays
Y = torch.rand(1000, 1)
model = torch.nn.Linear(2500, 1)
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
X = torch.randn(STEPS * BATCH, 20000) / 100  # batches of 1.3 MB: a DataLoader pays
Y = torch.randn(STEPS * BATCH, 1)
model = torch.nn.Linear(20000, 1)
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


RANDINT_ROWS = """\
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--bs", type=int, default=128)
p.add_argument("--n", type=int, default=60000)
args = p.parse_args()
X = torch.randn(args.n, 784)
C = torch.randn(args.n)
enc = nn.Linear(784, 64)
probe = nn.Linear(64, 1)
opt2 = torch.optim.SGD(probe.parameters(), lr=0.1, foreach=False)
for step in range(100):
    idx = torch.randint(0, args.n, (args.bs,))
    xb, cb = X[idx], C[idx]
    with torch.no_grad():
        z = enc(xb)
    loss = F.mse_loss(probe(z).squeeze(-1), cb)
    opt2.zero_grad()
    loss.backward()
    opt2.step()
"""

RANDINT_TEXTS = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

DOCS = [f"doc {i} about {i % 7}" for i in range(500)]


def encode(text):
    return [hash(w) % 1000 for w in text.split()][:4]


def main():
    emb = nn.EmbeddingBag(1000, 512)
    head = nn.Linear(512, 7)
    opt = torch.optim.SGD(list(emb.parameters()) + list(head.parameters()), lr=0.1, foreach=False)
    for step in range(3):
        idx = torch.randint(0, len(DOCS), (32,)).tolist()
        texts = [DOCS[i] for i in idx]
        ids = torch.tensor([encode(t) for t in texts])
        y = torch.tensor([i % 7 for i in idx])
        loss = F.cross_entropy(head(emb(ids)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

TIMESTEPS = """\
import torch
import torch.nn.functional as F

T = 1000
alphas_bar = torch.cumprod(1 - torch.linspace(1e-4, 0.02, T), 0)
model = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    x0 = torch.randn(100, 2)
    t = torch.randint(0, T, (x0.size(0),))
    noise = torch.randn_like(x0)
    ab = alphas_bar[t]
    xt = ab.sqrt()[:, None] * x0 + (1 - ab).sqrt()[:, None] * noise
    loss = F.mse_loss(model(torch.cat([xt, t[:, None] / T], 1)), noise)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize(
    "code, line",
    [(RANDINT_ROWS, 16), (RANDINT_TEXTS, 17)],
    ids=["bound-is-the-rows-made", "indices-as-a-list-pick-texts"],
)
def test_a_random_batch_drawn_every_step_is_reported_whatever_the_spelling(code, line):
    findings, new = run(code)
    assert new == code
    assert [(f.line, f.applied) for f in findings] == [(line, False)], findings
    assert "`torch.randint` draws a new random batch on every training step" in findings[0].message


def test_random_timesteps_that_index_a_schedule_are_no_batch():
    findings, new = run(TIMESTEPS)
    assert findings == [] and new == TIMESTEPS


def test_labels_drawn_to_pick_class_centers_are_no_batch():
    """`y = torch.randint(0, k, (n,))` picks rows of the (k, d) centers and is the labels
    too: synthetic data made each step, not samples drawn from a data set."""
    code = (
        "import torch\nimport torch.nn.functional as F\n\n"
        "def mixture(n, d=20, k=4):\n    centers = torch.randn(k, d)\n    y = torch.randint(0, k, (n,))\n"
        "    return centers[y] + torch.randn(n, d), y\n\n"
        "model = torch.nn.Linear(20, 4)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(10):\n    x, y = mixture(32)\n    loss = F.cross_entropy(model(x), y)\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    findings, new = run(code)
    assert findings == [] and new == code
    # the same draw whose indices only pick rows is a batch
    picked = code.replace("return centers[y] + torch.randn(n, d), y", "return centers[y], centers[y][:, 0].long() % k")
    assert [f.line for f in run(picked)[0]] == [6]


def test_shifted_next_token_windows_of_one_stream_are_reported_as_such():
    # `i` is used only in slices: the reason is that the targets are the inputs one step on.
    source = """\
import torch
import torch.nn.functional as F
device = "cuda" if torch.cuda.is_available() else "cpu"
data = torch.randint(0, 20, (401,))
emb = torch.nn.Embedding(20, 20).to(device)
opt = torch.optim.SGD(emb.parameters(), lr=0.5)
for i in range(0, len(data) - 1, 50):
    xb, yb = data[i:i + 50], data[i + 1:i + 51]
    loss = F.cross_entropy(emb(xb.to(device)), yb.to(device))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
    result = process_source(
        source.encode(), "<test>", Settings(select=("PM202",), level=Level.UNSAFE), [ManualBatchingInStepLoop]
    )
    (finding,) = result.findings
    assert not finding.fixable
    assert "`data[i + 1:i + 51]` (line 8) is a second window of `data` at another offset than the batch" in (
        finding.message
    )
    assert "used for more than slicing" not in finding.message


# blind11: small contiguous slices of tensors pinned where the copies go to CUDA. The
# conditional pin (`X, Y = X.pin_memory(), Y.pin_memory()`) keeps their shapes, so the batch
# is still known to be too small for a DataLoader to pay: reported, as without the pin.
SMALL_SLICES = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
X = torch.randn(8192, 64)
Y = torch.randn(8192, 8)
{pin}
model = nn.Linear(64, 8).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for i in range(0, len(X), 1024):
        xb = X[i:i + 1024].to(device)
        yb = Y[i:i + 1024].to(device)
        loss = F.mse_loss(model(xb), yb)
        opt.zero_grad(); loss.backward(); opt.step()
"""


@pytest.mark.parametrize(
    "pin",
    [
        "pass",
        "X = X.pin_memory()\nY = Y.pin_memory()",
        'if device.type == "cuda":\n    X, Y = X.pin_memory(), Y.pin_memory()',
        'if device.type == "cuda":\n    X = X.contiguous().pin_memory()\n    Y = Y.detach()',
    ],
)
def test_small_slices_of_tensors_pinned_on_a_condition_are_reported_not_rewritten(pin):
    source = SMALL_SLICES.format(pin=pin)
    found, new = run(source)
    loop_line = source.splitlines().index("    for i in range(0, len(X), 1024):") + 1
    assert [(f.line, f.fixable) for f in found] == [(loop_line, False)]
    assert "a batch holds about 295 KB" in found[0].message
    assert "DataLoader" not in new


BLIND_PINNED_SLICES = (
    Path(__file__).resolve().parents[2] / "fixtures" / "wild" / "blind11" / "neg_pinned_slices_manual_batching.py"
)


@pytest.mark.parametrize(
    "target",
    ["torch.roll(feats, -1, dims=0)[:, :8]", "feats.roll(-1, 0)[:, :8]", "torch.flip(feats, (0,))[:, :8]"],
)
def test_small_slices_of_targets_shifted_by_torch_roll_are_reported_not_rewritten(target):
    """blind11's must-not: the targets are the features shifted by `torch.roll`, which torch's
    table now shapes, so the batch is known to be small (1024 rows of 64 + 8 floats)."""
    source = BLIND_PINNED_SLICES.read_text().replace("torch.roll(feats, -1, dims=0)[:, :8]", target)
    found, new = run(source)
    assert [(f.line, f.fixable) for f in found] == [(22, False)]
    assert "a batch holds about 295 KB" in found[0].message
    assert new == source

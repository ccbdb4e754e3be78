"""PM202 where the training loop gets its batch from code of the same file: a
generator it iterates, a helper or method it calls every step, a closure, an
iterator it takes `next()` from. Each program is written the way such code is
found in training scripts; the positive ones assemble every batch by hand in the
training process, the negative ones only look alike. Every program here also
runs (a few steps on the CPU), and PM202 leaves its source as it is: these
findings are reports, since the batches are made away from the loop that a fix
could rewrite."""

import subprocess
import sys

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.manual_batching_in_step_loop import ManualBatchingInStepLoop
from tests.rules.scripts import losses, rewrite

TRAINER_BATCHES_METHOD = """
import torch
import torch.nn as nn


class Trainer:
    def __init__(self, model, X, Y, batch_size=16, lr=0.05):
        self.model = model
        self.X = X
        self.Y = Y
        self.batch_size = batch_size
        self.opt = torch.optim.SGD(model.parameters(), lr=lr)

    def _batches(self):
        for start in range(0, len(self.X), self.batch_size):
            yield self.X[start:start + self.batch_size], self.Y[start:start + self.batch_size]

    def fit(self, epochs):
        for epoch in range(epochs):
            for xb, yb in self._batches():  # HERE
                loss = nn.functional.mse_loss(self.model(xb), yb)
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
            print(epoch, loss.item())


torch.manual_seed(0)
X = torch.randn(64, 4)
Trainer(nn.Linear(4, 1), X, X.sum(1, keepdim=True)).fit(2)
"""

NUMPY_ITERATE_MINIBATCHES = """
import numpy as np
import torch
import torch.nn.functional as F


def iterate_minibatches(inputs, targets, batchsize, shuffle=False):
    indices = np.arange(len(inputs))
    if shuffle:
        np.random.shuffle(indices)
    for start_idx in range(0, len(inputs) - batchsize + 1, batchsize):
        excerpt = indices[start_idx:start_idx + batchsize]
        yield inputs[excerpt], targets[excerpt]


np.random.seed(0)
torch.manual_seed(0)
X_train = np.random.randn(120, 6).astype(np.float32)
y_train = (X_train[:, 0] > 0).astype(np.int64)
net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
for epoch in range(3):
    train_err = 0.0
    for inputs, targets in iterate_minibatches(X_train, y_train, 32, shuffle=True):  # HERE
        logits = net(torch.from_numpy(inputs))
        loss = F.cross_entropy(logits, torch.from_numpy(targets))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_err += loss.item()
    print(epoch, train_err)
"""

CLOSURE_SAMPLER = """
import torch
import torch.nn as nn
import torch.nn.functional as F


def train(tokens, vocab, steps=5, block=8, batch=4):
    model = nn.Sequential(nn.Embedding(vocab, 16), nn.Linear(16, vocab))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def sample_batch():
        starts = torch.randint(0, len(tokens) - block - 1, (batch,))  # HERE
        x = torch.stack([tokens[s:s + block] for s in starts])
        y = torch.stack([tokens[s + 1:s + block + 1] for s in starts])
        return x, y

    for step in range(steps):
        x, y = sample_batch()
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss.item()


torch.manual_seed(0)
print(train(torch.randint(0, 20, (500,)), 20))
"""

NOTEBOOK_CELLS = """
# %%
import random

import torch
import torch.nn as nn

random.seed(0)
torch.manual_seed(0)
pairs = [(torch.randn(5), torch.randn(1)) for _ in range(80)]
BATCH = 8

# %%
def get_batch():
    chosen = random.sample(range(len(pairs)), BATCH)  # HERE
    xs = torch.stack([pairs[k][0] for k in chosen])
    ys = torch.stack([pairs[k][1] for k in chosen])
    return xs, ys

# %%
model = nn.Linear(5, 1)
optim = torch.optim.SGD(model.parameters(), lr=0.1)
for it in range(10):
    xb, yb = get_batch()
    loss = ((model(xb) - yb) ** 2).mean()
    optim.zero_grad()
    loss.backward()
    optim.step()
print(loss.item())
"""

INFINITE_STREAM = """
import torch
import torch.nn.functional as F


def batch_stream(X, Y, bs, generator):
    while True:
        idx = torch.randint(0, X.shape[0], (bs,), generator=generator)  # HERE
        yield X[idx], Y[idx]


g = torch.Generator().manual_seed(0)
X, Y = torch.randn(200, 3), torch.randn(200, 1)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
stream = batch_stream(X, Y, 16, g)
for step in range(12):
    xb, yb = next(stream)
    loss = F.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
"""

RNG_OBJECT_IN_TRAINER = """
import random

import torch
import torch.nn as nn


class PairTrainer:
    def __init__(self, examples, seed=0):
        self.examples = examples
        self.rng = random.Random(seed)
        self.model = nn.Bilinear(4, 4, 1)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)

    def next_batch(self, k):
        picked = self.rng.sample(self.examples, k)  # HERE
        a = torch.stack([p[0] for p in picked])
        b = torch.stack([p[1] for p in picked])
        return a, b

    def train_step(self):
        a, b = self.next_batch(6)
        loss = -self.model(a, b).sigmoid().log().mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss

    def run(self, steps):
        for _ in range(steps):
            loss = self.train_step()
        print(loss.item())


torch.manual_seed(0)
PairTrainer([(torch.randn(4), torch.randn(4)) for _ in range(30)]).run(5)
"""

NUMPY_GENERATOR_CHOICE = """
import numpy as np
import torch
import torch.nn.functional as F

rng = np.random.default_rng(0)
torch.manual_seed(0)
features = np.random.default_rng(1).normal(size=(300, 10)).astype(np.float32)
labels = (features.sum(1) > 0).astype(np.int64)


def draw(n):
    rows = rng.choice(len(features), size=n, replace=False)  # HERE
    return torch.from_numpy(features[rows]), torch.from_numpy(labels[rows])


clf = torch.nn.Linear(10, 2)
opt = torch.optim.SGD(clf.parameters(), lr=0.1)
for step in range(8):
    xb, yb = draw(32)
    loss = F.cross_entropy(clf(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
"""

TBPTT_ENUMERATED = """
import torch
import torch.nn as nn


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1)


torch.manual_seed(0)
stream = batchify(torch.randint(0, 30, (2000,)), 8)
emb, rnn, head = nn.Embedding(30, 12), nn.GRU(12, 24, batch_first=True), nn.Linear(24, 30)
params = [*emb.parameters(), *rnn.parameters(), *head.parameters()]
opt = torch.optim.Adam(params, lr=3e-3)
bptt = 35
hidden = torch.zeros(1, 8, 24)
for batch, i in enumerate(range(0, stream.size(1) - 1, bptt)):
    seq_len = min(bptt, stream.size(1) - 1 - i)
    inp = stream[:, i:i + seq_len]
    target = stream[:, i + 1:i + 1 + seq_len]
    hidden = hidden.detach()
    out, hidden = rnn(emb(inp), hidden)
    loss = nn.functional.cross_entropy(head(out).reshape(-1, 30), target.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
print(batch, loss.item())
"""

MODULE_GENERATOR_HOST_TENSORS = """
import torch

torch.manual_seed(0)
X = torch.randn(96, 4)
Y = X @ torch.randn(4, 1)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)


def batches(bs):
    for i in range(0, len(X), bs):
        yield X[i:i + bs], Y[i:i + bs]


for epoch in range(2):
    for xb, yb in batches(32):  # HERE
        loss = ((model(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
print(loss.item())
"""

INDEX_BATCHES_GENERATOR = """
import torch

torch.manual_seed(0)
X = torch.randn(64, 3)
Y = torch.randn(64, 1)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def index_batches(n, bs):
    perm = torch.randperm(n)
    for i in range(0, n, bs):
        yield perm[i:i + bs]


for epoch in range(2):
    for idx in index_batches(len(X), 16):  # HERE
        loss = ((model(X[idx]) - Y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
print(loss.item())
"""

POSITIVES = {
    "trainer_batches_method": (TRAINER_BATCHES_METHOD, "`_batches()` cuts the batches of this training loop by hand"),
    "numpy_iterate_minibatches": (
        NUMPY_ITERATE_MINIBATCHES,
        "`iterate_minibatches()` cuts the batches of this training loop by hand",
    ),
    "module_generator_host_tensors": (
        MODULE_GENERATOR_HOST_TENSORS,
        "`batches()` cuts the batches of this training loop by hand (`X[i:i + bs]`, line 13)",
    ),
    "index_batches_generator": (
        INDEX_BATCHES_GENERATOR,
        "`index_batches()` cuts the batches of this training loop by hand (`perm[i:i + bs]`, line 14)",
    ),
    "closure_sampler": (CLOSURE_SAMPLER, "`sample_batch()`, called by the training loop on line"),
    "notebook_cells": (NOTEBOOK_CELLS, "`get_batch()`, called by the training loop on line"),
    "infinite_stream": (INFINITE_STREAM, "`batch_stream()`, called by the training loop on line"),
    "rng_object_in_trainer": (RNG_OBJECT_IN_TRAINER, "`next_batch()`, called by the training loop on line"),
    "numpy_generator_choice": (NUMPY_GENERATOR_CHOICE, "`draw()`, called by the training loop on line"),
}

HELPER_READS_A_LOADER_BATCH = """
import torch
from torch.utils.data import DataLoader, TensorDataset

X, Y = torch.randn(64, 3), torch.randn(64, 1)
loader = DataLoader(TensorDataset(X, Y), batch_size=8, shuffle=True)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def next_batch(it):
    xb, yb = next(it)
    return xb[:, :2].contiguous(), yb


def forever(dl):
    while True:
        for batch in dl:
            yield batch


it = iter(loader)
for step in range(6):
    xb, yb = next_batch(it)
    loss = ((model(torch.cat([xb, xb[:, :1]], 1)) - yb) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
stream = forever(loader)
for step in range(6):
    xb, yb = next(stream)
    loss = ((model(xb) - yb) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
"""

EVAL_ONLY_HELPERS = """
import torch
import torch.nn.functional as F

torch.manual_seed(0)
data = torch.randint(0, 16, (400,))
val = torch.randint(0, 16, (100,))
model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def random_val_batch(bs=4, T=6):
    ix = torch.randint(len(val) - T - 1, (bs,))
    return torch.stack([val[i:i + T] for i in ix]), torch.stack([val[i + 1:i + T + 1] for i in ix])


def val_windows(T=6):
    for i in range(0, len(val) - 1, T):
        yield val[i:i + T]


@torch.no_grad()
def evaluate():
    total = 0.0
    for _ in range(3):
        x, y = random_val_batch()
        total += F.cross_entropy(model(x).view(-1, 16), y.view(-1)).item()
    for w in val_windows():
        model(w)
    return total / 3


for step in range(5):
    x = data[:-1].view(1, -1)
    y = data[1:].view(1, -1)
    loss = F.cross_entropy(model(x).view(-1, 16), y.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 2 == 0:
        print(step, evaluate())
"""

HELPER_CALLED_ONCE_BEFORE_THE_LOOP = """
import torch
import torch.nn.functional as F

torch.manual_seed(0)
corpus = torch.randint(0, 10, (300,))


def get_batch(bs=8, T=5):
    ix = torch.randint(len(corpus) - T - 1, (bs,))
    return torch.stack([corpus[i:i + T] for i in ix]), torch.stack([corpus[i + 1:i + T + 1] for i in ix])


# overfit one fixed batch first, as a sanity check
model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
xb, yb = get_batch()
for step in range(10):
    loss = F.cross_entropy(model(xb).view(-1, 10), yb.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
"""

GPU_RESIDENT_GENERATOR = """
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
X = torch.randn(64, 3, device=device)
Y = torch.randn(64, 1, device=device)
model = torch.nn.Linear(3, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def chunks(bs):
    for i in range(0, len(X), bs):
        yield X[i:i + bs], Y[i:i + bs]


for epoch in range(2):
    for xb, yb in chunks(16):
        loss = ((model(xb) - yb) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
print(loss.item())
"""

DIFFUSION_TIMESTEPS_HELPER = """
import torch
import torch.nn.functional as F

T = 100
X = torch.randn(64, 4)
model = torch.nn.Linear(5, 4)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)


def noisy(x0):
    t = torch.randint(0, T, (x0.shape[0],))
    noise = torch.randn_like(x0)
    return x0 + noise * (t[:, None] / T), noise, t


for epoch in range(2):
    xt, noise, t = noisy(X)
    loss = F.mse_loss(model(torch.cat([xt, t[:, None].float() / T], 1)), noise)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(loss.item())
"""

MICRO_BATCHES_OF_A_LOADER_BATCH = """
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
X, Y = torch.randn(64, 3), torch.randn(64, 1)
loader = DataLoader(TensorDataset(X, Y), batch_size=16)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ACCUM = 4


def micro_batches(x, y, n):
    for i in range(0, len(x), n):
        yield x[i:i + n], y[i:i + n]


for xb, yb in loader:
    opt.zero_grad()
    for mx, my in micro_batches(xb, yb, ACCUM):
        loss = ((model(mx) - my) ** 2).mean() / ACCUM
        loss.backward()
    opt.step()
it = iter(loader)
for step in range(3):
    batch = next(it)
    opt.zero_grad()
    for i in range(0, len(batch[0]), ACCUM):
        inputs = batch[0]
        loss = ((model(inputs[i:i + ACCUM]) - batch[1][i:i + ACCUM]) ** 2).mean() / ACCUM
        loss.backward()
    opt.step()
print(loss.item())
"""

TBPTT_OVER_TIME = """
import torch
import torch.nn.functional as F

torch.manual_seed(0)
corpus = torch.randint(0, 20, (2, 301))
emb, lstm, head = torch.nn.Embedding(20, 8), torch.nn.LSTM(8, 16, batch_first=True), torch.nn.Linear(16, 20)
opt = torch.optim.Adam([*emb.parameters(), *lstm.parameters(), *head.parameters()], lr=1e-2)
carry = None
for t in range(0, corpus.size(1) - 1, 30):
    inp = corpus[:, t:t + 30]
    tgt = corpus[:, t + 1:t + 31]
    if carry is not None:
        carry = tuple(c.detach() for c in carry)
    out, carry = lstm(emb(inp), carry)
    loss = F.cross_entropy(head(out).reshape(-1, 20), tgt.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

STREAM_CHUNKS_PER_SAMPLE = """
import torch

torch.manual_seed(0)
cell = torch.nn.GRUCell(4, 8)
readout = torch.nn.Linear(8, 1)
opt = torch.optim.SGD([*cell.parameters(), *readout.parameters()], lr=1e-2)
signal = torch.randn(120, 4)
target = signal.sum(1, keepdim=True).cumsum(0) / 10
state = torch.zeros(1, 8)
for start in range(0, 120, 15):
    xs, ys = signal[start:start + 15], target[start:start + 15]
    loss = 0.0
    for k in range(xs.size(0)):
        state = cell(xs[k:k + 1], state)
        loss = loss + (readout(state) - ys[k:k + 1]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    state = state.detach()
"""

NEGATIVES = {
    "helper_reads_a_loader_batch": HELPER_READS_A_LOADER_BATCH,
    "eval_only_helpers": EVAL_ONLY_HELPERS,
    "helper_called_once_before_the_loop": HELPER_CALLED_ONCE_BEFORE_THE_LOOP,
    "gpu_resident_generator": GPU_RESIDENT_GENERATOR,
    "diffusion_timesteps_helper": DIFFUSION_TIMESTEPS_HELPER,
    "micro_batches_of_a_loader_batch": MICRO_BATCHES_OF_A_LOADER_BATCH,
    # truncated BPTT: consecutive windows of one stream, the hidden state carried from one to
    # the next; they must stay in order, and there is nothing for a DataLoader to batch
    "tbptt_enumerated": TBPTT_ENUMERATED,
    "tbptt_over_time": TBPTT_OVER_TIME,
    "stream_chunks_per_sample": STREAM_CHUNKS_PER_SAMPLE,
}


def check(code: str):
    settings = Settings(select=("PM202",), level=Level.UNSAFE)
    result = process_source(code.encode(), "<test>", settings, [ManualBatchingInStepLoop])
    assert result.error is None, result.error
    return result


def marked_line(code: str) -> int:
    return next(n for n, line in enumerate(code.splitlines(), start=1) if line.rstrip().endswith("# HERE"))


@pytest.mark.parametrize("case", POSITIVES)
def test_batches_made_in_the_files_own_code_are_reported_where_they_are_made(case):
    code, message = POSITIVES[case]
    result = check(code)
    assert [f.line for f in result.findings] == [marked_line(code)]
    finding = result.findings[0]
    assert message in finding.message
    assert not finding.fixable and result.new_source.decode() == code


@pytest.mark.parametrize("case", NEGATIVES)
def test_look_alikes_are_left_alone(case):
    result = check(NEGATIVES[case])
    assert result.findings == [] and result.new_source.decode() == NEGATIVES[case]


def test_the_report_says_what_the_generator_cuts_and_why_it_is_not_rewritten():
    (finding,) = check(NUMPY_ITERATE_MINIBATCHES).findings
    assert "(`indices[start_idx:start_idx + batchsize]`, line 12)" in finding.message
    assert "the rows of `inputs` / `targets` are picked through `indices`" in finding.message
    (finding,) = check(TRAINER_BATCHES_METHOD).findings
    assert "`self.X` is not known to be a tensor in host memory" in finding.message  # the trainer is given it
    (finding,) = check(MODULE_GENERATOR_HOST_TENSORS).findings
    # host tensors, contiguous windows: the DataLoader that would replace the generator
    assert "build a DataLoader(TensorDataset(X, Y)) with the same batch size once" in finding.message


def test_a_helper_shared_by_training_and_evaluation_names_only_the_training_call():
    code = EVAL_ONLY_HELPERS.replace(
        "    x = data[:-1].view(1, -1)\n    y = data[1:].view(1, -1)\n", "    x, y = random_val_batch()\n"
    )
    (finding,) = check(code).findings
    call = next(n for n, line in enumerate(code.splitlines(), start=1) if line == "    x, y = random_val_batch()")
    assert f"called by the training loop on line {call}," in finding.message


def test_suppressed_where_the_batch_is_drawn():
    code = NOTEBOOK_CELLS.replace("  # HERE", "  # perfmod: ignore[PM202]")
    assert check(code).findings == []


def test_every_program_trains(tmp_path):
    """Each program runs as written (in one interpreter, one after the other)."""
    programs = {**{name: code for name, (code, _) in POSITIVES.items()}, **NEGATIVES}
    for name, code in programs.items():
        (tmp_path / f"{name}.py").write_text(code)
    driver = "import runpy, sys\nfor path in sys.argv[1:]:\n    runpy.run_path(path, run_name='__main__')\n"
    paths = [str(tmp_path / f"{name}.py") for name in programs]
    done = subprocess.run([sys.executable, "-c", driver, *paths], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


# -- the step loop's own windows, spelled as other code spells them ----------------------

ENUMERATED_SLICES = """\
import os

import torch
import torch.nn.functional as F

torch.manual_seed(0)
X = torch.randn(203, 6)
Y = X @ torch.randn(6, 1)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
bs = int(os.environ.get("BATCH_SIZE", 32))  # a size perfmod cannot tell: fixed
for epoch in range(3):
    for step, i in enumerate(range(0, len(X), bs)):
        xb, yb = X[i:i + bs], Y[i:i + bs]
        loss = F.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} step {step} loss {loss.item()!r}")
"""


def test_enumerated_windows_become_an_enumerated_loader_and_train_bit_for_bit_alike():
    new = rewrite(ENUMERATED_SLICES, [ManualBatchingInStepLoop], level=Level.UNSAFE)
    assert "loader = DataLoader(TensorDataset(X, Y), batch_size=bs, shuffle=False)\n" in new
    assert "    for step, (xb, yb) in enumerate(loader):\n" in new
    assert "X[i:i + bs]" not in new
    before, after = losses(ENUMERATED_SLICES), losses(new)
    assert len(before) == 3 * 7 and torch.equal(before, after)
    assert check(new).findings == []  # idempotent


WINDOWS_OVER_TIME = """\
import torch

torch.manual_seed(0)
series = torch.randn(4, 500)
model = torch.nn.Linear(20, 20)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for t in range(0, series.size(1) - 20, 20):
    x = series[:, t:t + 20]
    y = series[:, t + 1:t + 21]
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

SHORTER_LAST_WINDOW = """\
import torch

X = torch.randn(100, 8)
Y = torch.randn(100, 1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
bs = 16
for i in range(0, len(X), bs):
    n = min(bs, len(X) - i)
    xb, yb = X[i:i + n], Y[i:i + n]
    loss = ((model(xb) - yb) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize(
    "code,reason",
    [
        (WINDOWS_OVER_TIME, "`series[:, t:t + 20]` cuts windows along dimension 1"),
        (SHORTER_LAST_WINDOW, "the windows `X[i:i + n]` are not all `bs` long"),
    ],
)
def test_windows_a_loader_would_not_give_are_reported_with_the_reason(code, reason):
    result = check(code)
    assert len(result.findings) == 1 and reason in result.findings[0].message
    assert not result.findings[0].fixable and result.new_source.decode() == code


def test_time_windows_of_a_batch_inside_the_step_are_no_batches():
    code = """\
import torch

X = torch.randn(64, 40, 800)  # batches of 2 MB
model = torch.nn.Linear(800, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(0, len(X), 16):
    xb = X[i:i + 16]
    loss = 0.0
    for t in range(0, xb.size(1), 10):
        loss = loss + model(xb[:, t:t + 10]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
    result = check(code)
    # the step loop's own batches are fixed; the chunks of each batch over time are left alone
    assert len(result.findings) == 1 and result.findings[0].line == 6 and result.findings[0].fixable

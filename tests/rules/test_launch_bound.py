"""The launch-bound estimate (codemod/analysis/sizes.py): each matrix product a step's models
make, over the rows of the batch they are given, against the host's time to launch a kernel.
A step whose every product takes less device time than its launch gains nothing from TF32 or
autocast (PM302, PM301): the device waits for the host. Rows come from the batch the models
are called on (a DataLoader's batch by part, a tensor made in the step); a batch or a model
perfmod cannot size keeps the fix, and so does a batch large enough to keep the device busy."""

from __future__ import annotations

import libcst as cst
import pytest

from codemod.analysis.sizes import HARDWARE, launch_bound, product_seconds, sizes_of
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.rule import Level

# A classifier on features held in memory: a 512-wide MLP fed by a DataLoader.
LOADER = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

X = torch.randn(10000, 512)
Y = torch.randint(0, 10, (10000,))
loader = DataLoader(TensorDataset(X, Y), batch_size=BATCH, shuffle=True)
model = nn.Sequential(nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    for FED
        x, y = x.cuda(), y.cuda()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

# A character model whose batches of token ids are drawn in the step: ids become rows.
TOKENS = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

B, T = 32, 16
model = nn.Sequential(nn.Embedding(100, 64), nn.Linear(64, 100)).to("cuda")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(1000):
    x = torch.randint(0, 100, (B, T)).cuda()
    loss = F.cross_entropy(model(x).view(-1, 100), x.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def loader_script(batch: int, fed: str = "x, y in loader:") -> str:
    return LOADER.replace("BATCH", str(batch)).replace("FED", fed)


def findings(code: str):
    result = process_source(code.encode(), "<launch>", Settings(select=("PM301", "PM302"), level=Level.UNSAFE))
    assert result.error is None, result.error
    return {f.code: f for f in result.findings}


def step_rows(code: str) -> int | None:
    ctx = FileContext.of_source(code)
    (loop,) = ctx.training.loops
    return sizes_of(ctx).step_rows(loop.loop)


def names(ctx: FileContext, name: str) -> list[cst.Name]:
    return [n for n in ctx.index.find(cst.Name) if n.value == name]


# -- the analysis ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fed",
    [
        "x, y in loader:",  # the loop's target
        "batch_idx, (x, y) in enumerate(loader):",  # through enumerate
        "batch in loader:\n        x, y = batch",  # a batch unpacked in the body
    ],
)
def test_the_parts_of_a_loaders_batch_are_sized_where_the_loop_binds_them(fed):
    ctx = FileContext.of_source(loader_script(32, fed))
    sizes = sizes_of(ctx)
    assert {sizes.tensor(n) for n in names(ctx, "x")[-2:]} == {((32, 512), 4)}  # float32 features
    assert {sizes.tensor(n) for n in names(ctx, "y")[-2:]} == {((32,), 8)}  # int64 classes


def test_a_batch_the_code_cannot_size_is_unknown():
    ctx = FileContext.of_source(loader_script(32).replace("TensorDataset(X, Y)", "dataset_from_disk()"))
    assert sizes_of(ctx).tensor(names(ctx, "x")[-1]) is None
    assert step_rows(loader_script(32).replace("TensorDataset(X, Y)", "dataset_from_disk()")) is None


# Spectrogram frames: the batch holds 80 mel bins by 3000 frames, and the model moves the
# frames to the front before its first layer, so each frame is a row.
FRAMES = """\
import torch
import torch.nn as nn


class FrameClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(80, 256)
        self.head = nn.Linear(256, 40)

    def forward(self, mel):
        return self.head(torch.relu(self.proj(mel.transpose(1, 2))))


model = FrameClassifier().cuda()
opt = torch.optim.Adam(model.parameters())
for step in range(100):
    mel = torch.randn(4, 80, 3000).cuda()
    loss = model(mel).logsumexp(-1).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_rows_are_the_samples_of_a_float_batch_and_every_id_of_a_batch_of_indices():
    # 32 samples of 512 features: no other dim of the batch is a width the model multiplies by
    assert step_rows(loader_script(32)) == 32
    assert step_rows(TOKENS) == 32 * 16  # each id is looked up into a row
    assert step_rows(TOKENS.replace("torch.randint(0, 100, (B, T))", "make_batch()")) is None


def test_a_float_batch_whose_features_are_not_last_counts_its_elements_over_the_narrowest_input():
    # the leading dims say 4 x 80 = 320 rows; the model runs 4 x 3000 = 12,000
    assert step_rows(FRAMES) == 4 * 80 * 3000 // 80
    found = findings(FRAMES)  # 2 x 12,000 x 80 x 256 flops: 25 us, longer than a launch
    assert set(found) == {"PM301", "PM302"} and all(f.applied for f in found.values())


# A 784-500-10 MLP on MNIST images flattened in the step (the shape of many tutorials).
FLATTENED = """\
import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as transforms

train = torchvision.datasets.MNIST(root="data", train=True, transform=transforms.ToTensor(), download=True)
loader = torch.utils.data.DataLoader(dataset=train, batch_size=100, shuffle=True)


class NeuralNet(nn.Module):
    def __init__(self, input_size, hidden_size, num_classes):
        super().__init__()
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden_size, num_classes)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


model = NeuralNet(784, 500, 10).to("cuda")
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(5):
    for i, (images, labels) in enumerate(loader):
        images = images.reshape(-1, 28 * 28).to("cuda")
        loss = criterion(model(images), labels.to("cuda"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_rows_are_not_the_elements_over_a_width_no_dim_of_the_batch_has():
    # 100 x 784 elements would make 156.8 rows of the second layer's 500 inputs: no view of
    # the batch has that shape, so the rows are its 100 samples
    assert step_rows(FLATTENED) == 100
    found = findings(FLATTENED)  # 2 x 100 x 784 x 500 flops: 4.0 us, less than a launch
    assert set(found) == {"PM301", "PM302"} and not any(f.applied for f in found.values())
    assert "100 x 784 by 784 x 500" in found["PM302"].message


def test_a_products_device_time_is_its_arithmetic_or_its_memory_traffic_whichever_is_longer():
    flops = 2 * 32 * 512 * 256
    assert product_seconds(32, (512, 256)) == pytest.approx(flops / HARDWARE["fp32_flops_per_s"])
    moved = 4 * (4 * 4096 + 4096 * 4096 + 4 * 4096)  # four rows: the weights' bytes dominate
    assert product_seconds(4, (4096, 4096)) == pytest.approx(moved / HARDWARE["memory_bytes_per_s"])


def test_launch_bound_says_why_with_the_numbers_and_only_below_a_launch():
    why = launch_bound(((512, 256), (256, 10)), 32)
    assert (
        "the 32 rows of the step's batch" in why
        and "32 x 512 by 512 x 256" in why
        and "0.43 us" in why
        and "5 us" in why
    )
    # 2 x 1024 x 512 x 256 flops take 13 us in float32: longer than a launch
    assert launch_bound(((512, 256),), 1024) is None
    assert launch_bound(((512, 256),), None) is None
    assert launch_bound((), 32) is None


# -- the rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [loader_script(32), TOKENS])
def test_tf32_and_autocast_are_reported_not_fixed_on_a_launch_bound_step(code):
    found = findings(code)
    assert set(found) == {"PM301", "PM302"} and not any(f.applied or f.fixable for f in found.values())
    for finding in found.values():
        assert "launch a kernel" in finding.message and " us on the device" in finding.message
    assert "too short for TF32" in found["PM302"].message
    assert "cast kernel before each product" in found["PM301"].message


def test_a_batch_large_enough_to_keep_the_device_busy_keeps_both_fixes():
    found = findings(loader_script(4096))  # 2 x 4096 x 512 x 256 flops: 55 us
    assert set(found) == {"PM301", "PM302"} and all(f.applied for f in found.values())


def test_a_step_whose_batch_cannot_be_sized_keeps_both_fixes():
    found = findings(TOKENS.replace("torch.randint(0, 100, (B, T))", "make_batch()"))
    assert set(found) == {"PM301", "PM302"} and all(f.applied for f in found.values())


def test_a_step_that_convolves_has_no_rows_its_products_run_over_positions_the_batch_hides():
    conv = LOADER.replace("X = torch.randn(10000, 512)", "X = torch.randn(10000, 1, 8, 8)").replace(
        "nn.Sequential(nn.Linear(512, 256),",
        "nn.Sequential(nn.Conv2d(1, 8, 3), nn.Flatten(), nn.Linear(288, 256),",
    )
    assert step_rows(conv.replace("BATCH", "32").replace("FED", "x, y in loader:")) is None


ACCUMULATED = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


def main(steps=6, accum=3):
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(12, 256), nn.GELU(), nn.Linear(256, 3)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(steps * accum):
        x, y = torch.randn(6, 12), torch.randint(0, 3, (6,))
        loss = F.cross_entropy(model(x.to(device)), y.to(device)) / accum
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()


if __name__ == "__main__":
    main()
"""


def test_a_launch_bound_step_stays_reported_after_the_torchrun_rewrite_changes_it():
    # PM601 picks the device with `distributed.setup(...)` and skips the gradient sync of
    # micro-steps under `model.no_sync() if ... else contextlib.nullcontext()`: the next round
    # still sizes the batch the model is called on, and does not apply what round one held back
    result = process_source(
        ACCUMULATED.encode(), "<launch>", Settings(select=("PM301", "PM302", "PM601"), level=Level.UNSAFE)
    )
    assert result.error is None, result.error
    new = result.new_source.decode()
    assert "distributed.setup(" in new and "model.no_sync()" in new and "contextlib.nullcontext()" in new
    held = [f for f in result.findings if f.code in ("PM301", "PM302")]
    assert {f.code for f in held} == {"PM301", "PM302"} and not any(f.applied for f in held)
    assert "autocast" not in new and "set_float32_matmul_precision" not in new


# A trainer given its model, whose dataset picks a row of a table by a label it holds, and
# whose step keeps a copy of the weights in a host buffer.
TRAINER = """\
import gc
import io
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Blobs(Dataset):
    def __init__(self, n):
        self.centers = torch.randn(5, 20)
        self.labels = torch.randint(0, 5, (n,))
        self.noise = torch.randn(n, 20)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.centers[self.labels[i]] + self.noise[i], self.labels[i]


class Trainer:
    def __init__(self, model):
        self.model = model.to("cuda")
        self.opt = torch.optim.Adam(self.model.parameters())
        self.loader = DataLoader(Blobs(640), batch_size=64, shuffle=True)

    def fit(self):
        for x, y in self.loader:
            loss = F.cross_entropy(self.model(x.cuda()), y.cuda())
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            buf = io.BytesIO()
            torch.save(self.model.state_dict(), buf)
            gc.collect()


Trainer(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))).fit()
"""


def test_a_model_handed_to_a_trainer_and_rows_picked_by_a_tensor_label_are_sized():
    ctx = FileContext.of_source(TRAINER)
    (loop,) = ctx.training.loops
    sizes = sizes_of(ctx)
    # the parameter `model`, moved with `.to()`, holds the Sequential it is given
    assert sizes.step_products(loop.loop) == ((20, 64), (64, 5))
    # `self.centers[self.labels[i]]`: a 0-d int64 index picks one row, as an int does
    assert sizes.step_rows(loop.loop) == 64
    found = findings(TRAINER)
    assert {"PM301", "PM302"} <= set(found) and not found["PM302"].applied


def test_a_call_of_a_host_module_in_the_step_hides_no_product():
    # `io.BytesIO()` and `gc.collect()` run on the host; a call of another library still may multiply
    ctx = FileContext.of_source(TRAINER)
    assert sizes_of(ctx).step_products(ctx.training.loops[0].loop) is not None
    other = FileContext.of_source(TRAINER.replace("gc.collect()", "import scipy; scipy.linalg.norm(buf)"))
    assert sizes_of(other).step_products(other.training.loops[0].loop) is None


def test_a_submodule_the_models_own_step_method_calls_is_sized():
    # `self.net(x)` in a LightningModule-like class: the submodule runs, not a method of the model
    code = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))

    def training_step(self, x, y):
        return F.mse_loss(self.net(x), y)


module = Forecaster().cuda()
opt = torch.optim.Adam(module.parameters())
for step in range(10):
    x, y = torch.randn(32, 64).cuda(), torch.randn(32, 64).cuda()
    loss = module.training_step(x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
    ctx = FileContext.of_source(code)
    assert sizes_of(ctx).step_products(ctx.training.loops[0].loop) == ((64, 256), (256, 64))

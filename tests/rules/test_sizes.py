"""The sizes a program shows (codemod/analysis/sizes.py) and the fixes they hold back
(issue 22, noisy fixes): copies and prefetches of small batches in loops that read a value
to the host every step (PM101, PM102, PM103), background saves of small checkpoints
(PM405), TF32 for models whose matrix products are all bound by memory (PM302). A size
perfmod cannot tell keeps the fix; one it knows to be large keeps it too."""

from __future__ import annotations

import libcst as cst
import pytest
import torch

from codemod.analysis.sizes import MIN_COPY_BYTES, MIN_SAVE_BYTES, ModuleSize, memory_bound, sizes_of
from codemod.analysis.torch_facts import TORCH_SAVES
from codemod.analysis.torch_ops import OPS
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.rule import Level

# pytorch/examples mnist/main.py, cut down: MNIST at batch 64 (200 KB), a test loop that
# reads `.item()` every batch, a training loop that logs every 10 steps.
MNIST = """\
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision import datasets, transforms


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return F.log_softmax(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))), dim=1)


def train(args, model, device, train_loader, optimizer):
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(loss.item())


def test(model, device, test_loader):
    total = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            total += F.nll_loss(model(data), target, reduction="sum").item()
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=BATCH)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()
    device = torch.device("cuda")
    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": args.test_batch_size}
    accel_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
    train_kwargs.update(accel_kwargs)
    test_kwargs.update(accel_kwargs)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_loader = torch.utils.data.DataLoader(datasets.MNIST("data", train=True, transform=transform), **train_kwargs)
    test_loader = torch.utils.data.DataLoader(datasets.MNIST("data", train=False, transform=transform), **test_kwargs)
    model = Net().to(device)
    optimizer = torch.optim.Adadelta(model.parameters())
    for epoch in range(3):
        train(args, model, device, train_loader, optimizer)
        test(model, device, test_loader)
        torch.save(model.state_dict(), f"mnist_{epoch}.pt")


if __name__ == "__main__":
    main()
"""
MNIST_ITEM = 28 * 28 * 4 + 8  # a float32 image after ToTensor, and its int64 label

# pytorch/examples distributed/ddp-tutorial-series/single_gpu.py, cut down: the tutorial's
# Linear(20, 1), snapshotted every few epochs.
TUTORIAL = """\
import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every):
        self.model = model.to("cuda")
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def _save_checkpoint(self, epoch):
        ckp = {"model": self.model.state_dict(), "epoch": epoch}
        torch.save(ckp, "checkpoint.pt")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            for source, targets in self.train_data:
                self._run_batch(source.to("cuda"), targets.to("cuda"))
            if epoch % self.save_every == 0:
                self._save_checkpoint(epoch)


def load_train_objs():
    model = torch.nn.Linear(WIDTH, OUT)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return model, optimizer


def main():
    model, optimizer = load_train_objs()
    data = [(torch.randn(32, WIDTH), torch.randint(0, 1, (32,))) for _ in range(4)]
    Trainer(model, data, optimizer, save_every=2).train(10)


if __name__ == "__main__":
    main()
"""


def tutorial(width: int, out: int) -> str:
    return TUTORIAL.replace("WIDTH", str(width)).replace("OUT", str(out))


def context(code: str) -> FileContext:
    return FileContext.of_source(code)


def findings(code: str, *codes: str):
    result = process_source(code.encode(), "<sizes>", Settings(select=codes, level=Level.UNSAFE))
    assert result.error is None, result.error
    return result


def saves(ctx: FileContext) -> list[int | None]:
    sizes = sizes_of(ctx)
    calls = [c for c in ctx.index.find(cst.Call) if ctx.names.is_(c, *TORCH_SAVES)]
    return [sizes.saved_bytes(call.args[0].value) for call in calls]


# -- the analysis ---------------------------------------------------------------------------


def test_batches_of_mnist_through_argparse_defaults_and_a_settings_dict():
    ctx = context(MNIST.replace("BATCH", "1000"))
    sizes = sizes_of(ctx)
    found = {
        ctx.line(feed.loop): sizes.loader_batch_bytes(ctx.loaders.sources(feed.loader, (), 0)[0])
        for feed in ctx.loaders.feeds
    }
    assert found == {23: 64 * MNIST_ITEM, 36: 1000 * MNIST_ITEM}
    syncs = {ctx.line(feed.loop): sizes.sync_every_step(feed.loop) for feed in ctx.loaders.feeds}
    assert syncs[23] is None  # `.item()` only every log_interval steps
    assert ctx.source(syncs[36]) == 'F.nll_loss(model(data), target, reduction="sum").item()'


def test_a_size_that_an_update_may_change_or_a_transform_that_may_resize_is_unknown():
    changed = MNIST.replace("BATCH", "1000").replace(
        'accel_kwargs = {"num_workers": 1,', 'accel_kwargs = {"batch_size": 4096, "num_workers": 1,'
    )
    ctx = context(changed)
    assert all(
        sizes_of(ctx).loader_batch_bytes(ctx.loaders.sources(feed.loader, (), 0)[0]) is None
        for feed in ctx.loaders.feeds
    )
    ctx = context(
        MNIST.replace("BATCH", "1000").replace(
            "transforms.ToTensor(),", "transforms.Resize(224), transforms.ToTensor(),"
        )
    )
    assert all(
        sizes_of(ctx).loader_batch_bytes(ctx.loaders.sources(feed.loader, (), 0)[0]) is None
        for feed in ctx.loaders.feeds
    )


def test_parameters_and_products_of_a_model_class_and_its_checkpoint():
    ctx = context(MNIST.replace("BATCH", "1000"))
    sizes = sizes_of(ctx)
    convs = 1 * 32 * 9 + 32 + 32 * 64 * 9 + 64
    linears = 9216 * 128 + 128 + 128 * 10 + 10
    (loop,) = ctx.training.loops
    (model,) = sizes.trained_modules(loop.optimizers)
    assert model.parameters == convs + linears and model.products == ((9216, 128), (128, 10))
    assert saves(ctx) == [4 * (convs + linears)]


def test_a_linear_model_handed_through_a_trainer_and_a_snapshot_dict():
    ctx = context(tutorial(20, 1))
    assert saves(ctx) == [4 * 21]  # the epoch counter adds nothing
    (loop,) = ctx.training.loops
    assert sizes_of(ctx).step_products(loop.loop) == ((20, 1),)


def test_a_pairwise_distance_multiplies_matrices_of_a_width_unknown_unless_it_is_pdist():
    """`torch.cdist` multiplies the rows it is given (a product perfmod does not size);
    `F.pdist` computes its distances in a kernel of its own."""
    loss = "loss = F.cross_entropy(self.model(source), targets)"
    for distance, products in (("torch.cdist(source, source)", None), ("F.pdist(source)", ((20, 1),))):
        ctx = context(tutorial(20, 1).replace(loss, f"{loss} + {distance}.mean()"))
        (loop,) = ctx.training.loops
        assert sizes_of(ctx).step_products(loop.loop) == products, distance


def test_batch_norm_buffers_and_a_repeated_block_count():
    ctx = context(
        "import torch.nn as nn\n"
        "class Block(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
        "        self.norm = nn.BatchNorm1d(d)\n        self.fc = nn.Linear(d, d, bias=False)\n"
        "class Net(nn.Module):\n    def __init__(self, d=16, n=3):\n        super().__init__()\n"
        "        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])\n"
        "    def forward(self, x):\n        return x @ x.T\n"
        "net = Net()\n"
    )
    net = [name for name in ctx.index.find(cst.Name) if name.value == "net"][-1]
    size = sizes_of(ctx).module(net)
    assert size.parameters == 3 * (2 * 16 + 16 * 16)
    assert size.state == size.parameters + 3 * (2 * 16 + 1)  # running mean, variance, batches tracked
    assert size.products is None  # a `@` of unknown width


def test_the_thresholds_follow_from_the_hardware_table():
    assert MIN_COPY_BYTES == 1_250_000  # 10 launches x 5 us x 25 GB/s
    assert MIN_SAVE_BYTES == 20_000_000  # 20 ms x 1 GB/s
    assert memory_bound((20, 1)) and memory_bound((24, 10)) and not memory_bound((64, 64))


# -- the rules ------------------------------------------------------------------------------


def test_a_small_batch_in_a_loop_that_syncs_every_step_is_left_alone_a_large_one_is_fixed():
    every_step = MNIST.replace("BATCH", "1000").replace(
        "        if batch_idx % args.log_interval == 0:\n            print(loss.item())", "        print(loss.item())"
    )
    small = findings(every_step.replace("default=64", "default=256"), "PM101")  # 256 images: 800 KB
    assert small.findings == []
    large = findings(every_step.replace("default=64", "default=1000"), "PM101")  # 1000 images: 3.1 MB
    assert [f.line for f in large.findings] == [24, 24] and all(f.applied for f in large.findings)


def test_the_copies_of_a_test_pass_run_once_an_epoch_are_left_alone_whatever_their_size():
    """The test loop reads `.item()` every batch and runs once an epoch, outside the step
    loop: overlapping its copies saves at most a batch's launches, once an epoch."""
    for batch in ("256", "1000"):
        assert [f.line for f in findings(MNIST.replace("BATCH", batch), "PM101").findings] == [24, 24]


def test_prefetching_mnist_batches_is_reported_with_the_copy_time():
    (finding,) = findings(MNIST.replace("BATCH", "1000"), "PM103").findings
    assert finding.line == 23 and not finding.fixable
    assert "201 KB" in finding.message and "8 us" in finding.message and "ten kernel launches" in finding.message


def test_pinning_small_batches_read_back_every_step_is_reported():
    code = MNIST.replace("BATCH", "256").replace(', "pin_memory": True', "")
    result = findings(code, "PM102")
    assert [(f.line, f.fixable) for f in result.findings] == [(55, True), (56, False)]
    assert "`F.nll_loss" in result.findings[1].message and "805 KB" in result.findings[1].message


@pytest.mark.parametrize("width, out, fixed", [(20, 1, False), (4096, 4096, True)])
def test_the_tutorial_checkpoint_and_tf32(width, out, fixed):
    result = findings(tutorial(width, out), "PM302", "PM405")
    assert sorted((f.code, f.applied) for f in result.findings) == [("PM302", fixed), ("PM405", fixed)]
    if not fixed:
        save, tf32 = sorted(result.findings, key=lambda f: f.code, reverse=True)
        assert "84 bytes" in save.message and "20 ms" in save.message
        assert "20 by 1" in tf32.message and "12.5" in tf32.message


def test_a_small_save_made_every_step_is_still_fixed():
    code = tutorial(20, 1).replace(
        '                self._run_batch(source.to("cuda"), targets.to("cuda"))\n',
        '                self._run_batch(source.to("cuda"), targets.to("cuda"))\n'
        '                torch.save(self.model.state_dict(), "last.pt")\n',
    )
    result = findings(code, "PM405")
    assert {f.line: f.applied for f in result.findings} == {20: False, 26: True}


NET = (
    "import torch.nn as nn\n"
    "class Net(nn.Module):\n    def __init__(self, width=32):\n        super().__init__()\n"
    "        self.fc = nn.Linear(width, width)\n"
    "def main():\n    small = Net()\n    net = Net(width=WIDTH)\n    return net\n"
)


def module_of_net(code: str):
    ctx = context(code)
    net = [name for name in ctx.index.find(cst.Name) if name.value == "net"][-1]
    return sizes_of(ctx).module(net)


def test_each_construction_of_a_class_is_sized_by_what_it_passes():
    assert module_of_net(NET.replace("WIDTH", "64")).parameters == 64 * 64 + 64
    assert module_of_net(NET.replace("WIDTH", "16")).parameters == 16 * 16 + 16  # not the default of `Net()`
    # handed on or subclassed, the class may be built elsewhere with other sizes: not this construction
    assert module_of_net(NET.replace("WIDTH", "16") + "BUILDERS = {'net': Net}\n").parameters == 16 * 16 + 16
    assert module_of_net(NET.replace("WIDTH", "16") + "class Wide(Net):\n    pass\n").parameters == 16 * 16 + 16


def test_a_construction_whose_arguments_cannot_be_told_is_unsized():
    unpacked = NET.replace("def main():", "def main(dims):")
    assert module_of_net(unpacked.replace("Net(width=WIDTH)", "Net(*dims)")) is None
    assert module_of_net(unpacked.replace("Net(width=WIDTH)", "Net(**dims)")) is None


def test_widths_passed_through_the_files_own_classes_size_their_layers():
    # the blind corpus's sensor model: `SensorNet()` gives d=32 to `EMALayer(d)` and `TanhCell(d)`,
    # whose buffer is a `torch.linspace(..., d)`
    ctx = context(
        "import torch\nimport torch.nn as nn\n"
        "class EMALayer(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
        "        self.register_buffer('a', torch.linspace(0.5, 0.95, d))\n        self.inp = nn.Linear(d, d)\n"
        "class TanhCell(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
        "        self.wx = nn.Linear(d, d)\n        self.wh = nn.Linear(d, d, bias=False)\n"
        "class SensorNet(nn.Module):\n    def __init__(self, d=32, n_out=3):\n        super().__init__()\n"
        "        self.ema = EMALayer(d)\n        self.cell = TanhCell(d)\n        self.head = nn.Linear(d, n_out)\n"
        "net = SensorNet()\nwide = SensorNet(d=256)\n"
    )
    sizes = sizes_of(ctx)
    net, wide = (ctx.module.body[i].body[0].targets[0].target for i in (-2, -1))
    small = sizes.module(net)
    assert small.parameters == (32 * 32 + 32) + (32 * 32 + 32 + 32 * 32) + (32 * 3 + 3)
    assert small.state == small.parameters + 32  # the decays buffer
    assert max(small.products) == (32, 32)
    assert max(sizes.module(wide).products) == (256, 256)


@pytest.mark.parametrize("width, out, fixed", [(20, 1, False), (24, 64, False), (64, 64, True)])
def test_autocast_on_the_tutorial_model(width, out, fixed):
    (finding,) = findings(tutorial(width, out), "PM301").findings
    assert finding.applied == fixed
    if not fixed:
        assert "bound by memory" in finding.message and f"{width} by {out}" in finding.message


def test_autocast_of_a_small_convolutional_net_is_still_fixed():
    (finding,) = findings(MNIST.replace("BATCH", "1000").replace("(9216, 128)", "(9216, 8)"), "PM301").findings
    assert finding.applied


def test_a_model_class_of_another_module_of_the_project_is_sized_where_it_is_defined(tmp_path):
    (tmp_path / "model.py").write_text(
        "import torch.nn as nn\n\n\nclass Block(nn.Module):\n    def __init__(self, width):\n"
        "        super(Block, self).__init__()\n        self.fc = nn.Linear(width, width)\n\n\n"
        "class Net(nn.Module):\n    def __init__(self):\n        super(Net, self).__init__()\n"
        "        self.blocks = nn.Sequential(Block(16), Block(32))\n"
    )
    train = tmp_path / "train.py"
    train.write_text(
        "import torch\nfrom model import Net\n\nmodel = Net()\n"
        "for epoch in range(3):\n    torch.save(model.state_dict(), f'net_{epoch}.pt')\n"
    )
    ctx = FileContext.of_source(train.read_text(), str(train))
    # each Block is sized by what its construction passes; the `super(Block, self)` of its
    # own `__init__` hands the class on to nothing
    assert saves(ctx) == [4 * ((16 * 16 + 16) + (32 * 32 + 32))]


# -- shapes computed from other tensors (blind test 7, #6) ------------------------------------

SHAPES = """\
import torch
import torch.nn.functional as F
X = torch.randn(256, 12)
idx = torch.randint(0, 256, (8,))
device = torch.device("cuda")
"""


@pytest.mark.parametrize(
    "expr, shape, element",
    [
        ("X[:, :3]", (256, 3), 4),
        ("X[:, :3].sum(1, keepdim=True) + 0.1 * torch.randn(256, 1)", (256, 1), 4),
        ("X.sum(1, keepdim=True)", (256, 1), 4),
        ("torch.mean(X, dim=0)", (12,), 4),
        ("X.sum()", (), 4),
        ("X[0]", (12,), 4),
        ("X[10:20, -4:]", (10, 4), 4),
        ("X[..., None]", (256, 12, 1), 4),
        ("(X > 0).long()", (256, 12), 8),
        ("X.to(device)", (256, 12), 4),
        ("X.to(device, dtype=torch.float16)", (256, 12), 2),
        ("torch.zeros_like(X, dtype=torch.long)", (256, 12), 8),
        ("F.softmax(X, dim=1) * 2", (256, 12), 4),
        ("torch.cat([X, X[:, :4]], 1)", (256, 16), 4),
        ("torch.stack([X, X])", (2, 256, 12), 4),
        ("X.view(-1, 3)", (1024, 3), 4),
        ("X.unsqueeze(1)", (256, 1, 12), 4),
        ("X.T", (12, 256), 4),
        ("X.permute(1, 0).flatten()", (3072,), 4),
        ("X @ X.T", (256, 256), 4),
        ("torch.tanh(X @ torch.randn(12, 8))", (256, 8), 4),  # the blind corpus's `Y = tanh(X @ W_true)`
        ("X @ torch.randn(12)", (256,), 4),
        ("torch.randn(5, 1, 256, 12) @ torch.randn(3, 12, 2)", (5, 3, 256, 2), 4),
        ("torch.linspace(0.5, 0.95, 12)", (12,), 4),
        # the dtype an op gives whatever its operands' (torch_ops: `Op.result_dtype`)
        ("X.argmax(1)", (256,), 8),
        ("torch.argmax(X, dim=0, keepdim=True)", (1, 12), 8),
        ("X.eq(0)", (256, 12), 1),
        ("torch.isnan(X)", (256, 12), 1),
        ("torch.concatenate([X, X], 0)", (512, 12), 4),
        # the blind corpus's forecaster: windows of a series stacked, `x[i:i + 48]`
        ("torch.stack([X[i:i + 4] for i in range(10)])", (10, 4, 12), 4),
        ("torch.stack([X[i + 4:i + 6, 0] for i in range(10)])", (10, 2), 4),
        # rearrangements keep the shape whatever their shifts and dims (blind11's shifted targets)
        ("torch.roll(X, -1, dims=0)[:, :8]", (256, 8), 4),
        ("X.roll((1, 2), (0, 1))", (256, 12), 4),
        ("torch.flip(X.long(), [0])", (256, 12), 8),
        ("torch.maximum(X, torch.zeros(1, 12))", (256, 12), 4),
        ("X[idx]", (8, 12), 4),  # a gather by one int64 tensor: one row per index
        ("X[:, idx[:3]]", (256, 3), 4),
    ],
)
def test_the_shape_of_a_tensor_computed_from_tensors_of_known_shape(expr, shape, element):
    ctx = context(SHAPES + f"Y = {expr}\n")
    value = ctx.module.body[-1].body[0].value
    assert sizes_of(ctx).tensor(value) == (shape, element)


@pytest.mark.parametrize(
    "expr",
    [
        "X[idx, idx]",  # two gathers broadcast together: not followed
        "X[X > 0]",
        "X.sum(1, keepdim=flag)",
        "X @ X",
        "X.sum(dim)",
        "X.cumsum",
        "torch.stack([X[i] for i in ids])",
        "torch.where(X > 0)[0]",  # the indices of the elements that hold: as many as there are
    ],
)
def test_a_shape_that_depends_on_values_or_unknown_arguments_is_unknown(expr):
    ctx = context(SHAPES + f"Y = {expr}\n")
    assert sizes_of(ctx).tensor(ctx.module.body[-1].body[0].value) is None


UNLISTED_FUNCTIONS = [
    n for n in dir(torch) if not n.startswith("_") and f"torch.{n}" not in OPS and callable(getattr(torch, n))
]
UNLISTED_METHODS = [n for n in dir(torch.Tensor) if not n.startswith("_") and f"Tensor.{n}" not in OPS]


def test_no_function_or_method_the_torch_table_does_not_list_is_sized():
    """What the table does not list may make any shape (`torch.kron`, `x.repeat_interleave(3)`):
    its result is unknown, so no fix is let through or held back on a size perfmod made up."""
    assert len(UNLISTED_FUNCTIONS) > 300 and len(UNLISTED_METHODS) > 200
    calls = [f"torch.{n}(X, 2)" for n in UNLISTED_FUNCTIONS] + [f"X.{n}(2)" for n in UNLISTED_METHODS]
    ctx = context(SHAPES + "".join(f"Y = {call}\n" for call in calls))
    sizes = sizes_of(ctx)
    sized = [call for call, line in zip(calls, ctx.module.body[-len(calls) :]) if sizes.tensor(line.body[0].value)]
    assert sized == []


@pytest.mark.parametrize(
    "rebinding,shape",
    [
        ("if device.type == 'cuda':\n    X = X.pin_memory()\n", ((256, 12), 4)),
        ("if device.type == 'cuda':\n    X, W = X.pin_memory(), X.contiguous()\n", ((256, 12), 4)),
        ("if device.type == 'cuda':\n    X = X.detach().to(device)\n", ((256, 12), 4)),
        ("if device.type == 'cuda':\n    X = X[:10]\n", None),  # the branches disagree
        ("if device.type == 'cuda':\n    X = X.half()\n", None),  # another element size
    ],
)
def test_a_shape_through_a_conditional_rebinding_is_known_where_both_agree(rebinding, shape):
    """blind11: `if device.type == "cuda": X = X.pin_memory()` keeps the shape `X` had."""
    ctx = context(SHAPES + rebinding + "Y = X\n")
    assert sizes_of(ctx).tensor(ctx.module.body[-1].body[0].value) == shape


TINY = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = "cuda" if torch.cuda.is_available() else "cpu"
X = torch.randn(256, 12)
Y = TARGET
dl = DataLoader(TensorDataset(X, Y), batch_size=16)
net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
for epoch in range(2):
    for xb, yb in dl:
        xb = xb.to(device)
        yb = yb.to(device)
        loss = nn.functional.mse_loss(net(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
"""


@pytest.mark.parametrize(
    "target",
    ["torch.randn(256, 1)", "X[:, :3].sum(1, keepdim=True) + 0.1 * torch.randn(256, 1)", "X.sum(1, keepdim=True)"],
)
def test_tiny_batches_with_a_derived_target_are_held_back(target):
    result = findings(TINY.replace("TARGET", target), "PM102", "PM103")
    assert sorted((f.code, f.fixable) for f in result.findings) == [("PM102", False), ("PM103", False)]
    assert all("832 bytes" in f.message for f in result.findings)  # 16 x (12 + 1) floats


# -- optimizer state in a checkpoint ----------------------------------------------------------

CKPT = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
opt = OPTIMIZER
X = torch.randn(128, 20)
Y = torch.randint(0, 4, (128,))
for epoch in range(3):
    for step in range(4):
        xb, yb = X[step * 32:(step + 1) * 32], Y[step * 32:(step + 1) * 32]
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"epoch{epoch}.pt")
"""
MLP = 20 * 64 + 64 + 64 * 4 + 4  # 1604 parameters


@pytest.mark.parametrize(
    "optimizer, states",
    [
        ("torch.optim.SGD(model.parameters(), lr=0.1)", 0),
        ("torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)", 1),
        ("torch.optim.Adam(model.parameters(), lr=0.1)", 2),
        ("torch.optim.AdamW(model.parameters(), amsgrad=True)", 3),
        ("torch.optim.RMSprop(model.parameters(), momentum=0.9, centered=True)", 3),
        ("torch.optim.Adagrad(model.parameters())", 1),
    ],
)
def test_an_optimizers_state_over_a_sized_model_is_sized(optimizer, states):
    ctx = context(CKPT.replace("OPTIMIZER", optimizer))
    assert saves(ctx) == [4 * MLP * (1 + states)]


def test_an_optimizer_whose_state_perfmod_does_not_know_leaves_the_checkpoint_unsized():
    assert saves(context(CKPT.replace("OPTIMIZER", "torch.optim.LBFGS(model.parameters())"))) == [None]


def test_a_small_per_epoch_checkpoint_with_optimizer_state_is_reported():
    (finding,) = findings(CKPT.replace("OPTIMIZER", "torch.optim.Adam(model.parameters())"), "PM405").findings
    assert not finding.fixable and "19 KB" in finding.message and "the state their optimizer keeps" in finding.message


def test_the_optimizer_state_table_is_torchs():
    torch = pytest.importorskip("torch")
    from codemod.analysis.torch_facts import OPTIMIZER_STATES

    for name, (always, options) in OPTIMIZER_STATES.items():
        for on in ((), *((option,) for option in options)):
            model = torch.nn.Linear(3, 2)
            flags = {option: (0.9 if option == "momentum" else True) for option in on}
            optimizer = getattr(torch.optim, name.rsplit(".", 1)[1])(model.parameters(), lr=0.01, **flags)
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
            state = optimizer.state[model.weight]
            shaped = [v for v in state.values() if isinstance(v, torch.Tensor) and v.shape == model.weight.shape]
            assert len(shaped) == always + len(on), (name, on)


def test_a_small_checkpoint_read_right_back_gives_the_read_as_its_reason():
    code = CKPT.replace("OPTIMIZER", "torch.optim.SGD(model.parameters(), lr=0.1)").replace(
        '    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"epoch{epoch}.pt")\n',
        '    path = f"epoch{epoch}.pt"\n    torch.save(model.state_dict(), path)\n    snap = torch.load(path)\n',
    )
    (finding,) = findings(code, "PM405").findings
    assert not finding.fixable and "the file is used at line 18" in finding.message


def test_a_whole_model_of_a_class_from_another_module_is_not_saved_in_the_background(tmp_path):
    # pytorch/examples super_resolution, cut down: `torch.save(model, path)` in a helper
    # the epoch loop calls, the model's class imported from the project's model.py
    (tmp_path / "model.py").write_text(
        "import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self, factor):\n"
        "        super().__init__()\n        self.conv = nn.Conv2d(1, factor**2, 3, 1, 1)\n"
    )
    train = tmp_path / "main.py"
    train.write_text(
        "import torch\nimport torch.nn.functional as F\nfrom model import Net\n\n"
        'device = torch.device("cuda")\nmodel = Net(3).to(device)\n'
        "optimizer = torch.optim.Adam(model.parameters())\n\n\n"
        "def train(epoch):\n    for _ in range(10):\n        x = torch.randn(4, 1, 8, 8, device=device)\n"
        "        loss = F.mse_loss(model(x), x.repeat(1, 9, 1, 1))\n        optimizer.zero_grad()\n"
        "        loss.backward()\n        optimizer.step()\n\n\n"
        'def checkpoint(epoch):\n    torch.save(model, f"model_epoch_{epoch}.pth")\n\n\n'
        "for epoch in range(3):\n    train(epoch)\n    checkpoint(epoch)\n"
    )
    result = process_source(train.read_bytes(), str(train), Settings(select=("PM405",), level=Level.UNSAFE))
    (finding,) = result.findings
    assert not finding.fixable and "`model` is a whole module" in finding.message


def test_what_the_torchrun_fix_writes_is_sized_as_what_it_replaced():
    ctx = context(
        "import torch.nn as nn\nfrom runtime import distributed\n"
        "net = nn.Linear(8, 8)\nshare = distributed.local_batch_size(64)\n"
        "inner = distributed.unwrap(net)\n"
    )
    sizes = sizes_of(ctx)
    share, inner = (ctx.module.body[i].body[0].value for i in (3, 4))
    assert sizes.integer(share) == 64  # a process's share of 64: at most 64
    assert sizes.module(inner).parameters == 8 * 8 + 8


def test_the_tiny_helper_checkpoint_of_the_wild_step_tests_is_reported():
    code = (
        "import os\nimport torch\nimport torch.nn as nn\n"
        "model = nn.Linear(4, 2)\nopt = torch.optim.Adam(model.parameters(), lr=0.1)\n"
        "def save_checkpoint(model, optimizer, epoch, path):\n"
        '    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)\n'
        "for epoch in range(3):\n    for x in [torch.randn(8, 4)]:\n        loss = model(x).pow(2).mean()\n"
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
        '    save_checkpoint(model, opt, epoch, f"epoch_{epoch}.pt")\n'
    )
    (finding,) = findings(code, "PM405").findings
    assert not finding.fixable and "120 bytes" in finding.message  # (4 x 2 + 2) x (1 + 2) floats


# -- copies made only every few steps, the host waiting right after (makemore, minGPT's adder) --

EVALUATED = """\
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Names(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        return torch.randint(0, 27, (16,)), torch.randint(0, 27, (16,))


@torch.inference_mode()
def evaluate(model, dataset, max_batches=None):
    loader = DataLoader(dataset, shuffle=True, batch_size=100, num_workers=0)
    losses = []
    for i, (x, y) in enumerate(loader):
        x, y = x.to("cuda"), y.to("cuda")
        loss = F.cross_entropy(model(x).transpose(1, 2), y)
        READ
        if max_batches is not None and i >= max_batches:
            break
    return losses


model = torch.nn.Sequential(torch.nn.Embedding(27, 64), torch.nn.Linear(64, 27)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
train = DataLoader(Names(), batch_size=32, shuffle=True, pin_memory=True)
for step, (x, y) in enumerate(train):
    x, y = x.to("cuda"), y.to("cuda")
    loss = F.cross_entropy(model(x).transpose(1, 2), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step > 0 and step % 500 == 0:
        evaluate(model, Names(), max_batches=10)
"""


def test_an_evaluation_every_few_steps_that_reads_every_batch_is_neither_pinned_nor_overlapped():
    result = findings(EVALUATED.replace("READ", "losses.append(loss.item())"), "PM101", "PM102")
    by_line = {(f.line, f.code): f for f in result.findings}
    assert {key: f.applied for key, f in by_line.items()} == {(16, "PM102"): False, (31, "PM101"): True}
    reason = by_line[16, "PM102"].message
    assert "`step > 0 and step % 500 == 0` holds (line 36)" in reason and "`loss.item()` (line 21)" in reason


def test_an_evaluation_that_does_not_wait_every_batch_or_runs_every_step_is_still_fixed():
    kept = EVALUATED.replace("READ", "losses.append(loss.detach())")
    every_step = EVALUATED.replace("READ", "losses.append(loss.item())").replace(
        "    if step > 0 and step % 500 == 0:\n        evaluate", "    evaluate"
    )
    for code in (kept, every_step):
        fixed = {(f.line, f.code) for f in findings(code, "PM101", "PM102").findings if f.applied}
        assert {(16, "PM102"), (19, "PM101"), (31, "PM101")} <= fixed


def test_a_validation_batch_copied_every_few_steps_and_read_right_after_is_not_overlapped():
    # x-transformers' enwik8: `val_seq = next(val_loader).to(device)` under `if divisible_by(i, every):`
    code = EVALUATED.replace("READ", "losses.append(loss.item())").replace(
        "        evaluate(model, Names(), max_batches=10)\n",
        "        with torch.no_grad():\n            vx, vy = next(iter(train))\n"
        "            vx = vx.to('cuda')\n            print(model(vx).sum().item())\n",
    )
    copies = {f.line for f in findings(code, "PM101").findings if f.applied}
    assert 39 not in copies and 31 in copies


ACCURACY = """\
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Texts(Dataset):
    def __init__(self, length):
        self.length = length

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        return torch.randint(0, 50, (self.length,)), torch.randint(0, 2, ())


def accuracy(model, loader):
    correct = 0
    for x, y in loader:
        x, y = x.to("cuda"), y.to("cuda")
        READ
    return correct


def train(model, optimizer, train_loader, test_loader, epochs):
    for epoch in range(epochs):
        for x, y in train_loader:
            x, y = x.to("cuda"), y.to("cuda")
            loss = F.cross_entropy(model(x)[:, -1], y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(epoch, accuracy(model, train_loader))
    print(accuracy(model, test_loader))


model = torch.nn.Sequential(torch.nn.Embedding(50, 64), torch.nn.Linear(64, 2)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
length = int(input())
train_loader = DataLoader(Texts(length), batch_size=8)
test_loader = DataLoader(Texts(length), batch_size=8)
train(model, optimizer, train_loader, test_loader, 3)
"""


def test_an_accuracy_pass_after_each_epoch_that_reads_every_batch_is_neither_pinned_nor_overlapped():
    # LLMs-from-scratch ch06: `calc_accuracy_loader` after each epoch and after training, of
    # token batches whose length the data sets, reading `.item()` every batch
    read = "correct += (model(x)[:, -1].argmax(-1) == y).sum().item()"
    result = findings(ACCURACY.replace("READ", read), "PM101", "PM102")
    by_line = {(f.line, f.code): f for f in result.findings}
    # The training loader's copies run in the step loop: pinned, then overlapped. The test
    # loader's are made only by the accuracy pass: reported, not pinned; that copy is left alone.
    assert {key: f.applied for key, f in by_line.items()} == {
        (28, "PM101"): True,
        (40, "PM102"): True,
        (41, "PM102"): False,
    }
    assert "only outside the step loops, in a loop that trains nothing (line 19)" in by_line[41, "PM102"].message
    assert "`(model(x)[:, -1].argmax(-1) == y).sum().item()` (line 21)" in by_line[41, "PM102"].message


def test_an_accuracy_pass_that_does_not_wait_every_batch_or_runs_in_the_step_is_still_fixed():
    kept = ACCURACY.replace("READ", "correct += (model(x)[:, -1].argmax(-1) == y).sum()")
    read = "correct += (model(x)[:, -1].argmax(-1) == y).sum().item()"
    every_step = ACCURACY.replace("READ", read).replace(
        "            optimizer.step()\n", "            optimizer.step()\n            accuracy(model, test_loader)\n"
    )
    for code in (kept, every_step):
        fixed = {(f.line, f.code) for f in findings(code, "PM101", "PM102").findings if f.applied}
        assert (20, "PM101") in fixed


SHARED_COPY = """\
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def loss_of(model, x, y):
    x, y = x.to("cuda"), y.to("cuda")
    return F.cross_entropy(model(x), y)


def evaluate(model, loader):
    total = 0.0
    for x, y in loader:
        total += loss_of(model, x, y).item()
    return total


model = torch.nn.Linear(16, 2).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
train_loader = DataLoader(TensorDataset(torch.randn(LENGTH, 16), torch.randint(0, 2, (LENGTH,))), batch_size=8)
val_loader = DataLoader(TensorDataset(torch.randn(LENGTH, 16), torch.randint(0, 2, (LENGTH,))), batch_size=8)
for epoch in range(3):
    for step, (x, y) in enumerate(train_loader):
        loss = loss_of(model, x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print(evaluate(model, val_loader))
    for x, y in val_loader:
        x = x.to("cuda")
        print(model(x).argmax(-1).tolist())
"""


def test_a_loader_whose_batches_a_shared_helper_copies_only_in_evaluations_is_not_pinned():
    """`loss_of` copies the batches of both loaders; the validation loader's reach it only in
    an evaluation every 100 steps, and in an inline pass after each epoch, both reading
    every batch: it is reported, and the training loader is pinned."""
    code = SHARED_COPY.replace("LENGTH", "int(input())")
    by_line = {(f.line, f.code): f for f in findings(code, "PM102").findings}
    assert {key: f.applied for key, f in by_line.items()} == {(20, "PM102"): True, (21, "PM102"): False}
    message = by_line[21, "PM102"].message
    assert (
        "only when `step % 100 == 0` holds (line 28) and outside the step loops, in a loop that trains nothing (line 30)"
        in message
    )
    assert "`loss_of(model, x, y).item()` (line 14) and `model(x).argmax(-1).tolist()` (line 32)" in message


# -- the blind corpus's noisy fixes: what the sizes did not know --------------------------------

SPANS = """\
import math

import torch
from torch.utils.data import DataLoader, Dataset


class SpanDataset(Dataset):
    def __init__(self, n=48, seq=32, vocab=200):
        self.ids = torch.randint(1, vocab, (n, seq))
        self.start = torch.randint(0, seq, (n,))

    def __len__(self):
        return self.ids.size(0)

    def __getitem__(self, i):
        return ITEM


loader = DataLoader(SpanDataset(seq=SEQ), batch_size=4)
"""


@pytest.mark.parametrize(
    "item, seq, size",
    [
        ("self.ids[i], self.start[i]", "32", 4 * (32 * 8 + 8)),
        ('{"ids": self.ids[i], "start": self.start[i]}', "64", 4 * (64 * 8 + 8)),
        ("self.ids[i].float()", "16", 4 * 16 * 4),
        # the blind corpus's keyword spotter: a gain from `math.cos(i)`, a dict item
        ('{"audio": (0.5 + math.cos(i)) * self.ids[i].float(), "label": self.start[i]}', "16", 4 * (16 * 4 + 8)),
        ("self.ids[i] + noise(i)", "32", None),  # a function of the file perfmod does not shape
        # a 0-d int64 tensor picks one row as an int does (a gather, of the same shape)
        ("self.ids[self.start[i]]", "32", 4 * 32 * 8),
        ("self.ids[self.start[i : i + 2]]", "32", 4 * 2 * 32 * 8),  # a gather by a 1-d tensor: a row per index
    ],
)
def test_a_dataset_class_of_the_file_is_sized_by_what_its_getitem_returns(item, seq, size):
    ctx = context(SPANS.replace("ITEM", item).replace("SEQ", seq))
    loader = ctx.module.body[-1].body[0].value
    assert sizes_of(ctx).loader_batch_bytes(loader) == size


PAIRS = """\
import torch
from torch.utils.data import DataLoader, Dataset


class PairDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]
GROWN
"""
LOADER = "loader = DataLoader(PairDataset(2048), batch_size=32)\n"


def test_an_item_of_a_list_a_comprehension_builds_is_sized_unless_a_method_grows_the_list():
    # the DDP tutorial's MyTrainDataset: 32 items of 20 + 1 float32
    ctx = context(PAIRS.replace("GROWN", "") + "\n" + LOADER)
    assert sizes_of(ctx).loader_batch_bytes(ctx.module.body[-1].body[0].value) == 32 * 21 * 4
    grown = "\n    def add(self, x):\n        self.data.append((x, x))\n"
    ctx = context(PAIRS.replace("GROWN", grown) + "\n" + LOADER)
    assert sizes_of(ctx).loader_batch_bytes(ctx.module.body[-1].body[0].value) is None


def test_a_dataset_class_of_another_module_of_the_project_is_sized_where_it_is_defined(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "datautils.py").write_text(PAIRS.replace("GROWN", ""))
    code = "from torch.utils.data import DataLoader\nfrom datautils import PairDataset\n" + LOADER
    (tmp_path / "train.py").write_text(code)
    ctx = FileContext.of_source(code, str(tmp_path / "train.py"), Settings(root=tmp_path))
    assert sizes_of(ctx).loader_batch_bytes(ctx.module.body[-1].body[0].value) == 32 * 21 * 4
    # an item that depends on what the construction passes is sized by what it passes there
    (tmp_path / "datautils.py").write_text(PAIRS.replace("GROWN", "").replace("torch.rand(20)", "torch.rand(size)"))
    ctx = FileContext.of_source(code, str(tmp_path / "train.py"), Settings(root=tmp_path))
    assert sizes_of(ctx).loader_batch_bytes(ctx.module.body[-1].body[0].value) == 32 * (2048 + 1) * 4
    # and stays unsized where that argument cannot be told
    unknown = code.replace("PairDataset(2048)", "PairDataset(int(input()))")
    ctx = FileContext.of_source(unknown, str(tmp_path / "train.py"), Settings(root=tmp_path))
    assert sizes_of(ctx).loader_batch_bytes(ctx.module.body[-1].body[0].value) is None


def test_an_embedding_bag_and_the_length_of_a_list_literal_are_sized():
    ctx = context(
        'import torch.nn as nn\nVOCAB = ["good", "bad", "fine"]\n'
        "emb = nn.EmbeddingBag(len(VOCAB) + 2, 32)\nhead = nn.Linear(32, 2)\n"
    )
    sizes = sizes_of(ctx)
    emb, head = (ctx.module.body[i].body[0].targets[0].target for i in (2, 3))
    assert sizes.module(emb) == ModuleSize(5 * 32, 5 * 32, ())  # a lookup: no matrix product
    assert sizes.module(head).products == ((32, 2),)
    grown = context(
        'import torch.nn as nn\nVOCAB = ["good", "bad", "fine"]\nVOCAB.append("meh")\n'
        "emb = nn.EmbeddingBag(len(VOCAB) + 2, 32)\n"
    )
    assert sizes_of(grown).module(grown.module.body[-1].body[0].targets[0].target) is None


def test_narrow_products_stay_reported_after_the_torchrun_rewrite_wraps_the_model():
    # the blind corpus's tiny tabular regression: after PM601 the step runs `distributed.print0`
    # and `distributed.all_reduce_mean`, which multiply no matrices, and the model is wrapped
    code = (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        'device = "cuda"\nX = torch.randn(256, 12)\nY = X[:, :3].sum(1, keepdim=True)\n'
        "dl = DataLoader(TensorDataset(X, Y), batch_size=16)\n"
        "net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.05)\ncrit = nn.MSELoss()\n"
        "for epoch in range(2):\n    for xb, yb in dl:\n        xb, yb = xb.to(device), yb.to(device)\n"
        "        loss = crit(net(xb), yb)\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
        '        print(f"loss {loss.item():.4f}")\n'
    )
    result = findings(code, "PM301", "PM302", "PM601")
    assert any(f.code == "PM601" and f.applied for f in result.findings)
    assert "DistributedDataParallel(net" in result.new_source.decode()
    held = {f.code: f for f in result.findings if f.code in ("PM301", "PM302")}
    assert set(held) == {"PM301", "PM302"} and not any(f.applied for f in held.values())
    assert all("12 by 32" in f.message for f in held.values())


def test_narrow_products_stay_reported_after_the_time_loop_becomes_a_scan():
    """The blind round's discounted returns: after PM505 the step calls the runtime's
    `linear_recurrence`, an elementwise scan, and the model's products are as narrow as
    before; `linear_attention` multiplies matrices of its own, whose width is not known."""
    code = (
        "import torch\nimport torch.nn as nn\n"
        'device = "cuda"\nnet = nn.Linear(6, 64).to(device)\nopt = torch.optim.SGD(net.parameters(), lr=0.05)\n'
        "for it in range(10):\n    rewards = net(torch.randn(16, 32, 6, device=device)).mean(-1)\n"
        "    running = torch.zeros(16, device=device)\n    returns = torch.zeros(16, 32, device=device)\n"
        "    for t in reversed(range(32)):\n        running = rewards[:, t] + 0.97 * running\n"
        "        returns[:, t] = running\n"
        "    loss = returns.mean()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    result = findings(code, "PM302", "PM505")
    assert "linear_recurrence(" in result.new_source.decode()
    held = [f for f in result.findings if f.code == "PM302"]
    assert len(held) == 1 and not held[0].applied and "6 by 64" in held[0].message, held
    attention = context(
        "import torch\nfrom runtime.kernels import linear_attention\nnet = torch.nn.Linear(6, 64)\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.05)\nfor it in range(3):\n"
        "    h = net(torch.randn(2, 4, 6))\n    o, s = linear_attention(h, h, h, 0.9)\n"
        "    loss = o.mean()\n    loss.backward()\n    opt.step()\n"
    )
    loop = next(iter(attention.index.find(cst.For, within=attention.module)))
    assert sizes_of(attention).step_products(loop) is None


@pytest.mark.parametrize(
    ("tensors", "batch_size", "expected"),
    [
        ("X = torch.randn(96, 10)\nY = (X[:, 0] > 0).long()\n", "bs = 12\n", 12 * (10 * 4 + 8)),
        ("X = torch.randn(96, 3, 32, 32)\nY = torch.randint(0, 9, (96,))\n", "bs = 64\n", 64 * (3 * 32 * 32 * 4 + 8)),
        ("X = torch.load('x.pt')\nY = torch.randint(0, 9, (96,))\n", "bs = 64\n", None),  # rows of unknown size
        ("X = torch.randn(96, 10)\nY = torch.randn(96, 1)\n", "import os\nbs = int(os.environ['BS'])\n", None),
    ],
)
def test_the_bytes_of_a_batch_of_rows_of_tensors(tensors, batch_size, expected):
    ctx = context("import torch\n" + tensors + batch_size + "print(X, Y, bs)\n")
    printed = next(c for c in ctx.index.find(cst.Call) if ctx.source(c) == "print(X, Y, bs)")
    x, y, bs = (arg.value for arg in printed.args)
    assert sizes_of(ctx).rows_batch_bytes([x, y], bs) == expected


def test_a_transposed_convolution_built_with_every_positional_argument_is_sized_as_torch_builds_it():
    # ConvTranspose's fifth argument is `output_padding` and its ninth `dilation` (not Conv's order)
    arguments = (4, 8, 3, 2, 1, 1, 2, False, 2)
    code = f"import torch.nn as nn\nnet = nn.ConvTranspose2d{arguments}\n"
    built = torch.nn.ConvTranspose2d(*arguments)
    assert module_of_net(code).parameters == sum(parameter.numel() for parameter in built.parameters())


def test_a_read_under_an_if_whose_other_branch_breaks_runs_on_every_pass_that_goes_on():
    source = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda")
model = torch.nn.Linear(8, 2).to(device)
loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8, pin_memory=True)


def accuracy(loader, num_batches):
    correct = 0
    for i, (x, y) in enumerate(loader):
        if i < num_batches:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(-1) == y).sum().item()
        else:
            break
    return correct


print(accuracy(loader, 4))
"""
    ctx = context(source)
    sizes = sizes_of(ctx)
    (feed,) = ctx.loaders.feeds
    assert ctx.source(sizes.sync_every_step(feed.loop)) == "(model(x).argmax(-1) == y).sum().item()"
    for other in ("        else:\n            continue\n", "        elif i > 100:\n            break\n"):
        ctx = context(source.replace("        else:\n            break\n", other))
        (feed,) = ctx.loaders.feeds
        assert sizes_of(ctx).sync_every_step(feed.loop) is None, other
    assert findings(source, "PM101").findings == []  # a small batch, read back on every pass
    passes = findings(source.replace("            break\n", "            continue\n"), "PM101").findings
    assert [(f.line, f.applied) for f in passes] == [(13, True), (13, True)]


def test_a_copy_in_a_helper_is_fed_by_the_loops_around_each_call_of_it():
    source = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda")
model = torch.nn.Linear(8, 2).to(device)
data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
loader = DataLoader(data, batch_size=8, pin_memory=True)


def loss_of(x, y):
    x, y = x.to(device), y.to(device)
    return torch.nn.functional.cross_entropy(model(x), y)


def evaluate():
    total = 0.0
    for x, y in loader:
        total += loss_of(x, y).item()
    return total
"""
    ctx = context(source)
    (copy,) = [call for call in ctx.index.find(cst.Call) if ctx.source(call.func) == "x.to"]
    fed = sizes_of(ctx).feeding_batch_bytes(copy)
    assert fed is not None and fed[0] == 8 * (8 * 4 + 8) and [ctx.line(loop) for loop in fed[1]] == [17]
    assert findings(source, "PM101").findings == []  # 320-byte batches, read back on every pass
    training = source + (
        "\n\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x, y in loader:\n"
        "    loss = loss_of(x, y)\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    assert [(f.line, f.applied) for f in findings(training, "PM101").findings] == [(11, True), (11, True)]


def test_the_tensors_a_starred_call_gives_a_tensor_dataset_are_its_rows():
    source = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_data(n, features):
    x = torch.randn(n, features)
    y = torch.randn(n, 1)
    return x, y


loader = DataLoader(TensorDataset(*make_data(4096, 32)), batch_size=256)
"""
    ctx = context(source)
    (loader,) = [call for call in ctx.index.find(cst.Call) if ctx.source(call.func) == "DataLoader"]
    assert sizes_of(ctx).loader_batch_bytes(loader) == 256 * (32 + 1) * 4
    for unknown in ("return x, y, *rest", "return [x] + [y]"):
        ctx = context(source.replace("return x, y", unknown))
        (loader,) = [call for call in ctx.index.find(cst.Call) if ctx.source(call.func) == "DataLoader"]
        assert sizes_of(ctx).loader_batch_bytes(loader) is None, unknown


BLOBS = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_blobs(n, d_in, classes):
    centers = torch.randn(classes, d_in) * 0.7
    y = torch.randint(0, classes, (n,))
    return centers[y] + torch.randn(n, d_in), y


device = torch.device("cuda")
X, Y = make_blobs(1024, 20, 5)
loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True, pin_memory=True)
model = torch.nn.Linear(20, 5).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data_iter = iter(loader)
for step in range(100):
    try:
        xb, yb = next(data_iter)
    except StopIteration:
        data_iter = iter(loader)
        xb, yb = next(data_iter)
    xb, yb = xb.to(device), yb.to(device)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_rows_gathered_by_a_tensor_of_indices_and_a_small_batch_taken_with_next_is_not_worth_prefetching():
    ctx = context(BLOBS)
    (loader,) = [call for call in ctx.index.find(cst.Call) if ctx.source(call.func) == "DataLoader"]
    assert sizes_of(ctx).loader_batch_bytes(loader) == 32 * (20 * 4 + 8)  # `centers[y]`: one row per label
    (found,) = findings(BLOBS, "PM103").findings
    assert not found.applied and "not rewritten: a batch holds about 2816 bytes" in found.message
    assert "DevicePrefetcher" not in found.message
    for other in ("centers[y, y]", "centers[[0, 1]]"):  # two gathers, a list: not followed
        ctx = context(BLOBS.replace("centers[y]", other))
        (loader,) = [call for call in ctx.index.find(cst.Call) if ctx.source(call.func) == "DataLoader"]
        assert sizes_of(ctx).loader_batch_bytes(loader) is None, other


def test_layers_a_helper_returns_in_a_list_and_a_width_from_a_shape_product():
    # the GAN zoo's generator: `*block(in, out)` adds the list a nested helper builds and
    # appends to, each call sized by what it passes; `int(np.prod(img_shape))` the flat image
    net = module_of_net(
        "import numpy as np\nimport torch.nn as nn\nimg_shape = (1, 28, 28)\n"
        "class Generator(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        def block(in_feat, out_feat, normalize=True):\n"
        "            layers = [nn.Linear(in_feat, out_feat)]\n"
        "            if normalize:\n                layers.append(nn.BatchNorm1d(out_feat, 0.8))\n"
        "            layers.append(nn.LeakyReLU(0.2, inplace=True))\n            return layers\n"
        "        self.model = nn.Sequential(\n            *block(100, 128, normalize=False),\n"
        "            *block(128, 256),\n            nn.Linear(256, int(np.prod(img_shape))),\n        )\n"
        "net = Generator()\n"
    )
    assert net.products == ((100, 128), (128, 256), (256, 784))
    # (a BatchNorm1d after each block, as the helper may append it: an upper bound)
    assert net.parameters == 100 * 128 + 128 + 128 * 2 + 128 * 256 + 256 + 256 * 2 + 256 * 784 + 784


def test_a_difference_by_a_known_value_and_math_constants_size_a_data_set():
    # blind13's two moons: `n - half` rows, where `half = n // 2` has one value, and `math.pi * rand(...)`
    ctx = context(
        "import math\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "def two_moons(n):\n    half = n // 2\n"
        "    a = math.pi * torch.rand(half)\n    b = math.pi * torch.rand(n - half)\n"
        "    upper = torch.stack([a.cos(), a.sin()], dim=1)\n    lower = torch.stack([1 - b.cos(), 0.5 - b.sin()], dim=1)\n"
        "    return torch.cat([upper, lower]) + 0.05 * torch.randn(n, 2)\n"
        "loader = DataLoader(TensorDataset(two_moons(768)), batch_size=128)\n"
    )
    (loader,) = [c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "DataLoader"]
    assert sizes_of(ctx).loader_batch_bytes(loader) == 128 * 2 * 4
    (rows,) = [c for c in ctx.index.find(cst.Call) if ctx.source(c) == "torch.cat([upper, lower])"]
    assert sizes_of(ctx).tensor(rows) == ((768, 2), 4)
    # `n - k` where `k` may be one of several values bounds nothing
    varied = context("import sys\nk = 2 if len(sys.argv) > 1 else 3\nn = 10 - k\n")
    (n,) = [a.targets[0].target for a in varied.index.find(cst.Assign) if varied.source(a.targets[0].target) == "n"]
    assert sizes_of(varied).integer(n) is None


@pytest.mark.parametrize(
    ("read", "found"),
    [
        ('print(f"loss {loss:.2f}")', "{loss:.2f}"),  # Tensor.__format__ reads the value
        ('print(f"loss {loss}")', "{loss}"),
        ("print(loss)", "print(loss)"),
        ("print(float(loss))", "float(loss)"),
        ('print(f"step {step}")', None),  # a number, no tensor
        ('print(f"{x.shape[0]} rows")', None),
        ('print(f"{x_host.sum()}")', None),  # a host tensor: no wait for the device
        ('if step % 10 == 0:\n        print(f"{loss:.2f}")', None),  # not every pass
    ],
)
def test_a_tensor_formatted_or_printed_every_step_is_a_read_to_the_host(read, found):
    source = f"""\
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda")
model = torch.nn.Linear(8, 2).to(device)
loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8, pin_memory=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x_host, y) in enumerate(loader):
    x, y = x_host.to(device), y.to(device)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    {read}
"""
    ctx = context(source)
    (feed,) = ctx.loaders.feeds
    sync = sizes_of(ctx).sync_every_step(feed.loop)
    assert (ctx.source(sync) if sync is not None else None) == found
    assert (findings(source, "PM101").findings == []) is (found is not None)  # a small batch, waited for anyway

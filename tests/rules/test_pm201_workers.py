"""PM201, run: the rewritten scripts train bit for bit like the originals with two
worker processes (PERFMOD_NUM_WORKERS=2, the count CI's two cores allow), and the
claims of the rule's `## Fix safety` hold for torch 2.13."""

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.single_process_loader_in_training_loop import SingleProcessLoaderInTrainingLoop
from runtime import data
from tests.rules.scripts import losses, one_thread

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM201"


@pytest.fixture
def two_workers(monkeypatch):
    """PERFMOD_NUM_WORKERS=2, and a count of the worker-backed iterators started."""
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "2")
    started = []
    original = _MultiProcessingDataLoaderIter.__init__

    def counting(self, loader):
        started.append(loader.num_workers)
        original(self, loader)

    monkeypatch.setattr(_MultiProcessingDataLoaderIter, "__init__", counting)
    return started


def test_rewritten_script_trains_bit_for_bit_like_the_original_with_two_workers(two_workers):
    before = losses((FIXTURES / "helper_and_kwargs.in.py").read_text())
    assert two_workers == []
    after = losses((FIXTURES / "helper_and_kwargs.out.py").read_text())
    assert two_workers == [2, 2]  # both loaders loaded in workers
    assert len(before) == 6 + 4  # 6 steps over the helper's loader, 4 over the kwargs one
    assert torch.equal(after, before)


def test_without_workers_the_rewrite_is_the_original(monkeypatch):
    """One core (or PERFMOD_NUM_WORKERS=0): no workers, and persistent_workers is False
    rather than the True that would raise."""
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "0")
    before = losses((FIXTURES / "helper_and_kwargs.in.py").read_text())
    assert torch.equal(losses((FIXTURES / "helper_and_kwargs.out.py").read_text()), before)


def test_persistent_workers_true_with_no_workers_raises():
    """Why the fix writes `persistent_workers=num_workers > 0`, not True."""
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0"):
        DataLoader(TensorDataset(torch.arange(4)), num_workers=0, persistent_workers=True)


def test_prefetch_factor_with_no_workers_raises():
    """Why the fix leaves prefetch_factor at torch's default."""
    with pytest.raises(ValueError, match="prefetch_factor option could only be specified in multiprocessing"):
        DataLoader(TensorDataset(torch.arange(4)), num_workers=0, prefetch_factor=2)


class Noisy(torch.utils.data.Dataset):
    """A random augmentation: noise drawn from the generator of the process that loads."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return i + torch.rand(())


def test_random_augmentation_differs_in_workers():
    """The Fix safety's first case: workers seed their own generators, so random
    transforms give other values than in the training process (and leave its generator alone)."""

    def values(**options):
        torch.manual_seed(0)
        batches = torch.cat(list(DataLoader(Noisy(), batch_size=4, **options)))
        return batches, torch.rand(())

    (plain, after_plain), (workers, after_workers) = values(), values(num_workers=2, timeout=60)
    assert torch.equal(plain.floor(), workers.floor())  # the same items, in order
    assert not torch.equal(plain, workers)
    assert not torch.equal(after_plain, after_workers)  # the training process's generator moved on less


def epoch_orders(epochs: int, **loader_options) -> list[list[int]]:
    """The sample order of each epoch of a shuffling loader, global seed 0, and a draw of the
    global generator after each epoch, as dropout in the step would make."""
    torch.manual_seed(0)
    if loader_options.get("num_workers"):
        loader_options["timeout"] = 60  # a stuck worker fails the test instead of hanging it
    loader = DataLoader(TensorDataset(torch.arange(24)), batch_size=4, shuffle=True, **loader_options)
    orders = []
    with one_thread():
        for _ in range(epochs):
            orders.append([int(i) for (batch,) in loader for i in batch])
            orders[-1].append(int(torch.randint(0, 1 << 30, ())))
    return orders


def test_workers_keep_the_order_and_values_of_every_epoch():
    """Map-style data, non-persistent workers: the sampler and the base seed are drawn in
    the training process as without workers, epoch after epoch."""
    assert epoch_orders(3, num_workers=2) == epoch_orders(3)


def test_persistent_workers_shift_the_global_generator_from_the_second_epoch():
    """A persistent iterator draws its base seed once, not per epoch: epoch 1 is the same,
    later epochs shuffle differently (and dropout differs), as the Fix safety says."""
    plain, persistent = epoch_orders(3), epoch_orders(3, num_workers=2, persistent_workers=True)
    assert persistent[0] == plain[0]
    assert persistent[1] != plain[1] and sorted(persistent[1][:-1]) == sorted(plain[1][:-1])


def run_module(path: Path) -> dict:
    namespace = {"__name__": "__main__"}
    with one_thread():
        exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


def shard_items(loader) -> list[float]:
    return sorted(float(x[0]) for xb, _ in loader for x in xb)


def test_sharded_iterable_dataset_yields_each_item_once_with_workers(two_workers):
    namespace = run_module(FIXTURES / "sharded_unguarded.out.py")
    loader = namespace["loader"]
    assert loader.num_workers == 2 and loader.persistent_workers
    assert shard_items(loader) == [float(i) for i in range(64)]
    loader._iterator._shutdown_workers()  # persistent: they would live until garbage collection


def test_fork_only_loader_gets_no_workers_under_spawn(two_workers, monkeypatch):
    """The unguarded script would start its training again in each spawned worker."""
    monkeypatch.setattr(data, "_start_method", lambda: "spawn")
    namespace = run_module(FIXTURES / "sharded_unguarded.out.py")
    loader = namespace["loader"]
    assert loader.num_workers == 0 and not loader.persistent_workers
    assert two_workers == []
    assert shard_items(loader) == [float(i) for i in range(64)]


def test_each_guard_of_the_left_alone_fixture_is_what_keeps_its_loader():
    """Without its guard each loader of left_alone.in.py would be fixed: the fixture is not
    vacuous."""
    source = (FIXTURES / "left_alone.in.py").read_text()
    guards = [
        (
            "        for _ in range(256):\n",
            "        info = torch.utils.data.get_worker_info()\n        for _ in range(256):\n",
        ),
        (
            "    def __iter__(self):\n        for batch in super()",
            "    def batches(self):\n        for batch in super()",
        ),
        ("Jittered(features.to(device), labels.to(device))", "Jittered(features, labels)"),
        (", num_workers=2)", ")"),
        ('fit(Corpus("train.txt"))', "fit(Jittered(features, labels))"),
        ("TensorDataset(features, labels), batch_size=32, num_workers=0", "Jittered(features, labels), batch_size=32"),
        (
            "TensorDataset(features, labels), batch_size=32, num_workers=0",
            "Jittered(features, labels), batch_size=32, num_workers=0",
        ),
    ]
    settings = Settings(select=("PM201",), level=Level.UNSAFE)
    baseline = process_source(source.encode(), "<test>", settings, [SingleProcessLoaderInTrainingLoop])
    assert sum(f.fixable for f in baseline.findings) == 0
    for guard, replacement in guards:
        assert guard in source
        changed = source.replace(guard, replacement)
        result = process_source(changed.encode(), "<test>", settings, [SingleProcessLoaderInTrainingLoop])
        assert sum(f.applied for f in result.findings) == 1, guard


# -- issue 22: datasets whose batches are rows of tensors in memory; num_workers=0 written out


def findings(source: str, select=("PM201",)):
    settings = Settings(select=select, level=Level.UNSAFE)
    result = process_source(source.encode(), "<test>", settings)
    assert result.error is None, result.error
    return result


def test_explicit_zero_over_a_dataset_that_works_per_item_trains_bit_for_bit_with_two_workers(two_workers):
    """Report 003's case: `num_workers=0` written out, fixed like the default; the
    in-memory validation loader of the same script keeps its 0."""
    source = (FIXTURES / "explicit_zero.in.py").read_text()
    before = losses(source)
    assert two_workers == []
    after = losses((FIXTURES / "explicit_zero.out.py").read_text())
    assert two_workers == [2]  # the tokenizing loader only
    assert len(before) == 6 + 2
    assert torch.equal(after, before)
    reports = [f for f in findings(source).findings if not f.applied]
    assert len(reports) == 1 and "only indexes tensors the training process already holds" in reports[0].message


# x-transformers train_enwik8_xm.py: a dataset that slices random windows of one tensor
# built before it, loaders wrapped in a `cycle` generator and read with next().
ENWIK8 = """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

def cycle(loader):
    while True:
        for data in loader:
            yield data

class TextSamplerDataset(Dataset):
    def __init__(self, data, seq_len):
        super().__init__()
        self.data = data
        self.seq_len = seq_len

    def __getitem__(self, index):
        rand_start = torch.randint(0, self.data.size(0) - self.seq_len - 1, (1,)).item()
        return self.data[rand_start: rand_start + self.seq_len + 1].clone().long()

    def __len__(self):
        return self.data.size(0) // self.seq_len

data = np.frombuffer(bytes(range(256)) * 40, dtype=np.uint8).copy()
train_x, valid_x = np.split(data, [9000])
data_train, data_val = torch.from_numpy(train_x).clone(), torch.from_numpy(valid_x).clone()
train_loader = cycle(DataLoader(TextSamplerDataset(data_train, 32), batch_size=4, drop_last=True))
model = torch.nn.Sequential(torch.nn.Embedding(256, 8), torch.nn.Linear(8, 256))
optim = torch.optim.Adam(model.parameters())
for i in range(3):
    seq = next(train_loader)
    loss = torch.nn.functional.cross_entropy(model(seq[:, :-1]).transpose(1, 2), seq[:, 1:])
    loss.backward()
    optim.step()
    optim.zero_grad()
"""


def test_windows_sliced_from_a_tensor_in_memory_get_no_workers():
    (finding,) = findings(ENWIK8).findings
    assert not finding.fixable
    assert "`TextSamplerDataset(data_train, 32)` only indexes tensors the training process already holds" in (
        finding.message
    )
    assert "BatchSampler" not in finding.message  # its __getitem__ takes one index: the advice is TensorDataset's


def test_the_dataloader_pm202_writes_over_tensors_in_memory_gets_no_workers():
    """The wild corpus's cpu_housing_regression.py, with rows wide enough for a DataLoader to
    pay: PM202 turns hand-cut batches of two tensors into a DataLoader over a TensorDataset;
    PM201 then reports it, no workers."""
    source = (
        "import torch\nX, y = torch.randn(340, 4000), torch.randn(340)\nmodel = torch.nn.Linear(4000, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.05)\nfor epoch in range(2):\n"
        "    perm = torch.randperm(len(X))\n    for i in range(0, len(X), 80):\n        idx = perm[i : i + 80]\n"
        "        xb, yb = X[idx], y[idx]\n        loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb)\n"
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
    )
    result = findings(source, ("PM202", "PM201"))
    assert sorted((f.code, f.applied) for f in result.findings) == [("PM201", False), ("PM202", True)]
    assert "num_workers" not in result.new_source.decode()


def test_a_lightning_style_train_dataloader_over_a_tensor_dataset_built_in_init():
    source = (
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset, random_split\n"
        "class Regressor(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.net = torch.nn.Linear(4, 1)\n"
        "        full = TensorDataset(torch.randn(100, 4), torch.randn(100, 1))\n"
        "        self.train_set, self.val_set = random_split(full, [80, 20])\n"
        "    def train_dataloader(self):\n        return DataLoader(self.train_set, batch_size=8, shuffle=True)\n"
        "def fit(module):\n    opt = torch.optim.SGD(module.parameters(), lr=0.1)\n"
        "    for x, y in module.train_dataloader():\n"
        "        loss = torch.nn.functional.mse_loss(module.net(x), y)\n"
        "        loss.backward()\n        opt.step()\n        opt.zero_grad()\n"
        "if __name__ == '__main__':\n    fit(Regressor())\n"
    )
    (finding,) = findings(source).findings
    assert not finding.fixable
    assert "`self.train_set` only indexes tensors the training process already holds" in finding.message


def test_explicit_zero_over_data_on_the_gpu_stays_unreported():
    """CUDA cannot run in forked workers: that 0 is required, nothing to report."""
    source = (
        "import torch\nfrom torch.utils.data import DataLoader, Dataset\n"
        "class OnDevice(Dataset):\n    def __len__(self):\n        return 8\n"
        "    def __getitem__(self, i):\n        return torch.randn(4, device='cuda').sin(), torch.zeros(1, device='cuda')\n"
        "model = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in DataLoader(OnDevice(), batch_size=4, num_workers=0):\n"
        "    loss = torch.nn.functional.mse_loss(model(x), y)\n    loss.backward()\n    opt.step()\n"
    )
    assert findings(source).findings == []


def test_a_batch_sampler_gives_a_tensor_dataset_the_same_batches_in_one_indexing():
    """What the in-memory report advises: `sampler=BatchSampler(...)` with `batch_size=None`
    yields the batches of `batch_size=` over the same sampler, each one indexing."""
    from torch.utils.data import BatchSampler, RandomSampler

    rows = TensorDataset(torch.randn(50, 3), torch.arange(50))

    def batches(**options):
        return list(DataLoader(rows, **options))

    generator = torch.Generator().manual_seed(0)
    plain = batches(batch_size=8, sampler=RandomSampler(rows, generator=generator))
    generator.manual_seed(0)
    whole = batches(sampler=BatchSampler(RandomSampler(rows, generator=generator), 8, False), batch_size=None)
    assert len(plain) == len(whole) == 7
    for (x, i), (wx, wi) in zip(plain, whole):
        assert torch.equal(x, wx) and torch.equal(i, wi)


class HeldGenerator(torch.utils.data.Dataset):
    """Noise from a generator object the dataset holds (the wild corpus's denoising autoencoder)."""

    def __init__(self):
        self.gen = torch.Generator().manual_seed(0)

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.randn((), generator=self.gen)


def test_workers_draw_the_same_numbers_from_copies_of_a_generator_the_dataset_holds():
    """Why PM201 reports such a dataset: torch reseeds its global generators in each worker,
    not a generator object the dataset holds, so worker 0 and worker 1 draw alike."""
    with one_thread():
        alone = [float(x) for x in DataLoader(HeldGenerator(), batch_size=1)]
        workers = [float(x) for x in DataLoader(HeldGenerator(), batch_size=1, num_workers=2)]
    assert len(set(alone)) == 4  # one stream: four different numbers
    assert workers[0] == workers[1] and workers[2] == workers[3]  # items 0, 1 (and 2, 3) go to workers 0, 1


def test_a_torchvision_dataset_is_map_style_and_its_loader_gets_workers():
    """pytorch/examples fast_neural_style: `datasets.ImageFolder(path, transform)` decodes an
    image per item; torchvision's datasets are all map-style."""
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\nfrom torchvision import datasets, transforms\n"
        "def train(args):\n    transform = transforms.Compose([transforms.Resize(256), transforms.ToTensor()])\n"
        "    train_dataset = datasets.ImageFolder(args.dataset, transform)\n"
        "    train_loader = DataLoader(train_dataset, batch_size=args.batch_size)\n"
        "    model = torch.nn.Conv2d(3, 3, 3)\n    optimizer = torch.optim.Adam(model.parameters())\n"
        "    for x, _ in train_loader:\n        loss = model(x).mean()\n        optimizer.zero_grad()\n"
        "        loss.backward()\n        optimizer.step()\n"
        "if __name__ == '__main__':\n    train(None)\n"
    )
    (finding,) = findings(source).findings
    assert finding.applied and "num_workers=num_workers" in findings(source).new_source.decode()


def test_a_worker_count_of_0_in_another_spelling_is_replaced_as_0_is():
    source = (FIXTURES / "explicit_zero.in.py").read_text()
    settings = Settings(level=Level.UNSAFE, select=("PM201",))
    zero = process_source(source.encode(), "train.py", settings)
    spelled = process_source(source.replace("num_workers=0,", "num_workers=0x0,").encode(), "train.py", settings)
    assert zero.new_source is not None and spelled.new_source == zero.new_source
    assert [f.message for f in spelled.findings] == [f.message for f in zero.findings]


PER_EPOCH = """
import torch
from torch.utils.data import DataLoader, Dataset


class Shifted(Dataset):
    def __init__(self, n, shift):
        self.values = [float(i + shift) for i in range(n)]

    def __len__(self):
        return len(self.values)

    def __getitem__(self, i):
        v = sum(self.values[i] for _ in range(3)) / 192  # work done per item
        return torch.tensor([v]), torch.tensor([3 * v - 1])


torch.manual_seed(0)
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    loader = DataLoader(Shifted(32, epoch), batch_size=8, shuffle=True)
    for x, y in loader:
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"loss {loss.item()!r}")
"""


def test_a_loader_built_anew_each_epoch_gets_workers_that_do_not_persist(two_workers):
    """Persistent workers outlive an epoch of one loader; a loader built on each pass of the
    loop around the training loop has no next epoch to keep them for."""
    result = findings(PER_EPOCH)
    (finding,) = result.findings
    assert (
        finding.applied and "not persistent ones (it is built anew on each pass of the loop on line" in finding.message
    )
    new_source = result.new_source.decode()
    assert "num_workers=default_num_workers(fork_only=True)" in new_source and "persistent_workers" not in new_source
    before = losses(PER_EPOCH)
    after = losses(new_source)
    assert two_workers == [2, 2] and len(before) == 8
    assert torch.equal(after, before)


def test_a_loader_a_method_builds_for_each_epoch_gets_workers_that_do_not_persist(two_workers):
    """`for batch in module.train_dataloader():` inside the epoch loop: a new loader each epoch."""
    source = PER_EPOCH.replace(
        "torch.manual_seed(0)\n",
        "class Module:\n    def train_dataloader(self, epoch):\n"
        "        return DataLoader(Shifted(32, epoch), batch_size=8, shuffle=True)\n\n\ntorch.manual_seed(0)\n",
    ).replace(
        "    loader = DataLoader(Shifted(32, epoch), batch_size=8, shuffle=True)\n    for x, y in loader:\n",
        "    for x, y in Module().train_dataloader(epoch):\n",
    )
    result = findings(source)
    (finding,) = result.findings
    assert finding.applied and "built anew on each pass of the loop on line" in finding.message
    new_source = result.new_source.decode()
    assert "persistent_workers" not in new_source
    assert torch.equal(losses(new_source), losses(source)) and two_workers == [2, 2]


def test_a_loader_built_once_before_the_epochs_keeps_persistent_workers():
    source = PER_EPOCH.replace(
        "for epoch in range(2):\n    loader = DataLoader(Shifted(32, epoch), batch_size=8, shuffle=True)\n",
        "loader = DataLoader(Shifted(32, 0), batch_size=8, shuffle=True)\nfor epoch in range(2):\n",
    )
    assert "persistent_workers=num_workers > 0" in findings(source).new_source.decode()

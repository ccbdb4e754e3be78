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
from codemod.rules.loader_workers import SingleProcessLoaderInTrainingLoop
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

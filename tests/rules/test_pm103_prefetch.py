"""PM103, run: loops over DevicePrefetcher train bit for bit like the loops that copied
each batch themselves, alone and together with PM102 and PM201 (two workers), and the
prefetcher hands out exactly the loader's batches, in order, every epoch."""

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.batch_copied_in_the_step import BatchCopiedInTheStep
from codemod.rules.single_process_loader_in_training_loop import SingleProcessLoaderInTrainingLoop
from codemod.rules.unpinned_loader_batches_to_cuda import UnpinnedLoaderToCuda
from runtime import data
from runtime.data import DevicePrefetcher
from tests.rules.scripts import losses, one_thread

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM103"
LOADER_RULES = [UnpinnedLoaderToCuda, SingleProcessLoaderInTrainingLoop, BatchCopiedInTheStep]


def rewrite_unsafe(source: str, rules) -> tuple[str, list[str]]:
    """The rewritten source and the codes of the fixes applied (reports left out)."""
    settings = Settings(select=tuple(r.CODE for r in rules), level=Level.UNSAFE)
    result = process_source(source.encode(), "<fixture>", settings, rules)
    assert result.error is None, result.error
    assert all(f.applied for f in result.findings if f.fixable), result.findings
    return (result.new_source or source.encode()).decode(), sorted(f.code for f in result.findings if f.applied)


def test_prefetched_loops_train_bit_for_bit_like_the_copying_loops():
    before = losses((FIXTURES / "helper_loaders.in.py").read_text())
    after = losses((FIXTURES / "helper_loaders.out.py").read_text())
    assert len(before) == 2 * 8  # two epochs of 128 samples in batches of 16
    assert torch.equal(after, before)


def test_prefetched_dict_batches_train_bit_for_bit_like_the_comprehension():
    before = losses((FIXTURES / "dict_batches.in.py").read_text())
    after = losses((FIXTURES / "dict_batches.out.py").read_text())
    assert len(before) == 12
    assert torch.equal(after, before)


JITTERED = '''

class Jittered(torch.utils.data.Dataset):
    """Rows of the tensors it is given, the features through a sine when loaded: work for
    each item, which PM201 gives worker processes (rows only indexed would get none)."""

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i].sin(), self.y[i]
'''


def unpinned_source() -> str:
    """helper_loaders.in.py before PM102 (no pin_memory), its training set loading work."""
    source = (FIXTURES / "helper_loaders.in.py").read_text().replace(", pin_memory=pin", "")
    source = source.replace("TensorDataset(features[:128], labels[:128])", "Jittered(features[:128], labels[:128])")
    return source.replace("\n\ndef make_loaders", JITTERED + "\n\ndef make_loaders", 1)


def test_loader_rules_together_train_the_first_epoch_bit_for_bit_with_two_workers(monkeypatch):
    """The unpinned script rewritten by PM102 + PM201 + PM103 (the engine repeats passes:
    PM103 waits for PM102's pin_memory) runs with two loader workers and gives the
    original's losses over the first epoch. From the second epoch on, the persistent
    workers leave the loader's generator one draw behind (PM201's Fix safety), so the
    shuffle differs there; with no workers every epoch is the same."""
    source = unpinned_source()
    new_source, codes = rewrite_unsafe(source, LOADER_RULES)
    # the eval loader is not on the training path (PM201), its loop is not a step (PM103), and
    # it runs after each epoch reading every batch back: not worth pinning (PM102 reports it)
    assert codes == ["PM102", "PM103", "PM201"]
    assert "DevicePrefetcher(loader, device)" in new_source and "num_workers = default_num_workers()" in new_source
    before = losses(source)
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "2")
    after = losses(new_source)
    assert torch.equal(after[:8], before[:8])
    assert not torch.equal(after[8:], before[8:])
    monkeypatch.setenv(data.NUM_WORKERS_ENV, "0")
    assert torch.equal(losses(new_source), before)


def test_the_rewrite_is_idempotent_and_leaves_the_loader_pinned_for_pm102():
    source = unpinned_source()
    once, _ = rewrite_unsafe(source, LOADER_RULES)
    twice, codes = rewrite_unsafe(once, LOADER_RULES)
    assert twice == once and codes == []
    assert once.count("pin_memory=torch.cuda.is_available()") == 1  # the device is a parameter there


def test_prefetcher_yields_the_loaders_batches_in_order_every_epoch_with_workers():
    """A shuffling loader with two workers, through the prefetcher on the CPU: each epoch
    the same batches, in the same order, as a second loader with the same seeds."""
    dataset = TensorDataset(torch.randn(40, 3), torch.arange(40))

    def loader():
        return DataLoader(
            dataset, batch_size=6, shuffle=True, num_workers=2, timeout=60, generator=torch.Generator().manual_seed(3)
        )

    prefetcher, reference = DevicePrefetcher(loader(), torch.device("cpu")), loader()
    assert len(prefetcher) == len(reference) == 7
    with one_thread():
        for epoch in range(3):
            got, want = list(prefetcher), list(reference)
            assert len(got) == len(want) == 7
            for (x, i), (wx, wi) in zip(got, want):
                assert torch.equal(x, wx) and torch.equal(i, wi)
            assert sorted(int(j) for _, i in got for j in i) == list(range(40))


# -- why a loop's copies are not rewritten -----------------------------------------------------

REASONS_HEAD = """\
import sys
import torch
from torch.utils.data import DataLoader

class Collate:
    def __call__(self, rows):
        return {"x": torch.stack(rows)}

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(256, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader([torch.randn(256) for _ in range(4096)], batch_size=1024, pin_memory=True, COLLATE)
"""
REASONS_STEP = """\
    loss = model(batch["x"]).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""
DICT_COPY = "    batch = {k: v.to(device) for k, v in batch.items()}\n"


def pm103_messages(source: str) -> list[str]:
    settings = Settings(select=("PM103",), level=Level.UNSAFE)
    result = process_source(source.encode(), "<test>", settings, [BatchCopiedInTheStep])
    assert result.error is None and not any(f.fixable for f in result.findings), result.findings
    return [f.message for f in result.findings]


@pytest.mark.parametrize(
    ("collate", "loop", "reason"),
    [
        (
            "collate_fn=Collate()",
            "for batch in loader:\n" + DICT_COPY,
            "the DataLoader on line 12 batches with its own collate_fn `Collate()`, which perfmod cannot tell",
        ),
        (
            "collate_fn=None",
            "for batch in loader:\n" + DICT_COPY + "    device = 'cpu'\n",
            "the device `device` is bound inside the loop",
        ),
        (
            "collate_fn=None",
            "batches = loader if sys.argv else []\nfor batch in batches:\n" + DICT_COPY,
            "the loop iterates `batches`, not one DataLoader of this file",
        ),
        (
            "collate_fn=None",
            "for batch in loader:\n    print(batch)\n" + DICT_COPY,
            "not copied whole by plain `x = x.to(device)` statements at the top of the loop",
        ),
    ],
)
def test_a_loop_whose_copies_are_not_rewritten_gives_the_reason_it_was_refused_with(collate, loop, reason):
    (message,) = pm103_messages(REASONS_HEAD.replace("COLLATE", collate) + loop + REASONS_STEP)
    assert reason in message, message


# The device is an attribute not spelled like one, given by the script (as the DDP tutorial's
# `self.gpu_id`): the shared analysis follows it to device values, so the copies are the
# batch's, and prefetched.
GPU_ID = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, loader, gpu_id):
        self.gpu_id = gpu_id
        self.model = model.to(gpu_id)
        self.loader = loader
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train(self, epochs):
        for epoch in range(epochs):
            for x, y in self.loader:
                x = x.to(self.gpu_id)
                y = y.to(self.gpu_id)
                loss = torch.nn.functional.mse_loss(self.model(x), y)
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                print(f"loss {loss.item()}")


torch.manual_seed(0)
data = TensorDataset(torch.randn(2048, 1024), torch.randn(2048, 1))
loader = DataLoader(data, batch_size=512, pin_memory=torch.cuda.is_available())
Trainer(torch.nn.Linear(1024, 1), loader, 0 if torch.cuda.is_available() else "cpu").train(2)
"""


def test_copies_to_a_device_attribute_the_analysis_follows_are_prefetched_and_train_the_same():
    new, codes = rewrite_unsafe(GPU_ID, [BatchCopiedInTheStep])
    assert codes == ["PM103"] and "for x, y in DevicePrefetcher(self.loader, self.gpu_id):" in new
    before, after = losses(GPU_ID), losses(new)
    assert len(before) == 8 and torch.equal(after, before)


NEXT_BATCHES = """\
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def cycle(loader):
    while True:
        for batch in loader:
            yield batch


accelerator = Accelerator()
device = accelerator.device
model = torch.nn.Linear(1024, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8192, 1024)), batch_size=512, pin_memory=True)
{prepare}batches = cycle(loader)
for step in range(100):
    (x,) = next(batches)
    x = x.to(device)
    loss = model(x).square().mean()
    accelerator.backward(loss)
    opt.step()
"""


def test_batches_an_engine_puts_on_the_device_in_next_get_no_report_of_their_copy():
    settings = Settings(select=("PM103",), level=Level.UNSAFE)
    prepared = NEXT_BATCHES.format(prepare="model, opt, loader = accelerator.prepare(model, opt, loader)\n")
    assert process_source(prepared.encode(), "train.py", settings, [BatchCopiedInTheStep]).findings == []
    plain = NEXT_BATCHES.format(prepare="")
    found = process_source(plain.encode(), "train.py", settings, [BatchCopiedInTheStep]).findings
    assert [(f.code, f.applied) for f in found] == [("PM103", False)]

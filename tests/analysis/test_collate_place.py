"""Where a DataLoader's batches are once its collate_fn ran (`Loaders.collate_place`): a
collate_fn that moves them to the GPU (a function of the file called through a
`functools.partial` that binds its device, a lambda) hands out batches that are not host
memory, so PM102 does not pin them (pinning raises "cannot pin 'torch.cuda.LongTensor'
only dense CPU tensors can be pinned") and PM103 does not prefetch them; a collate_fn
perfmod cannot read is reported, not pinned."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
import torch

from codemod.analysis.values import Place
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.result import Level

# The shape of an instruction fine-tuning script: the collate_fn pads and moves each
# batch to the device it is given through functools.partial.
PARTIAL_TO_DEVICE = """\
from functools import partial

import torch
from torch.utils.data import DataLoader


def collate(batch, pad_token_id=0, device="cpu"):
    longest = max(len(item) for item in batch)
    padded = [item + [pad_token_id] * (longest - len(item)) for item in batch]
    inputs = torch.tensor([row[:-1] for row in padded]).to(device)
    targets = torch.tensor([row[1:] for row in padded]).to(device)
    return inputs, targets


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = [[1, 2, 3, 4], [5, 6, 7], [2, 3, 4, 5, 6], [7, 1, 2]] * 8
    {binding}
    loader = DataLoader(data, batch_size=4, collate_fn=collate_fn)
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)
        loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model
"""


def context(code: str) -> FileContext:
    code = textwrap.dedent(code)
    return FileContext(cst.parse_module(code), "<test>", Settings(), code)


def loader_of(ctx: FileContext) -> cst.Call:
    [call] = [c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "DataLoader"]
    return call


def script(binding: str) -> str:
    return PARTIAL_TO_DEVICE.replace("{binding}", binding)


@pytest.mark.parametrize(
    "binding, place",
    [
        ("collate_fn = partial(collate, device=device)", Place.UNKNOWN),  # cuda or cpu: not host for sure
        ('collate_fn = partial(collate, device="cuda")', Place.CUDA),
        ("collate_fn = partial(collate, pad_token_id=1)", Place.HOST),  # the default device, "cpu"
        ('collate_fn = partial(collate, device="cpu")', Place.HOST),
        ("collate_fn = collate", Place.HOST),
        ("collate_fn = lambda batch: collate(batch, device=device)", Place.UNKNOWN),
        ("collate_fn = lambda batch: [t.to(device) for t in collate(batch)]", Place.UNKNOWN),
        ("collate_fn = None", Place.HOST),
        ("collate_fn = some_module.collate", None),  # cannot be read
    ],
)
def test_the_place_of_the_batches_a_collate_fn_hands_out(binding, place):
    code = script(binding)
    if "some_module" in binding:
        code = "import some_module\n" + code
    ctx = context(code)
    assert ctx.loaders.collate_place(loader_of(ctx)) is place


def findings(code: str, rules: tuple[str, ...]):
    return process_source(code.encode(), "<test>", Settings(select=rules, level=Level.UNSAFE)).findings


def test_batches_the_collate_fn_puts_on_the_device_are_not_pinned_or_prefetched():
    code = script("collate_fn = partial(collate, device=device)")
    found = findings(code, ("PM101", "PM102", "PM103"))
    assert not [f for f in found if f.applied]
    [prefetch] = [f for f in found if f.code == "PM103"]
    assert "puts each batch on the device itself" in prefetch.message


def trained(code: str) -> list[torch.Tensor]:
    namespace = {"__name__": "fixture"}
    exec(compile(code, "<fixture>", "exec"), namespace)
    return [p.detach().clone() for p in namespace["main"]().parameters()]


def test_batches_the_collate_fn_keeps_on_the_host_are_still_pinned_and_train_the_same():
    code = script("collate_fn = partial(collate, pad_token_id=1)")
    result = process_source(code.encode(), "<test>", Settings(select=("PM102",), level=Level.UNSAFE))
    assert [f.code for f in result.findings if f.applied] == ["PM102"]
    rewritten = result.new_source.decode()
    assert "pin_memory=" in rewritten
    assert all(torch.equal(a, b) for a, b in zip(trained(code), trained(rewritten)))


def test_a_collate_fn_perfmod_cannot_read_is_reported_not_pinned():
    code = "import some_module\n" + script("collate_fn = some_module.collate")
    [pin] = [f for f in findings(code, ("PM102",)) if f.code == "PM102"]
    assert not pin.applied
    assert "cannot read its collate_fn `collate_fn`" in pin.message


TRAINER = """\
import torch
from torch.utils.data import DataLoader
from transformers import DataCollatorForTokenClassification


class Trainer:
    def __init__(self, dataset, data_collator):
        self.dataset = dataset
        self.data_collator = data_collator

    def loader(self):
        return DataLoader(self.dataset, batch_size=8, collate_fn=self.data_collator)


trainer = Trainer([1, 2, 3], {collator})
"""


@pytest.mark.parametrize(
    "collator, place",
    [("DataCollatorForTokenClassification(tokenizer)", Place.HOST), ("make_collator()", None)],
)
def test_a_collate_fn_an_object_keeps_is_what_its_constructions_give_it(collator, place):
    ctx = context(TRAINER.replace("{collator}", collator))
    assert ctx.loaders.collate_place(loader_of(ctx)) is place


BATCH_CLASS = """\
import torch
from torch.utils.data import DataLoader


class Batch:
    def __init__(self, samples):
        self.x = torch.stack([x for x, _ in samples]){init_copy}

    def to(self, device):
        self.x = self.x.to(device)
        return self


loader = DataLoader([(torch.randn(4), 0)] * 8, batch_size=4, collate_fn=Batch)
"""


@pytest.mark.parametrize("init_copy, place", [("", Place.HOST), ('.to("cuda")', Place.CUDA)])
def test_a_class_given_as_collate_fn_collates_in_its_init(init_copy, place):
    """The loader builds `Batch(samples)`: only `__init__` runs; `Batch.to` is the loop's."""
    ctx = context(BATCH_CLASS.replace("{init_copy}", init_copy))
    assert ctx.loaders.collate_place(loader_of(ctx)) is place

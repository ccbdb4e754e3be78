"""The batches a step loop cuts by hand, as `Loaders` knows them: the windows of a loop
over a counter (`Loaders.batch_windows`), batches of a Python list looked up through a
permutation (`Loaders.list_batches`), and the batch size of every training batch with the
command-line option whose default it takes (`training_batch_sizes`, `setting_option`)."""

import libcst as cst
import pytest

from codemod.config import Settings
from codemod.context import FileContext

HEAD = """\
import argparse
import torch
parser = argparse.ArgumentParser()
parser.add_argument("--bs", type=int, default=1)
args = parser.parse_args()
texts = ["a b", "c d", "e f", "g h"]
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
bs = args.bs
"""
STEP = "    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"


def context(source: str) -> FileContext:
    return FileContext(cst.parse_module(source), "t.py", Settings(), source)


def windows(source: str) -> list[tuple[str, str]]:
    ctx = context(source)
    (loop,) = ctx.loops.step_loops
    return [(ctx.source(w.subscript), ctx.source(w.width)) for w in ctx.loaders.batch_windows(loop)]


@pytest.mark.parametrize(
    "header,window",
    [
        ("for step in range(4):", "perm[step * bs:(step + 1) * bs]"),
        ("for step in range(4):", "perm[bs * step:bs * (step + 1)]"),
        ("for step in range(4):", "perm[step * bs:(1 + step) * bs]"),
        ("for i in range(0, 4, bs):", "perm[i:i + bs]"),
        ("for k, i in enumerate(range(0, 4, bs)):", "perm[i:bs + i]"),
        ("for step in range(4):", "perm[step * bs:(step + 0x1) * bs]"),  # 1, however spelled
    ],
)
def test_windows_one_batch_wide(header, window):
    source = HEAD + "perm = torch.randperm(4)\n" + f"{header}\n    idx = {window}\n    x = torch.randn(2, 2)\n" + STEP
    assert windows(source) == [(window, "bs")]


@pytest.mark.parametrize(
    "header,window",
    [
        ("for i in range(4):", "perm[i:i + bs]"),  # overlapping windows: the counter steps by 1
        ("for i in range(0, 4, 2):", "perm[i:i + bs]"),  # a stride other than the width
        ("for step in range(4):", "perm[step * bs:(step + 2) * bs]"),  # two batches wide
        ("for step in range(4):", "perm[step:step * bs]"),
    ],
)
def test_not_windows(header, window):
    source = HEAD + "perm = torch.randperm(4)\n" + f"{header}\n    idx = {window}\n    x = torch.randn(2, 2)\n" + STEP
    assert windows(source) == []


def test_a_list_batch_through_a_permutation_with_the_work_on_its_items():
    source = (
        HEAD
        + "def encode(batch):\n    return torch.zeros(len(batch), 2)\n\n\n"
        + "for epoch in range(2):\n    perm = torch.randperm(len(texts))\n    for step in range(2):\n"
        + "        idx = perm[step * bs:(step + 1) * bs]\n        batch = [texts[i] for i in idx.tolist()]\n"
        + "        words = [t.split() for t in batch]\n        x = encode(words)\n        y = model(x)\n"
        + STEP.replace("    ", "        ")
    )
    ctx = context(source)
    (found,) = ctx.loaders.list_batches
    assert ctx.source(found.corpus) == "texts" and found.batch.value == "batch" and found.per_epoch
    assert [ctx.source(call) for call in found.work] == ["encode(words)"]  # not str methods, not the model
    assert found.other_reads == ()


def test_indices_into_a_tensor_are_no_list_batch():
    source = HEAD + "X = torch.randn(4, 2)\nperm = torch.randperm(4)\nfor step in range(2):\n"
    source += "    idx = perm[step * bs:(step + 1) * bs]\n    x = torch.stack([X[i] for i in idx.tolist()])\n" + STEP
    assert context(source).loaders.list_batches == ()


def test_training_batch_sizes_and_the_option_they_default_to():
    source = (
        HEAD
        + "from torch.utils.data import DataLoader\n"
        + "train = DataLoader(torch.randn(8, 2), batch_size=bs)\ntest = DataLoader(torch.randn(8, 2), batch_size=args.bs)\n"
        + "for x in train:\n"
        + STEP
        + "with torch.no_grad():\n    for x in test:\n        print(model(x))\n"
    )
    ctx = context(source)
    ((size, where),) = ctx.loaders.training_batch_sizes  # the evaluation loader is not a training batch
    assert ctx.source(size) == "bs" and ctx.line(where) == ctx.line(ctx.loaders.constructions[0])
    option = ctx.loaders.setting_option(size)
    assert option is not None and ctx.source(option.default) == "1"

"""`sample_loops`: which loops visit the samples of a batch one at a time, and what their
body computes run once on the whole batch; `sample_mixing`: whether a model treats every
sample on its own.

The batched bodies are checked by running them: the rewrites the analysis gives, applied
to the program, must leave the same gradients as the per-sample loop left."""

import libcst as cst
import pytest
import torch

from codemod.analysis.sample_loops import NotBatchable, sample_loops
from codemod.analysis.sample_mixing import sample_mixing
from codemod.context import FileContext

HEAD = """\
import torch
import torch.nn.functional as F
from torch import nn
class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 3)
    def forward(self, x):
        return self.proj(x).tanh()
torch.manual_seed(0)
net = Head()
x = torch.randn(5, 6)
t = torch.randn(5, 3)
"""


def read(body: str, head: str = HEAD):
    context = FileContext.of_source(head + body)
    loop = next(iter(context.index.find(cst.For, within=context.module)))
    return context, loop, sample_loops(context)


class _Apply(cst.CSTTransformer):
    """The rewrites made where they are anchored, and the loop's body in its place."""

    def __init__(self, loop: cst.For, rewrites) -> None:
        super().__init__()
        self.loop = loop
        self.rewrites: dict[int, list] = {}
        for rewrite in rewrites:
            self.rewrites.setdefault(id(rewrite.anchor), []).append(rewrite)

    def on_leave(self, original, updated):
        for rewrite in self.rewrites.get(id(original), ()):
            if rewrite.new is None:
                return cst.RemovalSentinel.REMOVE
            updated = rewrite.replacement(updated)
        if original is self.loop:
            return cst.FlattenSentinel(updated.body.body)
        return updated


def batched(body: str, head: str = HEAD) -> str:
    context, loop, loops = read(body, head)
    found = loops.over_samples(loop)
    assert found is not None and loops.sequential(loop) is None
    return context.module.visit(_Apply(loop, loops.batched(loop, found).rewrites)).code


def gradient(source: str) -> torch.Tensor:
    namespace: dict = {}
    exec(compile(source, "<program>", "exec"), namespace)
    return namespace["net"].proj.weight.grad


def same_training(body: str, head: str = HEAD) -> str:
    """The batched program, after checking that it leaves the gradients the loop left."""
    program = batched(body, head)
    torch.testing.assert_close(gradient(program), gradient(head + body), rtol=1e-5, atol=1e-6)
    return program[len(head) :]


def test_a_batch_of_one_sliced_out_becomes_the_batch():
    body = (
        "for i in range(x.size(0)):\n"
        '    loss = F.mse_loss(net(x[i:i + 1]), t[i:i + 1], reduction="sum")\n'
        "    loss.backward()\n"
    )
    context, loop, loops = read(body)
    found = loops.over_samples(loop)
    assert (found.index, found.count, found.problem) == ("i", "x.size(0)", None)
    assert [context.module.code_for_node(b) for b in found.batches] == ["x"]
    assert same_training(body) == 'loss = F.mse_loss(net(x), t, reduction="sum")\nloss.backward()\n'


@pytest.mark.parametrize("size", ["x.size(0x0)", "x.size(dim=0)", "x.shape[ZERO]", "len(x) - 1"])
def test_the_batch_a_size_counts_reads_dim_0_however_spelled(size):
    context, loop, loops = read(f"ZERO = 0\nfor i in range({size}):\n    pass\n")
    count = loop.iter.args[0].value
    assert context.module.code_for_node(loops.batch_of_size(count, less=True)) == "x"


def test_a_batch_of_one_sliced_out_with_a_named_one_becomes_the_batch():
    body = (
        "for i in range(x.size(0)):\n"
        '    loss = F.mse_loss(net(x[i:i + ONE]), t[i:i + ONE], reduction="sum")\n'
        "    loss.backward()\n"
    )
    assert same_training(body, HEAD + "ONE = 1\n") == 'loss = F.mse_loss(net(x), t, reduction="sum")\nloss.backward()\n'


def test_a_row_given_a_batch_dimension_and_its_output_squeezed():
    body = (
        "for i in range(len(x)):\n"
        "    out = net(x[i].unsqueeze(0)).squeeze(0)\n"
        "    loss = F.mse_loss(out, t[i])\n"
        "    loss.backward()\n"
    )
    # an element-wise mean per sample: the batch's mean times the batch size is their sum
    assert same_training(body) == "out = net(x)\nloss = F.mse_loss(out, t) * len(x)\nloss.backward()\n"


def test_rows_of_zip_and_a_scale_of_the_batch_size():
    body = (
        "for row, target in zip(x, t):\n"
        "    loss = F.l1_loss(net(row[None]), target[None]) / len(x)\n"
        "    loss.backward()\n"
    )
    # each sample's mean divided by B: the mean of the per-sample means, the batch's own mean
    assert same_training(body) == "loss = F.l1_loss(net(x), t)\nloss.backward()\n"


def test_token_means_with_their_own_counts_are_kept_per_sample():
    head = HEAD.replace("x = torch.randn(5, 6)", "x = torch.randn(5, 4, 6)").replace(
        "t = torch.randn(5, 3)", "t = torch.randint(3, (5, 4))\nt[0, 1:] = -100\nt[3, 2] = -100"
    )
    body = (
        "for i in range(len(x)):\n"
        "    logits = net(x[i:i + 1])\n"
        "    loss = F.cross_entropy(logits.view(-1, 3), t[i:i + 1].view(-1))\n"
        "    loss.backward()\n"
    )
    program = same_training(body, head)
    assert 'reduction="none"' in program and "(t.view(-1) != -100).view(len(x), -1).sum(1)" in program


def test_state_handed_from_sample_to_sample_is_not_batched():
    body = (
        "ema = torch.zeros(1, 3)\n"
        "for i in range(len(x)):\n"
        "    ema = 0.9 * ema + net(x[i:i + 1])\n"
        "    loss = F.mse_loss(ema, t[i:i + 1])\n"
        "    loss.backward()\n"
    )
    _, loop, loops = read(body)
    with pytest.raises(NotBatchable, match=r"`ema` is handed from one sample to the next"):
        loops.batched(loop, loops.over_samples(loop))


def test_state_handed_through_the_model_makes_the_samples_run_in_order():
    head = HEAD.replace("nn.Linear(6, 3)", "nn.Linear(6, 6)")
    body = (
        "h = torch.zeros(1, 6)\n"
        "for i in range(len(x)):\n"
        "    h = net(x[i:i + 1] + h)\n"
        "    loss = h.pow(2).sum()\n"
        "    loss.backward()\n"
    )
    _, loop, loops = read(body, head)
    assert loops.sequential(loop) == "`h` is handed from one sample to the next through `net`"


@pytest.mark.parametrize(
    "body,why",
    [
        (
            "for i in range(len(x)):\n    if t[i, 0] > 0:\n"
            "        loss = F.mse_loss(net(x[i:i + 1]), t[i:i + 1])\n        loss.backward()\n",
            "it branches on the values of a sample",
        ),
        (
            "for i in range(len(x)):\n    loss = F.mse_loss(net(x[i:i + 1]), t[i:i + 1])\n"
            "    loss.backward()\nprint(loss)\n",
            "`loss` is read after the loop",
        ),
        (
            "for i in range(len(x)):\n    loss = F.mse_loss(net(x[i:i + 2]), t[i:i + 2])\n    loss.backward()\n",
            "a sample is used other than as a batch of one",
        ),
    ],
)
def test_bodies_that_compute_something_else_for_a_batch_say_why(body, why):
    _, loop, loops = read(body)
    with pytest.raises(NotBatchable, match=why):
        loops.batched(loop, loops.over_samples(loop))


def test_loops_over_other_things_are_not_sample_loops():
    _, loop, loops = read("for layer in net.children():\n    layer.requires_grad_(False)\n")
    assert loops.over_samples(loop) is None
    context, loop, loops = read(
        "pairs = [(x[0], t[0]), (x[1], t[1])]\nfor a, b in pairs:\n"
        "    loss = F.mse_loss(net(a), b)\n    loss.backward()\n"
    )
    assert "is a Python list or tuple of examples" in loops.over_samples(loop).problem


def test_optimizer_steps_per_sample_are_seen_through_helpers():
    body = (
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\ndef update():\n    opt.step()\n    opt.zero_grad()\n"
        "for i in range(len(x)):\n    F.mse_loss(net(x[i:i + 1]), t[i:i + 1]).backward()\n    update()\n"
    )
    _, loop, loops = read(body)
    assert loops.steps_optimizer(loop.body)


@pytest.mark.parametrize(
    "layers,unbatched,problem",
    [
        ("nn.Linear(6, 3)", False, None),
        ("nn.Sequential(nn.Linear(6, 3), nn.LayerNorm(3))", True, None),
        ("nn.Sequential(*nn.ModuleDict({'a': nn.Linear(6, 3)}).values())", True, None),  # a table only holds them
        ("nn.Sequential(nn.Linear(6, 3), nn.BatchNorm1d(3))", False, "has BatchNorm"),
        ("nn.GRU(6, 3)", True, "`nn.GRU` is not a layer known to act on the last dimensions"),
    ],
)
def test_whether_a_model_mixes_the_samples_of_a_batch(layers, unbatched, problem):
    context = FileContext.of_source(HEAD.replace("nn.Linear(6, 3)", layers) + "net(x)\n")
    call = [c for c in context.index.find(cst.Call, within=context.module) if context.source(c) == "net(x)"][0]
    found = sample_mixing(context).problem(call.func, unbatched)
    assert (found is None) if problem is None else (problem in found), found


def test_a_python_list_a_function_of_the_file_returns_is_not_a_batch():
    body = (
        "def load():\n    return [x[k] for k in range(5)]\nrows = load()\n"
        "for i in range(len(rows)):\n    loss = F.mse_loss(net(rows[i].unsqueeze(0)), t[i:i + 1])\n    loss.backward()\n"
    )
    _, loop, loops = read(body)
    assert loops.over_samples(loop).problem.startswith("`rows` is a Python list or tuple")


@pytest.mark.parametrize(
    "bound,less,batch",
    [
        ("len(x)", False, "x"),
        ("x.size(dim=0)", False, "x"),
        ("n", False, "x"),  # n = m = x.shape[0]
        ("len(x) - 2", False, None),  # fewer than the batch's samples
        ("len(x) - 2", True, "x"),
        ("x.size(1)", False, None),
    ],
)
def test_the_tensor_whose_samples_a_size_counts(bound, less, batch):
    context = FileContext.of_source(HEAD + f"m = x.shape[0]\nn = m\nbound = {bound}\n")
    assign = [s for s in context.index.find(cst.Assign) if context.source(s.targets[0].target) == "bound"][0]
    found = sample_loops(context).batch_of_size(assign.value, less=less)
    assert (None if found is None else context.source(found)) == batch

"""`position_losses`: loops over the positions of a sequence that add one loss per
position, each position's term, and its sum written over all positions at once;
`loop_totals`: how a loop totals its terms and which of its names outlive it;
`loss_calls.arguments` and `position_slices.scalar`, the facts they rest on.

The programs are not PM503's examples or fixtures. Each written-out sum is run against
the loop it stands for, in float64 on the CPU: the same loss and the same gradient, to
rounding (a mask left out, `batchmean` read as a mean, one position short would move
the loss by far more than RTOL)."""

import libcst as cst
import pytest
import torch

from codemod.analysis.loop_totals import added, appended, collected_list, read_after
from codemod.analysis.loss_calls import loss_calls
from codemod.analysis.position_losses import NotBatched, position_losses
from codemod.analysis.position_slices import position_slices
from codemod.context import FileContext

RTOL = 1e-12

HEAD = """\
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(3)
B, S, V = 3, 8, 6
student = torch.randn(B, S, V, dtype=torch.float64, requires_grad=True)
teacher = torch.randn(B, S, V, dtype=torch.float64)
labels = torch.randint(V, (B, S))
pad = (torch.rand(B, S) > 0.4).to(torch.float64)
pad[:, 1] = 1.0
"""


def read(body: str):
    context = FileContext.of_source(HEAD + body)
    loop = next(iter(context.index.find((cst.For, cst.GeneratorExp, cst.ListComp), within=context.module)))
    return context, loop, position_losses(context)


def run(body: str, total: str, expression: str) -> None:
    """Run HEAD and `body` (the loop), then `expression` (its sum over the positions) in
    the same namespace: `total` and the written-out sum agree, and so do their gradients."""
    scope: dict = {}
    exec(HEAD + body, scope)
    looped = scope[total]
    (grad_looped,) = torch.autograd.grad(looped, scope["student"], retain_graph=True)  # a graph they share
    batched = eval(expression, scope)
    (grad_batched,) = torch.autograd.grad(batched, scope["student"])
    torch.testing.assert_close(batched, looped, rtol=RTOL, atol=0)
    torch.testing.assert_close(grad_batched, grad_looped, rtol=RTOL, atol=1e-15)


MASKED = """\
total = torch.zeros((), dtype=torch.float64)
for t in range(S - 1):
    tok = F.cross_entropy(student[:, t], labels[:, t + 1], reduction="none")
    total += (tok * pad[:, t + 1]).sum()
loss = total / pad[:, 1:].sum()
"""


def test_a_masked_loss_over_shifted_positions_is_one_unreduced_loss_times_the_mask():
    context, loop, positions = read(MASKED)
    found = positions.loop(loop)
    assert found.var == "t" and context.module.code_for_node(found.stop) == "S - 1"
    assert positions.cross_entropy(positions.losses(loop.body, found))
    with pytest.raises(NotBatched, match="more than add one loss"):
        positions.cross_entropy_loop(loop, found)  # more than one cross-entropy call per position
    term = positions.summed_loop(loop, found)
    assert term.target.value == "total" and not term.appended and list(term.temporaries) == ["tok"]
    assert "pad[:, 1:S]" in term.batched and "labels[:, 1:S]" in term.batched
    run(MASKED, "total", term.batched)


DISTILL = """\
K, tau = 5, 2.0
kd = 0.0
for k in range(K):
    s = F.log_softmax(student[:, k] / tau, dim=-1)
    p = F.softmax(teacher[:, k] / tau, dim=-1)
    kd = kd + F.kl_div(s, p, reduction="batchmean") * tau**2
"""


def test_distillation_over_the_first_k_positions_keeps_batchmean_per_position():
    context, loop, positions = read(DISTILL)
    found = positions.loop(loop)
    assert not positions.cross_entropy(positions.losses(loop.body, found))
    term = positions.summed_loop(loop, found)
    assert ".size(0)" in term.batched and 'reduction="sum"' in term.batched
    run(DISTILL, "kd", term.batched)


MEAN_UNKNOWN_COUNT = """\
def squared(first: int, last: int):
    out = 0.0
    for j in range(first, last):
        out += F.mse_loss(student[:, j], teacher[:, j])
    return out
first, last = 2, 7
total = squared(first, last)
"""


def test_a_mean_per_position_whose_count_the_range_does_not_show_is_summed_per_position():
    context, loop, positions = read(MEAN_UNKNOWN_COUNT)
    term = positions.summed_loop(loop, positions.loop(loop))
    assert term.batched.endswith(".transpose(0, 1).flatten(1).mean(1).sum()")
    run(MEAN_UNKNOWN_COUNT, "total", term.batched)


# nn.LSTM's default layout: its output is (S, B, V), time first, as are the tensors the
# loops index with `[t]` (the blind round's #9: only `[:, t]` was read as a position).
TIME_MAJOR = """\
rnn = nn.LSTM(V, V).double()
out, _ = rnn(student.transpose(0, 1))
tags, mask, soft = labels.t(), pad.t(), teacher.transpose(0, 1)
"""
TIME_MAJOR_LOOPS = {
    "cross_entropy": "ce = 0.0\nfor t in range(S):\n    ce = ce + F.cross_entropy(out[t], tags[t])\n",
    "batchmean": (
        "kd = 0.0\nfor t in range(1, S):\n"
        '    kd = kd + F.kl_div(F.log_softmax(out[t], -1), F.softmax(soft[t - 1], -1), reduction="batchmean")\n'
    ),
    "masked": (
        "masked = 0.0\nfor t in range(S):\n"
        '    tok = F.cross_entropy(out[t], tags[t], reduction="none")\n'
        "    masked = masked + (tok * mask[t]).sum()\n"
    ),
    "mean_unknown_count": "def squared(n: int):\n    total = 0.0\n    for j in range(n):\n"
    "        total += F.mse_loss(out[j], soft[j])\n    return total\nsq = squared(S)\n",
}


@pytest.mark.parametrize("name", TIME_MAJOR_LOOPS)
def test_a_loop_over_the_steps_of_a_time_major_output_batches_along_dim_0(name):
    """`out[t]` of an nn.LSTM's output is one step of every sample: the positions are along
    dim 0 and the samples along dim 1, so the batch size, the counts per position and each
    position's mean are taken along dim 1."""
    body = TIME_MAJOR + TIME_MAJOR_LOOPS[name]
    context, loop, positions = read(body)
    found = positions.loop(loop)
    assert (found.dim, found.batch_dim) == (0, 1)
    if name == "cross_entropy":
        term = positions.cross_entropy_loop(loop, found)
        inputs, targets = positions.operands(term.term, found)
        assert (inputs, targets) == ("out[:S]", "tags[:S]")
        return  # the rule writes this one out (tests/rules/test_pm503_execution.py runs it)
    term = positions.summed_loop(loop, found)
    expected = {"batchmean": ".size(1)", "masked": "mask[:S]", "mean_unknown_count": "out[:n]"}[name]
    assert expected in term.batched and "[:, " not in term.batched, term.batched
    if name == "mean_unknown_count":
        assert term.batched.endswith(").flatten(1).mean(1).sum()")  # no transpose: positions lead already
        body += "n = S\n"
    run(body, {"batchmean": "kd", "masked": "masked", "mean_unknown_count": "sq"}[name], term.batched)


def test_indexing_dim_0_of_a_tensor_not_known_to_be_time_major_is_not_a_position():
    context, loop, positions = read(
        "ce = 0.0\nfor t in range(B):\n    ce = ce + F.cross_entropy(student[t], labels[t])\n"
    )
    found = positions.loop(loop)
    assert found.dim == 1 and positions.losses(loop.body, found) == []  # a loop over samples


FREE_RUNNING = """\
emb, cell, head = nn.Embedding(V, 4), nn.GRUCell(4, 4), nn.Linear(4, V)
h, token, loss = torch.zeros(B, 4), labels[:, 0], 0.0
for t in range(1, S):
    h = cell(emb(token), h)
    out = head(h)
    loss += F.cross_entropy(out, labels[:, t])
    token = out.argmax(-1)
"""


def test_free_running_decoding_that_feeds_its_prediction_back_is_not_batched():
    _, loop, positions = read(FREE_RUNNING)
    found = positions.loop(loop)
    assert positions.losses(loop.body, found)  # a loss per position ...
    assert positions.recurrent(loop)  # ... on what the position before made
    with pytest.raises(NotBatched):
        positions.cross_entropy_loop(loop, found)
    with pytest.raises(NotBatched):
        positions.summed_loop(loop, found)


TEACHER_FORCED = """\
lm = nn.Linear(V, V).double()
loss = 0.0
for t in range(1, S):
    loss = loss + F.cross_entropy(lm(student[:, :t].mean(1)), labels[:, t])
"""


def test_a_model_run_on_each_prefix_is_teacher_forcing():
    _, loop, positions = read(TEACHER_FORCED)
    found = positions.loop(loop)
    assert positions.teacher_forced(loop.body, found) and not positions.recurrent(loop)
    with pytest.raises(NotBatched, match="its own prefix"):
        positions.cross_entropy_loop(loop, found)


LAST_K = """\
K = 3
parts = []
for k in range(K):
    parts.append(F.cross_entropy(student[:, -K + k], labels[:, k], label_smoothing=0.05))
loss = sum(parts)
"""


def test_the_last_k_positions_appended_and_summed():
    context, loop, positions = read(LAST_K)
    term = positions.cross_entropy_loop(loop, positions.loop(loop))
    assert term.appended and term.target.value == "parts"
    assert term.term.loss.keywords == {"label_smoothing": "0.05"} and term.term.loss.ignore_index == "-100"
    inputs, targets = positions.operands(term.term, positions.loop(loop))
    assert (inputs, targets) == ("student[:, -K:]", "labels[:, :K]")
    collected = collected_list(context, loop, term.target)
    assert collected.problem is None and not collected.stacked
    assert context.module.code_for_node(collected.call) == "sum(parts)"
    scope: dict = {}
    exec(HEAD + LAST_K, scope)
    per_token = torch.nn.functional.cross_entropy(
        eval(f"{inputs}.flatten(0, 1)", scope),
        eval(f"{targets}.flatten(0, 1)", scope),
        reduction="none",
        label_smoothing=0.05,
    )
    torch.testing.assert_close(per_token.view(3, -1).mean(0).sum(), scope["loss"], rtol=RTOL, atol=0)


def test_zip_rows_and_a_generator_are_position_loops():
    _, loop, positions = read("loss = sum(F.nll_loss(a, b) for a, b in zip(student.unbind(1), labels.unbind(1)))\n")
    found = positions.loop(loop)
    assert found.var is None and set(found.rows) == {"a", "b"}
    assert positions.losses(loop.elt, found)
    _, loop, positions = read("loss = sum(F.nll_loss(a, b) for a, b in zip(student.unbind(0x1), labels.unbind(1)))\n")
    assert set(positions.loop(loop).rows) == {"a", "b"}  # dim 1, however spelled
    _, loop, positions = read("for b in range(B):\n    loss = F.cross_entropy(student[b], labels[b])\n")
    assert not positions.losses(loop.body, positions.loop(loop))  # a loop over samples


@pytest.mark.parametrize(
    "after, problem",
    [
        ("out = torch.stack(vals)\n", None),
        ("print(len(vals))\nout = sum(vals)\n", "read more than once after the loop"),
        ("out = torch.cat(vals)\n", "other than by `torch.stack` or `sum`"),
    ],
)
def test_a_list_collected_after_the_loop(after, problem):
    body = "vals = []\nfor t in range(S):\n    vals.append(student[:, t].sum())\n" + after
    context, loop, _ = read(body)
    statement = loop.body.body[0].body[0]
    name, _ = appended(statement)
    collected = collected_list(context, loop, name)
    if problem is None:
        assert collected.problem is None and collected.stacked
    else:
        assert problem in collected.problem and collected.call is None


def test_a_list_not_made_right_before_the_loop():
    body = "vals = []\nvals = []\nfor t in range(S):\n    vals.append(student[:, t].sum())\nout = sum(vals)\n"
    context, loop, _ = read(body)
    name = loop.body.body[0].body[0].value.func.value
    assert "bound more than once" in collected_list(context, loop, name).problem


def test_added_terms_and_names_read_after_the_loop():
    context = FileContext.of_source("x = 0\nx += 2\nx = x + 3\nx = 3 + x\n")
    statements = [line.body[0] for line in context.module.body]
    assert [added(s) is not None for s in statements] == [False, True, True, False]
    for body, outlives in [
        ("print(t)\n", True),
        ("t = 0\nprint(t)\n", False),
        ("for t in range(2):\n    pass\n", False),
    ]:
        context, loop, _ = read("for t in range(S):\n    pass\n" + body)
        assert read_after(context, loop, loop.target) is outlives


def test_loss_arguments_come_from_the_torch_table():
    source = HEAD + (
        "kl = nn.KLDivLoss(reduction='batchmean', log_target=True)\n"
        "a = kl(student, teacher)\n"
        "b = F.mse_loss(student, teacher, reduction='batchmean')\n"
        "c = F.smooth_l1_loss(student, teacher, beta=0.5)\n"
        "d = F.l1_loss(student, teacher, size_average=False)\n"
        "e = F.mse_loss(student)\n"
    )
    context = FileContext.of_source(source)
    calls = {
        line.body[0].targets[0].target.value: line.body[0].value
        for line in context.module.body
        if isinstance(line, cst.SimpleStatementLine)
        and isinstance(line.body[0], cst.Assign)
        and isinstance(line.body[0].targets[0].target, cst.Name)
    }
    losses = loss_calls(context)
    a = losses.arguments(calls["a"])
    assert (a.reduction, list(a.keywords), a.problem) == ("batchmean", ["log_target"], None)
    assert a.constructor is not None and a.facts.functional == "kl_div"
    assert "not one of the loss's" in losses.arguments(calls["b"]).problem  # mse takes no batchmean
    c = losses.arguments(calls["c"])
    assert (c.reduction, list(c.keywords), c.problem) == ("mean", ["beta"], None)
    d = losses.arguments(calls["d"])  # the legacy spelling of reduction="sum"
    assert (d.reduction, list(d.keywords), d.problem) == ("sum", [], None)
    assert "not both given" in losses.arguments(calls["e"]).problem
    assert losses.arguments(calls["kl"]) is None  # building the module computes no loss


def test_scalars_are_python_numbers_the_code_shows():
    source = "import torch\nk, w = 2, torch.ones(3)\ndef f(a: int, b=0.5, c=None):\n    return a * b + k, c, w\n"
    context = FileContext.of_source(source)
    slices = position_slices(context)
    returned = next(iter(context.index.find(cst.Return, within=context.module))).value.elements
    assert slices.scalar(returned[0].value)  # a * b + k
    assert not slices.scalar(returned[1].value)  # c: None by default
    assert not slices.scalar(returned[2].value)  # w: a tensor


def test_an_attribute_set_from_a_number_parameter_is_a_scalar():
    source = (
        "import torch\n"
        "class Distill:\n"
        "    def __init__(self, temperature=2.0, scale=None):\n"
        "        self.T = temperature\n"
        "        self.w = torch.ones(3) if scale is None else scale\n"
        "    def loss(self, x):\n"
        "        return x / self.T, x * self.w\n"
        "d = Distill()\n"
    )
    context = FileContext.of_source(source)
    slices = position_slices(context)
    returned = next(iter(context.index.find(cst.Return, within=context.module))).value.elements
    assert slices.scalar(returned[0].value.right)  # self.T: 2.0 by default, and the one call passes nothing
    assert not slices.scalar(returned[1].value.right)  # self.w: a tensor


def test_the_check_can_fail():
    _, loop, positions = read(MASKED)
    batched = positions.summed_loop(loop, positions.loop(loop)).batched
    assert "* pad[:, 1:S]" in batched
    with pytest.raises(AssertionError):
        run(MASKED, "total", batched.replace("* pad[:, 1:S]", ""))  # the mask left out
    with pytest.raises(AssertionError):
        run(MASKED, "total", batched.replace("pad[:, 1:S]", "pad[:, :S - 1]"))  # the mask one position early

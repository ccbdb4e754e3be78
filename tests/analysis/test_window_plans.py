"""`batch_windows`: the batches a step loop over a counter cuts by hand, over which
tensors, whether a DataLoader over them gives the same batches (or why not), the loop
variables its items take; a generator's windows and where step loops run a function
once per step. `batch_draws`: random batches drawn afresh every step."""

import libcst as cst
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from codemod.analysis.batch_draws import batch_draws
from codemod.analysis.batch_windows import batch_windows, names_in
from codemod.context import FileContext

HEAD = """\
import random
import numpy as np
import torch
feats = torch.randn(90, 5)
labels = torch.randn(90, 2)
net = torch.nn.Linear(5, 2)
sgd = torch.optim.SGD(net.parameters(), lr=0.1)
width = 12
"""
TRAIN = "    err = ((net(a) - b) ** 2).mean()\n    err.backward()\n    sgd.step()\n    sgd.zero_grad()\n"


def step_loop(source: str):
    context = FileContext.of_source(source)
    (loop,) = [loop for loop in context.loops.step_loops if isinstance(loop, cst.For)]
    return context, loop


def plan_of(body: str):
    context, loop = step_loop(HEAD + body)
    return context, batch_windows(context).of(loop)


def indent(code: str) -> str:
    return "".join("    " + line + "\n" if line else "\n" for line in code.splitlines())


# -- windows a DataLoader gives, and the batches it gives --------------------------------


@pytest.mark.parametrize(
    "header,cut,drop_last",
    [
        ("for k in range(0, feats.shape[0], width):", "[k:k + width]", False),
        ("for k in range(0, len(feats) - width + 1, width):", "[k:k + width]", True),
        ("for k in range(feats.size(0) // width):", "[k * width:(k + 1) * width]", True),
        ("for n, k in enumerate(range(0, len(feats), width)):", "[width + k:k + width]", None),
    ],
)
def test_windows_of_the_whole_data_are_a_loaders_batches(header, cut, drop_last):
    body = f"{header}\n    a = feats{cut}\n    b = labels{cut}\n" + TRAIN
    context, plan = plan_of(body)
    if drop_last is None:  # `[width + k:...]` does not start at the counter: no window
        assert plan.problem == "" and plan.windows == []
        return
    assert plan.problem is None
    assert plan.tensors == ["feats", "labels"] and context.source(plan.batch_size) == "width"
    assert plan.window.drop_last is drop_last and plan.permutation is None
    rebinding = batch_windows(context).rebinding(plan, names_in(context.code))
    assert rebinding.variables == {"feats": "a", "labels": "b"} and len(rebinding.removed) == 2
    # the DataLoader the plan names gives the batches the slices gave
    feats, start = torch.randn(90, 5), {False: range(0, 90, 12), True: range(0, 90 - 12 + 1, 12)}[drop_last]
    loader = DataLoader(TensorDataset(feats), batch_size=12, shuffle=False, drop_last=drop_last)
    batches = [xb for (xb,) in loader]
    assert len(batches) == len(start)
    assert all(torch.equal(xb, feats[k : k + 12]) for xb, k in zip(batches, start))


def test_a_permutation_drawn_each_epoch_is_shuffled_batches_and_its_index_statement_goes():
    body = "for epoch in range(2):\n    order = torch.randperm(len(feats))\n" + indent(
        "for k in range(0, len(feats), width):\n    pick = order[k:k + width]\n    a, b = feats[pick], labels[pick]\n"
        + TRAIN
    )
    context, plan = plan_of(body)
    assert plan.problem is None and plan.permutation == "order" and plan.tensors == ["feats", "labels"]
    windows = batch_windows(context)
    rebinding = windows.rebinding(plan, names_in(context.code))
    assert rebinding.variables == {"feats": "a", "labels": "b"}
    removed = {context.source(line).strip() for line in rebinding.removed}
    assert removed == {"pick = order[k:k + width]", "a, b = feats[pick], labels[pick]"}
    anchor = windows.anchor_for(plan.loop, {"feats", "labels", "width"})
    assert context.source(windows.unused_permutation(plan, anchor)).strip() == "order = torch.randperm(len(feats))"


@pytest.mark.parametrize(
    "body,reason",
    [
        (
            "order = torch.randperm(90)\nfor epoch in range(2):\n"
            + indent(
                "for k in range(0, 90, width):\n    a, b = feats[order[k:k + width]], labels[order[k:k + width]]\n"
            )
            + indent(TRAIN),
            "the permutation is drawn once and reused in every epoch",
        ),
        (
            "for k in range(0, 60, width):\n    a, b = feats[k:k + width], labels[k:k + width]\n" + TRAIN,
            "the range `60` is not the length of `feats` / `labels`",
        ),
        (
            "for k in range(0, len(feats), width):\n    a, b = feats[k:k + width], labels[k:k + width]\n"
            "    print(k)\n" + TRAIN,
            "`k` is used for more than slicing",
        ),
        (
            "stream = torch.randint(0, 5, (91,))\nfor k in range(0, len(stream) - 1, width):\n"
            "    a, b = stream[k:k + width], stream[k + 1:k + width + 1]\n" + TRAIN,
            "`stream[k + 1:k + width + 1]` (line 11) is a second window of `stream` at another offset than the "
            "batch `stream[k:k + width]` (inputs and their shifted targets from one stream)",
        ),
        (
            "for k in range(0, len(feats), width):\n    a, b = feats[k:k + width], labels[k:k + width]\n"
            "    a.mul_(2)\n" + TRAIN,
            "the batch `a` is written in place",
        ),
        (
            "seq = torch.randn(4, 90, 5)\nfor k in range(0, 80, width):\n    a = seq[:, k:k + width]\n"
            "    b = labels[:4]\n" + TRAIN,
            "cuts windows along dimension 1",
        ),
    ],
)
def test_windows_no_loader_gives_say_why(body, reason):
    _, plan = plan_of(body)
    assert plan.problem and reason in plan.problem


def test_the_first_rows_of_a_tensor_are_covered_by_their_count():
    body = (
        "cut = int(0.75 * len(feats))\ntrain_x, train_y = feats[:cut], labels[:cut]\n"
        "for k in range(0, cut, width):\n    a, b = train_x[k:k + width], train_y[k:k + width]\n" + TRAIN
    )
    _, plan = plan_of(body)
    assert plan.problem is None and plan.tensors == ["train_x", "train_y"]


# -- windows that are not to change -----------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        # truncated BPTT along time, the state carried from one window to the next
        "tokens = torch.randint(0, 9, (3, 400))\nrnn = torch.nn.RNN(1, 4, batch_first=True)\nh = None\n"
        "for t in range(0, tokens.size(1) - 1, 25):\n    a = tokens[:, t:t + 25].float().unsqueeze(-1)\n"
        "    if h is not None:\n        h = h.detach()\n    out, h = rnn(a, h)\n"
        "    err = out.pow(2).mean()\n    err.backward()\n    sgd.step()\n",
        # consecutive chunks of one stream, each sample continuing the state the last one left
        "state = torch.zeros(1, 2)\nfor k in range(0, len(feats), width):\n    a, b = feats[k:k + width], labels[k:k + width]\n"
        "    err = 0.0\n    for j in range(a.size(0)):\n        state = torch.tanh(net(a[j:j + 1]) + state)\n"
        "        err = err + ((state - b[j:j + 1]) ** 2).mean()\n    state = state.detach()\n"
        "    err.backward()\n    sgd.step()\n    sgd.zero_grad()\n",
        # batches on the device: a slice is already the fastest batch
        "feats, labels = feats.cuda(), labels.cuda()\nfor k in range(0, len(feats), width):\n"
        "    a, b = feats[k:k + width], labels[k:k + width]\n" + TRAIN,
    ],
    ids=["tbptt-over-time", "stream-state-per-sample", "on-the-device"],
)
def test_windows_left_alone(body):
    _, plan = plan_of(body)
    assert plan.problem == ""


def test_running_sums_are_no_carried_state():
    body = "seen = 0\nfor k in range(0, len(feats), width):\n    a, b = feats[k:k + width], labels[k:k + width]\n"
    body += TRAIN + "    seen = seen + a.size(0)\n"
    _, plan = plan_of(body)
    assert plan.problem is None


# -- generators and helpers run once per step --------------------------------------------


def test_a_generators_windows_and_the_loops_that_iterate_it():
    source = HEAD + (
        "def chunks():\n    for k in range(0, len(feats), width):\n        yield feats[k:k + width], labels[k:k + width]\n"
        "\n\nfor epoch in range(2):\n    for a, b in chunks():\n" + indent(TRAIN)
    )
    context = FileContext.of_source(source)
    function = next(f for f in context.index.find(cst.FunctionDef) if f.name.value == "chunks")
    plan, sites = batch_windows(context).in_generator(function)
    assert plan.problem is None and plan.tensors == ["feats", "labels"]
    assert [context.line(site) for site in sites] == [source.splitlines().index("    for a, b in chunks():") + 1]


def test_a_helper_of_a_step_function_runs_once_per_step_an_evaluation_helper_does_not():
    source = HEAD + (
        "def pick():\n    return feats[:4], labels[:4]\n\n\ndef train_step():\n    a, b = pick()\n"
        + TRAIN
        + "\n\ndef evaluate():\n    for _ in range(3):\n        pick()\n\n\nfor step in range(5):\n    train_step()\n"
        "    evaluate()\n"
    )
    context = FileContext.of_source(source)
    pick = next(f for f in context.index.find(cst.FunctionDef) if f.name.value == "pick")
    sites = batch_windows(context).per_step_sites(pick)
    assert [context.source(site) for site in sites] == ["pick()"]
    assert context.line(sites[0]) == source.splitlines().index("    a, b = pick()") + 1


# -- random draws ------------------------------------------------------------------------


def draw_in(body: str, head: str = HEAD):
    context = FileContext.of_source(head + body)
    draws = [batch_draws(context).of(call) for call in context.index.find(cst.Call)]
    return context, [draw for draw in draws if draw is not None]


def test_a_generator_objects_draw_in_the_step_loop():
    context, (draw,) = draw_in(
        "gen = np.random.default_rng(3)\nfor step in range(10):\n    pick = gen.integers(0, len(feats), width)\n"
        "    a, b = feats[pick], labels[pick]\n" + TRAIN
    )
    assert draw.spelled == "gen.integers" and draw.function is None
    assert batch_draws(context).draw_kind(draw.call) == "numpy.random.randint"


def test_a_generator_handed_to_a_helper_draws_there_for_every_step():
    body = (
        "def sample(rng):\n    rows = rng.sample(range(len(feats)), 8)\n    return feats[rows], labels[rows]\n\n\n"
        "for step in range(10):\n    a, b = sample(random.Random(1))\n" + TRAIN
    )
    context, (draw,) = draw_in(body)
    assert draw.spelled == "rng.sample" and draw.function.name.value == "sample"
    assert [context.source(site) for site in draw.sites] == ["sample(random.Random(1))"]


@pytest.mark.parametrize(
    "body",
    [
        # timesteps, not samples: the bound is no length of data
        "for step in range(10):\n    t = torch.randint(0, 50, (width,))\n    a, b = feats[:width] * t[:, None], labels[:width]\n"
        + TRAIN,
        # drawn once, before the loop
        "pick = torch.randint(0, len(feats), (width,))\na, b = feats[pick], labels[pick]\nfor step in range(10):\n"
        + TRAIN,
        # a generator object of unknown family: bound to two kinds
        "gen = random.Random(0) if width else np.random.default_rng(0)\nfor step in range(10):\n"
        "    pick = gen.choice(len(feats), width)\n    a, b = feats[pick], labels[pick]\n" + TRAIN,
    ],
    ids=["timesteps", "before-the-loop", "unknown-generator"],
)
def test_no_batch_draw(body):
    _, draws = draw_in(body)
    assert draws == []

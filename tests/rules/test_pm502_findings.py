"""PM502: what the rule leaves alone, what it reports without a fix and why.

The fixtures under fixtures/rules/PM502 whose output equals their input are the
negative cases; the snippets below pin the reasons one precondition at a time.
"""

from pathlib import Path

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.per_sample_forward_loop import PREAMBLE, PerSampleForwardLoop

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM502"
LOOP = "for i in range(len(x)):\n    out = model(x[i:i+1])\n    loss = F.cross_entropy(out, y[i:i+1])\n    loss.backward()\n"


def findings(source: str):
    result = process_source(
        source.encode(), "<test>", Settings(select=("PM502",), level=Level.UNSAFE), [PerSampleForwardLoop]
    )
    assert result.error is None, result.error
    return result.findings, result.new_source.decode()


@pytest.mark.parametrize(
    "case,reason",
    [
        ("batchnorm_model", "has BatchNorm"),
        ("per_sample_branch", "branches on the values of a sample"),
    ],
)
def test_reported_fixtures_are_left_as_they_are_with_the_reason(case, reason):
    source = (FIXTURES / f"{case}.in.py").read_text()
    found, output = findings(source)
    assert len(found) == 1 and not found[0].fixable and reason in found[0].message
    assert output == source


@pytest.mark.parametrize(
    "case", ["metric_loop", "per_sample_sgd", "maml_inner_loop", "carried_context", "helper_steps_per_sample"]
)
def test_metric_loops_per_sample_steps_and_gradients_are_not_reported(case):
    """A loop that must run sample by sample (its own optimizer step, a gradient per
    task, a context one sample hands the next; also when the model is a parameter or
    the step is in a helper) gets no advice to run it once on the whole batch."""
    source = (FIXTURES / f"{case}.in.py").read_text()
    assert findings(source) == ([], source)


@pytest.mark.parametrize(
    "loop,reason",
    [
        (LOOP + "print(out.shape)\n", "`out` is read after the loop"),
        (LOOP + "    seen += 1\n", "`seen += 1` runs once per sample"),
        (LOOP.replace("out = model(x[i:i+1])", "out = model(x[i])"), "`F.cross_entropy(out, y[i:i+1])` may mean"),
        (LOOP.replace("F.cross_entropy(out, ", "F.cross_entropy(out[0], "), "may mean something else for a batch"),
        (LOOP.replace("F.cross_entropy(out, y[i:i+1])", "F.cross_entropy(out, y[i:i+1], weight=w)"), "class weights"),
        (
            LOOP.replace("F.cross_entropy(out, y[i:i+1])", "F.cross_entropy(out, y[i:i+1], reduction=mode)"),
            "not a literal",
        ),
        (
            LOOP.replace("F.cross_entropy(out, y[i:i+1])", "my_loss(out, y[i:i+1])"),
            "`(a - b)` may mean something else for a batch",
        ),
        (
            LOOP.replace("F.cross_entropy(out, y[i:i+1])", "F.cross_entropy(out, y[i:i+1]).exp()"),
            "may mean something else for a batch",
        ),
    ],
)
def test_unproven_preconditions_are_reported_without_a_fix(loop, reason):
    source = (
        PREAMBLE + "w = torch.ones(3)\nmode = 'mean'\nseen = 0\ndef my_loss(a, b):\n    return (a - b).sum()\n" + loop
    )
    found, output = findings(source)
    assert len(found) == 1 and not found[0].fixable, found
    assert reason in found[0].message, found[0].message
    assert output == source


def test_a_model_passed_in_is_reported_because_its_class_is_unseen():
    source = (
        PREAMBLE
        + "def train(net, x, y):\n"
        + "".join("    " + line + "\n" for line in LOOP.replace("model(", "net(").splitlines())
    )
    found, output = findings(source)
    assert len(found) == 1 and not found[0].fixable and "`net` is not built once in this file" in found[0].message


def test_a_submodule_of_an_unseen_class_is_reported():
    source = (
        PREAMBLE.replace("self.fc = nn.Linear(4, 3)", "self.fc = Block(4, 3)").replace(
            "from torch import nn\n", "from torch import nn\nfrom blocks import Block\n"
        )
        + LOOP
    )
    found, _ = findings(source)
    assert len(found) == 1 and not found[0].fixable and "submodule built by `Block`" in found[0].message


@pytest.mark.parametrize(
    "loop",
    [
        "for i in range(4):\n    loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1])\n    loss.backward()\n",
        "for i in range(len(x)):\n    loss = F.cross_entropy(model(x[i:i+2]), y[i:i+2])\n    loss.backward()\n",
    ],
)
def test_loops_not_over_the_batch_size_are_not_per_sample(loop):
    """A literal count that is not the batch's row count (x has 8) visits some of its
    samples; a window of two is not one sample."""
    found, _ = findings(PREAMBLE + loop)
    assert [f for f in found if f.fixable] == []


def test_mean_loss_kept_divided_by_something_else_keeps_the_division():
    loop = LOOP.replace("    loss.backward()\n", "    loss = loss / accumulation\n    loss.backward()\n")
    found, output = findings(PREAMBLE + "accumulation = 4\n" + loop)
    assert len(found) == 1 and found[0].applied
    # one class target a sample (`y` of shape (8,)): each sample's mean is its loss, torch's sum adds them up
    assert 'loss = F.cross_entropy(out, y, reduction="sum")\nloss = loss / accumulation\nloss.backward()\n' in output


def test_a_list_of_samples_is_reported_because_its_rows_may_differ_in_length():
    loop = LOOP.replace("x[i:i+1]", "seqs[i].unsqueeze(0)").replace("len(x)", "len(seqs)")
    source = PREAMBLE + "seqs = [torch.randn(n, 4) for n in (2, 3)]\n" + loop
    found, output = findings(source)
    assert len(found) == 1 and not found[0].fixable and "is a Python list or tuple" in found[0].message
    assert output == source


def in_function(loop: str, name: str = "train") -> str:
    return f"def {name}(net, x, y):\n" + "".join(
        "    " + line + "\n" for line in loop.replace("model(", "net(").splitlines()
    )


def test_a_model_passed_in_is_fixed_when_every_caller_passes_one_built_here():
    source = PREAMBLE + in_function(LOOP) + "train(model, x, y)\ntrain(Net(), x, y)\n"
    found, output = findings(source)
    assert len(found) == 1 and found[0].applied, found
    assert "    out = net(x)\n" in output and "for i in" not in output


def test_a_model_passed_in_from_a_class_of_another_module_is_reported():
    source = (
        PREAMBLE + "from mylib import Encoder\n" + in_function(LOOP) + "train(model, x, y)\ntrain(Encoder(), x, y)\n"
    )
    found, output = findings(source)
    assert len(found) == 1 and not found[0].fixable and "class not defined in this file" in found[0].message
    assert output == source


UNBATCHED = (
    "z = torch.randn(8, 3)\nfor i in range(len(x)):\n    loss = F.mse_loss(model(x[i]), z[i])\n    loss.backward()\n"
)


def test_a_sample_without_its_batch_dimension_is_batched_when_every_layer_counts_dims_from_the_end():
    found, output = findings(PREAMBLE + UNBATCHED)
    assert len(found) == 1 and found[0].applied, found
    assert output == PREAMBLE + "z = torch.randn(8, 3)\nloss = F.mse_loss(model(x), z) * len(x)\nloss.backward()\n"


@pytest.mark.parametrize(
    "forward,reason",
    [
        ("return self.fc(x - x.mean(0))", "`Net.forward` reads `x.mean(0)`, which counts a dim from the front"),
        (
            "return self.fc(x).view(1, -1)",
            "`Net.forward` reads `self.fc(x).view(1, -1)`, which counts a dim from the front",
        ),
        ("return self.fc(x[0:4])", "`Net.forward` reads `x[0:4]`, which counts a dim from the front"),
        ("return self.fc(x) / x.sum()", "`Net.forward` reads `x.sum()`, which counts a dim from the front"),
    ],
)
def test_a_sample_without_its_batch_dimension_is_reported_when_the_model_reads_dims_from_the_front(forward, reason):
    source = PREAMBLE.replace("return self.fc(x)", forward) + UNBATCHED
    found, output = findings(source)
    assert len(found) == 1 and not found[0].fixable, found
    assert reason in found[0].message, found[0].message
    assert output == source


def test_a_sample_without_its_batch_dimension_is_reported_for_a_layer_with_a_batch_convention():
    """`nn.GRU` reads a 2-D input as (T, H) unbatched and a 3-D one as (T, B, H): batching a
    row adds its dimension in front, where the layer reads time."""
    source = (
        PREAMBLE.replace("self.fc = nn.Linear(4, 3)", "self.fc = nn.GRU(4, 3)").replace(
            "return self.fc(x)", "out, _ = self.fc(x)\n        return out"
        )
        + UNBATCHED
    )
    found, output = findings(source)
    assert len(found) == 1 and not found[0].fixable, found
    assert "`nn.GRU` is not a layer known to act on the last dimensions" in found[0].message
    assert output == source


HELPER = (
    "def step(net, xs, ys):\n    loss = F.cross_entropy(net(xs), ys)\n    loss.backward()\n    return loss.item()\n"
)


def test_a_train_step_helper_called_elsewhere_too_is_reported():
    source = (
        PREAMBLE + HELPER + "for i in range(len(x)):\n    total += step(model, x[i:i+1], y[i:i+1])\nstep(model, x, y)\n"
    )
    found, output = findings(source)
    assert len(found) == 1 and not found[0].fixable, found
    assert "`step` is called elsewhere too" in found[0].message
    assert output == source


def test_a_train_step_helper_whose_result_is_unused_is_batched():
    source = PREAMBLE + HELPER + "for i in range(len(x)):\n    step(model, x[i:i+1], y[i:i+1])\n"
    found, output = findings(source)
    assert len(found) == 1 and found[0].applied, found
    assert output.endswith("    return loss.item()\nstep(model, x, y)\n")


@pytest.mark.parametrize(
    "kept",
    [
        "metrics = [0.0] * 8\nfor i in range(len(x)):\n    metrics[i] = ",
        "metrics = []\nfor i in range(len(x)):\n    metrics.append(",
    ],
)
def test_a_train_step_helper_whose_result_is_kept_per_sample_is_reported(kept):
    """Report 004's own loop, `metrics[i] = train_step_with_metrics(batch[i], lr)`: batched,
    one call gives one result where the list held one per sample."""
    call = "step(model, x[i:i+1], y[i:i+1])" + (")" if kept.endswith("(") else "")
    source = PREAMBLE + HELPER + kept + call + "\n"
    found, output = findings(source)
    assert len(found) == 1 and not found[0].fixable, found
    assert "the result of `step` is kept for each sample" in found[0].message
    assert output == source


TRAIN_MODULE = PREAMBLE.replace("model = Net()\n", "").replace(
    "x, y = torch.randn(8, 4), torch.randint(3, (8,))\ntotal = 0.0\n", ""
) + in_function(LOOP)


@pytest.mark.parametrize(
    "main,fixed",
    [
        ("from train import Net, train\nmodel = Net().double()\ntrain(model, x, y)\n", True),
        ("from train import train\nfrom mylib import Encoder\ntrain(Encoder(), x, y)\n", False),
    ],
)
def test_a_model_passed_in_by_a_module_that_imports_the_loop_is_followed_there(tmp_path, main, fixed):
    """`train(model, ...)` called only from main.py beside train.py: the model main.py builds
    is the one the loop runs; batched when it is a class of train.py."""
    (tmp_path / "main.py").write_text("import torch\nx, y = torch.randn(8, 4), torch.randint(3, (8,))\n" + main)
    path = tmp_path / "train.py"
    path.write_text(TRAIN_MODULE)
    result = process_source(
        path.read_bytes(), str(path), Settings(select=("PM502",), level=Level.UNSAFE), [PerSampleForwardLoop]
    )
    assert [f.applied for f in result.findings] == [fixed], result.findings
    if not fixed:
        assert "`net` is not built once in this file" in result.findings[0].message


def test_a_model_passed_in_here_and_by_a_module_beside_it_is_checked_in_both(tmp_path):
    """train.py calls `train(model, ...)` with its own Net; main.py beside it calls it with a
    model of another library: that call is batched too, so the loop is reported."""
    (tmp_path / "main.py").write_text(
        "import torch\nfrom train import train\nfrom mylib import Encoder\n"
        "train(Encoder(), torch.randn(8, 4), torch.randint(3, (8,)))\n"
    )
    path = tmp_path / "train.py"
    path.write_text(TRAIN_MODULE + "train(Net(), torch.randn(8, 4), torch.randint(3, (8,)))\n")
    result = process_source(
        path.read_bytes(), str(path), Settings(select=("PM502",), level=Level.UNSAFE), [PerSampleForwardLoop]
    )
    assert [f.fixable for f in result.findings] == [False], result.findings


def test_a_literal_count_that_is_the_batchs_row_count_visits_its_samples():
    """`range(8)` over `x = torch.randn(8, 4)`: every sample once, in order; batched."""
    loop = "for i in range(8):\n    loss = F.cross_entropy(model(x[i:i+1]), y[i:i+1])\n    loss.backward()\n"
    found, output = findings(PREAMBLE + loop)
    assert [f.fixable for f in found] == [True], found
    assert "range(8)" not in output and "model(x)" in output, output


COLLECTED = (
    "def score():\n    losses = []\n    for i in range(len(x)):\n"
    "        losses.append(F.cross_entropy(model(x[i:i+1]), y[i:i+1]))\n"
    "    return torch.stack(losses).mean()\n\n\nscore().backward()\n"
)


def test_losses_collected_per_sample_are_batched_unless_autograd_records_no_graph_there():
    found, _ = findings(PREAMBLE + COLLECTED)
    assert [f.code for f in found] == ["PM502"]  # the collected losses are backpropagated
    scored = COLLECTED.replace("def score():", "@torch.no_grad()\ndef score():").replace(
        "score().backward()", "print(score())\nmodel(x).sum().backward()"
    )
    assert findings(PREAMBLE + scored)[0] == []
    within = COLLECTED.replace("    for i in range", "    with torch.no_grad():\n      for i in range").replace(
        "        losses.append", "          losses.append"
    )
    assert (
        findings(PREAMBLE + within.replace("score().backward()", "print(score())\nmodel(x).sum().backward()"))[0] == []
    )

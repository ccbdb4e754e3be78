"""PM502: the batched rewrite trains the same model as the per-sample loop.

The fixtures train in float64 on the CPU and return the losses they log and the
model. The batched forward sums the same per-sample terms in another order
(one matrix product over the batch instead of B matrix-vector products), so
logged losses and weights agree to rounding: the largest relative differences
measured (torch 2.13, CPU) were 4.2e-16 for the logged losses and 3.0e-16 for
the weights after the last optimizer step (relative to each parameter's largest
entry; AdamW, SGD with and without momentum, Adam). RTOL = 1e-10 leaves five
orders of magnitude of headroom; a wrong gradient scale (the batch mean without
the factor B) is off by a factor of B, and B times the batch mean of padded
sequences by more than 1e-3 relative, so both would fail
(test_the_batch_mean_alone_gives_one_b_th_of_the_gradient,
test_with_padding_the_batch_mean_times_b_is_not_the_loop).
"""

import re
from pathlib import Path

import pytest
import torch

from codemod.rule import Level
from codemod.rules.per_sample_forward_loop import PerSampleForwardLoop
from tests.rules.scripts import one_thread, rewrite

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM502"
REWRITTEN = [
    "seed_lm_per_sequence",
    "zip_regression",
    "summed_classifier",
    "padded_sequences",
    "model_parameter",  # the model reaches the loop as a parameter of the training function
    "unbatched_sequence",  # `model(seq[:-1])`: samples without a batch dimension
    "helper_step",  # forward and backward in a helper called per sample (report 004)
]
RTOL = 1e-10


def load_main(source: str):
    namespace = {"__name__": "fixture"}
    exec(compile(source, "<fixture>", "exec"), namespace)
    return namespace["main"]


def train(source: str):
    with one_thread():
        losses, model = load_main(source)()
    return torch.tensor(losses, dtype=torch.float64), dict(model.named_parameters())


@pytest.mark.parametrize("case", REWRITTEN)
def test_batched_rewrite_logs_the_same_losses_and_trains_the_same_weights(case):
    source = (FIXTURES / f"{case}.in.py").read_text()
    new_source = rewrite(source, [PerSampleForwardLoop], level=Level.UNSAFE)
    assert new_source == (FIXTURES / f"{case}.out.py").read_text()
    want_losses, want_weights = train(source)
    got_losses, got_weights = train(new_source)
    assert len(want_losses) >= 6 and torch.isfinite(want_losses).all()
    assert want_losses[-1] < want_losses[0]  # it trains
    torch.testing.assert_close(got_losses, want_losses, rtol=RTOL, atol=0)
    assert want_weights.keys() == got_weights.keys()
    for name, want in want_weights.items():
        torch.testing.assert_close(got_weights[name], want, rtol=RTOL, atol=1e-13, msg=name)


def first_gradients(source: str) -> dict[str, torch.Tensor]:
    """The gradients of the first batch, as the first optimizer step would apply them."""
    source = source.replace(
        "        optimizer.step()\n", "        return {n: p.grad.clone() for n, p in model.named_parameters()}\n", 1
    )
    with one_thread():
        return load_main(source)()


@pytest.mark.parametrize("case", ["seed_lm_per_sequence", "padded_sequences", "unbatched_sequence", "helper_step"])
def test_first_gradient_is_the_per_sample_sum(case):
    source = (FIXTURES / f"{case}.in.py").read_text()
    want = first_gradients(source)
    got = first_gradients(rewrite(source, [PerSampleForwardLoop], level=Level.UNSAFE))
    for name in want:
        assert want[name].abs().sum() > 0, name
        torch.testing.assert_close(got[name], want[name], rtol=RTOL, atol=1e-14, msg=name)


BATCH_MEAN = "F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))"


def test_the_batch_mean_alone_gives_one_b_th_of_the_gradient():
    """The checks above can fail: without padding the plain batch mean is the
    summed gradient divided by B (the factor the rewrite keeps)."""
    new_source = rewrite(
        (FIXTURES / "seed_lm_per_sequence.in.py").read_text(), [PerSampleForwardLoop], level=Level.UNSAFE
    )
    statement = re.search(r"loss = \(\n\s*F\.cross_entropy.*?\.sum\(\)\n", new_source, re.S).group(0)
    naive = new_source.replace(statement, f"loss = {BATCH_MEAN}\n")
    summed, mean = first_gradients(new_source), first_gradients(naive)
    batch = 6  # BATCH of the fixture
    for name in summed:
        torch.testing.assert_close(mean[name] * batch, summed[name], rtol=RTOL, atol=1e-14)


def test_with_padding_the_batch_mean_times_b_is_not_the_loop():
    """Why the rewrite keeps per-sequence means: with -100 padding in different amounts,
    B times the mean over all tokens weighs long sequences more than the loop did."""
    source = (FIXTURES / "padded_sequences.in.py").read_text()
    new_source = rewrite(source, [PerSampleForwardLoop], level=Level.UNSAFE)
    statement = re.search(r"loss = \(\n\s*nn\.functional\.cross_entropy.*?\.mean\(\)\n", new_source, re.S).group(0)
    naive = new_source.replace(  # the fixture's criterion: CrossEntropyLoss(label_smoothing=0.1)
        statement,
        "loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), label_smoothing=0.1)\n",
    )
    want, got = first_gradients(source), first_gradients(naive)
    assert max(((got[n] - want[n]).abs().max() / want[n].abs().max()).item() for n in want) > 1e-3


def test_batchnorm_is_why_the_rule_reports_instead_of_fixing():
    """The reported fixture's model gives a batch other outputs than its samples one by one."""
    source = (FIXTURES / "batchnorm_model.in.py").read_text()
    namespace = {"__name__": "fixture"}
    exec(compile(source, "<fixture>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Tagger"]()
    x = torch.randn(4, 2, 5)
    one_by_one = torch.cat([model(x[i : i + 1]) for i in range(len(x))])
    assert not torch.allclose(model(x), one_by_one, rtol=1e-3)
    model.eval()  # with running statistics the samples are independent again
    assert torch.allclose(model(x), torch.cat([model(x[i : i + 1]) for i in range(len(x))]), atol=1e-6)


FIXED_EXAMPLES = [case for case in PerSampleForwardLoop.INVALID if case.expected_replacement is not None]


@pytest.mark.parametrize("case", FIXED_EXAMPLES, ids=[case.note or "first" for case in FIXED_EXAMPLES])
def test_every_fixed_example_keeps_the_gradients_and_the_logged_total(case):
    """The rule's own examples, run: same seed, same data, the loop against its
    rewrite (float32 here, so a tolerance of float32 rounding, 1e-5)."""
    results = []
    for source in (case.code, case.expected_replacement):
        namespace: dict = {}
        torch.manual_seed(0)
        with one_thread():
            exec(compile(source, "<example>", "exec"), namespace)
        grads = {n: p.grad.clone() for n, p in namespace["model"].named_parameters()}
        results.append((grads, float(namespace["total"])))
    (want, want_total), (got, got_total) = results
    for name in want:
        assert want[name].abs().sum() > 0
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)
    assert got_total == pytest.approx(want_total, rel=1e-5)


CLASSIFIER_STEP = """\
import torch
import torch.nn.functional as F
from torch import nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(6, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(F.relu(self.hidden(x)))


def train_step(model, x, y):
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    return loss.detach()


def run(model, opt, X, Y, bs=8):
    losses = []
    for b in range(0, X.size(0), bs):
        xb, yb = X[b:b + bs], Y[b:b + bs]
        opt.zero_grad()
        total = 0.0
        for i in range(xb.size(0)):
            total = total + train_step(model, xb[i:i + 1], yb[i:i + 1])
        opt.step()
        losses.append(float(total / xb.size(0)))
    return losses


def main():
    torch.manual_seed(0)
    X = torch.randn(48, 6, dtype=torch.float64)
    Y = torch.randint(0, 4, (48,))
    model = Classifier().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    return run(model, opt, X, Y), model
"""


def test_one_class_target_a_sample_becomes_torchs_summed_loss_and_trains_the_same():
    """A per-sample classification step in a helper (blind test 7, #17): `y` holds one class a
    sample, so each sample's mean is its loss and the batched loss is torch's own sum, not
    the per-sample means written out for padded sequences."""
    new_source = rewrite(CLASSIFIER_STEP, [PerSampleForwardLoop], level=Level.UNSAFE)
    assert '    loss = F.cross_entropy(logits, y, reduction="sum")\n' in new_source
    assert "!= -100" not in new_source and "train_step(model, xb, yb)" in new_source
    want_losses, want_weights = train(CLASSIFIER_STEP)
    got_losses, got_weights = train(new_source)
    assert len(want_losses) == 6 and torch.isfinite(want_losses).all()
    torch.testing.assert_close(got_losses, want_losses, rtol=RTOL, atol=0)
    for name, want in want_weights.items():
        torch.testing.assert_close(got_weights[name], want, rtol=RTOL, atol=1e-13, msg=name)

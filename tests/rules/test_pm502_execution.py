"""PM502: the batched rewrite trains the same model as the per-sample loop.

The fixtures train in float64 on the CPU and return the losses they log and the
model. The batched forward sums the same per-sample terms in another order
(one matrix product over the batch instead of B matrix-vector products), so
logged losses and weights agree to rounding: the largest relative differences
measured (torch 2.13, CPU) were 4.2e-16 for the logged losses and 3.0e-16 for
the weights after the last optimizer step (relative to each parameter's largest
entry; AdamW, SGD with momentum, Adam). RTOL =
1e-10 leaves five orders of magnitude of headroom; a wrong gradient scale (the
batch mean without the factor B) is off by a factor of B and fails at once
(test_without_the_factor_the_gradient_is_b_times_smaller).
"""

from pathlib import Path

import pytest
import torch

from codemod.rule import Level
from codemod.rules.per_sample_forward import PerSampleForwardLoop
from tests.rules.scripts import one_thread, rewrite

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM502"
REWRITTEN = ["seed_lm_per_sequence", "zip_regression", "summed_classifier"]
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


def test_first_gradient_is_the_per_sample_sum():
    """One batch, gradients compared directly: the seed LM's loop against its rewrite."""
    source = (FIXTURES / "seed_lm_per_sequence.in.py").read_text()
    new_source = rewrite(source, [PerSampleForwardLoop], level=Level.UNSAFE)
    grads = []
    for text in (source, new_source):
        # Stop at the first optimizer step and keep the gradients it would apply.
        text = text.replace("        optimizer.step()\n", "        return {n: p.grad.clone() for n, p in model.named_parameters()}\n", 1)
        with one_thread():
            grads.append(load_main(text)())
    want, got = grads
    for name in want:
        assert want[name].abs().sum() > 0, name
        torch.testing.assert_close(got[name], want[name], rtol=RTOL, atol=1e-14, msg=name)


def test_without_the_factor_the_gradient_is_b_times_smaller():
    """The check above can fail: the batch-mean loss alone gives 1/B of the summed gradient."""
    source = (FIXTURES / "seed_lm_per_sequence.in.py").read_text()
    new_source = rewrite(source, [PerSampleForwardLoop], level=Level.UNSAFE)
    naive = new_source.replace(" * inputs.size(0)", "")
    assert naive != new_source
    grads = []
    for text in (new_source, naive):
        text = text.replace("        optimizer.step()\n", "        return {n: p.grad.clone() for n, p in model.named_parameters()}\n", 1)
        with one_thread():
            grads.append(load_main(text)())
    batch = 6  # BATCH of the fixture
    for name, summed in grads[0].items():
        torch.testing.assert_close(grads[1][name] * batch, summed, rtol=RTOL, atol=1e-14)


def test_batchnorm_is_why_the_rule_reports_instead_of_fixing():
    """The reported fixture's model gives a batch other outputs than its samples one by one."""
    source = (FIXTURES / "batchnorm_model.in.py").read_text()
    namespace = {"__name__": "fixture"}
    exec(compile(source, "<fixture>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Tagger"]()
    x = torch.randn(4, 2, 5)
    one_by_one = torch.cat([model(x[i:i + 1]) for i in range(len(x))])
    assert not torch.allclose(model(x), one_by_one, rtol=1e-3)
    model.eval()  # with running statistics the samples are independent again
    assert torch.allclose(model(x), torch.cat([model(x[i:i + 1]) for i in range(len(x))]), atol=1e-6)

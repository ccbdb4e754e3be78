"""PM503 on the forms the seed systems write, each written from the issue that names
it before the rule was taught it: the masked per-position loss (each position's
unreduced loss times that position's mask, summed, divided by the mask's sum), and
per-position losses other than cross-entropy: the knowledge-distillation KL divergence
over the first K positions (`reduction="batchmean"`, divided by the batch), the mean
squared error per position.

Each rewrite runs against the loop it replaces, in float64 on the CPU, and must
give the same loss and gradient. The rewrite adds the same terms in another order,
so they agree to rounding (largest relative difference measured: below 1e-15);
RTOL = 1e-12 still fails on any change of scale (a mask left out, `batchmean`
read as a mean over every element, a slice one position short), which moves the
loss by 1e-2 or more (test_the_check_can_fail).
"""

import textwrap

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.per_position_loss_loop import PerPositionLossLoop
from tests.rules.scripts import one_thread, rewrite

RTOL = 1e-12

SETUP = """\
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
B, S, V = 5, 9, 7
logits = torch.randn(B, S, V, dtype=torch.float64, requires_grad=True)
y = torch.randint(V, (B, S))
mask = (torch.rand(B, S) > 0.3).to(torch.float64)
mask[:, 0] = 1.0
t_logits = torch.randn(B, S, V, dtype=torch.float64)
target = torch.randn(B, S, V, dtype=torch.float64)
"""

LOOPS = {
    "masked_cross_entropy": """\
loss = 0.0
for t in range(S):
    l = F.cross_entropy(logits[:, t], y[:, t], reduction="none")
    loss = loss + (l * mask[:, t]).sum()
loss = loss / mask.sum()
""",
    "masked_cross_entropy_augmented_first_k": """\
K = 4
loss = torch.zeros((), dtype=torch.float64)
for k in range(K):
    per_token = F.cross_entropy(logits[:, k, :], y[:, k], reduction="none")
    loss += (mask[:, k] * per_token).sum()
loss = loss / mask[:, :K].sum()
""",
    "masked_nll_shifted": """\
loss = 0.0
for t in range(S - 1):
    l = F.nll_loss(F.log_softmax(logits[:, t], -1), y[:, t + 1], reduction="none")
    loss = loss + (l * mask[:, t + 1]).sum()
loss = loss / mask[:, 1:].sum()
""",
    "kd_kl_div_batchmean": """\
K, T = 4, 2.0
loss = 0.0
for t in range(K):
    loss = loss + F.kl_div(F.log_softmax(logits[:, t] / T, -1), F.softmax(t_logits[:, t] / T, -1), reduction="batchmean")
loss = loss / K
""",
    "kd_through_names_scaled_by_tau_squared": """\
K, tau = 4, 1.5
total = torch.zeros((), dtype=torch.float64)
for t in range(K):
    teacher_probs = F.softmax(t_logits[:, t, :] / tau, dim=-1)
    student_log_probs = F.log_softmax(logits[:, t, :] / tau, dim=-1)
    total = total + F.kl_div(student_log_probs, teacher_probs, reduction="batchmean") * (tau * tau)
loss = total / K
""",
    "kl_div_sum": """\
loss = 0.0
for t in range(S):
    loss += F.kl_div(F.log_softmax(logits[:, t], -1), F.softmax(t_logits[:, t], -1), reduction="sum")
""",
    "mse_per_position": """\
K = 6
loss = 0.0
for t in range(K):
    loss = loss + F.mse_loss(logits[:, t], target[:, t])
loss = loss / K
""",
    "mse_module_per_position": """\
criterion = nn.MSELoss()
loss = 0.0
for t in range(2, S):
    loss += criterion(logits[:, t], target[:, t - 2])
""",
}


def run(source: str) -> tuple[torch.Tensor, torch.Tensor]:
    namespace: dict = {}
    with one_thread():
        exec(compile(source, "<snippet>", "exec"), namespace)
        namespace["loss"].backward()
    return namespace["loss"].detach(), namespace["logits"].grad


@pytest.mark.parametrize("name", list(LOOPS))
def test_the_rewrite_keeps_the_loss_and_its_gradient(name):
    source = SETUP + LOOPS[name]
    new_source = rewrite(source, [PerPositionLossLoop])
    assert "for " not in new_source[len(SETUP) :], new_source  # the loop is gone
    want_loss, want_grad = run(source)
    got_loss, got_grad = run(new_source)
    assert want_grad.abs().sum() > 0
    torch.testing.assert_close(got_loss, want_loss, rtol=RTOL, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=RTOL, atol=1e-18)


def test_the_check_can_fail():
    """The mask left out, `batchmean` read as a plain mean: both move the loss far past RTOL."""
    masked, _ = run(SETUP + LOOPS["masked_cross_entropy"])
    unmasked, _ = run(SETUP + LOOPS["masked_cross_entropy"].replace(" * mask[:, t]", ""))
    assert abs(unmasked - masked) / masked > 1e-2
    kd, _ = run(SETUP + LOOPS["kd_kl_div_batchmean"])
    mean, _ = run(SETUP + LOOPS["kd_kl_div_batchmean"].replace('"batchmean"', '"mean"'))
    assert abs(mean - kd) / kd > 1e-2


def report(source: str):
    settings = Settings(select=("PM503",), level=Level.UNSAFE)
    result = process_source(textwrap.dedent(source).encode(), "t.py", settings, [PerPositionLossLoop])
    assert result.error is None, result.error
    return result


def test_a_forward_per_position_over_a_growing_prefix_is_reported_with_that_reason():
    """LatentWire's distillation shape: each position runs the student on the prefix up
    to it. One forward would give the same logits only for a causal model fed the same
    inputs, which the loss cannot show: reported, not fixed, saying so."""
    result = report("""\
        import torch
        import torch.nn.functional as F

        def kd_first_k(student, teacher, ids, K=4, tau=1.0):
            total = torch.zeros(())
            for t in range(K):
                with torch.no_grad():
                    teacher_probs = F.softmax(teacher(ids[:, : t + 1])[:, -1, :] / tau, dim=-1)
                student_logits = student(ids[:, : t + 1])[:, -1, :]
                student_log_probs = F.log_softmax(student_logits / tau, dim=-1)
                total = total + F.kl_div(student_log_probs, teacher_probs, reduction="batchmean") * (tau * tau)
            return total / K
        """)
    assert [f.applied for f in result.findings] == [False], result.findings
    assert "forward once per sequence position" in result.findings[0].message, result.findings[0].message


def test_a_mask_that_is_not_summed_the_same_way_is_not_fixed():
    """Divided by the number of sequences, not by the mask's sum: the vectorized form
    must keep that divisor, or leave the loop alone; it never swaps one for the other."""
    source = (
        SETUP
        + """\
loss = 0.0
for t in range(S):
    l = F.cross_entropy(logits[:, t], y[:, t], reduction="none")
    loss = loss + (l * mask[:, t]).sum()
loss = loss / B
"""
    )
    result = report(source)
    if result.findings and all(f.applied for f in result.findings):
        new_source = result.new_source.decode()
        want, want_grad = run(source)
        got, got_grad = run(new_source)
        torch.testing.assert_close(got, want, rtol=RTOL, atol=0)
        torch.testing.assert_close(got_grad, want_grad, rtol=RTOL, atol=1e-18)

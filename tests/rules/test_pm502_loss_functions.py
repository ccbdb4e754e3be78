"""PM502 with the loss computed by a function of the file that loops over positions
(the acceptance script naive_lm's `k_token_loss`): PM503 vectorizes the function
first, PM502 then reads it and writes one batched loss for the per-sample loop.

Each program runs as written and as rewritten by every rule at `--level unsafe`,
in float64 on the CPU: the logged losses and the weights after the last step
agree to rounding (sums taken in another order), and the rewrite has no loop
over samples or positions left in the step.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from tests.rules.scripts import one_thread

# naive_lm's shape: a causal model's logits after a prefix, a per-position mean of
# cross-entropies over the first `k` targets, one sequence at a time.
K_TOKEN_LOSS = """\
import torch
import torch.nn.functional as F
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab=13, width=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids).cumsum(1)))


def k_token_loss(logits, targets, k):
    total = 0.0
    for j in range(k):
        total = total + F.cross_entropy(logits[:, j, :], targets[:, j], ignore_index=0)
    return total / k


def main():
    torch.manual_seed(0)
    model = TinyLM().double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(1, 13, (5, 4, 10))
    prefix = torch.tensor([1, 2])
    for step in range(5):
        ids = data[step]
        inputs = torch.cat([prefix.unsqueeze(0).expand(ids.size(0), -1), ids[:, :-1]], dim=1)
        targets = ids[:, 1:]
        optimizer.zero_grad()
        loss_sum = 0.0
        for i in range(inputs.size(0)):
            logits = model(inputs[i : i + 1])
            logits = logits[:, prefix.numel() :, :]
            loss = k_token_loss(logits, targets[i : i + 1], targets.size(1))
            loss.backward()
            loss_sum += loss.item()
        optimizer.step()
        print("step %d loss %r" % (step, loss_sum))
    print("WEIGHTS", [float(p.detach().double().sum()) for p in model.parameters()])


if __name__ == "__main__":
    main()
"""


def rewrite_all(source: str) -> str:
    result = process_source(source.encode(), "<loss-function>", Settings(level=Level.UNSAFE))
    assert result.error is None, result.error
    new = result.new_source.decode()
    again = process_source(result.new_source, "<loss-function>", Settings(level=Level.UNSAFE))
    assert not again.pending and again.new_source == result.new_source, [f.message for f in again.findings]
    return new


def run(source: str) -> tuple[torch.Tensor, torch.Tensor]:
    out = io.StringIO()
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<loss-function>", "exec"), {"__name__": "__main__"})
    text = out.getvalue()
    losses = [float(value) for value in re.findall(r"step \d+ loss (\S+)", text)]
    weights = eval(re.search(r"WEIGHTS (\[.*\])", text).group(1))
    return torch.tensor(losses, dtype=torch.float64), torch.tensor(weights, dtype=torch.float64)


@pytest.fixture(scope="module")
def rewritten() -> str:
    return rewrite_all(K_TOKEN_LOSS)


def test_the_loop_over_samples_and_the_loop_over_positions_become_one_batched_loss(rewritten):
    step = rewritten.split("def main():", 1)[1]
    assert "for i in range" not in step and "k_token_loss(" not in step
    assert step.count("F.cross_entropy(") == 1 and "model(inputs)" in step
    # the per-position means, kept as the loop's per-sample means sum them: no sum over the batch
    assert ".sum(0)" not in step and "/ (targets[:, : targets.size(1)] != 0)" in step
    # the classes stay the last, contiguous dimension
    assert "transpose" not in rewritten and ".flatten(0, 1)" in step


def test_the_batched_loss_trains_the_same_model(rewritten):
    want_losses, want_weights = run(K_TOKEN_LOSS)
    got_losses, got_weights = run(rewritten)
    assert len(want_losses) == 5 and want_losses[-1] < want_losses[0]
    torch.testing.assert_close(got_losses, want_losses, rtol=1e-10, atol=0)
    torch.testing.assert_close(got_weights, want_weights, rtol=1e-10, atol=1e-12)


def test_without_pm503_the_loss_function_is_called_per_sample_on_the_batched_output():
    """A function PM502 cannot read as written (a loop over positions) keeps its calls."""
    result = process_source(K_TOKEN_LOSS.encode(), "<loss-function>", Settings(select=("PM502",), level=Level.UNSAFE))
    new = result.new_source.decode()
    assert "sum(\n" in new or "sum(k_token_loss(" in new
    assert "k_token_loss(logits[i : i + 1], targets[i : i + 1], targets.size(1)) for i in range(inputs.size(0))" in new
    got_losses, got_weights = run(new)
    want_losses, want_weights = run(K_TOKEN_LOSS)
    torch.testing.assert_close(got_losses, want_losses, rtol=1e-10, atol=0)
    torch.testing.assert_close(got_weights, want_weights, rtol=1e-10, atol=1e-12)

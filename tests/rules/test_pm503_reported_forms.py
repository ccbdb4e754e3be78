"""PM503 on forms a blind tester found misread: a loop that adds two per-position sums
(distillation's KL and cross-entropy, each into its own total), and a free-running
decoder that feeds each position its own previous prediction. The rewrite runs against
the original on the CPU."""

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.per_position_loss_loop import PerPositionLossLoop
from tests.rules.scripts import losses, max_relative_difference

SETTINGS = Settings(select=("PM503",), level=Level.NUMERIC)

TWO_SUMS = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Linear(8, 5)
opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
for step in range(3):
    x = torch.randn(4, 6, 8)
    y = torch.randint(0, 5, (4, 6))
    y[0, 2] = 0
    teacher = torch.randn(4, 6, 5)
    logits = model(x)
    a = 0.0
    b = 0.0
    for t in range(6):
        a = a + F.cross_entropy(logits[:, t], y[:, t], ignore_index=0)
        b = b + F.kl_div(F.log_softmax(logits[:, t], -1), F.softmax(teacher[:, t], -1), reduction="batchmean")
    loss = a + b
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("loss", repr(loss.item()))
"""

FREE_RUNNING = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Decoder(nn.Module):
    def __init__(self, vocab, d):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.cell = nn.GRUCell(d, d)
        self.out = nn.Linear(d, vocab)

    def step(self, tok, h):
        h = self.cell(self.emb(tok), h)
        return self.out(h), h


dec = Decoder(50, 64)
opt = torch.optim.SGD(dec.parameters(), lr=0.1, foreach=False)
for it in range(3):
    tgt = torch.randint(0, 50, (8, 12))
    h = torch.zeros(8, 64)
    tok = torch.zeros(8, dtype=torch.long)
    loss = 0.0
    for t in range(12):
        logits, h = dec.step(tok, h)
        loss = loss + F.cross_entropy(logits, tgt[:, t])
        tok = logits.argmax(-1).detach()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def run(code: str):
    result = process_source(code.encode(), "<test>", SETTINGS, [PerPositionLossLoop])
    assert result.error is None, result.error
    return result.findings, result.new_source.decode()


def test_two_sums_in_one_loop_are_each_written_over_all_positions_and_train_alike():
    findings, new = run(TWO_SUMS)
    assert [f.applied for f in findings] == [True], findings
    assert "for t in range(6)" not in new
    assert "(y[:, :6] != 0).sum(0)" in new  # each position's mean over its own targets, 0 ignored
    assert 'reduction="sum",\n        )\n        / logits.size(0)' in new  # batchmean: each position's sum / batch
    before, after = losses(TWO_SUMS), losses(new)
    assert len(before) == 3
    assert max_relative_difference(after, before) < 1e-5


def test_a_sum_that_reads_another_sum_is_reported_with_that_reason():
    code = TWO_SUMS.replace('reduction="batchmean")\n', 'reduction="batchmean") * a\n')
    findings, new = run(code)
    assert new == code and "each term reads `a`" in findings[0].message


def test_a_free_running_decoder_is_not_reported():
    """Each position's input is the previous position's prediction: the positions run one
    after another, and no call computes them all at once."""
    findings, new = run(FREE_RUNNING)
    assert findings == [] and new == FREE_RUNNING

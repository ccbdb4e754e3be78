"""PM505 on a form a blind tester found missed: a hand-written tanh RNN over the first
dim (`x[t]` for `t` in `range(x.size(0))`) whose state goes through an `nn.Linear`.
Its update is not linear in the state, so it is reported, as the rule's page says."""

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.time_loop_recurrence import TimeLoopRecurrence

ELMAN = """\
import torch
import torch.nn as nn


class ElmanRNN(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.W = nn.Linear(d, d)
        self.U = nn.Linear(d, d, bias=False)

    def forward(self, x):  # (T, B, D)
        h = x.new_zeros(x.size(1), x.size(2))
        ys = []
        for t in range(x.size(0)):
            h = torch.tanh(self.W(x[t]) + self.U(h))
            ys.append(h)
        return torch.stack(ys)
"""


def run(code: str):
    settings = Settings(select=("PM505",), level=Level.UNSAFE)
    result = process_source(code.encode(), "<test>", settings, [TimeLoopRecurrence])
    assert result.error is None, result.error
    return result.findings, result.new_source.decode()


def test_a_tanh_rnn_over_the_first_dim_is_reported_with_its_reason():
    findings, new = run(ELMAN)
    assert new == ELMAN
    assert [(f.line, f.applied) for f in findings] == [(14, False)], findings
    assert "the update of `h` is not linear in it" in findings[0].message


def test_a_loop_over_a_list_of_steps_is_not_read_as_time():
    """`xs[t]` of a list under `range(len(xs))`: nothing says it is a tensor's time dim."""
    code = ELMAN.replace("range(x.size(0))", "range(len(xs))").replace("x[t]", "xs[t]")
    code = code.replace("def forward(self, x):", "def forward(self, x, xs):")
    findings, _ = run(code)
    assert findings == []

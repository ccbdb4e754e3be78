"""PM203 and the writes of the calls a training loop makes: a value read in the loop is
not the same on every step when a function or method of the file that the loop calls
re-binds it (`global SEQ_LEN`, `self.seq_len = ...`) or changes it in place (a module's
list, a list handed to it). The original and the rewrite at level `safe` run on the CPU
and must give the same losses, bit for bit."""

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level

CURRICULUM_METHOD = """\
import torch
from torch import nn


class Trainer:
    def __init__(self):
        self.seq_len = 2
        self.emb = nn.Embedding(16, 4)

    def on_step_end(self):
        self.seq_len = min(self.seq_len + 2, 8)

    def fit(self):
        losses = []
        for step in range(4):
            pos = torch.arange(self.seq_len)
            loss = self.emb(pos).pow(2).mean()
            loss.backward()
            losses.append(loss.item())
            self.on_step_end()
        return losses


def main():
    torch.manual_seed(0)
    return Trainer().fit()
"""

GLOBAL_REBOUND = """\
import torch
from torch import nn

SEQ_LEN = 2


def grow_curriculum():
    global SEQ_LEN
    SEQ_LEN = min(SEQ_LEN + 2, 8)


def main():
    torch.manual_seed(0)
    emb = nn.Embedding(16, 4)
    losses = []
    for step in range(4):
        pos = torch.arange(SEQ_LEN)
        loss = emb(pos).pow(2).mean()
        loss.backward()
        losses.append(loss.item())
        grow_curriculum()
    return losses
"""

GLOBAL_LIST_MUTATED = """\
import torch
import torch.nn.functional as F

CLASS_WEIGHTS = [1.0, 1.0, 1.0]


def update_weights(y):
    counts = torch.bincount(y, minlength=3).tolist()
    for c in range(3):
        CLASS_WEIGHTS[c] = 1.0 / (1.0 + counts[c])


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    losses = []
    for step in range(4):
        x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
        w = torch.tensor(CLASS_WEIGHTS)
        loss = F.cross_entropy(model(x), y, weight=w)
        loss.backward()
        losses.append(loss.item())
        update_weights(y)
    return losses
"""

LOCAL_LIST_PASSED = """\
import torch
import torch.nn.functional as F


def update_weights(weights, y):
    counts = torch.bincount(y, minlength=3).tolist()
    for c in range(3):
        weights[c] = 1.0 / (1.0 + counts[c])


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    class_weights = [1.0, 1.0, 1.0]
    losses = []
    for step in range(4):
        x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
        w = torch.tensor(class_weights)
        loss = F.cross_entropy(model(x), y, weight=w)
        loss.backward()
        losses.append(loss.item())
        update_weights(class_weights, y)
    return losses
"""

CASES = {
    "attribute_rebound_by_method": CURRICULUM_METHOD,
    "global_rebound_by_function": GLOBAL_REBOUND,
    "global_list_changed_by_function": GLOBAL_LIST_MUTATED,
    "local_list_changed_by_function": LOCAL_LIST_PASSED,
}


def losses(source: str) -> list[float]:
    namespace = {"__name__": "fixture"}
    exec(compile(source, "<fixture>", "exec"), namespace)
    return namespace["main"]()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_value_a_called_function_writes_stays_in_the_loop(case):
    source = CASES[case]
    result = process_source(source.encode(), "<test>", Settings(select=("PM203",), level=Level.SAFE))
    assert result.error is None, result.error
    assert not [f for f in result.findings if f.applied]
    assert losses(result.new_source.decode()) == losses(source)


def test_a_call_that_writes_something_else_does_not_keep_the_value_in():
    """`self.step_count += 1` in the called method does not change `self.seq_len`: the
    positions are still computed once."""
    source = CURRICULUM_METHOD.replace("self.seq_len = min(self.seq_len + 2, 8)", "self.step_count = 1")
    result = process_source(source.encode(), "<test>", Settings(select=("PM203",), level=Level.SAFE))
    assert [f.applied for f in result.findings] == [True]
    assert losses(result.new_source.decode()) == losses(source)

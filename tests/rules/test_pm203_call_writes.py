"""PM203 and the writes of the calls a training loop makes: a value read in the loop is
not the same on every step when a function or method of the file that the loop calls
re-binds it (`global SEQ_LEN`, `self.seq_len = ...`) or changes it in place (a module's
list, a list handed to it). The original and the rewrite at level `safe` run on the CPU
and must give the same losses, bit for bit."""

import libcst as cst
import pytest

from codemod.analysis.variance import single_assignment, variance
from codemod.config import Settings
from codemod.context import FileContext
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

SHUFFLED_BY_A_LIBRARY = """\
import heapq
import random

import torch


def main():
    random.seed(0)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    order, queue = list(range(10)), []
    losses = []
    for step in range(4):
        random.shuffle(order)
        heapq.heappush(queue, -step)
        idx = torch.tensor(order[:2])
        top = torch.tensor(queue[:1])
        loss = model((idx + top).float().view(-1, 1)).sum()
        loss.backward()
        losses.append(loss.item())
    return losses
"""

MODEL_FORWARD_WRITES_ARGUMENT = """\
import torch


class Cell(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, mem):
        mem.add_(1.0)
        return self.lin(x) + mem


def main():
    torch.manual_seed(0)
    model = Cell()
    losses = []
    for step in range(3):
        mem = torch.zeros(4)
        loss = model(torch.ones(2, 4), mem).sum()
        loss.backward()
        losses.append(loss.item())
    return losses
"""

REFILLED_THROUGH_NUMPY = """\
import numpy as np
import torch


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    buf, staging = torch.zeros(2, 4), torch.zeros(2, 4)
    losses = []
    for step in range(3):
        buf.numpy()[:] = step
        np.copyto(staging.numpy(), np.full((2, 4), step, dtype=np.float32))
        x = buf.clone()
        y = staging.clone()
        loss = model(x + y).sum()
        loss.backward()
        losses.append(loss.item())
    return losses
"""

CASES = {
    "attribute_rebound_by_method": CURRICULUM_METHOD,
    "global_rebound_by_function": GLOBAL_REBOUND,
    "global_list_changed_by_function": GLOBAL_LIST_MUTATED,
    "local_list_changed_by_function": LOCAL_LIST_PASSED,
    "list_changed_by_a_library_call": SHUFFLED_BY_A_LIBRARY,
    "argument_changed_by_a_model_forward": MODEL_FORWARD_WRITES_ARGUMENT,
    "tensor_refilled_through_its_numpy_view": REFILLED_THROUGH_NUMPY,
}
# Why each value stays in the loop, as the report says it.
REASONS = {
    "list_changed_by_a_library_call": [
        "`order` is handed to `random.shuffle` in the loop",
        "`queue` is handed to `heapq.heappush` in the loop",
    ],
    "argument_changed_by_a_model_forward": ["`model(...)` (line 20), called in the loop, changes in place `mem`"],
    "tensor_refilled_through_its_numpy_view": [
        "`buf` is changed in place in the loop",
        "`staging` is handed to `np.copyto` in the loop",
    ],
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
    why = " ".join(reasons(source))
    assert all(reason in why for reason in REASONS.get(case, ())), why


def reasons(source: str) -> list[str]:
    """Why each `name = value` of the step loop in `main` stays in it (PM203 moves no
    value it cannot prove, and reports none of these: no fix is the whole answer)."""
    context = FileContext(cst.parse_module(source), "<test>", Settings(), source)
    loop = next(iter(context.index.find(cst.For)))
    found = variance(context).hoists(loop, lambda line: False)
    found_reasons = []
    for line in found.lines:
        statement = single_assignment(line)
        if statement is not None:
            value = variance(context).of(statement.value, loop)
            found_reasons.append(value if isinstance(value, str) else found.why_not(line, context))
    return found_reasons


def test_a_call_that_writes_something_else_does_not_keep_the_value_in():
    """`self.step_count += 1` in the called method does not change `self.seq_len`: the
    positions are still computed once."""
    source = CURRICULUM_METHOD.replace("self.seq_len = min(self.seq_len + 2, 8)", "self.step_count = 1")
    result = process_source(source.encode(), "<test>", Settings(select=("PM203",), level=Level.SAFE))
    assert [f.applied for f in result.findings] == [True]
    assert losses(result.new_source.decode()) == losses(source)

"""PM202 on the spellings and edge cases its VALID/INVALID examples do not cover."""

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.manual_batching_in_step_loop import ManualBatchingInStepLoop

# Rows of 40,000 features: batches of 10 or more hold over 1.25 MB, large enough for the
# overlapped copies a DataLoader allows to pay (smaller known batches are only reported).
HEAD = """\
import torch
X, Y = torch.randn(100, 40000), torch.randn(100, 1)
model = torch.nn.Linear(40000, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""
STEP = "    loss = torch.nn.functional.mse_loss(model(xb), yb)\n    loss.backward()\n    opt.step()\n"


def run(code: str, level=Level.UNSAFE):
    result = process_source(
        code.encode(), "<test>", Settings(select=("PM202",), level=level), [ManualBatchingInStepLoop]
    )
    assert result.error is None, result.error
    again = process_source(
        result.new_source, "<test>", Settings(select=("PM202",), level=level), [ManualBatchingInStepLoop]
    )
    assert not again.pending and again.new_source == result.new_source  # idempotent
    return result.findings, result.new_source.decode()


def test_not_applied_below_unsafe_and_listed_as_fixable():
    code = HEAD + "for i in range(0, len(X), 10):\n    xb, yb = X[i:i + 10], Y[i:i + 10]\n" + STEP
    findings, new = run(code, level=Level.NUMERIC)
    assert new == code and len(findings) == 1 and findings[0].fixable and not findings[0].applied


def test_one_tensor_gives_a_one_element_target_and_an_aliased_import_is_kept():
    code = (
        "from torch.utils.data import DataLoader as DL\n" + HEAD + "Y = X.sum(1, keepdim=True)\n"
        "for i in range(0, X.size(0), 10):\n    xb = X[i:i + 10]\n    yb = xb.sum(1, keepdim=True)\n" + STEP
    )
    findings, new = run(code)
    assert "loader = DataLoader(TensorDataset(X), batch_size=10, shuffle=False)\n" in new
    assert "for (xb,) in loader:\n" in new
    # the alias is kept; the engine adds the names the fix needs to the same import
    assert new.startswith("from torch.utils.data import DataLoader as DL, DataLoader, TensorDataset\n")
    compile(new, "<new>", "exec")


def test_a_taken_loader_name_is_not_reused():
    code = HEAD + "loader = None\nfor i in range(0, len(X), 10):\n    xb, yb = X[i:i + 10], Y[i:i + 10]\n" + STEP
    _, new = run(code)
    assert "train_loader = DataLoader(" in new and "for xb, yb in train_loader:" in new


def test_a_range_that_is_the_size_the_tensors_were_made_with_covers_them():
    _, new = run(HEAD + "for i in range(0, 100, 10):\n    xb, yb = X[i:i + 10], Y[i:i + 10]\n" + STEP)
    assert "loader = DataLoader(TensorDataset(X, Y), batch_size=10, shuffle=False)\n" in new


def test_range_minus_batch_plus_one_drops_the_last_partial_batch():
    code = HEAD + "bs = 32\nfor i in range(0, len(X) - bs + 1, bs):\n    xb, yb = X[i:i + bs], Y[i:i + bs]\n" + STEP
    _, new = run(code)
    assert "DataLoader(TensorDataset(X, Y), batch_size=bs, shuffle=False, drop_last=True)" in new


@pytest.mark.parametrize(
    "code,reason",
    [
        (
            HEAD + "for i in range(0, 80, 10):\n    xb, yb = X[i:i + 10], Y[i:i + 10]\n" + STEP,
            "the range `80` is not the length of `X` / `Y`",
        ),
        (
            HEAD + "for i in range(0, len(X), 10):\n    xb, yb = X[i:i + 10], Y[i:i + 10]\n    xb.mul_(2)\n" + STEP,
            "the batch `xb` is written in place",
        ),
        (
            "from torch.utils.data import Dataset\nclass DataLoader:\n    pass\n"
            + HEAD
            + "for i in range(0, len(X), 10):\n    xb, yb = X[i:i + 10], Y[i:i + 10]\n"
            + STEP,
            "the name `DataLoader` means something else in this file",
        ),
        (
            "import torch\nfrom data import load\nX, Y = load()\nmodel = torch.nn.Linear(8, 1)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for i in range(0, len(X), 10):\n    xb, yb = X[i:i + 10], Y[i:i + 10]\n" + STEP,
            "`X` is not known to be a tensor in host memory",
        ),
    ],
)
def test_unprovable_cases_are_reported_with_the_reason(code, reason):
    findings, new = run(code)
    assert new == code
    assert len(findings) == 1 and not findings[0].fixable and reason in findings[0].message


def test_running_sums_are_not_mistaken_for_carried_state():
    code = (
        HEAD
        + "total = 0.0\nfor i in range(0, len(X), 10):\n    xb, yb = X[i:i + 10], Y[i:i + 10]\n"
        + STEP
        + "    total = total + loss.item()\n"
    )
    findings, new = run(code)
    assert findings[0].applied and "for xb, yb in loader:" in new


def test_suppression_on_the_loop_line():
    code = (
        HEAD
        + "for i in range(0, len(X), 10):  # perfmod: ignore[PM202]\n    xb, yb = X[i:i + 10], Y[i:i + 10]\n"
        + STEP
    )
    findings, new = run(code)
    assert new == code and not findings


def test_loop_inside_a_function_builds_the_loader_in_the_function_before_the_epoch_loop():
    code = (
        HEAD + "def train(X, Y, epochs, bs):\n    for epoch in range(epochs):\n"
        "        for i in range(0, len(X), bs):\n            xb, yb = X[i:i + bs], Y[i:i + bs]\n"
        + STEP.replace("    ", "            ")
    )
    findings, new = run(code)
    # X and Y are parameters: Kinds cannot tell they are host tensors, so this is reported only
    assert new == code and not findings[0].fixable


SMALL_ROWS = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
X = torch.randn(96, 10)
Y = (X[:, 0] > 0).long()
model = torch.nn.Linear(10, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    for b in range(0, 96, 12):
        xb, yb = X[b : b + 12].to(device), Y[b : b + 12].to(device)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_batches_known_to_be_too_small_for_a_loader_to_pay_are_reported_not_rewritten():
    # The blind round's #18: a DataLoader over 96 rows of 10 features fetches each row and
    # stacks them, more host time than one slice, and its pinned copies of 576 bytes would
    # hide nothing; with every rule on, nothing touches the loop (no loader to pin).
    result = process_source(SMALL_ROWS.encode(), "<test>", Settings(level=Level.UNSAFE))
    assert result.error is None, result.error
    (finding,) = [f for f in result.findings if f.code == "PM202"]
    assert not finding.fixable and finding.line == 11
    assert "a batch holds about 576 bytes" in finding.message
    assert "more host time per batch than one slice" in finding.message
    assert not any(f.applied for f in result.findings if f.code in ("PM101", "PM102", "PM103", "PM202"))
    new = (result.new_source or SMALL_ROWS.encode()).decode()
    assert "X[b : b + 12].to(device)" in new and "DataLoader" not in new


def test_rows_wide_enough_for_a_loader_to_pay_are_rewritten():
    code = SMALL_ROWS.replace("torch.randn(96, 10)", "torch.randn(96, 40000)").replace("Linear(10,", "Linear(40000,")
    findings, new = run(code)
    assert [f.applied for f in findings] == [True]
    assert "loader = DataLoader(TensorDataset(X, Y), batch_size=12, shuffle=False)" in new

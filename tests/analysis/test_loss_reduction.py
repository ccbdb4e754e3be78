"""The reduction a torch loss runs with, read from its call or its module's construction:
`reduction=`, or the legacy `size_average=` / `reduce=` that override it (torch still
honours them). The table's reading is checked against the installed torch, and PM601,
which refuses a summed loss, refuses it in the legacy spelling too."""

from __future__ import annotations

import itertools
import textwrap

import libcst as cst
import pytest
import torch
import torch.nn.functional as F

from codemod.analysis.loss_calls import loss_calls
from codemod.analysis.torch_ops import legacy_reduction
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.result import Level
from codemod.rules.single_process_training.examples import LOOP

FLAGS = (None, True, False)
pytestmark = pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")


@pytest.mark.parametrize("size_average, reduce", list(itertools.product(FLAGS, FLAGS)))
def test_the_legacy_keywords_read_as_torch_reads_them(size_average, reduce):
    from torch.nn import _reduction

    expected = _reduction.legacy_get_string(size_average, reduce, emit_warning=False)
    assert legacy_reduction(size_average, reduce) == expected
    # and what the losses compute: the functional and the module alike
    torch.manual_seed(0)
    probabilities, targets = torch.rand(4, 3), torch.rand(4, 3)
    legacy = {"size_average": size_average, "reduce": reduce}
    written = F.binary_cross_entropy(probabilities, targets, reduction=expected)
    assert torch.equal(F.binary_cross_entropy(probabilities, targets, **legacy), written)
    assert torch.equal(torch.nn.BCELoss(**legacy)(probabilities, targets), written)
    # the legacy keywords win over `reduction=`
    assert torch.equal(
        F.mse_loss(probabilities, targets, reduction="mean", **legacy),
        F.mse_loss(probabilities, targets, reduction=expected),
    )


def context(code: str) -> FileContext:
    code = textwrap.dedent(code)
    return FileContext(cst.parse_module(code), "<test>", Settings(), code)


@pytest.mark.parametrize(
    "call, reduction",
    [
        ("F.binary_cross_entropy(p, t, size_average=False)", "sum"),
        ("F.mse_loss(p, t, reduce=False)", "none"),
        ('F.mse_loss(p, t, size_average=False, reduction="mean")', "sum"),
        ("F.mse_loss(p, t, size_average=True)", "mean"),
        ('F.l1_loss(p, t, reduction="sum")', "sum"),
        ("F.l1_loss(p, t)", "mean"),
        ("nn.BCELoss(size_average=False)", "sum"),
        ("nn.MSELoss(reduce=False, size_average=False)", "none"),
        ("F.mse_loss(p, t, size_average=flag)", None),  # not a literal
        ("F.relu(p)", None),  # not a loss
    ],
)
def test_the_reduction_of_a_loss_call_or_construction(call, reduction):
    ctx = context(f"import torch.nn as nn\nimport torch.nn.functional as F\nx = {call}\n")
    [node] = [c for c in ctx.index.find(cst.Call) if ctx.source(c) == call]
    assert loss_calls(ctx).reduction(node) == reduction


@pytest.mark.parametrize(
    "loss",
    [
        "torch.nn.functional.mse_loss(model(x), y, size_average=False)",
        "torch.nn.MSELoss(size_average=False)(model(x), y)",
    ],
)
def test_pm601_refuses_a_loss_summed_in_the_legacy_spelling(loss):
    code = LOOP.replace("torch.nn.functional.mse_loss(model(x), y)", loss)
    assert loss in code
    found = process_source(code.encode(), "<test>", Settings(select=("PM601",), level=Level.UNSAFE)).findings
    [finding] = found
    assert not finding.applied
    assert "the loss is summed over the batch (size_average=False)" in finding.message


def test_a_per_position_loss_summed_in_the_legacy_spelling_is_vectorized_as_a_sum():
    """PM503 reads the legacy keywords as the reduction they mean: one summed call over
    every position gives the loop's loss and gradient."""
    from codemod.rules.per_position_loss_loop import PerPositionLossLoop
    from tests.rules.scripts import rewrite

    source = (
        "import torch\nimport torch.nn.functional as F\ntorch.manual_seed(0)\n"
        "logits = torch.randn(5, 9, 7, dtype=torch.float64, requires_grad=True)\nloss = 0.0\n"
        "for t in range(9):\n"
        "    loss += F.mse_loss(logits[:, t], logits[:, t].detach() * 0.5, size_average=False)\n"
    )
    new_source = rewrite(source, [PerPositionLossLoop])
    assert "for t" not in new_source and 'reduction="sum"' in new_source and "size_average" not in new_source

    def run(code: str) -> tuple[torch.Tensor, torch.Tensor]:
        namespace: dict = {}
        exec(compile(code, "<snippet>", "exec"), namespace)
        namespace["loss"].backward()
        return namespace["loss"].detach(), namespace["logits"].grad

    (want_loss, want_grad), (got_loss, got_grad) = run(source), run(new_source)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-18)

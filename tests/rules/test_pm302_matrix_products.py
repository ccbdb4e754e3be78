"""PM302 on the fixture pairs of issue-style programs: TF32 goes where the process
starts, never into a function run every step or epoch, and a step that multiplies
no matrices gets no finding. The rewrite trains the same on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.tf32 import Float32MatmulWithoutTf32
from tests.rules.scripts import losses, max_relative_difference, rewrite

PAIRS = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM302"
TOLERANCE = 1e-3  # what TF32 allows where the hardware honours it (see test_training_fixtures)


@pytest.fixture
def restore_matmul_precision():
    """The rewrite sets a process-wide flag; other tests must not inherit it."""
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_the_step_function_pair_trains_the_same(restore_matmul_precision):
    source = (PAIRS / "step_function.in.py").read_text()
    new_source = rewrite(source, [Float32MatmulWithoutTf32])
    assert new_source == (PAIRS / "step_function.out.py").read_text()
    before = losses(source)
    assert len(before) == 15
    assert max_relative_difference(losses(new_source), before) < TOLERANCE


def test_an_embedding_only_model_gets_no_finding():
    source = (PAIRS / "embedding_bigram.in.py").read_text()
    settings = Settings(select=("PM302",), level=Level.NUMERIC)
    result = process_source(source.encode(), "bigram.py", settings, [Float32MatmulWithoutTf32])
    assert result.error is None and result.findings == []
    assert len(losses(source)) == 20  # the program runs as it is
    with_head = source.replace(
        "        logits = self.logits(ids)\n", "        logits = self.logits(ids) @ self.logits.weight.T\n"
    )
    result = process_source(with_head.encode(), "bigram.py", settings, [Float32MatmulWithoutTf32])
    assert [f.applied for f in result.findings] == [True]  # a product in the forward: TF32 pays again

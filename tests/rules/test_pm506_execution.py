"""PM506: the compiled training script trains like the eager one, within tolerance,
and its checkpoint keeps the keys an uncompiled model loads.

One tiny model, a few AdamW steps on one CPU thread, compiled with the default
inductor backend (which needs a C++ compiler: the test is skipped without one).
Measured with torch 2.13 on this machine: the largest relative difference of a
printed loss from the eager run was 7.2e-8 over the 5 steps (two of the five
differ at all); TOLERANCE = 1e-4 leaves room for other CPUs' vector widths and
is still far below what a different model or update would give (the losses
move by 2e-2 or more from one step to the next).
"""

import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.uncompiled_model import UncompiledModel
from tests.rules.scripts import one_thread

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM506" / "train_lm.in.py"
TOLERANCE = 1e-4
HAS_CXX = any(shutil.which(c) for c in ("g++", "c++", "clang++"))


def run(source: str):
    out = io.StringIO()
    namespace = {"__name__": "__main__"}
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<train_lm>", "exec"), namespace)
    losses = torch.tensor([float(v) for v in re.findall(r"loss (\S+)", out.getvalue())], dtype=torch.float64)
    return losses, namespace


@pytest.mark.slow
@pytest.mark.skipif(not HAS_CXX, reason="torch.compile's inductor backend needs a C++ compiler on CPU")
def test_compiled_script_trains_within_tolerance_and_keeps_checkpoint_keys():
    from torch._dynamo.utils import counters

    source = SCRIPT.read_text()
    settings = Settings(select=("PM506",), level=Level.NUMERIC)
    result = process_source(source.encode(), str(SCRIPT), settings, [UncompiledModel])
    assert [f.applied for f in result.findings] == [True]
    eager_losses, eager = run(source)
    torch._dynamo.reset()
    counters.clear()
    compiled_losses, compiled = run(result.new_source.decode())
    assert counters["stats"]["unique_graphs"] >= 1  # the forward did go through dynamo
    assert len(eager_losses) == 5 and not torch.equal(eager_losses[:1].expand(5), eager_losses)
    relative = ((compiled_losses - eager_losses).abs() / eager_losses.abs()).max().item()
    assert relative < TOLERANCE, relative
    # model.compile() keeps the module and its state_dict keys: the checkpoint loads
    # into a fresh, uncompiled CharLM with strict key matching.
    state = torch.load(io.BytesIO(compiled["checkpoint"].getvalue()), weights_only=True)
    fresh = compiled["CharLM"](24, 16)  # main()'s default vocab and width
    fresh.load_state_dict(state)
    assert list(state) == list(eager["model"].state_dict())
    for name, value in eager["model"].state_dict().items():
        torch.testing.assert_close(state[name], value, rtol=TOLERANCE, atol=TOLERANCE)

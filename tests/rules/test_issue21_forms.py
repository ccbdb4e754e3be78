"""The forms that perfmod reported but did not fix where an expert fixes (issue 21 §3),
each a program of fixtures/wild/forms/ written from the issue's words before the rules
were read. Static: every marked instance is found by its rule, and fixed where marked
`fix`, except the forms whose fix is not written yet, which must be reported with their
true reason. The rewrites that changed with this work run against the originals on the
CPU (the recall benchmark runs every program of the folder)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

from benchmarks.recall import analyse, parse_program
from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Level
from tests.rules.scripts import one_thread

FORMS = Path(__file__).resolve().parents[2] / "fixtures" / "wild" / "forms"
PROGRAMS = sorted(FORMS.glob("*.py"))
# Marked `fix` (an expert fixes them) but reported: the reason each report must give.
NOT_FIXED_YET = {
    ("pm502_metrics_per_sample.py", "PM502"): "is kept for each sample",
}
# Marked `report`: the reason each report must give.
REPORTED = {
    ("pm201_lightning_tensordataset.py", "PM201"): "only indexes tensors the training process already holds",
    # toy tensors of known size: a DataLoader over them would cost more than it hides
    ("pm202_range_n_length.py", "PM202"): "a batch holds about 360 bytes",
    ("pm202_split_zip_script.py", "PM202"): "so the pinned, overlapped copies a DataLoader allows",
}


def test_the_forms_are_found():
    assert len(PROGRAMS) >= 17


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda path: path.stem)
def test_every_marked_form_is_found_and_fixed_where_marked(path):
    program = parse_program(path)
    assert program.markers, path
    codes = tuple(sorted({marker.code for marker in program.markers}))
    outcome = analyse(program, codes)
    assert outcome.result.error is None, outcome.result.error
    messages = {(f.code, f.line): f.message for f in outcome.result.findings}
    for marker in program.markers:
        assert marker.reported, (path.name, marker.code, marker.line, sorted(messages))
        key = (path.name, marker.code)
        if marker.expects_fix and key not in NOT_FIXED_YET:
            assert marker.fixed, (path.name, marker.code, marker.line, messages)
        else:
            assert not marker.fixed, (path.name, marker.code, marker.line)
            reason = NOT_FIXED_YET.get(key) or REPORTED[key]
            found = [message for (code, _), message in messages.items() if code == marker.code]
            assert any(reason in message for message in found), found


def rewrite(path: Path, code: str, level: Level) -> str:
    settings = Settings(level=level, select=(code,))
    result = process_source(path.read_bytes(), str(path), settings)
    assert result.error is None and any(f.applied for f in result.findings), result.findings
    return result.new_source.decode()


def losses(source: str) -> torch.Tensor:
    out = io.StringIO()
    with one_thread(), contextlib.redirect_stdout(out):
        exec(compile(source, "<form>", "exec"), {"__name__": "__main__"})
    found = re.search(r"^WILD_LOSSES (\[.*\])$", out.getvalue(), re.M)
    assert found, out.getvalue()
    return torch.tensor(eval(found.group(1)), dtype=torch.float64)


def test_a_fused_optimizer_built_in_configure_optimizers_trains_within_tolerance():
    """`module = LitLM().to(device)`, then `module.configure_optimizers()` builds AdamW over
    decay / no-decay groups of `self`: `self` is the moved module, fused kernels exist
    on its device (CUDA or the CPU); the fused step trains like the loop of updates."""
    path = FORMS / "pm402_configure_optimizers_groups.py"
    new = rewrite(path, "PM402", Level.NUMERIC)
    assert new.count("fused=True") == 1 and "fused=True" not in path.read_text()
    original, fused = losses(path.read_text()), losses(new)
    assert len(original) == 5 and not torch.equal(original[:1].expand(5), original)
    assert ((fused - original).abs() / original.abs()).max().item() < 1e-3


def test_a_step_helper_over_rows_counted_by_a_constant_is_batched_and_trains_the_same():
    """`for i in range(BATCH): total = total + train_step_with_metrics(model, batch[i])`
    where `batch` has BATCH rows: one batched call of the helper, the same losses (to
    float rounding: the per-sample losses are summed in another order)."""
    path = FORMS / "pm502_step_helper_counted_by_constant.py"
    new = rewrite(path, "PM502", Level.UNSAFE)
    assert "train_step_with_metrics(model, batch)" in new and "for i in range(BATCH)" not in new
    original, batched = losses(path.read_text()), losses(new)
    assert len(original) == 4
    torch.testing.assert_close(batched, original, rtol=1e-5, atol=0)

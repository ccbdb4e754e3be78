"""PM404: the rewritten loops print exactly what the originals print.

The fixtures under fixtures/rules/PM404/ are small CPU training scripts that log
with full `repr` precision; each is run before and after the rewrite and the
printed lines must match character for character. The arithmetic claim behind
the float64 accumulator is also checked directly, on random float32 values.
"""

import contextlib
import io
import random
from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rules.host_sync import PerStepHostSync

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM404"
REWRITTEN = ["move_under_log_condition", "running_sum", "epoch_totals"]
SETTINGS = Settings(select=(PerStepHostSync.CODE,), level=PerStepHostSync.LEVEL)


def rewrite(source: str) -> tuple[str, list]:
    result = process_source(source.encode(), "<fixture>", SETTINGS, [PerStepHostSync])
    assert result.error is None, result.error
    return result.new_source.decode(), result.findings


def printed(source: str) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "<fixture>", "exec"), {"__name__": "__main__"})
    return out.getvalue().splitlines()


@pytest.mark.parametrize("case", REWRITTEN)
def test_rewritten_loop_prints_the_same_lines(case):
    source = (FIXTURES / f"{case}.in.py").read_text()
    new_source, findings = rewrite(source)
    assert new_source == (FIXTURES / f"{case}.out.py").read_text()
    assert findings and all(f.applied for f in findings)
    before, after = printed(source), printed(new_source)
    assert len(before) >= 3
    assert after == before


@pytest.mark.parametrize("case", ["running_sum", "epoch_totals"])
def test_a_float32_device_sum_would_print_other_digits(case):
    """The comparison above is sharp enough to see the rounding of a float32 sum:
    the same rewrite with `.float()` instead of `.double()` prints other lines."""
    source = (FIXTURES / f"{case}.in.py").read_text()
    new_source, _ = rewrite(source)
    assert ".double()" in new_source
    assert printed(new_source.replace(".double()", ".float()")) != printed(source)


def test_second_run_finds_nothing_to_fix():
    for case in REWRITTEN:
        _, findings = rewrite((FIXTURES / f"{case}.out.py").read_text())
        assert not [f for f in findings if f.fixable], case


def test_report_only_syncs_say_why():
    source = (FIXTURES / "report_only.in.py").read_text()
    new_source, findings = rewrite(source)
    assert new_source == source == (FIXTURES / "report_only.out.py").read_text()
    reasons = [f.message for f in findings]
    assert [f.fixable for f in findings] == [False, False, False]
    assert "decides control flow every step" in reasons[0]
    assert "stored every step" in reasons[1]
    assert "decides control flow every step" in reasons[2]


def random_losses(rng: random.Random, dtype: torch.dtype, count: int) -> list[torch.Tensor]:
    """Scalars spread over many binades, as losses over a run are, in `dtype`."""
    return [torch.tensor(rng.uniform(-1, 1) * 2.0 ** rng.randint(-20, 20), dtype=dtype) for _ in range(count)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_float64_tensor_arithmetic_equals_python_float_arithmetic(dtype):
    """`.item()` and `.double()` convert exactly, and one float64 tensor operation is one
    correctly rounded IEEE double operation, as Python's are: every partial result of
    the running sum, the weighted sum and the moving average is the same double."""
    rng = random.Random(0)
    for _ in range(20):
        losses = random_losses(rng, dtype, 200)
        sizes = [rng.randint(1, 64) for _ in losses]
        total, weighted, average = 0.0, 0, 0
        total_t, weighted_t, average_t = 0.0, 0, 0
        for loss, size in zip(losses, sizes):
            total += loss.item()
            weighted += loss.item() * size
            average = 0.9 * average + 0.1 * loss.item() / 3
            total_t += loss.detach().double()
            weighted_t += loss.detach().double() * size
            average_t = 0.9 * average_t + 0.1 * loss.detach().double() / 3
            assert float(total_t).hex() == total.hex()
            assert float(weighted_t).hex() == weighted.hex()
            assert float(average_t).hex() == average.hex()


def test_float32_tensor_sum_differs_from_python_sum():
    """Why the rewrite accumulates in float64: a float32 accumulator rounds each
    partial sum to float32 and ends elsewhere."""
    rng = random.Random(1)
    losses = random_losses(rng, torch.float32, 200)
    total, total_f32 = 0.0, torch.zeros((), dtype=torch.float32)
    for loss in losses:
        total += loss.item()
        total_f32 += loss
    assert float(total_f32) != total


def test_integer_counts_stay_exact_integers():
    rng = random.Random(2)
    correct, correct_t = 0, 0
    for _ in range(100):
        hits = torch.tensor([rng.random() < 0.5 for _ in range(rng.randint(1, 64))])
        correct += (hits == True).sum().item()  # noqa: E712 - the comparison PM404 sees in loops
        correct_t += (hits == True).sum()  # noqa: E712
    assert type(int(correct_t)) is int and int(correct_t) == correct and correct_t.dtype == torch.int64

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
from codemod.result import Level
from codemod.rules.per_step_host_sync import PerStepHostSync

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM404"
REWRITTEN = [
    "move_under_log_condition",
    "running_sum",
    "epoch_totals",
    "dict_sums",
    "carried_counts",
    "step_function_return",
    "appended_list",
    "history_dict",
]
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


@pytest.mark.parametrize("case", ["running_sum", "epoch_totals", "dict_sums", "carried_counts"])
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


TIMED_STEP = """\
import time
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(8, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    t0 = time.time()
    lossf = 0.0
    for micro in range(4):
        loss = model(torch.randn(16, 8, device=device)).pow(2).mean() / 4
        lossf += loss.detach()
        loss.backward()
    lossf = lossf.item()
    opt.step()
    opt.zero_grad()
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"step {step} loss {lossf:.4f} {time.time() - t0:.3f}s")
"""


def test_a_step_that_waits_for_the_device_for_its_timing_keeps_its_read_and_says_so():
    new_source, findings = rewrite(TIMED_STEP)
    assert new_source == TIMED_STEP
    [finding] = findings
    assert not finding.fixable
    assert "waits for the device on every step anyway (`torch.cuda.synchronize()`, line 18)" in finding.message
    untimed = TIMED_STEP.replace('    if device == "cuda":\n        torch.cuda.synchronize()\n', "")
    assert "anyway" not in rewrite(untimed)[1][0].message


def test_a_step_that_waits_through_a_name_bound_to_the_device_synchronize_keeps_its_read_and_says_so():
    hoisted = 'synchronize = torch.cuda.synchronize if device == "cuda" else lambda: None\nfor step in range(10):\n'
    timed = TIMED_STEP.replace("for step in range(10):\n", hoisted).replace(
        '    if device == "cuda":\n        torch.cuda.synchronize()\n', "    synchronize()\n"
    )
    new_source, findings = rewrite(timed)
    assert new_source == timed
    [finding] = findings
    assert not finding.fixable
    assert "waits for the device on every step anyway (`synchronize()`, line 18)" in finding.message
    when_timed = timed.replace('if device == "cuda" else', "if timed else").replace(
        "for step", "timed = False\nfor step"
    )
    assert "anyway" not in rewrite(when_timed)[1][0].message  # it waits only when the run is timed


PRINTED_EVERY_STEP = """\
import torch
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(8, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
total = 0.0
for step in range(10):
    loss = model(torch.randn(16, 8, device=device)).pow(2).mean()
    total += loss.item()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
print(total / 10)
"""


def test_a_read_that_stays_every_step_keeps_the_others_and_says_so():
    new_source, findings = rewrite(PRINTED_EVERY_STEP)
    assert new_source == PRINTED_EVERY_STEP
    summed, printed = sorted(findings, key=lambda f: f.line)
    assert not summed.fixable and not printed.fixable
    assert "waits for the device on every step anyway at `loss.item()` (line 12), a read that stays" in summed.message
    assert "logged every step" in printed.message
    logged_sometimes = PRINTED_EVERY_STEP.replace("    print(f", "    if step % 5 == 0:\n        print(f")
    [fixed] = [f for f in rewrite(logged_sometimes)[1] if f.line == 8]
    assert fixed.fixable


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


# -- sums in dict items, counters, carried counts, divisors, step functions ----------------

HEAD = """\
import torch
import torch.nn.functional as F
from collections import defaultdict

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(8, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(20)]
"""
LOOP = """\
    for step, (x, y) in enumerate(data):
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def pm404(findings) -> list:
    return [f for f in findings if f.code == PerStepHostSync.CODE]


def assert_left_alone(code: str, *reasons: str) -> list:
    """`code` is reported and not changed, each finding saying one of `reasons`."""
    new_source, findings = rewrite(code)
    assert new_source == code
    found = pm404(findings)
    assert found and not any(f.fixable for f in found), [f.message for f in found]
    for reason in reasons:
        assert any(reason in f.message for f in found), [f.message for f in found]
    return found


def assert_same_prints(code: str) -> str:
    new_source, findings = rewrite(code)
    assert new_source != code and all(f.applied for f in pm404(findings)), [f.message for f in findings]
    assert printed(new_source) == printed(code)
    return new_source


def test_dict_read_by_constant_keys_in_a_log_branch_and_reset_there():
    code = HEAD + (
        "def train():\n"
        '    stats = {"loss": 0.0, "mae": 0.0}\n' + LOOP + '        stats["loss"] += loss.item()\n'
        '        stats["mae"] += (model(x) - y).abs().mean().item()\n'
        "        if step % 5 == 4:\n"
        '            print(step, stats["loss"] / 5, stats["mae"] / 5)\n'
        '            stats = {"loss": 0.0, "mae": 0.0}\n'
        "train()\n"
    )
    new_source = assert_same_prints(code)
    assert 'float(stats["loss"]) / 5' in new_source and "stats = {" in new_source


def test_dict_of_int_counts_stays_int():
    code = HEAD + (
        "def train():\n"
        '    counts = {"pos": 0, "neg": 0}\n' + LOOP + '        counts["pos"] += (model(x) > 0).sum().item()\n'
        '        counts["neg"] += (model(x) <= 0).sum().item()\n'
        "    print(counts['pos'], counts['neg'])\n"
        "train()\n"
    )
    new_source = assert_same_prints(code)
    assert "int(counts['pos'])" in new_source


def test_dict_that_escapes_is_left_alone():
    returned = HEAD + (
        "def train():\n"
        '    stats = {"loss": 0.0}\n' + LOOP + '        stats["loss"] += loss.item()\n'
        "    return stats\n"
        "print(train())\n"
    )
    assert_left_alone(returned, "other than through constant keys")
    logged = HEAD + (
        "def log(d):\n    pass\n"
        "def train():\n"
        '    stats = {"loss": 0.0}\n' + LOOP + '        stats["loss"] += loss.item()\n'
        "        log(stats)\n"
        "train()\n"
    )
    assert_left_alone(logged, "other than through constant keys")
    aliased = HEAD + (
        "def train():\n"
        '    stats = other = {"loss": 0.0}\n' + LOOP + '        stats["loss"] += loss.item()\n'
        '    print(other["loss"])\n'
        "train()\n"
    )
    assert_left_alone(aliased, "not to a dict literal")


def test_dict_with_variable_keys_or_read_every_step_is_left_alone():
    variable_key = HEAD + (
        "def train():\n"
        '    stats = {"a": 0.0, "b": 0.0}\n' + LOOP + '        name = "a" if step % 2 else "b"\n'
        "        stats[name] += loss.item()\n"
        '    print(stats["a"])\n'
        "train()\n"
    )
    assert_left_alone(variable_key, "whose key is not a constant")
    every_step = HEAD + (
        "def train():\n"
        '    stats = {"loss": 0.0}\n' + LOOP + '        stats["loss"] += loss.item()\n'
        '        print(stats["loss"])\n'
        "train()\n"
    )
    assert_left_alone(every_step, "logged every step")


def test_dict_read_whole_needs_every_item_to_be_a_device_sum():
    code = HEAD + (
        "def train():\n"
        '    stats = {"loss": 0.0, "batches": 0}\n' + LOOP + '        stats["loss"] += loss.item()\n'
        '        stats["batches"] += 1\n'
        "    print({k: v for k, v in stats.items()})\n"
        "train()\n"
    )
    assert_left_alone(code, "read whole")


def test_defaultdict_of_float_read_whole():
    code = HEAD + (
        "def train():\n"
        "    sums = defaultdict(float)\n" + LOOP + '        sums["mse"] += loss.item()\n'
        '        sums["l1"] += F.l1_loss(model(x), y).item()\n'
        "    for name, value in sums.items():\n"
        "        print(name, value)\n"
        "train()\n"
    )
    new_source = assert_same_prints(code)
    assert "print(name, float(value))" in new_source


def test_chained_start_of_a_tensor_is_not_followed():
    code = HEAD + (
        "def train():\n    a = b = torch.zeros(())\n" + LOOP + "        a += loss.item()\n    print(a, b)\ntrain()\n"
    )
    assert_left_alone(code, "not to a number literal")


def test_carried_count_read_elsewhere_keeps_its_sync():
    code = HEAD + (
        "def train():\n"
        "    tokens, total = 0, 0.0\n" + LOOP + "        n = (y > 0).sum().item()\n"
        "        tokens += n\n"
        "        total += loss.item() * n\n"
        "        print(n)\n"
        "    print(total / max(tokens, 1))\n"
        "train()\n"
    )
    new_source, findings = rewrite(code)
    carried = [f for f in pm404(findings) if f.line == code.splitlines().index("        n = (y > 0).sum().item()") + 1]
    assert carried and not carried[0].fixable and "logged every step" in carried[0].message
    assert "n = (y > 0).sum().item()" in new_source  # still a Python int for `tokens += n`
    assert printed(new_source) == printed(code)


def test_sum_set_to_a_tensor_it_would_then_change_in_place_is_left_alone():
    """`tokens = n` and then `tokens += ...`: kept on the device, the sum would be the
    tensor `n` itself, which the in-place add would change."""
    carried = HEAD + (
        "def train():\n"
        "    total = 0.0\n" + LOOP + "        n = (y > 0).sum().item()\n"
        "        tokens = n\n"
        "        tokens += (y < 0).sum().item()\n"
        "        total += loss.item() * n\n"
        "    print(total, tokens)\n"
        "train()\n"
    )
    assert_left_alone(carried, "`n` is used every step")
    named = HEAD + (
        "def train():\n" + LOOP + "        positive = (y > 0).sum()\n"
        "        tokens = positive.item()\n"
        "        tokens += (y < 0).sum().item()\n"
        "        if step % 5 == 0:\n"
        "            print(tokens, positive)\n"
        "train()\n"
    )
    assert_left_alone(named, "would share its tensor")


def test_divisor_parameter_proven_non_zero_by_default_and_calls():
    code = HEAD + (
        "def train(accum=2):\n"
        "    total = 0.0\n" + LOOP + "        total += loss.item() / accum\n"
        "    print(total)\n"
        "train()\n"
        "train(accum=4)\n"
    )
    assert_same_prints(code)


@pytest.mark.parametrize(
    "calls",
    ["train()\ntrain(0)\n", "import sys\ntrain(int(sys.argv[-1] == 'x'))\n", "run = train\nrun()\n"],
    ids=["zero passed", "unknown argument", "handed on"],
)
def test_divisor_that_may_be_zero_is_left_alone(calls):
    code = HEAD + (
        "def train(accum=2):\n"
        "    total = 0.0\n" + LOOP + "        total += loss.item() / accum\n"
        "    print(total)\n" + calls
    )
    assert_left_alone(code, "cannot prove is a non-zero")


STEP_METHOD = HEAD + (
    "class Trainer:\n"
    "    def {name}(self, x, y):\n"
    "        loss = F.mse_loss(model(x.to(device)), y.to(device))\n"
    "        optimizer.zero_grad()\n"
    "        loss.backward()\n"
    "        optimizer.step()\n"
    "        return loss.item()\n"
    "    def fit(self):\n"
    "        running = 0.0\n"
    "        for step, (x, y) in enumerate(data):\n"
    "            running += self.{name}(x, y)\n"
    "            if step % 5 == 4:\n"
    "                print(step, running / 5)\n"
    "                running = 0.0\n"
    "{extra}"
    "Trainer().fit()\n"
)


def test_public_step_method_returning_a_sync_is_fixed_only_at_unsafe():
    code = STEP_METHOD.format(name="train_step", extra="")
    new_source, findings = rewrite(code)
    assert new_source == code
    (finding,) = pm404(findings)
    assert finding.level == Level.UNSAFE and "now returns a tensor" in finding.message
    unsafe = Settings(select=(PerStepHostSync.CODE,), level=Level.UNSAFE)
    result = process_source(code.encode(), "<fixture>", unsafe, [PerStepHostSync])
    new_source = result.new_source.decode()
    assert "return loss.detach().double()" in new_source
    assert printed(new_source) == printed(code)


def test_step_method_called_elsewhere_too_is_left_alone():
    code = STEP_METHOD.format(name="_step", extra="    def probe(self):\n        return self._step\n")
    new_source, findings = rewrite(code)
    assert new_source == code
    assert pm404(findings) and not any(f.fixable for f in pm404(findings))
    twice = STEP_METHOD.format(name="_step", extra="    def again(self, x, y):\n        return self._step(x, y)\n")
    assert rewrite(twice)[0] == twice


def test_sum_fed_by_a_step_method_and_a_sync_in_the_loop_is_fixed_once():
    code = STEP_METHOD.format(name="_step", extra="").replace(
        "            running += self._step(x, y)\n",
        "            running += self._step(x, y)\n            running += x.to(device).abs().mean().item()\n",
    )
    new_source, findings = rewrite(code)
    found = pm404(findings)
    assert len(found) == 2 and all(f.applied for f in found), [f.message for f in found]
    assert len({f.line for f in found}) == 2
    assert printed(new_source) == printed(code)


def test_step_method_called_only_at_log_time_is_not_reported():
    code = STEP_METHOD.format(name="_step", extra="").replace(
        "            running += self._step(x, y)\n            if step % 5 == 4:\n",
        "            if step % 5 == 4:\n                running += self._step(x, y)\n",
    )
    new_source, findings = rewrite(code)
    assert new_source == code and not pm404(findings)


APPENDING = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(STEPS)]
"""
STEP_LINES = """\
        x, y = x.to(device), y.to(device)
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def appending(steps: int, before: str, append: str, after: str) -> str:
    return (
        APPENDING.replace("STEPS", str(steps))
        + before
        + "for epoch in range(2):\n    for x, y in data:\n"
        + STEP_LINES
        + append
        + after
    )


@pytest.mark.parametrize("steps", [0, 3])
def test_list_filled_across_epochs_becomes_numbers_after_the_outer_loop(steps):
    """The list is bound before the epoch loop: it becomes numbers after that loop, not
    after the step loop (a second epoch would append tensors to a list of numbers); an
    empty list (no step ran) stays an empty list."""
    source = appending(
        steps,
        "losses = []\n",
        "        losses.append(loss.item())\n",
        "print(type(losses).__name__, len(losses), [type(v).__name__ for v in losses], repr(losses))\n",
    )
    new_source, findings = rewrite(source)
    assert [f.applied for f in findings] == [True]
    assert "losses.append(loss.detach())\nlosses = torch.stack(losses).tolist() if losses else []\nprint(" in new_source
    assert printed(new_source) == printed(source)


def test_list_bound_per_epoch_becomes_numbers_after_the_step_loop():
    source = (
        APPENDING.replace("STEPS", "4")
        + "for epoch in range(2):\n    losses = []\n    for x, y in data:\n"
        + STEP_LINES
        + "        losses.append(loss.item())\n"
        + "    print(epoch, sum(losses) / len(losses), losses)\n"
    )
    new_source, findings = rewrite(source)
    assert [f.applied for f in findings] == [True]
    assert "\n    losses = torch.stack(losses).tolist() if losses else []\n    print(epoch" in new_source
    assert printed(new_source) == printed(source)


@pytest.mark.parametrize(
    "before, after, reason",
    [
        ("losses = [0.0]\n", "print(losses)\n", "`losses` does not start as an empty list literal (line 10)"),
        ("losses = []\nlog = {'loss': losses}\n", "print(log)\n", "`losses` is read before the loop ends (line 11)"),
        ("history = defaultdict(list)\n", "print(history)\n", "does not start as an empty list literal"),
        (
            "losses = []\ntry:\n    pass\nexcept KeyboardInterrupt:\n    pass\n",
            "print(losses)\n",
            None,
        ),
    ],
)
def test_lists_that_others_may_see_holding_tensors_stay_numbers(before, after, reason):
    append = (
        "        history['loss'].append(loss.item())\n"
        if "history" in before
        else "        losses.append(loss.item())\n"
    )
    source = "from collections import defaultdict\n" + appending(3, before, append, after)
    new_source, findings = rewrite(source)
    if reason is None:  # the control: a try before the loop changes nothing
        assert [f.applied for f in findings] == [True]
        return
    assert new_source == source
    assert [f.fixable for f in findings] == [False]
    assert "its value is stored every step" in findings[0].message
    assert reason in findings[0].message


def test_list_read_where_an_interrupted_loop_lands_stays_numbers():
    source = APPENDING.replace("STEPS", "3") + (
        "try:\n    losses = []\n    for x, y in data:\n"
        + STEP_LINES
        + "        losses.append(loss.item())\n"
        + "    print(losses)\n"
        + "except KeyboardInterrupt:\n    print(losses)\n"
    )
    new_source, findings = rewrite(source)
    assert new_source == source
    assert "read where an exception lands (line 20)" in findings[0].message


# -- int64 counts in arithmetic --------------------------------------------------------------

COUNTS = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(16, 4).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
acc = ACC
for step in range(40):
    x, y = torch.randn(7, 16, device=device), torch.randint(0, 4, (7,), device=device)
    out = model(x)
    loss = F.cross_entropy(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    acc += TERM
    if step % 5 == 4:
        print(repr(acc))
        acc = ACC
"""


@pytest.mark.parametrize(
    "term",
    [
        "(out.argmax(1) == y).sum().item() / 7",
        "(out.argmax(1) == y).sum().item() * 0.1",
        "3 * (out.argmax(1) == y).sum().item() / 7 - 1",
        "(out.argmax(1) == y).sum().item() / 7 + loss.item()",
        "y.max().item() / 7",  # `y` of torch.randint: int64
    ],
)
def test_an_int64_count_in_arithmetic_is_summed_in_double_and_prints_the_same(term):
    # The sum of a comparison is int64: it enters the float64 sum through `.double()`, where
    # `+ - * /` with Python numbers round as Python's do on the int it would have read.
    code = COUNTS.replace("ACC", "0.0").replace("TERM", term)
    new_source = assert_same_prints(code)
    assert f"acc += {term.replace('.item()', '.detach().double()')}\n" in new_source


def test_a_sum_starting_as_an_int_with_a_count_in_arithmetic_says_why_it_stays():
    code = COUNTS.replace("ACC", "0").replace("TERM", "(out.argmax(1) == y).sum().item() * 2")
    (finding,) = assert_left_alone(code, "`acc` starts as an int, and whether it stays one depends on the arithmetic")
    assert "cannot tell" not in finding.message


def test_a_value_of_unknown_dtype_in_arithmetic_is_left_alone_with_that_reason():
    code = COUNTS.replace("ACC", "0.0").replace("TERM", "torch.stack([y, y]).sum().item() / 7")
    assert_left_alone(code, "perfmod cannot tell whether `torch.stack([y, y]).sum().item()` gives an int or a float")

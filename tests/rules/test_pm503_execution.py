"""PM503: the vectorized loss is the loop's loss, and trains the same model.

Everything runs in float64 on the CPU. The rewrite adds the same per-position
means in another order, so the losses and gradients agree to rounding: the
largest relative differences measured (torch 2.13, CPU) were 2.2e-16 for the
snippets' losses and 1.1e-16 for their gradients (relative to the largest
entry), and for the fixtures identical losses and weights within 3.3e-16
after 8 optimizer steps. RTOL = 1e-12 leaves three orders of magnitude of
headroom and still fails on any change of scale (a missing `/ count`, a mean
where the loop summed, an off-by-one slice), which moves the loss by 1e-3 or
more (test_padding_makes_the_flat_mean_differ_so_the_check_can_fail).
"""

from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.per_position_loss_loop import PerPositionLossLoop
from tests.rules.scripts import losses, one_thread, rewrite

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "rules" / "PM503"
RTOL = 1e-12

SETUP = """\
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
logits = torch.randn(5, 9, 7, dtype=torch.float64, requires_grad=True)
targets = torch.randint(1, 7, (5, 9))
targets[torch.rand(5, 9) < {padding}] = {ignore}
"""
# (name, padding probability, ignored id, statements before the loop, the loop)
LOOPS = [
    ("mean", 0.3, -100, "", "for t in range(9):\n    loss += F.cross_entropy(logits[:, t], targets[:, t])"),
    (
        "mean_no_padding",
        0.0,
        -100,
        "",
        "for t in range(9):\n    loss += F.cross_entropy(logits[:, t, :], targets[:, t])",
    ),
    (
        "k_tokens_over_k",
        0.3,
        -100,
        "K = 4",
        "for k in range(K):\n    loss = loss + F.cross_entropy(logits[:, k], targets[:, k]) / K",
    ),
    (
        "shifted_from_start",
        0.3,
        -100,
        "",
        "for t in range(2, 9):\n    loss += F.cross_entropy(logits[:, t - 2], targets[:, t], label_smoothing=0.1)",
    ),
    (
        "explicit_ignore_index",
        0.4,
        0,
        "",
        "for t in range(1, 8):\n    loss += F.cross_entropy(logits[:, t + 1], targets[:, t], ignore_index=0)",
    ),
    (
        "last_k_through_a_name",
        0.3,
        -100,
        "K = 4",
        "for k in range(K):\n    step_logits = logits[:, -K + k, :]\n    loss = loss + F.cross_entropy(step_logits, targets[:, k])",
    ),
    (
        "last_positions_from_one",
        0.3,
        -100,
        "K = 5",
        "for k in range(1, K):\n    loss += F.cross_entropy(logits[:, k - K], targets[:, k])",
    ),
    (
        "sum",
        0.3,
        -100,
        "",
        'for t in range(9):\n    loss += F.cross_entropy(logits[:, t], targets[:, t], reduction="sum")',
    ),
    (
        "module_mean",
        0.3,
        0,
        "criterion = nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.2)",
        "for t in range(9):\n    loss += criterion(logits[:, t], targets[:, t])",
    ),
    (
        "module_sum",
        0.3,
        -100,
        "criterion = nn.CrossEntropyLoss(reduction='sum')",
        "T = 6\nfor t in range(T):\n    loss += criterion(logits[:, t], targets[:, t + 3]) * 0.5",
    ),
]


def run(source: str) -> tuple[torch.Tensor, torch.Tensor]:
    namespace: dict = {}
    with one_thread():
        exec(compile(source, "<snippet>", "exec"), namespace)
        namespace["loss"].backward()
    return namespace["loss"].detach(), namespace["logits"].grad


@pytest.mark.parametrize("name,padding,ignore,before,loop", LOOPS, ids=[case[0] for case in LOOPS])
def test_vectorized_loss_and_gradient_match_the_loop(name, padding, ignore, before, loop):
    source = SETUP.format(padding=padding, ignore=ignore) + before + "\nloss = 0.0\n" + loop + "\n"
    new_source = rewrite(source, [PerPositionLossLoop])
    assert "for " not in new_source.split("loss = 0.0")[1] and "step_logits" not in new_source  # the loop is gone
    want_loss, want_grad = run(source)
    got_loss, got_grad = run(new_source)
    torch.testing.assert_close(got_loss, want_loss, rtol=RTOL, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=RTOL, atol=1e-18)
    assert want_grad.abs().sum() > 0


def test_padding_makes_the_flat_mean_differ_so_the_check_can_fail():
    """The naive rewrite (K times the mean over all tokens) is off when positions
    have different counts of ignored targets: the test above would catch it."""
    source = SETUP.format(padding=0.3, ignore=-100) + "\nloss = 0.0\n" + LOOPS[0][-1] + "\n"
    want_loss, _ = run(source)
    naive = source.replace(LOOPS[0][-1], "loss = 9 * F.cross_entropy(logits.flatten(0, 1), targets.flatten())")
    naive_loss, _ = run(naive)
    assert abs(naive_loss - want_loss) / want_loss > 1e-3


def load_main(source: str):
    namespace = {"__name__": "fixture"}
    exec(compile(source, "<fixture>", "exec"), namespace)
    return namespace["main"]


@pytest.mark.parametrize("case", ["k_token_loss", "multi_token_head", "distill_first_k"])
def test_rewritten_fixture_trains_the_same_model(case):
    source = (FIXTURES / f"{case}.in.py").read_text()
    new_source = (FIXTURES / f"{case}.out.py").read_text()
    assert new_source == rewrite(source, [PerPositionLossLoop])
    with one_thread():
        want_losses, want_model = load_main(source)()
        got_losses, got_model = load_main(new_source)()
    want_losses, got_losses = torch.tensor(want_losses), torch.tensor(got_losses)
    assert torch.isfinite(want_losses).all() and len(want_losses) == 8
    torch.testing.assert_close(got_losses, want_losses, rtol=RTOL, atol=0)
    for (name, got), (_, want) in zip(got_model.named_parameters(), want_model.named_parameters()):
        torch.testing.assert_close(got, want, rtol=RTOL, atol=1e-15, msg=name)


def test_seed_scripts_k_token_loss_keeps_its_value_and_gradient():
    """fixtures/scripts/seed_latentwire.py's own `k_token_loss` (the last K positions,
    through a name), rewritten, on padded float64 logits."""
    seed = (ROOT / "fixtures" / "scripts" / "seed_latentwire.py").read_text()
    new_seed = rewrite(seed, [PerPositionLossLoop])
    assert "for k in range(k_positions)" in seed and "for k in range(k_positions)" not in new_seed
    results = []
    for source in (seed, new_seed):
        namespace = {"__name__": "seed"}
        exec(compile(source, "<seed>", "exec"), namespace)
        torch.manual_seed(0)
        logits = torch.randn(6, 12, 20, dtype=torch.float64, requires_grad=True)
        targets = torch.randint(20, (6, 4))
        targets[torch.rand(6, 4) < 0.3] = -100
        with one_thread():
            loss = namespace["k_token_loss"](logits, targets, 4)
            loss.backward()
        results.append((loss.detach(), logits.grad))
    (want_loss, want_grad), (got_loss, got_grad) = results
    torch.testing.assert_close(got_loss, want_loss, rtol=RTOL, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=RTOL, atol=1e-18)
    assert want_grad[:, -4:].abs().sum() > 0 and want_grad[:, :-4].abs().sum() == 0


FIXED_EXAMPLES = [case for case in PerPositionLossLoop.INVALID if case.expected_replacement is not None]


@pytest.mark.parametrize("case", FIXED_EXAMPLES, ids=[case.note or "first" for case in FIXED_EXAMPLES])
def test_every_fixed_example_keeps_the_loss_and_its_gradient(case):
    """The rule's own examples, run: same seed, same data (float32, so 1e-5)."""
    results = []
    for source in (case.code, case.expected_replacement):
        namespace: dict = {}
        torch.manual_seed(0)
        with one_thread():
            exec(compile(source + "loss.backward()\n", "<example>", "exec"), namespace)
        results.append((namespace["loss"].detach(), namespace["logits"].grad))
    (want_loss, want_grad), (got_loss, got_grad) = results
    assert want_grad.abs().sum() > 0
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-7)


# A later loop over the same name rebinds it before reading it: the per-position loop's
# last `t` is never read, so the loop can go (the masked form, and the list of losses).
REBOUND = {
    "masked_then_a_second_loop": """\
def loss_fn(logits, tags, mask):
    T = logits.size(1)
    ce = 0.0
    for t in range(T):
        tok_loss = F.cross_entropy(logits[:, t], tags[:, t], reduction="none")
        ce = ce + (tok_loss * mask[:, t]).sum()
    kd = 0.0
    for t in range(T):
        kd = kd + F.mse_loss(logits[:, t], logits[:, t].detach() * 0.5)
    return ce / mask.sum() + kd
""",
    "listed_then_a_second_loop": """\
criterion = nn.CrossEntropyLoss(ignore_index=-100)


def loss_fn(logits, tags, mask):
    T = logits.size(1)
    step_losses = []
    for t in range(T):
        step_losses.append(criterion(logits[:, t, :], tags[:, t]))
    loss = torch.stack(step_losses).sum() / T
    for t in range(1, 4):
        loss = loss + logits[:, t].square().mean()
    return loss
""",
}


@pytest.mark.parametrize("name", REBOUND)
def test_a_later_loop_that_rebinds_the_position_does_not_block_the_fix(name):
    source = "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n\n" + REBOUND[name]
    new_source = rewrite(source, [PerPositionLossLoop])
    found = process_source(
        source.encode(),
        "<rebound>",
        Settings(select=("PM503",), level=Level.UNSAFE, fixed_point=False),
        [PerPositionLossLoop],
    )
    assert found.findings and all(f.applied for f in found.findings), (
        found.findings
    )  # one round, as `check`: none refused
    assert new_source.count("for t in") == source.count("for t in") - (2 if name.startswith("masked") else 1)
    results = []
    for code in (source, new_source):
        namespace: dict = {}
        exec(compile(code, "<rebound>", "exec"), namespace)
        torch.manual_seed(0)
        logits = torch.randn(5, 9, 7, dtype=torch.float64, requires_grad=True)
        tags = torch.randint(7, (5, 9))
        tags[torch.rand(5, 9) < 0.3] = -100
        mask = (tags != -100).double()
        tags = tags.clamp(min=0) if name.startswith("masked") else tags
        with one_thread():
            loss = namespace["loss_fn"](logits, tags, mask)
            loss.backward()
        results.append((loss.detach(), logits.grad))
    (want_loss, want_grad), (got_loss, got_grad) = results
    assert want_grad.abs().sum() > 0
    torch.testing.assert_close(got_loss, want_loss, rtol=RTOL, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=RTOL, atol=1e-18)


@pytest.mark.parametrize(
    "after",
    ["for t in range(n):\n    pass\nprint(t)\n", "if flag:\n    t = 0\nprint(t)\n"],
    ids=["a_later_loop_that_may_not_run", "a_rebinding_on_one_path"],
)
def test_a_read_the_loops_last_position_may_reach_still_blocks_the_fix(after):
    source = (
        "import torch\nimport torch.nn.functional as F\nlogits = torch.randn(4, 6, 10)\n"
        "targets = torch.randint(10, (4, 6))\nloss = 0.0\nfor t in range(6):\n"
        "    loss += F.cross_entropy(logits[:, t], targets[:, t])\n" + after
    )
    settings = Settings(select=("PM503",), level=Level.UNSAFE)
    result = process_source(source.encode(), "<after>", settings, [PerPositionLossLoop])
    assert [f.applied for f in result.findings] == [False], result.findings
    assert "`t` is read after the loop" in result.findings[0].message, result.findings[0].message


# nn.LSTM's default layout is time-major: (T, B, H) out, `logits[t]` one step of every
# sample (the blind round's #9: only `[:, t]` was read as a position, `[t]` gave no finding).
TIME_MAJOR = """\
import torch
import torch.nn.functional as F
from torch import nn
torch.manual_seed(0)
rnn, head = nn.LSTM(5, 6).double(), nn.Linear(6, 7).double()
out, _ = rnn(torch.randn(9, 4, 5, dtype=torch.float64))
logits = head(out)
logits.retain_grad()
targets = torch.randint(1, 7, (9, 4))
targets[torch.rand(9, 4) < 0.3] = -100
"""
TIME_MAJOR_LOOPS = {
    "mean": "loss = 0.0\nfor t in range(logits.size(0)):\n    loss = loss + F.cross_entropy(logits[t], targets[t])\n",
    "shifted_sum": (
        'loss = 0.0\nfor t in range(8):\n    loss += F.cross_entropy(logits[t], targets[t + 1], reduction="sum") / 8\n'
    ),
    "listed": (
        "losses = []\nfor t in range(9):\n    losses.append(F.cross_entropy(logits[t, :], targets[t]))\n"
        "loss = torch.stack(losses).mean()\n"
    ),
    "generator": "loss = sum(F.cross_entropy(logits[t], targets[t]) for t in range(9))\n",
}


@pytest.mark.parametrize("name", TIME_MAJOR_LOOPS)
def test_a_loop_over_the_steps_of_a_time_major_lstm_output_is_one_call(name):
    source = TIME_MAJOR + TIME_MAJOR_LOOPS[name]
    new_source = rewrite(source, [PerPositionLossLoop])
    assert "for t in" not in new_source and "[:, " not in new_source, new_source
    assert ".sum(1)" in new_source or 'reduction="sum"' in new_source  # each position over the samples: dim 1
    want_loss, want_grad = run(source)
    got_loss, got_grad = run(new_source)
    torch.testing.assert_close(got_loss, want_loss, rtol=RTOL, atol=0)
    torch.testing.assert_close(got_grad, want_grad, rtol=RTOL, atol=1e-18)
    assert want_grad.abs().sum() > 0


def test_the_blind_rounds_time_major_program_trains_the_same_model():
    """fixtures/wild/blind10/seq_first_lstm_position_loss.py, the model's output read through
    its own `forward`: rewritten, it prints the same losses within the rule's level."""
    source = (ROOT / "fixtures" / "wild" / "blind10" / "seq_first_lstm_position_loss.py").read_text()
    source = source.replace("range(30)", "range(4)").replace(
        "        wild_losses.append(loss.detach())\n",
        "        wild_losses.append(loss.detach())\n        print('loss', repr(loss.item()))\n",
    )
    new_source = rewrite(source, [PerPositionLossLoop])
    assert "for t in range(inp.size(0))" not in new_source and "logits[: inp.size(0)]" in new_source, new_source
    want, got = losses(source), losses(new_source)
    assert len(want) == 4
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)

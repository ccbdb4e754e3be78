"""Where a value read to the host goes (codemod.analysis.host_reads): which reads run
every step, the dtype `.item()` gives, and how each read can wait until its value is
used, or the reason it stays."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from codemod.analysis.host_reads import (
    AS_COUNT,
    AS_DETACHED,
    AS_DOUBLE,
    AS_FLOAT,
    AS_INT,
    AS_TENSOR,
    CARRIED,
    LISTED,
    MOVED,
    RETURNED,
    SUMMED,
    Kept,
    host_reads,
)
from codemod.analysis.values import BOOL, FLOAT, INT64
from codemod.context import FileContext

HEAD = """\
import torch
import torch.nn.functional as F

device = "cuda"
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)).to(device)
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
batches = [(torch.randn(8, 16), torch.randint(0, 3, (8,))) for _ in range(20)]
"""
STEP = """\
inputs, labels = inputs.to(device), labels.to(device)
logits = net(inputs)
loss = F.cross_entropy(logits, labels)
opt.zero_grad()
loss.backward()
opt.step()
"""


def program(before: str, each_step: str, after: str = "") -> FileContext:
    """A training function: `before` the loop over epochs, `each_step` at the end of every
    step, `after` the loops (each indented as the function's body)."""
    body = (
        textwrap.indent(textwrap.dedent(before), "    ")
        + "    for epoch in range(epochs):\n        for step, (inputs, labels) in enumerate(batches):\n"
        + textwrap.indent(STEP + textwrap.dedent(each_step), "            ")
        + textwrap.indent(textwrap.dedent(after), "    ")
    )
    return FileContext.of_source(HEAD + "\ndef train(epochs):\n" + body)


def outcomes(ctx: FileContext) -> dict[str, object]:
    """Each read of the step loop, by the code of its statement (an `if`'s test for a read
    in one): its deferrals, or why it stays."""
    scan = host_reads(ctx).loop(ctx.loops.step_loops[0])
    found = {}
    for read in scan.reads():
        statement = next(a for a in ctx.index.ancestors(read) if isinstance(a, (cst.SimpleStatementLine, cst.If)))
        key = f"if {ctx.source(statement.test)}" if isinstance(statement, cst.If) else ctx.source(statement).strip()
        try:
            found[key] = scan.defer(read)
        except Kept as why:
            found[key] = str(why)
    return found


def changes(ctx: FileContext, deferral) -> list[tuple[str, str]]:
    return [(ctx.source(node), change) for node, change in deferral.changes]


def test_a_list_appended_every_step_and_read_after_the_loop_keeps_tensors():
    ctx = program("losses = []\n", "losses.append(loss.item())\n", "print(sum(losses) / len(losses))\n")
    [deferral] = outcomes(ctx)["losses.append(loss.item())"]
    assert deferral.way == LISTED and deferral.holder == "losses" and deferral.scalar
    assert changes(ctx, deferral) == [("loss.item()", AS_DETACHED)]
    assert isinstance(deferral.after, cst.For) and ctx.source(deferral.after.iter) == "range(epochs)"


def test_a_list_in_a_dict_of_lists_is_followed_by_its_constant_key():
    ctx = program(
        'history = {"loss": [], "acc": []}\n',
        'history["loss"].append(loss.item())\nhistory["acc"].append(0.5)\n',
        'print(history["loss"][-1], history["acc"])\n',
    )
    [deferral] = outcomes(ctx)['history["loss"].append(loss.item())']
    assert deferral.way == LISTED and deferral.holder == 'history["loss"]'


def test_a_list_read_inside_the_loop_stays_numbers():
    ctx = program(
        "losses = []\n", "losses.append(loss.item())\nif len(losses) > 3 and losses[-1] > losses[-2]:\n    break\n"
    )
    why = outcomes(ctx)["losses.append(loss.item())"]
    assert "is read before the loop ends" in why


def test_a_value_that_decides_control_flow_stays():
    ctx = program('best = float("inf")\n', "if loss.item() < best:\n    best = loss.item()\n")
    found = outcomes(ctx)
    assert "its value decides control flow every step" in found["if loss.item() < best"]
    assert "`best` decides control flow every step" in found["best = loss.item()"]


def test_a_value_printed_every_step_stays_and_says_where():
    why = outcomes(program("", 'print("loss", loss.item())\n'))['print("loss", loss.item())']
    assert "logged every step (`print`" in why


def test_a_value_read_only_in_a_log_branch_moves_there():
    ctx = program("", "seen = loss.item()\nif step % 25 == 0:\n    print(epoch, seen)\n")
    [deferral] = outcomes(ctx)["seen = loss.item()"]
    assert deferral.way == MOVED and deferral.holder == "seen"
    [(branch, statement)] = deferral.moves
    assert ctx.source(branch.test) == "step % 25 == 0" and ctx.source(statement).strip() == "seen = loss.item()"


def test_a_running_sum_stays_on_the_device_in_float64_and_is_read_as_a_float():
    ctx = program(
        "running = 0.0\n", "running += loss.item()\nif step % 5 == 4:\n    print(running / 5)\n    running = 0.0\n"
    )
    [deferral] = outcomes(ctx)["running += loss.item()"]
    assert deferral.way == SUMMED and deferral.holder == "running" and not deferral.int_sum
    assert deferral.places == ("at log time",)
    assert changes(ctx, deferral) == [("loss.item()", AS_TENSOR), ("running", AS_FLOAT)]


def test_a_count_stays_int64_and_a_count_carried_into_a_float_sum_becomes_double():
    ctx = program(
        "hits = 0\ntotal = 0.0\n",
        "n = labels.size(0)\nright = (logits.argmax(-1) == labels).sum().item()\nhits += right\n"
        "total += loss.item() * right\n",
        "print(hits, total / 100)\n",
    )
    found = outcomes(ctx)
    carried = found["right = (logits.argmax(-1) == labels).sum().item()"]
    ways = {d.way: d for d in carried}
    assert set(ways) == {SUMMED, CARRIED}  # one group: the count, and the float sum fed by its read
    assert ways[CARRIED].holder == "right" and ways[CARRIED].int_sum and ways[CARRIED].sums == ("hits", "total")
    assert dict(changes(ctx, ways[CARRIED])) == {
        "(logits.argmax(-1) == labels).sum().item()": AS_COUNT,
        "loss.item()": AS_TENSOR,
        "right": AS_DOUBLE,
        "total": AS_FLOAT,
        "hits": AS_INT,
    }
    assert found["total += loss.item() * right"] == []  # planned with the group above


def test_a_step_function_returning_a_read_into_a_sum_returns_the_tensor():
    ctx = FileContext.of_source(
        HEAD + "def _step(inputs, labels):\n    loss = F.cross_entropy(net(inputs.to(device)), labels.to(device))\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n    return loss.item()\n"
        "total = 0.0\nfor inputs, labels in batches:\n    total += _step(inputs, labels)\nprint(total)\n"
    )
    scan = host_reads(ctx).loop(ctx.loops.step_loops[0])
    [(call, [read])] = scan.returning_calls()
    [deferral] = scan.defer_returned(call)
    assert deferral.way == RETURNED and deferral.read is read and deferral.call is call
    assert deferral.function.name.value == "_step" and not deferral.exported
    assert changes(ctx, deferral) == [("loss.item()", AS_TENSOR), ("total", AS_FLOAT)]


def test_reads_under_a_periodic_test_are_not_every_step_reads():
    ctx = program("", "if step % 10 == 0:\n    print(loss.item())\nv = loss.detach().cpu().item()\n")
    scan = host_reads(ctx).loop(ctx.loops.step_loops[0])
    # `.cpu()` waits; the `.item()` of its host copy waits for nothing
    assert [ctx.source(r) for r in scan.reads()] == ["loss.detach().cpu()"]


@pytest.mark.parametrize(
    ("expr", "kind"),
    [
        ("loss.item()", "item"),
        ("float(loss)", "float"),
        ("logits.argmax(-1).tolist()", "tolist"),
        ("logits.cpu()", "cpu"),
        ("net.cpu()", None),  # a module moved, not a value read
        ("torch.randn(3).sum().item()", None),  # a host tensor: nothing to wait for
        ("float(epoch)", None),
    ],
)
def test_read_kind(expr, kind):
    ctx = program("", f"probe = {expr}\n")
    scan = host_reads(ctx).loop(ctx.loops.step_loops[0])
    call = next(c for c in ctx.index.find(cst.Call) if ctx.source(c) == expr)
    assert scan.read_kind(call) == kind


@pytest.mark.parametrize(
    ("expr", "dtype"),
    [
        ("loss", FLOAT),  # backpropagated: floating point
        ("logits.argmax(-1)", INT64),
        ("logits.argmax(-1) == labels", BOOL),
        ("(logits.argmax(-1) == labels).sum()", INT64),
        ("(logits.argmax(-1) == labels).float().mean()", FLOAT),
        ("loss * 2", FLOAT),
        ("logits.argmax(-1).sum() + 1", INT64),
        ("labels", None),  # a batch of unknown dtype
        # factories: float32 by default, int64 for randint, or the dtype they are given
        ("torch.randint(0, 3, (8,)).max()", INT64),
        ("torch.randint(0, 3, (8,), dtype=torch.float32).max()", FLOAT),
        ("torch.zeros(8).sum()", FLOAT),
        ("torch.ones(8, dtype=torch.long).sum()", INT64),
        ("torch.zeros(8, dtype=torch.bool)", BOOL),
        ("torch.zeros(8, dtype=torch.int32).sum()", None),  # a dtype this analysis does not follow
    ],
)
def test_dtype_of_what_item_reads(expr, dtype):
    ctx = program("", f"probe = ({expr}).item()\n")
    scan = host_reads(ctx).loop(ctx.loops.step_loops[0])
    node = next(c for c in ctx.index.find(cst.Call) if ctx.source(c) == f"({expr}).item()").func.value
    assert scan.dtype(node) == dtype


def test_reads_in_a_function_the_loop_calls_every_step_name_the_call():
    ctx = FileContext.of_source(
        HEAD + "def accuracy(logits, labels):\n    return (logits.argmax(-1) == labels).float().mean().item()\n"
        "def report(loss):\n    print(loss.item())\n"
        "for step, (inputs, labels) in enumerate(batches):\n"
        + textwrap.indent(STEP, "    ")
        + "    acc = accuracy(logits, labels)\n    if step % 10 == 0:\n        report(loss)\n"
    )
    loop = ctx.loops.step_loops[0]
    found = [(ctx.source(read), ctx.source(call)) for read, call in host_reads(ctx).in_functions(loop)]
    assert found == [("(logits.argmax(-1) == labels).float().mean().item()", "accuracy(logits, labels)")]

"""`time_loops`: a loop over time read as a recurrence (its states, what it collects,
what is read after it), and the loops it is not, with the reason.

The preallocated recurrence is also run: the rule's rewrite, built from these answers,
must compute the tensor the loop filled."""

import libcst as cst
import pytest
import torch

from codemod.analysis.time_loops import Const, New, Prev, Timed, Unsupported, time_loops
from codemod.context import FileContext
from codemod.rules.time_loop_recurrence import TimeLoopRecurrence
from tests.rules.scripts import rewrite

PREALLOCATED = """\
import torch
def smooth(x, w: torch.Tensor):
    states = torch.zeros_like(x)
    states[:, 0] = x[:, 0]
    for t in range(1, x.shape[1]):
        states[:, t] = states[:, t - 1] * w + x[:, t]
    return states
"""
STACKED = """\
import torch
def decayed(inputs, gates):
    h = torch.zeros_like(inputs[0])
    out = []
    for step in range(inputs.shape[0]):
        h = gates[step] * h + inputs[step]
        out.append(h)
    out = torch.stack(out)
    return out, h
"""
BRANCHED = """\
import torch
def gated(x, a):
    h = torch.zeros_like(x[:, 0])
    hs = []
    for t in range(x.shape[1]):
        if h.sum() > 0:
            h = a * h + x[:, t]
        else:
            h = x[:, t]
        hs.append(h)
    return torch.stack(hs, dim=1)
"""


def read(source: str):
    context = FileContext.of_source(source)
    loop = next(iter(context.index.find(cst.For, within=context.module)))
    return context, loop, time_loops(context)


def test_the_analysis_is_built_once_per_file():
    context, _, loops = read(STACKED)
    assert time_loops(context) is loops


def test_a_state_kept_in_the_slots_of_a_preallocated_tensor():
    context, loop, loops = read(PREALLOCATED)
    code = context.module.code_for_node
    assert loops.candidate(loop)
    model = loops.read(loop)
    assert model.time == "t" and code(model.steps.start) == "1" and code(model.steps.stop) == "x.shape[1]"
    (state,) = model.states.values()
    assert state.name == "states"
    # before the first step, the slot before it (copied: the loop overwrites the slots)
    assert code(state.initial) == "states[:, 0].clone()"
    assert isinstance(state.a, Const) and code(state.a.node) == "w"
    assert isinstance(state.x, Timed) and state.x.time == 1 and code(state.x.tensor) == "x"
    (output,) = model.outputs
    assert (output.kind, output.name, output.slot_time) == ("slot", "states", 1)
    assert isinstance(output.value, New) and output.value.state == "states"
    assert loops.order(model) == ["states"]
    assert loops.stacked_outputs(model) == {}  # nothing is stacked: the slots hold the values
    assert loops.read_after(model) == set()  # a slot state's values are in its tensor
    assert loops.attention(model, state) is None  # a scan, not linear attention


def test_a_loop_over_reversed_steps_runs_backwards_from_the_slot_after_its_first_step():
    """`reversed(range(...))` is the same steps, run from the last: a state kept in slots
    reads the slot after (`h[:, t + 1]`), and starts from the slot at the loop's stop."""
    source = PREALLOCATED.replace("range(1, x.shape[1])", "reversed(range(x.shape[1] - 1))").replace(
        "states[:, t - 1]", "states[:, t + 1]"
    )
    context, loop, loops = read(source)
    code = context.module.code_for_node
    model = loops.read(loop)
    assert model.steps.reverse and model.steps.start is None and code(model.steps.stop) == "x.shape[1] - 1"
    (state,) = model.states.values()
    assert code(state.initial) == "states[:, x.shape[1] - 1].clone()"
    assert isinstance(state.x, Timed) and code(state.x.tensor) == "x"
    forwards = source.replace("reversed(range(x.shape[1] - 1))", "range(x.shape[1] - 1)")
    _, loop, loops = read(forwards)
    with pytest.raises(Unsupported, match="the step indexes other than"):  # forwards, the next slot is no state
        loops.read(loop)


def test_the_preallocated_recurrence_rewritten_fills_the_same_tensor():
    fixed = rewrite(PREALLOCATED, [TimeLoopRecurrence])
    assert "linear_recurrence" in fixed and "for t in" not in fixed
    x, w = torch.randn(3, 7, 4, dtype=torch.float64), torch.rand(4, dtype=torch.float64)
    before, after = {}, {}
    exec(compile(PREALLOCATED, "<loop>", "exec"), before)
    exec(compile(fixed, "<fixed>", "exec"), after)
    torch.testing.assert_close(after["smooth"](x, w), before["smooth"](x, w), rtol=1e-12, atol=1e-12)


def test_a_list_of_states_stacked_and_rebound_after_the_loop():
    context, loop, loops = read(STACKED)
    code = context.module.code_for_node
    model = loops.read(loop)
    (state,) = model.states.values()
    assert state.name == "h" and state.initial is None
    assert isinstance(state.a, Timed) and code(state.a.tensor) == "gates" and state.a.time == 0
    assert isinstance(state.x, Timed) and code(state.x.tensor) == "inputs"
    (output,) = model.outputs
    assert (output.kind, output.name) == ("list", "out")
    assert isinstance(output.value, New)  # the state after the step's update
    (stacked,) = loops.stacked_outputs(model).values()
    assert code(stacked.init).strip() == "out = []"
    assert code(stacked.stack) == "torch.stack(out)"
    assert (stacked.dim, stacked.cat, stacked.between) == (0, False, [])
    assert code(stacked.after).strip() == "out = torch.stack(out)"  # rebound to the stack
    assert loops.read_after(model) == {"h"}  # returned: the kernel must give the last state


def test_a_list_read_other_than_by_one_stack_is_unsupported_with_the_reason():
    source = STACKED.replace("    out = torch.stack(out)\n", "    print(len(out))\n    out = torch.stack(out)\n")
    _, loop, loops = read(source)
    with pytest.raises(Unsupported, match="`out` is read more than once after the loop"):
        loops.stacked_outputs(loops.read(loop))


def test_a_state_that_feeds_a_data_dependent_branch_is_not_a_recurrence():
    _, loop, loops = read(BRANCHED)
    # which update runs depends on the state's value: no single S = a * S + x
    assert not loops.candidate(loop)
    with pytest.raises(Unsupported, match="the loop body holds a `if` statement"):
        loops.read(loop)
    assert not loops.looks_like_recurrence(loop)  # not even worth a report


def test_a_state_passed_through_a_cell_is_not_reported_as_a_recurrence():
    source = STACKED.replace("gates[step] * h + inputs[step]", "gates[step] * cell(h) + inputs[step]")
    _, loop, loops = read(source)
    with pytest.raises(Unsupported):
        loops.read(loop)
    assert not loops.looks_like_recurrence(loop)  # an RNN cell, not a linear recurrence


def test_a_decayed_state_under_a_nonlinearity_is_reported_with_the_reason():
    nonlinear = BRANCHED.replace(
        "        if h.sum() > 0:\n            h = a * h + x[:, t]\n        else:\n            h = x[:, t]\n",
        "        h = torch.tanh(a * h + x[:, t])\n",
    )
    _, loop, loops = read(nonlinear)
    assert loops.candidate(loop)
    with pytest.raises(Unsupported, match="not linear|nonlinear|non-linear|tanh"):
        loops.read(loop)
    assert loops.looks_like_recurrence(loop)  # a state scaled by a factor free of it, over x's dim 1


def test_a_state_collected_before_its_update_is_the_value_the_step_starts_from():
    before = STACKED.replace(
        "        h = gates[step] * h + inputs[step]\n        out.append(h)\n",
        "        out.append(h)\n        h = gates[step] * h + inputs[step]\n",
    )
    _, loop, loops = read(before)
    model = loops.read(loop)
    (output,) = model.outputs
    assert isinstance(output.value, Prev) and output.value.state == "h"


# -- which loops that are not rewritten are reported (blind test 7, #10) ------------------

TANH_CELL = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


class TanhCell(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.wx = nn.Linear(d, d)
        self.wh = nn.Linear(d, d, bias=False)

    def forward(self, x):
        h = torch.zeros_like(x[:, 0])
        outs = []
        for t in range(x.size(1)):
            h = torch.tanh(self.wx(x[:, t]) + self.wh(h))
            outs.append(h)
        return torch.stack(outs, 1)
"""


def pm505_findings(source: str):
    from codemod.config import Settings
    from codemod.engine import process_source
    from codemod.rule import Level

    result = process_source(
        source.encode(), "t.py", Settings(select=("PM505",), level=Level.NUMERIC), [TimeLoopRecurrence]
    )
    assert result.error is None, result.error
    return [(f.line, f.fixable, f.message) for f in result.findings]


def test_an_rnn_cell_whose_state_goes_through_a_linear_layer_is_reported_as_not_linear_in_its_state():
    context, _, loops = read(TANH_CELL)
    loop = next(iter(context.index.find(cst.For)))
    with pytest.raises(Unsupported, match="the update of `h` is not linear in it"):
        loops.read(loop)
    assert loops.looks_like_recurrence(loop)  # `h` is handed from step to step, through math
    ((line, fixable, message),) = pm505_findings(TANH_CELL)
    assert (line, fixable) == (15, False) and "the update of `h` is not linear in it" in message


def test_a_decoder_whose_state_goes_through_a_cell_module_is_not_a_recurrence_to_report():
    decoder = TANH_CELL.replace("self.wh = nn.Linear(d, d, bias=False)", "self.cell = nn.GRUCell(d, d)").replace(
        "h = torch.tanh(self.wx(x[:, t]) + self.wh(h))", "h = self.cell(self.wx(x[:, t]), h)"
    )
    context, _, loops = read(decoder)
    assert not loops.looks_like_recurrence(next(iter(context.index.find(cst.For))))
    assert pm505_findings(decoder) == []


def test_a_loss_totalled_over_positions_is_not_a_recurrence_to_report():
    totals = """\
import torch
import torch.nn.functional as F


def position_loss(logits, y):
    loss = 0.0
    for t in range(logits.size(1)):
        loss = loss + F.cross_entropy(logits[:, t], y[:, t])
    return loss / logits.size(1)
"""
    context, _, loops = read(totals)
    assert not loops.looks_like_recurrence(next(iter(context.index.find(cst.For))))  # only added to
    assert pm505_findings(totals) == []

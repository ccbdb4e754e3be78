"""Calls the shared call resolution follows through values: a call of a
`functools.partial` object is a call of its function, with the partial's arguments
first and the call's keywords over the partial's; a call of a parameter gives what the
functions its callers pass for it return."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from codemod.analysis.sample_loops import sample_loops
from codemod.analysis.values import Fact, Kind, Memory, PassedMemory, Place
from codemod.context import FileContext
from tests.analysis.test_kinds import HEAD, facts_of_probes

FUNCTION = """\
import functools
from functools import partial


def f(a, b, c=3, *, d=4):
    return a


class Trainer:
    def step(self, x, y=0):
        return x
"""


def passed(code: str, function: str) -> list[dict[str, str | None]]:
    """For each call of this file that runs `function` (`f`, or the method `step`), what each
    of its parameters but `self` holds then, as code."""
    context = FileContext.of_source(FUNCTION + textwrap.dedent(code))
    kinds = context.kinds
    target = next(d for d in context.index.find(cst.FunctionDef) if d.name.value == function)
    params = [p for p in (*target.params.params, *target.params.kwonly_params) if p.name.value != "self"]
    calls = kinds.callers(target) or []
    values = {p.name.value: kinds.arguments(p) or [] for p in params}
    return [
        {name: (context.source(found[k][1]) if found[k][1] is not None else None) for name, found in values.items()}
        for k in range(len(calls))
    ]


@pytest.mark.parametrize(
    ("code", "function", "expected"),
    [
        # positional and keyword arguments of the partial come first, the call's follow
        ("g = partial(f, 1, d=5)\ng(2)\n", "f", [{"a": "1", "b": "2", "c": "3", "d": "5"}]),
        # the call's keyword replaces the partial's
        ("g = partial(f, 1, d=5)\ng(2, c=7, d=6)\n", "f", [{"a": "1", "b": "2", "c": "7", "d": "6"}]),
        # spelled in full, and called in place
        ("functools.partial(f, b=2)(9)\n", "f", [{"a": "9", "b": "2", "c": "3", "d": "4"}]),
        # a partial of a partial
        ("g = partial(f, 1, d=5)\nh = partial(g, c=8)\nh(9)\n", "f", [{"a": "1", "b": "9", "c": "8", "d": "5"}]),
        # a partial of a bound method: its object fills `self`
        (
            "t = Trainer()\nrun = partial(t.step, y=2)\nrun(1)\nt.step(5)\n",
            "step",
            [
                {"x": "1", "y": "2"},
                {"x": "5", "y": "0"},
            ],
        ),
    ],
    ids=["positional-and-keyword", "keyword-overridden", "in-full-called-in-place", "partial-of-partial", "method"],
)
def test_a_call_of_a_partial_passes_its_arguments_first(code, function, expected):
    assert passed(code, function) == expected


@pytest.mark.parametrize(
    "code",
    [
        "g = partial(f, 1)\nhandlers = [g]\n",  # the partial handed on: called where perfmod cannot see
        "g = partial(f, 1)\ng = partial(f, 2)\ng(3)\n",  # a name bound to two partials
    ],
    ids=["handed-on", "bound-twice"],
)
def test_a_partial_perfmod_cannot_follow_leaves_the_callers_unknown(code):
    context = FileContext.of_source(FUNCTION + code)
    f = next(d for d in context.index.find(cst.FunctionDef) if d.name.value == "f")
    assert context.kinds.callers(f) is None


def test_a_call_of_a_partial_gives_what_its_function_returns():
    context = FileContext.of_source(
        HEAD + "from functools import partial\n"
        "def head(batch, device):\n    return batch\n"
        "step = partial(head, device=device)\n"
        "out = step(torch.randn(3))\n"
    )
    call = next(c for c in context.index.find(cst.Call) if context.source(c) == "step(torch.randn(3))")
    assert context.kinds.fact(call) == Fact(Kind.TENSOR, Place.HOST, memory=Memory.PAGEABLE)
    # what reads a callee's parameters from the call's own arguments is not handed a call of a partial
    assert context.kinds.local_callee(call) is None


LOADERS = """\
from functools import partial
ds = TensorDataset(torch.randn(8, 3), torch.randn(8))
pinned = DL(ds, batch_size=2, pin_memory=True)
plain = DL(ds, batch_size=2)


def consume(make_iter):
    probe(make_iter())


def pinned_iter():
    return iter(pinned)


def plain_iter():
    return iter(plain)


def hand_on(make):
    consume(make)
"""
PINNED_LOADER = Fact(Kind.LOADER, Place.HOST, memory=Memory.PINNED)


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        ("consume(pinned_iter)", PINNED_LOADER),  # a function of this file
        ("hand_on(pinned_iter)", PINNED_LOADER),  # handed on by another function
        ("outer = partial(hand_on)\nouter(pinned_iter)", PINNED_LOADER),  # two hops, one through a partial
        ("consume(lambda: iter(pinned))", PINNED_LOADER),  # a lambda
        ("make = lambda: iter(pinned)\nconsume(make)", PINNED_LOADER),  # a name bound to one
        ("consume(plain_iter)", Fact(Kind.LOADER, Place.HOST, memory=Memory.PAGEABLE)),
        ("consume(lambda: torch.zeros(3))", Fact(Kind.UNKNOWN)),  # a function that returns no loader
        ("consume(pinned_iter)\nconsume(len)", Fact(Kind.UNKNOWN)),  # one perfmod cannot follow
        ("consume(pinned_iter)\nsteps = [consume]", Fact(Kind.UNKNOWN)),  # called where perfmod cannot see
    ],
    ids=["def", "one-hop", "two-hops", "lambda", "named-lambda", "unpinned", "not-a-loader", "builtin", "handed-on"],
)
def test_a_call_of_a_parameter_gives_what_the_functions_its_callers_pass_return(calls, expected):
    assert facts_of_probes(LOADERS + calls + "\n") == [expected]


def test_callers_passing_functions_over_pinned_and_unpinned_loaders_name_each_call():
    (fact,) = facts_of_probes(LOADERS + "consume(pinned_iter)\nconsume(plain_iter)\nhand_on(pinned_iter)\n")
    assert fact.kind is Kind.LOADER
    assert isinstance(fact.memory, PassedMemory)
    code = (HEAD + LOADERS).splitlines()
    handed, lines = code.index("    consume(make)") + 1, len(code)
    # the calls that pass the functions; `hand_on`'s call hands on what its caller passes
    assert [site.rpartition(":")[2] for site in fact.memory.pinned] == [str(handed), str(lines + 1)]
    assert [site.rpartition(":")[2] for site in fact.memory.others] == [str(lines + 2)]


@pytest.mark.parametrize(
    "code",
    [
        # a function that hands its function parameter to itself
        "def repeat(make, n):\n    if n:\n        repeat(make, n - 1)\n    probe(make())\n\n\nrepeat(pinned_iter, 2)\n",
        # a class that builds itself with the layer class it is given (a tree of blocks)
        "class Tree(nn.Module):\n    def __init__(self, block, level):\n        super().__init__()\n"
        "        self.node = block(3, 3)\n        if level > 1:\n            self.child = Tree(block, level - 1)\n"
        "        probe(self.node)\n\n\nnet = Tree(nn.Linear, 3)\n",
    ],
    ids=["recursive-function", "recursive-class"],
)
def test_a_parameter_passed_back_to_its_own_function_is_not_followed_around_again(code):
    *_, fact = facts_of_probes(LOADERS + code)  # (the last probe: `consume` holds one too)
    assert fact == Fact(Kind.UNKNOWN)  # what the recursive call passes is what is being asked


PARTIAL_STEP_LOOP = """\
import functools
import torch


def train_step(model, opt, batch):
    loss = model(batch).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()


model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = functools.partial(train_step, model, opt)
for epoch in range(2):
    for batch in [torch.randn(8, 4)]:
        step(batch)
"""


def test_a_loop_that_steps_through_a_partial_of_its_step_function_is_the_step_loop():
    context = FileContext.of_source(PARTIAL_STEP_LOOP)
    call = next(c for c in context.index.find(cst.Call) if context.source(c) == "step(batch)")
    train_step = next(f for f in context.index.find(cst.FunctionDef) if f.name.value == "train_step")
    (loop,) = context.loops.step_loops
    assert context.source(loop.iter) == "[torch.randn(8, 4)]"
    assert context.loops.runs(call) is train_step and context.loops.functions_reached(loop.body) == (train_step,)
    # what maps a call's own arguments onto the callee's parameters is not handed a partial's call
    assert context.loops.callee(call) is None and context.kinds.local_callee(call) is None
    assert context.loaders.trains(loop) and sample_loops(context).steps_optimizer(loop.body)

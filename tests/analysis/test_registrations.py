"""Where a hook registration runs and whether it may run once (analysis.registrations),
with the general questions it asks of the index and the bindings."""

from __future__ import annotations

import textwrap

import libcst as cst

from codemod.analysis.hook_handles import hook_handles
from codemod.analysis.registrations import OnceInInit, registrations
from codemod.config import Settings
from codemod.context import FileContext


def context(code: str) -> FileContext:
    source = textwrap.dedent(code)
    return FileContext(cst.parse_module(source), "<test>", Settings(), source)


def registration(ctx: FileContext) -> cst.Call:
    (call,) = [
        c
        for c in ctx.index.find(cst.Call)
        if getattr(c.func, "attr", None) is not None and c.func.attr.value.startswith("register_forward")
    ]
    return call


def called(ctx: FileContext, name: str) -> cst.Call:
    return next(c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == name)


MODULE = """\
import torch

class Probe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(2))

    def forward(self, x{params}):
        h = self.layers[0].register_forward_hook({hook})
        try:
            return self.layers[1](self.layers[0](x))
        finally:
            h.remove()
"""


def test_a_forward_that_registers_the_same_hook_each_call_may_register_it_once():
    ctx = context(MODULE.format(params="", hook="lambda m, a, out: out * 2"))
    call = registration(ctx)
    found = registrations(ctx)
    removals = hook_handles(ctx).removals(call)
    assert found.per_call(call) == "function"
    assert found.removed_in_same_call(call, removals)
    once = found.once_in_init(call, removals)
    assert isinstance(once, OnceInInit)
    assert (once.forward.name.value, once.init.name.value) == ("forward", "__init__")
    assert once.holder is call and once.container_line is None
    assert once.statement is once.forward.body.body[0] and once.removing is once.forward.body.body[1]


def test_a_hook_that_reads_an_argument_of_forward_stays():
    ctx = context(MODULE.format(params=", scale", hook="lambda m, a, out: out * scale"))
    call = registration(ctx)
    once = registrations(ctx).once_in_init(call, hook_handles(ctx).removals(call))
    assert once == "it depends on `scale`, a value of the call"


def test_where_a_registration_runs():
    ctx = context(
        """\
        import torch
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        h = model.register_forward_hook(print)
        for x in [torch.ones(2)]:
            g = model.register_forward_pre_hook(print)
            model(x).sum().backward()
            opt.step()
            g.remove()
        h.remove()
        """
    )
    once, looped = [c for c in ctx.index.find(cst.Call) if ctx.source(c.func).startswith("model.register")]
    found = registrations(ctx)
    assert found.per_call(once) is None
    assert found.per_call(looped) == "loop" and found.in_training_loop(looped)
    assert found.removed_in_same_call(looped, hook_handles(ctx).removals(looped))
    assert "not in a module's `forward`" in found.once_in_init(looped, hook_handles(ctx).removals(looped))


def test_a_context_manager_names_the_parameters_its_hooks_come_from():
    ctx = context(
        """\
        from contextlib import contextmanager

        @contextmanager
        def attached(model, hooks):
            handles = []
            for name, hook in hooks.items():
                module = model.get_submodule(name)
                handles.append(module.register_forward_hook(hook))
            try:
                yield
            finally:
                for handle in handles:
                    handle.remove()
        """
    )
    call = registration(ctx)
    found = registrations(ctx)
    assert found.per_call(call) == "function"
    why = found.once_in_init(call, hook_handles(ctx).removals(call))
    assert "comes from each call (`hooks`, `model`, given by the caller)" in why


def test_parameters_reached_follows_local_names_to_the_parameters():
    ctx = context(
        """\
        def attach(model, hooks, unused):
            for name, hook in hooks.items():
                module = model.get_submodule(name)
                probe(module, hook)
        """
    )
    function = ctx.index.find(cst.FunctionDef)[0]
    assert ctx.bindings.parameters_reached(called(ctx, "probe"), function) == ["hooks", "model"]


def test_the_statement_of_a_block_its_owner_and_a_loops_own_returns():
    ctx = context(
        """\
        def train(steps):
            for step in steps:
                with open("log") as f:
                    probe(step)
                if step > 3:
                    return step

                def keep():
                    return step
            return None
        """
    )
    index = ctx.index
    function = index.find(cst.FunctionDef)[0]
    loop = index.find(cst.For)[0]
    probe = called(ctx, "probe")
    assert index.statement_in(probe, function.body) is loop
    assert index.statement_in(probe, loop.body) is index.find(cst.With)[0]
    assert isinstance(index.block_owner(index.statement_of(probe)), cst.With)
    assert index.block_owner(ctx.module.body[0]) is None
    assert [ctx.source(r).strip() for r in index.own_returns(loop.body)] == ["return step"]
    assert [ctx.source(r).strip() for r in index.own_returns(function.body)] == ["return step", "return None"]

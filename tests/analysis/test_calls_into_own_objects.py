"""The calls a training loop makes into the file's own objects: a method called on a
parameter that every call gives an instance (`def fit(module): module.training_step(x)`),
on an attribute object (`self.callback.on_epoch_end(self, val)`), on what a builder of
the file returns (`model = build()`), and the values those builders return
(`g, d = build(device)`). The shared analysis follows each, so that every rule sees the
step's work where it is written."""

from __future__ import annotations

import textwrap

import libcst as cst

from codemod.context import FileContext


def context(code: str) -> FileContext:
    return FileContext.of_source(textwrap.dedent(code))


def call_of(ctx: FileContext, code: str) -> cst.Call:
    return next(c for c in ctx.index.find(cst.Call) if ctx.source(c) == code)


def callee_name(ctx: FileContext, code: str) -> str | None:
    function = ctx.loops.callee(call_of(ctx, code))
    return function.name.value if function is not None else None


STEP_METHOD_OF_PARAMETER = """\
import torch
import torch.nn as nn

class Lit(nn.Module):
    def __init__(self):
        super().__init__()
        self.net, self.logged = nn.Linear(16, 1), []

    def training_step(self, x):
        loss = self.net(x).square().mean()
        self.logged.append(loss.item())
        return loss

device = "cuda" if torch.cuda.is_available() else "cpu"

def fit(module):
    module.to(device)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    for step in range(5):
        loss = module.training_step(torch.randn(8, 16, device=device))
        opt.zero_grad()
        loss.backward()
        opt.step()

fit(Lit())
"""


def test_a_method_called_on_a_parameter_that_every_call_gives_an_instance_runs_every_step():
    ctx = context(STEP_METHOD_OF_PARAMETER)
    assert callee_name(ctx, "module.training_step(torch.randn(8, 16, device=device))") == "training_step"
    read = call_of(ctx, "loss.item()")
    (site,) = ctx.loops.runs_in(read)
    assert ctx.line(site.loop) == 19 and [ctx.source(c.func) for c in site.calls] == ["module.training_step"]


def test_a_parameter_given_instances_of_two_classes_calls_no_method_of_either():
    source = STEP_METHOD_OF_PARAMETER.replace(
        "fit(Lit())",
        "class Other(Lit):\n    def training_step(self, x):\n        return x.sum()\n\nfit(Lit())\nfit(Other())",
    )
    ctx = context(source)
    assert callee_name(ctx, "module.training_step(torch.randn(8, 16, device=device))") is None


def test_a_submodule_moves_with_the_module_that_holds_it():
    """`module.to(device)` moves `self.net` too: what `self.net(x)` computes is not known to
    stay on the host, so reading it to the host waits for the device."""
    ctx = context(STEP_METHOD_OF_PARAMETER)
    net_call = call_of(ctx, "self.net(x)")
    assert ctx.kinds.fact(net_call).place.value != "host"
    plain = context("import torch.nn as nn\nnet = nn.Linear(16, 1)\ny = net(x)\n")
    assert plain.kinds.fact(call_of(plain, "net(x)")).place.value == "host"  # a module no one moves


CALLBACK = """\
import torch
import torch.nn as nn

class BestCheckpoint:
    def __init__(self, path):
        self.path = path

    def on_epoch_end(self, trainer, val):
        torch.save(trainer.model.state_dict(), self.path)

class Trainer:
    def __init__(self, model, callback):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.callback = callback

    def fit(self, epochs):
        for epoch in range(epochs):
            loss = self.model(torch.randn(4, 8)).sum()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.callback.on_epoch_end(self, loss.item())

Trainer(nn.Linear(8, 1), BestCheckpoint("best.pt")).fit(3)
"""


def test_a_method_of_an_attribute_object_is_called_through_what_the_attribute_holds():
    ctx = context(CALLBACK)
    receiver = call_of(ctx, "self.callback.on_epoch_end(self, loss.item())").func.value
    assert ctx.kinds.instance_class(receiver).name.value == "BestCheckpoint"
    assert callee_name(ctx, "self.callback.on_epoch_end(self, loss.item())") == "on_epoch_end"
    save = call_of(ctx, "torch.save(trainer.model.state_dict(), self.path)")
    assert [ctx.line(site.loop) for site in ctx.loops.runs_in(save)] == [18]


BUILDERS = """\
import torch
import torch.nn as nn

class Net(nn.Module):
    def step(self, x):
        return x

def make_net():
    return Net()

def build(device):
    g = nn.Linear(8, 1).to(device)
    d = nn.Linear(1, 1).to(device)
    return g, d

net = make_net()
net.step(1)
g, d = build(torch.device("cpu"))
"""


def test_what_a_builder_of_the_file_returns_is_followed():
    ctx = context(BUILDERS)
    assert callee_name(ctx, "net.step(1)") == "step"  # an instance that `make_net()` returns
    build = call_of(ctx, 'build(torch.device("cpu"))')
    assert ctx.source(ctx.kinds.element(build, 0)) == "g"  # `g, d = build(...)`: its one `return`'s elements
    assert ctx.source(ctx.kinds.element(build, 1)) == "d"
    assert ctx.kinds.element(build, 2) is None

"""Values the shared analysis follows where a script hands them on: a parameter of a
function of the file holds what its callers pass (`train(model, ...)` from `main()`),
`getattr(nn, rnn_type)` may name any class of `torch.nn`, and a function reads the
script's own binding of a name it does not bind itself."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from codemod.analysis.distributed import reads_module_binding
from codemod.analysis.torch_facts import autocast_float16
from codemod.analysis.values import values
from codemod.context import FileContext

FORMS = Path(__file__).resolve().parents[2] / "fixtures" / "wild" / "forms"


def context(code: str) -> FileContext:
    return FileContext.of_source(textwrap.dedent(code))


def name_in(ctx: FileContext, function: str, name: str) -> cst.Name:
    """The first read of `name` in the body of `def function`."""
    defs = [f for f in ctx.index.find(cst.FunctionDef) if f.name.value == function]
    return next(n for n in ctx.index.find(cst.Name, within=defs[0].body) if n.value == name)


def test_a_parameter_holds_what_every_call_passes_or_its_default():
    ctx = context(
        """\
        import torch.nn as nn

        def train(model, scale=2.0):
            return model, scale

        def main():
            net = nn.LSTM(8, 8)
            train(net)
            train(nn.GRU(8, 8), scale=3.0)
        """
    )
    model = ctx.loops.values_of(name_in(ctx, "train", "model"))
    assert [ctx.source(v) for v in model] == ["net", "nn.GRU(8, 8)"]
    assert [ctx.source(v) for v in ctx.loops.values_of(model[0])] == ["nn.LSTM(8, 8)"]  # the caller's name
    assert [ctx.source(v) for v in ctx.loops.values_of(name_in(ctx, "train", "scale"))] == ["2.0", "3.0"]


def test_a_parameter_that_a_call_hides_or_no_call_tells_holds_nothing_known():
    ctx = context(
        """\
        def train(model):
            return model

        def fit(model):
            return model

        class Trainer:
            def run(self, model):
                return model

        args = [1]
        train(*args)
        Trainer().run(2)
        """
    )
    for function in ("train", "fit"):
        assert ctx.loops.values_of(name_in(ctx, function, "model")) == []
    # a method called on a construction of its class: the instance is told, and so what it passes
    assert [ctx.source(v) for v in ctx.loops.values_of(name_in(ctx, "run", "model"))] == ["2"]


def test_getattr_of_torch_nn_with_a_variable_may_name_any_of_its_classes():
    ctx = context(
        """\
        import torch.nn as nn
        import torch.optim as optim

        def build(kind, name):
            rnn = getattr(nn, kind)(8, 8)
            linear = getattr(nn, "Linear")(8, 8)
            opt = getattr(optim, name)
            return rnn, linear, opt
        """
    )
    calls = {ctx.source(c): c for c in ctx.index.find(cst.Call)}
    rnn = ctx.names.may_name(calls["getattr(nn, kind)(8, 8)"])
    assert "torch.nn.*" in rnn and any(autocast_float16(name) for name in rnn)
    linear = ctx.names.may_name(calls['getattr(nn, "Linear")(8, 8)'])
    assert linear == {"torch.nn.Linear"} and not any(autocast_float16(name) for name in linear)
    opt = ctx.names.may_name(calls["getattr(optim, name)"])
    assert "torch.optim.*" in opt and not any(autocast_float16(name) for name in opt)


def test_a_function_reads_the_scripts_binding_of_a_name_it_does_not_bind():
    ctx = context(
        """\
        import torch

        model = torch.nn.Linear(2, 2)

        def checkpoint():
            torch.save(model, "m.pt")

        def local():
            model = torch.nn.Linear(2, 2)
            torch.save(model, "m.pt")

        def passed(model):
            torch.save(model, "m.pt")
        """
    )
    assert reads_module_binding(ctx, name_in(ctx, "checkpoint", "model"))
    saves = [n for n in ctx.index.find(cst.Name) if n.value == "model"]
    assert not reads_module_binding(ctx, saves[0])  # the script's own statement: not in a function
    for function in ("local", "passed"):
        defs = [f for f in ctx.index.find(cst.FunctionDef) if f.name.value == function]
        save = next(c for c in ctx.index.find(cst.Call, within=defs[0]) if ctx.source(c.func) == "torch.save")
        assert not reads_module_binding(ctx, save.args[0].value)


CONSTRUCTED = """\
    import torch

    class Trainer:
        def __init__(self, model, device):
            self.device = device
            self.model = model.to(device)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    Trainer(torch.nn.Linear(4, 1), device)
    Trainer(torch.nn.Linear(4, 1), device="cpu")
    """


def device_read(ctx: FileContext) -> cst.Name:
    """`device` of `model.to(device)` in `Trainer.__init__`."""
    return [n for n in ctx.index.find(cst.Name) if n.value == "device"][3]


def test_a_constructor_parameter_holds_what_every_construction_passes():
    ctx = context(CONSTRUCTED)
    device = device_read(ctx)
    assert ctx.line(device) == 6
    assert [ctx.source(v) for v in ctx.kinds.value_sources(device)] == ["device", '"cpu"']
    assert ctx.training.device_types(device) == {"cuda", "cpu"}


@pytest.mark.parametrize(
    "extra",
    [
        "factory = Trainer\n",  # handed on: calls through `factory` are not seen
        "class Fast(Trainer):\n    pass\n",  # a subclass constructs it with its own arguments
    ],
)
def test_a_constructor_parameter_of_a_class_used_otherwise_holds_nothing_known(extra):
    ctx = context(CONSTRUCTED.rstrip(" ") + textwrap.indent(extra, "    "))
    assert ctx.kinds.value_sources(device_read(ctx)) == [None]


def test_a_device_ordinal_computed_from_the_rank_names_a_cuda_device():
    # DiT's setup: a Python int picks the GPU, as `.to(0)` does.
    ctx = context(
        """\
        import torch
        import torch.distributed as dist

        rank = dist.get_rank()
        device = rank % torch.cuda.device_count()
        model = torch.nn.Linear(4, 4).to(device)
        name = "cuda"
        """
    )
    device = [n for n in ctx.index.find(cst.Name) if n.value == "device"][-1]
    assert ctx.training.device_types(device) == {"cuda"}
    assert ctx.kinds.device_place(device).name == "CUDA"
    name = [n for n in ctx.index.find(cst.Name) if n.value == "rank"][-1]
    assert values(ctx).number(name) == "int"


def test_a_number_guessed_while_it_was_worked_out_is_not_kept_when_the_guess_fails():
    # Asking whether `device` is a number reads the training facts, which ask whether the
    # device `accelerator.device` names is an int ordinal: the provisional INT of the
    # open question must not stay in the answers found meanwhile.
    ctx = FileContext.of_source(FORMS.joinpath("pm301_accelerator_device.py").read_text(encoding="utf-8"))
    reads = [n for n in ctx.index.find((cst.Name, cst.Attribute)) if ctx.source(n) in ("device", "accelerator.device")]
    assert [values(ctx).number(n) for n in reads] == [None] * len(reads)
    assert {ctx.kinds.device_place(n).name for n in reads} == {"UNKNOWN"}


def test_the_training_analysis_is_built_once_when_its_questions_read_the_command_line(monkeypatch):
    """Building the training facts asks the value analysis whether `args.gpu` is a device
    ordinal, which reads the command line, which reads where `args` comes from: that must
    not start a second, nested build of the training facts (each one walks every loop)."""
    from codemod.analysis import training

    built = []
    original = training.Training.__init__

    def counted(self, context):
        built.append(context)
        original(self, context)

    monkeypatch.setattr(training.Training, "__init__", counted)
    ctx = context(
        """\
        import argparse
        import torch
        import torch.nn as nn

        parser = argparse.ArgumentParser()
        parser.add_argument("--gpu", type=int, default=0)
        args = parser.parse_args()
        model = nn.Linear(4, 1).to(args.gpu)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(8, 4).to(args.gpu)
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        """
    )
    assert len(ctx.training.loops) == 1
    assert len(built) == 1

"""One model of the step loop (codemod.analysis.loops): the loop that steps the
optimizer, wherever backward sits; the epoch loops around it; code in functions
the step runs counts where it runs. And the values the training analysis
follows: devices and parameter lists through attributes, returns, parameters,
config objects and argparse options."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from codemod.context import FileContext

HEAD = """\
import argparse
import copy
from dataclasses import dataclass, field
import torch
import torch.nn as nn
import torch.nn.functional as F
"""


def context(code: str) -> FileContext:
    return FileContext.of_source(HEAD + textwrap.dedent(code))


def loop_headers(ctx: FileContext, loops) -> list[str]:
    return [ctx.source(loop).splitlines()[0].strip() for loop in loops]


def call(ctx: FileContext, text: str) -> cst.Call:
    return next(c for c in ctx.index.find(cst.Call) if ctx.source(c) == text)


# -- which loop is the step loop ----------------------------------------------------------


def test_micro_batch_accumulation_the_step_loop_is_the_one_that_steps():
    ctx = context("""\
        for step in range(10):
            for micro in range(4):
                loss = model(x).sum() / 4
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        """)
    assert loop_headers(ctx, ctx.loops.step_loops) == ["for step in range(10):"]
    backward = call(ctx, "loss.backward()")
    assert ctx.loops.step_loop_of(backward) is ctx.loops.step_loops[0]
    assert ctx.loops.is_training_loop(ctx.index.find(cst.For)[1])  # the micro-batch loop runs backward too


def test_per_sample_backward_inside_the_step():
    ctx = context("""\
        for xb, yb in loader:
            for x, y in zip(xb, yb):
                F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        """)
    assert loop_headers(ctx, ctx.loops.step_loops) == ["for xb, yb in loader:"]


def test_a_step_method_makes_the_loop_that_calls_it_the_step_loop():
    ctx = context("""\
        class Trainer:
            def __init__(self, model):
                self.model = model
                self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

            def train_step(self, batch):
                loss = self.model(batch).sum()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                return loss

            def fit(self, loader, epochs):
                for epoch in range(epochs):
                    for batch in loader:
                        self.train_step(batch)
        """)
    [loop] = ctx.loops.step_loops
    assert loop_headers(ctx, [loop]) == ["for batch in loader:"]
    assert loop_headers(ctx, ctx.loops.epoch_loops(loop)) == ["for epoch in range(epochs):"]
    backward = call(ctx, "loss.backward()")
    assert ctx.loops.step_loop_of(backward) is None  # not lexically in it
    [site] = ctx.loops.runs_in(backward)
    assert site.loop is loop and [ctx.source(c) for c in site.calls] == ["self.train_step(batch)"]
    [training] = ctx.training.loops
    assert training.loop is loop and [ctx.source(s) for s in training.forward.statements] == [
        "loss = self.model(batch).sum()\n"
    ]


def test_a_step_method_of_an_object_passed_to_the_training_function():
    """The class of `trainer` is the one every call passes (`Kinds.instance_class`): the
    loop that calls its step method steps the optimizer, though `trainer` is a parameter."""
    ctx = context("""\
        class Trainer:
            def __init__(self, model):
                self.model = model
                self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

            def train_step(self, batch):
                loss = self.model(batch).sum()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()

        def fit(trainer, loader):
            for batch in loader:
                trainer.train_step(batch)

        fit(Trainer(nn.Linear(4, 1)), [torch.randn(2, 4)])
        """)
    assert loop_headers(ctx, ctx.loops.step_loops) == ["for batch in loader:"]


def test_train_one_epoch_called_per_epoch():
    ctx = context("""\
        def train_one_epoch(model, loader, opt):
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()

        def evaluate(model, loader):
            return sum(model(x).sum() for x, _ in loader)

        def main(model, loader, opt):
            for epoch in range(3):
                train_one_epoch(model, loader, opt)
                evaluate(model, loader)
        """)
    [loop] = ctx.loops.step_loops
    assert loop_headers(ctx, [loop]) == ["for x, y in loader:"]
    assert loop_headers(ctx, ctx.loops.epoch_loops(loop)) == ["for epoch in range(3):"]
    assert ctx.loops.runs_in(call(ctx, "model(x).sum()")) == ()  # evaluation runs once per epoch


def test_a_helper_called_under_a_periodic_condition_runs_there():
    ctx = context("""\
        def log_stats(model):
            print(model.weight.norm().item())

        for step, (x, y) in enumerate(loader):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step % 100 == 0:
                log_stats(model)
        """)
    [site] = ctx.loops.runs_in(call(ctx, "model.weight.norm().item()"))
    [through] = site.calls
    assert isinstance(ctx.index.first_enclosing(through, cst.If).test, cst.Comparison)


def test_a_scheduler_step_does_not_make_an_epoch_loop_a_step_loop():
    ctx = context("""\
        sched = torch.optim.lr_scheduler.StepLR(opt, 10)
        for epoch in range(3):
            for x in loader:
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
            sched.step()
        """)
    assert loop_headers(ctx, ctx.loops.step_loops) == ["for x in loader:"]


def test_backward_without_a_visible_step_still_has_a_step_loop():
    ctx = context("""\
        for x in loader:
            model(x).sum().backward()
            trainer.update()
        """)
    assert loop_headers(ctx, ctx.loops.step_loops) == ["for x in loader:"]
    assert ctx.training.loops == []  # no optimizer step to describe


# -- devices --------------------------------------------------------------------------------


def device_of_model(code: str) -> frozenset[str] | None:
    ctx = context(code)
    [loop] = ctx.training.loops
    model = next(m for m in loop.models if m.move is not None)
    return ctx.training.device_types(model.device)


TRAIN = """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.parametrize(
    "setup,types",
    [
        ('model = nn.Linear(2, 2).to("cuda" if torch.cuda.is_available() else "cpu")', {"cuda", "cpu"}),
        ('device = torch.device("cuda:0")\nmodel = nn.Linear(2, 2).to(device)', {"cuda"}),
        (
            'parser = argparse.ArgumentParser()\nparser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])\n'
            "args = parser.parse_args()\nmodel = nn.Linear(2, 2).to(args.device)",
            {"cuda", "cpu"},
        ),
        (
            'parser = argparse.ArgumentParser()\nparser.add_argument("--device", default="cuda")\n'
            "args = parser.parse_args()\nmodel = nn.Linear(2, 2).to(args.device)",
            None,
        ),
        (
            '@dataclass\nclass Config:\n    device: str = field(default_factory=lambda: "cuda" if torch.cuda.is_available() else "cpu")\n'
            "cfg = Config()\nmodel = nn.Linear(2, 2).to(cfg.device)",
            {"cuda", "cpu"},
        ),
        (
            '@dataclass\nclass Config:\n    device: str = "cpu"\ncfg = Config(device="mps")\nmodel = nn.Linear(2, 2).to(cfg.device)',
            {"mps"},
        ),
        ('CONFIG = {"device": "cuda"}\nmodel = nn.Linear(2, 2).to(CONFIG["device"])', {"cuda"}),
        (
            'def pick():\n    if torch.cuda.is_available():\n        return torch.device("cuda")\n    return torch.device("cpu")\n'
            "model = nn.Linear(2, 2).to(pick())",
            {"cuda", "cpu"},
        ),
        ("device = get_device()\nmodel = nn.Linear(2, 2).to(device)", None),
    ],
    ids=[
        "if-else",
        "torch.device",
        "argparse-choices",
        "argparse-any",
        "dataclass-factory",
        "dataclass-passed",
        "dict-config",
        "function-returns",
        "unknown-call",
    ],
)
def test_device_types_followed_through_the_program(setup, types):
    got = device_of_model(setup + TRAIN)
    assert got == (frozenset(types) if types is not None else None)


def test_self_device_set_in_setup():
    ctx = context("""\
        class Trainer:
            def setup(self):
                self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
                self.model = nn.Linear(2, 2).to(self.device)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def fit(self, loader):
                for x in loader:
                    self.model(x).sum().backward()
                    self.opt.step()
                    self.opt.zero_grad()
        """)
    [loop] = ctx.training.loops
    [model] = loop.models
    assert ctx.training.device_types(model.device) == {"cuda", "cpu"}


def test_a_model_passed_to_the_training_function_is_placed_where_it_is_passed():
    ctx = context("""\
        def train(model, device, loader, opt):
            for x in loader:
                model(x.to(device)).sum().backward()
                opt.step()
                opt.zero_grad()

        def main():
            device = torch.device("cuda")
            model = nn.Linear(2, 2).to(device)
            train(model, device, [], torch.optim.SGD(model.parameters(), lr=0.1))
        """)
    [loop] = ctx.training.loops
    [model] = loop.models
    assert ctx.source(model.move) == "nn.Linear(2, 2).to(device)"
    assert ctx.training.device_types(model.device) == {"cuda"}


# -- the parameters an optimizer steps ----------------------------------------------------


@pytest.mark.parametrize(
    "code,models",
    [
        ("opt = torch.optim.AdamW(model.parameters())", ["model"]),
        (
            "params = {n: p for n, p in model.named_parameters() if p.requires_grad}\n"
            "decay = [p for p in params.values() if p.dim() >= 2]\nrest = [p for p in params.values() if p.dim() < 2]\n"
            "opt = torch.optim.AdamW([{'params': decay}, {'params': rest, 'weight_decay': 0.0}])",
            ["model", "model"],
        ),
        (
            "decay, no_decay = [], []\nfor name, p in model.named_parameters():\n"
            "    (no_decay if name.endswith('bias') else decay).append(p)\n"
            "opt = torch.optim.AdamW([{'params': decay}, {'params': no_decay}])",
            ["model", "model"],
        ),
        ("def build(params):\n    return torch.optim.SGD(params, lr=0.1)\nopt = build(model.parameters())", ["model"]),
        ("extra = torch.zeros(3, requires_grad=True)\nopt = torch.optim.SGD([extra] + list(model.parameters()))", None),
    ],
    ids=["parameters", "dict-comprehension-values", "conditional-append", "factory-function", "a-loose-tensor"],
)
def test_parameter_models(code, models):
    ctx = context(code + "\n")
    optimizer = next(c for c in ctx.index.find(cst.Call) if ctx.source(c.func).startswith("torch.optim."))
    params = optimizer.args[0].value
    found = ctx.training.parameter_models(params)
    assert (None if found is None else [ctx.source(m) for m in found]) == models


# -- tests pytest collects are no training program --------------------------------------

PYTEST_TRAINING = """\
import torch
import torch.nn.functional as F


def make():
    return torch.nn.Linear(8, 2).cuda()


def test_loss_goes_down():
    model = make()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        x = torch.randn(4, 8).cuda()
        loss = F.cross_entropy(model(x), torch.zeros(4, dtype=torch.long).cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 1.0
"""


def _findings(code: str, path: str):
    from codemod.config import Settings
    from codemod.engine import process_source
    from codemod.rule import Level

    result = process_source(code.encode(), path, Settings(select=("PM",), level=Level.UNSAFE))
    assert result.error is None, result.error
    return result.findings


@pytest.mark.parametrize("path", ["tests/test_training.py", "training_test.py"])
def test_a_test_pytest_collects_has_no_step_loop_and_no_finding(path):
    ctx = FileContext.of_source(PYTEST_TRAINING, path)
    assert ctx.loops.step_loops == [] and ctx.loops.in_test(ctx.index.find(cst.For)[0])
    assert _findings(PYTEST_TRAINING, path) == []


def test_a_method_of_a_test_class_is_a_test():
    head, body = PYTEST_TRAINING.split("def test_loss_goes_down():\n")
    code = head + "class TestTraining:\n    def test_loss(self):\n" + textwrap.indent(body, "    ")
    assert len(FileContext.of_source(code, "train.py").loops.step_loops) == 1
    assert FileContext.of_source(code, "test_training.py").loops.step_loops == []
    assert _findings(code, "test_training.py") == []


@pytest.mark.parametrize(
    "path, code",
    [
        ("train.py", PYTEST_TRAINING),  # the same function in a module pytest does not collect
        ("test_lr.py", PYTEST_TRAINING.replace("def test_loss_goes_down", "def main")),  # a script named test_*
        ("test_lr.py", PYTEST_TRAINING.replace("class ", "").replace("def test_loss_goes_down", "def run_test")),
    ],
)
def test_training_outside_a_collected_test_keeps_its_step_loop_and_findings(path, code):
    assert len(FileContext.of_source(code, path).loops.step_loops) == 1
    assert {f.code for f in _findings(code, path)} >= {"PM402"}

"""Does a forward compile to one reused graph (`analysis/compilability.py`): the first
obstacle and its reason, read in the network's class, the methods it calls and the
helper functions of its file; random draws told apart (they compile, but draw other
numbers); the facts of the file around a trained model. In process, on small programs."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from codemod.analysis.compilability import (
    compile_break,
    computes_loss,
    file_obstacles,
    forward_of,
    loss_functions,
    model_break,
    model_draw,
)
from codemod.analysis.step_models import anchor, built_class, called_models
from codemod.context import FileContext

HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
"""


def parsed(code: str) -> FileContext:
    return FileContext.of_source(HEAD + textwrap.dedent(code), "net.py")


def definition(context: FileContext, name: str) -> cst.ClassDef | cst.FunctionDef:
    return next(
        node
        for node in context.module.body
        if isinstance(node, (cst.ClassDef, cst.FunctionDef)) and node.name.value == name
    )


def forward(code: str, name: str = "Gate"):
    context = parsed(code)
    return forward_of(context, definition(context, name))


def test_a_branch_on_a_tensors_values_is_named_with_its_line():
    found = forward(
        """
        class Gate(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(4, 4)

            def forward(self, x):
                h = self.proj(x)
                if h.sum() > 0:
                    h = h * 2
                return h
        """
    )
    assert found.obstacle == (
        "`Gate.forward` branches on a tensor's values (net.py:12): dynamo breaks the graph there "
        "and runs the rest in eager mode"
    )
    assert found.first == found.obstacle and found.draws is None


def test_a_branch_on_a_shape_or_a_flag_of_the_module_is_no_obstacle():
    found = forward(
        """
        class Gate(nn.Module):
            def forward(self, x):
                if x.dim() == 3 and self.training:
                    x = x.flatten(1)
                return x.relu()
        """
    )
    assert found.obstacle is None and found.first is None


def test_a_random_draw_compiles_but_is_told():
    found = forward(
        """
        class Gate(nn.Module):
            def forward(self, x):
                noise = torch.randn_like(x)
                return (x + 0.1 * noise).tanh()
        """
    )
    assert found.obstacle is None
    assert found.draws == "`Gate.forward` draws random numbers (net.py:7), which compiled code draws differently"


def test_a_value_read_to_the_host_breaks_the_graph():
    found = forward(
        """
        class Gate(nn.Module):
            def forward(self, x):
                scale = x.abs().max().item()
                return x / scale
        """
    )
    assert found.obstacle == "`Gate.forward` breaks the graph at `x.abs().max().item` (net.py:7)"


def test_a_helper_function_of_the_file_is_followed():
    code = """
        def normalised(h):
            total = h.sum().tolist()
            return h / total

        class Gate(nn.Module):
            def forward(self, x):
                return self.scale(x)

            def scale(self, x):
                return normalised(x.exp())
        """
    assert forward(code).obstacle == "`normalised` breaks the graph at `h.sum().tolist` (net.py:6)"
    context = parsed(code)  # asked of the helper itself, and of a method with what it calls
    assert forward_of(context, definition(context, "normalised")).obstacle == forward(code).obstacle
    gate = definition(context, "Gate")
    forward_method = next(f for f in gate.body.body if isinstance(f, cst.FunctionDef) and f.name.value == "forward")
    assert forward_of(context, forward_method).obstacle == forward(code).obstacle


def test_a_clean_forward_compiles_to_one_graph():
    found = forward(
        """
        def mix(a, b):
            return torch.sigmoid(a) * b

        class Gate(nn.Module):
            def __init__(self):
                super().__init__()
                self.up, self.down = nn.Linear(4, 8), nn.Linear(8, 4)

            def forward(self, x):
                return self.down(mix(self.up(x), self.up(x)))
        """
    )
    assert found.obstacle is None and found.first is None and found.draws is None


def test_a_write_to_the_modules_state_recompiles():
    found = forward(
        """
        class Gate(nn.Module):
            def forward(self, x):
                self.calls += 1
                return x * 2
        """
    )
    assert found.obstacle.startswith("`Gate.forward` writes the module's state (net.py:7)")


def test_a_network_it_builds_is_read_too():
    found = forward(
        """
        class Inner(nn.Module):
            def forward(self, x):
                return nn.utils.rnn.pad_sequence([x]) if x.max() > 1 else x

        class Gate(nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = Inner()

            def forward(self, x):
                return self.inner(x)
        """
    )
    assert found.obstacle.startswith("`Inner.forward` branches on a tensor's values (net.py:7)")


@pytest.mark.parametrize(
    ("layers", "obstacle", "draws"),
    [
        ("nn.Linear(4, 4), nn.GELU()", None, None),
        ("nn.Linear(4, 4), nn.Dropout(0.1)", None, "`nn.Dropout` draws random numbers"),
        ("nn.LSTM(4, 4)", "the graph breaks at `nn.LSTM`", None),
    ],
)
def test_a_sequential_of_torch_layers(layers, obstacle, draws):
    context = parsed(f"net = nn.Sequential({layers})\n")
    call = next(n for n in context.index.find(cst.Call) if context.source(n.func) == "nn.Sequential")
    found = forward_of(context, call)
    assert (found.obstacle or "").startswith(obstacle or "") and (found.obstacle is None) == (obstacle is None)
    assert (found.draws or "").startswith(draws or "") and (found.draws is None) == (draws is None)


def test_a_recurrent_layer_the_step_runs_breaks_the_models_graph():
    context = parsed(
        """
        class Tagger(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.GRU(4, 8, batch_first=True)

            def forward(self, x):
                return self.rnn(x)[0].sum()

        model = Tagger()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in [torch.randn(2, 3, 4)]:
            loss = model(x)
            loss.backward()
            opt.step()
        """
    )
    step = [c for c in context.index.find(cst.Call) if context.source(c.func) == "model"]
    call, reason = compile_break(context, step)
    assert context.source(call.func) == "nn.GRU" and "allow_rnn" in reason
    (loop,) = context.training.loops
    assert model_break(context, loop, "model") == (call, reason)
    assert model_break(context, loop, "opt") is None  # it runs no forward


def test_the_file_around_the_model():
    context = parsed(
        """
        model = nn.Linear(4, 1)
        h = model.register_forward_hook(lambda m, a, o: None)
        for x in [torch.randn(2, 4).requires_grad_()]:
            y = F.dropout(model(x), 0.1)
            (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
            g.pow(2).mean().backward()
        """
    )
    facts = file_obstacles(context)
    assert not facts.compiled
    assert context.line(facts.hook) == 6 and context.line(facts.double_backward) == 9
    assert context.source(facts.draw.func) == "F.dropout"
    # data drawn from a shape is not a draw of a forward; a `.compile()` of a module is a compile
    quiet = file_obstacles(parsed("x = torch.randn(4, 8)\nnet = nn.Linear(8, 1)\nnet.compile()\n"))
    assert quiet.draw is None and quiet.compiled and quiet.hook is None


def test_a_loss_function_reduces_outside_no_grad():
    context = parsed(
        """
        def kl(p, q):
            return F.kl_div(p.log(), q, reduction="batchmean")

        def gathered(p):
            with torch.no_grad():
                return p.sum()
        """
    )
    assert computes_loss(context, definition(context, "kl"))
    assert not computes_loss(context, definition(context, "gathered"))


def test_the_functions_that_compute_a_steps_loss_are_followed_two_assignments_back():
    context = parsed(
        """
        class Net(nn.Module):
            def forward(self, x):
                return x.mean()

        def kl(p, q):
            return F.kl_div(p.log(), q, reduction="batchmean")

        def smooth(p):
            return p.softmax(-1)

        def scaled(v):
            return v * 2

        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in [(torch.randn(2, 4), torch.rand(2, 4))]:
            p = smooth(x)
            q = kl(p, y)
            loss = scaled(q) + kl(p, y) + model(x)
            loss.backward()
        """
    )
    [step] = [s for s in context.module.body if isinstance(s, cst.For)]
    loss = step.body.body[2].body[0].value
    found = loss_functions(context, loss)
    # once, though the loss calls it twice; `smooth` and `scaled` reduce nothing
    assert [f.name.value for f in found] == ["kl"]


def test_the_class_of_a_model_where_it_is_built():
    context = parsed(
        """
        class Net(nn.Module):
            def forward(self, x):
                return x

        model = Net()
        model.to("cpu")
        linear = nn.Linear(4, 4)
        for x in [torch.randn(2, 4)]:
            model(x).sum().backward()
            linear(x).sum().backward()
        """
    )
    [loop] = [s for s in context.module.body if isinstance(s, cst.For)]
    assert built_class(context, anchor(context, loop, "model"), "model") is definition(context, "Net")
    assert built_class(context, anchor(context, loop, "linear"), "linear") is None  # torch's, not the file's


# -- the torch facts it reads, against the installed torch ------------------------------------


def _resolve(name: str):
    import importlib

    module, _, attribute = name.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def test_forward_draws_are_torchs_and_draw_from_the_global_generator():
    import torch

    from codemod.analysis.torch_facts import FORWARD_DRAW_METHODS, FORWARD_DRAWS, RANDOM_MODULES

    probabilities = torch.full((64, 8), 0.5)
    for name in sorted(FORWARD_DRAWS - RANDOM_MODULES):  # the modules: `test_random_modules_are_torchs_dropouts`
        function, short = _resolve(name), name.rsplit(".", 1)[1]
        args, kwargs = (probabilities,), {}
        if short == "multinomial":
            args = (probabilities, 4, True)
        elif short == "randint_like":
            args = (probabilities, 1000)
        elif "dropout" in short:  # in training mode (`alpha_dropout`'s default is not), the argument after p
            x = torch.ones({"dropout1d": (8, 16, 16), "dropout3d": (8, 16, 4, 4, 4)}.get(short, (8, 16, 4, 4)))
            args = (x, 0.5, True)
        assert not torch.equal(function(*args, **kwargs), function(*args, **kwargs)), name
    for name in FORWARD_DRAW_METHODS:
        args = (4, True) if name == "multinomial" else ()
        assert not torch.equal(getattr(probabilities, name)(*args), getattr(probabilities, name)(*args)), name


def test_module_tables_and_set_up_methods_are_torchs():
    import torch

    from codemod.analysis.torch_facts import MODULE_SET_UP_METHODS, MODULE_TABLES

    for name, kind in MODULE_TABLES.items():
        table = _resolve(name)([torch.nn.Linear(2, 2)] if kind == "list" else {"a": torch.nn.Linear(2, 2)})
        members = list(table.values()) if kind == "dict" else list(table)
        assert all(isinstance(m, torch.nn.Linear) for m in members) and members, name
    assert all(callable(getattr(torch.nn.Module, name, None)) for name in MODULE_SET_UP_METHODS)


def test_metadata_a_branch_may_read_is_a_tensors_and_no_value():
    import torch

    from codemod.analysis.torch_facts import METADATA_ATTRIBUTES, METADATA_METHODS

    x = torch.ones(2, 3, requires_grad=True)
    assert all(not isinstance(getattr(x, name), torch.Tensor) for name in METADATA_ATTRIBUTES)
    assert all(not isinstance(getattr(x, name)(), torch.Tensor) for name in METADATA_METHODS)


def test_what_it_calls_an_obstacle_breaks_the_installed_dynamos_graph_and_a_draw_does_not():
    import torch
    from torch._dynamo.utils import counters

    def branch(x):
        if x.sum() > 0:
            x = x * 2
        return x.tanh()

    cases = [
        (lambda x: x / x.abs().max().item(), True),
        (lambda x: x * len(x.sum(0).tolist()), True),
        (branch, True),
        (lambda x: (x + 0.1 * torch.randn_like(x)).tanh(), False),
    ]
    for function, breaks in cases:
        torch._dynamo.reset()
        counters.clear()
        torch.compile(function, backend="eager")(torch.randn(4, 3))
        assert (counters["stats"]["unique_graphs"] > 1) == breaks, function
    torch._dynamo.reset()


# -- what compiling a model changes in the numbers it draws (blind test 7, #9) ---------------

NOISY_STEP = """\
class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, x):
        return self.net(x)


def train():
    model = Denoiser()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        clean = torch.randn(4, 8)
        noisy = clean + 0.3 * torch.randn_like(clean)
        loss = F.mse_loss(model(noisy), clean)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def draw_of(code: str):
    context = parsed(code)
    (loop,) = context.training.loops
    (name,) = called_models(context, loop)
    draw = model_draw(context, loop, name)
    return None if draw is None else draw.what


def test_noise_the_loop_adds_to_the_data_is_not_a_draw_of_the_compiled_model():
    assert draw_of(NOISY_STEP) is None  # it runs in eager mode, compiled model or not
    assert file_obstacles(parsed(NOISY_STEP)).draw is not None  # the file does draw


def test_a_dropout_in_the_models_forward_is_its_draw():
    code = NOISY_STEP.replace("nn.ReLU(), nn.Linear(16, 8)", "nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 8)")
    assert draw_of(code) == "Dropout"


def test_a_dropout_whose_probability_is_zero_draws_nothing():
    config = """\
from dataclasses import dataclass


@dataclass
class Config:
    d: int = 8
    dropout: float = 0.0


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.proj = nn.Linear(cfg.d, cfg.d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.proj(x))


class Net(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.block = Block(cfg)

    def forward(self, x):
        return F.dropout(self.block(x), p=0.0)


def train():
    cfg = Config()
    model = Net(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(4, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
    # `cfg.dropout` is the config's default, 0.0, through `Net(cfg)` and `Block(cfg)`
    assert draw_of(config) is None and file_obstacles(parsed(config)).draw is None
    assert draw_of(config.replace("cfg = Config()", "cfg = Config(dropout=0.1)")) == "Dropout"
    assert draw_of(config.replace("cfg = Config()", "cfg = Config(8, 0.1)")) == "Dropout"  # by position: unknown
    assert draw_of(config.replace("p=0.0", "p=0.2")) == "dropout"


def test_a_loss_module_of_torch_is_not_a_model_the_step_runs():
    code = """\
class Trainer:
    def __init__(self):
        self.model = nn.Linear(8, 2)
        self.loss_fn = nn.SmoothL1Loss()
        self.opt = torch.optim.Adam(self.model.parameters())

    def fit(self, x, y):
        for step in range(3):
            loss = self.loss_fn(self.model(x), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
"""
    context = parsed(code)
    (loop,) = context.training.loops
    assert called_models(context, loop) == ["self.model"]


def test_a_dropout_with_p_zero_returns_its_input_and_draws_nothing_in_the_installed_torch():
    import inspect

    import torch

    from codemod.analysis.torch_facts import DROP_PROBABILITY

    for name, (position, keyword) in DROP_PROBABILITY.items():
        target = _resolve(name)
        x = torch.randn((2, 3, 4, 5, 6)[: 3 if "1d" in name else 5 if "3d" in name else 4])
        state = torch.get_rng_state()
        if inspect.isclass(target):
            out = target(**{keyword: 0.0}).train()(x)
        else:  # p at its position, then training mode (`torch.dropout` takes no keyword `training`)
            out = target(*[x, 0.5][:position], 0.0, True)
        assert torch.equal(torch.get_rng_state(), state) and torch.equal(out, x), name

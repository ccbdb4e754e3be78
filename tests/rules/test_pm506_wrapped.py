"""PM506 for a model the step runs through another name (a DistributedDataParallel
wrapper, its `.module`, `net = model`), and for a model whose class lives in another
module of the user's code while the step calls into it besides its forward. Written
from the rule's description: what runs the forward every step is compiled once, after
the model is built and moved (so before a wrapper is put around it); where
`model.compile()` would leave per-step work in eager mode and the class cannot be
read, the rule says so and fixes nothing."""

import textwrap

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.uncompiled_model import UncompiledModel


def findings(source: str):
    settings = Settings(select=("PM506",), level=Level.NUMERIC)
    result = process_source(textwrap.dedent(source).encode(), "t.py", settings, [UncompiledModel])
    assert result.error is None, result.error
    new = result.new_source.decode() if result.new_source is not None else textwrap.dedent(source)
    return [(f.line, f.fixable, f.message) for f in result.findings], new


WRAPPED = """\
import torch
from torch.nn.parallel import DistributedDataParallel
from lab.nets import Encoder


def train(steps, distributed):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Encoder(16)
    model.to(device)
    runner = model
    if distributed:
        runner = DistributedDataParallel(model)
    core = runner.module if distributed else runner
    opt = torch.optim.AdamW(model.parameters())
    for step in range(steps):
        x = torch.randn(8, 16, device=device)
        loss = runner(x).pow(2).mean(){extra}
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_model_run_through_a_wrapper_is_compiled_before_it_is_wrapped():
    found, new = findings(WRAPPED.format(extra=""))
    assert [(line, fixable) for line, fixable, _ in found] == [(9, True)]
    assert "    model.to(device)\n    model.compile()\n    runner = model\n" in new
    again, _ = findings(new)
    assert again == []


def test_a_step_that_calls_into_a_model_of_another_module_is_reported():
    found, new = findings(WRAPPED.format(extra=" + core.sparsity_penalty() + 0.1 * core.importances(x).sum()"))
    assert len(found) == 1
    line, fixable, message = found[0]
    assert (line, fixable) == (9, False)
    assert "`model.sparsity_penalty`, `model.importances`" in message
    assert "`Encoder` is defined in another module" in message and "hooks" in message
    assert ".compile()" not in new


def test_the_same_calls_on_a_model_whose_class_is_in_the_file_still_compile_its_forward():
    source = WRAPPED.format(extra=" + core.sparsity_penalty()").replace(
        "from lab.nets import Encoder\n",
        "\n\nclass Encoder(torch.nn.Module):\n"
        "    def __init__(self, d):\n        super().__init__()\n        self.lin = torch.nn.Linear(d, d)\n\n"
        "    def forward(self, x):\n        return torch.tanh(self.lin(x)) * 2\n\n"
        "    def sparsity_penalty(self):\n        return self.lin.weight.abs().sum()\n",
    )
    found, new = findings(source)
    assert [fixable for _, fixable, _ in found] == [True]
    assert "model.compile()" in new


def test_a_name_bound_to_two_different_models_is_not_followed():
    found, _ = findings("""\
        import torch

        def train(steps, pick):
            a = torch.nn.Linear(4, 4)
            b = torch.nn.Linear(4, 4)
            net = a if pick else b
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for step in range(steps):
                loss = net(torch.randn(2, 4)).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
        """)
    assert all("`a`" not in message and "`b`" not in message for _, _, message in found)
    assert not any("a.compile()" in message or "b.compile()" in message for _, _, message in found)


def test_a_wrapper_of_a_model_that_is_compiled_already_is_left_alone():
    found, _ = findings(
        WRAPPED.format(extra="").replace("    model.to(device)\n", "    model.to(device)\n    model.compile()\n")
    )
    assert found == []

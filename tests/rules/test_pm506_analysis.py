"""PM506's analysis: where `model.compile()` goes, and when it only reports."""

import textwrap

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.uncompiled_model import UncompiledModel

LOOP = """\
{indent}opt = torch.optim.SGD({model}.parameters(), lr=0.1)
{indent}for x in [torch.randn(1, 2)]:
{indent}    {model}(x).sum().backward()
{indent}    opt.step()
"""


def rewrite(source: str):
    settings = Settings(select=("PM506",), level=Level.NUMERIC)
    result = process_source(textwrap.dedent(source).encode(), "t.py", settings, [UncompiledModel])
    assert result.error is None, result.error
    return [(f.line, f.fixable) for f in result.findings], result.new_source.decode()


def test_compile_goes_after_the_last_build_or_move_before_the_loop():
    """A mode switch (`.train()`) is not set-up: it often sits in the epoch loop, where a
    compile would run every epoch."""
    found, new = rewrite(
        "import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.LayerNorm(4), torch.nn.Tanh(), torch.nn.Linear(4, 1))\nmodel.to('cpu')\nmodel.train()\n"
        + LOOP.format(indent="", model="model")
    )
    assert found == [(3, True)]
    assert "model.to('cpu')\nmodel.compile()\nmodel.train()\nopt = " in new


def test_two_loops_over_one_model_compile_it_once():
    source = (
        "import torch\nnet = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.LayerNorm(4), torch.nn.Tanh(), torch.nn.Linear(4, 1))\n"
        + LOOP.format(indent="", model="net") * 2
    )
    found, new = rewrite(source)
    assert [fixable for _, fixable in found] == [True] and new.count("net.compile()") == 1


def test_a_model_given_to_the_training_function_is_reported_without_a_fix():
    found, new = rewrite(
        "import torch\ndef train(model):\n"
        + LOOP.format(indent="    ", model="model")
        + "train(torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.LayerNorm(4), torch.nn.Tanh(), torch.nn.Linear(4, 1)))\n"
    )
    assert found == [(4, False)] and ".compile()" not in new


def test_a_model_in_an_attribute_is_reported_without_a_fix():
    source = (
        "import torch\nclass Trainer:\n    def __init__(self):\n        self.model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.LayerNorm(4), torch.nn.Tanh(), torch.nn.Linear(4, 1))\n"
        "    def fit(self):\n" + LOOP.format(indent="        ", model="self.model")
    )
    found, new = rewrite(source)
    assert [fixable for _, fixable in found] == [False] and ".compile()" not in new


def test_other_compile_calls_do_not_count_as_compiling_the_model():
    found, _ = rewrite(
        "import re\nimport torch\npattern = re.compile('x')\nmodel = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.LayerNorm(4), torch.nn.Tanh(), torch.nn.Linear(4, 1))\n"
        + LOOP.format(indent="", model="model")
    )
    assert found == [(4, True)]

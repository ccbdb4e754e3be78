"""The one number question (`Values.number`): the layouts, the attention scale, the
position bounds and the host reads all ask it, and it knows what each of them knew."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from codemod.analysis.attention import attentions
from codemod.analysis.position_slices import position_slices
from codemod.analysis.tensor_layout import layouts
from codemod.analysis.values import INT, NUMBER, values
from codemod.context import FileContext


def context(code: str) -> FileContext:
    return FileContext.of_source(textwrap.dedent(code))


def printed(ctx: FileContext) -> cst.BaseExpression:
    """The argument of the last `print(...)` of the file."""
    calls = [c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "print"]
    return calls[-1].args[0].value


@pytest.mark.parametrize(
    ("code", "answer"),
    [
        ("def f(n: int):\n    print(n)\n", INT),
        ("def f(s: float):\n    print(s)\n", NUMBER),
        ("from typing import Optional\ndef f(s: Optional[float] = None):\n    print(s)\n", NUMBER),
        ("import typing\ndef f(s: typing.Optional[int] = None):\n    print(s)\n", INT),
        ("def f(s: float | None = None):\n    print(s)\n", NUMBER),
        ("def f(s: str):\n    print(s)\n", None),
        # never called in the file: its default, as written
        ("def f(x, scale=0.5):\n    print(scale)\n", NUMBER),
        # called: what every call passes (a tensor here)
        ("import torch\ndef f(x, scale=0.5):\n    print(scale)\nf(1, torch.ones(2))\n", None),
        ("import math\nprint(math.sqrt(2))\n", NUMBER),
        ("import math\nprint(math.floor(2.5))\n", INT),
        ("import math\nprint(2 * math.pi)\n", NUMBER),
        ("print(max(3, 4))\n", INT),
        ("print(max(3, 4.0))\n", NUMBER),
        ("print(round(2.5))\n", INT),
        ("import torch\nx = torch.ones(2, 3)\nB, T = x.shape\nprint(T)\n", INT),
        ("import torch\nx = torch.ones(2, 3)\nprint(x.size()[1])\n", INT),
        ("import torch\nx = torch.ones(2, 3)\nprint(x.ndim)\n", INT),
        ("import torch\nx = torch.ones(2, 3)\nprint(x.shape[1:])\n", None),  # a torch.Size
        ("import torch\nx = torch.ones(2, 3)\nprint(max(x))\n", None),
        ("print(0x4 * 2)\n", INT),
    ],
)
def test_what_is_a_python_number(code, answer):
    ctx = context(code)
    assert values(ctx).number(printed(ctx)) == answer


def test_an_attribute_set_from_a_default_is_a_number_for_the_layouts():
    # `self.eps` holds `eps`'s default (the class is built without it): a number, so
    # the layouts know `den + self.eps` keeps `den`'s shape.
    ctx = context(
        """
        import torch
        class M(torch.nn.Module):
            def __init__(self, eps=1e-6):
                super().__init__()
                self.eps = eps
            def forward(self, x):
                den = torch.zeros(2, 3)
                print(den + self.eps)
        m = M()
        """
    )
    expr = printed(ctx)
    assert values(ctx).number(expr.right) == NUMBER
    assert layouts(ctx).is_number(expr.right)
    assert layouts(ctx).shape(expr) == ("2", "3")


def test_a_hexadecimal_size_is_its_number():
    ctx = context("import torch\nx = torch.zeros(2, 0x4)\nprint(x)\n")
    assert layouts(ctx).shape(printed(ctx)) == ("2", "4")


@pytest.mark.parametrize(
    ("code", "number"),
    [
        ("print(0)", 0),
        ("print(0x0)", 0),
        ("print(0.)", 0),
        ("print((0))", 0),
        ("print(-1)", -1),
        ("ZERO = 0\nprint(ZERO)", 0),
        ("ONE = 0x1\ndef f():\n    print(ONE)", 1),
        ("n = 0\nn = 1\nprint(n)", None),  # bound to two numbers
        ("n = int('3')\nprint(n)", None),
    ],
)
def test_the_value_of_a_number_in_any_spelling(code, number):
    ctx = context(code)
    assert values(ctx).number_value(printed(ctx)) == number


HYPERPARAMETERS = """\
import argparse
from dataclasses import dataclass

@dataclass
class Hyperparameters:
    num_iterations: int = 100
    save_every: int = {default}

args = Hyperparameters({passed})
{written}
parser = argparse.ArgumentParser()
parser.add_argument("--save_every", type=int, default=0)
options = parser.parse_args()
DEBUG = False
print({test})
"""


@pytest.mark.parametrize(
    ("default", "passed", "written", "test", "truth"),
    [
        # modded-nanogpt's `save_every : int = 0`: built without it, never written
        (0, "", "", "args.save_every > 0", False),
        (0, "", "", "args.save_every > 0 and step % args.save_every == 0", False),
        (0, "", "", "step > 5 and args.save_every", False),
        (0, "", "", "not args.save_every", True),
        (0, "", "", "args.save_every == 0 or step > 5", True),
        (0, "", "", "0 <= args.save_every < args.num_iterations", True),
        (0, "", "", "DEBUG or args.save_every != 0", False),
        (100, "", "", "args.save_every > 0", True),
        (0, "save_every=5", "", "args.save_every > 0", True),  # the construction passes 5
        (0, "", "args.save_every = 5", "args.save_every > 0", None),  # 0 until written, then 5
        (100, "", "args.save_every = 0", "args.save_every > 0", None),  # 100 until written, then 0
        (0, "", "", "options.save_every > 0", None),  # a run may pass any number
        (0, "", "", "step > 0", None),
        (0, "", "", "args.save_every > 0 or step > 5", None),
    ],
)
def test_a_condition_is_certainly_true_or_false_only_at_numbers_the_code_fixes(default, passed, written, test, truth):
    ctx = context(HYPERPARAMETERS.format(default=default, passed=passed, written=written, test=test))
    assert values(ctx).truth(printed(ctx)) is truth


def chains(ctx: FileContext) -> list:
    analysis = attentions(ctx)
    return [found for block in ctx.index.find(cst.IndentedBlock) for found in analysis.in_block(block)]


def test_the_attention_scale_and_the_position_bounds_ask_the_same_question():
    code = """
        import torch
        from typing import Optional
        def attend(q, k, v, scale: Optional[float] = None, temperature=2.0):
            print(scale + temperature)
            return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v
        """
    ctx = context(code)
    assert position_slices(ctx).scalar(printed(ctx))
    (found,) = chains(ctx)
    assert found.attention.scale_unproven is None  # a float parameter: SDPA's scale= takes it
    (found,) = chains(context(code.replace("scale: Optional[float] = None", "scale")))
    assert "not provably a Python number" in found.attention.scale_unproven

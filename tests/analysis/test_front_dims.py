"""`tensor_layout.front_dim_read`: whether a function reads a dim of a tensor counted from
the front, so that an input with one more leading dim (a batch) could give its rows other
values than each row gave alone."""

import libcst as cst
import pytest

from codemod.analysis.tensor_layout import front_dim_read
from codemod.context import FileContext


def first_front_read(body: str) -> str | None:
    context = FileContext.of_source(
        "import math\nimport torch\nimport torch.nn.functional as F\ndef helper(h):\n    return h\n"
        "def forward(self, x):\n" + "".join(f"    {line}\n" for line in body.splitlines())
    )
    function = [f for f in context.index.find(cst.FunctionDef) if f.name.value == "forward"][0]
    read = front_dim_read(context, function)
    return None if read is None else context.module.code_for_node(read)


@pytest.mark.parametrize(
    "body",
    [
        "return self.head(self.norm(x))",
        "return F.softmax(x @ x.transpose(-2, -1), dim=-1)",
        "steps = torch.arange(1, x.size(-2) + 1)\nreturn x.cumsum(dim=-2) / steps[:, None]",
        "return torch.cat([x, x.exp()], dim=-1).sum(-1) + math.sqrt(2)",
        "return x[..., 0] * x.shape[-1]",
        "first, _ = x.split(4, dim=-1)\nreturn first",  # a split's first argument is a size
        "first, _ = x.tensor_split(2, dim=-1)\nreturn first",  # a count
        "return torch.tril(torch.ones(x.size(-2), x.size(-2))) @ x",
    ],
)
def test_dims_counted_from_the_end_are_not_reported(body):
    assert first_front_read(body) is None


@pytest.mark.parametrize(
    "body,read",
    [
        ("return x.cumsum(dim=1)", "x.cumsum(dim=1)"),
        ("return x - x.mean(0)", "x.mean(0)"),
        ("return x / x.sum()", "x.sum()"),  # every dim, the batch's too
        ("return x.view(1, -1)", "x.view(1, -1)"),
        ("return x.reshape(x.size(-2), -1)", "x.reshape(x.size(-2), -1)"),
        ("return torch.cat([x, x])", "torch.cat([x, x])"),  # along its default dim 0
        ("return x[:, 0]", "x[:, 0]"),
        ("return x * x.shape[0]", "x.shape[0]"),
        ("return x * len(x)", "len(x)"),
        ("return x.T", "x.T"),
        ("return x.softmax(dim=self.dim)", "x.softmax(dim=self.dim)"),  # not a literal
        ("return helper(x)", "helper(x)"),  # a function of the file, not read here
        ("return x.gather(1, x.argmax(-1, keepdim=True))", "x.gather(1, x.argmax(-1, keepdim=True))"),  # unknown
        ('return torch.einsum("ti,ij->tj", x, self.w)', 'torch.einsum("ti,ij->tj", x, self.w)'),
        ("return F.cross_entropy(x, self.t)", "F.cross_entropy(x, self.t)"),  # classes on dim 1
        ("for row in x:\n    pass\nreturn x", "x"),
    ],
)
def test_dims_counted_from_the_front_are_reported(body, read):
    assert first_front_read(body) == read


def _layer_cases():
    import torch
    from torch import nn

    def features():
        return torch.randn(5, 3, 4)

    def tokens():
        return torch.randint(7, (5, 3))

    return {
        "Linear": (lambda: nn.Linear(4, 2), features),
        "Embedding": (lambda: nn.Embedding(7, 4), tokens),
        "LayerNorm": (lambda: nn.LayerNorm(4), features),
        "RMSNorm": (lambda: nn.RMSNorm(4), features),
        "Dropout": (lambda: nn.Dropout(0.5), features),  # eval mode: what training draws differs anyway
        "Identity": (nn.Identity, features),
        **{name: (getattr(nn, name), features) for name in "GELU ReLU SiLU Tanh Sigmoid Softplus ELU".split()},
        **{name: (getattr(nn, name), features) for name in "LeakyReLU Mish Hardswish ReLU6 SELU CELU Hardtanh".split()},
        "Sequential": (lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.LayerNorm(4)), features),
        "ModuleList": (lambda: nn.Sequential(*nn.ModuleList([nn.Linear(4, 4), nn.Tanh()])), features),
        "ModuleDict": (
            lambda: nn.Sequential(*nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Tanh()}).values()),
            features,
        ),
    }


def test_every_leading_dim_layer_gives_a_row_what_the_batch_gives_it():
    """torch_facts.LEADING_DIM_LAYERS, checked against the installed torch: each layer run on
    one sample without its batch dimension gives that sample's row of the batched output."""
    import torch

    from codemod.analysis.torch_facts import LEADING_DIM_LAYERS

    cases = _layer_cases()
    assert {name.rsplit(".", 1)[1] for name in LEADING_DIM_LAYERS} == set(cases)
    torch.manual_seed(0)
    for name, (build, inputs) in cases.items():
        layer, x = build().eval(), inputs()
        batched = layer(x)
        for i in range(len(x)):
            torch.testing.assert_close(layer(x[i]), batched[i], rtol=1e-6, atol=1e-6, msg=name)

"""`tensor_layout.front_dim_read`: whether a function reads a dim of a tensor counted from
the front, so that an input with one more leading dim (a batch) could give its rows other
values than each row gave alone."""

import libcst as cst
import pytest

from codemod.analysis.tensor_layout import front_dim_read
from codemod.context import FileContext


def first_front_read(body: str) -> str | None:
    context = FileContext.of_source(
        "import torch\nimport torch.nn.functional as F\ndef helper(h):\n    return h\n"
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
        "return torch.cat([x, x.flip(-1)], dim=-1).sum(-1)",
        "return x[..., 0] * x.shape[-1]",
        "first, _ = x.split(4, dim=-1)\nreturn first",  # a split's first argument is a size
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
        ("for row in x:\n    pass\nreturn x", "x"),
    ],
)
def test_dims_counted_from_the_front_are_reported(body, read):
    assert first_front_read(body) == read

"""Shapes the layouts analysis reads from the code that builds a tensor: the ones the data
rules need to tell a tensor's length and a value's rank."""

import libcst as cst
import pytest

from codemod.analysis.tensor_layout import layouts
from codemod.context import FileContext


def shape_of(code: str, name: str = "x"):
    """The shape of the last read of `name` in `code` (the last line is `print(name)`)."""
    context = FileContext.of_source(f"import torch\nimport torch.nn.functional as F\n{code}\nprint({name})\n")
    read = [n for n in context.index.find(cst.Name) if n.value == name][-1]
    return layouts(context).shape(read)


@pytest.mark.parametrize(
    "code, shape",
    [
        ("x = torch.linspace(-1, 1, n)", ("n",)),
        ("x = torch.linspace(0, 1, steps=50)", ("50",)),
        ("x = torch.arange(n)", (None,)),
        ("x = torch.linspace(-1, 1, n).unsqueeze(1).repeat(1, 7)", ("n", None)),
        ("x = torch.randn(n, 1).repeat(2, 1)", (None, "1")),
        ("x = torch.cat([torch.randn(n, 3), torch.randn(n, 4)], dim=1)", ("n", None)),
        ("x = torch.cat([torch.randn(n, 3), torch.randn(m, 3)])", (None, "3")),
        ("x = torch.cat((torch.randn(n, 3), torch.randn(n, 4)), -1)", ("n", None)),
        ("x = torch.cat(parts, dim=1)", None),
        ("x = F.mse_loss(a, b)", ()),
        ("x = F.cross_entropy(a, b, reduction='sum')", ()),
        ("x = F.cross_entropy(a, b, reduction='none')", None),
        ("x = F.cross_entropy(a, b, reduction=how)", None),
        ("x = torch.nn.utils.clip_grad_norm_(params, 1.0)", ()),
        ("x = torch.randint_like(torch.zeros(n, 3), 10)", ("n", "3")),  # the shape of its first argument
        ("x = torch.zeros(n, 3).norm(1, dim=0)", ("3",)),  # a norm's first argument is its order
        ("x = torch.zeros(n, 3, 4).norm(2)", ()),
        ("x = torch.zeros(n, 3).std(0, keepdim=True)", ("1", "3")),
    ],
)
def test_shapes_from_the_code_that_builds_the_tensor(code, shape):
    assert shape_of(code) == shape

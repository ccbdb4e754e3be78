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
        ("x = torch.stack([torch.zeros(3) for _ in range(n)])", ("n", "3")),
        ("x = torch.stack(tensors=[torch.zeros(3) for _ in range(n)])", None),  # given by keyword: not read
    ],
)
def test_shapes_from_the_code_that_builds_the_tensor(code, shape):
    assert shape_of(code) == shape


def steps_dim_of(code: str, name: str = "x"):
    """The dim of the steps of the last read of `name` in `code`."""
    context = FileContext.of_source(f"import torch\nimport torch.nn as nn\n{code}\nprint({name})\n")
    read = [n for n in context.index.find(cst.Name) if n.value == name][-1]
    return layouts(context).steps_dim(read)


NET = """\
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 8{options})
        self.head = nn.Linear(8, 5)

    def forward(self, seq):
        out, _ = self.rnn(seq)
        return self.head(out).log_softmax(-1)


model = Net().to("cpu")
x = model(torch.randn(10, 4, 8))
"""


@pytest.mark.parametrize(
    "code, dim",
    [
        ("rnn = nn.LSTM(8, 8)\nx, (h, c) = rnn(torch.randn(10, 4, 8))", 0),  # (T, B, H): nn.LSTM's default
        ("rnn = nn.LSTM(8, 8, batch_first=True)\nx, _ = rnn(torch.randn(4, 10, 8))", 1),
        ("rnn = nn.GRU(8, 8, 1, True, True)\nx, _ = rnn(torch.randn(4, 10, 8))", 1),  # batch_first by position
        ("rnn = nn.GRU(8, 8, batch_first=flag)\nx, _ = rnn(torch.randn(4, 10, 8))", None),
        ("rnn = nn.RNN(8, 8).to('cpu')\nx = rnn(torch.randn(10, 4, 8))[0] * 2.0", 0),
        ("rnn = nn.LSTM(8, 8)\n_, x = rnn(torch.randn(10, 4, 8))", None),  # the last hidden state
        ("rnn, head = nn.LSTM(8, 8), nn.Linear(8, 5)\nout, _ = rnn(torch.randn(10, 4, 8))\nx = head(out)", 0),
        (NET.format(options=""), 0),  # through the forward of a model class of the file
        (NET.format(options=", batch_first=True"), 1),
        ("rnn = nn.LSTM(8, 8)\nout, _ = rnn(torch.randn(10, 4, 8))\nx = out.mul(0.5).float()", 0),
        ("rnn = nn.LSTM(8, 8)\nout, _ = rnn(torch.randn(10, 4, 8))\nx = out.mul(w)", None),  # w may add dims
        ("x = torch.randn(10, 4, 8)", None),  # nothing says which dim is time
    ],
)
def test_the_steps_dim_of_a_recurrent_layers_output_is_followed(code, dim):
    assert steps_dim_of(code) == dim

"""PM301's forward pass starts at the first call that runs a model, also through a
function of the file that reads the model from an enclosing scope (`encode_fn(texts)`,
defined once per encoder in each branch of an `if`, as LatentWire's training script
does). A helper that runs the model without recording gradients (an evaluation helper)
or only switches its mode does not start the forward pass. The run of the rewritten
program against float32 is in test_pm301_execution (`encoder_helper_per_branch`)."""

from __future__ import annotations

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.forward_without_autocast import ForwardWithoutAutocast

HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(512, 512).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = [(torch.randn(4, 512), torch.randint(0, 512, (4,))) for _ in range(3)]
"""
LOOP = """\
for step, (x, y) in enumerate(data):
    x, y = x.to(device), y.to(device)
    {first}
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def wrapped_from(helper: str, first: str) -> str:
    """The first statement of the with-block PM301 writes."""
    source = HEAD + helper + LOOP.format(first=first)
    settings = Settings(select=("PM301",), level=Level.NUMERIC)
    result = process_source(source.encode(), "train.py", settings, [ForwardWithoutAutocast])
    assert result.error is None and len(result.findings) == 1 and result.findings[0].applied, result.findings
    new = result.new_source.decode()
    return new.split("with precision.autocast():\n", 1)[1].splitlines()[0].strip()


def test_a_helper_defined_in_each_branch_that_runs_the_model_starts_the_forward():
    helper = (
        "if device.type == 'cuda':\n    def encode(x):\n        return model(x)\n"
        "else:\n    def encode(x):\n        return torch.tanh(model(x))\n"
    )
    assert wrapped_from(helper, "x = encode(x)") == "x = encode(x)"


@pytest.mark.parametrize(
    "helper",
    [
        "@torch.no_grad()\ndef evaluate(x):\n    return model(x).sum()\n",
        "def evaluate(x):\n    with torch.no_grad():\n        return model(x).sum()\n",
        "def evaluate(x):\n    model.train()\n    return x\n",
    ],
    ids=["no_grad decorator", "no_grad block", "mode switch only"],
)
def test_a_helper_that_records_no_gradient_does_not_start_it(helper):
    assert wrapped_from(helper, "if step % 2 == 0:\n        print(evaluate(x))") == "logits = model(x)"

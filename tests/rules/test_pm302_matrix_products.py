"""PM302 on the fixture pairs of issue-style programs: TF32 goes where the process
starts, never into a function run every step or epoch, and a step that multiplies
no matrices gets no finding. The rewrite trains the same on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.float32_matmul_without_tf32 import Float32MatmulWithoutTf32
from tests.rules.scripts import losses, max_relative_difference, rewrite

PAIRS = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM302"
TOLERANCE = 1e-3  # what TF32 allows where the hardware honours it (see test_training_fixtures)


@pytest.fixture
def restore_matmul_precision():
    """The rewrite sets a process-wide flag; other tests must not inherit it."""
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_the_step_function_pair_trains_the_same(restore_matmul_precision):
    source = (PAIRS / "step_function.in.py").read_text()
    new_source = rewrite(source, [Float32MatmulWithoutTf32])
    assert new_source == (PAIRS / "step_function.out.py").read_text()
    before = losses(source)
    assert len(before) == 15
    assert max_relative_difference(losses(new_source), before) < TOLERANCE


def test_an_embedding_only_model_gets_no_finding():
    source = (PAIRS / "embedding_bigram.in.py").read_text()
    settings = Settings(select=("PM302",), level=Level.NUMERIC)
    result = process_source(source.encode(), "bigram.py", settings, [Float32MatmulWithoutTf32])
    assert result.error is None and result.findings == []
    assert len(losses(source)) == 20  # the program runs as it is
    with_head = source.replace(
        "        logits = self.logits(ids)\n", "        logits = self.logits(ids) @ self.logits.weight.T\n"
    )
    result = process_source(with_head.encode(), "bigram.py", settings, [Float32MatmulWithoutTf32])
    assert [f.applied for f in result.findings] == [True]  # a product in the forward: TF32 pays again


TRAIN = """\
import torch
from models import Model

device = torch.device("cuda")
model = Model(100, 8).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    ids = torch.randint(0, 100, (4, 5), device=device)
    loss = model(ids).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

MODELS = """\
import torch.nn as nn


class Lookup(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)

    def forward(self, ids):
        return self.emb(ids).sum(dim=1)


class Model(Lookup):
    pass
"""


def test_a_model_class_of_a_project_module_is_read_there(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    settings = Settings(select=("PM302",), level=Level.NUMERIC, root=tmp_path)

    def applied():
        result = process_source(TRAIN.encode(), str(script), settings, [Float32MatmulWithoutTf32])
        assert result.error is None, result.error
        return [f.applied for f in result.findings]

    (tmp_path / "models.py").write_text(MODELS)
    assert applied() == []  # embeddings summed: no matrix product
    (tmp_path / "models.py").write_text(MODELS.replace("nn.Embedding(vocab, dim)", "nn.EmbeddingBag(vocab, dim)"))
    assert applied() == []
    (tmp_path / "models.py").write_text(MODELS.replace(".sum(dim=1)", " @ self.emb.weight.T"))
    assert applied() == [True]
    (tmp_path / "models.py").write_text(
        "import torch.nn as nn\n\n\ndef Model(vocab, dim):\n    return nn.Sequential(nn.Embedding(vocab, dim), nn.Linear(dim, 1))\n"
    )
    assert applied() == [True]  # a function of the module that builds the model
    (tmp_path / "models.py").write_text("from transformers import AutoModel as Model\n")
    assert applied() == [True]  # another library's model: unknown, so TF32 stays


def test_a_model_whose_parts_a_loop_casts_to_bfloat16_gets_no_finding():
    source = (
        "import torch\nimport torch.nn as nn\n\n"
        "model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()\n"
        "for layer in model.children():\n    layer.bfloat16()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(10):\n"
        "    x = torch.randn(4, 16, device='cuda', dtype=torch.bfloat16)\n"
        "    loss = model(x).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    settings = Settings(select=("PM302",), level=Level.NUMERIC)
    found = process_source(source.encode(), "train.py", settings, [Float32MatmulWithoutTf32]).findings
    assert found == []
    as_float32 = source.replace("    layer.bfloat16()\n", "    layer.float()\n")
    found = process_source(as_float32.encode(), "train.py", settings, [Float32MatmulWithoutTf32]).findings
    assert [f.code for f in found] == ["PM302"]


# An LSTM over the 28 rows of MNIST images, as tutorials write it: cuDNN runs the recurrent
# layers' products in TF32 already, and the float32 matmul precision does not change them.
RECURRENT = """\
import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as transforms

train = torchvision.datasets.MNIST(root="data", train=True, transform=transforms.ToTensor(), download=True)
loader = torch.utils.data.DataLoader(dataset=train, batch_size=100, shuffle=True)


class RNN(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, num_classes):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, num_classes)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1, :])


model = RNN(28, 128, 2, HEAD).to("cuda")
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(2):
    for images, labels in loader:
        images = images.reshape(-1, 28, 28).to("cuda")
        loss = criterion(model(images), labels.to("cuda"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def _pm302(source: str):
    result = process_source(source.encode(), "<lstm>", Settings(select=("PM302",), level=Level.UNSAFE))
    assert result.error is None, result.error
    (finding,) = [f for f in result.findings if f.code == "PM302"]
    return finding


def test_the_recurrent_layers_products_are_not_weighed_for_tf32():
    # what is left is the 128-to-10 head, too narrow for TF32 to speed up
    finding = _pm302(RECURRENT.replace("HEAD", "10"))
    assert not finding.applied and "the widest, 128 by 10" in finding.message
    assert "cuDNN runs the recurrent layers' products in TF32 already" in finding.message


def test_a_wide_product_beside_the_recurrent_layers_keeps_the_fix():
    # the same model with a 128-to-8192 head over the 100 rows: 2 x 100 x 128 x 8192 flops, 11 us
    assert _pm302(RECURRENT.replace("HEAD", "8192")).applied

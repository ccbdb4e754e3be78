"""Whether a training step multiplies matrices (`Training.multiplies_matrices`): True as
soon as the step or a model it runs shows one; False only when every module and function
the step runs was read; None when some of it cannot be read here."""

from __future__ import annotations

import textwrap

import pytest

from codemod.context import FileContext

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"

LOOP = """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in batches:
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

BAG = """
class Bag(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.scale = dim ** 0.5

    def forward(self, ids):
        return self.emb(ids).sum(dim=1) / self.scale
"""


def verdicts(code: str) -> list[bool | None]:
    training = FileContext.of_source(HEAD + textwrap.dedent(code), "<test>").training
    assert training.loops, "no training loop found"
    return [training.multiplies_matrices(loop) for loop in training.loops]


NO_PRODUCT = {
    "an embedding lookup summed": BAG + "model = Bag(100, 8).cuda()\n" + LOOP,
    "torch's layers without a product": "model = nn.Sequential(nn.Embedding(100, 8), nn.Tanh(), nn.Flatten())\n" + LOOP,
    "matrix factorisation as an elementwise product": """
class MF(nn.Module):
    def __init__(self, users, items, k=16):
        super().__init__()
        self.P = nn.Embedding(users, k)
        self.Q = nn.Embedding(items, k)
        self.mu = nn.Parameter(torch.tensor(3.5))

    def forward(self, u, i):
        return self.mu + (self.P(u) * self.Q(i)).sum(-1)

model = MF(10, 20)
"""
    + LOOP.replace("model(x)", "model(x, x)"),
    "the model passed to the training function by its caller": BAG
    + "\n\ndef train(model, batches):\n"
    + textwrap.indent(LOOP, "    ")
    + "\n\ndef main():\n    train(Bag(10, 4).cuda(), [])\n",
    "the model passed to a trainer's method": BAG
    + "\n\nclass Trainer:\n    def fit(self, model, batches):\n"
    + textwrap.indent(LOOP, "        ")
    + "\n\ntrainer = Trainer()\ntrainer.fit(Bag(10, 4), [])\n",
    "a list of layers appended to, then wrapped": """
def build():
    layers = [nn.Embedding(10, 4)]
    layers.append(nn.ReLU())
    return nn.Sequential(*layers)

model = build()
"""
    + LOOP,
}

PRODUCT = {
    "nn.Linear": "model = nn.Sequential(nn.Embedding(100, 8), nn.Linear(8, 1))\n" + LOOP,
    "`@` in the forward": BAG.replace(".sum(dim=1)", " @ self.emb.weight.T") + "model = Bag(10, 4)\n" + LOOP,
    "einsum in a block the model holds": """
class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, d))

    def forward(self, x):
        return torch.einsum("bd,de->be", x, self.w)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(8) for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x

model = Net()
"""
    + LOOP,
    "a subclass of nn.Linear": "class Head(nn.Linear):\n    pass\n\nmodel = Head(4, 2)\n" + LOOP,
    "a convolution": "model = nn.Sequential(nn.Conv1d(4, 4, 3), nn.ReLU())\n" + LOOP,
    "an LSTM": "model = nn.LSTM(4, 8)\n" + LOOP.replace("model(x)", "model(x)[0]"),
    "a model built by a function of the file": """
def build(d):
    layers = [nn.Embedding(10, d)]
    layers.append(nn.Linear(d, 1))
    return nn.Sequential(*layers)

model = build(4)
"""
    + LOOP,
    "F.linear in the step itself": "model = nn.Embedding(10, 4)\nw = torch.randn(4, 4)\n"
    + LOOP.replace("model(x)", "F.linear(model(x), w)"),
    "the model moved, wrapped and renamed": "import torch.nn.parallel as par\n\n"
    "net = nn.Linear(4, 1).cuda()\nmodel = par.DistributedDataParallel(net)\n" + LOOP,
}

UNKNOWN = {
    "a model of another library": "import transformers\n\nmodel = transformers.AutoModel.from_pretrained('bert')\n"
    + LOOP,
    "a model from torch.hub": "model = torch.hub.load('pytorch/vision', 'resnet18')\n" + LOOP,
    "a deep copy of a model": "import copy\n\nbase = nn.Embedding(10, 4)\nmodel = copy.deepcopy(base)\n" + LOOP,
    "a model passed in by a caller elsewhere": "\ndef train(model, batches):\n" + textwrap.indent(LOOP, "    "),
    "a module that holds a module it is given": """
class Wrapper(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)

model = Wrapper(load_encoder())
"""
    + LOOP,
    "a class of another library's base": "import lightning\n\nclass Lit(lightning.LightningModule):\n"
    "    def forward(self, x):\n        return x.sum()\n\nmodel = Lit()\n" + LOOP,
}


@pytest.mark.parametrize("case", NO_PRODUCT)
def test_a_step_without_a_matrix_product(case):
    assert verdicts(NO_PRODUCT[case]) == [False]


@pytest.mark.parametrize("case", PRODUCT)
def test_a_step_with_a_matrix_product(case):
    assert verdicts(PRODUCT[case]) == [True]


@pytest.mark.parametrize("case", UNKNOWN)
def test_a_step_whose_models_cannot_be_read(case):
    assert verdicts(UNKNOWN[case]) == [None]


def reduced(code: str) -> list[bool]:
    training = FileContext.of_source(HEAD + textwrap.dedent(code), "<test>").training
    assert training.loops, "no training loop found"
    return [training.reduced_precision(loop) is not None for loop in training.loops]


AUTOCAST_LOOP = LOOP.replace(
    "    loss = model(x).pow(2).mean()\n",
    "    with AUTOCAST:\n        loss = model(x).pow(2).mean()\n",
)


@pytest.mark.parametrize(
    "code",
    [
        "model = nn.Linear(4, 1).cuda().bfloat16()\n" + LOOP,
        "model = nn.Linear(4, 1).half()\nmodel.cuda()\n" + LOOP,
        "model = nn.Linear(4, 1, dtype=torch.bfloat16)\n" + LOOP,
        "model = nn.Linear(4, 1).to('cuda', torch.bfloat16)\n" + LOOP,
        "model = nn.Linear(4, 1)\n" + AUTOCAST_LOOP.replace("AUTOCAST", 'torch.autocast("cuda", dtype=torch.bfloat16)'),
        "model = nn.Linear(4, 1)\n" + AUTOCAST_LOOP.replace("AUTOCAST", 'torch.autocast(device_type="cuda")'),
        "model = nn.Linear(4, 1)\n" + AUTOCAST_LOOP.replace("AUTOCAST", "torch.cuda.amp.autocast()"),
    ],
)
def test_matrix_products_in_16_bits(code):
    assert reduced(code) == [True]


@pytest.mark.parametrize(
    "code",
    [
        "model = nn.Linear(4, 1).cuda()\n" + LOOP,
        "model = nn.Linear(4, 1).cuda()\nx = torch.randn(2).half()\n" + LOOP,
        "model = nn.Linear(4, 1)\nuse_amp = False\n"
        + AUTOCAST_LOOP.replace("AUTOCAST", 'torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp)'),
        "model = nn.Linear(4, 1)\n" + AUTOCAST_LOOP.replace("AUTOCAST", 'torch.autocast("cpu", dtype=torch.bfloat16)'),
        "model = nn.Linear(4, 1)\n" + AUTOCAST_LOOP.replace("AUTOCAST", 'torch.autocast("cuda", dtype=torch.float32)'),
        "model = nn.Linear(4, 1)\n" + AUTOCAST_LOOP.replace("AUTOCAST", "torch.cuda.amp.autocast(flag)"),
        "model = nn.Linear(4, 1).bfloat16()\nhead = nn.Linear(1, 1)\n"
        + LOOP.replace("model(x)", "head(model(x))").replace(
            "model.parameters()", "[*model.parameters(), *head.parameters()]"
        ),
    ],
)
def test_matrix_products_that_may_run_in_float32(code):
    assert reduced(code) == [False]


def test_a_model_run_by_a_torch_function():
    code = "model = nn.Linear(4, 1)\n" + LOOP.replace(
        "model(x)", "torch.func.functional_call(model, dict(model.named_parameters()), (x,))"
    )
    assert verdicts(code) == [True]
    assert verdicts(code.replace("nn.Linear(4, 1)", "nn.Embedding(4, 1)")) == [False]

"""What loading one item (and one batch) of a dataset takes, `Loaders.item_cost` and
`Loaders.batch_cost`: PM201 gives no workers to loaders whose batches are only rows of
tensors the training process holds, and fixes `num_workers=0` only over datasets that
work for each item (issue 22)."""

import libcst as cst
import pytest

from codemod.analysis.loaders import COMPUTES, INDEXES, UNKNOWN
from codemod.context import FileContext

HEAD = "import torch\nfrom torch.utils.data import DataLoader, Dataset, TensorDataset, Subset, random_split\n"
WINDOWS = """
class Windows(Dataset):
    def __init__(self, data, seq_len):
        super().__init__()
        self.data = data
        self.seq_len = seq_len

    def __len__(self):
        return self.data.size(0) // self.seq_len

    def __getitem__(self, index):
        start = torch.randint(0, self.data.size(0) - self.seq_len - 1, (1,)).item()
        return self.data[start : start + self.seq_len + 1].clone().long()
"""
PRECOMPUTED = """
class Ring(Dataset):
    def __init__(self, n=64):
        angle = torch.rand(n) * 6.28
        self.points = torch.stack([angle.cos(), angle.sin()], dim=1)

    def __len__(self):
        return len(self.points)

    def __getitem__(self, i):
        return self.points[i]
"""
TOKENIZING = """
class Texts(Dataset):
    def __init__(self, texts):
        self.texts = texts

    def __len__(self):
        return len(self.texts)

    def __getitem__(self, i):
        return torch.tensor([ord(c) for c in self.texts[i]])
"""
DECODING = """
from PIL import Image

class Images(Dataset):
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return self.transform(Image.open(self.paths[i]))
"""
MEMMAP = """
import numpy as np

class Tokens(Dataset):
    def __init__(self, path):
        self.data = np.memmap(path, dtype=np.uint16, mode="r")

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i : i + 9]
"""
LIGHTNING = """
class Module:
    def __init__(self):
        full = TensorDataset(torch.randn(100, 4), torch.randn(100, 1))
        self.train_set, self.val_set = random_split(full, [80, 20])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=8)
"""
# Texts tokenized and padded once, when the dataset is made, and labels in a table read
# whole: `__getitem__` only indexes them and makes tensors of what it picked.
PRETOKENIZED = """
import pandas as pd

class Spam(Dataset):
    def __init__(self, csv_file, tokenizer, max_length=8, pad_token_id=0):
        self.data = pd.read_csv(csv_file)
        self.encoded = [tokenizer.encode(text)[:max_length] for text in self.data["Text"]]
        self.encoded = [ids + [pad_token_id] * (max_length - len(ids)) for ids in self.encoded]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        encoded = self.encoded[index]
        label = self.data.iloc[index]["Label"]
        return torch.tensor(encoded, dtype=torch.long), torch.tensor(label, dtype=torch.long)
"""

CASES = [
    ("loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8)))", INDEXES),
    ("rows = TensorDataset(torch.randn(8, 2))\nloader = DataLoader(Subset(rows, [0, 1]))", INDEXES),
    ("train, val = random_split(TensorDataset(torch.randn(8, 2)), [6, 2])\nloader = DataLoader(train)", INDEXES),
    (WINDOWS + "loader = DataLoader(Windows(torch.randint(0, 256, (1000,)), 16), batch_size=4)", INDEXES),
    (PRECOMPUTED + "loader = DataLoader(Ring())", INDEXES),
    (LIGHTNING, INDEXES),
    (TOKENIZING + "loader = DataLoader(Texts(['ab', 'cd']))", COMPUTES),
    (PRETOKENIZED + "loader = DataLoader(Spam('train.csv', tokenizer), batch_size=8)", INDEXES),
    (  # a mask kept in memory, or None and made of ones per item: still nothing to take off
        PRETOKENIZED.replace(
            "        self.encoded = [ids + [",
            "        if masked:\n            self.masks = [[1] * max_length for _ in self.encoded]\n"
            "        else:\n            self.masks = None\n"
            "        self.encoded = [ids + [",
        )
        .replace("pad_token_id=0):", "pad_token_id=0, masked=False):")
        .replace(
            '        label = self.data.iloc[index]["Label"]\n',
            '        label = self.data.iloc[index]["Label"]\n'
            "        mask = self.masks[index] if self.masks is not None else torch.ones(8, dtype=torch.long)\n",
        )
        + "train = None\nif train is None:\n    train = Spam('train.csv', tokenizer)\n"
        + "loader = DataLoader(train, batch_size=8)",
        INDEXES,
    ),
    (  # the same dataset tokenizing in `__getitem__`: work per item
        PRETOKENIZED.replace(
            "encoded = self.encoded[index]", "encoded = tokenizer.encode(self.data.iloc[index]['Text'])"
        )
        + "loader = DataLoader(Spam('train.csv', tokenizer), batch_size=8)",
        COMPUTES,
    ),
    (DECODING + "loader = DataLoader(Images(['a.png']))", COMPUTES),
    (
        "loader = DataLoader(TensorDataset(torch.randn(8, 2)), collate_fn=lambda b: torch.stack([x for (x,) in b]))",
        COMPUTES,
    ),
    ("loader = DataLoader(TensorDataset(torch.randn(8, 2)), collate_fn=torch.utils.data.default_collate)", INDEXES),
    (MEMMAP + "loader = DataLoader(Tokens('train.bin'))", UNKNOWN),  # indexing a memmap reads the file
    (WINDOWS + "def build(data):\n    return DataLoader(Windows(data, 16))", UNKNOWN),  # data of unknown memory
    ("from my_project import Corpus\nloader = DataLoader(Corpus('train.txt'))", UNKNOWN),
]


@pytest.mark.parametrize("code,cost", CASES, ids=range(len(CASES)))
def test_batch_cost(code, cost):
    context = FileContext.of_source(HEAD + code)
    (loader,) = context.loaders.constructions
    assert context.loaders.batch_cost(loader) == cost


def test_only_a_tensor_dataset_gets_the_batch_sampler_advice():
    context = FileContext.of_source(
        HEAD + "rows = TensorDataset(torch.randn(8, 2))\n" + PRECOMPUTED + "ring = Ring()\n"
    )
    names = {n.value: n for n in context.index.find(cst.Name) if n.value in ("rows", "ring")}
    assert context.loaders.rows_of_tensors(names["rows"])
    assert not context.loaders.rows_of_tensors(names["ring"])


def test_pm201_does_not_ask_for_workers_for_a_dataset_tokenized_when_it_is_made():
    from codemod.config import Settings
    from codemod.engine import process_source
    from codemod.result import Level

    code = (
        HEAD
        + PRETOKENIZED
        + "model = torch.nn.Linear(8, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "num_workers = 0\n"
        + "loader = DataLoader(Spam('train.csv', tokenizer), batch_size=8, num_workers=num_workers)\n"
        + "for x, y in loader:\n    loss = torch.nn.functional.cross_entropy(model(x.float()), y)\n"
        + "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    settings = Settings(select=("PM201",), level=Level.UNSAFE)
    [finding] = process_source(code.encode(), "<test>", settings).findings
    assert not finding.applied
    assert "left without workers" in finding.message and "give it worker processes" not in finding.message


TOY_MODULE = """\
from torch.utils.data import Dataset


class ToyDataset(Dataset):
    def __init__(self, X, y):
        self.features = X
        self.labels = y

    def __getitem__(self, index):
        return self.features[index], self.labels[index]

    def __len__(self):
        return self.labels.shape[0]
"""


@pytest.mark.parametrize(
    "features, cost",
    [("torch.tensor([[-1.2, 3.1], [2.3, -1.1]])", INDEXES), ("load_features()", UNKNOWN)],
)
def test_a_dataset_class_of_another_module_is_read_there_with_what_this_file_gives_it(tmp_path, features, cost):
    """The class is read in its module; the tensors it is given, in the file that makes it."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "toy.py").write_text(TOY_MODULE)
    train = f"{HEAD}from toy import ToyDataset\nX = {features}\ny = torch.tensor([0, 1])\nloader = DataLoader(ToyDataset(X, y))\n"
    (tmp_path / "train.py").write_text(train)
    context = FileContext.of_source(train, str(tmp_path / "train.py"))
    (loader,) = context.loaders.constructions
    assert context.loaders.batch_cost(loader) == cost

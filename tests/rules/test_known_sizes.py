"""Sizes the code shows in more forms (codemod/analysis/sizes.py), and the fixes they hold
back where the rules' own thresholds say the fix gains nothing: data written out in
`torch.tensor([[...]])`, a dim read from a tensor of known shape (`x.view(x.size(0), -1)`),
and images padded by torchvision's `Pad` before a crop. Each held-back fix is a report that
gives the sizes; a size that cannot be told keeps the fix."""

from __future__ import annotations

import libcst as cst
import pytest

from codemod.analysis.sizes import ModuleSize, sizes_of
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.rule import Level


def context(code: str) -> FileContext:
    return FileContext.of_source(code)


def last_value(ctx: FileContext):
    return ctx.module.body[-1].body[0].value


def findings(code: str, *codes: str):
    result = process_source(code.encode(), "<sizes>", Settings(select=codes, level=Level.UNSAFE))
    assert result.error is None, result.error
    return result


# -- torch.tensor of numbers written out ------------------------------------------------------


@pytest.mark.parametrize(
    "data,shape,element",
    [
        ("[[-1.2, 3.1], [-0.9, 2.9], [2.3, -1.1]]", (3, 2), 4),  # float32, torch's default
        ("[0, 0, 1]", (3,), 8),  # int64
        ("[[1, 2.5], [3, 4]]", (2, 2), 4),  # one float makes them all float
        ("((True,), (False,))", (2, 1), 1),  # bool
        ("7", (), 8),
        ("[[1, 2], [3, 4]], dtype=torch.float16", (2, 2), 2),
    ],
)
def test_a_tensor_of_numbers_written_out_has_their_nesting_as_its_shape(data, shape, element):
    ctx = context(f"import torch\nY = torch.tensor({data})\n")
    assert sizes_of(ctx).tensor(last_value(ctx)) == (shape, element)


def test_a_name_bound_to_numbers_written_out_is_sized_through_its_binding():
    ctx = context("import torch\nrows = [[0.5, 1.0], [2.0, 3.0]]\nY = torch.as_tensor(rows)\n")
    assert sizes_of(ctx).tensor(last_value(ctx)) == ((2, 2), 4)


@pytest.mark.parametrize(
    "code",
    [
        "Y = torch.tensor([[1.0, 2.0], [3.0]])",  # ragged: torch raises
        "Y = torch.tensor([])",  # no number: no dtype to tell
        "Y = torch.tensor([x for x in range(3)])",
        "rows = [[1.0, 2.0]]\nrows.append([3.0, 4.0])\nY = torch.tensor(rows)",  # grown
        "rows = [[1.0, 2.0]]\nrows[0] = [3.0, 4.0, 5.0]\nY = torch.tensor(rows)",  # changed in place
        "Y = torch.tensor(load())",
    ],
)
def test_data_that_is_not_written_out_or_may_change_is_unsized(code):
    ctx = context(f"import torch\n{code}\n")
    assert sizes_of(ctx).tensor(last_value(ctx)) is None


# appendix A of rasbt/LLMs-from-scratch, cut down: a toy dataset written out in the script, a
# Dataset class of the file indexing it, and an evaluation of every batch read with `.item()`.
TOY = """\
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class ToyDataset(Dataset):
    def __init__(self, X, y):
        self.features = X
        self.labels = y

    def __getitem__(self, index):
        return self.features[index], self.labels[index]

    def __len__(self):
        return self.labels.shape[0]


X_train = torch.tensor([[-1.2, 3.1], [-0.9, 2.9], [-0.5, 2.6], [2.3, -1.1], [2.7, -1.5]])
y_train = torch.tensor([0, 0, 0, 1, 1])
loader = DataLoader(ToyDataset(X_train, y_train), batch_size=2, shuffle=True)
device = torch.device("cuda")
model = torch.nn.Sequential(torch.nn.Linear(2, 30), torch.nn.ReLU(), torch.nn.Linear(30, 2)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
for epoch in range(3):
    for features, labels in loader:
        features = features.to(device)
        labels = labels.to(device)
        loss = F.cross_entropy(model(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.2f}")
"""


def test_the_batches_of_a_dataset_written_out_in_the_script_are_sized():
    ctx = context(TOY)
    (feed,) = ctx.loaders.feeds
    (loader,) = ctx.loaders.sources(feed.loader, (), 0)
    assert sizes_of(ctx).loader_batch_bytes(loader) == 2 * (2 * 4 + 8)  # two rows of 2 floats, two labels


def test_pinning_and_prefetching_batches_of_a_toy_dataset_written_out_are_reported_with_their_size():
    result = findings(TOY, "PM102", "PM103")
    assert sorted((f.code, f.fixable) for f in result.findings) == [("PM102", False), ("PM103", False)]
    assert all("a batch holds about 32 bytes" in f.message for f in result.findings)
    assert result.new_source == TOY.encode()


def test_the_same_loop_over_data_read_from_a_file_is_still_fixed():
    code = TOY.replace(
        "X_train = torch.tensor([[-1.2, 3.1], [-0.9, 2.9], [-0.5, 2.6], [2.3, -1.1], [2.7, -1.5]])",
        'X_train = torch.tensor(json.load(open("features.json")))',
    ).replace("import torch\n", "import json\n\nimport torch\n", 1)
    result = findings(code, "PM102", "PM103")
    assert [(f.code, f.fixable) for f in result.findings if f.code == "PM102"] == [("PM102", True)]


# -- a dim read from a tensor of known shape ----------------------------------------------------

SHAPED = "import torch\nX = torch.randn(100, 1, 28, 28)\n"


@pytest.mark.parametrize(
    "expr,value",
    [("X.size(0)", 100), ("X.shape[-1]", 28), ("X.size()[1]", 1), ("len(X)", 100), ("X.size(0) * 2", 200)],
)
def test_a_dim_of_a_tensor_of_known_shape_is_a_known_integer(expr, value):
    ctx = context(SHAPED + f"Y = {expr}\n")
    assert sizes_of(ctx).integer(last_value(ctx)) == value


@pytest.mark.parametrize("expr", ["X.size(d)", "X.shape[4]", "Z.size(0)", "X.size(dim=0)"])
def test_a_dim_that_cannot_be_told_is_unknown(expr):
    ctx = context(SHAPED + f"Y = {expr}\n")
    assert sizes_of(ctx).integer(last_value(ctx)) is None


def test_a_batch_flattened_by_its_own_first_dim_keeps_its_shape():
    ctx = context(SHAPED + "Y = X.view(X.size(0), -1)\n")
    assert sizes_of(ctx).tensor(last_value(ctx)) == ((100, 784), 4)


# A small MLP whose step flattens the batch it draws with `x.view(x.size(0), -1)`.
FLATTENED = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda")
model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
for step in range(1000):
    x = torch.randn(64, 16, 16, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    loss = F.cross_entropy(model(x.view(SIZE, -1)), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_tf32_for_a_launch_bound_step_flattening_its_batch_by_its_own_size_is_reported():
    (finding,) = findings(FLATTENED.replace("SIZE", "x.size(0)"), "PM302").findings
    assert not finding.fixable
    assert "each runs over the 64 rows of the step's batch" in finding.message


def test_tf32_for_the_same_step_flattening_by_an_unknown_size_is_still_fixed():
    code = FLATTENED.replace("SIZE", "n").replace("for step", "n = int(input())\nfor step")
    (finding,) = findings(code, "PM302").findings
    assert finding.fixable


# -- images padded before a crop ------------------------------------------------------------------

CIFAR = """\
import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as transforms

device = torch.device("cuda")
transform = transforms.Compose([transforms.Pad(PADDING), transforms.RandomHorizontalFlip(), LAST transforms.ToTensor()])
train_dataset = torchvision.datasets.CIFAR10(root="data", train=True, transform=transform, download=True)
train_loader = torch.utils.data.DataLoader(dataset=train_dataset, batch_size=100, shuffle=True, pin_memory=True)
"""


@pytest.mark.parametrize(
    "padding,last,image",
    [
        ("4", "transforms.RandomCrop(32),", (3, 32, 32)),
        ("4", "", (3, 40, 40)),
        ("(1, 2)", "", (3, 36, 34)),  # (left and right, top and bottom)
        ("[1, 2, 3, 4]", "", (3, 38, 36)),  # (left, top, right, bottom)
    ],
)
def test_a_padded_image_is_sized_after_its_padding_and_crop(padding, last, image):
    ctx = context(CIFAR.replace("PADDING", padding).replace("LAST", last))
    dataset = ctx.module.body[-2].body[0].value
    assert sizes_of(ctx).item_tensors(dataset) == (((0,), (image, 4)), ((1,), ((), 8)))


def test_padding_that_cannot_be_told_leaves_the_image_unsized():
    ctx = context(
        CIFAR.replace("PADDING", "pad").replace("LAST", "").replace("device =", "pad = int(input())\ndevice =")
    )
    assert sizes_of(ctx).item_tensors(ctx.module.body[-2].body[0].value) is None


# yunjey/pytorch-tutorial's deep residual network, cut down: CIFAR-10 padded and cropped back to
# 32 x 32, batches of 100 (1.2 MB) copied in the step.
PADDED_STEP = (
    CIFAR.replace("PADDING", "4").replace("LAST", "transforms.RandomCrop(32),")
    + """model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 30 * 30, 10)).to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
for epoch in range(5):
    for images, labels in train_loader:
        images = images.to(device)
        labels = labels.to(device)
        loss = criterion(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""
)


def test_prefetching_padded_and_cropped_cifar_batches_is_reported_with_their_size():
    (finding,) = findings(PADDED_STEP, "PM103").findings
    assert not finding.fixable
    assert "a batch holds about 1.2 MB" in finding.message


# -- a model of another module of the project, sized by what its construction passes ------------

# rasbt/LLMs-from-scratch's GPTModel, cut down: a model class of another module whose widths come
# from a config dict the training script passes it, through a block class of that module.
MODEL_MODULE = """\
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ff = nn.Linear(cfg["emb_dim"], 4 * cfg["emb_dim"])
        self.drop = nn.Dropout(cfg["drop_rate"])

    def forward(self, x):
        return self.drop(self.ff(x))


class Net(nn.Module):
    def __init__(self, cfg, head=10):
        super().__init__()
        self.emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg["n_layers"])])
        self.head = nn.Linear(4 * cfg["emb_dim"], head)

    def forward(self, x):
        return self.head(self.blocks(self.emb(x)))
"""
TRAIN = """\
from model import Net

CFG = {"vocab_size": 100, "emb_dim": 16, "n_layers": 2, "drop_rate": 0.1}
CHANGE
net = Net(CFG, HEAD)
"""


def project_model(tmp_path, change: str = "", head: str = "head=5") -> ModuleSize | None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "model.py").write_text(MODEL_MODULE)
    code = TRAIN.replace("CHANGE", change).replace("HEAD", head)
    ctx = FileContext.of_source(code, str(tmp_path / "train.py"), Settings(root=tmp_path))
    return sizes_of(ctx).module(ctx.module.body[-1].body[0].targets[0].target)


def test_a_model_of_another_module_is_sized_by_the_config_dict_its_construction_passes(tmp_path):
    blocks = 2 * (16 * 64 + 64)
    assert project_model(tmp_path) == ModuleSize(
        100 * 16 + blocks + 64 * 5 + 5, 100 * 16 + blocks + 64 * 5 + 5, ((16, 64), (16, 64), (64, 5))
    )  # each of the two blocks makes its product
    # a parameter the construction does not pass holds its default
    assert project_model(tmp_path, head="").products == ((16, 64), (16, 64), (64, 10))


@pytest.mark.parametrize(
    "change,head",
    [
        ('CFG.update({"emb_dim": 1024})', "head=5"),  # the dict may be changed
        ('CFG["n_layers"] = 48', "head=5"),
        ("", "head=int(input())"),  # an argument that cannot be told
        ("", "**{'head': 5}"),
    ],
)
def test_a_model_of_another_module_whose_arguments_cannot_be_told_is_unsized(tmp_path, change, head):
    assert project_model(tmp_path, change, head) is None


# -- windows of token ids appended to a list --------------------------------------------------

# rasbt/LLMs-from-scratch's GPTDatasetV1 and create_dataloader_v1, cut down: windows of a text's
# token ids appended to lists, a loader built by a function of the file with the batch size and
# window length its call passes, and a loop that reads the loss every step.
WINDOWS = """\
import tiktoken
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class GPTDatasetV1(Dataset):
    def __init__(self, txt, tokenizer, max_length, stride):
        self.input_ids = []
        self.target_ids = []
        token_ids = tokenizer.encode(txt)
        for i in range(0, len(token_ids) - max_length, stride):
            input_chunk = token_ids[i:i + max_length]
            target_chunk = token_ids[i + 1: i + max_length + 1]
            self.input_ids.append(torch.tensor(input_chunk))
            self.target_ids.append(torch.tensor(target_chunk))
GROWN
    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, idx):
        return self.input_ids[idx], self.target_ids[idx]


def create_dataloader_v1(txt, batch_size=4, max_length=256, stride=128):
    tokenizer = tiktoken.get_encoding("gpt2")
    dataset = GPTDatasetV1(txt, tokenizer, max_length, stride)
    return DataLoader(dataset, batch_size=batch_size, shuffle=TruePINNED)


device = torch.device("cuda")
text = open("the-verdict.txt").read()
train_loader = create_dataloader_v1(text, batch_size=2, max_length=256, stride=256)
model = nn.Sequential(nn.Embedding(50257, 64), nn.Linear(64, 50257)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4)
for epoch in range(10):
    for input_batch, target_batch in train_loader:
        input_batch = input_batch.to(device)
        target_batch = target_batch.to(device)
        loss = F.cross_entropy(model(input_batch).flatten(0, 1), target_batch.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.3f}")
"""


def windows(grown: str = "", pinned: str = "") -> str:
    return WINDOWS.replace("GROWN", grown).replace("PINNED", pinned)


def window_batch(code: str):
    ctx = context(code)
    (loader,) = (c for c in ctx.index.find(cst.Call) if ctx.names.is_(c.func, "torch.utils.data.DataLoader"))
    return sizes_of(ctx).loader_batch(loader)


def test_windows_of_token_ids_appended_to_a_list_are_sized_by_the_window_length_passed():
    # two windows of at most 256 int64 ids each, two to a batch
    assert window_batch(windows()) == (((0,), ((2, 256), 8)), ((1,), ((2, 256), 8)))


@pytest.mark.parametrize(
    "grown",
    [
        "\n    def more(self, ids):\n        self.input_ids.extend(ids)\n",  # another way in
        "\n    def swap(self, k, ids):\n        self.input_ids[k] = ids\n",  # an item replaced
    ],
)
def test_a_list_that_grows_otherwise_than_by_append_is_unsized(grown):
    assert window_batch(windows(grown)) is None


@pytest.mark.parametrize(
    "chunk",
    [
        "token_ids[i:j]",  # a window whose width is not shown
        "token_ids[i:i + int(input())]",
        "tokenizer.encode_batch([txt])[0][i:i + max_length]",  # a list of lists
        "txt.split()[i:i + max_length]",  # strings, not ids
    ],
)
def test_a_window_of_unknown_width_or_of_what_is_not_ids_is_unsized(chunk):
    code = (
        windows()
        .replace("token_ids[i:i + max_length]", chunk)
        .replace("for i in range", "j = 9\n        for i in range")
    )
    assert window_batch(code) is None


def test_pinning_and_prefetching_windows_of_token_ids_read_back_every_step_are_reported_with_their_size():
    result = findings(windows(), "PM102")
    assert [(f.code, f.fixable) for f in result.findings] == [("PM102", False)]
    assert "a batch holds about 8192 bytes" in result.findings[0].message
    (prefetch,) = findings(windows(pinned=", pin_memory=True"), "PM103").findings
    assert not prefetch.fixable and "a batch holds about 8192 bytes" in prefetch.message


# -- what a Sequential of Linear layers returns ----------------------------------------------------

SEQUENTIAL = """\
import torch
import torch.nn as nn

G = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.Tanh())
z = torch.randn(100, 64)
Y = LAYERS(z)
"""


@pytest.mark.parametrize(
    "layers,shape",
    [
        ("G", (100, 256)),
        ("nn.Sequential(nn.Linear(64, 8), nn.Dropout(0.1), nn.LayerNorm(8))", (100, 8)),
        ("nn.Sequential()", (100, 64)),
    ],
)
def test_a_sequential_of_linear_layers_returns_its_input_with_the_last_width(layers, shape):
    ctx = context(SEQUENTIAL.replace("LAYERS", layers))
    assert sizes_of(ctx).tensor(last_value(ctx)) == (shape, 4)


@pytest.mark.parametrize(
    "layers",
    [
        "nn.Sequential(nn.Linear(32, 8))",  # not the width it is given
        "nn.Sequential(nn.Flatten(), nn.Linear(64, 8))",  # a layer that reshapes
        "nn.Sequential(nn.Conv1d(64, 8, 3))",
        "nn.Linear(64, 8)",  # a layer alone is not followed here
    ],
)
def test_a_sequential_whose_output_the_code_does_not_show_is_unsized(layers):
    ctx = context(SEQUENTIAL.replace("LAYERS", layers))
    assert sizes_of(ctx).tensor(last_value(ctx)) is None


# A GAN's step, cut down from yunjey/pytorch-tutorial: the discriminator runs on what the
# generator makes, 64 rows 256 wide.
GAN = """\
import torch
import torch.nn as nn

device = torch.device("cuda")
D = nn.Sequential(nn.Linear(256, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1), nn.Sigmoid()).to(device)
G = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.Tanh()).to(device)
criterion = nn.BCELoss()
g_optimizer = torch.optim.Adam(G.parameters(), lr=0.0002)
for step in range(1000):
    z = torch.randn(64, 256, device=device)
    fake = G(z)
    loss = criterion(D(fake), torch.ones(64, 1, device=device))
    g_optimizer.zero_grad()
    loss.backward()
    g_optimizer.step()
"""


def test_tf32_for_a_launch_bound_step_whose_model_runs_on_another_models_output_is_reported():
    (finding,) = findings(GAN, "PM302").findings
    assert not finding.fixable
    assert "each runs over the 64 rows of the step's batch" in finding.message


# -- a config dict of the file --------------------------------------------------------------------

LOCAL_CONFIG = """\
import torch.nn as nn

CFG = {"model": {"emb_dim": 16, "n_layers": 2}, "vocab_size": 50}
CHANGE


class Net(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.emb = nn.Embedding(cfg["vocab_size"], cfg["model"]["emb_dim"])
        self.blocks = nn.Sequential(*[nn.Linear(cfg["model"]["emb_dim"], 16) for _ in range(cfg["model"]["n_layers"])])


net = Net(CFG)
"""


def local_config_model(change: str) -> ModuleSize | None:
    ctx = context(LOCAL_CONFIG.replace("CHANGE", change))
    return sizes_of(ctx).module(ctx.module.body[-1].body[0].targets[0].target)


def test_a_nested_config_dict_of_the_file_sizes_the_model_built_with_it():
    assert local_config_model("") == ModuleSize(
        50 * 16 + 2 * (16 * 16 + 16), 50 * 16 + 2 * (16 * 16 + 16), ((16, 16), (16, 16))
    )


@pytest.mark.parametrize(
    "change", ['CFG.update({"vocab_size": 50257})', 'CFG["vocab_size"] = 50257', 'CFG["model"].update(emb_dim=768)']
)
def test_a_config_dict_changed_in_place_leaves_the_model_unsized(change):
    assert local_config_model(change) is None


def test_autocast_for_a_narrow_model_of_another_module_is_reported_with_its_widths(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "nets.py").write_text(
        "import torch.nn as nn\n\n\nclass Bag(nn.Module):\n    def __init__(self, vocab, width):\n"
        "        super().__init__()\n        self.embed = nn.Embedding(vocab, width)\n"
        "        self.out = nn.Linear(width, vocab)\n\n    def forward(self, x):\n"
        "        return self.out(self.embed(x).relu())\n"
    )
    code = (
        "import torch\nimport torch.nn.functional as F\nfrom nets import Bag\n\n"
        'device = torch.device("cuda")\nmodel = Bag(16, 8).to(device)\n'
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor step in range(100):\n"
        "    x = torch.randint(0, 16, (4, 6), device=device)\n"
        "    loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    path = tmp_path / "train.py"
    path.write_text(code)
    settings = Settings(select=("PM301",), level=Level.NUMERIC)
    (finding,) = process_source(code.encode(), str(path), settings).findings
    assert not finding.fixable
    assert "the widest, 8 by 16, does 2.7 flops per byte" in finding.message

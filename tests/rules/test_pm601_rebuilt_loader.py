"""PM601 and a loader made anew on each pass of a loop around the training loop (one per
file of a folder, rasbt/LLMs-from-scratch's Gutenberg pretraining): refused, naming
the line that builds it."""

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level

SOURCE = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_loaders(text):
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    return DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=8)


def main(files):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(8, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for path in files:
            train_loader, val_loader = make_loaders(path)
            for x, y in train_loader:
                loss = F.cross_entropy(model(x.to(device)), y.to(device))
                opt.zero_grad()
                loss.backward()
                opt.step()
"""


def test_a_loader_built_on_each_pass_of_an_outer_loop_is_named_in_the_refusal():
    result = process_source(SOURCE.encode(), "train.py", Settings(select=("PM601",), level=Level.UNSAFE))
    (finding,) = [f for f in result.findings if f.code == "PM601"]
    assert not finding.applied
    built = SOURCE.splitlines().index("            train_loader, val_loader = make_loaders(path)") + 1
    assert f"come from what line {built} builds anew on each pass of the loop around it" in finding.message


def test_a_progress_bar_wrapped_around_the_loader_each_epoch_is_not_a_new_loader():
    source = SOURCE.replace(
        "        for path in files:\n            train_loader, val_loader = make_loaders(path)\n"
        "            for x, y in train_loader:\n",
        "        for path in files:\n            bar = tqdm(loader)\n            for x, y in bar:\n",
    ).replace(
        "    for epoch in range(2):\n",
        "    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))))\n    for epoch in range(2):\n",
    )
    source = "from tqdm import tqdm\n" + source
    result = process_source(source.encode(), "train.py", Settings(select=("PM601",), level=Level.UNSAFE))
    assert all("builds anew" not in f.message for f in result.findings), [f.message for f in result.findings]


GRID = """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from loaders import make_loader


def train(model, loader, opt, device):
    for epoch in range(2):
        for x, y in loader:
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for batch_size in (8, 16):
        train_loader = make_loader(batch_size=batch_size)
        model = nn.Linear(8, 2).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        train(model, train_loader, opt, device)
"""


def test_a_loader_built_per_grid_point_and_handed_to_the_training_function_is_named_in_the_refusal():
    """A hyperparameter search builds a loader per grid point (by a function of a library)
    and passes it to the function that trains: the refusal names the line that builds it,
    not "use a DataLoader"."""
    result = process_source(GRID.encode(), "train.py", Settings(select=("PM601",), level=Level.UNSAFE))
    (finding,) = [f for f in result.findings if f.code == "PM601"]
    assert not finding.applied
    built = GRID.splitlines().index("        train_loader = make_loader(batch_size=batch_size)") + 1
    assert f"come from what line {built} builds anew on each pass of the loop around it" in finding.message
    assert "use a DataLoader" not in finding.message

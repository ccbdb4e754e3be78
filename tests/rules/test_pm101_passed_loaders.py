"""PM101 on the batches of a loader handed in as a parameter: one module builds the loader
pinned, a second gets it and passes it to the training function of a third, whose loop
copies `next(it)` of a generator over it. The copy is fixed when every caller in the
package passes a pinned loader, and left alone when one passes an unpinned loader or
hands the function on where perfmod cannot follow. The rewritten module trains the same
on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.package_support import check_unsafe, run_main, write_package

DATA = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def create_data_loader(n, batch_size):
    ds = TensorDataset(torch.randn(n, 4), torch.randn(n, 1))
    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, pin_memory={pin})
    return loader, "tokenizer"


def loop_dataloader(dl):
    while True:
        for batch in dl:
            yield batch
"""

RUN = """\
import torch
from torch.utils.data import DataLoader

from {package}.data import loop_dataloader


def optimize(model, device, train_loader: DataLoader, steps: int):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_iterator = loop_dataloader(train_loader)
    losses = []
    for step in range(steps):
        x, y = next(train_iterator)
        x = x.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses)
"""

MAIN = """\
import torch

from {package} import run
from {package}.data import create_data_loader


def main(steps=6):
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(4, 1).to(device)
    train_loader, _tokenizer = create_data_loader(48, 8)
    {handed}
    return run.optimize(model, device, train_loader=train_loader, steps=steps)
"""

PINNED = "torch.cuda.is_available()"


def _package(tmp_path: Path, pin: str = PINNED, handed: str = "") -> Path:
    return write_package(
        tmp_path,
        "spdlike",
        {"data.py": DATA.replace("{pin}", pin), "run.py": RUN, "main.py": MAIN.replace("{handed}", handed)},
    )


def test_copy_of_a_loader_every_caller_builds_pinned_is_fixed_and_trains_the_same(tmp_path):
    folder = _package(tmp_path)
    before = run_main(tmp_path, "spdlike.main")
    result = check_unsafe(folder / "run.py", "PM101")
    assert [(f.code, f.line) for f in result.findings] == [("PM101", 13), ("PM101", 14)]
    rewritten = result.new_source.decode()
    assert "x = x.to(device, non_blocking=True)" in rewritten
    assert "y.to(device, non_blocking=True)" in rewritten
    (folder / "run.py").write_text(rewritten)
    after = run_main(tmp_path, "spdlike.main")
    assert before.tolist() == after.tolist()


@pytest.mark.parametrize(
    ("pin", "handed"),
    [
        ("False", ""),  # a caller's loader is not pinned
        (PINNED, 'steps_by_name = {"optimize": run.optimize}'),  # handed on: called where perfmod cannot see
    ],
    ids=["unpinned", "handed-on"],
)
def test_copy_is_left_alone_unless_every_caller_is_seen_to_pass_a_pinned_loader(tmp_path, pin, handed):
    folder = _package(tmp_path, pin, handed)
    assert check_unsafe(folder / "run.py", "PM101").findings == []


def test_a_second_caller_with_a_loader_of_unknown_memory_keeps_the_copy_as_it_is(tmp_path):
    folder = _package(tmp_path)
    (folder / "other.py").write_text(
        "from spdlike.run import optimize\n\n\ndef again(model, loader, device):\n"
        "    return optimize(model, device, train_loader=loader, steps=2)\n"
    )
    assert check_unsafe(folder / "run.py", "PM101").findings == []


# run.py's own entry point hands the loader on to `optimize` (spd's `run_experiment`).
EXPERIMENT = """

def run_experiment(model, device, train_loader, steps):
    return optimize(model, device, train_loader=train_loader, steps=steps)
"""

UNPINNED_CALLER = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

from spdlike.run import optimize


def again(model, device):
    plain = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
    return optimize(model, device, train_loader=plain, steps=2)
"""


@pytest.mark.parametrize(
    ("other", "fixed"), [(None, True), (UNPINNED_CALLER, False)], ids=["one-caller", "unpinned-too"]
)
def test_a_loader_handed_on_inside_the_module_is_followed_to_the_callers_of_its_entry_point(tmp_path, other, fixed):
    folder = _package(tmp_path)
    (folder / "run.py").write_text((folder / "run.py").read_text() + EXPERIMENT)
    main = (folder / "main.py").read_text()
    (folder / "main.py").write_text(main.replace("run.optimize(", "run.run_experiment("))
    if other is not None:
        (folder / "other.py").write_text(other)
    before = run_main(tmp_path, "spdlike.main")
    result = check_unsafe(folder / "run.py", "PM101")
    assert [f.line for f in result.findings] == ([13, 14] if fixed else [])
    (folder / "run.py").write_text(result.new_source.decode())
    assert run_main(tmp_path, "spdlike.main").tolist() == before.tolist()

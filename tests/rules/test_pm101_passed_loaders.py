"""PM101 on the batches of a loader handed in as a parameter: `data.py` builds the loader
in a function it also calls itself, `main.py` gets it and passes it to the training
function of `run.py`, whose loop copies `next(it)` of a generator over it. The copy is
fixed when a caller in the package passes a loader built pinned, naming it (and the
callers whose loaders do not pin, for which the copy stays synchronous); it is left
alone when no caller's loader pins, or when the function is handed on where perfmod
cannot follow. The rewritten module trains the same on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.package_support import check_unsafe, run_main, write_package

DATA = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    def __init__(self, n):
        self.rows = torch.randn(n, 4)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def create_data_loader(n, batch_size):
    loader = DataLoader(Rows(n), batch_size=batch_size, shuffle=True, pin_memory={pin})
    return loader, "tokenizer"


def small_loader():
    loader, _ = create_data_loader(16, 4)
    return loader


def batch_tensor(batch) -> torch.Tensor:
    return batch[0] if isinstance(batch, (list, tuple)) else batch


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
        x = next(train_iterator).to(device)
        loss = model(x).pow(2).mean()
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

# A second caller, with a loader that does not pin its batches.
UNPINNED_CALLER = """\
import torch
from torch.utils.data import DataLoader, Dataset

from spdlike.run import optimize


class Ones(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.ones(4) * i


def again(model, device):
    plain = DataLoader(Ones(), batch_size=4)
    return optimize(model, device, train_loader=plain, steps=2)


def main():
    torch.manual_seed(0)
    return again(torch.nn.Linear(4, 1), torch.device("cpu"))
"""
OTHER_CALL = "spdlike/other.py:17"

PINNED = "torch.cuda.is_available()"
COPY = "x = next(train_iterator).to(device)"
FIXED = "x = next(train_iterator).to(device, non_blocking=True)"


def _package(tmp_path: Path, pin: str = PINNED, handed: str = "") -> Path:
    return write_package(
        tmp_path,
        "spdlike",
        {"data.py": DATA.replace("{pin}", pin), "run.py": RUN, "main.py": MAIN.replace("{handed}", handed)},
    )


def _trains_the_same(tmp_path: Path, folder: Path, rewritten: str, *entries: str) -> None:
    """Each entry module's `main()` gives the same losses with `rewritten` as run.py."""
    entries = entries or ("spdlike.main",)
    before = [run_main(tmp_path, entry).tolist() for entry in entries]
    (folder / "run.py").write_text(rewritten)
    assert [run_main(tmp_path, entry).tolist() for entry in entries] == before


def test_copy_of_a_loader_the_one_caller_builds_pinned_is_fixed_and_trains_the_same(tmp_path):
    folder = _package(tmp_path)
    result = check_unsafe(folder / "run.py", "PM101")
    assert [(f.code, f.line) for f in result.findings] == [("PM101", 12)]
    assert result.findings[0].message == "host-to-device copy blocks the CPU; pass non_blocking=True"
    rewritten = result.new_source.decode()
    assert FIXED in rewritten
    _trains_the_same(tmp_path, folder, rewritten)


def test_a_second_caller_with_an_unpinned_loader_keeps_the_fix_and_is_named(tmp_path):
    folder = _package(tmp_path)
    (folder / "other.py").write_text(UNPINNED_CALLER)
    result = check_unsafe(folder / "run.py", "PM101")
    assert [f.line for f in result.findings] == [12]
    assert result.findings[0].message == (
        "host-to-device copy blocks the CPU; pass non_blocking=True: the batches of the loader passed at "
        "spdlike/main.py:13 are pinned; for those of the loader passed at spdlike/other.py:17, not seen to "
        "be pinned, the copy stays synchronous"
    )
    rewritten = result.new_source.decode()
    assert FIXED in rewritten
    _trains_the_same(tmp_path, folder, rewritten, "spdlike.main", "spdlike.other")


@pytest.mark.parametrize(
    ("pin", "handed", "other"),
    [
        ("False", "", None),  # the one caller's loader does not pin
        ("False", "", UNPINNED_CALLER),  # nor does the second's
        (PINNED, 'steps_by_name = {"optimize": run.optimize}', None),  # handed on: called where perfmod cannot see
    ],
    ids=["unpinned", "both-unpinned", "handed-on"],
)
def test_copy_is_left_alone_unless_a_caller_is_seen_to_pass_a_pinned_loader(tmp_path, pin, handed, other):
    folder = _package(tmp_path, pin, handed)
    if other is not None:
        (folder / "other.py").write_text(other)
    result = check_unsafe(folder / "run.py", "PM101")
    assert result.findings == []
    assert COPY in result.new_source.decode()


def test_a_caller_whose_loader_cannot_be_told_is_taken_at_the_parameters_annotation(tmp_path):
    """`again` hands on a loader of its own caller, which perfmod cannot see: by the
    annotation of `train_loader` it is a DataLoader, of batches in unknown memory (and of
    unknown structure: the loop takes the tensor out of each batch, as spd's
    `extract_batch_data` does)."""
    folder = _package(tmp_path)
    run = (folder / "run.py").read_text()
    run = run.replace("import loop_dataloader", "import batch_tensor, loop_dataloader")
    (folder / "run.py").write_text(run.replace(COPY, "x = batch_tensor(next(train_iterator)).to(device)"))
    (folder / "other.py").write_text(
        "from spdlike.run import optimize\n\n\ndef again(model, loader, device):\n"
        "    return optimize(model, device, train_loader=loader, steps=2)\n"
    )
    result = check_unsafe(folder / "run.py", "PM101")
    assert [f.line for f in result.findings] == [12]
    assert "passed at spdlike/other.py:5, not seen to be pinned" in result.findings[0].message
    _trains_the_same(tmp_path, folder, result.new_source.decode())


# run.py's own entry point hands the loader on to `optimize` (spd's `run_experiment`).
EXPERIMENT = """

def run_experiment(model, device, train_loader, steps):
    return optimize(model, device, train_loader=train_loader, steps=steps)
"""


@pytest.mark.parametrize("other", [None, UNPINNED_CALLER.replace("optimize", "run_experiment")], ids=["one", "two"])
def test_a_loader_handed_on_inside_the_module_is_followed_to_the_callers_of_its_entry_point(tmp_path, other):
    folder = _package(tmp_path)
    (folder / "run.py").write_text((folder / "run.py").read_text() + EXPERIMENT)
    main = (folder / "main.py").read_text()
    (folder / "main.py").write_text(main.replace("run.optimize(", "run.run_experiment("))
    if other is not None:
        (folder / "other.py").write_text(other)
    result = check_unsafe(folder / "run.py", "PM101")
    assert [f.line for f in result.findings] == [12]
    assert (OTHER_CALL in result.findings[0].message) is (other is not None)
    entries = ("spdlike.main",) if other is None else ("spdlike.main", "spdlike.other")
    _trains_the_same(tmp_path, folder, result.new_source.decode(), *entries)

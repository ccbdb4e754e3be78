"""PM102 on a DataLoader that a function of one module builds and returns to the other
modules of its package: pinned where it is built when a caller copies its batches to the
GPU (in its loop, through a generator that yields them, or in a function of a third module
it hands the loader to), reported there when another caller keeps them on the host, and
said nothing of in the files that call it. The rewritten module runs on the CPU and gives
the same batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.result import Level
from tests.package_support import check_unsafe, run_main, write_package

DATA = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_loader(n, batch_size):
    ds = TensorDataset(torch.randn(n, 4), torch.randn(n, 1))
    dl = DataLoader(ds, batch_size=batch_size, shuffle=True)
    return dl


def loop_dataloader(dl):
    while True:
        for batch in dl:
            yield batch
"""

# The step loop copies the batches to a device that may be CUDA.
STEPS = """\
    model = torch.nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for step in range(steps):
        x, y = {batch}
        x, y = x.to(device), y.to(device)
        seen.append(x.clone())
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return seen
"""

IN_LOOP = """\
import torch

from {package}.data import make_loader


def main(steps=6):
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = make_loader(48, 8)
    batches = iter(loader)
""" + STEPS.replace("{batch}", "next(batches)")

THROUGH_GENERATOR = """\
import torch

from {package}.data import loop_dataloader, make_loader


def main(steps=10):
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_iterator = loop_dataloader(make_loader(48, 8))
""" + STEPS.replace("{batch}", "next(train_iterator)")

# spd's chain: data.py builds it, main.py gets it and hands it to run.py's `optimize`.
RUN = """\
import torch

from {package}.data import loop_dataloader


def optimize(train_loader, device, steps):
    train_iterator = loop_dataloader(train_loader)
""" + STEPS.replace("{batch}", "next(train_iterator)")

THROUGH_A_THIRD_MODULE = """\
import torch

from {package}.data import make_loader
from {package}.run import optimize


def main(steps=10):
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader = make_loader(48, 8)
    return optimize(train_loader=train_loader, device=device, steps=steps)
"""

# A caller whose use of the batches perfmod cannot follow: it does not keep the loader unpinned.
PEEK = """\
from {package}.data import make_loader


def first_batch():
    return next(iter(make_loader(16, 4)))
"""

# A caller that reads the batches on the host: pinning would only cost it a copy.
STATS = """\
from {package}.data import make_loader


def mean_label():
    total = 0.0
    for x, y in make_loader(16, 4):
        total += float(y.sum())
    return total
"""


@pytest.mark.parametrize(
    "form, files, copier",
    [
        ("in_loop", {"main.py": IN_LOOP}, "`{package}.main.main` ({package}/main.py:{line})"),
        ("generator", {"main.py": THROUGH_GENERATOR}, "`{package}.main.main` ({package}/main.py:{line})"),
        (
            "third_module",
            {"main.py": THROUGH_A_THIRD_MODULE, "run.py": RUN},
            "`optimize` ({package}/run.py:{line}, reached through `{package}.main.main`)",
        ),
    ],
)
def test_a_returned_loader_is_pinned_where_it_is_built_and_gives_the_same_batches(tmp_path, form, files, copier):
    package = f"pinned_{form}"
    folder = write_package(tmp_path, package, {"data.py": DATA, **files, "peek.py": PEEK})
    data = folder / "data.py"
    result = check_unsafe(data, "PM102")
    (found,) = result.findings
    assert found.applied
    copying = folder / ("run.py" if "run.py" in files else "main.py")
    line = _line_of(copying, "x, y = x.to(device), y.to(device)")
    assert f"copied to the GPU from pageable memory by {copier.format(package=package, line=line)}" in found.message
    assert f"returned on line 8 to {package}/main.py:{_line_of(folder / 'main.py', 'make_loader(48')}," in found.message
    new = result.new_source.decode()
    # the device is chosen when the script runs: pinned only where a GPU is
    assert "(\n        ds, batch_size=batch_size, shuffle=True, pin_memory=torch.cuda.is_available()\n    )\n" in new
    assert _check_source(result.new_source, data) == []  # idempotent
    for user in folder.glob("*.py"):  # the files that use it say nothing of it
        assert user == data or check_unsafe(user, "PM102").findings == [], user
    before = run_main(tmp_path, f"{package}.main")
    data.write_bytes(result.new_source)
    after = run_main(tmp_path, f"{package}.main")
    assert len(before) >= 6 and all(a.equal(b) for a, b in zip(before, after, strict=True))


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _check_source(source: bytes, path: Path) -> list:
    return process_source(source, str(path), Settings(level=Level.UNSAFE, select=("PM102",))).findings


def test_a_loader_no_caller_copies_to_the_gpu_gets_no_finding(tmp_path):
    folder = write_package(tmp_path, "pinned_host_only", {"data.py": DATA, "stats.py": STATS, "peek.py": PEEK})
    for path in folder.glob("*.py"):
        assert check_unsafe(path, "PM102").findings == [], path


def test_a_caller_that_keeps_the_batches_on_the_host_is_the_reason_given_where_the_loader_is_built(tmp_path):
    package = "pinned_mixed"
    folder = write_package(tmp_path, package, {"data.py": DATA, "main.py": IN_LOOP, "stats.py": STATS})
    (found,) = check_unsafe(folder / "data.py", "PM102").findings
    assert not found.fixable
    assert found.message.endswith(
        f"not pinned: `{package}.stats.mean_label` ({package}/stats.py:6) takes its batches too and copies none of "
        "them to a device in its loop on line 6, where pinning would only cost a copy"
    )
    assert check_unsafe(folder / "main.py", "PM102").findings == []  # reported where it is built, not again here


GET_DEVICE = """\
import torch


def get_device():
    return "cuda" if torch.cuda.is_available() else "cpu"
"""

COPIES = """\
import torch

from {package}.data import make_loader
from {package}.devices import get_device

DEVICE = get_device()


def main():
    for x, y in make_loader(16, 4):
        tokens = x.to(torch.long)
        print(tokens.to(DEVICE).sum())
"""


def test_a_copy_to_a_device_a_project_function_names_of_a_batch_in_another_dtype_is_seen(tmp_path):
    folder = write_package(tmp_path, "pinned_devices", {"data.py": DATA, "devices.py": GET_DEVICE, "main.py": COPIES})
    main = folder / "main.py"
    context = FileContext.of_source(main.read_text(), str(main), Settings())
    (feed,) = context.loaders.feeds
    (copy,) = context.loaders.copies_to_device(feed.loop, feed.target)
    assert context.source(copy.call) == "tokens.to(DEVICE)" and copy.device.value == "DEVICE"
    assert check_unsafe(folder / "data.py", "PM102").findings[0].applied

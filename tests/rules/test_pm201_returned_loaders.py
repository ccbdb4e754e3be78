"""A DataLoader that a function of one module builds and returns, trained on by the
modules of its package that call it: fixed where it is built (PM201's workers, PM102's
pin_memory when a caller copies its batches to a device and none keeps them on the host),
and not reported again in the files that use it."""

from __future__ import annotations

from pathlib import Path

from codemod.analysis.project import project_of
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.result import Level
from tests.package_support import check_unsafe, run_main, write_package

DATA = """\
import torch
from torch.utils.data import DataLoader, Dataset


class Waves(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        t = torch.linspace(0, 1, 8)
        return torch.sin(t * (1 + i % 4)), torch.ones(1) * (i % 4)


def make_loader(batch_size, seed=0):
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(Waves(), batch_size=batch_size, shuffle=True, generator=generator)
    return loader, len(loader)
"""

TRAIN = """\
import torch

from {package}.data import make_loader


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader, _ = make_loader(8)
    losses = []
    for epoch in range(1):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


if __name__ == "__main__":
    main()
"""

# A second caller that reads the batches on the host: pinning would only cost it a copy.
STATS = """\
from .data import make_loader


def mean_label():
    loader, n = make_loader(16)
    total = 0.0
    for x, y in loader:
        total += float(y.sum())
    return total / n
"""


def test_a_returned_loader_is_fixed_where_it_is_built_and_trains_the_same(tmp_path, monkeypatch):
    package = "returned_fixed"
    folder = write_package(tmp_path, package, {"data.py": DATA, "train.py": TRAIN})
    data, train = folder / "data.py", folder / "train.py"
    result = check_unsafe(data, "PM102", "PM201")
    found = {f.code: f for f in result.findings}
    assert sorted(found) == ["PM102", "PM201"] and all(f.applied for f in found.values()), result.findings
    assert f"returned on line 17 to {package}/train.py:11, feeds the training loop of `main`" in found["PM201"].message
    assert "copied to the GPU from pageable memory by" in found["PM102"].message
    new = result.new_source.decode()
    assert "num_workers = default_num_workers()\n" in new
    assert "num_workers=num_workers," in new and "persistent_workers=num_workers > 0," in new
    assert "pin_memory=torch.cuda.is_available()," in new  # the device is a parameter: maybe the CPU
    # The file that uses the loader reports no workers for it: they are given where it is built;
    # and the shared fact says that its pin_memory is decided there too.
    assert check_unsafe(train, "PM201").findings == []
    context = FileContext.of_source(train.read_text(), str(train), Settings())
    built = context.loaders.feeds[0].loader  # the construction, as the analysis of data.py reads it
    _, factory, _ = context.loaders.external[id(built)]
    assert factory.context.loaders.pinned_where_built(built)
    assert factory.context.loaders.trained_where_built(built)
    # Idempotent, and the same losses with the workers (one, a fork of this process) as without.
    assert _check_source(result.new_source, data, "PM102", "PM201") == []
    before = run_main(tmp_path, f"{package}.train")
    data.write_bytes(result.new_source)
    monkeypatch.setenv("PERFMOD_NUM_WORKERS", "1")
    after = run_main(tmp_path, f"{package}.train")
    assert len(before) == 8 and before == after


def _check_source(source: bytes, path: Path, *codes: str) -> list:
    return process_source(source, str(path), Settings(level=Level.UNSAFE, select=codes)).findings


def test_a_caller_that_keeps_the_batches_on_the_host_leaves_the_loader_unpinned(tmp_path):
    folder = write_package(tmp_path, "returned_host", {"data.py": DATA, "train.py": TRAIN, "stats.py": STATS})
    data = folder / "data.py"
    result = check_unsafe(data, "PM102", "PM201")
    # workers still pay; pinning would cost the host caller a copy: said where the loader is built
    assert [(f.code, f.applied) for f in result.findings] == [("PM102", False), ("PM201", True)]
    assert "not pinned: `returned_host.stats.mean_label` (returned_host/stats.py:5)" in result.findings[0].message
    assert "pin_memory" not in result.new_source.decode()
    assert check_unsafe(folder / "train.py", "PM102").findings == []
    context = FileContext.of_source(data.read_text(), str(data), Settings())
    loader = context.loaders.constructions[0]
    returned = context.loaders.returned[id(loader)]
    host = returned.kept_on_host
    assert host is not None and host.call.line == 5 and host.call.path.endswith("stats.py")
    assert context.loaders.pinned_where_built(loader) and context.loaders.trained_where_built(loader)


def test_the_package_is_read_as_text_first(tmp_path):
    """Only the modules whose text names the module are parsed, at any depth of the package."""
    files = {
        "data.py": DATA,
        "deep/__init__.py": "",
        "deep/run.py": TRAIN,
        "other.py": "import torch\nx = torch.zeros(3)\n",
    }
    folder = write_package(tmp_path, "returned_deep", files)
    data = folder / "data.py"
    context = FileContext.of_source(data.read_text(), str(data), Settings())
    importers = project_of(context).package_importers()
    assert [Path(m.path).relative_to(folder).as_posix() for m in importers] == ["deep/run.py"]
    found = check_unsafe(data, "PM201").findings
    assert [f.applied for f in found] == [True] and "returned_deep/deep/run.py:11" in found[0].message


# A caller that changes the loader's dataset between epochs, as `forever` does before it
# starts the next epoch's iterator.
FOREVER = """\
def forever(dl):
    epoch = 0
    it = iter(dl)
    while True:
        try:
            yield next(it)
        except StopIteration:
            epoch += 1
            dl.dataset.set_epoch(epoch)
            it = iter(dl)
"""

LOOP = """\
import torch

from .data import make_loader
from .utils import forever


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader, steps = make_loader(8)
    batches = forever(loader)
    for step in range(steps * 3):
        x, y = next(batches)
        x, y = x.to(device), y.to(device)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
"""


def test_a_dataset_changed_between_epochs_gets_workers_that_are_not_persistent(tmp_path):
    data = DATA.replace(
        "    def __len__(self):\n", "    def set_epoch(self, epoch):\n        pass\n\n    def __len__(self):\n"
    )
    folder = write_package(tmp_path, "returned_epochs", {"data.py": data, "utils.py": FOREVER, "loop.py": LOOP})
    result = check_unsafe(folder / "data.py", "PM201")
    (found,) = result.findings
    assert found.applied and "`dl.dataset.set_epoch(epoch)` in `forever` (returned_epochs/utils.py:9)" in found.message
    new = result.new_source.decode()
    assert "num_workers=default_num_workers()" in new and "persistent_workers" not in new
    assert check_unsafe(folder / "loop.py", "PM201").findings == []


def test_scripts_beside_each_other_outside_a_package(tmp_path):
    """No package: the modules beside the file that import it by its name are its callers."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "data.py").write_text(DATA)
    (tmp_path / "train.py").write_text(TRAIN.replace("from {package}.data import", "from data import"))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "other.py").write_text(STATS.replace("from .data import", "from data import"))
    found = check_unsafe(tmp_path / "data.py", "PM102", "PM201").findings
    assert sorted((f.code, f.applied) for f in found) == [("PM102", True), ("PM201", True)]  # sub/ is not beside it
    assert "returned on line 17 to train.py:11" in next(f.message for f in found if f.code == "PM201")


def test_a_cached_answer_goes_stale_when_a_module_of_the_package_starts_importing_it(tmp_path):
    """What the package's modules do with the loader decides the fix where it is built: the
    result records every file and folder it read, so a new caller, or an edit that makes an
    existing module call it, is seen by the next run."""
    folder = write_package(tmp_path, "returned_stale", {"data.py": DATA, "other.py": "x = 1\n"})
    data = folder / "data.py"
    result = check_unsafe(data, "PM201")
    assert result.findings == []  # nothing in the package trains on it
    stamps = {Path(stamp.path) for stamp in result.dependencies}
    assert {folder, folder / "other.py"} <= stamps and data not in stamps
    assert all(stamp.fresh() for stamp in result.dependencies)
    (folder / "train.py").write_text(TRAIN.replace("{package}", "returned_stale"))
    assert not all(stamp.fresh() for stamp in result.dependencies)
    assert [f.code for f in check_unsafe(data, "PM201").findings] == ["PM201"]

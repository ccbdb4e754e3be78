"""Values followed into the project's own modules and through type annotations.

Each test writes a small multi-file project into a temporary folder (a package
with the helpers in `utils.py`, the loader factory in `data.py`, the training
loop in `train.py`) and checks what perfmod says about `train.py`, written from
the anti-patterns (a blocking copy of a batch a helper extracts, a checkpoint
written by a project wrapper, an unpinned loader a factory builds), not from
the implementation. Fixes are run on the CPU and must train the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from codemod.analysis.project import project_of
from codemod.analysis.values import Kind, Place
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.result import Level
from tests.cli_support import perfmod, process_env

UTILS = """\
import json

import torch
from torch import Tensor


def extract(batch, key: str = "x") -> Tensor:
    if isinstance(batch, dict):
        out = batch[key]
    elif isinstance(batch, (tuple, list)):
        out = batch[0]
    else:
        out = batch
    return out


def loop_forever(loader):
    it = iter(loader)
    while True:
        try:
            yield next(it)
        except StopIteration:
            it = iter(loader)


def _write_torch(obj, path):
    torch.save(obj, path)


def save_any(obj, path):
    if str(path).endswith(".json"):
        with open(path, "w") as f:
            json.dump(obj, f)
    else:
        _write_torch(obj, path)


def save_json(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f)


def to_device(batch, device):
    return batch[0].to(device)


def extract_moved(batch):
    batch[0] = batch[0].cuda()
    return batch[0]
"""

DATA = """\
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_loaders(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))
    train = DataLoader(data, batch_size=8)
    val = DataLoader(data, batch_size=8, pin_memory=True, num_workers=2)
    return train, val
"""

TRAIN = """\
import sys

import torch
from torch.utils.data import DataLoader

from .utils import extract, loop_forever
import pkg.utils as u


def optimize(model: torch.nn.Module, loader: DataLoader, device: str, steps: int) -> list:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    it = loop_forever(loader)
    losses = []
    for step in range(steps):
        x = extract(next(it)).to(device)
        y = u.extract(next(it), "y").to(device)
        loss = (model(x) - y[:, :1]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    from pkg.data import make_loaders

    torch.manual_seed(0)
    train, _ = make_loaders(64)
    model = torch.nn.Linear(4, 1)
    print(optimize(model, train, sys.argv[1] if len(sys.argv) > 1 else "cpu", 6))


if __name__ == "__main__":
    main()
"""


# The same loop over the factory's pinned loader: PM101 fixes copies of pinned memory only.
PINNED_TRAIN = TRAIN.replace("    train, _ = make_loaders(64)\n", "    _, train = make_loaders(64)  # the pinned one\n")
assert PINNED_TRAIN != TRAIN


def _project(root: Path, files: dict[str, str]) -> Path:
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    for name, text in {"pkg/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _check(path: Path, *codes: str, level: Level = Level.UNSAFE):
    settings = Settings(level=level, select=codes or ("PM",))
    return process_source(path.read_bytes(), str(path), settings)


def _lines(result, code: str) -> dict[int, list]:
    found: dict[int, list] = {}
    for finding in result.findings:
        if finding.code == code:
            found.setdefault(finding.line, []).append(finding)
    return found


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# -- blocking copies of what a project helper hands back --------------------------------


def test_copy_of_an_extracted_batch_is_made_non_blocking(tmp_path):
    root = _project(tmp_path, {"pkg/utils.py": UTILS, "pkg/data.py": DATA, "pkg/train.py": PINNED_TRAIN})
    train = root / "pkg" / "train.py"
    result = _check(train, "PM101")
    copies = _lines(result, "PM101")
    for text in ("x = extract(next(it))", "y = u.extract(next(it)"):  # relative import; `import pkg.utils as u`
        line = _line_of(train, text)
        assert [f.applied for f in copies.get(line, [])] == [True], (text, copies)
    new = result.new_source.decode()
    assert "x = extract(next(it)).to(device, non_blocking=True)" in new
    assert 'y = u.extract(next(it), "y").to(device, non_blocking=True)' in new
    again = process_source(result.new_source, str(train), Settings(level=Level.UNSAFE, select=("PM101",)))
    assert not again.findings  # idempotent


def test_rewritten_loop_trains_the_same_on_cpu(tmp_path):
    root = _project(tmp_path, {"pkg/utils.py": UTILS, "pkg/data.py": DATA, "pkg/train.py": PINNED_TRAIN})
    train = root / "pkg" / "train.py"
    before = _run(root)
    result = _check(train, "PM101")
    assert result.changed and result.error is None
    train.write_bytes(result.new_source)
    after = _run(root)
    assert len(before) == 6 and before == after


def _run(root: Path) -> list[float]:
    done = subprocess.run(
        [sys.executable, "-m", "pkg.train", "cpu"],
        cwd=root,
        env=process_env(PYTHONPATH=str(root)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "helper",
    [
        "to_device(next(it), device)",  # the helper moves the batch itself
        "extract_moved(next(it))",  # it replaces a part of its argument before returning it
    ],
)
def test_helpers_that_move_the_batch_are_not_taken_for_host_tensors(tmp_path, helper):
    loop = TRAIN.replace("x = extract(next(it)).to(device)", f"x = u.{helper}.to(device)")
    root = _project(tmp_path, {"pkg/utils.py": UTILS, "pkg/data.py": DATA, "pkg/train.py": loop})
    train = root / "pkg" / "train.py"
    result = _check(train, "PM101")
    line = _line_of(train, helper)
    assert not any(f.applied for f in _lines(result, "PM101").get(line, []))


def test_a_module_that_does_not_parse_is_unknown(tmp_path):
    root = _project(tmp_path, {"pkg/utils.py": UTILS + "def broken(:\n", "pkg/data.py": DATA, "pkg/train.py": TRAIN})
    train = root / "pkg" / "train.py"
    result = _check(train)
    assert result.error is None
    assert not any(f.applied for f in _lines(result, "PM101").get(_line_of(train, "x = extract("), []))


def test_a_file_without_project_imports_reads_no_other_file(tmp_path):
    solo = "import torch\nx = torch.randn(3, pin_memory=True).cuda()\n"
    root = _project(tmp_path, {"pkg/utils.py": UTILS, "pkg/solo.py": solo})
    result = _check(root / "pkg" / "solo.py")
    assert result.dependencies == ()
    assert [f.applied for f in result.findings if f.code == "PM101"] == [True]


# -- type annotations ------------------------------------------------------------------


ANNOTATED = """\
from typing import Optional

import torch
import torch.nn as nn
from jaxtyping import Float
from torch import Tensor
from torch.utils.data import DataLoader as DL


def f(
    loader: DL[tuple[Tensor, Tensor]] | None,
    model: nn.Module,
    dev: "torch.device",
    x: Optional[Tensor],
    y: Float[Tensor, "b d"],
    z: "Tensor | None",
    n: int,
    either: Tensor | nn.Module,
):
    return loader, model, dev, x, y, z, n, either
"""


def test_annotations_say_what_parameters_hold():
    context = FileContext.of_source(ANNOTATED)
    function = next(s for s in context.module.body if isinstance(s, cst.FunctionDef))
    returned = function.body.body[0].body[0].value.elements
    facts = [context.kinds.fact(element.value) for element in returned]
    assert [fact.kind for fact in facts] == [
        Kind.LOADER,
        Kind.MODULE,
        Kind.DEVICE,
        Kind.TENSOR,
        Kind.TENSOR,
        Kind.TENSOR,
        Kind.UNKNOWN,
        Kind.UNKNOWN,
    ]
    assert facts[0].place is Place.HOST  # a loader of unknown dataset yields host tensors
    assert facts[3].place is Place.UNKNOWN  # a tensor parameter may be anywhere


def test_a_local_class_named_like_torch_is_not_torch():
    context = FileContext.of_source("class Tensor:\n    pass\n\n\ndef f(x: 'Tensor'):\n    return x\n")
    function = context.module.body[1]
    assert context.kinds.fact(function.body.body[0].body[0].value).kind is Kind.UNKNOWN


LOADER_PARAMETER = (
    "import torch\nfrom torch.utils.data import DataLoader\n\n\n"
    "def fit(model, loader: 'DataLoader', device):\n"
    "    for x, y in loader:\n"
    "        x = x.to(device)\n"
    "        loss = model(x).sum()\n"
    "        loss.backward()\n"
)


def test_batches_of_a_loader_parameter_whose_pinning_is_not_seen_are_left_alone(tmp_path):
    path = tmp_path / "loop.py"
    path.write_text(LOADER_PARAMETER)  # host tensors, but perhaps in pageable memory: no finding
    assert _check(path, "PM101").findings == []


def test_batches_of_a_loader_parameter_every_caller_pins_are_copied_without_blocking(tmp_path):
    path = tmp_path / "loop.py"
    path.write_text(
        LOADER_PARAMETER
        + "\n\nfit(torch.nn.Linear(4, 1), DataLoader(torch.randn(8, 4), batch_size=2, pin_memory=True), 'cuda')\n"
    )
    result = _check(path, "PM101")
    assert [(f.line, f.applied) for f in result.findings] == [(7, True)]


# -- checkpoints written by a project wrapper -------------------------------------------------

SAVING = """\
import torch
from pkg.utils import save_any, save_json


def train(model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        loss = model(torch.randn(2, 4)).sum()
        loss.backward()
        opt.step()
        save_json({"step": step}, "log.json")
        save_any(model.state_dict(), f"ckpt_{step}.pt")
"""


def test_a_checkpoint_written_by_a_project_wrapper_runs_in_the_background(tmp_path):
    root = _project(tmp_path, {"pkg/utils.py": UTILS, "pkg/train.py": SAVING})
    train = root / "pkg" / "train.py"
    result = _check(train, "PM405")
    assert [(f.line, f.fixable) for f in result.findings] == [(_line_of(train, "save_any(model"), True)]
    assert "pkg/utils.py" in result.findings[0].message
    # save_any only writes files: the checkpointer runs it on a snapshot of its arguments
    assert 'checkpointer.call(save_any, model.state_dict(), f"ckpt_{step}.pt")' in result.new_source.decode()


def test_a_checkpoint_written_by_a_project_wrapper_that_logs_elsewhere_is_reported(tmp_path):
    utils = UTILS.replace("def _write_torch(obj, path):\n", "def _write_torch(obj, path):\n    wandb.log({})\n")
    root = _project(tmp_path, {"pkg/utils.py": "import wandb\n" + utils, "pkg/train.py": SAVING})
    train = root / "pkg" / "train.py"
    result = _check(train, "PM405")
    assert [(f.line, f.fixable) for f in result.findings] == [(_line_of(train, "save_any(model"), False)]
    message = result.findings[0].message
    assert "pkg/utils.py" in message and "torch.save" in message and "_write_torch" in message
    assert "`_write_torch` calls `wandb.log`" in message
    assert not result.changed


# -- loaders built by a project factory -------------------------------------------------------


def test_an_unpinned_loader_from_a_factory_is_reported_where_its_batches_are_copied(tmp_path):
    root = _project(tmp_path, {"pkg/utils.py": UTILS, "pkg/data.py": DATA, "pkg/train.py": TRAIN})
    loop = (
        "import torch\nfrom pkg.data import make_loaders\n\n\n"
        "def run(model, opt):\n"
        "    train, val = make_loaders(64)\n"
        "    for x, y in train:\n"
        "        x, y = x.cuda(), y.cuda()\n"
        "        loss = (model(x) - y).pow(2).mean()\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "    for x, y in val:\n"
        "        x, y = x.cuda(), y.cuda()\n"
        "        loss = (model(x) - y).pow(2).mean()\n"
        "        loss.backward()\n"
    )
    path = root / "pkg" / "loop.py"
    path.write_text(loop)
    result = _check(path, "PM102", "PM201")
    # `val` is pinned and has workers; `train`'s pin_memory and workers are a matter for the
    # module that builds it, which sees this loop among its callers': nothing to say here.
    assert result.findings == [] and not result.changed
    built = _check(root / "pkg" / "data.py", "PM102", "PM201").findings
    assert sorted((f.code, f.line, f.fixable) for f in built) == [("PM102", 8, True), ("PM201", 8, False)]
    pm201 = next(f for f in built if f.code == "PM201")
    assert "pkg/loop.py:6" in pm201.message and "only indexes tensors" in pm201.message
    # The same when the file names DataLoader (here in an annotation).
    path.write_text(
        "from torch.utils.data import DataLoader\n"
        + loop.replace("train, val =", "train: DataLoader\n    train, val =")
    )
    assert _check(path, "PM102", "PM201").findings == []


def test_a_pinned_loader_from_a_factory_is_left_alone(tmp_path):
    data = DATA.replace("DataLoader(data, batch_size=8)", "DataLoader(data, batch_size=8, pin_memory=True)")
    root = _project(tmp_path, {"pkg/data.py": data})
    path = root / "pkg" / "loop.py"
    path.write_text(
        "from pkg.data import make_loaders\n\n\n"
        "def run(model):\n"
        "    train, _ = make_loaders(64)\n"
        "    for x, y in train:\n"
        "        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)\n"
        "        model(x).sum().backward()\n"
    )
    assert _check(path, "PM102").findings == []


# -- the result cache ---------------------------------------------------------------------------


def test_the_cache_is_not_served_after_an_imported_module_changes(tmp_path, monkeypatch):
    root = _project(tmp_path, {"pkg/utils.py": UTILS, "pkg/data.py": DATA, "pkg/train.py": PINNED_TRAIN})
    monkeypatch.chdir(root)
    monkeypatch.delenv("PERFMOD_CACHE_DIR", raising=False)
    args = ["check", "pkg/train.py", "--select", "PM101", "--format", "json"]

    def fixable() -> int:
        run = perfmod(*args)
        return sum(1 for f in json.loads(run.stdout)["findings"] if f["pending"])

    assert fixable() == 2
    assert fixable() == 2  # from the cache
    utils = root / "pkg" / "utils.py"
    moved = UTILS.replace("    return out\n", "    return out.cuda()\n", 1)
    utils.write_text(moved)  # `extract` now moves the batch itself
    assert fixable() == 0
    stat = utils.stat()
    utils.write_text(moved)  # same bytes, newer time: still served
    os.utime(utils, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10_000_000))
    assert fixable() == 0


def test_cache_entries_record_the_project_files_read(tmp_path):
    root = _project(tmp_path, {"pkg/utils.py": UTILS, "pkg/data.py": DATA, "pkg/train.py": TRAIN})
    result = _check(root / "pkg" / "train.py", "PM101")
    assert {Path(d.path).name for d in result.dependencies} >= {"utils.py"}
    assert all(d.fresh() for d in result.dependencies)


# -- a loader handed to a project function whose loop copies its batches -------------------

HANDOFF_DATA = """\
import torch
from torch.utils.data import DataLoader as Loader, Dataset, TensorDataset


def make_loader(n, batch_size):
    data = TensorDataset(torch.randn(n, 4), torch.randn(n, 1))
    loader = Loader[Dataset](data, batch_size=batch_size, drop_last=True)
    return loader, n


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

HANDOFF_TRAIN = """\
import torch

from pkg.data import forever


def _optimize(model, train_loader, device, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    it = forever(train_loader)
    for step in range(steps):
        x, y = next(it)
        x, y = x.to(device), y.to(device)
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()


def run(model, train_loader, device="cuda", steps=4):
    _optimize(model, train_loader, device, steps)


def count(loader):
    return sum(len(x) for x, _ in loader)


def show(train_loader):
    for x, y in train_loader:
        print(x.to(torch.float16).sum())
"""

HANDOFF_MAIN = """\
import torch

from pkg.data import make_loader
from pkg.train_lib import run


def main():
    val_loader, _ = make_loader(32, 8)
    train_loader, _n = make_loader(64, 8)
    print(len(val_loader))
    run(torch.nn.Linear(4, 1), train_loader=train_loader)


if __name__ == "__main__":
    main()
"""


def _handoff_project(tmp_path, train=HANDOFF_TRAIN, data=HANDOFF_DATA, main=HANDOFF_MAIN) -> Path:
    root = _project(tmp_path, {"pkg/data.py": data, "pkg/train_lib.py": train, "pkg/main.py": main})
    return root / "pkg" / "main.py"


def test_a_subscripted_generic_dataloader_is_a_construction():
    context = FileContext.of_source(
        "import torch.utils.data as tud\nfrom torch.utils.data import DataLoader as DL, Dataset\n"
        "a = DL[Dataset](ds, batch_size=8)\nb = tud.DataLoader[Dataset](ds)\nc = DL(ds)\nd = dict[str, int](x=1)\n"
    )
    loaders = context.loaders
    assert [context.source(call.func) for call in loaders.constructions] == [
        "DL[Dataset]",
        "tud.DataLoader[Dataset]",
        "DL",
    ]
    assert all(loaders.is_torch_loader(call) for call in loaders.constructions)


def test_a_loader_from_a_factory_handed_to_a_function_that_copies_its_batches_is_decided_where_built(tmp_path):
    path = _handoff_project(tmp_path)
    result = _check(path, "PM102", "PM201")
    assert result.findings == [] and not result.changed
    # Its pin_memory and workers are decided where it is built, which sees the copies and the
    # training loop among its callers' (the other loader of the factory is never iterated):
    # pinned; a TensorDataset, left without workers.
    (pm102,) = _check(path.parent / "data.py", "PM102").findings
    assert pm102.applied and f"returned on line 8 to pkg/main.py:{_line_of(path, '_n = make_loader')}" in pm102.message
    assert "`_optimize` (pkg/train_lib.py:11, reached through `pkg.main.main`)" in pm102.message
    (pm201,) = _check(path.parent / "data.py", "PM201").findings
    assert "training loop of `_optimize` (pkg/train_lib.py:9, reached through `pkg.main.main`)" in pm201.message
    assert not pm201.fixable and "only indexes tensors" in pm201.message
    assert {os.path.basename(stamp.path) for stamp in result.dependencies} >= {"data.py", "train_lib.py"}


def test_a_loader_built_here_and_handed_on_gets_pin_memory_but_no_workers(tmp_path):
    main = (
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\nfrom pkg.train_lib import run\n\n\n"
        "def main():\n"
        "    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
        "    train_loader = DataLoader[TensorDataset](data, batch_size=8)\n"
        "    run(torch.nn.Linear(4, 1), train_loader)\n"
    )
    path = _handoff_project(tmp_path, main=main)
    result = _check(path, "PM102", "PM201")
    line = _line_of(path, "DataLoader[TensorDataset](")
    assert sorted((f.code, f.line, f.fixable) for f in result.findings) == [
        ("PM102", line, True),
        ("PM201", line, False),
    ]
    assert (
        "DataLoader[TensorDataset](\n        data, batch_size=8, pin_memory=torch.cuda.is_available()\n    )"
        in result.new_source.decode()
    )


@pytest.mark.parametrize(
    "main, why",
    [
        (
            HANDOFF_MAIN.replace(
                "run(torch.nn.Linear(4, 1), train_loader=train_loader)", "count(train_loader)"
            ).replace("import run", "import count"),
            "the callee never copies to a device",
        ),
        (
            HANDOFF_MAIN.replace("run(torch.nn.Linear(4, 1), train_loader=train_loader)", "show(train_loader)").replace(
                "import run", "import show"
            ),
            "the callee moves nothing: a dtype change only",
        ),
    ],
)
def test_a_loader_handed_to_a_function_that_does_not_copy_its_batches_is_left_alone(tmp_path, main, why):
    path = _handoff_project(tmp_path, main=main)
    assert _check(path, "PM102", "PM201").findings == [], why


def test_a_pinned_loader_with_workers_handed_on_is_left_alone(tmp_path):
    data = HANDOFF_DATA.replace("drop_last=True)", "drop_last=True, pin_memory=True, num_workers=2)")
    path = _handoff_project(tmp_path, data=data)
    assert _check(path, "PM102", "PM201").findings == []


def test_a_loader_that_may_hold_device_data_is_not_pinned_when_handed_on(tmp_path):
    data = HANDOFF_DATA.replace("torch.randn(n, 4)", "torch.randn(n, 4).cuda()")
    path = _handoff_project(tmp_path, data=data)
    assert _check(path, "PM102", "PM201").findings == []


def test_a_file_with_a_loader_but_no_project_imports_looks_for_no_handoff(tmp_path):
    root = _project(tmp_path, {"pkg/data.py": HANDOFF_DATA})
    path = root / "pkg" / "solo.py"
    path.write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        "loader = DataLoader[TensorDataset](TensorDataset(torch.randn(8, 2)))\nprint(len(loader))\n"
    )
    context = FileContext(cst.parse_module(path.read_text()), str(path), Settings(), path.read_text())
    assert context.loaders.handoffs == []
    assert _check(path).dependencies == ()


def test_two_loaders_of_one_factory_copied_to_the_device_are_pinned_where_they_are_built(tmp_path):
    train = HANDOFF_TRAIN.replace(
        'def run(model, train_loader, device="cuda", steps=4):\n    _optimize(model, train_loader, device, steps)\n',
        'def run(model, train_loader, val_loader, device="cuda", steps=4):\n'
        "    _optimize(model, train_loader, device, steps)\n"
        "    evaluate(model, val_loader, device)\n\n\n"
        "def evaluate(model, loader, device):\n"
        "    with torch.no_grad():\n"
        "        for x, y in loader:\n"
        "            print(model(x.to(device)).sum())\n",
    )
    main = HANDOFF_MAIN.replace("train_loader=train_loader)", "train_loader=train_loader, val_loader=val_loader)")
    path = _handoff_project(tmp_path, train=train, main=main)
    train_line = _line_of(path, "make_loader(64, 8)")
    # Both loaders' batches are copied to the device by the functions they are handed to, so
    # pin_memory and the workers are decided where they are built, and nothing is said here.
    assert _check(path, "PM102", "PM201").findings == []
    built = _check(path.parent / "data.py", "PM102", "PM201").findings
    assert sorted((f.code, f.fixable) for f in built) == [("PM102", True), ("PM201", False)]
    pm201 = next(f for f in built if f.code == "PM201")
    assert f"to pkg/main.py:{train_line}, feeds the training loop of `_optimize`" in pm201.message


def test_a_training_loop_over_one_of_two_loaders_of_one_factory_is_reported_at_its_call(tmp_path):
    root = _project(tmp_path, {"pkg/data.py": HANDOFF_DATA})
    path = root / "pkg" / "loop.py"
    path.write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\nfrom pkg.data import make_loader\n\n\n"
        "def run(model, opt):\n"
        "    train, _ = make_loader(64, 8)\n"
        "    val, _ = make_loader(32, 8)\n"
        "    for xv, yv in val:\n"
        "        print(model(xv).sum())\n"
        "    it = iter(train)\n"
        "    for step in range(4):\n"
        "        x, y = next(it)\n"
        "        loss = (model(x) - y).pow(2).mean()\n"
        "        loss.backward()\n"
        "        opt.step()\n"
    )
    assert _check(path, "PM201").findings == []  # reported where the loaders are built, at the training call
    (found,) = _check(root / "pkg" / "data.py", "PM201").findings
    assert f"to pkg/loop.py:{_line_of(path, 'make_loader(64, 8)')}, feeds the training loop of `run`" in found.message


# -- text gates: which modules need parsing ----------------------------------------------

GENERATORS = b"""\
import torch


def batches(
    loader,
    limit=None,
):
    for batch in loader:
        yield batch


def total(xs):
    return sum(xs)


@torch.no_grad()
def evaluate(model, loader):
    return [model(x) for x in loader]


async def stream(source):
    async for item in source:
        yield item
"""


@pytest.mark.parametrize(
    "name, may",
    [("batches", True), ("total", False), ("evaluate", False), ("stream", True), ("imported_elsewhere", True)],
)
def test_whether_a_function_may_yield_is_read_from_its_own_text(tmp_path, name, may):
    from codemod.analysis.project import _Module

    path = tmp_path / "gen.py"
    path.write_bytes(GENERATORS)
    module = _Module(str(path), None, GENERATORS, Settings())
    assert module.may_yield(name) is may
    assert not module._parsed  # answered without parsing the module


@pytest.mark.parametrize(
    "spelling",
    [
        "from .setup_env import configure",
        "from . import setup_env",
        "import pkg.setup_env",
        "from pkg import setup_env",
    ],
)
def test_a_word_in_a_project_module_the_file_imports_is_found(tmp_path, spelling):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "setup_env.py").write_text("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n")
    (package / "other.py").write_text("x = 1\n")
    path = package / "train.py"
    path.write_text(f"{spelling}\nfrom . import other\n")
    context = FileContext(cst.parse_module(path.read_text()), str(path), Settings(), path.read_text())
    project = project_of(context)
    assert project.imported_module_mentioning(b"allow_tf32") == os.path.join("pkg", "setup_env.py")
    assert project.imported_module_mentioning(b"fp32_precision") is None


# -- a training function whose loader settings come from the module that imports it --------

HOGWILD_TRAIN = """\
import torch
import torch.nn.functional as F


def train(rank, model, device, dataset, dataloader_kwargs, epochs=1):
    torch.manual_seed(rank)
    loader = torch.utils.data.DataLoader(dataset, **dataloader_kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(epochs):
        for data, target in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(data.to(device)), target.to(device))
            loss.backward()
            optimizer.step()
"""

HOGWILD_MAIN = """\
import torch
import torch.multiprocessing as mp
from torch.utils.data import TensorDataset

from train import train

if __name__ == "__main__":
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda" if use_cuda else "cpu")
    kwargs = {"batch_size": 16, "shuffle": True}
    if use_cuda:
        kwargs.update({"num_workers": 1, "pin_memory": True})
    dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    model = torch.nn.Linear(8, 1).to(device)
    model.share_memory()
    processes = []
    for rank in range(2):
        p = mp.Process(target=train, args=(rank, model, device, dataset, kwargs))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
"""


def test_loader_settings_passed_in_by_the_module_that_starts_the_training(tmp_path):
    """mnist_hogwild's shape: `train.py`'s loader takes `**dataloader_kwargs`, which
    `main.py` (a module that imports `train.py`, not one it imports) fills with
    `pin_memory` and `num_workers` under CUDA and hands to each `mp.Process`. Neither
    is missing, so neither is reported; a `main.py` that sets neither gets both reports,
    and the cache entry records `main.py` as read, and the folder whose files were read
    for what the callers of `train` pass (a new module there could call it too)."""
    root = _project(tmp_path, {"train.py": HOGWILD_TRAIN, "main.py": HOGWILD_MAIN})
    result = _check(root / "train.py", "PM102", "PM201")
    assert result.error is None, result.error
    assert [f.code for f in result.findings] == []
    assert {Path(d.path).name for d in result.dependencies} == {"main.py", root.name}

    (root / "main.py").write_text(HOGWILD_MAIN.replace('"num_workers": 1, "pin_memory": True', '"drop_last": True'))
    result = _check(root / "train.py", "PM102", "PM201")
    assert sorted(f.code for f in result.findings) == ["PM102", "PM201"]
    assert not any(f.fixable for f in result.findings)  # the dict is built in another file


def test_a_direct_call_and_a_spawned_worker_pass_their_arguments(tmp_path):
    """A call `train(...)` passes by keyword or position; `mp.spawn(worker, args=(...))`
    gives the worker its rank first, so the tuple fills the parameters after it."""
    main = """\
    import torch.multiprocessing as mp

    from train import train


    def run(dataset, model):
        train(0, model, "cpu", dataset, dataloader_kwargs={"batch_size": 4, "pin_memory": True})


    def launch(dataset, model):
        mp.spawn(train, args=(model, "cpu", dataset, {"batch_size": 4, "num_workers": 2}), nprocs=2)
    """
    root = _project(tmp_path, {"train.py": HOGWILD_TRAIN, "main.py": main})
    context = FileContext.of_source((root / "train.py").read_text(), str(root / "train.py"))
    function = next(f for f in context.index.find(cst.FunctionDef) if f.name.value == "train")
    param = next(p for p in function.params.params if p.name.value == "dataloader_kwargs")
    passed = project_of(context).importer_arguments(function, param)
    assert [other.source(value) for other, value in passed] == [
        '{"batch_size": 4, "pin_memory": True}',
        '{"batch_size": 4, "num_workers": 2}',
    ]
    rank = function.params.params[0]
    assert project_of(context).importer_arguments(function, rank) is None  # the spawned rank is not in the tuple


def test_a_function_other_modules_start_processes_with(tmp_path):
    root = _project(tmp_path, {"train.py": HOGWILD_TRAIN, "main.py": HOGWILD_MAIN})
    context = FileContext.of_source((root / "train.py").read_text(), str(root / "train.py"))
    train = next(f for f in context.index.find(cst.FunctionDef) if f.name.value == "train")
    assert project_of(context).started_in_processes(train) == "main.py"
    (root / "main.py").write_text(HOGWILD_MAIN.replace("p = mp.Process(target=train, args=", "p = train(*"))
    context = FileContext.of_source((root / "train.py").read_text(), str(root / "train.py"))
    train = next(f for f in context.index.find(cst.FunctionDef) if f.name.value == "train")
    assert project_of(context).started_in_processes(train) is None


def test_training_another_module_runs_in_processes_is_not_called_single_process(tmp_path):
    """mnist_hogwild: `main.py` starts `train` (whose loop is in a function it calls) in
    `mp.Process`es over a shared model, so PM601 has nothing to say about `train.py`;
    called once from `main.py`, it trains in one process and PM601 speaks."""
    train = HOGWILD_TRAIN.replace(
        "    for epoch in range(epochs):\n",
        "    run_epochs(loader, model, device, optimizer, epochs)\n\n\ndef run_epochs(loader, model, device, optimizer, epochs):\n    for epoch in range(epochs):\n",
    )
    root = _project(tmp_path, {"train.py": train, "main.py": HOGWILD_MAIN})
    assert "def run_epochs" in (root / "train.py").read_text()
    assert _check(root / "train.py", "PM601").findings == []
    (root / "main.py").write_text(HOGWILD_MAIN.replace("p = mp.Process(target=train, args=", "p = train(*"))
    assert [f.code for f in _check(root / "train.py", "PM601").findings] == ["PM601"]


def test_a_class_star_imported_through_a_packages_init_is_found(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    models = tmp_path / "models"
    models.mkdir()
    (models / "__init__.py").write_text("from .heads import *\nfrom .convnet import *\n")
    (models / "heads.py").write_text("def head():\n    return 1\n")
    (models / "convnet.py").write_text(
        "import torch.nn as nn\n\n\nclass ConvNet(nn.Module):\n    def forward(self, x):\n        return x\n"
    )
    source = "from models import *\n\nnet = ConvNet()\nn = head()\nm = missing()\n"
    context = FileContext.of_source(source, path=str(tmp_path / "train.py"))
    calls = {context.source(c.func): c for c in context.index.find(cst.Call)}
    assert context.names.of(calls["ConvNet"].func) == {"models.ConvNet"}
    built, classdef = project_of(context).class_of(calls["ConvNet"].func)
    assert classdef.name.value == "ConvNet" and built.path.endswith("convnet.py")
    assert project_of(context).function(calls["head"].func).node.name.value == "head"
    assert project_of(context).function(calls["missing"].func) is None
    assert context.kinds.fact(calls["ConvNet"]).kind is Kind.MODULE  # read in its module: an nn.Module
    assert context.kinds.fact(calls["head"]).kind is not Kind.MODULE


def test_the_importers_of_a_module_are_those_whose_imports_name_it(tmp_path):
    """A package's modules nearly all import something relatively, and a short module name
    (`aten`, `data`) is a common word, often another module's too: only an import that names
    the module, resolved from the importer's folder, makes an importer."""
    from tests.package_support import write_package

    files = {
        "data.py": "def to_device(x, device):\n    return x.to(device)\n",
        "sub/__init__.py": "",
        "sub/deep.py": "from ..data import to_device\n",
        "grouped.py": "from . import (\n    other,\n    data,\n)\n",
        "absolute.py": "from {package} import data\n",
        "dotted.py": "import {package}.data\n",
        "other.py": "from . import grouped\nname = 'data'\n",
        "prefixed.py": "from .data_tools import to_device\n",
        "data_tools.py": "def to_device(x, device):\n    return x\n",
        "other/__init__.py": "",
        "other/data.py": "",
        "other/user.py": "from . import data\nfrom .data import to_device\n",  # its own folder's `data`
    }
    folder = write_package(tmp_path, "imports_text", files)
    context = FileContext.of_source((folder / "data.py").read_text(), str(folder / "data.py"), Settings())
    importers = sorted(Path(m.path).relative_to(folder).as_posix() for m in project_of(context).package_importers())
    assert importers == ["absolute.py", "dotted.py", "grouped.py", "sub/deep.py"]


@pytest.mark.parametrize(
    ("caller", "expected"),
    [
        ("from pkg.run import fit\nfit(1, loader=make())\n", ["2: make()"]),
        ("from pkg import run\nrun.fit(2, make())\nrun.fit(3, other)\n", ["2: make()", "3: other"]),
        ("import pkg.run\n", []),  # imported, never called
        ("from pkg.run import fit\nfit(1)\n", None),  # the default taken: not a caller's loader
        ("from pkg.run import fit\nfit(*args)\n", None),
        ("from pkg import run\nsteps = {'fit': run.fit}\n", None),  # handed on as a value
        (
            "import multiprocessing as mp\nfrom pkg.run import fit\nmp.Process(target=fit, args=(1, make())).start()\n",
            None,
        ),
    ],
    ids=["keyword", "two-calls", "uncalled", "default", "star-args", "as-a-value", "process"],
)
def test_what_the_other_modules_of_the_package_pass_to_a_parameter(tmp_path, caller, expected):
    root = _project(
        tmp_path,
        {"pkg/run.py": "def fit(steps, loader=None):\n    return loader\n", "pkg/sub/main.py": caller},
    )
    (root / "pkg" / "sub" / "__init__.py").write_text("")
    source = (root / "pkg" / "run.py").read_text()
    context = FileContext(cst.parse_module(source), str(root / "pkg" / "run.py"), Settings(), source)
    function = context.module.body[0]
    found = project_of(context).package_arguments(function, function.params.params[1])
    shown = (
        None if found is None else [f"{there.line(call)}: {there.source(argument)}" for there, call, argument in found]
    )
    assert shown == expected


def _asking(path: Path) -> tuple[FileContext, cst.FunctionDef]:
    """A fresh analysis of the module at `path` (as each file of a project run gets), and
    its first function."""
    source = path.read_text()
    context = FileContext(cst.parse_module(source), str(path), Settings(), source)
    return context, next(s for s in context.module.body if isinstance(s, cst.FunctionDef))


def test_the_package_callers_of_a_function_are_read_once_while_no_file_changes(tmp_path, monkeypatch):
    """Every file of a project run that asks who calls `fit` is answered from one reading of
    the package; a caller added since is found."""
    from codemod.analysis import project as project_module

    read = []
    calls_of = project_module._calls_of
    monkeypatch.setattr(
        project_module, "_calls_of", lambda module, *rest: read.append(module.path) or calls_of(module, *rest)
    )
    root = _project(
        tmp_path,
        {
            "pkg/run.py": "def fit(steps, loader=None):\n    return loader\n",
            "pkg/main.py": "from pkg.run import fit\nfit(1, make())\n",
        },
    )
    for _ in range(2):
        context, function = _asking(root / "pkg" / "run.py")
        found = project_of(context).package_arguments(function, function.params.params[1])
        assert [there.source(argument) for there, _, argument in found] == ["make()"]
    assert read == [str(root / "pkg" / "main.py")]

    (root / "pkg" / "again.py").write_text("from pkg.run import fit\nfit(2, other)\n")
    context, function = _asking(root / "pkg" / "run.py")
    found = project_of(context).package_arguments(function, function.params.params[1])
    assert sorted(there.source(argument) for there, _, argument in found) == ["make()", "other"]


def test_only_calls_named_as_the_function_are_followed_to_their_modules(tmp_path):
    """Looking for the calls of `fit`, the module of every other function a caller calls is
    not read (`helper` of `pkg/tools.py`)."""
    from codemod.analysis import project as project_module

    root = _project(
        tmp_path,
        {
            "pkg/run.py": "def fit(steps, loader=None):\n    return loader\n",
            "pkg/tools.py": "def helper():\n    return 1\n",
            "pkg/main.py": "from pkg.run import fit as train\nfrom pkg.tools import helper\ntrain(helper(), make())\n",
        },
    )
    context, function = _asking(root / "pkg" / "run.py")
    found = project_of(context).package_arguments(function, function.params.params[1])
    assert [there.source(argument) for there, _, argument in found] == ["make()"]  # called under another name
    assert str(root / "pkg" / "tools.py") not in project_module._MODULES


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        ("loader", (Kind.LOADER, "Memory.PINNED")),  # built in the function: the same for every caller
        ("rows", None),  # its parameter: what this module's call passes is no other caller's
    ],
)
def test_what_a_function_returns_to_another_module_that_its_own_module_calls_too(tmp_path, returned, expected):
    root = _project(
        tmp_path,
        {
            "pkg/data.py": f"""\
                import torch
                from torch.utils.data import DataLoader


                def make(rows):
                    loader = DataLoader(rows, batch_size=4, pin_memory=True)
                    return {returned}, 0


                def small():
                    return make(torch.zeros(8, 2))
            """,
            "pkg/main.py": "from pkg.data import make\n\nloader, _ = make(rows)\n",
        },
    )
    source = (root / "pkg" / "main.py").read_text()
    context = FileContext(cst.parse_module(source), str(root / "pkg" / "main.py"), Settings(), source)
    function = project_of(context).function(context.module.body[1].body[0].value.func)
    found = project_of(context).returned(function, (0,))
    assert (None if found is None else (found.kind, str(found.memory))) == expected


def test_only_a_parameter_iterated_or_handed_on_is_asked_of_the_packages_callers(tmp_path, monkeypatch):
    """What other modules pass to a parameter is read only where a loader it held would
    matter: `loader`, iterated; not `config` (its attribute read), `hook` (called) nor
    `device` (named as a device)."""
    from codemod.analysis.project import Project

    root = _project(
        tmp_path,
        {
            "pkg/run.py": "def fit(config, device, loader, hook):\n    hook(config.lr)\n"
            "    for b in loader:\n        b.to(device)\n",
            "pkg/main.py": "from pkg.run import fit\nfit(cfg, 'cpu', make(), print)\n",
        },
    )
    asked = []
    monkeypatch.setattr(
        Project, "package_arguments", lambda self, function, param: asked.append(param.name.value) or []
    )
    context, function = _asking(root / "pkg" / "run.py")
    for name in context.index.find(cst.Name, within=function.body):
        context.kinds.fact(name)
    assert asked == ["loader"]


def test_a_model_of_a_package_that_star_imports_its_parts_is_read_there(tmp_path):
    """The UNet layout: `pkg/__init__.py` re-exports `from .model import Net`, and
    `pkg/model.py` takes `nn` and its blocks from `from .parts import *`. The names are
    torch's and the project's classes, so the step's products are known: convolutions only,
    which cuDNN runs in TF32 already (PM302 reports, no fix)."""
    parts = """\
        import torch.nn as nn

        class Block(nn.Module):
            def __init__(self, c):
                super(Block, self).__init__()
                self.conv = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU())

            def forward(self, x):
                return self.conv(x)
        """
    model = """\
        from .parts import *

        class Net(nn.Module):
            def __init__(self, c):
                super(Net, self).__init__()
                self.block = Block(c)
                self.head = nn.Conv2d(c, 1, 1)

            def forward(self, x):
                return self.head(self.block(x))
        """
    train = """\
        import sys
        import torch
        from pkg import Net

        model = Net(int(sys.argv[1])).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            x = torch.randn(8, 3, 32, 32, device="cuda")
            loss = model(x).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        """
    root = _project(
        tmp_path,
        {
            "pkg/__init__.py": "from .model import Net\n",
            "pkg/parts.py": parts,
            "pkg/model.py": model,
            "train.py": train,
        },
    )
    context = FileContext.of_source((root / "pkg" / "model.py").read_text(), str(root / "pkg" / "model.py"))
    net = next(c for c in context.module.body if isinstance(c, cst.ClassDef))
    assert context.names.of(net.bases[0].value) == {"torch.nn.Module"}  # `nn` of `from .parts import *`
    result = _check(root / "train.py", "PM302")
    assert [(f.applied, "no float32 matrix product" in f.message) for f in result.findings] == [(False, True)]

"""Shapes of two research code bases that the analyses must read: an optional import
(`try: import torch` / `except ImportError: torch = None`) in a checkpoint module, a
package checked out without a project marker, and a checkpoint wrapper of the project
whose file is uploaded right after it is written."""

from __future__ import annotations

import runpy
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest
import torch

from codemod.analysis.project import project_of
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.result import Level

OPTIONAL_TORCH = """\
import os
import tempfile

try:
    import torch
except Exception:
    torch = None


def _atomic_save_torch(obj, dst):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dst))
    os.close(fd)
    torch.save(obj, tmp)
    os.replace(tmp, dst)


def save_latest(save_dir, artifacts):
    os.makedirs(save_dir, exist_ok=True)
    for name, obj in artifacts.items():
        _atomic_save_torch(obj, os.path.join(save_dir, name))
"""

TRAIN_WITH_LATEST = """\
import torch
from pkg.checkpointing import save_latest


def train(model, steps, save_dir):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        loss = model(torch.randn(2, 4)).sum()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            save_latest(save_dir, {"encoder.pt": model.state_dict()})
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in {"pkg/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _findings(path: Path, code: str, changed: bool = False) -> list:
    result = process_source(path.read_bytes(), str(path), Settings(level=Level.UNSAFE, select=(code,)))
    assert result.changed == changed
    return [f for f in result.findings if f.code == code]


def _saver_of(train: Path, callee: str) -> str | None:
    context = FileContext.of_source(train.read_text(), path=str(train))
    project = project_of(context)
    (call,) = _calls(context, callee)
    function = project.called(call)
    return project.saver(function) if function is not None else None


def _calls(context: FileContext, dotted: str) -> list[cst.Call]:
    return [c for c in context.index.find(cst.Call) if context.module.code_for_node(c.func) == dotted]


@pytest.mark.parametrize(
    "fallback, names",
    [
        ("try:\n    import torch\nexcept ImportError:\n    torch = None\n", {"torch.save"}),
        ("try:\n    import torch as th\nexcept (ImportError, OSError):\n    th = None\n", {"torch.save"}),
        # Bound to something else that may have attributes: which binding is live is unknown.
        ("try:\n    import torch\nexcept ImportError:\n    torch = object()\n", set()),
        ("import torch\ntorch = None\n", set()),
    ],
)
def test_an_attribute_of_an_optional_import_is_the_imported_one(fallback, names):
    name = "th" if "as th" in fallback else "torch"
    context = FileContext.of_source(fallback + f"\ndef save(obj, path):\n    {name}.save(obj, path)\n")
    (call,) = _calls(context, f"{name}.save")
    assert context.names.of(call) == names


def test_a_checkpoint_module_with_an_optional_torch_import_is_followed(tmp_path):
    _write(tmp_path, {"pkg/checkpointing.py": OPTIONAL_TORCH, "pkg/train.py": TRAIN_WITH_LATEST})
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    train = tmp_path / "pkg" / "train.py"
    assert _saver_of(train, "save_latest") == "`torch.save` in `_atomic_save_torch`"
    (finding,) = _findings(train, "PM405", changed=True)  # it only writes files: run in the background
    assert "pkg/checkpointing.py" in finding.message and finding.fixable


def test_a_package_without_a_project_marker_is_imported_from_the_folder_above_it(tmp_path):
    root = tmp_path / "checkout"
    _write(root, {"pkg/checkpointing.py": OPTIONAL_TORCH, "pkg/train.py": TRAIN_WITH_LATEST})
    train = root / "pkg" / "train.py"
    context = FileContext.of_source(train.read_text(), path=str(train))
    project = project_of(context)
    assert project.root is not None and project.root.resolve() == root.resolve()
    (call,) = _calls(context, "save_latest")
    assert project.called(call) is not None
    assert _saver_of(train, "save_latest") == "`torch.save` in `_atomic_save_torch`"


def test_a_script_beside_no_package_keeps_its_own_folder_as_root(tmp_path):
    script = tmp_path / "loose" / "train.py"
    script.parent.mkdir()
    script.write_text("import torch\n")
    project = project_of(FileContext.of_source(script.read_text(), path=str(script)))
    assert project.root.resolve() == script.parent.resolve()


# -- a project wrapper whose file is uploaded right after the save -----------------------

RUN_UTILS = """\
from pathlib import Path

import torch


def _save_torch(data, path, **kwargs):
    torch.save(data, path, **kwargs)


def save_file(data, path, **kwargs):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix in (".pth", ".pt"):
        _save_torch(data, path, **kwargs)
    else:
        path.write_text(str(data))
"""

RUN = """\
import torch
import wandb
from pkg.run_utils import save_file


def optimize(model, steps, save_freq, out_dir, upload):
    opt = torch.optim.AdamW(model.parameters())
    for step in range(steps + 1):
        loss = model(torch.randn(2, 4)).pow(2).mean()
        loss.backward()
        if step % save_freq == 0 and step > 0:
            save_file(model.state_dict(), out_dir / f"model_{step}.pth")
            if upload:
                wandb.save(str(out_dir / f"model_{step}.pth"), base_path=str(out_dir), policy="now")
        opt.step()
        opt.zero_grad()
"""


def test_a_wrapper_save_whose_file_is_uploaded_when_asked_waits_only_then(tmp_path):
    _write(tmp_path, {"pkg/run_utils.py": RUN_UTILS, "pkg/run.py": RUN})
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    run = tmp_path / "pkg" / "run.py"
    (finding,) = _findings(run, "PM405", changed=True)
    upload = next(n for n, line in enumerate(run.read_text().splitlines(), 1) if "wandb.save(" in line)
    assert finding.fixable and f"`checkpointer.flush()` before line {upload}, which uses the file" in finding.message
    result = process_source(run.read_bytes(), str(run), Settings(level=Level.UNSAFE, select=("PM405",)))
    assert "            if upload:\n                checkpointer.flush()\n                wandb.save(" in (
        result.new_source.decode()
    )


def test_a_wrapper_save_whose_file_is_read_whatever_happens_stays_synchronous(tmp_path):
    every_time = RUN.replace("            if upload:\n                wandb.save(", "            wandb.save(")
    _write(tmp_path, {"pkg/run_utils.py": RUN_UTILS, "pkg/run.py": every_time})
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    run = tmp_path / "pkg" / "run.py"
    (finding,) = _findings(run, "PM405")
    upload = next(n for n, line in enumerate(run.read_text().splitlines(), 1) if "wandb.save(" in line)
    assert f'the file is used at line {upload} (`wandb.save(str(out_dir / f"model_{{step}}.pth")' in finding.message


QUIET_RUN = """\
from pathlib import Path

import torch
from pkg.run_utils import save_file


def optimize(steps, save_freq, out_dir):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps + 1):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        if step % save_freq == 0 and step > 0:
            save_file(model.state_dict(), Path(out_dir) / f"model_{step}.pth")
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses
"""


# The same loop, reading each file back when asked (as an upload would), after logging;
# the sizes read go into the list the test compares.
UPLOADING_RUN = QUIET_RUN.replace(
    '.pth")\n',
    '.pth")\n            print("saved")\n            if upload:\n'
    '                losses.append(len((Path(out_dir) / f"model_{step}.pth").read_bytes()))\n',
).replace("def optimize(steps, save_freq, out_dir):\n", "def optimize(steps, save_freq, out_dir, upload=True):\n")
assert UPLOADING_RUN.count("upload") == 2


def _run(root: Path, out_dir: Path, monkeypatch) -> list[float]:
    monkeypatch.syspath_prepend(str(root))
    for name in [n for n in sys.modules if n == "pkg" or n.startswith("pkg.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        return runpy.run_path(str(root / "pkg" / "run.py"))["optimize"](6, 2, out_dir)
    finally:
        for name in [n for n in sys.modules if n == "pkg" or n.startswith("pkg.")]:
            del sys.modules[name]


# The wrapper logs through its module's logger (nanochat's `save_checkpoint`): a logger is
# no state of the module that a background call would read differently.
LOGGING_UTILS = RUN_UTILS.replace(
    "import torch\n", "import logging\n\nimport torch\n\nlogger = logging.getLogger(__name__)\n"
).replace(
    "        _save_torch(data, path, **kwargs)\n",
    "        _save_torch(data, path, **kwargs)\n        logger.info(path)\n",
)
assert LOGGING_UTILS.count("logger") == 2
# ... and through a logger its module may rebind to another logger: every binding is one.
RELOGGING_UTILS = LOGGING_UTILS.replace(
    "logger = logging.getLogger(__name__)\n",
    'logger = logging.getLogger(__name__)\nif __name__ == "__main__":\n    logger = logging.getLogger("run_utils")\n',
)
assert RELOGGING_UTILS.count("logger") == 3


@pytest.mark.parametrize(
    "script, utils",
    [(QUIET_RUN, RUN_UTILS), (UPLOADING_RUN, RUN_UTILS), (QUIET_RUN, LOGGING_UTILS), (QUIET_RUN, RELOGGING_UTILS)],
    ids=["quiet", "uploading", "logging", "rebound logger"],
)
def test_a_wrapper_that_only_writes_files_runs_in_the_background_and_writes_the_same_files(
    tmp_path, monkeypatch, script, utils
):
    original, rewritten = tmp_path / "original", tmp_path / "rewritten"
    for root in (original, rewritten):
        _write(root, {"pkg/run_utils.py": utils, "pkg/run.py": script})
        (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    run = rewritten / "pkg" / "run.py"
    result = process_source(run.read_bytes(), str(run), Settings(level=Level.UNSAFE, select=("PM405",)))
    (finding,) = result.findings
    line = utils.splitlines().index("def save_file(data, path, **kwargs):") + 1
    assert finding.fixable and f"pkg/run_utils.py:{line}" in finding.message
    new = result.new_source.decode()
    assert (
        'checkpointer.call(\n                save_file, model.state_dict(), Path(out_dir) / f"model_{step}.pth"\n'
        in new
    )
    assert "checkpointer = AsyncCheckpointer()\n    for step" in new and "    checkpointer.flush()\n    return" in new
    run.write_text(new)
    before = _run(original, tmp_path / "before", monkeypatch)
    after = _run(rewritten, tmp_path / "after", monkeypatch)
    assert before == after
    names = sorted(p.name for p in (tmp_path / "before").iterdir())
    assert names == ["model_2.pth", "model_4.pth", "model_6.pth"]
    assert sorted(p.name for p in (tmp_path / "after").iterdir()) == names
    for name in names:
        want, got = torch.load(tmp_path / "before" / name), torch.load(tmp_path / "after" / name)
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


PATH_LINE = "    path = Path(path)\n"


@pytest.mark.parametrize(
    "utils_changes, run_change, why",
    [
        ([(PATH_LINE, PATH_LINE + '    data["saved"] = True\n')], None, 'changes `data["saved"]`'),
        ([(PATH_LINE, PATH_LINE + "    wandb.save(str(path))\n")], None, "calls `wandb.save`"),
        (
            [
                ("def save_file(", "HISTORY = []\n\n\ndef record(x):\n    HISTORY.append(x)\n\n\ndef save_file("),
                (PATH_LINE, PATH_LINE + "    print(len(HISTORY))\n"),
            ],
            None,
            "reads `HISTORY`, a value of its module",
        ),
        ([], ("            save_file(", "            written = save_file("), "its result is used"),
        (
            [],
            ('.pth")\n', '.pth")\n            torch.load(Path(out_dir) / f"model_{step}.pth")\n'),
            "not fixed: the file is used at line 17",
        ),
        (
            [],
            ("save_file(model.state_dict(),", "save_file([p.detach() for p in model.parameters()],"),
            "perfmod cannot tell whether `[p.detach() for p in model.parameters()]` names a file",
        ),
    ],
)
def test_a_wrapper_that_may_do_more_stays_in_the_training_thread(tmp_path, utils_changes, run_change, why):
    utils = RUN_UTILS
    for change in utils_changes:
        assert change[0] in utils
        utils = utils.replace(*change)
    utils = "import wandb\n" + utils if utils_changes else utils
    run = QUIET_RUN if run_change is None else QUIET_RUN.replace(*run_change)
    assert utils != RUN_UTILS or run != QUIET_RUN
    _write(tmp_path, {"pkg/run_utils.py": utils, "pkg/run.py": run})
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (finding,) = _findings(tmp_path / "pkg" / "run.py", "PM405")
    assert not finding.fixable and why in finding.message, finding.message


# -- hooks attached by a @contextmanager helper ----------------------------------------------

HOOKED = """\
from contextlib import contextmanager
from functools import partial

import torch


def keep(module, args, output, name, cache):
    cache[name] = output


class Wrapped(torch.nn.Module):
    def __init__(self, target):
        super().__init__()
        self.target = target

    @contextmanager
    def _attach_forward_hooks(self, hooks: dict):
        handles: list = []
        for name, hook in hooks.items():
            module = self.target.get_submodule(name)
            handle = module.register_forward_hook(hook)
            handles.append(handle)
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def forward(self, x, names):
        cache = {}
        with self._attach_forward_hooks({n: partial(keep, name=n, cache=cache) for n in names}):
            out = self.target(x)
        return out, cache
"""

FIXED_HOOKS = HOOKED.replace("hooks: dict", "names").replace("hooks.items()", "[(n, print) for n in ('0',)]")


def _pm501(code: str) -> list:
    result = process_source(code.encode(), "<hooks>", Settings(level=Level.UNSAFE, select=("PM501",)))
    assert not result.changed
    return [f for f in result.findings if f.code == "PM501"]


def test_hooks_a_context_manager_gets_from_its_caller_are_reported_with_that_reason():
    (finding,) = _pm501(HOOKED)
    assert "`@contextmanager` helper `_attach_forward_hooks`" in finding.message
    assert "comes from each call (`hooks`, given by the caller)" in finding.message
    assert "stored or used other than" not in finding.message  # the handle is followed through `handle`


def test_hooks_a_context_manager_makes_itself_get_the_general_reason():
    (finding,) = _pm501(FIXED_HOOKS)
    assert "given by the caller" not in finding.message
    assert "registered in a loop, a context manager or a helper" in finding.message


def test_an_empty_tuple_among_the_loops_arguments_is_no_path():
    code = (
        "import os\nimport torch\nmodel = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(3):\n    running = torch.zeros(())\n    model(torch.randn(2, 2)).sum().backward()\n"
        "    opt.step()\n    torch.save(model.state_dict(), os.path.join('out', f'{step}.pt'))\n"
    )
    result = process_source(code.encode(), "<loop>", Settings(level=Level.UNSAFE, select=("PM405",)))
    assert result.error is None
    (finding,) = result.findings
    assert finding.fixable and "checkpointer.save(" in result.new_source.decode()


def test_a_use_in_the_test_of_an_if_is_not_a_use_under_it():
    """legacy/snli's keep-latest loop: `if f != snapshot_path: os.remove(f)` right after the
    save reads the path whatever happens; the save stays synchronous."""
    code = (
        "import glob\nimport os\nimport torch\nmodel = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(3):\n    model(torch.randn(2, 2)).sum().backward()\n    opt.step()\n"
        "    snapshot_path = f'snapshot_{step}.pt'\n    torch.save(model.state_dict(), snapshot_path)\n"
        "    for f in glob.glob('snapshot_*'):\n        if f != snapshot_path:\n            os.remove(f)\n"
    )
    result = process_source(code.encode(), "<loop>", Settings(level=Level.UNSAFE, select=("PM405",)))
    (finding,) = result.findings
    assert not finding.fixable and "the file is used at line 12 (`snapshot_path`)" in finding.message

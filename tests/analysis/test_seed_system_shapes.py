"""Shapes of two research code bases that the analyses must read: an optional import
(`try: import torch` / `except ImportError: torch = None`) in a checkpoint module, a
package checked out without a project marker, and a checkpoint wrapper of the project
whose file is uploaded right after it is written."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

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


def _findings(path: Path, code: str) -> list:
    result = process_source(path.read_bytes(), str(path), Settings(level=Level.UNSAFE, select=(code,)))
    assert not result.changed
    return [f for f in result.findings if f.code == code]


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
    (finding,) = _findings(tmp_path / "pkg" / "train.py", "PM405")
    assert "`torch.save` in `_atomic_save_torch`" in finding.message
    assert "pkg/checkpointing.py" in finding.message and not finding.fixable


def test_a_package_without_a_project_marker_is_imported_from_the_folder_above_it(tmp_path):
    root = tmp_path / "checkout"
    _write(root, {"pkg/checkpointing.py": OPTIONAL_TORCH, "pkg/train.py": TRAIN_WITH_LATEST})
    train = root / "pkg" / "train.py"
    context = FileContext.of_source(train.read_text(), path=str(train))
    project = project_of(context)
    assert project.root is not None and project.root.resolve() == root.resolve()
    (call,) = _calls(context, "save_latest")
    assert project.called(call) is not None
    (finding,) = _findings(train, "PM405")
    assert "`torch.save` in `_atomic_save_torch`" in finding.message


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


def test_a_wrapper_save_whose_file_is_uploaded_next_gives_that_reason(tmp_path):
    _write(tmp_path, {"pkg/run_utils.py": RUN_UTILS, "pkg/run.py": RUN})
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    run = tmp_path / "pkg" / "run.py"
    (finding,) = _findings(run, "PM405")
    upload = next(n for n, line in enumerate(run.read_text().splitlines(), 1) if "wandb.save(" in line)
    assert f'the file is used at line {upload} (`wandb.save(str(out_dir / f"model_{{step}}.pth")' in finding.message
    assert "another module" not in finding.message


def test_a_wrapper_save_whose_file_is_not_read_says_where_the_save_is(tmp_path):
    quiet = RUN.replace("            if upload:\n", "            if upload:\n                print(step)\n")
    quiet = "\n".join(line for line in quiet.splitlines() if "wandb.save(" not in line) + "\n"
    _write(tmp_path, {"pkg/run_utils.py": RUN_UTILS, "pkg/run.py": quiet})
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (finding,) = _findings(tmp_path / "pkg" / "run.py", "PM405")
    assert "another module" in finding.message and "the file is used" not in finding.message


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

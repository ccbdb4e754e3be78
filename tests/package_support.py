"""What the tests of rules that follow a value across a project's modules share: a
package written in a temporary folder, one of its modules checked, and a function of it
run on the CPU."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Level


def write_package(root: Path, package: str, files: dict[str, str]) -> Path:
    """A project at `root` (a pyproject.toml) holding `package` with `files` (name -> text,
    dedented, `{package}` replaced by the package's name); its folder."""
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    for name, text in {"__init__.py": "", **files}.items():
        path = root / package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).replace("{package}", package))
    return root / package


def check_unsafe(path: Path, *codes: str):
    """The result of processing the module at `path` with the rules `codes` at level unsafe."""
    return process_source(path.read_bytes(), str(path), Settings(level=Level.UNSAFE, select=codes))


def run_main(root: Path, module: str):
    """`main()` of `module` (`pkg.train`), imported from `root`; the package is forgotten after,
    so the next run imports it afresh."""
    package = module.split(".")[0]
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(module).main()
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")]:
            del sys.modules[name]


def stand_in_module(folder: Path, monkeypatch, name: str, text: str) -> None:
    """`import name` gives the module `text` (written in `folder`) until the test ends, and
    whatever it gave before after it."""
    path = folder / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, name, module)

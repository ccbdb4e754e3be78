"""The README says what the code does: `make demo` runs the command whose
output the README shows, and the runtime examples name what runtime has."""

import importlib
import re
import warnings

import pytest

from tests.cli_support import REPO

README = (REPO / "README.md").read_text()


def test_make_demo_runs_the_command_the_readme_shows():
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    command = re.search(r"\$\(BIN\)/(perfmod apply [^;\n]+)", recipe).group(1).strip()
    before_after = README[README.index("## A real before/after") : README.index("## Rules")]
    assert f"`{command}`" in before_after, command
    level = re.search(r"--level (\w+)", command)
    assert "at the default level `safe`" in before_after and level is None  # the same level on both sides


def _runtime_section() -> str:
    return README[README.index("## The runtime") : README.index("## Layout")]


def test_the_runtime_section_has_an_example_for_every_component():
    section = _runtime_section()
    for component in ("DevicePrefetcher", "Precision", "AsyncCheckpointer", "PersistentHooks", "linear_scan"):
        assert "import" in section and component in section, component
    # Neither distribution is on the package index: both install from the git repository.
    git = "git+https://github.com/perfmod/perfmod"
    assert f'pip install "perfmod-runtime @ {git}#subdirectory=packaging/runtime"' in section
    assert f'pip install "perfmod[runtime] @ {git}"' in section


def test_the_runtime_examples_import_what_runtime_has_and_run(tmp_path, monkeypatch):
    """Each example, with small stand-ins for the names it takes from the surrounding script."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def forward(self, x, y=None):
            out = self.layer(x)
            return out if y is None else torch.nn.functional.mse_loss(out, y)

    imports = re.findall(r"^from (runtime[\w.]*) import (.+)$", _runtime_section(), re.M)
    assert len(imports) >= 5
    for module, names in imports:
        loaded = importlib.import_module(module)
        for name in (n.strip() for n in names.split(",")):
            assert hasattr(loaded, name), f"{module}.{name}"
    monkeypatch.chdir(tmp_path)  # the checkpoint example writes ckpt.pt
    blocks = re.findall(r"```python\n(.*?)```", _runtime_section(), re.S)
    assert len(blocks) == 5
    for block in blocks:
        model = Model()
        names = {
            "DataLoader": DataLoader,
            "dataset": TensorDataset(torch.randn(8, 4), torch.randn(8, 2)),
            "device": torch.device("cpu"),
            "model": model,
            "x": torch.randn(3, 4),
            "y": torch.randn(3, 2),
            "loss_fn": torch.nn.functional.mse_loss,
            "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
            "steps": 2,
            "layer": model.layer,
            "record": lambda module, args, output: None,
            "mask": 2.0,
        }
        if "linear_scan" in block:
            names.update(
                a=torch.rand(2, 5, 3),
                x=torch.randn(2, 5, 3),
                q=torch.randn(1, 2, 5, 4),
                k=torch.randn(1, 2, 5, 4),
                v=torch.randn(1, 2, 5, 3),
                w=torch.rand(1, 2, 5, 4),
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pin_memory without an accelerator to pin for
            exec(compile(block.replace("    ...\n", ""), "README.md", "exec"), names)
    assert (tmp_path / "ckpt.pt").is_file()

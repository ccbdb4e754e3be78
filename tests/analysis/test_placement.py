"""Where a device expression points and where a tensor made to be trained lives,
followed through what functions return (of this file and of the project's modules),
what every caller passes to a parameter, and f-strings. Written from the programs a
training script is made of, not from the implementation."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst

from codemod.analysis.placement import Parameters
from codemod.analysis.values import Place
from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.result import Level

HEAD = "import torch\nimport torch.nn as nn\n"


def context(code: str, path: str = "<test>") -> FileContext:
    source = HEAD + textwrap.dedent(code)
    return FileContext(cst.parse_module(source), path, Settings(), source)


def moved_to(ctx: FileContext) -> cst.BaseExpression:
    """The device argument of the file's only `.to(...)`."""
    [call] = [c for c in ctx.index.find(cst.Call) if isinstance(c.func, cst.Attribute) and c.func.attr.value == "to"]
    return call.args[0].value


def optimizer_parameters(ctx: FileContext) -> Parameters:
    [call] = [c for c in ctx.index.find(cst.Call) if ctx.source(c.func) == "torch.optim.AdamW"]
    return ctx.training.placement.parameters(call.args[0].value, call)


def test_a_device_returned_by_a_function_of_the_file():
    ctx = context(
        """
        def get_device():
            if torch.cuda.is_available():
                return "cuda"
            return "cpu"

        device = get_device()
        model = nn.Linear(2, 2).to(device)
        """
    )
    assert ctx.training.device_types(moved_to(ctx)) == {"cuda", "cpu"}


def test_an_f_string_naming_a_cuda_device_with_a_rank():
    ctx = context(
        """
        import os
        rank = int(os.environ["LOCAL_RANK"])
        model = nn.Linear(2, 2).to(f"cuda:{rank}")
        """
    )
    assert ctx.training.device_types(moved_to(ctx)) == {"cuda"}
    # not every f-string is a device
    other = context('tag = "x"\nmodel = nn.Linear(2, 2).to(f"{tag}")\n')
    assert other.training.device_types(moved_to(other)) is None


DISTRIBUTED = """\
import torch


def local_rank():
    return 0


def get_device() -> str:
    if not torch.distributed.is_initialized():
        return "cuda" if torch.cuda.is_available() else "cpu"
    if torch.distributed.get_backend() == "gloo":
        return "cpu"
    return f"cuda:{local_rank()}"


def get_accelerator(name):
    return name


def pick(name):
    return name


XLA = pick("xla")
"""

TRAIN = """\
import torch
import torch.nn as nn
from pkg.distributed import get_device


def run_train(model, device):
    model = model.to(device)
    return torch.optim.AdamW(model.parameters())


if __name__ == "__main__":
    device = get_device()
    run_train(nn.Linear(2, 2), device)
"""


def _project(root: Path, files: dict[str, str]) -> Path:
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    for name, text in {"pkg/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_device_returned_by_a_function_of_another_project_module(tmp_path):
    root = _project(tmp_path, {"pkg/distributed.py": DISTRIBUTED, "pkg/train.py": TRAIN})
    path = root / "pkg" / "train.py"
    ctx = FileContext(cst.parse_module(TRAIN), str(path), Settings(), TRAIN)
    # the parameter `device` of run_train: its only caller passes what get_device() returns
    assert ctx.training.device_types(moved_to(ctx)) == {"cuda", "cpu"}
    # and PM402 fuses the optimizer: every device get_device() may return has fused kernels
    result = process_source(TRAIN.encode(), str(path), Settings(select=("PM402",), level=Level.NUMERIC))
    [finding] = result.findings
    assert finding.applied, finding.message
    assert "torch.optim.AdamW(model.parameters(), fused=True)" in result.new_source.decode()


def test_a_project_function_that_returns_its_argument_tells_nothing(tmp_path):
    train = TRAIN.replace("get_device", "get_accelerator").replace("get_accelerator()", "get_accelerator(NAME)")
    train = train.replace('if __name__ == "__main__":', 'NAME = input()\nif __name__ == "__main__":')
    root = _project(tmp_path, {"pkg/distributed.py": DISTRIBUTED, "pkg/train.py": train})
    path = root / "pkg" / "train.py"
    ctx = FileContext(cst.parse_module(train), str(path), Settings(), train)
    assert ctx.training.device_types(moved_to(ctx)) is None


def test_a_project_function_is_not_read_with_what_its_own_module_passes(tmp_path):
    train = TRAIN.replace("import get_device", "import pick").replace("get_device()", 'pick("cuda")')
    root = _project(tmp_path, {"pkg/distributed.py": DISTRIBUTED, "pkg/train.py": train})
    path = root / "pkg" / "train.py"
    ctx = FileContext(cst.parse_module(train), str(path), Settings(), train)
    assert ctx.training.device_types(moved_to(ctx)) is None  # not {"xla"}: that is another call's


def test_a_parameter_whose_callers_pass_tensors_on_different_devices_is_unknown_with_the_reason():
    ctx = context(
        """
        def train(init):
            weight = nn.Parameter(init)
            return torch.optim.AdamW([weight])

        train(torch.randn(4, device="cuda"))
        train(torch.randn(4))
        """
    )
    found = optimizer_parameters(ctx)
    assert found.sites is None
    assert ctx.source(found.untold) == "[weight]"
    assert found.why == "the calls on lines 8 and 9 pass `init` on different devices"


def test_a_parameter_whose_callers_agree_is_where_they_put_it():
    ctx = context(
        """
        def train(init):
            weight = nn.Parameter(init)
            return torch.optim.AdamW([weight])

        train(torch.randn(4, device="cuda"))
        train(torch.zeros(4, device="cuda"))
        """
    )
    found = optimizer_parameters(ctx)
    assert found.sites is not None
    [place] = found.placed
    assert place is not None and ctx.training.device_types(place.device) == {"cuda"}


def test_a_parameter_one_caller_passes_an_untold_tensor_names_that_call():
    ctx = context(
        """
        def train(init):
            weight = nn.Parameter(init)
            return torch.optim.AdamW([weight])

        train(torch.randn(4, device="cuda"))
        train(load_weights())
        """
    )
    found = optimizer_parameters(ctx)
    assert found.sites is None
    assert found.why == "the call on line 9 passes a tensor whose device cannot be told"


def test_a_device_parameter_of_a_function_the_file_never_calls_is_unknown_with_that_reason():
    ctx = context(
        """
        def optimize(model, device):
            model.to(device)
            return torch.optim.AdamW(model.parameters())

        def run_experiment(model, device):
            return optimize(model, torch.device(device))
        """
    )
    device = moved_to(ctx)
    assert ctx.training.device_types(device) is None
    why = ctx.training.placement.untold_device(device)
    assert why == "`device` is a parameter of `run_experiment`, which this file never calls"
    result = process_source(ctx.code.encode(), "<test>", Settings(select=("PM402",), level=Level.NUMERIC))
    [finding] = result.findings
    assert not finding.applied and why in finding.message


def test_a_device_an_option_gives_is_not_blamed_on_a_parameter():
    ctx = context(
        """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--device")
        args = parser.parse_args()
        model = nn.Linear(2, 2).to(args.device)
        """
    )
    device = moved_to(ctx)
    assert ctx.training.device_types(device) is None
    assert ctx.training.placement.untold_device(device) is None


# A function the experiments of the package call, never its own module (spd's
# `run_experiment(config, device)`), with the device each of them gets.
RUN = """\
import torch


def optimize(model, device):
    model.to(device)
    return torch.optim.AdamW(model.parameters())


def run_experiment(model, device):
    return optimize(model, torch.device(device))
"""

EXPERIMENT = """\
import sys

import torch.nn as nn

from pkg.distributed import get_device
from pkg.run import run_experiment

if __name__ == "__main__":
    run_experiment(nn.Linear(2, 2), DEVICE)
"""


def test_a_device_parameter_is_read_from_the_calls_of_the_modules_of_its_package(tmp_path):
    files = {
        "pkg/distributed.py": DISTRIBUTED,
        "pkg/run.py": RUN,
        "pkg/experiments/__init__.py": "",
        "pkg/experiments/tms.py": EXPERIMENT.replace("DEVICE", "get_device()"),
        "pkg/experiments/lm.py": EXPERIMENT.replace("DEVICE", '"cuda"'),
    }
    root = _project(tmp_path, files)
    path = root / "pkg" / "run.py"
    ctx = FileContext(cst.parse_module(RUN), str(path), Settings(), RUN)
    assert ctx.training.device_types(moved_to(ctx)) == {"cuda", "cpu"}
    result = process_source(RUN.encode(), str(path), Settings(select=("PM402",), level=Level.NUMERIC))
    [finding] = result.findings
    assert finding.applied and "AdamW(model.parameters(), fused=True)" in result.new_source.decode()
    # the experiments it was read from are what the result depends on
    assert {Path(stamp.path).name for stamp in result.dependencies} >= {"tms.py", "lm.py", "distributed.py"}


def test_one_call_elsewhere_with_an_untold_device_is_named_as_the_reason(tmp_path):
    files = {
        "pkg/distributed.py": DISTRIBUTED,
        "pkg/run.py": RUN,
        "pkg/tms.py": EXPERIMENT.replace("DEVICE", "get_device()"),
        "pkg/cli.py": EXPERIMENT.replace("DEVICE", "sys.argv[1]"),
    }
    root = _project(tmp_path, files)
    path = root / "pkg" / "run.py"
    ctx = FileContext(cst.parse_module(RUN), str(path), Settings(), RUN)
    device = moved_to(ctx)
    assert ctx.training.device_types(device) is None
    why = ctx.training.placement.untold_device(device)
    assert (
        why
        == "`device` is a parameter of `run_experiment`, and the call at pkg/cli.py:9 passes a device that cannot be told"
    )
    result = process_source(RUN.encode(), str(path), Settings(select=("PM402",), level=Level.NUMERIC))
    [finding] = result.findings
    assert not finding.applied and why in finding.message


def test_the_device_every_copy_names_is_one_name_a_value_can_be_given_in():
    ctx = context(
        """
        def train(loader, device):
            for x, y in loader:
                x, y = x.to(device), y.to(device)

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        other = torch.device("cpu")
        train(None, device)
        """
    )
    copies = [c for c in ctx.index.find(cst.Call) if isinstance(c.func, cst.Attribute) and c.func.attr.value == "to"]
    devices = [call.args[0].value for call in copies]
    last = list(ctx.module.body)[-1]
    # followed through the parameter to what the one call passes, and visible at the end
    assert ctx.training.placement.shared_device_name(devices, last) == "device"
    # not before it is bound, and not when one copy's device is unknown
    assert ctx.training.placement.shared_device_name(devices, list(ctx.module.body)[0]) is None
    assert ctx.training.placement.shared_device_name([*devices, None], last) is None


def test_a_parameter_made_of_a_view_or_reduction_of_a_cuda_tensor_is_on_cuda():
    ctx = context(
        """
        weight = nn.Parameter(torch.randn(4, 8, device="cuda").transpose(0, 1).abs())
        opt = torch.optim.AdamW([weight])
        """
    )
    found = optimizer_parameters(ctx)
    [place] = found.placed
    assert place is not None and ctx.training.device_types(place.device) == {"cuda"}


TRAINER_BUILDS_ITS_OPTIMIZER = """
class Trainer:
    def __init__(self, model, device):
        self.model = model
        self.device = device

    def create_optimizer(self):
        return torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def train(self, steps):
        self.model.to(self.device)
        optimizer = self.create_optimizer()
        for _ in range(steps):
            loss = self.model(torch.randn(4, 8, device=self.device)).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


Trainer(nn.Linear(8, 1), "cuda").train(3)
"""


def test_a_model_moved_before_every_call_of_the_method_that_builds_its_optimizer_is_placed_there():
    ctx = context(TRAINER_BUILDS_ITS_OPTIMIZER)
    [model] = optimizer_parameters(ctx).placed
    assert model is not None and model.places == frozenset({Place.CUDA})
    assert ctx.source(model.move) == "self.model.to(self.device)"


def test_a_method_also_called_before_the_move_or_from_outside_the_class_is_not_placed():
    before = TRAINER_BUILDS_ITS_OPTIMIZER.replace(
        "        self.model.to(self.device)\n        optimizer = self.create_optimizer()",
        "        self.create_optimizer()\n        self.model.to(self.device)\n        optimizer = self.create_optimizer()",
    )
    assert optimizer_parameters(context(before)).placed == [None]
    outside = TRAINER_BUILDS_ITS_OPTIMIZER + "Trainer(nn.Linear(8, 1), 'cuda').create_optimizer()\n"
    assert optimizer_parameters(context(outside)).placed == [None]

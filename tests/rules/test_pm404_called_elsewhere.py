"""PM404 and a step function whose returned `.item()` the fix would make a tensor: a
leading underscore does not keep the other modules of the package from importing it
(a smoke test, a notebook helper), so when one of them calls it, the return stays."""

import json

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.per_step_host_sync import PerStepHostSync

TRAIN = """\
import torch
import torch.nn.functional as F
from torch import nn


def _train_step(model, opt, x):
    loss = F.mse_loss(model(x), x)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(8, 8).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    running = 0.0
    for step in range(4):
        x = torch.randn(4, 8, device=device)
        running += _train_step(model, opt, x)
        if step % 2 == 1:
            print(f"loss {running / 2:.6f}")
            running = 0.0
"""
SMOKE = """\
import json

import torch
from torch import nn

from pm404_steppkg.train import _train_step

if __name__ == "__main__":
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    print(json.dumps({"first_step_loss": _train_step(model, opt, torch.randn(4, 8))}))
"""


def rewrite(tmp_path, smoke: str | None, level: Level) -> tuple[list, str]:
    package = tmp_path / "pm404_steppkg"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    train = package / "train.py"
    train.write_text(TRAIN)
    if smoke is not None:
        (package / "smoke.py").write_text(smoke)
    settings = Settings(select=("PM404",), level=level, root=tmp_path)
    result = process_source(TRAIN.encode(), str(train), settings, [PerStepHostSync])
    assert result.error is None, result.error
    return result.findings, result.new_source.decode()


def first_step_loss(train_source: str):
    """What the smoke module does with the step function: a JSON number."""
    import torch
    from torch import nn

    namespace = {"__name__": "pm404_steppkg.train"}
    exec(compile(train_source, "<train>", "exec"), namespace)
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return json.dumps({"first_step_loss": namespace["_train_step"](model, opt, torch.randn(4, 8))})


def test_a_private_step_function_another_module_calls_keeps_its_return(tmp_path):
    findings, rewritten = rewrite(tmp_path, SMOKE, Level.UNSAFE)
    assert [f.fixable for f in findings] == [False]
    assert "`_train_step` returns it, and " in findings[0].message and "calls it too" in findings[0].message
    assert first_step_loss(rewritten) == first_step_loss(TRAIN)


def test_a_private_step_function_no_other_module_calls_returns_the_tensor(tmp_path):
    findings, rewritten = rewrite(tmp_path, None, Level.SAFE)
    assert [(f.level, f.applied) for f in findings] == [(Level.SAFE, True)]
    assert "return loss.detach().double()" in rewritten


TRAINER = """\
import torch
import torch.nn.functional as F
from torch import nn


class Trainer:
    def __init__(self):
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = nn.Linear(8, 8).to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def _train_step(self, x):
        loss = F.mse_loss(self.model(x), x)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()

    def fit(self):
        running = 0.0
        for step in range(4):
            running += self._train_step(torch.randn(4, 8, device=self.device))
            if step % 2 == 1:
                print(f"loss {running / 2:.6f}")
                running = 0.0
"""
TRAINER_SMOKE = """\
import json

import torch

from pm404_steppkg.train import Trainer

print(json.dumps({"loss": Trainer()._train_step(torch.randn(4, 8))}))
"""


def test_a_private_step_method_another_module_calls_keeps_its_return(tmp_path):
    package = tmp_path / "pm404_steppkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(TRAINER)
    (package / "smoke.py").write_text(TRAINER_SMOKE)
    settings = Settings(select=("PM404",), level=Level.UNSAFE, root=tmp_path)
    result = process_source(TRAINER.encode(), str(package / "train.py"), settings, [PerStepHostSync])
    assert [f.fixable for f in result.findings] == [False]
    assert "which imports this module, calls a `._train_step(...)` too" in result.findings[0].message
    namespace = {"__name__": "pm404_steppkg.train"}
    exec(compile(result.new_source.decode(), "<train>", "exec"), namespace)
    assert isinstance(namespace["Trainer"]()._train_step(__import__("torch").randn(4, 8)), float)

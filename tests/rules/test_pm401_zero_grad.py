"""PM401: set-to-none gradient resets, checked against torch 2.13 on the CPU.

The fixtures under fixtures/rules/PM401/ are small training scripts whose
main() returns the trained model; they run before and after the rewrite, and
the parameters are compared bit for bit. They show the rule's level decision:
when every parameter gets a gradient in every step, set-to-none trains the
same even with AdamW, weight decay, accumulation and clipping; when one does
not (an auxiliary head trained every other step), Adam steps a zero gradient
but skips a None one, so the rule only offers that fix at level `unsafe`;
plain SGD steps a zero gradient as a no-op, so there the fix is `safe`.
"""

import contextlib
import inspect
import io
from pathlib import Path

import pytest
import torch

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.zero_filled_gradients import ZeroFilledGradients

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "PM401"


def trained_parameters(source: str) -> list[torch.Tensor]:
    namespace = {"__name__": "fixture"}
    exec(compile(source, "<fixture>", "exec"), namespace)
    with contextlib.redirect_stdout(io.StringIO()):
        model = namespace["main"]()
    return [p.detach().clone() for p in model.parameters()]


def identical(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after))


def findings(source: str, level: Level = Level.UNSAFE):
    result = process_source(source.encode(), "<test>", Settings(select=("PM401",), level=level), [ZeroFilledGradients])
    assert result.error is None, result.error
    return result


def test_plain_zero_grad_sets_to_none_by_default_in_this_torch():
    """Why a plain `zero_grad()` is not a finding."""
    for method in (torch.optim.Optimizer.zero_grad, torch.nn.Module.zero_grad):
        assert inspect.signature(method).parameters["set_to_none"].default is True
    model = torch.nn.Linear(2, 1)
    model(torch.randn(3, 2)).sum().backward()
    torch.optim.SGD(model.parameters(), lr=0.1).zero_grad()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("case", ["sgd_manual_zero", "adamw_accumulation.unsafe", "trainer_param_groups.unsafe"])
def test_rewrite_trains_bit_for_bit_when_every_parameter_gets_a_gradient(case):
    before = (FIXTURES / f"{case}.in.py").read_text()
    after = (FIXTURES / f"{case}.out.py").read_text()
    assert before != after
    assert identical(trained_parameters(before), trained_parameters(after))


def test_a_parameter_skipped_in_some_steps_trains_differently_with_adam():
    before = (FIXTURES / "skipped_head.unsafe.in.py").read_text()
    after = (FIXTURES / "skipped_head.unsafe.out.py").read_text()
    assert [f.level for f in findings(before).findings] == [Level.UNSAFE]
    assert not identical(trained_parameters(before), trained_parameters(after))


@pytest.mark.parametrize("case", ["weight_decay_set_after_build.unsafe", "momentum_group_added_after_build.unsafe"])
def test_momentum_or_weight_decay_set_after_the_sgd_is_built_makes_the_fix_unsafe(case):
    """Plain SGD as its constructor reads, given weight decay (`param_groups`) or momentum
    (`add_param_group`) afterwards: a zero-gradient step moves the skipped head."""
    before = (FIXTURES / f"{case}.in.py").read_text()
    [finding] = findings(before).findings
    assert finding.level is Level.UNSAFE and "after it is built" in finding.message
    assert not findings(before, Level.SAFE).findings[0].applied
    after = (FIXTURES / f"{case}.out.py").read_text()
    assert not identical(trained_parameters(before), trained_parameters(after))


PACKAGE_TRAIN = """\
import torch
from torch import nn

from pm401_gradpkg.util import grad_norm


def main(steps=4):
    torch.manual_seed(0)
    model = nn.ModuleDict({"body": nn.Linear(8, 1), "aux": nn.Linear(8, 1)})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    norms = []
    for step in range(steps):
        x = torch.randn(4, 8)
        opt.zero_grad(set_to_none=False)
        out = model["body"](x) + (model["aux"](x) if step % 2 == 0 else 0.0)
        out.pow(2).mean().backward()
        norms.append(grad_norm(model))
        opt.step()
    return norms
"""
PACKAGE_UTIL = """\
def grad_norm(model):
    return sum(p.grad.norm().item() ** 2 for p in model.parameters()) ** 0.5
"""


def test_a_grad_read_in_another_module_of_the_project_makes_the_fix_unsafe(tmp_path, monkeypatch):
    """`grad_norm` of the package's util module reads `.grad`, which set-to-none leaves
    None for the head that gets no gradient on odd steps: the rewrite would crash."""
    package = tmp_path / "pm401_gradpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "util.py").write_text(PACKAGE_UTIL)
    train = package / "train.py"
    train.write_text(PACKAGE_TRAIN)
    settings = Settings(select=("PM401",), level=Level.UNSAFE, root=tmp_path)
    result = process_source(PACKAGE_TRAIN.encode(), str(train), settings, [ZeroFilledGradients])
    [finding] = result.findings
    assert finding.level is Level.UNSAFE and "`grad_norm` (pm401_gradpkg/util.py:2)" in finding.message
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("sys.modules", dict(__import__("sys").modules))  # the package is forgotten after
    namespace: dict = {"__name__": "fixture"}
    exec(compile(PACKAGE_TRAIN, "<original>", "exec"), namespace)
    assert len(namespace["main"]()) == 4
    exec(compile(result.new_source.decode(), "<rewrite>", "exec"), namespace)
    with pytest.raises(AttributeError, match="NoneType"):
        namespace["main"]()


def test_plain_sgd_steps_a_zero_gradient_as_a_no_op_so_the_fix_is_safe():
    before = (
        (FIXTURES / "skipped_head.unsafe.in.py")
        .read_text()
        .replace("torch.optim.Adam(model.parameters(), lr=1e-2)", "torch.optim.SGD(model.parameters(), lr=1e-2)")
    )
    result = findings(before, Level.SAFE)
    assert [(f.level, f.applied) for f in result.findings] == [(Level.SAFE, True)]
    assert identical(trained_parameters(before), trained_parameters(result.new_source.decode()))


SGD_LOOP = """\
import torch
model = torch.nn.Linear(4, 1)
opt = {optimizer}
for step in range(3):
    loss = model(torch.randn(2, 4)).sum()
    loss.backward()
{between}    opt.step()
    opt.zero_grad(set_to_none=False)
"""


@pytest.mark.parametrize(
    "optimizer, between, level",
    [
        ("torch.optim.SGD(model.parameters(), lr=0.1)", "", Level.SAFE),
        ("torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.0, weight_decay=0)", "", Level.SAFE),
        ("torch.optim.SGD([{'params': model.parameters()}], lr=0.1)", "", Level.SAFE),
        ("torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)", "", Level.UNSAFE),
        ("torch.optim.SGD(model.parameters(), 0.1, 0.9)", "", Level.UNSAFE),
        ("torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-4)", "", Level.UNSAFE),
        ("torch.optim.SGD([{'params': model.parameters(), 'momentum': 0.9}], lr=0.1)", "", Level.UNSAFE),
        ("torch.optim.SGD(**{'params': model.parameters(), 'lr': 0.1})", "", Level.UNSAFE),
        ("torch.optim.Adam(model.parameters())", "", Level.UNSAFE),
        # a norm over the gradients runs over another list of tensors when one is None
        (
            "torch.optim.SGD(model.parameters(), lr=0.1)",
            "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
            Level.UNSAFE,
        ),
        # reading .grad after backward sees None for a parameter that got no gradient
        ("torch.optim.SGD(model.parameters(), lr=0.1)", "    print(model.weight.grad.norm())\n", Level.UNSAFE),
        # configured after it is built: only learning-rate writes keep a zero step a no-op
        ("torch.optim.SGD(model.parameters(), lr=0.1)\nfor g in opt.param_groups:\n    g['lr'] = 0.05", "", Level.SAFE),
        ("torch.optim.SGD(model.parameters(), lr=0.1)\nopt.param_groups[0]['lr'] *= 0.5", "", Level.SAFE),
        ("torch.optim.SGD(model.parameters(), lr=0.1)\nopt.param_groups[0]['momentum'] = 0.9", "", Level.UNSAFE),
        (
            "torch.optim.SGD(model.parameters(), lr=0.1)\nopt.add_param_group({'params': [], 'lr': 0.01})",
            "",
            Level.SAFE,
        ),
        ("torch.optim.SGD(model.parameters(), lr=0.1)\nopt.load_state_dict(torch.load('opt.pt'))", "", Level.UNSAFE),
        (
            "torch.optim.SGD(model.parameters(), lr=0.1)\nsched = torch.optim.lr_scheduler.StepLR(opt, 2)",
            "",
            Level.SAFE,
        ),
        # CyclicLR cycles each group's momentum by default
        (
            "torch.optim.SGD(model.parameters(), lr=0.1)\nsched = torch.optim.lr_scheduler.CyclicLR(opt, 0.01, 0.1)",
            "",
            Level.UNSAFE,
        ),
        ("torch.optim.SGD(model.parameters(), lr=0.1)\nconfigure(opt)", "", Level.UNSAFE),
        # torch.autograd.grad is a function, not a read of a .grad
        (
            "torch.optim.SGD(model.parameters(), lr=0.1)",
            "    g = torch.autograd.grad(model.bias.sum(), model.bias)\n",
            Level.SAFE,
        ),
    ],
)
def test_level_follows_what_a_zero_gradient_step_would_do(optimizer, between, level):
    result = findings(SGD_LOOP.format(optimizer=optimizer, between=between))
    assert [(f.level, f.fixable) for f in result.findings] == [(level, True)]


def test_reset_at_the_end_of_the_loop_is_checked_against_reads_at_its_start():
    source = SGD_LOOP.format(optimizer="torch.optim.SGD(model.parameters(), lr=0.1)", between="").replace(
        "for step in range(3):\n", "for step in range(3):\n    model.weight.grad.mul_(0.5)\n"
    )
    [finding] = findings(source).findings
    assert not finding.fixable and "read at line 5 before the next backward()" in finding.message


@pytest.mark.parametrize(
    "step_body, fixable",
    [
        ("for p in self.params:\n            p.data.add_(p.grad.data, alpha=-0.1)\n", False),
        (
            "for p in self.params:\n            if p.grad is None:\n                continue\n"
            "            p.data.add_(p.grad, alpha=-0.1)\n",
            True,
        ),
    ],
)
def test_a_custom_optimizer_must_check_for_none_grads(step_body, fixable):
    source = (
        "import torch\n"
        "class Plain(torch.optim.Optimizer):\n"
        "    def __init__(self, params):\n"
        "        self.params = list(params)\n"
        "        super().__init__(self.params, {})\n"
        "    def step(self):\n"
        f"        {step_body}"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = Plain(model.parameters())\n"
        "for step in range(3):\n"
        "    model(torch.randn(2, 4)).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad(set_to_none=False)\n"
    )
    [finding] = findings(source).findings
    assert finding.fixable is fixable
    if not fixable:
        assert "without a None check" in finding.message

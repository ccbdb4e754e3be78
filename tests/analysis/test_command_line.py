"""The command-line options a script reads through `args` when the namespace is
parsed in a helper of the file (`def get_args(): ...; return p.parse_args()`,
`parse_known_args()[0]`) and handed on as a parameter: PM402 reads the option's
`choices=` (and its default), PM204 the option's default, as they do when
`parse_args()` is called inline."""

from __future__ import annotations

import sys

import libcst as cst
import torch

from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules.default_batch_size_of_one import DefaultBatchSizeOfOne
from codemod.rules.unfused_optimizer import UnfusedOptimizer

PARSER = """\
import argparse

import torch
import torch.nn as nn


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--optim", default="AdamW", choices=["Adam", "AdamW"])
    p.add_argument("--steps", type=int, default=3)
    return p.parse_args()
"""

TRAIN = """

def main():
    args = get_args()
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    opt = getattr(torch.optim, args.optim)(model.parameters(), lr=1e-2)
    losses = []
    for step in range(args.steps):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
"""


def run(source: str, rule) -> tuple[list, str]:
    result = process_source(source.encode(), "train.py", Settings(level=Level.UNSAFE), [rule])
    assert result.error is None, result.error
    new = result.new_source.decode() if result.new_source is not None else source
    return result.findings, new


def losses_of(source: str, monkeypatch) -> list[float]:
    monkeypatch.setattr(sys, "argv", ["train.py"])
    namespace: dict = {"__name__": "train"}
    exec(compile(source, "train.py", "exec"), namespace)
    return namespace["main"]()


def test_choices_are_read_through_a_helper_that_returns_parse_args_and_the_rewrite_trains_alike(monkeypatch):
    source = PARSER + TRAIN
    findings, new = run(source, UnfusedOptimizer)
    assert [f.code for f in findings] == ["PM402"], [f.message for f in findings]
    assert findings[0].applied, findings[0].message
    assert "fused=True" in new, new
    before, after = losses_of(source, monkeypatch), losses_of(new, monkeypatch)
    assert torch.allclose(torch.tensor(before), torch.tensor(after), rtol=1e-4, atol=1e-6), (before, after)


def test_an_option_without_choices_is_reported_through_the_helper():
    source = (PARSER + TRAIN).replace(', choices=["Adam", "AdamW"]', "")
    findings, new = run(source, UnfusedOptimizer)
    assert [f.code for f in findings] == ["PM402"], [f.message for f in findings]
    assert not findings[0].applied and new == source
    assert "`--optim` has no `choices=`" in findings[0].message, findings[0].message


def test_parse_known_args_and_a_name_returned_by_the_helper():
    source = PARSER.replace("    return p.parse_args()\n", "    args = p.parse_known_args()[0]\n    return args\n")
    findings, _ = run(source + TRAIN, UnfusedOptimizer)
    assert [f.code for f in findings] == ["PM402"] and findings[0].applied, [f.message for f in findings]


def test_the_namespace_handed_to_a_function_as_a_parameter():
    source = (
        PARSER
        + TRAIN.replace("def main():\n    args = get_args()\n", "def main(args):\n")
        + ("\n\nif __name__ == '__main__':\n    main(get_args())\n")
    )
    findings, _ = run(source, UnfusedOptimizer)
    assert [f.code for f in findings] == ["PM402"] and findings[0].applied, [f.message for f in findings]


def test_the_optimizer_class_bound_to_a_name_before_it_is_called():
    source = (PARSER + TRAIN).replace(
        "    opt = getattr(torch.optim, args.optim)(model.parameters(), lr=1e-2)\n",
        "    opt_cls = getattr(torch.optim, args.optim)\n    opt = opt_cls(model.parameters(), lr=1e-2)\n",
    )
    findings, new = run(source, UnfusedOptimizer)
    assert [f.code for f in findings] == ["PM402"] and findings[0].applied, [f.message for f in findings]
    assert "opt_cls(model.parameters(), lr=1e-2, fused=True)" in new, new


def parses_get_args(source: str) -> bool:
    source += "\nargs = get_args()\n"
    module = cst.parse_module(source)
    context = FileContext(module, "train.py", Settings(), source)
    return context.command_line.parses(module.body[-1].body[0].value)


def test_a_helper_that_may_return_something_else_is_not_the_namespace():
    assert parses_get_args(PARSER)
    assert not parses_get_args(
        PARSER.replace(
            "    return p.parse_args()\n", "    if p.prog:\n        return p.parse_args()\n    return load_config()\n"
        )
    )
    assert not parses_get_args(PARSER.replace("    return p.parse_args()\n", "    return p\n"))


BATCH = """\
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--per_device_train_batch_size", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return ap.parse_args()


def main():
    args = parse()
    ds = TensorDataset(torch.randn(64, 16), torch.randint(0, 3, (64,)))
    loader = DataLoader(ds, batch_size=args.per_device_train_batch_size)
    model = nn.Linear(16, 3).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(args.device), y.to(args.device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_batch_size_default_of_one_read_through_a_helper():
    findings, _ = run(BATCH, DefaultBatchSizeOfOne)
    assert [f.code for f in findings] == ["PM204"], [f.message for f in findings]
    assert "`args.per_device_train_batch_size`" in findings[0].message
    findings, _ = run(BATCH.replace("default=1)", "default=32)"), DefaultBatchSizeOfOne)
    assert findings == []


def test_an_option_without_choices_behind_a_name_is_reported_with_its_flag():
    source = (
        (PARSER + TRAIN)
        .replace(', choices=["Adam", "AdamW"]', "")
        .replace(
            "    opt = getattr(torch.optim, args.optim)(model.parameters(), lr=1e-2)\n",
            "    opt_cls = getattr(torch.optim, args.optim)\n    opt = opt_cls(model.parameters(), lr=1e-2)\n",
        )
    )
    findings, new = run(source, UnfusedOptimizer)
    assert [f.code for f in findings] == ["PM402"] and not findings[0].applied and new == source
    assert "`--optim` has no `choices=`" in findings[0].message, findings[0].message

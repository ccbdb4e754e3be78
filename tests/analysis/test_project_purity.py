"""Purity of the functions of the project's other modules: a function imported from
another module is pure when the rules that make a function of the calling file pure
hold in its own module. Each test writes a two-module package into a temporary folder;
the rewrites are run against their originals and must train bit for bit the same."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import process_source

TEXT = """\
import random

from pkg.base import squeeze

SEP = " "
seen = []


def split_prompt(text, marker):
    head = text.rstrip()
    if marker and head.endswith(marker):
        return head[: -len(marker)].rstrip(), marker
    return text, ""


def first_words(text, n):
    return squeeze(split_prompt(text, "Answer:")[0]).split()[:n]


def word_lengths(text, n):
    return [len(word) for word in first_words(text, n)]


def noisy(text, n):
    return [len(word) for word in text.split() if random.random() < 0.5][:n]


def remembered(text, n):
    seen.append(text)
    return [len(word) for word in text.split()][:n]


def joined(text, n):
    return [len(word) for word in SEP.join(text.split()).split()][:n]
"""

BASE = """\
def squeeze(text):
    return " ".join(text.split())
"""


def _project(root: Path, train: str, text: str = TEXT) -> Path:
    files = {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/text.py": text, "pkg/train.py": train}
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content))
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    return root / "pkg" / "train.py"


CALLS = """\
from pkg import text
from pkg.text import first_words, joined, noisy, remembered, split_prompt, word_lengths

a = split_prompt("q Answer:", "Answer:")
b = first_words("q  r Answer:", 2)
c = word_lengths("q r", 2)
d = text.word_lengths("q r", 2)
e = noisy("q r", 2)
f = remembered("q r", 2)
g = joined("q r", 2)
h = print("q r")
"""


def test_a_function_of_another_module_is_pure_by_the_rules_of_its_own_module(tmp_path):
    train = _project(tmp_path, CALLS)
    context = FileContext.of_source(train.read_text(), path=str(train))
    pure = {
        context.source(assign.targets[0].target): context.purity.pure_call(assign.value)
        for assign in context.index.find(cst.Assign)
    }
    assert pure == {
        "a": True,  # string methods and builtins only
        "b": True,  # through a pure function of its module and one of a third module
        "c": True,
        "d": True,  # called through the module's name
        "e": False,  # draws random numbers
        "f": False,  # changes a list of its module
        "g": False,  # reads a variable of its module, which may change between calls
        "h": False,
    }


def test_a_function_of_another_module_that_calls_itself_is_not_taken_for_pure(tmp_path):
    text = TEXT + "\n\ndef shorten(text):\n    return shorten(text[1:]) if len(text) > 3 else text\n"
    train = _project(tmp_path, "from pkg.text import shorten\n\nx = shorten('abcdef')\n", text=text)
    context = FileContext.of_source(train.read_text(), path=str(train))
    (call,) = [c for c in context.index.find(cst.Call) if context.source(c.func) == "shorten"]
    assert not context.purity.pure_call(call)


LOOP = """\
import torch

from pkg.text import {helper}

torch.manual_seed(0)
model = torch.nn.Embedding(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for step in range(4):
    lengths = torch.tensor({helper}("the  quick brown fox Answer:", 3))
    loss = model(lengths).pow(2).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
"""


def _losses(source: str) -> list[float]:
    scope: dict = {}
    exec(compile(source, "train.py", "exec"), scope)
    return scope["losses"]


@pytest.fixture
def project_imports():
    """The temporary project's `pkg`: imported by the test, gone after it."""

    def drop():
        for name in [n for n in sys.modules if n.split(".")[0] == "pkg"]:
            del sys.modules[name]

    drop()
    yield
    drop()


@pytest.mark.usefixtures("project_imports")
def test_a_pure_function_of_another_module_given_the_same_arguments_moves_out_of_the_loop(tmp_path, monkeypatch):
    train = _project(tmp_path, LOOP.format(helper="word_lengths"))
    result = process_source(train.read_bytes(), str(train), Settings(select=("PM203",)))
    assert result.changed and result.error is None
    new = result.new_source.decode()
    hoisted = '    lengths = torch.tensor(word_lengths("the  quick brown fox Answer:", 3))\n'
    assert hoisted in train.read_text() and hoisted not in new
    assert new.index(hoisted.strip()) < new.index("for step in range(4):")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _losses(new) == _losses(train.read_text())


@pytest.mark.parametrize("helper", ["noisy", "remembered", "joined"])
def test_an_impure_function_of_another_module_stays_in_the_loop(tmp_path, helper):
    train = _project(tmp_path, LOOP.format(helper=helper))
    result = process_source(train.read_bytes(), str(train), Settings(select=("PM203",)))
    assert not result.changed

"""Files written for a newer Python than the one perfmod runs on (PEP 695 type
parameters, PEP 701 f-strings, read by libcst's grammar under Python 3.10 and
3.11) are analysed and fixed; what no Python accepts is still an error; and the
engine never hands back a rewrite that does not compile, judged by the running
Python where it reads the file and by libcst's grammar where it does not."""

from __future__ import annotations

import sys

import libcst as cst
import pytest

from codemod import syntax
from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level, Rule
from tests.cli_support import catalogue, perfmod, write  # noqa: F401 (catalogue is a fixture)

RUNNING = sys.version_info[:2]
PY = f"Python {RUNNING[0]}.{RUNNING[1]}"

LOOP = 'device = torch.device("cuda")\nfor step in range(10):\n    x = torch.randn(4, pin_memory=True)\n    y = x.to(device)\n'

# (what, the Python whose syntax it is, the code): each is followed by LOOP and its PM101 fix.
NEWER = [
    ("type alias", (3, 12), "type Batch = list[torch.Tensor]\n"),
    ("generic alias", (3, 12), "type Pair[T] = tuple[T, T]\n"),
    ("generic function", (3, 12), "def first[T](items: list[T]) -> T:\n    return items[0]\n"),
    ("generic class", (3, 12), "class Box[T: (int, float)]:\n    value: T\n"),
    ("variadic generics", (3, 12), "def apply[*Ts, **P](f, *args: *Ts) -> None:\n    pass\n"),
    ("same quotes in an f-string", (3, 12), 'config = {"name": "run"}\nlabel = f"{config["name"]}"\n'),
    ("nested f-strings, same quotes", (3, 12), 'label = f"{f"{1 + 1}"}"\n'),
    ("backslash in an f-string", (3, 12), 'label = f"{"\\n".join(["a", "b"])}"\n'),
    ("comment in an f-string", (3, 12), 'label = f"""{1 + 1  # two\n}"""\nother = f"{1\n+ 1}"\n'),
    ("type parameter default", (3, 13), "def make[T = int](value: T) -> T:\n    return value\n"),
]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("what, version, code", NEWER, ids=[n[0] for n in NEWER])
def test_newer_syntax_names_the_python_it_needs(what, version, code):
    found = syntax.newer_syntax(cst.parse_module("import torch\n" + code + LOOP))
    if version <= RUNNING:
        assert found is None
    else:
        assert found is not None and found.version == version, found
        assert str(found).endswith(f"(Python {version[0]}.{version[1]})")


def test_code_of_the_running_python_needs_none():
    code = (
        'import torch\nlabel = f"{1 + 1!r:>{4}}" f\'{"x"}\'\nwide = f"""{\n1}"""\n'
        "try:\n    pass\nexcept (ValueError, TypeError):\n    pass\n"
        "def first(items):\n    return items[0]\n"
    )
    assert syntax.newer_syntax(cst.parse_module(code)) is None
    assert syntax.newer_syntax_of(b"x = (\n") is None  # what libcst cannot read says nothing either


def test_an_f_string_nested_too_deeply_for_any_python_is_not_newer_syntax():
    # libcst reads it; Python 3.12 keeps the limit on nested format specs, as 3.11 had it.
    assert syntax.newer_syntax(cst.parse_module('f"{x:{y:{z}}}"\n')) is None


@pytest.mark.usefixtures("catalogue")
@pytest.mark.parametrize("what, version, code", NEWER, ids=[n[0] for n in NEWER])
def test_a_file_with_newer_syntax_is_analysed_and_fixed(tmp_path, what, version, code):
    source = "import torch\n" + code + LOOP
    path = write(tmp_path / "train.py", source)
    line = source.count("\n")  # `y = x.to(device)` is the last line
    checked = perfmod("check", "train.py", "--no-cache")
    assert checked.stderr == ""
    assert checked.exit_code == 1
    assert checked.stdout.startswith(f"train.py:{line}:9: PM101 [*]")
    applied = perfmod("apply", "train.py", "--no-cache")
    assert applied.stderr == "" and applied.exit_code == 0
    assert applied.stdout.startswith("Fixed train.py: 1 fix (PM101)")
    assert path.read_text() == source.replace("x.to(device)", "x.to(device, non_blocking=True)")
    again = perfmod("check", "train.py")
    assert again.exit_code == 0 and again.stdout.startswith("No findings")


@pytest.mark.usefixtures("catalogue")
def test_a_file_no_python_accepts_is_still_an_error(tmp_path):
    write(tmp_path / "empty_field.py", 'import torch\nlabel = f"{}"\n' + LOOP)
    write(tmp_path / "literal.py", "import torch\n1 = x\n" + LOOP)
    result = perfmod("check", ".", "--no-cache")
    assert result.exit_code == 2
    errors = result.stderr.splitlines()
    assert len(errors) == 2
    assert errors[0].startswith("empty_field.py:2:") and ": error: syntax error" in errors[0]
    assert errors[1].startswith("literal.py:2:") and ": error: syntax error" in errors[1]


@pytest.mark.usefixtures("catalogue")
def test_a_syntax_error_after_newer_syntax_is_placed_where_it_is(tmp_path):
    """The running Python stops at the newer syntax on line 2; the error is on line 3."""
    write(tmp_path / "train.py", "import torch\ntype Batch = list[torch.Tensor]\nx = = 2\n" + LOOP)
    result = perfmod("check", "train.py", "--no-cache")
    assert result.exit_code == 2
    assert result.stderr.startswith("train.py:3:") and ": error: syntax error" in result.stderr


@pytest.mark.usefixtures("catalogue")
def test_a_compiler_error_in_a_file_of_the_running_python_is_still_an_error(tmp_path):
    source = "import torch\n" + LOOP + "return y\n"
    write(tmp_path / "train.py", source)
    result = perfmod("apply", "train.py", "--no-cache")
    assert result.exit_code == 2
    assert result.stderr == f"train.py:6:1: error: {PY} rejects this file: 'return' outside function\n"
    assert (tmp_path / "train.py").read_text() == source


# -- the engine's rewrite must compile ------------------------------------------------------------


def _copy_call(node: cst.Call) -> bool:
    return isinstance(node.func, cst.Attribute) and node.func.attr.value == "to"


class AwaitsTheCopy(Rule):
    """Test only: `x.to(device)` becomes `await x.to(device)`, at the top level: libcst's
    grammar has it, the compiler refuses it."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM998", "test-awaits-the-copy", Level.SAFE, "awaits", "none"

    def visit_Call(self, node: cst.Call) -> None:
        if _copy_call(node) and not isinstance(self.context.parents.get(node), cst.Await):  # once, as a rule does
            self.report(node, replacement=cst.Await(node))


class ReadsAnAttributeOfAnInteger(Rule):
    """Test only: `x.to(device)` becomes `1.real`, which neither Python nor libcst reads
    (a float `1.`, then a name)."""

    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM997", "test-integer-attribute", Level.SAFE, "reads 1.real", "none"

    def visit_Call(self, node: cst.Call) -> None:
        if _copy_call(node):
            self.report(node, replacement=cst.Attribute(cst.Integer("1"), cst.Name("real")))


@pytest.mark.parametrize("rule, why", [(AwaitsTheCopy, "'await' outside function"), (ReadsAnAttributeOfAnInteger, "")])
def test_a_rewrite_the_running_python_refuses_is_not_handed_back(rule, why):
    source = ("import torch\n" + LOOP).encode()
    result = process_source(source, "train.py", Settings(), rules=[rule])
    assert result.new_source is None and result.findings == []
    assert result.error.startswith(
        f"train.py:1:1: error: internal error, file left unchanged (the rewrite would not compile: {PY}: {why}"
    )
    assert "on line 5 of the rewrite" in result.error


@pytest.mark.skipif(RUNNING >= (3, 12), reason="the running Python reads PEP 695: its compiler judges")
def test_a_rewrite_of_newer_syntax_is_judged_by_libcsts_grammar():
    source = ("import torch\ntype Batch = list[torch.Tensor]\n" + LOOP).encode()
    broken = process_source(source, "train.py", Settings(), rules=[ReadsAnAttributeOfAnInteger])
    assert broken.new_source is None and broken.findings == []
    assert "(the rewrite would not compile: libcst: " in broken.error
    assert "on line 6 of the rewrite" in broken.error
    # What only the compiler would refuse is beyond the grammar: the Python the file is for must tell.
    awaited = process_source(source, "train.py", Settings(), rules=[AwaitsTheCopy])
    assert awaited.error is None and b"y = await x.to(device)" in awaited.new_source

"""Deep but valid Python is analysed (a big stack and recursion limit); what
is still too deep gets a note, not an error; what CPython rejects is an
error, never "No findings"."""

import sys

import pytest

from codemod import worker
from tests.cli_support import FIXABLE, catalogue, perfmod, write  # noqa: F401 (catalogue is a fixture)

pytestmark = pytest.mark.usefixtures("catalogue")

PY = f"Python {sys.version_info[0]}.{sys.version_info[1]}"  # the interpreter whose compiler rejects
CHAIN = FIXABLE + "total = " + " + ".join(f"a{i}" for i in range(500)) + "\n"
NESTED = FIXABLE + "value = " + "f(" * 150 + "1" + ")" * 150 + "\n"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_deep_but_valid_code_is_analysed(tmp_path, jobs):
    write(tmp_path / "chain.py", CHAIN)
    write(tmp_path / "nested.py", NESTED)
    result = perfmod("check", ".", "-j", jobs, "--no-cache")
    assert result.stderr == ""
    assert result.exit_code == 1  # the PM101 fix in each
    assert result.stdout.splitlines()[:2] == [
        "chain.py:4:5: PM101 [*] host-to-device copy blocks the CPU; pass non_blocking=True",
        "nested.py:4:5: PM101 [*] host-to-device copy blocks the CPU; pass non_blocking=True",
    ]


def test_deep_code_from_stdin_too():
    result = perfmod("apply", "-", input=CHAIN.encode())
    assert result.exit_code == 0, result.stderr
    assert "x.to(device, non_blocking=True)" in result.stdout


def test_code_too_deep_for_perfmod_gets_a_note_and_exit_0(tmp_path, monkeypatch):
    monkeypatch.setattr(worker, "RECURSION_LIMIT", 1000)  # what the big stack normally lifts
    sys.setrecursionlimit(1000)  # process-wide, and torch.compile raises it: start from Python's default
    deep = write(tmp_path / "deep.py", FIXABLE + "total = " + " + ".join(f"a{i}" for i in range(2000)) + "\n")
    write(tmp_path / "fine.py", FIXABLE)
    result = perfmod("apply", ".")
    assert result.exit_code == 0
    assert result.stderr == (
        "deep.py:1:1: note: too deep to analyse (nested deeper than perfmod's recursion limit "
        "of 1000); left unchanged\n"
    )
    assert result.stdout == (
        "Fixed fine.py: 1 fix (PM101)\nApplied 1 fix to 1 file (2 files checked, 1 too deep to analyse).\n"
    )
    assert deep.read_text().startswith(FIXABLE)
    again = perfmod("check", "deep.py")  # the same from the cache
    assert again.exit_code == 0 and again.stderr == result.stderr
    assert again.stdout == "No findings (1 file checked, 1 too deep to analyse).\n"


@pytest.mark.parametrize(
    "source, message",
    [
        (
            "".join("    " * i + f"for i{i} in range(2):\n" for i in range(25)) + "    " * 25 + "pass\n",
            "blocks.py:21:81: error: {PY} rejects this file: too many statically nested blocks",
        ),
        (FIXABLE + "return y\n", "blocks.py:5:1: error: {PY} rejects this file: 'return' outside function"),
        (
            "total = " + " + ".join(f"a{i}" for i in range(6000)) + "\n",
            "blocks.py:1:1: error: {PY} rejects this file: nested too deeply for Python to compile (RecursionError "
            "at its default recursion limit)",
        ),
    ],
)
def test_code_cpython_rejects_is_an_error_never_no_findings(tmp_path, source, message):
    write(tmp_path / "blocks.py", source)
    result = perfmod("check", "blocks.py")
    assert result.exit_code == 2
    assert result.stderr == message.format(PY=PY) + "\n"
    assert result.stdout == (
        "No findings in the files that could be checked (1 file checked, 1 error); "
        "fix the errors above and run perfmod again.\n"
    )
    assert perfmod("apply", "blocks.py").exit_code == 2
    assert (tmp_path / "blocks.py").read_text() == source

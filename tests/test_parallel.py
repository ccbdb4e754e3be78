"""`make test` runs the suite in two pytest processes (tests/parallel.py): each module
runs once, in one of them, and a failure in either fails the run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PASSING = "import pytest\n\n\n@pytest.mark.parametrize('k', range({n}))\ndef test_{name}(k):\n    pass\n"


def suite(folder: Path, failing: str | None = None) -> list[str]:
    """Four small test modules in `folder` (one test of `failing` fails)."""
    names = ["alpha", "beta", "gamma", "delta"]
    for name in names:
        text = PASSING.format(n=3, name=name)
        if name == failing:
            text += f"\n\ndef test_{name}_fails():\n    assert False\n"
        (folder / f"test_{name}.py").write_text(text)
    return [str(folder / f"test_{name}.py") for name in names]


def run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    # tests/conftest.py as a plugin: it holds --claims, and the modules lie outside tests/.
    command = [sys.executable, "-m", "tests.parallel", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    command += ["--rootdir", str(folder), *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_each_test_runs_once_in_one_of_the_processes(tmp_path):
    done = run(tmp_path, "-q", "-rA", *suite(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"^PASSED \S*?(test_\w+\.py::\S+)", done.stdout, re.M)
    assert sorted(ran) == sorted(
        f"test_{name}.py::test_{name}[{k}]" for name in ("alpha", "beta", "gamma", "delta") for k in range(3)
    )
    assert "tests run in process 2 of 2" in done.stdout
    assert done.stdout.rstrip().endswith("2 pytest processes: all passed")


def test_a_failing_test_in_either_process_fails_the_run(tmp_path):
    for failing in ("alpha", "delta"):  # the first module and the last: the two processes' first claims
        (tmp_path / failing).mkdir()
        done = run(tmp_path / failing, "-q", *suite(tmp_path / failing, failing))
        assert done.returncode == 1, done.stdout[-3000:]
        assert f"test_{failing}_fails" in done.stdout
        assert "2 pytest processes: 1 failed" in done.stdout


def test_with_no_paths_the_processes_take_the_suite_from_the_configuration():
    command = [sys.executable, "-m", "tests.parallel", "-q", "--collect-only", "-p", "no:cacheprovider"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 pytest processes: all passed" in done.stdout

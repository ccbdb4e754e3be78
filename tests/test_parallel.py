"""`make test` runs the suite in two pytest processes (tests/parallel.py): each module
runs once, in one of them, and a failure in either fails the run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import spread_long_units
from tests.parallel import PROCESSES_VARIABLE

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


SHARED = """import pytest


@pytest.fixture(scope="module")
def setup_log():
    with open({log!r}, "a") as log:
        log.write("set up\\n")


@pytest.mark.parametrize("k", range(6))
def test_shared(setup_log, k):
    pass
"""


def test_a_module_whose_tests_share_a_fixture_runs_in_one_process(tmp_path):
    log = tmp_path / "setups.txt"
    (tmp_path / "test_shared.py").write_text(SHARED.format(log=str(log)))
    done = run(tmp_path, "-q", "-rA", str(tmp_path / "test_shared.py"), *suite(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:]
    assert len(re.findall(r"^PASSED \S*test_shared\.py::test_shared", done.stdout, re.M)) == 6
    assert log.read_text() == "set up\n"  # once: the six tests ran in one process


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


def test_a_process_goes_on_past_what_another_claimed_into_another_folder(tmp_path):
    """a/test_one, a/test_two (claimed by another process), c/test_three: this process runs
    the first and the third, and tears the folder a down in between."""
    tests = {"a/test_one.py": "test_one", "a/test_two.py": "test_two", "c/test_three.py": "test_three"}
    for path, name in tests.items():
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(f"def {name}():\n    pass\n")
    claims = tmp_path / "claims"
    claims.mkdir()
    (claims / hashlib.sha1(b"a/test_two.py::test_two").hexdigest()).touch()
    command = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", "-rA"]
    command += [f"--claims={claims}", "--rootdir", str(tmp_path), "a", "c"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.findall(r"^PASSED (\S+)", done.stdout, re.M) == ["a/test_one.py::test_one", "c/test_three.py::test_three"]


UNITS = [f"test_{name}.py::test_{name}[{k}]" for name in ("alpha", "beta", "gamma", "delta") for k in range(3)]


def test_a_long_test_that_would_end_after_the_others_is_claimed_earlier(tmp_path, monkeypatch):
    """delta[2] takes 20 s of the suite's 31: claimed last, one of two processes would run it
    alone for most of the run. It goes halfway into the tests before it; the others keep
    their order. With one process, or no durations file, nothing moves."""
    seconds = dict.fromkeys(UNITS, 1.0) | {"test_delta.py::test_delta[2]": 20.0}
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps(seconds))
    units = [(key, []) for key in UNITS]
    monkeypatch.setenv(PROCESSES_VARIABLE, "2")
    order = [key for key, _ in spread_long_units(units, durations)]
    assert order == [*UNITS[:6], "test_delta.py::test_delta[2]", *UNITS[6:11]]
    assert spread_long_units(units, tmp_path / "missing.json") == units
    monkeypatch.setenv(PROCESSES_VARIABLE, "1")
    assert spread_long_units(units, durations) == units


def test_each_process_records_what_its_units_took(tmp_path):
    log = tmp_path / "setups.txt"
    (tmp_path / "test_shared.py").write_text(SHARED.format(log=str(log)))
    (tmp_path / "claims").mkdir()
    (tmp_path / "seconds").mkdir()
    command = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q"]
    command += [f"--claims={tmp_path / 'claims'}", f"--record-durations={tmp_path / 'seconds'}"]
    command += ["--rootdir", str(tmp_path), "test_shared.py", "test_alpha.py"]
    suite(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    (recorded,) = (tmp_path / "seconds").glob("*.json")
    seconds = json.loads(recorded.read_text())
    # the module whose tests share a fixture is one unit; every other test is its own
    assert sorted(seconds) == [
        "test_alpha.py::test_alpha[0]",
        "test_alpha.py::test_alpha[1]",
        "test_alpha.py::test_alpha[2]",
        "test_shared.py",
    ]
    assert all(value >= 0 for value in seconds.values())


def test_recorded_durations_replace_the_units_run_and_keep_the_others(tmp_path, monkeypatch):
    import tests.parallel as parallel

    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"not_run": 5.0, "now_short": 3.0}))
    monkeypatch.setattr(parallel, "DURATIONS", durations)
    monkeypatch.setattr(parallel, "REPO", tmp_path)
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "1.json").write_text(json.dumps({"now_short": 0.2, "new": 7.04}))
    parallel.record_durations(tmp_path / "parts")
    assert json.loads(durations.read_text()) == {"new": 7.0, "not_run": 5.0}

"""Ctrl-C: a real SIGINT to a real `perfmod apply` over a folder of many
files stops it within a second or two at any -j, exit status 130, with the
files rewritten until then listed, and nothing written after it."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cli_support import FIXABLE, FIXED, process_env, write

PERFMOD = [sys.executable, "-c", "from codemod.entry import main; main()"]  # the console script's code

FILES = 200  # about 10 s of work at -j 1 on the test machine: the interrupt comes long before the end
LATENCY_LIMIT = 2.0  # seconds from SIGINT to exit


def _rewritten(folder) -> set[str]:
    return {path.name for path in folder.glob("*.py") if path.read_text() == FIXED}


@pytest.mark.slow
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_stops_quickly_lists_the_rewritten_files_and_writes_no_other(tmp_path, jobs):
    folder = tmp_path / "src"
    for number in range(FILES):
        write(folder / f"m{number:03}.py", FIXABLE)
    process = subprocess.Popen(
        PERFMOD + ["apply", "src", "-j", jobs, "--no-cache"],
        cwd=tmp_path,
        env=process_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not _rewritten(folder) and time.monotonic() < deadline:  # wait until it is writing
        time.sleep(0.02)
    assert _rewritten(folder), "no file was rewritten within a minute"
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    latency = time.monotonic() - sent
    print(f"-j {jobs}: exited {latency:.2f} s after SIGINT")  # shown with -s; the README quotes it

    assert process.returncode == 130, stderr
    assert latency < LATENCY_LIMIT, f"took {latency:.2f} s to stop"
    assert "Traceback" not in stderr and stdout == ""
    lines = stderr.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("Rewritten before the interrupt"))
    listed = {os.path.basename(line.strip()) for line in lines[header + 1 :]}
    assert lines[header - 1].startswith("Interrupted after ") and lines[header - 1].endswith(f"of {FILES} files.")
    assert listed == _rewritten(folder)  # every file written is listed, and only those
    assert 0 < len(listed) < FILES
    for path in folder.glob("*.py"):
        assert path.read_text() in (FIXABLE, FIXED), path  # whole files only
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".py")) == []  # no temporary files
    stamps = {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}
    time.sleep(0.5)  # the workers are gone: nothing changes afterwards
    assert {path.name: path.stat().st_mtime_ns for path in folder.iterdir()} == stamps


@pytest.mark.slow
def test_ctrl_c_during_check_exits_130_and_says_nothing_was_written(tmp_path):
    for number in range(FILES):
        write(tmp_path / f"m{number:03}.py", FIXABLE)
    process = subprocess.Popen(
        PERFMOD + ["check", "."],
        cwd=tmp_path,
        env=process_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    entries = tmp_path / ".perfmod_cache" / "v1"
    deadline = time.monotonic() + 60
    while not (entries.is_dir() and any(entries.rglob("*.json"))) and time.monotonic() < deadline:
        time.sleep(0.02)  # until the first file is done
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    assert stdout == "" and "Traceback" not in stderr
    assert stderr.startswith("Interrupted after ") and stderr.endswith("Nothing is written by this command.\n")


class _InterruptedImport:
    """A meta path finder: importing codemod.cli is where the Ctrl-C lands."""

    def find_spec(self, name, path=None, target=None):
        if name == "codemod.cli":
            raise KeyboardInterrupt
        return None


def test_ctrl_c_while_perfmod_is_still_loading_exits_130_without_a_traceback(monkeypatch, capsys):
    from codemod import entry

    monkeypatch.delitem(sys.modules, "codemod.cli")  # put back afterwards, the very module object
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport(), *sys.meta_path])
    with pytest.raises(SystemExit) as exit:
        entry.main()
    assert exit.value.code == 130
    assert capsys.readouterr().err == "Interrupted.\n"


def test_ctrl_c_outside_a_run_exits_130_not_1(tmp_path, monkeypatch):
    """click would print "Aborted!" and exit 1, the status `check` uses for pending fixes."""
    from codemod import cli
    from tests.cli_support import perfmod

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "load_settings", interrupted)
    result = perfmod("check", ".")
    assert result.exit_code == 130 and result.stderr == "Interrupted.\n"

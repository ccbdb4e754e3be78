"""Files as `perfmod apply` meets them: modes, line endings, encodings, broken
files, folders to skip, parallel runs, atomic writes."""

import json
import os
import stat

import pytest

from codemod import files
from tests.cli_support import (  # noqa: F401 (catalogue is a fixture)
    FIXABLE, FIXED, UNPARSABLE, catalogue, perfmod, write,
)

pytestmark = pytest.mark.usefixtures("catalogue")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def checked_paths(*args) -> list[str]:
    return [entry["path"] for entry in json.loads(perfmod("check", *args, "--format", "json").stdout)["files"]]


def test_rewrite_keeps_the_file_mode(tmp_path):
    script = write(tmp_path / "train.py", "#!/usr/bin/env python\n" + FIXABLE)
    script.chmod(0o755)
    assert perfmod("apply", "train.py").exit_code == 0
    assert script.read_text() == "#!/usr/bin/env python\n" + FIXED
    assert stat.S_IMODE(script.stat().st_mode) == 0o755


def test_crlf_stays_crlf(tmp_path):
    script = write(tmp_path / "t.py", FIXABLE.replace("\n", "\r\n"))
    perfmod("apply", "t.py")
    assert script.read_bytes() == FIXED.replace("\n", "\r\n").encode()


def test_utf8_bom_survives(tmp_path):
    script = write(tmp_path / "t.py", b"\xef\xbb\xbf" + FIXABLE.encode())
    perfmod("apply", "t.py")
    assert script.read_bytes() == b"\xef\xbb\xbf" + FIXED.encode()


LATIN1 = "# -*- coding: latin-1 -*-\n# café\n" + FIXABLE + "name = 'señal'\n"


def test_latin1_coding_cookie_survives_byte_for_byte(tmp_path):
    script = write(tmp_path / "t.py", LATIN1.encode("latin-1"))
    perfmod("apply", "t.py")
    assert script.read_bytes() == LATIN1.replace("x.to(device)", "x.to(device, non_blocking=True)").encode("latin-1")


def test_diff_decodes_by_the_coding_cookie(tmp_path):
    write(tmp_path / "t.py", LATIN1.encode("latin-1"))
    result = perfmod("apply", "t.py", "--dry-run")
    assert " name = 'señal'\n" in result.stdout


def test_diff_marks_a_missing_final_newline(tmp_path):
    write(tmp_path / "t.py", FIXABLE.rstrip("\n"))
    result = perfmod("apply", "t.py", "--dry-run")
    assert result.stdout.endswith(
        "-y = x.to(device)\n\\ No newline at end of file\n+y = x.to(device, non_blocking=True)\n"
        "\\ No newline at end of file\n")


def test_diff_of_an_absolute_path_has_no_prefix(tmp_path):
    write(tmp_path / "t.py", FIXABLE)
    result = perfmod("apply", tmp_path / "t.py", "--dry-run")
    assert result.stdout.startswith(f"--- {tmp_path / 't.py'}\n+++ {tmp_path / 't.py'}\n")


def test_broken_files_are_reported_left_alone_and_do_not_stop_the_others(tmp_path):
    unparsable = write(tmp_path / "a_syntax.py", UNPARSABLE)
    undecodable = write(tmp_path / "b_encoding.py", b"import torch\nx = 1\ns = '\xff'\n")
    good = write(tmp_path / "c_good.py", FIXABLE)
    result = perfmod("apply", ".")
    assert result.exit_code == 2
    errors = result.stderr.splitlines()
    assert errors[0].startswith("a_syntax.py:4:5: error: syntax error: closing parenthesis ']' does not match")
    assert errors[1].startswith("b_encoding.py:3:6: error: cannot decode: 'utf-8' codec can't decode byte 0xff")
    assert unparsable.read_text() == UNPARSABLE
    assert undecodable.read_bytes() == b"import torch\nx = 1\ns = '\xff'\n"
    assert good.read_text() == FIXED
    assert "Applied 1 fix to 1 file (3 files checked, 2 errors)." in result.stdout


def test_folders_skip_vcs_virtualenvs_build_output_and_excluded_patterns(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.perfmod]\nexclude = ["legacy", "*_pb2.py"]\n')
    for path in [".git/hooks/x.py", ".venv/lib/x.py", "myenv/lib/x.py", "build/lib/x.py",
                 "legacy/old.py", "src/legacy/old.py", "src/msg_pb2.py", "pkg.egg-info/x.py",
                 "src/train.py", "src/model.py", "notes.txt"]:
        write(tmp_path / path, FIXABLE)
    write(tmp_path / "myenv" / "pyvenv.cfg", "home = /usr\n")
    assert checked_paths(".") == ["src/model.py", "src/train.py"]
    # A file named on the command line is always taken, as ruff does.
    assert checked_paths("build/lib/x.py") == ["build/lib/x.py"]


def test_two_jobs_give_the_same_results_as_one(tmp_path):
    for number in range(6):
        write(tmp_path / "one" / f"m{number}.py", FIXABLE if number % 2 else FIXABLE + "y = (\n")
        write(tmp_path / "two" / f"m{number}.py", FIXABLE if number % 2 else FIXABLE + "y = (\n")
    serial = perfmod("check", "one", "--format", "json", "-j", "1").stdout
    parallel = perfmod("check", "one", "--format", "json", "-j", "2").stdout
    assert json.loads(parallel) == json.loads(serial)
    assert len(json.loads(serial)["files"]) == 6
    perfmod("apply", "one", "-j", "1")
    perfmod("apply", "two", "-j", "2")
    for number in range(6):
        assert (tmp_path / "one" / f"m{number}.py").read_bytes() == (tmp_path / "two" / f"m{number}.py").read_bytes()
    assert (tmp_path / "two" / "m1.py").read_text() == FIXED


def test_no_temporary_files_are_left_behind(tmp_path):
    for number in range(3):
        write(tmp_path / f"m{number}.py", FIXABLE)
    perfmod("apply", ".")
    assert sorted(os.listdir(tmp_path)) == [".perfmod_cache", "m0.py", "m1.py", "m2.py"]


def test_a_failed_write_leaves_the_original_and_no_temporary_file(tmp_path, monkeypatch):
    script = write(tmp_path / "t.py", FIXABLE)

    def refuse(source, destination):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files.os, "replace", refuse)
    result = perfmod("apply", "t.py", "--no-cache")
    assert result.exit_code == 2
    assert result.stderr == "t.py:1:1: error: cannot write: Permission denied\n"
    assert result.stdout == "1 fix in 1 file not written: see the errors above (1 file checked, 1 error).\n"
    assert script.read_text() == FIXABLE and os.listdir(tmp_path) == ["t.py"]


def test_a_symbolic_link_stays_a_link_to_the_rewritten_file(tmp_path):
    target = write(tmp_path / "real" / "train.py", FIXABLE)
    link = tmp_path / "train.py"
    link.symlink_to(target)
    assert perfmod("apply", "train.py").exit_code == 0
    assert link.is_symlink() and target.read_text() == FIXED

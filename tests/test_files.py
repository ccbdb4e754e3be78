"""Files as `perfmod apply` meets them: modes, line endings, encodings, broken
files, folders to skip, parallel runs, atomic writes."""

import json
import os
import stat

import pytest

from codemod import files, worker
from tests.cli_support import (  # noqa: F401 (catalogue is a fixture)
    FIXABLE,
    FIXED,
    UNPARSABLE,
    catalogue,
    perfmod,
    write,
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
        "\\ No newline at end of file\n"
    )


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
    for path in [
        ".git/hooks/x.py",
        ".venv/lib/x.py",
        "myenv/lib/x.py",
        "build/lib/x.py",
        "legacy/old.py",
        "src/legacy/old.py",
        "src/msg_pb2.py",
        "pkg.egg-info/x.py",
        "src/train.py",
        "src/model.py",
        "notes.txt",
    ]:
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


# -- what a write must respect ----------------------------------------------------------------


def test_an_edit_made_while_apply_runs_is_kept_and_reported(tmp_path, monkeypatch):
    script = write(tmp_path / "t.py", FIXABLE)
    edited = FIXABLE + "z = 1  # typed while perfmod ran\n"
    original = worker.process_source

    def edit_meanwhile(data, path, settings, rules=None):
        result = original(data, path, settings, rules)
        script.write_text(edited)  # the user saves in the editor after perfmod read the file
        return result

    monkeypatch.setattr(worker, "process_source", edit_meanwhile)
    result = perfmod("apply", "t.py")
    assert result.exit_code == 2
    assert result.stderr == (
        "t.py:1:1: error: changed on disk while perfmod ran, left as it is (your edit is kept); "
        "run perfmod again to fix the new version\n"
    )
    assert "Nothing to fix" not in result.stdout and "1 fix in 1 file not written" in result.stdout
    assert script.read_text() == edited


def test_write_back_checks_the_content_not_only_the_size_and_time(tmp_path):
    script = write(tmp_path / "t.py", "x = 1\n")
    snapshot = files.read(script)
    stamp = script.stat()
    script.write_text("y = 2\n")  # same size
    os.utime(script, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # same time
    with pytest.raises(files.WriteRefused, match="changed on disk"):
        files.write_back(script, b"z = 3\n", snapshot)
    assert script.read_text() == "y = 2\n"


def test_a_read_only_file_is_refused_even_where_it_could_be_written(tmp_path):
    script = write(tmp_path / "t.py", FIXABLE)
    script.chmod(0o444)  # root could write it anyway: perfmod looks at the mode bits
    result = perfmod("apply", "t.py")
    assert result.exit_code == 2
    assert result.stderr == (
        "t.py:1:1: error: read-only file (mode 0444), left as it is; make it writable "
        "(chmod u+w t.py) to apply the fixes, or exclude it\n"
    )
    assert result.stdout == "1 fix in 1 file not written: see the errors above (1 file checked, 1 error).\n"
    assert script.read_text() == FIXABLE and stat.S_IMODE(script.stat().st_mode) == 0o444


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="changing a file's owner needs root")
def test_owner_group_and_mode_are_kept(tmp_path):
    script = write(tmp_path / "t.py", FIXABLE)
    os.chown(script, 1234, 5678)
    script.chmod(0o640)
    assert perfmod("apply", "t.py").exit_code == 0
    info = script.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (1234, 5678, 0o640)
    assert script.read_text() == FIXED


def test_a_file_whose_owner_cannot_be_kept_is_written_in_place(tmp_path, monkeypatch):
    """Not root, and another user's group-writable file: a rename would make it
    ours, so perfmod writes the file itself."""
    script = write(tmp_path / "t.py", FIXABLE)
    inode = script.stat().st_ino
    os.chown(script, os.getuid(), os.getgid())
    monkeypatch.setattr(files.os, "stat", _stat_with_owner(os.stat, script, uid=4321))
    monkeypatch.setattr(files.os, "chown", _refuse)
    assert perfmod("apply", "t.py", "--no-cache").exit_code == 0
    assert script.read_text() == FIXED and script.stat().st_ino == inode
    assert sorted(os.listdir(tmp_path)) == ["t.py"]  # the backup is gone


def _stat_with_owner(real_stat, path, uid):
    def fake(target, *args, **kwargs):
        info = real_stat(target, *args, **kwargs)
        if os.path.realpath(target) == os.path.realpath(path):
            values = list(info)
            values[stat.ST_UID] = uid
            return os.stat_result(values)
        return info

    return fake


def _refuse(*args, **kwargs):
    raise PermissionError(1, "Operation not permitted")


def test_hard_links_stay_linked_and_all_see_the_fix(tmp_path):
    script = write(tmp_path / "t.py", FIXABLE)
    link = tmp_path / "elsewhere.py.bak"
    os.link(script, link)
    assert perfmod("apply", "t.py").exit_code == 0
    assert script.read_text() == FIXED and link.read_text() == FIXED
    assert script.stat().st_ino == link.stat().st_ino and script.stat().st_nlink == 2
    assert sorted(os.listdir(tmp_path)) == [".perfmod_cache", "elsewhere.py.bak", "t.py"]


def test_a_failed_in_place_write_puts_the_original_back(tmp_path, monkeypatch):
    script = write(tmp_path / "t.py", FIXABLE)
    os.link(script, tmp_path / "link")
    real_overwrite = files._overwrite
    calls = []

    def full_disk(path, data):
        calls.append(data)
        if len(calls) == 1:
            with open(path, "r+b") as out:
                out.write(data[:10])  # half of it made it to disk
            raise OSError(28, "No space left on device")
        real_overwrite(path, data)

    monkeypatch.setattr(files, "_overwrite", full_disk)
    result = perfmod("apply", "t.py", "--no-cache")
    assert result.exit_code == 2 and "cannot write: No space left on device" in result.stderr
    assert script.read_text() == FIXABLE
    assert sorted(os.listdir(tmp_path)) == ["link", "t.py"]


def test_an_unwritable_folder_is_an_error_and_the_summary_says_so(tmp_path, monkeypatch):
    script = write(tmp_path / "src" / "t.py", FIXABLE)
    import tempfile  # codemod.files imports it when it writes

    real_mkstemp = tempfile.mkstemp

    def unwritable(*args, dir=None, **kwargs):
        if os.path.realpath(dir) == os.path.realpath(tmp_path / "src"):
            raise PermissionError(13, "Permission denied")
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", unwritable)
    result = perfmod("apply", "src")
    assert result.exit_code == 2
    assert result.stderr == (
        f"src/t.py:1:1: error: its folder {tmp_path / 'src'} is not writable, and perfmod writes "
        "a temporary file beside a file to replace it atomically; make the folder writable\n"
    )
    assert "Nothing to fix" not in result.stdout
    assert result.stdout == "1 fix in 1 file not written: see the errors above (1 file checked, 1 error).\n"
    assert script.read_text() == FIXABLE


def test_a_file_removed_while_apply_runs_is_not_written_again(tmp_path, monkeypatch):
    script = write(tmp_path / "t.py", FIXABLE)
    original = worker.process_source

    def remove_meanwhile(data, path, settings, rules=None):
        script.unlink()
        return original(data, path, settings, rules)

    monkeypatch.setattr(worker, "process_source", remove_meanwhile)
    result = perfmod("apply", "t.py")
    assert result.exit_code == 2 and "removed while perfmod ran, so not written again" in result.stderr
    assert not script.exists()


def test_a_file_named_twice_is_processed_once(tmp_path):
    write(tmp_path / "t.py", FIXABLE)
    result = perfmod("apply", "t.py", "./t.py", ".")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "Fixed t.py: 1 fix (PM101)\nApplied 1 fix to 1 file (1 file checked).\n"


# -- symbolic links ---------------------------------------------------------------------------


def test_a_dangling_symbolic_link_is_warned_about_and_skipped(tmp_path):
    write(tmp_path / "train.py", FIXABLE)
    (tmp_path / "gone.py").symlink_to("moved_away.py")
    (tmp_path / "loop.py").symlink_to("loop.py")
    result = perfmod("check", ".")
    assert result.exit_code == 1, result.stderr  # the fix pending in train.py: no error for the links
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: gone.py is a symbolic link to moved_away.py, which does not exist (or is a loop of links); "
        "skipped: remove the link, or restore what it points to",
        "warning: loop.py is a symbolic link to loop.py, which does not exist (or is a loop of links); "
        "skipped: remove the link, or restore what it points to",
    ]
    assert checked_paths(".") == ["train.py"]
    assert perfmod("check", ".", "-q").stderr == ""
    assert perfmod("apply", ".").exit_code == 0 and (tmp_path / "train.py").read_text() == FIXED


def test_a_dangling_symbolic_link_named_on_the_command_line_is_skipped_too(tmp_path):
    write(tmp_path / "clean.py", "x = 1\n")
    (tmp_path / "gone.py").symlink_to("moved_away.py")
    result = perfmod("check", "gone.py", "clean.py")
    assert result.exit_code == 0, result.stderr
    assert "warning: gone.py is a symbolic link to moved_away.py" in result.stderr
    missing = perfmod("check", "missing.py", "clean.py")  # not a link: a path that names nothing is an error
    assert missing.exit_code == 2 and "missing.py:1:1: error: cannot read" in missing.stderr


def test_a_file_beside_a_link_to_it_is_reported_once_under_its_own_name(tmp_path):
    write(tmp_path / "train.py", FIXABLE)
    (tmp_path / "a_link.py").symlink_to("train.py")  # sorts first
    (tmp_path / "linked").symlink_to(tmp_path, target_is_directory=True)
    assert checked_paths(".") == ["train.py"]
    assert checked_paths("a_link.py", "train.py") == ["train.py"]
    assert checked_paths("linked/train.py", "a_link.py", "train.py") == ["train.py"]
    document = json.loads(perfmod("check", ".", "--format", "json").stdout)
    assert {finding["path"] for finding in document["findings"]} == {"train.py"}
    result = perfmod("apply", ".")
    assert result.exit_code == 0 and result.stdout.startswith("Fixed train.py: 1 fix (PM101)\n")
    assert (tmp_path / "a_link.py").is_symlink() and (tmp_path / "train.py").read_text() == FIXED


def test_a_link_whose_file_is_not_found_by_its_own_name_keeps_the_link_name(tmp_path):
    write(tmp_path / "shared" / "train.py", FIXABLE)
    write(tmp_path / "project" / "b.py", "x = 1\n")
    (tmp_path / "project" / "a.py").symlink_to(tmp_path / "shared" / "train.py")
    assert checked_paths("project") == ["project/b.py", "project/a.py"]  # links come last

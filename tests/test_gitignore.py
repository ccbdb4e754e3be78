""".gitignore files as perfmod reads them, checked against git itself, and
how discovery uses them (`--no-respect-gitignore`, `respect-gitignore`)."""

import json
import shutil
import subprocess

import pytest

from codemod.gitignore import Gitignore, parse_line
from tests.cli_support import FIXABLE, catalogue, perfmod, write  # noqa: F401 (catalogue is a fixture)

GIT = shutil.which("git")

PATTERNS = """\
# a comment, then a blank line

*.log
!keep.log
build/
/top_only.py
docs/*.py
**/generated/**
a/**/deep.py
gen_?.py
data[0-9].py
\\#hash.py
\\!bang.py
trailing.py   
logs/
!logs/important/
vendor
"""

NESTED = """\
*.py
!wanted.py
"""

PATHS = [
    "x.log",
    "keep.log",
    "sub/y.log",
    "sub/keep.log",
    "build/a.py",
    "sub/build/a.py",
    "build",
    "top_only.py",
    "sub/top_only.py",
    "docs/a.py",
    "docs/sub/a.py",
    "sub/docs/a.py",
    "generated/a.py",
    "sub/generated/x/a.py",
    "generated",
    "a/deep.py",
    "a/b/deep.py",
    "a/b/c/deep.py",
    "b/a/deep.py",
    "gen_1.py",
    "gen_12.py",
    "data5.py",
    "dataX.py",
    "#hash.py",
    "!bang.py",
    "trailing.py",
    "trailing.py   ",
    "logs/x.py",
    "logs/important/y.py",
    "vendor",
    "vendor/lib.py",
    "src/vendor/lib.py",
    "nested/a.py",
    "nested/wanted.py",
    "nested/deeper/b.py",
    "nested/deeper/wanted.py",
    "plain.py",
    "src/plain.py",
]


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_matching_agrees_with_git_check_ignore(tmp_path):
    subprocess.run([GIT, "init", "-q"], cwd=tmp_path, check=True)
    write(tmp_path / ".gitignore", PATTERNS)
    write(tmp_path / "nested" / ".gitignore", NESTED)
    write(tmp_path / ".git" / "info" / "exclude", "excluded_by_info.py\n")
    paths = PATHS + ["excluded_by_info.py", "sub/excluded_by_info.py"]
    for path in paths:  # on disk, so that git knows a folder from a file
        if not any(other.startswith(path + "/") for other in paths):
            write(tmp_path / path, "")
    listed = "".join(f"{path}\n" for path in paths)
    # --no-index: as if nothing were tracked; -v -n: every path with the pattern that decided it
    answer = subprocess.run(
        [GIT, "check-ignore", "--no-index", "-v", "-n", "--stdin"],
        cwd=tmp_path,
        input=listed,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    by_git = {}
    for line in answer:
        source, path = line.split("\t")
        pattern = source.split(":", 2)[2]
        by_git[path] = bool(pattern) and not pattern.startswith("!")
    for path in paths:
        assert _ignored_on_the_way(tmp_path, path, paths) == by_git[path], path


def _ignored_on_the_way(root, path, paths) -> bool:
    """As the walk decides: a folder on the way is ignored (and not entered), or the path itself is."""
    rules = Gitignore.for_walk(root)
    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        target = root.joinpath(*parts[:depth])
        is_dir = depth < len(parts) or any(other.startswith(path + "/") for other in paths)
        if rules.match(target, is_dir):
            return True
        if depth < len(parts):
            rules = rules.entering(target)
    return False


def test_a_file_in_an_ignored_folder_is_never_reached(tmp_path, monkeypatch, catalogue):  # noqa: F811
    """git cannot re-include a file whose folder is excluded; the walk does not enter it."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / ".gitignore", "skipped/\n!skipped/wanted.py\n")
    write(tmp_path / "skipped" / "wanted.py", FIXABLE)
    write(tmp_path / "kept.py", FIXABLE)
    (tmp_path / ".git").mkdir()
    assert _checked(tmp_path, ".") == ["kept.py"]


@pytest.mark.parametrize(
    "line, expected",
    [
        ("", None),
        ("# comment", None),
        ("/", None),
        ("!", None),
    ],
)
def test_lines_that_are_no_pattern(line, expected):
    assert parse_line(line, "/base") is expected


def _checked(tmp_path, *args) -> list[str]:
    result = perfmod("check", *args, "--format", "json", "--no-cache")
    assert result.exit_code in (0, 1), result.stderr
    return [entry["path"] for entry in json.loads(result.stdout)["files"]]


@pytest.fixture
def repository(tmp_path, monkeypatch, catalogue):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".git").mkdir()
    write(tmp_path / ".gitignore", "generated/\n*_gen.py\n")
    write(tmp_path / "src" / ".gitignore", "scratch.py\n")
    for path in ["src/train.py", "src/scratch.py", "src/model_gen.py", "generated/out.py", "other/scratch.py"]:
        write(tmp_path / path, FIXABLE)
    return tmp_path


def test_gitignore_is_respected_by_default(repository):
    assert _checked(repository) == ["other/scratch.py", "src/train.py"]


def test_gitignore_files_above_the_walked_folder_count(repository):
    assert _checked(repository, "src") == ["src/train.py"]


def test_no_respect_gitignore_walks_everything(repository):
    assert _checked(repository, "--no-respect-gitignore") == [
        "generated/out.py",
        "other/scratch.py",
        "src/model_gen.py",
        "src/scratch.py",
        "src/train.py",
    ]


def test_respect_gitignore_false_in_the_configuration(repository):
    write(repository / "pyproject.toml", "[tool.perfmod]\nrespect-gitignore = false\n")
    assert len(_checked(repository)) == 5
    assert len(_checked(repository, "--respect-gitignore")) == 2


def test_a_file_named_on_the_command_line_is_taken_even_if_ignored(repository):
    assert _checked(repository, "src/scratch.py") == ["src/scratch.py"]


def test_outside_a_repository_the_walked_folders_own_gitignore_files_count(tmp_path, monkeypatch, catalogue):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "project" / ".gitignore", "skip.py\n")
    write(tmp_path / "project" / "skip.py", FIXABLE)
    write(tmp_path / "project" / "keep.py", FIXABLE)
    assert _checked(tmp_path, "project") == ["project/keep.py"]

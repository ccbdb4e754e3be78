"""The hooks in .pre-commit-hooks.yaml, run by the real pre-commit as a project
that uses perfmod would run them.

pre-commit installs perfmod from a git repository: `try-repo` on this checkout
would take its committed files and uncommitted changes to tracked files, but
not new untracked ones, so a rule module being written (untracked, yet already
imported by codemod/rules/__init__.py) would break the install. The test tries
a snapshot instead: every file of the working tree that git does not ignore,
committed in a fresh repository.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_support import CLEAN, FIXABLE, FIXED, REPO, write

PRE_COMMIT = shutil.which("pre-commit", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
GIT_IDENTITY = ["-c", "user.name=perfmod tests", "-c", "user.email=tests@perfmod.invalid", "-c", "commit.gpgsign=false"]


def snapshot(repo: Path, into: Path) -> Path:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=repo, capture_output=True, check=True).stdout
    for name in filter(None, listed.split(b"\0")):
        source = repo / os.fsdecode(name)
        if source.is_file():  # a tracked file deleted in the working tree is listed too
            target = into / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    subprocess.run(["git", "init", "-q"], cwd=into, check=True)
    subprocess.run(["git", "add", "-A"], cwd=into, check=True)
    subprocess.run(["git", *GIT_IDENTITY, "commit", "-q", "-m", "snapshot"], cwd=into, check=True)
    return into


@pytest.mark.slow
@pytest.mark.skipif(PRE_COMMIT is None, reason="pre-commit is not installed (it comes with perfmod[test])")
def test_check_hook_fails_on_a_pending_fix_and_fix_hook_rewrites_it(tmp_path):
    hooks_repo = snapshot(REPO, tmp_path / "perfmod")
    project = tmp_path / "project"
    train = write(project / "train.py", FIXABLE)
    write(project / "clean.py", CLEAN)
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "."], cwd=project, check=True)
    # try-repo installs perfmod into a fresh store on every call, so one call runs both hooks;
    # PRE_COMMIT_HOME keeps what pre-commit writes besides (its log) out of the home folder.
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "NO_COLOR": "1"}
    run = subprocess.run([PRE_COMMIT, "try-repo", str(hooks_repo), "--all-files", "--color", "never"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=240)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    check_part, fix_part = output.split("perfmod fix", 1)  # the hooks run in the file's order: check, then fix
    assert "- hook id: perfmod-check\n- exit code: 1" in check_part, output
    assert "train.py:4:5: PM101 [*] host-to-device copy blocks the CPU" in check_part, output
    assert "clean.py" not in check_part
    assert "- hook id: perfmod-fix\n- files were modified by this hook" in fix_part, output
    assert "Fixed train.py: 1 fix (PM101)" in fix_part, output
    assert train.read_text() == FIXED


def readme_snippet() -> str:
    """The .pre-commit-config.yaml the README shows, as written."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## pre-commit"):]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_the_readme_names_the_release_tag_of_this_version():
    declared = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert re.search(r"^\s+rev: (\S+)$", readme_snippet(), re.M).group(1) == f"v{declared}"
    assert f"rev: v{declared}" in (REPO / ".pre-commit-hooks.yaml").read_text()


@pytest.mark.slow
@pytest.mark.skipif(PRE_COMMIT is None, reason="pre-commit is not installed (it comes with perfmod[test])")
def test_the_readme_snippet_works_as_written_and_exclude_applies_to_staged_files(tmp_path):
    # A clone of this checkout with the release tag the snippet names: CI's clone may have no tags.
    hooks_repo = snapshot(REPO, tmp_path / "perfmod")
    snippet = readme_snippet()
    rev = re.search(r"^\s+rev: (\S+)$", snippet, re.M).group(1)
    subprocess.run(["git", *GIT_IDENTITY, "tag", "-a", rev, "-m", rev], cwd=hooks_repo, check=True)
    url = re.search(r"repo: (\S+)", snippet).group(1)
    assert url == "https://github.com/perfmod/perfmod"
    project = tmp_path / "project"
    write(project / ".pre-commit-config.yaml", snippet.replace(url, str(hooks_repo)))  # the one change: where
    write(project / "pyproject.toml", '[tool.perfmod]\nexclude = ["legacy/"]\n')
    write(project / "train.py", FIXABLE)
    write(project / "legacy" / "old.py", FIXABLE)  # staged, so pre-commit names it; `exclude` still applies
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "."], cwd=project, check=True)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "NO_COLOR": "1"}
    run = subprocess.run([PRE_COMMIT, "run", "--all-files", "--color", "never"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=240)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "- hook id: perfmod-check\n- exit code: 1" in output, output
    assert "train.py:4:5: PM101 [*] host-to-device copy blocks the CPU" in output, output
    assert "legacy" not in output, output
    assert (project / "train.py").read_text() == FIXABLE

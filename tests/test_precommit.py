"""The hooks in .pre-commit-hooks.yaml, run by the real pre-commit as a project
that uses perfmod would run them.

pre-commit installs perfmod from a git repository at a rev: this checkout's
committed files would leave out uncommitted changes and new untracked files (a
rule module being written, yet already imported by codemod/rules/__init__.py,
would break the install). The test uses a snapshot instead: every file of the
working tree that git does not ignore, committed in a fresh repository and
tagged with the release the README names.
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
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
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


def readme_snippet() -> str:
    """The .pre-commit-config.yaml the README shows, as written."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## pre-commit") :]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def test_the_readme_names_the_release_tag_of_this_version():
    declared = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert re.search(r"^\s+rev: (\S+)$", readme_snippet(), re.M).group(1) == f"v{declared}"
    assert f"rev: v{declared}" in (REPO / ".pre-commit-hooks.yaml").read_text()


@pytest.mark.slow
@pytest.mark.skipif(PRE_COMMIT is None, reason="pre-commit is not installed (it comes with perfmod[test])")
def test_the_readme_snippet_as_written_then_the_fix_hook(tmp_path):
    """The README's snippet, from a scratch repository, against a clone of this
    checkout tagged with the release the snippet names (CI's clone may have no
    tags): the check hook fails on a pending fix, `exclude` applies to the files
    pre-commit names, and the fix hook (same repository and rev, so the same
    installed environment) rewrites the file."""
    hooks_repo = snapshot(REPO, tmp_path / "perfmod")
    snippet = readme_snippet()
    rev = re.search(r"^\s+rev: (\S+)$", snippet, re.M).group(1)
    subprocess.run(["git", *GIT_IDENTITY, "tag", "-a", rev, "-m", rev], cwd=hooks_repo, check=True)
    url = re.search(r"repo: (\S+)", snippet).group(1)
    assert url == "https://github.com/perfmod/perfmod"
    project = tmp_path / "project"
    write(project / ".pre-commit-config.yaml", snippet.replace(url, str(hooks_repo)))  # the one change: where
    write(
        project / "fix-config.yaml",
        snippet.replace(url, str(hooks_repo))
        .replace("- id: perfmod-check", "- id: perfmod-fix")
        .replace("# - id: perfmod-fix", "#"),
    )
    write(project / "pyproject.toml", '[tool.perfmod]\nexclude = ["legacy/"]\n')
    train = write(project / "train.py", FIXABLE)
    write(project / "clean.py", CLEAN)
    old = write(project / "legacy" / "old.py", FIXABLE)  # staged, so pre-commit names it; `exclude` still applies
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "."], cwd=project, check=True)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "NO_COLOR": "1"}

    def pre_commit(*args):
        run = subprocess.run(
            [PRE_COMMIT, "run", "--all-files", "--color", "never", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        return run.returncode, run.stdout + run.stderr

    status, output = pre_commit()
    assert status == 1, output
    assert "- hook id: perfmod-check\n- exit code: 1" in output, output
    assert "train.py:4:5: PM101 [*] host-to-device copy blocks the CPU" in output, output
    assert "legacy" not in output and "clean.py" not in output, output
    assert train.read_text() == FIXABLE

    status, output = pre_commit("--config", "fix-config.yaml")
    assert status == 1, output  # pre-commit fails a hook that changed files, for review
    assert "- hook id: perfmod-fix\n- files were modified by this hook" in output, output
    assert "Fixed train.py: 1 fix (PM101)" in output, output
    assert train.read_text() == FIXED and old.read_text() == FIXABLE

"""The hooks in .pre-commit-hooks.yaml, run by the real pre-commit as a project
that uses perfmod would run them, at a commit SHA as the README's snippet pins one.

pre-commit installs perfmod from a git repository at a rev: this checkout's
committed files would leave out uncommitted changes and new untracked files, so
the test uses a snapshot of the working tree (tests/repo_support.py) and asks
`pre-commit autoupdate` for its SHA, as the README says to.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli_support import CLEAN, FIXABLE, FIXED, REPO, write
from tests.repo_support import declared_version, snapshot

PRE_COMMIT = shutil.which("pre-commit", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
SHA = re.compile(r"[0-9a-f]{40}")


def readme_snippet() -> str:
    """The .pre-commit-config.yaml the README shows, as written."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## pre-commit") :]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def snippet_rev() -> str:
    return re.search(r"^\s+rev: (\S+)", readme_snippet(), re.M).group(1)


def changelog_release(version: str) -> str:
    changelog = (REPO / "CHANGELOG.md").read_text()
    return changelog[changelog.index(f"## [{version}]") :].split("\n## ", 1)[0]


def test_the_readme_pins_the_commit_the_changelog_names_for_this_version():
    """No release is tagged yet, so the snippet's rev is a full commit SHA: the one
    CHANGELOG.md gives for this version, with the tag it is to get."""
    rev, version = snippet_rev(), declared_version(REPO / "pyproject.toml")
    assert SHA.fullmatch(rev), rev
    release = changelog_release(version)
    assert f"Commit `{rev}`, to be tagged `v{version}`." in release
    assert f"[{version}]: https://github.com/perfmod/perfmod/compare/" in (REPO / "CHANGELOG.md").read_text()
    assert f"rev: {rev}" in (REPO / ".pre-commit-hooks.yaml").read_text()


def test_the_pinned_commit_declares_this_version_and_has_both_hooks():
    rev = snippet_rev()
    present = subprocess.run(["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=REPO, capture_output=True)
    if present.returncode != 0:
        pytest.skip(f"{rev} is not in this clone (a shallow clone has no history)")

    def at_rev(path: str) -> str:
        return subprocess.run(
            ["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout

    assert re.search(r'^version = "(.+)"', at_rev("pyproject.toml"), re.M).group(1) == declared_version(
        REPO / "pyproject.toml"
    )
    hooks = {hook["id"]: hook["entry"] for hook in yaml.safe_load(at_rev(".pre-commit-hooks.yaml"))}
    assert hooks == {"perfmod-check": "perfmod check --force-exclude", "perfmod-fix": "perfmod apply --force-exclude"}


@pytest.mark.slow
@pytest.mark.skipif(PRE_COMMIT is None, reason="pre-commit is not installed (it comes with perfmod[test])")
def test_the_readme_snippet_as_written_then_the_fix_hook(tmp_path):
    """The README's snippet, from a scratch repository, against a snapshot of this
    checkout (no tags, as the repository has none yet): `pre-commit autoupdate`
    pins the snapshot's commit SHA, as the README says; then the check hook fails
    on a pending fix, `exclude` applies to the files pre-commit names, and the fix
    hook (same repository and rev, so the same installed environment) rewrites
    the file."""
    hooks_repo = snapshot(REPO, tmp_path / "perfmod")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=hooks_repo, capture_output=True, text=True, check=True)
    snippet = readme_snippet()
    url = re.search(r"repo: (\S+)", snippet).group(1)
    assert url == "https://github.com/perfmod/perfmod"
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    config = write(project / ".pre-commit-config.yaml", snippet.replace(url, str(hooks_repo)))  # where, and then:
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "NO_COLOR": "1"}
    updated = subprocess.run(
        [PRE_COMMIT, "autoupdate", "--color", "never"], cwd=project, env=env, capture_output=True, text=True, timeout=60
    )
    assert updated.returncode == 0, updated.stdout + updated.stderr
    rev = re.search(r"^\s+rev: (\S+)", config.read_text(), re.M).group(1)
    assert rev == head.stdout.strip() and SHA.fullmatch(rev), config.read_text()
    assert config.read_text() == snippet.replace(url, str(hooks_repo)).replace(snippet_rev(), rev)
    write(
        project / "fix-config.yaml",
        config.read_text().replace("- id: perfmod-check", "- id: perfmod-fix").replace("# - id: perfmod-fix", "#"),
    )
    write(project / "pyproject.toml", '[tool.perfmod]\nexclude = ["legacy/"]\n')
    train = write(project / "train.py", FIXABLE)
    write(project / "clean.py", CLEAN)
    old = write(project / "legacy" / "old.py", FIXABLE)  # staged, so pre-commit names it; `exclude` still applies
    subprocess.run(["git", "add", "."], cwd=project, check=True)

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

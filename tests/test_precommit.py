"""The hooks in .pre-commit-hooks.yaml, run by the real pre-commit against this
checkout (`try-repo` takes its uncommitted changes to tracked files too), as a
project that uses perfmod would run them."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_support import CLEAN, FIXABLE, FIXED, REPO, write

PRE_COMMIT = shutil.which("pre-commit", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.slow
@pytest.mark.skipif(PRE_COMMIT is None, reason="pre-commit is not installed (it comes with perfmod[test])")
def test_check_hook_fails_on_a_pending_fix_and_fix_hook_rewrites_it(tmp_path):
    project = tmp_path / "project"
    train = write(project / "train.py", FIXABLE)
    write(project / "clean.py", CLEAN)
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "."], cwd=project, check=True)
    # One environment for both runs: pre-commit installs perfmod from this checkout into it.
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "NO_COLOR": "1"}

    def try_repo(*hooks: str) -> subprocess.CompletedProcess:
        return subprocess.run([PRE_COMMIT, "try-repo", str(REPO), *hooks, "--all-files", "--color", "never"],
                              cwd=project, env=env, capture_output=True, text=True, timeout=240)

    both = try_repo()  # every hook of the file, in its order: check, then fix
    output = both.stdout + both.stderr
    assert both.returncode == 1, output
    check_part, fix_part = output.split("perfmod fix", 1)
    assert "- hook id: perfmod-check\n- exit code: 1" in check_part, output
    assert "train.py:4:5: PM101 [*] host-to-device copy blocks the CPU" in check_part, output
    assert "clean.py" not in check_part
    assert "- hook id: perfmod-fix\n- files were modified by this hook" in fix_part, output
    assert "Fixed train.py: 1 fix (PM101)" in fix_part, output
    assert train.read_text() == FIXED

    again = try_repo("perfmod-check")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Passed" in again.stdout

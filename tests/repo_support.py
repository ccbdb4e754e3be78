"""What the packaging and pre-commit tests share: the version a pyproject.toml
declares, and this checkout as a fresh git repository (what pip and pre-commit
fetch from a git URL)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

GIT_IDENTITY = ["-c", "user.name=perfmod tests", "-c", "user.email=tests@perfmod.invalid", "-c", "commit.gpgsign=false"]


def build_wheel(source: str | Path, dist: Path) -> subprocess.CompletedProcess:
    """`pip wheel` of `source` (a folder or a `name @ git+file://...` requirement) into
    `dist`, offline: no dependencies, no build isolation, no index."""
    command = ["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(dist)]
    return subprocess.run([sys.executable, *command, str(source)], capture_output=True, text=True, timeout=120)


def declared_version(pyproject: Path) -> str:
    return re.search(r'^version = "(.+)"', pyproject.read_text(), re.M).group(1)


def snapshot(repo: Path, into: Path) -> Path:
    """Every file of repo's working tree that git does not ignore, committed in a
    fresh repository at into. A clone of the checkout would leave out uncommitted
    changes and new untracked files (a rule module being written, yet already
    imported by codemod/rules/__init__.py, would break an install from it)."""
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

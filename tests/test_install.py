"""The README's install section, done as a user would: perfmod built as a wheel from
a git URL (the `pip install "git+https://..."` form, with a local repository for the
URL) and installed into a fresh virtual environment, whose `perfmod` command then runs.

No network: the build uses this environment's setuptools (--no-build-isolation,
--no-index), and the fresh environment sees only the distributions perfmod's wheel
declares, and theirs, linked from this environment. So a module the rewriter imports
but pyproject.toml does not declare (torch above all) fails the test."""

import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.cli_support import CLEAN, FINDING_MESSAGE, FIXABLE, REPO, write
from tests.repo_support import build_wheel, declared_version, snapshot

README = (REPO / "README.md").read_text()


def install_section() -> str:
    return README[README.index("## Install") :].split("\n## ", 1)[0]


def dependency_closure(requirements: list[str]) -> list[metadata.Distribution]:
    """The installed distributions that requirements (a wheel's Requires-Dist, extras
    not asked for) pull in, transitively, as pip would choose them here."""
    found: dict[str, metadata.Distribution] = {}
    pending = list(requirements)
    while pending:
        requirement = Requirement(pending.pop())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name not in found:
            found[name] = metadata.distribution(requirement.name)
            pending.extend(found[name].requires or [])
    return list(found.values())


def link_distributions(distributions: list[metadata.Distribution], into: Path) -> None:
    """Each distribution's top-level files (packages, modules, .dist-info) linked into a
    folder: the fresh environment reads them from there instead of from an index."""
    into.mkdir()
    for distribution in distributions:
        tops = {Path(name).parts[0] for name in distribution.files or []}
        for top in sorted(tops - {"..", "__pycache__"}):
            source = Path(distribution.locate_file(top))
            if source.exists() and not (into / top).exists():
                (into / top).symlink_to(source)


def run(*command, **options) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=120, **options)


def test_the_install_section_names_what_works_today():
    section = install_section()
    repository = re.search(r'^Repository = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert f'pip install "git+{repository}"' in section
    assert f'pip install "perfmod[runtime] @ git+{repository}"' in section
    assert f'pip install "perfmod-runtime @ git+{repository}#subdirectory=packaging/runtime"' in section
    assert "pip install -e ." in section
    assert ".venv/bin/perfmod check" in section
    assert (REPO / "packaging" / "runtime" / "pyproject.toml").is_file()
    # Nothing tells the reader to install from the package index, where perfmod is not.
    for text in (README, (REPO / "packaging" / "runtime" / "README.md").read_text()):
        assert not re.search(r"pip install (?:perfmod|perfmod-runtime)(?:\[\w+\])?(?:\s|`|$)", text, re.M)


@pytest.mark.slow
def test_the_wheel_built_from_a_git_url_installs_into_a_fresh_venv_and_runs(tmp_path):
    clone = snapshot(REPO, tmp_path / "perfmod")
    built = build_wheel(f"perfmod @ git+file://{clone}", tmp_path / "dist")
    assert built.returncode == 0, built.stdout + built.stderr
    version = declared_version(REPO / "pyproject.toml")
    (wheel,) = (tmp_path / "dist").glob(f"perfmod-{version}-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "codemod/report/templates/report.html.j2" in names  # package data: `perfmod report` needs it
    assert "runtime/__init__.py" in names and not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
    metadata_text = zipfile.ZipFile(wheel).read(f"perfmod-{version}.dist-info/METADATA").decode()
    requirements = re.findall(r"^Requires-Dist: (.+)$", metadata_text, re.M)

    venv = tmp_path / "venv"
    made = run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site_packages = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    link_distributions(dependency_closure(requirements), tmp_path / "dependencies")
    (site_packages / "dependencies.pth").write_text(f"{tmp_path / 'dependencies'}\n")
    installed = run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    # The fresh environment has perfmod from the wheel and no torch (the rewriter needs none).
    where = run(python, "-c", "import codemod.cli; print(codemod.cli.__file__)", cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(site_packages), where.stdout + where.stderr
    assert run(python, "-c", "import torch", cwd=tmp_path).returncode == 1

    perfmod = venv / "bin" / "perfmod"
    shown = run(perfmod, "--version", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert version in shown.stdout
    project = tmp_path / "project"
    write(project / "train.py", FIXABLE)
    write(project / "clean.py", CLEAN)
    checked = run(perfmod, "check", "train.py", "clean.py", cwd=project)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"train.py:4:5: {FINDING_MESSAGE}" in checked.stdout
    assert "clean.py" not in checked.stdout
    assert run(perfmod, "check", "clean.py", cwd=project).returncode == 0

"""perfmod-runtime: the wheel built from packaging/runtime holds `runtime/`
and nothing of the rewriter, needs torch only, and has perfmod's version."""

import re
import shutil
import sys
import zipfile

import pytest

from tests.cli_support import REPO
from tests.repo_support import build_wheel, declared_version


@pytest.mark.slow
def test_the_runtime_wheel_holds_runtime_only_and_depends_on_torch_only(tmp_path):
    # The same layout as the repository (packaging/runtime beside runtime/), so the build
    # writes nothing into the checkout.
    shutil.copytree(REPO / "packaging" / "runtime", tmp_path / "packaging" / "runtime")
    shutil.copytree(REPO / "runtime", tmp_path / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "codemod", tmp_path / "codemod", ignore=shutil.ignore_patterns("__pycache__"))
    built = build_wheel(tmp_path / "packaging" / "runtime", tmp_path / "dist")
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("perfmod_runtime-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    sources = sorted(str(p.relative_to(REPO)) for p in (REPO / "runtime").rglob("*.py"))
    assert sorted(n for n in names if n.startswith("runtime/")) == sources
    assert not [n for n in names if n.startswith("codemod")]  # the rewriter stays out
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert re.findall(r"^Requires-Dist: (.+)$", metadata, re.M) == ["torch>=2.4"]
    assert f"Version: {declared_version(REPO / 'pyproject.toml')}\n" in metadata
    assert "Name: perfmod-runtime\n" in metadata


def test_the_runtime_package_has_perfmod_s_version():
    assert declared_version(REPO / "packaging" / "runtime" / "pyproject.toml") == declared_version(
        REPO / "pyproject.toml"
    )


def test_runtime_imports_nothing_but_torch_and_the_standard_library():
    """What the runtime wheel can promise: `pip install perfmod-runtime` pulls torch only
    (an import inside a function may be optional: trace.py seeds numpy where it is installed)."""
    allowed = set(sys.stdlib_module_names) | {"torch", "runtime"}
    for path in (REPO / "runtime").rglob("*.py"):
        for line in path.read_text().splitlines():
            match = re.match(r"(?:from|import)\s+([\w.]+)", line)  # module level
            if match and not match.group(1).startswith("."):
                assert match.group(1).split(".")[0] in allowed, f"{path}: {line.strip()}"

"""Files on disk: which to process, reading them, and writing results back.

The only module that touches the user's files. Writes are atomic (a temporary
file in the same folder renamed over the original) and keep the file's mode.
"""

from __future__ import annotations

import os
import stat
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import FileResult

SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".tox", ".nox", "build", "dist",
             "node_modules", ".mypy_cache", ".pytest_cache", ".eggs", "site-packages"}


def discover(paths: Iterable[Path], settings: Settings) -> Iterator[Path]:
    """Python files under `paths`, skipping VCS folders, virtual environments,
    build output and the configured `exclude` patterns. Files named directly are
    always taken, as ruff does."""
    for path in paths:
        if path.is_dir():
            yield from _walk(path, settings)
        else:
            yield path


def _walk(folder: Path, settings: Settings) -> Iterator[Path]:
    for root, dirs, files in os.walk(folder):
        root_path = Path(root)
        dirs[:] = sorted(
            d for d in dirs
            if d not in SKIP_DIRS and not d.endswith(".egg-info")
            and not (root_path / d / "pyvenv.cfg").exists()
            and not settings.excluded(root_path / d)
        )
        for name in sorted(files):
            if name.endswith(".py") and not settings.excluded(root_path / name):
                yield root_path / name


def process_file(path: Path, settings: Settings, write: bool) -> FileResult:
    try:
        data = path.read_bytes()
    except OSError as error:
        return FileResult(path=str(path), source=b"", error=f"{path}:1:1: error: cannot read: {error.strerror or error}")
    result = process_source(data, str(path), settings)
    if result.error is None and write and result.changed:
        try:
            atomic_write(path, result.new_source)
        except OSError as error:
            result.error = f"{path}:1:1: error: cannot write: {error.strerror or error}"
    return result


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename over the original,
    keeping its permission bits (a new file gets open()'s): a crash leaves the old
    file or the new, never half.
    A symbolic link is followed, so the link stays and its target gets the new text."""
    path = Path(os.path.realpath(path))
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else _new_file_mode()
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".perfmod", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def _new_file_mode() -> int:
    """The permission bits open() would give a new file (0o666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def process_files(
    paths: Sequence[Path],
    settings: Settings,
    write: bool,
    jobs: int = 1,
    on_result: Callable[[FileResult], None] | None = None,
) -> list[FileResult]:
    """Process files, in parallel when `jobs > 1`; results come back in input order."""
    if jobs <= 1 or len(paths) < 2:
        results = []
        for path in paths:
            results.append(process_file(path, settings, write))
            if on_result:
                on_result(results[-1])
        return results
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = []
        chunk = max(1, min(32, len(paths) // (jobs * 4)))
        for result in pool.map(process_file, paths, [settings] * len(paths), [write] * len(paths), chunksize=chunk):
            results.append(result)
            if on_result:
                on_result(result)
        return results

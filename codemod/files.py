"""Files on disk: which to process, reading them, and writing results back.

The only module that touches the user's files. `write_back` replaces a file
only when it still holds what was read, keeps its owner, group and mode,
refuses read-only files, and writes hard-linked files in place so that every
link sees the change. Writes are atomic (a temporary file in the same folder
renamed over the original); an in-place write keeps a backup beside the file
until it is done, and puts the original back if the write fails.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from codemod.config import Settings
from codemod.gitignore import Gitignore
from codemod.result import digest

SKIP_DIRS = {
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".venv",
    "venv",
    "env",
    ".tox",
    ".nox",
    "build",
    "dist",
    "node_modules",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".perfmod_cache",
    ".eggs",
    "site-packages",
}


# -- discovery ----------------------------------------------------------------------------


def discover(paths: Iterable[Path], settings: Settings, skipped: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Python files under `paths`, skipping VCS folders, virtual environments,
    build output, the configured `exclude` patterns and (with
    settings.respect_gitignore) what .gitignore files ignore. Files named
    directly are always taken, as ruff does, unless settings.force_exclude
    and `exclude` matches them.

    A file reached twice is given once, and under its own name when it is
    reached by that name too: a name through a symbolic link (the link itself,
    or a linked folder) waits until every path has been walked, and is given
    only if the file it leads to was not found by its own name. A symbolic
    link that leads to no file (its target removed, or a loop of links) is
    skipped, and `skipped` is told which and why."""
    seen: set[str] = set()
    linked: list[tuple[Path, str]] = []  # names through a link, and the file each leads to
    for path in paths:
        if settings.force_exclude and settings.excluded(path):
            continue
        found = _walk(path, settings) if path.is_dir() else iter([path])
        for file in found:
            if os.path.islink(file) and not os.path.exists(file):
                if skipped is not None:
                    skipped(_dangling(file))
                continue
            real = os.path.realpath(file)
            if real != os.path.abspath(file):
                linked.append((file, real))
            elif real not in seen:
                seen.add(real)
                yield file
    for file, real in linked:
        if real not in seen:
            seen.add(real)
            yield file


def _dangling(link: Path) -> str:
    try:
        target = os.readlink(link)
    except OSError:  # removed meanwhile
        return f"{link}: a symbolic link that leads to no file, skipped"
    return (
        f"{link} is a symbolic link to {target}, which does not exist (or is a loop of links); "
        "skipped: remove the link, or restore what it points to"
    )


def _walk(folder: Path, settings: Settings) -> Iterator[Path]:
    # folder -> the .gitignore patterns that apply in it (None: not respected)
    patterns = {os.path.abspath(folder): Gitignore.for_walk(folder) if settings.respect_gitignore else None}
    for root, dirs, files in os.walk(folder):
        root_path = Path(root)
        here = patterns.pop(os.path.abspath(root), None)
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIP_DIRS
            and not d.endswith(".egg-info")
            and not (root_path / d / "pyvenv.cfg").exists()
            and not _skipped(root_path / d, True, settings, here)
        )
        for d in dirs:
            patterns[os.path.abspath(root_path / d)] = here.entering(root_path / d) if here is not None else None
        for name in sorted(files):
            if name.endswith(".py") and not _skipped(root_path / name, False, settings, here):
                yield root_path / name


def _skipped(path: Path, is_dir: bool, settings: Settings, ignored: Gitignore | None) -> bool:
    return settings.excluded(path) or (ignored is not None and ignored.match(path, is_dir))


# -- reading ------------------------------------------------------------------------------


class Snapshot(NamedTuple):
    """A file's bytes as read, and their hash: what a write checks against."""

    data: bytes
    digest: str


def read(path: Path) -> Snapshot:
    data = path.read_bytes()
    return Snapshot(data, digest(data))


# -- writing ------------------------------------------------------------------------------


class WriteRefused(Exception):
    """The file was left as it is; the message says why and what to do."""


def write_back(path: Path, data: bytes, snapshot: Snapshot) -> None:
    """Replace the file at `path` by `data` if it still holds `snapshot`.

    Raises WriteRefused (the file changed since it was read, is read-only, or
    cannot be written safely) or OSError, and leaves the file as it was."""
    real = Path(os.path.realpath(path))
    _unchanged(real, snapshot)
    info = real.stat()
    mode = stat.S_IMODE(info.st_mode)
    if not mode & 0o222 or not os.access(real, os.W_OK):
        raise WriteRefused(
            f"read-only file (mode {mode:04o}), left as it is; make it writable "
            f"(chmod u+w {path}) to apply the fixes, or exclude it"
        )
    if info.st_nlink > 1:  # a rename would split the links: write the one file all of them share
        _write_in_place(real, data, snapshot)
        return
    try:
        _replace(real, data, info, snapshot)
    except _OwnerNotKept:  # another user's file that we may write to: keep it theirs
        _write_in_place(real, data, snapshot)


class _OwnerNotKept(Exception):
    pass


def _unchanged(real: Path, snapshot: Snapshot) -> None:
    try:
        current = real.read_bytes()
    except FileNotFoundError:
        raise WriteRefused("removed while perfmod ran, so not written again") from None
    if digest(current) != snapshot.digest:
        raise WriteRefused(
            "changed on disk while perfmod ran, left as it is (your edit is kept); "
            "run perfmod again to fix the new version"
        )


def _temporary(real: Path, suffix: str) -> tuple[int, str]:
    try:
        import tempfile

        return tempfile.mkstemp(prefix=f".{real.name}.", suffix=suffix, dir=real.parent)
    except PermissionError:
        raise WriteRefused(
            f"its folder {real.parent} is not writable, and perfmod writes a temporary "
            "file beside a file to replace it atomically; make the folder writable"
        ) from None


def _replace(real: Path, data: bytes, info: os.stat_result, snapshot: Snapshot) -> None:
    handle, temporary = _temporary(real, ".perfmod")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        own = os.stat(temporary)
        if (own.st_uid, own.st_gid) != (info.st_uid, info.st_gid):
            try:
                os.chown(temporary, info.st_uid, info.st_gid)
            except PermissionError:
                raise _OwnerNotKept() from None
        os.chmod(temporary, stat.S_IMODE(info.st_mode))  # after chown, which clears set-id bits
        _unchanged(real, snapshot)  # once more, as late as possible
        os.replace(temporary, real)
    except BaseException:
        _remove(temporary)
        raise
    _sync_folder(real.parent)


def _write_in_place(real: Path, data: bytes, snapshot: Snapshot) -> None:
    """Overwrite the file itself (same inode: links, owner, mode, extended
    attributes stay), with a backup beside it until the new bytes are on disk:
    after a crash, `.NAME.*.perfmod-backup` holds the original."""
    handle, backup = _temporary(real, ".perfmod-backup")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(snapshot.data)
            out.flush()
            os.fsync(out.fileno())
        _unchanged(real, snapshot)
        try:
            _overwrite(real, data)
        except BaseException:
            _overwrite(real, snapshot.data)  # roll back; if this fails too, the backup stays
            raise
    except BaseException:
        if digest(real.read_bytes()) == snapshot.digest:
            _remove(backup)
        raise
    _remove(backup)


def _overwrite(real: Path, data: bytes) -> None:
    with open(real, "r+b") as out:
        out.write(data)
        out.truncate()
        out.flush()
        os.fsync(out.fileno())


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _sync_folder(folder: Path) -> None:
    """Make the rename durable; best effort (not every system can open a folder)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write an output file (a report, a cache entry) via a temporary file in
    the same folder renamed over it, keeping an existing file's permission
    bits (a new file gets open()'s): a crash leaves the old file or the new,
    never half (with `durable`; without, as the system flushes it, for files
    whose loss costs only time: cache entries). A symbolic link is followed,
    so the link stays and its target gets the new text."""
    path = Path(os.path.realpath(path))
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else _new_file_mode()
    import tempfile  # here: a cached run writes nothing, and tempfile imports shutil and random

    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".perfmod", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        _remove(temporary)
        raise


def _new_file_mode() -> int:
    """The permission bits open() would give a new file (0o666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask

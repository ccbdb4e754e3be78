"""What the command line needs to know of the rules (code, name, level, opt-in,
where each is defined) without importing them: importing `codemod.rules`
imports libcst and every rule module (about half a second), which `--version`,
`--help` and a `check` whose every result is in the cache do not need.

The facts come from the rule classes themselves when `codemod.rules` is
already imported (the catalogue then is exactly what the engine runs,
test rules included). Otherwise they come from a memo written the first time
the rules were imported, as Python keeps bytecode:

    codemod/rules/__pycache__/catalogue.json    (or under PYTHONPYCACHEPREFIX)

It is keyed by the size and modification time of every source file of perfmod
(`source_stamps`, which the result cache's key holds too) and the Python
version, so an edited, added or removed rule makes it stale: the rules are then
imported and the memo written again. It is written under PYTHONDONTWRITEBYTECODE
too (containers often set it; the memo is one small file, and without it every
run imports the rules). Where the folder cannot be written (a read-only
installation), the rules are imported on every run, as before the memo existed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import astuple, dataclass, fields
from pathlib import Path

PACKAGE = Path(__file__).parent  # codemod/: its .py files are perfmod's sources
MEMO_FORMAT = 1


@dataclass(frozen=True)
class RuleFacts:
    """One rule of the catalogue, as the command line and the cache key use it."""

    module: str
    qualname: str
    code: str
    name: str
    level: str  # the rule's LEVEL as the cache key writes it (str of the enum)
    opt_in: str  # the rule's OPT_IN as the cache key writes it
    file: str | None  # the file defining it (None where inspect cannot tell)

    @classmethod
    def of(cls, rule: type) -> RuleFacts:
        import inspect

        try:
            file: str | None = inspect.getfile(rule)
        except TypeError:
            file = None
        return cls(
            module=rule.__module__,
            qualname=rule.__qualname__,
            code=getattr(rule, "CODE", ""),
            name=getattr(rule, "NAME", ""),
            level=f"{getattr(rule, 'LEVEL', '')}",
            opt_in=f"{getattr(rule, 'OPT_IN', '')}",
            file=file,
        )


def catalogue() -> list[RuleFacts]:
    """The facts of every rule in the catalogue, in its order (by code)."""
    loaded = sys.modules.get("codemod.rules")
    if loaded is not None:  # the live catalogue, whatever changed it in this process
        return [RuleFacts.of(rule) for rule in loaded.ALL_RULES]
    return [RuleFacts(*item) for item in _memo()["rules"]]


def known() -> dict[str, str]:
    """Code -> name of every rule in the catalogue."""
    return {facts.code: facts.name for facts in catalogue()}


def version(package: str) -> str:
    """The installed version of `package` ("unknown" where none is), read from
    the `Version:` line of the first `<package>-<version>.dist-info/METADATA` on
    sys.path, as importlib.metadata finds it; importlib.metadata itself where
    there is no such folder (an egg, a zip). Importing importlib.metadata costs
    more than the rest of a cached run."""
    wanted = re.sub(r"[-_.]+", "_", package).lower()
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip, a path hook, a folder gone
            continue
        for name in names:
            if name.endswith(".dist-info") and re.sub(r"[-_.]+", "_", name.split("-")[0]).lower() == wanted:
                try:
                    with open(os.path.join(entry or ".", name, "METADATA"), encoding="utf-8") as metadata:
                        for line in metadata:
                            if line.startswith("Version:"):
                                return line.split(":", 1)[1].strip()
                            if not line.strip():
                                break  # the headers end
                except OSError:
                    pass
    return _installed_version(package)


def memo_path() -> Path | None:
    """Where the memo lives: beside the bytecode of `codemod.rules` (None where
    this Python keeps no bytecode files)."""
    import importlib.util

    try:
        return Path(importlib.util.cache_from_source(str(PACKAGE / "rules" / "__init__.py"))).with_name(
            "catalogue.json"
        )
    except (NotImplementedError, ValueError):  # sys.implementation.cache_tag is None
        return None


@functools.lru_cache(maxsize=1)
def _memo() -> dict:
    """{"key", "rules": [RuleFacts fields]}: read
    once per process, made afresh (importing the rules) when missing or stale."""
    path, key = memo_path(), _memo_key()
    if path is not None:
        try:
            memo = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(memo, dict) and memo.get("key") == key and _well_formed(memo):
                return memo
        except (OSError, ValueError):  # missing, half-written: made afresh
            pass
    # Written only by a process that imports the rules here: one that had them already
    # may have changed the catalogue (tests pin it to test rules).
    fresh = "codemod.rules" not in sys.modules
    from codemod.rules import ALL_RULES

    memo = {
        "key": key,
        "rules": [list(astuple(RuleFacts.of(rule))) for rule in ALL_RULES],
    }
    if fresh and path is not None:
        _write(path, json.dumps(memo, indent=1))
    return memo


def _well_formed(memo: dict) -> bool:
    rules = memo.get("rules")
    return isinstance(rules, list) and all(
        isinstance(item, list) and len(item) == len(fields(RuleFacts)) for item in rules
    )


def _memo_key() -> str:
    parts = [f"format {MEMO_FORMAT}", f"python {sys.version_info[0]}.{sys.version_info[1]}", *source_stamps()]
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


def _installed_version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as metadata_version

    try:
        return metadata_version(package)
    except PackageNotFoundError:
        return "unknown"


def _write(path: Path, text: str) -> None:
    from codemod.files import atomic_write

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text.encode("utf-8"), durable=False)  # a lost memo only costs an import
    except OSError:
        pass


# -- the sources --------------------------------------------------------------------------


def source_stamps() -> list[str]:
    """Size and modification time of every .py file of perfmod (codemod/), in order."""
    return stamps([str(PACKAGE)])


def stamps(sources: Iterable[str]) -> list[str]:
    """Size and modification time of every .py file in `sources` (files, or folders walked)."""
    found = []
    for source in sorted(sources):
        if os.path.isdir(source):
            for root, dirs, files in os.walk(source):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                found += [_stamp(os.path.join(root, f)) for f in sorted(files) if f.endswith(".py")]
        else:
            found.append(_stamp(source))
    return found


def _stamp(file: str) -> str:
    try:
        info = os.stat(file)
    except OSError:
        return f"{file} missing"
    return f"{file} {info.st_size} {info.st_mtime_ns}"

"""Results of earlier runs, so that a re-run skips files that did not change
(as ruff's `.ruff_cache`).

    .perfmod_cache/            at the project root (the folder of the pyproject.toml), or --cache-dir
      .gitignore               `*`: never committed
      CACHEDIR.TAG             backup tools skip it
      v1/ab/cdef....json       one entry per file path

An entry holds what processing the file gave (findings, error, the rewritten
source for diffs, warnings, note) under a key: the hash of the file's bytes,
the path as named, and a fingerprint of everything else the result depends
on: the perfmod version, the Python and libcst versions, the settings, the
rule catalogue, and the size and time of every source file of perfmod and of
the rules (so an edited rule is never served old results). A changed key is a
miss. An entry also lists the other files of the project its findings were
computed from (the modules a training script imports its helpers from: path,
size, modification time and content hash); when one of them no longer holds
the same bytes, the entry is a miss too. Entries are written atomically (temporary file and rename), so parallel
jobs and concurrent runs at worst write the same entry twice. Entries are
JSON, never pickles: a cache folder that came with a cloned repository can
make perfmod report wrong findings at worst, never run code. `apply` never
writes a file from an entry: a file with fixes is always processed afresh.

`check` runs one round of the rules, `apply` and `report` as many as the fixes
take (`Settings.fixed_point`, codemod.engine). The key leaves that setting out
and the entry says which run made it: a file the first round left unchanged,
without error, is the same result either way and serves both; a file with fixes
is served only to the kind of run that made its entry.
"""

from __future__ import annotations

import binascii
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from codemod.catalogue import PACKAGE, RuleFacts, stamps
from codemod.catalogue import version as catalogue_version
from codemod.config import CACHE_FOLDER
from codemod.files import atomic_write
from codemod.result import FileResult, Finding, Level, Stamp, sha256

if TYPE_CHECKING:
    from codemod.config import Settings
    from codemod.worker import Outcome

FOLDER = CACHE_FOLDER  # beside the project file (codemod.config reads a memo there)
FORMAT = "v1"
CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by perfmod.\n"
    "# For information about cache directory tags see https://bford.info/cachedir/\n"
)


class Cache:
    def __init__(self, folder: Path, fingerprint: str, read_only: bool = False, fixed_point: bool = True) -> None:
        self.folder, self.fingerprint, self.read_only = folder, fingerprint, read_only
        self.fixed_point = fixed_point  # the kind of run whose results this one can use (module docstring)
        self.entries = folder / FORMAT

    @classmethod
    def open(
        cls, folder: Path, settings: Settings, rules: Sequence[type | RuleFacts], read_only: bool = False
    ) -> Cache:
        """The cache in `folder`, created with its .gitignore if need be; OSError if it
        cannot be. `rules`: the catalogue, as rule classes or their facts
        (codemod.catalogue, which does not import them). `read_only`: use what is
        there, create and store nothing (`report` writes nothing but its output)."""
        if read_only:
            return cls(folder, fingerprint(settings, rules), read_only=True, fixed_point=settings.fixed_point)
        (folder / FORMAT).mkdir(parents=True, exist_ok=True)
        for name, text in (
            (".gitignore", "# Created by perfmod: the whole folder is a cache.\n*\n"),
            ("CACHEDIR.TAG", CACHEDIR_TAG),
        ):
            if not (folder / name).exists():
                atomic_write(folder / name, text.encode())
        return cls(folder, fingerprint(settings, rules), fixed_point=settings.fixed_point)

    def _entry(self, path: str) -> Path:
        name = sha256(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()
        return self.entries / name[:2] / f"{name[2:]}.json"

    def _key(self, path: str, content: str) -> str:
        return sha256(f"{self.fingerprint}\0{content}\0{path}".encode("utf-8", "surrogateescape")).hexdigest()

    def get(self, path: str, content: str, data: bytes) -> Outcome | None:
        """The outcome stored for `path` with content hash `content` (its bytes are
        `data`), or None."""
        try:
            entry = json.loads(self._entry(path).read_text(encoding="utf-8"))
            if not isinstance(entry, dict) or entry.get("key") != self._key(path, content):
                return None
            dependencies = tuple(Stamp(*item) for item in entry.get("dependencies", ()))
            if not all(stamp.fresh() for stamp in dependencies):
                return None  # a module of the project it read changed since
            outcome = _outcome(entry, path, data)
            result = outcome.result
            if entry.get("fixed_point", True) != self.fixed_point and (result.changed or result.error is not None):
                return None  # another round could change it: made by the other kind of run
            result.dependencies = dependencies
            return outcome
        except (OSError, ValueError, KeyError, TypeError):  # missing, half-written by an older format, foreign
            return None

    def put(self, path: str, content: str, outcome: Outcome) -> None:
        """Store an outcome; a cache that cannot be written is no error (the next run redoes the work)."""
        if self.read_only:
            return
        file = self._entry(path)
        try:
            entry = {"key": self._key(path, content), "fixed_point": self.fixed_point, **_as_json(outcome)}
            text = json.dumps(entry, separators=(",", ":"))
            file.parent.mkdir(exist_ok=True)
            atomic_write(file, text.encode(), durable=False)  # a lost entry only costs its file's analysis
        except (OSError, TypeError, ValueError):  # unwritable, or a finding field JSON cannot hold
            pass


def project_folder(settings: Settings) -> Path:
    """Where `.perfmod_cache` goes: beside the pyproject.toml the settings came
    from, else the working folder (as ruff does)."""
    return settings.root if settings.root is not None else Path.cwd()


# -- the key ------------------------------------------------------------------------------


def fingerprint(settings: Settings, rules: Sequence[type | RuleFacts]) -> str:
    """The key of everything but the file: `rules` as rule classes or as their
    facts (the same key either way)."""
    parts = [
        f"perfmod {_version()}",
        f"python {sys.version_info[0]}.{sys.version_info[1]}",
        f"libcst {_version('libcst')}",
        # (not fixed_point: an entry says which kind of run made it, Cache.get)
        repr([(name, _plain(value)) for name, value in settings._asdict().items() if name != "fixed_point"]),
    ]
    sources = {str(PACKAGE)}
    for rule in rules:
        facts = rule if isinstance(rule, RuleFacts) else RuleFacts.of(rule)
        parts.append(f"{facts.module}.{facts.qualname} {facts.code} {facts.level} {facts.opt_in}")
        if facts.file is not None and not facts.file.startswith(f"{PACKAGE}{os.sep}"):
            sources.add(facts.file)  # a rule outside perfmod's folder (perfmod's own: stamped with it)
    parts += stamps(sources)
    return sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


def _version(package: str = "perfmod") -> str:
    """The installed version of perfmod or libcst (codemod.catalogue: without importlib.metadata)."""
    return catalogue_version(package)


def _plain(value):
    if isinstance(value, Mapping):
        return sorted((str(k), _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


# -- entries ------------------------------------------------------------------------------


def _as_json(outcome: Outcome) -> dict:
    result = outcome.result
    new = result.new_source
    return {
        "findings": [_finding_json(f) for f in result.findings],
        "error": result.error,
        "new_source": None
        if new is None
        else "same"
        if new == result.source
        else binascii.b2a_base64(new, newline=False).decode(),
        "warnings": outcome.warnings,
        "note": outcome.note,
        "dependencies": [[d.path, d.size, d.mtime_ns, d.digest] for d in result.dependencies],
    }


def _finding_json(finding: Finding) -> dict:
    return {name: value.label if isinstance(value, Level) else value for name, value in finding._asdict().items()}


def _outcome(entry: dict, path: str, data: bytes) -> Outcome:
    from codemod.worker import Outcome  # light: the engine loads only when a file is analysed

    new = entry["new_source"]
    result = FileResult(
        path=path,
        source=data,
        new_source=None if new is None else data if new == "same" else binascii.a2b_base64(new),
        findings=[_finding(f, path) for f in entry["findings"]],
        error=entry["error"],
    )
    return Outcome(result, list(entry["warnings"]), entry["note"])


def _finding(entry: dict, path: str) -> Finding:
    values = dict(entry)
    values["level"] = Level.parse(values["level"])
    values["path"] = path
    if "fix_lines" in values:
        values["fix_lines"] = tuple(tuple(span) for span in values["fix_lines"])
    return Finding(**values)

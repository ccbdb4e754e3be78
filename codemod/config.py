"""Settings: ``[tool.perfmod]`` in the nearest pyproject.toml, then CLI overrides.

    [tool.perfmod]
    level = "safe"                 # highest fix level applied: safe | numeric | unsafe
    select = ["PM1", "PM401"]      # codes or prefixes; default: every rule but the opt-in ones
    ignore = ["PM403"]
    exclude = ["legacy/*", "*_pb2.py"]
    per-file-ignores = { "scripts/*" = ["PM101"] }
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Iterable, Mapping

from codemod.rule import Level

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


class ConfigError(ValueError):
    """A setting that cannot be used; the message says which and why."""


KNOWN_KEYS = {"level", "select", "ignore", "exclude", "per-file-ignores", "amp"}


@dataclass(frozen=True)
class Settings:
    level: Level = Level.SAFE
    select: tuple[str, ...] = ("PM",)
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    per_file_ignores: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    amp: str = "bf16"  # precision PM301 writes: bf16 (no scaler) or fp16 (GradScaler)
    root: Path | None = None  # folder of the pyproject.toml the settings came from

    def with_overrides(self, **overrides) -> "Settings":
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def enabled(self, code: str, path: str | None = None, *, opt_in: bool = False) -> bool:
        """Is the rule `code` selected for `path`? Codes match by prefix, as in ruff;
        an opt-in rule only when `select` names its code in full."""
        selected = code in self.select if opt_in else _matches(code, self.select)
        if not selected or _matches(code, self.ignore):
            return False
        if path is not None:
            relative = self._relative(path)
            for pattern, codes in self.per_file_ignores.items():
                if _glob(relative, pattern) and _matches(code, codes):
                    return False
        return True

    def excluded(self, path: str | Path) -> bool:
        relative = self._relative(path)
        return any(_glob(relative, pattern) for pattern in self.exclude)

    def _relative(self, path: str | Path) -> str:
        resolved = Path(path).absolute()
        if self.root is not None:
            try:
                return resolved.relative_to(self.root.absolute()).as_posix()
            except ValueError:
                pass
        return PurePath(path).as_posix()


def _matches(code: str, prefixes: Iterable[str]) -> bool:
    return any(p == "ALL" or code.startswith(p) for p in prefixes)


def _glob(relative: str, pattern: str) -> bool:
    """Match a path or any of its parent folders, so `legacy/` and `legacy/*` both work."""
    pattern = pattern.rstrip("/")
    parts = relative.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)] + parts
    return any(fnmatch.fnmatchcase(c, pattern) for c in candidates)


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml above `start` that has a [tool.perfmod] table;
    as ruff does, a project file without one does not hide a parent's settings."""
    start = start.absolute()
    for folder in [start, *start.parents] if start.is_dir() else start.parents:
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and "perfmod" in _read_toml(candidate).get("tool", {}):
            return candidate
    return None


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read configuration: {error}") from error


def load_settings(start: Path | None = None, config_file: Path | None = None) -> Settings:
    """Settings from `config_file`, or the nearest pyproject.toml above `start`
    with a [tool.perfmod] table; defaults when there is none."""
    path = config_file or find_pyproject(start or Path.cwd())
    if path is None:
        return Settings()
    table = _read_toml(path).get("tool", {}).get("perfmod")
    if table is None:
        return Settings(root=path.parent)
    return settings_from_table(table, source=str(path), root=path.parent)


def settings_from_table(table: Mapping, source: str = "[tool.perfmod]", root: Path | None = None) -> Settings:
    unknown = set(table) - KNOWN_KEYS
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) in [tool.perfmod]: {', '.join(sorted(unknown))}")
    try:
        level = Level.parse(table.get("level", "safe"))
    except ValueError as error:
        raise ConfigError(f"{source}: {error}") from None
    amp = table.get("amp", "bf16")
    if amp not in ("bf16", "fp16"):
        raise ConfigError(f"{source}: amp must be 'bf16' or 'fp16', not {amp!r}")
    per_file = table.get("per-file-ignores", {})
    return Settings(
        level=level,
        select=_codes(table.get("select", ["PM"]), source, "select"),
        ignore=_codes(table.get("ignore", []), source, "ignore"),
        exclude=tuple(_strings(table.get("exclude", []), source, "exclude")),
        per_file_ignores={k: _codes(v, source, f"per-file-ignores.{k}") for k, v in per_file.items()},
        amp=amp,
        root=root,
    )


def parse_codes(text: str) -> tuple[str, ...]:
    """`PM101,PM4` from the command line."""
    return _codes([c for c in text.split(",") if c.strip()], "command line", "codes")


def _strings(value, source: str, key: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source}: {key} must be a list of strings")
    return value


def _codes(value, source: str, key: str) -> tuple[str, ...]:
    codes = tuple(c.strip().upper() for c in _strings(value, source, key))
    for code in codes:
        if code != "ALL" and not code.startswith("PM"):
            raise ConfigError(f"{source}: {key}: {code!r} is not a perfmod code (PMnnn, a prefix such as PM1, or ALL)")
    return codes

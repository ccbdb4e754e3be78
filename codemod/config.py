"""Settings: ``[tool.perfmod]`` in the nearest pyproject.toml, then CLI overrides.

    [tool.perfmod]
    level = "safe"                 # highest fix level applied: safe | numeric | unsafe
    select = ["PM1", "PM401"]      # codes or prefixes; default: every rule but the opt-in ones; ALL: every rule
    ignore = ["PM403"]
    exclude = ["legacy/*", "*_pb2.py"]
    per-file-ignores = { "scripts/*" = ["PM101"] }
    respect-gitignore = true       # skip what .gitignore files ignore when walking folders
    force-exclude = false          # apply `exclude` to files named on the command line too

Every value is checked against its expected type; a wrong one is a
ConfigError whose message names the file, the key and what was expected,
on one line. Codes are checked against the catalogue when one is given.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePath
from typing import NamedTuple

from codemod.result import Level, digest

CACHE_FOLDER = ".perfmod_cache"  # the result cache's folder (codemod.cache), beside the project file


class ConfigError(ValueError):
    """A setting that cannot be used; the message says which and why."""


LEVELS = ", ".join(f'"{level.label}"' for level in Level)
# key -> what a value must be, as the error message says it
KNOWN_KEYS = {
    "level": f"one of {LEVELS}",
    "select": 'a list of rule codes or prefixes, e.g. ["PM1", "PM401"]',
    "ignore": 'a list of rule codes or prefixes, e.g. ["PM403"]',
    "exclude": 'a list of glob patterns, e.g. ["legacy/", "*_pb2.py"]',
    "per-file-ignores": 'a table of glob pattern = list of codes, e.g. { "scripts/*" = ["PM101"] }',
    "amp": 'one of "bf16", "fp16"',
    "respect-gitignore": "true or false",
    "force-exclude": "true or false",
}
DEFAULT_LINE_LENGTH = 88  # black's and ruff's
CODE_SHAPE = re.compile(r"^(PM\d*|ALL)$")


class Settings(NamedTuple):  # a named tuple: a tenth of a frozen dataclass's cost to define
    """What to run and how far to fix (`settings._replace(...)` for a changed copy)."""

    level: Level = Level.SAFE
    select: tuple[str, ...] = ("PM",)
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    per_file_ignores: Mapping[str, tuple[str, ...]] = {}  # (read only, as every field: one default is shared)
    amp: str = "bf16"  # precision PM301 writes: bf16 (no scaler) or fp16 (GradScaler)
    root: Path | None = None  # folder of the pyproject.toml the settings came from
    respect_gitignore: bool = True
    force_exclude: bool = False
    # Where lines the fixes lengthen are wrapped: the project's ruff or black line-length;
    # None when it sets none (then the file's own lines say: `layout.file_line_length`).
    line_length: int | None = None
    # Not a [tool.perfmod] key: False for `check`, which runs one round of the rules
    # (every pass of it) and reports what it finds, as ruff's check does; `apply`, its
    # --dry-run and --diff repeat the rounds until the file stops changing (codemod.engine).
    fixed_point: bool = True

    def with_overrides(self, **overrides) -> Settings:
        return self._replace(**{k: v for k, v in overrides.items() if v is not None})

    def enabled(self, code: str, path: str | None = None, *, opt_in: bool = False) -> bool:
        """Is the rule `code` selected for `path`? Codes match by prefix, as in ruff;
        an opt-in rule only when `select` names its code in full or is ALL (as in
        ruff, ALL is every rule)."""
        selected = (code in self.select or "ALL" in self.select) if opt_in else _matches(code, self.select)
        if not selected or _matches(code, self.ignore):
            return False
        if path is not None:
            relative = self._relative(path)
            for pattern, codes in self.per_file_ignores.items():
                if _glob(relative, pattern) and _matches(code, codes):
                    return False
        return True

    def excluded(self, path: str | Path) -> bool:
        if not self.exclude:
            return False
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


# -- reading ------------------------------------------------------------------------------


def find_pyproject(start: Path, memo: Path | None = None) -> Path | None:
    """The nearest pyproject.toml above `start` that has a [tool.perfmod] table;
    as ruff does, a project file without one does not hide a parent's settings."""
    start = start.absolute()
    for folder in [start, *start.parents] if start.is_dir() else start.parents:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            tool = _read_toml(candidate, memo).get("tool", {})
            if isinstance(tool, dict) and "perfmod" in tool:
                return candidate
    return None


def _toml_reader():
    # Imported when a file is read: `--version` and `--help` read no configuration.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    return tomllib


# TOML text -> its table: a pyproject.toml is read for the settings, and again for the
# formatter's line length, once parsed (the tables are only read, never changed).
_PARSED: dict[str, dict] = {}
# The tables of the configuration files kept between runs, by the SHA-256 of their text:
# the cache folder's TOML_MEMO (written by `save_parsed`), so that a run whose every result
# is cached does not load the TOML parser. A file whose text changed is parsed again.
TOML_MEMO = "toml.json"
_REMEMBERED: dict[str, dict] = {}
_MEMO_FOLDERS: dict[str, bool] = {}  # the folders whose memo was looked at


def _loads(text: str, folders: Iterable[Path] = ()) -> dict:
    table = _PARSED.get(text)
    if table is None:
        key = digest(text.encode("utf-8", "surrogateescape"))
        for folder in folders:
            if key in _REMEMBERED:
                break
            _remember(folder)
        table = _REMEMBERED.get(key)
        if table is None:
            table = _toml_reader().loads(text)
        _PARSED[text] = table
    return table


def _remember(folder: Path) -> None:
    """Read the memo of parsed tables in `folder` (once)."""
    if str(folder) in _MEMO_FOLDERS:
        return
    _MEMO_FOLDERS[str(folder)] = True
    try:
        import json

        with open(folder / TOML_MEMO, encoding="utf-8") as handle:
            memo = json.load(handle)
    except (OSError, ValueError):
        return
    if isinstance(memo, dict):
        _REMEMBERED.update((k, v) for k, v in memo.items() if isinstance(v, dict) and k not in _REMEMBERED)


def parsed_tables() -> dict[str, dict]:
    """The tables of the TOML files this process read, by the SHA-256 of their text."""
    return {digest(text.encode("utf-8", "surrogateescape")): table for text, table in _PARSED.items()}


def save_parsed(folder: Path, write: Callable[[Path, bytes], None]) -> None:
    """Keep the tables this process parsed in `folder` (a cache folder), for the next run;
    nothing when the memo there holds them already or one holds what JSON cannot."""
    import json

    tables = parsed_tables()
    if not tables:
        return
    _remember(folder)
    if all(key in _REMEMBERED for key in tables) and (folder / TOML_MEMO).exists():
        return
    try:
        text = json.dumps(tables, allow_nan=False, sort_keys=True)
        if json.loads(text) != tables:  # (a date, a time: not what JSON gives back)
            return
        write(folder / TOML_MEMO, text.encode("utf-8"))
        _REMEMBERED.update(tables)
    except (OSError, TypeError, ValueError):
        pass


def _memo_folders(path: Path, memo: Path | None) -> list[Path]:
    """Where a memo of parsed tables may be for the configuration file `path`: the cache
    folder of the run when one is named, else the one beside the file."""
    return [memo] if memo is not None else [path.parent / CACHE_FOLDER]


def _read_toml(path: Path, memo: Path | None = None) -> dict:
    try:
        return _loads(path.read_text(encoding="utf-8"), _memo_folders(path, memo))
    except (OSError, UnicodeDecodeError, _toml_reader().TOMLDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise ConfigError(f"{path}: cannot read configuration: {reason}; fix the file or pass --config") from None


def load_settings(
    start: Path | None = None,
    config_file: Path | None = None,
    known: Mapping[str, str] | None = None,
    memo: Path | None = None,
) -> Settings:
    """Settings from `config_file`, or the nearest pyproject.toml above `start`
    with a [tool.perfmod] table; defaults when there is none. `memo`: the cache
    folder named on the command line, where parsed tables may be kept. `known` (code ->
    rule name) makes codes that match no rule an error."""
    path = config_file or find_pyproject(start or Path.cwd(), memo)
    line_length = formatter_line_length(start or Path.cwd(), memo)
    if path is None:
        return Settings(line_length=line_length)
    tool = _read_toml(path, memo).get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(f"{path}: `tool` must be a table ([tool.perfmod]), got {_shown(tool)}")
    table = tool.get("perfmod")
    if table is None:
        return Settings(root=path.parent, line_length=line_length)
    settings = settings_from_table(table, source=str(path), root=path.parent, known=known)
    return settings._replace(line_length=line_length)


def formatter_line_length(start: Path, memo: Path | None = None) -> int | None:
    """The line length the project's formatter keeps, as ruff finds it: the nearest
    ruff.toml / .ruff.toml (`line-length`) or pyproject.toml with [tool.ruff] (or
    [tool.black]) above `start` (88, their default, when that table sets none); None
    when there is no such table."""
    start = start.absolute()
    for folder in [start, *start.parents] if start.is_dir() else start.parents:
        for name in ("ruff.toml", ".ruff.toml", "pyproject.toml"):
            candidate = folder / name
            if not candidate.is_file():
                continue
            try:
                table = _loads(candidate.read_text(encoding="utf-8"), _memo_folders(candidate, memo))
            except (OSError, UnicodeDecodeError, _toml_reader().TOMLDecodeError):
                continue
            tool = table.get("tool", {}) if name == "pyproject.toml" else {"ruff": table}
            for formatter in ("ruff", "black"):
                found = tool.get(formatter) if isinstance(tool, dict) else None
                if isinstance(found, dict):
                    value = found.get("line-length")
                    valid = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 320
                    return value if valid else DEFAULT_LINE_LENGTH
    return None


def settings_from_table(
    table, source: str = "pyproject.toml", root: Path | None = None, known: Mapping[str, str] | None = None
) -> Settings:
    if not isinstance(table, dict):
        raise ConfigError(
            f'{source}: [tool.perfmod] must be a table of settings (level = "safe", ...), got {_shown(table)}'
        )
    for key in table:
        if key not in KNOWN_KEYS:
            import difflib

            close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{source}: [tool.perfmod] unknown key {key!r}; {hint}known keys: {', '.join(KNOWN_KEYS)}"
            )
    check = _Checker(source, known)
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise check.error("per-file-ignores", per_file)
    return Settings(
        level=Level.parse(check.choice("level", table.get("level", "safe"), [level.label for level in Level])),
        select=check.codes("select", table.get("select", ["PM"])),
        ignore=check.codes("ignore", table.get("ignore", [])),
        exclude=check.strings("exclude", table.get("exclude", [])),
        per_file_ignores={
            pattern: check.codes("ignore", codes, f'per-file-ignores."{pattern}"')
            for pattern, codes in per_file.items()
        },
        amp=check.choice("amp", table.get("amp", "bf16"), ["bf16", "fp16"]),
        respect_gitignore=check.boolean("respect-gitignore", table.get("respect-gitignore", True)),
        force_exclude=check.boolean("force-exclude", table.get("force-exclude", False)),
        root=root,
    )


class _Checker:
    """Type checks of one table's values, each failing with the file, the key and
    what was expected."""

    def __init__(self, source: str, known: Mapping[str, str] | None) -> None:
        self.source, self.known = source, known

    def error(self, key: str, value, detail: str = "", shown_key: str | None = None) -> ConfigError:
        detail = detail or f"got {_shown(value)}"
        return ConfigError(f"{self.source}: [tool.perfmod] {shown_key or key}: expected {KNOWN_KEYS[key]}; {detail}")

    def choice(self, key: str, value, choices: list[str]) -> str:
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise self.error(key, value)
        return value.strip().lower()

    def boolean(self, key: str, value) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, value)
        return value

    def strings(self, key: str, value, shown_key: str | None = None) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.error(key, value, shown_key=shown_key)
        return tuple(value)

    def codes(self, key: str, value, shown_key: str | None = None) -> tuple[str, ...]:
        shown_key = shown_key or key
        if isinstance(value, str) and value.strip():
            listed = ", ".join(f'"{code}"' for code in split_codes(value))
            raise self.error(key, value, f"got the string {_shown(value)}; write a list: [{listed}]", shown_key)
        codes = self.strings(key, value, shown_key)
        for code in codes:
            problem = code_problem(code, self.known)
            if problem:
                raise self.error(key, value, problem, shown_key)
        return tuple(code.strip().upper() for code in codes)


def split_codes(text: str) -> list[str]:
    """`PM101,PM4` or `PM101 PM4` -> the codes, upper case."""
    return [code.upper() for code in re.split(r"[\s,]+", text.strip()) if code]


def code_problem(code: str, known: Mapping[str, str] | None) -> str | None:
    """Why `code` cannot be used in a selection (None when it can): it is not a
    code at all, several codes in one string, or (with `known`, code -> name) a
    code that matches no rule."""
    text = code.strip().upper()
    if len(split_codes(text)) > 1:
        listed = ", ".join(f'"{part}"' for part in split_codes(text))
        return f"{code!r} holds several codes; give each its own string: [{listed}]"
    if not CODE_SHAPE.match(text):
        return f"{code!r} is not a perfmod code (PMnnn, a prefix such as PM1, or ALL)"
    if known is not None and text != "ALL" and not any(rule.startswith(text) for rule in known):
        return f"{text} matches no rule. {suggest(text, known)}"
    return None


def parse_codes(text: str, known: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """`PM101,PM4` from the command line."""
    codes = split_codes(text)
    for code in codes:
        problem = code_problem(code, known)
        if problem:
            raise ConfigError(problem)
    return tuple(codes)


def suggest(text: str, known: Mapping[str, str]) -> str:
    """Codes (or rule names) close to `text`, or where to find them all; `known` is code -> name."""
    import difflib

    text = text.upper()
    names = {name.upper(): code for code, name in known.items()}
    close = [code for code in known if code.startswith(text)] or sorted(
        set(
            difflib.get_close_matches(text, list(known), n=3, cutoff=0.6)
            + [names[name] for name in difflib.get_close_matches(text, list(names), n=3, cutoff=0.6)]
        )
    )
    if close:
        return f"Did you mean {', '.join(close)}? `perfmod rules` lists every rule."
    return f"Known codes: {', '.join(known)}; `perfmod rules` lists them with their names."


def _shown(value) -> str:
    """A TOML value as the user wrote it, and its TOML type."""
    kinds = [
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a float"),
        (str, "a string"),
        (list, "an array"),
        (dict, "a table"),
    ]
    kind = next((name for cls, name in kinds if isinstance(value, cls)), type(value).__name__)
    text = _toml(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({kind})"


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {_toml(item)}" for key, item in value.items()) + " }"
    return str(value)

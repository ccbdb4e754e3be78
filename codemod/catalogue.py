"""What the command line needs to know of the rules (code, name, level, opt-in,
where each is defined) without importing them: importing `codemod.rules`
imports libcst and every rule module (about half a second), which `--version`,
`--help` and a `check` whose every result is in the cache do not need.

The facts come from the rule classes themselves once `codemod.rules` is
imported (the catalogue then is exactly what the engine runs, rules that
tests register included). Before that they come from `codemod/rule_catalogue.py`,
a module generated from the rule classes and committed with them, as ruff
commits its generated rule tables:

    python -m codemod.catalogue            # write codemod/rule_catalogue.py again
    python -m codemod.catalogue --check    # exit 1 if it differs from the rules

tests/test_startup.py fails when it is stale. Nothing is written at run time.
A rule module added or removed without regenerating is noticed here (the
generated module lists the modules it was made from) and the rules are then
imported, as before the catalogue existed; a rule's facts edited without
regenerating change only the cache key's text, and the key also holds the size
and time of every source file of perfmod, so a stale result is never served.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

PACKAGE = Path(__file__).parent  # codemod/: its .py files are perfmod's sources
RULES_FOLDER = PACKAGE / "rules"
GENERATED = PACKAGE / "rule_catalogue.py"


class RuleFacts(NamedTuple):  # a named tuple: a tenth of a frozen dataclass's cost to define
    """One rule of the catalogue, as the command line and the cache key use it."""

    module: str
    qualname: str
    code: str
    name: str
    level: str  # the level's label: safe, numeric, unsafe
    opt_in: bool
    file: str | None  # the file defining it (None where inspect cannot tell)

    @classmethod
    def of(cls, rule: type) -> RuleFacts:
        import inspect

        try:
            file: str | None = inspect.getfile(rule)
        except TypeError:
            file = None
        level = getattr(rule, "LEVEL", None)
        return cls(
            module=rule.__module__,
            qualname=rule.__qualname__,
            code=getattr(rule, "CODE", ""),
            name=getattr(rule, "NAME", ""),
            level=getattr(level, "label", f"{level}"),
            opt_in=bool(getattr(rule, "OPT_IN", False)),
            file=file,
        )


def catalogue() -> list[RuleFacts]:
    """The facts of every rule in the catalogue, in its order (by code)."""
    loaded = sys.modules.get("codemod.rules")
    if loaded is None:
        generated = _generated()
        if generated is not None:
            return generated
        from codemod import rules as loaded
    return [RuleFacts.of(rule) for rule in loaded.ALL_RULES]


def known() -> dict[str, str]:
    """Code -> name of every rule in the catalogue."""
    return {facts.code: facts.name for facts in catalogue()}


def rule_modules() -> list[str]:
    """The modules of codemod/rules/ the registry imports (as pkgutil finds them)."""
    return sorted(_rule_module_files())


def _rule_module_files() -> dict[str, str]:
    """Module name -> its file, for the modules of codemod/rules/ (one listing)."""
    try:
        names = os.listdir(RULES_FOLDER)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.endswith(".py") and name != "__init__.py":
            found.setdefault(name[:-3], os.path.join(RULES_FOLDER, name))
        elif "." not in name and os.path.isfile(os.path.join(RULES_FOLDER, name, "__init__.py")):
            found[name] = os.path.join(RULES_FOLDER, name, "__init__.py")  # a package wins, as for import
    return found


def _generated() -> list[RuleFacts] | None:
    """The committed catalogue, or None where it is missing or was made from
    other rule modules than those there now."""
    try:
        from codemod import rule_catalogue
    except ImportError:
        return None
    files = _rule_module_files()
    if list(rule_catalogue.MODULES) != sorted(files):
        return None
    return [
        RuleFacts(f"codemod.rules.{module}", qualname, code, name, level, opt_in, files[module])
        for code, name, level, opt_in, module, qualname in rule_catalogue.RULES
    ]


# -- generating it ------------------------------------------------------------------------

HEADER = '''"""The rule catalogue's facts, for the command line to use without importing
the rules. Generated from the rule classes by `python -m codemod.catalogue`:
do not edit (tests/test_startup.py fails when it is stale)."""

'''


def generate() -> str:
    """The text of codemod/rule_catalogue.py for the rules of codemod/rules/ as they are
    (discovered afresh, whatever this process did to the registry's lists), laid out
    as `ruff format` lays it out."""
    from codemod.rules import discover

    rows = []
    for rule in discover():
        facts = RuleFacts.of(rule)
        module = facts.module.removeprefix("codemod.rules.")
        rows.append(_tuple((facts.code, facts.name, facts.level, facts.opt_in, module, facts.qualname)))
    return (
        HEADER
        + "# The modules of codemod/rules/ it was made from.\nMODULES = (\n"
        + "".join(f"    {_literal(name)},\n" for name in rule_modules())
        + ")\n\n# code, name, level, opt-in, module of codemod.rules, class\nRULES = (\n"
        + "".join(rows)
        + ")\n"
    )


def _literal(value: str | bool) -> str:
    return repr(value) if isinstance(value, bool) else json.dumps(value)


def _tuple(values: tuple) -> str:
    """One row of RULES: on one line where it fits in 120 columns, else one value a line."""
    line = f"    ({', '.join(map(_literal, values))}),\n"
    if len(line) <= 121:
        return line
    return "    (\n" + "".join(f"        {_literal(value)},\n" for value in values) + "    ),\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m codemod.catalogue", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed catalogue is stale; write nothing"
    )
    args = parser.parse_args(argv)
    text = generate()
    try:
        current = GENERATED.read_text(encoding="utf-8")
    except OSError:
        current = None
    if args.check:
        if current != text:
            print(f"{GENERATED} is stale: run `python -m codemod.catalogue`", file=sys.stderr)
            return 1
        return 0
    if current != text:
        GENERATED.write_text(text, encoding="utf-8")
        print(f"wrote {GENERATED}")
    return 0


# -- versions and sources -----------------------------------------------------------------


def version(package: str) -> str:
    """The installed version of `package` ("unknown" where none is), read from
    the `Version:` line of the first `<package>-<version>.dist-info/METADATA` on
    sys.path, as importlib.metadata finds it; importlib.metadata itself where
    there is no such folder (an egg, a zip). Importing importlib.metadata costs
    more than the rest of a cached run."""
    wanted = re.sub(r"[-_.]+", "_", package).lower()
    for entry, names in _dist_infos():
        for name in names:
            if re.sub(r"[-_.]+", "_", name.split("-")[0]).lower() == wanted:
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


def _dist_infos() -> list[tuple[str, list[str]]]:
    """(sys.path entry, its `.dist-info` folders) for each entry that is a folder, listed
    once for the versions a run asks (perfmod's and libcst's)."""
    key = tuple(sys.path)
    if _DIST_INFOS.get("path") != key:
        found = []
        for entry in sys.path:
            try:
                names = os.listdir(entry or ".")
            except OSError:  # a zip, a path hook, a folder gone
                continue
            found.append((entry, [name for name in names if name.endswith(".dist-info")]))
        _DIST_INFOS.update(path=key, found=found)
    return _DIST_INFOS["found"]


_DIST_INFOS: dict = {}


def _installed_version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as metadata_version

    try:
        return metadata_version(package)
    except PackageNotFoundError:
        return "unknown"


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


if __name__ == "__main__":
    sys.exit(main())

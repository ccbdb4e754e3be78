"""What every rule finds and rewrites on a set of files, saved and compared: the
check that a change beneath the rules changes no result it did not mean to.

    python -m benchmarks.snapshot save /tmp/before.json            # fixtures/, every rule, level unsafe
    python -m benchmarks.snapshot save /tmp/after.json
    python -m benchmarks.snapshot compare /tmp/before.json /tmp/after.json

`save` takes folders or files (default: fixtures/); each file is processed as its
own root, at level unsafe with every rule selected, opt-in ones too. `compare`
prints each file whose findings or rewrite differ and exits 1 when one does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def snapshot(paths: list[Path]) -> dict[str, dict]:
    from codemod.config import Settings
    from codemod.engine import process_source
    from codemod.result import Level
    from codemod.rules import ALL_RULES

    settings = Settings(level=Level.UNSAFE, select=tuple(rule.CODE for rule in ALL_RULES))
    # Keyed by the path below the folder given, so that two checkouts compare.
    files = sorted({(f, f.relative_to(p) if p.is_dir() else Path(f.name)) for p in paths for f in _files(p)})
    results = {}
    for number, (path, key) in enumerate(files, 1):
        print(f"\r{number}/{len(files)} {path}"[:100].ljust(100), end="", file=sys.stderr, flush=True)
        result = process_source(path.read_bytes(), str(path), settings)
        rewrite = result.new_source if result.new_source is not None else b""
        results[str(key)] = {
            "error": result.error,
            "findings": [
                f"{f.line}:{f.column} {f.code} {'fix' if f.fixable else 'report'} {f.message}" for f in result.findings
            ],
            "rewrite": hashlib.sha256(rewrite).hexdigest()[:16],
        }
    print(file=sys.stderr)
    return results


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def compare(before: dict[str, dict], after: dict[str, dict]) -> int:
    differing = 0
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        differing += 1
        print(f"== {path}")
        if old is None or new is None:
            print("   only in the " + ("second" if old is None else "first") + " snapshot")
            continue
        if old["error"] != new["error"]:
            print(f"   error: {old['error']!r} -> {new['error']!r}")
        for line in sorted(set(old["findings"]) - set(new["findings"])):
            print(f"   - {line}")
        for line in sorted(set(new["findings"]) - set(old["findings"])):
            print(f"   + {line}")
        if old["rewrite"] != new["rewrite"]:
            print("   rewrite differs")
    print(f"{differing} of {len(before.keys() | after.keys())} files differ")
    return 1 if differing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    save = commands.add_parser("save", help="write the snapshot of PATHS to OUTPUT")
    save.add_argument("output", type=Path)
    save.add_argument("paths", type=Path, nargs="*", default=[REPO / "fixtures"])
    diff = commands.add_parser("compare", help="the files whose results differ between two snapshots")
    diff.add_argument("before", type=Path)
    diff.add_argument("after", type=Path)
    options = parser.parse_args(argv)
    if options.command == "save":
        options.output.write_text(json.dumps(snapshot(options.paths), indent=1, sort_keys=True))
        return 0
    return compare(json.loads(options.before.read_text()), json.loads(options.after.read_text()))


if __name__ == "__main__":
    sys.exit(main())

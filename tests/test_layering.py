"""The layers of codemod/: analyses beneath rules, rules beside each other.

- A rule imports no other rule, and no module imports a private name (`_x`) of
  another or calls a private method of another's objects (`kinds._class_of(...)`):
  what two modules share is public in the lower one.
- The analyses import no rule.
- Every module imports on its own, first, in a fresh interpreter state: no
  import cycle that works only in one order.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODEMOD = REPO / "codemod"


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of each `from codemod... import names`, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("codemod"):
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names if alias.name.startswith("codemod")]
    return found


SOURCES = sorted(CODEMOD.rglob("*.py"))


def test_no_module_imports_a_private_name_of_another():
    offending = [
        f"{path.relative_to(REPO)}:{line}: {module}.{name}"
        for path in SOURCES
        for line, module, names in _imports(path)
        for name in names
        if name.startswith("_") and module != _module(path)
    ]
    assert offending == []


def _private_methods(tree: ast.AST) -> set[str]:
    return {
        method.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for method in node.body
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.name.startswith("_")
    }


def test_no_module_reaches_for_a_private_name_of_another():
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in SOURCES}
    defined = {path: _private_methods(tree) for path, tree in trees.items()}
    elsewhere = {name for names in defined.values() for name in names if not name.startswith("__")}
    offending = [
        f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}"
        for path, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in elsewhere
        and node.attr not in defined[path]
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert offending == []


def _rule(module: str) -> str:
    """`codemod.rules.x` of `codemod.rules.x.plan`: the rule a module belongs to."""
    return ".".join(module.split(".")[:3])


def test_rules_import_no_other_rule_and_analyses_no_rule():
    offending = []
    for path in SOURCES:
        own = _module(path)
        for line, module, _ in _imports(path):
            # a rule may be a package: its own modules are the rule's
            if own.startswith("codemod.rules.") and module.startswith("codemod.rules.") and _rule(module) != _rule(own):
                offending.append(f"{path.relative_to(REPO)}:{line}: {module}")
            if own.startswith("codemod.analysis") and module.startswith("codemod.rules"):
                offending.append(f"{path.relative_to(REPO)}:{line}: {module}")
    assert offending == []


def test_every_module_imports_first_on_its_own():
    modules = [_module(path) for path in SOURCES if path.name != "__main__.py"]
    code = (
        "import importlib, sys\n"
        "failed = []\n"
        f"for name in {modules!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'codemod' or m.startswith('codemod.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as error:\n"
        "        failed.append(f'{name}: {type(error).__name__}: {error}')\n"
        "print('\\n'.join(failed))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""

"""Read-only visits without rebuilding the tree give libcst's own scopes."""

import threading
from collections import Counter
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ScopeProvider

from codemod.analysis.visits import read_only_visits

REPO = Path(__file__).resolve().parents[2]
# Whole scripts, a sample of rule fixtures, and perfmod's own biggest modules (classes, closures,
# comprehensions, try/except, decorators, walrus...).
FILES = (
    sorted((REPO / "fixtures" / "scripts").glob("*.py"))
    + sorted((REPO / "fixtures" / "training").glob("*.py"))
    + sorted((REPO / "fixtures" / "rules").rglob("*.in.py"))[::6]
    + [REPO / "codemod" / name for name in ("engine.py", "edits.py", "cli.py", "verify_run.py")]
    + [REPO / "codemod" / "analysis" / name for name in ("values.py", "training.py")]
)


def facts(scopes) -> Counter:
    """For every name: its scope kind, what it resolves to, how often it is read, its qualified names."""
    found = Counter()
    for node, scope in scopes.items():
        if isinstance(node, cst.Name) and scope is not None:
            found[
                (
                    node.value,
                    type(scope).__name__,
                    tuple(sorted((type(a).__name__, a.name) for a in scope[node.value])),
                    len(scope.accesses[node.value]),
                    tuple(sorted((q.name, q.source.name) for q in scope.get_qualified_names_for(node))),
                )
            ] += 1
    return found


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(REPO)) for p in FILES])
def test_scopes_are_libcsts_own(path):
    source = path.read_text(encoding="utf-8")
    expected = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True).resolve(ScopeProvider)
    with read_only_visits():
        fast = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True).resolve(ScopeProvider)
    assert facts(fast) == facts(expected)


class Renamer(cst.CSTTransformer):
    def leave_Name(self, original_node, updated_node):
        return updated_node.with_changes(value=updated_node.value.upper())


def test_transformers_and_other_threads_still_rebuild():
    module = cst.parse_module("x = y + 1\n")
    with read_only_visits():
        assert module.visit(Renamer()).code == "X = Y + 1\n"
        seen = []

        class Counting(cst.CSTVisitor):
            def on_visit(self, node):
                seen.append(type(node).__name__)
                return True

        worker = threading.Thread(target=lambda: module.visit(Counting()))
        worker.start()
        worker.join()
    assert "SimpleWhitespace" in seen  # the other thread walked libcst's way, whitespace included

"""No block of codemod/ is too complex to read: at most a handful graded E or F.

The grades are radon's cyclomatic complexity (radon is not a dependency, so its
count is written out here): a function starts at 1 and gains one per `if`,
`elif` and conditional expression, per loop (two with an `else:`), per `except`
handler and `try: ... else:`, per comprehension `for` and its `if`s, per extra
operand of `and`/`or`, per `assert`, per `match` case but a wildcard. A nested
function is a block of its own, not part of its parent's count. A class's grade
is its methods' mean. Grade E starts above 30. ruff's C901 (mccabe) stays under
the same threshold in pyproject.toml, but it does not count boolean operators.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODEMOD = REPO / "codemod"
GRADE_E = 31  # radon's grade E: complexity 31-40; F: 41 and up
MOST_BLOCKS_E_OR_F = 5
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _decisions(node: ast.AST) -> int:
    """The decision points in `node` and beneath it, stopping at nested definitions."""
    if isinstance(node, ast.Assert):
        return 1  # radon counts the assert and nothing inside it
    if isinstance(node, (ast.If, ast.IfExp)):
        own = 1
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        own = 1 + bool(node.orelse)
    elif isinstance(node, ast.Try):
        own = len(node.handlers) + bool(node.orelse)
    elif isinstance(node, ast.BoolOp):
        own = len(node.values) - 1
    elif isinstance(node, ast.comprehension):
        own = 1 + len(node.ifs)
    elif isinstance(node, ast.Match):
        wildcard = any(isinstance(case.pattern, ast.MatchAs) and case.pattern.pattern is None for case in node.cases)
        own = max(0, len(node.cases) - wildcard)
    else:
        own = 0
    return own + sum(_decisions(child) for child in ast.iter_child_nodes(node) if not isinstance(child, DEFINITIONS))


def _definitions(node: ast.AST) -> list[ast.AST]:
    """The functions and classes defined in `node`'s body, at any depth of its statements
    but not inside another definition."""
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, DEFINITIONS):
            found.append(child)
        else:
            found += _definitions(child)
    return found


def _function(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return 1 + sum(_decisions(statement) for statement in node.body if not isinstance(statement, DEFINITIONS))


def _blocks(path: Path) -> list[tuple[str, int]]:
    """(name, complexity) of each module-level function, class and method of a class, as
    radon lists them."""
    blocks = []
    for definition in _definitions(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(definition, ast.ClassDef):
            blocks.append((definition.name, _function(definition)))
            continue
        methods = [d for d in _definitions(definition) if not isinstance(d, ast.ClassDef)]
        scores = [_function(method) for method in methods]
        blocks += [(f"{definition.name}.{method.name}", score) for method, score in zip(methods, scores)]
        whole = 1 + _decisions_outside(definition) + sum(scores)
        blocks.append((definition.name, int(whole / len(methods)) + (len(methods) > 1) if methods else whole))
    return blocks


def _decisions_outside(classdef: ast.ClassDef) -> int:
    return sum(_decisions(statement) for statement in classdef.body if not isinstance(statement, DEFINITIONS))


def test_the_count_follows_radons_rules():
    source = """
def f(a, b):
    if a and b or a:
        return [x for x in b if x if a]
    for x in a:
        pass
    else:
        assert a and b
    try:
        pass
    except ValueError:
        pass
    except KeyError:
        pass
    match a:
        case 1:
            pass
        case _:
            pass
    def inner():
        if a:
            pass
    return 1 if a else 2
"""
    tree = ast.parse(source)
    # 1 + if + (and, or) + comprehension for + 2 ifs + for + else + assert + 2 handlers
    # + one case beside the wildcard + conditional expression; the closure is its own block
    assert _function(tree.body[0]) == 1 + 1 + 2 + 3 + 2 + 1 + 2 + 1 + 1
    assert _function(tree.body[0].body[4]) == 2


def test_at_most_a_handful_of_blocks_in_codemod_are_graded_e_or_f():
    graded = [
        f"{path.relative_to(REPO)}: {name} ({score})"
        for path in sorted(CODEMOD.rglob("*.py"))
        for name, score in _blocks(path)
        if score >= GRADE_E
    ]
    assert len(graded) <= MOST_BLOCKS_E_OR_F, "\n".join(graded)

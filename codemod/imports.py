"""The imports fixes need, added once at the top; those fixes made unused, removed.

libcst's AddImportsVisitor and RemoveImportsVisitor each traverse the module
with scope metadata; a fix needs only the top-level import statements, so this
module reads and edits those directly.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from codemod.analysis.index import children_of
from codemod.analysis.names import appended
from codemod.edits import AddImport


@dataclass(frozen=True)
class ImportSite:
    """Where new imports go: after `after` (a top-level statement), or first when None."""

    after: cst.BaseStatement | None


def dotted(node: cst.BaseExpression | None) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{dotted(node.value)}.{node.attr.value}"
    return ""


def import_site(module: cst.Module) -> ImportSite:
    """After the last import of the imports at the top (after the docstring and
    `from __future__` imports when there are none)."""
    after = None
    for index, statement in enumerate(module.body):
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and statement.body else None
        if (
            index == 0
            and isinstance(small, cst.Expr)
            and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString))
        ):
            after = statement
        elif isinstance(small, (cst.Import, cst.ImportFrom)):
            after = statement
        else:
            break
    return ImportSite(after)


def _satisfied(imports: Sequence[cst.SmallStatement], needed: AddImport) -> bool:
    for statement in imports:
        if isinstance(statement, cst.ImportFrom) and needed.name is not None:
            if (
                statement.relative
                or dotted(statement.module) != needed.module
                or isinstance(statement.names, cst.ImportStar)
            ):
                continue
            if any(
                dotted(alias.name) == needed.name and (alias.asname is None or dotted(alias.asname.name) == needed.name)
                for alias in statement.names
            ):
                return True
        elif isinstance(statement, cst.Import) and needed.name is None:
            for alias in statement.names:
                name = dotted(alias.name)
                if alias.asname is None and (name == needed.module or name.startswith(needed.module + ".")):
                    return True
    return False


def _top_level_imports(module: cst.Module) -> list[cst.SmallStatement]:
    return [
        small
        for statement in module.body
        if isinstance(statement, cst.SimpleStatementLine)
        for small in statement.body
        if isinstance(small, (cst.Import, cst.ImportFrom))
    ]


def missing(module: cst.Module, needed: Iterable[AddImport]) -> list[AddImport]:
    """The imports of `needed` that the module does not have yet, each once, in order."""
    present = _top_level_imports(module)
    result: list[AddImport] = []
    for item in needed:
        if item not in result and not _satisfied(present, item):
            result.append(item)
    return result


def add(
    module: cst.Module,
    needed: Sequence[AddImport],
    site: ImportSite,
    first_party: Callable[[str], bool] = lambda name: False,
    placed: dict[AddImport, list[tuple[int, cst.BaseStatement]]] | None = None,
) -> cst.Module:
    """`module` with `needed` (already known to be missing) imported at `site`:
    names from a module the file already imports from join that statement; each new
    line goes into the block of its isort section, sorted there (`first_party`: is a
    top-level package name the project's own). `placed` gets, for each import a new line
    holds, the statements of `module` next to it whose lines change: (0, the one it
    follows) and (1, the one after it) where that one's blank lines change."""
    if not needed:
        return module
    body = list(module.body)
    new_lines, holds = _new_import_lines(body, needed)
    at = _insertion_index(module, body, site)
    if not new_lines:
        return module.with_changes(body=body)
    if any(_is_import(statement) for statement in body[:at]):
        # Each new import into the block of its section, in isort's order there (ruff's `I`).
        origin: list[cst.BaseStatement | None] = list(module.body)
        for new_line in sorted(new_lines, key=_sort_key):
            body, at, position, moved = _sorted_in(body, at, new_line, first_party)
            origin.insert(position, None)
            if placed is not None:
                neighbours = _neighbours(origin, position, moved)
                for item in holds[id(new_line)]:
                    placed[item] = neighbours
        _blank_line_after_imports(body, at)
        return module.with_changes(body=body)
    if at == 0 and body:
        # Keep the first statement's comments (a shebang, a licence) above the new imports.
        new_lines[0] = new_lines[0].with_changes(leading_lines=body[0].leading_lines)
        body[0] = body[0].with_changes(leading_lines=[])
    new_lines.sort(key=_sort_key)
    _blank_line_after_imports(body, at)
    return module.with_changes(body=[*body[:at], *new_lines, *body[at:]])


def _new_import_lines(
    body: list[cst.BaseStatement], needed: Sequence[AddImport]
) -> tuple[list[cst.SimpleStatementLine], dict[int, list[AddImport]]]:
    """The new import lines `needed` takes, and the imports each makes (by the line's id).
    Names from a module `body` already imports from join that statement instead (`body`
    changes)."""
    new_lines: list[cst.SimpleStatementLine] = []
    holds: dict[int, list[AddImport]] = {}
    by_module: dict[str, list[str]] = {}
    for item in needed:
        if item.name is None:
            new_lines.append(cst.SimpleStatementLine([cst.Import([cst.ImportAlias(_name(item.module))])]))
            holds[id(new_lines[-1])] = [item]
        else:
            by_module.setdefault(item.module, []).append(item.name)
    for source, names in by_module.items():
        if _joined_from_import(body, source, names):
            continue
        aliases = [cst.ImportAlias(cst.Name(n)) for n in sorted(names, key=_name_order)]
        new_lines.append(cst.SimpleStatementLine([cst.ImportFrom(module=_name(source), names=_commas(aliases))]))
        holds[id(new_lines[-1])] = [item for item in needed if item.module == source and item.name is not None]
    return new_lines, holds


def _joined_from_import(body: list[cst.BaseStatement], source: str, names: list[str]) -> bool:
    """Did `names` join the statement of `body` that imports from `source` (there is one)?"""
    position = from_import(body, source)
    if position is None:
        return False
    line_index, small_index = position
    line = body[line_index]
    statement = line.body[small_index]
    merged = list(statement.names)
    for name in sorted(names, key=_name_order):
        merged = _joined(merged, name, statement)
    new_small = [*line.body]
    new_small[small_index] = statement.with_changes(names=merged)
    body[line_index] = line.with_changes(body=new_small)
    return True


def _insertion_index(module: cst.Module, body: list[cst.BaseStatement], site: ImportSite) -> int:
    """Where in `body` (the module's, with imports joined) the new lines go: after the
    site's statement, or after the imports at the top as they are now when that statement
    was rewritten."""
    if site.after is None:
        return 0
    at = next((i + 1 for i, s in enumerate(body) if s is site.after), None)
    if at is None:
        fresh = import_site(module.with_changes(body=body)).after
        at = next((i + 1 for i, s in enumerate(body) if s is fresh), 0)
    return at


def _neighbours(
    origin: list[cst.BaseStatement | None], position: int, moved: bool
) -> list[tuple[int, cst.BaseStatement]]:
    """For `add`'s `placed`: (0, the statement a new line at `position` of `origin` follows)
    and (1, the one after it) where that one `moved` (its blank lines change)."""
    before = next((s for s in reversed(origin[:position]) if s is not None), None)
    after = origin[position + 1] if moved and position + 1 < len(origin) else None
    return [(k, s) for k, s in enumerate((before, after)) if s is not None]


def _blank_line_after_imports(body: list[cst.BaseStatement], at: int) -> None:
    """A blank line between the imports (ending before body[at]) and the code, as isort
    and libcst leave it."""
    if at < len(body) and not _is_import(body[at]):
        following = body[at]
        if not following.leading_lines or following.leading_lines[0].comment is not None:
            body[at] = following.with_changes(leading_lines=[cst.EmptyLine(), *following.leading_lines])


# isort's sections, in their order; the user's own imports are never reordered.
FUTURE, STDLIB, THIRD_PARTY, FIRST_PARTY, LOCAL = range(5)


def project_packages(root: Path) -> Callable[[str], bool]:
    """Is a top-level name a package or module of the project at `root` (ruff's default
    `src`: the project folder and its src/ folder)?"""

    @functools.cache
    def first_party(name: str) -> bool:
        return any((folder / name).is_dir() or (folder / f"{name}.py").is_file() for folder in (root, root / "src"))

    return first_party


def section(statement: cst.SimpleStatementLine, first_party: Callable[[str], bool] = lambda name: False) -> int:
    """The isort section of an import line, by its first import (ruff's defaults:
    the standard library, then third-party, then the project's own packages, then
    relative imports)."""
    small = statement.body[0]
    if isinstance(small, cst.ImportFrom):
        if small.relative:
            return LOCAL
        name = dotted(small.module)
    else:
        name = dotted(small.names[0].name) if isinstance(small, cst.Import) else ""
    top = name.split(".")[0]
    if top == "__future__":
        return FUTURE
    if top in sys.stdlib_module_names:
        return STDLIB
    return FIRST_PARTY if first_party(top) else THIRD_PARTY


def _sort_key(statement: cst.SimpleStatementLine) -> tuple[bool, str]:
    """isort's order inside a section: `import a` lines first, then `from a import b`,
    each by module name without regard to case (ruff's defaults)."""
    small = statement.body[0]
    if isinstance(small, cst.ImportFrom):
        return True, dotted(small.module).lower()
    return False, dotted(small.names[0].name).lower() if isinstance(small, cst.Import) else ""


def _sorted_in(
    body: list[cst.BaseStatement], at: int, new_line: cst.SimpleStatementLine, first_party: Callable[[str], bool]
) -> tuple[list[cst.BaseStatement], int, int, bool]:
    """`body` with `new_line` among the imports of body[:at] where isort puts it, the
    new end of those imports, the index of the new line, and whether the statement
    after it lost or gained blank lines: after the last import of its section that sorts
    before it, else first in that section; in a section of its own (a blank line
    apart) where the file has none of its section yet."""
    wanted, key = section(new_line, first_party), _sort_key(new_line)
    imports = [i for i in range(at) if _is_import(body[i])]
    same = [i for i in imports if section(body[i], first_party) == wanted]
    blank = [cst.EmptyLine()]
    moved = False
    if same:
        before = [i for i in same if _sort_key(body[i]) <= key]
        if before:
            position, leading = before[-1] + 1, []
        else:
            position = same[0]
            leading = list(body[position].leading_lines)
            moved = bool(leading)
            body[position] = body[position].with_changes(leading_lines=[])
    else:
        later = [i for i in imports if section(body[i], first_party) > wanted]
        if later:
            position = later[0]
            leading = list(body[position].leading_lines) or (blank if position > imports[0] else [])
            moved = list(body[position].leading_lines) != blank
            body[position] = body[position].with_changes(leading_lines=blank)
        else:
            position, leading = imports[-1] + 1, blank
            if position < len(body) and not _is_import(body[position]) and not body[position].leading_lines:
                body[position] = body[position].with_changes(leading_lines=blank)
                moved = True
    body = [*body[:position], new_line.with_changes(leading_lines=leading), *body[position:]]
    return body, at + 1, position, moved


def _joined(aliases: list[cst.ImportAlias], name: str, statement: cst.ImportFrom) -> list[cst.ImportAlias]:
    """`aliases` with `name` added: where isort's order puts it if the names are in that
    order, else last."""
    order = [_name_order(dotted(alias.asname.name if alias.asname else alias.name)) for alias in aliases]
    at = next((k for k, key in enumerate(order) if key > _name_order(name)), len(aliases))
    if order != sorted(order) or at == len(aliases):
        whitespace = statement.lpar.whitespace_after if statement.lpar else cst.SimpleWhitespace("")
        return appended(aliases, cst.ImportAlias(cst.Name(name)), whitespace)
    # Before aliases[at], with the comma (and its spacing) of the names around it.
    comma = aliases[at - 1].comma if at > 0 else aliases[at].comma
    if not isinstance(comma, cst.Comma):
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return [*aliases[:at], cst.ImportAlias(cst.Name(name), comma=comma), *aliases[at:]]


def _name_order(name: str) -> tuple[int, str]:
    """isort's order of the names of one `from` import (ruff's order-by-type):
    constants, then classes, then the rest."""
    if name.isupper() and len(name) > 1:
        return 0, name
    return (1 if name[:1].isupper() else 2), name


def _is_import(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def from_import(body: Sequence[cst.BaseStatement], source: str) -> tuple[int, int] | None:
    """(statement, small statement) of a plain top-level `from <source> import a, b`."""
    for line_index, line in enumerate(body):
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small_index, small in enumerate(line.body):
            if (
                isinstance(small, cst.ImportFrom)
                and not small.relative
                and dotted(small.module) == source
                and not isinstance(small.names, cst.ImportStar)
            ):
                return line_index, small_index
    return None


def _name(dotted_name: str) -> cst.Attribute | cst.Name:
    parts = dotted_name.split(".")
    node: cst.Attribute | cst.Name = cst.Name(parts[0])
    for part in parts[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def _commas(aliases: list[cst.ImportAlias]) -> list[cst.ImportAlias]:
    return [
        a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for a in aliases[:-1]
    ] + aliases[-1:]


# -- unused imports ----------------------------------------------------------------------


def bound_name(alias: cst.ImportAlias, statement: cst.Import | cst.ImportFrom) -> str:
    if alias.asname is not None:
        return dotted(alias.asname.name)
    name = dotted(alias.name)
    return name.split(".")[0] if isinstance(statement, cst.Import) else name


def names_read(module: cst.Module) -> set[str]:
    """Names the module reads anywhere (not attribute or keyword names, not in imports)."""
    found: set[str] = set()
    stack: list[cst.CSTNode] = [module]
    while stack:  # a plain walk: this runs on the rewritten tree, which has no index
        node = stack.pop()
        kind = type(node)
        if kind is cst.Name:
            found.add(node.value)
        elif kind is cst.Attribute:
            stack.append(node.value)  # `x.name`: `name` is not read as a variable
        elif kind is cst.Arg:
            stack.append(node.value)  # `f(name=...)`: the keyword is not a variable
        elif kind is not cst.Import and kind is not cst.ImportFrom:
            stack.extend(children_of(node))
    return found


def is_read(name: cst.Name, parents) -> bool:
    """Is `name` a variable (not the attribute of `x.name`, nor the keyword of `f(name=...)`)?"""
    parent = parents.get(name)
    if isinstance(parent, cst.Attribute) and parent.attr is name:
        return False
    return not (isinstance(parent, cst.Arg) and parent.keyword is name)


def without_unused(module: cst.Module, candidates: set[str]) -> tuple[cst.Module, set[str]]:
    """Remove the top-level imports of `candidates` that nothing reads any more;
    returns the module and the names whose import went."""
    if not candidates:
        return module, set()
    still_read = names_read(module)
    unused = {name for name in candidates if name not in still_read}
    if not unused or _declares_all(module):
        return module, set()
    removed: set[str] = set()
    body: list[cst.BaseStatement] = []
    carried: list[cst.EmptyLine] = []
    for statement in module.body:
        if carried:
            statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])
            carried = []
        if not isinstance(statement, cst.SimpleStatementLine):
            body.append(statement)
            continue
        smalls = []
        for small in statement.body:
            if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                kept = [a for a in small.names if bound_name(a, small) not in unused]
                removed.update(bound_name(a, small) for a in small.names if bound_name(a, small) in unused)
                if not kept:
                    continue
                if len(kept) != len(small.names):
                    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                    small = small.with_changes(names=kept)
            smalls.append(small)
        if not smalls:
            if any(line.comment is not None for line in statement.leading_lines):
                carried = list(statement.leading_lines)
            continue
        if len(smalls) == len(statement.body) and all(a is b for a, b in zip(smalls, statement.body)):
            body.append(statement)  # untouched: the same node, which the layout then leaves alone
            continue
        smalls[-1] = smalls[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        body.append(statement.with_changes(body=smalls))
    return module.with_changes(body=body), removed


def _declares_all(module: cst.Module) -> bool:
    """`__all__` re-exports names by string: leave imports alone there."""
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                    targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                    if any(isinstance(t, cst.Name) and t.value == "__all__" for t in targets):
                        return True
    return False

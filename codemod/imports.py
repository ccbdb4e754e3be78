"""The imports fixes need, added once at the top; those fixes made unused, removed.

libcst's AddImportsVisitor and RemoveImportsVisitor each traverse the module
with scope metadata; a fix needs only the top-level import statements, so this
module reads and edits those directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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


def add(module: cst.Module, needed: Sequence[AddImport], site: ImportSite) -> cst.Module:
    """`module` with `needed` (already known to be missing) imported at `site`:
    names from a module the file already imports from join that statement."""
    if not needed:
        return module
    body = list(module.body)
    new_lines: list[cst.SimpleStatementLine] = []
    by_module: dict[str, list[str]] = {}
    for item in needed:
        if item.name is None:
            new_lines.append(cst.SimpleStatementLine([cst.Import([cst.ImportAlias(_name(item.module))])]))
        else:
            by_module.setdefault(item.module, []).append(item.name)
    for source, names in by_module.items():
        position = from_import(body, source)
        if position is None:
            aliases = [cst.ImportAlias(cst.Name(n)) for n in names]
            new_lines.append(cst.SimpleStatementLine([cst.ImportFrom(module=_name(source), names=_commas(aliases))]))
            continue
        line_index, small_index = position
        line = body[line_index]
        statement = line.body[small_index]
        merged = list(statement.names)
        for name in names:
            merged = appended(
                merged,
                cst.ImportAlias(cst.Name(name)),
                statement.lpar.whitespace_after if statement.lpar else cst.SimpleWhitespace(""),
            )
        new_small = [*line.body]
        new_small[small_index] = statement.with_changes(names=merged)
        body[line_index] = line.with_changes(body=new_small)
    at = 0
    if site.after is not None:
        at = next((i + 1 for i, s in enumerate(body) if s is site.after), None)
        if at is None:  # the statement was rewritten: go after the imports at the top as they are now
            fresh = import_site(module.with_changes(body=body)).after
            at = next((i + 1 for i, s in enumerate(body) if s is fresh), 0)
    if at == 0 and body and new_lines:
        # Keep the first statement's comments (a shebang, a licence) above the new imports.
        new_lines[0] = new_lines[0].with_changes(leading_lines=body[0].leading_lines)
        body[0] = body[0].with_changes(leading_lines=[])
    if new_lines and at < len(body) and not _is_import(body[at]):
        following = body[at]
        if not following.leading_lines or following.leading_lines[0].comment is not None:
            # A blank line between the imports and the code, as isort and libcst leave it.
            body[at] = following.with_changes(leading_lines=[cst.EmptyLine(), *following.leading_lines])
    return module.with_changes(body=[*body[:at], *new_lines, *body[at:]])


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

"""Edits: what a fix changes, as small steps anchored to nodes of the parsed file.

A rule's fix is a list of edits, each tied to a node of the tree the rules
analysed: replace an expression or a statement, remove a statement, insert
statements before or after one, move a statement in front of an enclosing one,
wrap a run of statements in a `with`, add a keyword argument to a call, add an
import. The engine gathers the edits of
every fix of every rule, settles conflicts (see `plan`) and applies them all in
one transform (`apply`), innermost first: an edit receives its node with the
edits inside it already made, so a `with` wrapped around statements keeps the
keyword another fix added to a call in them.

An edit that *replaces* a node with a fixed new node, or *removes* a statement,
discards what was inside; every other edit composes with the edits inside its
node. A replacement given as a function of the node (`Replace(node, lambda
updated: ...)`) composes too: it is called with the updated node, and a moved
statement takes the edits made inside it along. A removal marked `supersedes`
(the fix does the statement's work another way) settles the other fixes inside
the statement instead of leaving them for another run.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import libcst as cst

from codemod.analysis.index import TreeIndex
from codemod.analysis.names import with_entry, with_kwarg

Replacement = cst.CSTNode | cst.FlattenSentinel | cst.RemovalSentinel
BODY_OWNERS = (cst.IndentedBlock, cst.Module)
SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


@dataclass(frozen=True, eq=False)
class Edit:
    anchor: cst.CSTNode  # a node of the analysed tree

    @property
    def consumes(self) -> bool:
        """Does the edit discard the anchor's subtree (so edits inside it cannot apply)?"""
        return False

    @property
    def in_block(self) -> bool:
        """Is the edit made in the block around the anchor (not to the anchor itself)?"""
        return False


@dataclass(frozen=True, eq=False)
class Replace(Edit):
    """`anchor` becomes `new`: a node (statements may also become a FlattenSentinel of
    statements or RemovalSentinel.REMOVE), or a function of the updated node."""

    new: Replacement | Callable[[cst.CSTNode], Replacement]

    @property
    def consumes(self) -> bool:
        return not callable(self.new)

    def replacement(self, updated: cst.CSTNode) -> Replacement:
        return self.new(updated) if callable(self.new) else self.new


@dataclass(frozen=True, eq=False)
class Remove(Edit):
    """The statement `anchor` is removed: a line, a compound statement, or one small
    statement of a line (`a(); b()`). The comment lines right above it (no blank line
    between) describe it and go with it, as its trailing comment does; comment lines a
    blank line sets apart from it stay (unless `keep_comments` is False: a statement
    moved elsewhere takes them along). A block left empty gets `pass`; an `if` whose body
    is left empty and that has an `else` becomes `if not test:` over the `else` body, and
    an `else` left empty goes."""

    keep_comments: bool = True
    # True when the fix does the removed statement's work another way (a prefetcher that
    # makes the copies the statement made): another rule's fix inside it is then settled
    # by this one rather than left for a second run.
    supersedes: bool = False

    @property
    def consumes(self) -> bool:
        return True

    @property
    def in_block(self) -> bool:
        return True


@dataclass(frozen=True, eq=False)
class InsertBefore(Edit):
    """`statements` go right before the statement `anchor` (after the blank lines above it)."""

    statements: tuple[cst.BaseStatement, ...]

    @property
    def in_block(self) -> bool:
        return True


@dataclass(frozen=True, eq=False)
class InsertAfter(Edit):
    """`statements` go right after the statement `anchor`."""

    statements: tuple[cst.BaseStatement, ...]

    @property
    def in_block(self) -> bool:
        return True


@dataclass(frozen=True, eq=False)
class Move(Edit):
    """The statement `anchor`, with the edits inside it made, leaves its block and goes
    right before the statement `to`, in the same function: `to` encloses it or is an
    earlier statement of a block around it. `shape` (given the moved statement) may
    change its layout, e.g. the lines above it. Its comment lines go along."""

    to: cst.BaseStatement
    shape: Callable[[cst.BaseStatement], cst.BaseStatement] | None = None

    @property
    def in_block(self) -> bool:
        return True

    def moved(self, updated: cst.BaseStatement) -> cst.BaseStatement:
        return self.shape(updated) if self.shape is not None else updated


@dataclass(frozen=True, eq=False)
class Wrap(Edit):
    """The statements from `anchor` to `last` (one block, in order) become the body of
    `with <items>:`; the comments above `anchor` go above the `with`."""

    last: cst.BaseStatement
    items: tuple[cst.WithItem, ...]

    @property
    def in_block(self) -> bool:
        return True


@dataclass(frozen=True, eq=False)
class AddKeyword(Edit):
    """The call `anchor` gets `name=value`, appended in the layout of its arguments; a
    dict literal `anchor` (a `**kwargs` dict) gets the entry `"name": value` the same way."""

    name: str
    value: cst.BaseExpression


@dataclass(frozen=True)
class AddImport:
    """`import module` (name None) or `from module import name`, added once at the top."""

    module: str
    name: str | None = None

    @property
    def bound(self) -> str:
        """The name the import binds in the file."""
        return self.name if self.name is not None else self.module.split(".")[0]


@dataclass
class Fix:
    """One finding's edits: applied all together or not at all."""

    key: int  # the finding's position in the engine's list
    code: str
    level: int
    line: int
    edits: list[Edit]
    imports: list[AddImport] = field(default_factory=list)


def bound_before(
    node: cst.CSTNode, value: cst.BaseExpression, name: str, index: TreeIndex, taken: dict
) -> tuple[InsertBefore, cst.Name]:
    """A value the new code of a fix reads more than once, computed once: the edit that
    binds `name = value` right before the statement holding `node`, and the name to read
    it by there: `name_2`, `name_3`, ... where the file already has a variable `name`, or
    the fixes gave it to another value of the same function (`taken`: function -> the
    names given there, kept by the caller across its fixes)."""
    given = taken.setdefault(index.first_enclosing(node, SCOPES), set())
    used = given | _variable_names(index)
    chosen, number = name, 1
    while chosen in used:
        number += 1
        chosen = f"{name}_{number}"
    given.add(chosen)
    line = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(chosen))], value)])
    return InsertBefore(index.statement_of(node), (line,)), cst.Name(chosen)


_VARIABLE_NAMES: weakref.WeakKeyDictionary[TreeIndex, frozenset[str]] = weakref.WeakKeyDictionary()


def _variable_names(index: TreeIndex) -> frozenset[str]:
    """The names of the file that may be variables (not an attribute's or a keyword
    argument's): read once per tree, not once per fix (a file with a fix at every
    DataLoader read them all for each one)."""
    found = _VARIABLE_NAMES.get(index)
    if found is None:
        found = _VARIABLE_NAMES[index] = frozenset(
            name.value
            for name in index.find(cst.Name)
            if not (isinstance(parent := index.parents.get(name), cst.Attribute) and parent.attr is name)
            and not (isinstance(parent, cst.Arg) and parent.keyword is name)
        )
    return found


# -- conflicts -------------------------------------------------------------------------


@dataclass
class Plan:
    kept: list[Fix]  # applied together
    reasons: dict[int, str]  # key -> why that fix is left out
    settled: dict[int, Fix]  # key -> the kept fix that removes all of its code and does its work


def plan(fixes: Sequence[Fix], index: TreeIndex) -> Plan:
    """The fixes to apply together, why each other one is left out, and which are
    settled by a kept fix that supersedes the code they would change.

    Fixes are taken in a fixed order and each is kept unless one of its edits
    conflicts with a kept fix's edit:

    1. A fix that discards code (replaces a region with new code, or removes a
       statement) comes before the fixes inside that region: their code is gone
       with it. Among such fixes the one whose region starts first (the outer one) comes first.
    2. Then the fix at the lower level (safe before numeric before unsafe).
    3. Then the lower rule code, then the earlier line.

    Two edits conflict when one discards the other's node (or a node around
    it), when both replace or rewrite the same node, when two keywords of the
    same name differ, or when two wrapped runs of one block overlap without one
    containing the other.
    """
    ordered = sorted(fixes, key=lambda fix: _priority(fix, index))
    kept: list[Fix] = []
    reasons: dict[int, str] = {}
    settled: dict[int, Fix] = {}
    # Edits in different statements of the module's body cannot conflict: each fix is
    # compared with the kept fixes that have an edit in one of its statements.
    near: dict[cst.CSTNode, list[Fix]] = {}
    seen: dict[int, int] = {}  # id of a kept fix -> when it was kept
    for fix in ordered:
        tops = _top_statements(fix, index)
        neighbours = sorted({id(f): f for top in tops for f in near.get(top, ())}.values(), key=lambda f: seen[id(f)])
        superseding = _superseded_by(fix, neighbours, index)
        if superseding is not None:
            settled[fix.key] = superseding
            continue
        clash = next(((other, why) for other in neighbours for why in [_conflict(fix, other, index)] if why), None)
        if clash is None:
            seen[id(fix)] = len(kept)
            kept.append(fix)
            for top in tops:
                near.setdefault(top, []).append(fix)
        else:
            other, why = clash
            reasons[fix.key] = f"{other.code}'s fix on line {other.line} {why}"
    kept.sort(key=lambda fix: fix.key)
    return Plan(kept, reasons, settled)


def _top_statements(fix: Fix, index: TreeIndex) -> set[cst.CSTNode]:
    tops = {index.top_level(edit.anchor) for edit in fix.edits}
    tops.update(index.top_level(edit.to) for edit in fix.edits if isinstance(edit, Move))
    return tops


def _superseded_by(fix: Fix, kept: list[Fix], index: TreeIndex) -> Fix | None:
    """The kept fix that removes, superseding it, the code of every edit of `fix`."""
    for other in kept:
        gone = [e.anchor for e in other.edits if isinstance(e, Remove) and e.supersedes]
        if gone and all(any(_lost_with(edit, statement, index) for statement in gone) for edit in fix.edits):
            return other
    return None


def _lost_with(edit: Edit, statement: cst.CSTNode, index: TreeIndex) -> bool:
    """Does `edit` change code that goes with `statement` (not merely code next to it)?"""
    if edit.anchor is statement:
        return not edit.in_block
    return index.inside(edit.anchor, statement)


def _priority(fix: Fix, index: TreeIndex) -> tuple:
    discarded = [index.order(e.anchor) for e in fix.edits if e.consumes]
    return (0, min(discarded)) if discarded else (1, 0), fix.level, fix.code, fix.line


def _conflict(fix: Fix, kept: Fix, index: TreeIndex) -> str | None:
    for edit in fix.edits:
        for other in kept.edits:
            if edit is other:
                continue  # one edit shared by two findings' fixes (one fix that several findings report)
            why = _edits_conflict(edit, other, index)
            if why:
                return why
    return None


def _edits_conflict(edit: Edit, kept: Edit, index: TreeIndex) -> str | None:
    if kept.consumes and _reaches_inside(edit, kept, index):
        return "removes or rewrites this code"
    if edit.consumes and _reaches_inside(kept, edit, index):
        return "changes code inside what this fix rewrites"
    if edit.anchor is kept.anchor and _takes_away(edit) and _takes_away(kept):
        return "moves or removes the same statement"
    if edit.anchor is kept.anchor and not (edit.in_block or kept.in_block):
        if isinstance(edit, AddKeyword) and isinstance(kept, AddKeyword):
            if edit.name != kept.name:
                return None
            same = cst.Module([]).code_for_node(edit.value) == cst.Module([]).code_for_node(kept.value)
            return None if same else f"passes `{kept.name}` differently"
        return "changes the same code"
    if isinstance(edit, Wrap) and isinstance(kept, Wrap):
        return _runs_overlap(edit, kept, index)
    return None


def _takes_away(edit: Edit) -> bool:
    return isinstance(edit, (Move, Remove)) or (isinstance(edit, Replace) and edit.consumes)


def _reaches_inside(edit: Edit, consuming: Edit, index: TreeIndex) -> bool:
    """Does `edit` act inside the code `consuming` discards? Statements may still be
    inserted around, removed with, or wrapped with a statement replaced or removed."""
    if edit.anchor is consuming.anchor:
        return not edit.in_block
    return index.inside(edit.anchor, consuming.anchor)


def _runs_overlap(edit: Wrap, kept: Wrap, index: TreeIndex) -> str | None:
    block = _block_of(edit.anchor, index)
    if block is not _block_of(kept.anchor, index):
        return None
    first, last = index.order(edit.anchor), index.order(edit.last)
    other_first, other_last = index.order(kept.anchor), index.order(kept.last)
    disjoint = last < other_first or other_last < first
    nested = (first <= other_first and other_last <= last) or (other_first <= first and last <= other_last)
    return None if disjoint or nested else "wraps an overlapping run of statements"


def _block_of(statement: cst.CSTNode, index: TreeIndex) -> cst.CSTNode | None:
    return index.parents.get(statement)


def validate(edit: Edit, index: TreeIndex) -> str | None:
    """Why `edit` cannot be made where it is anchored, or None."""
    if edit.anchor not in index:
        return "it is anchored to code that is not in the file"
    if isinstance(edit, Remove) and isinstance(edit.anchor, cst.BaseSmallStatement):
        line = index.parents.get(edit.anchor)
        if isinstance(line, cst.SimpleStatementSuite) or (
            isinstance(line, cst.SimpleStatementLine) and _in_body(line, index)
        ):
            return None
        return "it removes a statement that is not in a block of statements"
    if edit.in_block and not _in_body(edit.anchor, index):
        return "it inserts or removes a statement that is not in a block of statements"
    if isinstance(edit, Replace) and isinstance(edit.new, (cst.FlattenSentinel, cst.RemovalSentinel)):
        if isinstance(edit.anchor, cst.BaseStatement) and not _in_body(edit.anchor, index):
            return "it replaces a statement that is not in a block by several statements"
    if isinstance(edit, Wrap):
        block = index.parents.get(edit.anchor)
        if (
            block is None
            or index.parents.get(edit.last) is not block
            or index.order(edit.last) < index.order(edit.anchor)
        ):
            return "it wraps statements that are not a run of one block"
    if isinstance(edit, Move):
        target_block = index.parents.get(edit.to)
        if not _in_body(edit.to, index) or not index.inside(edit.anchor, target_block):
            return "it moves a statement to a block that does not contain it"
        if index.first_enclosing(edit.anchor, SCOPES) is not index.first_enclosing(edit.to, SCOPES):
            return "it moves a statement out of its function"
        if index.order(edit.to) > index.order(edit.anchor):
            return "it moves a statement after itself"
    if isinstance(edit, AddKeyword) and not isinstance(edit.anchor, (cst.Call, cst.Dict)):
        return "it adds a keyword to something that is not a call or a dict literal"
    return None


def _in_body(statement: cst.CSTNode, index: TreeIndex) -> bool:
    parent = index.parents.get(statement)
    return isinstance(parent, BODY_OWNERS) and any(s is statement for s in parent.body)


# -- applying --------------------------------------------------------------------------


def apply(
    module: cst.Module, fixes: Iterable[Fix], index: TreeIndex, origins: dict[int, cst.CSTNode] | None = None
) -> cst.Module:
    """`module` with every edit of `fixes` made, in one transform. `origins` gets, for
    each line of statements the edits rebuilt, the line it was: keyed by the id of its
    first small statement, which stays when the line is moved or re-spaced."""
    fixes = list(fixes)
    edits = list({id(edit): edit for fix in fixes for edit in fix.edits}.values())  # a shared edit is made once
    if not edits:
        return module
    apply = _Apply(edits, index, _run_ends(fixes, index))
    new = module.visit(apply)
    if origins is not None:
        origins.update(apply.origins)
    return new


def _run_ends(fixes: Iterable[Fix], index: TreeIndex) -> set[cst.CSTNode]:
    """Lines whose whole computation a fix replaces (the value of `name = value`, of a
    return, of an expression statement) at the edge of a run of statements the same fix
    removes (`att = softmax(...)` removed, `y = att @ v` rewritten as one attention call):
    the run is replaced as a whole, so the comments on such a line, which describe the
    code that went, go too. A line the fix edits only in part keeps them."""
    ends: set[cst.CSTNode] = set()
    for fix in fixes:
        removed = {e.anchor for e in fix.edits if isinstance(e, Remove) and isinstance(e.anchor, cst.BaseStatement)}
        if not removed:
            continue
        for edit in fix.edits:
            if not isinstance(edit, Replace):
                continue
            line = index.statement_of(edit.anchor)
            block = index.parents.get(line)
            if not isinstance(line, cst.SimpleStatementLine) or line in removed or not isinstance(block, BODY_OWNERS):
                continue
            if len(line.body) != 1 or edit.anchor not in (line.body[0], getattr(line.body[0], "value", None)):
                continue
            body = list(block.body)
            at = next(k for k, statement in enumerate(body) if statement is line)
            if (at > 0 and body[at - 1] in removed) or (at + 1 < len(body) and body[at + 1] in removed):
                ends.add(line)
    return ends


class _Apply(cst.CSTTransformer):
    def __init__(self, edits: list[Edit], index: TreeIndex, run_ends: set[cst.CSTNode] = frozenset()) -> None:
        super().__init__()
        self.run_ends = run_ends
        self.at: dict[cst.CSTNode, list[Edit]] = {}
        self.blocks: dict[cst.CSTNode, list[Edit]] = {}  # block -> the edits of its statements
        self.around: set[cst.CSTNode] = set()  # nodes with an edit at or below them
        self.removed_parts: dict[cst.CSTNode, set[cst.CSTNode]] = {}  # line -> its small statements removed
        for edit in edits:
            self.at.setdefault(edit.anchor, []).append(edit)
            block = index.parents.get(edit.anchor)
            if isinstance(edit, Remove) and isinstance(edit.anchor, cst.BaseSmallStatement):
                self.removed_parts.setdefault(block, set()).add(edit.anchor)
                if isinstance(block, cst.SimpleStatementLine):
                    self.blocks.setdefault(index.parents[block], [])
            elif edit.in_block or (
                isinstance(edit, Replace)
                and isinstance(block, BODY_OWNERS)
                and isinstance(edit.anchor, cst.BaseStatement)
            ):
                self.blocks.setdefault(block, []).append(edit)
            if isinstance(edit, Move) and index.parents.get(edit.to) is not block:
                self.blocks.setdefault(index.parents.get(edit.to), []).append(edit)
            node = edit.anchor
            while node is not None and node not in self.around:
                self.around.add(node)
                node = index.parents.get(node)
        for line in run_ends:
            self.blocks.setdefault(index.parents.get(line), [])
            node = line
            while node is not None and node not in self.around:
                self.around.add(node)
                node = index.parents.get(node)
        self.items: dict[cst.CSTNode, list[cst.BaseStatement]] = {}  # statement -> what replaces it
        self.moved: dict[cst.CSTNode, list[cst.BaseStatement]] = {}  # moved statement -> what it became
        self.origins: dict[int, cst.CSTNode] = {}  # id of a rebuilt line's first small statement -> the line
        self.emptied: set[cst.CSTNode] = set()  # blocks and one-line suites the edits left with only `pass`

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.around

    def on_leave(self, original_node, updated_node):
        edits = self.at.get(original_node, ())
        added: set[str] = set()
        for edit in edits:
            # Two fixes may add the same keyword, with the same value (`plan` keeps no other),
            # to one call or dict: the settings two loaders share. It is written once.
            if isinstance(edit, AddKeyword) and edit.name not in added:
                added.add(edit.name)
                add = with_entry if isinstance(updated_node, cst.Dict) else with_kwarg
                updated_node = add(updated_node, edit.name, edit.value)
        for edit in edits:
            if isinstance(edit, Replace):
                result = edit.replacement(updated_node)
                if original_node in self._statements_with_block_edits():
                    self.items[original_node] = _as_statements(result)
                else:
                    updated_node = result
        if original_node in self.removed_parts:
            updated_node = self._without_parts(original_node, updated_node)
        if original_node in self.blocks:
            updated_node = self._edit_block(original_node, updated_node)
        if isinstance(original_node, cst.If):
            updated_node = self._without_empty_branch(original_node, updated_node)
        if (
            isinstance(updated_node, cst.SimpleStatementLine)
            and updated_node is not original_node
            and updated_node.body
        ):
            self.origins[id(updated_node.body[0])] = original_node
        return updated_node

    def _without_parts(self, original, updated):
        """A line (or one-line suite) without its removed small statements."""
        removed = self.removed_parts[original]
        kept = [new for old, new in zip(original.body, updated.body) if old not in removed]
        if kept:
            kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(body=kept)
        if isinstance(original, cst.SimpleStatementSuite):
            self.emptied.add(original)
            return updated.with_changes(body=[cst.Pass()])
        self.items[original] = []  # the whole line goes: its block drops it
        return updated

    def _without_empty_branch(self, original: cst.If, updated: cst.If) -> cst.If:
        """An `if` with an `else` whose edits emptied one branch, as one writes it: `if not
        test:` over the `else` body when the `if` body went, no `else` when its body went
        (the test is evaluated as before). Kept as it is where a comment would be lost."""
        orelse = updated.orelse
        if not isinstance(orelse, cst.Else) or _has_comment_lines(orelse.leading_lines):
            return updated  # an `elif` tests something else
        body_gone = original.body in self.emptied and not _holds_comments(updated.body)
        else_gone = original.orelse.body in self.emptied and not _holds_comments(orelse.body)
        if body_gone and not else_gone:
            return updated.with_changes(test=negated(updated.test), body=orelse.body, orelse=None)
        if else_gone and not body_gone:
            return updated.with_changes(orelse=None)
        return updated

    def _statements_with_block_edits(self) -> set:
        cached = getattr(self, "_statement_set", None)
        if cached is None:
            cached = self._statement_set = {e.anchor for block in self.blocks.values() for e in block}
        return cached

    def _edit_block(self, original, updated):
        block = self._block_edits(original, updated)
        built = self._segments(original, updated, block)
        for wrap in block.wraps:
            _wrap_segments(built.segments, wrap, block)
        statements = [s for segment in built.segments for s in segment]
        carried = built.carried
        if isinstance(updated, cst.IndentedBlock) and statements and self._first_went(original, block):
            # What was first went: the statement now first takes no blank line above it,
            # as formatters leave a block (its comment lines stay).
            _, kept = split_blank(statements[0].leading_lines)
            statements[0] = statements[0].with_changes(leading_lines=kept)
        if isinstance(updated, cst.IndentedBlock) and not statements:
            statements = [cst.SimpleStatementLine([cst.Pass()], leading_lines=carried)]
            carried = []
            self.emptied.add(original)
        return updated.with_changes(body=statements, footer=[*carried, *updated.footer])

    def _block_edits(self, original, updated) -> _BlockEdits:
        """The edits of the block `original`, by the statement they anchor at; the statements
        moved out of it are taken out first (`moved`), before the block they go to is made."""
        edits = self.blocks[original]
        position = {statement: i for i, statement in enumerate(original.body)}
        leaving = {e.anchor for e in edits if isinstance(e, Move) and e.anchor in position}
        for statement, new in zip(original.body, updated.body):
            if statement in leaving:
                self.moved[statement] = self.items.get(statement, [new])
        removals = [e for e in edits if isinstance(e, Remove)]
        block = _BlockEdits(
            position=position,
            removed={e.anchor for e in removals} | leaving,
            uncommented={e.anchor for e in removals if not e.keep_comments} | leaving,
            wraps=sorted(
                (e for e in edits if isinstance(e, Wrap)), key=lambda w: position[w.last] - position[w.anchor]
            ),
        )
        for edit in edits:
            if isinstance(edit, InsertBefore):
                block.before.setdefault(edit.anchor, []).extend(edit.statements)
            elif isinstance(edit, InsertAfter):
                block.after.setdefault(edit.anchor, []).extend(edit.statements)
            elif isinstance(edit, Move) and edit.to in position and self.moved[edit.anchor]:
                moved = self.moved[edit.anchor]
                block.before.setdefault(edit.to, []).extend([edit.moved(moved[0]), *moved[1:]])
        return block

    def _segments(self, original, updated, block: _BlockEdits) -> _Segments:
        """What each statement of the block becomes, with what is inserted around it."""
        built = _Segments()
        for statement, new in zip(original.body, updated.body):
            kept = self._kept(statement, new, block)
            before, after = block.before.get(statement, ()), block.after.get(statement, ())
            if not kept and statement not in block.uncommented and _has_comments(statement, detached=True):
                built.carried.extend(_detached(statement.leading_lines))
            elif not kept and not before and not after:
                built.skip(statement)
                continue
            built.add(_joined(before, kept, after))
        return built

    def _kept(self, statement, new, block: _BlockEdits) -> list[cst.BaseStatement]:
        """What `statement` (`new` with the edits inside it made) becomes in its block."""
        kept = [] if statement in block.removed else self.items.get(statement, [new])
        if statement in self.run_ends and kept == [new]:
            # its comments described the run the fix replaced
            kept[0] = new.with_changes(
                leading_lines=_detached(new.leading_lines),
                trailing_whitespace=new.trailing_whitespace.with_changes(
                    whitespace=cst.SimpleWhitespace(""), comment=None
                ),
            )
        return kept

    def _first_went(self, original, block: _BlockEdits) -> bool:
        """Did the block's first statement go, with nothing inserted in its place?"""
        first = original.body[0] if original.body else None
        return (first in block.removed or self.items.get(first) == []) and not block.before.get(first)


@dataclass
class _BlockEdits:
    """The edits of one block, by the statements they anchor at."""

    position: dict[cst.CSTNode, int]  # statement -> its place in the block
    removed: set[cst.CSTNode]  # removed or moved out
    uncommented: set[cst.CSTNode]  # ... and their comment lines with them
    wraps: list[Wrap]  # the shortest runs first, so that a `with` may hold another
    before: dict[cst.CSTNode, list[cst.BaseStatement]] = field(default_factory=dict)  # inserted or moved there
    after: dict[cst.CSTNode, list[cst.BaseStatement]] = field(default_factory=dict)


@dataclass
class _Segments:
    """The new statements of a block, one segment per statement it had, and the lines of the
    statements removed on their way to the next statement kept."""

    segments: list[list[cst.BaseStatement]] = field(default_factory=list)
    carried: list[cst.EmptyLine] = field(default_factory=list)  # comment lines of removed statements
    # The blank lines above removed statements, which separated them and what follows
    # from the statements before: the next statement gets them if it has none.
    gap: list[cst.EmptyLine] = field(default_factory=list)

    def skip(self, statement: cst.BaseStatement) -> None:
        """`statement` goes, and nothing takes its place."""
        self.gap = self.gap or split_blank(statement.leading_lines)[0]
        self.segments.append([])

    def add(self, segment: list[cst.BaseStatement]) -> None:
        if segment and self.carried:
            segment[0] = segment[0].with_changes(leading_lines=[*self.carried, *segment[0].leading_lines])
            self.carried = []
        if segment and self.gap and not segment[0].leading_lines:
            segment[0] = segment[0].with_changes(leading_lines=self.gap)
        if segment:
            self.gap = []
        self.segments.append(segment)


def _joined(
    before: Sequence[cst.BaseStatement], kept: list[cst.BaseStatement], after: Sequence[cst.BaseStatement]
) -> list[cst.BaseStatement]:
    """A statement's segment: what is inserted before it, what it became, what is inserted
    after it. Those inserted before take the blank lines above it."""
    before = list(before)
    if before and kept and kept[0].leading_lines:
        blank, own = split_blank(kept[0].leading_lines)
        if not before[0].leading_lines:
            before[0] = before[0].with_changes(leading_lines=blank)
        kept = [kept[0].with_changes(leading_lines=own), *kept[1:]]
    return [*before, *kept, *after]


def _wrap_segments(segments: list[list[cst.BaseStatement]], wrap: Wrap, block: _BlockEdits) -> None:
    """Put the statements of `wrap`'s run in a `with`, in the segment of its first statement."""
    first, last = block.position[wrap.anchor], block.position[wrap.last]
    # What goes before the first wrapped statement goes before the `with`, which
    # takes that statement's place (a value the `with` line reads is built first).
    ahead = len(block.before.get(wrap.anchor, ())) if wrap.anchor not in block.removed else 0
    outside = segments[first][:ahead]
    body = [s for segment in segments[first : last + 1] for s in segment][ahead:]
    for i in range(first, last + 1):
        segments[i] = []
    segments[first] = [*outside, _with(wrap.items, body)] if body else outside


def _as_statements(result: Replacement) -> list[cst.BaseStatement]:
    if isinstance(result, cst.RemovalSentinel):
        return []
    if isinstance(result, cst.FlattenSentinel):
        return list(result.nodes)
    return [result]


def _has_comment_lines(lines: Sequence[cst.EmptyLine]) -> bool:
    return any(line.comment is not None for line in lines)


def _holds_comments(block: cst.BaseSuite) -> bool:
    """Has the block (a `pass` left by the edits) comment lines the edits kept?"""
    if isinstance(block, cst.SimpleStatementSuite):
        return False
    return _has_comment_lines(block.footer) or any(_has_comment_lines(s.leading_lines) for s in block.body)


# `a == b` is false exactly where `a != b` is true (Python's default `__ne__` inverts `__eq__`).
OPPOSITE_COMPARISONS = {
    cst.Equal: cst.NotEqual,
    cst.NotEqual: cst.Equal,
    cst.Is: cst.IsNot,
    cst.IsNot: cst.Is,
    cst.In: cst.NotIn,
    cst.NotIn: cst.In,
}
# Expressions that bind more loosely than `not`, or that `not` cannot take bare.
LOOSER_THAN_NOT = (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr)


def negated(test: cst.BaseExpression) -> cst.BaseExpression:
    """The `if` test that holds where `test` does not, as one writes it: `x` for `not x`,
    `a != b` for `a == b`, `not (a and b)`."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and not test.lpar:
        return test.expression
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and not test.lpar:
        target = test.comparisons[0]
        opposite = OPPOSITE_COMPARISONS.get(type(target.operator))
        if opposite is not None:
            operator = opposite(
                whitespace_before=target.operator.whitespace_before, whitespace_after=target.operator.whitespace_after
            )
            return test.with_changes(comparisons=[target.with_changes(operator=operator)])
    if isinstance(test, LOOSER_THAN_NOT) and not test.lpar:
        test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.UnaryOperation(operator=cst.Not(), expression=test)


def _has_comments(statement: cst.BaseStatement, detached: bool = False) -> bool:
    """Has the statement comment lines above it (`detached`: set apart by a blank line)?"""
    lines = _detached(statement.leading_lines) if detached else statement.leading_lines
    return any(line.comment is not None for line in lines)


def _detached(lines: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
    """The lines above a statement up to its last blank line: the comment lines after it
    are the statement's own."""
    lines = list(lines)
    last_blank = max((k for k, line in enumerate(lines) if line.comment is None), default=-1)
    return lines[: last_blank + 1]


def split_blank(lines: Sequence[cst.EmptyLine]) -> tuple[list, list]:
    """Leading blank lines (no comment) and the rest."""
    lines = list(lines)
    count = 0
    while count < len(lines) and lines[count].comment is None:
        count += 1
    return lines[:count], lines[count:]


def _with(items: Sequence[cst.WithItem], body: list[cst.BaseStatement]) -> cst.With:
    first = body[0]
    items = list(items)
    items[:-1] = [item.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for item in items[:-1]]
    return cst.With(
        items=items,
        body=cst.IndentedBlock(body=[first.with_changes(leading_lines=[]), *body[1:]]),
        leading_lines=first.leading_lines,
    )

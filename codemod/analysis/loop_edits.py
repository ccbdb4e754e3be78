"""Edits that take a loop apart while keeping what other fixes did inside it.

A rule that batches a loop (one call over all positions or samples instead of
one per iteration) changes a few expressions in the body and then runs the body
once. `unwrap` is the second half: the loop statement becomes the statements of
its body, as other fixes (and the rule's own small edits) left them, so a
keyword added to a call in the body, a statement wrapped in a `with`, or a
removed line inside the loop all survive the rewrite in the same run.

`in_front_of(loop, line)` and `moved_line(line)` are a statement as it goes when moved
out of a loop (first in front of it, or after another moved line): its own comments go
along, the blank lines above the loop stay above what now comes first.
"""

from __future__ import annotations

import libcst as cst

from codemod.edits import Replace


def unwrap(loop: cst.For | cst.While) -> Replace:
    """`loop` -> its body's statements (updated), in the block around it. The comments
    above the loop and on its header line go above the first statement; an `else:`
    clause is not kept (callers only unwrap loops without one)."""
    return Replace(loop, _body_statements)


def _body_statements(updated: cst.For | cst.While) -> cst.FlattenSentinel | cst.RemovalSentinel:
    body = updated.body
    if isinstance(body, cst.SimpleStatementSuite):
        statements: list[cst.BaseStatement] = [
            cst.SimpleStatementLine(
                body=[
                    small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) if i == len(body.body) - 1 else small
                    for i, small in enumerate(body.body)
                ]
            )
        ]
        header = body.trailing_whitespace.comment
    else:
        statements = list(body.body)
        header = body.header.comment
    if not statements:
        return cst.RemovalSentinel.REMOVE
    above = list(updated.leading_lines)
    if header is not None:
        above.append(cst.EmptyLine(comment=header))
    first = statements[0]
    statements[0] = first.with_changes(leading_lines=[*above, *first.leading_lines])
    return cst.FlattenSentinel(statements)


def in_front_of(loop: cst.CSTNode, line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    """`line` as it goes first in front of `loop`: the blank lines above the loop go above
    it (the comments above the loop stay with it), the line keeps its own comments."""
    leading = list(loop.leading_lines)
    first_comment = next((k for k, above in enumerate(leading) if above.comment is not None), len(leading))
    moved = moved_line(line)
    return moved.with_changes(leading_lines=[*leading[:first_comment], *moved.leading_lines])


def moved_line(line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    """`line` without the blank lines above it: its comments go along."""
    return line.with_changes(leading_lines=[l for l in line.leading_lines if l.comment is not None])

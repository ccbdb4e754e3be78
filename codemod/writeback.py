"""The text of a rewritten module: the statements the fixes left alone copied from the
file, the others generated.

Fixes rebuild only the top-level statements they touch; every other statement of
the new module is the parsed statement itself. Generating the code of the whole
module again (libcst's `Module.code`) costs as much as parsing it, and so does
checking that libcst writes the original back byte for byte. Here the statements
the new module shares with the old one are copied from the old text, so they are
byte for byte what the user wrote, and only the statements the fixes replaced
are checked: libcst must write each of them back as written (then the fixes
change nothing but what they edit).
"""

from __future__ import annotations

import libcst as cst

from codemod.analysis.positions import generated
from codemod.context import FileContext


def written(
    new: cst.Module, old: FileContext, lines: list[int] | None = None, ranges: dict | None = None
) -> tuple[str, bool]:
    """The code of `new`, a rewrite of `old.module`, and whether the statements it
    replaced were checked to come back from libcst as they are written in `old.code`.
    Falls back to libcst's `new.code` (unchecked) where the old text cannot be cut
    into its statements (see Positions.statement_lines). `lines`, when given, gets the
    line each statement of `new.body` starts on in that code where it is put together
    from its statements (the table Positions.statement_lines would read from it again);
    `ranges`, when given with `lines`, gets statement -> positions.generated(...) for
    each statement whose code is generated here (for the positions of a pass on `new`,
    which need not generate it again)."""
    pieces = _statement_texts(old)
    if pieces is None or not _same_frame(new, old.module):
        return new.code, False
    header, texts, footer = pieces
    shared = {id(statement) for statement in new.body}
    for statement in old.module.body:
        if id(statement) not in shared and old.positions.text(statement) != texts[id(statement)]:
            return new.code, False
    body = []
    line = 1 + header.count("\n")
    for statement in new.body:
        text = texts.get(id(statement))
        if text is None and ranges is not None and lines is not None:
            ranges[statement] = generated(statement, new, line)
            text = ranges[statement][1]
        elif text is None:
            text = new.code_for_node(statement)
        body.append(text)
        if lines is not None:
            lines.append(line)
            line += text.count("\n")
    return header + "".join(body) + footer, True


def _same_frame(new: cst.Module, old: cst.Module) -> bool:
    """Everything of the module around its statements unchanged."""
    return (
        _same_nodes(new.header, old.header)
        and _same_nodes(new.footer, old.footer)
        and new.has_trailing_newline
        and old.has_trailing_newline
        and new.default_newline == old.default_newline == "\n"
        and new.default_indent == old.default_indent
        and new.encoding == old.encoding
    )


def _same_nodes(new, old) -> bool:
    """The same lines: the same nodes, or equal ones (a transform of the module builds its
    footer's blank and comment lines again, equal to the old ones)."""
    return len(new) == len(old) and all(a is b or a.deep_equals(b) for a, b in zip(new, old))


def _statement_texts(context: FileContext) -> tuple[str, dict[int, str], str] | None:
    """The module's header text, the text of each top-level statement (its leading
    blank and comment lines included), and the footer text."""
    module, code = context.module, context.code
    starts = context.positions.statement_lines()
    if starts is None or not module.body or not code.endswith("\n") or code.startswith("\ufeff"):
        return None
    offsets = [0]  # where each line starts
    at = code.find("\n")
    while at != -1:
        offsets.append(at + 1)
        at = code.find("\n", at + 1)
    lines = len(offsets) - 1  # the text ends with a newline: the last offset is its end
    first = starts[module.body[0]]
    footer_line = lines + 1 - len(module.footer)
    if first - 1 != len(module.header) or footer_line < first:
        return None
    ends = [starts[statement] for statement in module.body[1:]] + [footer_line]
    texts = {}
    for statement, end in zip(module.body, ends):
        begin = starts[statement]
        if end <= begin:
            return None
        texts[id(statement)] = code[offsets[begin - 1] : offsets[end - 1]]
    return code[: offsets[first - 1]], texts, code[offsets[footer_line - 1] :]

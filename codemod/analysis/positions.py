"""Line and column of nodes, computed one top-level statement at a time.

libcst's PositionProvider generates the code of the whole module while
recording every node's range; most files need the position of a handful of
nodes (the findings), so this computes the ranges of the top-level statement
that holds the node asked for, starting at that statement's line. Where each
top-level statement starts is read from Python's own parser (`ast`), which
gives it without generating code.

Inside a function, a class or the body of a loop, an `if`, a `with` or a `try`, the
statements of the block start where `ast` says too: a node inside one of them is
given the ranges of the innermost such statement, generated alone at its line with
the indentation of the blocks around it, rather than those of the whole top-level
statement (a function of hundreds of lines, for one finding in it).
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Mapping, Sequence

import libcst as cst
from libcst._position import CodePosition, CodeRange
from libcst.metadata.position_provider import PositionProvidingCodegenState

_BARE_CONTINUATION = re.compile(r"^[ \t]*\\\n", re.MULTILINE)
# Statements whose `body` block holds the statements of `ast`'s `body` list, one for one.
_BLOCK_OWNERS = (cst.FunctionDef, cst.ClassDef, cst.For, cst.While, cst.If, cst.With, cst.Try, cst.TryStar)


class _Collector:
    """The provider interface the codegen state records into: node -> ((line, column),
    (line, column)), made a CodeRange when asked for."""

    def __init__(self) -> None:
        self._computed: dict[cst.CSTNode, tuple[tuple[int, int], tuple[int, int]]] = {}


class _State(PositionProvidingCodegenState):
    """libcst's PositionProvidingCodegenState, the same positions for less: a range is
    kept as two pairs (libcst builds three objects a node: two CodePositions and a
    CodeRange, and numbers 110,000 of them in a 2,000-line file), a token without a line
    break moves the column without a regular expression, and a syntactic position is
    recorded by a small context manager rather than a generator."""

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        if "\n" in value or "\r" in value:
            self._update_position(value)
        else:
            self.column += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._stack.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._stack.pop()
        computed = self.provider._computed
        if node not in computed:  # (a syntactic position recorded already stays)
            computed[node] = (start, (self.line, self.column))

    def record_syntactic_position(self, node, *, start_node=None, end_node=None) -> _Recording:
        return _Recording(self, node, start_node, end_node)


class _Recording:
    """PositionProvidingCodegenState.record_syntactic_position, with pairs."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: _State, node, start_node, end_node) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(self, *exc) -> None:
        computed = self.state.provider._computed
        start = computed[self.start_node][0] if self.start_node is not None else self.start
        end = computed[self.end_node][1] if self.end_node is not None else (self.state.line, self.state.column)
        computed[self.node] = (start, end)


def statement_starts(statement: cst.CSTNode) -> dict[cst.CSTNode, tuple[int, int]]:
    """node -> (line, column) where it starts, for the nodes of `statement` written alone as
    a module of its own (lines from 1): what libcst's PositionProvider gives in
    `cst.Module([statement])`, without its metadata machinery."""
    module = cst.Module([])
    collector = _Collector()
    state = _State(
        default_indent=module.default_indent,
        default_newline=module.default_newline,
        provider=collector,  # type: ignore[arg-type]
    )
    state.line = 1
    statement._codegen(state)
    return {node: start for node, (start, _) in collector._computed.items()}


def generated(statement: cst.CSTNode, module: cst.Module, line: int, indents: Sequence[str] = ()) -> tuple[dict, str]:
    """The ranges of the nodes of `statement`, a statement of `module` whose code
    starts on `line` (its leading blank and comment lines included), as (line, column)
    pairs, and its code: one code generation gives both. `indents`: the indentation of
    each block around it (none for a top-level statement)."""
    collector = _Collector()
    state = _State(
        default_indent=module.default_indent,
        default_newline=module.default_newline,
        provider=collector,  # type: ignore[arg-type]
    )
    state.line = line
    state.indent_tokens = list(indents)
    statement._codegen(state)
    return collector._computed, "".join(state.tokens)


class Positions(Mapping):
    """node -> CodeRange, like libcst's PositionProvider (syntactic positions:
    1-based lines, 0-based columns)."""

    def __init__(
        self,
        module: cst.Module,
        parents: Mapping[cst.CSTNode, cst.CSTNode],
        code: str | None = None,
        earlier: Positions | None = None,
        statement_lines: list[int] | None = None,
        written: Mapping[cst.CSTNode, tuple[dict, str]] | None = None,
    ) -> None:
        """`earlier`: the positions of a module this one rewrites; `statement_lines`: the
        line each statement of the module's body starts on, where the caller knows it (the
        text it put together from them), so that `ast` need not read the text again;
        `written`: statement -> `generated(statement, module, its line)`, for the
        statements the caller generated that way while putting the text together."""
        self.module = module
        self.code = code  # the module's text, when the caller has it
        self.parents = parents
        # The positions of a module this one rewrites: a top-level statement the two share
        # has the same ranges there, moved by the lines between its two starts.
        same_layout = earlier is not None and (
            (earlier.module.default_indent, earlier.module.default_newline)
            == (module.default_indent, module.default_newline)
        )
        self._earlier = earlier if same_layout else None
        self._by_statement: dict[cst.CSTNode, dict] = {}  # top-level statement -> the pairs of its nodes
        self._ranges: dict[cst.CSTNode, CodeRange] = {}  # made from _pairs when first asked for
        self._pairs: dict[cst.CSTNode, tuple[tuple[int, int], tuple[int, int]]] = {}
        self._starts: dict[cst.CSTNode, int] | None = None  # top-level statement -> its first line
        self._from_ast: dict[cst.CSTNode, int] | None | bool = False  # False: not read yet
        # The statements of blocks, where `ast` has read the text: statement -> its ast node,
        # and a compound statement -> the first lines of the statements of its block
        # (None where the two parsers do not line up there)
        self._ast_nodes: dict[cst.CSTNode, ast.stmt] = {}
        self._block_lines: dict[cst.CSTNode, dict[cst.CSTNode, int] | None] = {}
        if statement_lines is not None and len(statement_lines) == len(module.body):
            self._from_ast = dict(zip(module.body, statement_lines))
        self._done: set[cst.CSTNode] = set()
        self._generated_within: set[cst.CSTNode] = set()  # statements of blocks generated alone
        self._texts: dict[cst.CSTNode, str] = {}  # top-level statement -> its generated code
        # (generated at the lines of `statement_lines`: taken only with them)
        self._written = written if written is not None and self._from_ast is not False else {}

    def _statement_lines(self) -> dict[cst.CSTNode, int]:
        """Top-level statement -> the line its leading blank and comment lines start on."""
        if self._starts is None:
            self._starts = self.statement_lines() or self._lines_from_code()
        return self._starts

    def statement_lines(self) -> dict[cst.CSTNode, int] | None:
        """The same table read from the text with `ast` (no code generated); None where
        the two parsers do not line up."""
        if self._from_ast is False:
            self._from_ast = self._lines_from_ast()
        return self._from_ast

    def _lines_from_code(self) -> dict[cst.CSTNode, int]:
        line = 1 + len(self.module.header)
        starts = {}
        for statement in self.module.body:
            starts[statement] = line
            line += self.module.code_for_node(statement).count("\n")
        return starts

    def _lines_from_ast(self) -> dict[cst.CSTNode, int] | None:
        """The same table from `ast`'s line numbers: a line of small statements
        (`a = 1; b = 2`) is one libcst statement and several `ast` ones; a decorated
        definition starts at its first decorator. None where the two parsers do not
        line up (a file `ast` cannot read, stray line endings, a line that is only a
        backslash continuation)."""
        if self.code is None or "\r" in self.code or "\f" in self.code or _BARE_CONTINUATION.search(self.code):
            return None
        try:
            with warnings.catch_warnings():  # `ast` warns about invalid escapes; libcst's parse stands
                warnings.simplefilter("ignore")
                tree = ast.parse(self.code)
        except (SyntaxError, ValueError):
            return None
        return self._starts_of(self.module.body, tree.body)

    def _starts_of(self, statements: Sequence[cst.CSTNode], nodes: list[ast.stmt]) -> dict[cst.CSTNode, int] | None:
        """The line each of `statements` (a block) starts on, its leading lines included,
        from `nodes`, the block as `ast` reads it; None where the two do not line up."""
        remaining = iter(nodes)
        starts = {}
        for statement in statements:
            node = next(remaining, None)
            if node is None:
                return None
            if isinstance(statement, cst.SimpleStatementLine):
                for _ in statement.body[1:]:
                    next(remaining, None)
            decorators = getattr(node, "decorator_list", None)
            if decorators:  # the first decorator's line, less the lines libcst keeps before it
                first = decorators[0].lineno - len(statement.decorators[0].leading_lines)
            else:
                first = node.lineno
            starts[statement] = first - len(statement.leading_lines)
            self._ast_nodes[statement] = node
        if next(remaining, None) is not None:
            return None
        return starts

    def _lines_in_block(self, owner: cst.CSTNode) -> dict[cst.CSTNode, int] | None:
        """The line each statement of the block of `owner` (a compound statement whose
        `ast` node is known) starts on; None where that cannot be read."""
        if owner not in self._block_lines:
            node = self._ast_nodes.get(owner)
            body = getattr(node, "body", None)
            found = None
            if isinstance(owner, _BLOCK_OWNERS) and isinstance(owner.body, cst.IndentedBlock) and type(body) is list:
                found = self._starts_of(owner.body.body, body)
            self._block_lines[owner] = found
        return self._block_lines[owner]

    def _within(self, top: cst.CSTNode, node: cst.CSTNode) -> bool:
        """Take the ranges of the innermost statement of a block inside `top` that holds
        `node` and whose line `ast` gives, generated alone at that line; False where
        there is none, or it does not hold `node` (then the whole of `top` is generated)."""
        if not isinstance(self._from_ast, dict) or top not in self._ast_nodes:
            return False  # (the lines came from the caller: no `ast` to read the blocks from)
        chain = [node]
        while chain[-1] is not top:
            parent = self.parents.get(chain[-1])
            if parent is None:
                return False
            chain.append(parent)
        chain.reverse()  # top, its block, a statement of it, ... node
        statement, line, indents = None, 0, []
        owner = top
        for block, inner in zip(chain[1::2], chain[2::2]):
            if not (isinstance(block, cst.IndentedBlock) and block is getattr(owner, "body", None)):
                break
            lines = self._lines_in_block(owner)
            if lines is None or inner not in lines:
                break
            indents.append(self.module.default_indent if block.indent is None else block.indent)
            statement, line, owner = inner, lines[inner], inner
        if statement is None or statement in self._generated_within:
            return False
        self._generated_within.add(statement)
        pairs, _ = generated(statement, self.module, line, indents)
        self._pairs.update(pairs)
        return node in pairs

    def _top(self, node: cst.CSTNode) -> cst.CSTNode:
        current = node
        while True:
            parent = self.parents.get(current)
            if parent is None or parent is self.module:
                return current
            current = parent

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        found = self._ranges.get(node)
        if found is not None:
            return found
        if node is self.module:
            end = self.module.code.count("\n") + 1
            return CodeRange(CodePosition(1, 0), CodePosition(end, 0))
        pair = self._pairs.get(node)
        if pair is None:
            top = self._top(node)
            if top in self._done or top not in self._statement_lines():
                raise KeyError(node)
            if not self._moved(top) and not self._taken(top) and not self._within(top, node):
                self._compute(top)
            pair = self._pairs[node]
        (start_line, start_column), (end_line, end_column) = pair
        found = self._ranges[node] = CodeRange(
            CodePosition(start_line, start_column), CodePosition(end_line, end_column)
        )
        return found

    def _compute(self, statement: cst.CSTNode) -> None:
        self._keep(statement, *generated(statement, self.module, self._statement_lines()[statement]))

    def _keep(self, statement: cst.CSTNode, pairs: dict, text: str) -> None:
        self._pairs.update(pairs)
        self._by_statement[statement] = pairs
        self._done.add(statement)
        self._texts[statement] = text

    def _taken(self, statement: cst.CSTNode) -> bool:
        """Take the ranges of `statement` from those the caller generated with its code
        (`written`); False where it did not."""
        found = self._written.get(statement)
        if found is None:
            return False
        self._keep(statement, *found)
        return True

    def _moved(self, statement: cst.CSTNode) -> bool:
        """Take the ranges of `statement`, a top-level statement, from the positions of the
        module this one rewrites, where it was computed: its code is generated alike at any
        line (a top-level statement starts at column 0), so each range moves by the lines
        between its two starts. False where they are not known there."""
        earlier = self._earlier
        if earlier is None:
            return False
        if statement not in earlier._done:
            earlier._taken(statement)  # (written there, not asked about)
        pairs = earlier._by_statement.get(statement)
        if pairs is None:
            return False
        shift = self._statement_lines()[statement] - earlier._statement_lines()[statement]
        if shift:
            pairs = {
                node: ((start + shift, start_column), (end + shift, end_column))
                for node, ((start, start_column), (end, end_column)) in pairs.items()
            }
        self._pairs.update(pairs)
        self._by_statement[statement] = pairs
        self._done.add(statement)
        self._texts[statement] = earlier._texts[statement]
        return True

    def text(self, statement: cst.CSTNode) -> str:
        """The code libcst generates for a top-level statement (kept from computing its
        positions, or by the caller that wrote it, when that was done)."""
        if statement not in self._done:
            self._taken(statement)
        found = self._texts.get(statement)
        return found if found is not None else self.module.code_for_node(statement)

    def __iter__(self):
        raise TypeError("positions are computed on demand; ask for a node")

    def __len__(self) -> int:
        raise TypeError("positions are computed on demand; ask for a node")

    def __contains__(self, node) -> bool:
        try:
            self[node]
        except KeyError:
            return False
        return True

"""`perfmod report`: one self-contained HTML page to review a run.

The summary (files, findings by rule and level, the rules' expected gains,
the verify result and the profile when given), then per file the diff, syntax-highlighted,
with each change annotated by the finding(s) that made it, and the findings
left for a higher level or without a fix. CSS is inline and nothing is loaded
from elsewhere, so the page works offline and as a CI artifact.

Which finding made which change: every applied finding carries the lines
its fix rewrites (`Finding.fix_lines`, from the engine's edits), which may lie
away from the finding itself (an import, a setting before the loop, a value
read at log time). A change is shown under the findings whose lines it meets;
the first change of a finding gets its note, later ones point back at it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import jinja2
from markupsafe import Markup, escape

from codemod.docs import DOCS_FOLDER, page_path
from codemod.report.diff import decode
from codemod.report.highlight import Span, highlight_lines
from codemod.report.review import (
    level_counts,
    loss_chart,
    profile_bars,
    profile_headline,
    profile_segments,
    rule_rows,
    status,
    verify_facts,
    verify_fixes,
    verify_headline,
    verify_rows,
    verify_slower,
)
from codemod.report.summary import Summary
from codemod.result import FileResult
from codemod.rule import Finding, Level, Rule

CONTEXT_LINES = 3
PAIR_RATIO = 0.5  # a removed and an added line this alike are one line edited: mark the words that differ
INLINE_CODE = re.compile(r"`([^`]+)`")
WORD = re.compile(r"\w+|\s+|[^\w\s]")


@dataclass(frozen=True)
class Row:
    """One line of the diff."""

    kind: str  # "context", "removed" or "added"
    old: int | None  # line number before the fix (None for an added line)
    new: int | None  # and after (None for a removed line)
    spans: list[Span]


@dataclass
class Note:
    """A finding shown under the change it made (or, `continued`, a later part of
    it); `sites` counts the findings of one rule with one message on one line."""

    finding: Finding
    gain: str
    docs: str
    continued: bool = False
    sites: int = 1


@dataclass
class Block:
    """Diff rows in a run: unchanged context, or one change with its notes."""

    rows: list[Row]
    change: bool
    old_range: tuple[int, int] = (0, 0)  # 0-based [start, end) in the old lines; empty for an insertion
    notes: list[Note] = field(default_factory=list)


@dataclass(frozen=True)
class Hunk:
    header: str
    blocks: list[Block]


@dataclass(frozen=True)
class Outstanding:
    """A finding whose fix was not applied at the chosen level, with its line."""

    finding: Finding
    status: str
    spans: list[Span]
    docs: str


@dataclass(frozen=True)
class FileView:
    path: str
    anchor: str
    error: str | None
    changed: bool
    hunks: list[Hunk]
    fixed: list[Finding]
    unplaced: list[Note]  # fixed findings no change could be tied to
    outstanding: list[Outstanding]
    added: int
    removed: int


def render_html(
    results: Sequence[FileResult],
    level: Level,
    rules: Sequence[type[Rule]],
    *,
    verify: dict | None = None,
    profile: dict | None = None,
    command: str = "",
    generated: datetime | None = None,
) -> str:
    """The page for `results` at `level`. `verify`: a document checked by review.load_verify;
    `profile`: one checked by review.load_profile."""
    summary = Summary.of(results)
    docs = {rule.CODE: page_path(rule) for rule in rules}
    gains = {rule.CODE: rule.GAIN for rule in rules}
    files = [
        file_view(result, index, docs, gains)
        for index, result in enumerate(results)
        if result.error or result.findings or result.changed
    ]
    context = {
        "level": level.label,
        "levels": [item.label for item in Level],
        "summary": summary,
        "by_level": level_counts(summary.findings),
        "rows": rule_rows(summary, rules),
        "files": files,
        "clean": [r.path for r in results if not (r.error or r.findings or r.changed)],
        "verify": verify,
        "verify_headline": verify_headline(verify) if verify else "",
        "verify_slower": verify_slower(verify) if verify else False,
        "verify_rows": verify_rows(verify) if verify else [],
        "verify_facts": verify_facts(verify) if verify else [],
        "verify_fixes": verify_fixes(verify) if verify else [],
        "loss_chart": loss_chart(verify) if verify else None,
        "profile": profile,
        "profile_headline": profile_headline(profile) if profile else "",
        "profile_segments": profile_segments(profile) if profile else [],
        "profile_bars": profile_bars(profile) if profile else [],
        "command": command,
        "generated": (generated or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC"),
        "docs_folder": DOCS_FOLDER,
    }
    return _environment().get_template("report.html.j2").render(context)


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("codemod.report", "templates"),
        autoescape=True,  # source code is data: `<script>` in a file must stay text
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["inline_code"] = inline_code
    return environment


def inline_code(text: str) -> Markup:
    """A message with its `backticked` names as <code>, everything else escaped."""
    return Markup(INLINE_CODE.sub(r"<code>\1</code>", str(escape(text))))


def file_view(result: FileResult, index: int, docs: Mapping[str, str], gains: Mapping[str, str]) -> FileView:
    old_text = decode(result.source)
    old_lines = old_text.splitlines()
    old_spans = highlight_lines(old_text)
    hunks: list[Hunk] = []
    unplaced: list[Note] = []
    fixed = [f for f in result.findings if f.applied] if result.error is None else []
    if result.changed and result.error is None:
        new_text = decode(result.new_source)
        hunks = diff_hunks(old_lines, new_text.splitlines(), old_spans, highlight_lines(new_text))
        unplaced = annotate(hunks, fixed, docs, gains)
    outstanding = [
        Outstanding(
            f, status(f), css_spans(old_spans[f.line - 1]) if 0 < f.line <= len(old_spans) else [], docs.get(f.code, "")
        )
        for f in result.findings
        if not f.applied
    ]
    rows = [row for hunk in hunks for block in hunk.blocks for row in block.rows]
    return FileView(
        path=result.path,
        anchor=f"file-{index + 1}",
        error=result.error,
        changed=result.changed and result.error is None,
        hunks=hunks,
        fixed=fixed,
        unplaced=unplaced,
        outstanding=outstanding,
        added=sum(1 for row in rows if row.kind == "added"),
        removed=sum(1 for row in rows if row.kind == "removed"),
    )


def diff_hunks(
    old: Sequence[str], new: Sequence[str], old_spans: Sequence[list[Span]], new_spans: Sequence[list[Span]]
) -> list[Hunk]:
    """The unified diff's hunks (as `apply --dry-run` prints them), as rows in
    blocks: each change (a run of removed and added lines) is a block of its own."""
    hunks = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(CONTEXT_LINES):
        blocks = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                blocks.append(
                    Block(
                        [
                            Row("context", i + 1, j + 1, css_spans(old_spans[i]))
                            for i, j in zip(range(i1, i2), range(j1, j2))
                        ],
                        change=False,
                        old_range=(i1, i2),
                    )
                )
                continue
            marks_old, marks_new = changed_words(old[i1:i2], new[j1:j2])
            rows = [
                Row("removed", i + 1, None, css_spans(old_spans[i], marks_old.get(i - i1, ()))) for i in range(i1, i2)
            ]
            rows += [
                Row("added", None, j + 1, css_spans(new_spans[j], marks_new.get(j - j1, ()))) for j in range(j1, j2)
            ]
            blocks.append(Block(rows, change=True, old_range=(i1, i2)))
        first, last = group[0], group[-1]
        header = f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@"
        hunks.append(Hunk(header, blocks))
    return hunks


def changed_words(removed: Sequence[str], added: Sequence[str]) -> tuple[dict[int, list], dict[int, list]]:
    """Within one change, the character ranges that differ between a removed
    line and the added line it became (paired in order when they are alike),
    by line index in `removed` and in `added`: what a reviewer's eye should land on."""
    marks_old: dict[int, list] = {}
    marks_new: dict[int, list] = {}
    start = 0
    for i, before in enumerate(removed):
        scored = [
            (difflib.SequenceMatcher(None, before, added[j], autojunk=False).ratio(), j)
            for j in range(start, len(added))
        ]
        ratio, j = max(scored, default=(0.0, -1), key=lambda item: (item[0], -item[1]))
        if ratio < PAIR_RATIO:
            continue
        old_words, new_words = WORD.findall(before), WORD.findall(added[j])
        old_at, new_at = _offsets(old_words), _offsets(new_words)
        matcher = difflib.SequenceMatcher(None, old_words, new_words, autojunk=False)
        for tag, a1, a2, b1, b2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            if "".join(old_words[a1:a2]).strip():  # not a change of indentation alone
                marks_old.setdefault(i, []).append((old_at[a1], old_at[a2]))
            if "".join(new_words[b1:b2]).strip():
                marks_new.setdefault(j, []).append((new_at[b1], new_at[b2]))
        start = j + 1
    return marks_old, marks_new


def _offsets(words: Sequence[str]) -> list[int]:
    offsets = [0]
    for word in words:
        offsets.append(offsets[-1] + len(word))
    return offsets


def css_spans(spans: Sequence[Span], changed: Sequence[tuple[int, int]] = ()) -> list[Span]:
    """Highlighter spans with their CSS classes (`t-kw`), cut where a changed
    range starts or ends, the changed parts also classed `chg`."""
    out: list[Span] = []
    position = 0
    for css, text in spans:
        classes = f"t-{css}" if css else ""
        cuts = sorted({0, len(text), *(min(max(edge - position, 0), len(text)) for r in changed for edge in r)})
        for a, b in zip(cuts, cuts[1:]):
            inside = any(start < position + b and position + a < end for start, end in changed)
            out.append((f"{classes} chg".strip() if inside else classes, text[a:b]))
        position += len(text)
    return out


def _range(start: int, end: int) -> str:
    """A hunk header's `start,count`, as difflib.unified_diff writes it."""
    length = end - start
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"


def annotate(
    hunks: Sequence[Hunk], fixed: Sequence[Finding], docs: Mapping[str, str], gains: Mapping[str, str]
) -> list[Note]:
    """Put each fixed finding under the changes its fix made; returns the
    findings that no change could be tied to."""
    changes = [block for hunk in hunks for block in hunk.blocks if block.change]
    unplaced = []
    for finding in fixed:
        touched = [
            block
            for block in changes
            if any(_overlaps(block.old_range, (first - 1, last)) for first, last in finding.fix_lines)
        ]
        if not touched:
            unplaced.append(Note(finding, gains.get(finding.code, ""), docs.get(finding.code, "")))
            continue
        home = _home(touched, finding.line)
        for block in touched:
            if block is home:
                same = [
                    n
                    for n in block.notes
                    if not n.continued
                    and (n.finding.code, n.finding.line, n.finding.message)
                    == (finding.code, finding.line, finding.message)
                ]
                if same:  # `x.to(d), y.to(d)`: one note for both copies
                    same[0].sites += 1
                    continue
                block.notes.append(Note(finding, gains.get(finding.code, ""), docs.get(finding.code, "")))
            elif not any(n.continued and n.finding.code == finding.code for n in block.notes):
                # A further part of the fix (an import, the value read at log time): point back at it.
                block.notes.append(
                    Note(finding, gains.get(finding.code, ""), docs.get(finding.code, ""), continued=True)
                )
    for block in changes:
        block.notes.sort(key=lambda note: (note.continued, note.finding.line, note.finding.column, note.finding.code))
    return unplaced


def _holds(block: Block, line: int) -> bool:
    """Whether the change is at `line`; an insertion is at the line after it."""
    start, end = block.old_range
    return start + 1 <= line <= max(end, start + 1)


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two old-line ranges meet; an empty range (an insertion) is the
    point between two lines and meets the ranges on either side of it."""
    (a1, a2), (b1, b2) = a, b
    if a1 == a2 or b1 == b2:
        return a1 <= b2 and b1 <= a2
    return a1 < b2 and b1 < a2


def _home(blocks: Sequence[Block], line: int) -> Block | None:
    """The change of `blocks` at the finding's line, else the first one after
    it (a finding on a loop header, a change in its body), else the last."""
    if not blocks:
        return None
    for block in blocks:
        if _holds(block, line):
            return block
    after = [block for block in blocks if block.old_range[0] + 1 >= line]
    return after[0] if after else blocks[-1]

"""Reads a `perfmod report` page back into what a reviewer sees: per file, the
diff rows and the notes under them, in page order (the tests assert on these,
not on the markup's spelling)."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class DiffRow:
    kind: str  # context, removed, added
    old: int | None
    new: int | None
    text: str  # the code as displayed, without the +/- sign


@dataclass
class PageNote:
    code: str
    line: int
    continued: bool
    text: str


@dataclass
class PageFile:
    path: str
    items: list[DiffRow | PageNote] = field(default_factory=list)
    outstanding: list[tuple[str, int, str]] = field(default_factory=list)  # (code, line, text)
    error: str = ""

    def notes(self) -> list[PageNote]:
        return [item for item in self.items if isinstance(item, PageNote)]

    def rows_before(self, note: PageNote) -> list[DiffRow]:
        """The change block the note sits under: the removed/added rows just above it."""
        index = self.items.index(note)
        rows = []
        for item in reversed(self.items[:index]):
            if isinstance(item, PageNote):
                continue
            if item.kind == "context":
                break
            rows.insert(0, item)
        return rows


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.files: list[PageFile] = []
        self.tags: list[str] = []  # every start tag, for the no-script check
        self.ids: set[str] = set()
        self._row: DiffRow | None = None
        self._cells: list[str] = []
        self._cell: str | None = None
        self._note: PageNote | None = None
        self._note_depth = 0
        self._outstanding: list | None = None
        self._error: bool = False
        self._sign = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        classes = (attrs.get("class") or "").split()
        if tag == "section" and "file" in classes:
            self.files.append(PageFile(attrs["data-path"]))
        elif tag == "tr" and classes and classes[0] in ("context", "removed", "added"):
            self._row, self._cells = DiffRow(classes[0], None, None, ""), []
        elif tag == "td" and self._row is not None:
            self._cell = ""
        elif tag == "span" and "sign" in classes:
            self._sign = True
        elif tag == "div" and "annotation" in classes:
            self._note = PageNote(attrs["data-code"], int(attrs["data-line"]), "continued" in classes, "")
            self._note_depth = 1
        elif tag == "div" and self._note is not None:
            self._note_depth += 1
        elif tag == "li" and "finding" in classes:
            self._outstanding = [attrs["data-code"], int(attrs["data-line"]), ""]
        elif tag == "div" and "error-box" in classes:
            self._error = True

    def handle_endtag(self, tag):
        if tag == "span" and self._sign:
            self._sign = False
        elif tag == "td" and self._cell is not None:
            self._cells.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            old, new, text = self._cells
            self._row.old, self._row.new, self._row.text = int(old) if old else None, int(new) if new else None, text
            self.files[-1].items.append(self._row)
            self._row = None
        elif tag == "div" and self._note is not None:
            self._note_depth -= 1
            if self._note_depth == 0:
                self._note.text = " ".join(self._note.text.split())
                self.files[-1].items.append(self._note)
                self._note = None
        elif tag == "li" and self._outstanding is not None:
            self._outstanding[2] = " ".join(self._outstanding[2].split())
            self.files[-1].outstanding.append(tuple(self._outstanding))
            self._outstanding = None
        elif tag == "div" and self._error:
            self._error = False

    def handle_data(self, data):
        if self._cell is not None and not self._sign:
            self._cell += data
        if self._note is not None:
            self._note.text += data
        if self._outstanding is not None:
            self._outstanding[2] += data
        if self._error:
            self.files[-1].error += data


def read_page(page: str) -> _Reader:
    reader = _Reader()
    reader.feed(page)
    reader.close()
    return reader


def _row(rank, code, line, level, ms, share, saving_ms, saving):
    return {
        "rank": rank, "code": code, "name": code.lower(), "path": "copies.py", "line": line, "end_line": line,
        "lines": [[line, line]], "level": level, "fixable": True, "message": "...", "ms": ms, "share": share,
        "categories": {"data": ms}, "kernel_ms": None, "saving_ms": saving_ms, "saving": saving,
    }  # fmt: skip


# A `perfmod profile --format json` document of a data-bound step, as `perfmod profile` writes it.
PROFILE = {
    "schema": 1, "script": "copies.py", "args": [], "steps": 6, "warmup": 2, "seed": 0,
    "device": "cpu (x86_64, 1 torch thread)", "torch": "2.13.0", "profiled_steps": 4, "step_ms": 40.0,
    "steps_per_s": 24.0, "categories": {"python": 2.0, "ops": 10.0, "sync": 0.0, "data": 26.0, "untraced": 2.0},
    "gpu": None,
    "findings": [
        _row(1, "PM201", 7, "unsafe", 26.0, 0.65, 26.0, "up to the data wait measured"),
        _row(2, "PM404", 12, "safe", 1.0, 0.025, 0.2, "the host-device syncs measured on its lines"),
        _row(3, "PM101", 9, "safe", 0.0, 0.0, None, "not estimated"),
    ],
    "uncovered": {"ms": 13.0, "share": 0.325, "advice": "compute in the model", "lines": []},
    "lines": [], "trace": None, "notes": [], "error": None,
}  # fmt: skip

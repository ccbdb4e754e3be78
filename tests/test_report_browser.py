"""The review page in a real browser: headless Chromium renders it, its DOM
has the summary, one section per file and the notes with their rule codes,
and a screenshot shows the page's colours (not a blank page).

Chromium is Debian's `chromium` package: `make browser` installs it where
apt-get can (CI does so before `make test`); elsewhere this test is skipped
and says why."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from html.parser import HTMLParser

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from tests.cli_support import perfmod, write
from tests.report_page import PROFILE, read_page
from tests.test_report import COPIES, REPORT_ONLY, SEED, VERIFY

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
WINDOW = (1280, 2600)  # tall enough for the summary, verify and profile cards and the first diff
TIMEOUT = 120

# Colours the page's CSS paints (RGB): the header bar, an added and a removed line;
# the profile's stacked bar: data wait and torch operators.
HEADER_BAR, ADDED_LINE, REMOVED_LINE = (0x24, 0x29, 0x2F), (0xE6, 0xFF, 0xEC), (0xFF, 0xEB, 0xE9)
DATA_WAIT, OPERATORS = (0xBF, 0x87, 0x00), (0x09, 0x69, 0xDA)


class _ProfileReader(HTMLParser):
    """The profile card as shown: the ranked rows' codes and the stacked bar's segments."""

    def __init__(self) -> None:
        super().__init__()
        self.codes: list[str] = []
        self.segments: list[tuple[str, float]] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if tag == "tr" and {"finding", "uncovered"} & set(classes):
            self.codes.append(attributes.get("data-code"))
        if tag == "span" and "segment" in classes:
            width = next(p for p in attributes["style"].split(";") if p.strip().startswith("width"))
            self.segments.append((attributes["data-category"], float(width.split(":")[1].strip().rstrip("%"))))


def chromium() -> str:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip(
        "no Chromium to render the page: install Debian's chromium (apt-get install -y chromium, or `make browser`)"
    )


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The page of two files (one with a verify result), its DOM after Chromium
    rendered it, and a screenshot, all under the test's temp dir."""
    browser = chromium()
    folder = tmp_path_factory.mktemp("report")
    write(folder / "copies.py", COPIES)
    write(folder / "report_only.py", REPORT_ONLY.read_bytes())
    verify = write(folder / "verify.json", json.dumps(VERIFY))
    profile = write(folder / "profile.json", json.dumps(PROFILE))
    page = folder / "review.html"
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        result = perfmod(
            "report", "copies.py", "report_only.py", "-o", page, "--verify-json", verify, "--profile-json", profile
        )
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    run = [browser, *FLAGS, f"--user-data-dir={folder / 'profile'}"]
    dom = subprocess.run(
        [*run, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=TIMEOUT, check=True
    ).stdout
    screenshot = folder / "report.png"
    subprocess.run(
        [*run, f"--screenshot={screenshot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", page.as_uri()],
        capture_output=True,
        timeout=TIMEOUT,
        check=True,
    )
    return dom, screenshot


def test_the_rendered_dom_has_the_summary_the_files_and_the_notes(rendered):
    dom, _ = rendered
    reader = read_page(dom)
    assert {"summary", "findings-by-rule", "files", "verify", "rules", "rule-PM101", "rule-PM404"} <= reader.ids
    assert {"profile", "profile-step", "profile-findings"} <= reader.ids
    assert [file.path for file in reader.files] == ["copies.py", "report_only.py"]
    copies, report_only = reader.files
    assert [(n.code, n.line) for n in copies.notes()] == [("PM101", 5), ("PM101", 9)]
    assert [(n.code, n.line) for n in report_only.notes()] == [("PM101", 15)]
    assert {code for code, _, _ in report_only.outstanding} == {"PM301", "PM302", "PM402", "PM404"}
    assert "script" not in reader.tags  # the source's <script> string stayed text after rendering
    assert "banner = \"<script>alert('x')</script>\"" in " ".join(r.text for r in copies.items if hasattr(r, "kind"))


def test_the_profile_card_ranks_the_findings_and_stacks_the_step(rendered):
    dom, _ = rendered
    card = _ProfileReader()
    card.feed(dom)
    assert card.codes == ["PM201", "PM404", "PM101", "-"]  # ranked, then the time no finding covers
    assert [name for name, _ in card.segments] == ["python", "ops", "data", "untraced"]  # categories with time
    assert sum(width for _, width in card.segments) == pytest.approx(100.0, abs=0.1)
    assert max(card.segments, key=lambda segment: segment[1])[0] == "data"


def test_the_screenshot_shows_the_page(rendered):
    _, screenshot = rendered
    assert screenshot.stat().st_size > 20_000  # a blank 1280x2600 page compresses to a few kB
    wanted = {HEADER_BAR, ADDED_LINE, REMOVED_LINE, DATA_WAIT, OPERATORS}
    width, height, colours = png_colours(screenshot.read_bytes(), wanted=wanted)
    assert (width, height) == WINDOW
    assert wanted <= colours
    assert len(colours) > 16  # syntax colours, badges, anti-aliased text


def render_dom(browser: str, page, folder) -> str:
    run = [browser, *FLAGS, f"--user-data-dir={folder / 'profile'}", "--dump-dom", page.as_uri()]
    return subprocess.run(run, capture_output=True, text=True, timeout=TIMEOUT, check=True).stdout


def test_each_note_sits_under_a_change_of_its_own_rule(tmp_path, monkeypatch):
    """On a script that several rules rewrite together, every note sits under a change
    that is there because of its rule: a line it adds that the rewrite without that rule
    lacks, or one it removes that the rewrite without it keeps (a finding another rule's
    fix settles sits at its own line). A "Part of the fix" box never goes under a hunk
    that only other rules touched."""
    browser = chromium()
    monkeypatch.chdir(tmp_path)
    source = SEED.read_bytes()
    write(tmp_path / "train.py", source)
    page = tmp_path / "review.html"
    assert perfmod("report", "train.py", "-o", page, "--level", "unsafe").exit_code == 0
    (file,) = read_page(render_dom(browser, page, tmp_path)).files
    notes = file.notes()
    assert len({n.code for n in notes}) >= 8 and sum(n.continued for n in notes) >= 3
    full = _lines(source, Settings(level=Level.UNSAFE))
    for code in sorted({n.code for n in notes}):
        without = _lines(source, Settings(level=Level.UNSAFE, ignore=(code,)))
        added, kept = full - without, without - full
        for note in (n for n in notes if n.code == code):
            rows = file.rows_before(note)
            at_its_line = not note.continued and any(row.old == note.line for row in rows)
            assert at_its_line or any(
                (row.kind == "added" and row.text.rstrip() in added)
                or (row.kind == "removed" and row.text.rstrip() in kept)
                for row in rows
            ), (code, note.line, note.continued, [row.text for row in rows])


def _lines(source: bytes, settings: Settings) -> Counter:
    result = process_source(source, "train.py", settings)
    return Counter(line.rstrip() for line in result.new_source.decode().splitlines())


def png_colours(data: bytes, wanted: set[tuple[int, int, int]]) -> tuple[int, int, set[tuple[int, int, int]]]:
    """Width, height and the RGB colours of an 8-bit RGB or RGBA PNG, decoding
    rows until every colour in `wanted` is seen (all rows if one is missing)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    position, chunks = 8, {}
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        chunks.setdefault(kind, []).append(data[position + 8 : position + 8 + length])
        position += 12 + length
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"][0])
    assert depth == 8 and colour_type in (2, 6) and interlace == 0, (depth, colour_type, interlace)
    channels = 3 if colour_type == 2 else 4
    stride = width * channels
    raw = zlib.decompress(b"".join(chunks[b"IDAT"]))
    colours: set[tuple[int, int, int]] = set()
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        row = _unfilter(raw[start], bytearray(raw[start + 1 : start + 1 + stride]), previous, channels)
        for x in range(0, stride, channels * 4):  # every fourth pixel is plenty for colours
            colours.add((row[x], row[x + 1], row[x + 2]))
        previous = row
        if wanted <= colours and len(colours) > 16:
            break
    return width, height, colours


def _unfilter(kind: int, row: bytearray, above: bytearray, step: int) -> bytearray:
    """Undo one scanline's PNG filter (None, Sub, Up, Average, Paeth)."""
    if kind == 0:
        return row
    if kind == 2:
        return bytearray((a + b) & 0xFF for a, b in zip(row, above))
    for i in range(len(row)):
        left = row[i - step] if i >= step else 0
        if kind == 1:
            row[i] = (row[i] + left) & 0xFF
        elif kind == 3:
            row[i] = (row[i] + ((left + above[i]) >> 1)) & 0xFF
        else:
            corner = above[i - step] if i >= step else 0
            p = left + above[i] - corner
            pa, pb, pc = abs(p - left), abs(p - above[i]), abs(p - corner)
            row[i] = (row[i] + (left if pa <= pb and pa <= pc else above[i] if pb <= pc else corner)) & 0xFF
    return row

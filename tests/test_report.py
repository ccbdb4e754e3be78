"""`perfmod report`: the HTML review page and the markdown summary, rendered
from real engine results on fixture files (the browser test is in
test_report_browser.py)."""

from __future__ import annotations

import difflib
import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest

from codemod.config import Settings
from codemod.docs import RULE_PAGE_URL, page_path, release_ref
from codemod.engine import process_source
from codemod.report.diff import unified_diff
from codemod.report.highlight import highlight_lines
from codemod.report.html import changed_words, css_spans, diff_hunks, inline_code, render_html
from codemod.report.markdown import fence, render_markdown, table_cell
from codemod.rule import Level
from codemod.rules import ALL_RULES
from tests.cli_support import REPO, UNPARSABLE, perfmod, write
from tests.report_page import PROFILE, read_page

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FIXTURES = REPO / "fixtures"
RUNNING_SUM = FIXTURES / "rules" / "PM404" / "running_sum.in.py"
REPORT_ONLY = FIXTURES / "rules" / "PM404" / "report_only.in.py"
# The running sum with a model wide enough for autocast to pay: PM301 wraps its forward
# (the fixture's Linear(16, 1) makes only a memory-bound product, which PM301 reports).
# Wide enough that its product outlasts a kernel launch (narrower, PM301 and PM302 only report).
WIDE_RUNNING_SUM = (
    RUNNING_SUM.read_text()
    .replace("torch.nn.Linear(16, 1)", "torch.nn.Linear(2048, 2048)")
    .replace("torch.randn(50, 8, 16,", "torch.randn(50, 8, 2048,")
    .replace("torch.randn(50, 8, 1,", "torch.randn(50, 8, 2048,")
)
SEED = FIXTURES / "scripts" / "seed_latentwire.py"  # only tokenized: the engine takes seconds on it

# Two host-to-device copies four lines apart, and a string and a comment that
# would be markup if the page did not escape them.
COPIES = """\
import torch
device = torch.device("cuda")
x = torch.randn(4, pin_memory=True)
banner = "<script>alert('x')</script>"  # </td></tr><b>not bold</b>
y = x.to(device)
z = torch.ones(2, pin_memory=True)
w = z * 2
print(banner)
v = z.to(device)
"""

VERIFY = {
    "script": "train.py",
    "level": "numeric",
    "steps": 50,
    "warmup": 5,
    "device": "cuda",
    "original": {
        "steps_per_s": 10.0,
        "samples_per_s": 320.0,
        "peak_memory_bytes": 3 * 2**30,
        "peak_memory_kind": "cuda",
        "losses": [2.5, 2.25, 2.0],
    },
    "rewritten": {
        "steps_per_s": 17.5,
        "samples_per_s": 560.0,
        "peak_memory_bytes": 2 * 2**30,
        "peak_memory_kind": "cuda",
        "losses": [2.5, 2.25, 2.0001],
    },
    "speedup": 1.75,
    "max_abs_deviation": 1e-4,
    "max_rel_deviation": 5e-5,
    "tolerance": {"rtol": 0.01},
    "agree": True,
    "fixes": [{"path": "train.py", "line": 14, "code": "PM301", "message": "autocast"}],
}


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def report(*args):
    return perfmod("report", *args)


def page_of(tmp_path, *args, name="review.html"):
    result = report(*args, "-o", tmp_path / name)
    assert result.exit_code == 0, result.output
    return (tmp_path / name).read_text(encoding="utf-8")


# -- highlighting -----------------------------------------------------------------------


def test_highlight_classes_the_tokens():
    (line,) = highlight_lines("def f(x=1.5):  # note\n")
    assert line == [
        ("kw", "def"),
        ("", " "),
        ("def", "f"),
        ("op", "("),
        ("", "x"),
        ("op", "="),
        ("num", "1.5"),
        ("op", "):"),
        ("", "  "),
        ("com", "# note"),
    ]
    (line,) = highlight_lines('y = f"{a!r}" if None else b"raw"\n')
    assert ("str", 'f"{a!r}"') in line and ("const", "None") in line and ("str", 'b"raw"') in line


def test_highlight_splits_a_docstring_over_its_lines_and_keeps_the_diffs_line_count():
    text = 'def f():\n    """one\n    two"""\r\n\x0cx = 1\n'
    lines = highlight_lines(text)
    assert len(lines) == len(text.splitlines()) == 5  # \r\n is one break, the form feed another
    assert lines[1] == [("", "    "), ("str", '"""one')] and lines[2] == [("str", '    two"""')]
    assert lines[3] == [] and lines[4][0] == ("", "x ")


def test_highlight_survives_a_file_the_tokenizer_rejects():
    lines = highlight_lines(UNPARSABLE)
    assert ["".join(text for _, text in line) for line in lines] == UNPARSABLE.splitlines()


def test_highlight_gives_back_every_character_of_a_real_script():
    text = SEED.read_text(encoding="utf-8")
    lines = highlight_lines(text)
    assert ["".join(t for _, t in line) for line in lines] == text.splitlines()
    classes = {css for line in lines for css, _ in line}
    assert {"kw", "str", "num", "com", "op", "def", "const"} <= classes


# -- the HTML page ----------------------------------------------------------------------


def test_source_markup_is_escaped_and_the_page_has_no_script(tmp_path):
    write(tmp_path / "t.py", COPIES)
    page = page_of(tmp_path, "t.py", "--select", "PM101")
    reader = read_page(page)
    assert "script" not in reader.tags and "b" not in reader.tags  # the source's tags stayed text
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
    (file,) = reader.files
    context = [row.text for row in file.items if getattr(row, "kind", "") == "context"]
    assert "banner = \"<script>alert('x')</script>\"  # </td></tr><b>not bold</b>" in context


def test_each_change_is_annotated_with_its_finding_on_its_line(tmp_path):
    write(tmp_path / "t.py", COPIES)
    (file,) = read_page(page_of(tmp_path, "t.py", "--select", "PM101")).files
    notes = file.notes()
    assert [(n.code, n.line, n.continued) for n in notes] == [("PM101", 5, False), ("PM101", 9, False)]
    for note, before, after in zip(
        notes,
        ["y = x.to(device)", "v = z.to(device)"],
        ["y = x.to(device, non_blocking=True)", "v = z.to(device, non_blocking=True)"],
    ):
        rows = file.rows_before(note)
        assert [(r.kind, r.old, r.new, r.text) for r in rows] == [
            ("removed", note.line, None, before),
            ("added", None, note.line, after),
        ]
        assert "host-to-device copy blocks the CPU" in note.text and "Expected gain" in note.text


def test_each_finding_is_shown_under_the_change_its_rule_made(tmp_path):
    # PM404 reports the `.item()` syncs on lines 20 and 21 and rewrites the whole loop (line 14
    # on); PM101 finds two copies on line 15; PM301 reports the forward (line 16) and wraps it.
    script = tmp_path / "running_sum.py"
    script.write_text(WIDE_RUNNING_SUM)
    page = page_of(tmp_path, script, "--select", "PM101,PM301,PM404", "--level", "numeric")
    (file,) = read_page(page).files
    by_code = {}
    for note in file.notes():
        by_code.setdefault((note.code, note.continued), []).append(note)
    pm404 = by_code[("PM404", False)]
    assert [n.line for n in pm404] == [20, 21]
    for note in pm404:
        removed = [r.text for r in file.rows_before(note) if r.kind == "removed"]
        assert removed and all(".item()" in text for text in removed), removed
    (pm101,) = by_code[("PM101", False)]  # two findings on one line, one note
    assert pm101.line == 15 and "2 sites" in pm101.text
    assert [r.old for r in file.rows_before(pm101) if r.kind == "removed"] == [15, 16]  # with PM301's forward
    added = [r.text for r in file.rows_before(by_code[("PM301", False)][0]) if r.kind == "added"]
    assert any("with precision.autocast():" in text for text in added)
    # The parts of PM301's fix away from its finding (the import at the top, the policy built
    # before the loop) are tied back to it, not left bare.
    # (Both such notes read the same, so they are told apart by the row above each.)
    parts = [(file.items[i - 1].text, item) for i, item in enumerate(file.items) if item in by_code[("PM301", True)]]
    for part in ("from runtime.amp import", "precision = Precision.for_device"):
        assert any(part in row and note.line == 16 and "Part of the fix" in note.text for row, note in parts), part


def test_every_fixed_finding_is_on_the_page_and_findings_left_say_how_to_fix_them(tmp_path):
    page = page_of(tmp_path, REPORT_ONLY, "--level", "safe")
    result = process_source(REPORT_ONLY.read_bytes(), str(REPORT_ONLY), Settings())
    (file,) = read_page(page).files
    shown = {(n.code, n.line) for n in file.notes() if not n.continued}
    assert shown == {(f.code, f.line) for f in result.findings if f.applied}
    left = [f for f in result.findings if not f.applied]
    assert {f.fixable for f in left} == {True, False}  # higher level and report only
    assert [(code, line) for code, line, _ in file.outstanding] == [(f.code, f.line) for f in left]
    for (_, _, text), finding in zip(file.outstanding, left):
        assert (f"fix with --level {finding.level.label}" if finding.fixable else "report only") in text


def test_the_words_a_fix_changed_are_marked(tmp_path):
    removed = ["    x = a.to(device)", "    loss = f(x)"]
    added = ["    x = a.to(device, non_blocking=True)", "    with autocast():", "        loss = f(x)"]
    marks_old, marks_new = changed_words(removed, added)
    assert marks_old == {}  # only insertions; the re-indented line is not marked for its indentation
    assert [added[0][start:end] for start, end in marks_new[0]] == [", non_blocking=True"] and list(marks_new) == [0]
    assert changed_words(["print(a)"], ["completely different text"]) == ({}, {})  # unlike lines: no pair
    spans = css_spans([("", "x"), ("op", "=="), ("num", "10")], [(2, 4)])
    assert spans == [("", "x"), ("t-op", "="), ("t-op chg", "="), ("t-num chg", "1"), ("t-num", "0")]
    write(tmp_path / "t.py", COPIES)
    page = page_of(tmp_path, "t.py", "--select", "PM101")
    assert page.count('<span class="t-op chg">,</span><span class="chg"> non_blocking</span>') == 2


def test_backticks_in_messages_become_code_and_the_rest_is_escaped():
    assert inline_code("`a<b>` & `c`") == "<code>a&lt;b&gt;</code> &amp; <code>c</code>"


def test_hunks_are_those_of_the_unified_diff():
    result = process_source(RUNNING_SUM.read_bytes(), "t.py", Settings(level=Level.NUMERIC))
    old, new = result.source.decode(), result.new_source.decode()
    hunks = diff_hunks(old.splitlines(), new.splitlines(), highlight_lines(old), highlight_lines(new))
    expected = [
        line for line in unified_diff("t.py", result.source, result.new_source).splitlines() if line.startswith("@@")
    ]
    assert [hunk.header for hunk in hunks] == expected and expected
    old = [f"line{i}" for i in range(20)]
    for new in (old[:2] + ["changed"] + old[3:17] + old[18:], ["first"] + old, old[:19]):
        hunks = diff_hunks(old, new, [[]] * len(old), [[]] * len(new))
        expected = [line.rstrip("\n") for line in difflib.unified_diff(old, new, lineterm="") if line.startswith("@@")]
        assert [hunk.header for hunk in hunks] == expected


def test_summary_counts_findings_by_rule_and_level_with_the_rules_gains(tmp_path):
    page = page_of(tmp_path, REPORT_ONLY)
    results = process_source(REPORT_ONLY.read_bytes(), "", Settings())
    assert {(f.applied, f.fixable) for f in results.findings} == {(True, True), (False, True), (False, False)}
    table = re.search(r'<table class="grid" id="findings-by-rule">(.*?)</table>', page, re.S).group(1)
    rules = {rule.CODE: rule for rule in ALL_RULES}
    for code in {f.code for f in results.findings}:
        row = re.search(rf'<tr data-code="{code}">(.*?)</tr>', table, re.S).group(1)
        numbers = [int(n) for n in re.findall(r'<td class="num[^"]*">(\d+)</td>', row)]
        found = [f for f in results.findings if f.code == code]
        assert numbers == [
            sum(f.applied for f in found),
            sum(f.fixable and not f.applied for f in found),
            sum(not f.fixable for f in found),
        ]
        assert f"lvl-{rules[code].LEVEL.label}" in row
        assert re.sub(r"\s+", " ", rules[code].GAIN.replace("'", "&#39;")) in row
        assert f'id="rule-{code}"' in page and f'href="{page_path(rules[code])}"' in page
    stat_applied = re.search(r'id="stat-applied"><div class="value">(\d+)<', page).group(1)
    assert int(stat_applied) == sum(f.applied for f in results.findings)


def test_the_page_loads_nothing_from_elsewhere(tmp_path):
    page = page_of(tmp_path, REPORT_ONLY)
    assert not re.search(r"""(src=|@import|url\(|<link)""", page)
    reader = read_page(page)
    links = re.findall(r'href="([^"]+)"', page)
    internal = [link[1:] for link in links if link.startswith("#")]
    assert internal and all(anchor in reader.ids for anchor in internal)
    docs = RULE_PAGE_URL.format(ref=release_ref(), page="")
    assert all(link.startswith("#") or link.startswith(docs) for link in links)  # links to the docs, never loaded
    assert not [url for url in re.findall(r"https?://[^\s\"'<]+", page) if not url.startswith(docs)]


def test_verify_results_are_shown(tmp_path):
    verify = write(tmp_path / "verify.json", json.dumps(VERIFY))
    write(tmp_path / "t.py", COPIES)
    page = page_of(tmp_path, "t.py", "--select", "PM101", "--verify-json", verify)
    block = re.search(r'<div class="card verify" id="verify">(.*?)</dl>', page, re.S).group(1)
    text = " ".join(re.sub(r"<[^>]+>", " ", block).split())
    assert "agree losses agree within tolerance; 1.75x speed-up" in text
    assert "steps/s 10.00 17.50" in text and "samples/s 320.0 560.0" in text
    assert "peak memory (cuda) 3.0 GiB 2.0 GiB" in text and "final loss 2 2.0001" in text
    assert "device cuda" in text and "tolerance rtol=0.01" in text and "max rel loss deviation 5e-05" in text
    assert "train.py:14 PM301 autocast" in page
    curves = dict(re.findall(r'<polyline class="(\w+)" points="([^"]+)"', page))
    original = [tuple(map(float, point.split(","))) for point in curves["original"].split()]
    rewritten = [tuple(map(float, point.split(","))) for point in curves["rewritten"].split()]
    assert len(original) == len(rewritten) == 3
    # 480x120 with a 4px margin; losses 2.5 .. 2.0 span the height; 2.0001 is within a pixel of 2.0
    assert original == [(4.0, 4.0), (240.0, 60.0), (476.0, 116.0)] and rewritten[:2] == original[:2]
    assert abs(rewritten[2][1] - 116.0) < 0.1


def test_verify_document_with_only_the_required_keys_renders(tmp_path):
    verify = write(
        tmp_path / "verify.json", json.dumps({"original": {}, "rewritten": {"steps_per_s": 3}, "agree": False})
    )
    write(tmp_path / "t.py", COPIES)
    page = page_of(tmp_path, "t.py", "--select", "PM101", "--verify-json", verify)
    assert '<span class="pill bad">disagree</span>' in page and "losses DO NOT agree" in page
    assert "<polyline" not in page  # no losses, no chart
    assert re.search(r"<td>steps/s</td><td class=\"num\">–</td><td class=\"num\">3.00</td>", page)


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not JSON"),
        ("[1, 2]", "expected an object"),
        ('{"original": {}, "speedup": 2}', "missing 'rewritten', 'agree'"),
        ('{"original": 1, "rewritten": {}, "agree": true}', "'original' should be an object"),
    ],
)
def test_a_bad_verify_document_is_an_error(tmp_path, content, message):
    verify = write(tmp_path / "verify.json", content)
    result = report("t.py", "-o", tmp_path / "review.html", "--verify-json", verify)
    assert result.exit_code == 2 and message in result.stderr
    assert not (tmp_path / "review.html").exists()


def test_a_missing_verify_file_is_an_error(tmp_path):
    result = report("t.py", "-o", tmp_path / "review.html", "--verify-json", tmp_path / "none.json")
    assert result.exit_code == 2 and "cannot read" in result.stderr


# -- writing, exit codes ----------------------------------------------------------------


def test_only_the_output_is_written_atomically_and_sources_are_untouched(tmp_path):
    script = write(tmp_path / "src" / "t.py", COPIES)
    before = (script.read_bytes(), script.stat().st_mtime_ns)
    out = tmp_path / "out"
    out.mkdir()
    result = report("src", "-o", out / "review.html")
    assert result.exit_code == 0  # pending fixes are not a failure: `check` is the gate
    assert result.stdout == "" and "Wrote" in result.stderr and "2 fixes in 1 of 1 files" in result.stderr
    assert (script.read_bytes(), script.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["out", "review.html", "src", "t.py"]  # no temp file left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((out / "review.html").stat().st_mode) == 0o666 & ~umask


def test_an_existing_output_is_replaced_keeping_its_mode(tmp_path):
    write(tmp_path / "t.py", COPIES)
    old = write(tmp_path / "review.html", "old")
    old.chmod(0o640)
    assert report("t.py", "-o", old).exit_code == 0
    assert old.read_text().startswith("<!DOCTYPE html>") and stat.S_IMODE(old.stat().st_mode) == 0o640


def test_an_unwritable_output_is_an_error(tmp_path):
    write(tmp_path / "t.py", COPIES)
    result = report("t.py", "-o", tmp_path / "missing" / "review.html")
    assert result.exit_code == 2 and "cannot write" in result.stderr


def test_an_unparsable_file_is_in_the_page_on_stderr_and_exits_2(tmp_path):
    write(tmp_path / "bad.py", UNPARSABLE)
    write(tmp_path / "t.py", COPIES)
    result = report("bad.py", "t.py", "-o", "review.html")
    assert result.exit_code == 2
    assert "bad.py:4:" in result.stderr and "error: syntax error" in result.stderr
    bad, good = read_page((tmp_path / "review.html").read_text()).files
    assert bad.path == "bad.py" and "bad.py:4:" in bad.error and not bad.items
    assert good.path == "t.py" and len(good.notes()) == 2
    assert re.search(r'id="stat-errors"><div class="value">1<', (tmp_path / "review.html").read_text())


def test_the_output_cannot_be_a_file_under_review(tmp_path):
    script = write(tmp_path / "t.py", COPIES)
    result = report("t.py", "-o", "./t.py")
    assert result.exit_code == 2 and "is one of the files to review" in result.stderr
    assert script.read_text() == COPIES


def test_html_needs_an_output_file_or_dash(tmp_path):
    write(tmp_path / "t.py", COPIES)
    result = report("t.py")
    assert result.exit_code == 2 and "-o FILE.html" in result.stderr
    result = report("t.py", "-o", "-")
    assert result.exit_code == 0 and result.stdout.startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.py"]


def test_a_clean_file_is_listed_as_such(tmp_path):
    write(tmp_path / "clean.py", "import torch\nx = torch.ones(2)\n")
    page = page_of(tmp_path, "clean.py")
    assert read_page(page).files == [] and "1 file with nothing to report" in page and "No findings." in page


def test_report_reads_stdin(tmp_path):
    result = perfmod(
        "report", "-", "--stdin-filename", "train.py", "-o", "-", "--select", "PM101", input=COPIES.encode()
    )
    assert result.exit_code == 0
    (file,) = read_page(result.stdout).files
    assert file.path == "train.py" and [n.line for n in file.notes()] == [5, 9]


# -- markdown ---------------------------------------------------------------------------


def test_markdown_summary_for_a_pull_request(tmp_path):
    write(tmp_path / "t.py", COPIES)
    write(tmp_path / "clean.py", "x = 1\n")
    verify = write(tmp_path / "verify.json", json.dumps(VERIFY))
    result = report("t.py", "clean.py", "--select", "PM101", "--format", "markdown", "--verify-json", verify)
    assert result.exit_code == 0
    text = result.stdout
    assert text.startswith("### perfmod: 2 fixes at level `safe` in 1 of 2 files\n")
    assert "\n\n**Verify:** PASS: losses agree within tolerance; 1.75x speed-up. steps/s 10.00 → 17.50;" in text
    assert (
        "peak memory (cuda) 3.0 GiB → 2.0 GiB; final loss 2 → 2.0001.\n\n| Rule |" in text
    )  # a table needs the blank line
    assert "| `PM101` blocking-host-to-device-copy | safe | 2 | 0 | 0 | " in text
    assert "| `t.py` | 2 | 0 | changed |" in text and "clean.py" not in text
    details = re.search(r"<details><summary><code>t.py</code>: 2 fixed, 0 left</summary>\n(.*?)</details>", text, re.S)
    body = details.group(1)
    assert "- line 5: `PM101` (safe; fixed) host-to-device copy blocks the CPU" in body
    diff = unified_diff(
        "t.py", COPIES.encode(), COPIES.replace(".to(device)", ".to(device, non_blocking=True)").encode()
    )
    assert f"```diff\n{diff}```\n" in body


def test_markdown_shows_where_the_profiled_step_goes(tmp_path):
    write(tmp_path / "copies.py", COPIES)
    profile = write(tmp_path / "profile.json", json.dumps(PROFILE))
    result = report("copies.py", "--format", "markdown", "--profile-json", profile)
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert (
        "**Profile:** copies.py: 4 steps profiled on cpu (x86_64, 1 torch thread); 40.0 ms per step, "
        "24 steps/s with the profiler on. Step by category: python 2.0 ms (5%), ops 10.0 ms (25%), "
        "data 26.0 ms (65%), untraced 2.0 ms (5%).\n\n| # |" in text
    )
    rows = [line for line in text.splitlines() if re.match(r"\| \d* \| ", line)]
    assert [row.split(" | ")[1] for row in rows] == ["`PM201` [*]", "`PM404` [*]", "`PM101` [*]", "no finding"]
    assert rows[0].endswith("| unsafe | 65% (26.0 ms) | saves up to 26.0 ms: up to the data wait measured |")
    assert rows[-1].endswith("| 32% (13.0 ms) | compute in the model |")
    assert text.index("**Profile:**") < text.index("| Rule |")


def test_markdown_to_a_file_and_its_escaping(tmp_path):
    source = COPIES + 'note = "``` | <b>"\n'
    write(tmp_path / "t.py", source)
    result = report("t.py", "--select", "PM101", "--format", "markdown", "-o", "comment.md")
    assert result.exit_code == 0 and result.stdout == ""
    text = (tmp_path / "comment.md").read_text()
    assert "````diff\n" in text  # a fence longer than the source's own ```
    assert table_cell("a|b <i> &\nc") == "a\\|b &lt;i&gt; &amp; c"
    assert fence("x `` y") == "```" and fence("````") == "`````"


def test_markdown_lists_errors_and_higher_level_fixes(tmp_path):
    write(tmp_path / "bad.py", UNPARSABLE)
    result = report("bad.py", REPORT_ONLY, "--format", "markdown")
    assert result.exit_code == 2
    assert "**Errors** (1):\n- `bad.py:4:" in result.stdout
    assert re.search(r"\n\d+ more fix(es)? with `--level numeric`\.\n", result.stdout)
    assert "(numeric; fix with --level numeric)" in result.stdout and "(safe; report only)" in result.stdout


def test_markdown_leaves_out_diffs_past_the_comment_budget(tmp_path):
    write(tmp_path / "a.py", COPIES)
    write(tmp_path / "b.py", COPIES)
    results = [process_source(COPIES.encode(), name, Settings(select=("PM101",))) for name in ("a.py", "b.py")]
    one_diff = len(unified_diff("a.py", results[0].source, results[0].new_source))
    text = render_markdown(results, Level.SAFE, ALL_RULES, diff_budget=one_diff + 10)
    assert text.count("```diff") == 1 and "--- a/a.py" in text and "--- a/b.py" not in text
    assert text.count("_Diff left out") == 1 and "| `b.py` | 2 | 0 | changed |" in text


def test_the_page_ties_changes_to_findings_by_their_fix_lines_without_running_rules_again(monkeypatch):
    settings = Settings(select=("PM101", "PM301", "PM404"), level=Level.NUMERIC)
    result = process_source(WIDE_RUNNING_SUM.encode(), "t.py", settings)
    monkeypatch.setattr("codemod.engine._run", lambda *args, **kwargs: pytest.fail("the page ran the rules again"))
    (file,) = read_page(render_html([result], Level.NUMERIC, ALL_RULES)).files
    assert any(n.continued and n.code == "PM301" for n in file.notes())  # its import and policy line
    assert sorted((n.code, n.line) for n in file.notes() if not n.continued) == [
        ("PM101", 15),
        ("PM301", 16),
        ("PM404", 20),
        ("PM404", 21),
    ]


def test_renderers_take_engine_results_directly():
    result = process_source(COPIES.encode(), "t.py", Settings(select=("PM101",)))
    page = render_html([result], Level.SAFE, ALL_RULES)
    assert [(n.code, n.line) for n in read_page(page).files[0].notes()] == [("PM101", 5), ("PM101", 9)]
    assert "| `PM101` blocking-host-to-device-copy | safe | 2 |" in render_markdown([result], Level.SAFE, ALL_RULES)


# -- packaging --------------------------------------------------------------------------


def test_the_templates_ship_in_the_wheel():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["codemod"]
    templates = sorted((REPO / "codemod" / "report" / "templates").iterdir())
    assert templates
    for template in templates:
        relative = template.relative_to(REPO / "codemod").as_posix()
        assert any(Path(relative).match(pattern) for pattern in patterns), (relative, patterns)

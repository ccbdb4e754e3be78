"""The lines of a later pass's findings, moved back to the original file's: a line in a
long changed run goes to the original line it was rewritten from, and only the lines
the findings name are compared with their run (each comparison reads the whole run)."""

from __future__ import annotations

import difflib

from codemod import engine
from codemod.config import Settings
from codemod.result import Finding, Level

ORIGINAL = [f"x{k} = batch[{k}].to(device)" for k in range(150)]
# Every line rewritten, a line inserted at the top: one changed run of 151 lines.
REWRITTEN = ["import runtime"] + [line.replace(".to(device)", ".to(device, non_blocking=True)") for line in ORIGINAL]


def _finding(line: int) -> Finding:
    return Finding("train.py", line, 1, "PM101", "n", "m", Level.SAFE, True, end_line=line, fix_lines=((line, line),))


def test_a_line_of_a_long_changed_run_maps_to_the_line_it_was_rewritten_from():
    (moved,) = engine._map_lines([_finding(101)], REWRITTEN, ORIGINAL)  # `x99 = ...` in the rewrite
    assert ORIGINAL[moved.line - 1] == "x99 = batch[99].to(device)"
    assert (moved.end_line, moved.fix_lines) == (moved.line, ((moved.line, moved.line),))


def test_only_the_lines_the_findings_name_are_compared_with_their_run(monkeypatch):
    compared = []
    likeliest = engine._likeliest

    def counting(line, run):
        compared.append(line)
        return likeliest(line, run)

    monkeypatch.setattr(engine, "_likeliest", counting)
    engine._map_lines([_finding(11), _finding(101)], REWRITTEN, ORIGINAL)
    assert sorted(set(compared)) == sorted({REWRITTEN[10], REWRITTEN[100]})


def _likeliest_by_ratio(line: str, run: list[str]) -> int | None:
    """The definition: the first line of the run with the highest ratio above SIMILAR."""
    if len(run) > engine.SIMILAR_RUN:
        return None
    best, chosen = engine.SIMILAR, None
    for k, candidate in enumerate(run):
        ratio = difflib.SequenceMatcher(None, candidate.strip(), line.strip(), autojunk=False).ratio()
        if ratio > best:
            best, chosen = ratio, k
    return chosen


def test_the_likeliest_line_is_the_first_with_the_highest_ratio():
    run = ["", "    x = f(a)", "y = g(b)  ", "x = f(a)", "    ", "loss.backward()", "z = h(c, d)"]
    lines = [*run, "x = f(a, non_blocking=True)", "y = g(c)", "optimizer.step()", "  z = h(c, d)  ", "   "]
    for line in lines:
        for size in range(len(run) + 1):
            assert engine._likeliest(line, run[:size]) == _likeliest_by_ratio(line, run[:size]), (line, size)


def test_the_lines_a_message_names_move_with_the_finding():
    original = ["import torch", "model = Net()", "for x in data:", "    loss = model(x)"]
    rewritten = ["import torch", "import runtime", "", "model = Net()", "for x in data:", "    loss = model(x)"]
    finding = Finding(
        "t.py", 6, 1, "PM301", "n", "`model` (line 4) runs on lines 5-6 and 4, 5 and 6", Level.SAFE, False
    )
    (moved,) = engine._map_lines([finding], rewritten, original)
    assert moved.line == 4
    assert moved.message == "`model` (line 2) runs on lines 3-4 and 2, 3 and 4"


def test_a_message_of_a_real_later_pass_names_lines_of_the_file_as_written():
    """PM102 looks at the DataLoader that PM202's rewrite builds, in a file with lines added
    above the loop: the copy its reason names is on the line of the file the user has."""
    source = (
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
        "def main():\n"
        '    device = "cuda" if torch.cuda.is_available() else "cpu"\n'
        "    model = nn.Linear(32, 32).to(device)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)\n"
        "    X = torch.randn(64, 640, 32)\n    for epoch in range(2):\n        perm = torch.randperm(X.size(0))\n"
        "        for i in range(0, X.size(0), 16):\n            xb = X[perm[i:i + 16]].to(device)\n"
        "            loss = F.mse_loss(model(xb), xb)\n            opt.zero_grad()\n"
        "            loss.backward()\n            opt.step()\n"
    )
    copy = source.splitlines().index("            xb = X[perm[i:i + 16]].to(device)") + 1
    result = engine.process_source(source.encode(), "t.py", Settings(level=Level.UNSAFE, select=("PM202", "PM102")))
    (pm102,) = [f for f in result.findings if f.code == "PM102"]
    assert f"(line {copy})" in pm102.message, pm102.message

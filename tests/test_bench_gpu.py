"""benchmarks/bench_gpu.py, the one command for the GPU machine (which has torch
but not libcst): every part gets a row, whatever happens to it, and the
document also goes to $OUT."""

import os
import subprocess
import sys
from pathlib import Path

from benchmarks import bench_gpu
from benchmarks.bench_gpu import PARTS, Part
from benchmarks.bench_scripts import OPTIMIZED, ORIGINAL

REPO = Path(__file__).resolve().parents[1]
STATUSES = ("ok", "error: ", "timed out", "skipped: ")


def part_rows(text: str) -> dict[str, str]:
    rows = {}
    for line in text.splitlines():
        cells = line.split(" | ")
        if line.startswith("| ") and len(cells) == 6 and cells[0][2:].isdigit():
            rows[cells[1]] = cells[3]
    return rows


def test_every_part_starts_where_libcst_cannot_be_imported(tmp_path):
    """The CPU dry run: the driver and every part it starts, at the quick sizes, with an
    importable `libcst` that refuses (as on the GPU machine). Each part runs to the end;
    all of them together take about a minute on a 2-core CPU."""
    blocker = tmp_path / "blocker" / "libcst"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('libcst is not installed on the GPU machine')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker.parent), str(REPO)]), OUT=str(tmp_path / "out"))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_gpu", "--device", "cpu", "--quick", "--budget", "400"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = done.stdout
    assert text.startswith("## Benchmarks on the CPU (quick sizes)"), done.stderr
    assert "Command: `python -m benchmarks.bench_gpu --device cpu --quick --budget 400`" in text
    rows = part_rows(text)
    assert list(rows) == [part.name for part in PARTS]
    assert all(status == "ok" for status in rows.values()), (rows, done.stderr[-3000:])
    assert "libcst" not in text + done.stderr
    assert "H100" not in text and "| H200 estimate (s) |" in text
    assert "(linear_attention, scan)" in text and "(attention)" in text  # the two kernel parts
    assert done.returncode == 0
    assert (tmp_path / "out" / "bench_gpu.md").read_text() == text
    # the acceptance part's own table (`benchmarks.acceptance` at the quick sizes: naive_rwkv at unsafe)
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| naive_rwkv |")]
    assert [row[1] for row in rows] == [ORIGINAL, "rewritten (unsafe)", OPTIMIZED]
    assert all(row[2] != "error" for row in rows), rows
    assert rows[1][-1].startswith("agree (") and rows[2][-1].startswith("agree (")
    assert "- `naive_rwkv` at `unsafe`: " in text and "(goal >= 0.9x: " in text


def test_a_failing_or_slow_part_gets_its_row_and_the_next_ones_run(tmp_path, monkeypatch, capsys):
    fake = [
        Part("broken", "a benchmark that fails", "benchmarks.no_such_benchmark", {"quick": [[]]}, 1, 30),
        Part(
            "slow",
            "a benchmark that runs past its time",
            "timeit",
            {"quick": [["-n", "1", "import time; time.sleep(60)"]]},
            1,
            6,
        ),
        Part("fine", "a benchmark that works", "json.tool", {"quick": [["--help"]]}, 1, 30),
    ]
    monkeypatch.setattr(bench_gpu, "PARTS", fake)
    monkeypatch.setattr(bench_gpu, "PARTS_BY_NAME", {part.name: part for part in fake})
    assert bench_gpu.main(["--device", "cpu", "--quick", "--budget", "60", "--output", str(tmp_path / "doc.md")]) == 1
    text = capsys.readouterr().out
    rows = part_rows(text)
    assert rows["broken"].startswith("error: exit status 1: ") and "No module named" in rows["broken"]
    assert rows["slow"] == "timed out after 3 s"  # the quick sizes get half the cap
    assert rows["fine"] == "ok"
    assert "### 3. fine" in text and "usage:" in text
    assert (tmp_path / "doc.md").read_text() == text


PRIORITY = ["acceptance", "recurrence", "sdpa", "data", "verify", "profile"]  # issue 24, section 5; issue 25


def test_the_priority_parts_come_first_and_fit_eight_minutes():
    """The lent H200: 15 minutes in all, machine start included, one command at most 10."""
    assert bench_gpu.DEFAULT_BUDGET <= 480
    assert [part.name for part in PARTS[: len(PRIORITY)]] == PRIORITY
    assert sum(part.estimate for part in PARTS[: len(PRIORITY)]) <= bench_gpu.DEFAULT_BUDGET
    assert all(part.estimate <= part.cap for part in PARTS)
    assert all(set(part.runs) == {"cuda", "cpu", "quick"} for part in PARTS)
    assert len({part.name for part in PARTS}) == len(PARTS)


def test_the_recurrence_part_times_the_three_lengths_and_says_fla_is_missing():
    recurrence, sdpa = bench_gpu.PARTS_BY_NAME["recurrence"], bench_gpu.PARTS_BY_NAME["sdpa"]
    assert "T = 512/2048/8192" in recurrence.shows
    assert "not installed" in recurrence.shows and "no network" in recurrence.shows
    (args,) = recurrence.runs["cuda"]
    assert args[args.index("--ops") + 1 :][:2] == ["linear_attention", "scan"] and "--quick" not in args
    (args,) = sdpa.runs["cuda"]
    assert args[args.index("--ops") + 1] == "attention" and "--quick" not in args


def fake_gpu(monkeypatch, name):
    facts = {"torch": "2.x", "python": "3.x", "cuda": "12.x", "device": name}
    monkeypatch.setattr(bench_gpu, "probe", lambda env, device: facts)
    fake = [
        Part("first", "fits", "json.tool", {"cuda": [["--help"]]}, 1, 30),
        Part("big", "does not fit", "benchmarks.no_such_benchmark", {"cuda": [[]]}, 1000, 1000),
        Part("last", "fits after the big one", "json.tool", {"cuda": [["--help"]]}, 1, 30),
    ]
    monkeypatch.setattr(bench_gpu, "PARTS", fake)
    monkeypatch.setattr(bench_gpu, "PARTS_BY_NAME", {part.name: part for part in fake})


def test_on_cuda_a_part_whose_estimate_does_not_fit_is_skipped_and_the_next_runs(monkeypatch, capsys):
    fake_gpu(monkeypatch, "NVIDIA H200")
    assert bench_gpu.main(["--device", "cuda", "--budget", "60"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("## GPU benchmarks: NVIDIA H200 (CUDA 12.x)")
    rows = part_rows(text)
    assert rows["first"] == "ok" and rows["last"] == "ok"
    assert rows["big"].startswith("skipped: needs about 1000 s, ") and rows["big"].endswith(" s of the budget left")
    assert "| estimate for this NVIDIA H200 (s) |" in text and "not for this" not in text


def test_the_estimates_are_not_claimed_for_another_gpu(monkeypatch, capsys):
    fake_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB")
    bench_gpu.main(["--device", "cuda", "--budget", "60"])
    text = capsys.readouterr().out
    assert text.startswith("## GPU benchmarks: NVIDIA A100-SXM4-80GB (CUDA 12.x)")
    assert "| H200 estimate (s) |" in text
    assert "The estimates are worked out for an H200, not for this NVIDIA A100-SXM4-80GB." in text

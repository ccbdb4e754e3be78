"""benchmarks/bench_gpu.py, the one command for the GPU machine (which has torch
but not libcst): every part gets a row, whatever happens to it, and the
document also goes to $OUT."""

import os
import subprocess
import sys
from pathlib import Path

from benchmarks import bench_gpu
from benchmarks.bench_gpu import PARTS, Part

REPO = Path(__file__).resolve().parents[1]
STATUSES = ("ok", "error: ", "timed out", "skipped: ")


def part_rows(text: str) -> dict[str, str]:
    rows = {}
    for line in text.splitlines():
        cells = line.split(" | ")
        if line.startswith("| ") and len(cells) == 6 and cells[0][2:].isdigit():
            rows[cells[1]] = cells[3]
    return rows


def test_every_part_runs_where_libcst_cannot_be_imported(tmp_path):
    """The driver and the parts it starts, with an importable `libcst` that refuses:
    a tiny budget runs the first parts (or times them out) and skips the rest."""
    blocker = tmp_path / "blocker" / "libcst"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('libcst is not installed on the GPU machine')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker.parent), str(REPO)]), OUT=str(tmp_path / "out"))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_gpu", "--device", "cpu", "--quick", "--budget", "8"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = done.stdout
    assert text.startswith("## Benchmarks on the CPU (quick sizes)"), done.stderr
    assert "Command: `python -m benchmarks.bench_gpu --device cpu --quick --budget 8`" in text
    rows = part_rows(text)
    assert list(rows) == [part.name for part in PARTS]
    assert all(status.startswith(STATUSES) for status in rows.values()), rows
    assert "libcst" not in text + done.stderr
    assert rows["verify"].startswith("skipped: ")  # the budget ran out before the last part
    assert (tmp_path / "out" / "bench_gpu.md").read_text() == text


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


def test_the_gpu_sizes_fit_the_budget():
    """The H100 estimates add up to less than the default budget, which is under 25 minutes."""
    assert sum(part.estimate for part in PARTS) < bench_gpu.DEFAULT_BUDGET < 25 * 60
    assert all(part.estimate <= part.cap for part in PARTS)
    assert all(set(part.runs) == {"cuda", "cpu", "quick"} for part in PARTS)

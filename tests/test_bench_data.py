"""benchmarks/bench_data.py must keep working (it is what a GPU session runs), and its
rewritten loop must be what perfmod writes today."""

import subprocess
import sys
from pathlib import Path

from benchmarks.bench_data import ORIGINAL, REWRITTEN
from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level

ROOT = Path(__file__).resolve().parent.parent


def test_rewritten_loop_is_perfmods_rewrite_with_the_three_loader_rules():
    result = process_source(
        ORIGINAL.encode(), "bench_data.py", Settings(select=("PM102", "PM201", "PM103"), level=Level.UNSAFE)
    )
    assert result.error is None
    assert sorted(f.code for f in result.findings if f.applied) == ["PM102", "PM103", "PM201"]
    assert result.new_source.decode() == REWRITTEN


def test_cpu_smoke_run_prints_the_table_with_identical_losses():
    command = [
        sys.executable,
        "-m",
        "benchmarks.bench_data",
        "--device",
        "cpu",
        "--steps",
        "6",
        "--batch-size",
        "4",
        "--seq-len",
        "16",
        "--work",
        "1",
        "--repeats",
        "1",
    ]
    done = subprocess.run(
        command,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "", "PYTHONPATH": str(ROOT), "PERFMOD_NUM_WORKERS": "2", "OMP_NUM_THREADS": "1"},
    )
    table = done.stdout
    assert "| original |" in table and "| rewritten |" in table and "Speed-up:" in table
    assert "losses bit-identical: yes" in table and "rewritten loader workers: 2" in table
    assert "torch " in table and "Device: CPU" in table

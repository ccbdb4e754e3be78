"""benchmarks/bench_rewrite.py must keep working: it is what the GPU session runs."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_prepare_and_run_on_cpu(tmp_path):
    prepared = tmp_path / "prepared"
    bench = [sys.executable, "-m", "benchmarks.bench_rewrite"]
    subprocess.run(
        [*bench, "prepare", "fixtures/scripts/seed_latentwire.py", "--level", "safe", "--out", str(prepared)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    assert (prepared / "original.py").read_bytes() == (ROOT / "fixtures/scripts/seed_latentwire.py").read_bytes()
    assert b"non_blocking=True" in (prepared / "rewritten.py").read_bytes()
    done = subprocess.run(
        [*bench, "run", str(prepared), "--repeats", "1", "--", "--steps", "2", "--out", "ckpt"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    table = done.stdout
    assert "| original |" in table and "| rewritten |" in table and "Speed-up:" in table
    assert "rules applied: PM101" in table and "torch " in table

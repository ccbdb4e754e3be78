"""benchmarks/bench_tokenize runs (CPU, tiny sizes) and prints its table; the GPU
numbers are owed (see the module's docstring for the commands)."""

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_quick_cpu_run_prints_every_row():
    command = [sys.executable, "-m", "benchmarks.bench_tokenize", "--device", "cpu", "--quick"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240, check=True)
    rows = [line.strip("| ").split(" | ") for line in result.stdout.splitlines() if line.startswith("| ")][1:]
    assert [(part, loop.split(" (")[0]) for part, loop, *_ in rows] == [
        ("tokenization", "per-step tokenization"),
        ("tokenization", "scaffold hoisted"),
        ("tokenization", "pretokenized, DataLoader 2 workers"),
        ("batching", "slices X[i:i + bs]"),
        ("batching", "DataLoader(TensorDataset)"),
        ("batching", "DataLoader, 2 workers"),
    ]
    for _, _, rate, ms, share, peak, _ in rows:
        assert float(rate) > 0 and float(ms) > 0 and 0 <= float(share.rstrip("%")) <= 100 and peak == "n/a"
    assert "command: python -m benchmarks.bench_tokenize --device cpu --quick" in result.stdout
    assert "torch 2." in result.stdout

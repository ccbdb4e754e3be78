"""benchmarks/bench_batching.py must keep working (it is what the GPU session
runs) and must time what perfmod actually writes."""

import re

import pytest
import torch

from benchmarks import bench_batching
from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level


@pytest.mark.parametrize("workload", list(bench_batching.WORKLOADS))
def test_rewritten_workload_is_perfmods_rewrite_of_the_original(workload):
    rule, original, rewritten = bench_batching.WORKLOADS[workload]
    result = process_source(original.encode(), workload, Settings(select=(rule,), level=Level.UNSAFE))
    assert result.error is None, result.error
    assert [f.code for f in result.findings if f.applied] == [rule]
    assert result.new_source.decode() == rewritten


def test_quick_cpu_run_prints_the_table_and_both_versions_agree(capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bench_batching.main(["--device", "cpu", "--quick"])
    finally:
        torch.set_num_threads(threads)
    table = capsys.readouterr().out
    assert table.startswith(f"Device: CPU; torch {torch.__version__}; date ")
    assert "Command: `python -m benchmarks.bench_batching --device cpu --quick`" in table
    rows = re.findall(
        r"^\| ([\w -]+) \| (PM50\d) \| (original|rewritten) \| ([\d,]+) \| n/a \(CPU\) \| ([\d.]+) \|", table, re.M
    )
    assert [(w, r, v) for w, r, v, _, _ in rows] == [
        ("per-sample forward", "PM502", "original"),
        ("per-sample forward", "PM502", "rewritten"),
        ("per-position loss", "PM503", "original"),
        ("per-position loss", "PM503", "rewritten"),
    ]
    for before, after in (rows[0:2], rows[2:4]):
        # Same data, same seed: the rewrite's last loss is the original's to float32 rounding.
        assert float(after[4]) == pytest.approx(float(before[4]), rel=1e-5)
        assert float(before[3].replace(",", "")) > 0 and float(after[3].replace(",", "")) > 0

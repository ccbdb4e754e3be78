"""The optimizer-step benchmark runs on the CPU and prints one row per optimizer."""

from benchmarks import optimizer_step


def test_quick_run_prints_a_row_per_optimizer(capsys):
    assert optimizer_step.main(["--quick"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 10 x (32, 32)")]
    assert [row.split("|")[2].strip() for row in rows] == list(optimizer_step.OPTIMIZERS)
    for row in rows:
        default, foreach, fused, ratio, difference = (cell.strip() for cell in row.split("|")[3:8])
        assert float(default) > 0 and float(foreach) > 0 and float(fused) > 0 and ratio.endswith("x")
        assert float(difference) < 1e-5  # the fused kernel rounds differently, no more

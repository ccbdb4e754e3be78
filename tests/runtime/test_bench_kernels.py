import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_quick_cpu_run_prints_a_table_of_accurate_kernels():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_kernels", "--device", "cpu", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = [line.strip("| ").split(" | ") for line in result.stdout.splitlines() if line.startswith("| ")][1:]
    cases = {(op, int(T), impl) for op, T, impl, *_ in rows}
    assert cases == {
        (op, T, impl)
        for T in (64, 256)
        for op, impl in [
            ("linear attention (GLA)", "Python loop (reference)"),
            ("linear attention (GLA)", "runtime.kernels.linear_attention C=8"),
            ("linear scan", "Python loop (reference)"),
            ("linear scan", "Python loop into a preallocated tensor, fixed decays"),
            ("linear scan", "runtime.kernels.linear_scan"),
            ("causal attention", "manual softmax(QK^T/sqrt(d))V"),
            ("causal attention", "F.scaled_dot_product_attention"),
        ]
    }
    assert all(float(ms) > 0 and float(err) < 1e-5 for *_, ms, _, _, err in rows)  # fp32 against fp32 loops
    assert {vs_fla for *_, vs_fla, _ in rows} == {"-"}  # no fla on CPU
    goal = [line for line in result.stdout.splitlines() if line.startswith("goal at T=256:")]
    assert len(goal) == 1 and "faster than the loop (goal >= 20x" in goal[0] and "fla not measured" in goal[0]
    assert "python -m benchmarks.bench_kernels --device cpu --quick" in result.stdout
    assert "fla row skipped" in result.stdout


def test_quick_cpu_rwkv_run_prints_both_scripts_with_close_losses():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_rwkv", "--device", "cpu", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = [line.strip("| ").split(" | ") for line in result.stdout.splitlines() if line.startswith("| ")][1:]
    assert [script for script, *_ in rows] == [
        "original (Python time loop)",
        "rewritten (runtime.kernels.linear_attention)",
    ]
    assert all(float(rate.replace(",", "")) > 0 and float(diff) < 1e-5 for _, rate, _, _, diff in rows)
    assert "python -m benchmarks.bench_rwkv --device cpu --quick" in result.stdout
    assert "torch " in result.stdout and "CPU" in result.stdout

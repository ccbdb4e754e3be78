"""The GPU machine has torch but not libcst: every GPU benchmark must load there.
(Those that need a rewrite take it from committed files, or from a folder
prepared here, as bench_rewrite and verify_seed do.)"""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU_BENCHMARKS = [
    "acceptance",
    "bench_batch_size",
    "bench_batching",
    "bench_data",
    "bench_gpu",
    "bench_kernels",
    "bench_model",
    "bench_rewrite",
    "bench_rwkv",
    "bench_scripts",
    "bench_tokenize",
    "optimizer_step",
    "profile_seed",
    "verify_seed",
]


def test_the_list_names_every_gpu_benchmark():
    cpu_only = {
        "__init__",
        "engine_speed",
        "precision",
        "profile_overhead",
        "recall",
        "robustness",
        "rule_time",
        "snapshot",
        "startup",
        "step_rules_speed",
        "tool_speed",
    }  # they measure perfmod itself, here
    assert sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if p.stem not in cpu_only) == GPU_BENCHMARKS


@pytest.mark.parametrize("name", GPU_BENCHMARKS)
def test_benchmark_loads_without_libcst(name):
    code = f"import sys; sys.modules['libcst'] = None; import benchmarks.{name}"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

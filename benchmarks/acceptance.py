"""The acceptance scripts, side by side: as written, as `perfmod apply` rewrites
them at each level, and the expert's hand-optimized version. One markdown table:
tokens/s, ratios to the original and to the expert, peak memory, final losses.

    python -m benchmarks.acceptance                          # CPU, the README's small settings, every level
    python -m benchmarks.acceptance --device cuda            # on a GPU (part of `make bench-gpu`)
    python -m benchmarks.acceptance --device cpu --quick     # smoke run: tiny sizes, 3 steps
    python -m benchmarks.acceptance --scripts naive_lm --levels unsafe --threads 1 --repeats 5 --steps 20
                                                             # 18 timed steps instead of 4: a ratio to trust

The scripts are fixtures/acceptance/ (copies of ../shared/acceptance/, written
independently of perfmod; its README.md says what each must give): `naive_lm`
against `expert_lm.py`, `naive_rwkv` against `expert_rwkv.py`. The other three
acceptance scripts have no expert version and no speed goal; tests/test_acceptance.py
checks what they must give.

This is benchmarks/bench_scripts.py with other defaults (its ACCEPTANCE scripts,
every level): the same launcher, alternating runs, table and goal (the unsafe
rewrite at >= 0.9x the expert's tokens/s), and the same options. The rewrites
it runs are committed in fixtures/bench/acceptance/, so that a GPU machine
without libcst runs it; `make bench-prepare` writes them again and
tests/test_bench_scripts.py keeps them equal to what perfmod writes now.
Tokens/s is the scripts' own: the `tok_per_s` of their FINAL line, over the
steps after the second.
"""

from __future__ import annotations

import sys

from benchmarks import bench_scripts


def main(argv: list[str] | None = None) -> int:
    return bench_scripts.main(
        argv,
        program="benchmarks.acceptance",
        description=__doc__.splitlines()[0],
        scripts=bench_scripts.ACCEPTANCE,
        levels=bench_scripts.LEVELS,
    )


if __name__ == "__main__":
    sys.exit(main())

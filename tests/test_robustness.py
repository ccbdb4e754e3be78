"""A fixed sample of the robustness benchmark: the engine, all rules at level
`unsafe`, over 150 files of the installed torch package of up to 10 kB each (to
stay well under a minute on two cores). `python -m benchmarks.robustness` runs
it over every file."""

from __future__ import annotations

import pytest

from benchmarks.robustness import check_files, select, torch_files

SAMPLE, SEED, MAX_BYTES = 150, 0, 10_000


@pytest.mark.slow
def test_engine_survives_a_sample_of_torch():
    paths = select(torch_files(), SAMPLE, SEED, MAX_BYTES)
    assert len(paths) == SAMPLE
    failures = [f"{o.path}: {o.kind}: {o.detail}" for o in check_files(paths, jobs=2) if o.failed]
    assert failures == [], "\n".join(failures)

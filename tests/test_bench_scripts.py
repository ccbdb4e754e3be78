"""benchmarks/bench_scripts.py and its scripts (fixtures/bench/): the committed
rewrites are what perfmod writes now, every version of every script trains on
the CPU (2 steps, losses agreeing with the original's), and the quick run
prints its table. The acceptance scripts' committed rewrites
(fixtures/bench/acceptance/) are checked with the others; the table
`python -m benchmarks.acceptance` prints at the quick sizes is checked in
tests/test_bench_gpu.py, whose CPU dry run makes it; tests/test_acceptance.py runs
them at the README's settings."""

import pytest

from benchmarks import bench_scripts
from benchmarks.bench_scripts import (
    ACCEPTANCE,
    LEVELS,
    OPTIMIZED,
    ORIGINAL,
    SCRIPTS,
    VERIFY_PREPARED,
    Row,
    optimized_path,
    original_path,
    rewritten_path,
    run_script,
    short_reason,
)
from codemod.verify_run import Tolerance, compare

REGENERATE = "regenerate with `python -m benchmarks.bench_scripts prepare` (make bench-prepare) and commit"


def test_committed_rewrites_are_what_perfmod_writes_now():
    expected = bench_scripts.rewrites()
    stale = [
        path.relative_to(bench_scripts.ROOT)
        for path, data in expected.items()
        if not path.is_file() or path.read_bytes() != data
    ]
    assert not stale, f"out of date: {stale}; {REGENERATE}"
    extra = {path for path in VERIFY_PREPARED.rglob("*") if path.is_file() and "__pycache__" not in path.parts}
    assert extra <= set(expected), f"left over: {sorted(extra - set(expected))}; {REGENERATE}"


def test_every_script_has_all_its_versions_and_the_unsafe_rewrite_changes_it():
    for script in SCRIPTS + ACCEPTANCE:
        paths = [
            original_path(script.name),
            optimized_path(script.name),
            *(rewritten_path(script.name, level) for level in LEVELS),
        ]
        assert all(path.is_file() for path in paths), script.name
        assert rewritten_path(script.name, "unsafe").read_bytes() != original_path(script.name).read_bytes()


VERSIONS = [
    (script, label, path)
    for script in SCRIPTS
    for label, path in bench_scripts.versions(script.name, list(LEVELS)).items()
]


@pytest.fixture(scope="module")
def original_losses():
    losses = {}

    def get(script):
        if script.name not in losses:
            run = run_script(original_path(script.name), script.sizes["quick"], "cpu", timeout=300, threads=1)
            assert run.error is None, run.error
            losses[script.name] = run.losses
        return losses[script.name]

    return get


@pytest.mark.parametrize(("script", "label", "path"), VERSIONS, ids=[f"{s.name}-{p.name}" for s, _, p in VERSIONS])
def test_version_trains_two_steps_on_the_cpu(script, label, path, original_losses):
    run = run_script(path, script.sizes["quick"], "cpu", timeout=300, threads=1)
    assert run.error is None, run.error
    assert len(run.losses) == 2 and all(loss is not None for loss in run.losses)
    assert run.tokens_per_s > 0 and run.peak["rss"] > 0 and run.peak["cuda"] is None
    if label != ORIGINAL:
        # every version trains the same model on the same data from the same seed
        agreement = compare(original_losses(script), run.losses, Tolerance.for_level("numeric"))
        assert agreement["agree"], (label, agreement)


def test_quick_run_prints_the_table(capsys):
    assert bench_scripts.main(["--device", "cpu", "--quick", "--threads", "1", "--scripts", "rwkv_lm"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Device: CPU (")
    assert "Command: `python -m benchmarks.bench_scripts --device cpu --quick" in text
    header = "| script | version | tokens/s | vs original | vs hand-optimized | peak RSS (MiB) | final loss |"
    assert header in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| rwkv_lm |")]
    assert [row[1] for row in rows] == [ORIGINAL, "rewritten (unsafe)", OPTIMIZED]
    assert rows[1][-1].startswith("agree (") and rows[2][-1].startswith("agree (")
    assert "- `rwkv_lm` at `unsafe`: " in text and "(goal >= 0.9x: " in text


def test_failed_and_unrun_versions_get_error_rows(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('no data found')\n")
    run = run_script(broken, [], "cpu", timeout=60)
    assert run.error == "exit status 1: no data found"
    script = SCRIPTS[0]
    runs = bench_scripts.measure([script], "quick", ["unsafe"], 1, "cpu", deadline=0, timeout=60, threads=None)
    assert {label: [r.error for r in rs] for label, rs in runs[script.name].items()} == {
        label: ["not run: the time budget was spent"] for label in (ORIGINAL, "rewritten (unsafe)", OPTIMIZED)
    }


def test_reasons_name_the_blocking_fix_the_level_or_the_rule_s_own_reason():
    def finding(message, level="safe", fixable=False):
        return {"code": "PM101", "line": 1, "level": level, "fixable": fixable, "message": message}

    blocked = "copy blocks (not fixed in this run: PM301's fix on line 9 removes or rewrites this code; run again)"
    assert short_reason(finding(blocked), "unsafe") == "blocked in the same run by PM301's fix"
    assert short_reason(finding("x", "unsafe", True), "numeric") == "fixed only at --level unsafe"
    assert (
        short_reason(finding("sync; not rewritten: logged every step; log it"), "unsafe")
        == "not rewritten: logged every step"
    )


def test_losses_print_in_decimal_or_hexadecimal():
    assert bench_scripts._number("2.5") == 2.5
    assert bench_scripts._number(float.hex(0.1)) == 0.1  # seed_latentwire prints float.hex, bit for bit
    assert bench_scripts._number("n/a") is None


def test_a_final_line_gives_the_tokens_per_second(tmp_path):
    """The acceptance scripts print `FINAL ... tok_per_s=X loss=L` and a loss every few steps."""
    script = tmp_path / "final.py"
    script.write_text(
        "print('step 0 loss 2.5')\nprint('step 10 loss 2.0')\n"
        "print('FINAL steps=12 tokens=96 seconds=0.5 tok_per_s=192.0 loss=2.0000')\n"
    )
    run = run_script(script, [], "cpu", timeout=60)
    assert run.error is None, run.error
    assert (run.tokens_per_s, run.steps, run.losses) == (192.0, [0, 10], [2.5, 2.0])


def test_losses_are_compared_at_the_steps_both_versions_print():
    original = Row(1.0, 1.0, [4.0, 3.0, 2.0, 1.0], None, [0, 1, 2, 3])
    every_other = Row(1.0, 1.0, [4.0, 1.0], None, [0, 3])
    assert bench_scripts.agreement(original, every_other, "numeric") == (
        "agree (rtol 0.01; max rel 0.0e+00; at steps 0, 3)"
    )
    off = Row(1.0, 1.0, [4.0, 1.5], None, [0, 3])
    assert bench_scripts.agreement(original, off, "numeric").startswith("differ (rtol 0.01; max rel 5.0e-01")
    assert bench_scripts.agreement(original, original, "safe") == "agree (bit for bit; max rel 0.0e+00)"


def test_steps_sets_the_scripts_own_steps_option():
    args = ["--steps", "6", "--batch_size", "8"]
    assert bench_scripts.with_steps(args, 20) == ["--steps", "20", "--batch_size", "8"]
    assert args == ["--steps", "6", "--batch_size", "8"]  # the sizes themselves are left as they are
    assert bench_scripts.with_steps(["--d", "16"], 5) == ["--d", "16", "--steps", "5"]


def test_the_ratio_to_the_hand_optimized_version_comes_with_its_run_by_run_spread():
    """Runs alternate, so the k-th runs of two versions ran under the same load."""
    rewrite = Row(90.0, 1.0, [1.0], None, [0], [80.0, 90.0, 100.0])
    expert = Row(100.0, 1.0, [1.0], None, [0], [100.0, 100.0, 80.0])
    rows = {"rewritten (unsafe)": rewrite, OPTIMIZED: expert}
    (line,) = bench_scripts.missing_lines({}, {"naive_lm": rows}, "unsafe")
    assert "0.90x the hand-optimized tokens/s (goal >= 0.9x: met); run by run 0.80x to 1.25x." in line

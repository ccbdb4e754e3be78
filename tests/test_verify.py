"""`perfmod verify`: both versions run for real (subprocesses, CPU), and the
comparison catches what it must: exact agreement for safe rewrites, agreement
within tolerance for numeric ones, a rule that changes the math, a crash.

Each verify starts two Python processes that import torch; the runs are few
and short (a handful of steps of tiny models) and shared between tests.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import libcst as cst
import pytest

from codemod import verify as verify_module
from codemod import verify_run
from codemod.analysis.names import kwarg
from codemod.config import Settings
from codemod.instrument import instrument
from codemod.rule import Level, Rule
from codemod.rules.memory_cleanup_in_step_loop import MemoryCleanupInStepLoop
from codemod.verify import local_modules, prepare, verify
from codemod.verify_run import (
    DEFAULT_RTOL,
    MANIFEST,
    UNSAFE_NOTE,
    Tolerance,
    VerifyError,
    compare,
    render_text,
)
from tests.cli_support import perfmod, write
from tests.test_json_docs import undocumented

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verify"
SAFE, NUMERIC = FIXTURES / "safe_mlp.py", FIXTURES / "numeric_lm.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PERFMOD_AMP": "bf16"}  # bf16: PM301's autocast runs on the CPU
STEPS, WARMUP = 4, 1


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


class DoubledLearningRate(Rule):
    """Test only: claims to be safe and doubles every `lr=`, a rewrite that changes the math."""

    CODE, NAME, LEVEL = "PM999", "doubled-learning-rate", Level.SAFE
    MESSAGE, GAIN = "doubles the learning rate", "none"

    def visit_Call(self, node: cst.Call) -> None:
        lr = kwarg(node, "lr")
        if lr is not None and not isinstance(lr.value, cst.BinaryOperation):  # once: `x * 2` is not doubled again
            doubled = cst.BinaryOperation(lr.value, cst.Multiply(), cst.Integer("2"))
            self.report(
                node,
                replacement=node.with_changes(
                    args=[a.with_changes(value=doubled) if a is lr else a for a in node.args]
                ),
            )


@pytest.fixture(scope="module")
def safe_run(tmp_path_factory):
    """The safe fixture's verify, with the folders it reads and writes watched."""
    before = snapshot(FIXTURES)
    temporary = tmp_path_factory.mktemp("tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(temporary))
        result = verify(SAFE, ["--steps", "40"], steps=STEPS, warmup=WARMUP, env=ENV)
    return result, before, temporary


@pytest.fixture(scope="module")
def numeric_run():
    # One round: this checks the losses (bf16 autocast is slower on a CPU; the speed tests are below).
    return verify(NUMERIC, ["--steps", "40"], steps=STEPS, warmup=WARMUP, level=Level.NUMERIC, env=ENV, rounds=1)


# -- agreement ---------------------------------------------------------------------------------


def test_safe_rewrite_agrees_exactly(safe_run):
    result = safe_run[0]
    assert result.error is None and result.exit_code == 0 and result.agree is True
    assert sorted({f["code"] for f in result.fixes}) == ["PM101", "PM403"]
    assert result.tolerance.exact and result.tolerance.level == "safe"
    before, after = result.original.trace["losses"], result.rewritten.trace["losses"]
    assert len(before) == STEPS and before == after  # bit for bit, as Python floats from float64
    assert len(set(before)) == STEPS  # real, changing losses


def test_steps_and_warmup_are_respected(safe_run):
    result = safe_run[0]
    for run in (result.original, result.rewritten):
        trace = run.trace
        assert trace["completed"] and trace["steps"] == STEPS  # the script was told 40: verify stopped it
        assert trace["timed_steps"] == STEPS - WARMUP and trace["warmup"] == WARMUP
        assert trace["steps_per_s"] == pytest.approx((STEPS - WARMUP) / trace["elapsed_s"])
        assert trace["samples_per_step"] == [16] * STEPS  # --batch-size 16, read from the model's input
        assert trace["samples_per_s"] == pytest.approx(16 * trace["steps_per_s"])
        assert trace["tokens_per_s"] is None  # float features, not token ids
        assert trace["peak_memory_kind"] == "rss" and trace["peak_memory_bytes"] > 10 * 2**20
        assert run.returncode == 0 and run.sites == {"loss": 1, "stepped": 1, "batch": 1}


def test_nothing_outside_the_temporary_folder_is_written_and_it_is_removed(safe_run):
    _, before, temporary = safe_run
    assert snapshot(FIXTURES) == before  # the scripts unchanged, no trace, no __pycache__
    assert list(temporary.iterdir()) == []


def test_json_has_the_documented_keys(safe_run):
    data = json.loads(json.dumps(safe_run[0].as_json()))
    assert set(data) == {
        "schema",
        "script",
        "args",
        "level",
        "applied_level",
        "steps",
        "warmup",
        "seed",
        "device",
        "torch",
        "nproc",
        "fixes",
        "original",
        "rewritten",
        "speedup",
        "rounds",
        "speed",
        "max_abs_deviation",
        "max_rel_deviation",
        "worst_step",
        "tolerance",
        "agree",
        "notes",
        "error",
    }
    assert data["schema"] == 2 and data["agree"] is True and data["error"] is None and data["nproc"] is None
    assert data["steps"] == STEPS and data["warmup"] == WARMUP and data["level"] == "safe"
    assert data["device"].startswith("cpu") and data["args"] == ["--steps", "40"]
    assert set(data["original"]) == {
        "steps_per_s",
        "samples_per_s",
        "tokens_per_s",
        "peak_memory_bytes",
        "peak_memory_kind",
        "losses",
        "elapsed_s",
        "returncode",
        "sites",
        "nproc",
        "ranks",
        "steps_per_s_rounds",
    }
    assert data["original"]["nproc"] is None and data["original"]["ranks"] is None
    assert data["speedup"] == pytest.approx(data["rewritten"]["steps_per_s"] / data["original"]["steps_per_s"])
    assert data["max_abs_deviation"] == 0 and data["tolerance"] == {
        "level": "safe",
        "rtol": 0,
        "atol": 0,
        "exact": True,
    }
    assert {"path": "safe_mlp.py", "code": "PM403", "level": "safe"}.items() <= data["fixes"][-1].items()


def test_the_runs_alternate_over_rounds_and_the_speed_up_has_its_spread(safe_run):
    result = safe_run[0]
    assert result.rounds == verify_run.DEFAULT_ROUNDS == 3
    for run in (result.original, result.rewritten):
        assert len(run.traces) == 3 and run.traces[0] is run.trace
        assert all(t["completed"] and t["steps"] == STEPS and t["losses"] == run.trace["losses"] for t in run.traces)
    speed = result.speed
    ratios = [a["steps_per_s"] / b["steps_per_s"] for b, a in zip(result.original.traces, result.rewritten.traces)]
    assert speed.ratios == pytest.approx(ratios) and speed.low < speed.ratio < speed.high
    assert result.speedup == speed.ratio
    data = json.loads(json.dumps(result.as_json()))
    assert data["rounds"] == 3 and data["speed"]["ratios"] == pytest.approx(ratios)
    assert data["original"]["steps_per_s_rounds"] == [t["steps_per_s"] for t in result.original.traces]
    assert data["speedup"] == pytest.approx(data["rewritten"]["steps_per_s"] / data["original"]["steps_per_s"])
    text = render_text(result)
    assert f"over 3 rounds (each: {', '.join(f'{r:.2f}x' for r in ratios)}): " in text
    # Whatever this machine measured, the verdict, the exit status and the text say the same.
    slower = speed.verdict == verify_run.SLOWER
    assert result.exit_code == (verify_run.EXIT_SLOWER if slower else 0)
    assert ("WARNING: the rewrite is measurably slower" in text) is slower
    assert not any("differ between its rounds" in note for note in result.notes)  # seeded: the same losses


def test_numeric_rewrite_agrees_within_tolerance(numeric_run):
    result = numeric_run
    assert result.exit_code == 0, render_text(result)
    assert {"PM301", "PM402"} <= {f["code"] for f in result.fixes}
    assert result.tolerance == Tolerance("numeric", DEFAULT_RTOL, 0.0)
    before, after = result.original.trace["losses"], result.rewritten.trace["losses"]
    assert before[0] != after[0]  # bf16 autocast did run in the rewrite
    assert 0 < result.comparison["max_rel_deviation"] < DEFAULT_RTOL
    assert result.rewritten.trace["tokens_per_s"] == pytest.approx(8 * 16 * result.rewritten.trace["steps_per_s"])


# -- failures ----------------------------------------------------------------------------------


def test_a_crashing_script_exits_2_and_shows_its_stderr():
    result = perfmod("verify", FIXTURES / "crash_mid_training.py", "--steps", "6", "--warmup", "1")
    assert result.exit_code == 2
    assert "FAILED: original run: the script failed (exit status 1)" in result.stdout
    assert "ValueError: batch 3 has the wrong shape" in result.stdout


def test_a_script_that_ends_before_the_steps_is_a_failure_with_its_partial_trace(tmp_path, capsys, monkeypatch):
    """Through the standalone runner, on copies prepared beforehand, as on a machine
    without libcst: its options, and arguments after `--` replacing the prepared ones."""
    from codemod.verify_run import main as run_main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    prepare(SAFE, tmp_path, ["--steps", "40"])
    status = run_main([str(tmp_path), "--steps", "5", "--warmup", "1", "--format", "json", "--", "--steps", "3"])
    data = json.loads(capsys.readouterr().out)
    assert status == 2 and data["steps"] == 5 and data["args"] == ["--steps", "3"]
    assert data["error"]["run"] == "original" and "ended after 3 of 5 optimizer steps" in data["error"]["message"]
    assert data["agree"] is None and data["rewritten"] is None and data["speedup"] is None
    assert len(data["original"]["losses"]) == 3  # what it traced before it ended


def test_a_script_without_a_training_loop_is_a_clear_error():
    result = perfmod("verify", FIXTURES / "inference_only.py")
    assert result.exit_code == 2
    assert "no training loop found" in result.stderr and "<optimizer>.step()" in result.stderr
    with pytest.raises(VerifyError, match="no training loop"):
        verify(FIXTURES / "inference_only.py")
    as_json = perfmod("verify", FIXTURES / "inference_only.py", "--format", "json")
    assert as_json.exit_code == 2
    data = json.loads(as_json.stdout)
    assert data["agree"] is None and "no training loop" in data["error"]["message"]


def test_warmup_must_leave_steps_to_time():
    result = perfmod("verify", SAFE, "--steps", "3", "--warmup", "3")
    assert result.exit_code == 2 and "need 1 <= warmup < steps" in result.stderr


# -- local modules -------------------------------------------------------------------------------


def test_a_rewrite_that_changes_the_math_disagrees_also_in_a_local_module_and_the_folder_is_untouched(tmp_path):
    """One run pair for three claims: a test-only rule that doubles the learning rate
    (in train.py) is caught at the exact tolerance it claims; PM403 rewrites the
    loop of the local module loop.py, and both copies of it are instrumented; the
    script's writes beside itself (an existing checkpoint and small file overwritten,
    a new file in an existing folder) land in the runs' folders, not in the project."""
    project = tmp_path / "project"
    shutil.copytree(FIXTURES / "local_module", project)
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "last.pt").write_bytes(b"the user's checkpoint")
    (project / "notes.txt").write_text("the user's notes\n")
    before = snapshot(project)
    script, kept = project / "train.py", tmp_path / "kept"
    assert local_modules(script) == [script.with_name("loop.py")]
    result = verify(
        script,
        ["100"],
        steps=3,
        warmup=1,
        env=ENV,
        keep=kept,
        rules=[DoubledLearningRate, MemoryCleanupInStepLoop],
        rounds=1,
    )
    assert result.exit_code == 1 and result.agree is False, render_text(result)
    assert [(f["path"], f["code"]) for f in result.fixes] == [("train.py", "PM999"), ("loop.py", "PM403")]
    before_losses, after_losses = result.original.trace["losses"], result.rewritten.trace["losses"]
    assert len(before_losses) == len(after_losses) == 3
    assert before_losses[0] == after_losses[0]  # the first loss comes before any update
    assert all(a != b for a, b in zip(before_losses[1:], after_losses[1:]))
    assert result.comparison["worst_step"] > 1 and "losses DISAGREE" in render_text(result)
    original = (kept / "original" / "loop.py").read_text()
    rewritten = (kept / "rewritten" / "loop.py").read_text()
    assert "_perfmod_trace.stepped(optimizer.step())" in original and "gc.collect()" in original
    assert "_perfmod_trace.stepped(optimizer.step())" in rewritten and "gc.collect()" not in rewritten
    assert "lr=1e-2 * 2" in (kept / "rewritten" / "train.py").read_text()
    # The project: byte for byte as it was, no new file.
    assert snapshot(project) == before
    for run in ("original", "rewritten"):
        folder = kept / run
        assert not (folder / "checkpoints").is_symlink() and not (folder / "notes.txt").is_symlink()
        assert (folder / "notes.txt").read_text() == "training 100 steps\n"
        assert (folder / "checkpoints" / "config.txt").read_text() == "steps = 100\n"
        assert (folder / "checkpoints" / "last.pt").read_bytes().startswith(b"PK")  # torch.save's zip
    assert not any("changed files" in note for note in result.notes)


def test_local_modules_follow_packages_and_relative_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "train.py").write_text("import os\nfrom pkg import helpers\nimport missing\n")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "helpers.py").write_text("from . import loops\nfrom .. import outside\n")
    (tmp_path / "pkg" / "loops.py").write_text("x = 1\n")
    (tmp_path / "unused.py").write_text("")
    found = [p.relative_to(tmp_path).as_posix() for p in local_modules(tmp_path / "train.py")]
    assert found == ["pkg/__init__.py", "pkg/helpers.py", "pkg/loops.py"]


def test_local_modules_of_a_script_with_newer_syntax_are_found(tmp_path):
    """PEP 695 and PEP 701 (Python 3.12), which the running Python may not read: libcst finds the imports."""
    (tmp_path / "train.py").write_text(
        "from helpers import first\ntype Batch = list[int]\n\ndef run[T](x: T) -> T:\n    import loops\n"
        '    return f"{x["k"]}"\n'
    )
    (tmp_path / "helpers.py").write_text("def first(x):\n    return x[0]\n")
    (tmp_path / "loops.py").write_text("x = 1\n")
    assert [p.name for p in local_modules(tmp_path / "train.py")] == ["helpers.py", "loops.py"]


# -- speed over rounds: the verdicts from synthetic timings -------------------------------------------


def timed_result(before, after, losses=(2.0, 1.0, 0.5), rewritten_losses=None) -> verify_run.VerifyResult:
    """A verify of 3 steps (1 warm-up) whose rounds ran at the given steps/s."""

    def trace(rate, values):
        return {
            "completed": True,
            "steps": 3,
            "warmup": 1,
            "timed_steps": 2,
            "elapsed_s": 2 / rate,
            "steps_per_s": rate,
            "samples_per_s": 16 * rate,
            "tokens_per_s": None,
            "losses": list(values),
            "peak_memory_bytes": 2**20,
            "peak_memory_kind": "rss",
            "device": "cpu (test)",
            "torch": "x",
        }

    sites = {"loss": 1, "stepped": 1, "batch": 1}
    original = [trace(rate, losses) for rate in before]
    rewrite = [trace(rate, rewritten_losses or losses) for rate in after]
    return verify_run.VerifyResult(
        "train.py",
        [],
        "safe",
        3,
        1,
        0,
        [],
        Tolerance.for_level("safe"),
        verify_run.RunResult(0, original[0], sites, original),
        verify_run.RunResult(0, rewrite[0], sites, rewrite),
        rounds=len(before),
    )


def test_the_speed_range_is_students_t_over_the_log_ratios():
    import statistics

    ratios = [1.08, 0.98, 0.95]  # a no-op rewrite's three single runs, as printed before rounds
    speed = verify_run.Speed.of(ratios)
    logs = [math.log(r) for r in ratios]
    margin = 4.303 * statistics.stdev(logs) / math.sqrt(3)  # t(0.975, df 2)
    assert speed.ratio == pytest.approx(math.exp(statistics.fmean(logs)))
    assert speed.low == pytest.approx(math.exp(statistics.fmean(logs) - margin))
    assert speed.high == pytest.approx(math.exp(statistics.fmean(logs) + margin))
    assert speed.verdict == verify_run.NO_DIFFERENCE
    assert verify_run.Speed.of([2.0, 2.0, 2.0]).verdict == verify_run.FASTER  # no spread: the range is 2.0
    assert verify_run.Speed.of([1.01, 1.012, 1.011]).verdict == verify_run.NO_DIFFERENCE  # within 2%
    assert verify_run.Speed.of([0.15]).verdict == verify_run.UNKNOWN  # one round: no range
    assert verify_run.Speed.of([1.0, None]) is None  # a round without timing


def test_noise_is_no_measurable_difference():
    result = timed_result([10.0, 10.0, 10.0], [10.8, 9.8, 9.5])
    assert result.exit_code == 0 and result.speed.verdict == verify_run.NO_DIFFERENCE
    text = render_text(result)
    low, high = result.speed.low, result.speed.high
    assert low < 1 < high
    assert (
        f"speed: {result.speed.ratio:.2f}x steps/s, 95% range {low:.2f}x-{high:.2f}x over 3 rounds "
        "(each: 1.08x, 0.98x, 0.95x): no measurable difference\n"
    ) in text
    assert "WARNING" not in text and text.endswith("result: losses agree\n")
    assert "| steps/s                      |           10 |        10.02 |    1.00x |" in text  # geometric means


def test_a_measurably_slower_rewrite_warns_and_exits_3():
    result = timed_result([10.0, 10.5, 9.8], [1.5, 1.6, 1.45])  # bf16 autocast on a CPU
    assert result.agree is True and result.speed.verdict == verify_run.SLOWER
    assert result.exit_code == verify_run.EXIT_SLOWER == 3
    text = render_text(result)
    assert ": SLOWER\n" in text
    assert "WARNING: the rewrite is measurably slower than the original: 0.15x steps/s (" in text
    assert text.endswith("result: losses agree, but the rewrite is SLOWER (0.15x steps/s)\n")
    data = json.loads(json.dumps(result.as_json()))
    assert data["agree"] is True and data["speed"]["verdict"] == "slower" and data["speed"]["high"] < 1
    assert data["speed"]["min"] == pytest.approx(1.45 / 9.8) and data["speed"]["max"] == pytest.approx(1.6 / 10.5)
    assert data["speedup"] == pytest.approx(data["speed"]["ratio"])


def test_a_measurably_faster_rewrite_says_so():
    result = timed_result([10.0, 10.2, 9.9], [22.0, 23.0, 21.5])
    assert result.exit_code == 0 and result.speed.verdict == verify_run.FASTER
    assert result.speed.low > 2
    assert "over 3 rounds (each: 2.20x, 2.25x, 2.17x): faster\n" in render_text(result)


def test_rounds_that_agree_but_vary_widely_ask_for_more_rounds():
    result = timed_result([1.2, 1.3, 0.6], [2.1, 3.2, 3.6])  # a busy machine: 1.75x, 2.46x, 6.00x
    assert result.speed.verdict == verify_run.NO_DIFFERENCE and result.speed.low < 1
    assert (
        "): no measurable difference; every round was faster, but the rounds vary too much for the range to "
        "leave out 1.0 (a busy machine?): more --rounds narrow it\n"
    ) in render_text(result)
    assert "every round" not in render_text(timed_result([10.0, 10.0, 10.0], [10.8, 9.8, 9.5]))


def test_one_round_gives_a_ratio_without_a_verdict():
    result = timed_result([10.0], [1.5])
    assert result.exit_code == 0 and result.speed.verdict == verify_run.UNKNOWN
    assert result.as_json()["speed"]["low"] is None
    assert (
        "speed: 0.15x steps/s from one round: no spread to tell it from noise (--rounds 3 or more measure one)"
        in render_text(result)
    )


def test_losses_that_disagree_outrank_a_slower_rewrite():
    result = timed_result([10.0, 10.0, 10.0], [1.5, 1.5, 1.6], rewritten_losses=(2.0, 1.5, 1.0))
    assert result.speed.verdict == verify_run.SLOWER and result.exit_code == 1
    assert "result: losses DISAGREE" in render_text(result)


def test_the_review_page_and_the_summary_show_the_spread():
    from codemod.report.review import verify_facts, verify_headline, verify_slower

    slower = timed_result([10.0, 10.5, 9.8], [1.5, 1.6, 1.45]).as_json()
    speed = slower["speed"]
    assert verify_slower(slower)
    spread = f"95% range {speed['low']:.2f}x–{speed['high']:.2f}x over 3 rounds"
    assert verify_headline(slower) == (
        f"losses agree within tolerance; {speed['ratio']:.2f}x speed-up ({spread}: the rewrite is SLOWER)"
    )
    noise = timed_result([10.0, 10.0, 10.0], [10.8, 9.8, 9.5]).as_json()
    assert not verify_slower(noise)
    assert dict(verify_facts(noise))["speed-up"].endswith("over 3 rounds: no measurable difference)")
    one = timed_result([10.0], [12.0]).as_json()
    assert (
        verify_headline(one)
        == "losses agree within tolerance; 1.20x speed-up (one round: no spread to tell it from noise)"
    )
    older = {"agree": True, "speedup": 1.75}  # a document of verify before rounds
    assert verify_headline(older) == "losses agree within tolerance; 1.75x speed-up" and not verify_slower(older)


def test_rounds_alternate_which_version_runs_first_and_a_later_failure_fails(prepared, monkeypatch):
    calls = []

    def run(script, args, cwd, *rest):
        calls.append(cwd.name)
        rate = 10.0 if cwd.name == "original" else 5.0
        trace = {"completed": True, "steps": 3, "timed_steps": 2, "steps_per_s": rate, "losses": [1.0, 0.5]}
        if len(calls) == 4:
            return 1, trace, "Traceback: out of memory"
        return 0, trace, ""

    monkeypatch.setattr(verify_run, "_run", run)
    result = verify_run.run_prepared(prepared, steps=3, warmup=1, rounds=3)
    assert calls == ["original", "rewritten", "rewritten", "original"]
    assert result.exit_code == 2 and result.speed is None
    assert result.error["run"] == "original"
    assert result.error["message"] == "the script failed (exit status 1) (round 2 of 3)"
    calls.clear()

    def unseeded(script, args, cwd, *rest):  # the original draws other losses each time it runs
        calls.append(cwd.name)
        losses = [1.0, 0.5 + len(calls) if cwd.name == "original" else 0.5]
        return 0, {"completed": True, "steps": 3, "steps_per_s": 1.0, "losses": losses}, ""

    monkeypatch.setattr(verify_run, "_run", unseeded)
    result = verify_run.run_prepared(prepared, steps=3, warmup=1, rounds=2)
    assert calls == ["original", "rewritten", "rewritten", "original"]
    assert any(note.startswith("the original run's losses differ between its rounds") for note in result.notes)
    with pytest.raises(VerifyError, match="--rounds 0"):
        verify_run.run_prepared(prepared, steps=3, warmup=1, rounds=0)


SLEEPY_SCRIPT = """\
import time

import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 4), torch.randn(8, 1)
for step in range(100):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_rewrite_slower_for_real_exits_3_with_its_warning(tmp_path):
    """End to end: a rewrite that sleeps 20 ms a step, against the original's well under 1 ms."""
    script = tmp_path / "train.py"
    script.write_text(SLEEPY_SCRIPT)
    slow = tmp_path / "slow.py"
    slow.write_text(SLEEPY_SCRIPT.replace("    optimizer.step()\n", "    optimizer.step()\n    time.sleep(0.02)\n"))
    # Four rounds: with two, Student's t has one degree of freedom and the original's sub-ms
    # steps vary enough (0.01x and 0.03x in one CI run) for the range to reach 1.0.
    result = verify(script, steps=5, warmup=1, env=ENV, rewritten=slow, rounds=4)
    text = render_text(result)
    assert result.agree is True, text
    assert result.speed.verdict == verify_run.SLOWER and result.speed.high < 0.5, text
    assert result.exit_code == 3
    assert "WARNING: the rewrite is measurably slower than the original" in text
    assert "over 4 rounds" in text


def test_the_command_line_exits_3_with_the_warning_in_text_and_on_stderr_with_json(monkeypatch):
    seen = {}

    def slower(script, args, **options):
        seen.update(options)
        return timed_result([10.0, 10.5, 9.8], [1.5, 1.6, 1.45])

    monkeypatch.setattr(verify_module, "verify", slower)
    text = perfmod("verify", SAFE, "--rounds", "5")
    assert seen["rounds"] == 5
    assert text.exit_code == 3 and "WARNING: the rewrite is measurably slower" in text.stdout
    as_json = perfmod("verify", SAFE, "--format", "json")
    assert seen["rounds"] == verify_run.DEFAULT_ROUNDS
    assert as_json.exit_code == 3 and json.loads(as_json.stdout)["speed"]["verdict"] == "slower"
    assert undocumented(json.loads(as_json.stdout), "verify") == set()
    assert as_json.stderr.startswith("WARNING: the rewrite is measurably slower")


def test_the_command_line_takes_rounds_and_documents_exit_3():
    help_text = perfmod("verify", "--help").stdout
    assert "--rounds" in help_text and f"[default: {verify_run.DEFAULT_ROUNDS};" in help_text
    assert "3  the losses agree but the rewrite is measurably slower" in help_text
    assert "no measurable difference" in help_text
    result = perfmod("verify", SAFE, "--rounds", "0")
    assert result.exit_code == 2 and "--rounds" in result.stderr


# -- comparison and instrumentation (no runs) ----------------------------------------------------------


def test_compare_is_exact_for_safe_and_relative_above():
    exact, numeric = Tolerance.for_level("safe"), Tolerance.for_level("numeric")
    assert compare([1.0, 2.0], [1.0, 2.0], exact)["agree"]
    assert not compare([1.0, 2.0], [1.0, 2.0 + 2e-16 * 2], exact)["agree"]
    assert compare([1.0, 2.0], [1.0, 2.019], numeric)["agree"]
    outcome = compare([1.0, 2.0], [1.0, 2.021], numeric)
    assert not outcome["agree"] and outcome["worst_step"] == 2
    assert outcome["max_abs_deviation"] == pytest.approx(0.021)
    assert not compare([1.0], [1.0, 2.0], numeric)["agree"]  # a different number of backward passes
    assert compare([None], [None], exact)["agree"] and not compare([None], [1.0], numeric)["agree"]
    assert Tolerance.for_level("safe", rtol=1e-3).rtol == 1e-3


INSTRUMENTED_SOURCE = '''\
"""Docstring."""
from __future__ import annotations
import torch


class Trainer:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.AdamW(self.model.parameters())
        self.scaler = torch.amp.GradScaler()

    def fit(self, batches, accum):
        for i, (x, y) in enumerate(batches):
            loss = self.loss_fn(self.model(x), y)
            self.scaler.scale(loss / accum).backward()
            if (i + 1) % accum == 0:
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad()
'''


def test_instrumentation_hooks_after_the_header_and_inside_classes():
    instrumented = instrument(INSTRUMENTED_SOURCE, "t.py", Settings())
    lines = instrumented.source.splitlines()
    assert lines[:5] == [
        '"""Docstring."""',
        "from __future__ import annotations",
        "import runtime.trace as _perfmod_trace",
        "_perfmod_trace.install()",
        "import torch",
    ]
    assert "            self.scaler.scale(_perfmod_trace.loss(loss) / accum).backward()" in lines
    assert "                _perfmod_trace.stepped(self.scaler.step(self.optimizer))" in lines
    assert "            loss = self.loss_fn(self.model(_perfmod_trace.batch(x)), y)" in lines
    assert instrumented.sites == {"loss": 1, "stepped": 1, "batch": 1}
    compile(instrumented.source, "t.py", "exec")


def test_only_the_entry_script_and_files_with_loops_get_the_header():
    helper = "import torch\n\n\ndef act(x):\n    return torch.relu(x)\n"
    assert instrument(helper, "helpers.py", Settings(), entry=False).source == helper
    assert instrument(helper, "train.py", Settings(), entry=True).source.startswith(
        "import runtime.trace as _perfmod_trace\n_perfmod_trace.install()\nimport torch\n"
    )


def test_verify_imports_no_torch_and_its_running_half_no_libcst():
    """codemod never imports torch: the runs that need it are subprocesses."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    # The running half needs neither libcst nor torch: a GPU machine with torch alone runs prepared copies.
    code = (
        "import sys, codemod.verify_run; assert not {'torch', 'libcst'} & set(sys.modules)\n"
        "import codemod.verify, codemod.cli; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_the_standalone_runner_refuses_a_folder_verify_did_not_prepare(tmp_path, capsys):
    from codemod.verify_run import main as run_main

    assert run_main([str(tmp_path), "--steps", "3"]) == 2
    assert "not a folder prepared by perfmod verify" in capsys.readouterr().err


class UnsafeDoubledLearningRate(DoubledLearningRate):
    """Test only: the same change, declared unsafe."""

    LEVEL = Level.UNSAFE


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A script's folder with what the mirror treats apart, and small limits."""
    monkeypatch.setattr(verify_module, "COPY_LIMIT", 1000)
    monkeypatch.setattr(verify_module, "WALK_LIMIT", 20)
    root = tmp_path / "project"
    write(root / "train.py", SAFE.read_text())
    write(root / "notes.txt", "small, copied")
    write(root / "data" / "big.bin", b"\0" * 2000)  # over COPY_LIMIT: linked
    write(root / "data" / "labels.txt", "small, copied")
    write(root / "checkpoints" / "last.pt", b"small, copied")
    write(root / ".git" / "HEAD", "ref: refs/heads/main\n")
    write(root / "myenv" / "pyvenv.cfg", "home = /usr\n")
    write(root / "__pycache__" / "train.cpython-312.pyc", b"")
    write(tmp_path / "elsewhere" / "shard.bin", b"data kept elsewhere")
    (root / "external").symlink_to("../elsewhere", target_is_directory=True)
    for index in range(30):  # over WALK_LIMIT, with what comes before it
        write(root / "many" / f"{index}.txt", "x")
    return root


def test_prepare_marks_unsafe_fixes_and_mirrors_the_folder_safely(project):
    prepared = project / "verify-out"  # --keep inside the script's folder: left out of the mirror
    manifest = prepare(
        project / "train.py", prepared, ["--steps", "4"], level=Level.UNSAFE, rules=[UnsafeDoubledLearningRate]
    )
    assert manifest["applied_level"] == "unsafe" and UNSAFE_NOTE in manifest["notes"]
    assert [f["code"] for f in manifest["fixes"]] == ["PM999"]
    assert manifest["entry"] == "train.py" and manifest["args"] == ["--steps", "4"]
    assert manifest["sites"]["original"] == manifest["sites"]["rewritten"] == {"loss": 1, "stepped": 1, "batch": 1}
    assert json.loads((prepared / MANIFEST).read_text()) == manifest
    assert Tolerance.for_level(manifest["applied_level"]).rtol == DEFAULT_RTOL
    copy = prepared / "rewritten" / "train.py"
    assert copy.is_file() and not copy.is_symlink()
    assert "_perfmod_trace.install()" in copy.read_text() and "lr=options.lr * 2" in copy.read_text()
    for run in ("original", "rewritten"):
        mirror = prepared / run
        for name in ("notes.txt", "data/labels.txt", "checkpoints/last.pt"):  # copies, with their times
            assert not (mirror / name).is_symlink() and (mirror / name).read_bytes() == (project / name).read_bytes()
            assert (mirror / name).stat().st_mtime_ns == (project / name).stat().st_mtime_ns
        for name in ("data", "checkpoints"):  # real folders: what a run creates in them stays there
            assert (mirror / name).is_dir() and not (mirror / name).is_symlink()
        for name in ("data/big.bin", ".git", "myenv", "external", "many"):  # linked, relative
            assert (mirror / name).is_symlink() and not os.path.isabs(os.readlink(mirror / name)), name
        assert (mirror / "data" / "big.bin").read_bytes() == b"\0" * 2000
        assert (mirror / "external" / "shard.bin").read_bytes() == b"data kept elsewhere"
        assert not (mirror / "__pycache__").exists() and not (mirror / "verify-out").exists()
    assert manifest["linked"] == {"files": ["data/big.bin"], "folders": ["external", "myenv", "many"]}  # not .git
    [note] = [note for note in manifest["notes"] if "linked whole" in note]
    assert "more than 20 entries" in note and "many/" in note and "external" not in note


def test_a_run_that_changes_a_linked_file_fails_and_names_it(project, tmp_path, monkeypatch):
    """What the runs change through the links is found after them (runs faked: the check is verify_run's)."""
    prepared = tmp_path / "prepared"
    prepare(project / "train.py", prepared)

    def run(script, args, cwd, *rest):
        if cwd.name == "original":
            with open(cwd / "data" / "big.bin", "ab") as handle:  # through the link: the user's file
                handle.write(b"appended")
            (cwd / "many" / "new.txt").write_text("in a folder linked whole")
            (cwd / "checkpoints" / "last.pt").write_bytes(b"overwritten")  # the copy: harmless
        return 0, {"completed": True, "steps": 3, "losses": [1.0, 0.5, 0.25]}, ""

    monkeypatch.setattr(verify_run, "_run", run)
    result = verify_run.run_prepared(prepared, steps=3, warmup=1)
    assert result.exit_code == 2 and result.agree is None
    assert result.error == {"run": None, "message": verify_run.MODIFIED_MESSAGE, "stderr": ""}
    [note] = [note for note in result.notes if "changed files" in note]
    assert note.endswith(": data/big.bin, many/")
    text = render_text(result)
    assert f"note: {note}" in text and "FAILED: a run wrote into files of the script's folder" in text
    assert "-- --out /tmp/x" in text and "None run" not in text
    assert json.loads(json.dumps(result.as_json()))["error"]["run"] is None
    # Nothing changed: no note, the runs' own result.
    prepare(project / "train.py", prepared)
    monkeypatch.setattr(verify_run, "_run", lambda *a: (0, {"completed": True, "steps": 3, "losses": [1.0]}, ""))
    assert verify_run.run_prepared(prepared, steps=3, warmup=1).exit_code == 0


# -- --nproc: the rewrite under torchrun (runs faked here; real ones in tests/test_distributed_fixture.py) ---------


def rank_trace(rank, losses, samples, elapsed, group=True, peak=100):
    steps = len(samples)
    return {
        "completed": True,
        "steps": steps,
        "warmup": 1,
        "timed_steps": steps - 1,
        "elapsed_s": elapsed,
        "steps_per_s": (steps - 1) / elapsed,
        "samples_per_step": samples,
        "tokens_per_step": [None] * steps,
        "losses": losses,
        "peak_memory_bytes": peak,
        "peak_memory_kind": "rss",
        "device": "cpu (test)",
        "torch": "x",
        "rank": rank,
        "world_size": 2,
        "process_group": {"initialized": True, "world_size": 2, "backend": "gloo"}
        if group
        else {"initialized": False, "world_size": None, "backend": None},
    }


def test_the_ranks_traces_combine_into_the_global_step():
    combined = verify_run.combine(
        [
            rank_trace(0, [1.0, 0.5, 0.25], [8, 8, 8], 2.0, peak=300),
            rank_trace(1, [3.0, 1.5, None], [8, 8, 8], 4.0, peak=200),
        ]
    )
    assert combined["losses"] == [2.0, 1.0, None]  # the mean over the ranks; NaN anywhere stays NaN
    assert combined["samples_per_step"] == [16, 16, 16]  # the global batch
    assert combined["elapsed_s"] == 4.0 and combined["steps_per_s"] == 2 / 4.0  # paced by the slowest rank
    assert combined["samples_per_s"] == 2 * 16 / 4.0 and combined["tokens_per_s"] is None
    assert combined["peak_memory_bytes"] == 300 and combined["nproc"] == 2 and combined["completed"]
    partial = verify_run.combine([rank_trace(0, [1.0], [8, 8], 1.0), None])
    assert partial["missing_ranks"] == [1] and not partial["completed"]


@pytest.fixture
def prepared(tmp_path):
    prepare(SAFE, tmp_path)
    return tmp_path


def fake_runs(original, ranks):
    """A verify_run._run that returns `original` for the original and the ranks combined for the rewrite."""

    def run(script, args, cwd, python, steps, warmup, seed, deterministic, timeout, env, nproc=None, pin=False):
        assert pin  # both runs draw the same shuffle under --nproc
        if cwd.name == "original":
            assert nproc is None
            return 0, original, ""
        assert nproc == 2
        return 0, verify_run.combine(ranks), ""

    return run


def test_nproc_compares_the_mean_over_ranks_and_reports_each_rank(prepared, monkeypatch):
    original = rank_trace(0, [2.0, 1.0, 0.5], [16, 16, 16], 2.0)
    ranks = [rank_trace(0, [1.5, 0.5, 0.25], [8, 8, 8], 1.0), rank_trace(1, [2.5, 1.5, 0.75], [8, 8, 8], 1.0)]
    monkeypatch.setattr(verify_run, "_run", fake_runs(original, ranks))
    result = verify_run.run_prepared(prepared, steps=3, warmup=1, nproc=2)
    assert result.exit_code == 0 and result.agree and result.comparison["max_abs_deviation"] == 0
    data = json.loads(json.dumps(result.as_json()))
    assert data["nproc"] == 2 and data["rewritten"]["nproc"] == 2 and data["original"]["nproc"] is None
    assert [r["rank"] for r in data["rewritten"]["ranks"]] == [0, 1]
    assert data["rewritten"]["ranks"][1]["losses"] == [2.5, 1.5, 0.75]
    assert set(data["rewritten"]["ranks"][0]) == {"rank", *verify_run.RANK_KEYS}
    text = render_text(result)
    assert "rewritten run: torchrun, 2 processes" in text and "| rewritten, rank" in text


def test_nproc_fails_a_rewrite_whose_ranks_train_alone(prepared, monkeypatch):
    """Without PM601 the rewrite is the original: under torchrun each process trains on
    its own, and the mean of identical losses would agree: verify must not say so."""
    original = rank_trace(0, [2.0, 1.0, 0.5], [16, 16, 16], 2.0)
    alone = [rank_trace(r, [2.0, 1.0, 0.5], [16, 16, 16], 2.0, group=False) for r in (0, 1)]
    monkeypatch.setattr(verify_run, "_run", fake_runs(original, alone))
    result = verify_run.run_prepared(prepared, steps=3, warmup=1, nproc=2)
    assert result.exit_code == 2 and result.agree is None and result.error["run"] == "rewritten"
    assert "rank 0 had joined no process group by its first optimizer step" in result.error["message"]
    assert "not torchrun-ready" in result.error["message"]


def test_nproc_disagrees_when_the_ranks_step_on_a_bigger_global_batch(prepared, monkeypatch):
    original = rank_trace(0, [2.0, 1.0, 0.5], [16, 16, 16], 2.0)
    doubled = [rank_trace(r, [2.0, 1.0, 0.5], [16, 16, 16], 2.0) for r in (0, 1)]  # each rank the whole batch
    monkeypatch.setattr(verify_run, "_run", fake_runs(original, doubled))
    result = verify_run.run_prepared(prepared, steps=3, warmup=1, nproc=2)
    assert result.comparison["agree"] and result.agree is False and result.exit_code == 1
    assert result.global_batches == (16, 32)
    assert any("the global batch differs: 32 samples per optimizer step over the 2 ranks" in n for n in result.notes)
    assert "losses DISAGREE" in render_text(result)


def test_the_command_line_takes_nproc():
    assert "--nproc" in perfmod("verify", "--help").stdout
    result = perfmod("verify", SAFE, "--nproc", "0")
    assert result.exit_code == 2 and "--nproc" in result.stderr


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="reads /proc")
def test_a_run_past_its_timeout_is_killed_with_its_children(tmp_path):
    """A hung DDP rank is the usual way a distributed run fails: the launcher and every
    process it started must go, not only the launcher."""
    import time

    (tmp_path / "hang.py").write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "open('child.pid', 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    status, trace, stderr = verify_run._run(tmp_path / "hang.py", [], tmp_path, None, 3, 1, 0, False, 2.0, None)
    assert status == -1 and trace is None and "killed after 2 s" in stderr
    assert time.monotonic() - start < 30
    child = int((tmp_path / "child.pid").read_text())
    for _ in range(50):  # reparented and reaped by init once killed
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the run's child {child} outlived the timeout")

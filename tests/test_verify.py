"""`perfmod verify`: both versions run for real (subprocesses, CPU), and the
comparison catches what it must: exact agreement for safe rewrites, agreement
within tolerance for numeric ones, a rule that changes the math, a crash.

Each verify starts two Python processes that import torch; the runs are few
and short (a handful of steps of tiny models) and shared between tests.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import libcst as cst
import pytest

from codemod.analysis.names import kwarg
from codemod.config import Settings
from codemod.instrument import instrument
from codemod.rule import Level, Rule
from codemod.rules.gc_in_loop import MemoryCleanupInStepLoop
from codemod.verify import local_modules, prepare, verify
from codemod.verify_run import (
    DEFAULT_RTOL, MANIFEST, UNSAFE_NOTE, Tolerance, VerifyError, compare, render_text,
)
from tests.cli_support import perfmod

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verify"
SAFE, NUMERIC = FIXTURES / "safe_mlp.py", FIXTURES / "numeric_lm.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PERFMOD_AMP": "bf16"}  # bf16: PM301's autocast runs on the CPU
STEPS, WARMUP = 4, 1


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


class DoubledLearningRate(Rule):
    """Test only: claims to be safe and doubles every `lr=`, a rewrite that changes the math."""

    CODE, NAME, LEVEL = "PM999", "doubled-learning-rate", Level.SAFE
    MESSAGE, GAIN = "doubles the learning rate", "none"

    def visit_Call(self, node: cst.Call) -> None:
        lr = kwarg(node, "lr")
        if lr is not None and not isinstance(lr.value, cst.BinaryOperation):  # once: `x * 2` is not doubled again
            doubled = cst.BinaryOperation(lr.value, cst.Multiply(), cst.Integer("2"))
            self.report(node, replacement=node.with_changes(
                args=[a.with_changes(value=doubled) if a is lr else a for a in node.args]))


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
    return verify(NUMERIC, ["--steps", "40"], steps=STEPS, warmup=WARMUP, level=Level.NUMERIC, env=ENV)


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
    assert set(data) == {"schema", "script", "args", "level", "applied_level", "steps", "warmup", "seed", "device",
                         "torch", "fixes", "original", "rewritten", "speedup", "max_abs_deviation",
                         "max_rel_deviation", "worst_step", "tolerance", "agree", "notes", "error"}
    assert data["schema"] == 1 and data["agree"] is True and data["error"] is None
    assert data["steps"] == STEPS and data["warmup"] == WARMUP and data["level"] == "safe"
    assert data["device"].startswith("cpu") and data["args"] == ["--steps", "40"]
    assert set(data["original"]) == {"steps_per_s", "samples_per_s", "tokens_per_s", "peak_memory_bytes",
                                     "peak_memory_kind", "losses", "elapsed_s", "returncode", "sites"}
    assert data["speedup"] == pytest.approx(data["rewritten"]["steps_per_s"] / data["original"]["steps_per_s"])
    assert data["max_abs_deviation"] == 0 and data["tolerance"] == {"level": "safe", "rtol": 0, "atol": 0,
                                                                   "exact": True}
    assert {"path": "safe_mlp.py", "code": "PM403", "level": "safe"}.items() <= data["fixes"][-1].items()


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


def test_a_rewrite_that_changes_the_math_disagrees_also_in_a_local_module(tmp_path):
    """One run pair for two claims: a test-only rule that doubles the learning rate
    (in train.py) is caught at the exact tolerance it claims; PM403 rewrites the
    loop of the local module loop.py, and both copies of it are instrumented."""
    script = FIXTURES / "local_module" / "train.py"
    assert local_modules(script) == [script.with_name("loop.py")]
    result = verify(script, ["100"], steps=3, warmup=1, env=ENV, keep=tmp_path,
                    rules=[DoubledLearningRate, MemoryCleanupInStepLoop])
    assert result.exit_code == 1 and result.agree is False
    assert [(f["path"], f["code"]) for f in result.fixes] == [("train.py", "PM999"), ("loop.py", "PM403")]
    before, after = result.original.trace["losses"], result.rewritten.trace["losses"]
    assert len(before) == len(after) == 3
    assert before[0] == after[0]  # the first loss comes before any update
    assert all(a != b for a, b in zip(before[1:], after[1:]))
    assert result.comparison["worst_step"] > 1 and "losses DISAGREE" in render_text(result)
    original = (tmp_path / "original" / "loop.py").read_text()
    rewritten = (tmp_path / "rewritten" / "loop.py").read_text()
    assert "_perfmod_trace.stepped(optimizer.step())" in original and "gc.collect()" in original
    assert "_perfmod_trace.stepped(optimizer.step())" in rewritten and "gc.collect()" not in rewritten
    assert "lr=1e-2 * 2" in (tmp_path / "rewritten" / "train.py").read_text()


def test_local_modules_follow_packages_and_relative_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "train.py").write_text("import os\nfrom pkg import helpers\nimport missing\n")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "helpers.py").write_text("from . import loops\nfrom .. import outside\n")
    (tmp_path / "pkg" / "loops.py").write_text("x = 1\n")
    (tmp_path / "unused.py").write_text("")
    found = [p.relative_to(tmp_path).as_posix() for p in local_modules(tmp_path / "train.py")]
    assert found == ["pkg/__init__.py", "pkg/helpers.py", "pkg/loops.py"]


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
    assert lines[:5] == ['"""Docstring."""', "from __future__ import annotations",
                         "import runtime.trace as _perfmod_trace", "_perfmod_trace.install()", "import torch"]
    assert "            self.scaler.scale(_perfmod_trace.loss(loss) / accum).backward()" in lines
    assert "                _perfmod_trace.stepped(self.scaler.step(self.optimizer))" in lines
    assert "            loss = self.loss_fn(self.model(_perfmod_trace.batch(x)), y)" in lines
    assert instrumented.sites == {"loss": 1, "stepped": 1, "batch": 1}
    compile(instrumented.source, "t.py", "exec")


def test_only_the_entry_script_and_files_with_loops_get_the_header():
    helper = "import torch\n\n\ndef act(x):\n    return torch.relu(x)\n"
    assert instrument(helper, "helpers.py", Settings(), entry=False).source == helper
    assert instrument(helper, "train.py", Settings(), entry=True).source.startswith(
        "import runtime.trace as _perfmod_trace\n_perfmod_trace.install()\nimport torch\n")


def test_verify_imports_no_torch_and_its_running_half_no_libcst():
    """codemod never imports torch: the runs that need it are subprocesses."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    code = "import sys, codemod.verify, codemod.cli; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)
    # The running half needs neither libcst nor torch: a GPU machine with torch alone runs prepared copies.
    code = "import sys, codemod.verify_run; assert not {'torch', 'libcst'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_the_standalone_runner_refuses_a_folder_verify_did_not_prepare(tmp_path, capsys):
    from codemod.verify_run import main as run_main

    assert run_main([str(tmp_path), "--steps", "3"]) == 2
    assert "not a folder prepared by perfmod verify" in capsys.readouterr().err


class UnsafeDoubledLearningRate(DoubledLearningRate):
    """Test only: the same change, declared unsafe."""

    LEVEL = Level.UNSAFE


def test_prepare_marks_unsafe_fixes_and_mirrors_the_folder_with_relative_links(tmp_path):
    manifest = prepare(SAFE, tmp_path, ["--steps", "4"], level=Level.UNSAFE, rules=[UnsafeDoubledLearningRate])
    assert manifest["applied_level"] == "unsafe" and UNSAFE_NOTE in manifest["notes"]
    assert [f["code"] for f in manifest["fixes"]] == ["PM999"]
    assert manifest["entry"] == "safe_mlp.py" and manifest["args"] == ["--steps", "4"]
    assert manifest["sites"]["original"] == manifest["sites"]["rewritten"] == {"loss": 1, "stepped": 1, "batch": 1}
    assert json.loads((tmp_path / MANIFEST).read_text()) == manifest
    copy = tmp_path / "rewritten" / "safe_mlp.py"
    assert copy.is_file() and not copy.is_symlink()
    assert "_perfmod_trace.install()" in copy.read_text() and "lr=options.lr * 2" in copy.read_text()
    sibling = tmp_path / "original" / "numeric_lm.py"
    assert sibling.is_symlink() and not os.path.isabs(os.readlink(sibling))
    assert sibling.read_bytes() == NUMERIC.read_bytes()
    assert (tmp_path / "original" / "local_module").is_symlink()
    assert Tolerance.for_level(manifest["applied_level"]).rtol == DEFAULT_RTOL

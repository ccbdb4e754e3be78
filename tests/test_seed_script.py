"""The seed script end to end: perfmod at level `safe` rewrites the LatentWire-style
script, the fixes it was written to provoke fire, and the rewritten script
trains bit for bit like the original on CPU. The nanoGPT-style script, already
written the fast way, is the negative control."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules import RULES_BY_CODE

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "fixtures" / "scripts"
SEED = SCRIPTS / "seed_latentwire.py"
OPTIMIZED = SCRIPTS / "optimized_nanogpt_style.py"
STEP_LINE = re.compile(r"^step (\d+) loss (\S+)$", re.M)
STEPS = 5

# Fixable findings the seed script was written to provoke: code -> text of each line that
# must get one (at whatever level the rule can prove for that site). Only codes in the
# registry are checked, so the test tightens as rules land.
EXPECTED_FINDINGS = {
    "PM101": [
        "question_ids = question_ids.to(device)",
        "answer_ids = answer_ids.to(device)",
    ],  # the copies of the loader PM102 pins (`scaffold_ids`, pageable memory, gets no finding)
    "PM102": ["loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)"],
    "PM103": ["for question_ids, answer_ids in loader:"],
    "PM401": ["optimizer.zero_grad(set_to_none=False)"],
    "PM403": ["gc.collect()", "torch.cuda.empty_cache()"],
    "PM503": ["for k in range(k_positions):"],
}


def test_the_loader_over_pretokenized_tensors_gets_no_workers(seed_rewrite):
    """Its dataset is a TensorDataset of the tokenized corpus: workers would only move the
    indexing (issue 22), so PM201 reports it with that reason and does not fix it."""
    source, result = seed_rewrite
    line = line_of(source.decode(), EXPECTED_FINDINGS["PM102"][0])
    (finding,) = [f for f in result.findings if f.code == "PM201"]
    assert finding.line == line and not finding.fixable
    assert "only indexes tensors the training process already holds" in finding.message


def line_of(source: str, text: str) -> int:
    lines = [number for number, line in enumerate(source.splitlines(), 1) if line.strip() == text]
    assert len(lines) == 1, f"expected exactly one line {text!r} in the script, found {len(lines)}"
    return lines[0]


def run_steps(script: Path, out: Path, *extra: str) -> subprocess.Popen:
    """Start `script` for STEPS steps on CPU with seed 0; output goes to `out`."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    command = [
        sys.executable,
        str(script),
        "--steps",
        str(STEPS),
        "--seed",
        "0",
        "--batch-size",
        "8",
        "--out",
        str(out),
        *extra,
    ]
    return subprocess.Popen(command, cwd=out.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def losses(process: subprocess.Popen) -> list[str]:
    """The per-step losses as float.hex strings, in step order."""
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    steps = STEP_LINE.findall(stdout)
    assert [int(step) for step, _ in steps] == list(range(STEPS)), stdout
    assert "tokens/s" in stdout.splitlines()[-1]
    values = [loss for _, loss in steps]
    assert all(math.isfinite(float.fromhex(v)) for v in values), values
    return values


@pytest.fixture(scope="module")
def seed_rewrite():
    source = SEED.read_bytes()
    return source, process_source(source, str(SEED), Settings())


def test_safe_level_rewrites_the_seed_script(seed_rewrite):
    source, result = seed_rewrite
    assert result.error is None
    assert result.changed
    compile(result.new_source, str(SEED), "exec")
    assert all(f.level <= Level.SAFE for f in result.pending)


@pytest.mark.parametrize("code", sorted(EXPECTED_FINDINGS))
def test_expected_rules_fire_on_the_seed_script(seed_rewrite, code):
    if code not in RULES_BY_CODE:
        assert code != "PM101", "PM101 is the rule this test was written against"
        pytest.skip(f"{code} is not in the registry yet")
    source, result = seed_rewrite
    text = source.decode()
    fixable_lines = {f.line for f in result.findings if f.code == code and f.fixable}
    for expected in EXPECTED_FINDINGS[code]:
        assert line_of(text, expected) in fixable_lines, f"{code} offers no fix for {expected!r}"


def test_findings_point_at_the_offending_code_not_at_the_loop_their_fix_replaces():
    # PM301, PM404 and PM405 edit across the loop; the user is pointed at the forward
    # pass, the sync and the save (where `# perfmod: ignore` then goes).
    text = SEED.read_text()
    result = process_source(SEED.read_bytes(), str(SEED), Settings(level=Level.UNSAFE))
    lines = {f.code: f.line for f in result.findings if f.code in ("PM301", "PM404", "PM405")}
    assert lines == {
        "PM301": line_of(text, "latents = encoder(question_ids)"),
        "PM404": line_of(text, 'print(f"step {step} loss {float.hex(loss.item())}", flush=True)'),
        "PM405": line_of(text, "torch.save("),
    }


@pytest.mark.slow
def test_rewritten_seed_script_trains_bit_for_bit_like_the_original(seed_rewrite, tmp_path):
    _, result = seed_rewrite
    rewritten = tmp_path / "seed_latentwire_perfmod.py"
    rewritten.write_bytes(result.new_source)
    original_out, rewritten_out = tmp_path / "original", tmp_path / "rewritten"
    original_run = run_steps(SEED, original_out)
    rewritten_run = run_steps(rewritten, rewritten_out)
    original_losses, rewritten_losses = losses(original_run), losses(rewritten_run)
    assert rewritten_losses == original_losses
    assert (original_out / "checkpoint.pt").is_file() and (rewritten_out / "checkpoint.pt").is_file()


@pytest.mark.slow
def test_every_fix_at_level_unsafe_trains_within_tolerance_with_two_workers(tmp_path, monkeypatch):
    # All the rules' fixes together (prefetcher, autocast policy, fused AdamW,
    # vectorized loss, async checkpoints...): on CPU the autocast policy is off, so the
    # differences left are the fused optimizer's and the loss's summation order.
    result = process_source(SEED.read_bytes(), str(SEED), Settings(level=Level.UNSAFE))
    assert result.error is None and {"PM103", "PM405", "PM503"} <= {f.code for f in result.findings if f.applied}
    rewritten = tmp_path / "seed_latentwire_unsafe.py"
    rewritten.write_bytes(result.new_source)
    monkeypatch.setenv("PERFMOD_NUM_WORKERS", "2")
    original_run = run_steps(SEED, tmp_path / "original")
    rewritten_run = run_steps(rewritten, tmp_path / "rewritten")
    original = [float.fromhex(v) for v in losses(original_run)]
    got = [float.fromhex(v) for v in losses(rewritten_run)]
    assert got == pytest.approx(original, rel=1e-5)
    assert (tmp_path / "rewritten" / "checkpoint.pt").is_file()


def test_safe_level_finds_nothing_to_fix_in_the_optimized_script():
    source = OPTIMIZED.read_bytes()
    result = process_source(source, str(OPTIMIZED), Settings())
    assert result.error is None
    assert not result.changed
    assert [f for f in result.findings if f.level <= Level.SAFE] == []


@pytest.mark.slow
def test_optimized_script_runs(tmp_path):
    run = run_steps(OPTIMIZED, tmp_path / "out", "--workers", "0", "--log-every", "1")
    losses(run)
    assert (tmp_path / "out" / "checkpoint.pt").is_file()


# -- code shaped like the seeds' own (shared/seeds/000 LatentWire, 002 SPD) --------------------

SAVE_IN_LOOP = (
    "                torch.save(\n"
    '                    {"step": step, "encoder": encoder.state_dict(), "decoder": decoder.state_dict(),\n'
    '                     "optimizer": optimizer.state_dict()},\n'
    '                    os.path.join(args.out, "checkpoint.pt"),\n'
    "                )\n"
)
SAVE_THROUGH_HELPER = (
    '                save_checkpoint(os.path.join(args.out, "checkpoint.pt"), step, encoder, decoder, optimizer)\n'
)
HELPER = (
    "def save_checkpoint(path, step, encoder, decoder, optimizer):\n"
    '    state = {"step": step, "encoder": encoder.state_dict(), "decoder": decoder.state_dict(),\n'
    '             "optimizer": optimizer.state_dict()}\n'
    "    torch.save(state, path)\n\n\n"
)


def test_latentwire_checkpoint_helper_saves_in_the_background():
    """LatentWire saves through a helper the training loop calls (seed 000): PM405
    hands that save to the background checkpointer too."""
    source = SEED.read_text()
    assert source.count(SAVE_IN_LOOP) == 1
    source = source.replace(SAVE_IN_LOOP, SAVE_THROUGH_HELPER).replace("def main():", HELPER + "def main():")
    result = process_source(source.encode(), "latentwire.py", Settings(level=Level.UNSAFE, select=("PM405",)))
    [finding] = result.findings
    assert finding.applied and finding.line == line_of(source, "torch.save(state, path)")
    new = result.new_source.decode()
    assert "    checkpointer.save(state, path)\n" in new and new.count("checkpointer.flush()") == 1


def test_spd_shaped_script_gets_the_diagnoses_of_seed_002():
    """Seed 002 (SPD): mixed precision in an accumulating step loop (fixed), the
    safetensors checkpoints (reported: another file format), clean-up around the
    periodic evaluation (reported: its period was chosen) and none for the clean-up
    of the set-up, per-step logging of every loss term (reported)."""
    script = SCRIPTS / "seed_spd_shaped.py"
    source = script.read_text()
    result = process_source(script.read_bytes(), str(script), Settings(level=Level.UNSAFE))
    assert result.error is None
    by_code: dict[str, list] = {}
    for finding in result.findings:
        by_code.setdefault(finding.code, []).append(finding)
    [autocast] = by_code["PM301"]
    assert autocast.applied and autocast.line == line_of(
        source,
        "total_loss, terms = compute_total_loss(component_model, target_model, microbatch, args.importance_coeff)",
    )
    [save] = by_code["PM405"]
    assert not save.fixable and "safetensors" in save.message
    cleanups = by_code["PM403"]  # the two in the evaluation branch; none for `cleanup()` at set-up
    assert len(cleanups) == 2 and all(not f.fixable and "period was chosen" in f.message for f in cleanups)
    assert all(f.line > line_of(source, "if step % args.eval_freq == 0:") for f in cleanups)
    assert by_code["PM404"] and not any(f.fixable for f in by_code["PM404"])
    assert all(f.applied for f in by_code["PM402"] + by_code["PM302"])

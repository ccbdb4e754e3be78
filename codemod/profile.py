"""`perfmod profile`: where a training step's time goes, findings ranked by what they cost.

The script is prepared as `perfmod verify` prepares it (codemod/verify.py: the
same copy of its folder, the same instrumentation of its training loop) and its
original copy runs once (codemod/verify_run.run_copy) with the profiler on
(runtime/profile.py, inside the script's process: CPU activities, CUDA where
torch has it, Python stacks, the warm-up steps skipped). That process attributes
every moment of the profiled steps to the stack of the script's own lines that
led to it and to a category:

    python    the interpreter running Python (the script's or a library's)
    ops       inside torch operators: compute on the CPU, dispatch and launches on CUDA
    sync      blocked in a host-device synchronisation (.item(), .cpu(), cudaStreamSynchronize, ...)
    data      waiting for a DataLoader's next batch (making it, in a loader without workers;
              blocked until a worker's batch arrives, in one with them)
    handoff   the rest of a loader with workers: sending them indices, receiving each ready
              batch (its tensors' shared memory passed over): what workers cost, not hide
    untraced  no event open (the profiler's own bookkeeping, mostly)

plus, on CUDA, device time by launching lines and the GPU's idle time.

This half (no torch) joins that attribution to the findings of `perfmod check`
on the same files, by each finding's range (`line` to `end_line`). A finding
whose range holds another's is a setting for that region (TF32 for the whole
loop): it owns no time. Each moment goes to the finding on the innermost line
of its stack that a finding covers (at one line: the finding whose fix removes
that kind of time, then one whose saving can be measured, then the narrowest);
a data wait no finding's lines hold goes to the loader's finding (PM201,
PM103); the rest is the time no finding covers. A loop over samples or time
steps (PM502, PM503, PM505) counts everything under its lines, the findings
inside it included, since its fix runs all of it once instead of n times: its
share holds the forward, loss and backward it runs, and so shares may overlap.
A saving is estimated only where it can be said from what was measured (SAVES):

    sync  (PM404)             the syncs measured on its lines
    gc    (PM403)             all the time on its lines (the collection, the cache release)
    data  (PM201, PM103)      the data wait measured: worker processes or a prefetcher hide up to it
    loop  (PM502, PM503, PM505)  when the loop is launch-bound (its operators average under
                              LAUNCH_BOUND_US each), its n iterations become one: up to its share x (1 - 1/n)

and "not estimated" otherwise. The time no finding covers closes the table.

JSON (`perfmod profile --format json`, `ProfileResult.as_json()`), schema 1:
documented for users in docs/json.md, which names every key (tests/test_json_docs.py).
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Finding
from codemod.verify import local_modules, prepare, script_settings
from codemod.verify_run import VerifyError, run_copy

SCHEMA = 1
PROFILE_FILE = ".perfmod-profile.json"
CATEGORIES = ("python", "ops", "sync", "data", "handoff", "untraced")
LAUNCH_BOUND_US = 50.0  # operators averaging under this are dominated by dispatch / launch, not compute
TOP_LINES = 12
# Steps `verify --profile` records after the warm-up: each holds every operator event in memory.
PROFILED_STEPS = 3
SAVES = {  # what the fix of a rule removes, as the profile measures it
    "PM404": "sync",
    "PM403": "gc",
    "PM201": "data",
    "PM103": "data",
    "PM502": "loop",
    "PM503": "loop",
    "PM505": "loop",
}
UNCOVERED_ADVICE = "compute in the model: consider PM506 (torch.compile) or larger batches"
HANDOFF_NOTE_SHARE = 0.05  # a hand-off this share of the step gets a note saying what it is


class ProfileError(VerifyError):
    """profile could not run the script: the message says why (exit status 2)."""


@dataclass
class ProfileResult:
    script: str
    args: list[str]
    steps: int
    warmup: int
    seed: int
    data: dict = field(default_factory=dict)  # the JSON above, less the keys set here
    error: dict | None = None

    def as_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "script": self.script,
            "args": self.args,
            "steps": self.steps,
            "warmup": self.warmup,
            "seed": self.seed,
            **self.data,
            "error": self.error,
        }


def profile(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    steps: int = 5,
    warmup: int = 2,
    settings: Settings | None = None,
    python: str | None = None,
    seed: int = 0,
    timeout: float | None = 900.0,
    trace: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> ProfileResult:
    """Prepare `script` as verify does, run its copy `steps` steps with the profiler
    recording the steps after `warmup`, and join the attribution to its findings.
    Raises ProfileError when nothing could be run."""
    if not 1 <= warmup < steps:
        raise ProfileError(f"--warmup {warmup} with --steps {steps}: need 1 <= warmup < steps")
    script = Path(script).resolve()
    settings = script_settings(script, settings)
    folder = Path(tempfile.mkdtemp(prefix="perfmod-profile-"))
    try:
        try:
            prepare(script, folder, args, settings=settings, rewritten=script, tool="profile")
        except VerifyError as error:
            raise ProfileError(str(error)) from None
        return run_profile(
            folder,
            script,
            args,
            steps=steps,
            warmup=warmup,
            settings=settings,
            python=python,
            seed=seed,
            timeout=timeout,
            trace=trace,
            env=env,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_profile(
    folder: Path,
    script: Path,
    args: Sequence[str],
    *,
    steps: int,
    warmup: int,
    settings: Settings,
    run: str = "original",
    python: str | None = None,
    seed: int = 0,
    timeout: float | None = 900.0,
    trace: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    sources: Mapping[Path, str] | None = None,
) -> ProfileResult:
    """Profile the copy `run` of a prepared `folder` (of `script`); `sources` are the
    texts the copy was made from, by path (default: the files as they are)."""
    script = Path(script)
    files = [script, *local_modules(script)]
    relative = {path: path.relative_to(script.parent).as_posix() for path in files}
    out = folder / run / PROFILE_FILE
    out.unlink(missing_ok=True)
    environment = dict(os.environ if env is None else env)
    environment["PERFMOD_PROFILE_OUT"] = str(out)
    environment["PERFMOD_PROFILE_FILES"] = os.pathsep.join(relative.values())
    if trace is not None:
        environment["PERFMOD_PROFILE_TRACE"] = str(Path(trace).resolve())
    else:
        environment.pop("PERFMOD_PROFILE_TRACE", None)
    result = ProfileResult(str(script), list(args), steps, warmup, seed)
    returncode, traced, stderr, failure = run_copy(
        folder, run, steps=steps, warmup=warmup, args=args, python=python, seed=seed, timeout=timeout, env=environment
    )
    try:
        measured = json.loads(out.read_text())
    except (OSError, ValueError):
        measured = None
    if failure is not None or measured is None or measured.get("error"):
        why = failure or (measured or {}).get("error") or "the script ended without a profile"
        result.error = {"message": why, "stderr": stderr[-4000:]}
        return result
    texts = {path: (sources or {}).get(path) or path.read_text() for path in files}
    maps = {relative[path]: line_map((folder / run / relative[path]).read_text(), text) for path, text in texts.items()}
    findings = []
    for path, text in texts.items():
        outcome = process_source(text.encode(), str(path), settings)
        findings += [(relative[path], f) for f in outcome.findings]
    result.data = join(measured, maps, findings, traced or {})
    if trace is not None:
        result.data["trace"] = str(trace)
    return result


def line_map(copy: str, original: str) -> dict[int, int]:
    """Line numbers of the instrumented `copy` to those of the `original` (the header
    adds lines; the hooks wrap expressions where they stand)."""
    a, b = copy.splitlines(), original.splitlines()
    mapping: dict[int, int] = {}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            for offset in range(i2 - i1):
                mapping[i1 + offset + 1] = j1 + offset + 1
    return mapping


def join(
    measured: dict, maps: Mapping[str, Mapping[int, int]], findings: Sequence[tuple[str, Finding]], trace: dict
) -> dict:
    """The attribution of runtime/profile.py, on the original lines, joined to `findings`."""
    attribution = _Attribution(measured, maps, findings)
    per_step = attribution.per_step
    categories = dict.fromkeys(CATEGORIES, 0.0)
    for _, category, ns in attribution.entries:
        categories[category] = categories.get(category, 0.0) + ns * per_step
    rows = [attribution.row(index) for index in range(len(findings))]
    rows.sort(key=lambda row: (-row["ms"], row["path"], row["line"], row["code"]))
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
    lines, uncovered_lines, uncovered = attribution.by_line()
    step_ms = attribution.window * per_step
    gpu = None
    if measured.get("gpu_idle_ns") is not None:
        kernel_ms = sum(ns for _, ns in attribution.kernels) * per_step
        gpu = {"kernel_ms": kernel_ms, "idle_ms": measured["gpu_idle_ns"] * per_step}
    return {
        "device": trace.get("device"),
        "torch": trace.get("torch"),
        "profiled_steps": attribution.steps,
        "step_ms": step_ms,
        "steps_per_s": trace.get("steps_per_s"),
        "categories": categories,
        "gpu": gpu,
        "findings": rows,
        "uncovered": {
            "ms": uncovered,
            "share": uncovered / step_ms if step_ms else 0.0,
            "advice": UNCOVERED_ADVICE,
            "lines": [
                {"path": f, "line": n, "ms": ms, "share": ms / step_ms}
                for (f, n), ms in sorted(uncovered_lines.items(), key=lambda item: -item[1])[:5]
            ],
        },
        "lines": [
            {"path": f, "line": n, "ms": v["ms"], "share": v["ms"] / step_ms, "categories": v["categories"]}
            for (f, n), v in sorted(lines.items(), key=lambda item: -item[1]["ms"])[:TOP_LINES]
        ],
        "trace": None,
        "notes": _notes(categories, step_ms),
    }


class _Attribution:
    """The profile's measurements on the original lines, and the finding each moment of
    host time belongs to (`_owner`)."""

    def __init__(
        self, measured: dict, maps: Mapping[str, Mapping[int, int]], findings: Sequence[tuple[str, Finding]]
    ) -> None:
        self.steps = max(1, measured.get("steps") or 1)
        self.per_step = 1e-6 / self.steps  # ns over the window -> ms per step
        self.window = measured["window_ns"] or 1
        # (stack, category, ns) of host time, (stack, ns) of kernels, (stack, calls, ops) of calls
        self.entries = [(_placed(e["stack"], maps), e["category"], e["ns"]) for e in measured["entries"]]
        self.kernels = [(_placed(k["stack"], maps), k["ns"]) for k in measured.get("kernels") or []]
        self.counts = [(_placed(c["stack"], maps), c["calls"], c["ops"]) for c in measured.get("counts") or []]
        self.findings = findings
        self.spans = [_spans(finding) for _, finding in findings]
        self.regions = _regions(findings, self.spans)
        owning = [None if i in self.regions else span for i, span in enumerate(self.spans)]
        self.owner = [_owner(stack, category, findings, owning) for stack, category, _ in self.entries]

    def row(self, index: int) -> dict:
        """The time of the finding `index`, by category, and what its fix may save."""
        path, finding = self.findings[index]
        by_category = dict.fromkeys(CATEGORIES, 0.0)
        for i in self._entries_of(index):
            by_category[self.entries[i][1]] += self.entries[i][2] * self.per_step
        ms = sum(by_category.values())
        kernel_ms = None
        if self.kernels:
            owned = (ns for stack, ns in self.kernels if _owner(stack, "ops", self.findings, self.spans) == index)
            kernel_ms = sum(owned) * self.per_step
        spans = self.spans[index]
        first, last = min(a for a, _ in spans), max(b for _, b in spans)
        saving_ms, saving = _saving(
            SAVES.get(finding.code), by_category, ms, self.counts, path, first, last, self.steps
        )
        if index in self.regions:
            saving = "not estimated: a setting for the region it spans, which holds other findings"
        return {
            "code": finding.code,
            "name": finding.name,
            "path": path,
            "line": finding.line,
            "end_line": max(finding.line, finding.end_line or finding.line),
            "lines": [list(span) for span in spans],
            "level": finding.level.label,
            "fixable": finding.fixable,
            "message": finding.message,
            "ms": ms,
            "share": ms * 1e6 * self.steps / self.window,
            "categories": by_category,
            "kernel_ms": kernel_ms,
            "saving_ms": saving_ms,
            "saving": saving,
        }

    def _entries_of(self, index: int) -> list[int]:
        """The moments of host time the finding `index` counts: those it owns; for a loop's
        fix, which runs everything under it once instead of n times, all of it, the findings
        inside it included (so shares may overlap)."""
        path, finding = self.findings[index]
        if SAVES.get(finding.code) == "loop":
            return [i for i, (stack, _, _) in enumerate(self.entries) if _within(stack, path, self.spans[index])]
        return [i for i, who in enumerate(self.owner) if who == index]

    def by_line(self) -> tuple[dict[tuple, dict], dict[tuple, float], float]:
        """The time per innermost line of the script (by category); that no finding owns,
        per line and in all."""
        covered = {i for i, who in enumerate(self.owner) if who is not None}
        lines: dict[tuple, dict] = {}
        uncovered_lines: dict[tuple, float] = {}
        uncovered = 0.0
        for i, (stack, category, ns) in enumerate(self.entries):
            key = stack[-1] if stack else ("(outside the script's files)", 0)
            line = lines.setdefault(key, {"ms": 0.0, "categories": dict.fromkeys(CATEGORIES, 0.0)})
            line["ms"] += ns * self.per_step
            line["categories"][category] += ns * self.per_step
            if i not in covered:
                uncovered += ns * self.per_step
                uncovered_lines[key] = uncovered_lines.get(key, 0.0) + ns * self.per_step
        return lines, uncovered_lines, uncovered


def _placed(stack, maps: Mapping[str, Mapping[int, int]]) -> tuple:
    """A stack of (file, line) of the instrumented copy, on the original lines."""
    return tuple((f, maps.get(f, {}).get(n, n)) for f, n in stack)


def _notes(categories: dict[str, float], step_ms: float) -> list[str]:
    """What the profile cannot attribute to a fix but a user should know."""
    notes = []
    if step_ms and categories["handoff"] >= HANDOFF_NOTE_SHARE * step_ms:
        notes.append(
            f"handoff {categories['handoff']:.1f} ms per step ({categories['handoff'] / step_ms:.0%}): the "
            "DataLoader's worker processes sending batches and taking indices, each tensor's shared memory "
            "passed over from its worker; more workers do not hide it, fewer or larger tensors per batch make "
            "it cheaper per sample, and "
            'torch.multiprocessing.set_sharing_strategy("file_system") passes each tensor by name instead of '
            "by a connection to its worker (a process killed hard then leaves its shared memory behind)"
        )
    return notes


def _spans(finding: Finding) -> list[tuple[int, int]]:
    """The lines of a finding: its range."""
    return [(finding.line, max(finding.line, finding.end_line or finding.line))]


def _regions(findings, spans) -> set[int]:
    """Findings that are settings for a region (TF32 for the loop, say): their range holds
    another finding's. They own no time (the loop's lines are not theirs); a loop over
    samples or time steps (SAVES "loop") is no region: it counts all it holds."""
    regions = set()
    for i, (path, finding) in enumerate(findings):
        if SAVES.get(finding.code) == "loop":
            continue
        ((a, b),) = spans[i]
        for j, (other_path, _) in enumerate(findings):
            if j != i and other_path == path and spans[j] != spans[i]:
                ((c, d),) = spans[j]
                if a <= c and d <= b:
                    regions.add(i)
                    break
    return regions


def _within(stack, path: str, spans: list[tuple[int, int]]) -> bool:
    return any(f == path and any(a <= n <= b for a, b in spans) for f, n in stack)


def _owner(stack, category, findings, spans) -> int | None:
    """The finding a moment belongs to: the one on the innermost line of its stack that
    some finding covers. At one line: one whose fix removes this category of time (a sync,
    a data wait), then one whose saving can be measured (SAVES: the loop around a call
    rather than a setting that spans the loop), then the narrowest."""
    for file, line in reversed(stack):
        here = [
            i
            for i, (path, _) in enumerate(findings)
            if spans[i] is not None and path == file and any(a <= line <= b for a, b in spans[i])
        ]
        if here:
            return max(
                here,
                key=lambda i: (
                    SAVES.get(findings[i][1].code) == category,
                    findings[i][1].code in SAVES,
                    -max(b - a for a, b in spans[i]),
                    -i,
                ),
            )
    if category == "data":
        data = [i for i, (_, finding) in enumerate(findings) if SAVES.get(finding.code) == "data"]
        if data:
            return data[0]
    return None


def _saving(kind, by_category, ms, counts, path, first, last, steps) -> tuple[float | None, str]:
    if kind == "sync":
        return by_category["sync"], "the host-device syncs measured on its lines"
    if kind == "gc":
        return ms, "the time measured on its lines (the collection or cache release itself)"
    if kind == "data":
        if by_category["data"] <= 0:
            return None, "not estimated: no data wait was measured"
        return by_category["data"], "up to the data wait measured: worker processes or a prefetcher hide it"
    if kind == "loop":
        ops = sum(o for stack, _, o in counts if any(f == path and first <= n <= last for f, n in stack)) / steps
        calls: dict[int, int] = {}
        for stack, c, _ in counts:
            if stack and stack[-1][0] == path and first <= stack[-1][1] <= last:
                calls[stack[-1][1]] = calls.get(stack[-1][1], 0) + c
        iterations = max(calls.values(), default=0) / steps
        if ops <= 0 or iterations < 2:
            return None, "not estimated: the loop's iterations were not counted"
        mean_us = by_category["ops"] * 1e3 / ops
        if mean_us >= LAUNCH_BOUND_US:
            return None, f"not estimated: its operators average {mean_us:.0f} us (compute-bound, not launch-bound)"
        return ms * (1 - 1 / iterations), (
            f"launch-bound (operators average {mean_us:.0f} us): about {iterations:.0f} iterations per step "
            "become one, up to its time x (1 - 1/n)"
        )
    return None, "not estimated"


# -- output ------------------------------------------------------------------------------------


def render_json(result: ProfileResult) -> str:
    return json.dumps(result.as_json(), indent=2)


def error_json(script: str | Path, message: str) -> str:
    return json.dumps(
        {"schema": SCHEMA, "script": str(script), "findings": None, "error": {"message": message, "stderr": ""}},
        indent=2,
    )


def render_text(result: ProfileResult) -> str:
    lines = [f"perfmod profile {result.script}"]
    if result.error is not None:
        lines.append(f"FAILED: {result.error['message']}")
        if result.error["stderr"].strip():
            lines += ["--- stderr (last lines) ---", result.error["stderr"].rstrip()]
        return "\n".join(lines) + "\n"
    data = result.data
    step = data["step_ms"]
    speed = f", {data['steps_per_s']:.3g} steps/s with the profiler on" if data.get("steps_per_s") else ""
    lines.append(
        f"{data['profiled_steps']} steps profiled after {result.warmup} warm-up; device {data['device']}; "
        f"torch {data['torch']}; {step:.1f} ms per step{speed}"
    )
    parts = [f"{name} {ms:.1f} ms ({ms / step:.0%})" for name, ms in data["categories"].items() if ms > 0]
    lines.append("step time: " + ", ".join(parts))
    if data.get("gpu"):
        gpu = data["gpu"]
        lines.append(
            f"GPU: kernels {gpu['kernel_ms']:.1f} ms per step, idle {gpu['idle_ms']:.1f} ms ({gpu['idle_ms'] / step:.0%})"
        )
    lines += ["", "findings by measured share of the step (shares may overlap):"]
    header = f"| {'#':>2} | {'finding':<34} | {'level':<7} | {'fix':<3} | {'ms/step':>8} | {'share':>6} | saving"
    lines += [header, "|" + "-" * (len(header) - 1)]
    for row in data["findings"]:
        name = f"{row['code']} {Path(row['path']).name}:{row['line']}"
        saving = (
            f"{row['saving_ms']:.1f} ms ({row['saving_ms'] / step:.0%}): {row['saving']}"
            if row["saving_ms"] is not None
            else row["saving"]
        )
        lines.append(
            f"| {row['rank']:>2} | {name:<34} | {row['level']:<7} | {'yes' if row['fixable'] else 'no':<3} | "
            f"{row['ms']:>8.1f} | {row['share']:>6.1%} | {saving}"
        )
    uncovered = data["uncovered"]
    lines += [
        "",
        f"not covered by any finding: {uncovered['ms']:.1f} ms per step ({uncovered['share']:.0%}): "
        f"{uncovered['advice']}",
    ]
    for line in uncovered["lines"]:
        lines.append(f"  {line['path']}:{line['line']}: {line['ms']:.1f} ms ({line['share']:.0%})")
    if data.get("trace"):
        lines.append(f"Chrome trace of the profiled steps: {data['trace']} (open in https://ui.perfetto.dev)")
    lines += [f"note: {note}" for note in data.get("notes", [])]
    return "\n".join(lines) + "\n"

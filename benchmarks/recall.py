"""Recall on the wild corpus: of the anti-pattern instances other people wrote
(fixtures/wild/, conventions in its README), how many perfmod reports and
fixes, and whether the rewritten programs still train the same.

    python -m benchmarks.recall                    # every rule, static and runs
    python -m benchmarks.recall --no-run           # findings only (seconds)
    python -m benchmarks.recall --rules PM101,PM5  # some rules
    python -m benchmarks.recall --format json

Static part: every file is processed at level unsafe with every rule selected
(opt-in ones too). A finding matches the nearest unmatched marker of its code
whose line lies in the finding's lines or within three lines of its first line;
matched markers are *reported*, and *fixed* when the finding's fix was applied.
A marker with no finding of its own counts as fixed when the applied fix of a
rule that does its work (`DONE_BY`) rewrote its line.
Findings of a negative file's codes are false positives; applied fixes of them
are wrong fixes. Other findings on unmarked lines are listed as *unexpected*, for
review (a true instance the author did not mark, or a false positive).

Runs: each runnable file and its rewrite run in a fresh folder with the same
environment; their WILD_LOSSES are compared at the highest level of the fixes
applied to the file (exact for safe; relative 1e-3 for numeric; the last loss
within 10% for unsafe fixes, which may change random streams or data order as
their docs say, and for `compare=final` files). Programs run with one intra-op
thread, so that a background thread of a rewrite cannot change the rounding of
CPU reductions. A rewrite that does not compile, crashes, or
trains differently is a wrong fix, blamed on the rules whose fixes alone
reproduce the difference (all of the file's rules when none does alone).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import FileResult, Level
from codemod.rules import ALL_RULES

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "fixtures" / "wild"
MARKER = re.compile(r"#\s*expect:\s*(?P<items>PM\d{3}(?:\s+(?:fix|report))?(?:\s*,\s*PM\d{3}(?:\s+(?:fix|report))?)*)")
ITEM = re.compile(r"(PM\d{3})(?:\s+(fix|report))?")
HEADER = re.compile(r"#\s*wild:\s*(?P<value>.*)")
HEADER_LINES = 15
NEAR = 3  # lines around a finding's first line where its marker may sit
LOSSES = re.compile(r"^WILD_LOSSES\s+(\[.*\])\s*$", re.M)
NUMERIC_RTOL = 1e-3
FINAL_RTOL = 0.10
# A rule whose applied fix removes a marked instance of another and does its work:
# PM103's prefetcher copies each batch without blocking, on a side stream, in place
# of the marked blocking copy (the engine leaves PM101 nothing to report there).
DONE_BY = {"PM101": ("PM103",)}


@dataclass
class Marker:
    code: str
    line: int
    expects_fix: bool
    reported: bool = False
    fixed: bool = False
    fixed_by: str = ""  # the code of another rule whose fix removed this instance


@dataclass
class Program:
    path: Path
    markers: list[Marker]
    negative: set[str]
    runnable: bool
    compare_final: bool


@dataclass
class FileOutcome:
    program: Program
    result: FileResult
    unexpected: list[str] = field(default_factory=list)  # "path:line CODE message"
    false_positives: list[str] = field(default_factory=list)
    wrong: dict[str, str] = field(default_factory=dict)  # code -> why
    run: str = "not runnable"


def parse_program(path: Path) -> Program:
    lines = path.read_text(encoding="utf-8").splitlines()
    markers = []
    for number, text in enumerate(lines, start=1):
        match = MARKER.search(text)
        if match:
            for code, kind in ITEM.findall(match.group("items")):
                markers.append(Marker(code, number, kind != "report"))
    negative: set[str] = set()
    runnable = compare_final = False
    for text in lines[:HEADER_LINES]:
        match = HEADER.match(text.strip())
        if not match:
            continue
        value = match.group("value")
        if value.startswith("negative"):
            negative |= set(re.findall(r"PM\d{3}", value))
        runnable = runnable or value.strip() == "runnable" or value.startswith("runnable")
        compare_final = compare_final or "compare=final" in value
    return Program(path, markers, negative, runnable, compare_final)


def corpus(root: Path = CORPUS) -> list[Program]:
    return [parse_program(path) for path in sorted(root.rglob("*.py"))]


def settings_for(codes: tuple[str, ...] | None = None) -> Settings:
    """Every rule, opt-in ones included, at level unsafe (or only `codes`)."""
    select = codes if codes is not None else tuple(rule.CODE for rule in ALL_RULES)
    return Settings(level=Level.UNSAFE, select=select)


def analyse(program: Program, codes: tuple[str, ...] | None = None) -> FileOutcome:
    data = program.path.read_bytes()
    result = process_source(data, str(program.path), settings_for(codes))
    outcome = FileOutcome(program, result)
    if result.error:
        return outcome
    for finding in sorted(result.findings, key=lambda f: (f.line, f.column)):
        label = f"{_relative(program.path)}:{finding.line} {finding.code} {finding.message}"
        if finding.code in program.negative:
            outcome.false_positives.append(label)
            if finding.applied:
                outcome.wrong[finding.code] = f"fixed a negative: {label}"
            continue
        marker = _nearest(program.markers, finding)
        if marker is None:
            if not any(m.code == finding.code and m.reported and m.line == finding.line for m in program.markers):
                outcome.unexpected.append(label)  # (a second copy on a marked line is the same instance)
            continue
        marker.reported = True
        marker.fixed = finding.applied
    _credit_done_by(program.markers, result.findings)
    return outcome


def _credit_done_by(markers: list[Marker], findings) -> None:
    """Count as fixed the unmatched markers whose line an applied fix of a rule in
    DONE_BY rewrote."""
    for marker in markers:
        if marker.reported:
            continue
        for finding in findings:
            rewrote = any(first <= marker.line <= last for first, last in finding.fix_lines)
            if finding.applied and finding.code in DONE_BY.get(marker.code, ()) and rewrote:
                marker.reported = marker.fixed = True
                marker.fixed_by = finding.code
                break


def _nearest(markers: list[Marker], finding) -> Marker | None:
    last = max(finding.end_line or finding.line, finding.line)
    candidates = [
        m
        for m in markers
        if m.code == finding.code
        and not m.reported
        and (finding.line <= m.line <= last or abs(m.line - finding.line) <= NEAR)
    ]
    return min(candidates, key=lambda m: abs(m.line - finding.line), default=None)


# -- runs ----------------------------------------------------------------------------------


def run_program(source: bytes, name: str, timeout: float) -> tuple[list[float] | None, str]:
    """Run `source` in a fresh folder; its losses, or None and why."""
    with tempfile.TemporaryDirectory(prefix="perfmod-recall-") as folder:
        script = Path(folder) / name
        script.write_bytes(source)
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "PYTHONHASHSEED": "0",
            "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
            # One intra-op thread: a background thread of the rewrite (a checkpoint writer)
            # must not change how CPU reductions are split, hence their rounding.
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        try:
            done = subprocess.run(
                [sys.executable, script.name], cwd=folder, env=env, capture_output=True, timeout=timeout, text=True
            )
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:.0f} s"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"exit {done.returncode}: {tail[0][:200]}"
        match = LOSSES.search(done.stdout)
        if not match:
            return None, "printed no WILD_LOSSES line"
        try:
            return [float(v) for v in json.loads(match.group(1))], ""
        except (ValueError, TypeError) as error:
            return None, f"unreadable WILD_LOSSES: {error}"


def agree(before: list[float], after: list[float], level: Level, final_only: bool) -> str:
    """Why the losses disagree at `level`, or an empty string."""
    if final_only or level == Level.UNSAFE:  # unsafe fixes may change random streams or data order
        if not before or not after:
            return "no losses"
        a, b = before[-1], after[-1]
        return "" if abs(a - b) <= FINAL_RTOL * max(abs(a), 1e-12) else f"last loss {a:.6g} -> {b:.6g}"
    if len(before) != len(after):
        return f"{len(before)} losses -> {len(after)}"
    for step, (a, b) in enumerate(zip(before, after)):
        if level == Level.SAFE:
            same = a == b or (math.isnan(a) and math.isnan(b))
        else:
            same = abs(a - b) <= NUMERIC_RTOL * max(abs(a), abs(b), 1e-12)
        if not same:
            return f"step {step}: {a:.9g} -> {b:.9g}"
    return ""


def check_runs(outcome: FileOutcome, timeout: float) -> None:
    program, result = outcome.program, outcome.result
    if not program.runnable or result.error:
        return
    before, why = run_program(result.source, program.path.name, timeout)
    if before is None:
        outcome.run = f"original fails ({why})"
        return
    if not result.changed:
        outcome.run = "unchanged"
        return
    applied = sorted({f.code for f in result.pending})
    failure = _compare(program, result.new_source, before, max(f.level for f in result.pending), timeout)
    if not failure:
        outcome.run = "same losses"
        return
    outcome.run = f"differs: {failure}"
    culprits = []
    for code in applied:
        alone = process_source(result.source, str(program.path), settings_for((code,)))
        if alone.changed and _compare(program, alone.new_source, before, max(f.level for f in alone.pending), timeout):
            culprits.append(code)
    for code in culprits or applied:
        outcome.wrong.setdefault(code, f"{_relative(program.path)}: {failure}")


def _compare(program: Program, source: bytes, before: list[float], level: Level, timeout: float) -> str:
    try:
        compile(source, str(program.path), "exec")
    except SyntaxError as error:
        return f"rewrite does not compile: {error.msg} (line {error.lineno})"
    after, why = run_program(source, program.path.name, timeout)
    if after is None:
        return f"rewrite fails ({why})"
    return agree(before, after, level, program.compare_final)


# -- the table --------------------------------------------------------------------------------


@dataclass
class RuleRow:
    code: str
    files: int = 0
    instances: int = 0
    fix_instances: int = 0
    reported: int = 0
    fixed: int = 0  # of the instances marked fix
    fixed_report_only: int = 0  # instances marked report that got a fix
    false_positives: int = 0
    unexpected: int = 0
    wrong: int = 0

    @property
    def report_rate(self) -> float:
        return self.reported / self.instances if self.instances else math.nan

    @property
    def fix_rate(self) -> float:
        return self.fixed / self.fix_instances if self.fix_instances else math.nan


def table(outcomes: list[FileOutcome], codes: list[str]) -> list[RuleRow]:
    rows = {code: RuleRow(code) for code in codes}
    for outcome in outcomes:
        seen = set()
        for marker in outcome.program.markers:
            row = rows.get(marker.code)
            if row is None:
                continue
            seen.add(marker.code)
            row.instances += 1
            row.reported += marker.reported
            if marker.expects_fix:
                row.fix_instances += 1
                row.fixed += marker.fixed
            elif marker.fixed:
                row.fixed_report_only += 1
        for code in seen:
            rows[code].files += 1
        for label in outcome.false_positives:
            code = label.split()[1]
            if code in rows:
                rows[code].false_positives += 1
        for label in outcome.unexpected:
            code = label.split()[1]
            if code in rows:
                rows[code].unexpected += 1
        for code in outcome.wrong:
            if code in rows:
                rows[code].wrong += 1
    return [rows[code] for code in codes]


def markdown(rows: list[RuleRow], outcomes: list[FileOutcome], ran: bool) -> str:
    lines = [
        "| rule | files | instances (fix) | reported | fixed (of fix) | fixed though marked report | "
        "false positives | unexpected | wrong fixes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.code} | {r.files} | {r.instances} ({r.fix_instances}) | {r.reported} ({_pct(r.report_rate)}) | "
            f"{r.fixed} ({_pct(r.fix_rate)}) | {r.fixed_report_only} | {r.false_positives} | {r.unexpected} | "
            f"{r.wrong if ran else 'not run'} |"
        )
    errors = [o for o in outcomes if o.result.error]
    runnable = [o for o in outcomes if o.program.runnable]
    lines.append("")
    lines.append(f"{len(outcomes)} files, {len(runnable)} runnable, {len(errors)} with errors.")
    if ran:
        counts: dict[str, int] = {}
        for o in runnable:
            key = o.run.split(" (")[0].split(":")[0]
            counts[key] = counts.get(key, 0) + 1
        lines.append("Runs: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + ".")
    return "\n".join(lines)


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.0f}%"


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def evaluate(root: Path = CORPUS, run: bool = True, jobs: int = 0, timeout: float = 120.0) -> list[FileOutcome]:
    programs = corpus(root)
    outcomes = [analyse(program) for program in programs]
    if run:
        with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            list(pool.map(lambda o: check_runs(o, timeout), outcomes))
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="folder of the corpus (default: fixtures/wild)")
    parser.add_argument("--rules", help="comma-separated codes or prefixes to show (default: all)")
    parser.add_argument("--no-run", action="store_true", help="findings only; do not run the programs")
    parser.add_argument("--jobs", type=int, default=0, help="programs run at once (default: one per CPU)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per program run")
    parser.add_argument("--format", choices=["markdown", "json"], default="markdown")
    parser.add_argument(
        "--details", action="store_true", help="also list missed instances, unexpected findings and wrong fixes"
    )
    args = parser.parse_args(argv)
    codes = [rule.CODE for rule in ALL_RULES]
    if args.rules:
        prefixes = [p.strip().upper() for p in args.rules.split(",") if p.strip()]
        codes = [c for c in codes if any(c.startswith(p) for p in prefixes)]
    outcomes = evaluate(args.corpus, run=not args.no_run, jobs=args.jobs, timeout=args.timeout)
    rows = table(outcomes, codes)
    if args.format == "json":
        print(
            json.dumps(
                {
                    "rules": [{**vars(r), "report_rate": r.report_rate, "fix_rate": r.fix_rate} for r in rows],
                    "files": [
                        {
                            "path": _relative(o.program.path),
                            "error": o.result.error,
                            "run": o.run,
                            "missed": [
                                f"{m.code}:{m.line}" for m in o.program.markers if not m.reported and m.code in codes
                            ],
                            "unfixed": [
                                f"{m.code}:{m.line}"
                                for m in o.program.markers
                                if m.reported and m.expects_fix and not m.fixed and m.code in codes
                            ],
                            "fixed_by_another_rule": {
                                f"{m.code}:{m.line}": m.fixed_by for m in o.program.markers if m.fixed_by
                            },
                            "unexpected": o.unexpected,
                            "false_positives": o.false_positives,
                            "wrong": o.wrong,
                        }
                        for o in outcomes
                    ],
                },
                indent=2,
            )
        )
        return 0
    print(markdown(rows, outcomes, ran=not args.no_run))
    if args.details:
        for o in outcomes:
            missed = [f"{m.code}:{m.line}" for m in o.program.markers if m.code in codes and not m.reported]
            unfixed = [
                f"{m.code}:{m.line}"
                for m in o.program.markers
                if m.code in codes and m.reported and m.expects_fix and not m.fixed
            ]
            done = [f"{m.code}:{m.line} ({m.fixed_by})" for m in o.program.markers if m.code in codes and m.fixed_by]
            notes = [
                f"missed {', '.join(missed)}" if missed else "",
                f"not fixed {', '.join(unfixed)}" if unfixed else "",
                f"fixed by another rule {', '.join(done)}" if done else "",
                f"error {o.result.error}" if o.result.error else "",
                f"run: {o.run}" if o.program.runnable else "",
            ]
            notes += [f"unexpected {u}" for u in o.unexpected] + [f"WRONG {c}: {w}" for c, w in o.wrong.items()]
            notes = [n for n in notes if n]
            if notes:
                print(f"\n{_relative(o.program.path)}")
                for note in notes:
                    print(f"  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

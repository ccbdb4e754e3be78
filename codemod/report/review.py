"""What the review page and the markdown summary share: the findings counted
by rule, the rules' expected gains, and the `perfmod verify --format json`
document they show when given one."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from codemod.docs import page_path
from codemod.report.summary import Summary
from codemod.rule import Finding, Level, Rule

# The keys without which a verify document says nothing about the rewrite.
VERIFY_REQUIRED = ("original", "rewritten", "agree")


class VerifyError(ValueError):
    """A --verify-json file that cannot be read or is not a verify result."""


@dataclass(frozen=True)
class RuleRow:
    """One rule's line in the summary table."""

    code: str
    name: str
    level: str  # the rule's own level
    fixed: int  # findings fixed at the chosen level
    higher: int  # fixable only at a higher level
    report_only: int
    gain: str
    summary: str
    docs: str  # the rule's page, relative to the perfmod repository root


def rule_rows(summary: Summary, rules: Sequence[type[Rule]]) -> list[RuleRow]:
    """A row per rule with findings, in catalogue order; a finding of a rule
    that is not in `rules` (a plugin gone since) still gets its row."""
    by_code = {rule.CODE: rule for rule in rules}
    codes = sorted({f.code for f in summary.findings})
    rows = []
    for code in codes:
        found = [f for f in summary.findings if f.code == code]
        rule = by_code.get(code)
        rows.append(
            RuleRow(
                code=code,
                name=rule.NAME if rule else found[0].name,
                level=rule.LEVEL.label if rule else found[0].level.label,
                fixed=sum(1 for f in found if f.applied),
                higher=sum(1 for f in found if f.fixable and not f.applied),
                report_only=sum(1 for f in found if not f.fixable),
                gain=rule.GAIN if rule else "",
                summary=rule.summary() if rule else found[0].message,
                docs=page_path(rule) if rule else "",
            )
        )
    return rows


def status(finding: Finding) -> str:
    """What happens to the finding at the chosen level, with the flag that would fix it."""
    if finding.applied:
        return "fixed"
    if finding.fixable:
        return f"fix with --level {finding.level.label}"
    return "report only"


def level_counts(findings: Sequence[Finding]) -> dict[str, int]:
    """Findings by the level their fix needs (report-only ones by their rule's level)."""
    return {level.label: sum(1 for f in findings if f.level == level) for level in Level}


def load_verify(path: Path) -> dict:
    """The verify document at `path`; VerifyError names what is wrong with it."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise VerifyError(f"cannot read {path}: {error.strerror or error}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise VerifyError(f"{path} is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise VerifyError(f"{path} is not a `perfmod verify --format json` result: expected an object")
    missing = [key for key in VERIFY_REQUIRED if key not in document]
    if missing:
        raise VerifyError(
            f"{path} is not a `perfmod verify --format json` result: missing {', '.join(repr(k) for k in missing)}"
        )
    for side in ("original", "rewritten"):
        if not isinstance(document[side], dict):
            raise VerifyError(f"{path}: {side!r} should be an object with the run's measurements")
    return document


@dataclass(frozen=True)
class VerifyRow:
    label: str
    original: str
    rewritten: str


# (label, key in each side, format) in the order the table shows them.
VERIFY_METRICS = (
    ("steps/s", "steps_per_s", "{:,.2f}"),
    ("samples/s", "samples_per_s", "{:,.1f}"),
    ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("peak memory", "peak_memory_bytes", None),
    ("final loss", "losses", None),
)


def verify_rows(document: dict) -> list[VerifyRow]:
    """The measurements either side has, formatted; keys neither side has are left out."""
    original, rewritten = document["original"], document["rewritten"]
    rows = []
    for label, key, form in VERIFY_METRICS:
        if key not in original and key not in rewritten:
            continue
        if key == "peak_memory_bytes":
            label = f"peak memory ({original.get('peak_memory_kind') or rewritten.get('peak_memory_kind') or '?'})"
        rows.append(VerifyRow(label, _metric(original.get(key), form), _metric(rewritten.get(key), form)))
    return rows


def _metric(value, form: str | None) -> str:
    if value is None:
        return "–"
    if isinstance(value, list):  # losses: the last one
        return _metric(value[-1], "{:.6g}") if value else "–"
    if form is None and isinstance(value, (int, float)):
        return byte_size(value)
    try:
        return form.format(value) if form else str(value)
    except (ValueError, TypeError):
        return str(value)


def byte_size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    return f"{count:,.1f} GiB"


def verify_facts(document: dict) -> list[tuple[str, str]]:
    """The run's settings and outcome as (label, text), for the keys present."""
    facts = []
    for key, label in (
        ("script", "script"),
        ("device", "device"),
        ("level", "level"),
        ("steps", "steps"),
        ("warmup", "warm-up steps"),
    ):
        if document.get(key) is not None:
            facts.append((label, str(document[key])))
    if document.get("nproc") is not None:  # schema 2: the rewrite ran under torchrun
        facts.append(("processes (rewrite, torchrun)", str(document["nproc"])))
    speedup = document.get("speedup")
    if isinstance(speedup, (int, float)):
        facts.append(("speed-up", f"{speedup:.2f}x" + _spread(document.get("speed"))))
    for key, label in (
        ("max_abs_deviation", "max abs loss deviation"),
        ("max_rel_deviation", "max rel loss deviation"),
    ):
        if isinstance(document.get(key), (int, float)):
            facts.append((label, f"{document[key]:.3g}"))
    tolerance = document.get("tolerance")
    if isinstance(tolerance, dict) and tolerance:
        facts.append(("tolerance", ", ".join(f"{k}={v}" for k, v in tolerance.items())))
    elif tolerance is not None:
        facts.append(("tolerance", str(tolerance)))
    return facts


def verify_fixes(document: dict) -> list[str]:
    """The fixes the verified rewrite applied, one line each, whatever their shape."""
    fixes = document.get("fixes") or []
    if not isinstance(fixes, list):
        return [str(fixes)]
    lines = []
    for fix in fixes:
        if isinstance(fix, dict):
            where = ":".join(str(fix[k]) for k in ("path", "line") if k in fix)
            text = " ".join(str(fix[k]) for k in ("code", "message") if k in fix)
            lines.append(f"{where} {text}".strip() or json.dumps(fix, sort_keys=True))
        else:
            lines.append(str(fix))
    return lines


def verify_headline(document: dict) -> str:
    """One sentence: agree or not, and the speed-up when there is one."""
    agree = document.get("agree")
    text = (
        "losses agree within tolerance"
        if agree is True
        else ("losses DO NOT agree within tolerance" if agree is False else f"agreement unknown ({agree!r})")
    )
    speedup = document.get("speedup")
    if isinstance(speedup, (int, float)):
        text += f"; {speedup:.2f}x speed-up" + _spread(document.get("speed"))
    return text


def verify_slower(document: dict) -> bool:
    """Whether verify measured the rewrite slower than the original (its exit status 3)."""
    speed = document.get("speed")
    return isinstance(speed, dict) and speed.get("verdict") == "slower"


def _spread(speed) -> str:
    """The speed-up's range over verify's rounds and its verdict, where the document has
    them ("speed", codemod/verify_run.py); "" for a document without."""
    if not isinstance(speed, dict):
        return ""
    rounds, low, high, verdict = (speed.get(key) for key in ("rounds", "low", "high", "verdict"))
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
        return " (one round: no spread to tell it from noise)" if rounds == 1 else ""
    shown = {"slower": "the rewrite is SLOWER"}.get(verdict, verdict)
    return f" (95% range {low:.2f}x–{high:.2f}x over {rounds} rounds: {shown})"


@dataclass(frozen=True)
class LossChart:
    """Both runs' losses per step as SVG polyline points, on one scale."""

    width: int
    height: int
    original: str
    rewritten: str
    low: str  # the scale's ends, as labels
    high: str
    steps: int


def loss_chart(document: dict, width: int = 480, height: int = 120) -> LossChart | None:
    """The chart of the two loss curves, or None without two finite points on each side."""
    curves = [_finite_losses(document[side].get("losses")) for side in ("original", "rewritten")]
    if any(len([v for v in curve if v is not None]) < 2 for curve in curves):
        return None
    values = [v for curve in curves for v in curve if v is not None]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    steps = max(len(curve) for curve in curves)
    pad = 4  # keeps the stroke inside the box

    def points(curve: list[float | None]) -> str:
        return " ".join(
            f"{pad + (width - 2 * pad) * i / (steps - 1):.1f},{pad + (height - 2 * pad) * (high - v) / span:.1f}"
            for i, v in enumerate(curve)
            if v is not None
        )

    return LossChart(width, height, points(curves[0]), points(curves[1]), f"{low:.4g}", f"{high:.4g}", steps)


def _finite_losses(losses) -> list[float | None]:
    """The losses as floats, None where one is missing or not finite (a NaN step)."""
    if not isinstance(losses, list):
        return []
    return [float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None for v in losses]


# -- profile ---------------------------------------------------------------------------------

PROFILE_REQUIRED = ("findings", "categories", "step_ms", "uncovered")
# Colours of the step's categories in the page's stacked bar (and its legend).
CATEGORY_COLOURS = {
    "python": "#8250df",
    "ops": "#0969da",
    "sync": "#cf222e",
    "data": "#bf8700",
    "handoff": "#d4a72c",
    "untraced": "#afb8c1",
}


def load_profile(path: Path) -> dict:
    """The `perfmod profile --format json` document at `path` (or the profile of one run
    of a `perfmod verify --profile` document: its rewritten run's, else its original's);
    VerifyError names what is wrong with it."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise VerifyError(f"cannot read {path}: {error.strerror or error}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise VerifyError(f"{path} is not JSON: {error}") from None
    if isinstance(document, dict) and isinstance(document.get("profile"), dict):
        runs = document["profile"]
        document = runs.get("rewritten") or runs.get("original")
    if not isinstance(document, dict):
        raise VerifyError(f"{path} is not a `perfmod profile --format json` result: expected an object")
    if document.get("error"):
        raise VerifyError(f"{path}: the profile failed: {document['error'].get('message')}")
    missing = [key for key in PROFILE_REQUIRED if key not in document]
    if missing:
        raise VerifyError(
            f"{path} is not a `perfmod profile --format json` result: missing {', '.join(repr(k) for k in missing)}"
        )
    return document


@dataclass(frozen=True)
class ProfileSegment:
    category: str
    percent: float  # of the step, for the bar's width
    ms: float
    colour: str


@dataclass(frozen=True)
class ProfileBar:
    rank: int
    code: str
    where: str
    level: str
    fixable: bool
    percent: float
    ms: float
    saving: str


def profile_segments(document: dict) -> list[ProfileSegment]:
    """The step by category, for the stacked bar: every category with time, in a fixed order."""
    step = document["step_ms"] or 1.0
    return [
        ProfileSegment(name, 100.0 * ms / step, ms, CATEGORY_COLOURS.get(name, "#6e7781"))
        for name, ms in document["categories"].items()
        if ms > 0
    ]


def profile_bars(document: dict) -> list[ProfileBar]:
    """A bar per finding, ranked, then one for the time no finding covers (rank 0, code "-")."""
    bars = []
    for row in document["findings"]:
        saving = (
            f"saves up to {row['saving_ms']:.1f} ms: {row['saving']}" if row["saving_ms"] is not None else row["saving"]
        )
        bars.append(
            ProfileBar(
                row["rank"],
                row["code"],
                f"{row['path']}:{row['line']}",
                row["level"],
                row["fixable"],
                100.0 * row["share"],
                row["ms"],
                saving,
            )
        )
    uncovered = document["uncovered"]
    bars.append(
        ProfileBar(0, "-", "no finding", "", False, 100.0 * uncovered["share"], uncovered["ms"], uncovered["advice"])
    )
    return bars


def profile_headline(document: dict) -> str:
    speed = f", {document['steps_per_s']:.3g} steps/s with the profiler on" if document.get("steps_per_s") else ""
    return (
        f"{document.get('script', '')}: {document.get('profiled_steps', '?')} steps profiled on "
        f"{document.get('device') or 'an unknown device'}; {document['step_ms']:.1f} ms per step{speed}"
    )

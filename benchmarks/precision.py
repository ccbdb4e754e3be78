"""Precision on code written elsewhere: is each fix perfmod applies right and worth
its line, and is each report's reason true? Judged by hand once, kept as data
(benchmarks/precision_labels.json), and re-checked on every run.

    python -m benchmarks.precision                          # the wild corpus
    python -m benchmarks.precision --repos /tmp/checkouts   # and public repos
    python -m benchmarks.precision --check                  # exit 1 on unlabeled items
    python -m benchmarks.precision --unlabeled new.json     # write them out to label

Every file is processed at level unsafe with every rule selected (opt-in ones
too). Each applied fix becomes an item: its rule, its file, the text of the
finding's line and the lines its fix removes and adds (the changes of the whole
file's diff that meet the fix's lines). A finding whose code another rule's fix
removes, doing its work another way (a copy inside a loop that PM103 prefetches),
is that fix's, not an item of its own. Each finding left unfixed becomes a
report item: its rule, file, line text and message. Items are matched to labels
by that text, not by line number, so a label survives edits elsewhere in the file.
An item with no label is listed as UNLABELED, a label that matches nothing as
STALE; where both sit at one site (same rule, file and line text: the fix or the
message changed), they are shown together as CHANGED, to be judged again.

Labels of fixes: CORRECT (an expert would make this change, and it is right),
NOISY (right but pointless: it saves nothing where it is), WRONG (changes what
the program computes, or breaks it). Labels of reports: RIGHT (the problem is
there and the stated reason is true), WRONG_REASON (the problem is there, the
reason given is false), FALSE (there is no such problem).

`--repos DIR` takes a folder of checkouts named `owner+name`, each a git
checkout at the commit its labels name (the labels file's `sources` pins each
repo's commit and the files measured); a checkout at another commit is measured
but said to be so.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from codemod.config import Settings
from codemod.engine import process_source
from codemod.result import Finding, Level
from codemod.rules import ALL_RULES

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "fixtures" / "wild"
LABELS = Path(__file__).with_name("precision_labels.json")
WILD = "wild"
FIX_LABELS = ("CORRECT", "NOISY", "WRONG")
REPORT_LABELS = ("RIGHT", "WRONG_REASON", "FALSE")
# The goals on code written elsewhere (issue "Measure it").
# How a label was judged: "read" (its hunk or report read in its file), "marker" (a wild
# corpus marker of the same rule on the line, with the rule's pattern read on samples).
BASES = ("read", "marker")
GOAL_WRONG_FIXES = 0
GOAL_NOISY = 0.10
GOAL_WRONG_REASON = 0.05


@dataclass
class Item:
    """One applied fix or one report, keyed by text that survives line moves."""

    kind: str  # "fix" or "report"
    source: str  # "wild" or "owner/name"
    path: str  # relative to the corpus or the checkout
    code: str
    site: str  # the finding's first line, whitespace collapsed
    detail: tuple[str, ...]  # fix: "-old" / "+new" lines; report: (message,)
    line: int = 0  # where it is today (not part of the key)
    message: str = ""
    nth: int = 1  # among items with the same other fields

    @property
    def key(self) -> tuple:
        return (self.kind, self.source, self.path, self.code, self.site, self.detail, self.nth)


@dataclass
class Label:
    item: Item
    label: str
    reason: str
    basis: str = "read"  # how it was judged: see BASES


@dataclass
class Source:
    name: str
    root: Path
    commit: str = ""  # "" for the corpus
    paths: list[str] = field(default_factory=list)  # relative, sorted
    note: str = ""  # a checkout at another commit than the pinned one, a missing file


def _normal(text: str) -> str:
    return " ".join(text.split())


def _message_key(message: str) -> str:
    # Messages may name other lines ("on line 42"); those numbers move with any edit above.
    return re.sub(r"\bline(s?) \d+(?:(?:-|, | and )\d+)*", r"line\1 N", _normal(message))


# -- collecting items ----------------------------------------------------------------------


def settings() -> Settings:
    return Settings(level=Level.UNSAFE, select=tuple(rule.CODE for rule in ALL_RULES))


def file_items(source: str, root: Path, relative: str) -> tuple[list[Item], str]:
    """The fix and report items of one file, and an error text ("" when none)."""
    path = root / relative
    result = process_source(path.read_bytes(), str(path), settings())
    if result.error:
        return [], result.error
    old = result.source.decode("utf-8", "replace").splitlines()
    new = (result.new_source or result.source).decode("utf-8", "replace").splitlines()
    changes = [op for op in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if op[0] != "equal"]
    items = []
    for finding in sorted(result.findings, key=lambda f: (f.line, f.column, f.code)):
        site = _normal(old[finding.line - 1]) if 0 < finding.line <= len(old) else ""
        if finding.applied and finding.fixed_by:
            continue  # its code went with another rule's fix, which does its work: one item, that fix
        if finding.applied:
            detail = tuple(_hunk(finding, changes, old, new))
            items.append(Item("fix", source, relative, finding.code, site, detail, finding.line, finding.message))
        else:
            detail = (_message_key(finding.message),)
            items.append(Item("report", source, relative, finding.code, site, detail, finding.line, finding.message))
    seen: Counter = Counter()
    for item in items:
        seen[item.key] += 1
        item.nth = seen[item.key]
    return items, ""


def _hunk(finding: Finding, changes: list, old: list[str], new: list[str]) -> list[str]:
    """The diff's changes that meet the lines the finding's fix rewrites."""
    spans = list(finding.fix_lines) or [(finding.line, max(finding.end_line, finding.line))]
    # An empty span (a, a - 1) inserts between lines a - 1 and a; the diff may merge the
    # insertion with a change of either line.
    spans = [(min(first, last), max(first, last)) if last < first else (first, last) for first, last in spans]
    lines: list[str] = []
    for _tag, i1, i2, j1, j2 in changes:
        if i1 < i2:
            meets = any(i1 + 1 <= last and i2 >= first for first, last in spans)
        else:  # an insertion after line i1
            meets = any(first - 1 <= i1 <= last for first, last in spans)
        if meets:
            lines += ["-" + _normal(text) for text in old[i1:i2]]
            lines += ["+" + _normal(text) for text in new[j1:j2]]
    return lines


def wild_source(root: Path = CORPUS) -> Source:
    return Source(WILD, root, paths=sorted(str(p.relative_to(root)) for p in root.rglob("*.py")))


def repo_sources(folder: Path, pinned: dict[str, dict]) -> list[Source]:
    """The checkouts under `folder` (named owner+name) that the labels file pins."""
    sources = []
    for name, pin in sorted(pinned.items()):
        if name == WILD:
            continue
        root = folder / name.replace("/", "+")
        if not root.is_dir():
            continue
        commit = _head(root)
        source = Source(name, root, commit=commit, paths=sorted(pin.get("paths", [])))
        notes = []
        if commit != pin.get("commit"):
            notes.append(
                f"checkout at {commit[:12] or 'unknown commit'}, labels pinned at {pin.get('commit', '')[:12]}"
            )
        missing = [p for p in source.paths if not (root / p).is_file()]
        if missing:
            notes.append(f"{len(missing)} pinned files missing")
            source.paths = [p for p in source.paths if p not in missing]
        source.note = "; ".join(notes)
        sources.append(source)
    return sources


def _head(root: Path) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        )
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def collect(sources: list[Source]) -> tuple[list[Item], list[str]]:
    items, errors = [], []
    for source in sources:
        for relative in source.paths:
            found, error = file_items(source.name, source.root, relative)
            items += found
            if error:
                errors.append(f"{source.name}:{relative}: {error}")
    return items, errors


# -- labels ----------------------------------------------------------------------------------


def load_labels(path: Path = LABELS) -> tuple[dict[str, dict], list[Label]]:
    """The pinned sources and the labels; raises ValueError on a malformed entry."""
    data = json.loads(path.read_text(encoding="utf-8"))
    codes = {rule.CODE for rule in ALL_RULES}
    labels = []
    for kind, entries, allowed in (
        ("fix", data.get("fixes", []), FIX_LABELS),
        ("report", data.get("reports", []), REPORT_LABELS),
    ):
        for entry in entries:
            where = f"{kind} label {entry.get('source')}:{entry.get('path')} {entry.get('code')}"
            if entry.get("label") not in allowed:
                raise ValueError(f"{where}: label {entry.get('label')!r} is not one of {', '.join(allowed)}")
            if entry.get("code") not in codes:
                raise ValueError(f"{where}: unknown rule code")
            if not str(entry.get("reason", "")).strip():
                raise ValueError(f"{where}: no reason given")
            if entry.get("basis", "read") not in BASES:
                raise ValueError(f"{where}: basis {entry.get('basis')!r} is not one of {', '.join(BASES)}")
            detail = tuple(entry["hunk"]) if kind == "fix" else (_message_key(entry["message"]),)
            item = Item(
                kind,
                entry["source"],
                entry["path"],
                entry["code"],
                _normal(entry["site"]),
                detail,
                message=entry.get("message", ""),
                nth=entry.get("nth", 1),
            )
            labels.append(Label(item, entry["label"], entry["reason"].strip(), entry.get("basis", "read")))
    keys = Counter(label.item.key for label in labels)
    doubled = [key for key, n in keys.items() if n > 1]
    if doubled:
        raise ValueError(f"{len(doubled)} items labeled twice, e.g. {doubled[0][:5]}")
    return data.get("sources", {}), labels


def entry(item: Item, label: str = "", reason: str = "") -> dict:
    """An item as the labels file writes it."""
    out = {"source": item.source, "path": item.path, "code": item.code, "line": item.line, "site": item.site}
    if item.kind == "fix":
        out["hunk"] = list(item.detail)
        out["message"] = item.message
    else:
        out["message"] = item.message
    if item.nth > 1:
        out["nth"] = item.nth
    out["label"], out["reason"] = label, reason
    return out


def dump_labels(data: dict) -> str:
    """The labels file's text: one entry a line, so that a change of one label is a one-line diff."""
    parts = ["{", f' "sources": {json.dumps(data.get("sources", {}), indent=1, ensure_ascii=False)},']
    for name in ("fixes", "reports"):
        entries = data.get(name, [])
        lines = [json.dumps(entry, ensure_ascii=False) for entry in entries]
        body = ",\n  ".join(lines)
        comma = "," if name == "fixes" else ""
        parts.append(f' "{name}": [\n  {body}\n ]{comma}' if lines else f' "{name}": []{comma}')
    parts.append("}")
    return "\n".join(parts) + "\n"


@dataclass
class Joined:
    labeled: list[tuple[Item, Label]]
    unlabeled: list[Item]
    stale: list[Label]  # labels of measured sources that match no current item


def join(items: list[Item], labels: list[Label], measured: set[str]) -> Joined:
    by_key = {label.item.key: label for label in labels}
    labeled, unlabeled, used = [], [], set()
    for item in items:
        label = by_key.get(item.key)
        if label is None:
            unlabeled.append(item)
        else:
            labeled.append((item, label))
            used.add(item.key)
    stale = [label for label in labels if label.item.key not in used and label.item.source in measured]
    return Joined(labeled, unlabeled, stale)


def changed(joined: Joined) -> list[tuple[Label, Item]]:
    """Stale labels paired with the unlabeled item at the same site (same source, file,
    rule, kind and line text): the fix or the message changed there, and the old label
    may or may not carry over (read it again)."""
    waiting = {}
    for item in joined.unlabeled:
        waiting.setdefault((item.kind, item.source, item.path, item.code, item.site), []).append(item)
    pairs = []
    for label in joined.stale:
        found = waiting.get((label.item.kind, label.item.source, label.item.path, label.item.code, label.item.site))
        if found:
            pairs.append((label, found.pop(0)))
    return pairs


# -- the table ---------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    counts: Counter = field(default_factory=Counter)  # label -> n, "UNLABELED_FIX", "UNLABELED_REPORT"

    @property
    def fixes(self) -> int:
        return sum(self.counts[label] for label in FIX_LABELS)

    @property
    def reports(self) -> int:
        return sum(self.counts[label] for label in REPORT_LABELS)

    @property
    def noisy_share(self) -> float | None:
        return self.counts["NOISY"] / self.fixes if self.fixes else None

    @property
    def wrong_reason_share(self) -> float | None:
        """Reports whose reason is not true: a wrong reason, or no such problem."""
        bad = self.counts["WRONG_REASON"] + self.counts["FALSE"]
        return bad / self.reports if self.reports else None


def rows(joined: Joined, by: str) -> list[Row]:
    table: dict[str, Row] = {}
    total = Row("all")

    def add(item: Item, name: str) -> None:
        for row in (table.setdefault(getattr(item, by), Row(getattr(item, by))), total):
            row.counts[name] += 1

    for item, label in joined.labeled:
        add(item, label.label)
    for item in joined.unlabeled:
        add(item, f"UNLABELED_{item.kind.upper()}")
    extra = []
    if by == "source" and WILD in table and len(table) > 1:
        repos = Row("public repos")
        for name, row in table.items():
            if name != WILD:
                repos.counts.update(row.counts)
        extra.append(repos)
    return [table[name] for name in sorted(table)] + extra + [total]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def markdown(table: list[Row], title: str) -> str:
    lines = [
        f"| {title} | fixes | correct | noisy | wrong | noisy share | reports | right | wrong reason | false | "
        "wrong or false share | unlabeled |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        c = r.counts
        name = f"**{r.name}**" if r.name == "all" else r.name
        lines.append(
            f"| {name} | {r.fixes} | {c['CORRECT']} | {c['NOISY']} | {c['WRONG']} | {_pct(r.noisy_share)} | "
            f"{r.reports} | {c['RIGHT']} | {c['WRONG_REASON']} | {c['FALSE']} | {_pct(r.wrong_reason_share)} | "
            f"{c['UNLABELED_FIX'] + c['UNLABELED_REPORT']} |"
        )
    return "\n".join(lines)


def goals(total: Row) -> list[str]:
    c = total.counts
    return [
        f"wrong fixes: {c['WRONG']} (goal {GOAL_WRONG_FIXES}) {'met' if c['WRONG'] <= GOAL_WRONG_FIXES else 'NOT met'}",
        f"noisy fixes: {_pct(total.noisy_share)} of {total.fixes} (goal at most {_pct(GOAL_NOISY)}) "
        f"{'met' if (total.noisy_share or 0) <= GOAL_NOISY else 'NOT met'}",
        f"reports with a wrong reason or no such problem: {_pct(total.wrong_reason_share)} of {total.reports} "
        f"(goal at most {_pct(GOAL_WRONG_REASON)}) "
        f"{'met' if (total.wrong_reason_share or 0) <= GOAL_WRONG_REASON else 'NOT met'}",
    ]


def has_repos_row(sources: list[Source]) -> bool:
    """Does the table by source have a "public repos" row (the corpus and some repo measured)?"""
    return any(s.name == WILD for s in sources) and len(sources) > 1


def measure(
    labels_path: Path = LABELS, corpus: Path | None = CORPUS, repos: Path | None = None
) -> tuple[list[Source], Joined, list[str]]:
    pinned, labels = load_labels(labels_path)
    sources = [wild_source(corpus)] if corpus is not None else []
    if repos is not None:
        sources += repo_sources(repos, pinned)
    items, errors = collect(sources)
    return sources, join(items, labels, {s.name for s in sources}), errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--corpus", type=Path, default=CORPUS, help="folder of the wild corpus (default: fixtures/wild)"
    )
    parser.add_argument("--no-corpus", action="store_true", help="leave the wild corpus out")
    parser.add_argument("--repos", type=Path, help="folder of checkouts named owner+name, pinned in the labels file")
    parser.add_argument("--labels", type=Path, default=LABELS, help="the labels file (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="exit 1 when an item is unlabeled or a label stale")
    parser.add_argument("--unlabeled", type=Path, help="write the unlabeled items here, as label entries to fill in")
    parser.add_argument("--details", action="store_true", help="list every WRONG, NOISY, WRONG_REASON and FALSE item")
    args = parser.parse_args(argv)
    sources, joined, errors = measure(args.labels, None if args.no_corpus else args.corpus, args.repos)
    for source in sources:
        pin = f"@{source.commit}" if source.commit else ""
        note = f" ({source.note})" if source.note else ""
        print(f"source {source.name}{pin}: {len(source.paths)} files{note}")
    print()
    print(markdown(rows(joined, "source"), "source"))
    print()
    print(markdown(rows(joined, "code"), "rule"))
    print()
    for row in rows(joined, "source")[-2:] if has_repos_row(sources) else rows(joined, "source")[-1:]:
        print(f"goals, {row.name} sources:")
        for line in goals(row):
            print(f"  {line}")
    bases = Counter(label.basis for _item, label in joined.labeled)
    print("labels by basis: " + ", ".join(f"{n} {basis}" for basis, n in sorted(bases.items())))
    for error in errors:
        print(f"error: {error}")
    if args.details:
        for item, label in joined.labeled:
            if label.label not in ("CORRECT", "RIGHT"):
                print(f"\n{label.label} {item.code} {item.source}:{item.path}:{item.line}: {label.reason}")
                print(f"    {item.site}")
                for text in item.detail if item.kind == "fix" else ():
                    print(f"    {text}")
    if joined.unlabeled:
        print(f"\nUNLABELED ({len(joined.unlabeled)}):")
        for item in joined.unlabeled:
            print(f"  {item.kind} {item.code} {item.source}:{item.path}:{item.line} {item.site[:80]}")
    if joined.stale:
        print(f"\nSTALE labels ({len(joined.stale)}), matching nothing measured:")
        for label in joined.stale:
            print(f"  {label.item.kind} {label.item.code} {label.item.source}:{label.item.path} {label.item.site[:80]}")
    for label, item in changed(joined):
        print(
            f"\nCHANGED {item.kind} {item.code} {item.source}:{item.path}:{item.line}, was {label.label}: {label.reason}"
        )
        before, after = label.item.detail, item.detail
        for text in [f"- {t}" for t in before if t not in after] + [f"+ {t}" for t in after if t not in before]:
            print(f"    {text[:160]}")
    if args.unlabeled:
        fixes = [entry(i) for i in joined.unlabeled if i.kind == "fix"]
        reports = [entry(i) for i in joined.unlabeled if i.kind == "report"]
        args.unlabeled.write_text(dump_labels({"fixes": fixes, "reports": reports}), encoding="utf-8")
    if args.check and (joined.unlabeled or joined.stale):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

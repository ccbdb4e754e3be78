"""Time each rule costs on one file, in CPU time (the machines these run on are
shared), least of several rounds:

- in the catalogue: the time spent in the rule's own visits during a run of every
  rule at `--level unsafe`, which includes the shared analyses the rule is the first
  to ask for (a later rule gets them for free);
- alone: a run with only that rule selected (parsing and every analysis it needs).

    python -m benchmarks.rule_time                         # the seed script and a 2,000-line file
    python -m benchmarks.rule_time --rules PM101 PM102     # only those rules
    python -m benchmarks.rule_time --file train.py --rounds 9

The 2,000-line file is made of copies of the bundled training scripts, each copy's
functions and classes renamed so that they do not rebind one another.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from codemod import engine
from codemod.config import Settings
from codemod.engine import process_source
from codemod.rule import Level
from codemod.rules import ALL_RULES

REPO = Path(__file__).resolve().parents[1]
SEED = REPO / "fixtures" / "scripts" / "seed_latentwire.py"
PARTS = [
    SEED,
    REPO / "fixtures" / "scripts" / "optimized_nanogpt_style.py",
    *sorted((REPO / "fixtures" / "training").glob("*.py")),
]


def training_file(lines: int = 2000) -> str:
    """Copies of the bundled training scripts, names of each copy's definitions suffixed."""
    chunks: list[str] = []
    total, copy = 0, 0
    while total < lines:
        for part in PARTS:
            code = part.read_text()
            defined = set(re.findall(r"^\s*(?:def|class)\s+(\w+)", code, re.M)) - {
                "__init__",
                "forward",
                "__len__",
                "__getitem__",
                "__iter__",
            }
            for name in sorted(defined, key=len, reverse=True):
                code = re.sub(rf"\b{name}\b", f"{name}_{copy}", code)
            chunks.append(code)
            total += code.count("\n")
            if total >= lines:
                break
        copy += 1
    return "\n\n".join(chunks)


def seconds(source: bytes, codes: tuple[str, ...], rounds: int) -> float:
    settings = Settings(select=codes, level=Level.UNSAFE)
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        result = process_source(source, "<bench>", settings)
        best = min(best, time.process_time() - start)
        assert result.error is None, result.error
    return best


def hook_seconds(source: bytes, codes: tuple[str, ...], rounds: int) -> tuple[float, dict[str, float]]:
    """(the whole run, {code: time in the rule's visits}), least of `rounds` each."""
    spent: dict[str, float] = {}
    original = engine._dispatch

    def timed(hook, code):
        def call(node):
            start = time.process_time()
            try:
                return hook(node)
            finally:
                spent[code] = spent.get(code, 0.0) + time.process_time() - start

        return call

    def dispatch(index, instances):
        for instance in instances:
            visits, leaves = type(instance).hooks()
            for name in {*visits.values(), *leaves.values()}:
                setattr(instance, name, timed(getattr(instance, name), instance.CODE))
        return original(index, instances)

    best_total = float("inf")
    best: dict[str, float] = {}
    engine._dispatch = dispatch
    try:
        for _ in range(rounds):
            spent.clear()
            total = seconds(source, codes, 1)
            best_total = min(best_total, total)
            for code, value in spent.items():
                best[code] = min(best.get(code, float("inf")), value)
    finally:
        engine._dispatch = original
    return best_total, best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, action="append")
    parser.add_argument("--rules", nargs="*")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args(argv)
    everything = tuple(rule.CODE for rule in ALL_RULES if not rule.OPT_IN)
    wanted = options.rules or list(everything)
    files = (
        [(path.name, path.read_bytes()) for path in options.file]
        if options.file
        else [(SEED.name, SEED.read_bytes()), ("2,000-line training file", training_file().encode())]
    )
    for name, source in files:
        full, spent = hook_seconds(source, everything, options.rounds)
        lines = source.count(b"\n")
        print(f"{name} ({lines} lines): all rules {full * 1000:.0f} ms")
        for code in wanted:
            alone = seconds(source, (code,), options.rounds)
            print(f"  {code}: {spent.get(code, 0.0) * 1000:6.1f} ms in the catalogue, {alone * 1000:6.1f} ms alone")


if __name__ == "__main__":
    main()

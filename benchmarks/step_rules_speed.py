"""Time of the training-step rules (PM301, PM302, PM401-PM405) per file.

    python -m benchmarks.step_rules_speed             # seed script and a 2,000-line file, 5 rounds

CPU time (not wall time: the machine may be shared), best of N rounds, in
milliseconds: the whole catalogue with and without these rules
(`process_source` at level `unsafe`); the training analyses (loops, training)
on a context whose shared base (scopes, names, kinds) is built; and each
rule's own visit with every analysis it reads already built. The
2,000-line file is made of copies of the training scripts under
fixtures/scripts and fixtures/training, each copy with its top-level functions
and classes renamed, so the copies are distinct training programs in one module.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from codemod.config import Settings
from codemod.context import FileContext
from codemod.engine import _dispatch, process_source
from codemod.rule import Level
from codemod.rules import ALL_RULES

REPO = Path(__file__).resolve().parents[1]
STEP_RULES = ("PM301", "PM302", "PM401", "PM402", "PM403", "PM404", "PM405")
SOURCES = [
    REPO / "fixtures" / "scripts" / "seed_latentwire.py",
    REPO / "fixtures" / "training" / "seed_lm.py",
    REPO / "fixtures" / "training" / "accumulation_clipping.py",
    REPO / "fixtures" / "training" / "nanogpt_optimised.py",
    REPO / "fixtures" / "scripts" / "optimized_nanogpt_style.py",
]
DEFINITION = re.compile(r"^(?:def|class) (\w+)", re.M)


def training_file(lines: int = 2000) -> str:
    """Copies of the training scripts, top-level names renamed per copy, up to `lines` lines."""
    parts: list[str] = []
    count, copy = 0, 0
    while count < lines:
        for path in SOURCES:
            text = path.read_text()
            text = "\n".join(line for line in text.splitlines() if not line.startswith("from __future__"))
            for name in set(DEFINITION.findall(text)):
                text = re.sub(rf"\b{name}\b", f"{name}_{copy}", text)
            parts.append(text + "\n")
            count += text.count("\n") + 1
            if count >= lines:
                break
        copy += 1
    return "\n\n".join(parts)


def best_ms(source: bytes, select: tuple[str, ...], rounds: int, ignore: tuple[str, ...] = ()) -> float:
    settings = Settings(level=Level.UNSAFE, select=select, ignore=ignore)
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        result = process_source(source, "bench.py", settings)
        best = min(best, time.process_time() - start)
        assert result.error is None, result.error
    return best * 1000


def warm_context(source: bytes) -> FileContext:
    context = FileContext.of_source(source.decode(), "bench.py", Settings(level=Level.UNSAFE))
    context.scopes, context.names, context.kinds, context.bindings, context.positions  # noqa: B018
    return context


def analyses_ms(source: bytes, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        context = warm_context(source)
        start = time.process_time()
        context.loops, context.training  # noqa: B018
        best = min(best, time.process_time() - start)
    return best * 1000


def own_ms(source: bytes, code: str, rounds: int) -> float:
    rule = next(rule for rule in ALL_RULES if rule.CODE == code)
    context = warm_context(source)
    context.loops, context.training  # noqa: B018
    _dispatch(context.index, [rule(context)])  # fills the caches the analyses keep
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        _dispatch(context.index, [rule(context)])
        best = min(best, time.process_time() - start)
    return best * 1000


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    files = {
        "seed_latentwire.py": (REPO / "fixtures" / "scripts" / "seed_latentwire.py").read_bytes(),
        "training_2000_lines.py": training_file().encode(),
    }
    codes = [rule.CODE for rule in ALL_RULES if rule.CODE in STEP_RULES]
    for name, source in files.items():
        compile(source, name, "exec")
        lines = source.count(b"\n")
        print(f"{name} ({lines} lines), best of {args.rounds}, ms")
        whole = best_ms(source, ("PM",), args.rounds)
        without = best_ms(source, ("PM",), args.rounds, ignore=STEP_RULES)
        print(f"  catalogue:                        {whole:8.1f}")
        print(f"  catalogue without these rules:    {without:8.1f}")
        print(f"  analyses loops + training:        {analyses_ms(source, args.rounds):8.1f}")
        for code in codes:
            print(f"  {code} own visit:                  {own_ms(source, code, args.rounds):8.1f}")


if __name__ == "__main__":
    main()

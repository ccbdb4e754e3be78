"""What the CLI, file and config tests share: sources, a runner, and test-only
rules at the levels the real catalogue may not have yet."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import libcst as cst
import pytest
from click.testing import CliRunner

from codemod.cli import main
from codemod.rule import Level, Rule
from codemod.rules import ALL_RULES, RULES_BY_CODE
from codemod.rules.blocking_host_to_device_copy import NonBlockingCopy

FIXABLE = 'import torch\ndevice = torch.device("cuda")\nx = torch.randn(4, pin_memory=True)\ny = x.to(device)\n'
FIXED = FIXABLE.replace("x.to(device)", "x.to(device, non_blocking=True)")
FINDING_MESSAGE = "PM101 [*] host-to-device copy blocks the CPU; pass non_blocking=True"
CLEAN = "import torch\nx = torch.randn(4)\n"
UNPARSABLE = "import torch\nx = (\ny = 2\nz = ]\n"  # the error is on line 4

# A real process, for what CliRunner cannot show: terminals, the interpreter's streams.
PERFMOD = [sys.executable, "-c", "from codemod.cli import main; main()"]
REPO = Path(__file__).resolve().parents[1]


def process_env(**overrides: str) -> dict[str, str]:
    """The environment for PERFMOD: this checkout importable, installed or not."""
    return {**os.environ, "PYTHONPATH": str(REPO), **overrides}


def perfmod(*args, input: bytes | None = None):
    """Run the CLI in-process; stdout and stderr are kept apart."""
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    return path


class _CallRename(Rule):
    """Test rule base: a call of the bare name OLD becomes NEW (report only when NEW is None)."""

    OLD: str
    NEW: str | None

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == self.OLD:
            if self.NEW is None:
                self.report(node)
            else:  # the new name comes from an import, as a real fix's would
                self.report(
                    node, replacement=node.with_changes(func=cst.Name(self.NEW)), imports=[("speedups", self.NEW)]
                )


class SlowCall(_CallRename):
    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM991", "test-slow-call", Level.NUMERIC, "slow() is slow", "test"
    OLD, NEW = "slow", "fast"


class RiskyCall(_CallRename):
    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM992", "test-risky-call", Level.UNSAFE, "risky() could be bold", "test"
    OLD, NEW = "risky", "bold"


class LookCall(_CallRename):
    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM993", "test-look-call", Level.SAFE, "look() has no fix", "test"
    OLD, NEW = "look", None


TEST_RULES = [SlowCall, RiskyCall, LookCall]


@pytest.fixture
def catalogue():
    """The catalogue pinned to PM101 and the test rules for the length of one
    test, so that exact outputs hold while other rules join the real one (the
    catalogue-wide tests are in test_docs.py). The CLI and the engine share
    these very objects."""
    saved_rules, saved_codes = list(ALL_RULES), dict(RULES_BY_CODE)
    ALL_RULES[:] = [NonBlockingCopy, *TEST_RULES]
    RULES_BY_CODE.clear()
    RULES_BY_CODE.update({rule.CODE: rule for rule in ALL_RULES})
    try:
        yield ALL_RULES
    finally:
        ALL_RULES[:] = saved_rules
        RULES_BY_CODE.clear()
        RULES_BY_CODE.update(saved_codes)

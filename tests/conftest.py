"""Suite-wide guards: every test starts from the same process-wide state, the
suite writes nothing into the repository, and `--shuffle SEED` runs the tests
in a random order (to show that none depends on another's leftovers)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle",
        metavar="SEED",
        help="run the tests in a random order drawn from SEED ('random' picks one and prints it)",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = _shuffle_seed(config)
    return None if seed is None else f"shuffled with --shuffle {seed}"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    seed = _shuffle_seed(config)
    if seed is not None:  # also under -q, which hides the header: the order can be replayed
        terminalreporter.write_line(f"shuffled with --shuffle {seed}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = _shuffle_seed(config)
    if seed is not None:
        random.Random(seed).shuffle(items)


def _shuffle_seed(config: pytest.Config) -> int | None:
    value = config.getoption("--shuffle")
    if value is None:
        return None
    if value == "random":  # drawn once, so the header and the order agree
        value = config.option.shuffle = str(random.randrange(10**6))
    return int(value)


@pytest.fixture(autouse=True)
def _process_state():
    """Python's recursion limit is process-wide, and torch.compile raises it for
    good: put it back after each test, so no test sees another's."""
    limit = sys.getrecursionlimit()
    yield
    sys.setrecursionlimit(limit)


def _repository_changes() -> set[str] | None:
    """`git status` of the checkout (ignored files left out); None outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return set(done.stdout.splitlines())


@pytest.fixture(autouse=True, scope="session")
def _repository_untouched():
    """Tests write into temporary folders only: a file the suite adds to or changes
    in the checkout fails the run at its end."""
    before = _repository_changes()
    yield
    after = _repository_changes()
    if before is not None and after is not None and after - before:
        pytest.fail("the tests wrote into the repository: " + ", ".join(sorted(after - before)), pytrace=False)

"""Suite-wide guards: every test starts from the same process-wide state, the
suite writes nothing into the repository, `--shuffle SEED` runs the tests in a
random order (to show that none depends on another's leftovers), and `--claims DIR`
shares the modules out among pytest processes (tests/parallel.py)."""

from __future__ import annotations

import os
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
    parser.addoption(
        "--claims",
        metavar="DIR",
        help="run only the test modules this process claims first in DIR, a folder shared with other "
        "pytest processes (python -m tests.parallel)",
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


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """With --claims: pytest's own loop over the modules this process claims, each the
    moment it comes to it (the others' are skipped, not reported)."""
    folder = session.config.getoption("--claims")
    if folder is None or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} errors during collection")
    modules: dict[str, list[pytest.Item]] = {}
    for item in session.items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(modules.items())
    for g, (module, items) in enumerate(groups):
        if not _claim(Path(folder), module):
            continue
        following = groups[g + 1][1][0] if g + 1 < len(groups) else None  # keeps the session's fixtures
        for i, item in enumerate(items):
            nextitem = items[i + 1] if i + 1 < len(items) else following
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
    return True


def _claim(folder: Path, module: str) -> bool:
    """Is this process the first to claim `module`? (Creating a file is atomic.)"""
    try:
        os.close(os.open(folder / module.replace("/", "__"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


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

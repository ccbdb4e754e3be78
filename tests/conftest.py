"""Suite-wide guards: every test starts from the same process-wide state, the
suite writes nothing into the repository, `--shuffle SEED` runs the tests in a
random order (to show that none depends on another's leftovers), and `--claims DIR`
shares the tests out among pytest processes (tests/parallel.py), none of the long
ones (as tests/durations.json has them) last, so that no process is left with a long
test while the others have finished; `--record-durations DIR` writes what each took."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parallel import DURATIONS, PROCESSES_VARIABLE

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
        help="run only the tests this process claims first in DIR, a folder shared with other "
        "pytest processes (python -m tests.parallel)",
    )
    parser.addoption(
        "--durations-from",
        metavar="FILE",
        default=str(DURATIONS),
        help="with --claims and no --shuffle, claim early the units FILE says would otherwise end after the "
        "others (default: %(default)s)",
    )
    parser.addoption(
        "--record-durations",
        metavar="DIR",
        help="with --claims, write the seconds each claim unit took to DIR/<pid>.json",
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
    """With --claims: pytest's own loop over the tests this process claims, each the moment
    it comes to them (the others' are skipped, not reported). A test is claimed on its own,
    or with its whole module where the module's tests share a fixture set up once for
    several of them (module or class scope), so that it is set up in one process only."""
    folder = session.config.getoption("--claims")
    if folder is None or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} errors during collection")
    units = _claim_units(session.items)
    if _shuffle_seed(session.config) is None:
        units = spread_long_units(units, Path(session.config.getoption("--durations-from")))
    session.config.stash[UNIT_OF] = {item.nodeid: key for key, items in units for item in items}
    claimed = (items for key, items in units if _claim(Path(folder), key))
    current = next(claimed, None)
    while current is not None:
        upcoming = None
        for i, item in enumerate(current):
            if i + 1 < len(current):
                nextitem = current[i + 1]
            else:  # the next unit is claimed before this one's last test ends: pytest tears down up to it
                upcoming = next(claimed, None)
                nextitem = upcoming[0] if upcoming else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        current = upcoming
    return True


SHARED_SCOPES = ("class", "module", "package")


def _claim_units(items: list[pytest.Item]) -> list[tuple[str, list[pytest.Item]]]:
    """(claim key, tests) in the order of `items`: a module whose tests use a fixture of a
    shared scope is one unit, any other test a unit of its own."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    shared = {module for module, tests in modules.items() if any(map(_uses_shared_fixture, tests))}
    units: dict[str, list[pytest.Item]] = {}  # a shared module's unit where its first test is
    for item in items:
        module = item.nodeid.split("::")[0]
        units.setdefault(module if module in shared else item.nodeid, []).append(item)
    return list(units.items())


def spread_long_units(
    units: list[tuple[str, list[pytest.Item]]], durations: Path
) -> list[tuple[str, list[pytest.Item]]]:
    """`units` in their order, but for those (as `durations` has them) that would end after
    the run should: started when the processes have done `before` seconds of the `total`
    together, a unit of `d` seconds ends at about (before / n + d) for n processes, after
    the ideal end (total / n) when before + n * d > total. Those are spread evenly over the
    units ahead of the first of them; the rest keep their order, so the tests that run
    several processes each (torchrun's, whole scripts) stay spread among the tests that
    run in the pytest process rather than start together, more processes than cores."""
    processes = int(os.environ.get(PROCESSES_VARIABLE, "1"))
    try:
        seconds = json.loads(durations.read_text())
    except (OSError, ValueError):
        return units
    total = sum(seconds.get(key, 0.0) for key, _ in units)
    before, late = 0.0, []
    for key, items in units:
        took = seconds.get(key, 0.0)
        if before + processes * took > total:
            late.append((key, items))
        before += took
    if not late or processes < 2:  # one process ends when its last test does, whatever the order
        return units
    moved = {key for key, _ in late}
    first = next(i for i, (key, _) in enumerate(units) if key in moved)
    head, step = list(units[:first]), first / (len(late) + 1)
    for j in reversed(range(len(late))):  # from the back, so the places before stay where they are
        head.insert(round((j + 1) * step), late[j])
    return head + [unit for unit in units[first:] if unit[0] not in moved]


UNIT_OF = pytest.StashKey[dict]()  # a test's nodeid -> the key of the unit it was claimed with
_TEST_SECONDS: dict[str, float] = {}  # nodeid -> its setup, call and teardown together


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TEST_SECONDS[report.nodeid] = _TEST_SECONDS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = session.config.getoption("--record-durations")
    unit_of = session.config.stash.get(UNIT_OF, None)
    if folder is None or unit_of is None:
        return
    units: dict[str, float] = {}
    for nodeid, seconds in _TEST_SECONDS.items():
        key = unit_of.get(nodeid, nodeid)
        units[key] = units.get(key, 0.0) + seconds
    (Path(folder) / f"{os.getpid()}.json").write_text(json.dumps(units))


def _uses_shared_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    return any(definition.scope in SHARED_SCOPES for chain in definitions for definition in chain)


def _claim(folder: Path, key: str) -> bool:
    """Is this process the first to claim `key`? (Creating a file is atomic.)"""
    name = hashlib.sha1(key.encode()).hexdigest()
    try:
        os.close(os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
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

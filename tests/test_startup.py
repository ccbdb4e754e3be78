"""perfmod runs in pre-commit hooks, so what it imports to start is part of its
behaviour: `--version`, `--help` (every command's) and a `check` whose every
result is in the cache import neither libcst nor the rules (issue 24). Checked
on what a real process has in sys.modules at exit, not on time; the times are
benchmarks/startup.py's. The rules' facts then come from codemod.catalogue's
memo, which a changed rule source makes stale like the result cache."""

import json
import subprocess
import sys

import pytest

from codemod import cache as cache_module
from codemod import catalogue as catalogue_module
from codemod.config import Settings
from codemod.rules import ALL_RULES
from tests.cli_support import FIXABLE, process_env, write

HEAVY = ("libcst", "codemod.rules", "codemod.engine", "codemod.rule", "importlib.metadata")

# Runs perfmod as the console script does; at exit, writes the imported modules' names to argv[1].
RUN = """
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = "perfmod"
from codemod.entry import main
main()
"""


def _run(tmp_path, *args, cwd=None):
    """(exit status, stdout, stderr, the heavy modules it imported)."""
    modules = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(modules), *map(str, args)],
        cwd=cwd or tmp_path,
        env=process_env(),
        capture_output=True,
        text=True,
    )
    loaded = set(json.loads(modules.read_text()))
    return done.returncode, done.stdout, done.stderr, sorted(m for m in HEAVY if m in loaded)


@pytest.fixture(scope="module")
def memo_written():
    """The catalogue memo as a first run after an install leaves it (or finds it)."""
    subprocess.run(
        [sys.executable, "-c", "from codemod.catalogue import catalogue; catalogue()"], env=process_env(), check=True
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        *[[command, "--help"] for command in ("check", "apply", "report", "rules", "explain", "verify")],
    ],
    ids=" ".join,
)
def test_version_and_help_import_neither_libcst_nor_the_rules(tmp_path, args):
    status, stdout, _, heavy = _run(tmp_path, *args)
    assert status == 0 and stdout
    assert heavy == []


def test_version_prints_what_click_prints():
    from importlib.metadata import version

    assert catalogue_module.version("perfmod") == version("perfmod")
    assert catalogue_module.version("libcst") == version("libcst")
    assert catalogue_module.version("no-such-package-here") == "unknown"


def test_a_warm_check_imports_neither_libcst_nor_the_rules_and_prints_the_same(tmp_path, memo_written):
    write(tmp_path / "pyproject.toml", '[tool.perfmod]\nlevel = "safe"\nselect = ["PM1"]\n')
    write(tmp_path / "train.py", FIXABLE)
    cold = _run(tmp_path, "check", "train.py")
    assert "libcst" in cold[3] and cold[0] == 1  # the file is analysed: a fix is pending
    warm = _run(tmp_path, "check", "train.py")
    assert warm[:3] == cold[:3]
    assert warm[3] == []
    # A cache from another catalogue (another --select) is a miss, and the rules load.
    assert "libcst" in _run(tmp_path, "check", "train.py", "--select", "PM101")[3]


def test_an_unknown_code_in_the_configuration_is_still_an_error_without_the_rules(tmp_path, memo_written):
    write(tmp_path / "pyproject.toml", '[tool.perfmod]\nselect = ["PM999"]\n')
    write(tmp_path / "train.py", "x = 1\n")
    status, _, stderr, heavy = _run(tmp_path, "check", "train.py")
    assert status == 2 and "PM999 matches no rule" in stderr
    assert heavy == []


# -- the catalogue without the rules --------------------------------------------------------


def test_the_memo_holds_the_catalogue_and_a_changed_source_makes_it_stale(tmp_path, monkeypatch):
    real = [catalogue_module.RuleFacts.of(rule) for rule in ALL_RULES]
    memo = tmp_path / "catalogue.json"
    monkeypatch.setattr(catalogue_module, "memo_path", lambda: memo)
    catalogue_module._memo.cache_clear()
    try:
        # A process that had the rules before may have changed the catalogue: it writes no memo.
        assert [catalogue_module.RuleFacts(*row) for row in catalogue_module._memo()["rules"]] == real
        assert not memo.exists()

        def fresh():  # the catalogue as a process that has not imported the rules sees it
            monkeypatch.delitem(sys.modules, "codemod.rules", raising=False)
            catalogue_module._memo.cache_clear()
            return catalogue_module.catalogue()

        assert fresh() == real  # imported here, and written
        assert json.loads(memo.read_text())["rules"] == json.loads(_memo_text(real))
        key = catalogue_module._memo_key()
        forged = {"key": key, "rules": [[*row[:3], "renamed", *row[4:]] for row in json.loads(_memo_text(real))]}
        memo.write_text(json.dumps(forged))
        assert [facts.name for facts in fresh()] == ["renamed"] * len(real)  # read, not imported
        stamps = catalogue_module.source_stamps()
        monkeypatch.setattr(catalogue_module, "source_stamps", lambda: [*stamps[:-1], stamps[-1] + "0"])  # an edit
        assert fresh() == real  # stale: made afresh from the rules
        for broken in ("{", "[]", json.dumps({"key": key, "rules": [["PM1"]]})):
            memo.write_text(broken)
            assert fresh() == real
    finally:
        catalogue_module._memo.cache_clear()


def _memo_text(facts):
    return json.dumps([[f.module, f.qualname, f.code, f.name, f.level, f.opt_in, f.file] for f in facts])


def test_a_fresh_process_writes_the_memo_that_the_next_one_reads(tmp_path):
    # A folder of its own for bytecode and the memo (PYTHONPYCACHEPREFIX): the first
    # process imports the rules and writes it, the second reads the same facts from it.
    env = process_env(PYTHONPYCACHEPREFIX=str(tmp_path / "pycache"))
    code = (
        "import json, sys; from codemod.catalogue import catalogue, memo_path; "
        "print(json.dumps([[*vars(f).values()] for f in catalogue()]), 'codemod.rules' in sys.modules, memo_path())"
    )
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True) for _ in range(2)]
    (first, imported_first, path), (second, imported_second, _) = (run.stdout.rsplit(" ", 2) for run in runs)
    assert str(tmp_path) in path
    assert (imported_first, imported_second) == ("True", "False")
    assert first == second == _memo_text(catalogue_module.RuleFacts.of(rule) for rule in ALL_RULES)


def test_the_cache_key_is_the_same_from_the_rules_or_from_their_facts():
    facts = [catalogue_module.RuleFacts.of(rule) for rule in ALL_RULES]
    assert cache_module.fingerprint(Settings(), facts) == cache_module.fingerprint(Settings(), ALL_RULES)

"""perfmod runs in pre-commit hooks, so what it imports to start is part of its
behaviour: `--version`, `--help` (every command's) and a `check` whose every
result is in the cache import neither libcst nor the rules (issue 24). Checked
on what a real process has in sys.modules at exit, not on time; the times are
benchmarks/startup.py's. The rules' facts then come from codemod/rule_catalogue.py,
generated from the rules and committed: a test here fails when it is stale.

Nothing here removes a module from this process's sys.modules or changes the
registry: what a process without the rules does is run in a process of its own."""

import json
import shutil
import subprocess
import sys

import pytest

from codemod import cache as cache_module
from codemod import catalogue as catalogue_module
from codemod.config import Settings
from codemod.rules import discover
from tests.cli_support import FIXABLE, REPO, TEST_RULES, catalogue, process_env, write  # noqa: F401 (a fixture)

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
    heavy = [m for m in loaded if m in HEAVY or m.startswith(("libcst.", "codemod.rules."))]
    return done.returncode, done.stdout, done.stderr, sorted(heavy)


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


def test_digests_are_hashlibs():
    import hashlib

    from codemod.result import digest

    for data in (b"", b"x = 1\n", bytes(range(256)) * 1000):
        assert digest(data) == hashlib.sha256(data).hexdigest()


def test_a_warm_check_imports_neither_libcst_nor_the_rules_and_prints_the_same(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.perfmod]\nlevel = "safe"\nselect = ["PM1"]\n')
    write(tmp_path / "train.py", FIXABLE)
    cold = _run(tmp_path, "check", "train.py")
    assert "libcst" in cold[3] and cold[0] == 1  # the file is analysed: a fix is pending
    warm = _run(tmp_path, "check", "train.py")
    assert warm[:3] == cold[:3]
    assert warm[3] == []
    assert "tomllib" not in _modules(tmp_path)  # the configuration's table, from the cache folder
    assert "dataclasses" not in _modules(tmp_path)  # its records are named tuples and plain classes
    # A cache from another catalogue (another --select) is a miss, and the rules load.
    assert "libcst" in _run(tmp_path, "check", "train.py", "--select", "PM101")[3]


def _modules(tmp_path) -> set[str]:
    """The modules the last `_run` in `tmp_path` imported."""
    return set(json.loads((tmp_path / "modules.json").read_text()))


def test_a_changed_configuration_is_parsed_again_not_taken_from_the_cache_folder(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.perfmod]\nselect = ["PM1"]\n')
    write(tmp_path / "train.py", FIXABLE)
    first = _run(tmp_path, "check", "train.py", "--cache-dir", tmp_path / "elsewhere")
    assert first[0] == 1 and (tmp_path / "elsewhere" / "toml.json").is_file()
    write(tmp_path / "pyproject.toml", '[tool.perfmod]\nselect = ["PM4"]\n')  # nothing of PM4 to fix here
    second = _run(tmp_path, "check", "train.py", "--cache-dir", tmp_path / "elsewhere")
    assert second[0] == 0 and "tomllib" in _modules(tmp_path)
    again = _run(tmp_path, "check", "train.py", "--cache-dir", tmp_path / "elsewhere")
    assert again[:3] == second[:3] and "tomllib" not in _modules(tmp_path)
    assert not (tmp_path / ".perfmod_cache").exists()  # the memo goes where the cache goes


def test_an_unknown_code_in_the_configuration_is_still_an_error_without_the_rules(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.perfmod]\nselect = ["PM999"]\n')
    write(tmp_path / "train.py", "x = 1\n")
    status, _, stderr, heavy = _run(tmp_path, "check", "train.py")
    assert status == 2 and "PM999 matches no rule" in stderr
    assert heavy == []


# -- the catalogue without the rules --------------------------------------------------------


def _real_facts():
    """The facts of the rules of codemod/rules/, discovered afresh (not the registry's
    lists, which a test may have pinned)."""
    return [catalogue_module.RuleFacts.of(rule) for rule in discover()]


def test_the_committed_catalogue_is_the_rules_own():
    # Stale? Run `python -m codemod.catalogue` (`make docs` does) and commit the result.
    assert catalogue_module.GENERATED.read_text(encoding="utf-8") == catalogue_module.generate()
    assert catalogue_module._generated() == _real_facts()


def test_the_cache_key_is_the_same_from_the_rules_or_from_the_committed_catalogue():
    real = discover()
    assert cache_module.fingerprint(Settings(), catalogue_module._generated()) == cache_module.fingerprint(
        Settings(), real
    )
    assert cache_module.fingerprint(Settings(), real[1:]) != cache_module.fingerprint(Settings(), real)


@pytest.mark.usefixtures("catalogue")
def test_rules_registered_at_run_time_are_the_catalogue_once_the_rules_are_imported():
    assert [facts.code for facts in catalogue_module.catalogue()] == ["PM101", *(rule.CODE for rule in TEST_RULES)]
    assert catalogue_module.known()["PM993"] == "test-look-call"


# What a process that has not imported the rules takes for the catalogue, and whether it imported them.
FRESH = """
import json, sys
from codemod import catalogue
facts = catalogue.catalogue()
print(json.dumps([[f.code, f.name, f.level, f.opt_in, f.file] for f in facts]), "codemod.rules" in sys.modules)
"""

NEW_RULE = """
from codemod.result import Level
from codemod.rule import Rule


class ANewRule(Rule):
    CODE, NAME, LEVEL, MESSAGE, GAIN = "PM998", "a-new-rule", Level.SAFE, "new", "test"
"""


def _fresh(pythonpath):
    done = subprocess.run(
        [sys.executable, "-c", FRESH],
        cwd=pythonpath,  # -c puts the working folder first on sys.path
        env=process_env(PYTHONPATH=str(pythonpath)),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    listed, imported = done.stdout.rsplit(" ", 1)
    return json.loads(listed), imported.strip() == "True"


def test_a_process_without_the_rules_reads_the_committed_catalogue():
    listed, imported = _fresh(REPO)
    assert listed == [[f.code, f.name, f.level, f.opt_in, f.file] for f in _real_facts()]
    assert not imported


def test_a_rule_module_added_without_regenerating_is_in_the_catalogue_all_the_same(tmp_path):
    # A copy of the package with one more rule module (a rule being added, the catalogue not yet
    # written again): the rules are imported, and the new one is in the catalogue.
    shutil.copytree(REPO / "codemod", tmp_path / "codemod", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "codemod" / "rules" / "a_new_rule.py").write_text(NEW_RULE)
    listed, imported = _fresh(tmp_path)
    assert imported
    assert ["PM998", "a-new-rule", "safe", False, str(tmp_path / "codemod" / "rules" / "a_new_rule.py")] in listed
    assert [row[0] for row in listed] == sorted([*(f.code for f in _real_facts()), "PM998"])


def test_the_catalogue_command_writes_the_module_and_checks_it(tmp_path, monkeypatch, capsys):
    generated = tmp_path / "rule_catalogue.py"
    monkeypatch.setattr(catalogue_module, "GENERATED", generated)
    assert catalogue_module.main(["--check"]) == 1  # missing
    generated.write_text(catalogue_module.generate().replace('"safe"', '"numeric"', 1))
    assert catalogue_module.main(["--check"]) == 1  # stale
    assert "is stale: run `python -m codemod.catalogue`" in capsys.readouterr().err
    assert catalogue_module.main([]) == 0
    assert generated.read_text() == catalogue_module.generate()
    assert catalogue_module.main(["--check"]) == 0

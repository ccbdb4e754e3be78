"""`perfmod verify`: run a training script before and after its rewrite, compare.

Two halves. This one prepares (it needs libcst); codemod/verify_run.py runs
and compares (it needs neither libcst nor torch) and documents the runs, the
tolerances and the JSON schema.

Preparing:

1. The script and the local modules it imports (resolved from its import
   statements, relative to the script's folder, recursively; packages'
   `__init__.py` included) are rewritten through the engine at the chosen
   level, in memory: nothing beside the script is written.
2. Both versions are instrumented the same way (codemod/instrument.py): a
   `runtime.trace` header at the top, hooks on the loss of every backward(),
   the first optimizer step and the first model input of each training loop.
   A script whose files have no training loop is refused (VerifyError).
3. Each version gets its own folder, `original/` and `rewritten/`, a mirror of
   the script's folder that a run writes into, not through: data read relative
   to the script or to the working directory (the run's folder) is found, and
   what a run writes stays in its folder. `perfmod-verify.json`, the manifest,
   goes beside them. The mirror (`_mirror`):
   - the files above are the instrumented copies;
   - folders are made for real, recursively, so a file a run creates (say
     `checkpoints/last.pt`, `runs/...`) is created in the run's folder;
   - files up to COPY_LIMIT (1 MiB) are copied, up to COPY_BUDGET (64 MiB) in
     all per run: a run that overwrites or appends to a config, a log or a small
     checkpoint beside the script changes its copy;
   - bigger files (data, weights) are relative symbolic links, which a run can
     write through. Before the runs verify records the (size, mtime_ns) of what
     each link leads to, after them it compares: a changed original is named
     in a note and the verification fails (exit status 2, `error.run` null),
     telling to make the script write elsewhere (an output directory argument);
   - not walked, linked whole: `.git`, venvs (a folder holding `pyvenv.cfg`),
     the engine's SKIP_DIRS (build outputs, caches) and links to folders (data
     kept elsewhere); `__pycache__` is left out;
   - a folder whose walk would pass WALK_LIMIT (10,000) entries in all is linked
     whole rather than walked, unless it holds a copy, so that big trees stay
     fast; a note names those folders;
   - of a folder linked whole verify watches only the listing (its mtime: an
     entry created, removed or renamed directly inside fails the verification
     as above), not what lies deeper nor a write into an existing file; it does
     not watch version-control folders and caches (`*_cache`), which other
     tools write into while the runs go;
   - the prepared folder, where `--keep` puts it inside the script's folder,
     is left out.
   A run that removes or renames a linked file removes its link only. What a
   script writes outside its folder (an absolute path, `../../x`) is beyond the
   mirror: give such a script an output directory argument for its outputs.

`verify()` prepares into a temporary folder (or `keep`), runs both copies with
`verify_run.run_prepared` and removes the folder unless it was `keep`; with
`nproc` the rewrite runs under torchrun (verify_run's docstring says how the
runs are then compared).

`rewritten` replaces the engine: the given file is the rewrite of the script
(its local modules stay as they are), as when checking a hand-written target
(fixtures/distributed/train_ddp_candidate.torchrun.py) or a rewrite made
elsewhere; no fixes are listed and the tolerance is that of `level`.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from codemod.config import ConfigError, Settings, load_settings
from codemod.engine import process_source
from codemod.files import SKIP_DIRS
from codemod.instrument import Instrumented, instrument
from codemod.rule import Level, Rule
from codemod.verify_run import (
    DEFAULT_ROUNDS,
    MANIFEST,
    RUNS,
    SCHEMA,
    UNSAFE_NOTE,
    VerifyError,
    VerifyResult,
    run_prepared,
)


def verify(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    steps: int = 20,
    warmup: int = 2,
    level: Level | None = None,
    settings: Settings | None = None,
    rules: Sequence[type[Rule]] | None = None,
    python: str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    deterministic: bool = False,
    timeout: float | None = 900.0,
    env: Mapping[str, str] | None = None,
    keep: str | Path | None = None,
    nproc: int | None = None,
    rewritten: str | Path | None = None,
    rounds: int = DEFAULT_ROUNDS,
    profile: bool = False,
) -> VerifyResult:
    """Rewrite, instrument, run both versions and compare.

    `rules` replaces the catalogue (tests inject rules that break the math);
    `keep` names a folder to prepare in and leave behind instead of a temporary
    one; `nproc` runs the rewrite under torchrun with that many processes;
    `rewritten` is a file to use as the rewrite instead of the engine's; `rounds`
    runs both versions that many times, alternating, for the speed-up's spread;
    `profile` runs each version once more under the profiler, after the timed rounds
    (codemod/profile.py), its result under `VerifyResult.profiles`.
    Raises VerifyError when nothing could be run.
    """
    if not 1 <= warmup < steps:
        raise VerifyError(
            f"--warmup {warmup} with --steps {steps}: need 1 <= warmup < steps, so that some "
            "steps are timed after the first (which pays for start-up)"
        )
    folder = Path(keep) if keep is not None else Path(tempfile.mkdtemp(prefix="perfmod-verify-"))
    sources: dict = {}
    try:
        prepare(
            script,
            folder,
            args,
            level=level,
            settings=settings,
            rules=rules,
            rtol=rtol,
            atol=atol,
            rewritten=rewritten,
            sources=sources,
        )
        result = run_prepared(
            folder,
            steps=steps,
            warmup=warmup,
            python=python,
            seed=seed,
            deterministic=deterministic,
            timeout=timeout,
            env=env,
            nproc=nproc,
            rounds=rounds,
        )
        if profile and result.error is None:
            result.profiles = _profiles(
                script, folder, args, sources, steps, warmup, settings, level, python, seed, timeout, env
            )
        return result
    finally:
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)


def prepare(
    script: str | Path,
    folder: str | Path,
    args: Sequence[str] = (),
    *,
    level: Level | None = None,
    settings: Settings | None = None,
    rules: Sequence[type[Rule]] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    rewritten: str | Path | None = None,
    tool: str = "verify",
    sources: dict | None = None,
) -> dict:
    """Write the instrumented original and rewrite of `script` under `folder`,
    with the manifest that verify_run reads; returns the manifest. `tool` names
    the command in the error for a script without a training loop; `sources`, a dict,
    receives the texts the copies were made from: {run: {path: text}}."""
    script = Path(script).resolve()
    if not script.is_file():
        raise VerifyError(f"{script}: no such file")
    settings = _settings(script, settings, level)
    source_folder = script.parent
    originals, rewrites, fixes = {}, {}, []
    for path in [script, *local_modules(script)]:
        relative = path.relative_to(source_folder)
        data = path.read_bytes()
        originals[relative] = data.decode()
        if rewritten is not None:
            rewrites[relative] = Path(rewritten).read_text() if path == script else originals[relative]
            continue
        result = process_source(data, str(path), settings, rules)
        if result.error is not None:
            raise VerifyError(result.error)
        rewrites[relative] = result.new_source.decode()
        fixes += [
            {"path": relative.as_posix(), "line": f.line, "code": f.code, "level": f.level.label, "message": f.message}
            for f in result.findings
            if f.applied
        ]
    applied = max((Level.parse(f["level"]) for f in fixes), default=Level.SAFE)
    notes = []
    if rewritten is not None:
        applied = settings.level
        notes.append(
            f"the rewrite is {Path(rewritten).name}, given in place of perfmod's; tolerance of level {applied.label}"
        )
    elif not fixes:
        notes.append(f"no fix applies at level {settings.level.label}: the rewrite is the original")
    if applied is Level.UNSAFE and rewritten is None:
        notes.append(UNSAFE_NOTE)
    if sources is not None:
        sources.update(
            {
                run: {source_folder / path: text for path, text in texts.items()}
                for run, texts in (("original", originals), ("rewritten", rewrites))
            }
        )
    entry = Path(script.name)
    copies = {
        run: {
            path: instrument(text, str(source_folder / path), settings, entry=path == entry)
            for path, text in texts.items()
        }
        for run, texts in (("original", originals), ("rewritten", rewrites))
    }
    sites = {run: _total_sites(files) for run, files in copies.items()}
    if sites["original"]["stepped"] == 0:
        names = ", ".join(str(path) for path in originals)
        raise VerifyError(
            f"no training loop found in {names}: {tool} instruments a for/while loop that calls "
            "<loss>.backward() and <optimizer>.step() (or scaler.step(optimizer)), in the script or in a module "
            "of its folder that it imports. Point verify at the script that runs such a loop."
        )
    if sites["original"] != sites["rewritten"]:
        notes.append(
            f"the rewrite was instrumented at other places than the original ({sites['rewritten']} "
            f"vs {sites['original']}): compare with care"
        )
    folder = Path(folder)
    for run in RUNS:
        shutil.rmtree(folder / run, ignore_errors=True)  # copies an earlier verify left in a kept folder
        mirror = _mirror(source_folder, folder / run, copies[run], exclude=folder)
    if mirror.cut:
        notes.append(_cut_note(mirror.cut))
    manifest = {
        "schema": SCHEMA,
        "script": str(script),
        "entry": script.name,
        "args": list(args),
        "level": settings.level.label,
        "applied_level": applied.label,
        "rtol": rtol,
        "atol": atol,
        "fixes": fixes,
        "sites": sites,
        "notes": notes,
        "linked": {"files": mirror.files, "folders": mirror.folders},
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _profiles(script, folder, args, sources, steps, warmup, settings, level, python, seed, timeout, env) -> dict:
    """Each version once more, under the profiler, for the first PROFILED_STEPS steps
    after the warm-up: {run: profile JSON}."""
    from codemod.profile import PROFILED_STEPS, run_profile

    script = Path(script).resolve()
    settings = _settings(script, settings, level)
    return {
        run: run_profile(
            Path(folder),
            script,
            args,
            steps=min(steps, warmup + PROFILED_STEPS),
            warmup=warmup,
            settings=settings,
            run=run,
            python=python,
            seed=seed,
            timeout=timeout,
            env=env,
            sources=sources[run],
        ).as_json()
        for run in RUNS
    }


def script_settings(script: Path, settings: Settings | None, level: Level | None = None) -> Settings:
    """The settings a run of `script` uses: `settings`, or its [tool.perfmod], with `level`."""
    return _settings(script, settings, level)


def _settings(script: Path, settings: Settings | None, level: Level | None) -> Settings:
    if settings is None:
        try:
            settings = load_settings(script, None)
        except ConfigError as error:
            raise VerifyError(str(error)) from None
    return settings.with_overrides(level=level)


def _total_sites(copies: Mapping[Path, Instrumented]) -> dict[str, int]:
    total = {"loss": 0, "stepped": 0, "batch": 0}
    for copy in copies.values():
        for key, count in copy.sites.items():
            total[key] += count
    return total


# -- the copies ----------------------------------------------------------------------------

COPY_LIMIT = 1 << 20  # bytes: a file up to this size is copied into each run's folder, a bigger one linked
COPY_BUDGET = 64 << 20  # bytes copied into each run's folder in all; past it, small files are linked too
WALK_LIMIT = 10_000  # entries walked per run's folder; a folder that would pass it is linked whole
NOT_WALKED = SKIP_DIRS - {"__pycache__"}  # linked whole, never walked: .git, venvs, build outputs, caches
UNWATCHED = {".git", ".hg", ".svn"}  # linked whole and not watched, as caches: other tools write into them
NAMED = 10  # folders a note names, at most


@dataclass
class Mirror:
    """What `_mirror` linked rather than copied: what a run could write through."""

    files: list[str] = field(default_factory=list)  # linked files, relative, POSIX
    folders: list[str] = field(default_factory=list)  # folders linked whole and watched (their listing)
    cut: list[str] = field(default_factory=list)  # those linked whole because of WALK_LIMIT
    unwatched: list[str] = field(default_factory=list)  # .git and caches: linked whole, not watched


def _mirror(source: Path, target: Path, copies: Mapping[Path, Instrumented], exclude: Path | None = None) -> Mirror:
    """`target` as a mirror of the folder `source` that a run writes into, not through:
    the instrumented copies as files, folders made for real (recursively), files up to
    COPY_LIMIT copied, bigger ones relative symbolic links (see the module docstring).
    `exclude` (the prepared folder, where it lies inside `source`) is left out."""
    mirror = Mirror()
    target.mkdir(parents=True, exist_ok=True)
    for relative, copy in copies.items():
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).write_text(copy.source)
    needed = {parent for relative in copies for parent in relative.parents}  # folders that hold a copy
    if exclude is not None and not exclude.resolve().is_relative_to(source.resolve()):
        exclude = None  # the usual case: a temporary folder elsewhere; no entry to compare with it
    exclude = exclude.resolve() if exclude is not None else None
    pending, walked, budget = [Path(".")], 0, COPY_BUDGET
    while pending:
        folder = pending.pop(0)
        try:
            entries = list(os.scandir(source / folder))
        except OSError:
            entries = []  # unreadable: the run cannot read it either
        if folder not in needed and walked + len(entries) > WALK_LIMIT:
            _link(source / folder, target / folder)
            mirror.folders.append(folder.as_posix())
            mirror.cut.append(folder.as_posix())
            continue
        (target / folder).mkdir(exist_ok=True)
        walked += len(entries)
        for entry in sorted(entries, key=lambda e: e.name):
            relative = folder / entry.name
            if relative in copies or entry.name == "__pycache__":
                continue
            path = source / relative
            if exclude is not None and exclude.is_relative_to(path.resolve()):
                if exclude != path.resolve():  # a folder holding the prepared folder: walked, that one left out
                    needed.add(relative)
                    pending.append(relative)
                continue
            if entry.is_dir(follow_symlinks=False):
                if entry.name in NOT_WALKED or entry.name.endswith(".egg-info") or (path / "pyvenv.cfg").exists():
                    _link(path, target / relative)
                    watched = entry.name not in UNWATCHED and not entry.name.endswith("_cache")
                    (mirror.folders if watched else mirror.unwatched).append(relative.as_posix())
                else:
                    pending.append(relative)
                continue
            try:
                size = entry.stat().st_size if entry.is_file() else None  # follows a link to a file
            except OSError:
                size = None  # a dangling link
            if entry.is_dir():  # a link to a folder (data kept elsewhere): linked whole
                _link(path, target / relative)
                mirror.folders.append(relative.as_posix())
            elif size is not None and size <= min(COPY_LIMIT, budget) and _copy(path, target / relative):
                budget -= size
            else:
                _link(path, target / relative)
                if size is not None:
                    mirror.files.append(relative.as_posix())
    return mirror


def _copy(path: Path, copy: Path) -> bool:
    try:
        shutil.copy2(path, copy)  # with its times: a script that compares them sees the original's
        return True
    except OSError:
        copy.unlink(missing_ok=True)
        return False


def _link(path: Path, link: Path) -> None:
    # Relative, so that a prepared folder inside a repository survives being copied with it.
    link.symlink_to(os.path.relpath(path, link.parent), target_is_directory=path.is_dir())


def _cut_note(folders: Sequence[str]) -> str:
    named = ", ".join(f"{name}/" for name in folders[:NAMED])
    more = f" and {len(folders) - NAMED} more" if len(folders) > NAMED else ""
    return (
        f"the script's folder has more than {WALK_LIMIT} entries: these folders were linked whole, not "
        f"mirrored: {named}{more}. Files a run writes inside them land in the originals (verify fails on "
        "a file created directly inside, but does not see deeper): make the script write elsewhere"
    )


def local_modules(script: Path) -> list[Path]:
    """The .py files in the script's folder that it imports, directly or through
    each other (packages' `__init__.py` included), in the order found."""
    root = script.parent
    found: list[Path] = []
    pending = [script]
    seen = {script}
    while pending:
        path = pending.pop(0)
        tree = _import_tree(path.read_bytes())
        if tree is None:
            continue  # the engine reports it
        for name in _imported_names(tree, path, root):
            for candidate in _module_files(root, name):
                if candidate not in seen:
                    seen.add(candidate)
                    found.append(candidate)
                    pending.append(candidate)
    return found


def _import_tree(data: bytes) -> ast.AST | None:
    """The file as an `ast` tree, for its imports. Where the running Python cannot read it
    (syntax of a newer Python, codemod/syntax.py), a tree of its import statements alone,
    as libcst reads them; None where neither can."""
    try:
        return ast.parse(data)
    except (SyntaxError, ValueError):
        pass
    try:
        module = cst.parse_module(data)
    except (cst.ParserSyntaxError, SyntaxError, UnicodeDecodeError, LookupError, RecursionError):
        return None
    finder = _Imports()
    module.visit(finder)
    return ast.Module(body=[ast.parse(module.code_for_node(node)).body[0] for node in finder.found], type_ignores=[])


class _Imports(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[cst.Import | cst.ImportFrom] = []

    def visit_Import(self, node: cst.Import) -> None:
        self.found.append(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.found.append(node)


def _imported_names(tree: ast.AST, path: Path, root: Path) -> list[str]:
    """Dotted module names an import statement may load: `from a import b` may load `a.b`."""
    names = []
    package = path.parent.relative_to(root).parts  # () for a file at the top of the folder
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 > len(package):
                    continue
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                module = node.module or ""
            if module:
                names.append(module)
            names += [f"{module}.{alias.name}" if module else alias.name for alias in node.names if alias.name != "*"]
    return names


def _module_files(root: Path, name: str) -> list[Path]:
    """Files under `root` that importing `name` runs: each package's __init__.py, then the module."""
    files = []
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:depth])
        if (base / "__init__.py").is_file():
            files.append(base / "__init__.py")
        elif base.with_suffix(".py").is_file() and depth == len(parts):
            files.append(base.with_suffix(".py"))
        elif not base.is_dir():
            break
    return files

"""The `perfmod` command. Commands only parse options, call the engine and
print what codemod.report makes of the results.

Start-up: `--version`, `--help` and a `check` whose every result is in the
cache import neither libcst nor the rules (tests/test_startup.py). The rules'
codes and names come from codemod.catalogue, the engine loads when a file is
analysed (codemod.worker), and the commands that show rules import them.

Streams: stdout carries the product (findings, the summary of a write, a diff,
a JSON or SARIF document, the rewritten source of `apply -`), or the
--output-file does; errors, warnings, progress and any note that would spoil
the product (the summary after a diff) go to stderr.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from codemod.cache import FOLDER as CACHE_FOLDER
from codemod.cache import Cache, project_folder
from codemod.catalogue import catalogue
from codemod.catalogue import known as _known
from codemod.config import ConfigError, Settings, load_settings, parse_codes, save_parsed, suggest
from codemod.console import Output, interrupt_flag, use_color
from codemod.files import atomic_write, discover
from codemod.progress import Progress
from codemod.report.summary import Summary
from codemod.report.text import (
    apply_report,
    check_report,
    finding_line,
    interrupted_report,
    rules_table,
    statistics,
    statistics_table,
)
from codemod.report.text import (
    explain as explain_text,
)
from codemod.result import FileResult, Level
from codemod.runner import Run
from codemod.runner import run as run_files
from codemod.worker import DeepThread, deep_recursion

if TYPE_CHECKING:
    from codemod.rule import Rule

EXIT_OK, EXIT_PENDING, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
STDIN = "-"

EXIT_STATUS_APPLY = """\b
Exit status:
  0    done; without --dry-run, changed files were written
  1    --dry-run/--diff only: some file would change (0 with --exit-zero)
  2    error: a file could not be read, parsed or written, or a bad option or configuration
  130  interrupted (Ctrl-C): the files rewritten until then are listed, no other was touched"""

EXIT_STATUS_CHECK = """\b
Exit status:
  0    nothing to fix at the chosen level (higher-level and report-only findings do not count)
  1    fixes are pending at the chosen level (0 with --exit-zero)
  2    error: a file could not be read or parsed, or a bad option or configuration
  130  interrupted (Ctrl-C)"""


class Failure(click.ClickException):
    """An error that ends the command with status 2, like click's usage errors."""

    exit_code = EXIT_ERROR


class _Group(click.Group):
    """Ctrl-C outside a run (where it is a flag the run looks at) ends the
    command with status 130, not click's "Aborted!" and status 1, which
    `check` uses for pending fixes."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None


def _codes_option(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    try:
        return parse_codes(value, _known())
    except ConfigError as error:
        raise click.BadParameter(str(error)) from None


def _suggest(text: str) -> str:
    return suggest(text, _known())


# One instance of each path type, shared by the options: click names a path type through
# gettext, which looks for translation files on disk each time (a tenth of a millisecond).
PATHS = click.Path(path_type=Path, allow_dash=True)
FILE = click.Path(dir_okay=False, path_type=Path)
FILE_OR_DASH = click.Path(dir_okay=False, path_type=Path, allow_dash=True)
EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
FOLDER = click.Path(file_okay=False, path_type=Path)

TEXT_FORMATS = click.option(
    "--format",
    "--output-format",
    "output_format",
    type=click.Choice(["text", "json", "sarif", "github"]),
    default="text",
    show_default=True,
    help="text for people; json or sarif for tools; github: GitHub Actions annotations (as ruff's).",
)


def analysis_options(command: Callable, format_option: Callable = TEXT_FORMATS) -> Callable:
    """The options `apply`, `check` and `report` share; `report` has its own --format."""
    options = [
        click.argument("paths", nargs=-1, type=PATHS),
        click.option(
            "--level",
            type=click.Choice([level.label for level in Level], case_sensitive=False),
            help="Highest level of fix to apply: safe (bit-identical results, the default), "
            "numeric (results within tolerance) or unsafe (review the diff). "
            "Overrides `level` in [tool.perfmod].",
        ),
        click.option(
            "--select",
            metavar="CODES",
            callback=_codes_option,
            help="Comma-separated codes or prefixes to run (PM101,PM4, or ALL for every rule, the "
            "opt-in ones included). Replaces the configured select and ignore.",
        ),
        click.option(
            "--ignore",
            metavar="CODES",
            callback=_codes_option,
            help="Comma-separated codes or prefixes to skip, on top of the configured ones.",
        ),
        format_option,
        click.option(
            "-j",
            "--jobs",
            type=click.IntRange(min=0),
            default=1,
            show_default=True,
            help="Worker processes analysing files in parallel (one per file to analyse at most; cached files "
            "need none); 0 for one per CPU (os.cpu_count(), busy or not). Workers share the free cores: with fewer "
            "free cores than N, a run takes as long as with that many jobs (-j 2 gains nothing where another "
            "process holds one of 2 cores). The progress line shows the workers.",
        ),
        click.option(
            "--config",
            type=EXISTING_FILE,
            help="pyproject.toml to read [tool.perfmod] from, instead of the nearest one above the first PATH.",
        ),
        click.option(
            "--stdin-filename",
            metavar="PATH",
            help="With PATH `-`: the file name the source stands for, for configuration "
            "(per-file-ignores) and messages.",
        ),
        click.option(
            "--respect-gitignore/--no-respect-gitignore",
            default=None,
            help="Skip files that .gitignore files ignore when walking folders (default: on; "
            "`respect-gitignore` in [tool.perfmod]).",
        ),
        click.option(
            "--force-exclude/--no-force-exclude",
            default=None,
            help="Apply `exclude` to files named on the command line too, as pre-commit names "
            "them (default: off; the pre-commit hooks turn it on).",
        ),
        click.option(
            "--no-cache",
            is_flag=True,
            help=f"Neither read nor write the result cache ({CACHE_FOLDER}/ at the project root).",
        ),
        click.option(
            "--cache-dir",
            type=FOLDER,
            envvar="PERFMOD_CACHE_DIR",
            help=f"Folder of the result cache (default: {CACHE_FOLDER}/ beside the pyproject.toml, "
            "else in the working folder; env PERFMOD_CACHE_DIR).",
        ),
        click.option(
            "-q",
            "--quiet",
            is_flag=True,
            help="Print findings, diffs and errors only: no summary, warnings, notes or progress.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def script_arguments(command: Callable) -> Callable:
    """SCRIPT and the arguments after `--` that go to it: the commands that run a script."""
    command = click.argument("script_args", nargs=-1, type=click.UNPROCESSED)(command)
    return click.argument("script", type=EXISTING_FILE)(command)


python_option = click.option(
    "--python", metavar="PATH", help="Interpreter that runs the script. Default: the one running perfmod."
)
config_option = click.option(
    "--config",
    type=EXISTING_FILE,
    help="pyproject.toml to read [tool.perfmod] from.",
)


def gate_options(command: Callable) -> Callable:
    """The options of the commands that gate CI: `check` and `apply`."""
    options = [
        click.option(
            "--statistics", is_flag=True, help="Count the findings per rule (instead of listing them, for check)."
        ),
        click.option("--exit-zero", is_flag=True, help="Exit 0 even when fixes are pending (errors still exit 2)."),
        click.option(
            "-o",
            "--output-file",
            type=FILE,
            help="Write what goes to stdout (findings, diff, JSON, SARIF) to this file instead, atomically.",
        ),
        click.option(
            "--color/--no-color",
            default=None,
            help="Colour findings and diffs. Default: on a terminal, unless NO_COLOR is set; FORCE_COLOR turns it on.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _paths(paths: Sequence[Path]) -> tuple[Path, ...]:
    """`.` when no path is given, as ruff does."""
    return tuple(paths) or (Path("."),)


def _settings(
    paths: Sequence[Path],
    config: Path | None,
    level: str | None,
    select: tuple[str, ...] | None,
    ignore: tuple[str, ...] | None,
    stdin_filename: str | None,
    respect_gitignore: bool | None = None,
    force_exclude: bool | None = None,
    cache_dir: Path | None = None,
) -> Settings:
    named = [path for path in paths if str(path) != STDIN]
    start = Path(stdin_filename) if stdin_filename else named[0] if named else None
    try:
        settings = load_settings(start, config, known=_known(), memo=cache_dir)
    except ConfigError as error:
        raise Failure(str(error)) from None
    if select is not None:  # as in ruff: a selection on the command line starts afresh
        settings = settings.with_overrides(select=select, ignore=ignore or ())
    elif ignore is not None:
        settings = settings.with_overrides(ignore=settings.ignore + ignore)
    return settings.with_overrides(
        level=Level.parse(level) if level else None, respect_gitignore=respect_gitignore, force_exclude=force_exclude
    )


def _is_stdin(paths: Sequence[Path]) -> bool:
    if STDIN not in map(str, paths):
        return False
    if len(paths) > 1:
        raise click.UsageError("`-` (source on stdin) cannot be combined with other paths")
    return True


def _read_stdin(settings: Settings, stdin_filename: str | None, quiet: bool) -> FileResult:
    data = sys.stdin.buffer.read()
    with deep_recursion():
        thread = DeepThread(data, stdin_filename or STDIN, settings, tuple(_known()))
        thread.start()
        thread.join()
    outcome = thread.outcome()
    _print_notes(outcome.warnings + ([outcome.note] if outcome.note else []), quiet)
    return outcome.result


def _process(
    paths: Sequence[Path],
    settings: Settings,
    *,
    write: bool,
    jobs: int,
    label: str,
    quiet: bool,
    no_cache: bool,
    cache_dir: Path | None,
    cache_read_only: bool = False,
) -> Run:
    """Discover, analyse (and with `write`, rewrite) the files; warnings and notes
    go to stderr here, errors are left to the caller."""

    def skipped(message: str) -> None:
        if not quiet:
            click.echo(f"warning: {message}", err=True)

    with interrupt_flag() as stop:
        files = []
        for file in discover(paths, settings, skipped):
            files.append(file)
            if stop.is_set():
                return Run(total=len(files), interrupted=True)
        if not files and not quiet:
            click.echo("warning: no Python files found under the given paths", err=True)
        folder = cache_dir or project_folder(settings) / CACHE_FOLDER
        cache = None if no_cache else _open_cache(folder, settings, quiet, cache_read_only)
        if cache is not None and not cache_read_only:  # the configuration's tables, for the next run
            save_parsed(folder, lambda path, data: atomic_write(path, data, durable=False))
        with Progress.on_terminal(len(files), label, sys.stderr, quiet) as progress:
            run = run_files(
                files,
                settings,
                write=write,
                known=tuple(_known()),
                jobs=jobs or os.cpu_count() or 1,
                cache=cache,
                on_done=progress.advance,
                stop=stop,
                on_workers=progress.set_workers,
            )
    _print_notes([*run.warnings, *run.notes], quiet)
    return run


def _open_cache(folder: Path, settings: Settings, quiet: bool, read_only: bool) -> Cache | None:
    try:
        return Cache.open(folder, settings, catalogue(), read_only=read_only)
    except OSError as error:
        if not quiet:
            click.echo(
                f"warning: cannot use the cache in {folder} ({error.strerror or error}); running without "
                "it (--no-cache, or --cache-dir elsewhere, silences this)",
                err=True,
            )
        return None


def _print_notes(lines: Sequence[str], quiet: bool) -> None:
    if not quiet:
        for line in lines:
            click.echo(line, err=True)


def _report_errors(results: Sequence[FileResult]) -> None:
    for result in results:
        if result.error:
            click.echo(result.error, err=True)


def _machine_report(
    results: Sequence[FileResult],
    output_format: str,
    settings: Settings,
    with_statistics: bool = False,
    written: bool = False,
) -> str:
    """The document for a format other than text, ending in a newline (or ""); `written`:
    the run made its fixes (`apply` without --dry-run)."""
    if with_statistics:
        return json.dumps(statistics([f for r in results for f in r.findings]), indent=2) + "\n"
    if output_format == "json":
        from codemod.report.as_json import render_json

        return render_json(results, settings.level, written) + "\n"
    if output_format == "github":
        from codemod.report.github import render_github

        return render_github(results)
    from codemod.report.sarif import render_sarif
    from codemod.rules import ALL_RULES

    return render_sarif(results, ALL_RULES, settings.level, written) + "\n"


def _exit_status(results: Sequence[FileResult], pending_fails: bool) -> int:
    if any(result.error for result in results):
        return EXIT_ERROR
    if pending_fails and any(result.changed for result in results):
        return EXIT_PENDING
    return EXIT_OK


def _interrupted(ctx: click.Context, run: Run, write: bool) -> None:
    click.echo(interrupted_report(run.written, len(run.results), run.total, write), err=True)
    ctx.exit(EXIT_INTERRUPTED)


def _close(output: Output) -> None:
    try:
        output.close()
    except OSError as error:
        raise Failure(f"cannot write --output-file {output.file}: {error.strerror or error}") from None


def _check_statistics_format(statistics_flag: bool, output_format: str) -> None:
    if statistics_flag and output_format in ("sarif", "github"):
        raise click.UsageError(
            f"--statistics is text or json; {output_format} output has no place for it: "
            "drop --statistics, or pass --format json for the counts"
        )


def _print_version(ctx: click.Context, value: bool) -> None:
    """`perfmod, version X`, as click.version_option prints it, but read without
    importlib.metadata (codemod.catalogue.version): a tenth of the start-up."""
    if not value or ctx.resilient_parsing:
        return
    from codemod.catalogue import version

    click.echo(f"perfmod, version {version('perfmod')}", color=ctx.color)
    ctx.exit()


# -- commands -----------------------------------------------------------------------------


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  perfmod check                        every Python file under the working folder (CI, pre-commit)
  perfmod apply train.py --dry-run     show the diff, write nothing (also: --diff)
  perfmod apply train.py               rewrite in place (atomic; also: check --fix)
  perfmod rules                        the catalogue
  perfmod explain PM101                one rule's docs and examples
  perfmod verify train.py -- ARGS      run before and after; compare losses and speed
  perfmod report src/ -o review.html   a page to review every change with its reason

\b
Exit status of check and apply: 0 clean or done, 1 fixes pending (check,
--dry-run), 2 error, 130 interrupted; each command's --help has the details.

Settings come from [tool.perfmod] in the nearest pyproject.toml; options override them.
Results are cached in .perfmod_cache/ at the project root (--no-cache).""",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=lambda ctx, param, value: _print_version(ctx, value),
    help="Show the version and exit.",
)
def main() -> None:
    """perfmod: rewrite slow PyTorch training code into fast code, as a reviewable diff.

    Every fix has a level: safe (results bit for bit the same), numeric (within
    floating-point tolerance) or unsafe (review it); --level picks the highest
    applied.
    """


@main.command(
    epilog=f"""\b
Examples:
  perfmod apply train.py --dry-run              show the diff, write nothing (--diff is the same)
  perfmod apply                                 rewrite every .py file under the working folder
  perfmod apply src/ --level numeric -j 0       numeric fixes too, one process per CPU
  perfmod apply src/ --select PM1 --ignore PM103
  perfmod apply - --stdin-filename train.py < train.py > fast.py

Fixes that need a higher level than the chosen one, and findings without a
fix, are listed after the summary. A file is written only if it still holds
what perfmod read (an edit made meanwhile is kept and reported); read-only
files are refused; owner, group and mode are kept; hard-linked files are
written in place. Ctrl-C stops within a second: the file being written is
finished, no other is started.

{EXIT_STATUS_APPLY}"""
)
@analysis_options
@gate_options
@click.option("--dry-run", is_flag=True, help="Print a unified diff instead of writing; exit 1 if a file would change.")
@click.option("--diff", is_flag=True, help="The same as --dry-run, as in ruff.")
@click.pass_context
def apply(ctx, dry_run, diff, **options):
    """Rewrite PATHs (files or folders; default `.`) in place, atomically.

    PATH `-` reads a source from stdin and writes the result to stdout (the
    diff with --dry-run), the report to stderr: for editors.
    """
    _apply(ctx, dry_run=dry_run or diff, **options)


def _apply(
    ctx,
    paths,
    level,
    select,
    ignore,
    output_format,
    jobs,
    config,
    stdin_filename,
    respect_gitignore,
    force_exclude,
    no_cache,
    cache_dir,
    quiet,
    statistics,
    exit_zero,
    output_file,
    color,
    dry_run,
):
    _check_statistics_format(statistics, output_format)
    paths = _paths(paths)
    settings = _settings(
        paths, config, level, select, ignore, stdin_filename, respect_gitignore, force_exclude, cache_dir
    )
    output = Output(output_file)
    colour = not output.to_file and use_color(color)
    if _is_stdin(paths):
        results = [_read_stdin(settings, stdin_filename, quiet)]
        _print_stdin_apply(results[0], settings, output_format, dry_run, colour, output, quiet)
    else:
        run = _process(
            paths,
            settings,
            write=not dry_run,
            jobs=jobs,
            label="perfmod apply",
            quiet=quiet,
            no_cache=no_cache,
            cache_dir=cache_dir,
        )
        if run.interrupted:
            _interrupted(ctx, run, write=not dry_run)
        results = run.results
        _print_apply(results, settings, output_format, dry_run, colour, output, quiet, statistics, len(run.notes))
    _close(output)
    status = _exit_status(results, pending_fails=dry_run)
    ctx.exit(EXIT_OK if exit_zero and status == EXIT_PENDING else status)


def _print_diffs(results: Sequence[FileResult], colour: bool, output: Output) -> None:
    from codemod.report.diff import colorize, unified_diff

    for result in results:
        if result.changed and result.error is None:
            diff = unified_diff(result.path, result.source, result.new_source)
            output.text(colorize(diff) if colour else diff, nl=False, color=colour)


def _print_apply(
    results: Sequence[FileResult],
    settings: Settings,
    output_format: str,
    dry_run: bool,
    colour: bool,
    output: Output,
    quiet: bool,
    with_statistics: bool,
    skipped: int,
) -> None:
    findings = [f for r in results for f in r.findings]
    if output_format != "text":
        output.text(_machine_report(results, output_format, settings, with_statistics, not dry_run), nl=False)
        _report_errors(results)
        return
    if dry_run:  # the diff alone on stdout, so that it can go to `git apply`
        _print_diffs(results, colour, output)
        _report_errors(results)
        if not quiet:
            click.echo(apply_report(results, settings.level, dry_run=True, skipped=skipped), err=True)
            if with_statistics:
                click.echo("\n".join(statistics_table(findings)), err=True)
        return
    _report_errors(results)
    if not quiet:
        output.text(apply_report(results, settings.level, dry_run=False, skipped=skipped))
    if with_statistics and findings:
        output.text("\n".join(statistics_table(findings)))


def _print_stdin_apply(
    result: FileResult, settings: Settings, output_format: str, dry_run: bool, colour: bool, output: Output, quiet: bool
) -> None:
    if dry_run:
        _print_diffs([result], colour, output)
    else:  # an editor replaces its buffer with this: on an error, the source as it came
        output.binary(result.new_source if result.error is None else result.source)
    _report_errors([result])
    if output_format == "text":
        if not quiet:
            for finding in result.findings:
                click.echo(finding_line(finding), err=True)
    else:
        click.echo(_machine_report([result], output_format, settings, written=not dry_run), err=True, nl=False)


@main.command(
    epilog=f"""\b
Examples:
  perfmod check                                 every Python file under the working folder
  perfmod check src/ --level numeric
  perfmod check src/ --format sarif -o perfmod.sarif
  perfmod check --output-format github          annotations in a GitHub Actions job (as ruff's)
  perfmod check --statistics                    findings counted per rule
  perfmod check --fix                           the same as `perfmod apply`
  perfmod check --diff                          the same as `perfmod apply --dry-run`
  perfmod check - --stdin-filename train.py < train.py

Findings read `path:line:col: CODE [*] message`; [*] marks a fix that applies
at the chosen level (`perfmod apply` or `check --fix` makes it). `check` runs
the rules over each file once, as ruff's check does: a fix that only another
fix makes possible is found, and made, by `apply`, which runs the rules again
while its fixes change the file; the exit status is the same. Results are
cached by file content, settings and perfmod version, so a re-run only
processes changed files (--no-cache to turn that off).

{EXIT_STATUS_CHECK}"""
)
@analysis_options
@gate_options
@click.option("--fix", is_flag=True, help="Apply the fixes: the same as `perfmod apply` (exit status as apply's).")
@click.option("--diff", is_flag=True, help="Print the fixes as a diff, write nothing: `perfmod apply --dry-run`.")
@click.pass_context
def check(ctx, fix, diff, **options):
    """Report what `perfmod apply` would change in PATHs (default `.`); never writes."""
    if fix or diff:
        _apply(ctx, dry_run=diff, **options)
    else:
        _check(ctx, **options)


def _check(
    ctx,
    paths,
    level,
    select,
    ignore,
    output_format,
    jobs,
    config,
    stdin_filename,
    respect_gitignore,
    force_exclude,
    no_cache,
    cache_dir,
    quiet,
    statistics,
    exit_zero,
    output_file,
    color,
):
    _check_statistics_format(statistics, output_format)
    paths = _paths(paths)
    settings = _settings(
        paths, config, level, select, ignore, stdin_filename, respect_gitignore, force_exclude, cache_dir
    )
    settings = settings.with_overrides(fixed_point=False)  # one round of the rules (the epilog says why)
    output = Output(output_file)
    colour = not output.to_file and use_color(color)
    skipped = 0
    if _is_stdin(paths):
        results = [_read_stdin(settings, stdin_filename, quiet)]
    else:
        run = _process(
            paths,
            settings,
            write=False,
            jobs=jobs,
            label="perfmod check",
            quiet=quiet,
            no_cache=no_cache,
            cache_dir=cache_dir,
        )
        if run.interrupted:
            _interrupted(ctx, run, write=False)
        results, skipped = run.results, len(run.notes)
    _report_errors(results)
    findings = [f for r in results for f in r.findings]
    if output_format != "text":
        output.text(_machine_report(results, output_format, settings, statistics), nl=False)
    elif quiet:
        for line in statistics_table(findings) if statistics else [finding_line(f, color=colour) for f in findings]:
            output.text(line, color=colour)
    else:
        if statistics and findings:
            output.text("\n".join(statistics_table(findings)))
        output.text(
            check_report(results, settings.level, skipped=skipped, findings=not statistics, color=colour), color=colour
        )
    _close(output)
    status = _exit_status(results, pending_fails=True)
    ctx.exit(EXIT_OK if exit_zero and status == EXIT_PENDING else status)


@main.command(
    epilog="""\b
Examples:
  perfmod rules
  perfmod rules --format json"""
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: a table (summaries wrapped to the terminal, never cut); json: every field of every rule.",
)
def rules(output_format):
    """List the catalogue: code, name, level and what each rule does."""
    from codemod.rules import ALL_RULES

    if output_format == "json":
        from codemod.report.as_json import rules_json

        click.echo(rules_json(ALL_RULES))
        return
    import shutil

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    click.echo(rules_table(ALL_RULES, width))


@main.command(
    epilog="""\b
Examples:
  perfmod explain PM101
  perfmod explain blocking-host-to-device-copy

Exit status 2 for an unknown code, with the closest ones."""
)
@click.argument("code")
def explain(code):
    """Print a rule's documentation, level, expected gain and examples.

    CODE is a rule code such as PM101, or the rule's name.
    """
    click.echo(explain_text(_rule(code)), nl=False)


def _rule(text: str) -> type[Rule]:
    from codemod.rules import ALL_RULES

    wanted = text.strip().upper()
    for rule in ALL_RULES:
        if wanted in (rule.CODE, rule.NAME.upper()):
            return rule
    raise Failure(f"no rule {text!r}. {_suggest(wanted)}")


# -- verify ---------------------------------------------------------------------------------


@main.command(
    epilog="""\b
Examples:
  perfmod verify train.py -- --epochs 1
  perfmod verify train.py --level numeric --steps 50 --warmup 5 -- --batch-size 64
  PERFMOD_AMP=bf16 perfmod verify train.py --level numeric    (autocast on the CPU too)
  perfmod verify train.py --format json > verify.json          (for CI, `perfmod report`)

\b
How it works:
  The script and the local modules it imports are rewritten in memory at
  --level and copied, with the same instrumentation (runtime.trace) added to
  both versions at the training loop the analysis finds: the loss of each
  backward(), the optimizer step, the first model input. Each version runs in
  its own temporary mirror of the script's folder, with the same arguments,
  environment and seed, and stops after --steps optimizer steps. In the mirror
  folders are real and files up to 1 MiB copied, so what a run writes stays
  there; bigger files are linked: if a run changes one (or a folder linked
  whole in a tree of over 10,000 entries), verify fails (exit 2) and names it:
  make the script write elsewhere, e.g. `-- --out /tmp/x`. Losses are read back after the last step, and CUDA
  is synchronised only around the timed steps, so verify adds no per-step
  host sync to either run.

\b
Tolerance, by the highest level among the fixes applied:
  safe     exact: every loss bit for bit equal
  numeric  |rewritten - original| <= atol + rtol * |original|, rtol 1e-2, atol 0
  unsafe   as numeric; unsafe fixes may change losses legitimately (sample order,
           worker processes): review the diff
  --rtol and --atol override. On CUDA, use --deterministic for an exact check
  of a script whose kernels are nondeterministic.

\b
Speed: both versions run --rounds times (3 by default), in alternating order
(original first in odd rounds, the rewrite first in even ones), so that a
machine that slows down or speeds up during the runs favours neither. The
speed-up is the geometric mean of the rounds' steps/s ratios, printed with its
95% range (Student's t over the rounds) and each round's ratio:
  faster / SLOWER           the whole range lies above / below 1.0 (by over 2%)
  no measurable difference  the range holds 1.0 (or lies within 2% of it)
One round gives a ratio but no range: it cannot tell speed from noise. The
losses compared are those of the first round.

\b
Peak memory: CUDA allocated memory when the script used CUDA, else the
process's peak resident set size (RSS), of the first round.

\b
Exit status:
  0  the losses agree within the tolerance (and the rewrite is not measurably slower)
  1  they do not
  2  a run failed (its stderr is shown), a run changed a file beside the script,
     no training loop was found, or a bad option
  3  the losses agree but the rewrite is measurably slower (a WARNING line says
     by how much), e.g. bf16 autocast on a CPU without fast bf16 kernels"""
)
@script_arguments
@click.option(
    "--steps",
    type=click.IntRange(min=2),
    default=20,
    show_default=True,
    help="Optimizer steps each run makes before it is stopped.",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="First steps left out of the timing (start-up, allocator, kernel selection); less than --steps.",
)
@click.option(
    "--level",
    type=click.Choice([level.label for level in Level], case_sensitive=False),
    help="Highest level of fix to apply to the rewritten copy; overrides [tool.perfmod].",
)
@click.option("--select", metavar="CODES", callback=_codes_option, help="Codes or prefixes of the rules to apply.")
@click.option("--ignore", metavar="CODES", callback=_codes_option, help="Codes or prefixes of rules to skip.")
@click.option("--rtol", type=click.FloatRange(min=0), help="Relative tolerance (default: 0 for safe, 1e-2 above).")
@click.option("--atol", type=click.FloatRange(min=0), help="Absolute tolerance (default 0).")
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed for random, torch and numpy, set in both runs before the script's code.",
)
@click.option("--deterministic", is_flag=True, help="Both runs use deterministic kernels only (slower on CUDA).")
@python_option
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=900, show_default=True, help="Seconds each run may take."
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Timed rounds: each runs the original and the rewrite once, in alternating order; the speed-up is "
    "given with its spread over them.",
)
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    help="Run the rewrite under torchrun with N processes (gloo on CPU, NCCL on GPUs) and compare it with "
    "the single-process original at the same global batch: the mean loss over the ranks per step, "
    "throughput summed over them (codemod/verify_run.py).",
)
@click.option(
    "--profile",
    "with_profile",
    is_flag=True,
    help="After the timed rounds, run each version once more under the profiler (as `perfmod profile`) and "
    "show where its step goes, findings ranked by measured share.",
)
@click.option(
    "--keep",
    type=FOLDER,
    help="Prepare the instrumented copies in this folder and leave them, to inspect or to run again "
    "(`python -m codemod.verify_run FOLDER`, which needs torch but not libcst).",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object on stdout, its schema in codemod/verify_run.py.",
)
@config_option
@click.pass_context
def verify(
    ctx,
    script,
    script_args,
    steps,
    warmup,
    level,
    select,
    ignore,
    rtol,
    atol,
    seed,
    deterministic,
    python,
    timeout,
    rounds,
    nproc,
    with_profile,
    keep,
    output_format,
    config,
):
    """Run SCRIPT and its rewrite N steps each; compare losses, speed and memory.

    Arguments after `--` go to the script, the same for both runs.
    """
    from codemod.verify import verify as run_verify
    from codemod.verify_run import EXIT_SLOWER, VerifyError, error_json, render_json, render_text, slower_warning

    settings = _settings([script], config, level, select, ignore, None)
    try:
        result = run_verify(
            script,
            script_args,
            steps=steps,
            warmup=warmup,
            settings=settings,
            python=python,
            rtol=rtol,
            atol=atol,
            seed=seed,
            deterministic=deterministic,
            timeout=timeout,
            keep=keep,
            nproc=nproc,
            rounds=rounds,
            profile=with_profile,
        )
    except VerifyError as error:
        if output_format == "json":
            click.echo(error_json(script, str(error)))
        raise Failure(str(error)) from None
    if output_format == "json":
        click.echo(render_json(result))
        if result.error is not None:
            run = f"{result.error['run']} run: " if result.error["run"] else ""
            click.echo(f"error: {run}{result.error['message']}\n{result.error['stderr']}", err=True)
        elif result.exit_code == EXIT_SLOWER:
            click.echo(slower_warning(result.speed), err=True)
    else:
        click.echo(render_text(result), nl=False)
    if keep is not None:
        click.echo(f"copies kept in {keep}; run them again with `python -m codemod.verify_run {keep}`", err=True)
    ctx.exit(result.exit_code)


# -- profile --------------------------------------------------------------------------------


@main.command(
    epilog="""\b
Examples:
  perfmod profile train.py -- --epochs 1
  perfmod profile train.py --steps 20 --warmup 5 --trace trace.json -- --batch-size 64
  perfmod profile train.py --format json > profile.json

\b
How it works:
  The script is prepared and instrumented as `perfmod verify` does it and runs
  --steps optimizer steps under torch.profiler (CPU activities, CUDA where
  torch has it, Python stacks); the --warmup steps are not recorded. Each
  moment of the recorded steps goes to the stack of the script's own lines that
  led to it, as host Python, torch operators, host-device syncs, data wait,
  a DataLoader's worker hand-off (and on CUDA kernel time by launching line
  and GPU idle time), and then to the finding of `perfmod check` on the
  innermost of those lines. The table
  ranks the findings by their share of the step, with the saving where it can
  be measured, and ends with the time no finding covers.

\b
Exit status:
  0  the profile was taken
  2  the script failed, has no training loop perfmod can step, or a bad option"""
)
@script_arguments
@click.option(
    "--steps",
    type=click.IntRange(min=2),
    default=5,
    show_default=True,
    help="Optimizer steps to run. The profiler holds every operator event of the recorded steps in memory "
    "(about 5 KB each): a few steps of a script that runs many small operators already take gigabytes.",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="First steps not recorded (start-up, allocator, kernel selection); less than --steps.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random, torch and numpy.")
@python_option
@click.option(
    "--timeout", type=click.FloatRange(min=1), default=900, show_default=True, help="Seconds the run may take."
)
@click.option(
    "--trace",
    type=FILE,
    help="Keep the Chrome trace of the recorded steps in this file (open it in Perfetto).",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object on stdout, its schema in the command's docs (codemod/profile.py).",
)
@config_option
@click.pass_context
def profile(ctx, script, script_args, steps, warmup, seed, python, timeout, trace, output_format, config):
    """Run SCRIPT N steps under the profiler; rank its findings by their measured share of a step.

    Arguments after `--` go to the script.
    """
    from codemod.profile import ProfileError, error_json, render_json, render_text
    from codemod.profile import profile as run_profile

    settings = _settings([script], config, None, None, None, None)
    try:
        result = run_profile(
            script,
            script_args,
            steps=steps,
            warmup=warmup,
            settings=settings,
            python=python,
            seed=seed,
            timeout=timeout,
            trace=trace,
        )
    except ProfileError as error:
        if output_format == "json":
            click.echo(error_json(script, str(error)))
        raise Failure(str(error)) from None
    if output_format == "json":
        click.echo(render_json(result))
        if result.error is not None:
            click.echo(f"error: {result.error['message']}\n{result.error['stderr']}", err=True)
    else:
        click.echo(render_text(result), nl=False)
    ctx.exit(EXIT_ERROR if result.error is not None else EXIT_OK)


# -- report ---------------------------------------------------------------------------------

EXIT_STATUS_REPORT = """\b
Exit status:
  0    the report was written (pending fixes do not count: `check` is the gate)
  2    error: a file could not be read or parsed (it is in the report too, and on
       stderr), a bad option, configuration or --verify-json, or -o could not be written
  130  interrupted (Ctrl-C): nothing was written"""

REPORT_FORMATS = click.option(
    "--format",
    "--output-format",
    "output_format",
    type=click.Choice(["html", "markdown"]),
    default="html",
    show_default=True,
    help="html: one self-contained page (needs -o); markdown: a pull-request comment.",
)


@main.command(
    epilog=f"""\b
Examples:
  perfmod report src/ -o review.html
  perfmod report train.py --level numeric -o review.html --verify-json verify.json
  perfmod report src/ --format markdown > comment.md

The sources are never modified; only the -o file is written (atomically). Results
that `apply --dry-run` cached are used, and those of `check` for files without
fixes (`check` runs the rules once, `report` as often as `apply`); `report` itself
adds nothing to the cache.

{EXIT_STATUS_REPORT}"""
)
@functools.partial(analysis_options, format_option=REPORT_FORMATS)
@click.option(
    "-o",
    "--output",
    type=FILE_OR_DASH,
    help="File to write (atomically); `-` or none for stdout (markdown only without -o).",
)
@click.option(
    "--verify-json",
    type=FILE,
    help="A `perfmod verify --format json` result to show with the changes.",
)
@click.option(
    "--profile-json",
    type=FILE,
    help="A `perfmod profile --format json` result (or `verify --profile`'s) to show: where the step goes, "
    "findings ranked by measured share.",
)
@click.pass_context
def report(
    ctx,
    paths,
    level,
    select,
    ignore,
    output_format,
    jobs,
    config,
    stdin_filename,
    respect_gitignore,
    force_exclude,
    no_cache,
    cache_dir,
    quiet,
    output,
    verify_json,
    profile_json,
):
    """Render a review of what `perfmod apply` would change in PATHs (default `.`): per
    file the diff, each change annotated with its rule, level, reason and expected gain."""
    # The page renderers (jinja2) load only for `report`: `check` in a pre-commit hook stays light.
    from codemod.report.html import render_html
    from codemod.report.markdown import render_markdown
    from codemod.report.review import VerifyError, load_profile, load_verify
    from codemod.rules import ALL_RULES

    paths = _paths(paths)
    settings = _settings(
        paths, config, level, select, ignore, stdin_filename, respect_gitignore, force_exclude, cache_dir
    )
    if output is None and output_format == "html":
        raise click.UsageError("the HTML page goes to a file: pass -o FILE.html (or -o - for stdout)")
    try:
        verify = load_verify(verify_json) if verify_json else None
        profiled = load_profile(profile_json) if profile_json else None
    except VerifyError as error:
        raise Failure(str(error)) from None
    if _is_stdin(paths):
        results = [_read_stdin(settings, stdin_filename, quiet)]
    else:
        run = _process(
            paths,
            settings,
            write=False,
            jobs=jobs,
            label="perfmod report",
            quiet=quiet,
            no_cache=no_cache,
            cache_dir=cache_dir,
            cache_read_only=True,
        )
        if run.interrupted:
            _interrupted(ctx, run, write=False)
        results = run.results
    if (
        output is not None
        and str(output) != STDIN
        and any(os.path.realpath(result.path) == os.path.realpath(output) for result in results)
    ):
        raise Failure(f"-o {output} is one of the files to review; `report` never writes a source")
    _report_errors(results)
    if output_format == "html":
        import shlex

        command = " ".join(["perfmod report", *(shlex.quote(str(p)) for p in paths), "--level", settings.level.label])
        page = render_html(results, settings.level, ALL_RULES, verify=verify, profile=profiled, command=command)
    else:
        page = render_markdown(results, settings.level, ALL_RULES, verify=verify, profile=profiled)
    if output is None or str(output) == STDIN:
        click.echo(page, nl=False)
    else:
        try:
            atomic_write(output, page.encode("utf-8"))
        except OSError as error:
            raise Failure(f"cannot write {output}: {error.strerror or error}") from None
        summary = Summary.of(results)
        if not quiet:
            click.echo(
                f"Wrote {output}: {len(summary.applied)} fixes in {len(summary.changed)} of "
                f"{summary.checked} files at level {settings.level.label}.",
                err=True,
            )
    ctx.exit(EXIT_ERROR if any(result.error for result in results) else EXIT_OK)

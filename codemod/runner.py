"""A run over many files: read each once, take what the cache knows, analyse
the rest (one thread, or `jobs` worker processes), and write the fixed files
back, one at a time, from this process only.

Stopping: when `stop` is set (the command line sets it on Ctrl-C) the run
stops waiting within a twentieth of a second, kills its worker processes and
writes no further file; a write under way when it was set is finished
(writes never look at `stop` half-way). The files written so far are in
`Run.written`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from codemod import worker
from codemod.files import Snapshot, WriteRefused, read, write_back
from codemod.result import FileResult
from codemod.worker import RECURSION_LIMIT, DeepThread, Outcome, analyse_deep, deep_recursion

if TYPE_CHECKING:
    from codemod.cache import Cache
    from codemod.config import Settings

POLL_SECONDS = 0.05


class Run(NamedTuple):  # a named tuple: a tenth of a dataclass's cost to define, which a cached run pays
    results: Sequence[FileResult] = ()  # in the order of the paths, files finished only
    warnings: Sequence[str] = ()  # "path:line: warning: ..."
    notes: Sequence[str] = ()  # "path:1:1: note: ..." (left alone, no error)
    written: Sequence[str] = ()  # paths rewritten, in the order of the paths
    total: int = 0  # files the run was given
    cached: int = 0  # files whose results came from the cache
    interrupted: bool = False


def run(
    paths: Sequence[Path],
    settings: Settings,
    *,
    write: bool,
    known: Sequence[str],
    jobs: int = 1,
    cache: Cache | None = None,
    on_done: Callable[[], None] | None = None,
    stop: threading.Event | None = None,
    on_workers: Callable[[int], None] | None = None,
) -> Run:
    """Process `paths`; `jobs` > 1: in up to that many worker processes (one per file
    to analyse at most; files whose result is cached need none), whose number
    `on_workers` is told before they start."""
    stop = stop or threading.Event()
    on_done = on_done or (lambda: None)
    outcomes: dict[int, Outcome] = {}
    written: dict[int, str] = {}
    snapshots: dict[int, Snapshot] = {}
    todo: list[int] = []
    interrupted = False
    cached = 0

    for index, path in enumerate(paths):
        if stop.is_set():
            interrupted = True
            break
        try:
            snapshots[index] = snapshot = read(path)
        except OSError as error:
            message = f"{path}:1:1: error: cannot read: {error.strerror or error}"
            outcomes[index] = Outcome(FileResult(path=str(path), source=b"", error=message))
            on_done()
            continue
        hit = cache.get(str(path), snapshot.digest, snapshot.data) if cache is not None else None
        # `apply` never writes from an entry: a file with fixes is processed afresh.
        if hit is not None and not (write and hit.result.changed and hit.result.error is None):
            outcomes[index] = hit
            cached += 1
            on_done()
        else:
            todo.append(index)

    def finish(index: int, outcome: Outcome) -> None:
        outcomes[index] = outcome
        path, result = paths[index], outcome.result
        if cache is not None:
            cache.put(str(path), snapshots[index].digest, outcome)
        if write and result.changed and result.error is None:
            try:
                write_back(path, result.new_source, snapshots[index])
                written[index] = str(path)
            except WriteRefused as error:
                result.error = f"{path}:1:1: error: {error}"
            except OSError as error:
                result.error = f"{path}:1:1: error: cannot write: {error.strerror or error}"
        on_done()

    work = [(index, snapshots[index].data, str(paths[index]), settings, tuple(known)) for index in todo]
    if not interrupted and work:
        # The engine (libcst, the rules) loads only now that a file needs it, and in this
        # process: forked workers start with it, and a Ctrl-C during the import is ours.
        worker.load_engine()
        if jobs <= 1 or len(work) == 1:
            interrupted = _in_threads(work, finish, stop)
        else:
            # Largest first: the last task to finish is then a small one, so the jobs end together.
            work.sort(key=lambda item: -len(item[1]))
            if on_workers is not None:
                on_workers(min(jobs, len(work)))
            interrupted = _in_processes(work, finish, stop, jobs)

    done = sorted(outcomes)
    return Run(
        results=[outcomes[i].result for i in done],
        warnings=[w for i in done for w in outcomes[i].warnings],
        notes=[outcomes[i].note for i in done if outcomes[i].note],
        written=[written[i] for i in sorted(written)],
        total=len(paths),
        cached=cached,
        interrupted=interrupted or stop.is_set(),
    )


def _in_threads(work, finish, stop: threading.Event) -> bool:
    """One file at a time, each in a thread with a large stack; True if stopped."""
    with deep_recursion():
        for index, *arguments in work:
            thread = DeepThread(*arguments)
            thread.start()
            while thread.is_alive() and not stop.is_set():
                thread.join(POLL_SECONDS)
            if stop.is_set():
                return True  # the thread is a daemon: left to finish (or not) on its own
            finish(index, _answer(thread.outcome, *arguments[:2]))
    return False


def _in_processes(work, finish, stop: threading.Event, jobs: int) -> bool:
    """`jobs` worker processes; results come back in any order; True if stopped."""
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    # fork: workers start at once and see this process's catalogue, plugins included
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    pool = context.Pool(processes=min(jobs, len(work)), initializer=_start_worker)
    try:
        outcomes = pool.imap_unordered(_work, work)  # one file a task: the IPC is small beside the analysis
        for _ in range(len(work)):
            while True:
                if stop.is_set():
                    return True
                try:
                    index, outcome = outcomes.next(timeout=POLL_SECONDS)
                    break
                except multiprocessing.TimeoutError:
                    continue
            if stop.is_set():
                return True
            finish(index, outcome)
        return False
    finally:
        pool.terminate()
        pool.join()


def _start_worker() -> None:
    # Ctrl-C reaches the whole process group; the parent decides, and stops the workers itself.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), RECURSION_LIMIT))


def _work(item) -> tuple[int, Outcome]:
    index, data, path, settings, known = item
    return index, _answer(lambda: analyse_deep(data, path, settings, known), data, path)


def _answer(get: Callable[[], Outcome], data: bytes, path: str) -> Outcome:
    """The outcome, or an internal error for this file alone: every file gets an answer."""
    try:
        return get()
    except Exception as error:
        message = f"{path}:1:1: error: internal error, file left unchanged ({type(error).__name__}: {error})"
        return Outcome(FileResult(path=path, source=data, error=message))

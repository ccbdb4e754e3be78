"""What the command line needs from the terminal: where the product goes
(stdout or --output-file), whether to colour it, and Ctrl-C as a flag."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from codemod.files import atomic_write


def use_color(flag: bool | None, stream=None) -> bool:
    """--color/--no-color if given; else FORCE_COLOR (set, not 0: on), then
    NO_COLOR (set: off, no-color.org), then whether `stream` is a terminal."""
    if flag is not None:
        return flag
    force = os.environ.get("FORCE_COLOR")
    if force is not None and force != "":
        return force.lower() not in ("0", "false", "no")
    if os.environ.get("NO_COLOR"):
        return False
    stream = stream if stream is not None else sys.stdout
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Output:
    """stdout, or a file named by --output-file that is written (atomically) on close."""

    def __init__(self, file: Path | None) -> None:
        self.file = file
        self.parts: list[bytes] = []

    @property
    def to_file(self) -> bool:
        return self.file is not None

    def text(self, text: str, nl: bool = True, color: bool = False) -> None:
        if self.file is None:
            click.echo(text, nl=nl, color=color)
        else:
            self.parts.append((click.unstyle(text) + ("\n" if nl else "")).encode("utf-8"))

    def binary(self, data: bytes) -> None:
        if self.file is None:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            self.parts.append(data)

    def close(self) -> None:
        """Write the file; OSError when it cannot be."""
        if self.file is not None:
            atomic_write(self.file, b"".join(self.parts))


@contextmanager
def interrupt_flag() -> Iterator[threading.Event]:
    """An event that Ctrl-C (SIGINT) sets instead of raising KeyboardInterrupt,
    so that the run decides where to stop and no write is cut short; later
    presses set it again. Outside the main thread (where signals cannot be
    caught) the event is simply never set by a signal."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)

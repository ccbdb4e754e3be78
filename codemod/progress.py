"""A one-line progress display on a terminal: files done of the total, the
rate and the time left (and the worker processes, with -j), redrawn at most ten times a second, cleared at the
end. Silent when the stream is not a terminal (piped, in CI logs)."""

from __future__ import annotations

import time
from typing import TextIO

MIN_FILES = 20  # fewer files finish before a display would tell anything
REDRAW_SECONDS = 0.1


class Progress:
    def __init__(self, total: int, label: str, stream: TextIO, enabled: bool, clock=time.monotonic) -> None:
        self.total, self.label, self.stream, self.clock = total, label, stream, clock
        self.enabled = enabled and total > MIN_FILES
        self.done = 0
        self.started = clock()
        self.drawn = float("-inf")
        self.width = 0
        self.workers = 1  # worker processes analysing files (1: this process alone)
        if self.enabled:
            self._draw()

    @classmethod
    def on_terminal(cls, total: int, label: str, stream: TextIO, quiet: bool = False) -> Progress:
        return cls(total, label, stream, enabled=not quiet and _is_terminal(stream))

    def advance(self, count: int = 1) -> None:
        self.done += count
        if self.enabled and (self.done >= self.total or self.clock() - self.drawn >= REDRAW_SECONDS):
            self._draw()

    def set_workers(self, workers: int) -> None:
        """The run started `workers` processes (shown from the next redraw on)."""
        self.workers = workers

    def line(self) -> str:
        percent = 100 * self.done // self.total if self.total else 100
        text = f"{self.label}: {self.done}/{self.total} files ({percent}%)"
        if self.workers > 1:
            text += f", {self.workers} workers"
        elapsed = self.clock() - self.started
        if self.done and elapsed > 0:
            rate = self.done / elapsed
            text += f", {rate:.0f} files/s" if rate >= 10 else f", {rate:.1f} files/s"
            if self.done < self.total:
                text += f", {_duration((self.total - self.done) / rate)} left"
        return text

    def _draw(self) -> None:
        text = self.line()
        self.stream.write("\r" + text + " " * max(0, self.width - len(text)))
        self.stream.flush()
        self.width = len(text)
        self.drawn = self.clock()

    def close(self) -> None:
        """Clear the line, so that what is printed next starts clean."""
        if self.enabled and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02}m"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False

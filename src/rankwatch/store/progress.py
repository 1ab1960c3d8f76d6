"""Progress display for long steps, shown only once a step has run a second.

Library code takes a Reporter and calls `step(label)`; it never prints by
itself. The console reporter draws a rich progress bar on a terminal (rich is
imported only then) and writes plain lines otherwise.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

SHOW_AFTER_S = 1.0


class Reporter:
    """Does nothing: the default for library callers."""

    @contextlib.contextmanager
    def step(
        self, label: str, fraction: Callable[[], float | None] | None = None
    ) -> Iterator[None]:
        yield


class ConsoleReporter(Reporter):
    """Reports steps over a second on `stream` (stderr by default)."""

    def __init__(self, stream: TextIO | None = None, show_after_s: float = SHOW_AFTER_S) -> None:
        self.stream = stream or sys.stderr
        self.show_after_s = show_after_s
        self.fancy = bool(getattr(self.stream, "isatty", lambda: False)())

    @contextlib.contextmanager
    def step(
        self, label: str, fraction: Callable[[], float | None] | None = None
    ) -> Iterator[None]:
        done = threading.Event()
        shown: list[bool] = []
        start = time.monotonic()
        watcher = threading.Thread(
            target=self._watch, args=(label, fraction, done, shown), daemon=True
        )
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()
            if shown and not self.fancy:
                self.stream.write(f"rankwatch: {label}: done in {time.monotonic() - start:.1f} s\n")
                self.stream.flush()

    def _watch(self, label: str, fraction, done: threading.Event, shown: list[bool]) -> None:
        if done.wait(self.show_after_s):
            return
        shown.append(True)
        if not self.fancy:
            self.stream.write(f"rankwatch: {label}...\n")
            self.stream.flush()
            done.wait()
            return
        self._bar(label, fraction, done)

    def _bar(self, label: str, fraction, done: threading.Event) -> None:
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )
        except ImportError:  # rich is optional: plain lines then
            self.fancy = False
            self.stream.write(f"rankwatch: {label}...\n")
            done.wait()
            return

        console = Console(file=self.stream)
        columns = [
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
        ]
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(label, total=None)
            while not done.wait(0.1):
                value = _safe(fraction)
                if value is not None and 0.0 < value <= 1.0:
                    bar.update(task, total=1.0, completed=value)


def _safe(fraction: Callable[[], float | None] | None) -> float | None:
    if fraction is None:
        return None
    try:
        return fraction()
    except Exception:  # a progress probe must never break the work it watches
        return None


def reporter_for(progress: bool | Reporter) -> Reporter:
    if isinstance(progress, Reporter):
        return progress
    return ConsoleReporter() if progress else Reporter()

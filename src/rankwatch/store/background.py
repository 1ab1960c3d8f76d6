"""Work on a thread of its own while the caller goes on: ingest overlaps what only
waits on other threads' results (the state files while the op files are parsed,
the kept collective columns joined while the tables are finished)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def start(work: Callable[[], T]) -> Callable[[], T]:
    """Run work() on a daemon thread now; the call returned waits for it and returns
    its result, or raises what it raised (in the caller's thread)."""
    done: list[T] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            done.append(work())
        except BaseException as exc:  # raised by the caller of the call returned
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result() -> T:
        thread.join()
        if failures:
            raise failures[0]
        return done[0]

    return result


def run_all(works: list[Callable[[], T]]) -> list[T]:
    """Each of works on a thread of its own, all at once; their results in order once
    every one has ended (none is left running), or the first error one raised."""
    waits = [start(work) for work in works]
    results: list[T] = []
    failures: list[BaseException] = []
    for wait in waits:
        try:
            results.append(wait())
        except BaseException as exc:  # the others are waited for first
            failures.append(exc)
    if failures:
        raise failures[0]
    return results

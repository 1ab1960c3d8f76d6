"""Collecting what is wrong with record files, each bad line once.

A file whose every line is bad (say, written by a newer plugin) should not
produce a million messages: the first few lines of each kind are kept one by
one, the rest are counted on the last kept entry.
"""

from __future__ import annotations

from collections import defaultdict

from rankwatch.model import Problem

LISTED_PER_KIND = 5


class ProblemLog:
    """Problems found while reading, grouped per (file, kind)."""

    def __init__(self, listed_per_kind: int = LISTED_PER_KIND) -> None:
        self.listed_per_kind = listed_per_kind
        self._listed: dict[tuple[str, str], list[Problem]] = defaultdict(list)
        self._extra: dict[tuple[str, str], int] = defaultdict(int)
        self.bad_lines: dict[str, int] = defaultdict(int)
        self._order: list[tuple[str, str]] = []

    def add(
        self, file: str, line: int | None, kind: str, message: str, bad_line: bool = True
    ) -> None:
        key = (file, kind)
        if key not in self._listed:
            self._order.append(key)
        elif Problem(file, line, kind, message) in self._listed[key]:
            return  # said already (a file read again another way): said once
        if bad_line:
            self.bad_lines[file] += 1
        if len(self._listed[key]) < self.listed_per_kind:
            self._listed[key].append(Problem(file, line, kind, message))
        else:
            self._extra[key] += 1

    def problems(self) -> list[Problem]:
        out: list[Problem] = []
        for key in self._order:
            listed = self._listed[key]
            extra = self._extra.get(key, 0)
            if extra:
                last = listed[-1]
                listed = listed[:-1] + [
                    Problem(last.file, last.line, last.kind, last.message, extra)
                ]
            out += listed
        return out

    def __len__(self) -> int:
        return sum(len(v) for v in self._listed.values()) + sum(self._extra.values())

"""Errors raised by rankwatch.

Every error derives from RankwatchError, carries the location it is about
(file, line, field) when known, and the exit code the CLI uses for it.
"""

from __future__ import annotations

import os


class RankwatchError(Exception):
    """Base of every rankwatch error; the CLI prints it and exits with exit_code."""

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        file: str | os.PathLike[str] | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = None if file is None else os.fspath(file)
        self.line = line
        self.field = field

    def __str__(self) -> str:
        # "file:line: field: message", leaving out what is unknown, so editors
        # and terminals can jump to the location.
        where = ""
        if self.file is not None:
            where = self.file if self.line is None else f"{self.file}:{self.line}"
            where += ": "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.message}"


class ConfigError(RankwatchError):
    """A setting (CLI option, argument or environment value) is invalid."""

    exit_code = 2


class PluginNotFoundError(RankwatchError):
    """The profiler plugin .so is not where the installed package should have it."""

    exit_code = 3


class RecordError(RankwatchError):
    """A record file or record is malformed."""

    exit_code = 4


class SchemaVersionError(RecordError):
    """A record was written with a newer schema than this rankwatch supports."""

    def __init__(
        self,
        found: int,
        supported: int,
        *,
        file: str | os.PathLike[str] | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(
            f"record schema {found} is newer than the newest this rankwatch "
            f"reads (schema {supported}); upgrade rankwatch to read it",
            file=file,
            line=line,
            field="schema",
        )
        self.found = found
        self.supported = supported

"""rankwatch.errors: errors say where they happened and how the CLI exits."""

from __future__ import annotations

from pathlib import Path

from rankwatch.errors import (
    ConfigError,
    PluginNotFoundError,
    RankwatchError,
    RecordError,
    SchemaVersionError,
)


def test_message_is_prefixed_with_file_line_and_field() -> None:
    error = RecordError("bad value", file=Path("run/a.log"), line=12, field="rank")
    assert str(error) == "run/a.log:12: rank: bad value"


def test_unknown_parts_of_the_location_are_left_out() -> None:
    assert str(RankwatchError("plain")) == "plain"
    assert str(ConfigError("x", field="interval_ms")) == "interval_ms: x"
    assert str(RecordError("x", file="a.log")) == "a.log: x"


def test_every_error_kind_has_its_own_nonzero_exit_code() -> None:
    kinds = [RankwatchError, ConfigError, PluginNotFoundError, RecordError]
    codes = [kind.exit_code for kind in kinds]
    assert all(code > 0 for code in codes)
    assert len(set(codes)) == len(codes)


def test_schema_version_error_is_a_record_error_with_both_versions() -> None:
    error = SchemaVersionError(3, 1, file="a.log", line=1)
    assert isinstance(error, RecordError)
    assert (error.found, error.supported) == (3, 1)
    assert "schema 3" in str(error) and "schema 1" in str(error)

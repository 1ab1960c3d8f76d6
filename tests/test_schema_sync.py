"""docs/record-format.md and rankwatch.schema describe the same fields.

The doc's tables are the contract other tools read; schema.py is what rankwatch
itself uses. A field changed in one and not the other fails here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from helpers import RECORD_FORMAT_DOC
from rankwatch import schema

ALL_GROUPS = {**schema.OP_GROUPS, **schema.STATE_KINDS}
STATE_COMMON_KEYS = ("schema", "kind", "ts_ns", "hostname", "pid")


@dataclass(frozen=True)
class DocRow:
    name: str
    type: str
    unit: str
    meaning: str


def _table_row(line: str) -> list[str] | None:
    if not line.startswith("|"):
        return None
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def parse_doc_groups(text: str) -> dict[str, list[DocRow]]:
    """Field rows under every `### <group>` heading, keyed by the group's first word."""
    groups: dict[str, list[DocRow]] = {}
    current: list[DocRow] | None = None
    for line in text.splitlines():
        heading = re.match(r"^###\s+(\w+)", line)
        if heading:
            current = groups.setdefault(heading.group(1), [])
            continue
        if line.startswith("#"):
            current = None  # a higher-level heading ends the group
            continue
        cells = _table_row(line)
        if current is None or cells is None or cells[0] in ("name", "---"):
            continue
        assert len(cells) == 4, f"record-format.md: a field row needs 4 cells: {line!r}"
        current.append(DocRow(*cells))
    return groups


@pytest.fixture(scope="module")
def doc_groups() -> dict[str, list[DocRow]]:
    return parse_doc_groups(RECORD_FORMAT_DOC.read_text(encoding="utf-8"))


def test_doc_and_schema_have_the_same_groups(doc_groups: dict[str, list[DocRow]]) -> None:
    assert list(doc_groups) == list(ALL_GROUPS)


@pytest.mark.parametrize("group", list(ALL_GROUPS))
def test_group_fields_match_the_doc(group: str, doc_groups: dict[str, list[DocRow]]) -> None:
    # Given the doc's rows and schema.py's fields for one group
    documented = [(row.name, row.type, row.unit) for row in doc_groups.get(group, [])]
    defined = [(field.name, field.type, field.unit) for field in ALL_GROUPS[group]]
    # Then they agree field by field, in order
    assert defined == documented


@pytest.mark.parametrize("kind", list(schema.STATE_KINDS))
def test_state_fields_are_nullable_exactly_where_the_doc_says(
    kind: str, doc_groups: dict[str, list[DocRow]]
) -> None:
    documented = {row.name for row in doc_groups[kind] if re.search(r"\bnull\b", row.meaning)}
    nullable = {field.name for field in schema.STATE_KINDS[kind] if field.nullable}
    assert nullable == documented


@pytest.mark.parametrize("kind", list(schema.STATE_KINDS))
def test_every_state_record_carries_the_common_keys(kind: str) -> None:
    names = [field.name for field in schema.STATE_KINDS[kind]]
    assert names[: len(STATE_COMMON_KEYS)] == list(STATE_COMMON_KEYS)


def test_doc_describes_the_current_schema_version() -> None:
    title = RECORD_FORMAT_DOC.read_text(encoding="utf-8").splitlines()[0]
    assert re.search(rf"\(schema {schema.SCHEMA_VERSION}\)", title), title


def test_parser_reads_a_table_under_a_heading() -> None:
    # Guards the parser itself, so an empty parse cannot pass the sync tests.
    text = "## Op\n### demo (x)\n\n| name | type | unit | meaning |\n| --- | --- | --- | --- |\n"
    text += "| a | int | ns | the a |\n| b | string | | the b |\n## Next\n| c | int | | no |\n"
    assert parse_doc_groups(text) == {
        "demo": [DocRow("a", "int", "ns", "the a"), DocRow("b", "string", "", "the b")]
    }

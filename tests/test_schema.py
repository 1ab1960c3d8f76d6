"""rankwatch.schema: validating records and their schema version."""

from __future__ import annotations

from typing import Any

import pytest

from rankwatch import schema
from rankwatch.errors import RecordError, SchemaVersionError


def coll_record() -> dict[str, Any]:
    """A complete, valid op record for one GPU-timed AllReduce."""
    return {
        "header": {"id": "0x0123456789abcdef", "comm_name": "unknown", "rank": 1,
                   "n_ranks": 4, "nnodes": 1},
        "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "0.1.0",
                     "rec_mechanism": "nccl_profiler_interface",
                     "dump_timestamp_us": 1764400000000000, "hostname": "node0", "pid": 42},
        "coll_perf": {"coll": "AllReduce", "coll_sn": 7, "coll_msg_size_bytes": 4096,
                      "coll_exec_time_us": 12, "coll_timing_source": "kernel_gpu",
                      "coll_algobw_gbs": 0.34, "coll_busbw_gbs": 0.51},
        "rankwatch": {"schema": 1, "kind": "coll", "job_id": "unknown", "device": 1,
                      "func": "AllReduce", "seq": 7, "datatype": "ncclFloat32",
                      "count": 1024, "msg_size_bytes": 4096, "root": None, "peer": None,
                      "algo": "RING", "proto": "SIMPLE", "nchannels": 2,
                      "graph_captured": False, "api_start_ns": 1, "api_end_ns": 2,
                      "enqueue_start_ns": 3, "enqueue_end_ns": 4, "arrival_ns": 1,
                      "gpu_start_ns": 5, "gpu_end_ns": 12005, "gpu_start_raw_ns": 100,
                      "gpu_end_raw_ns": 12100, "clock_offset_ns": -95,
                      "clock_error_ns": 800, "exec_time_ns": 12000, "gpu_timed": True,
                      "gpu_start_stale": False,
                      "channels_started": 2, "channels_stopped": 2, "complete": True},
    }  # fmt: skip


def p2p_record() -> dict[str, Any]:
    record = coll_record()
    del record["coll_perf"]
    record["p2p_perf"] = {"p2p": "Send", "p2p_sn": 0, "p2p_peer": 2, "p2p_msg_size_bytes": 64,
                          "p2p_exec_time_us": 3, "p2p_timing_source": "collective_cpu",
                          "p2p_algobw_gbs": 0.02, "p2p_busbw_gbs": 0.02}  # fmt: skip
    record["rankwatch"].update(kind="p2p", func="Send", seq=0, peer=2, algo=None, proto=None)
    return record


def clock_record(**changes: Any) -> dict[str, Any]:
    record = {"schema": 1, "kind": "clock", "ts_ns": 10, "hostname": "node0", "pid": 42,
              "comm_id": "0x0123456789abcdef", "rank": 0, "n_ranks": 4, "offset_ns": 5,
              "error_ns": 1, "lower_ns": 4, "upper_ns": 6, "samples": 3,
              "window_start_ns": 0}  # fmt: skip
    record.update(changes)
    return record


def test_complete_coll_and_p2p_records_are_valid() -> None:
    assert schema.validate_op_record(coll_record()) == []
    assert schema.validate_op_record(p2p_record()) == []


def test_missing_key_is_reported_with_its_group() -> None:
    # Given a record whose coll_perf lacks its sequence number
    record = coll_record()
    del record["coll_perf"]["coll_sn"]
    # Then the one problem names the group and the key
    assert schema.validate_op_record(record) == ["coll_perf.coll_sn: missing"]


def test_wrong_type_is_reported_with_expected_and_found_types() -> None:
    record = coll_record()
    record["header"]["rank"] = "1"
    assert schema.validate_op_record(record) == ["header.rank: expected int, got string"]


def test_bool_is_not_accepted_as_an_int() -> None:
    record = coll_record()
    record["header"]["n_ranks"] = True
    assert schema.validate_op_record(record) == ["header.n_ranks: expected int, got bool"]


def test_whole_number_is_accepted_as_a_float() -> None:
    record = coll_record()
    record["coll_perf"]["coll_busbw_gbs"] = 0
    assert schema.validate_op_record(record) == []


def test_null_is_allowed_in_extension_fields_only() -> None:
    # Given nulls in an extension field and in an Inspector field
    record = coll_record()
    record["rankwatch"]["gpu_start_ns"] = None
    record["metadata"]["pid"] = None
    # Then only the Inspector field is a problem
    assert schema.validate_op_record(record) == ["metadata.pid: expected int, got null"]


def test_missing_group_is_reported() -> None:
    record = coll_record()
    del record["header"]
    assert schema.validate_op_record(record) == ["header: expected object, missing"]


def test_perf_object_must_match_the_kind() -> None:
    # Given a p2p record that also carries a coll_perf object
    record = p2p_record()
    record["coll_perf"] = coll_record()["coll_perf"]
    assert schema.validate_op_record(record) == [
        "coll_perf: unexpected in a record carrying p2p_perf"
    ]


def test_record_without_a_perf_object_is_reported() -> None:
    record = coll_record()
    del record["coll_perf"]
    assert schema.validate_op_record(record) == ["coll_perf: expected object, missing"]


def test_non_object_record_is_reported() -> None:
    assert schema.validate_op_record([1, 2]) == ["op record: expected object, got array"]
    assert schema.validate_state_record("x") == ["state record: expected object, got string"]


def test_extra_keys_are_allowed() -> None:
    record = coll_record()
    record["rankwatch"]["added_later"] = 1
    assert schema.validate_op_record(record) == []


def test_valid_state_record_passes() -> None:
    assert schema.validate_state_record(clock_record()) == []


def test_documented_nullable_state_field_may_be_null() -> None:
    assert schema.validate_state_record(clock_record(offset_ns=None)) == []


def test_other_state_fields_may_not_be_null() -> None:
    problems = schema.validate_state_record(clock_record(ts_ns=None))
    assert problems == ["ts_ns: expected int, got null"]


def test_unknown_state_kind_is_reported() -> None:
    (problem,) = schema.validate_state_record(clock_record(kind="weather"))
    assert problem.startswith("kind: unknown state record kind 'weather'")


def test_state_record_missing_keys_are_each_reported() -> None:
    record = clock_record()
    del record["samples"], record["lower_ns"]
    assert schema.validate_state_record(record) == ["lower_ns: missing", "samples: missing"]


def test_current_and_older_schema_versions_are_accepted() -> None:
    assert schema.check_schema_version(coll_record(), "a.log") == schema.SCHEMA_VERSION
    assert schema.check_schema_version(clock_record(), "a.rwstate.jsonl") == 1


def test_newer_schema_raises_naming_both_versions_and_the_place() -> None:
    # Given a state record from a future plugin
    record = clock_record(schema=schema.SCHEMA_VERSION + 1)
    # When its version is checked
    with pytest.raises(SchemaVersionError) as caught:
        schema.check_schema_version(record, "node0-pid42.rwstate.jsonl", line=3)
    # Then the message names the file, the record's version and the supported one
    message = str(caught.value)
    assert message.startswith("node0-pid42.rwstate.jsonl:3: schema: ")
    assert f"record schema {schema.SCHEMA_VERSION + 1} " in message
    assert f"(schema {schema.SCHEMA_VERSION})" in message
    assert caught.value.found == schema.SCHEMA_VERSION + 1


def test_newer_op_record_schema_raises() -> None:
    record = coll_record()
    record["rankwatch"]["schema"] = 99
    with pytest.raises(SchemaVersionError, match="record schema 99 "):
        schema.check_schema_version(record, "x.log")


@pytest.mark.parametrize("version", [None, "1", 0, True])
def test_missing_or_malformed_schema_version_is_a_record_error(version: Any) -> None:
    with pytest.raises(RecordError, match="no valid schema version"):
        schema.check_schema_version(clock_record(schema=version), "x")


def test_field_rejects_an_unknown_type() -> None:
    with pytest.raises(ValueError, match="unknown type"):
        schema.Field("x", "integer", "", "bad")  # type: ignore[arg-type]

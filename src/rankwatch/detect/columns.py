"""The numpy columns that flow through the detectors.

`OpColumns`: one entry per op record, in arrival order of the stream (by GPU end,
as a live monitor receives them). Times are float64 ns relative to the
topology's t0_ns, NaN when unknown: raw (`arrival`, `gstart`, `gend`, the
process's own host clock, for differences within one process) and clock-
corrected (`arrival_c`, `gstart_c`, `gend_c`, the reference clock, for
comparisons across hosts).

`ProgressColumns`: one entry per progress state record: per collective function
the last enqueued / started / completed sequence number, and the oldest op in
flight.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from rankwatch.detect.topology import COLL_FUNCS

OP_FIELDS: dict[str, type] = {
    "proc": np.int64,
    "comm": np.int64,
    "rank": np.int64,
    "func": np.int64,
    "seq": np.int64,
    "peer": np.int64,
    "msg": np.int64,
    "root": np.int64,
    "arrival": np.float64,
    "gstart": np.float64,
    "gend": np.float64,
    "arrival_c": np.float64,
    "gstart_c": np.float64,
    "gend_c": np.float64,
}


@dataclass
class OpColumns:
    proc: np.ndarray
    comm: np.ndarray
    rank: np.ndarray  # rank in the communicator
    func: np.ndarray  # code in topology.FUNCS
    seq: np.ndarray
    peer: np.ndarray  # P2P peer's rank in the communicator, -1 for collectives
    msg: np.ndarray  # bytes, -1 unknown
    root: np.ndarray  # -1 unknown / none
    arrival: np.ndarray
    gstart: np.ndarray
    gend: np.ndarray
    arrival_c: np.ndarray
    gstart_c: np.ndarray
    gend_c: np.ndarray

    def __len__(self) -> int:
        return len(self.proc)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> OpColumns:
        return cls(**{k: np.asarray(arrays[k], dtype=t) for k, t in OP_FIELDS.items()})

    @classmethod
    def empty(cls) -> OpColumns:
        return cls(**{k: np.empty(0, dtype=t) for k, t in OP_FIELDS.items()})

    def take(self, index: np.ndarray) -> OpColumns:
        return OpColumns(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @staticmethod
    def concat(parts: list[OpColumns]) -> OpColumns:
        parts = [p for p in parts if len(p)]
        if not parts:
            return OpColumns.empty()
        if len(parts) == 1:
            return parts[0]
        return OpColumns(
            **{
                f.name: np.concatenate([getattr(p, f.name) for p in parts])
                for f in fields(OpColumns)
            }
        )


# in-flight op states, as codes
STATES = ("enqueuing", "enqueued", "gpu_started")
REASONS = ("interval", "finalize", "exit")
NF = len(COLL_FUNCS)


@dataclass
class ProgressColumns:
    proc: np.ndarray
    comm: np.ndarray
    rank: np.ndarray
    ts: np.ndarray  # corrected, relative ns
    reason: np.ndarray  # code in REASONS, -1 other
    enq: np.ndarray  # (n, NF) last seq enqueued per collective function, -1 none
    start: np.ndarray  # (n, NF)
    done: np.ndarray  # (n, NF)
    p2p: np.ndarray  # (n, 4) send_enqueued, send_completed, recv_enqueued, recv_completed
    in_flight: np.ndarray  # ops in flight
    # the oldest op in flight (undefined when in_flight == 0)
    if_func: np.ndarray
    if_seq: np.ndarray
    if_peer: np.ndarray
    if_state: np.ndarray  # code in STATES
    if_arrival: np.ndarray  # corrected, relative ns
    if_age: np.ndarray  # ns at ts

    def __len__(self) -> int:
        return len(self.proc)

    def take(self, index: np.ndarray) -> ProgressColumns:
        return ProgressColumns(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

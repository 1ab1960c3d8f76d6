"""Compiled kernels of the detectors (native/rwdetect.c, loaded with ctypes).

Each kernel is the sequential form of a NumPy computation elsewhere in this
package: one pass in stream order with per-process or per-slot state, where the
NumPy form needs a sort and a dozen passes over every record. The NumPy form
stays the reference and the fallback: it runs where the library is missing (a
source checkout never built), under RANKWATCH_NATIVE=0, and for a batch a
kernel declines (records out of the order it needs: RWD_UNORDERED in
native/rwdetect.h; an index out of range: RWD_RANGE, left to NumPy to raise).
The tests run both and compare.

Every function returns None when it declined or the library is absent, so the
caller's fallback is one `if`; `replay` alone, used only by callers that built
their arrays for it, never declines.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from rankwatch import nativelib

LIB_FILENAME = "librankwatch-rwdetect.so"

_I64 = np.int64
_F64 = np.float64


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i64, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double
    sigs = {
        "rwd_stale": [i64, p, i64, p, p, p, p, i64, p, p, p, p],
        "rwd_gaps": [i64, p, i64, p, p, p, p, p, p, p, p, p, p, p],
        "rwd_op_index": [i64, p, p, i64, p, i64, p, p, p, i64, p, p, p, p],
        "rwd_replay": [i64, p, i64, p, p, p, p, p, p],
        "rwd_instances": [i64, p, p, p, p, i64, p, p, p, p, p, p],
        "rwd_cusum": [i64, p, p, p, i64, p, p, p, p],
        "rwd_columns": [i64, p, p, p, p, p, p, i64, i64, p, p, p, p, p, p, p, p, p, p, p],
        "rwd_rank_runs": [i64, p, i64, p, i64, p, p, p, i64, i64, *[p] * 9],
        "rwd_top_two": [i64, p, i64, p, p, p],
        "rwd_slot_state": [i64, p, i64, p, p, p, p, p, i64, f64, f64, i64, f64, *[p] * 25],
    }
    return nativelib.bind_int64(lib, sigs)


def library() -> ctypes.CDLL | None:
    """The kernels, or None (not built, or RANKWATCH_NATIVE=0)."""
    return nativelib.kernels(LIB_FILENAME, _bind)


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.ctypes.data


def _c(a: np.ndarray, dtype: Any) -> np.ndarray:
    """`a` as a C-contiguous array of `dtype` (no copy when it already is one)."""
    return np.ascontiguousarray(a, dtype=dtype)


def _check_state(a: np.ndarray, dtype: Any) -> None:
    # state arrays are written in place: a copy would silently lose the update
    if a.dtype != dtype or not a.flags.c_contiguous or not a.flags.writeable:
        raise TypeError(f"kernel state must be a writable C-contiguous {np.dtype(dtype)} array")


def columns(ops: Any, topo: Any) -> dict[str, np.ndarray] | None:
    """prepare.Preparer.__call__'s derived columns of a batch (OpColumns) under a
    Topology: cls and stage (int32), p2p, key, uid, sym and cslot; or None."""
    lib = library()
    if lib is None:
        return None
    n = len(ops)
    src = {k: _c(getattr(ops, k), _I64) for k in ("proc", "comm", "rank", "func", "seq", "peer")}
    tables = [_c(a, _I64) for a in (topo.comm_class, topo.stage, topo.slot_base, topo.comm_size)]
    out = {"cls": np.empty(n, np.int32), "stage": np.empty(n, np.int32),
           "p2p": np.empty(n, np.bool_)}  # fmt: skip
    out |= {k: np.empty(n, _I64) for k in ("key", "uid", "sym", "cslot")}
    got = lib.rwd_columns(
        n, *(_ptr(a) for a in src.values()), len(topo.stage), len(topo.comm_size),
        *(_ptr(a) for a in tables), *(_ptr(a) for a in out.values()),
    )  # fmt: skip
    return None if got < 0 else out


def stale_starts(
    cslot: np.ndarray,
    arrival: np.ndarray,
    gstart: np.ndarray,
    gend: np.ndarray,
    slot_end: np.ndarray,
    slot_start: np.ndarray,
    order: np.ndarray | None = None,
) -> np.ndarray | None:
    """prepare.Preparer._stale_starts' mask of stale GPU starts (slot_end and
    slot_start updated), or None (declined: nothing changed)."""
    lib = library()
    if lib is None:
        return None
    for state in (slot_end, slot_start):
        _check_state(state, _F64)
    n = len(cslot)
    cslot, arrival = _c(cslot, _I64), _c(arrival, _F64)
    gstart, gend = _c(gstart, _F64), _c(gend, _F64)
    order = None if order is None else _c(order, _I64)
    stale = np.empty(n, dtype=np.uint8)
    scratch = np.empty(len(slot_end))
    got = lib.rwd_stale(
        n, _ptr(cslot), len(slot_end), _ptr(arrival), _ptr(gstart), _ptr(gend),
        _ptr(order), 0 if order is None else len(order),
        _ptr(slot_end), _ptr(slot_start), _ptr(stale), _ptr(scratch),
    )  # fmt: skip
    return None if got < 0 else stale.view(bool)


def gaps(
    proc: np.ndarray,
    arrival: np.ndarray,
    gstart: np.ndarray,
    gend: np.ndarray,
    uid: np.ndarray,
    carry_arrival: np.ndarray,
    carry_gend: np.ndarray,
    carry_uid: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """prepare.Preparer._gaps' (prev_uid, gap_g, gap_h, dur), carries updated, or None."""
    lib = library()
    if lib is None:
        return None
    for state, dtype in ((carry_arrival, _F64), (carry_gend, _F64), (carry_uid, _I64)):
        _check_state(state, dtype)
    n = len(proc)
    proc, arrival, uid = _c(proc, _I64), _c(arrival, _F64), _c(uid, _I64)
    gstart, gend = _c(gstart, _F64), _c(gend, _F64)
    prev_uid = np.empty(n, dtype=_I64)
    gap_g, gap_h, dur = np.empty(n), np.empty(n), np.empty(n)
    got = lib.rwd_gaps(
        n, _ptr(proc), carry_arrival.shape[0], _ptr(arrival), _ptr(gstart), _ptr(gend),
        _ptr(uid), _ptr(carry_arrival), _ptr(carry_gend), _ptr(carry_uid),
        _ptr(prev_uid), _ptr(gap_g), _ptr(gap_h), _ptr(dur),
    )  # fmt: skip
    return None if got < 0 else (prev_uid, gap_g, gap_h, dur)


def op_index(
    p2p: np.ndarray,
    cslot: np.ndarray,
    func: np.ndarray,
    seq: np.ndarray,
    arrival_c: np.ndarray,
    last_seq: np.ndarray,
    op_count: np.ndarray,
    order: np.ndarray | None = None,
) -> np.ndarray | None:
    """prepare.Preparer._op_index's index column (last_seq and op_count updated), or
    None. `order`: the collectives' record indices in issue order."""
    lib = library()
    if lib is None:
        return None
    _check_state(last_seq, _I64)
    _check_state(op_count, _I64)
    n = len(cslot)
    p2p = _c(p2p, np.bool_).view(np.uint8)
    cslot, func, seq = _c(cslot, _I64), _c(func, _I64), _c(seq, _I64)
    arrival_c = _c(arrival_c, _F64)
    order = None if order is None else _c(order, _I64)
    idx = np.empty(n, dtype=_I64)
    scratch = np.empty(len(op_count), dtype=_I64)
    got = lib.rwd_op_index(
        n, _ptr(p2p), _ptr(cslot), len(op_count), _ptr(func), last_seq.shape[1], _ptr(seq),
        _ptr(arrival_c), _ptr(order), 0 if order is None else len(order),
        _ptr(last_seq), _ptr(op_count), _ptr(idx), _ptr(scratch),
    )  # fmt: skip
    return None if got < 0 else idx


def replay(
    starts: np.ndarray,
    g: np.ndarray,
    prev: np.ndarray,
    dgap: np.ndarray,
    g_max: np.ndarray,
    cut: np.ndarray,
) -> np.ndarray:
    """cost.Steps._replay over instances in an order where each comes after the
    instances its records point at (`prev`, by instance; -1: none): the shift of
    each instance's end. For callers that chose the compiled path when they built
    their arrays (library() was not None then): RANKWATCH_NATIVE is not read again
    here, so a change of it between build and replay cannot strand them. Raises
    ValueError when `prev` breaks that order (a caller's bug: the kernel never
    guesses)."""
    lib = nativelib.load(LIB_FILENAME, _bind)
    if lib is None:
        raise RuntimeError(f"{LIB_FILENAME} is not installed")
    starts, g, prev = _c(starts, _I64), _c(g, _F64), _c(prev, _I64)
    dgap, g_max, cut = _c(dgap, _F64), _c(g_max, _F64), _c(cut, _F64)
    shift = np.empty(len(starts))
    got = lib.rwd_replay(
        len(starts), _ptr(starts), len(g), _ptr(g), _ptr(prev), _ptr(dgap),
        _ptr(g_max), _ptr(cut), _ptr(shift),
    )  # fmt: skip
    if got < 0:
        raise ValueError("replay: an instance points at a later one, or has no records")
    return shift


def cusum(
    step: np.ndarray, group: np.ndarray, carry: np.ndarray, gstart: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """robust.cusum_lazy's (S, S at 0, latest element at 0 so far), or None."""
    lib = library()
    if lib is None:
        return None
    n = len(step)
    step, group, gstart = _c(step, _F64), _c(group, _I64), _c(gstart, _I64)
    carry = _c(carry, _F64)
    s, zero, last_zero = np.empty(n), np.empty(n, np.uint8), np.empty(n, _I64)
    got = lib.rwd_cusum(
        n, _ptr(step), _ptr(group), _ptr(carry), len(carry), _ptr(gstart),
        _ptr(s), _ptr(zero), _ptr(last_zero),
    )  # fmt: skip
    return None if got < 0 else (s, zero.view(bool), last_zero)


def instances(
    uid: np.ndarray, seg: np.ndarray, gend: np.ndarray, prev_uid: np.ndarray
) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """cost.Steps._build's instances (records of one uid in one step): (instance of
    each record, their count, each instance's step, uid and latest GPU end, the
    instance each record's prev_uid names in its step or -1), or None."""
    lib = library()
    if lib is None:
        return None
    n = len(uid)
    uid, seg, prev_uid, gend = _c(uid, _I64), _c(seg, _I64), _c(prev_uid, _I64), _c(gend, _F64)
    cap = 1 << max(1, (2 * n - 1).bit_length())
    table = np.full(cap, -1, dtype=_I64)
    inst, prev = np.empty(n, _I64), np.empty(n, _I64)
    inst_seg, inst_uid, inst_end = np.empty(n, _I64), np.empty(n, _I64), np.empty(n)
    got = lib.rwd_instances(
        n, _ptr(uid), _ptr(seg), _ptr(gend), _ptr(prev_uid), cap, _ptr(table),
        _ptr(inst), _ptr(prev), _ptr(inst_seg), _ptr(inst_uid), _ptr(inst_end),
    )  # fmt: skip
    if got < 0:
        return None
    return inst, int(got), inst_seg[:got], inst_uid[:got], inst_end[:got], prev


def rank_runs(
    idx: np.ndarray,
    proc: np.ndarray,
    gstart: np.ndarray,
    hit: np.ndarray,
    pair: np.ndarray,
    need_solo: int,
    need_pair: int,
    run_state: np.ndarray,
    miss_state: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """straggler's runs of late ops per rank in time order (run_state and miss_state
    updated): (tail start per process: -3 absent, -2 no run, -1 carried, else the
    record; then per firing op its record, run and start record), or None."""
    lib = library()
    if lib is None:
        return None
    _check_state(run_state, _I64)
    _check_state(miss_state, _I64)
    if len(miss_state) != len(run_state):
        raise ValueError("rank runs: one run and one miss count per process")
    m, n, n_procs = len(idx), len(proc), len(run_state)
    idx, proc, gstart = _c(idx, _I64), _c(proc, _I64), _c(gstart, _F64)
    hit, pair = _c(hit, np.bool_).view(np.uint8), _c(pair, np.bool_).view(np.uint8)
    tail = np.empty(n_procs, _I64)
    rec, run, start = np.empty(m, _I64), np.empty(m, _I64), np.empty(m, _I64)
    key, gap = np.empty(m, _I64), np.empty(m + n_procs, _I64)
    count = np.empty(n_procs + 1, _I64)
    got = lib.rwd_rank_runs(
        m, _ptr(idx), n, _ptr(proc), n_procs, _ptr(gstart), _ptr(hit), _ptr(pair),
        need_solo, need_pair, _ptr(run_state), _ptr(miss_state), _ptr(tail),
        _ptr(rec), _ptr(run), _ptr(start), _ptr(key), _ptr(gap), _ptr(count),
    )  # fmt: skip
    return None if got < 0 else (tail, rec[:got], run[:got], start[:got])


SLOT_STATE = ("nobs", "learn", "learn_sig", "base", "run", "cusum", "run_at", "cusum_at",
              "last_z")  # fmt: skip


def slot_state(
    cols: dict[str, np.ndarray],
    state: dict[str, np.ndarray],
    learn: int,
    z_clip: float,
    cusum_k: float,
    low_run: int,
    low_s: float,
) -> dict[str, np.ndarray] | None:
    """straggler's per-(rank, slot) baseline, runs and CUSUM over a batch (state, the
    detector's Grid arrays named in SLOT_STATE, updated), or None. cols: flat, ok,
    seq, excess, sigma, thr, comm, func, arrival_c. Returns resid, hit and head per
    record, and per firing record rec, run, s, run_start, cusum_start, z1 and
    carried (n x 8)."""
    lib = library()
    if lib is None:
        return None
    for name in SLOT_STATE:
        _check_state(state[name], _I64 if name in ("nobs", "run") else _F64)
    n, n_flat = len(cols["flat"]), state["nobs"].size
    per_flat = {"learn": learn, "learn_sig": learn, "run_at": 4, "cusum_at": 4}
    for name in SLOT_STATE:  # the kernel indexes them by flat: each must be that long
        if state[name].size != n_flat * per_flat.get(name, 1):
            raise ValueError(f"slot state {name!r}: {state[name].size} values for {n_flat} slots")
    ints = {k: _c(cols[k], _I64) for k in ("flat", "seq", "comm", "func")}
    dbls = {k: _c(cols[k], _F64) for k in ("excess", "sigma", "thr", "arrival_c")}
    ok = _c(cols["ok"], np.bool_).view(np.uint8)
    out = {"resid": np.empty(n), "hit": np.empty(n, np.uint8), "head": np.empty(n, np.uint8)}
    fired = {k: np.empty(n, _I64) for k in ("rec", "run")} | {"s": np.empty(n)}
    fired |= {k: np.empty(n, _I64) for k in ("run_start", "cusum_start")}
    fired |= {"z1": np.empty(n), "carried": np.empty((n, 8))}
    fs, fz, tmp = np.empty(4 * n_flat, _I64), np.empty(4 * n_flat), np.empty(learn)
    st = [state[k] for k in SLOT_STATE]
    got = lib.rwd_slot_state(
        n, _ptr(ints["flat"]), n_flat, _ptr(ok), _ptr(ints["seq"]), _ptr(dbls["excess"]),
        _ptr(dbls["sigma"]), _ptr(dbls["thr"]), learn, z_clip, cusum_k, low_run, low_s,
        *(_ptr(a) for a in st), _ptr(ints["comm"]), _ptr(ints["func"]), _ptr(dbls["arrival_c"]),
        *(_ptr(a) for a in out.values()), *(_ptr(a) for a in fired.values()),
        _ptr(fs), _ptr(fz), _ptr(tmp),
    )  # fmt: skip
    if got < 0:
        return None
    out["hit"], out["head"] = out["hit"].view(bool), out["head"].view(bool)
    return out | {k: v[:got] for k, v in fired.items()}


def top_two(g: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """blame._top_two's (last, second) per contiguous instance, or None."""
    lib = library()
    if lib is None:
        return None
    g, start = _c(g, _F64), _c(start, _I64)
    last, second = np.empty(len(start), _I64), np.empty(len(start), _I64)
    got = lib.rwd_top_two(len(start), _ptr(start), len(g), _ptr(g), _ptr(last), _ptr(second))
    return None if got < 0 else (last, second)

"""Hang: a communicator stops advancing, found from progress state records.

Each process writes, per communicator, the last sequence number it enqueued,
started and completed per collective function, and its oldest op in flight
with its age. When a record shows an op in flight for longer than the
threshold (max(hang_min_ns, factor x the longest op latency seen)), or the
records end (the job was killed) with ops in flight, every rank of that
communicator is classified at the stuck op (seq s of function f):

  not_enqueued           last enqueued < s: the rank never called it
  enqueued_not_started   enqueued, its GPU never started it (stream blocked)
  started_not_finished   started, waiting for peers or the network
  done                   already past it

Ranks that enqueued wait on those that did not (or, if all did, on those
whose GPU did not start). Following these edges across communicators from
each stuck rank (a blocker that is itself stuck elsewhere passes the wait on)
ends at the root: the rank stuck first, with its class. If all ranks of a
communicator started the op and none is stuck elsewhere, the communicator
itself is the root (started_not_finished, rank unknown). A hang whose op
later completes is dropped.
"""

from __future__ import annotations

import numpy as np

from rankwatch.detect.base import Context, Window
from rankwatch.detect.columns import NF, REASONS, STATES, ProgressColumns
from rankwatch.detect.robust import nanmax
from rankwatch.detect.topology import FUNCS, RECV, SEND
from rankwatch.model import Finding, Since

KILLED_MIN_AGE_NS = 100e6
MAX_LISTED = 16
INTERVAL = REASONS.index("interval")


class HangDetector:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        n = ctx.topo.n_slots
        self.has = np.zeros(n, dtype=bool)
        self.ts = np.full(n, np.nan)
        self.reason = np.full(n, -1, dtype=np.int64)
        self.enq = np.full((n, NF), -1, dtype=np.int64)
        self.start = np.full((n, NF), -1, dtype=np.int64)
        self.done = np.full((n, NF), -1, dtype=np.int64)
        self.in_flight = np.zeros(n, dtype=np.int64)
        self.if_func = np.full(n, -1, dtype=np.int64)
        self.if_seq = np.full(n, -1, dtype=np.int64)
        self.if_peer = np.full(n, -1, dtype=np.int64)
        self.if_state = np.full(n, -1, dtype=np.int64)
        self.if_arrival = np.full(n, np.nan)
        self.if_age = np.zeros(n)
        self.first_seen = np.full(n, np.nan)  # ts of the first record showing the current op
        self.slot_proc = np.full(n, -1, dtype=np.int64)
        for comm, members in enumerate(ctx.topo.members):
            base = ctx.topo.slot_base[comm]
            self.slot_proc[base : base + len(members)] = members
        self.slot_comm = np.repeat(np.arange(ctx.topo.n_comms), ctx.topo.comm_size)
        self.hangs: dict[tuple, dict] = {}

    # ------------------------------------------------------------------ state
    def _update(self, p: ProgressColumns) -> None:
        slot = self.ctx.topo.slot_base[p.comm] + p.rank
        order = np.lexsort((p.ts, slot))
        last = np.flatnonzero(np.r_[slot[order][1:] != slot[order][:-1], True])
        idx = order[last]
        s = slot[idx]
        same = (
            self.has[s]
            & (self.if_func[s] == p.if_func[idx])
            & (self.if_seq[s] == p.if_seq[idx])
            & (self.in_flight[s] > 0)
            & (p.in_flight[idx] > 0)
        )
        # first record showing this op: the earliest record of this window with it
        first_ts = self._first_ts(p, slot, s, idx)
        self.first_seen[s] = np.where(same, self.first_seen[s], first_ts)
        self.has[s] = True
        for name in (
            "ts",
            "reason",
            "in_flight",
            "if_func",
            "if_seq",
            "if_peer",
            "if_state",
            "if_arrival",
            "if_age",
        ):
            getattr(self, name)[s] = getattr(p, name)[idx]
        self.enq[s], self.start[s], self.done[s] = p.enq[idx], p.start[idx], p.done[idx]

    @staticmethod
    def _first_ts(
        p: ProgressColumns, slot: np.ndarray, s: np.ndarray, idx: np.ndarray
    ) -> np.ndarray:
        """Per slot s: the earliest ts in this window showing its latest oldest op."""
        pos = np.full(int(slot.max()) + 1, -1, dtype=np.int64)
        pos[s] = np.arange(len(s))
        k = pos[slot]
        match = (
            (k >= 0)
            & (p.in_flight > 0)
            & (p.if_func == p.if_func[idx][k])
            & (p.if_seq == p.if_seq[idx][k])
        )
        out = np.full(len(s), np.inf)
        np.minimum.at(out, k[match], p.ts[match])
        return np.where(np.isfinite(out), out, np.nan)

    # ------------------------------------------------------------------ feed
    def feed(self, window: Window) -> None:
        if window.progress is not None and len(window.progress):
            self._update(window.progress)
        elif not window.final:
            return
        self._resolved()
        stuck = self._stuck(window.final)
        if len(stuck):
            self._diagnose(stuck, window.final)

    def _threshold(self) -> float:
        cfg = self.ctx.config
        return max(cfg.hang_min_ns, cfg.hang_latency_factor * self.ctx.max_latency_ns)

    def _stuck(self, final: bool) -> np.ndarray:
        flying = self.has & (self.in_flight > 0)
        # Ops of one function on a communicator complete in order: one whose rank has
        # completed a later op of that function is done, only its record is pending
        # (a channel event that never came; the plugin writes it 2 s on), not a hang.
        f = np.clip(self.if_func, 0, NF - 1)
        passed = (self.if_func >= 0) & (self.if_func < NF)
        passed &= self.done[np.arange(len(f)), f] >= self.if_seq
        flying &= ~passed
        old = flying & (self.if_age >= self._threshold())
        if final:  # records ended without teardown while ops were in flight
            old |= flying & (self.reason == INTERVAL) & (self.if_age >= KILLED_MIN_AGE_NS)
        return np.flatnonzero(old)

    def _resolved(self) -> None:
        for h in self.hangs.values():
            if h["resolved"] or h["func"] >= NF:
                continue
            slots = h["slots"]
            if np.all(self.done[slots, h["func"]] >= h["seq"]):
                h["resolved"] = True

    # ------------------------------------------------------------------ diagnosis
    def _classify(self, comm: int, func: int, seq: int, peer_of: dict[int, int] | None = None):
        topo = self.ctx.topo
        base = topo.slot_base[comm]
        slots = np.arange(base, base + topo.comm_size[comm])
        state = np.full(len(slots), "no_records", dtype=object)
        has = self.has[slots]
        if func < NF:
            e, st, d = self.enq[slots, func], self.start[slots, func], self.done[slots, func]
            state[has] = np.select(
                [e[has] < seq, st[has] < seq, d[has] < seq],
                ["not_enqueued", "enqueued_not_started", "started_not_finished"],
                "done",
            )
        else:  # P2P: the pair's sides, from what each has in flight
            for k, s in enumerate(slots.tolist()):
                if not has[k]:
                    continue
                flying = self.in_flight[s] > 0 and self.if_func[s] in (SEND, RECV)
                state[k] = (
                    (
                        "enqueued_not_started"
                        if self.if_state[s] < STATES.index("gpu_started")
                        else "started_not_finished"
                    )
                    if flying
                    else "not_enqueued"
                )
        return slots, state

    def _diagnose(self, stuck: np.ndarray, final: bool) -> None:
        """Roots of the wait-for graph, followed from the stuck processes."""
        waits = self._waits()
        roots: dict[int, list] = {}
        stuck_procs = {int(p) for p in self.slot_proc[stuck] if p >= 0}
        followed: set[int] = set()
        for proc in sorted(stuck_procs & set(waits)):
            self._follow(proc, waits, roots, followed)
        found: dict[tuple, dict] = {}
        blocked = {id(w[3]): set(w[3]) for w in waits.values()}  # lists shared per op
        since: dict[int, float] = {}
        for b, chain in roots.items():
            # where the root is missing first: the blocked op its peers reached earliest
            cands = [w for w in waits.values() if b in blocked[id(w[3])]]
            for w in cands:
                if w[6] not in since:
                    since[w[6]] = self._since(w[4], w[5], w[6])
            comm, func, seq, _, slots, state, s = min(cands, key=lambda w: since[w[6]])
            k = np.flatnonzero(self.slot_proc[slots] == b)
            cls = str(state[k[0]]) if len(k) else "not_enqueued"
            found[("rank", b)] = self._hang(b, cls, comm, func, seq, slots, state, s, chain, final)
        for proc in sorted(stuck_procs & set(waits)):
            comm, func, seq, blockers, slots, state, s = waits[proc]
            if not blockers and func < NF:
                key = ("comm", comm, func, seq)
                found.setdefault(
                    key,
                    self._hang(
                        None, "started_not_finished", comm, func, seq, slots, state, s, [], final
                    ),
                )
        self._merge(found)

    def _waits(self) -> dict[int, tuple]:
        """What each process with an op in flight waits on: its oldest op's blockers."""
        waits: dict[int, tuple] = {}
        flying = np.flatnonzero(self.has & (self.in_flight > 0))
        cache: dict[tuple, tuple] = {}
        for s in flying[np.argsort(self.if_arrival[flying], kind="stable")].tolist():
            proc = int(self.slot_proc[s])
            if proc < 0 or proc in waits:
                continue  # each process waits on its oldest op in flight
            comm, func, seq = int(self.slot_comm[s]), int(self.if_func[s]), int(self.if_seq[s])
            if func in (SEND, RECV):
                slots, state = self._classify(comm, func, seq)
                peer = int(self.if_peer[s])
                keep = [peer] if 0 <= peer < len(slots) else []
                slots, state = slots[keep], state[keep]
                blockers = self.slot_proc[slots[_blockers(state)]].tolist()
            else:  # one classification per collective: its ranks all wait on the same
                if (comm, func, seq) not in cache:
                    slots, state = self._classify(comm, func, seq)
                    blockers = self.slot_proc[slots[_blockers(state)]].tolist()
                    cache[(comm, func, seq)] = (slots, state, blockers)
                slots, state, blockers = cache[(comm, func, seq)]
            waits[proc] = (comm, func, seq, blockers, slots, state, s)
        return waits

    def _merge(self, found: dict[tuple, dict]) -> None:
        """The latest diagnosis wins (it has seen the most records); a root keeps the
        time it was first reported."""
        for key, new in found.items():
            old = self.hangs.get(key)
            if old is not None:
                new["detected_ns"] = old["detected_ns"]
                new["first_shown_ns"] = np.nanmin([old["first_shown_ns"], new["first_shown_ns"]])
                new["killed"] = old["killed"] or new["killed"]
        self.hangs = found

    def _since(self, slots: np.ndarray, state: np.ndarray, s: int) -> float:
        waiting = _waiting(state)
        arr = self.if_arrival[slots[waiting]] if len(waiting) else np.array([self.if_arrival[s]])
        return float(np.nanmin(arr)) if np.isfinite(arr).any() else np.inf

    def _follow(self, start: int, waits: dict, roots: dict, followed: set[int]) -> None:
        """Follow wait-for edges from a stuck process to the root it waits on. A
        process's path is one (its smallest blocker, on and on), so one `followed`
        from an earlier start leads where that start went: no root to add (a root
        keeps the chain of the first start that reached it)."""
        if start in followed:
            return
        chain, node = [], start
        followed.add(start)
        topo = self.ctx.topo
        while True:
            comm, func, seq, blockers, *_ = waits[node]
            chain.append(
                {
                    "rank": topo.procs[node].world_rank,
                    "comm": topo.comms[comm].name,
                    "func": FUNCS[func],
                    "seq": seq,
                }
            )
            nxt = [b for b in blockers if b >= 0]
            if not nxt:
                return
            b = min(nxt)
            if b == node or b not in waits:
                roots.setdefault(b, chain)
                return
            if b in followed:
                return
            followed.add(b)
            node = b

    def _hang(self, proc, cls, comm, func, seq, slots, state, s, chain, final) -> dict:
        waiting = _waiting(state)
        some = len(waiting) > 0
        arrivals = self.if_arrival[slots[waiting]] if some else np.array([self.if_arrival[s]])
        shown = self.first_seen[slots[waiting]] if some else np.array([self.first_seen[s]])
        counts = {
            str(v): int(n)
            for v, n in zip(*np.unique(state.astype(str), return_counts=True), strict=True)
        }
        return {
            "proc": proc,
            "cause": cls,
            "comm": comm,
            "func": func,
            "seq": seq,
            "slots": slots,
            "resolved": False,
            "killed": final,
            "since_ns": float(np.nanmin(arrivals)) if np.isfinite(arrivals).any() else np.nan,
            "first_shown_ns": float(np.nanmin(shown)) if np.isfinite(shown).any() else np.nan,
            "detected_ns": float(self.ts[s]),
            # how long the longest waiter has waited: each process's age is as of its own
            # latest progress record, so the one waits were read from may be older
            "age_ns": _longest(self.if_age[slots[waiting]], float(self.if_age[s])),
            "threshold_ns": self._threshold(),
            "states": counts,
            "ranks": [
                {
                    "rank": self.ctx.topo.procs[int(self.slot_proc[sl])].world_rank
                    if self.slot_proc[sl] >= 0
                    else None,
                    "state": str(state[k]),
                }
                for k, sl in enumerate(slots.tolist())
                if state[k] != "done"
            ][:MAX_LISTED],
            "chain": chain,
        }

    def findings(self) -> list[Finding]:
        topo = self.ctx.topo
        out = []
        for h in self.hangs.values():
            if h["resolved"]:
                continue
            evidence = {
                "op": {"func": FUNCS[h["func"]], "seq": h["seq"]},
                "states": h["states"],
                "ranks": h["ranks"],
                "chain": h["chain"],
                "age_s": h["age_ns"] / 1e9,
                "threshold_s": h["threshold_ns"] / 1e9,
                "first_shown_ns": topo.abs_ns(h["first_shown_ns"]),
                "detected_at_ns": topo.abs_ns(h["detected_ns"]),
                "records_end_without_teardown": h["killed"],
            }
            out.append(
                Finding(
                    kind="hang",
                    **topo.who(h["proc"]),
                    comm=topo.comm_ref(h["comm"]),
                    since=Since(topo.abs_ns(h["since_ns"]), h["seq"]),
                    cause=h["cause"],
                    confidence=(0.9 if h["proc"] is not None else 0.6)
                    * (0.8 if h["killed"] else 1.0),
                    evidence=evidence,
                )
            )
        return out


def _blockers(state: np.ndarray) -> np.ndarray:
    """Positions the others wait on: ranks that never enqueued, else ranks whose GPU
    never started."""
    for cls in ("not_enqueued", "no_records", "enqueued_not_started"):
        hit = np.flatnonzero(state == cls)
        if len(hit):
            return hit
    return np.zeros(0, dtype=np.int64)


def _waiting(state: np.ndarray) -> np.ndarray:
    """Positions of the ranks inside the op: enqueued, not finished."""
    return np.flatnonzero((state == "enqueued_not_started") | (state == "started_not_finished"))


def _longest(ages: np.ndarray, default: float) -> float:
    """The largest finite age, or `default` when there is none."""
    age = nanmax(ages)
    return age if np.isfinite(age) else default

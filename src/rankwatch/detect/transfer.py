"""Straggler with cause transfer: ranks whose ops move data slower.

Per instance (one collective on one communicator, or one Send/Recv pair) the
transfer time is the shortest GPU duration of its members: the last rank to
start does not wait, so its duration is the transfer (clock-free). It is
compared with the instance's own baseline at that slot (learned from its
first observations): an instance is slow after `xfer_persist` consecutive ops
above max(z_xfer sigma, xfer_ns, rel_xfer x baseline).

Which rank? A slow link or NIC makes every instance that involves its rank
slow, on every communicator. So the culprit is a rank whose instances are slow
in every class of communicators that can tell ranks apart (classes with
several instances, of which not all are slow), chosen greedily until the slow
instances are explained. When no single rank explains an instance (a world-
only job, a two-rank pair), the finding names the communicator, not a rank.
"""

from __future__ import annotations

import numpy as np

from rankwatch.detect.base import Context, Culprit, Window
from rankwatch.detect.cohorts import Cohorts
from rankwatch.detect.grid import Grid
from rankwatch.detect.report import costly, render
from rankwatch.detect.robust import MAD_SCALE, run_heads, run_lengths, run_tails, stable_order
from rankwatch.detect.topology import FUNCS, RECV
from rankwatch.model import Finding, Since

TRANSFER = "transfer"
REL_SIGMA_FLOOR = 0.05


class TransferDetector:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        topo = ctx.topo
        learn = ctx.config.learn
        self.grid = Grid(
            topo.n_comms,
            {
                "nobs": (np.int64, 0, 0),
                "base": (np.float64, np.nan, 0),
                "sig": (np.float64, np.nan, 0),
                "learn": (np.float64, np.nan, learn),
            },
        )
        # instance rows: one per communicator (collectives), then one per P2P pair
        self.row_members: list[np.ndarray] = [m[m >= 0] for m in topo.members]
        self.row_class = list(topo.comm_class.tolist())
        self.row_comm = list(range(topo.n_comms))
        self.pair_codes = np.zeros(0, dtype=np.int64)  # (comm, sender, receiver) packed, sorted
        self.pair_rows = np.zeros(0, dtype=np.int64)
        self.run = np.zeros(topo.n_comms, dtype=np.int64)
        self.max_run = np.zeros(topo.n_comms, dtype=np.int64)
        self.run_start = np.full((topo.n_comms, 4), -1.0)  # seq, ns, func, -
        self.slow: dict[int, dict] = {}  # row -> onset and firing info
        self.seen = np.zeros(topo.n_comms, dtype=bool)
        self.last_seq = np.full(topo.n_comms, -1, dtype=np.int64)
        self.unexplained: dict[int, dict] = {}
        self.recent: dict[
            int, list[tuple]
        ] = {}  # row -> (seq, ns, func, excess) of its current run
        self.row_hits: dict[int, list[float]] = {}  # row -> excess of its slow ops (a sample)

    # ------------------------------------------------------------------ rows
    def _rows(self, c: Cohorts) -> np.ndarray:
        """Instance row of each instance of the window."""
        r = c.recs
        first = c.inst_start
        rows = r.comm[first].astype(np.int64)
        p2p = np.flatnonzero(r.p2p[first])
        if len(p2p):
            j = first[p2p]
            recv = r.func[j] == RECV
            sender = np.where(recv, r.peer[j], r.rank[j]).astype(np.int64)
            receiver = np.where(recv, r.rank[j], r.peer[j]).astype(np.int64)
            code = (r.comm[j].astype(np.int64) << 32) | (sender << 16) | receiver
            new = np.unique(code[~np.isin(code, self.pair_codes)])
            for k in new.tolist():
                self._pair(k >> 32, (k >> 16) & 0xFFFF, k & 0xFFFF, k)
            rows[p2p] = self.pair_rows[np.searchsorted(self.pair_codes, code)]
        return rows

    def _pair(self, comm: int, sender: int, receiver: int, code: int) -> None:
        row = len(self.row_members)
        members = self.ctx.topo.members[comm]
        procs = [members[x] for x in (sender, receiver) if 0 <= x < len(members)]
        self.row_members.append(np.array([p for p in procs if p >= 0], dtype=np.int64))
        self.row_class.append(int(self.ctx.topo.comm_class[comm]) + 1_000_000)
        self.row_comm.append(comm)
        at = np.searchsorted(self.pair_codes, code)
        self.pair_codes = np.insert(self.pair_codes, at, code)
        self.pair_rows = np.insert(self.pair_rows, at, row)
        self._grow(row + 1)

    def _grow(self, n: int) -> None:
        if n > len(self.run):
            extra = max(n, 2 * len(self.run)) - len(self.run)
            self.run = np.concatenate([self.run, np.zeros(extra, np.int64)])
            self.max_run = np.concatenate([self.max_run, np.zeros(extra, np.int64)])
            self.run_start = np.concatenate([self.run_start, np.full((extra, 4), -1.0)])
            self.seen = np.concatenate([self.seen, np.zeros(extra, bool)])
            self.last_seq = np.concatenate([self.last_seq, np.full(extra, -1, np.int64)])

    # ------------------------------------------------------------------ feed
    def feed(self, window: Window) -> None:
        c = window.cohorts
        if c is None:
            if window.final:
                self._resolve(final=True)
            return
        r = c.recs
        rows = self._rows(c)
        self.grid.ensure(self.ctx.slots.size, len(self.row_members))
        t, slot, ok = self._transfer(c)
        excess, hit = self._judge(c, rows, slot, t, ok)
        r.d_xfer = np.where(hit, excess, 0.0)[c.inst]
        fired = self._runs(c, rows, hit, ok, excess)
        if fired or window.final:
            self._resolve(final=window.final)

    def _transfer(self, c: Cohorts):
        r = c.recs
        dur = np.where(r.misaligned | ~np.isfinite(r.dur), np.inf, r.dur)
        t = np.minimum.reduceat(dur, c.inst_start) if len(r) else dur
        slot = np.maximum.reduceat(np.where(r.func == RECV, -1, r.slot), c.inst_start)
        ok = np.isfinite(t) & (slot >= 0) & (c.inst_count >= 2) & ~c.partial[c.inst_gid]
        return t, slot, ok

    def _judge(self, c: Cohorts, rows, slot, t, ok):
        """Excess over the instance's baseline at the slot, and whether it is a hit."""
        g, cfg = self.grid, self.ctx.config
        excess = np.full(len(t), np.nan)
        hit = np.zeros(len(t), dtype=bool)
        idx = np.flatnonzero(ok)
        self._by_time = idx
        if not len(idx):
            return excess, hit
        # by (row, slot, start): a time sort, then a radix sort by (row, slot)
        by_time = idx[np.argsort(c.recs.gstart_c[c.inst_start[idx]], kind="stable")]
        key = rows[by_time] * g.width + slot[by_time]
        idx = by_time[stable_order(key, int(key.max()) + 1)]
        self._by_time = by_time  # reused by _runs
        rr, ss = rows[idx], slot[idx]
        flat = rr * g.width + ss
        first = run_heads(flat)
        start = np.maximum.accumulate(np.where(first, np.arange(len(flat)), 0))
        nobs = g["nobs"].reshape(-1)  # a view: [row, slot] at row * width + slot
        k = nobs[flat] + np.arange(len(flat)) - start
        learning = k < cfg.learn
        g["learn"][rr[learning], ss[learning], k[learning]] = t[idx][learning]
        heads = np.flatnonzero(first)
        nobs[flat[heads]] += np.diff(heads, append=len(flat))  # per (row, slot)
        ready = np.unique(flat[learning & (k == cfg.learn - 1)])
        if len(ready):
            rr0, ss0 = ready // g.width, ready % g.width
            buf = g["learn"][rr0, ss0]
            med = np.nanmedian(buf, axis=1)
            g["base"][rr0, ss0] = med
            g["sig"][rr0, ss0] = MAD_SCALE * np.nanmedian(np.abs(buf - med[:, None]), axis=1)
        base, sig = g["base"].reshape(-1)[flat], g["sig"].reshape(-1)[flat]
        sig = np.maximum(np.nan_to_num(sig), REL_SIGMA_FLOOR * np.nan_to_num(base))
        ex = t[idx] - base
        thr = np.maximum.reduce(
            [cfg.z_xfer * sig, np.full(len(idx), cfg.xfer_ns), cfg.rel_xfer * np.nan_to_num(base)]
        )
        excess[idx] = np.where(learning, np.nan, ex)
        hit[idx] = ~learning & np.isfinite(ex) & (ex > thr)
        return excess, hit

    def _runs(self, c: Cohorts, rows, hit, ok, excess) -> bool:
        r = c.recs
        by_time = self._by_time  # the ok instances by start (see _judge)
        if len(by_time):
            order = by_time[stable_order(rows[by_time], int(rows.max()) + 1)]
        else:
            order = by_time
        rw = rows[order]
        run, started = run_lengths(hit[order], rw, self.run)
        f = c.inst_start[order]

        def start_rec(j: np.ndarray) -> np.ndarray:
            """(seq, ns, func, comm) where the run at j began (this window or carried)."""
            at = f[np.maximum(started[j], 0)]
            here = np.stack([r.seq[at], r.arrival_c[at], r.func[at], r.comm[at]], axis=1)
            return np.where((started[j] >= 0)[:, None], here.astype(float), self.run_start[rw[j]])

        last = np.flatnonzero(run_tails(rw))
        at_last = start_rec(last)  # before run_start is overwritten
        h = np.flatnonzero(run)  # runs are 0 but at slow ops
        need = self.ctx.config.xfer_persist
        fire = h[run[h] >= need] if need > 0 else np.flatnonzero(run >= need)
        at_fire = start_rec(fire)
        self.run[rw[last]] = run[last]
        np.maximum.at(self.max_run, rw[h], run[h])
        self.run_start[rw[last]] = np.where(run[last, None] > 0, at_last, -1.0)
        self.seen[rw] = True
        self.last_seq[rw[last]] = r.seq[f[last]]
        fh = f[h]
        self._remember(rw[h], run[h], r.seq[fh], r.arrival_c[fh], r.func[fh], excess[order[h]])
        fired = False
        for k, j in enumerate(fire.tolist()):
            row = int(rw[j])
            if row not in self.slow:
                seq, ns, func, comm = at_fire[k]
                self.slow[row] = {
                    "seq": int(seq),
                    "ns": float(ns),
                    "func": FUNCS[int(func)],
                    "comm": int(comm),
                    "fired_seq": int(r.seq[f[j]]),
                    "fired_ns": float(r.arrival_c[f[j]]),
                }
                fired = True
        return fired

    def _remember(self, rw, run, seq, ns, func, excess) -> None:
        """The ops of runs in progress, and the excess of slow ops."""
        for j in np.flatnonzero(run > 0).tolist():
            row = int(rw[j])
            if run[j] == 1:
                self.recent[row] = []
            ops = self.recent.setdefault(row, [])
            if len(ops) < 256:
                ops.append((int(seq[j]), float(ns[j]), FUNCS[int(func[j])], float(excess[j])))
            sample = self.row_hits.setdefault(row, [])
            if len(sample) < 1024:
                sample.append(float(excess[j]))

    def _seq_at(self, row: int, ns: float, default: int) -> int:
        """The seq of the row's last op (in its slow run) that arrived by time ns."""
        seqs = [q for q, t, *_ in self.recent.get(row, []) if t <= ns]
        return max(seqs) if seqs else default

    def _onsets(self, rows: list[int]) -> dict[int, dict]:
        """Where each row's slow run began. A slowdown of a rank starts on all its
        rows at once: a row whose run began with one op before every other row's,
        the next op only after them, started with noise; its start moves to that
        next op."""
        onsets = {row: dict(self.slow[row]) for row in rows}
        starts = sorted(on["ns"] for on in onsets.values())
        if len(starts) < 2:
            return onsets
        second = starts[1]
        for row, on in onsets.items():
            ops = self.recent.get(row, [])
            if on["ns"] < second and len(ops) > 1 and ops[0][1] == on["ns"] and ops[1][1] >= second:
                on.update(seq=ops[1][0], ns=ops[1][1], func=ops[1][2])
        return onsets

    # ------------------------------------------------------------------ culprits
    def _resolve(self, final: bool) -> None:
        slow = set(self.slow)
        covered = {
            row
            for (p, k), cul in self.ctx.culprits.items()
            if k == TRANSFER
            for row in cul.extra["rows"]
        }
        todo = slow - covered
        while todo:
            best = self._best(todo)
            if best is None:
                break
            proc, rows, when = best
            self._register(proc, rows, when)
            todo -= set(rows)
        long_enough = [r for r in todo if self.max_run[r] >= self.ctx.config.xfer_unexplained_ops]
        self.unexplained = {row: self.slow[row] for row in long_enough} if final else {}

    def _class_rows(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for row, cls in enumerate(self.row_class):
            if row < len(self.seen) and self.seen[row]:
                out.setdefault(cls, []).append(row)
        return out

    def _best(self, todo: set[int]) -> tuple[int, list[int], float] | None:
        """The rank that explains the most slow instances (see module doc), and when
        it became the only one that could."""
        by_class = self._class_rows()
        telling = {
            cls
            for cls, rows in by_class.items()
            if len(rows) >= 2 and not all(r in self.slow for r in rows)
        }
        slow_share: dict[int, dict[int, float]] = {}  # proc -> class -> share of its rows slow
        for cls in telling:
            for row in by_class[cls]:
                for p in self.row_members[row].tolist():
                    slow_share.setdefault(p, {}).setdefault(cls, []).append(row in self.slow)
        share = {p: {c: float(np.mean(v)) for c, v in d.items()} for p, d in slow_share.items()}
        candidates = {int(p) for row in todo for p in self.row_members[row]}
        scored = []
        for proc in sorted(candidates):
            if not share.get(proc) or min(share[proc].values()) < 0.5:
                continue
            hits = [
                row for cls in share[proc] for row in by_class[cls] if proc in self.row_members[row]
            ]
            hits = [row for row in hits if row in todo] + [
                row
                for row in todo
                if proc in self.row_members[row] and self.row_class[row] not in telling
            ]
            scored.append((len(hits), -proc, hits))
        if not scored:
            return None
        scored.sort(reverse=True)
        n, negp, hits = scored[0]
        if len(scored) > 1 and scored[1][0] == n:
            return None  # two ranks explain it equally well: do not guess
        return -negp, hits, self._known_at(-negp, share, by_class)

    def _known_at(self, proc: int, share: dict, by_class: dict) -> float:
        """When the rank's telling classes, taken in the order they turned slow, first
        left no other rank that they all point at."""
        first: dict[int, float] = {}
        for cls in share[proc]:
            fired = [
                self.slow[r]["fired_ns"]
                for r in by_class[cls]
                if r in self.slow and proc in self.row_members[r]
            ]
            if fired:
                first[cls] = min(fired)
        order = sorted(first, key=first.get)
        for k in range(1, len(order) + 1):
            used = order[:k]
            rivals = [
                q for q, d in share.items() if q != proc and all(d.get(c, 0.0) >= 0.5 for c in used)
            ]
            if not rivals:
                return first[order[k - 1]]
        return first[order[-1]] if order else np.inf

    def _register(self, proc: int, rows: list[int], detected_ns: float) -> None:
        onsets = self._onsets(rows)
        first = min(rows, key=lambda row: onsets[row]["ns"])
        on = onsets[first]
        cul = Culprit(
            proc=proc,
            cause=TRANSFER,
            comm=on["comm"],
            onset_seq=on["seq"],
            onset_ns=on["ns"],
            detected_seq=self._seq_at(first, detected_ns, on["seq"]),
            detected_ns=detected_ns,
            detected_comm=on["comm"],
        )
        sample = [x for r in rows for x in self.row_hits.get(r, [])]
        cul.hits = len(sample)
        cul.excess_ns = sample[:4096]
        cul.votes = {"transfer": len(rows)}
        cul.extra.update(onset_func=on["func"], detected_func=on["func"], rows=list(rows))
        cul.extra["confirmed_by"] = {
            "rule": "slow transfers in a row on the rank's instances",
            "slow_ops": self.ctx.config.xfer_persist,
        }
        topo = self.ctx.topo
        cul.extra["evidence"] = {
            "slow_instances": [
                {
                    "comm": topo.comms[self.row_comm[r]].name,
                    "since_seq": self.slow[r]["seq"],
                    "ranks": [topo.procs[int(p)].world_rank for p in self.row_members[r]],
                }
                for r in sorted(rows)[:10]
            ]
        }
        self.ctx.culprits[(proc, TRANSFER)] = cul

    def findings(self) -> list[Finding]:
        out = [
            render(self.ctx, cul)
            for (p, k), cul in sorted(self.ctx.culprits.items())
            if k == TRANSFER and costly(self.ctx, cul)
        ]
        topo = self.ctx.topo
        for row, on in sorted(self.unexplained.items()):
            ranks = [topo.procs[int(p)].world_rank for p in self.row_members[row]]
            out.append(
                Finding(
                    kind="straggler",
                    comm=topo.comm_ref(self.row_comm[row]),
                    since=Since(topo.abs_ns(on["ns"]), on["seq"]),
                    cause=TRANSFER,
                    confidence=0.5,
                    evidence={
                        "note": "transfer persistently slow on this communicator; no single rank "
                        "explains it",
                        "ranks": ranks,
                        "onset": {"func": on["func"], "seq": on["seq"]},
                        "slow_ops": int(self.max_run[row]),
                    },
                )
            )
        return out

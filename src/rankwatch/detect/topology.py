"""Who is who, as small integers: the detectors never touch strings per record.

A `Topology` numbers processes (`proc`, ordered by world rank), communicators
(`comm`) and communicator slots (`comm`, rank in it), and groups communicators
into classes of peers doing the same work: same name once digits are dropped
("TP Group 3" -> "TP Group #"), same size, same kind (collectives or P2P).
A process's pipeline `stage` is its rank in the communicator that carries its
Send/Recv ops (0 when it has none): ranks of one class and one stage do the
same work, so their cohort is the reference for "late".

Built from an aligned Run (`Topology.from_run`) or, for a live monitor, from the
rows of `comm` state records (`Topology.build`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from rankwatch.model import CommRef, Run

# Function codes used in every numpy column (index into FUNCS).
FUNCS: tuple[str, ...] = (
    "AllReduce",
    "AllGather",
    "ReduceScatter",
    "Broadcast",
    "Reduce",
    "Send",
    "Recv",
    "other",
)
COLL_FUNCS = FUNCS[:5]
SEND, RECV, OTHER = 5, 6, 7
FUNC_CODE = {name: i for i, name in enumerate(FUNCS)}


def func_case_sql(column: str) -> str:
    """SQL mapping a function name column to its code in FUNCS."""
    whens = " ".join(f"WHEN '{name}' THEN {i}" for i, name in enumerate(FUNCS[:-1]))
    return f"(CASE {column} {whens} ELSE {OTHER} END)"


def name_pattern(name: str | None) -> str:
    return re.sub(r"\d+", "#", name or "")


@dataclass(frozen=True)
class CommInfo:
    key: str  # comm_key (Inspector-compatible, see align.ranks)
    id: str
    name: str | None
    n_ranks: int
    nnodes: int | None


@dataclass(frozen=True)
class ProcInfo:
    """One rank of the job: its process and, for a process that holds several
    ranks (multi_rank, see align.ranks), its CUDA device (None when unknown)."""

    world_rank: int
    host: str
    pid: int
    device: int | None = None
    multi_rank: bool = False

    @property
    def key(self) -> ProcKey:
        return _key(self.host, self.pid, self.device, self.multi_rank)


# A rank's key: (host, pid, device), device None unless the process holds several
# ranks of one communicator (then -1 when its records do not say).
ProcKey = tuple[str, int, int | None]


def _key(host: str, pid: int, device: int | None, multi: bool) -> ProcKey:
    if not multi:
        return (host, int(pid), None)
    return (host, int(pid), -1 if device is None else int(device))


def _multi_rank(rows: list[dict]) -> set[tuple[str, int]]:
    """Processes holding several ranks of one communicator, or using several
    devices (as align.ranks decides)."""
    ranks: dict[tuple, set[int]] = {}
    devices: dict[tuple[str, int], set[int]] = {}
    for r in rows:
        proc = (r["host"], int(r["pid"]))
        key = (r.get("comm_key") or comm_key(r["comm_id"]), *proc)
        ranks.setdefault(key, set()).add(int(r["rank"]))
        if r.get("device") is not None:
            devices.setdefault(proc, set()).add(int(r["device"]))
    multi = {(h, p) for (_, h, p), seen in ranks.items() if len(seen) > 1}
    return multi | {proc for proc, seen in devices.items() if len(seen) > 1}


def _proc_info(world_rank: int, key: ProcKey) -> ProcInfo:
    host, pid, device = key
    known = None if device is None or device < 0 else device
    return ProcInfo(world_rank, host, pid, known, device is not None)


def proc_key(row: dict, multi: set[tuple[str, int]]) -> ProcKey:
    host, pid = row["host"], int(row["pid"])
    return _key(host, pid, row.get("device"), (host, pid) in multi)


@dataclass
class Topology:
    """Integer ids for processes, communicators and their slots; see module doc."""

    procs: list[ProcInfo]
    comms: list[CommInfo]
    members: list[np.ndarray]  # per comm: proc of each rank in it (-1 unknown)
    p2p_comms: set[int] = field(default_factory=set)
    issued: set[tuple[int, int]] | None = None  # (comm, func) pairs known to occur
    t0_ns: int = 0  # times in the stream are float ns relative to this
    bound_ns: np.ndarray | None = None  # per proc: host clock uncertainty (ns, NaN unknown)
    world: int | None = None  # comm spanning every process, if any

    def __post_init__(self) -> None:
        # (host, pid, device) names a rank (see ProcKey); (host, pid) a process, by its
        # first rank (procs are in world-rank order; the live monitor tracks
        # processes: their streams and exits)
        self.proc_of_key: dict[tuple, int] = {}
        for i, p in enumerate(self.procs):
            self.proc_of_key[p.key] = i
            self.proc_of_key.setdefault((p.host, p.pid), i)
        self.comm_of_key = {c.key: i for i, c in enumerate(self.comms)}
        sizes = np.array(
            [max(c.n_ranks, len(m)) for c, m in zip(self.comms, self.members, strict=True)],
            dtype=np.int64,
        )
        self.comm_size = sizes
        self.slot_base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.n_slots = int(self.slot_base[-1])
        self._classes()
        self.stage = self._stages()
        if self.bound_ns is None:
            self.bound_ns = np.zeros(len(self.procs))
        if self.world is None:
            full = [
                i
                for i, m in enumerate(self.members)
                if len(set(m[m >= 0].tolist())) == len(self.procs)
            ]
            self.world = full[0] if full and len(self.procs) > 1 else None

    # ------------------------------------------------------------------ build
    def _classes(self) -> None:
        keys: dict[tuple, int] = {}
        cls = []
        for i, c in enumerate(self.comms):
            k = (name_pattern(c.name), int(self.comm_size[i]), i in self.p2p_comms)
            cls.append(keys.setdefault(k, len(keys)))
        self.comm_class = np.array(cls, dtype=np.int64)
        self.n_classes = len(keys)
        self.class_instances = np.bincount(self.comm_class, minlength=self.n_classes)

    def _stages(self) -> np.ndarray:
        stage = np.zeros(len(self.procs), dtype=np.int64)
        for comm in sorted(self.p2p_comms):
            for rank, proc in enumerate(self.members[comm]):
                if proc >= 0 and stage[proc] == 0:
                    stage[proc] = rank
        return stage

    @property
    def n_procs(self) -> int:
        return len(self.procs)

    @property
    def n_comms(self) -> int:
        return len(self.comms)

    # ------------------------------------------------------------------ naming
    def comm_ref(self, comm: int | None) -> CommRef | None:
        if comm is None or comm < 0:
            return None
        c = self.comms[comm]
        return CommRef(c.id, c.name)

    def who(self, proc: int | None) -> dict:
        """rank/host/pid/device fields of a Finding for a process (device: only for
        a rank of a process holding several)."""
        if proc is None or proc < 0:
            return {"rank": None, "host": None, "pid": None, "device": None}
        p = self.procs[proc]
        return {"rank": p.world_rank, "host": p.host, "pid": p.pid, "device": p.device}

    def abs_ns(self, rel: float) -> int | None:
        return None if rel is None or not np.isfinite(rel) else int(self.t0_ns + round(rel))

    # ------------------------------------------------------------------ factories
    @classmethod
    def build(
        cls,
        comm_rows: Iterable[dict],
        *,
        world_ranks: dict[ProcKey, int] | None = None,
        p2p_comm_keys: Iterable[str] = (),
        issued: Iterable[tuple[str, str]] | None = None,
        t0_ns: int = 0,
        host_bound_ns: dict[str, float] | None = None,
    ) -> Topology:
        """From rows with comm_key (or comm_id), comm_id, comm_name, n_ranks, nnodes,
        rank, host, pid and optionally device: e.g. the `comm` state records a live
        monitor receives. world_ranks is keyed like proc_key()."""
        rows = list(comm_rows)
        multi = _multi_rank(rows)
        keys = [proc_key(r, multi) for r in rows]
        wr = world_ranks if world_ranks is not None else _world_ranks(rows, keys)
        procs_keys = sorted(set(keys), key=lambda k: (wr.get(k, 1 << 40), k[:2], k[2] or 0))
        procs = [_proc_info(wr.get(k, i), k) for i, k in enumerate(procs_keys)]
        pidx = {k: i for i, k in enumerate(procs_keys)}
        comms: dict[str, CommInfo] = {}
        for r in rows:
            key = r.get("comm_key") or comm_key(r["comm_id"])
            if key not in comms:
                comms[key] = CommInfo(
                    key, r["comm_id"], r.get("comm_name"), int(r["n_ranks"]), r.get("nnodes")
                )
        order = sorted(comms)
        cidx = {k: i for i, k in enumerate(order)}
        members = [np.full(comms[k].n_ranks, -1, dtype=np.int64) for k in order]
        for r, pk in zip(rows, keys, strict=True):
            key = r.get("comm_key") or comm_key(r["comm_id"])
            m = members[cidx[key]]
            rank = int(r["rank"])
            if rank >= len(m):
                m = np.concatenate([m, np.full(rank + 1 - len(m), -1, dtype=np.int64)])
                members[cidx[key]] = m
            m[rank] = pidx[pk]
        p2p = {cidx[k] for k in p2p_comm_keys if k in cidx}
        done = None
        if issued is not None:
            done = {(cidx[k], FUNC_CODE.get(f, OTHER)) for k, f in issued if k in cidx}
        bounds = None
        if host_bound_ns is not None:
            bounds = np.array([host_bound_ns.get(p.host, np.nan) for p in procs], dtype=float)
        return cls(procs, [comms[k] for k in order], members, p2p, done, t0_ns, bounds)

    @classmethod
    def from_run(cls, run: Run) -> Topology:
        """From an aligned Run (needs rank_map, communicators, processes, host_clock)."""
        con = run.con
        rows = [
            dict(
                zip(
                    (
                        "comm_key",
                        "comm_id",
                        "comm_name",
                        "n_ranks",
                        "nnodes",
                        "rank",
                        "host",
                        "pid",
                        "device",
                    ),
                    r,
                    strict=True,
                )
            )
            for r in con.execute(
                "SELECT m.comm_key, c.comm_id, c.comm_name, c.n_ranks, c.nnodes, m.rank, m.host, "
                "m.pid, m.device FROM rank_map m JOIN communicators c USING (comm_key)"
            ).fetchall()
        ]
        world = {
            _key(h, p, d, multi): int(w)
            for h, p, d, multi, w in con.execute(
                "SELECT host, pid, device, multi_rank, world_rank FROM processes"
            ).fetchall()
        }
        p2p = [
            k
            for (k,) in con.execute(
                "SELECT DISTINCT comm_key FROM ops WHERE kind = 'p2p'"
            ).fetchall()
        ]
        issued = con.execute(
            "SELECT DISTINCT comm_key, func FROM ops WHERE kind = 'coll'"
        ).fetchall()
        t0 = con.execute("SELECT min(arrival_ns) FROM ops").fetchall()[0][0] or 0
        bounds = {}
        if "host_clock" in run.tables:
            bounds = {
                h: (np.nan if b is None else float(b))
                for h, b in con.execute("SELECT host, bound_ns FROM host_clock").fetchall()
            }
        return cls.build(
            rows,
            world_ranks=world,
            p2p_comm_keys=p2p,
            issued=issued,
            t0_ns=int(t0),
            host_bound_ns=bounds,
        )


def _world_ranks(rows: list[dict], keys: list[ProcKey]) -> dict[ProcKey, int]:
    """Ranks in the communicator with the most ranks (as align.ranks decides)."""
    if not rows:
        return {}
    key = max(rows, key=lambda r: (int(r["n_ranks"]), r.get("comm_key") or r["comm_id"]))
    world = key.get("comm_key") or comm_key(key["comm_id"])
    out: dict[ProcKey, int] = {}
    for r, pk in zip(rows, keys, strict=True):
        if (r.get("comm_key") or comm_key(r["comm_id"])) == world:
            out[pk] = min(out.get(pk, int(r["rank"])), int(r["rank"]))
    return out


def comm_key(comm_id: str) -> str:
    """The comm_key of a communicator id, as align.ranks computes it."""
    return "0x" + comm_id[2:].lower().lstrip("0")[:14]

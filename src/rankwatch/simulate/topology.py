"""Who is where in a simulated job: hosts, processes, communicators, and the
op schedule every step follows.

Global ranks are laid out Megatron-style, tensor-parallel fastest, then data,
then pipeline: r = tp_i + tp * (dp_i + dp * pp_i). Ranks fill hosts in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwatch.simulate.config import SimConfig

DTYPE_SIZE = {"ncclBfloat16": 2, "ncclFloat32": 4}


@dataclass(frozen=True)
class Comm:
    kind: str  # world, tp, dp, pp
    index: int  # group number within its kind
    comm_id: int  # 64-bit commHash
    name: str
    ranks: tuple[int, ...]  # global ranks; position = rank in the communicator
    nnodes: int

    @property
    def id_str(self) -> str:
        return f"0x{self.comm_id:016x}"


@dataclass(frozen=True)
class Phase:
    """One op slot of a step, issued by every member of every group of `comm`.

    p2p_dir: 0 for a collective, +1 for a pipeline send to the next stage (and
    the matching receive), -1 for a send to the previous stage.
    """

    name: str
    comm: str
    func: str
    count: int
    dtype: str
    p2p_dir: int
    compute_us: float  # GPU compute queued before the op
    host_us: float  # host work before the API call

    @property
    def msg_bytes(self) -> int:
        return self.count * DTYPE_SIZE[self.dtype]


@dataclass
class Layout:
    cfg: SimConfig
    host_of: np.ndarray  # (N,) host index of each rank
    hostnames: list[str]
    pids: np.ndarray  # (N,)
    comms: dict[str, list[Comm]]  # kind -> groups
    group_of: dict[str, np.ndarray]  # kind -> (N,) group index
    comm_rank: dict[str, np.ndarray]  # kind -> (N,) rank in that group

    @property
    def n(self) -> int:
        return self.cfg.ranks

    def comm_of(self, kind: str, rank: int) -> Comm:
        return self.comms[kind][int(self.group_of[kind][rank])]

    def kinds_of(self, rank: int) -> list[str]:
        """Communicator kinds this rank belongs to (all of them: every rank is in one)."""
        return list(self.comms)


def _group_arrays(cfg: SimConfig) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """kind -> (group index, rank in group) for every global rank."""
    r = np.arange(cfg.ranks)
    tp, dp = cfg.tp, cfg.dp_size
    tp_i, dp_i, pp_i = r % tp, (r // tp) % dp, r // (tp * dp)
    groups = {"world": (np.zeros_like(r), r)}
    if tp > 1:
        groups["tp"] = (r // tp, tp_i)
    if 1 < dp < cfg.ranks:
        groups["dp"] = (tp_i + tp * pp_i, dp_i)
    if cfg.pp > 1:
        groups["pp"] = (r % (tp * dp), pp_i)
    return groups


_NAMES = {"world": "default_pg", "tp": "TP Group {}", "dp": "DP Group {}", "pp": "PP Group {}"}


def build_layout(cfg: SimConfig, rng: np.random.Generator) -> Layout:
    host_of = np.arange(cfg.ranks) // cfg.ranks_per_host
    hostnames = [f"sim-node{h:03d}" for h in range(cfg.hosts)]
    pids = 1000 + rng.choice(4_000_000, size=cfg.ranks, replace=False)
    if cfg.one_process_per_host:  # every rank of a host in its first rank's process
        pids = pids[host_of * cfg.ranks_per_host]
    comms: dict[str, list[Comm]] = {}
    group_of, comm_rank = {}, {}
    for kind, (group, in_group) in _group_arrays(cfg).items():
        group_of[kind], comm_rank[kind] = group, in_group
        members: list[Comm] = []
        for g in range(int(group.max()) + 1):
            ranks = np.flatnonzero(group == g)
            ranks = ranks[np.argsort(in_group[ranks])]
            nnodes = len(np.unique(host_of[ranks]))
            cid = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))
            name = _NAMES[kind].format(g)
            members.append(Comm(kind, g, cid, name, tuple(int(x) for x in ranks), nnodes))
        comms[kind] = members
    return Layout(cfg, host_of, hostnames, pids, comms, group_of, comm_rank)


def _coll(name: str, comm: str, count: int, dtype: str, compute_us: float, host_us: float) -> Phase:
    return Phase(name, comm, "AllReduce", count, dtype, 0, compute_us, host_us)


def _pass_phases(
    layout: Layout, direction: int, stage: str, layer_us: float, pending: float
) -> tuple[list[Phase], float]:
    """One forward or backward pass: per layer a TP AllReduce after the layer's
    compute (compute only without TP), then the pipeline send/receive."""
    phases: list[Phase] = []
    for i in range(layout.cfg.tp_layers):
        if "tp" not in layout.comms:
            pending += layer_us
            continue
        phases.append(
            _coll(f"tp_{stage}{i}", "tp", 4 << 20, "ncclBfloat16", layer_us + pending, 40)
        )
        pending = 0.0
    if "pp" in layout.comms:
        phases.append(
            Phase(
                f"pp_{stage}", "pp", "Send", 2 << 20, "ncclBfloat16", direction, 200 + pending, 30
            )
        )
        pending = 0.0
    return phases, pending


def step_schedule(layout: Layout) -> list[Phase]:
    """The ops of one training step, in issue order (the same on every rank).

    Forward and backward passes (see _pass_phases); then the gradient AllReduce
    buckets on the data-parallel communicator, then a tiny grad-norm AllReduce on
    the world communicator. GPU compute with no op of its own is folded into the
    next op's `compute_us`.
    """
    phases, pending = _pass_phases(layout, +1, "fwd", 1500.0, 0.0)
    backward, pending = _pass_phases(layout, -1, "bwd", 3000.0, pending)
    phases += backward
    dp_kind = "dp" if "dp" in layout.comms else "world"
    for i in range(layout.cfg.dp_buckets):
        compute = 600 + (pending if i == 0 else 0.0)
        phases.append(_coll(f"dp_bucket{i}", dp_kind, 12 << 20, "ncclBfloat16", compute, 50))
    phases.append(_coll("grad_norm", "world", 1, "ncclFloat32", 400, 60))
    return phases

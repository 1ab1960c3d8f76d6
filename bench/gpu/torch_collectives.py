#!/usr/bin/env python3
"""Issue a known number of every collective kind PyTorch sends to NCCL.

Run under torchrun (2 ranks, one GPU each, NCCL backend):

    torchrun --nproc_per_node=2 bench/gpu/torch_collectives.py --out DIR

Each phase starts after a barrier (itself one 4-byte float32 AllReduce on the
default communicator). Every message size is used by one phase only, so a checker
can tell the phases apart in the profiler's records. Each rank writes
DIR/expected-rank<R>.json: the torch-level calls it issued and the NCCL operations
(function, bytes, count) they should produce, as NCCL reports them:

* all_reduce, reduce, reduce_scatter_tensor: count x 4 bytes of float32
  (reduce_scatter: the per-rank output).
* broadcast and all_gather_into_tensor: NCCL reports datatype ncclInt8 with the
  count in bytes (all_gather: the per-rank input), so the same bytes.
* all_to_all_single and batch_isend_irecv: no collective record; P2P Send and Recv
  records, one per peer (all_to_all includes the rank itself).
* an all_reduce captured in a CUDA graph: one eager warmup call, then one record
  per replay (NCCL re-emits the op at every replay while kernel timing is on).

--steps N adds a loop of N 1 MiB all_reduces, --sleep-ms apart, for observing a
longer-running job. The CUDA graph is deleted and the extra group destroyed before
destroy_process_group: the lent machine hangs at exit otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections import Counter, defaultdict

import torch
import torch.distributed as dist

F32 = 4  # bytes per float32 element

# Element counts (float32) per phase; every byte size is unique to its phase.
AR_SIZES = (256, 16384, 1 << 20)  # 1 KiB, 64 KiB, 4 MiB
BCAST_N = 2048  # 8 KiB
REDUCE_N = 4096  # 16 KiB
ALLGATHER_N = 6144  # 24 KiB per rank
REDUCE_SCATTER_N = 8192  # 32 KiB per rank output
ALLTOALL_N = 2560  # 10 KiB per peer
P2P_N = 1536  # 6 KiB
COALESCED_N = 512  # 2 KiB, 3 tensors per coalesced call
SUBGROUP_N = 3072  # 12 KiB
GRAPH_N = 5120  # 20 KiB
STEP_N = 1 << 18  # 1 MiB
BARRIER_BYTES = 4


class Tracker:
    """What this rank issued: torch calls, and the NCCL ops they should produce."""

    def __init__(self) -> None:
        self.issued: Counter[str] = Counter()
        # comm label -> "coll"/"p2p" -> func -> bytes -> count
        self.ops: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(Counter)))
        self.phases: list[dict] = []
        self.barriers = 0

    def op(self, comm: str, kind: str, func: str, nbytes: int, n: int = 1) -> None:
        self.ops[comm][kind][func][nbytes] += n

    def phase(self, name: str) -> None:
        self.phases.append({"name": name, "t_ns": time.time_ns()})


def barrier(tr: Tracker) -> None:
    dist.barrier()
    tr.barriers += 1
    tr.issued["barrier"] += 1
    tr.op("default", "coll", "AllReduce", BARRIER_BYTES)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for expected-rank<R>.json")
    ap.add_argument("--reps", type=int, default=3, help="calls per kind and size (default 3)")
    ap.add_argument("--graph-replays", type=int, default=5, help="CUDA graph replays (default 5)")
    ap.add_argument("--steps", type=int, default=0, help="extra 1 MiB all_reduce steps")
    ap.add_argument("--sleep-ms", type=float, default=0.0, help="sleep between steps")
    ap.add_argument("--no-graph", action="store_true", help="skip the CUDA graph phase")
    ap.add_argument("--no-subgroup", action="store_true", help="skip the new_group phase")
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=dev)
    peer = (rank + 1) % world
    reps = args.reps
    tr = Tracker()
    t_start = time.time_ns()

    def full(n: int, v: float = 1.0) -> torch.Tensor:
        return torch.full((n,), v, dtype=torch.float32, device=dev)

    # -- all_reduce, several sizes
    barrier(tr)
    tr.phase("all_reduce")
    for n in AR_SIZES:
        t = full(n)
        for _ in range(reps):
            dist.all_reduce(t)
            tr.issued["all_reduce"] += 1
            tr.op("default", "coll", "AllReduce", n * F32)
    torch.cuda.synchronize()

    # -- broadcast
    barrier(tr)
    tr.phase("broadcast")
    t = full(BCAST_N, float(rank))
    for _ in range(reps):
        dist.broadcast(t, src=0)
        tr.issued["broadcast"] += 1
        tr.op("default", "coll", "Broadcast", BCAST_N * F32)
    torch.cuda.synchronize()

    # -- reduce
    barrier(tr)
    tr.phase("reduce")
    t = full(REDUCE_N)
    for _ in range(reps):
        dist.reduce(t, dst=0)
        tr.issued["reduce"] += 1
        tr.op("default", "coll", "Reduce", REDUCE_N * F32)
    torch.cuda.synchronize()

    # -- all_gather_into_tensor
    barrier(tr)
    tr.phase("all_gather")
    inp = full(ALLGATHER_N)
    out = torch.empty(ALLGATHER_N * world, dtype=torch.float32, device=dev)
    for _ in range(reps):
        dist.all_gather_into_tensor(out, inp)
        tr.issued["all_gather_into_tensor"] += 1
        tr.op("default", "coll", "AllGather", ALLGATHER_N * F32)
    torch.cuda.synchronize()

    # -- reduce_scatter_tensor
    barrier(tr)
    tr.phase("reduce_scatter")
    inp = full(REDUCE_SCATTER_N * world)
    out = torch.empty(REDUCE_SCATTER_N, dtype=torch.float32, device=dev)
    for _ in range(reps):
        dist.reduce_scatter_tensor(out, inp)
        tr.issued["reduce_scatter_tensor"] += 1
        tr.op("default", "coll", "ReduceScatter", REDUCE_SCATTER_N * F32)
    torch.cuda.synchronize()

    # -- all_to_all_single: one Send and one Recv per peer, the rank itself included
    barrier(tr)
    tr.phase("all_to_all")
    inp = full(ALLTOALL_N * world)
    out = torch.empty(ALLTOALL_N * world, dtype=torch.float32, device=dev)
    for _ in range(reps):
        dist.all_to_all_single(out, inp)
        tr.issued["all_to_all_single"] += 1
        tr.op("default", "p2p", "Send", ALLTOALL_N * F32, world)
        tr.op("default", "p2p", "Recv", ALLTOALL_N * F32, world)
    torch.cuda.synchronize()

    # -- batched isend/irecv with the next rank (a ring)
    barrier(tr)
    tr.phase("send_recv")
    sbuf = full(P2P_N, float(rank))
    rbuf = torch.empty(P2P_N, dtype=torch.float32, device=dev)
    src = (rank - 1) % world
    for _ in range(reps):
        ops = [dist.P2POp(dist.isend, sbuf, peer), dist.P2POp(dist.irecv, rbuf, src)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        tr.issued["batch_isend_irecv"] += 1
        tr.op("default", "p2p", "Send", P2P_N * F32)
        tr.op("default", "p2p", "Recv", P2P_N * F32)
    torch.cuda.synchronize()

    # -- coalesced all_reduce: 3 tensors in one NCCL group
    barrier(tr)
    tr.phase("coalesced_all_reduce")
    ts = [full(COALESCED_N) for _ in range(3)]
    for _ in range(reps):
        with dist._coalescing_manager(device=dev, async_ops=True) as cm:
            for x in ts:
                dist.all_reduce(x)
        cm.wait()
        tr.issued["coalesced_all_reduce"] += 1
        tr.op("default", "coll", "AllReduce", COALESCED_N * F32, len(ts))
    torch.cuda.synchronize()

    # -- all_reduce on a second communicator
    sub = None
    if not args.no_subgroup:
        barrier(tr)
        tr.phase("subgroup")
        sub = dist.new_group(ranks=list(range(world)))
        t = full(SUBGROUP_N)
        for _ in range(reps):
            dist.all_reduce(t, group=sub)
            tr.issued["subgroup_all_reduce"] += 1
            tr.op("subgroup", "coll", "AllReduce", SUBGROUP_N * F32)
        torch.cuda.synchronize()

    # -- all_reduce captured in a CUDA graph, replayed
    graph_info = None
    if not args.no_graph:
        barrier(tr)
        tr.phase("cuda_graph")
        x = full(GRAPH_N)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dist.all_reduce(x)  # eager warmup before capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        tr.issued["graph_warmup_all_reduce"] += 1
        tr.op("default", "coll", "AllReduce", GRAPH_N * F32)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_reduce(x)
        tr.issued["graph_captured_all_reduce"] += 1
        for _ in range(args.graph_replays):
            g.replay()
            tr.issued["graph_replay"] += 1
            tr.op("default", "coll", "AllReduce", GRAPH_N * F32)
        torch.cuda.synchronize()
        graph_info = {
            "comm": "default",
            "func": "AllReduce",
            "size_bytes": GRAPH_N * F32,
            "eager_warmup": 1,
            "captured": 1,
            "replays": args.graph_replays,
        }
        del g

    # -- optional longer-running loop
    if args.steps > 0:
        barrier(tr)
        tr.phase("steps")
        t = full(STEP_N)
        for _ in range(args.steps):
            dist.all_reduce(t)
            tr.issued["step_all_reduce"] += 1
            tr.op("default", "coll", "AllReduce", STEP_N * F32)
            if args.sleep_ms > 0:
                torch.cuda.synchronize()
                time.sleep(args.sleep_ms / 1e3)
        torch.cuda.synchronize()

    barrier(tr)
    tr.phase("done")
    torch.cuda.synchronize()

    nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version())
    result = {
        "rank": rank,
        "world_size": world,
        "local_rank": local_rank,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "torch": torch.__version__,
        "nccl": nccl_version,
        "profiler_plugin": os.environ.get("NCCL_PROFILER_PLUGIN", ""),
        "gpu_timing": os.environ.get("RANKWATCH_GPU_TIMING", ""),
        "t_start_ns": t_start,
        "t_end_ns": time.time_ns(),
        "reps": reps,
        "barriers": tr.barriers,
        "barrier_bytes": BARRIER_BYTES,
        "issued": dict(tr.issued),
        "expected": {
            comm: {
                kind: {
                    func: {str(b): c for b, c in sorted(sizes.items())}
                    for func, sizes in funcs.items()
                }
                for kind, funcs in kinds.items()
            }
            for comm, kinds in tr.ops.items()
        },
        "graph": graph_info,
        "subgroup_bytes": None if args.no_subgroup else SUBGROUP_N * F32,
        "phases": tr.phases,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"expected-rank{rank}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    print(f"rank {rank}: wrote {path} ({sum(tr.issued.values())} torch calls)", flush=True)

    # Teardown order matters on the lent machine: graph (deleted above), then the
    # extra group, then the default group.
    if sub is not None:
        dist.destroy_process_group(sub)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

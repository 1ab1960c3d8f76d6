#!/usr/bin/env python3
"""A small real training job for validating rankwatch on GPUs, with injected faults.

A GPT-style transformer language model (about 370 M parameters at the defaults)
trained on synthetic tokens under torchrun, with DDP or FSDP (fully_shard):

    torchrun --nproc_per_node=2 bench/gpu/train_lm.py --out DIR [--parallel fsdp]
        [--fault gpu|host|hang --fault-rank 1 --fault-step 30]
        [--profile-steps 25:30] [--graph-metric]

Faults (ground truth written to DIR/truth-rank<R>.json before training starts):
* gpu:  from --fault-step on, the fault rank runs --extra-matmuls 8192x8192 bf16
        matrix multiplications after its forward pass, before backward;
* host: from --fault-step on, the fault rank sleeps --sleep-ms before each step
        (before it builds its batch, as a slow data loader would);
* hang: at --fault-step the fault rank stops calling collectives (it sleeps for
        good); the job is ended from outside by a timeout.

Each rank appends one JSON line per finished step to DIR/steps-rank<R>.jsonl
(step, start/end wall ns, loss) and, at a clean end, writes DIR/issued-rank<R>.json:
what PyTorch issued on each process group according to its Flight Recorder
(TORCH_NCCL_TRACE_BUFFER_SIZE must be set), for comparison with the records.
--profile-steps A:B records steps A..B-1 with PyTorch Profiler on every rank into
DIR/trace/rank<R>.json.gz. --graph-metric also all-reduces a metrics tensor through
a CUDA graph replayed every step.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import sys
import time
from collections import Counter
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for i, block in enumerate(self.blocks):
            # layer names show up in profiler traces as user annotations
            with torch.profiler.record_function(f"layer{i}"):
                x = block(x)
        return self.head(self.ln(x))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--parallel", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--fault", choices=("none", "gpu", "host", "hang"), default="none")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=30)
    p.add_argument("--extra-matmuls", type=int, default=12)
    p.add_argument("--sleep-ms", type=float, default=40.0)
    p.add_argument("--profile-steps", default="", help="A:B, steps A..B-1")
    p.add_argument("--graph-metric", action="store_true")
    return p.parse_args()


def wrap(model: nn.Module, parallel: str, device: torch.device) -> nn.Module:
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index])
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


class GraphMetric:
    """An all_reduce of a small metrics tensor captured once, replayed every step."""

    def __init__(self, device: torch.device) -> None:
        self.buf = torch.zeros(16, device=device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dist.all_reduce(self.buf)  # eager warmup, as NCCL needs before capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            dist.all_reduce(self.buf)

    def replay(self, loss: torch.Tensor) -> None:
        self.buf[0].copy_(loss.detach().float())
        self.graph.replay()

    def close(self) -> None:
        torch.cuda.synchronize()
        del self.graph


def issued_by_pytorch() -> dict:
    """Collectives PyTorch issued per process group, from its Flight Recorder."""
    try:
        raw = torch._C._distributed_c10d._dump_nccl_trace(True, False, False)
    except Exception as exc:  # depends on the PyTorch build
        return {"error": repr(exc)}
    dump = pickle.loads(raw)
    counts: Counter = Counter()
    seq_max: dict = {}
    for e in dump.get("entries", []):
        pg = str(e.get("process_group", ("?", "?"))[0])
        name = e.get("profiling_name", "?")
        counts[f"{pg}|{name}"] += 1
        seq = e.get("collective_seq_id")
        if seq is not None:
            seq_max[pg] = max(seq_max.get(pg, 0), int(seq))
    return {
        "counts": dict(counts),
        "collective_seq_max": seq_max,
        "entries": len(dump.get("entries", [])),
    }


def main() -> int:
    args = parse_args()
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    # a long watchdog: a hang is ended from outside, so the records show it as it was
    dist.init_process_group("nccl", device_id=device, timeout=timedelta(minutes=30))
    world = dist.get_world_size()
    os.makedirs(args.out, exist_ok=True)
    truth = {
        "rank": rank,
        "world": world,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "parallel": args.parallel,
        "fault": args.fault,
        "fault_rank": args.fault_rank,
        "fault_step": args.fault_step,
        "extra_matmuls": args.extra_matmuls,
        "sleep_ms": args.sleep_ms,
        "steps": args.steps,
        "batch": args.batch,
        "seq": args.seq,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    }
    with open(os.path.join(args.out, f"truth-rank{rank}.json"), "w") as f:
        json.dump(truth, f)

    torch.manual_seed(0)
    model = GPT(args.vocab, args.d_model, args.layers, args.heads, args.seq).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    model = wrap(model, args.parallel, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    faulty = args.fault != "none" and rank == args.fault_rank
    mm = None
    if faulty and args.fault == "gpu":
        mm = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    graph = GraphMetric(device) if args.graph_metric else None

    prof_ctx, prof_range = nullcontext(), None
    if args.profile_steps:
        a, b = (int(x) for x in args.profile_steps.split(":"))
        prof_range = (a, b)
        tdir = os.path.join(args.out, "trace")
        os.makedirs(tdir, exist_ok=True)
        prof_ctx = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
            schedule=torch.profiler.schedule(
                skip_first=a - 1, wait=0, warmup=1, active=b - a, repeat=1
            ),
            on_trace_ready=lambda p: p.export_chrome_trace(
                os.path.join(tdir, f"rank{rank}.json.gz")
            ),
            record_shapes=True,
        )
    # open for the whole loop, line-buffered: a hung or killed job keeps its finished steps
    steps_log = open(os.path.join(args.out, f"steps-rank{rank}.jsonl"), "w", buffering=1)  # noqa: SIM115
    if rank == 0:
        print(
            f"model {n_params / 1e6:.0f} M parameters, {args.parallel}, world {world}", flush=True
        )
    with prof_ctx as prof:
        for step in range(args.steps):
            t0 = time.time_ns()
            if faulty and step >= args.fault_step and args.fault == "host":
                time.sleep(args.sleep_ms / 1e3)
            if faulty and step == args.fault_step and args.fault == "hang":
                print(f"rank {rank}: hanging at step {step}", flush=True)
                time.sleep(10**6)
            idx = torch.randint(0, args.vocab, (args.batch, args.seq), device=device, generator=gen)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(idx[:, :-1])
                loss = F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]).float(), idx[:, 1:].reshape(-1)
                )
            if mm is not None and step >= args.fault_step:
                for _ in range(args.extra_matmuls):
                    mm = (mm @ mm).mul_(1e-4)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if graph is not None:
                graph.replay(loss)
            value = loss.item()  # the step's one host sync, as training loops have
            t1 = time.time_ns()
            steps_log.write(
                json.dumps({"step": step, "start_ns": t0, "end_ns": t1, "loss": value}) + "\n"
            )
            if prof_range is not None and prof is not None:
                prof.step()
    steps_log.close()
    if graph is not None:
        graph.close()
    torch.cuda.synchronize()
    issued = issued_by_pytorch()
    issued["params"] = n_params
    with open(os.path.join(args.out, f"issued-rank{rank}.json"), "w") as f:
        json.dump(issued, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

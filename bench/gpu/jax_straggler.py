#!/usr/bin/env python3
"""A JAX training-like loop in one process driving every local GPU, with one GPU made
slow from a given step: the real-hardware check that rankwatch tells the ranks of a
single-controller process apart (by device) and names the slow one.

    NCCL_PROFILER_PLUGIN=... python bench/gpu/jax_straggler.py --out DIR \
        [--steps 60] [--slow-device 1] [--slow-from 30] [--slow-matmuls 48]

Each step, under jit and shard_map over a 1-D mesh of all devices: a few bf16 matmuls
on each device's shard (the step's compute), then psum_scatter and all_gather of the
result (a ZeRO-like gradient exchange). From step --slow-from on, a separate jitted
chain of --slow-matmuls matmuls is dispatched to device --slow-device alone just
before each step (asynchronously, on that device's compute stream), so that device's
share of the step, collectives included, starts late on the GPU while the host issues
every step on time: a GPU straggler. (Control flow on the axis index inside the step
would make XLA read the predicate back on the host, a host delay instead.)
DIR/jax-straggler.json has the settings and per-step times.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

try:
    from jax import shard_map
except ImportError:  # older JAX
    from jax.experimental.shard_map import shard_map

DIM = 4096
WORK_MATMULS = 4


def matmuls(x: jax.Array, w: jax.Array, n: int) -> jax.Array:
    return jax.lax.fori_loop(0, n, lambda _, y: jnp.tanh(y @ w), x)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--slow-device", type=int, default=1)
    ap.add_argument("--slow-from", type=int, default=30)
    ap.add_argument("--slow-matmuls", type=int, default=48)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    devs = jax.devices()
    n = len(devs)
    mesh = Mesh(np.array(devs), ("x",))

    def body(x, w):
        y = matmuls(x, w, WORK_MATMULS)
        grad = jax.lax.psum_scatter(y, "x", tiled=True)
        return jax.lax.all_gather(grad, "x", tiled=True)

    spec = P("x")
    try:
        f = shard_map(body, mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=False)
    except TypeError:
        f = shard_map(body, mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_rep=False)
    step_fn = jax.jit(f)
    shard = NamedSharding(mesh, spec)
    x = jax.device_put(jnp.ones((n * 1024, DIM), jnp.bfloat16) * 0.01, shard)
    w = jax.device_put(jnp.ones((n * DIM, DIM), jnp.bfloat16) * 1e-4, shard)
    slow_dev = devs[args.slow_device]
    x1 = jax.device_put(jnp.ones((1024, DIM), jnp.bfloat16) * 0.01, slow_dev)
    w1 = jax.device_put(jnp.ones((DIM, DIM), jnp.bfloat16) * 1e-4, slow_dev)
    extra = jax.jit(lambda v, m: matmuls(v, m, args.slow_matmuls))
    jax.block_until_ready(step_fn(x, w))  # compile outside the loop
    jax.block_until_ready(extra(x1, w1))
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter_ns()
        if step >= args.slow_from:
            extra(x1, w1)  # queued on the slow device ahead of its share of the step
        out = step_fn(x, w)
        jax.block_until_ready(out)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    result = {
        "devices": [str(d) for d in devs],
        "jax": jax.__version__,
        "steps": args.steps,
        "slow_device": args.slow_device,
        "slow_from_step": args.slow_from,
        "slow_matmuls": args.slow_matmuls,
        "step_ms": times,
        "median_step_ms_before": float(np.median(times[3 : args.slow_from])),
        "median_step_ms_after": float(np.median(times[args.slow_from :])),
    }
    with open(os.path.join(args.out, "jax-straggler.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print(
        f"step ms before {result['median_step_ms_before']:.2f}, "
        f"after {result['median_step_ms_after']:.2f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

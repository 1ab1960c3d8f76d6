#!/usr/bin/env python3
"""JAX collectives on every local GPU, for checking that the rankwatch plugin records
a non-PyTorch framework unchanged.

    NCCL_PROFILER_PLUGIN=... python bench/gpu/jax_collectives.py --out DIR

One process drives all local GPUs (JAX's single-controller model). Through jit
with shard_map over a 1-D mesh it runs --iters of each: psum (all-reduce),
all_gather, psum_scatter (reduce-scatter), ppermute (send/recv pairs) and a
sharded matmul whose contraction dimension is split (XLA inserts the all-reduce).
DIR/jax-expected.json says what was called, with shapes and bytes.
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


def timed(fn, x, iters: int) -> float:
    out = fn(x)
    jax.block_until_ready(out)  # compile and warm up outside the timing
    t0 = time.perf_counter()
    for _ in range(iters):
        out = fn(x)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    devs = jax.devices()
    n = len(devs)
    mesh = Mesh(np.array(devs), ("x",))
    shard = NamedSharding(mesh, P("x"))

    def smap(body, out_spec):
        # psum's result is replicated by construction; the replication check of
        # shard_map cannot always infer it (the flag was renamed across versions)
        try:
            f = shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=out_spec, check_vma=False)
        except TypeError:
            f = shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=out_spec, check_rep=False)
        return jax.jit(f)

    cases = {
        "psum": (smap(lambda a: jax.lax.psum(a, "x"), P()), (n * 1024 * 256,)),
        "all_gather": (smap(lambda a: jax.lax.all_gather(a, "x", tiled=True), P()), (n * 6144,)),
        "psum_scatter": (
            smap(lambda a: jax.lax.psum_scatter(a, "x", tiled=True), P("x")),
            (n * n * 8192,),
        ),
        "ppermute": (
            smap(lambda a: jax.lax.ppermute(a, "x", [(i, (i + 1) % n) for i in range(n)]), P("x")),
            (n * 2560,),
        ),
    }
    results = {
        "devices": [str(d) for d in devs],
        "jax": jax.__version__,
        "iters": args.iters,
        "cases": {},
    }
    for name, (fn, shape) in cases.items():
        x = jax.device_put(jnp.ones(shape, jnp.float32), shard)
        us = timed(fn, x, args.iters)
        results["cases"][name] = {
            "global_shape": list(shape),
            "bytes_per_device": 4 * shape[0] // n,
            "us_per_call": us,
            "calls": args.iters + 1,
        }
        print(f"{name}: {us:.1f} us per call", flush=True)

    # a matmul whose contraction dimension is sharded: XLA adds an all-reduce
    a = jax.device_put(jnp.ones((512, 4096), jnp.bfloat16), NamedSharding(mesh, P(None, "x")))
    b = jax.device_put(jnp.ones((4096, 512), jnp.bfloat16), NamedSharding(mesh, P("x", None)))
    mm = jax.jit(lambda a, b: a @ b, out_shardings=NamedSharding(mesh, P()))
    jax.block_until_ready(mm(a, b))
    for _ in range(args.iters):
        out = mm(a, b)
    jax.block_until_ready(out)
    results["cases"]["sharded_matmul"] = {
        "calls": args.iters + 1,
        "hlo_has_all_reduce": "all-reduce" in mm.lower(a, b).compile().as_text(),
    }
    with open(os.path.join(args.out, "jax-expected.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

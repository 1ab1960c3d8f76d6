"""Synthetic per-rank profiler traces of a data-parallel training job, with injected
faults and the ground truth to check an analysis against.

The job: every step reads a batch (DataLoader range), copies it to the GPU, runs
`layers` transformer blocks forward (GEMMs, attention, norms) and backward (two
GEMMs per forward GEMM), all-reduces gradients in `buckets` DDP buckets on a
communication stream while backward continues (FSDP mode: all-gather before each
block's forward, reduce-scatter after each block's backward), runs the optimizer
after the last collective, and synchronises on `loss.item()`.

The simulation is causal: the host issues ops (cpu op -> launch -> kernel), a
kernel starts when it is launched and its stream and dependencies are free, and a
collective's transfer starts on every rank only when the last rank's kernel is
ready, so one rank's slow GEMM really makes its peers wait. All ranks advance
instruction by instruction in lockstep, which is what lets a collective see every
rank's ready time. Each rank's timestamps are written on its own clock (true time
plus an offset).

Writers (synth_kineto, synth_nsys) turn the events into files; `truth` records
what was injected, where it landed and what it should cost.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

MS = 1_000_000
US = 1_000
START_UNIX_NS = 1_764_374_400_000_000_000  # 2025-11-29 00:00 UTC

GEMM_FWD = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_"
    "execute_segment_k_off_kernel__5x_cublas"
)
GEMM_FWD_SMALL = "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN"
GEMM_DGRAD = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x256x64_warpgroupsize2x1x1_"
    "execute_segment_k_off_kernel__5x_cublas"
)
GEMM_WGRAD = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x128x64_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas"
)
ADD_KERNEL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<"
    "c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "std::array<char*, 3ul>)"
)

# Forward ops of one block: (op key, cpu op, kernel, milliseconds, is a GEMM)
FWD_OPS: tuple[tuple[str, str, str, float, bool], ...] = (
    (
        "ln1",
        "aten::native_layer_norm",
        "void at::native::vectorized_layer_norm_kernel",
        0.12,
        False,
    ),
    ("qkv", "aten::addmm", GEMM_FWD, 1.2, True),
    ("attn", "aten::_scaled_dot_product_flash_attention", "flash_fwd_kernel", 1.0, False),
    ("proj", "aten::addmm", GEMM_FWD_SMALL, 0.45, True),
    ("res1", "aten::add", ADD_KERNEL, 0.05, False),
    (
        "ln2",
        "aten::native_layer_norm",
        "void at::native::vectorized_layer_norm_kernel",
        0.12,
        False,
    ),
    ("mlp_up", "aten::addmm", GEMM_FWD, 1.6, True),
    ("act", "aten::gelu", "void at::native::GeluCUDAKernelImpl", 0.2, False),
    ("mlp_down", "aten::addmm", GEMM_FWD_SMALL, 1.6, True),
    ("res2", "aten::add", ADD_KERNEL, 0.05, False),
)
BWD_KERNELS = {
    "ln1": ("NativeLayerNormBackward0", "void at::native::layer_norm_grad_input_kernel"),
    "ln2": ("NativeLayerNormBackward0", "void at::native::layer_norm_grad_input_kernel"),
    "attn": (
        "ScaledDotProductFlashAttentionBackward0",
        "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
    ),
    "act": ("GeluBackward0", "void at::native::GeluBackwardCUDAKernelImpl"),
    "res1": ("AddBackward0", ADD_KERNEL),
    "res2": ("AddBackward0", ADD_KERNEL),
}
EFFECTIVE_FLOPS = 600e12  # FLOP/s a GEMM achieves in this model: gives ops a "flops" arg
DATALOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
OPTIMIZER = "Optimizer.step#AdamW.step"
MULTI_TENSOR = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
    "(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
    "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, "
    "double, double, double, double, bool, double*, double*>"
)


@dataclass(frozen=True)
class SlowKernel:
    """On `rank` in `step`, the kernel of forward op `op` in block `layer` runs longer."""

    rank: int
    step: int
    layer: int
    extra_ms: float
    op: str = "mlp_up"


@dataclass(frozen=True)
class InputDelay:
    """On `rank` in `step`, the DataLoader takes `extra_ms` longer."""

    rank: int
    step: int
    extra_ms: float


@dataclass(frozen=True)
class Slowdown:
    """Every occurrence of forward op `op` (and its backward) is `factor` times slower,
    on `ranks` (all when empty): a software regression."""

    op: str
    factor: float
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class ExtraMatmuls:
    """From `step` to `last_step` (every later step when None), `rank` runs `count`
    extra matrix multiplications (aten::mm, then aten::mul_) of `ms` each after the
    loss and before backward, outside any layer: inserted work its peers do not run."""

    rank: int
    step: int
    count: int
    ms: float = 1.0
    last_step: int | None = None

    def active(self, rank: int, step: int) -> bool:
        last = self.last_step if self.last_step is not None else step
        return rank == self.rank and self.step <= step <= last


EXTRA_GEMM = "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT"
MUL_KERNEL = (
    "void at::native::vectorized_elementwise_kernel<8, at::native::AUnaryFunctor<c10::BFloat16, "
    "c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, "
    "std::array<char*, 2ul> >(int, at::native::AUnaryFunctor<c10::BFloat16, c10::BFloat16, "
    "c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul>)"
)


@dataclass(frozen=True)
class SizeMismatch:
    """On `rank` in `step`, the all-reduce of `bucket` has half the elements."""

    rank: int
    step: int
    bucket: int = 0


@dataclass
class SynthConfig:
    ranks: int = 4
    steps: int = 16
    first_step: int = 5
    layers: int = 8
    buckets: int = 4
    mode: str = "ddp"  # ddp | fsdp | cpu (gloo, no GPU)
    seed: int = 0
    jitter: float = 0.01  # lognormal sigma of every duration
    clock_offsets_us: tuple[float, ...] = ()  # per rank; rank's clock = true + offset
    faults: tuple[Any, ...] = ()
    scale: float = 1.0  # multiplies kernel durations
    bucket_bytes: int = 50 * 1024 * 1024
    busbw_gbs: float = 80.0  # bus bandwidth of the simulated all-reduce transfers
    ranks_per_host: int = 0  # 0: one host per rank
    gpu_name: str = "NVIDIA H200"

    def offset_ns(self, rank: int) -> int:
        offs = self.clock_offsets_us
        return round(offs[rank] * US) if rank < len(offs) else 0

    def host_of(self, rank: int) -> str:
        per = self.ranks_per_host or 1
        return f"node{rank // per:02d}"


@dataclass(slots=True)
class SimEvent:
    """One event in true time. cat: step, annotation, input, cpu_op, runtime, kernel,
    memcpy, gpu_annotation, comm_meta (record_param_comms), nccl_range (NVTX)."""

    cat: str
    name: str
    start: int
    end: int
    lane: int  # host thread id, or GPU stream
    ext: int = -1
    corr: int = -1
    args: dict[str, Any] | None = None


@dataclass
class _Range:
    name: str
    cat: str
    start: int
    lane: int
    ext: int
    gpu_first: int = -1
    gpu_last: int = -1


@dataclass
class _Rank:
    rank: int
    host: int
    rng: random.Random
    compute_free: int = 0
    comm_free: int = 0
    last_coll_end: int = 0
    next_id: int = 1
    open: list[_Range] = field(default_factory=list)
    events: list[SimEvent] = field(default_factory=list)


MAIN_TID = 1
BWD_TID = 2
COMPUTE_STREAM = 7
COMM_STREAM = 20
PG_NAME = "0"
PG_DESC = "default_pg"


class Simulation:
    """Step-by-step lockstep simulation of every rank (see module doc)."""

    def __init__(self, cfg: SynthConfig) -> None:
        self.cfg = cfg
        master = random.Random(cfg.seed)
        self.ranks = [
            _Rank(r, START_UNIX_NS + master.randrange(0, 200 * US), random.Random(master.random()))
            for r in range(cfg.ranks)
        ]
        self.seq = 400  # Kineto "Seq" of the next collective on the default group
        self.truth: dict[str, Any] = {"collectives": [], "steps": {}, "faults": []}
        self.step_no = cfg.first_step
        self.gpu = cfg.mode != "cpu"

    # -- small helpers -------------------------------------------------------------
    def _jit(self, st: _Rank, ns: float) -> int:
        return max(1, round(ns * math.exp(st.rng.gauss(0.0, self.cfg.jitter))))

    def _id(self, st: _Rank) -> int:
        st.next_id += 1
        return st.next_id

    def _emit(self, st: _Rank, ev: SimEvent) -> None:
        st.events.append(ev)

    def _begin(self, st: _Rank, name: str, cat: str = "annotation", lane: int = MAIN_TID) -> None:
        st.open.append(_Range(name, cat, st.host, lane, self._id(st)))
        st.host += 1 * US

    def _end(self, st: _Rank) -> None:
        rng = st.open.pop()
        st.host += 1 * US
        self._emit(st, SimEvent(rng.cat, rng.name, rng.start, st.host, rng.lane, rng.ext))
        if rng.gpu_first >= 0 and rng.cat in ("annotation", "step"):
            self._emit(
                st,
                SimEvent("gpu_annotation", rng.name, rng.gpu_first, rng.gpu_last, COMPUTE_STREAM),
            )
        if rng.gpu_first >= 0 and st.open:
            outer = st.open[-1]
            outer.gpu_first = rng.gpu_first if outer.gpu_first < 0 else outer.gpu_first
            outer.gpu_last = max(outer.gpu_last, rng.gpu_last)

    def _gpu_span(self, st: _Rank, start: int, end: int) -> None:
        if st.open:
            top = st.open[-1]
            top.gpu_first = start if top.gpu_first < 0 else top.gpu_first
            top.gpu_last = max(top.gpu_last, end)

    def _factor(self, rank: int, op: str) -> float:
        f = 1.0
        for fault in self.cfg.faults:
            hit = isinstance(fault, Slowdown) and fault.op == op
            if hit and (not fault.ranks or rank in fault.ranks):
                f *= fault.factor
        return f

    # -- ops ---------------------------------------------------------------------------
    def _launch(
        self,
        st: _Rank,
        lane: int,
        kernel: str,
        dur: int,
        stream: int,
        dep: int,
        ext: int,
        cat: str = "kernel",
        runtime: str = "cudaLaunchKernel",
        args: dict | None = None,
    ) -> tuple[int, int]:
        """Runtime call at the current host time, then the GPU op; returns (start, end)."""
        corr = self._id(st)
        call = self._jit(st, 5 * US)
        self._emit(st, SimEvent("runtime", runtime, st.host, st.host + call, lane, ext, corr))
        st.host += call
        free = st.compute_free if stream == COMPUTE_STREAM else st.comm_free
        start = max(st.host + 4 * US, free, dep)
        end = start + dur
        self._emit(st, SimEvent(cat, kernel, start, end, stream, ext, corr, args))
        if stream == COMPUTE_STREAM:
            st.compute_free = end
        self._gpu_span(st, start, end)
        return start, end

    def _op(
        self,
        st: _Rank,
        cpu: str,
        kernel: str,
        ms: float,
        lane: int = MAIN_TID,
        gemm: bool = False,
        extra_ns: int = 0,
    ) -> tuple[int, int]:
        """One aten op launching one kernel (on the CPU-only job: computing on the host)."""
        dur = self._jit(st, ms * MS * self.cfg.scale) + extra_ns
        ext = self._id(st)
        start = st.host
        flops = {"flops": round(dur / 1e9 * EFFECTIVE_FLOPS)} if gemm else None
        st.host += self._jit(st, 8 * US)
        if self.gpu:
            span = self._launch(st, lane, kernel, dur, COMPUTE_STREAM, 0, ext)
            st.host += self._jit(st, 6 * US)
        else:
            st.host += dur
            span = (start, st.host)
        self._emit(st, SimEvent("cpu_op", cpu, start, st.host, lane, ext, args=flops))
        st.host += 2 * US
        return span

    def _memcpy(self, st: _Rank, name: str, ms: float, nbytes: int) -> None:
        ext = self._id(st)
        start = st.host
        st.host += 3 * US
        if self.gpu:
            self._launch(
                st,
                MAIN_TID,
                name,
                self._jit(st, ms * MS),
                COMPUTE_STREAM,
                0,
                ext,
                cat="memcpy",
                runtime="cudaMemcpyAsync",
                args={"bytes": nbytes},
            )
        self._emit(st, SimEvent("cpu_op", "aten::copy_", start, st.host + 2 * US, MAIN_TID, ext))
        st.host += 4 * US

    # -- collectives -------------------------------------------------------------------
    def _coll_meta(self, st: _Rank, func: str, nelems: int, bucket: int) -> dict[str, Any]:
        for fault in self.cfg.faults:
            hit = isinstance(fault, SizeMismatch) and fault.rank == st.rank
            if hit and fault.step == self.step_no and fault.bucket == bucket:
                nelems //= 2
        out = nelems // self.cfg.ranks if func == "reduce_scatter_tensor" else nelems
        inn = nelems // self.cfg.ranks if func == "all_gather_into_tensor" else nelems
        return {
            "Collective name": func,
            "In msg nelems": inn,
            "Out msg nelems": out,
            "Group size": self.cfg.ranks,
            "dtype": "BFloat16",
            "In split size": "[]",
            "Out split size": "[]",
            "Global rank start": 0,
            "Global rank stride": 1,
            "Process Group Name": PG_NAME,
            "Process Group Description": PG_DESC,
            "Process Group Ranks": str(list(range(self.cfg.ranks))),
            "Rank": st.rank,
            "Seq": self.seq,
        }

    def _coll(self, func: str, kernel: str, nbytes: int, bucket: int, lane: int) -> None:
        """One collective on every rank: issue, wait for the last rank, transfer."""
        ready: list[int] = []
        issued: list[tuple[int, dict[str, Any], int]] = []
        for st in self.ranks:
            ext = self._id(st)
            meta = self._coll_meta(st, func, nbytes // 2, bucket)
            start = st.host
            self._emit(
                st,
                SimEvent(
                    "comm_meta", "record_param_comms", start, start + 4 * US, lane, ext, args=meta
                ),
            )
            st.host += 5 * US
            self._begin(st, f"nccl:{func}", lane=lane)
            issued.append((ext, meta, st.host))
            dep = st.compute_free if func != "all_gather_into_tensor" else 0
            if self.gpu:
                ready.append(max(st.host + 10 * US, st.comm_free, dep))
            else:
                ready.append(st.host)
        size = self.cfg.ranks
        factor = (
            2 * (size - 1) / size
            if "reduce" in func and "scatter" not in func
            else ((size - 1) / size)
        )
        transfer_start = max(ready)
        transfer = self._jit(
            self.ranks[0], 30 * US + nbytes * factor / (self.cfg.busbw_gbs * 1e9) * 1e9
        )
        last = max(range(size), key=lambda r: ready[r])
        self.truth["collectives"].append(
            {
                "step": self.step_no,
                "seq": self.seq,
                "func": func,
                "last_rank": last,
                "waits_ns": [transfer_start - t for t in ready],
                "transfer_ns": transfer,
            }
        )
        for st, (ext, meta, t_issue), t_ready in zip(self.ranks, issued, ready, strict=True):
            end = transfer_start + transfer + st.rng.randrange(0, 2 * US)
            self._coll_rank(st, func, kernel, meta, ext, t_issue, t_ready, end, lane)
        self.seq += 1

    def _coll_rank(
        self,
        st: _Rank,
        func: str,
        kernel: str,
        meta: dict,
        ext: int,
        t_issue: int,
        t_ready: int,
        end: int,
        lane: int,
    ) -> None:
        corr = self._id(st)
        if self.gpu:
            call = self._jit(st, 7 * US)
            self._emit(
                st,
                SimEvent(
                    "runtime", "cudaLaunchKernelExC", t_issue, t_issue + call, lane, ext, corr
                ),
            )
            st.host = t_issue + call
            self._emit(
                st, SimEvent("kernel", kernel, t_ready, end, COMM_STREAM, ext, corr, dict(meta))
            )
            st.comm_free = st.last_coll_end = end
            if func == "all_gather_into_tensor":
                st.compute_free = max(st.compute_free, end)  # the block's forward needs it
        else:
            self._emit(
                st, SimEvent("comm_host", f"gloo:{func}", t_ready, end, lane, ext, args=dict(meta))
            )
            st.host = end
        self._emit(
            st,
            SimEvent(
                "nccl_range",
                "nccl" + _camel(func),
                t_issue,
                st.host + 1 * US,
                lane,
                ext,
                args=dict(meta),
            ),
        )
        self._end(st)
        st.host += 3 * US

    # -- the step ----------------------------------------------------------------------
    def _input(self, st: _Rank) -> None:
        extra = sum(
            f.extra_ms * MS
            for f in self.cfg.faults
            if isinstance(f, InputDelay) and f.rank == st.rank and f.step == self.step_no
        )
        start = st.host
        st.host += self._jit(st, 1.5 * MS) + round(extra)
        self._emit(st, SimEvent("input", DATALOADER, start, st.host, MAIN_TID, self._id(st)))
        if extra:
            self.truth["faults"].append(
                {
                    "kind": "input_wait",
                    "rank": st.rank,
                    "step": self.step_no,
                    "extra_ns": round(extra),
                    "name": DATALOADER,
                }
            )

    def _slow_extra(self, st: _Rank, layer: int, op: str) -> int:
        extra = 0
        for f in self.cfg.faults:
            if isinstance(f, SlowKernel) and (f.rank, f.step, f.layer, f.op) == (
                st.rank,
                self.step_no,
                layer,
                op,
            ):
                extra += round(f.extra_ms * MS)
        return extra

    def _forward_block(self, layer: int) -> None:
        for st in self.ranks:
            self._begin(st, f"layers.{layer}")
        if self.cfg.mode == "fsdp":
            self._coll(
                "all_gather_into_tensor",
                "ncclDevKernel_AllGather_RING_LL",
                self.cfg.bucket_bytes // self.cfg.layers,
                layer,
                MAIN_TID,
            )
        for st in self.ranks:
            for key, cpu, kernel, ms, gemm in FWD_OPS:
                extra = self._slow_extra(st, layer, key)
                f = self._factor(st.rank, key)
                span = self._op(st, cpu, kernel, ms * f, gemm=gemm, extra_ns=extra)
                if extra:
                    self.truth["faults"].append(
                        {
                            "kind": "slow_kernel",
                            "rank": st.rank,
                            "step": self.step_no,
                            "layer": layer,
                            "annotation": f"layers.{layer}",
                            "kernel": kernel,
                            "cpu_op": cpu,
                            "extra_ns": extra,
                            "start_ns": span[0],
                        }
                    )
            self._end(st)

    def _backward_block(self, layer: int) -> None:
        for st in self.ranks:
            self._begin(st, f"layers.{layer}.backward", lane=BWD_TID)
            for key, _cpu, _kernel, ms, gemm in reversed(FWD_OPS):
                f = self._factor(st.rank, key)
                if gemm:
                    outer = f"autograd::engine::evaluate_function: AddmmBackward0 ({key})"
                    self._begin(st, outer, cat="cpu_op", lane=BWD_TID)
                    self._op(st, "aten::mm", GEMM_DGRAD, ms * f, BWD_TID, gemm=True)
                    self._op(st, "aten::mm", GEMM_WGRAD, ms * f, BWD_TID, gemm=True)
                    self._end(st)
                else:
                    name, bkernel = BWD_KERNELS[key]
                    self._op(
                        st,
                        f"autograd::engine::evaluate_function: {name}",
                        bkernel,
                        ms * 1.5 * f,
                        BWD_TID,
                    )
            self._end(st)

    def _gradient_sync(self, layer: int) -> None:
        cfg = self.cfg
        if cfg.mode == "fsdp":
            self._coll(
                "reduce_scatter_tensor",
                "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
                cfg.bucket_bytes // cfg.layers,
                layer,
                BWD_TID,
            )
            return
        per_bucket = max(1, cfg.layers // cfg.buckets)
        done = cfg.layers - layer  # blocks whose gradients are ready
        if done % per_bucket == 0 or layer == 0:
            bucket = (done - 1) // per_bucket
            kernel = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
            self._coll("allreduce", kernel, cfg.bucket_bytes, bucket, BWD_TID)

    def _extra_ops(self, st: _Rank) -> None:
        """Injected ExtraMatmuls: matmul then scale, `count` times (see ExtraMatmuls)."""
        for f in self.cfg.faults:
            if not (isinstance(f, ExtraMatmuls) and f.active(st.rank, self.step_no)):
                continue
            gpu_ns, first = 0, None
            for _ in range(f.count):
                mm = self._op(st, "aten::mm", EXTRA_GEMM, f.ms, gemm=True)
                mul = self._op(st, "aten::mul_", MUL_KERNEL, 0.05)
                gpu_ns += (mm[1] - mm[0]) + (mul[1] - mul[0])
                first = mm[0] if first is None else first
            self.truth["faults"].append(
                {
                    "kind": "extra_ops",
                    "rank": st.rank,
                    "step": self.step_no,
                    "count": f.count,
                    "cpu_op": "aten::mm",
                    "kernel": EXTRA_GEMM,
                    "extra_ns": gpu_ns,
                    "start_ns": first,
                }
            )

    def _optimizer(self) -> None:
        for st in self.ranks:
            self._begin(st, OPTIMIZER)
            if self.gpu:
                call = 2 * US
                self._emit(
                    st,
                    SimEvent(
                        "runtime",
                        "cudaStreamWaitEvent",
                        st.host,
                        st.host + call,
                        MAIN_TID,
                        -1,
                        self._id(st),
                    ),
                )
                st.host += call
                st.compute_free = max(st.compute_free, st.last_coll_end)
            for _ in range(4):
                self._op(st, "aten::_fused_adamw_", MULTI_TENSOR, 0.4)
            self._end(st)

    def _sync(self, st: _Rank) -> None:
        self._memcpy(st, "Memcpy DtoH (Device -> Pageable)", 0.004, 4)
        if self.gpu:
            done = max(st.compute_free, st.comm_free) + 5 * US
            self._emit(
                st,
                SimEvent(
                    "runtime",
                    "cudaStreamSynchronize",
                    st.host,
                    max(done, st.host + 2 * US),
                    MAIN_TID,
                    -1,
                    self._id(st),
                ),
            )
            st.host = max(done, st.host + 2 * US)
        st.host += 20 * US

    def step(self) -> list[list[SimEvent]]:
        """Simulate one step on every rank; returns each rank's events (true time)."""
        for st in self.ranks:
            st.events = []
            self._begin(st, f"ProfilerStep#{self.step_no}", cat="step")
            self._input(st)
            self._memcpy(st, "Memcpy HtoD (Pinned -> Device)", 0.25, 8 << 20)
        for layer in range(self.cfg.layers):
            self._forward_block(layer)
        for st in self.ranks:
            self._op(st, "aten::cross_entropy_loss", "void at::native::cunn_SoftMaxForward", 0.3)
            self._extra_ops(st)
        for layer in reversed(range(self.cfg.layers)):
            self._backward_block(layer)
            self._gradient_sync(layer)
        self._optimizer()
        steps = self.truth["steps"].setdefault(str(self.step_no), {})
        for st in self.ranks:
            self._sync(st)
            start = st.open[0].start
            self._end(st)
            steps[str(st.rank)] = st.host - start
        self.step_no += 1
        return [st.events for st in self.ranks]


def _camel(func: str) -> str:
    """nccl API name of a PyTorch collective name (allreduce -> AllReduce)."""
    table = {
        "allreduce": "AllReduce",
        "all_gather_into_tensor": "AllGather",
        "reduce_scatter_tensor": "ReduceScatter",
    }
    return table.get(func, func.title().replace("_", ""))

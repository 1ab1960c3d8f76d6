/*
 * Turning completed slots into records: copy the slot, fold its timing into the
 * communicator's clock bounds, convert GPU times to host time, compute
 * Inspector's bandwidths, format, and give the slot back.
 */
#include <math.h>
#include <stdlib.h>

#include "record.h"
#include "rw.h"
#include "writer_internal.h"

static void snapshot(const rw_slot *s, rw_op *op) {
  op->kind = LD(&s->kind);
  op->func = LD(&s->func);
  op->dtype = LD(&s->dtype);
  op->algo = LD(&s->algo);
  op->proto = LD(&s->proto);
  op->nchannels = LD(&s->nchannels);
  op->root_or_peer = LD(&s->root_or_peer);
  op->seq = LD(&s->seq);
  op->p2p_sn = LD(&s->p2p_sn);
  op->count = LD(&s->count);
  op->api_start = rw_ticks_to_ns(LD(&s->api_start));
  op->api_end = rw_ticks_to_ns(LD(&s->api_end));
  op->enq_start = rw_ticks_to_ns(LD(&s->enq_start));
  op->enq_end = rw_ticks_to_ns(LD(&s->enq_end));
  int64_t gs = LD(&s->gpu_start_raw), ge = LD(&s->gpu_end_raw);
  op->gpu_start_raw = gs == INT64_MAX ? 0 : gs;
  op->gpu_end_raw = ge == INT64_MIN ? 0 : ge;
  op->ch_started = LD(&s->ch_started);
  op->ch_stopped = LD(&s->ch_stopped);
  op->ch_mask = LD(&s->ch_mask);
  op->graph = (LD(&s->flags) & RW_F_GRAPH) != 0;
  op->gpu_timed = op->gpu_start_raw != 0 && op->gpu_end_raw >= op->gpu_start_raw;
}

/* ---- bandwidth as NCCL Inspector and nccl-tests compute it ---- */

static void bandwidth(const rw_comm *c, rw_op *op) {
  int size = rw_dtype_size(op->dtype);
  op->msg_known = size > 0;
  op->msg_bytes = op->count * (uint64_t)size;
  double n = c->nranks > 0 ? c->nranks : 1, traffic = (double)op->msg_bytes, factor = 1;
  switch (op->kind == RW_OP_COLL ? op->func : RW_FUNC_SEND) {
  case RW_FUNC_ALLREDUCE: factor = 2 * (n - 1) / n; break;
  case RW_FUNC_ALLGATHER:
  case RW_FUNC_REDUCESCATTER: traffic *= n; factor = (n - 1) / n; break;
  default: break;
  }
  double secs = (double)op->exec_ns / 1e9;
  op->algbw_gbs = secs > 0 && op->msg_known ? traffic / 1e9 / secs : (double)NAN;
  op->busbw_gbs = op->algbw_gbs * factor;
}

/* NCCL sometimes reports a channel start that belongs to an earlier op (its
 * per-channel GPU ring is read before the GPU wrote this op's entry): seen on
 * NCCL 2.28.9 as GPU starts up to 225 ms before the application even called
 * NCCL, and on CUDA-graph replays. Such a start cannot be used. */
static bool stale_start(rw_comm *c, const rw_op *op) {
  if (op->gpu_start_raw == 0 || !op->have_offset) return false;
  /* A start after the op's own end came from a later op (seen on graph replays). */
  if (op->gpu_end_raw != 0 && op->gpu_start_raw > op->gpu_end_raw) return true;
  int64_t start = op->gpu_start_raw + op->offset, slack = op->error > 0 ? op->error : 0;
  if (!op->graph && op->api_end != 0 && start + slack < op->api_end) return true;
  /* NCCL runs a communicator's kernels in order: a start before the previous
   * op's end is stale, unless both ops ran in one kernel (coalesced: they share
   * the start). This also catches eager ops queued behind compute, whose stale
   * start (the previous op's) falls after their own API call: seen in a DDP job
   * that also replayed a CUDA graph, as 10 ms "durations" of 33 MB all-reduces. */
  return op->gpu_start_raw + 2000 < c->last_gpu_end_raw &&
         op->gpu_start_raw != c->last_gpu_start_raw;
}

static void derive(rw_comm *c, const rw_clock *clk, rw_op *op) {
  op->have_offset = clk->valid;
  op->offset = clk->offset;
  op->error = clk->error;
  op->gpu_start_stale = stale_start(c, op);
  if (op->gpu_start_stale) op->gpu_timed = false;
  else if (op->gpu_start_raw > c->last_gpu_start_raw) c->last_gpu_start_raw = op->gpu_start_raw;
  if (op->gpu_end_raw > c->last_gpu_end_raw) c->last_gpu_end_raw = op->gpu_end_raw;
  if (op->gpu_timed) op->exec_ns = op->gpu_end_raw - op->gpu_start_raw;
  else op->exec_ns = op->enq_end > op->enq_start ? op->enq_end - op->enq_start : 0;
  bandwidth(c, op);
}

static void note_completion(rw_comm *c, const rw_op *op) {
  if (op->kind == RW_OP_COLL && op->func < RW_NCOLL_FUNCS) {
    if ((int64_t)op->seq > LD(&c->seq_completed[op->func]))
      ST(&c->seq_completed[op->func], (int64_t)op->seq);
  } else if (op->kind == RW_OP_P2P) {
    atomic_fetch_add_explicit(op->func == RW_FUNC_RECV ? &c->p2p_recv_done : &c->p2p_send_done,
                              1, memory_order_relaxed);
  }
  if (op->gpu_timed && op->enq_start > c->last_gpu_done_enq_ns)
    c->last_gpu_done_enq_ns = op->enq_start;
}

/* Slots written in this pass, given back to the pool in one chain. */
static uint32_t chain_first = UINT32_MAX, chain_last;

static void chain_add(uint32_t index) {
  rw_pool_retire(&rw_g.pool, index);
  if (chain_first != UINT32_MAX) ST(&rw_g.pool.slots[index].next, chain_first + 1);
  else chain_last = index;
  chain_first = index;
}

void rw_release_written(void) {
  if (chain_first == UINT32_MAX) return;
  rw_pool_release_chain(&rw_g.pool, chain_first, chain_last);
  chain_first = UINT32_MAX;
}

/* Formats one slot and queues it for release. `complete` is false for ops
 * flushed at teardown or exit before NCCL reported their end. */
static void write_slot(uint32_t index, bool complete, int64_t now) {
  rw_slot *s = &rw_g.pool.slots[index];
  rw_comm *c = rw_comm_at(LD(&s->comm));
  if (c != NULL) {
    rw_op op;
    snapshot(s, &op);
    bool expected = (LD(&s->flags) & RW_F_GPU_EXPECTED) != 0;
    op.complete = complete && (!expected || op.ch_stopped >= op.nchannels);
    rw_clock *clk = rw_clock_of(c);
    rw_clock_fold(clk, s, op.graph, op.api_end, op.gpu_start_raw);
    rw_clock_update(clk);
    derive(c, clk, &op);
    if (complete) note_completion(c, &op);
    rw_json_op(rw_writer_op_buf(), c, &op, now);
    if (rw_g.cfg.prom) rw_prom_account(c, &op);
    atomic_fetch_add_explicit(&rw_g.stats.records_written, 1, memory_order_relaxed);
  }
  chain_add(index);
}

static uint32_t collect_list(uint32_t head, uint32_t *scratch, uint32_t n) {
  for (uint32_t i = head; i != 0 && n < rw_g.pool.nslots; i = LD(&rw_g.pool.slots[i - 1].next))
    scratch[n++] = i - 1;
  return n;
}

static int by_enqueue(const void *a, const void *b) {
  int64_t x = LD(&rw_g.pool.slots[*(const uint32_t *)a].enq_start);
  int64_t y = LD(&rw_g.pool.slots[*(const uint32_t *)b].enq_start);
  return (x > y) - (x < y);
}

/* Takes every thread's completed stack and writes the ops in enqueue order,
 * which per communicator is the order they ran on its stream (stale-start
 * detection for graph replays relies on it). */
void rw_drain_completed(uint32_t *scratch, int64_t now) {
  uint32_t n = 0;
  for (rw_thread *t = rw_thread_first(); t != NULL; t = t->next)
    n = collect_list(atomic_exchange_explicit(&t->done_head, 0u, memory_order_acquire), scratch,
                     n);
  qsort(scratch, n, sizeof(*scratch), by_enqueue);
  for (uint32_t i = 0; i < n; i++) write_slot(scratch[i], true, now);
  rw_release_written();
}

static bool force_done(rw_slot *s) {
  uint32_t st = atomic_load_explicit(&s->state, memory_order_acquire);
  while (st == RW_SLOT_ENQUEUING || st == RW_SLOT_ENQUEUED)
    if (atomic_compare_exchange_weak_explicit(&s->state, &st, RW_SLOT_DONE, memory_order_acq_rel,
                                              memory_order_acquire))
      return true;
  return false;
}

void rw_flush_inflight(rw_comm *c, int64_t now) {
  for (uint32_t i = 0; i < rw_g.pool.nslots; i++) {
    rw_slot *s = &rw_g.pool.slots[i];
    if (LD(&s->comm) != c->index || !force_done(s)) continue;
    write_slot(i, false, now);
  }
  rw_release_written();
}

/* An op can wait for channel events that never come: with sampled GPU timing
 * its group may have run with KernelCh off (the mask changed between our
 * decision and NCCL's read), and NCCL may skip or lose channels (aborts,
 * overwritten GPU rings, paths it reports no channels for). Ops on one
 * communicator finish in order, so once a later op has finished on the GPU,
 * this one has too: write it (marked incomplete if channels are missing)
 * rather than hold its slot. A hung op is never superseded, so it stays. */
void rw_sweep_superseded(int64_t now) {
  for (uint32_t i = 0; i < rw_g.pool.nslots; i++) {
    rw_slot *s = &rw_g.pool.slots[i];
    if (atomic_load_explicit(&s->state, memory_order_acquire) != RW_SLOT_ENQUEUED) continue;
    rw_comm *c = rw_comm_at(LD(&s->comm));
    int64_t enq_end = rw_ticks_to_ns(LD(&s->enq_end));
    if (c == NULL || enq_end == 0 || now - enq_end < 2000000000LL) continue;
    if (c->last_gpu_done_enq_ns > enq_end) rw_complete(i, s);
  }
}

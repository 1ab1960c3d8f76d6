/*
 * The hot path: NCCL's startEvent / stopEvent / recordEventState for the event
 * types rankwatch records. Each call decodes a handle, touches one slot with
 * relaxed atomics and at most one CAS, and reads the clock at most once. No
 * locks, no allocation, no I/O, no formatting.
 */
#include <string.h>

#include "handle.h"
#include "rw.h"

/* ---- CollApi / P2pApi: host time of the application's NCCL call ---- */

typedef struct {
  _Atomic uint32_t tag; /* 0 while being rewritten */
  _Atomic int64_t start, end;
} rw_api_entry;

static rw_api_entry api_ring[RW_API_RING];

static void *api_start(unsigned kind, bool graph_captured) {
  /* Graph-captured calls are only recorded, not run: their times mean nothing
   * for the replays, so the handle just carries the graph bit. */
  rw_thread *t;
  if (graph_captured || (t = rw_thread_self()) == NULL)
    return rw_handle_encode(kind, UINT32_MAX, 0, 0, 1);
  uint32_t tag, idx = rw_thread_api_index(t, &tag);
  rw_api_entry *e = &api_ring[idx];
  /* Only this thread writes its region; readers re-check the tag. */
  atomic_store_explicit(&e->tag, 0u, memory_order_relaxed);
  ST(&e->start, rw_ticks());
  ST(&e->end, 0);
  atomic_store_explicit(&e->tag, tag, memory_order_release);
  return rw_handle_encode(kind, idx, tag, 0, 0);
}

static void api_stop(const rw_handle *h) {
  if (h->graph || h->index >= RW_API_RING) return;
  rw_api_entry *e = &api_ring[h->index];
  if (atomic_load_explicit(&e->tag, memory_order_acquire) == h->gen) ST(&e->end, rw_ticks());
}

/* Reads the API times behind a Coll/P2p parent handle (0 when unknown) and
 * returns whether the parent was a graph-captured call, i.e. this is a replay. */
static bool parent_api_times(void *parent, int64_t *start, int64_t *end) {
  rw_handle h;
  *start = *end = 0;
  if (!rw_handle_decode(parent, &h)) return false;
  if (h.kind != RW_H_COLLAPI && h.kind != RW_H_P2PAPI) return false;
  if (h.graph) return true;
  if (h.index >= RW_API_RING) return false;
  rw_api_entry *e = &api_ring[h.index];
  uint32_t t1 = atomic_load_explicit(&e->tag, memory_order_acquire);
  int64_t s = LD(&e->start), en = LD(&e->end);
  if (t1 != h.gen || atomic_load_explicit(&e->tag, memory_order_acquire) != h.gen) return false;
  *start = s;
  *end = en;
  return false;
}

/* ---- helpers ---- */

static void store_max(_Atomic int64_t *p, int64_t v) {
  int64_t cur = LD(p);
  while (v > cur && !atomic_compare_exchange_weak_explicit(p, &cur, v, memory_order_relaxed,
                                                           memory_order_relaxed)) {
  }
}

static void store_min(_Atomic int64_t *p, int64_t v) {
  int64_t cur = LD(p);
  while (v < cur && !atomic_compare_exchange_weak_explicit(p, &cur, v, memory_order_relaxed,
                                                           memory_order_relaxed)) {
  }
}

static rw_slot *slot_of(const rw_handle *h) {
  if (h->index >= rw_g.pool.nslots) return NULL;
  rw_slot *s = &rw_g.pool.slots[h->index];
  if ((LD(&s->gen) & 0xffffff) != h->gen) return NULL;
  uint32_t st = atomic_load_explicit(&s->state, memory_order_acquire);
  return st == RW_SLOT_FREE ? NULL : s;
}

static void count_stale(void) {
  atomic_fetch_add_explicit(&rw_g.stats.stale_handles, 1, memory_order_relaxed);
}

void rw_complete(uint32_t index, rw_slot *s) {
  uint32_t st = atomic_load_explicit(&s->state, memory_order_acquire);
  while (st == RW_SLOT_ENQUEUING || st == RW_SLOT_ENQUEUED) {
    if (atomic_compare_exchange_weak_explicit(&s->state, &st, RW_SLOT_DONE, memory_order_acq_rel,
                                              memory_order_acquire)) {
      rw_thread *t = rw_thread_self();
      if (t != NULL) rw_thread_push_done(t, index);
      else rw_pool_retire(&rw_g.pool, index); /* cannot queue it: lose the record, not the slot */
      return;
    }
  }
}

static void release_pending(uint32_t index, rw_slot *s) {
  if (atomic_fetch_sub_explicit(&s->pending, 1, memory_order_acq_rel) == 1) rw_complete(index, s);
}

/* ---- Coll / P2p start: take a slot and fill it ---- */

typedef struct {
  uint8_t kind, func, dtype, algo, proto, nchannels;
  int32_t root_or_peer;
  uint64_t seq, p2p_sn, count;
} rw_op_fields;

static rw_slot *take_slot(uint32_t *index) {
  rw_thread *t = rw_thread_self();
  rw_slot *s = t != NULL ? rw_thread_take_slot(t, index) : NULL;
  if (s == NULL) {
    atomic_fetch_add_explicit(&rw_g.stats.dropped_pool_full, 1, memory_order_relaxed);
    rw_warn_once(RW_WARN_POOL, "all %u op slots in use: ops are being dropped and counted "
                 "(raise RANKWATCH_POOL_SLOTS)", rw_g.pool.nslots);
  }
  return s;
}

static bool below_min_size(const rw_op_fields *f) {
  if (rw_g.cfg.min_size_bytes == 0) return false;
  int size = rw_dtype_size(f->dtype);
  if (size == 0 || f->count * (uint64_t)size >= rw_g.cfg.min_size_bytes) return false;
  atomic_fetch_add_explicit(&rw_g.stats.filtered_min_size, 1, memory_order_relaxed);
  return true;
}

static void start_op(rw_comm *c, void **eHandle, void *parent, const rw_op_fields *f,
                     int64_t now) {
  ST(&c->last_enqueue, now);
  if (below_min_size(f)) return;
  uint32_t index;
  rw_slot *s = take_slot(&index);
  if (s == NULL) return;
  int64_t api_s, api_e;
  bool graph = parent_api_times(parent, &api_s, &api_e);
  /* NCCL reports no channel events for a P2P op with itself (seen on NCCL
   * 2.28.9: all_to_all's self send/recv), though it plans a channel for it. */
  bool self = f->kind == RW_OP_P2P && f->root_or_peer == c->rank;
  bool gpu = LD(&rw_g.kch_on) && f->nchannels > 0 && !self;
  ST(&s->comm, c->index);
  ST(&s->kind, f->kind);
  ST(&s->func, f->func);
  ST(&s->dtype, f->dtype);
  ST(&s->algo, f->algo);
  ST(&s->proto, f->proto);
  ST(&s->nchannels, f->nchannels);
  ST(&s->root_or_peer, f->root_or_peer);
  ST(&s->seq, f->seq);
  ST(&s->p2p_sn, f->p2p_sn);
  ST(&s->count, f->count);
  ST(&s->api_start, api_s);
  ST(&s->api_end, api_e);
  ST(&s->enq_start, now);
  ST(&s->enq_end, 0);
  ST(&s->gpu_start_raw, INT64_MAX);
  ST(&s->gpu_end_raw, INT64_MIN);
  ST(&s->kch_report, 0);
  ST(&s->ch_started, 0);
  ST(&s->ch_stopped, 0);
  ST(&s->ch_mask, 0);
  ST(&s->flags, (graph ? RW_F_GRAPH : 0u) | (gpu ? RW_F_GPU_EXPECTED : 0u));
  ST(&s->pending, 1 + (gpu ? (int32_t)f->nchannels : 0));
  uint32_t gen = LD(&s->gen);
  atomic_store_explicit(&s->state, RW_SLOT_ENQUEUING, memory_order_release);
  *eHandle = rw_handle_encode(RW_H_OP, index, gen, 0, 0);
}

static void start_coll(rw_comm *c, void **eHandle, void *parent, const rw_abi_coll_t *d) {
  rw_op_fields f = {.kind = RW_OP_COLL,
                    .func = rw_name_id(RW_NAME_FUNC, d->func),
                    .dtype = rw_name_id(RW_NAME_DTYPE, d->datatype),
                    .algo = rw_name_id(RW_NAME_ALGO, d->algo),
                    .proto = rw_name_id(RW_NAME_PROTO, d->proto),
                    .nchannels = d->nChannels,
                    .root_or_peer = d->root,
                    .seq = d->seqNumber,
                    .count = d->count};
  /* One thread enqueues on a communicator at a time (NCCL requires it), so a
   * plain compare-and-store is enough here. */
  if (f.func < RW_NCOLL_FUNCS && (int64_t)f.seq > LD(&c->seq_enqueued[f.func]))
    ST(&c->seq_enqueued[f.func], (int64_t)f.seq);
  start_op(c, eHandle, parent, &f, rw_ticks());
}

static void start_p2p(rw_comm *c, void **eHandle, void *parent, const rw_abi_p2p_t *d) {
  if (!rw_g.cfg.p2p) return;
  rw_op_fields f = {.kind = RW_OP_P2P,
                    .func = rw_name_id(RW_NAME_FUNC, d->func),
                    .dtype = rw_name_id(RW_NAME_DTYPE, d->datatype),
                    .nchannels = d->nChannels,
                    .root_or_peer = d->peer,
                    .count = d->count};
  bool recv = f.func == RW_FUNC_RECV;
  f.p2p_sn = atomic_fetch_add_explicit(&c->p2p_sn, 1, memory_order_relaxed);
  if (d->peer >= 0 && (uint32_t)d->peer < c->npeer_seq)
    f.seq = atomic_fetch_add_explicit(&c->peer_seq[2 * (uint32_t)d->peer + recv], 1,
                                      memory_order_relaxed);
  atomic_fetch_add_explicit(recv ? &c->p2p_recv_enq : &c->p2p_send_enq, 1, memory_order_relaxed);
  start_op(c, eHandle, parent, &f, rw_ticks());
}

/* ---- KernelCh: GPU start/stop of one channel, from the proxy thread ---- */

static void start_kernel_ch(void **eHandle, void *parent, const rw_abi_kernel_ch_t *d) {
  rw_handle h;
  rw_slot *s;
  if (!rw_handle_decode(parent, &h) || h.kind != RW_H_OP || (s = slot_of(&h)) == NULL) {
    if (parent != NULL) count_stale(); /* NULL: an op we chose not to record */
    return;
  }
  int64_t t = (int64_t)d->pTimer;
  store_min(&s->gpu_start_raw, t);
  if (rw_g.cfg.verbose)
    atomic_fetch_or_explicit(&s->ch_mask, 1ULL << (d->channelId & 63), memory_order_relaxed);
  /* The op's first channel does the per-op work: one clock read per op on the
   * proxy thread (the clock bound needs only the earliest report). */
  if (atomic_fetch_add_explicit(&s->ch_started, 1, memory_order_relaxed) == 0) {
    int64_t now = rw_ticks();
    ST(&s->kch_ptimer, t);
    ST(&s->kch_report, now);
    rw_comm *c = rw_comm_at(LD(&s->comm));
    uint8_t func = LD(&s->func);
    if (c != NULL) {
      ST(&c->last_gpu, now);
      if (LD(&s->kind) == RW_OP_COLL && func < RW_NCOLL_FUNCS)
        store_max(&c->seq_started[func], (int64_t)LD(&s->seq));
    }
  }
  *eHandle = rw_handle_encode(RW_H_KCH, h.index, h.gen, d->channelId, 0);
}

static void record_kernel_ch_stop(const rw_handle *h, const ncclProfilerEventStateArgs_v4_t *a) {
  rw_slot *s = slot_of(h);
  if (s == NULL || a == NULL) return;
  store_max(&s->gpu_end_raw, (int64_t)a->kernelCh.pTimer);
}

static void stop_kernel_ch(const rw_handle *h) {
  rw_slot *s = slot_of(h);
  if (s == NULL) {
    count_stale();
    return;
  }
  atomic_fetch_add_explicit(&s->ch_stopped, 1, memory_order_relaxed);
  /* Only channels we counted on hold the op open: with sampled timing or
   * CollNet (nChannels 0) channel events can come for an op that expected none. */
  if (LD(&s->flags) & RW_F_GPU_EXPECTED) release_pending(h->index, s);
}

static void stop_op(const rw_handle *h) {
  rw_slot *s = slot_of(h);
  if (s == NULL) {
    count_stale();
    return;
  }
  ST(&s->enq_end, rw_ticks());
  uint32_t st = RW_SLOT_ENQUEUING;
  atomic_compare_exchange_strong_explicit(&s->state, &st, RW_SLOT_ENQUEUED, memory_order_acq_rel,
                                          memory_order_relaxed);
  release_pending(h->index, s);
}

/* ---- entry points used by every ABI adapter ---- */

void rw_start_event(void *context, void **eHandle, uint64_t type, void *parent, const void *u) {
  if (eHandle == NULL) return;
  *eHandle = NULL; /* always written: NCCL keeps whatever we leave here */
  if (!rw_g.ready || u == NULL) return;
  switch (type) {
  case ncclProfileCollApi:
    *eHandle = api_start(RW_H_COLLAPI, ((const rw_abi_coll_api_t *)u)->graphCaptured);
    return;
  case ncclProfileP2pApi:
    *eHandle = api_start(RW_H_P2PAPI, ((const rw_abi_p2p_api_t *)u)->graphCaptured);
    return;
  case ncclProfileKernelCh:
    start_kernel_ch(eHandle, parent, (const rw_abi_kernel_ch_t *)u);
    return;
  case ncclProfileColl:
  case ncclProfileP2p: {
    rw_comm *c = rw_comm_from_context(context);
    if (c == NULL || LD(&c->finalizing)) return;
    if (type == ncclProfileColl) start_coll(c, eHandle, parent, (const rw_abi_coll_t *)u);
    else start_p2p(c, eHandle, parent, (const rw_abi_p2p_t *)u);
    return;
  }
  default:
    return; /* Group, GroupApi, proxy, CE and unknown types: not needed, never touched */
  }
}

void rw_stop_event(void *eHandle) {
  rw_handle h;
  if (eHandle == NULL || !rw_g.ready) return;
  if (!rw_handle_decode(eHandle, &h)) {
    count_stale();
    return;
  }
  switch (h.kind) {
  case RW_H_OP: stop_op(&h); return;
  case RW_H_KCH: stop_kernel_ch(&h); return;
  case RW_H_COLLAPI:
  case RW_H_P2PAPI: api_stop(&h); return;
  default: count_stale(); return;
  }
}

void rw_record_state(void *eHandle, int state, const void *args) {
  rw_handle h;
  if (eHandle == NULL || !rw_g.ready || !rw_handle_decode(eHandle, &h)) return;
  if (h.kind == RW_H_KCH && state == ncclProfilerKernelChStop)
    record_kernel_ch_stop(&h, (const ncclProfilerEventStateArgs_v4_t *)args);
}

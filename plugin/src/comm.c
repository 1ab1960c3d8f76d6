/*
 * The communicator table. NCCL gets an encoded (index, generation) value as its
 * context, never a pointer, so a stale or foreign context (PXN proxy ops carry
 * another process's) is recognised without dereferencing anything.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rw.h"

#define CTX_MAGIC 0xA5ULL
static _Atomic(rw_comm *) comms[RW_MAX_COMMS];
static _Atomic uint32_t next_gen = 1;

static void *encode_context(uint32_t index, uint32_t gen) {
  return (void *)(uintptr_t)(CTX_MAGIC << 56 | (uint64_t)(gen & 0xffffff) << 24 | (index + 1));
}

rw_comm *rw_comm_from_context(void *context) {
  uint64_t v = (uint64_t)(uintptr_t)context;
  if ((v >> 56) != CTX_MAGIC) return NULL;
  uint32_t index = (uint32_t)(v & 0xffffff);
  if (index == 0 || index > RW_MAX_COMMS) return NULL;
  rw_comm *c = atomic_load_explicit(&comms[index - 1], memory_order_acquire);
  if (c == NULL || (c->gen & 0xffffff) != ((v >> 24) & 0xffffff)) return NULL;
  return c;
}

rw_comm *rw_comm_at(uint32_t index) {
  return index < RW_MAX_COMMS ? atomic_load_explicit(&comms[index], memory_order_acquire) : NULL;
}

static void init_comm(rw_comm *c, uint64_t comm_id, const char *name, int nnodes, int nranks,
                      int rank, int abi) {
  c->comm_id = comm_id;
  c->rank = rank;
  c->nranks = nranks;
  c->nnodes = nnodes;
  c->abi = abi;
  c->device = -1;
  /* commName dies with NCCL's communicator: copy it. */
  snprintf(c->name, sizeof c->name, "%s", name && name[0] ? name : "unknown");
  rw_json_quote(c->name_json, sizeof c->name_json, c->name);
  for (int f = 0; f < RW_NCOLL_FUNCS; f++) {
    ST(&c->seq_enqueued[f], -1);
    ST(&c->seq_started[f], -1);
    ST(&c->seq_completed[f], -1);
  }
  ST(&c->last_enqueue, rw_ticks());
  /* Per-peer P2P order: bounded so a huge communicator cannot exhaust memory. */
  uint32_t npeer = nranks > 0 && nranks <= (1 << 20) ? (uint32_t)nranks : 0;
  c->peer_seq = npeer ? calloc(2 * (size_t)npeer, sizeof(*c->peer_seq)) : NULL;
  c->npeer_seq = c->peer_seq ? npeer : 0;
}

void *rw_comm_create(uint64_t comm_id, const char *name, int nnodes, int nranks, int rank,
                     int abi, int device) {
  /* Aligned: the struct keeps thread-owned counters on separate cache lines. */
  size_t size = (sizeof(rw_comm) + 63) / 64 * 64;
  rw_comm *c = aligned_alloc(64, size);
  if (c == NULL) return NULL;
  memset(c, 0, size);
  init_comm(c, comm_id, name, nnodes, nranks, rank, abi);
  c->device = device;
  c->gen = atomic_fetch_add(&next_gen, 1);
  for (uint32_t i = 0; i < RW_MAX_COMMS; i++) {
    rw_comm *expected = NULL;
    c->index = i; /* set before publishing; harmless if the CAS fails */
    if (atomic_compare_exchange_strong(&comms[i], &expected, c)) return encode_context(i, c->gen);
  }
  free(c->peer_seq);
  free(c);
  rw_warn_once(RW_WARN_COMMS, "more than %d live communicators; new ones are not recorded",
               RW_MAX_COMMS);
  return NULL;
}

void rw_comm_free(uint32_t index) {
  if (index >= RW_MAX_COMMS) return;
  rw_comm *c = atomic_exchange(&comms[index], NULL);
  if (c == NULL) return;
  free(c->peer_seq);
  free(c->prom);
  free(c);
}

int64_t rw_comm_last_activity(const rw_comm *c) {
  int64_t e = LD(&c->last_enqueue), g = LD(&c->last_gpu);
  return rw_ticks_to_ns(e > g ? e : g);
}

/*
 * A fixed pool of op slots with a lock-free free list (a Treiber stack whose head
 * carries a tag against ABA). Threads take slots in batches into a private
 * cache (thread.c) and the writer gives them back in chains, so the shared head
 * is touched about once per 32 ops. Nothing here allocates, locks or waits for
 * space: when the pool is empty the op is counted as dropped.
 */
#include <stdlib.h>
#include <string.h>

#include "rw.h"

int rw_pool_init(rw_pool *p, uint32_t nslots) {
  p->slots = aligned_alloc(64, (size_t)nslots * sizeof(rw_slot));
  if (p->slots == NULL) return -1;
  memset(p->slots, 0, (size_t)nslots * sizeof(rw_slot));
  p->nslots = nslots;
  for (uint32_t i = 0; i < nslots; i++) ST(&p->slots[i].next, i + 2 <= nslots ? i + 2 : 0);
  ST(&p->free_head, (uint64_t)1);
  return 0;
}

void rw_pool_destroy(rw_pool *p) {
  free(p->slots);
  p->slots = NULL;
  p->nslots = 0;
}

/* Pops up to `max` slots with one CAS: the head's tag changes on every
 * successful CAS, so a walk over links that changed under us cannot succeed. */
uint32_t rw_pool_take_batch(rw_pool *p, uint32_t *out, uint32_t max) {
  uint64_t head = atomic_load_explicit(&p->free_head, memory_order_acquire);
  for (;;) {
    uint32_t n = 0, top = (uint32_t)head;
    while (top != 0 && n < max) {
      out[n++] = top - 1;
      top = LD(&p->slots[top - 1].next);
    }
    if (n == 0) return 0;
    uint64_t desired = ((head >> 32) + 1) << 32 | top;
    if (atomic_compare_exchange_weak_explicit(&p->free_head, &head, desired,
                                              memory_order_acq_rel, memory_order_acquire))
      return n;
  }
}

void rw_pool_retire(rw_pool *p, uint32_t index) {
  rw_slot *s = &p->slots[index];
  /* A new generation makes every handle still held by NCCL for this op stale. */
  atomic_fetch_add_explicit(&s->gen, 1, memory_order_relaxed);
  atomic_store_explicit(&s->state, RW_SLOT_FREE, memory_order_release);
}

/* Gives back a chain of retired slots, already linked first -> ... -> last
 * through `next`, with one CAS. */
void rw_pool_release_chain(rw_pool *p, uint32_t first, uint32_t last) {
  uint64_t head = atomic_load_explicit(&p->free_head, memory_order_acquire);
  for (;;) {
    ST(&p->slots[last].next, (uint32_t)head);
    uint64_t desired = ((head >> 32) + 1) << 32 | (first + 1);
    if (atomic_compare_exchange_weak_explicit(&p->free_head, &head, desired,
                                              memory_order_acq_rel, memory_order_acquire))
      return;
  }
}

int64_t rw_pool_count_in_use(rw_pool *p) {
  int64_t n = 0;
  for (uint32_t i = 0; i < p->nslots; i++)
    n += atomic_load_explicit(&p->slots[i].state, memory_order_relaxed) != RW_SLOT_FREE;
  return n;
}

bool rw_pool_refers_to(rw_pool *p, uint32_t comm) {
  for (uint32_t i = 0; i < p->nslots; i++)
    if (atomic_load_explicit(&p->slots[i].state, memory_order_relaxed) != RW_SLOT_FREE &&
        LD(&p->slots[i].comm) == comm)
      return true;
  return false;
}

/*
 * A fixed pool of op slots with a lock-free free list (a Treiber stack whose head
 * carries a tag against ABA) and a lock-free stack of completed slots that the
 * writer empties in one exchange. Taking and completing a slot are each one CAS;
 * nothing on this path allocates, locks or spins waiting for space: when the pool
 * is empty the op is counted as dropped.
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
  ST(&p->done_head, 0u);
  return 0;
}

void rw_pool_destroy(rw_pool *p) {
  free(p->slots);
  p->slots = NULL;
  p->nslots = 0;
}

rw_slot *rw_pool_take(rw_pool *p, uint32_t *index) {
  uint64_t head = atomic_load_explicit(&p->free_head, memory_order_acquire);
  for (;;) {
    uint32_t top = (uint32_t)head;
    if (top == 0) return NULL;
    uint32_t next = LD(&p->slots[top - 1].next);
    uint64_t desired = ((head >> 32) + 1) << 32 | next;
    if (atomic_compare_exchange_weak_explicit(&p->free_head, &head, desired,
                                              memory_order_acq_rel, memory_order_acquire)) {
      *index = top - 1;
      return &p->slots[top - 1];
    }
  }
}

void rw_pool_release(rw_pool *p, uint32_t index) {
  rw_slot *s = &p->slots[index];
  /* A new generation makes every handle still held by NCCL for this op stale. */
  atomic_fetch_add_explicit(&s->gen, 1, memory_order_relaxed);
  atomic_store_explicit(&s->state, RW_SLOT_FREE, memory_order_release);
  uint64_t head = atomic_load_explicit(&p->free_head, memory_order_acquire);
  for (;;) {
    ST(&s->next, (uint32_t)head);
    uint64_t desired = ((head >> 32) + 1) << 32 | (index + 1);
    if (atomic_compare_exchange_weak_explicit(&p->free_head, &head, desired,
                                              memory_order_acq_rel, memory_order_acquire))
      break;
  }
}

void rw_pool_push_done(rw_pool *p, uint32_t index) {
  rw_slot *s = &p->slots[index];
  uint32_t head = atomic_load_explicit(&p->done_head, memory_order_relaxed);
  do {
    ST(&s->next, head);
  } while (!atomic_compare_exchange_weak_explicit(&p->done_head, &head, index + 1,
                                                  memory_order_release, memory_order_relaxed));
}

uint32_t rw_pool_pop_all_done(rw_pool *p) {
  return atomic_exchange_explicit(&p->done_head, 0u, memory_order_acquire);
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

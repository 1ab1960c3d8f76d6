/*
 * Per-thread state for the threads NCCL calls us on (application, CUDA
 * host-callback, proxy). Each keeps a private cache of free slots, its own
 * stack of completed slots for the writer, and its own region of the API
 * timestamp ring, so the hot path shares no cache line with other NCCL
 * threads. Created at a thread's first callback (the only allocation near
 * the hot path, once per thread) and never freed: the registry only grows.
 */
#include <stdlib.h>
#include <string.h>

#include "rw.h"

#define RW_API_REGION 256

/* initial-exec: one instruction instead of a __tls_get_addr call per access.
 * glibc reserves static TLS space for dlopened libraries; 8 bytes fit. */
static _Thread_local rw_thread *self __attribute__((tls_model("initial-exec")));
static _Atomic(rw_thread *) registry;
static _Atomic uint32_t serials;

rw_thread *rw_thread_self(void) {
  rw_thread *t = self;
  if (t != NULL) return t;
  size_t size = (sizeof(rw_thread) + 63) / 64 * 64;
  t = aligned_alloc(64, size);
  if (t == NULL) return NULL;
  memset(t, 0, size);
  uint32_t serial = atomic_fetch_add(&serials, 1);
  t->serial = serial;
  t->api_base = (serial % (RW_API_RING / RW_API_REGION)) * RW_API_REGION;
  rw_thread *head = atomic_load(&registry);
  do {
    t->next = head;
  } while (!atomic_compare_exchange_weak(&registry, &head, t));
  self = t;
  return t;
}

rw_thread *rw_thread_first(void) { return atomic_load_explicit(&registry, memory_order_acquire); }

rw_slot *rw_thread_take_slot(rw_thread *t, uint32_t *index) {
  if (t->ncache == 0) t->ncache = rw_pool_take_batch(&rw_g.pool, t->cache, RW_SLOT_CACHE);
  if (t->ncache == 0) return NULL;
  *index = t->cache[--t->ncache];
  /* The writer touched these slots last: start fetching the next one now. */
  if (t->ncache > 0) {
    const char *next = (const char *)&rw_g.pool.slots[t->cache[t->ncache - 1]];
    __builtin_prefetch(next, 1, 3);
    __builtin_prefetch(next + 64, 1, 3);
  }
  return &rw_g.pool.slots[*index];
}

void rw_thread_push_done(rw_thread *t, uint32_t index) {
  rw_slot *s = &rw_g.pool.slots[index];
  uint32_t head = atomic_load_explicit(&t->done_head, memory_order_relaxed);
  do {
    ST(&s->next, head);
  } while (!atomic_compare_exchange_weak_explicit(&t->done_head, &head, index + 1,
                                                  memory_order_release, memory_order_relaxed));
}

uint32_t rw_thread_api_index(rw_thread *t, uint32_t *tag) {
  uint32_t n = t->api_next++;
  /* Unique per thread and use, so a thread sharing this region (more than
   * RW_API_RING / RW_API_REGION threads) cannot match our entries. */
  *tag = ((t->serial * 2654435761u) ^ (n / RW_API_REGION)) & 0xffffff;
  if (*tag == 0) *tag = 1;
  return t->api_base + (n % RW_API_REGION);
}

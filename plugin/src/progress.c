/*
 * Progress records: per communicator, the last sequence numbers enqueued,
 * started and completed per collective, and the oldest in-flight ops with
 * their age and state. This is what hang detection reads, so it is written
 * every interval whether or not NCCL makes progress.
 */
#include <stdlib.h>

#include "record.h"
#include "rw.h"
#include "writer_internal.h"

typedef struct {
  uint32_t comm;
  rw_inflight op;
} rw_inflight_entry;

static rw_inflight_entry *scratch;

int rw_inflight_init(void) {
  scratch = malloc(sizeof(*scratch) * rw_g.pool.nslots);
  return scratch ? 0 : -1;
}

static const char *inflight_state(uint32_t st, uint16_t started) {
  if (st == RW_SLOT_ENQUEUING) return "enqueuing";
  return started ? "gpu_started" : "enqueued";
}

static bool read_inflight(const rw_slot *s, rw_inflight_entry *e) {
  uint32_t gen = LD(&s->gen);
  uint32_t st = atomic_load_explicit(&s->state, memory_order_acquire);
  if (st != RW_SLOT_ENQUEUING && st != RW_SLOT_ENQUEUED) return false;
  e->comm = LD(&s->comm);
  e->op.kind = LD(&s->kind);
  e->op.func = LD(&s->func);
  e->op.seq = LD(&s->seq);
  e->op.peer = LD(&s->root_or_peer);
  int64_t api = LD(&s->api_start);
  e->op.arrival_ns = rw_ticks_to_ns(api ? api : LD(&s->enq_start));
  e->op.ch_started = LD(&s->ch_started);
  e->op.ch_stopped = LD(&s->ch_stopped);
  e->op.state = inflight_state(st, e->op.ch_started);
  return LD(&s->gen) == gen; /* the slot was not recycled while we read it */
}

static int by_comm_then_age(const void *a, const void *b) {
  const rw_inflight_entry *x = a, *y = b;
  if (x->comm != y->comm) return x->comm < y->comm ? -1 : 1;
  return (x->op.arrival_ns > y->op.arrival_ns) - (x->op.arrival_ns < y->op.arrival_ns);
}

/* One pass over the pool, sorted so each communicator's ops are contiguous. */
static size_t collect_inflight(void) {
  size_t n = 0;
  for (uint32_t i = 0; i < rw_g.pool.nslots; i++)
    if (read_inflight(&rw_g.pool.slots[i], &scratch[n])) n++;
  qsort(scratch, n, sizeof(*scratch), by_comm_then_age);
  return n;
}

static void write_progress(rw_comm *c, int64_t now, const char *reason, size_t n) {
  size_t first = 0, count = 0;
  while (first < n && scratch[first].comm < c->index) first++;
  while (first + count < n && scratch[first + count].comm == c->index) count++;
  c->inflight = (int64_t)count;
  rw_inflight ops[RW_MAX_INFLIGHT_LISTED];
  size_t listed = count < RW_MAX_INFLIGHT_LISTED ? count : RW_MAX_INFLIGHT_LISTED;
  for (size_t i = 0; i < listed; i++) ops[i] = scratch[first + i].op;
  rw_json_progress(rw_writer_state_buf(), c, now, reason, ops, listed, count);
}

void rw_write_comm_state(rw_comm *c, int64_t now, const char *reason) {
  size_t n = collect_inflight();
  write_progress(c, now, reason, n);
  rw_clock_update(rw_clock_of(c));
  rw_json_clock(rw_writer_state_buf(), c, now);
}

/* Every interval: progress and clock for each live communicator, then a new
 * clock window (clock.c says why). */
void rw_write_all_progress(int64_t now, const char *reason) {
  size_t n = collect_inflight();
  for (uint32_t i = 0; i < RW_MAX_COMMS; i++) {
    rw_comm *c = rw_comm_at(i);
    if (c == NULL || LD(&c->finalizing) != 0) continue;
    write_progress(c, now, reason, n);
    rw_clock_update(rw_clock_of(c));
    rw_json_clock(rw_writer_state_buf(), c, now);
  }
  rw_clock_roll(now);
}

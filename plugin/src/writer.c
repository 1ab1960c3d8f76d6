/*
 * The writer thread: everything slow happens here, never on NCCL's threads.
 * Every drain period it writes completed ops; every interval it writes progress,
 * clock and stats records (so they keep coming while the job is hung); it flushes
 * communicators at finalize and everything at process exit.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "record.h"
#include "rw.h"
#include "sink.h"
#include "writer_internal.h"

static pthread_t thread;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static _Atomic bool running;
static bool stop_requested, exited;
static const char *stop_reason = "exit";

static int op_fd = -1, state_fd = -1;
static bool output_ok;
static rw_buf op_buf, state_buf;
static int64_t next_interval_ns;
static uint32_t *drain_scratch;
static bool streaming; /* RANKWATCH_COLLECTOR is set: lines are teed to sink.c */

/* At exit, how long the stream may take to send what is queued (before the last
 * stats record, then that record too): bounded, so exit never hangs on a
 * collector. */
#define STREAM_EXIT_NS 150000000LL
#define STREAM_EXIT_LAST_NS 50000000LL

/* ---- output ---- */

static int open_output(const char *suffix) {
  char path[RW_PATH_MAX + 512];
  snprintf(path, sizeof path, "%s/%s-pid%d%s", rw_g.cfg.dump_dir, rw_g.cfg.hostname, rw_g.pid,
           suffix);
  return open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static void write_all(int fd, rw_buf *b) {
  size_t off = 0;
  /* The buffer holds whole lines: the stream gets the same bytes as the file,
   * even after a write error has turned file output off. */
  if (streaming && b->len > 0) rw_sink_put(b->p, b->len);
  while (output_ok && off < b->len) {
    ssize_t n = write(fd, b->p + off, b->len - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      atomic_fetch_add(&rw_g.stats.write_errors, 1);
      rw_warn_once(RW_WARN_WRITE, "writing records to %s failed (%s); output is off from now, "
                   "records already written are intact", rw_g.cfg.dump_dir,
                   n < 0 ? strerror(errno) : "no space");
      output_ok = false;
      break;
    }
    off += (size_t)n;
    atomic_fetch_add_explicit(&rw_g.stats.bytes_written, (uint64_t)n, memory_order_relaxed);
  }
  b->len = 0;
}

void rw_writer_flush_buffers(void) {
  write_all(op_fd, &op_buf);
  write_all(state_fd, &state_buf);
}

rw_buf *rw_writer_op_buf(void) {
  if (op_buf.len > (1 << 20)) write_all(op_fd, &op_buf);
  return &op_buf;
}

rw_buf *rw_writer_state_buf(void) { return &state_buf; }

/* ---- the loop ---- */

static void announce_comms(int64_t now) {
  for (uint32_t i = 0; i < RW_MAX_COMMS; i++) {
    rw_comm *c = rw_comm_at(i);
    if (c == NULL || c->announced) continue;
    c->announced = true;
    rw_json_comm(&state_buf, c, now);
  }
}

static void finish_finalized(int64_t now) {
  bool any = false;
  for (uint32_t i = 0; i < RW_MAX_COMMS; i++) {
    rw_comm *c = rw_comm_at(i);
    if (c == NULL) continue;
    int f = LD(&c->finalizing);
    if (f == 1) {
      rw_drain_completed(drain_scratch, now);
      rw_write_comm_state(c, now, "finalize");
      rw_flush_inflight(c, now);
      c->flushed_at_ns = now;
      ST(&c->finalizing, 2);
      any = true;
    } else if (f == 2 && now - c->flushed_at_ns > 2000000000LL && !rw_pool_refers_to(&rw_g.pool, i)) {
      /* A grace period, in case a straggling callback still holds the pointer. */
      rw_comm_free(i);
    }
  }
  if (any) rw_writer_flush_buffers();
}

static void on_interval(int64_t now) {
  rw_sweep_superseded(now);
  rw_drain_completed(drain_scratch, now);
  rw_write_all_progress(now, "interval");
  rw_json_stats(&state_buf, now, "interval");
  if (rw_g.cfg.prom) rw_prom_write(now);
}

static int64_t next_wake(int64_t now) {
  int64_t wake = now + rw_g.cfg.drain_ns;
  if (next_interval_ns < wake) wake = next_interval_ns;
  if (rw_g.cfg.gpu_timing == RW_GPU_SAMPLED) {
    int64_t p = rw_g.cfg.sample_period_ns, w = rw_g.cfg.sample_window_ns, t = now % p;
    int64_t edge = t < w ? now - t + w : now - t + p;
    if (edge < wake) wake = edge;
  }
  return wake;
}

static void one_pass(void) {
  rw_ticks_calibrate(); /* before converting anything written since the last pass */
  int64_t now = rw_now_ns();
  rw_writer_apply_mask(now);
  announce_comms(now);
  rw_drain_completed(drain_scratch, now);
  finish_finalized(now);
  if (now >= next_interval_ns) {
    on_interval(now);
    next_interval_ns = now + rw_g.cfg.interval_ns;
  }
  rw_writer_flush_buffers();
  if (streaming) rw_sink_pump();
}

static void final_pass(void) {
  rw_ticks_calibrate();
  int64_t now = rw_now_ns();
  announce_comms(now);
  rw_drain_completed(drain_scratch, now);
  for (uint32_t i = 0; i < RW_MAX_COMMS; i++) {
    rw_comm *c = rw_comm_at(i);
    if (c == NULL || LD(&c->finalizing) == 2) continue;
    rw_write_comm_state(c, now, stop_reason);
    rw_flush_inflight(c, now);
  }
  if (streaming) {
    /* Send what is queued, then count what could not go as dropped, so the
     * last stats record accounts for every line before it. */
    rw_writer_flush_buffers();
    rw_sink_drain(now + STREAM_EXIT_NS);
    rw_sink_abandon();
  }
  rw_json_stats(&state_buf, now, stop_reason);
  if (rw_g.cfg.prom) rw_prom_write(now);
  rw_writer_flush_buffers();
  if (streaming) {
    rw_sink_drain(rw_now_ns() + STREAM_EXIT_LAST_NS);
    rw_sink_close();
    streaming = false;
  }
}

static void *writer_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  while (!stop_requested) {
    pthread_mutex_unlock(&mu);
    one_pass();
    pthread_mutex_lock(&mu);
    pthread_cond_broadcast(&done_cv);
    int64_t wake = next_wake(rw_now_ns());
    struct timespec ts = {.tv_sec = wake / 1000000000LL, .tv_nsec = wake % 1000000000LL};
    if (!stop_requested) pthread_cond_timedwait(&wake_cv, &mu, &ts);
  }
  pthread_mutex_unlock(&mu);
  final_pass();
  pthread_mutex_lock(&mu);
  exited = true;
  pthread_cond_broadcast(&done_cv);
  pthread_mutex_unlock(&mu);
  return NULL;
}

int rw_writer_start(void) {
  op_fd = open_output(".log");
  state_fd = open_output(".rwstate.jsonl");
  drain_scratch = malloc(sizeof(uint32_t) * rw_g.pool.nslots);
  if (op_fd < 0 || state_fd < 0 || drain_scratch == NULL || !rw_buf_init(&op_buf, 1 << 21) ||
      !rw_buf_init(&state_buf, 1 << 18) || rw_inflight_init() != 0) {
    rw_warn_once(RW_WARN_DIR, "cannot open record files in '%s' (%s)", rw_g.cfg.dump_dir,
                 strerror(errno));
    return -1;
  }
  output_ok = true;
  streaming = rw_g.cfg.stream != RW_STREAM_OFF && rw_sink_init();
  next_interval_ns = rw_now_ns() + rw_g.cfg.interval_ns;
  /* The writer must never run the application's signal handlers. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&thread, NULL, writer_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) return -1;
  pthread_setname_np(thread, "rankwatch-wr");
  running = true;
  return 0;
}

static struct timespec deadline_in(int64_t ns) {
  int64_t t = rw_now_ns() + ns;
  return (struct timespec){.tv_sec = t / 1000000000LL, .tv_nsec = t % 1000000000LL};
}

/* Called by finalize on NCCL's thread: waits (bounded) until the writer has
 * written everything of this communicator. */
void rw_writer_flush_comm(uint32_t comm_index) {
  rw_comm *c = rw_comm_at(comm_index);
  if (c == NULL || !running) return;
  struct timespec deadline = deadline_in(3000000000LL);
  pthread_mutex_lock(&mu);
  pthread_cond_signal(&wake_cv);
  while (LD(&c->finalizing) != 2 && !exited)
    if (pthread_cond_timedwait(&done_cv, &mu, &deadline) == ETIMEDOUT) break;
  pthread_mutex_unlock(&mu);
}

void rw_writer_stop(const char *reason) {
  if (!running) return;
  struct timespec deadline = deadline_in(3000000000LL);
  pthread_mutex_lock(&mu);
  stop_reason = reason;
  stop_requested = true;
  pthread_cond_signal(&wake_cv);
  while (!exited)
    if (pthread_cond_timedwait(&done_cv, &mu, &deadline) == ETIMEDOUT) break;
  bool done = exited;
  pthread_mutex_unlock(&mu);
  if (done) pthread_join(thread, NULL);
  running = false;
}

void rw_writer_apply_mask(int64_t now) {
  int *mask = atomic_load_explicit(&rw_g.mask_ptr, memory_order_acquire);
  if (mask == NULL) return;
  bool kch = rw_g.cfg.gpu_timing == RW_GPU_ON ||
             (rw_g.cfg.gpu_timing == RW_GPU_SAMPLED &&
              now % rw_g.cfg.sample_period_ns < rw_g.cfg.sample_window_ns);
  ST(&rw_g.kch_on, kch);
  __atomic_store_n(mask, rw_g.base_mask | (kch ? ncclProfileKernelCh : 0), __ATOMIC_RELAXED);
}

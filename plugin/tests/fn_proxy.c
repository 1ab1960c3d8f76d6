/*
 * fake_nccl: the simulated GPU and the communicator's proxy thread.
 *
 * Each plan goes through a FIFO (one CUDA stream per communicator). The GPU
 * start is the host launch time plus a launch latency, or the end of the
 * previous kernel; the end is start plus a transfer time, or, in a multi-rank
 * job, the latest start over all ranks plus the transfer (a collective cannot
 * finish before its last rank arrives). The proxy thread reports what it
 * "observes" a little after it happens, as NCCL's profiler proxy does:
 * KernelCh start with the GPU start timer, then record(KernelChStop, GPU end)
 * immediately followed by stop. Within a plan all channel starts come first,
 * then the record/stop pairs, and a Recv is reported before its Send (as in
 * the captures).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_nccl.h"

#define MAX_INFLIGHT 1024 /* plans queued per proxy before the host blocks */
#define MAX_KC (FN_MAX_CALLS * FN_MAX_CHANNELS)

struct fn_proxy {
  struct fn_comm *comm;
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  struct fn_plan *head, *tail;
  long submitted, completed;
  int stop; /* also polled without the lock by rendezvous waits */
  /* proxy thread only */
  int64_t stream_free;
  void *sleep_h;
  uint64_t rng;
  void *kh[MAX_KC];
  int kh_n;
};

static void *ctx_of(const struct fn_proxy *p) { return fn_comm_ctx(p->comm); }

/* ---------------------------------------------------------------- ProxyCtrl */

static bool ctrl_on(void) { return (fn_mask() & ncclProfileProxyCtrl) != 0; }

static void *ctrl_start(struct fn_proxy *p) {
  fn_descr_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileProxyCtrl;
  return fn_ev_start(ctx_of(p), &d);
}

static void ctrl_record(void *h, int state, int appended) {
  fn_args_t a;
  memset(&a, 0, sizeof a);
  a.proxyCtrl.appendedProxyOps = appended;
  fn_ev_record(h, state, &a);
}

static void ctrl_once(struct fn_proxy *p, int state) {
  if (!ctrl_on()) return;
  void *h = ctrl_start(p);
  ctrl_record(h, state, 0);
  fn_ev_stop(h);
}

static void ctrl_sleep(struct fn_proxy *p) {
  if (!ctrl_on() || p->sleep_h) return;
  p->sleep_h = ctrl_start(p);
  ctrl_record(p->sleep_h, ncclProfilerProxyCtrlSleep, 0);
}

static void ctrl_wakeup(struct fn_proxy *p) {
  if (!p->sleep_h) return;
  ctrl_record(p->sleep_h, ncclProfilerProxyCtrlWakeup, 0);
  fn_ev_stop(p->sleep_h);
  p->sleep_h = NULL;
}

static void ctrl_append(struct fn_proxy *p, int n) {
  if (!ctrl_on()) return;
  void *h = ctrl_start(p);
  ctrl_record(h, ncclProfilerProxyCtrlAppend, 0);
  ctrl_record(h, ncclProfilerProxyCtrlAppendEnd, n);
  fn_ev_stop(h);
}

/* ---------------------------------------------------------------- GPU model */

static int64_t plan_duration(const struct fn_plan *pl) {
  int n = pl->comm->nranks > 0 ? pl->comm->nranks : 1;
  double traffic = 0;
  for (int i = 0; i < pl->ntasks; i++) {
    const struct fn_task *t = &pl->task[i];
    double b = (double)t->bytes;
    if (t->func == FN_ALLREDUCE) b = b * 2.0 * (n - 1) / n;
    if (t->func == FN_ALLGATHER || t->func == FN_REDUCESCATTER) b = b * (n - 1);
    traffic += b;
  }
  return 4000 + (int64_t)(traffic / 200.0); /* ~200 GB/s, plus a few us of latency */
}

static int64_t gpu_end(struct fn_proxy *p, const struct fn_plan *pl, int64_t start) {
  int64_t xfer = plan_duration(pl) + pl->xfer_extra_ns;
  struct fn_rdv *r = p->comm->rdv;
  if (pl->rdv_index < 0 || !r) return start + xfer;
  bool timed_out = false;
  int64_t last = fn_rdv_wait_max(r, pl->rdv_index, &p->stop, &timed_out);
  if (timed_out)
    fprintf(stderr, "fake_nccl: rank %d: rendezvous timeout at op %ld\n", p->comm->rank,
            pl->rdv_index);
  return (last > start ? last : start) + xfer;
}

static int64_t report_lat(struct fn_proxy *p) {
  return 3000 + (int64_t)fn_rand_below(&p->rng, 17000);
}

/* ---------------------------------------------------------------- KernelCh */

/* Recv before Send of the same pair, as the proxy reported them on H200. */
static int kernel_order(const struct fn_plan *pl, int *idx) {
  int n = 0;
  for (int i = 0; i < pl->ntasks; i++) {
    const struct fn_task *t = &pl->task[i], *u = &pl->task[i + 1];
    if (i + 1 < pl->ntasks && t->func == FN_SEND && u->func == FN_RECV && t->peer == u->peer) {
      idx[n++] = i + 1;
      idx[n++] = i++;
    } else {
      idx[n++] = i;
    }
  }
  return n;
}

static int channels_to_deliver(const struct fn_plan *pl, const struct fn_task *t) {
  if (t->self) return 0; /* NCCL ran no profiled kernel work for self send/recv */
  int n = t->nch;
  if (pl->kc_deliver >= 0 && pl->kc_deliver < n) n = pl->kc_deliver;
  return n;
}

static uint64_t stale_shift(const struct fn_plan *pl) {
  /* A lagging proxy can read a reused ring slot: up to 202 ms old in a capture. */
  return pl->stale_ptimer ? 200000000ULL : 0;
}

static void report_starts(struct fn_proxy *p, const struct fn_plan *pl, int64_t start) {
  int idx[FN_MAX_CALLS], n = kernel_order(pl, idx);
  p->kh_n = 0;
  for (int k = 0; k < n; k++) {
    const struct fn_task *t = &pl->task[idx[k]];
    for (int c = 0; c < channels_to_deliver(pl, t) && p->kh_n < MAX_KC; c++) {
      fn_descr_t d;
      memset(&d, 0, sizeof d);
      d.type = ncclProfileKernelCh;
      d.parentObj = pl->kc_null_parent ? NULL : t->handle;
      d.rank = g_opt.api_rank ? p->comm->rank : 0;
      d.kernelCh.channelId = (uint8_t)((t->ch_lo + c) % FN_MAX_CHANNELS);
      int64_t jitter = (int64_t)fn_rand_below(&p->rng, 4) * g_opt.gpu_tick_ns;
      d.kernelCh.pTimer = fn_gpu_timer(start + jitter) - stale_shift(pl);
      FN_ADD(p->comm->st->kernel_ch, 1);
      p->kh[p->kh_n++] = fn_ev_start(ctx_of(p), &d);
    }
  }
}

static void report_stops(struct fn_proxy *p, const struct fn_plan *pl, int64_t start,
                         int64_t end) {
  int open = pl->kc_open_last && p->kh_n > 0 ? 1 : 0;
  for (int i = 0; i < p->kh_n - open; i++) {
    int64_t t = end - (int64_t)fn_rand_below(&p->rng, 4) * g_opt.gpu_tick_ns;
    if (t <= start) t = start + g_opt.gpu_tick_ns;
    fn_args_t a;
    memset(&a, 0, sizeof a);
    a.kernelCh.pTimer = fn_gpu_timer(t) - stale_shift(pl);
    fn_ev_record(p->kh[i], ncclProfilerKernelChStop, pl->kc_null_args ? NULL : &a);
    fn_ev_stop(p->kh[i]);
  }
  p->kh_n = 0;
}

static void wait_for_stop(struct fn_proxy *p) {
  pthread_mutex_lock(&p->mu);
  while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) pthread_cond_wait(&p->cv_work, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

static void run_plan(struct fn_proxy *p, const struct fn_plan *pl) {
  if (pl->never_start) { /* the kernel never starts: nothing to observe until abort */
    wait_for_stop(p);
    return;
  }
  bool kc = (pl->mask & ncclProfileKernelCh) != 0;
  if (kc) ctrl_append(p, pl->ntasks);
  int64_t start = pl->launch_ns + 8000 + (int64_t)fn_rand_below(&p->rng, 17000) + pl->gpu_delay_ns;
  if (start < p->stream_free) start = p->stream_free;
  if (pl->rdv_index >= 0 && p->comm->rdv) fn_rdv_publish(p->comm->rdv, pl->rdv_index, start);
  fn_sleep_until(start + report_lat(p));
  if (kc) report_starts(p, pl, start);
  int64_t end = gpu_end(p, pl, start);
  fn_sleep_until(end + report_lat(p));
  if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
    fn_plan_uncount(pl); /* aborted while the kernel ran: its KernelCh never stop */
  else if (kc)
    report_stops(p, pl, start, end);
  p->kh_n = 0;
  p->stream_free = end;
}

/* ---------------------------------------------------------------- thread */

static void finish_plan(struct fn_proxy *p, struct fn_plan *pl) {
  free(pl);
  pthread_mutex_lock(&p->mu);
  p->completed++;
  pthread_cond_broadcast(&p->cv_done);
  pthread_mutex_unlock(&p->mu);
}

/* On stop, queued plans are dropped: their kernels never ran (abort). */
static struct fn_plan *next_plan(struct fn_proxy *p) {
  pthread_mutex_lock(&p->mu);
  if (!p->head && !p->stop) {
    pthread_mutex_unlock(&p->mu);
    ctrl_sleep(p);
    pthread_mutex_lock(&p->mu);
    while (!p->head && !p->stop) pthread_cond_wait(&p->cv_work, &p->mu);
    pthread_mutex_unlock(&p->mu);
    ctrl_wakeup(p);
    pthread_mutex_lock(&p->mu);
  }
  struct fn_plan *pl = p->head;
  if (pl) {
    p->head = pl->next;
    if (!p->head) p->tail = NULL;
  }
  bool stop = p->stop;
  pthread_mutex_unlock(&p->mu);
  if (pl && stop) {
    fn_plan_uncount(pl);
    finish_plan(p, pl);
    return next_plan(p);
  }
  return pl;
}

static void *proxy_main(void *arg) {
  struct fn_proxy *p = arg;
  ctrl_once(p, ncclProfilerProxyCtrlIdle);
  struct fn_plan *pl;
  while ((pl = next_plan(p)) != NULL) {
    run_plan(p, pl);
    finish_plan(p, pl);
  }
  ctrl_wakeup(p);
  return NULL;
}

struct fn_proxy *fn_proxy_create(struct fn_comm *c) {
  struct fn_proxy *p = calloc(1, sizeof *p);
  if (!p) abort();
  p->comm = c;
  p->rng = g_opt.seed ^ fn_mix64(c->id + (uint64_t)c->rank);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv_work, NULL);
  pthread_cond_init(&p->cv_done, NULL);
  if (pthread_create(&p->th, NULL, proxy_main, p) != 0) abort();
  return p;
}

long fn_proxy_submit(struct fn_proxy *p, struct fn_plan *pl) {
  pl->next = NULL;
  pthread_mutex_lock(&p->mu);
  while (p->submitted - p->completed >= MAX_INFLIGHT && !p->stop)
    pthread_cond_wait(&p->cv_done, &p->mu);
  if (p->tail)
    p->tail->next = pl;
  else
    p->head = pl;
  p->tail = pl;
  long ticket = ++p->submitted;
  pthread_cond_broadcast(&p->cv_work);
  pthread_mutex_unlock(&p->mu);
  return ticket;
}

void fn_proxy_wait(struct fn_proxy *p, long ticket) {
  pthread_mutex_lock(&p->mu);
  while (p->completed < ticket) pthread_cond_wait(&p->cv_done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

void fn_proxy_drain(struct fn_proxy *p) {
  pthread_mutex_lock(&p->mu);
  long ticket = p->submitted;
  pthread_mutex_unlock(&p->mu);
  fn_proxy_wait(p, ticket);
}

void fn_proxy_destroy(struct fn_proxy *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&p->cv_work);
  pthread_mutex_unlock(&p->mu);
  pthread_join(p->th, NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv_work);
  pthread_cond_destroy(&p->cv_done);
  free(p);
}

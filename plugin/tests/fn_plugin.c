/*
 * fake_nccl: the plugin as NCCL holds it. Loading is reference-counted per
 * communicator (NCCL dlopens at the first init and dlcloses at the last
 * finalize), the activation mask is one process-wide int, and stop/record are
 * only called for non-NULL handles, as NCCL's profiler glue does.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_nccl.h"

static struct {
  pthread_mutex_t mu;
  void *dl;
  int refs, abi;
  ncclProfiler_v4_t *v4;
  ncclProfiler_v6_t *v6;
} g_pl = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* NCCL's ncclProfilerEventMask: written by every init, read at each group. */
static int g_nccl_mask;
struct fn_evcount g_ev;

/* ---------------------------------------------------------------- time */

int64_t fn_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void fn_sleep_until(int64_t host_ns) {
  struct timespec ts = {.tv_sec = host_ns / 1000000000LL, .tv_nsec = host_ns % 1000000000LL};
  while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

void fn_sleep_ns(int64_t ns) {
  if (ns > 0) fn_sleep_until(fn_now_ns() + ns);
}

/* GPU %globaltimer: host time plus a per-process offset (H200s ran ahead of the
 * host clock by 45-743 us in the captures), truncated to the timer's tick. */
uint64_t fn_gpu_timer(int64_t host_ns) {
  int64_t t = host_ns + g_opt.gpu_offset_ns;
  int64_t tick = g_opt.gpu_tick_ns > 0 ? g_opt.gpu_tick_ns : 1;
  return (uint64_t)(t - t % tick);
}

uint64_t fn_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t fn_rand(uint64_t *state) {
  *state += 0x9e3779b97f4a7c15ULL;
  return fn_mix64(*state);
}

uint64_t fn_rand_below(uint64_t *state, uint64_t n) { return n ? fn_rand(state) % n : 0; }

void fn_log(const char *fmt, ...) {
  if (!g_opt.verbose) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fake_nccl[%d]: ", (int)getpid());
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static pthread_mutex_t g_phase_mu = PTHREAD_MUTEX_INITIALIZER;

/* Same line format as the captures' phases.txt, so compare_sequences.py can cut
 * an echo log into the same phases as a capture. */
void fn_phase(const char *name) {
  if (!g_opt.phases_out) return;
  pthread_mutex_lock(&g_phase_mu);
  FILE *f = fopen(g_opt.phases_out, "a");
  if (f) {
    fprintf(f, "[rank %d] phase %s t_ns=%lld\n", g_opt.rank, name, (long long)fn_now_ns());
    fclose(f);
  }
  pthread_mutex_unlock(&g_phase_mu);
}

/* NCCL hands its own logger to init; plugins may call it from any thread. */
static void fn_nccl_logger(ncclDebugLogLevel level, unsigned long flags, const char *file,
                           int line, const char *fmt, ...) {
  if (!g_opt.verbose) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "plugin-log level=%d flags=0x%lx %s:%d %s\n", (int)level, flags,
          file ? file : "?", line, buf);
}

/* ---------------------------------------------------------------- loading */

static const char *symbol_for(int abi) {
  return abi == 4 ? "ncclProfiler_v4" : abi == 6 ? "ncclProfiler_v6" : "ncclProfiler_v5";
}

static int open_locked(void) {
  g_pl.dl = dlopen(g_opt.plugin, RTLD_NOW | RTLD_LOCAL);
  if (!g_pl.dl) {
    fprintf(stderr, "fake_nccl: dlopen(%s): %s\n", g_opt.plugin, dlerror());
    return -1;
  }
  void *sym = dlsym(g_pl.dl, symbol_for(g_opt.abi));
  if (!sym) {
    fprintf(stderr, "fake_nccl: %s has no %s\n", g_opt.plugin, symbol_for(g_opt.abi));
    dlclose(g_pl.dl);
    g_pl.dl = NULL;
    return -1;
  }
  g_pl.abi = g_opt.abi;
  g_pl.v4 = g_opt.abi == 4 ? sym : NULL;
  g_pl.v6 = g_opt.abi == 4 ? NULL : sym;
  g_ev.loads++;
  fn_log("loaded %s (%s)", g_opt.plugin, symbol_for(g_opt.abi));
  return 0;
}

static void close_locked(void) {
  if (!g_pl.dl) return;
  dlclose(g_pl.dl);
  g_pl.dl = NULL;
  g_pl.v4 = NULL;
  g_pl.v6 = NULL;
  g_ev.unloads++;
}

int fn_pl_acquire(void) {
  pthread_mutex_lock(&g_pl.mu);
  int rc = g_pl.dl ? 0 : open_locked();
  if (rc == 0) g_pl.refs++;
  pthread_mutex_unlock(&g_pl.mu);
  return rc;
}

void fn_pl_release(void) {
  pthread_mutex_lock(&g_pl.mu);
  if (g_pl.refs > 0 && --g_pl.refs == 0 && !g_opt.keep_loaded) close_locked();
  pthread_mutex_unlock(&g_pl.mu);
}

void fn_pl_unload_all(void) {
  pthread_mutex_lock(&g_pl.mu);
  if (g_pl.refs) fprintf(stderr, "fake_nccl: unloading with %d live comms\n", g_pl.refs);
  g_pl.refs = 0;
  close_locked();
  pthread_mutex_unlock(&g_pl.mu);
}

int fn_pl_abi(void) { return g_opt.abi; }

int fn_mask(void) { return __atomic_load_n(&g_nccl_mask, __ATOMIC_RELAXED); }

ncclResult_t fn_pl_init(void **ctx, uint64_t id, const char *name, int nnodes, int nranks,
                        int rank) {
  *ctx = NULL;
  FN_ADD(g_ev.init, 1);
  if (g_pl.abi == 4)
    return g_pl.v4->init(ctx, &g_nccl_mask, name, id, nnodes, nranks, rank, fn_nccl_logger);
  return g_pl.v6->init(ctx, id, &g_nccl_mask, name, nnodes, nranks, rank, fn_nccl_logger);
}

/* NCCL only finalizes a communicator whose context is non-NULL. */
void fn_pl_finalize(void *ctx) {
  if (ctx) fn_pl_finalize_raw(ctx);
}

void fn_pl_finalize_raw(void *ctx) {
  FN_ADD(g_ev.finalize, 1);
  if (g_pl.abi == 4)
    g_pl.v4->finalize(ctx);
  else
    g_pl.v6->finalize(ctx);
}

/* ---------------------------------------------------------------- events */

/* What NCCL's v4 adapter does: API and CE types are never forwarded, Coll/P2p
 * get the Group handle as parent, and the type is narrowed to a uint8_t. */
static bool to_v4(const fn_descr_t *d, ncclProfilerEventDescr_v4_t *o) {
  memset(o, 0, sizeof *o);
  if (d->type >= ncclProfileGroupApi && d->type <= ncclProfileCeBatch) return false;
  o->type = (uint8_t)d->type;
  o->parentObj = d->parentObj;
  o->rank = d->rank;
  if (d->type == ncclProfileColl) {
    o->parentObj = d->coll.parentGroup;
    o->coll.seqNumber = d->coll.seqNumber;
    o->coll.func = d->coll.func;
    o->coll.sendBuff = d->coll.sendBuff;
    o->coll.recvBuff = d->coll.recvBuff;
    o->coll.count = d->coll.count;
    o->coll.root = d->coll.root;
    o->coll.datatype = d->coll.datatype;
    o->coll.nChannels = d->coll.nChannels;
    o->coll.nWarps = d->coll.nWarps;
    o->coll.algo = d->coll.algo;
    o->coll.proto = d->coll.proto;
  } else if (d->type == ncclProfileP2p) {
    o->parentObj = d->p2p.parentGroup;
    o->p2p.func = d->p2p.func;
    o->p2p.buff = d->p2p.buff;
    o->p2p.datatype = d->p2p.datatype;
    o->p2p.count = d->p2p.count;
    o->p2p.peer = d->p2p.peer;
    o->p2p.nChannels = d->p2p.nChannels;
  } else if (d->type == ncclProfileProxyOp) {
    o->proxyOp = d->proxyOp;
  } else if (d->type == ncclProfileProxyStep) {
    o->proxyStep = d->proxyStep;
  } else if (d->type == ncclProfileKernelCh) {
    o->kernelCh = d->kernelCh;
  } else if (d->type == ncclProfileNetPlugin) {
    o->netPlugin = d->netPlugin;
  }
  return true;
}

/* NCCL passes its own per-thread or per-task slot and reads it back, so a
 * plugin that does not write *eHandle leaves whatever the slot held. */
void fn_ev_start_into(void *ctx, void **slot, fn_descr_t *d) {
  if (g_pl.abi >= 5) {
    if (g_pl.abi == 5 && (d->type & FN_CE_BITS) && d->type <= ncclProfileCeBatch) {
      *slot = NULL; /* the v5 adapter drops copy-engine events */
      return;
    }
    FN_ADD(g_ev.start, 1);
    g_pl.v6->startEvent(ctx, slot, d);
    return;
  }
  ncclProfilerEventDescr_v4_t d4;
  if (!to_v4(d, &d4)) return;
  FN_ADD(g_ev.start, 1);
  g_pl.v4->startEvent(ctx, slot, &d4);
}

void *fn_ev_start(void *ctx, fn_descr_t *d) {
  void *h = NULL;
  fn_ev_start_into(ctx, &h, d);
  return h;
}

void fn_ev_stop_raw(void *h) {
  FN_ADD(g_ev.stop, 1);
  if (g_pl.abi == 4)
    g_pl.v4->stopEvent(h);
  else
    g_pl.v6->stopEvent(h);
}

void fn_ev_record_raw(void *h, int state, fn_args_t *a) {
  FN_ADD(g_ev.record, 1);
  if (g_pl.abi == 4)
    g_pl.v4->recordEventState(h, (ncclProfilerEventState_t)state, a);
  else
    g_pl.v6->recordEventState(h, (ncclProfilerEventState_t)state, a);
}

void fn_ev_stop(void *h) {
  if (h) fn_ev_stop_raw(h);
}

void fn_ev_record(void *h, int state, fn_args_t *a) {
  if (h) fn_ev_record_raw(h, state, a);
}

/*
 * echo plugin: logs every profiler callback in the format of the real NCCL
 * captures (shared/reference/real-nccl-callbacks), so the call sequences of
 * fake_nccl can be compared with what NCCL really did.
 *
 *   ECHO_LOG        file to append lines to (nothing is written when unset)
 *   ECHO_MASK       activation mask to request (default 0x46: Coll|P2p|KernelCh)
 *   ECHO_NULL_MASK  event types answered with a NULL handle (default 0)
 *   ECHO_OPTOUT     if non-zero, init sets *context = NULL (opt out)
 *
 * Every startEvent gets a fresh handle: a slot of a static ring holding the
 * event's id and type. Parents are printed by id when they are echo handles,
 * 0 when NULL, and "?" otherwise (foreign or stale pointers are never read).
 * Exports ncclProfiler_v4, _v5 and _v6; everything else is hidden.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "profiler_v4.h"
#include "profiler_v6.h"

#define SLOTS (1u << 20)

struct slot {
  uint64_t id;   /* written before the handle is returned, read by any thread */
  uint64_t type;
};

static struct slot g_slots[SLOTS];
static uint64_t g_next_id;
static int g_fd = -1;
static int g_mask = 0x46, g_null_mask, g_optout;
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_configured;

struct echo_ctx {
  uint64_t comm_id;
  int rank;
};

static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  return v && *v ? strtol(v, NULL, 0) : dflt;
}

static void configure(void) {
  pthread_mutex_lock(&g_init_mu);
  if (!g_configured) {
    g_mask = (int)env_long("ECHO_MASK", 0x46);
    g_null_mask = (int)env_long("ECHO_NULL_MASK", 0);
    g_optout = (int)env_long("ECHO_OPTOUT", 0);
    const char *path = getenv("ECHO_LOG");
    if (path && *path)
      __atomic_store_n(&g_fd, open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644),
                       __ATOMIC_RELEASE);
    g_configured = 1;
  }
  pthread_mutex_unlock(&g_init_mu);
}

__attribute__((destructor)) static void echo_unload(void) {
  int fd = __atomic_exchange_n(&g_fd, -1, __ATOMIC_ACQ_REL);
  if (fd >= 0) close(fd);
}

/* One write(2) per line on an O_APPEND file: lines of concurrent threads and
 * processes never interleave. */
static void emit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emit(const char *fmt, ...) {
  int fd = __atomic_load_n(&g_fd, __ATOMIC_ACQUIRE);
  if (fd < 0) return;
  char line[768];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int n = snprintf(line, sizeof line, "%lld %ld ", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec,
                   (long)syscall(SYS_gettid));
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  if (write(fd, line, (size_t)n) < 0) {
  }
}

static const char *type_name(uint64_t type, char *buf, size_t len) {
  static const char *const names[] = {"Group",     "Coll",     "P2p",      "ProxyOp",
                                      "ProxyStep", "ProxyCtrl", "KernelCh", "NetPlugin",
                                      "GroupApi",  "CollApi",  "P2pApi",   "KernelLaunch",
                                      "CeColl",    "CeSync",   "CeBatch"};
  for (int i = 0; i < 15; i++)
    if (type == (1ULL << i)) return names[i];
  snprintf(buf, len, "0x%" PRIx64, type);
  return buf;
}

static struct slot *slot_of(const void *h) {
  uintptr_t p = (uintptr_t)h, lo = (uintptr_t)g_slots, hi = (uintptr_t)(g_slots + SLOTS);
  if (p < lo || p >= hi || (p - lo) % sizeof(struct slot)) return NULL;
  return (struct slot *)h;
}

/* "0" for NULL, the id for one of our handles, "?" for anything else. */
static const char *ref(const void *h, char *buf, size_t len) {
  if (!h) return "0";
  struct slot *s = slot_of(h);
  if (!s) return "?";
  snprintf(buf, len, "%" PRIu64, __atomic_load_n(&s->id, __ATOMIC_ACQUIRE));
  return buf;
}

static const char *str(const char *s) { return s ? s : "(null)"; }

static void *new_handle(uint64_t type, uint64_t *id) {
  *id = __atomic_add_fetch(&g_next_id, 1, __ATOMIC_RELAXED);
  struct slot *s = &g_slots[*id % SLOTS];
  __atomic_store_n(&s->type, type, __ATOMIC_RELAXED);
  __atomic_store_n(&s->id, *id, __ATOMIC_RELEASE);
  return s;
}

/* ---------------------------------------------------------------- fields */

static void fields_api(const ncclProfilerEventDescr_v6_t *d, char *f, size_t n) {
  if (d->type == ncclProfileGroupApi)
    snprintf(f, n, "depth=%d graph=%d", d->groupApi.groupDepth, (int)d->groupApi.graphCaptured);
  else if (d->type == ncclProfileCollApi)
    snprintf(f, n, "func=%s count=%zu dt=%s root=%d", str(d->collApi.func), d->collApi.count,
             str(d->collApi.datatype), d->collApi.root);
  else if (d->type == ncclProfileP2pApi)
    snprintf(f, n, "func=%s count=%zu dt=%s", str(d->p2pApi.func), d->p2pApi.count,
             str(d->p2pApi.datatype));
}

static void fields_coll(const rw_abi_coll_t *c, const char *pgroup, char *f, size_t n) {
  snprintf(f, n,
           "seq=%" PRIu64 " func=%s count=%zu dt=%s root=%d nch=%d nwarps=%d algo=%s proto=%s%s%s",
           c->seqNumber, str(c->func), c->count, str(c->datatype), c->root, c->nChannels,
           c->nWarps, str(c->algo), str(c->proto), pgroup ? " parentGroup=" : "",
           pgroup ? pgroup : "");
}

static void fields_p2p(const rw_abi_p2p_t *p, const char *pgroup, char *f, size_t n) {
  snprintf(f, n, "func=%s count=%zu dt=%s peer=%d nch=%d%s%s", str(p->func), p->count,
           str(p->datatype), p->peer, p->nChannels, pgroup ? " parentGroup=" : "",
           pgroup ? pgroup : "");
}

static void fields_proxy(uint64_t type, const rw_abi_proxy_op_t *op, const rw_abi_proxy_step_t *st,
                         const rw_abi_kernel_ch_t *kc, const rw_abi_net_plugin_t *np, char *f,
                         size_t n) {
  if (type == ncclProfileKernelCh)
    snprintf(f, n, "ch=%d pTimer=%" PRIu64, kc->channelId, kc->pTimer);
  else if (type == ncclProfileProxyOp)
    snprintf(f, n, "pid=%d ch=%d peer=%d nsteps=%d chunk=%d send=%d", (int)op->pid,
             op->channelId, op->peer, op->nSteps, op->chunkSize, op->isSend);
  else if (type == ncclProfileProxyStep)
    snprintf(f, n, "step=%d", st->step);
  else if (type == ncclProfileNetPlugin)
    snprintf(f, n, "netid=0x%" PRIx64, (uint64_t)np->id);
}

static void fields_v6(const ncclProfilerEventDescr_v6_t *d, char *f, size_t n) {
  char g[32];
  f[0] = 0;
  if (d->type == ncclProfileColl)
    fields_coll(&d->coll, ref(d->coll.parentGroup, g, sizeof g), f, n);
  else if (d->type == ncclProfileP2p)
    fields_p2p(&d->p2p, ref(d->p2p.parentGroup, g, sizeof g), f, n);
  else if (d->type == ncclProfileCeColl)
    snprintf(f, n, "seq=%" PRIu64 " func=%s count=%zu dt=%s sync=%s", d->ceColl.seqNumber,
             str(d->ceColl.func), d->ceColl.count, str(d->ceColl.datatype),
             str(d->ceColl.syncStrategy));
  else if (d->type >= ncclProfileGroupApi && d->type <= ncclProfileP2pApi)
    fields_api(d, f, n);
  else
    fields_proxy(d->type, &d->proxyOp, &d->proxyStep, &d->kernelCh, &d->netPlugin, f, n);
}

/* ---------------------------------------------------------------- callbacks */

static void log_start(uint64_t id, uint64_t type, const void *parent, int rank, const char *f) {
  char tb[32], pb[32];
  emit("start id=%" PRIu64 " type=%s parent=%s rank=%d %s", id, type_name(type, tb, sizeof tb),
       ref(parent, pb, sizeof pb), rank, f);
}

static ncclResult_t start_v6(void *ctx, void **eHandle, ncclProfilerEventDescr_v6_t *d) {
  (void)ctx;
  char f[512];
  uint64_t id;
  fields_v6(d, f, sizeof f);
  void *h = new_handle(d->type, &id);
  log_start(id, d->type, d->parentObj, d->rank, f);
  *eHandle = (d->type & (uint64_t)g_null_mask) ? NULL : h;
  return ncclSuccess;
}

static ncclResult_t start_v4(void *ctx, void **eHandle, ncclProfilerEventDescr_v4_t *d) {
  (void)ctx;
  char f[512];
  uint64_t id;
  f[0] = 0;
  if (d->type == ncclProfileColl) {
    rw_abi_coll_t c = {d->coll.seqNumber, d->coll.func, d->coll.sendBuff, d->coll.recvBuff,
                       d->coll.count, d->coll.root, d->coll.datatype, d->coll.nChannels,
                       d->coll.nWarps, d->coll.algo, d->coll.proto, NULL};
    fields_coll(&c, NULL, f, sizeof f);
  } else if (d->type == ncclProfileP2p) {
    rw_abi_p2p_t p = {d->p2p.func, d->p2p.buff, d->p2p.datatype, d->p2p.count, d->p2p.peer,
                      d->p2p.nChannels, NULL};
    fields_p2p(&p, NULL, f, sizeof f);
  } else {
    fields_proxy(d->type, &d->proxyOp, &d->proxyStep, &d->kernelCh, &d->netPlugin, f, sizeof f);
  }
  void *h = new_handle(d->type, &id);
  log_start(id, d->type, d->parentObj, d->rank, f);
  *eHandle = (d->type & (uint64_t)g_null_mask) ? NULL : h;
  return ncclSuccess;
}

static ncclResult_t stop_any(void *h) {
  struct slot *s = slot_of(h);
  char tb[32];
  if (!s) {
    emit("stop id=%s type=?", h ? "?" : "0");
    return ncclSuccess;
  }
  emit("stop id=%" PRIu64 " type=%s", __atomic_load_n(&s->id, __ATOMIC_ACQUIRE),
       type_name(__atomic_load_n(&s->type, __ATOMIC_RELAXED), tb, sizeof tb));
  return ncclSuccess;
}

static ncclResult_t record_any(void *h, ncclProfilerEventState_t state,
                               ncclProfilerEventStateArgs_v6_t *a) {
  struct slot *s = slot_of(h);
  char tb[32], args[64], ib[32];
  if (!a)
    snprintf(args, sizeof args, "args=NULL");
  else if (state == ncclProfilerKernelChStop)
    snprintf(args, sizeof args, "pTimer=%" PRIu64, a->kernelCh.pTimer);
  else if (state == ncclProfilerProxyCtrlAppendEnd)
    snprintf(args, sizeof args, "appended=%d", a->proxyCtrl.appendedProxyOps);
  else
    snprintf(args, sizeof args, "args=ptr");
  uint64_t type = s ? __atomic_load_n(&s->type, __ATOMIC_RELAXED) : 0;
  emit("record id=%s type=%s state=%d %s", ref(h, ib, sizeof ib),
       s ? type_name(type, tb, sizeof tb) : "?", (int)state, args);
  return ncclSuccess;
}

static ncclResult_t record_v4(void *h, ncclProfilerEventState_t state,
                              ncclProfilerEventStateArgs_v4_t *a) {
  return record_any(h, state, a);
}

static ncclResult_t init_common(void **context, uint64_t comm_id, int *mask, const char *name,
                                int nnodes, int nranks, int rank) {
  configure();
  __atomic_store_n(mask, g_mask, __ATOMIC_RELAXED); /* NCCL reads it with atomic loads */
  emit("init commId=0x%016" PRIx64 " commName=%s nNodes=%d nranks=%d rank=%d mask=0x%x host=?",
       comm_id, str(name), nnodes, nranks, rank, g_mask);
  *context = NULL;
  if (g_optout) return ncclSuccess;
  struct echo_ctx *c = calloc(1, sizeof *c);
  if (!c) return ncclSuccess;
  c->comm_id = comm_id;
  c->rank = rank;
  *context = c;
  return ncclSuccess;
}

static ncclResult_t init_v6(void **context, uint64_t comm_id, int *mask, const char *name,
                            int nnodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)logfn;
  return init_common(context, comm_id, mask, name, nnodes, nranks, rank);
}

static ncclResult_t init_v4(void **context, int *mask, const char *name, uint64_t comm_hash,
                            int nnodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)logfn;
  return init_common(context, comm_hash, mask, name, nnodes, nranks, rank);
}

static ncclResult_t finalize_any(void *context) {
  emit("finalize");
  free(context);
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclProfiler_v6_t ncclProfiler_v6 = {
    "echo-v6", init_v6, start_v6, stop_any, record_any, finalize_any};
__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {
    "echo-v5", init_v6, start_v6, stop_any, record_any, finalize_any};
__attribute__((visibility("default"))) ncclProfiler_v4_t ncclProfiler_v4 = {
    "echo-v4", init_v4, start_v4, stop_any, record_v4, finalize_any};

/*
 * fake_nccl: replay a captured callback trace (the real-nccl-callbacks format,
 * gunzipped) through a plugin.
 *
 * Every capture thread gets its own replay thread, and lines run in file order
 * (a global turn counter), so the plugin sees the same interleaving of
 * threads as the captured one. Capture ids map to the handles the plugin
 * returns, parent=0 to NULL. GPU timers are shifted by (now - first capture
 * timestamp) so they land near the present. The capture does not say which
 * communicator an event belongs to, so a pre-pass infers it: events linked
 * through parents form one operation, an operation's communicator is the one
 * whose proxy thread reported its KernelCh (proxy threads are matched to
 * communicators in order of first appearance), otherwise that of the previous
 * line on the same thread. With --replay-realtime each line also waits for its
 * captured time (shifted), so host and GPU times keep their captured relation;
 * otherwise lines run back to back. A `finalize` line finalizes the oldest live
 * communicator; those left at the end are finalized then, unless
 * --replay-keep-comms.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_nccl.h"

#define MAX_RTHREADS 64
#define MAX_RCOMMS 64

struct rline {
  int64_t ts;
  int thr, comm, rank, state, appended, root, nch, nwarps, peer, ch, depth;
  char verb; /* i(nit) s(tart) p (stop) r(ecord) f(inalize) */
  bool args_null, graph;
  uint64_t id, parent, pgroup, type, ptimer, seq, comm_id;
  size_t count;
  const char *func, *dt, *algo, *proto;
};

struct rcomm {
  uint64_t id;
  int rank, nranks, nnodes;
  void *ctx;
  bool live;
  struct fn_stats *st;
};

static struct {
  struct rline *l;
  long n, cap, turn;
  long tid[MAX_RTHREADS];
  int nthr, ncomm;
  struct rcomm comm[MAX_RCOMMS];
  void **hmap;          /* capture id -> plugin handle */
  int *kc_children;     /* capture id -> KernelCh events naming it as parent */
  unsigned char *graph; /* capture id -> 1 for CollApi under a captured GroupApi */
  uint64_t max_id;
  int64_t shift;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} R = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* ---------------------------------------------------------------- parsing */

/* NCCL's strings are static and so must ours be: known ones map to literals,
 * anything else is copied once into static storage. */
static const char *intern(const char *s) {
  static const char *const known[] = {
      "AllGather", "AllReduce", "AlltoAll", "Broadcast", "Gather", "Recv", "Reduce",
      "ReduceScatter", "Scatter", "SendRecv", "Send", "ncclInt8", "ncclInt32", "ncclUint32",
      "ncclInt64", "ncclUint64", "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16",
      "ncclFloat8e4m3", "ncclFloat8e5m2", "Unknown", "TREE", "RING", "COLLNET_DIRECT",
      "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT", "LL", "LL128", "SIMPLE"};
  static char pool[64][48];
  static int npool;
  if (!s || strcmp(s, "(null)") == 0) return NULL;
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (strcmp(known[i], s) == 0) return known[i];
  for (int i = 0; i < npool; i++)
    if (strcmp(pool[i], s) == 0) return pool[i];
  if (npool == 64) return "Unknown";
  snprintf(pool[npool], sizeof pool[npool], "%s", s);
  return pool[npool++];
}

static uint64_t type_of(const char *name) {
  static const char *const names[] = {"Group",     "Coll",      "P2p",     "ProxyOp",
                                      "ProxyStep", "ProxyCtrl", "KernelCh", "NetPlugin",
                                      "GroupApi",  "CollApi",   "P2pApi",  "KernelLaunch",
                                      "CeColl",    "CeSync",    "CeBatch"};
  for (int i = 0; i < 15; i++)
    if (strcmp(names[i], name) == 0) return 1ULL << i;
  return strtoull(name, NULL, 0);
}

static int thread_index(long tid) {
  for (int i = 0; i < R.nthr; i++)
    if (R.tid[i] == tid) return i;
  if (R.nthr == MAX_RTHREADS) return MAX_RTHREADS - 1;
  R.tid[R.nthr] = tid;
  return R.nthr++;
}

static void parse_kv(struct rline *l, const char *k, const char *v) {
  uint64_t u = strtoull(v, NULL, 0);
  int i = (int)strtol(v, NULL, 10);
  if (!strcmp(k, "id")) l->id = u;
  else if (!strcmp(k, "type")) l->type = type_of(v);
  else if (!strcmp(k, "parent")) l->parent = u;
  else if (!strcmp(k, "parentGroup")) l->pgroup = u;
  else if (!strcmp(k, "rank")) l->rank = i;
  else if (!strcmp(k, "state")) l->state = i;
  else if (!strcmp(k, "args")) l->args_null = !strcmp(v, "NULL");
  else if (!strcmp(k, "pTimer")) l->ptimer = u;
  else if (!strcmp(k, "appended")) l->appended = i;
  else if (!strcmp(k, "seq")) l->seq = u;
  else if (!strcmp(k, "func")) l->func = intern(v);
  else if (!strcmp(k, "count")) l->count = (size_t)u;
  else if (!strcmp(k, "dt")) l->dt = intern(v);
  else if (!strcmp(k, "root")) l->root = i;
  else if (!strcmp(k, "nch")) l->nch = i;
  else if (!strcmp(k, "nwarps")) l->nwarps = i;
  else if (!strcmp(k, "algo")) l->algo = intern(v);
  else if (!strcmp(k, "proto")) l->proto = intern(v);
  else if (!strcmp(k, "peer")) l->peer = i;
  else if (!strcmp(k, "ch")) l->ch = i;
  else if (!strcmp(k, "depth")) l->depth = i;
  else if (!strcmp(k, "graph")) l->graph = i != 0;
  else if (!strcmp(k, "commId")) l->comm_id = u;
  else if (!strcmp(k, "nranks")) l->nch = i; /* init lines reuse nch/nwarps for sizes */
  else if (!strcmp(k, "nNodes")) l->nwarps = i;
}

static bool parse_line(char *buf, struct rline *l) {
  memset(l, 0, sizeof *l);
  char *save = NULL, *tok = strtok_r(buf, " \t\r\n", &save);
  if (!tok) return false;
  l->ts = strtoll(tok, NULL, 10);
  if (!(tok = strtok_r(NULL, " \t\r\n", &save))) return false;
  l->thr = thread_index(strtol(tok, NULL, 10));
  if (!(tok = strtok_r(NULL, " \t\r\n", &save))) return false;
  if (!strcmp(tok, "init")) l->verb = 'i';
  else if (!strcmp(tok, "start")) l->verb = 's';
  else if (!strcmp(tok, "stop")) l->verb = 'p';
  else if (!strcmp(tok, "record")) l->verb = 'r';
  else if (!strcmp(tok, "finalize")) l->verb = 'f';
  else return false;
  while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
    char *eq = strchr(tok, '=');
    if (!eq) continue;
    *eq = 0;
    parse_kv(l, tok, eq + 1);
  }
  if (l->id > R.max_id) R.max_id = l->id;
  return true;
}

static int read_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    perror(path);
    return -1;
  }
  char *buf = NULL;
  size_t cap = 0;
  while (getline(&buf, &cap, f) > 0) {
    if (R.n == R.cap) {
      R.cap = R.cap ? 2 * R.cap : 1024;
      R.l = realloc(R.l, (size_t)R.cap * sizeof *R.l);
      if (!R.l) abort();
    }
    if (parse_line(buf, &R.l[R.n])) R.n++;
  }
  free(buf);
  fclose(f);
  return R.n ? 0 : -1;
}

/* ---------------------------------------------------------------- pre-pass */

static uint64_t uf_find(uint64_t *uf, uint64_t x) {
  while (uf[x] != x) x = uf[x] = uf[uf[x]];
  return x;
}

static void uf_join(uint64_t *uf, uint64_t a, uint64_t b) {
  if (a && b && a <= R.max_id && b <= R.max_id) uf[uf_find(uf, a)] = uf_find(uf, b);
}

/* Proxy threads (those reporting KernelCh/ProxyCtrl/ProxyOp) belong to the
 * communicators in order of first appearance. */
static void proxy_comms(int *thr_comm) {
  int next = 0;
  for (int i = 0; i < R.nthr; i++) thr_comm[i] = -1;
  for (long i = 0; i < R.n; i++) {
    const struct rline *l = &R.l[i];
    bool proxy = l->verb == 's' && (l->type & (ncclProfileKernelCh | ncclProfileProxyCtrl |
                                               ncclProfileProxyOp | ncclProfileProxyStep));
    if (proxy && thr_comm[l->thr] < 0)
      thr_comm[l->thr] = next < R.ncomm ? next++ : (R.ncomm ? R.ncomm - 1 : 0);
  }
}

static void assign_comms(void) {
  uint64_t *uf = calloc(R.max_id + 1, sizeof *uf);
  int *comp_comm = malloc((R.max_id + 1) * sizeof *comp_comm), thr_comm[MAX_RTHREADS];
  int last[MAX_RTHREADS];
  if (!uf || !comp_comm) abort();
  for (uint64_t i = 0; i <= R.max_id; i++) uf[i] = i, comp_comm[i] = -1;
  for (long i = 0; i < R.n; i++)
    if (R.l[i].verb == 's') {
      uf_join(uf, R.l[i].id, R.l[i].parent);
      uf_join(uf, R.l[i].id, R.l[i].pgroup);
    }
  proxy_comms(thr_comm);
  for (long i = 0; i < R.n; i++) {
    const struct rline *l = &R.l[i];
    if (l->verb == 's' && thr_comm[l->thr] >= 0) {
      uint64_t root = uf_find(uf, l->id);
      if (comp_comm[root] < 0) comp_comm[root] = thr_comm[l->thr];
    }
  }
  for (int t = 0; t < MAX_RTHREADS; t++) last[t] = 0;
  for (long i = 0, k = -1; i < R.n; i++) {
    struct rline *l = &R.l[i];
    if (l->verb == 'i' && k + 1 < R.ncomm) k++;
    if (l->verb == 'i') last[l->thr] = (int)k; /* an init line names its own comm */
    int c = l->id ? comp_comm[uf_find(uf, l->id)] : -1;
    l->comm = c >= 0 ? c : last[l->thr];
    last[l->thr] = l->comm;
  }
  free(uf);
  free(comp_comm);
}

static void prepass(void) {
  R.hmap = calloc(R.max_id + 1, sizeof *R.hmap);
  R.kc_children = calloc(R.max_id + 1, sizeof *R.kc_children);
  R.graph = calloc(R.max_id + 1, 1);
  if (!R.hmap || !R.kc_children || !R.graph) abort();
  unsigned char *graph_api = calloc(R.max_id + 1, 1);
  if (!graph_api) abort();
  for (long i = 0; i < R.n; i++) {
    const struct rline *l = &R.l[i];
    if (l->verb == 'i') R.ncomm += R.ncomm < MAX_RCOMMS;
    if (l->verb != 's' || l->parent > R.max_id) continue;
    if (l->type == ncclProfileKernelCh) R.kc_children[l->parent]++;
    if (l->type == ncclProfileGroupApi && l->graph) graph_api[l->id] = 1;
    if (l->type == ncclProfileCollApi && graph_api[l->parent]) R.graph[l->id] = 1;
  }
  free(graph_api);
  assign_comms();
}

/* ---------------------------------------------------------------- execution */

static void count_start(const struct rline *l, struct rcomm *c) {
  struct fn_stats *st = c->st;
  if (!st) return;
  if (l->type == ncclProfileKernelCh) FN_ADD(st->kernel_ch, 1);
  if (l->type != ncclProfileColl && l->type != ncclProfileP2p) return;
  if (!c->ctx) {
    FN_ADD(st->null_ctx_ops, 1);
    return;
  }
  bool ok = R.kc_children[l->id] >= l->nch;
  int func = -1;
  for (int f = 0; f < FN_NFUNC; f++)
    if (l->func && !strcmp(l->func, fn_func_names[f])) func = f;
  if (l->type == ncclProfileColl) {
    if (l->parent <= R.max_id && R.graph[l->parent]) FN_ADD(st->graph_replays, 1);
    if (func >= 0 && func < FN_NCOLL)
      FN_ADD(*(ok ? &st->colls[func] : &st->colls_incomplete[func]), 1);
    return;
  }
  bool snd = func == FN_SEND;
  if (l->peer == l->rank)
    FN_ADD(*(snd ? &st->self_send : &st->self_recv), 1);
  else if (!ok || l->peer < 0 || l->peer >= FN_MAX_PEERS)
    FN_ADD(st->p2p_incomplete, 1);
  else
    FN_ADD(*(snd ? &st->send[l->peer] : &st->recv[l->peer]), 1);
}

static void fill_descr(const struct rline *l, fn_descr_t *d) {
  memset(d, 0, sizeof *d);
  d->type = l->type;
  d->parentObj = l->parent <= R.max_id ? R.hmap[l->parent] : NULL;
  d->rank = l->rank;
  void *grp = l->pgroup <= R.max_id ? R.hmap[l->pgroup] : NULL;
  if (l->type == ncclProfileGroupApi) {
    d->groupApi.graphCaptured = l->graph;
    d->groupApi.groupDepth = l->depth;
  } else if (l->type == ncclProfileCollApi) {
    d->collApi = (rw_abi_coll_api_t){l->func, l->count, l->dt, l->root, NULL, R.graph[l->id]};
  } else if (l->type == ncclProfileP2pApi) {
    d->p2pApi = (rw_abi_p2p_api_t){l->func, l->count, l->dt, NULL, false};
  } else if (l->type == ncclProfileColl) {
    d->coll = (rw_abi_coll_t){l->seq, l->func, NULL, NULL, l->count, l->root, l->dt,
                              (uint8_t)l->nch, (uint8_t)l->nwarps, l->algo, l->proto, grp};
  } else if (l->type == ncclProfileP2p) {
    d->p2p = (rw_abi_p2p_t){l->func, NULL, l->dt, l->count, l->peer, (uint8_t)l->nch, grp};
  } else if (l->type == ncclProfileKernelCh) {
    d->kernelCh.channelId = (uint8_t)l->ch;
    d->kernelCh.pTimer = l->ptimer + (uint64_t)R.shift;
  }
}

static void run_init(const struct rline *l) {
  if (l->comm >= R.ncomm) return;
  if (fn_pl_acquire() != 0) {
    __atomic_store_n(&g_failed, 1, __ATOMIC_RELAXED);
    return;
  }
  struct rcomm *c = &R.comm[l->comm];
  c->id = l->comm_id;
  c->rank = l->rank;
  c->nranks = l->nch;
  c->nnodes = l->nwarps;
  c->st = fn_stats_get(c->id, c->rank, c->nranks);
  if (fn_pl_init(&c->ctx, c->id, NULL, c->nnodes, c->nranks, c->rank) != ncclSuccess)
    FN_ADD(c->st->init_failures, 1);
  FN_ADD(c->st->inits, 1);
  c->live = true;
}

static void run_finalize(struct rcomm *c) {
  if (!c || !c->live) return;
  fn_pl_finalize(c->ctx);
  FN_ADD(c->st->finalizes, 1);
  c->live = false;
  c->ctx = NULL;
  fn_pl_release();
}

static void run_line(const struct rline *l) {
  struct rcomm *c = &R.comm[l->comm < R.ncomm ? l->comm : 0];
  if (l->verb == 'i') return run_init(l);
  if (l->verb == 'f') {
    for (int k = 0; k < R.ncomm; k++)
      if (R.comm[k].live) return run_finalize(&R.comm[k]);
    return;
  }
  void *h = l->id <= R.max_id ? R.hmap[l->id] : NULL;
  if (l->verb == 'p') return fn_ev_stop(h);
  if (l->verb == 'r') {
    fn_args_t a;
    memset(&a, 0, sizeof a);
    if (l->ptimer) a.kernelCh.pTimer = l->ptimer + (uint64_t)R.shift;
    if (l->appended) a.proxyCtrl.appendedProxyOps = l->appended;
    return fn_ev_record(h, l->state, l->args_null ? NULL : &a);
  }
  if (!c->live) return; /* events of a communicator the replay never initialised */
  fn_descr_t d;
  fill_descr(l, &d);
  count_start(l, c);
  R.hmap[l->id] = fn_ev_start(c->ctx, &d);
}

static void *replay_thread(void *arg) {
  int thr = (int)(intptr_t)arg;
  for (long i = 0; i < R.n; i++) {
    if (R.l[i].thr != thr) continue;
    pthread_mutex_lock(&R.mu);
    while (R.turn != i) pthread_cond_wait(&R.cv, &R.mu);
    pthread_mutex_unlock(&R.mu);
    if (g_opt.replay_realtime) fn_sleep_until(R.l[i].ts + R.shift); /* the capture's pacing */
    run_line(&R.l[i]);
    pthread_mutex_lock(&R.mu);
    R.turn++;
    pthread_cond_broadcast(&R.cv);
    pthread_mutex_unlock(&R.mu);
  }
  return NULL;
}

int fn_scen_replay(const char *file) {
  if (!file || read_file(file) != 0) {
    fprintf(stderr, "fake_nccl: replay needs a capture file (--replay FILE)\n");
    return 2;
  }
  prepass();
  R.shift = fn_now_ns() - R.l[0].ts;
  pthread_t th[MAX_RTHREADS];
  for (int t = 0; t < R.nthr; t++)
    if (pthread_create(&th[t], NULL, replay_thread, (void *)(intptr_t)t) != 0) abort();
  for (int t = 0; t < R.nthr; t++) pthread_join(th[t], NULL);
  for (int k = 0; k < R.ncomm && !g_opt.replay_keep_comms; k++) run_finalize(&R.comm[k]);
  free(R.hmap);
  free(R.kc_children);
  free(R.graph);
  free(R.l);
  R.hmap = NULL; /* ready for the next --cycles round */
  R.kc_children = NULL;
  R.graph = NULL;
  R.l = NULL;
  R.n = R.cap = R.turn = 0;
  R.nthr = R.ncomm = 0;
  R.max_id = 0;
  memset(R.comm, 0, sizeof R.comm);
  return 0;
}

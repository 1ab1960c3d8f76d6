/*
 * fake_nccl: communicators and the host side of an NCCL operation.
 *
 * Call order per outermost group, as captured from NCCL 2.28.9 (mask 0x46):
 *   GroupApi start, record(23, NULL), {CollApi|P2pApi start, stop}..., record(24, NULL),
 *   [KernelLaunch start, stop], Group start, {Coll|P2p start}..., {stop}..., Group stop,
 *   GroupApi stop
 * Batched send/recv (groupDepth 3) stops GroupApi before the launch instead.
 * KernelCh events follow from the communicator's proxy thread (fn_proxy.c).
 * Graph replays re-emit Group/Coll from the CUDA host-callback thread, with the
 * capture-time CollApi handle (stopped long ago) as parent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_nccl.h"

const char *const fn_func_names[FN_NFUNC] = {"Broadcast", "Reduce", "AllGather",
                                             "ReduceScatter", "AllReduce", "Send", "Recv"};
/* NCCL has no string for ncclUint8: it reports "Unknown". */
const char *const fn_dt_names[FN_NDT] = {
    "ncclInt8", "Unknown", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
    "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
    "ncclFloat8e5m2"};
static const size_t dt_sizes[FN_NDT] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

int g_failed;

size_t fn_dt_size(int dt) { return dt >= 0 && dt < FN_NDT ? dt_sizes[dt] : 1; }

/* NCCL keeps the API handles in thread-local state; the CollApi slot is not
 * cleared on stop, so a plugin that fails to write *eHandle hands a later Coll
 * a stale parent. Mimicked here. */
static _Thread_local struct {
  void *group_api, *coll_api, *p2p_api;
} t_api;

/* ---------------------------------------------------------------- comms */

uint64_t fn_derive_comm_id(uint64_t base, uint64_t salt) {
  return salt ? fn_mix64(base ^ fn_mix64(salt)) : base;
}

void *fn_comm_ctx(const struct fn_comm *c) { return c->optout ? NULL : c->ctx; }

static void comm_setup(struct fn_comm *c, uint64_t id, int rank, int nranks, const char *name) {
  memset(c, 0, sizeof *c);
  c->id = id;
  c->rank = rank;
  c->nranks = nranks;
  if (name) {
    snprintf(c->name_buf, sizeof c->name_buf, "%s", name);
    c->name = c->name_buf;
  }
  c->st = fn_stats_get(id, rank, nranks);
}

int fn_comm_init(struct fn_comm *c, uint64_t id, int rank, int nranks, const char *name) {
  comm_setup(c, id, rank, nranks, name);
  if (fn_pl_acquire() != 0) {
    __atomic_store_n(&g_failed, 1, __ATOMIC_RELAXED);
    return -1;
  }
  ncclResult_t r = fn_pl_init(&c->ctx, id, c->name, g_opt.nnodes, nranks, rank);
  FN_ADD(c->st->inits, 1);
  if (r != ncclSuccess) {
    /* NCCL 2.28/2.29 only log "Continue without profiler" and keep going. */
    FN_ADD(c->st->init_failures, 1);
    fprintf(stderr, "fake_nccl: plugin init returned %d for comm 0x%016llx\n", (int)r,
            (unsigned long long)id);
  }
  c->proxy = fn_proxy_create(c);
  c->live = true;
  return 0;
}

/* A communicator whose plugin init set *context = NULL: NCCL still sends every
 * event for it, with a NULL context, and never calls finalize. */
void fn_comm_init_optout(struct fn_comm *c, uint64_t id, int rank, int nranks) {
  comm_setup(c, id, rank, nranks, NULL);
  c->optout = true;
  if (fn_pl_acquire() != 0) {
    __atomic_store_n(&g_failed, 1, __ATOMIC_RELAXED);
    return;
  }
  c->proxy = fn_proxy_create(c);
  c->live = true;
}

int fn_comm_attach_rdv(struct fn_comm *c, const char *dir) {
  c->rdv = fn_rdv_open(dir, c->id, c->nranks, c->rank);
  return c->rdv ? 0 : -1;
}

void fn_comm_sync(struct fn_comm *c) {
  if (c->live) fn_proxy_drain(c->proxy);
}

/* NCCL destroys the proxy (after draining) before calling finalize. */
static void comm_teardown(struct fn_comm *c, bool drain) {
  if (!c->live) return;
  if (drain) fn_proxy_drain(c->proxy);
  fn_proxy_destroy(c->proxy);
  c->proxy = NULL;
  if (!c->optout) {
    fn_pl_finalize(c->ctx);
    FN_ADD(c->st->finalizes, 1);
  }
  if (c->rdv) fn_rdv_close(c->rdv);
  c->rdv = NULL;
  memset(c->name_buf, 'X', sizeof c->name_buf - 1); /* the name dies with the comm */
  c->ctx = NULL;
  c->live = false;
  fn_pl_release();
}

void fn_comm_finalize(struct fn_comm *c) { comm_teardown(c, true); }
void fn_comm_abort(struct fn_comm *c) { comm_teardown(c, false); }

/* ---------------------------------------------------------------- groups */

void fn_group_init(struct fn_group *g, int depth) {
  memset(g, 0, sizeof *g);
  g->depth = depth;
  g->kc_deliver = -1;
}

void fn_group_add(struct fn_group *g, struct fn_comm *c, int func, size_t count, int dt,
                  int root, int peer) {
  if (g->ncalls >= FN_MAX_CALLS) return;
  struct fn_call *k = &g->call[g->ncalls++];
  k->comm = c;
  k->func = func;
  k->count = count;
  k->dt = dt;
  k->root = root;
  k->peer = peer;
}

/* NCCL 2.28.9 leaves rank 0 in API, Group and KernelCh descriptors. */
static int api_rank(int rank) { return g_opt.api_rank ? rank : 0; }

static void *api_group_start(const struct fn_group *g, int mask) {
  t_api.group_api = NULL; /* NCCL clears this slot after every GroupApi stop */
  if (fn_pl_abi() < 5 || !(mask & FN_GATE_GROUPAPI)) return NULL;
  fn_descr_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileGroupApi;
  d.rank = api_rank(g->call[0].comm->rank);
  d.groupApi.graphCaptured = g->graph;
  d.groupApi.groupDepth = g->depth;
  fn_ev_start_into(fn_comm_ctx(g->call[0].comm), &t_api.group_api, &d);
  fn_ev_record(t_api.group_api, ncclProfilerGroupStartApiStop, NULL);
  return t_api.group_api;
}

static void api_group_stop(void *gapi) {
  fn_ev_stop(gapi);
  t_api.group_api = NULL;
}

static void *api_call(const struct fn_call *k, int mask, bool graph, void *gapi) {
  bool p2p = k->func >= FN_SEND;
  void **slot = p2p ? &t_api.p2p_api : &t_api.coll_api;
  if (fn_pl_abi() < 5) return NULL;
  if (mask & (p2p ? FN_GATE_P2PAPI : FN_GATE_COLLAPI)) {
    fn_descr_t d;
    memset(&d, 0, sizeof d);
    d.type = p2p ? ncclProfileP2pApi : ncclProfileCollApi;
    d.parentObj = gapi;
    d.rank = api_rank(k->comm->rank);
    if (p2p) {
      d.p2pApi.func = fn_func_names[k->func];
      d.p2pApi.count = k->count;
      d.p2pApi.datatype = fn_dt_names[k->dt];
      d.p2pApi.stream = &k->comm->stream_token;
      d.p2pApi.graphCaptured = graph;
    } else {
      d.collApi.func = fn_func_names[k->func];
      d.collApi.count = k->count;
      d.collApi.datatype = fn_dt_names[k->dt];
      d.collApi.root = k->root;
      d.collApi.stream = &k->comm->stream_token;
      d.collApi.graphCaptured = graph;
    }
    fn_ev_start_into(fn_comm_ctx(k->comm), slot, &d);
    fn_ev_stop(*slot);
  }
  void *h = *slot;
  if (p2p) t_api.p2p_api = NULL;
  return h;
}

/* ---------------------------------------------------------------- launch */

enum { L_NORMAL, L_REPLAY, L_CAPTURE_HOSTNODE, L_CAPTURE_PLAIN };

struct fn_graph {
  struct fn_group g;
  void *api_h[FN_MAX_CALLS];
  int mask;
  bool host_node;
};

struct tune {
  int nch, nwarps;
  const char *algo, *proto;
};

/* Roughly what NCCL chose on 2 H200s: LL on one channel for small messages
 * (3 warps for a few bytes, 4 when coalesced, 16 for AllGather/ReduceScatter),
 * RING/SIMPLE on 24 channels for 64 MB. */
static struct tune tune_for(int func, size_t bytes, int ncolls) {
  if (bytes >= (1u << 20)) {
    int nch = bytes >= (32u << 20) ? 24 : bytes >= (4u << 20) ? 16 : 8;
    return (struct tune){nch, 17, "RING", "SIMPLE"};
  }
  if (bytes >= (64u << 10)) return (struct tune){4, 16, "RING", "LL128"};
  int w = ncolls > 1 ? 4 : (func == FN_ALLGATHER || func == FN_REDUCESCATTER) ? 16
                                                                              : bytes <= 64 ? 3 : 8;
  return (struct tune){1, w, "RING", "LL"};
}

/* AllGather and Broadcast reach the Coll event as bytes of ncclInt8. */
static void coll_wire(const struct fn_call *k, size_t *count, int *dt) {
  if (k->func == FN_ALLGATHER || k->func == FN_BROADCAST) {
    *count = k->count * fn_dt_size(k->dt);
    *dt = FN_INT8;
  } else {
    *count = k->count;
    *dt = k->dt;
  }
}

/* The order NCCL schedules a plan's tasks: collectives in call order, then
 * P2P by round (delta 0 = self first), each round's send then recv. */
static int plan_order(const struct fn_group *g, const struct fn_comm *c, int *order) {
  int n = 0;
  for (int i = 0; i < g->ncalls; i++)
    if (g->call[i].comm == c && g->call[i].func < FN_NCOLL) order[n++] = i;
  for (int delta = 0; delta < c->nranks; delta++) {
    int to = (c->rank + delta) % c->nranks, from = (c->rank - delta + c->nranks) % c->nranks;
    for (int i = 0; i < g->ncalls; i++)
      if (g->call[i].comm == c && g->call[i].func == FN_SEND && g->call[i].peer == to)
        order[n++] = i;
    for (int i = 0; i < g->ncalls; i++)
      if (g->call[i].comm == c && g->call[i].func == FN_RECV && g->call[i].peer == from)
        order[n++] = i;
  }
  for (int i = 0; i < g->ncalls; i++) { /* peers outside the communicator: last */
    const struct fn_call *k = &g->call[i];
    if (k->comm == c && k->func >= FN_NCOLL && (k->peer < 0 || k->peer >= c->nranks))
      order[n++] = i;
  }
  return n;
}

static void *start_task(const struct fn_call *k, void *parent, void *grp, struct fn_task *t,
                        int ncolls, int *cursor, int mask, uint64_t seq) {
  struct fn_comm *c = k->comm;
  fn_descr_t d;
  memset(&d, 0, sizeof d);
  d.parentObj = parent;
  d.rank = c->rank;
  t->func = k->func;
  t->peer = k->peer;
  if (k->func < FN_NCOLL) {
    int dt;
    coll_wire(k, &d.coll.count, &dt);
    struct tune tu = tune_for(k->func, d.coll.count * fn_dt_size(dt), ncolls);
    d.type = ncclProfileColl;
    d.coll.seqNumber = seq;
    d.coll.func = fn_func_names[k->func];
    d.coll.sendBuff = &c->stream_token;
    d.coll.recvBuff = &c->stream_token;
    d.coll.root = k->root;
    d.coll.datatype = fn_dt_names[dt];
    d.coll.nChannels = (uint8_t)tu.nch;
    d.coll.nWarps = (uint8_t)tu.nwarps;
    d.coll.algo = tu.algo;
    d.coll.proto = tu.proto;
    d.coll.parentGroup = grp;
    t->bytes = d.coll.count * fn_dt_size(dt);
    t->nch = tu.nch;
    /* Coalesced collectives share the kernel: each gets the next channel range. */
    if (*cursor + tu.nch > 32) *cursor = 0;
    t->ch_lo = *cursor;
    *cursor += tu.nch;
  } else {
    d.type = ncclProfileP2p;
    d.p2p.func = fn_func_names[k->func];
    d.p2p.buff = &c->stream_token;
    d.p2p.datatype = fn_dt_names[k->dt];
    d.p2p.count = k->count;
    d.p2p.peer = k->peer;
    d.p2p.nChannels = 1;
    d.p2p.parentGroup = grp;
    t->bytes = k->count * fn_dt_size(k->dt);
    t->nch = 1;
    t->ch_lo = 16; /* P2P channels sat above the collective ones (ch=16 in the capture) */
    t->self = k->peer == c->rank;
  }
  if (!(mask & (k->func < FN_NCOLL ? FN_GATE_COLL : FN_GATE_P2P))) return NULL;
  return fn_ev_start(fn_comm_ctx(c), &d);
}

static bool plan_complete(const struct fn_plan *pl, const struct fn_task *t) {
  if (!(pl->mask & ncclProfileKernelCh)) return true;
  if (pl->never_start || pl->kc_null_parent || pl->kc_open_last) return false;
  return pl->kc_deliver < 0 || pl->kc_deliver >= t->nch;
}

/* What the summary promises a recording plugin can see: complete ops per
 * function/peer; ops it cannot complete, or that were made abnormal on
 * purpose, are counted apart. */
static void count_task(struct fn_stats *st, const struct fn_plan *pl, const struct fn_task *t,
                       long n) {
  bool ok = plan_complete(pl, t);
  if (pl->kc_null_args || pl->stale_ptimer) {
    FN_ADD(st->irregular, n);
  } else if (t->func < FN_NCOLL) {
    long *slot = ok ? &st->colls[t->func] : &st->colls_incomplete[t->func];
    if (pl->mask & FN_GATE_COLL) FN_ADD(*slot, n);
  } else if (pl->mask & FN_GATE_P2P) {
    bool snd = t->func == FN_SEND;
    if (t->self)
      FN_ADD(*(snd ? &st->self_send : &st->self_recv), n);
    else if (!ok || t->peer < 0 || t->peer >= FN_MAX_PEERS)
      FN_ADD(st->p2p_incomplete, n);
    else
      FN_ADD(*(snd ? &st->send[t->peer] : &st->recv[t->peer]), n);
  }
}

static void count_plan(const struct fn_plan *pl, bool replay) {
  struct fn_stats *st = pl->comm->st;
  if (!fn_comm_ctx(pl->comm)) {
    FN_ADD(st->null_ctx_ops, 1);
    return;
  }
  if (replay) FN_ADD(st->graph_replays, 1);
  for (int i = 0; i < pl->ntasks; i++) count_task(st, pl, &pl->task[i], 1);
}

void fn_plan_uncount(const struct fn_plan *pl) {
  struct fn_stats *st = pl->comm->st;
  if (!fn_comm_ctx(pl->comm) || !(pl->mask & ncclProfileKernelCh)) return;
  for (int i = 0; i < pl->ntasks; i++) {
    const struct fn_task *t = &pl->task[i];
    if (t->self || !plan_complete(pl, t) || pl->kc_null_args || pl->stale_ptimer) continue;
    count_task(st, pl, t, -1);
    if (t->func < FN_NCOLL && (pl->mask & FN_GATE_COLL)) FN_ADD(st->colls_incomplete[t->func], 1);
    if (t->func >= FN_NCOLL && (pl->mask & FN_GATE_P2P)) FN_ADD(st->p2p_incomplete, 1);
  }
}

static struct fn_plan *plan_new(const struct fn_group *g, struct fn_comm *c, int mask) {
  struct fn_plan *pl = calloc(1, sizeof *pl);
  if (!pl) abort();
  pl->comm = c;
  pl->mask = mask;
  pl->kc_deliver = g->kc_deliver;
  pl->gpu_delay_ns = g->gpu_delay_ns;
  pl->xfer_extra_ns = g->xfer_extra_ns;
  pl->never_start = g->never_start;
  pl->kc_open_last = g->kc_open_last;
  pl->kc_null_parent = g->kc_null_parent;
  pl->kc_null_args = g->kc_null_args;
  pl->stale_ptimer = g->stale_ptimer;
  pl->rdv_index = (g->use_rdv && c->rdv) ? c->rdv_next++ : -1;
  return pl;
}

static void kernel_launch_event(struct fn_comm *c, int mask, void *gapi) {
  if (fn_pl_abi() < 5 || !(mask & ncclProfileKernelLaunch)) return;
  fn_descr_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileKernelLaunch;
  d.parentObj = gapi;
  d.rank = api_rank(c->rank);
  d.kernelLaunch.stream = &c->stream_token;
  fn_ev_stop(fn_ev_start(fn_comm_ctx(c), &d));
}

/* Seq numbers: bumped per collective per launch, except for graph-captured
 * plans, which NCCL counts only when KernelCh adds a host node per replay. */
static uint64_t next_seq(struct fn_comm *c, int func, int mode) {
  if (mode == L_CAPTURE_PLAIN) return __atomic_load_n(&c->seq[func], __ATOMIC_RELAXED);
  return __atomic_fetch_add(&c->seq[func], 1, __ATOMIC_RELAXED);
}

/* One kernel plan of communicator c: Group, then the tasks' Coll/P2p events. */
static void launch_plan(const struct fn_group *g, struct fn_comm *c, void *const *api_h,
                        int mask, void *gapi, int mode) {
  if (mode != L_REPLAY) kernel_launch_event(c, mask, gapi);
  if (mode == L_CAPTURE_HOSTNODE) return;
  struct fn_plan *pl = plan_new(g, c, mask);
  int order[FN_MAX_CALLS], n = plan_order(g, c, order), ncolls = 0, cursor = 0;
  for (int i = 0; i < n; i++) ncolls += g->call[order[i]].func < FN_NCOLL;
  void *grp = NULL;
  if (mask & FN_GATE_GROUP) {
    fn_descr_t d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileGroup;
    grp = fn_ev_start(fn_comm_ctx(c), &d);
  }
  void *h[FN_MAX_CALLS];
  for (int i = 0; i < n; i++) {
    const struct fn_call *k = &g->call[order[i]];
    uint64_t seq = k->func < FN_NCOLL ? next_seq(c, k->func, mode) : 0;
    h[i] = start_task(k, api_h[order[i]], grp, &pl->task[i], ncolls, &cursor, mask, seq);
    pl->task[i].handle = h[i];
  }
  pl->ntasks = n;
  count_plan(pl, mode == L_REPLAY);
  if (mode == L_CAPTURE_PLAIN) { /* captured without host node: no GPU reports */
    free(pl);
    pl = NULL;
  } else if (g->kc_before_stop) { /* the proxy may report before Coll stop */
    pl->launch_ns = fn_now_ns();
    fn_proxy_wait(c->proxy, fn_proxy_submit(c->proxy, pl));
    pl = NULL;
  }
  for (int i = 0; i < n; i++) fn_ev_stop(h[i]);
  fn_ev_stop(grp);
  if (pl) {
    pl->launch_ns = fn_now_ns();
    fn_proxy_submit(c->proxy, pl);
  }
}

/* One plan per communicator, in order of first appearance in the group. */
static void launch_all(const struct fn_group *g, void *const *api_h, int mask, void *gapi,
                       int mode) {
  for (int i = 0; i < g->ncalls; i++) {
    bool seen = false;
    for (int j = 0; j < i && !seen; j++) seen = g->call[j].comm == g->call[i].comm;
    if (!seen) launch_plan(g, g->call[i].comm, api_h, mask, gapi, mode);
  }
}

static struct fn_graph *graph_capture(const struct fn_group *g, void *const *api_h, int mask,
                                      void *gapi) {
  struct fn_graph *gr = calloc(1, sizeof *gr);
  if (!gr) abort();
  gr->g = *g;
  gr->mask = mask;
  memcpy(gr->api_h, api_h, sizeof gr->api_h);
  /* KernelCh adds profiler proxy ops to every plan, so the captured plan gets a
   * host node and Group/Coll are re-emitted on each replay; without it they are
   * emitted once, now. */
  gr->host_node = (mask & ncclProfileKernelCh) != 0;
  launch_all(g, api_h, mask, gapi, gr->host_node ? L_CAPTURE_HOSTNODE : L_CAPTURE_PLAIN);
  api_group_stop(gapi);
  return gr;
}

struct fn_graph *fn_issue(struct fn_group *g) {
  if (g->ncalls == 0) return NULL;
  fn_sleep_ns(g->host_delay_ns);
  /* NCCL loads the mask at the group's first call and keeps it on every task. */
  int mask = fn_mask();
  void *gapi = api_group_start(g, mask);
  void *api_h[FN_MAX_CALLS] = {0};
  for (int i = 0; i < g->ncalls; i++) api_h[i] = api_call(&g->call[i], mask, g->graph, gapi);
  fn_ev_record(gapi, ncclProfilerGroupEndApiStart, NULL);
  FN_ADD(g->call[0].comm->st->groups, 1);
  if (g->graph) return graph_capture(g, api_h, mask, gapi);
  if (g->api_stop_first) api_group_stop(gapi);
  launch_all(g, api_h, mask, gapi, L_NORMAL);
  if (!g->api_stop_first) api_group_stop(gapi);
  return NULL;
}

void fn_issue_one(struct fn_comm *c, int func, size_t count, int dt, int root) {
  struct fn_group g;
  fn_group_init(&g, 1);
  fn_group_add(&g, c, func, count, dt, root, -1);
  fn_issue(&g);
}

/* ---------------------------------------------------------------- graphs */

/* The CUDA driver's host-callback thread: one per process, runs the replays'
 * host nodes in order. */
struct replay_req {
  struct fn_graph *gr;
  struct replay_req *next;
};
static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t th;
  bool running, stop;
  struct replay_req *head, *tail;
  long posted, done;
} g_cb = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void replay_now(struct fn_graph *gr) {
  launch_all(&gr->g, gr->api_h, gr->mask, NULL, L_REPLAY);
}

static void *callback_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_cb.mu);
  for (;;) {
    while (!g_cb.head && !g_cb.stop) pthread_cond_wait(&g_cb.cv, &g_cb.mu);
    struct replay_req *r = g_cb.head;
    if (!r) break;
    g_cb.head = r->next;
    if (!g_cb.head) g_cb.tail = NULL;
    pthread_mutex_unlock(&g_cb.mu);
    replay_now(r->gr);
    free(r);
    pthread_mutex_lock(&g_cb.mu);
    g_cb.done++;
    pthread_cond_broadcast(&g_cb.cv);
  }
  pthread_mutex_unlock(&g_cb.mu);
  return NULL;
}

void fn_graph_replay(struct fn_graph *gr) {
  if (!gr->host_node) return; /* nothing reaches the plugin on such replays */
  struct replay_req *r = calloc(1, sizeof *r);
  if (!r) abort();
  r->gr = gr;
  pthread_mutex_lock(&g_cb.mu);
  if (!g_cb.running) {
    g_cb.stop = false;
    if (pthread_create(&g_cb.th, NULL, callback_main, NULL) != 0) abort();
    g_cb.running = true;
  }
  if (g_cb.tail)
    g_cb.tail->next = r;
  else
    g_cb.head = r;
  g_cb.tail = r;
  g_cb.posted++;
  pthread_cond_broadcast(&g_cb.cv);
  pthread_mutex_unlock(&g_cb.mu);
}

void fn_callbacks_drain(void) {
  pthread_mutex_lock(&g_cb.mu);
  while (g_cb.done < g_cb.posted) pthread_cond_wait(&g_cb.cv, &g_cb.mu);
  pthread_mutex_unlock(&g_cb.mu);
}

void fn_callbacks_shutdown(void) {
  pthread_mutex_lock(&g_cb.mu);
  bool running = g_cb.running;
  g_cb.stop = true;
  pthread_cond_broadcast(&g_cb.cv);
  pthread_mutex_unlock(&g_cb.mu);
  if (running) pthread_join(g_cb.th, NULL);
  g_cb.running = false;
}

void fn_graph_free(struct fn_graph *gr) { free(gr); }

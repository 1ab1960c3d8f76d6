/*
 * fake_nccl: the call patterns a plugin must survive although a clean PyTorch
 * run rarely shows them (ABI reference sections 1.2, 3.1, 3.5 and "What an
 * independent plugin must get right"): NULL and opted-out contexts, foreign
 * (PXN) ProxyOps whose parent and context belong to another process, ProxyCtrl
 * events, NULL state arguments, unknown types and states, orphaned and early
 * KernelCh, CollNet's nChannels=0, copy-engine events, re-initialisation after
 * the last finalize, and aborts that leave collectives unfinished.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_nccl.h"

/* Addresses in the unmapped first page: dereferencing one crashes at once. */
#define FOREIGN_PARENT ((void *)0x10)
#define FOREIGN_CTX ((void *)0x18)

static uint64_t rb_id(uint64_t salt) {
  uint64_t base = g_opt.comm_id_set ? g_opt.comm_id : fn_mix64(g_opt.seed ^ 0x7277ULL);
  return fn_derive_comm_id(base, 0x5200 + salt);
}

static void rb_one(struct fn_comm *c, size_t count, void (*tweak)(struct fn_group *)) {
  struct fn_group g;
  fn_group_init(&g, 1);
  fn_group_add(&g, c, FN_ALLREDUCE, count, FN_FLOAT32, 0, -1);
  if (tweak) tweak(&g);
  fn_issue(&g);
}

static void tw_null_args(struct fn_group *g) { g->kc_null_args = true; }
static void tw_null_parent(struct fn_group *g) { g->kc_null_parent = true; }
static void tw_before_stop(struct fn_group *g) { g->kc_before_stop = true; }
static void tw_stale(struct fn_group *g) { g->stale_ptimer = true; }

/* A Coll event outside any group, for the hand-made sequences below. */
static void *rb_coll(struct fn_comm *c, int nch, const char *algo) {
  fn_descr_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileColl;
  d.rank = c->rank;
  d.coll.seqNumber = __atomic_fetch_add(&c->seq[FN_ALLREDUCE], 1, __ATOMIC_RELAXED);
  d.coll.func = "AllReduce";
  d.coll.count = 4096;
  d.coll.datatype = "ncclFloat32";
  d.coll.nChannels = (uint8_t)nch;
  d.coll.nWarps = 8;
  d.coll.algo = algo;
  d.coll.proto = "SIMPLE";
  FN_ADD(c->st->irregular, 1);
  return fn_ev_start(fn_comm_ctx(c), &d);
}

static void rb_kernel_ch(struct fn_comm *c, void *parent, int ch, int state, bool null_args) {
  fn_descr_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileKernelCh;
  d.parentObj = parent;
  d.kernelCh.channelId = (uint8_t)ch;
  int64_t now = fn_now_ns();
  d.kernelCh.pTimer = fn_gpu_timer(now - 20000);
  void *h = fn_ev_start(fn_comm_ctx(c), &d);
  FN_ADD(c->st->kernel_ch, 1);
  fn_args_t a;
  memset(&a, 0, sizeof a);
  a.kernelCh.pTimer = fn_gpu_timer(now - 5000);
  fn_ev_record(h, state, null_args ? NULL : &a);
  if (state != ncclProfilerKernelChStop) fn_ev_record(h, ncclProfilerKernelChStop, &a);
  fn_ev_stop(h);
}

/* Type bits and states from a newer NCCL; CE states that are never sent. */
static void rb_unknown(struct fn_comm *c) {
  fn_descr_t d;
  memset(&d, 0, sizeof d);
  d.type = 1ULL << 20;
  d.rank = c->rank;
  fn_args_t a;
  memset(&a, 0, sizeof a);
  void *h = fn_ev_start(fn_comm_ctx(c), &d);
  fn_ev_record(h, 99, &a);
  fn_ev_record(h, 99, NULL);
  fn_ev_stop(h);
  void *coll = rb_coll(c, 1, "RING");
  fn_ev_record(coll, 99, &a);
  fn_ev_record(coll, ncclProfilerCeCollStart, NULL);
  fn_ev_stop(coll);
  rb_kernel_ch(c, coll, 0, 99, false); /* after Coll stop, with an unknown state first */
}

/* ProxyCtrl: parent NULL, the creator comm's context, the four patterns. */
static void rb_proxy_ctrl(struct fn_comm *c) {
  static const int seqs[4][3] = {{ncclProfilerProxyCtrlIdle, -1, -1},
                                 {ncclProfilerProxyCtrlActive, -1, -1},
                                 {ncclProfilerProxyCtrlSleep, ncclProfilerProxyCtrlWakeup, -1},
                                 {ncclProfilerProxyCtrlAppend, ncclProfilerProxyCtrlAppendEnd, -1}};
  for (int i = 0; i < 4; i++) {
    fn_descr_t d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileProxyCtrl;
    void *h = fn_ev_start(fn_comm_ctx(c), &d);
    for (int j = 0; j < 3 && seqs[i][j] >= 0; j++) {
      fn_args_t a = {.proxyCtrl = {.appendedProxyOps = 3}};
      fn_ev_record(h, seqs[i][j], &a);
    }
    fn_ev_stop(h);
  }
}

static void rb_steps(void *ctx, void *op, int nsteps, bool send) {
  static char net_data[64]; /* what a net plugin's profiler data would point at */
  for (int s = 0; s < nsteps; s++) {
    fn_descr_t d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileProxyStep;
    d.parentObj = op;
    d.proxyStep.step = s;
    void *st = fn_ev_start(ctx, &d);
    fn_args_t a = {.proxyStep = {.transSize = 65536}};
    /* send: GPUWait, PeerWait, SendWait; recv: RecvWait, FlushWait, GPUWait */
    fn_ev_record(st, send ? ncclProfilerProxyStepSendGPUWait : ncclProfilerProxyStepRecvWait, &a);
    fn_ev_record(st, send ? ncclProfilerProxyStepSendPeerWait_v4
                          : ncclProfilerProxyStepRecvFlushWait, &a);
    memset(&d, 0, sizeof d);
    d.type = ncclProfileNetPlugin;
    d.parentObj = st;
    d.netPlugin.id = (1 << 16) | 1; /* IB, event version 1 */
    d.netPlugin.data = net_data;
    void *np = fn_ev_start(ctx, &d);
    fn_args_t na = {.netPlugin = {.data = net_data}};
    fn_ev_record(np, ncclProfilerNetPluginUpdate, &na);
    fn_ev_stop(np);
    fn_ev_record(st, send ? ncclProfilerProxyStepSendWait : ncclProfilerProxyStepRecvGPUWait, &a);
    fn_ev_stop(st);
  }
}

static void rb_proxy_op(void *ctx, void *parent, pid_t pid, bool send) {
  fn_descr_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileProxyOp;
  d.parentObj = parent;
  d.proxyOp.pid = pid;
  d.proxyOp.channelId = 3;
  d.proxyOp.peer = 1;
  d.proxyOp.nSteps = 2;
  d.proxyOp.chunkSize = 1 << 19;
  d.proxyOp.isSend = send;
  void *op = fn_ev_start(ctx, &d);
  fn_args_t a;
  memset(&a, 0, sizeof a);
  fn_ev_record(op, ncclProfilerProxyOpInProgress_v4, &a);
  rb_steps(ctx, op, 2, send);
  fn_ev_stop(op);
}

/* Network ops: local ProxyOps under a Coll, and PXN ones copied from another
 * process, whose parent and context must never be dereferenced. */
static void rb_proxy_ops(struct fn_comm *c) {
  void *coll = rb_coll(c, 1, "RING");
  rb_proxy_op(fn_comm_ctx(c), coll, getpid(), true);
  rb_proxy_op(fn_comm_ctx(c), coll, getpid(), false);
  fn_ev_stop(coll);
  rb_kernel_ch(c, coll, 0, ncclProfilerKernelChStop, false);
  pid_t other = getpid() == 1 ? 2 : getpid() + 1;
  rb_proxy_op(FOREIGN_CTX, FOREIGN_PARENT, other, true);
  rb_proxy_op(FOREIGN_CTX, FOREIGN_PARENT, other, false);
  rb_proxy_op(fn_comm_ctx(c), NULL, getpid(), true); /* local op whose parent was dropped */
}

/* CollNet leaves nChannels at 0 while KernelCh still arrive per channel. */
static void rb_collnet(struct fn_comm *c) {
  void *coll = rb_coll(c, 0, "COLLNET_DIRECT");
  fn_ev_stop(coll);
  rb_kernel_ch(c, coll, 0, ncclProfilerKernelChStop, false);
  rb_kernel_ch(c, coll, 1, ncclProfilerKernelChStop, false);
}

/* KernelLaunch without a GroupApi, and v6 copy-engine events (dropped by v5). */
static void rb_launch_and_ce(struct fn_comm *c) {
  fn_descr_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileKernelLaunch;
  d.kernelLaunch.stream = &c->stream_token;
  fn_ev_stop(fn_ev_start(fn_comm_ctx(c), &d));
  if (fn_pl_abi() < 6) return;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileCollApi;
  d.collApi.func = "AllGather";
  d.collApi.count = 1024;
  d.collApi.datatype = "ncclFloat32";
  void *api = fn_ev_start(fn_comm_ctx(c), &d);
  memset(&d, 0, sizeof d);
  d.type = ncclProfileCeColl;
  d.parentObj = api;
  d.ceColl.func = "AllGather";
  d.ceColl.count = 1024;
  d.ceColl.datatype = "ncclFloat32";
  d.ceColl.syncStrategy = "MC";
  d.ceColl.batchSize = d.ceColl.numBatches = 1;
  void *ce = fn_ev_start(fn_comm_ctx(c), &d);
  fn_descr_t s = {.type = ncclProfileCeSync, .parentObj = ce, .ceCollSync = {false, c->nranks}};
  fn_ev_stop(fn_ev_start(fn_comm_ctx(c), &s));
  fn_descr_t b = {.type = ncclProfileCeBatch, .parentObj = ce, .ceCollBatch = {2, 8192, true}};
  fn_ev_stop(fn_ev_start(fn_comm_ctx(c), &b));
  fn_ev_stop(ce);
  fn_ev_stop(api);
}

/* A communicator whose init opted out (*context = NULL): events keep coming. */
static void rb_optout(void) {
  struct fn_comm o;
  fn_comm_init_optout(&o, rb_id(1), g_opt.rank, g_opt.nranks);
  if (!o.live) return;
  rb_one(&o, 1024, NULL);
  struct fn_group g;
  fn_group_init(&g, 2);
  fn_group_add(&g, &o, FN_ALLREDUCE, 256, FN_FLOAT32, 0, -1);
  fn_group_add(&g, &o, FN_SEND, 256, FN_FLOAT32, 0, (o.rank + 1) % o.nranks);
  fn_group_add(&g, &o, FN_RECV, 256, FN_FLOAT32, 0, (o.rank + 1) % o.nranks);
  fn_issue(&g);
  fn_group_init(&g, 1);
  g.graph = true;
  fn_group_add(&g, &o, FN_ALLREDUCE, 1024, FN_FLOAT32, 0, -1);
  struct fn_graph *gr = fn_issue(&g);
  fn_graph_replay(gr);
  fn_graph_replay(gr);
  fn_callbacks_drain();
  fn_graph_free(gr);
  fn_comm_finalize(&o);
}

/* Beyond what NCCL does (it checks handles and contexts first), but cheap for
 * a plugin to tolerate: NULL handles and a NULL finalize. --no-hostile skips. */
static void rb_hostile(struct fn_comm *c) {
  fn_args_t a;
  memset(&a, 0, sizeof a);
  fn_ev_stop_raw(NULL);
  fn_ev_record_raw(NULL, ncclProfilerKernelChStop, &a);
  fn_ev_record_raw(NULL, ncclProfilerGroupStartApiStop, NULL);
  fn_pl_finalize_raw(NULL);
  fn_descr_t d;
  memset(&d, 0, sizeof d);
  d.type = ncclProfileColl; /* a Coll with every string NULL */
  void *h = fn_ev_start(fn_comm_ctx(c), &d);
  fn_ev_stop(h);
  FN_ADD(c->st->irregular, 1);
}

/* Last finalize, then init again (NCCL dlcloses and dlopens in between),
 * including the very same (commId, rank). */
static int rb_reinit(struct fn_comm *c) {
  uint64_t id = c->id;
  fn_comm_finalize(c);
  if (fn_comm_init(c, id, g_opt.rank, g_opt.nranks, "robust-again")) return 1;
  rb_one(c, 1024, NULL);
  struct fn_comm e;
  if (fn_comm_init(&e, rb_id(2), g_opt.rank, g_opt.nranks, NULL)) return 1;
  rb_one(&e, 4096, NULL);
  fn_comm_finalize(&e);
  rb_one(c, 1, NULL);
  fn_comm_finalize(c);
  return 0;
}

static void rb_multicomm(struct fn_comm *c) {
  struct fn_comm d;
  if (fn_comm_init(&d, rb_id(3), g_opt.rank, g_opt.nranks, NULL)) return;
  struct fn_group g;
  fn_group_init(&g, 2);
  fn_group_add(&g, c, FN_ALLREDUCE, 1024, FN_FLOAT32, 0, -1);
  fn_group_add(&g, &d, FN_ALLREDUCE, 1024, FN_FLOAT32, 0, -1);
  fn_group_add(&g, &d, FN_SEND, 1024, FN_FLOAT32, 0, (d.rank + 1) % d.nranks);
  fn_issue(&g);
  fn_comm_finalize(&d); /* c's events that point into d's GroupApi parent are done */
}

int fn_scen_robustness(void) {
  struct fn_comm c;
  if (fn_comm_init(&c, rb_id(0), g_opt.rank, g_opt.nranks, "robust")) return 1;
  fn_phase("robustness");
  rb_one(&c, 1024, NULL);
  rb_one(&c, 1024, tw_null_args);
  rb_one(&c, 1024, tw_null_parent);
  rb_one(&c, 1024, tw_before_stop);
  rb_one(&c, 1024, tw_stale);
  fn_comm_sync(&c);
  rb_unknown(&c);
  rb_proxy_ctrl(&c);
  rb_proxy_ops(&c);
  rb_collnet(&c);
  rb_launch_and_ce(&c);
  rb_optout();
  rb_multicomm(&c);
  if (g_opt.hostile) rb_hostile(&c);
  return rb_reinit(&c);
}

/* ---------------------------------------------------------------- abort */

static void ab_partial(struct fn_group *g) { g->kc_deliver = 12; }
static void ab_none(struct fn_group *g) { g->kc_deliver = 0; }
static void ab_open(struct fn_group *g) { g->kc_open_last = true; }
static void ab_hang(struct fn_group *g) { g->never_start = true; }

/* Fewer KernelCh than nChannels, a KernelCh that never stops, a kernel that
 * never starts with work queued behind it; then the communicator is aborted
 * and finalized, and a fresh one must still work. */
int fn_scen_abort(void) {
  struct fn_comm c, d;
  if (fn_comm_init(&c, rb_id(10), g_opt.rank, g_opt.nranks, NULL)) return 1;
  fn_phase("abort");
  rb_one(&c, 1024, NULL);
  rb_one(&c, 16777216, ab_partial);
  rb_one(&c, 1024, ab_none);
  rb_one(&c, 16777216, ab_open);
  fn_comm_sync(&c);
  rb_one(&c, 1024, ab_hang);
  rb_one(&c, 1024, NULL); /* queued behind the stuck kernel: never runs */
  fn_sleep_ns(2000000);
  fn_comm_abort(&c);
  if (fn_comm_init(&d, rb_id(11), g_opt.rank, g_opt.nranks, NULL)) return 1;
  rb_one(&d, 1024, NULL);
  rb_one(&d, 16777216, ab_partial);
  fn_comm_finalize(&d); /* drained, but one collective is still missing 12 channels */
  return 0;
}

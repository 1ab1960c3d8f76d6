/*
 * fake_nccl: a stand-in for NCCL's side of the profiler plugin interface.
 *
 * It loads a profiler plugin and calls it the way NCCL 2.28.9 does: the call
 * orders, threads and descriptor contents follow real captures made on 2 H200
 * GPUs (shared/reference/real-nccl-callbacks), so a plugin can be exercised,
 * including under sanitizers, without GPUs or NCCL.
 *
 * Modules:
 *   fake_nccl.c     options, scenario dispatch, load/unload cycles
 *   fn_plugin.c     dlopen/dlsym, the v4/v5/v6 calling conventions, event counters
 *   fn_ops.c        communicators, group launch (API, Group, Coll/P2p events), graphs
 *   fn_proxy.c      simulated GPU timeline and the proxy thread (KernelCh, ProxyCtrl)
 *   fn_rdv.c        shared-memory rendezvous between driver processes of one job
 *   fn_scenarios.c  the scenarios, fn_scen_robust.c the robustness/abort ones
 *   fn_replay.c     replay of a captured callback trace
 *   fn_summary.c    statistics and the JSON summary line
 */
#ifndef FAKE_NCCL_H
#define FAKE_NCCL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "profiler_v4.h"
#include "profiler_v6.h"

/* The driver builds native (v6) descriptors; fn_plugin.c converts for v4. */
typedef ncclProfilerEventDescr_v6_t fn_descr_t;
typedef ncclProfilerEventStateArgs_v6_t fn_args_t;

/* Collective functions in NCCL's own enum order; Send and Recv follow. */
enum { FN_BROADCAST, FN_REDUCE, FN_ALLGATHER, FN_REDUCESCATTER, FN_ALLREDUCE, FN_NCOLL };
enum { FN_SEND = FN_NCOLL, FN_RECV, FN_NFUNC };
enum { FN_INT8, FN_UINT8, FN_INT32, FN_UINT32, FN_INT64, FN_UINT64, FN_FLOAT16,
       FN_FLOAT32, FN_FLOAT64, FN_BFLOAT16, FN_FP8E4M3, FN_FP8E5M2, FN_NDT };
extern const char *const fn_func_names[FN_NFUNC];
extern const char *const fn_dt_names[FN_NDT];
size_t fn_dt_size(int dt);

#define FN_MAX_CALLS 64     /* NCCL calls in one group */
#define FN_MAX_PEERS 64     /* ranks per communicator tracked in the summary */
#define FN_MAX_CHANNELS 64  /* NCCL's MAXCHANNELS */

enum { FN_SLOW_NONE, FN_SLOW_HOST, FN_SLOW_GPU, FN_SLOW_TRANSFER };

struct fn_opts {
  const char *plugin, *scenario, *replay_file, *phases_out, *rendezvous, *comm_name;
  int abi, ops, threads, comms, cycles, rank, nranks, nnodes, steps;
  double seconds;
  uint64_t seed, comm_id;
  bool comm_id_set, keep_loaded, verbose, hostile, api_rank, replay_keep_comms, replay_realtime;
  int slow_rank, slow_from_step, slow_cause, hang_at_step;
  long slow_us, interval_sleep_us, rdv_timeout_ms;
  int64_t gpu_offset_ns;
  int gpu_tick_ns;
};
extern struct fn_opts g_opt;

/* ---- time and randomness (fn_plugin.c) ---- */
int64_t fn_now_ns(void);                 /* host CLOCK_REALTIME */
void fn_sleep_until(int64_t host_ns);
void fn_sleep_ns(int64_t ns);
uint64_t fn_gpu_timer(int64_t host_ns);  /* simulated %globaltimer for that host instant */
uint64_t fn_rand(uint64_t *state);
uint64_t fn_rand_below(uint64_t *state, uint64_t n);
uint64_t fn_mix64(uint64_t x);
void fn_phase(const char *name);         /* phase mark, as in the captures' phases.txt */
void fn_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- the plugin, as NCCL holds it (fn_plugin.c) ---- */
int fn_pl_acquire(void);   /* +1 reference, dlopen on the first (NCCL's refcount) */
void fn_pl_release(void);  /* -1 reference, dlclose on the last unless --keep-loaded */
void fn_pl_unload_all(void);
int fn_pl_abi(void);
int fn_mask(void);         /* NCCL's one process-wide activation mask */
ncclResult_t fn_pl_init(void **ctx, uint64_t id, const char *name, int nnodes, int nranks,
                        int rank);
void fn_pl_finalize(void *ctx);
void fn_pl_finalize_raw(void *ctx);
void fn_ev_start_into(void *ctx, void **slot, fn_descr_t *d);
void *fn_ev_start(void *ctx, fn_descr_t *d);
void fn_ev_stop(void *h);                              /* skipped for NULL, like NCCL */
void fn_ev_record(void *h, int state, fn_args_t *a);   /* skipped for NULL, like NCCL */
void fn_ev_stop_raw(void *h);
void fn_ev_record_raw(void *h, int state, fn_args_t *a);

struct fn_evcount { long start, stop, record, init, finalize, loads, unloads; };
extern struct fn_evcount g_ev;

/* Parent types that NCCL turns on implicitly (ABI reference, section 1.3). */
#define FN_CE_BITS (ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch)
#define FN_NET_BITS (ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | \
                     ncclProfileNetPlugin)
#define FN_GATE_GROUPAPI (ncclProfileGroupApi | ncclProfileP2pApi | ncclProfileCollApi | \
                          ncclProfileKernelLaunch | ncclProfileGroup | ncclProfileColl | \
                          ncclProfileP2p | FN_NET_BITS | FN_CE_BITS)
#define FN_GATE_COLLAPI (ncclProfileCollApi | ncclProfileColl | FN_NET_BITS | FN_CE_BITS)
#define FN_GATE_P2PAPI (ncclProfileP2pApi | ncclProfileP2p | FN_NET_BITS)
#define FN_GATE_GROUP (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | FN_NET_BITS)
#define FN_GATE_COLL (ncclProfileColl | FN_NET_BITS)
#define FN_GATE_P2P (ncclProfileP2p | FN_NET_BITS)

/* ---- statistics behind the JSON summary (fn_summary.c) ---- */
struct fn_stats {
  uint64_t comm_id;
  int rank, nranks;
  long inits, finalizes, init_failures, null_ctx_ops, groups;
  long colls[FN_NCOLL], colls_incomplete[FN_NCOLL];
  long send[FN_MAX_PEERS], recv[FN_MAX_PEERS], self_send, self_recv, p2p_incomplete;
  long graph_replays, kernel_ch;
  long irregular;            /* ops with deliberately abnormal events (robustness) */
  struct fn_stats *next;
};
#define FN_ADD(field, n) __atomic_fetch_add(&(field), (n), __ATOMIC_RELAXED)
struct fn_stats *fn_stats_get(uint64_t comm_id, int rank, int nranks);
void fn_summary_print(bool hung);
void fn_stats_free_all(void);

/* ---- communicators and operations (fn_ops.c) ---- */
struct fn_proxy;
struct fn_rdv;
struct fn_comm {
  uint64_t id;
  int rank, nranks;
  void *ctx;                 /* what the plugin's init wrote (NULL = opted out) */
  bool live, optout;         /* optout: driven with a NULL context, init never called */
  char name_buf[64];         /* commName storage, scribbled at finalize (plugins must copy) */
  const char *name;
  uint64_t seq[FN_NCOLL];    /* NCCL's per-function sequence numbers */
  long rdv_next;             /* next rendezvous op index (app thread) */
  char stream_token;         /* its address is the fake cudaStream_t */
  struct fn_proxy *proxy;
  struct fn_rdv *rdv;
  struct fn_stats *st;
};

struct fn_call {
  struct fn_comm *comm;
  int func, dt, root, peer;
  size_t count;              /* the user's count, as CollApi/P2pApi report it */
};

struct fn_group {            /* one outermost ncclGroupStart..ncclGroupEnd */
  int ncalls;
  struct fn_call call[FN_MAX_CALLS];
  int depth;                 /* groupDepth reported by GroupApi */
  bool graph;                /* captured into a CUDA graph */
  bool api_stop_first;       /* GroupApi stops before the launch (batched P2P, depth 3) */
  bool use_rdv;              /* GPU end = max over ranks (job scenario) */
  int64_t host_delay_ns, gpu_delay_ns, xfer_extra_ns;
  /* robustness knobs */
  int kc_deliver;            /* <0: every channel; else KernelCh for this many per task */
  bool kc_open_last;         /* the last delivered KernelCh starts but never stops */
  bool kc_null_parent, kc_null_args, kc_before_stop, never_start, stale_ptimer;
};

struct fn_graph;
struct fn_plan;

int fn_comm_init(struct fn_comm *c, uint64_t id, int rank, int nranks, const char *name);
void fn_comm_init_optout(struct fn_comm *c, uint64_t id, int rank, int nranks);
void fn_comm_finalize(struct fn_comm *c);
void fn_comm_abort(struct fn_comm *c);      /* finalize without waiting for the GPU */
void fn_comm_sync(struct fn_comm *c);       /* like cudaStreamSynchronize */
void *fn_comm_ctx(const struct fn_comm *c);
int fn_comm_attach_rdv(struct fn_comm *c, const char *dir);
uint64_t fn_derive_comm_id(uint64_t base, uint64_t salt);

void fn_group_init(struct fn_group *g, int depth);
void fn_group_add(struct fn_group *g, struct fn_comm *c, int func, size_t count, int dt,
                  int root, int peer);
struct fn_graph *fn_issue(struct fn_group *g);   /* returns a graph when g->graph */
void fn_issue_one(struct fn_comm *c, int func, size_t count, int dt, int root);
void fn_graph_replay(struct fn_graph *gr);       /* asynchronous, host-callback thread */
void fn_graph_free(struct fn_graph *gr);
void fn_plan_uncount(const struct fn_plan *pl); /* a counted plan never ran (abort) */
void fn_callbacks_drain(void);
void fn_callbacks_shutdown(void);

/* ---- proxy thread and GPU timeline (fn_proxy.c) ---- */
struct fn_task {
  void *handle;              /* Coll/P2p handle: the KernelCh parent */
  int func, ch_lo, nch, peer;
  size_t bytes;
  bool self;                 /* P2P with itself: no KernelCh on real NCCL */
};
struct fn_plan {             /* one kernel plan of one communicator */
  struct fn_comm *comm;
  int mask, ntasks, kc_deliver;
  struct fn_task task[FN_MAX_CALLS];
  int64_t launch_ns, gpu_delay_ns, xfer_extra_ns;
  long rdv_index;            /* <0: no rendezvous */
  bool never_start, kc_open_last, kc_null_parent, kc_null_args, stale_ptimer;
  struct fn_plan *next;
};
struct fn_proxy *fn_proxy_create(struct fn_comm *c);
long fn_proxy_submit(struct fn_proxy *p, struct fn_plan *plan);   /* takes ownership */
void fn_proxy_wait(struct fn_proxy *p, long ticket);
void fn_proxy_drain(struct fn_proxy *p);
void fn_proxy_destroy(struct fn_proxy *p);   /* undelivered plans are dropped (abort) */

/* ---- rendezvous between driver processes (fn_rdv.c) ---- */
struct fn_rdv *fn_rdv_open(const char *dir, uint64_t comm_id, int nranks, int rank);
void fn_rdv_publish(struct fn_rdv *r, long index, int64_t ready_ns);
int64_t fn_rdv_wait_max(struct fn_rdv *r, long index, const int *stop_flag, bool *timed_out);
void fn_rdv_close(struct fn_rdv *r);

/* ---- scenarios ---- */
int fn_run_scenario(const char *name);
int fn_scen_robustness(void);
int fn_scen_abort(void);
int fn_scen_job(void);
int fn_scen_replay(const char *file);
extern volatile int g_hung;
extern int g_failed; /* set when the plugin could not be loaded for a comm */

#endif

/*
 * fake_nccl: scenarios that drive valid NCCL call sequences (what a PyTorch
 * job produces), from single collectives up to a multi-threaded stress run.
 * Robustness and abort scenarios live in fn_scen_robust.c, the multi-process
 * job in fn_job.c, capture replay in fn_replay.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_nccl.h"

static uint64_t base_id(uint64_t salt) {
  uint64_t base = g_opt.comm_id_set ? g_opt.comm_id : fn_mix64(g_opt.seed ^ 0x7277ULL);
  return fn_derive_comm_id(base, salt);
}

static void pace(void) { fn_sleep_ns(g_opt.interval_sleep_us * 1000); }

static int init_main(struct fn_comm *c, uint64_t salt, const char *name) {
  if (fn_comm_init(c, base_id(salt), g_opt.rank, g_opt.nranks, name) == 0) return 0;
  fprintf(stderr, "fake_nccl: cannot initialise a communicator\n");
  return 1;
}

/* torch.distributed.barrier: an AllReduce of one float, then a device sync. */
static void barrier(struct fn_comm *c) {
  fn_issue_one(c, FN_ALLREDUCE, 1, FN_FLOAT32, 0);
  fn_comm_sync(c);
}

/* ---------------------------------------------------------------- groups */

/* torch all_to_all: one group (depth 1), a Send and a Recv per peer, self included. */
static void all_to_all(struct fn_comm *c, size_t count) {
  struct fn_group g;
  fn_group_init(&g, 1);
  for (int p = 0; p < c->nranks && g.ncalls + 2 <= FN_MAX_CALLS; p++) {
    fn_group_add(&g, c, FN_SEND, count, FN_FLOAT32, 0, p);
    fn_group_add(&g, c, FN_RECV, count, FN_FLOAT32, 0, p);
  }
  fn_issue(&g);
}

/* torch batch_isend_irecv: groupDepth 3, and GroupApi stops before the launch. */
static void batch_send_recv(struct fn_comm *c, size_t count) {
  struct fn_group g;
  fn_group_init(&g, 3);
  g.api_stop_first = true;
  fn_group_add(&g, c, FN_SEND, count, FN_FLOAT32, 0, (c->rank + 1) % c->nranks);
  fn_group_add(&g, c, FN_RECV, count, FN_FLOAT32, 0, (c->rank - 1 + c->nranks) % c->nranks);
  fn_issue(&g);
}

static void coalesced(struct fn_comm *c, int n, size_t count, int depth) {
  struct fn_group g;
  fn_group_init(&g, depth);
  for (int i = 0; i < n; i++) fn_group_add(&g, c, FN_ALLREDUCE, count, FN_FLOAT32, 0, -1);
  fn_issue(&g);
}

static struct fn_graph *capture(struct fn_comm *c, int n, size_t count) {
  struct fn_group g;
  fn_group_init(&g, n > 1 ? 2 : 1);
  g.graph = true;
  for (int i = 0; i < n; i++) fn_group_add(&g, c, FN_ALLREDUCE, count, FN_FLOAT32, 0, -1);
  return fn_issue(&g);
}

/* ---------------------------------------------------------------- simple ones */

static int scen_basic(void) {
  static const struct {
    int func;
    size_t count;
  } mix[] = {{FN_ALLREDUCE, 1024},    {FN_ALLGATHER, 1024}, {FN_REDUCESCATTER, 1024},
             {FN_BROADCAST, 1024},    {FN_REDUCE, 1024},    {FN_ALLREDUCE, 16777216},
             {FN_ALLREDUCE, 1}};
  struct fn_comm c;
  if (init_main(&c, 0, g_opt.comm_name)) return 1;
  fn_phase("basic");
  for (int i = 0; i < g_opt.ops; i++) {
    int m = i % (int)(sizeof mix / sizeof mix[0]);
    fn_issue_one(&c, mix[m].func, mix[m].count, FN_FLOAT32, 0);
    pace();
  }
  fn_comm_finalize(&c);
  return 0;
}

static int scen_p2p(void) {
  struct fn_comm c;
  if (init_main(&c, 0, g_opt.comm_name)) return 1;
  fn_phase("p2p");
  for (int i = 0; i < g_opt.ops; i++) {
    if (i % 3 == 0) all_to_all(&c, 1024);
    if (i % 3 == 1) batch_send_recv(&c, 1024);
    if (i % 3 == 2) { /* a lone dist.send and dist.recv: implicit groups of depth 1 */
      struct fn_group g;
      fn_group_init(&g, 1);
      fn_group_add(&g, &c, (c.rank % 2) ? FN_RECV : FN_SEND, 4096, FN_FLOAT32, 0,
                   (c.rank % 2) ? c.rank - 1 : (c.rank + 1) % c.nranks);
      fn_issue(&g);
    }
    pace();
  }
  fn_comm_finalize(&c);
  return 0;
}

static int scen_coalesced(void) {
  struct fn_comm c;
  if (init_main(&c, 0, g_opt.comm_name)) return 1;
  fn_phase("coalesced");
  for (int i = 0; i < g_opt.ops; i++) {
    if (i % 2 == 0) {
      coalesced(&c, 3, 256, 2);
    } else { /* mixed functions, one level deeper */
      struct fn_group g;
      fn_group_init(&g, 3);
      fn_group_add(&g, &c, FN_ALLREDUCE, 512, FN_BFLOAT16, 0, -1);
      fn_group_add(&g, &c, FN_ALLGATHER, 256, FN_FLOAT32, 0, -1);
      fn_group_add(&g, &c, FN_REDUCESCATTER, 256, FN_FLOAT32, 0, -1);
      fn_group_add(&g, &c, FN_ALLREDUCE, 1 << 20, FN_FLOAT32, 0, -1);
      fn_issue(&g);
    }
    pace();
  }
  fn_comm_finalize(&c);
  return 0;
}

static int scen_graph(void) {
  struct fn_comm c;
  if (init_main(&c, 0, g_opt.comm_name)) return 1;
  fn_phase("graph");
  fn_issue_one(&c, FN_ALLREDUCE, 1024, FN_FLOAT32, 0); /* warm-up, as PyTorch does */
  struct fn_graph *one = capture(&c, 1, 1024), *three = capture(&c, 3, 256);
  for (int i = 0; i < g_opt.ops; i++) {
    fn_graph_replay(one);
    fn_graph_replay(three);
    pace();
  }
  fn_callbacks_drain();
  barrier(&c);
  fn_graph_free(one);
  fn_graph_free(three);
  fn_comm_finalize(&c);
  return 0;
}

/* Two communicators, plus one group spanning both: GroupApi carries the first
 * comm's context and the second comm's CollApi points at it. */
static int scen_multicomm(void) {
  struct fn_comm a, b;
  if (init_main(&a, 0, g_opt.comm_name)) return 1;
  if (init_main(&b, 1, "subgroup")) return 1;
  fn_phase("multicomm");
  for (int i = 0; i < g_opt.ops; i++) {
    fn_issue_one(i % 2 ? &b : &a, FN_ALLREDUCE, 1024, FN_FLOAT32, 0);
    pace();
  }
  struct fn_group g;
  fn_group_init(&g, 2);
  fn_group_add(&g, &a, FN_ALLREDUCE, 1024, FN_FLOAT32, 0, -1);
  fn_group_add(&g, &b, FN_ALLGATHER, 1024, FN_FLOAT32, 0, -1);
  fn_issue(&g);
  fn_comm_finalize(&b);
  barrier(&a);
  fn_comm_finalize(&a);
  return 0;
}

/* ---------------------------------------------------------------- workload */

/* The PyTorch workload of the captures, phase by phase: every phase ends with
 * a barrier (an AllReduce of one float). */
static void workload_collectives(struct fn_comm *c) {
  barrier(c);
  fn_phase("allreduce_small");
  for (int i = 0; i < 3; i++) fn_issue_one(c, FN_ALLREDUCE, 1024, FN_FLOAT32, 0);
  barrier(c);
  fn_phase("allreduce_64MB");
  fn_issue_one(c, FN_ALLREDUCE, 16777216, FN_FLOAT32, 0);
  barrier(c);
  fn_phase("broadcast");
  fn_issue_one(c, FN_BROADCAST, 1024, FN_FLOAT32, 0);
  barrier(c);
  fn_phase("reduce");
  fn_issue_one(c, FN_REDUCE, 1024, FN_FLOAT32, 0);
  barrier(c);
  fn_phase("all_gather");
  fn_issue_one(c, FN_ALLGATHER, 1024, FN_FLOAT32, 0);
  barrier(c);
  fn_phase("reduce_scatter");
  fn_issue_one(c, FN_REDUCESCATTER, 1024, FN_FLOAT32, 0);
  barrier(c);
}

static int scen_workload(void) {
  struct fn_comm c, sub;
  if (init_main(&c, 0, g_opt.comm_name)) return 1;
  workload_collectives(&c);
  fn_phase("all_to_all");
  all_to_all(&c, 1024);
  barrier(&c);
  fn_phase("send_recv");
  batch_send_recv(&c, 1024);
  barrier(&c);
  fn_phase("coalesced_allreduce");
  coalesced(&c, 3, 256, 2);
  barrier(&c);
  fn_phase("subgroup");
  if (init_main(&sub, 1, NULL)) return 1;
  fn_issue_one(&sub, FN_ALLREDUCE, 1024, FN_FLOAT32, 0);
  barrier(&c);
  fn_phase("cuda_graph");
  fn_issue_one(&c, FN_ALLREDUCE, 1024, FN_FLOAT32, 0);
  struct fn_graph *gr = capture(&c, 1, 1024);
  for (int i = 0; i < 3; i++) {
    fn_graph_replay(gr);
    fn_callbacks_drain();
    fn_comm_sync(&c); /* each replay completes before the next, as in the capture */
  }
  barrier(&c);
  fn_comm_sync(&c);
  fn_phase("done");
  fn_graph_free(gr);
  fn_comm_finalize(&c);
  fn_comm_finalize(&sub);
  return 0;
}

/* ---------------------------------------------------------------- threads */

struct tbar {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n, waiting;
  long gen;
};

static void tbar_wait(struct tbar *b) {
  pthread_mutex_lock(&b->mu);
  long gen = b->gen;
  if (++b->waiting == b->n) {
    b->waiting = 0;
    b->gen++;
    pthread_cond_broadcast(&b->cv);
  } else {
    while (gen == b->gen) pthread_cond_wait(&b->cv, &b->mu);
  }
  pthread_mutex_unlock(&b->mu);
}

struct cinit_arg {
  int t;
  struct tbar *bar;
  struct fn_comm *comms;
};

/* Several communicators initialised at once from several threads, as NCCL
 * does for inits inside ncclGroupStart/End. */
static void *cinit_main(void *arg) {
  struct cinit_arg *a = arg;
  int nc = g_opt.comms;
  tbar_wait(a->bar);
  for (int k = 0; k < nc; k++)
    fn_comm_init(&a->comms[k], base_id((uint64_t)(a->t * 1000 + k + 1)), g_opt.rank,
                 g_opt.nranks, NULL);
  tbar_wait(a->bar);
  for (int i = 0; i < g_opt.ops; i++)
    for (int k = 0; k < nc; k++)
      if (a->comms[k].live) fn_issue_one(&a->comms[k], FN_ALLREDUCE, 1024, FN_FLOAT32, 0);
  tbar_wait(a->bar);
  for (int k = 0; k < nc; k++) fn_comm_finalize(&a->comms[k]);
  return NULL;
}

static int run_threads(void *(*fn)(void *), void *args, size_t arg_size, int n) {
  pthread_t *th = calloc((size_t)n, sizeof *th);
  if (!th) abort();
  for (int t = 0; t < n; t++)
    if (pthread_create(&th[t], NULL, fn, (char *)args + (size_t)t * arg_size) != 0) abort();
  for (int t = 0; t < n; t++) pthread_join(th[t], NULL);
  free(th);
  return 0;
}

static int scen_concurrent_init(void) {
  int nt = g_opt.threads, nc = g_opt.comms;
  struct tbar bar = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, nt, 0, 0};
  struct fn_comm *comms = calloc((size_t)(nt * nc), sizeof *comms);
  struct cinit_arg *args = calloc((size_t)nt, sizeof *args);
  if (!comms || !args) abort();
  fn_phase("concurrent_init");
  for (int t = 0; t < nt; t++) args[t] = (struct cinit_arg){t, &bar, comms + t * nc};
  run_threads(cinit_main, args, sizeof *args, nt);
  free(args);
  free(comms);
  return 0;
}

/* ---------------------------------------------------------------- stress */

#define STRESS_GRAPHS 4

struct stress_arg {
  int t;
  uint64_t rng;
  int64_t deadline;
  uint64_t gen;
  struct fn_comm comms[8];
  struct fn_graph *graph[STRESS_GRAPHS];
  struct fn_comm *graph_comm[STRESS_GRAPHS];
};

static size_t stress_count(struct stress_arg *a) {
  static const size_t counts[] = {1, 256, 1024, 65536, 1 << 20};
  return counts[fn_rand_below(&a->rng, sizeof counts / sizeof counts[0])];
}

static void stress_graph(struct stress_arg *a, struct fn_comm *c) {
  int slot = (int)fn_rand_below(&a->rng, STRESS_GRAPHS);
  if (!a->graph[slot]) {
    a->graph[slot] = capture(c, 1 + (int)fn_rand_below(&a->rng, 3), stress_count(a));
    a->graph_comm[slot] = c;
  }
  int n = 1 + (int)fn_rand_below(&a->rng, 3);
  for (int i = 0; i < n; i++) fn_graph_replay(a->graph[slot]);
}

/* Replays may still be queued on the callback thread: drain before freeing. */
static void stress_drop_graphs(struct stress_arg *a, const struct fn_comm *c) {
  fn_callbacks_drain();
  for (int s = 0; s < STRESS_GRAPHS; s++) {
    if (!a->graph[s] || (c && a->graph_comm[s] != c)) continue;
    fn_graph_free(a->graph[s]);
    a->graph[s] = NULL;
  }
}

static void stress_churn(struct stress_arg *a, int k) {
  struct fn_comm *c = &a->comms[k];
  stress_drop_graphs(a, c);
  fn_comm_finalize(c);
  uint64_t salt = ((uint64_t)(a->t + 1) << 40) | (++a->gen << 8) | (uint64_t)k;
  fn_comm_init(c, base_id(salt), g_opt.rank, g_opt.nranks, (a->gen % 2) ? "churn" : NULL);
}

static void stress_step(struct stress_arg *a) {
  int nc = g_opt.comms, k = (int)fn_rand_below(&a->rng, (uint64_t)nc);
  struct fn_comm *c = &a->comms[k];
  unsigned r = (unsigned)fn_rand_below(&a->rng, 100);
  if (!c->live) return;
  if (r < 30) {
    fn_issue_one(c, (int)fn_rand_below(&a->rng, FN_NCOLL), stress_count(a), FN_FLOAT32, 0);
  } else if (r < 42) {
    coalesced(c, 2 + (int)fn_rand_below(&a->rng, 4), stress_count(a), 2);
  } else if (r < 50) {
    all_to_all(c, stress_count(a));
  } else if (r < 58) {
    batch_send_recv(c, stress_count(a));
  } else if (r < 64 && nc > 1) {
    struct fn_group g;
    fn_group_init(&g, 2);
    for (int j = 0; j < nc; j++)
      if (a->comms[j].live) fn_group_add(&g, &a->comms[j], FN_ALLREDUCE, 256, FN_FLOAT32, 0, -1);
    fn_issue(&g);
  } else if (r < 80) {
    stress_graph(a, c);
  } else if (r < 88) {
    struct fn_group g; /* KernelCh may legally arrive before Coll stop */
    fn_group_init(&g, 1);
    g.kc_before_stop = true;
    fn_group_add(&g, c, FN_ALLREDUCE, stress_count(a), FN_FLOAT32, 0, -1);
    fn_issue(&g);
  } else if (r < 97) {
    fn_comm_sync(c);
  } else {
    stress_churn(a, k);
  }
}

static void *stress_main(void *arg) {
  struct stress_arg *a = arg;
  for (int k = 0; k < g_opt.comms; k++)
    fn_comm_init(&a->comms[k], base_id(((uint64_t)(a->t + 1) << 40) | (uint64_t)k), g_opt.rank,
                 g_opt.nranks, NULL);
  while (fn_now_ns() < a->deadline) stress_step(a);
  stress_drop_graphs(a, NULL);
  for (int k = 0; k < g_opt.comms; k++) fn_comm_finalize(&a->comms[k]);
  return NULL;
}

static int scen_stress(void) {
  int nt = g_opt.threads;
  if (g_opt.comms > 8) g_opt.comms = 8;
  struct stress_arg *args = calloc((size_t)nt, sizeof *args);
  if (!args) abort();
  int64_t deadline = fn_now_ns() + (int64_t)(g_opt.seconds * 1e9);
  fn_phase("stress");
  for (int t = 0; t < nt; t++) {
    args[t].t = t;
    args[t].rng = g_opt.seed * 0x9e3779b97f4a7c15ULL + (uint64_t)t;
    args[t].deadline = deadline;
  }
  run_threads(stress_main, args, sizeof *args, nt);
  free(args);
  return 0;
}

/* ---------------------------------------------------------------- dispatch */

int fn_run_scenario(const char *name) {
  static const struct {
    const char *name;
    int (*fn)(void);
  } table[] = {{"basic", scen_basic},           {"p2p", scen_p2p},
               {"coalesced", scen_coalesced},   {"graph", scen_graph},
               {"multicomm", scen_multicomm},   {"workload", scen_workload},
               {"concurrent-init", scen_concurrent_init},
               {"robustness", fn_scen_robustness}, {"abort", fn_scen_abort},
               {"stress", scen_stress},         {"job", fn_scen_job}};
  if (strcmp(name, "replay") == 0) return fn_scen_replay(g_opt.replay_file);
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(table[i].name, name) == 0) {
      int rc = table[i].fn();
      fn_callbacks_shutdown();
      return rc;
    }
  fprintf(stderr, "fake_nccl: unknown scenario '%s'\n", name);
  return 2;
}

/*
 * fake_nccl: what the driver issued, per (comm id, rank), printed as one JSON
 * line on stdout so tests can compare it with the plugin's records.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fake_nccl.h"

/* Proxy threads of a hung job are still counting while the summary prints. */
#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

static pthread_mutex_t g_st_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fn_stats *g_st_head, *g_st_tail;

/* Entries are never freed before exit, so pointers stay valid across comm
 * re-creation and load cycles; the same (id, rank) accumulates. */
struct fn_stats *fn_stats_get(uint64_t comm_id, int rank, int nranks) {
  pthread_mutex_lock(&g_st_mu);
  struct fn_stats *s = g_st_head;
  while (s && !(s->comm_id == comm_id && s->rank == rank)) s = s->next;
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s) abort();
    s->comm_id = comm_id;
    s->rank = rank;
    s->nranks = nranks;
    if (g_st_tail)
      g_st_tail->next = s;
    else
      g_st_head = s;
    g_st_tail = s;
  }
  pthread_mutex_unlock(&g_st_mu);
  return s;
}

void fn_stats_free_all(void) {
  pthread_mutex_lock(&g_st_mu);
  while (g_st_head) {
    struct fn_stats *n = g_st_head->next;
    free(g_st_head);
    g_st_head = n;
  }
  g_st_tail = NULL;
  pthread_mutex_unlock(&g_st_mu);
}

static void print_peers(long *v) {
  putchar('{');
  const char *sep = "";
  for (int p = 0; p < FN_MAX_PEERS; p++) {
    long n = LD(v[p]);
    if (!n) continue;
    printf("%s\"%d\":%ld", sep, p, n);
    sep = ",";
  }
  putchar('}');
}

static void print_funcs(long *v) {
  putchar('{');
  for (int f = 0; f < FN_NCOLL; f++)
    printf("%s\"%s\":%ld", f ? "," : "", fn_func_names[f], LD(v[f]));
  putchar('}');
}

static void print_comm(struct fn_stats *s) {
  printf("{\"comm_id\":\"0x%016llx\",\"rank\":%d,\"nranks\":%d,", (unsigned long long)s->comm_id,
         s->rank, s->nranks);
  printf("\"inits\":%ld,\"finalizes\":%ld,\"init_failures\":%ld,\"groups\":%ld,", LD(s->inits),
         LD(s->finalizes), LD(s->init_failures), LD(s->groups));
  printf("\"colls\":");
  print_funcs(s->colls);
  printf(",\"colls_incomplete\":");
  print_funcs(s->colls_incomplete);
  printf(",\"p2p\":{\"Send\":");
  print_peers(s->send);
  printf(",\"Recv\":");
  print_peers(s->recv);
  printf("},\"p2p_self\":{\"Send\":%ld,\"Recv\":%ld},\"p2p_incomplete\":%ld,", LD(s->self_send),
         LD(s->self_recv), LD(s->p2p_incomplete));
  printf("\"graph_replays\":%ld,\"kernel_ch\":%ld,\"null_context_ops\":%ld,\"irregular\":%ld}",
         LD(s->graph_replays), LD(s->kernel_ch), LD(s->null_ctx_ops), LD(s->irregular));
}

void fn_summary_print(bool hung) {
  printf("{\"driver\":\"fake_nccl\",\"schema\":1,\"pid\":%d,\"abi\":%d,\"scenario\":\"%s\",",
         (int)getpid(), g_opt.abi, g_opt.scenario);
  printf("\"cycles\":%d,\"mask\":\"0x%x\",\"hung\":%s,", g_opt.cycles, fn_mask(),
         hung ? "true" : "false");
  printf("\"events\":{\"start\":%ld,\"stop\":%ld,\"record\":%ld,\"init\":%ld,\"finalize\":%ld,"
         "\"loads\":%ld,\"unloads\":%ld},",
         LD(g_ev.start), LD(g_ev.stop), LD(g_ev.record), LD(g_ev.init), LD(g_ev.finalize),
         LD(g_ev.loads), LD(g_ev.unloads));
  printf("\"comms\":[");
  pthread_mutex_lock(&g_st_mu);
  for (struct fn_stats *s = g_st_head; s; s = s->next) {
    print_comm(s);
    if (s->next) putchar(',');
  }
  pthread_mutex_unlock(&g_st_mu);
  printf("]}\n");
  fflush(stdout);
}

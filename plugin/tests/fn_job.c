/*
 * fake_nccl: one rank of a training-like job. Several driver processes started
 * with the same --comm-id, --nranks and --rendezvous directory (and different
 * --rank) issue the same op sequence, so their sequence numbers match, and
 * share each op's GPU start through the rendezvous file: a rank that arrives
 * late makes every rank's collective end late, as on a real job.
 *
 * Faults (only on --slow-rank, from --slow-from-step on):
 *   host      the host is late: sleep before the API call
 *   gpu       the kernel starts late: delay between launch and GPU start
 *   transfer  the kernel runs long: longer GPU duration
 * --hang-at-step M: at step M, enqueue one op whose kernel never starts, print
 * the summary (with "hung": true) and sleep until killed.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fake_nccl.h"

volatile int g_hung;

static const struct {
  int func;
  size_t count;
} step_ops[] = {
    {FN_ALLGATHER, 1 << 20},     /* parameters (FSDP-style) */
    {FN_ALLREDUCE, 4 << 20},     /* a gradient bucket */
    {FN_REDUCESCATTER, 1 << 20}, /* sharded gradients */
    {FN_ALLREDUCE, 1},           /* the loss, for logging */
};

static void job_faults(struct fn_group *g, int step) {
  if (g_opt.rank != g_opt.slow_rank || step < g_opt.slow_from_step) return;
  int64_t ns = (int64_t)g_opt.slow_us * 1000;
  if (g_opt.slow_cause == FN_SLOW_HOST) g->host_delay_ns = ns;
  if (g_opt.slow_cause == FN_SLOW_GPU) g->gpu_delay_ns = ns;
  if (g_opt.slow_cause == FN_SLOW_TRANSFER) g->xfer_extra_ns = ns;
}

static void job_op(struct fn_comm *c, int step, int i, bool never_start) {
  struct fn_group g;
  fn_group_init(&g, 1);
  g.use_rdv = true;
  g.never_start = never_start;
  job_faults(&g, step);
  fn_group_add(&g, c, step_ops[i].func, step_ops[i].count, FN_FLOAT32, 0, -1);
  fn_issue(&g);
}

static void job_hang(struct fn_comm *c, int step) {
  job_op(c, step, 0, true);
  fprintf(stderr, "fake_nccl: rank %d hangs at step %d (pid %d)\n", g_opt.rank, step,
          (int)getpid());
  __atomic_store_n(&g_hung, 1, __ATOMIC_RELAXED);
  fn_summary_print(true);
  for (;;) pause();
}

int fn_scen_job(void) {
  uint64_t id = g_opt.comm_id_set ? g_opt.comm_id : fn_mix64(g_opt.seed ^ 0x7277ULL);
  struct fn_comm c;
  if (fn_comm_init(&c, id, g_opt.rank, g_opt.nranks, g_opt.comm_name)) return 1;
  if (g_opt.rendezvous && fn_comm_attach_rdv(&c, g_opt.rendezvous)) {
    fprintf(stderr, "fake_nccl: cannot open the rendezvous in %s\n", g_opt.rendezvous);
    fn_comm_finalize(&c);
    return 1;
  }
  fn_phase("job");
  int nops = (int)(sizeof step_ops / sizeof step_ops[0]);
  for (int step = 0; step < g_opt.steps; step++) {
    if (step == g_opt.hang_at_step) job_hang(&c, step);
    /* compute, then its collective; the step ends with the last one: the optimizer
     * step waits for the gradients, so every rank starts the next step together
     * (the last rank to launch the step's last op is the last to leave the sync, so
     * compute after it would keep that rank last by a whole compute interval, step
     * after step, a pattern no training loop has) */
    for (int i = 0; i < nops; i++) {
      fn_sleep_ns(g_opt.interval_sleep_us * 1000);
      job_op(&c, step, i, false);
    }
    fn_comm_sync(&c);
  }
  fn_comm_finalize(&c);
  return 0;
}

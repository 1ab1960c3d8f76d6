/*
 * Bounds on offset = host CLOCK_REALTIME - GPU global timer, per GPU:
 *  - from above: the proxy cannot report a channel event before it happened,
 *    so offset <= host report time - GPU timestamp;
 *  - from below: a kernel cannot start before the host launched it, and NCCL
 *    launches after the application's call returned, so
 *    offset >= API return time - GPU start (not for CUDA-graph replays, whose
 *    kernels do not wait for NCCL's host callback).
 * A lower candidate above the best upper bound is evidence of a stale GPU
 * timestamp, not of the clock, and is discarded. Windows roll every interval;
 * the previous window's bounds still count, so old samples cannot pin the
 * estimate against drift for long. Writer thread only.
 */
#include "rw.h"

#define RW_MAX_DEVICES 64
static rw_clock clocks[RW_MAX_DEVICES + 1]; /* last entry: device unknown */
static bool clocks_ready;

static void reset(rw_clock *clk, int64_t now) {
  clk->lower_cur = clk->lower_prev = INT64_MIN;
  clk->upper_cur = clk->upper_prev = INT64_MAX;
  clk->window_start = now;
  clk->samples = 0;
  clk->valid = false;
}

rw_clock *rw_clock_of(const rw_comm *c) {
  if (!clocks_ready) {
    for (int i = 0; i <= RW_MAX_DEVICES; i++) reset(&clocks[i], rw_now_ns());
    clocks_ready = true;
  }
  return &clocks[c->device >= 0 && c->device < RW_MAX_DEVICES ? c->device : RW_MAX_DEVICES];
}

static int64_t best_upper(const rw_clock *clk) {
  return clk->upper_cur < clk->upper_prev ? clk->upper_cur : clk->upper_prev;
}

void rw_clock_fold(rw_clock *clk, const rw_slot *s, bool graph, int64_t api_end,
                   int64_t gpu_start_raw) {
  int64_t report = LD(&s->kch_report);
  int64_t upper = report ? rw_ticks_to_ns(report) - LD(&s->kch_ptimer) : INT64_MAX;
  if (upper != INT64_MAX) {
    if (upper < clk->upper_cur) clk->upper_cur = upper;
    clk->samples++;
  }
  if (graph || api_end == 0 || gpu_start_raw == 0) return;
  int64_t lower = api_end - gpu_start_raw;
  if (lower <= best_upper(clk) && lower > clk->lower_cur) clk->lower_cur = lower;
}

static bool estimate(int64_t lo, int64_t up, int64_t *offset, int64_t *error) {
  if (up == INT64_MAX) return false;
  if (lo == INT64_MIN) {
    *offset = up; /* bounded above only: report the bound, error unknown */
    *error = -1;
  } else {
    *offset = lo + (up - lo) / 2;
    *error = (up - lo) / 2;
  }
  return true;
}

void rw_clock_update(rw_clock *clk) {
  int64_t up = best_upper(clk);
  int64_t lo = clk->lower_cur > clk->lower_prev ? clk->lower_cur : clk->lower_prev;
  if (lo > up) lo = clk->lower_cur <= up ? clk->lower_cur : INT64_MIN; /* drifted */
  clk->valid = estimate(lo, up, &clk->offset, &clk->error);
}

void rw_clock_roll(int64_t now) {
  if (!clocks_ready) return;
  for (int i = 0; i <= RW_MAX_DEVICES; i++) {
    rw_clock *clk = &clocks[i];
    clk->lower_prev = clk->lower_cur;
    clk->upper_prev = clk->upper_cur;
    clk->lower_cur = INT64_MIN;
    clk->upper_cur = INT64_MAX;
    clk->window_start = now;
    clk->samples = 0;
  }
}

/* Bounds as written in clock records: over both windows. */
void rw_clock_bounds(const rw_clock *clk, int64_t *lo, int64_t *up) {
  *up = best_upper(clk);
  *lo = clk->lower_cur > clk->lower_prev ? clk->lower_cur : clk->lower_prev;
}

/*
 * Hot-path timestamps. Reading CLOCK_REALTIME costs 20 to 50 ns (more in VMs);
 * the CPU's invariant TSC costs a few. Where the TSC is trustworthy (x86-64,
 * constant and non-stop, and the kernel's own clocksource), NCCL's threads
 * store raw ticks and the writer converts them to CLOCK_REALTIME nanoseconds
 * by interpolating between (ticks, realtime) pairs it takes every pass: the
 * conversion follows NTP's adjustments of the wall clock piecewise, and its
 * error is that of one paired read (well under a microsecond). Elsewhere, or
 * with RANKWATCH_CLOCK=realtime, ticks are simply CLOCK_REALTIME nanoseconds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rw.h"

#define RW_CALIB 1024 /* pairs kept: about 20 s at the default drain period */

typedef struct {
  int64_t ticks, ns;
} rw_pair;

static rw_pair calib[RW_CALIB];
static uint32_t ncalib, head; /* ring: oldest at (head - ncalib) */

static bool file_has(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return false;
  char line[4096];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

bool rw_ticks_choose_tsc(const char *setting) {
#if defined(__x86_64__)
  if (setting && strcmp(setting, "realtime") == 0) return false;
  return file_has("/proc/cpuinfo", " constant_tsc") && file_has("/proc/cpuinfo", " nonstop_tsc") &&
         file_has("/sys/devices/system/clocksource/clocksource0/current_clocksource", "tsc");
#else
  (void)setting;
  return false;
#endif
}

static rw_pair paired_read(void) {
  rw_pair best = {0, 0};
  int64_t best_gap = INT64_MAX;
  for (int i = 0; i < 4; i++) { /* keep the tightest of a few brackets */
    int64_t a = rw_now_ns(), t = rw_ticks(), b = rw_now_ns();
    if (b - a < best_gap) {
      best_gap = b - a;
      best = (rw_pair){t, a + (b - a) / 2};
    }
  }
  return best;
}

/* Pairs closer than this would make slopes from two reads' noise (~30 ns). */
#define RW_CALIB_SPACING_NS 10000000LL

static void append(rw_pair p) {
  calib[head] = p;
  head = (head + 1) % RW_CALIB;
  if (ncalib < RW_CALIB) ncalib++;
}

void rw_ticks_calibrate(void) {
  if (!rw_g.tsc) return;
  rw_pair p = paired_read();
  if (ncalib == 0) {
    /* At global init: a first slope from two pairs 2 ms apart (about 30 ppm),
     * good enough until the writer's pairs 10 ms apart take over. */
    append(p);
    int64_t until = p.ns + 2000000;
    while (rw_now_ns() < until) {
    }
    append(paired_read());
    return;
  }
  const rw_pair *last = &calib[(head + RW_CALIB - 1) % RW_CALIB];
  if (p.ticks > last->ticks && p.ns - last->ns >= RW_CALIB_SPACING_NS) append(p);
}

static const rw_pair *pair_at(uint32_t i) { /* i = 0 is the oldest */
  return &calib[(head + RW_CALIB - ncalib + i) % RW_CALIB];
}

static int64_t interpolate(const rw_pair *a, const rw_pair *b, int64_t t) {
  double slope = (double)(b->ns - a->ns) / (double)(b->ticks - a->ticks);
  return a->ns + (int64_t)((double)(t - a->ticks) * slope);
}

int64_t rw_ticks_to_ns(int64_t t) {
  if (!rw_g.tsc || t == 0 || ncalib < 2) return t;
  uint32_t lo = 0, hi = ncalib - 1;
  if (t <= pair_at(0)->ticks) return interpolate(pair_at(0), pair_at(1), t);
  if (t >= pair_at(hi)->ticks) return interpolate(pair_at(hi - 1), pair_at(hi), t);
  while (hi - lo > 1) { /* pair_at(lo) < t < pair_at(hi) */
    uint32_t mid = lo + (hi - lo) / 2;
    if (pair_at(mid)->ticks <= t) lo = mid;
    else hi = mid;
  }
  return interpolate(pair_at(lo), pair_at(hi), t);
}

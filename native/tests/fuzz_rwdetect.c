/* Random and extreme inputs for every rwdetect kernel, for builds under
 * AddressSanitizer and UBSan (tests/detect/test_kernels.py builds and runs it):
 * indices in and out of range, NaN and infinite times, sequence numbers at the
 * int64 limits, empty batches. A kernel must return a count, RWD_OK,
 * RWD_UNORDERED or RWD_RANGE, and read and write only what it was given.
 *
 * usage: fuzz_rwdetect ITERATIONS SEED   (prints "ok: N" on success) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rwdetect.h"

#include "fuzz_random.h"

/* mostly in [0, bound), sometimes just outside or at the limits */
static int64_t index_like(int64_t bound) {
  switch (pick(40)) {
    case 0: return -1;
    case 1: return bound;
    case 2: return INT64_MIN;
    case 3: return INT64_MAX;
    default: return pick(bound);
  }
}

static int64_t int_like(void) {
  switch (pick(12)) {
    case 0: return INT64_MIN;
    case 1: return INT64_MAX;
    case 2: return -pick(1000);
    default: return pick(5000);
  }
}

static double time_like(void) {
  switch (pick(30)) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return -INFINITY;
    case 3: return 1e300;
    default: return (double)pick(1000000);
  }
}

/* exactly n elements (one when n is 0, so that calloc returns a pointer): ASan then
 * sees a read or write one past the end */
#define NEW(T, n) ((T *)calloc((n) > 0 ? (size_t)(n) : 1u, sizeof(T)))

static int ok(int64_t got) { return got >= 0 || got == RWD_UNORDERED || got == RWD_RANGE; }

static int one_round(int64_t n) {
  int64_t n_procs = 1 + pick(6), n_slots = 1 + pick(8), n_funcs = 8, n_comms = 1 + pick(4);
  int64_t *proc = NEW(int64_t, n), *cslot = NEW(int64_t, n), *func = NEW(int64_t, n);
  int64_t *seq = NEW(int64_t, n), *uid = NEW(int64_t, n), *order = NEW(int64_t, n);
  int64_t *comm = NEW(int64_t, n), *rank = NEW(int64_t, n), *peer = NEW(int64_t, n);
  double *arrival = NEW(double, n), *gstart = NEW(double, n), *gend = NEW(double, n);
  uint8_t *p2p = NEW(uint8_t, n), *flags = NEW(uint8_t, n);
  int64_t n_order = 0;
  for (int64_t i = 0; i < n; i++) {
    proc[i] = index_like(n_procs);
    cslot[i] = index_like(n_slots);
    func[i] = index_like(n_funcs);
    comm[i] = index_like(n_comms);
    rank[i] = int_like();
    peer[i] = int_like();
    seq[i] = int_like();
    uid[i] = (int64_t)next();
    arrival[i] = time_like();
    gstart[i] = time_like();
    gend[i] = time_like();
    p2p[i] = (uint8_t)(pick(5) == 0);
    if (!p2p[i] && pick(2)) order[n_order++] = index_like(n);
  }
  int use_order = (int)pick(2);
  int good = 1;

  double *slot_end = NEW(double, n_slots), *slot_start = NEW(double, n_slots);
  double *dscratch = NEW(double, n_slots);
  for (int64_t s = 0; s < n_slots; s++) slot_end[s] = slot_start[s] = time_like();
  good &= ok(rwd_stale(n, cslot, n_slots, arrival, gstart, gend, use_order ? order : NULL,
                       n_order, slot_end, slot_start, flags, dscratch));

  double *ca = NEW(double, n_procs * 3), *ce = NEW(double, n_procs * 3);
  int64_t *cu = NEW(int64_t, n_procs * 3), *prev_uid = NEW(int64_t, n);
  double *gap_g = NEW(double, n), *gap_h = NEW(double, n), *dur = NEW(double, n);
  for (int64_t k = 0; k < n_procs * 3; k++) ca[k] = ce[k] = time_like();
  good &= ok(rwd_gaps(n, proc, n_procs, arrival, gstart, gend, uid, ca, ce, cu, prev_uid, gap_g,
                      gap_h, dur));

  int64_t *last_seq = NEW(int64_t, n_slots * n_funcs), *op_count = NEW(int64_t, n_slots);
  int64_t *idx = NEW(int64_t, n), *iscratch = NEW(int64_t, n_slots);
  for (int64_t k = 0; k < n_slots * n_funcs; k++) last_seq[k] = pick(3) ? -1 : int_like();
  for (int64_t s = 0; s < n_slots; s++) op_count[s] = int_like();
  good &= ok(rwd_op_index(n, p2p, cslot, n_slots, func, n_funcs, seq, arrival,
                          use_order ? order : NULL, n_order, last_seq, op_count, idx,
                          iscratch));

  int64_t comm_class[4], stage[6], slot_base[4], comm_size[4];
  for (int k = 0; k < 4; k++) {
    comm_class[k] = pick(3);
    slot_base[k] = int_like();
    comm_size[k] = int_like();
  }
  for (int k = 0; k < 6; k++) stage[k] = pick(3);
  int32_t *cls32 = NEW(int32_t, n), *stage32 = NEW(int32_t, n);
  int64_t *key = NEW(int64_t, n), *uid2 = NEW(int64_t, n), *sym = NEW(int64_t, n);
  good &= ok(rwd_columns(n, proc, comm, rank, func, seq, peer, n_procs, n_comms, comm_class,
                         stage, slot_base, comm_size, cls32, stage32, flags, key, uid2, sym,
                         idx));

  /* cusum: groups sorted, gstart each group's first element (sometimes broken) */
  int64_t *group = NEW(int64_t, n), *gst = NEW(int64_t, n), *lz = NEW(int64_t, n);
  double *step = NEW(double, n), *carry = NEW(double, n + 1), *c = NEW(double, n);
  double *s = NEW(double, n);
  int64_t g = 0;
  for (int64_t i = 0; i < n; i++) {
    if (i == 0 || pick(4) == 0) {
      if (i) g++;
      gst[i] = i;
    } else {
      gst[i] = gst[i - 1];
    }
    group[i] = g;
    step[i] = pick(50) ? (double)pick(20) - 10.0 : time_like();
    if (pick(60) == 0) gst[i] = index_like(n);
  }
  for (int64_t k = 0; k <= n; k++) carry[k] = pick(2) ? 0.0 : (double)pick(9);
  good &= ok(rwd_cusum(n, step, group, carry, g + 1, gst, s, flags, lz));

  /* instances */
  int64_t cap = 2;
  while (cap < 2 * n) cap *= 2;
  int64_t *table = NEW(int64_t, cap), *inst = NEW(int64_t, n), *prev_inst = NEW(int64_t, n);
  int64_t *inst_seg = NEW(int64_t, n), *inst_uid = NEW(int64_t, n), *seg = NEW(int64_t, n);
  double *inst_end = NEW(double, n);
  for (int64_t k = 0; k < cap; k++) table[k] = -1;
  for (int64_t i = 0; i < n; i++) {
    seg[i] = pick(4);
    uid[i] = pick(20);
    prev_uid[i] = pick(25);
  }
  int64_t n_inst = rwd_instances(n, uid, seg, gend, prev_uid, pick(10) ? cap : cap - 1, table,
                                 inst, prev_inst, inst_seg, inst_uid, inst_end);
  good &= ok(n_inst) && n_inst <= n;

  /* straggler: runs per rank over the judged ops idx (some out of range) */
  int64_t m = pick(n + 1), fired_max = m > 0 ? m : 1;
  int64_t *ridx = NEW(int64_t, m), *run_st = NEW(int64_t, n_procs), *miss_st = NEW(int64_t, n_procs);
  int64_t *tail = NEW(int64_t, n_procs), *f_rec = NEW(int64_t, fired_max + n);
  int64_t *f_run = NEW(int64_t, fired_max + n), *f_start = NEW(int64_t, fired_max + n);
  int64_t *rkey = NEW(int64_t, m), *rgap = NEW(int64_t, m + n_procs);
  int64_t *rcount = NEW(int64_t, n_procs + 1);
  uint8_t *hit = NEW(uint8_t, n), *pair = NEW(uint8_t, n);
  int64_t *rproc = NEW(int64_t, n);
  int wild = pick(4) == 0; /* a round with indices out of range, now and then */
  for (int64_t j = 0; j < m; j++) ridx[j] = wild && !pick(50) ? index_like(n) : pick(n);
  for (int64_t i = 0; i < n; i++) {
    rproc[i] = wild && !pick(50) ? index_like(n_procs) : pick(n_procs);
    hit[i] = (uint8_t)(pick(3) == 0);
    pair[i] = (uint8_t)(pick(4) == 0);
  }
  for (int64_t p = 0; p < n_procs; p++) {
    run_st[p] = pick(5);
    miss_st[p] = pick(5);
  }
  int64_t got = rwd_rank_runs(m, ridx, n, rproc, n_procs, gstart, hit, pair, 1 + pick(4),
                              pick(2) ? INT64_MAX : 1 + pick(6), run_st, miss_st, tail, f_rec,
                              f_run, f_start, rkey, rgap, rcount);
  good &= ok(got) && got <= m;
  good &= wild || got >= 0;

  /* straggler: per-(rank, slot) state; flat in range for most ok records, seq
   * mostly ascending per flat (else declined) */
  int64_t n_flat = 1 + pick(12), learn = 1 + pick(5);
  int64_t *flat = NEW(int64_t, n), *nobs = NEW(int64_t, n_flat), *run_s = NEW(int64_t, n_flat);
  double *excess = NEW(double, n), *sigma = NEW(double, n), *thr = NEW(double, n);
  double *lx = NEW(double, n_flat * learn), *lsig = NEW(double, n_flat * learn);
  double *base = NEW(double, n_flat), *cus = NEW(double, n_flat), *last_z = NEW(double, n_flat);
  double *run_at = NEW(double, n_flat * 4), *cus_at = NEW(double, n_flat * 4);
  double *resid = NEW(double, n), *f_s = NEW(double, n), *f_z1 = NEW(double, n);
  double *f_carried = NEW(double, 8 * n), *fz = NEW(double, 4 * n_flat), *tmp = NEW(double, learn);
  int64_t *f_cs = NEW(int64_t, n), *fs = NEW(int64_t, 4 * n_flat), *sorted_seq = NEW(int64_t, n);
  uint8_t *okf = NEW(uint8_t, n), *head = NEW(uint8_t, n);
  for (int64_t i = 0; i < n; i++) {
    okf[i] = (uint8_t)(pick(6) != 0);
    flat[i] = wild && !pick(40) ? index_like(n_flat) : pick(n_flat);
    sorted_seq[i] = wild && !pick(30) ? int_like() : i;
    excess[i] = pick(20) ? (double)pick(2000) - 500.0 : time_like();
    sigma[i] = pick(20) ? 1.0 + (double)pick(100) : time_like();
    thr[i] = pick(20) ? 6.0 * sigma[i] : time_like();
  }
  for (int64_t f = 0; f < n_flat; f++) {
    nobs[f] = pick(3) ? pick(learn + 2) : int_like() & 0xff;
    run_s[f] = pick(4);
    cus[f] = pick(2) ? 0.0 : (double)pick(20);
    base[f] = (double)pick(100) - 50.0;
    last_z[f] = (double)pick(10);
  }
  for (int64_t k = 0; k < n_flat * learn; k++) lx[k] = lsig[k] = pick(5) ? (double)pick(50) : NAN;
  for (int64_t k = 0; k < n_flat * 4; k++) run_at[k] = cus_at[k] = -1.0;
  got = rwd_slot_state(n, flat, n_flat, okf, sorted_seq, excess, sigma, thr, learn, 6.0, 1.5,
                       1 + pick(3), 15.0, nobs, lx, lsig, base, run_s, cus, run_at, cus_at,
                       last_z, comm, func, arrival, resid, flags, head, f_rec, f_run, f_s,
                       f_start, f_cs, f_z1, f_carried, fs, fz, tmp);
  good &= ok(got) && got <= n;
  good &= wild || got >= 0; /* in range and in order: never declined */
  free(rproc); free(ridx); free(run_st); free(miss_st); free(tail); free(f_rec); free(f_run); free(f_start);
  free(rkey); free(rgap); free(rcount); free(hit); free(pair); free(flat); free(nobs);
  free(run_s); free(excess); free(sigma); free(thr); free(lx); free(lsig); free(base); free(cus);
  free(last_z); free(run_at); free(cus_at); free(resid); free(f_s); free(f_z1); free(f_carried);
  free(fz); free(tmp); free(f_cs); free(fs); free(sorted_seq); free(okf); free(head);

  /* the two latest records of each instance: starts mostly ascending */
  int64_t n_two = pick(n + 1);
  int64_t *two_start = NEW(int64_t, n_two), *two_last = NEW(int64_t, n_two);
  int64_t *two_second = NEW(int64_t, n_two);
  for (int64_t k = 0, at = 0; k < n_two; k++) {
    two_start[k] = pick(40) ? at : index_like(n);
    at += pick(3);
  }
  good &= ok(rwd_top_two(n_two, two_start, n, gstart, two_last, two_second));
  free(two_start); free(two_last); free(two_second);

  /* replay over those instances, prev pointing back (sometimes forward) */
  if (n_inst > 0) {
    int64_t *starts = NEW(int64_t, n_inst), *prevq = NEW(int64_t, n);
    double *g_max = NEW(double, n_inst), *cut = NEW(double, n_inst);
    double *shift = NEW(double, n_inst);
    int64_t r = 0;
    for (int64_t p = 0; p < n_inst; p++) {
      starts[p] = r < n ? r : n - 1;
      int64_t count = 1 + pick(3);
      for (int64_t k = 0; k < count && r < n; k++, r++)
        prevq[r] = p > 0 && pick(3) ? pick(p) : (pick(30) ? -1 : p + pick(3));
      g_max[p] = time_like();
      cut[p] = pick(3) ? 0.0 : time_like();
    }
    good &= ok(rwd_replay(n_inst, starts, r, gstart, prevq, gend, g_max, cut, shift));
    free(starts); free(prevq); free(g_max); free(cut); free(shift);
  }

  free(proc); free(cslot); free(func); free(seq); free(uid); free(order); free(comm);
  free(rank); free(peer); free(arrival); free(gstart); free(gend); free(p2p); free(flags);
  free(slot_end); free(slot_start); free(dscratch); free(ca); free(ce); free(cu);
  free(prev_uid); free(gap_g); free(gap_h); free(dur); free(last_seq); free(op_count);
  free(idx); free(iscratch); free(cls32); free(stage32); free(key); free(uid2); free(sym);
  free(group); free(gst); free(lz); free(step); free(carry); free(c); free(s); free(table);
  free(inst); free(prev_inst); free(inst_seg); free(inst_uid); free(seg); free(inst_end);
  return good;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ITERATIONS SEED\n", argv[0]);
    return 2;
  }
  long iterations = strtol(argv[1], NULL, 10);
  state = strtoull(argv[2], NULL, 10);
  for (long i = 0; i < iterations; i++) {
    int64_t n = pick(10) == 0 ? 0 : 1 + pick(300);
    if (!one_round(n)) {
      printf("bad return code at iteration %ld\n", i);
      return 1;
    }
  }
  printf("ok: %ld\n", iterations);
  return 0;
}

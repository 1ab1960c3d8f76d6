/* rwdetect: compiled kernels of rankwatch's streaming detectors.
 *
 * rankwatch.detect.kernels loads this library with ctypes. Each kernel is the
 * sequential form of a NumPy computation in rankwatch/detect/ that NumPy can
 * only express with sorts and a dozen passes over every record; the NumPy form
 * stays in place as the fallback (and as the reference the tests compare with).
 *
 * Conventions: arrays are C-contiguous int64/double/uint8 of the length given;
 * `order`, where a kernel takes one, lists the record indices to visit (NULL:
 * 0..n-1, the stream order). A kernel validates every index it will use before
 * it changes any state, and returns RWD_RANGE without touching anything when
 * one is out of range, so a caller can fall back to NumPy (which raises).
 * RWD_UNORDERED likewise means "nothing changed: the records are not in the
 * order this kernel needs without `order`".
 *
 * No allocation, no global state: thread-compatible.
 */
#include <math.h>
#include <float.h>
#include <stddef.h>
#include <stdint.h>

#include "rwdetect.h"

#define RWD_EXPORT __attribute__((visibility("default")))

#define LOOKBACK 3             /* prepare.LOOKBACK */
#define STALE_SLACK_NS 2000.0  /* prepare.STALE_SLACK_NS */
#define REL_MAX 1099511627775.0 /* 2**40 - 1, prepare._op_index's clip */
#define REL_SHIFT 17           /* prepare._op_index's coarsening */

static int in_range(int64_t v, int64_t bound) { return v >= 0 && v < bound; }

/* int64 arithmetic that wraps as NumPy's does (signed overflow is undefined in C) */
static int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t wrap_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static int64_t wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

/* `order` (when given) and the group ids its records use are all in range. */
static int check_groups(int64_t n, const int64_t *order, int64_t n_order,
                        const int64_t *group, int64_t bound) {
  int64_t m = order ? n_order : n;
  for (int64_t j = 0; j < m; j++) {
    int64_t i = order ? order[j] : j;
    if (!in_range(i, n) || !in_range(group[i], bound)) return 0;
  }
  return 1;
}

/* NaN sorts last (numpy.nan_to_num(..., nan=inf) in the reference). */
static double nan_last(double v) { return isnan(v) ? INFINITY : v; }

/* Stale GPU starts (prepare.Preparer._stale_starts): in each (communicator,
 * rank) slot's arrival order, a start before the previous op's end (beyond
 * the slack) that is not shared with it, or after the op's own end, belongs
 * to an earlier op. Sets stale[i] (0/1) and returns how many; carries each
 * slot's last end and start in slot_end/slot_start. Without `order`, the
 * stream order must already be the arrival order within every slot
 * (`scratch`: n_slots doubles, overwritten), else RWD_UNORDERED. */
RWD_EXPORT int64_t rwd_stale(int64_t n, const int64_t *cslot, int64_t n_slots,
                             const double *arrival, const double *gstart,
                             const double *gend, const int64_t *order, int64_t n_order,
                             double *slot_end, double *slot_start, uint8_t *stale,
                             double *scratch) {
  if (!check_groups(n, order, n_order, cslot, n_slots)) return RWD_RANGE;
  if (!order) {
    for (int64_t s = 0; s < n_slots; s++) scratch[s] = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
      double a = nan_last(arrival[i]);
      if (a < scratch[cslot[i]]) return RWD_UNORDERED;
      scratch[cslot[i]] = a;
    }
  }
  int64_t m = order ? n_order : n, count = 0;
  for (int64_t i = 0; i < n; i++) stale[i] = 0;
  for (int64_t j = 0; j < m; j++) {
    int64_t i = order ? order[j] : j, s = cslot[i];
    double gs = gstart[i], ge = gend[i];
    /* comparisons with NaN are false and NaN != x is true, as in NumPy */
    int bad = ((gs + STALE_SLACK_NS < slot_end[s]) && (gs != slot_start[s])) || (gs > ge);
    stale[i] = (uint8_t)bad;
    count += bad;
    slot_end[s] = ge;
    slot_start[s] = gs;
  }
  return count;
}

/* Clock-free local segments (prepare.Preparer._gaps), in stream order: each
 * op's e_prev is the latest GPU end among its process's last LOOKBACK ops that
 * arrived before it and ended before its GPU start (its arrival when the start
 * is unknown); ties go to the nearer op. carry_* hold each process's last
 * LOOKBACK ops, oldest first (n_procs x LOOKBACK, row-major), and are updated.
 * Writes prev_uid (0: none), gap_g = gstart - e_prev, gap_h = arrival -
 * e_prev and dur = gend - gstart. */
RWD_EXPORT int64_t rwd_gaps(int64_t n, const int64_t *proc, int64_t n_procs,
                            const double *arrival, const double *gstart, const double *gend,
                            const int64_t *uid, double *carry_arrival, double *carry_gend,
                            int64_t *carry_uid, int64_t *prev_uid, double *gap_g,
                            double *gap_h, double *dur) {
  if (!check_groups(n, NULL, 0, proc, n_procs)) return RWD_RANGE;
  for (int64_t i = 0; i < n; i++) {
    int64_t base = proc[i] * LOOKBACK;
    double *ca = carry_arrival + base, *ce = carry_gend + base;
    int64_t *cu = carry_uid + base;
    double arr = arrival[i], gs = gstart[i], ge = gend[i];
    double cut = isfinite(gs) ? gs : arr;
    double best = -INFINITY;
    int64_t best_uid = 0;
    for (int k = LOOKBACK - 1; k >= 0; k--) { /* newest first */
      if (ca[k] < arr && ce[k] <= cut && ce[k] > best) {
        best = ce[k];
        best_uid = cu[k];
      }
    }
    double e_prev = isfinite(best) ? best : NAN;
    prev_uid[i] = best_uid;
    gap_g[i] = gs - e_prev;
    gap_h[i] = arr - e_prev;
    dur[i] = ge - gs;
    for (int k = 0; k < LOOKBACK - 1; k++) {
      ca[k] = ca[k + 1];
      ce[k] = ce[k + 1];
      cu[k] = cu[k + 1];
    }
    ca[LOOKBACK - 1] = arr;
    ce[LOOKBACK - 1] = ge;
    cu[LOOKBACK - 1] = uid[i];
  }
  return RWD_OK;
}

/* numpy.nan_to_num's finite stand-ins */
static double finite_or(double v) {
  if (isnan(v)) return 0.0;
  if (isinf(v)) return v > 0 ? DBL_MAX : -DBL_MAX;
  return v;
}

/* The issue-order key of prepare.Preparer._op_index: the arrival, relative to
 * the batch's earliest collective, clipped to 40 bits and coarsened. */
static int64_t issue_key(double t, double t0) {
  double rel = finite_or(t) - t0;
  if (!(rel > 0.0)) rel = 0.0;
  if (rel > REL_MAX) rel = REL_MAX;
  return ((int64_t)rel) >> REL_SHIFT;
}

/* Each collective's index among its (communicator, rank) slot's collectives in
 * issue order (prepare.Preparer._op_index and _gaps_in_seq): a gap in a
 * function's sequence numbers counts the ops it skipped, and an op arriving
 * below its function's highest seq so far (a record delivered late) gets -1 and
 * counts nothing. P2P records get -1. last_seq (n_slots x n_funcs) and
 * op_count (n_slots) are carried and updated. Without `order`, each slot's
 * collectives must stream in issue order (`scratch`: n_slots int64,
 * overwritten), else RWD_UNORDERED; `order` lists the collectives only. */
RWD_EXPORT int64_t rwd_op_index(int64_t n, const uint8_t *p2p, const int64_t *cslot,
                                int64_t n_slots, const int64_t *func, int64_t n_funcs,
                                const int64_t *seq, const double *arrival_c,
                                const int64_t *order, int64_t n_order, int64_t *last_seq,
                                int64_t *op_count, int64_t *idx, int64_t *scratch) {
  int64_t m = order ? n_order : n;
  for (int64_t j = 0; j < m; j++) {
    int64_t i = order ? order[j] : j;
    if (!in_range(i, n)) return RWD_RANGE;
    if (p2p[i] && order) return RWD_RANGE;
    if (!p2p[i] && (!in_range(cslot[i], n_slots) || !in_range(func[i], n_funcs)))
      return RWD_RANGE;
  }
  if (!order) {
    double t0 = INFINITY;
    for (int64_t i = 0; i < n; i++)
      if (!p2p[i] && finite_or(arrival_c[i]) < t0) t0 = finite_or(arrival_c[i]);
    for (int64_t s = 0; s < n_slots; s++) scratch[s] = -1;
    for (int64_t i = 0; i < n; i++) {
      if (p2p[i]) continue;
      int64_t key = issue_key(arrival_c[i], t0);
      if (key < scratch[cslot[i]]) return RWD_UNORDERED;
      scratch[cslot[i]] = key;
    }
  }
  for (int64_t i = 0; i < n; i++) idx[i] = -1;
  for (int64_t j = 0; j < m; j++) {
    int64_t i = order ? order[j] : j;
    if (p2p[i]) continue;
    int64_t s = cslot[i], q = seq[i];
    int64_t *last = last_seq + s * n_funcs + func[i];
    int64_t prev = *last;
    int64_t missing = 0;
    int late = 0;
    if (prev >= 0) {
      int64_t gap = wrap_sub(wrap_sub(q, prev), 1);
      missing = gap > 0 ? gap : 0;
      late = q < prev;
    }
    if (q > *last) *last = q;
    if (late) continue;
    idx[i] = wrap_add(op_count[s], missing);
    op_count[s] = wrap_add(op_count[s], wrap_add(1, missing));
  }
  return RWD_OK;
}

/* The what-if replay of cost.Steps (cost.Steps._replay): instances in an order
 * where every instance comes after the one each of its records points at
 * (`prev`, -1: none), records grouped by instance (`starts[p]`: the first
 * record of instance p; they run to the next instance's first, or n_rec). Each
 * record starts when its process's previous op ends, replayed, plus its own
 * segment shortened by dgap; the instance ends when its last member starts,
 * less the transfer cut, so shift[p] = min(0, latest replayed start - g_max[p]
 * - cut[p]). The same arithmetic as the NumPy form, in the same order, so the
 * results are the same doubles (NaN propagates as numpy.maximum/minimum do). */
RWD_EXPORT int64_t rwd_replay(int64_t n_inst, const int64_t *starts, int64_t n_rec,
                              const double *g, const int64_t *prev, const double *dgap,
                              const double *g_max, const double *cut, double *shift) {
  for (int64_t p = 0; p < n_inst; p++) {
    int64_t lo = starts[p], hi = p + 1 < n_inst ? starts[p + 1] : n_rec;
    if (lo < 0 || hi > n_rec || lo >= hi) return RWD_RANGE;
    for (int64_t r = lo; r < hi; r++)
      if (prev[r] >= p) return RWD_RANGE;
  }
  for (int64_t p = 0; p < n_inst; p++) {
    int64_t lo = starts[p], hi = p + 1 < n_inst ? starts[p + 1] : n_rec;
    double top = 0.0;
    for (int64_t r = lo; r < hi; r++) {
      double v = g[r] + (prev[r] >= 0 ? shift[prev[r]] : 0.0) - dgap[r];
      if (r == lo || (!isnan(top) && (isnan(v) || v > top))) top = v; /* NaN sticks */
    }
    double x = top - g_max[p] - cut[p];
    shift[p] = (isnan(x) || x < 0.0) ? x : 0.0;
  }
  return RWD_OK;
}

#define FUNC_SEND 5    /* topology.SEND */
#define FUNC_RECV 6    /* topology.RECV */
#define SEQ_BITS 40    /* prepare.SEQ_BITS */
#define UID_MIX 0x9E3779B97F4A7C15ULL /* prepare.MIX */

/* The derived columns of prepare.Preparer.__call__ (cohort_keys, instance_uid,
 * sym, cslot), in one pass: class and stage looked up, the cohort key (class and
 * function code over the sequence number; for P2P the sender, receiver and the
 * sequence number's low bits), the instance uid (the key mixed with the
 * communicator), the op's symbol (class, function, P2P direction) and its
 * (communicator, rank) slot. Unsigned arithmetic where NumPy's int64 wraps. */
RWD_EXPORT int64_t rwd_columns(int64_t n, const int64_t *proc, const int64_t *comm,
                               const int64_t *rank, const int64_t *func, const int64_t *seq,
                               const int64_t *peer, int64_t n_procs, int64_t n_comms,
                               const int64_t *comm_class, const int64_t *proc_stage,
                               const int64_t *slot_base, const int64_t *comm_size,
                               int32_t *cls, int32_t *stage, uint8_t *p2p, int64_t *key,
                               int64_t *uid, int64_t *sym, int64_t *cslot) {
  for (int64_t i = 0; i < n; i++)
    if (!in_range(proc[i], n_procs) || !in_range(comm[i], n_comms)) return RWD_RANGE;
  for (int64_t i = 0; i < n; i++) {
    int64_t c = comm[i], f = func[i], r = rank[i], q = seq[i];
    int64_t k = comm_class[c];
    int is_p2p = f == FUNC_SEND || f == FUNC_RECV;
    uint64_t code = (uint64_t)wrap_add(wrap_mul(k, 8), is_p2p ? FUNC_SEND : f);
    uint64_t payload;
    if (is_p2p) {
      uint64_t sender = (uint64_t)(f == FUNC_RECV ? peer[i] : r);
      uint64_t receiver = (uint64_t)(f == FUNC_RECV ? r : peer[i]);
      payload = ((sender & 0xFFF) << 28) | ((receiver & 0xFFF) << 16) | ((uint64_t)q & 0xFFFF);
    } else {
      payload = (uint64_t)q & ((1ULL << SEQ_BITS) - 1);
    }
    uint64_t kk = (code << SEQ_BITS) | payload;
    int64_t direction = is_p2p ? (peer[i] > r ? 1 : 2) : 0;
    int64_t last = wrap_sub(comm_size[c], 1);
    cls[i] = (int32_t)k;
    stage[i] = (int32_t)proc_stage[proc[i]];
    p2p[i] = (uint8_t)is_p2p;
    key[i] = (int64_t)kk;
    uid[i] = (int64_t)(kk * UID_MIX + (uint64_t)c);
    sym[i] = wrap_add(wrap_mul(wrap_add(wrap_mul(k, 8), f), 4), direction);
    cslot[i] = wrap_add(slot_base[c], r < last ? r : last);
  }
  return RWD_OK;
}

/* robust.cusum_lazy's arrays, with the same operations in the same order (so the
 * same doubles): S = max(0, S_prev + step) per group (elements sorted by group,
 * then time), computed as C_t - min(min C_k, -carry) from the within-group
 * cumulative sum C, groups kept apart by an offset of `big` per group id as the
 * NumPy form does. gid: `group` itself when dense, else counted at each group's
 * first element. Writes s, zero (S at 0) and last_zero (the latest element at 0
 * so far, -1: none); `c` is scratch of n doubles. */
static double np_min(double a, double b) {
  if (isnan(a)) return a;
  if (isnan(b)) return b;
  return a < b ? a : b;
}

RWD_EXPORT int64_t rwd_cusum(int64_t n, const double *step, const int64_t *group,
                             const double *carry, int64_t n_carry, const int64_t *gstart,
                             int64_t dense, double *c, double *s, uint8_t *zero,
                             int64_t *last_zero) {
  for (int64_t i = 0; i < n; i++)
    if (!in_range(group[i], n_carry) || gstart[i] < 0 || gstart[i] > i) return RWD_RANGE;
  double total = 0.0;
  for (int64_t i = 0; i < n; i++) {
    total += step[i];
    c[i] = total; /* numpy.cumsum: sequential */
  }
  /* C_t = total_t - (total - step)[gstart]: backwards, so that c[gstart] (never
   * after t) still holds the cumulative sum when it is read */
  for (int64_t i = n - 1; i >= 0; i--) c[i] = c[i] - (c[gstart[i]] - step[gstart[i]]);
  double max_c = 0.0, max_carry = 0.0;
  for (int64_t i = 0; i < n; i++)
    if (fabs(c[i]) > max_c || isnan(c[i])) max_c = fabs(c[i]);
  for (int64_t g = 0; g < n_carry; g++)
    if (fabs(carry[g]) > max_carry || isnan(carry[g])) max_carry = fabs(carry[g]);
  double big = 4.0 * (max_c + max_carry + 1.0);
  double tiny = 1e-9 * big, low = 0.0;
  int64_t gid = -1, lz = -1;
  for (int64_t i = 0; i < n; i++) {
    if (dense) gid = group[i];
    else if (gstart[i] == i) gid++;
    double offset = (double)gid * big;
    double y = np_min(c[i], -carry[group[i]]) - offset;
    low = i == 0 ? y : np_min(low, y); /* numpy.minimum.accumulate */
    double v = c[i] - (low + offset);
    int at_zero = v <= tiny;
    s[i] = at_zero ? 0.0 : v;
    zero[i] = (uint8_t)at_zero;
    if (at_zero) lz = i;
    last_zero[i] = lz;
  }
  return RWD_OK;
}

/* The instances of cost.Steps._build: records of one uid in one step. Numbers
 * them by first appearance (inst, n_inst returned), with each instance's step,
 * uid and latest GPU end (max of its records' gend, numpy.maximum's NaN rule),
 * and finds the instance each record's prev_uid names in the record's own step
 * (prev_inst, -1: none there). An open-addressing table of `cap` slots (a power
 * of two, at least twice n; table_inst filled with -1 by the caller) maps
 * (uid, step) to the instance. inst_seg/inst_uid/inst_end hold n entries. */
static uint64_t slot_of(int64_t uid, int64_t seg, uint64_t mask) {
  uint64_t h = ((uint64_t)uid ^ ((uint64_t)seg * 0xC2B2AE3D27D4EB4FULL)) * UID_MIX;
  return (h >> 17) & mask;
}

static int64_t lookup(int64_t uid, int64_t seg, uint64_t mask, const int64_t *inst_uid,
                      const int64_t *inst_seg, const int64_t *table, uint64_t *at) {
  uint64_t k = slot_of(uid, seg, mask);
  while (table[k] >= 0) {
    int64_t j = table[k];
    if (inst_uid[j] == uid && inst_seg[j] == seg) break;
    k = (k + 1) & mask;
  }
  *at = k;
  return table[k];
}

RWD_EXPORT int64_t rwd_instances(int64_t n, const int64_t *uid, const int64_t *seg,
                                 const double *gend, const int64_t *prev_uid, int64_t cap,
                                 int64_t *table, int64_t *inst, int64_t *prev_inst,
                                 int64_t *inst_seg, int64_t *inst_uid, double *inst_end) {
  if (cap < 2 * n || cap < 1 || (cap & (cap - 1)) != 0) return RWD_RANGE;
  uint64_t mask = (uint64_t)cap - 1, at;
  int64_t count = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t j;
    if (i > 0 && uid[i] == uid[i - 1] && seg[i] == seg[i - 1]) { /* runs: the usual case */
      j = inst[i - 1];
    } else {
      j = lookup(uid[i], seg[i], mask, inst_uid, inst_seg, table, &at);
    }
    if (j < 0) {
      j = count++;
      table[at] = j;
      inst_uid[j] = uid[i];
      inst_seg[j] = seg[i];
      inst_end[j] = -INFINITY;
    }
    inst[i] = j;
    double e = gend[i], top = inst_end[j];
    if (!isnan(top) && (isnan(e) || e > top)) inst_end[j] = e;
  }
  for (int64_t i = 0; i < n; i++)
    prev_inst[i] = lookup(prev_uid[i], seg[i], mask, inst_uid, inst_seg, table, &at);
  return count;
}

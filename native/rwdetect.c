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
#include "rwsort.h"

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

static double np_min(double a, double b) { /* numpy.minimum: NaN wins */
  if (isnan(a)) return a;
  if (isnan(b)) return b;
  return a < b ? a : b;
}

/* One step of the CUSUM S = max(0, S_prev + step) of a group, in the form of
 * robust._cusum_arrays: S_t = C_t - min(min_{k<=t} C_k, -carry), C the running
 * sum of the group's steps. *c and *m (C and its running minimum) are the
 * group's state; `first` starts it (C is the first step itself, as
 * numpy.add.accumulate's is). Returns S (0 exactly at the minimum). */
static double cusum_step(double step, double carry, int first, double *c, double *m) {
  *c = first ? step : *c + step;
  *m = first ? *c : np_min(*m, *c);
  double v = *c - np_min(*m, -carry);
  return v <= 0.0 ? 0.0 : v;
}

/* robust.cusum_lazy's arrays over elements sorted by group, then time
 * (gstart[i]: the first element of i's group): S per element (cusum_step),
 * zero (S at 0) and last_zero (the latest element at 0 so far, -1: none). The
 * same doubles as the NumPy form, which sums group by group in the same order. */
RWD_EXPORT int64_t rwd_cusum(int64_t n, const double *step, const int64_t *group,
                             const double *carry, int64_t n_carry, const int64_t *gstart,
                             double *s, uint8_t *zero, int64_t *last_zero) {
  for (int64_t i = 0; i < n; i++)
    if (!in_range(group[i], n_carry) || gstart[i] < 0 || gstart[i] > i ||
        (gstart[i] != i && (i == 0 || gstart[i] != gstart[i - 1])))
      return RWD_RANGE;
  double c = 0.0, m = 0.0;
  int64_t lz = -1;
  for (int64_t i = 0; i < n; i++) {
    s[i] = cusum_step(step[i], carry[group[i]], gstart[i] == i, &c, &m);
    zero[i] = (uint8_t)(s[i] == 0.0);
    if (zero[i]) lz = i;
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

/* ---------------------------------------------------------------- straggler */

#define POS_BITS 27 /* straggler._time_order's (time << 27) | position */

/* An op's place in straggler._time_order within its process: its GPU start to
 * 16 ns from the batch's earliest, then its position in idx. */
static int64_t time_key(double gstart, double t_min, int64_t pos) {
  double d = finite_or(gstart) - t_min;
  if (!(d > 0.0)) d = 0.0;
  if (d > REL_MAX) d = REL_MAX;
  return ((int64_t)d >> 4 << POS_BITS) | pos;
}

/* Runs of late ops per process over its judged ops in time order
 * (straggler.StragglerDetector._rank_persistence). The records idx[0..m) are
 * taken in the order of straggler._time_order: by proc, GPU start to 16 ns
 * from the earliest, position in idx. Per process: the run of consecutive late
 * ops (hit), carried in run_state, and the judged ops since its last late op,
 * carried in miss_state, both updated for the processes present. Every late
 * op whose run reaches need_pair (pair[record]) or need_solo fires: fired_rec,
 * fired_run, fired_start (the record the run began at; -1: before this
 * batch), their count returned, in that order. tail_start[p] = where the run p
 * ends this batch in began (-1: before it), -2 when its last op was not late,
 * -3 when p had no op here.
 *
 * Late ops are rare, so only they are sorted: an op that is not late breaks
 * the run at the late op after it in time, found by a binary search among its
 * process's late ops (as straggler._runs_at_hits does in NumPy). Scratch: key
 * (m), gap (m + n_procs), count (n_procs + 1). */
RWD_EXPORT int64_t rwd_rank_runs(int64_t m, const int64_t *idx, int64_t n, const int64_t *proc,
                                 int64_t n_procs, const double *gstart, const uint8_t *hit,
                                 const uint8_t *pair, int64_t need_solo, int64_t need_pair,
                                 int64_t *run_state, int64_t *miss_state, int64_t *tail_start,
                                 int64_t *fired_rec, int64_t *fired_run, int64_t *fired_start,
                                 int64_t *key, int64_t *gap, int64_t *count) {
  if (m < 0 || m >= ((int64_t)1 << POS_BITS) || n_procs < 0) return RWD_RANGE;
  for (int64_t j = 0; j < m; j++)
    if (!in_range(idx[j], n) || !in_range(proc[idx[j]], n_procs)) return RWD_RANGE;
  double t_min = INFINITY;
  for (int64_t j = 0; j < m; j++) {
    double t = finite_or(gstart[idx[j]]);
    if (t < t_min) t_min = t;
  }
  /* the late ops, by process (count: their end per process), each's key sorted */
  for (int64_t p = 0; p <= n_procs; p++) count[p] = 0;
  int64_t n_hits = 0;
  for (int64_t j = 0; j < m; j++)
    if (hit[idx[j]]) count[proc[idx[j]] + 1]++, n_hits++;
  for (int64_t p = 0; p < n_procs; p++) count[p + 1] += count[p];
  for (int64_t j = 0; j < m; j++)
    if (hit[idx[j]]) key[count[proc[idx[j]]]++] = time_key(gstart[idx[j]], t_min, j);
  for (int64_t p = 0, begin = 0; p < n_procs; begin = count[p], p++) {
    int sorted = 1;
    for (int64_t q = begin + 1; q < count[p] && sorted; q++) sorted = key[q] > key[q - 1];
    if (!sorted) rw_sort_i64(key + begin, count[p] - begin);
  }
  /* gap[h]: an op not late just before late op h (h = a process's end: after
   * its last); tail_start doubles as each process's op count meanwhile */
  for (int64_t h = 0; h < n_hits; h++) gap[h] = 0;
  for (int64_t p = 0; p < n_procs; p++) tail_start[p] = 0;
  int64_t *trailing = gap + n_hits; /* n_procs more: ops after a process's last late op */
  for (int64_t p = 0; p < n_procs; p++) trailing[p] = 0;
  for (int64_t j = 0; j < m; j++) {
    int64_t i = idx[j], p = proc[i];
    tail_start[p]++;
    if (hit[i]) continue;
    int64_t lo = p ? count[p - 1] : 0, hi = count[p];
    if (lo == hi) continue; /* no late op here: a miss, counted below */
    int64_t k = time_key(gstart[i], t_min, j);
    while (lo < hi) { /* the first late op after this one */
      int64_t mid = lo + (hi - lo) / 2;
      if (key[mid] < k) lo = mid + 1;
      else hi = mid;
    }
    if (lo < count[p]) gap[lo] = 1;
    else trailing[p]++;
  }
  int64_t fired = 0;
  for (int64_t p = 0, begin = 0; p < n_procs; begin = count[p], p++) {
    int64_t ops = tail_start[p];
    if (ops == 0) {
      tail_start[p] = -3;
      continue;
    }
    if (count[p] == begin) { /* no late op: the run is broken, the misses go on */
      run_state[p] = 0;
      miss_state[p] = wrap_add(miss_state[p], ops);
      tail_start[p] = -2;
      continue;
    }
    int64_t run = run_state[p], start = -1;
    for (int64_t h = begin; h < count[p]; h++) {
      int64_t i = idx[key[h] & (((int64_t)1 << POS_BITS) - 1)];
      if (gap[h]) run = 0;
      run = wrap_add(run, 1);
      if (run == 1) start = i;
      if (run >= (pair[i] ? need_pair : need_solo)) {
        fired_rec[fired] = i;
        fired_run[fired] = run;
        fired_start[fired] = start;
        fired++;
      }
    }
    miss_state[p] = trailing[p];
    run_state[p] = trailing[p] ? 0 : run;
    tail_start[p] = trailing[p] ? -2 : start;
  }
  return fired;
}

/* Median of the non-NaN values of x[0..k) (NaN when none), as numpy.nanmedian:
 * the middle value, or the mean of the two middle ones. */
static double nan_median(const double *x, int64_t k, double *tmp) {
  int64_t m = 0;
  for (int64_t j = 0; j < k; j++) {
    if (isnan(x[j])) continue;
    int64_t at = m++;
    while (at > 0 && tmp[at - 1] > x[j]) { /* insertion sort: k is a handful */
      tmp[at] = tmp[at - 1];
      at--;
    }
    tmp[at] = x[j];
  }
  if (m == 0) return NAN;
  /* numpy.nanmedian along an axis (numpy.ma.median): the mean of the middle two,
   * or of the middle one with itself (which overflows as NumPy's does) */
  return m % 2 ? (tmp[m / 2] + tmp[m / 2]) / 2.0 : (tmp[m / 2 - 1] + tmp[m / 2]) / 2.0;
}

/* numpy.sign(m) * numpy.maximum(abs(m) - se, 0): the learned offset shrunk toward 0 */
static double shrunk(double m, double se) {
  double a = fabs(m) - se;
  double kept = isnan(a) ? a : (a > 0.0 ? a : 0.0);
  double sign = m > 0.0 ? 1.0 : (m < 0.0 ? -1.0 : (isnan(m) ? m : 0.0));
  return sign * kept;
}

static void onset_of(int64_t i, const int64_t *seq, const double *arrival_c,
                     const int64_t *comm, const int64_t *func, const double *carried,
                     double *out) {
  if (i < 0) {
    for (int k = 0; k < 4; k++) out[k] = carried[k];
    return;
  }
  out[0] = (double)seq[i];
  out[1] = arrival_c[i];
  out[2] = (double)comm[i];
  out[3] = (double)func[i];
}

/* The straggler detector's per-(process, slot) state over one batch
 * (straggler.StragglerDetector._baseline and _slot_runs), flat[i] = proc *
 * width + slot in [0, n_flat) for the records with ok[i] set. The batch must
 * give each flat's records in seq order (else RWD_UNORDERED); they are visited
 * in stream order, each flat's state small enough to stay in cache.
 *
 * Baseline: the first `learn` excesses (and sigmas) of each flat are kept in
 * learn_x/learn_sig (n_flat x learn) and leave resid NaN; at the last of them
 * base = sign(m) * max(|m| - 2 median(sigma) / sqrt(learn), 0), m their median;
 * after that resid = excess - base. nobs counts each flat's records.
 *
 * Persistence over the judged records (finite resid), hit = resid > thr: per
 * flat the run of consecutive hits (run_state) and the CUSUM of min(z, z_clip)
 * - cusum_k, z = resid / sigma (cusum_state; cusum_step, as rwd_cusum);
 * run_at/cusum_at (n_flat x 4) hold where a run or excursion going on at the
 * batch's end began (seq, arrival_c, comm, func; -1s: none), last_z the z of a
 * flat's last op when it was late (else 0). Writes resid, hit and head (a hit
 * that begins a run) for every record; a record may fire when its run reaches
 * low_run or its S low_s: f_rec, f_run, f_s, f_run_start and f_cusum_start (the
 * record the run or excursion began at; -1: before this batch; -2: S is 0),
 * f_z1 (z of the op before it at its flat, or last_z) and f_carried (8 per
 * record: run_at and cusum_at of its flat before this batch), in stream order;
 * their count is returned. Scratch: fs (4 n_flat int64), fz (4 n_flat doubles),
 * tmp (learn doubles). */
RWD_EXPORT int64_t rwd_slot_state(
    int64_t n, const int64_t *flat, int64_t n_flat, const uint8_t *ok, const int64_t *seq,
    const double *excess, const double *sigma, const double *thr, int64_t learn,
    double z_clip, double cusum_k, int64_t low_run, double low_s, int64_t *nobs,
    double *learn_x, double *learn_sig, double *base, int64_t *run_state, double *cusum_state,
    double *run_at, double *cusum_at, double *last_z, const int64_t *comm,
    const int64_t *func, const double *arrival_c, double *resid, uint8_t *hit, uint8_t *head,
    int64_t *f_rec, int64_t *f_run, double *f_s, int64_t *f_run_start,
    int64_t *f_cusum_start, double *f_z1, double *f_carried, int64_t *fs, double *fz,
    double *tmp) {
  if (learn < 1 || n_flat < 0 || n < 0) return RWD_RANGE;
  /* per flat: the last seq seen (-1 in `last`: none yet) while checking, then where
   * its run began (pos), where its excursion began (began) and its last record */
  int64_t *last_seq = fs, *began = fs + n_flat, *pos = fs + 2 * n_flat, *last = fs + 3 * n_flat;
  for (int64_t f = 0; f < n_flat; f++) last[f] = -1;
  for (int64_t i = 0; i < n; i++) {
    if (!ok[i]) continue;
    int64_t f = flat[i];
    if (!in_range(f, n_flat) || nobs[f] < 0) return RWD_RANGE;
    if (last[f] >= 0 && seq[i] < last_seq[f]) return RWD_UNORDERED;
    last[f] = i;
    last_seq[f] = seq[i];
  }

  /* baseline, in stream order */
  for (int64_t i = 0; i < n; i++) {
    resid[i] = NAN;
    hit[i] = head[i] = 0;
    if (!ok[i]) continue;
    int64_t f = flat[i], k = nobs[f];
    nobs[f] = wrap_add(k, 1);
    if (k < learn) {
      learn_x[f * learn + k] = excess[i];
      learn_sig[f * learn + k] = sigma[i];
      if (k == learn - 1) {
        double mid = nan_median(learn_x + f * learn, learn, tmp);
        double se = 2.0 * nan_median(learn_sig + f * learn, learn, tmp) / sqrt((double)learn);
        base[f] = shrunk(mid, se);
      }
      continue;
    }
    resid[i] = excess[i] - base[f];
  }

  /* runs and the CUSUM, in stream order, with each flat's running values in
   * scratch: C and its minimum (fc, fm), where the run began (pos; -1 carried),
   * where the excursion began (began; -1 carried, -2 right after S was 0), the
   * z before (fz); run_state is the run so far, cusum_state stays the carry */
  double *fc = fz + n_flat, *fm = fz + 2 * n_flat, *s_last = fz + 3 * n_flat;
  for (int64_t f = 0; f < n_flat; f++) last[f] = -1;
  int64_t fired = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(resid[i])) continue;
    int64_t f = flat[i];
    double carry = cusum_state[f], z = resid[i] / sigma[i];
    int first = last[f] < 0;
    if (first) {
      pos[f] = -1;
      began[f] = carry > 0 ? -1 : i;
      fz[f] = last_z[f];
    } else if (began[f] == -2) {
      began[f] = i;
    }
    double s = cusum_step(np_min(z, z_clip) - cusum_k, carry, first, fc + f, fm + f);
    int late = resid[i] > thr[i];
    int64_t r = late ? wrap_add(run_state[f], 1) : 0;
    if (r == 1) pos[f] = i;
    hit[i] = (uint8_t)late;
    head[i] = (uint8_t)(r == 1);
    run_state[f] = r;
    if (r >= low_run || s >= low_s) {
      f_rec[fired] = i;
      f_run[fired] = r;
      f_s[fired] = s;
      f_run_start[fired] = r > 0 ? pos[f] : -1;
      f_cusum_start[fired] = s == 0.0 ? -2 : began[f];
      f_z1[fired] = fz[f];
      for (int k = 0; k < 4; k++) {
        f_carried[fired * 8 + k] = run_at[f * 4 + k];
        f_carried[fired * 8 + 4 + k] = cusum_at[f * 4 + k];
      }
      fired++;
    }
    if (s == 0.0) began[f] = -2; /* the next op begins the next excursion */
    fz[f] = z;
    last[f] = i;
    s_last[f] = s;
  }

  /* each flat's state after its last op here */
  for (int64_t f = 0; f < n_flat; f++) {
    if (last[f] < 0) continue;
    int64_t r = run_state[f];
    double s = s_last[f], run_from[4], s_from[4];
    onset_of(pos[f], seq, arrival_c, comm, func, run_at + f * 4, run_from);
    onset_of(began[f], seq, arrival_c, comm, func, cusum_at + f * 4, s_from);
    for (int k = 0; k < 4; k++) {
      run_at[f * 4 + k] = r > 0 ? run_from[k] : -1.0;
      cusum_at[f * 4 + k] = s > 0 ? s_from[k] : -1.0;
    }
    cusum_state[f] = s;
    last_z[f] = r > 0 ? fz[f] : 0.0;
  }
  return fired;
}

/* blame._top_two: per contiguous instance k (records start[k] to start[k + 1],
 * the last to n), the first record holding its largest g (last) and the first
 * other record holding the largest of the others' values when that is finite
 * (second; else last again). g has no NaN (the caller's nan_to_num). */
RWD_EXPORT int64_t rwd_top_two(int64_t n_inst, const int64_t *start, int64_t n, const double *g,
                               int64_t *last, int64_t *second) {
  for (int64_t k = 0; k < n_inst; k++) {
    int64_t end = k + 1 < n_inst ? start[k + 1] : n;
    if (!in_range(start[k], n) || end <= start[k] || end > n) return RWD_RANGE;
  }
  for (int64_t k = 0; k < n_inst; k++) {
    int64_t a = start[k], b = k + 1 < n_inst ? start[k + 1] : n, top = a, next = -1;
    for (int64_t j = a + 1; j < b; j++)
      if (g[j] > g[top]) top = j;
    double m = -INFINITY;
    for (int64_t j = a; j < b; j++)
      if (j != top && g[j] > m) {
        m = g[j];
        next = j;
      }
    last[k] = top;
    second[k] = next >= 0 && isfinite(m) ? next : top;
  }
  return RWD_OK;
}

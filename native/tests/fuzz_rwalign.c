/* Random and extreme inputs for the rwalign kernels, for builds under
 * AddressSanitizer and UBSan (tests/analysis/test_align_kernels.py builds and runs
 * it): keys with NULLs and ties, values at the int64 limits (subtractions, sums and
 * clock corrections that overflow), codes just out of range, capacities one short,
 * empty inputs. A kernel must return a count, RWA_RANGE or RWA_OVERFLOW, and read
 * and write only what it was given.
 *
 * usage: fuzz_rwalign ITERATIONS SEED   (prints "ok: N" on success) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "rwalign.h"

#include "fuzz_random.h"

static long pair_rounds; /* rounds that reached rwa_clock_pairs' detrending */

static int64_t value_like(void) {
  switch (pick(40)) {
    case 0: return INT64_MIN;
    case 1: return INT64_MAX;
    case 2: return -pick(1000);
    default: return pick(50); /* few distinct values: ties */
  }
}

/* a code in [-1, bound), sometimes one past either end */
static int64_t code_like(int64_t bound, int allow_bad) {
  if (allow_bad && pick(200) == 0) return pick(2) ? -2 : bound;
  return pick(bound + 1) - 1;
}

#define NEW(T, n) ((T *)calloc((n) > 0 ? (size_t)(n) : 1u, sizeof(T)))

static int one_round(int64_t n) {
  int allow_bad = pick(4) == 0;
  int64_t n_hosts = 1 + pick(5), n_world = 1 + pick(6);
  int64_t *comm = NEW(int64_t, n), *func = NEW(int64_t, n), *seq = NEW(int64_t, n);
  uint8_t *seq_ok = NEW(uint8_t, n);
  for (int64_t i = 0; i < n; i++) {
    comm[i] = code_like(3, 0);
    func[i] = code_like(2, 0);
    seq[i] = n > 1000 ? pick(n) : pick(10) ? pick(8) : value_like(); /* many groups: growth */
    seq_ok[i] = (uint8_t)(pick(8) != 0);
  }
  int64_t cap = 1;
  while (cap < 2 * n) cap <<= 1;
  int64_t *table = NEW(int64_t, cap), *first = NEW(int64_t, n), *group = NEW(int64_t, n);
  int64_t *order = NEW(int64_t, n), *starts = NEW(int64_t, n + 1);
  int64_t groups = rwa_group(n, comm, func, seq, seq_ok, cap, table, first, group, order, starts);
  int good = groups >= 0 && groups <= n && (n == 0 || groups > 0);
  /* a capacity that is not a power of two >= 2n is refused */
  if (n > 0 && rwa_group(n, comm, func, seq, seq_ok, cap - 1, table, first, group, order,
                         starts) != RWA_RANGE)
    good = 0;
  if (!good) return 0;
  int64_t biggest = 0;
  for (int64_t g = 0; g < groups; g++)
    if (starts[g + 1] - starts[g] > biggest) biggest = starts[g + 1] - starts[g];

  /* members: NULL or valid codes, ranks and world ranks like values (ties), a host
   * or a world code out of range in some bad rounds */
  int64_t n_members = 1 + pick(8);
  int64_t *members = NEW(int64_t, RWA_M * n_members);
  for (int64_t m = 0; m < n_members; m++) {
    int64_t *row = members + m * RWA_M;
    for (int c = 0; c < RWA_M; c++) row[c] = value_like();
    row[RWA_M_COMM_KEY] = code_like(3, 0);
    row[RWA_M_COMM_ID] = code_like(4, 0);
    row[RWA_M_COMM_NAME] = code_like(4, 0);
    row[RWA_M_N_RANKS_OK] = pick(2);
    row[RWA_M_WORLD_OK] = pick(2);
    row[RWA_M_HOST] = allow_bad && pick(100) == 0 ? (pick(2) ? -1 : n_hosts) : pick(n_hosts);
    row[RWA_M_WORLD_CODE] = allow_bad && pick(100) == 0 ? n_world : pick(n_world);
  }
  int64_t *in = NEW(int64_t, RWA_IN * n);
  uint8_t *in_ok = NEW(uint8_t, RWA_IN * n);
  for (int64_t i = 0; i < n; i++) {
    for (int k = 0; k < RWA_IN; k++) {
      in[i * RWA_IN + k] = value_like();
      in_ok[i * RWA_IN + k] = (uint8_t)(pick(6) != 0);
    }
    in[i * RWA_IN + RWA_IN_MEMBER] = allow_bad && pick(200) == 0 ? (pick(2) ? -1 : n_members)
                                                                 : pick(n_members);
    in_ok[i * RWA_IN + RWA_IN_MEMBER] = 1;
  }
  uint8_t *bound_ok = NEW(uint8_t, n_hosts);
  double *bound = NEW(double, n_hosts);
  for (int64_t h = 0; h < n_hosts; h++) {
    bound_ok[h] = (uint8_t)(pick(5) != 0);
    bound[h] = (double)pick(5);
  }
  int64_t *stamp = NEW(int64_t, n_hosts), *scratch = NEW(int64_t, biggest);
  for (int64_t h = 0; h < n_hosts; h++) stamp[h] = -1;
  int64_t *out_i = NEW(int64_t, RWA_OUT_I64 * groups);
  double *out_f = NEW(double, RWA_OUT_F64 * groups);
  uint8_t *out_ok = NEW(uint8_t, (RWA_OUT_I64 + RWA_OUT_F64) * groups);
  int64_t *late_i = NEW(int64_t, RWA_LATE_I64 * n_world);
  double *late_f = NEW(double, RWA_LATE_F64 * n_world);
  for (int64_t w = 0; w < n_world; w++) late_i[RWA_L_HOST * n_world + w] = -1;
  int64_t got = rwa_collectives(groups, starts, order, n, in, in_ok, n_members, members,
                                n_hosts, bound, bound_ok, n_world, stamp, scratch,
                                out_i, out_f, out_ok, late_i, late_f);
  good = got == groups || got == RWA_RANGE || got == RWA_OVERFLOW;
  if (!allow_bad && got == RWA_RANGE) good = 0; /* only bad codes are refused */

  free(comm), free(func), free(seq), free(seq_ok), free(table), free(first), free(group);
  free(order), free(starts), free(in), free(in_ok), free(members), free(bound_ok), free(bound);
  free(stamp), free(scratch), free(out_i), free(out_f), free(out_ok), free(late_i), free(late_f);
  return good;
}

/* rwa_clock_obs, rwa_clock_pairs and rwa_medians over rows rwa_prepare wrote. */
static int clock_round(int64_t n, const int64_t *comm, const int64_t *in, const uint8_t *in_ok,
                       int64_t n_members, const int64_t *members, int64_t n_hosts) {
  int64_t *func = NEW(int64_t, n), *seq = NEW(int64_t, n), *c = NEW(int64_t, n);
  uint8_t *seq_ok = NEW(uint8_t, n);
  int64_t n_comm = 4;
  for (int64_t i = 0; i < n; i++) {
    func[i] = 0, seq[i] = pick(6), seq_ok[i] = 1;
    c[i] = comm[i] >= -1 && comm[i] < n_comm ? comm[i] : pick(n_comm); /* codes in range */
  }
  int64_t cap = 1;
  while (cap < 2 * n) cap <<= 1;
  int64_t *table = NEW(int64_t, cap), *first = NEW(int64_t, n), *group = NEW(int64_t, n);
  int64_t *order = NEW(int64_t, n), *starts = NEW(int64_t, n + 1);
  int64_t groups = rwa_group(n, c, func, seq, seq_ok, cap, table, first, group, order, starts);
  int good = groups >= 0;
  uint8_t multi[4] = {1, 0, 1, 1};
  int64_t *scratch = NEW(int64_t, RWA_OBS_SCRATCH * n_hosts);
  for (int64_t h = 0; h < n_hosts; h++) scratch[h] = -1;
  double *sums = NEW(double, n_hosts);
  int64_t obs_cap = pick(3) == 0 ? pick(n + 1) : n;
  int64_t *id = NEW(int64_t, obs_cap), *host = NEW(int64_t, obs_cap);
  double *min_end = NEW(double, obs_cap), *max_start = NEW(double, obs_cap);
  double *mean_end = NEW(double, obs_cap), *err = NEW(double, obs_cap);
  uint8_t *max_start_ok = NEW(uint8_t, obs_cap);
  int64_t t0 = value_like();
  int64_t obs = good ? rwa_clock_obs(groups, starts, order, n, in, in_ok, n_members, members, c,
                                     n_comm, multi, n_hosts, scratch, sums, t0, 0, obs_cap, id,
                                     host, min_end, max_start, max_start_ok, mean_end, err)
                     : 0;
  good = good && ((obs >= 0 && obs <= obs_cap) || obs == RWA_RANGE || obs == RWA_OVERFLOW);
  if (good && obs > 0) {
    int64_t *pair_of = NEW(int64_t, n_hosts * n_hosts), n_pairs = 0;
    for (int64_t a = 0; a < n_hosts; a++)
      for (int64_t b = 0; b < n_hosts; b++)
        pair_of[a * n_hosts + b] = a < b && pick(4) ? n_pairs++ : -1;
    int64_t range[3] = {0, 0, 0};
    double width = pick(2) ? 1e3 : 2e8;
    int64_t got = rwa_clock_pairs(RWA_PAIRS_RANGE, obs, id, host, min_end, max_start,
                                  max_start_ok, mean_end, err, n_hosts, pair_of, n_pairs, width,
                                  0, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                  range);
    good = got >= 0 || got == RWA_RANGE;
    int64_t buckets = got > 0 ? range[1] - range[0] + 1 : 0;
    if (got > 0 && buckets > 0 && buckets <= 4096) {
      int64_t cells = n_pairs * buckets;
      int64_t *next = NEW(int64_t, cells), *offsets = NEW(int64_t, cells + 1);
      double *values = NEW(double, got), *t_sum = NEW(double, cells);
      rwa_clock_pairs(RWA_PAIRS_COUNT, obs, id, host, min_end, max_start, max_start_ok,
                      mean_end, err, n_hosts, pair_of, n_pairs, width, range[0], buckets, next,
                      NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, range);
      offsets[0] = 0;
      for (int64_t q = 0; q < cells; q++) offsets[q + 1] = offsets[q] + next[q], next[q] = offsets[q];
      good = good && offsets[cells] == got;
      rwa_clock_pairs(RWA_PAIRS_FILL, obs, id, host, min_end, max_start, max_start_ok,
                      mean_end, err, n_hosts, pair_of, n_pairs, width, range[0], buckets, next,
                      values, t_sum, NULL, NULL, NULL, NULL, NULL, NULL, range);
      double *medians = NEW(double, cells);
      good = good && rwa_medians(cells, offsets, values, medians) == cells;
      for (int64_t q = 0; q < cells; q++) { /* the median: as many values below as above */
        int64_t below = 0, above = 0, m = offsets[q + 1] - offsets[q];
        for (int64_t j = offsets[q]; j < offsets[q + 1]; j++) {
          below += values[j] < medians[q];
          above += values[j] > medians[q];
        }
        if (m > 0 && (2 * below > m || 2 * above > m)) good = 0;
        next[q] = offsets[q];
      }
      double *slope = NEW(double, n_hosts), *slope_err = NEW(double, n_pairs + 1);
      double *upper = NEW(double, n_pairs + 1), *lower = NEW(double, n_pairs + 1);
      uint8_t *upper_ok = NEW(uint8_t, n_pairs + 1), *lower_ok = NEW(uint8_t, n_pairs + 1);
      for (int64_t h = 0; h < n_hosts; h++) slope[h] = (double)pick(100) * 1e-6;
      got = rwa_clock_pairs(RWA_PAIRS_DETREND, obs, id, host, min_end, max_start, max_start_ok,
                            mean_end, err, n_hosts, pair_of, n_pairs, width, range[0], buckets,
                            next, values, NULL, slope, slope_err, upper, upper_ok, lower,
                            lower_ok, range);
      good = good && got == offsets[cells];
      pair_rounds++;
      free(next), free(offsets), free(values), free(t_sum), free(medians), free(slope);
      free(slope_err), free(upper), free(lower), free(upper_ok), free(lower_ok);
    }
    free(pair_of);
  }
  free(func), free(seq), free(c), free(seq_ok), free(table), free(first), free(group);
  free(order), free(starts), free(scratch), free(sums), free(id), free(host), free(min_end);
  free(max_start), free(mean_end), free(err), free(max_start_ok);
  return good;
}

/* rwa_prepare over random captured rows, members and host clocks. */
static int prepare_round(int64_t n) {
  int allow_bad = pick(4) == 0, tame = pick(2) == 0;
  int64_t n_members = 1 + pick(6), n_funcs = 1 + pick(3), n_hosts = 1 + pick(4);
  int64_t passes = 1 + pick(3), pass = pick(passes);
  int32_t *member = NEW(int32_t, n), *func = NEW(int32_t, n);
  int64_t *seq = NEW(int64_t, n), *msg = NEW(int64_t, n), *arr = NEW(int64_t, n);
  int64_t *gs = NEW(int64_t, n), *ge = NEW(int64_t, n), *cerr = NEW(int64_t, n);
  uint8_t *valid = NEW(uint8_t, n);
  for (int64_t i = 0; i < n; i++) {
    member[i] = (int32_t)(allow_bad && pick(200) == 0 ? n_members : pick(n_members));
    func[i] = (int32_t)(allow_bad && pick(200) == 0 ? -1 : pick(n_funcs));
    seq[i] = pick(10) ? pick(8) - 3 : value_like();
    if (tame) { /* no extremes: the rows reach the clock kernels */
      msg[i] = pick(50), arr[i] = pick(1000), gs[i] = pick(1000), ge[i] = pick(1000);
      cerr[i] = pick(20);
    } else {
      msg[i] = value_like(), arr[i] = value_like(), gs[i] = value_like(), ge[i] = value_like();
      cerr[i] = value_like();
    }
    valid[i] = (uint8_t)pick(64);
  }
  int64_t *members = NEW(int64_t, RWA_M * n_members);
  for (int64_t m = 0; m < n_members; m++) {
    for (int c = 0; c < RWA_M; c++) members[m * RWA_M + c] = value_like();
    members[m * RWA_M + RWA_M_HOST] = allow_bad && pick(50) == 0 ? n_hosts : pick(n_hosts);
  }
  int64_t *func_rank = NEW(int64_t, n_funcs), *t0 = NEW(int64_t, n_hosts);
  double *offset = NEW(double, n_hosts), *drift = NEW(double, n_hosts);
  uint8_t *clock_ok = NEW(uint8_t, n_hosts);
  for (int64_t f = 0; f < n_funcs; f++) func_rank[f] = pick(n_funcs);
  const double extreme[4] = {1e30, -1e30, NAN, INFINITY};
  for (int64_t h = 0; h < n_hosts; h++) {
    t0[h] = tame ? pick(1000) : value_like();
    offset[h] = pick(20) == 0 && !tame ? extreme[pick(4)] : (double)pick(1000) - 500.0;
    drift[h] = pick(20) == 0 && !tame ? extreme[pick(4)] : (double)pick(100) / 7.0;
    clock_ok[h] = (uint8_t)(pick(4) != 0);
  }
  int64_t cap = pick(3) == 0 ? pick(n + 1) : n; /* sometimes too small */
  int64_t *comm = NEW(int64_t, cap), *ofunc = NEW(int64_t, cap), *oseq = NEW(int64_t, cap);
  uint8_t *seq_ok = NEW(uint8_t, cap), *in_ok = NEW(uint8_t, RWA_IN * cap);
  int64_t *in = NEW(int64_t, RWA_IN * cap);
  /* the pass's rows, as rwa_partition lists them; sometimes an index out of range */
  int32_t *sel = NEW(int32_t, n);
  int64_t *starts = NEW(int64_t, passes + 1);
  int64_t n_buckets = 2 + pick(4) * pick(n + 1); /* often fewer buckets than seqs */
  int64_t *buckets = NEW(int64_t, n_buckets);
  int good = rwa_partition(n, seq, passes, n_buckets, buckets, sel, starts) == n &&
             starts[0] == 0 && starts[passes] == n;
  /* each pass's rows in row order, passes in seq order: a seq's rows in one pass */
  for (int64_t p = 0; good && p < passes; p++) {
    good = starts[p] <= starts[p + 1];
    for (int64_t j = starts[p]; good && j < starts[p + 1]; j++)
      if (sel[j] < 0 || sel[j] >= n || (j > starts[p] && sel[j] <= sel[j - 1])) good = 0;
  }
  uint8_t *listed = NEW(uint8_t, n + 1);
  for (int64_t j = 0; good && j < n; j++) good = !listed[sel[j]]++; /* each row once */
  free(listed);
  for (int64_t p = 0; good && p + 1 < passes; p++) /* seq ranges in pass order */
    for (int64_t j = starts[p]; good && j < starts[p + 1]; j++)
      for (int64_t k = starts[p + 1]; good && k < n; k++)
        if (seq[sel[j]] >= seq[sel[k]]) good = 0;
  int64_t n_sel = starts[pass + 1] - starts[pass];
  int32_t *mine = sel + starts[pass];
  if (allow_bad && n_sel > 0 && pick(20) == 0) mine[pick(n_sel)] = (int32_t)n;
  int64_t got = rwa_prepare(n, member, func, seq, msg, arr, gs, ge, cerr, valid, n_members, members,
                            n_funcs, func_rank, n_hosts, clock_ok, offset, drift, t0, n_sel, mine,
                            cap, comm, ofunc, oseq, seq_ok, in, in_ok);
  good = good && ((got >= 0 && got <= cap) || got == RWA_RANGE || got == RWA_OVERFLOW);
  if (!allow_bad && cap >= n_sel && got == RWA_RANGE) good = 0; /* only bad inputs are refused */
  if (got >= 0) good = good && clock_round(got, comm, in, in_ok, n_members, members, n_hosts);
  free(member), free(func), free(seq), free(msg), free(arr), free(gs), free(ge), free(valid);
  free(cerr), free(sel), free(starts), free(buckets);
  free(members), free(func_rank), free(t0), free(offset), free(drift), free(clock_ok);
  free(comm), free(ofunc), free(oseq), free(seq_ok), free(in_ok), free(in);
  return good;
}

int main(int argc, char **argv) {
  long iterations = argc > 1 ? atol(argv[1]) : 1000;
  state = argc > 2 ? (uint64_t)atoll(argv[2]) : 1;
  for (long it = 0; it < iterations; it++) {
    int64_t n = pick(4) == 0 ? pick(3) : pick(50) == 0 ? 1000 + pick(3000) : pick(300);
    if (!one_round(n) || !prepare_round(n)) {
      printf("failed at iteration %ld (n = %lld)\n", it, (long long)n);
      return 1;
    }
  }
  printf("ok: %ld (%ld reached the clock pairs)\n", iterations, pair_rounds);
  return 0;
}

/* rwalign: compiled kernels of rankwatch's cross-rank alignment.
 *
 * rankwatch.align.kernels loads this library with ctypes. rwa_group and
 * rwa_collectives compute, in one pass over a job's collective ops, what the SQL
 * form in rankwatch/align/collectives.py computes with three hash aggregations
 * and two joins over every op: each collective's arrivals, last arriver, transfer
 * and clock bound (the `joined` rows of COLLECTIVES_QUERY), and each world rank's
 * lateness (RANK_LATENESS_SQL's sums and counts). The SQL form stays the reference
 * and the fallback; the tests compare both, NULLs included, on the rules SQL
 * applies: aggregates skip NULLs, arg_min skips rows whose argument or key is
 * NULL, a comparison with NULL is not true, a median is PERCENTILE_CONT(0.5).
 *
 * Conventions: arrays are C-contiguous; a column's validity is a uint8 array of
 * the same length (1: a value, 0: NULL). String columns arrive as codes in the
 * order of their strings (so a minimum of codes is the minimum string), -1 for
 * NULL. A kernel validates every index it will use before writing anything and
 * returns RWA_RANGE when one is out of range; RWA_OVERFLOW when an int64 result
 * would overflow, where SQL raises an error (the caller then runs the SQL form).
 *
 * No allocation, no global state: thread-compatible.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "rwalign.h"
#include "rwsort.h"

#define RWA_EXPORT __attribute__((visibility("default")))

#define GROUP_TABLE_START 1024u /* slots of rwa_group's table at first (a power of two) */

static uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 33);
}

static uint64_t key_hash(int64_t comm, int64_t func, int64_t seq, int seq_ok) {
  uint64_t h = mix((uint64_t)comm * 0x9e3779b97f4a7c15ULL + (uint64_t)func);
  return mix(h ^ (seq_ok ? (uint64_t)seq : 0x5bd1e9955bd1e995ULL));
}

static int same_key(int64_t a, int64_t b, const int64_t *comm, const int64_t *func,
                    const int64_t *seq, const uint8_t *seq_ok) {
  if (comm[a] != comm[b] || func[a] != func[b] || seq_ok[a] != seq_ok[b]) return 0;
  return !seq_ok[a] || seq[a] == seq[b];
}

/* Rows grouped by (comm, func, seq) with NULL a value of its own (codes -1 for
 * NULL communicator or function, seq_ok 0 for NULL seq), as GROUP BY groups them.
 * Groups are numbered in order of first appearance; group[i] is row i's, first[g]
 * the first row of group g, order lists the rows group by group (in row order
 * within a group), and group g's rows are order[starts[g] .. starts[g + 1]).
 * `table`: cap int64 of scratch, cap a power of two >= 2n. `starts` holds n + 1.
 * Returns the number of groups. */
RWA_EXPORT int64_t rwa_group(int64_t n, const int64_t *comm, const int64_t *func,
                             const int64_t *seq, const uint8_t *seq_ok, int64_t cap,
                             int64_t *table, int64_t *first, int64_t *group, int64_t *order,
                             int64_t *starts) {
  if (n < 0 || cap < 2 * n || cap < 1 || (cap & (cap - 1)) != 0) return RWA_RANGE;
  /* The table in use starts small and doubles whenever it is half full: groups are
   * a fraction of the rows (one per collective, each with all its ranks' rows), and
   * a table sized for them stays in cache where one sized for the rows would not. */
  uint64_t used = cap < GROUP_TABLE_START ? (uint64_t)cap : GROUP_TABLE_START;
  uint64_t mask = used - 1;
  for (uint64_t s = 0; s < used; s++) table[s] = -1;
  int64_t count = 0;
  for (int64_t i = 0; i < n; i++) {
    if (i > 0 && same_key(i, i - 1, comm, func, seq, seq_ok)) { /* runs of one collective */
      group[i] = group[i - 1];
      continue;
    }
    uint64_t at = key_hash(comm[i], func[i], seq[i], seq_ok[i]) & mask;
    int64_t g;
    for (;;) {
      g = table[at];
      if (g < 0 || same_key(first[g], i, comm, func, seq, seq_ok)) break;
      at = (at + 1) & mask;
    }
    if (g < 0) {
      g = count++;
      table[at] = g;
      first[g] = i;
      if ((uint64_t)count * 2 > used && used < (uint64_t)cap) { /* grow: rehash the groups */
        used *= 2;
        mask = used - 1;
        for (uint64_t s = 0; s < used; s++) table[s] = -1;
        for (int64_t h = 0; h < count; h++) {
          int64_t r = first[h];
          uint64_t to = key_hash(comm[r], func[r], seq[r], seq_ok[r]) & mask;
          while (table[to] >= 0) to = (to + 1) & mask;
          table[to] = h;
        }
      }
    }
    group[i] = g;
  }
  /* counting sort of the rows by group, stable */
  for (int64_t g = 0; g <= count; g++) starts[g] = 0;
  for (int64_t i = 0; i < n; i++) starts[group[i] + 1]++;
  for (int64_t g = 0; g < count; g++) starts[g + 1] += starts[g];
  for (int64_t i = 0; i < n; i++) order[starts[group[i]]++] = i;
  for (int64_t g = count; g > 0; g--) starts[g] = starts[g - 1];
  starts[0] = 0;
  return count;
}

/* ------------------------------------------------------------------ medians */

/* PERCENTILE_CONT(0.5) of m values as DuckDB forms it: the middle value as a
 * double, or lo + (hi - lo) * 0.5 of the two middle ones, both cast to double
 * first (reorders a). */
static double median_of(int64_t *a, int64_t m) {
  int64_t upper = rw_select_i64(a, m, m / 2);
  if (m % 2) return (double)upper;
  int64_t lower = a[0]; /* the largest of a[0 .. m / 2), all at most upper */
  for (int64_t j = 1; j < m / 2; j++)
    if (a[j] > lower) lower = a[j];
  double lo = (double)lower, hi = (double)upper;
  return lo + (hi - lo) * 0.5;
}

/* ---------------------------------------------------------------- one group */

/* A nullable int64 aggregate. */
typedef struct {
  int64_t v;
  int ok;
} opt_t;

static void take_min(opt_t *o, int64_t v) {
  if (!o->ok || v < o->v) *o = (opt_t){v, 1};
}

static void take_max(opt_t *o, int64_t v) {
  if (!o->ok || v > o->v) *o = (opt_t){v, 1};
}

typedef struct {
  const int64_t *in;
  const uint8_t *ok;
  int64_t n;
  const int64_t *members; /* [n_members][RWA_M] */
  int64_t n_members;
} cols_t;

/* row-major: a row's columns share a cache line or two, and a collective's rows
 * lie all over the input (one rank's file after another's) */
static int64_t val(const cols_t *c, int col, int64_t i) { return c->in[i * RWA_IN + col]; }
static int has(const cols_t *c, int col, int64_t i) { return c->ok[i * RWA_IN + col]; }
static int64_t member_col(const int64_t *members, int64_t m, int col) {
  return members[m * RWA_M + col];
}

/* column `col` (RWA_M_*) of row i's member */
static int64_t mem(const cols_t *c, int64_t i, int col) {
  return member_col(c->members, val(c, RWA_IN_MEMBER, i), col);
}

/* Whether the members table's codes are in range: hosts in [0, n_hosts), world
 * codes in [0, n_world) (n_world 0: not read). */
static int members_in_range(const int64_t *members, int64_t n_members, int64_t n_hosts,
                            int64_t n_world) {
  for (int64_t m = 0; m < n_members; m++) {
    int64_t h = member_col(members, m, RWA_M_HOST), w = member_col(members, m, RWA_M_WORLD_CODE);
    if (h < 0 || h >= n_hosts || (n_world > 0 && (w < 0 || w >= n_world))) return 0;
  }
  return 1;
}

/* How many rows ahead (in `order`) the group kernels ask for a row's cache lines:
 * a collective's rows lie all over a pass's input (one rank's after another's), so
 * without asking ahead each row costs a few misses to memory, one after another. */
enum { PREFETCH_ROWS = 8 };

static void prefetch_row(const cols_t *c, int64_t i) {
  const char *row = (const char *)(c->in + i * RWA_IN);
  const char *ok = (const char *)(c->ok + i * RWA_IN);
  __builtin_prefetch(row);
  __builtin_prefetch(row + sizeof(int64_t) * RWA_IN - 1); /* a row spans one or two lines */
  __builtin_prefetch(ok);
  __builtin_prefetch(ok + RWA_IN - 1);
}

/* Ask for the row PREFETCH_ROWS after rows[j] in `rows` (which has `limit` entries
 * from rows[0]), when there is one and it is in range (rows are checked only when
 * visited). */
static void prefetch_ahead(const cols_t *c, const int64_t *rows, int64_t j, int64_t limit) {
  if (j + PREFETCH_ROWS >= limit) return;
  int64_t next = rows[j + PREFETCH_ROWS];
  if (next >= 0 && next < c->n) prefetch_row(c, next);
}

/* Whether row i's member index is inside the members table. */
static int member_ok(const cols_t *c, int64_t i) {
  int64_t m = val(c, RWA_IN_MEMBER, i);
  return m >= 0 && m < c->n_members;
}

/* The smallest and largest of a nullable column so far. */
static void take_range(opt_t *lo, opt_t *hi, const cols_t *c, int col, int64_t i) {
  if (!has(c, col, i)) return;
  take_min(lo, val(c, col, i));
  take_max(hi, val(c, col, i));
}

/* The last arriver by one time column: among rows at the latest time (every row
 * when no time is known), the smallest rank, and the world rank and host of the
 * row with the smallest rank among those having one (SQL's min and arg_min). */
typedef struct {
  opt_t rank, world, host;
  int64_t world_key, host_key; /* the rank arg_min compared */
} last_t;

static void last_visit(last_t *l, const cols_t *c, int64_t i) {
  int64_t r = mem(c, i, RWA_M_RANK); /* a member always has a rank */
  take_min(&l->rank, r);
  if (mem(c, i, RWA_M_WORLD_OK) && (!l->world.ok || r < l->world_key)) {
    l->world = (opt_t){mem(c, i, RWA_M_WORLD_RANK), 1};
    l->world_key = r;
  }
  int64_t h = mem(c, i, RWA_M_HOST);
  if (h >= 0 && (!l->host.ok || r < l->host_key)) {
    l->host = (opt_t){h, 1};
    l->host_key = r;
  }
}

/* Second-to-last of a time column: the latest time again when two or more rows
 * share it, else the latest earlier one. */
static opt_t second_last(opt_t last, int64_t at_last, opt_t before) {
  if (at_last >= 2) return last;
  return before;
}

typedef struct {
  int64_t *out_i64;
  double *out_f64;
  uint8_t *out_ok;
  int64_t n_groups;
} out_t;

static void put_i(out_t *o, int col, int64_t g, opt_t v) {
  o->out_i64[col * o->n_groups + g] = v.ok ? v.v : 0;
  o->out_ok[col * o->n_groups + g] = (uint8_t)v.ok;
}

static void put_f(out_t *o, int col, int64_t g, double v, int ok) {
  o->out_f64[col * o->n_groups + g] = ok ? v : 0.0;
  o->out_ok[(RWA_OUT_I64 + col) * o->n_groups + g] = (uint8_t)ok;
}

static double median_col(const cols_t *c, int col, const int64_t *rows, int64_t m,
                         int64_t *scratch, int *ok) {
  int64_t k = 0;
  for (int64_t j = 0; j < m; j++)
    if (has(c, col, rows[j])) scratch[k++] = val(c, col, rows[j]);
  *ok = k > 0;
  return k ? median_of(scratch, k) : 0.0;
}

/* What one group's rows add to its world ranks' lateness (RANK_LATENESS_SQL over
 * COLLECTIVE_RANKS_SQL, whose join keeps only rows with non-NULL keys). */
typedef struct {
  opt_t last_a, last_g, lag_a, lag_g; /* latest times, and the lag each last one caused */
  double med_a, med_g, bound;
  int med_a_ok, med_g_ok, bound_ok;
  int64_t n_seen;
} late_in_t;

static int add_sum(int64_t *sum, int64_t v) { return !__builtin_add_overflow(*sum, v, sum); }

static int late_row(const late_in_t *t, const cols_t *c, int64_t i, int64_t n_world,
                    int64_t *li, double *lf) {
  int64_t w = mem(c, i, RWA_M_WORLD_CODE);
  li[RWA_L_COLLECTIVES * n_world + w]++;
  int64_t h = mem(c, i, RWA_M_HOST);
  int64_t *host = &li[RWA_L_HOST * n_world + w];
  if (h >= 0 && (*host < 0 || h < *host)) *host = h;
  int multi = t->n_seen > 1;
  int cols[2] = {RWA_IN_ARRIVAL, RWA_IN_GPU_START};
  const opt_t *last[2] = {&t->last_a, &t->last_g}, *lag[2] = {&t->lag_a, &t->lag_g};
  const int count_at[2] = {RWA_L_LAST_ARRIVALS, RWA_L_LAST_GPU_STARTS};
  const int sums[2] = {RWA_L_ARRIVAL_LAG_SUM, RWA_L_GPU_LAG_SUM};
  const int ns[2] = {RWA_L_ARRIVAL_LAG_N, RWA_L_GPU_LAG_N};
  const int sig[2] = {RWA_L_SIGNIFICANT_ARRIVALS, RWA_L_SIGNIFICANT_GPU_STARTS};
  const double med[2] = {t->med_a, t->med_g};
  const int med_ok[2] = {t->med_a_ok, t->med_g_ok};
  const int vs_sum[2] = {RWA_L_ARRIVAL_VS_MEDIAN_SUM, RWA_L_GPU_VS_MEDIAN_SUM};
  const int vs_n[2] = {RWA_L_ARRIVAL_VS_MEDIAN_N, RWA_L_GPU_VS_MEDIAN_N};
  for (int k = 0; k < 2; k++) {
    if (!has(c, cols[k], i)) continue;
    int64_t v = val(c, cols[k], i);
    if (med_ok[k]) {
      lf[vs_sum[k] * n_world + w] += (double)v - med[k];
      li[vs_n[k] * n_world + w]++;
    }
    if (!last[k]->ok || v != last[k]->v || !multi) continue;
    li[count_at[k] * n_world + w]++;
    if (!lag[k]->ok) continue;
    if (!add_sum(&li[sums[k] * n_world + w], lag[k]->v)) return 0;
    li[ns[k] * n_world + w]++;
    if (t->bound_ok && (double)lag[k]->v > t->bound) li[sig[k] * n_world + w]++;
  }
  if (t->bound_ok) {
    double *top = &lf[RWA_L_MAX_BOUND * n_world + w];
    int64_t *top_n = &li[RWA_L_BOUND_N * n_world + w];
    if (*top_n == 0 || t->bound > *top) *top = t->bound;
    (*top_n)++;
  }
  return 1;
}

typedef struct {
  int64_t n_hosts, n_world;
  int64_t *host_stamp, *scratch, *late_i64;
  double *late_f64;
  const double *bound_ns; /* per host, where bound_ok: its clock row's bound */
  const uint8_t *bound_ok;
} ctx_t;

static int host_bounded(const ctx_t *x, int64_t h) { return x->bound_ok[h]; }

/* One group's rows are rows[0 .. m); the next groups' follow, up to rows[ahead). */
static int64_t one_group(const ctx_t *x, const cols_t *c, out_t *o, int64_t g,
                         const int64_t *rows, int64_t m, int64_t ahead) {
  opt_t n_ranks = {0, 0}, msg_min = {0, 0}, msg_max = {0, 0};
  opt_t arr_min = {0, 0}, arr_max = {0, 0}, gs_min = {0, 0}, gs_max = {0, 0};
  opt_t ge_min = {0, 0}, ge_max = {0, 0}, dur_min = {0, 0}, comm_id = {0, 0};
  opt_t comm_name = {0, 0};
  int64_t hosts = 0, unbounded = 0;
  int top_ok = 0;
  double top = 0.0;
  for (int64_t j = 0; j < m; j++) {
    int64_t i = rows[j];
    prefetch_ahead(c, rows, j, ahead);
    /* each row is checked on its first visit, before any array is indexed by it (the
     * members' codes were checked before) */
    if (i < 0 || i >= c->n || !member_ok(c, i)) return RWA_RANGE;
    if (mem(c, i, RWA_M_N_RANKS_OK)) take_max(&n_ranks, mem(c, i, RWA_M_N_RANKS));
    take_range(&msg_min, &msg_max, c, RWA_IN_MSG_BYTES, i);
    take_range(&arr_min, &arr_max, c, RWA_IN_ARRIVAL, i);
    take_range(&gs_min, &gs_max, c, RWA_IN_GPU_START, i);
    take_range(&ge_min, &ge_max, c, RWA_IN_GPU_END, i);
    if (has(c, RWA_IN_DURATION, i)) take_min(&dur_min, val(c, RWA_IN_DURATION, i));
    if (mem(c, i, RWA_M_COMM_ID) >= 0) take_max(&comm_id, mem(c, i, RWA_M_COMM_ID));
    if (mem(c, i, RWA_M_COMM_NAME) >= 0) take_max(&comm_name, mem(c, i, RWA_M_COMM_NAME));
    int64_t h = mem(c, i, RWA_M_HOST);
    if (x->host_stamp[h] != g) { /* distinct hosts, stamped with the group */
      x->host_stamp[h] = g;
      hosts++;
    }
    if (!host_bounded(x, h)) {
      unbounded++;
    } else if (!top_ok || x->bound_ns[h] > top) {
      top = x->bound_ns[h];
      top_ok = 1;
    }
  }
  /* second pass: what depends on the group's latest times and largest bound */
  last_t la = {{0, 0}, {0, 0}, {0, 0}, 0, 0}, lg = la;
  int64_t at_arr = 0, at_gs = 0, at_top = 0;
  opt_t before_arr = {0, 0}, before_gs = {0, 0};
  int below_ok = 0;
  double below = 0.0;
  for (int64_t j = 0; j < m; j++) {
    int64_t i = rows[j];
    int a_ok = has(c, RWA_IN_ARRIVAL, i), s_ok = has(c, RWA_IN_GPU_START, i);
    int64_t a = val(c, RWA_IN_ARRIVAL, i), s = val(c, RWA_IN_GPU_START, i);
    if (!arr_max.ok || (a_ok && a == arr_max.v)) last_visit(&la, c, i);
    if (!gs_max.ok || (s_ok && s == gs_max.v)) last_visit(&lg, c, i);
    if (a_ok && arr_max.ok) {
      if (a == arr_max.v) at_arr++;
      else take_max(&before_arr, a);
    }
    if (s_ok && gs_max.ok) {
      if (s == gs_max.v) at_gs++;
      else take_max(&before_gs, s);
    }
    int64_t h = mem(c, i, RWA_M_HOST);
    if (host_bounded(x, h) && top_ok) {
      double b = x->bound_ns[h];
      if (b == top) at_top++;
      else if (b < top && (!below_ok || b > below)) {
        below = b;
        below_ok = 1;
      }
    }
  }
  opt_t second_arr = second_last(arr_max, at_arr, before_arr);
  opt_t second_gs = second_last(gs_max, at_gs, before_gs);
  opt_t emls = {0, 0};
  if (ge_min.ok && gs_max.ok) {
    if (__builtin_sub_overflow(ge_min.v, gs_max.v, &emls.v)) return RWA_OVERFLOW;
    emls.ok = 1;
  }
  int mismatch_ok = msg_min.ok;
  put_i(o, RWA_N_RANKS, g, n_ranks);
  put_i(o, RWA_N_SEEN, g, (opt_t){m, 1});
  put_i(o, RWA_HOSTS, g, (opt_t){hosts, 1});
  put_i(o, RWA_MSG_BYTES, g, msg_max);
  put_i(o, RWA_SIZE_MISMATCH, g, (opt_t){mismatch_ok && msg_min.v != msg_max.v, mismatch_ok});
  put_i(o, RWA_FIRST_ARRIVAL, g, arr_min);
  put_i(o, RWA_LAST_ARRIVAL, g, arr_max);
  put_i(o, RWA_SECOND_LAST_ARRIVAL, g, second_arr);
  put_i(o, RWA_LAST_RANK, g, la.rank);
  put_i(o, RWA_LAST_WORLD_RANK, g, la.world);
  put_i(o, RWA_LAST_HOST, g, la.host);
  put_i(o, RWA_FIRST_GPU_START, g, gs_min);
  put_i(o, RWA_LAST_GPU_START, g, gs_max);
  put_i(o, RWA_SECOND_LAST_GPU_START, g, second_gs);
  put_i(o, RWA_LAST_GPU_WORLD_RANK, g, lg.world);
  put_i(o, RWA_FIRST_GPU_END, g, ge_min);
  put_i(o, RWA_LAST_GPU_END, g, ge_max);
  put_i(o, RWA_END_MINUS_LAST_START, g, emls);
  put_i(o, RWA_MIN_DURATION, g, dur_min);
  put_i(o, RWA_COMM_ID, g, comm_id);
  put_i(o, RWA_COMM_NAME, g, comm_name);
  late_in_t t = {arr_max, gs_max, {0, 0}, {0, 0}, 0.0, 0.0, 0.0, 0, 0, 0, m};
  t.med_a = median_col(c, RWA_IN_ARRIVAL, rows, m, x->scratch, &t.med_a_ok);
  t.med_g = median_col(c, RWA_IN_GPU_START, rows, m, x->scratch, &t.med_g_ok);
  put_f(o, RWA_MEDIAN_ARRIVAL, g, t.med_a, t.med_a_ok);
  put_f(o, RWA_MEDIAN_GPU_START, g, t.med_g, t.med_g_ok);
  /* lag_bound_ns: 0 on one host; unknown when a host has no bound; else the sum
   * of the two largest bounds (the largest twice when two rows share it) */
  if (hosts == 1) t.bound_ok = 1;
  else if (unbounded == 0) {
    t.bound = top + (at_top >= 2 ? top : (below_ok ? below : 0.0));
    t.bound_ok = 1;
  }
  put_f(o, RWA_LAG_BOUND, g, t.bound, t.bound_ok);
  if (arr_max.ok && second_arr.ok) {
    if (__builtin_sub_overflow(arr_max.v, second_arr.v, &t.lag_a.v)) return RWA_OVERFLOW;
    t.lag_a.ok = 1;
  }
  if (gs_max.ok && second_gs.ok) {
    if (__builtin_sub_overflow(gs_max.v, second_gs.v, &t.lag_g.v)) return RWA_OVERFLOW;
    t.lag_g.ok = 1;
  }
  for (int64_t j = 0; j < m; j++) /* rows whose key joins (a communicator key) */
    if (mem(c, rows[j], RWA_M_COMM_KEY) >= 0 &&
        !late_row(&t, c, rows[j], x->n_world, x->late_i64, x->late_f64))
      return RWA_OVERFLOW;
  return 1;
}

/* Every collective's row (the `joined` rows of COLLECTIVES_QUERY, keys left to the
 * caller: group g's are those of row order[starts[g]]) into out_i64/out_f64/out_ok,
 * and each row whose member has a communicator key added to its world rank's
 * lateness (late_i64, late_f64: accumulators the caller zeroes once, RWA_L_HOST set
 * to -1, and passes to every call). `in`/`in_ok`: rwa_prepare's [n][RWA_IN] rows;
 * `members`: the members they point to (RWA_M_COMM_ID, RWA_M_COMM_NAME codes, -1
 * NULL; RWA_M_WORLD_CODE in [0, n_world), NULL world ranks a code of their own);
 * per host: its clock row's bound (bound_ns where bound_ok; a host without a clock
 * row has none, as OPS_ALIGNED_SQL's LEFT JOIN of host_clock gives it).
 * `host_stamp`: n_hosts int64 set to -1; `scratch`: as many int64 as the largest
 * group has rows. */
RWA_EXPORT int64_t rwa_collectives(int64_t n_groups, const int64_t *starts,
                                   const int64_t *order, int64_t n, const int64_t *in,
                                   const uint8_t *in_ok, int64_t n_members,
                                   const int64_t *members, int64_t n_hosts,
                                   const double *bound_ns, const uint8_t *bound_ok,
                                   int64_t n_world, int64_t *host_stamp, int64_t *scratch,
                                   int64_t *out_i64, double *out_f64, uint8_t *out_ok,
                                   int64_t *late_i64, double *late_f64) {
  if (n_groups < 0 || n < 0 || n_members < 0 || n_hosts < 0 || n_world < 0) return RWA_RANGE;
  if (n > 0 && n_world < 1) return RWA_RANGE; /* every row has a world code */
  if (starts[0] != 0 || starts[n_groups] != n) return RWA_RANGE;
  for (int64_t g = 0; g < n_groups; g++)
    if (starts[g + 1] < starts[g]) return RWA_RANGE;
  if (!members_in_range(members, n_members, n_hosts, n_world)) return RWA_RANGE;
  cols_t c = {in, in_ok, n, members, n_members};
  ctx_t x = {n_hosts, n_world, host_stamp, scratch, late_i64, late_f64, bound_ns, bound_ok};
  out_t o = {out_i64, out_f64, out_ok, n_groups};
  for (int64_t g = 0; g < n_groups; g++) {
    int64_t got = one_group(&x, &c, &o, g, order + starts[g], starts[g + 1] - starts[g],
                            n - starts[g]);
    if (got < 0) return got;
  }
  return n_groups;
}

/* ------------------------------------------------------------------ inputs */

/* CAST(round(x) AS BIGINT) as DuckDB computes it (round half away from zero, as
 * C's round), without a call into libm: 0 when x is NaN or out of range. The
 * truncation is exact, and so is x - t (for |x| < 2^52 both lie within one of each
 * other; above, x is an integer and equals t). */
static inline int round_to_i64(double x, int64_t *out) {
  if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) return 0;
  int64_t t = (int64_t)x;
  double frac = x - (double)t;
  *out = t + (frac >= 0.5) - (frac <= -0.5);
  return 1;
}

/* One time column on the reference clock, as OPS_ALIGNED_SQL maps it:
 * v - CAST(round(offset + drift_ppm * 1e-6 * CAST(v - t0 AS DOUBLE)) AS BIGINT),
 * NULL where the host has no clock row. Returns 1 (a value), 0 (NULL) or -1 (an
 * int64 overflow, which SQL raises as an error). Built with -ffp-contract=off so
 * that the multiply and add round as DuckDB's do. */
static int corrected(int64_t v, int64_t h, const uint8_t *clock_ok, const double *offset_ns,
                     const double *drift_ppm, const int64_t *t0_ns, int64_t *out) {
  if (!clock_ok[h]) return 0;
  int64_t since, shift;
  if (__builtin_sub_overflow(v, t0_ns[h], &since)) return -1;
  if (!round_to_i64(offset_ns[h] + drift_ppm[h] * 1e-6 * (double)since, &shift)) return -1;
  if (__builtin_sub_overflow(v, shift, out)) return -1;
  return 1;
}

/* The rows of one pass of rwa_collectives from a job's captured collective ops
 * (rankwatch.store.captured): per row its member (an index into `members`, which
 * gives communicator, rank, host and world rank), function code (mapped through
 * func_rank into the order of the function names), seq, message size, times and
 * clock error (NULL where the bit of RW_V_* in `valid` is clear) and whether it
 * completed; per host its clock (clock_ok 0: no clock row, every corrected time
 * NULL). A pass takes the n_sel rows listed in `sel` (rwa_partition's).
 * Writes at most `cap` rows of rwa_group's keys (out_*) and of the kernels' inputs
 * (in, in_ok) and returns how many; RWA_RANGE for a code out of range or more rows
 * than cap, RWA_OVERFLOW where SQL would raise an int64 overflow. A row holds its
 * member's index, not the member's columns: half the bytes to write and to read back. */
RWA_EXPORT int64_t rwa_prepare(
    int64_t n, const int32_t *member, const int32_t *func, const int64_t *seq,
    const int64_t *msg, const int64_t *arrival, const int64_t *gpu_start, const int64_t *gpu_end,
    const int64_t *clock_error, const uint8_t *valid, int64_t n_members, const int64_t *members,
    int64_t n_funcs, const int64_t *func_rank, int64_t n_hosts, const uint8_t *clock_ok,
    const double *offset_ns, const double *drift_ppm, const int64_t *t0_ns, int64_t n_sel,
    const int32_t *sel, int64_t cap, int64_t *out_comm, int64_t *out_func, int64_t *out_seq,
    uint8_t *out_seq_ok, int64_t *in, uint8_t *in_ok) {
  if (n < 0 || n_members < 0 || n_funcs < 0 || n_hosts < 0 || n_sel < 0 || cap < 0)
    return RWA_RANGE;
  if (!members_in_range(members, n_members, n_hosts, 0)) return RWA_RANGE;
  int64_t k = 0;
  for (int64_t j = 0; j < n_sel; j++) {
    int64_t i = sel[j];
    if (i < 0 || i >= n) return RWA_RANGE;
    int64_t m = member[i], f = func[i];
    if (m < 0 || m >= n_members || f < 0 || f >= n_funcs || k >= cap) return RWA_RANGE;
    int64_t h = member_col(members, m, RWA_M_HOST);
    out_comm[k] = member_col(members, m, RWA_M_COMM_KEY);
    out_func[k] = func_rank[f];
    out_seq[k] = seq[i];
    out_seq_ok[k] = 1;
    int64_t *row = in + k * RWA_IN;
    uint8_t *ok = in_ok + k * RWA_IN;
    row[RWA_IN_MEMBER] = m;
    ok[RWA_IN_MEMBER] = 1;
    row[RWA_IN_MSG_BYTES] = msg[i];
    ok[RWA_IN_MSG_BYTES] = (uint8_t)((valid[i] & RW_V_MSG) != 0);
    const int64_t *times[3] = {arrival, gpu_start, gpu_end};
    const int cols[3] = {RWA_IN_ARRIVAL, RWA_IN_GPU_START, RWA_IN_GPU_END};
    const int bits[3] = {RW_V_ARRIVAL, RW_V_GPU_START, RW_V_GPU_END};
    for (int t = 0; t < 3; t++) {
      int got = 0;
      row[cols[t]] = 0;
      if (valid[i] & bits[t]) {
        got = corrected(times[t][i], h, clock_ok, offset_ns, drift_ppm, t0_ns, &row[cols[t]]);
        if (got < 0) return RWA_OVERFLOW;
      }
      ok[cols[t]] = (uint8_t)got;
    }
    int both = (valid[i] & RW_V_GPU_START) && (valid[i] & RW_V_GPU_END);
    row[RWA_IN_DURATION] = 0;
    if (both && __builtin_sub_overflow(gpu_end[i], gpu_start[i], &row[RWA_IN_DURATION]))
      return RWA_OVERFLOW;
    ok[RWA_IN_DURATION] = (uint8_t)both;
    row[RWA_IN_CLOCK_ERROR] = clock_error[i];
    ok[RWA_IN_CLOCK_ERROR] = (uint8_t)((valid[i] & RW_V_CLOCK_ERROR) != 0);
    row[RWA_IN_COMPLETE] = !(valid[i] & RW_V_INCOMPLETE); /* coalesce(complete, true) */
    ok[RWA_IN_COMPLETE] = 1;
    k++;
  }
  return k;
}

/* -------------------------------------------------------------- host clocks */

/* Per-host accumulators of rwa_clock_obs, int64 [RWA_OBS_SCRATCH][n_hosts]. */
enum { OBS_STAMP, OBS_MIN_END, OBS_MAX_START, OBS_HAS_START, OBS_ERR, OBS_COUNT, OBS_SEEN };

/* What clock.py's OBS_SQL computes, from one pass of rwa_prepare's rows made with
 * the identity clock (raw host times) and grouped by rwa_group: for each
 * collective whose communicator spans several hosts (multi[comm], comm >= 0) and
 * each host among its rows that have a GPU end and did not fail to complete,
 * CAST(min(gpu_end) - t0 AS DOUBLE), CAST(max(coalesce(gpu_start, arrival)) - t0
 * AS DOUBLE) (NULL when neither is known), avg(CAST(gpu_end - t0 AS DOUBLE)) and
 * CAST(max(coalesce(clock_error, 0)) AS DOUBLE). Observations of one collective
 * are written together (hosts in the order they first appear), numbered
 * first_id + g for group g. `scratch`: RWA_OBS_SCRATCH * n_hosts int64 with the
 * first n_hosts (the stamps) set to -1 by the caller; `sums`: n_hosts doubles.
 * Returns how many were written; RWA_RANGE past cap or for a code out of range,
 * RWA_OVERFLOW where SQL raises an int64 overflow. */
RWA_EXPORT int64_t rwa_clock_obs(int64_t n_groups, const int64_t *starts, const int64_t *order,
                                 int64_t n, const int64_t *in, const uint8_t *in_ok,
                                 int64_t n_members, const int64_t *members,
                                 const int64_t *comm, int64_t n_comm, const uint8_t *multi,
                                 int64_t n_hosts, int64_t *scratch, double *sums,
                                 int64_t t0_ns, int64_t first_id, int64_t cap, int64_t *out_id,
                                 int64_t *out_host, double *out_min_end, double *out_max_start,
                                 uint8_t *out_max_start_ok, double *out_mean_end,
                                 double *out_err) {
  if (n_groups < 0 || n < 0 || n_members < 0 || n_comm < 0 || n_hosts < 0 || cap < 0)
    return RWA_RANGE;
  if (starts[0] != 0 || starts[n_groups] != n) return RWA_RANGE;
  if (!members_in_range(members, n_members, n_hosts, 0)) return RWA_RANGE;
  int64_t *stamp = scratch + OBS_STAMP * n_hosts, *min_end = scratch + OBS_MIN_END * n_hosts;
  int64_t *max_start = scratch + OBS_MAX_START * n_hosts;
  int64_t *has_start = scratch + OBS_HAS_START * n_hosts, *err = scratch + OBS_ERR * n_hosts;
  int64_t *count = scratch + OBS_COUNT * n_hosts, *seen = scratch + OBS_SEEN * n_hosts;
  cols_t rows_in = {in, in_ok, n, members, n_members};
  int64_t k = 0;
  for (int64_t g = 0; g < n_groups; g++) {
    int64_t lo = starts[g], hi = starts[g + 1];
    if (hi < lo || hi > n) return RWA_RANGE;
    if (lo == hi) continue;
    if (order[lo] < 0 || order[lo] >= n) return RWA_RANGE;
    int64_t c = comm[order[lo]];
    if (c < -1 || c >= n_comm) return RWA_RANGE;
    if (c < 0 || !multi[c]) continue; /* NULL keys do not join; one-host communicators */
    int64_t hosts = 0;
    for (int64_t j = lo; j < hi; j++) {
      int64_t i = order[j];
      if (i < 0 || i >= n) return RWA_RANGE;
      prefetch_ahead(&rows_in, order, j, n);
      const int64_t *row = in + i * RWA_IN;
      const uint8_t *ok = in_ok + i * RWA_IN;
      if (!ok[RWA_IN_GPU_END] || !row[RWA_IN_COMPLETE]) continue;
      if (!member_ok(&rows_in, i)) return RWA_RANGE;
      int64_t h = mem(&rows_in, i, RWA_M_HOST);
      int64_t end = row[RWA_IN_GPU_END], since;
      if (__builtin_sub_overflow(end, t0_ns, &since)) return RWA_OVERFLOW;
      int start_ok = ok[RWA_IN_GPU_START] || ok[RWA_IN_ARRIVAL];
      int64_t start = ok[RWA_IN_GPU_START] ? row[RWA_IN_GPU_START] : row[RWA_IN_ARRIVAL];
      int64_t error = ok[RWA_IN_CLOCK_ERROR] ? row[RWA_IN_CLOCK_ERROR] : 0;
      if (stamp[h] != g) { /* the host's first row in this collective */
        stamp[h] = g;
        seen[hosts++] = h;
        min_end[h] = end, err[h] = error, count[h] = 0, sums[h] = 0.0;
        has_start[h] = 0;
      }
      if (end < min_end[h]) min_end[h] = end;
      if (error > err[h]) err[h] = error;
      if (start_ok && (!has_start[h] || start > max_start[h])) {
        max_start[h] = start;
        has_start[h] = 1;
      }
      sums[h] += (double)since;
      count[h]++;
    }
    if (k + hosts > cap) return RWA_RANGE;
    for (int64_t q = 0; q < hosts; q++, k++) {
      int64_t h = seen[q], d;
      out_id[k] = first_id + g;
      out_host[k] = h;
      if (__builtin_sub_overflow(min_end[h], t0_ns, &d)) return RWA_OVERFLOW;
      out_min_end[k] = (double)d;
      out_max_start[k] = 0.0;
      out_max_start_ok[k] = (uint8_t)has_start[h];
      if (has_start[h]) {
        if (__builtin_sub_overflow(max_start[h], t0_ns, &d)) return RWA_OVERFLOW;
        out_max_start[k] = (double)d;
      }
      out_mean_end[k] = sums[h] / (double)count[h];
      out_err[k] = (double)err[h];
    }
  }
  return k;
}

/* The pair of two observations of one collective as PAIRS_SQL forms it (a the
 * host with the smaller name), or 0 when the pair is not wanted (pair_of < 0). */
typedef struct {
  int64_t pair;
  double t, d, up, lo;
  int up_ok, lo_ok;
} pair_t;

static int make_pair(int64_t x, int64_t y, const int64_t *host, const double *min_end,
                     const double *max_start, const uint8_t *max_start_ok,
                     const double *mean_end, const double *err, int64_t n_hosts,
                     const int64_t *pair_of, pair_t *p) {
  if (host[x] == host[y]) return 0;
  int64_t a = host[x] < host[y] ? x : y, b = a == x ? y : x;
  p->pair = pair_of[host[a] * n_hosts + host[b]];
  if (p->pair < 0) return 0;
  p->t = (mean_end[a] + mean_end[b]) / 2;
  p->d = mean_end[a] - mean_end[b];
  p->up_ok = max_start_ok[b];
  p->up = p->up_ok ? min_end[a] - max_start[b] + err[a] + err[b] : 0.0;
  p->lo_ok = max_start_ok[a];
  p->lo = p->lo_ok ? max_start[a] - min_end[b] - err[a] - err[b] : 0.0;
  return 1;
}

/* The host pairs of every collective's observations (rwa_clock_obs's, in order of
 * id), each in cell pair * n_buckets + (floor(t / width) - bucket_lo), by mode:
 *   RWA_PAIRS_RANGE    range[0..2] = smallest and largest bucket, number of pairs;
 *   RWA_PAIRS_COUNT    cell_next[cell]++ (the caller zeroes it);
 *   RWA_PAIRS_FILL     values[cell_next[cell]++] = d, cell_t_sum[cell] += t (the
 *                      caller sets cell_next to each cell's offset, zeroes the sums);
 *   RWA_PAIRS_DETREND  with s = slope[a] - slope[b] and e = slope_err[pair]:
 *                      values[cell_next[cell]++] = d - s * t, and per pair the
 *                      min of up - s * t + e * |t| (upper) and the max of
 *                      lo - s * t - e * |t| (lower), as DETRENDED_SQL.
 * pair_of: n_hosts * n_hosts pair numbers (< n_pairs) of host codes a < b, -1 for
 * pairs not wanted. Returns the number of pairs; RWA_RANGE for a code or bucket out
 * of range. */
RWA_EXPORT int64_t rwa_clock_pairs(int mode, int64_t n_obs, const int64_t *id,
                                   const int64_t *host, const double *min_end,
                                   const double *max_start, const uint8_t *max_start_ok,
                                   const double *mean_end, const double *err, int64_t n_hosts,
                                   const int64_t *pair_of, int64_t n_pairs, double width,
                                   int64_t bucket_lo, int64_t n_buckets, int64_t *cell_next,
                                   double *values, double *cell_t_sum, const double *slope,
                                   const double *slope_err, double *upper, uint8_t *upper_ok,
                                   double *lower, uint8_t *lower_ok, int64_t *range) {
  if (n_obs < 0 || n_hosts < 0 || n_pairs < 0 || n_buckets < 0 || !(width > 0)) return RWA_RANGE;
  for (int64_t i = 0; i < n_obs; i++)
    if (host[i] < 0 || host[i] >= n_hosts || (i > 0 && id[i] < id[i - 1])) return RWA_RANGE;
  for (int64_t q = 0; q < n_hosts * n_hosts; q++)
    if (pair_of[q] < -1 || pair_of[q] >= n_pairs) return RWA_RANGE;
  int64_t rows = 0;
  for (int64_t lo = 0, hi; lo < n_obs; lo = hi) {
    for (hi = lo + 1; hi < n_obs && id[hi] == id[lo]; hi++) {
    }
    for (int64_t x = lo; x < hi; x++)
      for (int64_t y = x + 1; y < hi; y++) {
        pair_t p;
        if (!make_pair(x, y, host, min_end, max_start, max_start_ok, mean_end, err, n_hosts,
                       pair_of, &p))
          continue;
        double fb = floor(p.t / width);
        if (!(fb >= -4e18 && fb <= 4e18)) return RWA_RANGE;
        int64_t bucket = (int64_t)fb;
        if (mode == RWA_PAIRS_RANGE) {
          if (rows == 0 || bucket < range[0]) range[0] = bucket;
          if (rows == 0 || bucket > range[1]) range[1] = bucket;
          rows++;
          continue;
        }
        if (bucket < bucket_lo || bucket - bucket_lo >= n_buckets) return RWA_RANGE;
        int64_t cell = p.pair * n_buckets + (bucket - bucket_lo);
        rows++;
        if (mode == RWA_PAIRS_COUNT) {
          cell_next[cell]++;
        } else if (mode == RWA_PAIRS_FILL) {
          values[cell_next[cell]++] = p.d;
          cell_t_sum[cell] += p.t;
        } else if (mode == RWA_PAIRS_DETREND) {
          int64_t a = host[x] < host[y] ? host[x] : host[y], b = a == host[x] ? host[y] : host[x];
          double s = slope[a] - slope[b], e = slope_err[p.pair], at = fabs(p.t);
          values[cell_next[cell]++] = p.d - s * p.t;
          if (p.up_ok) {
            double u = p.up - s * p.t + e * at;
            if (!upper_ok[p.pair] || u < upper[p.pair]) upper[p.pair] = u, upper_ok[p.pair] = 1;
          }
          if (p.lo_ok) {
            double l = p.lo - s * p.t - e * at;
            if (!lower_ok[p.pair] || l > lower[p.pair]) lower[p.pair] = l, lower_ok[p.pair] = 1;
          }
        } else {
          return RWA_RANGE;
        }
      }
  }
  if (mode == RWA_PAIRS_RANGE) range[2] = rows;
  return rows;
}

/* PERCENTILE_CONT(0.5) of each segment values[offsets[s] .. offsets[s + 1]) as
 * DuckDB forms it (the middle value, or lo + (hi - lo) * 0.5 of the two middle
 * ones), NaN for an empty one; reorders the segments in place. Returns
 * n_segments, or RWA_RANGE. */
RWA_EXPORT int64_t rwa_medians(int64_t n_segments, const int64_t *offsets, double *values,
                               double *out) {
  if (n_segments < 0 || (n_segments > 0 && offsets[0] < 0)) return RWA_RANGE;
  for (int64_t s = 0; s < n_segments; s++)
    if (offsets[s + 1] < offsets[s]) return RWA_RANGE;
  for (int64_t s = 0; s < n_segments; s++) {
    int64_t m = offsets[s + 1] - offsets[s];
    double *v = values + offsets[s];
    if (m == 0) {
      out[s] = NAN;
      continue;
    }
    double hi = rw_select_f64(v, m, m / 2);
    if (m % 2) {
      out[s] = hi;
      continue;
    }
    double lo = v[0]; /* the largest of v[0 .. m / 2), all at most hi */
    for (int64_t j = 1; j < m / 2; j++)
      if (v[j] > lo) lo = v[j];
    out[s] = lo + (hi - lo) * 0.5;
  }
  return n_segments;
}

/* The rows of each pass, listed in row order in sel[starts[p] .. starts[p + 1]):
 * pass p takes a range of seq, the ranges in order and cut so that the passes
 * hold about n / passes rows each (all rows of one seq, so of one collective, go
 * to one pass). A file's rows come in seq order, so a pass's rows lie in a few
 * runs of the kept columns and the passes together read them about once (passes
 * by seq modulo `passes` each touched every cache line: at 3 M ops and 12 passes,
 * rwa_prepare ran at half speed). Seq is cut into at most n_buckets buckets of a
 * power-of-two width (`buckets`: scratch of n_buckets); a bucket goes to the pass
 * its first row falls in. One counting sort: every pass scanning all rows would
 * cost passes times as much. Returns n, or RWA_RANGE (passes < 1, n_buckets < 2,
 * or more rows than int32 indices hold). */
RWA_EXPORT int64_t rwa_partition(int64_t n, const int64_t *seq, int64_t passes,
                                 int64_t n_buckets, int64_t *buckets, int32_t *sel,
                                 int64_t *starts) {
  if (n < 0 || n > INT32_MAX || passes < 1 || n_buckets < 2) return RWA_RANGE;
  for (int64_t p = 0; p <= passes; p++) starts[p] = 0;
  if (n == 0) return 0;
  int64_t lo = seq[0], hi = seq[0];
  for (int64_t i = 1; i < n; i++) {
    if (seq[i] < lo) lo = seq[i];
    if (seq[i] > hi) hi = seq[i];
  }
  uint64_t span = (uint64_t)hi - (uint64_t)lo; /* hi - lo, which may not fit int64 */
  int shift = 0;
  while (shift < 63 && (span >> shift) >= (uint64_t)n_buckets) shift++;
  int64_t used = (int64_t)(span >> shift) + 1;
#define RWA_BUCKET(i) ((int64_t)(((uint64_t)seq[i] - (uint64_t)lo) >> shift))
  for (int64_t b = 0; b < used; b++) buckets[b] = 0;
  for (int64_t i = 0; i < n; i++) buckets[RWA_BUCKET(i)]++;
  int64_t before = 0, per = (n + passes - 1) / passes;
  for (int64_t b = 0; b < used; b++) { /* counts become pass numbers */
    int64_t count = buckets[b], p = before / per;
    buckets[b] = p < passes ? p : passes - 1;
    before += count;
  }
  for (int64_t i = 0; i < n; i++) starts[buckets[RWA_BUCKET(i)] + 1]++;
  for (int64_t p = 0; p < passes; p++) starts[p + 1] += starts[p];
  for (int64_t i = 0; i < n; i++) sel[starts[buckets[RWA_BUCKET(i)]]++] = (int32_t)i;
#undef RWA_BUCKET
  for (int64_t p = passes; p > 0; p--) starts[p] = starts[p - 1];
  starts[0] = 0;
  return n;
}

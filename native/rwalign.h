/* rwalign: compiled kernels of rankwatch's cross-rank alignment (see rwalign.c;
 * rankwatch/align/kernels.py binds them with ctypes). Every kernel returns a count
 * or RWA_OK (>= 0), or RWA_RANGE / RWA_OVERFLOW (< 0: the caller falls back to the
 * SQL form, which reports the problem as it always did). */
#ifndef RWALIGN_H
#define RWALIGN_H

#include <stdint.h>

#include "rwkept.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { RWA_OK = 0, RWA_RANGE = -2, RWA_OVERFLOW = -3 };

/* Per-row int64 inputs of rwa_collectives and rwa_clock_obs, columns of a row-major
 * [n][RWA_IN]: 64 bytes a row. What the row's member says (its communicator, rank,
 * host and world rank) is read from the members table (RWA_M_*) at RWA_IN_MEMBER. */
enum {
  RWA_IN_MEMBER, RWA_IN_MSG_BYTES, RWA_IN_ARRIVAL, RWA_IN_GPU_START, RWA_IN_GPU_END,
  RWA_IN_DURATION, RWA_IN_CLOCK_ERROR, RWA_IN_COMPLETE, RWA_IN
};

/* Per-collective outputs: int64 columns, then double columns; one validity row
 * per column in the same order ([RWA_OUT_I64 + RWA_OUT_F64][n_groups]). */
enum {
  RWA_N_RANKS, RWA_N_SEEN, RWA_HOSTS, RWA_MSG_BYTES, RWA_SIZE_MISMATCH, RWA_FIRST_ARRIVAL,
  RWA_LAST_ARRIVAL, RWA_SECOND_LAST_ARRIVAL, RWA_LAST_RANK, RWA_LAST_WORLD_RANK,
  RWA_LAST_HOST, RWA_FIRST_GPU_START, RWA_LAST_GPU_START, RWA_SECOND_LAST_GPU_START,
  RWA_LAST_GPU_WORLD_RANK, RWA_FIRST_GPU_END, RWA_LAST_GPU_END, RWA_END_MINUS_LAST_START,
  RWA_MIN_DURATION, RWA_COMM_ID, RWA_COMM_NAME, RWA_OUT_I64
};
enum { RWA_MEDIAN_ARRIVAL, RWA_MEDIAN_GPU_START, RWA_LAG_BOUND, RWA_OUT_F64 };

/* Per-world-rank accumulators of rank_lateness, [RWA_LATE_I64][n_world] and
 * [RWA_LATE_F64][n_world], added to across calls. */
enum {
  RWA_L_COLLECTIVES, RWA_L_LAST_ARRIVALS, RWA_L_ARRIVAL_LAG_SUM, RWA_L_ARRIVAL_LAG_N,
  RWA_L_LAST_GPU_STARTS, RWA_L_GPU_LAG_SUM, RWA_L_GPU_LAG_N, RWA_L_SIGNIFICANT_ARRIVALS,
  RWA_L_SIGNIFICANT_GPU_STARTS, RWA_L_HOST, RWA_L_ARRIVAL_VS_MEDIAN_N,
  RWA_L_GPU_VS_MEDIAN_N, RWA_L_BOUND_N, RWA_LATE_I64
};
enum {
  RWA_L_ARRIVAL_VS_MEDIAN_SUM, RWA_L_GPU_VS_MEDIAN_SUM, RWA_L_MAX_BOUND, RWA_LATE_F64
};

/* The columns of a member (one rank of one communicator in one process, as its
 * records' header names it) that rwa_prepare reads and the rows it writes point to, [n_members][RWA_M] int64. String
 * columns are codes in the order of their strings, -1 for NULL; RWA_M_HOST is a
 * code in [0, n_hosts); RWA_M_WORLD_CODE in [0, n_world). */
enum {
  RWA_M_COMM_KEY, RWA_M_COMM_ID, RWA_M_COMM_NAME, RWA_M_RANK, RWA_M_N_RANKS, RWA_M_N_RANKS_OK,
  RWA_M_HOST, RWA_M_WORLD_RANK, RWA_M_WORLD_OK, RWA_M_WORLD_CODE, RWA_M
};

int64_t rwa_prepare(int64_t n, const int32_t *member, const int32_t *func, const int64_t *seq,
                    const int64_t *msg, const int64_t *arrival, const int64_t *gpu_start,
                    const int64_t *gpu_end, const int64_t *clock_error,
                    const uint8_t *valid, int64_t n_members,
                    const int64_t *members, int64_t n_funcs, const int64_t *func_rank,
                    int64_t n_hosts, const uint8_t *clock_ok, const double *offset_ns,
                    const double *drift_ppm, const int64_t *t0_ns, int64_t n_sel,
                    const int32_t *sel, int64_t cap, int64_t *out_comm, int64_t *out_func,
                    int64_t *out_seq, uint8_t *out_seq_ok, int64_t *in, uint8_t *in_ok);
int64_t rwa_partition(int64_t n, const int64_t *seq, int64_t passes, int64_t n_buckets,
                      int64_t *buckets, int32_t *sel, int64_t *starts);
/* rwa_clock_obs: per (collective, host) observations of clock.py's OBS_SQL. */
enum { RWA_OBS_SCRATCH = 7 };
int64_t rwa_clock_obs(int64_t n_groups, const int64_t *starts, const int64_t *order, int64_t n,
                      const int64_t *in, const uint8_t *in_ok, int64_t n_members,
                      const int64_t *members, const int64_t *comm, int64_t n_comm,
                      const uint8_t *multi, int64_t n_hosts,
                      int64_t *scratch, double *sums, int64_t t0_ns,
                      int64_t first_id, int64_t cap, int64_t *out_id, int64_t *out_host,
                      double *out_min_end, double *out_max_start, uint8_t *out_max_start_ok,
                      double *out_mean_end, double *out_err);
/* rwa_clock_pairs: pairs of observations of one collective (PAIRS_SQL) by cell
 * (pair, time bucket); see rwalign.c for the modes. */
enum { RWA_PAIRS_RANGE, RWA_PAIRS_COUNT, RWA_PAIRS_FILL, RWA_PAIRS_DETREND };
int64_t rwa_clock_pairs(int mode, int64_t n_obs, const int64_t *id, const int64_t *host,
                        const double *min_end, const double *max_start,
                        const uint8_t *max_start_ok, const double *mean_end, const double *err,
                        int64_t n_hosts, const int64_t *pair_of, int64_t n_pairs, double width,
                        int64_t bucket_lo, int64_t n_buckets, int64_t *cell_next,
                        double *values, double *cell_t_sum, const double *slope,
                        const double *slope_err, double *upper, uint8_t *upper_ok, double *lower,
                        uint8_t *lower_ok, int64_t *range);
/* rwa_medians: PERCENTILE_CONT(0.5) of each segment of values (sorted in place). */
int64_t rwa_medians(int64_t n_segments, const int64_t *offsets, double *values, double *out);

int64_t rwa_group(int64_t n, const int64_t *comm, const int64_t *func, const int64_t *seq,
                  const uint8_t *seq_ok, int64_t cap, int64_t *table, int64_t *first,
                  int64_t *group, int64_t *order, int64_t *starts);
int64_t rwa_collectives(int64_t n_groups, const int64_t *starts, const int64_t *order,
                        int64_t n, const int64_t *in, const uint8_t *in_ok, int64_t n_members,
                        const int64_t *members, int64_t n_hosts, const double *bound_ns,
                        const uint8_t *bound_ok, int64_t n_world,
                        int64_t *host_stamp, int64_t *scratch, int64_t *out_i64,
                        double *out_f64, uint8_t *out_ok, int64_t *late_i64,
                        double *late_f64);

#ifdef __cplusplus
}
#endif

#endif

/* rwkept: the layout of the collective columns rankwatch's native reader keeps
 * while it parses (rankwatch.store.captured; rwparse.c's rwp_capture writes them,
 * rwalign.c's rwa_prepare reads them). */
#ifndef RWKEPT_H
#define RWKEPT_H

/* The validity bits of a kept row's nullable columns (rankwatch.store.captured
 * .VALID_BITS and INCOMPLETE_BIT; a test keeps them equal). */
enum {
  RW_V_MSG = 1, RW_V_ARRIVAL = 2, RW_V_GPU_START = 4, RW_V_GPU_END = 8,
  RW_V_CLOCK_ERROR = 16, RW_V_INCOMPLETE = 32 /* `complete` is false (not NULL, not true) */
};

/* The chunk columns rwp_capture reads, by index of its `values` and `valid` arrays
 * (rankwatch.store.captured.CAPTURE_COLUMNS). */
enum {
  RW_C_KIND, RW_C_FUNC, RW_C_SEQ, RW_C_MSG, RW_C_ARRIVAL, RW_C_GPU_START, RW_C_GPU_END,
  RW_C_CLOCK_ERROR, RW_C_COMPLETE, RW_C_COMM_ID, RW_C_COMM_NAME, RW_C_RANK, RW_C_N_RANKS,
  RW_C_HOST, RW_C_PID, RW_C
};

/* The chunk columns rwp_groups reads (rankwatch.store.grouped.GROUP_COLUMNS): the
 * key columns first (string codes, int64), then the ones it aggregates. */
enum {
  RW_G_COMM_ID, RW_G_COMM_NAME, RW_G_RANK, RW_G_HOST, RW_G_PID, RW_G_DEVICE, RW_G_FUNC,
  RW_G_KIND, RW_G_JOB, RW_G_KEYS, /* key columns before this */
  RW_G_N_RANKS = RW_G_KEYS, RW_G_NNODES, RW_G_ARRIVAL, RW_G_GPU_END, RW_G_ENQUEUE_END,
  RW_G_GPU_START, RW_G
};
/* Whether rwp_groups's column c holds string codes (int32), not int64 values. */
static inline int rw_g_is_code(int c) {
  return c == RW_G_COMM_ID || c == RW_G_COMM_NAME || c == RW_G_HOST || c == RW_G_FUNC ||
         c == RW_G_KIND || c == RW_G_JOB;
}
/* What rwp_groups keeps of each group, by index of `out_agg` and bit of
 * `out_valid` (rankwatch.store.grouped.AGGREGATES): max n_ranks, max nnodes, min
 * arrival, max of (gpu end, else enqueue end, else arrival), min gpu start of the
 * rows with a gpu end, max gpu end of the rows with a gpu start. */
enum {
  RW_A_N_RANKS, RW_A_NNODES, RW_A_FIRST_ARRIVAL, RW_A_LAST_END, RW_A_FIRST_TIMED_START,
  RW_A_LAST_TIMED_END, RW_A
};

/* Member keys packed into 64 bits by rwp_capture: comm id code, comm name code + 1,
 * rank, n_ranks + 1 (rankwatch.store.captured compares them, nothing unpacks them). */
#define RW_KEY_CODE_BITS 12
#define RW_KEY_INT_BITS 20
/* Processes (host, pid) that rwp_capture numbers in one chunk; beyond, it packs none. */
#define RW_MAX_PROCS 4096

#endif

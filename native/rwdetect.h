/* rwdetect: compiled kernels of rankwatch's streaming detectors (see rwdetect.c for
 * what each computes; rankwatch/detect/kernels.py binds them with ctypes). Every
 * kernel returns a count or RWD_OK (>= 0), RWD_UNORDERED or RWD_RANGE (< 0: nothing
 * was changed). */
#ifndef RWDETECT_H
#define RWDETECT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { RWD_OK = 0, RWD_UNORDERED = -1, RWD_RANGE = -2 };

int64_t rwd_stale(int64_t n, const int64_t *cslot, int64_t n_slots, const double *arrival,
                  const double *gstart, const double *gend, const int64_t *order,
                  int64_t n_order, double *slot_end, double *slot_start, uint8_t *stale,
                  double *scratch);
int64_t rwd_gaps(int64_t n, const int64_t *proc, int64_t n_procs, const double *arrival,
                 const double *gstart, const double *gend, const int64_t *uid,
                 double *carry_arrival, double *carry_gend, int64_t *carry_uid,
                 int64_t *prev_uid, double *gap_g, double *gap_h, double *dur);
int64_t rwd_op_index(int64_t n, const uint8_t *p2p, const int64_t *cslot, int64_t n_slots,
                     const int64_t *func, int64_t n_funcs, const int64_t *seq,
                     const double *arrival_c, const int64_t *order, int64_t n_order,
                     int64_t *last_seq, int64_t *op_count, int64_t *idx, int64_t *scratch);
int64_t rwd_replay(int64_t n_inst, const int64_t *starts, int64_t n_rec, const double *g,
                   const int64_t *prev, const double *dgap, const double *g_max,
                   const double *cut, double *shift);
int64_t rwd_columns(int64_t n, const int64_t *proc, const int64_t *comm, const int64_t *rank,
                    const int64_t *func, const int64_t *seq, const int64_t *peer,
                    int64_t n_procs, int64_t n_comms, const int64_t *comm_class,
                    const int64_t *proc_stage, const int64_t *slot_base,
                    const int64_t *comm_size, int32_t *cls, int32_t *stage, uint8_t *p2p,
                    int64_t *key, int64_t *uid, int64_t *sym, int64_t *cslot);
int64_t rwd_cusum(int64_t n, const double *step, const int64_t *group, const double *carry,
                  int64_t n_carry, const int64_t *gstart, double *s, uint8_t *zero,
                  int64_t *last_zero);
int64_t rwd_instances(int64_t n, const int64_t *uid, const int64_t *seg, const double *gend,
                      const int64_t *prev_uid, int64_t cap, int64_t *table, int64_t *inst,
                      int64_t *prev_inst, int64_t *inst_seg, int64_t *inst_uid,
                      double *inst_end);
int64_t rwd_rank_runs(int64_t m, const int64_t *idx, int64_t n, const int64_t *proc,
                      int64_t n_procs, const double *gstart, const uint8_t *hit,
                      const uint8_t *pair, int64_t need_solo, int64_t need_pair,
                      int64_t *run_state, int64_t *miss_state, int64_t *tail_start,
                      int64_t *fired_rec, int64_t *fired_run, int64_t *fired_start,
                      int64_t *key, int64_t *gap, int64_t *count);
int64_t rwd_slot_state(int64_t n, const int64_t *flat, int64_t n_flat, const uint8_t *ok,
                       const int64_t *seq, const double *excess, const double *sigma,
                       const double *thr, int64_t learn, double z_clip, double cusum_k,
                       int64_t low_run, double low_s, int64_t *nobs, double *learn_x,
                       double *learn_sig, double *base, int64_t *run_state,
                       double *cusum_state, double *run_at, double *cusum_at, double *last_z,
                       const int64_t *comm, const int64_t *func, const double *arrival_c,
                       double *resid, uint8_t *hit, uint8_t *head, int64_t *f_rec,
                       int64_t *f_run, double *f_s, int64_t *f_run_start,
                       int64_t *f_cusum_start, double *f_z1, double *f_carried,
                       int64_t *fs, double *fz, double *tmp);
int64_t rwd_top_two(int64_t n_inst, const int64_t *start, int64_t n, const double *g,
                    int64_t *last, int64_t *second);

#ifdef __cplusplus
}
#endif

#endif

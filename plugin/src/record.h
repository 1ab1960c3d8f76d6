/* JSON formatting of records: the only code that names record fields
 * (docs/record-format.md). Runs on the writer thread only. */
#ifndef RANKWATCH_RECORD_H
#define RANKWATCH_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "rw.h"

typedef struct {
  char *p;
  size_t len, cap;
} rw_buf;

bool rw_buf_init(rw_buf *b, size_t cap);
void rw_buf_free(rw_buf *b);
bool rw_buf_room(rw_buf *b, size_t n); /* grows; false if it cannot */

/* A completed (or flushed) op, copied out of its slot. */
typedef struct {
  uint8_t kind, func, dtype, algo, proto, nchannels;
  int32_t root_or_peer;
  uint64_t seq, p2p_sn, count;
  int64_t api_start, api_end, enq_start, enq_end; /* 0 = unknown */
  int64_t gpu_start_raw, gpu_end_raw;             /* 0 = unknown */
  uint16_t ch_started, ch_stopped;
  uint64_t ch_mask;
  bool graph, gpu_timed, complete;
  bool gpu_start_stale; /* NCCL's channel start belongs to an earlier op */
  /* derived by the writer */
  int64_t offset, error; /* clock used; error < 0 = unbounded */
  bool have_offset;
  int64_t exec_ns;
  uint64_t msg_bytes; /* 0 with unknown datatype */
  bool msg_known;
  double algbw_gbs, busbw_gbs;
} rw_op;

void rw_json_op(rw_buf *b, rw_comm *c, const rw_op *op, int64_t now);
void rw_json_comm(rw_buf *b, const rw_comm *c, int64_t now);
void rw_json_clock(rw_buf *b, const rw_comm *c, int64_t now);
void rw_json_stats(rw_buf *b, int64_t now, const char *reason);

typedef struct {
  uint8_t kind, func;
  uint64_t seq;
  int32_t peer;
  const char *state;
  int64_t arrival_ns;
  uint16_t ch_started, ch_stopped;
} rw_inflight;
void rw_json_progress(rw_buf *b, const rw_comm *c, int64_t now, const char *reason,
                      const rw_inflight *ops, size_t nops, size_t total);

/* Low-level appenders, shared with the Prometheus writer. */
void rw_put(rw_buf *b, const char *s);
void rw_put_i64(rw_buf *b, int64_t v);
void rw_put_fixed(rw_buf *b, double v, int decimals);
void rw_put_json_str(rw_buf *b, const char *s);

#endif

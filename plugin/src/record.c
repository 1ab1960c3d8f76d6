/*
 * Record formatting with hand-written appenders (no printf on the per-op path:
 * at 100,000 ops/s the writer formats a record every 10 us). Field names and
 * order follow docs/record-format.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"

bool rw_buf_init(rw_buf *b, size_t cap) {
  b->p = malloc(cap);
  b->len = 0;
  b->cap = b->p ? cap : 0;
  return b->p != NULL;
}

void rw_buf_free(rw_buf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}

bool rw_buf_room(rw_buf *b, size_t n) {
  if (b->len + n <= b->cap) return true;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + n) cap *= 2;
  char *p = realloc(b->p, cap);
  if (p == NULL) return false;
  b->p = p;
  b->cap = cap;
  return true;
}

void rw_put(rw_buf *b, const char *s) {
  size_t n = strlen(s);
  if (!rw_buf_room(b, n)) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

/* Two digits per division: timestamps have 19 digits and dominate the
 * writer's time when printed one digit at a time. */
static const char digit_pairs[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

static void put_u64(rw_buf *b, uint64_t u) {
  char tmp[24];
  int i = 24;
  while (u >= 100) {
    unsigned d = (unsigned)(u % 100) * 2;
    u /= 100;
    tmp[--i] = digit_pairs[d + 1];
    tmp[--i] = digit_pairs[d];
  }
  if (u >= 10) {
    tmp[--i] = digit_pairs[u * 2 + 1];
    tmp[--i] = digit_pairs[u * 2];
  } else {
    tmp[--i] = (char)('0' + u);
  }
  if (!rw_buf_room(b, (size_t)(24 - i))) return;
  memcpy(b->p + b->len, tmp + i, (size_t)(24 - i));
  b->len += (size_t)(24 - i);
}

void rw_put_i64(rw_buf *b, int64_t v) {
  if (v < 0) {
    if (!rw_buf_room(b, 1)) return;
    b->p[b->len++] = '-';
    put_u64(b, (uint64_t)0 - (uint64_t)v);
  } else {
    put_u64(b, (uint64_t)v);
  }
}

void rw_put_fixed(rw_buf *b, double v, int decimals) {
  if (!isfinite(v)) {
    rw_put(b, "null");
    return;
  }
  int64_t scale = 1;
  for (int i = 0; i < decimals; i++) scale *= 10;
  if (v < 0) {
    rw_put(b, "-");
    v = -v;
  }
  if (v > 9e15 / (double)scale) v = 9e15 / (double)scale;
  int64_t x = (int64_t)llround(v * (double)scale);
  rw_put_i64(b, x / scale);
  if (decimals == 0) return;
  char frac[24];
  int64_t f = x % scale;
  for (int i = decimals - 1; i >= 0; i--, f /= 10) frac[i] = (char)('0' + f % 10);
  frac[decimals] = '\0';
  rw_put(b, ".");
  rw_put(b, frac);
}

void rw_put_json_str(rw_buf *b, const char *s) {
  static const char hex[] = "0123456789abcdef";
  if (!rw_buf_room(b, strlen(s) * 6 + 2)) return;
  b->p[b->len++] = '"';
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      b->p[b->len++] = '\\';
      b->p[b->len++] = (char)*p;
    } else if (*p < 0x20) {
      memcpy(b->p + b->len, "\\u00", 4);
      b->len += 4;
      b->p[b->len++] = hex[*p >> 4];
      b->p[b->len++] = hex[*p & 15];
    } else {
      b->p[b->len++] = (char)*p;
    }
  }
  b->p[b->len++] = '"';
}

void rw_json_quote(char *dst, size_t cap, const char *src) {
  rw_buf b = {.p = NULL, .len = 0, .cap = 0};
  rw_put_json_str(&b, src);
  snprintf(dst, cap, "%.*s", (int)b.len, b.p ? b.p : "\"\"");
  rw_buf_free(&b);
}

static void put_hex64(rw_buf *b, uint64_t v) {
  static const char hex[] = "0123456789abcdef";
  if (!rw_buf_room(b, 20)) return;
  b->p[b->len++] = '"';
  b->p[b->len++] = '0';
  b->p[b->len++] = 'x';
  for (int i = 15; i >= 0; i--) b->p[b->len++] = hex[(v >> (4 * i)) & 15];
  b->p[b->len++] = '"';
}

/* ,"key":value appenders. Keys are literals, so their length is known at
 * compile time and each costs one memcpy. */
static void put_n(rw_buf *b, const char *s, size_t n) {
  if (!rw_buf_room(b, n)) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
}
#define PUT_LIT(b, s) put_n((b), (s), sizeof(s) - 1)
#define KEY(b, k) PUT_LIT(b, ",\"" k "\":")
#define kv_i64(b, k, v) (KEY(b, k), rw_put_i64((b), (v)))
#define kv_str(b, k, v) (KEY(b, k), rw_put_json_str((b), (v)))
#define kv_bool(b, k, v) (KEY(b, k), (v) ? PUT_LIT(b, "true") : PUT_LIT(b, "false"))
#define kv_opt(b, k, known, v) (KEY(b, k), opt_i64((b), (known), (v)))

static void opt_i64(rw_buf *b, bool known, int64_t v) {
  if (known) rw_put_i64(b, v);
  else PUT_LIT(b, "null");
}

static void key(rw_buf *b, const char *k) {
  rw_put(b, ",\"");
  rw_put(b, k);
  rw_put(b, "\":");
}

/* ---- op records ---- */

static void put_header(rw_buf *b, const rw_comm *c, int64_t now) {
  rw_put(b, "{\"header\":{\"id\":");
  put_hex64(b, c->comm_id);
  KEY(b, "comm_name");
  rw_put(b, c->name_json);
  kv_i64(b, "rank", c->rank);
  kv_i64(b, "n_ranks", c->nranks);
  kv_i64(b, "nnodes", c->nnodes);
  rw_put(b, "},\"metadata\":{\"inspector_output_format_version\":\"v4.0\"");
  kv_str(b, "git_rev", "rankwatch-" RANKWATCH_VERSION);
  kv_str(b, "rec_mechanism", "nccl_profiler_interface");
  kv_i64(b, "dump_timestamp_us", now / 1000);
  KEY(b, "hostname");
  rw_put(b, rw_g.cfg.hostname_json);
  kv_i64(b, "pid", rw_g.pid);
  rw_put(b, "}");
}

static const char *const perf_keys[2][8] = {
    {",\"coll_perf\":{\"coll\":", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us",
     "coll_timing_source", "coll_algobw_gbs", "coll_busbw_gbs", NULL},
    {",\"p2p_perf\":{\"p2p\":", "p2p_sn", "p2p_msg_size_bytes", "p2p_exec_time_us",
     "p2p_timing_source", "p2p_algobw_gbs", "p2p_busbw_gbs", "p2p_peer"}};

static void put_perf(rw_buf *b, const rw_op *op) {
  bool coll = op->kind == RW_OP_COLL;
  const char *const *k = perf_keys[coll ? 0 : 1];
  rw_put(b, k[0]);
  rw_put_json_str(b, rw_name_str(RW_NAME_FUNC, op->func));
  key(b, k[1]);
  rw_put_i64(b, (int64_t)(coll ? op->seq : op->p2p_sn));
  if (!coll) {
    key(b, k[7]);
    rw_put_i64(b, op->root_or_peer);
  }
  key(b, k[2]);
  rw_put_i64(b, (int64_t)op->msg_bytes);
  key(b, k[3]);
  rw_put_i64(b, op->exec_ns / 1000);
  key(b, k[4]);
  rw_put_json_str(b, op->gpu_timed ? "kernel_gpu" : "collective_cpu");
  key(b, k[5]);
  rw_put_fixed(b, op->algbw_gbs, 6);
  key(b, k[6]);
  rw_put_fixed(b, op->busbw_gbs, 6);
  rw_put(b, "}");
}

static void put_times(rw_buf *b, const rw_op *op) {
  bool api = op->api_start != 0;
  kv_opt(b, "api_start_ns", api, op->api_start);
  kv_opt(b, "api_end_ns", api && op->api_end != 0, op->api_end);
  kv_opt(b, "enqueue_start_ns", op->enq_start != 0, op->enq_start);
  kv_opt(b, "enqueue_end_ns", op->enq_end != 0, op->enq_end);
  kv_i64(b, "arrival_ns", api ? op->api_start : op->enq_start);
  bool gs = op->gpu_start_raw != 0 && op->have_offset && !op->gpu_start_stale;
  bool ge = op->gpu_end_raw != 0 && op->have_offset;
  kv_opt(b, "gpu_start_ns", gs, op->gpu_start_raw + op->offset);
  kv_opt(b, "gpu_end_ns", ge, op->gpu_end_raw + op->offset);
  kv_opt(b, "gpu_start_raw_ns", op->gpu_start_raw != 0, op->gpu_start_raw);
  kv_opt(b, "gpu_end_raw_ns", op->gpu_end_raw != 0, op->gpu_end_raw);
  kv_opt(b, "clock_offset_ns", op->have_offset, op->offset);
  kv_opt(b, "clock_error_ns", op->have_offset && op->error >= 0, op->error);
  kv_i64(b, "exec_time_ns", op->exec_ns);
}

static void put_extension(rw_buf *b, const rw_comm *c, const rw_op *op) {
  bool coll = op->kind == RW_OP_COLL;
  rw_put(b, ",\"rankwatch\":{\"schema\":1");
  kv_str(b, "kind", coll ? "coll" : "p2p");
  KEY(b, "job_id");
  rw_put(b, rw_g.cfg.job_id_json);
  kv_opt(b, "device", c->device >= 0, c->device);
  kv_str(b, "func", rw_name_str(RW_NAME_FUNC, op->func));
  kv_i64(b, "seq", (int64_t)op->seq);
  kv_str(b, "datatype", rw_name_str(RW_NAME_DTYPE, op->dtype));
  kv_i64(b, "count", (int64_t)op->count);
  kv_opt(b, "msg_size_bytes", op->msg_known, (int64_t)op->msg_bytes);
  kv_opt(b, "root", coll, op->root_or_peer);
  kv_opt(b, "peer", !coll, op->root_or_peer);
  KEY(b, "algo");
  if (coll) rw_put_json_str(b, rw_name_str(RW_NAME_ALGO, op->algo));
  else rw_put(b, "null");
  KEY(b, "proto");
  if (coll) rw_put_json_str(b, rw_name_str(RW_NAME_PROTO, op->proto));
  else rw_put(b, "null");
  kv_i64(b, "nchannels", op->nchannels);
  kv_bool(b, "graph_captured", op->graph);
  put_times(b, op);
  kv_bool(b, "gpu_timed", op->gpu_timed);
  kv_bool(b, "gpu_start_stale", op->gpu_start_stale);
  kv_i64(b, "channels_started", op->ch_started);
  kv_i64(b, "channels_stopped", op->ch_stopped);
  kv_bool(b, "complete", op->complete);
  rw_put(b, "}");
}

/* NCCL Inspector's verbose block, from what rankwatch keeps per op: the
 * enqueue times and one entry per channel seen (the op's GPU span). */
static void put_verbose(rw_buf *b, const rw_op *op) {
  const char *p = op->kind == RW_OP_COLL ? "coll" : "p2p";
  rw_put(b, ",\"event_trace_ts\":{\"");
  rw_put(b, p);
  rw_put(b, "_start_ts\":");
  rw_put_i64(b, op->enq_start / 1000);
  rw_put(b, ",\"");
  rw_put(b, p);
  rw_put(b, "_stop_ts\":");
  rw_put_i64(b, op->enq_end / 1000);
  rw_put(b, ",\"kernel_events\":[");
  bool first = true;
  for (int ch = 0; ch < 64; ch++) {
    if (!(op->ch_mask >> ch & 1)) continue;
    rw_put(b, first ? "{\"channel_id\":" : ",{\"channel_id\":");
    rw_put_i64(b, ch);
    rw_put(b, "}");
    first = false;
  }
  rw_put(b, "]}");
}

void rw_json_op(rw_buf *b, rw_comm *c, const rw_op *op, int64_t now) {
  put_header(b, c, now);
  put_perf(b, op);
  if (rw_g.cfg.verbose) put_verbose(b, op);
  put_extension(b, c, op);
  rw_put(b, "}\n");
}

/* ---- state records ---- */

static void state_head(rw_buf *b, const char *kind, int64_t now) {
  rw_put(b, "{\"schema\":1");
  kv_str(b, "kind", kind);
  kv_i64(b, "ts_ns", now);
  KEY(b, "hostname");
  rw_put(b, rw_g.cfg.hostname_json);
  kv_i64(b, "pid", rw_g.pid);
}

static void comm_head(rw_buf *b, const char *kind, const rw_comm *c, int64_t now) {
  state_head(b, kind, now);
  KEY(b, "comm_id");
  put_hex64(b, c->comm_id);
  kv_i64(b, "rank", c->rank);
  kv_i64(b, "n_ranks", c->nranks);
}

void rw_json_comm(rw_buf *b, const rw_comm *c, int64_t now) {
  static const char *const timing[] = {"on", "off", "sampled"};
  state_head(b, "comm", now);
  KEY(b, "job_id");
  rw_put(b, rw_g.cfg.job_id_json);
  KEY(b, "comm_id");
  put_hex64(b, c->comm_id);
  KEY(b, "comm_name");
  rw_put(b, c->name_json);
  kv_i64(b, "rank", c->rank);
  kv_i64(b, "n_ranks", c->nranks);
  kv_i64(b, "nnodes", c->nnodes);
  kv_opt(b, "device", c->device >= 0, c->device);
  kv_i64(b, "abi_version", c->abi);
  kv_str(b, "plugin_version", RANKWATCH_VERSION);
  kv_str(b, "gpu_timing", timing[rw_g.cfg.gpu_timing]);
  rw_put(b, "}\n");
}

void rw_json_clock(rw_buf *b, const rw_comm *c, int64_t now) {
  const rw_clock *clk = rw_clock_of(c);
  int64_t lo, up;
  rw_clock_bounds(clk, &lo, &up);
  comm_head(b, "clock", c, now);
  kv_opt(b, "offset_ns", clk->valid, clk->offset);
  kv_opt(b, "error_ns", clk->valid && clk->error >= 0, clk->error);
  kv_opt(b, "lower_ns", lo != INT64_MIN, lo);
  kv_opt(b, "upper_ns", up != INT64_MAX, up);
  kv_i64(b, "samples", (int64_t)clk->samples);
  kv_i64(b, "window_start_ns", clk->window_start);
  rw_put(b, "}\n");
}

void rw_json_stats(rw_buf *b, int64_t now, const char *reason) {
  rw_stats *s = &rw_g.stats;
  state_head(b, "stats", now);
  kv_str(b, "reason", reason);
  kv_i64(b, "slots_total", rw_g.pool.nslots);
  /* Every accepted op is either still in a slot or already written. */
  int64_t in_use = rw_pool_count_in_use(&rw_g.pool);
  kv_i64(b, "slots_in_use", in_use);
  kv_i64(b, "ops_started", (int64_t)LD(&s->records_written) + in_use);
  kv_i64(b, "records_written", (int64_t)LD(&s->records_written));
  kv_i64(b, "dropped_pool_full", (int64_t)LD(&s->dropped_pool_full));
  kv_i64(b, "filtered_min_size", (int64_t)LD(&s->filtered_min_size));
  kv_i64(b, "stale_handles", (int64_t)LD(&s->stale_handles));
  kv_i64(b, "write_errors", (int64_t)LD(&s->write_errors));
  kv_i64(b, "bytes_written", (int64_t)LD(&s->bytes_written));
  kv_i64(b, "stream_sent_records", (int64_t)LD(&s->stream_sent_records));
  kv_i64(b, "stream_dropped_records", (int64_t)LD(&s->stream_dropped_records));
  kv_i64(b, "stream_sent_bytes", (int64_t)LD(&s->stream_sent_bytes));
  kv_i64(b, "stream_reconnects", (int64_t)LD(&s->stream_reconnects));
  rw_put(b, "}\n");
}

static void put_seq_tables(rw_buf *b, const rw_comm *c) {
  rw_put(b, ",\"colls\":{");
  bool first = true;
  for (int f = 1; f < RW_NCOLL_FUNCS; f++) {
    if (!first) rw_put(b, ",");
    first = false;
    rw_put_json_str(b, rw_name_str(RW_NAME_FUNC, (uint8_t)f));
    rw_put(b, ":{\"enqueued\":");
    rw_put_i64(b, LD(&c->seq_enqueued[f]));
    rw_put(b, ",\"started\":");
    rw_put_i64(b, LD(&c->seq_started[f]));
    rw_put(b, ",\"completed\":");
    rw_put_i64(b, LD(&c->seq_completed[f]));
    rw_put(b, "}");
  }
  rw_put(b, "},\"p2p\":{\"send_enqueued\":");
  put_u64(b, LD(&c->p2p_send_enq));
  rw_put(b, ",\"send_completed\":");
  put_u64(b, LD(&c->p2p_send_done));
  rw_put(b, ",\"recv_enqueued\":");
  put_u64(b, LD(&c->p2p_recv_enq));
  rw_put(b, ",\"recv_completed\":");
  put_u64(b, LD(&c->p2p_recv_done));
  rw_put(b, "}");
}

static void put_inflight(rw_buf *b, const rw_inflight *op, int64_t now) {
  bool coll = op->kind == RW_OP_COLL;
  rw_put(b, "{\"kind\":");
  rw_put(b, coll ? "\"coll\"" : "\"p2p\"");
  kv_str(b, "func", rw_name_str(RW_NAME_FUNC, op->func));
  kv_i64(b, "seq", (int64_t)op->seq);
  kv_opt(b, "peer", !coll, op->peer);
  kv_str(b, "state", op->state);
  kv_i64(b, "arrival_ns", op->arrival_ns);
  kv_i64(b, "age_ns", now - op->arrival_ns);
  kv_i64(b, "channels_started", op->ch_started);
  kv_i64(b, "channels_stopped", op->ch_stopped);
  rw_put(b, "}");
}

void rw_json_progress(rw_buf *b, const rw_comm *c, int64_t now, const char *reason,
                      const rw_inflight *ops, size_t nops, size_t total) {
  comm_head(b, "progress", c, now);
  kv_str(b, "reason", reason);
  put_seq_tables(b, c);
  kv_i64(b, "last_activity_ns", rw_comm_last_activity(c));
  kv_i64(b, "in_flight_count", (int64_t)total);
  rw_put(b, ",\"in_flight\":[");
  for (size_t i = 0; i < nops; i++) {
    if (i) rw_put(b, ",");
    put_inflight(b, &ops[i], now);
  }
  rw_put(b, "]}\n");
}

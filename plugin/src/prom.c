/*
 * Prometheus textfile output (RANKWATCH_PROM=1 or NCCL_INSPECTOR_PROM_DUMP=1),
 * rewritten atomically (temp file + rename) every interval for node_exporter's
 * textfile collector. rankwatch_* metrics follow Prometheus conventions (base
 * units, counters, rates left to PromQL); the nccl_* gauges repeat NCCL
 * Inspector's names and labels so its dashboards work unchanged.
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "record.h"
#include "rw.h"
#include "writer_internal.h"

#define RW_PROM_KEYS 32

typedef struct {
  uint64_t ops, payload_bytes, bus_bytes, duration_ns;
} rw_prom_counter;

typedef struct { /* Inspector: per interval, per (func, size bucket, algo, proto) */
  uint8_t func, algo, proto, kind;
  int64_t bucket;   /* lower bound, in bytes */
  double exec_us_sum, log_busbw_sum;
  uint64_t n, n_pos;
} rw_prom_interval;

struct rw_prom_agg {
  rw_prom_counter total[RW_NFUNC];
  rw_prom_interval interval[RW_PROM_KEYS];
  int ninterval;
};

static const char *const units[] = {"B", "KB", "MB", "GB", "TB"};

static int64_t size_bucket(uint64_t bytes, int *unit, int64_t *lower) {
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  *unit = u;
  *lower = (int64_t)v < 1 ? 1 : (int64_t)v;
  int64_t scale = 1;
  for (int i = 0; i < u; i++) scale *= 1024;
  return *lower * scale;
}

static rw_prom_interval *interval_slot(struct rw_prom_agg *a, const rw_op *op, int64_t bucket) {
  for (int i = 0; i < a->ninterval; i++) {
    rw_prom_interval *e = &a->interval[i];
    if (e->func == op->func && e->algo == op->algo && e->proto == op->proto &&
        e->bucket == bucket && e->kind == op->kind)
      return e;
  }
  if (a->ninterval == RW_PROM_KEYS) return NULL;
  rw_prom_interval *e = &a->interval[a->ninterval++];
  memset(e, 0, sizeof *e);
  e->func = op->func;
  e->algo = op->algo;
  e->proto = op->proto;
  e->kind = op->kind;
  e->bucket = bucket;
  return e;
}

void rw_prom_account(rw_comm *c, const rw_op *op) {
  if (c->prom == NULL && (c->prom = calloc(1, sizeof(*c->prom))) == NULL) return;
  rw_prom_counter *t = &c->prom->total[op->func < RW_NFUNC ? op->func : 0];
  t->ops++;
  t->payload_bytes += op->msg_bytes;
  if (isfinite(op->busbw_gbs) && op->exec_ns > 0)
    t->bus_bytes += (uint64_t)(op->busbw_gbs * (double)op->exec_ns);
  t->duration_ns += (uint64_t)op->exec_ns;
  int unit;
  int64_t lower;
  rw_prom_interval *e = interval_slot(c->prom, op, size_bucket(op->msg_bytes, &unit, &lower));
  if (e == NULL) return;
  e->n++;
  e->exec_us_sum += (double)op->exec_ns / 1000.0;
  if (isfinite(op->busbw_gbs) && op->busbw_gbs > 0) {
    e->log_busbw_sum += log(op->busbw_gbs);
    e->n_pos++;
  }
}

/* ---- text exposition ---- */

static void labels(rw_buf *b, const rw_comm *c) {
  char id[24];
  snprintf(id, sizeof id, "0x%016llx", (unsigned long long)c->comm_id);
  rw_put(b, "{comm_id=\"");
  rw_put(b, id);
  rw_put(b, "\",comm_name=");
  rw_put_json_str(b, c->name); /* JSON escaping is valid Prometheus label escaping here */
  rw_put(b, ",rank=\"");
  rw_put_i64(b, c->rank);
  rw_put(b, "\"");
}

static void family(rw_buf *b, const char *name, const char *type, const char *help) {
  rw_put(b, "# HELP ");
  rw_put(b, name);
  rw_put(b, " ");
  rw_put(b, help);
  rw_put(b, "\n# TYPE ");
  rw_put(b, name);
  rw_put(b, " ");
  rw_put(b, type);
  rw_put(b, "\n");
}

static void counter_family(rw_buf *b, const char *name, const char *help, int field) {
  family(b, name, "counter", help);
  for (uint32_t i = 0; i < RW_MAX_COMMS; i++) {
    rw_comm *c = rw_comm_at(i);
    if (c == NULL || c->prom == NULL) continue;
    for (int f = 0; f < RW_NFUNC; f++) {
      const rw_prom_counter *t = &c->prom->total[f];
      if (t->ops == 0) continue;
      rw_put(b, name);
      labels(b, c);
      rw_put(b, ",op=\"");
      rw_put(b, rw_name_str(RW_NAME_FUNC, (uint8_t)f));
      rw_put(b, "\"} ");
      if (field == 0) rw_put_i64(b, (int64_t)t->ops);
      else if (field == 1) rw_put_i64(b, (int64_t)t->payload_bytes);
      else if (field == 2) rw_put_i64(b, (int64_t)t->bus_bytes);
      else rw_put_fixed(b, (double)t->duration_ns / 1e9, 9);
      rw_put(b, "\n");
    }
  }
}

static void comm_gauges(rw_buf *b) {
  family(b, "rankwatch_ops_in_flight", "gauge", "Ops enqueued and not yet completed, at the last interval.");
  for (uint32_t i = 0; i < RW_MAX_COMMS; i++) {
    rw_comm *c = rw_comm_at(i);
    if (c == NULL) continue;
    rw_put(b, "rankwatch_ops_in_flight");
    labels(b, c);
    rw_put(b, "} ");
    rw_put_i64(b, c->inflight);
    rw_put(b, "\n");
  }
  family(b, "rankwatch_last_progress_timestamp_seconds", "gauge",
         "Host time of the last NCCL event on the communicator.");
  for (uint32_t i = 0; i < RW_MAX_COMMS; i++) {
    rw_comm *c = rw_comm_at(i);
    if (c == NULL) continue;
    rw_put(b, "rankwatch_last_progress_timestamp_seconds");
    labels(b, c);
    rw_put(b, "} ");
    rw_put_fixed(b, (double)rw_comm_last_activity(c) / 1e9, 6);
    rw_put(b, "\n");
  }
}

static void inspector_labels(rw_buf *b, const rw_comm *c, const rw_prom_interval *e) {
  int unit;
  int64_t lower;
  size_bucket((uint64_t)e->bucket, &unit, &lower);
  rw_put(b, "{version=\"v5.1\",slurm_job_id=");
  rw_put_json_str(b, rw_g.cfg.job_id);
  rw_put(b, ",node=");
  rw_put_json_str(b, rw_g.cfg.hostname);
  rw_put(b, ",gpu=\"GPU");
  rw_put_i64(b, c->device >= 0 ? c->device : 0);
  rw_put(b, "\",comm_name=");
  rw_put_json_str(b, c->name);
  rw_put(b, ",n_nodes=\"");
  rw_put_i64(b, c->nnodes);
  rw_put(b, "\",nranks=\"");
  rw_put_i64(b, c->nranks);
  rw_put(b, e->kind == RW_OP_COLL ? "\",collective=\"" : "\",p2p_operation=\"");
  rw_put(b, rw_name_str(RW_NAME_FUNC, e->func));
  rw_put(b, "\",message_size=\"");
  rw_put_i64(b, lower);
  rw_put(b, "-");
  rw_put_i64(b, lower + 1);
  rw_put(b, units[unit]);
  if (e->kind == RW_OP_COLL) {
    rw_put(b, "\",algo_proto=\"");
    rw_put(b, rw_name_str(RW_NAME_ALGO, e->algo));
    rw_put(b, "_");
    rw_put(b, rw_name_str(RW_NAME_PROTO, e->proto));
  }
  rw_put(b, "\"} ");
}

static void inspector_family(rw_buf *b, const char *name, uint8_t kind, bool busbw) {
  family(b, name, "gauge", busbw ? "NCCL Inspector compatible: geometric mean bus bandwidth "
                                   "over the interval, GB/s."
                                 : "NCCL Inspector compatible: mean execution time over the "
                                   "interval, microseconds.");
  for (uint32_t i = 0; i < RW_MAX_COMMS; i++) {
    rw_comm *c = rw_comm_at(i);
    if (c == NULL || c->prom == NULL) continue;
    for (int k = 0; k < c->prom->ninterval; k++) {
      const rw_prom_interval *e = &c->prom->interval[k];
      if (e->kind != kind || e->n == 0 || (busbw && e->n_pos == 0)) continue;
      rw_put(b, name);
      inspector_labels(b, c, e);
      double v = busbw ? exp(e->log_busbw_sum / (double)e->n_pos) : e->exec_us_sum / (double)e->n;
      rw_put_fixed(b, v, 3);
      rw_put(b, "\n");
    }
  }
}

static void reset_intervals(void) {
  for (uint32_t i = 0; i < RW_MAX_COMMS; i++) {
    rw_comm *c = rw_comm_at(i);
    if (c != NULL && c->prom != NULL) c->prom->ninterval = 0;
  }
}

static void render(rw_buf *b) {
  family(b, "rankwatch_build_info", "gauge", "rankwatch plugin build.");
  rw_put(b, "rankwatch_build_info{version=\"" RANKWATCH_VERSION "\"} 1\n");
  counter_family(b, "rankwatch_ops_total", "Completed NCCL ops.", 0);
  counter_family(b, "rankwatch_op_payload_bytes_total", "Bytes the ops moved (count x size).", 1);
  counter_family(b, "rankwatch_op_bus_bytes_total", "Bus bytes (nccl-tests factor) of the ops.",
                 2);
  counter_family(b, "rankwatch_op_duration_seconds_total", "Summed op execution time.", 3);
  comm_gauges(b);
  family(b, "rankwatch_ops_dropped_total", "counter", "Ops not recorded, by reason.");
  rw_put(b, "rankwatch_ops_dropped_total{reason=\"pool_full\"} ");
  rw_put_i64(b, (int64_t)LD(&rw_g.stats.dropped_pool_full));
  rw_put(b, "\n");
  inspector_family(b, "nccl_bus_bandwidth_gbs", RW_OP_COLL, true);
  inspector_family(b, "nccl_collective_exec_time_microseconds", RW_OP_COLL, false);
  inspector_family(b, "nccl_p2p_bus_bandwidth_gbs", RW_OP_P2P, true);
  inspector_family(b, "nccl_p2p_exec_time_microseconds", RW_OP_P2P, false);
}

void rw_prom_write(int64_t now) {
  (void)now;
  rw_buf b;
  if (!rw_buf_init(&b, 1 << 16)) return;
  render(&b);
  char path[RW_PATH_MAX + 512], tmp[RW_PATH_MAX + 520];
  snprintf(path, sizeof path, "%s/rankwatch-%s-pid%d.prom", rw_g.cfg.dump_dir,
           rw_g.cfg.hostname, rw_g.pid);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write(fd, b.p, b.len) == (ssize_t)b.len;
  if (fd >= 0) close(fd);
  if (ok) ok = rename(tmp, path) == 0;
  if (!ok) unlink(tmp);
  rw_buf_free(&b);
  reset_intervals();
}

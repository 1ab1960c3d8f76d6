/*
 * Configuration, read once from the environment at the first init. RANKWATCH_*
 * variables win; NCCL Inspector's variables are honoured where the meaning
 * matches, so rankwatch is a drop-in replacement for the Inspector.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "rw.h"

/* The first variable of the list that is set and non-empty, or NULL. */
static const char *env_first(const char *a, const char *b) {
  const char *v = getenv(a);
  if (v && v[0]) return v;
  v = b ? getenv(b) : NULL;
  return v && v[0] ? v : NULL;
}

static int64_t env_int(const char *a, const char *b, int64_t dflt) {
  const char *v = env_first(a, b);
  if (v == NULL) return dflt;
  char *end;
  long long x = strtoll(v, &end, 10);
  return end != v ? (int64_t)x : dflt;
}

static bool env_bool(const char *a, const char *b, bool dflt) {
  const char *v = env_first(a, b);
  if (v == NULL) return dflt;
  return !(strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0 || strcasecmp(v, "off") == 0 ||
           strcasecmp(v, "no") == 0);
}

static void load_job_id(rw_config *cfg) {
  const char *names[] = {"RANKWATCH_JOB_ID", "SLURM_JOB_ID", "SLURM_JOBID",
                         "TORCHELASTIC_RUN_ID", NULL};
  for (int i = 0; names[i]; i++) {
    const char *v = getenv(names[i]);
    if (v && v[0]) {
      snprintf(cfg->job_id, sizeof cfg->job_id, "%s", v);
      return;
    }
  }
  snprintf(cfg->job_id, sizeof cfg->job_id, "unknown");
}

static void load_dump_dir(rw_config *cfg) {
  const char *dir = env_first("RANKWATCH_DUMP_DIR", "NCCL_INSPECTOR_DUMP_DIR");
  if (dir) snprintf(cfg->dump_dir, sizeof cfg->dump_dir, "%s", dir);
  else snprintf(cfg->dump_dir, sizeof cfg->dump_dir, "rankwatch-%s", cfg->job_id);
}

static void load_intervals(rw_config *cfg) {
  int64_t ms = env_int("RANKWATCH_INTERVAL_MS", NULL, -1);
  if (ms <= 0) {
    /* Inspector's interval is in microseconds; its -1 ("only at teardown") and
     * 0 ("continuously") both mean our default here, since records are always
     * written as ops complete. */
    int64_t us = env_int("NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS", NULL, -1);
    ms = us > 0 ? (us + 999) / 1000 : 1000;
  }
  cfg->interval_ns = ms * 1000000LL;
  int64_t drain_ms = env_int("RANKWATCH_DRAIN_MS", NULL, 20);
  cfg->drain_ns = (drain_ms > 0 ? drain_ms : 20) * 1000000LL;
}

static void load_gpu_timing(rw_config *cfg) {
  const char *v = env_first("RANKWATCH_GPU_TIMING", NULL);
  cfg->gpu_timing = RW_GPU_ON;
  if (v && (strcasecmp(v, "off") == 0 || strcmp(v, "0") == 0)) cfg->gpu_timing = RW_GPU_OFF;
  if (v && strcasecmp(v, "sampled") == 0) cfg->gpu_timing = RW_GPU_SAMPLED;
  int64_t period = env_int("RANKWATCH_SAMPLE_PERIOD_MS", NULL, 1000);
  int64_t window = env_int("RANKWATCH_SAMPLE_WINDOW_MS", NULL, 50);
  if (period <= 0) period = 1000;
  if (window <= 0 || window > period) window = period / 20 > 0 ? period / 20 : 1;
  cfg->sample_period_ns = period * 1000000LL;
  cfg->sample_window_ns = window * 1000000LL;
}

/* RANKWATCH_STREAM_QUEUE_BYTES: bytes, optionally with a K, M or G suffix
 * (powers of 1024). 0 when the value is malformed or out of range. */
static uint64_t parse_queue_bytes(const char *v) {
  char *end;
  if (v[0] < '0' || v[0] > '9') return 0;
  unsigned long long x = strtoull(v, &end, 10);
  int shift = 0;
  if (*end == 'k' || *end == 'K') shift = 10;
  if (*end == 'm' || *end == 'M') shift = 20;
  if (*end == 'g' || *end == 'G') shift = 30;
  if (shift) end++;
  if (*end != '\0' || x > (RW_STREAM_QUEUE_MAX >> shift)) return 0;
  x <<= shift;
  return x >= RW_STREAM_QUEUE_MIN && x <= RW_STREAM_QUEUE_MAX ? (uint64_t)x : 0;
}

/* tcp://host:port, tcp://[v6 address]:port. */
static bool parse_tcp(rw_config *cfg, const char *rest) {
  const char *colon;
  size_t hostlen;
  if (rest[0] == '[') {
    const char *close = strchr(rest, ']');
    if (close == NULL || close[1] != ':') return false;
    rest++;
    hostlen = (size_t)(close - rest);
    colon = close + 1;
  } else {
    colon = strrchr(rest, ':');
    if (colon == NULL) return false;
    hostlen = (size_t)(colon - rest);
    if (memchr(rest, ':', hostlen) != NULL) return false; /* a v6 address needs brackets */
  }
  if (hostlen == 0 || hostlen >= sizeof cfg->stream_host || memchr(rest, '/', hostlen))
    return false;
  const char *port = colon + 1;
  size_t plen = strlen(port);
  if (plen == 0 || plen > 5 || strspn(port, "0123456789") != plen) return false;
  long p = strtol(port, NULL, 10);
  if (p < 1 || p > 65535) return false;
  memcpy(cfg->stream_host, rest, hostlen);
  cfg->stream_host[hostlen] = '\0';
  snprintf(cfg->stream_port, sizeof cfg->stream_port, "%ld", p);
  return true;
}

static bool parse_collector(rw_config *cfg, const char *v) {
  if (strncmp(v, "unix:", 5) == 0) {
    size_t n = strlen(v + 5);
    if (n == 0 || n >= sizeof cfg->stream_path) return false;
    memcpy(cfg->stream_path, v + 5, n + 1);
    cfg->stream = RW_STREAM_UNIX;
    return true;
  }
  if (strncmp(v, "tcp://", 6) == 0 && parse_tcp(cfg, v + 6)) {
    cfg->stream = RW_STREAM_TCP;
    return true;
  }
  return false;
}

/* The streaming sink is optional: any invalid setting leaves it off with one
 * warning, and recording to files goes on. The token is never logged. */
static bool stream_settings(rw_config *cfg, const char *collector) {
  if (!parse_collector(cfg, collector)) {
    rw_warn_once(RW_WARN_STREAM_CONFIG, "RANKWATCH_COLLECTOR='%.200s' is not unix:PATH (shorter "
                 "than 108 bytes) or tcp://HOST:PORT; streaming off, records still go to files",
                 collector);
    return false;
  }
  const char *token = getenv("RANKWATCH_COLLECTOR_TOKEN");
  if (token != NULL && token[0] != '\0') {
    if (strlen(token) > RW_TOKEN_MAX) {
      rw_warn_once(RW_WARN_STREAM_CONFIG, "RANKWATCH_COLLECTOR_TOKEN is longer than %d bytes; "
                   "streaming off, records still go to files", RW_TOKEN_MAX);
      return false;
    }
    cfg->stream_token_set = true;
    rw_json_quote(cfg->stream_token_json, sizeof cfg->stream_token_json, token);
  }
  const char *q = getenv("RANKWATCH_STREAM_QUEUE_BYTES");
  cfg->stream_queue_bytes = RW_STREAM_QUEUE_DEFAULT;
  if (q != NULL && q[0] != '\0' && (cfg->stream_queue_bytes = parse_queue_bytes(q)) == 0) {
    rw_warn_once(RW_WARN_STREAM_CONFIG, "RANKWATCH_STREAM_QUEUE_BYTES='%.40s' is not a size "
                 "from %uK to %uG (bytes, or with a K, M or G suffix); streaming off, records "
                 "still go to files", q, RW_STREAM_QUEUE_MIN >> 10, RW_STREAM_QUEUE_MAX >> 30);
    return false;
  }
  return true;
}

static void load_stream(rw_config *cfg) {
  const char *v = getenv("RANKWATCH_COLLECTOR");
  if (v != NULL && v[0] != '\0' && !stream_settings(cfg, v)) cfg->stream = RW_STREAM_OFF;
}

void rw_config_load(rw_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  /* Loaded means wanted, unless switched off through either name. */
  cfg->enabled = env_bool("RANKWATCH_ENABLE", "NCCL_INSPECTOR_ENABLE", true);
  load_job_id(cfg);
  load_dump_dir(cfg);
  load_intervals(cfg);
  load_gpu_timing(cfg);
  int64_t min = env_int("RANKWATCH_MIN_SIZE_BYTES", "NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES", 0);
  cfg->min_size_bytes = min > 0 ? (uint64_t)min : 0;
  cfg->p2p = env_bool("RANKWATCH_P2P", "NCCL_INSPECTOR_ENABLE_P2P", true);
  cfg->prom = env_bool("RANKWATCH_PROM", "NCCL_INSPECTOR_PROM_DUMP", false);
  cfg->verbose = env_bool("RANKWATCH_VERBOSE", "NCCL_INSPECTOR_DUMP_VERBOSE", false);
  int64_t slots = env_int("RANKWATCH_POOL_SLOTS", NULL, 65536);
  cfg->pool_slots = (uint32_t)(slots < 64 ? 64 : slots > (1 << 23) ? (1 << 23) : slots);
  if (gethostname(cfg->hostname, sizeof cfg->hostname - 1) != 0)
    snprintf(cfg->hostname, sizeof cfg->hostname, "unknown");
  rw_json_quote(cfg->hostname_json, sizeof cfg->hostname_json, cfg->hostname);
  rw_json_quote(cfg->job_id_json, sizeof cfg->job_id_json, cfg->job_id);
  load_stream(cfg);
}

/*
 * rankwatch plugin internals shared by every source file.
 *
 * Data path: NCCL callbacks (events.c) take a slot from a fixed pool (pool.c),
 * fill it and, when the op is complete, push it onto a lock-free completed
 * stack. The writer thread (writer.c) pops completed slots, formats them
 * (record.c) and writes them, and periodically writes progress, clock and stats
 * records. No NCCL thread ever formats, allocates, locks or does I/O.
 */
#ifndef RANKWATCH_RW_H
#define RANKWATCH_RW_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "profiler_common.h"

#ifndef RANKWATCH_VERSION
#define RANKWATCH_VERSION "0.0.0"
#endif

#define RW_SCHEMA 1
#define RW_MAX_COMMS 1024
#define RW_API_RING 8192 /* entries of CollApi/P2pApi timestamps; power of two */
#define RW_MAX_INFLIGHT_LISTED 64
#define RW_PATH_MAX 1024

/* Relaxed atomics: plain moves on x86-64, but keep ThreadSanitizer exact. */
#define LD(p) atomic_load_explicit((p), memory_order_relaxed)
#define ST(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)

static inline int64_t rw_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- hot-path timestamps (ticks.c) ----
 * NCCL's threads store rw_ticks(); only the writer converts them to ns. */
static inline int64_t rw_ticks(void);
bool rw_ticks_choose_tsc(const char *setting);
void rw_ticks_calibrate(void);      /* writer: take a (ticks, realtime) pair */
int64_t rw_ticks_to_ns(int64_t t);  /* writer: 0 stays 0 (unknown) */

/* ---- names (names.c): NCCL's static strings interned to small ids ---- */
enum rw_name_kind { RW_NAME_FUNC, RW_NAME_DTYPE, RW_NAME_ALGO, RW_NAME_PROTO };
enum {
  RW_FUNC_UNKNOWN = 0,
  RW_FUNC_BROADCAST,
  RW_FUNC_REDUCE,
  RW_FUNC_ALLGATHER,
  RW_FUNC_REDUCESCATTER,
  RW_FUNC_ALLREDUCE,
  RW_FUNC_SEND,
  RW_FUNC_RECV, /* then AlltoAll, Gather, Scatter, SendRecv, ...: names.c */
  RW_NFUNC = 16,
};
#define RW_NCOLL_FUNCS 6 /* ids 0..5 have per-communicator sequence tables */
uint8_t rw_name_id(enum rw_name_kind kind, const char *s);
const char *rw_name_str(enum rw_name_kind kind, uint8_t id);
int rw_dtype_size(uint8_t dtype_id); /* bytes, or 0 when unknown */

/* ---- configuration (config.c), parsed once at the first init ---- */
enum rw_gpu_timing { RW_GPU_ON, RW_GPU_OFF, RW_GPU_SAMPLED };
enum rw_stream_kind { RW_STREAM_OFF = 0, RW_STREAM_UNIX, RW_STREAM_TCP };
#define RW_TOKEN_MAX 256                    /* bytes of RANKWATCH_COLLECTOR_TOKEN */
#define RW_STREAM_QUEUE_DEFAULT (4u << 20)  /* RANKWATCH_STREAM_QUEUE_BYTES */
#define RW_STREAM_QUEUE_MIN (128u << 10)
#define RW_STREAM_QUEUE_MAX (1u << 30)
typedef struct {
  bool enabled;
  char dump_dir[RW_PATH_MAX];
  int64_t interval_ns;       /* progress / clock / stats period */
  int64_t drain_ns;          /* how often completed records are written */
  uint64_t min_size_bytes;   /* ops below are counted, not recorded */
  bool p2p;                  /* record P2P operations */
  bool prom;                 /* Prometheus textfile output */
  bool verbose;              /* Inspector's event_trace blocks */
  enum rw_gpu_timing gpu_timing;
  int64_t sample_period_ns;  /* sampled mode: GPU timing on for the first */
  int64_t sample_window_ns;  /* window of every period of wall-clock time */
  uint32_t pool_slots;
  char job_id[128];
  char hostname[256];
  char job_id_json[128 * 6 + 3];   /* quoted and escaped once, for the writer */
  char hostname_json[256 * 6 + 3];
  /* Streaming to a collector (sink.c, docs/stream-protocol.md); off unless
   * RANKWATCH_COLLECTOR is set and valid. */
  enum rw_stream_kind stream;
  char stream_path[108];           /* unix: socket path (sun_path's size) */
  char stream_host[256];           /* tcp: host name or address, brackets removed */
  char stream_port[8];
  bool stream_token_set;
  char stream_token_json[RW_TOKEN_MAX * 6 + 3];
  uint64_t stream_queue_bytes;
} rw_config;
void rw_config_load(rw_config *cfg);
void rw_json_quote(char *dst, size_t cap, const char *src); /* record.c */

/* ---- communicators (comm.c) ---- */
typedef struct rw_comm {
  uint64_t comm_id;
  int rank, nranks, nnodes, device, abi;
  char name[128];
  char name_json[128 * 6 + 3];    /* quoted and escaped once, for the writer */
  uint32_t gen, index;            /* generation and table index (for slots) */
  _Atomic int finalizing;         /* 1: finalize asked for a flush; 2: flushed */
  int64_t flushed_at_ns;          /* writer: freed a grace period after this */
  bool announced;                 /* writer: comm record written */
  _Atomic uint32_t *peer_seq;     /* [2 * npeer_seq]: per peer, send then recv */
  uint32_t npeer_seq;
  /* Last sequence numbers (-1: none) and counts, grouped by the thread that
   * writes them so that the enqueuing and proxy threads never share a line. */
  _Alignas(64) _Atomic int64_t seq_enqueued[RW_NCOLL_FUNCS]; /* enqueuing thread */
  _Atomic int64_t last_enqueue;   /* ticks */
  _Atomic uint64_t p2p_sn;        /* Inspector-style per-communicator P2P counter */
  _Atomic uint64_t p2p_send_enq, p2p_recv_enq;
  _Alignas(64) _Atomic int64_t seq_started[RW_NCOLL_FUNCS];  /* proxy thread */
  _Atomic int64_t last_gpu;       /* ticks */
  _Alignas(64) _Atomic int64_t seq_completed[RW_NCOLL_FUNCS]; /* writer */
  _Atomic uint64_t p2p_send_done, p2p_recv_done;
  int64_t inflight;               /* writer: ops in flight at the last scan */
  int64_t last_gpu_start_raw;     /* writer: latest plausible GPU start */
  int64_t last_gpu_end_raw;       /* writer: latest GPU end */
  int64_t last_gpu_done_enq_ns;   /* writer: latest enqueue of a completed GPU-timed op */
  struct rw_prom_agg *prom;       /* writer-owned Prometheus aggregates */
} rw_comm;

/* Contexts handed to NCCL are encoded table indices, never raw pointers. */
void *rw_comm_create(uint64_t comm_id, const char *name, int nnodes, int nranks, int rank,
                     int abi, int device);
rw_comm *rw_comm_from_context(void *context);
rw_comm *rw_comm_at(uint32_t index);    /* live or finalizing communicator, or NULL */
int64_t rw_comm_last_activity(const rw_comm *c);
void rw_comm_free(uint32_t index);      /* writer: after the final flush */

/* ---- op slots (pool.c) ---- */
enum rw_slot_state { RW_SLOT_FREE = 0, RW_SLOT_ENQUEUING, RW_SLOT_ENQUEUED, RW_SLOT_DONE };
enum rw_op_kind { RW_OP_COLL = 1, RW_OP_P2P = 2 };
enum { RW_F_GRAPH = 1, RW_F_GPU_EXPECTED = 2 };

typedef struct rw_slot {
  /* Line 0: everything kernel-channel events (proxy thread) read or write. */
  _Alignas(64) _Atomic uint32_t gen; /* bumped at release: stale handles fail the check */
  _Atomic uint32_t state;
  _Atomic int32_t pending;    /* 1 for the enqueue stop + one per expected channel */
  _Atomic uint32_t flags;
  _Atomic uint32_t comm;      /* communicator table index */
  _Atomic uint8_t kind, func, nchannels;
  _Atomic uint64_t seq;       /* coll: NCCL seqNumber; p2p: per (peer, direction) order */
  _Atomic int64_t gpu_start_raw;       /* min over channels, INT64_MAX none */
  _Atomic int64_t gpu_end_raw;         /* max over channels, INT64_MIN none */
  _Atomic int64_t kch_report;          /* ticks when the first channel start was seen */
  _Atomic int64_t kch_ptimer;          /* that channel's GPU start */
  _Atomic uint16_t ch_started, ch_stopped;
  /* Line 1: written by the enqueuing thread, read by the writer. */
  _Alignas(64) _Atomic uint32_t next; /* free-list / completed-stack link: index + 1 */
  _Atomic uint8_t dtype, algo, proto;
  _Atomic int32_t root_or_peer;
  _Atomic uint64_t p2p_sn;
  _Atomic uint64_t count;
  _Atomic int64_t api_start, api_end;  /* ticks, 0 = unknown */
  _Atomic int64_t enq_start, enq_end;  /* ticks */
  _Atomic uint64_t ch_mask;            /* channels seen (only with RANKWATCH_VERBOSE) */
} rw_slot;

typedef struct {
  rw_slot *slots;
  uint32_t nslots;
  _Alignas(64) _Atomic uint64_t free_head;  /* (tag << 32) | (index + 1) */
} rw_pool;

int rw_pool_init(rw_pool *p, uint32_t nslots);
void rw_pool_destroy(rw_pool *p);
uint32_t rw_pool_take_batch(rw_pool *p, uint32_t *out, uint32_t max); /* lock-free */
void rw_pool_retire(rw_pool *p, uint32_t index);     /* writer: new generation, state FREE */
void rw_pool_release_chain(rw_pool *p, uint32_t first, uint32_t last); /* writer: one CAS */
int64_t rw_pool_count_in_use(rw_pool *p);            /* writer: a scan */
bool rw_pool_refers_to(rw_pool *p, uint32_t comm);   /* writer: any live slot of comm? */

/* ---- clock (clock.c, writer only): host CLOCK_REALTIME minus GPU timer ----
 * One per GPU, shared by every communicator of that GPU in this process. */
typedef struct {
  int64_t lower_cur, upper_cur, lower_prev, upper_prev; /* bounds, this and last window */
  int64_t window_start;
  uint64_t samples;
  int64_t offset, error; /* error < 0: bounded on one side only */
  bool valid;
} rw_clock;
rw_clock *rw_clock_of(const rw_comm *c);
void rw_clock_fold(rw_clock *clk, const rw_slot *s, bool graph, int64_t api_end,
                   int64_t gpu_start_raw);
void rw_clock_update(rw_clock *clk);
void rw_clock_roll(int64_t now); /* every interval: start a new window on every clock */
void rw_clock_bounds(const rw_clock *clk, int64_t *lo, int64_t *up);

/* ---- per-thread state (thread.c): what keeps NCCL's threads off shared lines ---- */
#define RW_SLOT_CACHE 32
typedef struct rw_thread {
  /* Owner only. */
  uint32_t cache[RW_SLOT_CACHE]; /* free slots taken from the pool in one batch */
  uint32_t ncache;
  uint32_t api_base, api_next;   /* this thread's region of the API timestamp ring */
  uint32_t serial;
  /* Owner pushes completed slots, the writer takes them all in one exchange. */
  _Alignas(64) _Atomic uint32_t done_head;
  struct rw_thread *next;        /* registry, never unlinked */
} rw_thread;

rw_thread *rw_thread_self(void);                  /* NULL if it cannot be created */
rw_thread *rw_thread_first(void);                 /* writer: registry walk */
rw_slot *rw_thread_take_slot(rw_thread *t, uint32_t *index);
void rw_thread_push_done(rw_thread *t, uint32_t index);
uint32_t rw_thread_api_index(rw_thread *t, uint32_t *tag);

/* ---- counters (reported in stats records) ---- */
typedef struct {
  _Atomic uint64_t records_written, dropped_pool_full, filtered_min_size;
  _Atomic uint64_t stale_handles, write_errors, bytes_written;
  /* Written by the writer thread only (sink.c). */
  _Atomic uint64_t stream_sent_records, stream_dropped_records, stream_sent_bytes;
  _Atomic uint64_t stream_reconnects;
} rw_stats;

/* ---- process-global state (plugin.c) ---- */
typedef struct {
  /* Read on every callback, written almost never: a line of its own, so the
   * writer's counter updates below never evict it from NCCL threads' caches. */
  _Alignas(64) bool ready;  /* global init succeeded */
  bool tsc;                 /* hot-path timestamps are TSC ticks (ticks.c) */
  _Atomic int kch_on;       /* KernelCh currently requested */
  int base_mask;            /* what we request, without KernelCh */
  int pid;
  _Atomic(int *) mask_ptr;  /* NCCL's process-global activation mask */
  ncclDebugLogger_t logfn;
  rw_pool pool;
  _Alignas(64) rw_stats stats;
  _Alignas(64) rw_config cfg;
} rw_global;
extern rw_global rw_g;

static inline int64_t rw_ticks(void) {
#if defined(__x86_64__)
  if (rw_g.tsc) return (int64_t)__builtin_ia32_rdtsc();
#endif
  return rw_now_ns();
}

/* ---- events (events.c): the hot path ---- */
void rw_start_event(void *context, void **eHandle, uint64_t type, void *parent, const void *u);
void rw_stop_event(void *eHandle);
void rw_record_state(void *eHandle, int state, const void *args);
void rw_complete(uint32_t index, rw_slot *s);

/* ---- global lifecycle (plugin.c) ---- */
ncclResult_t rw_init(void **context, uint64_t comm_id, int *mask, const char *name, int nnodes,
                     int nranks, int rank, ncclDebugLogger_t logfn, int abi);
ncclResult_t rw_finalize(void *context);

/* ---- writer thread (writer.c) ---- */
int rw_writer_start(void);
void rw_writer_flush_comm(uint32_t comm_index); /* blocks briefly until written */
void rw_writer_stop(const char *reason);
void rw_writer_apply_mask(int64_t now);

/* ---- logging (log.c): one warning per cause, through NCCL's logger ---- */
enum rw_warn_cause { RW_WARN_DIR, RW_WARN_WRITE, RW_WARN_POOL, RW_WARN_THREAD, RW_WARN_COMMS,
                     RW_WARN_STREAM_CONFIG, RW_WARN_STREAM_CONNECT, RW_WARN_NCAUSES };
void rw_warn_once(enum rw_warn_cause cause, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void rw_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif

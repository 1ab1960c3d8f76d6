/*
 * rankwatch bench: CPU cost of a profiler plugin's callbacks (no GPU, no NCCL).
 *
 * Loads a profiler plugin (.so) the way NCCL does (dlopen + dlsym of the
 * ncclProfiler_v5 or _v6 data symbol), calls init once per simulated
 * communicator, then replays the callback sequence NCCL 2.28 issues for one
 * blocking, non-captured AllReduce and times it on the calling thread:
 *
 *   application thread (timed as "op_seq"):
 *     GroupApi start (depth 1)     record 23 (NULL args)
 *     CollApi start / stop         record 24 (NULL args)
 *     [KernelLaunch start / stop   only if the mask has KernelLaunch]
 *     Group start                  Coll start (seqNumber n, parent = CollApi handle,
 *                                  parentGroup = Group handle, nChannels)
 *     Coll stop                    Group stop          GroupApi stop
 *   proxy thread, one per communicator (timed as "proxy_kernelch"):
 *     per channel: KernelCh start (parent = Coll handle, pTimer)
 *                  record 22 (pTimer of the end)     KernelCh stop
 *
 * and, as a second measurement, a lone Coll start/stop pair ("coll_pair", parent
 * NULL), still followed by KernelCh on the proxy thread so the plugin completes
 * the op. Like NCCL, it gates each event type on the shared activation mask that
 * the plugin wrote in init (re-read at every op, so a plugin that changes it at
 * run time is followed), and it skips stop/record calls on NULL handles.
 *
 * Timing: clock_gettime(CLOCK_MONOTONIC). Lockstep mode (default): around batches
 * of ops; per-op cost of a batch = batch time / ops, median and p99 over batches,
 * per application thread; the proxy handles each batch after it (timed the same
 * way), plus a pass of individually timed ops for the tail. Paced mode: ops a few
 * microseconds apart, each timed alone, the proxy running alongside (see
 * run_batches). The cost of one clock read pair is subtracted. Each application
 * thread drives its own communicator, as in multi-communicator training.
 *
 * Output: one JSON line on stdout. Messages go to stderr.
 *
 * Usage: callback_cost [options] PLUGIN.so     (see --help)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "profiler_v6.h"

#define RING_SIZE 16384u /* power of two; also the largest batch in lockstep mode */
#define MAX_THREADS 64

enum { PH_UNTIMED = 0, PH_OPSEQ = 1, PH_PAIR = 2 };
enum { MODE_LOCKSTEP = 0, MODE_PACED = 1 };

/* Which event types NCCL emits for a given mask (its implicit-parent gates). */
#define GATE_GROUPAPI                                                                      \
  (ncclProfileGroupApi | ncclProfileP2pApi | ncclProfileCollApi | ncclProfileKernelLaunch | \
   ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp |              \
   ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin | ncclProfileCeColl | \
   ncclProfileCeSync | ncclProfileCeBatch)
#define GATE_COLLAPI                                                                      \
  (ncclProfileCollApi | ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep |     \
   ncclProfileKernelCh | ncclProfileNetPlugin | ncclProfileCeColl | ncclProfileCeSync |   \
   ncclProfileCeBatch)
#define GATE_GROUP                                                                        \
  (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp |             \
   ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin)
#define GATE_COLL                                                                         \
  (ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh |    \
   ncclProfileNetPlugin)

typedef struct {
  void *h;        /* Coll handle the plugin returned (may be NULL) */
  uint32_t phase; /* PH_* of the op, so the proxy files its timings */
  uint32_t pad;
} ring_ent_t;

typedef struct {
  double *v;
  size_t n, cap;
} samples_t;

typedef struct {
  int idx;
  void *ctx;
  uint64_t comm_id;
  uint64_t seq;
  uint64_t calls;      /* plugin calls made by the application thread (all phases) */
  uint64_t calls_opseq;/* ... during the timed op-seq batches */
  uint64_t ops_opseq;
  uint64_t stalls;     /* times the app thread waited for the proxy (paced mode) */
  uint64_t proxy_calls_opseq;
  uint64_t proxy_ops_opseq;
  samples_t opseq, pair, single, proxy_opseq, proxy_pair;
  pthread_t app_thr, proxy_thr;
  ring_ent_t *ring;
  _Alignas(64) _Atomic uint64_t head; /* published by the app thread */
  _Alignas(64) _Atomic uint64_t done; /* ops the proxy finished */
  _Alignas(64) _Atomic int quit;
} comm_t;

/* ---- options ------------------------------------------------------------------- */
static const char *opt_plugin;
static const char *opt_label;
static const char *opt_dump_dir;
static int opt_threads = 1;
static int opt_batch;  /* 0: 500 / threads, at least 100 */
static int opt_batches = 100;
static int opt_warmup = 10;
static int opt_single = -1; /* -1: 10000 / threads, at least 2000 */
static int opt_mode = MODE_LOCKSTEP;
static int opt_window = 64;
static int opt_gap_ns = 2000;
static double opt_rate = 100000.0; /* ops per second, whole process; 0: unlimited */
static int opt_abi = 5;
static int opt_nch = 1;
static size_t opt_count = 1024;
static int opt_pin;
static int opt_keep_loaded;
static int opt_verbose;

/* ---- plugin --------------------------------------------------------------------- */
static ncclProfiler_v6_t *P;
static int g_mask; /* NCCL's process-wide activation mask, written by the plugin */
static double g_clock_overhead_ns;
static pthread_barrier_t g_barrier;
static comm_t *g_comms;

static void logfn(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                  const char *fmt, ...) {
  if (!opt_verbose && level > NCCL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[plugin log level=%d flags=0x%lx %s:%d] ", (int)level, flags,
          file ? file : "?", line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* ---- time and statistics --------------------------------------------------------- */
static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void samples_init(samples_t *s, size_t cap) {
  s->v = calloc(cap ? cap : 1, sizeof(double));
  s->n = 0;
  s->cap = cap;
  if (!s->v) {
    fprintf(stderr, "callback_cost: out of memory\n");
    exit(2);
  }
}

static inline void samples_add(samples_t *s, double x) {
  if (s->n < s->cap) s->v[s->n++] = x;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array. */
static double pct_sorted(const double *v, size_t n, double p) {
  if (n == 0) return -1.0;
  size_t k = (size_t)(p / 100.0 * (double)n + 0.999999);
  if (k < 1) k = 1;
  if (k > n) k = n;
  return v[k - 1];
}

static double median_of(double *v, size_t n) {
  if (n == 0) return -1.0;
  qsort(v, n, sizeof(double), cmp_double);
  if (n % 2) return v[n / 2];
  return 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void samples_sort(samples_t *s) { qsort(s->v, s->n, sizeof(double), cmp_double); }

static void measure_clock_overhead(void) {
  enum { N = 200001 };
  double *v = malloc(sizeof(double) * N);
  if (!v) exit(2);
  for (int i = 0; i < N; i++) {
    uint64_t a = now_ns();
    uint64_t b = now_ns();
    v[i] = (double)(b - a);
  }
  g_clock_overhead_ns = median_of(v, N);
  free(v);
}

/* ---- the event sequences -------------------------------------------------------- */
static const char kAllReduce[] = "AllReduce";
static const char kFloat32[] = "ncclFloat32";
static const char kRing[] = "RING";
static const char kLL[] = "LL";

static inline int load_mask(void) { return __atomic_load_n(&g_mask, __ATOMIC_RELAXED); }

/* The Coll descriptor NCCL passes for this benchmark's AllReduce. */
static inline ncclProfilerEventDescr_v6_t coll_descr(comm_t *c, void *parent, void *group) {
  ncclProfilerEventDescr_v6_t d = {.type = ncclProfileColl, .parentObj = parent, .rank = 0};
  d.coll.seqNumber = c->seq++;
  d.coll.func = kAllReduce;
  d.coll.sendBuff = (const void *)(uintptr_t)0x10000000;
  d.coll.recvBuff = (void *)(uintptr_t)0x20000000;
  d.coll.count = opt_count;
  d.coll.root = 0;
  d.coll.datatype = kFloat32;
  d.coll.nChannels = (uint8_t)opt_nch;
  d.coll.nWarps = 8;
  d.coll.algo = kRing;
  d.coll.proto = kLL;
  d.coll.parentGroup = group;
  return d;
}

static inline void ring_push(comm_t *c, uint64_t pos, void *h, uint32_t phase) {
  ring_ent_t *e = &c->ring[pos & (RING_SIZE - 1)];
  e->h = h;
  e->phase = phase;
}

/*
 * Waiting without hogging the CPU: spin briefly, then yield, then sleep in short
 * naps, so idle bench threads leave the cores to the threads being measured and
 * to the plugin's own threads.
 */
static void backoff(unsigned *spins) {
  unsigned n = ++*spins;
  if (n < 1024) {
    cpu_relax();
  } else if (n < 1024 + 64) {
    sched_yield();
  } else {
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
}

/* Wait (outside or inside the timed region, see callers) until the proxy has room. */
static inline void wait_window(comm_t *c, uint64_t head, uint64_t limit, int count_stall) {
  if (head - atomic_load_explicit(&c->done, memory_order_acquire) < limit) return;
  if (count_stall) c->stalls++;
  unsigned spins = 0;
  while (head - atomic_load_explicit(&c->done, memory_order_acquire) >= limit) backoff(&spins);
}

/*
 * One AllReduce's application-thread callbacks. Returns the number of plugin calls
 * made; *coll_out gets the Coll handle and *kch whether KernelCh events follow.
 */
static inline unsigned do_op_seq(comm_t *c, void **coll_out, int *kch) {
  const int mask = load_mask();
  unsigned calls = 0;
  void *hGA = NULL, *hCA = NULL, *hG = NULL, *hC = NULL, *hKL = NULL;
  const int ga = (mask & GATE_GROUPAPI) != 0;
  const int ca = (mask & GATE_COLLAPI) != 0;
  const int kl = (mask & ncclProfileKernelLaunch) != 0;
  const int gr = (mask & GATE_GROUP) != 0;
  const int co = (mask & GATE_COLL) != 0;
  void *stream = (void *)(uintptr_t)(0x7000 + c->idx * 0x100);

  if (ga) {
    ncclProfilerEventDescr_v6_t d = {.type = ncclProfileGroupApi, .parentObj = NULL, .rank = 0};
    d.groupApi.graphCaptured = false;
    d.groupApi.groupDepth = 1;
    P->startEvent(c->ctx, &hGA, &d);
    calls++;
    if (hGA) {
      P->recordEventState(hGA, ncclProfilerGroupStartApiStop, NULL);
      calls++;
    }
  }
  if (ca) {
    ncclProfilerEventDescr_v6_t d = {.type = ncclProfileCollApi, .parentObj = hGA, .rank = 0};
    d.collApi.func = kAllReduce;
    d.collApi.count = opt_count;
    d.collApi.datatype = kFloat32;
    d.collApi.root = 0;
    d.collApi.stream = stream;
    d.collApi.graphCaptured = false;
    P->startEvent(c->ctx, &hCA, &d);
    calls++;
    if (hCA) {
      P->stopEvent(hCA);
      calls++;
    }
  }
  if (ga && hGA) {
    P->recordEventState(hGA, ncclProfilerGroupEndApiStart, NULL);
    calls++;
  }
  if (kl) {
    ncclProfilerEventDescr_v6_t d = {.type = ncclProfileKernelLaunch, .parentObj = hGA, .rank = 0};
    d.kernelLaunch.stream = stream;
    P->startEvent(c->ctx, &hKL, &d);
    calls++;
    if (hKL) {
      P->stopEvent(hKL);
      calls++;
    }
  }
  if (gr) {
    ncclProfilerEventDescr_v6_t d = {.type = ncclProfileGroup, .parentObj = NULL, .rank = 0};
    P->startEvent(c->ctx, &hG, &d);
    calls++;
  }
  if (co) {
    ncclProfilerEventDescr_v6_t d = coll_descr(c, hCA, hG);
    P->startEvent(c->ctx, &hC, &d);
    calls++;
    if (hC) {
      P->stopEvent(hC);
      calls++;
    }
  }
  if (gr && hG) {
    P->stopEvent(hG);
    calls++;
  }
  if (ga && hGA) {
    P->stopEvent(hGA);
    calls++;
  }
  *coll_out = hC;
  *kch = co && (mask & ncclProfileKernelCh) != 0;
  return calls;
}

/* A lone Coll start/stop pair (no API or Group parents). */
static inline unsigned do_coll_pair(comm_t *c, void **coll_out, int *kch) {
  const int mask = load_mask();
  void *hC = NULL;
  unsigned calls = 0;
  ncclProfilerEventDescr_v6_t d = coll_descr(c, NULL, NULL);
  P->startEvent(c->ctx, &hC, &d);
  calls++;
  if (hC) {
    P->stopEvent(hC);
    calls++;
  }
  *coll_out = hC;
  *kch = (mask & ncclProfileKernelCh) != 0;
  return calls;
}

/* ---- proxy thread ------------------------------------------------------------- */
/*
 * GPU timestamps: the GPU timer is taken to run 50 us ahead of the host clock
 * (as on the lent H200s), and each op "ran" just before the proxy reports it, so
 * the plugin sees consistent clock bounds: GPU start after the host enqueued the
 * op, GPU end before the proxy reports it. *gpu_ts is the next free GPU time.
 */
static inline unsigned do_kernelch(comm_t *c, void *coll, uint64_t *gpu_ts) {
  unsigned calls = 0;
  for (int ch = 0; ch < opt_nch; ch++) {
    void *hK = NULL;
    ncclProfilerEventDescr_v6_t d = {.type = ncclProfileKernelCh, .parentObj = coll, .rank = 0};
    d.kernelCh.channelId = (uint8_t)ch;
    d.kernelCh.pTimer = *gpu_ts;
    P->startEvent(c->ctx, &hK, &d);
    calls++;
    if (hK) {
      ncclProfilerEventStateArgs_v6_t a;
      a.kernelCh.pTimer = *gpu_ts + 4;
      P->recordEventState(hK, ncclProfilerKernelChStop, &a);
      P->stopEvent(hK);
      calls += 2;
    }
    *gpu_ts += 5;
  }
  return calls;
}

static void pin_to(int cpu) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (ncpu <= 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET((int)(cpu % ncpu), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static void *proxy_main(void *arg) {
  comm_t *c = arg;
  if (opt_pin) pin_to(2 * c->idx + 1);
  uint64_t tail = 0;
  unsigned spins = 0;
  const uint64_t gpu_ahead_ns = 50000; /* see do_kernelch */
  for (;;) {
    uint64_t head = atomic_load_explicit(&c->head, memory_order_acquire);
    if (head == tail) {
      if (atomic_load_explicit(&c->quit, memory_order_acquire) &&
          atomic_load_explicit(&c->head, memory_order_acquire) == tail)
        break;
      backoff(&spins);
      continue;
    }
    spins = 0;
    /* Process the run [tail, head) in groups of the same phase, timing each group. */
    while (tail < head) {
      uint32_t ph = c->ring[tail & (RING_SIZE - 1)].phase;
      uint64_t end = tail;
      while (end < head && c->ring[end & (RING_SIZE - 1)].phase == ph) end++;
      uint64_t gpu_ts = realtime_ns() + gpu_ahead_ns;
      unsigned calls = 0;
      uint64_t t0 = now_ns();
      for (uint64_t i = tail; i < end; i++)
        calls += do_kernelch(c, c->ring[i & (RING_SIZE - 1)].h, &gpu_ts);
      uint64_t t1 = now_ns();
      double n = (double)(end - tail);
      double per_op = ((double)(t1 - t0) - g_clock_overhead_ns) / n;
      if (ph == PH_OPSEQ) {
        samples_add(&c->proxy_opseq, per_op);
        c->proxy_calls_opseq += calls;
        c->proxy_ops_opseq += end - tail;
      } else if (ph == PH_PAIR) {
        samples_add(&c->proxy_pair, per_op);
      }
      tail = end;
      atomic_store_explicit(&c->done, tail, memory_order_release);
    }
  }
  return NULL;
}

/* ---- application thread ------------------------------------------------------- */
typedef unsigned (*op_fn)(comm_t *, void **, int *);

static inline void busy_wait_ns(uint64_t ns) {
  if (ns == 0) return;
  uint64_t until = now_ns() + ns;
  while (now_ns() < until) cpu_relax();
}

/*
 * Keep the process's op rate at or below --rate, split evenly over the application
 * threads (outside the timed regions): wait until `ops` ops are due since t_begin. Without it the loop would issue millions of ops
 * per second, far beyond what NCCL can (an op takes 10+ us on the GPU), and a
 * recording plugin would measure its overload path (full pool, drops) instead.
 */
static void pace(uint64_t t_begin, uint64_t ops) {
  if (opt_rate <= 0) return;
  uint64_t due = t_begin + (uint64_t)((double)ops * 1e9 * opt_threads / opt_rate);
  uint64_t now = now_ns();
  if (now >= due) return;
  if (due - now > 100000) {
    uint64_t ns = due - now - 50000;
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
  }
  while (now_ns() < due) cpu_relax();
}

/*
 * Run nb batches of opt_batch ops; timed runs put per-op ns into *out.
 *
 * Lockstep mode (default): a batch of ops is timed as a whole on the application
 * thread; its Coll handles are then handed to the proxy, which times its KernelCh
 * callbacks for the whole batch while the application thread waits (untimed). The
 * two sides never overlap, so both numbers are clean throughput costs; up to one
 * batch of ops is in flight in the plugin at the end of each batch.
 *
 * Paced mode: ops are issued one at a time, --gap-ns apart (default 2000 ns, a
 * realistic rate: a small NCCL op takes 10+ us), each timed individually (clock
 * read cost subtracted), and handed to the proxy at once, which runs alongside
 * (at most --window ops in flight). This includes the cross-thread effects
 * (cache lines moving between the application, proxy and writer threads) at a
 * realistic op rate.
 *
 * per_op_samples: in lockstep mode, also time every op individually (the
 * "single" pass for tail latency).
 */
static void run_batches(comm_t *c, op_fn fn, int nb, uint32_t phase, samples_t *out,
                        uint64_t *calls_out, uint64_t *ops_out, int per_op_samples) {
  uint64_t head = atomic_load_explicit(&c->head, memory_order_relaxed);
  const uint64_t t_begin = now_ns();
  uint64_t issued = 0;
  for (int b = 0; b < nb; b++) {
    unsigned calls = 0;
    if (opt_mode == MODE_LOCKSTEP) {
      pace(t_begin, issued);
      issued += (uint64_t)opt_batch;
      if (per_op_samples) {
        for (int i = 0; i < opt_batch; i++) {
          void *h;
          int kch;
          uint64_t t0 = now_ns();
          calls += fn(c, &h, &kch);
          uint64_t t1 = now_ns();
          if (out) samples_add(out, (double)(t1 - t0) - g_clock_overhead_ns);
          if (kch) ring_push(c, head++, h, phase);
        }
      } else {
        uint64_t t0 = now_ns();
        for (int i = 0; i < opt_batch; i++) {
          void *h;
          int kch;
          calls += fn(c, &h, &kch);
          if (kch) ring_push(c, head++, h, phase);
        }
        uint64_t t1 = now_ns();
        if (out) samples_add(out, ((double)(t1 - t0) - g_clock_overhead_ns) / opt_batch);
      }
      atomic_store_explicit(&c->head, head, memory_order_release);
      wait_window(c, head, 1, 0); /* until the proxy is done with the batch */
    } else {
      for (int i = 0; i < opt_batch; i++) {
        void *h;
        int kch;
        wait_window(c, head, (uint64_t)opt_window, out != NULL);
        busy_wait_ns((uint64_t)opt_gap_ns);
        pace(t_begin, issued++);
        uint64_t t0 = now_ns();
        calls += fn(c, &h, &kch);
        uint64_t t1 = now_ns();
        if (out) samples_add(out, (double)(t1 - t0) - g_clock_overhead_ns);
        if (kch) {
          ring_push(c, head++, h, phase);
          atomic_store_explicit(&c->head, head, memory_order_release);
        }
      }
    }
    c->calls += calls;
    if (calls_out) *calls_out += calls;
    if (ops_out) *ops_out += (uint64_t)opt_batch;
  }
  wait_window(c, head, 1, 0);
}

static void *app_main(void *arg) {
  comm_t *c = arg;
  if (opt_pin) pin_to(2 * c->idx);
  pthread_barrier_wait(&g_barrier);

  /* op sequence: warmup, timed batches */
  run_batches(c, do_op_seq, opt_warmup, PH_UNTIMED, NULL, NULL, NULL, 0);
  pthread_barrier_wait(&g_barrier);
  run_batches(c, do_op_seq, opt_batches, PH_OPSEQ, &c->opseq, &c->calls_opseq, &c->ops_opseq,
              0);
  pthread_barrier_wait(&g_barrier);

  /* individually timed ops, for the tail (lockstep mode; paced mode times every op) */
  if (opt_mode == MODE_LOCKSTEP && opt_single > 0)
    run_batches(c, do_op_seq, (opt_single + opt_batch - 1) / opt_batch, PH_UNTIMED, &c->single,
                NULL, NULL, 1);
  pthread_barrier_wait(&g_barrier);

  /* lone Coll start/stop pairs */
  run_batches(c, do_coll_pair, opt_warmup, PH_UNTIMED, NULL, NULL, NULL, 0);
  pthread_barrier_wait(&g_barrier);
  run_batches(c, do_coll_pair, opt_batches, PH_PAIR, &c->pair, NULL, NULL, 0);
  pthread_barrier_wait(&g_barrier);
  return NULL;
}

/* ---- plugin output inspection ------------------------------------------------------ */
static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Value of an integer field "key":N in a compact JSON line; -1 if absent. */
static long long json_int(const char *line, const char *key) {
  char pat[96];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(line, pat);
  if (!p) return -1;
  p += strlen(pat);
  while (*p == ' ') p++;
  if (*p != '-' && (*p < '0' || *p > '9')) return -1;
  return strtoll(p, NULL, 10);
}

static const char *const kStatKeys[] = {"slots_total",       "ops_started",
                                        "records_written",   "dropped_pool_full",
                                        "filtered_min_size", "stale_handles",
                                        "write_errors"};
#define N_STAT_KEYS (sizeof kStatKeys / sizeof kStatKeys[0])

typedef struct {
  int have_stats;
  long long stats[N_STAT_KEYS];
  long long op_lines;
  int have_dir;
} dump_summary_t;

static void scan_dump_dir(const char *dir, dump_summary_t *s) {
  memset(s, 0, sizeof *s);
  DIR *d = opendir(dir);
  if (!d) return;
  s->have_dir = 1;
  struct dirent *e;
  char path[4096];
  char *line = NULL;
  size_t cap = 0;
  while ((e = readdir(d)) != NULL) {
    int is_log = ends_with(e->d_name, ".log");
    int is_state = ends_with(e->d_name, ".rwstate.jsonl");
    if (!is_log && !is_state) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    while (getline(&line, &cap, f) > 0) {
      if (is_log) {
        s->op_lines++;
      } else if (strstr(line, "\"kind\":\"stats\"") || strstr(line, "\"kind\": \"stats\"")) {
        /* keep the "exit" record if there is one, else the last one seen (the
           plugin may write its exit record only when the process exits) */
        int is_exit = strstr(line, "\"reason\":\"exit\"") != NULL;
        if (s->have_stats == 2 && !is_exit) continue;
        s->have_stats = is_exit ? 2 : 1;
        for (size_t k = 0; k < N_STAT_KEYS; k++) s->stats[k] = json_int(line, kStatKeys[k]);
      }
    }
    fclose(f);
  }
  free(line);
  closedir(d);
}

/* ---- JSON output -------------------------------------------------------------------- */
static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

/* Prints {"median_ns":..,"p99_ns":..,"p99_max_ns":..,"per_thread":[{..}]} for one sample set. */
static void json_stat_block(FILE *f, size_t off) {
  double med[MAX_THREADS], p99[MAX_THREADS], p99max = 0;
  fprintf(f, "{\"per_thread\":[");
  for (int t = 0; t < opt_threads; t++) {
    samples_t *s = (samples_t *)((char *)&g_comms[t] + off);
    samples_sort(s);
    med[t] = pct_sorted(s->v, s->n, 50.0);
    p99[t] = pct_sorted(s->v, s->n, 99.0);
    if (p99[t] > p99max) p99max = p99[t];
    fprintf(f, "%s{\"median_ns\":%.1f,\"p99_ns\":%.1f,\"samples\":%zu}", t ? "," : "", med[t],
            p99[t], s->n);
  }
  double m = median_of(med, (size_t)opt_threads);
  double p = median_of(p99, (size_t)opt_threads);
  fprintf(f, "],\"median_ns\":%.1f,\"p99_ns\":%.1f,\"p99_max_ns\":%.1f}", m, p, p99max);
}

/* ---- main --------------------------------------------------------------------------- */
static void usage(FILE *f) {
  fprintf(f,
          "usage: callback_cost [options] PLUGIN.so\n"
          "  --threads N      application threads, one communicator each (default 1)\n"
          "  --batch N        ops per timed batch (default 500 / threads, at least 100)\n"
          "  --batches N      timed batches per measurement (default 100)\n"
          "  --warmup N       untimed batches before each measurement (default 10)\n"
          "  --single N       individually timed ops for the tail, lockstep mode\n"
          "                   (default 10000 / threads, at least 2000)\n"
          "  --rate R         at most R ops per second in the whole process, split over the\n"
          "                   threads, paced outside the timed regions (default 100000;\n"
          "                   0 = unlimited: a recording plugin then measures its overload path)\n"
          "  --mode M         lockstep (default): batches timed whole, the proxy handles a\n"
          "                   batch after it; paced: ops --gap-ns apart, each timed, the\n"
          "                   proxy running alongside\n"
          "  --gap-ns N       paced mode: idle time between ops (default 2000)\n"
          "  --window N       paced mode: max ops in flight per communicator (default 64)\n"
          "  --nchannels N    KernelCh events per op (default 1)\n"
          "  --count N        element count of the simulated float32 AllReduce (default 1024)\n"
          "  --abi 5|6        plugin symbol to use (default 5: what NCCL 2.28 loads)\n"
          "  --dump-dir DIR   sets RANKWATCH_DUMP_DIR (default: $RANKWATCH_DUMP_DIR, else a\n"
          "                   new temporary directory)\n"
          "  --label NAME     name for this configuration in the JSON (default: file name)\n"
          "  --pin            pin app thread i to CPU 2i and its proxy to CPU 2i+1\n"
          "  --keep-loaded    do not dlclose the plugin at the end\n"
          "  --verbose        print the plugin's INFO log lines\n");
}

static int parse_int(const char *s, const char *what, int lo, int hi) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 0);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "callback_cost: bad %s '%s' (want %d..%d)\n", what, s, lo, hi);
    exit(2);
  }
  return (int)v;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
#define NEXT() (i + 1 < argc ? argv[++i] : (usage(stderr), exit(2), ""))
    if (!strcmp(a, "--threads")) opt_threads = parse_int(NEXT(), a, 1, MAX_THREADS);
    else if (!strcmp(a, "--batch")) opt_batch = parse_int(NEXT(), a, 1, (int)RING_SIZE);
    else if (!strcmp(a, "--batches")) opt_batches = parse_int(NEXT(), a, 1, 10000000);
    else if (!strcmp(a, "--warmup")) opt_warmup = parse_int(NEXT(), a, 0, 10000000);
    else if (!strcmp(a, "--single")) opt_single = parse_int(NEXT(), a, 0, 100000000);
    else if (!strcmp(a, "--window")) opt_window = parse_int(NEXT(), a, 1, (int)RING_SIZE);
    else if (!strcmp(a, "--gap-ns")) opt_gap_ns = parse_int(NEXT(), a, 0, 100000000);
    else if (!strcmp(a, "--rate")) opt_rate = (double)parse_int(NEXT(), a, 0, 1000000000);
    else if (!strcmp(a, "--nchannels")) opt_nch = parse_int(NEXT(), a, 1, 64);
    else if (!strcmp(a, "--count")) opt_count = (size_t)parse_int(NEXT(), a, 0, 0x7fffffff);
    else if (!strcmp(a, "--abi")) opt_abi = parse_int(NEXT(), a, 5, 6);
    else if (!strcmp(a, "--dump-dir")) opt_dump_dir = NEXT();
    else if (!strcmp(a, "--label")) opt_label = NEXT();
    else if (!strcmp(a, "--pin")) opt_pin = 1;
    else if (!strcmp(a, "--keep-loaded")) opt_keep_loaded = 1;
    else if (!strcmp(a, "--verbose")) opt_verbose = 1;
    else if (!strcmp(a, "--mode")) {
      const char *m = NEXT();
      if (!strcmp(m, "paced")) opt_mode = MODE_PACED;
      else if (!strcmp(m, "lockstep")) opt_mode = MODE_LOCKSTEP;
      else {
        fprintf(stderr, "callback_cost: --mode lockstep|paced\n");
        return 2;
      }
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (a[0] == '-') {
      fprintf(stderr, "callback_cost: unknown option %s\n", a);
      usage(stderr);
      return 2;
    } else opt_plugin = a;
#undef NEXT
  }
  if (!opt_plugin) {
    usage(stderr);
    return 2;
  }
  /* Same total work whatever the thread count: the plugin's writer sees the same
     op rate and volume (see --rate). */
  if (opt_batch == 0) opt_batch = 500 / opt_threads < 100 ? 100 : 500 / opt_threads;
  if (opt_single < 0) opt_single = 10000 / opt_threads < 2000 ? 2000 : 10000 / opt_threads;
  if (!opt_label) {
    const char *slash = strrchr(opt_plugin, '/');
    opt_label = slash ? slash + 1 : opt_plugin;
  }

  /* Where the plugin writes. */
  static char tmpdir[4096];
  if (opt_dump_dir) {
    mkdir(opt_dump_dir, 0755);
    setenv("RANKWATCH_DUMP_DIR", opt_dump_dir, 1);
  } else if (getenv("RANKWATCH_DUMP_DIR") && *getenv("RANKWATCH_DUMP_DIR")) {
    opt_dump_dir = getenv("RANKWATCH_DUMP_DIR");
  } else {
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/rankwatch-cbcost-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpdir)) {
      perror("callback_cost: mkdtemp");
      return 2;
    }
    opt_dump_dir = tmpdir;
    setenv("RANKWATCH_DUMP_DIR", opt_dump_dir, 1);
  }

  measure_clock_overhead();

  void *lib = dlopen(opt_plugin, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "callback_cost: dlopen %s: %s\n", opt_plugin, dlerror());
    return 1;
  }
  const char *sym = opt_abi == 6 ? "ncclProfiler_v6" : "ncclProfiler_v5";
  P = (ncclProfiler_v6_t *)dlsym(lib, sym);
  if (!P || !P->init || !P->startEvent || !P->stopEvent || !P->recordEventState ||
      !P->finalize) {
    fprintf(stderr, "callback_cost: %s has no usable %s\n", opt_plugin, sym);
    return 1;
  }

  g_comms = aligned_alloc(64, sizeof(comm_t) * (size_t)opt_threads);
  if (!g_comms) return 2;
  memset(g_comms, 0, sizeof(comm_t) * (size_t)opt_threads);
  size_t nb = (size_t)opt_batches;
  size_t nops = nb * (size_t)opt_batch;
  for (int t = 0; t < opt_threads; t++) {
    comm_t *c = &g_comms[t];
    c->idx = t;
    c->comm_id = 0x5eed000000000000ull ^ ((uint64_t)getpid() << 16) ^ (uint64_t)(t + 1);
    c->ring = calloc(RING_SIZE, sizeof(ring_ent_t));
    if (!c->ring) return 2;
    atomic_init(&c->head, 0);
    atomic_init(&c->done, 0);
    atomic_init(&c->quit, 0);
    /* paced mode keeps one sample per op, lockstep one per batch */
    samples_init(&c->opseq, opt_mode == MODE_PACED ? nops : nb);
    samples_init(&c->pair, opt_mode == MODE_PACED ? nops : nb);
    samples_init(&c->single, (size_t)opt_single + (size_t)opt_batch);
    samples_init(&c->proxy_opseq, nops);
    samples_init(&c->proxy_pair, nops);
    /* PyTorch passes no communicator name; 1 node, rank 0 of 2. */
    ncclResult_t r = P->init(&c->ctx, c->comm_id, &g_mask, NULL, 1, 2, 0, logfn);
    if (r != ncclSuccess) fprintf(stderr, "callback_cost: init returned %d\n", (int)r);
  }
  int mask = load_mask();
  if (!(mask & GATE_COLL))
    fprintf(stderr, "callback_cost: warning: mask 0x%x enables no Coll events\n", mask);

  pthread_barrier_init(&g_barrier, NULL, (unsigned)opt_threads);
  for (int t = 0; t < opt_threads; t++) {
    pthread_create(&g_comms[t].proxy_thr, NULL, proxy_main, &g_comms[t]);
    pthread_create(&g_comms[t].app_thr, NULL, app_main, &g_comms[t]);
  }
  for (int t = 0; t < opt_threads; t++) {
    pthread_join(g_comms[t].app_thr, NULL);
    atomic_store_explicit(&g_comms[t].quit, 1, memory_order_release);
    pthread_join(g_comms[t].proxy_thr, NULL);
  }
  pthread_barrier_destroy(&g_barrier);

  uint64_t stalls = 0, calls_opseq = 0, ops_opseq = 0, pcalls = 0, pops = 0;
  for (int t = 0; t < opt_threads; t++) {
    stalls += g_comms[t].stalls;
    calls_opseq += g_comms[t].calls_opseq;
    ops_opseq += g_comms[t].ops_opseq;
    pcalls += g_comms[t].proxy_calls_opseq;
    pops += g_comms[t].proxy_ops_opseq;
  }

  /* Teardown as NCCL does it: finalize every communicator, then unload. */
  for (int t = 0; t < opt_threads; t++)
    if (g_comms[t].ctx) P->finalize(g_comms[t].ctx);
  if (!opt_keep_loaded) dlclose(lib);

  dump_summary_t ds;
  scan_dump_dir(opt_dump_dir, &ds);

  FILE *f = stdout;
  fprintf(f, "{\"bench\":\"callback_cost\",\"label\":");
  json_str(f, opt_label);
  fprintf(f, ",\"abi\":%d,\"mask\":\"0x%x\",\"threads\":%d,\"mode\":\"%s\",\"window\":%d,"
             "\"gap_ns\":%d,\"rate\":%.0f,\"batch\":%d,\"batches\":%d,\"nchannels\":%d,\"clock_overhead_ns\":%.1f",
          opt_abi, mask, opt_threads, opt_mode == MODE_LOCKSTEP ? "lockstep" : "paced",
          opt_window, opt_gap_ns, opt_rate, opt_batch, opt_batches, opt_nch, g_clock_overhead_ns);
  fprintf(f, ",\"op_seq\":");
  json_stat_block(f, offsetof(comm_t, opseq));
  fprintf(f, ",\"op_seq_calls_per_op\":%.2f,\"op_seq_stalls\":%" PRIu64,
          ops_opseq ? (double)calls_opseq / (double)ops_opseq : 0.0, stalls);
  /* individually timed ops, pooled over threads (paced mode times every op) */
  {
    size_t off = opt_mode == MODE_PACED ? offsetof(comm_t, opseq) : offsetof(comm_t, single);
    size_t tot = 0;
    for (int t = 0; t < opt_threads; t++) tot += ((samples_t *)((char *)&g_comms[t] + off))->n;
    double *all = malloc(sizeof(double) * (tot ? tot : 1));
    if (!all) return 2;
    size_t k = 0;
    for (int t = 0; t < opt_threads; t++) {
      const samples_t *sp = (const samples_t *)((char *)&g_comms[t] + off);
      for (size_t j = 0; j < sp->n; j++) all[k++] = sp->v[j];
    }
    qsort(all, tot, sizeof(double), cmp_double);
    fprintf(f,
            ",\"op_seq_single\":{\"samples\":%zu,\"p50_ns\":%.1f,\"p99_ns\":%.1f,"
            "\"p999_ns\":%.1f,\"max_ns\":%.1f}",
            tot, pct_sorted(all, tot, 50), pct_sorted(all, tot, 99), pct_sorted(all, tot, 99.9),
            tot ? all[tot - 1] : -1.0);
    free(all);
  }
  fprintf(f, ",\"coll_pair\":");
  json_stat_block(f, offsetof(comm_t, pair));
  fprintf(f, ",\"proxy_kernelch\":");
  json_stat_block(f, offsetof(comm_t, proxy_opseq));
  fprintf(f, ",\"proxy_calls_per_op\":%.2f", pops ? (double)pcalls / (double)pops : 0.0);
  fprintf(f, ",\"dump_dir\":");
  json_str(f, opt_dump_dir);
  if (ds.op_lines || ds.have_stats) fprintf(f, ",\"op_records\":%lld", ds.op_lines);
  else fprintf(f, ",\"op_records\":null");
  if (ds.have_stats) {
    fprintf(f, ",\"plugin_stats\":{");
    for (size_t k = 0; k < N_STAT_KEYS; k++) {
      if (ds.stats[k] >= 0) fprintf(f, "%s\"%s\":%lld", k ? "," : "", kStatKeys[k], ds.stats[k]);
      else fprintf(f, "%s\"%s\":null", k ? "," : "", kStatKeys[k]);
    }
    fprintf(f, "},\"plugin_stats_final\":%s", ds.have_stats == 2 ? "true" : "false");
  } else {
    fprintf(f, ",\"plugin_stats\":null");
  }
  fprintf(f, "}\n");
  fflush(f);
  return 0;
}

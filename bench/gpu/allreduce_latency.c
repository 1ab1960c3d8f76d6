/*
 * rankwatch bench: NCCL all_reduce latency, one process driving every local GPU.
 *
 * ncclCommInitAll over the first --ndev devices (default 2), one non-blocking
 * stream per device, out-of-place float32 sum all_reduce with the per-device
 * calls inside ncclGroupStart/End. For each size: --warmup iterations, then
 * --reps repetitions of `iters` back-to-back iterations timed on the host clock
 * (CLOCK_MONOTONIC) around the issue loop and a synchronize of every stream;
 * per-op latency of a repetition = its time / iters. Reported per size: median,
 * min and max over repetitions, in microseconds, plus nccl-tests-style bandwidths.
 *
 * --fixed N: issue exactly N all_reduces of every size and nothing else (no
 * warmup), to check a profiler's record counts against what was issued.
 *
 * Output: one JSON line per size, then one summary line with the number of
 * all_reduce calls issued on each communicator (warmup included).
 *
 *   allreduce_latency [--ndev N] [--sizes 8,262144,...] [--iters N] [--reps N]
 *                     [--warmup N] [--fixed N] [--label NAME]
 */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEV 16
#define MAX_SIZES 32

#define CUDA_OK(call)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "allreduce_latency: %s:%d %s: %s\n", __FILE__, __LINE__, #call, \
              cudaGetErrorString(e_));                                                 \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

#define NCCL_OK(call)                                                                  \
  do {                                                                                 \
    ncclResult_t r_ = (call);                                                          \
    if (r_ != ncclSuccess) {                                                           \
      fprintf(stderr, "allreduce_latency: %s:%d %s: %s\n", __FILE__, __LINE__, #call, \
              ncclGetErrorString(r_));                                                 \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

static int ndev = 2;
static size_t sizes[MAX_SIZES] = {8, 262144, 2097152, 16777216, 134217728};
static int nsizes = 5;
static int opt_iters;  /* 0: per-size default */
static int opt_reps = 10;
static int opt_warmup = 20;
static long opt_fixed = -1;
static const char *opt_label = "";

static ncclComm_t comms[MAX_DEV];
static cudaStream_t streams[MAX_DEV];
static float *sendbuf[MAX_DEV], *recvbuf[MAX_DEV];
static long long ops_issued; /* all_reduce calls per communicator */

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Default iterations per repetition: about 4-15 ms of work at each size on H200. */
static int default_iters(size_t bytes) {
  if (bytes <= (1u << 20)) return 500;
  if (bytes <= (8u << 20)) return 200;
  if (bytes <= (64u << 20)) return 50;
  return 20;
}

static void issue(size_t count) {
  NCCL_OK(ncclGroupStart());
  for (int d = 0; d < ndev; d++)
    NCCL_OK(ncclAllReduce(sendbuf[d], recvbuf[d], count, ncclFloat32, ncclSum, comms[d],
                          streams[d]));
  NCCL_OK(ncclGroupEnd());
  ops_issued++;
}

static void sync_all(void) {
  for (int d = 0; d < ndev; d++) {
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaStreamSynchronize(streams[d]));
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void parse_sizes(const char *s) {
  nsizes = 0;
  char *copy = strdup(s), *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *end;
    unsigned long long v = strtoull(tok, &end, 0);
    if (*end == 'K' || *end == 'k') v <<= 10, end++;
    else if (*end == 'M' || *end == 'm') v <<= 20, end++;
    else if (*end == 'G' || *end == 'g') v <<= 30, end++;
    if (*end || v < 4 || nsizes >= MAX_SIZES) {
      fprintf(stderr, "allreduce_latency: bad size '%s' (bytes >= 4, suffix K/M/G)\n", tok);
      exit(2);
    }
    sizes[nsizes++] = (size_t)v;
  }
  free(copy);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: allreduce_latency [--ndev N] [--sizes LIST] [--iters N] [--reps N]\n"
          "                         [--warmup N] [--fixed N] [--label NAME]\n"
          "  --sizes LIST  comma-separated bytes, K/M/G suffixes allowed\n"
          "                (default 8,256K,2M,16M,128M)\n"
          "  --iters N     iterations per timed repetition (default by size: 500..20)\n"
          "  --reps N      timed repetitions per size (default 10)\n"
          "  --warmup N    untimed iterations per size (default 20)\n"
          "  --fixed N     issue exactly N all_reduces per size, no warmup, no timing table\n"
          "  --label NAME  copied into every JSON line\n");
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if (!v) {
      usage(stderr);
      return 2;
    }
    i++;
    if (!strcmp(a, "--ndev")) ndev = atoi(v);
    else if (!strcmp(a, "--sizes")) parse_sizes(v);
    else if (!strcmp(a, "--iters")) opt_iters = atoi(v);
    else if (!strcmp(a, "--reps")) opt_reps = atoi(v);
    else if (!strcmp(a, "--warmup")) opt_warmup = atoi(v);
    else if (!strcmp(a, "--fixed")) opt_fixed = atol(v);
    else if (!strcmp(a, "--label")) opt_label = v;
    else {
      usage(stderr);
      return 2;
    }
  }
  int have = 0;
  CUDA_OK(cudaGetDeviceCount(&have));
  if (ndev < 1 || ndev > MAX_DEV || ndev > have) {
    fprintf(stderr, "allreduce_latency: want %d devices, %d visible\n", ndev, have);
    return 1;
  }
  if (opt_reps < 1) opt_reps = 1;
  if (opt_warmup < 0) opt_warmup = 0;

  size_t maxbytes = 0;
  for (int s = 0; s < nsizes; s++)
    if (sizes[s] > maxbytes) maxbytes = sizes[s];

  int devs[MAX_DEV];
  for (int d = 0; d < ndev; d++) devs[d] = d;
  double t_init = now_us();
  NCCL_OK(ncclCommInitAll(comms, ndev, devs));
  t_init = now_us() - t_init;
  for (int d = 0; d < ndev; d++) {
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc((void **)&sendbuf[d], maxbytes));
    CUDA_OK(cudaMalloc((void **)&recvbuf[d], maxbytes));
    CUDA_OK(cudaMemset(sendbuf[d], 0, maxbytes));
    CUDA_OK(cudaMemset(recvbuf[d], 0, maxbytes));
  }
  for (int d = 0; d < ndev; d++) {
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaDeviceSynchronize());
  }
  int nccl_version = 0;
  NCCL_OK(ncclGetVersion(&nccl_version));
  const char *plugin = getenv("NCCL_PROFILER_PLUGIN");

  double *rep_us = calloc((size_t)opt_reps, sizeof(double));
  for (int s = 0; s < nsizes; s++) {
    size_t count = sizes[s] / sizeof(float);
    if (opt_fixed >= 0) {
      double t0 = now_us();
      for (long i = 0; i < opt_fixed; i++) issue(count);
      sync_all();
      double dt = now_us() - t0;
      printf("{\"bench\":\"allreduce_latency\",\"label\":\"%s\",\"mode\":\"fixed\",\"ndev\":%d,"
             "\"size_bytes\":%zu,\"count\":%zu,\"dtype\":\"float32\",\"ops\":%ld,"
             "\"mean_us\":%.2f}\n",
             opt_label, ndev, sizes[s], count, opt_fixed,
             opt_fixed > 0 ? dt / (double)opt_fixed : 0.0);
      fflush(stdout);
      continue;
    }
    int iters = opt_iters > 0 ? opt_iters : default_iters(sizes[s]);
    for (int i = 0; i < opt_warmup; i++) issue(count);
    sync_all();
    for (int r = 0; r < opt_reps; r++) {
      double t0 = now_us();
      for (int i = 0; i < iters; i++) issue(count);
      sync_all();
      rep_us[r] = (now_us() - t0) / iters;
    }
    qsort(rep_us, (size_t)opt_reps, sizeof(double), cmp_double);
    double med = (opt_reps % 2) ? rep_us[opt_reps / 2]
                                : 0.5 * (rep_us[opt_reps / 2 - 1] + rep_us[opt_reps / 2]);
    double algbw = (double)sizes[s] / (med * 1e-6) / 1e9;
    double busbw = algbw * 2.0 * (ndev - 1) / ndev;
    printf("{\"bench\":\"allreduce_latency\",\"label\":\"%s\",\"mode\":\"timed\",\"ndev\":%d,"
           "\"size_bytes\":%zu,\"count\":%zu,\"dtype\":\"float32\",\"iters\":%d,\"reps\":%d,"
           "\"warmup\":%d,\"median_us\":%.3f,\"min_us\":%.3f,\"max_us\":%.3f,"
           "\"algbw_gbs\":%.3f,\"busbw_gbs\":%.3f}\n",
           opt_label, ndev, sizes[s], count, iters, opt_reps, opt_warmup, med, rep_us[0],
           rep_us[opt_reps - 1], algbw, busbw);
    fflush(stdout);
  }
  free(rep_us);

  for (int d = 0; d < ndev; d++) {
    CUDA_OK(cudaSetDevice(d));
    CUDA_OK(cudaFree(sendbuf[d]));
    CUDA_OK(cudaFree(recvbuf[d]));
    CUDA_OK(cudaStreamDestroy(streams[d]));
  }
  double t_fin = now_us();
  for (int d = 0; d < ndev; d++) NCCL_OK(ncclCommDestroy(comms[d]));
  t_fin = now_us() - t_fin;
  printf("{\"bench\":\"allreduce_latency\",\"label\":\"%s\",\"summary\":true,\"ndev\":%d,"
         "\"nccl_version\":%d,\"profiler_plugin\":\"%s\",\"ops_per_comm\":%lld,"
         "\"comm_init_ms\":%.1f,\"comm_destroy_ms\":%.1f}\n",
         opt_label, ndev, nccl_version, plugin ? plugin : "", ops_issued, t_init / 1e3,
         t_fin / 1e3);
  return 0;
}

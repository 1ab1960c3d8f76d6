/*
 * Process-global lifecycle: the first init loads the configuration, creates the
 * pool and starts the writer thread; every init registers a communicator;
 * finalize asks the writer to flush that communicator. init never returns an
 * error: a communicator that cannot be recorded gets a NULL context.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rw.h"

rw_global rw_g;
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static bool global_tried;

/* mkdir -p; returns 0 when the directory exists afterwards. */
static int make_dirs(const char *path) {
  char buf[RW_PATH_MAX];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
  struct stat st;
  return stat(buf, &st) == 0 && S_ISDIR(st.st_mode) && access(buf, W_OK) == 0 ? 0 : -1;
}

/* NCCL dlcloses its plugin when the last communicator goes; our writer thread
 * outlives that, so keep our own code mapped for the life of the process. */
static void pin_library(void) {
  Dl_info info;
  if (dladdr((void *)&rw_init, &info) && info.dli_fname)
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
}

static bool global_init(ncclDebugLogger_t logfn) {
  rw_g.logfn = logfn;
  rw_config_load(&rw_g.cfg);
  if (!rw_g.cfg.enabled) {
    rw_info("disabled by RANKWATCH_ENABLE / NCCL_INSPECTOR_ENABLE");
    return false;
  }
  rw_g.pid = (int)getpid();
  if (make_dirs(rw_g.cfg.dump_dir) != 0) {
    rw_warn_once(RW_WARN_DIR, "cannot create or write dump directory '%s' (%s); recording off",
                 rw_g.cfg.dump_dir, strerror(errno));
    return false;
  }
  if (rw_pool_init(&rw_g.pool, rw_g.cfg.pool_slots) != 0) return false;
  rw_g.base_mask = ncclProfileColl | (rw_g.cfg.p2p ? ncclProfileP2p : 0);
  rw_g.tsc = rw_ticks_choose_tsc(getenv("RANKWATCH_CLOCK"));
  rw_ticks_calibrate();
  ST(&rw_g.kch_on, rw_g.cfg.gpu_timing == RW_GPU_ON);
  pin_library();
  if (rw_writer_start() != 0) {
    rw_warn_once(RW_WARN_THREAD, "cannot start the writer thread; recording off");
    rw_pool_destroy(&rw_g.pool);
    return false;
  }
  rw_info("recording to %s (gpu timing %s)", rw_g.cfg.dump_dir,
          rw_g.cfg.gpu_timing == RW_GPU_ON ? "on"
          : rw_g.cfg.gpu_timing == RW_GPU_OFF ? "off" : "sampled");
  return true;
}

/* The CUDA device of the calling thread, if the process's CUDA runtime is
 * already loaded; we never load or link it ourselves. */
static int current_device(void) {
  static const char *const libs[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};
  for (int i = 0; libs[i]; i++) {
    void *h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
    if (h == NULL) continue;
    int (*get)(int *) = (int (*)(int *))dlsym(h, "cudaGetDevice");
    int dev = -1;
    int ok = get != NULL && get(&dev) == 0;
    dlclose(h);
    if (ok) return dev;
  }
  return -1;
}

ncclResult_t rw_init(void **context, uint64_t comm_id, int *mask, const char *name, int nnodes,
                     int nranks, int rank, ncclDebugLogger_t logfn, int abi) {
  if (context == NULL) return ncclSuccess;
  *context = NULL;
  pthread_mutex_lock(&init_mu);
  if (!global_tried) {
    global_tried = true;
    rw_g.ready = global_init(logfn);
  }
  bool ready = rw_g.ready;
  pthread_mutex_unlock(&init_mu);
  if (!ready) return ncclSuccess;
  *context = rw_comm_create(comm_id, name, nnodes, nranks, rank, abi, current_device());
  if (mask != NULL && *context != NULL) {
    atomic_store_explicit(&rw_g.mask_ptr, mask, memory_order_release);
    rw_writer_apply_mask(rw_now_ns());
  }
  return ncclSuccess;
}

ncclResult_t rw_finalize(void *context) {
  rw_comm *c = rw_comm_from_context(context);
  if (c == NULL || (int)getpid() != rw_g.pid) return ncclSuccess;
  ST(&c->finalizing, 1);
  rw_writer_flush_comm(c->index);
  return ncclSuccess;
}

/* Runs at process exit (the library is pinned, so never at NCCL's dlclose):
 * write what is left, with bounded waiting. */
__attribute__((destructor)) static void rw_at_exit(void) {
  /* A forked child (a data-loader worker, say) inherits our state but not the
   * writer thread, and possibly a lock the writer held: it must not wait. */
  if (rw_g.ready && (int)getpid() == rw_g.pid) rw_writer_stop("exit");
}

/* Warnings go through NCCL's own logger (subsystem PROFILE), once per cause. */
#include <stdarg.h>
#include <stdio.h>

#include "rw.h"

static _Atomic int warned[RW_WARN_NCAUSES];

static void emit(ncclDebugLogLevel level, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  ncclDebugLogger_t log = rw_g.logfn;
  if (log) log(level, NCCL_PROFILE_SUBSYS, "rankwatch", __LINE__, "rankwatch: %s", msg);
}

void rw_warn_once(enum rw_warn_cause cause, const char *fmt, ...) {
  /* A plain load first: the pool-full path calls this for every dropped op. */
  if ((unsigned)cause >= RW_WARN_NCAUSES || atomic_load_explicit(&warned[cause],
      memory_order_relaxed) || atomic_exchange(&warned[cause], 1))
    return;
  va_list ap;
  va_start(ap, fmt);
  emit(NCCL_LOG_WARN, fmt, ap);
  va_end(ap);
}

void rw_info(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit(NCCL_LOG_INFO, fmt, ap);
  va_end(ap);
}

/* Adapters for profiler interfaces v5 (NCCL 2.28) and v6 (2.29, 2.30): the
 * descriptor layouts agree on every field we read, so both tables share them. */
#include "abi_adapters.h"
#include "layout_checks.h"
#include "rw.h"

static ncclResult_t init_v5(void **context, uint64_t commId, int *mask, const char *commName,
                            int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  return rw_init(context, commId, mask, commName, nNodes, nranks, rank, logfn, 5);
}

static ncclResult_t init_v6(void **context, uint64_t commId, int *mask, const char *commName,
                            int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  return rw_init(context, commId, mask, commName, nNodes, nranks, rank, logfn, 6);
}

static ncclResult_t start_event(void *context, void **eHandle, ncclProfilerEventDescr_v6_t *d) {
  if (d == NULL) {
    if (eHandle) *eHandle = NULL;
    return ncclSuccess;
  }
  rw_start_event(context, eHandle, d->type, d->parentObj, &d->coll);
  return ncclSuccess;
}

ncclResult_t rw_abi_stop_event(void *eHandle) {
  rw_stop_event(eHandle);
  return ncclSuccess;
}

ncclResult_t rw_abi_record_state(void *eHandle, ncclProfilerEventState_t state,
                                 ncclProfilerEventStateArgs_v4_t *args) {
  rw_record_state(eHandle, (int)state, args);
  return ncclSuccess;
}

ncclResult_t rw_abi_finalize(void *context) { return rw_finalize(context); }

__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {
    "rankwatch", init_v5, start_event, rw_abi_stop_event, rw_abi_record_state, rw_abi_finalize};
__attribute__((visibility("default"))) ncclProfiler_v6_t ncclProfiler_v6 = {
    "rankwatch", init_v6, start_event, rw_abi_stop_event, rw_abi_record_state, rw_abi_finalize};

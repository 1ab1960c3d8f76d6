/* Adapter for profiler interface v4 (NCCL 2.27): uint8_t event type, the
 * communicator id as the 4th init argument, and no API events. The union
 * members we read have the same offsets as in v5. */
#include "abi_adapters.h"
#include "layout_checks.h"
#include "rw.h"

static ncclResult_t init_v4(void **context, int *mask, const char *commName, uint64_t commHash,
                            int nNodes, int nranks, int rank, ncclDebugLogger_t logfn) {
  return rw_init(context, commHash, mask, commName, nNodes, nranks, rank, logfn, 4);
}

static ncclResult_t start_event(void *context, void **eHandle, ncclProfilerEventDescr_v4_t *d) {
  if (d == NULL) {
    if (eHandle) *eHandle = NULL;
    return ncclSuccess;
  }
  rw_start_event(context, eHandle, d->type, d->parentObj, &d->coll);
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclProfiler_v4_t ncclProfiler_v4 = {
    "rankwatch", init_v4, start_event, rw_abi_stop_event, rw_abi_record_state, rw_abi_finalize};

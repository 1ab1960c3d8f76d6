/*
 * rankwatch bench: a "null" NCCL profiler plugin.
 *
 * It asks NCCL for events and does nothing with them, so loading it measures
 * NCCL's own instrumentation cost for a given event mask: the floor that any
 * plugin requesting the same mask sits on. rankwatch minus this plugin, with the
 * same mask, is rankwatch's own cost.
 *
 *   NULL_PLUGIN_MASK   event mask written in init (strtol base 0, so "0x46" or
 *                      "70"); default 0x46 = Coll|P2p|KernelCh, rankwatch's mask.
 *
 * Exports ncclProfiler_v5 (NCCL 2.28) and ncclProfiler_v6 (2.29+); everything
 * else has hidden visibility. Links nothing but libc.
 */
#include <stdlib.h>

#include "profiler_v6.h"

#define NULL_PLUGIN_DEFAULT_MASK 0x46

#define NP_EXPORT __attribute__((visibility("default")))

/* Any non-NULL value will do: NCCL only hands it back to us. */
static int np_context_token;

static int np_mask_from_env(void) {
  const char *s = getenv("NULL_PLUGIN_MASK");
  if (s == NULL || *s == '\0') return NULL_PLUGIN_DEFAULT_MASK;
  char *end = NULL;
  long v = strtol(s, &end, 0);
  if (end == s || *end != '\0' || v < 0 || v > 0x7fffffffL) return NULL_PLUGIN_DEFAULT_MASK;
  return (int)v;
}

static ncclResult_t np_init(void **context, uint64_t commId, int *eActivationMask,
                            const char *commName, int nNodes, int nranks, int rank,
                            ncclDebugLogger_t logfn) {
  (void)commId;
  (void)commName;
  (void)nNodes;
  (void)nranks;
  (void)rank;
  (void)logfn;
  if (eActivationMask != NULL) *eActivationMask = np_mask_from_env();
  if (context != NULL) *context = &np_context_token;
  return ncclSuccess;
}

static ncclResult_t np_start_event(void *context, void **eHandle,
                                   ncclProfilerEventDescr_v6_t *eDescr) {
  (void)context;
  (void)eDescr;
  if (eHandle != NULL) *eHandle = NULL;
  return ncclSuccess;
}

static ncclResult_t np_stop_event(void *eHandle) {
  (void)eHandle;
  return ncclSuccess;
}

static ncclResult_t np_record_event_state(void *eHandle, ncclProfilerEventState_t eState,
                                          ncclProfilerEventStateArgs_v6_t *eStateArgs) {
  (void)eHandle;
  (void)eState;
  (void)eStateArgs;
  return ncclSuccess;
}

static ncclResult_t np_finalize(void *context) {
  (void)context;
  return ncclSuccess;
}

/* v5 and v6 share the table and descriptor layout (see plugin/abi/profiler_v6.h). */
NP_EXPORT ncclProfiler_v6_t ncclProfiler_v6 = {
    "rankwatch-bench-null", np_init, np_start_event, np_stop_event, np_record_event_state,
    np_finalize,
};

NP_EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {
    "rankwatch-bench-null", np_init, np_start_event, np_stop_event, np_record_event_state,
    np_finalize,
};

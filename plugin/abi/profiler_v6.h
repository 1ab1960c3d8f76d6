/*
 * rankwatch: NCCL profiler interfaces v5 (NCCL 2.28) and v6 (2.29, 2.30), own
 * declarations. v6 only appends copy-engine members to the v5 union, so every
 * field the two share sits at the same offset and one descriptor type serves both.
 */
#ifndef RANKWATCH_ABI_PROFILER_V6_H
#define RANKWATCH_ABI_PROFILER_V6_H

#include "profiler_common.h"

typedef struct {
  uint64_t type;
  void *parentObj;
  int rank;
  union {
    rw_abi_group_api_t groupApi;
    rw_abi_coll_api_t collApi;
    rw_abi_p2p_api_t p2pApi;
    rw_abi_kernel_launch_t kernelLaunch;
    rw_abi_coll_t coll;
    rw_abi_p2p_t p2p;
    rw_abi_proxy_op_t proxyOp;
    rw_abi_proxy_step_t proxyStep;
    rw_abi_kernel_ch_t kernelCh;
    rw_abi_net_plugin_t netPlugin;
    rw_abi_ce_coll_t ceColl;
    rw_abi_ce_sync_t ceCollSync;
    rw_abi_ce_batch_t ceCollBatch;
  };
} ncclProfilerEventDescr_v6_t;
typedef ncclProfilerEventDescr_v6_t ncclProfilerEventDescr_v5_t;

typedef ncclResult_t (*rw_init_v5_fn)(void **context, uint64_t commId, int *eActivationMask,
                                      const char *commName, int nNodes, int nranks, int rank,
                                      ncclDebugLogger_t logfn);

typedef struct {
  const char *name;
  rw_init_v5_fn init;
  ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v6_t *eDescr);
  ncclResult_t (*stopEvent)(void *eHandle);
  ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_v6_t *eStateArgs);
  ncclResult_t (*finalize)(void *context);
} ncclProfiler_v6_t;
typedef ncclProfiler_v6_t ncclProfiler_v5_t;

#endif

/* Callbacks whose signature is the same in every interface version we export:
 * defined once in abi_v5_v6.c, also used by the v4 table. */
#ifndef RANKWATCH_ABI_ADAPTERS_H
#define RANKWATCH_ABI_ADAPTERS_H

#include "profiler_common.h"

ncclResult_t rw_abi_stop_event(void *eHandle);
ncclResult_t rw_abi_record_state(void *eHandle, ncclProfilerEventState_t state,
                                 ncclProfilerEventStateArgs_v4_t *args);
ncclResult_t rw_abi_finalize(void *context);

#endif

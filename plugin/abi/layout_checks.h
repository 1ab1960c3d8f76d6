/*
 * rankwatch: compile-time checks of every descriptor offset we rely on, against
 * the offsets measured on x86-64 LP64 (docs/plugin-abi.md). Included by the
 * adapters, so a layout mistake fails the build instead of corrupting a job.
 */
#ifndef RANKWATCH_ABI_LAYOUT_CHECKS_H
#define RANKWATCH_ABI_LAYOUT_CHECKS_H

#include <assert.h>
#include <stddef.h>

#include "profiler_v4.h"
#include "profiler_v6.h"

#define RW_AT(T, f, off) static_assert(offsetof(T, f) == (off), #T "." #f " must be at " #off)

#if defined(__x86_64__) || defined(__aarch64__)
RW_AT(ncclProfilerEventDescr_v6_t, type, 0);
RW_AT(ncclProfilerEventDescr_v6_t, parentObj, 8);
RW_AT(ncclProfilerEventDescr_v6_t, rank, 16);
RW_AT(ncclProfilerEventDescr_v6_t, groupApi.graphCaptured, 24);
RW_AT(ncclProfilerEventDescr_v6_t, groupApi.groupDepth, 28);
RW_AT(ncclProfilerEventDescr_v6_t, collApi.func, 24);
RW_AT(ncclProfilerEventDescr_v6_t, collApi.count, 32);
RW_AT(ncclProfilerEventDescr_v6_t, collApi.datatype, 40);
RW_AT(ncclProfilerEventDescr_v6_t, collApi.root, 48);
RW_AT(ncclProfilerEventDescr_v6_t, collApi.stream, 56);
RW_AT(ncclProfilerEventDescr_v6_t, collApi.graphCaptured, 64);
RW_AT(ncclProfilerEventDescr_v6_t, p2pApi.func, 24);
RW_AT(ncclProfilerEventDescr_v6_t, p2pApi.count, 32);
RW_AT(ncclProfilerEventDescr_v6_t, p2pApi.datatype, 40);
RW_AT(ncclProfilerEventDescr_v6_t, p2pApi.stream, 48);
RW_AT(ncclProfilerEventDescr_v6_t, p2pApi.graphCaptured, 56);
RW_AT(ncclProfilerEventDescr_v6_t, kernelLaunch.stream, 24);
RW_AT(ncclProfilerEventDescr_v6_t, coll.seqNumber, 24);
RW_AT(ncclProfilerEventDescr_v6_t, coll.func, 32);
RW_AT(ncclProfilerEventDescr_v6_t, coll.sendBuff, 40);
RW_AT(ncclProfilerEventDescr_v6_t, coll.recvBuff, 48);
RW_AT(ncclProfilerEventDescr_v6_t, coll.count, 56);
RW_AT(ncclProfilerEventDescr_v6_t, coll.root, 64);
RW_AT(ncclProfilerEventDescr_v6_t, coll.datatype, 72);
RW_AT(ncclProfilerEventDescr_v6_t, coll.nChannels, 80);
RW_AT(ncclProfilerEventDescr_v6_t, coll.nWarps, 81);
RW_AT(ncclProfilerEventDescr_v6_t, coll.algo, 88);
RW_AT(ncclProfilerEventDescr_v6_t, coll.proto, 96);
RW_AT(ncclProfilerEventDescr_v6_t, coll.parentGroup, 104);
RW_AT(ncclProfilerEventDescr_v6_t, p2p.func, 24);
RW_AT(ncclProfilerEventDescr_v6_t, p2p.buff, 32);
RW_AT(ncclProfilerEventDescr_v6_t, p2p.datatype, 40);
RW_AT(ncclProfilerEventDescr_v6_t, p2p.count, 48);
RW_AT(ncclProfilerEventDescr_v6_t, p2p.peer, 56);
RW_AT(ncclProfilerEventDescr_v6_t, p2p.nChannels, 60);
RW_AT(ncclProfilerEventDescr_v6_t, p2p.parentGroup, 64);
RW_AT(ncclProfilerEventDescr_v6_t, proxyOp.pid, 24);
RW_AT(ncclProfilerEventDescr_v6_t, proxyOp.channelId, 28);
RW_AT(ncclProfilerEventDescr_v6_t, proxyOp.peer, 32);
RW_AT(ncclProfilerEventDescr_v6_t, proxyOp.nSteps, 36);
RW_AT(ncclProfilerEventDescr_v6_t, proxyOp.chunkSize, 40);
RW_AT(ncclProfilerEventDescr_v6_t, proxyOp.isSend, 44);
RW_AT(ncclProfilerEventDescr_v6_t, proxyStep.step, 24);
RW_AT(ncclProfilerEventDescr_v6_t, kernelCh.channelId, 24);
RW_AT(ncclProfilerEventDescr_v6_t, kernelCh.pTimer, 32);
RW_AT(ncclProfilerEventDescr_v6_t, netPlugin.id, 24);
RW_AT(ncclProfilerEventDescr_v6_t, netPlugin.data, 32);
RW_AT(ncclProfilerEventDescr_v6_t, ceColl.seqNumber, 24);
RW_AT(ncclProfilerEventDescr_v6_t, ceColl.func, 32);
RW_AT(ncclProfilerEventDescr_v6_t, ceColl.syncStrategy, 80);
RW_AT(ncclProfilerEventDescr_v6_t, ceColl.intraBatchSync, 88);
RW_AT(ncclProfilerEventDescr_v6_t, ceColl.batchSize, 92);
RW_AT(ncclProfilerEventDescr_v6_t, ceColl.numBatches, 96);
RW_AT(ncclProfilerEventDescr_v6_t, ceColl.ceSeqNum, 100);
RW_AT(ncclProfilerEventDescr_v6_t, ceColl.stream, 104);
RW_AT(ncclProfilerEventDescr_v6_t, ceCollSync.isComplete, 24);
RW_AT(ncclProfilerEventDescr_v6_t, ceCollSync.nRanks, 28);
RW_AT(ncclProfilerEventDescr_v6_t, ceCollBatch.numOps, 24);
RW_AT(ncclProfilerEventDescr_v6_t, ceCollBatch.totalBytes, 32);
RW_AT(ncclProfilerEventDescr_v6_t, ceCollBatch.useIntraSync, 40);
static_assert(sizeof(ncclProfilerEventDescr_v6_t) == 112, "v5/v6 descriptor is 112 bytes");

RW_AT(ncclProfilerEventDescr_v4_t, type, 0);
RW_AT(ncclProfilerEventDescr_v4_t, parentObj, 8);
RW_AT(ncclProfilerEventDescr_v4_t, rank, 16);
RW_AT(ncclProfilerEventDescr_v4_t, coll.seqNumber, 24);
RW_AT(ncclProfilerEventDescr_v4_t, coll.func, 32);
RW_AT(ncclProfilerEventDescr_v4_t, coll.count, 56);
RW_AT(ncclProfilerEventDescr_v4_t, coll.root, 64);
RW_AT(ncclProfilerEventDescr_v4_t, coll.datatype, 72);
RW_AT(ncclProfilerEventDescr_v4_t, coll.nChannels, 80);
RW_AT(ncclProfilerEventDescr_v4_t, coll.nWarps, 81);
RW_AT(ncclProfilerEventDescr_v4_t, coll.algo, 88);
RW_AT(ncclProfilerEventDescr_v4_t, coll.proto, 96);
RW_AT(ncclProfilerEventDescr_v4_t, p2p.func, 24);
RW_AT(ncclProfilerEventDescr_v4_t, p2p.count, 48);
RW_AT(ncclProfilerEventDescr_v4_t, p2p.peer, 56);
RW_AT(ncclProfilerEventDescr_v4_t, p2p.nChannels, 60);
RW_AT(ncclProfilerEventDescr_v4_t, kernelCh.channelId, 24);
RW_AT(ncclProfilerEventDescr_v4_t, kernelCh.pTimer, 32);
static_assert(sizeof(ncclProfilerEventDescr_v4_t) == 104, "v4 descriptor is 104 bytes");

static_assert(sizeof(ncclProfilerEventStateArgs_v4_t) == 8, "state args are 8 bytes");
static_assert(sizeof(ncclProfilerEventState_t) == 4, "state enum is 4 bytes");
static_assert(sizeof(ncclProfiler_v6_t) == 6 * sizeof(void *), "plugin table is 6 pointers");
static_assert(sizeof(ncclProfiler_v4_t) == 6 * sizeof(void *), "plugin table is 6 pointers");
#endif

#endif

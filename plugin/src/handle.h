/*
 * Handles given to NCCL are encoded values, never pointers: NCCL only stores
 * and returns them. Decoding checks a magic, a bounded index and a generation,
 * so stale handles (graph replays re-use capture-time parents), foreign ones
 * (PXN) and garbage are all rejected without touching memory.
 *
 *   bits 61..63 magic (0b101)   bit 60 graph-captured (API handles)
 *   bits 56..59 kind            bits 48..55 channel (KernelCh)
 *   bits 24..47 generation      bits  0..23 index + 1
 */
#ifndef RANKWATCH_HANDLE_H
#define RANKWATCH_HANDLE_H

#include <stdint.h>

#define RW_H_MAGIC 0x5ULL
enum rw_handle_kind { RW_H_OP = 1, RW_H_KCH = 2, RW_H_COLLAPI = 3, RW_H_P2PAPI = 4 };

typedef struct {
  unsigned kind;
  uint32_t index; /* already minus one */
  uint32_t gen;   /* 24 bits */
  unsigned channel;
  int graph;
} rw_handle;

static inline void *rw_handle_encode(unsigned kind, uint32_t index, uint32_t gen,
                                     unsigned channel, int graph) {
  uint64_t v = RW_H_MAGIC << 61 | (uint64_t)(graph ? 1 : 0) << 60 | (uint64_t)(kind & 0xf) << 56 |
               (uint64_t)(channel & 0xff) << 48 | (uint64_t)(gen & 0xffffff) << 24 |
               ((index + 1) & 0xffffff);
  return (void *)(uintptr_t)v;
}

/* Returns 0 for anything that is not one of our handles. */
static inline int rw_handle_decode(const void *h, rw_handle *out) {
  uint64_t v = (uint64_t)(uintptr_t)h;
  if ((v >> 61) != RW_H_MAGIC) return 0;
  out->graph = (int)((v >> 60) & 1);
  out->kind = (unsigned)((v >> 56) & 0xf);
  out->channel = (unsigned)((v >> 48) & 0xff);
  out->gen = (uint32_t)((v >> 24) & 0xffffff);
  uint32_t idx = (uint32_t)(v & 0xffffff);
  if (idx == 0 && out->kind != RW_H_COLLAPI && out->kind != RW_H_P2PAPI) return 0;
  out->index = idx - 1;
  return 1;
}

#endif

/*
 * NCCL hands us func, datatype, algorithm and protocol names as static strings.
 * The hot path maps each pointer to a small id through a lock-free pointer
 * cache (strcmp only on the first sight of a pointer), so the writer never
 * dereferences NCCL memory and slots stay small.
 */
#include <string.h>

#include "rw.h"

static const char *const func_names[RW_NFUNC] = {
    "Unknown", "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce", "Send",
    "Recv", "AlltoAll", "Gather", "Scatter", "SendRecv", "PutSignal", "Signal", "WaitSignal",
    "AllGatherV"};
static const char *const dtype_names[] = {
    "Unknown", "ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
    "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
    "ncclFloat8e5m2"};
static const int dtype_sizes[] = {0, 1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static const char *const algo_names[] = {"Unknown", "TREE", "RING", "COLLNET_DIRECT",
                                         "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"};
static const char *const proto_names[] = {"Unknown", "LL", "LL128", "SIMPLE"};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *const *table(enum rw_name_kind kind, size_t *n) {
  switch (kind) {
  case RW_NAME_FUNC: *n = COUNT(func_names); return func_names;
  case RW_NAME_DTYPE: *n = COUNT(dtype_names); return dtype_names;
  case RW_NAME_ALGO: *n = COUNT(algo_names); return algo_names;
  default: *n = COUNT(proto_names); return proto_names;
  }
}

static uint8_t lookup_slow(enum rw_name_kind kind, const char *s) {
  size_t n;
  const char *const *names = table(kind, &n);
  for (size_t i = 1; i < n; i++)
    if (strcmp(names[i], s) == 0) return (uint8_t)i;
  /* Older NCCL and some paths spell a few names differently. */
  if (kind == RW_NAME_ALGO && strcmp(s, "Ring") == 0) return 2;
  if (kind == RW_NAME_ALGO && strcmp(s, "Tree") == 0) return 1;
  return 0;
}

/* Open-addressed cache: key = pointer, value = kind << 8 | id. Entries are only
 * ever added, and a lost race just means the next caller retries the slot. */
#define CACHE_SIZE 256
static _Atomic(const char *) cache_key[CACHE_SIZE];
static _Atomic uint16_t cache_val[CACHE_SIZE];

uint8_t rw_name_id(enum rw_name_kind kind, const char *s) {
  if (s == NULL) return 0;
  size_t h = (((uintptr_t)s >> 3) * 2654435761u + (size_t)kind) & (CACHE_SIZE - 1);
  for (int probe = 0; probe < 16; probe++, h = (h + 1) & (CACHE_SIZE - 1)) {
    const char *k = atomic_load_explicit(&cache_key[h], memory_order_acquire);
    if (k == s) {
      uint16_t v = atomic_load_explicit(&cache_val[h], memory_order_acquire);
      if ((v >> 8) == (uint16_t)kind + 1) return (uint8_t)(v & 0xff);
      if (v == 0) return lookup_slow(kind, s); /* being published right now */
      continue; /* the same pointer interned for another kind */
    }
    if (k == NULL) {
      const char *expected = NULL;
      if (!atomic_compare_exchange_strong(&cache_key[h], &expected, s)) {
        if (expected == s) return lookup_slow(kind, s); /* a racing thread interns it */
        continue;
      }
      uint8_t id = lookup_slow(kind, s);
      atomic_store_explicit(&cache_val[h], (uint16_t)((((uint16_t)kind + 1) << 8) | id),
                            memory_order_release);
      return id;
    }
  }
  return lookup_slow(kind, s); /* cache full: still correct, just slower */
}

const char *rw_name_str(enum rw_name_kind kind, uint8_t id) {
  size_t n;
  const char *const *names = table(kind, &n);
  return id < n ? names[id] : names[0];
}

int rw_dtype_size(uint8_t dtype_id) {
  return dtype_id < COUNT(dtype_sizes) ? dtype_sizes[dtype_id] : 0;
}

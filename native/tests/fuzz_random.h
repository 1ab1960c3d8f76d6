/* The random source of the rankwatch fuzz drivers: splitmix64, seeded by the
 * driver (`state`), and pick(bound) in [0, bound). */
#ifndef FUZZ_RANDOM_H
#define FUZZ_RANDOM_H

#include <stdint.h>

static uint64_t state;

static uint64_t next(void) { /* splitmix64 */
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static int64_t pick(int64_t bound) { return bound > 0 ? (int64_t)(next() % (uint64_t)bound) : 0; }

#endif

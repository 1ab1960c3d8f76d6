/* rwsort: in-place sorting and selection shared by rankwatch's compiled kernels
 * (rwalign.c's medians, rwdetect.c's per-rank time orders): insertion sort for a
 * few values, heap sort above (n log n at worst), quickselect; no allocation. */
#ifndef RWSORT_H
#define RWSORT_H

#include <stdint.h>

static inline void rw_sift_down(int64_t *a, int64_t root, int64_t n) {
  for (;;) {
    int64_t child = 2 * root + 1;
    if (child >= n) return;
    if (child + 1 < n && a[child + 1] > a[child]) child++;
    if (a[root] >= a[child]) return;
    int64_t t = a[root];
    a[root] = a[child];
    a[child] = t;
    root = child;
  }
}

/* a[0 .. n) ascending */
static inline void rw_sort_i64(int64_t *a, int64_t n) {
  if (n <= 32) {
    for (int64_t i = 1; i < n; i++) {
      int64_t v = a[i], j = i;
      while (j > 0 && a[j - 1] > v) {
        a[j] = a[j - 1];
        j--;
      }
      a[j] = v;
    }
    return;
  }
  for (int64_t i = n / 2 - 1; i >= 0; i--) rw_sift_down(a, i, n);
  for (int64_t end = n - 1; end > 0; end--) {
    int64_t t = a[0];
    a[0] = a[end];
    a[end] = t;
    rw_sift_down(a, 0, end);
  }
}

/* The k-th smallest of v[0 .. m) (0-based), moved to v[k] with nothing larger
 * before it and nothing smaller after it: quickselect with median-of-three
 * pivots, linear on average where sorting is not. Values must be ordered by < (no
 * NaN). RW_SELECT defines one per value type. */
#define RW_SELECT(name, type)                                                              \
  static inline type name(type *v, int64_t m, int64_t k) {                                 \
    int64_t lo = 0, hi = m - 1;                                                            \
    while (hi > lo) {                                                                      \
      int64_t mid = lo + (hi - lo) / 2;                                                    \
      type a = v[lo], b = v[mid], c = v[hi];                                               \
      type pivot = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));  \
      int64_t i = lo, j = hi;                                                              \
      while (i <= j) {                                                                     \
        while (v[i] < pivot) i++;                                                          \
        while (v[j] > pivot) j--;                                                          \
        if (i <= j) {                                                                      \
          type t = v[i];                                                                   \
          v[i] = v[j];                                                                     \
          v[j] = t;                                                                        \
          i++;                                                                             \
          j--;                                                                             \
        }                                                                                  \
      }                                                                                    \
      if (k <= j) hi = j;                                                                  \
      else if (k >= i) lo = i;                                                             \
      else break; /* v[j + 1 .. i - 1] all equal the pivot, k among them */                \
    }                                                                                      \
    return v[k];                                                                           \
  }

RW_SELECT(rw_select_i64, int64_t)
RW_SELECT(rw_select_f64, double)

#endif

/* rwsort: an in-place sort of int64 values shared by rankwatch's compiled kernels
 * (rwalign.c's medians, rwdetect.c's per-rank time orders): insertion sort for a
 * few values, heap sort above (n log n at worst, no allocation). */
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

#endif

/*
 * fake_nccl: rendezvous between the driver processes of one simulated job.
 *
 * A collective cannot end on any rank before the last rank's kernel started,
 * so each rank publishes the (host-clock) GPU start of every rendezvous op in
 * a shared file, <dir>/rdv-<commid>-n<nranks>.bin, mapped MAP_SHARED; a rank's
 * proxy then waits for all ranks and ends the op at max(start) + transfer.
 *
 * Layout: a header with an arrival counter, then per rank a ring of SLOTS
 * (tag, ready) pairs. Every process that opens the file adds 1 to the counter;
 * arrivals / nranks is the run's generation, so a file left behind by an
 * earlier run of the same job (same dir and comm id) is not mistaken for
 * this run's data. Slot tags are (generation << 32) | (index + 1).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_nccl.h"

#define SLOTS 4096 /* ops a rank may run ahead of the slowest one */

struct slot {
  uint64_t tag;
  int64_t ready;
};

struct header {
  uint64_t arrivals;
  uint64_t pad[7];
};

struct fn_rdv {
  struct header *hdr;
  struct slot *slots; /* [nranks][SLOTS] */
  size_t len;
  int nranks, rank;
  uint64_t gen;
};

static size_t map_len(int nranks) {
  return sizeof(struct header) + (size_t)nranks * SLOTS * sizeof(struct slot);
}

static void *map_file(const char *dir, uint64_t comm_id, int nranks, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/rdv-%016llx-n%d.bin", dir, (unsigned long long)comm_id,
           nranks);
  int fd = open(path, O_RDWR | O_CREAT, 0666);
  if (fd < 0) {
    fprintf(stderr, "fake_nccl: rendezvous %s: %s\n", path, strerror(errno));
    return NULL;
  }
  struct stat sb;
  /* Growing only: every rank asks for the same size, and a concurrent
   * ftruncate to that size keeps data another rank already wrote. */
  if (fstat(fd, &sb) != 0 || ((size_t)sb.st_size < len && ftruncate(fd, (off_t)len) != 0)) {
    fprintf(stderr, "fake_nccl: rendezvous %s: %s\n", path, strerror(errno));
    close(fd);
    return NULL;
  }
  void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return m == MAP_FAILED ? NULL : m;
}

struct fn_rdv *fn_rdv_open(const char *dir, uint64_t comm_id, int nranks, int rank) {
  if (!dir || nranks < 1 || rank < 0 || rank >= nranks) return NULL;
  size_t len = map_len(nranks);
  void *m = map_file(dir, comm_id, nranks, len);
  if (!m) return NULL;
  struct fn_rdv *r = calloc(1, sizeof *r);
  if (!r) abort();
  r->hdr = m;
  r->slots = (struct slot *)((char *)m + sizeof(struct header));
  r->len = len;
  r->nranks = nranks;
  r->rank = rank;
  r->gen = __atomic_fetch_add(&r->hdr->arrivals, 1, __ATOMIC_ACQ_REL) / (uint64_t)nranks;
  return r;
}

static uint64_t tag_of(const struct fn_rdv *r, long index) {
  return (r->gen << 32) | (uint64_t)((index + 1) & 0xffffffffL);
}

void fn_rdv_publish(struct fn_rdv *r, long index, int64_t ready_ns) {
  struct slot *s = &r->slots[(size_t)r->rank * SLOTS + (size_t)(index % SLOTS)];
  __atomic_store_n(&s->ready, ready_ns, __ATOMIC_RELAXED);
  __atomic_store_n(&s->tag, tag_of(r, index), __ATOMIC_RELEASE);
}

/* Latest ready time over all ranks for this op; gives up after the timeout
 * (reported through *timed_out) or when *stop_flag is set (abort). */
int64_t fn_rdv_wait_max(struct fn_rdv *r, long index, const int *stop_flag, bool *timed_out) {
  int64_t deadline = fn_now_ns() + g_opt.rdv_timeout_ms * 1000000LL, last = 0;
  uint64_t want = tag_of(r, index);
  *timed_out = false;
  for (int rk = 0; rk < r->nranks; rk++) {
    struct slot *s = &r->slots[(size_t)rk * SLOTS + (size_t)(index % SLOTS)];
    while (__atomic_load_n(&s->tag, __ATOMIC_ACQUIRE) != want) {
      if (__atomic_load_n(stop_flag, __ATOMIC_ACQUIRE)) return last;
      if (fn_now_ns() > deadline) {
        *timed_out = true;
        return last > 0 ? last : fn_now_ns();
      }
      fn_sleep_ns(50000);
    }
    int64_t v = __atomic_load_n(&s->ready, __ATOMIC_RELAXED);
    if (v > last) last = v;
  }
  return last;
}

void fn_rdv_close(struct fn_rdv *r) {
  if (!r) return;
  munmap(r->hdr, r->len);
  free(r);
}

/* Robustness harness for rwparse: random truncations, byte flips, insertions,
 * deletions and splices of real record lines must never crash, read outside the
 * buffer or hang. Meant to run under -fsanitize=address,undefined; every buffer
 * handed to the parser is an exact-size heap allocation, so any over-read is
 * caught. Counts are checked for consistency on every run. rwp_capture (the kept
 * collective columns) runs on random chunk columns alongside. With NESTED_FILE
 * (one rwn_new spec per line), every interned string is also read as each nested
 * type, and the dictionary's Arrow buffers (rwp_strings) are checked.
 *
 * usage: fuzz_rwparse SPEC_FILE LINES_FILE ITERATIONS SEED [NESTED_FILE]
 */
#include "rwparse.h"
#include "rwkept.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;

static uint64_t next_random(void) {
  /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ull;
}

static size_t below(size_t n) { return n ? (size_t)(next_random() % n) : 0; }

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      char *grown = realloc(buf, cap *= 2);
      if (!grown) {
        free(buf);
        buf = NULL;
      }
      buf = grown;
    }
  }
  fclose(f);
  *len = n;
  return buf;
}

/* Bytes that stress a JSON tokenizer. */
static const char INTERESTING[] = "{}[]\",:\\0123456789-+.eEtrufalsn \t\r\n/u";

static uint8_t random_byte(void) {
  switch (below(4)) {
    case 0: return (uint8_t)INTERESTING[below(sizeof INTERESTING - 1)];
    case 1: return (uint8_t)(0x80 + below(0x80)); /* non-ASCII, often invalid UTF-8 */
    case 2: return (uint8_t)below(0x20);          /* control characters */
    default: return (uint8_t)below(256);
  }
}

typedef struct {
  char **lines;
  size_t *lens;
  size_t n;
} lines_t;

static void split_lines(char *text, size_t len, lines_t *out) {
  size_t cap = 64;
  out->lines = malloc(cap * sizeof *out->lines);
  out->lens = malloc(cap * sizeof *out->lens);
  out->n = 0;
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i == len || text[i] == '\n') {
      if (i > start) {
        if (out->n == cap) {
          cap *= 2;
          out->lines = realloc(out->lines, cap * sizeof *out->lines);
          out->lens = realloc(out->lens, cap * sizeof *out->lens);
        }
        out->lines[out->n] = text + start;
        out->lens[out->n] = i - start;
        out->n++;
      }
      start = i + 1;
    }
  }
}

/* One mutated buffer of 1..4 lines; returns its length (the buffer is exact). */
static uint8_t *mutated(const lines_t *seed, size_t *len) {
  size_t cap = 0, n = 0, picked[4];
  int nlines = 1 + (int)below(4);
  for (int i = 0; i < nlines; i++) {
    picked[i] = below(seed->n);
    cap += seed->lens[picked[i]] + 64;
  }
  cap = cap * 2 + 64;
  uint8_t *tmp = malloc(cap);
  for (int i = 0; i < nlines; i++) {
    size_t k = picked[i];
    memcpy(tmp + n, seed->lines[k], seed->lens[k]);
    n += seed->lens[k];
    if (i + 1 < nlines || below(2)) tmp[n++] = '\n';
  }
  int edits = 1 + (int)below(6);
  for (int e = 0; e < edits && n > 0; e++) {
    size_t at = below(n);
    switch (below(6)) {
      case 0: /* flip a byte */
        tmp[at] = random_byte();
        break;
      case 1: /* insert a byte */
        if (n + 1 < cap) {
          memmove(tmp + at + 1, tmp + at, n - at);
          tmp[at] = random_byte();
          n++;
        }
        break;
      case 2: { /* delete a range */
        size_t k = below(16) + 1;
        if (at + k > n) k = n - at;
        memmove(tmp + at, tmp + at + k, n - at - k);
        n -= k;
        break;
      }
      case 3: /* truncate */
        n = at;
        break;
      case 4: { /* duplicate a range somewhere else */
        size_t k = below(32) + 1, to = below(n);
        if (at + k > n) k = n - at;
        if (n + k < cap) {
          memmove(tmp + to + k, tmp + to, n - to);
          memmove(tmp + to, tmp + (at < to ? at : at + k), k);
          n += k;
        }
        break;
      }
      default: /* deep nesting */
        if (n + 200 < cap) {
          memmove(tmp + at + 100, tmp + at, n - at);
          memset(tmp + at, below(2) ? '[' : '{', 100);
          n += 100;
        }
    }
  }
  uint8_t *exact = malloc(n ? n : 1);
  memcpy(exact, tmp, n);
  free(tmp);
  *len = n;
  return exact;
}

typedef struct {
  void *values[512];
  uint8_t *valid[512];
  int slots;
  int64_t cap;
} chunk_t;

static void chunk_alloc(chunk_t *c, int slots, int64_t cap) {
  c->slots = slots;
  c->cap = cap;
  for (int i = 0; i < slots; i++) {
    c->values[i] = calloc((size_t)cap, 8);
    c->valid[i] = calloc((size_t)(cap + 7) / 8, 1);
  }
}

static void chunk_free(chunk_t *c) {
  for (int i = 0; i < c->slots; i++) {
    free(c->values[i]);
    free(c->valid[i]);
  }
}

static int check(int cond, const char *what, uint64_t iteration) {
  if (!cond) fprintf(stderr, "iteration %llu: %s\n", (unsigned long long)iteration, what);
  return cond;
}

/* rwp_capture over random chunk columns (rwkept.h's layout): kinds, codes in and
 * just out of range, NULLs, several processes, large ranks and negative sizes.
 * Returns 0 on a broken invariant. */
static int capture_round(uint64_t it) {
  int64_t rows = (int64_t)below(300), n_local = 1 + (int64_t)below(5);
  void *values[RW_C];
  uint8_t *valid[RW_C];
  for (int c = 0; c < RW_C; c++) {
    values[c] = calloc((size_t)(rows ? rows : 1), 8);
    valid[c] = calloc((size_t)(rows + 8) / 8, 1);
    for (int64_t b = 0; b < (rows + 7) / 8; b++) valid[c][b] = (uint8_t)next_random();
  }
  int many = below(4) == 0, bad = below(8) == 0, processes = below(3) == 0;
  for (int64_t i = 0; i < rows; i++) {
    ((int32_t *)values[RW_C_KIND])[i] = (int32_t)below(3);
    int32_t func = bad && below(50) == 0 ? (int32_t)n_local : (int32_t)below((size_t)n_local);
    ((int32_t *)values[RW_C_FUNC])[i] = func;
    ((int32_t *)values[RW_C_COMM_ID])[i] = (int32_t)below(many ? 5000 : 4);
    ((int32_t *)values[RW_C_COMM_NAME])[i] = (int32_t)below(4);
    /* processes in runs of rows (a unit's files one after another) */
    ((int32_t *)values[RW_C_HOST])[i] = (int32_t)(many || processes ? (i / 40 + below(2)) % 3 : 0);
    ((int64_t *)values[RW_C_PID])[i] = many || processes ? (int64_t)below(2) : 7;
    ((int64_t *)values[RW_C_RANK])[i] = many ? (int64_t)(next_random() >> 40) : (int64_t)below(8);
    ((int64_t *)values[RW_C_N_RANKS])[i] = (int64_t)below(10) - 2;
    for (int c = RW_C_SEQ; c <= RW_C_CLOCK_ERROR; c++)  /* the int64 columns */
      ((int64_t *)values[c])[i] = (int64_t)next_random();
  }
  int32_t *remap = calloc((size_t)n_local, 4), *out_row = calloc((size_t)(rows ? rows : 1), 4);
  int32_t *out_func = calloc((size_t)(rows ? rows : 1), 4);
  int64_t *out_seq = calloc((size_t)(rows ? rows : 1), 8), *out_values[5];
  for (int c = 0; c < 5; c++) out_values[c] = calloc((size_t)(rows ? rows : 1), 8);
  uint8_t *out_valid = calloc((size_t)(rows ? rows : 1), 1);
  uint64_t *out_key = calloc((size_t)(rows ? rows : 1), 8);
  int32_t *out_proc = calloc((size_t)(rows ? rows : 1), 4);
  int64_t packed = -1;
  int64_t got = rwp_capture(rows, (const void *const *)values, (const uint8_t *const *)valid, 1,
                            remap, n_local, out_row, out_func, out_seq, out_values, out_valid,
                            out_key, out_proc, &packed);
  int ok = got == -1 ? check(bad, "capture refused good codes", it)
                     : check(got >= 0 && got <= rows && packed >= 0 && packed <= 2,
                             "capture count out of range", it);
  for (int64_t k = 1; ok && k < got; k++)
    ok = check(out_row[k] > out_row[k - 1], "capture rows out of order", it);
  /* packed: the same process number exactly where the same (host, pid), numbered
   * from 0 in order of appearance; one process exactly when packed is 1 */
  const int32_t *host = values[RW_C_HOST];
  const int64_t *pid = values[RW_C_PID];
  int32_t procs = 0;
  for (int64_t k = 0; ok && packed > 0 && k < got; k++) {
    ok = check(out_proc[k] >= 0 && out_proc[k] <= procs, "capture process out of order", it);
    if (out_proc[k] == procs) procs++;
    for (int64_t j = 0; ok && j < k; j++) {
      int same = host[out_row[j]] == host[out_row[k]] && pid[out_row[j]] == pid[out_row[k]];
      ok = check(same == (out_proc[j] == out_proc[k]), "capture process numbers", it);
    }
  }
  if (ok && packed > 0) ok = check((packed == 1) == (procs == 1), "capture packed kind", it);
  for (int c = 0; c < RW_C; c++) free(values[c]), free(valid[c]);
  for (int c = 0; c < 5; c++) free(out_values[c]);
  free(remap), free(out_row), free(out_func), free(out_seq), free(out_valid), free(out_key);
  free(out_proc);
  return ok;
}

/* rwp_groups over random chunk columns: few or many distinct keys, NULLs, and a
 * capacity sometimes too small. Returns 0 on a broken invariant. */
static int groups_round(uint64_t it) {
  int64_t rows = (int64_t)below(300), capacity = (int64_t)below(64);
  int many = below(3) == 0;
  void *values[RW_G];
  uint8_t *valid[RW_G];
  for (int c = 0; c < RW_G; c++) {
    values[c] = calloc((size_t)(rows ? rows : 1), 8);
    valid[c] = calloc((size_t)(rows + 8) / 8, 1);
    for (int64_t b = 0; b < (rows + 7) / 8; b++)
      valid[c][b] = below(4) ? 0xFF : (uint8_t)next_random();
    for (int64_t i = 0; i < rows; i++) {
      int64_t v = many ? (int64_t)below(50) : (int64_t)below(2);
      if (c >= RW_G_KEYS) v = (int64_t)next_random(); /* aggregated: any value */
      if (rw_g_is_code(c)) ((int32_t *)values[c])[i] = (int32_t)v;
      else ((int64_t *)values[c])[i] = v;
    }
  }
  size_t cap = (size_t)(capacity ? capacity : 1);
  int32_t *out_row = calloc(cap, 4);
  int64_t *out_count = calloc(cap, 8), *out_agg[RW_A];
  for (int a = 0; a < RW_A; a++) out_agg[a] = calloc(cap, 8);
  uint8_t *out_valid = calloc(cap, 1);
  int64_t n = rwp_groups(rows, (const void *const *)values, (const uint8_t *const *)valid,
                         capacity, out_row, out_count, out_agg, out_valid);
  int ok = check(n >= -1 && n <= capacity, "groups out of range", it);
  int64_t total = 0;
  for (int64_t g = 0; ok && n > 0 && g < n; g++) {
    ok = check(out_row[g] >= 0 && out_row[g] < rows && out_count[g] >= 1, "bad group", it);
    total += out_count[g];
  }
  if (ok && n >= 0) ok = check(total == rows, "groups miss rows", it);
  if (ok && n < 0) ok = check(rows > capacity, "groups refused a chunk that fits", it);
  for (int c = 0; c < RW_G; c++) free(values[c]), free(valid[c]);
  for (int a = 0; a < RW_A; a++) free(out_agg[a]);
  free(out_row), free(out_count), free(out_valid);
  return ok;
}

#define MAX_NESTED 8

/* Every interned string read as each nested type, one at a time (a text that is
 * not of the type fails its call alone); the buffers of a read that succeeded are
 * consistent. Returns 0 on a broken invariant. */
static uint64_t nested_read; /* texts a nested reader took */

static int nested_round(rwp_parser *p, rwn_reader **nested, int n_nested, uint64_t it) {
  int ok = 1;
  int32_t count = rwp_string_count(p);
  int32_t *offsets = malloc(((size_t)count + 1) * sizeof *offsets);
  int64_t len = -1;
  const char *data = rwp_strings(p, offsets, &len);
  ok = check(offsets[0] == 0 && offsets[count] == len && (data != NULL || len == 0),
             "dictionary buffers", it);
  for (int32_t c = 0; ok && c < count; c++)
    ok = check(offsets[c] <= offsets[c + 1], "dictionary offsets out of order", it);
  free(offsets);
  for (int k = 0; ok && k < n_nested; k++) {
    for (int32_t code = 0; ok && code < count; code++) {
      if (rwn_read(nested[k], p, &code, 1) != 0) continue;
      nested_read++;
      for (int node = 0; ok && node < rwn_node_count(nested[k]); node++) {
        const uint8_t *valid;
        const void *values;
        const int32_t *offs;
        const char *text;
        int64_t text_len, n = rwn_node(nested[k], node, &valid, &values, &offs, &text, &text_len);
        ok = check(n >= 0 && (node > 0 || n == 1), "nested length", it);
        for (int64_t i = 0; ok && offs && i < n; i++)
          ok = check(offs[i] <= offs[i + 1], "nested offsets out of order", it);
        if (ok && offs && n && text) ok = check(offs[n] == text_len, "nested text length", it);
      }
    }
  }
  return ok;
}

int main(int argc, char **argv) {
  if (argc != 5 && argc != 6) {
    fprintf(stderr, "usage: %s SPEC LINES ITERATIONS SEED [NESTED]\n", argv[0]);
    return 2;
  }
  rwn_reader *nested[MAX_NESTED];
  int n_nested = 0;
  if (argc == 6) {
    size_t nested_len;
    char *specs = read_file(argv[5], &nested_len), *line = specs;
    char *end = specs ? specs + nested_len : NULL;
    while (line && line < end && n_nested < MAX_NESTED) {
      char *nl = memchr(line, '\n', (size_t)(end - line));
      if (nl) *nl = '\0';
      char err[256];
      if (*line && !(nested[n_nested++] = rwn_new(line, err, sizeof err))) {
        fprintf(stderr, "nested spec: %s\n", err);
        return 2;
      }
      line = nl ? nl + 1 : end;
    }
    free(specs);
  }
  size_t spec_len, text_len;
  char *spec = read_file(argv[1], &spec_len);
  char *text = read_file(argv[2], &text_len);
  if (!spec || !text) {
    fprintf(stderr, "cannot read inputs\n");
    return 2;
  }
  char *spec_z = malloc(spec_len + 1);
  memcpy(spec_z, spec, spec_len);
  spec_z[spec_len] = '\0';
  lines_t seed;
  split_lines(text, text_len, &seed);
  if (!seed.n) {
    fprintf(stderr, "no seed lines\n");
    return 2;
  }
  uint64_t iterations = strtoull(argv[3], NULL, 10);
  rng_state = strtoull(argv[4], NULL, 10) * 2 + 1;

  char err[256];
  rwp_parser *p = rwp_new(spec_z, err, sizeof err);
  if (!p) {
    fprintf(stderr, "spec: %s\n", err);
    return 2;
  }
  int slots = rwp_slot_count(p);
  int ok = 1;
  uint64_t accepted = 0, flagged = 0;
  for (uint64_t it = 0; it < iterations && ok; it++) {
    size_t len;
    uint8_t *buf = mutated(&seed, &len);
    chunk_t chunk;
    int64_t cap = 1 + (int64_t)below(4);
    chunk_alloc(&chunk, slots, cap);
    if (below(4) == 0) {
      rwp_next_file(p); /* the previous iteration's dictionary goes on */
    } else {
      rwp_reset(p);
    }
    /* parse in two pieces (the first without `final`), binding fresh chunks as they fill */
    size_t cut = below(len + 1), pos = 0;
    int64_t rows = 0;
    for (int piece = 0; piece < 2 && ok; piece++) {
      size_t stop = piece == 0 ? cut : len;
      int final = piece == 1;
      for (int guard = 0; guard < 1000000; guard++) {
        if (rwp_bind(p, chunk.cap, chunk.values, chunk.valid) != 0) {
          ok = check(0, "rwp_bind failed", it);
          break;
        }
        /* an exact copy of the rest, so reads past it are caught */
        size_t left = stop - pos;
        uint8_t *rest = malloc(left ? left : 1);
        memcpy(rest, buf + pos, left);
        int64_t used = rwp_parse(p, (const char *)rest, (int64_t)left, final);
        free(rest);
        ok = ok && check(used >= 0 && (size_t)used <= left, "bytes used out of range", it);
        int64_t got = rwp_rows(p);
        ok = ok && check(got >= 0 && got <= chunk.cap, "rows out of range", it);
        rows += got;
        pos += (size_t)used;
        for (int32_t code = 0; code < rwp_string_count(p); code++) {
          int64_t n;
          const char *s = rwp_string(p, code, &n);
          ok = ok && check(s != NULL && n >= 0, "bad string", it);
        }
        if (got < chunk.cap) break; /* the rest needs more data (or there is none) */
        for (int i = 0; i < slots; i++) memset(chunk.valid[i], 0, (size_t)(chunk.cap + 7) / 8);
      }
    }
    ok = ok && check(pos == len, "final parse left bytes", it);
    int64_t lines = rwp_lines(p), bad = rwp_flagged(p);
    ok = ok && check(rows + bad <= lines, "more rows and flags than lines", it);
    for (int i = 0; i < (bad < RWP_MAX_FLAGS ? bad : RWP_MAX_FLAGS); i++) {
      int64_t line;
      int code;
      ok = ok && check(rwp_flag(p, i, &line, &code) == 0 && line >= 1 && line <= lines &&
                           code > 0 && code <= RWP_E_NOT_OBJECT,
                       "bad flag", it);
    }
    ok = ok && capture_round(it);
    ok = ok && groups_round(it);
    ok = ok && nested_round(p, nested, n_nested, it);
    accepted += (uint64_t)rows;
    flagged += (uint64_t)bad;
    chunk_free(&chunk);
    free(buf);
  }
  rwp_free(p);
  for (int k = 0; k < n_nested; k++) rwn_free(nested[k]);
  free(seed.lines);
  free(seed.lens);
  free(text);
  free(spec);
  free(spec_z);
  if (!ok) return 1;
  printf("ok: %llu iterations, %llu rows accepted, %llu lines flagged, %llu nested texts read\n",
         (unsigned long long)iterations, (unsigned long long)accepted,
         (unsigned long long)flagged, (unsigned long long)nested_read);
  return 0;
}

/* rwparse: see rwparse.h. A strict single-pass JSON tokenizer specialised for
 * objects of typed fields: values of known fields go straight into columnar
 * buffers, strings are interned, and everything else is validated and skipped.
 * Also: nested values kept as text read into Arrow buffers (rwn_*), and what the
 * reader keeps of each chunk (rwp_capture: collective rows; rwp_groups: counts).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strtod_l, newlocale */
#endif
#include "rwparse.h"
#include "rwkept.h"

#include <errno.h>
#include <locale.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOP 32
#define MAX_GROUPS 16
#define MAX_FIELDS 64 /* per group: a 64-bit mask tracks which were seen */
#define MAX_SLOTS 512
#define MAX_NAME 128 /* names are shorter by 8: bytes_equal reads words */
#define MAX_STRINGS (1 << 20)
#define MAX_ARENA ((size_t)64 << 20)
#define NUMBER_COPY 128 /* longest number handed to strtod */

typedef struct {
  char name[MAX_NAME]; /* the key, then '"' and ':' */
  uint32_t len;        /* of the key alone */
  char type;
  int slot;
  /* `"key":` as little-endian words, the last one masked: the expected next key
   * is recognised with a few word compares */
  uint64_t pattern[(MAX_NAME + 8) / 8];
  uint64_t last_mask;
  int words;
} field_t;

typedef struct {
  char name[MAX_NAME];
  uint32_t len;
  int slot;
  int nfields;
  int16_t field_slot[MAX_FIELDS]; /* fields[i].slot, packed for the hot loops */
  field_t fields[MAX_FIELDS];
} group_t;

typedef struct {
  char name[MAX_NAME];
  uint32_t len;
  int group; /* index into groups, or -1 for a rejected key */
} top_t;

/* The layout of a line seen before: the constant text before each value (keys,
 * punctuation, whole null groups) and the field each value belongs to. A line
 * whose constant text matches is parsed value by value without looking at keys.
 * The values of fields no line of the file has changed so far (host, pid, job,
 * device, datatype, flags: about a third of an op record's) are folded into the
 * constant text and written as they were parsed; a line that matches no template
 * marks each field whose folded value it changes as varying (learn_varying), and
 * later templates keep that field's value apart. At 1.2 KB op records: 0.67 ->
 * 0.45 us per record on one core (64 ranks' files), 1.12 -> 0.71 (1,024 ranks'). */
#define MAX_SPANS (MAX_GROUPS * MAX_FIELDS)
#define MAX_TEMPLATES 4
#define SHORT_TEXT 32 /* texts up to this long compare as masked words, without a loop */
#define SHORT_WORDS (SHORT_TEXT / 8)

typedef struct {
  uint32_t off, len; /* constant text in template_t.text */
  uint64_t mask[SHORT_WORDS]; /* word_mask(len, w) of each word, when len <= SHORT_TEXT */
  int16_t group;     /* the value after it: group and field, or -1 after the last */
  int16_t field;
  int16_t slot; /* and the field's slot and type */
  char type;
} segment_t;

/* A value folded into a template's constant text (see remember_layout): written as
 * it is on a match. */
typedef struct {
  int64_t value; /* i, n: the number; f: the double's bits; s, r: the code; b: 0/1 */
  int16_t slot;
  char type;
} fixed_t;

/* Where a folded value's text is in the template's text, to tell whether a line
 * that matched no template has another value there (learn_varying). */
typedef struct {
  uint32_t off, len;
  int16_t group, field;
} folded_t;

typedef struct {
  uint8_t *text; /* with SHORT_TEXT bytes of slack: compared a word at a time */
  size_t cap;
  int nseg;
  uint32_t groups_present;
  int nfixed, nfolded;
  uint64_t fixed_given[MAX_GROUPS]; /* the folded values that are not null */
  segment_t seg[MAX_SPANS + 1];
  fixed_t fixed[MAX_SPANS];
  folded_t folded[MAX_SPANS];
} template_t;

typedef struct {
  const uint8_t *start, *end;
  int16_t group, field;
} span_t;

struct rwp_parser {
  top_t top[MAX_TOP];
  int ntop;
  group_t groups[MAX_GROUPS];
  int ngroups;
  int root; /* the group of fields at the top level of the line itself, or -1 */
  int nslots;
  char slot_type[MAX_SLOTS];
  locale_t c_locale;

  /* bound chunk */
  int64_t cap, rows;
  void *values[MAX_SLOTS];
  uint8_t *valid[MAX_SLOTS];

  /* current line */
  uint64_t seen[MAX_GROUPS];  /* known keys met (duplicate check) */
  uint64_t given[MAX_GROUPS]; /* known keys with a non-null value */
  uint32_t top_seen;
  uint32_t groups_present;

  /* rows committed whose valid bits are not yet set: rows [run_start, rows) all
   * have run_given / run_present (most rows of a file share them) */
  int64_t run_start;
  uint64_t run_given[MAX_GROUPS];
  uint32_t run_present;

  /* rows [fixed_start, rows) were matched by template fixed_template (-1: none)
   * and its folded values are not yet written to them (flush_fixed) */
  int64_t fixed_start;
  int fixed_template;

  /* current file */
  int64_t lines, flagged, unterminated;
  int nflags;
  int64_t flag_line[RWP_MAX_FLAGS];
  int flag_code[RWP_MAX_FLAGS];

  /* interned strings: arena + open-addressing table of codes */
  char *arena;
  size_t arena_len, arena_cap;
  uint64_t *str_pos; /* plain << 63 | offset << 24 | length (< 16 MiB) */
  int32_t nstr, str_cap;
  int32_t *table; /* code + 1, 0 = empty */
  uint32_t table_cap;
  int32_t last_code[MAX_SLOTS];

  /* strings with escapes are decoded here */
  uint8_t *scratch;
  size_t scratch_cap;

  /* where the values of the line being parsed are, to make a template of it */
  span_t spans[MAX_SPANS];
  int nspans;
  int spans_ok; /* every key of the line is known */
  template_t templates[MAX_TEMPLATES];
  int ntemplates, last_template, next_template;
  /* fields seen with different values in a file: templates keep their values
   * apart; every other field's value is folded into a template's constant text
   * (kept for the parser's life: what varies in one file varies in the next) */
  uint64_t varies[MAX_GROUPS];
  int16_t span_of[MAX_GROUPS][MAX_FIELDS]; /* learn_varying's index: span + 1, 0 none */
};

/* ------------------------------------------------------------ character classes */

/* Bytes that end the fast scan of a string: quote, backslash, control, non-ASCII. */
static const uint8_t STRING_STOP[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};

static inline int is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

static inline const uint8_t *skip_ws(const uint8_t *s, const uint8_t *end) {
  while (s < end && is_ws(*s)) s++;
  return s;
}

static inline uint64_t load8(const uint8_t *s) {
  uint64_t v;
  memcpy(&v, s, 8);
  return v; /* little-endian byte order is assumed below (x86-64, aarch64) */
}

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull

/* High bit set in each byte of x that may end a string scan: the first set
 * byte is exact ('"', '\\', a control character or a non-ASCII byte); bytes
 * after it may be false positives, so only the lowest one is used. */
static inline uint64_t string_stops(uint64_t x) {
  uint64_t q = x ^ (ONES * '"'), b = x ^ (ONES * '\\');
  uint64_t zq = (q - ONES) & ~q, zb = (b - ONES) & ~b;
  uint64_t lt = (x - ONES * 0x20) & ~x;
  return (zq | zb | lt | x) & HIGHS;
}

/* Whether the 8 bytes of x are all ASCII digits. */
static inline int eight_digits(uint64_t x) {
  return (((x & 0xF0F0F0F0F0F0F0F0ull) |
           (((x + 0x0606060606060606ull) & 0xF0F0F0F0F0F0F0F0ull) >> 4)) ==
          0x3333333333333333ull);
}

/* The value of 8 ASCII digits (first byte most significant). */
static inline uint64_t eight_value(uint64_t x) {
  x = (x & 0x0F0F0F0F0F0F0F0Full) * 2561 >> 8;
  x = (x & 0x00FF00FF00FF00FFull) * 6553601 >> 16;
  return (x & 0x0000FFFF0000FFFFull) * 42949672960001ull >> 32;
}

/* Whether the n bytes at a (inside [a, end)) equal those at b. */
static inline int bytes_equal(const uint8_t *a, const uint8_t *end, const char *b, size_t n) {
  while (n >= 8) {
    uint64_t x, y;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    if (x != y) return 0;
    a += 8;
    b += 8;
    n -= 8;
  }
  if (n && end - a >= 8) {
    /* b has 8 readable bytes here: names are zero-padded, the arena has slack */
    uint64_t x, y;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    return ((x ^ y) & (~0ull >> (64 - 8 * n))) == 0;
  }
  while (n--) {
    if (*a++ != (uint8_t)*b++) return 0;
  }
  return 1;
}

/* The bytes of word w (< SHORT_WORDS) that belong to a text of `len` bytes. */
static inline uint64_t word_mask(size_t len, int w) {
  size_t have = len > 8 * (size_t)w ? len - 8 * (size_t)w : 0;
  return have >= 8 ? ~0ull : (1ull << (8 * have)) - 1;
}

/* Whether the text at s is `name` followed by its closing quote (names are plain
 * ASCII, so equal bytes mean an equal, valid JSON string). A short name with
 * SHORT_TEXT bytes to read at both (the arena has that much slack) compares
 * without a loop whose trip count varies with the name. */
static inline int quoted_is(const uint8_t *s, const uint8_t *end, const char *name, size_t len) {
  if ((size_t)(end - s) <= len || s[len] != '"') return 0;
  if (len <= SHORT_TEXT && end - s >= SHORT_TEXT) {
    const uint8_t *b = (const uint8_t *)name;
    uint64_t diff = 0;
    for (int w = 0; w < SHORT_WORDS; w++)
      diff |= (load8(s + 8 * w) ^ load8(b + 8 * w)) & word_mask(len, w);
    return diff == 0;
  }
  return bytes_equal(s, end, name, len);
}

/* Length of the valid UTF-8 sequence at s (lead byte >= 0x80), 0 if invalid. */
static int utf8_len(const uint8_t *s, const uint8_t *end) {
  uint8_t c = s[0];
  ptrdiff_t avail = end - s;
  if (c >= 0xC2 && c <= 0xDF) {
    return (avail >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
  }
  if (c >= 0xE0 && c <= 0xEF) {
    if (avail < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
    if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (avail < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
      return 0;
    if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0; /* above U+10FFFF */
    return 4;
  }
  return 0;
}

static int hex4(const uint8_t *s, const uint8_t *end, uint32_t *out) {
  if (end - s < 4) return 0;
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    uint8_t c = s[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
    else return 0;
  }
  *out = v;
  return 1;
}

/* ------------------------------------------------------------------- strings */

/* Decode the rest of a string with escapes into the scratch buffer. `s` points
 * at the first backslash; [start, s) is plain text already checked. */
static int decode_escaped(rwp_parser *p, const uint8_t *start, const uint8_t **ps,
                          const uint8_t *end, const uint8_t **out, size_t *outlen) {
  size_t need = (size_t)(end - start);
  if (need > p->scratch_cap) {
    size_t cap = p->scratch_cap ? p->scratch_cap : 256;
    while (cap < need) cap *= 2;
    uint8_t *grown = realloc(p->scratch, cap);
    if (!grown) return RWP_E_STRINGS;
    p->scratch = grown;
    p->scratch_cap = cap;
  }
  uint8_t *d = p->scratch;
  memcpy(d, start, (size_t)(*ps - start));
  d += *ps - start;
  const uint8_t *s = *ps;
  while (s < end) {
    uint8_t c = *s;
    if (c == '"') {
      *out = p->scratch;
      *outlen = (size_t)(d - p->scratch);
      *ps = s + 1;
      return RWP_OK;
    }
    if (c < 0x20) return RWP_E_ENCODING;
    if (c >= 0x80) {
      int n = utf8_len(s, end);
      if (!n) return RWP_E_ENCODING;
      memcpy(d, s, (size_t)n);
      d += n;
      s += n;
      continue;
    }
    if (c != '\\') {
      *d++ = c;
      s++;
      continue;
    }
    if (end - s < 2) return RWP_E_SYNTAX;
    uint8_t e = s[1];
    s += 2;
    switch (e) {
      case '"': *d++ = '"'; break;
      case '\\': *d++ = '\\'; break;
      case '/': *d++ = '/'; break;
      case 'b': *d++ = '\b'; break;
      case 'f': *d++ = '\f'; break;
      case 'n': *d++ = '\n'; break;
      case 'r': *d++ = '\r'; break;
      case 't': *d++ = '\t'; break;
      case 'u': {
        uint32_t cp;
        if (!hex4(s, end, &cp)) return RWP_E_ENCODING;
        s += 4;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return RWP_E_ENCODING; /* lone low surrogate */
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          uint32_t lo;
          if (end - s < 6 || s[0] != '\\' || s[1] != 'u' || !hex4(s + 2, end, &lo) ||
              lo < 0xDC00 || lo > 0xDFFF)
            return RWP_E_ENCODING;
          s += 6;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        /* an escape is at least 6 bytes and encodes to at most 4: d never passes s */
        if (cp < 0x80) {
          *d++ = (uint8_t)cp;
        } else if (cp < 0x800) {
          *d++ = (uint8_t)(0xC0 | (cp >> 6));
          *d++ = (uint8_t)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          *d++ = (uint8_t)(0xE0 | (cp >> 12));
          *d++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
          *d++ = (uint8_t)(0x80 | (cp & 0x3F));
        } else {
          *d++ = (uint8_t)(0xF0 | (cp >> 18));
          *d++ = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
          *d++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
          *d++ = (uint8_t)(0x80 | (cp & 0x3F));
        }
        break;
      }
      default:
        return RWP_E_ENCODING;
    }
  }
  return RWP_E_SYNTAX; /* unterminated */
}

/* A string whose opening quote is at (*ps)[-1]: its text (decoded when it has
 * escapes) in out/outlen, and *ps just past the closing quote. */
static inline int scan_string(rwp_parser *p, const uint8_t **ps, const uint8_t *end,
                              const uint8_t **out, size_t *outlen) {
  const uint8_t *start = *ps, *s = start;
  for (;;) {
    for (;;) {
      if (end - s >= 8) {
        uint64_t m = string_stops(load8(s));
        if (m) {
          s += __builtin_ctzll(m) >> 3;
          break;
        }
        s += 8;
      } else {
        while (s < end && !STRING_STOP[*s]) s++;
        break;
      }
    }
    if (s >= end) return RWP_E_SYNTAX;
    uint8_t c = *s;
    if (c == '"') {
      *out = start;
      *outlen = (size_t)(s - start);
      *ps = s + 1;
      return RWP_OK;
    }
    if (c == '\\') {
      *ps = s;
      return decode_escaped(p, start, ps, end, out, outlen);
    }
    if (c < 0x20) return RWP_E_ENCODING;
    int n = utf8_len(s, end);
    if (!n) return RWP_E_ENCODING;
    s += n;
  }
}

/* The n bytes at s (n < 8) as the low bytes of a word, without reading past them. */
static inline uint64_t tail_word(const uint8_t *s, size_t n) {
  uint64_t v = 0;
  memcpy(&v, s, n);
  return v;
}

/* A hash of n bytes, a word at a time: a byte at a time (FNV-1a) took about four
 * cycles a byte, a quarter of reading state files, whose nested values are texts of
 * a kilobyte interned whole. Only this parser's tables use it. */
static inline uint32_t hash_bytes(const uint8_t *s, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) h = (h ^ load8(s + i)) * 0xFF51AFD7ED558CCDull;
  if (i < n) h = (h ^ tail_word(s + i, n - i)) * 0xFF51AFD7ED558CCDull;
  h ^= h >> 32;
  h *= 0xC4CEB9FE1A85EC53ull;
  return (uint32_t)(h ^ (h >> 29));
}

#define PLAIN_BIT (1ull << 63)

static inline const char *str_at(const rwp_parser *p, int32_t code, size_t *len) {
  uint64_t pos = p->str_pos[code];
  *len = (size_t)(pos & 0xFFFFFF);
  return p->arena + ((pos & ~PLAIN_BIT) >> 24);
}

/* A string is plain when its JSON text is its bytes (nothing needed escaping). */
static int is_plain(const uint8_t *s, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x = load8(s + i);
    if (string_stops(x) & ~x) return 0; /* '"', '\\' or a control byte (not >= 0x80) */
  }
  for (; i < n; i++) {
    if (s[i] < 0x20 || s[i] == '"' || s[i] == '\\') return 0;
  }
  return 1;
}

static int grow_table(rwp_parser *p) {
  uint32_t cap = p->table_cap ? p->table_cap * 2 : 256;
  int32_t *table = calloc(cap, sizeof *table);
  if (!table) return 0;
  for (int32_t code = 0; code < p->nstr; code++) {
    size_t len;
    const char *s = str_at(p, code, &len);
    uint32_t i = hash_bytes((const uint8_t *)s, len) & (cap - 1);
    while (table[i]) i = (i + 1) & (cap - 1);
    table[i] = code + 1;
  }
  free(p->table);
  p->table = table;
  p->table_cap = cap;
  return 1;
}

/* The code of string s in this file's dictionary, adding it if new; -1 when full. */
static int32_t intern(rwp_parser *p, int slot, const uint8_t *s, size_t n) {
  int32_t last = p->last_code[slot];
  if (last >= 0) {
    size_t len;
    const char *have = str_at(p, last, &len);
    if (len == n && memcmp(have, s, n) == 0) return last;
  }
  if ((uint64_t)(p->nstr + 1) * 2 > p->table_cap && !grow_table(p)) return -1;
  uint32_t mask = p->table_cap - 1, i = hash_bytes(s, n) & mask;
  while (p->table[i]) {
    int32_t code = p->table[i] - 1;
    size_t len;
    const char *have = str_at(p, code, &len);
    if (len == n && memcmp(have, s, n) == 0) {
      p->last_code[slot] = code;
      return code;
    }
    i = (i + 1) & mask;
  }
  if (p->nstr >= MAX_STRINGS || n >= (1u << 24) || p->arena_len + n > MAX_ARENA) return -1;
  if (p->nstr == p->str_cap) {
    int32_t cap = p->str_cap ? p->str_cap * 2 : 256;
    uint64_t *pos = realloc(p->str_pos, (size_t)cap * sizeof *pos);
    if (!pos) return -1;
    p->str_pos = pos;
    p->str_cap = cap;
  }
  if (p->arena_len + n > p->arena_cap) {
    size_t cap = p->arena_cap ? p->arena_cap : 4096;
    while (cap < p->arena_len + n) cap *= 2;
    char *arena = realloc(p->arena, cap + SHORT_TEXT); /* slack: compares read words */
    if (!arena) return -1;
    p->arena = arena;
    p->arena_cap = cap;
  }
  if (n) memcpy(p->arena + p->arena_len, s, n);
  p->str_pos[p->nstr] = ((uint64_t)p->arena_len << 24) | n | (is_plain(s, n) ? PLAIN_BIT : 0);
  p->arena_len += n;
  int32_t code = p->nstr++;
  p->table[i] = code + 1;
  p->last_code[slot] = code;
  return code;
}

/* ------------------------------------------------------------------- numbers */

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                 1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

typedef struct {
  int is_int;       /* no fraction, no exponent */
  int neg;
  uint64_t mant;    /* up to 19 significant digits */
  int digits;       /* significant digits kept in mant */
  int dropped;      /* significant digits that did not fit */
  int64_t exp10;    /* value = mant * 10^exp10 (when dropped == 0) */
  const uint8_t *start, *end;
} number_t;

/* Scan a JSON number at s (RFC 8259 grammar). */
static int scan_number(const uint8_t **ps, const uint8_t *end, number_t *n) {
  const uint8_t *s = *ps;
  n->start = s;
  n->neg = 0;
  n->mant = 0;
  n->digits = 0;
  n->dropped = 0;
  n->exp10 = 0;
  n->is_int = 1;
  if (s < end && *s == '-') {
    n->neg = 1;
    s++;
  }
  if (s >= end || !is_digit(*s)) return RWP_E_SYNTAX;
  if (*s == '0') {
    s++;
    if (s < end && is_digit(*s)) return RWP_E_SYNTAX; /* leading zero */
  } else {
    /* the common case, a plain integer of up to 19 digits: 8 digits at a time */
    while (n->digits <= 11 && end - s >= 8 && eight_digits(load8(s))) {
      n->mant = n->mant * 100000000ull + eight_value(load8(s));
      n->digits += 8;
      s += 8;
    }
    while (s < end && is_digit(*s)) {
      if (n->digits < 19) {
        n->mant = n->mant * 10 + (uint64_t)(*s - '0');
        n->digits++;
      } else {
        n->dropped++;
        n->exp10++;
      }
      s++;
    }
  }
  if (s < end && *s == '.') {
    n->is_int = 0;
    s++;
    if (s >= end || !is_digit(*s)) return RWP_E_SYNTAX;
    while (s < end && is_digit(*s)) {
      if (n->digits < 19) {
        n->mant = n->mant * 10 + (uint64_t)(*s - '0');
        if (n->mant) n->digits++;
        n->exp10--;
      } else if (*s != '0') {
        n->dropped++;
      }
      s++;
    }
  }
  if (s < end && (*s == 'e' || *s == 'E')) {
    n->is_int = 0;
    s++;
    int eneg = 0;
    if (s < end && (*s == '+' || *s == '-')) eneg = *s++ == '-';
    if (s >= end || !is_digit(*s)) return RWP_E_SYNTAX;
    int64_t e = 0;
    while (s < end && is_digit(*s)) {
      if (e < 100000000) e = e * 10 + (*s - '0');
      s++;
    }
    n->exp10 += eneg ? -e : e;
  }
  n->end = s;
  *ps = s;
  return RWP_OK;
}

/* The integer value of an integral number, or RWP_E_RANGE. Integers are exact
 * here: the digit loop above keeps all 19 digits, and a 20th means overflow. */
static int number_int(const number_t *n, int64_t *out) {
  if (n->dropped) return RWP_E_RANGE;
  if (n->neg) {
    if (n->mant > (uint64_t)INT64_MAX + 1) return RWP_E_RANGE;
    *out = n->mant == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)n->mant;
  } else {
    if (n->mant > (uint64_t)INT64_MAX) return RWP_E_RANGE;
    *out = (int64_t)n->mant;
  }
  return RWP_OK;
}

/* The double nearest to the number: exact arithmetic when the mantissa and the
 * power of ten are exact doubles (one correctly rounded operation), else strtod
 * in the C locale. Infinite results and underflow are out of range. */
static int number_double(const rwp_parser *p, const number_t *n, double *out) {
  if (!n->dropped && n->mant <= (1ull << 53) && n->exp10 >= -22 && n->exp10 <= 22) {
    double v = (double)n->mant;
    v = n->exp10 < 0 ? v / POW10[-n->exp10] : v * POW10[n->exp10];
    *out = n->neg ? -v : v;
    return RWP_OK;
  }
  char copy[NUMBER_COPY];
  size_t len = (size_t)(n->end - n->start);
  if (len >= sizeof copy) return RWP_E_RANGE;
  memcpy(copy, n->start, len);
  copy[len] = '\0';
  errno = 0;
  char *stop;
  double v = strtod_l(copy, &stop, p->c_locale);
  if (errno == ERANGE || stop != copy + len) return RWP_E_RANGE;
  *out = v;
  return RWP_OK;
}

/* High bit set in each byte of x that is not an ASCII digit (exact for the
 * lowest such byte; only that one is used). */
static inline uint64_t non_digits(uint64_t x) {
  uint64_t below = (x - ONES * '0') & ~x; /* < '0' */
  uint64_t above = x + ONES * (0x80 - ('9' + 1)); /* > '9' */
  return (below | above | x) & HIGHS;
}

static const uint64_t POW10_U64[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000,
                                      100000000};

/* The value of the first n (1..8) digits of the word x. Shifting the digits to
 * the top leaves zero bytes in front, which read as leading zeros. */
static inline uint64_t first_digits(uint64_t x, int n) {
  return eight_value(x << (64 - 8 * n));
}

/* The length of a non-negative integer at s of 1 to 19 digits without a leading
 * zero that fits int64 and is not followed by a fraction or exponent (the common
 * case, found a word at a time), or 0 for anything else. A field that has no slot
 * is checked with this alone (two of a record's nanosecond times and two of its
 * Inspector counters); fast_int computes the value of one that has. */
static inline int plain_int_length(const uint8_t *s, const uint8_t *end) {
  if (end - s < 25 || *s == '0') return 0;
  uint64_t m = non_digits(load8(s));
  int len;
  if (m) {
    len = __builtin_ctzll(m) >> 3;
  } else if ((m = non_digits(load8(s + 8)))) {
    len = 8 + (__builtin_ctzll(m) >> 3);
  } else {
    m = non_digits(load8(s + 16));
    len = 16 + (m ? __builtin_ctzll(m) >> 3 : 8);
    /* 19 digits from 9223372036854775808 on do not fit (times start with a 1) */
    if (len > 19 || (len == 19 && *s == '9' && memcmp(s, "9223372036854775807", 19) > 0))
      return 0;
  }
  uint8_t next = s[len];
  if (len == 0 || next == '.' || next == 'e' || next == 'E') return 0;
  return len;
}

/* The integer plain_int_length finds at *ps, moving past it; 0 (moving nothing)
 * where it finds none. */
static inline int fast_int(const uint8_t **ps, const uint8_t *end, int64_t *out) {
  const uint8_t *s = *ps;
  int len = plain_int_length(s, end);
  uint64_t v;
  if (len == 0) return 0;
  if (len <= 8) {
    v = first_digits(load8(s), len);
  } else if (len <= 16) {
    v = eight_value(load8(s)) * POW10_U64[len - 8] + first_digits(load8(s + 8), len - 8);
  } else {
    uint64_t high = eight_value(load8(s)) * 100000000ull + eight_value(load8(s + 8));
    v = high * POW10_U64[len - 16] + first_digits(load8(s + 16), len - 16);
  }
  *ps = s + len;
  *out = (int64_t)v;
  return 1;
}

/* A non-negative decimal at s with 1 to 7 integer digits (no leading zero but a
 * lone one), a point, 1 to 8 fraction digits and no exponent (a record's
 * bandwidths): its mantissa is below 10^15, an exact double, so one division
 * gives what number_double gives. Returns 0 (moving nothing) for anything else. */
static inline int fast_decimal(const uint8_t **ps, const uint8_t *end, double *out) {
  const uint8_t *s = *ps;
  if (end - s < 25) return 0;
  uint64_t w0 = load8(s), m0 = non_digits(w0);
  if (!m0) return 0;
  int il = __builtin_ctzll(m0) >> 3;
  if (il == 0 || s[il] != '.' || (s[0] == '0' && il > 1)) return 0;
  uint64_t w1 = load8(s + il + 1), m1 = non_digits(w1);
  int fl = m1 ? __builtin_ctzll(m1) >> 3 : 8;
  uint8_t next = s[il + 1 + fl];
  if (fl == 0 || is_digit(next) || next == 'e' || next == 'E') return 0;
  uint64_t mant = first_digits(w0, il) * POW10_U64[fl] + first_digits(w1, fl);
  *out = (double)mant / POW10[fl];
  *ps = s + il + 1 + fl;
  return 1;
}

/* -------------------------------------------------------------- skip a value */

/* An object key and its colon: `"key"` then `:`, whitespace skipped after both;
 * *ps is left at the value. */
static inline int scan_key(rwp_parser *p, const uint8_t **ps, const uint8_t *end,
                           const uint8_t **key, size_t *klen) {
  const uint8_t *s = *ps;
  if (s >= end || *s != '"') return RWP_E_SYNTAX;
  s++;
  int rc = scan_string(p, &s, end, key, klen);
  if (rc) return rc;
  s = skip_ws(s, end);
  if (s >= end || *s != ':') return RWP_E_SYNTAX;
  *ps = skip_ws(s + 1, end);
  return RWP_OK;
}

static int skip_value(rwp_parser *p, const uint8_t **ps, const uint8_t *end, int depth);

static int skip_container(rwp_parser *p, const uint8_t **ps, const uint8_t *end, int depth,
                          uint8_t close) {
  const uint8_t *s = skip_ws(*ps, end);
  if (depth > RWP_MAX_DEPTH) return RWP_E_DEPTH;
  if (s < end && *s == close) {
    *ps = s + 1;
    return RWP_OK;
  }
  for (;;) {
    if (close == '}') {
      const uint8_t *key;
      size_t klen;
      int rc = scan_key(p, &s, end, &key, &klen);
      if (rc) return rc;
    }
    int rc = skip_value(p, &s, end, depth);
    if (rc) return rc;
    s = skip_ws(s, end);
    if (s >= end) return RWP_E_SYNTAX;
    if (*s == ',') {
      s = skip_ws(s + 1, end);
      continue;
    }
    if (*s == close) {
      *ps = s + 1;
      return RWP_OK;
    }
    return RWP_E_SYNTAX;
  }
}

static inline int literal(const uint8_t **ps, const uint8_t *end, const char *word, size_t n) {
  if ((size_t)(end - *ps) < n) return RWP_E_SYNTAX;
  uint32_t a, b;
  memcpy(&a, *ps, 4);
  memcpy(&b, word, 4);
  if (a != b || (n == 5 && (*ps)[4] != (uint8_t)word[4])) return RWP_E_SYNTAX;
  *ps += n;
  return RWP_OK;
}

static int skip_value(rwp_parser *p, const uint8_t **ps, const uint8_t *end, int depth) {
  const uint8_t *s = *ps;
  if (s >= end) return RWP_E_SYNTAX;
  int rc;
  switch (*s) {
    case '"': {
      const uint8_t *text;
      size_t len;
      s++;
      rc = scan_string(p, &s, end, &text, &len);
      break;
    }
    case '{':
      s++;
      rc = skip_container(p, &s, end, depth + 1, '}');
      break;
    case '[':
      s++;
      rc = skip_container(p, &s, end, depth + 1, ']');
      break;
    case 't': rc = literal(&s, end, "true", 4); break;
    case 'f': rc = literal(&s, end, "false", 5); break;
    case 'n': rc = literal(&s, end, "null", 4); break;
    default: {
      number_t n;
      rc = scan_number(&s, end, &n);
    }
  }
  *ps = s;
  return rc;
}

/* ------------------------------------------------------------- typed values */

static inline int bit_at(const uint8_t *bits, int64_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }
static inline void set_bit(uint8_t *bits, int64_t i) { bits[i >> 3] |= (uint8_t)(1u << (i & 7)); }
static inline void clear_bit(uint8_t *bits, int64_t i) {
  bits[i >> 3] &= (uint8_t)~(1u << (i & 7));
}

/* Parse the value of a known field; returns 1 in *given when it is not null. */
static inline __attribute__((always_inline)) int field_value(rwp_parser *p, char type, int slot,
                                                           const uint8_t **ps,
                                                           const uint8_t *end, int *given) {
  const uint8_t *s = *ps;
  int64_t row = p->rows;
  *given = 0;
  if (s >= end) return RWP_E_SYNTAX;
  if (*s == 'n') {
    int rc = literal(ps, end, "null", 4);
    return rc;
  }
  switch (type) {
    case 'i':
    case 'n': {
      if (*s != '-' && !is_digit(*s)) return RWP_E_TYPE;
      int skip = slot < 0 && type == 'i' ? plain_int_length(s, end) : 0;
      if (skip) {
        s += skip;
        break;
      }
      int64_t v;
      if (!fast_int(&s, end, &v)) {
        number_t n;
        int rc = scan_number(&s, end, &n);
        if (rc) return rc;
        if (!n.is_int) return RWP_E_TYPE;
        if ((rc = number_int(&n, &v))) return rc;
      }
      if (type == 'n' && (v < INT32_MIN || v > INT32_MAX)) return RWP_E_RANGE;
      if (slot >= 0) ((int64_t *)p->values[slot])[row] = v;
      break;
    }
    case 'f': {
      if (*s != '-' && !is_digit(*s)) return RWP_E_TYPE;
      double d;
      if (fast_decimal(&s, end, &d)) {
        if (slot >= 0) ((double *)p->values[slot])[row] = d;
        break;
      }
      number_t n;
      int rc = scan_number(&s, end, &n);
      if (rc) return rc;
      double v;
      if (n.is_int) {
        int64_t iv;
        if (number_int(&n, &iv) == RWP_OK) {
          v = (double)iv;
        } else if ((rc = number_double(p, &n, &v))) {
          return rc;
        }
      } else if ((rc = number_double(p, &n, &v))) {
        return rc;
      }
      if (slot >= 0) ((double *)p->values[slot])[row] = v;
      break;
    }
    case 'b': {
      int v;
      if (*s == 't') {
        if (literal(&s, end, "true", 4)) return RWP_E_SYNTAX;
        v = 1;
      } else if (*s == 'f') {
        if (literal(&s, end, "false", 5)) return RWP_E_SYNTAX;
        v = 0;
      } else {
        return RWP_E_TYPE;
      }
      if (slot >= 0) {
        if (v) set_bit(p->values[slot], row);
        else clear_bit(p->values[slot], row);
      }
      break;
    }
    case 's': {
      if (*s != '"') return RWP_E_TYPE;
      s++;
      if (slot >= 0 && p->last_code[slot] >= 0) {
        /* most records repeat the previous record's value: match its text */
        int32_t last = p->last_code[slot];
        size_t len;
        const char *have = str_at(p, last, &len);
        if ((p->str_pos[last] & PLAIN_BIT) && quoted_is(s, end, have, len)) {
          ((int32_t *)p->values[slot])[row] = last;
          s += len + 1;
          break;
        }
      }
      const uint8_t *text;
      size_t len;
      int rc = scan_string(p, &s, end, &text, &len);
      if (rc) return rc;
      if (slot >= 0) {
        int32_t code = intern(p, slot, text, len);
        if (code < 0) return RWP_E_STRINGS;
        ((int32_t *)p->values[slot])[row] = code;
      }
      break;
    }
    case 'r': {
      const uint8_t *text = s;
      int rc = skip_value(p, &s, end, 2);
      if (rc) return rc;
      /* JSON allows newlines between tokens, and a template match reads up to the
       * buffer's end: a raw value must not run past its line */
      size_t len = (size_t)(s - text);
      if (memchr(text, '\n', len)) return RWP_E_SYNTAX;
      if (slot >= 0) {
        int32_t code = intern(p, slot, text, len);
        if (code < 0) return RWP_E_STRINGS;
        ((int32_t *)p->values[slot])[row] = code;
      }
      break;
    }
    default:
      return RWP_E_TYPE;
  }
  *ps = s;
  *given = 1;
  return RWP_OK;
}

static inline int find_field(const group_t *g, int guess, const uint8_t *key, size_t len) {
  if (guess < g->nfields && g->fields[guess].len == len &&
      memcmp(g->fields[guess].name, key, len) == 0)
    return guess;
  for (int i = 0; i < g->nfields; i++) {
    if (g->fields[i].len == len && memcmp(g->fields[i].name, key, len) == 0) return i;
  }
  return -1;
}

/* Whether the text at s starts with the field's `"key":` (needs 8 * words bytes). */
static inline int key_at(const uint8_t *s, const uint8_t *end, const field_t *f) {
  int n = f->words;
  if (end - s < 8 * n) return 0;
  uint64_t diff = 0;
  for (int w = 0; w < n - 1; w++) diff |= load8(s + 8 * w) ^ f->pattern[w];
  diff |= (load8(s + 8 * (n - 1)) ^ f->pattern[n - 1]) & f->last_mask;
  return diff == 0;
}

/* The value of field fi of group gi at *ps: checked for a duplicate key, stored,
 * and its place recorded for a template of the line. */
static inline __attribute__((always_inline)) int member_value(rwp_parser *p, int gi, int fi,
                                                            const uint8_t **ps,
                                                            const uint8_t *end) {
  const group_t *g = &p->groups[gi];
  uint64_t bit = 1ull << fi;
  if (p->seen[gi] & bit) return RWP_E_DUPLICATE;
  p->seen[gi] |= bit;
  int given, rc;
  const uint8_t *value = *ps;
  if ((rc = field_value(p, g->fields[fi].type, g->field_slot[fi], ps, end, &given))) return rc;
  if (given) p->given[gi] |= bit;
  if (p->nspans < MAX_SPANS) {
    p->spans[p->nspans++] = (span_t){value, *ps, (int16_t)gi, (int16_t)fi};
  } else {
    p->spans_ok = 0;
  }
  return RWP_OK;
}

/* The members of a group object; (*ps)[-1] is its '{'. */
static int parse_group(rwp_parser *p, int gi, const uint8_t **ps, const uint8_t *end) {
  group_t *g = &p->groups[gi];
  const uint8_t *s = skip_ws(*ps, end);
  int guess = 0;
  if (s < end && *s == '}') {
    *ps = s + 1;
    return RWP_OK;
  }
  for (;;) {
    int fi, rc;
    if (guess < g->nfields && key_at(s, end, &g->fields[guess])) {
      /* keys mostly come in the order the plugin writes them: the quotes, the
       * key and the colon match the expected field's in one go */
      fi = guess;
      s += g->fields[guess].len + 3;
    } else {
      const uint8_t *key;
      size_t klen;
      if ((rc = scan_key(p, &s, end, &key, &klen))) return rc;
      fi = find_field(g, guess, key, klen);
    }
    s = skip_ws(s, end);
    if (fi >= 0) {
      if ((rc = member_value(p, gi, fi, &s, end))) return rc;
      guess = fi + 1;
    } else {
      p->spans_ok = 0;
      if ((rc = skip_value(p, &s, end, 2))) return rc;
    }
    if (s < end && *s == ',') {
      s++;
      if (s < end && *s == '"') continue;
      s = skip_ws(s, end);
      continue;
    }
    s = skip_ws(s, end);
    if (s >= end) return RWP_E_SYNTAX;
    if (*s == ',') {
      s = skip_ws(s + 1, end);
      continue;
    }
    if (*s == '}') {
      *ps = s + 1;
      return RWP_OK;
    }
    return RWP_E_SYNTAX;
  }
}

static int find_top(const rwp_parser *p, const uint8_t *key, size_t len) {
  for (int i = 0; i < p->ntop; i++) {
    if (p->top[i].len == len && memcmp(p->top[i].name, key, len) == 0) return i;
  }
  return -1;
}

/* One line [s, end) that is not blank. */
static int parse_line(rwp_parser *p, const uint8_t *s, const uint8_t *end) {
  memset(p->seen, 0, sizeof(uint64_t) * (size_t)p->ngroups);
  memset(p->given, 0, sizeof(uint64_t) * (size_t)p->ngroups);
  p->top_seen = 0;
  p->groups_present = p->root >= 0 ? 1u << p->root : 0;
  p->nspans = 0;
  p->spans_ok = 1;
  if (*s != '{') {
    const uint8_t *v = s;
    int rc = skip_value(p, &v, end, 0);
    if (rc) return rc;
    return skip_ws(v, end) == end ? RWP_E_NOT_OBJECT : RWP_E_SYNTAX;
  }
  s = skip_ws(s + 1, end);
  int root_guess = 0;
  if (s < end && *s == '}') {
    s++;
  } else {
    for (;;) {
      const uint8_t *key;
      size_t klen;
      int rc = scan_key(p, &s, end, &key, &klen);
      if (rc) return rc;
      if (s >= end) return RWP_E_SYNTAX;
      int fi = p->root >= 0 ? find_field(&p->groups[p->root], root_guess, key, klen) : -1;
      int ti = fi < 0 ? find_top(p, key, klen) : -1;
      if (fi >= 0) {
        if ((rc = member_value(p, p->root, fi, &s, end))) return rc;
        root_guess = fi + 1;
      } else if (ti >= 0) {
        if (p->top_seen & (1u << ti)) return RWP_E_DUPLICATE;
        p->top_seen |= 1u << ti;
        int gi = p->top[ti].group;
        if (*s == 'n') {
          if ((rc = literal(&s, end, "null", 4))) return rc;
        } else if (gi < 0) {
          return RWP_E_REJECTED;
        } else if (*s == '{') {
          s++;
          if ((rc = parse_group(p, gi, &s, end))) return rc;
          p->groups_present |= 1u << gi;
        } else {
          return RWP_E_TYPE;
        }
      } else {
        p->spans_ok = 0;
        if ((rc = skip_value(p, &s, end, 1))) return rc;
      }
      s = skip_ws(s, end);
      if (s >= end) return RWP_E_SYNTAX;
      if (*s == ',') {
        s = skip_ws(s + 1, end);
        continue;
      }
      if (*s == '}') {
        s++;
        break;
      }
      return RWP_E_SYNTAX;
    }
  }
  return skip_ws(s, end) == end ? RWP_OK : RWP_E_SYNTAX;
}

/* Set (on) or clear bits [from, to) of an LSB-first bitmap. */
static void fill_range(uint8_t *bits, int64_t from, int64_t to, int on) {
  if (from >= to) return;
  int64_t first = from >> 3, last = (to - 1) >> 3;
  uint8_t head = (uint8_t)(0xFFu << (from & 7));
  uint8_t tail = (uint8_t)(0xFFu >> (7 - ((to - 1) & 7)));
  if (first == last) head &= tail;
  bits[first] = on ? bits[first] | head : bits[first] & (uint8_t)~head;
  if (first == last) return;
  if (last > first + 1) memset(bits + first + 1, on ? 0xFF : 0, (size_t)(last - first - 1));
  bits[last] = on ? bits[last] | tail : bits[last] & (uint8_t)~tail;
}

/* Mark which slots of the pending run's rows have values (see run_start). */
static void flush_run(rwp_parser *p) {
  int64_t from = p->run_start, to = p->rows;
  p->run_start = to;
  if (from >= to) return;
  for (int gi = 0; gi < p->ngroups; gi++) {
    const group_t *g = &p->groups[gi];
    if (!(p->run_present & (1u << gi))) continue;
    if (g->slot >= 0) fill_range(p->valid[g->slot], from, to, 1);
    uint64_t given = p->run_given[gi];
    while (given) {
      int fi = __builtin_ctzll(given);
      given &= given - 1;
      int slot = g->field_slot[fi];
      if (slot >= 0) fill_range(p->valid[slot], from, to, 1);
    }
  }
}

/* The line was accepted: row `rows` has the values given. Its valid bits are set
 * with those of the rows around it that have the same slots (flush_run): setting
 * a bit per value and row took a fifth of the parsing. */
static void commit_row(rwp_parser *p) {
  int same = p->groups_present == p->run_present;
  for (int gi = 0; gi < p->ngroups; gi++) same &= p->given[gi] == p->run_given[gi];
  if (!same) {
    flush_run(p);
    memcpy(p->run_given, p->given, sizeof(uint64_t) * (size_t)p->ngroups);
    p->run_present = p->groups_present;
  }
  p->rows++;
}

static void flag(rwp_parser *p, int code) {
  if (p->nflags < RWP_MAX_FLAGS) {
    p->flag_line[p->nflags] = p->lines;
    p->flag_code[p->nflags] = code;
    p->nflags++;
  }
  p->flagged++;
}

/* Whether the text at s (inside [s, end)) starts with the segment's constant
 * text: a text of up to SHORT_TEXT bytes, with that much to read at s, as masked
 * words without a loop or early exit (segment lengths vary, and a loop over them
 * mispredicts; the masks are the segment's, computed once: computing them here
 * measured about 5 % slower), a longer one word by word. */
static inline int segment_at(const uint8_t *s, const uint8_t *end, const uint8_t *text,
                             const segment_t *seg) {
  if (seg->len <= SHORT_TEXT && end - s >= SHORT_TEXT) {
    uint64_t diff = 0;
    for (int w = 0; w < SHORT_WORDS; w++)
      diff |= (load8(s + 8 * w) ^ load8(text + 8 * w)) & seg->mask[w];
    return diff == 0;
  }
  return (size_t)(end - s) >= seg->len && memcmp(s, text, seg->len) == 0;
}

/* Write the folded values of the pending template's rows (see fixed_start): a
 * column at a time over the run, where writing each row's two dozen folded values
 * as it matched took a twelfth of the parsing. */
static void flush_fixed(rwp_parser *p) {
  int64_t from = p->fixed_start, to = p->rows;
  int which = p->fixed_template;
  p->fixed_start = to;
  p->fixed_template = -1;
  if (which < 0 || from >= to) return;
  const template_t *t = &p->templates[which];
  for (int k = 0; k < t->nfixed; k++) {
    const fixed_t *f = &t->fixed[k];
    switch (f->type) {
      case 'i':
      case 'n':
      case 'f': {
        int64_t *out = (int64_t *)p->values[f->slot];
        for (int64_t r = from; r < to; r++) out[r] = f->value;
        break;
      }
      case 's':
      case 'r': {
        int32_t *out = (int32_t *)p->values[f->slot];
        for (int64_t r = from; r < to; r++) out[r] = (int32_t)f->value;
        break;
      }
      default: /* b */
        fill_range(p->values[f->slot], from, to, f->value != 0);
    }
  }
}

/* Parse a record starting at s by template t, reading no further than end; where
 * the record ends, or NULL when it does not follow the template (nothing is
 * committed then, and the line goes through parse_line). No part of a template
 * (its constant text, a number, a literal, a string, which may not hold a raw
 * control character) matches a newline, so a match never runs past its line. */
static const uint8_t *parse_by_template(rwp_parser *p, const template_t *t, const uint8_t *s,
                                        const uint8_t *end) {
  memcpy(p->given, t->fixed_given, sizeof(uint64_t) * (size_t)p->ngroups);
  for (int i = 0; i < t->nseg; i++) {
    const segment_t *seg = &t->seg[i];
    if (!segment_at(s, end, t->text + seg->off, seg)) return NULL;
    s += seg->len;
    if (seg->group < 0) break;
    int given;
    if (field_value(p, seg->type, seg->slot, &s, end, &given)) return NULL;
    if (given) p->given[seg->group] |= 1ull << seg->field;
  }
  int which = (int)(t - p->templates);
  if (which != p->fixed_template) {
    flush_fixed(p);
    p->fixed_template = which;
  }
  p->groups_present = t->groups_present;
  return s;
}

/* Make a template of the line [s, end) just parsed (its spans are recorded, its row
 * committed): the values of fields that do not vary folded into its text. */
static void remember_layout(rwp_parser *p, const uint8_t *s, const uint8_t *end) {
  if (!p->spans_ok) return;
  template_t *t = &p->templates[p->next_template];
  size_t need = (size_t)(end - s) + SHORT_TEXT;
  if (need > t->cap) {
    uint8_t *text = realloc(t->text, need);
    if (!text) return;
    t->text = text;
    t->cap = need;
  }
  size_t used = 0, seg_start = 0;
  const uint8_t *at = s;
  int n = 0;
  int64_t row = p->rows - 1; /* the line's row, committed */
  t->nfixed = t->nfolded = 0;
  memset(t->fixed_given, 0, sizeof t->fixed_given);
  for (int i = 0; i <= p->nspans; i++) {
    const uint8_t *stop = i < p->nspans ? p->spans[i].start : end;
    int fold = 0;
    if (i < p->nspans) {
      const span_t *sp = &p->spans[i];
      fold = !((p->varies[sp->group] >> sp->field) & 1);
      if (fold) { /* the value's text joins the constant text; its value is kept */
        const field_t *f = &p->groups[sp->group].fields[sp->field];
        uint64_t bit = 1ull << sp->field;
        folded_t *where = &t->folded[t->nfolded++];
        where->off = (uint32_t)(used + (size_t)(sp->start - at));
        where->len = (uint32_t)(sp->end - sp->start);
        where->group = sp->group;
        where->field = sp->field;
        stop = sp->end;
        if (p->given[sp->group] & bit) {
          t->fixed_given[sp->group] |= bit;
          if (f->slot >= 0) {
            fixed_t *x = &t->fixed[t->nfixed++];
            x->slot = (int16_t)f->slot;
            x->type = f->type;
            if (f->type == 's' || f->type == 'r') {
              x->value = ((const int32_t *)p->values[f->slot])[row];
            } else if (f->type == 'b') {
              x->value = bit_at(p->values[f->slot], row);
            } else {
              x->value = ((const int64_t *)p->values[f->slot])[row];
            }
          }
        }
      }
    }
    size_t len = (size_t)(stop - at);
    memcpy(t->text + used, at, len);
    used += len;
    at = stop;
    if (fold) continue;
    size_t seg_len = used - seg_start;
    t->seg[n].off = (uint32_t)seg_start;
    t->seg[n].len = (uint32_t)seg_len;
    for (int w = 0; w < SHORT_WORDS; w++) t->seg[n].mask[w] = word_mask(seg_len, w);
    t->seg[n].group = i < p->nspans ? p->spans[i].group : -1;
    t->seg[n].field = i < p->nspans ? p->spans[i].field : -1;
    if (i < p->nspans) {
      const field_t *f = &p->groups[p->spans[i].group].fields[p->spans[i].field];
      t->seg[n].slot = (int16_t)f->slot;
      t->seg[n].type = f->type;
      at = p->spans[i].end;
    }
    seg_start = used;
    n++;
  }
  memset(t->text + used, 0, SHORT_TEXT);
  t->nseg = n;
  t->groups_present = p->groups_present;
  p->last_template = p->next_template;
  p->next_template = (p->next_template + 1) % MAX_TEMPLATES;
  if (p->ntemplates < MAX_TEMPLATES) p->ntemplates++;
}

/* The line just parsed (its spans recorded) matched no template: each field a
 * template folded whose value the line has with another text varies. Every miss
 * marks a field or adds a layout, so a file settles after a few misses. */
static void learn_varying(rwp_parser *p) {
  if (!p->ntemplates) return;
  for (int i = 0; i < p->nspans; i++)
    p->span_of[p->spans[i].group][p->spans[i].field] = (int16_t)(i + 1);
  for (int k = 0; k < p->ntemplates; k++) {
    const template_t *t = &p->templates[k];
    for (int j = 0; j < t->nfolded; j++) {
      const folded_t *f = &t->folded[j];
      int i = p->span_of[f->group][f->field] - 1;
      if (i < 0) continue; /* the line has no such field */
      const span_t *sp = &p->spans[i];
      size_t len = (size_t)(sp->end - sp->start);
      if (len != f->len || memcmp(sp->start, t->text + f->off, len) != 0)
        p->varies[f->group] |= 1ull << f->field;
    }
  }
  for (int i = 0; i < p->nspans; i++) p->span_of[p->spans[i].group][p->spans[i].field] = 0;
}

/* Where a record at s that follows a known template ends, or NULL. */
static const uint8_t *parse_known_layout(rwp_parser *p, const uint8_t *s, const uint8_t *end) {
  for (int k = 0; k < p->ntemplates; k++) {
    int i = (p->last_template + k) % p->ntemplates;
    const uint8_t *after = parse_by_template(p, &p->templates[i], s, end);
    if (after) {
      p->last_template = i;
      return after;
    }
  }
  return NULL;
}

static inline int is_blank(uint8_t c) { return c == ' ' || c == '\t' || c == '\r'; }

/* The usual line: a record of a known layout, then a newline. Parsed without
 * finding the newline first (a scan of every byte); returns where the next line
 * starts, or NULL for any other line, which the caller reads the careful way. */
static const uint8_t *known_line(rwp_parser *p, const uint8_t *s, const uint8_t *end) {
  while (s < end && is_blank(*s)) s++;
  if (s >= end || *s == '\n' || !p->ntemplates) return NULL;
  const uint8_t *after = parse_known_layout(p, s, end);
  if (!after) return NULL;
  while (after < end && is_blank(*after)) after++;
  return after < end && *after == '\n' ? after + 1 : NULL;
}

int64_t rwp_parse(rwp_parser *p, const char *buf, int64_t len, int final) {
  const uint8_t *s = (const uint8_t *)buf, *end = s + (len > 0 ? len : 0);
  if (!p->cap) return 0;
  while (s < end && p->rows < p->cap) {
    const uint8_t *next = known_line(p, s, end);
    if (next) {
      p->lines++;
      commit_row(p);
      s = next;
      continue;
    }
    const uint8_t *nl = memchr(s, '\n', (size_t)(end - s));
    const uint8_t *line_end = nl ? nl : end;
    if (!nl && !final) break;
    p->lines++;
    if (!nl) p->unterminated = p->lines;
    const uint8_t *first = skip_ws(s, line_end);
    if (first < line_end) {
      const uint8_t *after = parse_known_layout(p, first, line_end);
      if (after && skip_ws(after, line_end) == line_end) {
        commit_row(p);
      } else {
        int rc = parse_line(p, first, line_end);
        if (rc == RWP_OK) {
          flush_fixed(p); /* this row has its own values */
          commit_row(p);
          learn_varying(p);
          remember_layout(p, first, line_end);
        } else {
          flag(p, rc);
        }
      }
    }
    s = nl ? nl + 1 : end;
  }
  flush_run(p); /* the caller reads the values and valid bits next */
  flush_fixed(p);
  return (int64_t)(s - (const uint8_t *)buf);
}

/* ---------------------------------------------------------------- set-up */

static int read_word(const char **ps, char *out, size_t cap) {
  const char *s = *ps;
  while (*s == ' ' || *s == '\t') s++;
  size_t n = 0;
  while (*s && *s != ' ' && *s != '\t' && *s != '\n') {
    if (n + 1 >= cap) return 0;
    out[n++] = *s++;
  }
  out[n] = '\0';
  *ps = s;
  return n > 0;
}

static int parse_int_word(const char *w, int *out) {
  char *stop;
  long v = strtol(w, &stop, 10);
  if (*stop || v < -1 || v >= MAX_SLOTS) return 0;
  *out = (int)v;
  return 1;
}

static int use_slot(rwp_parser *p, int slot, char type) {
  if (slot < 0) return 1;
  if (p->slot_type[slot]) return 0; /* each slot holds one column */
  p->slot_type[slot] = type;
  if (slot + 1 > p->nslots) p->nslots = slot + 1;
  return 1;
}

static int spec_line(rwp_parser *p, const char **ps, char *err, int errlen) {
  char verb[16], name[MAX_NAME - 8], name2[MAX_NAME - 8], type[4], slot_word[16];
  int slot;
  if (!read_word(ps, verb, sizeof verb)) return 1; /* empty line */
  if (strcmp(verb, "group") == 0) {
    if (!read_word(ps, name, sizeof name) || !read_word(ps, slot_word, sizeof slot_word) ||
        !parse_int_word(slot_word, &slot))
      goto bad;
    if (p->ntop >= MAX_TOP || p->ngroups >= MAX_GROUPS || !use_slot(p, slot, 'g')) goto bad;
    group_t *g = &p->groups[p->ngroups];
    snprintf(g->name, sizeof g->name, "%s", name);
    g->len = (uint32_t)strlen(name);
    g->slot = slot;
    top_t *t = &p->top[p->ntop++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->len = g->len;
    t->group = p->ngroups++;
    return 1;
  }
  if (strcmp(verb, "reject") == 0) {
    if (!read_word(ps, name, sizeof name) || p->ntop >= MAX_TOP) goto bad;
    top_t *t = &p->top[p->ntop++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->len = (uint32_t)strlen(name);
    t->group = -1;
    return 1;
  }
  if (strcmp(verb, "field") == 0) {
    if (!read_word(ps, name, sizeof name) || !read_word(ps, name2, sizeof name2) ||
        !read_word(ps, type, sizeof type) || !read_word(ps, slot_word, sizeof slot_word) ||
        !parse_int_word(slot_word, &slot) || strlen(type) != 1 || !strchr("inbfsr", type[0]))
      goto bad;
    int gi = -1;
    for (int i = 0; i < p->ngroups; i++) {
      if (strcmp(p->groups[i].name, name) == 0) gi = i;
    }
    if (gi < 0 && strcmp(name, ".") == 0 && p->ngroups < MAX_GROUPS) {
      /* the first top-level field: its group is the line's object itself */
      gi = p->root = p->ngroups++;
      group_t *g = &p->groups[gi];
      snprintf(g->name, sizeof g->name, ".");
      g->len = 1;
      g->slot = -1;
    }
    if (gi < 0 || p->groups[gi].nfields >= MAX_FIELDS || !use_slot(p, slot, type[0])) goto bad;
    field_t *f = &p->groups[gi].fields[p->groups[gi].nfields++];
    snprintf(f->name, sizeof f->name, "%s\":", name2);
    f->len = (uint32_t)strlen(name2);
    size_t plen = f->len + 3; /* quote, key, quote, colon */
    uint8_t text[MAX_NAME + 16] = {0};
    text[0] = '"';
    memcpy(text + 1, f->name, f->len + 2);
    f->words = (int)((plen + 7) / 8);
    for (int w = 0; w < f->words; w++) memcpy(&f->pattern[w], text + 8 * w, 8);
    size_t rest = plen - 8 * (size_t)(f->words - 1);
    f->last_mask = rest == 8 ? ~0ull : (1ull << (8 * rest)) - 1;
    f->type = type[0];
    f->slot = slot;
    p->groups[gi].field_slot[p->groups[gi].nfields - 1] = (int16_t)slot;
    return 1;
  }
bad:
  snprintf(err, (size_t)errlen, "bad spec line starting with '%s'", verb);
  return 0;
}

/* What the constructors share: *err becomes `dummy` (one byte) when the caller gave
 * no buffer, and is cleared; a zeroed object of `size` bytes, or NULL with "out of
 * memory" in *err. */
static void *new_zeroed(size_t size, char **err, int *errlen, char *dummy) {
  if (!*err || *errlen <= 0) {
    *err = dummy;
    *errlen = 1;
  }
  (*err)[0] = '\0';
  void *object = calloc(1, size);
  if (!object) snprintf(*err, (size_t)*errlen, "out of memory");
  return object;
}

/* No rows in the bound buffers: nothing pending of a run (flush_run) or of a
 * template's folded values (flush_fixed). */
static void no_rows(rwp_parser *p) {
  p->rows = p->run_start = p->fixed_start = 0;
  p->fixed_template = -1;
}

rwp_parser *rwp_new(const char *spec, char *err, int errlen) {
  char dummy[1];
  rwp_parser *p = new_zeroed(sizeof *p, &err, &errlen, dummy);
  if (!p) return NULL;
  p->root = -1;
  no_rows(p);
  p->c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
  if (!p->c_locale) {
    snprintf(err, (size_t)errlen, "no C locale");
    free(p);
    return NULL;
  }
  const char *s = spec ? spec : "";
  while (*s) {
    if (!spec_line(p, &s, err, errlen)) {
      rwp_free(p);
      return NULL;
    }
    while (*s && *s != '\n') s++;
    if (*s == '\n') s++;
  }
  for (int i = 0; i < p->nslots; i++) {
    if (!p->slot_type[i]) {
      snprintf(err, (size_t)errlen, "slot %d is not used", i);
      rwp_free(p);
      return NULL;
    }
  }
  rwp_reset(p);
  return p;
}

void rwp_free(rwp_parser *p) {
  if (!p) return;
  if (p->c_locale) freelocale(p->c_locale);
  free(p->arena);
  free(p->str_pos);
  free(p->table);
  free(p->scratch);
  for (int i = 0; i < MAX_TEMPLATES; i++) free(p->templates[i].text);
  free(p);
}

void rwp_reset(rwp_parser *p) {
  p->lines = p->flagged = p->unterminated = 0;
  p->nflags = 0;
  p->nstr = 0;
  p->arena_len = 0;
  if (p->table) memset(p->table, 0, p->table_cap * sizeof *p->table);
  for (int i = 0; i < MAX_SLOTS; i++) p->last_code[i] = -1;
  p->cap = 0;
  no_rows(p);
  p->ntemplates = p->last_template = p->next_template = 0;
}

void rwp_next_file(rwp_parser *p) {
  p->lines = p->flagged = p->unterminated = 0;
  p->nflags = 0;
}

int rwp_slot_count(const rwp_parser *p) { return p->nslots; }

int rwp_bind(rwp_parser *p, int64_t capacity, void *const *values, uint8_t *const *valid) {
  if (capacity <= 0) return -1;
  for (int i = 0; i < p->nslots; i++) {
    if (!valid[i] || (p->slot_type[i] != 'g' && !values[i])) return -1;
    p->values[i] = values[i];
    p->valid[i] = valid[i];
  }
  p->cap = capacity;
  no_rows(p);
  return 0;
}

int64_t rwp_rows(const rwp_parser *p) { return p->rows; }
int64_t rwp_lines(const rwp_parser *p) { return p->lines; }
int64_t rwp_flagged(const rwp_parser *p) { return p->flagged; }
int64_t rwp_unterminated_line(const rwp_parser *p) { return p->unterminated; }
int32_t rwp_string_count(const rwp_parser *p) { return p->nstr; }

int rwp_flag(const rwp_parser *p, int i, int64_t *line, int *code) {
  if (i < 0 || i >= p->nflags) return -1;
  *line = p->flag_line[i];
  *code = p->flag_code[i];
  return 0;
}

const char *rwp_string(const rwp_parser *p, int32_t code, int64_t *len) {
  if (code < 0 || code >= p->nstr) {
    *len = 0;
    return NULL;
  }
  size_t n;
  const char *s = str_at(p, code, &n);
  *len = (int64_t)n;
  return s;
}

/* ------------------------------------------------------------ the dictionary */

const char *rwp_strings(const rwp_parser *p, int32_t *offsets, int64_t *len) {
  /* intern() appends each new string to the arena: code order is arena order */
  for (int32_t code = 0; code < p->nstr; code++) {
    offsets[code] = (int32_t)((p->str_pos[code] & ~PLAIN_BIT) >> 24);
  }
  offsets[p->nstr] = (int32_t)p->arena_len;
  *len = (int64_t)p->arena_len;
  return p->arena;
}

/* ---------------------------------------------------------------- nested values */

#define RWN_MAX_NODES 64
#define RWN_MAX_KIDS 32 /* fields of a struct: a 64-bit mask tracks which were seen */

typedef struct {
  char kind; /* i n s S L M */
  int nkids;
  int16_t kid[RWN_MAX_KIDS]; /* S: fields; L: element; M: key, value */
  char name[MAX_NAME];       /* as a field of its parent struct */
  uint32_t name_len;
  int64_t len, cap;          /* values appended; room for */
  uint8_t *valid;            /* cap / 8 bytes, zeroed as grown */
  void *values;              /* i: int64, n: int32 */
  int32_t *offsets;          /* s, L, M: cap + 1 */
  char *data;                /* s */
  int64_t data_len, data_cap;
  /* M: the keys of the object being read, once it has more than RWN_LINEAR_KEYS:
   * an open-addressing table of stamp << 32 | key index within the object (an
   * entry of an older stamp is free), so that a map of thousands of keys is checked
   * for a duplicate in linear time */
  uint64_t *seen;
  uint32_t seen_cap, stamp;
  int seen_built;
} rwn_node_t;

struct rwn_reader {
  rwn_node_t node[RWN_MAX_NODES];
  int nnodes;
};

static int rwn_grow(rwn_node_t *n) {
  /* a list's or map's children are counted by int32 offsets: no more of them (a
   * file whose lines repeat one long list could pass that) */
  if (n->len >= INT32_MAX) return 0;
  if (n->len < n->cap) return 1;
  int64_t cap = n->cap ? n->cap * 2 : 64; /* a multiple of 8: whole bitmap bytes */
  uint8_t *valid = realloc(n->valid, (size_t)cap / 8);
  if (!valid) return 0;
  memset(valid + n->cap / 8, 0, (size_t)(cap - n->cap) / 8);
  n->valid = valid;
  if (n->kind == 'i' || n->kind == 'n') {
    void *values = realloc(n->values, (size_t)cap * (n->kind == 'i' ? 8 : 4));
    if (!values) return 0;
    n->values = values;
  } else if (n->kind == 's' || n->kind == 'L' || n->kind == 'M') {
    int32_t *offsets = realloc(n->offsets, (size_t)(cap + 1) * sizeof *offsets);
    if (!offsets) return 0;
    if (!n->offsets) offsets[0] = 0;
    n->offsets = offsets;
  }
  n->cap = cap;
  return 1;
}

static int rwn_text(rwn_node_t *n, const uint8_t *text, size_t len) {
  if ((uint64_t)n->data_len + len > INT32_MAX) return 0;
  if (n->data_len + (int64_t)len > n->data_cap) {
    int64_t cap = n->data_cap ? n->data_cap : 256;
    while (cap < n->data_len + (int64_t)len) cap *= 2;
    char *data = realloc(n->data, (size_t)cap);
    if (!data) return 0;
    n->data = data;
    n->data_cap = cap;
  }
  if (len) memcpy(n->data + n->data_len, text, len);
  n->data_len += (int64_t)len;
  return 1;
}

/* The next slot of node n: its values and offsets set as for a null (a value is
 * written over them), its validity bit clear. */
static int rwn_slot(rwn_node_t *n) {
  if (!rwn_grow(n)) return 0;
  int64_t i = n->len++;
  if (n->kind == 'i') ((int64_t *)n->values)[i] = 0;
  if (n->kind == 'n') ((int32_t *)n->values)[i] = 0;
  if (n->offsets) n->offsets[i + 1] = n->offsets[i];
  return 1;
}

static int rwn_null(rwn_reader *r, int ni) {
  rwn_node_t *n = &r->node[ni];
  if (!rwn_slot(n)) return RWP_E_STRINGS;
  if (n->kind == 'S') { /* a struct's fields have a slot for each of its rows */
    for (int k = 0; k < n->nkids; k++) {
      int rc = rwn_null(r, n->kid[k]);
      if (rc) return rc;
    }
  }
  return RWP_OK;
}

static int rwn_value(rwn_reader *r, rwp_parser *p, int ni, const uint8_t **ps,
                     const uint8_t *end, int depth);

#define RWN_LINEAR_KEYS 16 /* a map object's keys compared one by one up to this many */

static int key_is(const rwn_node_t *keys, int64_t k, const uint8_t *key, size_t klen) {
  int32_t from = keys->offsets[k], to = keys->offsets[k + 1];
  return (size_t)(to - from) == klen && (klen == 0 || !memcmp(keys->data + from, key, klen));
}

/* Enter key k (appended to `keys`) in map node n's table of this object's keys. */
static void seen_put(rwn_node_t *n, const rwn_node_t *keys, int64_t k, int64_t first) {
  int32_t from = keys->offsets[k];
  size_t len = (size_t)(keys->offsets[k + 1] - from);
  uint32_t mask = n->seen_cap - 1, i = hash_bytes((const uint8_t *)keys->data + from, len) & mask;
  while ((uint32_t)(n->seen[i] >> 32) == n->stamp) i = (i + 1) & mask;
  n->seen[i] = (uint64_t)n->stamp << 32 | (uint32_t)(k - first);
}

/* Room in n's table for `count` keys of this object, which holds the keys
 * first .. keys->len - 1 once this returns 1 (0: out of memory). */
static int seen_room(rwn_node_t *n, const rwn_node_t *keys, int64_t first, int64_t count) {
  if (n->seen_built && (uint64_t)count * 2 <= n->seen_cap) return 1;
  uint32_t cap = n->seen_cap ? n->seen_cap : 64;
  while ((uint64_t)count * 2 > cap) {
    if (cap > (UINT32_MAX >> 2)) return 0;
    cap *= 2;
  }
  if (cap != n->seen_cap) { /* entries placed by the old size: all of them again */
    uint64_t *seen = realloc(n->seen, (size_t)cap * sizeof *seen);
    if (!seen) return 0;
    memset(seen, 0, (size_t)cap * sizeof *seen);
    n->seen = seen;
    n->seen_cap = cap;
  } /* else every entry is of an earlier object's stamp: free, without clearing */
  if (n->stamp == 0) n->stamp = 1;
  for (int64_t k = first; k < keys->len; k++) seen_put(n, keys, k, first);
  n->seen_built = 1;
  return 1;
}

/* Whether `key` is among map node n's keys of this object (first .. keys->len - 1):
 * 1, 0, or -1 when out of memory. */
static int rwn_key_seen(rwn_node_t *n, const rwn_node_t *keys, int64_t first, const uint8_t *key,
                        size_t klen) {
  int64_t count = keys->len - first;
  if (count <= RWN_LINEAR_KEYS) {
    for (int64_t k = first; k < keys->len; k++)
      if (key_is(keys, k, key, klen)) return 1;
    return 0;
  }
  if (!seen_room(n, keys, first, count + 1)) return -1;
  uint32_t mask = n->seen_cap - 1, i = hash_bytes(key, klen) & mask;
  for (; (uint32_t)(n->seen[i] >> 32) == n->stamp; i = (i + 1) & mask)
    if (key_is(keys, first + (int64_t)(uint32_t)n->seen[i], key, klen)) return 1;
  return 0;
}

/* A new object of map node n: its table of keys holds none. */
static void rwn_new_object(rwn_node_t *n) {
  n->seen_built = 0;
  if (++n->stamp == 0 && n->seen) { /* the stamps wrapped: every entry free again */
    memset(n->seen, 0, (size_t)n->seen_cap * sizeof *n->seen);
    n->stamp = 1;
  }
}

static int rwn_object(rwn_reader *r, rwp_parser *p, int ni, const uint8_t **ps,
                      const uint8_t *end, int depth) {
  rwn_node_t *n = &r->node[ni];
  const uint8_t *s = skip_ws(*ps, end);
  uint64_t seen = 0;
  int64_t first_key = n->kind == 'M' ? r->node[n->kid[0]].len : 0;
  if (n->kind == 'M') rwn_new_object(n);
  if (s < end && *s == '}') {
    s++;
  } else {
    for (;;) {
      const uint8_t *key;
      size_t klen;
      int rc = scan_key(p, &s, end, &key, &klen);
      if (rc) return rc;
      if (n->kind == 'M') {
        rwn_node_t *keys = &r->node[n->kid[0]];
        int dup = rwn_key_seen(n, keys, first_key, key, klen); /* a map's keys are unique */
        if (dup) return dup > 0 ? RWP_E_DUPLICATE : RWP_E_STRINGS;
        if (!rwn_slot(keys) || !rwn_text(keys, key, klen)) return RWP_E_STRINGS;
        keys->offsets[keys->len] = (int32_t)keys->data_len;
        keys->valid[(keys->len - 1) >> 3] |= (uint8_t)(1u << ((keys->len - 1) & 7));
        if (n->seen_built) seen_put(n, keys, keys->len - 1, first_key);
        if ((rc = rwn_value(r, p, n->kid[1], &s, end, depth + 1))) return rc;
      } else {
        int k = 0;
        while (k < n->nkids && !(r->node[n->kid[k]].name_len == klen &&
                                 memcmp(r->node[n->kid[k]].name, key, klen) == 0))
          k++;
        if (k < n->nkids) {
          if (seen & (1ull << k)) return RWP_E_DUPLICATE;
          seen |= 1ull << k;
          if ((rc = rwn_value(r, p, n->kid[k], &s, end, depth + 1))) return rc;
        } else if ((rc = skip_value(p, &s, end, depth + 1))) {
          return rc;
        }
      }
      s = skip_ws(s, end);
      if (s < end && *s == ',') {
        s = skip_ws(s + 1, end);
        continue;
      }
      if (s < end && *s == '}') {
        s++;
        break;
      }
      return RWP_E_SYNTAX;
    }
  }
  for (int k = 0; n->kind == 'S' && k < n->nkids; k++) {
    if (!(seen & (1ull << k))) {
      int rc = rwn_null(r, n->kid[k]);
      if (rc) return rc;
    }
  }
  *ps = s;
  return RWP_OK;
}

static int rwn_array(rwn_reader *r, rwp_parser *p, int ni, const uint8_t **ps,
                     const uint8_t *end, int depth) {
  const uint8_t *s = skip_ws(*ps, end);
  if (s < end && *s == ']') {
    *ps = s + 1;
    return RWP_OK;
  }
  for (;;) {
    int rc = rwn_value(r, p, r->node[ni].kid[0], &s, end, depth + 1);
    if (rc) return rc;
    s = skip_ws(s, end);
    if (s < end && *s == ',') {
      s = skip_ws(s + 1, end);
      continue;
    }
    if (s < end && *s == ']') {
      *ps = s + 1;
      return RWP_OK;
    }
    return RWP_E_SYNTAX;
  }
}

/* One value of node ni at *ps (whitespace before it skipped). */
static int rwn_value(rwn_reader *r, rwp_parser *p, int ni, const uint8_t **ps,
                     const uint8_t *end, int depth) {
  rwn_node_t *n = &r->node[ni];
  const uint8_t *s = skip_ws(*ps, end);
  if (depth > RWP_MAX_DEPTH) return RWP_E_DEPTH;
  if (s >= end) return RWP_E_SYNTAX;
  if (*s == 'n') {
    int rc = literal(&s, end, "null", 4);
    if (!rc) rc = rwn_null(r, ni);
    *ps = s;
    return rc;
  }
  if (!rwn_slot(n)) return RWP_E_STRINGS;
  int64_t i = n->len - 1;
  int rc = RWP_OK;
  switch (n->kind) {
    case 'i':
    case 'n': {
      number_t num;
      int64_t v;
      if (*s != '-' && !is_digit(*s)) return RWP_E_TYPE;
      if ((rc = scan_number(&s, end, &num))) return rc;
      if (!num.is_int) return RWP_E_TYPE;
      if ((rc = number_int(&num, &v))) return rc;
      if (n->kind == 'i') {
        ((int64_t *)n->values)[i] = v;
      } else {
        if (v < INT32_MIN || v > INT32_MAX) return RWP_E_RANGE;
        ((int32_t *)n->values)[i] = (int32_t)v;
      }
      break;
    }
    case 's': {
      const uint8_t *text;
      size_t len;
      if (*s != '"') return RWP_E_TYPE;
      s++;
      if ((rc = scan_string(p, &s, end, &text, &len))) return rc;
      if (!rwn_text(n, text, len)) return RWP_E_STRINGS;
      n->offsets[i + 1] = (int32_t)n->data_len;
      break;
    }
    case 'S':
    case 'M':
      if (*s != '{') return RWP_E_TYPE;
      s++;
      if ((rc = rwn_object(r, p, ni, &s, end, depth))) return rc;
      if (n->kind == 'M') n->offsets[i + 1] = (int32_t)r->node[n->kid[0]].len;
      break;
    case 'L':
      if (*s != '[') return RWP_E_TYPE;
      s++;
      if ((rc = rwn_array(r, p, ni, &s, end, depth))) return rc;
      n->offsets[i + 1] = (int32_t)r->node[n->kid[0]].len;
      break;
    default:
      return RWP_E_TYPE;
  }
  n->valid[i >> 3] |= (uint8_t)(1u << (i & 7));
  *ps = s;
  return RWP_OK;
}

/* One node of the spec at *ps and the nodes under it; its index, or -1. */
static int rwn_spec_node(rwn_reader *r, const char **ps, const char *name, int depth) {
  char word[MAX_NAME - 8];
  if (depth > 16 || r->nnodes >= RWN_MAX_NODES || !read_word(ps, word, sizeof word) ||
      strlen(word) != 1 || !strchr("insSLM", word[0]))
    return -1;
  int ni = r->nnodes++;
  rwn_node_t *n = &r->node[ni];
  n->kind = word[0];
  snprintf(n->name, sizeof n->name, "%s", name);
  n->name_len = (uint32_t)strlen(n->name);
  int kids = 0;
  if (n->kind == 'L') kids = 1;
  if (n->kind == 'M') {
    if (r->nnodes >= RWN_MAX_NODES) return -1;
    int key = r->nnodes++;
    r->node[key].kind = 's';
    n->kid[n->nkids++] = (int16_t)key;
    kids = 1;
  }
  if (n->kind == 'S') {
    char count[16];
    if (!read_word(ps, count, sizeof count) || !parse_int_word(count, &kids) || kids < 0 ||
        kids > RWN_MAX_KIDS)
      return -1;
  }
  for (int k = 0; k < kids; k++) {
    char field[MAX_NAME - 8] = "";
    if (n->kind == 'S' && !read_word(ps, field, sizeof field)) return -1;
    int kid = rwn_spec_node(r, ps, field, depth + 1);
    if (kid < 0) return -1;
    r->node[ni].kid[r->node[ni].nkids++] = (int16_t)kid;
  }
  return ni;
}

rwn_reader *rwn_new(const char *spec, char *err, int errlen) {
  char dummy[1];
  rwn_reader *r = new_zeroed(sizeof *r, &err, &errlen, dummy);
  if (!r) return NULL;
  const char *s = spec ? spec : "";
  int bad = rwn_spec_node(r, &s, "", 0) < 0;
  while (*s == ' ' || *s == '\t' || *s == '\n') s++;
  if (bad || *s) { /* a malformed node, or anything after the type */
    snprintf(err, (size_t)errlen, "bad nested type spec");
    rwn_free(r);
    return NULL;
  }
  return r;
}

void rwn_free(rwn_reader *r) {
  if (!r) return;
  for (int i = 0; i < r->nnodes; i++) {
    free(r->node[i].valid);
    free(r->node[i].values);
    free(r->node[i].offsets);
    free(r->node[i].data);
    free(r->node[i].seen);
  }
  free(r);
}

int rwn_node_count(const rwn_reader *r) { return r->nnodes; }

int rwn_read(rwn_reader *r, rwp_parser *p, const int32_t *codes, int64_t count) {
  for (int i = 0; i < r->nnodes; i++) {
    rwn_node_t *n = &r->node[i];
    if (n->valid) memset(n->valid, 0, (size_t)n->cap / 8);
    n->len = n->data_len = 0;
  }
  for (int64_t k = 0; k < count; k++) {
    if (codes[k] < 0) { /* no value */
      int rc = rwn_null(r, 0);
      if (rc) return rc;
      continue;
    }
    if (codes[k] >= p->nstr) return RWP_E_RANGE;
    size_t len;
    const uint8_t *s = (const uint8_t *)str_at(p, codes[k], &len), *end = s + len;
    int rc = rwn_value(r, p, 0, &s, end, 1);
    if (rc) return rc;
    if (skip_ws(s, end) != end) return RWP_E_SYNTAX;
  }
  return RWP_OK;
}

int64_t rwn_node(const rwn_reader *r, int i, const uint8_t **valid, const void **values,
                 const int32_t **offsets, const char **data, int64_t *data_len) {
  if (i < 0 || i >= r->nnodes) return -1;
  const rwn_node_t *n = &r->node[i];
  *valid = n->valid;
  *values = n->values;
  *offsets = n->offsets;
  *data = n->data;
  *data_len = n->data_len;
  return n->len;
}

/* ------------------------------------------------------------------ capture */

/* The collective rows of one chunk of the native reader (rankwatch.store.captured):
 * `values` and `valid` hold the chunk's columns named by RW_C_* (int32 string codes,
 * int64 numbers, bitmaps for `complete`; LSB-first validity bitmaps). Rows whose
 * kind code is `coll` are written in order: their row number, function code mapped
 * through func_remap (n_local codes), seq, the five nullable numbers (0 where NULL)
 * and validity bits (RW_V_*). When every such row's member fits 64 bits (codes
 * below 2^12, rank and n_ranks + 1 below 2^20, a valid n_ranks not negative),
 * out_key holds each row's member packed but for its process (rwkept.h: RW_KEY_*;
 * equal keys of one process, equal members) and out_proc its process: the (host,
 * pid) pairs numbered in the order they first appear (up to RW_MAX_PROCS), and
 * *packed is set to 1 when all rows are of one process, 2 when of several (a unit
 * of files read as one chunk); else *packed is 0. Returns the number of rows
 * written, or -1 for a function code out of range. */
int64_t rwp_capture(int64_t rows, const void *const *values, const uint8_t *const *valid,
                    int32_t coll, const int32_t *func_remap, int64_t n_local, int32_t *out_row,
                    int32_t *out_func, int64_t *out_seq, int64_t *const *out_values,
                    uint8_t *out_valid, uint64_t *out_key, int32_t *out_proc,
                    int64_t *packed) {
  if (rows < 0 || n_local < 0) return -1;
  /* the processes seen: rows come file by file, so the last one found is tried first */
  int32_t proc_host[RW_MAX_PROCS];
  int64_t proc_pid[RW_MAX_PROCS];
  int32_t procs = 0, last = -1;
  const int32_t *kind = values[RW_C_KIND], *func = values[RW_C_FUNC];
  const int32_t *cid = values[RW_C_COMM_ID], *cname = values[RW_C_COMM_NAME];
  const int32_t *host = values[RW_C_HOST];
  const int64_t *seq = values[RW_C_SEQ], *rank = values[RW_C_RANK];
  const int64_t *n_ranks = values[RW_C_N_RANKS], *pid = values[RW_C_PID];
  const uint8_t *done = values[RW_C_COMPLETE];
  const int cols[5] = {RW_C_MSG, RW_C_ARRIVAL, RW_C_GPU_START, RW_C_GPU_END,
                       RW_C_CLOCK_ERROR};
  const uint8_t bits[5] = {RW_V_MSG, RW_V_ARRIVAL, RW_V_GPU_START, RW_V_GPU_END,
                           RW_V_CLOCK_ERROR};
  const int64_t code_top = (int64_t)1 << RW_KEY_CODE_BITS;
  const int64_t int_top = (int64_t)1 << RW_KEY_INT_BITS;
  int fits = 1;
  int64_t k = 0;
  for (int64_t i = 0; i < rows; i++) {
    if (kind[i] != coll) continue;
    int32_t f = func[i];
    if (f < 0 || f >= n_local) return -1;
    out_row[k] = (int32_t)i;
    out_func[k] = func_remap[f];
    out_seq[k] = seq[i];
    uint8_t v = 0;
    for (int c = 0; c < 5; c++) {
      int ok = bit_at(valid[cols[c]], i);
      out_values[c][k] = ok ? ((const int64_t *)values[cols[c]])[i] : 0;
      if (ok) v |= bits[c];
    }
    if (bit_at(valid[RW_C_COMPLETE], i) && !bit_at(done, i)) v |= RW_V_INCOMPLETE;
    out_valid[k] = v;
    int64_t name = bit_at(valid[RW_C_COMM_NAME], i) ? cname[i] : -1;
    int size_ok = bit_at(valid[RW_C_N_RANKS], i);
    int64_t size = size_ok ? n_ranks[i] : -1;
    if (size_ok && size < 0) fits = 0; /* -1 would read as NULL */
    if (fits && (last < 0 || proc_host[last] != host[i] || proc_pid[last] != pid[i])) {
      last = 0;
      while (last < procs && (proc_host[last] != host[i] || proc_pid[last] != pid[i])) last++;
      if (last == procs) {
        if (procs == RW_MAX_PROCS) {
          fits = 0;
        } else {
          proc_host[procs] = host[i];
          proc_pid[procs++] = pid[i];
        }
      }
    }
    if (cid[i] < 0 || cid[i] >= code_top || name + 1 >= code_top || rank[i] < 0 ||
        rank[i] >= int_top || size + 1 >= int_top)
      fits = 0;
    if (fits) {
      out_key[k] = (uint64_t)cid[i] << (RW_KEY_CODE_BITS + 2 * RW_KEY_INT_BITS) |
                   (uint64_t)(name + 1) << (2 * RW_KEY_INT_BITS) |
                   (uint64_t)rank[i] << RW_KEY_INT_BITS | (uint64_t)(size + 1);
      out_proc[k] = last;
    }
    k++;
  }
  *packed = fits && k > 0 ? (procs > 1 ? 2 : 1) : 0;
  return k;
}

/* ------------------------------------------------------------------- groups */

#define GROUP_SLOTS_MIN 64

/* The columns of a chunk rwp_groups reads: string codes or int64, and validity. */
typedef struct {
  const int32_t *code[RW_G];
  const int64_t *num[RW_G];
  const uint8_t *valid[RW_G];
} group_columns_t;

/* Row i's value of column c as int64 (string codes widened); *has: whether it has one. */
static inline int64_t column_at(const group_columns_t *t, int c, int64_t i, int *has) {
  *has = bit_at(t->valid[c], i);
  if (!*has) return 0;
  return t->code[c] ? t->code[c][i] : t->num[c][i];
}

static inline uint64_t mix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

/* Aggregate a of group g takes value v: the smallest or the largest so far. */
static void take_aggregate(int64_t *const *agg, uint8_t *agg_valid, int a, int64_t g,
                           int64_t v) {
  static const int is_min[RW_A] = {0, 0, 1, 0, 1, 0};
  int64_t *slot = &agg[a][g];
  uint8_t bit = (uint8_t)(1u << a);
  if (!(agg_valid[g] & bit) || (is_min[a] ? v < *slot : v > *slot)) *slot = v;
  agg_valid[g] |= bit;
}

static inline void aggregate(const group_columns_t *t, int64_t i, int64_t g,
                             int64_t *const *agg, uint8_t *agg_valid) {
  int64_t v[RW_A];
  int has[RW_A], has_end, has_start, ok;
  v[RW_A_N_RANKS] = column_at(t, RW_G_N_RANKS, i, &has[RW_A_N_RANKS]);
  v[RW_A_NNODES] = column_at(t, RW_G_NNODES, i, &has[RW_A_NNODES]);
  v[RW_A_FIRST_ARRIVAL] = column_at(t, RW_G_ARRIVAL, i, &has[RW_A_FIRST_ARRIVAL]);
  int64_t end = column_at(t, RW_G_GPU_END, i, &has_end);
  int64_t start = column_at(t, RW_G_GPU_START, i, &has_start);
  /* coalesce(gpu_end, enqueue_end, arrival) */
  v[RW_A_LAST_END] = has_end ? end : column_at(t, RW_G_ENQUEUE_END, i, &ok);
  has[RW_A_LAST_END] = has_end || ok;
  if (!has[RW_A_LAST_END]) {
    v[RW_A_LAST_END] = v[RW_A_FIRST_ARRIVAL];
    has[RW_A_LAST_END] = has[RW_A_FIRST_ARRIVAL];
  }
  v[RW_A_FIRST_TIMED_START] = start;
  has[RW_A_FIRST_TIMED_START] = has_start && has_end;
  v[RW_A_LAST_TIMED_END] = end;
  has[RW_A_LAST_TIMED_END] = has_end && has_start;
  for (int a = 0; a < RW_A; a++)
    if (has[a]) take_aggregate(agg, agg_valid, a, g, v[a]);
}

/* 1 when the first `rows` bits of an LSB-first bitmap are all set, 0 when none
 * is, -1 when some are. */
static int bits_all(const uint8_t *v, int64_t rows) {
  int64_t full = rows / 8;
  int rest = (int)(rows % 8);
  uint8_t ones = (uint8_t)((1u << rest) - 1), tail = rest ? (uint8_t)(v[full] & ones) : 0;
  int all = tail == ones, none = tail == 0;
  for (int64_t i = 0; i < full && (all || none); i++) {
    all &= v[i] == 0xFF;
    none &= v[i] == 0;
  }
  return all ? 1 : none ? 0 : -1;
}

/* same[i]: whether row i has row i - 1's key (same[0] = 0), found a key column at a
 * time: a rank's ops of one function follow each other, and a streaming pass per
 * column costs less than reading every key column of every row in turn. */
static void same_as_previous(const group_columns_t *t, int64_t rows, uint8_t *same) {
  if (rows <= 0) return;
  memset(same, 1, (size_t)rows);
  same[0] = 0;
  for (int c = 0; c < RW_G_KEYS; c++) {
    const uint8_t *v = t->valid[c];
    const int32_t *code = t->code[c];
    const int64_t *num = t->num[c];
    int fill = bits_all(v, rows);
    if (fill == 0) continue; /* NULL in every row: equal throughout */
    if (fill == 1) {         /* the usual key column: a value in every row */
      if (code)
        for (int64_t i = 1; i < rows; i++) same[i] &= (uint8_t)(code[i] == code[i - 1]);
      else
        for (int64_t i = 1; i < rows; i++) same[i] &= (uint8_t)(num[i] == num[i - 1]);
      continue;
    }
    int had = bit_at(v, 0);
    for (int64_t i = 1; i < rows; i++) {
      int has = bit_at(v, i);
      /* a NULL's slot is not read: its value is whatever the buffer held */
      int equal = has == had && (!has || (code ? code[i] == code[i - 1] : num[i] == num[i - 1]));
      same[i] &= (uint8_t)equal;
      had = has;
    }
  }
}

static int64_t run_max(const int64_t *x, int64_t lo, int64_t hi) {
  int64_t m = x[lo];
  for (int64_t i = lo + 1; i < hi; i++) m = x[i] > m ? x[i] : m;
  return m;
}

static int64_t run_min(const int64_t *x, int64_t lo, int64_t hi) {
  int64_t m = x[lo];
  for (int64_t i = lo + 1; i < hi; i++) m = x[i] < m ? x[i] : m;
  return m;
}

/* Whether every input of aggregate() but the enqueue end (which only stands in for
 * a missing GPU end) has a value in every row of the chunk. */
static int aggregates_dense(const group_columns_t *t, int64_t rows) {
  const int cols[] = {RW_G_N_RANKS, RW_G_NNODES, RW_G_ARRIVAL, RW_G_GPU_END, RW_G_GPU_START};
  for (size_t k = 0; k < sizeof cols / sizeof cols[0]; k++)
    if (t->code[cols[k]] || bits_all(t->valid[cols[k]], rows) != 1) return 0;
  return 1;
}

/* aggregate() of rows lo .. hi - 1 of group g, a column at a time where the chunk
 * is dense (aggregates_dense), else a row at a time. */
static void aggregate_run(const group_columns_t *t, int64_t lo, int64_t hi, int64_t g,
                          int dense, int64_t *const *agg, uint8_t *agg_valid) {
  if (!dense) {
    for (int64_t i = lo; i < hi; i++) aggregate(t, i, g, agg, agg_valid);
    return;
  }
  const int64_t *end = t->num[RW_G_GPU_END], *start = t->num[RW_G_GPU_START];
  take_aggregate(agg, agg_valid, RW_A_N_RANKS, g, run_max(t->num[RW_G_N_RANKS], lo, hi));
  take_aggregate(agg, agg_valid, RW_A_NNODES, g, run_max(t->num[RW_G_NNODES], lo, hi));
  take_aggregate(agg, agg_valid, RW_A_FIRST_ARRIVAL, g, run_min(t->num[RW_G_ARRIVAL], lo, hi));
  take_aggregate(agg, agg_valid, RW_A_LAST_END, g, run_max(end, lo, hi));
  take_aggregate(agg, agg_valid, RW_A_FIRST_TIMED_START, g, run_min(start, lo, hi));
  take_aggregate(agg, agg_valid, RW_A_LAST_TIMED_END, g, run_max(end, lo, hi));
}

int64_t rwp_groups(int64_t rows, const void *const *values, const uint8_t *const *valid,
                   int64_t capacity, int32_t *out_row, int64_t *out_count,
                   int64_t *const *out_agg, uint8_t *out_valid) {
  if (rows < 0 || capacity < 0) return -1;
  group_columns_t t;
  for (int c = 0; c < RW_G; c++) {
    t.code[c] = rw_g_is_code(c) ? values[c] : NULL;
    t.num[c] = rw_g_is_code(c) ? NULL : values[c];
    t.valid[c] = valid[c];
  }
  /* open addressing over group numbers + 1; a group's keys kept beside it */
  uint64_t slots = GROUP_SLOTS_MIN;
  while (slots < 2 * (uint64_t)capacity) slots *= 2;
  int64_t *table = calloc(slots, sizeof *table);
  int64_t *keys = malloc(((size_t)capacity + 1) * RW_G_KEYS * sizeof *keys);
  uint16_t *nulls = malloc(((size_t)capacity + 1) * sizeof *nulls);
  uint8_t *same = malloc((size_t)rows + 1);
  if (!table || !keys || !nulls || !same) {
    free(table), free(keys), free(nulls), free(same);
    return -1;
  }
  same_as_previous(&t, rows, same);
  int dense = rows > 0 && aggregates_dense(&t, rows);
  int64_t groups = 0;
  for (int64_t i = 0; i < rows;) {
    int64_t next = i + 1; /* rows i .. next - 1: one run of the key of row i */
    while (next < rows && same[next]) next++;
    int64_t k[RW_G_KEYS];
    uint16_t null = 0;
    for (int c = 0; c < RW_G_KEYS; c++) {
      int has;
      k[c] = column_at(&t, c, i, &has);
      null |= (uint16_t)(!has << c);
    }
    int64_t g = -1;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ null;
    for (int c = 0; c < RW_G_KEYS; c++) h = mix64(h ^ (uint64_t)k[c]);
    uint64_t at = h & (slots - 1);
    while (table[at]) {
      int64_t other = table[at] - 1;
      if (nulls[other] == null && memcmp(&keys[other * RW_G_KEYS], k, sizeof k) == 0) {
        g = other;
        break;
      }
      at = (at + 1) & (slots - 1);
    }
    if (g < 0) {
      if (groups == capacity) {
        free(table), free(keys), free(nulls), free(same);
        return -1;
      }
      g = groups++;
      table[at] = g + 1;
      memcpy(&keys[g * RW_G_KEYS], k, sizeof k);
      nulls[g] = null;
      out_row[g] = (int32_t)i;
      out_count[g] = 0;
      out_valid[g] = 0;
    }
    out_count[g] += next - i;
    aggregate_run(&t, i, next, g, dense, out_agg, out_valid);
    i = next;
  }
  free(table), free(keys), free(nulls), free(same);
  return groups;
}

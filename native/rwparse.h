/* rwparse: a JSON-lines reader for rankwatch op records, filling columnar buffers.
 *
 * Every line must be one JSON object. Its top-level keys are either groups
 * (objects whose known keys are typed fields), typed fields themselves (the
 * group "."; state records are flat), rejected keys (must be absent or null), or
 * unknown (the value is checked as JSON and skipped, nested objects and arrays
 * included). Keys may come in any order. Known fields are typed:
 *
 *   'i' int64, 'n' int64 that fits a 32-bit integer, 'f' double (a JSON int or
 *   number), 'b' bool, 's' string (interned: the column holds int32 codes into
 *   one dictionary per file), 'r' any JSON value other than null, kept as its
 *   text (checked, not decoded; interned like a string) for SQL to transform.
 *
 * Any JSON value may be null. A line that is not valid JSON (RFC 8259, UTF-8),
 * holds a wrongly typed known field, a number out of its field's range, a
 * duplicate known key, a rejected key with a value, or nests deeper than
 * RWP_MAX_DEPTH is *flagged*: it produces no row, and its line number and
 * reason are kept (the first RWP_MAX_FLAGS of them; all are counted). Blank
 * lines (only spaces, tabs, CR) are skipped.
 *
 * Output columns ("slots") are bound per chunk by the caller:
 *   values[slot]: int64_t[cap] ('i', 'n'), double[cap] ('f'), a bitmap of
 *                 ceil(cap/8) bytes ('b'), int32_t[cap] ('s', 'r'), unused for groups;
 *   valid[slot]:  a zeroed bitmap of ceil(cap/8) bytes, bit i set when row i has
 *                 a value (LSB first, as Apache Arrow's validity bitmaps).
 * A group's slot only gets validity: set when the group is present and not null.
 *
 * Speed: a file's lines almost always share one layout (the same keys in the same
 * order), so the parser remembers the constant text between the values of the
 * last few accepted lines and reads a line that matches one value by value; a
 * line that does not match goes through the full tokenizer, with the same result.
 *
 * The library is thread-compatible: one parser per thread. No global state.
 */
#ifndef RWPARSE_H
#define RWPARSE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RWP_API __attribute__((visibility("default")))

#define RWP_MAX_FLAGS 64
#define RWP_MAX_DEPTH 64

enum rwp_code {
  RWP_OK = 0,
  RWP_E_SYNTAX = 1,     /* not valid JSON */
  RWP_E_TYPE = 2,       /* a known field or group has the wrong JSON type */
  RWP_E_RANGE = 3,      /* a number does not fit its field */
  RWP_E_DUPLICATE = 4,  /* a known key appears twice */
  RWP_E_REJECTED = 5,   /* a rejected key has a value */
  RWP_E_DEPTH = 6,      /* nested deeper than RWP_MAX_DEPTH */
  RWP_E_ENCODING = 7,   /* invalid UTF-8, control character or bad escape in a string */
  RWP_E_STRINGS = 8,    /* the file has too many distinct strings to intern */
  RWP_E_NOT_OBJECT = 9, /* the line is not a JSON object */
};

typedef struct rwp_parser rwp_parser;

/* A parser for the layout in `spec`: lines of
 *     group <name> <slot>                      a top-level object (slot: validity)
 *     reject <name>                            a top-level key that must be null
 *     field <group> <name> <type> <slot>       a typed field (slot -1: check only);
 *                                              group "." for a top-level field
 * Returns NULL (with a message in err) when the spec is malformed. */
RWP_API rwp_parser *rwp_new(const char *spec, char *err, int errlen);
RWP_API void rwp_free(rwp_parser *p);
/* Start a new file: line numbers, flags and the string dictionary restart. */
RWP_API void rwp_reset(rwp_parser *p);
/* Start another file in the same chunk: line numbers and flags restart; the
 * chunk's rows and the string dictionary go on (small files, one chunk). */
RWP_API void rwp_next_file(rwp_parser *p);
RWP_API int rwp_slot_count(const rwp_parser *p);
/* Bind the buffers of the next chunk (see above); 0 on success. */
RWP_API int rwp_bind(rwp_parser *p, int64_t capacity, void *const *values, uint8_t *const *valid);
/* Parse complete lines of buf until the chunk is full. Returns the bytes used:
 * the start of the first line not parsed. With final != 0 a last line without
 * a newline is parsed too; otherwise it is left for the next call. */
RWP_API int64_t rwp_parse(rwp_parser *p, const char *buf, int64_t len, int final);
RWP_API int64_t rwp_rows(const rwp_parser *p);            /* rows in the bound chunk */
RWP_API int64_t rwp_lines(const rwp_parser *p);           /* lines seen in this file */
RWP_API int64_t rwp_flagged(const rwp_parser *p);         /* lines flagged in this file */
/* The i-th flagged line (i < min(flagged, RWP_MAX_FLAGS)): 0 on success. */
RWP_API int rwp_flag(const rwp_parser *p, int i, int64_t *line, int *code);
/* Line number of a last line parsed without a terminating newline, else 0. */
RWP_API int64_t rwp_unterminated_line(const rwp_parser *p);
RWP_API int32_t rwp_string_count(const rwp_parser *p);
/* Bytes and length of interned string `code` (valid until rwp_reset/rwp_free). */
RWP_API const char *rwp_string(const rwp_parser *p, int32_t code, int64_t *len);
/* The dictionary as an Arrow string array's buffers: offsets[0..count] (the
 * caller's, count + 1 of them) into the returned bytes, *len of them. */
RWP_API const char *rwp_strings(const rwp_parser *p, int32_t *offsets, int64_t *len);

/* Nested values: the JSON texts a parser kept for 'r' fields, read into the
 * buffers of an Apache Arrow array of one nested type. The type is a spec of
 * nodes in preorder:
 *     i            int64            n     int32 (range-checked)
 *     s            UTF-8 string     L <node>   a list of <node> (a JSON array)
 *     S <k> <name> <node> ...       a struct of k named fields (a JSON object;
 *                                   unknown keys skipped, missing ones null)
 *     M <node>     a map from string keys to <node> (a JSON object); its key
 *                  column is the node after it, its values the one after that
 * Any value may be null. Anything else (another JSON type, a number out of
 * range, a duplicate key) fails the whole call with its rwp_code: the caller
 * then reads the texts some other way. Per node, the buffers Arrow wants:
 * validity bitmap (LSB first), int64/int32 values, int32 offsets (s, L, M: the
 * node's length + 1), string bytes (s). */
typedef struct rwn_reader rwn_reader;
RWP_API rwn_reader *rwn_new(const char *spec, char *err, int errlen);
RWP_API void rwn_free(rwn_reader *n);
RWP_API int rwn_node_count(const rwn_reader *n);
/* Read the interned strings `codes[0..count)` of parser p (a negative code: a
 * null value); 0 on success. */
RWP_API int rwn_read(rwn_reader *n, rwp_parser *p, const int32_t *codes, int64_t count);
/* Node i's length and buffers (NULL where the node has none; valid until the
 * next rwn_read or rwn_free); *data_len: bytes of string data. */
RWP_API int64_t rwn_node(const rwn_reader *n, int i, const uint8_t **valid, const void **values,
                         const int32_t **offsets, const char **data, int64_t *data_len);

/* The collective rows of a parsed chunk in the kept-columns layout (rwkept.h;
 * see rwparse.c). */
RWP_API int64_t rwp_capture(int64_t rows, const void *const *values, const uint8_t *const *valid,
                            int32_t coll, const int32_t *func_remap, int64_t n_local,
                            int32_t *out_row, int32_t *out_func, int64_t *out_seq,
                            int64_t *const *out_values, uint8_t *out_valid, uint64_t *out_key,
                            int32_t *out_proc, int64_t *packed);
/* The ops of a parsed chunk grouped by the key columns of rwkept.h's RW_G_*
 * (see rwparse.c); the number of groups, or -1 when there are more than
 * `capacity`. */
RWP_API int64_t rwp_groups(int64_t rows, const void *const *values, const uint8_t *const *valid,
                           int64_t capacity, int32_t *out_row, int64_t *out_count,
                           int64_t *const *out_agg, uint8_t *out_valid);

#ifdef __cplusplus
}
#endif

#endif /* RWPARSE_H */

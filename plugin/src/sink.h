/* The streaming sink (sink.c): the record lines written to the files, also sent
 * to a collector in frames (docs/stream-protocol.md). Everything here runs on
 * the writer thread, except rw_sink_init, which runs before that thread starts. */
#ifndef RANKWATCH_SINK_H
#define RANKWATCH_SINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

bool rw_sink_init(void);                     /* false: streaming stays off */
void rw_sink_put(const char *p, size_t len); /* complete lines, as written to a file */
void rw_sink_pump(void);                     /* connect, send what fits; never blocks */
void rw_sink_drain(int64_t deadline_ns);     /* exit: send what is queued, until the deadline */
void rw_sink_abandon(void);                  /* exit: count what is still queued as dropped */
void rw_sink_close(void);

#endif

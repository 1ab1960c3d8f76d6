/* Functions shared by the writer thread's files (writer.c, drain.c, progress.c,
 * prom.c). Everything declared here runs on the writer thread only. */
#ifndef RANKWATCH_WRITER_INTERNAL_H
#define RANKWATCH_WRITER_INTERNAL_H

#include "record.h"
#include "rw.h"

rw_buf *rw_writer_op_buf(void);     /* flushed to disk when large */
rw_buf *rw_writer_state_buf(void);
void rw_writer_flush_buffers(void);

/* drain.c */
void rw_drain_completed(uint32_t *scratch, int64_t now);
void rw_flush_inflight(rw_comm *c, int64_t now); /* write in-flight ops as incomplete */
void rw_sweep_superseded(int64_t now);

/* progress.c */
int rw_inflight_init(void);
void rw_write_comm_state(rw_comm *c, int64_t now, const char *reason); /* progress + clock */
void rw_write_all_progress(int64_t now, const char *reason);

/* prom.c */
void rw_prom_account(rw_comm *c, const rw_op *op);
void rw_prom_write(int64_t now);

#endif

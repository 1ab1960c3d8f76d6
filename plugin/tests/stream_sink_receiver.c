/*
 * stream_sink_receiver: a small collector for rankwatch's stream protocol
 * (docs/stream-protocol.md), used by run_checks.sh to put the plugin's
 * streaming sink under the sanitizers, reconnects included.
 *
 *   stream_sink_receiver --listen unix:PATH|tcp --ready FILE --out FILE
 *                        [--close-after N] [--stall] [--seconds S]
 *
 * --listen tcp listens on 127.0.0.1 at a port the kernel picks. Once listening,
 * the collector address (what RANKWATCH_COLLECTOR takes) is written to the
 * --ready file. Every frame is checked: a length of 1 byte to 4 MiB, a payload
 * of whole lines each holding one JSON object, and a first frame of exactly one
 * line, the hello. --close-after N closes each connection after N frames, so
 * the plugin has to reconnect; --stall accepts connections and never reads.
 * On SIGTERM or SIGINT (or after S seconds) it writes one JSON line to --out:
 *   {"connections":C,"frames":F,"lines":L,"hellos":H,"errors":E,"first_error":"..."}
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_PAYLOAD (4u << 20)
#define MAX_CONNS 32

typedef struct {
  int fd;
  unsigned char *buf; /* one frame: header, then payload */
  size_t have, need;  /* bytes held; bytes of the frame being read (0: header) */
  unsigned long frames;
} conn;

static volatile sig_atomic_t stop;
static conn conns[MAX_CONNS];
static unsigned long n_conns, n_frames, n_lines, n_hellos, n_errors;
static char first_error[200];

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

static void error(const char *what, unsigned long detail) {
  if (n_errors++ == 0) snprintf(first_error, sizeof first_error, "%s (%lu)", what, detail);
}

static void drop(conn *c) {
  close(c->fd);
  free(c->buf);
  memset(c, 0, sizeof *c);
  c->fd = -1;
}

/* Checks one frame's payload: whole lines, each a JSON object; the hello first. */
static void check_payload(conn *c, const unsigned char *p, size_t n) {
  if (p[n - 1] != '\n') error("payload does not end with a newline", n);
  unsigned long lines = 0;
  for (size_t start = 0; start < n;) {
    const unsigned char *nl = memchr(p + start, '\n', n - start);
    size_t end = nl ? (size_t)(nl - p) : n;
    if (end - start < 2 || p[start] != '{' || p[end - 1] != '}')
      error("a line is not a JSON object", lines);
    lines++;
    start = end + 1;
  }
  if (c->frames == 0) {
    const char *line = (const char *)p;
    if (lines != 1 || !memmem(line, n, "\"kind\":\"hello\"", 14) ||
        !memmem(line, n, "\"protocol\":1,", 13) || !memmem(line, n, "\"connection\":", 13))
      error("the first frame is not one hello line", lines);
    else
      n_hellos++;
  } else {
    n_lines += lines;
  }
  c->frames++;
  n_frames++;
}

/* Reads what is there; false when the connection is done. */
static bool serve(conn *c, unsigned long close_after) {
  for (;;) {
    size_t want = c->need ? 4 + c->need : 4;
    ssize_t r = recv(c->fd, c->buf + c->have, want - c->have, MSG_DONTWAIT);
    if (r == 0) {
      if (c->have) error("connection closed inside a frame", c->have);
      return false;
    }
    if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    c->have += (size_t)r;
    if (c->have < want) continue;
    if (c->need == 0) {
      uint32_t len = (uint32_t)c->buf[0] << 24 | (uint32_t)c->buf[1] << 16 |
                     (uint32_t)c->buf[2] << 8 | c->buf[3];
      if (len == 0 || len > MAX_PAYLOAD) {
        error("frame length out of range", len);
        return false;
      }
      c->need = len;
      continue;
    }
    check_payload(c, c->buf + 4, c->need);
    c->have = c->need = 0;
    if (close_after && c->frames >= close_after) return false;
  }
}

static int listen_on(const char *spec, char *addr, size_t cap) {
  int fd;
  if (strncmp(spec, "unix:", 5) == 0) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(spec + 5) >= sizeof a.sun_path) return -1;
    strcpy(a.sun_path, spec + 5);
    unlink(a.sun_path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0) return -1;
    snprintf(addr, cap, "%s", spec);
  } else if (strcmp(spec, "tcp") == 0) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
      return -1;
    snprintf(addr, cap, "tcp://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
  } else {
    return -1;
  }
  return listen(fd, 16) == 0 ? fd : -1;
}

static int usage(void) {
  fputs("usage: stream_sink_receiver --listen unix:PATH|tcp --ready FILE --out FILE "
        "[--close-after N] [--stall] [--seconds S]\n", stderr);
  return 2;
}

int main(int argc, char **argv) {
  const char *spec = NULL, *ready = NULL, *out = NULL;
  unsigned long close_after = 0;
  double seconds = 600;
  bool stall = false;
  for (int i = 1; i < argc; i++) {
    bool more = i + 1 < argc;
    if (!strcmp(argv[i], "--listen") && more) spec = argv[++i];
    else if (!strcmp(argv[i], "--ready") && more) ready = argv[++i];
    else if (!strcmp(argv[i], "--out") && more) out = argv[++i];
    else if (!strcmp(argv[i], "--close-after") && more) close_after = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--seconds") && more) seconds = strtod(argv[++i], NULL);
    else if (!strcmp(argv[i], "--stall")) stall = true;
    else return usage();
  }
  if (!spec || !ready || !out) return usage();
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  signal(SIGPIPE, SIG_IGN);
  char addr[256];
  int lfd = listen_on(spec, addr, sizeof addr);
  if (lfd < 0) {
    fprintf(stderr, "stream_sink_receiver: cannot listen on %s: %s\n", spec, strerror(errno));
    return 1;
  }
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", ready);
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "%s\n", addr) < 0 || fclose(f) != 0 || rename(tmp, ready) != 0) return 1;
  for (int i = 0; i < MAX_CONNS; i++) conns[i].fd = -1;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (!stop) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    double elapsed = (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
    if (elapsed > seconds) break;
    struct pollfd pfd[MAX_CONNS + 1];
    int map[MAX_CONNS + 1], n = 0;
    pfd[n] = (struct pollfd){.fd = lfd, .events = POLLIN};
    map[n++] = -1;
    for (int i = 0; i < MAX_CONNS && !stall; i++)
      if (conns[i].fd >= 0) {
        pfd[n] = (struct pollfd){.fd = conns[i].fd, .events = POLLIN};
        map[n++] = i;
      }
    if (poll(pfd, (nfds_t)n, 50) <= 0) continue;
    for (int k = 0; k < n; k++) {
      if (!pfd[k].revents) continue;
      if (map[k] < 0) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        int slot = -1;
        for (int i = 0; i < MAX_CONNS && slot < 0; i++)
          if (conns[i].fd < 0) slot = i;
        if (slot < 0) {
          close(fd);
          error("too many connections", MAX_CONNS);
          continue;
        }
        conns[slot] = (conn){.fd = fd, .buf = malloc(4 + MAX_PAYLOAD)};
        if (!conns[slot].buf) return 1;
        n_conns++;
      } else if (!serve(&conns[map[k]], close_after)) {
        drop(&conns[map[k]]);
      }
    }
  }
  for (int i = 0; i < MAX_CONNS; i++)
    if (conns[i].fd >= 0) drop(&conns[i]);
  close(lfd);
  if (strncmp(spec, "unix:", 5) == 0) unlink(spec + 5);
  f = fopen(out, "w");
  if (!f) return 1;
  fprintf(f, "{\"connections\":%lu,\"frames\":%lu,\"lines\":%lu,\"hellos\":%lu,\"errors\":%lu,"
          "\"first_error\":\"%s\"}\n", n_conns, n_frames, n_lines, n_hellos, n_errors, first_error);
  return fclose(f) == 0 ? 0 : 1;
}

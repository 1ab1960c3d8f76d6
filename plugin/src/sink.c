/*
 * The streaming sink: every op and state line written to the files is also
 * queued here and sent to a collector (RANKWATCH_COLLECTOR) in frames of a
 * 4-byte big-endian length and whole lines (docs/stream-protocol.md).
 *
 * Only the writer thread runs this code; NCCL's threads never see the socket.
 * The queue is a fixed ring of batches of at most BATCH bytes each (one frame
 * each), RANKWATCH_STREAM_QUEUE_BYTES in all, allocated once. Lines are copied
 * into the newest batch; every writer pass seals it and sends what the
 * non-blocking socket takes (sendmsg, MSG_DONTWAIT | MSG_NOSIGNAL), resuming a
 * partly sent frame on the next pass. When the ring is full the oldest batch
 * not yet on the wire is dropped and its records counted. Lines queue up while
 * the collector is away, and the connection is retried with exponential
 * backoff; every connection starts with a hello frame.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "rw.h"
#include "sink.h"

#define BATCH (32u << 10) /* bytes of one batch: frame header and payload */
#define HDR 4u            /* frame header: payload length, big-endian */
#define MAX_IOV 64
#define BACKOFF_MIN_NS 100000000LL   /* 100 ms, doubling ... */
#define BACKOFF_MAX_NS 5000000000LL  /* ... to 5 s */
#define CONNECT_TIMEOUT_NS 3000000000LL
#define RESOLVE_TTL_NS 60000000000LL
#define HELLO_MAX (12u << 10)

typedef struct {
  uint32_t len;     /* payload bytes */
  uint32_t records; /* lines in the payload */
} rw_batch;

/* ---- the queue ---- */
static char *mem;           /* nbatch * BATCH bytes */
static rw_batch *meta;
static uint32_t *ring;      /* a permutation of batch indices: [head, head + count) queued */
static uint32_t nbatch, head, count;
static bool open_last;      /* the newest queued batch is still being filled */
static size_t head_sent;    /* bytes of the oldest frame already sent on this connection */

/* ---- the connection ---- */
enum { DOWN, CONNECTING, UP };
static int state = DOWN;
static int sock = -1;
static _Atomic int fork_fd = -1; /* the socket, for the fork handler */
static int64_t next_try_ns, backoff_ns = BACKOFF_MIN_NS;
static int64_t since_ns;         /* connect started (CONNECTING) or connected (UP) */
static uint64_t connections;
static unsigned addr_turn;       /* tcp: which resolved address to try next */
static bool lookup_free;         /* tcp: the host is a numeric address */
static bool failing;             /* attempts are failing; said once per streak */
static char hello[HELLO_MAX];
static size_t hello_len, hello_sent;
static char target[sizeof rw_g.cfg.stream_path + sizeof rw_g.cfg.stream_host + 16];
static struct addrinfo *addrs;   /* tcp: the last answer of the name lookup */
static unsigned naddrs;
static int64_t resolved_ns;

static void add(_Atomic uint64_t *counter, uint64_t n) { ST(counter, LD(counter) + n); }

static char *frame(uint32_t idx) { return mem + (size_t)idx * BATCH; }
static uint32_t at(uint32_t pos) { return ring[(head + pos) % nbatch]; }

static uint32_t count_lines(const char *p, size_t n) {
  uint32_t k = 0;
  for (const char *end = p + n; (p = memchr(p, '\n', (size_t)(end - p))) != NULL; p++) k++;
  return k;
}

/* The newest batch becomes a frame: its header is written, nothing more fits. */
static void seal(void) {
  if (!open_last) return;
  open_last = false;
  uint32_t idx = at(count - 1), n = meta[idx].len;
  if (n == 0) { /* only a dropped over-long line went in: give it back */
    count--;
    return;
  }
  unsigned char *h = (unsigned char *)frame(idx);
  h[0] = (unsigned char)(n >> 24);
  h[1] = (unsigned char)(n >> 16);
  h[2] = (unsigned char)(n >> 8);
  h[3] = (unsigned char)n;
}

/* The oldest batch leaves the queue (sent or dropped). */
static void pop_head(void) {
  head = (head + 1) % nbatch;
  count--;
}

/* The queue is full: drop the oldest batch that has not started going out. A
 * partly sent frame must be finished first, or the collector loses framing. */
static void drop_oldest(void) {
  uint32_t h = head, victim = ring[h];
  if (head_sent > 0) {
    uint32_t second = (h + 1) % nbatch;
    victim = ring[second];
    ring[second] = ring[h];
    ring[h] = victim;
  }
  add(&rw_g.stats.stream_dropped_records, meta[victim].records);
  pop_head();
}

/* ---- sending ---- */

static void close_sock(void) {
  if (sock >= 0) close(sock);
  sock = -1;
  ST(&fork_fd, -1);
  state = DOWN;
}

static void retry_later(int64_t now) {
  next_try_ns = now + backoff_ns;
  backoff_ns = backoff_ns * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : backoff_ns * 2;
}

static void lost(const char *why) {
  int64_t now = rw_now_ns();
  /* A connection that lived a while was a good one: retry soon. One the
   * collector closes at once (a wrong token, say) keeps backing off. */
  if (now - since_ns >= BACKOFF_MAX_NS) backoff_ns = BACKOFF_MIN_NS;
  rw_info("stream to %s lost (%s); reconnecting, records still go to files", target, why);
  close_sock();
  head_sent = 0; /* a partly sent frame goes again, whole, after the next hello */
  retry_later(now);
}

/* Byte counts the socket took: first the hello, then frames from the oldest. */
static void consume(size_t n) {
  size_t k = hello_len - hello_sent < n ? hello_len - hello_sent : n;
  hello_sent += k;
  n -= k;
  while (n > 0) {
    uint32_t idx = at(0);
    size_t left = HDR + meta[idx].len - head_sent;
    if (n < left) {
      head_sent += n;
      return;
    }
    n -= left;
    head_sent = 0;
    add(&rw_g.stats.stream_sent_records, meta[idx].records);
    pop_head();
  }
}

/* Sends the hello and sealed frames until the socket would block. */
static void send_some(void) {
  while (state == UP) {
    struct iovec iov[MAX_IOV];
    int n = 0;
    if (hello_sent < hello_len)
      iov[n++] = (struct iovec){.iov_base = hello + hello_sent, .iov_len = hello_len - hello_sent};
    uint32_t sealed = count - (open_last ? 1 : 0);
    for (uint32_t i = 0; i < sealed && n < MAX_IOV; i++) {
      uint32_t idx = at(i);
      size_t off = i == 0 ? head_sent : 0;
      iov[n++] = (struct iovec){.iov_base = frame(idx) + off, .iov_len = HDR + meta[idx].len - off};
    }
    if (n == 0) return;
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t sent = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) lost(strerror(errno));
      return;
    }
    add(&rw_g.stats.stream_sent_bytes, (uint64_t)sent);
    consume((size_t)sent);
  }
}

/* The protocol is one-way, so a readable socket means the collector closed it
 * (anything it sends anyway is read and ignored). */
static bool peer_gone(void) {
  struct pollfd pfd = {.fd = sock, .events = POLLIN | POLLRDHUP};
  if (poll(&pfd, 1, 0) <= 0) return false;
  if (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  char scratch[512];
  ssize_t n = recv(sock, scratch, sizeof scratch, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* ---- connecting ---- */

static void build_hello(void) {
  const rw_config *cfg = &rw_g.cfg;
  char name[sizeof cfg->hostname + 40], ops[sizeof name * 6 + 3], st[sizeof name * 6 + 3];
  snprintf(name, sizeof name, "%s-pid%d.log", cfg->hostname, rw_g.pid);
  rw_json_quote(ops, sizeof ops, name);
  snprintf(name, sizeof name, "%s-pid%d.rwstate.jsonl", cfg->hostname, rw_g.pid);
  rw_json_quote(st, sizeof st, name);
  int n = snprintf(hello + HDR, sizeof hello - HDR,
                   "{\"kind\":\"hello\",\"protocol\":1,\"schema\":%d,\"hostname\":%s,\"pid\":%d,"
                   "\"job_id\":%s,\"plugin_version\":\"%s\",\"ops_file\":%s,\"state_file\":%s,"
                   "\"token\":%s,\"connection\":%llu,\"stream_dropped_records\":%llu}\n",
                   RW_SCHEMA, cfg->hostname_json, rw_g.pid, cfg->job_id_json, RANKWATCH_VERSION,
                   ops, st, cfg->stream_token_set ? cfg->stream_token_json : "null",
                   (unsigned long long)connections,
                   (unsigned long long)LD(&rw_g.stats.stream_dropped_records));
  if (n < 0 || (size_t)n >= sizeof hello - HDR) n = 0; /* cannot happen: fields are bounded */
  unsigned char *h = (unsigned char *)hello;
  h[0] = (unsigned char)((unsigned)n >> 24);
  h[1] = (unsigned char)((unsigned)n >> 16);
  h[2] = (unsigned char)((unsigned)n >> 8);
  h[3] = (unsigned char)n;
  hello_len = HDR + (size_t)n;
  hello_sent = 0;
}

static void connected(int64_t now) {
  state = UP;
  since_ns = now;
  connections++;
  if (connections > 1) add(&rw_g.stats.stream_reconnects, 1);
  failing = false;
  head_sent = 0;
  build_hello();
  rw_info("streaming records to %s (connection %llu)", target, (unsigned long long)connections);
}

static void attempt_failed(int64_t now, const char *why) {
  close_sock();
  if (!failing)
    rw_warn_once(RW_WARN_STREAM_CONNECT, "cannot connect to the collector %s (%s); records "
                 "still go to files, retrying every 0.1 s to 5 s", target, why);
  failing = true;
  retry_later(now);
}

/* tcp: the collector's addresses, looked up on the writer thread. A lookup can
 * block (a slow DNS server), so its answer is kept and looked up again only
 * when connecting has failed and the answer is older than RESOLVE_TTL_NS. */
static bool resolve(int64_t now, bool may_look_up, const char **why) {
  if (addrs != NULL && !(failing && now - resolved_ns > RESOLVE_TTL_NS)) return true;
  if (!may_look_up && !lookup_free) {
    *why = "no address looked up yet";
    return addrs != NULL;
  }
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  int g = getaddrinfo(rw_g.cfg.stream_host, rw_g.cfg.stream_port, &hints, &res);
  if (g != 0 || res == NULL) {
    *why = g ? gai_strerror(g) : "no address";
    return addrs != NULL; /* keep using the last answer */
  }
  if (addrs != NULL) freeaddrinfo(addrs);
  addrs = res;
  naddrs = 0;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) naddrs++;
  resolved_ns = now;
  return true;
}

/* Opens a non-blocking socket and starts connecting. */
static void start_connect(int64_t now, bool may_look_up) {
  const rw_config *cfg = &rw_g.cfg;
  int fd, rc, err;
  if (cfg->stream == RW_STREAM_UNIX) {
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path, cfg->stream_path, strlen(cfg->stream_path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      attempt_failed(now, strerror(errno));
      return;
    }
    rc = connect(fd, (const struct sockaddr *)&a, sizeof a);
    err = errno;
  } else {
    const char *why = "";
    if (!resolve(now, may_look_up, &why)) {
      attempt_failed(now, why);
      return;
    }
    struct addrinfo *ai = addrs; /* the next address, in turn */
    for (unsigned i = addr_turn++ % naddrs; i > 0; i--) ai = ai->ai_next;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      attempt_failed(now, strerror(errno));
      return;
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    err = errno;
  }
  sock = fd;
  ST(&fork_fd, fd);
  if (rc == 0) {
    connected(now);
  } else if (err == EINPROGRESS) {
    state = CONNECTING;
    since_ns = now;
  } else {
    attempt_failed(now, strerror(err));
  }
}

static void check_connecting(int64_t now) {
  struct pollfd pfd = {.fd = sock, .events = POLLOUT};
  if (poll(&pfd, 1, 0) <= 0) {
    if (now - since_ns > CONNECT_TIMEOUT_NS) attempt_failed(now, "connection timed out");
    return;
  }
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(sock, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) attempt_failed(now, strerror(err));
  else connected(now);
}

/* ---- the writer's interface ---- */

/* A forked child has no writer thread; its copy of the socket would only keep
 * the connection open after the parent has gone. */
static void close_in_child(void) {
  int fd = LD(&fork_fd);
  if (fd >= 0) close(fd);
}

bool rw_sink_init(void) {
  const rw_config *cfg = &rw_g.cfg;
  nbatch = (uint32_t)(cfg->stream_queue_bytes / BATCH);
  if (nbatch < 4) nbatch = 4;
  mem = malloc((size_t)nbatch * BATCH); /* pages are touched as the ring first fills */
  meta = calloc(nbatch, sizeof *meta);
  ring = malloc(nbatch * sizeof *ring);
  if (mem == NULL || meta == NULL || ring == NULL) {
    rw_warn_once(RW_WARN_STREAM_CONFIG, "cannot allocate the %llu-byte stream queue; streaming "
                 "off, records still go to files", (unsigned long long)cfg->stream_queue_bytes);
    rw_sink_close();
    return false;
  }
  for (uint32_t i = 0; i < nbatch; i++) ring[i] = i;
  if (cfg->stream == RW_STREAM_UNIX) {
    snprintf(target, sizeof target, "unix:%s", cfg->stream_path);
  } else {
    unsigned char addr[sizeof(struct in6_addr)];
    bool v6 = inet_pton(AF_INET6, cfg->stream_host, addr) == 1;
    snprintf(target, sizeof target, v6 ? "tcp://[%s]:%s" : "tcp://%s:%s", cfg->stream_host,
             cfg->stream_port);
    lookup_free = v6 || inet_pton(AF_INET, cfg->stream_host, addr) == 1;
  }
  (void)pthread_atfork(NULL, NULL, close_in_child);
  return true;
}

void rw_sink_put(const char *p, size_t len) {
  while (len > 0) {
    if (!open_last) {
      if (count == nbatch) {
        send_some(); /* room may open up without dropping anything */
        if (count == nbatch) drop_oldest();
      }
      uint32_t idx = ring[(head + count) % nbatch];
      meta[idx] = (rw_batch){0, 0};
      count++;
      open_last = true;
    }
    uint32_t idx = at(count - 1);
    size_t room = BATCH - HDR - meta[idx].len, take = len < room ? len : room;
    const char *nl = take ? memrchr(p, '\n', take) : NULL;
    if (nl != NULL) { /* the whole lines that fit */
      size_t n = (size_t)(nl - p) + 1;
      memcpy(frame(idx) + HDR + meta[idx].len, p, n);
      meta[idx].len += (uint32_t)n;
      meta[idx].records += count_lines(p, n);
      p += n;
      len -= n;
    } else if (meta[idx].len > 0) {
      seal(); /* the next line goes into a new batch */
    } else { /* a line longer than a batch (rankwatch writes none): dropped */
      const char *end = memchr(p, '\n', len);
      size_t n = end ? (size_t)(end - p) + 1 : len;
      add(&rw_g.stats.stream_dropped_records, 1);
      p += n;
      len -= n;
    }
  }
}

void rw_sink_pump(void) {
  seal();
  int64_t now = rw_now_ns();
  if (state == UP && peer_gone()) lost("the collector closed the connection");
  if (state == CONNECTING) check_connecting(now);
  if (state == DOWN && now >= next_try_ns) start_connect(now, true);
  send_some();
}

void rw_sink_drain(int64_t deadline_ns) {
  seal();
  /* One last attempt if the collector is away, but no name lookup: that could
   * take longer than the deadline. */
  if (state == DOWN) start_connect(rw_now_ns(), false);
  for (;;) {
    int64_t now = rw_now_ns();
    if (state == CONNECTING) check_connecting(now);
    if (state == UP && peer_gone()) lost("the collector closed the connection");
    send_some();
    if (state == DOWN || (state == UP && hello_sent == hello_len && count == 0)) return;
    if (now >= deadline_ns) return;
    int64_t ms = (deadline_ns - now + 999999) / 1000000;
    struct pollfd pfd = {.fd = sock, .events = POLLOUT};
    (void)poll(&pfd, 1, (int)(ms < 10 ? ms : 10));
  }
}

void rw_sink_abandon(void) {
  seal();
  /* A partly sent frame stays: dropping it would break the framing. */
  while (count > (head_sent > 0 ? 1u : 0u)) {
    uint32_t last = at(count - 1);
    add(&rw_g.stats.stream_dropped_records, meta[last].records);
    count--;
  }
}

void rw_sink_close(void) {
  close_sock();
  if (addrs != NULL) freeaddrinfo(addrs);
  addrs = NULL;
  free(mem);
  free(meta);
  free(ring);
  mem = NULL;
  meta = NULL;
  ring = NULL;
  nbatch = count = 0;
  open_last = false;
}

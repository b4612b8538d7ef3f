/* Full-mesh TCP transport (transport.h), set-up half: every rank listens on an ephemeral port of
 * the chosen interface, publishes "ip port hostname boot_id" under gloo/<rank> in the group's
 * store, reads everyone's entry, connects to each lower rank and accepts each higher rank (a
 * 16-byte hello names the rank and the group), links same-host peers through shared-memory rings
 * (shm_link.c) and tunes spinning and socket buffers. Also destroy and hangup. The data path is
 * tcp.c. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "runtime/common/bytes.h"
#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/common/param.h"
#include "runtime/common/sock.h"
#include "runtime/gloo/shm.h"
#include "runtime/gloo/shm_link.h"
#include "runtime/gloo/transport.h"
#include "runtime/gloo/tcp_internal.h"
#include "runtime/store/local_ip.h"
#include "runtime/store/store_internal.h"

/* ---------------------------------------------------------------------------------------- */
/* Setup                                                                                     */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static void read_boot_id(char *buf, size_t cap) {
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  buf[0] = '\0';
  if (f) {
    if (!fgets(buf, (int)cap, f)) buf[0] = '\0';
    fclose(f);
  }
  buf[strcspn(buf, "\n")] = '\0';
  if (!buf[0]) snprintf(buf, cap, "unknown");
}

/* The IPv4 address to listen on: TDIST_SOCKET_IFNAME's, else the address of the interface that
 * reaches the store (NCCL's approach), else the host name's, else loopback. */
static tdist_status_t choose_ip(const tdist__transport_cfg_t *cfg, char *ip, size_t cap) {
  const char *ifname =
      cfg->socket_ifname ? cfg->socket_ifname : tdist__param_str(TDIST__P_SOCKET_IFNAME);
  const char *from = cfg->socket_ifname ? "socket_ifname option" : "TDIST_SOCKET_IFNAME";
  if (ifname && *ifname) {
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) == 0) {
      for (struct ifaddrs *i = ifa; i; i = i->ifa_next) {
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && strcmp(i->ifa_name, ifname) == 0) {
          inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip, (socklen_t)cap);
          freeifaddrs(ifa);
          return TDIST_OK;
        }
      }
      freeifaddrs(ifa);
    }
    return tdist__transport_fail(cfg, TDIST_ERR_INVALID_ARGUMENT,
                                 "%s '%s': no interface of that name with an IPv4 address (see "
                                 "`ip -4 addr`)",
                                 from, ifname);
  }
  if (tdist__store_local_ip(cfg->store, ip, cap) == 0) return TDIST_OK;
  char host[256];
  if (gethostname(host, sizeof host) == 0) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) == 0 && res) {
      inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, ip, (socklen_t)cap);
      freeaddrinfo(res);
      return TDIST_OK;
    }
  }
  snprintf(ip, cap, "127.0.0.1");
  return TDIST_OK;
}

static int wait_readable(int fd, int abort_fd, int64_t deadline) {
  for (;;) {
    struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = abort_fd, .events = POLLIN}};
    int r = poll(p, 2, tdist__poll_timeout(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (p[1].revents) return -ECANCELED;
    if (r == 0) return -ETIMEDOUT;
    return 0;
  }
}

void tdist__tcp_destroy(tdist__transport_t *base) {
  tcp_t *t = (tcp_t *)base;
  tdist__shm_links_close(&t->shm, t->size);
  if (t->rx)
    for (int i = 0; i < t->size; i++) {
      free(t->rx[i].ahead);
      for (early_t *e = t->rx[i].head, *nx; e; e = nx) {
        nx = e->next;
        free(e->data);
        free(e);
      }
    }
  free(t->rx);
  free(t->copies_sent);
  free(t->copies_recv);
  free(t->busy);
  free(t->gone);
  if (t->fds)
    for (int i = 0; i < t->size; i++)
      if (t->fds[i] >= 0) close(t->fds[i]);
  free(t->fds);
  free(t->addr);
  free(t->pfds);
  free(t->pidx);
  if (t->wake_fd >= 0) close(t->wake_fd);
  free(t->fed);
  free(t);
}

void tdist__tcp_hangup(tdist__transport_t *base) {
  tcp_t *t = (tcp_t *)base;
  if (t->fds)
    for (int i = 0; i < t->size; i++)
      if (t->fds[i] >= 0) shutdown(t->fds[i], SHUT_RDWR);
}

tdist_status_t tdist__transport_fail(const tdist__transport_cfg_t *cfg, tdist_status_t st,
                                     const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  st = cfg->fail(cfg->fail_ctx, st, fmt, ap);
  va_end(ap);
  return st;
}

tdist_status_t tdist__tcp_transport_create(const tdist__transport_cfg_t *cfg, int64_t deadline,
                                           tdist__transport_t **out) {
  tcp_t *t = calloc(1, sizeof *t);
  int listen_fd = -1;
  tdist_status_t st = TDIST_OK;
  char **keys = NULL;
  int *same = NULL;
  void **vals = NULL;
  size_t *lens = NULL;
  if (!t) return tdist__transport_fail(cfg, TDIST_ERR_NO_MEMORY, "tcp transport: out of memory");
  t->wake_fd = -1;
  t->base.exchange = tdist__tcp_exchange;
  t->base.exchange_fed = tdist__tcp_exchange_fed;
  t->base.wake = tdist__tcp_wake;
  t->base.destroy = tdist__tcp_destroy;
  t->base.hangup = tdist__tcp_hangup;
  t->cfg = *cfg;
  t->rank = cfg->rank;
  t->size = cfg->size;
  t->fds = malloc(sizeof(int) * (size_t)t->size);
  t->addr = calloc((size_t)t->size, sizeof *t->addr);
  t->pfds = calloc(3 * (size_t)t->size + 2, sizeof *t->pfds);
  t->pidx = calloc(3 * (size_t)t->size + 1, sizeof *t->pidx);
  int shm_r = tdist__shm_links_alloc(&t->shm, t->size);
  t->gone = calloc((size_t)t->size, 1);
  t->busy = calloc((size_t)t->size, 1);
  t->rx = calloc((size_t)t->size, sizeof *t->rx);
  t->copies_sent = calloc((size_t)t->size, sizeof *t->copies_sent);
  t->copies_recv = calloc((size_t)t->size, sizeof *t->copies_recv);
  t->early_max = (size_t)tdist__param_int(TDIST__P_P2P_BUFFER_MB) << 20;
  keys = calloc((size_t)t->size, sizeof *keys);
  vals = calloc((size_t)t->size, sizeof *vals);
  lens = calloc((size_t)t->size, sizeof *lens);
  t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (t->wake_fd < 0) {
    st =
        tdist__transport_fail(cfg, TDIST_ERR_SYSTEM, "tcp transport: eventfd: %s", strerror(errno));
    goto done;
  }
  if (!t->fds || !t->addr || !t->pfds || !t->pidx || !keys || !vals || !lens || shm_r || !t->gone ||
      !t->busy || !t->rx || !t->copies_sent || !t->copies_recv) {
    st = tdist__transport_fail(cfg, TDIST_ERR_NO_MEMORY, "tcp transport: out of memory");
    goto done;
  }
  for (int i = 0; i < t->size; i++) t->fds[i] = -1;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  t->shm_spin_ns = (int64_t)tdist__param_int(TDIST__P_SHM_SPIN_US) * 1000;
  t->yield = (int)tdist__param_int(TDIST__P_SHM_YIELD);
  if (t->size == 1) {
    *out = &t->base;
    t = NULL;
    goto done;
  }

  char ip[64];
  if ((st = choose_ip(cfg, ip, sizeof ip))) goto done;
  struct sockaddr_in sa = {.sin_family = AF_INET};
  inet_pton(AF_INET, ip, &sa.sin_addr);
  listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t sl = sizeof sa;
  if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(listen_fd, t->size + 16) != 0 ||
      getsockname(listen_fd, (struct sockaddr *)&sa, &sl) != 0) { /* else we publish port 0 */
    st = tdist__transport_fail(cfg, TDIST_ERR_SYSTEM, "tcp transport: cannot listen on %s: %s", ip,
                               strerror(errno));
    goto done;
  }
  char host[128], boot[64], entry[400], key[64];
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "unknown");
  host[sizeof host - 1] = '\0';
  read_boot_id(boot, sizeof boot);
  int elen = snprintf(entry, sizeof entry, "%s %d %s %s", ip, ntohs(sa.sin_port), host, boot);
  snprintf(key, sizeof key, "gloo/%d", t->rank);
  if ((st = tdist_store_set(cfg->store, key, entry, (size_t)elen))) {
    st = tdist__transport_fail(cfg, st, "tcp transport: publishing this rank's address: %s",
                               tdist_store_last_error(cfg->store));
    goto done;
  }
  for (int i = 0; i < t->size; i++) {
    keys[i] = malloc(32);
    if (!keys[i]) {
      st = tdist__transport_fail(cfg, TDIST_ERR_NO_MEMORY, "tcp transport: out of memory");
      goto done;
    }
    snprintf(keys[i], 32, "gloo/%d", i);
  }
  int64_t left = deadline - tdist__now_ms();
  st = tdist__store_multi_get_ms(cfg->store, (const char *const *)keys, (size_t)t->size, vals, lens,
                                 left > 0 ? left : 1);
  if (st) {
    st = tdist__transport_fail(cfg, st,
                               "waiting for all %d ranks to publish their addresses: %s "
                               "(a rank that never started or used another MASTER_ADDR/PORT?)",
                               t->size, tdist_store_last_error(cfg->store));
    goto done;
  }
  int remote_host = 0;
  same = calloc((size_t)t->size, sizeof *same);
  if (!same) {
    st = tdist__transport_fail(cfg, TDIST_ERR_NO_MEMORY, "tcp transport: out of memory");
    goto done;
  }
  for (int i = 0; i < t->size; i++) {
    char pip[64], phost[128], pboot[64];
    int pport;
    char *v = malloc(lens[i] + 1);
    if (!v) {
      st = tdist__transport_fail(cfg, TDIST_ERR_NO_MEMORY, "tcp transport: out of memory");
      goto done;
    }
    memcpy(v, vals[i], lens[i]);
    v[lens[i]] = '\0';
    int ok = sscanf(v, "%63s %d %127s %63s", pip, &pport, phost, pboot) == 4;
    free(v);
    if (!ok) {
      st = tdist__transport_fail(cfg, TDIST_ERR_PROTOCOL,
                                 "tcp transport: rank %d published a malformed "
                                 "address entry",
                                 i);
      goto done;
    }
    snprintf(t->addr[i], sizeof t->addr[i], "%s:%d", pip, pport);
    if (strcmp(phost, host) != 0 || strcmp(pboot, boot) != 0)
      remote_host = 1;
    else
      same[i] = i != t->rank;
  }
  if (remote_host && strncmp(ip, "127.", 4) == 0)
    tdist__log(TDIST__LOG_WARN, "gloo",
               "rank %d listens on loopback %s but the group spans several hosts: other hosts "
               "cannot reach it. Set TDIST_SOCKET_IFNAME to the interface to use.",
               t->rank, ip);

  uint64_t ghash = hash_str(cfg->name);
  /* Connect to every lower rank; the kernel completes these against their listen backlog, so
   * connecting first and accepting second cannot deadlock. */
  for (int peer = 0; peer < t->rank; peer++) {
    char pip[80];
    snprintf(pip, sizeof pip, "%s", t->addr[peer]);
    char *colon = strrchr(pip, ':');
    *colon = '\0';
    int64_t backoff = 10;
    for (;;) {
      int fd = tdist__sock_connect(pip, atoi(colon + 1), deadline, NULL);
      if (fd >= 0) {
        uint8_t hello[16];
        tdist__put_u32(hello, HELLO_MAGIC);
        tdist__put_u32(hello + 4, (uint32_t)t->rank);
        tdist__put_u64(hello + 8, ghash);
        int r = tdist__sock_send_all(fd, hello, sizeof hello, deadline);
        if (r == 0) {
          t->fds[peer] = fd;
          break;
        }
        close(fd);
      }
      if (tdist__now_ms() + backoff >= deadline || atomic_load(cfg->aborted)) {
        st = tdist__transport_fail(cfg, TDIST_ERR_TIMEOUT,
                                   "tcp transport: rank %d could not connect "
                                   "to rank %d at %s: %s",
                                   t->rank, peer, t->addr[peer],
                                   tdist__sock_strerror(fd < 0 ? fd : -EPIPE));
        goto done;
      }
      usleep((useconds_t)backoff * 1000);
      backoff = backoff * 2 > 500 ? 500 : backoff * 2;
    }
  }
  for (int k = t->rank + 1; k < t->size; k++) {
    int r = wait_readable(listen_fd, cfg->abort_fd, deadline);
    if (r) {
      char missing[256] = "";
      size_t ml = 0;
      for (int p = t->rank + 1; p < t->size && ml + 8 < sizeof missing; p++)
        if (t->fds[p] < 0)
          ml += (size_t)snprintf(missing + ml, sizeof missing - ml, "%s%d", ml ? "," : "", p);
      st = tdist__transport_fail(cfg,
                                 r == -ECANCELED   ? TDIST_ERR_ABORTED
                                 : r == -ETIMEDOUT ? TDIST_ERR_TIMEOUT
                                                   : TDIST_ERR_SYSTEM, /* poll failed */
                                 "tcp transport: rank %d waited for connections from ranks %s: %s",
                                 t->rank, missing,
                                 r == -ECANCELED   ? "aborted"
                                 : r == -ETIMEDOUT ? "timed out"
                                                   : strerror(-r));
      goto done;
    }
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      k--;
      continue;
    }
    uint8_t hello[16];
    r = tdist__sock_recv_all(fd, hello, sizeof hello, deadline);
    if (r && r != -TDIST__ECLOSED && r != -ECONNRESET) {
      /* Our own failure (poll, the deadline), not a stray peer's: waiting on would only hide it. */
      close(fd);
      st = tdist__transport_fail(cfg, r == -ETIMEDOUT ? TDIST_ERR_TIMEOUT : TDIST_ERR_SYSTEM,
                                 "tcp transport: rank %d reading a peer's hello: %s", t->rank,
                                 tdist__sock_strerror(r));
      goto done;
    }
    uint32_t peer = tdist__get_u32(hello + 4);
    if (r || tdist__get_u32(hello) != HELLO_MAGIC || tdist__get_u64(hello + 8) != ghash ||
        peer <= (uint32_t)t->rank || peer >= (uint32_t)t->size || t->fds[peer] >= 0) {
      /* A stray or stale connection (another job or an earlier attempt): drop it. */
      char who[64];
      tdist__sock_peer_str(fd, who, sizeof who);
      tdist__log(TDIST__LOG_WARN, "gloo", "rank %d: dropping unexpected connection from %s",
                 t->rank, who);
      close(fd);
      k--;
      continue;
    }
    tdist__sock_nodelay(fd);
    t->fds[peer] = fd;
  }
  for (int i = 0; i < t->size; i++)
    if (t->fds[i] >= 0) tdist__sock_set_nonblock(t->fds[i], 1);
  if (tdist__param_int(TDIST__P_SHM))
    st = tdist__shm_links_setup(&t->shm, cfg, &t->base, same, deadline);
  /* Waiting ranks spin before they sleep (a peer that is running answers within microseconds).
   * When this host's ranks outnumber its CPUs, the peer a rank waits for may need the very core
   * it spins on: then every spin yields the CPU from the start, so the rank with work gets it
   * (4 ranks on 2 cores, 8 B..4 KiB all_reduce over rings: 21-43 us when the first 20 us of the
   * spin did not yield, 3-6 us now; over TCP, where such groups used not to spin at all: 23-30 us
   * before, 16-19 us yielding for up to 200 us). */
  int local = 1;
  for (int i = 0; i < t->size; i++) local += same[i];
  t->crowded = local > ncpu;
  t->base.single_host = local == t->size;
  t->spin_us = tdist__param_is_set(TDIST__P_SPIN_US) ? (int)tdist__param_int(TDIST__P_SPIN_US)
                                                     : (t->crowded ? 200 : 50);
  t->spin_max_ns = t->spin_ns = (int64_t)t->spin_us * 1000;
  t->pure_spin_ns = t->crowded ? 0 : SHM_PURE_SPIN_NS;
  /* TCP between ranks of one host (TDIST_SHM=0, or no shared memory): a send buffer of
   * LOCAL_SNDBUF (the kernel doubles it), not the megabytes autotuning grows to, keeps the bytes
   * in flight in cache between the sender's copy in and the receiver's copy out (2 ranks on 2
   * cores, alternating runs: 4 MiB broadcast 488-549 -> 354-380 us, 16 MiB all_reduce 4183 ->
   * 3477, all_gather 2396 -> 2077). Not when ranks outnumber cores: a sender that fills the
   * smaller buffer then waits for its receiver to get a core (4 ranks on 2 cores, 1 MiB
   * broadcast 159-186 -> 250-304 us). */
  if (!t->crowded)
    for (int i = 0; i < t->size; i++)
      if (same[i] && t->fds[i] >= 0) {
        int v = LOCAL_SNDBUF;
        (void)setsockopt(t->fds[i], SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
      }
  free(same);
  same = NULL;
  if (st) goto done;
  *out = &t->base;
  t = NULL;
done:
  free(same);
  if (listen_fd >= 0) close(listen_fd);
  if (keys)
    for (int i = 0; i < cfg->size; i++) free(keys[i]);
  if (vals)
    for (int i = 0; i < cfg->size; i++) free(vals[i]);
  free(keys);
  free(vals);
  free(lens);
  if (t) tdist__tcp_destroy(&t->base);
  return st;
}

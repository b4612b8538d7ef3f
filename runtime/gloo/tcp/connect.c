/* Connecting a gloo group's full TCP mesh (tcp.h): every rank listens on an ephemeral port of the
 * chosen interface, publishes "ip port hostname boot_id" under gloo/<rank> in the store, reads
 * everyone's entry, connects to each lower rank and accepts each higher rank (a 16-byte hello
 * names the rank and the group). What the sockets then carry is the progress loop's
 * (runtime/gloo/progress.c, through link.c). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/common/bytes.h"
#include "runtime/common/clock.h"
#include "runtime/common/log.h"
#include "runtime/common/param.h"
#include "runtime/common/sock.h"
#include "runtime/gloo/tcp/tcp.h"
#include "runtime/store/local_ip.h"
#include "runtime/store/store_internal.h"

#define HELLO_MAGIC 0x7d15e110u

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

/* Listens on an ephemeral port of the chosen interface: the socket (ip and port written), or -1
 * after failing through cfg. */
static int listen_on(const tdist__transport_cfg_t *cfg, char *ip, size_t cap, int *port,
                     tdist_status_t *st) {
  if ((*st = choose_ip(cfg, ip, cap))) return -1;
  struct sockaddr_in sa = {.sin_family = AF_INET};
  inet_pton(AF_INET, ip, &sa.sin_addr);
  int listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t sl = sizeof sa;
  if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(listen_fd, cfg->size + 16) != 0 ||
      getsockname(listen_fd, (struct sockaddr *)&sa, &sl) != 0) { /* else we publish port 0 */
    *st = tdist__transport_fail(cfg, TDIST_ERR_SYSTEM, "tcp transport: cannot listen on %s: %s", ip,
                                strerror(errno));
    if (listen_fd >= 0) close(listen_fd);
    return -1;
  }
  *port = ntohs(sa.sin_port);
  return listen_fd;
}

/* Reads every rank's entry (waiting for them until the deadline) into addr and same. */
static tdist_status_t read_entries(const tdist__transport_cfg_t *cfg, int64_t deadline,
                                   const char *ip, const char *host, const char *boot,
                                   char (*addr)[TDIST__TCP_ADDR_MAX], int *same) {
  const int size = cfg->size;
  tdist_status_t st = TDIST_OK;
  char **keys = calloc((size_t)size, sizeof *keys);
  void **vals = calloc((size_t)size, sizeof *vals);
  size_t *lens = calloc((size_t)size, sizeof *lens);
  if (!keys || !vals || !lens) {
    st = tdist__transport_fail(cfg, TDIST_ERR_NO_MEMORY, "tcp transport: out of memory");
    goto done;
  }
  for (int i = 0; i < size; i++) {
    keys[i] = malloc(32);
    if (!keys[i]) {
      st = tdist__transport_fail(cfg, TDIST_ERR_NO_MEMORY, "tcp transport: out of memory");
      goto done;
    }
    snprintf(keys[i], 32, "gloo/%d", i);
  }
  int64_t left = deadline - tdist__now_ms();
  st = tdist__store_multi_get_ms(cfg->store, (const char *const *)keys, (size_t)size, vals, lens,
                                 left > 0 ? left : 1);
  if (st) {
    st = tdist__transport_fail(cfg, st,
                               "waiting for all %d ranks to publish their addresses: %s "
                               "(a rank that never started or used another MASTER_ADDR/PORT?)",
                               size, tdist_store_last_error(cfg->store));
    goto done;
  }
  int remote_host = 0;
  for (int i = 0; i < size; i++) {
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
    snprintf(addr[i], TDIST__TCP_ADDR_MAX, "%s:%d", pip, pport);
    if (strcmp(phost, host) != 0 || strcmp(pboot, boot) != 0)
      remote_host = 1;
    else
      same[i] = i != cfg->rank;
  }
  if (remote_host && strncmp(ip, "127.", 4) == 0)
    tdist__log(TDIST__LOG_WARN, "gloo",
               "rank %d listens on loopback %s but the group spans several hosts: other hosts "
               "cannot reach it. Set TDIST_SOCKET_IFNAME to the interface to use.",
               cfg->rank, ip);
done:
  if (keys)
    for (int i = 0; i < size; i++) free(keys[i]);
  if (vals)
    for (int i = 0; i < size; i++) free(vals[i]);
  free(keys);
  free(vals);
  free(lens);
  return st;
}

/* Connects to every lower rank; the kernel completes these against their listen backlog, so
 * connecting first and accepting second cannot deadlock. */
static tdist_status_t connect_lower(const tdist__transport_cfg_t *cfg, int64_t deadline,
                                    uint64_t ghash, int *fds, char (*addr)[TDIST__TCP_ADDR_MAX]) {
  for (int peer = 0; peer < cfg->rank; peer++) {
    char pip[TDIST__TCP_ADDR_MAX];
    snprintf(pip, sizeof pip, "%s", addr[peer]);
    char *colon = strrchr(pip, ':');
    *colon = '\0';
    int64_t backoff = 10;
    for (;;) {
      int fd = tdist__sock_connect(pip, atoi(colon + 1), deadline, NULL);
      if (fd >= 0) {
        uint8_t hello[16];
        tdist__put_u32(hello, HELLO_MAGIC);
        tdist__put_u32(hello + 4, (uint32_t)cfg->rank);
        tdist__put_u64(hello + 8, ghash);
        int r = tdist__sock_send_all(fd, hello, sizeof hello, deadline);
        if (r == 0) {
          fds[peer] = fd;
          break;
        }
        close(fd);
      }
      if (tdist__now_ms() + backoff >= deadline || atomic_load(cfg->aborted))
        return tdist__transport_fail(cfg, TDIST_ERR_TIMEOUT,
                                     "tcp transport: rank %d could not connect "
                                     "to rank %d at %s: %s",
                                     cfg->rank, peer, addr[peer],
                                     tdist__sock_strerror(fd < 0 ? fd : -EPIPE));
      usleep((useconds_t)backoff * 1000);
      backoff = backoff * 2 > 500 ? 500 : backoff * 2;
    }
  }
  return TDIST_OK;
}

/* The failure of a wait for the higher ranks' connections (r: wait_readable's). */
static tdist_status_t accept_fail(const tdist__transport_cfg_t *cfg, const int *fds, int r) {
  char missing[256] = "";
  size_t ml = 0;
  for (int p = cfg->rank + 1; p < cfg->size && ml + 8 < sizeof missing; p++)
    if (fds[p] < 0)
      ml += (size_t)snprintf(missing + ml, sizeof missing - ml, "%s%d", ml ? "," : "", p);
  return tdist__transport_fail(cfg,
                               r == -ECANCELED   ? TDIST_ERR_ABORTED
                               : r == -ETIMEDOUT ? TDIST_ERR_TIMEOUT
                                                 : TDIST_ERR_SYSTEM, /* poll failed */
                               "tcp transport: rank %d waited for connections from ranks %s: %s",
                               cfg->rank, missing,
                               r == -ECANCELED   ? "aborted"
                               : r == -ETIMEDOUT ? "timed out"
                                                 : strerror(-r));
}

/* Accepts every higher rank's connection, checking its hello. */
static tdist_status_t accept_higher(const tdist__transport_cfg_t *cfg, int64_t deadline,
                                    uint64_t ghash, int listen_fd, int *fds) {
  for (int k = cfg->rank + 1; k < cfg->size; k++) {
    int r = wait_readable(listen_fd, cfg->abort_fd, deadline);
    if (r) return accept_fail(cfg, fds, r);
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
      return tdist__transport_fail(cfg, r == -ETIMEDOUT ? TDIST_ERR_TIMEOUT : TDIST_ERR_SYSTEM,
                                   "tcp transport: rank %d reading a peer's hello: %s", cfg->rank,
                                   tdist__sock_strerror(r));
    }
    uint32_t peer = tdist__get_u32(hello + 4);
    if (r || tdist__get_u32(hello) != HELLO_MAGIC || tdist__get_u64(hello + 8) != ghash ||
        peer <= (uint32_t)cfg->rank || peer >= (uint32_t)cfg->size || fds[peer] >= 0) {
      /* A stray or stale connection (another job or an earlier attempt): drop it. */
      char who[64];
      tdist__sock_peer_str(fd, who, sizeof who);
      tdist__log(TDIST__LOG_WARN, "gloo", "rank %d: dropping unexpected connection from %s",
                 cfg->rank, who);
      close(fd);
      k--;
      continue;
    }
    tdist__sock_nodelay(fd);
    fds[peer] = fd;
  }
  return TDIST_OK;
}

tdist_status_t tdist__tcp_mesh_connect(const tdist__transport_cfg_t *cfg, int64_t deadline,
                                       int *fds, char (*addr)[TDIST__TCP_ADDR_MAX], int *same) {
  for (int i = 0; i < cfg->size; i++) fds[i] = -1;
  char ip[64];
  int port = 0;
  tdist_status_t st = TDIST_OK;
  int listen_fd = listen_on(cfg, ip, sizeof ip, &port, &st);
  if (listen_fd < 0) return st;
  char host[128], boot[64], entry[400], key[64];
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "unknown");
  host[sizeof host - 1] = '\0';
  read_boot_id(boot, sizeof boot);
  int elen = snprintf(entry, sizeof entry, "%s %d %s %s", ip, port, host, boot);
  snprintf(key, sizeof key, "gloo/%d", cfg->rank);
  if ((st = tdist_store_set(cfg->store, key, entry, (size_t)elen))) {
    st = tdist__transport_fail(cfg, st, "tcp transport: publishing this rank's address: %s",
                               tdist_store_last_error(cfg->store));
    goto done;
  }
  if ((st = read_entries(cfg, deadline, ip, host, boot, addr, same))) goto done;
  uint64_t ghash = hash_str(cfg->name);
  if ((st = connect_lower(cfg, deadline, ghash, fds, addr))) goto done;
  if ((st = accept_higher(cfg, deadline, ghash, listen_fd, fds))) goto done;
  for (int i = 0; i < cfg->size; i++)
    if (fds[i] >= 0) tdist__sock_set_nonblock(fds[i], 1);
done:
  close(listen_fd);
  return st;
}

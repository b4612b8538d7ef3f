/* tdist-store: a TCPStore server and a command-line client for it.
 *
 * `tdist-store serve` runs libtdist's store server (the same one tdist-agent hosts) until SIGTERM
 * or SIGINT; PyTorch's TCPStore clients (1.13 and 2.x) and libtdist clients can use it. The other
 * subcommands are a one-shot client for scripts and debugging: one connection, one operation,
 * the result on stdout, errors on stderr, and an exit status a script can branch on.
 *
 * This program uses the public API (tdist/tdist.h), and libtdist's parameter table
 * (runtime/common/param.h) to refuse a bad TDIST_LOG_LEVEL at start. It must never leave a
 * half-written port file behind (it is written to a temporary name and renamed), and it must never
 * hang: every client call is bounded by --timeout-ms. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "runtime/common/param.h"
#include "tdist/tdist.h"

/* Exit statuses (documented in --help; tests/cli checks them). */
enum {
  EXIT_OK = 0,
  EXIT_ERROR = 1,  /* the operation failed (server unreachable, protocol error, ...) */
  EXIT_USAGE = 2,  /* bad command line */
  EXIT_TIMEOUT = 3 /* the operation did not complete within --timeout-ms */
};

#define DEFAULT_PORT 29500
#define DEFAULT_CLIENT_HOST "127.0.0.1"
#define DEFAULT_TIMEOUT_MS 30000
/* `set KEY -` reads the value from stdin; refuse absurd sizes before the server would anyway. */
#define MAX_STDIN_VALUE ((size_t)1 << 30)

static const char usage_text[] =
    "Usage:\n"
    "  tdist-store serve [--host H] [--port P] [--port-file FILE] [--backlog N]\n"
    "                    [--max-key-bytes N] [--max-value-bytes N] [--max-multi-keys N]\n"
    "                    [--max-connections N] [--max-connection-bytes N]\n"
    "                    [--max-server-bytes N] [--quiet]\n"
    "  tdist-store proxy --upstream HOST:PORT [--host H] [--port P] [--port-file FILE]\n"
    "                    [--instances N] [--timeout-ms T] [--quiet]\n"
    "  tdist-store set KEY VALUE       [client flags]   (VALUE '-' reads the value from stdin)\n"
    "  tdist-store get KEY             [client flags]\n"
    "  tdist-store add KEY DELTA       [client flags]\n"
    "  tdist-store wait KEY [KEY...]   [client flags]\n"
    "  tdist-store delete KEY          [client flags]\n"
    "  tdist-store num-keys            [client flags]\n"
    "  tdist-store help | --help | -h\n"
    "  tdist-store version | --version\n"
    "\n"
    "serve: runs a TCPStore server, wire-compatible with PyTorch's c10d TCPStore (1.13 and 2.x\n"
    "clients on the same port), until SIGTERM or SIGINT, then exits 0.\n"
    "  --host H             address to bind (default: '::', all interfaces, IPv4 and IPv6)\n"
    "  --port P             port to bind, 0..65535; 0 picks a free one (default 29500)\n"
    "  --port-file FILE     once listening, write the bound port and a newline to FILE\n"
    "                       (atomically: a temporary file renamed); removed on clean exit\n"
    "  --backlog N          listen(2) backlog (default: /proc/sys/net/core/somaxconn)\n"
    "  --max-key-bytes N    longest key accepted (default 8KiB)\n"
    "  --max-value-bytes N  largest value accepted (default 64MiB)\n"
    "  --max-multi-keys N   most keys in one WAIT/CHECK/MULTI_GET/MULTI_SET (default 131072)\n"
    "  --max-connections N  connections past N are accepted and closed at once (default\n"
    "                       1048576; a client a store proxy carries counts as one)\n"
    "  --max-connection-bytes N  memory one connection may hold: its input buffer, queued\n"
    "                       replies and pending WAITs (default 2 * max-value-bytes + 128MiB);\n"
    "                       past it that connection is closed with a log line\n"
    "  --max-server-bytes N memory all connections together may hold (default 1GiB, at least\n"
    "                       max-connection-bytes); when a connection's growth would pass\n"
    "                       it, the connection holding the most is closed\n"
    "  --quiet              no log lines on stderr (errors that stop the program still print)\n"
    "  A request over a limit closes that client's connection, as PyTorch's server does.\n"
    "  Sizes accept a K, M or G suffix (powers of 1024). The open-file soft limit is raised to\n"
    "  the hard limit at start, so the server can hold as many connections as the system allows.\n"
    "\n"
    "proxy: carries the clients of one node to a tdist store server (serve, or an agent's) over\n"
    "one connection, until SIGTERM or SIGINT, then exits 0. Clients (PyTorch 1.13 and 2.x, ours)\n"
    "connect to it as to the store; every request still runs on the server. PyTorch's server\n"
    "does not speak the proxy's protocol: the proxy says so and exits 1.\n"
    "  --upstream HOST:PORT the store server ([v6]:PORT for an IPv6 address)\n"
    "  --host H             address clients connect to (default 127.0.0.1)\n"
    "  --port P             port to bind, 0..65535; 0 picks a free one (default 0)\n"
    "  --port-file FILE     once listening, write the bound port(s), one a line, to FILE\n"
    "  --instances N        N independent proxies (ports, upstream connections) in this\n"
    "                       process, to emulate N nodes in benchmarks (default 1; needs port 0)\n"
    "  --timeout-ms T       how long to retry connecting to the upstream (default 30000)\n"
    "\n"
    "Client subcommands connect, run one operation and print its result on stdout:\n"
    "  set       prints nothing\n"
    "  get       waits until KEY exists, then prints its value, raw (no newline added)\n"
    "  add       adds DELTA (a signed 64-bit integer) to the decimal number stored under KEY\n"
    "            (a missing key counts as 0) and prints the new value and a newline\n"
    "  wait      waits until every KEY exists; prints nothing\n"
    "  delete    prints 1 if KEY existed, 0 if not\n"
    "  num-keys  prints the number of keys in the whole store (PyTorch's init/ key too)\n"
    "Keys are sent with a leading '/', as PyTorch's TCPStore does: `tdist-store set foo bar`\n"
    "and Python's `TCPStore(...).set(\"foo\", \"bar\")` write the same key.\n"
    "Client flags:\n"
    "  --host H             server name or address (default 127.0.0.1)\n"
    "  --port P             server port, 1..65535 (default 29500)\n"
    "  --timeout-ms T       bound on connecting (with retries) and on the operation itself,\n"
    "                       in milliseconds, > 0 (default 30000)\n"
    "  --dialect D          auto (default: try 2.x, fall back to 1.13), v2, or v1.13\n"
    "\n"
    "Flags may be given as '--flag value' or '--flag=value', before or after the arguments;\n"
    "'--' ends the flags (for keys or values that start with '--').\n"
    "\n"
    "Exit status:\n"
    "  0  success\n"
    "  1  error (server unreachable, connection lost, a bad server reply, port in use, ...)\n"
    "  2  usage error (unknown subcommand or flag, bad or missing value)\n"
    "  3  timed out (--timeout-ms passed before the operation completed)\n";

/* ------------------------------------------------------------------------------------------ */
/* Command-line parsing                                                                        */
/* ------------------------------------------------------------------------------------------ */

static int usage_error(const char *fmt, ...) {
  va_list ap;
  fputs("tdist-store: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs("\n(run 'tdist-store --help' for usage)\n", stderr);
  return EXIT_USAGE;
}

/* Parses an unsigned decimal number in [lo, hi]. With `sizes`, a K/M/G suffix multiplies by a
 * power of 1024. Returns 0 and sets *out, or -1 (the caller names the flag). */
static int parse_u64(const char *s, int sizes, uint64_t lo, uint64_t hi, uint64_t *out) {
  if (s == NULL || *s < '0' || *s > '9') return -1; /* rejects "", "-1", "+1", " 1" */
  errno = 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0) return -1;
  if (sizes && *end != '\0') {
    int shift = 0;
    switch (*end) {
      case 'k':
      case 'K': shift = 10; break;
      case 'm':
      case 'M': shift = 20; break;
      case 'g':
      case 'G': shift = 30; break;
      default: return -1;
    }
    end++;
    if (*end == 'i' && end[1] == 'B')
      end += 2; /* "64MiB" */
    else if (*end == 'B')
      end++; /* "64MB", same meaning here */
    if (v > (UINT64_MAX >> shift)) return -1;
    v <<= shift;
  }
  if (*end != '\0' || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

/* Parses a signed 64-bit decimal integer, whole string. */
static int parse_i64(const char *s, int64_t *out) {
  if (s == NULL || *s == '\0') return -1;
  errno = 0;
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || *end != '\0' || end == s) return -1;
  *out = (int64_t)v;
  return 0;
}

typedef struct {
  const char *name; /* "--port" */
  int takes_value;
  const char **value; /* where the value (or "1" for a switch) goes */
} flag_t;

/* Splits argv into flags (matched against `flags`) and positional arguments (kept in order in
 * pos[]). Returns 0, or EXIT_USAGE after printing why. */
static int parse_args(const char *cmd, int argc, char **argv, const flag_t *flags, size_t nflags,
                      const char **pos, int *npos) {
  int only_positional = 0;
  *npos = 0;
  for (int i = 0; i < argc; i++) {
    const char *arg = argv[i];
    if (only_positional || strncmp(arg, "--", 2) != 0) {
      pos[(*npos)++] = arg;
      continue;
    }
    if (strcmp(arg, "--") == 0) {
      only_positional = 1;
      continue;
    }
    const char *eq = strchr(arg, '=');
    size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
    const flag_t *f = NULL;
    for (size_t k = 0; k < nflags; k++) {
      if (strlen(flags[k].name) == name_len && strncmp(flags[k].name, arg, name_len) == 0) {
        f = &flags[k];
        break;
      }
    }
    if (f == NULL) {
      return usage_error("%s: unknown flag '%.*s'", cmd, (int)name_len, arg);
    }
    if (!f->takes_value) {
      if (eq) return usage_error("%s: %s takes no value", cmd, f->name);
      *f->value = "1";
    } else if (eq) {
      *f->value = eq + 1;
    } else {
      if (i + 1 >= argc) return usage_error("%s: %s needs a value", cmd, f->name);
      *f->value = argv[++i];
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* serve                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static int quiet_mode;

static void log_line(const char *fmt, ...) {
  if (quiet_mode) return;
  va_list ap;
  fputs("tdist-store: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

/* Raises RLIMIT_NOFILE's soft limit to the hard limit: each client holds one (2.x) or two (1.13)
 * connections, and the usual soft limit of 1024 would cap a large job far below what the server
 * can serve. */
static void raise_nofile_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  rlim_t want = rl.rlim_max;
  if (want == RLIM_INFINITY) {
    /* The kernel refuses an infinite RLIMIT_NOFILE; its real ceiling is fs.nr_open. */
    want = 1048576;
    FILE *f = fopen("/proc/sys/fs/nr_open", "r");
    if (f) {
      unsigned long long v;
      if (fscanf(f, "%llu", &v) == 1) want = (rlim_t)v;
      fclose(f);
    }
  }
  if (rl.rlim_cur >= want) return;
  rlim_t before = rl.rlim_cur;
  rl.rlim_cur = want;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    log_line("warning: could not raise the open-file limit from %llu to %llu: %s",
             (unsigned long long)before, (unsigned long long)want, strerror(errno));
  }
}

/* Writes "PORT\n" to path atomically: readers either see no file or the whole line. */
static int write_port_file(const char *path, const int *ports, int nports) {
  size_t n = strlen(path) + 32;
  char *tmp = malloc(n);
  if (tmp == NULL) return -ENOMEM;
  snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
  int rc = 0;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = -errno;
    goto done;
  }
  for (int i = 0; i < nports && rc == 0; i++) {
    char line[16];
    int len = snprintf(line, sizeof line, "%d\n", ports[i]);
    ssize_t w = write(fd, line, (size_t)len);
    if (w != len) rc = w < 0 ? -errno : -EIO;
  }
  if (close(fd) != 0 && rc == 0) rc = -errno;
  if (rc == 0 && rename(tmp, path) != 0) rc = -errno;
  if (rc != 0) unlink(tmp);
done:
  free(tmp);
  return rc;
}

static int parse_size_flag(const char *flag, const char *value, uint64_t lo, uint64_t hi,
                           size_t *out) {
  uint64_t v;
  if (parse_u64(value, 1, lo, hi, &v) != 0) {
    return usage_error("%s: '%s' is not a size in %" PRIu64 "..%" PRIu64
                       " (a number, optionally with a K, M or G suffix)",
                       flag, value, lo, hi);
  }
  *out = (size_t)v;
  return 0;
}

/* Blocks the stop signals before a library thread exists, so it inherits the mask and only
 * this thread's sigwaitinfo() sees them. SIGPIPE is ignored in case a peer vanishes mid-write. */
static void block_stop_signals(sigset_t *stop) {
  sigemptyset(stop);
  sigaddset(stop, SIGTERM);
  sigaddset(stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, stop, NULL);
  signal(SIGPIPE, SIG_IGN);
}

static int wait_stop_signal(const sigset_t *stop) {
  for (;;) {
    siginfo_t info;
    int sig = sigwaitinfo(stop, &info);
    if (sig > 0) return sig;
    /* EINTR from an unblocked signal (SIGCONT after SIGSTOP, ...): keep waiting. */
  }
}

static int cmd_serve(int argc, char **argv) {
  const char *host = NULL, *port_s = NULL, *port_file = NULL, *backlog_s = NULL;
  const char *max_key_s = NULL, *max_value_s = NULL, *max_multi_s = NULL, *max_conn_s = NULL;
  const char *quiet_s = NULL, *max_cb_s = NULL, *max_sb_s = NULL;
  const flag_t flags[] = {
      {"--host", 1, &host},
      {"--port", 1, &port_s},
      {"--port-file", 1, &port_file},
      {"--backlog", 1, &backlog_s},
      {"--max-key-bytes", 1, &max_key_s},
      {"--max-value-bytes", 1, &max_value_s},
      {"--max-multi-keys", 1, &max_multi_s},
      {"--max-connections", 1, &max_conn_s},
      {"--max-connection-bytes", 1, &max_cb_s},
      {"--max-server-bytes", 1, &max_sb_s},
      {"--quiet", 0, &quiet_s},
  };
  const char *pos[argc > 0 ? argc : 1];
  int npos = 0;
  int rc = parse_args("serve", argc, argv, flags, sizeof flags / sizeof flags[0], pos, &npos);
  if (rc != 0) return rc;
  if (npos != 0) return usage_error("serve: unexpected argument '%s'", pos[0]);

  tdist_store_server_options_t opts = TDIST_STORE_SERVER_OPTIONS_INIT;
  opts.host = host;
  opts.port = DEFAULT_PORT;
  uint64_t v;
  if (port_s) {
    if (parse_u64(port_s, 0, 0, 65535, &v) != 0) {
      return usage_error("--port: '%s' is not a port number (0..65535)", port_s);
    }
    opts.port = (int)v;
  }
  if (backlog_s) {
    if (parse_u64(backlog_s, 0, 1, INT_MAX, &v) != 0) {
      return usage_error("--backlog: '%s' is not a number in 1..%d", backlog_s, INT_MAX);
    }
    opts.backlog = (int)v;
  }
  if (port_file && *port_file == '\0') return usage_error("--port-file: empty file name");
  if (max_key_s && (rc = parse_size_flag("--max-key-bytes", max_key_s, 1, (uint64_t)1 << 30,
                                         &opts.max_key_bytes)) != 0) {
    return rc;
  }
  if (max_value_s && (rc = parse_size_flag("--max-value-bytes", max_value_s, 0, (uint64_t)1 << 40,
                                           &opts.max_value_bytes)) != 0) {
    return rc;
  }
  if (max_multi_s) {
    if (parse_u64(max_multi_s, 0, 1, (uint64_t)1 << 32, &v) != 0) {
      return usage_error("--max-multi-keys: '%s' is not a number in 1..%" PRIu64, max_multi_s,
                         (uint64_t)1 << 32);
    }
    opts.max_multi_keys = (size_t)v;
  }
  if (max_conn_s) {
    if (parse_u64(max_conn_s, 0, 1, INT_MAX, &v) != 0) {
      return usage_error("--max-connections: '%s' is not a number in 1..%d", max_conn_s, INT_MAX);
    }
    opts.max_connections = (size_t)v;
  }
  if (max_cb_s && (rc = parse_size_flag("--max-connection-bytes", max_cb_s, (uint64_t)1 << 20,
                                        (uint64_t)1 << 44, &opts.max_connection_bytes)) != 0) {
    return rc;
  }
  if (max_sb_s && (rc = parse_size_flag("--max-server-bytes", max_sb_s, (uint64_t)1 << 20,
                                        (uint64_t)1 << 46, &opts.max_server_bytes)) != 0) {
    return rc;
  }
  quiet_mode = quiet_s != NULL;
  opts.quiet = quiet_mode;

  sigset_t stop;
  block_stop_signals(&stop);
  raise_nofile_limit();

  tdist_store_server_t *server = NULL;
  tdist_status_t st = tdist_store_server_create(&opts, &server);
  if (st != TDIST_OK) {
    /* The library's detail names the address, the syscall and errno text; add ours only if
     * it has none. */
    const char *detail = tdist_last_error();
    if (detail && *detail) {
      fprintf(stderr, "tdist-store: serve: %s\n", detail);
    } else {
      int v6 = host && strchr(host, ':');
      fprintf(stderr, "tdist-store: serve: cannot serve on %s%s%s:%d: %s\n", v6 ? "[" : "",
              host && *host ? host : "[::]", v6 ? "]" : "", opts.port, tdist_strerror(st));
    }
    return EXIT_ERROR;
  }
  int port = tdist_store_server_port(server);
  if (port_file) {
    int err = write_port_file(port_file, &port, 1);
    if (err != 0) {
      fprintf(stderr, "tdist-store: --port-file: cannot write '%s': %s\n", port_file,
              strerror(-err));
      tdist_store_server_destroy(server);
      return EXIT_ERROR;
    }
  }
  int v6 = host && strchr(host, ':');
  log_line("serving on %s%s%s:%d (pid %ld)", v6 ? "[" : "", host && *host ? host : "[::]",
           v6 ? "]" : "", port, (long)getpid());

  int sig = wait_stop_signal(&stop);
  tdist_store_server_stats_t stats;
  memset(&stats, 0, sizeof stats);
  tdist_store_server_stats(server, &stats);
  log_line("%s received, stopping (%" PRIu64 " requests, %" PRIu64 " connections served, %" PRIu64
           " open, %" PRIu64 " keys)",
           sig == SIGTERM ? "SIGTERM" : "SIGINT", stats.requests_total, stats.connections_total,
           stats.connections_open, stats.keys);
  tdist_store_server_destroy(server);
  if (port_file) unlink(port_file);
  log_line("stopped");
  return EXIT_OK;
}

/* `proxy`: the upstream as HOST:PORT ([v6]:PORT) into host (cap bytes) and port; 0 or a usage
 * error's exit status. */
static int parse_upstream(const char *arg, char *host, size_t cap, int *port) {
  const char *colon = strrchr(arg, ':');
  const char *h = arg;
  size_t hl = colon ? (size_t)(colon - arg) : 0;
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  uint64_t v;
  if (!colon || hl == 0 || hl >= cap || parse_u64(colon + 1, 0, 1, 65535, &v) != 0)
    return usage_error("proxy: --upstream '%s' is not HOST:PORT (PORT 1..65535)", arg);
  memcpy(host, h, hl);
  host[hl] = '\0';
  *port = (int)v;
  return 0;
}

static int cmd_proxy(int argc, char **argv) {
  const char *up_s = NULL, *host = NULL, *port_s = NULL, *port_file = NULL, *inst_s = NULL;
  const char *timeout_s = NULL, *quiet_s = NULL;
  const flag_t flags[] = {
      {"--upstream", 1, &up_s},       {"--host", 1, &host},        {"--port", 1, &port_s},
      {"--port-file", 1, &port_file}, {"--instances", 1, &inst_s}, {"--timeout-ms", 1, &timeout_s},
      {"--quiet", 0, &quiet_s},
  };
  const char *pos[argc > 0 ? argc : 1];
  int npos = 0;
  int rc = parse_args("proxy", argc, argv, flags, sizeof flags / sizeof flags[0], pos, &npos);
  if (rc != 0) return rc;
  if (npos != 0) return usage_error("proxy: unexpected argument '%s'", pos[0]);
  if (!up_s) return usage_error("proxy: --upstream HOST:PORT is required");
  tdist_store_proxy_options_t opts = TDIST_STORE_PROXY_OPTIONS_INIT;
  char up_host[256];
  if ((rc = parse_upstream(up_s, up_host, sizeof up_host, &opts.upstream_port)) != 0) return rc;
  opts.upstream_host = up_host;
  opts.host = host;
  uint64_t v;
  if (port_s && parse_u64(port_s, 0, 0, 65535, &v) != 0)
    return usage_error("--port: '%s' is not a port number (0..65535)", port_s);
  opts.port = port_s ? (int)v : 0;
  if (inst_s && parse_u64(inst_s, 0, 1, 65536, &v) != 0)
    return usage_error("--instances: '%s' is not a number in 1..65536", inst_s);
  opts.instances = inst_s ? (int)v : 1;
  if (opts.instances > 1 && opts.port != 0)
    return usage_error("--instances %d needs --port 0 (each instance picks its own)",
                       opts.instances);
  if (timeout_s && parse_u64(timeout_s, 0, 1, INT_MAX, &v) != 0)
    return usage_error("--timeout-ms: '%s' is not a number in 1..%d", timeout_s, INT_MAX);
  opts.connect_timeout_ms = timeout_s ? (int)v : DEFAULT_TIMEOUT_MS;
  if (port_file && *port_file == '\0') return usage_error("--port-file: empty file name");
  quiet_mode = quiet_s != NULL;
  opts.quiet = quiet_mode;
  sigset_t stop;
  block_stop_signals(&stop);
  raise_nofile_limit();
  tdist_store_proxy_t *px = NULL;
  tdist_status_t st = tdist_store_proxy_create(&opts, &px);
  if (st != TDIST_OK) {
    fprintf(stderr, "tdist-store: proxy: %s\n", tdist_last_error());
    return EXIT_ERROR;
  }
  int *ports = malloc((size_t)opts.instances * sizeof *ports);
  for (int i = 0; ports && i < opts.instances; i++) ports[i] = tdist_store_proxy_port(px, i);
  int err = !ports ? -ENOMEM : port_file ? write_port_file(port_file, ports, opts.instances) : 0;
  if (err != 0) {
    fprintf(stderr, "tdist-store: --port-file: cannot write '%s': %s\n", port_file, strerror(-err));
    free(ports);
    tdist_store_proxy_destroy(px);
    return EXIT_ERROR;
  }
  log_line("proxy on port %d%s to %s (pid %ld)", ports[0],
           opts.instances > 1 ? " and more instances" : "", up_s, (long)getpid());
  free(ports);
  int sig = wait_stop_signal(&stop);
  tdist_store_proxy_stats_t stats;
  tdist_store_proxy_stats(px, &stats);
  log_line("%s received, stopping (%" PRIu64 " clients carried, %" PRIu64 " open)",
           sig == SIGTERM ? "SIGTERM" : "SIGINT", stats.clients_total, stats.clients_open);
  tdist_store_proxy_destroy(px);
  if (port_file) unlink(port_file);
  return EXIT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Client subcommands                                                                          */
/* ------------------------------------------------------------------------------------------ */

static int exit_for(tdist_status_t st) {
  return st == TDIST_ERR_TIMEOUT ? EXIT_TIMEOUT : EXIT_ERROR;
}

static int op_failed(const char *cmd, tdist_store_t *s, tdist_status_t st) {
  const char *detail = tdist_store_last_error(s);
  fprintf(stderr, "tdist-store: %s: %s%s%s\n", cmd, tdist_strerror(st),
          detail && *detail ? ": " : "", detail ? detail : "");
  return exit_for(st);
}

/* Reads all of stdin (for `set KEY -`). */
static int read_stdin(void **out, size_t *out_len) {
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  if (buf == NULL) return -ENOMEM;
  for (;;) {
    if (len == cap) {
      if (cap >= MAX_STDIN_VALUE) {
        free(buf);
        return -EFBIG;
      }
      cap *= 2;
      char *nb = realloc(buf, cap);
      if (nb == NULL) {
        free(buf);
        return -ENOMEM;
      }
      buf = nb;
    }
    ssize_t r = read(STDIN_FILENO, buf + len, cap - len);
    if (r == 0) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = -errno;
      free(buf);
      return err;
    }
    len += (size_t)r;
  }
  *out = buf;
  *out_len = len;
  return 0;
}

static int write_all_stdout(const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(STDOUT_FILENO, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

typedef enum { OP_SET, OP_GET, OP_ADD, OP_WAIT, OP_DELETE, OP_NUM_KEYS } client_op_t;

/* The positional arguments op takes: 0, or the usage error's exit status. */
static int check_arg_count(const char *cmd, client_op_t op, int npos, const char *const *pos) {
  switch (op) {
    case OP_SET:
      if (npos != 2) return usage_error("set: expected KEY VALUE, got %d argument(s)", npos);
      break;
    case OP_GET:
    case OP_DELETE:
      if (npos != 1) return usage_error("%s: expected KEY, got %d argument(s)", cmd, npos);
      break;
    case OP_ADD:
      if (npos != 2) return usage_error("add: expected KEY DELTA, got %d argument(s)", npos);
      break;
    case OP_WAIT:
      if (npos < 1) return usage_error("wait: expected at least one KEY");
      break;
    case OP_NUM_KEYS:
      if (npos != 0) return usage_error("num-keys: unexpected argument '%s'", pos[0]);
      break;
  }
  return 0;
}

/* The client flags into *opts: 0, or the usage error's exit status. */
static int client_options(const char *host, const char *port_s, const char *timeout_s,
                          const char *dialect_s, tdist_tcp_store_options_t *opts) {
  opts->host = host && *host ? host : DEFAULT_CLIENT_HOST;
  opts->port = DEFAULT_PORT;
  uint64_t v;
  if (port_s) {
    if (parse_u64(port_s, 0, 1, 65535, &v) != 0) {
      return usage_error("--port: '%s' is not a port number (1..65535)", port_s);
    }
    opts->port = (int)v;
  }
  int64_t timeout_ms = DEFAULT_TIMEOUT_MS;
  if (timeout_s) {
    if (parse_u64(timeout_s, 0, 1, INT64_MAX / 1000000, &v) != 0) {
      return usage_error("--timeout-ms: '%s' is not a positive number of milliseconds", timeout_s);
    }
    timeout_ms = (int64_t)v;
  }
  opts->connect_timeout_ms = timeout_ms;
  opts->timeout_ms = timeout_ms;
  if (dialect_s) {
    if (strcmp(dialect_s, "auto") == 0) {
      opts->dialect = TDIST_STORE_DIALECT_AUTO;
    } else if (strcmp(dialect_s, "v2") == 0 || strcmp(dialect_s, "2") == 0) {
      opts->dialect = TDIST_STORE_DIALECT_V2;
    } else if (strcmp(dialect_s, "v1.13") == 0 || strcmp(dialect_s, "1.13") == 0) {
      opts->dialect = TDIST_STORE_DIALECT_V1_13;
    } else {
      return usage_error("--dialect: '%s' is not one of auto, v2, v1.13", dialect_s);
    }
  }
  return 0;
}

static int cmd_client(const char *cmd, client_op_t op, int argc, char **argv) {
  const char *host = NULL, *port_s = NULL, *timeout_s = NULL, *dialect_s = NULL;
  const flag_t flags[] = {
      {"--host", 1, &host},
      {"--port", 1, &port_s},
      {"--timeout-ms", 1, &timeout_s},
      {"--dialect", 1, &dialect_s},
  };
  const char *pos[argc > 0 ? argc : 1];
  int npos = 0;
  int rc = parse_args(cmd, argc, argv, flags, sizeof flags / sizeof flags[0], pos, &npos);
  if (rc != 0) return rc;

  /* Check the argument count before connecting, so usage errors never wait on the network. */
  rc = check_arg_count(cmd, op, npos, pos);
  if (rc != 0) return rc;
  int64_t delta = 0;
  if (op == OP_ADD && parse_i64(pos[1], &delta) != 0) {
    return usage_error("add: DELTA '%s' is not a signed 64-bit integer", pos[1]);
  }

  tdist_tcp_store_options_t opts = TDIST_TCP_STORE_OPTIONS_INIT;
  rc = client_options(host, port_s, timeout_s, dialect_s, &opts);
  if (rc != 0) return rc;

  void *stdin_value = NULL;
  size_t stdin_len = 0;
  if (op == OP_SET && strcmp(pos[1], "-") == 0) {
    int err = read_stdin(&stdin_value, &stdin_len);
    if (err != 0) {
      fprintf(stderr, "tdist-store: set: cannot read the value from stdin: %s\n", strerror(-err));
      return EXIT_ERROR;
    }
  }

  signal(SIGPIPE, SIG_IGN);
  tdist_store_t *s = NULL;
  tdist_status_t st = tdist_tcp_store_connect(&opts, &s);
  if (st != TDIST_OK) {
    fprintf(stderr, "tdist-store: %s: cannot connect to %s:%d: %s: %s\n", cmd, opts.host, opts.port,
            tdist_strerror(st), tdist_last_error());
    free(stdin_value);
    return exit_for(st);
  }

  rc = EXIT_OK;
  switch (op) {
    case OP_SET: {
      const void *val = stdin_value ? stdin_value : pos[1];
      size_t len = stdin_value ? stdin_len : strlen(pos[1]);
      st = tdist_store_set(s, pos[0], val, len);
      if (st != TDIST_OK) rc = op_failed(cmd, s, st);
      break;
    }
    case OP_GET: {
      void *val = NULL;
      size_t len = 0;
      st = tdist_store_get(s, pos[0], &val, &len);
      if (st != TDIST_OK) {
        rc = op_failed(cmd, s, st);
        break;
      }
      int err = write_all_stdout(val, len);
      tdist_free(val);
      if (err != 0) {
        fprintf(stderr, "tdist-store: get: writing to stdout: %s\n", strerror(-err));
        rc = EXIT_ERROR;
      }
      break;
    }
    case OP_ADD: {
      int64_t result = 0;
      st = tdist_store_add(s, pos[0], delta, &result);
      if (st != TDIST_OK)
        rc = op_failed(cmd, s, st);
      else
        printf("%" PRId64 "\n", result);
      break;
    }
    case OP_WAIT:
      st = tdist_store_wait(s, pos, (size_t)npos, -1);
      if (st != TDIST_OK) rc = op_failed(cmd, s, st);
      break;
    case OP_DELETE: {
      int deleted = 0;
      st = tdist_store_delete_key(s, pos[0], &deleted);
      if (st != TDIST_OK)
        rc = op_failed(cmd, s, st);
      else
        printf("%d\n", deleted ? 1 : 0);
      break;
    }
    case OP_NUM_KEYS: {
      int64_t n = 0;
      st = tdist_store_num_keys(s, &n);
      if (st != TDIST_OK)
        rc = op_failed(cmd, s, st);
      else
        printf("%" PRId64 "\n", n);
      break;
    }
  }
  tdist_store_destroy(s);
  free(stdin_value);
  if (fflush(stdout) != 0 && rc == EXIT_OK) {
    fprintf(stderr, "tdist-store: %s: writing to stdout: %s\n", cmd, strerror(errno));
    rc = EXIT_ERROR;
  }
  return rc;
}

/* ------------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage_text, stderr);
    return EXIT_USAGE;
  }
  const char *cmd = argv[1];
  int rest_c = argc - 2;
  char **rest_v = argv + 2;
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    fputs(usage_text, stdout);
    return EXIT_OK;
  }
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
    printf("tdist-store %s\n", tdist_version());
    return EXIT_OK;
  }
  /* `tdist-store get --help` also helps, rather than failing on an unknown flag. */
  for (int i = 0; i < rest_c && strcmp(rest_v[i], "--") != 0; i++) {
    if (strcmp(rest_v[i], "--help") == 0 || strcmp(rest_v[i], "-h") == 0) {
      fputs(usage_text, stdout);
      return EXIT_OK;
    }
  }
  /* libtdist's TDIST_* parameters this program reads (runtime/common/param.h): a bad one stops it
   */
  const char *bad = tdist__param_error(TDIST__P_LOG_LEVEL);
  if (bad) return usage_error("%s", bad);
  if (strcmp(cmd, "serve") == 0) return cmd_serve(rest_c, rest_v);
  if (strcmp(cmd, "proxy") == 0) return cmd_proxy(rest_c, rest_v);
  if (strcmp(cmd, "set") == 0) return cmd_client(cmd, OP_SET, rest_c, rest_v);
  if (strcmp(cmd, "get") == 0) return cmd_client(cmd, OP_GET, rest_c, rest_v);
  if (strcmp(cmd, "add") == 0) return cmd_client(cmd, OP_ADD, rest_c, rest_v);
  if (strcmp(cmd, "wait") == 0) return cmd_client(cmd, OP_WAIT, rest_c, rest_v);
  if (strcmp(cmd, "delete") == 0) return cmd_client(cmd, OP_DELETE, rest_c, rest_v);
  if (strcmp(cmd, "num-keys") == 0) return cmd_client(cmd, OP_NUM_KEYS, rest_c, rest_v);
  return usage_error("unknown subcommand '%s'", cmd);
}

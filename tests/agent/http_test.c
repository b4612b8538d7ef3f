/* Tests of the agent's HTTP server and renderers (operator-agent/http) over real sockets.
 *
 * A server on 127.0.0.1:0 serves an agent_state_t filled with random values; a plain socket
 * client checks status codes and headers of every path and method, /healthz against a stale loop
 * tick, /readyz before and after ready, /status through Python's json module, /metrics through
 * `promtool check metrics` and by parsing every expected sample, and that 200 silent or half-sent
 * connections do not keep /healthz from answering. The escapers are checked against Python's
 * UTF-8 decoder with random bytes. promtool and python3 are required (CI installs them): their
 * absence fails the test with a message, never skips it.
 * Set TDIST_TEST_SEED to replay a run; the seed is printed at start. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <tdist/tdist.h>

#include "check.h"
#include "clock.h"
#include "rng.h"
#include "http_testlib.h"
#include "operator-agent/http/buf.h"
#include "operator-agent/http/http.h"

/* ---- state ----------------------------------------------------------------------------------- */

#define NOBS 40
static double g_obs[NOBS];

static void fill_state(agent_state_t *st) {
  agent_state_lock(st);
  st->start_time_unix = (double)time(NULL);
  st->node_rank = (int)rnd_below(64);
  st->nproc_per_node = 3 + (int)rnd_below(6);
  st->nnodes_min = 1;
  st->nnodes_max = 64;
  snprintf(st->run_id, sizeof st->run_id, "job-\"%u\"", (unsigned)rnd_below(100000));
  snprintf(st->role, sizeof st->role, "trainer");
  snprintf(st->backend, sizeof st->backend, "gloo");
  st->is_store_host = 0;
  st->loop_tick_ns = now_ns();
  st->ready = 1;
  st->state = (agent_run_state_t)rnd_below(AGENT_NSTATES);
  st->round = (int64_t)rnd_below(1000);
  st->restart_count = (int)rnd_below(10);
  st->max_restarts = 10 + (int)rnd_below(10);
  st->nmembers = 2 + (int)rnd_below(5);
  st->group_world_size = st->nmembers;
  st->group_rank = (int)rnd_below((uint64_t)st->nmembers);
  st->world_size = st->nmembers * st->nproc_per_node;
  snprintf(st->master_addr, sizeof st->master_addr, "job-node-0-0.job");
  st->master_port = 1024 + (int)rnd_below(60000);
  st->worker_master_port = 1024 + (int)rnd_below(60000);
  st->members = calloc((size_t)st->nmembers, sizeof *st->members);
  CHECK(st->members != NULL);
  for (int i = 0; i < st->nmembers; i++) {
    st->members[i].node_rank = (int)rnd_below(64);
    st->members[i].group_rank = i;
    snprintf(st->members[i].addr, sizeof st->members[i].addr, "10.%u.%u.%u",
             (unsigned)rnd_below(256), (unsigned)rnd_below(256), (unsigned)rnd_below(256));
    snprintf(st->members[i].host, sizeof st->members[i].host, i == 1 ? "pod\\\"%d\"" : "pod-%d", i);
  }
  st->spares = (int)rnd_below(4);
  st->nstandbys = st->spares ? (int)rnd_below((uint64_t)st->spares + 1) : 0;
  st->standbys_live = st->nstandbys ? (int)rnd_below((uint64_t)st->nstandbys + 1) : 0;
  st->standbys = calloc((size_t)st->nstandbys + 1, sizeof *st->standbys);
  CHECK(st->standbys != NULL);
  for (int i = 0; i < st->nstandbys; i++) {
    st->standbys[i].node_rank = 64 + i;
    st->standbys[i].group_rank = -1;
    snprintf(st->standbys[i].addr, sizeof st->standbys[i].addr, "10.9.%u.%d",
             (unsigned)rnd_below(256), i);
    snprintf(st->standbys[i].host, sizeof st->standbys[i].host, "spare\"-%d", i);
  }
  st->nworkers = st->nproc_per_node;
  st->workers = calloc((size_t)st->nworkers, sizeof *st->workers);
  CHECK(st->workers != NULL);
  for (int i = 0; i < st->nworkers; i++) {
    agent_worker_info_t *w = &st->workers[i];
    w->local_rank = i;
    w->global_rank = st->group_rank * st->nproc_per_node + i;
    w->state = (agent_worker_state_t)(i < AGENT_WORKER_NSTATES ? (uint64_t)i : rnd_below(5));
    w->pid = w->state == AGENT_WORKER_PENDING ? 0 : 100 + (pid_t)rnd_below(30000);
    w->exit_code = w->state == AGENT_WORKER_SUCCEEDED ? 0
                   : w->state == AGENT_WORKER_FAILED  ? 1 + (int)rnd_below(120)
                   : w->state == AGENT_WORKER_STOPPED ? -15
                                                      : 0;
  }
  for (int i = 0; i < AGENT_RESTART_NREASONS; i++) st->restarts_total[i] = rnd_below(1ull << 40);
  for (int i = 0; i < 3; i++) st->worker_exits_total[i] = rnd_below(1ull << 40);
  for (int i = 0; i < NOBS; i++) {
    /* Hit bucket bounds exactly sometimes: le is inclusive. */
    g_obs[i] = rnd_below(4) == 0 ? agent_rdzv_bucket_le[rnd_below(AGENT_RDZV_BUCKETS)]
                                 : (double)rnd_below(200000) / 1000.0;
    agent_state_observe_rdzv(st, g_obs[i]);
  }
  st->rendezvous_failures_total = rnd_below(1000);
  st->dns_resolve_failures_total = rnd_below(1ull << 40);
  st->store_reconnects_total = rnd_below(1000);
  st->last_rendezvous_unix = (double)time(NULL) - 1.5;
  snprintf(st->last_error, sizeof st->last_error,
           "worker 3 failed: \"boom\" at C:\\tmp\nline2\ttab\x01 caf\xc3\xa9 \xe2\x82\xac "
           "\xf0\x9f\x98\x80");
  agent_state_unlock(st);
}

/* ---- /metrics ----------------------------------------------------------------------------- */

static void check_metrics_values(const char *body, agent_state_t *st) {
  char key[256];
  agent_state_lock(st);
  snprintf(key, sizeof key, "tdist_build_info{version=\"%s\",revision=\"unknown\"}",
           tdist_version());
  prom_check(body, key, 1);
  for (int i = 0; i < AGENT_NSTATES; i++) {
    snprintf(key, sizeof key, "tdist_agent_state{state=\"%s\"}",
             agent_run_state_name((agent_run_state_t)i));
    prom_check(body, key, (int)st->state == i);
  }
  prom_check(body, "tdist_node_rank", st->node_rank);
  prom_check(body, "tdist_group_rank", st->group_rank);
  prom_check(body, "tdist_group_world_size", st->group_world_size);
  prom_check(body, "tdist_world_size", st->world_size);
  prom_check(body, "tdist_nproc_per_node", st->nproc_per_node);
  prom_check(body, "tdist_rendezvous_round", (double)st->round);
  prom_check(body, "tdist_restart_attempt", st->restart_count);
  prom_check(body, "tdist_max_restarts", st->max_restarts);
  prom_check(body, "tdist_spares", st->spares);
  if (st->is_store_host)
    prom_check(body, "tdist_standbys", st->standbys_live);
  else
    CHECK(strstr(body, "\ntdist_standbys ") == NULL);
  for (int s = 0; s < AGENT_WORKER_NSTATES; s++) {
    int n = 0;
    for (int i = 0; i < st->nworkers; i++) n += (int)st->workers[i].state == s;
    snprintf(key, sizeof key, "tdist_workers{state=\"%s\"}",
             agent_worker_state_name((agent_worker_state_t)s));
    prom_check(body, key, n);
  }
  static const char *const cls[3] = {"zero", "nonzero", "signal"};
  for (int i = 0; i < 3; i++) {
    snprintf(key, sizeof key, "tdist_worker_exits_total{code_class=\"%s\"}", cls[i]);
    prom_check(body, key, (double)st->worker_exits_total[i]);
  }
  for (int i = 0; i < AGENT_RESTART_NREASONS; i++) {
    snprintf(key, sizeof key, "tdist_restarts_total{reason=\"%s\"}",
             agent_restart_reason_name((agent_restart_reason_t)i));
    prom_check(body, key, (double)st->restarts_total[i]);
  }
  prom_check(body, "tdist_rendezvous_total", (double)st->rendezvous_total);
  prom_check(body, "tdist_rendezvous_failures_total", (double)st->rendezvous_failures_total);
  /* Buckets recomputed from the observations, independently of state.c. */
  static const char *const le[AGENT_RDZV_BUCKETS] = {"0.01", "0.05", "0.1", "0.25", "0.5", "1",
                                                     "2.5",  "5",    "10",  "30",   "60",  "120"};
  double sum = 0;
  for (int i = 0; i < NOBS; i++) sum += g_obs[i];
  for (int b = 0; b < AGENT_RDZV_BUCKETS; b++) {
    int n = 0;
    for (int i = 0; i < NOBS; i++) n += g_obs[i] <= strtod(le[b], NULL);
    snprintf(key, sizeof key, "tdist_rendezvous_duration_seconds_bucket{le=\"%s\"}", le[b]);
    prom_check(body, key, n);
  }
  prom_check(body, "tdist_rendezvous_duration_seconds_bucket{le=\"+Inf\"}", NOBS);
  prom_check(body, "tdist_rendezvous_duration_seconds_count", NOBS);
  CHECK(fabs(prom_value(body, "tdist_rendezvous_duration_seconds_sum") - sum) < 1e-6);
  CHECK_EQ_INT(st->rendezvous_total, NOBS);
  if (st->last_rendezvous_unix > 0)
    prom_check(body, "tdist_last_rendezvous_timestamp_seconds", st->last_rendezvous_unix);
  else
    CHECK(strstr(body, "tdist_last_rendezvous_timestamp_seconds") == NULL);
  prom_check(body, "tdist_dns_resolve_failures_total", (double)st->dns_resolve_failures_total);
  prom_check(body, "tdist_store_reconnects_total", (double)st->store_reconnects_total);
  int has_store = st->store_server != NULL;
  agent_state_unlock(st);
  if (!has_store) CHECK(strstr(body, "tdist_store_requests_total") == NULL);
  CHECK(strstr(body, "pod=") == NULL && strstr(body, "namespace=") == NULL);

  /* process_*: plausible values from /proc. */
  CHECK(prom_value(body, "process_cpu_seconds_total") >= 0);
  CHECK(prom_value(body, "process_open_fds") >= 3);
  struct rlimit rl;
  CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
  if (rl.rlim_cur != RLIM_INFINITY) prom_check(body, "process_max_fds", (double)rl.rlim_cur);
  CHECK(prom_value(body, "process_virtual_memory_bytes") > 1e6);
  CHECK(prom_value(body, "process_resident_memory_bytes") > 1e5);
  double start = prom_value(body, "process_start_time_seconds");
  CHECK(start > (double)time(NULL) - 3600 && start <= (double)time(NULL) + 1);
  CHECK(prom_value(body, "process_threads") >= 2); /* main + the server thread */
}

/* ---- /status ------------------------------------------------------------------------------ */

static const char kStatusPy[] =
    "import json, sys\n"
    "d = json.load(open(sys.argv[1], encoding='utf-8'))\n"
    "def h(s):\n"
    "    assert s is None or type(s) is str, s\n"
    "    return 'null' if s is None else 'x' + s.encode('utf-8').hex()\n"
    "def i(v):\n"
    "    assert type(v) is int, v\n"
    "    return str(v)\n"
    "print('keys', ','.join(d.keys()))\n"
    "for k in ('node_rank', 'round', 'restart_count', 'max_restarts', 'group_rank',\n"
    "          'group_world_size', 'world_size', 'master_port', 'worker_master_port'):\n"
    "    print(k, i(d[k]))\n"
    "assert type(d['is_store_host']) is bool\n"
    "print('is_store_host', int(d['is_store_host']))\n"
    "for k in ('state', 'run_id', 'role', 'backend', 'master_addr', 'last_error'):\n"
    "    print(k, h(d[k]))\n"
    "for m in d['members']:\n"
    "    print('member', ','.join(m.keys()), i(m['node_rank']), i(m['group_rank']), h(m['addr']),"
    " h(m['host']))\n"
    "print('spares', i(d['spares']))\n"
    "print('standbys_live', 'null' if d['standbys_live'] is None else i(d['standbys_live']))\n"
    "for m in d['standbys']:\n"
    "    print('standby', ','.join(m.keys()), i(m['node_rank']), h(m['addr']), h(m['host']))\n"
    "for w in d['workers']:\n"
    "    e = w['exit_code']\n"
    "    print('worker', ','.join(w.keys()), i(w['local_rank']), i(w['global_rank']),"
    " i(w['pid']), h(w['state']), 'null' if e is None else i(e))\n";

static void hexs(char *out, size_t cap, const char *s) {
  size_t n = 0;
  n += (size_t)snprintf(out + n, cap - n, "x");
  for (; *s && n + 3 < cap; s++) n += (size_t)snprintf(out + n, cap - n, "%02x", (unsigned char)*s);
}

static void check_status_json(const char *body, size_t len, agent_state_t *st) {
  char file[512];
  snprintf(file, sizeof file, "%s/status.json", test_tmpdir());
  test_write_file(file, body, len);
  char *got = test_python("status_check.py", kStatusPy, file);

  agent_buf_t want;
  agent_buf_init(&want);
  char hx[2048];
  agent_state_lock(st);
  agent_buf_puts(
      &want,
      "keys state,node_rank,run_id,role,backend,round,restart_count,max_restarts,"
      "group_rank,group_world_size,world_size,master_addr,master_port,worker_master_port,"
      "is_store_host,"
      "members,spares,standbys_live,standbys,workers,last_error,ranks,collectives,hang,"
      "gpu_monitoring\n");
  agent_buf_printf(&want,
                   "node_rank %d\nround %lld\nrestart_count %d\nmax_restarts %d\ngroup_rank %d\n"
                   "group_world_size %d\nworld_size %d\nmaster_port %d\nworker_master_port %d\n"
                   "is_store_host %d\n",
                   st->node_rank, (long long)st->round, st->restart_count, st->max_restarts,
                   st->group_rank, st->group_world_size, st->world_size, st->master_port,
                   st->worker_master_port, st->is_store_host);
  hexs(hx, sizeof hx, agent_run_state_name(st->state));
  agent_buf_printf(&want, "state %s\n", hx);
  hexs(hx, sizeof hx, st->run_id);
  agent_buf_printf(&want, "run_id %s\n", hx);
  hexs(hx, sizeof hx, st->role);
  agent_buf_printf(&want, "role %s\n", hx);
  hexs(hx, sizeof hx, st->backend);
  agent_buf_printf(&want, "backend %s\n", hx);
  hexs(hx, sizeof hx, st->master_addr);
  agent_buf_printf(&want, "master_addr %s\n", hx);
  hexs(hx, sizeof hx, st->last_error);
  agent_buf_printf(&want, "last_error %s\n", st->last_error[0] ? hx : "null");
  for (int i = 0; i < st->nmembers; i++) {
    const agent_member_info_t *m = &st->members[i];
    char ha[256], hh[256];
    hexs(ha, sizeof ha, m->addr);
    hexs(hh, sizeof hh, m->host);
    agent_buf_printf(&want, "member node_rank,group_rank,addr,host %d %d %s %s\n", m->node_rank,
                     m->group_rank, ha, hh);
  }
  agent_buf_printf(&want, "spares %d\n", st->spares);
  if (st->is_store_host)
    agent_buf_printf(&want, "standbys_live %d\n", st->standbys_live);
  else
    agent_buf_puts(&want, "standbys_live null\n");
  for (int i = 0; i < st->nstandbys; i++) {
    const agent_member_info_t *m = &st->standbys[i];
    char ha[256], hh[256];
    hexs(ha, sizeof ha, m->addr);
    hexs(hh, sizeof hh, m->host);
    agent_buf_printf(&want, "standby node_rank,addr,host %d %s %s\n", m->node_rank, ha, hh);
  }
  for (int i = 0; i < st->nworkers; i++) {
    const agent_worker_info_t *w = &st->workers[i];
    hexs(hx, sizeof hx, agent_worker_state_name(w->state));
    /* The documented rule: a number once the worker was started and has exited. */
    int exited = w->pid > 0 && w->state != AGENT_WORKER_PENDING && w->state != AGENT_WORKER_RUNNING;
    char code[32] = "null";
    if (exited) snprintf(code, sizeof code, "%d", w->exit_code);
    agent_buf_printf(&want, "worker local_rank,global_rank,pid,state,exit_code %d %d %d %s %s\n",
                     w->local_rank, w->global_rank, (int)w->pid, hx, code);
  }
  agent_state_unlock(st);
  char *w = agent_buf_finish(&want, NULL);
  CHECK(w != NULL);
  if (strcmp(got, w) != 0) {
    fprintf(stderr, "/status parsed by Python:\n%s\nwant:\n%s\nbody:\n%s\n", got, w, body);
    exit(1);
  }
  free(w);
  free(got);
}

/* ---- escapers against Python's UTF-8 decoder ------------------------------------------------- */

static const char kEscapePy[] =
    "import json, sys\n"
    "n = 0\n"
    "for line in open(sys.argv[1], 'rb'):\n"
    "    rawhex, js, pl = line.rstrip(b'\\n').split(b'\\t')\n"
    "    raw = bytes.fromhex(rawhex.decode()[1:])\n"
    "    want = raw.decode('utf-8', 'replace')\n"
    "    got = json.loads(js.decode('utf-8'))\n"
    "    assert got == want, (raw, js, got, want)\n"
    "    s, out, i = pl.decode('utf-8'), [], 0\n"
    "    while i < len(s):\n"
    "        c = s[i]\n"
    "        if c == '\\\\':\n"
    "            out.append({'\\\\': '\\\\', '\"': '\"', 'n': '\\n'}[s[i + 1]]); i += 2\n"
    "        else:\n"
    "            assert c not in '\"\\n', (raw, pl)\n"
    "            out.append(c); i += 1\n"
    "    want2 = ''.join(' ' if (ord(ch) < 32 and ch != '\\n') or ch == '\\x7f' else ch\n"
    "                    for ch in want)\n"
    "    assert ''.join(out) == want2, (raw, pl, want2)\n"
    "    n += 1\n"
    "print('ok', n)\n";

static void test_escapers(void) {
  /* Fixed cases first. */
  agent_buf_t b;
  agent_buf_init(&b);
  agent_buf_prom_label(&b, "a\"b\\c\nd\te");
  char *s = agent_buf_finish(&b, NULL);
  CHECK(s && !strcmp(s, "a\\\"b\\\\c\\nd e"));
  free(s);
  agent_buf_json_str(&b, "q\"\\\n\x01\xff", 64);
  s = agent_buf_finish(&b, NULL);
  CHECK(s && !strcmp(s, "\"q\\\"\\\\\\n\\u0001\xef\xbf\xbd\""));
  free(s);
  static const double dv[] = {0, 1, 0.1, 2.5, 120, 1e21, 1733150000.25, -3, 1e16, 0.0001, 1e-7};
  static const char *const ds[] = {
      "0",      "1",    "0.1", "2.5", "120", "1e+21", "1733150000.25", "-3", "10000000000000000",
      "0.0001", "1e-07"};
  for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) {
    agent_buf_double(&b, dv[i]);
    s = agent_buf_finish(&b, NULL);
    if (!s || strcmp(s, ds[i]))
      fprintf(stderr, "double %.17g -> \"%s\"\n", dv[i], s ? s : "(null)");
    CHECK(s && !strcmp(s, ds[i]));
    free(s);
  }

  /* Random bytes: JSON must decode to Python's decoding of the bytes; the label value must
   * unescape to it with control characters as spaces; promtool must accept every label. */
  static const char *const pieces[] = {"\"",
                                       "\\",
                                       "\n",
                                       "\t",
                                       "\r",
                                       "\x7f",
                                       "\xc3\xa9",
                                       "\xe2\x82\xac",
                                       "\xf0\x9f\x98\x80",
                                       "\xc3",
                                       "\xe2\x82",
                                       "\xf0\x9f\x98",
                                       "\xed\xa0\x80",
                                       "\xc0\xaf",
                                       "\xf5",
                                       "\xff",
                                       "a",
                                       "Z",
                                       " ",
                                       "{",
                                       "}",
                                       "=",
                                       ","};
  agent_buf_t lines, prom;
  agent_buf_init(&lines);
  agent_buf_init(&prom);
  agent_buf_puts(&prom, "# HELP tdist_escape_test Label escaping.\n");
  agent_buf_puts(&prom, "# TYPE tdist_escape_test gauge\n");
  for (int i = 0; i < 300; i++) {
    char raw[256] = "";
    size_t n = 0;
    int parts = (int)rnd_below(12);
    for (int p = 0; p < parts; p++) {
      char one[8];
      if (rnd_below(3) == 0) {
        one[0] = (char)(1 + rnd_below(255));
        one[1] = '\0';
      } else {
        snprintf(one, sizeof one, "%s", pieces[rnd_below(sizeof pieces / sizeof pieces[0])]);
      }
      size_t l = strlen(one);
      if (n + l + 1 > sizeof raw) break;
      memcpy(raw + n, one, l + 1);
      n += l;
    }
    char hx[600];
    hexs(hx, sizeof hx, raw);
    agent_buf_printf(&lines, "%s\t", hx);
    agent_buf_json_str(&lines, raw, sizeof raw);
    agent_buf_puts(&lines, "\t");
    agent_buf_prom_label(&lines, raw);
    agent_buf_puts(&lines, "\n");
    agent_buf_printf(&prom, "tdist_escape_test{i=\"%d\",v=\"", i);
    agent_buf_prom_label(&prom, raw);
    agent_buf_printf(&prom, "\"} %d\n", i);
  }
  size_t len;
  char *text = agent_buf_finish(&lines, &len);
  CHECK(text != NULL);
  char file[512];
  snprintf(file, sizeof file, "%s/escapes.txt", test_tmpdir());
  test_write_file(file, text, len);
  free(text);
  char *out = test_python("escape_check.py", kEscapePy, file);
  CHECK(!strcmp(out, "ok 300\n"));
  free(out);
  text = agent_buf_finish(&prom, &len);
  CHECK(text != NULL);
  test_promtool_check(text, len, "escapes");
  free(text);

  /* The bound: appends past AGENT_BUF_MAX fail the whole buffer instead of growing. */
  char *big = malloc(1 << 20);
  CHECK(big != NULL);
  memset(big, 'x', 1 << 20);
  for (int i = 0; i < 17; i++) agent_buf_put(&b, big, 1 << 20);
  CHECK(b.failed);
  CHECK(agent_buf_finish(&b, &len) == NULL && len == 0);
  free(big);
}

/* ---- server tests ---------------------------------------------------------------------------- */

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  CHECK(d != NULL);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;
}

static void set_tick_age(agent_state_t *st, double age_s) {
  agent_state_lock(st);
  st->loop_tick_ns = now_ns() - (int64_t)(age_s * 1e9);
  agent_state_unlock(st);
}

static void test_paths_and_methods(int port) {
  static const char *const paths[] = {"/", "/healthz", "/readyz", "/metrics", "/status"};
  static const char *const ctypes[] = {
      "text/html; charset=utf-8", "text/plain; charset=utf-8", "text/plain; charset=utf-8",
      "text/plain; version=0.0.4; charset=utf-8", "application/json"};
  static const char *const other[] = {"POST", "PUT", "DELETE", "PATCH", "OPTIONS"};
  http_resp_t r;
  for (size_t i = 0; i < 5; i++) {
    http_expect(port, "GET", paths[i], 200, &r);
    http_check_header(&r, "Content-Type", ctypes[i]);
    http_check_header(&r, "Cache-Control", "no-store");
    CHECK(r.body_len > 0);
    size_t get_len = r.body_len;
    http_resp_free(&r);
    http_expect(port, "HEAD", paths[i], 200, &r);
    http_check_header(&r, "Content-Type", ctypes[i]);
    char *cl = http_header(&r, "Content-Length");
    /* /metrics and /status change between two renders (process_*, nothing else here). */
    if (i != 3) CHECK_EQ_INT(strtoull(cl, NULL, 10), get_len);
    free(cl);
    http_resp_free(&r);
    for (size_t m = 0; m < 5; m++) {
      http_expect(port, other[m], paths[i], 405, &r);
      http_check_header(&r, "Allow", "GET, HEAD");
      http_resp_free(&r);
    }
  }
  http_expect(port, "GET", "/", 200, &r);
  CHECK(strstr(r.body, "href=\"/metrics\"") != NULL);
  http_resp_free(&r);

  static const char *const unknown[] = {"/nope",      "/metrics/", "/metricsx",
                                        "/healthz/x", "//",        "/STATUS"};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    http_expect(port, "GET", unknown[i], 404, &r);
    http_resp_free(&r);
    http_expect(port, "POST", unknown[i], 404, &r); /* an unknown path is 404 for any method */
    http_resp_free(&r);
  }
  http_expect(port, "GET", "/metrics?name[]=x&y", 200, &r); /* the query is ignored */
  http_resp_free(&r);

  /* HTTP/1.0, and a GET that carries a body (ignored). */
  static const char v10[] = "GET /healthz HTTP/1.0\r\n\r\n";
  http_request_raw(AF_INET, port, v10, sizeof v10 - 1, &r);
  CHECK_EQ_INT(r.status, 200);
  http_resp_free(&r);
  static const char withbody[] =
      "GET /status HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello";
  http_request_raw(AF_INET, port, withbody, sizeof withbody - 1, &r);
  CHECK_EQ_INT(r.status, 200);
  CHECK(r.body[0] == '{');
  http_resp_free(&r);
  /* Keep-alive: two requests on one connection, both answered. */
  static const char two[] =
      "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /readyz HTTP/1.1\r\nHost: t\r\n"
      "Connection: close\r\n\r\n";
  http_request_raw(AF_INET, port, two, sizeof two - 1, &r);
  CHECK_EQ_INT(r.status, 200);
  if (!strstr(r.body, "HTTP/1.1 200")) fprintf(stderr, "pipelined answer:\n%s\n", r.raw);
  CHECK(strstr(r.body, "HTTP/1.1 200") != NULL);
  http_resp_free(&r);
}

static void test_healthz(agent_state_t *st, int port_fast, int port_slow) {
  /* port_fast: monitor interval 0.1 s -> limit max(10, 2) = 10 s; port_slow: 1 s -> 20 s. */
  http_resp_t r;
  set_tick_age(st, 0);
  http_expect(port_fast, "GET", "/healthz", 200, &r);
  CHECK(!strcmp(r.body, "ok\n"));
  http_resp_free(&r);
  set_tick_age(st, 11);
  http_expect(port_fast, "GET", "/healthz", 503, &r);
  CHECK(strstr(r.body, "last ticked 11.") != NULL && strstr(r.body, "limit 10.0 s") != NULL);
  http_resp_free(&r);
  http_expect(port_fast, "HEAD", "/healthz", 503, &r);
  http_resp_free(&r);
  http_expect(port_slow, "GET", "/healthz", 200, &r);
  http_resp_free(&r);
  set_tick_age(st, 21);
  http_expect(port_slow, "GET", "/healthz", 503, &r);
  CHECK(strstr(r.body, "limit 20.0 s") != NULL);
  http_resp_free(&r);
  agent_state_lock(st);
  st->loop_tick_ns = 0;
  agent_state_unlock(st);
  http_expect(port_fast, "GET", "/healthz", 503, &r);
  CHECK(strstr(r.body, "not ticked yet") != NULL);
  http_resp_free(&r);
  set_tick_age(st, 0);
  http_expect(port_fast, "GET", "/healthz", 200, &r);
  http_resp_free(&r);
  /* Health never depends on the state: a failed agent is still alive. */
  agent_state_lock(st);
  agent_run_state_t old = st->state;
  st->state = AGENT_STATE_FAILED;
  agent_state_unlock(st);
  http_expect(port_fast, "GET", "/healthz", 200, &r);
  http_resp_free(&r);
  agent_state_lock(st);
  st->state = old;
  agent_state_unlock(st);
}

static void test_readyz(agent_state_t *st, int port, tdist_store_server_t *srv) {
  http_resp_t r;
  agent_state_lock(st);
  st->ready = 0;
  agent_state_unlock(st);
  http_expect(port, "GET", "/readyz", 503, &r);
  http_resp_free(&r);
  http_expect(port, "GET", "/healthz", 200, &r); /* liveness is independent of readiness */
  http_resp_free(&r);
  agent_state_lock(st);
  st->ready = 1;
  agent_state_unlock(st);
  http_expect(port, "GET", "/readyz", 200, &r);
  CHECK(!strcmp(r.body, "ok\n"));
  http_resp_free(&r);
  /* A store host is ready only once its store listens. */
  agent_state_lock(st);
  st->is_store_host = 1;
  agent_state_unlock(st);
  http_expect(port, "GET", "/readyz", 503, &r);
  CHECK(strstr(r.body, "store") != NULL);
  http_resp_free(&r);
  agent_state_lock(st);
  st->store_server = srv;
  agent_state_unlock(st);
  http_expect(port, "GET", "/readyz", 200, &r);
  http_resp_free(&r);
  /* Readiness never depends on rendezvous or peers. */
  agent_state_lock(st);
  agent_run_state_t old = st->state;
  st->state = AGENT_STATE_RENDEZVOUS;
  agent_state_unlock(st);
  http_expect(port, "GET", "/readyz", 200, &r);
  http_resp_free(&r);
  agent_state_lock(st);
  st->state = old;
  agent_state_unlock(st);
}

static void test_metrics(agent_state_t *st, int port, const char *what) {
  http_resp_t r;
  http_expect(port, "GET", "/metrics", 200, &r);
  http_check_header(&r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  prom_check_structure(r.body, r.body_len);
  check_metrics_values(r.body, st);
  test_promtool_check(r.body, r.body_len, what);
  http_resp_free(&r);
}

static void test_store_metrics(agent_state_t *st, int port, tdist_store_server_t *srv) {
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = tdist_store_server_port(srv);
  tdist_store_t *c = NULL;
  CHECK_OK(tdist_tcp_store_connect(&o, &c));
  int nkeys = 1 + (int)rnd_below(20);
  for (int i = 0; i < nkeys; i++) {
    char k[32];
    snprintf(k, sizeof k, "k%d", i);
    CHECK_OK(tdist_store_set(c, k, "v", 1));
  }
  int64_t n = 0;
  CHECK_OK(tdist_store_num_keys(c, &n)); /* answered: every earlier request has run */
  /* The server publishes its key count after the loop iteration that answered: wait for it. */
  tdist_store_server_stats_t before, after;
  for (int i = 0; i < 5000; i++) {
    tdist_store_server_stats(srv, &before);
    if (before.keys == (uint64_t)n) break;
    usleep(1000);
  }
  http_resp_t r;
  http_expect(port, "GET", "/metrics", 200, &r);
  tdist_store_server_stats(srv, &after);
  if (memcmp(&before, &after, sizeof before)) {
    fprintf(stderr,
            "store stats moved during the scrape: requests %llu->%llu conns %llu->%llu "
            "open %llu->%llu dropped %llu->%llu keys %llu->%llu waits %llu->%llu\n",
            (unsigned long long)before.requests_total, (unsigned long long)after.requests_total,
            (unsigned long long)before.connections_total,
            (unsigned long long)after.connections_total,
            (unsigned long long)before.connections_open, (unsigned long long)after.connections_open,
            (unsigned long long)before.connections_dropped,
            (unsigned long long)after.connections_dropped, (unsigned long long)before.keys,
            (unsigned long long)after.keys, (unsigned long long)before.waits_pending,
            (unsigned long long)after.waits_pending);
    exit(1);
  }
  prom_check(r.body, "tdist_store_requests_total", (double)after.requests_total);
  prom_check(r.body, "tdist_store_connections_total", (double)after.connections_total);
  prom_check(r.body, "tdist_store_clients", (double)after.connections_open);
  prom_check(r.body, "tdist_store_connections_dropped_total", (double)after.connections_dropped);
  prom_check(r.body, "tdist_store_keys", (double)after.keys);
  prom_check(r.body, "tdist_store_waits_pending", (double)after.waits_pending);
  CHECK(after.keys == (uint64_t)n && n >= nkeys);
  CHECK(after.connections_open >= 1);
  prom_check_structure(r.body, r.body_len);
  check_metrics_values(r.body, st);
  test_promtool_check(r.body, r.body_len, "store_host");
  http_resp_free(&r);
  tdist_store_destroy(c);
}

/* 200 connections that send nothing or half a request must not keep /healthz from answering,
 * and the server must eventually drop them (its inactivity timeout). */
static void test_slowloris(agent_state_t *st, int port) {
  enum { N = 200 };
  int fds[N];
  for (int i = 0; i < N; i++) {
    fds[i] = http_connect(AF_INET, port);
    if (i % 2) {
      static const char part[] = "GET /healthz HTTP/1.1\r\nHost: slow\r\nX-Slow: ";
      CHECK(send(fds[i], part, sizeof part - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof part - 1));
    }
  }
  set_tick_age(st, 0);
  http_resp_t r;
  for (int i = 0; i < 5; i++) {
    http_expect(port, "GET", "/healthz", 200, &r);
    http_resp_free(&r);
    http_expect(port, "GET", "/readyz", 200, &r);
    http_resp_free(&r);
  }
  http_expect(port, "GET", "/metrics", 200, &r);
  CHECK(prom_value(r.body, "process_open_fds") >= N);
  http_resp_free(&r);
  /* Every slow connection is closed by the server within its timeout (10 s) plus slack. */
  int64_t deadline = now_ns() + 40 * (int64_t)1000000000;
  for (int i = 0; i < N; i++) {
    struct pollfd p = {fds[i], POLLIN, 0};
    int64_t left_ms = (deadline - now_ns()) / 1000000;
    CHECK(left_ms > 0);
    int rc = poll(&p, 1, (int)left_ms);
    if (rc != 1) {
      fprintf(stderr, "slow connection %d still open after the server's timeout\n", i);
      exit(1);
    }
    char buf[512];
    ssize_t n = recv(fds[i], buf, sizeof buf, MSG_DONTWAIT);
    /* Closed (0 or reset), or for a half request possibly an error answer before the close. */
    CHECK(n == 0 || (n < 0 && errno == ECONNRESET) || (n > 0 && !memcmp(buf, "HTTP/1.", 7)));
    close(fds[i]);
  }
}

/* Scrapes from several threads while the main thread swaps the members and workers arrays under
 * the lock (as the agent's main loop does): asan catches any read of a freed array. */
typedef struct {
  int port;
  int iters;
} scraper_arg_t;

static void *scraper(void *p) {
  scraper_arg_t *a = p;
  for (int i = 0; i < a->iters; i++) {
    http_resp_t r;
    http_request(a->port, "GET", i % 2 ? "/status" : "/metrics", &r);
    CHECK_EQ_INT(r.status, 200);
    http_resp_free(&r);
  }
  return NULL;
}

static void test_concurrent(agent_state_t *st, int port) {
  enum { T = 4 };
  pthread_t th[T];
  scraper_arg_t a = {port, 40};
  for (int i = 0; i < T; i++) CHECK(pthread_create(&th[i], NULL, scraper, &a) == 0);
  for (int k = 0; k < 200; k++) {
    int nm = 1 + (int)rnd_below(8), nw = 1 + (int)rnd_below(8);
    agent_member_info_t *m = calloc((size_t)nm, sizeof *m);
    agent_worker_info_t *w = calloc((size_t)nw, sizeof *w);
    CHECK(m && w);
    for (int i = 0; i < nm; i++) snprintf(m[i].host, sizeof m[i].host, "h%d", i);
    for (int i = 0; i < nw; i++) w[i].state = (agent_worker_state_t)rnd_below(5);
    agent_state_lock(st);
    free(st->members);
    free(st->workers);
    st->members = m;
    st->nmembers = nm;
    st->workers = w;
    st->nworkers = nw;
    st->restarts_total[0]++;
    agent_state_unlock(st);
    usleep(500);
  }
  for (int i = 0; i < T; i++) CHECK(pthread_join(th[i], NULL) == 0);
}

static int have_ipv6(void) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  struct sockaddr_in6 a;
  memset(&a, 0, sizeof a);
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

static void test_bind(agent_state_t *st, int used_port) {
  char err[512];
  CHECK(agent_http_start(st, "127.0.0.1", used_port, 0.1, err, sizeof err) == NULL);
  char want[64];
  snprintf(want, sizeof want, "127.0.0.1:%d", used_port);
  if (!strstr(err, want) || !strstr(err, strerror(EADDRINUSE))) {
    fprintf(stderr, "bind error \"%s\" lacks \"%s\" or the errno text\n", err, want);
    exit(1);
  }
  CHECK(agent_http_start(st, "pod-0.svc", 0, 0.1, err, sizeof err) == NULL);
  CHECK(strstr(err, "\"pod-0.svc\"") && strstr(err, "not an IP address"));
  CHECK(agent_http_start(st, "127.0.0.1", 70000, 0.1, err, sizeof err) == NULL);
  CHECK(strstr(err, "70000") != NULL);
  CHECK(agent_http_start(st, "127.0.0.1", 0, NAN, err, sizeof err) == NULL);
  CHECK(agent_http_start(st, "192.0.2.1", 0, 0.1, err, sizeof err) == NULL); /* TEST-NET-1 */
  CHECK(strstr(err, "192.0.2.1:0") && strstr(err, strerror(EADDRNOTAVAIL)));
  agent_http_stop(NULL);
  CHECK_EQ_INT(agent_http_port(NULL), -1);

  /* Descriptors: stop closes the listening socket and every connection. */
  int fds0 = count_fds();
  agent_http_t *h = agent_http_start(st, "127.0.0.1", 0, 0.1, err, sizeof err);
  CHECK(h != NULL);
  http_resp_t r;
  http_expect(agent_http_port(h), "GET", "/healthz", 200, &r);
  http_resp_free(&r);
  int idle = http_connect(AF_INET, agent_http_port(h));
  agent_http_stop(h);
  close(idle);
  CHECK_EQ_INT(count_fds(), fds0);

  /* All addresses ("" = dual stack) and IPv6 literals. */
  h = agent_http_start(st, "", 0, 0.1, err, sizeof err);
  if (!h) fprintf(stderr, "%s\n", err);
  CHECK(h != NULL);
  int port = agent_http_port(h);
  CHECK(port > 0);
  static const char req[] = "GET /readyz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
  http_request_raw(AF_INET, port, req, sizeof req - 1, &r);
  CHECK_EQ_INT(r.status, 200);
  http_resp_free(&r);
  if (have_ipv6()) {
    http_request_raw(AF_INET6, port, req, sizeof req - 1, &r);
    CHECK_EQ_INT(r.status, 200);
    http_resp_free(&r);
  }
  agent_http_stop(h);
  if (have_ipv6()) {
    static const char *const v6[] = {"::1", "[::1]"};
    for (int i = 0; i < 2; i++) {
      h = agent_http_start(st, v6[i], 0, 0.1, err, sizeof err);
      if (!h) fprintf(stderr, "%s\n", err);
      CHECK(h != NULL);
      http_request_raw(AF_INET6, agent_http_port(h), req, sizeof req - 1, &r);
      CHECK_EQ_INT(r.status, 200);
      http_resp_free(&r);
      agent_http_stop(h);
    }
  } else {
    TEST_LOG("note: no IPv6 loopback here; the IPv6 cases were not run");
  }
}

int main(void) {
  test_rng_init("http_test", 0); /* a fresh seed each run, printed */

  test_escapers();
  TEST_LOG("escapers ok");

  agent_state_t st;
  agent_state_init(&st);

  /* Renderers on a fresh state: valid, no store or last-rendezvous families. */
  size_t len;
  char *m = agent_metrics_render(&st, &len);
  CHECK(m != NULL);
  prom_check_structure(m, len);
  CHECK(strstr(m, "tdist_last_rendezvous_timestamp_seconds") == NULL);
  CHECK(strstr(m, "tdist_store_requests_total") == NULL && strstr(m, "tdist_store_keys") == NULL);
  prom_check(m, "tdist_agent_state{state=\"starting\"}", 1);
  prom_check(m, "tdist_node_rank", -1);
  prom_check(m, "tdist_rendezvous_duration_seconds_count", 0);
  test_promtool_check(m, len, "fresh");
  free(m);
  char *s = agent_status_render(&st, &len);
  CHECK(s != NULL &&
        strstr(s,
               "\"members\":[],\"spares\":0,\"standbys_live\":null,\"standbys\":[],\"workers\":[],"
               "\"last_error\":null,\"ranks\":[],\"collectives\":null,\"hang\":null,"
               "\"gpu_monitoring\":{\"available\":false,\"reason\":null}}") != NULL);
  free(s);

  fill_state(&st);
  char err[512];
  agent_http_t *fast = agent_http_start(&st, "127.0.0.1", 0, 0.1, err, sizeof err);
  if (!fast) fprintf(stderr, "%s\n", err);
  CHECK(fast != NULL);
  agent_http_t *slow = agent_http_start(&st, "127.0.0.1", 0, 1.0, err, sizeof err);
  CHECK(slow != NULL);
  int port = agent_http_port(fast);
  CHECK(port > 0 && port != agent_http_port(slow));
  TEST_LOG("servers on ports %d and %d", port, agent_http_port(slow));

  test_paths_and_methods(port);
  TEST_LOG("paths and methods ok");
  test_metrics(&st, port, "populated");
  http_resp_t r;
  http_expect(port, "GET", "/status", 200, &r);
  http_check_header(&r, "Content-Type", "application/json");
  check_status_json(r.body, r.body_len, &st);
  http_resp_free(&r);
  TEST_LOG("/metrics and /status ok");
  test_healthz(&st, port, agent_http_port(slow));
  TEST_LOG("/healthz ok");

  tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
  so.host = "127.0.0.1";
  so.quiet = 1;
  tdist_store_server_t *srv = NULL;
  CHECK_OK(tdist_store_server_create(&so, &srv));
  test_readyz(&st, port, srv);
  TEST_LOG("/readyz ok");
  test_store_metrics(&st, port, srv);
  http_expect(port, "GET", "/status", 200, &r);
  check_status_json(r.body, r.body_len, &st); /* is_store_host true now */
  http_resp_free(&r);
  TEST_LOG("store host metrics ok");

  test_bind(&st, port);
  TEST_LOG("bind ok");
  test_slowloris(&st, port);
  TEST_LOG("slowloris ok");
  test_concurrent(&st, port);
  TEST_LOG("concurrent scrapes ok");

  agent_http_stop(slow);
  agent_http_stop(fast);
  agent_state_lock(&st);
  st.store_server = NULL;
  agent_state_unlock(&st);
  tdist_store_server_destroy(srv);
  agent_state_destroy(&st);
  TEST_LOG("http_test: all passed");
  return 0;
}

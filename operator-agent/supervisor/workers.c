/* See workers.h. Everything a child needs (argv, envp, paths) is built before fork(): the agent
 * has other threads (HTTP, store server), so between fork and exec the child only makes
 * async-signal-safe calls. */
#define _GNU_SOURCE
#include "operator-agent/supervisor/workers.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/common/log.h"
#include "operator-agent/supervisor/children.h"
#include "operator-agent/supervisor/oom.h"
#include "operator-agent/common/param.h"

extern char **environ;

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A growable NULL-terminated "K=V" list. */
typedef struct {
  char **v;
  size_t n, cap;
} strv_t;

static int strv_push(strv_t *s, char *owned) {
  if (!owned) return -1;
  if (s->n + 2 > s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    char **v = realloc(s->v, cap * sizeof *v);
    if (!v) {
      free(owned);
      return -1;
    }
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = owned;
  s->v[s->n] = NULL;
  return 0;
}

static void strv_free(strv_t *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
  memset(s, 0, sizeof *s);
}

/* Sets name=value, replacing an earlier entry of the same name. */
static int env_set(strv_t *e, const char *name, const char *value) {
  size_t l = strlen(name);
  char *kv;
  if (asprintf(&kv, "%s=%s", name, value) < 0) return -1;
  for (size_t i = 0; i < e->n; i++) {
    if (!strncmp(e->v[i], name, l) && e->v[i][l] == '=') {
      free(e->v[i]);
      e->v[i] = kv;
      return 0;
    }
  }
  return strv_push(e, kv);
}

static int env_set_int(strv_t *e, const char *name, long long v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%lld", v);
  return env_set(e, name, buf);
}

static const char *env_get(const strv_t *e, const char *name) {
  size_t l = strlen(name);
  for (size_t i = 0; i < e->n; i++)
    if (!strncmp(e->v[i], name, l) && e->v[i][l] == '=') return e->v[i] + l + 1;
  return NULL;
}

static int mkdirs(char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    int r = mkdir(path, 0755);
    *p = '/';
    if (r && errno != EEXIST) return -1;
  }
  if (mkdir(path, 0755) && errno != EEXIST) return -1;
  return 0;
}

/* PREFIX/python when the agent runs from an installed tree (PREFIX/bin/tdist-agent) holding the
 * PyTorch backend package PREFIX/python/tdist_torch; NULL otherwise. Found once. */
static const char *torch_package_dir(void) {
  static char dir[4096];
  static int done;
  if (done) return dir[0] ? dir : NULL;
  done = 1;
  char exe[4096], cand[4200];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return NULL;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash) return NULL;
  *slash = '\0';
  snprintf(cand, sizeof cand, "%s/../python", exe);
  char real[4096];
  if (!realpath(cand, real)) return NULL;
  snprintf(cand, sizeof cand, "%s/tdist_torch/__init__.py", real);
  if (access(cand, R_OK) != 0) return NULL;
  snprintf(dir, sizeof dir, "%s", real);
  return dir;
}

/* PYTHONPATH with dir in front (once). */
static int prepend_python_path(strv_t *e, const char *dir) {
  const char *pp = env_get(e, "PYTHONPATH");
  if (!pp || !*pp) return env_set(e, "PYTHONPATH", dir);
  size_t l = strlen(dir);
  for (const char *p = pp; *p;) { /* already there? */
    const char *end = strchr(p, ':');
    size_t pl = end ? (size_t)(end - p) : strlen(p);
    if (pl == l && !strncmp(p, dir, l)) return 0;
    p += pl + (end ? 1 : 0);
  }
  char *v;
  if (asprintf(&v, "%s:%s", dir, pp) < 0) return -1;
  int rc = env_set(e, "PYTHONPATH", v);
  free(v);
  return rc;
}

/* The backend package's directory in front, so `import tdist_torch` works in the workers
 * without any set-up. */
static int add_torch_path(strv_t *e) {
  const char *dir = torch_package_dir();
  return dir ? prepend_python_path(e, dir) : 0;
}

/* Python stacks and PyTorch's NCCL flight recorder (operator-agent/pystack/pystack.h): the
 * agent's sitecustomize first on PYTHONPATH (after tdist_torch's, which comes first), the
 * rank's stacks file and signal; the flight recorder's dumps into the attempt's directory with
 * PyTorch's variables (2.x names; 1.13 has no flight recorder), unless the user set them. */
static int add_observe_env(strv_t *e, const agent_worker_spec_t *sp, const char *pystack_file) {
  int rc = 0;
  if (sp->py_stacks_dir && pystack_file[0]) {
    rc |= prepend_python_path(e, sp->py_stacks_dir);
    rc |= env_set(e, "TDIST_PY_STACKS_FILE", pystack_file);
    rc |= env_set_int(e, "TDIST_PY_STACKS_SIGNAL", sp->py_stacks_signal);
  }
  char prefix[600];
  snprintf(prefix, sizeof prefix, "%s/attempt_%d/nccl_trace_rank_", sp->run_dir, sp->attempt);
  if (!env_get(e, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"))
    rc |= env_set(e, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", prefix);
  if (!env_get(e, "TORCH_NCCL_TRACE_BUFFER_SIZE"))
    rc |= env_set(e, "TORCH_NCCL_TRACE_BUFFER_SIZE", "2000");
  if (!env_get(e, "TORCH_NCCL_DUMP_ON_TIMEOUT"))
    rc |= env_set(e, "TORCH_NCCL_DUMP_ON_TIMEOUT", "1");
  return rc;
}

/* The torchrun environment for one worker on top of the agent's (torch-contracts.md §2.2). */
static int build_env(strv_t *e, const agent_worker_spec_t *sp, int local, const char *error_file,
                     const char *stats_file, const char *pystack_file) {
  const agent_cfg_t *cfg = sp->cfg;
  for (char **p = environ; *p; p++)
    if (strv_push(e, strdup(*p))) return -1;
  for (size_t i = 0; i < cfg->nenv; i++)
    if (env_set(e, cfg->env[i].name, cfg->env[i].value)) return -1;
  int rank = sp->rank_base + local;
  int rc = 0;
  rc |= env_set_int(e, "RANK", rank);
  rc |= env_set_int(e, "LOCAL_RANK", local);
  rc |= env_set_int(e, "WORLD_SIZE", sp->world_size);
  rc |= env_set_int(e, "LOCAL_WORLD_SIZE", cfg->nproc_per_node);
  rc |= env_set_int(e, "GROUP_RANK", sp->group_rank);
  rc |= env_set_int(e, "GROUP_WORLD_SIZE", sp->group_world_size);
  rc |= env_set_int(e, "ROLE_RANK", rank);
  rc |= env_set_int(e, "ROLE_WORLD_SIZE", sp->world_size);
  rc |= env_set(e, "ROLE_NAME", cfg->role ? cfg->role : "default");
  rc |= env_set(e, "MASTER_ADDR", sp->master_addr);
  rc |= env_set_int(e, "MASTER_PORT", sp->master_port);
  rc |= env_set_int(e, "TORCHELASTIC_RESTART_COUNT", sp->attempt);
  rc |= env_set_int(e, "TORCHELASTIC_MAX_RESTARTS", cfg->max_restarts);
  rc |= env_set(e, "TORCHELASTIC_RUN_ID", cfg->run_id ? cfg->run_id : "none");
  rc |= env_set(e, "TORCHELASTIC_USE_AGENT_STORE", "True");
  rc |= env_set(e, "TORCHELASTIC_ERROR_FILE", error_file);
  if (!env_get(e, "NCCL_ASYNC_ERROR_HANDLING")) rc |= env_set(e, "NCCL_ASYNC_ERROR_HANDLING", "1");
  if (!env_get(e, "TORCH_NCCL_ASYNC_ERROR_HANDLING"))
    rc |= env_set(e, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (cfg->omp_num_threads > 0)
    rc |= env_set_int(e, "OMP_NUM_THREADS", cfg->omp_num_threads);
  else if (!env_get(e, "OMP_NUM_THREADS") && cfg->nproc_per_node > 1)
    rc |= env_set(e, "OMP_NUM_THREADS", "1");
  rc |= env_set(e, "TDIST_BACKEND", cfg->backend ? cfg->backend : "gloo");
  rc |= env_set(e, "TDIST_STATS_FILE", stats_file);
  rc |= add_observe_env(e, sp, pystack_file);
  rc |= add_torch_path(e);
  return rc ? -1 : 0;
}

/* spec->extra_env's variables for the worker of global rank `rank`, over what is there. */
static int add_extra_env(strv_t *e, const agent_worker_spec_t *sp, int rank, char *err,
                         size_t cap) {
  char **extra = NULL;
  if (sp->extra_env(sp->extra_env_ctx, rank, &extra, err, cap)) return -1;
  int rc = 0;
  for (char **q = extra; !rc && q && *q; q++) {
    char *eq = strchr(*q, '=');
    if (!eq) continue;
    char *name = strndup(*q, (size_t)(eq - *q));
    rc = !name || env_set(e, name, eq + 1);
    free(name);
  }
  sp->extra_env_free(extra);
  if (rc) snprintf(err, cap, "out of memory building the worker environment");
  return rc ? -1 : 0;
}

/* argv for exec: "x.py args" runs as "python3 -u x.py args", like torchrun. */
static int build_argv(strv_t *a, const agent_cfg_t *cfg) {
  size_t l = strlen(cfg->cmd[0]);
  if (l > 3 && !strcmp(cfg->cmd[0] + l - 3, ".py")) {
    if (strv_push(a, strdup(agent_param_str(AGENT_P_PYTHON))) || strv_push(a, strdup("-u")))
      return -1;
  }
  for (size_t i = 0; i < cfg->ncmd; i++)
    if (strv_push(a, strdup(cfg->cmd[i]))) return -1;
  return 0;
}

static void kill_started(agent_workers_t *ws) {
  for (int i = 0; i < ws->n; i++) {
    if (ws->w[i].pid > 0) {
      kill(-ws->w[i].pid, SIGKILL);
      waitpid(ws->w[i].pid, NULL, 0);
      ws->w[i].pid = 0;
    }
  }
}

static struct rlimit g_nofile;
static int g_nofile_noted;

void agent_workers_note_limits(void) { g_nofile_noted = getrlimit(RLIMIT_NOFILE, &g_nofile) == 0; }

int agent_workers_start(agent_workers_t *ws, const agent_worker_spec_t *sp, char *err, size_t cap) {
  const agent_cfg_t *cfg = sp->cfg;
  agent_workers_free(ws);
  agent_oom_mark(); /* a SIGKILLed worker is the OOM killer's if the count grows from here */
  ws->w = calloc((size_t)cfg->nproc_per_node, sizeof *ws->w);
  if (!ws->w) {
    snprintf(err, cap, "out of memory for %d workers", cfg->nproc_per_node);
    return -1;
  }
  ws->n = cfg->nproc_per_node;
  ws->first_failed = -1;
  strv_t argv = {0};
  if (build_argv(&argv, cfg)) {
    snprintf(err, cap, "out of memory building the worker command");
    strv_free(&argv);
    return -1;
  }
  pid_t parent = getpid();
  int *exec_fd = malloc((size_t)ws->n * sizeof *exec_fd);
  if (!exec_fd) {
    snprintf(err, cap, "out of memory for %d workers", ws->n);
    strv_free(&argv);
    return -1;
  }
  for (int i = 0; i < ws->n; i++) exec_fd[i] = -1;
  for (int i = 0; i < ws->n; i++) {
    agent_worker_t *w = &ws->w[i];
    w->local_rank = i;
    w->global_rank = sp->rank_base + i;
    w->state = AGENT_WORKER_PENDING;
    char dir[480];
    snprintf(dir, sizeof dir, "%s/attempt_%d/%d", sp->run_dir, sp->attempt, i);
    if (mkdirs(dir)) {
      snprintf(err, cap, "cannot create the worker error-file directory %s: %s", dir,
               strerror(errno));
      goto fail;
    }
    snprintf(w->error_file, sizeof w->error_file, "%s/error.json", dir);
    snprintf(w->stats_file, sizeof w->stats_file, "%s/stats", dir);
    w->pystack_file[0] = 0;
    if (sp->py_stacks_dir)
      snprintf(w->pystack_file, sizeof w->pystack_file, "%s/pystacks.txt", dir);
    unlink(w->error_file);
    unlink(w->stats_file);
    if (w->pystack_file[0]) unlink(w->pystack_file);
    strv_t env = {0};
    if (build_env(&env, sp, i, w->error_file, w->stats_file, w->pystack_file)) {
      strv_free(&env);
      snprintf(err, cap, "out of memory building the worker environment");
      goto fail;
    }
    if (sp->extra_env && add_extra_env(&env, sp, w->global_rank, err, cap)) {
      strv_free(&env);
      goto fail;
    }
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC)) {
      strv_free(&env);
      snprintf(err, cap, "pipe2: %s", strerror(errno));
      goto fail;
    }
    pid_t pid = fork();
    if (pid < 0) {
      int e = errno;
      close(pfd[0]);
      close(pfd[1]);
      strv_free(&env);
      snprintf(err, cap, "fork of worker %d failed: %s", i, strerror(e));
      goto fail;
    }
    if (pid == 0) {
      /* Child: async-signal-safe calls only. */
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(128 + SIGKILL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, NULL);
      static const int sigs[] = {SIGTERM, SIGINT,  SIGHUP,  SIGQUIT, SIGUSR1,
                                 SIGUSR2, SIGCHLD, SIGPIPE, SIGTTOU, SIGTTIN};
      for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++) signal(sigs[k], SIG_DFL);
      /* The open-file limit the agent was started with, not the one it raised for itself. */
      if (g_nofile_noted) setrlimit(RLIMIT_NOFILE, &g_nofile);
      /* No agent descriptor (sockets, signalfd, store) leaks into the worker. */
      if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
        for (int fd = 3; fd < 4096; fd++)
          if (fd != pfd[1]) fcntl(fd, F_SETFD, FD_CLOEXEC);
      }
      execvpe(argv.v[0], argv.v, env.v);
      int e = errno;
      ssize_t wr = write(pfd[1], &e, sizeof e);
      (void)wr;
      _exit(127);
    }
    close(pfd[1]);
    strv_free(&env);
    setpgid(pid, pid); /* also from the parent: no race with signals sent right after */
    w->pid = pid;
    w->state = AGENT_WORKER_RUNNING;
    exec_fd[i] = pfd[0];
  }
  /* All forked; now learn whether each exec worked (EOF on the close-on-exec pipe = it did).
   * Forking them all first starts N workers in about the time of one fork + exec each. */
  int failed = -1, failed_errno = 0;
  for (int i = 0; i < ws->n; i++) {
    int child_errno = 0;
    ssize_t r;
    do r = read(exec_fd[i], &child_errno, sizeof child_errno);
    while (r < 0 && errno == EINTR);
    close(exec_fd[i]);
    exec_fd[i] = -1;
    if (r == (ssize_t)sizeof child_errno && failed < 0) {
      failed = i;
      failed_errno = child_errno;
    }
  }
  if (failed >= 0) {
    snprintf(err, cap, "cannot execute worker command '%s': %s%s", argv.v[0],
             strerror(failed_errno),
             failed_errno == ENOENT ? " (not found in PATH; give a path or fix PATH)" : "");
    goto fail;
  }
  strv_free(&argv);
  free(exec_fd);
  return 0;
fail:
  for (int i = 0; i < ws->n; i++)
    if (exec_fd[i] >= 0) close(exec_fd[i]);
  free(exec_fd);
  strv_free(&argv);
  kill_started(ws);
  return -1;
}

/* Records the exit of child pid; 1 if it was a worker. */
static int record_exit(agent_workers_t *ws, pid_t pid, int status) {
  for (int i = 0; i < ws->n; i++) {
    agent_worker_t *w = &ws->w[i];
    if (w->pid != pid) continue;
    w->pid = 0;
    w->exit_ns = mono_ns();
    w->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    ws->exits_total[w->exit_code == 0 ? 0 : w->exit_code > 0 ? 1 : 2]++;
    if (w->state == AGENT_WORKER_STOPPED) {
      /* stopped by us: not a failure */
    } else if (w->exit_code == 0) {
      w->state = AGENT_WORKER_SUCCEEDED;
    } else {
      w->state = AGENT_WORKER_FAILED;
      if (ws->first_failed < 0) ws->first_failed = i;
    }
    return 1;
  }
  return 0;
}

int agent_workers_reap(agent_workers_t *ws) {
  int n = 0;
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG | __WALL);
    if (pid <= 0) break;
    n += record_exit(ws, pid, status);
  }
  return n;
}

typedef struct {
  agent_workers_t *ws;
  int others;
} sweep_t;

static void on_reap(void *arg, pid_t pid, int status) {
  sweep_t *s = arg;
  if (!record_exit(s->ws, pid, status)) s->others++;
}

int agent_workers_kill_all(agent_workers_t *ws, int64_t deadline_ns, int *left) {
  agent_workers_mark_stopping(ws);
  agent_workers_signal(ws, SIGKILL);
  sweep_t s = {ws, 0};
  agent_children_kill_all(deadline_ns, on_reap, &s, left);
  return s.others;
}

int agent_workers_running(const agent_workers_t *ws) {
  int n = 0;
  for (int i = 0; i < ws->n; i++) n += ws->w[i].pid > 0;
  return n;
}

int agent_workers_all_succeeded(const agent_workers_t *ws) {
  if (!ws->n) return 0;
  for (int i = 0; i < ws->n; i++)
    if (ws->w[i].state != AGENT_WORKER_SUCCEEDED) return 0;
  return 1;
}

void agent_workers_signal(agent_workers_t *ws, int sig) {
  for (int i = 0; i < ws->n; i++)
    if (ws->w[i].pid > 0) kill(-ws->w[i].pid, sig);
}

/* Whether process pid catches sig (bit sig-1 of SigCgt, a hex mask). 0 when unknown. */
static int catches(pid_t pid, int sig) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  int yes = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "SigCgt:", 7) != 0) continue;
    unsigned long long mask = strtoull(line + 7, NULL, 16);
    yes = sig >= 1 && sig <= 64 && ((mask >> (sig - 1)) & 1ULL);
    break;
  }
  fclose(f);
  return yes;
}

int agent_workers_signal_handlers(agent_workers_t *ws, int sig) {
  int n = 0;
  for (int i = 0; i < ws->n; i++)
    if (ws->w[i].pid > 0 && catches(ws->w[i].pid, sig) && kill(ws->w[i].pid, sig) == 0) n++;
  return n;
}

void agent_workers_mark_stopping(agent_workers_t *ws) {
  for (int i = 0; i < ws->n; i++)
    if (ws->w[i].pid > 0) ws->w[i].state = AGENT_WORKER_STOPPED;
}

void agent_workers_publish(const agent_workers_t *ws, agent_state_t *st) {
  agent_state_lock(st);
  if (st->nworkers != ws->n) {
    agent_worker_info_t *p = realloc(st->workers, (size_t)(ws->n ? ws->n : 1) * sizeof *p);
    if (!p) {
      agent_state_unlock(st);
      return;
    }
    st->workers = p;
    st->nworkers = ws->n;
  }
  memcpy(st->worker_exits_total, ws->exits_total, sizeof st->worker_exits_total);
  for (int i = 0; i < ws->n; i++) {
    st->workers[i].local_rank = ws->w[i].local_rank;
    st->workers[i].global_rank = ws->w[i].global_rank;
    st->workers[i].pid = ws->w[i].pid;
    st->workers[i].state = ws->w[i].state;
    st->workers[i].exit_code = ws->w[i].exit_code;
    memcpy(st->workers[i].stats_file, ws->w[i].stats_file, sizeof st->workers[i].stats_file);
  }
  agent_state_unlock(st);
}

void agent_workers_free(agent_workers_t *ws) {
  free(ws->w);
  ws->w = NULL;
  ws->n = 0;
  ws->first_failed = -1;
}

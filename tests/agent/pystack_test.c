/* operator-agent/pystack: Python stacks taken from real Python processes (each interpreter given
 * as an argument: Debian 12's 3.11 and the 2.6 root's 3.13) through the sitecustomize.py the agent
 * installs, and the flight-recorder analyzer run as the agent runs it.
 *   a. a worker spinning in Python with a second thread blocked: the stacks name both functions,
 *      and the worker keeps running (its CPU time moves on after the dump);
 *   b. a worker blocked in C (time.sleep): its stack, and it stays blocked, alive;
 *   c. a user's own sitecustomize later on PYTHONPATH still runs; the agent's variables are gone
 *      from the worker's environment (its children never write to the rank's file);
 *   d. without the variables nothing is registered: the request is refused with the reason, and
 *      a process that does not catch the signal is never sent it (it would die);
 *   e. a stopped worker: the request says so; its stacks come once it is continued;
 *   f. the analyzer: no dump (nothing run), dumps (the rank behind), a hanging interpreter killed
 *      at the deadline, a missing interpreter.
 *   args: SITECUSTOMIZE_PY PYTHON...  */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/pystack/pystack.h"
#include "tests/testlib/check.h"

static char g_run[256], g_py[300];

static void msleep(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Starts `python -c code` with PYTHONPATH and (file non-NULL) the agent's variables. */
static pid_t start_py(const char *python, const char *pythonpath, const char *file,
                      const char *code) {
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    char sig[16];
    snprintf(sig, sizeof sig, "%d", agent_pystack_signal());
    setenv("PYTHONPATH", pythonpath, 1);
    if (file) {
      setenv("TDIST_PY_STACKS_FILE", file, 1);
      setenv("TDIST_PY_STACKS_SIGNAL", sig, 1);
    }
    execl(python, python, "-c", code, (char *)NULL);
    _exit(127);
  }
  return pid;
}

static int file_has(const char *path, const char *s) {
  char buf[8192] = {0};
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return strstr(buf, s) != NULL;
}

/* Waits (up to 60 s: interpreters start slowly under load) for path to contain s. */
static void wait_file_has(const char *path, const char *s) {
  for (int i = 0; i < 6000 && !file_has(path, s); i++) msleep(10);
  if (!file_has(path, s)) TEST_FAIL("%s never contained '%s'", path, s);
}

/* The stacks appended after off, once they contain want (60 s at most). */
static void wait_stack(const char *file, off_t off, const char *want, char *out, size_t cap) {
  for (int i = 0; i < 6000; i++) {
    if (agent_pystack_read(file, off, out, cap) > 0 && strstr(out, want)) return;
    msleep(10);
  }
  TEST_FAIL("no '%s' in the stacks of %s: '%s'", want, file, out);
}

static long long cpu_ticks(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  long long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lld %lld", &ut, &st) != 2)
    return -1;
  return ut + st;
}

static char proc_state(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return '?';
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  return p ? p[2] : '?';
}

static void stop(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* Starts python sleeping in time.sleep inside the function fn, its stacks file
 * <run>/<tag><idx>.txt written into file (cap 400), and waits until it is in fn. */
static pid_t start_sleeper(const char *python, const char *tag, int idx, const char *fn,
                           char *file) {
  char ready[420], code[1024];
  snprintf(file, 400, "%s/%s%d.txt", g_run, tag, idx);
  snprintf(ready, sizeof ready, "%s.ready", file);
  snprintf(code, sizeof code,
           "import time\ndef %s():\n  open('%s', 'w').write('sleeping')\n"
           "  time.sleep(1000)\n%s()\n",
           fn, ready, fn);
  pid_t p = start_py(python, g_py, file, code);
  wait_file_has(ready, "sleeping");
  return p;
}

static void one_python(const char *python, int idx) {
  char file[400], out[16384], why[512], user[400], marker[420], pp[720];
  off_t off = -1;
  TEST_LOG("python %s", python);

  TEST_CASE("a. spinning main thread, blocked second thread");
  snprintf(file, sizeof file, "%s/spin%d.txt", g_run, idx);
  char code[4096], ready[420];
  snprintf(ready, sizeof ready, "%s.ready", file);
  snprintf(code, sizeof code,
           "import threading\n"
           "def blocked_helper(ev):\n  ev.wait()\n"
           "def tdist_spin_here():\n  open('%s', 'w').write('spinning')\n  n = 0\n"
           "  while True:\n    n += 1\n"
           "threading.Thread(target=blocked_helper, args=(threading.Event(),),"
           " daemon=True).start()\n"
           "tdist_spin_here()\n",
           ready);
  pid_t p = start_py(python, g_py, file, code);
  wait_file_has(ready, "spinning");
  CHECK_EQ_INT(agent_pystack_request(p, file, &off, why, sizeof why), 1);
  CHECK_STR(why, "");
  wait_stack(file, off, "tdist_spin_here", out, sizeof out);
  wait_stack(file, off, "blocked_helper", out, sizeof out);
  CHECK(strstr(out, "registered signal") == NULL);
  long long t0 = cpu_ticks(p);
  for (int i = 0; i < 3000 && cpu_ticks(p) <= t0; i++) msleep(10);
  CHECK_CMP_INT(cpu_ticks(p), >, t0); /* still spinning: not stopped, not killed */
  CHECK(proc_state(p) == 'R' || proc_state(p) == 'S');
  stop(p);

  TEST_CASE("b. main thread blocked in C");
  p = start_sleeper(python, "sleep", idx, "sleeping_in_c", file);
  CHECK_EQ_INT(agent_pystack_request(p, file, &off, why, sizeof why), 1);
  wait_stack(file, off, "sleeping_in_c", out, sizeof out);
  msleep(100);
  CHECK(proc_state(p) == 'S'); /* back asleep, alive */
  /* a second request appends: only the new dump is read */
  off_t off2;
  CHECK_EQ_INT(agent_pystack_request(p, file, &off2, why, sizeof why), 1);
  CHECK_CMP_INT(off2, >, off);
  wait_stack(file, off2, "sleeping_in_c", out, sizeof out);
  CHECK(strstr(out, "Current thread") != NULL || strstr(out, "Thread 0x") != NULL);
  stop(p);

  TEST_CASE("c. chaining to the user's sitecustomize; variables removed");
  snprintf(user, sizeof user, "%s/user%d", g_run, idx);
  mkdir(user, 0755);
  snprintf(marker, sizeof marker, "%s/marker", user);
  char ufile[440];
  snprintf(ufile, sizeof ufile, "%s/sitecustomize.py", user);
  FILE *f = fopen(ufile, "w");
  CHECK(f != NULL);
  fprintf(f, "open('%s', 'w').write('user sitecustomize ran')\n", marker);
  fclose(f);
  snprintf(pp, sizeof pp, "%s:%s", g_py, user);
  snprintf(file, sizeof file, "%s/chain%d.txt", g_run, idx);
  snprintf(code, sizeof code,
           "import os, sys\n"
           "left = [k for k in os.environ if k.startswith('TDIST_PY_STACKS')]\n"
           "open('%s.env', 'w').write('left=%%s\\n' %% left)\n"
           "import time; time.sleep(1000)\n",
           marker);
  p = start_py(python, pp, file, code);
  char envf[440];
  snprintf(envf, sizeof envf, "%s.env", marker);
  wait_file_has(envf, "left=[]");
  wait_file_has(marker, "user sitecustomize ran");
  wait_file_has(file, "registered signal");
  stop(p);

  TEST_CASE("d. no variables: nothing registered, nothing sent");
  snprintf(file, sizeof file, "%s/none%d.txt", g_run, idx);
  unlink(marker);
  snprintf(ready, sizeof ready, "%s.ready", file);
  snprintf(code, sizeof code, "import time\nopen('%s', 'w').write('sleeping')\ntime.sleep(1000)\n",
           ready);
  p = start_py(python, pp, NULL, code);
  wait_file_has(ready, "sleeping");
  wait_file_has(marker, "user sitecustomize ran");
  CHECK_EQ_INT(agent_pystack_request(p, file, &off, why, sizeof why), 0);
  CHECK_HAS(why, "is missing");
  f = fopen(file, "w"); /* the file exists, but the process does not catch the signal */
  fclose(f);
  for (int i = 0; i < 500 && proc_state(p) != 'S'; i++) msleep(10); /* into time.sleep */
  CHECK_EQ_INT(agent_pystack_catches(p, agent_pystack_signal()), 0);
  CHECK_EQ_INT(agent_pystack_request(p, file, &off, why, sizeof why), 0);
  CHECK_HAS(why, "does not catch signal");
  msleep(100);
  CHECK(proc_state(p) == 'S'); /* not killed by a real-time signal's default action */
  stop(p);

  TEST_CASE("e. a stopped worker");
  p = start_sleeper(python, "stopped", idx, "stopped_here", file);
  kill(p, SIGSTOP);
  for (int i = 0; i < 500 && proc_state(p) != 'T'; i++) msleep(10);
  CHECK_EQ_INT(agent_pystack_request(p, file, &off, why, sizeof why), 1);
  CHECK_HAS(why, "stopped");
  msleep(200);
  CHECK_EQ_INT(agent_pystack_read(file, off, out, sizeof out), 0);
  kill(p, SIGCONT);
  wait_stack(file, off, "stopped_here", out, sizeof out);
  stop(p);

  TEST_CASE("g. a gloo job signalled from its first collective through its exit");
  {
    /* Not during `import torch`: a dump taken while the interpreter imports can crash it (seen
     * once in about 1,000 signals on Python 3.13, docs/agent.md); the agent signals only ranks
     * named hung. */
    char init[400], done[2][420], started[2][420];
    pid_t g[2];
    snprintf(init, sizeof init, "%s/gloo%d.init", g_run, idx);
    for (int r = 0; r < 2; r++) {
      snprintf(file, sizeof file, "%s/gloo%d.%d.txt", g_run, idx, r);
      snprintf(done[r], sizeof done[r], "%s.done", file);
      snprintf(started[r], sizeof started[r], "%s.started", file);
      snprintf(code, sizeof code,
               "import torch, torch.distributed as dist\n"
               "dist.init_process_group('gloo', init_method='file://%s', rank=%d, world_size=2)\n"
               "open('%s', 'w').write('started')\n"
               "t = torch.ones(1000)\n"
               "for i in range(2000):\n"
               "  dist.all_reduce(t)\n"
               "  t /= 2\n"
               "open('%s', 'w').write('done %%g' %% float(t.sum()))\n",
               init, r, started[r], done[r]);
      g[r] = start_py(python, g_py, file, code);
    }
    int st[2] = {-1, -1}, left = 2, sent = 0;
    for (int i = 0; left && i < 6000; i++) { /* 120 s at most; a signal per rank per 20 ms */
      for (int r = 0; r < 2; r++) {
        if (st[r] != -1) continue;
        if (access(started[r], F_OK) == 0 && agent_pystack_catches(g[r], agent_pystack_signal()) &&
            kill(g[r], agent_pystack_signal()) == 0)
          sent++;
        if (waitpid(g[r], &st[r], WNOHANG) == g[r])
          left--;
        else
          st[r] = -1;
      }
      usleep(20000);
    }
    for (int r = 0; r < 2; r++) {
      if (st[r] == -1) stop(g[r]);
      CHECK(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 0); /* not killed by the signal */
      wait_file_has(done[r], "done 1000");
    }
    TEST_LOG("  %d signals sent to the two ranks while they ran", sent);
    CHECK_CMP_INT(sent, >, 2);
  }

  TEST_CASE("f. the flight-recorder analyzer");
  char prefix[400], behind[64], summary[1024];
  snprintf(prefix, sizeof prefix, "%s/fr%d/nccl_trace_rank_", g_run, idx);
  char frdir[400];
  snprintf(frdir, sizeof frdir, "%s/fr%d", g_run, idx);
  mkdir(frdir, 0755);
  CHECK_EQ_INT(agent_frtrace_analyze(python, g_py, prefix, 2, 60000, behind, sizeof behind, summary,
                                     sizeof summary),
               0);
  snprintf(code, sizeof code,
           "import pickle\n"
           "for r, enq in ((0, 6), (1, 5)):\n"
           "  e = [dict(pg_id=0, process_group=('0', 'default_pg'), collective_seq_id=s,"
           " profiling_name='nccl:all_reduce', state='completed' if s <= 5 else 'started',"
           " is_p2p=False) for s in range(1, enq + 1)]\n"
           "  st = {'0': dict(last_enqueued_collective=enq, last_started_collective=-1,"
           " last_completed_collective=5)}\n"
           "  pickle.dump(dict(version='2.4', pg_status=st, entries=e),"
           " open('%s%%d' %% r, 'wb'), 2)\n",
           prefix);
  pid_t w = start_py(python, g_py, NULL, code);
  int status;
  CHECK_EQ_INT(waitpid(w, &status, 0), w);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK_EQ_INT(agent_frtrace_analyze(python, g_py, prefix, 2, 60000, behind, sizeof behind, summary,
                                     sizeof summary),
               1);
  CHECK_STR(behind, "1");
  CHECK_HAS(summary,
            "rank 1 behind in process group 0 (last enqueued #5); rank 0 waits in "
            "nccl:all_reduce #6");
}

int main(int argc, char **argv) {
  CHECK(argc >= 3);
  const char *tmp = getenv("TEST_TMPDIR");
  snprintf(g_run, sizeof g_run, "%s/pystack.%d", tmp ? tmp : "/tmp", (int)getpid());
  CHECK_EQ_INT(mkdir(g_run, 0700), 0);
  char err[600];
  CHECK_EQ_INT(agent_pystack_install(g_run, err, sizeof err), 0);
  agent_pystack_pydir(g_run, g_py, sizeof g_py);
  /* the installed file is the source file, byte for byte */
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s/sitecustomize.py'", argv[1], g_py);
  CHECK_EQ_INT(system(cmd), 0);
  CHECK_EQ_INT(agent_pystack_install(g_run, err, sizeof err), 0); /* again: overwritten */
  CHECK_EQ_INT(agent_pystack_install("/nonexistent/run", err, sizeof err), -1);
  CHECK_HAS(err, "cannot create /nonexistent/run/python");

  for (int i = 2; i < argc; i++) one_python(argv[i], i);

  TEST_CASE("f. a hanging or missing interpreter");
  char hang[300], prefix[400], behind[64], summary[1024];
  snprintf(hang, sizeof hang, "%s/hang.sh", g_run);
  FILE *f = fopen(hang, "w");
  fprintf(f, "#!/bin/sh\nexec sleep 1000\n");
  fclose(f);
  chmod(hang, 0755);
  snprintf(prefix, sizeof prefix, "%s/frhang/nccl_trace_rank_", g_run);
  char frdir[300], dump0[420];
  snprintf(frdir, sizeof frdir, "%s/frhang", g_run);
  mkdir(frdir, 0700);
  snprintf(dump0, sizeof dump0, "%s0", prefix);
  f = fopen(dump0, "w"); /* a dump to read: the analyzer runs */
  fclose(f);
  CHECK_EQ_INT(agent_frtrace_analyze(hang, g_py, prefix, 2, 300, behind, sizeof behind, summary,
                                     sizeof summary),
               -1);
  CHECK_HAS(summary, "timed out");
  CHECK_EQ_INT(agent_frtrace_analyze("/nonexistent/python", g_py, prefix, 2, 30000, behind,
                                     sizeof behind, summary, sizeof summary),
               -1);
  CHECK_HAS(summary, "cannot execute the workers' python");
  CHECK_EQ_INT(waitpid(-1, NULL, WNOHANG), -1); /* no child left behind */
  CHECK_EQ_INT(errno, ECHILD);
  TEST_LOG("pystack_test: all checks passed");
  return 0;
}

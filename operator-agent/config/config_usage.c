/* The --help text, built once from the option table (config.c) so that every flag, its
 * environment names, YAML key and default are listed exactly as the loader accepts them. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "operator-agent/config/config.h"
#include "operator-agent/config/config_internal.h"

#define WIDTH 98

typedef struct {
  char *p;
  size_t n, cap;
} out_t;

static char g_usage[32768];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void put(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out_t *o, const char *fmt, ...) {
  va_list ap;
  if (o->n >= o->cap) return;
  va_start(ap, fmt);
  int r = vsnprintf(o->p + o->n, o->cap - o->n, fmt, ap);
  va_end(ap);
  if (r > 0) o->n = o->n + (size_t)r < o->cap ? o->n + (size_t)r : o->cap - 1;
}

/* Word-wraps text at WIDTH: the first line indented by `first`, the others by `indent`. */
static void wrap_hang(out_t *o, int first, int indent, const char *text) {
  int col = 0, line = 0;
  const char *s = text;
  while (*s) {
    while (*s == ' ') s++;
    size_t w = strcspn(s, " ");
    if (w == 0) break;
    if (col > indent && col + 1 + (int)w > WIDTH) {
      put(o, "\n");
      col = 0;
      line++;
    }
    if (col == 0) {
      col = line ? indent : first;
      put(o, "%*s", col, "");
    } else {
      put(o, " ");
      col++;
    }
    put(o, "%.*s", (int)w, s);
    col += (int)w;
    s += w;
  }
  if (col) put(o, "\n");
}

static void wrap(out_t *o, int indent, const char *text) { wrap_hang(o, indent, indent, text); }

static void option(out_t *o, const cfg_opt_t *opt, int id) {
  char line[1024], names[3][48];
  size_t n = 0;
  int nenv = agent_cfg__env_names((cfg_id_t)id, names);
  if (opt->group) put(o, "\n%s:\n", opt->group);
  put(o, "  --%s%s%s", opt->flag, opt->metavar ? " " : "", opt->metavar ? opt->metavar : "");
  if (opt->flag2)
    put(o, ", --%s%s%s", opt->flag2, opt->metavar ? " " : "", opt->metavar ? opt->metavar : "");
  if (id == CFG_HELP) put(o, ", -h");
  put(o, "\n");
  wrap(o, 6, opt->help);
  if (opt->type == CFG_T_ACTION) return;
  n += (size_t)snprintf(line + n, sizeof line - n, "default: %s;", opt->def);
  for (int k = 0; k < nenv && n < sizeof line; k++)
    n += (size_t)snprintf(line + n, sizeof line - n, "%s %s%s", k ? "," : " env:", names[k],
                          k + 1 == nenv && !opt->plain ? ";" : "");
  if (opt->plain && n < sizeof line)
    n += (size_t)snprintf(line + n, sizeof line - n, ", %s (lowest);", opt->plain);
  if (n < sizeof line && opt->yaml)
    snprintf(line + n, sizeof line - n, " yaml: %s%s%s%s", opt->discovery ? "discovery." : "",
             opt->yaml, opt->yaml2 ? " or " : "", opt->yaml2 ? opt->yaml2 : "");
  else if (n < sizeof line)
    snprintf(line + n, sizeof line - n, " not in YAML");
  wrap(o, 6, line);
}

static void build(void) {
  out_t o = {g_usage, 0, sizeof g_usage};
  put(&o,
      "Usage: tdist-agent [FLAGS] [--] COMMAND [ARGS...]\n"
      "       tdist-agent [FLAGS] --check-config\n\n");
  wrap(&o, 0,
       "Runs COMMAND as nproc-per-node worker processes on this node with torchrun's worker "
       "environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*), "
       "after a rendezvous with the agents of the other nodes; node rank 0 hosts the store. "
       "Each attempt's workers get a fresh, empty store of their own (MASTER_PORT, an ephemeral "
       "port on node rank 0), so no attempt sees keys of an earlier one, with or without "
       "PyTorch 1.13's /worker/attempt_N prefix. "
       "The command is everything after \"--\", or everything from the first argument that is "
       "not a flag (torchrun style: tdist-agent --nproc-per-node 2 train.py --lr 1). Without "
       "one, the YAML command: list is used. A command ending in .py runs as "
       "$TDIST_PYTHON -u SCRIPT (default python3), as torchrun runs sys.executable -u.");
  put(&o, "\n");
  wrap(&o, 0,
       "Each worker runs in its own process group and dies with the agent (PR_SET_PDEATHSIG). "
       "TERM, INT and QUIT are forwarded to the workers, which then get --stop-grace-period "
       "before SIGKILL, and the agent exits 128+N; HUP and USR2 are only forwarded; USR1 writes "
       "the ranks' flight recorders (JSON) to the run directory and is forwarded only to the "
       "workers that handle it (its default action would kill the others). The agent reaps "
       "every orphan (as PID 1 or a subreaper), and what the workers left outside their process "
       "groups is SIGKILLed whenever they stop. Unless it is PID 1, the process started is a "
       "guard with the agent as its child: it forwards those signals to the agent and, however "
       "the agent ends (kill -9 included), kills what the agent left and exits with its status; "
       "if the guard is killed, the agent stops as on SIGTERM.");
  put(&o, "\nPrecedence, highest first:\n");
  wrap_hang(&o, 2, 5,
            "1. flags: --flag VALUE or --flag=VALUE; multi-word flags may also be written with "
            "underscores (--nproc_per_node); a later flag wins over an earlier one.");
  wrap_hang(&o, 2, 5,
            "2. environment: TDIST_<FLAG> (e.g. TDIST_NPROC_PER_NODE), then torchrun's PET_<FLAG> "
            "where listed, then plain MASTER_ADDR / MASTER_PORT (as Kubeflow injects them; ignored "
            "with --standalone). Empty variables count as unset.");
  wrap_hang(&o, 2, 5, "3. the YAML file: --config FILE, else TDIST_CONFIG.");
  wrap_hang(&o, 2, 5, "4. defaults.");
  wrap(&o, 0,
       "Durations are seconds (30, 0.5) or a number with a unit: 100ms, 30s, 5m, 1h. Switches "
       "take no value on the command line; in the environment and YAML they are "
       "true|false|1|0|yes|no.");
  for (int id = 0; id < CFG_NOPTS; id++) option(&o, &agent_cfg__opts[id], id);
  put(&o, "\nYAML file:\n");
  wrap(&o, 2,
       "A mapping whose keys are the yaml names above, the discovery ones in a nested "
       "discovery: mapping, plus two keys only YAML has:");
  put(&o,
      "    env:      NAME: value pairs added to every worker's environment\n"
      "    command:  a list of strings, the worker command when the command line has none\n"
      "  Example:\n"
      "    nnodes: \"1:4\"\n"
      "    nproc_per_node: gpu\n"
      "    max_restarts: 3\n"
      "    discovery:\n"
      "      scheme: jobset\n"
      "    env:\n"
      "      NCCL_DEBUG: WARN\n"
      "    command: [python, train.py, --epochs, \"10\"]\n");
  wrap(&o, 2,
       "null (or an empty value) unsets a setting whose default is discovered or none: "
       "node_rank, master_addr, http_port_file and the discovery names but replicated_job and "
       "task. Files over 1 MiB, syntax errors, unknown or duplicate keys, wrong "
       "types and bad values are errors reported as FILE:LINE:COLUMN. "
       "tdist-agent --config FILE --check-config checks a file and prints the effective "
       "configuration in this format.");
  put(&o,
      "\nExit status:\n"
      "  0        all workers succeeded\n"
      "  1..127   the exit code of this node's first failed worker, once restarts are exhausted\n"
      "           (a worker killed by signal N gives 128+N; 127: the command cannot be run)\n"
      "  128+N    the agent was stopped by signal N\n"
      "  64       bad flags, environment or YAML\n"
      "  69       the rendezvous or the master was not reachable within --rdzv-timeout\n"
      "  70       the job failed on another node and restarts are exhausted\n"
      "  71       internal error of the agent\n");
}

const char *agent_cfg_usage(void) {
  pthread_once(&g_once, build);
  return g_usage;
}

/* --jobset-in-place-restart: JobSet's in-place restart protocol in the agent's flow (KEP-467,
 * "main container" mode: the agent is the pod's main container; JobSet's reference agent is
 * cmd/in-place-restart-agent/main.go). See agent.h and docs/orchestrators.md.
 *
 *   begin  read the JobSet; bypass (start at once) when it is annotated
 *          jobset.sigs.k8s.io/disable-in-place-restart or its failurePolicy.restartStrategy is not
 *          InPlaceRestart; else annotate this pod jobset.sigs.k8s.io/in-place-restart-attempt =
 *          status.currentInPlaceRestartAttempt + 1 (0 when unset), and wait at the barrier until
 *          currentInPlaceRestartAttempt == that attempt (JobSet sets it once every pod has it)
 *   poll   while running: attempt <= status.previousInPlaceRestartAttempt means the JobSet
 *          restarts the group (another pod came back with a higher attempt): stop, exit
 *   exit   IN_PLACE_RESTART_EXIT_CODE then, and when this agent gives up under the protocol
 *          (its --max-restarts used up, a rendezvous that cannot complete), so that the kubelet
 *          restarts the container in place (restartPolicyRules) and JobSet's group restart,
 *          bounded by failurePolicy.maxRestarts, takes over from tdist's in-pod restarts.
 * Runs on the loop thread; the JobSet is watched by kube/watcher.h's thread. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "operator-agent/agent/agent.h"
#include "operator-agent/common/log.h"

#define REQUEST_TIMEOUT_S 10.0

/* IN_PLACE_RESTART_EXIT_CODE: 1..255, default 1 (JobSet's reference agent's default). */
static int read_exit_code(int *out) {
  const char *v = getenv("IN_PLACE_RESTART_EXIT_CODE");
  *out = 1;
  if (!v || !*v) return 0;
  char *end;
  long c = strtol(v, &end, 10);
  if (*end || c < 1 || c > 255) {
    AGENT_ERROR(
        "IN_PLACE_RESTART_EXIT_CODE='%.40s' is not an exit code in 1..255; set it to the code "
        "the container's restartPolicyRules restart on (JobSet's default: 1)",
        v);
    return -1;
  }
  *out = (int)c;
  return 0;
}

static void publish(agent_t *a, const agent_kube_jobset_t *js) {
  agent_state_lock(&a->st);
  a->st.jip_current = js->has_current ? js->current : -1;
  a->st.jip_previous = js->has_previous ? js->previous : -1;
  a->st.jip_attempt = a->jip.active ? a->jip.attempt : -1;
  agent_state_unlock(&a->st);
}

static void lift(agent_t *a, int bypass) {
  agent_state_lock(&a->st);
  a->st.jip_bypass = bypass;
  a->st.jip_barrier_down = 1;
  agent_state_unlock(&a->st);
}

/* Retries a call that failed with a transport error or a bad answer until the deadline; DENIED
 * and NOTFOUND are configuration errors and stop at once. 0, or the exit code (logged). */
static int retry_wait(agent_t *a, int rc, const char *err, int64_t deadline, int *backoff_ms) {
  if (rc == AGENT_KUBE_DENIED || rc == AGENT_KUBE_NOTFOUND) {
    AGENT_ERROR("--jobset-in-place-restart: %s", err);
    agent_set_error(a, err);
    return AGENT_EXIT_USAGE;
  }
  if (agent_now_ns() >= deadline) {
    AGENT_ERROR("--jobset-in-place-restart: giving up after --rdzv-timeout %.0f s: %s",
                a->cfg.rdzv_timeout_s, err);
    agent_set_error(a, err);
    return AGENT_EXIT_UNAVAILABLE;
  }
  AGENT_WARN("--jobset-in-place-restart: %s; retrying", err);
  *backoff_ms = *backoff_ms ? (*backoff_ms >= 2500 ? 5000 : *backoff_ms * 2) : 250;
  int64_t until = agent_now_ns() + (int64_t)*backoff_ms * 1000000;
  if (until > deadline) until = deadline;
  while (!a->stop_sig && agent_now_ns() < until) agent_loop_wait(a, 100);
  return a->stop_sig ? AGENT_EXIT_SIGNAL_BASE + a->stop_sig : 0;
}

static double remaining_s(int64_t deadline) {
  double s = (double)(deadline - agent_now_ns()) / 1e9;
  if (s > REQUEST_TIMEOUT_S) s = REQUEST_TIMEOUT_S;
  return s < 1 ? 1 : s;
}

/* Waits until currentInPlaceRestartAttempt == attempt. 0, or the exit code. */
static int barrier(agent_t *a, int64_t deadline) {
  agent_kube_jobset_t js;
  char err[600];
  AGENT_INFO("in-place restart attempt %" PRId64
             ": waiting at the barrier for the JobSet's "
             "currentInPlaceRestartAttempt to reach it (every pod annotated)",
             a->jip.attempt);
  for (;;) {
    agent_loop_wait(a, 100); /* polls the watcher too (agent_jobset_poll) */
    if (a->jip.restart_now) return agent_jobset_exit_code(a, AGENT_EXIT_UNAVAILABLE);
    if (a->stop_sig) return AGENT_EXIT_SIGNAL_BASE + a->stop_sig;
    agent_kube_watcher_get(a->jip.w, &js, err, sizeof err);
    if (agent_kube_jobset_bypass(&js)) {
      AGENT_INFO("the JobSet no longer uses in-place restart: lifting the barrier");
      lift(a, 1);
      a->jip.active = 0;
      return 0;
    }
    if (js.has_current && js.current == a->jip.attempt) {
      AGENT_INFO("the JobSet's currentInPlaceRestartAttempt is %" PRId64 ": barrier lifted",
                 js.current);
      lift(a, 0);
      return 0;
    }
    if (agent_now_ns() >= deadline) {
      char msg[1400], cur[32] = "unset";
      if (js.has_current) snprintf(cur, sizeof cur, "%" PRId64, js.current);
      snprintf(
          msg, sizeof msg,
          "--jobset-in-place-restart: the barrier was not lifted within --rdzv-timeout %.0f "
          "s: the JobSet's currentInPlaceRestartAttempt is %s, this pod's attempt %" PRId64
          " (JobSet lifts it once every pod of the JobSet is annotated with the same "
          "attempt: are they all running, and is JobSet's InPlaceRestart feature gate on?)%s%s",
          a->cfg.rdzv_timeout_s, cur, a->jip.attempt, err[0] ? "; last API error: " : "", err);
      AGENT_ERROR("%s", msg);
      agent_set_error(a, msg);
      a->jip.final = 1;
      return AGENT_EXIT_UNAVAILABLE;
    }
  }
}

int agent_jobset_begin(agent_t *a) {
  if (!a->cfg.jobset_inplace) return 0;
  char err[900];
  agent_state_lock(&a->st);
  a->st.jip_enabled = 1;
  agent_state_unlock(&a->st);
  if (read_exit_code(&a->jip.exit_code)) return AGENT_EXIT_USAGE;
  if (agent_kube_cfg_load(&a->jip.kc, err, sizeof err)) {
    AGENT_ERROR("--jobset-in-place-restart: %s", err);
    agent_set_error(a, err);
    return AGENT_EXIT_USAGE;
  }
  int64_t deadline = agent_now_ns() + (int64_t)(a->cfg.rdzv_timeout_s * 1e9);
  agent_kube_jobset_t js;
  int rc, code, backoff = 0;
  while ((rc = agent_kube_get_jobset(&a->jip.kc, remaining_s(deadline), &js, err, sizeof err)))
    if ((code = retry_wait(a, rc, err, deadline, &backoff))) return code;
  publish(a, &js);
  if (agent_kube_jobset_bypass(&js)) {
    AGENT_INFO("JobSet %s/%s %s: no in-place restart barrier", a->jip.kc.namespace_,
               a->jip.kc.jobset,
               js.disabled ? "is annotated " AGENT_KUBE_DISABLE_KEY
                           : "does not use failurePolicy.restartStrategy InPlaceRestart");
    lift(a, 1);
    return 0;
  }
  a->jip.attempt = js.has_current ? js.current + 1 : 0;
  backoff = 0;
  while ((rc = agent_kube_patch_attempt(&a->jip.kc, a->jip.attempt, remaining_s(deadline), err,
                                        sizeof err)))
    if ((code = retry_wait(a, rc, err, deadline, &backoff))) return code;
  char cur[32] = "unset";
  if (js.has_current) snprintf(cur, sizeof cur, "%" PRId64, js.current);
  AGENT_INFO("pod %s/%s annotated " AGENT_KUBE_ATTEMPT_KEY "=%" PRId64
             " (JobSet %s: currentInPlaceRestartAttempt %s)",
             a->jip.kc.namespace_, a->jip.kc.pod, a->jip.attempt, a->jip.kc.jobset, cur);
  a->jip.w = agent_kube_watcher_start(&a->jip.kc, &js, err, sizeof err);
  if (!a->jip.w) {
    AGENT_ERROR("--jobset-in-place-restart: %s", err);
    return AGENT_EXIT_INTERNAL;
  }
  a->jip.active = 1;
  a->jip.seen = 0;
  long long base = (long long)a->jip.attempt * ((long long)a->cfg.max_restarts + 1);
  a->jip.restart_base = base > 1000000000LL ? 1000000000 : (int)base;
  publish(a, &js);
  return barrier(a, deadline);
}

int agent_jobset_poll(agent_t *a) {
  if (!a->jip.active || !a->jip.w || a->jip.restart_now) return 0;
  agent_kube_jobset_t js;
  char err[600];
  uint64_t seen = agent_kube_watcher_get(a->jip.w, &js, err, sizeof err);
  if (strcmp(err, a->jip.last_err)) {
    if (err[0]) AGENT_WARN("--jobset-in-place-restart: watching the JobSet: %s", err);
    agent_copy_str(a->jip.last_err, sizeof a->jip.last_err, err);
  }
  if (seen == a->jip.seen) return 0;
  a->jip.seen = seen;
  publish(a, &js);
  if (js.has_previous && a->jip.attempt <= js.previous && !agent_kube_jobset_bypass(&js)) {
    char msg[400];
    snprintf(msg, sizeof msg,
             "the JobSet restarts its pods in place (previousInPlaceRestartAttempt %" PRId64
             " >= this pod's attempt %" PRId64
             "): stopping the workers and exiting with "
             "IN_PLACE_RESTART_EXIT_CODE %d",
             js.previous, a->jip.attempt, a->jip.exit_code);
    AGENT_WARN("%s", msg);
    agent_set_error(a, msg);
    a->jip.restart_now = 1;
    return 1;
  }
  return 0;
}

int agent_jobset_exit_code(agent_t *a, int rc) {
  if (!a->jip.active && !a->jip.restart_now) return rc;
  if (a->jip.restart_now) return a->jip.exit_code;
  /* What restarting in place cannot mend, or what is not a failure, keeps its code: success,
   * a stop from outside (the pod deleted), bad configuration, an MPI_Abort (the job's own
   * decision), a barrier never lifted. */
  if (rc == AGENT_EXIT_OK || a->stop_sig || rc == AGENT_EXIT_USAGE || a->abort_code || a->jip.final)
    return rc;
  AGENT_WARN(
      "giving the restart to JobSet: exiting with IN_PLACE_RESTART_EXIT_CODE %d instead of "
      "%d, so the kubelet restarts this container in place and the JobSet restarts the "
      "group (failurePolicy.maxRestarts)",
      a->jip.exit_code, rc);
  return a->jip.exit_code;
}

void agent_jobset_end(agent_t *a) {
  agent_kube_watcher_stop(a->jip.w);
  a->jip.w = NULL;
  a->jip.active = 0;
}

/* A closed rendezvous round's life (rdzv.h): heartbeats of members and standbys, waiters admitted
 * by ending the round, the round's end with its reason, carry-over to a new store, and the exit
 * barrier. */
#define _GNU_SOURCE
#include "operator-agent/rendezvous/rdzv.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/status.h>

#include "operator-agent/common/log.h"
#include "operator-agent/rendezvous/rdzv_int.h"

/* r->end_reason/end_text from the value of <r>/end; one no agent writes fails the round as a
 * protocol error with the value in the text. */
static void take_end(agent_rdzv_t *r, const char *key, const char *v) {
  const char *text;
  if (!agent_rdzv_parse_end(v, &r->end_reason, &text)) {
    snprintf(r->end_text, sizeof r->end_text, "%s", text);
    return;
  }
  rdzv_bad_value(r, key, v, strlen(v), "'<reason> <text>' with a known reason");
  r->end_reason = AGENT_RESTART_PROTOCOL;
  rdzv_copy_trunc(r->end_text, sizeof r->end_text, r->err);
}

agent_rdzv_result_t agent_rdzv_end(agent_rdzv_t *r, agent_restart_reason_t reason,
                                   const char *text) {
  char key[96], val[320], got[320];
  snprintf(key, sizeof key, "%" PRId64 "/end", r->round);
  snprintf(val, sizeof val, "%s %s", agent_restart_reason_name(reason), text);
  agent_rdzv_result_t res = rdzv_cas(r, key, "", val, got, sizeof got);
  if (res < 0) return res;
  take_end(r, key, got);
  /* r->round <= AGENT_RDZV_MAX_ROUND (validated when joined): + 1 cannot overflow. If the round
   * holds something else (moved on, or garbage), the compare_set changes nothing and the next
   * join reads and judges it. */
  char exp[32], des[32];
  snprintf(exp, sizeof exp, "%" PRId64, r->round);
  snprintf(des, sizeof des, "%" PRId64, r->round + 1);
  res = rdzv_cas(r, "round", exp, des, got, sizeof got);
  return res < 0 ? res : AGENT_RDZV_ENDED;
}

/* The round counter moved from r->round to cur: find out why. */
static agent_rdzv_result_t read_end(agent_rdzv_t *r, int64_t cur) {
  char key[96], val[320];
  int found = 0;
  snprintf(key, sizeof key, "%" PRId64 "/end", r->round);
  agent_rdzv_result_t res = rdzv_get_opt(r, key, val, sizeof val, &found);
  if (res < 0) return res;
  if (!found) {
    /* Agents write <r>/end before moving the round, except one that lost the store and rejoins
     * past it. Either way somebody's round failed: it counts against --max-restarts. */
    r->end_reason = AGENT_RESTART_PEER_LOST;
    snprintf(r->end_text, sizeof r->end_text,
             "key round moved from %" PRId64 " to %" PRId64
             " with no %s record (an agent that "
             "lost the store rejoined, or something else wrote the key)",
             r->round, cur, key);
    return AGENT_RDZV_ENDED;
  }
  take_end(r, key, val);
  if (r->end_reason == AGENT_RESTART_MEMBERSHIP) {
    /* A membership change is free (not counted): only believe it with a waiter in the count. */
    int64_t joined;
    char jkey[96];
    snprintf(jkey, sizeof jkey, "%" PRId64 "/joined", r->round);
    if ((res = rdzv_add_in(r, jkey, 0, 0, AGENT_RDZV_MAX_COUNT, &joined)) < 0) return res;
    if (joined <= r->nmembers) {
      char text[1024];
      snprintf(text, sizeof text,
               "protocol error: key %s says 'membership %s' but no node is waiting to join "
               "(%s = %" PRId64 ", %" PRId64 " member(s))",
               key, r->end_text, jkey, joined, r->nmembers);
      r->end_reason = AGENT_RESTART_PROTOCOL;
      rdzv_copy_trunc(r->end_text, sizeof r->end_text, text);
    }
  }
  return AGENT_RDZV_ENDED;
}

static agent_rdzv_result_t heartbeat(agent_rdzv_t *r, int64_t now_ns) {
  if (now_ns < r->next_hb_ns) return AGENT_RDZV_PENDING;
  int first = r->next_hb_ns == 0;
  r->next_hb_ns = now_ns + (int64_t)(r->heartbeat_interval_s * NS_PER_S);
  char key[96], val[32];
  snprintf(key, sizeof key, "%" PRId64 "/hb/%" PRId64, r->round, r->idx);
  snprintf(val, sizeof val, "%" PRId64, ++r->hb_counter);
  agent_rdzv_result_t res = rdzv_set_str(r, key, val);
  if (res < 0 || first) return res;

  /* Liveness of the others: the leader reads every member, the others read the leader. */
  int64_t lo = 0, hi = r->group_rank == 0 ? r->nmembers : 1;
  size_t n = (size_t)(hi - lo);
  char **keys = calloc(n, sizeof *keys);
  void **vals = calloc(n, sizeof *vals);
  size_t *lens = calloc(n, sizeof *lens);
  if (!keys || !vals || !lens) {
    free(keys);
    free(vals);
    free(lens);
    snprintf(r->err, sizeof r->err, "out of memory reading heartbeats");
    return AGENT_RDZV_NO_MEMORY;
  }
  for (size_t i = 0; i < n; i++)
    if (asprintf(&keys[i], "%" PRId64 "/hb/%" PRId64, r->round, r->arrivals[lo + (int64_t)i]) < 0)
      keys[i] = NULL;
  tdist_status_t st = TDIST_ERR_NO_MEMORY;
  snprintf(r->err, sizeof r->err, "out of memory reading heartbeats");
  int ok_keys = 1;
  for (size_t i = 0; i < n; i++) ok_keys &= keys[i] != NULL;
  if (ok_keys) st = tdist_store_multi_get(r->store, (const char *const *)keys, n, vals, lens);
  if (!ok_keys)
    res = AGENT_RDZV_NO_MEMORY;
  else if (st != TDIST_OK)
    res = rdzv_fail(r, "multi_get of heartbeats", st);
  for (size_t i = 0; st == TDIST_OK && i < n; i++) {
    int64_t m = lo + (int64_t)i;
    char buf[32];
    size_t l = lens[i] < sizeof buf - 1 ? lens[i] : sizeof buf - 1;
    memcpy(buf, vals[i], l);
    buf[l] = 0;
    int64_t v;
    if (r->arrivals[m] == r->idx) continue;
    if (l != lens[i] || strlen(buf) != l || agent_rdzv_parse_int(buf, 0, INT64_MAX, &v)) {
      res = rdzv_bad_value(r, keys[i], vals[i], lens[i], "a heartbeat counter");
      break;
    }
    if (v != r->peer_hb[m]) {
      r->peer_hb[m] = v;
      r->peer_hb_change_ns[m] = now_ns;
    } else if (now_ns - r->peer_hb_change_ns[m] > (int64_t)(r->heartbeat_timeout_s * NS_PER_S)) {
      char text[200];
      snprintf(text, sizeof text, "node %d (%s) sent no heartbeat for %.1f s",
               r->members[m].node_rank, r->members[m].addr,
               (double)(now_ns - r->peer_hb_change_ns[m]) / NS_PER_S);
      res = agent_rdzv_mark_gone(r, r->members[m].node_rank);
      if (res >= 0) res = agent_rdzv_end(r, AGENT_RESTART_PEER_LOST, text);
      break;
    }
  }
  rdzv_free_multi(keys, vals, lens, n);
  return res;
}

/* Keeps the waiters that are not a member's node rank as this round's standbys; the heartbeat
 * state of those seen before carries over. */
static void keep_standbys(agent_rdzv_t *r, const agent_rdzv_member_t *w, int64_t nw,
                          int64_t now_ns) {
  agent_rdzv_member_t *sb = calloc((size_t)(nw ? nw : 1), sizeof *sb);
  int64_t *hb = calloc((size_t)(nw ? nw : 1), sizeof *hb);
  int64_t *ch = calloc((size_t)(nw ? nw : 1), sizeof *ch);
  if (!sb || !hb || !ch) {
    free(sb);
    free(hb);
    free(ch);
    return; /* the count is only shown: try again when the waiters change */
  }
  int k = 0;
  for (int64_t i = 0; i < nw; i++) {
    int is_member = 0;
    for (int64_t m = 0; m < r->nmembers && !is_member; m++)
      is_member = r->members[m].node_rank == w[i].node_rank;
    if (is_member) continue;
    sb[k] = w[i];
    hb[k] = -1;
    ch[k] = now_ns;
    for (int j = 0; j < r->nstandby; j++)
      if (r->standby[j].idx == w[i].idx) {
        hb[k] = r->sb_hb[j];
        ch[k] = r->sb_change_ns[j];
      }
    k++;
  }
  rdzv_free_standbys(r);
  r->standby = sb;
  r->sb_hb = hb;
  r->sb_change_ns = ch;
  r->nstandby = r->nstandby_live = k;
}

/* Agents that arrived after the round closed: admit them by ending the round when there is room,
 * or when one carries the node rank of a member (that member's pod was replaced); the others are
 * standbys. */
static agent_rdzv_result_t check_waiters(agent_rdzv_t *r, int64_t now_ns) {
  int64_t joined, nw;
  agent_rdzv_result_t res = rdzv_joined_count(r, &joined);
  /* Spare agents that can't be admitted stay in the count: read their records once. */
  if (res < 0 || joined <= r->nmembers || joined <= r->waiters_checked) return res;
  agent_rdzv_member_t *w;
  res = rdzv_read_waiters(r, joined, &w, &nw);
  /* All records there: read once. Some missing (being written, or fake joiners): next poll. */
  if (res >= 0 && nw >= 0) {
    r->waiters_checked = joined;
    keep_standbys(r, w, nw, now_ns);
  }
  char text[200] = "";
  for (int64_t i = 0; res >= 0 && i < nw && !text[0]; i++) {
    for (int64_t m = 0; m < r->nmembers; m++)
      if (r->members[m].node_rank == w[i].node_rank)
        snprintf(text, sizeof text, "node %d rejoined from %s (was %s): its pod was replaced",
                 w[i].node_rank, w[i].addr, r->members[m].addr);
    if (!text[0] && r->nmembers < r->nnodes_max)
      snprintf(text, sizeof text, "node %d (%s) is waiting to join: scaling from %" PRId64 " nodes",
               w[i].node_rank, w[i].addr, r->nmembers);
  }
  free(w);
  if (res < 0 || !text[0]) return res;
  /* A replaced pod means its old agent is gone: that is a lost peer, not a scale-up. */
  return agent_rdzv_end(
      r, strstr(text, "replaced") ? AGENT_RESTART_PEER_LOST : AGENT_RESTART_MEMBERSHIP, text);
}

/* The leader: which standbys still heartbeat (r->nstandby_live). Best effort, like the count. */
static agent_rdzv_result_t standby_liveness(agent_rdzv_t *r, int64_t now_ns) {
  if (!r->nstandby) return AGENT_RDZV_PENDING;
  size_t n = (size_t)r->nstandby;
  char **keys = calloc(n, sizeof *keys);
  void **vals = calloc(n, sizeof *vals);
  size_t *lens = calloc(n, sizeof *lens);
  int ok = keys && vals && lens;
  for (size_t i = 0; ok && i < n; i++)
    ok = asprintf(&keys[i], "%" PRId64 "/hb/%d", r->round, r->standby[i].idx) >= 0 ||
         (keys[i] = NULL, 0);
  agent_rdzv_result_t res = AGENT_RDZV_PENDING;
  tdist_status_t st = ok ? tdist_store_multi_get(r->store, (const char *const *)keys, n, vals, lens)
                         : TDIST_ERR_NO_MEMORY;
  if (st == TDIST_OK) {
    int live = 0;
    for (size_t i = 0; i < n; i++) {
      char buf[32];
      size_t l = lens[i] < sizeof buf - 1 ? lens[i] : sizeof buf - 1;
      memcpy(buf, vals[i], l);
      buf[l] = 0;
      int64_t v;
      if (agent_rdzv_parse_int(buf, 0, INT64_MAX, &v)) v = -2; /* not a beat: never alive */
      if (v != r->sb_hb[i] && v != -2) {
        r->sb_hb[i] = v;
        r->sb_change_ns[i] = now_ns;
      }
      live +=
          v != -2 && now_ns - r->sb_change_ns[i] <= (int64_t)(r->heartbeat_timeout_s * NS_PER_S);
    }
    r->nstandby_live = live;
  } else if (st != TDIST_ERR_NO_MEMORY) {
    res = rdzv_fail(r, "multi_get of standby heartbeats", st);
  }
  rdzv_free_multi(keys, vals, lens, n);
  return res;
}

agent_rdzv_result_t agent_rdzv_monitor(agent_rdzv_t *r, int64_t now_ns) {
  agent_rdzv_result_t res;
  int64_t cur;
  if ((res = rdzv_read_round(r, &cur)) < 0) return res;
  if (cur > r->round) return read_end(r, cur);
  /* The members' records, once (rdzv.h: <r>/table/<C>): the workers are running by now. */
  if ((res = agent_rdzv_load_members(r)) < 0) return res;
  int64_t due = r->next_hb_ns;
  if ((res = heartbeat(r, now_ns)) != AGENT_RDZV_PENDING) return res;
  if (r->group_rank == 0 && now_ns >= due && (res = standby_liveness(r, now_ns)) < 0) return res;
  return check_waiters(r, now_ns);
}

agent_rdzv_result_t agent_rdzv_standby_poll(agent_rdzv_t *r, int64_t now_ns) {
  agent_rdzv_result_t res;
  int64_t cur, done;
  if ((res = rdzv_read_round(r, &cur)) < 0) return res;
  if (cur > r->round) return AGENT_RDZV_ROUND_MOVED;
  char key[96], val[32], text[sizeof r->end_text];
  if (now_ns >= r->next_hb_ns) {
    r->next_hb_ns = now_ns + (int64_t)(r->heartbeat_interval_s * NS_PER_S);
    snprintf(key, sizeof key, "%" PRId64 "/hb/%" PRId64, r->round, r->idx);
    snprintf(val, sizeof val, "%" PRId64, ++r->hb_counter);
    if ((res = rdzv_set_str(r, key, val)) < 0) return res;
  }
  snprintf(key, sizeof key, "%" PRId64 "/done", r->round);
  if ((res = rdzv_add_in(r, key, 0, 0, AGENT_RDZV_MAX_COUNT, &done)) < 0) return res;
  if (r->closed_n && done >= r->closed_n) return AGENT_RDZV_ALL_DONE;
  int found = 0;
  if ((res = rdzv_get_opt(r, "failed", text, sizeof text, &found)) < 0) return res;
  if (!found) return AGENT_RDZV_PENDING;
  rdzv_copy_trunc(r->end_text, sizeof r->end_text, text);
  return AGENT_RDZV_JOB_FAILED;
}

agent_rdzv_result_t agent_rdzv_carry_over(agent_rdzv_t *r, int lost) {
  if (r->carry_round < 0 || !r->carry_nodes) return AGENT_RDZV_PENDING;
  char key[96], got[8];
  int found = 0;
  snprintf(key, sizeof key, "%" PRId64 "/closed", r->carry_round);
  agent_rdzv_result_t res = rdzv_get_opt(r, key, got, sizeof got, &found);
  if (res < 0 || found) return res < 0 ? res : AGENT_RDZV_PENDING;
  char *val = malloc((size_t)r->carry_n * 12 + 1);
  if (!val) {
    snprintf(r->err, sizeof r->err, "out of memory carrying round %" PRId64, r->carry_round);
    return AGENT_RDZV_NO_MEMORY;
  }
  size_t len = 0;
  val[0] = 0;
  for (int i = 0; i < r->carry_n; i++)
    len += (size_t)sprintf(val + len, "%s%d", i ? " " : "", r->carry_nodes[i]);
  char cur[16];
  snprintf(key, sizeof key, "%" PRId64 "/members", r->carry_round);
  res = rdzv_cas(r, key, "", val, cur, sizeof cur);
  free(val);
  if (res < 0 || lost < 0) return res < 0 ? res : AGENT_RDZV_PENDING;
  snprintf(key, sizeof key, "%" PRId64 "/gone/%d", r->carry_round, lost);
  return rdzv_set_str(r, key, "1");
}

agent_rdzv_result_t agent_rdzv_mark_gone(agent_rdzv_t *r, int node_rank) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/gone/%d", r->round, node_rank);
  return rdzv_set_str(r, key, "1");
}

agent_rdzv_result_t agent_rdzv_job_failed(agent_rdzv_t *r, const char *text) {
  return rdzv_set_str(r, "failed", text[0] ? text : "the job gave up");
}

agent_rdzv_result_t agent_rdzv_standby_exited(agent_rdzv_t *r, int64_t delta, int64_t *exited) {
  return rdzv_add_in(r, "standby_exited", delta, 0, AGENT_RDZV_MAX_COUNT, exited);
}

agent_rdzv_result_t agent_rdzv_done_poll(agent_rdzv_t *r, int64_t now_ns, int *marked) {
  char key[96];
  int64_t done;
  snprintf(key, sizeof key, "%" PRId64 "/done", r->round);
  agent_rdzv_result_t res = rdzv_add_in(r, key, *marked ? 0 : 1, 0, AGENT_RDZV_MAX_COUNT, &done);
  if (res < 0) return res;
  *marked = 1;
  if (done >= r->nmembers) return AGENT_RDZV_ALL_DONE;
  return agent_rdzv_monitor(r, now_ns);
}

agent_rdzv_result_t agent_rdzv_mark_exited(agent_rdzv_t *r, int64_t *exited) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/exited", r->round);
  return rdzv_add_in(r, key, 1, 0, AGENT_RDZV_MAX_COUNT, exited);
}

agent_rdzv_result_t agent_rdzv_exited_count(agent_rdzv_t *r, int64_t *exited) {
  char key[96];
  snprintf(key, sizeof key, "%" PRId64 "/exited", r->round);
  return rdzv_add_in(r, key, 0, 0, AGENT_RDZV_MAX_COUNT, exited);
}

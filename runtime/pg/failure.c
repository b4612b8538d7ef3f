/* A failed collective's root cause, shared among the group's ranks.
 *
 * Only the ranks next to a failure see it first-hand: with rank 2 killed, rank 1 reads EOF from
 * it, while rank 0, waiting on rank 1 in a ring, would time out blaming rank 1 (or see rank 1
 * leave, once rank 1 gives up). So the first rank whose collective fails records its error in
 * the group's store under FAIL_KEY (compare_set from empty: the first writer wins) before it
 * hangs up its connections; every later failing rank finds the record and reports that cause
 * first, with its own view after it:
 *   "all_reduce #720: rank 2 (10.0.0.3:41234) closed its connection ... (first seen by rank 1;
 *    here: all_reduce #720: rank 1 (10.0.0.2:40515) closed its connection ...)"
 * The record is written before the hangup, so a rank that sees this one leave always finds it.
 * Only a rank whose own failure is a peer leaving (TDIST_ERR_REMOTE) adopts the record: a
 * timeout names the rank it waited for, and rank 0 of a monitored_barrier names the absent
 * ranks, which is already the cause.
 * Store calls here take at most FAIL_STORE_MS each (their own timeout: the handle's, which the
 * user's threads share, stays as it is): the store may be what failed. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/pg/group.h"
#include "runtime/store/store_internal.h"

#define FAIL_KEY "tdist_failure"
#define FAIL_STORE_MS 2000

tdist_status_t tdist__pg_share_failure(tdist_pg_t *pg, tdist_status_t st) {
  char mine[TDIST__ERRMSG_MAX];
  pthread_mutex_lock(&pg->err_mu);
  snprintf(mine, sizeof mine, "%s", pg->err);
  pthread_mutex_unlock(&pg->err_mu);
  tdist_status_t ret = st;
  if (pg->b.store && pg->b.size > 1) {
    /* "RANK STATUS TEXT" */
    char rec[TDIST__ERRMSG_MAX + 32];
    int n = snprintf(rec, sizeof rec, "%d %d %s", pg->b.rank, (int)st, mine);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof rec ? (size_t)n : sizeof rec - 1;
    void *held = NULL;
    size_t held_len = 0;
    int first = -1, first_st = 0, off = 0;
    if (tdist__store_compare_set_ms(pg->b.store, FAIL_KEY, "", 0, rec, len, &held, &held_len,
                                    FAIL_STORE_MS) == TDIST_OK &&
        held && st == TDIST_ERR_REMOTE && (held_len != len || memcmp(held, rec, len) != 0)) {
      /* Another rank was first and this one saw a peer leave: perhaps a peer that gave up
       * after that first failure. Its cause goes first, unless it is ours too. */
      char head[40];
      size_t hl = held_len < sizeof head - 1 ? held_len : sizeof head - 1;
      memcpy(head, held, hl);
      head[hl] = '\0';
      if (sscanf(head, "%d %d %n", &first, &first_st, &off) == 2 && off > 0 &&
          (size_t)off <= held_len && first_st < 0 && first_st >= TDIST_ERR_PROTOCOL) {
        const char *text = (const char *)held + off;
        size_t tl = held_len - (size_t)off, ml = strlen(mine);
        if (!(tl == ml && !memcmp(text, mine, ml))) {
          tdist__pg_fail(pg, (tdist_status_t)first_st, "%.*s (first seen by rank %d; here: %s)",
                         (int)tl, text, first, mine);
          ret = (tdist_status_t)first_st;
        }
      }
    }
    free(held);
  }
  if (pg->be->hangup) pg->be->hangup(&pg->b);
  return ret;
}

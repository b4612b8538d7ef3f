/* What the rendezvous' files share (rdzv.c: join and close; rdzv_round.c: a closed round's life;
 * rdzv_store.c: store traffic; rdzv_record.c: the codec). Not for the rest of the agent: rdzv.h is
 * the module's interface. Every function that returns agent_rdzv_result_t returns
 * AGENT_RDZV_PENDING on success or a negative result with r->err set. */
#ifndef TDIST_OPERATOR_AGENT_RENDEZVOUS_RDZV_INT_H
#define TDIST_OPERATOR_AGENT_RENDEZVOUS_RDZV_INT_H

#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>

#include "operator-agent/rendezvous/rdzv.h"

#define NS_PER_S 1000000000LL

/* rdzv_store.c */
/* r->err from a failed store call on `what` (a key); STORE_ERROR or NO_MEMORY. */
agent_rdzv_result_t rdzv_fail(agent_rdzv_t *r, const char *what, tdist_status_t st);
/* r->err naming a value (shown printable, cut) that no agent of this job writes; PROTOCOL_ERROR. */
agent_rdzv_result_t rdzv_bad_value(agent_rdzv_t *r, const char *key, const void *v, size_t n,
                                   const char *want);
/* ADD, then the result checked against lo..hi (a value out of it is a protocol error). */
agent_rdzv_result_t rdzv_add_in(agent_rdzv_t *r, const char *key, int64_t delta, int64_t lo,
                                int64_t hi, int64_t *out);
agent_rdzv_result_t rdzv_set_str(agent_rdzv_t *r, const char *key, const char *v);
/* The round counter ("round"), without changing it. */
agent_rdzv_result_t rdzv_read_round(agent_rdzv_t *r, int64_t *cur);
/* compare_set with string values; the resulting value goes to out (NUL-terminated, cut to cap). */
agent_rdzv_result_t rdzv_cas(agent_rdzv_t *r, const char *key, const char *expected,
                             const char *desired, char *out, size_t cap);
/* Value of key if it exists (*found = 1), without waiting (NUL-terminated, cut to cap). */
agent_rdzv_result_t rdzv_get_opt(agent_rdzv_t *r, const char *key, char *out, size_t cap,
                                 int *found);
/* The value of key, allocated (NUL-terminated; the caller frees), or *out = NULL if absent. */
agent_rdzv_result_t rdzv_get_alloc(agent_rdzv_t *r, const char *key, char **out);
void rdzv_copy_trunc(char *dst, size_t cap, const char *src);
/* Frees a multi_get's key names, values (either array may be NULL) and lengths, n of each. */
void rdzv_free_multi(char **keys, void **vals, size_t *lens, size_t n);

/* rdzv_record.c */
/* Splits off the next space-separated token of *s into tok (cap bytes); -1 if none or too long. */
int rdzv_token(const char **s, char *tok, size_t cap);
/* qsort comparator of int64_t. */
int rdzv_cmp_i64(const void *a, const void *b);

/* rdzv.c */
void rdzv_free_standbys(agent_rdzv_t *r);
/* How many agents have taken an arrival index in the current round. */
agent_rdzv_result_t rdzv_joined_count(agent_rdzv_t *r, int64_t *joined);
/* The records of the agents of the current round that are not members (arrivals 1..joined; of
 * several arrivals with one node rank the latest) into *w (caller frees; NULL when none), their
 * count into *nw: at most AGENT_RDZV_MAX_WAITERS, -1 when some record is missing (none read). */
agent_rdzv_result_t rdzv_read_waiters(agent_rdzv_t *r, int64_t joined, agent_rdzv_member_t **w,
                                      int64_t *nw);

#endif

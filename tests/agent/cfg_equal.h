/* Field-by-field comparison of two agent_cfg_t (operator-agent/config/config.h), for round-trip
 * checks in config_test and the config fuzz target. config_path and check_config are not
 * compared: they are not part of the YAML form. Header-only, testonly. */
#ifndef TDIST_TESTS_AGENT_CFG_EQUAL_H
#define TDIST_TESTS_AGENT_CFG_EQUAL_H

#include <stdio.h>
#include <string.h>

#include "operator-agent/config/config.h"

static inline int cfg_str_eq_(const char *a, const char *b) {
  return (a == NULL && b == NULL) || (a && b && !strcmp(a, b));
}

/* 1 if equal; else 0 with the first differing field named in why. */
static inline int cfg_equal(const agent_cfg_t *a, const agent_cfg_t *b, char *why, size_t cap) {
#define CFG_EQ_NUM_(f)                                                        \
  if (a->f != b->f) {                                                         \
    snprintf(why, cap, "%s: %.17g != %.17g", #f, (double)a->f, (double)b->f); \
    return 0;                                                                 \
  }
#define CFG_EQ_STR_(f)                                                                          \
  if (!cfg_str_eq_(a->f, b->f)) {                                                               \
    snprintf(why, cap, "%s: '%s' != '%s'", #f, a->f ? a->f : "(null)", b->f ? b->f : "(null)"); \
    return 0;                                                                                   \
  }
  CFG_EQ_NUM_(nnodes_min)
  CFG_EQ_NUM_(nnodes_max)
  CFG_EQ_NUM_(spares)
  CFG_EQ_NUM_(spares_in_nnodes)
  CFG_EQ_NUM_(nproc_per_node)
  CFG_EQ_NUM_(node_rank)
  CFG_EQ_STR_(master_addr)
  CFG_EQ_NUM_(master_port)
  CFG_EQ_STR_(run_id)
  CFG_EQ_NUM_(max_restarts)
  CFG_EQ_NUM_(jobset_inplace)
  CFG_EQ_NUM_(monitor_interval_s)
  CFG_EQ_NUM_(standalone)
  CFG_EQ_STR_(role)
  CFG_EQ_STR_(backend)
  CFG_EQ_NUM_(rdzv_timeout_s)
  CFG_EQ_NUM_(last_call_s)
  CFG_EQ_NUM_(heartbeat_interval_s)
  CFG_EQ_NUM_(heartbeat_timeout_s)
  CFG_EQ_NUM_(stop_grace_s)
  CFG_EQ_NUM_(scheme)
  CFG_EQ_STR_(master_template)
  CFG_EQ_STR_(job_name)
  CFG_EQ_STR_(service)
  CFG_EQ_STR_(namespace_)
  CFG_EQ_STR_(cluster_domain)
  CFG_EQ_STR_(replicated_job)
  CFG_EQ_STR_(task)
  CFG_EQ_STR_(http_host)
  CFG_EQ_NUM_(http_port)
  CFG_EQ_STR_(http_port_file)
  CFG_EQ_STR_(log_dir)
  CFG_EQ_NUM_(keep_run_dir)
  CFG_EQ_NUM_(omp_num_threads)
  CFG_EQ_NUM_(log_format)
  CFG_EQ_NUM_(nenv)
  for (size_t i = 0; i < a->nenv; i++) {
    CFG_EQ_STR_(env[i].name)
    CFG_EQ_STR_(env[i].value)
  }
  CFG_EQ_NUM_(ncmd)
  for (size_t i = 0; i < a->ncmd; i++) CFG_EQ_STR_(cmd[i])
  if ((a->cmd == NULL) != (b->cmd == NULL) || (a->cmd && (a->cmd[a->ncmd] || b->cmd[b->ncmd]))) {
    snprintf(why, cap, "cmd: list not NULL-terminated the same way");
    return 0;
  }
#undef CFG_EQ_NUM_
#undef CFG_EQ_STR_
  return 1;
}

#endif

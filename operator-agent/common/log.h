/* Agent logging: one line per event on stderr, as text or as JSON (--log-format). Each line is
 * formatted whole and written with one write(2), so lines never interleave with workers' output
 * mid-line. Safe from any thread; never allocates. */
#ifndef TDIST_AGENT_LOG_H
#define TDIST_AGENT_LOG_H

typedef enum {
  AGENT_LOG_ERROR = 0,
  AGENT_LOG_WARN = 1,
  AGENT_LOG_INFO = 2,
  AGENT_LOG_DEBUG = 3
} agent_log_level_t;
typedef enum { AGENT_LOG_FORMAT_TEXT = 0, AGENT_LOG_FORMAT_JSON = 1 } agent_log_format_t;

/* Set once at start-up (before threads). Unset, the level comes from TDIST_LOG_LEVEL
 * (operator-agent/common/param.h: error|warn|info|debug, default info). */
void agent_log_set_format(agent_log_format_t format);
void agent_log_set_level(agent_log_level_t level);
/* Fixed fields added to every line (JSON: "node_rank"); -1 = not known yet. */
void agent_log_set_node_rank(int node_rank);

void agent_log(agent_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define AGENT_ERROR(...) agent_log(AGENT_LOG_ERROR, __VA_ARGS__)
#define AGENT_WARN(...) agent_log(AGENT_LOG_WARN, __VA_ARGS__)
#define AGENT_INFO(...) agent_log(AGENT_LOG_INFO, __VA_ARGS__)
#define AGENT_DEBUG(...) agent_log(AGENT_LOG_DEBUG, __VA_ARGS__)

#endif

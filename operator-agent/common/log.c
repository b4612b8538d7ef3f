/* See log.h. Text lines look like
 *   tdist-agent I 2026-12-02T17:00:00.123Z node 1: message
 * JSON lines like
 *   {"ts":"2026-12-02T17:00:00.123Z","level":"info","node_rank":1,"msg":"message"}  */
#include "operator-agent/common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/common/param.h"

static agent_log_format_t g_format = AGENT_LOG_FORMAT_TEXT;
static int g_level = -1;
static volatile int g_node_rank = -1;

void agent_log_set_format(agent_log_format_t format) { g_format = format; }
void agent_log_set_level(agent_log_level_t level) { g_level = (int)level; }
void agent_log_set_node_rank(int node_rank) { g_node_rank = node_rank; }

/* Unless set: TDIST_LOG_LEVEL (operator-agent/common/param.h), whose choices
 * error|warn|warning|info|debug map to these levels. main() refuses to start with a bad value. */
static int level_now(void) {
  static const int k_levels[] = {AGENT_LOG_ERROR, AGENT_LOG_WARN, AGENT_LOG_WARN, AGENT_LOG_INFO,
                                 AGENT_LOG_DEBUG};
  if (g_level >= 0) return g_level;
  long long k = agent_param_int(AGENT_P_LOG_LEVEL);
  return k >= 0 && k < (long long)(sizeof k_levels / sizeof k_levels[0]) ? k_levels[k]
                                                                         : AGENT_LOG_INFO;
}

/* Appends s to buf as the inside of a JSON string. */
static size_t json_escape(char *buf, size_t cap, size_t n, const char *s) {
  for (; *s && n + 7 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      buf[n++] = '\\';
      buf[n++] = (char)c;
    } else if (c == '\n') {
      buf[n++] = '\\';
      buf[n++] = 'n';
    } else if (c < 0x20) {
      n += (size_t)snprintf(buf + n, cap - n, "\\u%04x", c);
    } else {
      buf[n++] = (char)c;
    }
  }
  return n;
}

void agent_log(agent_log_level_t level, const char *fmt, ...) {
  if ((int)level > level_now()) return;
  static const char letters[] = "EWID";
  static const char *const names[] = {"error", "warn", "info", "debug"};
  char msg[1536], line[2048];
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (m < 0) return;
  struct timeval tv;
  struct tm tm;
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  char ts[64];
  snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
           tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000) % 1000);
  size_t n;
  int rank = g_node_rank;
  if (g_format == AGENT_LOG_FORMAT_JSON) {
    n = (size_t)snprintf(line, sizeof line, "{\"ts\":\"%s\",\"level\":\"%s\",", ts, names[level]);
    if (rank >= 0) n += (size_t)snprintf(line + n, sizeof line - n, "\"node_rank\":%d,", rank);
    n += (size_t)snprintf(line + n, sizeof line - n, "\"msg\":\"");
    n = json_escape(line, sizeof line - 3, n, msg);
    line[n++] = '"';
    line[n++] = '}';
  } else {
    if (rank >= 0)
      n = (size_t)snprintf(line, sizeof line, "tdist-agent %c %s node %d: %s", letters[level], ts,
                           rank, msg);
    else
      n = (size_t)snprintf(line, sizeof line, "tdist-agent %c %s: %s", letters[level], ts, msg);
    if (n > sizeof line - 2) n = sizeof line - 2;
  }
  line[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, n);
  (void)w;
}

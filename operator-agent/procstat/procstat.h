/* Reading one worker's /proc/PID/{stat,status,io}: the per-rank process metrics of issue 37.
 *
 * The parsers are pure (text in, fields out) and never trust the text: a field that is missing,
 * not a number or out of range makes the parse fail, never a partial value. The reader opens and
 * reads each file once into the caller's buffer and allocates nothing, so the agent can sample
 * every worker at the monitor interval. Never blocks beyond the /proc reads. Thread-safe (no
 * state). */
#ifndef TDIST_AGENT_PROCSTAT_H
#define TDIST_AGENT_PROCSTAT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* One sample of one process. Counters are the process's own since it started (a restarted
 * worker is a new process: they start again from 0, Prometheus' counter reset). */
typedef struct {
  int64_t t_ns;          /* CLOCK_MONOTONIC when it was read */
  uint64_t utime_ticks;  /* stat field 14, all threads, clock ticks (sysconf(_SC_CLK_TCK)) */
  uint64_t stime_ticks;  /* stat field 15 */
  uint64_t rss_bytes;    /* status VmRSS */
  uint64_t threads;      /* status Threads */
  char state;            /* stat field 3: 'R' 'S' 'D' 'T' 't' 'Z' 'X' 'I' ... */
  uint64_t vcsw, ivcsw;  /* status voluntary_/nonvoluntary_ctxt_switches */
  uint64_t rchar, wchar; /* io: bytes through read(2)/write(2) and kin (files, pipes,
                          * sockets), as the process asked for them */
  int have_io;           /* 0 when /proc/PID/io could not be read (permission) */
} agent_proc_sample_t;

/* Parsers: 0 and the fields set, or -1 (the text is not what the kernel writes). len is the
 * text's length; the text need not be NUL-terminated. */
int agent_procstat_parse_stat(const char *text, size_t len, agent_proc_sample_t *s);
int agent_procstat_parse_status(const char *text, size_t len, agent_proc_sample_t *s);
int agent_procstat_parse_io(const char *text, size_t len, agent_proc_sample_t *s);

/* Reads and parses /proc/<pid>/{stat,status,io} (under proc_root, NULL = "/proc"), using buf
 * (cap >= 4096) as scratch. 0 with *s complete (have_io 0 when only io was unreadable);
 * -ESRCH when the process is gone (also when it vanished between stat and status); -EPROTO when a
 * file did not parse; another -errno for an unexpected open/read failure. */
int agent_procstat_read(const char *proc_root, pid_t pid, agent_proc_sample_t *s, char *buf,
                        size_t cap);

/* The three files of one process, kept open between samples: a sample is then three pread(2)s
 * at offset 0 (measured here: 11 us for the three instead of 68 us with open and close each
 * time). The descriptors are close-on-exec and stay bound to that process: once it is reaped
 * they read -ESRCH, never another process that got its pid. */
typedef struct {
  pid_t pid; /* 0: closed */
  int fd[3]; /* stat, status, io (io -1 when it could not be opened) */
} agent_proc_files_t;

#define AGENT_PROC_FILES_INIT \
  {                           \
    0, { -1, -1, -1 }         \
  }

/* Opens /proc/<pid>/{stat,status,io} under proc_root (NULL = "/proc") into *f (closed first if
 * open). 0, or -errno (-ESRCH: no such process) with *f closed. */
int agent_procstat_open(agent_proc_files_t *f, const char *proc_root, pid_t pid);
/* One sample through the open files, as agent_procstat_read. */
int agent_procstat_sample(agent_proc_files_t *f, agent_proc_sample_t *s, char *buf, size_t cap);
/* Closes the files; closed ones are a no-op. */
void agent_procstat_close(agent_proc_files_t *f);

/* What the kernel says one thread is doing (for the hang report). */
typedef struct {
  pid_t tid;
  char comm[32];  /* /proc/PID/task/TID/comm, newline removed */
  char state;     /* stat field 3 of the thread; '?' when unreadable */
  char wchan[64]; /* /proc/PID/task/TID/wchan: the kernel function it sleeps in; "0" or ""
                   * when running or when the kernel hides it (kptr_restrict, containers) */
} agent_thread_info_t;

/* Lists up to max threads of pid (sorted by tid); *total gets how many there are. Returns how
 * many were written, or -errno (-ESRCH: the process is gone). Opens one directory and three
 * small files per thread: for reports, not for the sampling path. */
int agent_procstat_threads(const char *proc_root, pid_t pid, agent_thread_info_t *out, int max,
                           int *total);

#endif

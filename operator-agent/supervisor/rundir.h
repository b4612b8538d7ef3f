/* The agent's run directory: <base>/tdist-<run_id>_<random>, where the workers' error files,
 * stats files and flight-recorder dumps live.
 *
 * Created with mkdtemp (a fresh name, mode 0700, never an existing path or a planted link),
 * then checked (a directory, owned by the effective uid, mode 0700). Removed at exit without
 * following symbolic links (openat/unlinkat, O_NOFOLLOW), so a link a worker left inside points
 * nowhere harmful. */
#ifndef TDIST_AGENT_RUNDIR_H
#define TDIST_AGENT_RUNDIR_H

#include <stddef.h>

/* Creates base if missing (mkdir -p, 0755), then the run directory in it into out (cap bytes).
 * Returns 0, or -1 with err (one line naming the path and errno text). */
int agent_run_dir_create(const char *base, const char *run_id, char *out, size_t cap, char *err,
                         size_t err_cap);

/* Removes dir and everything under it, never following a link (a link is removed, not its
 * target). Returns 0, or -1 with err naming the first entry that could not be removed. */
int agent_run_dir_remove(const char *dir, char *err, size_t err_cap);

#endif

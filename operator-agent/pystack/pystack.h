/* Python stacks of the workers and PyTorch's NCCL flight-recorder dumps, for the hang report
 * (docs/agent.md, "Python stacks and flight-recorder dumps").
 *
 * Python stacks: the agent writes sitecustomize.py (this folder) into RUN_DIR/python and puts that
 * directory first on every worker's PYTHONPATH, with TDIST_PY_STACKS_FILE (the rank's file in its
 * attempt directory) and TDIST_PY_STACKS_SIGNAL. At start-up the worker's interpreter registers
 * faulthandler for that signal (all threads) and chains to the next sitecustomize on sys.path. To
 * take the stacks the agent sends the signal and, a moment later, reads what the rank appended to
 * its file: CPython's C-level handler writes them without stopping the job, even while the main
 * thread is blocked in C (a collective) or spins in Python. The signal is SIGRTMIN+5, never sent
 * to a process that does not catch it (SigCgt) or whose file does not exist: a real-time signal's
 * default action is to terminate.
 *
 * Flight recorder: workers get TORCH_NCCL_DEBUG_INFO_TEMP_FILE=RUN_DIR/attempt_N/nccl_trace_rank_,
 * TORCH_NCCL_TRACE_BUFFER_SIZE=2000 and TORCH_NCCL_DUMP_ON_TIMEOUT=1 unless the user set them;
 * tdist_frtrace.py (this folder, also written to RUN_DIR/python) reads the dumps a watchdog
 * timeout leaves there with the workers' python and names the rank that is behind.
 *
 * Never blocks longer than the deadline given; no allocation except in agent_pystack_install. */
#ifndef TDIST_AGENT_PYSTACK_H
#define TDIST_AGENT_PYSTACK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The signal that makes a worker write its stacks: SIGRTMIN + 5. */
int agent_pystack_signal(void);

/* Writes sitecustomize.py and tdist_frtrace.py into RUN_DIR/python (created, 0755; files 0644),
 * the directory agent_pystack_pydir names. 0, or -1 with err naming the path and errno text. */
int agent_pystack_install(const char *run_dir, char *err, size_t cap);

/* RUN_DIR/python into out. */
void agent_pystack_pydir(const char *run_dir, char *out, size_t cap);

/* Whether process pid catches sig (bit sig-1 of /proc/PID/status SigCgt). 0 when unknown. */
int agent_pystack_catches(pid_t pid, int sig);

/* 1 when pid is stopped (state T or t: SIGSTOP, a debugger's stop), when its signal handlers
 * cannot run; its stacks are then read from its memory (pyframes.h). */
int agent_pystack_stopped(pid_t pid);

/* Asks worker pid for its stacks: notes the size of file in *offset, then sends the signal. 1:
 * sent; 0: not sent, why says why (no file: the worker is not Python or runs without tdist's
 * sitecustomize, e.g. python -I or -E, or TDIST_PY_STACKS=0; it does not catch the signal).
 * A stopped process (state T) gets the signal too: it writes its stacks when continued; why then
 * says so and 1 is returned. */
int agent_pystack_request(pid_t pid, const char *file, off_t *offset, char *why, size_t cap);

/* Reads what was appended to file since offset into out (cap bytes, NUL-terminated; the start
 * kept when longer, with "\n[... N more bytes]" at the end), without the registration line.
 * Returns the bytes appended (0: nothing yet), or -1 if file cannot be read. */
ssize_t agent_pystack_read(const char *file, off_t offset, char *out, size_t cap);

/* Runs `python PYDIR/tdist_frtrace.py --brief PREFIX WORLD_SIZE` and waits for it at most
 * timeout_ms (then kills it): 1 with behind (the ranks behind, "1,3", or "" for none) and summary
 * set when PREFIX<rank> dumps exist, 0 when none does (nothing run), -1 with summary saying why
 * when the analyzer failed. Blocks the caller up to timeout_ms. */
int agent_frtrace_analyze(const char *python, const char *pydir, const char *prefix, int world_size,
                          int timeout_ms, char *behind, size_t behind_cap, char *summary,
                          size_t summary_cap);

#endif

/* Python stacks read from a process's memory, with no signal and no help from the process: the
 * way to a *stopped* worker's stacks (state T: SIGSTOP, a debugger's stop), whose faulthandler
 * cannot run until it is continued (pystack.h).
 *
 * The agent finds CPython's _PyRuntime (the dynamic symbol table of the python executable or
 * libpython mapped in the process; a chroot'ed worker's too),
 * reads Py_Version, and walks interpreter -> thread states -> frames with process_vm_readv:
 *   - CPython 3.13: the offsets come from the process itself (_Py_DebugOffsets at the start of
 *     _PyRuntime, which CPython keeps for debuggers);
 *   - CPython 3.11: offsets fixed for 64-bit builds (tests/agent:pyframes_test checks the frames
 *     read against the ones the process printed itself, on Debian 12's python3.11);
 *   - any other version: refused with the reason (3.12 has no debug offsets and other layouts).
 * Each frame gives file, line (the code object's location table at the frame's instruction) and
 * function, in faulthandler's format ("Thread 0x... (most recent call first):" then
 * '  File "f.py", line 12 in name'), so the report reads the same whichever way it was taken.
 *
 * What it needs: ptrace-read access to the process (the agent is its parent, which Yama's
 * ptrace_scope 1 allows; as another user, CAP_SYS_PTRACE). The process is never stopped or
 * written to; reading a running one gives a best-effort snapshot (a frame may change under it:
 * every pointer is bounded and a bad one ends that thread's walk, never the agent). */
#ifndef TDIST_AGENT_PYFRAMES_H
#define TDIST_AGENT_PYFRAMES_H

#include <stddef.h>
#include <sys/types.h>

/* Writes pid's Python stacks into out (cap bytes, NUL-terminated; cut at a line when longer).
 * Returns the bytes written (> 0), or -1 with why saying what was missing (not a CPython
 * process, an unsupported version, no access). Never blocks; a few hundred reads at most. */
ssize_t agent_pyframes_read(pid_t pid, char *out, size_t cap, char *why, size_t why_cap);

/* CPython's line number for byte offset addr of a code object whose location table (3.11+
 * format) is table[0..n) and whose first line is first_line; -1 when the table says the
 * instruction has no line or addr is past its end. Exposed for tests. */
int agent_pyframes_addr2line(const unsigned char *table, size_t n, int first_line, int addr);

#endif

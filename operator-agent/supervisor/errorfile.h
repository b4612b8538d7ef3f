/* Reading a worker's TORCHELASTIC_ERROR_FILE (torch-contracts.md §2.8): the JSON that PyTorch's
 * @record writes on an uncaught exception, or the short form {"message": "...", "timestamp": N}.
 * A small bounded JSON reader: never trusts the file (size-capped, depth-capped, any bytes). */
#ifndef TDIST_AGENT_ERRORFILE_H
#define TDIST_AGENT_ERRORFILE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  char message[1024];   /* message.message, or message when it is a string; "" if absent */
  char traceback[4096]; /* message.extraInfo.py_callstack, possibly truncated; "" if absent */
  int64_t timestamp;    /* message.extraInfo.timestamp (a string of digits) or timestamp; 0 */
  int has_error_code;
  int error_code; /* message.errorCode when present */
} agent_error_info_t;

/* Parses buf (len bytes, need not be NUL-terminated). Returns 0 when it is one of the two forms,
 * -1 (info zeroed, err set) when it is not valid JSON or has neither form. Strings come out as
 * valid UTF-8 without NULs (invalid bytes, lone surrogates and \u0000 become U+FFFD); one too
 * long for its field keeps its head and ends "..." (message) or keeps its tail and starts
 * "...\n" (traceback: the end names the exception), cut on a character boundary. For duplicate
 * keys the last wins. Nesting deeper than 64 levels is an error. */
int agent_errorfile_parse(const char *buf, size_t len, agent_error_info_t *info, char *err,
                          size_t cap);

/* Reads at most 1 MiB of path and parses it. Returns 0, -1 on a parse error (also: a larger
 * file, one that is not a regular file — a FIFO never blocks — or unreadable), -2 when the file
 * does not exist (the worker wrote none: "<N/A>"). err names the path. */
int agent_errorfile_read(const char *path, agent_error_info_t *info, char *err, size_t cap);

/* Whether an error message reads as the consequence of another process's failure rather than a
 * cause: a collective that lost its peer (gloo's "Connection closed by peer", "Connection reset
 * by peer", a broken pipe, NCCL's "remote process exited", an aborted communicator, libtdist's
 * "closed the connection"). Case-insensitive; NULL or "" is not. The root-cause choice prefers
 * failures this does not match: when rank 0 exits 3 without an error file, rank 1's
 * "Connection closed by peer" written a moment before rank 0's process is gone is not the cause. */
int agent_errorfile_is_peer_loss(const char *message);

#endif

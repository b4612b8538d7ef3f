/* Status codes shared by every tdist call.
 *
 * 0 is success; every error is negative. Values are append-only: a released value never changes
 * meaning. The category says whose fault it is; the detail (syscall, errno text, peer address) is
 * kept per handle (tdist_store_last_error) or, for constructors that produce no handle, per
 * thread (tdist_last_error). */
#ifndef TDIST_STATUS_H
#define TDIST_STATUS_H

#include "tdist/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, text) */
#define TDIST_STATUS_LIST(X)                                                        \
  X(TDIST_OK, 0, "success")                                                         \
  X(TDIST_ERR_INVALID_ARGUMENT, -1, "invalid argument")                             \
  X(TDIST_ERR_INVALID_USAGE, -2, "invalid usage")                                   \
  X(TDIST_ERR_SYSTEM, -3, "system error")                                           \
  X(TDIST_ERR_REMOTE, -4, "remote error: peer closed the connection or misbehaved") \
  X(TDIST_ERR_TIMEOUT, -5, "timed out")                                             \
  X(TDIST_ERR_ABORTED, -6, "aborted")                                               \
  X(TDIST_ERR_IN_PROGRESS, -7, "in progress")                                       \
  X(TDIST_ERR_NOT_AVAILABLE, -8, "not available")                                   \
  X(TDIST_ERR_INTERNAL, -9, "internal error")                                       \
  X(TDIST_ERR_NO_MEMORY, -10, "out of memory")                                      \
  X(TDIST_ERR_NOT_FOUND, -11, "not found")                                          \
  X(TDIST_ERR_PROTOCOL, -12, "protocol error")

typedef enum {
#define TDIST_STATUS_ENUM_(name, value, text) name = value,
  TDIST_STATUS_LIST(TDIST_STATUS_ENUM_)
#undef TDIST_STATUS_ENUM_
} tdist_status_t;

/* Short, static description of a status ("timed out"). Unknown values give "unknown status". */
TDIST_EXTERN const char *tdist_strerror(tdist_status_t status);

/* The status's enum name ("TDIST_ERR_TIMEOUT"); "TDIST_UNKNOWN" for unknown values. */
TDIST_EXTERN const char *tdist_status_name(tdist_status_t status);

/* Detail of the last failure of a handle-less call (a constructor such as
 * tdist_store_server_create or tdist_tcp_store_connect) on the calling thread. Empty string if
 * none. Valid until the next tdist call on this thread. */
TDIST_EXTERN const char *tdist_last_error(void);

/* Frees memory that a tdist call returned to the caller (values from tdist_store_get, ...). */
TDIST_EXTERN void tdist_free(void *ptr);

#ifdef __cplusplus
}
#endif
#endif

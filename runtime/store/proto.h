/* The c10d TCPStore wire protocol: a pure codec, no I/O, no allocation.
 *
 * tdist__proto_parse() looks at the bytes buffered from one connection and says whether a whole
 * request is there; it never reads past `len`, never trusts a length field before checking it
 * against the limits, and never allocates, so it is safe to fuzz and to run on hostile input.
 * Both dialects (PyTorch 1.13 and 2.x) decode to one canonical op enum. Integers on the wire are
 * little-endian (host order of every supported platform). */
#ifndef TDIST_STORE_PROTO_H
#define TDIST_STORE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/common/bytes.h" /* tdist__put_u32 and the other little-endian helpers */

typedef enum {
  TDIST__DIALECT_UNKNOWN = 0, /* not classified yet */
  TDIST__DIALECT_V1_13 = 1,
  TDIST__DIALECT_V2 = 2
} tdist__dialect_t;

/* Canonical operations (not wire bytes). */
typedef enum {
  TDIST__OP_INVALID = 0,
  TDIST__OP_VALIDATE,
  TDIST__OP_SET,
  TDIST__OP_COMPARE_SET,
  TDIST__OP_GET,
  TDIST__OP_ADD,
  TDIST__OP_CHECK,
  TDIST__OP_WAIT,
  TDIST__OP_GETNUMKEYS,
  TDIST__OP_WATCH_KEY,
  TDIST__OP_DELETE_KEY,
  TDIST__OP_APPEND,
  TDIST__OP_MULTI_GET,
  TDIST__OP_MULTI_SET,
  TDIST__OP_CANCEL_WAIT,
  TDIST__OP_PING,
  TDIST__OP_QUEUE_PUSH,
  TDIST__OP_QUEUE_POP,
  TDIST__OP_QUEUE_LEN,
  TDIST__OP_COUNT_
} tdist__op_t;

#define TDIST__VALIDATE_MAGIC 0x3C85F7CEu

/* Response bytes. */
#define TDIST__CHECK_READY 0
#define TDIST__CHECK_NOT_READY 1
#define TDIST__WAIT_STOP_WAITING 0
#define TDIST__WAIT_CANCELED 1
#define TDIST__WATCH_CALLBACK_REGISTERED 3

typedef struct {
  uint64_t max_key;     /* longest key accepted */
  uint64_t max_value;   /* largest value accepted */
  uint64_t max_keys;    /* most keys in one CHECK/WAIT/MULTI_GET/MULTI_SET */
  uint64_t max_request; /* most bytes in one whole request (MULTI_SET); 0 = no limit */
} tdist__proto_limits_t;

/* A view into the caller's buffer. */
typedef struct {
  const uint8_t *ptr;
  uint64_t len;
} tdist__slice_t;

/* One decoded request. Slices point into the parsed buffer and are valid while it is unchanged.
 * Multi-key ops (CHECK, WAIT, MULTI_GET, MULTI_SET) give the count in `n` and the encoded items in
 * `items`: walk them with tdist__proto_next_item(). */
typedef struct {
  tdist__op_t op;
  uint8_t wire_op;    /* the opcode byte as received */
  tdist__slice_t key; /* SET, COMPARE_SET, GET, ADD, WATCH_KEY, DELETE_KEY, APPEND, QUEUE_* */
  tdist__slice_t a;   /* SET/APPEND/QUEUE_PUSH: value; COMPARE_SET: expected */
  tdist__slice_t b;   /* COMPARE_SET: desired */
  int64_t delta;      /* ADD */
  uint32_t u32;       /* VALIDATE: magic; PING: nonce */
  uint64_t n;         /* multi-key ops: number of keys (or pairs for MULTI_SET) */
  tdist__slice_t items;
} tdist__request_t;

typedef enum {
  TDIST__PARSE_OK = 0,        /* *req is filled, *consumed bytes belong to it */
  TDIST__PARSE_NEED_MORE = 1, /* incomplete; *consumed = a lower bound of the total bytes needed */
  TDIST__PARSE_ERROR = 2      /* the connection must be closed; *why says why */
} tdist__parse_result_t;

/* Classifies a connection from its first bytes (PyTorch reference §1.11): a first byte other than
 * 0x00 is 1.13; 0x00 followed by the VALIDATE magic is 2.x (the 5 bytes are then consumed by the
 * normal parser as a VALIDATE request); 0x00 followed by anything else is a 1.13 SET. Returns
 * TDIST__DIALECT_UNKNOWN while fewer than 5 bytes have arrived and the first is 0x00. */
tdist__dialect_t tdist__proto_classify(const uint8_t *buf, size_t len);

/* Parses one request from buf[0..len). See tdist__parse_result_t. */
tdist__parse_result_t tdist__proto_parse(tdist__dialect_t dialect, const uint8_t *buf, size_t len,
                                         const tdist__proto_limits_t *limits, tdist__request_t *req,
                                         size_t *consumed, const char **why);

/* Where the parse of a partial multi-key request (CHECK, WAIT, MULTI_GET, MULTI_SET) stopped: the
 * whole items already checked and the offset of the next one from the request's first byte. A
 * server keeps one per connection, zeroed for every new request, and passes it with the same
 * request bytes (they may have moved in memory, not changed) plus whatever arrived since; the
 * parse then resumes at that item instead of walking all the earlier ones again, so partial input
 * costs work in proportion to the new bytes, not to what is buffered. `walked` counts the item
 * fields read across calls (what the tests measure). */
typedef struct {
  uint64_t items;  /* whole items before `pos` */
  uint64_t pos;    /* offset of the first unchecked item; 0 = start from the beginning */
  uint64_t walked; /* item fields read, over every call with this progress */
} tdist__parse_progress_t;

/* tdist__proto_parse() resuming from, and recording into, *progress (NULL: same as the plain
 * call). The answer is the same as tdist__proto_parse()'s on the same bytes. */
tdist__parse_result_t tdist__proto_parse_resume(tdist__dialect_t dialect, const uint8_t *buf,
                                                size_t len, const tdist__proto_limits_t *limits,
                                                tdist__request_t *req, size_t *consumed,
                                                const char **why,
                                                tdist__parse_progress_t *progress);

/* Walks the items of a multi-key request. *pos starts at 0. For CHECK/WAIT/MULTI_GET each call
 * gives one key (value untouched); for MULTI_SET one key and its value. Returns 0 at the end. The
 * request was validated by the parser, so this cannot fail while pos < the item count. */
int tdist__proto_next_item(const tdist__request_t *req, uint64_t *pos, tdist__slice_t *key,
                           tdist__slice_t *value);

/* The wire opcode of a canonical op in a dialect; -1 if the dialect lacks it. */
int tdist__proto_opcode(tdist__dialect_t dialect, tdist__op_t op);

/* The canonical op of a wire opcode in a dialect; TDIST__OP_INVALID if unknown. */
tdist__op_t tdist__proto_op_from_wire(tdist__dialect_t dialect, uint8_t wire);

/* Name of a canonical op ("SET"). */
const char *tdist__proto_op_name(tdist__op_t op);

#endif

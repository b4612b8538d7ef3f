/* The c10d TCPStore wire codec (see proto.h). Pure: reads only buf[0..len), allocates nothing,
 * checks every length against the limits the moment it is read (so a hostile header cannot make
 * the server buffer or allocate), and reports how many more bytes a partial request needs. */
#include "runtime/store/proto.h"

#include <string.h>

/* Wire byte -> op, per dialect. Index = wire byte. */
static const tdist__op_t k_v113_ops[] = {
    TDIST__OP_SET,        TDIST__OP_COMPARE_SET, TDIST__OP_GET,
    TDIST__OP_ADD,        TDIST__OP_CHECK,       TDIST__OP_WAIT,
    TDIST__OP_GETNUMKEYS, TDIST__OP_WATCH_KEY,   TDIST__OP_DELETE_KEY,
};
static const tdist__op_t k_v2_ops[] = {
    TDIST__OP_VALIDATE,    TDIST__OP_SET,    TDIST__OP_COMPARE_SET, TDIST__OP_GET,
    TDIST__OP_ADD,         TDIST__OP_CHECK,  TDIST__OP_WAIT,        TDIST__OP_GETNUMKEYS,
    TDIST__OP_DELETE_KEY,  TDIST__OP_APPEND, TDIST__OP_MULTI_GET,   TDIST__OP_MULTI_SET,
    TDIST__OP_CANCEL_WAIT, TDIST__OP_PING,   TDIST__OP_QUEUE_PUSH,  TDIST__OP_QUEUE_POP,
    TDIST__OP_QUEUE_LEN,
};

static const char *const k_op_names[TDIST__OP_COUNT_] = {
    [TDIST__OP_INVALID] = "INVALID",
    [TDIST__OP_VALIDATE] = "VALIDATE",
    [TDIST__OP_SET] = "SET",
    [TDIST__OP_COMPARE_SET] = "COMPARE_SET",
    [TDIST__OP_GET] = "GET",
    [TDIST__OP_ADD] = "ADD",
    [TDIST__OP_CHECK] = "CHECK",
    [TDIST__OP_WAIT] = "WAIT",
    [TDIST__OP_GETNUMKEYS] = "GETNUMKEYS",
    [TDIST__OP_WATCH_KEY] = "WATCH_KEY",
    [TDIST__OP_DELETE_KEY] = "DELETE_KEY",
    [TDIST__OP_APPEND] = "APPEND",
    [TDIST__OP_MULTI_GET] = "MULTI_GET",
    [TDIST__OP_MULTI_SET] = "MULTI_SET",
    [TDIST__OP_CANCEL_WAIT] = "CANCEL_WAIT",
    [TDIST__OP_PING] = "PING",
    [TDIST__OP_QUEUE_PUSH] = "QUEUE_PUSH",
    [TDIST__OP_QUEUE_POP] = "QUEUE_POP",
    [TDIST__OP_QUEUE_LEN] = "QUEUE_LEN",
};

const char *tdist__proto_op_name(tdist__op_t op) {
  return (op >= 0 && op < TDIST__OP_COUNT_ && k_op_names[op]) ? k_op_names[op] : "INVALID";
}

tdist__op_t tdist__proto_op_from_wire(tdist__dialect_t dialect, uint8_t wire) {
  if (dialect == TDIST__DIALECT_V1_13)
    return wire < sizeof k_v113_ops / sizeof k_v113_ops[0] ? k_v113_ops[wire] : TDIST__OP_INVALID;
  if (dialect == TDIST__DIALECT_V2)
    return wire < sizeof k_v2_ops / sizeof k_v2_ops[0] ? k_v2_ops[wire] : TDIST__OP_INVALID;
  return TDIST__OP_INVALID;
}

int tdist__proto_opcode(tdist__dialect_t dialect, tdist__op_t op) {
  const tdist__op_t *t;
  size_t n;
  if (dialect == TDIST__DIALECT_V1_13) {
    t = k_v113_ops;
    n = sizeof k_v113_ops / sizeof k_v113_ops[0];
  } else if (dialect == TDIST__DIALECT_V2) {
    t = k_v2_ops;
    n = sizeof k_v2_ops / sizeof k_v2_ops[0];
  } else {
    return -1;
  }
  for (size_t i = 0; i < n; i++)
    if (t[i] == op) return (int)i;
  return -1;
}

tdist__dialect_t tdist__proto_classify(const uint8_t *buf, size_t len) {
  if (len == 0) return TDIST__DIALECT_UNKNOWN;
  if (buf[0] != 0x00) return TDIST__DIALECT_V1_13;
  if (len < 5) return TDIST__DIALECT_UNKNOWN;
  return tdist__get_u32(buf + 1) == TDIST__VALIDATE_MAGIC ? TDIST__DIALECT_V2
                                                          : TDIST__DIALECT_V1_13;
}

/* A read cursor. Any shortfall stops parsing with NEED_MORE and the byte count that would let the
 * current field complete; any limit violation stops with ERROR. */
typedef struct {
  const uint8_t *buf;
  size_t len;
  size_t pos;
  const tdist__proto_limits_t *lim;
  size_t need;     /* set on NEED_MORE */
  const char *why; /* set on ERROR */
} cursor_t;

enum { C_OK = 0, C_MORE = 1, C_ERR = 2 };

static int c_need(cursor_t *c, uint64_t n) {
  /* The request limit holds whether the bytes are already buffered or not, so the verdict never
   * depends on how TCP split the stream. */
  if (c->lim->max_request && n > c->lim->max_request - c->pos) {
    c->why = "request larger than the request size limit";
    return C_ERR;
  }
  if (n > c->len - c->pos) {
    c->need = (size_t)(c->pos + n);
    return C_MORE;
  }
  return C_OK;
}

static int c_u64(cursor_t *c, uint64_t *v) {
  int r = c_need(c, 8);
  if (r) return r;
  *v = tdist__get_u64(c->buf + c->pos);
  c->pos += 8;
  return C_OK;
}

static int c_u32(cursor_t *c, uint32_t *v) {
  int r = c_need(c, 4);
  if (r) return r;
  *v = tdist__get_u32(c->buf + c->pos);
  c->pos += 4;
  return C_OK;
}

/* A length-prefixed string; `limit` bounds its length, `what` names it in the error. */
static int c_bytes(cursor_t *c, uint64_t limit, const char *what, tdist__slice_t *out) {
  uint64_t n;
  int r = c_u64(c, &n);
  if (r) return r;
  if (n > limit) {
    c->why = what;
    return C_ERR;
  }
  r = c_need(c, n);
  if (r) return r;
  out->ptr = c->buf + c->pos;
  out->len = n;
  c->pos += (size_t)n;
  return C_OK;
}

#define KEY_TOO_LONG "key longer than the key size limit"
#define VALUE_TOO_BIG "value larger than the value size limit"
#define TOO_MANY_KEYS "more keys in one request than the multi-key limit"

static int c_key(cursor_t *c, tdist__slice_t *out) {
  return c_bytes(c, c->lim->max_key, KEY_TOO_LONG, out);
}
static int c_value(cursor_t *c, tdist__slice_t *out) {
  return c_bytes(c, c->lim->max_value, VALUE_TOO_BIG, out);
}

/* Parses the body of a multi-key request: a count, then count keys (pairs when with_values).
 * With a progress record, starts at the first item not yet checked and, when the input runs out,
 * records the item it stopped in (from its first byte: an item is at most two length fields). */
static int c_items(cursor_t *c, int with_values, tdist__request_t *req,
                   tdist__parse_progress_t *prog) {
  uint64_t n;
  int r = c_u64(c, &n);
  if (r) return r;
  if (n > c->lim->max_keys) {
    c->why = TOO_MANY_KEYS;
    return C_ERR;
  }
  req->n = n;
  size_t start = c->pos;
  uint64_t i = 0;
  /* Resume only where an earlier call with these bytes stopped: past the count, inside what is
   * buffered, at most n items. Anything else (a fresh or stale record) starts over. */
  if (prog && prog->pos > start && prog->pos <= c->len && prog->items <= n) {
    i = prog->items;
    c->pos = (size_t)prog->pos;
  }
  for (; i < n; i++) {
    size_t item = c->pos;
    tdist__slice_t k, v;
    if (prog) prog->walked++;
    if (!(r = c_key(c, &k)) && with_values) r = c_value(c, &v);
    if (r) {
      if (r == C_MORE && prog) {
        prog->items = i;
        prog->pos = item;
      }
      return r;
    }
  }
  req->items.ptr = c->buf + start;
  req->items.len = c->pos - start;
  return C_OK;
}

tdist__parse_result_t tdist__proto_parse(tdist__dialect_t dialect, const uint8_t *buf, size_t len,
                                         const tdist__proto_limits_t *limits, tdist__request_t *req,
                                         size_t *consumed, const char **why) {
  return tdist__proto_parse_resume(dialect, buf, len, limits, req, consumed, why, NULL);
}

tdist__parse_result_t tdist__proto_parse_resume(tdist__dialect_t dialect, const uint8_t *buf,
                                                size_t len, const tdist__proto_limits_t *limits,
                                                tdist__request_t *req, size_t *consumed,
                                                const char **why,
                                                tdist__parse_progress_t *progress) {
  cursor_t c = {.buf = buf, .len = len, .pos = 0, .lim = limits};
  memset(req, 0, sizeof *req);
  *why = NULL;
  if (len == 0) {
    *consumed = 1;
    return TDIST__PARSE_NEED_MORE;
  }
  if (dialect != TDIST__DIALECT_V1_13 && dialect != TDIST__DIALECT_V2) {
    *why = "connection dialect not classified";
    *consumed = 0;
    return TDIST__PARSE_ERROR;
  }
  req->wire_op = buf[0];
  req->op = tdist__proto_op_from_wire(dialect, buf[0]);
  c.pos = 1;
  int r = C_OK;
  switch (req->op) {
    case TDIST__OP_VALIDATE:
    case TDIST__OP_PING: r = c_u32(&c, &req->u32); break;
    case TDIST__OP_SET:
    case TDIST__OP_APPEND:
    case TDIST__OP_QUEUE_PUSH:
      if (!(r = c_key(&c, &req->key))) r = c_value(&c, &req->a);
      break;
    case TDIST__OP_COMPARE_SET:
      if (!(r = c_key(&c, &req->key)) && !(r = c_value(&c, &req->a))) r = c_value(&c, &req->b);
      break;
    case TDIST__OP_GET:
    case TDIST__OP_WATCH_KEY:
    case TDIST__OP_DELETE_KEY:
    case TDIST__OP_QUEUE_POP:
    case TDIST__OP_QUEUE_LEN: r = c_key(&c, &req->key); break;
    case TDIST__OP_ADD: {
      uint64_t d = 0;
      if (!(r = c_key(&c, &req->key)) && !(r = c_u64(&c, &d))) req->delta = (int64_t)d;
      break;
    }
    case TDIST__OP_CHECK:
    case TDIST__OP_WAIT:
    case TDIST__OP_MULTI_GET: r = c_items(&c, 0, req, progress); break;
    case TDIST__OP_MULTI_SET: r = c_items(&c, 1, req, progress); break;
    case TDIST__OP_GETNUMKEYS:
    case TDIST__OP_CANCEL_WAIT: break;
    default:
      *why = "unknown opcode";
      *consumed = 0;
      return TDIST__PARSE_ERROR;
  }
  if (r == C_MORE) {
    *consumed = c.need;
    return TDIST__PARSE_NEED_MORE;
  }
  if (r == C_ERR) {
    *why = c.why;
    *consumed = 0;
    return TDIST__PARSE_ERROR;
  }
  *consumed = c.pos;
  return TDIST__PARSE_OK;
}

int tdist__proto_next_item(const tdist__request_t *req, uint64_t *pos, tdist__slice_t *key,
                           tdist__slice_t *value) {
  if (*pos + 8 > req->items.len) return 0;
  const uint8_t *p = req->items.ptr;
  uint64_t kl = tdist__get_u64(p + *pos);
  if (kl > req->items.len - *pos - 8) return 0;
  key->ptr = p + *pos + 8;
  key->len = kl;
  *pos += 8 + kl;
  if (req->op == TDIST__OP_MULTI_SET) {
    if (*pos + 8 > req->items.len) return 0;
    uint64_t vl = tdist__get_u64(p + *pos);
    if (vl > req->items.len - *pos - 8) return 0;
    if (value) {
      value->ptr = p + *pos + 8;
      value->len = vl;
    }
    *pos += 8 + vl;
  }
  return 1;
}

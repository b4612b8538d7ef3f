/* The store's multiplexed-connection codec (mux.h). */
#include "runtime/store/mux.h"

#include "runtime/common/bytes.h"

int tdist__mux_parse(const uint8_t *buf, size_t len, tdist__mux_frame_t *f, const char **why) {
  if (len < TDIST__MUX_HDR) return 0;
  f->type = buf[0];
  f->id = tdist__get_u32(buf + 1);
  f->len = tdist__get_u32(buf + 5);
  f->payload = buf + TDIST__MUX_HDR;
  if (f->type < TDIST__MUX_OPEN || f->type > TDIST__MUX_CLOSE) {
    *why = "unknown frame type";
    return -1;
  }
  if (f->id >= TDIST__MUX_MAX_ID) {
    *why = "client id past the limit";
    return -1;
  }
  if (f->len > TDIST__MUX_MAX_PAYLOAD) {
    *why = "frame payload past 1 MiB";
    return -1;
  }
  if (f->type == TDIST__MUX_OPEN && f->len) {
    *why = "OPEN frame with a payload";
    return -1;
  }
  return len - TDIST__MUX_HDR >= f->len;
}

void tdist__mux_put_hdr(uint8_t *p, uint8_t type, uint32_t id, uint32_t len) {
  p[0] = type;
  tdist__put_u32(p + 1, id);
  tdist__put_u32(p + 5, len);
}

/* The store's multiplexed connection: how a tdist store proxy (proxy.c, one per node) carries
 * many clients' connections to the job's store server over one TCP connection. Ours only: a
 * PyTorch client never speaks it, and a PyTorch server closes a connection that starts with it.
 *
 * The proxy opens with TDIST__MUX_HELLO; the server answers the same 8 bytes. Then both ways,
 * frames: type (u8), id (u32 little-endian), length (u32 little-endian), length payload bytes.
 *   OPEN  (proxy -> server, length 0): a client connected; id names it until its CLOSE.
 *   DATA  (both ways): bytes of that client's stream, as the client sent them or as the server
 *         answers them; the server parses each client's stream as if it were a connection of
 *         its own (dialect, WAITs, budgets, closes), so every semantic is the plain server's.
 *   CLOSE (both ways): the client went away (proxy) or the server closed that client's
 *         connection (server; the payload, possibly empty, says why). Either side then forgets
 *         the id; the proxy may reuse it after closing its client.
 * Pure codec: no I/O, no allocation (fuzzed by //tests/fuzz). */
#ifndef TDIST_RUNTIME_STORE_MUX_H
#define TDIST_RUNTIME_STORE_MUX_H

#include <stddef.h>
#include <stdint.h>

#define TDIST__MUX_HELLO "\xF7tdmux1\n"
#define TDIST__MUX_HELLO_LEN 8
#define TDIST__MUX_HDR 9
#define TDIST__MUX_MAX_PAYLOAD (1u << 20) /* larger DATA is split by the sender */
#define TDIST__MUX_MAX_ID (1u << 17)      /* ids are 0..MAX_ID-1 (a proxy reuses closed ones) */

enum { TDIST__MUX_OPEN = 1, TDIST__MUX_DATA = 2, TDIST__MUX_CLOSE = 3 };

typedef struct {
  uint8_t type;
  uint32_t id;
  uint32_t len;           /* payload bytes */
  const uint8_t *payload; /* into the parsed buffer */
} tdist__mux_frame_t;

/* Parses one frame from buf[0..len): 1 = *f filled, the frame takes TDIST__MUX_HDR + f->len
 * bytes; 0 = more bytes needed; -1 = a frame no sender of ours writes (*why says which field). */
int tdist__mux_parse(const uint8_t *buf, size_t len, tdist__mux_frame_t *f, const char **why);

/* Writes a frame header (TDIST__MUX_HDR bytes) at p. */
void tdist__mux_put_hdr(uint8_t *p, uint8_t type, uint32_t id, uint32_t len);

#endif

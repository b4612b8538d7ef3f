/* UTF-8 for the agent: the one decoder (strict RFC 3629 / Unicode §3.9: no overlong forms, no
 * surrogates, nothing past U+10FFFF) and encoder that the config loader, the error-file reader and
 * the HTTP writers share. No state, no allocation. */
#ifndef TDIST_AGENT_UTF8_H
#define TDIST_AGENT_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* At s, with n bytes available: the length (1..4) of the well-formed sequence there, with its
 * code point in *cp (when cp is not NULL); or minus the length (1..3) of the malformed part that
 * one U+FFFD replaces: the "maximal subpart" of Unicode §3.9, as Python's and browsers' decoders
 * replace. 0 when n is 0. A NUL byte is a sequence of length 1. */
int agent_utf8_next(const char *s, size_t n, uint32_t *cp);

/* 1 if s[0..n) is well-formed UTF-8, else 0. */
int agent_utf8_valid(const char *s, size_t n);

/* Writes code point cp (< 0x110000; a surrogate is written as U+FFFD) to o[0..4); returns the
 * number of bytes written (1..4). */
size_t agent_utf8_put(char *o, uint32_t cp);

#endif

#!/usr/bin/env python3
"""Writes the seed corpus of the proto fuzz target (tests/fuzz/corpus/).

Each file is the byte stream one client connection sends, taken from the captures and layouts in
the PyTorch reference (/work/shared/reference/torch-contracts.md §1.3, §1.10, §1.12): 1.13 streams
as captured from python3-torch 1.13.1, 2.x streams as the 2.6 client builds them (VALIDATE, PING,
then requests). Run it from the repository root after changing it; the output is deterministic and
checked in, so the fuzz builds need no Python.
"""
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

V113 = dict(SET=0, COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5, GETNUMKEYS=6, WATCH_KEY=7,
            DELETE_KEY=8)
V2 = dict(VALIDATE=0, SET=1, COMPARE_SET=2, GET=3, ADD=4, CHECK=5, WAIT=6, GETNUMKEYS=7,
          DELETE_KEY=8, APPEND=9, MULTI_GET=10, MULTI_SET=11, CANCEL_WAIT=12, PING=13,
          QUEUE_PUSH=14, QUEUE_POP=15, QUEUE_LEN=16)
MAGIC = 0x3C85F7CE


def s(b):
    """str/bytes field: u64 length + raw bytes."""
    if isinstance(b, str):
        b = b.encode()
    return struct.pack("<Q", len(b)) + b


def u64(v):
    return struct.pack("<Q", v)


def i64(v):
    return struct.pack("<q", v)


def u32(v):
    return struct.pack("<I", v)


def req(table, op, *fields):
    return bytes([table[op]]) + b"".join(fields)


def keys(*ks):
    return u64(len(ks)) + b"".join(s(k) for k in ks)


def v113(op, *f):
    return req(V113, op, *f)


def v2(op, *f):
    return req(V2, op, *f)


HELLO_V2 = v2("VALIDATE", u32(MAGIC)) + v2("PING", u32(4660))

CORPUS = {
    # 1.13, captured (§1.12).
    "v113_set_k1": v113("SET", s("/k1"), s("v1")),
    "v113_wait_k1": v113("WAIT", keys("/k1")),
    "v113_get_k1": v113("GET", s("/k1")),
    "v113_add_cnt_5": v113("ADD", s("/cnt"), i64(5)),
    "v113_add_cnt_minus2": v113("ADD", s("/cnt"), i64(-2)),
    "v113_compare_set": v113("COMPARE_SET", s("/cs"), s(""), s("new")),
    "v113_getnumkeys": v113("GETNUMKEYS"),
    "v113_delete_k1": v113("DELETE_KEY", s("/k1")),
    "v113_wait_two": v113("WAIT", keys("/late", "/cnt")),
    "v113_add_init": v113("ADD", s("init/"), i64(1)),
    "v113_check": v113("CHECK", keys("/k1", "/k2")),
    "v113_watch_key": v113("WATCH_KEY", s("/k1")),
    "v113_wait_zero_keys": v113("WAIT", keys()),
    # The captured session on one connection, and the pipelined SET, ADD, GET probe.
    "v113_session": (v113("SET", s("/k1"), s("v1")) + v113("WAIT", keys("/k1")) +
                     v113("GET", s("/k1")) + v113("ADD", s("/cnt"), i64(5)) +
                     v113("ADD", s("/cnt"), i64(-2)) +
                     v113("COMPARE_SET", s("/cs"), s(""), s("new")) + v113("GETNUMKEYS") +
                     v113("DELETE_KEY", s("/k1"))),
    "v113_pipelined": (v113("SET", s("/a"), s("1")) + v113("ADD", s("/a"), i64(1)) +
                       v113("GET", s("/a"))),
    # Rank 1's stream during a gloo init_process_group (§1.10).
    "v113_pg_init": (v113("ADD", s("init/"), i64(1)) +
                     v113("SET", s("/default_pg/0/0/rank_1"), s("vm")) +
                     v113("WAIT", keys("/default_pg/0/0/rank_0")) +
                     v113("GET", s("/default_pg/0/0/rank_0")) +
                     v113("SET", s("/default_pg/0/0/1"), bytes(range(136))) +
                     v113("WAIT", keys("/default_pg/0/0/0")) +
                     v113("ADD", s("/default_pg/store_based_barrier_key:1"), i64(1)) +
                     v113("ADD", s("/default_pg/store_based_barrier_key:1"), i64(0))),
    # 1.13 prefix-store keys (double slash) and a binary value.
    "v113_agent_prefix": v113("SET", s("//worker/attempt_0/k"), s(b"\x00\xff\x01\x80")),
    # Requests over the fuzz limits (key 16/64, value 64/300, keys 4/8).
    "v113_long_key": v113("SET", s("/" + "k" * 80), s("v")),
    "v113_big_value": v113("SET", s("/k"), s(b"x" * 400)),
    "v113_many_keys": v113("WAIT", keys(*["/k%d" % i for i in range(10)])),

    # 2.x (§1.3 layouts; VALIDATE + PING first, as the 2.6 client does).
    "v2_hello": HELLO_V2,
    "v2_set_k1": HELLO_V2 + v2("SET", s("/k1"), s("v1")),
    "v2_add_init": HELLO_V2 + v2("ADD", s("init/"), i64(1)),
    "v2_get": HELLO_V2 + v2("WAIT", keys("/k1")) + v2("GET", s("/k1")),
    "v2_wait_cancel": HELLO_V2 + v2("WAIT", keys("/k1", "/k2")) + v2("CANCEL_WAIT"),
    "v2_compare_set": HELLO_V2 + v2("COMPARE_SET", s("/cs"), s("old"), s("newer")),
    "v2_check": HELLO_V2 + v2("CHECK", keys("/a", "/b", "/c")),
    "v2_getnumkeys_delete": HELLO_V2 + v2("GETNUMKEYS") + v2("DELETE_KEY", s("/k1")),
    "v2_append": HELLO_V2 + v2("APPEND", s("/log"), s("a")) + v2("APPEND", s("/log"), s("bc")),
    "v2_multi_get": HELLO_V2 + v2("WAIT", keys("/0", "/1")) + v2("MULTI_GET", keys("/0", "/1")),
    "v2_multi_set": HELLO_V2 + v2("MULTI_SET", u64(3), s("/0"), s("zero"), s("/1"), s(""),
                                  s("/2"), s("two")),
    "v2_queue": (HELLO_V2 + v2("QUEUE_PUSH", s("/q"), s("item")) + v2("QUEUE_LEN", s("/q")) +
                 v2("QUEUE_POP", s("/q"))),
    "v2_nccl_id": HELLO_V2 + v2("SET", s("/default_pg/0//cuda//0"), bytes(128)),
    "v2_barrier": (HELLO_V2 + v2("ADD", s("/store_based_barrier_key:0"), i64(1)) +
                   v2("SET", s("/store_based_barrier_key:0:last_worker"), s("1")) +
                   v2("WAIT", keys("/store_based_barrier_key:0:last_worker")) +
                   v2("CANCEL_WAIT")),
    # Every field within the fuzz limits (key 64, value 300) but 813 bytes in all: over the
    # 600-byte request limit of one limit set.
    "v2_multi_set_large": HELLO_V2 + v2("MULTI_SET", u64(3),
                                        *[s("/%d" % i) + s(b"x" * 250) for i in range(3)]),
    "v2_validate_bad_magic": bytes([0]) + u32(0x12345678),
    "v2_unknown_opcode": HELLO_V2 + bytes([0x11]),
    "v2_many_pairs": HELLO_V2 + v2("MULTI_SET", u64(9),
                                   *[s("/k%d" % i) + s("v") for i in range(9)]),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.unlink(os.path.join(OUT, name))
    for name, data in sorted(CORPUS.items()):
        with open(os.path.join(OUT, name + ".bin"), "wb") as f:
            f.write(data)
    print("wrote %d files to %s" % (len(CORPUS), OUT), file=sys.stderr)


if __name__ == "__main__":
    main()

"""PyTorch clients (1.13 or 2.x: whichever runs this) on either side of the C driver
(store_driver.c) in the interop test.

  preseed  --port P --seed S --manifest-out F
      writes a few keys with a PyTorch client (random values with NULs, an empty value, a counter)
      and creates one TCPStore with world_size=1 (which adds the raw `init/` key), then writes the
      manifest the C driver checks: "keyhex valhex" lines (keys without the "/" the client adds)
      and "#num_keys N".
  readback --port P --manifest F
      reads every key the C driver says it left (its --manifest-out) with a PyTorch client and
      compares; also checks a few values written down here (not taken from the manifest) and,
      over a raw connection in the client version's dialect, that the C client stored its keys
      under "/" + key like PyTorch.

Exit status 0 when everything matched, 1 otherwise (all mismatches are listed).
"""

import argparse
import datetime
import os
import random
import socket
import struct
import sys
import threading

TIMEOUT_S = 10


def raw_check(host, port, wire_keys, v2):
    """CHECK (1.13: opcode 4; 2.x: VALIDATE, then opcode 5): 0 = READY, 1 = NOT_READY."""
    s = socket.create_connection((host, port), timeout=TIMEOUT_S)
    try:
        validate = b"\x00" + struct.pack("<I", 0x3C85F7CE) if v2 else b""
        msg = validate + bytes([5 if v2 else 4]) + struct.pack("<Q", len(wire_keys))
        for k in wire_keys:
            msg += struct.pack("<Q", len(k)) + k
        s.sendall(msg)
        r = s.recv(1)
        if not r:
            raise ConnectionError("server closed the connection on CHECK")
        return r[0]
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["preseed", "readback"])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--manifest", help="readback: the C driver's manifest")
    ap.add_argument("--manifest-out", help="preseed: where to write the manifest")
    ap.add_argument("--label", default="server")
    args = ap.parse_args()

    t = threading.Timer(60, lambda: (print("FAIL: readback watchdog", file=sys.stderr,
                                           flush=True), os._exit(3)))
    t.daemon = True
    t.start()

    import torch
    from torch.distributed import TCPStore
    v2 = int(torch.__version__.split(".")[0]) >= 2
    td = datetime.timedelta(seconds=TIMEOUT_S)
    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append("%s: got %r, want %r" % (what, got[:64] if isinstance(got, bytes)
                                                      else got,
                                                      want[:64] if isinstance(want, bytes)
                                                      else want))

    store = TCPStore(args.host, args.port, timeout=td)
    if args.mode == "preseed":
        rng = random.Random(args.seed ^ 0x5EED)
        kv = {}
        for i in range(6):
            v = bytearray(rng.randbytes(rng.randrange(1, 300)))
            v[0] = 0
            v[-1] = 0
            kv["py/k%d" % i] = bytes(v)
        kv["py/empty"] = b""
        kv["py/\u00fcnicode"] = "wert \u00e4\u00f6\u00fc".encode()
        for k, v in kv.items():
            store.set(k, v)
        expect("add py/ctr", store.add("py/ctr", 42), 42)
        kv["py/ctr"] = b"42"
        TCPStore(args.host, args.port, world_size=1, wait_for_workers=True, timeout=td)
        n = store.num_keys()
        expect("num_keys after preseed (keys + init/)", n, len(kv) + 1)
        tmp = args.manifest_out + ".tmp"
        with open(tmp, "w") as f:
            for k, v in kv.items():
                f.write("%s %s\n" % (k.encode().hex(), v.hex()))
            f.write("#num_keys %d\n" % n)
        os.rename(tmp, args.manifest_out)
    else:
        want_keys = None
        entries = []
        with open(args.manifest) as f:
            for line in f:
                line = line.strip()
                if line.startswith("#num_keys"):
                    want_keys = int(line.split()[1])
                elif line:
                    kh, _, vh = line.partition(" ")
                    entries.append((bytes.fromhex(kh).decode("utf-8"), bytes.fromhex(vh)))
        if want_keys is None or len(entries) < 10:
            failures.append("manifest %s is incomplete (%d entries)" % (args.manifest, len(entries)))
        for k, v in entries:
            expect("get %r" % k, store.get(k), v)
        # Independent of the manifest: what the C script must have left (store_driver.c).
        for k, v in (("c/str", b"hello"), ("c/ctr", b"4"), ("c/cas1", b"newer"),
                     ("c/min", b"-9223372036854775808"), ("c/empty", b""),
                     ("c/late", b"late-value"), ("c/late2", b"second"), ("c/late3", b"2"),
                     ("c/m2", b""), ("c/noresult", b"7"),
                     ("\u043a\u043b\u044e\u0447/\u65e5\u672c", b"unicode")):
            expect("fixed value of %r" % k, store.get(k), v)
        expect("len(c/big)", len(store.get("c/big")), 2 * 1024 * 1024 + 3)
        expect("num_keys", store.num_keys(), want_keys)
        # The C client must put "/" in front of keys exactly like PyTorch's client does.
        expect("raw CHECK /c/str", raw_check(args.host, args.port, [b"/c/str"], v2), 0)
        expect("raw CHECK c/str (no prefix)", raw_check(args.host, args.port, [b"c/str"], v2), 1)
        if hasattr(store, "check"):  # 2.x: the same through the API
            expect("check [c/str, c/m2]", store.check(["c/str", "c/m2"]), True)
            expect("check [c/q]: queues are not keys", store.check(["c/q"]), False)
        if hasattr(store, "multi_get"):
            expect("multi_get [c/late, c/cas1]", store.multi_get(["c/late", "c/cas1"]),
                   [b"late-value", b"newer"])
        # And a PyTorch add on the C client's counter continues from its value.
        expect("add c/ctr from python", store.add("c/ctr", 1), 5)

    if failures:
        for m in failures:
            print("FAIL (%s %s): %s" % (args.mode, args.label, m), file=sys.stderr)
        os._exit(1)
    print("%s against %s (PyTorch %s): ok" % (args.mode, args.label, torch.__version__),
          file=sys.stderr, flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()

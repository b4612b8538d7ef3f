"""PyTorch's own TCPStore client, used by tdist_store_cli_test.sh (PART=torch) as an independent
peer of the CLI; the PyTorch is whichever runs it (1.13 or 2.x, tests/testlib/torch.sh).

usage: python3 torch_peer.py PORT KEY_FROM_CLI EXPECTED_HEX KEY_FOR_CLI VALUE_HEX COUNTER
Reads KEY_FROM_CLI (written by `tdist-store set`) and checks it equals EXPECTED_HEX, writes
KEY_FOR_CLI = VALUE_HEX (the CLI reads it back), adds 1000 to COUNTER and prints the new value,
then prints num_keys(). Where the client has the 2.x API it also checks the CLI's keys with
check() and multi_get(). Exits non-zero with a message on any mismatch.
"""
import sys
from datetime import timedelta

import torch
from torch.distributed import TCPStore


def main():
    port, key_in, want_hex, key_out, out_hex, counter = sys.argv[1:7]
    # is_master=False: a client of the tdist-store server; world_size=None: no init/ handshake.
    store = TCPStore("127.0.0.1", int(port), None, False, timedelta(seconds=10))
    got = store.get(key_in)
    if got.hex() != want_hex:
        sys.exit("torch_peer: get(%r) = %r, expected %r" % (key_in, got.hex(), want_hex))
    store.set(key_out, bytes.fromhex(out_hex))
    if hasattr(store, "check"):
        if store.check([key_in, key_out, counter]) is not True:
            sys.exit("torch_peer: check([the CLI's keys]) is not True")
        if store.check([key_in, key_out + "/missing"]) is not False:
            sys.exit("torch_peer: check([a missing key]) is not False")
    if hasattr(store, "multi_get"):
        got = store.multi_get([key_out, key_in])
        if got != [bytes.fromhex(out_hex), bytes.fromhex(want_hex)]:
            sys.exit("torch_peer: multi_get = %r" % (got,))
    print(store.add(counter, 1000))
    print(store.num_keys())
    print("torch_peer: PyTorch %s, 2.x API used: %s" % (
        torch.__version__, hasattr(store, "check") and hasattr(store, "multi_get")), file=sys.stderr)


if __name__ == "__main__":
    main()

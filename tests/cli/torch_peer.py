"""PyTorch's own TCPStore client, used by tdist_store_cli_test.sh as an independent peer.

usage: /usr/bin/python3 torch_peer.py PORT KEY_FROM_CLI EXPECTED_HEX KEY_FOR_CLI VALUE_HEX COUNTER
Reads KEY_FROM_CLI (written by `tdist-store set`) and checks it equals EXPECTED_HEX, writes
KEY_FOR_CLI = VALUE_HEX (the CLI reads it back), adds 1000 to COUNTER and prints the new value,
then prints num_keys(). Exits non-zero with a message on any mismatch.
"""
import sys
from datetime import timedelta

from torch.distributed import TCPStore


def main():
    port, key_in, want_hex, key_out, out_hex, counter = sys.argv[1:7]
    # is_master=False: a client of the tdist-store server; world_size=None: no init/ handshake.
    store = TCPStore("127.0.0.1", int(port), None, False, timedelta(seconds=10))
    got = store.get(key_in)
    if got.hex() != want_hex:
        sys.exit("torch_peer: get(%r) = %r, expected %r" % (key_in, got.hex(), want_hex))
    store.set(key_out, bytes.fromhex(out_hex))
    print(store.add(counter, 1000))
    print(store.num_keys())


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Sourced by shell tests (torch.sh sources it too).
# free_port: a TCP port free on 0.0.0.0 and [::] now, below the kernel's ephemeral range, for a
# launcher that must be told its port (torchrun's --master_port). A port from bind(0) is in the
# ephemeral range, where any outgoing connection of a busy machine can take it before the
# launcher binds it ("Address already in use").
free_port() {
  /usr/bin/python3 - <<'PYEOF'
import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(1000):
    p = random.randrange(10000, max(10001, lo))
    try:
        for fam, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
            s = socket.socket(fam)
            if fam == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((addr, p))
            s.close()
    except OSError:
        continue
    print(p)
    break
else:
    raise SystemExit("free_port: no free port below the ephemeral range")
PYEOF
}

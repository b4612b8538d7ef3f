#!/bin/bash
# Writes the seed corpus of the rendezvous codec's fuzz target (tests/fuzz/corpus_rdzv/) from a
# real agent's store: a standalone tdist-agent with 2 workers whose first attempt fails (so that
# round 0 ends and round 1 runs), and the tdist-store CLI reading back the values agents wrote:
# records, counters, the closed list, the round's end. Each value becomes one file, prefixed with
# the fuzz target's two bytes (the parser, nnodes_max - 1; see rdzv_record_fuzz.c). Run it from
# the repository root after changing the record formats; the output is checked in, so the fuzz
# builds need neither the agent nor Python.
#   tests/fuzz/make_rdzv_corpus.sh [bazel-bin/operator-agent/tdist-agent [TDIST_STORE]]
set -euo pipefail

agent=${1:-bazel-bin/operator-agent/tdist-agent}
store=${2:-bazel-bin/runtime/store/cli/tdist-store}
out=tests/fuzz/corpus_rdzv
tmp=$(mktemp -d)
apid=""

cleanup() {
  if [ -n "$apid" ]; then kill -TERM "$apid" 2>/dev/null || true; wait "$apid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}

# seed NAME PARSER VALUE [NNODES_MAX]: one corpus file (PARSER 0 record, 1 int, 2 end, 3 closed
# with its header, 7 a closed list followed by the records of <r>/table/<C>; NNODES_MAX default 1).
seed() {
  { printf "\\x$(printf %02x "$2")\\x$(printf %02x $((${4:-1} - 1)))"; printf '%s' "$3"; } \
    >"$out/$1"
}

# get KEY: the value under tdist/<run>/KEY in the agents' store.
get() { "$store" get "tdist/$run/$1" --port "$sport" --timeout-ms 5000; }

main() {
  trap cleanup EXIT
  [ -x "$agent" ] && [ -x "$store" ] || { echo "build //operator-agent:tdist-agent and the store CLI first" >&2; exit 2; }
  # Fails once (attempt 0), then sleeps: round 1 stays open for reading.
  printf '#!/bin/sh\n[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && exit 3\nexec sleep 600\n' >"$tmp/w.sh"
  chmod +x "$tmp/w.sh"
  "$agent" --standalone --nproc-per-node 2 --max-restarts 2 --monitor-interval 0.05 \
    --http-port 0 --http-port-file "$tmp/port" -- "$tmp/w.sh" >"$tmp/out" 2>"$tmp/err" &
  apid=$!
  for _ in $(seq 400); do
    grep -q "started 2 worker.*attempt\|restarting the workers" "$tmp/err" &&
      grep -q "round 1 complete" "$tmp/err" && break
    sleep 0.05
  done
  grep -q "round 1 complete" "$tmp/err" || { cat "$tmp/err" >&2; echo "no round 1" >&2; exit 1; }
  local js
  js=$(curl -s --max-time 5 "http://127.0.0.1:$(cat "$tmp/port")/status")
  sport=$(echo "$js" | python3 -c 'import json,sys; print(json.load(sys.stdin)["master_port"])')
  run=$(echo "$js" | python3 -c 'import json,sys; print(json.load(sys.stdin)["run_id"])')
  rm -rf "$out" && mkdir -p "$out"
  seed record_round0 0 "$(get 0/node/1)"
  seed record_round1 0 "$(get 1/node/1)"
  seed int_round 1 "$(get round)"
  seed int_joined 1 "$(get 1/joined)"
  seed end_round0 2 "$(get 0/end)"
  seed closed_round0 3 "$(get 0/closed)"
  local c1
  c1=$(get 1/closed)
  seed closed_round1 3 "$c1"
  # The list, then the records its closer (the header's fifth field) set in 1/table/<C>.
  seed table_round1 7 "$(head -1 <<<"$c1")"$'\n'"$(get "1/table/$(sed -n 2p <<<"$c1" | cut -d' ' -f5)")"
  # The shapes of a 3-node job with a standby, as rdzv.c writes them (a standalone agent is one
  # node): the members' arrivals in group-rank order, a member's record, the other end reasons.
  seed closed_3of4 3 "3 1,4,2" 4
  seed closed_bare 3 "2" 4
  seed closed_header 3 $'3 1,4,2\n24 3 1 30000 4 8' 4
  seed closed_header_mixed 3 $'3 1,4,2\n7 0 0 30000 1 0\n2,1,4' 4
  seed closed_table 7 $'2 1,2\n0 1 0 0 10.0.0.1 job-0 30000\n1 1 0 0 10.0.0.2 job-1 0' 4
  seed record_node2 0 "2 8 3 1 10.244.1.7 tdist-train-2 0" 4
  seed end_peer_lost 2 "peer_lost node 2 (tdist-train-2) silent for 30 s"
  seed end_membership 2 "membership node 3 joined"
  seed end_store_lost 2 "store_lost connection reset by peer"
  seed end_protocol 2 "protocol_error malformed record at 3/node/2"
  ls -l "$out"
}

main "$@"

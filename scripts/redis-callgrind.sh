#!/usr/bin/env bash
# Redis instructions per script call, counted by callgrind (repeatable,
# whatever else the machine does): runs redis-server under
# `valgrind --tool=callgrind`, one muster node on it, and `muster bench` at
# batch 1, then prints the instructions spent in EVALSHA per call.
#
# usage: scripts/redis-callgrind.sh <label> [muster binary] [redis port]
#   label   names the output files under target/callgrind/
# Compare two builds by running it once per binary (the same tasks and
# workers); Redis's own work does not depend on muster's build profile, so a
# debug binary is fine.
set -euo pipefail
label=$1
bin=${2:-target/debug/muster}
port=${3:-17991}
out=target/callgrind
mkdir -p "$out"
rm -rf "$out/$label.d"
valgrind --tool=callgrind --callgrind-out-file="$out/$label.out" \
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$out/$label.vg.log" 2>&1 &
vg=$!
for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
node_port=$((port + 1))
# Under valgrind Redis is ~30x slower: give every call a long deadline.
MUSTER_REDIS__TIMEOUT_MS=10000 "$bin" serve --listen "127.0.0.1:$node_port" \
  --redis-url "redis://127.0.0.1:$port" --data-dir "$out/$label.d" --node-id callgrind >"$out/$label.node.log" 2>&1 &
node=$!
for _ in $(seq 1 200); do curl -sf "http://127.0.0.1:$node_port/readyz" >/dev/null && break; sleep 0.3; done
"$bin" bench --url "http://127.0.0.1:$node_port" --redis-url "redis://127.0.0.1:$port" \
  --tasks 2000 --batch 1 --workers 4 --producers 1 --no-half-load --no-baseline --json >"$out/$label.bench.json"
kill "$node" 2>/dev/null || true
wait "$node" 2>/dev/null || true
calls=$(redis-cli -p "$port" info commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')
echo "$label: EVALSHA calls: ${calls:?no EVALSHA count from INFO commandstats}"
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
wait "$vg" || true
ir=$(callgrind_annotate --inclusive=yes "$out/$label.out" 2>/dev/null | awk '/evalShaCommand/ && !done {gsub(",", "", $1); print $1; done = 1}')
echo "$label: $calls EVALSHA calls, $ir instructions in evalShaCommand in all, $((ir / calls)) per call"

#!/usr/bin/env bash
# Node instructions per task, counted by callgrind (repeatable, whatever else
# the machine does): runs one muster node under `valgrind --tool=callgrind`
# on a redis-server you started, and drives it with scripts/seq-driver.py:
# n times submit one task, claim it (no wait), complete it, one request at a
# time, so the work is the same on every run.
#
# usage: scripts/node-callgrind.sh <label> <muster binary> <redis port> [n]
# Compare two release builds by running it once per binary; subtract the
# fixed cost (start, stop, background loops) measured with n = 0. The
# fixed cost varies by a few per cent from run to run (306 to 322 M seen):
# take medians of several runs.
# IDLE_S (default 0): seconds the node idles after the driver, before it is
# stopped; `IDLE_S=10` with n = 0 shows what the background loops cost per
# second (1 to 2 M instructions on 2026-12-03).
set -euo pipefail
label=$1; bin=$2; rport=$3; n=${4:-1000}
out=target/callgrind
mkdir -p "$out"
nport=$((rport + 1))
rm -rf "$out/$label.d"
MUSTER_REDIS__TIMEOUT_MS=10000 valgrind --tool=callgrind --callgrind-out-file="$out/$label.node.out" \
  "$bin" serve --listen "127.0.0.1:$nport" --redis-url "redis://127.0.0.1:$rport" \
  --data-dir "$out/$label.d" --node-id "cg-$label" >"$out/$label.node.log" 2>&1 &
node=$!
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$nport/readyz" >/dev/null && break; sleep 0.3; done
python3 "$(dirname "$0")/seq-driver.py" "$nport" "$n"
sleep "${IDLE_S:-0}"
kill -INT "$node"; wait "$node" 2>/dev/null || true
redis-cli -p "$rport" flushall >/dev/null
ir=$(callgrind_annotate "$out/$label.node.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
echo "$label: $ir node instructions for $n tasks"

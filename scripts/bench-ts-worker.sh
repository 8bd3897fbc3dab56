#!/usr/bin/env bash
# The TypeScript Worker against raw HTTP on the same node (issue 38: at least
# 80 % of the raw rate). Starts one node with an embedded Redis in a temporary
# directory, runs `muster bench --via http --batch 1` (8 raw REST workers,
# each complete claiming the next task) for the raw rate, then
# clients/typescript/scripts/bench-worker.mjs (8 TypeScript Workers, batch 1,
# claimNext) over the same number of no-op tasks, and prints both rates and
# their ratio.
#
# usage: scripts/bench-ts-worker.sh [muster binary] [tasks] [workers]
#   e.g. cargo build --release && scripts/bench-ts-worker.sh target/release/muster 10000 8
# Needs node and npm (the package is built with `npm ci && npm run build`).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/muster}"); tasks=${2:-10000}; workers=${3:-8}
dir=$(mktemp -d /tmp/muster-bench-ts.XXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" --listen "127.0.0.1:$port" --data-dir "$dir/data" --node-id bench-ts >"$dir/node.log" 2>&1 &
node_pid=$!
trap 'kill $node_pid 2>/dev/null || true; wait $node_pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
(cd clients/typescript && npm ci --silent && npm run --silent build)
raw=$("$bin" bench --url "http://127.0.0.1:$port" --tasks "$tasks" --workers "$workers" --batch 1 \
  --no-half-load --no-baseline --queue bench-raw --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_tasks_per_sec"])')
ts=$(cd clients/typescript && node scripts/bench-worker.mjs "http://127.0.0.1:$port" "$tasks" "$workers" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["tasks_per_sec"])')
python3 - "$raw" "$ts" "$tasks" "$workers" <<'PY'
import sys
raw, ts, tasks, workers = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"{tasks} no-op tasks, {workers} workers, batch 1 with next-claim")
print(f"raw HTTP (muster bench): {raw:10.0f} tasks/s")
print(f"TypeScript Worker:       {ts:10.0f} tasks/s  ({100 * ts / raw:.0f} % of raw)")
PY

#!/usr/bin/env bash
# The TypeScript Worker against raw HTTP on the same node (issue 38: at least
# 80 % of the raw rate). Starts one node with an embedded Redis in a temporary
# directory, then alternates, ROUNDS times: `muster bench --via http --batch 1
# --prefill` (8 raw REST workers in Rust, each complete claiming the next
# task) and clients/typescript/scripts/bench-worker.mjs (8 TypeScript Workers
# in one Node process, batch 1, claimNext). Both warm up on 2 000 tasks, then
# drain TASKS no-op tasks with the same payload, queued before the clock
# starts, so the rates differ only by what drains them. Prints each round
# with the load average before it, the median of each side and their ratio,
# and the median and quartiles of the per-round ratios (each round's two runs
# are back to back: on a shared machine those compare best).
#
# usage: scripts/bench-ts-worker.sh [muster binary] [tasks] [workers] [rounds]
#   e.g. cargo build --release && scripts/bench-ts-worker.sh target/release/muster 10000 8 5
# Needs node and npm (the package is built with `npm ci && npm run build`).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/muster}"); tasks=${2:-10000}; workers=${3:-8}; rounds=${4:-3}
dir=$(mktemp -d /tmp/muster-bench-ts.XXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" --listen "127.0.0.1:$port" --data-dir "$dir/data" --node-id bench-ts >"$dir/node.log" 2>&1 &
node_pid=$!
trap 'kill $node_pid 2>/dev/null || true; wait $node_pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
(cd clients/typescript && npm ci --silent && npm run --silent build)
echo "$tasks no-op tasks (queued first), $workers workers, batch 1 with next-claim, $(nproc) cores"
for r in $(seq "$rounds"); do
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  raw=$("$bin" bench --url "http://127.0.0.1:$port" --tasks "$tasks" --workers "$workers" --batch 1 --prefill \
    --no-half-load --no-baseline --queue "bench-raw-$r" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_tasks_per_sec"])')
  ts=$(cd clients/typescript && node scripts/bench-worker.mjs "http://127.0.0.1:$port" "$tasks" "$workers" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["tasks_per_sec"])')
  echo "$r $raw $ts $load" >>"$dir/rounds"
  python3 -c 'import sys; r, raw, ts = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]); print(f"round {r}: raw {raw:6.0f}  TypeScript {ts:6.0f} tasks/s  ({100 * ts / raw:.0f} %)  load {sys.argv[4]}")' "$r" "$raw" "$ts" "$load"
done
python3 - "$dir/rounds" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
raw = statistics.median(float(r[1]) for r in rows)
ts = statistics.median(float(r[2]) for r in rows)
ratios = sorted(float(r[2]) / float(r[1]) for r in rows)
print(f"median: raw HTTP (muster bench) {raw:6.0f} tasks/s, TypeScript Worker {ts:6.0f} tasks/s ({100 * ts / raw:.0f} % of raw)")
if len(ratios) >= 4:
    q = statistics.quantiles(ratios, n=4)
    print(f"per-round ratio: median {100 * statistics.median(ratios):.0f} %, quartiles {100 * q[0]:.0f} % to {100 * q[2]:.0f} %")
PY

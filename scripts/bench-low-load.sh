#!/bin/bash
# Claim latency at low load (issue 41: "claim p50 at low load no higher than
# before"): one release node with its embedded Redis per run,
# `tasks.group_in_flight` set to each value given (0: group commit off, the
# path before it), alternating; `muster bench` with one producer submitting
# single tasks at RATE tasks/s (default 50) and one worker claiming them one
# at a time without waiting (so each claim's time is its service time, not
# time spent waiting for work) and completing each. Prints the claim
# latency of the set-rate phase: of every claim, and of the claims that got
# a task (the others found the queue empty). BENCHMARKS.md, "Claim latency at low load".
# Usage: cargo build --release && scripts/bench-low-load.sh [rounds] [values...]
set -e
BIN=${MUSTER_BIN:-$(dirname "$0")/../target/release/muster}
BIN=$(realpath "$BIN")
ROUNDS=${1:-3}
shift || true
VALUES=${*:-0 4}
RATE=${RATE:-50}
. "$(dirname "$0")/bench-node.sh"
echo "round in_flight rate tasks/s claim_p50_ms claim_p99_ms claims hit_p50_ms hit_p99_ms hits"
for round in $(seq $ROUNDS); do
  for k in $VALUES; do
    start_node $k
    r=$($BIN bench --url http://127.0.0.1:$P --tasks 1000 --workers 1 --producers 1 --batch 1 \
      --latency-rate $RATE --no-baseline --json)
    echo "$round $k $RATE $(echo "$r" | python3 -c "
import json, sys
d = json.load(sys.stdin)
l = d['claim_latency_half_load']
h = d['claim_latency_half_load_hits']
print(round(d['half_load_tasks_per_sec'], 1), round(l['p50_ms'], 3), round(l['p99_ms'], 3), l['samples'],
      round(h['p50_ms'], 3), round(h['p99_ms'], 3), h['samples'])")"
    stop_node
  done
done

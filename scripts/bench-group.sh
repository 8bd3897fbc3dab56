#!/bin/bash
# Group commit's effect (issue 41): one release node with its embedded Redis,
# `tasks.group_in_flight` set to each value given (0: off), alternating,
# `muster bench` at batch 1 (single submits, single completes with next)
# and batch 100. Node CPU per task from /proc (the node process alone: its
# Redis is a child of its own), Redis figures from the bench, and how many
# calls rode in groups (the node's /metrics). BENCHMARKS.md, "Group commit".
# Usage: cargo build --release && scripts/bench-group.sh [rounds] [values...]
# WORKERS (default 8) and PRODUCERS (default 2) set the bench's concurrency.
set -e
BIN=${MUSTER_BIN:-$(dirname "$0")/../target/release/muster}
BIN=$(realpath "$BIN")
ROUNDS=${1:-3}
shift || true
VALUES=${*:-0 1 4}
. "$(dirname "$0")/bench-node.sh"
ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
echo "round in_flight batch tasks/s node_cpu_us/task redis_cpu_us/task redis_cmds/task claim_p50_ms"
for round in $(seq $ROUNDS); do
  for k in $VALUES; do
    start_node $k
    for b in 1 100; do
      n=5000; [ $b = 100 ] && n=20000
      t0=$(ticks $NODE)
      r=$($BIN bench --url http://127.0.0.1:$P --tasks $n --workers ${WORKERS:-8} --producers ${PRODUCERS:-2} --batch $b --no-half-load --no-baseline --json)
      t1=$(ticks $NODE)
      echo "$round $k $b $(echo "$r" | python3 -c "
import json, sys
d = json.load(sys.stdin)
ticks = $t1 - $t0
print(round(d['peak_tasks_per_sec']), round(ticks * 10000 / $n, 1), round(d['redis_cpu_us_per_task'], 1),
      round(d['redis_commands_per_task'], 1), round(d['claim_latency_peak']['p50_ms'], 1))")"
    done
    curl -sf http://127.0.0.1:$P/metrics | grep -E '^muster_group_commit_(calls|items)_total' | tr '\n' ' '; echo
    stop_node
  done
done

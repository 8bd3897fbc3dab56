#!/bin/bash
# The node's runtime threads (`server.worker_threads`): one release node per
# run, each value given, alternating, `muster bench` at batch 1 (8 workers,
# 2 producers, single submits, single completes with next). Node CPU per
# task from /proc (the node process alone), Redis figures from the bench.
# BENCHMARKS.md, "Runtime threads".
# Usage: cargo build --release && scripts/bench-threads.sh [rounds] [values...]
# REDIS_PORT=<port>: the nodes use that redis-server (flushed before each run)
# instead of an embedded one. TASKS (default 6000): tasks per run.
set -e
BIN=${MUSTER_BIN:-$(dirname "$0")/../target/release/muster}
BIN=$(realpath "$BIN")
ROUNDS=${1:-3}
shift || true
VALUES=${*:-2 1}
. "$(dirname "$0")/bench-node.sh"
ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
echo "round threads tasks/s node_cpu_us/task redis_cpu_us/task claim_p50_ms"
for round in $(seq $ROUNDS); do
  for th in $VALUES; do
    THREADS=$th start_node 4    # 4: tasks.group_in_flight's default
    n=${TASKS:-6000}
    t0=$(ticks $NODE)
    r=$($BIN bench --url http://127.0.0.1:$P --tasks $n --workers 8 --producers 2 --batch 1 --no-half-load --no-baseline --json)
    t1=$(ticks $NODE)
    echo "$round $th $(echo "$r" | python3 -c "
import json, sys
d = json.load(sys.stdin)
print(round(d['peak_tasks_per_sec']), round(($t1 - $t0) * 10000 / $n, 1), round(d['redis_cpu_us_per_task'], 1),
      round(d['claim_latency_peak']['p50_ms'], 2))")"
    stop_node
  done
done

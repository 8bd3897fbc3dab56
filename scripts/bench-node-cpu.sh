#!/usr/bin/env bash
# Node CPU per task, user and system apart, for builds side by side: per round
# and per binary, one release node on the redis-server at REDIS_PORT (flushed
# first), `muster bench --batch 1` (8 workers, 2 producers, TASKS tasks), and
# the node's utime and stime from /proc before and after, per task. Also the
# bench's tasks/s and Redis CPU per task. Builds alternate within each round.
#
# usage: REDIS_PORT=16490 scripts/bench-node-cpu.sh <rounds> <binary>...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rounds=$1; shift
: "${REDIS_PORT:?set REDIS_PORT to a redis-server you started}"
TASKS=${TASKS:-20000}
tick=$(getconf CLK_TCK)
for r in $(seq 1 "$rounds"); do
  for BIN in "$@"; do
    . "$here/bench-node.sh"
    start_node 4
    read -r ut0 st0 < <(awk '{print $14, $15}' /proc/$NODE/stat)
    out=$($BIN bench --url "http://127.0.0.1:$P" --batch 1 --tasks "$TASKS" --no-half-load --no-baseline \
      --redis-url "redis://127.0.0.1:$REDIS_PORT" --json 2>/dev/null)
    read -r ut1 st1 < <(awk '{print $14, $15}' /proc/$NODE/stat)
    stop_node
    echo "$out" | python3 -c "
import json, sys
d = json.load(sys.stdin)
us = 1e6 / $tick / $TASKS
print(f'round $r $BIN: {d[\"peak_tasks_per_sec\"]:.0f} tasks/s, node user {($ut1 - $ut0) * us:.0f} µs/task, '
      f'system {($st1 - $st0) * us:.0f} µs/task, Redis {d[\"redis_cpu_us_per_task\"]:.1f} µs/task')"
  done
done

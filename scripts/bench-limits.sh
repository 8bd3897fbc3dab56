#!/bin/bash
# A flow-control limit that never binds against none (issue 37): one release
# node with its embedded Redis; queue `lim` is bound by a limit with room to
# spare (concurrency 100 000, 1 000 000 per second), queue `free` by none;
# `muster bench` alternates them, batch 100 and batch 1, four rounds, then
# measures the redis-benchmark bound. BENCHMARKS.md, "A limit that does not bind".
# Usage: cargo build --release && scripts/bench-limits.sh
set -e
BIN=${MUSTER_BIN:-$(dirname "$0")/../target/release/muster}
BIN=$(realpath "$BIN")
P=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
D=$(mktemp -d)
cd $D
$BIN --listen 127.0.0.1:$P > node.log 2>&1 &
NODE=$!
trap "kill $NODE" EXIT
for i in $(seq 50); do curl -sf http://127.0.0.1:$P/readyz > /dev/null && break; sleep 0.2; done
U=http://127.0.0.1:$P
curl -sf -X PUT $U/api/v1/limits/roomy -H 'content-type: application/json' \
  -d '{"concurrency": 100000, "rate": {"max": 1000000, "per_ms": 1000, "burst": 1000000}}' > /dev/null
for q in lim lim-warm lim-half; do
  curl -sf -X PUT $U/api/v1/queues/$q/limits -H 'content-type: application/json' -d '{"limits": ["roomy"]}' > /dev/null
done
for round in 1 2 3 4; do
  for q in free lim; do
    for b in 100 1; do
      n=20000; [ $b = 1 ] && n=5000
      r=$($BIN bench --url $U --queue $q --tasks $n --workers 8 --batch $b --no-half-load --no-baseline --json)
      echo "$round $q batch$b $(echo "$r" | python3 -c 'import json,sys;d=json.load(sys.stdin);print(round(d["peak_tasks_per_sec"]), round(d["redis_cpu_us_per_task"],1), round(d["redis_commands_per_task"],1), d["claim_latency_peak"]["p50_ms"])')"
    done
  done
done
$BIN bench --url $U --queue base --tasks 2000 --workers 8 --batch 100 --no-half-load --json | python3 -c 'import json,sys;d=json.load(sys.stdin);print("redis-benchmark EVALSHA/s", d.get("redis_benchmark_evalsha_per_sec"))'

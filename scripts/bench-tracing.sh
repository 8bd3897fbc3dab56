#!/bin/bash
# Tracing's cost (issue 39): one release node with its embedded Redis, with
# tracing off and then on (sample_ratio 1.0, exporting to an OTLP/HTTP sink
# on this machine that reads and drops what it gets), alternating, `muster
# bench` at batch 1 and batch 100. Node CPU per task from /proc (the node
# process alone: its Redis is a child of its own), Redis commands and CPU per
# task from the bench. BENCHMARKS.md, "Tracing: off, and on at ratio 1.0".
# Usage: cargo build --release && scripts/bench-tracing.sh [rounds]
# With MUSTER_BEFORE_BIN (a build from before tracing), the modes are
# "before" (that build) and "off" (this one, tracing off): what tracing
# costs when it is off.
set -e
BIN=${MUSTER_BIN:-$(dirname "$0")/../target/release/muster}
BIN=$(realpath "$BIN")
MODES="off on"
if [ -n "$MUSTER_BEFORE_BIN" ]; then MODES="before off"; BEFORE=$(realpath "$MUSTER_BEFORE_BIN"); fi
ROUNDS=${1:-3}
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
SP=$(port)
python3 -c '
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()' $SP &
SINK=$!
trap "kill $SINK 2>/dev/null" EXIT
ticks() { awk '{print $14 + $15}' /proc/$1/stat; }
echo "round mode batch tasks/s node_cpu_us/task redis_cpu_us/task redis_cmds/task claim_p50_ms"
for round in $(seq $ROUNDS); do
  for mode in $MODES; do
    P=$(port)
    D=$(mktemp -d)
    if [ $mode = on ]; then export MUSTER_TELEMETRY__OTLP_ENDPOINT=http://127.0.0.1:$SP; else unset MUSTER_TELEMETRY__OTLP_ENDPOINT; fi
    B=$BIN; [ $mode = before ] && B=$BEFORE
    (cd $D && exec $B --listen 127.0.0.1:$P --data-dir $D/data > $D/node.log 2>&1) &
    NODE=$!
    for i in $(seq 100); do curl -sf http://127.0.0.1:$P/readyz > /dev/null && break; sleep 0.2; done
    for b in 1 100; do
      n=5000; [ $b = 100 ] && n=20000
      t0=$(ticks $NODE)
      r=$($B bench --url http://127.0.0.1:$P --tasks $n --workers 8 --batch $b --no-half-load --no-baseline --json)
      t1=$(ticks $NODE)
      echo "$round $mode $b $(echo "$r" | python3 -c "
import json, sys
d = json.load(sys.stdin)
ticks = $t1 - $t0
print(round(d['peak_tasks_per_sec']), round(ticks * 10000 / $n, 1), round(d['redis_cpu_us_per_task'], 1),
      round(d['redis_commands_per_task'], 1), d['claim_latency_peak']['p50_ms'])")"
    done
    if [ $mode = on ]; then
      curl -sf http://127.0.0.1:$P/metrics | grep -E '^muster_trace_spans_(exported|dropped)_total' | tr '\n' ' '; echo
    fi
    kill $NODE; wait $NODE 2>/dev/null || true
    rm -rf $D
  done
done

#!/usr/bin/env bash
# Redis instructions per task, counted by callgrind (repeatable, whatever
# else the machine does): runs redis-server under `valgrind --tool=callgrind`,
# one muster node on it (outside valgrind), and drives the node with
# scripts/seq-driver.py (n times: submit one task, claim it, complete it, one
# request at a time), so Redis does the same work on every run. Works with a
# redis-server without symbols: it counts the whole process. For a profile by
# function, put a redis-server built with symbols first in PATH (the Debian
# one has none: `git archive 7.0.15` of redis/redis, `make redis-server`),
# then `callgrind_annotate --inclusive=yes target/callgrind/<label>.redis.out`.
# MODE=submit or MODE=claim (scripts/seq-driver.py) stops each round early:
# the cost of each call by difference. MODE=chain drives a busy batch-1
# worker's path instead: submit, then complete with `next` (two calls a task).
#
# usage: scripts/redis-seq-callgrind.sh <label> <muster binary> [n] [redis port]
# Compare two builds by running it once per binary; run once with n = 0 to
# see the fixed cost (start, background loops, stop), and subtract it.
# IDLE_S (default 0): seconds to idle after the driver: with n = 0 it prices
# the background loops per second (about 3 M Redis instructions a second on
# 2026-12-03: 2 to 3 % of a 1 000-task run's per-task figure).
# Run it outside the checkout when <muster binary> is an older build (it
# reads ./config.toml).
set -euo pipefail
label=$1; bin=$2; n=${3:-1000}; rport=${4:-17993}
here=$(cd "$(dirname "$0")" && pwd)
out=${CALLGRIND_OUT:-target/callgrind}
mkdir -p "$out"
rm -rf "$out/$label.d"
valgrind --tool=callgrind --callgrind-out-file="$out/$label.redis.out" \
  redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$out/$label.vg.log" 2>&1 &
vg=$!
for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.2; done
nport=$((rport + 1))
MUSTER_REDIS__TIMEOUT_MS=10000 "$bin" serve --listen "127.0.0.1:$nport" --redis-url "redis://127.0.0.1:$rport" \
  --data-dir "$out/$label.d" --node-id "cg-$label" >"$out/$label.node.log" 2>&1 &
node=$!
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$nport/readyz" >/dev/null && break; sleep 0.3; done
start=$(date +%s)
python3 "$here/seq-driver.py" "$nport" "$n"
sleep "${IDLE_S:-0}"
secs=$(( $(date +%s) - start ))
kill -INT "$node"; wait "$node" 2>/dev/null || true
stats=$(redis-cli -p "$rport" info commandstats | tr -d '\r' | grep -E '^cmdstat_(fcall|evalsha|eval):' | cut -d, -f1 | tr '\n' ' ')
redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true
wait "$vg" || true
ir=$(callgrind_annotate "$out/$label.redis.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
echo "$label: $ir Redis instructions for $n tasks in ${secs}s ($stats)"

#!/usr/bin/env bash
# Redis CPU per task and per master with one namespace per master of a
# 3-master Redis Cluster: the baseline that splitting one namespace into
# shards (docs/sharding.md) has to match.
#
# usage: scripts/bench-namespaces.sh <muster binary> <tasks per namespace> <namespace>...
#   e.g. scripts/bench-namespaces.sh target/release/muster 30000 ns2            # one master busy
#        scripts/bench-namespaces.sh target/release/muster 30000 ns2 ns3 ns0    # all three
# `{ns2}`, `{ns3}` and `{ns0}` hash to slots 2929, 6992 and 11059: one per
# master of `redis-cli --cluster create` (0-5460, 5461-10922, 10923-16383).
# The cluster listens on 21001-21003 (bus 31001-31003), the nodes on 7801+.
# Each namespace gets its own node and its own `muster bench` (8 workers,
# batch 100, no half-load phase), all at once. Redis CPU is read from each
# master's INFO cpu, the nodes' CPU from /proc, before and after; then the
# Redis bound, `redis-benchmark` EVALSHA of `return 1` on one master.
set -euo pipefail
bin=$(realpath "$1"); tasks=$2; shift 2
dir=$(mktemp -d /tmp/muster-bench-ns.XXXX)
ports=(21001 21002 21003)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${ports[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
for p in "${ports[@]}"; do
  mkdir -p "$dir/r$p"
  (cd "$dir/r$p" && redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file nodes.conf --cluster-node-timeout 5000 --save '' --appendonly no \
    --daemonize yes --logfile redis.log)
done
sleep 0.5
redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >"$dir/create.log"
until redis-cli -p 21001 cluster info | grep -q cluster_state:ok; do sleep 0.2; done
sleep 1

port=7801; nodes=()
for ns in "$@"; do
  mkdir -p "$dir/n$port"
  cat >"$dir/n$port/config.toml" <<CFG
[server]
listen = "127.0.0.1:$port"
data_dir = "$dir/n$port"
[redis]
cluster = ["127.0.0.1:21001", "127.0.0.1:21002", "127.0.0.1:21003"]
key_prefix = "$ns"
CFG
  "$bin" --config "$dir/n$port/config.toml" >"$dir/n$port/node.log" 2>&1 &
  pids+=($!); nodes+=("$ns:$port"); port=$((port + 1))
done
for n in "${nodes[@]}"; do
  until curl -sf "http://127.0.0.1:${n#*:}/readyz" >/dev/null; do sleep 0.1; done
done

redis_cpu() { redis-cli -p "$1" info cpu | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.3f", s}'; }
node_ticks() { local t=0; for p in "${pids[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
owner() { # the master that serves namespace $1's slot
  local slot; slot=$(redis-cli -p 21001 cluster keyslot "{$1}")
  redis-cli -p 21001 cluster nodes | awk -v s="$slot" '$3 ~ /master/ {
    for (i = 9; i <= NF; i++) { split($i, r, "-"); if (s >= r[1] && s <= r[2]) { split($2, a, "@"); print a[1] } } }'
}
declare -A before
for p in "${ports[@]}"; do before[$p]=$(redis_cpu "$p"); done
ticks0=$(node_ticks)
benches=()
for n in "${nodes[@]}"; do
  ns=${n%%:*}
  "$bin" bench --url "http://127.0.0.1:${n#*:}" --tasks "$tasks" --workers 8 --batch 100 --no-half-load \
    --no-baseline --redis-url "redis://$(owner "$ns")" --queue "b$ns" --json >"$dir/$ns.json" 2>"$dir/$ns.err" &
  benches+=($!)
done
for b in "${benches[@]}"; do wait "$b"; done
ticks1=$(node_ticks)
all=$(( (tasks + 2000) * $# ))   # each bench runs 2 000 warm-up tasks first
total=0
for p in "${ports[@]}"; do
  d=$(awk -v a="$(redis_cpu "$p")" -v b="${before[$p]}" 'BEGIN {printf "%.3f", a - b}')
  cpu[$p]=$d; total=$(awk -v t="$total" -v d="$d" 'BEGIN {printf "%.3f", t + d}')
done
echo "namespaces: $*; tasks: $all (with warm-up)"
for p in "${ports[@]}"; do
  awk -v p="$p" -v d="${cpu[$p]}" -v t="$total" 'BEGIN {printf "master %s: %.3f s Redis CPU, %.0f %% of the total\n", p, d, 100 * d / t}'
done
awk -v t="$total" -v n="$all" 'BEGIN {printf "Redis CPU per task: %.1f us\n", t * 1e6 / n}'
awk -v t="$(( ticks1 - ticks0 ))" -v hz="$(getconf CLK_TCK)" -v n="$all" \
  'BEGIN {printf "muster nodes CPU per task: %.1f us\n", t / hz * 1e6 / n}'
for ns in "$@"; do
  python3 -c "import json; print('$ns: %.0f tasks/s at peak' % json.load(open('$dir/$ns.json'))['peak_tasks_per_sec'])"
done
sha=$(redis-cli -p 21001 script load "return 1")
redis-benchmark -p 21001 -n 200000 -c 50 -P 1 -q evalsha "$sha" 0 2>&1 | tr '\r' '\n' | tail -1 |
  sed 's/^/redis-benchmark on one master: /'

#!/usr/bin/env bash
# Redis CPU per task and per master with ONE namespace split into shards
# (redis.shards, docs/sharding.md) on a 3-master Redis Cluster, against the
# baseline of scripts/bench-namespaces.sh (one namespace per master).
#
# usage: scripts/bench-shards.sh <muster binary> <tasks per bench> <shards> <nodes> <queues per bench>
#   e.g. scripts/bench-shards.sh target/release/muster 30000 12 3 12   # 12 shards, 3 nodes
#        scripts/bench-shards.sh target/release/muster 30000 1 3 12    # one shard: one master
# The cluster listens on 21001-21003 (bus 31001-31003), the nodes on 7801+,
# all on the namespace `bsh`. Each node gets its own `muster bench` (8
# workers, batch 100, no half-load phase) over its own <queues per bench>
# queues, all at once. Redis CPU is read from each master's INFO cpu, the
# nodes' CPU from /proc, before and after.
#
# BENCHES=1: one bench only, on the first node, while the other nodes run
# idle beside it (they still tail every shard's events): what each added
# node costs Redis per task, without three benches starving two cores.
set -euo pipefail
bin=$(realpath "$1"); tasks=$2; shards=$3; nnodes=$4; queues=$5
dir=$(mktemp -d /tmp/muster-bench-sh.XXXX)
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

nodes=()
for i in $(seq 1 "$nnodes"); do
  port=$((7800 + i))
  mkdir -p "$dir/n$port"
  cat >"$dir/n$port/config.toml" <<CFG
[server]
listen = "127.0.0.1:$port"
data_dir = "$dir/n$port"
[redis]
cluster = ["127.0.0.1:21001", "127.0.0.1:21002", "127.0.0.1:21003"]
key_prefix = "bsh"
shards = $shards
CFG
  "$bin" --config "$dir/n$port/config.toml" >"$dir/n$port/node.log" 2>&1 &
  pids+=($!); nodes+=("$port")
  # One at a time: the first writes the namespace's layout.
  until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do sleep 0.1; done
done

redis_cpu() { redis-cli -p "$1" info cpu | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.3f", s}'; }
node_ticks() { local t=0; for p in "${pids[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
declare -A before cpu
for p in "${ports[@]}"; do before[$p]=$(redis_cpu "$p"); redis-cli -p "$p" config resetstat >/dev/null; done
ticks0=$(node_ticks)
start=$(date +%s.%N)
benches=()
bench_nodes=("${nodes[@]}")
if [ -n "${BENCHES:-}" ]; then bench_nodes=("${nodes[@]:0:$BENCHES}"); fi
for port in "${bench_nodes[@]}"; do
  "$bin" bench --url "http://127.0.0.1:$port" --tasks "$tasks" --workers 8 --batch 100 --no-half-load \
    --no-baseline --redis-url "redis://127.0.0.1:21001" --queue "b$port" --queues "$queues" --json \
    >"$dir/$port.json" 2>"$dir/$port.err" &
  benches+=($!)
done
for b in "${benches[@]}"; do wait "$b"; done
end=$(date +%s.%N)
ticks1=$(node_ticks)
all=$(( (tasks + 2000) * ${#bench_nodes[@]} ))   # each bench runs 2 000 warm-up tasks first
total=0
for p in "${ports[@]}"; do
  d=$(awk -v a="$(redis_cpu "$p")" -v b="${before[$p]}" 'BEGIN {printf "%.3f", a - b}')
  cpu[$p]=$d; total=$(awk -v t="$total" -v d="$d" 'BEGIN {printf "%.3f", t + d}')
done
echo "one namespace, shards: $shards; nodes: $nnodes; benches: ${#bench_nodes[@]}; queues: $((queues * ${#bench_nodes[@]})); tasks: $all (with warm-up)"
for p in "${ports[@]}"; do
  awk -v p="$p" -v d="${cpu[$p]}" -v t="$total" 'BEGIN {printf "master %s: %.3f s Redis CPU, %.0f %% of the total\n", p, d, 100 * d / t}'
done
awk -v t="$total" -v n="$all" 'BEGIN {printf "Redis CPU per task: %.1f us\n", t * 1e6 / n}'
awk -v t="$(( ticks1 - ticks0 ))" -v hz="$(getconf CLK_TCK)" -v n="$all" \
  'BEGIN {printf "muster nodes CPU per task: %.1f us\n", t / hz * 1e6 / n}'
total_rate=0
for port in "${bench_nodes[@]}"; do
  r=$(python3 -c "import json; print('%.0f' % json.load(open('$dir/$port.json'))['peak_tasks_per_sec'])")
  echo "bench on node $port: $r tasks/s at peak"
  total_rate=$((total_rate + r))
done
echo "all benches: $total_rate tasks/s (sum of peaks)"
if [ -n "${PROFILE:-}" ]; then
  for p in "${ports[@]}"; do
    echo "master $p, the commands that took the most time:"
    redis-cli -p "$p" info commandstats | grep -v '^#' | tr -d '\r' | sort -t= -k3 -n -r | head -8 | sed 's/^/  /'
  done
fi
sha=$(redis-cli -p 21001 script load "return 1")
redis-benchmark -p 21001 -n 200000 -c 50 -P 1 -q evalsha "$sha" 0 2>&1 | tr '\r' '\n' | tail -1 |
  sed 's/^/redis-benchmark on one master: /'

# Sourced by the bench scripts that run one release node with its embedded
# Redis per run (scripts/bench-group.sh, scripts/bench-low-load.sh).
# Needs BIN (the muster binary).

# A free TCP port on 127.0.0.1.
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# start_node <tasks.group_in_flight>: starts a node in a fresh directory and
# waits until it is ready; sets P (its port), D (its directory), NODE (its pid).
# THREADS, when set: the node's server.worker_threads. REDIS_PORT, when set:
# the node uses that redis-server (flushed first) instead of an embedded one.
start_node() {
  P=$(port)
  D=$(mktemp -d)
  local redis=()
  if [ -n "$REDIS_PORT" ]; then
    redis-cli -p "$REDIS_PORT" flushall > /dev/null
    redis=(--redis-url "redis://127.0.0.1:$REDIS_PORT")
  fi
  (cd $D && MUSTER_TASKS__GROUP_IN_FLIGHT=$1 MUSTER_SERVER__WORKER_THREADS=${THREADS:-0} exec $BIN --listen 127.0.0.1:$P "${redis[@]}" --data-dir $D/data > $D/node.log 2>&1) &
  NODE=$!
  for i in $(seq 100); do curl -sf http://127.0.0.1:$P/readyz > /dev/null && break; sleep 0.2; done
}

# Stops the node start_node started and removes its directory.
stop_node() {
  kill $NODE; wait $NODE 2>/dev/null || true
  rm -rf $D
}

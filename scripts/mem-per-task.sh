#!/usr/bin/env bash
# Memory per queued task (issue 41): N tasks with a P-byte JSON payload
# submitted in batches of 1000 to a node on a fresh redis-server (no
# persistence); prints used_memory after minus before, per task, and the
# largest keys. The stream of events is capped at events.max_len (100 000)
# entries, so at N = 100 000 it holds one event per task (about 94 bytes).
#
# usage: scripts/mem-per-task.sh [muster binary] [tasks] [payload bytes]
set -euo pipefail
bin=$(realpath "${1:-target/release/muster}"); n=${2:-100000}; plen=${3:-90}
rp=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
hp=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
d=$(mktemp -d)
redis-server --port $rp --save '' --appendonly no --dir $d >/dev/null 2>&1 &
rpid=$!
sleep 0.5
"$bin" --listen 127.0.0.1:$hp --redis-url redis://127.0.0.1:$rp --data-dir $d/data --node-id mem >$d/node.log 2>&1 &
npid=$!
trap 'kill $npid $rpid 2>/dev/null; wait 2>/dev/null; rm -rf $d' EXIT
for _ in $(seq 200); do curl -sf http://127.0.0.1:$hp/readyz >/dev/null && break; sleep 0.1; done
# one task first so the queue exists
python3 - $hp $n $plen $rp <<'PY'
import json, sys, urllib.request, subprocess, time
hp, n, plen, rp = map(int, sys.argv[1:])
def post(path, body):
    r = urllib.request.Request(f"http://127.0.0.1:{hp}{path}", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(r))
def info():
    out = subprocess.check_output(["redis-cli", "-p", str(rp), "info", "memory"]).decode()
    return int([l for l in out.splitlines() if l.startswith("used_memory:")][0].split(":")[1])
payload = {"data": "x" * (plen - 11)}
assert len(json.dumps(payload, separators=(",", ":"))) == plen, len(json.dumps(payload, separators=(",", ":")))
post("/api/v1/queues/mem/tasks", {"payload": payload})
time.sleep(1)
before = info()
done = 0
while done < n:
    k = min(1000, n - done)
    post("/api/v1/queues/mem/tasks/batch", {"tasks": [{"payload": payload}] * k})
    done += k
time.sleep(2)
after = info()
print(f"{n} tasks, payload {plen} B: {(after - before) / n:.0f} bytes per task")
keys = subprocess.check_output(["redis-cli", "-p", str(rp), "--scan"]).decode().split()
big = sorted(((int(subprocess.check_output(["redis-cli", "-p", str(rp), "memory", "usage", k]).decode().strip() or 0), k) for k in keys if ":task:" not in k), reverse=True)[:8]
for b, k in big: print(f"  {k}: {b}")
t = [k for k in keys if ":task:" in k][:1]
for k in t:
    print("  a task hash:", subprocess.check_output(["redis-cli", "-p", str(rp), "memory", "usage", k]).decode().strip(), subprocess.check_output(["redis-cli", "-p", str(rp), "object", "encoding", k]).decode().strip())
    print("  fields:", subprocess.check_output(["redis-cli", "-p", str(rp), "hgetall", k]).decode().split("\n")[::2])
print("  keys:", len(keys))
PY

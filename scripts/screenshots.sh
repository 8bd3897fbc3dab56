#!/usr/bin/env bash
# Regenerates the dashboard screenshots in docs/screenshots/ (used by the
# README): starts one node with its embedded Redis in a temporary directory,
# gives it some work (tasks queued, running, done and dead on a few queues, a
# barrier round, a lock), and photographs pages with headless Chromium.
#
# usage: scripts/screenshots.sh [muster binary]   (default target/release/muster)
# needs: chromium (apt-get install -y chromium), curl
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/muster}
out=docs/screenshots
mkdir -p "$out"
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" serve --listen "127.0.0.1:$port" --data-dir "$dir" --node-id node-a >"$dir/node.log" 2>&1 &
node=$!
trap 'kill $node 2>/dev/null; wait $node 2>/dev/null; rm -rf "$dir"' EXIT
url="http://127.0.0.1:$port"
for _ in $(seq 1 100); do curl -sf "$url/readyz" >/dev/null && break; sleep 0.2; done
api() { curl -sf -X "$1" -H 'content-type: application/json' "$url$2" ${3:+-d "$3"}; }
api PUT /api/v1/nodes/worker-1/heartbeat '{"ttl_ms": 600000}' >/dev/null
api PUT /api/v1/nodes/worker-2/heartbeat '{"ttl_ms": 600000}' >/dev/null
for q in emails thumbnails reports; do
  tasks=$(python3 -c "import json; print(json.dumps({'tasks': [{'payload': {'n': i}, 'max_attempts': 1} for i in range(40)]}))")
  api POST "/api/v1/queues/$q/tasks/batch" "$tasks" >/dev/null
done
# Some done, some dead, some running.
python3 - "$url" <<'PY'
import json, sys, urllib.request
url = sys.argv[1]
def call(method, path, body=None):
    req = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read() or b"null")
for q, done, dead in [("emails", 25, 3), ("thumbnails", 30, 0), ("reports", 10, 6)]:
    got = call("POST", f"/api/v1/queues/{q}/claim", {"node": "worker-1", "max": done + dead + 4, "wait_ms": 0})
    tasks = got["tasks"] if isinstance(got, dict) else got
    for i, t in enumerate(tasks):
        if i < done:
            call("POST", f"/api/v1/tasks/{t['id']}/complete", {"token": t["token"], "result": {"ok": True}})
        elif i < done + dead:
            call("POST", f"/api/v1/tasks/{t['id']}/fail", {"token": t["token"], "error": "SMTP 451: try again later", "retry": False})
call("PUT", "/api/v1/barriers/nightly-build", {"participants": ["worker-1", "worker-2", "worker-3"], "max_missing": 1, "timeout_ms": 600000})
call("POST", "/api/v1/barriers/nightly-build/rounds/2026-11-24/arrive", {"node": "worker-1", "wait_ms": 0})
call("POST", "/api/v1/locks/billing-export/acquire", {"owner": "worker-2", "ttl_ms": 300000})
PY
# Let every node merge and sample once (every 5 s) so the history charts
# show the queues' depth and latency.
sleep 6
shoot() {
  chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,860 \
    --virtual-time-budget=3000 --screenshot="$out/$1.png" "$url$2" >/dev/null 2>&1
  echo "wrote $out/$1.png ($2)"
}
shoot overview /
shoot queue /queues/emails
shoot dead /dead

#!/usr/bin/env python3
# Sequential driver for scripts/node-callgrind.sh: n times submit one task,
# claim it (no wait) and complete it, one request at a time.
# MODE=submit stops after the submits, MODE=claim after the claims (the cost
# of each call, by difference). MODE=chain is a busy batch-1 worker's path:
# one claim, then n times submit one task and complete the one held with
# `next` (which claims the task just submitted): two calls per task.
# MODE=batch is the batch-100 bench's path: n tasks in batches of BATCH
# (default 100) with the bench's payload (91 bytes): submit a batch, claim it,
# complete it in one call; three calls per batch.
# usage: [MODE=submit|claim|chain|batch] [BATCH=100] seq-driver.py <node port> <n>
import http.client, json, os, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
mode = os.environ.get("MODE", "full")
c = http.client.HTTPConnection("127.0.0.1", port)
def call(method, path, body):
    c.request(method, path, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse(); data = r.read()
    assert r.status < 300, (path, r.status, data)
    return json.loads(data) if data else None
call("PUT", "/api/v1/nodes/w/heartbeat", {"ttl_ms": 3600000})
if mode == "batch":
    b = int(os.environ.get("BATCH", "100"))
    payload = {"kind": "bench", "data": "x" * 64}
    for i in range(0, n, b):
        k = min(b, n - i)
        call("POST", "/api/v1/queues/seq/tasks/batch", {"tasks": [{"payload": payload}] * k})
        t = call("POST", "/api/v1/queues/seq/claim", {"node": "w", "max": k, "wait_ms": 0})
        t = t["tasks"] if isinstance(t, dict) else t
        assert len(t) == k, (len(t), k)
        call("POST", "/api/v1/tasks/complete", [{"id": x["id"], "token": x["token"], "result": True} for x in t])
    sys.exit(0)
if mode == "chain":
    call("POST", "/api/v1/queues/seq/tasks", {"payload": {"i": -1}})
    t = call("POST", "/api/v1/queues/seq/claim", {"node": "w", "max": 1, "wait_ms": 0})
    t = t["tasks"][0] if isinstance(t, dict) else t[0]
    for i in range(n):
        call("POST", "/api/v1/queues/seq/tasks", {"payload": {"i": i}})
        r = call("POST", f"/api/v1/tasks/{t['id']}/complete", {"token": t["token"], "next": {"max": 1}})
        t = r["next"]["tasks"][0]
    sys.exit(0)
for i in range(n):
    call("POST", "/api/v1/queues/seq/tasks", {"payload": {"i": i}})
    if mode == "submit":
        continue
    t = call("POST", "/api/v1/queues/seq/claim", {"node": "w", "max": 1, "wait_ms": 0})
    t = t["tasks"][0] if isinstance(t, dict) else t[0]
    if mode == "claim":
        continue
    call("POST", f"/api/v1/tasks/{t['id']}/complete", {"token": t["token"]})

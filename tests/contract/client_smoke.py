"""A worker's round trip through a client generated from muster's OpenAPI
document by openapi-python-client (tests/it/contract.rs generates it and
puts it on PYTHONPATH as `muster_client`).

usage: client_smoke.py BASE_URL TOKEN WORKER_ID
Submits a task, joins as a worker, claims the task, completes it with its
fencing token, and reads it back as succeeded. Exits non-zero on any
mismatch.
"""

import sys

from muster_client import AuthenticatedClient
from muster_client.api.nodes import heartbeat_node
from muster_client.api.tasks import claim_tasks, complete_task, get_task, submit_task
from muster_client.models import (
    ClaimRequest,
    ClaimResponse,
    CompleteRequest,
    FinishedNext,
    Heartbeat,
    HeartbeatBody,
    SubmitResponse,
    Task,
    TaskSpec,
)


def expect(value, kind, what):
    if not isinstance(value, kind):
        sys.exit(f"{what}: expected {kind.__name__}, got {value!r}")
    return value


def main() -> None:
    base, token, worker = sys.argv[1], sys.argv[2], sys.argv[3]
    client = AuthenticatedClient(base_url=base, token=token, raise_on_unexpected_status=True)
    queue = "contract-client"

    submitted = expect(
        submit_task.sync(queue, client=client, body=TaskSpec(payload={"n": 1}, max_attempts=2)),
        SubmitResponse,
        "submit",
    )
    expect(heartbeat_node.sync(worker, client=client, body=HeartbeatBody(ttl_ms=60_000)), Heartbeat, "join")
    claimed = expect(
        claim_tasks.sync(queue, client=client, body=ClaimRequest(node=worker, max_=1, wait_ms=2000)),
        ClaimResponse,
        "claim",
    )
    if [t.id for t in claimed.tasks] != [submitted.id]:
        sys.exit(f"claimed {[t.id for t in claimed.tasks]}, submitted {submitted.id}")
    fencing = claimed.tasks[0].token
    done = expect(
        complete_task.sync(submitted.id, client=client, body=CompleteRequest(token=fencing, result={"ok": True})),
        FinishedNext,
        "complete",
    )
    if done.state != "succeeded":
        sys.exit(f"complete answered state {done.state!r}")
    task = expect(get_task.sync(submitted.id, client=client), Task, "get")
    if task.state != "succeeded" or task.payload != {"n": 1}:
        sys.exit(f"the task reads back as {task.to_dict()!r}")
    print(f"ok: task {task.id} submitted, claimed with token {fencing}, completed, read back as succeeded")


if __name__ == "__main__":
    main()

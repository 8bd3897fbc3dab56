#!/usr/bin/env python3
"""Where the CPU of one task goes, by process: muster (bench client, node,
Redis) beside BullMQ (its producer and worker processes, Redis), on one
redis-server, alternating, at batch 1 or 100 (issue 41).

Per run: the redis-server's `INFO cpu` before and after the whole client run
(warm-up included), the machine's busy time from /proc/stat over the same
span, and for muster the node's utime and stime from /proc/<pid>/stat and the
bench process's own from its rusage. BullMQ's clients are a producer process
and a forked worker process: their CPU is the machine's busy time less
Redis's (run it on an otherwise idle machine; `load` in the output says how
idle the machine was before each run). Every figure is per task of the run,
warm-up included (muster bench and BullMQ's bench.js both warm up with
2 000 tasks first).

usage: scripts/bench-cpu-split.py <redis port> <rounds> <batch: 1|100> [muster binary]
  needs ../shared/bench-peers/bullmq with `npm install` done
"""
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "bench-peers", "bullmq"))
TICK = os.sysconf("SC_CLK_TCK")
WARM = 2000


def redis(port, *args):
    return subprocess.check_output(["redis-cli", "-p", str(port), *args], text=True)


def redis_cpu(port):
    info = redis(port, "info", "cpu")
    vals = dict(l.split(":", 1) for l in info.splitlines() if ":" in l)
    return float(vals["used_cpu_user"]) + float(vals["used_cpu_sys"])


def busy():
    """The machine's busy CPU seconds (every core)."""
    f = open("/proc/stat").readline().split()[1:]
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def proc_cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) / TICK, int(f[12]) / TICK


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def run_muster(rp, batch, tasks, binary):
    redis(rp, "flushall")
    port = free_port()
    d = tempfile.mkdtemp()
    node = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", d,
                             "--redis-url", f"redis://127.0.0.1:{rp}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        time.sleep(1)
        load = os.getloadavg()[0]
        n0, r0, b0 = proc_cpu(node.pid), redis_cpu(rp), busy()
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([binary, "bench", "--url", f"http://127.0.0.1:{port}", "--tasks", str(tasks),
                              "--workers", "8", "--batch", str(batch), "--no-half-load", "--no-baseline", "--json"],
                             capture_output=True, text=True, check=True).stdout
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        n1, r1, b1 = proc_cpu(node.pid), redis_cpu(rp), busy()
    finally:
        node.terminate()
        node.wait()
    rate = json.loads(out[out.index("{"):])["peak_tasks_per_sec"]
    per = 1e6 / (tasks + WARM)
    return {
        "system": "muster", "rate": rate, "load": load,
        "client": ((c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)) * per,
        "node_user": (n1[0] - n0[0]) * per, "node_sys": (n1[1] - n0[1]) * per,
        "redis": (r1 - r0) * per, "machine": (b1 - b0) * per,
    }


def run_bullmq(rp, batch, tasks):
    redis(rp, "flushall")
    load = os.getloadavg()[0]
    r0, b0 = redis_cpu(rp), busy()
    out = subprocess.run(["node", "bench.js", "--port", str(rp), "--n", str(tasks), "--concurrency", "8",
                          "--chunk", "0" if batch == 1 else str(batch)], cwd=PEERS, capture_output=True, text=True,
                         check=True).stdout
    r1, b1 = redis_cpu(rp), busy()
    rate = json.loads(out.strip().splitlines()[-1])["jobs_per_sec"]
    per = 1e6 / (tasks + WARM)
    return {"system": "bullmq", "rate": rate, "load": load, "redis": (r1 - r0) * per,
            "machine": (b1 - b0) * per, "client": (b1 - b0 - (r1 - r0)) * per}


def main():
    rp, rounds, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    binary = sys.argv[4] if len(sys.argv) > 4 else os.path.join(HERE, "..", "target", "release", "muster")
    tasks = 20000 if batch == 1 else 50000
    for r in range(1, rounds + 1):
        for run in (lambda: run_muster(rp, batch, tasks, binary), lambda: run_bullmq(rp, batch, tasks)):
            m = run()
            if m["system"] == "muster":
                other = m["machine"] - m["client"] - m["node_user"] - m["node_sys"] - m["redis"]
                print(f"round {r} muster batch {batch}: {m['rate']:.0f} tasks/s; CPU µs per task: "
                      f"bench client {m['client']:.0f}, node {m['node_user']:.0f} user + {m['node_sys']:.0f} system, "
                      f"Redis {m['redis']:.0f}; machine {m['machine']:.0f} (other {other:.0f}); load {m['load']:.2f}",
                      flush=True)
            else:
                print(f"round {r} BullMQ {'single add' if batch == 1 else 'addBulk'}: {m['rate']:.0f} jobs/s; "
                      f"CPU µs per job: producer and worker {m['client']:.0f}, Redis {m['redis']:.0f}; "
                      f"machine {m['machine']:.0f}; load {m['load']:.2f}", flush=True)


if __name__ == "__main__":
    main()

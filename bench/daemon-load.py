#!/usr/bin/env python3
"""daemon-load.py: turbokvd under load from honest and hostile clients (issue 21).

Two measurements, each on a fresh daemon, loopback only, bounded in time:

  latency   While one client's long prompt is being prefilled (several 512-token
            chunks), a second client connects, says Hello and asks Status,
            --samples times: p50/p99/max of the Hello and Status round trips,
            and how long one prefill chunk takes. Before the model moved off
            the event loop these waited for the chunk to end.

  load      --clients honest clients (default 100) ask at once, each one greedy
            question from a fixed set, while --hostile hostile clients (default
            5: descriptors parked in a frame that never ends, a client that
            never reads its answer, garbage bytes, an idle connection that never
            says Hello, a frame sent one byte a second) do their worst. Checks
            every honest answer equals the same question's answer on an idle
            daemon (greedy), that each hostile client was refused or dropped,
            and reports p50/p99 time to first token and the daemon's RSS
            before and after.

Usage (after scripts/setup.sh; the daemon is started here with --threads N):
  bench/daemon-load.py latency [--samples 20] [--threads 2] [--build build]
  bench/daemon-load.py load [--clients 100] [--hostile 5] [--tokens 16] [--threads 2] [--build build]
  add --json for one JSON object on stdout.
The daemon caps each user at 32 connections and 32 requests in flight. Run as
root, the honest clients are spread over --honest-uids users (default 4, uids
61000..; each group runs in a forked process that drops to its uid), so 100 of
them stay under the caps as 100 people on one machine would; the hostile ones
stay root. As another user, every client has that uid (--honest-uids 1) and
the clients beyond the caps are refused by design (counted as failures).
"""
import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import tkvwire as w  # noqa: E402

LONG_PROMPT = "The quick brown fox jumps over the lazy dog while the cat sleeps. " * 150
QUESTIONS = ["What is the capital of France?", "Name three colors.", "What is 2 + 2?",
             "Say hello in Spanish.", "What is the largest ocean?"]


def start_daemon(tmp, a, extra=()):
    sock = os.path.join(tmp, "turbokv.sock")
    cmd = [os.path.join(ROOT, a.build, "daemon/turbokvd"), "--socket", sock, "--threads", str(a.threads),
           "--state-dir", os.path.join(tmp, "state")] + list(extra)
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            c = w.Conn(sock)
            c.hello()
            c.close()
            return proc, sock
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("turbokvd did not come up")


def stop_daemon(proc):
    proc.terminate()
    return proc.wait(60)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary(xs):
    return {"p50": pct(xs, 50), "p99": pct(xs, 99), "max": max(xs), "n": len(xs)}


# ---------------------------------------------------------------- latency

def run_latency(a, tmp):
    proc, sock = start_daemon(tmp, a)
    hello_ms, status_ms, chunk_ms = [], [], []
    try:
        while len(status_ms) < a.samples:
            c = w.Conn(sock)
            c.hello()
            c.send(w.generate(1, raw=LONG_PROMPT, max_tokens=1))
            times = []
            kind = None
            while kind not in ("done", "error"):
                kind, f = c.recv()
                if kind == "progress":
                    times.append(time.monotonic())
                    if len(times) >= 2 and len(status_ms) < a.samples:
                        # a chunk is running now: measure a new client's Hello and Status
                        t0 = time.monotonic()
                        b = w.Conn(sock)
                        b.hello()
                        t1 = time.monotonic()
                        b.send(w.status(1))
                        while b.recv()[0] != "status_reply":
                            pass
                        t2 = time.monotonic()
                        b.close()
                        hello_ms.append((t1 - t0) * 1e3)
                        status_ms.append((t2 - t1) * 1e3)
            assert kind == "done", (kind, f)
            chunk_ms += [(y - x) * 1e3 for x, y in zip(times, times[1:])]
            c.close()
    finally:
        stop_daemon(proc)
    return {"hello_ms": summary(hello_ms), "status_ms": summary(status_ms), "prefill_chunk_ms": summary(chunk_ms)}


# ---------------------------------------------------------------- load

def ask(sock, q, n, timeout=600):
    c = w.Conn(sock, timeout=timeout)
    c.hello()
    t0 = time.monotonic()
    c.send(w.generate(1, user=q, max_tokens=n))
    res = w.collect(c, 1)
    c.close()
    ttft = (res.t_first - t0) * 1e3 if res.t_first else None
    return res, ttft


def hostile_parked_fds(sock, stop, out):
    c = w.Conn(sock, timeout=30)
    c.hello()
    for i in range(4):
        fds = [w.memfd_with(b"x") for _ in range(16)]
        try:
            socket.send_fds(c.sock, [struct.pack("<I", 1 << 20) + b"\x12" if i == 0 else b"\x00"], fds)
        except OSError:
            pass
        for fd in fds:
            os.close(fd)
    out["parked_fds"] = hostile_outcome(c, stop)


def hostile_never_reads(sock, stop, out):
    c = w.Conn(sock, timeout=30)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.hello()
    c.send(w.generate(1, user="Write a very long story about a dragon.", max_tokens=4000))
    stop.wait()
    out["never_reads"] = "paused by backpressure, closed by the client at the end"
    c.close()


def hostile_garbage(sock, stop, out):
    c = w.Conn(sock, timeout=30)
    c.send_raw(os.urandom(64))
    out["garbage"] = hostile_outcome(c, stop)


def hostile_idle(sock, stop, out):
    c = w.Conn(sock, timeout=30)  # never says Hello
    out["idle"] = hostile_outcome(c, stop)


def hostile_slowloris(sock, stop, out):
    c = w.Conn(sock, timeout=30)
    frame = w.frame(w.hello())
    for b in frame[:-1]:
        if stop.wait(1.0):
            break
        try:
            c.send_raw(bytes([b]))
        except OSError:
            break
    out["slowloris"] = hostile_outcome(c, stop)


def hostile_outcome(c, stop):
    """What the daemon did to a hostile connection: its Error code, or that it closed it."""
    c.sock.settimeout(1.0)
    while not stop.is_set():
        try:
            m = c.recv()
        except socket.timeout:
            continue
        except OSError:
            return "dropped"
        if m is None:
            return "closed"
        if m[0] == "error":
            name = [k for k, v in w.E.items() if v == w.first(m[1], 2)]
            return "Error(%s)" % (name[0] if name else w.first(m[1], 2))
    return "still open at the end"


HOSTILE = [hostile_parked_fds, hostile_never_reads, hostile_garbage, hostile_idle, hostile_slowloris]


def honest_group(sock, a, idx):
    """[(question, {"tokens", "error"} or None, ttft ms or error text)] of the clients idx, at once."""
    out = [None] * len(idx)

    def one(j, i):
        q = QUESTIONS[i % len(QUESTIONS)]
        try:
            res, ttft = ask(sock, q, a.tokens)
            out[j] = (q, {"tokens": list(res.tokens), "error": res.error and str(res.error)}, ttft)
        except Exception as e:  # noqa: B902: counted as a failure by the caller
            out[j] = (q, None, repr(e))
    ths = [threading.Thread(target=one, args=(j, i)) for j, i in enumerate(idx)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return out


def run_honest(a, sock):
    """The honest clients, all at once: in this process, or (as root) one forked process per uid."""
    uids = a.honest_uids if os.geteuid() == 0 else 1
    if uids <= 1:
        return honest_group(sock, a, list(range(a.clients)))
    kids = []
    for u in range(uids):
        idx = list(range(u, a.clients, uids))
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child keeps gid 0 (the socket is 0660 root:root) and becomes another user
            os.close(r)
            code = 0
            try:
                os.setuid(61000 + u)
                os.write(wfd, json.dumps(honest_group(sock, a, idx)).encode())
            except BaseException:  # noqa: B902: the parent counts the missing answers
                code = 1
            os._exit(code)
        os.close(wfd)
        kids.append((pid, r, idx))
    results = [None] * a.clients
    for pid, r, idx in kids:
        with os.fdopen(r, "rb") as f:
            data = f.read()
        os.waitpid(pid, 0)
        got = json.loads(data) if data else [(QUESTIONS[i % len(QUESTIONS)], None, "client process failed")
                                             for i in idx]
        for i, res in zip(idx, got):
            results[i] = tuple(res)
    return results


def run_load(a, tmp):
    os.chmod(tmp, 0o750)  # the honest users (gid 0) reach the socket inside
    proc, sock = start_daemon(tmp, a, ["--idle-timeout", "20"])
    try:
        golden = {q: ask(sock, q, a.tokens)[0].tokens for q in QUESTIONS}  # one at a time: the reference
        rss_before = rss_kib(proc.pid)
        stop = threading.Event()
        hostile_out = {}
        hostile = [threading.Thread(target=HOSTILE[i % len(HOSTILE)], args=(sock, stop, hostile_out), daemon=True)
                   for i in range(a.hostile)]
        for t in hostile:
            t.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        results = run_honest(a, sock)
        wall = time.monotonic() - t0
        # the hostile ones get until the Hello timeout (10 s) and a little to be refused
        deadline = t0 + 15
        for t, fn in zip(hostile, [HOSTILE[i % len(HOSTILE)] for i in range(a.hostile)]):
            if fn is not hostile_never_reads:
                t.join(max(0.0, deadline - time.monotonic()))
        stop.set()
        for t in hostile:
            t.join(10)
        time.sleep(1)
        rss_after = rss_kib(proc.pid)
        ok = [r for r in results if r[1] is not None and r[1]["error"] is None and r[1]["tokens"] == golden[r[0]]]
        bad = [(r[0], r[2] if r[1] is None else r[1]["error"] or "answer differs") for r in results if r not in ok]
        ttft = [r[2] for r in ok if r[2] is not None]
    finally:
        rc = stop_daemon(proc)
    return {"clients": a.clients, "hostile": hostile_out, "honest_correct": len(ok), "honest_failed": bad[:10],
            "ttft_ms": summary(ttft) if ttft else None, "wall_s": wall, "rss_kib_before": rss_before,
            "rss_kib_after": rss_after, "daemon_exit": rc}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["latency", "load"])
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--hostile", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--honest-uids", type=int, default=4)
    ap.add_argument("--build", default="build")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tkv-load-") as tmp:
        out = run_latency(a, tmp) if a.mode == "latency" else run_load(a, tmp)
    if a.json:
        print(json.dumps(out))
    elif a.mode == "latency":
        for k in ("hello_ms", "status_ms", "prefill_chunk_ms"):
            s = out[k]
            print("%-17s p50 %8.1f  p99 %8.1f  max %8.1f  (n=%d)" % (k, s["p50"], s["p99"], s["max"], s["n"]))
    else:
        print("honest clients answered correctly: %d of %d (wall %.1f s)" % (out["honest_correct"], a.clients,
                                                                            out["wall_s"]))
        for q, why in out["honest_failed"]:
            print("  failed: %r: %s" % (q, why))
        if out["ttft_ms"]:
            print("time to first token: p50 %.0f ms, p99 %.0f ms" % (out["ttft_ms"]["p50"], out["ttft_ms"]["p99"]))
        for k, v in sorted(out["hostile"].items()):
            print("hostile %-12s %s" % (k, v))
        print("daemon RSS: %d KiB before, %d KiB after; exit %d" % (out["rss_kib_before"], out["rss_kib_after"],
                                                                   out["daemon_exit"]))
    if a.mode == "load" and (out["honest_correct"] != a.clients or out["daemon_exit"] != 0):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""prefix-bench.py: issue 23's number: time to first token of the last turn of a stateless chat
(the client sends the whole history every turn, no session name), with and without prefix reuse.

Usage: bench/prefix-bench.py --daemon BUILD/daemon/turbokvd [--turns 10] [--runs 3] [--answer 32]
                             [--threads N] [--kv SPEC] [--restart] [--json]

For each run, two daemons in turn on a fresh temporary state directory: one with the default
--prefix-cache (reuse) and one with --prefix-cache 0 (every turn prefills the whole history).
Each plays the same --turns-turn chat: turn i sends the system prompt, the i - 1 earlier
questions with the answers the daemon gave, and question i (greedy, --answer tokens at most).
The runs interleave the two daemons, so a machine that is busy with something else slows both
alike; reported are the medians of the last turn's Done.ttft_ms (request received to first token,
queueing included) and Done.prefill_ms, its prompt and cached tokens, and their ratio.

--restart: the daemon is stopped (SIGTERM) after turn --turns - 1 and started again on the same
state directory before the last turn; the two daemons compared are then the default (the prefix
caches are spilled to disk at shutdown and loaded on the last turn) and --prefix-spill 0 (memory
only: the restarted daemon prefills the whole history).
Talks to the daemon with tests/integration/tkvwire.py.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
import tkvwire as w  # noqa: E402

SYSTEM = "You are a helpful assistant who answers in a few sentences."
TOPICS = ["rivers", "mountains", "bread", "bicycles", "libraries", "volcanoes", "gardens", "trains", "bees",
          "lighthouses", "glaciers", "markets"]


class Daemon:
    def __init__(self, daemon, tmp, extra):
        self.sock = os.path.join(tmp, "turbokvd.sock")
        notify = os.path.join(tmp, "notify")
        if os.path.exists(notify):
            os.unlink(notify)  # a restart on the same directory (--restart)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(notify)
        self.notify.settimeout(1)
        env = dict(os.environ, NOTIFY_SOCKET=notify)
        self.proc = subprocess.Popen([daemon, "--socket", self.sock, "--state-dir", os.path.join(tmp, "state")]
                                     + extra, env=env, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.reader = threading.Thread(target=lambda: [self.log.append(x) for x in self.proc.stderr], daemon=True)
        self.reader.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "turbokvd exited: " + "".join(self.log)
            try:
                if "READY=1" in self.notify.recv(4096).decode().split("\n"):
                    return
            except socket.timeout:
                pass
        raise RuntimeError("turbokvd not ready")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(600)
        self.reader.join(10)
        self.notify.close()
        assert rc == 0, "turbokvd exited with %d: %s" % (rc, "".join(self.log[-5:]))


def chat(d, turns, answer, before_last=None):
    """Play the stateless chat (before_last(d) -> d runs before the last turn); returns its Done as a dict."""
    hist = [(1, SYSTEM)]
    last = None
    for i in range(turns):
        if before_last and i == turns - 1:
            d = before_last(d)
        hist.append((2, "Tell me something about %s, and how it relates to what we said before." %
                     TOPICS[i % len(TOPICS)]))
        c = w.Conn(d.sock, timeout=3600)
        c.hello()
        c.send(w.generate(i + 1, messages=hist, max_tokens=answer))
        res = w.collect(c, i + 1)
        c.close()
        assert res.error is None, res.error
        hist.append((3, res.text.decode(errors="replace")))
        last = res.done
    return dict(prompt=w.first(last, 3), cached=w.first(last, 4), prefill_ms=w.done_double(last, 7),
                ttft_ms=w.done_double(last, 9))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--kv", default=None)
    ap.add_argument("--restart", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    extra = (["--threads", str(args.threads)] if args.threads else []) + (["--kv", args.kv] if args.kv else [])
    results = {"reuse": [], "none": []}
    off = ["--prefix-spill", "0"] if args.restart else ["--prefix-cache", "0"]
    for run in range(args.runs):
        for mode, flags in (("reuse", []), ("none", off)):
            tmp = tempfile.mkdtemp(prefix="tkv-prefixbench-")
            live = []

            def restart(d, tmp=tmp, flags=flags):
                d.stop()
                live[0] = Daemon(args.daemon, tmp, extra + flags)
                return live[0]
            try:
                live.append(Daemon(args.daemon, tmp, extra + flags))
                try:
                    res = chat(live[0], args.turns, args.answer, restart if args.restart else None)
                finally:
                    live[0].stop()
                # the daemon's own account of reading the spilled cache back (prefixspill.c)
                loads = [float(x.split(" in ")[-1].split(" ms")[0]) for x in live[0].log
                         if "restored a prefix cache" in x]
                res["load_ms"] = loads[-1] if loads else 0.0
                results[mode].append(res)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    out = {}
    for mode, rs in results.items():
        out[mode] = {k: statistics.median(r[k] for r in rs)
                     for k in ("prompt", "cached", "prefill_ms", "ttft_ms", "load_ms")}
        out[mode]["runs"] = rs
    out["ttft_ratio"] = out["none"]["ttft_ms"] / max(out["reuse"]["ttft_ms"], 1e-9)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print("turn %d of a stateless chat%s, median of %d runs (answers <= %d tokens):" %
          (args.turns, " after a daemon restart" if args.restart else "", args.runs, args.answer))
    names = {"none": "memory only (--prefix-spill 0)" if args.restart else "no reuse (--prefix-cache 0)",
             "reuse": "spilled (default)" if args.restart else "prefix reuse (default)"}
    for mode in ("none", "reuse"):
        o = out[mode]
        print("  %-30s prompt %5d tokens, cached %5d, prefill %8.1f ms, time to first token %8.1f ms%s" %
              (names[mode], o["prompt"], o["cached"], o["prefill_ms"], o["ttft_ms"],
               ", file load %.1f ms" % o["load_ms"] if o["load_ms"] else ""))
    print("  time to first token: %.2fx faster with %s" % (out["ttft_ratio"], "the spill" if args.restart
                                                            else "reuse"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""http-overhead.py: turbokv-http against the native protocol, on the same daemon.

For one chat prompt answered greedily, measures the time to first token and
the decode rate (tokens after the first / time after the first) of
  native   a client of the daemon's socket (tests/integration/tkvwire.py:
           connect, Hello, Generate, read Token messages), and
  http     a streamed POST /v1/chat/completions to turbokv-http on a kept-alive
           connection (request, read SSE events; the gateway takes a kept
           libturbokv connection from its pool and starts a worker thread
           per request),
alternating which goes first in each round, so that load drifting on the
machine hits both alike. Prints the medians and the median of the per-round
ratios http/native (target: under 5% overhead).

--baseline GATEWAY adds a second gateway binary (an older build, say) on its
own port in front of the same daemon, measured in the same rounds (column
"base"), with the median per-round difference of its time to first token
from the first gateway's.

Usage (after scripts/setup.sh):
  bench/http-overhead.py [--rounds 9] [--tokens 64] [--threads 2] [--build build] [--fresh]
                         [--baseline PATH/turbokv-http]
"""
import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import tkvwire as w  # noqa: E402

PROMPT = "Write a short paragraph about the history of Paris."


def wait_for(fn, what):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            fn()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(what + " did not come up")


def native(sock, n, prompt=PROMPT):
    c = w.Conn(sock)
    c.hello()
    t0 = time.monotonic()
    c.send(w.generate(1, user=prompt, max_tokens=n, greedy=True))
    res = w.collect(c, 1)
    t1 = time.monotonic()
    c.close()
    assert res.error is None, res.error
    return res.t_first - t0, (len(res.tokens) - 1) / (t1 - res.t_first), len(res.tokens)


_http_conn = {}


def via_http(port, n, prompt=PROMPT):
    """One streamed request on a kept-alive connection, as the openai and ollama
    packages (httpx) and browsers send them: the TCP connect and the gateway's
    connection thread are not part of every request."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": n,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.monotonic()
    c = _http_conn.get(port) or _http_conn.setdefault(port, http.client.HTTPConnection("127.0.0.1", port,
                                                                                       timeout=300))
    c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    t_first, tokens = None, 0
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        for ch in ev["choices"]:
            if ch["delta"].get("content") and t_first is None:
                t_first = time.monotonic()
    t1 = time.monotonic()
    return t_first - t0, (tokens - 1) / (t1 - t_first), tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default="build")
    ap.add_argument("--fresh", action="store_true",
                    help="a different question every request, so that prefix reuse cannot skip the "
                         "prefill (by default the same question: after the first, only its last "
                         "token is computed and the time to first token is mostly overhead)")
    ap.add_argument("--baseline", help="a second turbokv-http binary, measured in the same rounds")
    a = ap.parse_args()
    build = os.path.join(ROOT, a.build)
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "turbokv.sock")
        def free_port():
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
            s.close()
            return p
        port, port_b = free_port(), free_port()
        d = subprocess.Popen([os.path.join(build, "daemon/turbokvd"), "--socket", sock, "--threads",
                              str(a.threads), "--state-dir", os.path.join(tmp, "state")],
                             stderr=subprocess.DEVNULL)
        g = subprocess.Popen([os.path.join(build, "clients/http/turbokv-http"), "--socket", sock,
                              "--listen", "127.0.0.1:%d" % port], stderr=subprocess.DEVNULL)
        gb = subprocess.Popen([a.baseline, "--socket", sock, "--listen", "127.0.0.1:%d" % port_b],
                              stderr=subprocess.DEVNULL) if a.baseline else None
        kinds = ("native", "http") + (("base",) if gb else ())
        try:
            wait_for(lambda: (lambda c: (c.hello(), c.close()))(w.Conn(sock)), "turbokvd")
            wait_for(lambda: socket.create_connection(("127.0.0.1", port)).close(), "turbokv-http")
            native(sock, 4)  # warm up both paths
            via_http(port, 4)
            if gb:
                wait_for(lambda: socket.create_connection(("127.0.0.1", port_b)).close(), "baseline")
                via_http(port_b, 4)
            rows = {k: [] for k in kinds}
            ttft_ratio, rate_ratio, base_diff = [], [], []
            for i in range(a.rounds):
                order = kinds[i % len(kinds):] + kinds[:i % len(kinds)]
                if i // len(kinds) % 2:
                    order = order[::-1]
                got = {}
                for k in order:
                    q = "Question %d from the %s client. %s" % (i, k, PROMPT) if a.fresh else PROMPT
                    got[k] = native(sock, a.tokens, q) if k == "native" else \
                        via_http(port if k == "http" else port_b, a.tokens, q)
                    rows[k].append(got[k])
                assert a.fresh or got["native"][2] == got["http"][2], ("token counts differ", got)
                ttft_ratio.append(got["http"][0] / got["native"][0])
                rate_ratio.append(got["http"][1] / got["native"][1])
                if gb:
                    base_diff.append(got["base"][0] - got["http"][0])
            med = statistics.median
            print(f"{a.rounds} alternating rounds, {a.tokens} tokens, {a.threads} threads, "
                  f"{'a fresh question each time' if a.fresh else 'the same question'} (medians)")
            for k, v in rows.items():
                print(f"  {k:7s} ttft {med(x[0] for x in v) * 1000:8.1f} ms   decode "
                      f"{med(x[1] for x in v):7.2f} tok/s   ({v[0][2]} tokens)")
            print(f"  http/native: ttft x{med(ttft_ratio):.3f}, decode rate x{med(rate_ratio):.3f}")
            if gb:
                print(f"  base - http: ttft {med(base_diff) * 1000:+.2f} ms")
        finally:
            for p in ((gb,) if gb else ()) + (g, d):
                p.send_signal(signal.SIGTERM)
                p.wait(60)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""daemon-bench.py: turbokvd through its socket against in-process turbokv-lab.

Measures, for one chat prompt answered greedily:
  * time to first token and decode tokens/s through the socket (one client),
    against turbokv-lab generate's prefill time and decode rate for the same
    prompt (in-process, model already loaded when its timer starts);
  * total throughput (generated tokens/s summed over clients) with 1, 4 and
    16 concurrent clients, one request each.
Medians over --rounds. Usage (after scripts/setup.sh):
  bench/daemon-bench.py [--rounds 5] [--threads 2] [--tokens 64] [--build build]
--build names the build directory whose turbokvd and turbokv-lab are measured
(relative to the repository root, or absolute).

  bench/daemon-bench.py --compare OLD_BUILD [--build build] [--rounds 7]
A/B mode for a noisy machine: both daemons run (an idle one costs nothing),
and the concurrent bursts alternate between them round by round; it prints
each side's median throughput and the median of the per-round ratios
new/old, which load drifting between rounds affects least.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import tkvwire as w  # noqa: E402

PROMPT = "Write a short paragraph about the history of Paris."


def start_daemon(tmp, threads, build):
    sock = os.path.join(tmp, "turbokv.sock")
    proc = subprocess.Popen([os.path.join(ROOT, build, "daemon/turbokvd"), "--socket", sock,
                             "--threads", str(threads)], stderr=subprocess.DEVNULL)
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


def one_request(sock, rid, n_tokens, out):
    c = w.Conn(sock)
    c.hello()
    t0 = time.monotonic()
    c.send(w.generate(rid, user=PROMPT, max_tokens=n_tokens, greedy=True))
    res = w.collect(c, rid)
    t1 = time.monotonic()
    c.close()
    assert res.error is None, res.error
    out.append((t0, res.t_first, t1, len(res.tokens)))


def burst(sock, n_clients, n_tokens):
    """Generated tokens/s of n_clients one-request clients started at once."""
    out = []
    ths = [threading.Thread(target=one_request, args=(sock, 1, n_tokens, out)) for _ in range(n_clients)]
    t0 = time.monotonic()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return sum(o[3] for o in out) / (time.monotonic() - t0)


def compare(a):
    med = statistics.median
    with tempfile.TemporaryDirectory() as tmp_new, tempfile.TemporaryDirectory() as tmp_old:
        new, sock_new = start_daemon(tmp_new, a.threads, a.build)
        old, sock_old = start_daemon(tmp_old, a.threads, a.compare)
        try:
            print(f"A/B: new {a.build}, old {a.compare}; {a.tokens} tokens, {a.threads} threads, "
                  f"{a.rounds} alternating rounds (medians)")
            for n in (1, 4, 16):
                r_new, r_old, ratio = [], [], []
                for i in range(a.rounds):
                    # alternate which goes first, so neither always follows the other
                    if i % 2:
                        o, nw = burst(sock_old, n, a.tokens), burst(sock_new, n, a.tokens)
                    else:
                        nw, o = burst(sock_new, n, a.tokens), burst(sock_old, n, a.tokens)
                    r_new.append(nw)
                    r_old.append(o)
                    ratio.append(nw / o)
                print(f"{n:2d} clients: new {med(r_new):6.1f} tok/s, old {med(r_old):6.1f} tok/s, "
                      f"ratio new/old {med(ratio):.2f} (range {min(ratio):.2f}..{max(ratio):.2f})")
        finally:
            for p in (new, old):
                p.terminate()
                p.wait(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--build", default="build")
    ap.add_argument("--compare", metavar="OLD_BUILD")
    a = ap.parse_args()
    if a.compare:
        return compare(a)

    lab_ttft, lab_tps = [], []
    for _ in range(a.rounds):
        r = json.loads(subprocess.run(
            [os.path.join(ROOT, a.build, "tools/turbokv-lab/turbokv-lab"), "generate", "--greedy", "--chat",
             "-p", PROMPT, "-n", str(a.tokens), "-t", str(a.threads), "--json"],
            check=True, capture_output=True, text=True).stdout)
        lab_ttft.append(r["prompt_tokens"] / r["prefill_tokens_per_s"] * 1000)
        lab_tps.append(r["decode_tokens_per_s"])

    with tempfile.TemporaryDirectory() as tmp:
        proc, sock = start_daemon(tmp, a.threads, a.build)
        try:
            ttft, tps = [], []
            for i in range(a.rounds):
                out = []
                one_request(sock, i + 1, a.tokens, out)
                t0, tf, t1, n = out[0]
                ttft.append((tf - t0) * 1000)
                tps.append((n - 1) / (t1 - tf))
            throughput = {}
            for n_clients in (1, 4, 16):
                runs = []
                for _ in range(max(1, a.rounds // 2)):
                    out = []
                    ths = [threading.Thread(target=one_request, args=(sock, 1, a.tokens, out))
                           for _ in range(n_clients)]
                    t0 = time.monotonic()
                    for t in ths:
                        t.start()
                    for t in ths:
                        t.join()
                    runs.append(sum(o[3] for o in out) / (time.monotonic() - t0))
                throughput[n_clients] = statistics.median(runs)
        finally:
            proc.terminate()
            proc.wait(30)

    med = statistics.median
    print(f"prompt: {PROMPT!r}, {a.tokens} tokens, {a.threads} threads, {a.rounds} rounds (medians)")
    print(f"time to first token: socket {med(ttft):.1f} ms, in-process prefill {med(lab_ttft):.1f} ms, "
          f"overhead {100 * (med(ttft) / med(lab_ttft) - 1):+.1f}%")
    print(f"decode: socket {med(tps):.1f} tok/s, in-process {med(lab_tps):.1f} tok/s, "
          f"ratio {med(tps) / med(lab_tps):.3f}")
    for n, t in throughput.items():
        print(f"throughput, {n:2d} concurrent clients: {t:.1f} generated tokens/s in total")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""session-bench.py: issue 7's numbers: a long session resumed from disk against recomputing its prefill.

Usage: bench/session-bench.py --daemon BUILD/daemon/turbokvd [--kv tq4] [--tokens 8000] [--runs 5]
                              [--threads N] [--json]

For each --kv type, in a temporary state directory:
  1. build: one raw-text request of about --tokens tokens (deterministic pseudo-text) in session
     "bench" with max_tokens 1: its prefill time is the cost of recomputing the session;
  2. save: SIGTERM; the daemon saves the session and logs the time ("saved session ... in T ms");
  3. resume, --runs times: restart the daemon, send a short continuation in the session
     (max_tokens 1) and take the time to first token (restore from disk + prefill of the new
     tokens; the daemon logs the restore time too); the session file is put back between runs
     so that every run resumes the same state;
  4. recompute, --runs-recompute times: the same full text plus continuation without a session
     (a fresh prefill of everything), time to first token.
Reports medians, the file size, and the size of the same KV as f16 (n_kv tokens x layers x
kv-heads x head_dim x 2 (K, V) x 2 bytes). Talks to the daemon with tests/integration/tkvwire.py.
"""
import argparse
import json
import os
import random
import re
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

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no what up out who them some "
         "could time other into more only its than then new these two may first any like now my such make over "
         "our even most after also did many before must through back years where much your way down should "
         "because long each just people state good very world still own see men work year between both life "
         "being under never day same another know while last might us great old off come since against go came "
         "right used take three river garden market engine window letter winter summer morning evening music "
         "island mountain village harbour lantern copper silver").split()


def pseudo_text(n_words, seed):
    rng = random.Random(seed)
    out, sentence = [], []
    for i in range(n_words):
        sentence.append(rng.choice(WORDS))
        if len(sentence) >= rng.randint(8, 18):
            s = " ".join(sentence)
            out.append(s[0].upper() + s[1:] + ".")
            sentence = []
    return " ".join(out) + "\n"


class Daemon:
    def __init__(self, daemon, tmp, kv, threads, ctx):
        self.sock = os.path.join(tmp, "turbokvd.sock")
        notify = os.path.join(tmp, "notify")
        if os.path.exists(notify):
            os.unlink(notify)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(notify)
        self.notify.settimeout(1)
        env = dict(os.environ, NOTIFY_SOCKET=notify)
        self.proc = subprocess.Popen([daemon, "--kv", kv, "--threads", str(threads), "--ctx", str(ctx),
                                      "--socket", self.sock, "--state-dir", os.path.join(tmp, "state"),
                                      "--session-memory", "16G"],
                                     env=env, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.reader = threading.Thread(target=self._drain, daemon=True)
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

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(600)
        self.reader.join(10)
        self.notify.close()
        assert rc == 0, "turbokvd exited with %d: %s" % (rc, "".join(self.log[-5:]))

    def logged_ms(self, what):
        """The time of the last 'saved session'/'restored session' log line, in ms."""
        for line in reversed(self.log):
            m = re.search(r"%s session '[^']*' \((\d+) tokens(?:, (\d+) bytes)?\) in ([0-9.]+) ms" % what, line)
            if m:
                return float(m.group(3)), int(m.group(1))
        raise AssertionError("no '%s' line in the log" % what)


def generate(d, rid, text, session=None):
    g = w.f_varint(1, rid) + w.f_bytes(3, text)
    g += w.f_bytes(5, w.f_varint(7, 42) + w.f_varint(8, 1))
    g += w.f_varint(6, 1)
    if session:
        g += w.f_bytes(8, session)
    c = w.Conn(d.sock, timeout=3600)
    c.hello()
    t0 = time.monotonic()
    c.send(w.f_bytes(2, g))
    res = w.collect(c, rid)
    wall = time.monotonic() - t0
    c.close()
    assert res.error is None, res.error
    done = res.done
    return dict(prompt=w.first(done, 3), cached=w.first(done, 4), prefill_ms=w.done_double(done, 7),
                ttft_ms=w.done_double(done, 9), wall_ms=wall * 1000)


def bench_kv(args, kv):
    tmp = tempfile.mkdtemp(prefix="tkv-sessbench-")
    try:
        text = pseudo_text(args.words, 7)
        cont = " And then, in the last line of the story, the river"
        d = Daemon(args.daemon, tmp, kv, args.threads, args.ctx)
        build = generate(d, 1, text, "bench")
        d.stop()
        save_ms, n_tokens = d.logged_ms("saved")
        path = os.path.join(tmp, "state", "sessions", str(os.getuid()), "bench.tkvs")
        size = os.path.getsize(path)
        keep = path + ".keep"
        shutil.copy(path, keep)

        resumes = []
        for i in range(args.runs):
            shutil.copy(keep, path)
            d = Daemon(args.daemon, tmp, kv, args.threads, args.ctx)
            r = generate(d, 1, cont, "bench")
            r["restore_ms"], _ = d.logged_ms("restored")
            d.stop()
            resumes.append(r)
        recomputes = []
        d = Daemon(args.daemon, tmp, kv, args.threads, args.ctx)
        for i in range(args.runs_recompute):
            recomputes.append(generate(d, 10 + i, text + cont))
        d.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    n_kv = build["prompt"]  # max_tokens 1: the prompt is in the cache, the one answer token is not
    f16 = n_kv * args.layers * args.kv_heads * args.head_dim * 2 * 2
    med = lambda xs: statistics.median(xs)  # noqa: E731
    out = dict(kv=kv, session_tokens=n_tokens, cached_tokens=med([r["cached"] for r in resumes]),
               build_prefill_ms=build["prefill_ms"],
               recompute_ttft_ms=med([r["ttft_ms"] for r in recomputes]),
               recompute_prompt_tokens=recomputes[0]["prompt"],
               resume_ttft_ms=med([r["ttft_ms"] for r in resumes]),
               resume_restore_ms=med([r["restore_ms"] for r in resumes]),
               resume_prefill_ms=med([r["prefill_ms"] for r in resumes]),
               save_ms=save_ms, file_bytes=size, f16_bytes=f16)
    out["speedup"] = out["recompute_ttft_ms"] / out["resume_ttft_ms"]
    out["smaller_than_f16"] = f16 / size
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--kv", action="append", help="KV types (default tq4)")
    ap.add_argument("--words", type=int, default=6300, help="words of text (about 1.25 tokens each)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--runs-recompute", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [bench_kv(args, kv) for kv in (args.kv or ["tq4"])]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| kv | session tokens | recompute TTFT ms | resume TTFT ms (restore ms) | speedup | save ms "
          "| file bytes | f16 bytes | f16 / file |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %d | %.0f | %.1f (%.1f) | %.0fx | %.1f | %d | %d | %.2fx |" % (
            r["kv"], r["session_tokens"], r["recompute_ttft_ms"], r["resume_ttft_ms"], r["resume_restore_ms"],
            r["speedup"], r["save_ms"], r["file_bytes"], r["f16_bytes"], r["smaller_than_f16"]))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""test-hostile.py: turbokvd against hostile and careless clients (issue 21).

Usage: test-hostile.py --daemon BUILD/daemon/turbokvd --lab BUILD/tools/turbokv-lab/turbokv-lab CASE

A real daemon on a real socket in a temporary directory, as test-daemon.py
starts it (its Daemon class and helpers are reused), driven by tkvwire.py.
Each case is one class of what a local client can do to the daemon: keep the
model busy while others need answers, smuggle NUL bytes, send signals, park
descriptors or connections, tamper with the state directory, and the small
ones. Every case ends with the daemon still serving (an honest client gets a
correct greedy answer where that matters) and exiting 0 on SIGTERM.
"""
import argparse
import importlib.util
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tkvwire as w  # noqa: E402

_spec = importlib.util.spec_from_file_location("test_daemon", os.path.join(HERE, "test-daemon.py"))
td = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(td)
Daemon, ask, check_answer, PROMPTS = td.Daemon, td.ask, td.check_answer, td.PROMPTS

# A raw prompt of a few thousand tokens: several prefill chunks of 512.
LONG_PROMPT = "The quick brown fox jumps over the lazy dog while the cat sleeps. " * 110


class Reader(threading.Thread):
    """Reads one connection to its end, recording (arrival time, kind, fields) of every message."""

    def __init__(self, conn):
        super().__init__(daemon=True)
        self.conn, self.msgs = conn, []
        self.start()

    def run(self):
        while True:
            try:
                m = self.conn.recv()
            except (OSError, AssertionError):
                m = None
            if m is None:
                return
            self.msgs.append((time.monotonic(),) + m)
            if m[0] in ("done", "error"):
                return

    def times(self, kind):
        return [t for t, k, _ in self.msgs if k == kind]


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError("timed out waiting for " + what)


def status_fields(conn, rid):
    conn.send(w.status(rid))
    while True:
        kind, f = conn.recv()
        if kind == "status_reply" and w.first(f, 1) == rid:
            return f


# ---------------------------------------------------------------- cases

def case_responsive(args, tmp):
    """A long prefill runs on the worker: a new client's Hello and Status are answered before its next chunk ends."""
    d = Daemon(args, tmp)
    d.wait_ready()
    a = w.Conn(d.sock)
    a.hello()
    a.send(w.generate(1, raw=LONG_PROMPT, max_tokens=2))
    ra = Reader(a)
    wait_for(lambda: ra.times("progress"), 120, "the first Progress")
    t_first = ra.times("progress")[0]
    # The second chunk runs now. A new client connects, says Hello and asks for Status.
    b = w.Conn(d.sock)
    t0 = time.monotonic()
    b.hello()
    f = status_fields(b, 7)
    t_status = time.monotonic()
    assert w.first(f, 11) == 1, "requests_active %r" % (f,)
    ra.join(300)
    progress = ra.times("progress")
    assert len(progress) >= 3, "the prompt should take several chunks: %d" % len(progress)
    assert ra.msgs[-1][1] == "done", ra.msgs[-1]
    chunk = progress[1] - progress[0]
    print("Hello+Status %.1f ms after connecting, a prefill chunk takes %.0f ms" %
          ((t_status - t0) * 1e3, chunk * 1e3))
    # Answered while the chunk after the first Progress was running, not after it.
    assert t_status < progress[1], "Status came %.0f ms after the chunk that was running ended" % (
        (t_status - progress[1]) * 1e3)
    assert t_first < t0
    b.close()
    # Cancel is answered mid-chunk too, and the request ends with Done(CANCELLED).
    a = w.Conn(d.sock)
    a.hello()
    a.send(w.generate(2, raw=LONG_PROMPT, max_tokens=2))
    ra = Reader(a)
    wait_for(lambda: ra.times("progress"), 120, "the first Progress")
    a.send(w.cancel(2))
    ra.join(120)
    kind, f = ra.msgs[-1][1:]
    assert kind == "done" and w.first(f, 2) == w.FINISH["CANCELLED"], ra.msgs[-1]
    # And an honest question still gets the golden answer.
    check_answer(args, ask(d, PROMPTS[0]), PROMPTS[0])
    a.close()
    d.stop()


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--lab", required=True)
    ap.add_argument("case", choices=sorted(CASES))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tkv-hostile-")
    try:
        rc = CASES[args.case](args, tmp)
    finally:
        for d in td.RUNNING:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())

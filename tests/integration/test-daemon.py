#!/usr/bin/env python3
"""test-daemon.py: turbokvd end to end: a real daemon on a real socket in a temporary directory.

Usage: test-daemon.py --daemon BUILD/daemon/turbokvd --lab BUILD/tools/turbokv-lab/turbokv-lab CASE

Each case starts its own daemon (readiness seen on a NOTIFY_SOCKET this script
binds), talks to it with tkvwire.py (an independent implementation of the wire
format), stops it with SIGTERM and requires exit status 0 (under ASan that also
means no leak). Greedy answers are compared with `turbokv-lab generate --greedy
--chat` for the same prompt: the golden output comes from the engine in-process.
The default model must be present (CI has it): a missing model fails.
"""
import argparse
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tkvwire as w  # noqa: E402

THREADS = "2"
PROMPTS = ["What is the capital of France?", "Name three colors."]
N_TOKENS = 12


RUNNING = []


class Daemon:
    def __init__(self, args, tmp, extra=(), activate=False):
        RUNNING.append(self)
        self.tmp = tmp
        self.sock = os.path.join(tmp, "run", "turbokvd.sock")
        self.notify_path = os.path.join(tmp, "notify")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.notify.settimeout(1)
        env = dict(os.environ, NOTIFY_SOCKET=self.notify_path, XDG_STATE_HOME=os.path.join(tmp, "state"))
        cmd = [args.daemon, "--threads", THREADS, "--state-dir", os.path.join(tmp, "state")]
        cmd += list(extra)
        if activate:
            os.makedirs(os.path.dirname(self.sock), exist_ok=True)
            sa = shutil.which("systemd-socket-activate")
            cmd = [sa, "-l", self.sock, "-E", "NOTIFY_SOCKET=" + self.notify_path] + \
                  (["-E", "TURBOKV_MODEL=" + os.environ["TURBOKV_MODEL"]] if "TURBOKV_MODEL" in os.environ else []) + \
                  (["-E", "ASAN_OPTIONS=" + os.environ["ASAN_OPTIONS"]] if "ASAN_OPTIONS" in os.environ else []) + \
                  (["-E", "UBSAN_OPTIONS=" + os.environ["UBSAN_OPTIONS"]] if "UBSAN_OPTIONS" in os.environ else []) + cmd
        else:
            cmd += ["--socket", self.sock]
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
        self.stderr = []
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()
        self.messages = []

    def _drain(self):
        for line in self.proc.stderr:
            self.stderr.append(line)
            sys.stderr.write("[turbokvd] " + line)

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("turbokvd exited with %d before READY=1" % self.proc.returncode)
            try:
                msg = self.notify.recv(4096).decode()
            except socket.timeout:
                continue
            self.messages.append(msg)
            if "READY=1" in msg.split("\n"):
                return
        raise AssertionError("no READY=1 within %d s" % timeout)

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self.reader.join(5)
        assert rc == 0, "turbokvd exited with %d" % rc
        return rc


_golden = {}


def golden(args, prompt, n=N_TOKENS):
    """Token ids turbokv-lab generates greedily for prompt as a chat user message."""
    if (prompt, n) not in _golden:
        out = subprocess.run([args.lab, "generate", "--greedy", "--chat", "-p", prompt, "-n", str(n), "--json",
                              "-t", THREADS], check=True, capture_output=True, text=True).stdout
        _golden[(prompt, n)] = json.loads(out)
    return _golden[(prompt, n)]


def ask(d, prompt, rid=1, n=N_TOKENS, conn=None):
    c = conn or w.Conn(d.sock)
    if conn is None:
        c.hello()
    c.send(w.generate(rid, user=prompt, max_tokens=n))
    res = w.collect(c, rid)
    if conn is None:
        c.close()
    return res


def check_answer(args, res, prompt, n=N_TOKENS):
    g = golden(args, prompt, n)
    assert res.error is None, "error %r" % (res.error,)
    assert res.tokens == g["tokens"], "daemon %r != lab %r" % (res.tokens, g["tokens"])
    assert res.text == g["text"].encode(), (res.text, g["text"])
    want = w.FINISH["LENGTH"] if g["finish_reason"] == "length" else w.FINISH["STOP"]
    assert w.first(res.done, 2) == want, res.done
    assert w.first(res.done, 3) == g["prompt_tokens"], res.done
    assert w.first(res.done, 5) == len(g["tokens"]), res.done


# ---------------------------------------------------------------- cases

def case_generate(args, tmp):
    """Hello, then a greedy chat answer equal to turbokv-lab's; status; stop strings; overflow; sessions."""
    d = Daemon(args, tmp, extra=["--ctx", "256"])
    d.wait_ready()
    assert os.stat(d.sock).st_mode & 0o777 == (0o660 if os.geteuid() == 0 else 0o600)
    c = w.Conn(d.sock)
    h = c.hello()
    assert w.first(h, 1) == 1 and w.first(h, 8) == 256 and w.first(h, 7) == b"f32", h
    t0 = time.monotonic()
    c.send(w.generate(1, user=PROMPTS[0], max_tokens=N_TOKENS))
    res = w.collect(c, 1)
    check_answer(args, res, PROMPTS[0])
    assert res.progress and res.progress[-1][0] == res.progress[-1][1] == w.first(res.done, 3), res.progress
    print("ttft through the socket: %.1f ms (client clock), %.1f ms (daemon's Done.ttft_ms), prefill %.1f ms" %
          ((res.t_first - t0) * 1e3, w.done_double(res.done, 9), w.done_double(res.done, 7)))

    # A stop string ends the answer before it; the stop string itself is not streamed.
    text = golden(args, PROMPTS[0])["text"].encode()
    stop = text[10:14]
    c.send(w.generate(2, user=PROMPTS[0], max_tokens=N_TOKENS, stops=[stop]))
    res = w.collect(c, 2)
    assert w.first(res.done, 2) == w.FINISH["STOP_STRING"], res.done
    assert res.text == text[:text.find(stop)], (res.text, text)

    # Status.
    c.send(w.status(3))
    kind, f = c.recv()
    assert kind == "status_reply" and w.first(f, 1) == 3 and w.first(f, 10) == 1, (kind, f)
    assert w.first(f, 17) >= N_TOKENS, f

    # Too long a prompt: CONTEXT_OVERFLOW, never truncated.
    c.send(w.generate(4, user="hello " * 400, max_tokens=4))
    res = w.collect(c, 4)
    assert res.error and res.error[0] == w.E["CONTEXT_OVERFLOW"], res.error
    c.send(w.generate(5, user="hi", max_tokens=1000))
    res = w.collect(c, 5)
    assert res.error and res.error[0] == w.E["CONTEXT_OVERFLOW"], res.error
    # Sessions are not implemented yet: SESSION_NOT_FOUND, and the connection goes on.
    c.send(w.generate(6, user="hi", session="notes"))
    res = w.collect(c, 6)
    assert res.error and res.error[0] == w.E["SESSION_NOT_FOUND"], res.error
    c.send(w.status(7))
    assert c.recv()[0] == "status_reply"
    c.close()
    d.stop()
    assert not os.path.exists(d.sock), "socket file left behind"


def case_concurrent(args, tmp):
    """Many clients at once, two different prompts: every one gets exactly the lab's answer."""
    d = Daemon(args, tmp)
    d.wait_ready()
    n = int(os.environ.get("TKV_CLIENTS", "20"))
    for p in PROMPTS:
        golden(args, p)
    conns = []
    for i in range(n):
        c = w.Conn(d.sock)
        c.hello()
        c.send(w.generate(100 + i, user=PROMPTS[i % 2], max_tokens=N_TOKENS))
        conns.append(c)
    results = [None] * n

    def run(i):
        results[i] = w.collect(conns[i], 100 + i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for i in range(n):
        check_answer(args, results[i], PROMPTS[i % 2])
    # Interleaved: each client's first token came before the last client's Done (no client waited for all).
    firsts = sorted(r.t_first for r in results)
    assert firsts[-1] < max(r.t_first for r in results) + 1e-9
    for c in conns:
        c.close()
    d.stop()


def case_cancel(args, tmp):
    """Cancel ends a request with Done(CANCELLED) and frees its slot; a vanished client does not disturb others."""
    d = Daemon(args, tmp)
    d.wait_ready()
    c = w.Conn(d.sock)
    c.hello()
    # Fill all 8 slots of this connection; a 9th is refused.
    for rid in range(1, 9):
        c.send(w.generate(rid, user=PROMPTS[0], max_tokens=500))
    c.send(w.generate(9, user=PROMPTS[0], max_tokens=4))
    results = {}
    res9 = w.collect(c, 9, results)
    assert res9.error and res9.error[0] == w.E["TOO_MANY_REQUESTS"], res9.error
    c.send(w.generate(1, user=PROMPTS[0], max_tokens=4))  # id 1 is in flight: REQUEST_ID_IN_USE
    # Cancel all eight; each ends with Done(CANCELLED) (or Error CANCELLED if it never started).
    for rid in range(1, 9):
        c.send(w.cancel(rid))
    # the duplicate id 1 sent above was refused with REQUEST_ID_IN_USE
    ended = set()
    dup_refused = False
    while len(ended) < 8:
        kind, f = c.recv()
        rid = w.first(f, 1)
        if kind == "done":
            assert w.first(f, 2) in (w.FINISH["CANCELLED"], w.FINISH["LENGTH"], w.FINISH["STOP"]), f
            ended.add(rid)
        elif kind == "error":
            code = w.first(f, 2)
            if code == w.E["REQUEST_ID_IN_USE"] and rid == 1 and not dup_refused:
                dup_refused = True
            elif code == w.E["UNKNOWN_REQUEST"]:
                pass
            else:
                assert code == w.E["CANCELLED"], f
                ended.add(rid)
    assert dup_refused
    # Slots are free again: a new request runs to the right answer on the same connection.
    res = ask(d, PROMPTS[1], rid=20, conn=c)
    check_answer(args, res, PROMPTS[1])
    c.send(w.status(21))
    while True:
        kind, f = c.recv()
        if kind == "status_reply":
            break
    assert w.first(f, 11) == 0 and w.first(f, 12) == 0, f

    # A client that disconnects mid-stream: the other two are not disturbed.
    a, b, e = w.Conn(d.sock), w.Conn(d.sock), w.Conn(d.sock)
    for x in (a, b, e):
        x.hello()
    a.send(w.generate(1, user=PROMPTS[0], max_tokens=200))
    b.send(w.generate(1, user=PROMPTS[0], max_tokens=N_TOKENS))
    e.send(w.generate(1, user=PROMPTS[1], max_tokens=N_TOKENS))
    w.collect(a, 1, stop_after=2)
    a.close()
    check_answer(args, w.collect(b, 1), PROMPTS[0])
    check_answer(args, w.collect(e, 1), PROMPTS[1])
    c.send(w.status(22))
    kind, f = c.recv()
    assert kind == "status_reply" and w.first(f, 10) == 3 and w.first(f, 11) == 0, (kind, f)
    for x in (b, e, c):
        x.close()
    d.stop()


def expect_conn_error(d, data, code, payload=True):
    """Send data on a fresh connection; expect Error{request_id 0, code} (or at least a close) and EOF."""
    c = w.Conn(d.sock, timeout=60)
    if payload:
        c.send(data)
    else:
        c.send_raw(data)
    m = c.recv()
    if code is not None:
        assert m is not None and m[0] == "error", m
        assert w.first(m[1], 1) == 0 and w.first(m[1], 2) == code, m
        m = c.recv()
    assert m is None, "connection not closed: %r" % (m,)
    c.close()


def case_bad_input(args, tmp):
    """Malformed frames, absurd lengths, wrong version, random bytes: error or disconnect; others keep being served."""
    d = Daemon(args, tmp)
    d.wait_ready()
    good = w.Conn(d.sock)
    good.hello()
    good.send(w.generate(1, user=PROMPTS[0], max_tokens=N_TOKENS))
    results = {}
    w.collect(good, 1, results, stop_after=1)

    expect_conn_error(d, w.hello(version=99), w.E["UNSUPPORTED_VERSION"])
    expect_conn_error(d, w.status(1), w.E["HELLO_REQUIRED"])
    expect_conn_error(d, b"\xff\xff\xff\xff" + b"x" * 16, w.E["BAD_FRAME"], payload=False)
    expect_conn_error(d, b"\x07\x08\x09garbage-not-protobuf", w.E["BAD_FRAME"])
    expect_conn_error(d, w.f_bytes(2, b"\x08"), w.E["BAD_FRAME"])  # a Generate cut inside a varint
    rnd = __import__("random").Random(1234)
    for i in range(20):
        c = w.Conn(d.sock, timeout=60)
        c.send_raw(bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 200))))
        c.sock.shutdown(socket.SHUT_WR)
        while c.recv() is not None:
            pass
        c.close()
    # Truncated frame, then hang up.
    c = w.Conn(d.sock)
    c.send_raw(w.frame(w.hello())[:5])
    c.close()
    # A request with id 0 after Hello: connection-level BAD_MESSAGE.
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.status(0))
    m = c.recv()
    assert m[0] == "error" and w.first(m[1], 2) == w.E["BAD_MESSAGE"], m
    assert c.recv() is None
    c.close()
    # A second Hello.
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.hello())
    m = c.recv()
    assert m[0] == "error" and w.first(m[1], 2) == w.E["HELLO_REQUIRED"], m
    c.close()

    res = w.collect(good, 1, results)
    check_answer(args, res, PROMPTS[0])
    check_answer(args, ask(d, PROMPTS[1]), PROMPTS[1])
    good.close()
    d.stop()


ATTACH_TEXT = "The secret word is PINEAPPLE. Remember it.\nÜnïcödé survives too."
ATTACH_Q = "What is the secret word?"


def case_attach(args, tmp):
    """A sealed memfd is read (the answer equals the lab's for the documented layout); bad descriptors are refused."""
    d = Daemon(args, tmp)
    d.wait_ready()
    c = w.Conn(d.sock)
    c.hello()
    data = ATTACH_TEXT.encode()
    fd = w.memfd_with(data)
    c.send(w.generate(1, user=ATTACH_Q, max_tokens=N_TOKENS, attachments=[("note.txt", 0, len(data))]), [fd])
    os.close(fd)
    res = w.collect(c, 1)
    # request.h: attachments go before the last user message as <attachment name="...">\nTEXT\n</attachment>\n\n
    expected_prompt = '<attachment name="note.txt">\n' + ATTACH_TEXT + "\n</attachment>\n\n" + ATTACH_Q
    check_answer(args, res, expected_prompt)

    def refused(rid, fd, size, code):
        c.send(w.generate(rid, user=ATTACH_Q, max_tokens=2, attachments=[("x", 0, size)]), [fd])
        os.close(fd)
        r = w.collect(c, rid)
        assert r.error and r.error[0] == w.E[code], (code, r.error)

    refused(2, w.memfd_with(data, seal=False), len(data), "ATTACHMENT_NOT_SEALED")
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        refused(3, os.dup(f.fileno()), len(data), "ATTACHMENT_NOT_MEMFD")
    rp, wp = os.pipe()
    os.close(wp)
    refused(4, rp, 0, "ATTACHMENT_NOT_MEMFD")
    refused(5, w.memfd_with(data), len(data) + 1, "ATTACHMENT_SIZE_MISMATCH")
    refused(6, w.memfd_with(b"bad \xff\xfe bytes"), 11, "ATTACHMENT_NOT_UTF8")
    big = os.memfd_create("big", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(big, 64 * 1024 * 1024 + 1)
    fcntl.fcntl(big, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
    refused(7, big, 10, "ATTACHMENT_TOO_LARGE")
    # Declared too large: refused by validation before the memfd is looked at.
    refused(8, w.memfd_with(data), 1 << 40, "ATTACHMENT_TOO_LARGE")
    # A descriptor the message does not claim: the peer broke the framing rule and is dropped
    # (ipc/fdpass.h: a stray descriptor is noticed at the next frame).
    fd = w.memfd_with(data)
    c.send(w.status(9), [fd])
    os.close(fd)
    assert c.recv()[0] == "status_reply"
    c.send(w.status(10))
    m = c.recv()
    assert m is not None and m[0] == "error" and w.first(m[1], 2) == w.E["BAD_MESSAGE"], m
    assert c.recv() is None
    c.close()
    check_answer(args, ask(d, PROMPTS[0]), PROMPTS[0])
    d.stop()


def case_sigterm(args, tmp):
    """SIGTERM mid-generation: Done(CANCELLED) or Error(SHUTTING_DOWN) to everyone, exit 0, socket removed."""
    d = Daemon(args, tmp)
    d.wait_ready()
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.generate(1, user=PROMPTS[0], max_tokens=500))
    w.collect(c, 1, stop_after=1)
    d.proc.send_signal(signal.SIGTERM)
    res = w.collect(c, 1)
    assert (res.done and w.first(res.done, 2) == w.FINISH["CANCELLED"]) or \
        (res.error and res.error[0] == w.E["SHUTTING_DOWN"]), (res.done, res.error)
    assert c.recv() is None
    d.stop()
    d.notify.settimeout(0.2)
    try:
        while True:
            d.messages.append(d.notify.recv(4096).decode())
    except socket.timeout:
        pass
    assert any("STOPPING=1" in m.split("\n") for m in d.messages), d.messages
    assert not os.path.exists(d.sock)


def case_config(args, tmp):
    """Bad settings are refused with a clear message and exit status 2; a config file is read."""
    def run(*a, env=None):
        return subprocess.run([args.daemon] + list(a), capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, **(env or {})))
    for bad, word in ((["--threads", "0"], "--threads"), (["--ctx", "abc"], "--ctx"),
                      (["--kv", "bogus"], "--kv"), (["--device", "tpu"], "--device"),
                      (["--session-memory", "12Q"], "--session-memory"), (["--frobnicate"], "--frobnicate")):
        p = run(*bad)
        assert p.returncode == 2 and word in p.stderr, (bad, p.returncode, p.stderr)
    p = run(env={"TURBOKV_THREADS": "-3"})
    assert p.returncode == 2 and "TURBOKV_THREADS" in p.stderr, p.stderr
    conf = os.path.join(tmp, "turbokvd.conf")
    with open(conf, "w") as f:
        f.write("# test\nthreads = 2\nctx = nope\n")
    p = run("--config", conf)
    assert p.returncode == 2 and "turbokvd.conf:3" in p.stderr, p.stderr
    p = run("--device", "cuda", "--socket", os.path.join(tmp, "s"))
    assert p.returncode == 1 and "not built yet" in p.stderr, p.stderr
    # A config file's values are used (ctx shows in HelloReply), flags win over it.
    with open(conf, "w") as f:
        f.write("ctx = 512\nthreads = 1\n")
    d = Daemon(args, tmp, extra=["--config", conf])
    d.wait_ready()
    c = w.Conn(d.sock)
    h = c.hello()
    assert w.first(h, 8) == 512 and w.first(h, 9) == 2, h
    c.close()
    d.stop()


def case_activate(args, tmp):
    """Socket activation through systemd-socket-activate; READY=1 on our NOTIFY_SOCKET."""
    if not shutil.which("systemd-socket-activate"):
        print("systemd-socket-activate not installed: skipping")
        return 77
    d = Daemon(args, tmp, activate=True)
    time.sleep(0.5)  # systemd-socket-activate starts the daemon on the first connection
    deadline = time.monotonic() + 30
    while not os.path.exists(d.sock):
        assert time.monotonic() < deadline, "systemd-socket-activate did not create the socket"
        time.sleep(0.1)
    c = w.Conn(d.sock)
    c.send(w.hello())
    d.wait_ready()
    kind, f = c.recv()
    assert kind == "hello_reply", (kind, f)
    res = ask(d, PROMPTS[0], conn=c)
    check_answer(args, res, PROMPTS[0])
    c.close()
    d.stop()
    assert os.path.exists(d.sock) or True  # the socket belongs to the activator, not the daemon


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--lab", required=True)
    ap.add_argument("case", choices=sorted(CASES))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tkv-it-")
    try:
        rc = CASES[args.case](args, tmp)
    finally:
        for d in RUNNING:
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())

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
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import tkvwire as w  # noqa: E402

THREADS = "2"
PROMPTS = ["What is the capital of France?", "Name three colors."]
N_TOKENS = 12


# The daemon's default KV type (engine/kv/kvtype.h KV_DEFAULT_SPEC): golden answers use the same cache.
DEFAULT_KV = "pk5:tq3.5_nc"


class Daemon(h.Notified):
    """turbokvd with its socket and state under tmp; activate: started by
    systemd-socket-activate on the socket. stderr: as harness.Notified."""

    def __init__(self, args, tmp, extra=(), activate=False, env=None, stderr=None):
        self.tmp = tmp
        self.sock = os.path.join(tmp, "run", "turbokvd.sock")
        notify_path = os.path.join(tmp, "notify")
        cmd = [args.daemon, "--threads", THREADS, "--state-dir", os.path.join(tmp, "state")]
        cmd += list(extra)
        if activate:
            os.makedirs(os.path.dirname(self.sock), exist_ok=True)
            sa = shutil.which("systemd-socket-activate")
            cmd = [sa, "-l", self.sock, "-E", "NOTIFY_SOCKET=" + notify_path] + \
                  [a for k in ("TURBOKV_MODEL", "ASAN_OPTIONS", "UBSAN_OPTIONS") if k in os.environ
                   for a in ("-E", k + "=" + os.environ[k])] + cmd
        else:
            cmd += ["--socket", self.sock]
        full_env = {"XDG_STATE_HOME": os.path.join(tmp, "state")}
        full_env.update(env or {})
        super().__init__("turbokvd", cmd, tmp, env=full_env, notify_name="notify", stderr=stderr)


_golden = {}


def have_gpu():
    """Whether an NVIDIA GPU answers here (then --device cuda may well start)."""
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def golden(args, prompt, n=N_TOKENS):
    """Token ids turbokv-lab generates greedily for prompt as a chat user message."""
    if (prompt, n) not in _golden:
        out = subprocess.run([args.lab, "generate", "--greedy", "--chat", "-p", prompt, "-n", str(n), "--json",
                              "-t", THREADS, "--kv", DEFAULT_KV], check=True, capture_output=True, text=True).stdout
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
    assert w.first(h, 1) == 1 and w.first(h, 8) == 256 and w.first(h, 7) == DEFAULT_KV.encode(), h
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
    assert w.first(f, 17) >= len(golden(args, PROMPTS[0])["tokens"]), f  # tokens generated so far

    # Too long a prompt: CONTEXT_OVERFLOW, never truncated.
    c.send(w.generate(4, user="hello " * 400, max_tokens=4))
    res = w.collect(c, 4)
    assert res.error and res.error[0] == w.E["CONTEXT_OVERFLOW"], res.error
    c.send(w.generate(5, user="hi", max_tokens=1000))
    res = w.collect(c, 5)
    assert res.error and res.error[0] == w.E["CONTEXT_OVERFLOW"], res.error
    # A new session: answered like a one-off request, nothing cached yet (the session_* cases test more).
    c.send(w.generate(6, user="hi", session="notes", max_tokens=2))
    res = w.collect(c, 6)
    assert res.error is None and w.first(res.done, 4) == 0, (res.error, res.done)
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
                      (["--session-memory", "12Q"], "--session-memory"), (["--frobnicate"], "--frobnicate"),
                      (["--client-buffer", "1K"], "--client-buffer"), (["--client-buffer", "1G"], "--client-buffer")):
        p = run(*bad)
        assert p.returncode == 2 and word in p.stderr, (bad, p.returncode, p.stderr)
    p = run(env={"TURBOKV_THREADS": "-3"})
    assert p.returncode == 2 and "TURBOKV_THREADS" in p.stderr, p.stderr
    conf = os.path.join(tmp, "turbokvd.conf")
    with open(conf, "w") as f:
        f.write("# test\nthreads = 2\nctx = nope\n")
    p = run("--config", conf)
    assert p.returncode == 2 and "turbokvd.conf:3" in p.stderr, p.stderr
    if not have_gpu():
        # no GPU here (or a build without CUDA): a clear refusal, not a crash or a silent CPU run
        p = run("--device", "cuda", "--socket", os.path.join(tmp, "s"))
        assert p.returncode == 1 and "--device cuda:" in p.stderr, p.stderr
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
    # A preset runs, and is reported, as the spec it stands for (engine/kv/kvtype.h).
    sub = os.path.join(tmp, "preset")
    os.mkdir(sub)
    d = Daemon(args, sub, extra=["--config", conf, "--kv", "small", "--device", "cpu"])
    d.wait_ready()
    c = w.Conn(d.sock)
    h = c.hello()
    assert w.first(h, 7, b"") == b"pk2.25:tq2.5_nc", h
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


SO_TIMESTAMP = getattr(socket, "SO_TIMESTAMP", 29)  # Linux asm-generic value; Python does not export it


def notifications(d, seconds):
    """(arrival time, message) of everything d sends to NOTIFY_SOCKET within seconds.

    Arrival times are the kernel's (SO_TIMESTAMP), so a late read by this
    script does not look like a late ping."""
    out = []
    deadline = time.monotonic() + seconds
    d.notify.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
    d.notify.settimeout(0.1)
    while time.monotonic() < deadline:
        try:
            data, anc, _, _ = d.notify.recvmsg(4096, socket.CMSG_SPACE(16))
        except socket.timeout:
            continue
        t = time.time()
        for level, kind, val in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMP:
                sec, usec = struct.unpack("@ll", val[:16])
                t = sec + usec / 1e6
        out.append((t, data.decode()))
    d.notify.settimeout(1)
    return out


def case_watchdog(args, tmp):
    """WATCHDOG_USEC set: WATCHDOG=1 keeps coming on NOTIFY_SOCKET, idle and while generating; unset: never."""
    usec = 4000000  # sd-event pings every 3/4 of it when idle; a round may hold the loop for a while under ASan
    d = Daemon(args, tmp, env={"WATCHDOG_USEC": str(usec)})
    d.wait_ready()
    idle = [t for t, m in notifications(d, 7) if "WATCHDOG=1" in m.split("\n")]
    assert len(idle) >= 2, "WATCHDOG=1 %d times in 7 s idle (WatchdogSec=4s)" % len(idle)

    # While the model is busy: pings still come between scheduler rounds.
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.generate(1, user=PROMPTS[0], max_tokens=40))
    got = {}

    def reader():
        got["res"] = w.collect(c, 1)
    t = threading.Thread(target=reader)
    t.start()
    busy = []
    while t.is_alive():
        busy += [tm for tm, m in notifications(d, 0.5) if "WATCHDOG=1" in m.split("\n")]
    t.join()
    check_answer(args, got["res"], PROMPTS[0], 40)
    pings = idle + busy
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    print("WATCHDOG=1: %d pings, longest gap %.2f s (limit %.2f s)" % (len(pings), max(gaps), usec / 1e6))
    assert max(gaps) < usec / 1e6, gaps
    c.close()
    d.stop()

    # No WATCHDOG_USEC: no pings.
    tmp2 = os.path.join(tmp, "plain")
    os.makedirs(tmp2)
    d = Daemon(args, tmp2, env={"WATCHDOG_USEC": None})
    d.wait_ready()
    assert not any("WATCHDOG=1" in m for _, m in notifications(d, 1.5))
    d.stop()


def status_of(c, rid):
    """A StatusReply's fields, skipping anything else the connection receives first."""
    c.send(w.status(rid))
    while True:
        kind, f = c.recv()
        if kind == "status_reply" and w.first(f, 1) == rid:
            return f


COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,"


def case_slow_reader(args, tmp):
    """A client that never reads is paused after --client-buffer; others are served; nothing is lost."""
    d = Daemon(args, tmp, extra=["--client-buffer", "4K", "--ctx", "1024"])
    d.wait_ready()
    slow = w.Conn(d.sock)
    slow.hello()
    n = 600
    slow.send(w.generate(1, raw=COUNTING.encode(), max_tokens=n))
    # It is not reading: the daemon generates until the buffers fill, then pauses it.
    probe = w.Conn(d.sock)
    probe.hello()
    last, rid, deadline = -1, 10, time.monotonic() + 120
    while True:
        time.sleep(1.0)
        rid += 1
        f = status_of(probe, rid)
        gen = w.first(f, 17)
        # a slow machine (ASan in CI) may not have its first token after a
        # second: only a count that has started and then stopped is a pause
        if gen == last and gen > 0:
            break
        assert time.monotonic() < deadline, "the slow client's request never paused (%d tokens)" % gen
        last = gen
    assert 0 < gen < n, "paused after %d of %d tokens" % (gen, n)
    assert w.first(f, 11) == 1, f  # still active: paused, not dropped
    queued = fcntl.ioctl(slow.sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    queued = int.from_bytes(queued, sys.byteorder)
    print("paused after %d tokens; %d bytes wait in the slow client's socket" % (gen, queued))
    assert queued < 256 * 1024, queued

    # Everyone else is served meanwhile, with the right answer.
    check_answer(args, ask(d, PROMPTS[0]), PROMPTS[0])
    check_answer(args, ask(d, PROMPTS[1]), PROMPTS[1])
    rid += 1
    f = status_of(probe, rid)
    others = sum(len(golden(args, p)["tokens"]) for p in PROMPTS)
    assert w.first(f, 17) == gen + others, (w.first(f, 17), gen, others)  # the slow one made no progress

    # The slow client reads at last: its request resumes and every token arrives, in order.
    res = w.collect(slow, 1)
    assert res.error is None, res.error
    assert w.first(res.done, 5) == len(res.tokens), (w.first(res.done, 5), len(res.tokens))
    assert w.first(res.done, 2) in (w.FINISH["LENGTH"], w.FINISH["STOP"]), res.done
    if w.first(res.done, 2) == w.FINISH["LENGTH"]:
        assert len(res.tokens) == n
    assert len(res.tokens) > gen
    for c in (slow, probe):
        c.close()
    d.stop()


# ---------------------------------------------------------------- sessions (issue 7)

SESS_KV = ["--kv", "tq4"]
SESS_SEED = 1234
TURNS = ["My name is Ada and I like green tea. Say hello.", "What is my name and what do I like?"]


def crc32c(data):
    """CRC-32C written out here (bitwise), independent of engine/crc32c.c."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def sess_generate(rid, text, session, n=N_TOKENS, seed=SESS_SEED):
    """Generate with greedy sampling and a fixed seed (the KV codecs' seeds derive from it)."""
    g = w.f_varint(1, rid) + w.f_bytes(2, w.f_bytes(1, w.f_varint(1, 2) + w.f_bytes(2, text)))
    g += w.f_bytes(5, w.f_varint(7, seed) + w.f_varint(8, 1))
    g += w.f_varint(6, n) + w.f_bytes(8, session)
    return w.f_bytes(2, g)


def sess_turn(d, session, text, rid=1, n=N_TOKENS):
    c = w.Conn(d.sock)
    c.hello()
    c.send(sess_generate(rid, text, session, n))
    res = w.collect(c, rid)
    c.close()
    return res


def sess_ok(res):
    assert res.error is None, "error %r" % (res.error,)
    return res


def sess_request(d, payload_field, body, rid):
    """Send SessionList (5) / SessionShow (6) / SessionDelete (7) / SessionSave (8); returns (kind, fields)."""
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.f_bytes(payload_field, w.f_varint(1, rid) + body))
    m = c.recv()
    c.close()
    return m


def sess_list(d, rid=7):
    kind, f = sess_request(d, 5, b"", rid)
    assert kind == "session_list_reply", (kind, f)
    out = {}
    for raw in f.get(2, []):
        info = w.decode(raw)
        out[w.first(info, 2, b"").decode()] = dict(tokens=w.first(info, 3), bytes=w.first(info, 4),
                                                   last_used=w.first(info, 5), in_memory=w.first(info, 6))
    return out


def sess_dir(tmp, uid=0):
    return os.path.join(tmp, "state", "sessions", str(uid))


def sess_sections(data):
    """(name, start, end) of the header and each section of a session file, from its own lengths."""
    out = [("header", 0, 64)]
    pos, names = 64, ["KV", "TOKENS", "MESSAGES"]
    i = 0
    while pos < len(data):
        n = int.from_bytes(data[pos + 8:pos + 16], "little")
        out.append((names[i] if i < 3 else "LAYER %d" % (i - 3), pos, pos + 16 + n + 4))
        pos += 16 + n + 4
        i += 1
    assert pos == len(data)
    return out


def sess_daemon(args, tmp, extra=SESS_KV, env=None):
    """A daemon on tmp (again: a restart reuses its state directory), ready."""
    try:
        os.unlink(os.path.join(tmp, "notify"))
    except FileNotFoundError:
        pass
    d = Daemon(args, tmp, extra=extra, env=env)
    d.wait_ready()
    return d


def sess_reference(args, tmp):
    """Both turns in one daemon, no restart: the tokens of turn 2 every other run must equal."""
    os.makedirs(os.path.join(tmp, "ref"), exist_ok=True)
    d = sess_daemon(args, os.path.join(tmp, "ref"), extra=SESS_KV)
    r1 = sess_ok(sess_turn(d, "ref", TURNS[0]))
    r2 = sess_ok(sess_turn(d, "ref", TURNS[1]))
    assert w.first(r2.done, 4) > w.first(r1.done, 3), ("turn 2 reused too little", r1.done, r2.done)
    # the reused prefix is right: a one-off request with the whole history gives the same prompt and answer
    g = w.f_varint(1, 3)
    msgs = [(2, TURNS[0]), (3, r1.text), (2, TURNS[1])]
    g += w.f_bytes(2, b"".join(w.f_bytes(1, w.f_varint(1, role) + w.f_bytes(2, t)) for role, t in msgs))
    g += w.f_bytes(5, w.f_varint(7, SESS_SEED) + w.f_varint(8, 1)) + w.f_varint(6, N_TOKENS)
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.f_bytes(2, g))
    full = sess_ok(w.collect(c, 3))
    c.close()
    assert w.first(full.done, 3) == w.first(r2.done, 3), (full.done, r2.done)
    assert full.tokens == r2.tokens, ("session turn 2 != the whole history sent at once", r2.tokens, full.tokens)
    d.stop()
    return r1.tokens, r2.tokens


def case_session_restart(args, tmp):
    """SIGTERM, restart, continue: turn 2 is token-for-token the uninterrupted one, prefix from disk."""
    t1, t2 = sess_reference(args, tmp)
    d = sess_daemon(args, tmp, extra=SESS_KV)
    r1 = sess_ok(sess_turn(d, "chat", TURNS[0]))
    assert r1.tokens == t1
    d.stop()  # SIGTERM: saved on shutdown
    path = os.path.join(sess_dir(tmp), "chat.tkvs")
    st = os.stat(path)
    assert st.st_mode & 0o777 == 0o600, oct(st.st_mode)
    assert os.stat(sess_dir(tmp)).st_mode & 0o777 == 0o700
    assert os.stat(os.path.dirname(sess_dir(tmp))).st_mode & 0o777 == 0o700
    d = sess_daemon(args, tmp, extra=SESS_KV)
    lst = sess_list(d)
    assert "chat" in lst and lst["chat"]["bytes"] == st.st_size and not lst["chat"]["in_memory"], lst
    r2 = sess_ok(sess_turn(d, "chat", TURNS[1]))
    assert r2.tokens == t2, ("after restart", r2.tokens, t2)
    prompt, cached = w.first(r2.done, 3), w.first(r2.done, 4)
    assert cached >= w.first(r1.done, 3), ("the restored prefix was not reused", r2.done)
    print("restart: turn 2 identical; %d of %d prompt tokens from the restored cache" % (cached, prompt))
    # show and delete
    kind, f = sess_request(d, 6, w.f_bytes(2, "chat"), 8)
    assert kind == "session_info" and w.first(f, 3) > lst["chat"]["tokens"] and w.first(f, 6), (kind, f)
    # explicit save (SessionSave, field 8): the file holds turn 2 when the reply arrives, before any idle save
    assert os.stat(path).st_size == st.st_size
    kind, f = sess_request(d, 8, w.f_bytes(2, "chat"), 11)
    assert kind == "session_info" and w.first(f, 4) == os.stat(path).st_size > st.st_size, (kind, f)
    kind, f = sess_request(d, 8, w.f_bytes(2, "nope"), 12)
    assert kind == "error" and w.first(f, 2) == w.E["SESSION_NOT_FOUND"], (kind, f)
    kind, f = sess_request(d, 7, w.f_bytes(2, "chat"), 9)
    assert kind == "session_deleted", (kind, f)
    assert not os.path.exists(path)
    kind, f = sess_request(d, 6, w.f_bytes(2, "chat"), 10)
    assert kind == "error" and w.first(f, 2) == w.E["SESSION_NOT_FOUND"], (kind, f)
    d.stop()
    return 0


def case_session_kill(args, tmp):
    """SIGKILL in the middle of a save: the previous version loads and the continuation is identical."""
    t1, t2 = sess_reference(args, tmp)
    env = {"TURBOKV_SESSION_IDLE_SAVE_MS": "100", "TURBOKV_TEST_SESSION_SAVE_PAUSE_MS": "1500"}
    d = sess_daemon(args, tmp, extra=SESS_KV, env=env)
    path = os.path.join(sess_dir(tmp), "k.tkvs")
    sess_ok(sess_turn(d, "k", TURNS[0]))
    deadline = time.monotonic() + 30
    while not os.path.exists(path) or os.path.exists(path + ".tmp"):  # the first save, paused, completes
        assert time.monotonic() < deadline, "no save when idle"
        time.sleep(0.05)
    v1 = open(path, "rb").read()
    r = sess_ok(sess_turn(d, "k", TURNS[1]))
    assert r.tokens == t2
    deadline = time.monotonic() + 30
    while not os.path.exists(path + ".tmp"):  # the second save has started and sleeps inside
        assert time.monotonic() < deadline, "no second save"
        time.sleep(0.02)
    d.proc.kill()
    d.proc.wait()
    assert open(path, "rb").read() == v1, "the file changed under a save that did not finish"
    d = sess_daemon(args, tmp, extra=SESS_KV)
    r2 = sess_ok(sess_turn(d, "k", TURNS[1]))
    assert r2.tokens == t2, ("after SIGKILL", r2.tokens, t2)
    assert w.first(r2.done, 4) > 0, r2.done
    assert not os.path.exists(path + ".tmp"), "the unfinished save was not cleaned up"
    d.stop()
    return 0


def case_session_corrupt(args, tmp):
    """Each section damaged in turn (and another model): SESSION_CORRUPT, quarantined. Another KV type
    is not damage: the conversation goes on, its prompt computed again."""
    d = sess_daemon(args, tmp, extra=SESS_KV)
    sess_ok(sess_turn(d, "good", TURNS[0]))
    d.stop()
    sdir = sess_dir(tmp)
    good = open(os.path.join(sdir, "good.tkvs"), "rb").read()
    secs = sess_sections(good)
    want = {"header": "bad header", "KV": "bad KV section", "TOKENS": "bad TOKENS section",
            "MESSAGES": "bad MESSAGES section"}
    cases = {}
    for name, start, end in secs:
        if name.startswith("LAYER") and name not in ("LAYER 0", "LAYER 29"):
            continue
        bad = bytearray(good)
        bad[(start + end) // 2] ^= 0x10  # inside the payload (the header: inside its CRC-covered fields)
        key = "c-" + name.replace(" ", "")
        cases[key] = (bytes(bad), want.get(name, "bad LAYER section"))
    bad = bytearray(good)
    bad[0] ^= 1
    cases["c-magic"] = (bytes(bad), "bad magic")
    bad = bytearray(good)
    bad[8] = 9
    cases["c-version"] = (bytes(bad), "unsupported version")
    bad = bytearray(good)
    bad[16] ^= 0xFF  # another model's fingerprint, with a valid header checksum
    bad[60:64] = crc32c(bytes(bad[:60])).to_bytes(4, "little")
    cases["c-model"] = (bytes(bad), "other model")
    cases["c-trunc"] = (good[:len(good) // 2], "truncated")
    for key, (data, _) in cases.items():
        with open(os.path.join(sdir, key + ".tkvs"), "wb") as f:
            f.write(data)
    shutil.copy(os.path.join(sdir, "good.tkvs"), os.path.join(sdir, "kv.tkvs"))

    d = sess_daemon(args, tmp, extra=SESS_KV)
    for key, (data, what) in cases.items():
        res = sess_turn(d, key, TURNS[1])
        assert res.error is not None and res.error[0] == 17, (key, res.error, res.done)
        assert what in res.error[1], (key, what, res.error)
        assert not os.path.exists(os.path.join(sdir, key + ".tkvs")), key
        q = [n for n in os.listdir(os.path.join(sdir, "quarantine")) if n.startswith(key + ".tkvs.")]
        assert len(q) == 1 and open(os.path.join(sdir, "quarantine", q[0]), "rb").read() == data, (key, q)
        print("%-12s -> SESSION_CORRUPT: %s" % (key, res.error[1]))
        # the name is free again: a fresh session
        res = sess_ok(sess_turn(d, key, TURNS[1]))
        assert w.first(res.done, 4) == 0, res.done
    good2 = sess_ok(sess_turn(d, "good", TURNS[1]))  # the intact file still works
    assert w.first(good2.done, 4) > 0
    d.stop()

    # another KV type (kv.tkvs is good.tkvs before its turn 2): the same prompt, all of it computed again
    d = sess_daemon(args, tmp, extra=["--kv", "q8_0"])
    res = sess_ok(sess_turn(d, "kv", TURNS[1]))
    assert w.first(res.done, 3) == w.first(good2.done, 3) and w.first(res.done, 4) == 0, (res.done, good2.done)
    assert not os.path.exists(os.path.join(sdir, "quarantine", "kv.tkvs")), "quarantined"
    d.stop()  # saved again, now with this daemon's type
    data = open(os.path.join(sdir, "kv.tkvs"), "rb").read()
    spec_len = int.from_bytes(data[64 + 16 + 4:64 + 16 + 8], "little")
    assert data[64 + 32:64 + 32 + spec_len] == b"q8_0", data[64 + 32:64 + 32 + spec_len]
    print("kv         -> another KV type: %d prompt tokens computed again, saved as q8_0" % w.first(res.done, 3))

    # pair-coded keys (engine/kv/fmt_pk.c): migrated, saved (session file version 6), restored and reused after a restart
    pk = ["--kv", "pk4:tq3_nc"]
    d = sess_daemon(args, tmp, extra=pk)
    res = sess_ok(sess_turn(d, "kv", TURNS[0]))
    assert w.first(res.done, 4) == 0, res.done
    d.stop()
    data = open(os.path.join(sdir, "kv.tkvs"), "rb").read()
    spec_len = int.from_bytes(data[64 + 16 + 4:64 + 16 + 8], "little")
    assert data[8] == 6 and data[64 + 32:64 + 32 + spec_len] == b"pk4:tq3_nc", data[:12]
    d = sess_daemon(args, tmp, extra=pk)
    again = sess_ok(sess_turn(d, "kv", TURNS[1]))
    assert w.first(again.done, 4) >= w.first(res.done, 3), ("pk prefix not reused", again.done, res.done)
    d.stop()
    print("kv         -> pk4:tq3_nc: saved as version 6, %d of %d prompt tokens from the restored cache" %
          (w.first(again.done, 4), w.first(again.done, 3)))
    return 0


def sess_mount_tmpfs(path, size):
    """Mount a tmpfs of size bytes on path (we run as root); False where that is not allowed."""
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d,mode=0700" % size, "tmpfs", path],
                       capture_output=True, text=True)
    return r.returncode == 0


def case_session_enospc(args, tmp):
    """Out of disk during a save (a small tmpfs, else injected ENOSPC): the previous version stays intact."""
    t1, t2 = sess_reference(args, tmp)
    d = sess_daemon(args, tmp)
    sess_ok(sess_turn(d, "e", TURNS[0]))
    d.stop()
    udir = sess_dir(tmp)
    path = os.path.join(udir, "e.tkvs")
    v1 = open(path, "rb").read()
    # room for v1 and half of a file of its size: the larger v2 cannot be written next to it
    mounted = sess_mount_tmpfs(udir, (len(v1) * 3 // 2 + 4095) // 4096 * 4096)
    try:
        if mounted:
            with open(path, "wb") as f:
                f.write(v1)
            env = None
            print("a %d-byte tmpfs holds the session directory" % (len(v1) * 3 // 2))
        else:
            env = {"TURBOKV_TEST_SESSION_FAIL_WRITE_AFTER": str(len(v1) // 2)}
            print("cannot mount a tmpfs here; injecting ENOSPC")
        d = sess_daemon(args, tmp, env=env)
        r = sess_ok(sess_turn(d, "e", TURNS[1]))
        assert r.tokens == t2
        d.stop()
        assert any("cannot save session 'e'" in line and "No space left" in line for line in d.stderr), \
            "".join(d.stderr[-5:])
        assert open(path, "rb").read() == v1, "the previous version was touched"
        assert not os.path.exists(path + ".tmp")
        d = sess_daemon(args, tmp)
        r = sess_ok(sess_turn(d, "e", TURNS[1]))
        assert r.tokens == t2 and w.first(r.done, 4) > 0, (r.tokens, t2, r.done)
        d.stop()
    finally:
        if mounted:
            subprocess.run(["umount", udir], check=False)
    return 0


def case_session_limits(args, tmp):
    """Quota of sessions (SESSION_QUOTA), busy sessions (SESSION_BUSY), a memory budget that spills to disk."""
    d = sess_daemon(args, tmp, extra=SESS_KV + ["--session-max", "2", "--session-memory", "1"])
    r1 = sess_ok(sess_turn(d, "one", TURNS[0]))
    sess_ok(sess_turn(d, "two", TURNS[0]))
    res = sess_turn(d, "three", TURNS[0])
    assert res.error is not None and res.error[0] == 16, res.error  # SESSION_QUOTA
    # a budget of one byte: every session is spilled to disk when its request ends
    # (the save runs on the daemon's I/O worker: give it a moment)
    deadline = time.monotonic() + 30
    lst = sess_list(d)
    while any(v["in_memory"] for v in lst.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
        lst = sess_list(d)
    assert sorted(lst) == ["one", "two"] and not any(v["in_memory"] for v in lst.values()), lst
    assert all(v["bytes"] > 0 for v in lst.values()), lst
    r = sess_ok(sess_turn(d, "one", TURNS[1]))
    assert w.first(r.done, 4) >= w.first(r1.done, 3), r.done  # restored from the spilled file
    # two requests on one session at once: the second is SESSION_BUSY
    c = w.Conn(d.sock)
    c.hello()
    c.send(sess_generate(1, TURNS[1], "two", n=64))
    c.send(sess_generate(2, TURNS[1], "two", n=4))
    results = {}
    res2 = w.collect(c, 2, results)
    assert res2.error is not None and res2.error[0] == 18, res2.error  # SESSION_BUSY
    res1 = w.collect(c, 1, results)
    assert res1.error is None, res1.error
    c.close()
    d.stop()
    return 0


def sess_as_uid(d, uid, actions):
    """Run actions (a function of the daemon) in a child that setuid()s to uid; returns its result."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        code = 0
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = actions(d)
        except BaseException as e:  # noqa: B902: report anything to the parent
            out, code = {"exception": repr(e)}, 1
        os.write(wfd, json.dumps(out).encode())
        os._exit(code)
    os.close(wfd)
    data = b""
    while True:
        chunk = os.read(rfd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(rfd)
    os.waitpid(pid, 0)
    out = json.loads(data)
    assert "exception" not in out, out
    return out


def case_session_uids(args, tmp):
    """Two unprivileged uids: neither lists, reads, overwrites nor deletes the other's sessions."""
    os.chmod(tmp, 0o755)
    d = sess_daemon(args, tmp, extra=SESS_KV)
    os.chmod(os.path.dirname(d.sock), 0o755)
    os.chmod(d.sock, 0o666)

    def user_a(d):
        r1 = sess_ok(sess_turn(d, "shared", TURNS[0]))
        sess_ok(sess_turn(d, "a-only", TURNS[0]))
        return {"tokens": r1.tokens, "list": sorted(sess_list(d))}

    def user_b(d):
        r = sess_ok(sess_turn(d, "shared", TURNS[1]))  # same name, B's own: nothing cached
        show = sess_request(d, 6, w.f_bytes(2, "a-only"), 3)
        dele = sess_request(d, 7, w.f_bytes(2, "a-only"), 4)
        return {"cached": w.first(r.done, 4), "list": sorted(sess_list(d)),
                "show": [show[0], w.first(show[1], 2)], "delete": [dele[0], w.first(dele[1], 2)]}

    a = sess_as_uid(d, 65534, user_a)
    b = sess_as_uid(d, 65533, user_b)
    assert a["list"] == ["a-only", "shared"], a
    assert b["list"] == ["shared"], b
    assert b["cached"] == 0, b
    assert b["show"] == ["error", w.E["SESSION_NOT_FOUND"]] and b["delete"] == ["error", w.E["SESSION_NOT_FOUND"]], b
    a2 = sess_as_uid(d, 65534, lambda d: {"list": sorted(sess_list(d)),
                                           "cached": w.first(sess_ok(sess_turn(d, "shared", TURNS[1])).done, 4)})
    assert a2["list"] == ["a-only", "shared"] and a2["cached"] > 0, a2
    assert sess_list(d) == {}, "root sees other users' sessions"
    d.stop()
    for uid in (65534, 65533):
        assert os.stat(sess_dir(tmp, uid)).st_mode & 0o777 == 0o700
    assert sorted(os.listdir(sess_dir(tmp, 65534))) == ["a-only.tkvs", "shared.tkvs"]
    assert sorted(os.listdir(sess_dir(tmp, 65533))) == ["shared.tkvs"]
    return 0


def with_policy(msg, policy):
    """A Generate ClientMessage (tkvwire.generate) with Generate.context_policy (field 9) set."""
    assert msg[0] == 0x12
    n, i, shift = 0, 1, 0
    while True:
        b = msg[i]
        n, i, shift = n | (b & 0x7f) << shift, i + 1, shift + 7
        if b < 0x80:
            break
    return w.f_bytes(2, msg[i:i + n] + w.f_varint(9, policy))


POLICY = dict(ERROR=0, TRUNCATE_OLDEST=1, STOP_AT_LIMIT=2)


def case_context_policy(args, tmp):
    """TRUNCATE_OLDEST without a session: a raw prompt has nothing to drop (CONTEXT_OVERFLOW saying so), a chat
    drops its own oldest turns; STOP_AT_LIMIT runs."""
    d = Daemon(args, tmp, extra=["--ctx", "256"])
    d.wait_ready()
    c = w.Conn(d.sock)
    c.hello()
    long_raw = ("hello " * 400).encode()
    c.send(with_policy(w.generate(1, raw=long_raw, max_tokens=4), POLICY["TRUNCATE_OLDEST"]))
    res = w.collect(c, 1)
    assert res.error and res.error[0] == w.E["CONTEXT_OVERFLOW"], res.error
    assert "no older turns to drop" in res.error[1], res.error
    assert not res.tokens
    # a stateless chat drops its own oldest turns, as a session would (the system prompt and the new turn stay)
    system, last = [(1, "Be brief.")], [(2, "And now?")]
    hist = [(2, "hello " * 100), (3, "ok")] * 3
    c.send(with_policy(w.generate(2, messages=system + hist + last, max_tokens=4), POLICY["TRUNCATE_OLDEST"]))
    res = w.collect(c, 2)
    assert res.error is None, res.error
    kept = w.first(res.done, 3)
    assert w.first(res.done, 6) > 0 and kept + 4 <= 256, res.done
    # what was kept is exactly the system prompt, the newest whole turns that fit and the question
    c.send(w.generate(6, messages=system + hist[2:] + last, max_tokens=4))
    ref = w.collect(c, 6)
    assert ref.error is None and w.first(ref.done, 3) == kept and ref.tokens == res.tokens, (ref.done, res.done)
    # only the system prompt and the question left, still too long: refused, saying so
    c.send(with_policy(w.generate(7, messages=system + hist + [(2, "why " * 300)], max_tokens=4),
                       POLICY["TRUNCATE_OLDEST"]))
    res = w.collect(c, 7)
    assert res.error and res.error[0] == w.E["CONTEXT_OVERFLOW"], res.error
    assert "only the system prompt and the last user turn" in res.error[1], res.error
    # ERROR (the default): a max_tokens beyond the room is refused, saying how to go on
    c.send(w.generate(3, user=PROMPTS[0], max_tokens=1000))
    res = w.collect(c, 3)
    assert res.error and res.error[0] == w.E["CONTEXT_OVERFLOW"] and "nothing was dropped" in res.error[1], res.error
    # A request that fits runs as usual, nothing dropped (Done.dropped_tokens, field 6, is 0).
    c.send(with_policy(w.generate(4, user=PROMPTS[0], max_tokens=N_TOKENS), POLICY["TRUNCATE_OLDEST"]))
    res = w.collect(c, 4)
    check_answer(args, res, PROMPTS[0])
    assert w.first(res.done, 6) == 0, res.done
    # STOP_AT_LIMIT: max_tokens beyond the context is fine; the answer ends at the context's end at the latest.
    c.send(with_policy(w.generate(5, user=PROMPTS[1], max_tokens=1000), POLICY["STOP_AT_LIMIT"]))
    res = w.collect(c, 5)
    assert res.error is None, res.error
    assert w.first(res.done, 2) in (w.FINISH["STOP"], w.FINISH["CONTEXT_FULL"]), res.done
    assert w.first(res.done, 3) + w.first(res.done, 5) <= 256, res.done
    c.close()
    d.stop()


def policy_set(msg, policy):
    """with_policy() plus Generate.context_policy_set (field 10): an explicit choice, even ERROR."""
    assert msg[0] == 0x12
    n, i, shift = 0, 1, 0
    while True:
        b = msg[i]
        n, i, shift = n | (b & 0x7f) << shift, i + 1, shift + 7
        if b < 0x80:
            break
    return w.f_bytes(2, msg[i:i + n] + w.f_varint(9, policy) + w.f_varint(10, 1))


def case_answer_limit(args, tmp):
    """No max_tokens: --answer-tokens ends the answer (LENGTH); an answer that fills the context ends LENGTH
    too, the session keeps it, and the next question says how to go on (then drop-oldest goes on)."""
    d = Daemon(args, tmp, extra=["--ctx", "160", "--answer-tokens", "6"])
    d.wait_ready()
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.generate(1, raw=COUNTING.encode(), max_tokens=0))
    res = w.collect(c, 1)
    assert res.error is None, res.error
    assert w.first(res.done, 2) == w.FINISH["LENGTH"] and w.first(res.done, 5) == 6 == len(res.tokens), res.done
    c.close()
    d.stop()
    # --answer-tokens 0: until the context is full; the session's answer ends LENGTH and is kept
    d = sess_daemon(args, tmp, extra=["--ctx", "80", "--answer-tokens", "0"])
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.generate(2, raw=COUNTING.encode(), max_tokens=0, session="count"))
    res = w.collect(c, 2)
    assert res.error is None, res.error
    assert w.first(res.done, 2) == w.FINISH["LENGTH"], res.done
    assert w.first(res.done, 3) + w.first(res.done, 5) == 81, res.done  # the last one sampled, not cached
    c.send(w.generate(3, raw=b" 17,", max_tokens=4, session="count"))
    res = w.collect(c, 3)
    assert res.error and res.error[0] == w.E["CONTEXT_OVERFLOW"], res.error
    assert "--on-overflow drop-oldest" in res.error[1] and "new session" in res.error[1], res.error
    c.send(with_policy(w.generate(4, raw=b" 17,", max_tokens=4, session="count"), POLICY["TRUNCATE_OLDEST"]))
    res = w.collect(c, 4)
    assert res.error is None, res.error
    assert w.first(res.done, 6) > 0 and w.first(res.done, 5) == 4, res.done
    assert w.first(res.done, 3) <= 80 - 4, res.done
    c.close()
    d.stop()
    return 0


def case_truncate_oldest(args, tmp):
    """A chat session that outgrows the context drops whole oldest turns, never the system prompt or the turn
    holding an attachment; the policy is kept with the session across a restart; an explicit ERROR refuses."""
    extra = ["--ctx", "384", "--answer-tokens", "8"]
    d = sess_daemon(args, tmp, extra=extra)
    c = w.Conn(d.sock)
    c.hello()
    doc = ("The secret word is turnip. " * 6).encode()
    fd = w.memfd_with(doc)
    system = [(1, "You are terse.")]
    c.send(w.generate(1, messages=system + [(2, "Remember the document.")], max_tokens=4, session="long",
                      attachments=[("doc.txt", 0, len(doc))]), [fd])
    os.close(fd)
    first = sess_ok(w.collect(c, 1))
    pinned = w.first(first.done, 3)
    dropped, rid = 0, 2
    for i in range(12):
        q = "Question %d: tell me about the number %d and its neighbours %s" % (i, i, "and more " * 8)
        c.send(with_policy(w.generate(rid, user=q, max_tokens=4, session="long"), POLICY["TRUNCATE_OLDEST"]))
        res = sess_ok(w.collect(c, rid))
        rid += 1
        assert w.first(res.done, 3) + 4 <= 384, res.done
        dropped += w.first(res.done, 6)
        if dropped:
            # the system prompt and the attachment's turn stay: the prompt holds at least those
            assert w.first(res.done, 3) >= pinned, (pinned, res.done)
            # what was kept before the dropped turn is reused, the rest prefilled again
            assert w.first(res.done, 4) < w.first(res.done, 3), res.done
            break
    assert dropped > 0, "12 turns of ~40 tokens never outgrew a 384-token context"
    # the policy stays with the session: without one the next question drops again when needed, after a restart
    c.close()
    d.stop()
    d = sess_daemon(args, tmp, extra=extra)
    c = w.Conn(d.sock)
    c.hello()
    big = "Another long question %s" % ("with many words " * 12)
    c.send(w.generate(rid, user=big, max_tokens=4, session="long"))
    res = sess_ok(w.collect(c, rid))
    assert w.first(res.done, 6) > 0, res.done
    rid += 1
    # an explicit ERROR refuses and drops nothing
    big = "Another long question %s" % ("with many words " * 40)
    c.send(policy_set(w.generate(rid, user=big, max_tokens=4, session="long"), POLICY["ERROR"]))
    res = w.collect(c, rid)
    assert res.error and res.error[0] == w.E["CONTEXT_OVERFLOW"], res.error
    c.close()
    d.stop()
    return 0


def case_prefix_reuse(args, tmp):
    """A stateless chat (the whole history every turn, no session) reuses the caller's cached prefix
    (Done.cached_tokens), and the answer is token for token the one computed from scratch."""
    q1, q2 = PROMPTS
    d = sess_daemon(args, tmp, extra=["--ctx", "512"])
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.generate(1, messages=[(1, "Be brief."), (2, q1)], max_tokens=N_TOKENS))
    r1 = sess_ok(w.collect(c, 1))
    assert w.first(r1.done, 4) == 0, r1.done
    hist = [(1, "Be brief."), (2, q1), (3, r1.text.decode()), (2, q2)]
    c.close()
    c = w.Conn(d.sock)  # another connection of the same uid: the cache is the uid's, not the connection's
    c.hello()
    c.send(w.generate(2, messages=hist, max_tokens=N_TOKENS))
    r2 = sess_ok(w.collect(c, 2))
    assert w.first(r2.done, 4) >= w.first(r1.done, 3) - 1, ("turn 2 reused too little", r1.done, r2.done)
    c.close()
    d.stop()
    d = sess_daemon(args, tmp, extra=["--ctx", "512", "--prefix-cache", "0"])
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.generate(3, messages=hist, max_tokens=N_TOKENS))
    r3 = sess_ok(w.collect(c, 3))
    assert w.first(r3.done, 4) == 0, r3.done
    assert r3.tokens == r2.tokens, ("reused prefix changed the answer", r2.tokens, r3.tokens)
    c.close()
    d.stop()
    return 0


def prefix_dir(tmp, uid=0):
    return os.path.join(sess_dir(tmp, uid), "prefixes")


def prefix_files(tmp, uid=0):
    try:
        return sorted(f for f in os.listdir(prefix_dir(tmp, uid)))
    except FileNotFoundError:
        return []


def wait_for(pred, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def anon_chat(d, rid, msgs, n=N_TOKENS):
    c = w.Conn(d.sock)
    c.hello()
    c.send(w.generate(rid, messages=msgs, max_tokens=n))
    res = sess_ok(w.collect(c, rid))
    c.close()
    return res


def case_prefix_spill(args, tmp):
    """Anonymous prefix caches outlive a restart: saved at shutdown as session files under the uid's prefixes/
    (never listed as sessions), found by their key, loaded, deleted once superseded; the answer is token for token
    the one computed from scratch; another uid gets nothing; a damaged file is logged, deleted and recomputed."""
    q1, q2 = PROMPTS
    extra = ["--ctx", "512"] + SESS_KV
    os.makedirs(os.path.join(tmp, "ref"))
    d = sess_daemon(args, os.path.join(tmp, "ref"), extra=extra + ["--prefix-cache", "0"])
    r1 = anon_chat(d, 1, [(1, "Be brief."), (2, q1)])
    hist = [(1, "Be brief."), (2, q1), (3, r1.text.decode()), (2, q2)]
    ref = anon_chat(d, 2, hist)
    assert w.first(ref.done, 4) == 0, ref.done
    d.stop()
    assert prefix_files(os.path.join(tmp, "ref")) == [], "--prefix-cache 0 spilled"

    d = sess_daemon(args, tmp, extra=extra)
    a1 = anon_chat(d, 1, [(1, "Be brief."), (2, q1)])
    assert a1.tokens == r1.tokens
    assert prefix_files(tmp) == [], "spilled while it fits in memory"
    d.stop()  # SIGTERM: the cache in memory is written
    files = prefix_files(tmp)
    assert len(files) == 1 and files[0].endswith(".tkvs"), files
    st = os.stat(os.path.join(prefix_dir(tmp), files[0]))
    assert st.st_mode & 0o777 == 0o600 and os.stat(prefix_dir(tmp)).st_mode & 0o777 == 0o700, oct(st.st_mode)
    n_kv = int(files[0].split("-")[0])
    assert n_kv >= w.first(a1.done, 3), (files, a1.done)

    d = sess_daemon(args, tmp, extra=extra)
    assert sess_list(d) == {}, "a prefix file listed as a session"
    a2 = anon_chat(d, 2, hist)
    cached = w.first(a2.done, 4)
    assert cached >= w.first(a1.done, 3), ("the spilled prefix was not reused", a1.done, a2.done)
    assert a2.tokens == ref.tokens, ("the restored prefix changed the answer", ref.tokens, a2.tokens)
    assert any("restored a prefix cache" in line for line in d.stderr), "".join(d.stderr[-5:])
    assert prefix_files(tmp) == [], ("the loaded file was not deleted", prefix_files(tmp))
    print("restart: %d of %d prompt tokens from the spilled cache, answer identical" % (cached, w.first(a2.done, 3)))
    d.stop()
    assert len(prefix_files(tmp)) == 1 and prefix_files(tmp) != files, prefix_files(tmp)  # the longer one

    # another uid sends the very same history: nothing of root's is found, root's file stays
    os.chmod(tmp, 0o755)
    d = sess_daemon(args, tmp, extra=extra)
    os.chmod(os.path.dirname(d.sock), 0o755)
    os.chmod(d.sock, 0o666)
    other = sess_as_uid(d, 65534, lambda d: {"cached": w.first(anon_chat(d, 3, hist).done, 4),
                                             "list": sorted(sess_list(d))})
    assert other == {"cached": 0, "list": []}, other
    assert len(prefix_files(tmp)) == 1, prefix_files(tmp)

    # eviction to disk: with one cache in memory, a second conversation spills the first; it comes back
    d.stop()
    shutil.rmtree(prefix_dir(tmp))
    d = sess_daemon(args, tmp, extra=extra + ["--prefix-cache", "1"])
    anon_chat(d, 4, [(1, "Be brief."), (2, q1)])
    b1 = anon_chat(d, 5, [(1, "Be terse."), (2, q2)])
    wait_for(lambda: len(prefix_files(tmp)) == 1, "the evicted cache was not spilled")
    a2 = anon_chat(d, 6, hist)
    assert w.first(a2.done, 4) >= w.first(a1.done, 3) and a2.tokens == ref.tokens, a2.done
    wait_for(lambda: len(prefix_files(tmp)) == 1, "B's cache was not spilled, or A's file not deleted")
    d.stop()
    assert len(prefix_files(tmp)) == 2, prefix_files(tmp)  # A (longer now) and B

    # damaged files: one truncated, one with a flipped byte; each is logged and deleted, the prompt recomputed
    for i, f in enumerate(prefix_files(tmp)):
        path = os.path.join(prefix_dir(tmp), f)
        data = bytearray(open(path, "rb").read())
        if i == 0:
            data = data[:len(data) // 2]
        else:
            data[len(data) // 2] ^= 0x40
        open(path, "wb").write(bytes(data))
    d = sess_daemon(args, tmp, extra=extra)
    a3 = anon_chat(d, 7, hist)
    assert w.first(a3.done, 4) == 0 and a3.tokens == ref.tokens, a3.done
    b2 = anon_chat(d, 8, [(1, "Be terse."), (2, q2), (3, b1.text.decode()), (2, q1)])
    assert w.first(b2.done, 4) == 0, b2.done
    bad = [line for line in d.stderr if "prefix cache file" in line and "cannot be loaded" in line]
    assert len(bad) == 2, "".join(d.stderr[-8:])
    assert prefix_files(tmp) == [], prefix_files(tmp)
    d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(h.run_cases(h.cases_of(globals()), ("daemon", "lab"), "tkv-it-"))

#!/usr/bin/env python3
"""test-http.py: turbokv-http end to end: a real turbokvd and a real gateway, real HTTP clients.

Usage: test-http.py --daemon turbokvd --gateway turbokv-http --cli turbokv --pyclients DIR CASE

Each case starts turbokvd on a socket in a temporary directory and turbokv-http
on a free loopback port (readiness of both seen on a NOTIFY_SOCKET), then:
  openai      the `openai` PyPI package: model list, chat streamed and not, a
              two-turn chat, /v1/completions; greedy answers equal the native
              CLI's (`turbokv ask --greedy`) for the same question;
  ollama      the `ollama` PyPI package: list, show, ps, version, chat and
              generate streamed and not, equal to the same greedy answer;
  session     the X-Turbokv-Session extension: turn two reuses the daemon's
              cache (cached_tokens > 0); a --listen unix:PATH listener;
  bad_input   raw sockets and curl: malformed JSON, wrong types, unsupported
              fields, huge bodies and headers, slow headers, unknown routes and
              methods, a token from the configuration file, a non-loopback
              address without --allow-remote; each a 4xx JSON error (or a
              closed connection for slow headers) and the gateway keeps serving;
  disconnect  a client that leaves mid-stream cancels its generation (the
              daemon's Status shows no active request, tokens stop growing).
  pool        the gateway's kept daemon connections: many sequential requests
              (streamed, whole, Ollama, model info) do not grow the daemon's
              connection count; a request after a client hung up mid-stream
              (a cancelled connection) answers in full; a pooled connection
              the daemon closed for idleness, and one to a daemon that has
              since restarted, are replaced and the request still answers.
The openai and ollama packages come from DIR (scripts/setup-pyclients.sh); a
missing package fails the test.
"""
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

THREADS = "2"
QUESTION = "What is the capital of France?"
N = 12


Proc = h.Notified


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Stack:
    """turbokvd + turbokv-http."""

    def __init__(self, args, tmp, config=None, unix=None, daemon_args=()):
        self.args = args
        self.tmp = tmp
        self.sock = os.path.join(tmp, "turbokvd.sock")
        self.daemon_cmd = [args.daemon, "--threads", THREADS, "--socket", self.sock,
                           "--state-dir", os.path.join(tmp, "state")] + list(daemon_args)
        self.start_daemon()
        self.port = free_port()
        cmd = [args.gateway, "--listen", "127.0.0.1:%d" % self.port, "--socket", self.sock]
        if unix:
            cmd += ["--listen", "unix:" + unix]
        if config:
            path = os.path.join(tmp, "turbokv-http.conf")
            with open(path, "w") as f:
                f.write(config)
            cmd += ["--config", path]
        self.gateway = Proc("turbokv-http", cmd, tmp).wait_ready()
        self.base = "http://127.0.0.1:%d" % self.port

    def start_daemon(self):
        self.daemon = Proc("turbokvd", self.daemon_cmd, self.tmp,
                           env={"XDG_STATE_HOME": os.path.join(self.tmp, "state")}).wait_ready()

    def stop(self):
        self.gateway.stop()
        self.daemon.stop()

    def request(self, method, path, body=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def status(self):
        p = subprocess.run([self.args.cli, "status", "--json", "--socket", self.sock],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)


def native_answer(args, stack, question, n=N):
    p = subprocess.run([args.cli, "ask", "--greedy", "-n", str(n), "--socket", stack.sock, question],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout


def msgs(*texts):
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


def case_openai(args, tmp):
    import openai
    s = Stack(args, tmp)
    want = native_answer(args, s, QUESTION)
    assert want.strip(), "empty native answer"
    client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0)
    models = client.models.list().data
    assert len(models) == 1 and models[0].id, models
    model = models[0].id

    r = client.chat.completions.create(model=model, messages=msgs(QUESTION), max_tokens=N, temperature=0)
    got = r.choices[0].message.content
    assert got == want, (got, want)
    assert r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens <= N and r.usage.prompt_tokens > 5, r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # the native client asked the same question just before, as the same user: the daemon's
    # anonymous prefix cache (issue 23) gives back all of the prompt but its last token
    assert 0 < r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens, r.usage
    assert r.model == model and r.object == "chat.completion"

    parts, finish, usage = [], None, None
    for ch in client.chat.completions.create(model=model, messages=msgs(QUESTION), max_tokens=N,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            if c.delta.content:
                parts.append(c.delta.content)
            finish = c.finish_reason or finish
    assert "".join(parts) == want, (parts, want)
    assert len(parts) > 1, "not streamed: %r" % parts
    assert finish in ("stop", "length"), finish
    assert usage and usage.completion_tokens == r.usage.completion_tokens, usage

    # Two turns, stateless: the client sends the whole history.
    q2 = "And of Italy?"
    r2 = client.chat.completions.create(model=model, messages=msgs(QUESTION, got, q2), max_tokens=N,
                                        temperature=0)
    assert r2.choices[0].message.content.strip(), r2
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens + 5, (r2.usage, r.usage)

    # /v1/completions: a raw prompt.
    c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert c.choices[0].text and c.usage.completion_tokens <= 4, c
    text = "".join(x.choices[0].text for x in client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=4, temperature=0, stream=True))
    assert text == c.choices[0].text, (text, c.choices[0].text)

    # Errors the client library sees as exceptions with the right status.
    try:
        client.chat.completions.create(model=model, messages=msgs(QUESTION), n=2)
        raise AssertionError("n=2 accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "n" in str(e), e
    s.stop()


def case_ollama(args, tmp):
    import ollama
    s = Stack(args, tmp)
    want = native_answer(args, s, QUESTION)
    client = ollama.Client(host=s.base)
    models = client.list().models
    assert len(models) == 1 and models[0].model, models
    model = models[0].model
    assert client.show(model).details.format == "gguf"
    assert len(client.ps().models) == 1
    st, _, body = s.request("GET", "/api/version")
    assert st == 200 and json.loads(body)["version"], body

    opts = {"temperature": 0, "num_predict": N}
    r = client.chat(model=model, messages=msgs(QUESTION), options=opts, stream=False)
    assert r.message.content == want and r.done and r.done_reason in ("stop", "length"), (r, want)
    assert r.eval_count <= N and r.prompt_eval_count > 5, r
    parts, last = [], None
    for ch in client.chat(model=model, messages=msgs(QUESTION), options=opts, stream=True):
        parts.append(ch.message.content)
        last = ch
    assert "".join(parts) == want and last.done and len(parts) > 2, (parts, want)
    r2 = client.chat(model=model, messages=msgs(QUESTION, want, "And of Italy?"), options=opts)
    assert r2.message.content.strip() and r2.prompt_eval_count > r.prompt_eval_count + 5, r2

    g = client.generate(model=model, prompt=QUESTION, options=opts)
    assert g.response == want and g.done, (g, want)
    gs = "".join(x.response for x in client.generate(model=model, prompt=QUESTION, options=opts, stream=True))
    assert gs == want, (gs, want)
    try:
        client.chat(model=model, messages=msgs(QUESTION), format="json")
        raise AssertionError("format accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "format" in e.error, e
    s.stop()


def case_session(args, tmp):
    unix = os.path.join(tmp, "http.sock")
    s = Stack(args, tmp, unix=unix)
    # The Unix-socket listener serves the same API.
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    u.settimeout(60)
    u.connect(unix)
    u.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got = b""
    while True:
        b = u.recv(4096)
        if not b:
            break
        got += b
    u.close()
    assert got.startswith(b"HTTP/1.1 200") and b'"object":"list"' in got, got
    h = {"X-Turbokv-Session": "chat-1", "Content-Type": "application/json"}
    body = {"messages": msgs(QUESTION), "max_tokens": N, "temperature": 0}
    st, _, d = s.request("POST", "/v1/chat/completions", body, h)
    assert st == 200, d
    r1 = json.loads(d)
    a1 = r1["choices"][0]["message"]["content"]
    body["messages"] = msgs(QUESTION, a1, "And of Italy?")
    st, _, d = s.request("POST", "/v1/chat/completions", body, h)
    assert st == 200, d
    r2 = json.loads(d)
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, r2["usage"]
    assert r2["usage"]["prompt_tokens"] > r1["usage"]["prompt_tokens"], (r1, r2)
    # The body field works too, and a bad name is refused.
    body["session"] = "../x"
    st, _, d = s.request("POST", "/v1/chat/completions", body, {})
    assert st == 400 and json.loads(d)["error"]["param"] == "session", d
    s.stop()


def raw(port, data, timeout=10):
    """Send bytes, read until the server closes or timeout; returns the status (0: none) and bytes."""
    c = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        c.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass
    out = b""
    try:
        while True:
            b = c.recv(65536)
            if not b:
                break
            out += b
            if b"\r\n\r\n" in out:
                head, _, rest = out.partition(b"\r\n\r\n")
                m = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
                if m and len(rest) >= int(m[0].split(b":")[1]):
                    break
    except (socket.timeout, ConnectionResetError):
        pass
    c.close()
    status = int(out.split(b" ")[1]) if out.startswith(b"HTTP/1.") else 0
    return status, out


def expect_error(s, path, body, status, param=None, openai_fmt=True):
    st, hdr, d = s.request("POST", path, body, {"Content-Type": "application/json"})
    assert st == status, (path, body, st, d)
    e = json.loads(d)["error"]
    if openai_fmt:
        assert e["message"] and e["type"], e
        if param:
            assert e["param"] == param, (param, e)
    else:
        assert isinstance(e, str) and e, e
    return e


def still_serving(s):
    st, _, d = s.request("POST", "/v1/chat/completions", {"messages": msgs("Hi"), "max_tokens": 2})
    assert st == 200 and json.loads(d)["choices"][0]["message"]["content"] is not None, d
    st, _, d = s.request("GET", "/health")
    assert st == 200 and json.loads(d)["status"] == "ok", d


def case_bad_input(args, tmp):
    conf = "# test configuration\nmax-body-bytes = 65536\ntimeout = 2\nmax-header-bytes = 8192\n"
    s = Stack(args, tmp, config=conf)
    chat = "/v1/chat/completions"
    expect_error(s, chat, "{not json", 400)
    expect_error(s, chat, '{"messages": [}', 400)
    expect_error(s, chat, "[1,2]", 400)
    expect_error(s, chat, '{"a":1,"a":2,"messages":[]}', 400)
    expect_error(s, chat, {"messages": "hello"}, 400, "messages")
    expect_error(s, chat, {"messages": []}, 400, "messages")
    expect_error(s, chat, {"messages": [{"role": "user", "content": 5}]}, 400, "content")
    expect_error(s, chat, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role")
    expect_error(s, chat, {"messages": msgs("x"), "temperature": "hot"}, 400, "temperature")
    expect_error(s, chat, {"messages": msgs("x"), "temperature": 7}, 400, "temperature")
    expect_error(s, chat, {"messages": msgs("x"), "max_tokens": -1}, 400, "max_tokens")
    expect_error(s, chat, {"messages": msgs("x"), "max_tokens": 1.5}, 400, "max_tokens")
    expect_error(s, chat, {"messages": msgs("x"), "stream": "yes"}, 400, "stream")
    expect_error(s, chat, {"messages": msgs("x"), "stop": [1]}, 400, "stop")
    expect_error(s, chat, {"messages": msgs("x"), "response_format": {"type": "json_object"}}, 400,
                 "response_format")
    expect_error(s, chat, {"messages": msgs("x"), "logprobs": True}, 400, "logprobs")
    expect_error(s, chat, {"messages": msgs("x"), "tool_choice": "required"}, 400, "tool_choice")
    expect_error(s, chat, '{"messages":[{"role":"user","content":"a\\u0000b"}]}', 400)
    expect_error(s, "/v1/completions", {"prompt": 5}, 400, "prompt")
    expect_error(s, "/api/chat", "{nope", 400, openai_fmt=False)
    expect_error(s, "/api/chat", {"messages": msgs("x"), "options": {"num_predict": "many"}}, 400,
                 openai_fmt=False)
    expect_error(s, "/api/generate", {"prompt": "x", "context": [1, 2]}, 400, openai_fmt=False)
    # A field that only tunes is ignored and named.
    st, hdr, d = s.request("POST", chat, {"messages": msgs("Hi"), "max_tokens": 2, "presence_penalty": 0.5})
    assert st == 200 and "presence_penalty" in hdr.get("X-Turbokv-Ignored", ""), (st, hdr)
    # Context overflow: the daemon's error with its HTTP status.
    e = expect_error(s, chat, {"messages": msgs("word " * 9000)}, 400)
    assert e["code"] == "context_length_exceeded", e

    # Huge bodies: declared, and sent without a length (chunked).
    st, out = raw(s.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n"
                  b"Content-Type: application/json\r\n\r\n{\"messages\":")
    assert st == 413 and b'"request_too_large"' in out, out[:300]
    chunk = b"%x\r\n%s\r\n" % (32768, b" " * 32768)
    st, out = raw(s.port, b"POST /api/chat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                  chunk * 4 + b"0\r\n\r\n")
    assert st == 413 and b'"error"' in out, out[:300]
    # Headers over max-header-bytes (8192): our JSON 431, for both APIs; far past it
    # (past libmicrohttpd's buffer), its own 4xx; the gateway keeps serving.
    for path, openai in (("/v1/models", True), ("/api/tags", False)):
        st, out = raw(s.port, b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Big: " +
                      b"a" * 9000 + b"\r\n\r\n")
        assert st == 431, out[:300]
        err = json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]
        assert (err["code"] == "headers_too_large") if openai else isinstance(err, str), out[:300]
    st, out = raw(s.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n")
    assert 400 <= st < 500, out[:300]
    st, _, d = s.request("GET", "/health")
    assert st == 200, d
    # Unknown routes and methods.
    st, _, d = s.request("GET", "/v2/nothing")
    assert st == 404 and json.loads(d)["error"]["code"] == "not_found", d
    st, _, d = s.request("GET", "/api/nothing")
    assert st == 404 and isinstance(json.loads(d)["error"], str), d
    st, _, d = s.request("GET", "/v1/chat/completions")
    assert st == 405 and json.loads(d)["error"], d
    # Garbage that is not HTTP at all.
    raw(s.port, b"\x00\x01\x02 garbage\r\n\r\n", timeout=5)
    # Slow headers: a client that never finishes them is closed after the timeout (2 s)
    # while others are served.
    slow = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    still_serving(s)
    t0 = time.monotonic()
    try:
        data = slow.recv(100)
    except ConnectionResetError:
        data = b""
    waited = time.monotonic() - t0
    assert waited < 9 and not data.startswith(b"HTTP/1.1 200"), (waited, data)
    slow.close()
    still_serving(s)
    # curl, the other everyday client.
    curl = shutil.which("curl")
    if curl:
        p = subprocess.run([curl, "-s", "-w", "\n%{http_code}", s.base + "/v1/chat/completions", "-H",
                            "Content-Type: application/json", "-d", "{\"messages\":"],
                           capture_output=True, text=True, timeout=30)
        body, code = p.stdout.rsplit("\n", 1)
        assert code == "400" and json.loads(body)["error"]["message"], p.stdout
    s.stop()

    # A bearer token from the configuration file.
    tmp2 = os.path.join(tmp, "token")
    os.makedirs(tmp2)
    s = Stack(args, tmp2, config="token = s3cret\n")
    st, hdr, d = s.request("GET", "/v1/models")
    assert st == 401 and json.loads(d)["error"]["code"] == "invalid_api_key", d
    st, _, d = s.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert st == 401, d
    st, _, d = s.request("GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})
    assert st == 200, d
    st, _, d = s.request("GET", "/health")
    assert st == 200, d
    s.stop()

    # Configuration errors and a non-loopback address without --allow-remote.
    p = subprocess.run([args.gateway, "--listen", "0.0.0.0:%d" % free_port()], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode != 0 and "--allow-remote" in p.stderr, (p.returncode, p.stderr)
    bad = os.path.join(tmp, "bad.conf")
    with open(bad, "w") as f:
        f.write("max-requests = lots\n")
    p = subprocess.run([args.gateway, "--config", bad], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "bad.conf:1" in p.stderr, (p.returncode, p.stderr)


def case_disconnect(args, tmp):
    s = Stack(args, tmp)
    body = json.dumps({"messages": msgs("Write a very long story about a dragon."), "stream": True,
                       "max_tokens": 4000, "temperature": 0.8}).encode()
    for path in ("/v1/chat/completions", "/api/chat"):
        c = socket.create_connection(("127.0.0.1", s.port), timeout=60)
        c.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % (path.encode(), len(body)) + body)
        got = b""
        while got.count(b"content") < 3:
            b = c.recv(4096)
            assert b, got
            got += b
        assert s.status()["requests_active"] == 1
        c.close()
        deadline = time.monotonic() + 10
        while s.status()["requests_active"] != 0:
            assert time.monotonic() < deadline, "generation not cancelled after the client left"
            time.sleep(0.1)
        t1 = s.status()["tokens_generated"]
        time.sleep(1)
        assert s.status()["tokens_generated"] == t1, "tokens still being generated"
    still_serving(s)
    s.stop()


def case_pool(args, tmp):
    s = Stack(args, tmp, daemon_args=["--idle-timeout", "2"])
    body = {"messages": msgs(QUESTION), "max_tokens": N, "temperature": 0}

    def ask(path="/v1/chat/completions", stream=False):
        b = dict(body, stream=stream) if path.startswith("/v1/") else \
            {"messages": body["messages"], "stream": stream, "options": {"num_predict": N, "temperature": 0}}
        st, _, d = s.request("POST", path, b, {"Content-Type": "application/json"})
        assert st == 200, (st, d)
        if path == "/api/chat":
            lines = [json.loads(x) for x in d.splitlines() if x.strip()] if stream else [json.loads(d)]
            return "".join(x["message"]["content"] for x in lines)
        if not stream:
            return json.loads(d)["choices"][0]["message"]["content"]
        evs = [json.loads(x[6:]) for x in d.split(b"\n") if x.startswith(b"data: {")]
        return "".join(c["delta"].get("content") or "" for e in evs for c in e["choices"])

    want = native_answer(args, s, QUESTION)
    assert ask() == want
    conns = s.status()["connections"]  # the gateway's kept one and the CLI's own
    assert conns == 2, conns
    for i in range(8):
        assert ask(stream=i % 2 == 1) == want
        assert ask("/api/chat", stream=i % 2 == 0) == want
        st, _, _ = s.request("GET", "/v1/models")
        assert st == 200
    assert s.status()["connections"] == conns, (s.status()["connections"], conns)

    # A client that leaves mid-stream: its connection was cancelled, so it is
    # closed rather than kept (a kept one could cancel the next request).
    long = json.dumps({"messages": msgs("Write a very long story about a dragon."), "stream": True,
                       "max_tokens": 4000, "temperature": 0.8}).encode()
    c = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(long) + long)
    got = b""
    while got.count(b"content") < 3:
        b = c.recv(4096)
        assert b, got
        got += b
    c.close()
    deadline = time.monotonic() + 10
    while s.status()["requests_active"] != 0:
        assert time.monotonic() < deadline, "generation not cancelled after the client left"
        time.sleep(0.1)
    assert ask(stream=True) == want
    assert ask() == want
    assert s.status()["connections"] <= conns, s.status()

    # The daemon closes the kept connection after --idle-timeout 2 s (it
    # checks every second): the next request replaces it.
    time.sleep(3.5)
    assert s.status()["connections"] == 1, s.status()  # only the CLI's
    assert ask(stream=True) == want
    assert ask() == want

    # A daemon restarted between two requests: the kept connection is dead.
    s.daemon.stop()
    s.start_daemon()
    assert ask() == want
    st, _, d = s.request("GET", "/health")
    assert st == 200, d
    assert ask("/api/chat", stream=True) == want
    st, _, d = s.request("GET", "/api/tags")
    assert st == 200, d
    assert s.status()["connections"] == conns, s.status()
    s.stop()


if __name__ == "__main__":
    sys.exit(h.run_cases(h.cases_of(globals()), ("daemon", "gateway", "cli", "pyclients"), "tkv-http-",
                         setup=lambda args: sys.path.insert(0, args.pyclients)))

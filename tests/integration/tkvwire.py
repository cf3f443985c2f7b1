"""tkvwire.py: a minimal, independent turbokv.v1 client for the integration tests.

Speaks the wire format of proto/turbokv.proto by hand (protobuf varints and
length-delimited fields, 4-byte little-endian frame lengths), with only the
Python standard library, so the daemon is checked against a second
implementation of the protocol rather than against its own generated code.
"""
import os
import socket
import struct
import time

PROTOCOL_VERSION = 1

# ErrorCode values (turbokv.proto)
E = dict(BAD_FRAME=1, BAD_MESSAGE=2, UNSUPPORTED_VERSION=3, HELLO_REQUIRED=4,
         TOO_MANY_REQUESTS=5, REQUEST_ID_IN_USE=6, UNKNOWN_REQUEST=7,
         CONTEXT_OVERFLOW=8, ATTACHMENT_NOT_MEMFD=9, ATTACHMENT_NOT_SEALED=10,
         ATTACHMENT_TOO_LARGE=11, ATTACHMENT_NOT_UTF8=12,
         ATTACHMENT_SIZE_MISMATCH=13, SESSION_NOT_FOUND=14, BUSY=19, SHUTTING_DOWN=20,
         CANCELLED=21, INTERNAL=22, TIMEOUT=23)
# FinishReason values
FINISH = dict(STOP=1, LENGTH=2, CANCELLED=3, CONTEXT_FULL=4, STOP_STRING=5)
# ServerMessage oneof field numbers
SERVER_FIELDS = {1: "hello_reply", 2: "progress", 3: "token", 4: "done", 5: "error",
                 6: "status_reply", 7: "session_list_reply", 8: "session_info",
                 9: "session_deleted"}


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(field, n):
    return varint(field << 3) + varint(n)


def f_bytes(field, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


def decode(buf):
    """Fields of one message: {field: [values]} (varints as int, length-delimited as bytes, fixed64 as bytes)."""
    out, i = {}, 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = _read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(field, []).append(v)
    return out


def _read_varint(buf, i):
    n, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def first(d, field, default=0):
    return d.get(field, [default])[0]


def frame(payload):
    return struct.pack("<I", len(payload)) + payload


# ---- client messages ----

def hello(version=PROTOCOL_VERSION, name="tkv-integration"):
    return f_bytes(1, f_varint(1, version) + f_bytes(2, name))


def generate(rid, user=None, raw=None, max_tokens=16, greedy=True, stops=(), attachments=(), session=None,
             messages=None):
    g = f_varint(1, rid)
    if messages is None and user is not None:
        messages = [(2, user)]
    if messages is not None:
        chat = b"".join(f_bytes(1, f_varint(1, role) + f_bytes(2, text)) for role, text in messages)
        g += f_bytes(2, chat)
    if raw is not None:
        g += f_bytes(3, raw)
    for name, idx, size in attachments:
        g += f_bytes(4, f_bytes(1, name) + f_varint(2, idx) + f_varint(3, size))
    if greedy:
        g += f_bytes(5, f_varint(8, 1))
    if max_tokens:
        g += f_varint(6, max_tokens)
    for s in stops:
        g += f_bytes(7, s)
    if session:
        g += f_bytes(8, session)
    return f_bytes(2, g)


def cancel(rid):
    return f_bytes(3, f_varint(1, rid))


def status(rid):
    return f_bytes(4, f_varint(1, rid))


class Conn:
    """One client connection; frames in, ServerMessages out as (kind, fields)."""

    def __init__(self, path, timeout=120):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def send(self, payload, fds=()):
        data = frame(payload)
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.sendall(data)

    def send_raw(self, data):
        self.sock.sendall(data)

    def recv(self):
        """Next ServerMessage as (kind, fields), or None at EOF."""
        while True:
            if len(self.buf) >= 4:
                n = struct.unpack("<I", self.buf[:4])[0]
                if len(self.buf) >= 4 + n:
                    payload, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    outer = decode(payload)
                    assert len(outer) == 1, outer
                    field, vals = next(iter(outer.items()))
                    return SERVER_FIELDS[field], decode(vals[0])
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                if self.buf:
                    raise AssertionError("EOF inside a frame")
                return None
            self.buf += chunk

    def hello(self):
        self.send(hello())
        kind, f = self.recv()
        assert kind == "hello_reply", (kind, f)
        return f

    def close(self):
        self.sock.close()


class Result:
    def __init__(self):
        self.tokens, self.text, self.done, self.error, self.progress = [], b"", None, None, []
        self.t_first = None


def collect(conn, rid, results=None, stop_after=None):
    """Read until request rid ends; returns its Result (others' messages go to results[rid'])."""
    results = results if results is not None else {}
    res = results.setdefault(rid, Result())
    while res.done is None and res.error is None:
        m = conn.recv()
        assert m is not None, "connection closed before request %d ended" % rid
        kind, f = m
        r = results.setdefault(first(f, 1), Result())
        if kind == "token":
            if r.t_first is None:
                r.t_first = time.monotonic()
            r.tokens.append(first(f, 3))
            r.text += first(f, 2, b"")
            if stop_after and len(r.tokens) >= stop_after and r is res:
                return res
        elif kind == "progress":
            r.progress.append((first(f, 2), first(f, 3)))
        elif kind == "done":
            r.done = f
        elif kind == "error":
            r.error = (first(f, 2), first(f, 3, b"").decode(errors="replace"))
        else:
            raise AssertionError("unexpected %s" % kind)
    return res


def done_double(f, field):
    return struct.unpack("<d", f[field][0])[0] if field in f else 0.0


def memfd_with(data, seal=True, name="doc"):
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if seal:
        import fcntl
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    return fd

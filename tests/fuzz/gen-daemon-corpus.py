#!/usr/bin/env python3
"""gen-daemon-corpus.py: the seed corpus of fuzz-daemon (tests/fuzz/corpus/daemon/).

Each seed is what a client sends: one byte for the write chunk size (the
target writes byte+1 bytes at a time), then framed ClientMessages built with
tests/integration/tkvwire.py. Rerun after a protocol change:
  tests/fuzz/gen-daemon-corpus.py
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import tkvwire as w  # noqa: E402

OUT = os.path.join(HERE, "corpus", "daemon")


def fr(*payloads):
    return b"".join(w.frame(p) for p in payloads)


def gen_fields(rid, extra):
    """A Generate with a chat message and extra raw field bytes."""
    chat = w.f_bytes(2, w.f_bytes(1, w.f_varint(1, 2) + w.f_bytes(2, b"hello there")))
    return w.f_bytes(2, w.f_varint(1, rid) + chat + extra)


def f_float(field, v):
    return w.varint(field << 3 | 5) + struct.pack("<f", v)


def with_policy(msg, policy):
    """msg (a ClientMessage holding a Generate) with Generate.context_policy set."""
    assert msg[0] == 0x12
    i, n, shift = 1, 0, 0
    while True:
        b = msg[i]
        n |= (b & 0x7f) << shift
        i += 1
        shift += 7
        if b < 0x80:
            break
    return w.f_bytes(2, msg[i:i + n] + w.f_varint(9, policy))


def session_msg(field, rid, name):
    return w.f_bytes(field, w.f_varint(1, rid) + (w.f_bytes(2, name) if name is not None else b""))


H = w.hello()
LONG = "word " * 200
SEEDS = {
    "hello": (255, fr(H)),
    "chat-status": (255, fr(H, w.generate(1, user="What is the capital of France?"), w.status(2))),
    "raw-cancel": (7, fr(H, w.generate(3, raw=b"Once upon a time"), w.cancel(3), w.cancel(4))),
    "stops-sampling": (255, fr(H, gen_fields(5, w.f_bytes(5, f_float(1, 0.7) + w.f_varint(2, 40) +
                                                          f_float(3, 0.9) + f_float(5, 1.1) +
                                                          w.f_varint(6, 64) + w.f_varint(7, 1234)) +
                                            w.f_bytes(7, b"\n\n") + w.f_bytes(7, b"END")))),
    "overflow": (255, fr(H, w.generate(6, user=LONG, max_tokens=4))),
    "truncate-oldest": (255, fr(H, with_policy(w.generate(7, messages=[(1, "Be brief.")] + [(2, LONG), (3, "ok")] * 2 +
                                                          [(2, "And now?")], max_tokens=8), 1))),
    "truncate-raw": (255, fr(H, with_policy(w.generate(8, raw=LONG.encode(), max_tokens=8), 1))),
    "stop-at-limit": (255, fr(H, with_policy(w.generate(9, user="hi", max_tokens=500), 2))),
    "sessions": (255, fr(H, session_msg(5, 10, None), session_msg(6, 11, b"notes"), session_msg(7, 12, b"notes"),
                         session_msg(6, 13, b"bad name!"), w.generate(14, user="hi", session="notes"))),
    "attach-no-fd": (255, fr(H, w.generate(15, user="read this", attachments=[("a.txt", 0, 5)]))),
    "no-hello": (255, fr(w.status(1))),
    "bad-version": (255, fr(w.hello(version=99))),
    "garbage": (3, b"\x07\x08\x09garbage-not-protobuf"),
    "too-many": (255, fr(H, *[w.generate(20 + i, user="hi") for i in range(9)], w.generate(20, user="dup"))),
    "id-zero": (255, fr(H, w.status(0))),
    "second-hello": (255, fr(H, H)),
    "huge-length": (255, fr(H) + b"\xff\xff\xff\x7f" + b"x" * 8),
    "truncated": (1, fr(H, w.generate(16, user="cut short"))[:-5]),
    "empty-chat": (255, fr(H, w.f_bytes(2, w.f_varint(1, 17) + w.f_bytes(2, b"")))),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (chunk, data) in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(bytes([chunk]) + data)


if __name__ == "__main__":
    main()

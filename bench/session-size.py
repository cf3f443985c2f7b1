#!/usr/bin/env python3
"""session-size.py: issue 23's table: session file bytes against the same tokens in f16.

Usage: bench/session-size.py --daemon BUILD/daemon/turbokvd [--kv SPEC] [--words 1,30,280,800]
                             [--threads N] [--ctx 8192]

One daemon (default model, --kv as given, default the daemon's default) in a temporary state
directory; for each --words count, one raw-text request of that many words of deterministic
pseudo-text in its own session (max_tokens 1); SIGTERM saves every session. For each file: the
tokens its cache holds (n_kv, header bytes 40..43), its bytes, the same n_kv tokens as f16 (n_kv x
layers x kv-heads x head_dim x 2 (K, V) x 2 bytes, the shape from the file's header), their ratio,
and the ideal ratio bits-per-value / 16 of the KV type (--bits, default 4.5 for pk5:tq3.5_nc at
head_dim 64). Prints a markdown table. Sizes do not depend on the machine's load.
"""
import argparse
import importlib.util
import os
import shutil
import struct
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("session_bench", os.path.join(HERE, "session-bench.py"))
sb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sb)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--kv", default="pk5:tq3.5_nc")
    ap.add_argument("--bits", type=float, default=4.5, help="bits per value of --kv")
    ap.add_argument("--words", default="1,30,280,800")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ctx", type=int, default=8192)
    args = ap.parse_args()
    counts = [int(x) for x in args.words.split(",")]
    tmp = tempfile.mkdtemp(prefix="tkv-sesssize-")
    rows = []
    try:
        d = sb.Daemon(args.daemon, tmp, args.kv, args.threads, args.ctx)
        for i, n in enumerate(counts):
            text = "Hello" if n == 1 else sb.pseudo_text(n, 23 + i)
            sb.generate(d, i + 1, text, "s%d" % n)
        d.stop()
        sdir = os.path.join(tmp, "state", "sessions", str(os.getuid()))
        for n in counts:
            data = open(os.path.join(sdir, "s%d.tkvs" % n), "rb").read()
            version, = struct.unpack_from("<I", data, 8)
            layers, kv_heads, head_dim, n_tokens, n_kv = struct.unpack_from("<5I", data, 24)
            f16 = n_kv * layers * kv_heads * head_dim * 2 * 2
            rows.append((n_kv, len(data), f16, version))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ideal = args.bits / 16
    print("| tokens (n_kv) | file bytes | f16 bytes | file / f16 | bits/value / 16 | over the ideal |")
    print("|---|---|---|---|---|---|")
    for n_kv, size, f16, version in rows:
        r = size / f16
        print("| %d | %d | %d | %.3f | %.3f | %+.0f%% |" % (n_kv, size, f16, r, ideal, (r / ideal - 1) * 100))
    print("(session file version %d, --kv %s)" % (rows[0][3], args.kv))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""check-layers.py: fail on any #include that points up or sideways.

The layers, bottom up (docs/architecture.md):

  base/                        errors, cleanup, checksums, fp16, bit packing
  kernels/ (its own headers)   layouts every backend shares (weight blocks,
                               TurboQuant code records, KV formats)
  kernels/cpu/, kernels/cuda/  the backends' kernels (siblings)
  engine/gguf/                 the model file format
  engine/text/, engine/codec/  tokenizers and chat; codecs (siblings)
  engine/kv/                   KV types and caches
  engine/session/, engine/backend/   session files; backends (siblings)
  engine/model/                the forward pass, the sampler
  daemon/, clients/ (+ include/), tools/, bench/   the programs (siblings)

ipc/ and proto/ sit on base/ alone. A file may include its own folder and
any folder of a lower layer; tests/ may include anything. Usage:
check-layers.py [ROOT]; prints each offending line and exits 1, else 0.
"""
import os
import re
import sys

# (path prefix, rank, what it may include besides its own folder: None =
# every lower rank, else exactly these prefixes)
LAYERS = [
    ("base/", 0, None),
    ("kernels/cpu/", 2, None),
    ("kernels/cuda/", 2, None),
    ("kernels/", 1, None),
    ("ipc/", 3, ["base/"]),
    ("proto/", 3, ["base/"]),
    ("engine/gguf/", 3, None),
    ("engine/text/", 4, None),
    ("engine/codec/", 4, None),
    ("engine/kv/", 5, None),
    ("engine/session/", 6, None),
    ("engine/backend/", 6, None),
    ("engine/model/", 7, None),
    ("daemon/", 8, None),
    ("clients/", 8, None),
    ("include/", 8, None),
    ("tools/", 8, None),
    ("bench/", 8, None),
    ("tests/", 9, None),
]
SOURCE = re.compile(r"\.(c|h|cu)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    for prefix, rank, allowed in LAYERS:
        if path.startswith(prefix):
            return prefix, rank, allowed
    return None


def resolve(root, src, name):
    """The include as a path from the root: beside src first, then from the root."""
    here = os.path.normpath(os.path.join(os.path.dirname(src), name))
    if os.path.exists(os.path.join(root, here)):
        return here
    return os.path.normpath(name)


def check(root):
    bad = []
    for top in sorted({p.split("/")[0] for p, _, _ in LAYERS}):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not SOURCE.search(f):
                    continue
                src = os.path.relpath(os.path.join(dirpath, f), root)
                own = layer_of(src)
                if own is None or own[0] == "tests/":
                    continue
                with open(os.path.join(root, src), errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        dst = resolve(root, src, m.group(1))
                        target = layer_of(dst)
                        if target is None or target[0] == own[0]:
                            continue
                        if own[2] is not None:
                            ok = any(dst.startswith(a) for a in own[2])
                        else:
                            ok = target[1] < own[1] and target[0] not in ("ipc/", "proto/") or (
                                target[0] in ("ipc/", "proto/") and own[1] >= 8)
                        if not ok:
                            bad.append(f"{src}:{n}: includes {dst} ({own[0]} may not"
                                       f" include {target[0]})")
    return bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = check(os.path.abspath(root))
    for b in bad:
        print(b)
    if bad:
        print(f"check-layers: {len(bad)} include(s) point up or sideways (docs/architecture.md)")
        return 1
    print("check-layers: every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Regenerate tests/data/kvquant/ for tests/unit/test-kvtype.c.

The reference is gguf-py (pip install gguf==0.19.0 numpy): gguf.quants.quantize()
with GGMLQuantizationType.Q8_0 / Q4_0, an implementation of ggml's reference
quantizers independent of ours, and numpy's float16 conversion.

Files (all little-endian, no headers; N_VEC head vectors of DIM = 128 values):
    vectors.f32   N_VEC * DIM float32, the inputs
    q8_0.bin      N_VEC * DIM / 32 blocks of 34 bytes (fp16 d, 32 int8)
    q4_0.bin      N_VEC * DIM / 32 blocks of 18 bytes (fp16 d, 16 nibble pairs)
    f16.bin       N_VEC * DIM binary16

Rows: Gaussian, Gaussian with outlier channels (key-like), tiny and huge scales
(a q8_0 scale above the fp16 range stores inf, one below it stores 0), exact
rounding ties for both formats, +-max ties, all-zero and single-value blocks.

Usage: scripts/gen-kvquant-golden.py [outdir]   (default tests/data/kvquant)
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

SEED = 20260522
DIM = 128
N_RANDOM = 24


def tie_rows():
    rows = []
    # q8_0: amax = 127 gives d = 1, 1/d = 1: values k + 0.5 are exact ties
    # (roundf: away from zero).
    r = np.zeros(DIM, np.float32)
    for b in range(DIM // 32):
        blk = np.array([127.0] + [(k % 100) - 49.5 for k in range(31)], np.float32)
        r[b * 32:(b + 1) * 32] = blk if b % 2 == 0 else -blk
    rows.append(r)
    # q4_0: max = -8 gives d = 1: x + 8.5 lands exactly on integers and
    # halves; max = +8 gives d = -1 (codes flip).
    r = np.zeros(DIM, np.float32)
    for b in range(DIM // 32):
        steps = np.array([-8.0] + [-8.0 + 0.5 * k for k in range(31)], np.float32)
        r[b * 32:(b + 1) * 32] = steps if b % 2 == 0 else -steps
    rows.append(r)
    # +-max ties: the first of equal magnitudes sets the sign of q4_0's d.
    r = np.linspace(-1, 1, DIM).astype(np.float32)
    r[0], r[5] = 3.0, -3.0
    r[32], r[40] = -3.0, 3.0
    rows.append(r)
    # zero blocks, a single nonzero value, a negative-only block.
    r = np.zeros(DIM, np.float32)
    r[40] = -0.25
    r[96:128] = -np.arange(1, 33, dtype=np.float32)
    rows.append(r)
    return rows


def scaled_rows(rng):
    rows = []
    for scale in (1e-30, 1e-6, 1e-3, 1e3, 6e4, 1e7):
        rows.append((rng.standard_normal(DIM) * scale).astype(np.float32))
    return rows


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), '..', 'tests', 'data', 'kvquant')
    os.makedirs(outdir, exist_ok=True)
    rng = np.random.default_rng(SEED)

    rows = []
    for i in range(N_RANDOM):
        x = rng.standard_normal(DIM).astype(np.float32)
        if i % 2:  # key-like: a few channels 10-30x larger
            ch = rng.choice(DIM, 4, replace=False)
            x[ch] *= rng.uniform(10, 30, 4).astype(np.float32)
        rows.append(x)
    rows += tie_rows()
    rows += scaled_rows(rng)
    x = np.stack(rows).astype(np.float32)

    with np.errstate(over='ignore'):
        q8 = quants.quantize(x, T.Q8_0)
        q4 = quants.quantize(x, T.Q4_0)
        f16 = x.astype(np.float16)
    assert q8.shape == (len(rows), DIM // 32 * 34), q8.shape
    assert q4.shape == (len(rows), DIM // 32 * 18), q4.shape

    x.astype('<f4').tofile(os.path.join(outdir, 'vectors.f32'))
    q8.astype(np.uint8).tofile(os.path.join(outdir, 'q8_0.bin'))
    q4.astype(np.uint8).tofile(os.path.join(outdir, 'q4_0.bin'))
    f16.astype('<f2').tofile(os.path.join(outdir, 'f16.bin'))
    print(f'{len(rows)} vectors of {DIM} -> {outdir}')


if __name__ == '__main__':
    main()

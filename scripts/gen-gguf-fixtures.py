#!/usr/bin/env python3
"""gen-gguf-fixtures.py: GGUF test data written by an independent implementation.

Writes, with gguf-py (pip install gguf==0.19.0 numpy):

  tests/data/gguf/all-types.gguf      every metadata value type, nested arrays,
                                      general.alignment = 64, five small tensors
  tests/data/gguf/all-types.expected  what gguf-py's reader sees in that file:
                                      header, data offset, tensor table
  tests/fuzz/corpus/gguf/*            small seeds for fuzz-gguf: valid files and
                                      broken variants of them

The kv values below are repeated as constants in tests/unit/test-gguf.c; change
both together. Run from the repository root: python3 scripts/gen-gguf-fixtures.py
"""

import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGUFValueType as VT
from gguf import GGMLQuantizationType as QT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "gguf")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus", "gguf")


def write_all_types(path):
    w = gguf.GGUFWriter(path, arch="test")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_uint64("t.u64", 1 << 40)
    w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 0.1)
    w.add_key_value("t.arr.u8", [1, 2, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("t.arr.i8", [-1, 0, 127], VT.ARRAY, sub_type=VT.INT8)
    w.add_key_value("t.arr.u16", [1, 65535], VT.ARRAY, sub_type=VT.UINT16)
    w.add_key_value("t.arr.i16", [-32768, 32767], VT.ARRAY, sub_type=VT.INT16)
    w.add_key_value("t.arr.u32", [7, 8, 9, 10], VT.ARRAY, sub_type=VT.UINT32)
    w.add_key_value("t.arr.i32", [-7, 8], VT.ARRAY, sub_type=VT.INT32)
    w.add_key_value("t.arr.f32", [0.5, -2.0, 3.25], VT.ARRAY, sub_type=VT.FLOAT32)
    w.add_key_value("t.arr.bool", [True, False, True], VT.ARRAY, sub_type=VT.BOOL)
    w.add_key_value("t.arr.str", ["a", "", "xyz"], VT.ARRAY, sub_type=VT.STRING)
    w.add_key_value("t.arr.u64", [1 << 63], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("t.arr.i64", [-(1 << 63), 5], VT.ARRAY, sub_type=VT.INT64)
    w.add_key_value("t.arr.f64", [2.5], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_key_value("t.arr.nested", [[1, 2], [3]], VT.ARRAY)
    w.add_key_value("t.arr.nested_str", [["p"], ["q", "r"]], VT.ARRAY)

    # numpy shape (rows, cols) is GGUF ne = [cols, rows]
    w.add_tensor("f32", (np.arange(12, dtype=np.float32) * 0.25).reshape(3, 4))
    w.add_tensor("f16", np.arange(8, dtype=np.float16))
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(2, 32)
    w.add_tensor("q8_0", gguf.quants.quantize(x, QT.Q8_0), raw_dtype=QT.Q8_0)
    y = np.linspace(0.0, 2.0, 64, dtype=np.float32).reshape(1, 64)
    w.add_tensor("q4_1", gguf.quants.quantize(y, QT.Q4_1), raw_dtype=QT.Q4_1)
    # gguf-py cannot quantize Q4_K: one block of raw bytes (shape from bytes)
    z = (np.arange(144, dtype=np.uint32) * 37 % 251).astype(np.uint8).reshape(1, 144)
    w.add_tensor("q4_k", z, raw_dtype=QT.Q4_K)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_expected(gguf_path, out_path):
    """The file as gguf-py's reader sees it: one fact per line."""
    r = gguf.GGUFReader(gguf_path)
    lines = [
        "version %d" % int(r.fields["GGUF.version"].contents()),
        "n_kv %d" % int(r.fields["GGUF.kv_count"].contents()),
        "n_tensors %d" % len(r.tensors),
        "alignment %d" % r.alignment,
        "data_offset %d" % r.data_offset,
        "file_size %d" % os.path.getsize(gguf_path),
    ]
    for t in r.tensors:
        ne = [int(d) for d in t.shape] + [1] * (4 - len(t.shape))
        lines.append("tensor %s %d %d %d %d %d %d %d %d" % (
            t.name, int(t.tensor_type), len(t.shape), ne[0], ne[1], ne[2], ne[3],
            t.data_offset - r.data_offset, t.n_bytes))
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b)) + b


def header(version, n_tensors, n_kv):
    return b"GGUF" + u32(version) + u64(n_tensors) + u64(n_kv)


def tensor_info(name, ne, ttype, offset):
    return gstr(name) + u32(len(ne)) + b"".join(u64(n) for n in ne) + u32(ttype) + u64(offset)


def pad(b, a=32):
    return b + b"\0" * (-len(b) % a)


def write_corpus(valid):
    os.makedirs(CORPUS, exist_ok=True)
    seeds = {}
    seeds["valid-all-types"] = valid
    small = header(3, 1, 1) + gstr("general.alignment") + u32(4) + u32(32)
    small += tensor_info("w", [4, 2], 0, 0)
    small = pad(small) + struct.pack("<8f", *range(8))
    seeds["valid-small"] = small
    seeds["valid-v2-empty"] = header(2, 0, 0)
    seeds["trunc-header"] = valid[:20]
    seeds["trunc-kv"] = valid[:600]
    seeds["trunc-data"] = valid[:-100]
    seeds["bad-magic"] = b"GGUG" + valid[4:64]
    seeds["version-1"] = header(1, 0, 0)
    seeds["huge-n-kv"] = header(3, 0, 1 << 62) + valid[24:64]
    seeds["huge-str"] = header(3, 0, 1) + gstr("k") + u32(8) + u64(1 << 62) + b"k" * 16
    seeds["huge-array"] = header(3, 0, 1) + gstr("a") + u32(9) + u32(4) + u64(1 << 62)
    deep = header(3, 0, 1) + gstr("deep") + u32(9)
    for _ in range(12):
        deep += u32(9) + u64(1)
    seeds["deep-nesting"] = deep + u32(0) + u64(1) + b"\1"
    ov = header(3, 2, 0) + tensor_info("a", [8], 0, 0) + tensor_info("b", [8], 0, 0)
    seeds["overlap"] = pad(ov) + b"\0" * 64
    seeds["misaligned"] = pad(header(3, 1, 0) + tensor_info("a", [8], 0, 4)) + b"\0" * 64
    seeds["bad-type"] = pad(header(3, 1, 0) + tensor_info("a", [32], 99, 0)) + b"\0" * 64
    seeds["dims-5"] = pad(header(3, 1, 0) + tensor_info("a", [1, 1, 1, 1, 1], 0, 0)) + b"\0" * 64
    for name, data in seeds.items():
        assert len(data) < 4096, name
        with open(os.path.join(CORPUS, name + ".gguf"), "wb") as f:
            f.write(data)


def main():
    os.makedirs(DATA, exist_ok=True)
    path = os.path.join(DATA, "all-types.gguf")
    write_all_types(path)
    write_expected(path, os.path.join(DATA, "all-types.expected"))
    with open(path, "rb") as f:
        write_corpus(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())

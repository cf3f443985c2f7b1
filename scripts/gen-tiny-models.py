#!/usr/bin/env python3
"""Regenerate tests/data/tiny/ for tests/unit/test-model-tiny.c.

Tiny random-weight models that reach the forward-pass paths the default
model does not (qwen2 biases and NEOX rope, a separate output head, linear
rope scaling, rope_freqs factors, F32/F16/BF16 and K-quant weights, no
GQA, key_length != dim / n_heads, qwen3's Q/K head norms, gemma3's
scaled embeddings, post-norms, GELU FFN and local/global layers), each with the logits of an exact
float64 numpy forward pass over the weights as stored (dequantized with
gguf-py), and a few small broken files for the loader's error paths.

Needs gguf-py 0.19.0 and numpy (pip install gguf==0.19.0 numpy). Output is
deterministic (fixed seeds; GGUFWriter writes keys and tensors in order).

<name>.gguf     the model (minimal gpt2 byte-level tokenizer metadata,
                no merges: model_load does not read it)
<name>.logits   the reference:
                  model <name>
                  tokens <n> <id> ...
                  vocab <n_vocab>
                  logits <pos> <n_vocab values, %.7g>     (one line per position)
                  actq <pos> <n_vocab values>             (models with quantized
                      weights: the same pass with each quantized product's
                      input rounded to int8 blocks first, as ggml does)
                  sens <what> <max |logit change|>        (see below)
                "sens" lines are how far the reference moves when one detail
                of the math is changed (rope pairing, scaling, factors, biases,
                the output head), when the weights are not rounded to their
                stored type (unrounded), and when activations are (actq): for
                the record, the test does not read them.

Broken files (small llama/qwen2, 1 layer, F16, no tokenizer), each with one defect:
  err-ok.gguf            none (it must load: the others differ by their defect)
  err-arch.gguf          general.architecture "gpt-neox"
  err-missing.gguf       no blk.0.ffn_up.weight
  err-missing-bias.gguf  qwen2 without blk.0.attn_v.bias
  err-shape.gguf         blk.0.attn_k.weight (32, 32) instead of (16, 32)
  err-yarn.gguf          llama.rope.scaling.type "yarn"

Usage: scripts/gen-tiny-models.py [outdir]   (default tests/data/tiny)
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

SEED = 20260601
QK_K = 256
TOKENS = [1, 17, 200, 3, 3, 99, 255, 0, 128, 42, 7, 64]

# ---- models ----------------------------------------------------------------


def qwen2_f32_types(name):
    return T.F32


def llama_f16_types(name):
    return T.Q8_0 if name == "output.weight" else T.F16


def llama_kquant_types(name):
    """A Q4_K_M-like mix: BF16 attention, K-quant feed-forward, Q6_K embeddings."""
    if name == "token_embd.weight":
        return T.Q6_K
    if name == "blk.1.attn_v.weight":
        return T.Q6_K  # q/k/v of mixed activation formats: no grouped matmul
    if name == "blk.0.ffn_down.weight" or name == "blk.1.ffn_up.weight":
        return T.Q6_K
    if ".ffn_" in name:
        return T.Q4_K
    return T.BF16


MODELS = [
    # qwen2: F32, QKV biases, NEOX rope, tied embeddings, GQA 2, freq_base 1e6
    dict(name="qwen2-f32", arch="qwen2", n_layers=2, dim=64, n_heads=4, n_kv_heads=2,
         head_dim=16, ff=96, vocab=256, ctx=128, eps=1e-6, base=1e6, tied=True,
         biases=True, types=qwen2_f32_types),
    # llama: F16, separate Q8_0 output head, no GQA, linear rope scaling x2
    dict(name="llama-f16", arch="llama", n_layers=2, dim=64, n_heads=4, n_kv_heads=4,
         head_dim=16, ff=128, vocab=256, ctx=128, eps=1e-5, base=10000.0, tied=False,
         linear=2.0, types=llama_f16_types),
    # llama: BF16 attention + Q4_K/Q6_K ffn, Q6_K tied embeddings, rope_freqs
    # factors, head_dim 32 given by key_length (4 heads x 32 != dim 256)
    dict(name="llama-kquant", arch="llama", n_layers=2, dim=256, n_heads=4, n_kv_heads=2,
         head_dim=32, ff=256, vocab=256, ctx=128, eps=1e-5, base=10000.0, tied=True,
         rope_freqs=True, types=llama_kquant_types),
    # qwen3: F32, per-head Q/K RMSNorm, no biases, NEOX rope, separate head, GQA 2
    dict(name="qwen3-f32", arch="qwen3", n_layers=2, dim=64, n_heads=4, n_kv_heads=2,
         head_dim=16, ff=96, vocab=256, ctx=128, eps=1e-6, base=1e6, tied=False,
         qk_norm=True, types=qwen2_f32_types),
    # gemma3: F32, head_dim 32 on 2 heads with 1 kv head, embeddings x sqrt(dim),
    # Q/K head norms, post-attention and post-ffw norms, GELU-tanh FFN, tied head;
    # 6 layers: 5 local (RoPE base 10000), 1 global (base 1e6); window 5 < 12 tokens:
    # the local layers' mask cuts in (q - p < 5 visible, as llama.cpp)
    dict(name="gemma3-f32", arch="gemma3", n_layers=6, dim=64, n_heads=2, n_kv_heads=1,
         head_dim=32, ff=96, vocab=256, ctx=128, eps=1e-6, base=1e6, tied=True,
         qk_norm=True, gemma=True, window=5, types=qwen2_f32_types),
]

# ---- K-quant quantizers (gguf-py 0.19.0 only dequantizes Q4_K / Q6_K) ------
#
# Plain round-to-nearest versions of ggml's formats; the reference uses the
# dequantized bytes, so only the layout has to be right (checked below
# against gguf.quants.dequantize), not llama.cpp's choice of scales.


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def quantize_q4_k(x):
    """x (n, 256) -> (n, 144) blocks: d, dmin, 12 bytes of 6-bit scales/mins, 128 nibbles."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32).astype(np.float64)
    mn = np.maximum(0.0, -sub.min(axis=2))               # (n, 8) subtracted minimum
    scale = (sub.max(axis=2) + mn) / 15.0
    d = f16(scale.max(axis=1) / 63.0)
    dmin = f16(mn.max(axis=1) / 63.0)
    df = np.where(d == 0, 1, d).astype(np.float64)[:, None]
    dminf = np.where(dmin == 0, 1, dmin).astype(np.float64)[:, None]
    sc = np.clip(np.rint(scale / df), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(mn / dminf), 0, 63).astype(np.uint8)
    step = (d.astype(np.float64)[:, None] * sc)[:, :, None]
    off = (dmin.astype(np.float64)[:, None] * m)[:, :, None]
    q = np.clip(np.rint((sub + off) / np.where(step == 0, 1, step)), 0, 15).astype(np.uint8)
    scales = np.zeros((n, 12), dtype=np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    q = q.reshape(n, 4, 2, 32)                            # sub-block 2g: low nibbles of group g
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(n, 128)
    out = np.concatenate([d.reshape(n, 1).view(np.uint8), dmin.reshape(n, 1).view(np.uint8),
                          scales, qs], axis=1)
    expect = (step * q.reshape(n, 8, 32) - off).reshape(n, QK_K)
    return out, expect


def quantize_q6_k(x):
    """x (n, 256) -> (n, 210) blocks: 128 bytes of low nibbles, 64 of high bit pairs,
    16 int8 scales, d."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16).astype(np.float64)
    scale = np.abs(sub).max(axis=2) / 31.0                # (n, 16)
    d = f16(scale.max(axis=1) / 127.0)
    df = np.where(d == 0, 1, d).astype(np.float64)[:, None]
    sc = np.clip(np.rint(scale / df), -128, 127).astype(np.int8)
    step = (d.astype(np.float64)[:, None] * sc)[:, :, None]
    q = np.clip(np.rint(sub / np.where(step == 0, 1, step)), -32, 31).astype(np.int64)
    expect = (step * q).reshape(n, QK_K)
    u = (q + 32).reshape(n, 2, 128).astype(np.uint8)      # halves of 128 values
    lo, hi = u & 0xF, u >> 4
    # element r of a half: low nibble in ql[r % 64] at bit 4 * (r // 64),
    # high bits in qh[r % 32] at bit 2 * (r // 32)
    ql = lo.reshape(n, 2, 2, 64)
    ql = (ql[:, :, 0, :] | (ql[:, :, 1, :] << 4)).reshape(n, 128)
    qh4 = hi.reshape(n, 2, 4, 32)
    qh = qh4[:, :, 0] | (qh4[:, :, 1] << 2) | (qh4[:, :, 2] << 4) | (qh4[:, :, 3] << 6)
    qh = qh.reshape(n, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d.reshape(n, 1).view(np.uint8)], axis=1)
    return out, expect


def store(w, qtype):
    """Weight w (rows, cols) float64 -> (array to write, raw_dtype or None, float64 as stored)."""
    if qtype == T.F32:
        a = w.astype(np.float32)
        return a, None, a.astype(np.float64)
    if qtype == T.F16:
        a = w.astype(np.float16)
        return a, None, a.astype(np.float64)
    if qtype in (T.Q4_K, T.Q6_K):
        rows, cols = w.shape
        assert cols % QK_K == 0
        blocks, expect = (quantize_q4_k if qtype == T.Q4_K else quantize_q6_k)(
            w.reshape(-1, QK_K))
        raw = blocks.reshape(rows, -1)
        deq = gguf.quants.dequantize(raw, qtype).astype(np.float64)
        # our packing must mean what gguf-py (and ggml) read back
        assert np.allclose(deq.reshape(-1, QK_K), expect, rtol=1e-6, atol=1e-7), qtype
        err = np.abs(deq - w).max() / np.abs(w).max()
        assert err < (0.1 if qtype == T.Q4_K else 0.04), (qtype, err)
        return raw, qtype, deq
    raw = gguf.quants.quantize(w.astype(np.float32), qtype)
    return raw, qtype, gguf.quants.dequantize(raw, qtype).astype(np.float64)


def byte_tokens():
    """GPT-2 byte-level vocabulary: the 256 bytes in its printable mapping."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def make_weights(cfg, rng):
    """Float64 weights {name: (rows, cols) or (n,)} with realistic magnitudes."""
    dim, ff, nv = cfg["dim"], cfg["ff"], cfg["vocab"]
    qdim = cfg["n_heads"] * cfg["head_dim"]
    kvdim = cfg["n_kv_heads"] * cfg["head_dim"]

    def mat(rows, cols, gain=1.0):
        return rng.standard_normal((rows, cols)) * (gain / np.sqrt(cols))

    def norm(n):
        return 1.0 + 0.1 * rng.standard_normal(n)

    w = {}
    # tied: the embedding is also the head, logits ~ N(0, 3^2); else unit embeddings
    w["token_embd.weight"] = mat(nv, dim, 3.0) if cfg["tied"] else rng.standard_normal((nv, dim))
    for il in range(cfg["n_layers"]):
        p = f"blk.{il}."
        w[p + "attn_norm.weight"] = norm(dim)
        w[p + "attn_q.weight"] = mat(qdim, dim, 1.5)
        w[p + "attn_k.weight"] = mat(kvdim, dim, 1.5)
        w[p + "attn_v.weight"] = mat(kvdim, dim)
        w[p + "attn_output.weight"] = mat(dim, qdim)
        if cfg.get("biases"):
            w[p + "attn_q.bias"] = 0.5 * rng.standard_normal(qdim)
            w[p + "attn_k.bias"] = 0.5 * rng.standard_normal(kvdim)
            w[p + "attn_v.bias"] = 0.2 * rng.standard_normal(kvdim)
        if cfg.get("qk_norm"):
            w[p + "attn_q_norm.weight"] = norm(cfg["head_dim"])
            w[p + "attn_k_norm.weight"] = norm(cfg["head_dim"])
        if cfg.get("gemma"):
            w[p + "post_attention_norm.weight"] = norm(dim)
            w[p + "post_ffw_norm.weight"] = norm(dim)
        w[p + "ffn_norm.weight"] = norm(dim)
        w[p + "ffn_gate.weight"] = mat(ff, dim)
        w[p + "ffn_up.weight"] = mat(ff, dim)
        w[p + "ffn_down.weight"] = mat(dim, ff)
    w["output_norm.weight"] = norm(dim)
    if not cfg["tied"]:
        w["output.weight"] = mat(nv, dim, 3.0)
    if cfg.get("rope_freqs"):
        # Llama 3.1-style, 1 for the fastest rotation up to 8 for the slowest;
        # spread over all of them so that 12 positions feel the difference
        w["rope_freqs.weight"] = np.geomspace(1.0, 8.0, cfg["head_dim"] // 2)
    return w


def write_model(path, cfg, weights, arch=None, drop=(), reshape=None, extra_kv=None,
                tokenizer=True):
    """Write a GGUF; returns {name: float64 weight as stored}."""
    arch = arch or cfg["arch"]
    wr = gguf.GGUFWriter(path, arch)
    wr.add_name(cfg["name"])
    wr.add_block_count(cfg["n_layers"])
    wr.add_context_length(cfg["ctx"])
    wr.add_embedding_length(cfg["dim"])
    wr.add_feed_forward_length(cfg["ff"])
    wr.add_head_count(cfg["n_heads"])
    wr.add_head_count_kv(cfg["n_kv_heads"])
    if cfg["head_dim"] * cfg["n_heads"] != cfg["dim"]:
        wr.add_key_length(cfg["head_dim"])
        wr.add_value_length(cfg["head_dim"])
    wr.add_rope_dimension_count(cfg["head_dim"])
    wr.add_layer_norm_rms_eps(cfg["eps"])
    wr.add_rope_freq_base(cfg["base"])
    if cfg.get("linear"):
        wr.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        wr.add_rope_scaling_factor(cfg["linear"])
    if cfg.get("window"):
        wr.add_sliding_window(cfg["window"])
    if extra_kv:
        extra_kv(wr)
    if tokenizer:
        wr.add_tokenizer_model("gpt2")
        wr.add_tokenizer_pre("default")
        wr.add_token_list(byte_tokens()[: cfg["vocab"]])
        wr.add_token_types([1] * cfg["vocab"])
        wr.add_bos_token_id(1)
        wr.add_eos_token_id(2)

    stored = {}
    for name, w in weights.items():
        if name in drop:
            continue
        if w.ndim == 1:
            a = w.astype(np.float32)
            wr.add_tensor(name, a)
            stored[name] = a.astype(np.float64)
            continue
        if reshape and name in reshape:
            w = reshape[name]
        a, raw, deq = store(w, cfg["types"](name))
        wr.add_tensor(name, a, raw_dtype=raw)
        stored[name] = deq
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return stored


# ---- the float64 reference forward pass ------------------------------------


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x) + eps) * w


def rope(v, pos, cfg, neox, freq_scale, factors, base=None):
    """Rotate v (n_heads, head_dim) for position pos."""
    n_rot = cfg["head_dim"]
    half = n_rot // 2
    base = cfg["base"] if base is None else base
    inv = base ** (-2.0 * np.arange(half) / n_rot) * freq_scale / factors
    c, s = np.cos(pos * inv), np.sin(pos * inv)
    out = v.copy()
    ia = np.arange(half) if neox else 2 * np.arange(half)
    ib = ia + (half if neox else 1)
    a, b = v[:, ia], v[:, ib]
    out[:, ia] = a * c - b * s
    out[:, ib] = a * s + b * c
    return out


def act_q8_0(x):
    """x (n,) as ggml's quantize_row_q8_0_ref leaves it: d = amax / 127, q = roundf(x / d),
    stored d a half."""
    b = x.reshape(-1, 32).astype(np.float32)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    idv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    prod = b * idv
    q = np.sign(prod) * np.floor(np.abs(prod) + np.float32(0.5))   # roundf: ties away from 0
    return (q * d.astype(np.float16).astype(np.float64)).reshape(-1)


def act_q8_k(x):
    """x (n,) as ggml's quantize_row_q8_K_ref leaves it: iscale = -127 / max, ties to even."""
    b = x.reshape(-1, QK_K).astype(np.float32)
    mx = b[np.arange(b.shape[0]), np.abs(b).argmax(axis=1)][:, None]
    iscale = np.divide(np.float32(-127), mx, out=np.zeros_like(mx), where=mx != 0)
    q = np.minimum(np.rint(iscale * b), 127)                        # np.rint: ties to even
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (q * d.astype(np.float64)).reshape(-1)


ACT_QUANT = {T.Q8_0: act_q8_0, T.Q4_0: act_q8_0, T.Q4_K: act_q8_k, T.Q6_K: act_q8_k}


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(cfg, w, tokens, neox=None, freq_scale=None, use_factors=True, use_biases=True,
            head=None, actq=False, use_qk_norm=True, local_base=True, gelu=True):
    """Logits (n, vocab) of every position, causal, float64.

    actq: round the input of each product with quantized weights to int8
    blocks first (Q8_0 for Q8_0 weights, Q8_K for K-quants) as ggml and our
    matmul do; otherwise exact.
    """
    def mm(name, x):
        if actq and name in ACT_QUANT_OF:
            x = ACT_QUANT_OF[name](x)
        return w[name] @ x

    ACT_QUANT_OF = {name: ACT_QUANT[cfg["types"](name)] for name in w
                    if w[name].ndim == 2 and cfg["types"](name) in ACT_QUANT}
    nh, nkv, hd = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    eps = cfg["eps"]
    neox = cfg["arch"] != "llama" if neox is None else neox
    gemma = cfg.get("gemma", False)
    if freq_scale is None:
        freq_scale = 1.0 / cfg["linear"] if cfg.get("linear") else 1.0
    factors = w["rope_freqs.weight"] if use_factors and "rope_freqs.weight" in w else 1.0
    n = len(tokens)
    x = w["token_embd.weight"][tokens].copy()             # (n, dim)
    if gemma:
        x *= np.sqrt(cfg["dim"])
    for il in range(cfg["n_layers"]):
        p = f"blk.{il}."
        # gemma3: 5 local layers (base 10000, window) then 1 global
        local = gemma and il % 6 != 5
        base = 10000.0 if local and local_base else cfg["base"]
        win = cfg["window"] if local else None
        ks, vs = [], []
        att = np.zeros((n, nh * hd))
        for t in range(n):
            h = rmsnorm(x[t], w[p + "attn_norm.weight"], eps)
            q = mm(p + "attn_q.weight", h)
            k = mm(p + "attn_k.weight", h)
            v = mm(p + "attn_v.weight", h)
            if use_biases and p + "attn_q.bias" in w:
                q = q + w[p + "attn_q.bias"]
                k = k + w[p + "attn_k.bias"]
                v = v + w[p + "attn_v.bias"]
            q, k = q.reshape(nh, hd), k.reshape(nkv, hd)
            if use_qk_norm and p + "attn_q_norm.weight" in w:
                q = np.stack([rmsnorm(r, w[p + "attn_q_norm.weight"], eps) for r in q])
                k = np.stack([rmsnorm(r, w[p + "attn_k_norm.weight"], eps) for r in k])
            q = rope(q, t, cfg, neox, freq_scale, factors, base)
            ks.append(rope(k, t, cfg, neox, freq_scale, factors, base))
            vs.append(v.reshape(nkv, hd))
            K, V = np.stack(ks), np.stack(vs)               # (t+1, nkv, hd)
            if win is not None:                             # positions t - win + 1 .. t
                K, V = K[max(0, t - win + 1):], V[max(0, t - win + 1):]
            for hh in range(nh):
                g = hh // (nh // nkv)
                sc = K[:, g, :] @ q[hh] / np.sqrt(hd)
                pr = np.exp(sc - sc.max())
                pr /= pr.sum()
                att[t, hh * hd:(hh + 1) * hd] = pr @ V[:, g, :]
        o = np.stack([mm(p + "attn_output.weight", a) for a in att])
        if gemma:
            o = np.stack([rmsnorm(r, w[p + "post_attention_norm.weight"], eps) for r in o])
        x = x + o
        for t in range(n):
            h = rmsnorm(x[t], w[p + "ffn_norm.weight"], eps)
            g = mm(p + "ffn_gate.weight", h)
            u = mm(p + "ffn_up.weight", h)
            a = gelu_tanh(g) * u if gemma and gelu else g / (1.0 + np.exp(-g)) * u
            f = mm(p + "ffn_down.weight", a)
            if gemma:
                f = rmsnorm(f, w[p + "post_ffw_norm.weight"], eps)
            x[t] = x[t] + f
    if head is not None:
        return np.stack([head @ rmsnorm(x[t], w["output_norm.weight"], eps) for t in range(n)])
    out = "output.weight" if "output.weight" in w else "token_embd.weight"
    return np.stack([mm(out, rmsnorm(x[t], w["output_norm.weight"], eps)) for t in range(n)])


def write_logits(path, cfg, logits, logits_actq, sens):
    with open(path, "w") as f:
        f.write(f"model {cfg['name']}\n")
        f.write(f"tokens {len(TOKENS)} " + " ".join(map(str, TOKENS)) + "\n")
        f.write(f"vocab {cfg['vocab']}\n")
        for pos, row in enumerate(logits):
            f.write(f"logits {pos} " + " ".join(f"{v:.7g}" for v in row) + "\n")
        if logits_actq is not None:
            for pos, row in enumerate(logits_actq):
                f.write(f"actq {pos} " + " ".join(f"{v:.7g}" for v in row) + "\n")
        for what, v in sens:
            f.write(f"sens {what} {v:.6g}\n")


def sensitivities(cfg, w, ref, raw):
    """Max |change| of the logits when one detail of the math is altered."""
    out = [("rope_pairing", forward(cfg, w, TOKENS, neox=cfg["arch"] == "llama"))]
    if cfg.get("qk_norm"):
        out.append(("qk_norm", forward(cfg, w, TOKENS, use_qk_norm=False)))
    if cfg.get("gemma"):
        out.append(("local_rope_base", forward(cfg, w, TOKENS, local_base=False)))
        out.append(("gelu", forward(cfg, w, TOKENS, gelu=False)))
        # the window one wider (q - p <= W visible): the off-by-one the test must catch
        out.append(("window_plus_one", forward(dict(cfg, window=cfg["window"] + 1), w, TOKENS)))
    if cfg.get("linear"):
        out.append(("rope_scaling", forward(cfg, w, TOKENS, freq_scale=1.0)))
    if "rope_freqs.weight" in w:
        out.append(("rope_freqs", forward(cfg, w, TOKENS, use_factors=False)))
    if cfg.get("biases"):
        out.append(("biases", forward(cfg, w, TOKENS, use_biases=False)))
    if not cfg["tied"]:
        out.append(("tied_head", forward(cfg, w, TOKENS, head=w["token_embd.weight"])))
    # the weights before rounding to the stored type: the quantization's share
    out.append(("unrounded", forward(cfg, raw, TOKENS)))
    return [(k, np.abs(v - ref).max()) for k, v in out]


# ---- broken files ------------------------------------------------------------


def write_broken(outdir):
    base = dict(name="err", arch="llama", n_layers=1, dim=32, n_heads=2, n_kv_heads=1,
                head_dim=16, ff=32, vocab=32, ctx=64, eps=1e-5, base=10000.0, tied=True,
                types=lambda name: T.F16)
    rng = np.random.default_rng(SEED + 100)
    w = make_weights(base, rng)
    qcfg = dict(base, arch="qwen2", biases=True)
    qw = make_weights(qcfg, np.random.default_rng(SEED + 101))

    def write(name, cfg, weights, **kw):
        write_model(os.path.join(outdir, name), cfg, weights, tokenizer=False, **kw)

    write("err-ok.gguf", base, w)
    write("err-arch.gguf", base, w, arch="gpt-neox")
    write("err-missing.gguf", base, w, drop={"blk.0.ffn_up.weight"})
    write("err-missing-bias.gguf", qcfg, qw, drop={"blk.0.attn_v.bias"})
    write("err-shape.gguf", base, w,
          reshape={"blk.0.attn_k.weight": rng.standard_normal((32, 32)) / 8})

    def yarn(wr):
        wr.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        wr.add_rope_scaling_factor(4.0)

    write("err-yarn.gguf", base, w, extra_kv=yarn)


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tiny")
    os.makedirs(outdir, exist_ok=True)
    for i, cfg in enumerate(MODELS):
        rng = np.random.default_rng(SEED + i)
        raw = make_weights(cfg, rng)
        stored = write_model(os.path.join(outdir, cfg["name"] + ".gguf"), cfg, raw)
        ref = forward(cfg, stored, TOKENS)
        sens = sensitivities(cfg, stored, ref, raw)
        actq = None
        if any(cfg["types"](k) in ACT_QUANT for k, v in stored.items() if v.ndim == 2):
            actq = forward(cfg, stored, TOKENS, actq=True)
            sens.append(("actq", np.abs(actq - ref).max()))
        write_logits(os.path.join(outdir, cfg["name"] + ".logits"), cfg, ref, actq, sens)
        print(f"{cfg['name']}: max |logit| {np.abs(ref).max():.3f}, std {ref.std():.3f}, "
              + ", ".join(f"{k} {v:.3g}" for k, v in sens))
    write_broken(outdir)


if __name__ == "__main__":
    main()

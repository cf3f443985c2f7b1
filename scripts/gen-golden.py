#!/usr/bin/env python3
# gen-golden.py: writes the independent reference data under tests/data/golden/
# (tokenizer cases, logits, greedy continuations) using llama.cpp through
# llama-cpp-python. Run it with the venv made by scripts/llamacpp-build.sh:
#
#   /opt/turbokv-ref/venv/bin/python scripts/gen-golden.py [MODEL] [--out DIR]
#
# MODEL defaults to ~/.cache/turbokv/models/SmolLM2-135M-Instruct.Q4_1.gguf.
# The output is deterministic (CPU, 2 threads, greedy argmax), so reruns with
# the same llama.cpp version and model give the same files.  Formats are in
# tests/data/golden/README.md.

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile

import numpy as np

DEFAULT_MODEL = os.path.expanduser(
    "~/.cache/turbokv/models/SmolLM2-135M-Instruct.Q4_1.gguf")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "tests", "data", "golden")

N_CTX = 2048
N_THREADS = 2
GREEDY_STEPS = 32
GGML_TYPE_F32 = 0

# ---------------------------------------------------------------------------
# Tokenizer cases: (name, special, text).

LONG_PARAGRAPH = (
    "The history of computing is often told as a sequence of machines, but it "
    "is just as much a history of ideas about representation. Early "
    "mechanical calculators stored numbers as the positions of gears; "
    "punched cards turned data into patterns of holes that a machine could "
    "sense; and the first electronic computers kept their state in vacuum "
    "tubes, mercury delay lines, and later in tiny magnetic cores threaded "
    "by hand. Each step changed not only how fast a computation could run, "
    "but also which problems people thought were worth attempting at all. "
    "When memory was scarce, programmers counted every word, packed flags "
    "into bits, and reused buffers in ways that would look reckless today. "
    "When memory became plentiful, the emphasis shifted towards clarity, "
    "abstraction, and the reuse of code written by others. Modern language "
    "models are, in a sense, a return to the old constraint: a model with "
    "135 million parameters fits in a few hundred megabytes, yet the cache "
    "of keys and values it builds while reading a long document can grow "
    "larger than the weights themselves. Compressing that cache (with "
    "4-bit, 3-bit, or even 2-bit codes) is the same kind of trade-off the "
    "engineers of the 1950s made every day: spend a little arithmetic to "
    "save a lot of storage. Whether the answer quality survives depends on "
    "details that are easy to get wrong, such as how outliers are handled, "
    "whether rotations are applied before quantization, and how the error "
    "accumulates over thousands of tokens. Careful measurement, rather "
    "than intuition, is the only reliable guide. It's tempting to trust a "
    "single benchmark number; don't. Measure perplexity, measure exact-match "
    "on long-context retrieval, and measure speed on the machine you'll "
    "actually ship to, because a 10% gain on one CPU can be a 5% loss on "
    "another. In the end, the goal hasn't changed since 1946: get the right "
    "answer, quickly, within the memory you have.")

TOKENIZE_CASES = [
    ("english_prose", 0,
     "The quick brown fox jumps over the lazy dog. It was a bright cold day "
     "in April, and the clocks were striking thirteen."),
    ("english_sentence_short", 0, "Hello world"),
    ("code_c", 0,
     "#include <stdio.h>\n\nint main(int argc, char **argv)\n{\n"
     "\tfor (int i = 0; i < argc; i++) {\n"
     "\t\tprintf(\"%d: %s\\n\", i, argv[i]);\n\t}\n\treturn 0;\n}\n"),
    ("code_python", 0,
     "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
     "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
     "    return a\n\n\nif __name__ == '__main__':\n"
     "    print([fib(i) for i in range(10)])  # [0, 1, 1, 2, ...]\n"),
    ("code_mixed_tabs", 0,
     "\tif (x) {\n\t\t  y = x*2;\t// tab-aligned\n  \t}\n"),
    ("numbers", 0,
     "1234567 3.14159 1,000,000 -42 +7 0.001 1e-9 0x1F 007"),
    ("dates_times", 0,
     "2024-01-15, 15/01/2024, Jan 15th 2024 at 09:30:00 UTC"),
    ("chinese", 0, "我们今天去公园散步，天气非常好。人工智能正在改变世界。"),
    ("japanese", 0, "こんにちは、世界！東京は日本の首都です。カタカナとひらがな。"),
    ("korean_thai_hindi", 0, "안녕하세요 세계 สวัสดีชาวโลก नमस्ते दुनिया"),
    ("emoji_basic", 0, "I love pizza 🍕 and cats 🐱! 😀😃😄"),
    ("emoji_zwj_skin", 0,
     "family 👨\u200d👩\u200d👧\u200d👦 thumbs 👍🏽 👋🏿 flag 🇫🇷 "
     "heart ❤\ufe0f rainbow 🏳\ufe0f\u200d🌈"),
    ("spaces_long", 0, "a" + " " * 17 + "b" + " " * 2 + "c"),
    ("tabs_long", 0, "x\t\t\t\ty\t z"),
    ("newlines_long", 0, "line one\n\n\n\nline two\n \n\tline three\n"),
    ("crlf", 0, "first\r\nsecond\r\n\r\nthird\r"),
    ("whitespace_only_mix", 0, " \t \n\r\n  \t\t\n   "),
    ("contractions", 0,
     "don't I'll we've she's they're it's can't won't I'd you'll Y'ALL DON'T"),
    ("cyrillic", 0, "Привет, мир! Съешь же ещё этих мягких французских булок."),
    ("greek", 0, "Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία."),
    ("arabic", 0, "مرحبا بالعالم، كيف حالك اليوم؟"),
    ("accented_latin", 0,
     "Café naïve façade résumé Ångström jalapeño Zürich Łódź ĳ ﬁ"),
    ("mixed_scripts", 0, "English русский Ελληνικά العربية 中文 日本語 — mixed!"),
    ("combining_marks", 0, "e\u0301 a\u0308 n\u0303 \u00a0nbsp\u2009thin\u3000ideo"),
    ("special_lookalike_raw", 0,
     "<|im_start|>user\nHello!<|im_end|>\n<|endoftext|>"),
    ("special_lookalike_parsed", 1,
     "<|im_start|>user\nHello!<|im_end|>\n<|endoftext|>"),
    ("special_adjacent_parsed", 1,
     "<|im_start|><|im_end|><|im_start|>assistant\n"),
    ("special_partial_parsed", 1, "<|im_start|>x <|im_st <|endoftext|"),
    ("chat_rendered_parsed", 1,
     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
     "trained by Hugging Face<|im_end|>\n<|im_start|>user\n"
     "What is 2+2?<|im_end|>\n<|im_start|>assistant\n"),
    ("empty", 0, ""),
    ("empty_special", 1, ""),
    ("single_space", 0, " "),
    ("leading_trailing_spaces", 0, "   hello world   "),
    ("leading_newline", 0, "\nHello"),
    ("punctuation_runs", 0, "!!!???... ,,, ;;; --- *** ((( ))) \"\"\" '''"),
    ("urls", 0,
     "See https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#top "
     "or mailto:someone@example.com and http://127.0.0.1:8080/v1/chat"),
    ("markdown_json", 0,
     "## Title\n- item *one*\n- `code`\n```json\n{\"a\": [1, 2.5, null], \"b\": true}\n```"),
    ("control_chars", 0, "bell\x07 esc\x1b[0m del\x7f nul-free"),
    ("long_paragraph", 0, LONG_PARAGRAPH),
]

# ---------------------------------------------------------------------------
# Logits prompts: (name, special, text).  Positions are 0-based token indices.

LOGIT_PROMPTS = [
    ("plain", 0, "The capital of France is"),
    ("plain_long", 0,
     "Once upon a time, in a small village at the edge of a great forest, "
     "there lived a young girl who loved to read. Every evening she would"),
    ("chat", 1,
     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
     "trained by Hugging Face<|im_end|>\n<|im_start|>user\n"
     "Name three primary colors.<|im_end|>\n<|im_start|>assistant\n"),
    ("code", 0,
     "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return"),
    ("numbers", 0, "1, 2, 3, 4, 5, 6, 7, 8,"),
]

# ---------------------------------------------------------------------------
# Greedy chat prompts: (name, messages).

GREEDY_CHATS = [
    ("count", [{"role": "user",
                "content": "Count from 1 to 20, separated by commas."}]),
    ("capital_eos", [{"role": "user",
                      "content": "What is the capital of France? Answer in "
                                 "one sentence, then describe the city."}]),
    ("system_custom", [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "List some uses of the Python language."}]),
    ("multi_turn", [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user",
         "content": "What are the planets of the solar system?"}]),
    ("code", [{"role": "user",
               "content": "Write a Python function that returns the "
                          "factorial of n."}]),
]


def hexs(b):
    return b.hex()


def ids_str(ids):
    return " ".join(str(int(t)) for t in ids)


def top10(row):
    """The 10 highest logits of a row, descending (ties: lower id first)."""
    idx = np.lexsort((np.arange(row.shape[0]), -row.astype(np.float64)))[:10]
    return " ".join("%d:%.6f" % (int(i), float(row[i])) for i in idx)


def open_model(llama_cpp, path, vocab_only=False):
    return llama_cpp.Llama(
        model_path=path, n_ctx=N_CTX, n_batch=512, n_ubatch=512,
        n_threads=N_THREADS, n_threads_batch=N_THREADS, logits_all=True,
        type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, flash_attn=False,
        vocab_only=vocab_only, seed=0, verbose=False)


def write_tokenize(llm, out):
    lines = []
    for name, special, text in TOKENIZE_CASES:
        b = text.encode("utf-8")
        ids = llm.tokenize(b, add_bos=False, special=bool(special))
        back = llm.detokenize(ids, special=bool(special))
        if back != b:       # byte-level BPE must round-trip exactly
            raise SystemExit("round-trip mismatch in case %s: %r != %r"
                             % (name, back, b))
        lines += ["case " + name, "special %d" % special,
                  "hex " + hexs(b), "ids " + ids_str(ids)]
    with open(os.path.join(out, "tokenize.txt"), "w", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    return len(TOKENIZE_CASES)


def earlier_positions(n):
    """2-3 distinct earlier positions for a prompt of n tokens."""
    cand = [0, n // 3, (2 * n) // 3]
    return sorted(set(p for p in cand if p < n - 1))


def write_logits(llama_cpp, model, path):
    """Writes one logits file; returns {name: (ids, {pos: f32 row})}."""
    lines, rows = [], {}
    for name, special, text in LOGIT_PROMPTS:
        llm = open_model(llama_cpp, model)      # fresh context per prompt
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False,
                           special=bool(special))
        llm.eval(ids)
        scores = np.array(llm.scores[:len(ids), :], dtype=np.float32)
        lines += ["prompt " + name, "ids " + ids_str(ids),
                  "top10 " + top10(scores[-1])]
        keep = {len(ids) - 1: scores[-1]}
        for p in earlier_positions(len(ids)):
            lines.append("pos %d top10 %s" % (p, top10(scores[p])))
            keep[p] = scores[p]
        rows[name] = (ids, keep)
        del llm
    with open(path, "w", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    return rows


def render_chat(template, messages):
    import jinja2
    env = jinja2.Environment(loader=jinja2.BaseLoader(),
                             trim_blocks=False, lstrip_blocks=False)
    return env.from_string(template).render(messages=messages,
                                            add_generation_prompt=True)


def write_greedy(llama_cpp, model, path, margins_path):
    lines, margins, notes = [], [], []
    for name, messages in GREEDY_CHATS:
        llm = open_model(llama_cpp, model)
        template = llm.metadata["tokenizer.chat_template"]
        text = render_chat(template, messages)
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        llm.eval(ids)
        gen, gaps = [], []
        for _ in range(GREEDY_STEPS):
            row = np.array(llm.scores[llm.n_tokens - 1, :], dtype=np.float32)
            order = np.argsort(-row, kind="stable")
            tok = int(order[0])
            gen.append(tok)
            gaps.append(float(row[order[0]] - row[order[1]]))
            if llama_cpp.llama_vocab_is_eog(llm._model.vocab, tok):
                notes.append("%s: stopped at EOG token %d after %d tokens"
                             % (name, tok, len(gen)))
                break
            llm.eval([tok])
        lines += ["chat " + name,
                  "messages " + json.dumps(messages, ensure_ascii=False,
                                           separators=(",", ":")),
                  "rendered " + hexs(text.encode("utf-8")),
                  "ids " + ids_str(ids),
                  "greedy " + ids_str(gen)]
        margins += ["chat " + name,
                    "margin " + " ".join("%.4f" % g for g in gaps),
                    "text " + hexs(llm.detokenize(gen, special=True))]
        del llm
    with open(path, "w", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    with open(margins_path, "w", newline="\n") as f:
        f.write("\n".join(margins) + "\n")
    return notes


# ---------------------------------------------------------------------------
# A second, independent forward pass: plain float64 numpy over the weights
# dequantized by gguf-py.  It must agree with llama.cpp run on the F32 copy of
# the model (same weights, no activation quantization); against the Q4_1 run
# it measures how far llama.cpp's Q8 activation rounding moves the logits.

class NumpyLlama:
    def __init__(self, path):
        import gguf
        from gguf.quants import dequantize
        r = gguf.GGUFReader(path)
        self.t = {t.name: t for t in r.tensors}

        def field(k):
            return r.fields[k].contents()
        self.n_layer = int(field("llama.block_count"))
        self.n_head = int(field("llama.attention.head_count"))
        self.n_kv = int(field("llama.attention.head_count_kv"))
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        self.base = float(field("llama.rope.freq_base"))
        self.dim = int(field("llama.embedding_length"))
        self.hd = self.dim // self.n_head

        def w(name):
            t = self.t[name]
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            return a.reshape([int(x) for x in reversed(t.shape)])
        self.emb = w("token_embd.weight")
        self.out = w("output.weight") if "output.weight" in self.t else self.emb
        self.onorm = w("output_norm.weight")
        names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
        self.layers = [{k: w("blk.%d.%s.weight" % (i, k)) for k in names}
                       for i in range(self.n_layer)]

    def _rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos):
        """x [n, heads, hd]; GGUF llama uses adjacent-pair (normal) rope."""
        i = np.arange(self.hd // 2)
        th = pos[:, None] * self.base ** (-2.0 * i / self.hd)
        c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2] = x0 * c - x1 * s
        y[..., 1::2] = x0 * s + x1 * c
        return y

    def forward(self, ids):
        """Logits [n, vocab] for all positions of one sequence."""
        n, hd = len(ids), self.hd
        x = self.emb[np.asarray(ids)]
        pos = np.arange(n, dtype=np.float64)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        group = self.n_head // self.n_kv
        for ly in self.layers:
            h = self._rms(x, ly["attn_norm"])
            q = self._rope((h @ ly["attn_q"].T).reshape(n, self.n_head, hd), pos)
            k = self._rope((h @ ly["attn_k"].T).reshape(n, self.n_kv, hd), pos)
            v = (h @ ly["attn_v"].T).reshape(n, self.n_kv, hd)
            o = np.empty((n, self.n_head, hd))
            for hh in range(self.n_head):
                s = q[:, hh] @ k[:, hh // group].T / np.sqrt(hd) + mask
                p = np.exp(s - s.max(-1, keepdims=True))
                o[:, hh] = (p / p.sum(-1, keepdims=True)) @ v[:, hh // group]
            x = x + o.reshape(n, self.dim) @ ly["attn_output"].T
            h = self._rms(x, ly["ffn_norm"])
            g, u = h @ ly["ffn_gate"].T, h @ ly["ffn_up"].T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ ly["ffn_down"].T
        return self._rms(x, self.onorm) @ self.out.T


def compare_rows(ref, rows):
    """max/mean |diff| over full vocab rows, raw and relative to the row max."""
    raw, rel, flips = [], [], 0
    for name, (ids, keep) in rows.items():
        full = ref.forward(ids)
        for p, row in keep.items():
            a = full[p]
            b = row.astype(np.float64)
            raw.append(np.abs(a - b))
            rel.append(np.abs((a - a.max()) - (b - b.max())))
            flips += int(np.argmax(a) != np.argmax(b))
    raw, rel = np.concatenate(raw), np.concatenate(rel)
    return {"max_abs": round(float(raw.max()), 6),
            "mean_abs": round(float(raw.mean()), 6),
            "max_abs_rel_to_top1": round(float(rel.max()), 6),
            "mean_abs_rel_to_top1": round(float(rel.mean()), 6),
            "argmax_mismatches": flips}


def requantize_f32(model, tmpdir):
    ref = os.environ.get("TURBOKV_REF", "/opt/turbokv-ref")
    tool = os.path.join(ref, "build", "bin", "llama-quantize")
    if not os.access(tool, os.X_OK):
        tool = "/tmp/turbokv-ref/build/bin/llama-quantize"
    dst = os.path.join(tmpdir, "model-f32.gguf")
    subprocess.run([tool, "--allow-requantize", model, dst, "F32",
                    str(N_THREADS)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return dst


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()

    import llama_cpp
    os.makedirs(args.out, exist_ok=True)

    tok_llm = open_model(llama_cpp, args.model, vocab_only=True)
    n_tok = write_tokenize(tok_llm, args.out)
    del tok_llm
    rows_q = write_logits(llama_cpp, args.model,
                          os.path.join(args.out, "logits.txt"))
    notes = write_greedy(llama_cpp, args.model,
                         os.path.join(args.out, "greedy.txt"),
                         os.path.join(args.out, "greedy-margins.txt"))

    # The same prompts on the F32-dequantized copy of the model.
    with tempfile.TemporaryDirectory(prefix="gen-golden-") as tmp:
        f32 = requantize_f32(args.model, tmp)
        rows_d = write_logits(llama_cpp, f32,
                              os.path.join(args.out, "logits-dequant.txt"))
        notes += ["dequant " + n for n in write_greedy(
            llama_cpp, f32, os.path.join(args.out, "greedy-dequant.txt"),
            os.path.join(args.out, "greedy-margins-dequant.txt"))]

    ref = NumpyLlama(args.model)
    check_d = compare_rows(ref, rows_d)
    check_q = compare_rows(ref, rows_q)
    if check_d["max_abs"] > 1e-3 or check_d["argmax_mismatches"]:
        raise SystemExit("llama.cpp (dequantized model) and the numpy "
                         "forward disagree: %r" % (check_d,))

    info = {
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "model": os.path.basename(args.model),
        "model_sha256": sha256(args.model),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "tokenize_cases": n_tok, "logit_prompts": len(LOGIT_PROMPTS),
        "greedy_chats": len(GREEDY_CHATS),
        "eog_notes": notes,
        "numpy_f64_vs_llamacpp_dequant": check_d,
        "numpy_f64_vs_llamacpp_q4_1": check_q,
    }
    with open(os.path.join(args.out, "generated-with.json"), "w") as f:
        json.dump(info, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(info, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

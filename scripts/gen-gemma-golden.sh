#!/bin/bash
# gen-gemma-golden.sh: llama.cpp's reference outputs for Gemma 3 270M into
# tests/data/golden/gemma3/ (read by tests/unit/test-gemma.c), from the peer
# build of scripts/llamacpp-peer-build.sh:
#
#   scripts/gen-gemma-golden.sh [MODEL] [BIN_DIR]
#
# MODEL: scripts/fetch-model.sh gemma3-270m's file; BIN_DIR:
# /opt/turbokv-ref/peer/build/bin. Writes
#   tokenize.txt   per case: "case NAME", "hex UTF-8 of the text", "ids ..." from
#                  llama-tokenize --ids (BOS included: the model adds it; special
#                  tokens parsed, llama-tokenize's default)
#   greedy.txt     per prompt: "prompt NAME", "hex ...", "text HEX" = what
#                  llama-simple (greedy sampler) prints after the prompt for
#                  -n 16 tokens, as UTF-8 hex
# llama-simple prints text only (no ids, no logits); the test compares the
# text its own greedy ids decode to.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/turbokv/models/gemma-3-270m-q4_k_m.gguf}
bin=${2:-/opt/turbokv-ref/peer/build/bin}
out=$here/../tests/data/golden/gemma3
mkdir -p "$out"
hex() { printf '%s' "$1" | od -An -tx1 -v | tr -d ' \n'; }

tok_cases=(
	"english|The quick brown fox jumps over the lazy dog."
	"code|int main(void) {\n\treturn 0; // done\n}"
	"numbers|On 2026-12-02 it cost 3.50 EUR, i.e. 1234567 cents."
	"cjk|你好，世界。こんにちは、世界。안녕하세요"
	"emoji|Family: 👨‍👩‍👧 and thumbs 👍🏽!"
	"spaces|  leading, trailing   and\t\ttabs\n\n\nnewlines  "
	"accents|Café naïve résumé Ωμέγα Привет مرحبا"
	"special-lookalike|<start_of_turn>user\nhi<end_of_turn>"
	"punct|!!! ??? ... --- (((  ))) {json: [1, 2]}"
	"url|See https://example.com/a?b=c&d=e#f for more."
	"bytes|control \x01\x02 and DEL \x7f"
)
{
	for c in "${tok_cases[@]}"; do
		name=${c%%|*}
		text=$(printf '%b' "${c#*|}")
		ids=$("$bin/llama-tokenize" -m "$model" -p "$text" --ids --log-disable 2>/dev/null | tail -1 |
			tr -d '[],')
		echo "case $name"
		echo "hex $(hex "$text")"
		echo "ids $ids"
	done
} >"$out/tokenize.txt"

prompts=(
	"capital|The capital of France is"
	"story|Once upon a time, in a small village,"
	"code|def fibonacci(n):"
	"list|The three primary colors are"
)
{
	for c in "${prompts[@]}"; do
		name=${c%%|*}
		text=${c#*|}
		full=$("$bin/llama-simple" -m "$model" -n 16 "$text" 2>/dev/null)
		cont=${full#"<bos>$text"}
		echo "prompt $name"
		echo "hex $(hex "$text")"
		echo "text $(hex "$cont")"
	done
} >"$out/greedy.txt"
sha=$(sha256sum "$model" | cut -d' ' -f1)
ver=$(cd "$bin/../.." 2>/dev/null && git -C src rev-parse HEAD 2>/dev/null || echo unknown)
printf 'model %s\nmodel_sha256 %s\nllama_cpp %s\n' "$(basename "$model")" "$sha" "$ver" >"$out/generated-with.txt"

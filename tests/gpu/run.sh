#!/bin/sh
# tests/gpu/run.sh: the device check of the CUDA kernels and backend
# (issues 8 and 9), one script for a machine with an NVIDIA GPU. Builds
# the engine, kernels, turbokv-lab and GPU programs only (-Dcomponents=gpu:
# needs meson, ninja, gcc and nvcc, not protobuf-c, libsystemd or Check),
# for this GPU's architecture only. Then:
#   1. KV kernels: GPU against CPU for every KV type (identical bytes from
#      the append kernel, attention within tolerance), the GPU KV cache
#      (sessions through the host), and every op of the CUDA backend
#      against the CPU's for every weight type;
#   2. the whole model on the CUDA backend against the CPU backend: the
#      tiny test models and generated models of three weight types;
#   3. benchmarks: decode attention alone (gpu-attn-bench), then end to
#      end on an 8B-shaped generated Q4_K model: prompt t/s at 2048, decode
#      t/s at depths 4096 and 32768, f16 and tq4 caches.
# Results go to $OUT (default ./gpu-results): check.txt, kvcache-check.txt,
# backend-check.txt, model-check.txt, bench.md, model-bench.txt, build.log,
# device.txt, probe.txt. The benchmarks run only when every check passed.
#
# Usage: tests/gpu/run.sh [--check-only]
# Environment: OUT, BUILD (build-gpu), TMPDIR (generated models, ~5 GB),
# and the attention benchmark's CONTEXTS, BATCHES, ROUNDS, CALLS.
# Exits 77 without a GPU, 1 if a check fails.
set -eu
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-results}
BUILD=${BUILD:-build-gpu}
GEN=${TMPDIR:-/tmp}/turbokv-gpu-models
mkdir -p "$OUT" "$GEN"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "no NVIDIA GPU here: skipped" | tee "$OUT/check.txt"
	exit 77
fi
nvidia-smi -L | tee "$OUT/device.txt"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')

start=$(date +%s)
if [ ! -f "$BUILD/build.ninja" ]; then
	meson setup "$BUILD" --buildtype=release -Dcuda=enabled -Dcomponents=gpu -Dtests=false \
		-Dgpu_archs="$arch" >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
else
	# a build directory from another GPU has no kernels for this one
	meson configure "$BUILD" -Dgpu_archs="$arch" >"$OUT/build.log" 2>&1 ||
		{ cat "$OUT/build.log"; exit 1; }
fi
ninja -C "$BUILD" tests/gpu/test-gpu-kvattn tests/gpu/test-gpu-kvcache tests/gpu/test-gpu-backend \
	tests/gpu/test-gpu-model \
	tests/gpu/gpu-attn-bench tools/turbokv-lab/turbokv-lab >>"$OUT/build.log" 2>&1 ||
	{ tail -50 "$OUT/build.log"; exit 1; }
echo "built for sm_$arch in $(($(date +%s) - start)) s"
LAB=$BUILD/tools/turbokv-lab/turbokv-lab

# nvidia-smi answers even where the driver is older than this toolkit's
# runtime; then every CUDA call fails, and that is not the kernels' fault.
if ! "$BUILD/tests/gpu/test-gpu-kvattn" --probe >"$OUT/probe.txt" 2>&1; then
	cat "$OUT/probe.txt"
	echo "the CUDA runtime cannot use this GPU: driver $(nvidia-smi \
		--query-gpu=driver_version --format=csv,noheader | head -1), toolkit:"
	nvcc --version | tail -2
	exit 77
fi

status=0
# A program's last line counts its failures (tee hides its exit status).
check() {
	name=$1 file=$2
	shift 2
	"$@" 2>&1 | tee "$file" || true
	grep -q "^0 of [0-9]* $name checks failed" "$file" || { echo "FAILED: $name"; status=1; }
}

check "GPU/CPU" "$OUT/check.txt" "$BUILD/tests/gpu/test-gpu-kvattn"
check "GPU KV cache" "$OUT/kvcache-check.txt" "$BUILD/tests/gpu/test-gpu-kvcache"
check "CUDA backend" "$OUT/backend-check.txt" "$BUILD/tests/gpu/test-gpu-backend"

# Generated models for the model check: three weight types, GQA, two head widths.
"$LAB" gen-model --layers 4 --dim 576 --heads 9 --kv-heads 3 --ff 1536 --vocab 8192 --type Q4_0 \
	-o "$GEN/smol-q4_0.gguf" >/dev/null
"$LAB" gen-model --layers 3 --dim 512 --heads 8 --kv-heads 4 --ff 1024 --vocab 8192 --type Q8_0 \
	-o "$GEN/q8_0.gguf" >/dev/null
"$LAB" gen-model --layers 3 --dim 1024 --heads 8 --kv-heads 2 --ff 2816 --vocab 8192 --type Q4_K \
	-o "$GEN/q4_k.gguf" >/dev/null
# (tests/data/tiny/llama-f16.gguf is left out: its head_dim 16 is below what the GPU KV cache takes)
check "GPU/CPU model" "$OUT/model-check.txt" "$BUILD/tests/gpu/test-gpu-model" \
	tests/data/tiny/llama-kquant.gguf \
	"$GEN/smol-q4_0.gguf" "$GEN/q8_0.gguf" "$GEN/q4_k.gguf"
echo "checks done at $(($(date +%s) - start)) s, status $status"

# Benchmarks only of code that passed its checks: a broken kernel would
# spend the rest of the device time.
if [ "${1:-}" != --check-only ] && [ $status -eq 0 ]; then
	"$BUILD/tests/gpu/gpu-attn-bench" >"$OUT/bench.md" 2>"$OUT/bench.log" || status=1
	cat "$OUT/bench.md"
	echo "attention benchmark done at $(($(date +%s) - start)) s"

	# Llama-3-8B shapes, Q4_K weights (the 128256-token vocabulary included).
	"$LAB" gen-model --layers 32 --dim 4096 --heads 32 --kv-heads 8 --ff 14336 --vocab 128256 \
		--type Q4_K --ctx 65536 -o "$GEN/8b-q4_k.gguf" >/dev/null || status=1
	echo "8B model written at $(($(date +%s) - start)) s"
	for kv in f16 tq4; do
		"$LAB" bench --device cuda -m "$GEN/8b-q4_k.gguf" --kv $kv -p 2048 -n 64 -r 3 \
			-d 4096,32768 --fill random >"$OUT/model-bench-$kv.txt" 2>&1 || status=1
		cat "$OUT/model-bench-$kv.txt" | tee -a "$OUT/model-bench.txt"
	done
	nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >>"$OUT/model-bench.txt" 2>&1 || true
fi
echo "total $(($(date +%s) - start)) s, status $status"
exit $status

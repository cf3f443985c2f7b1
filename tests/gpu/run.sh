#!/bin/sh
# tests/gpu/run.sh: the device check of the CUDA KV kernels (issue 8), one
# script for a machine with an NVIDIA GPU. Builds the engine, kernels and
# GPU programs only (-Dcomponents=gpu: needs meson, ninja, gcc and nvcc,
# not protobuf-c, libsystemd or Check), checks GPU against CPU for every
# KV type (identical bytes from the append kernel, attention within
# tolerance), then runs the decode-attention benchmark. Results go to
# $OUT (default ./gpu-results): check.txt, bench.md, build.log.
#
# Usage: tests/gpu/run.sh [--check-only]
# Environment: OUT, BUILD (build-gpu), and the benchmark's CONTEXTS,
# BATCHES, ROUNDS, CALLS (tests/gpu/gpu-attn-bench.c).
# Exits 77 without a GPU, 1 if a check fails.
set -eu
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-results}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "no NVIDIA GPU here: skipped" | tee "$OUT/check.txt"
	exit 77
fi
nvidia-smi -L | tee "$OUT/device.txt"

start=$(date +%s)
if [ ! -f "$BUILD/build.ninja" ]; then
	meson setup "$BUILD" --buildtype=release -Dcuda=enabled -Dcomponents=gpu \
		-Dtests=false >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
fi
ninja -C "$BUILD" tests/gpu/test-gpu-kvattn tests/gpu/gpu-attn-bench >>"$OUT/build.log" 2>&1 ||
	{ tail -50 "$OUT/build.log"; exit 1; }
echo "built in $(($(date +%s) - start)) s"

status=0
"$BUILD/tests/gpu/test-gpu-kvattn" 2>&1 | tee "$OUT/check.txt" || status=1
# tee hides the exit status: the program's last line counts the failures
grep -q '^0 of [0-9]* GPU/CPU checks failed' "$OUT/check.txt" || status=1

if [ "${1:-}" != --check-only ]; then
	"$BUILD/tests/gpu/gpu-attn-bench" 2>"$OUT/bench.log" | tee "$OUT/bench.md" || status=1
fi
echo "total $(($(date +%s) - start)) s, status $status"
exit $status

#!/usr/bin/env bash
# llamacpp-bench.sh: the llama.cpp speed baseline on the default model, for
# comparison with turbokv's own numbers.  Run scripts/llamacpp-build.sh once
# first.  Takes about 10 minutes with 2 threads on an idle box (most of it
# the q4_0-KV depth runs: llama.cpp's CPU prefill into a q4_0 cache is slow).
#
# Usage: bench/llamacpp-bench.sh [MODEL] [OUTFILE]
#   MODEL    default ~/.cache/turbokv/models/SmolLM2-135M-Instruct.Q4_1.gguf
#   OUTFILE  default /tmp/llamacpp-bench.txt (appended to)
# Environment: TURBOKV_REF (default /opt/turbokv-ref, else /tmp/turbokv-ref),
#   THREADS (default 2), REPS (default 5), DEPTH_REPS (default 3, f16 KV at
#   depth), Q4_DEPTH_REPS (default 1, q4_0 KV at depth).
#
# The box is shared: the load average is logged before every run; numbers
# taken under load are low.  Runs:
#   1. pp512 + tg128, default flash-attn setting (auto), f16 KV
#   2. the same with -fa 1, and with -fa 0
#   3. pp512 + tg128 after 1024 and 4096 tokens of context (-d), -fa 1,
#      f16 KV and q4_0 K/V (llama-bench refills the context for every test
#      and repetition, so q4_0 at depth 4096 costs minutes per repetition)
#   4. tg128 at the same depths, f16 KV, -fa 0
set -euo pipefail

MODEL=${1:-$HOME/.cache/turbokv/models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${2:-/tmp/llamacpp-bench.txt}
THREADS=${THREADS:-2}
REPS=${REPS:-5}
DEPTH_REPS=${DEPTH_REPS:-3}
Q4_DEPTH_REPS=${Q4_DEPTH_REPS:-1}
if [[ -z ${TURBOKV_REF:-} ]]; then
	TURBOKV_REF=/opt/turbokv-ref
	[[ -x $TURBOKV_REF/build/bin/llama-bench ]] || TURBOKV_REF=/tmp/turbokv-ref
fi
BENCH=$TURBOKV_REF/build/bin/llama-bench
if [[ ! -x $BENCH ]]; then
	echo "llama-bench not found under $TURBOKV_REF: run scripts/llamacpp-build.sh" >&2
	exit 1
fi

run() {
	{
		echo
		echo "### $(date -u +%FT%TZ) load:$(cut -d' ' -f1-3 /proc/loadavg)"
		echo "\$ llama-bench $*"
	} | tee -a "$OUT"
	"$BENCH" "$@" 2>&1 | tee -a "$OUT"
}

{
	echo "=================================================================="
	echo "llama.cpp baseline $(date -u +%FT%TZ) host $(hostname)"
	echo "cpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p')"
	echo "nproc: $(nproc)  threads used: $THREADS"
	echo "model: $MODEL"
	echo "llama-bench: $BENCH"
} | tee -a "$OUT"

run -m "$MODEL" -p 512 -n 128 -t "$THREADS" -r "$REPS"
run -m "$MODEL" -p 512 -n 128 -t "$THREADS" -r "$REPS" -fa 1
run -m "$MODEL" -p 512 -n 128 -t "$THREADS" -r "$REPS" -fa 0
run -m "$MODEL" -p 512 -n 128 -d 1024,4096 -t "$THREADS" -r "$DEPTH_REPS" -fa 1
run -m "$MODEL" -p 512 -n 128 -d 1024,4096 -t "$THREADS" -r "$Q4_DEPTH_REPS" -fa 1 \
	-ctk q4_0 -ctv q4_0
# 4. for comparison: f16 KV at depth without flash attention (tg only)
run -m "$MODEL" -p 0 -n 128 -d 1024,4096 -t "$THREADS" -r "$DEPTH_REPS" -fa 0

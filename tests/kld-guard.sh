#!/bin/sh
# kld-guard: regression guard on the fidelity of the default KV type
# (issue 5, docs/benchmarks.md "Issue 5: fidelity"). Runs `turbokv-lab kld`
# on one short window of the fidelity text and fails when the mean KL
# divergence against the f32 cache exceeds the recorded threshold.
#
#   tests/kld-guard.sh TURBOKV_LAB [SANITIZE [cross|native]]
#
# Skips (77) in cross and sanitizer builds (too slow there; the kld code is covered
# by the release build), without the default model, or without the text
# (scripts/setup.sh installs both). One thread, so the sums are the same
# on every run of the same build.
set -eu

lab=$1
sanitize=${2:-none}
build=${3:-native}
here=$(cd "$(dirname "$0")" && pwd)

# The default KV type and its recorded number at ctx 512, window 1, one
# thread: mean KLD 0.0139 (2026-12-01; the defaults before it: 0.0175 for
# tq5_nc+c:tq3.5_nc, 0.0232 for tq5_nc:tq3.5_nc; tq4: 0.0456, q4_0+h-class).
# The threshold leaves room for kernel changes that move results by
# rounding (the f16 noise floor is ~0.003), not for a codec regression:
# falling back to the previous default's TurboQuant keys fails it.
KV=pk5:tq3.5_nc
THRESHOLD=0.0168

if [ "$build" = cross ]; then
	echo "kld-guard: skipped in a cross build (turbokv-lab is for another CPU; under qemu one window takes too long)"
	exit 77
fi
if [ "$sanitize" != none ]; then
	echo "kld-guard: skipped in a sanitizer build ($sanitize)"
	exit 77
fi
model=${TURBOKV_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/turbokv/models/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ ! -f "$model" ]; then
	echo "kld-guard: skipped: no model at $model (scripts/fetch-model.sh)"
	exit 77
fi
if ! text=$("$here/../scripts/fidelity-text.sh" 2>/dev/null); then
	echo "kld-guard: skipped: no fidelity text (apt-get install debian-handbook)"
	exit 77
fi

out=$("$lab" kld --model "$model" --kv "$KV" --text "$text" --ctx 512 --chunks 1 \
	--threads 1 --json)
echo "$out"
kld=$(echo "$out" | sed -n 's/.*"kld_mean":\([0-9.eE+-]*\).*/\1/p')
if [ -z "$kld" ]; then
	echo "kld-guard: no kld_mean in the output"
	exit 1
fi
if awk -v k="$kld" -v t="$THRESHOLD" 'BEGIN { exit !(k <= t) }'; then
	echo "kld-guard: $KV mean KLD $kld <= $THRESHOLD"
	exit 0
fi
echo "kld-guard: $KV mean KLD $kld above the threshold $THRESHOLD: a fidelity regression"
exit 1

#!/usr/bin/env bash
# compare-llamacpp.sh: turbokv-lab bench against llama-bench on the same
# models, same threads, interleaved round by round so that both see the same
# machine load. Models: the default one and the 1B and 8B llama shapes made by
# `turbokv-lab gen-model` (Q4_K, generated once into $GEN_DIR). Prints every
# round and, per model, the medians of the per-round numbers with
# our/llama.cpp ratios.
#
# Usage: bench/compare-llamacpp.sh [ROUNDS]   (default 5)
# Environment: MODELS (space-separated: default, 1b, 8b or GGUF paths;
#   default "default 1b 8b"), THREADS (2), PP (512), TG (128), REPS per
#   round (3), GEN_DIR (~/.cache/turbokv/gen), TURBOKV_REF (/opt/turbokv-ref),
#   LLAMA_BENCH (the peer of scripts/llamacpp-peer-build.sh when built, else
#   $TURBOKV_REF/build/bin/llama-bench), LAB (build/tools/turbokv-lab/turbokv-lab),
#   LAB_BEFORE (a second turbokv-lab, e.g. a saved copy of the old binary: run
#   in the same rounds, with a new/old ratio), KV (our cache type, passed as
#   --kv; default the bench's own, f32; llama-bench's cache is f16, so KV=f16
#   compares like with like), DEPTH (both tests after this many tokens already
#   in the cache: our bench's --depth, llama-bench's -d; default 0).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${1:-5}
MODELS=${MODELS:-default 1b 8b}
THREADS=${THREADS:-2}
PP=${PP:-512}
TG=${TG:-128}
REPS=${REPS:-3}
GEN_DIR=${GEN_DIR:-$HOME/.cache/turbokv/gen}
TURBOKV_REF=${TURBOKV_REF:-/opt/turbokv-ref}
if [[ -z ${LLAMA_BENCH:-} ]]; then
	LLAMA_BENCH=$TURBOKV_REF/peer/build/bin/llama-bench
	[[ -x $LLAMA_BENCH ]] || LLAMA_BENCH=$TURBOKV_REF/build/bin/llama-bench
fi
LAB=${LAB:-build/tools/turbokv-lab/turbokv-lab}
LAB_BEFORE=${LAB_BEFORE:-}
KV=${KV:-}
DEPTH=${DEPTH:-0}
[[ -x $LLAMA_BENCH ]] || { echo "no $LLAMA_BENCH: run scripts/llamacpp-peer-build.sh" >&2; exit 1; }
[[ -x $LAB ]] || { echo "no $LAB: run scripts/setup.sh" >&2; exit 1; }

# model name -> GGUF path (generated on first use)
model_path() {
	local shape
	case $1 in
	default) echo "$HOME/.cache/turbokv/models/SmolLM2-135M-Instruct.Q4_1.gguf"; return ;;
	1b) shape="--layers 16 --dim 2048 --heads 32 --kv-heads 8 --ff 8192 --vocab 128256" ;;
	8b) shape="--layers 32 --dim 4096 --heads 32 --kv-heads 8 --ff 14336 --vocab 128256" ;;
	*) echo "$1"; return ;;
	esac
	local f=$GEN_DIR/llama-$1-Q4_K.gguf
	if [[ ! -f $f ]]; then
		mkdir -p "$GEN_DIR"
		# shellcheck disable=SC2086
		"$LAB" gen-model $shape --type Q4_K -o "$f" >&2
	fi
	echo "$f"
}

ours() { # LAB MODEL -> "pp tg"
	"$1" bench --model "$2" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" -d "$DEPTH" ${KV:+--kv "$KV"} --json |
		python3 -c 'import json,sys; r={x["test"][:2]: x["tokens_per_s"] for x in json.load(sys.stdin)["results"]}; print(r.get("pp", 0), r.get("tg", 0))'
}

echo "cpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; threads $THREADS"
echo "llama-bench: $LLAMA_BENCH; our KV cache: ${KV:-the bench default}; depth $DEPTH"
summary=()
for name in $MODELS; do
	model=$(model_path "$name")
	echo "model $name: $model"
	rows=()
	for ((i = 1; i <= ROUNDS; i++)); do
		load=$(cut -d' ' -f1 /proc/loadavg)
		# a run that fails (seen under heavy load) prints 0 and its round is
		# left out of the medians, instead of ending the script through set -e
		read -r opp otg <<<"$(ours "$LAB" "$model" || echo "0 0")"
		bpp=0 btg=0
		[[ -n $LAB_BEFORE ]] && read -r bpp btg <<<"$(ours "$LAB_BEFORE" "$model" || echo "0 0")"
		read -r rpp rtg <<<"$("$LLAMA_BENCH" -m "$model" -t "$THREADS" -p "$PP" -n "$TG" -d "$DEPTH" -r "$REPS" -o json 2>/dev/null |
			python3 -c 'import json,sys; r={("pp" if x["n_prompt"] else "tg"): x["avg_ts"] for x in json.load(sys.stdin)}; print(r.get("pp", 0), r.get("tg", 0))' ||
			echo "0 0")"
		printf 'round %d (load %s): turbokv pp%d %.1f tg%d %.1f | before pp %.1f tg %.1f | llama.cpp pp %.1f tg %.1f\n' \
			"$i" "$load" "$PP" "$opp" "$TG" "$otg" "$bpp" "$btg" "$rpp" "$rtg"
		if [[ $opp == 0 || $rpp == 0 || ( -n $LAB_BEFORE && $bpp == 0 ) ]]; then
			echo "round $i: a run failed, left out" >&2
			continue
		fi
		rows+=("$opp $otg $bpp $btg $rpp $rtg")
	done
	summary+=("$(python3 - "$name" "$PP" "$TG" "${rows[@]}" <<'PY'
import statistics as st, sys
name, pp, tg = sys.argv[1:4]
cols = list(zip(*[[float(v) for v in r.split()] for r in sys.argv[4:]]))
op, ot, bp, bt, rp, rt = (st.median(c) for c in cols)
ratio = lambda a, b: f"{a / b:.2f}" if b else "-"
print(f"{name}: pp{pp} turbokv {op:.1f} / llama.cpp {rp:.1f} = {ratio(op, rp)}x"
      f" (before {bp:.1f}, new/old {ratio(op, bp)}x); tg{tg} turbokv {ot:.1f} / llama.cpp {rt:.1f} = {ratio(ot, rt)}x"
      f" (before {bt:.1f}, new/old {ratio(ot, bt)}x)")
PY
)")
done
echo "medians over $ROUNDS interleaved rounds, $THREADS threads, depth $DEPTH:"
printf '  %s\n' "${summary[@]}"

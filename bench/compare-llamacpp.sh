#!/usr/bin/env bash
# compare-llamacpp.sh: turbokv-lab bench against llama-bench on the same
# model, same threads, interleaved round by round so that both see the same
# machine load. Prints every round and the medians of the per-round
# numbers, with our/llama.cpp ratios.
#
# Usage: bench/compare-llamacpp.sh [ROUNDS]   (default 5)
# Environment: MODEL, THREADS (2), PP (512), TG (128), REPS per round (3),
#   TURBOKV_REF (llama.cpp built by scripts/llamacpp-build.sh),
#   LAB (default build/tools/turbokv-lab/turbokv-lab).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${1:-5}
MODEL=${MODEL:-$HOME/.cache/turbokv/models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
PP=${PP:-512}
TG=${TG:-128}
REPS=${REPS:-3}
TURBOKV_REF=${TURBOKV_REF:-/opt/turbokv-ref}
LLAMA_BENCH=$TURBOKV_REF/build/bin/llama-bench
LAB=${LAB:-build/tools/turbokv-lab/turbokv-lab}
[[ -x $LLAMA_BENCH ]] || { echo "no $LLAMA_BENCH: run scripts/llamacpp-build.sh" >&2; exit 1; }
[[ -x $LAB ]] || { echo "no $LAB: run scripts/setup.sh" >&2; exit 1; }

echo "cpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; threads $THREADS"
echo "model: $MODEL"
ours_pp=() ours_tg=() ref_pp=() ref_tg=()
for ((i = 1; i <= ROUNDS; i++)); do
	load=$(cut -d' ' -f1 /proc/loadavg)
	read -r opp otg < <("$LAB" bench --model "$MODEL" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" --json |
		python3 -c 'import json,sys; r={x["test"][:2]: x["tokens_per_s"] for x in json.load(sys.stdin)["results"]}; print(r["pp"], r["tg"])')
	read -r rpp rtg < <("$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" -o json 2>/dev/null |
		python3 -c 'import json,sys; r={("pp" if x["n_prompt"] else "tg"): x["avg_ts"] for x in json.load(sys.stdin)}; print(r["pp"], r["tg"])')
	printf 'round %d (load %s): turbokv pp%d %.1f tg%d %.1f | llama.cpp pp%d %.1f tg%d %.1f\n' \
		"$i" "$load" "$PP" "$opp" "$TG" "$otg" "$PP" "$rpp" "$TG" "$rtg"
	ours_pp+=("$opp") ours_tg+=("$otg") ref_pp+=("$rpp") ref_tg+=("$rtg")
done
python3 - "${ours_pp[*]}" "${ours_tg[*]}" "${ref_pp[*]}" "${ref_tg[*]}" "$PP" "$TG" <<'PY'
import statistics as st, sys
op, ot, rp, rt = ([float(x) for x in a.split()] for a in sys.argv[1:5])
pp, tg = sys.argv[5], sys.argv[6]
print(f"median pp{pp}: turbokv {st.median(op):.1f} t/s, llama.cpp {st.median(rp):.1f} t/s, ratio {st.median(op)/st.median(rp):.2f}")
print(f"median tg{tg}: turbokv {st.median(ot):.1f} t/s, llama.cpp {st.median(rt):.1f} t/s, ratio {st.median(ot)/st.median(rt):.2f}")
PY

#!/usr/bin/env bash
# kv-depth.sh: decode speed at context depth (issue 4): turbokv-lab bench
# --depth with each KV cache type, and llama-bench -d with flash attention
# and f16 or q4_0 K/V, same model, same threads, interleaved round by
# round (the order rotates every round) so that all see the same machine
# load. Prints every run as it finishes, then the medians over rounds per
# (cache, depth) and the ratios the issue's targets are about, as a
# markdown table.
#
# Usage: bench/kv-depth.sh [ROUNDS]   (default 3)
# Environment: MODEL, THREADS (2), DEPTHS (0,1024,4096,8000), TG (decode
#   tokens per test, 32), REPS (turbokv repetitions per depth, 3),
#   LLAMA_REPS (1), KVS (turbokv caches, "f32 f16 q8_0 q4_0 tq4 tq3 tq4+qjl:tq4"),
#   LLAMA_KVS (llama.cpp K/V types with -fa 1, "f16 q4_0"), LLAMA_DEPTHS
#   (default DEPTHS; llama-bench refills the context for every depth and
#   repetition, and its prefill into a q4_0 cache is slow: minutes at 8000),
#   JOBS (the run list of one round, overriding KVS / LLAMA_KVS, e.g.
#   "ours:tq4 ours:f16 llama:q4_0 llama:f16"; "before:KV" runs LAB_BEFORE, an
#   older turbokv-lab, for before/after figures), LAB (build/tools/turbokv-lab/
#   turbokv-lab), LAB_BEFORE, TURBOKV_REF (/opt/turbokv-ref), LLAMA_BENCH
#   (the peer of scripts/llamacpp-peer-build.sh when built, else the
#   llama-cpp-python build of scripts/llamacpp-build.sh), OUT (raw log,
#   /tmp/kv-depth.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${1:-3}
MODEL=${MODEL:-$HOME/.cache/turbokv/models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
DEPTHS=${DEPTHS:-0,1024,4096,8000}
LLAMA_DEPTHS=${LLAMA_DEPTHS:-$DEPTHS}
TG=${TG:-32}
REPS=${REPS:-3}
LLAMA_REPS=${LLAMA_REPS:-1}
KVS=${KVS:-f32 f16 q8_0 q4_0 tq4 tq3 tq4+qjl:tq4}
LLAMA_KVS=${LLAMA_KVS:-f16 q4_0}
TURBOKV_REF=${TURBOKV_REF:-/opt/turbokv-ref}
if [[ -z ${LLAMA_BENCH:-} ]]; then
	LLAMA_BENCH=$TURBOKV_REF/peer/build/bin/llama-bench
	[[ -x $LLAMA_BENCH ]] || LLAMA_BENCH=$TURBOKV_REF/build/bin/llama-bench
fi
LAB=${LAB:-build/tools/turbokv-lab/turbokv-lab}
OUT=${OUT:-/tmp/kv-depth.txt}
[[ -x $LLAMA_BENCH ]] || { echo "no $LLAMA_BENCH: run scripts/llamacpp-build.sh" >&2; exit 1; }
[[ -x $LAB ]] || { echo "no $LAB: run scripts/setup.sh" >&2; exit 1; }

# Newer llama-bench spells flash attention on|off|auto, older 0|1.
FA_ON=1
"$LLAMA_BENCH" --help 2>&1 | grep -q -- '-fa.*on|off' && FA_ON=on

RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT

{
	echo "=== kv-depth $(date -u +%FT%TZ) host $(hostname)"
	echo "cpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores; threads $THREADS"
	echo "model: $MODEL; depths $DEPTHS (llama.cpp $LLAMA_DEPTHS); tg$TG; reps $REPS / llama $LLAMA_REPS"
} | tee -a "$OUT"

# One turbokv run of lab $2 (default LAB) with cache $1: "name depth t/s" lines.
run_ours() {
	"${2:-$LAB}" bench --model "$MODEL" -t "$THREADS" -p 0 -n "$TG" -r "$REPS" --depth "$DEPTHS" --kv "$1" --json |
		python3 -c 'import json,sys
d = json.load(sys.stdin)
for r in d["results"]:
    print(sys.argv[1] + d["kv"], r["depth"], r["tokens_per_s"])' "${3:-turbokv/}"
}

# One llama-bench run with -fa 1 and K/V type $1.
run_llama() {
	"$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p 0 -n "$TG" -d "$LLAMA_DEPTHS" -r "$LLAMA_REPS" \
		-fa "$FA_ON" -ctk "$1" -ctv "$1" -o json 2>/dev/null |
		python3 -c 'import json,sys
for r in json.load(sys.stdin):
    print("llama.cpp/" + sys.argv[1], r.get("n_depth", 0), r["avg_ts"])' "$1"
}

jobs=()
if [[ -n ${JOBS:-} ]]; then
	for j in $JOBS; do jobs+=("${j%%:*} ${j#*:}"); done
else
	for kv in $KVS; do jobs+=("ours $kv"); done
	for kv in $LLAMA_KVS; do jobs+=("llama $kv"); done
fi
n=${#jobs[@]}
for ((round = 1; round <= ROUNDS; round++)); do
	for ((k = 0; k < n; k++)); do
		read -r tool kv <<<"${jobs[$(((k + round - 1) % n))]}"
		load=$(cut -d' ' -f1-3 /proc/loadavg)
		start=$(date -u +%T)
		case $tool in
		ours) lines=$(run_ours "$kv") ;;
		before) lines=$(run_ours "$kv" "$LAB_BEFORE" before/) ;;
		*) lines=$(run_llama "$kv") ;;
		esac
		while read -r name depth tps; do
			printf 'round %d %s load %s: %-20s d%-5s %8.2f t/s\n' "$round" "$start" "$load" "$name" "$depth" "$tps" |
				tee -a "$OUT"
			echo "$name $depth $tps" >>"$RESULTS"
		done <<<"$lines"
	done
done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT"

python3 - "$RESULTS" "$DEPTHS" <<'PY' | tee -a "$OUT"
import collections, statistics as st, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, depth, tps = line.split()
    runs[(name, int(depth))].append(float(tps))
depths = sorted({d for _, d in runs})
names = list(dict.fromkeys(n for n, _ in runs))
med = {k: st.median(v) for k, v in runs.items()}
print("\n| cache | " + " | ".join(f"d{d}" for d in depths) + " |")
print("|---|" + "---|" * len(depths))
for n in names:
    cells = [f"{med[(n, d)]:.1f} ({len(runs[(n, d)])})" if (n, d) in med else "-" for d in depths]
    print(f"| {n} | " + " | ".join(cells) + " |")
def ratio(a, b, d):
    return f"{med[(a, d)] / med[(b, d)]:.2f}" if (a, d) in med and (b, d) in med else "-"
print("\n| ratio | " + " | ".join(f"d{d}" for d in depths) + " |")
print("|---|" + "---|" * len(depths))
for a, b in [("turbokv/tq4", "turbokv/f16"), ("turbokv/tq4", "llama.cpp/q4_0"),
             ("turbokv/tq4", "llama.cpp/f16"), ("turbokv/f16", "llama.cpp/f16"),
             ("turbokv/tq3", "turbokv/f16"), ("turbokv/q4_0", "llama.cpp/q4_0"),
             ("turbokv/pk5:tq3.5_nc", "turbokv/f16"), ("turbokv/pk5:tq3.5_nc", "llama.cpp/q4_0"),
             ("turbokv/pk5:tq3.5_nc", "before/pk5:tq3.5_nc"), ("turbokv/f16", "before/f16"),
             ("turbokv/tq4", "before/tq4")]:
    print(f"| {a} / {b} | " + " | ".join(ratio(a, b, d) for d in depths) + " |")
PY

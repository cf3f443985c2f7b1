#!/bin/sh
# Install the Python HTTP clients the gateway's tests drive (the real `openai`
# and `ollama` packages from PyPI, pinned) into build/pyclients, with
# `pip install --target` (no virtual environment, no change to the system's
# Python). Called by scripts/setup.sh; quick when they are already there.
set -eu

cd "$(dirname "$0")/.."

OPENAI_VERSION=2.8.1
OLLAMA_VERSION=0.6.0
dir=build/pyclients
stamp="$dir/.turbokv-pyclients-$OPENAI_VERSION-$OLLAMA_VERSION"

[ -f "$stamp" ] && exit 0
rm -rf "$dir"
mkdir -p "$dir"
python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore --target "$dir" \
	"openai==$OPENAI_VERSION" "ollama==$OLLAMA_VERSION"
touch "$stamp"

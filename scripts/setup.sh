#!/bin/sh
# Set up a fresh Debian machine for turbokv, then build it.
#
#   1. Debian packages (only those missing; apt-get needs root or sudo),
#   2. the default model into ~/.cache/turbokv/models (scripts/fetch-model.sh),
#   3. a release build in ./build (meson + ninja),
#   4. the Python HTTP clients of the gateway's tests (scripts/setup-pyclients.sh).
#
# Idempotent and quick the second time: nothing is installed, fetched or
# rebuilt that is already there.
set -eu

cd "$(dirname "$0")/.."

packages="meson ninja-build pkg-config gcc check protobuf-c-compiler libprotobuf-c-dev
	libsystemd-dev systemd python3 python3-pip clang libclang-rt-14-dev debian-handbook
	libmicrohttpd-dev libjansson-dev curl"

missing=
for p in $packages; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
# pip may come from elsewhere (pyenv); python3 -m pip is what we use.
if python3 -m pip --version >/dev/null 2>&1; then
	missing=$(echo "$missing" | sed 's/python3-pip//; s/ python3 / /')
fi
if [ -n "$(echo "$missing" | tr -d ' ')" ]; then
	sudo=
	[ "$(id -u)" -eq 0 ] || sudo=sudo
	echo "installing:$missing" >&2
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi

# Run a command quietly; show its output only if it fails.
quiet() {
	log=$(mktemp)
	if ! "$@" >"$log" 2>&1; then
		cat "$log" >&2
		rm -f "$log"
		echo "setup: '$*' failed" >&2
		exit 1
	fi
	rm -f "$log"
}

scripts/fetch-model.sh >/dev/null

# CUDA kernels: required where nvcc is installed, so that the GPU code always
# compiles and links (its tests skip without a GPU); left out elsewhere.
[ -x /usr/local/cuda/bin/nvcc ] && PATH=$PATH:/usr/local/cuda/bin
cuda=disabled
command -v nvcc >/dev/null 2>&1 && cuda=enabled
if [ ! -f build/build.ninja ]; then
	rm -rf build
	quiet meson setup build --buildtype=release -Dcuda=$cuda
fi
quiet ninja -C build
quiet scripts/setup-pyclients.sh

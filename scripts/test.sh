#!/bin/sh
# Set up, then run every test: the release build (unit, golden against
# llama.cpp's outputs, integration with the real daemon, unit files), then
# the same suite under AddressSanitizer and UBSan in ./build-asan, then
# every libFuzzer target for a bounded time (scripts/fuzz.sh, 12 s each: a smoke
# run that CI can afford; `scripts/fuzz.sh 600` for a real one).
# Exits non-zero if any test fails.
#
#   scripts/test.sh --cross aarch64
#
# instead cross-builds for 64-bit Arm in ./build-cross-aarch64
# (scripts/setup-cross.sh installs the cross compiler, qemu-user and the
# arm64 -dev packages; cross/aarch64.ini is the meson cross file) and runs
# the unit, golden and fuzz-corpus tests under qemu-user: the NEON kernels
# against their scalar twins, the engine, the daemon's modules and
# turbokvd/turbokv/turbokv-lab as built for aarch64. The integration suite
# (Python driving real daemons) is not run there. Emulated, it takes the
# better part of an hour (docs/benchmarks.md, "aarch64"), so the default
# run (and CI) leaves it out.
set -eu

cd "$(dirname "$0")/.."

if [ "${1:-}" = "--cross" ]; then
	arch=${2:?usage: scripts/test.sh --cross aarch64}
	start=$(date +%s)
	scripts/setup-cross.sh "$arch"
	scripts/fetch-model.sh >/dev/null
	dir=build-cross-$arch
	ninja -C "$dir" >/dev/null || ninja -C "$dir"
	built=$(date +%s)
	# emulated, everything runs several times slower: meson's and Check's
	# time limits stretch to match
	CK_TIMEOUT_MULTIPLIER=16 meson test -C "$dir" --print-errorlogs --timeout-multiplier 16 \
		--suite unit --suite golden --suite fuzz
	echo "cross $arch: set-up and build $((built - start)) s, tests $(($(date +%s) - built)) s"
	exit 0
fi
scripts/setup.sh
# the second real model, for the Gemma 3 golden test (tests/unit/test-gemma.c)
scripts/fetch-model.sh gemma3-270m >/dev/null

meson test -C build --print-errorlogs

if [ ! -f build-asan/build.ninja ]; then
	rm -rf build-asan
	meson setup build-asan --buildtype=debugoptimized \
		-Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled >/dev/null ||
		{ rm -rf build-asan; exit 1; }
fi
ninja -C build-asan >/dev/null || ninja -C build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	meson test -C build-asan --print-errorlogs

scripts/fuzz.sh 12

# One closing line for whoever reads the log: every test of both builds.
summary() {
	awk '/^Ok:/ { ok = $2 } /^Fail:/ { fail = $2 } /^Timeout:/ { fail += $2 }
		END { printf "%d %d\n", ok, fail }' "$1/meson-logs/testlog.txt"
}
set -- $(summary build) $(summary build-asan)
echo "$(($1 + $3)) passed, $(($2 + $4)) failed"

#!/bin/sh
# Run every libFuzzer target for a bounded time (default 20 s each) from its
# seed corpus, under ASan and UBSan, in ./build-fuzz (clang). New inputs go
# to a scratch directory, never into the committed corpus. A crash fails the
# script and leaves the reproducer in build-fuzz/crash-*.
#
#   scripts/fuzz.sh [SECONDS]
set -eu

cd "$(dirname "$0")/.."
secs=${1:-20}

if [ ! -f build-fuzz/build.ninja ]; then
	rm -rf build-fuzz
	CC=clang meson setup build-fuzz -Dfuzz=true -Dtests=false -Dcuda=disabled >/dev/null
fi
ninja -C build-fuzz >/dev/null || ninja -C build-fuzz

for corpus in tests/fuzz/corpus/*/; do
	name=$(basename "$corpus")
	bin=build-fuzz/tests/fuzz/fuzz-$name
	[ -x "$bin" ] || { echo "fuzz: no target for $corpus" >&2; exit 1; }
	scratch=$(mktemp -d)
	echo "fuzz-$name: ${secs}s"
	if ! "$bin" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 \
		-artifact_prefix=build-fuzz/crash-"$name"- "$scratch" "$corpus" \
		>build-fuzz/fuzz-"$name".log 2>&1; then
		tail -40 build-fuzz/fuzz-"$name".log >&2
		rm -rf "$scratch"
		echo "fuzz-$name: FAILED (reproducer in build-fuzz/crash-$name-*)" >&2
		exit 1
	fi
	grep -E "^Done [0-9]+ runs" build-fuzz/fuzz-"$name".log || true
	rm -rf "$scratch"
done

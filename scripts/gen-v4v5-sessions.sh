#!/bin/sh
# Regenerate tests/data/session/v4-* and v5-* (session files of versions 4
# and 5, with the tokens the model generates after them): builds each
# version's last commit in a temporary worktree (CPU only), compiles
# scripts/gen-v4v5-sessions.c against it and runs it on the tiny K-quant
# model. Developer tool; CI never runs it. Needs meson, ninja and gcc.
#   v4: 18e1e9a^ (the commit before session file version 5)
#   v5: 92dca67  (the last commit that wrote version 5)
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
tmp=$(mktemp -d)
trap 'for v in v4 v5; do git worktree remove --force "$tmp/$v" >/dev/null 2>&1 || true; done; rm -rf "$tmp"' EXIT
mkdir -p "$root/tests/data/session"
for pair in v4:18e1e9a^ v5:92dca67; do
	v=${pair%%:*}
	commit=${pair#*:}
	git worktree add --detach "$tmp/$v" "$commit" >/dev/null
	(
		cd "$tmp/$v"
		meson setup build --buildtype=release -Dcuda=disabled -Dtests=false -Dcomponents=gpu >/dev/null
		ninja -j2 -C build engine/libtkv-engine.a engine/libtkv-nocuda.a kernels/libtkv-kernels-cpu.a \
			kernels/libtkv-kernels-avx2.a kernels/libtkv-kernels-avx512.a base/libtkv-base.a >/dev/null
		gcc -std=c11 -D_GNU_SOURCE -O1 -I. "$root/scripts/gen-v4v5-sessions.c" -o "$tmp/gen-$v" \
			-Wl,--start-group build/engine/libtkv-engine.a build/engine/libtkv-nocuda.a \
			build/kernels/libtkv-kernels-cpu.a build/kernels/libtkv-kernels-avx2.a \
			build/kernels/libtkv-kernels-avx512.a build/base/libtkv-base.a -Wl,--end-group \
			-lm -lpthread
	)
	"$tmp/gen-$v" "$root/tests/data/tiny/llama-kquant.gguf" "$root/tests/data/session" "$v"
done
ls -l "$root"/tests/data/session/v4-* "$root"/tests/data/session/v5-*

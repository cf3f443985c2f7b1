#!/bin/sh
# Regenerate tests/data/session/ (session files of versions 1 to 3, as
# commit 919634a wrote them): builds that commit's engine in a temporary
# worktree, compiles scripts/gen-old-sessions.c against it and runs it.
# Developer tool; CI never runs it. Needs meson, ninja and gcc.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/src" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add --detach "$tmp/src" 919634a >/dev/null
cd "$tmp/src"
meson setup build --buildtype=release -Dcuda=disabled -Dcomponents=gpu >/dev/null
ninja -C build engine/libtkv-engine.a kernels/libtkv-kernels-cpu.a libtkv-base.a >/dev/null
gcc -std=c11 -D_GNU_SOURCE -O1 -I. "$root/scripts/gen-old-sessions.c" -o "$tmp/gen" \
	build/engine/libtkv-engine.a build/kernels/libtkv-kernels-cpu.a build/libtkv-base.a \
	-lm -lpthread
mkdir -p "$root/tests/data/session"
"$tmp/gen" "$root/tests/data/session"
ls -l "$root/tests/data/session"

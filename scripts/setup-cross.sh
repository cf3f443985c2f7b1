#!/bin/sh
# Set up this Debian 12 (x86-64) machine to cross-build turbokv for another
# CPU and run its tests under qemu-user (scripts/test.sh --cross ARCH):
#
#   1. the cross compiler and qemu-user (Debian packages, only those missing),
#   2. the target's multiarch -dev packages of the libraries the build links
#      (dpkg --add-architecture first),
#   3. a build in ./build-cross-ARCH from the cross file cross/ARCH.ini
#      (CUDA disabled; meson runs the tests through the file's exe_wrapper).
#
# ARCH: aarch64 (Debian's arm64). Idempotent like scripts/setup.sh.
set -eu

cd "$(dirname "$0")/.."
arch=${1:-aarch64}
case $arch in
aarch64) deb=arm64 triple=aarch64-linux-gnu qemu=qemu-aarch64 ;;
*) echo "setup-cross: unknown target '$arch' (known: aarch64)" >&2; exit 2 ;;
esac

sudo=
[ "$(id -u)" -eq 0 ] || sudo=sudo

# Host tools, and the target's libraries: check (unit tests), protobuf-c,
# libsystemd (daemon), libmicrohttpd and jansson (the HTTP gateway; optional
# in meson, wanted so that its tests run too).
host_pkgs="meson ninja-build pkg-config gcc-$triple qemu-user protobuf-c-compiler"
target_pkgs="libc6-dev:$deb check:$deb libsubunit-dev:$deb libprotobuf-c-dev:$deb libsystemd-dev:$deb
	libmicrohttpd-dev:$deb libjansson-dev:$deb"

if ! dpkg --print-foreign-architectures | grep -qx "$deb"; then
	echo "setup-cross: adding the $deb architecture to dpkg" >&2
	$sudo dpkg --add-architecture "$deb"
	updated=
else
	updated=yes
fi
missing=
for p in $host_pkgs $target_pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "installing:$missing" >&2
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi
command -v "$qemu" >/dev/null || { echo "setup-cross: $qemu not found after install" >&2; exit 1; }

dir=build-cross-$arch
if [ ! -f "$dir/build.ninja" ]; then
	rm -rf "$dir"
	meson setup "$dir" --cross-file "cross/$arch.ini" --buildtype=release -Dcuda=disabled >"$dir.log" 2>&1 ||
		{ cat "$dir.log" >&2; rm -rf "$dir"; exit 1; }
	rm -f "$dir.log"
fi

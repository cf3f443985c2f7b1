#!/usr/bin/env bash
# llamacpp-build.sh: builds the llama.cpp reference used to generate
# tests/data/golden/ (scripts/gen-golden.py) and the speed baseline
# (bench/llamacpp-bench.sh).  Developer tool; CI never runs it.
#
# Takes about 7 minutes with 2 cores (6.5 min measured, one compile of
# llama.cpp; the Python binding is installed without compiling anything and
# loads the libllama.so built here).  Needs network access to PyPI the first
# time (sdist + scikit-build-core/numpy/jinja2 for the venv).
#
# Idempotent: every step is skipped when its result already exists; rerun
# after a failure and it carries on.  Environment:
#   TURBOKV_REF   where everything goes (default /opt/turbokv-ref, falling
#                 back to /tmp/turbokv-ref when /opt is not writable)
#   JOBS          parallel compile jobs (default 2; the dev box is shared)
#   LCP_VERSION   llama-cpp-python version (default 0.3.36)
#   LCP_SDIST     path to an already downloaded sdist (optional)
#
# Result:
#   $TURBOKV_REF/build/bin/llama-bench, llama-simple, llama-tokenize,
#                          llama-quantize
#   $TURBOKV_REF/build/bin/libllama.so, libggml*.so
#   $TURBOKV_REF/venv  (python -c 'import llama_cpp' works; its
#                       llama_cpp/lib/ holds symlinks to the libraries above)
set -euo pipefail

LCP_VERSION=${LCP_VERSION:-0.3.36}
JOBS=${JOBS:-2}
if [[ -z ${TURBOKV_REF:-} ]]; then
	if mkdir -p /opt/turbokv-ref 2>/dev/null && [[ -w /opt/turbokv-ref ]]; then
		TURBOKV_REF=/opt/turbokv-ref
	else
		TURBOKV_REF=/tmp/turbokv-ref
	fi
fi
mkdir -p "$TURBOKV_REF/dl"
cd "$TURBOKV_REF"

SRC=$TURBOKV_REF/llama_cpp_python-$LCP_VERSION
SDIST=${LCP_SDIST:-$TURBOKV_REF/dl/llama_cpp_python-$LCP_VERSION.tar.gz}
BUILD=$TURBOKV_REF/build
VENV=$TURBOKV_REF/venv
TARGETS=(llama-bench llama-simple llama-tokenize llama-quantize)

log() { printf '[llamacpp-build] %s\n' "$*" >&2; }

# 1. sdist (no binary wheels exist for llama-cpp-python on PyPI)
if [[ ! -f $SDIST ]]; then
	log "downloading llama-cpp-python==$LCP_VERSION sdist"
	python3 -m pip download --no-deps --no-binary=:all: \
		-d "$TURBOKV_REF/dl" "llama-cpp-python==$LCP_VERSION"
fi

# 2. unpack
if [[ ! -f $SRC/vendor/llama.cpp/CMakeLists.txt ]]; then
	log "unpacking $SDIST"
	tar -xzf "$SDIST" -C "$TURBOKV_REF"
fi

# 3. configure llama.cpp once: shared libraries (for the binding) + tools
if [[ ! -f $BUILD/CMakeCache.txt ]]; then
	log "configuring llama.cpp"
	cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" \
		-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
		-DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
		-DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON \
		-DLLAMA_BUILD_EXAMPLES=ON
fi

# 4. compile (cmake itself skips up-to-date objects)
log "building ${TARGETS[*]} with -j$JOBS"
cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}"

# 5. Python binding without its own compile (LLAMA_BUILD=OFF)
if [[ ! -x $VENV/bin/python ]]; then
	log "creating venv"
	python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -m pip show llama_cpp_python 2>/dev/null |
	grep -qx "Version: $LCP_VERSION"; then
	log "installing the llama-cpp-python binding (no compile)"
	CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" \
		"$VENV/bin/python" -m pip install --no-cache-dir "$SDIST"
fi
# gen-golden.py also needs jinja2 (chat template) and gguf-py (its numpy
# cross-check of the forward pass)
if ! "$VENV/bin/python" -c 'import jinja2, gguf' 2>/dev/null; then
	"$VENV/bin/python" -m pip install jinja2 numpy gguf==0.19.0
fi

# 6. point the binding at the libraries built in step 4
PKG=$("$VENV/bin/python" - <<'EOF'
import importlib.util, os
spec = importlib.util.find_spec("llama_cpp")
print(os.path.dirname(spec.origin))
EOF
)
mkdir -p "$PKG/lib"
for so in "$BUILD"/bin/lib*.so*; do
	ln -sfn "$so" "$PKG/lib/$(basename "$so")"
done

"$VENV/bin/python" -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__, "ok")'
log "done: tools in $BUILD/bin, python in $VENV/bin/python"

#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (only that CMake target) from the source that llama-cpp-python's sdist
# vendors, so the server tests run the same llama.cpp commit as the `engine:llamacpp` column.
#
#   scripts/build_llama_server.sh [SDIST.tar.gz]
#
# SDIST: llama-cpp-python's source archive (default: `pip download` of the pinned version, from pip's cache
# when it holds it). The binary goes to $KVLAB_CACHE_DIR/llama-server-<version>/llama-server (default
# ~/.cache/kvlab/...) and is reused while it exists: delete that folder to rebuild. Prints the binary's path
# last. Takes about 15-25 minutes on 2 cores (ggml, llama, common, mtmd and the server; no web UI, no HTTPS).
set -euo pipefail

readonly VERSION="0.3.36"
cache="${KVLAB_CACHE_DIR:-$HOME/.cache/kvlab}/llama-server-$VERSION"
binary="$cache/llama-server"
if [[ -x "$binary" ]]; then
    echo "$binary"
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sdist="${1:-}"
if [[ -z "$sdist" ]]; then
    python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work"
    sdist="$(ls "$work"/llama_cpp_python-*.tar.gz)"
fi
tar -xzf "$sdist" -C "$work"
source_dir="$(ls -d "$work"/llama_cpp_python-*/vendor/llama.cpp)"
build="$work/build"
cmake -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON >/dev/null
cmake --build "$build" --target llama-server -j "$(nproc)"
mkdir -p "$cache"
cp "$build/bin/llama-server" "$binary.partial"
mv "$binary.partial" "$binary"
echo "$binary"

#!/usr/bin/env bash
# Builds llama.cpp's llama-bench from the llama-cpp-python 0.3.36 sdist's vendored source, as a
# benchmark peer only (docs/benchmarks.md, "Compiled int8 decode"); ffai never runs it.
#
#     scripts/build_llama_cpp.sh [WORKDIR]      (default /tmp/llama-cpp; prints the binaries' folder)
#
# Built for AVX-512 (VNNI, BF16) but without AMX: on the AMX Xeon its AMX Q8_0 matmul
# (ggml_backend_amx_mul_mat) segfaulted on every run, so GGML_NATIVE is off and the ISA listed.
set -euo pipefail
work=${1:-/tmp/llama-cpp}
version=0.3.36
mkdir -p "$work"
cd "$work"
if [ ! -f "llama_cpp_python-$version.tar.gz" ]; then
  pip download "llama-cpp-python==$version" --no-binary :all: --no-deps -d . >&2
fi
[ -d "llama_cpp_python-$version" ] || tar xzf "llama_cpp_python-$version.tar.gz"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
isa=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
if grep -q avx512f /proc/cpuinfo; then
  isa+=(-DGGML_AVX512=ON)
  grep -q avx512_vnni /proc/cpuinfo && isa+=(-DGGML_AVX512_VNNI=ON)
  grep -q avx512_bf16 /proc/cpuinfo && isa+=(-DGGML_AVX512_BF16=ON)
fi
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF "${isa[@]}" \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=OFF >&2
cmake --build "$work/build" --target llama-bench -j "$(nproc)" >&2
# The GGUF writer scripts/build_llama_cpp.py uses, from the same source as the binary.
python -m pip install -q "$src/gguf-py" >&2
echo "$work/build/bin"

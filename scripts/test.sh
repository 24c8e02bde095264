#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite through ctest:
#  1. the Release build: unit, golden (real default model), CLI and end-to-end
#     serving tests (curl, the OpenAI client, promtool, Prometheus);
#  2. unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer;
#  3. the kernel tests of a portable build (scalar fallbacks, no AVX);
#  4. the libFuzzer targets over their seed corpus (clang).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc)
LAZYKV_SETUP_E2E=1 scripts/setup.sh

cache="${LAZYKV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lazykv}"
export LAZYKV_DEFAULT_MODEL="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
export LAZYKV_E2E_PYTHON="$cache/venv-e2e/bin/python"

echo "== Release: all tests"
(cd build && ctest --output-on-failure -j"$jobs")

echo "== ASan/UBSan: unit tests"
if [ ! -f build-asan/CMakeCache.txt ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DLAZYKV_SANITIZE=ON -DLAZYKV_CUDA=OFF \
    -DLAZYKV_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" >/dev/null
fi
# Only the unit-test binaries: nothing else runs in this stage.
cmake --build build-asan -j"$jobs" --target unit_tests >/dev/null || cmake --build build-asan -j1 --target unit_tests
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$jobs" -L unit)

echo "== Portable build (no -march=native): scalar kernels and fp16 fallbacks"
if [ ! -f build-portable/CMakeCache.txt ]; then
  cmake -S . -B build-portable -DCMAKE_BUILD_TYPE=Release -DLAZYKV_NATIVE=OFF -DLAZYKV_CUDA=OFF \
    -DLAZYKV_BUILD_BENCH=OFF >/dev/null
fi
cmake --build build-portable -j"$jobs" --target lazykv_common_tests lazykv_kernels_tests >/dev/null
(cd build-portable && ctest --output-on-failure -j"$jobs" -R '^(common|kernels)\.')

if [ -f tests/fuzz/run_fuzzers.sh ]; then
  echo "== libFuzzer targets"
  if [ ! -f build-fuzz/CMakeCache.txt ]; then
    CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Release -DLAZYKV_FUZZ=ON -DLAZYKV_CUDA=OFF \
      -DLAZYKV_BUILD_BENCH=OFF >/dev/null
  fi
  cmake --build build-fuzz -j"$jobs" --target fuzz_targets >/dev/null || cmake --build build-fuzz -j1 --target fuzz_targets
  bash tests/fuzz/run_fuzzers.sh build-fuzz "${LAZYKV_FUZZ_SECONDS:-20}"
fi
echo "== all test stages passed"

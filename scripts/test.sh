#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite through ctest:
#  1. the Release build: unit, golden (real default model), CLI and end-to-end
#     serving tests (curl, the OpenAI client, promtool, Prometheus);
#  2. unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#     (clang, so a second compiler sees every line);
#  3. the kernel tests of a portable build (scalar fallbacks, no AVX);
#  4. the libFuzzer targets over their seed corpus, from the build of 2.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc)
# stage NAME: a heading with the minutes spent so far, so slow stages show.
stage() { printf '== %s (at %d:%02d)\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)); }
LAZYKV_SETUP_E2E=1 scripts/setup.sh

cache="${LAZYKV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lazykv}"
export LAZYKV_DEFAULT_MODEL="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
export LAZYKV_E2E_PYTHON="$cache/venv-e2e/bin/python"

# The sanitizer build (stage 2) compiles at the lowest priority while the
# Release tests run: most of those are end-to-end tests that run one at a
# time and leave a core idle much of the while. nice 19 gives the compiler
# about 1.5% of a busy core, so the tests keep their timing.
# One clang build serves the unit tests under ASan/UBSan and the libFuzzer
# targets (project code instrumented for both): a third of the build time of
# two separate builds. -O0: at -O0 it takes 5.8 min instead of about 9 on 2
# cores, while the tests run 2.5 min instead of 1.
if [ ! -f build-san/CMakeCache.txt ]; then
  CC=clang CXX=clang++ cmake -S . -B build-san -DCMAKE_BUILD_TYPE=Debug -DLAZYKV_SANITIZE=ON -DLAZYKV_FUZZ=ON \
    -DLAZYKV_CUDA=OFF -DLAZYKV_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" >/dev/null
fi
# (Not setsid: a session of its own gets a scheduler group of its own, whose
# share nice does not lower.) An early exit stops it and its compilers.
nice -n 19 cmake --build build-san -j"$jobs" --target unit_tests fuzz_targets >/dev/null 2>&1 &
san_build=$!
kill_tree() { local child; for child in $(pgrep -P "$1"); do kill_tree "$child"; done; kill "$1" 2>/dev/null || true; }
trap 'kill_tree "$san_build"' EXIT
trap 'exit 143' TERM INT  # so a cancelled run stops it too (bash runs no EXIT trap when a signal kills it)

stage "Release: all tests (the sanitizer build compiles meanwhile at the lowest priority)"
(cd build && ctest --output-on-failure -j"$jobs")

stage "ASan/UBSan (clang): unit tests"
# A failed background build is run again in the foreground, one job at a
# time, so its errors show in order.
wait "$san_build" || cmake --build build-san -j1 --target unit_tests fuzz_targets
trap - EXIT TERM INT  # reaped: its process id may be reused
# Not here: the two tests that generate the 135M-weight synthetic model eight
# and five times (minutes at -O0 under ASan), and the one that runs the
# default model's 135M weights on two ranks (31 s); the Release stage runs
# them, and what they exercise is covered here through the tiny models.
(cd build-san && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$root/tests/lsan.supp" \
  UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$jobs" -L unit \
  -E 'SyntheticModel\.(EveryTypeOfTheSmallestShapeLoadsAndRuns|TheGgufIsTheModelMadeInMemory)$|DefaultModelTensorParallel\.TwoRanksGreedyEqualsOneRank$')

stage "Portable build (no -march=native): scalar kernels and fp16 fallbacks"
if [ ! -f build-portable/CMakeCache.txt ]; then
  cmake -S . -B build-portable -DCMAKE_BUILD_TYPE=Release -DLAZYKV_NATIVE=OFF -DLAZYKV_CUDA=OFF \
    -DLAZYKV_BUILD_BENCH=OFF >/dev/null
fi
cmake --build build-portable -j"$jobs" --target lazykv_common_tests lazykv_kernels_tests >/dev/null
(cd build-portable && ctest --output-on-failure -j"$jobs" -R '^(common|kernels)\.')

# 10 s each: with the Release stage's end-to-end tests, this keeps the whole
# run under 30 minutes on CI's two cores; a longer campaign is LAZYKV_FUZZ_SECONDS.
stage "libFuzzer targets (the sanitizer build), ${LAZYKV_FUZZ_SECONDS:-10} s each, $jobs at a time"
bash tests/fuzz/run_fuzzers.sh build-san "${LAZYKV_FUZZ_SECONDS:-10}" "$jobs"
stage "all test stages passed"

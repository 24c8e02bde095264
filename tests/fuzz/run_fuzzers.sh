#!/usr/bin/env bash
# Runs every libFuzzer target over its committed seed corpus for SECONDS
# seconds each; exits non-zero if any target finds a crash, a leak, a
# sanitizer report or an unexpected exception.
#   usage: tests/fuzz/run_fuzzers.sh BUILD_DIR SECONDS
# BUILD_DIR is a build configured with CC=clang CXX=clang++ -DLAZYKV_FUZZ=ON.
# New interesting inputs go to a scratch copy of the corpus (the committed
# corpus is not modified); crash reproducers go to BUILD_DIR/fuzz-artifacts/.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
seconds=$2
src_dir=$(cd "$(dirname "$0")" && pwd)
artifacts="$build_dir/fuzz-artifacts"
mkdir -p "$artifacts"

status=0
for format in gguf safetensors tokenizer chat_template policy_trace openai_request kvstore_header; do
  fuzzer="$build_dir/tests/fuzz/${format}_fuzz"
  if [[ ! -x "$fuzzer" ]]; then
    echo "missing $fuzzer (build the ${format}_fuzz target first)" >&2
    exit 2
  fi
  work=$(mktemp -d)
  cp -r "$src_dir/corpus/$format/." "$work/"
  echo "== ${format}_fuzz for ${seconds}s"
  if ! "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts/${format}-" \
        "$work" 2>&1 | tail -n 40; then
    echo "FAIL: ${format}_fuzz found a problem; reproducers in $artifacts" >&2
    status=1
  fi
  rm -rf "$work"
done
exit $status

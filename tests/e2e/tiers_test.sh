#!/usr/bin/env bash
# End to end: lazy+tiers with the kvstore as a separate process. A real
# `lazykv kvstore` (host tier + RocksDB) on loopback and `lazykv generate` as
# the worker:
#  1. blocks are demoted to the kvstore, promoted back over UCX and used: the
#     greedy text equals the same run with in-process tiers (same bytes, same
#     decisions), and the kvstore's metrics show puts and gets;
#  2. the kvstore killed (SIGKILL) in the middle of a generation: the worker
#     reports it, goes on without tiers and finishes its text;
#  3. a kvstore restarted on the same RocksDB path starts and serves again;
#  4. prompt reuse through the kvstore (--prefix-cache-tiers): a second
#     `lazykv serve`, started after the first stopped, fetches the prompt
#     blocks the first computed and gives the same text; an abort storm over
#     the shared prefix leaves no lease and no page held; with the kvstore
#     killed the server computes prompts and keeps serving.
#   usage: tiers_test.sh LAZYKV_BINARY
# Needs LAZYKV_DEFAULT_MODEL (set by scripts/test.sh); exits 77 (skipped) without it.
set -uo pipefail
bin=$1
source "$(dirname "$0")/lib.sh"

policy=(--kv-policy lazy+tiers --kv-budget 48 --kv-window 8 --kv-alpha 0.001)
prompt="Explain step by step why the sum of two odd numbers is always even, with three examples."
start_kvstore "$bin" 64
pass "kvstore on port $kv_port ($kv_metrics)"

# 1. Through the kvstore process, and in process: the same text and the same
# tier counts, because a step waits for the blocks requested for it
# (decisions never depend on transfer timing).
"$bin" generate --model "$LAZYKV_DEFAULT_MODEL" --chat --prompt "$prompt" --max-tokens 200 --threads 2 \
  "${policy[@]}" --kvstore "127.0.0.1:$kv_port" --kvstore-transports tcp >"$work/remote.txt" 2>"$work/remote.err"
check "generate with --kvstore exits 0" test $? -eq 0
"$bin" generate --model "$LAZYKV_DEFAULT_MODEL" --chat --prompt "$prompt" --max-tokens 200 --threads 2 \
  "${policy[@]}" --host-tier-mib 64 >"$work/local.txt" 2>"$work/local.err"
check "generate with in-process tiers exits 0" test $? -eq 0
grep -h '^\[tiers' "$work/remote.err" "$work/local.err"
check "blocks were demoted through the kvstore" grep -Eq '\[tiers on: [1-9][0-9]* slots demoted' "$work/remote.err"
check "slots were promoted back from the kvstore" grep -Eq ' [1-9][0-9]* promoted' "$work/remote.err"
check "the same text through the kvstore as in process" cmp -s "$work/remote.txt" "$work/local.txt"
counts() { grep '^\[tiers on' "$1" | sed 's/, [0-9]* waits//'; }
check "the same tier counts through the kvstore as in process" test "$(counts "$work/remote.err")" = "$(counts "$work/local.err")"
puts=$(kv_metric 'lazykv_kvstore_requests_total{endpoint="put",code="ok"}')
gets=$(kv_metric 'lazykv_kvstore_requests_total{endpoint="get",code="ok"}')
check "the kvstore counted puts ($puts) and gets ($gets)" test "${puts:-0}" -gt 0 -a "${gets:-0}" -gt 0
check "no lease outlives the worker" test "$(kv_metric lazykv_kvstore_leases)" = 0
kill -TERM "$kv_pid"
wait "$kv_pid"

# 2. A kvstore with a 2 MiB host tier over RocksDB dies in the middle of a
# generation, once it has spilled blocks to its nvme tier.
start_kvstore "$bin" 2 --nvme-path "$work/nvme"
"$bin" generate --model "$LAZYKV_DEFAULT_MODEL" --chat --prompt "$prompt" --max-tokens 600 --threads 2 --ignore-eos \
  "${policy[@]}" --kvstore "127.0.0.1:$kv_port" --kvstore-transports tcp >"$work/killed.txt" 2>"$work/killed.err" &
gen_pid=$!
pids+=("$gen_pid")
for _ in $(seq 1 600); do
  spilled=$(kv_metric 'lazykv_kvstore_nvme_admissions_total{type="admitted"}')
  [ "${spilled:-0}" -gt 0 ] && break
  sleep 0.05
done
check "the kvstore spilled to its nvme tier ($spilled blocks) before it was killed" test "${spilled:-0}" -gt 0
kill -9 "$kv_pid"
wait "$gen_pid"
check "the worker finished its text after the kvstore died" test $? -eq 0
check "the worker reported the kvstore gone" grep -q 'continuing without tiers' "$work/killed.err"
check "and said its tiers were off" grep -q '^\[tiers off' "$work/killed.err"
check "the text has 600 tokens" grep -q ' 600 generated' "$work/killed.err"

# 3. A kvstore restarted on the same RocksDB path serves again.
start_kvstore "$bin" 2 --nvme-path "$work/nvme"
"$bin" generate --model "$LAZYKV_DEFAULT_MODEL" --chat --prompt "$prompt" --max-tokens 100 --threads 2 \
  "${policy[@]}" --kvstore "127.0.0.1:$kv_port" --kvstore-transports tcp >/dev/null 2>"$work/again.err"
check "generate against the restarted kvstore" grep -q '^\[tiers on' "$work/again.err"
kill -TERM "$kv_pid"
wait "$kv_pid"
check "the kvstore stops cleanly on SIGTERM" test $? -eq 0

# 4. Prompt blocks outlive the server that put them, and reach the next one.
start_kvstore "$bin" 64
# serve_with_tiers: a `lazykv serve` whose prefix cache goes through the kvstore; sets $url, $serve_pid.
serve_with_tiers() {
  start_http serve serve --model "$LAZYKV_DEFAULT_MODEL" --port 0 --threads 2 --prefix-cache-mib 32 \
    --prefix-cache-tiers --kvstore "127.0.0.1:$kv_port" --kvstore-transports tcp
  serve_pid=$http_pid serve_log=$http_log
}
doc=$(/usr/bin/python3 -c "print(' '.join(f'Entry {i}: the courier signs for parcel {i * 7}.' for i in range(30)))")
model=$(basename "$LAZYKV_DEFAULT_MODEL" .gguf)
body='{"model": "'$model'", "prompt": "'"$doc"' Which parcel did entry 3 sign for?", "max_tokens": 12, "temperature": 0}'
complete() { curl -sf --max-time 120 "$url/v1/completions" -H 'Content-Type: application/json' -d "$body" | json_get 'd["choices"][0]["text"]'; }
metric() { curl -sf "$url/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
serve_with_tiers
first_text=$(complete)
kill -TERM "$serve_pid"
wait "$serve_pid"
serve_with_tiers
second_text=$(complete)
same() { [ -n "$1" ] && [ "$1" = "$2" ]; }
check "the next server gives the same text (${second_text//$'\n'/ })" same "$first_text" "$second_text"
fetched=$(metric lazykv_prefix_cache_fetched_bytes_total)
hit=$(metric lazykv_prefix_cache_hit_tokens_total)
check "it fetched the prompt's blocks from the kvstore (${fetched:-no} bytes, ${hit:-no} tokens)" \
  awk -v f="${fetched:-0}" -v h="${hit:-0}" 'BEGIN { exit !(f > 0 && h >= 256) }'
# An abort storm on a third server: 40 streams over the stored prefix, each
# cut off by its client within 0.4 s, while the first fetches the blocks.
kill -TERM "$serve_pid"
wait "$serve_pid"
serve_with_tiers
/usr/bin/python3 - "$url" "$model" "$doc" <<'PY'
import http.client, json, random, sys, threading, time, urllib.parse
url, model, doc = sys.argv[1:4]
host = urllib.parse.urlparse(url)
def storm(i):
    body = json.dumps({"model": model, "prompt": f"{doc} Question {i}: which parcel?", "max_tokens": 64,
                       "ignore_eos": True, "stream": True})
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    time.sleep(random.uniform(0, 0.4))
    conn.close()  # gone mid-request: the server cancels it
threads = [threading.Thread(target=storm, args=(i,)) for i in range(40)]
for t in threads: t.start()
for t in threads: t.join()
PY
idle() { [ "$(metric 'lazykv_kv_bytes{tier="device"}')" = 0 ] && [ "$(kv_metric lazykv_kvstore_leases)" = 0 ]; }
for _ in $(seq 1 100); do idle && break; sleep 0.1; done
cancelled=$(metric 'lazykv_errors_total{type="cancelled"}')
check "the storm's requests were cancelled (${cancelled:-0} of 40)" awk -v c="${cancelled:-0}" 'BEGIN { exit !(c >= 20) }'
check "after an abort storm over shared prefixes: no leases, no pages held by sequences" idle
check "and it fetched for it" awk -v f="$(metric lazykv_prefix_cache_fetched_bytes_total)" 'BEGIN { exit !(f > 0) }'
kill -9 "$kv_pid"
wait "$kv_pid" 2>/dev/null
# A prompt whose blocks are new: the server looks them up and puts them.
body='{"model": "'$model'", "prompt": "First a question. '"$doc"' Which parcel did entry 9 sign for?", "max_tokens": 12, "temperature": 0}'
other=$(complete)
check "with the kvstore killed it keeps serving (${other//$'\n'/ })" test -n "$other"
for _ in $(seq 1 50); do grep -q 'continuing without tiers' "$serve_log" && break; sleep 0.1; done
check "and says it goes on without the kvstore" grep -q 'continuing without tiers' "$serve_log"
kill -TERM "$serve_pid"
wait "$serve_pid"
check "and stops cleanly" test $? -eq 0

[ "$failures" -eq 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "all tiers end-to-end checks passed"
